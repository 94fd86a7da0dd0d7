//! Background backfill of one PG, run by its primary while the PG serves
//! I/O: a sans-I/O state machine like [`crate::peering`], carried out by
//! the peering thread (or a simulator) at the recovery throttle's pace.
//!
//! The map pins a PG that moved onto new OSDs to the OSDs that hold it
//! (duplex_map::pg_temp). Peering activated the new ones as *backfill
//! targets*: each emptied its copy, marked it incomplete, and takes every
//! write of the interval from then on. What it lacks is what was written
//! before. This machine copies that, object by object, in name order:
//!
//! 1. **Lock** the object at the primary ([`PeerOp::BackfillLock`]): new
//!    client writes to it wait; once those in flight are on every replica
//!    and target, the primary applies its log and reports the object.
//!    Each target replaces its copy with an empty one of that size and
//!    those attributes (`PushStart`). An object gone by then is removed on
//!    the targets.
//! 2. **Copy** its data a chunk at a time, each under a lock of just that
//!    byte range (so writes elsewhere in the object go on): `Pull` from the
//!    primary, `PushData` to each target, release. Chunks of zeros are
//!    skipped: the target's copy reads zeros there, or what writes since
//!    put there, which the primary holds too. A target first applies its
//!    own log, so the writes it took land before the copy, which holds
//!    them; writes after the copy reach both alike.
//! 3. Next object. After the last one, the lock is released and each
//!    target is told its copy is complete ([`PeerOp::BackfillDone`]),
//!    which it records durably.
//!
//! Then [`Step::Complete`]: the driver asks the monitor to drop the pin,
//! and the up set takes over with nothing left to copy. An object created
//! after the listing passed its name needs no copy: the target took every
//! write to it. Anything unexpected stops the machine ([`Step::Stuck`]);
//! the target's copy stays marked incomplete, so it is never trusted.

use std::collections::VecDeque;

use duplex_map::OsdId;
use duplex_proto::peering::{ObjectMeta, PeerOp, PeerReply, CHUNK_BYTES};

use crate::peering::Progress;

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Ask `to` (the primary itself, or a target); answer with `on_reply`.
    Send {
        to: OsdId,
        tag: u64,
        op: PeerOp,
    },
    /// The same, after a short pause: writes to the object are in flight.
    SendLater {
        to: OsdId,
        tag: u64,
        op: PeerOp,
    },
    /// Every target holds the whole PG: the pin may go.
    Complete,
    Stuck(String),
}

pub struct Backfill {
    pub pg: u32,
    pub interval: u64,
    primary: OsdId,
    targets: Vec<OsdId>,
    stage: Stage,
    /// The last name listed, and whether the primary has more after it.
    cursor: Vec<u8>,
    more: bool,
    /// Names listed and not copied yet.
    names: VecDeque<Vec<u8>>,
    waiting: Option<u64>,
    next_tag: u64,
    pub progress: Progress,
}

enum Stage {
    Listing,
    /// The whole object, for its size and attributes.
    Locking {
        object: Vec<u8>,
    },
    /// `PushStart` to `targets[next]` and on.
    Starting {
        object: Vec<u8>,
        meta: ObjectMeta,
        next: usize,
    },
    /// The chunk at `offset`.
    LockingChunk {
        object: Vec<u8>,
        offset: u64,
    },
    Pulling {
        object: Vec<u8>,
        offset: u64,
        len: u64,
    },
    Pushing {
        object: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
        next: usize,
    },
    /// The chunk is on every target; then the one after `offset`.
    Releasing {
        object: Vec<u8>,
        offset: u64,
    },
    Removing {
        object: Vec<u8>,
        next: usize,
    },
    Unlocking,
    Finishing {
        next: usize,
    },
    Complete,
    Stuck,
}

impl Backfill {
    /// Starts backfilling `targets` from `primary` (this OSD) in the
    /// interval that began at map epoch `interval`.
    pub fn start(pg: u32, interval: u64, primary: OsdId, targets: Vec<OsdId>) -> (Backfill, Vec<Step>) {
        assert!(!targets.is_empty() && !targets.contains(&primary), "targets are other OSDs");
        let mut backfill = Backfill {
            pg,
            interval,
            primary,
            targets,
            stage: Stage::Listing,
            cursor: Vec::new(),
            more: true,
            names: VecDeque::new(),
            waiting: None,
            next_tag: 1,
            progress: Progress::default(),
        };
        let step = backfill.send(primary, PeerOp::List { cursor: Vec::new() });
        (backfill, vec![step])
    }

    pub fn targets(&self) -> &[OsdId] {
        &self.targets
    }

    pub fn is_complete(&self) -> bool {
        matches!(self.stage, Stage::Complete)
    }

    pub fn is_stuck(&self) -> bool {
        matches!(self.stage, Stage::Stuck)
    }

    fn send(&mut self, to: OsdId, op: PeerOp) -> Step {
        let tag = self.next_tag;
        self.next_tag += 1;
        self.waiting = Some(tag);
        Step::Send { to, tag, op }
    }

    fn stuck(&mut self, why: String) -> Vec<Step> {
        self.stage = Stage::Stuck;
        self.waiting = None;
        vec![Step::Stuck(format!("PG {:#x} backfill: {why}", self.pg))]
    }

    /// A request could not be carried out (unreachable, timed out).
    pub fn on_failure(&mut self, tag: u64, why: &str) -> Vec<Step> {
        if self.waiting != Some(tag) {
            return Vec::new();
        }
        self.stuck(why.to_string())
    }

    /// The answer to request `tag` (others are ignored: late, or from
    /// before the machine stopped).
    pub fn on_reply(&mut self, tag: u64, reply: PeerReply) -> Vec<Step> {
        if self.waiting != Some(tag) {
            return Vec::new();
        }
        self.waiting = None;
        if let PeerReply::Refused(why) = reply {
            return self.stuck(format!("refused: {why}"));
        }
        let stage = std::mem::replace(&mut self.stage, Stage::Stuck);
        let step = match (stage, reply) {
            (Stage::Listing, PeerReply::Names { objects, more }) => {
                match objects.last() {
                    Some(last) if last > &self.cursor => self.cursor = last.clone(),
                    None if !more => {}
                    _ => return self.stuck("a listing page did not advance".into()),
                }
                if objects.windows(2).any(|w| w[0] >= w[1]) {
                    return self.stuck("a listing page out of order".into());
                }
                self.more = more;
                self.names.extend(objects);
                self.next_object()
            }
            (Stage::Locking { object }, PeerReply::Busy) => {
                let op = PeerOp::BackfillLock { object: Some(object.clone()), start: 0, end: u64::MAX };
                self.stage = Stage::Locking { object };
                self.send_later(op)
            }
            (Stage::Locking { object }, PeerReply::Meta(None)) => self.remove_on(object, 0),
            (Stage::Locking { object }, PeerReply::Meta(Some(meta))) => self.start_on(object, meta, 0),
            (Stage::Starting { object, meta, next }, PeerReply::Done) => {
                if next + 1 < self.targets.len() {
                    self.start_on(object, meta, next + 1)
                } else {
                    self.lock_chunk(object, 0)
                }
            }
            (Stage::LockingChunk { object, offset }, PeerReply::Busy) => {
                let op = PeerOp::BackfillLock { object: Some(object.clone()), start: offset, end: chunk_end(offset) };
                self.stage = Stage::LockingChunk { object, offset };
                self.send_later(op)
            }
            // Deleted since it was started: the targets took the delete.
            (Stage::LockingChunk { object, .. }, PeerReply::Meta(None)) => self.remove_on(object, 0),
            (Stage::LockingChunk { object, offset }, PeerReply::Meta(Some(meta))) => {
                if offset >= meta.size {
                    self.progress.objects_copied += 1;
                    self.next_object()
                } else {
                    let len = (meta.size - offset).min(CHUNK_BYTES as u64);
                    let op = PeerOp::Pull { object: object.clone(), offset, len: len as u32 };
                    self.stage = Stage::Pulling { object, offset, len };
                    self.send(self.primary, op)
                }
            }
            (Stage::Pulling { object, offset, len }, PeerReply::Data(data)) => {
                if data.len() as u64 != len {
                    return self.stuck(format!("pulled {} bytes of a {len}-byte chunk", data.len()));
                }
                if data.iter().all(|b| *b == 0) {
                    self.lock_chunk(object, offset + len)
                } else {
                    self.push_to(object, offset, data, 0)
                }
            }
            (Stage::Pushing { object, offset, data, next }, PeerReply::Done) => {
                if next + 1 < self.targets.len() {
                    self.push_to(object, offset, data, next + 1)
                } else {
                    self.progress.bytes_copied += data.len() as u64 * self.targets.len() as u64;
                    // Released before the throttle's pause, not after.
                    self.stage = Stage::Releasing { object, offset: offset + data.len() as u64 };
                    self.send(self.primary, PeerOp::BackfillLock { object: None, start: 0, end: 0 })
                }
            }
            (Stage::Releasing { object, offset }, PeerReply::Done) => self.lock_chunk(object, offset),
            (Stage::Removing { object, next }, PeerReply::Done) => {
                if next + 1 < self.targets.len() {
                    self.remove_on(object, next + 1)
                } else {
                    self.progress.objects_removed += 1;
                    self.next_object()
                }
            }
            (Stage::Unlocking, PeerReply::Done) => self.finish_on(0),
            (Stage::Finishing { next }, PeerReply::Done) => {
                if next + 1 < self.targets.len() {
                    self.finish_on(next + 1)
                } else {
                    self.stage = Stage::Complete;
                    Step::Complete
                }
            }
            (_, reply) => return self.stuck(format!("unexpected answer {reply:?}")),
        };
        vec![step]
    }

    fn send_later(&mut self, op: PeerOp) -> Step {
        let Step::Send { to, tag, op } = self.send(self.primary, op) else { unreachable!("send sends") };
        Step::SendLater { to, tag, op }
    }

    /// The next object to copy, the next page of names, or the end.
    fn next_object(&mut self) -> Step {
        if let Some(object) = self.names.pop_front() {
            self.stage = Stage::Locking { object: object.clone() };
            return self.send(self.primary, PeerOp::BackfillLock { object: Some(object), start: 0, end: u64::MAX });
        }
        if self.more {
            self.stage = Stage::Listing;
            return self.send(self.primary, PeerOp::List { cursor: self.cursor.clone() });
        }
        self.stage = Stage::Unlocking;
        self.send(self.primary, PeerOp::BackfillLock { object: None, start: 0, end: 0 })
    }

    fn lock_chunk(&mut self, object: Vec<u8>, offset: u64) -> Step {
        let op = PeerOp::BackfillLock { object: Some(object.clone()), start: offset, end: chunk_end(offset) };
        self.stage = Stage::LockingChunk { object, offset };
        self.send(self.primary, op)
    }

    fn start_on(&mut self, object: Vec<u8>, meta: ObjectMeta, next: usize) -> Step {
        let op = PeerOp::PushStart {
            object: object.clone(),
            size: meta.size,
            preallocated: meta.preallocated,
            attrs: meta.attrs.clone(),
        };
        self.stage = Stage::Starting { object, meta, next };
        self.send(self.targets[next], op)
    }

    fn push_to(&mut self, object: Vec<u8>, offset: u64, data: Vec<u8>, next: usize) -> Step {
        let op = PeerOp::PushData { object: object.clone(), offset, data: data.clone() };
        self.stage = Stage::Pushing { object, offset, data, next };
        self.send(self.targets[next], op)
    }

    fn remove_on(&mut self, object: Vec<u8>, next: usize) -> Step {
        let op = PeerOp::Remove { object: object.clone() };
        self.stage = Stage::Removing { object, next };
        self.send(self.targets[next], op)
    }

    fn finish_on(&mut self, next: usize) -> Step {
        self.stage = Stage::Finishing { next };
        self.send(self.targets[next], PeerOp::BackfillDone)
    }
}

/// Whether an active PG has backfill targets `backfill` is not filling
/// (none started: they could not be reached; other ones; or it stopped):
/// peering it again takes them in.
pub fn unfinished(backfill: Option<&Backfill>, targets: &[OsdId]) -> bool {
    !targets.is_empty() && backfill.is_none_or(|b| b.targets() != targets || b.is_stuck())
}

fn chunk_end(offset: u64) -> u64 {
    offset.saturating_add(CHUNK_BYTES as u64)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    type Objects = BTreeMap<Vec<u8>, Vec<u8>>;

    /// The primary (0) and targets (1, 2) as the machine sees them.
    struct Model {
        primary: Objects,
        targets: BTreeMap<OsdId, Objects>,
        /// Lock requests answered Busy before one succeeds.
        busy: u32,
        locked: Option<(Vec<u8>, u64, u64)>,
        done: Vec<OsdId>,
        later: u32,
    }

    impl Model {
        fn answer(&mut self, to: OsdId, op: PeerOp) -> PeerReply {
            let meta = |data: &Vec<u8>| ObjectMeta { size: data.len() as u64, preallocated: false, attrs: Vec::new() };
            if to != 0 {
                let store = self.targets.get_mut(&to).expect("a target");
                return match op {
                    PeerOp::PushStart { object, size, .. } => {
                        store.insert(object, vec![0; size as usize]);
                        PeerReply::Done
                    }
                    PeerOp::PushData { object, offset, data } => {
                        let held = store.get_mut(&object).expect("started");
                        assert!(
                            self.locked.as_ref().is_some_and(|(o, s, e)| *o == object
                                && *s <= offset
                                && offset + data.len() as u64 <= *e),
                            "a chunk is pushed under its lock"
                        );
                        held[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                        PeerReply::Done
                    }
                    PeerOp::Remove { object } => {
                        store.remove(&object);
                        PeerReply::Done
                    }
                    PeerOp::BackfillDone => {
                        self.done.push(to);
                        PeerReply::Done
                    }
                    other => panic!("{other:?} sent to a target"),
                };
            }
            match op {
                PeerOp::List { cursor } => {
                    let objects: Vec<Vec<u8>> =
                        self.primary.keys().filter(|k| cursor.is_empty() || **k > cursor).take(2).cloned().collect();
                    let more = objects.last().is_some_and(|last| self.primary.keys().any(|k| k > last));
                    PeerReply::Names { objects, more }
                }
                PeerOp::BackfillLock { object, start, end } => {
                    self.locked = object.clone().map(|o| (o, start, end));
                    let Some(object) = object else { return PeerReply::Done };
                    if self.busy > 0 {
                        self.busy -= 1;
                        return PeerReply::Busy;
                    }
                    PeerReply::Meta(self.primary.get(&object).map(meta))
                }
                PeerOp::Pull { object, offset, len } => {
                    let data = &self.primary[&object];
                    PeerReply::Data(data[offset as usize..(offset + len as u64) as usize].to_vec())
                }
                other => panic!("{other:?} sent to the primary"),
            }
        }
    }

    fn run(model: &mut Model, mut deleted_after_listing: Option<Vec<u8>>) -> (Backfill, Step) {
        let (mut machine, steps) = Backfill::start(7, 9, 0, vec![1, 2]);
        let mut queue: VecDeque<Step> = steps.into();
        while let Some(step) = queue.pop_front() {
            let (to, tag, op) = match step {
                Step::Send { to, tag, op } => (to, tag, op),
                Step::SendLater { to, tag, op } => {
                    model.later += 1;
                    (to, tag, op)
                }
                end => return (machine, end),
            };
            if let (PeerOp::BackfillLock { object: Some(object), .. }, Some(gone)) = (&op, &deleted_after_listing) {
                if object == gone {
                    model.primary.remove(gone);
                    deleted_after_listing = None;
                }
            }
            let reply = model.answer(to, op);
            queue.extend(machine.on_reply(tag, reply));
        }
        panic!("the machine neither completed nor stopped");
    }

    #[test]
    fn every_object_reaches_every_target_in_locked_chunks_and_zeros_are_skipped() {
        let big: Vec<u8> = (0..(2 * CHUNK_BYTES as usize + 1000)).map(|i| (i % 251) as u8 + 1).collect();
        let mut sparse = vec![0u8; 2 * CHUNK_BYTES as usize];
        sparse[CHUNK_BYTES as usize + 5] = 9;
        let primary: Objects = [
            (b"a".to_vec(), b"small".to_vec()),
            (b"b".to_vec(), big),
            (b"c".to_vec(), Vec::new()),
            (b"d".to_vec(), sparse),
            (b"e".to_vec(), b"gone soon".to_vec()),
        ]
        .into();
        // A target holds a partial copy from the writes it took already.
        let partial: Objects = [(b"a".to_vec(), b"sm".to_vec()), (b"e".to_vec(), b"gone".to_vec())].into();
        let targets = [(1, partial.clone()), (2, partial)].into();
        let mut model = Model { primary, targets, busy: 2, locked: None, done: Vec::new(), later: 0 };
        let (machine, end) = run(&mut model, Some(b"e".to_vec()));
        assert_eq!(end, Step::Complete);
        assert!(machine.is_complete());
        for (id, store) in &model.targets {
            assert_eq!(store, &model.primary, "target {id}");
        }
        assert_eq!(model.done, vec![1, 2], "each target is told it is complete");
        assert_eq!(model.later, 2, "a busy lock is asked again after a pause");
        assert_eq!(model.locked, None, "the last lock is released");
        assert_eq!(machine.progress.objects_copied, 4);
        assert_eq!(machine.progress.objects_removed, 1, "the object deleted after the listing");
        let nonzero_chunks = 5 + (2 * CHUNK_BYTES as u64 + 1000) + CHUNK_BYTES as u64;
        assert_eq!(machine.progress.bytes_copied, 2 * nonzero_chunks, "zero chunks are not sent");
    }

    #[test]
    fn a_refusal_stops_it_and_late_answers_are_ignored() {
        let (mut machine, steps) = Backfill::start(7, 9, 0, vec![1]);
        let Step::Send { tag, .. } = steps[0].clone() else { panic!("a request first") };
        assert!(machine.on_reply(tag + 5, PeerReply::Done).is_empty(), "not the awaited answer");
        let stop = machine.on_reply(tag, PeerReply::Refused("not active".into()));
        assert!(matches!(&stop[..], [Step::Stuck(why)] if why.contains("not active")));
        assert!(machine.is_stuck());
        assert!(unfinished(Some(&machine), &[1]), "a stopped backfill is taken up again");
        assert!(!unfinished(None, &[]), "nothing to fill");
        assert!(unfinished(None, &[1]));
    }
}
