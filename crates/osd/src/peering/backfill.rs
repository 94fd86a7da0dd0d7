//! Background backfill of one PG, run by its primary while the PG serves
//! I/O: a sans-I/O state machine like [`crate::peering`], carried out by
//! the peering thread (or a simulator), at the pace the flushers' `Backfill`
//! class allows (crate::flusher::device).
//!
//! The map pins a PG that moved onto new OSDs to the OSDs that hold it
//! (duplex_map::pg_temp). Peering activated the new ones as *backfill
//! targets*: each marked its copy incomplete (keeping what it held). A
//! target that is no member takes no write until this machine's first
//! step joins it (crate::pg::elide: the primary holds the PG's writes,
//! applies its log, and the target is activated again at its last seq),
//! and every write of the interval from then on: whole once the walk
//! below has stepped onto the write's object, before that elided (its
//! log entry without its data). What it lacks is what
//! was written before, and what it holds may be stale. This machine makes
//! each target's copy equal to the primary's, object by object, in the
//! name order of the primary's and the targets' listings merged (so a
//! stale object only a target holds is met too):
//!
//! 0. **Join** the dormant targets ([`PeerOp::BackfillJoin`], then a
//!    [`PeerOp::Activate`] to each, then [`PeerOp::BackfillJoined`]).
//!
//! 1. **Lock** the object at the primary ([`PeerOp::BackfillLock`]): new
//!    client writes to it wait; once those in flight are on every replica
//!    and target, the primary applies its log and reports the object. If
//!    it has none, the targets remove theirs. Otherwise each target that
//!    holds a copy of that size and those attributes ([`PeerOp::Stat`])
//!    *keeps* it; any other replaces it with an empty one (`PushStart`).
//! 2. **Copy** its data a chunk ([`BACKFILL_CHUNK_BYTES`]) at a time,
//!    each under a lock of just that byte range (so writes elsewhere in
//!    the object go on): `Pull` from the primary; a target that kept its copy reports its digest of the chunk
//!    ([`PeerOp::ChunkDigest`]) and gets the chunk (`PushData`) only if it
//!    differs; a target that was reset gets every chunk but those of zeros
//!    (its copy reads zeros there, or what writes since put there, which
//!    the primary holds too). A target first applies its own log, so the
//!    writes it took land before the comparison and the copy; writes after
//!    reach both alike.
//! 3. Next object. After the last one, the lock is released and each
//!    target is told its copy is complete ([`PeerOp::BackfillDone`]),
//!    which it records durably.
//!
//! The primary owes the walk every object it elided a write of: its
//! answer to a step onto a whole object, and to the end
//! ([`PeerOp::backfill_end`]), names those before it (an object created
//! after its page was listed is in no listing), and they are walked first.
//!
//! Then [`Step::Complete`]: the driver asks the monitor to drop the pin,
//! and the up set takes over with nothing left to copy. An object created
//! after the walk passed its name needs no copy: every target holding a
//! copy then (the listing named it) removed it under that name's lock, so
//! the writes since built it from nothing on both sides. Anything
//! unexpected stops the machine ([`Step::Stuck`]); the target's copy stays
//! marked incomplete, so it is never trusted, and the next interval's
//! backfill compares again rather than copying it all again.
//!
//! **Snapshot clones** (crate::snaps) are objects of their own, named
//! right after their head, but a write creates one from the head as the
//! member holds it: a target that lacked the head, or held half of it,
//! made none or another. So once a head that has snapshots is walked (its
//! last chunk's lock holds back the writes that would clone it again), and
//! once a head is removed (a delete under a snapshot leaves its clone),
//! every listing is asked again for the names right after it, and that
//! head's clones are walked next, whatever the listings held before
//! ([`Stage::ListingClones`]).

use std::collections::VecDeque;

use duplex_map::OsdId;
use duplex_proto::peering::{ObjectMeta, PeerOp, PeerReply};

use crate::peering::Progress;

/// The bytes of one step: one lock, pull, compare and push. Each step is
/// a burst of work (a read and a crc at the primary, a frame decoded on a
/// priority thread of each target, a digest and a write at its flusher)
/// that client operations on the same CPUs wait behind. With the
/// protocol's largest (1 MiB, `CHUNK_BYTES`), clients' p99 during a
/// backfill at a quarter load was 5.4-6.1 ms on a 2-vCPU machine; with
/// 256 KiB, 2.7-3.8 ms, the backfill taking a third longer (it waits on
/// round trips); 128 KiB gained nothing more and took longer still
/// (docs/BENCHMARKS.md, session 35).
pub const BACKFILL_CHUNK_BYTES: u64 = 256 << 10;
const _: () = assert!(BACKFILL_CHUNK_BYTES <= duplex_proto::peering::CHUNK_BYTES as u64);

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
    /// The primary's listing (index 0), then each target's.
    listings: Vec<Listing>,
    /// For the object under way, per target: it kept its copy (compared
    /// chunk by chunk) rather than starting from an empty one.
    kept: Vec<bool>,
    /// Something was sent to a target for the object under way.
    changed: bool,
    /// The object under way is a head with snapshots: its clones are
    /// listed afresh once it is done.
    snapped: bool,
    /// A walk of given names (a member behind by history, whose names
    /// name the clones its entries made): nothing more is listed.
    bounded: bool,
    waiting: Option<u64>,
    next_tag: u64,
    pub progress: Progress,
}

/// One OSD's names of the PG's objects, read a page at a time.
#[derive(Default)]
struct Listing {
    /// Listed and not walked yet, in order.
    names: VecDeque<Vec<u8>>,
    /// The last name listed, and whether more follow it.
    cursor: Vec<u8>,
    more: bool,
}

enum Stage {
    /// The primary joins the targets that took no write yet to the PG's
    /// writes ([`PeerOp::BackfillJoin`], crate::pg::elide).
    Joining,
    /// `targets[next]` of the join is activated again at the join's seq.
    Activating {
        activate: PeerOp,
        joining: Vec<OsdId>,
        next: usize,
    },
    /// The primary sends the joined targets the writes from now on.
    Joined,
    /// A page of `listings[source]`.
    Listing {
        source: usize,
    },
    /// The names after `head` in `listings[source]`'s OSD, for its clones.
    ListingClones {
        head: Vec<u8>,
        source: usize,
    },
    /// The whole object, for its size and attributes.
    Locking {
        object: Vec<u8>,
    },
    /// `targets[next]`'s size and attributes, to keep its copy or not.
    Statting {
        object: Vec<u8>,
        meta: ObjectMeta,
        next: usize,
    },
    /// `targets[next]` replaces its copy with an empty one.
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
    /// The chunk pulled, its crc32c, and whether any target got it yet;
    /// `targets[next]` is asked for its digest or sent the chunk.
    Checking(Chunk),
    Pushing(Chunk),
    /// The chunk went to some target; then the one after `offset`.
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

struct Chunk {
    object: Vec<u8>,
    offset: u64,
    data: Vec<u8>,
    crc: u32,
    /// All zeros: a target that started empty reads the same already.
    zeros: bool,
    sent: bool,
    next: usize,
}

impl Backfill {
    /// Starts backfilling `targets` from `primary` (this OSD) in the
    /// interval that began at map epoch `interval`.
    pub fn start(pg: u32, interval: u64, primary: OsdId, targets: Vec<OsdId>) -> (Backfill, Vec<Step>) {
        Backfill::start_with(pg, interval, primary, targets, None, true)
    }

    /// The same, walking only `only` (when `Some`) instead of every object
    /// the primary and the targets list: members behind by history, whose
    /// copies lack only what the authority's history names since. With
    /// `join` (a replicated PG's full walk), the walk first joins the
    /// targets that take no write yet (crate::pg::elide).
    pub fn start_with(
        pg: u32,
        interval: u64,
        primary: OsdId,
        targets: Vec<OsdId>,
        only: Option<Vec<Vec<u8>>>,
        join: bool,
    ) -> (Backfill, Vec<Step>) {
        assert!(!targets.is_empty() && !targets.contains(&primary), "targets are other OSDs");
        let listings = match only {
            None => (0..=targets.len()).map(|_| Listing { more: true, ..Listing::default() }).collect(),
            Some(mut names) => {
                names.sort_unstable();
                names.dedup();
                let given = Listing { names: names.into(), cursor: Vec::new(), more: false };
                std::iter::once(given).chain(targets.iter().map(|_| Listing::default())).collect()
            }
        };
        let mut backfill = Backfill {
            pg,
            interval,
            primary,
            targets,
            stage: Stage::Stuck,
            listings,
            kept: Vec::new(),
            changed: false,
            snapped: false,
            bounded: false,
            waiting: None,
            next_tag: 1,
            progress: Progress::default(),
        };
        debug_assert_eq!(
            backfill.listings.len(),
            backfill.targets.len() + 1,
            "a listing per target, after the primary's"
        );
        backfill.bounded = !backfill.listings[0].more;
        // Every replicated walk asks, bounded or not: no walk may begin
        // with a dormant target (it would miss the writes behind it).
        let step = if join {
            backfill.stage = Stage::Joining;
            backfill.send(primary, PeerOp::BackfillJoin { targets: backfill.targets.clone() })
        } else {
            backfill.next_object()
        };
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

    /// Whether the walk is joining its targets: the primary may hold the
    /// PG's client writes until it ends (crate::pg::elide), so its steps
    /// go ahead of other work.
    pub fn is_joining(&self) -> bool {
        matches!(self.stage, Stage::Joining | Stage::Activating { .. } | Stage::Joined)
    }

    fn send(&mut self, to: OsdId, op: PeerOp) -> Step {
        debug_assert!(self.waiting.is_none(), "a second request while one is out");
        debug_assert!(to == self.primary || self.targets.contains(&to), "a backfill request to osd.{to}");
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
            (Stage::Joining, PeerReply::Busy) => {
                self.stage = Stage::Joining;
                self.send_later(PeerOp::BackfillJoin { targets: self.targets.clone() })
            }
            (Stage::Joining, PeerReply::Join { targets, .. }) if targets.is_empty() => self.next_object(),
            (Stage::Joining, PeerReply::Join { targets, last_seq, last_epoch, members, backfill, requests }) => {
                if targets.iter().any(|t| !self.targets.contains(t)) {
                    return self
                        .stuck(format!("the primary joined {targets:?}, not all targets of {:?}", self.targets));
                }
                let activate = PeerOp::Activate { last_seq, last_epoch, members, rebuilt: false, requests, backfill };
                self.activate_on(activate, targets, 0)
            }
            (Stage::Activating { activate, joining, next }, PeerReply::Done) => {
                if next + 1 < joining.len() {
                    self.activate_on(activate, joining, next + 1)
                } else {
                    self.stage = Stage::Joined;
                    self.send(self.primary, PeerOp::BackfillJoined)
                }
            }
            (Stage::Joined, PeerReply::Done) => self.next_object(),
            (Stage::Listing { source }, PeerReply::Names { objects, more }) => {
                let listing = &mut self.listings[source];
                match objects.last() {
                    Some(last) if last > &listing.cursor => listing.cursor = last.clone(),
                    None if !more => {}
                    _ => return self.stuck("a listing page did not advance".into()),
                }
                if objects.windows(2).any(|w| w[0] >= w[1]) {
                    return self.stuck("a listing page out of order".into());
                }
                listing.more = more;
                listing.names.extend(objects);
                self.next_object()
            }
            // Objects the primary sent the targets elided writes of, which
            // the walk must visit first (pg/elide.rs).
            (Stage::Locking { object }, PeerReply::Names { objects, more: false }) => {
                return self.walk_owed(objects, Some(object));
            }
            (Stage::Unlocking, PeerReply::Names { objects, more: false }) => return self.walk_owed(objects, None),
            (Stage::Locking { object }, PeerReply::Busy) => {
                let op = PeerOp::BackfillLock { object: Some(object.clone()), start: 0, end: u64::MAX };
                self.stage = Stage::Locking { object };
                self.send_later(op)
            }
            (Stage::Locking { object }, PeerReply::Meta(None)) => self.remove_on(object, 0),
            (Stage::Locking { object }, PeerReply::Meta(Some(meta))) => {
                self.kept.clear();
                self.changed = false;
                self.snapped = meta.attrs.iter().any(|(name, _)| name == crate::snaps::SNAPSEQ_ATTR);
                self.stat_on(object, meta, 0)
            }
            (Stage::Statting { object, meta, next }, PeerReply::Meta(held)) => {
                debug_assert_eq!(self.kept.len(), next, "targets statted out of turn");
                if held.as_ref() == Some(&meta) {
                    self.kept.push(true);
                    self.stat_on(object, meta, next + 1)
                } else {
                    self.kept.push(false);
                    self.changed = true;
                    let op = PeerOp::PushStart {
                        object: object.clone(),
                        size: meta.size,
                        preallocated: meta.preallocated,
                        attrs: meta.attrs.clone(),
                        omap: meta.omap.clone(),
                    };
                    self.stage = Stage::Starting { object, meta, next };
                    self.send(self.targets[next], op)
                }
            }
            (Stage::Starting { object, meta, next }, PeerReply::Done) => self.stat_on(object, meta, next + 1),
            (Stage::LockingChunk { object, offset }, PeerReply::Busy) => {
                let op = PeerOp::BackfillLock { object: Some(object.clone()), start: offset, end: chunk_end(offset) };
                self.stage = Stage::LockingChunk { object, offset };
                self.send_later(op)
            }
            // Deleted since it was started: the targets took the delete.
            (Stage::LockingChunk { object, .. }, PeerReply::Meta(None)) => self.remove_on(object, 0),
            (Stage::LockingChunk { object, offset }, PeerReply::Meta(Some(meta))) => {
                if offset >= meta.size {
                    if self.changed {
                        self.progress.objects_copied += 1;
                    }
                    // Only the first chunk's lock held every write back: one
                    // since, under a first snapshot, may have cloned the head.
                    self.snapped |= meta.attrs.iter().any(|(name, _)| name == crate::snaps::SNAPSEQ_ATTR);
                    self.object_done(object)
                } else {
                    let len = (meta.size - offset).min(BACKFILL_CHUNK_BYTES);
                    let op = PeerOp::Pull { object: object.clone(), offset, len: len as u32 };
                    self.stage = Stage::Pulling { object, offset, len };
                    self.send(self.primary, op)
                }
            }
            (Stage::Pulling { object, offset, len }, PeerReply::Data(data)) => {
                if data.len() as u64 != len {
                    return self.stuck(format!("pulled {} bytes of a {len}-byte chunk", data.len()));
                }
                let (crc, zeros) = (crc32c::crc32c(&data), data.iter().all(|b| *b == 0));
                self.chunk_to(Chunk { object, offset, data, crc, zeros, sent: false, next: 0 })
            }
            (Stage::Checking(chunk), PeerReply::ChunkDigest(digest)) => {
                debug_assert!(self.kept[chunk.next], "a digest asked of a target that started empty");
                if digest == Some(chunk.crc) {
                    self.chunk_to(Chunk { next: chunk.next + 1, ..chunk })
                } else {
                    self.push(chunk)
                }
            }
            (Stage::Pushing(chunk), PeerReply::Done) => {
                self.progress.bytes_copied += chunk.data.len() as u64;
                self.changed = true;
                self.chunk_to(Chunk { next: chunk.next + 1, sent: true, ..chunk })
            }
            (Stage::Releasing { object, offset }, PeerReply::Done) => self.lock_chunk(object, offset),
            (Stage::Removing { object, next }, PeerReply::Done) => {
                if next + 1 < self.targets.len() {
                    self.remove_on(object, next + 1)
                } else {
                    self.progress.objects_removed += 1;
                    // A delete under a snapshot leaves the head's clone behind,
                    // made after the listings perhaps: its clones are walked too.
                    if crate::snaps::is_clone_name(&object) || self.bounded {
                        self.next_object()
                    } else {
                        self.list_clones(object, 0)
                    }
                }
            }
            (Stage::ListingClones { head, source }, PeerReply::Names { objects, more }) => {
                let clones: Vec<Vec<u8>> = objects
                    .iter()
                    .take_while(|name| crate::snaps::split_clone_name(name).is_some_and(|(of, _)| of == head))
                    .cloned()
                    .collect();
                let all_clones = clones.len() == objects.len();
                let listing = &mut self.listings[source];
                // Its queue holds none, or an older view, of them: they
                // come first, as they sort right after their head.
                while listing
                    .names
                    .front()
                    .is_some_and(|name| crate::snaps::split_clone_name(name).is_some_and(|(of, _)| of == head))
                {
                    listing.names.pop_front();
                }
                for name in clones.iter().rev() {
                    listing.names.push_front(name.clone());
                }
                // The next page starts after them, not with them again.
                if let Some(last) = clones.last().filter(|last| **last > listing.cursor) {
                    listing.cursor = last.clone();
                }
                match clones.last() {
                    // A page of nothing but its clones: more may follow.
                    Some(last) if all_clones && more => {
                        let cursor = last.clone();
                        self.stage = Stage::ListingClones { head, source };
                        self.send(self.source(source), PeerOp::List { cursor })
                    }
                    _ => self.list_clones(head, source + 1),
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

    /// The primary answered the walk's step onto `next` (or its end, `None`)
    /// with `owed`: objects it sent the targets elided writes of, which
    /// sort before `next` (so no listing holds them any more, or ever did:
    /// created after their page was listed) and after the last object
    /// walked. They are walked first, then `next`.
    fn walk_owed(&mut self, owed: Vec<Vec<u8>>, next: Option<Vec<u8>>) -> Vec<Step> {
        let sorted = owed.windows(2).all(|w| w[0] < w[1]);
        let before_next = next.as_ref().is_none_or(|next| owed.last().is_some_and(|last| last < next));
        if owed.is_empty() || !sorted || !before_next {
            return self.stuck(format!("the primary owes the walk objects out of order: {owed:?} before {next:?}"));
        }
        let first = &mut self.listings[0];
        debug_assert!(
            first.names.front().is_none_or(|front| next.as_ref().is_none_or(|next| front > next)),
            "the walk's next object was not the least name queued"
        );
        if let Some(next) = next {
            first.names.push_front(next);
        }
        for name in owed.into_iter().rev() {
            first.names.push_front(name);
        }
        vec![self.next_object()]
    }

    /// The object just walked is done: its clones next, if it has snapshots.
    fn object_done(&mut self, object: Vec<u8>) -> Step {
        if std::mem::take(&mut self.snapped) {
            self.list_clones(object, 0)
        } else {
            self.next_object()
        }
    }

    /// Asks `listings[source]`'s OSD for the names after `head` (its
    /// clones); after the last listing, the next object.
    fn list_clones(&mut self, head: Vec<u8>, source: usize) -> Step {
        if source == self.listings.len() {
            return self.next_object();
        }
        let cursor = head.clone();
        self.stage = Stage::ListingClones { head, source };
        self.send(self.source(source), PeerOp::List { cursor })
    }

    fn activate_on(&mut self, activate: PeerOp, joining: Vec<OsdId>, next: usize) -> Step {
        let to = joining[next];
        self.stage = Stage::Activating { activate: activate.clone(), joining, next };
        self.send(to, activate)
    }

    fn send_later(&mut self, op: PeerOp) -> Step {
        let Step::Send { to, tag, op } = self.send(self.primary, op) else { unreachable!("send sends") };
        Step::SendLater { to, tag, op }
    }

    fn source(&self, index: usize) -> OsdId {
        if index == 0 {
            self.primary
        } else {
            self.targets[index - 1]
        }
    }

    /// The next object of the merged listings, the next page of one, or
    /// the end. A name is walked only once every listing with more to come
    /// has a name queued: its smallest is then the next of them all.
    fn next_object(&mut self) -> Step {
        if let Some(source) = self.listings.iter().position(|l| l.names.is_empty() && l.more) {
            self.stage = Stage::Listing { source };
            let cursor = self.listings[source].cursor.clone();
            return self.send(self.source(source), PeerOp::List { cursor });
        }
        let Some(object) = self.listings.iter().filter_map(|l| l.names.front()).min().cloned() else {
            self.stage = Stage::Unlocking;
            return self.send(self.primary, PeerOp::backfill_end());
        };
        for listing in &mut self.listings {
            if listing.names.front() == Some(&object) {
                listing.names.pop_front();
            }
        }
        debug_assert!(
            self.listings.iter().all(|l| l.names.front().is_none_or(|next| *next > object)),
            "a listing still queues a name at or before the one walked"
        );
        self.stage = Stage::Locking { object: object.clone() };
        self.send(self.primary, PeerOp::BackfillLock { object: Some(object), start: 0, end: u64::MAX })
    }

    /// Asks `targets[next]` for its copy's size and attributes, or, when
    /// every target has answered, starts on the data.
    fn stat_on(&mut self, object: Vec<u8>, meta: ObjectMeta, next: usize) -> Step {
        if next == self.targets.len() {
            debug_assert_eq!(self.kept.len(), self.targets.len());
            return self.lock_chunk(object, 0);
        }
        let op = PeerOp::Stat { object: object.clone() };
        self.stage = Stage::Statting { object, meta, next };
        self.send(self.targets[next], op)
    }

    fn lock_chunk(&mut self, object: Vec<u8>, offset: u64) -> Step {
        let op = PeerOp::BackfillLock { object: Some(object.clone()), start: offset, end: chunk_end(offset) };
        self.stage = Stage::LockingChunk { object, offset };
        self.send(self.primary, op)
    }

    /// The chunk for `targets[chunk.next]` and on: a kept copy is asked
    /// for its digest, a reset one gets it unless it is all zeros. After
    /// the last target, the next chunk (its lock releases this one).
    fn chunk_to(&mut self, mut chunk: Chunk) -> Step {
        debug_assert_eq!(self.kept.len(), self.targets.len(), "a chunk copied before every target was statted");
        while chunk.next < self.targets.len() {
            let to = self.targets[chunk.next];
            if self.kept[chunk.next] {
                let op = PeerOp::ChunkDigest {
                    object: chunk.object.clone(),
                    offset: chunk.offset,
                    len: chunk.data.len() as u32,
                };
                self.stage = Stage::Checking(chunk);
                return self.send(to, op);
            }
            if !chunk.zeros {
                return self.push(chunk);
            }
            chunk.next += 1;
        }
        let offset = chunk.offset + chunk.data.len() as u64;
        if chunk.sent {
            // Released before the pause the next lock may wait at the
            // primary's flusher (its chunk's cost), not held through it.
            self.stage = Stage::Releasing { object: chunk.object, offset };
            self.send(self.primary, PeerOp::BackfillLock { object: None, start: 0, end: 0 })
        } else {
            self.lock_chunk(chunk.object, offset)
        }
    }

    fn push(&mut self, chunk: Chunk) -> Step {
        let op = PeerOp::PushData { object: chunk.object.clone(), offset: chunk.offset, data: chunk.data.clone() };
        let to = self.targets[chunk.next];
        self.stage = Stage::Pushing(chunk);
        self.send(to, op)
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
    offset.saturating_add(BACKFILL_CHUNK_BYTES)
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
        /// Requests of each kind sent to targets.
        sent: BTreeMap<&'static str, u32>,
        /// (head, clone, its data): a write makes the clone at the primary
        /// when the head's lock is first asked for (after the listings).
        clone_on_lock: Option<(Vec<u8>, Vec<u8>, Vec<u8>)>,
        /// Heads that have snapshots (their metadata says so).
        snapped: Vec<Vec<u8>>,
        /// The primary's eliding (crate::pg::elide), as its store answers.
        elide: Option<crate::pg::elide::Elide>,
        /// Client writes made at the primary when the walk first asks to
        /// lock the object named first: (that object, written object,
        /// its new bytes). Elided ones do not reach the targets.
        writes_on_lock: Vec<(Vec<u8>, Vec<u8>, Vec<u8>)>,
        /// Writes the targets got without their data.
        elided: u32,
        /// Lock requests answered with objects the walk owed.
        owed_answers: u32,
        /// Join requests answered Busy (writes in flight) before one is not.
        join_busy: u32,
        /// Dormant targets activated again by the walk's join.
        activated: Vec<OsdId>,
    }

    fn meta(data: &[u8]) -> ObjectMeta {
        ObjectMeta { size: data.len() as u64, preallocated: false, attrs: Vec::new(), omap: Vec::new() }
    }

    fn page(objects: &Objects, cursor: &[u8]) -> PeerReply {
        let names: Vec<Vec<u8>> =
            objects.keys().filter(|k| cursor.is_empty() || &k[..] > cursor).take(2).cloned().collect();
        let more = names.last().is_some_and(|last| objects.keys().any(|k| k > last));
        PeerReply::Names { objects: names, more }
    }

    impl Model {
        fn new(primary: Objects, targets: BTreeMap<OsdId, Objects>) -> Model {
            Model {
                primary,
                targets,
                busy: 0,
                locked: None,
                done: Vec::new(),
                later: 0,
                sent: BTreeMap::new(),
                clone_on_lock: None,
                snapped: Vec::new(),
                elide: None,
                writes_on_lock: Vec::new(),
                elided: 0,
                owed_answers: 0,
                join_busy: 0,
                activated: Vec::new(),
            }
        }

        fn is_locked(&self, object: &[u8], start: u64, end: u64) -> bool {
            self.locked.as_ref().is_some_and(|(o, s, e)| o == object && *s <= start && end <= *e)
        }

        fn answer(&mut self, to: OsdId, op: PeerOp) -> PeerReply {
            if to != 0 {
                let kind = match &op {
                    PeerOp::List { .. } => "list",
                    PeerOp::Stat { .. } => "stat",
                    PeerOp::PushStart { .. } => "start",
                    PeerOp::ChunkDigest { .. } => "digest",
                    PeerOp::PushData { .. } => "push",
                    PeerOp::Remove { .. } => "remove",
                    _ => "other",
                };
                *self.sent.entry(kind).or_default() += 1;
                let locked = match &op {
                    PeerOp::Stat { object } | PeerOp::PushStart { object, .. } | PeerOp::Remove { object } => {
                        self.is_locked(object, 0, u64::MAX)
                    }
                    PeerOp::ChunkDigest { object, offset, len } => {
                        self.is_locked(object, *offset, offset + u64::from(*len))
                    }
                    PeerOp::PushData { object, offset, data } => {
                        self.is_locked(object, *offset, offset + data.len() as u64)
                    }
                    _ => true,
                };
                assert!(locked, "{op:?} is sent under the primary's lock");
                let store = self.targets.get_mut(&to).expect("a target");
                return match op {
                    PeerOp::List { cursor } => page(store, &cursor),
                    PeerOp::Stat { object } => PeerReply::Meta(store.get(&object).map(|d| meta(d))),
                    PeerOp::PushStart { object, size, .. } => {
                        store.insert(object, vec![0; size as usize]);
                        PeerReply::Done
                    }
                    PeerOp::ChunkDigest { object, offset, len } => {
                        PeerReply::ChunkDigest(store.get(&object).map(|held| {
                            let end = (offset + u64::from(len)).min(held.len() as u64);
                            crc32c::crc32c(&held[offset as usize..end as usize])
                        }))
                    }
                    PeerOp::PushData { object, offset, data } => {
                        let held = store.get_mut(&object).expect("started");
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
                    PeerOp::Activate { .. } => {
                        assert!(
                            self.elide.as_ref().is_some_and(|e| e.is_dormant(to)),
                            "only a dormant target is activated again"
                        );
                        self.activated.push(to);
                        PeerReply::Done
                    }
                    other => panic!("{other:?} sent to a target"),
                };
            }
            match op {
                PeerOp::List { cursor } => page(&self.primary, &cursor),
                PeerOp::BackfillLock { object, start, end } => {
                    let due: Vec<_> =
                        self.writes_on_lock.iter().filter(|(on, ..)| Some(on) == object.as_ref()).cloned().collect();
                    self.writes_on_lock.retain(|(on, ..)| Some(on) != object.as_ref());
                    for (_, written, data) in due {
                        self.primary.insert(written.clone(), data.clone());
                        if self.elide.as_mut().is_some_and(|elide| elide.elides(&written)) {
                            self.elided += 1;
                        } else {
                            for (to, store) in self.targets.iter_mut() {
                                if !self.elide.as_ref().is_some_and(|e| e.is_dormant(*to)) {
                                    store.insert(written.clone(), data.clone());
                                }
                            }
                        }
                    }
                    let owed = crate::pg::elide::owed_before_lock(&mut self.elide, object.as_deref(), start, end);
                    if let Some(objects) = owed {
                        self.owed_answers += 1;
                        self.locked = None;
                        return PeerReply::Names { objects, more: false };
                    }
                    self.locked = object.clone().map(|o| (o, start, end));
                    let Some(object) = object else { return PeerReply::Done };
                    if self.busy > 0 {
                        self.busy -= 1;
                        return PeerReply::Busy;
                    }
                    if self.clone_on_lock.as_ref().is_some_and(|(head, ..)| *head == object) {
                        let (head, clone, data) = self.clone_on_lock.take().expect("checked");
                        self.primary.insert(clone, data);
                        self.snapped.push(head);
                    }
                    let snapped = self.snapped.contains(&object);
                    PeerReply::Meta(self.primary.get(&object).map(|d| ObjectMeta {
                        attrs: if snapped { vec![(crate::snaps::SNAPSEQ_ATTR.to_vec(), vec![1])] } else { Vec::new() },
                        ..meta(d)
                    }))
                }
                PeerOp::Pull { object, offset, len } => {
                    let data = &self.primary[&object];
                    PeerReply::Data(data[offset as usize..(offset + len as u64) as usize].to_vec())
                }
                PeerOp::BackfillJoin { targets } => {
                    let targets = self.elide.as_mut().map_or_else(Vec::new, |e| e.begin_join(&targets));
                    if !targets.is_empty() && self.join_busy > 0 {
                        self.join_busy -= 1;
                        return PeerReply::Busy;
                    }
                    PeerReply::Join {
                        targets,
                        last_seq: 5,
                        last_epoch: 1,
                        members: vec![0],
                        backfill: self.targets.keys().copied().collect(),
                        requests: Vec::new(),
                    }
                }
                PeerOp::BackfillJoined => {
                    if self.elide.as_mut().is_some_and(|e| e.finish_join()) {
                        PeerReply::Done
                    } else {
                        PeerReply::Refused("no join under way".into())
                    }
                }
                other => panic!("{other:?} sent to the primary"),
            }
        }
    }

    #[test]
    fn a_walk_first_joins_its_dormant_targets_and_asks_again_while_writes_are_in_flight() {
        let (_, steps) = Backfill::start(7, 9, 0, vec![1, 2]);
        assert_eq!(
            steps,
            vec![Step::Send { to: 0, tag: 1, op: PeerOp::BackfillJoin { targets: vec![1, 2] } }],
            "nothing is walked before the join"
        );
        // osd.1 is outside the members and dormant; osd.2 is a member
        // filled in the background, which took every write all along.
        let primary: Objects = [(b"a".to_vec(), vec![1; 10]), (b"c".to_vec(), vec![2; 10])].into();
        let mut model = Model::new(primary, [(1, Objects::new()), (2, Objects::new())].into());
        model.elide = crate::pg::elide::Elide::new(vec![1]);
        model.join_busy = 2;
        // Written once the walk steps onto "c": after the join, ahead of the walk.
        model.writes_on_lock = vec![(b"c".to_vec(), b"d".to_vec(), vec![4; 3])];
        let (_, end) = run(&mut model, None);
        assert_eq!(end, Step::Complete);
        assert_eq!(model.activated, vec![1], "only the dormant target is activated again");
        assert_eq!(model.later, 2, "the join is asked again while writes are in flight");
        assert_eq!(model.elided, 1, "the joined target got the write ahead of the walk elided");
        assert_eq!(model.targets[&1], model.primary, "the joined target holds the whole PG");
        assert_eq!(model.targets[&2], model.primary);
        assert_eq!(model.done, vec![1, 2]);
    }

    #[test]
    fn a_join_with_no_dormant_target_holds_nothing_and_the_walk_goes_on() {
        let primary: Objects = [(b"a".to_vec(), vec![1; 10])].into();
        let mut model = Model::new(primary, [(1, Objects::new())].into());
        model.join_busy = 5;
        let (_, end) = run(&mut model, None);
        assert_eq!(end, Step::Complete);
        assert!(model.activated.is_empty() && model.later == 0, "no join, no hold, no wait");
        assert_eq!(model.targets[&1], model.primary);
    }

    #[test]
    fn a_clone_made_after_the_listings_is_walked_right_after_its_head() {
        let clone = [&b"snapped"[..], &[0], &1u64.to_be_bytes()].concat();
        // Pages of two names: the head's page names the one after it too,
        // so the clone, made between them later, is in no page.
        let primary: Objects =
            [(b"snapped".to_vec(), vec![2; 10]), (b"z".to_vec(), vec![3; 10]), (b"zz".to_vec(), vec![1; 10])].into();
        // The target holds a stale clone of the head too.
        let stale = [&b"snapped"[..], &[0], &0u64.to_be_bytes()].concat();
        let mut model = Model::new(primary, [(1, Objects::from([(stale, vec![9; 4])]))].into());
        model.clone_on_lock = Some((b"snapped".to_vec(), clone.clone(), vec![4; 10]));
        let (_, end) = run(&mut model, None);
        assert_eq!(end, Step::Complete);
        assert!(model.primary.contains_key(&clone), "the write made the clone");
        assert_eq!(model.targets[&1], model.primary, "the clone the listings missed was copied, the stale one removed");
    }

    #[test]
    fn objects_written_ahead_of_the_walk_without_their_data_are_walked_even_when_no_listing_names_them() {
        // Pages of two names: the first is [a, c]; "b" and "bb" are created
        // after it was listed, ahead of the walk, and "e" changed ahead of
        // it: the target gets those writes elided. "a" is written once the
        // walk is past it: that write goes whole.
        let primary: Objects =
            [(b"a".to_vec(), vec![1; 10]), (b"c".to_vec(), vec![2; 10]), (b"e".to_vec(), vec![3; 10])].into();
        let stale: Objects = [(b"a".to_vec(), vec![1; 10]), (b"e".to_vec(), vec![9; 10])].into();
        let mut model = Model::new(primary, [(1, stale)].into());
        model.elide = crate::pg::elide::Elide::new(vec![1]);
        model.writes_on_lock = vec![
            (b"a".to_vec(), b"bb".to_vec(), vec![5; 7]),
            (b"a".to_vec(), b"e".to_vec(), vec![4; 10]),
            (b"c".to_vec(), b"b".to_vec(), vec![6; 3]),
            (b"c".to_vec(), b"a".to_vec(), vec![7; 10]),
        ];
        let (machine, end) = run(&mut model, None);
        assert_eq!(end, Step::Complete);
        assert_eq!(model.targets[&1], model.primary, "every elided write's effect was copied");
        assert_eq!(model.elided, 3, "the writes to b, bb and e went without their data; a's went whole");
        // At c's step ("b" and "bb" owed), and at the end (none: "e" is listed).
        assert_eq!(model.owed_answers, 1);
        assert!(model.elide.is_none(), "the walk ended: nothing is elided any more");
        assert_eq!(model.done, vec![1]);
        assert_eq!(machine.progress.objects_copied, 4, "b, bb, c and e (a was level)");
    }

    #[test]
    fn a_walk_may_not_end_while_it_owes_an_object() {
        // The last object is walked; then a write creates one after it.
        let primary: Objects = [(b"a".to_vec(), vec![1; 10])].into();
        let mut model = Model::new(primary, [(1, Objects::new())].into());
        model.elide = crate::pg::elide::Elide::new(vec![1]);
        // Made while "a" is walked (at its first chunk's lock), past it.
        model.writes_on_lock = vec![(b"a".to_vec(), b"z".to_vec(), vec![8; 4])];
        let (_, end) = run(&mut model, None);
        assert_eq!(end, Step::Complete);
        assert_eq!(model.elided, 1);
        assert_eq!(model.owed_answers, 1, "the end was answered with z");
        assert_eq!(model.targets[&1], model.primary);
    }

    #[test]
    fn a_writer_creating_objects_past_the_last_one_cannot_keep_the_walk_from_ending() {
        // Each object the walk owes gets a successor created while it is
        // walked, sorting after it (a sequential fill): once the walk asked
        // to end, those writes go whole, so what it owes only shrinks.
        let primary: Objects = [(b"a".to_vec(), vec![1; 10])].into();
        let mut model = Model::new(primary, [(1, Objects::new())].into());
        model.elide = crate::pg::elide::Elide::new(vec![1]);
        model.writes_on_lock = vec![
            (b"a".to_vec(), b"b".to_vec(), vec![2; 10]),
            (b"b".to_vec(), b"c".to_vec(), vec![3; 10]),
            (b"c".to_vec(), b"d".to_vec(), vec![4; 10]),
        ];
        let (_, end) = run(&mut model, None);
        assert_eq!(end, Step::Complete);
        assert_eq!(model.elided, 1, "only b, made before the walk asked to end");
        assert_eq!(model.owed_answers, 1);
    }

    fn run(model: &mut Model, mut deleted_after_listing: Option<Vec<u8>>) -> (Backfill, Step) {
        let targets = model.targets.keys().copied().collect();
        let (mut machine, steps) = Backfill::start(7, 9, 0, targets);
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

    fn patterned(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i % 251) as u8 ^ seed | 1).collect()
    }

    #[test]
    fn every_object_reaches_every_target_in_locked_chunks_and_zeros_are_skipped() {
        let big = patterned(2 * BACKFILL_CHUNK_BYTES as usize + 1000, 0);
        let mut sparse = vec![0u8; 2 * BACKFILL_CHUNK_BYTES as usize];
        sparse[BACKFILL_CHUNK_BYTES as usize + 5] = 9;
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
        let mut model = Model::new(primary, [(1, partial.clone()), (2, partial)].into());
        model.busy = 2;
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
        let nonzero_chunks = 5 + (2 * BACKFILL_CHUNK_BYTES + 1000) + BACKFILL_CHUNK_BYTES;
        assert_eq!(machine.progress.bytes_copied, 2 * nonzero_chunks, "zero chunks are not sent");
        assert_eq!(model.sent.get("digest"), None, "a copy that was reset is not compared");
    }

    #[test]
    fn a_target_that_kept_its_copy_gets_only_what_differs_and_loses_what_the_primary_lacks() {
        let chunk = BACKFILL_CHUNK_BYTES as usize;
        let same = patterned(3 * chunk, 1);
        let mut one_chunk_off = same.clone();
        one_chunk_off[chunk + 17] ^= 0xff;
        let primary: Objects = [
            (b"b".to_vec(), same.clone()),
            (b"d".to_vec(), same.clone()),
            (b"f".to_vec(), vec![0; chunk]),
            (b"g".to_vec(), b"new here".to_vec()),
        ]
        .into();
        // Target 1 held the PG before (an OSD marked back in): one chunk
        // of "d" is stale, and it still has objects the primary deleted
        // meanwhile, named before, between and after the primary's.
        let mut stale_zeros = vec![0; chunk];
        stale_zeros[3] = 1;
        let held: Objects = [
            (b"a".to_vec(), b"deleted since".to_vec()),
            (b"b".to_vec(), same.clone()),
            (b"c".to_vec(), b"deleted too".to_vec()),
            (b"d".to_vec(), one_chunk_off),
            (b"f".to_vec(), stale_zeros),
            (b"z".to_vec(), b"deleted last".to_vec()),
        ]
        .into();
        // Target 2 is new.
        let mut model = Model::new(primary, [(1, held), (2, Objects::new())].into());
        let (machine, end) = run(&mut model, None);
        assert_eq!(end, Step::Complete);
        for (id, store) in &model.targets {
            assert_eq!(store, &model.primary, "target {id}");
        }
        // Target 1: one chunk of "d", the zero chunk of "f" (its copy held
        // a stray byte there) and all of "g"; target 2: everything but zeros.
        let to_target_1 = chunk as u64 + chunk as u64 + 8;
        let to_target_2 = 3 * chunk as u64 * 2 + 8;
        assert_eq!(machine.progress.bytes_copied, to_target_1 + to_target_2);
        assert_eq!(machine.progress.objects_removed, 3, "a, c and z");
        assert_eq!(model.sent["digest"], 3 + 3 + 1, "each chunk target 1 kept is compared");
        assert_eq!(model.sent["start"], 1 + 4, "target 1 lacked g; target 2 lacked all");
        // And after each removal (a, c, z), each target is asked for the
        // clones the removed head may have left.
        assert_eq!(
            model.sent["list"],
            3 + 1 + 2 * 3,
            "target 1's listing, in pages of two, target 2's one empty page, and the clones of a, c and z"
        );
    }

    #[test]
    fn a_walk_of_given_objects_lists_nothing_and_touches_only_those() {
        let primary: Objects =
            [(b"a".to_vec(), b"new a".to_vec()), (b"b".to_vec(), b"bbbb".to_vec()), (b"c".to_vec(), b"cc".to_vec())]
                .into();
        // Behind by history: "a" changed and "z" was deleted since its last
        // entry; "b" differs too, which its history does not name (so this
        // walk must leave it: it shows the walk is bounded by the names).
        let held: Objects = [
            (b"a".to_vec(), b"old a".to_vec()),
            (b"b".to_vec(), b"BBBB".to_vec()),
            (b"c".to_vec(), b"cc".to_vec()),
            (b"z".to_vec(), b"gone".to_vec()),
        ]
        .into();
        let mut model = Model::new(primary, [(1, held)].into());
        let (mut machine, steps) =
            Backfill::start_with(7, 9, 0, vec![1], Some(vec![b"z".to_vec(), b"a".to_vec()]), false);
        let mut queue: VecDeque<Step> = steps.into();
        let mut end = None;
        while let Some(step) = queue.pop_front() {
            match step {
                Step::Send { to, tag, op } => {
                    let reply = model.answer(to, op);
                    queue.extend(machine.on_reply(tag, reply));
                }
                other => end = Some(other),
            }
        }
        assert_eq!(end, Some(Step::Complete));
        let target = &model.targets[&1];
        assert_eq!(target[&b"a".to_vec()], b"new a".to_vec());
        assert!(!target.contains_key(&b"z".to_vec()), "deleted since: removed");
        assert_eq!(target[&b"b".to_vec()], b"BBBB".to_vec(), "not named: not walked");
        assert_eq!(model.sent.get("list"), None, "nothing listed");
        assert_eq!(model.done, vec![1]);
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
