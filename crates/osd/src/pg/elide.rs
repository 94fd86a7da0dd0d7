//! A primary's writes to its backfill targets, without the data the
//! backfill will copy anyway (docs/QOS.md, step 6).
//!
//! During a backfill every write to the PG also went to each target in
//! full: a third copy, on a machine whose CPU is what client latency
//! waits for (docs/BENCHMARKS.md, session 34). Like Ceph's
//! `should_send_op`, a write to an object the walk has not reached yet
//! now goes to a target as an *elided* entry (`duplex_oplog::OpKind::Elided`):
//! its seq, object, request id and snapshot sequence, so the target's log
//! stays whole, but nothing to apply. The walk then copies the object's
//! state, those writes included, when it gets there.
//!
//! What makes that safe is that the walk reaches every object a write was
//! elided for, after that write. The walk's listings cannot promise it:
//! an object created after its page was listed is in none. So the primary
//! keeps the names itself, under the PG's lock with the write's append,
//! and its store answers the walk's step onto an object, and the walk's
//! end, with the names it still owes (`Elide::start`, `Elide::end`). The
//! walk goes to those first (crate::peering::backfill). Once it has
//! ended, every write goes whole again.
//!
//! Not while the primary is its PG's one whole copy (a size 2, min_size 1
//! PG with one member): the targets are then the only other place its
//! writes live, and closing the known gap "The one whole copy of a PG
//! being filled" (docs/RELIABILITY.md) would take them from there.
//!
//! **Dormant targets.** A target takes no write at all until its PG's walk
//! begins. A primary walks one PG at a time, and an OSD marked in is the
//! target of most of the PGs that move to it at once: each write to every
//! one of them used to cost it a frame, a log append and an
//! acknowledgement (an elided write costs the target nearly what a whole
//! one does: the per-write work, not the 4 KiB, is what a 2-vCPU machine
//! spends; docs/BENCHMARKS.md, session 38). The walk's first step
//! *joins* its targets ([`Elide::begin_join`], `PeerOp::BackfillJoin`):
//! the primary holds the PG's client writes (they are answered `Retry`),
//! and once none is in flight, the targets are activated again at the
//! primary's last seq with its request ids, as peering activated them
//! (their logs are empty: they took nothing). Then the writes go to them
//! from the next seq on ([`Elide::finish_join`]), and the hold ends. A
//! hold that lasts [`JOIN_HOLD`] from the first write it held ends by
//! itself (a target that does not answer holds no PG's writes for long);
//! the targets stay dormant and the walk starts over with the PG's next
//! peering.
//!
//! A target's copy is marked incomplete until its backfill ends, and an
//! incomplete copy is never peering's authority nor level with a member
//! (it reports no log: `flusher::member`'s query), so the entries it
//! holds without their data are never anyone's source of data.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// How long a join may hold a PG's client writes, from the first it held.
/// A join takes a round trip to each target and two through the
/// primary's own store thread: milliseconds.
pub const JOIN_HOLD: Duration = Duration::from_secs(1);

/// A primary PG's state while it has backfill targets that are not members.
#[derive(Debug)]
pub struct Elide {
    /// The object the walk is on (or last stepped onto): writes to it and
    /// to every object before it go whole. Empty: the walk has not begun.
    after: Bytes,
    /// Objects after `after` whose writes went elided: each is walked
    /// before the walk may end.
    owed: BTreeSet<Bytes>,
    /// The backfill targets that are not members: only they take elided
    /// writes (a member filled in the background is sent every write).
    targets: Vec<u32>,
    /// The walk asked to end: nothing more is elided, so what it owes only
    /// shrinks. Otherwise a writer creating objects that sort after
    /// every other (a sequential fill) could keep it owing for ever.
    closing: bool,
    /// The targets that joined the PG's writes: they take every write
    /// from then on, whole or elided. The others are dormant: no write
    /// goes to them.
    joined: Vec<u32>,
    /// A join under way: its targets, and when its hold first held a write.
    joining: Option<Joining>,
}

#[derive(Debug)]
struct Joining {
    targets: Vec<u32>,
    since: Option<Instant>,
}

impl Elide {
    /// The state for an interval whose backfill fills `targets` (those
    /// that are not members); `None` when there are none.
    pub fn new(targets: Vec<u32>) -> Option<Elide> {
        (!targets.is_empty()).then(|| Elide {
            after: Bytes::new(),
            owed: BTreeSet::new(),
            targets,
            closing: false,
            joined: Vec::new(),
            joining: None,
        })
    }

    /// The targets that take the PG's writes (whole, or elided).
    pub fn joined(&self) -> &[u32] {
        &self.joined
    }

    /// Whether `osd` is a target that takes no write yet.
    pub fn is_dormant(&self, osd: u32) -> bool {
        self.targets.contains(&osd) && !self.joined.contains(&osd)
    }

    /// The dormant targets among `asked`, in order, once each.
    pub fn dormant_among(&self, asked: &[u32]) -> Vec<u32> {
        let mut dormant: Vec<u32> = asked.iter().copied().filter(|t| self.is_dormant(*t)).collect();
        dormant.sort_unstable();
        dormant.dedup();
        dormant
    }

    /// Whether a client write to the PG must wait (answered `Retry`): a
    /// join holds them, for at most [`JOIN_HOLD`] from the first it held.
    pub fn holds(&mut self, now: Instant) -> bool {
        let Some(joining) = self.joining.as_mut() else { return false };
        let since = *joining.since.get_or_insert(now);
        if now.saturating_duration_since(since) < JOIN_HOLD {
            return true;
        }
        tracing::warn!(targets = ?joining.targets, "a backfill join held writes too long; its targets stay dormant");
        self.joining = None;
        false
    }

    /// The walk begins (`PeerOp::BackfillJoin` of `asked`): the dormant
    /// targets among them, whose join now holds the PG's writes; none:
    /// nothing to join, nothing held. Asked again (writes were in
    /// flight), the hold goes on from when it began.
    pub fn begin_join(&mut self, asked: &[u32]) -> Vec<u32> {
        let dormant = self.dormant_among(asked);
        match &self.joining {
            _ if dormant.is_empty() => {}
            Some(joining) if joining.targets == dormant => {}
            _ => self.joining = Some(Joining { targets: dormant.clone(), since: None }),
        }
        dormant
    }

    /// Whether a join of exactly `targets` is under way.
    pub fn is_joining(&self, targets: &[u32]) -> bool {
        self.joining.as_ref().is_some_and(|joining| joining.targets == targets)
    }

    /// `PeerOp::BackfillJoined`: the join's targets take the writes from
    /// now on, and the hold ends; `false` if no join is under way (its
    /// hold expired: they stay dormant).
    pub fn finish_join(&mut self) -> bool {
        let Some(joining) = self.joining.take() else { return false };
        self.joined.extend(joining.targets);
        debug_assert!(
            self.joined.iter().all(|t| self.targets.contains(t)),
            "joined {:?} of {:?}",
            self.joined,
            self.targets
        );
        true
    }

    /// Whether a write to `object` goes to the joined targets elided (the
    /// walk is not on it yet); if so, the walk owes it a visit.
    pub fn elides(&mut self, object: &[u8]) -> bool {
        if self.joined.is_empty() || self.closing || object <= &self.after[..] {
            return false;
        }
        // A copy, not a slice of the request: that would keep its whole
        // frame (the write's data) alive until the walk gets there.
        if !self.owed.contains(object) {
            self.owed.insert(Bytes::copy_from_slice(object));
        }
        true
    }

    /// The walk asks to step onto `object`: the names it owes before it
    /// (to walk first: `Some`), or none, and `object` is where it is now.
    /// Asked again (its lock was busy), it answers the same way.
    pub fn start(&mut self, object: &[u8]) -> Option<Vec<Vec<u8>>> {
        let before: Vec<Vec<u8>> =
            self.owed.range::<[u8], _>((Bound::Unbounded, Bound::Excluded(object))).map(|name| name.to_vec()).collect();
        if !before.is_empty() {
            return Some(before);
        }
        self.owed.remove(object);
        self.after = Bytes::copy_from_slice(object);
        debug_assert!(self.owed.iter().all(|name| *name > self.after), "an owed name at or before the walk");
        None
    }

    /// The walk asks to end: the names it still owes (`Some`), or none,
    /// and the caller drops this state. Either way nothing more is elided:
    /// a write from now goes whole, even to an object still owed (the
    /// walk then compares it, as it would have before eliding existed).
    pub fn end(&mut self) -> Option<Vec<Vec<u8>>> {
        self.closing = true;
        (!self.owed.is_empty()).then(|| self.owed.iter().map(|name| name.to_vec()).collect())
    }
}

/// The primary's side of a backfill lock request (`PeerOp::BackfillLock`
/// of `object`'s bytes `start..end`) as far as eliding goes: the objects
/// the walk owes before it may step onto a whole object, or end (`Some`:
/// the answer, and no lock is taken), or `None`: carry on. Once the walk
/// ends owing nothing, eliding stops: every write goes whole again.
pub fn owed_before_lock(
    elide: &mut Option<Elide>,
    object: Option<&[u8]>,
    start: u64,
    end: u64,
) -> Option<Vec<Vec<u8>>> {
    let state = elide.as_mut()?;
    match object {
        Some(object) if start == 0 && end == u64::MAX => state.start(object),
        Some(_) => None,
        None if start == 0 && end == u64::MAX => {
            let owed = state.end();
            if owed.is_none() {
                *elide = None;
            }
            owed
        }
        // A chunk's lock released between chunks.
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_targets_outside_the_members_means_nothing_to_elide() {
        assert!(Elide::new(Vec::new()).is_none());
    }

    #[test]
    fn only_a_primary_with_another_whole_member_elides_and_only_to_outside_targets() {
        let activation =
            |members: Vec<u32>, backfill: Vec<u32>| crate::pg::Activation { interval: 9, members, backfill };
        // osd.2 is a member filled in the background: it gets every write whole.
        let pinned = activation(vec![0, 1, 2], vec![2, 3]);
        assert_eq!(pinned.elided_targets(0), vec![3]);
        assert!(pinned.elided_targets(1).is_empty(), "only the primary sends writes");
        assert!(pinned.takes_elided(3) && !pinned.takes_elided(2) && !pinned.takes_elided(1));
        // The PG's one whole copy: its target is the only other place its writes live.
        assert!(activation(vec![0], vec![3]).elided_targets(0).is_empty());
        // A member filled in the background is not whole yet: osd.0 is still the one whole copy.
        assert!(activation(vec![0, 2], vec![2, 3]).elided_targets(0).is_empty());
    }

    fn joined(targets: Vec<u32>) -> Elide {
        let mut elide = Elide::new(targets.clone()).expect("a target");
        assert_eq!(elide.begin_join(&targets), targets);
        assert!(elide.finish_join());
        elide
    }

    #[test]
    fn dormant_targets_take_nothing_until_a_join_which_holds_writes_for_a_while() {
        let mut elide = Elide::new(vec![3, 4]).expect("targets");
        assert!(elide.is_dormant(3) && elide.is_dormant(4) && !elide.is_dormant(1));
        assert!(!elide.elides(b"a"), "a dormant target is sent nothing, so nothing is owed");
        let now = Instant::now();
        assert!(!elide.holds(now), "no join: writes go on");
        assert!(!elide.finish_join(), "no join under way");
        // The walk names osd.4 and osd.5 (osd.5 is a member filled in the
        // background: never dormant); osd.3 stays dormant.
        assert_eq!(elide.begin_join(&[5, 4, 4]), vec![4]);
        assert!(elide.holds(now), "the join holds the PG's writes");
        assert_eq!(elide.begin_join(&[4, 5]), vec![4], "asked again: the same join");
        assert!(elide.holds(now + JOIN_HOLD / 2), "held from the first write it held");
        assert!(!elide.holds(now + JOIN_HOLD), "a hold ends by itself");
        assert!(!elide.finish_join(), "the expired join ends nothing: osd.4 stays dormant");
        assert!(elide.is_dormant(4));
        assert_eq!(elide.begin_join(&[4]), vec![4]);
        assert!(elide.finish_join());
        assert!(!elide.is_dormant(4) && elide.is_dormant(3));
        assert_eq!(elide.joined(), &[4]);
        assert!(!elide.holds(now + JOIN_HOLD * 3), "joined: no hold");
        assert!(elide.begin_join(&[4]).is_empty(), "joined already: nothing to join");
        assert!(!elide.holds(now + JOIN_HOLD * 3));
        assert!(elide.elides(b"a"), "writes ahead of the walk go to the joined target elided");
    }

    #[test]
    fn writes_ahead_of_the_walk_are_owed_and_walked_before_it_moves_past_them() {
        let mut elide = joined(vec![3]);
        // Before the walk's first step, every write is ahead of it.
        assert!(elide.elides(b"m"));
        assert!(elide.elides(b"m"), "a second write to the same object");
        assert!(elide.elides(b"c"));
        // The walk's listing starts at "d": "c" was created after it was listed.
        assert_eq!(elide.start(b"d"), Some(vec![b"c".to_vec()]));
        assert_eq!(elide.start(b"c"), None, "the walk goes to c first");
        assert!(!elide.elides(b"c"), "the walk is on it: its writes go whole");
        assert!(!elide.elides(b"a"), "behind the walk");
        assert_eq!(elide.start(b"d"), None);
        assert!(elide.elides(b"e"));
        assert_eq!(elide.start(b"m"), Some(vec![b"e".to_vec()]));
        assert_eq!(elide.start(b"e"), None);
        assert_eq!(elide.start(b"e"), None, "asked again after a busy lock");
        assert_eq!(elide.end(), Some(vec![b"m".to_vec()]), "the walk may not end owing m");
        assert!(!elide.elides(b"z"), "once it asked to end, writes go whole: what it owes only shrinks");
        assert_eq!(elide.start(b"m"), None);
        assert_eq!(elide.end(), None);
    }

    #[test]
    fn the_lock_requests_answer_owed_objects_and_the_end_stops_eliding() {
        let mut elide = Some(joined(vec![3]));
        assert!(elide.as_mut().expect("a target").elides(b"k"));
        assert_eq!(owed_before_lock(&mut elide, Some(b"z"), 0, 256), None, "a chunk's lock owes nothing");
        assert_eq!(owed_before_lock(&mut elide, None, 0, 0), None, "nor does its release");
        assert_eq!(owed_before_lock(&mut elide, Some(b"z"), 0, u64::MAX), Some(vec![b"k".to_vec()]));
        assert_eq!(owed_before_lock(&mut elide, None, 0, u64::MAX), Some(vec![b"k".to_vec()]), "nor may it end");
        assert!(elide.is_some());
        assert_eq!(owed_before_lock(&mut elide, Some(b"k"), 0, u64::MAX), None);
        assert_eq!(owed_before_lock(&mut elide, None, 0, u64::MAX), None);
        assert!(elide.is_none(), "the walk ended: every write goes whole");
        assert_eq!(owed_before_lock(&mut elide, Some(b"a"), 0, u64::MAX), None);
    }
}
