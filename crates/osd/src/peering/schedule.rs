//! The peering thread's schedule, sans I/O: which PGs this OSD (their
//! primary) peers and when, one request at a time, a stuck machine's next
//! attempt, scrubs asked for and scheduled, the background backfill after
//! (paced where its requests are served: each flusher's `Backfill` class,
//! crate::flusher::device), and the monitor commands the machines wait on.
//!
//! Time is microseconds on the runtime's clock. The OSD's peering thread
//! ([`crate::peering::driver`]) drives it with the wall clock and blocking
//! requests; the simulator drives the same schedule with its virtual clock
//! and messages, so the rules it checks are the ones the OSD runs.

use std::collections::{BTreeMap, HashMap, VecDeque};

use duplex_map::{Command, OsdId};
use duplex_proto::peering::{PeerOp, PeerReply};

use crate::cluster::MapView;
use crate::messages::ScrubAsk;
use crate::metrics::Metrics;
use crate::peering::backfill::{Backfill, Step};
use crate::peering::{Action, Peering};
use crate::pg::{pg_key, pg_number, pool_of, ReplyTo};

/// How long a member has to answer one request. Long enough for a query
/// that flushes a full log, or a digest page over big objects.
pub const REQUEST_TIMEOUT_US: u64 = 10_000_000;
/// After a machine got stuck (or a monitor command may have been lost), the next attempt.
pub const RETRY_AFTER_US: u64 = 1_000_000;
/// How often the whole schedule is looked at between map changes.
pub const TICK_US: u64 = 50_000;

/// A PG's interval: its acting set and its backfill targets, with each
/// one's incarnation.
pub type Identity = (Vec<(OsdId, u64)>, Vec<(OsdId, u64)>);

/// A PG this OSD is primary of, as the map has it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Wanted {
    pub identity: Identity,
    pub acting: Vec<OsdId>,
    /// Up-set OSDs that do not hold the PG yet (the map pins it to `acting`).
    pub targets: Vec<OsdId>,
    /// The up set, named when asking the monitor to drop the pin.
    pub up: Vec<OsdId>,
    /// The PG's last active set in the map (`duplex_map::active_set`).
    pub active_set: Option<Vec<OsdId>>,
    /// The interval since which the map records that set (`None`: none).
    pub recorded_since: Option<u64>,
    /// The pool's min_size: members that need a backfill are filled in
    /// the background if this many others are whole.
    pub min_size: usize,
    /// The map pins the PG (`duplex_map::ClusterMap::pg_temp`).
    pub pinned: bool,
    /// An erasure-coded pool's code (`None`: replicated).
    pub erasure: Option<duplex_map::ErasureCode>,
    /// An erasure-coded PG's pin is held only until its primary says the
    /// PG is active there (`duplex_map::pg_temp::erasure_pin_may_go`).
    pub erasure_pin_may_go: bool,
}

impl Wanted {
    /// The map pins the PG. Not `acting != up`: a pin that names the up
    /// set's OSDs in its order would then never be asked to go (the map
    /// no longer makes one, but an older map may hold one).
    pub fn is_pinned(&self) -> bool {
        self.pinned
    }

    /// A PG that went active with nothing to fill in the background
    /// (`backfill`) while pinned to its up set's own OSDs (a hand-over,
    /// [`Action::HandOver`]) holds every copy whole: its pin may go. This
    /// asks again after a first request was refused (a member restarted
    /// between the backfill and the request), or never made.
    pub fn pin_may_go_once_active(&self, backfill: &[OsdId]) -> bool {
        // An erasure-coded PG's pin is the map's to drop (`duplex_map::pg_temp`).
        // Only a pin of the up set's own OSDs (a hand-over): one whose
        // OSDs are not all in the up set holds copies the up set lacks (an
        // up-set OSD down, so no target shows), and the monitor keeps it
        // (`pg_temp::may_clear`); asking would be noise.
        backfill.is_empty()
            && self.targets.is_empty()
            && !self.up.is_empty()
            && self.acting.iter().all(|osd| self.up.contains(osd))
            && self.is_pinned()
            && self.erasure.is_none()
    }
}

/// What differs by pool kind in peering: the machine that brings a PG's
/// members to one history (`crate::backend` implements it per kind).
pub trait PeeringBackend: Send + Sync {
    /// A machine for `want`'s interval, which began at map epoch
    /// `interval`, followed by a deep scrub if `scrub` is `Some(repair)`.
    fn start_peering(&self, key: u32, interval: u64, want: Wanted, scrub: Option<bool>) -> (Peering, Vec<Action>);
}

/// Which [`PeeringBackend`] peers a pool's PGs.
pub type PeeringBackendOf = fn(&duplex_map::Pool) -> &'static dyn PeeringBackend;

/// A replicated PG's peering machine for `want`'s interval, which began at map epoch
/// `interval`, followed by a deep scrub if `scrub` is `Some(repair)`.
pub fn start_peering(key: u32, interval: u64, want: Wanted, scrub: Option<bool>) -> (Peering, Vec<Action>) {
    let Wanted { acting, targets, active_set, min_size, .. } = want;
    let (mut peering, actions) = Peering::start_with_targets(key, interval, acting, targets, scrub, active_set);
    peering.fill_in_background(min_size);
    (peering, actions)
}

/// A peering machine that went active without some backfill targets (they
/// could not be reached) starts again this much later to take them in.
pub const TARGET_RETRY_US: u64 = 10_000_000;

/// Backfill: a lock on an object that writes still hold is asked again after this.
pub const LOCK_RETRY_US: u64 = 2_000;

/// What [`restart_due`] looks at of a PG's machine.
struct MachineState<'a> {
    pub peering: &'a Peering,
    /// Its interval is the PG's current one.
    pub same_interval: bool,
    /// Whether its retry time has come (`None`: none is set).
    pub retry_due: Option<bool>,
    pub backfill: Option<&'a Backfill>,
}

/// Whether a PG's peering starts (again): it has no machine, its interval
/// changed, a stuck machine's retry is due, a failed write deactivated the
/// PG, backfill targets the active machine is not filling are due to be
/// taken in, or members it filled in the background are level now (and no
/// pin is to go first).
fn restart_due(machine: Option<MachineState<'_>>, want: &Wanted, locally_active: impl FnOnce() -> bool) -> bool {
    let targets = &want.targets[..];
    let Some(machine) = machine else { return true };
    if !machine.same_interval {
        return true;
    }
    if machine.peering.is_stuck() {
        return machine.retry_due.unwrap_or(true);
    }
    if machine.peering.is_active() {
        // The map records an interval newer than the one this machine
        // peered: the PG does not serve here until it peers again
        // (`Pg::serves`), so it must.
        if want.recorded_since.is_some_and(|since| since > machine.peering.interval) {
            return true;
        }
        let filled = machine.peering.filled_in_background();
        // Members filled in the background become members like the others
        // (when the PG is pinned, with the next interval: the pin goes).
        if !filled.is_empty() && machine.backfill.is_some_and(Backfill::is_complete) && !want.is_pinned() {
            return true;
        }
        let expected: Vec<OsdId> = targets.iter().chain(filled).copied().collect();
        return !locally_active()
            || (crate::peering::backfill::unfinished(machine.backfill, &expected) && machine.retry_due == Some(true));
    }
    false
}

/// The PGs `me` is primary of in `view`: each one's interval, acting set
/// and backfill targets.
pub fn primary_intervals(view: &MapView, me: OsdId) -> BTreeMap<u32, Wanted> {
    let mut wanted = BTreeMap::new();
    for pool in view.map.pools.values() {
        for number in 0..pool.pg_num {
            let duplex_map::PgSets { up, acting, backfill: targets, pinned } =
                view.map.pg_sets(&view.hierarchy, pool, number);
            if duplex_map::primary_of(&acting) != Some(me) {
                continue;
            }
            let Some(key) = pg_key(pool.id, number) else { continue };
            let identity = (incarnations(view, &acting), incarnations(view, &targets));
            let recorded = view.map.active_sets.get(&(pool.id, number));
            let active_set = recorded.map(|set| set.osds.clone());
            let recorded_since = recorded.map(|set| set.since);
            let min_size = usize::from(pool.min_size);
            let erasure = pool.erasure;
            let erasure_pin_may_go =
                pinned && duplex_map::pg_temp::erasure_pin_may_go(&view.map, &view.hierarchy, pool, number);
            let want = Wanted {
                identity,
                acting,
                targets,
                up,
                active_set,
                recorded_since,
                min_size,
                pinned,
                erasure,
                erasure_pin_may_go,
            };
            wanted.insert(key, want);
        }
    }
    wanted
}

/// The monitor commands the machines wait for the map to carry out: record
/// their members ([`Action::Record`]) or hand their PG over
/// ([`Action::HandOver`]); others are skipped.
pub fn map_commands<'a>(machines: impl IntoIterator<Item = (u32, &'a Peering)>) -> Vec<duplex_map::Command> {
    let (mut records, mut hand_overs, mut unrecords) = (Vec::new(), Vec::new(), Vec::new());
    for (key, peering) in machines {
        if let Some(acting) = peering.handing_over() {
            hand_overs.push((key, peering.interval, acting.to_vec()));
        } else if peering.is_recording() {
            records.push((key, peering.interval, peering.record_members()));
        } else if let Some((stale, acting)) = peering.unrecording() {
            unrecords.push((pool_of(key), pg_number(key), peering.interval, stale.to_vec(), acting.to_vec()));
        }
    }
    let mut commands = record_commands(records);
    commands.extend(hand_over_commands(hand_overs));
    commands.extend(
        unrecords
            .chunks(duplex_map::MAX_PGS_PER_COMMAND)
            .map(|chunk| duplex_map::Command::UnrecordShards { pgs: chunk.to_vec() }),
    );
    commands
}

/// The monitor commands that record each PG's members as its last active
/// set, for the interval each one's machine peered: (PG key, interval,
/// members). One per [`duplex_map::MAX_PGS_PER_COMMAND`] PGs: the monitor
/// refuses a longer one whole, and the PGs would wait for good.
fn record_commands(pgs: Vec<(u32, u64, Vec<OsdId>)>) -> Vec<duplex_map::Command> {
    pgs.chunks(duplex_map::MAX_PGS_PER_COMMAND)
        .map(|chunk| {
            let pgs = chunk
                .iter()
                .map(|(key, interval, members)| (pool_of(*key), pg_number(*key), *interval, members.clone()))
                .collect();
            duplex_map::Command::RecordActive { pgs }
        })
        .collect()
}

/// The monitor commands that hand PGs over to the acting sets their
/// primaries ask for ([`Action::HandOver`]): (PG key, interval, acting).
/// One per interval and per [`duplex_map::MAX_PGS_PER_COMMAND`] PGs.
fn hand_over_commands(pgs: Vec<(u32, u64, Vec<OsdId>)>) -> Vec<duplex_map::Command> {
    let mut by_interval: BTreeMap<u64, Vec<(duplex_map::PoolId, u32, Vec<OsdId>)>> = BTreeMap::new();
    for (key, interval, acting) in pgs {
        by_interval.entry(interval).or_default().push((pool_of(key), pg_number(key), acting));
    }
    by_interval
        .into_iter()
        .flat_map(|(interval, pgs)| {
            pgs.chunks(duplex_map::MAX_PGS_PER_COMMAND)
                .map(|chunk| duplex_map::Command::HandOver { interval, pgs: chunk.to_vec() })
                .collect::<Vec<_>>()
        })
        .collect()
}

fn incarnations(view: &MapView, osds: &[OsdId]) -> Vec<(OsdId, u64)> {
    osds.iter().map(|osd| (*osd, view.map.osds.get(osd).map_or(0, |o| o.state_epoch))).collect()
}

struct Machine {
    peering: Peering,
    identity: Identity,
    /// When a stuck machine may start again.
    retry_at: Option<u64>,
    started: u64,
    /// A scrub's requester, answered when the machine ends.
    scrub_reply: Option<ReplyTo>,
    /// It scrubs with repair (a newer scrub that replaces it unfinished
    /// repairs too: a repair a damaged read asked for is not lost).
    repairing: bool,
    /// When the PG's next scheduled deep scrub is due.
    scrub_due: u64,
    /// Background backfill of the targets the machine activated.
    backfill: Option<Backfill>,
    /// While the machine waits for the map to record its members, or to
    /// hand the PG over: when to ask the monitor (again: the ask or the
    /// answer may be lost).
    record_due: Option<u64>,
    /// While the map pins the PG and its copies are whole: when to ask the
    /// monitor to drop the pin (again, until the map shows it gone or the
    /// interval ends).
    clear_due: Option<u64>,
}

/// A request to another OSD waiting for its answer.
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    pub txid: u64,
    pub pg: u32,
    pub tag: u64,
    pub to: OsdId,
    pub deadline: u64,
    /// A backfill machine's request (else a peering machine's).
    pub backfill: bool,
    /// The map epoch it was sent under: a target whose incarnation is
    /// newer, or that is down, will never answer it.
    pub sent_epoch: u64,
}

/// What to carry out next.
#[derive(Debug)]
pub enum Next {
    /// A peering machine's action; its end ([`Action::Active`],
    /// [`Action::Stuck`], ...) goes back through [`Schedule::on_end`].
    Peering(u32, Action),
    /// A backfill step; one that is not a request goes back through
    /// [`Schedule::on_backfill_end`].
    Backfill(u32, Step),
}

/// The peering schedule of one OSD.
pub struct Schedule {
    me: OsdId,
    backend_of: PeeringBackendOf,
    /// Deep scrubs every this often (0: never).
    scrub_interval_us: u64,
    machines: BTreeMap<u32, Machine>,
    /// Actions to carry out, oldest first, with the PG they belong to.
    queue: VecDeque<(u32, Action)>,
    seen_epoch: u64,
    /// The PGs this OSD is primary of at `seen_epoch`, with their intervals.
    wanted: BTreeMap<u32, Wanted>,
    next_pass: u64,
    /// The request out, if any: one at a time.
    outstanding: Option<Outstanding>,
    next_txid: u64,
    /// Backfill steps to carry out (one PG's at a time, to its end, unless
    /// its target is backfill full: then the next PG's), and when the next
    /// may go (after a lock retry's pause, or a full target's).
    backfill_queue: VecDeque<(u32, Step)>,
    backfill_due: u64,
    /// When a backfill waiting on a full target was last logged.
    full_warned_at: u64,
    /// Scrub requesters to answer (the runtime sends them).
    answers: Vec<(ReplyTo, PeerReply)>,
    /// Members activated to be filled in the background, over all machines.
    pub background_fills: u64,
}

impl Schedule {
    pub fn new(me: OsdId, scrub_interval_us: u64, backend_of: PeeringBackendOf) -> Schedule {
        Schedule {
            me,
            backend_of,
            scrub_interval_us,
            machines: BTreeMap::new(),
            queue: VecDeque::new(),
            seen_epoch: 0,
            wanted: BTreeMap::new(),
            next_pass: 0,
            outstanding: None,
            next_txid: 0,
            backfill_queue: VecDeque::new(),
            backfill_due: 0,
            full_warned_at: 0,
            answers: Vec::new(),
            background_fills: 0,
        }
    }

    /// Starts machines for PGs whose interval changed (or that a failed
    /// write deactivated), restarts stuck ones when due, starts scrubs
    /// asked for or due, drops the others. Between map changes a full pass
    /// is needed only now and then (stuck machines, PGs a failed write
    /// deactivated, scheduled scrubs): not after every request of a long
    /// recovery.
    pub fn reconcile(
        &mut self,
        view: &MapView,
        now: u64,
        asked: Vec<ScrubAsk>,
        metrics: &Metrics,
        locally_active: impl Fn(u32) -> bool,
    ) {
        let epoch_moved = view.epoch() != self.seen_epoch;
        if !epoch_moved && asked.is_empty() && now < self.next_pass {
            return;
        }
        self.next_pass = now + TICK_US;
        self.seen_epoch = view.epoch();
        if epoch_moved {
            self.wanted = primary_intervals(view, self.me);
            let gone: Vec<u32> = self.machines.keys().copied().filter(|key| !self.wanted.contains_key(key)).collect();
            for key in gone {
                self.end(key, Some("this OSD is no longer the PG's primary".into()));
                self.machines.remove(&key);
            }
            let wanted = &self.wanted;
            self.queue.retain(|(key, _)| wanted.contains_key(key));
            self.backfill_queue.retain(|(key, _)| wanted.contains_key(key));
            if self.outstanding.is_some_and(|o| !wanted.contains_key(&o.pg)) {
                self.outstanding = None;
            }
            self.fail_request_to_gone_target(view, metrics);
        }
        let mut scrubs = self.merge_scrubs(asked);
        let (mut inactive, mut backfilling) = (0u64, 0u64);
        for (key, want) in self.wanted.clone() {
            let scheduled = self
                .machines
                .get(&key)
                .is_some_and(|m| m.peering.is_active() && self.scrub_interval_us > 0 && now >= m.scrub_due);
            let scrub =
                scrubs.remove(&key).or_else(|| scheduled.then_some(ScrubAsk { pg: key, repair: false, reply: None }));
            let machine = self.machines.get(&key).map(|m| MachineState {
                peering: &m.peering,
                same_interval: m.identity == want.identity,
                retry_due: m.retry_at.map(|at| now >= at),
                backfill: m.backfill.as_ref(),
            });
            let restart = scrub.is_some() || restart_due(machine, &want, || locally_active(key));
            // Targets to fill (a pin's, or members'), and no backfill of them complete yet.
            let machine = self.machines.get(&key);
            let filling = (!want.targets.is_empty()
                || machine.is_some_and(|m| !m.peering.filled_in_background().is_empty()))
                && !machine.and_then(|m| m.backfill.as_ref()).is_some_and(Backfill::is_complete);
            if restart {
                let Some(pool) = view.pool(pool_of(key)) else { continue };
                let backend = (self.backend_of)(pool);
                self.start(backend, key, view.epoch(), want, scrub, now);
            } else if let Some(machine) = self.machines.get_mut(&key) {
                // The monitor recorded the members a machine waits on.
                let next = machine.peering.on_recorded(want.active_set.as_deref());
                for action in next.into_iter().rev() {
                    self.queue.push_front((key, action));
                }
                // An erasure-coded PG active on a pin the monitor holds for
                // it: the pin may go now (duplex_map::pg_temp::may_release).
                if want.erasure_pin_may_go && machine.peering.is_active() && machine.clear_due.is_none() {
                    machine.clear_due = Some(now);
                }
            }
            if self.machines.get(&key).is_none_or(|m| !m.peering.is_active()) {
                inactive += 1;
            }
            if filling {
                backfilling += 1;
            }
        }
        debug_assert!(inactive <= self.wanted.len() as u64 && backfilling <= self.wanted.len() as u64);
        debug_assert!(self.machines.keys().all(|key| self.wanted.contains_key(key)), "a machine for a PG not ours");
        debug_assert!(self.queue.iter().all(|(key, _)| self.machines.contains_key(key)), "an action of no machine");
        debug_assert!(
            self.backfill_queue.iter().all(|(key, _)| self.machines.contains_key(key)),
            "a backfill step of no machine"
        );
        debug_assert!(
            self.outstanding.is_none_or(|out| self.machines.contains_key(&out.pg)),
            "the request out belongs to no machine"
        );
        metrics.inactive_pgs.store(inactive, std::sync::atomic::Ordering::Relaxed);
        metrics.backfilling_pgs.store(backfilling, std::sync::atomic::Ordering::Relaxed);
    }

    /// The scrubs asked for, one per PG this OSD is primary of: two asks
    /// for one PG make one scrub (repairing if either asked); an ask for a
    /// PG it is not primary of is refused.
    fn merge_scrubs(&mut self, asked: Vec<ScrubAsk>) -> HashMap<u32, ScrubAsk> {
        let mut scrubs: HashMap<u32, ScrubAsk> = HashMap::new();
        for ask in asked {
            if !self.wanted.contains_key(&ask.pg) {
                let why = format!("osd.{} is not the primary of PG {:#x}", self.me, ask.pg);
                self.answer(ask.reply, PeerReply::Refused(why));
                continue;
            }
            if let Some(earlier) = scrubs.insert(ask.pg, ask) {
                let merged = scrubs.get_mut(&ask.pg).expect("just inserted");
                merged.repair |= earlier.repair;
                if merged.reply.is_none() {
                    merged.reply = earlier.reply;
                } else {
                    self.answer(earlier.reply, PeerReply::Refused("a newer scrub of this PG replaced it".into()));
                }
            }
        }
        scrubs
    }

    fn start(
        &mut self,
        backend: &dyn PeeringBackend,
        key: u32,
        epoch: u64,
        want: Wanted,
        scrub: Option<ScrubAsk>,
        now: u64,
    ) {
        let identity = want.identity.clone();
        // The interval is named by the epoch peering starts at: members
        // refuse older ones, so a replaced primary cannot drive them.
        let interval = epoch;
        self.queue.retain(|(pg, _)| *pg != key);
        self.backfill_queue.retain(|(pg, _)| *pg != key);
        if self.outstanding.is_some_and(|o| o.pg == key) {
            self.outstanding = None;
        }
        // A PG first seen here counts as scrubbed a part of the interval
        // ago that depends on the PG, so scheduled scrubs spread out
        // instead of all blocking their PGs at once (and the simulator's
        // runs stay deterministic).
        let spread = (u64::from(key).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40) as f64 / (1u64 << 24) as f64;
        let mut scrub_due = now + (self.scrub_interval_us as f64 * (1.0 - spread)) as u64;
        let mut scrub_reply = None;
        let mut unfinished_repair = false;
        if let Some(old) = self.machines.get(&key) {
            scrub_due = old.scrub_due;
            scrub_reply = old.scrub_reply;
            unfinished_repair = old.repairing && !old.peering.is_active();
        }
        let repair = match scrub {
            Some(ask) => {
                if scrub_reply.is_some() && ask.reply.is_some() {
                    self.answer(scrub_reply.take(), PeerReply::Refused("a newer scrub of this PG replaced it".into()));
                }
                scrub_reply = ask.reply.or(scrub_reply);
                scrub_due = now + self.scrub_interval_us;
                let repair = ask.repair || unfinished_repair;
                tracing::info!(pg = key, repair, "deep scrub");
                Some(repair)
            }
            // A repair cut short (a new interval) runs again.
            None if unfinished_repair => Some(true),
            None => None,
        };
        let (peering, actions) = backend.start_peering(key, interval, want, repair);
        debug_assert_eq!((peering.pg, peering.interval), (key, interval), "a machine for another PG or interval");
        debug_assert_eq!(peering.members().first(), Some(&self.me), "a machine whose members do not start with us");
        tracing::debug!(pg = key, interval, members = ?peering.members(), "peering");
        self.queue.extend(actions.into_iter().map(|a| (key, a)));
        let machine = Machine {
            peering,
            identity,
            retry_at: None,
            started: now,
            scrub_reply,
            repairing: repair == Some(true),
            scrub_due,
            backfill: None,
            record_due: None,
            clear_due: None,
        };
        self.machines.insert(key, machine);
    }

    /// The next action to carry out, unless a request is still out:
    /// peering first (its PGs wait for it), then backfill when its pause
    /// is over.
    pub fn next(&mut self, now: u64) -> Option<Next> {
        if self.outstanding.is_some() {
            return None;
        }
        // A walk joining its targets may hold its PG's client writes
        // (pg/elide.rs): its steps, a round trip each, go first.
        let joining = self.backfill_queue.front().is_some_and(|(pg, _)| {
            self.machines.get(pg).and_then(|m| m.backfill.as_ref()).is_some_and(Backfill::is_joining)
        });
        if joining && now >= self.backfill_due {
            return self.backfill_queue.pop_front().map(|(pg, step)| Next::Backfill(pg, step));
        }
        if let Some((pg, action)) = self.queue.pop_front() {
            return Some(Next::Peering(pg, action));
        }
        if now < self.backfill_due {
            return None;
        }
        self.backfill_queue.pop_front().map(|(pg, step)| Next::Backfill(pg, step))
    }

    /// Before a backfill request goes out: `false` when it must wait (the
    /// step is queued again). A target past `backfillfull` (in `view`'s
    /// map) waits: backfill into it goes on once it reports it has room
    /// again. (The backfill's rate is the flushers' to keep.)
    pub fn may_send(&mut self, pg: u32, step: &Step, now: u64, view: &MapView, metrics: &Metrics) -> bool {
        let Step::Send { op, to, .. } = step else { return true };
        let me = self.me;
        let full = |osd: &OsdId| {
            *osd != me && view.map.osds.get(osd).is_some_and(|osd| osd.fullness >= duplex_map::Fullness::BackfillFull)
        };
        // A join waits before it holds the PG's writes, not in the middle
        // (its activations move no data).
        let waits = |step: &Step| match step {
            Step::Send { op: PeerOp::BackfillJoin { targets }, .. } => targets.iter().any(full),
            Step::Send { op: PeerOp::Activate { .. }, .. } => false,
            Step::Send { to, .. } => full(to),
            _ => false,
        };
        if waits(step) {
            if self.full_warned_at == 0 || now >= self.full_warned_at + RETRY_AFTER_US {
                self.full_warned_at = now.max(1);
                // (A join is sent to the primary: it waits for its targets.)
                tracing::warn!(pg, to, ?op, "backfill waits: a target is backfill full");
            }
            // This PG waits; the others go on (two primaries each filling
            // the other's full OSD waited on each other for good, with
            // their backfills to an empty OSD queued behind). Its steps go
            // to the back, in order.
            let mut queue = std::mem::take(&mut self.backfill_queue);
            let (mine, others): (VecDeque<_>, VecDeque<_>) = queue.drain(..).partition(|(key, _)| *key == pg);
            self.backfill_queue = others;
            self.backfill_queue.push_back((pg, step.clone()));
            self.backfill_queue.extend(mine);
            if self.backfill_queue.iter().all(|(_, step)| waits(step)) {
                self.backfill_due = now + RETRY_AFTER_US;
            }
            return false;
        }
        if let PeerOp::PushData { data, .. } = op {
            metrics.backfill_bytes.add(data.len() as u64);
        }
        true
    }

    /// When the next step is due without a new event: a full target's or a
    /// lock retry's pause, the next pass, or a request's deadline.
    pub fn wakes_at(&self) -> u64 {
        let mut at = self.next_pass;
        if !self.backfill_queue.is_empty() {
            at = at.min(self.backfill_due);
        }
        if let Some(out) = self.outstanding {
            at = at.min(out.deadline);
        }
        at
    }

    /// When backfill work waits on a full target or a lock retry.
    pub fn backfill_waits_until(&self) -> Option<u64> {
        (!self.backfill_queue.is_empty()).then_some(self.backfill_due)
    }

    /// The map epoch the schedule was last brought up to.
    pub fn seen_epoch(&self) -> u64 {
        self.seen_epoch
    }

    /// The interval `pg`'s machine peers (None: no machine).
    pub fn interval_of(&self, pg: u32) -> Option<u64> {
        self.machines.get(&pg).map(|m| m.peering.interval)
    }

    /// A request is about to go out: its transaction id. Nothing else
    /// runs until its answer comes ([`Schedule::on_answer`]) or its
    /// deadline passes ([`Schedule::timed_out`]).
    pub fn send(&mut self, pg: u32, tag: u64, to: OsdId, now: u64, backfill: bool) -> u64 {
        debug_assert!(self.outstanding.is_none(), "one request at a time");
        debug_assert_ne!(to, self.me, "a request to this OSD's own store goes out on the network");
        debug_assert!(self.machines.contains_key(&pg), "a request of no machine");
        self.next_txid += 1;
        let txid = self.next_txid;
        let deadline = now + REQUEST_TIMEOUT_US;
        self.outstanding = Some(Outstanding { txid, pg, tag, to, deadline, backfill, sent_epoch: self.seen_epoch });
        txid
    }

    /// Whether request `txid` still waits for its answer: a map change can
    /// end it early (its PG's interval moved, its target went down), and a
    /// runtime blocked on it then stops waiting.
    pub fn awaits(&self, txid: u64) -> bool {
        self.outstanding.is_some_and(|o| o.txid == txid)
    }

    /// A map that has the request's target down, or in a newer
    /// incarnation, fails the request now rather than at its deadline: that
    /// process will not answer it. A hung member otherwise held every PG of
    /// this OSD for the whole request timeout after the map marked it down
    /// (10 s; issue 24's hung-OSD test caught it under load).
    fn fail_request_to_gone_target(&mut self, view: &MapView, metrics: &Metrics) {
        let Some(out) = self.outstanding else { return };
        let same_process = view.map.osds.get(&out.to).is_some_and(|o| o.up && o.state_epoch <= out.sent_epoch);
        if !same_process {
            self.on_answer(out.txid, out.to, Err("went down (or restarted) before it answered".into()), metrics);
            debug_assert!(!self.awaits(out.txid), "a request to a gone target still waits");
        }
    }

    /// The answer to request `txid` from `from` (`Err`: it failed); `false`
    /// when no such request is out (a late or stray answer).
    pub fn on_answer(&mut self, txid: u64, from: OsdId, outcome: Result<PeerReply, String>, metrics: &Metrics) -> bool {
        let Some(out) = self.outstanding.filter(|o| o.txid == txid && o.to == from) else { return false };
        self.outstanding = None;
        self.on_outcome(out.pg, out.tag, out.backfill, outcome.map_err(|why| format!("osd.{from}: {why}")), metrics);
        true
    }

    /// The connection to `peer` broke at `broke_at` (a socket error): a
    /// request out to it, sent by then, fails now, as the runtime's call
    /// would, rather than at its deadline (which held every PG of this OSD
    /// for 10 s). `false` when none was.
    pub fn connection_broke(&mut self, peer: OsdId, broke_at: u64, metrics: &Metrics) -> bool {
        let sent_by_then = |o: &Outstanding| o.deadline.saturating_sub(REQUEST_TIMEOUT_US) <= broke_at;
        let Some(out) = self.outstanding.filter(|o| o.to == peer && sent_by_then(o)) else { return false };
        self.on_answer(out.txid, peer, Err("the connection broke".into()), metrics)
    }

    /// Fails the request out if its deadline has passed.
    pub fn timed_out(&mut self, now: u64, metrics: &Metrics) {
        if let Some(out) = self.outstanding.filter(|o| now >= o.deadline) {
            self.on_answer(out.txid, out.to, Err("no answer in time".into()), metrics);
        }
    }

    /// A local request's answer (to this OSD's own store), which never goes out.
    pub fn on_local_answer(
        &mut self,
        pg: u32,
        tag: u64,
        backfill: bool,
        outcome: Result<PeerReply, String>,
        metrics: &Metrics,
    ) {
        debug_assert!(self.outstanding.is_none(), "a local request while one is out");
        self.on_outcome(pg, tag, backfill, outcome, metrics);
    }

    /// A request's answer: its machine's next actions go to the front, so
    /// one PG's recovery runs to its end before the next one's starts, and
    /// PGs come back one by one instead of all together at the end.
    fn on_outcome(&mut self, pg: u32, tag: u64, backfill: bool, outcome: Result<PeerReply, String>, metrics: &Metrics) {
        let Some(machine) = self.machines.get_mut(&pg) else { return };
        if backfill {
            let Some(backfill) = machine.backfill.as_mut() else { return };
            let (copied, bytes) = (backfill.progress.objects_copied, backfill.progress.bytes_copied);
            let next = match outcome {
                Ok(reply) => backfill.on_reply(tag, reply),
                Err(why) => backfill.on_failure(tag, &why),
            };
            debug_assert!(backfill.progress.objects_copied >= copied, "a backfill's progress never goes back");
            debug_assert!(backfill.progress.bytes_copied >= bytes, "a backfill's progress never goes back");
            metrics.backfill_objects.add(backfill.progress.objects_copied - copied);
            for step in next.into_iter().rev() {
                self.backfill_queue.push_front((pg, step));
            }
            return;
        }
        let next = match outcome {
            Ok(reply) => machine.peering.on_reply(tag, reply),
            Err(why) => machine.peering.on_failure(tag, &why),
        };
        for action in next.into_iter().rev() {
            self.queue.push_front((pg, action));
        }
    }

    /// A machine's action that is not a request: it finished
    /// ([`Action::Active`]), stopped ([`Action::Stuck`]) or waits for the
    /// map ([`Action::Record`], [`Action::HandOver`]).
    pub fn on_end(&mut self, key: u32, action: Action, now: u64, metrics: &Metrics) {
        match action {
            Action::Active { recovered_objects, authority, last_seq, backfill } => {
                debug_assert!(
                    self.machines.get(&key).is_none_or(|m| m.peering.is_active()),
                    "Active from a machine that is not"
                );
                metrics.peerings_active.add(1);
                metrics.recovered_objects.add(recovered_objects);
                if let Some(machine) = self.machines.get_mut(&key) {
                    self.background_fills += machine.peering.filled_in_background().len() as u64;
                    // A hand-over's pin may go once active.
                    if self.wanted.get(&key).is_some_and(|w| w.pin_may_go_once_active(&backfill)) {
                        machine.clear_due = Some(now);
                    }
                    log_active(key, machine, authority, last_seq, recovered_objects, now, metrics);
                }
                self.start_backfill(key, backfill, now);
                self.end(key, None);
            }
            Action::Stuck(why) => {
                debug_assert!(
                    self.machines.get(&key).is_none_or(|m| m.peering.is_stuck()),
                    "Stuck from a machine that is not"
                );
                metrics.peerings_stuck.add(1);
                tracing::warn!(pg = key, %why, "peering stopped; trying again shortly");
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.retry_at = Some(now + RETRY_AFTER_US);
                    if machine.peering.unrecording().is_some() {
                        // Its stale shards go out of the record (erasure.rs).
                        machine.record_due = Some(now);
                    }
                }
                self.queue.retain(|(pg, _)| *pg != key);
            }
            Action::Record { members } => {
                tracing::debug!(pg = key, ?members, "recovered; the map must record the members before they serve");
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.record_due = Some(now);
                }
            }
            Action::HandOver { acting } => {
                tracing::info!(
                    pg = key,
                    ?acting,
                    "this OSD's copy needs a backfill or is far behind: handing the PG to a whole member, which fills it in the background"
                );
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.record_due = Some(now);
                }
            }
            Action::Send { .. } => unreachable!("requests are sent, not ended"),
        }
    }

    /// After peering: copies the PG to the targets it activated, in the
    /// background. Targets it could not reach are taken in by a later
    /// peering, so the pin stays until they are filled too.
    fn start_backfill(&mut self, key: u32, targets: Vec<OsdId>, now: u64) {
        let Some(machine) = self.machines.get_mut(&key) else { return };
        let wanted = self.wanted.get(&key).map_or(&[][..], |w| &w.targets[..]);
        // Not a count: `targets` also holds the members filled in the
        // background, which may stand in for a pin's target left out.
        if wanted.iter().any(|t| !targets.contains(t)) {
            tracing::warn!(pg = key, ?wanted, reached = ?targets, "some backfill targets could not be reached");
            machine.retry_at = Some(now + TARGET_RETRY_US);
        }
        if targets.is_empty() {
            return;
        }
        let only = machine.peering.fill_only();
        let objects = only.as_ref().map(Vec::len);
        // An erasure-coded PG's targets take its shards' entries from
        // activation on: only a replicated PG's wait for their walk, which
        // must not begin without them (a dormant target it walked would
        // miss the writes behind it).
        let join = self.wanted.get(&key).is_some_and(|w| w.erasure.is_none());
        let (backfill, steps) = Backfill::start_with(key, machine.peering.interval, self.me, targets, only, join);
        tracing::info!(pg = key, targets = ?backfill.targets(), ?objects, "backfill starts");
        machine.backfill = Some(backfill);
        self.backfill_queue.extend(steps.into_iter().map(|s| (key, s)));
    }

    /// A backfill step that is not a request. When it completed, the pin
    /// goes (asked by [`Schedule::map_commands_due`]); with no pin, the PG
    /// peers again (members filled in the background, `restart_due`).
    pub fn on_backfill_end(&mut self, key: u32, step: Step, now: u64, metrics: &Metrics) {
        match step {
            Step::Complete => {
                metrics.backfilled_pgs.add(1);
                let pinned = self.wanted.get(&key).is_some_and(Wanted::is_pinned);
                let wanted = self.wanted.get(&key).map_or(&[][..], |w| &w.targets[..]);
                let Some(machine) = self.machines.get_mut(&key) else { return };
                debug_assert!(
                    machine.backfill.as_ref().is_some_and(Backfill::is_complete),
                    "Complete from a backfill that is not"
                );
                let progress = machine.backfill.as_ref().map(|b| b.progress).unwrap_or_default();
                let (objects, bytes) = (progress.objects_copied, progress.bytes_copied);
                let took_ms = now.saturating_sub(machine.started) / 1000;
                // A pin's target this backfill did not fill (it could not
                // be reached when the interval peered) lacks the PG: the
                // pin stays, and the PG peers again to take it in
                // (`start_backfill` set the retry). Dropping the pin would
                // record the up set, that target too, as holding every
                // write, and make it serve (seed 50631: it became the
                // primary with a copy 22 s old).
                let unfilled: Vec<OsdId> = wanted
                    .iter()
                    .copied()
                    .filter(|t| !machine.backfill.as_ref().is_some_and(|b| b.targets().contains(t)))
                    .collect();
                if pinned && !unfilled.is_empty() {
                    tracing::info!(
                        pg = key,
                        objects,
                        bytes,
                        took_ms,
                        ?unfilled,
                        "backfill complete, but not of every target; the pin stays until they are filled"
                    );
                } else if pinned {
                    tracing::info!(
                        pg = key,
                        objects,
                        bytes,
                        took_ms,
                        "backfill complete; asking the monitor to serve the PG from its up set"
                    );
                    machine.clear_due = Some(now);
                } else {
                    tracing::info!(pg = key, objects, bytes, took_ms, "backfill complete; peering the PG again");
                }
            }
            Step::Stuck(why) => {
                debug_assert!(
                    self.machines.get(&key).is_none_or(|m| m.backfill.as_ref().is_some_and(Backfill::is_stuck)),
                    "Stuck from a backfill that is not"
                );
                tracing::warn!(pg = key, %why, "backfill stopped; it starts over with the PG's next peering");
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.retry_at = Some(now + TARGET_RETRY_US);
                }
                self.backfill_queue.retain(|(pg, _)| *pg != key);
            }
            Step::SendLater { to, tag, op } => {
                // Writes to the object are still in flight: let them land.
                self.backfill_due = now + LOCK_RETRY_US;
                self.backfill_queue.push_front((key, Step::Send { to, tag, op }));
            }
            Step::Send { .. } => unreachable!("requests are sent, not ended"),
        }
    }

    /// The commands the machines wait for the map to carry out, due now:
    /// record the members or hand the PG over, and drop a pin whose PG is
    /// whole. Each is asked again every [`RETRY_AFTER_US`] until the map
    /// shows it (the ask or its answer may be lost). A pin is dropped only
    /// once `may_move(pg)` (its PG holds no write some member lacks: an
    /// eventual PG's, `crate::backend::eventual::may_move`); until then it
    /// is asked at the next call.
    pub fn map_commands_due(&mut self, now: u64, may_move: &mut dyn FnMut(u32) -> bool) -> Vec<Command> {
        let mut due = Vec::new();
        for (key, machine) in &mut self.machines {
            let asks = machine.peering.waits_for_map() || machine.peering.unrecording().is_some();
            if asks && machine.record_due.is_some_and(|at| now >= at) {
                machine.record_due = Some(now + RETRY_AFTER_US);
                due.push(*key);
            }
        }
        let mut commands = map_commands(due.iter().map(|key| (*key, &self.machines[key].peering)));
        let mut clears: BTreeMap<u64, Vec<(duplex_map::PoolId, u32, Vec<OsdId>)>> = BTreeMap::new();
        for (key, machine) in &mut self.machines {
            if machine.clear_due.is_none_or(|at| now < at) {
                continue;
            }
            match self.wanted.get(key).filter(|w| w.is_pinned()) {
                Some(_) if !may_move(*key) => {}
                Some(want) => {
                    machine.clear_due = Some(now + RETRY_AFTER_US);
                    let pg = (pool_of(*key), pg_number(*key), want.up.clone());
                    clears.entry(machine.peering.interval).or_default().push(pg);
                }
                None => machine.clear_due = None,
            }
        }
        for (interval, pgs) in clears {
            // A command names a bounded number of PGs.
            for chunk in pgs.chunks(duplex_map::MAX_PGS_PER_COMMAND) {
                commands.push(Command::ClearPgTemp { interval, pgs: chunk.to_vec() });
            }
        }
        commands
    }

    /// Scrub requesters' answers, for the runtime to send.
    pub fn take_answers(&mut self) -> Vec<(ReplyTo, PeerReply)> {
        std::mem::take(&mut self.answers)
    }

    /// Whether every PG this OSD is primary of is active.
    pub fn all_active(&self) -> bool {
        self.wanted.keys().all(|key| self.machines.get(key).is_some_and(|m| m.peering.is_active()))
    }

    fn answer(&mut self, to: Option<ReplyTo>, reply: PeerReply) {
        if let Some(to) = to {
            self.answers.push((to, reply));
        }
    }

    /// Answers a scrub's requester, if one waits on this PG's machine.
    fn end(&mut self, key: u32, refused: Option<String>) {
        let Some(machine) = self.machines.get_mut(&key) else { return };
        let Some(reply) = machine.scrub_reply.take() else { return };
        let answer = match (refused, machine.peering.scrub_report()) {
            (Some(why), _) => PeerReply::Refused(why),
            (None, Some(report)) => PeerReply::Scrubbed(report.clone()),
            (None, None) => {
                // Re-peered without a scrub (the interval changed): keep waiting.
                machine.scrub_reply = Some(reply);
                return;
            }
        };
        self.answer(Some(reply), answer);
    }
}

/// The logs and scrub counters of a machine that went active.
fn log_active(
    key: u32,
    machine: &Machine,
    authority: OsdId,
    last_seq: u64,
    recovered: u64,
    now: u64,
    metrics: &Metrics,
) {
    let took_ms = now.saturating_sub(machine.started) / 1000;
    if let Some(report) = machine.peering.scrub_report() {
        metrics.scrub_inconsistent.add(report.inconsistent.len() as u64);
        metrics.scrub_repaired.add(report.repaired);
        if report.inconsistent.is_empty() {
            tracing::info!(pg = key, objects = report.objects, took_ms, "deep scrub: consistent");
        } else {
            for bad in &report.inconsistent {
                tracing::error!(pg = key, object = %String::from_utf8_lossy(&bad.object), bad = ?bad.bad, unrepairable = bad.unrepairable, "deep scrub: inconsistent copies");
            }
            tracing::warn!(
                pg = key,
                objects = report.objects,
                inconsistent = report.inconsistent.len(),
                repaired = report.repaired,
                took_ms,
                "deep scrub done"
            );
        }
    }
    if recovered > 0 {
        let bytes = machine.peering.progress.bytes_copied;
        tracing::info!(pg = key, authority, last_seq, objects = recovered, bytes, took_ms, "PG recovered and active");
    } else {
        tracing::debug!(pg = key, authority, last_seq, took_ms, "PG active");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pg::pg_key;

    #[test]
    fn backfill_into_a_backfill_full_target_waits_until_it_has_room() {
        let mut map = crate::test_map(2, 0);
        map.run(&duplex_map::Command::SetOsdFullness { id: 1, fullness: duplex_map::Fullness::BackfillFull }).unwrap();
        let metrics = Metrics::default();
        let mut schedule = Schedule::new(0, 0, crate::backend::peering_for);
        let step = Step::Send { to: 1, tag: 1, op: PeerOp::Remove { object: b"x".to_vec() } };
        let full = MapView::new(map.clone());
        assert!(!schedule.may_send(7, &step, 100, &full, &metrics), "the target is backfill full");
        assert_eq!(schedule.backfill_waits_until(), Some(100 + RETRY_AFTER_US), "held, to be tried again");
        map.run(&duplex_map::Command::SetOsdFullness { id: 1, fullness: duplex_map::Fullness::NearFull }).unwrap();
        assert!(schedule.may_send(7, &step, 200, &MapView::new(map), &metrics), "room again: it goes");
    }

    /// Three OSDs, osd.1 past backfillfull; osd.0's schedule.
    fn osd_1_backfill_full() -> (MapView, Metrics, Schedule) {
        let mut map = crate::test_map(3, 0);
        map.run(&duplex_map::Command::SetOsdFullness { id: 1, fullness: duplex_map::Fullness::BackfillFull }).unwrap();
        (MapView::new(map), Metrics::default(), Schedule::new(0, 0, crate::backend::peering_for))
    }

    /// A join waits for a full target before it holds its PG's writes.
    #[test]
    fn a_join_waits_for_a_full_target_before_it_holds_writes_but_not_in_its_middle() {
        let (view, metrics, mut schedule) = osd_1_backfill_full();
        // To the primary itself, naming osd.1: it waits (the hold is not taken yet).
        let join = Step::Send { to: 0, tag: 1, op: PeerOp::BackfillJoin { targets: vec![2, 1] } };
        assert!(!schedule.may_send(7, &join, 100, &view, &metrics));
        let free = Step::Send { to: 0, tag: 1, op: PeerOp::BackfillJoin { targets: vec![2] } };
        assert!(schedule.may_send(8, &free, 100, &view, &metrics));
        // Once it holds writes, its activation of osd.1 moves no data: it goes.
        let activate = Step::Send {
            to: 1,
            tag: 2,
            op: PeerOp::Activate {
                last_seq: 3,
                last_epoch: 1,
                members: vec![0, 2],
                rebuilt: false,
                requests: Vec::new(),
                backfill: vec![1],
            },
        };
        assert!(schedule.may_send(9, &activate, 100, &view, &metrics));
    }

    /// A PG whose target is backfill full does not hold up the others: its
    /// steps go behind theirs, in their order.
    #[test]
    fn a_backfill_waiting_on_a_full_target_lets_the_next_pg_go() {
        let (view, metrics, mut schedule) = osd_1_backfill_full();
        let send = |to, tag| Step::Send { to, tag, op: PeerOp::Remove { object: b"x".to_vec() } };
        schedule.backfill_queue.extend([(7, send(1, 2)), (8, send(2, 1))]);
        // PG 7's first step, popped, waits on osd.1: PG 8's goes next.
        assert!(!schedule.may_send(7, &send(1, 1), 100, &view, &metrics));
        let order: Vec<(u32, u64)> = schedule
            .backfill_queue
            .iter()
            .map(|(pg, step)| (*pg, if let Step::Send { tag, .. } = step { *tag } else { 0 }))
            .collect();
        assert_eq!(order, vec![(8, 1), (7, 1), (7, 2)]);
        assert_eq!(schedule.backfill_due, 0, "not paused: PG 8 can go");
        let Some(Next::Backfill(8, next)) = schedule.next(100) else { panic!("PG 8 is next") };
        assert!(schedule.may_send(8, &next, 100, &view, &metrics));
        // Only PG 7 is left, and it waits: now the queue pauses.
        let Some(Next::Backfill(7, next)) = schedule.next(100) else { panic!("PG 7 is next") };
        assert!(!schedule.may_send(7, &next, 100, &view, &metrics));
        assert_eq!(schedule.backfill_waits_until(), Some(100 + RETRY_AFTER_US));
    }

    /// Osd.0's schedule, brought up to `map`; its first PG and what it wants.
    fn osd0_schedule(map: &duplex_map::ClusterMap, metrics: &Metrics) -> (Schedule, u32, Wanted) {
        let view = MapView::new(map.clone());
        let (pg, want) = primary_intervals(&view, 0).into_iter().next().expect("osd.0 is primary of some PG");
        let mut schedule = Schedule::new(0, 0, crate::backend::peering_for);
        schedule.reconcile(&view, 0, Vec::new(), metrics, |_| false);
        (schedule, pg, want)
    }

    /// Issue 24: a request out to a member is given up as soon as a map
    /// ends it, not at its 10 s deadline: the peering thread, which waits
    /// on it, stops waiting (`driver::call_remote`) and peers the PG anew.
    #[test]
    fn a_request_out_ends_when_the_map_moves_its_pg_on() {
        let metrics = Metrics::default();
        let mut map = crate::test_map(4, 16);
        let (mut schedule, pg, want) = osd0_schedule(&map, &metrics);
        let member = want.acting[1];
        let txid = schedule.send(pg, 1, member, 10, false);
        let other = (1..4).find(|o| *o != member).expect("4 OSDs");
        map.run(&duplex_map::Command::SetOsdFullness { id: other, fullness: duplex_map::Fullness::NearFull }).unwrap();
        schedule.reconcile(&MapView::new(map.clone()), 20, Vec::new(), &metrics, |_| false);
        assert!(schedule.awaits(txid), "a map that changes nothing of the request leaves it out");
        map.run(&duplex_map::Command::MarkDown { id: member }).unwrap();
        schedule.reconcile(&MapView::new(map.clone()), 30, Vec::new(), &metrics, |_| false);
        assert!(!schedule.awaits(txid), "its PG's interval moved: the request is over");
    }

    /// A broken connection fails the request out to that peer at once (the
    /// simulator found a dropped answer holding every PG of an OSD for the
    /// whole 10 s deadline while its peers lost power one after another),
    /// and only that one.
    #[test]
    fn a_broken_connection_fails_the_request_out_to_that_peer() {
        let metrics = Metrics::default();
        let map = crate::test_map(4, 16);
        let (mut schedule, pg, want) = osd0_schedule(&map, &metrics);
        let member = want.acting[1];
        let txid = schedule.send(pg, 1, member, 10, false);
        let other = (1..4).find(|o| *o != member).expect("4 OSDs");
        assert!(!schedule.connection_broke(other, 20, &metrics), "no request was out to osd.{other}");
        assert!(!schedule.connection_broke(member, 5, &metrics), "it broke before the request went out");
        assert!(schedule.awaits(txid));
        assert!(schedule.connection_broke(member, 10, &metrics));
        assert!(!schedule.awaits(txid), "the request failed: peering goes on");
        assert!(!schedule.connection_broke(member, 20, &metrics), "nothing is out any more");
    }

    /// A request to an OSD outside its PG's interval (as a query of an
    /// earlier active set's member is) ends when the map has that OSD down,
    /// though the PG's interval stays.
    #[test]
    fn a_request_out_ends_when_the_map_takes_its_target_down() {
        let metrics = Metrics::default();
        let mut map = crate::test_map(4, 16);
        let (mut schedule, pg, want) = osd0_schedule(&map, &metrics);
        let outsider = (1..4).find(|o| !want.acting.contains(o)).expect("4 OSDs, size 2");
        let txid = schedule.send(pg, 1, outsider, 10, false);
        map.run(&duplex_map::Command::MarkDown { id: outsider }).unwrap();
        let after = MapView::new(map.clone());
        assert_eq!(primary_intervals(&after, 0).get(&pg).map(|w| &w.identity), Some(&want.identity), "same interval");
        schedule.reconcile(&after, 20, Vec::new(), &metrics, |_| false);
        assert!(!schedule.awaits(txid), "its target went down: it will not answer");
    }

    /// Seed 50631: a pin's target that peering could not reach is not
    /// stood in for by a member filled in the background: the PG peers
    /// again to take it in, and the pin stays.
    #[test]
    fn an_unreached_pin_target_is_not_counted_as_filled() {
        let metrics = Metrics::default();
        let mut map = crate::test_map(3, 16);
        map.run(&crate::test_boot(3)).unwrap();
        // Some PG moves to the new osd.3, pinned to where it was.
        let view = MapView::new(map.clone());
        let (me, key, want) = (0..3)
            .find_map(|me| {
                primary_intervals(&view, me)
                    .into_iter()
                    .find(|(_, w)| w.is_pinned() && w.targets == [3])
                    .map(|(k, w)| (me, k, w))
            })
            .expect("marking osd.3 in pins some PG with osd.3 to fill");
        let member = *want.acting.iter().find(|osd| **osd != me).expect("a member besides the primary");
        let mut schedule = Schedule::new(me, 0, crate::backend::peering_for);
        schedule.reconcile(&view, 0, Vec::new(), &metrics, |_| false);
        // Peering reached a member to fill in the background, not osd.3.
        schedule.start_backfill(key, vec![member], 100);
        let machine = &schedule.machines[&key];
        assert_eq!(machine.retry_at, Some(100 + TARGET_RETRY_US), "osd.3 was not reached: peer again to take it in");
    }

    #[test]
    fn record_commands_stay_within_what_the_monitor_takes() {
        let limit = duplex_map::MAX_PGS_PER_COMMAND;
        let pgs: Vec<(u32, u64, Vec<OsdId>)> =
            (0..limit as u32 + 1).map(|n| (pg_key(1, n).expect("a valid PG"), 9, vec![0, 1])).collect();
        let commands = record_commands(pgs);
        let sizes: Vec<usize> = commands
            .iter()
            .map(|c| match c {
                duplex_map::Command::RecordActive { pgs } => pgs.len(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(sizes, vec![limit, 1]);
        let duplex_map::Command::RecordActive { pgs } = &commands[1] else { unreachable!() };
        assert_eq!(pgs[0], (1, limit as u32, 9, vec![0, 1]), "PG keys become (pool, pg)");
        assert!(record_commands(Vec::new()).is_empty());
    }
}
