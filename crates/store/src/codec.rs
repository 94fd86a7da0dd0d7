//! Little-endian byte encoding helpers. The reader never panics: every
//! out-of-bounds read is a [`StoreError::Corrupt`].

use crate::error::{Result, StoreError};

pub(crate) struct Writer<'a> {
    buf: &'a mut [u8],
    pos: usize,
}

impl<'a> Writer<'a> {
    pub(crate) fn new(buf: &'a mut [u8]) -> Self {
        Writer { buf, pos: 0 }
    }
    pub(crate) fn bytes(&mut self, bytes: &[u8]) {
        debug_assert!(
            self.pos + bytes.len() <= self.buf.len(),
            "encoder overruns its {}-byte buffer at {} (+{})",
            self.buf.len(),
            self.pos,
            bytes.len()
        );
        self.buf[self.pos..self.pos + bytes.len()].copy_from_slice(bytes);
        self.pos += bytes.len();
    }
    pub(crate) fn u8(&mut self, v: u8) {
        self.bytes(&[v])
    }
    pub(crate) fn u16(&mut self, v: u16) {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn u32(&mut self, v: u32) {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes())
    }
    pub(crate) fn pos(&self) -> usize {
        self.pos
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub(crate) fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, pos: 0, what }
    }
    pub(crate) fn bytes(&mut self, len: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(len).filter(|end| *end <= self.buf.len()).ok_or_else(|| {
            StoreError::corrupt(format!("{}: truncated at byte {} (wanted {len} more)", self.what, self.pos))
        })?;
        let out = &self.buf[self.pos..end];
        self.pos = end;
        Ok(out)
    }
    pub(crate) fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.bytes(N)?);
        Ok(out)
    }
    pub(crate) fn u8(&mut self) -> Result<u8> {
        Ok(self.bytes(1)?[0])
    }
    pub(crate) fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    pub(crate) fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    pub(crate) fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }
}

/// Writes the crc32c of `buf[crc_at+4..]` followed by `buf[..crc_at]` at
/// `crc_at` (the field itself is excluded).
pub(crate) fn seal(buf: &mut [u8], crc_at: usize) {
    let crc = checksum_excluding(buf, crc_at);
    buf[crc_at..crc_at + 4].copy_from_slice(&crc.to_le_bytes());
    debug_assert!(verify_seal(buf, crc_at), "a sealed buffer fails its own seal");
}

/// Whether the crc stored at `crc_at` matches (see [`seal`]).
pub(crate) fn verify_seal(buf: &[u8], crc_at: usize) -> bool {
    debug_assert!(crc_at + 4 <= buf.len(), "crc field at {crc_at} outside a {}-byte buffer", buf.len());
    let stored = u32::from_le_bytes(buf[crc_at..crc_at + 4].try_into().expect("4 bytes"));
    stored == checksum_excluding(buf, crc_at)
}

fn checksum_excluding(buf: &[u8], crc_at: usize) -> u32 {
    let head = crc32c::crc32c(&buf[..crc_at]);
    crc32c::crc32c_append(head, &buf[crc_at + 4..])
}
