//! Watches: clients' long polls on an object ([`OpKind::Watch`]).
//!
//! The gateways of an image watch its header, so that `snap create`
//! reaches them at once instead of at their next renewal, and `snap
//! create` watches it for their acknowledgements. A waiter is registered
//! at the object's primary and answered through the mailbox of the
//! priority thread owning its connection: woken (`[1]`) by the first
//! mutation of the object this OSD accepts, whichever thread accepted
//! it, or timed out (`[0]`) by its own thread. A watch takes no reply
//! slot on its connection (replies go out in request order, and a long
//! poll would hold back every reply after it): its answer goes out
//! whenever it comes, with its transaction id.
//!
//! Nothing waits on a watch for correctness: the watchers renew and poll
//! anyway, and a watch only makes news arrive sooner. So a waiter whose
//! connection closed is answered into the void, one left at a primary
//! that lost its PG times out, and past [`MAX_WAITERS`] (or in the
//! simulator, whose clients do not watch and which connects no mailboxes)
//! a watch is answered at once as timed out.
//!
//! While nobody watches, a mutation pays one atomic load.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};

use crate::messages::{Completion, Mailbox};

/// Waiters one OSD holds at most.
pub const MAX_WAITERS: usize = 4096;

/// Watches a mutation woke, held until it is accepted ([`Watchers::settle`]).
pub struct Woken {
    key: (u32, u32),
    waiters: Vec<Waiter>,
}

/// A registered watch, and where its answer goes.
struct Waiter {
    thread: usize,
    token: usize,
    txid: u64,
    object: Bytes,
    /// Attribute changes wake it only if their name starts with this.
    prefix: Bytes,
    deadline: Instant,
}

/// The watches of one OSD, shared by all its threads.
#[derive(Default)]
pub struct Watchers {
    count: AtomicUsize,
    by_pg: Mutex<HashMap<(u32, u32), Vec<Waiter>>>,
    mailboxes: OnceLock<Vec<Mailbox>>,
}

/// A watch's answer: woken by a mutation, or its time ran out.
pub fn answer(woken: bool, map_epoch: u64) -> OpReply {
    OpReply { status: Status::Ok, map_epoch, data: Bytes::from_static(if woken { &[1] } else { &[0] }) }
}

impl Watchers {
    /// Where answers go: the priority threads' mailboxes, by thread index.
    pub fn connect(&self, mailboxes: Vec<Mailbox>) {
        let _ = self.mailboxes.set(mailboxes);
    }

    /// Whether any watch waits (cheap: one atomic load).
    pub fn any(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Registers `request`, a watch that arrived as transaction `txid` on
    /// connection `token` of priority thread `thread`; false when it cannot
    /// wait here (answer it at once as timed out).
    pub fn add(&self, thread: usize, token: usize, txid: u64, request: &OpRequest, now: Instant) -> bool {
        debug_assert_eq!(request.kind, OpKind::Watch);
        let connected = self.mailboxes.get().is_some_and(|mailboxes| thread < mailboxes.len());
        if !connected || self.count.load(Ordering::Relaxed) >= MAX_WAITERS {
            return false;
        }
        let waiter = Waiter {
            thread,
            token,
            txid,
            object: request.object.clone(),
            prefix: request.data.clone(),
            deadline: now + Duration::from_millis(request.offset),
        };
        let mut by_pg = self.by_pg.lock().unwrap_or_else(|p| p.into_inner());
        by_pg.entry((request.pool, request.pg)).or_default().push(waiter);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.check_count(&by_pg);
        true
    }

    /// The watches `request` wakes, a mutation about to be submitted here
    /// as its PG's primary: taken out now (the request is borrowed, not
    /// copied), answered by [`Watchers::settle`] once it is accepted.
    pub fn woken_by(&self, request: &OpRequest) -> Woken {
        let key = (request.pool, request.pg);
        if !self.any() {
            return Woken { key, waiters: Vec::new() };
        }
        debug_assert!(request.kind.is_mutation(), "{:?} changes nothing", request.kind);
        let attribute = match request.kind {
            OpKind::SetAttr => request.data.get(..request.offset as usize),
            OpKind::RemoveAttr => Some(&request.data[..]),
            _ => None,
        };
        let wakes = |waiter: &mut Waiter| {
            waiter.object == request.object && attribute.is_none_or(|name| name.starts_with(&waiter.prefix))
        };
        let mut by_pg = self.by_pg.lock().unwrap_or_else(|p| p.into_inner());
        let Some(waiters) = by_pg.get_mut(&key) else { return Woken { key, waiters: Vec::new() } };
        let woken: Vec<Waiter> = waiters.extract_if(.., wakes).collect();
        if waiters.is_empty() {
            by_pg.remove(&key);
        }
        self.count.fetch_sub(woken.len(), Ordering::Relaxed);
        self.check_count(&by_pg);
        Woken { key, waiters: woken }
    }

    /// Answers the watches a mutation woke if it was `accepted`; puts them
    /// back to wait otherwise (it was refused, or parked for room).
    pub fn settle(&self, woken: Woken, accepted: bool, map_epoch: u64) {
        if woken.waiters.is_empty() {
            return;
        }
        if accepted {
            return self.answer_all(woken.waiters, true, map_epoch);
        }
        let mut by_pg = self.by_pg.lock().unwrap_or_else(|p| p.into_inner());
        self.count.fetch_add(woken.waiters.len(), Ordering::Relaxed);
        by_pg.entry(woken.key).or_default().extend(woken.waiters);
        self.check_count(&by_pg);
    }

    /// Answers the watches of priority thread `thread` whose time ran out.
    pub fn expire(&self, thread: usize, now: Instant, map_epoch: u64) {
        if !self.any() {
            return;
        }
        let mut expired = Vec::new();
        {
            let mut by_pg = self.by_pg.lock().unwrap_or_else(|p| p.into_inner());
            by_pg.retain(|_, waiters| {
                expired.extend(waiters.extract_if(.., |w| w.thread == thread && w.deadline <= now));
                !waiters.is_empty()
            });
            self.count.fetch_sub(expired.len(), Ordering::Relaxed);
            self.check_count(&by_pg);
        }
        self.answer_all(expired, false, map_epoch);
    }

    /// The count is the waiters held (debug builds; at most MAX_WAITERS).
    fn check_count(&self, by_pg: &HashMap<(u32, u32), Vec<Waiter>>) {
        debug_assert_eq!(
            self.count.load(Ordering::Relaxed),
            by_pg.values().map(Vec::len).sum::<usize>(),
            "the watch count drifted from the watches held"
        );
        debug_assert!(by_pg.values().all(|waiters| !waiters.is_empty()), "an empty list of watches kept");
    }

    fn answer_all(&self, waiters: Vec<Waiter>, woken: bool, map_epoch: u64) {
        let Some(mailboxes) = self.mailboxes.get() else { return };
        for waiter in waiters {
            let frame = answer(woken, map_epoch).to_frame(waiter.txid);
            mailboxes[waiter.thread].post_and_wake(Completion::Send { token: waiter.token, frame });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(kind: OpKind, object: &'static [u8], offset: u64, data: &'static [u8]) -> OpRequest {
        OpRequest {
            kind,
            pool: 1,
            pg: 3,
            map_epoch: 1,
            object: Bytes::from_static(object),
            offset,
            length: data.len() as u32,
            data: Bytes::from_static(data),
            client: 7,
            snap: 0,
        }
    }

    /// Mailboxes whose completions the test reads back.
    fn connected() -> (Watchers, crossbeam_channel::Receiver<Completion>) {
        let poll = mio::Poll::new().unwrap();
        let (mailbox, inbox) = Mailbox::new(mio::Waker::new(poll.registry(), mio::Token(1)).unwrap());
        let watchers = Watchers::default();
        watchers.connect(vec![mailbox]);
        (watchers, inbox)
    }

    /// (txid, reply data) of each answer posted.
    fn answers(inbox: &crossbeam_channel::Receiver<Completion>) -> Vec<(u64, Bytes)> {
        inbox
            .try_iter()
            .map(|completion| match completion {
                Completion::Send { frame, .. } => {
                    let reply = OpReply::decode(&frame.payload).expect("a reply");
                    (frame.header.transaction_id, reply.data)
                }
                _ => panic!("a watch is answered with a frame of its own"),
            })
            .collect()
    }

    #[test]
    fn a_mutation_of_the_object_wakes_its_watches_and_nothing_else_does() {
        let (watchers, inbox) = connected();
        let now = Instant::now();
        assert!(watchers.add(0, 9, 1, &request(OpKind::Watch, b"header", 5000, b"snap."), now));
        assert!(watchers.add(0, 9, 2, &request(OpKind::Watch, b"header", 5000, b"watch."), now));
        assert!(watchers.add(0, 9, 3, &request(OpKind::Watch, b"other", 5000, b""), now));
        // Another object, and an attribute neither prefix names: nobody.
        watchers.settle(watchers.woken_by(&request(OpKind::Write, b"data", 0, b"x")), true, 4);
        watchers.settle(watchers.woken_by(&request(OpKind::SetAttr, b"header", 4, b"lockvalue")), true, 4);
        assert!(answers(&inbox).is_empty());
        // A watcher's renewal wakes the one watching "watch." only.
        watchers.settle(watchers.woken_by(&request(OpKind::SetAttr, b"header", 8, b"watch.01counter")), true, 4);
        assert_eq!(answers(&inbox), vec![(2, Bytes::from_static(&[1]))]);
        // A write of the header's data wakes every watch on it.
        // A write the primary refused (or parked) wakes nobody: its watches wait on.
        let refused = watchers.woken_by(&request(OpKind::Write, b"header", 4096, b"table"));
        watchers.settle(refused, false, 4);
        assert!(answers(&inbox).is_empty());
        watchers.settle(watchers.woken_by(&request(OpKind::Write, b"header", 4096, b"table")), true, 4);
        assert_eq!(answers(&inbox), vec![(1, Bytes::from_static(&[1]))]);
        assert!(watchers.any(), "the watch on the other object still waits");
        watchers.settle(watchers.woken_by(&request(OpKind::RemoveAttr, b"other", 0, b"anything")), true, 4);
        assert_eq!(answers(&inbox), vec![(3, Bytes::from_static(&[1]))]);
        assert!(!watchers.any());
    }

    #[test]
    fn a_watch_times_out_on_its_own_thread_and_a_full_or_unconnected_table_refuses() {
        let (watchers, inbox) = connected();
        let now = Instant::now();
        assert!(watchers.add(0, 9, 1, &request(OpKind::Watch, b"header", 100, b""), now));
        watchers.expire(0, now + Duration::from_millis(99), 4);
        assert!(answers(&inbox).is_empty(), "not yet");
        watchers.expire(0, now + Duration::from_millis(100), 4);
        assert_eq!(answers(&inbox), vec![(1, Bytes::from_static(&[0]))]);
        assert!(!watchers.any());
        for slot in 0..MAX_WAITERS as u64 {
            assert!(watchers.add(0, 9, slot, &request(OpKind::Watch, b"header", 100, b""), now));
        }
        assert!(!watchers.add(0, 9, 0, &request(OpKind::Watch, b"header", 100, b""), now), "full");
        assert!(!watchers.add(5, 9, 0, &request(OpKind::Watch, b"header", 100, b""), now), "no such thread");
        let unconnected = Watchers::default();
        assert!(!unconnected.add(0, 9, 0, &request(OpKind::Watch, b"header", 100, b""), now));
    }
}
