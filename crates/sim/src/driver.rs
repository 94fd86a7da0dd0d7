//! The peering thread's schedule, on the simulated clock: which PGs this
//! OSD (their primary) peers, when a stuck one tries again, one request at
//! a time, and the background backfill after. It mirrors
//! `duplex_osd::peering::driver` (the same rules, over the same [`Peering`]
//! and [`Backfill`] machines and [`primary_intervals`]); only the blocking
//! calls become messages and a timeout.

use std::collections::{BTreeMap, VecDeque};

use duplex_map::{Command, OsdId};
use duplex_osd::cluster::MapView;
use duplex_osd::messages::ScrubAsk;
use duplex_osd::peering::backfill::{Backfill, Step, Throttle};
use duplex_osd::peering::driver::{
    map_commands, primary_intervals, restart_due, start_peering, Identity, MachineState, Wanted, LOCK_RETRY,
    TARGET_RETRY,
};
use duplex_osd::peering::{Action, Peering};
use duplex_osd::pg::{pg_number, pool_of};
use duplex_proto::peering::PeerReply;

/// The real driver's constants.
pub const REQUEST_TIMEOUT_US: u64 = 10_000_000;
pub const RETRY_AFTER_US: u64 = 1_000_000;
pub const TICK_US: u64 = 50_000;

struct Machine {
    peering: Peering,
    identity: Identity,
    retry_at: Option<u64>,
    backfill: Option<Backfill>,
    /// While waiting for the map to record the members: when to ask.
    record_due: Option<u64>,
    /// While waiting for the map to drop the PG's pin: when to ask. The
    /// simulated network loses commands, which the real driver's
    /// request-reply to the monitor would see; so it asks until the map
    /// shows it (or the interval ends).
    clear_due: Option<u64>,
}

/// A request to another OSD waiting for its answer.
#[derive(Clone, Copy, Debug)]
pub struct Outstanding {
    pub txid: u64,
    pub pg: u32,
    pub tag: u64,
    pub to: OsdId,
    pub deadline: u64,
    /// A backfill machine's request (else a peering machine's).
    pub backfill: bool,
}

/// What to carry out next.
pub enum Next {
    Peering(u32, Action),
    Backfill(u32, Step),
}

#[derive(Default)]
pub struct Driver {
    machines: BTreeMap<u32, Machine>,
    queue: VecDeque<(u32, Action)>,
    seen_epoch: u64,
    wanted: BTreeMap<u32, Wanted>,
    next_pass: u64,
    pub outstanding: Option<Outstanding>,
    next_txid: u64,
    pub activations: u64,
    pub recovered_objects: u64,
    backfill_queue: VecDeque<(u32, Step)>,
    /// When the next backfill step may go (the throttle, or a lock retry).
    pub backfill_due: u64,
    throttle: Throttle,
    pub backfilled_pgs: u64,
    /// Members activated to be filled in the background.
    pub background_fills: u64,
    pub backfill_objects: u64,
}

impl Driver {
    /// Starts machines for PGs whose interval changed, restarts stuck ones
    /// when due and deactivated ones, drops the others (the real driver's
    /// `reconcile`).
    pub fn reconcile(
        &mut self,
        view: &MapView,
        me: OsdId,
        now: u64,
        scrubs: Vec<ScrubAsk>,
        locally_active: impl Fn(u32) -> bool,
    ) {
        let epoch_moved = view.epoch() != self.seen_epoch;
        if !epoch_moved && scrubs.is_empty() && now < self.next_pass {
            return;
        }
        self.next_pass = now + TICK_US;
        self.seen_epoch = view.epoch();
        if epoch_moved {
            self.wanted = primary_intervals(view, me);
            let wanted = &self.wanted;
            self.machines.retain(|key, _| wanted.contains_key(key));
            self.queue.retain(|(key, _)| wanted.contains_key(key));
            self.backfill_queue.retain(|(key, _)| wanted.contains_key(key));
            if self.outstanding.is_some_and(|o| !wanted.contains_key(&o.pg)) {
                self.outstanding = None;
            }
        }
        let mut scrubs: BTreeMap<u32, bool> =
            scrubs.into_iter().filter(|a| self.wanted.contains_key(&a.pg)).map(|a| (a.pg, a.repair)).collect();
        for (key, want) in self.wanted.clone() {
            let (identity, active_set) = (&want.identity, &want.active_set);
            let scrub = scrubs.remove(&key);
            let machine = self.machines.get(&key).map(|m| MachineState {
                peering: &m.peering,
                same_interval: m.identity == *identity,
                retry_due: m.retry_at.map(|at| now >= at),
                backfill: m.backfill.as_ref(),
            });
            let restart = scrub.is_some() || restart_due(machine, &want, || locally_active(key));
            if !restart {
                // The monitor recorded the members a machine waits on.
                if let Some(machine) = self.machines.get_mut(&key) {
                    let next = machine.peering.on_recorded(active_set.as_deref());
                    for action in next.into_iter().rev() {
                        self.queue.push_front((key, action));
                    }
                }
                continue;
            }
            let identity = identity.clone();
            let (peering, actions) = start_peering(key, view.epoch(), want, scrub);
            self.queue.retain(|(pg, _)| *pg != key);
            self.backfill_queue.retain(|(pg, _)| *pg != key);
            if self.outstanding.is_some_and(|o| o.pg == key) {
                self.outstanding = None;
            }
            self.queue.extend(actions.into_iter().map(|a| (key, a)));
            let machine =
                Machine { peering, identity, retry_at: None, backfill: None, record_due: None, clear_due: None };
            self.machines.insert(key, machine);
        }
    }

    /// The next action to carry out, unless a request is still out:
    /// peering first, then backfill when the throttle lets it go.
    pub fn next(&mut self, now: u64) -> Option<Next> {
        if self.outstanding.is_some() {
            return None;
        }
        if let Some((pg, action)) = self.queue.pop_front() {
            return Some(Next::Peering(pg, action));
        }
        if now < self.backfill_due {
            return None;
        }
        self.backfill_queue.pop_front().map(|(pg, step)| Next::Backfill(pg, step))
    }

    /// The recovery throttle, before a backfill request goes out: `false`
    /// when it must wait (the step is queued again, due after the pause).
    pub fn throttle(&mut self, pg: u32, step: &Step, now: u64, bytes_per_sec: u64) -> bool {
        let Step::Send { op, .. } = step else { return true };
        if let Some(pause) = self.throttle.pause_before(op, bytes_per_sec) {
            self.backfill_due = now + pause;
            self.backfill_queue.push_front((pg, step.clone()));
            return false;
        }
        self.throttle.charge(op);
        true
    }

    /// When backfill work waits on the throttle or a lock retry.
    pub fn backfill_waits_until(&self) -> Option<u64> {
        (!self.backfill_queue.is_empty()).then_some(self.backfill_due)
    }

    pub fn interval_of(&self, pg: u32) -> Option<u64> {
        self.machines.get(&pg).map(|m| m.peering.interval)
    }

    /// A transaction id for a request about to go out.
    pub fn send(&mut self, pg: u32, tag: u64, to: OsdId, now: u64, backfill: bool) -> u64 {
        self.next_txid += 1;
        let txid = self.next_txid;
        self.outstanding = Some(Outstanding { txid, pg, tag, to, deadline: now + REQUEST_TIMEOUT_US, backfill });
        txid
    }

    /// A request's answer (`Err`: it failed or timed out): its machine's
    /// next actions go to the front, so one PG's recovery runs to its end
    /// before the next one's starts (as in the real driver).
    pub fn on_outcome(&mut self, pg: u32, tag: u64, backfill: bool, outcome: Result<PeerReply, String>) {
        let Some(machine) = self.machines.get_mut(&pg) else { return };
        if backfill {
            let Some(backfill) = machine.backfill.as_mut() else { return };
            let copied = backfill.progress.objects_copied;
            let next = match outcome {
                Ok(reply) => backfill.on_reply(tag, reply),
                Err(why) => backfill.on_failure(tag, &why),
            };
            self.backfill_objects += backfill.progress.objects_copied - copied;
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

    /// A machine finished (`Action::Active`) or stopped (`Action::Stuck`).
    pub fn on_end(&mut self, pg: u32, me: OsdId, action: Action, now: u64) {
        match action {
            Action::Active { recovered_objects, authority, last_seq, backfill } => {
                let machine = self.machines.get(&pg);
                tracing::debug!(
                    at = now,
                    pg,
                    interval = machine.map(|m| m.peering.interval),
                    members = ?machine.map(|m| m.peering.members()),
                    authority,
                    last_seq,
                    recovered_objects,
                    ?backfill,
                    wanted = ?self.wanted.get(&pg),
                    "simulated peering active"
                );
                self.activations += 1;
                self.recovered_objects += recovered_objects;
                self.background_fills += machine.map_or(0, |m| m.peering.filled_in_background().len() as u64);
                // As the real driver's `carry_out`: a hand-over's pin may go.
                if self.wanted.get(&pg).is_some_and(|w| w.pin_may_go_once_active(&backfill)) {
                    if let Some(machine) = self.machines.get_mut(&pg) {
                        machine.clear_due = Some(now);
                    }
                }
                self.start_backfill(pg, me, backfill, now);
            }
            Action::Stuck(why) => {
                tracing::debug!(pg, %why, "simulated peering stuck");
                if let Some(machine) = self.machines.get_mut(&pg) {
                    machine.retry_at = Some(now + RETRY_AFTER_US);
                }
                self.queue.retain(|(key, _)| *key != pg);
            }
            Action::Record { members } => {
                tracing::debug!(at = now, pg, ?members, "simulated peering asks to record its members");
                if let Some(machine) = self.machines.get_mut(&pg) {
                    machine.record_due = Some(now);
                }
            }
            Action::HandOver { acting } => {
                tracing::debug!(at = now, pg, ?acting, "simulated peering hands the PG over");
                if let Some(machine) = self.machines.get_mut(&pg) {
                    machine.record_due = Some(now);
                }
            }
            Action::Send { .. } => {}
        }
    }

    /// The commands the machines wait for the map to carry out, due now:
    /// record the members, hand the PG over (as the real driver's
    /// `ask_records`), drop the pin (its `ask_clears`).
    pub fn map_commands_due(&mut self, now: u64) -> Vec<Command> {
        let mut due = Vec::new();
        for (key, machine) in &mut self.machines {
            if machine.peering.waits_for_map() && machine.record_due.is_some_and(|at| now >= at) {
                machine.record_due = Some(now + RETRY_AFTER_US);
                due.push(*key);
            }
        }
        let mut commands = map_commands(due.iter().map(|key| (*key, &self.machines[key].peering)));
        for (key, machine) in &mut self.machines {
            if machine.clear_due.is_none_or(|at| now < at) {
                continue;
            }
            match self.wanted.get(key).filter(|w| w.is_pinned()) {
                Some(want) => {
                    machine.clear_due = Some(now + RETRY_AFTER_US);
                    let pgs = vec![(pool_of(*key), pg_number(*key), want.up.clone())];
                    commands.push(Command::ClearPgTemp { interval: machine.peering.interval, pgs });
                }
                None => machine.clear_due = None,
            }
        }
        commands
    }

    /// As the real driver's `start_backfill`.
    fn start_backfill(&mut self, pg: u32, me: OsdId, targets: Vec<OsdId>, now: u64) {
        let Some(machine) = self.machines.get_mut(&pg) else { return };
        let wanted = self.wanted.get(&pg).map_or(0, |w| w.targets.len());
        if targets.len() < wanted {
            machine.retry_at = Some(now + TARGET_RETRY.as_micros() as u64);
        }
        if targets.is_empty() {
            return;
        }
        let only = machine.peering.fill_only();
        let (backfill, steps) = Backfill::start_with(pg, machine.peering.interval, me, targets, only);
        machine.backfill = Some(backfill);
        self.backfill_queue.extend(steps.into_iter().map(|s| (pg, s)));
    }

    /// A backfill step that is not a request. When it completed, the pin
    /// goes (asked by `map_commands_due`); with no pin, the PG peers again
    /// (members filled in the background, `restart_due`).
    pub fn on_backfill_end(&mut self, pg: u32, step: Step, now: u64) {
        match step {
            Step::Complete => {
                self.backfilled_pgs += 1;
                let pinned = self.wanted.get(&pg).is_some_and(Wanted::is_pinned);
                if let Some(machine) = self.machines.get_mut(&pg) {
                    tracing::debug!(at = now, pg, interval = machine.peering.interval, pinned, wanted = ?self.wanted.get(&pg), "simulated backfill complete");
                    if pinned {
                        machine.clear_due = Some(now);
                    }
                }
            }
            Step::Stuck(why) => {
                tracing::debug!(pg, %why, "simulated backfill stopped");
                if let Some(machine) = self.machines.get_mut(&pg) {
                    machine.retry_at = Some(now + TARGET_RETRY.as_micros() as u64);
                }
                self.backfill_queue.retain(|(key, _)| *key != pg);
            }
            Step::SendLater { to, tag, op } => {
                self.backfill_due = now + LOCK_RETRY.as_micros() as u64;
                self.backfill_queue.push_front((pg, Step::Send { to, tag, op }));
            }
            Step::Send { .. } => unreachable!("requests are sent, not ended"),
        }
    }

    /// Whether every PG this OSD is primary of is active.
    pub fn all_active(&self) -> bool {
        self.wanted.keys().all(|key| self.machines.get(key).is_some_and(|m| m.peering.is_active()))
    }
}
