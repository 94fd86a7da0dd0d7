//! One mutation at a time per object of an erasure-coded PG; reads
//! together.
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
//! A read holds its object too, against mutations (a write admitted after
//! it could reach one shard before the read and another after, and the
//! read would return half of a write that may yet be rolled back), but
//! not against other reads: reads of an object run together while no
//! mutation holds it or waits for it (a waiting mutation is not overtaken,
//! so a stream of reads cannot starve it). Eight 128 KiB reads of one
//! object in flight ran one at a time before (session 21's figures).
//!
//! Generic over what waits (`T`: the OSD queues client operations), so it
//! sits below the modules that define them and is tested on its own.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

/// Who holds an object, and who waits for it (with whether each is a read).
#[derive(Debug)]
struct Held<T> {
    /// Reads running (0 while a mutation holds it).
    readers: usize,
    waiting: VecDeque<(T, Access)>,
}

/// How an operation holds its object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// A read: together with other reads.
    Shared,
    /// A mutation: alone.
    Exclusive,
}

/// The objects (by PG key and name) an operation holds, and the operations
/// waiting for each.
#[derive(Debug)]
pub struct ObjectQueue<T> {
    busy: HashMap<(u32, Bytes), Held<T>>,
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
    /// The operation runs now and holds the object.
    Run(T),
    /// Queued behind the operations under way.
    Queued,
    /// Too many wait already: answer it `Retry`.
    Full(T),
}

impl<T> ObjectQueue<T> {
    /// `op` wants `object` of PG `pg`, as `access` says.
    pub fn enter(&mut self, pg: u32, object: &Bytes, op: T, access: Access) -> Entered<T> {
        match self.busy.get_mut(&(pg, object.clone())) {
            None => {
                let readers = usize::from(access == Access::Shared);
                self.busy.insert((pg, object.clone()), Held { readers, waiting: VecDeque::new() });
                Entered::Run(op)
            }
            Some(held) if access == Access::Shared && held.readers > 0 && held.waiting.is_empty() => {
                held.readers += 1;
                Entered::Run(op)
            }
            Some(held) if held.waiting.len() >= MAX_WAITING_PER_OBJECT => Entered::Full(op),
            Some(held) => {
                held.waiting.push_back((op, access));
                Entered::Queued
            }
        }
    }

    /// An operation holding `object` ended (done, failed or refused after
    /// it entered): those waiting that hold it now, if it came free (the
    /// next mutation alone, or the reads next in line together).
    pub fn leave(&mut self, pg: u32, object: &Bytes) -> Vec<T> {
        let key = (pg, object.clone());
        let Some(held) = self.busy.get_mut(&key) else {
            debug_assert!(false, "an operation left an object it never held");
            return Vec::new();
        };
        if held.readers > 1 {
            held.readers -= 1;
            return Vec::new();
        }
        held.readers = 0;
        let mut next = Vec::new();
        match held.waiting.pop_front() {
            None => {
                self.busy.remove(&key);
            }
            Some((op, Access::Exclusive)) => next.push(op),
            Some((op, Access::Shared)) => {
                next.push(op);
                while held.waiting.front().is_some_and(|(_, access)| *access == Access::Shared) {
                    next.extend(held.waiting.pop_front().map(|(op, _)| op));
                }
                held.readers = next.len();
            }
        }
        next
    }

    /// Whether an operation holds `object`.
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

    use Access::{Exclusive, Shared};

    #[test]
    fn one_mutation_runs_per_object_and_the_next_follows_in_arrival_order() {
        let mut queue = ObjectQueue::default();
        let (a, b) = (Bytes::from_static(b"a"), Bytes::from_static(b"b"));
        assert_eq!(queue.enter(1, &a, 1, Exclusive), Entered::Run(1));
        assert_eq!(queue.enter(1, &b, 2, Exclusive), Entered::Run(2), "another object is free");
        assert_eq!(queue.enter(2, &a, 3, Exclusive), Entered::Run(3), "the same name in another PG is another object");
        assert_eq!(queue.enter(1, &a, 4, Exclusive), Entered::Queued);
        assert_eq!(queue.enter(1, &a, 5, Exclusive), Entered::Queued);
        assert!(queue.is_busy(1, &a));
        assert_eq!(queue.leave(1, &a), vec![4], "the first waiting one now holds it");
        assert_eq!(queue.leave(1, &a), vec![5]);
        assert_eq!(queue.leave(1, &a), Vec::<i32>::new());
        assert!(!queue.is_busy(1, &a), "freed when nobody waits");
        assert_eq!(queue.enter(1, &a, 6, Exclusive), Entered::Run(6));
        assert_eq!(queue.held(), 3);
    }

    #[test]
    fn reads_share_an_object_but_never_with_a_mutation_nor_ahead_of_one_waiting() {
        let mut queue = ObjectQueue::default();
        let a = Bytes::from_static(b"a");
        assert_eq!(queue.enter(1, &a, 1, Shared), Entered::Run(1));
        assert_eq!(queue.enter(1, &a, 2, Shared), Entered::Run(2), "reads run together");
        assert_eq!(queue.enter(1, &a, 3, Exclusive), Entered::Queued, "a write waits for the reads");
        assert_eq!(queue.enter(1, &a, 4, Shared), Entered::Queued, "a read does not overtake a waiting write");
        assert_eq!(queue.enter(1, &a, 5, Shared), Entered::Queued);
        assert_eq!(queue.enter(1, &a, 6, Exclusive), Entered::Queued);
        assert_eq!(queue.leave(1, &a), Vec::<i32>::new(), "one read still runs");
        assert_eq!(queue.leave(1, &a), vec![3], "the last read out hands it to the write");
        assert_eq!(queue.enter(1, &a, 7, Shared), Entered::Queued);
        assert_eq!(queue.leave(1, &a), vec![4, 5], "the reads next in line, together, up to the next write");
        assert_eq!(queue.leave(1, &a), Vec::<i32>::new());
        assert_eq!(queue.leave(1, &a), vec![6]);
        assert_eq!(queue.leave(1, &a), vec![7]);
        assert_eq!(queue.enter(1, &a, 8, Shared), Entered::Run(8), "it joins the read running, none waits");
        assert_eq!(queue.leave(1, &a), Vec::<i32>::new());
        assert_eq!(queue.leave(1, &a), Vec::<i32>::new());
        assert!(!queue.is_busy(1, &a));
    }

    #[test]
    fn a_full_queue_refuses_rather_than_grows() {
        let mut queue = ObjectQueue::default();
        let a = Bytes::from_static(b"a");
        assert_eq!(queue.enter(1, &a, 0, Exclusive), Entered::Run(0));
        for op in 1..=MAX_WAITING_PER_OBJECT {
            assert_eq!(queue.enter(1, &a, op, Shared), Entered::Queued);
        }
        assert_eq!(queue.enter(1, &a, 9999, Shared), Entered::Full(9999));
    }
}
