//! [`MemoryExport`]: a RAM disk, the reference [`Export`] for tests and examples.
//!
//! Every call completes synchronously (its [`Done`] is called before the
//! call returns), which also exercises the server's handling of completions
//! that arrive inside the call.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;

use crate::{Done, Errno, Export};

/// How often each operation reached the export; lets tests check that FUA
/// and flushes actually arrive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryStats {
    pub reads: u64,
    pub writes: u64,
    pub fua_writes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub write_zeroes: u64,
    /// write_zeroes calls with `may_trim == false` (NBD_CMD_FLAG_NO_HOLE).
    pub write_zeroes_no_hole: u64,
}

#[derive(Default)]
struct Counters {
    reads: AtomicU64,
    writes: AtomicU64,
    fua_writes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    write_zeroes: AtomicU64,
    write_zeroes_no_hole: AtomicU64,
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

/// A `Vec<u8>` behind a mutex. Trim zeroes the range, so reads after a trim
/// are deterministic.
pub struct MemoryExport {
    data: Mutex<Vec<u8>>,
    read_only: bool,
    counters: Counters,
}

impl MemoryExport {
    /// A zero-filled export of `size` bytes.
    pub fn new(size: usize) -> Self {
        Self::from_vec(vec![0; size])
    }

    pub fn from_vec(data: Vec<u8>) -> Self {
        MemoryExport { data: Mutex::new(data), read_only: false, counters: Counters::default() }
    }

    /// Advertises the export read-only; writes then fail with EPERM.
    pub fn with_read_only(mut self, read_only: bool) -> Self {
        self.read_only = read_only;
        self
    }

    /// A copy of the whole image.
    pub fn contents(&self) -> Vec<u8> {
        self.lock().clone()
    }

    /// Grows (zero-filled) or shrinks the image.
    pub fn resize(&self, size: usize) {
        self.lock().resize(size, 0);
    }

    pub fn stats(&self) -> MemoryStats {
        let c = &self.counters;
        MemoryStats {
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            fua_writes: c.fua_writes.load(Ordering::Relaxed),
            flushes: c.flushes.load(Ordering::Relaxed),
            trims: c.trims.load(Ordering::Relaxed),
            write_zeroes: c.write_zeroes.load(Ordering::Relaxed),
            write_zeroes_no_hole: c.write_zeroes_no_hole.load(Ordering::Relaxed),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<u8>> {
        // A panic while holding the lock cannot leave the Vec inconsistent
        // (every mutation is a single copy or fill), so poisoning is ignored.
        self.data.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn modify(&self, offset: u64, len: u64, change: impl FnOnce(&mut [u8])) -> Result<(), Errno> {
        if self.read_only {
            return Err(Errno::Perm);
        }
        let mut data = self.lock();
        // The size may have changed since the server checked the bounds.
        let range = byte_range(data.len(), offset, len).ok_or(Errno::NoSpc)?;
        change(&mut data[range]);
        Ok(())
    }
}

/// `offset..offset + len` if it lies within `size`.
fn byte_range(size: usize, offset: u64, len: u64) -> Option<Range<usize>> {
    let end = offset.checked_add(len)?;
    if end > size as u64 {
        return None;
    }
    Some(usize::try_from(offset).ok()?..usize::try_from(end).ok()?)
}

impl Export for MemoryExport {
    fn size(&self) -> u64 {
        self.lock().len() as u64
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn read(&self, offset: u64, len: u32, done: Done<Bytes>) {
        bump(&self.counters.reads);
        let result = {
            let data = self.lock();
            byte_range(data.len(), offset, len.into()).map(|range| Bytes::copy_from_slice(&data[range]))
        };
        done(result.ok_or(Errno::Inval));
    }

    fn write(&self, offset: u64, data: Bytes, fua: bool, done: Done<()>) {
        bump(&self.counters.writes);
        if fua {
            bump(&self.counters.fua_writes);
        }
        done(self.modify(offset, data.len() as u64, |range| range.copy_from_slice(&data)));
    }

    fn flush(&self, done: Done<()>) {
        bump(&self.counters.flushes);
        done(Ok(()));
    }

    fn trim(&self, offset: u64, len: u32, done: Done<()>) {
        bump(&self.counters.trims);
        done(self.modify(offset, len.into(), |range| range.fill(0)));
    }

    fn write_zeroes(&self, offset: u64, len: u32, may_trim: bool, done: Done<()>) {
        bump(&self.counters.write_zeroes);
        if !may_trim {
            bump(&self.counters.write_zeroes_no_hole);
        }
        done(self.modify(offset, len.into(), |range| range.fill(0)));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc;

    use super::*;

    fn call<T: Send + 'static>(start: impl FnOnce(Done<T>)) -> Result<T, Errno> {
        let (sender, receiver) = mpsc::channel();
        start(Box::new(move |result| sender.send(result).expect("test receiver alive")));
        receiver.recv().expect("done was called")
    }

    #[test]
    fn write_read_trim_zero_round_trip() {
        let export = MemoryExport::new(8192);
        call(|done| export.write(100, Bytes::from_static(b"hello"), true, done)).unwrap();
        assert_eq!(call(|done| export.read(99, 7, done)).unwrap(), Bytes::from_static(b"\0hello\0"));
        call(|done| export.trim(101, 2, done)).unwrap();
        assert_eq!(call(|done| export.read(100, 5, done)).unwrap(), Bytes::from_static(b"h\0\0lo"));
        call(|done| export.write_zeroes(100, 5, false, done)).unwrap();
        assert_eq!(call(|done| export.read(100, 5, done)).unwrap(), Bytes::from_static(&[0; 5]));
        let stats = export.stats();
        assert_eq!((stats.writes, stats.fua_writes, stats.trims, stats.write_zeroes_no_hole), (1, 1, 1, 1));
    }

    #[test]
    fn out_of_range_and_read_only_are_errors() {
        let export = MemoryExport::new(10);
        assert_eq!(call(|done| export.read(8, 3, done)), Err(Errno::Inval));
        assert_eq!(call(|done| export.read(u64::MAX, 1, done)), Err(Errno::Inval));
        assert_eq!(call(|done| export.write(9, Bytes::from_static(b"ab"), false, done)), Err(Errno::NoSpc));
        let read_only = MemoryExport::new(10).with_read_only(true);
        assert_eq!(call(|done| read_only.write(0, Bytes::from_static(b"a"), false, done)), Err(Errno::Perm));
        assert_eq!(read_only.contents(), vec![0; 10]);
    }

    #[test]
    fn resize_changes_size_and_keeps_prefix() {
        let export = MemoryExport::from_vec(vec![7; 4]);
        export.resize(6);
        assert_eq!(export.contents(), vec![7, 7, 7, 7, 0, 0]);
        export.resize(2);
        assert_eq!(export.size(), 2);
    }
}
