//! Primary of an eventual pool's PG (`crate::backend::eventual`): the
//! writes already acknowledged to their clients that not every replica has
//! acknowledged yet, oldest first. The oldest one's age is the PG's
//! replication lag: what a failure of this primary could lose now. The
//! backend keeps it under the pool's `max_lag` by making new writes wait
//! for their replicas once it is reached.
//!
//! And when every replica last acknowledged a write of the PG: a write is
//! acknowledged early only if that was within `max_lag` too. A replica
//! that stopped receiving in silence (it hangs, or a cut drops what is
//! sent to it without a reset) while the PG was idle is otherwise found
//! only by the first write after, which would then be acknowledged early,
//! with the writes of the next `max_lag`, long after the replica stopped:
//! the bound must hold from when it stopped.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// The most writes a PG's primary holds alone: past it, writes wait for
/// their replicas whatever the lag (the queue, and every thread's pending
/// writes, stay bounded under a long max_lag at a high rate). Half what a
/// replica keeps waiting for its log's room ([`crate::pg::MAX_EARLY_ENTRIES`]):
/// a replica slow to flush holds every write its primary acknowledged
/// early, and the writes that wait for it besides, and refuses past its
/// bound, which makes the PG peer again. At 4,096 a replica with a small
/// log refused under pipelined writes (the lalca connection-order test,
/// about one run in four, session 40).
pub const MAX_UNREPLICATED: usize = crate::pg::MAX_EARLY_ENTRIES / 2;

#[derive(Debug, Default)]
pub struct ReplicationLag {
    /// Each write, in the order of acknowledgement (the log's: taken under
    /// the PG's lock).
    writes: VecDeque<Unreplicated>,
    /// When every replica last acknowledged a write (`None`: not in this
    /// interval yet).
    heard: Option<Instant>,
    /// The PG is an eventual pool's: its strong writes' ends are noted too.
    watched: bool,
}

#[derive(Debug)]
struct Unreplicated {
    write: u64,
    /// When it was acknowledged.
    at: Instant,
    /// Every replica has it (it waits behind an older one to leave).
    done: bool,
    /// The bytes it changes: a backfill's copy of them must wait for it,
    /// or the copy could land on a target after it and undo it there.
    object: Bytes,
    range: (u64, u64),
}

impl ReplicationLag {
    /// Write `write`, changing bytes `range` of `object`, was acknowledged
    /// to its client at `at`, before its replicas.
    pub fn begin(&mut self, write: u64, at: Instant, object: Bytes, range: (u64, u64)) {
        debug_assert!(self.writes.back().is_none_or(|w| w.at <= at), "acknowledged out of order");
        debug_assert!(self.writes.iter().all(|w| w.write != write), "write {write} begun twice");
        assert!(self.writes.len() < MAX_UNREPLICATED, "a write acknowledged early past the bound");
        self.writes.push_back(Unreplicated { write, at, done: false, object, range });
    }

    /// Every replica has write `write`, or it was given up on (then the PG
    /// peers again, and recovery carries it). Returns whether it was here
    /// (a write of an interval since cleared is not).
    pub fn end(&mut self, write: u64) -> bool {
        // Replicas answer in about the order the writes went out: the
        // search ends near the front.
        let Some(at) = self.writes.iter().position(|w| w.write == write) else { return false };
        debug_assert!(!self.writes[at].done, "write {write} ended twice");
        self.writes[at].done = true;
        while self.writes.front().is_some_and(|w| w.done) {
            self.writes.pop_front();
        }
        debug_assert!(self.writes.front().is_none_or(|w| !w.done), "a replicated write heads the queue");
        true
    }

    /// Whether a write may be acknowledged before its replicas at `now`:
    /// the oldest write only this primary holds has waited less than
    /// `max_lag`, every replica acknowledged a write within it, and fewer
    /// than [`MAX_UNREPLICATED`] writes are on this primary alone.
    pub fn may_acknowledge_early(&mut self, now: Instant, max_lag: Duration) -> bool {
        self.watched = true;
        let heard = self.heard.is_some_and(|at| now.saturating_duration_since(at) < max_lag);
        heard && self.lag(now) < max_lag && self.writes.len() < MAX_UNREPLICATED
    }

    /// Whether this is an eventual pool's PG (it has asked [`Self::may_acknowledge_early`]).
    pub fn watched(&self) -> bool {
        self.watched
    }

    /// Every replica acknowledged a write of the PG at `at` (noted for an
    /// eventual pool's PG only: a strong one never asks).
    pub fn replicated(&mut self, at: Instant) {
        if self.watched {
            self.heard = Some(self.heard.map_or(at, |h| h.max(at)));
        }
    }

    /// How long the oldest write only this primary holds has waited (zero: none).
    pub fn lag(&self, now: Instant) -> Duration {
        self.writes.front().map_or(Duration::ZERO, |w| now.saturating_duration_since(w.at))
    }

    /// Writes acknowledged and not yet on every replica.
    pub fn unreplicated(&self) -> usize {
        self.writes.iter().filter(|w| !w.done).count()
    }

    /// Whether a write not yet on every replica changes bytes `start..end` of `object`.
    pub fn touches(&self, object: &[u8], start: u64, end: u64) -> bool {
        self.writes.iter().any(|w| !w.done && w.object == object && w.range.0 < end && start < w.range.1)
    }

    /// A new interval: peering carried (or dropped) whatever was in flight,
    /// and the replicas have yet to prove themselves in it.
    pub fn clear(&mut self) {
        self.writes.clear();
        self.heard = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lag_is_the_age_of_the_oldest_write_a_replica_still_lacks() {
        let mut lag = ReplicationLag::default();
        let t0 = Instant::now();
        assert_eq!(lag.lag(t0), Duration::ZERO);
        let object = Bytes::from_static(b"obj");
        lag.begin(1, t0, object.clone(), (0, 4096));
        lag.begin(2, t0 + Duration::from_millis(5), object.clone(), (4096, 8192));
        lag.begin(3, t0 + Duration::from_millis(9), object.clone(), (8192, 12288));
        let now = t0 + Duration::from_millis(20);
        assert_eq!(lag.lag(now), Duration::from_millis(20));
        assert!(lag.end(2), "answered out of order");
        assert!(lag.touches(b"obj", 0, 1) && !lag.touches(b"obj", 4096, 8192), "write 2 is replicated");
        assert!(!lag.touches(b"other", 0, u64::MAX));
        assert_eq!(lag.lag(now), Duration::from_millis(20), "write 1 still waits");
        assert!(lag.end(1));
        assert_eq!(lag.lag(now), Duration::from_millis(11), "write 3 is the oldest now");
        assert_eq!(lag.unreplicated(), 1);
        assert!(!lag.end(7), "a write never begun");
        lag.clear();
        assert_eq!(lag.lag(now), Duration::ZERO);
        assert!(!lag.end(3), "cleared with its interval");
    }

    #[test]
    fn a_write_is_acknowledged_early_only_while_every_replica_answers_within_max_lag() {
        let mut lag = ReplicationLag::default();
        let t0 = Instant::now();
        let max = Duration::from_millis(100);
        assert!(!lag.may_acknowledge_early(t0, max), "no replica heard from in this interval");
        lag.replicated(t0);
        assert!(lag.may_acknowledge_early(t0 + Duration::from_millis(50), max));
        assert!(!lag.may_acknowledge_early(t0 + max, max), "idle past max_lag: the next write waits");
        lag.replicated(t0 + max);
        lag.begin(1, t0 + max, Bytes::from_static(b"o"), (0, 1));
        assert!(lag.may_acknowledge_early(t0 + max + Duration::from_millis(99), max));
        assert!(!lag.may_acknowledge_early(t0 + max * 2, max), "write 1 has waited max_lag");
        lag.clear();
        assert!(!lag.may_acknowledge_early(t0 + max * 2, max), "a new interval starts unproven");
        lag.replicated(t0 + max * 2);
        for write in 0..MAX_UNREPLICATED as u64 {
            assert!(lag.may_acknowledge_early(t0 + max * 2, max), "write {write} is under the bound");
            lag.begin(write, t0 + max * 2, Bytes::from_static(b"o"), (0, 1));
        }
        assert!(!lag.may_acknowledge_early(t0 + max * 2, max), "the bound on writes held alone");
    }
}
