//! Replicated writes waiting for their replicas (and, on the sync write
//! path, for the local apply): which ones each write still waits for,
//! whether any failed, and when the write has waited too long.
//!
//! Sans I/O, so the priority thread and the simulator keep their pending
//! writes with the same code: a write is finished here, and only here, when
//! its last answer comes, when a replica it waits for is lost, or when it
//! outlives its timeout or its PG's interval. What the caller does with a
//! [`Finished`] write (reply to the client, through
//! [`crate::io::ops::finish_write`]) is the caller's I/O.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use duplex_map::OsdId;
use duplex_oplog::RequestId;
use duplex_proto::osd::OpReply;

use crate::backend::WriteEnd;
use crate::io::ops::finish_write;
use crate::shared::Shared;

/// A replicated write whose replicas have not all answered by then is
/// failed with `Retry`. A replica that keeps its connection open but never
/// acknowledges (it waits on entries it missed) must not hold the client's
/// connection, whose replies leave in order, for ever.
pub const REPLICATION_TIMEOUT: Duration = Duration::from_secs(10);

/// An eventual pool's write whose client was answered waits for its
/// replicas at least this long (its pool's max_lag if longer) before its
/// PG peers again: a replica a little slower than a small max_lag under
/// load is not worth a peering (new writes wait for it meanwhile), one
/// that missed an entry without a reset is.
pub const ANSWERED_WAIT_FLOOR: Duration = Duration::from_secs(1);

/// What a write is registered with: where its reply goes (`R`, the
/// runtime's own notion: a connection slot, a simulated client), and what
/// finishing it in its PG's request table needs.
#[derive(Clone, Copy, Debug)]
pub struct WriteInfo<R> {
    pub reply_to: R,
    /// When the client's request arrived (for the write latency).
    pub arrived: Instant,
    /// The map epoch the write was admitted under.
    pub map_epoch: u64,
    pub pg: u32,
    pub request: RequestId,
    /// `Some(max_lag)`: its client was answered before the replicas (an
    /// eventual pool's write). Finishing it sends nothing, and it is given
    /// up on (its PG peers again, which brings every replica level) once
    /// they have not all answered within `max_lag` (at least
    /// [`ANSWERED_WAIT_FLOOR`]): a replica that misses an entry without
    /// losing its connection must not hold the write at risk for the whole
    /// replication timeout.
    pub answered: Option<Duration>,
}

struct PendingWrite<R> {
    info: WriteInfo<R>,
    /// Replicas that have not answered yet.
    waiting: Vec<OsdId>,
    /// The sync write path's local apply has not completed yet.
    local: bool,
    failed: bool,
    /// When the entry went to the replicas.
    sent: Instant,
}

/// A write whose every answer is in (or that was given up on).
#[derive(Debug)]
pub struct Finished<R> {
    /// The write's replication transaction id.
    pub txid: u64,
    pub info: WriteInfo<R>,
    /// A replica or the local apply failed, was lost, or timed out.
    pub failed: bool,
    pub sent: Instant,
}

impl<R> Finished<R> {
    /// The client's reply, with the write finished in its PG's request
    /// table (or its replication lag: an answered write's reply is unused).
    pub fn reply(&self, shared: &Shared) -> OpReply {
        let info = &self.info;
        let end = WriteEnd {
            pg: info.pg,
            write: self.txid,
            request: info.request,
            map_epoch: info.map_epoch,
            failed: self.failed,
            answered: info.answered.is_some(),
        };
        finish_write(shared, &end)
    }
}

/// The pending writes of one priority thread (or one simulated OSD).
pub struct PendingWrites<R> {
    writes: HashMap<u64, PendingWrite<R>>,
}

impl<R> Default for PendingWrites<R> {
    fn default() -> Self {
        PendingWrites { writes: HashMap::new() }
    }
}

impl<R: Copy> PendingWrites<R> {
    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    /// Registers write `txid` and sends its entry to each replica with
    /// `send`, which says whether it could: a replica it could not reach
    /// fails the write at once (it never waits for an answer that cannot
    /// come). `local`: the sync write path's local apply is still to come.
    /// Returns the write if that already finished it.
    pub fn register(
        &mut self,
        txid: u64,
        info: WriteInfo<R>,
        replicas: Vec<OsdId>,
        local: bool,
        now: Instant,
        mut send: impl FnMut(OsdId) -> bool,
    ) -> Option<Finished<R>> {
        assert!(!self.writes.contains_key(&txid), "write {txid} registered twice");
        debug_assert!(
            replicas.iter().enumerate().all(|(i, osd)| !replicas[..i].contains(osd)),
            "a replica named twice: {replicas:?}"
        );
        // The replicas' list becomes the list of those the write waits for.
        let mut waiting = replicas;
        let before = waiting.len();
        waiting.retain(|osd| send(*osd));
        let failed = waiting.len() < before;
        self.writes.insert(txid, PendingWrite { info, waiting, local, failed, sent: now });
        let finished = self.finish_if_done(txid);
        debug_assert!(finished.is_some() != self.writes.contains_key(&txid), "write {txid} both finished and pending");
        finished
    }

    /// Replica `osd` answered write `txid` (`ok`: it logged the entry).
    /// An answer for a write no longer pending (finished, expired) is ignored.
    pub fn on_ack(&mut self, txid: u64, osd: OsdId, ok: bool) -> Option<Finished<R>> {
        let write = self.writes.get_mut(&txid)?;
        write.waiting.retain(|o| *o != osd);
        write.failed |= !ok;
        self.finish_if_done(txid)
    }

    /// The sync write path's local apply of write `txid` completed.
    pub fn on_local(&mut self, txid: u64, ok: bool) -> Option<Finished<R>> {
        let write = self.writes.get_mut(&txid);
        debug_assert!(write.as_ref().is_some_and(|w| w.local), "a local apply completed for a write never registered");
        let write = write?;
        write.local = false;
        write.failed |= !ok;
        self.finish_if_done(txid)
    }

    /// The connection to replica `osd` was lost: every write waiting for it
    /// fails, in transaction order (the simulator replays a seed exactly).
    pub fn peer_lost(&mut self, osd: OsdId) -> Vec<Finished<R>> {
        let mut affected: Vec<u64> =
            self.writes.iter().filter(|(_, w)| w.waiting.contains(&osd)).map(|(txid, _)| *txid).collect();
        affected.sort_unstable();
        let lost: Vec<Finished<R>> = affected.into_iter().filter_map(|txid| self.on_ack(txid, osd, false)).collect();
        debug_assert!(
            self.writes.values().all(|w| !w.waiting.contains(&osd)),
            "a write still waits for lost osd.{osd}"
        );
        debug_assert!(lost.iter().all(|f| f.failed), "a write that lost a replica finished as a success");
        lost
    }

    /// Fails writes still waiting for replicas `timeout` after they were
    /// sent (an answered write: its `max_lag` or the floor, if shorter), or whose PG moved to a newer interval (`outlived(pg,
    /// map_epoch)`, asked once per PG and epoch); late answers then find
    /// nothing. Returns them in transaction order (a deterministic order
    /// for the simulator).
    pub fn expire(
        &mut self,
        now: Instant,
        timeout: Duration,
        mut outlived: impl FnMut(u32, u64) -> bool,
    ) -> Vec<Finished<R>> {
        let mut asked: HashMap<(u32, u64), bool> = HashMap::new();
        let mut expired: Vec<u64> = self
            .writes
            .iter()
            .filter(|(_, w)| {
                !w.waiting.is_empty()
                    && (now.saturating_duration_since(w.sent)
                        > w.info.answered.map_or(timeout, |lag| lag.max(ANSWERED_WAIT_FLOOR).min(timeout))
                        || *asked
                            .entry((w.info.pg, w.info.map_epoch))
                            .or_insert_with(|| outlived(w.info.pg, w.info.map_epoch)))
            })
            .map(|(txid, _)| *txid)
            .collect();
        expired.sort_unstable();
        let mut finished = Vec::with_capacity(expired.len());
        for txid in expired {
            let Some(write) = self.writes.get_mut(&txid) else { continue };
            if write.info.answered.is_some() {
                tracing::warn!(pg = write.info.pg, waiting = ?write.waiting, "replicas did not acknowledge an acknowledged write within the pool's max_lag; the PG peers again");
            } else {
                tracing::warn!(pg = write.info.pg, waiting = ?write.waiting, "replicas did not acknowledge a write in time; failing it");
            }
            write.waiting.clear();
            write.failed = true;
            finished.extend(self.finish_if_done(txid));
        }
        debug_assert!(finished.windows(2).all(|w| w[0].txid < w[1].txid), "expired writes leave in transaction order");
        debug_assert!(finished.iter().all(|f| f.failed), "an expired write finished as a success");
        debug_assert!(
            self.writes.values().all(|w| !w.waiting.is_empty() || w.local),
            "the pending table holds a write with nothing left to wait for"
        );
        finished
    }

    fn finish_if_done(&mut self, txid: u64) -> Option<Finished<R>> {
        let write = self.writes.get(&txid)?;
        if !write.waiting.is_empty() || write.local {
            return None;
        }
        let write = self.writes.remove(&txid)?;
        debug_assert!(write.waiting.is_empty() && !write.local, "a write finished while it still waits");
        Some(Finished { txid, info: write.info, failed: write.failed, sent: write.sent })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> WriteInfo<u32> {
        WriteInfo {
            reply_to: 7,
            arrived: Instant::now(),
            map_epoch: 3,
            pg: 1,
            request: RequestId { client: 1, tid: 1 },
            answered: None,
        }
    }

    #[test]
    fn a_write_finishes_when_every_replica_has_answered_and_fails_if_one_refused() {
        let mut pending = PendingWrites::default();
        let now = Instant::now();
        assert!(pending.register(1, info(), vec![2, 3], false, now, |_| true).is_none());
        assert!(pending.on_ack(1, 2, true).is_none(), "still waits for osd.3");
        let done = pending.on_ack(1, 3, false).expect("every replica answered");
        assert!(done.failed);
        assert_eq!(done.info.reply_to, 7);
        assert!(pending.is_empty());
        assert!(pending.on_ack(1, 3, true).is_none(), "a late answer finds nothing");
    }

    #[test]
    fn an_unreachable_replica_fails_the_write_at_send_time() {
        let mut pending = PendingWrites::default();
        let done = pending.register(1, info(), vec![2], false, Instant::now(), |_| false).expect("nothing to wait for");
        assert!(done.failed);
    }

    #[test]
    fn the_sync_path_waits_for_the_local_apply_too() {
        let mut pending = PendingWrites::default();
        assert!(pending.register(1, info(), vec![], true, Instant::now(), |_| true).is_none());
        let done = pending.on_local(1, true).expect("applied locally");
        assert!(!done.failed);
    }

    #[test]
    fn a_lost_peer_or_a_timeout_or_a_newer_interval_fails_what_waits() {
        let mut pending = PendingWrites::default();
        let now = Instant::now();
        pending.register(1, info(), vec![2], false, now, |_| true);
        pending.register(2, info(), vec![3], false, now, |_| true);
        pending.register(3, WriteInfo { pg: 9, ..info() }, vec![3], false, now, |_| true);
        let lost = pending.peer_lost(2);
        assert_eq!(lost.iter().map(|f| f.txid).collect::<Vec<_>>(), vec![1]);
        assert!(pending.expire(now, REPLICATION_TIMEOUT, |_, _| false).is_empty(), "not yet");
        let outlived = pending.expire(now, REPLICATION_TIMEOUT, |pg, _| pg == 9);
        assert_eq!(outlived.iter().map(|f| (f.txid, f.failed)).collect::<Vec<_>>(), vec![(3, true)]);
        let later = now + REPLICATION_TIMEOUT + Duration::from_millis(1);
        let timed_out = pending.expire(later, REPLICATION_TIMEOUT, |_, _| false);
        assert_eq!(timed_out.iter().map(|f| f.txid).collect::<Vec<_>>(), vec![2]);
        assert!(pending.is_empty());
    }

    #[test]
    fn an_answered_write_is_given_up_on_after_its_max_lag() {
        let mut pending = PendingWrites::default();
        let now = Instant::now();
        let lag = Duration::from_millis(200);
        pending.register(1, WriteInfo { answered: Some(lag), ..info() }, vec![2], false, now, |_| true);
        pending.register(2, info(), vec![2], false, now, |_| true);
        assert!(pending.expire(now + lag * 2, REPLICATION_TIMEOUT, |_, _| false).is_empty(), "the floor");
        let later = now + ANSWERED_WAIT_FLOOR + Duration::from_millis(1);
        let given_up = pending.expire(later, REPLICATION_TIMEOUT, |_, _| false);
        assert_eq!(given_up.iter().map(|f| (f.txid, f.failed)).collect::<Vec<_>>(), vec![(1, true)]);
        assert!(!pending.is_empty(), "the strong write waits for the replication timeout");
    }
}
