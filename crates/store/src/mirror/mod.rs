//! A store on a mirrored pair of devices (issue 28; the thesis behind it:
//! ../shared/papers/001, §3.3). Both devices take every write. In
//! `read-flush-split` mode only the **flush device** is flushed when a
//! commit needs durability, and reads go to the **read device**, which has
//! every write (in its volatile cache at worst) and so never holds a read
//! behind a flush, which on a disk without power-loss protection takes
//! milliseconds. In `plain` mode both are flushed and reads go to either.
//!
//! **What makes it recoverable.** After a crash or a power loss the
//! devices may differ wherever writes were in flight or not yet flushed
//! (the read device is flushed rarely; either may hold torn blocks). A
//! persistent dirty-region bitmap names those places, as md RAID1's
//! write-intent bitmap does, so that mount resyncs only them (copies them
//! from the flush device, which holds every durable write), never the
//! whole device:
//! - a write to a region whose bit is not on disk waits until the bitmap
//!   page that sets it is written and flushed (on the flush device; on
//!   both in `plain` mode): no write reaches either device unmarked;
//! - now and then (`clean_interval`) both devices are flushed, and the
//!   bits of regions no write touched since the clean before clear
//!   ([`regions::Regions`]). A region written in every interval keeps its
//!   bit, so under steady load the bitmap costs no writes at all; reads
//!   go to the flush device while the read device flushes.
//!
//! Flagging before writing costs a flush when a write finds its region
//! clean; the thesis's alternative (deferring the read device's copy past
//! the flush) was tried first and is wrong: the flush device can land an
//! unflushed write while the bitmap page written beside it is lost, and
//! the devices then differ where no bit says so (tests/mirror.rs found it).
//!
//! **Failures.** A device that fails a read, a write or a flush is marked
//! failed in the other's header and the store goes on on the survivor
//! (degraded: [`Mirror::status`]); the store fails only when both have.

pub mod header;
pub(crate) mod io;
pub mod rebuild;
pub(crate) mod regions;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

pub use header::{Health, MirrorHeader, MirrorLayout, MirrorMode};

use crate::blockio::{AlignedBuf, BlockIo, FlushHandle};
use crate::device::{Device, DeviceConfig};
use crate::error::{Result, StoreError};
use crate::faults::DeviceFaults;
use crate::BLOCK_SIZE;
use regions::Regions;

/// Regions of 1 MiB: a resync after a crash copies the regions written in
/// the last clean interval or two, and under random writes a region's bit,
/// once set, stays set until the next clean (one bitmap page write).
pub const DEFAULT_REGION_BYTES: u64 = 1 << 20;
/// md's default bitmap flush interval: a read device flush every 5 s.
pub const DEFAULT_CLEAN_INTERVAL: Duration = Duration::from_secs(5);
/// The roles swap when the flush device's flushes take this many times
/// the read device's (their moving averages; [`slow_flushes`])...
pub const SWAP_RATIO: u64 = 4;
/// ...and more than this (a fast pair's noise never swaps it)...
pub const SWAP_FLOOR: Duration = Duration::from_millis(2);
/// ...at most once in this long.
pub const SWAP_HOLD: Duration = Duration::from_secs(60);

/// The documented rule for a swap on a degrading device: the flush
/// device's flushes average more than [`SWAP_RATIO`] times the read
/// device's and more than [`SWAP_FLOOR`]. The read device is flushed only
/// by cleans, with an interval's writes behind each, so a healthy pair
/// never meets it; a flush device that has turned slow (a worn or failing
/// disk whose flushes crawl) does, and then takes the reads, which no
/// flush holds up, while the faster one takes the flushes.
pub fn slow_flushes(flush_micros: u64, read_micros: u64) -> bool {
    flush_micros > SWAP_RATIO * read_micros && flush_micros > SWAP_FLOOR.as_micros() as u64
}

/// A store's second device and how the pair is used.
#[derive(Clone, Debug)]
pub struct MirrorConfig {
    /// The second device (the store's path is the first, slot 0).
    pub second: PathBuf,
    pub mode: MirrorMode,
    /// Bytes per dirty region when the mirror is made (a power of two ≥ 4 KiB).
    pub region_bytes: u64,
    /// How often the read device is flushed so that clean regions' bits clear.
    pub clean_interval: Duration,
    /// The slot (0: the store's path, 1: `second`) to flush; the roles
    /// swap at mount if they differ. None keeps them.
    pub flush_slot: Option<u8>,
    /// Tests: each device's own faults (else the device config's).
    pub faults: [Option<Arc<DeviceFaults>>; 2],
    /// After the resync at mount, compare the two devices whole and copy
    /// the flush device's block over any that differs (md's check and
    /// repair): slow (reads both devices), for tests and for an operator
    /// who doubts a pair after a crash.
    pub check_at_mount: bool,
    /// Swap the roles when the flush device turns slow ([`slow_flushes`]).
    pub auto_swap: bool,
    /// Benchmarks and tests: each device's own flush model (else the device config's).
    pub stalls: [Option<Duration>; 2],
}

impl MirrorConfig {
    pub fn new(second: PathBuf, mode: MirrorMode) -> MirrorConfig {
        MirrorConfig {
            second,
            mode,
            region_bytes: DEFAULT_REGION_BYTES,
            clean_interval: DEFAULT_CLEAN_INTERVAL,
            flush_slot: None,
            faults: [None, None],
            check_at_mount: false,
            auto_swap: true,
            stalls: [None, None],
        }
    }
}

/// What an operator sees of a mirror.
#[derive(Clone, Debug, serde::Serialize)]
pub struct MirrorStatus {
    pub mode: MirrorMode,
    pub paths: [PathBuf; 2],
    pub flush_slot: u8,
    pub health: [Health; 2],
    /// Regions whose bit is set now.
    pub dirty_regions: u64,
    pub region_bytes: u64,
    /// The bytes the store uses on each device, from offset 0 (the
    /// mirror's own blocks lie past them).
    pub store_bytes: u64,
    /// What mount copied to bring the devices together.
    pub resynced_regions: u64,
    pub resync_micros: u64,
    pub reads: [u64; 2],
    /// Reads sent to the flush device because the read device was flushing.
    pub reads_redirected: u64,
    pub cleans: u64,
    pub cleared_regions: u64,
    /// Role swaps on a slow flush device since start.
    pub swaps: u64,
    /// Moving averages of each device's flushes (µs; 0 before the first).
    pub flush_micros: [u64; 2],
    /// Blocks read from the other device after failing their checksum, and rewritten.
    pub repaired_blocks: u64,
    /// A replaced device being filled, and how far.
    pub rebuild: Option<rebuild::RebuildStatus>,
}

impl MirrorStatus {
    /// Whether the store runs on one device only.
    pub fn degraded(&self) -> bool {
        self.health.iter().any(|h| *h != Health::InSync)
    }
}

/// Where an I/O goes now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Route {
    Split {
        flush: usize,
        read: usize,
    },
    Both,
    Single(usize),
    /// `target` is being filled from `survivor` ([`rebuild`]): writes go to
    /// both, reads and commit flushes to the survivor.
    Rebuilding {
        survivor: usize,
        target: usize,
    },
}

struct State {
    flush_slot: usize,
    health: [Health; 2],
    generation: u64,
    /// Each slot's device, as the headers name it.
    members: [[u8; 16]; 2],
    regions: Regions,
    last_clean: Instant,
    last_swap: Option<Instant>,
    /// While one device is filled from the other, or the store runs on one
    /// alone: which regions' writes are under way ([`rebuild::Barrier`]).
    barrier: rebuild::Barrier,
}

/// The pair, shared by every queue of the store (`io::MirrorIo`).
pub struct Mirror {
    /// A failed side is replaced whole ([`Mirror::replace`]); every queue
    /// opens the new one when it sees `replaced` move.
    sides: RwLock<[Arc<Device>; 2]>,
    /// Each device's flush, for commits and cleans (replaced with its side).
    flushers: RwLock<[Arc<dyn FlushHandle>; 2]>,
    replaced: AtomicU64,
    id: [u8; 16],
    mode: MirrorMode,
    layout: MirrorLayout,
    clean_interval: Duration,
    /// Lock order: `meta`, then `sides`/`flushers`, then `state`; nothing
    /// takes `sides` or `flushers` while holding `state` (a replacement
    /// holds the first two while it takes `state`).
    state: Mutex<State>,
    /// Signalled when the barrier changes (a write or a region copy ended).
    barrier_changed: Condvar,
    /// Flushes under way, per device: reads keep off a device while it flushes.
    flushing: [AtomicU32; 2],
    cleaning: AtomicBool,
    /// Metadata writes (bitmap pages, headers), one at a time and in order:
    /// two in flight to one page could land in either order.
    meta: Mutex<[Box<dyn BlockIo>; 2]>,
    counters: Counters,
    resynced: (u64, u64),
    writable: bool,
    auto_swap: bool,
    /// The store is closing: a rebuild under way stops.
    stopping: AtomicBool,
    /// The rebuild's copier thread, joined when the store closes.
    copier: Mutex<Option<std::thread::JoinHandle<()>>>,
}

#[derive(Default)]
struct Counters {
    reads: [AtomicU64; 2],
    reads_redirected: AtomicU64,
    cleans: AtomicU64,
    cleared_regions: AtomicU64,
    repaired_blocks: AtomicU64,
    swaps: AtomicU64,
    /// Each device's flushes, a moving average (1/8 of each new one), µs.
    flush_micros: [AtomicU64; 2],
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Poisoned only by a panic in another queue's I/O (a simulated power
    // cut unwinds): the state itself is whole.
    mutex.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn side_config(config: &DeviceConfig, mirror: &MirrorConfig, slot: usize) -> DeviceConfig {
    DeviceConfig {
        faults: mirror.faults[slot].clone().or_else(|| config.faults.clone()),
        flush_stall: mirror.stalls[slot].or(config.flush_stall),
        ..config.clone()
    }
}

fn open_sides(first: &Path, mirror: &MirrorConfig, config: &DeviceConfig, writable: bool) -> Result<[Device; 2]> {
    let a = Device::open(first, &side_config(config, mirror, 0), writable)?;
    let b = Device::open(&mirror.second, &side_config(config, mirror, 1), writable)?;
    Ok([a, b])
}

/// Whether a device that failed to open is gone or broken (the mirror
/// then starts on the other: md's degraded start), rather than misnamed
/// or in use by another process (the mount fails: nothing is marked).
fn gone_or_broken(err: &StoreError) -> bool {
    match err {
        StoreError::Io { source, .. } => {
            source.kind() == std::io::ErrorKind::NotFound
                || matches!(source.raw_os_error(), Some(libc::EIO | libc::ENXIO | libc::ENODEV | libc::ENOMEDIUM))
        }
        _ => false,
    }
}

/// Both sides for a mount: a side that is gone or broken is stood in for
/// ([`Device::absent`]) with the reason, if the other opens.
fn open_sides_at_mount(
    first: &Path,
    mirror: &MirrorConfig,
    config: &DeviceConfig,
    writable: bool,
) -> Result<([Device; 2], [Option<String>; 2])> {
    let paths = [first, mirror.second.as_path()];
    let opened = [0, 1].map(|slot| Device::open(paths[slot], &side_config(config, mirror, slot), writable));
    match opened {
        [Ok(a), Ok(b)] => Ok(([a, b], [None, None])),
        [Ok(a), Err(err)] if gone_or_broken(&err) => {
            Ok(([a, Device::absent(paths[1])?], [None, Some(err.to_string())]))
        }
        [Err(err), Ok(b)] if gone_or_broken(&err) => {
            Ok(([Device::absent(paths[0])?, b], [Some(err.to_string()), None]))
        }
        [Err(err), _] | [_, Err(err)] => Err(err),
    }
}

/// A random name for a device joining a mirror.
pub(crate) fn new_member_id() -> Result<[u8; 16]> {
    let mut id = [0u8; 16];
    crate::store::fill_random(&mut id)?;
    Ok(id)
}

fn io_error(context: String) -> impl FnOnce(std::io::Error) -> StoreError {
    move |err| StoreError::io(context, err)
}

impl Mirror {
    /// Makes a new mirror on `first` and `config.second`: fresh headers,
    /// a clear bitmap. Whatever the devices held is lost (mkfs).
    pub fn make(first: &Path, config: &MirrorConfig, device: &DeviceConfig) -> Result<Mirror> {
        let sides = open_sides(first, config, device, true)?;
        let smaller = sides[0].size_bytes().min(sides[1].size_bytes());
        let layout = MirrorLayout::plan(smaller, config.region_bytes)?;
        assert!(
            layout.store_bytes + (layout.bitmap_blocks + 1) * BLOCK_SIZE as u64 <= smaller,
            "{layout:?} outgrows the devices"
        );
        let mut id = [0u8; 16];
        crate::store::fill_random(&mut id)?;
        let flush_slot = config.flush_slot.unwrap_or(0) as usize;
        let health = [Health::InSync; 2];
        let members = [new_member_id()?, new_member_id()?];
        let mirror = Mirror::assemble(sides, config, id, layout, flush_slot, health, 0, members, (0, 0))?;
        {
            let mut meta = lock(&mirror.meta);
            let zeros = AlignedBuf::zeroed(BLOCK_SIZE);
            for queue in meta.iter_mut() {
                let pages: Vec<(u64, &[u8])> =
                    (0..layout.bitmap_blocks).map(|page| (layout.page_offset(page), &zeros[..])).collect();
                for batch in pages.chunks(256) {
                    queue.write_many(batch).map_err(io_error("clearing a mirror's bitmap".into()))?;
                }
            }
        }
        mirror.write_headers()?;
        Ok(mirror)
    }

    /// Opens the mirror on `first` and `config.second`: reads both
    /// headers, resyncs the regions the flush device's bitmap names, and
    /// applies the configured mode and roles.
    pub fn open(first: &Path, config: &MirrorConfig, device: &DeviceConfig, writable: bool) -> Result<Mirror> {
        let (sides, absent) = open_sides_at_mount(first, config, device, writable)?;
        let mut headers: [Option<MirrorHeader>; 2] = [None, None];
        let mut unreadable: [Option<String>; 2] = absent.clone();
        for (slot, side) in sides.iter().enumerate() {
            if absent[slot].is_some() {
                continue;
            }
            let mut block = AlignedBuf::zeroed(BLOCK_SIZE);
            let at = MirrorLayout::header_offset(side.size_bytes());
            side.queue()?
                .read_many(&mut [(at, &mut block[..])])
                .map_err(io_error(format!("reading the mirror header of {}", side.path().display())))?;
            match MirrorHeader::decode(&block) {
                Ok(Some(header)) if header.slot as usize != slot => {
                    return Err(StoreError::invalid(format!(
                        "{} is device {} of its mirror, named here as device {slot}: give the devices in their order",
                        side.path().display(),
                        header.slot
                    )));
                }
                Ok(Some(header)) => headers[slot] = Some(header),
                Ok(None) => unreadable[slot] = Some("it holds no mirror header".into()),
                Err(err) => unreadable[slot] = Some(err.to_string()),
            }
        }
        // The newer header knows of a failure (or a replacement) the older device missed.
        let newest = headers.iter().flatten().max_by_key(|h| h.generation).cloned().ok_or_else(|| {
            StoreError::invalid(format!(
                "neither {} nor {} holds a mirror header: was the store made on this pair (mkfs with two devices)?",
                sides[0].path().display(),
                sides[1].path().display()
            ))
        })?;
        let mut health = newest.health;
        for slot in 0..2 {
            let path = sides[slot].path().display();
            match (&headers[slot], &unreadable[slot]) {
                (Some(header), _) if header.id != newest.id => {
                    return Err(StoreError::invalid(format!(
                        "{} and {} belong to different mirrors",
                        sides[0].path().display(),
                        sides[1].path().display()
                    )));
                }
                (Some(header), _)
                    if newest.members[slot] != [0; 16] && header.members[slot] != newest.members[slot] =>
                {
                    return Err(StoreError::invalid(format!(
                        "{path} was device {slot} of this mirror until another device was put in its place: it is \
                         stale; name the device that replaced it"
                    )));
                }
                (None, Some(why)) if absent[slot].is_some() => {
                    if newest.health[slot] == Health::InSync {
                        tracing::error!(
                            device = %path,
                            why,
                            "a mirror device cannot be opened: the store starts on the other alone (degraded); replace it"
                        );
                    }
                    health[slot] = Health::Failed;
                }
                (None, Some(why)) if newest.health[slot] == Health::InSync => {
                    return Err(StoreError::invalid(format!(
                        "{path}: {why}, yet the mirror has it in sync: was the store made on this pair (mkfs with two devices)?"
                    )));
                }
                (None, Some(why)) => {
                    // Out already, and perhaps never filled (a replacement
                    // cut short before its header was written).
                    tracing::warn!(device = %path, why, "a mirror device out of sync has no header");
                    health[slot] = Health::Failed;
                }
                _ => {}
            }
        }
        let layout = newest.layout;
        for side in sides.iter().zip(&absent).filter(|(_, absent)| absent.is_none()).map(|(side, _)| side) {
            if side.size_bytes() < layout.meta_start + (layout.bitmap_blocks + 1) * BLOCK_SIZE as u64 {
                return Err(StoreError::corrupt(format!("{} is smaller than its mirror", side.path().display())));
            }
        }
        // A device mid-rebuild is filled again from the start: out until then.
        let health = health.map(|h| if h == Health::Rebuilding { Health::Failed } else { h });
        if !health.contains(&Health::InSync) {
            return Err(StoreError::invalid(format!(
                "both devices of the mirror are out ({} and {}): the store cannot start",
                sides[0].path().display(),
                sides[1].path().display()
            )));
        }
        // The survivor flushes, whichever it is.
        let flush_slot = match newest.flush_slot as usize {
            slot if health[slot] == Health::InSync => slot,
            slot => 1 - slot,
        };
        let started = Instant::now();
        let resynced = if health == [Health::InSync; 2] && writable {
            resync(&sides, &layout, flush_slot, config.mode)?
        } else {
            0
        };
        let resync_micros = started.elapsed().as_micros() as u64;
        if config.check_at_mount && health == [Health::InSync; 2] && writable {
            let differing = check(&sides, &layout, flush_slot)?;
            if differing > 0 {
                tracing::error!(
                    blocks = differing,
                    "mirror check: blocks differed between the devices after the resync; copied from the flush device"
                );
            } else {
                tracing::warn!("mirror check: the devices are identical after the resync");
            }
        }
        let flush_slot = match config.flush_slot {
            // A swap needs both in sync: just resynced, with no bit set.
            Some(slot) if health == [Health::InSync; 2] => slot as usize,
            _ => flush_slot,
        };
        // A mirror made before headers named their members gets names now
        // (both devices are the right ones: they were just opened as such).
        let mut members = newest.members;
        for member in members.iter_mut().filter(|m| **m == [0; 16]) {
            *member = new_member_id()?;
        }
        let mut mirror = Mirror::assemble(
            sides,
            config,
            newest.id,
            layout,
            flush_slot,
            health,
            newest.generation,
            members,
            (resynced, resync_micros),
        )?;
        mirror.writable = writable;
        if health != [Health::InSync; 2] {
            let failed = health.iter().position(|h| *h != Health::InSync).expect("one is out");
            tracing::error!(
                device = %mirror.path(failed).display(),
                "a mirror device is failed: the store runs on the other alone (degraded); replace it"
            );
        } else if resynced > 0 {
            tracing::warn!(regions = resynced, micros = resync_micros, "resynced a mirror's dirty regions");
        }
        if writable {
            mirror.write_headers()?;
        }
        Ok(mirror)
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        sides: [Device; 2],
        config: &MirrorConfig,
        id: [u8; 16],
        layout: MirrorLayout,
        flush_slot: usize,
        health: [Health; 2],
        generation: u64,
        members: [[u8; 16]; 2],
        resynced: (u64, u64),
    ) -> Result<Mirror> {
        let meta = [sides[0].queue()?, sides[1].queue()?];
        let flushers = [meta[0].flush_handle(), meta[1].flush_handle()];
        let [a, b] = sides;
        Ok(Mirror {
            sides: RwLock::new([Arc::new(a), Arc::new(b)]),
            flushers: RwLock::new(flushers),
            replaced: AtomicU64::new(0),
            id,
            mode: config.mode,
            layout,
            clean_interval: config.clean_interval,
            state: Mutex::new(State {
                flush_slot,
                health,
                generation,
                members,
                regions: Regions::new(layout.regions),
                last_clean: Instant::now(),
                last_swap: None,
                barrier: Default::default(),
            }),
            barrier_changed: Condvar::new(),
            flushing: [AtomicU32::new(0), AtomicU32::new(0)],
            cleaning: AtomicBool::new(false),
            meta: Mutex::new(meta),
            counters: Counters::default(),
            resynced,
            writable: true,
            auto_swap: config.auto_swap,
            stopping: AtomicBool::new(false),
            copier: Mutex::new(None),
        })
    }

    pub fn layout(&self) -> &MirrorLayout {
        &self.layout
    }

    /// The device in `slot` now.
    pub(crate) fn side(&self, slot: usize) -> Arc<Device> {
        self.sides.read().unwrap_or_else(|poisoned| poisoned.into_inner())[slot].clone()
    }

    pub fn path(&self, slot: usize) -> PathBuf {
        self.side(slot).path().to_path_buf()
    }

    /// `slot`'s flush.
    pub(crate) fn flusher(&self, slot: usize) -> Arc<dyn FlushHandle> {
        self.flushers.read().unwrap_or_else(|poisoned| poisoned.into_inner())[slot].clone()
    }

    /// Moves whenever a side is replaced: queues compare it with theirs.
    pub(crate) fn replaced(&self) -> u64 {
        self.replaced.load(Ordering::Acquire)
    }

    pub(crate) fn route(&self) -> Route {
        let state = lock(&self.state);
        debug_assert_eq!(state.health[state.flush_slot], Health::InSync, "the flush device is out");
        debug_assert!(state.health.contains(&Health::InSync), "a mirror with no device left routes nothing");
        match state.health {
            [Health::InSync, Health::InSync] => match self.mode {
                MirrorMode::ReadFlushSplit => Route::Split { flush: state.flush_slot, read: 1 - state.flush_slot },
                MirrorMode::Plain => Route::Both,
            },
            [Health::InSync, Health::Rebuilding] => Route::Rebuilding { survivor: 0, target: 1 },
            [Health::Rebuilding, Health::InSync] => Route::Rebuilding { survivor: 1, target: 0 },
            [Health::InSync, _] => Route::Single(0),
            _ => Route::Single(1),
        }
    }

    pub(crate) fn is_flushing(&self, slot: usize) -> bool {
        self.flushing[slot].load(Ordering::Acquire) > 0
    }

    /// Runs `flush` with `slot` marked flushing.
    pub(crate) fn flushing<T>(&self, slot: usize, flush: impl FnOnce() -> T) -> T {
        self.flushing[slot].fetch_add(1, Ordering::AcqRel);
        let started = Instant::now();
        let result = flush();
        let took = started.elapsed().as_micros() as u64;
        self.flushing[slot].fetch_sub(1, Ordering::AcqRel);
        // Racy read-modify-write: a lost sample moves an average by an eighth, no more.
        let average = &self.counters.flush_micros[slot];
        let old = average.load(Ordering::Relaxed);
        average.store(if old == 0 { took } else { old - old / 8 + took / 8 }, Ordering::Relaxed);
        result
    }

    pub(crate) fn count_read(&self, slot: usize, redirected: bool) {
        self.counters.reads[slot].fetch_add(1, Ordering::Relaxed);
        if redirected {
            self.counters.reads_redirected.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn count_repair(&self) {
        self.counters.repaired_blocks.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn healthy(&self, slot: usize) -> bool {
        lock(&self.state).health[slot] == Health::InSync
    }

    /// Marks the regions of `requests` dirty before the writes go out; if
    /// a bit is not on disk yet, writes and flushes the bitmap first.
    pub(crate) fn mark(&self, requests: &[(u64, &[u8])]) -> std::io::Result<()> {
        let on_disk = lock(&self.state).regions.write(self.regions_of(requests));
        if on_disk {
            return Ok(());
        }
        self.write_bitmap(true)
    }

    pub(crate) fn regions_of<'a>(&'a self, requests: &'a [(u64, &[u8])]) -> impl Iterator<Item = u64> + Clone + 'a {
        requests.iter().flat_map(|(offset, buf)| self.layout.regions_of(*offset, buf.len() as u64))
    }

    /// Writes to these regions completed (a clean under way must not
    /// clear them: its flush may have begun before they landed).
    pub(crate) fn touched(&self, requests: &[(u64, &[u8])]) {
        lock(&self.state).regions.touch(self.regions_of(requests));
    }

    /// Writes the bitmap pages that differ from disk to the devices that
    /// keep a bitmap (the flush device; both in `plain` mode).
    fn write_bitmap(&self, flush: bool) -> std::io::Result<()> {
        let mut meta = lock(&self.meta);
        let (pages, targets) = {
            let mut state = lock(&self.state);
            let targets: Vec<usize> = match (self.mode, state.health) {
                (MirrorMode::ReadFlushSplit, [Health::InSync, Health::InSync]) => vec![state.flush_slot],
                (MirrorMode::Plain, [Health::InSync, Health::InSync]) => vec![0, 1],
                // One device: nothing can differ.
                _ => vec![],
            };
            (state.regions.pages_to_write(), targets)
        };
        if pages.is_empty() {
            return Ok(());
        }
        debug_assert!(pages.iter().all(|(page, image)| *page < self.layout.bitmap_blocks && image.len() == BLOCK_SIZE));
        let images: Vec<(u64, AlignedBuf)> =
            pages.iter().map(|(page, image)| (self.layout.page_offset(*page), AlignedBuf::from_slice(image))).collect();
        let requests: Vec<(u64, &[u8])> = images.iter().map(|(offset, buf)| (*offset, &buf[..])).collect();
        for slot in targets {
            let written =
                meta[slot].write_many(&requests).and_then(|()| if flush { meta[slot].flush() } else { Ok(()) });
            if let Err(err) = written {
                drop(meta);
                self.fail(slot, &err)?;
                return self.write_bitmap(flush);
            }
        }
        lock(&self.state).regions.written(&pages);
        Ok(())
    }

    /// Now and then a flush of both devices (the read device first), after
    /// which the bits of regions untouched since the last clean clear.
    pub(crate) fn maybe_clean(&self) -> std::io::Result<()> {
        let targets: Vec<usize> = match self.route() {
            Route::Split { read, flush } => vec![read, flush],
            Route::Both => vec![0, 1],
            Route::Single(_) | Route::Rebuilding { .. } => return Ok(()),
        };
        {
            let state = lock(&self.state);
            if state.last_clean.elapsed() < self.clean_interval || self.cleaning.swap(true, Ordering::AcqRel) {
                return Ok(());
            }
        }
        let mut failed = None;
        for slot in targets {
            let flusher = self.flusher(slot);
            if let Err(err) = self.flushing(slot, || flusher.flush()) {
                failed = Some((slot, err));
                break;
            }
        }
        let result = match failed {
            Some((slot, err)) => self.fail(slot, &err),
            None => {
                let cleared = {
                    let mut state = lock(&self.state);
                    state.last_clean = Instant::now();
                    state.regions.clean()
                };
                self.counters.cleans.fetch_add(1, Ordering::Relaxed);
                self.counters.cleared_regions.fetch_add(cleared, Ordering::Relaxed);
                // Clears need no flush: a bit left set costs a resync's copy, no more.
                if cleared > 0 {
                    self.write_bitmap(false).and_then(|()| self.maybe_swap())
                } else {
                    self.maybe_swap()
                }
            }
        };
        self.cleaning.store(false, Ordering::Release);
        result
    }

    /// After a clean: swaps the roles if the flush device turned slow.
    fn maybe_swap(&self) -> std::io::Result<()> {
        let Route::Split { flush, read } = self.route() else { return Ok(()) };
        if !self.auto_swap {
            return Ok(());
        }
        let average = |slot: usize| self.counters.flush_micros[slot].load(Ordering::Relaxed);
        let (flush_micros, read_micros) = (average(flush), average(read));
        if read_micros == 0 || !slow_flushes(flush_micros, read_micros) {
            return Ok(());
        }
        if lock(&self.state).last_swap.is_some_and(|at| at.elapsed() < SWAP_HOLD) {
            return Ok(());
        }
        tracing::warn!(
            slow = %self.path(flush).display(),
            flush_micros,
            other = %self.path(read).display(),
            read_micros,
            "the mirror's flush device flushes slowly: the roles swap (it takes the reads now)"
        );
        self.swap_roles()
    }

    /// Makes the read device the flush device: the whole bitmap is
    /// written and flushed to it first (writes under way marked their
    /// bits on the old one only), then the roles change, then the headers.
    fn swap_roles(&self) -> std::io::Result<()> {
        let mut meta = lock(&self.meta);
        let (new_flush, pages) = {
            let mut state = lock(&self.state);
            (1 - state.flush_slot, state.regions.every_page())
        };
        let images: Vec<(u64, AlignedBuf)> =
            pages.iter().map(|(page, image)| (self.layout.page_offset(*page), AlignedBuf::from_slice(image))).collect();
        let requests: Vec<(u64, &[u8])> = images.iter().map(|(offset, buf)| (*offset, &buf[..])).collect();
        if let Err(err) = meta[new_flush].write_many(&requests).and_then(|()| meta[new_flush].flush()) {
            drop(meta);
            return self.fail(new_flush, &err);
        }
        {
            let mut state = lock(&self.state);
            debug_assert_eq!(state.health, [Health::InSync; 2], "a swap with a device out");
            state.regions.written(&pages);
            state.flush_slot = new_flush;
            state.last_swap = Some(Instant::now());
        }
        drop(meta);
        self.counters.swaps.fetch_add(1, Ordering::Relaxed);
        self.write_headers().map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// `slot` failed with `err`: the store goes on on the other device, or
    /// fails with the error if that is out too.
    pub(crate) fn fail(&self, slot: usize, err: &std::io::Error) -> std::io::Result<()> {
        {
            let mut state = lock(&self.state);
            match state.health[slot] {
                Health::Failed => return Ok(()),
                Health::Rebuilding => {
                    // The copy stops; the survivor goes on alone, as before it began.
                    state.health[slot] = Health::Failed;
                    drop(state);
                    self.barrier_changed.notify_all();
                    tracing::error!(
                        device = %self.path(slot).display(),
                        error = %err,
                        "the mirror device being rebuilt failed: the rebuild stops; replace it again"
                    );
                    return self.write_headers().map_err(|e| std::io::Error::other(e.to_string()));
                }
                Health::InSync => {}
            }
            if state.health[1 - slot] != Health::InSync {
                return Err(std::io::Error::new(err.kind(), format!("both devices of the mirror failed: {err}")));
            }
            state.health[slot] = Health::Failed;
            state.flush_slot = 1 - slot;
            debug_assert_eq!(state.health[state.flush_slot], Health::InSync, "the survivor flushes");
        }
        tracing::error!(
            device = %self.path(slot).display(),
            error = %err,
            "a mirror device failed: the store goes on on the other alone (degraded); replace the failed one"
        );
        self.write_headers().map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// Writes both headers (to each device not failed: one being rebuilt
    /// gets one, so that it is known as this mirror's), each flushed.
    fn write_headers(&self) -> Result<()> {
        let mut meta = lock(&self.meta);
        let (flush_slot, health, generation, members) = {
            let mut state = lock(&self.state);
            state.generation += 1;
            (state.flush_slot, state.health, state.generation, state.members)
        };
        for slot in 0..2 {
            if health[slot] == Health::Failed {
                continue;
            }
            let header = MirrorHeader {
                id: self.id,
                slot: slot as u8,
                mode: self.mode,
                flush_slot: flush_slot as u8,
                health,
                generation,
                layout: self.layout,
                members,
            };
            let block = AlignedBuf::from_slice(&header.encode());
            let at = MirrorLayout::header_offset(self.side(slot).size_bytes());
            meta[slot]
                .write_many(&[(at, &block[..])])
                .and_then(|()| meta[slot].flush())
                .map_err(io_error(format!("writing the mirror header of {}", self.path(slot).display())))?;
        }
        Ok(())
    }

    /// A clean stop: both devices flushed and every bit cleared, so that
    /// the next mount resyncs nothing ([`crate::Store::close`] calls it).
    pub fn close(&self) -> Result<()> {
        self.stop_rebuild();
        if !self.writable || matches!(self.route(), Route::Single(_) | Route::Rebuilding { .. }) {
            return Ok(());
        }
        let mut meta = lock(&self.meta);
        for (slot, queue) in meta.iter_mut().enumerate() {
            queue.flush().map_err(io_error(format!("flushing {}", self.path(slot).display())))?;
        }
        {
            let mut state = lock(&self.state);
            // Flushed, both, with no write in flight: every region is alike.
            state.regions.clear_all();
        }
        drop(meta);
        self.write_bitmap(true).map_err(|e| StoreError::io("clearing a mirror's bitmap", e))
    }

    pub fn status(&self) -> MirrorStatus {
        // Before the state lock: a replacement takes the sides' lock, then
        // the state's (`rebuild.rs`), and the other order would deadlock.
        let paths = [self.path(0), self.path(1)];
        let state = lock(&self.state);
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        MirrorStatus {
            mode: self.mode,
            paths,
            flush_slot: state.flush_slot as u8,
            health: state.health,
            dirty_regions: state.regions.dirty_count(),
            region_bytes: self.layout.region_bytes,
            store_bytes: self.layout.store_bytes,
            resynced_regions: self.resynced.0,
            resync_micros: self.resynced.1,
            reads: [load(&self.counters.reads[0]), load(&self.counters.reads[1])],
            reads_redirected: load(&self.counters.reads_redirected),
            cleans: load(&self.counters.cleans),
            cleared_regions: load(&self.counters.cleared_regions),
            repaired_blocks: load(&self.counters.repaired_blocks),
            swaps: load(&self.counters.swaps),
            flush_micros: [load(&self.counters.flush_micros[0]), load(&self.counters.flush_micros[1])],
            rebuild: state.barrier.progress.filter(|(device, _)| state.health[*device] == Health::Rebuilding).map(
                |(device, next)| rebuild::RebuildStatus {
                    device: device as u8,
                    regions_copied: next,
                    regions: self.layout.regions,
                },
            ),
        }
    }
}

/// Copies the regions the bitmap names from the flush device to the other,
/// flushes it, then clears the bitmap; the regions copied.
fn resync(sides: &[Device; 2], layout: &MirrorLayout, flush_slot: usize, mode: MirrorMode) -> Result<u64> {
    let mut queues = [sides[0].queue()?, sides[1].queue()?];
    let bitmap_bytes = (layout.bitmap_blocks as usize) * BLOCK_SIZE;
    let mut dirty = Regions::new(layout.regions);
    // Plain mode writes the bitmap to both: either names every region; take both.
    let keepers: Vec<usize> = match mode {
        MirrorMode::ReadFlushSplit => vec![flush_slot],
        MirrorMode::Plain => vec![0, 1],
    };
    let mut union: Vec<u8> = vec![0; bitmap_bytes];
    for &slot in &keepers {
        let mut bitmap = AlignedBuf::zeroed(bitmap_bytes);
        queues[slot]
            .read_many(&mut [(layout.meta_start, &mut bitmap[..])])
            .map_err(io_error("reading a mirror's bitmap".into()))?;
        union.iter_mut().zip(bitmap.iter()).for_each(|(u, b)| *u |= b);
    }
    dirty.load(&union);
    let regions = dirty.dirty_regions();
    let (from, to) = (flush_slot, 1 - flush_slot);
    let mut buf = AlignedBuf::zeroed(layout.region_bytes.min(4 << 20) as usize);
    for &region in &regions {
        assert!(region < layout.regions, "a dirty region {region} past the {} the mirror has", layout.regions);
        let start = region * layout.region_bytes;
        let end = (start + layout.region_bytes).min(layout.store_bytes);
        let mut at = start;
        while at < end {
            let len = (end - at).min(buf.len() as u64) as usize;
            queues[from].read_many(&mut [(at, &mut buf[..len])]).map_err(io_error("resyncing a mirror".into()))?;
            queues[to].write_many(&[(at, &buf[..len])]).map_err(io_error("resyncing a mirror".into()))?;
            at += len as u64;
        }
        debug_assert!(start >= end || at == end, "region {region} copied short");
    }
    if !regions.is_empty() {
        queues[to].flush().map_err(io_error("flushing a resynced mirror device".into()))?;
        let zeros = AlignedBuf::zeroed(bitmap_bytes);
        for &slot in &keepers {
            queues[slot]
                .write_many(&[(layout.meta_start, &zeros[..])])
                .and_then(|()| queues[slot].flush())
                .map_err(io_error("clearing a mirror's bitmap".into()))?;
        }
    }
    Ok(regions.len() as u64)
}

/// Compares the devices' store bytes whole; copies the flush device's
/// block over each that differs; how many did.
fn check(sides: &[Device; 2], layout: &MirrorLayout, flush_slot: usize) -> Result<u64> {
    let mut queues = [sides[0].queue()?, sides[1].queue()?];
    let (from, to) = (flush_slot, 1 - flush_slot);
    let chunk = 4 << 20;
    let mut bufs = [AlignedBuf::zeroed(chunk), AlignedBuf::zeroed(chunk)];
    let mut differing = 0;
    let mut at = 0;
    while at < layout.store_bytes {
        let len = (layout.store_bytes - at).min(chunk as u64) as usize;
        debug_assert!(len.is_multiple_of(BLOCK_SIZE), "the store's bytes are whole blocks");
        for (slot, buf) in bufs.iter_mut().enumerate() {
            queues[slot].read_many(&mut [(at, &mut buf[..len])]).map_err(io_error("checking a mirror".into()))?;
        }
        for block in 0..len / BLOCK_SIZE {
            let range = block * BLOCK_SIZE..(block + 1) * BLOCK_SIZE;
            if bufs[from][range.clone()] != bufs[to][range.clone()] {
                differing += 1;
                let offset = at + range.start as u64;
                queues[to]
                    .write_many(&[(offset, &bufs[from][range])])
                    .map_err(io_error("repairing a mirror".into()))?;
            }
        }
        at += len as u64;
    }
    if differing > 0 {
        queues[to].flush().map_err(io_error("flushing a repaired mirror device".into()))?;
    }
    Ok(differing)
}
