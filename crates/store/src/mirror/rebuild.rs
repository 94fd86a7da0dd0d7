//! Replacing a failed device while the store serves, as md RAID1's
//! `mdadm --replace`/`--add` does: the new device takes every write at
//! once, and a background copier fills it from the survivor, one region at
//! a time, in order; reads and commit flushes stay on the survivor until
//! the copy is whole. Then both are flushed, the bitmap starts clear, and
//! the pair is in sync again.
//!
//! **Why writes and the copy cannot interleave.** The copier reads a
//! region from the survivor and writes it to the new device. A write to
//! that region landing between the two would reach the new device first
//! and then be overwritten there by the older copy: lost on that device
//! for good. So a region is copied only with no write to it under way, and
//! a write to the region being copied waits until the copy ends ([`Barrier`]).
//! Writes on one device alone (the degraded store before the replacement)
//! are counted too: one that chose the survivor alone just before the
//! replacement began is still waited for.
//!
//! **A crash mid-rebuild.** Both headers say `Rebuilding`; the next mount
//! takes the new device for failed (what it holds is partial) and runs on
//! the survivor: the operator replaces it again, and the copy starts over.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{lock, Health, Mirror, Route};
use crate::blockio::AlignedBuf;
use crate::device::{Device, DeviceConfig};
use crate::error::{Result, StoreError};
use crate::faults::DeviceFaults;
use crate::BLOCK_SIZE;

/// Which regions writes are under way in, and what the copier holds, while
/// the store runs on one device or fills one from the other.
#[derive(Debug, Default)]
pub(crate) struct Barrier {
    /// Writes under way per region (admitted by [`Mirror::admit`]).
    pub(super) in_flight: HashMap<u64, u32>,
    /// The region being copied: writes to it wait.
    pub(super) copying: Option<u64>,
    /// Every write waits (the copy is whole; the pair is being flushed).
    pub(super) closed: bool,
    /// The rebuild under way: its target and the next region to copy.
    pub(super) progress: Option<(usize, u64)>,
}

/// How a replacement is made.
#[derive(Clone, Debug, Default)]
pub struct ReplaceOptions {
    /// The copy's pace, bytes a second (0: as fast as the devices go).
    pub bytes_per_sec: u64,
    /// Tests: the new device's own faults.
    pub faults: Option<Arc<DeviceFaults>>,
}

/// A rebuild's progress, for an operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct RebuildStatus {
    pub device: u8,
    pub regions_copied: u64,
    pub regions: u64,
}

impl Mirror {
    /// A write to `regions` on the degraded or rebuilding pair begins: waits
    /// while the copier holds one of them (or the copy is ending), then
    /// counts it under way. The route it must take, decided under the same
    /// lock (a replacement may have begun since the caller looked), and the
    /// replacement count its queues must match.
    pub(crate) fn admit(&self, regions: impl Iterator<Item = u64> + Clone) -> (Route, u64) {
        let mut state = lock(&self.state);
        loop {
            let held = state.barrier.closed || state.barrier.copying.is_some_and(|r| regions.clone().any(|x| x == r));
            if !held {
                break;
            }
            state = self.barrier_changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        for region in regions {
            *state.barrier.in_flight.entry(region).or_insert(0) += 1;
        }
        drop(state);
        (self.route(), self.replaced())
    }

    /// The write [`Mirror::admit`] let through ended.
    pub(crate) fn release(&self, regions: impl Iterator<Item = u64>) {
        let mut state = lock(&self.state);
        for region in regions {
            match state.barrier.in_flight.get_mut(&region) {
                Some(count) if *count > 1 => *count -= 1,
                Some(_) => {
                    state.barrier.in_flight.remove(&region);
                }
                None => debug_assert!(false, "a write released in region {region} that was never admitted"),
            }
        }
        drop(state);
        self.barrier_changed.notify_all();
    }

    /// Puts the device at `path` in `slot`'s place (the failed device) and
    /// starts filling it from the other in the background; returns once it
    /// takes writes. What `path` held is overwritten.
    pub fn replace(self: &Arc<Self>, slot: usize, path: &Path, options: ReplaceOptions) -> Result<()> {
        if slot > 1 {
            return Err(StoreError::invalid(format!("a mirror has devices 0 and 1, not {slot}")));
        }
        if !self.writable {
            return Err(StoreError::invalid("the store is open read-only"));
        }
        let survivor = 1 - slot;
        {
            let state = lock(&self.state);
            if state.health[slot] != Health::Failed || state.health[survivor] != Health::InSync {
                return Err(StoreError::invalid(format!(
                    "device {slot} of the mirror is {:?} and device {survivor} {:?}: only a failed device, beside one in sync, is replaced",
                    state.health[slot], state.health[survivor]
                )));
            }
        }
        let survivor_side = self.side(survivor);
        if same_file(path, survivor_side.path())? {
            return Err(StoreError::invalid(format!(
                "{} is the mirror's other device: replace the failed one with a different device",
                path.display()
            )));
        }
        let failed_side = self.side(slot);
        let device = if same_file(path, failed_side.path())? {
            // The failed device itself, given back (md's re-add; or a
            // rebuild cut short, made again): open already, and filled whole anew.
            failed_side
        } else {
            let config =
                DeviceConfig { mirror: None, faults: options.faults.clone(), ..survivor_side.config().clone() };
            Arc::new(Device::open(path, &config, true)?)
        };
        let needed = self.layout.meta_start + (self.layout.bitmap_blocks + 1) * BLOCK_SIZE as u64;
        if device.size_bytes() < needed {
            return Err(StoreError::invalid(format!(
                "{} holds {} bytes; the mirror needs at least {needed}",
                path.display(),
                device.size_bytes()
            )));
        }
        let member = super::new_member_id()?;
        {
            // The meta lock serializes replacements: a second one, checked
            // before the first took effect, is refused here.
            let mut meta = lock(&self.meta);
            {
                let state = lock(&self.state);
                if state.health[slot] != Health::Failed || state.health[survivor] != Health::InSync {
                    return Err(StoreError::invalid(format!(
                        "device {slot} of the mirror is {:?} now and device {survivor} {:?}: another replacement, or a failure, came first",
                        state.health[slot], state.health[survivor]
                    )));
                }
            }
            let queue = device.queue()?;
            let flusher = queue.flush_handle();
            meta[slot] = queue;
            self.flushers.write().unwrap_or_else(|poisoned| poisoned.into_inner())[slot] = flusher;
            self.sides.write().unwrap_or_else(|poisoned| poisoned.into_inner())[slot] = device;
            self.replaced.fetch_add(1, Ordering::AcqRel);
            let mut state = lock(&self.state);
            state.health[slot] = Health::Rebuilding;
            // From the next header write on, the device it replaces is stale.
            state.members[slot] = member;
            state.barrier.progress = Some((slot, 0));
        }
        self.write_headers()?;
        tracing::warn!(
            device = %path.display(),
            slot,
            regions = self.layout.regions,
            "a mirror device replaced: filling it from the other in the background"
        );
        let mirror = self.clone();
        let copier = std::thread::Builder::new()
            .name("store-mirror-rebuild".into())
            .spawn(move || mirror.copy_all(slot, options.bytes_per_sec))
            .map_err(|e| StoreError::io("starting the mirror rebuild thread", e))?;
        // A copier before it ended, or it would not have been replaced again.
        if let Some(before) = lock(&self.copier).replace(copier) {
            let _ = before.join();
        }
        Ok(())
    }

    /// Stops a rebuild under way and waits for its copier to end (the
    /// store is closing: the next mount finds the new device out).
    pub(crate) fn stop_rebuild(&self) {
        self.stopping.store(true, Ordering::Release);
        self.barrier_changed.notify_all();
        if let Some(copier) = lock(&self.copier).take() {
            if copier.join().is_err() {
                tracing::error!("the mirror rebuild thread panicked");
            }
        }
    }

    /// The copier: every region in order, then [`Mirror::finish_rebuild`].
    fn copy_all(&self, target: usize, bytes_per_sec: u64) {
        let survivor = 1 - target;
        let started = Instant::now();
        let queues = self.side(survivor).queue().and_then(|from| Ok((from, self.side(target).queue()?)));
        let (mut from, mut to) = match queues {
            Ok(queues) => queues,
            Err(err) => return self.abandon(target, &std::io::Error::other(err.to_string())),
        };
        let mut buf = AlignedBuf::zeroed(self.layout.region_bytes.min(4 << 20) as usize);
        let mut copied: u64 = 0;
        for region in 0..self.layout.regions {
            if !self.claim(target, region) {
                return;
            }
            let start = region * self.layout.region_bytes;
            let end = (start + self.layout.region_bytes).min(self.layout.store_bytes);
            let mut at = start;
            let mut failed = None;
            while at < end && failed.is_none() {
                let len = (end - at).min(buf.len() as u64) as usize;
                if let Err(err) = from.read_many(&mut [(at, &mut buf[..len])]) {
                    failed = Some(std::io::Error::other(format!("reading the survivor: {err}")));
                } else if let Err(err) = to.write_many(&[(at, &buf[..len])]) {
                    failed = Some(err);
                }
                at += len as u64;
            }
            self.unclaim(target, region);
            if let Some(err) = failed {
                return self.abandon(target, &err);
            }
            copied += end.saturating_sub(start);
            if bytes_per_sec > 0 {
                let due = Duration::from_secs_f64(copied as f64 / bytes_per_sec as f64);
                // In slices: a closing store does not wait out the pace.
                while let Some(ahead) = due.checked_sub(started.elapsed()) {
                    if self.stopping.load(Ordering::Acquire) {
                        break;
                    }
                    std::thread::sleep(ahead.min(Duration::from_millis(20)));
                }
            }
        }
        if let Err(err) = self.finish_rebuild(target) {
            return self.abandon(target, &err);
        }
        tracing::warn!(
            device = %self.path(target).display(),
            regions = self.layout.regions,
            seconds = started.elapsed().as_secs_f64(),
            "the mirror device is filled: the pair is in sync again"
        );
    }

    /// Holds `region` for its copy: new writes to it wait, and the ones
    /// under way are waited for. False: the rebuild stopped.
    fn claim(&self, target: usize, region: u64) -> bool {
        let mut state = lock(&self.state);
        if state.health[target] != Health::Rebuilding || self.stopping.load(Ordering::Acquire) {
            state.barrier.progress = None;
            return false;
        }
        debug_assert!(state.barrier.copying.is_none(), "one region is copied at a time");
        state.barrier.copying = Some(region);
        while state.barrier.in_flight.contains_key(&region) {
            state = self.barrier_changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
        true
    }

    /// `region` is copied: writes to it go on, and the copy moves past it.
    fn unclaim(&self, target: usize, region: u64) {
        {
            let mut state = lock(&self.state);
            debug_assert_eq!(state.barrier.copying, Some(region), "the region released is the one held");
            state.barrier.copying = None;
            state.barrier.progress = Some((target, region + 1));
        }
        self.barrier_changed.notify_all();
    }

    /// The copy is whole: with every write held, both devices are flushed,
    /// the bitmap starts clear (nothing differs), and the pair is in sync.
    fn finish_rebuild(&self, target: usize) -> std::io::Result<()> {
        let survivor = 1 - target;
        {
            let mut state = lock(&self.state);
            state.barrier.closed = true;
            while !state.barrier.in_flight.is_empty() {
                state = self.barrier_changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
            }
        }
        let result = (|| {
            self.flusher(target).flush()?;
            self.flusher(survivor).flush()?;
            let mut meta = lock(&self.meta);
            let (pages, keepers) = {
                let mut state = lock(&self.state);
                if state.health[target] != Health::Rebuilding {
                    return Err(std::io::Error::other("the rebuild was stopped"));
                }
                state.regions.clear_all();
                let keepers = match self.mode {
                    super::MirrorMode::ReadFlushSplit => vec![state.flush_slot],
                    super::MirrorMode::Plain => vec![0, 1],
                };
                (state.regions.every_page(), keepers)
            };
            let images: Vec<(u64, AlignedBuf)> = pages
                .iter()
                .map(|(page, image)| (self.layout.page_offset(*page), AlignedBuf::from_slice(image)))
                .collect();
            let requests: Vec<(u64, &[u8])> = images.iter().map(|(offset, buf)| (*offset, &buf[..])).collect();
            for slot in keepers {
                meta[slot].write_many(&requests).and_then(|()| meta[slot].flush())?;
            }
            let mut state = lock(&self.state);
            state.regions.written(&pages);
            state.health[target] = Health::InSync;
            state.barrier.progress = None;
            debug_assert_eq!(state.health[state.flush_slot], Health::InSync, "the flush device is in sync");
            Ok(())
        })();
        lock(&self.state).barrier.closed = false;
        self.barrier_changed.notify_all();
        result?;
        self.write_headers().map_err(|e| std::io::Error::other(e.to_string()))
    }

    /// The rebuild failed on `err`: the new device is out again.
    fn abandon(&self, target: usize, err: &std::io::Error) {
        tracing::error!(device = %self.path(target).display(), error = %err, "the mirror rebuild failed");
        lock(&self.state).barrier.progress = None;
        if let Err(err) = self.fail(target, err) {
            tracing::error!(error = %err, "marking the mirror device being rebuilt failed did not work");
        }
    }
}

/// Whether `a` and `b` name one file or device (a replacement onto the
/// survivor itself would overwrite the only good copy).
fn same_file(a: &Path, b: &Path) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    // One that does not exist (a device gone at mount) is no other's.
    let (Ok(first), Ok(second)) = (std::fs::metadata(a), std::fs::metadata(b)) else { return Ok(false) };
    let same_inode = first.dev() == second.dev() && first.ino() == second.ino();
    let same_device = first.rdev() != 0 && first.rdev() == second.rdev();
    Ok(same_inode || same_device)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::{DirectIo, IoBackend};
    use crate::mirror::{MirrorConfig, MirrorMode};
    use std::sync::mpsc;

    fn degraded_mirror(dir: &Path) -> Arc<Mirror> {
        let (a, b) = (dir.join("a"), dir.join("b"));
        for path in [&a, &b] {
            crate::device::create_file(path, 2 << 20).unwrap();
        }
        let mut config = MirrorConfig::new(b, MirrorMode::ReadFlushSplit);
        config.region_bytes = 64 << 10;
        let device =
            DeviceConfig { backend: IoBackend::Pread, direct_io: DirectIo::Fallback, ..DeviceConfig::default() };
        let mirror = Arc::new(Mirror::make(&a, &config, &device).unwrap());
        mirror.fail(1, &std::io::Error::other("test")).unwrap();
        lock(&mirror.state).health[1] = Health::Rebuilding;
        mirror
    }

    /// What `receiver` gives within `wait`.
    fn within<T>(receiver: &mpsc::Receiver<T>, wait: Duration) -> Option<T> {
        receiver.recv_timeout(wait).ok()
    }

    /// The copier's claim of a region waits for the writes under way in
    /// it, and a write to the claimed region waits for the copy to end;
    /// writes elsewhere go on.
    #[test]
    fn a_region_is_copied_with_no_write_to_it_under_way() {
        let dir = tempfile::tempdir().unwrap();
        let mirror = degraded_mirror(dir.path());
        let (route, _) = mirror.admit([3u64].into_iter());
        assert_eq!(route, Route::Rebuilding { survivor: 0, target: 1 });
        let (claimed_tx, claimed) = mpsc::channel();
        let copier = {
            let mirror = mirror.clone();
            std::thread::spawn(move || {
                assert!(mirror.claim(1, 3));
                claimed_tx.send(()).unwrap();
            })
        };
        assert!(within(&claimed, Duration::from_millis(200)).is_none(), "claimed under a write");
        mirror.release([3u64].into_iter());
        assert!(within(&claimed, Duration::from_secs(2)).is_some(), "the claim waits past the write");
        copier.join().unwrap();

        let (admitted_tx, admitted) = mpsc::channel();
        let writer = {
            let mirror = mirror.clone();
            std::thread::spawn(move || {
                let admitted = mirror.admit([2u64, 3].into_iter());
                admitted_tx.send(()).unwrap();
                mirror.release([2u64, 3].into_iter());
                admitted
            })
        };
        let elsewhere = mirror.admit([4u64].into_iter());
        mirror.release([4u64].into_iter());
        assert_eq!(elsewhere.0, Route::Rebuilding { survivor: 0, target: 1 }, "another region's write goes on");
        assert!(within(&admitted, Duration::from_millis(200)).is_none(), "a write into the region being copied");
        mirror.unclaim(1, 3);
        assert!(within(&admitted, Duration::from_secs(2)).is_some(), "the write goes once the copy ends");
        writer.join().unwrap();
        assert_eq!(mirror.status().rebuild.map(|r| r.regions_copied), Some(4));
        assert!(lock(&mirror.state).barrier.in_flight.is_empty(), "every write released");
    }
}
