//! One mutation at a time per object of an erasure-coded PG.
//!
//! A partial-stripe write reads the old bytes of its stripe from the shards
//! before it can say what each shard logs. If another write to the same
//! stripe took its place in the log between that read and its own append,
//! the parity it computed would be of data that is gone: a torn stripe no
//! log replay could mend. So the primary lets one mutation of an object
//! run, from its first shard read to the last shard's acknowledgement, and
//! queues the others behind it in arrival order; each one finished hands
//! the object to the next.
//!
//! Generic over what waits (`T`: the OSD queues client operations), so it
//! sits below the modules that define them and is tested on its own.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

/// The objects (by PG key and name) with a mutation under way, and the
/// mutations waiting for each.
#[derive(Debug)]
pub struct ObjectQueue<T> {
    busy: HashMap<(u32, Bytes), VecDeque<T>>,
}

impl<T> Default for ObjectQueue<T> {
    fn default() -> Self {
        ObjectQueue { busy: HashMap::new() }
    }
}

/// Waiting operations a whole queue may hold: past it, [`ObjectQueue::enter`]
/// refuses (the client backs off and resends).
pub const MAX_WAITING_PER_OBJECT: usize = 1024;

/// What [`ObjectQueue::enter`] did with an operation.
#[derive(Debug, PartialEq, Eq)]
pub enum Entered<T> {
    /// The object was free: the operation runs now and holds it.
    Run(T),
    /// Queued behind the mutation under way.
    Queued,
    /// Too many wait already: answer it `Retry`.
    Full(T),
}

impl<T> ObjectQueue<T> {
    /// `op` wants to mutate `object` of PG `pg`.
    pub fn enter(&mut self, pg: u32, object: &Bytes, op: T) -> Entered<T> {
        match self.busy.get_mut(&(pg, object.clone())) {
            None => {
                self.busy.insert((pg, object.clone()), VecDeque::new());
                Entered::Run(op)
            }
            Some(waiting) if waiting.len() >= MAX_WAITING_PER_OBJECT => Entered::Full(op),
            Some(waiting) => {
                waiting.push_back(op);
                Entered::Queued
            }
        }
    }

    /// The mutation holding `object` ended (done, failed or refused after
    /// it entered): the next waiting one, which now holds it, if any.
    pub fn leave(&mut self, pg: u32, object: &Bytes) -> Option<T> {
        let key = (pg, object.clone());
        let waiting = self.busy.get_mut(&key);
        debug_assert!(waiting.is_some(), "a mutation left an object it never held");
        let next = waiting?.pop_front();
        if next.is_none() {
            self.busy.remove(&key);
        }
        next
    }

    /// Whether a mutation of `object` is under way.
    pub fn is_busy(&self, pg: u32, object: &Bytes) -> bool {
        self.busy.contains_key(&(pg, object.clone()))
    }

    /// Objects held.
    pub fn held(&self) -> usize {
        self.busy.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_mutation_runs_per_object_and_the_next_follows_in_arrival_order() {
        let mut queue = ObjectQueue::default();
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        assert_eq!(queue.enter(1, &a, 1), Entered::Run(1));
        assert_eq!(queue.enter(1, &b, 2), Entered::Run(2), "another object is free");
        assert_eq!(queue.enter(2, &a, 3), Entered::Run(3), "the same name in another PG is another object");
        assert_eq!(queue.enter(1, &a, 4), Entered::Queued);
        assert_eq!(queue.enter(1, &a, 5), Entered::Queued);
        assert!(queue.is_busy(1, &a));
        assert_eq!(queue.leave(1, &a), Some(4), "the first waiting one now holds it");
        assert_eq!(queue.leave(1, &a), Some(5));
        assert_eq!(queue.leave(1, &a), None);
        assert!(!queue.is_busy(1, &a), "freed when nobody waits");
        assert_eq!(queue.enter(1, &a, 6), Entered::Run(6));
        assert_eq!(queue.held(), 3);
    }

    #[test]
    fn a_full_queue_refuses_rather_than_grows() {
        let mut queue = ObjectQueue::default();
        let a = Bytes::from_static(b"a");
        assert_eq!(queue.enter(1, &a, 0), Entered::Run(0));
        for op in 1..=MAX_WAITING_PER_OBJECT {
            assert_eq!(queue.enter(1, &a, op), Entered::Queued);
        }
        assert_eq!(queue.enter(1, &a, 9999), Entered::Full(9999));
    }
}
