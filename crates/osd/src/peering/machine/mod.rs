//! Peering and recovery of one PG, run by its primary: a sans-I/O state
//! machine. It says what to ask which member ([`Action::Send`]) and is told
//! the answers ([`Peering::on_reply`]); the OSD's peering thread
//! ([`crate::peering::driver`]) carries them over the network (or to the
//! local store), and a simulator can carry them over a modelled one.
//!
//! The steps (docs/RELIABILITY.md, "Peering and recovery"):
//!
//! 1. **Query** every member of the new interval, the primary included.
//!    Each one stops taking replicated entries of older intervals, applies
//!    its operation log to its store and reports its [`PeerInfo`].
//! 2. **Authority:** the member with the newest `last_active` interval,
//!    then the highest `last_seq`. Members active in the same interval
//!    logged prefixes of one primary's sequence, so the longest one holds
//!    every write acknowledged in it (an acknowledgement needs every member).
//!    But only if one OSD of the PG's last active set (in the map, see
//!    `duplex_map::active_set`) answered with a whole copy and kept its
//!    log (or all of them answered): those hold every write the
//!    PG acknowledged. Otherwise the PG is down and waits.
//! 3. **Recover** each other member in turn. One whose newest entry (seq
//!    and epoch) is in the authority's recent history is only behind: it
//!    gets the objects that history names for the seqs it lacks. Any other
//!    (divergent, lost its log, too far behind, never seen) is **backfilled**:
//!    both object lists with digests are compared, differing objects are
//!    copied whole and extra ones removed.
//! 4. **Record** the members as the PG's last active set, if the map does
//!    not name them already ([`Action::Record`]): the driver asks the
//!    monitor and tells the machine when its map shows them.
//! 5. **Activate** every member at the authority's `last_seq`: new writes
//!    continue one sequence, and each member persists the interval as its
//!    `last_active`. Only when all have answered is the PG active: client
//!    I/O waits (is answered `Retry`) until then.
//!
//! Any refusal or lost member stops the machine ([`Action::Stuck`]); the
//! driver starts a fresh one later (or at the next map).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use duplex_map::OsdId;
use duplex_proto::peering::{
    Inconsistency, LoggedRequest, ObjectDigest, ObjectMeta, PeerInfo, PeerOp, PeerReply, ScrubReport, CHUNK_BYTES,
};

use crate::pg::requests::merge_logged;

mod authority;
mod ec_scrub;
mod erasure;
mod recovery;
mod scrub;
#[cfg(test)]
mod tests;

pub use authority::choose_authority;
use authority::{plan_for, rank, whole_target_over, whole_with_its_log};

/// What the driver does next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Ask `to` (possibly this OSD itself); answer with `on_reply(tag, ..)`.
    Send { to: OsdId, tag: u64, op: PeerOp },
    /// Every member agrees: the PG serves I/O. `backfill`: the targets
    /// activated with it, to fill in the background.
    Active { authority: OsdId, last_seq: u64, recovered_objects: u64, backfill: Vec<OsdId> },
    /// Peering cannot finish now; start again later.
    Stuck(String),
    /// Have the monitor record `members` as the PG's last active set
    /// (`duplex_map::Command::RecordActive`), and call
    /// [`Peering::on_recorded`] when the map shows it. Nothing activates
    /// before.
    Record { members: Vec<OsdId> },
    /// This OSD's own copy needs a backfill: have the monitor pin the PG to
    /// `acting`, its acting set with a whole member first
    /// (`duplex_map::Command::HandOver`), which then serves while this one
    /// is filled in the background. The machine waits for the new map.
    HandOver { acting: Vec<OsdId> },
}

/// Progress, for `duplex status` and the logs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    pub objects_copied: u64,
    pub objects_removed: u64,
    pub bytes_copied: u64,
}

pub struct Peering {
    pub pg: u32,
    pub interval: u64,
    members: Vec<OsdId>,
    /// Backfill targets: up-set OSDs that do not hold the PG yet (the map
    /// pins it to `members` meanwhile). They are fenced and activated with
    /// the members, to take every write of the interval, but have no say
    /// in its history, unless one's copy is whole and newer than every
    /// member's ([`Peering::whole_targets`]). One that cannot be reached is
    /// left out; the PG goes active without it.
    targets: Vec<OsdId>,
    /// Targets that answered with a whole copy: a backfill that ended in
    /// an interval whose primary missed the end (the connection broke as
    /// it came). Such a copy took every write of that interval, like a
    /// member's; one that outranks every member's is the authority
    /// (`authority::whole_target_over`), else it is filled again.
    whole_targets: BTreeMap<OsdId, (PeerInfo, Vec<LoggedRequest>)>,
    phase: Phase,
    next_tag: u64,
    pub progress: Progress,
    /// A deep scrub follows recovery (`Some(repair)`).
    scrub: Option<bool>,
    scrub_report: Option<ScrubReport>,
    /// The PG's last active set in the map: as it was when peering began
    /// (`None`: never recorded; empty: its OSDs were marked lost), then the
    /// members once the map records them.
    active_set: Option<Vec<OsdId>>,
    /// Fill members that need a backfill in the background, when the
    /// others that are whole number at least this (the pool's min_size):
    /// see [`Peering::fill_in_background`]. `None`: inside peering.
    background_min: Option<usize>,
    /// Members filled in the background in this interval: activated as
    /// backfill targets, and members once that ends (a peering again).
    filled_in_background: Vec<OsdId>,
    /// What their backfill walks: only these objects, when every one of
    /// them was behind by history (the rest of their copy is the
    /// authority's already); `None`, every object.
    fill_only: Option<BTreeSet<Vec<u8>>>,
    /// An erasure-coded PG's code: its members hold different shards, so
    /// none is recovered from another's copy (`erasure.rs`).
    erasure: Option<duplex_ec::Profile>,
    /// An erasure-coded PG's members by shard position, a missing one
    /// [`duplex_map::NO_OSD`]: what it records and activates (empty:
    /// replicated).
    shards: Vec<OsdId>,
    /// An erasure-coded PG stuck for want of current shards: the members
    /// at their recorded positions whose copies no longer hold those
    /// shards, for the monitor to take out of the record
    /// (`duplex_map::Command::UnrecordShards`) so that the PG's pin goes
    /// back to the holders that do (`erasure.rs`). Empty: none to ask.
    unrecord: Vec<OsdId>,
}

enum Phase {
    Querying {
        waiting: BTreeMap<u64, OsdId>,
        infos: BTreeMap<OsdId, (PeerInfo, Vec<LoggedRequest>)>,
    },
    Recovering(Box<Recovery>),
    /// Recovered: waiting for the map to record the members.
    Recording(Box<Recovery>),
    /// Waiting for the map to hand the PG to `acting[0]`.
    HandingOver {
        acting: Vec<OsdId>,
    },
    /// The replicas are activated first; `primary` is the primary's own
    /// activation, sent once they all have answered (`None`: sent).
    Activating {
        waiting: BTreeMap<u64, OsdId>,
        authority: OsdId,
        last_seq: u64,
        primary: Option<PeerOp>,
    },
    Active,
    Stuck,
}

struct Recovery {
    authority: OsdId,
    info: PeerInfo,
    /// Members still to recover, with how: by history or by backfill.
    targets: VecDeque<(OsdId, Plan)>,
    /// The member whose object list is being gathered, and the step it is at.
    listing: Option<(OsdId, Step)>,
    /// Copies and removals planned, and the one under way.
    work: VecDeque<Work>,
    copy: Option<Copy>,
    /// Members whose store this peering changed.
    changed: BTreeSet<OsdId>,
    /// The request ids each member logged.
    logged: BTreeMap<OsdId, Vec<LoggedRequest>>,
    /// Members whose log is a prefix of the authority's (the authority's
    /// own included): every id they logged is in the history.
    on_history: BTreeSet<OsdId>,
    /// The request outstanding (one at a time during recovery).
    waiting: Option<u64>,
    scrub: Option<Scrub>,
    /// Members behind by history to fill in the background, once the
    /// authority has named the objects they lack.
    history_in_background: BTreeSet<OsdId>,
    /// An erasure-coded PG's recovery (`erasure.rs`).
    ec: Option<Box<erasure::EcRecovery>>,
}

/// A deep scrub after recovery: every member's digests, compared.
struct Scrub {
    repair: bool,
    to_list: VecDeque<OsdId>,
    /// The member being listed, the cursor, what it listed so far.
    listing: Option<(OsdId, Vec<u8>, Vec<ObjectDigest>)>,
    digests: BTreeMap<OsdId, Vec<ObjectDigest>>,
    report: Option<ScrubReport>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    /// Only behind on the authority's history: the objects of seqs `(after, ..]`.
    History {
        after: u64,
        after_epoch: u32,
    },
    Backfill,
}

enum Step {
    AskTouched,
    ListAuthority { cursor: Vec<u8>, objects: Vec<ObjectDigest> },
    ListTarget { cursor: Vec<u8>, authority: Vec<ObjectDigest>, objects: Vec<ObjectDigest> },
}

#[derive(Debug)]
enum Work {
    Copy { object: Vec<u8>, from: OsdId, to: OsdId },
    Remove { object: Vec<u8>, on: OsdId },
}

/// One object being copied (or removed).
struct Copy {
    object: Vec<u8>,
    from: OsdId,
    to: OsdId,
    stage: CopyStage,
}

/// An object's copy goes whole or not at all: its chunks are staged on the
/// target, which installs them in one store batch with the ids of the
/// mutations the copy carries. A peering cut short between two objects
/// leaves every object on the target either as it was or as the source's,
/// and the target knows the ids of what it shows (stored_interval.rs,
/// `recovered`, says why that matters).
enum CopyStage {
    /// Asked the source for the object's size and attributes.
    Stat,
    /// Asked the source for the bytes at `offset`; `staged` bytes are staged.
    Pull { meta: ObjectMeta, offset: u64, staged: u64 },
    /// Asked the target to stage a chunk; the next pull is at `offset`.
    Stage { meta: ObjectMeta, offset: u64, staged: u64 },
    /// Asked the source for the ids of the object's mutations.
    Ids { meta: Option<ObjectMeta>, staged: u64 },
    /// Asked the target to install the object (or remove it).
    Install,
}

impl Peering {
    /// Starts peering `pg` for the interval beginning at map epoch
    /// `interval`, with `members[0]` the primary (this OSD), whose map
    /// records them as the PG's last active set already.
    pub fn start(pg: u32, interval: u64, members: Vec<OsdId>) -> (Peering, Vec<Action>) {
        let active_set = Some(members.clone());
        Peering::start_with_targets(pg, interval, members, Vec::new(), None, active_set)
    }

    /// Peering followed by a deep scrub: after recovery, every member's
    /// object digests are compared; with `repair`, bad copies are replaced
    /// from a good one (the authority's when it is readable). The report
    /// is [`Peering::scrub_report`] once active.
    pub fn start_scrub(pg: u32, interval: u64, members: Vec<OsdId>, repair: bool) -> (Peering, Vec<Action>) {
        let active_set = Some(members.clone());
        Peering::start_with_targets(pg, interval, members, Vec::new(), Some(repair), active_set)
    }

    /// Peering of a PG pinned to `members` while `targets` are backfilled,
    /// followed by a deep scrub if `scrub` is `Some(repair)`. `active_set`
    /// is the PG's last active set in the map (`None`: none recorded).
    pub fn start_with_targets(
        pg: u32,
        interval: u64,
        members: Vec<OsdId>,
        targets: Vec<OsdId>,
        scrub: Option<bool>,
        active_set: Option<Vec<OsdId>>,
    ) -> (Peering, Vec<Action>) {
        assert!(!members.is_empty(), "a PG's acting set includes its primary");
        assert!(targets.iter().all(|t| !members.contains(t)), "a backfill target is no member");
        let mut peering = Peering {
            pg,
            interval,
            members: members.clone(),
            targets: targets.clone(),
            whole_targets: BTreeMap::new(),
            phase: Phase::Stuck,
            next_tag: 1,
            progress: Progress::default(),
            scrub,
            scrub_report: None,
            active_set,
            background_min: None,
            filled_in_background: Vec::new(),
            fill_only: Some(BTreeSet::new()),
            erasure: None,
            shards: Vec::new(),
            unrecord: Vec::new(),
        };
        let mut waiting = BTreeMap::new();
        let mut actions = Vec::new();
        // Targets are queried to fence them; their answers count only if
        // whole (`whole_targets`).
        for osd in members.into_iter().chain(targets) {
            let tag = peering.tag();
            waiting.insert(tag, osd);
            actions.push(Action::Send { to: osd, tag, op: PeerOp::Query });
        }
        peering.phase = Phase::Querying { waiting, infos: BTreeMap::new() };
        (peering, actions)
    }

    /// Peering of an erasure-coded PG (see `erasure` in [`Peering`]):
    /// `shards`, its acting set by shard position (a missing one
    /// [`duplex_map::NO_OSD`], at least `k` present), `active_set` as in
    /// [`Peering::start_with_targets`] (positional too), followed by a
    /// scrub of every stripe's parity if `scrub` is `Some(repair)`.
    pub fn start_erasure(
        pg: u32,
        interval: u64,
        shards: Vec<OsdId>,
        active_set: Option<Vec<OsdId>>,
        profile: duplex_ec::Profile,
        scrub: Option<bool>,
    ) -> (Peering, Vec<Action>) {
        assert_eq!(shards.len(), profile.shards(), "an erasure-coded PG's set is positional");
        let members: Vec<OsdId> = shards.iter().copied().filter(|osd| *osd != duplex_map::NO_OSD).collect();
        assert!(members.len() >= profile.k(), "an erasure-coded PG peers with at least k shards");
        let (mut peering, actions) = Peering::start_with_targets(pg, interval, members, Vec::new(), scrub, active_set);
        peering.erasure = Some(profile);
        peering.shards = shards;
        (peering, actions)
    }

    /// A machine that cannot peer this interval at all, for `why`: it is
    /// stuck from the start (the schedule tries again later).
    pub fn refused(pg: u32, interval: u64, members: Vec<OsdId>, why: String) -> (Peering, Vec<Action>) {
        let (mut peering, _) = Peering::start_with_targets(pg, interval, members, Vec::new(), None, None);
        let actions = peering.stuck(why);
        (peering, actions)
    }

    pub fn members(&self) -> &[OsdId] {
        &self.members
    }

    /// What the map records as the PG's last active set for this interval:
    /// the members that hold every acknowledged write when it begins, the
    /// primary first. Not a member filled in the background: its copy is
    /// incomplete until its backfill ends (and the PG then peers again and
    /// records it). Recording one let an empty copy lead once the whole
    /// members died before its activation marked it (simulator seed 1280:
    /// ten acknowledged writes lost).
    pub fn record_members(&self) -> Vec<OsdId> {
        if self.erasure.is_some() {
            // Positional, and every member is whole once recovered.
            return self.shards.clone();
        }
        let record: Vec<OsdId> =
            self.members.iter().copied().filter(|m| !self.filled_in_background.contains(m)).collect();
        debug_assert_eq!(record.first(), self.members.first(), "the primary is whole: it is never filled");
        record
    }

    /// Members whose copy needs a backfill (restarted too far behind, lost
    /// their log, diverged) are filled in the background, as the targets of
    /// a pin are, instead of inside peering with the PG's I/O waiting: if
    /// the members that are whole after peering number at least
    /// `min_size`, no pin's targets are filled in this interval, no scrub
    /// runs and the PG was ever written to. If the primary is one of them
    /// it hands the PG over instead ([`Action::HandOver`]), to be filled by
    /// the new primary. They take every write
    /// of the interval meanwhile and are never the authority; when their
    /// backfill ends the PG peers again and they are members like the
    /// others. Call before the first reply.
    pub fn fill_in_background(&mut self, min_size: usize) {
        assert!(
            matches!(&self.phase, Phase::Querying { infos, .. } if infos.is_empty()),
            "fill_in_background is set before the first answer"
        );
        self.background_min = Some(min_size.max(1));
    }

    /// The members filled in the background in this interval.
    pub fn filled_in_background(&self) -> &[OsdId] {
        &self.filled_in_background
    }

    /// The objects the PG's backfill need walk, if not all: when it fills
    /// only members behind by history, the ones the authority's history
    /// names since each one's last entry.
    pub fn fill_only(&self) -> Option<Vec<Vec<u8>>> {
        if self.filled_in_background.is_empty() || !self.targets.is_empty() {
            return None;
        }
        self.fill_only.as_ref().map(|names| names.iter().cloned().collect())
    }

    /// The OSDs the PG's backfill fills: the pin's targets, then members
    /// filled in the background.
    fn backfill_targets(&self) -> Vec<OsdId> {
        self.targets.iter().chain(&self.filled_in_background).copied().collect()
    }

    /// The backfill targets still in this interval.
    pub fn targets(&self) -> &[OsdId] {
        &self.targets
    }

    /// The target request `tag` went to, if it went to one.
    fn target_of(&self, tag: u64) -> Option<OsdId> {
        let osd = match &self.phase {
            Phase::Querying { waiting, .. } | Phase::Activating { waiting, .. } => waiting.get(&tag).copied(),
            _ => None,
        }?;
        self.targets.contains(&osd).then_some(osd)
    }

    /// A target failed or refused: the PG goes on without it (its primary
    /// tries again at the next interval, or when it retries the machine).
    fn drop_target(&mut self, tag: u64, target: OsdId) -> Vec<Action> {
        debug_assert!(!self.members.contains(&target), "a member dropped as a backfill target");
        self.targets.retain(|t| *t != target);
        match std::mem::replace(&mut self.phase, Phase::Stuck) {
            Phase::Querying { mut waiting, infos } => {
                waiting.remove(&tag);
                if !waiting.is_empty() {
                    self.phase = Phase::Querying { waiting, infos };
                    return Vec::new();
                }
                self.recover(infos)
            }
            Phase::Activating { mut waiting, authority, last_seq, primary } => {
                waiting.remove(&tag);
                self.phase = Phase::Activating { waiting, authority, last_seq, primary };
                self.activation_answered()
            }
            _ => unreachable!("target_of found the tag in one of the phases above"),
        }
    }

    pub fn is_active(&self) -> bool {
        matches!(self.phase, Phase::Active)
    }

    pub fn is_stuck(&self) -> bool {
        matches!(self.phase, Phase::Stuck)
    }

    /// A deep scrub's findings, once the machine is active (None: no scrub ran).
    pub fn scrub_report(&self) -> Option<&ScrubReport> {
        self.scrub_report.as_ref()
    }

    fn tag(&mut self) -> u64 {
        let tag = self.next_tag;
        self.next_tag += 1;
        tag
    }

    /// A member could not be reached, or did not answer in time.
    pub fn on_failure(&mut self, tag: u64, why: &str) -> Vec<Action> {
        if !self.expects(tag) {
            return Vec::new();
        }
        if let Some(target) = self.target_of(tag) {
            return self.drop_target(tag, target);
        }
        self.stuck(format!("PG {:#x}: {why}", self.pg))
    }

    fn expects(&self, tag: u64) -> bool {
        match &self.phase {
            Phase::Querying { waiting, .. } | Phase::Activating { waiting, .. } => waiting.contains_key(&tag),
            Phase::Recovering(recovery) => recovery.waiting == Some(tag),
            Phase::Recording(_) | Phase::HandingOver { .. } | Phase::Active | Phase::Stuck => false,
        }
    }

    fn stuck(&mut self, why: String) -> Vec<Action> {
        self.phase = Phase::Stuck;
        vec![Action::Stuck(why)]
    }

    /// The answer to request `tag`. Answers to requests this machine no
    /// longer waits for (late, or from before it got stuck) are ignored.
    pub fn on_reply(&mut self, tag: u64, reply: PeerReply) -> Vec<Action> {
        if !self.expects(tag) {
            return Vec::new();
        }
        debug_assert!(tag < self.next_tag, "the machine waits on tag {tag}, which it never issued");
        if let Some(target) = self.target_of(tag) {
            let fine = matches!(
                (&self.phase, &reply),
                (Phase::Querying { .. }, PeerReply::Info { .. }) | (Phase::Activating { .. }, PeerReply::Done)
            );
            if !fine {
                return self.drop_target(tag, target);
            }
        }
        if let PeerReply::Refused(why) = &reply {
            return self.stuck(format!("PG {:#x}: a member refused: {why}", self.pg));
        }
        match std::mem::replace(&mut self.phase, Phase::Stuck) {
            Phase::Querying { mut waiting, mut infos } => {
                let osd = waiting.remove(&tag).expect("expected tag");
                let PeerReply::Info { info, requests } = reply else {
                    return self.stuck(format!("osd.{osd} answered a query with {reply:?}"));
                };
                if !self.targets.contains(&osd) {
                    debug_assert!(self.members.contains(&osd), "a query went to osd.{osd}, no member nor target");
                    infos.insert(osd, (info, requests));
                } else if whole_with_its_log(&info) {
                    self.whole_targets.insert(osd, (info, requests));
                }
                if !waiting.is_empty() {
                    self.phase = Phase::Querying { waiting, infos };
                    return Vec::new();
                }
                self.recover(infos)
            }
            Phase::Recovering(mut recovery) => {
                recovery.waiting = None;
                self.step(recovery, Some(reply))
            }
            Phase::Activating { mut waiting, authority, last_seq, primary } => {
                waiting.remove(&tag);
                if reply != PeerReply::Done {
                    return self.stuck(format!("activation answered with {reply:?}"));
                }
                self.phase = Phase::Activating { waiting, authority, last_seq, primary };
                self.activation_answered()
            }
            Phase::Recording(_) | Phase::HandingOver { .. } | Phase::Active | Phase::Stuck => {
                unreachable!("expects() is false in these phases")
            }
        }
    }

    /// Whether the machine waits for the map to record its members.
    pub fn is_recording(&self) -> bool {
        matches!(self.phase, Phase::Recording(_))
    }

    /// Stuck for want of current shards: the recorded members whose copies
    /// lost their shards, for the monitor to take out of the PG's record,
    /// and the acting set by position it peered (the monitor checks it is
    /// still the PG's).
    pub fn unrecording(&self) -> Option<(&[OsdId], &[OsdId])> {
        (self.is_stuck() && !self.unrecord.is_empty()).then_some((&self.unrecord[..], &self.shards[..]))
    }

    /// It waits for the map: to record its members, or to hand the PG over.
    pub fn waits_for_map(&self) -> bool {
        self.is_recording() || self.handing_over().is_some()
    }

    /// The acting set the machine asked the map to hand the PG over to,
    /// while it waits for it.
    pub fn handing_over(&self) -> Option<&[OsdId]> {
        match &self.phase {
            Phase::HandingOver { acting } => Some(acting),
            _ => None,
        }
    }

    /// The map records `active_set` as the PG's last active set: if it
    /// names the members the machine waits to record, activation goes on.
    pub fn on_recorded(&mut self, active_set: Option<&[OsdId]>) -> Vec<Action> {
        if !self.is_recording() || active_set != Some(&self.record_members()[..]) {
            return Vec::new();
        }
        let Phase::Recording(recovery) = std::mem::replace(&mut self.phase, Phase::Stuck) else {
            unreachable!("checked above")
        };
        self.active_set = Some(self.record_members());
        self.activate(&recovery)
    }

    /// An activation was answered (or its target dropped): the primary's
    /// own once every other one is in, then active.
    fn activation_answered(&mut self) -> Vec<Action> {
        let Phase::Activating { waiting, authority, last_seq, primary } =
            std::mem::replace(&mut self.phase, Phase::Stuck)
        else {
            unreachable!("called while activating")
        };
        if !waiting.is_empty() {
            self.phase = Phase::Activating { waiting, authority, last_seq, primary };
            return Vec::new();
        }
        if let Some(mut op) = primary {
            // Every replica and target takes entries of this interval now:
            // the primary may start sending them (to the targets that
            // answered only).
            if let PeerOp::Activate { backfill, .. } = &mut op {
                *backfill = self.backfill_targets();
            }
            let (to, tag) = (self.members[0], self.tag());
            self.phase = Phase::Activating { waiting: BTreeMap::from([(tag, to)]), authority, last_seq, primary: None };
            return vec![Action::Send { to, tag, op }];
        }
        self.phase = Phase::Active;
        let recovered_objects = self.progress.objects_copied + self.progress.objects_removed;
        vec![Action::Active { authority, last_seq, recovered_objects, backfill: self.backfill_targets() }]
    }
}
