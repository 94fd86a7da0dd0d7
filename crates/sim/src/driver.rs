//! The peering thread's schedule, on the simulated clock: which PGs this
//! OSD (their primary) peers, when a stuck one tries again, one request at
//! a time. It mirrors `duplex_osd::peering_driver` (the same rules, over
//! the same [`Peering`] machines and [`primary_intervals`]); only the
//! blocking calls become messages and a timeout.

use std::collections::{BTreeMap, VecDeque};

use duplex_map::OsdId;
use duplex_osd::cluster::MapView;
use duplex_osd::peering::{Action, Peering};
use duplex_osd::peering_driver::{primary_intervals, Identity, ScrubAsk};
use duplex_proto::peering::PeerReply;

/// The real driver's constants.
pub const REQUEST_TIMEOUT_US: u64 = 10_000_000;
pub const RETRY_AFTER_US: u64 = 1_000_000;
pub const TICK_US: u64 = 50_000;

struct Machine {
    peering: Peering,
    identity: Identity,
    retry_at: Option<u64>,
}

/// A request to another OSD waiting for its answer.
#[derive(Clone, Copy, Debug)]
pub struct Outstanding {
    pub txid: u64,
    pub pg: u32,
    pub tag: u64,
    pub to: OsdId,
    pub deadline: u64,
}

#[derive(Default)]
pub struct Driver {
    machines: BTreeMap<u32, Machine>,
    queue: VecDeque<(u32, Action)>,
    seen_epoch: u64,
    wanted: BTreeMap<u32, (Identity, Vec<OsdId>)>,
    next_pass: u64,
    pub outstanding: Option<Outstanding>,
    next_txid: u64,
    pub activations: u64,
    pub recovered_objects: u64,
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
            if self.outstanding.is_some_and(|o| !wanted.contains_key(&o.pg)) {
                self.outstanding = None;
            }
        }
        let mut scrubs: BTreeMap<u32, bool> =
            scrubs.into_iter().filter(|a| self.wanted.contains_key(&a.pg)).map(|a| (a.pg, a.repair)).collect();
        for (key, (identity, acting)) in self.wanted.clone() {
            let scrub = scrubs.remove(&key);
            let restart = scrub.is_some()
                || match self.machines.get(&key) {
                    None => true,
                    Some(machine) if machine.identity != identity => true,
                    Some(machine) if machine.peering.is_stuck() => machine.retry_at.is_none_or(|at| now >= at),
                    Some(machine) if machine.peering.is_active() => !locally_active(key),
                    Some(_) => false,
                };
            if restart {
                let (peering, actions) = match scrub {
                    Some(repair) => Peering::start_scrub(key, view.epoch(), acting, repair),
                    None => Peering::start(key, view.epoch(), acting),
                };
                self.queue.retain(|(pg, _)| *pg != key);
                if self.outstanding.is_some_and(|o| o.pg == key) {
                    self.outstanding = None;
                }
                self.queue.extend(actions.into_iter().map(|a| (key, a)));
                self.machines.insert(key, Machine { peering, identity, retry_at: None });
            }
        }
    }

    /// The next action to carry out, unless a request is still out.
    pub fn next_action(&mut self) -> Option<(u32, Action)> {
        if self.outstanding.is_some() {
            return None;
        }
        self.queue.pop_front()
    }

    pub fn interval_of(&self, pg: u32) -> Option<u64> {
        self.machines.get(&pg).map(|m| m.peering.interval)
    }

    /// A transaction id for a request about to go out.
    pub fn send(&mut self, pg: u32, tag: u64, to: OsdId, now: u64) -> u64 {
        self.next_txid += 1;
        let txid = self.next_txid;
        self.outstanding = Some(Outstanding { txid, pg, tag, to, deadline: now + REQUEST_TIMEOUT_US });
        txid
    }

    /// A request's answer (`Err`: it failed or timed out): its machine's
    /// next actions go to the front, so one PG's recovery runs to its end
    /// before the next one's starts (as in the real driver).
    pub fn on_outcome(&mut self, pg: u32, tag: u64, outcome: Result<PeerReply, String>) {
        let Some(machine) = self.machines.get_mut(&pg) else { return };
        let next = match outcome {
            Ok(reply) => machine.peering.on_reply(tag, reply),
            Err(why) => machine.peering.on_failure(tag, &why),
        };
        for action in next.into_iter().rev() {
            self.queue.push_front((pg, action));
        }
    }

    /// A machine finished (`Action::Active`) or stopped (`Action::Stuck`).
    pub fn on_end(&mut self, pg: u32, action: &Action, now: u64) {
        match action {
            Action::Active { recovered_objects, authority, last_seq } => {
                let machine = self.machines.get(&pg);
                tracing::debug!(
                    at = now,
                    pg,
                    interval = machine.map(|m| m.peering.interval),
                    members = ?machine.map(|m| m.peering.members()),
                    authority,
                    last_seq,
                    recovered_objects,
                    "simulated peering active"
                );
                self.activations += 1;
                self.recovered_objects += recovered_objects;
            }
            Action::Stuck(why) => {
                tracing::debug!(pg, %why, "simulated peering stuck");
                if let Some(machine) = self.machines.get_mut(&pg) {
                    machine.retry_at = Some(now + RETRY_AFTER_US);
                }
                self.queue.retain(|(key, _)| *key != pg);
            }
            Action::Send { .. } => {}
        }
    }

    /// Whether every PG this OSD is primary of is active.
    pub fn all_active(&self) -> bool {
        self.wanted.keys().all(|key| self.machines.get(key).is_some_and(|m| m.peering.is_active()))
    }
}
