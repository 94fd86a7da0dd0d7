//! The I/O seam: a device (file or block device, opened with `O_DIRECT`) and
//! per-partition I/O queues ([`BlockIo`]) over it.
//!
//! Each partition owns its own [`BlockIo`]: an io_uring ring where the kernel
//! allows one, `pread`/`pwrite` otherwise (chosen at runtime, or forced by
//! [`IoBackend`]). Partitions share the file descriptor, which needs no lock:
//! positioned I/O does not move a shared offset. `flush` is `fdatasync`.
//!
//! Every buffer handed to a [`BlockIo`] must be aligned to the device's direct
//! I/O alignment ([`Device::sector_size`]); [`AlignedBuf`] provides that.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use crate::blockio::{AlignedBuf, BlockIo, FlushHandle, IoStats, BUFFER_ALIGN};
use crate::error::{Result, StoreError};
use crate::faults::{DeviceCache, DeviceFaults, FaultyIo};
use crate::mirror::io::MirrorIo;
use crate::mirror::{Mirror, MirrorConfig};
use crate::model::{FlushStall, StallingIo};
use crate::BLOCK_SIZE;

/// Which I/O engine a partition uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IoBackend {
    /// io_uring if the kernel allows it, else pread/pwrite.
    Auto,
    /// io_uring or fail.
    Uring,
    /// pread/pwrite, one request (or one run of adjacent ones, vectored) at a time.
    Pread,
}

/// What to do when the file system refuses `O_DIRECT` (tmpfs, for one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DirectIo {
    /// Fail to open with a message that says what to do.
    Require,
    /// Warn and use buffered I/O (flushes still reach the device with fdatasync).
    Fallback,
}

#[derive(Clone, Debug)]
pub struct DeviceConfig {
    pub backend: IoBackend,
    pub direct_io: DirectIo,
    /// Entries of each partition's io_uring ring: the most requests in flight at once.
    pub queue_depth: u32,
    /// How long to wait for another process's lock on the device.
    pub lock_wait: std::time::Duration,
    /// Tests and fault rehearsals only: a volatile write cache and armed
    /// faults in front of every queue ([`crate::faults`]).
    pub faults: Option<Arc<DeviceFaults>>,
    /// Benchmarks and tests only: flushes that stall the device
    /// ([`crate::model`]), as on a disk without power-loss protection.
    pub flush_stall: Option<Duration>,
    /// A second device the store is mirrored on ([`crate::mirror`]).
    pub mirror: Option<MirrorConfig>,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            backend: IoBackend::Auto,
            direct_io: DirectIo::Require,
            queue_depth: 256,
            lock_wait: std::time::Duration::from_secs(10),
            faults: None,
            flush_stall: None,
            mirror: None,
        }
    }
}

/// An open device: a regular file or a block device.
pub struct Device {
    file: Arc<File>,
    /// Shared by every queue of a modelled device.
    stall: Option<Arc<FlushStall>>,
    /// The pair, when this device is a mirror of two (`file` is the first's).
    mirror: Option<Arc<Mirror>>,
    /// Tests: the volatile write cache every queue shares ([`crate::faults`]).
    cache: Option<Arc<DeviceCache>>,
    path: PathBuf,
    size_bytes: u64,
    sector_size: u32,
    direct: bool,
    config: DeviceConfig,
}

const STATX_DIOALIGN: u32 = 0x2000;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;

impl Device {
    /// Opens `path` for reading and writing with `O_DIRECT` (see
    /// [`DirectIo`]); with a [`MirrorConfig`], the pair of `path` and its
    /// second device, resynced.
    pub fn open(path: &Path, config: &DeviceConfig, writable: bool) -> Result<Device> {
        match &config.mirror {
            Some(mirror) => {
                let single = DeviceConfig { mirror: None, ..config.clone() };
                Device::over_mirror(Mirror::open(path, mirror, &single, writable)?)
            }
            None => Device::open_one(path, config, writable),
        }
    }

    /// Opens `path` to make a store on it: with a [`MirrorConfig`], makes a
    /// new mirror of the pair (what they held is lost).
    pub fn create(path: &Path, config: &DeviceConfig) -> Result<Device> {
        match &config.mirror {
            Some(mirror) => {
                let single = DeviceConfig { mirror: None, ..config.clone() };
                Device::over_mirror(Mirror::make(path, mirror, &single)?)
            }
            None => Device::open_one(path, config, true),
        }
    }

    fn over_mirror(mirror: Mirror) -> Result<Device> {
        let (first, second) = (mirror.side(0), mirror.side(1));
        Ok(Device {
            file: first.file.clone(),
            stall: None,
            path: first.path.clone(),
            size_bytes: mirror.layout().store_bytes,
            sector_size: first.sector_size.max(second.sector_size),
            direct: first.direct && second.direct,
            config: first.config.clone(),
            mirror: Some(Arc::new(mirror)),
            cache: None,
        })
    }

    /// Stands in for a mirror device that could not be opened at mount
    /// (`path`, as configured): an empty in-memory file. The mirror has it
    /// failed, so no I/O is ever routed to it; one that were would read
    /// nothing and fail.
    pub(crate) fn absent(path: &Path) -> Result<Device> {
        // SAFETY: memfd_create with a NUL-terminated name; the fd it returns is owned by the File below.
        let fd = unsafe { libc::memfd_create(c"duplex-absent-mirror-device".as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(StoreError::io("standing in for an absent mirror device", io::Error::last_os_error()));
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let file = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let config = DeviceConfig {
            backend: IoBackend::Pread,
            direct_io: DirectIo::Fallback,
            mirror: None,
            faults: None,
            flush_stall: None,
            ..DeviceConfig::default()
        };
        Ok(Device {
            file: Arc::new(file),
            stall: None,
            mirror: None,
            cache: None,
            path: path.to_path_buf(),
            size_bytes: 0,
            sector_size: 512,
            direct: false,
            config,
        })
    }

    /// The mirror this device is, if it is one.
    pub fn mirror(&self) -> Option<&Arc<Mirror>> {
        self.mirror.as_ref()
    }

    fn open_one(path: &Path, config: &DeviceConfig, writable: bool) -> Result<Device> {
        let shown = path.display().to_string();
        let open = |direct: bool| {
            let mut options = OpenOptions::new();
            options.read(true).write(writable);
            if direct {
                options.custom_flags(libc::O_DIRECT);
            }
            options.open(path)
        };
        let (file, direct) = match open(true) {
            Ok(file) => (file, true),
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => match config.direct_io {
                DirectIo::Require => {
                    return Err(StoreError::DirectIoUnsupported { path: shown, detail: err.to_string() })
                }
                DirectIo::Fallback => {
                    tracing::warn!(path = %shown, "O_DIRECT refused by the file system; using buffered I/O");
                    (open(false).map_err(|e| StoreError::io(format!("opening {shown}"), e))?, false)
                }
            },
            Err(err) => return Err(StoreError::io(format!("opening {shown}"), err)),
        };
        lock_device(&file, &shown, writable, config.lock_wait)?;
        let metadata = file.metadata().map_err(|e| StoreError::io(format!("stat {shown}"), e))?;
        let is_block_device = metadata.file_type().is_block_device();
        let size_bytes = if is_block_device {
            let mut size: u64 = 0;
            // SAFETY: BLKGETSIZE64 writes one u64 through the pointer.
            let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64 as _, &mut size as *mut u64) };
            if rc != 0 {
                return Err(StoreError::io(format!("reading the size of {shown}"), io::Error::last_os_error()));
            }
            size
        } else {
            metadata.len()
        };
        let sector_size = if !direct { 512 } else { direct_io_alignment(&file, is_block_device) };
        if !(512..=BLOCK_SIZE as u32).contains(&sector_size) || !sector_size.is_power_of_two() {
            return Err(StoreError::invalid(format!(
                "{shown}: direct I/O alignment {sector_size} is not a power of two between 512 and 4096"
            )));
        }
        let mut device = Device {
            file: Arc::new(file),
            stall: config.flush_stall.map(FlushStall::new),
            mirror: None,
            cache: None,
            path: path.to_path_buf(),
            size_bytes,
            sector_size,
            direct,
            config: config.clone(),
        };
        if let Some(faults) = &config.faults {
            device.cache = Some(DeviceCache::new(device.modelled_queue()?, faults.clone()));
        }
        Ok(device)
    }

    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The smallest unit of direct I/O: journal records are padded to it.
    pub fn sector_size(&self) -> u32 {
        self.sector_size
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How it was opened.
    pub(crate) fn config(&self) -> &DeviceConfig {
        &self.config
    }

    /// A new I/O queue for one partition.
    pub fn queue(&self) -> Result<Box<dyn BlockIo>> {
        if let Some(mirror) = &self.mirror {
            return Ok(Box::new(MirrorIo::new(mirror.clone())?));
        }
        let queue = self.modelled_queue()?;
        Ok(match &self.cache {
            Some(cache) => Box::new(FaultyIo::new(queue, cache.clone())),
            None => queue,
        })
    }

    fn modelled_queue(&self) -> Result<Box<dyn BlockIo>> {
        let queue = self.real_queue()?;
        Ok(match &self.stall {
            Some(stall) => Box::new(StallingIo::new(queue, stall.clone())),
            None => queue,
        })
    }

    fn real_queue(&self) -> Result<Box<dyn BlockIo>> {
        let pread = || Box::new(PreadIo { file: self.file.clone(), stats: IoStats::default() }) as Box<dyn BlockIo>;
        match self.config.backend {
            IoBackend::Pread => Ok(pread()),
            IoBackend::Uring => Ok(Box::new(
                UringIo::new(self.file.clone(), self.config.queue_depth)
                    .map_err(|e| StoreError::io("creating an io_uring ring", e))?,
            )),
            IoBackend::Auto => match UringIo::new(self.file.clone(), self.config.queue_depth) {
                Ok(ring) => Ok(Box::new(ring)),
                Err(err) => {
                    tracing::info!(error = %err, "io_uring unavailable; using pread/pwrite");
                    Ok(pread())
                }
            },
        }
    }
}

/// Takes an advisory lock on the device: exclusive to write, shared to read.
///
/// Besides keeping two processes from mounting one store, this orders a
/// restart after a crash: a killed process's in-flight io_uring writes hold
/// its file open until they complete, so the lock is free only once they
/// have landed, and recovery never reads a block that is still being written.
fn lock_device(file: &File, shown: &str, writable: bool, wait: std::time::Duration) -> Result<()> {
    let operation = if writable { libc::LOCK_EX } else { libc::LOCK_SH } | libc::LOCK_NB;
    let started = std::time::Instant::now();
    loop {
        // SAFETY: flock on an open descriptor.
        if unsafe { libc::flock(file.as_raw_fd(), operation) } == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(StoreError::io(format!("locking {shown}"), err));
        }
        if started.elapsed() >= wait {
            return Err(StoreError::InUse { path: shown.to_string() });
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

fn direct_io_alignment(file: &File, is_block_device: bool) -> u32 {
    if is_block_device {
        let mut sector: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int through the pointer.
        let rc = unsafe { libc::ioctl(file.as_raw_fd(), libc::BLKSSZGET as _, &mut sector as *mut libc::c_int) };
        return if rc == 0 && sector > 0 { sector as u32 } else { BLOCK_SIZE as u32 };
    }
    // SAFETY: statx fills the zeroed struct; the empty path with AT_EMPTY_PATH names the fd.
    let mut stx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe { libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, STATX_DIOALIGN, &mut stx) };
    if rc == 0 && stx.stx_mask & STATX_DIOALIGN != 0 && stx.stx_dio_offset_align != 0 {
        stx.stx_dio_offset_align
    } else {
        // Unknown: the block size is always safe.
        BLOCK_SIZE as u32
    }
}

/// Creates (or extends) a regular file of `size_bytes` for use as a device.
/// The file is sparse: untouched areas cost no disk space.
pub fn create_file(path: &Path, size_bytes: u64) -> Result<()> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| StoreError::io(format!("creating {}", path.display()), e))?;
    file.set_len(size_bytes).map_err(|e| StoreError::io(format!("sizing {}", path.display()), e))
}

/// How many times in a row `io_uring_enter` may answer EAGAIN or EBUSY
/// (1 ms apart) before a ring with requests in flight is given up on.
const MAX_BUSY_WAITS: u32 = 10_000;

/// Most requests one vectored write carries (well under the kernel's
/// `IOV_MAX`, 1,024), and most bytes: a longer run is cut into several.
const MAX_RUN_REQUESTS: usize = 256;
const MAX_RUN_BYTES: usize = 1 << 20;

/// Whether `next` starts on the device where `before` ends.
fn adjacent<T: AsRef<[u8]>>(before: &(u64, T), next: &(u64, T)) -> bool {
    before.0.checked_add(before.1.as_ref().len() as u64) == Some(next.0)
}

/// `requests` cut into runs of adjacent ones, in their order (a request
/// whose predecessor ends elsewhere starts a run), each of at most
/// [`MAX_RUN_REQUESTS`] requests and [`MAX_RUN_BYTES`] bytes (but for a
/// single larger request).
fn contiguous_runs<T: AsRef<[u8]>>(requests: &[(u64, T)]) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut start = 0;
    std::iter::from_fn(move || {
        if start >= requests.len() {
            return None;
        }
        let mut end = start + 1;
        let mut bytes = requests[start].1.as_ref().len();
        while end < requests.len()
            && end - start < MAX_RUN_REQUESTS
            && bytes + requests[end].1.as_ref().len() <= MAX_RUN_BYTES
            && adjacent(&requests[end - 1], &requests[end])
        {
            bytes += requests[end].1.as_ref().len();
            end += 1;
        }
        let run = start..end;
        start = end;
        Some(run)
    })
}

/// The bytes a positioned vectored call moved, called again when a signal
/// interrupted it (as `read_exact_at` and `write_all_at` do).
fn retry_interrupted(mut call: impl FnMut() -> isize) -> io::Result<usize> {
    loop {
        let moved = call();
        if moved >= 0 {
            return Ok(moved as usize);
        }
        let err = io::Error::last_os_error();
        if err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
    }
}

/// The requests of a run (by their lengths, in order) that `done` bytes
/// from its start did not cover whole: each one's index and the bytes of
/// it already moved.
fn unfinished(lens: impl Iterator<Item = usize>, done: usize) -> impl Iterator<Item = (usize, usize)> {
    let mut start = 0;
    lens.enumerate().filter_map(move |(index, len)| {
        let from = done.saturating_sub(start);
        start += len;
        (from < len).then_some((index, from))
    })
}

fn check_run<T: AsRef<[u8]>>(run: &[(u64, T)]) {
    for (offset, buf) in run {
        let buf = buf.as_ref();
        check_aligned(*offset, buf.len(), buf.as_ptr());
    }
    debug_assert!(run.windows(2).all(|pair| adjacent(&pair[0], &pair[1])), "a run of requests that are not adjacent");
}

fn iovec_of_mut(buf: &mut [u8]) -> libc::iovec {
    libc::iovec { iov_base: buf.as_mut_ptr() as *mut libc::c_void, iov_len: buf.len() }
}

fn iovec_of(buf: &[u8]) -> libc::iovec {
    libc::iovec { iov_base: buf.as_ptr() as *mut libc::c_void, iov_len: buf.len() }
}

fn check_aligned(offset: u64, len: usize, ptr: *const u8) {
    debug_assert!(offset.is_multiple_of(512), "unaligned device offset {offset}");
    debug_assert!(len.is_multiple_of(512) && len > 0, "unaligned I/O length {len}");
    debug_assert!((ptr as usize).is_multiple_of(512), "unaligned I/O buffer");
}

/// `fdatasync` of the device's file, from any thread.
struct FileFlush(Arc<File>);

impl FlushHandle for FileFlush {
    fn flush(&self) -> io::Result<()> {
        self.0.sync_data()
    }
}

struct PreadIo {
    file: Arc<File>,
    stats: IoStats,
}

impl BlockIo for PreadIo {
    fn read_many(&mut self, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let runs: Vec<_> = contiguous_runs(requests).collect();
        for run in runs {
            let run = &mut requests[run];
            check_run(run);
            let done = if run.len() == 1 {
                0
            } else {
                let iovecs: Vec<libc::iovec> = run.iter_mut().map(|(_, buf)| iovec_of_mut(buf)).collect();
                // SAFETY: each iovec names a live, exclusively borrowed buffer
                // of `run`, which outlives the call; at most MAX_RUN_REQUESTS.
                retry_interrupted(|| unsafe {
                    libc::preadv(self.file.as_raw_fd(), iovecs.as_ptr(), iovecs.len() as libc::c_int, run[0].0 as i64)
                })?
            };
            // A lone request, or what a short vectored read left (past the
            // device's end this fails, as `read_exact_at` does).
            let left: Vec<_> = unfinished(run.iter().map(|(_, buf)| buf.len()), done).collect();
            for (index, from) in left {
                let (offset, buf) = &mut run[index];
                self.file.read_exact_at(&mut buf[from..], *offset + from as u64)?;
            }
            self.stats.reads += 1;
            self.stats.submissions += 1;
            self.stats.bytes_read += run.iter().map(|(_, buf)| buf.len() as u64).sum::<u64>();
        }
        Ok(())
    }

    fn write_many(&mut self, requests: &[(u64, &[u8])]) -> io::Result<()> {
        for run in contiguous_runs(requests) {
            let run = &requests[run];
            check_run(run);
            let done = if run.len() == 1 {
                0
            } else {
                let iovecs: Vec<libc::iovec> = run.iter().map(|(_, buf)| iovec_of(buf)).collect();
                // SAFETY: each iovec names a live buffer of `run`, which
                // outlives the call; the count is at most MAX_RUN_REQUESTS.
                retry_interrupted(|| unsafe {
                    libc::pwritev(self.file.as_raw_fd(), iovecs.as_ptr(), iovecs.len() as libc::c_int, run[0].0 as i64)
                })?
            };
            // A lone request, or what a short vectored write left (buffered
            // fallback only).
            for (index, from) in unfinished(run.iter().map(|(_, buf)| buf.len()), done) {
                let (offset, buf) = run[index];
                self.file.write_all_at(&buf[from..], offset + from as u64)?;
            }
            self.stats.writes += 1;
            self.stats.submissions += 1;
            self.stats.bytes_written += run.iter().map(|(_, buf)| buf.len() as u64).sum::<u64>();
        }
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stats.flushes += 1;
        self.file.sync_data()
    }

    fn flush_handle(&self) -> Arc<dyn FlushHandle> {
        Arc::new(FileFlush(self.file.clone()))
    }

    fn stats(&self) -> IoStats {
        self.stats
    }

    fn engine(&self) -> &'static str {
        "pread"
    }
}

struct UringIo {
    file: Arc<File>,
    ring: io_uring::IoUring,
    stats: IoStats,
}

impl UringIo {
    fn new(file: Arc<File>, entries: u32) -> io::Result<UringIo> {
        let ring = io_uring::IoUring::new(entries.max(8))?;
        Ok(UringIo { file, ring, stats: IoStats::default() })
    }

    /// Submits `entries` in windows of at most the ring's size and waits for
    /// every completion. Short transfers are errors: the store never reads
    /// or writes past the end of its device.
    fn run(&mut self, entries: &[(io_uring::squeue::Entry, usize)]) -> io::Result<()> {
        let window = self.ring.params().sq_entries() as usize;
        debug_assert!(window >= 8, "the ring was made with at least 8 entries");
        let mut first_error: Option<io::Error> = None;
        for chunk in entries.chunks(window) {
            for (index, (entry, _)) in chunk.iter().enumerate() {
                let entry = entry.clone().user_data(index as u64);
                // SAFETY: the buffers behind each entry outlive this call, which
                // waits for every completion before returning.
                let pushed = unsafe { self.ring.submission().push(&entry) };
                // A window fits the queue, which every call leaves empty.
                // Were it full, entries pushed before would go out with a
                // later call, after their buffers were freed: stop here.
                assert!(pushed.is_ok(), "io_uring submission queue full at entry {index} of a window of {window}");
            }
            let mut remaining = chunk.len();
            let mut busy_waits = 0u32;
            while remaining > 0 {
                self.stats.submissions += 1;
                match self.ring.submit_and_wait(remaining.min(chunk.len())) {
                    Ok(_) => busy_waits = 0,
                    Err(err) if err.raw_os_error() == Some(libc::EINTR) => {}
                    // The kernel short of room for now: reap what completed
                    // and wait again, for up to about 10 s.
                    Err(err)
                        if matches!(err.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY))
                            && busy_waits < MAX_BUSY_WAITS =>
                    {
                        busy_waits += 1;
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    Err(err) => {
                        // Requests of this window may still be in flight
                        // with the caller's buffers (and a vectored one's
                        // iovecs): returning would let the kernel use freed
                        // memory, and a write put other bytes on the device
                        // than the store records. Only a crash is safe.
                        tracing::error!(error = %err, remaining, "io_uring_enter failed with requests in flight; aborting");
                        eprintln!("io_uring_enter failed with {remaining} requests in flight ({err}); aborting");
                        std::process::abort();
                    }
                }
                for cqe in self.ring.completion() {
                    debug_assert!(remaining > 0, "more completions than submissions");
                    debug_assert!((cqe.user_data() as usize) < chunk.len(), "user_data is the entry's index");
                    remaining -= 1;
                    let expected = chunk[cqe.user_data() as usize].1;
                    let result = cqe.result();
                    if result < 0 {
                        first_error.get_or_insert(io::Error::from_raw_os_error(-result));
                    } else if result as usize != expected {
                        first_error.get_or_insert(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!("short transfer: {result} of {expected} bytes"),
                        ));
                    }
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}

impl BlockIo for UringIo {
    fn read_many(&mut self, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let fd = io_uring::types::Fd(self.file.as_raw_fd());
        for (offset, buf) in requests.iter() {
            check_aligned(*offset, buf.len(), buf.as_ptr());
        }
        let bytes_read = requests.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        // Adjacent requests go as one vectored read, as writes do; the
        // iovecs, built only when some request has a neighbour, carry
        // every buffer's pointer, and live until `run` has every completion.
        let any_adjacent = requests.windows(2).any(|pair| adjacent(&pair[0], &pair[1]));
        let mut iovecs: Vec<libc::iovec> = Vec::new();
        let entries: Vec<_> = if !any_adjacent {
            requests
                .iter_mut()
                .map(|(offset, buf)| {
                    debug_assert!(u32::try_from(buf.len()).is_ok(), "read of {} bytes", buf.len());
                    let entry =
                        io_uring::opcode::Read::new(fd, buf.as_mut_ptr(), buf.len() as u32).offset(*offset).build();
                    (entry, buf.len())
                })
                .collect()
        } else {
            iovecs.extend(requests.iter_mut().map(|(_, buf)| iovec_of_mut(buf)));
            let iovecs_at = iovecs.as_mut_ptr();
            contiguous_runs(requests)
                .map(|run| {
                    let offset = requests[run.start].0;
                    let bytes: usize = requests[run.clone()].iter().map(|(_, buf)| buf.len()).sum();
                    debug_assert!(u32::try_from(bytes).is_ok(), "read of {bytes} bytes");
                    // SAFETY: `run` lies within `iovecs`, one per request,
                    // which is not touched again until after `run`.
                    let first = unsafe { iovecs_at.add(run.start) };
                    let entry = if run.len() == 1 {
                        // SAFETY: as above; the iovec names the request's buffer.
                        let buf = unsafe { (*first).iov_base } as *mut u8;
                        io_uring::opcode::Read::new(fd, buf, bytes as u32).offset(offset).build()
                    } else {
                        io_uring::opcode::Readv::new(fd, first, run.len() as u32).offset(offset).build()
                    };
                    (entry, bytes)
                })
                .collect()
        };
        self.run(&entries)?;
        self.stats.reads += entries.len() as u64;
        self.stats.bytes_read += bytes_read;
        Ok(())
    }

    fn write_many(&mut self, requests: &[(u64, &[u8])]) -> io::Result<()> {
        let fd = io_uring::types::Fd(self.file.as_raw_fd());
        // Adjacent requests go as one vectored write: the kernel's
        // direct-I/O path costs per request, not per byte (a 128 KiB write
        // was 32 of them). Their iovecs, built only when some request has
        // a neighbour, live until `run` has every completion.
        let any_adjacent = requests.windows(2).any(|pair| adjacent(&pair[0], &pair[1]));
        let iovecs: Vec<libc::iovec> =
            if any_adjacent { requests.iter().map(|(_, buf)| iovec_of(buf)).collect() } else { Vec::new() };
        let entries: Vec<_> = contiguous_runs(requests)
            .map(|run| {
                let (offset, first) = requests[run.start];
                for (offset, buf) in &requests[run.clone()] {
                    check_aligned(*offset, buf.len(), buf.as_ptr());
                }
                let bytes: usize = requests[run.clone()].iter().map(|(_, buf)| buf.len()).sum();
                debug_assert!(u32::try_from(bytes).is_ok(), "write of {bytes} bytes");
                let entry = if run.len() == 1 {
                    io_uring::opcode::Write::new(fd, first.as_ptr(), bytes as u32).offset(offset).build()
                } else {
                    io_uring::opcode::Writev::new(fd, iovecs[run.clone()].as_ptr(), run.len() as u32)
                        .offset(offset)
                        .build()
                };
                (entry, bytes)
            })
            .collect();
        self.run(&entries)?;
        self.stats.writes += entries.len() as u64;
        self.stats.bytes_written += requests.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stats.flushes += 1;
        self.file.sync_data()
    }

    fn flush_handle(&self) -> Arc<dyn FlushHandle> {
        Arc::new(FileFlush(self.file.clone()))
    }

    fn stats(&self) -> IoStats {
        self.stats
    }

    fn engine(&self) -> &'static str {
        "io_uring"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Requests of `len` blocks at each of `starts` (in blocks), filled
    /// with a byte that tells each block from the others.
    fn blocks(starts: &[(u64, usize)]) -> Vec<(u64, AlignedBuf)> {
        let mut out = Vec::new();
        for (index, &(start, len)) in starts.iter().enumerate() {
            let mut buf = AlignedBuf::zeroed(len * BLOCK_SIZE);
            for (block, chunk) in buf.chunks_mut(BLOCK_SIZE).enumerate() {
                chunk.fill((index * 31 + block * 7 + 1) as u8);
            }
            out.push((start * BLOCK_SIZE as u64, buf));
        }
        out
    }

    proptest! {
        /// The runs cover the requests in order, each run is adjacent
        /// throughout and within the caps, and a run ends only where the
        /// next request is not adjacent or a cap would be passed.
        #[test]
        fn runs_are_the_longest_adjacent_stretches_within_the_caps(
            shape in proptest::collection::vec((0u64..3, 1usize..4), 0..400),
        ) {
            let mut at = 0u64;
            let mut requests_owned = Vec::new();
            for (gap, len) in shape {
                at += gap * BLOCK_SIZE as u64;
                requests_owned.push((at, vec![0u8; len * 512]));
                at += (len * 512) as u64;
            }
            let requests: Vec<(u64, &[u8])> = requests_owned.iter().map(|(o, b)| (*o, &b[..])).collect();
            let runs: Vec<_> = contiguous_runs(&requests).collect();
            let mut next = 0;
            for run in &runs {
                prop_assert_eq!(run.start, next);
                prop_assert!(run.end > run.start);
                next = run.end;
                let bytes: usize = requests[run.clone()].iter().map(|(_, b)| b.len()).sum();
                prop_assert!(run.len() <= MAX_RUN_REQUESTS && (bytes <= MAX_RUN_BYTES || run.len() == 1));
                prop_assert!(requests[run.clone()].windows(2).all(|p| adjacent(&p[0], &p[1])));
                if run.end < requests.len() {
                    let longer = run.len() < MAX_RUN_REQUESTS
                        && bytes + requests[run.end].1.len() <= MAX_RUN_BYTES;
                    prop_assert!(!(longer && adjacent(&requests[run.end - 1], &requests[run.end])), "run {:?} could go on", run);
                }
            }
            prop_assert_eq!(next, requests.len());
        }
    }

    #[test]
    fn what_a_short_transfer_left_is_finished_request_by_request() {
        let lens = [4096usize, 4096, 8192];
        let left = |done| unfinished(lens.iter().copied(), done).collect::<Vec<_>>();
        assert_eq!(left(0), vec![(0, 0), (1, 0), (2, 0)]);
        assert_eq!(left(4096), vec![(1, 0), (2, 0)]);
        assert_eq!(left(5000), vec![(1, 904), (2, 0)]);
        assert_eq!(left(12288), vec![(2, 4096)]);
        assert_eq!(left(16384), vec![]);
    }

    /// Both engines write and read merged runs byte for byte where each
    /// request says, and count a device request per run.
    #[test]
    fn adjacent_requests_go_as_one_and_land_where_each_says() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("device");
        create_file(&path, 8 << 20).unwrap();
        // Runs: 0..3 (three adjacent), 5, 6..8 (adjacent to 5: one run of
        // three), 20 (a gap), then 300 single blocks from 100: cut at 1 MiB.
        let mut starts = vec![(0, 1), (1, 1), (2, 1), (5, 1), (6, 2), (20, 1)];
        starts.extend((100..400).map(|block| (block, 1)));
        let writes = blocks(&starts);
        let requests: Vec<(u64, &[u8])> = writes.iter().map(|(offset, buf)| (*offset, &buf[..])).collect();
        let expected_runs = 1 + 1 + 1 + 300usize.div_ceil(MAX_RUN_BYTES / BLOCK_SIZE);
        for backend in [IoBackend::Pread, IoBackend::Uring] {
            let config = DeviceConfig { backend, direct_io: DirectIo::Fallback, ..DeviceConfig::default() };
            let device = Device::open(&path, &config, true).unwrap();
            let mut queue = match device.queue() {
                Ok(queue) => queue,
                Err(err) if backend == IoBackend::Uring => {
                    eprintln!("skipping io_uring: {err}");
                    continue;
                }
                Err(err) => panic!("{err}"),
            };
            let zeros = AlignedBuf::zeroed(8 << 20);
            queue.write_many(&[(0, &zeros[..])]).unwrap();
            let before = queue.stats().writes;
            queue.write_many(&requests).unwrap();
            assert_eq!(queue.stats().writes - before, expected_runs as u64, "{backend:?}");
            let mut image = AlignedBuf::zeroed(8 << 20);
            queue.read_many(&mut [(0, &mut image[..])]).unwrap();
            let mut model = vec![0u8; 8 << 20];
            for (offset, buf) in &writes {
                model[*offset as usize..*offset as usize + buf.len()].copy_from_slice(buf);
            }
            assert!(image[..] == model[..], "{backend:?}: the device differs from the requests");
            // The same requests read back, merged the same way.
            let mut bufs: Vec<AlignedBuf> = writes.iter().map(|(_, buf)| AlignedBuf::zeroed(buf.len())).collect();
            let mut reads: Vec<(u64, &mut [u8])> =
                writes.iter().zip(bufs.iter_mut()).map(|((offset, _), buf)| (*offset, &mut buf[..])).collect();
            let before = queue.stats().reads;
            queue.read_many(&mut reads).unwrap();
            assert_eq!(queue.stats().reads - before, expected_runs as u64, "{backend:?}");
            for ((offset, written), read) in writes.iter().zip(&bufs) {
                assert!(written[..] == read[..], "{backend:?}: the read at {offset} differs");
            }
        }
    }
}
