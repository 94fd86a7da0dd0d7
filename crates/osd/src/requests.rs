//! Recently seen request ids of one PG, so that a resent mutation is
//! answered without being applied twice (DESIGN.md §2: the client resends
//! in-flight requests to the new primary with the same id).
//!
//! Every logged entry carries its request id, so any OSD that logged it, as
//! primary or replica, or found it in its log at start, knows it. The table
//! is bounded: it forgets the oldest ids first. A client resends within its
//! request timeout, while the table holds the last [`TRACKED_REQUESTS`]
//! mutations of the PG.

use std::collections::{HashMap, VecDeque};

use duplex_oplog::RequestId;

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
    states: HashMap<RequestId, RequestState>,
    order: VecDeque<RequestId>,
}

impl RequestTable {
    pub fn get(&self, id: RequestId) -> Option<RequestState> {
        self.states.get(&id).copied()
    }

    /// Records `id` in `state`; ids without a client are not tracked.
    pub fn set(&mut self, id: RequestId, state: RequestState) {
        if id.is_none() {
            return;
        }
        if self.states.insert(id, state).is_none() {
            self.order.push_back(id);
            if self.order.len() > TRACKED_REQUESTS {
                let oldest = self.order.pop_front().expect("longer than the bound");
                self.states.remove(&oldest);
            }
        }
        debug_assert_eq!(self.states.len(), self.order.len(), "every tracked id is in the eviction order once");
    }

    /// Ends an in-flight request (a later state, set meanwhile, wins).
    pub fn finish(&mut self, id: RequestId, committed: bool) {
        if let Some(state) = self.states.get_mut(&id) {
            if *state == RequestState::InFlight {
                *state = if committed { RequestState::Committed } else { RequestState::Failed };
            }
        }
    }

    /// Peering brought every member to this OSD's history: each request
    /// whose entry this OSD logged is in every member's store now, however
    /// its primary answered it. A resend must be answered Ok, not run
    /// again: run again, it would land after writes that came in between,
    /// and a value already read would come back.
    pub fn commit_all(&mut self) {
        for state in self.states.values_mut() {
            *state = RequestState::Committed;
        }
    }

    pub fn len(&self) -> usize {
        self.order.len()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(tid: u64) -> RequestId {
        RequestId { client: 7, tid }
    }

    #[test]
    fn tracks_states_and_forgets_the_oldest() {
        let mut table = RequestTable::default();
        table.set(RequestId::default(), RequestState::Committed);
        assert!(table.is_empty(), "ids without a client are not tracked");
        table.set(id(1), RequestState::InFlight);
        table.finish(id(1), true);
        assert_eq!(table.get(id(1)), Some(RequestState::Committed));
        table.finish(id(1), false);
        assert_eq!(table.get(id(1)), Some(RequestState::Committed), "only in-flight requests finish");
        table.set(id(2), RequestState::InFlight);
        table.finish(id(2), false);
        assert_eq!(table.get(id(2)), Some(RequestState::Failed));
        for tid in 3..TRACKED_REQUESTS as u64 + 3 {
            table.set(id(tid), RequestState::Committed);
        }
        assert_eq!(table.len(), TRACKED_REQUESTS);
        assert_eq!(table.get(id(1)), None);
        assert_eq!(table.get(id(2)), None);
        assert_eq!(table.get(id(3)), Some(RequestState::Committed));
    }
}
