//! The peering thread: runs a [`Peering`] machine for every PG this OSD is
//! primary of whose interval changed, and carries its requests (blocking,
//! off the I/O path) to the members: over an authenticated connection to
//! each peer, or straight to this OSD's own flusher.
//!
//! An interval is a PG's acting set plus the incarnation of each member
//! (its `state_epoch`, which a restart moves). A PG whose machine finished
//! is watched: if a failed replicated write deactivated it (a member missed
//! an entry), it peers again.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use duplex_map::OsdId;
use duplex_mon_client::Connection as OsdConnection;
use duplex_mon_client::Credentials;
use duplex_proto::peering::{PeerOp, PeerReply, PeerRequest};
use duplex_proto::MessageType;

use crate::cluster::MapView;
use crate::messages::{Completion, Job, Mailbox, PeerReplyTo, ScrubAsk};
use crate::peering::backfill::{Backfill, Step, Throttle};
use crate::peering::{Action, Peering};
use crate::pg::{pg_key, pg_number, pool_of, ReplyTo};
use crate::shared::Shared;

/// How long a member has to answer one request. Long enough for a query
/// that flushes a full log, or a digest page over big objects.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connecting to a member that may be down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// After a machine got stuck (or a member could not be reached), the next attempt.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often the thread looks at the map and the PGs when idle.
const TICK: Duration = Duration::from_millis(50);

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
    /// The pool's min_size: members that need a backfill are filled in
    /// the background if this many others are whole.
    pub min_size: usize,
    /// The map pins the PG (`duplex_map::ClusterMap::pg_temp`).
    pub pinned: bool,
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
        backfill.is_empty() && self.targets.is_empty() && self.is_pinned()
    }
}

/// A peering machine for `want`'s interval, which began at map epoch
/// `interval`, followed by a deep scrub if `scrub` is `Some(repair)`.
/// This driver and the simulator's start them alike.
pub fn start_peering(key: u32, interval: u64, want: Wanted, scrub: Option<bool>) -> (Peering, Vec<Action>) {
    let Wanted { acting, targets, active_set, min_size, .. } = want;
    let (mut peering, actions) = Peering::start_with_targets(key, interval, acting, targets, scrub, active_set);
    peering.fill_in_background(min_size);
    (peering, actions)
}

/// A peering machine that went active without some backfill targets (they
/// could not be reached) starts again this much later to take them in.
pub const TARGET_RETRY: Duration = Duration::from_secs(10);
/// Backfill: a lock on an object that writes still hold is asked again after this.
pub const LOCK_RETRY: Duration = Duration::from_millis(2);

struct Machine {
    peering: Peering,
    identity: Identity,
    /// When a stuck machine may start again.
    retry_at: Option<Instant>,
    started: Instant,
    /// A scrub's requester, answered when the machine ends.
    scrub_reply: Option<ReplyTo>,
    /// When this PG was last deep-scrubbed (or first peered here).
    last_scrub: Instant,
    /// Background backfill of the targets the machine activated.
    backfill: Option<Backfill>,
    /// While the machine waits for the map to record its members, or to
    /// hand the PG over: when to ask the monitor (again: the ask or the
    /// answer may be lost).
    record_due: Option<Instant>,
}

pub struct PeeringDriver {
    shared: Arc<Shared>,
    mailboxes: Vec<Mailbox>,
    credentials: Credentials,
    machines: HashMap<u32, Machine>,
    /// Actions to carry out, oldest first, with the PG they belong to.
    queue: VecDeque<(u32, Action)>,
    conns: HashMap<OsdId, OsdConnection>,
    /// Peers that could not be reached, and until when not to try again.
    unreachable: HashMap<OsdId, Instant>,
    next_txid: u64,
    seen_epoch: u64,
    /// The PGs this OSD is primary of at `seen_epoch`, with their intervals.
    wanted: BTreeMap<u32, Wanted>,
    next_pass: Instant,
    /// Backfill steps to carry out (one PG's at a time, to its end), and
    /// when the next may go: the recovery throttle spaces them.
    backfill_queue: VecDeque<(u32, Step)>,
    backfill_due: Instant,
    throttle: Throttle,
    /// PGs whose backfill completed, by interval: the pins to drop.
    clears: BTreeMap<u64, Vec<u32>>,
    clear_due: Instant,
}

impl PeeringDriver {
    pub fn new(shared: Arc<Shared>, mailboxes: Vec<Mailbox>) -> PeeringDriver {
        let config = &shared.config;
        let credentials =
            Credentials { fsid: config.fsid, secret: config.secret.clone(), name: format!("osd.{}", config.id) };
        PeeringDriver {
            shared,
            mailboxes,
            credentials,
            machines: HashMap::new(),
            queue: VecDeque::new(),
            conns: HashMap::new(),
            unreachable: HashMap::new(),
            next_txid: 1,
            seen_epoch: 0,
            wanted: BTreeMap::new(),
            next_pass: Instant::now(),
            backfill_queue: VecDeque::new(),
            backfill_due: Instant::now(),
            throttle: Throttle::default(),
            clears: BTreeMap::new(),
            clear_due: Instant::now(),
        }
    }

    pub fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            self.reconcile();
            self.ask_clears();
            self.ask_records();
            // One action, then look at the map again: a long recovery
            // must not run on for an interval that already ended. Peering
            // first: its PGs wait for it; backfill runs in the background.
            if let Some((pg, action)) = self.queue.pop_front() {
                self.carry_out(pg, action);
            } else if !self.backfill_queue.is_empty() && Instant::now() >= self.backfill_due {
                if let Some((pg, step)) = self.backfill_queue.pop_front() {
                    self.backfill_step(pg, step);
                }
            } else {
                let idle = self.backfill_due.saturating_duration_since(Instant::now());
                std::thread::sleep(if self.backfill_queue.is_empty() { TICK } else { idle.min(TICK) });
            }
        }
    }

    /// Carries out one backfill step; the machine's next ones go first in line.
    fn backfill_step(&mut self, key: u32, step: Step) {
        let Some(interval) = self.machines.get(&key).map(|m| m.peering.interval) else { return };
        let (to, tag, op) = match step {
            Step::Send { to, tag, op } => (to, tag, op),
            Step::SendLater { to, tag, op } => {
                // Writes to the object are still in flight: let them land.
                std::thread::sleep(LOCK_RETRY);
                (to, tag, op)
            }
            Step::Complete => {
                let metrics = &self.shared.metrics;
                metrics.backfilled_pgs.add(1);
                let Some(machine) = self.machines.get(&key) else { return };
                let progress = machine.backfill.as_ref().map(|b| b.progress).unwrap_or_default();
                let (objects, bytes, took) =
                    (progress.objects_copied, progress.bytes_copied, machine.started.elapsed());
                if !self.wanted.get(&key).is_some_and(Wanted::is_pinned) {
                    // Members filled in the background, and no pin to
                    // drop: the next pass peers the PG again (restart_due).
                    tracing::info!(pg = key, objects, bytes, ?took, "backfill complete; peering the PG again");
                } else {
                    tracing::info!(
                        pg = key,
                        objects,
                        bytes,
                        ?took,
                        "backfill complete; asking the monitor to serve the PG from its up set"
                    );
                    self.clears.entry(interval).or_default().push(key);
                }
                return;
            }
            Step::Stuck(why) => {
                tracing::warn!(pg = key, %why, "backfill stopped; it starts over with the PG's next peering");
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.retry_at = Some(Instant::now() + TARGET_RETRY);
                }
                self.backfill_queue.retain(|(pg, _)| *pg != key);
                return;
            }
        };
        if let Some(pause) = self.throttle.pause_before(&op, self.shared.config.recovery_bytes_per_sec) {
            self.backfill_due = Instant::now() + Duration::from_micros(pause);
            self.backfill_queue.push_front((key, Step::Send { to, tag, op }));
            return;
        }
        self.throttle.charge(&op);
        let pushed = match &op {
            PeerOp::PushData { data, .. } => data.len() as u64,
            _ => 0,
        };
        let outcome = self.call(to, PeerRequest { pg: key, interval, op });
        let Some(backfill) = self.machines.get_mut(&key).and_then(|m| m.backfill.as_mut()) else { return };
        let copied_before = backfill.progress.objects_copied;
        let next = match outcome {
            Ok(reply) => backfill.on_reply(tag, reply),
            Err(why) => backfill.on_failure(tag, &format!("osd.{to}: {why}")),
        };
        let metrics = &self.shared.metrics;
        metrics.backfill_bytes.add(pushed);
        metrics.backfill_objects.add(backfill.progress.objects_copied - copied_before);
        for step in next.into_iter().rev() {
            self.backfill_queue.push_front((key, step));
        }
    }

    /// Asks the monitor to drop the pins of PGs whose backfill completed
    /// (a PG whose interval moved on since is left pinned by the monitor).
    fn ask_clears(&mut self) {
        if self.clears.is_empty() || Instant::now() < self.clear_due {
            return;
        }
        let mut client = self.monitor();
        for (interval, keys) in std::mem::take(&mut self.clears) {
            // A command names a bounded number of PGs.
            for keys in keys.chunks(duplex_map::MAX_PGS_PER_COMMAND) {
                let pgs: Vec<(u32, u32, Vec<OsdId>)> = keys
                    .iter()
                    .filter_map(|key| self.wanted.get(key).map(|w| (pool_of(*key), pg_number(*key), w.up.clone())))
                    .collect();
                if pgs.is_empty() {
                    continue;
                }
                let command = duplex_map::Command::ClearPgTemp { interval, pgs };
                match client.command(&command) {
                    Ok(outcome) => {
                        tracing::debug!(interval, ?outcome, "asked to serve backfilled PGs from their up sets")
                    }
                    Err(err) => {
                        tracing::warn!(%err, "the monitor did not take the backfilled PGs; asking again shortly");
                        self.clears.entry(interval).or_default().extend(keys);
                        self.clear_due = Instant::now() + RETRY_AFTER;
                    }
                }
            }
        }
    }

    /// A client of the monitors for this thread's commands (connecting
    /// briefly: a monitor that is down must not hold up peering for long).
    fn monitor(&self) -> duplex_mon_client::MonClient {
        let config = &self.shared.config;
        let mut client = duplex_mon_client::MonClient::new(config.monitors.clone(), self.credentials.clone());
        client.timeout = CONNECT_TIMEOUT;
        client
    }

    /// Asks the monitor to record the members of the PGs whose machines
    /// wait for it, or to hand PGs over ([`Action::HandOver`]): one
    /// command per kind (and interval, for hand-overs).
    fn ask_records(&mut self) {
        let now = Instant::now();
        let due: Vec<u32> = self
            .machines
            .iter()
            .filter(|(_, m)| m.peering.waits_for_map() && m.record_due.is_some_and(|at| now >= at))
            .map(|(key, _)| *key)
            .collect();
        if due.is_empty() {
            return;
        }
        let commands = map_commands(due.iter().map(|key| (*key, &self.machines[key].peering)));
        for key in &due {
            if let Some(machine) = self.machines.get_mut(key) {
                machine.record_due = Some(now + RETRY_AFTER);
            }
        }
        let mut client = self.monitor();
        for command in commands {
            match client.command(&command) {
                Ok(outcome) => {
                    tracing::debug!(pgs = due.len(), ?outcome, "asked the monitor to record or hand over PGs")
                }
                Err(err) => {
                    tracing::warn!(%err, "the monitor did not take the PGs' records or hand-overs; asking again shortly")
                }
            }
        }
    }

    /// Starts machines for PGs whose interval changed (or that a failed
    /// write deactivated), restarts stuck ones when due, drops the others.
    fn reconcile(&mut self) {
        let view = self.shared.map.load();
        let me = self.shared.config.id;
        let epoch_moved = view.epoch() != self.seen_epoch;
        let now = Instant::now();
        let scrub_asked = !self.shared.scrub_requests.lock().expect("scrub requests lock").is_empty();
        // Between map changes a full pass is needed only now and then (stuck
        // machines, PGs a failed write deactivated, scheduled scrubs): not
        // after every request of a long recovery.
        if !epoch_moved && !scrub_asked && now < self.next_pass {
            return;
        }
        self.next_pass = now + TICK;
        self.seen_epoch = view.epoch();
        if epoch_moved {
            self.wanted = primary_intervals(&view, me);
        }
        let wanted = self.wanted.clone();
        if epoch_moved {
            let gone: Vec<u32> = self.machines.keys().copied().filter(|key| !wanted.contains_key(key)).collect();
            for key in gone {
                self.end(key, Some("this OSD is no longer the PG's primary".into()));
                self.machines.remove(&key);
            }
        }
        let asked = std::mem::take(&mut *self.shared.scrub_requests.lock().expect("scrub requests lock"));
        let mut scrubs: HashMap<u32, ScrubAsk> = HashMap::new();
        for ask in asked {
            if !wanted.contains_key(&ask.pg) {
                self.answer(ask.reply, PeerReply::Refused(format!("osd.{me} is not the primary of PG {:#x}", ask.pg)));
                continue;
            }
            if let Some(earlier) = scrubs.insert(ask.pg, ask) {
                // Two asks for one PG: one scrub answers both (repairing if either asked).
                let merged = scrubs.get_mut(&ask.pg).expect("just inserted");
                merged.repair |= earlier.repair;
                if merged.reply.is_none() {
                    merged.reply = earlier.reply;
                } else {
                    self.answer(earlier.reply, PeerReply::Refused("a newer scrub of this PG replaced it".into()));
                }
            }
        }
        let scrub_interval = self.shared.config.scrub_interval;
        let mut inactive = 0u64;
        let mut backfilling = 0u64;
        for (key, want) in wanted {
            let scheduled = self.machines.get(&key).is_some_and(|m| {
                m.peering.is_active() && !scrub_interval.is_zero() && m.last_scrub.elapsed() >= scrub_interval
            });
            let scrub =
                scrubs.remove(&key).or_else(|| scheduled.then_some(ScrubAsk { pg: key, repair: false, reply: None }));
            let machine = self.machines.get(&key).map(|m| MachineState {
                peering: &m.peering,
                same_interval: m.identity == want.identity,
                retry_due: m.retry_at.map(|at| now >= at),
                backfill: m.backfill.as_ref(),
            });
            let restart = scrub.is_some() || restart_due(machine, &want, || self.locally_active(key));
            // Targets to fill (a pin's, or members'), and no backfill of them complete yet.
            let machine = self.machines.get(&key);
            let filling = (!want.targets.is_empty()
                || machine.is_some_and(|m| !m.peering.filled_in_background().is_empty()))
                && !machine.and_then(|m| m.backfill.as_ref()).is_some_and(Backfill::is_complete);
            if restart {
                self.start(key, view.epoch(), want, scrub);
            } else if let Some(machine) = self.machines.get_mut(&key) {
                // The monitor recorded the members a machine waits on.
                let next = machine.peering.on_recorded(want.active_set.as_deref());
                for action in next.into_iter().rev() {
                    self.queue.push_front((key, action));
                }
            }
            if self.machines.get(&key).is_none_or(|m| !m.peering.is_active()) {
                inactive += 1;
            }
            if filling {
                backfilling += 1;
            }
        }
        self.shared.metrics.inactive_pgs.store(inactive, Ordering::Relaxed);
        self.shared.metrics.backfilling_pgs.store(backfilling, Ordering::Relaxed);
    }

    fn locally_active(&self, key: u32) -> bool {
        self.shared.pgs.get(key).is_some_and(|pg| pg.lock().expect("PG lock").active.is_some())
    }

    fn start(&mut self, key: u32, epoch: u64, want: Wanted, scrub: Option<ScrubAsk>) {
        let identity = want.identity.clone();
        // The interval is named by the epoch peering starts at: members
        // refuse older ones, so a replaced primary cannot drive them.
        let interval = epoch;
        self.queue.retain(|(pg, _)| *pg != key);
        self.backfill_queue.retain(|(pg, _)| *pg != key);
        // A PG first seen here counts as scrubbed a random part of the
        // interval ago, so scheduled scrubs spread out instead of all
        // blocking their PGs at once.
        let interval_ago = self.shared.config.scrub_interval.mul_f64(rand::random::<f64>());
        let mut last_scrub = Instant::now().checked_sub(interval_ago).unwrap_or_else(Instant::now);
        let mut scrub_reply = None;
        if let Some(old) = self.machines.get(&key) {
            last_scrub = old.last_scrub;
            scrub_reply = old.scrub_reply;
        }
        let repair = match scrub {
            Some(ask) => {
                if scrub_reply.is_some() && ask.reply.is_some() {
                    self.answer(scrub_reply.take(), PeerReply::Refused("a newer scrub of this PG replaced it".into()));
                }
                scrub_reply = ask.reply.or(scrub_reply);
                last_scrub = Instant::now();
                tracing::info!(pg = key, repair = ask.repair, "deep scrub");
                Some(ask.repair)
            }
            None => None,
        };
        let (peering, actions) = start_peering(key, interval, want, repair);
        tracing::debug!(pg = key, interval, members = ?peering.members(), "peering");
        self.queue.extend(actions.into_iter().map(|a| (key, a)));
        let machine = Machine {
            peering,
            identity,
            retry_at: None,
            started: Instant::now(),
            scrub_reply,
            last_scrub,
            backfill: None,
            record_due: None,
        };
        self.machines.insert(key, machine);
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

    fn answer(&self, to: Option<ReplyTo>, reply: PeerReply) {
        let Some(to) = to else { return };
        let frame = reply.to_frame(to.txid);
        self.mailboxes[to.thread].post_and_wake(Completion::Send { token: to.token, frame });
    }

    fn carry_out(&mut self, key: u32, action: Action) {
        match action {
            Action::Send { to, tag, op } => {
                let Some(interval) = self.machines.get(&key).map(|m| m.peering.interval) else { return };
                let request = PeerRequest { pg: key, interval, op };
                let outcome = self.call(to, request);
                let Some(machine) = self.machines.get_mut(&key) else { return };
                let next = match outcome {
                    Ok(reply) => machine.peering.on_reply(tag, reply),
                    Err(why) => machine.peering.on_failure(tag, &format!("osd.{to}: {why}")),
                };
                // To the front: one PG's recovery runs to its end before the
                // next one's starts, so PGs come back one by one instead of
                // all together at the end.
                for action in next.into_iter().rev() {
                    self.queue.push_front((key, action));
                }
            }
            Action::Active { authority, last_seq, recovered_objects, backfill } => {
                if let Some(machine) = self.machines.get(&key) {
                    if self.wanted.get(&key).is_some_and(|w| w.pin_may_go_once_active(&backfill)) {
                        self.clears.entry(machine.peering.interval).or_default().push(key);
                    }
                }
                self.start_backfill(key, backfill);
                let metrics = &self.shared.metrics;
                metrics.peerings_active.add(1);
                metrics.recovered_objects.add(recovered_objects);
                if let Some(machine) = self.machines.get(&key) {
                    let took = machine.started.elapsed();
                    let progress = machine.peering.progress;
                    if let Some(report) = machine.peering.scrub_report() {
                        metrics.scrub_inconsistent.add(report.inconsistent.len() as u64);
                        metrics.scrub_repaired.add(report.repaired);
                        if report.inconsistent.is_empty() {
                            tracing::info!(pg = key, objects = report.objects, ?took, "deep scrub: consistent");
                        } else {
                            for bad in &report.inconsistent {
                                tracing::error!(pg = key, object = %String::from_utf8_lossy(&bad.object), bad = ?bad.bad, unrepairable = bad.unrepairable, "deep scrub: inconsistent copies");
                            }
                            tracing::warn!(
                                pg = key,
                                objects = report.objects,
                                inconsistent = report.inconsistent.len(),
                                repaired = report.repaired,
                                ?took,
                                "deep scrub done"
                            );
                        }
                    }
                    if recovered_objects > 0 {
                        tracing::info!(
                            pg = key,
                            authority,
                            last_seq,
                            objects = recovered_objects,
                            bytes = progress.bytes_copied,
                            ?took,
                            "PG recovered and active"
                        );
                    } else {
                        tracing::debug!(pg = key, authority, last_seq, ?took, "PG active");
                    }
                }
                self.end(key, None);
            }
            Action::Record { members } => {
                tracing::debug!(pg = key, ?members, "recovered; the map must record the members before they serve");
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.record_due = Some(Instant::now());
                }
            }
            Action::HandOver { acting } => {
                tracing::info!(
                    pg = key,
                    ?acting,
                    "this OSD's copy needs a backfill: handing the PG to a whole member, which fills it in the background"
                );
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.record_due = Some(Instant::now());
                }
            }
            Action::Stuck(why) => {
                self.shared.metrics.peerings_stuck.add(1);
                tracing::warn!(pg = key, %why, "peering stopped; trying again shortly");
                if let Some(machine) = self.machines.get_mut(&key) {
                    machine.retry_at = Some(Instant::now() + RETRY_AFTER);
                }
                self.queue.retain(|(pg, _)| *pg != key);
            }
        }
    }

    /// After peering: copies the PG to the targets it activated, in the
    /// background. Targets it could not reach are taken in by a later
    /// peering, so the pin stays until they are filled too.
    fn start_backfill(&mut self, key: u32, targets: Vec<OsdId>) {
        let me = self.shared.config.id;
        let Some(machine) = self.machines.get_mut(&key) else { return };
        let wanted = self.wanted.get(&key).map_or(&[][..], |w| &w.targets[..]);
        if targets.len() < wanted.len() {
            tracing::warn!(pg = key, ?wanted, reached = ?targets, "some backfill targets could not be reached");
            machine.retry_at = Some(Instant::now() + TARGET_RETRY);
        }
        if targets.is_empty() {
            return;
        }
        let only = machine.peering.fill_only();
        let objects = only.as_ref().map(Vec::len);
        let (backfill, steps) = Backfill::start_with(key, machine.peering.interval, me, targets, only);
        tracing::info!(pg = key, targets = ?backfill.targets(), ?objects, "backfill starts");
        machine.backfill = Some(backfill);
        self.backfill_queue.extend(steps.into_iter().map(|s| (key, s)));
    }

    /// One request to `to` and its answer.
    fn call(&mut self, to: OsdId, request: PeerRequest) -> Result<PeerReply, String> {
        if to == self.shared.config.id {
            let (sender, receiver) = crossbeam_channel::bounded(1);
            let flusher = self.shared.flusher_of(request.pg);
            flusher
                .send(Job::Peer { request, reply: PeerReplyTo::Local(sender) })
                .map_err(|_| "this OSD is stopping".to_string())?;
            return receiver.recv_timeout(REQUEST_TIMEOUT).map_err(|_| "the local store did not answer".to_string());
        }
        if self.unreachable.get(&to).is_some_and(|until| Instant::now() < *until) {
            return Err("unreachable (recently)".into());
        }
        let result = self.call_remote(to, &request);
        if result.is_err() {
            self.conns.remove(&to);
            self.unreachable.insert(to, Instant::now() + RETRY_AFTER);
        }
        result
    }

    fn call_remote(&mut self, to: OsdId, request: &PeerRequest) -> Result<PeerReply, String> {
        if !self.conns.contains_key(&to) {
            let addr = self.shared.map.load().addr_of(to).ok_or("not in the map")?;
            let conn = OsdConnection::connect(addr, &self.credentials, CONNECT_TIMEOUT)
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            conn.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
            self.conns.insert(to, conn);
        }
        let conn = self.conns.get_mut(&to).expect("just connected");
        let txid = self.next_txid;
        self.next_txid += 1;
        conn.send(&request.to_frame(txid)).map_err(|e| e.to_string())?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if Instant::now() >= deadline {
                return Err(format!("no answer within {REQUEST_TIMEOUT:?}"));
            }
            let frame = conn.recv().map_err(|e| e.to_string())?;
            if frame.header.message_type != MessageType::PeerReply as u8 || frame.header.transaction_id != txid {
                continue; // an answer to a request that timed out before
            }
            return PeerReply::decode(&frame.payload).map_err(|e| e.to_string());
        }
    }
}

/// What [`restart_due`] looks at of a PG's machine.
pub struct MachineState<'a> {
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
/// pin is to go first). This driver and the simulator's decide by it alike.
pub fn restart_due(machine: Option<MachineState<'_>>, want: &Wanted, locally_active: impl FnOnce() -> bool) -> bool {
    let targets = &want.targets[..];
    let Some(machine) = machine else { return true };
    if !machine.same_interval {
        return true;
    }
    if machine.peering.is_stuck() {
        return machine.retry_due.unwrap_or(true);
    }
    if machine.peering.is_active() {
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
            if acting.first() != Some(&me) {
                continue;
            }
            let Some(key) = pg_key(pool.id, number) else { continue };
            let identity = (incarnations(view, &acting), incarnations(view, &targets));
            let active_set = view.map.active_sets.get(&(pool.id, number)).map(|set| set.osds.clone());
            let min_size = usize::from(pool.min_size);
            wanted.insert(key, Wanted { identity, acting, targets, up, active_set, min_size, pinned });
        }
    }
    wanted
}

/// The monitor commands the machines wait for the map to carry out: record
/// their members ([`Action::Record`]) or hand their PG over
/// ([`Action::HandOver`]); others are skipped. This driver and the
/// simulator's ask alike.
pub fn map_commands<'a>(machines: impl IntoIterator<Item = (u32, &'a Peering)>) -> Vec<duplex_map::Command> {
    let (mut records, mut hand_overs) = (Vec::new(), Vec::new());
    for (key, peering) in machines {
        if let Some(acting) = peering.handing_over() {
            hand_overs.push((key, peering.interval, acting.to_vec()));
        } else if peering.is_recording() {
            records.push((key, peering.interval, peering.record_members()));
        }
    }
    let mut commands = record_commands(records);
    commands.extend(hand_over_commands(hand_overs));
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

#[cfg(test)]
mod tests {
    use super::*;

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
