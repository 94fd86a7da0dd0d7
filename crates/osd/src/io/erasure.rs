//! Erasure-coded operations at their primary, between the frames they send
//! and the answers they wait for (sans I/O, as [`crate::io::pending`]): a
//! task waits for its shard reads, then (a mutation) for every shard's
//! acknowledgement of its entry. A task is given up (`Retry` to its client)
//! when a member it waits for is lost, refuses, or has not answered within
//! the timeout, or when its PG moved to a newer interval.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use duplex_map::OsdId;
use duplex_proto::osd::{OpReply, OpRequest, Status};

use crate::messages::EcTask;

struct Waiting {
    task: Box<EcTask>,
    /// Each read's answer, by the read's index.
    answers: Vec<Option<OpReply>>,
    /// Members whose acknowledgement of the entry is still to come (empty
    /// while reading).
    acks: Vec<OsdId>,
    writing: bool,
    failed: bool,
    since: Instant,
}

/// What a task's answers came to.
pub enum Settled {
    /// Its reads are all in (`answers[i]` answers `task.reads[i]`).
    Read { task: Box<EcTask>, answers: Vec<OpReply> },
    /// A read failed: nothing was logged.
    ReadFailed { task: Box<EcTask> },
    /// Every shard answered its entry (`failed`: one did not log it).
    Written { task: Box<EcTask>, failed: bool },
}

#[derive(Default)]
pub struct EcTasks {
    tasks: HashMap<u64, Waiting>,
}

impl EcTasks {
    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty()
    }

    /// Registers `task` and sends its reads with `send`, which says whether
    /// it could. Returns it at once if it reads nothing, or a read could
    /// not be sent.
    pub fn start(
        &mut self,
        task: Box<EcTask>,
        now: Instant,
        mut send: impl FnMut(OsdId, &OpRequest) -> bool,
    ) -> Option<Settled> {
        let id = task.id;
        assert!(!self.tasks.contains_key(&id), "erasure-coded task {id} started twice");
        debug_assert!(
            task.reads.iter().enumerate().all(|(i, (osd, _))| !task.reads[..i].iter().any(|(o, _)| o == osd)),
            "two reads of one task to one member: their answers could not be told apart"
        );
        if task.reads.is_empty() {
            return Some(Settled::Read { task, answers: Vec::new() });
        }
        if !task.reads.iter().all(|(osd, request)| send(*osd, request)) {
            return Some(Settled::ReadFailed { task });
        }
        let answers = vec![None; task.reads.len()];
        self.tasks.insert(id, Waiting { task, answers, acks: Vec::new(), writing: false, failed: false, since: now });
        None
    }

    /// Member `osd` answered task `id`'s read. An answer nobody waits for
    /// (a task given up) is ignored.
    pub fn on_read(&mut self, id: u64, osd: OsdId, reply: OpReply) -> Option<Settled> {
        let waiting = self.tasks.get_mut(&id).filter(|w| !w.writing)?;
        let index = waiting.task.reads.iter().position(|(o, _)| *o == osd)?;
        // `Io`: a damaged block there. The answers still settle the task,
        // whose reply decodes around it (or whose mutation waits for the
        // PG's repair).
        if !matches!(reply.status, Status::Ok | Status::NotFound | Status::Io) {
            let waiting = self.tasks.remove(&id).expect("just found");
            return Some(Settled::ReadFailed { task: waiting.task });
        }
        waiting.answers[index] = Some(reply);
        if waiting.answers.iter().any(Option::is_none) {
            return None;
        }
        let waiting = self.tasks.remove(&id).expect("just found");
        let answers = waiting.answers.into_iter().map(|a| a.expect("all in")).collect();
        Some(Settled::Read { task: waiting.task, answers })
    }

    /// Task `task`'s entries went to `members` (each with `send`, which
    /// says whether it could): it waits for their acknowledgements.
    pub fn wait_for_acks(
        &mut self,
        task: Box<EcTask>,
        members: Vec<OsdId>,
        now: Instant,
        mut send: impl FnMut(OsdId) -> bool,
    ) -> Option<Settled> {
        let id = task.id;
        assert!(!self.tasks.contains_key(&id), "erasure-coded task {id} waits twice");
        let before = members.len();
        let mut acks = members;
        acks.retain(|osd| send(*osd));
        let failed = acks.len() < before;
        if acks.is_empty() {
            return Some(Settled::Written { task, failed });
        }
        self.tasks.insert(id, Waiting { task, answers: Vec::new(), acks, writing: true, failed, since: now });
        None
    }

    /// Member `osd` acknowledged task `id`'s entry (`ok`: it logged it).
    pub fn on_ack(&mut self, id: u64, osd: OsdId, ok: bool) -> Option<Settled> {
        let waiting = self.tasks.get_mut(&id).filter(|w| w.writing)?;
        let before = waiting.acks.len();
        waiting.acks.retain(|o| *o != osd);
        if waiting.acks.len() == before {
            return None;
        }
        waiting.failed |= !ok;
        if !waiting.acks.is_empty() {
            return None;
        }
        let waiting = self.tasks.remove(&id).expect("just found");
        Some(Settled::Written { task: waiting.task, failed: waiting.failed })
    }

    /// Whether task `id` waits (reads or acknowledgements): its answers
    /// come back on the replication connections under its id.
    pub fn waits(&self, id: u64) -> bool {
        self.tasks.contains_key(&id)
    }

    /// The connection to `osd` was lost: every task waiting on it ends.
    pub fn peer_lost(&mut self, osd: OsdId) -> Vec<Settled> {
        let ids: Vec<u64> = self
            .tasks
            .iter()
            .filter(|(_, w)| {
                if w.writing {
                    w.acks.contains(&osd)
                } else {
                    w.task.reads.iter().zip(&w.answers).any(|((o, _), a)| *o == osd && a.is_none())
                }
            })
            .map(|(id, _)| *id)
            .collect();
        self.give_up(ids)
    }

    /// Tasks waiting longer than `timeout`, or whose PG moved to a newer
    /// interval (`outlived(pg, map_epoch)`), end; in id order.
    pub fn expire(
        &mut self,
        now: Instant,
        timeout: Duration,
        mut outlived: impl FnMut(u32, u64) -> bool,
    ) -> Vec<Settled> {
        let mut ids: Vec<u64> = self
            .tasks
            .iter()
            .filter(|(_, w)| now.saturating_duration_since(w.since) > timeout || outlived(w.task.pg, w.task.map_epoch))
            .map(|(id, _)| *id)
            .collect();
        ids.sort_unstable();
        self.give_up(ids)
    }

    fn give_up(&mut self, ids: Vec<u64>) -> Vec<Settled> {
        ids.into_iter()
            .filter_map(|id| self.tasks.remove(&id))
            .map(|w| {
                tracing::warn!(
                    pg = w.task.pg,
                    writing = w.writing,
                    "an erasure-coded operation's members did not all answer; failing it"
                );
                if w.writing {
                    Settled::Written { task: w.task, failed: true }
                } else {
                    Settled::ReadFailed { task: w.task }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;
    use duplex_proto::osd::OpKind;

    use super::*;
    use crate::messages::{ClientOp, EcPiece, EcThen};

    fn request() -> OpRequest {
        OpRequest {
            kind: OpKind::ShardRead,
            pool: 1,
            pg: 0,
            map_epoch: 1,
            object: Bytes::from_static(b"o"),
            offset: 0,
            length: 4,
            data: Bytes::new(),
            client: 0,
            snap: 0,
        }
    }

    fn task(id: u64, reads: &[OsdId]) -> Box<EcTask> {
        Box::new(EcTask {
            id,
            op: ClientOp {
                thread: 0,
                token: 5,
                slot: 1,
                txid: 9,
                request: request(),
                arrived: Instant::now(),
                ticket: None,
                claim: None,
            },
            pg: 3,
            map_epoch: 4,
            seq: 0,
            reads: reads.iter().map(|osd| (*osd, request())).collect(),
            then: EcThen::Read { pieces: vec![EcPiece { read: 0, at: 0, len: 4 }] },
            profile: duplex_ec::Profile::new(2, 1, 4096).unwrap(),
            shards: vec![0, 1, 2],
        })
    }

    fn ok(data: &'static [u8]) -> OpReply {
        OpReply { status: Status::Ok, map_epoch: 4, data: Bytes::from_static(data) }
    }

    #[test]
    fn reads_settle_when_every_member_answered_in_their_own_order() {
        let mut tasks = EcTasks::default();
        let mut sent = Vec::new();
        assert!(tasks
            .start(task(1, &[2, 0]), Instant::now(), |osd, _| {
                sent.push(osd);
                true
            })
            .is_none());
        assert_eq!(sent, vec![2, 0]);
        assert!(tasks.on_read(1, 0, ok(b"b")).is_none());
        assert!(tasks.on_read(1, 7, ok(b"x")).is_none(), "an OSD it never asked");
        match tasks.on_read(1, 2, ok(b"a")) {
            Some(Settled::Read { answers, .. }) => {
                assert_eq!(answers.iter().map(|a| a.data.clone()).collect::<Vec<_>>(), vec![&b"a"[..], &b"b"[..]])
            }
            _ => panic!("all answers are in"),
        }
        assert!(tasks.is_empty());
        assert!(tasks.on_read(1, 2, ok(b"late")).is_none(), "a late answer finds nothing");
    }

    #[test]
    fn a_refused_or_unsendable_read_fails_the_task_and_no_reads_settles_at_once() {
        let mut tasks = EcTasks::default();
        assert!(matches!(tasks.start(task(1, &[]), Instant::now(), |_, _| true), Some(Settled::Read { .. })));
        assert!(matches!(tasks.start(task(2, &[1]), Instant::now(), |_, _| false), Some(Settled::ReadFailed { .. })));
        assert!(tasks.start(task(3, &[1, 2]), Instant::now(), |_, _| true).is_none());
        let refused = OpReply::error(Status::Retry, 4, "peering");
        assert!(matches!(tasks.on_read(3, 1, refused), Some(Settled::ReadFailed { .. })));
        assert!(tasks.is_empty());
        assert!(tasks.start(task(4, &[1]), Instant::now(), |_, _| true).is_none());
        let absent = OpReply::error(Status::NotFound, 4, "no such object");
        assert!(matches!(tasks.on_read(4, 1, absent), Some(Settled::Read { .. })), "absent reads as zeros");
    }

    #[test]
    fn a_write_settles_when_every_shard_acknowledged_and_fails_on_a_refusal_a_loss_or_the_timeout() {
        let mut tasks = EcTasks::default();
        let now = Instant::now();
        assert!(tasks.wait_for_acks(task(1, &[]), vec![1, 2], now, |_| true).is_none());
        assert!(tasks.on_ack(1, 1, true).is_none());
        assert!(tasks.on_ack(1, 1, true).is_none(), "a second answer from one shard counts once");
        assert!(matches!(tasks.on_ack(1, 2, true), Some(Settled::Written { failed: false, .. })));
        assert!(tasks.wait_for_acks(task(2, &[]), vec![1, 2], now, |_| true).is_none());
        assert!(tasks.on_ack(2, 1, false).is_none());
        assert!(matches!(tasks.on_ack(2, 2, true), Some(Settled::Written { failed: true, .. })));
        assert!(tasks.wait_for_acks(task(3, &[]), vec![1, 2], now, |osd| osd == 1).is_none(), "osd.1 still to answer");
        assert!(matches!(tasks.on_ack(3, 1, true), Some(Settled::Written { failed: true, .. })), "osd.2 never got it");
        tasks.wait_for_acks(task(4, &[]), vec![1], now, |_| true);
        tasks.start(task(5, &[2]), now, |_, _| true);
        let lost = tasks.peer_lost(2);
        assert!(matches!(lost.as_slice(), [Settled::ReadFailed { .. }]));
        assert!(tasks.expire(now, Duration::from_secs(10), |_, _| false).is_empty());
        let late = tasks.expire(now + Duration::from_secs(11), Duration::from_secs(10), |_, _| false);
        assert!(matches!(late.as_slice(), [Settled::Written { failed: true, .. }]));
        assert!(tasks.is_empty());
    }
}
