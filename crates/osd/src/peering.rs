//! Peering and recovery of one PG, run by its primary: a sans-I/O state
//! machine. It says what to ask which member ([`Action::Send`]) and is told
//! the answers ([`Peering::on_reply`]); the OSD's peering thread
//! ([`crate::peering_driver`]) carries them over the network (or to the
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
//!    `duplex_map::active_set`) answered with a whole copy: those hold
//!    every write the PG acknowledged. Otherwise the PG is down and waits.
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

use crate::requests::merge_logged;

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
    /// in its history. One that cannot be reached is left out; the PG
    /// goes active without it.
    targets: Vec<OsdId>,
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

/// The member whose history wins: newest `last_active`, then a position
/// its log knows over a lost one ([`PeerInfo::position_lost`]: a lost log,
/// or a copy an unfinished recovery changed, which reports a seq past
/// every id it holds but whose store's record may name a write whose data
/// never landed), then highest `last_seq`; on a tie the primary (no data
/// needs to move through it), then the lowest id. A member with no entry
/// at all knows its position: it wins over a lost one of its interval
/// (simulator seed 8840, where "epoch 0" told the two apart no more). An unfinished backfill lacks objects and never wins:
/// with only such members there is no authority (the PG waits for an OSD
/// that holds it whole), unless `lost` (every whole copy was marked lost:
/// the best unfinished one is all there is).
pub fn choose_authority(primary: OsdId, infos: &BTreeMap<OsdId, PeerInfo>, lost: bool) -> Option<(OsdId, PeerInfo)> {
    let best = |unfinished: bool| {
        infos
            .iter()
            .filter(|(_, info)| info.backfilling == unfinished)
            .max_by_key(|(osd, info)| {
                (info.last_active, !info.position_lost, info.last_seq, **osd == primary, std::cmp::Reverse(**osd))
            })
            .map(|(osd, info)| (*osd, *info))
    };
    best(false).or_else(|| if lost { best(true) } else { None })
}

/// How `member` catches up with the authority in the interval that began
/// at epoch `interval` (`None`: it already has).
fn plan_for(member: &PeerInfo, authority: &PeerInfo, interval: u64) -> Option<Plan> {
    // Logs that end at the same entry hold the same history; an epoch of 0
    // proves nothing (no entry, or the log was lost), unless the member
    // was active in this very interval: peering (or a backfill in the
    // background) made it level then, and a lost log would have begun
    // another interval (a restart). Without that, a PG with no write yet
    // would fill such a member again at every peering.
    let end = |info: &PeerInfo| (info.last_seq, info.last_epoch);
    if (member.last_epoch > 0 || member.last_active == interval) && end(member) == end(authority) {
        return None;
    }
    // Behind, and the authority's history reaches back to the member's
    // last entry (whose epoch it checks): copy what the gap touched.
    if member.last_epoch > 0 && member.last_seq < authority.last_seq && authority.history_from <= member.last_seq {
        return Some(Plan::History { after: member.last_seq, after_epoch: member.last_epoch });
    }
    Some(Plan::Backfill)
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
            phase: Phase::Stuck,
            next_tag: 1,
            progress: Progress::default(),
            scrub,
            scrub_report: None,
            active_set,
            background_min: None,
            filled_in_background: Vec::new(),
            fill_only: Some(BTreeSet::new()),
        };
        let mut waiting = BTreeMap::new();
        let mut actions = Vec::new();
        // Targets are queried only to fence them: their answers are not used.
        for osd in members.into_iter().chain(targets) {
            let tag = peering.tag();
            waiting.insert(tag, osd);
            actions.push(Action::Send { to: osd, tag, op: PeerOp::Query });
        }
        peering.phase = Phase::Querying { waiting, infos: BTreeMap::new() };
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
                    infos.insert(osd, (info, requests));
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

    fn recover(&mut self, answers: BTreeMap<OsdId, (PeerInfo, Vec<LoggedRequest>)>) -> Vec<Action> {
        let primary = self.members[0];
        let mut infos = BTreeMap::new();
        let mut logged = BTreeMap::new();
        for (osd, (info, requests)) in answers {
            infos.insert(osd, info);
            logged.insert(osd, requests);
        }
        // Only the OSDs of the last active set are known to hold every
        // acknowledged write: without one of them, any authority could be
        // older than what clients were told is written.
        let lost = self.active_set.as_ref().is_some_and(Vec::is_empty);
        if let Some(set) = self.active_set.as_ref().filter(|set| !set.is_empty()) {
            if !set.iter().any(|osd| infos.get(osd).is_some_and(|info: &PeerInfo| !info.backfilling)) {
                let names: Vec<String> = set.iter().map(|osd| format!("osd.{osd}")).collect();
                return self.stuck(format!(
                    "PG {:#x} is down: it was last active on {}, and none of them answered with its copy; \
                     waiting for one to come back (or for an operator to mark them lost)",
                    self.pg,
                    names.join(", ")
                ));
            }
        }
        let Some((authority, info)) = choose_authority(primary, &infos, lost) else {
            return self.stuck(format!(
                "PG {:#x}: every member's copy is an unfinished backfill; waiting for an OSD that holds the whole PG",
                self.pg
            ));
        };
        let mut on_history = BTreeSet::from([authority]);
        let mut targets = VecDeque::new();
        for (osd, member) in infos.iter().filter(|(osd, _)| **osd != authority) {
            match plan_for(member, &info, self.interval) {
                None => {
                    on_history.insert(*osd);
                }
                Some(plan) => targets.push_back((*osd, plan)),
            }
        }
        // A PG never written to (seq 0) has nothing to fill: comparing the
        // lists inside peering is quicker than a second peering.
        let history_in_background = match self.plan_background(authority, info.last_seq, infos.len(), &mut targets) {
            Ok(history) => history,
            Err(acting) => {
                self.phase = Phase::HandingOver { acting: acting.clone() };
                return vec![Action::HandOver { acting }];
            }
        };
        let scrub = self.scrub.map(|repair| {
            // The authority first: its copies are the good ones when readable.
            let mut to_list: VecDeque<OsdId> = self.members.iter().copied().filter(|m| *m != authority).collect();
            to_list.push_front(authority);
            Scrub { repair, to_list, listing: None, digests: BTreeMap::new(), report: None }
        });
        let recovery = Box::new(Recovery {
            authority,
            info,
            targets,
            listing: None,
            work: VecDeque::new(),
            copy: None,
            changed: BTreeSet::new(),
            logged,
            on_history,
            waiting: None,
            scrub,
            history_in_background,
        });
        self.step(recovery, None)
    }

    /// Which recovery goes to the background ([`Peering::fill_in_background`]),
    /// given the authority's `last_seq`, the number of members that answered
    /// and the plan for each one not level (`targets`). Members to backfill
    /// leave `targets` for `filled_in_background`; the members behind by
    /// history to fill there once the authority names their objects are
    /// returned. `Err(acting)`: the primary itself needs a backfill, and
    /// hands the PG over to that acting set.
    fn plan_background(
        &mut self,
        authority: OsdId,
        last_seq: u64,
        answered: usize,
        targets: &mut VecDeque<(OsdId, Plan)>,
    ) -> Result<BTreeSet<OsdId>, Vec<OsdId>> {
        // A PG never written to (seq 0) has nothing to fill: comparing the
        // lists inside peering is quicker than a second peering.
        let allowed = self.scrub.is_none() && self.targets.is_empty() && last_seq > 0;
        let Some(min_size) = self.background_min.filter(|_| allowed) else { return Ok(BTreeSet::new()) };
        let primary = self.members[0];
        let to_fill: Vec<OsdId> =
            targets.iter().filter(|(_, plan)| *plan == Plan::Backfill).map(|(osd, _)| *osd).collect();
        if !to_fill.is_empty() && answered - to_fill.len() >= min_size {
            if to_fill.contains(&primary) {
                // The primary serves reads: it hands the PG to the
                // authority, whose peering fills it in the background.
                let mut acting = vec![authority];
                acting.extend(self.members.iter().copied().filter(|osd| *osd != authority));
                return Err(acting);
            }
            targets.retain(|(osd, _)| !to_fill.contains(osd));
            tracing::info!(pg = self.pg, members = ?to_fill, "members to backfill are filled in the background");
            self.filled_in_background = to_fill;
            self.fill_only = None;
        }
        // Members behind by history too, if the whole ones still keep
        // min_size: the authority names what they lack, and they get it in
        // the background rather than inside peering.
        let behind: BTreeSet<OsdId> = targets
            .iter()
            .filter(|(osd, plan)| matches!(plan, Plan::History { .. }) && *osd != primary)
            .map(|(osd, _)| *osd)
            .collect();
        if behind.is_empty() || answered - self.filled_in_background.len() - behind.len() < min_size {
            return Ok(BTreeSet::new());
        }
        Ok(behind)
    }

    /// Advances recovery with `reply` (to the request it waited for) until
    /// it sends the next request, or everything is done and it activates.
    /// Only one stage has a request outstanding at a time, and the order
    /// below finds it first: a copy, a target's listing, a scrub listing.
    fn step(&mut self, mut recovery: Box<Recovery>, mut reply: Option<PeerReply>) -> Vec<Action> {
        loop {
            if let Some(copy) = recovery.copy.take() {
                match self.copy_step(&mut recovery, copy, reply.take()) {
                    Ok(Some((to, op))) => return self.send(recovery, to, op),
                    Ok(None) => continue,
                    Err(why) => return self.stuck(why),
                }
            }
            if let Some(work) = recovery.work.pop_front() {
                let (copy, to, op) = match work {
                    Work::Copy { object, from, to } => {
                        recovery.changed.insert(to);
                        let op = PeerOp::Stat { object: object.clone() };
                        (Copy { object, from, to, stage: CopyStage::Stat }, from, op)
                    }
                    Work::Remove { object, on } => {
                        recovery.changed.insert(on);
                        // The authority's ids of the object's mutations (its
                        // delete, say) go with the removal.
                        let from = recovery.authority;
                        let op = PeerOp::ObjectRequests { object: object.clone() };
                        (Copy { object, from, to: on, stage: CopyStage::Ids { meta: None, staged: 0 } }, from, op)
                    }
                };
                recovery.copy = Some(copy);
                return self.send(recovery, to, op);
            }
            if let Some((target, step)) = recovery.listing.take() {
                match self.listing_step(&mut recovery, target, step, reply.take()) {
                    Ok(Some((to, op))) => return self.send(recovery, to, op),
                    Ok(None) => continue,
                    Err(why) => return self.stuck(why),
                }
            }
            if let Some((target, plan)) = recovery.targets.pop_front() {
                let authority = recovery.authority;
                let (step, op) = match plan {
                    Plan::History { after, after_epoch } => {
                        let through = recovery.info.last_seq;
                        (Step::AskTouched, PeerOp::Touched { after, after_epoch, through })
                    }
                    Plan::Backfill => (
                        Step::ListAuthority { cursor: Vec::new(), objects: Vec::new() },
                        PeerOp::Digests { cursor: Vec::new() },
                    ),
                };
                recovery.listing = Some((target, step));
                return self.send(recovery, authority, op);
            }
            if let Some(mut scrub) = recovery.scrub.take() {
                if scrub.report.is_none() {
                    match self.scrub_step(&mut recovery, &mut scrub, reply.take()) {
                        Ok(Some((to, op))) => {
                            recovery.scrub = Some(scrub);
                            return self.send(recovery, to, op);
                        }
                        Ok(None) => {
                            // Listed and compared: the repairs (if any) run next.
                            recovery.scrub = Some(scrub);
                            continue;
                        }
                        Err(why) => return self.stuck(why),
                    }
                }
                self.scrub_report = scrub.report.take();
            }
            let record = self.record_members();
            if self.active_set.as_deref() != Some(&record[..]) {
                self.phase = Phase::Recording(recovery);
                return vec![Action::Record { members: record }];
            }
            return self.activate(&recovery);
        }
    }

    /// The next request of a target's object listing (`None`: its work is planned).
    fn listing_step(
        &mut self,
        recovery: &mut Recovery,
        target: OsdId,
        step: Step,
        reply: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        let authority = recovery.authority;
        let unexpected = |reply: &Option<PeerReply>| format!("unexpected answer {reply:?} during recovery");
        match (step, reply) {
            (Step::AskTouched, Some(PeerReply::Touched(Some(objects)))) => {
                // The authority's history holds the target's last entry:
                // the target's log is a prefix of it.
                recovery.on_history.insert(target);
                if recovery.history_in_background.contains(&target) {
                    tracing::info!(
                        pg = self.pg,
                        member = target,
                        objects = objects.len(),
                        "a member behind by history is filled in the background"
                    );
                    self.filled_in_background.push(target);
                    if let Some(names) = self.fill_only.as_mut() {
                        names.extend(objects);
                    }
                    return Ok(None);
                }
                let copies = objects.into_iter().map(|object| Work::Copy { object, from: authority, to: target });
                recovery.work.extend(copies);
                Ok(None)
            }
            (Step::AskTouched, Some(PeerReply::Touched(None))) if recovery.history_in_background.contains(&target) => {
                // The history no longer reaches its end: a whole backfill, in the background.
                self.filled_in_background.push(target);
                self.fill_only = None;
                Ok(None)
            }
            (Step::AskTouched, Some(PeerReply::Touched(None))) => {
                // The history does not reach the target's end: backfill instead.
                recovery.listing = Some((target, Step::ListAuthority { cursor: Vec::new(), objects: Vec::new() }));
                Ok(Some((authority, PeerOp::Digests { cursor: Vec::new() })))
            }
            (Step::ListAuthority { cursor, mut objects }, Some(PeerReply::Digests { objects: page, more })) => {
                let cursor = next_cursor(&cursor, &page, more).ok_or("a digest listing did not advance")?;
                objects.extend(page);
                if more {
                    recovery.listing = Some((target, Step::ListAuthority { cursor: cursor.clone(), objects }));
                    return Ok(Some((authority, PeerOp::Digests { cursor })));
                }
                let step = Step::ListTarget { cursor: Vec::new(), authority: objects, objects: Vec::new() };
                recovery.listing = Some((target, step));
                Ok(Some((target, PeerOp::Digests { cursor: Vec::new() })))
            }
            (
                Step::ListTarget { cursor, authority: theirs, mut objects },
                Some(PeerReply::Digests { objects: page, more }),
            ) => {
                let cursor = next_cursor(&cursor, &page, more).ok_or("a digest listing did not advance")?;
                objects.extend(page);
                if more {
                    let step = Step::ListTarget { cursor: cursor.clone(), authority: theirs, objects };
                    recovery.listing = Some((target, step));
                    return Ok(Some((target, PeerOp::Digests { cursor })));
                }
                recovery.work.extend(diff(authority, &theirs, target, &objects));
                Ok(None)
            }
            (_, other) => Err(unexpected(&other)),
        }
    }

    /// The next request of an object copy or removal (`None`: it is done).
    fn copy_step(
        &mut self,
        recovery: &mut Recovery,
        mut copy: Copy,
        reply: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        let object = copy.object.clone();
        let (next, to, op) = match (std::mem::replace(&mut copy.stage, CopyStage::Install), reply) {
            (CopyStage::Stat, Some(PeerReply::Meta(None))) => {
                // Gone on the source since it was listed or logged.
                (CopyStage::Ids { meta: None, staged: 0 }, copy.from, PeerOp::ObjectRequests { object })
            }
            (CopyStage::Stat, Some(PeerReply::Meta(Some(meta)))) => next_chunk(copy.from, object, meta, 0, 0),
            (CopyStage::Pull { meta, offset, staged }, Some(PeerReply::Data(data))) => {
                let end = offset + data.len() as u64;
                if data.is_empty() || end > meta.size {
                    return Err(format!(
                        "a pull at {offset} of a {}-byte object returned {} bytes",
                        meta.size,
                        data.len()
                    ));
                }
                if data.iter().all(|b| *b == 0) {
                    // Holes stay holes: the installed object starts empty.
                    next_chunk(copy.from, object, meta, end, staged)
                } else {
                    self.progress.bytes_copied += data.len() as u64;
                    let staged = staged + data.len() as u64;
                    (CopyStage::Stage { meta, offset: end, staged }, copy.to, PeerOp::Stage { object, offset, data })
                }
            }
            (CopyStage::Stage { meta, offset, staged }, Some(PeerReply::Done)) => {
                next_chunk(copy.from, object, meta, offset, staged)
            }
            (CopyStage::Ids { meta, staged }, Some(PeerReply::Requests(requests))) => {
                if meta.is_some() {
                    self.progress.objects_copied += 1;
                } else {
                    self.progress.objects_removed += 1;
                }
                (CopyStage::Install, copy.to, PeerOp::Install { object, meta, staged_bytes: staged, requests })
            }
            (CopyStage::Install, Some(PeerReply::Done)) => return Ok(None),
            (_, other) => return Err(format!("unexpected answer {other:?} while copying an object")),
        };
        copy.stage = next;
        recovery.copy = Some(copy);
        Ok(Some((to, op)))
    }

    /// The next request of a deep scrub's listings (`None`: all listed and
    /// compared; repairs are queued as work when asked for).
    fn scrub_step(
        &mut self,
        recovery: &mut Recovery,
        scrub: &mut Scrub,
        reply: Option<PeerReply>,
    ) -> Result<Option<(OsdId, PeerOp)>, String> {
        if let Some((member, cursor, mut objects)) = scrub.listing.take() {
            let Some(PeerReply::Digests { objects: page, more }) = reply else {
                return Err(format!("unexpected answer {reply:?} during a scrub"));
            };
            let cursor = next_cursor(&cursor, &page, more).ok_or("a digest listing did not advance")?;
            objects.extend(page);
            if more {
                scrub.listing = Some((member, cursor.clone(), objects));
                return Ok(Some((member, PeerOp::Digests { cursor })));
            }
            scrub.digests.insert(member, objects);
        }
        if let Some(member) = scrub.to_list.pop_front() {
            scrub.listing = Some((member, Vec::new(), Vec::new()));
            return Ok(Some((member, PeerOp::Digests { cursor: Vec::new() })));
        }
        let (report, repairs) = compare(recovery.authority, &self.members, &scrub.digests);
        if scrub.repair {
            let mut report = report;
            report.repaired = repairs.len() as u64;
            recovery.work.extend(repairs);
            scrub.report = Some(report);
        } else {
            scrub.report = Some(report);
        }
        Ok(None)
    }

    fn send(&mut self, mut recovery: Box<Recovery>, to: OsdId, op: PeerOp) -> Vec<Action> {
        // `step` finds the stage a reply belongs to by which one is in
        // progress: there must be exactly one.
        let in_progress = usize::from(recovery.copy.is_some())
            + usize::from(recovery.listing.is_some())
            + usize::from(recovery.scrub.as_ref().is_some_and(|s| s.listing.is_some()));
        debug_assert_eq!(in_progress, 1, "one recovery stage waits for each answer");
        debug_assert!(self.members.contains(&to), "requests go to the PG's members only");
        let tag = self.tag();
        recovery.waiting = Some(tag);
        self.phase = Phase::Recovering(recovery);
        vec![Action::Send { to, tag, op }]
    }

    fn activate(&mut self, recovery: &Recovery) -> Vec<Action> {
        debug_assert_eq!(
            self.active_set.as_deref(),
            Some(&self.record_members()[..]),
            "no member is activated before the map records the whole members"
        );
        let mut waiting = BTreeMap::new();
        let mut actions = Vec::new();
        let members: Vec<u32> = self.members.clone();
        let targets = self.backfill_targets();
        assert!(!targets.contains(&members[0]), "the primary serves: it is never filled in the background");
        let requests =
            merge_logged(recovery.on_history.iter().filter_map(|osd| recovery.logged.get(osd)).map(Vec::as_slice));
        let activate = |osd: OsdId| PeerOp::Activate {
            last_seq: recovery.info.last_seq,
            last_epoch: recovery.info.last_epoch,
            members: members.clone(),
            // A target's store is being refilled: its own history no longer holds.
            rebuilt: recovery.changed.contains(&osd) || targets.contains(&osd),
            requests: requests.clone(),
            backfill: targets.clone(),
        };
        // The replicas and targets first: a primary active before them
        // would send entries they refuse (not active yet), fail those
        // writes and peer all over again (seen in the isolated-host scenario).
        let filled_later = targets.iter().copied().filter(|t| !members.contains(t));
        for osd in members[1..].iter().copied().chain(filled_later) {
            let tag = self.tag();
            waiting.insert(tag, osd);
            actions.push(Action::Send { to: osd, tag, op: activate(osd) });
        }
        let (authority, last_seq) = (recovery.authority, recovery.info.last_seq);
        let primary = activate(members[0]);
        if waiting.is_empty() {
            let tag = self.tag();
            waiting.insert(tag, members[0]);
            actions.push(Action::Send { to: members[0], tag, op: primary });
            self.phase = Phase::Activating { waiting, authority, last_seq, primary: None };
        } else {
            self.phase = Phase::Activating { waiting, authority, last_seq, primary: Some(primary) };
        }
        actions
    }
}

/// The cursor after a page (`None`: a page that claims more but did not advance).
fn next_cursor(cursor: &[u8], page: &[ObjectDigest], more: bool) -> Option<Vec<u8>> {
    match page.last() {
        Some(last) if last.object.as_slice() > cursor || cursor.is_empty() => Some(last.object.clone()),
        Some(_) => None,
        None if more => None,
        None => Some(cursor.to_vec()),
    }
}

/// After `offset` bytes of `meta`'s object: the next chunk to pull from
/// `from`, or, past the end, the source's ids of the object's mutations.
fn next_chunk(from: OsdId, object: Vec<u8>, meta: ObjectMeta, offset: u64, staged: u64) -> (CopyStage, OsdId, PeerOp) {
    if offset < meta.size {
        let len = CHUNK_BYTES.min((meta.size - offset).min(u32::MAX as u64) as u32);
        (CopyStage::Pull { meta, offset, staged }, from, PeerOp::Pull { object, offset, len })
    } else {
        (CopyStage::Ids { meta: Some(meta), staged }, from, PeerOp::ObjectRequests { object })
    }
}

/// What makes `target`'s object set equal the authority's: copies of
/// objects it lacks or holds differently (or damaged), removal of extra ones.
fn diff(authority: OsdId, ours: &[ObjectDigest], target: OsdId, theirs: &[ObjectDigest]) -> Vec<Work> {
    let held: BTreeMap<&[u8], Option<u32>> = theirs.iter().map(|d| (d.object.as_slice(), d.digest)).collect();
    let names: BTreeSet<&[u8]> = ours.iter().map(|d| d.object.as_slice()).collect();
    let mut work: Vec<Work> = ours
        .iter()
        .filter(|d| d.digest.is_none() || held.get(d.object.as_slice()) != Some(&d.digest))
        .map(|d| Work::Copy { object: d.object.clone(), from: authority, to: target })
        .collect();
    work.extend(
        theirs
            .iter()
            .filter(|d| !names.contains(d.object.as_slice()))
            .map(|d| Work::Remove { object: d.object.clone(), on: target }),
    );
    work
}

/// A deep scrub's verdict over every member's digests: which copies are
/// bad, and the work that would replace them. The good copy of an object is
/// the authority's when readable, else the first readable one (in member
/// order); whether an object exists at all is the authority's call.
fn compare(
    authority: OsdId,
    members: &[OsdId],
    digests: &BTreeMap<OsdId, Vec<ObjectDigest>>,
) -> (ScrubReport, Vec<Work>) {
    let mut copies: BTreeMap<&[u8], BTreeMap<OsdId, Option<u32>>> = BTreeMap::new();
    for (member, listed) in digests {
        for d in listed {
            copies.entry(d.object.as_slice()).or_default().insert(*member, d.digest);
        }
    }
    let mut report = ScrubReport { objects: copies.len() as u64, ..ScrubReport::default() };
    let mut work = Vec::new();
    for (object, held) in copies {
        let Some(on_authority) = held.get(&authority) else {
            let bad: Vec<OsdId> = held.keys().copied().collect();
            work.extend(bad.iter().map(|on| Work::Remove { object: object.to_vec(), on: *on }));
            report.inconsistent.push(Inconsistency { object: object.to_vec(), bad, unrepairable: false });
            continue;
        };
        let good = on_authority
            .map(|digest| (authority, digest))
            .or_else(|| members.iter().find_map(|m| held.get(m).copied().flatten().map(|digest| (*m, digest))));
        let bad: Vec<OsdId> = members
            .iter()
            .copied()
            .filter(|m| good.is_none_or(|(_, digest)| held.get(m) != Some(&Some(digest))))
            .collect();
        if bad.is_empty() {
            continue;
        }
        if let Some((from, _)) = good {
            work.extend(bad.iter().map(|to| Work::Copy { object: object.to_vec(), from, to: *to }));
        }
        report.inconsistent.push(Inconsistency { object: object.to_vec(), bad, unrepairable: good.is_none() });
    }
    (report, work)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    type Attrs = Vec<(Vec<u8>, Vec<u8>)>;

    /// A member as the machine sees it: a store of whole objects, a log
    /// position and a history of which seq touched which object.
    /// Staged object bytes, by offset.
    type Chunks = Vec<(u64, Vec<u8>)>;

    #[derive(Clone, Default)]
    struct Member {
        objects: BTreeMap<Vec<u8>, (Vec<u8>, Attrs)>,
        last_seq: u64,
        last_epoch: u32,
        last_active: u64,
        history: Vec<(u64, u32, Vec<u8>)>,
        /// Objects whose copy here fails its checksum.
        damaged: BTreeSet<Vec<u8>>,
        /// The request ids of the entries it logged.
        logged: Vec<LoggedRequest>,
        rebuilt: bool,
        answered: u32,
        /// An unfinished backfill target's copy.
        backfilling: bool,
        /// What peering's recovery staged here: the object and its chunks.
        staged: Option<(Vec<u8>, Chunks)>,
        /// Peering's recovery installed an object here and no activation
        /// followed (as `stored_interval::recovered`).
        recovered: bool,
    }

    /// The request id of the entry at `seq` of `epoch` (a divergent entry,
    /// of another epoch, has another id).
    fn request_of(seq: u64, epoch: u32) -> LoggedRequest {
        LoggedRequest { client: 1, tid: seq * 10 + epoch as u64, seq }
    }

    impl Member {
        fn write(&mut self, object: &str, data: &[u8]) {
            self.last_seq += 1;
            self.last_epoch = 5;
            self.objects.insert(object.as_bytes().to_vec(), (data.to_vec(), Vec::new()));
            self.history.push((self.last_seq, 5, object.as_bytes().to_vec()));
            self.logged.push(request_of(self.last_seq, 5));
        }

        fn answer(&mut self, op: PeerOp, interval: u64) -> PeerReply {
            self.answered += 1;
            match op {
                PeerOp::Query => {
                    let mut info = PeerInfo {
                        last_seq: self.last_seq,
                        last_epoch: self.last_epoch,
                        last_active: self.last_active,
                        history_from: self.history.first().map_or(self.last_seq + 1, |(seq, ..)| *seq),
                        backfilling: self.backfilling,
                        position_lost: false,
                    };
                    if self.recovered {
                        // As the real member: lost, past every id it holds.
                        let last_seq = self.logged.iter().map(|r| r.seq).max().unwrap_or(0).max(self.last_seq);
                        info = PeerInfo {
                            last_seq,
                            last_epoch: 0,
                            history_from: last_seq + 1,
                            position_lost: true,
                            ..info
                        };
                    }
                    PeerReply::Info { info, requests: self.logged.clone() }
                }
                PeerOp::Touched { after, after_epoch, through } => {
                    if !self.history.iter().any(|(seq, epoch, _)| (*seq, *epoch) == (after, after_epoch)) {
                        return PeerReply::Touched(None);
                    }
                    let names: BTreeSet<Vec<u8>> = self
                        .history
                        .iter()
                        .filter(|(seq, ..)| *seq > after && *seq <= through)
                        .map(|(_, _, o)| o.clone())
                        .collect();
                    PeerReply::Touched(Some(names.into_iter().collect()))
                }
                PeerOp::Digests { cursor } => {
                    let objects: Vec<ObjectDigest> = self
                        .objects
                        .iter()
                        .filter(|(name, _)| cursor.is_empty() || name.as_slice() > cursor.as_slice())
                        .take(2) // small pages, to exercise paging
                        .map(|(name, (data, _))| ObjectDigest {
                            object: name.clone(),
                            digest: (!self.damaged.contains(name)).then(|| crc32c::crc32c(data)),
                        })
                        .collect();
                    let more =
                        objects.last().is_some_and(|last| self.objects.range(last.object.clone()..).nth(1).is_some());
                    PeerReply::Digests { objects, more }
                }
                PeerOp::Stat { object } => PeerReply::Meta(self.objects.get(&object).map(|(data, attrs)| ObjectMeta {
                    size: data.len() as u64,
                    preallocated: false,
                    attrs: attrs.clone(),
                })),
                PeerOp::Pull { object, offset, len } => {
                    if self.damaged.contains(&object) {
                        return PeerReply::Refused("checksum mismatch".into());
                    }
                    let data = &self.objects[&object].0;
                    let end = (offset + len as u64).min(data.len() as u64);
                    PeerReply::Data(data[offset as usize..end as usize].to_vec())
                }
                PeerOp::Stage { object, offset, data } => {
                    let staged = self.staged.get_or_insert_with(|| (object.clone(), Vec::new()));
                    if staged.0 != object {
                        *staged = (object, Vec::new());
                    }
                    staged.1.push((offset, data));
                    PeerReply::Done
                }
                PeerOp::ObjectRequests { object } => PeerReply::Requests(
                    self.logged
                        .iter()
                        .filter(|r| self.history.iter().any(|(seq, _, touched)| *seq == r.seq && *touched == object))
                        .copied()
                        .collect(),
                ),
                PeerOp::Install { object, meta, staged_bytes, requests } => {
                    let chunks = self.staged.take().filter(|(o, _)| *o == object).map(|(_, c)| c).unwrap_or_default();
                    if chunks.iter().map(|(_, d)| d.len() as u64).sum::<u64>() != staged_bytes {
                        return PeerReply::Refused("a staged chunk was lost".into());
                    }
                    self.damaged.remove(&object);
                    match meta {
                        Some(meta) => {
                            let mut data = vec![0; meta.size as usize];
                            for (offset, chunk) in chunks {
                                data[offset as usize..offset as usize + chunk.len()].copy_from_slice(&chunk);
                            }
                            self.objects.insert(object, (data, meta.attrs));
                        }
                        None => {
                            self.objects.remove(&object);
                        }
                    }
                    for request in requests {
                        self.logged.retain(|r| r.seq != request.seq);
                        self.logged.push(request);
                    }
                    self.recovered = true;
                    PeerReply::Done
                }
                PeerOp::Activate { last_seq, last_epoch, rebuilt, requests, .. } => {
                    if (last_seq, last_epoch) != (self.last_seq, self.last_epoch) {
                        self.history.clear();
                    }
                    self.last_seq = last_seq;
                    self.last_epoch = last_epoch;
                    self.last_active = interval;
                    self.rebuilt = rebuilt;
                    self.logged = requests;
                    self.recovered = false;
                    PeerReply::Done
                }
                PeerOp::Scrub { .. } => PeerReply::Refused("not a member's request".into()),
                PeerOp::PushStart { .. } | PeerOp::PushData { .. } | PeerOp::Remove { .. } => {
                    PeerReply::Refused("peering installs objects whole; pushes are background backfill's".into())
                }
                PeerOp::List { .. }
                | PeerOp::BackfillLock { .. }
                | PeerOp::BackfillDone
                | PeerOp::ChunkDigest { .. } => {
                    PeerReply::Refused("background backfill is not peering's (backfill.rs tests it)".into())
                }
            }
        }
    }

    /// Runs peering to the end over `members` (ids 0..n, 0 the primary).
    fn run(members: &mut [Member], interval: u64) -> Action {
        let ids: Vec<OsdId> = (0..members.len() as u32).collect();
        let (mut machine, actions) = Peering::start(7, interval, ids);
        drive(members, interval, &mut machine, actions)
    }

    fn scrub(members: &mut [Member], repair: bool) -> (Action, Option<ScrubReport>) {
        let ids: Vec<OsdId> = (0..members.len() as u32).collect();
        let (mut machine, actions) = Peering::start_scrub(7, 9, ids, repair);
        let outcome = drive(members, 9, &mut machine, actions);
        (outcome, machine.scrub_report().cloned())
    }

    /// Carries `machine` to its end over `members`, the monitor recording
    /// members at once; the machine stays the caller's, to look at after.
    fn drive(members: &mut [Member], interval: u64, machine: &mut Peering, actions: Vec<Action>) -> Action {
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Send { to, tag, op } => {
                    let reply = members[to as usize].answer(op, interval);
                    queue.extend(machine.on_reply(tag, reply));
                }
                Action::Record { members } => queue.extend(machine.on_recorded(Some(&members))),
                done => {
                    assert!(queue.is_empty(), "nothing follows the end");
                    return done;
                }
            }
        }
        panic!("peering neither finished nor got stuck");
    }

    fn active_member(writes: &[(&str, &[u8])]) -> Member {
        let mut member = Member { last_active: 5, ..Member::default() };
        for (object, data) in writes {
            member.write(object, data);
        }
        member
    }

    #[test]
    fn members_in_step_go_active_without_moving_data() {
        let member = active_member(&[("a", b"1"), ("b", b"2")]);
        let mut members = vec![member.clone(), member.clone(), member];
        let outcome = run(&mut members, 9);
        assert_eq!(outcome, Action::Active { authority: 0, last_seq: 2, recovered_objects: 0, backfill: vec![] });
        for member in &members {
            assert_eq!((member.last_active, member.last_seq), (9, 2));
            assert!(!member.rebuilt);
            assert_eq!(member.answered, 2, "a query and an activation each");
            assert_eq!(member.logged, vec![request_of(1, 5), request_of(2, 5)]);
        }
    }

    /// A primary active before its replicas would send entries they refuse.
    #[test]
    fn the_primary_activates_only_after_every_replica_has() {
        let member = active_member(&[("a", b"1")]);
        let mut members = [member.clone(), member.clone(), member];
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
        let mut queue: VecDeque<Action> = actions.into();
        let mut activations = Vec::new();
        while let Some(action) = queue.pop_front() {
            let Action::Send { to, tag, op } = action else { break };
            if let PeerOp::Activate { .. } = op {
                // Answer each activation only once every one sent so far is out.
                activations.push(to);
                assert!(
                    to != 0 || activations.len() == 3,
                    "the primary's activation went out before the replicas answered: {activations:?}"
                );
            }
            let reply = members[to as usize].answer(op, 9);
            queue.extend(machine.on_reply(tag, reply));
        }
        assert!(machine.is_active());
        assert_eq!(activations, vec![1, 2, 0]);
        let (mut alone, actions) = Peering::start(7, 9, vec![0]);
        let mut queue: VecDeque<Action> = actions.into();
        let mut lone = Member::default();
        while let Some(Action::Send { to, tag, op }) = queue.pop_front() {
            assert_eq!(to, 0);
            queue.extend(alone.on_reply(tag, lone.answer(op, 9)));
        }
        assert!(alone.is_active(), "a PG of one member activates too");
    }

    #[test]
    fn a_member_behind_in_the_same_interval_gets_the_objects_its_gap_touched() {
        let behind = active_member(&[("a", b"1"), ("b", b"2")]);
        let mut ahead = behind.clone();
        ahead.write("c", b"3");
        ahead.write("a", b"4");
        let mut members = vec![behind, ahead];
        let outcome = run(&mut members, 9);
        assert_eq!(outcome, Action::Active { authority: 1, last_seq: 4, recovered_objects: 2, backfill: vec![] });
        assert_eq!(members[0].objects, members[1].objects);
        assert!(members[0].rebuilt);
        assert!(!members[1].rebuilt);
        assert_eq!(members[0].last_seq, 4);
        let all: Vec<LoggedRequest> = (1..=4).map(|seq| request_of(seq, 5)).collect();
        assert_eq!(members[0].logged, all, "the member behind learns the ids it missed");
        assert_eq!(members[1].logged, all);
    }

    #[test]
    fn a_member_behind_by_history_is_filled_in_the_background_with_just_the_objects_its_gap_touched() {
        let behind = active_member(&[("a", b"1"), ("b", b"2")]);
        let mut ahead = behind.clone();
        ahead.write("c", b"3");
        ahead.write("a", b"4");
        let mut members = [ahead.clone(), ahead, behind];
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
        machine.fill_in_background(2);
        let outcome = drive(&mut members, 9, &mut machine, actions);
        assert_eq!(outcome, Action::Active { authority: 0, last_seq: 4, recovered_objects: 0, backfill: vec![2] });
        assert_eq!(machine.fill_only(), Some(vec![b"a".to_vec(), b"c".to_vec()]), "what the gap touched");
        assert!(!members[2].objects.contains_key(b"c".as_slice()), "nothing copied inside peering");
        let all: Vec<LoggedRequest> = (1..=4).map(|seq| request_of(seq, 5)).collect();
        assert_eq!(members[2].logged, all, "its log is a prefix of the history: it knows every id");
        // With min_size 3 it is brought level inside peering, as before.
        let mut members = [members[0].clone(), members[1].clone(), active_member(&[("a", b"1"), ("b", b"2")])];
        let outcome = {
            let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
            machine.fill_in_background(3);
            drive(&mut members, 9, &mut machine, actions)
        };
        assert!(
            matches!(&outcome, Action::Active { backfill, recovered_objects: 2, .. } if backfill.is_empty()),
            "{outcome:?}"
        );
        assert_eq!(members[2].objects, members[0].objects);
    }

    #[test]
    fn an_older_or_divergent_member_is_backfilled_by_digest_comparison() {
        let authority = active_member(&[("a", b"new"), ("b", b"same"), ("d", &[0u8; 10])]);
        let mut stale = Member { last_active: 3, last_seq: 40, logged: vec![request_of(40, 3)], ..Member::default() };
        stale.objects.insert(b"a".to_vec(), (b"old".to_vec(), vec![]));
        stale.objects.insert(b"b".to_vec(), (b"same".to_vec(), vec![]));
        stale.objects.insert(b"c".to_vec(), (b"extra".to_vec(), vec![]));
        let lost_log = Member::default();
        let mut members = vec![stale, authority, lost_log];
        let outcome = run(&mut members, 9);
        // Despite its higher seq, the member of an older interval is not the authority.
        assert!(matches!(outcome, Action::Active { authority: 1, last_seq: 3, .. }), "{outcome:?}");
        assert_eq!(members[0].objects, members[1].objects);
        assert_eq!(members[2].objects, members[1].objects);
        assert!(members.iter().all(|m| m.last_seq == 3 && m.last_active == 9));
        let history: Vec<LoggedRequest> = (1..=3).map(|seq| request_of(seq, 5)).collect();
        assert!(members.iter().all(|m| m.logged == history), "the divergent member's id is forgotten");
    }

    #[test]
    fn members_to_backfill_are_filled_in_the_background_while_the_whole_ones_keep_min_size_and_a_primary_hands_over() {
        let writes: &[(&str, &[u8])] = &[("a", b"new"), ("b", b"same")];
        let peer_recording = |members: &mut [Member], min_size: usize| {
            let (mut machine, actions) = Peering::start(7, 9, vec![0, 1, 2]);
            machine.fill_in_background(min_size);
            (drive(members, 9, &mut machine, actions), machine.record_members())
        };
        let peer = |members: &mut [Member], min_size: usize| peer_recording(members, min_size).0;
        // osd.2 lost its log; osd.0 and osd.1 are whole, which min_size 2 allows.
        let mut members = [active_member(writes), active_member(writes), Member::default()];
        let (outcome, recorded) = peer_recording(&mut members, 2);
        assert!(
            matches!(&outcome, Action::Active { backfill, recovered_objects: 0, .. } if backfill == &[2]),
            "{outcome:?}"
        );
        // The map records the whole members only: osd.2 holds every write
        // only once its fill ends (seed 1280 lost writes when it led before).
        assert_eq!(recorded, vec![0, 1]);
        assert!(members[2].objects.is_empty(), "nothing copied inside peering");
        assert!(members[2].rebuilt && members[2].last_active == 9, "activated, as a target, with the others");
        // With min_size 3 the PG needs it whole before it serves: inside peering.
        let mut members = [active_member(writes), active_member(writes), Member::default()];
        let outcome = peer(&mut members, 3);
        assert!(matches!(&outcome, Action::Active { backfill, .. } if backfill.is_empty()), "{outcome:?}");
        assert_eq!(members[2].objects, members[0].objects);
        // The primary, which serves reads, hands the PG to the authority
        // (which will fill it in the background), unless min_size forbids.
        let mut members = [Member::default(), active_member(writes), active_member(writes)];
        let outcome = peer(&mut members, 2);
        assert_eq!(outcome, Action::HandOver { acting: vec![1, 0, 2] });
        assert!(members[0].objects.is_empty() && members[0].last_active == 0, "nothing done to it meanwhile");
        let outcome = peer(&mut members, 3);
        assert!(matches!(&outcome, Action::Active { backfill, .. } if backfill.is_empty()), "{outcome:?}");
        assert_eq!(members[0].objects, members[1].objects);
    }

    #[test]
    fn large_objects_move_in_chunks() {
        let big: Vec<u8> = (0..CHUNK_BYTES as usize * 2 + 100).map(|i| (i % 251) as u8).collect();
        let authority = active_member(&[("big", &big)]);
        let mut members = [authority, Member::default()];
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
        let mut queue: VecDeque<Action> = actions.into();
        let mut pulls = 0;
        while let Some(Action::Send { to, tag, op }) = queue.pop_front() {
            if let PeerOp::Pull { len, .. } = &op {
                assert!(*len <= CHUNK_BYTES);
                pulls += 1;
            }
            let reply = members[to as usize].answer(op, 9);
            queue.extend(machine.on_reply(tag, reply));
        }
        assert!(machine.is_active());
        assert_eq!(pulls, 3);
        assert_eq!(members[1].objects, members[0].objects);
        assert_eq!(machine.progress.bytes_copied, big.len() as u64);
    }

    #[test]
    fn a_refusal_or_a_lost_member_stops_it_and_late_answers_are_ignored() {
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
        let tags: Vec<u64> = actions
            .iter()
            .map(|a| match a {
                Action::Send { tag, .. } => *tag,
                other => panic!("{other:?}"),
            })
            .collect();
        let stuck = machine.on_reply(tags[0], PeerReply::Refused("older interval".into()));
        assert!(matches!(&stuck[..], [Action::Stuck(_)]));
        assert!(machine.is_stuck());
        let info = PeerInfo {
            last_seq: 0,
            last_epoch: 0,
            last_active: 0,
            history_from: 1,
            backfilling: false,
            position_lost: false,
        };
        assert!(machine.on_reply(tags[1], PeerReply::Info { info, requests: vec![] }).is_empty(), "late answer");

        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
        let Action::Send { tag, .. } = actions[1] else { panic!() };
        assert!(matches!(&machine.on_failure(tag, "osd.1 unreachable")[..], [Action::Stuck(_)]));
        assert!(machine.on_failure(tag + 100, "unknown").is_empty());
    }

    #[test]
    fn the_authority_is_the_newest_interval_then_the_longest_log_then_the_primary() {
        let info = |last_active, last_seq| PeerInfo {
            last_seq,
            last_epoch: 5,
            last_active,
            history_from: 1,
            backfilling: false,
            position_lost: false,
        };
        let infos: BTreeMap<OsdId, PeerInfo> = [(0, info(4, 100)), (1, info(5, 10)), (2, info(5, 12))].into();
        assert_eq!(choose_authority(0, &infos, false).map(|(osd, _)| osd), Some(2));
        let tie: BTreeMap<OsdId, PeerInfo> = [(3, info(5, 12)), (1, info(5, 12)), (2, info(5, 12))].into();
        assert_eq!(choose_authority(2, &tie, false).map(|(osd, _)| osd), Some(2));
        assert_eq!(choose_authority(9, &tie, false).map(|(osd, _)| osd), Some(1));
        // A member whose log was lost (or whose copy an unfinished recovery
        // changed) reports a seq past every id its store's record names, but
        // a member of its interval whose log knows its position wins, even
        // with no entry at all: the record may name a write whose data never
        // landed (simulator seed 8840). It still leads older intervals.
        let lost = PeerInfo { last_epoch: 0, position_lost: true, ..info(5, 1) };
        let empty = PeerInfo { last_epoch: 0, ..info(5, 0) };
        let infos: BTreeMap<OsdId, PeerInfo> = [(0, lost), (1, empty), (2, info(4, 50))].into();
        assert_eq!(choose_authority(0, &infos, false).map(|(osd, _)| osd), Some(1));
        let infos: BTreeMap<OsdId, PeerInfo> = [(0, lost), (2, info(4, 50))].into();
        assert_eq!(choose_authority(2, &infos, false).map(|(osd, _)| osd), Some(0));
        // A member whose history reaches back far enough recovers by it; else backfill.
        let history = Some(Plan::History { after: 10, after_epoch: 5 });
        assert_eq!(plan_for(&info(5, 10), &PeerInfo { history_from: 10, ..info(5, 12) }, 9), history);
        assert_eq!(
            plan_for(&info(3, 10), &PeerInfo { history_from: 10, ..info(5, 12) }, 9),
            history,
            "older interval, same history"
        );
        assert_eq!(plan_for(&info(5, 10), &PeerInfo { history_from: 11, ..info(5, 12) }, 9), Some(Plan::Backfill));
        let unknown = PeerInfo { last_epoch: 0, ..info(0, 0) };
        assert_eq!(plan_for(&unknown, &unknown, 9), Some(Plan::Backfill), "an unknown end proves nothing");
        let empty_here = PeerInfo { last_epoch: 0, ..info(9, 0) };
        assert_eq!(plan_for(&empty_here, &empty_here, 9), None, "level when made so in this interval");
        assert_eq!(plan_for(&empty_here, &empty_here, 10), Some(Plan::Backfill), "but not in the next one");
        assert_eq!(plan_for(&info(5, 12), &info(5, 12), 9), None);
        assert_eq!(
            plan_for(&PeerInfo { last_epoch: 4, ..info(5, 12) }, &info(5, 12), 9),
            Some(Plan::Backfill),
            "divergent"
        );
    }

    fn damaged_copies() -> Vec<Member> {
        let good = active_member(&[("a", b"alpha"), ("b", b"beta"), ("c", b"gamma")]);
        let mut members = vec![good.clone(), good.clone(), good];
        members[1].damaged.insert(b"b".to_vec()); // rotted on a replica
        members[0].damaged.insert(b"c".to_vec()); // rotted on the primary (the authority)
        members[2].objects.insert(b"b".to_vec(), (b"bets".to_vec(), vec![])); // silently different
        members
    }

    #[test]
    fn a_deep_scrub_reports_bad_copies_and_changes_nothing_without_repair() {
        let mut members = damaged_copies();
        let (outcome, report) = scrub(&mut members, false);
        assert!(matches!(outcome, Action::Active { recovered_objects: 0, .. }), "{outcome:?}");
        let report = report.expect("a scrub report");
        assert_eq!(report.objects, 3);
        assert_eq!(report.repaired, 0);
        let bad: Vec<(Vec<u8>, Vec<u32>)> =
            report.inconsistent.iter().map(|i| (i.object.clone(), i.bad.clone())).collect();
        assert_eq!(bad, vec![(b"b".to_vec(), vec![1, 2]), (b"c".to_vec(), vec![0])]);
        assert_eq!(members[2].objects[&b"b".to_vec()].0, b"bets", "untouched");
    }

    #[test]
    fn a_repair_replaces_bad_copies_from_a_good_one_even_on_the_authority() {
        let mut members = damaged_copies();
        let (outcome, report) = scrub(&mut members, true);
        assert!(matches!(outcome, Action::Active { .. }), "{outcome:?}");
        assert_eq!(report.expect("a scrub report").repaired, 3);
        for member in &members {
            assert!(member.damaged.is_empty());
            assert_eq!(member.objects, active_member(&[("a", b"alpha"), ("b", b"beta"), ("c", b"gamma")]).objects);
        }
        // A second scrub finds nothing.
        let (_, report) = scrub(&mut members, false);
        assert_eq!(report.expect("a scrub report").inconsistent, vec![]);
    }

    #[test]
    fn an_object_damaged_everywhere_is_reported_unrepairable() {
        let good = active_member(&[("a", b"alpha")]);
        let mut members = vec![good.clone(), good];
        for member in &mut members {
            member.damaged.insert(b"a".to_vec());
        }
        let (outcome, report) = scrub(&mut members, true);
        assert!(matches!(outcome, Action::Active { .. }), "{outcome:?}");
        let report = report.expect("a scrub report");
        assert_eq!(report.inconsistent.len(), 1);
        assert!(report.inconsistent[0].unrepairable);
        assert_eq!(report.repaired, 0);
    }

    /// One randomly generated history of a PG and its members, as peering
    /// finds them: a main line of writes (epoch 5, then epoch 6 from seq
    /// `k` on, when interval 6 went active among the "current" members),
    /// members that were current (a prefix of the main line past `k`),
    /// stale (a prefix up to `k`, maybe plus a divergent tail of epoch-5
    /// writes the main line never took), or that lost their log (a store
    /// holding some prefix, no log).
    #[derive(Clone, Debug)]
    struct Scenario {
        main: Vec<(u32, u8)>,
        k: usize,
        members: Vec<Kind>,
    }

    #[derive(Clone, Debug)]
    enum Kind {
        Current { len: usize, history: usize },
        Stale { len: usize, divergent: usize, history: usize },
        Lost { len: usize },
    }

    fn scenario() -> impl Strategy<Value = Scenario> {
        (
            proptest::collection::vec((0u32..6, any::<u8>()), 4..40),
            0.0f64..1.0,
            proptest::collection::vec((0u8..3, 0.0f64..1.0, 0usize..5, 0usize..50), 1..4),
            0usize..4,
        )
            .prop_map(|(main, k, kinds, longest_at)| {
                let k = ((main.len() as f64 * k) as usize).min(main.len() - 1);
                let n = main.len();
                let mut members: Vec<Kind> = kinds
                    .into_iter()
                    .map(|(kind, at, divergent, history)| match kind {
                        0 => Kind::Current { len: k + ((n - k) as f64 * at) as usize, history },
                        // The old primary (its divergent tail starts at k), or an older replica.
                        1 if divergent > 0 => Kind::Stale { len: k, divergent, history },
                        1 => Kind::Stale { len: (k as f64 * at) as usize, divergent, history },
                        _ => Kind::Lost { len: (n as f64 * at) as usize },
                    })
                    .collect();
                // Interval 6 went active: at least one member was in it, and
                // its primary logged the whole main line (anywhere in the set).
                let at = longest_at.min(members.len());
                members.insert(at, Kind::Current { len: n, history: n });
                Scenario { main, k, members }
            })
    }

    fn object(id: u32) -> Vec<u8> {
        format!("obj-{id}").into_bytes()
    }

    /// Applies entries (seq, epoch, object id, byte) to a member.
    fn apply(member: &mut Member, entries: &[(u64, u32, u32, u8)], keep_history: usize) {
        for (seq, epoch, id, byte) in entries {
            if *byte < 16 {
                // Some writes are deletes: a stale copy may hold what the main line removed.
                member.objects.remove(&object(*id));
            } else {
                member.objects.insert(object(*id), (vec![*byte; 8 + *id as usize], Vec::new()));
            }
            member.last_seq = *seq;
            member.last_epoch = *epoch;
        }
        member.logged = entries.iter().map(|(seq, epoch, ..)| request_of(*seq, *epoch)).collect();
        let from = entries.len().saturating_sub(keep_history);
        member.history = entries[from..].iter().map(|(seq, epoch, id, _)| (*seq, *epoch, object(*id))).collect();
    }

    fn build(scenario: &Scenario) -> Vec<Member> {
        let main: Vec<(u64, u32, u32, u8)> = scenario
            .main
            .iter()
            .enumerate()
            .map(|(i, (id, byte))| ((i + 1) as u64, if i < scenario.k { 5 } else { 6 }, *id, *byte))
            .collect();
        scenario
            .members
            .iter()
            .map(|kind| {
                let mut member = Member::default();
                match kind {
                    Kind::Current { len, history } => {
                        apply(&mut member, &main[..*len], *history);
                        member.last_active = 6;
                    }
                    Kind::Stale { len, divergent, history } => {
                        let mut entries = main[..*len].to_vec();
                        if *len == scenario.k {
                            // The old primary's writes no one else logged.
                            let tail = (0..*divergent as u64).map(|i| (*len as u64 + 1 + i, 5, i as u32, 0xEE));
                            entries.extend(tail);
                        }
                        apply(&mut member, &entries, *history);
                        member.last_active = 5;
                    }
                    Kind::Lost { len } => {
                        apply(&mut member, &main[..*len], 0);
                        (member.last_seq, member.last_epoch, member.last_active) = (0, 0, 0);
                        member.logged.clear();
                    }
                }
                member
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..Default::default() })]

        /// Whatever the members' histories, and however often a request
        /// fails midway (the machine stops; the next one starts over on the
        /// partly recovered members), peering ends with every member
        /// holding exactly the main line's state: every write interval 6
        /// acknowledged, nothing of the divergent tails; and every member
        /// knows the request id of every main-line entry (a resend of one
        /// is answered, whoever is primary next), and of no divergent one.
        #[test]
        fn peering_converges_on_the_main_line_despite_failures(
            scenario in scenario(),
            failures in proptest::collection::vec(0u32..100, 0..64),
            fail_percent in 0u32..30,
        ) {
            let mut members = build(&scenario);
            let mut truth = Member::default();
            let main: Vec<(u64, u32, u32, u8)> = scenario.main.iter().enumerate()
                .map(|(i, (id, byte))| ((i + 1) as u64, 5, *id, *byte)).collect();
            apply(&mut truth, &main, 0);
            let main_ids: Vec<LoggedRequest> = (1..=scenario.main.len() as u64)
                .map(|seq| request_of(seq, if seq as usize <= scenario.k { 5 } else { 6 }))
                .collect();
            let ids: Vec<OsdId> = (0..members.len() as u32).collect();
            let mut draws = failures.into_iter();
            let mut interval = 10;
            let finished = loop {
                interval += 1;
                prop_assert!(interval < 200, "peering never finished");
                let (mut machine, actions) = Peering::start(7, interval, ids.clone());
                let mut queue: VecDeque<Action> = actions.into();
                let mut outcome = None;
                while let Some(action) = queue.pop_front() {
                    match action {
                        Action::Send { to, tag, op } => {
                            // Failures drawn from the seed, then none: it must end.
                            if draws.next().is_some_and(|draw| draw < fail_percent) {
                                queue.extend(machine.on_failure(tag, "injected"));
                                continue;
                            }
                            let reply = members[to as usize].answer(op, interval);
                            queue.extend(machine.on_reply(tag, reply));
                        }
                        done => outcome = Some(done),
                    }
                }
                if let Some(Action::Active { .. }) = outcome {
                    break interval;
                }
                prop_assert!(matches!(outcome, Some(Action::Stuck(_))), "{outcome:?}");
            };
            for (i, member) in members.iter().enumerate() {
                prop_assert_eq!(&member.objects, &truth.objects, "member {} differs", i);
                prop_assert_eq!((member.last_seq, member.last_active), (scenario.main.len() as u64, finished));
                prop_assert_eq!(&member.logged, &main_ids, "member {} request ids", i);
            }
        }
    }

    #[test]
    fn an_unfinished_backfill_is_never_the_authority_and_alone_it_waits() {
        let whole = active_member(&[("a", b"1"), ("b", b"2")]);
        // Took the newest writes while it was filled, but lacks older objects.
        let mut partial = active_member(&[("a", b"1"), ("b", b"2"), ("c", b"3")]);
        partial.objects.remove(b"a".as_slice());
        partial.backfilling = true;
        partial.last_active = 7;
        let mut members = vec![partial.clone(), whole];
        let outcome = run(&mut members, 9);
        assert!(matches!(outcome, Action::Active { authority: 1, .. }), "{outcome:?}");
        assert_eq!(members[0].objects, members[1].objects, "the partial copy was backfilled from the whole one");

        let mut alone = vec![partial.clone(), partial];
        let outcome = run(&mut alone, 9);
        // Neither of the set's OSDs answered with a whole copy.
        assert!(matches!(&outcome, Action::Stuck(why) if why.contains("is down")), "{outcome:?}");
        // With no set recorded, the same holds for want of any whole copy.
        let (mut machine, actions) = Peering::start_with_targets(7, 9, vec![0, 1], vec![], None, None);
        let outcome = drive(&mut alone, 9, &mut machine, actions);
        assert!(matches!(&outcome, Action::Stuck(why) if why.contains("unfinished backfill")), "{outcome:?}");
        assert!(alone.iter().all(|m| m.last_active == 7), "nothing was activated");
    }

    #[test]
    fn only_an_osd_of_the_last_active_set_may_lead_and_new_members_are_recorded_before_they_serve() {
        // osd.2 alone took the newest writes; osd.0 and osd.1 missed them.
        let stale = active_member(&[("a", b"old")]);
        let start = |record: Option<Vec<OsdId>>| Peering::start_with_targets(7, 9, vec![0, 1], vec![], None, record);

        let mut members = vec![stale.clone(), stale.clone()];
        let (mut machine, actions) = start(Some(vec![2]));
        let outcome = drive(&mut members, 9, &mut machine, actions);
        assert!(
            matches!(&outcome, Action::Stuck(why) if why.contains("is down") && why.contains("osd.2")),
            "{outcome:?}"
        );
        assert!(members.iter().all(|m| m.last_active == 5), "nothing was activated");

        // With osd.1 in the set, it leads; the members are recorded first.
        let (mut machine, actions) = start(Some(vec![1, 2]));
        let mut queue: VecDeque<Action> = actions.into();
        let mut recorded = None;
        while let Some(action) = queue.pop_front() {
            match action {
                Action::Send { to, tag, op } => {
                    let reply = members[to as usize].answer(op, 9);
                    queue.extend(machine.on_reply(tag, reply));
                }
                Action::Record { members } => recorded = Some(members),
                other => panic!("{other:?} before the members were recorded"),
            }
        }
        assert_eq!(recorded, Some(vec![0, 1]));
        assert!(machine.is_recording());
        assert!(members.iter().all(|m| m.last_active == 5), "nobody serves before the map records them");
        assert!(machine.on_recorded(Some(&[1, 2])).is_empty(), "the map still has the old set");
        assert!(machine.on_recorded(None).is_empty());
        let actions = machine.on_recorded(Some(&[0, 1]));
        let outcome = drive(&mut members, 9, &mut machine, actions);
        assert!(matches!(outcome, Action::Active { .. }), "{outcome:?}");
        assert!(members.iter().all(|m| m.last_active == 9));

        // The set's OSDs were marked lost (an empty set): the best copy
        // present leads, an unfinished backfill too if that is all there is.
        let mut partial = stale.clone();
        partial.backfilling = true;
        let mut members = vec![partial.clone(), partial];
        let (mut machine, actions) = start(Some(vec![]));
        let outcome = drive(&mut members, 9, &mut machine, actions);
        assert!(matches!(outcome, Action::Active { authority: 0, .. }), "{outcome:?}");
    }

    #[test]
    fn a_recovery_cut_short_leaves_whole_objects_with_their_ids_and_no_seq_is_reused() {
        // osd.0 logged two writes osd.1 never got (seqs 3 and 4, to x and
        // y), so neither was acknowledged; osd.0 begins to recover osd.1 by
        // history and loses its power right after the first install.
        let behind = active_member(&[("x", b"x1"), ("y", b"y1")]);
        let mut ahead = behind.clone();
        ahead.write("x", b"x2");
        ahead.write("y", b"y2");
        let mut members = vec![ahead, behind];
        let (mut machine, actions) = Peering::start(7, 9, vec![0, 1]);
        let mut queue: VecDeque<Action> = actions.into();
        while let Some(action) = queue.pop_front() {
            let Action::Send { to, tag, op } = action else { panic!("{action:?} before the cut") };
            let install = matches!(op, PeerOp::Install { .. });
            let reply = members[to as usize].answer(op, 9);
            if install {
                break;
            }
            queue.extend(machine.on_reply(tag, reply));
        }
        let cut = members.pop().unwrap();
        assert!(cut.recovered, "the install marked the copy");
        assert_eq!(cut.objects[&b"x".to_vec()].0, b"x2", "the first object went whole, with its write");
        assert_eq!(cut.objects[&b"y".to_vec()].0, b"y1", "the second not at all");
        assert!(cut.logged.contains(&request_of(3, 5)), "the id of the write the copy shows came with it");
        assert!(!cut.logged.contains(&request_of(4, 5)), "not the id of a write it does not show");

        // osd.0 stays down. osd.1 (its last active set's) peers with an OSD
        // of an older interval: it leads, at an unknown position past seq
        // 3, so the new interval never reuses seq 3 (which would displace
        // the id of a write a client may have read), and every member gets
        // seq 3's id: a resend of that write is answered, not run again.
        let older = Member { last_active: 3, ..Member::default() };
        let mut members = vec![cut, older];
        let (mut machine, actions) = Peering::start_with_targets(7, 11, vec![0, 1], vec![], None, Some(vec![0, 5]));
        let outcome = drive(&mut members, 11, &mut machine, actions);
        assert!(matches!(outcome, Action::Active { authority: 0, last_seq: 3, .. }), "{outcome:?}");
        for member in &members {
            assert!(!member.recovered, "activation settles the copy");
            assert_eq!(member.last_seq, 3);
            assert!(member.logged.contains(&request_of(3, 5)));
            assert!(!member.logged.contains(&request_of(4, 5)), "a write no member shows runs when resent");
            assert_eq!(member.objects[&b"x".to_vec()].0, b"x2");
            assert_eq!(member.objects[&b"y".to_vec()].0, b"y1");
        }

        // A changed copy and a member that kept its log, at the same seq of
        // the same interval: the known position wins, even over the
        // primary, and the changed copy is compared, not trusted (here it
        // kept a stale y of its own history).
        let mut whole = active_member(&[("x", b"x1"), ("y", b"y1")]);
        whole.write("x", b"x2");
        let mut changed = active_member(&[("x", b"x1"), ("y", b"y0")]);
        changed.objects.insert(b"x".to_vec(), (b"x2".to_vec(), Vec::new()));
        changed.logged.push(request_of(3, 5));
        changed.recovered = true;
        let mut members = vec![changed, whole];
        let (mut machine, actions) = Peering::start(7, 13, vec![0, 1]);
        let outcome = drive(&mut members, 13, &mut machine, actions);
        assert!(matches!(outcome, Action::Active { authority: 1, last_seq: 3, .. }), "{outcome:?}");
        assert_eq!(members[0].objects[&b"y".to_vec()].0, b"y1", "the changed copy was brought level");
    }

    #[test]
    fn targets_are_fenced_and_activated_but_have_no_say_and_an_unreachable_one_is_left_out() {
        let member = active_member(&[("a", b"1")]);
        // A target claims a newer interval and more entries: ignored.
        let mut target = active_member(&[("a", b"9"), ("z", b"9")]);
        target.last_active = 8;
        let mut members = [member.clone(), member, target];
        let (mut machine, actions) = Peering::start_with_targets(7, 9, vec![0, 1], vec![2, 3], None, Some(vec![0, 1]));
        let mut queue: VecDeque<Action> = actions.into();
        let mut primary_backfill = None;
        let outcome = loop {
            match queue.pop_front().expect("peering ends") {
                Action::Send { to: 3, tag, .. } => queue.extend(machine.on_failure(tag, "unreachable")),
                Action::Send { to, tag, op } => {
                    if let (0, PeerOp::Activate { backfill, .. }) = (to, &op) {
                        primary_backfill = Some(backfill.clone());
                    }
                    let reply = members[to as usize].answer(op, 9);
                    queue.extend(machine.on_reply(tag, reply));
                }
                end => break end,
            }
        };
        assert_eq!(outcome, Action::Active { authority: 0, last_seq: 1, recovered_objects: 0, backfill: vec![2] });
        assert_eq!(primary_backfill, Some(vec![2]), "the primary replicates to the target that answered");
        assert_eq!(members[2].answered, 2, "the target was queried and activated");
        assert_eq!(members[2].last_active, 9);
        assert!(members[2].rebuilt);
        assert_eq!(members[1].objects, members[0].objects, "nothing moved because of the target's claims");
    }
}
