//! Fault injection at the device seam: what a real disk does to a store
//! that tests must prove it survives.
//!
//! With [`DeviceFaults`] in its [`DeviceConfig`](crate::DeviceConfig), every
//! I/O queue of a device behaves like a disk with a **volatile write
//! cache**: a write is visible to reads at once but reaches the file only at
//! the next flush, so a process that dies between the two loses it, as a
//! machine that loses power does. With [`DeviceFaults::reordering`] it also
//! writes some of them back early, in any order, as a real cache may: each
//! write request reaches the file at once with probability one half (whole),
//! so a crash leaves a random subset of the unflushed writes behind, and a
//! store that counts on one write landing before another without a flush
//! between them is caught. When such a queue loses power (it is dropped
//! without a write-back, as the simulator's power loss does), each sector
//! still cached lands with probability one half: the cache was destaging
//! when the power went, so writes **tear** at sector boundaries.
//! On top of that, tests (or an operator
//! rehearsing a failure, through the OSD's trigger file) can arm:
//! - **flush EIO**: every flush fails with `EIO`, and the writes it was to
//!   make durable are dropped, as Linux drops dirty pages whose writeback
//!   failed;
//! - **write EIO**: every write fails with `EIO`;
//! - **power cut**: the next flush does not happen; the process is killed
//!   with `SIGKILL` instead, with every unflushed write still in the cache.
//!
//! Never used outside tests and fault rehearsals: the cache costs a copy
//! per write and a map lookup per read sector.

use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::blockio::{AlignedBuf, BlockIo, FlushHandle, IoStats};

/// The unit the cache tracks: the smallest direct I/O any device takes.
const SECTOR: u64 = 512;

/// Faults shared by every queue of one device; armed from any thread.
#[derive(Debug, Default)]
pub struct DeviceFaults {
    flush_eio: AtomicBool,
    write_eio: AtomicBool,
    power_cut: AtomicBool,
    /// Bytes written and not yet flushed, over every queue.
    unflushed: AtomicU64,
    /// Bytes dropped by failed flushes.
    dropped: AtomicU64,
    /// The state of the generator that picks early write-backs (0: none).
    random: AtomicU64,
    /// A queue dropped without a flush writes its cache back (a process
    /// crash: the device keeps power) instead of losing it (a power loss).
    write_back_on_drop: AtomicBool,
    /// In-process power cut: the next flush unwinds with [`PowerCut`].
    unwind_at_flush: AtomicBool,
}

/// The panic payload of an in-process power cut
/// ([`DeviceFaults::cut_power_at_next_flush`]): the caller that catches it
/// drops the store, and with it the device's cache (torn, see above).
#[derive(Debug)]
pub struct PowerCut;

/// A fault that a trigger names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    FlushEio,
    WriteEio,
    /// The process dies (SIGKILL) at the next flush that has device writes
    /// waiting for it, and with them its cache.
    PowerCut,
}

impl Fault {
    /// The fault a trigger word names (`flush-eio`, `write-eio`, `power-cut`).
    pub fn parse(word: &str) -> Option<Fault> {
        match word.trim() {
            "flush-eio" => Some(Fault::FlushEio),
            "write-eio" => Some(Fault::WriteEio),
            "power-cut" => Some(Fault::PowerCut),
            _ => None,
        }
    }
}

impl DeviceFaults {
    /// A cache that writes nothing back before a flush: a crash loses
    /// every unflushed write.
    pub fn new() -> Arc<DeviceFaults> {
        Arc::new(DeviceFaults::default())
    }

    /// A cache that also writes about half of the unflushed writes back
    /// early, chosen by a generator seeded with `seed`.
    pub fn reordering(seed: u64) -> Arc<DeviceFaults> {
        Arc::new(DeviceFaults { random: AtomicU64::new(seed | 1), ..DeviceFaults::default() })
    }

    /// A coin flip (xorshift64: the choice needs no quality, only speed);
    /// always tails without a seed.
    fn coin(&self) -> bool {
        let mut x = self.random.load(Ordering::Relaxed);
        if x == 0 {
            return false;
        }
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.random.store(x, Ordering::Relaxed);
        x & 1 == 1
    }

    /// Arms `fault`; it stays armed for the life of the process.
    pub fn arm(&self, fault: Fault) {
        let flag = match fault {
            Fault::FlushEio => &self.flush_eio,
            Fault::WriteEio => &self.write_eio,
            Fault::PowerCut => &self.power_cut,
        };
        if !flag.swap(true, Ordering::SeqCst) {
            tracing::warn!(?fault, "device fault armed");
        }
    }

    /// What dropping a queue (its partition, its store) without a flush
    /// means from now on: `true`, the process died and the device kept
    /// power, so its cache still reaches the medium; `false` (the default),
    /// the power went and the cache is lost. An in-process simulator
    /// crashes an OSD by dropping its store; a real process dies by signal
    /// and never drops anything.
    pub fn set_write_back_on_drop(&self, write_back: bool) {
        self.write_back_on_drop.store(write_back, Ordering::SeqCst);
    }

    /// An in-process power cut in the middle of a commit, for a simulator
    /// that runs a whole cluster in one process (where the trigger's
    /// `power-cut`, a SIGKILL, would end every node): the next flush writes
    /// nothing back and unwinds with a [`PowerCut`] payload. The caller
    /// catches it (`std::panic::catch_unwind`) and drops the store without
    /// a write-back, so whatever the device had not landed is lost or torn.
    pub fn cut_power_at_next_flush(&self) {
        self.unwind_at_flush.store(true, Ordering::SeqCst);
    }

    /// Disarms an in-process power cut that has not fired.
    pub fn disarm_power_cut(&self) {
        self.unwind_at_flush.store(false, Ordering::SeqCst);
    }

    /// Bytes written to the device's queues and not yet flushed.
    pub fn unflushed_bytes(&self) -> u64 {
        self.unflushed.load(Ordering::Relaxed)
    }

    /// Bytes that failed flushes dropped.
    pub fn dropped_bytes(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Arms the faults named in `trigger` (one word per line, see
    /// [`Fault::parse`]) when the file appears or grows; polled by a thread
    /// every 10 ms for the life of the process. Unknown words are logged
    /// and ignored.
    pub fn watch(self: &Arc<Self>, trigger: PathBuf) -> io::Result<()> {
        let faults = self.clone();
        std::thread::Builder::new().name("device-faults".into()).spawn(move || loop {
            if let Ok(text) = std::fs::read_to_string(&trigger) {
                for word in text.split_whitespace() {
                    match Fault::parse(word) {
                        Some(fault) => faults.arm(fault),
                        None => tracing::warn!(word, path = %trigger.display(), "unknown device fault"),
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        })?;
        Ok(())
    }
}

/// A device's volatile write cache, shared by its queues as a disk's is:
/// a flush through any of them writes back every queue's writes. When the
/// last queue and the device are dropped without a flush, the cache is
/// written back (a process crash) or lost and torn (a power loss), as
/// [`DeviceFaults::set_write_back_on_drop`] says.
pub(crate) struct DeviceCache {
    state: Mutex<CacheState>,
    faults: Arc<DeviceFaults>,
}

/// Unflushed sectors by sector number (newest contents win), and a queue
/// of the device for write-backs.
struct CacheState {
    spare: Box<dyn BlockIo>,
    cache: BTreeMap<u64, Box<[u8]>>,
}

impl DeviceCache {
    pub(crate) fn new(spare: Box<dyn BlockIo>, faults: Arc<DeviceFaults>) -> Arc<DeviceCache> {
        Arc::new(DeviceCache { state: Mutex::new(CacheState { spare, cache: BTreeMap::new() }), faults })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CacheState> {
        // A panic with the lock held is a power cut's unwind: the cache is whole still.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// A flush through the cache, with the armed faults.
    fn flush(&self) -> io::Result<()> {
        let faults = &self.faults;
        // A cut at a flush with nothing to flush would lose nothing (another
        // queue's flush took the writes): the cut waits for one that does.
        if faults.power_cut.load(Ordering::SeqCst) && faults.unflushed_bytes() > 0 {
            tracing::error!(
                unflushed_bytes = faults.unflushed_bytes(),
                "injected power cut: the process dies with its unflushed device writes"
            );
            // SAFETY: kill(2) on this process; SIGKILL cannot be caught, so
            // nothing after it runs and no cache is written back.
            unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
            unreachable!("SIGKILL returned");
        }
        if faults.unwind_at_flush.load(Ordering::SeqCst) {
            std::panic::panic_any(PowerCut);
        }
        let mut state = self.lock();
        if faults.flush_eio.load(Ordering::SeqCst) {
            let lost = state.drop_cache(faults);
            faults.dropped.fetch_add(lost, Ordering::Relaxed);
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        state.write_back()?;
        state.spare.flush()?;
        state.drop_cache(faults);
        Ok(())
    }
}

impl CacheState {
    fn cached_bytes(&self) -> u64 {
        self.cache.len() as u64 * SECTOR
    }

    /// Empties the cache without writing it back; returns the bytes lost.
    fn drop_cache(&mut self, faults: &DeviceFaults) -> u64 {
        let lost = self.cached_bytes();
        self.cache.clear();
        let before = faults.unflushed.fetch_sub(lost, Ordering::Relaxed);
        debug_assert!(before >= lost, "unflushed bytes underflow: {before} - {lost}");
        lost
    }

    /// Writes the cache back in runs of adjacent sectors (one request each,
    /// so no two requests overlap and completion order cannot matter).
    fn write_back(&mut self) -> io::Result<()> {
        let mut runs: Vec<(u64, AlignedBuf)> = Vec::new();
        let mut run: Option<(u64, Vec<u8>)> = None;
        for (sector, bytes) in &self.cache {
            match &mut run {
                Some((start, data)) if start.saturating_add(data.len() as u64 / SECTOR) == *sector => {
                    data.extend_from_slice(bytes)
                }
                _ => {
                    if let Some((start, data)) = run.take() {
                        runs.push((start * SECTOR, AlignedBuf::from_slice(&data)));
                    }
                    run = Some((*sector, bytes.to_vec()));
                }
            }
        }
        if let Some((start, data)) = run {
            runs.push((start * SECTOR, AlignedBuf::from_slice(&data)));
        }
        debug_assert!(
            runs.windows(2).all(|w| w[0].0 + w[0].1.len() as u64 <= w[1].0),
            "write-back runs are sorted and never overlap"
        );
        debug_assert_eq!(runs.iter().map(|(_, buf)| buf.len() as u64).sum::<u64>(), self.cached_bytes());
        let requests: Vec<(u64, &[u8])> = runs.iter().map(|(offset, buf)| (*offset, &buf[..])).collect();
        if !requests.is_empty() {
            self.spare.write_many(&requests)?;
        }
        Ok(())
    }
}

impl Drop for DeviceCache {
    fn drop(&mut self) {
        let faults = self.faults.clone();
        let state = self.state.get_mut().unwrap_or_else(|poisoned| poisoned.into_inner());
        if faults.write_back_on_drop.load(Ordering::SeqCst) {
            if let Err(err) = state.write_back() {
                tracing::warn!(%err, "writing a dropped device's cache back failed");
            }
        } else if faults.random.load(Ordering::Relaxed) != 0 {
            // Power lost mid-destage: a random half of the sectors land.
            let before = state.cached_bytes();
            state.cache.retain(|_, _| faults.coin());
            let lost = before - state.cached_bytes();
            let unflushed = faults.unflushed.fetch_sub(lost, Ordering::Relaxed);
            debug_assert!(unflushed >= lost, "unflushed bytes underflow: {unflushed} - {lost}");
            if let Err(err) = state.write_back() {
                tracing::warn!(%err, "landing a torn part of a dropped device's cache failed");
            }
        }
        state.drop_cache(&faults);
    }
}

/// One queue of a device behind its [`DeviceCache`].
pub(crate) struct FaultyIo {
    inner: Box<dyn BlockIo>,
    cache: Arc<DeviceCache>,
    stats: IoStats,
}

impl FaultyIo {
    pub(crate) fn new(inner: Box<dyn BlockIo>, cache: Arc<DeviceCache>) -> FaultyIo {
        FaultyIo { inner, cache, stats: IoStats::default() }
    }
}

struct FaultyFlush(Arc<DeviceCache>);

impl FlushHandle for FaultyFlush {
    fn flush(&self) -> io::Result<()> {
        self.0.flush()
    }
}

impl BlockIo for FaultyIo {
    fn read_many(&mut self, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let state = self.cache.lock();
        self.inner.read_many(requests)?;
        for (offset, buf) in requests.iter_mut() {
            debug_assert!(offset.is_multiple_of(SECTOR) && (buf.len() as u64).is_multiple_of(SECTOR));
            let first = *offset / SECTOR;
            let last = (*offset + buf.len() as u64).div_ceil(SECTOR);
            for (sector, bytes) in state.cache.range(first..last) {
                debug_assert_eq!(bytes.len() as u64, SECTOR, "the cache holds whole sectors");
                let at = ((sector - first) * SECTOR) as usize;
                buf[at..at + SECTOR as usize].copy_from_slice(bytes);
            }
            self.stats.reads += 1;
            self.stats.submissions += 1;
            self.stats.bytes_read += buf.len() as u64;
        }
        Ok(())
    }

    fn write_many(&mut self, requests: &[(u64, &[u8])]) -> io::Result<()> {
        let faults = self.cache.faults.clone();
        if faults.write_eio.load(Ordering::SeqCst) {
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        let mut state = self.cache.lock();
        let early: Vec<(u64, &[u8])> = requests.iter().filter(|_| faults.coin()).copied().collect();
        if !early.is_empty() {
            self.inner.write_many(&early)?;
        }
        let before = state.cached_bytes();
        for (offset, buf) in requests {
            debug_assert!(offset.is_multiple_of(SECTOR) && (buf.len() as u64).is_multiple_of(SECTOR));
            for (index, chunk) in buf.chunks(SECTOR as usize).enumerate() {
                state.cache.insert(offset / SECTOR + index as u64, chunk.into());
            }
            self.stats.writes += 1;
            self.stats.submissions += 1;
            self.stats.bytes_written += buf.len() as u64;
        }
        // Counted under the lock: a flush on another thread subtracts what
        // it drops, and must never find it not yet added.
        faults.unflushed.fetch_add(state.cached_bytes() - before, Ordering::Relaxed);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stats.flushes += 1;
        self.cache.flush()
    }

    fn flush_handle(&self) -> Arc<dyn FlushHandle> {
        Arc::new(FaultyFlush(self.cache.clone()))
    }

    fn stats(&self) -> IoStats {
        self.stats
    }

    fn engine(&self) -> &'static str {
        self.inner.engine()
    }
}
