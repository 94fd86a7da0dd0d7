//! A queue over the mirrored pair: one per partition, as over a single
//! device (`mirror/mod.rs` has the protocol).

use std::io;
use std::sync::Arc;

use super::{Mirror, Route};
use crate::blockio::{BlockIo, FlushHandle, IoStats};

pub(crate) struct MirrorIo {
    mirror: Arc<Mirror>,
    queues: [Box<dyn BlockIo>; 2],
    /// The mirror's replacement count the queues are of.
    replaced: u64,
    stats: IoStats,
    /// Plain mode: the device the next read tries first.
    turn: usize,
}

impl MirrorIo {
    pub(crate) fn new(mirror: Arc<Mirror>) -> crate::error::Result<MirrorIo> {
        let replaced = mirror.replaced();
        let queues = [mirror.side(0).queue()?, mirror.side(1).queue()?];
        Ok(MirrorIo { mirror, queues, replaced, stats: IoStats::default(), turn: 0 })
    }

    /// Opens the replaced device's queue if a side was replaced since
    /// these queues were opened (`replaced`: the count the caller saw).
    fn catch_up(&mut self, replaced: u64) -> io::Result<()> {
        if replaced == self.replaced {
            return Ok(());
        }
        let reopen = |slot: usize| self.mirror.side(slot).queue().map_err(|e| io::Error::other(e.to_string()));
        let queues = [reopen(0)?, reopen(1)?];
        self.queues = queues;
        self.replaced = replaced;
        Ok(())
    }

    /// Reads from `slot`; if it fails, marks it failed and reads from the
    /// other (unless it was the last).
    fn read_from(&mut self, slot: usize, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        let Err(err) = self.queues[slot].read_many(requests) else { return Ok(()) };
        self.mirror.fail(slot, &err)?;
        match self.mirror.route() {
            Route::Single(survivor) if survivor != slot => {
                debug_assert!(self.mirror.healthy(survivor), "reads fall back on a device that is out");
                self.queues[survivor].read_many(requests)
            }
            _ => Err(err),
        }
    }
}

impl BlockIo for MirrorIo {
    fn read_many(&mut self, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        self.catch_up(self.mirror.replaced())?;
        let store_bytes = self.mirror.layout().store_bytes;
        debug_assert!(
            requests.iter().all(|(offset, buf)| offset + buf.len() as u64 <= store_bytes),
            "a read past the store's bytes, into the mirror's own"
        );
        let (slot, redirected) = match self.mirror.route() {
            Route::Split { flush, read } => {
                // Off the read device while a clean flushes it.
                if self.mirror.is_flushing(read) && !self.mirror.is_flushing(flush) {
                    (flush, true)
                } else {
                    (read, false)
                }
            }
            Route::Both => {
                let mut slot = self.turn;
                self.turn = 1 - self.turn;
                if self.mirror.is_flushing(slot) && !self.mirror.is_flushing(1 - slot) {
                    slot = 1 - slot;
                }
                (slot, false)
            }
            Route::Single(slot) | Route::Rebuilding { survivor: slot, .. } => (slot, false),
        };
        self.mirror.count_read(slot, redirected);
        self.read_from(slot, requests)?;
        self.stats.reads += requests.len() as u64;
        self.stats.submissions += 1;
        self.stats.bytes_read += requests.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        Ok(())
    }

    fn write_many(&mut self, requests: &[(u64, &[u8])]) -> io::Result<()> {
        if requests.is_empty() {
            return Ok(());
        }
        let store_bytes = self.mirror.layout().store_bytes;
        // Cheap, and a write past the store's bytes would land on the bitmap.
        assert!(
            requests.iter().all(|(offset, buf)| offset + buf.len() as u64 <= store_bytes),
            "a write past the store's bytes, into the mirror's own"
        );
        self.catch_up(self.mirror.replaced())?;
        loop {
            match self.mirror.route() {
                Route::Split { .. } | Route::Both => {
                    self.mirror.mark(requests)?;
                    let mut failed = None;
                    for slot in 0..2 {
                        if let Err(err) = self.queues[slot].write_many(requests) {
                            failed = Some((slot, err));
                            break;
                        }
                    }
                    self.mirror.touched(requests);
                    match failed {
                        None => break,
                        // Again, on the survivor alone.
                        Some((slot, err)) => self.mirror.fail(slot, &err)?,
                    }
                }
                Route::Single(_) | Route::Rebuilding { .. } => {
                    // One device, or one being filled: the copier must see
                    // this write under way (`mirror/rebuild.rs`).
                    let mirror = self.mirror.clone();
                    let regions = mirror.regions_of(requests);
                    let (route, replaced) = mirror.admit(regions.clone());
                    let written = self.catch_up(replaced).and_then(|()| self.write_admitted(route, requests));
                    mirror.release(regions);
                    if written? {
                        break;
                    }
                }
            }
        }
        self.stats.writes += requests.len() as u64;
        self.stats.submissions += 1;
        self.stats.bytes_written += requests.iter().map(|(_, b)| b.len() as u64).sum::<u64>();
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stats.flushes += 1;
        commit_flush(&self.mirror)
    }

    fn flush_handle(&self) -> Arc<dyn FlushHandle> {
        Arc::new(MirrorFlush { mirror: self.mirror.clone() })
    }

    fn copies(&self) -> usize {
        2
    }

    fn read_copy(&mut self, copy: usize, requests: &mut [(u64, &mut [u8])]) -> io::Result<()> {
        if copy >= 2 || !self.mirror.healthy(copy) {
            return Err(io::Error::other(format!("mirror device {copy} is out")));
        }
        self.catch_up(self.mirror.replaced())?;
        self.queues[copy].read_many(requests)
    }

    fn note_repair(&mut self) {
        self.mirror.count_repair();
    }

    fn stats(&self) -> IoStats {
        self.stats
    }

    fn engine(&self) -> &'static str {
        self.queues[0].engine()
    }
}

impl MirrorIo {
    /// Writes `requests` the way `route` (from [`Mirror::admit`]) says;
    /// false: the pair healed meanwhile, and the write goes the usual way.
    fn write_admitted(&mut self, route: Route, requests: &[(u64, &[u8])]) -> io::Result<bool> {
        match route {
            Route::Single(slot) => self.queues[slot].write_many(requests).map(|()| true),
            Route::Rebuilding { survivor, target } => {
                if let Err(err) = self.queues[survivor].write_many(requests) {
                    // The only whole copy: with it out the store fails.
                    self.mirror.fail(survivor, &err)?;
                }
                if let Err(err) = self.queues[target].write_many(requests) {
                    self.mirror.fail(target, &err)?;
                }
                Ok(true)
            }
            Route::Split { .. } | Route::Both => Ok(false),
        }
    }
}

/// A flush from another thread: the same as [`MirrorIo::flush`].
struct MirrorFlush {
    mirror: Arc<Mirror>,
}

impl FlushHandle for MirrorFlush {
    fn flush(&self) -> io::Result<()> {
        commit_flush(&self.mirror)
    }
}

/// A commit's flush: the flush device's (both, in plain mode; the
/// survivor, degraded or rebuilding), then a clean if one is due.
fn commit_flush(mirror: &Mirror) -> io::Result<()> {
    let flushers = [mirror.flusher(0), mirror.flusher(1)];
    match mirror.route() {
        Route::Split { flush, read } => {
            if let Err(err) = mirror.flushing(flush, || flushers[flush].flush()) {
                mirror.fail(flush, &err)?;
                // The read device alone now: it holds every write; make them durable.
                return mirror.flushing(read, || flushers[read].flush());
            }
            mirror.maybe_clean()
        }
        Route::Both => {
            let (first, second) = std::thread::scope(|scope| {
                let other = scope.spawn(|| mirror.flushing(1, || flushers[1].flush()));
                let first = mirror.flushing(0, || flushers[0].flush());
                // A simulated power cut unwinds from a flush: it goes on unwinding here.
                (first, other.join().unwrap_or_else(|payload| std::panic::resume_unwind(payload)))
            });
            for (slot, result) in [(0, first), (1, second)] {
                if let Err(err) = result {
                    mirror.fail(slot, &err)?;
                }
            }
            mirror.maybe_clean()
        }
        Route::Single(slot) | Route::Rebuilding { survivor: slot, .. } => {
            mirror.flushing(slot, || flushers[slot].flush())
        }
    }
}
