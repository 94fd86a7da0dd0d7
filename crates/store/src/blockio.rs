//! What every I/O queue shares, whoever implements it (the device's own
//! queues in `device.rs`, the fault-injecting cache in `faults.rs`): the
//! [`BlockIo`] trait, its [`IoStats`] counters, and the [`AlignedBuf`]
//! buffers direct I/O needs.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::io;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every [`AlignedBuf`]: enough for any device's direct I/O.
pub const BUFFER_ALIGN: usize = 4096;

/// A zero-initialised heap buffer aligned to [`BUFFER_ALIGN`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf uniquely owns its allocation, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` > 0, a multiple of 512).
    pub fn zeroed(len: usize) -> AlignedBuf {
        assert!(len > 0 && len.is_multiple_of(512), "aligned buffer length {len} must be a positive multiple of 512");
        let layout = Layout::from_size_align(len, BUFFER_ALIGN).expect("valid layout");
        // SAFETY: layout has non-zero size.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        debug_assert!((ptr.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN), "the allocator ignored the alignment");
        AlignedBuf { ptr, len }
    }

    pub fn from_slice(bytes: &[u8]) -> AlignedBuf {
        let mut buf = AlignedBuf::zeroed(bytes.len().div_ceil(512) * 512);
        buf[..bytes.len()].copy_from_slice(bytes);
        debug_assert!(buf.len() - bytes.len() < 512, "padded past the next 512-byte boundary");
        buf
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised bytes for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self guarantees uniqueness.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        AlignedBuf::from_slice(self)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = Layout::from_size_align(self.len, BUFFER_ALIGN).expect("valid layout");
        // SAFETY: allocated in `zeroed` with this exact layout.
        unsafe { dealloc(self.ptr.as_ptr(), layout) }
    }
}

/// Byte and request counters of one [`BlockIo`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct IoStats {
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub reads: u64,
    pub writes: u64,
    pub flushes: u64,
    /// Times the store handed requests to the kernel and waited for them
    /// (an `io_uring_enter`, or each `pread`/`pwrite`): a wake-up each.
    pub submissions: u64,
}

impl IoStats {
    pub fn add(&mut self, other: &IoStats) {
        self.bytes_read += other.bytes_read;
        self.bytes_written += other.bytes_written;
        self.reads += other.reads;
        self.writes += other.writes;
        self.flushes += other.flushes;
        self.submissions += other.submissions;
    }
}

/// Makes what a queue wrote durable, from any thread: a partition's
/// flusher hands a commit's device flush to a helper with one, and answers
/// reads meanwhile ([`crate::Partition::apply_unsynced`]).
pub trait FlushHandle: Send + Sync {
    /// Make every write that completed before the call durable (`fdatasync`).
    fn flush(&self) -> io::Result<()>;
}

/// One partition's queue to the device. Requests of one call may complete in
/// any order; the call returns when all have completed (or the first failed).
pub trait BlockIo: Send {
    fn read_many(&mut self, requests: &mut [(u64, &mut [u8])]) -> io::Result<()>;
    fn write_many(&mut self, requests: &[(u64, &[u8])]) -> io::Result<()>;
    /// Make every completed write durable (`fdatasync`).
    fn flush(&mut self) -> io::Result<()>;
    /// A handle that flushes this queue's device from another thread (not
    /// counted in [`BlockIo::stats`]: its caller counts).
    fn flush_handle(&self) -> std::sync::Arc<dyn FlushHandle>;
    /// Copies of every block the queue keeps (a mirror: 2).
    fn copies(&self) -> usize {
        1
    }
    /// Reads from copy `copy` alone: for a block that failed its checksum,
    /// when [`BlockIo::copies`] says there is another.
    fn read_copy(&mut self, copy: usize, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        debug_assert_eq!(copy, 0, "a queue of one copy");
        self.read_many(requests)
    }
    /// A bad copy was rewritten from a good one (counted by a mirror).
    fn note_repair(&mut self) {}
    fn stats(&self) -> IoStats;
    fn engine(&self) -> &'static str;
}
