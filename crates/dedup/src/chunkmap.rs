//! The omap records of the tier (docs/DEDUP.md).
//!
//! A base object's **chunk map** entry, one per deduplicated chunk:
//! ```text
//! key    'c', offset u64 big-endian          (9 bytes: key order is offset order)
//! value  version u8 = 1, flags u8 (1 = cached), length u32 LE, nonce u64 LE, fingerprint [32]
//! ```
//! A chunk object's **reference**, one per (base pool, object, offset,
//! nonce) using it, an omap key with an empty value:
//! ```text
//! key    pool u32 BE, offset u64 BE, nonce u64 BE, object name (1 to 235 bytes)
//! ```
//! The **nonce** is the engine pass's that put the chunk (each pass draws
//! its own): an entry names the reference its pass added, and an unref
//! removes exactly that one. Without it, a pass of a replaced primary
//! that unreferences an old chunk late could remove the reference a
//! newer pass just added for the same offset and bytes, and the chunk
//! would go while a chunk map still names it.
//! Both decoders meet bytes from disk and peers: they return `None` on
//! anything malformed, never panic.

use crate::Fingerprint;

/// The first byte of every chunk map key (other omap keys of a base object
/// stay free for other uses).
pub const ENTRY_PREFIX: u8 = b'c';
const ENTRY_VERSION: u8 = 1;
const FLAG_CACHED: u8 = 1;
/// Bytes of an encoded [`ChunkEntry`].
pub const ENTRY_LEN: usize = 46;
/// Longest object name a reference holds (an omap key is at most 255 bytes).
pub const MAX_REFERENCED_NAME: usize = 255 - REFERENCE_HEADER;
const REFERENCE_HEADER: usize = 20;

/// A chunk map entry: the chunk at its key's offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkEntry {
    pub len: u32,
    /// The pass that put the chunk: its reference's nonce.
    pub nonce: u64,
    pub fingerprint: Fingerprint,
    /// The base object still holds the chunk's bytes (else its range is a
    /// hole and reads go to the chunk object).
    pub cached: bool,
}

impl ChunkEntry {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENTRY_LEN);
        out.push(ENTRY_VERSION);
        out.push(if self.cached { FLAG_CACHED } else { 0 });
        out.extend_from_slice(&self.len.to_le_bytes());
        out.extend_from_slice(&self.nonce.to_le_bytes());
        out.extend_from_slice(&self.fingerprint.0);
        debug_assert_eq!(out.len(), ENTRY_LEN);
        out
    }

    pub fn decode(bytes: &[u8]) -> Option<ChunkEntry> {
        if bytes.len() != ENTRY_LEN || bytes[0] != ENTRY_VERSION || bytes[1] & !FLAG_CACHED != 0 {
            return None;
        }
        let len = u32::from_le_bytes(bytes[2..6].try_into().ok()?);
        if len == 0 {
            return None;
        }
        Some(ChunkEntry {
            len,
            nonce: u64::from_le_bytes(bytes[6..14].try_into().ok()?),
            fingerprint: Fingerprint(bytes[14..].try_into().ok()?),
            cached: bytes[1] & FLAG_CACHED != 0,
        })
    }
}

/// The chunk map key of the chunk at `offset`.
pub fn entry_key(offset: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(9);
    key.push(ENTRY_PREFIX);
    key.extend_from_slice(&offset.to_be_bytes());
    key
}

/// The offset a chunk map key names (`None`: not a chunk map key).
pub fn entry_offset(key: &[u8]) -> Option<u64> {
    match key {
        [ENTRY_PREFIX, rest @ ..] if rest.len() == 8 => Some(u64::from_be_bytes(rest.try_into().ok()?)),
        _ => None,
    }
}

/// The key range holding every chunk map entry at or past `offset`.
pub fn entries_from(offset: u64) -> (Vec<u8>, Vec<u8>) {
    (entry_key(offset), vec![ENTRY_PREFIX + 1])
}

/// An object's chunk map (offset → entry) from its omap records (a tier
/// read's, or the store's): `None` if one of them is not a chunk map
/// entry.
pub fn decode_map(records: &[(Vec<u8>, Vec<u8>)]) -> Option<std::collections::BTreeMap<u64, ChunkEntry>> {
    records.iter().map(|(key, value)| Some((entry_offset(key)?, ChunkEntry::decode(value)?))).collect()
}

/// Who uses a chunk: a chunk object's reference.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Reference {
    pub pool: u32,
    pub offset: u64,
    pub nonce: u64,
    pub object: Vec<u8>,
}

impl Reference {
    /// The omap key (`None`: a name too long to reference; such an object
    /// is not deduplicated).
    pub fn encode(&self) -> Option<Vec<u8>> {
        if self.object.is_empty() || self.object.len() > MAX_REFERENCED_NAME {
            return None;
        }
        let mut key = Vec::with_capacity(REFERENCE_HEADER + self.object.len());
        key.extend_from_slice(&self.pool.to_be_bytes());
        key.extend_from_slice(&self.offset.to_be_bytes());
        key.extend_from_slice(&self.nonce.to_be_bytes());
        key.extend_from_slice(&self.object);
        Some(key)
    }

    pub fn decode(key: &[u8]) -> Option<Reference> {
        if key.len() <= REFERENCE_HEADER || key.len() > REFERENCE_HEADER + MAX_REFERENCED_NAME {
            return None;
        }
        Some(Reference {
            pool: u32::from_be_bytes(key[..4].try_into().ok()?),
            offset: u64::from_be_bytes(key[4..12].try_into().ok()?),
            nonce: u64::from_be_bytes(key[12..20].try_into().ok()?),
            object: key[REFERENCE_HEADER..].to_vec(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn records_round_trip(len in 1u32.., nonce in any::<u64>(), print in any::<[u8; 32]>(), cached in any::<bool>(), offset in any::<u64>(), pool in any::<u32>(), object in proptest::collection::vec(any::<u8>(), 1..=MAX_REFERENCED_NAME)) {
            let entry = ChunkEntry { len, nonce, fingerprint: Fingerprint(print), cached };
            prop_assert_eq!(ChunkEntry::decode(&entry.encode()), Some(entry));
            prop_assert_eq!(entry_offset(&entry_key(offset)), Some(offset));
            let reference = Reference { pool, offset, nonce, object };
            let key = reference.encode().unwrap();
            prop_assert!(key.len() <= 255);
            prop_assert_eq!(Reference::decode(&key), Some(reference));
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = ChunkEntry::decode(&bytes);
            let _ = entry_offset(&bytes);
            let _ = Reference::decode(&bytes);
        }

        #[test]
        fn chunk_map_keys_sort_as_their_offsets(a in any::<u64>(), b in any::<u64>()) {
            prop_assert_eq!(entry_key(a).cmp(&entry_key(b)), a.cmp(&b));
            let (start, end) = entries_from(a.min(b));
            prop_assert!(entry_key(a.max(b)) >= start && entry_key(a.max(b)) < end);
        }
    }

    #[test]
    fn malformed_records_are_refused() {
        let entry = ChunkEntry { len: 4096, nonce: 1, fingerprint: Fingerprint::of(b"x"), cached: true }.encode();
        let mut bad_version = entry.clone();
        bad_version[0] = 2;
        let mut bad_flags = entry.clone();
        bad_flags[1] = 2;
        let mut empty = entry.clone();
        empty[2..6].copy_from_slice(&0u32.to_le_bytes());
        for bad in [&bad_version[..], &bad_flags[..], &empty[..], &entry[..ENTRY_LEN - 1]] {
            assert_eq!(ChunkEntry::decode(bad), None);
        }
        assert_eq!(entry_offset(b"d\0\0\0\0\0\0\0\0"), None);
        assert_eq!(Reference { pool: 1, offset: 0, nonce: 0, object: vec![] }.encode(), None);
        assert_eq!(Reference { pool: 1, offset: 0, nonce: 0, object: vec![b'a'; 236] }.encode(), None);
        assert_eq!(Reference::decode(&[0; 20]), None);
    }
}
