//! Recently seen request ids of one PG, so that a resent mutation is
//! answered without being applied twice (DESIGN.md §2: the client resends
//! in-flight requests to the new primary with the same id).
//!
//! Every logged entry carries its request id, so any OSD that logged it, as
//! primary or replica, or found it in its log at start, knows it. Peering
//! carries the ids across members: each reports its table, and every member
//! activates with the ids of the members whose log is a prefix of the
//! authoritative history (docs/RELIABILITY.md, "Duplicate requests"). So a
//! member rebuilt by recovery, or restarted with a flushed log, still
//! answers a resend of a write it never saw as that write's primary.
//!
//! The table is bounded: it forgets the oldest ids (by log seq) first. A
//! client resends within its request timeout, while the table holds the
//! last [`TRACKED_REQUESTS`] mutations of the PG.

use std::collections::{BTreeMap, HashMap, VecDeque};

use duplex_oplog::RequestId;
use duplex_proto::peering::LoggedRequest;

/// Request ids remembered per PG.
pub const TRACKED_REQUESTS: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestState {
    /// This OSD is primary and the replicas have not all acknowledged yet.
    InFlight,
    /// In every replica's log as far as this OSD knows: a resend is answered Ok.
    Committed,
    /// The primary answered the client with an error: a resend runs again.
    Failed,
}

#[derive(Debug, Default)]
pub struct RequestTable {
    /// Each id's state and the seq of its entry.
    states: HashMap<RequestId, (RequestState, u64)>,
    /// The ids by seq, for eviction (a seq names one entry of one history).
    by_seq: BySeq,
}

/// Ids by seq, sorted, with no seq twice: a log's seqs come in order, so
/// nearly every insert is a push at the back and every eviction a pop at
/// the front, where a B-tree searched and rebalanced on each write (4.6%
/// of an OSD's CPU under 4 KiB random writes, session 40).
#[derive(Debug, Default)]
struct BySeq(VecDeque<(u64, RequestId)>);

impl BySeq {
    fn find(&self, seq: u64) -> Result<usize, usize> {
        // A log's seqs are consecutive but for rollbacks and reruns: the
        // seq's distance from the first is nearly always its place.
        if let Some(at) = self.0.front().and_then(|(first, _)| usize::try_from(seq.checked_sub(*first)?).ok()) {
            if self.0.get(at).is_some_and(|(s, _)| *s == seq) {
                return Ok(at);
            }
        }
        self.0.binary_search_by_key(&seq, |(s, _)| *s)
    }

    /// Puts `id` at `seq`; returns the id that was there.
    fn insert(&mut self, seq: u64, id: RequestId) -> Option<RequestId> {
        if self.0.back().is_none_or(|(last, _)| *last < seq) {
            // A full table holds one past its bound until `set` evicts:
            // room for exactly that, not a doubling.
            if self.0.len() == self.0.capacity() && self.0.len() >= TRACKED_REQUESTS {
                self.0.reserve_exact(1);
            }
            self.0.push_back((seq, id));
            return None;
        }
        match self.find(seq) {
            Ok(at) => Some(std::mem::replace(&mut self.0[at].1, id)),
            Err(at) => {
                self.0.insert(at, (seq, id));
                None
            }
        }
    }

    fn remove(&mut self, seq: u64) {
        if let Ok(at) = self.find(seq) {
            self.0.remove(at);
        }
    }

    fn get(&self, seq: u64) -> Option<RequestId> {
        self.find(seq).ok().map(|at| self.0[at].1)
    }

    fn pop_first(&mut self) -> Option<(u64, RequestId)> {
        self.0.pop_front()
    }

    /// Removes and returns the ids at `first` and after.
    fn split_off(&mut self, first: u64) -> VecDeque<(u64, RequestId)> {
        let at = self.0.partition_point(|(seq, _)| *seq < first);
        self.0.split_off(at)
    }

    fn iter(&self) -> impl Iterator<Item = &(u64, RequestId)> {
        self.0.iter()
    }

    fn len(&self) -> usize {
        self.0.len()
    }
}

impl RequestTable {
    pub fn get(&self, id: RequestId) -> Option<RequestState> {
        self.states.get(&id).map(|(state, _)| *state)
    }

    /// Records `id`, whose entry has `seq`, in `state`; ids without a
    /// client are not tracked. An id seen again (a resend that runs once
    /// more after a failure) moves to its new seq.
    pub fn set(&mut self, id: RequestId, state: RequestState, seq: u64) {
        if id.is_none() {
            return;
        }
        if let Some((_, old_seq)) = self.states.insert(id, (state, seq)) {
            self.by_seq.remove(old_seq);
        }
        if let Some(displaced) = self.by_seq.insert(seq, id) {
            // Another id at this seq: a log rolled back and reused it.
            if displaced != id {
                self.states.remove(&displaced);
            }
        }
        while self.by_seq.len() > TRACKED_REQUESTS {
            let (_, oldest) = self.by_seq.pop_first().expect("longer than the bound");
            self.states.remove(&oldest);
        }
        debug_assert_eq!(self.states.len(), self.by_seq.len(), "every tracked id is at one seq");
        debug_assert!(self.by_seq.len() <= TRACKED_REQUESTS, "the table outgrew its bound");
    }

    /// Forgets the ids of entries after seq `after` (rolled back: a resend
    /// of one of them runs again).
    pub fn forget_after(&mut self, after: u64) {
        let Some(first) = after.checked_add(1) else { return };
        for (_, id) in self.by_seq.split_off(first) {
            self.states.remove(&id);
        }
        debug_assert_eq!(self.states.len(), self.by_seq.len(), "every tracked id is at one seq");
    }

    /// Ends an in-flight request (a later state, set meanwhile, wins).
    pub fn finish(&mut self, id: RequestId, committed: bool) {
        if let Some((state, _)) = self.states.get_mut(&id) {
            if *state == RequestState::InFlight {
                *state = if committed { RequestState::Committed } else { RequestState::Failed };
            }
        }
    }

    /// What this member reports to peering: every id it logged, with its
    /// seq. Whether they count is peering's call: they do when this log is
    /// a prefix of the authoritative history, whatever state they are in here.
    pub fn logged(&self) -> Vec<LoggedRequest> {
        self.by_seq.iter().map(|(seq, id)| LoggedRequest { client: id.client, tid: id.tid, seq: *seq }).collect()
    }

    /// Peering's end: the ids whose entries are in the authoritative
    /// history, and so in every member's store now, however a primary
    /// answered them. A resend of one is answered Ok, not run again: run
    /// again, it would land after writes that came in between, and a value
    /// already read would come back. Ids this member logged that are not
    /// among them were rolled back with its divergent log, and are forgotten.
    pub fn replace(&mut self, committed: &[LoggedRequest]) {
        *self = RequestTable::default();
        for request in in_seq_order(committed).iter() {
            self.set(RequestId { client: request.client, tid: request.tid }, RequestState::Committed, request.seq);
        }
        debug_assert!(
            self.states.values().all(|(state, _)| *state == RequestState::Committed),
            "an id of the authoritative history that is not committed"
        );
    }

    /// The id of the entry at `seq`, if this table tracks it.
    pub fn at_seq(&self, seq: u64) -> Option<RequestId> {
        self.by_seq.get(seq)
    }

    /// Adds ids the store kept for entries flushed before this OSD started
    /// (stored_requests.rs): as committed, as the log's own are at start.
    /// The log's ids win: an id or a seq the table already has is skipped.
    pub fn load(&mut self, stored: &[LoggedRequest]) {
        for request in in_seq_order(stored).iter() {
            let id = RequestId { client: request.client, tid: request.tid };
            if !self.states.contains_key(&id) && self.by_seq.get(request.seq).is_none() {
                self.set(id, RequestState::Committed, request.seq);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_seq.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_seq.len() == 0
    }
}

/// Merges the ids several members logged (logs that are prefixes of one
/// history agree on each seq): the newest [`TRACKED_REQUESTS`], by seq.
pub fn merge_logged<'a>(tables: impl IntoIterator<Item = &'a [LoggedRequest]>) -> Vec<LoggedRequest> {
    let mut by_seq: BTreeMap<u64, LoggedRequest> = BTreeMap::new();
    for table in tables {
        for request in table {
            by_seq.insert(request.seq, *request);
        }
    }
    let skip = by_seq.len().saturating_sub(TRACKED_REQUESTS);
    let merged: Vec<LoggedRequest> = by_seq.into_values().skip(skip).collect();
    debug_assert!(merged.len() <= TRACKED_REQUESTS, "more merged ids than a table tracks");
    debug_assert!(merged.windows(2).all(|w| w[0].seq < w[1].seq), "merged ids are one per seq, in seq order");
    merged
}

/// `requests` in seq order, so that each goes in at the deque's back:
/// as given when they already are (every caller's list is), else a
/// sorted copy (stable: of two at one seq the later still wins).
fn in_seq_order(requests: &[LoggedRequest]) -> std::borrow::Cow<'_, [LoggedRequest]> {
    if requests.is_sorted_by_key(|request| request.seq) {
        return std::borrow::Cow::Borrowed(requests);
    }
    let mut sorted = requests.to_vec();
    sorted.sort_by_key(|request| request.seq);
    std::borrow::Cow::Owned(sorted)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(tid: u64) -> RequestId {
        RequestId { client: 7, tid }
    }

    proptest::proptest! {
        /// The sorted deque answers as the B-tree it replaced, over mostly
        /// rising seqs with rewinds (rollbacks), removals and evictions.
        #[test]
        fn ids_by_seq_behave_as_a_sorted_map(ops in proptest::collection::vec((0u8..6, 0u64..12), 0..300)) {
            let (mut deque, mut model) = (BySeq::default(), BTreeMap::new());
            let mut next = 1u64;
            for (op, n) in ops {
                match op {
                    0 | 1 => {
                        next += n % 3;
                        proptest::prop_assert_eq!(deque.insert(next, id(n)), model.insert(next, id(n)));
                    }
                    2 => {
                        let seq = next.saturating_sub(n);
                        proptest::prop_assert_eq!(deque.insert(seq, id(n)), model.insert(seq, id(n)));
                    }
                    3 => {
                        let seq = next.saturating_sub(n);
                        deque.remove(seq);
                        model.remove(&seq);
                    }
                    4 => proptest::prop_assert_eq!(deque.pop_first(), model.pop_first()),
                    _ => {
                        let first = next.saturating_sub(n);
                        let cut: Vec<_> = deque.split_off(first).into_iter().collect();
                        let model_cut: Vec<_> = model.split_off(&first).into_iter().collect();
                        proptest::prop_assert_eq!(cut, model_cut);
                    }
                }
                proptest::prop_assert_eq!(deque.len(), model.len());
                proptest::prop_assert!(deque.iter().copied().eq(model.iter().map(|(s, i)| (*s, *i))));
                for seq in 0..next + 2 {
                    proptest::prop_assert_eq!(deque.get(seq), model.get(&seq).copied());
                }
            }
        }
    }

    #[test]
    fn tracks_states_and_forgets_the_oldest() {
        let mut table = RequestTable::default();
        table.set(RequestId::default(), RequestState::Committed, 1);
        assert!(table.is_empty(), "ids without a client are not tracked");
        table.set(id(1), RequestState::InFlight, 1);
        table.finish(id(1), true);
        assert_eq!(table.get(id(1)), Some(RequestState::Committed));
        table.finish(id(1), false);
        assert_eq!(table.get(id(1)), Some(RequestState::Committed), "only in-flight requests finish");
        table.set(id(2), RequestState::InFlight, 2);
        table.finish(id(2), false);
        assert_eq!(table.get(id(2)), Some(RequestState::Failed));
        for tid in 3..TRACKED_REQUESTS as u64 + 3 {
            table.set(id(tid), RequestState::Committed, tid);
        }
        assert_eq!(table.len(), TRACKED_REQUESTS);
        assert_eq!(table.get(id(1)), None);
        assert_eq!(table.get(id(2)), None);
        assert_eq!(table.get(id(3)), Some(RequestState::Committed));
    }

    #[test]
    fn a_rerun_moves_to_its_new_seq_and_a_reused_seq_displaces_the_old_id() {
        let mut table = RequestTable::default();
        table.set(id(1), RequestState::Failed, 5);
        table.set(id(1), RequestState::InFlight, 9);
        assert_eq!(table.len(), 1);
        assert_eq!(table.logged(), vec![LoggedRequest { client: 7, tid: 1, seq: 9 }]);
        table.set(id(2), RequestState::Committed, 9);
        assert_eq!(table.get(id(1)), None, "seq 9 now holds another entry");
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn replace_keeps_exactly_the_given_ids_as_committed() {
        let mut table = RequestTable::default();
        table.set(id(1), RequestState::InFlight, 1);
        table.set(id(2), RequestState::Failed, 2);
        table.replace(&[LoggedRequest { client: 7, tid: 2, seq: 2 }, LoggedRequest { client: 7, tid: 3, seq: 3 }]);
        assert_eq!(table.get(id(1)), None, "rolled back");
        assert_eq!(table.get(id(2)), Some(RequestState::Committed), "failed here, yet in the history");
        assert_eq!(table.get(id(3)), Some(RequestState::Committed), "logged by another member");
    }

    #[test]
    fn loading_stored_ids_never_overrides_the_logs() {
        let mut table = RequestTable::default();
        table.set(id(1), RequestState::Committed, 10);
        table.load(&[
            LoggedRequest { client: 7, tid: 1, seq: 4 },
            LoggedRequest { client: 7, tid: 2, seq: 10 },
            LoggedRequest { client: 7, tid: 3, seq: 5 },
        ]);
        assert_eq!(table.at_seq(10), Some(id(1)), "the log's entry at seq 10 stays");
        assert_eq!(table.at_seq(4), None, "id 1 is at seq 10, per the log");
        assert_eq!(table.get(id(2)), None);
        assert_eq!(table.get(id(3)), Some(RequestState::Committed));
        assert_eq!(table.at_seq(5), Some(id(3)));
    }

    #[test]
    fn merging_keeps_the_newest_ids_by_seq() {
        let a: Vec<LoggedRequest> = (1..=10).map(|seq| LoggedRequest { client: 1, tid: seq, seq }).collect();
        let b: Vec<LoggedRequest> =
            (5..=TRACKED_REQUESTS as u64 + 20).map(|seq| LoggedRequest { client: 1, tid: seq, seq }).collect();
        let merged = merge_logged([&a[..], &b[..]]);
        assert_eq!(merged.len(), TRACKED_REQUESTS);
        assert_eq!(merged.first().map(|r| r.seq), Some(21));
        assert_eq!(merged.last().map(|r| r.seq), Some(TRACKED_REQUESTS as u64 + 20));
        assert!(merged.windows(2).all(|w| w[0].seq < w[1].seq));
    }
}
