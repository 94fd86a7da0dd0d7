//! The peering thread: runs this OSD's peering [`Schedule`] (a machine for
//! every PG it is primary of whose interval changed, and the background
//! backfill after) on the wall clock, and carries its requests, blocking
//! and off the I/O path, to the members: over an authenticated connection
//! to each peer, or straight to this OSD's own flusher. The schedule's
//! monitor commands go to the monitors, its scrub answers to the priority
//! thread that holds the requester's connection.
//!
//! An interval is a PG's acting set plus the incarnation of each member
//! (its `state_epoch`, which a restart moves). A PG whose machine finished
//! is watched: if a failed replicated write deactivated it (a member missed
//! an entry), it peers again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use duplex_map::OsdId;
use duplex_mon_client::Connection as OsdConnection;
use duplex_mon_client::Credentials;
use duplex_proto::peering::{PeerReply, PeerRequest};
use duplex_proto::MessageType;

use crate::messages::{Completion, Job, Mailbox, PeerReplyTo};
use crate::peering::backfill::Step;
use crate::peering::schedule::{Next, PeeringBackendOf, Schedule, REQUEST_TIMEOUT_US, RETRY_AFTER_US, TICK_US};
use crate::peering::Action;
use crate::shared::Shared;

/// How long a member has to answer one request.
const REQUEST_TIMEOUT: Duration = Duration::from_micros(REQUEST_TIMEOUT_US);
/// Connecting to a member that may be down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// A member that could not be reached is not tried again before this.
const RETRY_AFTER: Duration = Duration::from_micros(RETRY_AFTER_US);
/// The longest the thread sleeps before looking at the map and the PGs again.
const TICK: Duration = Duration::from_micros(TICK_US);

pub struct PeeringDriver {
    shared: Arc<Shared>,
    mailboxes: Vec<Mailbox>,
    credentials: Credentials,
    schedule: Schedule,
    /// The schedule's clock: microseconds since this.
    clock: Instant,
    conns: HashMap<OsdId, OsdConnection>,
    /// Peers that could not be reached, and until when not to try again.
    unreachable: HashMap<OsdId, Instant>,
    /// What this OSD last reported of its fullness, and when.
    fullness_asked: Option<(duplex_map::Fullness, u64)>,
}

impl PeeringDriver {
    /// `backend_of`: which peering backend peers a pool's PGs (`crate::backend::peering_for`).
    pub fn new(shared: Arc<Shared>, mailboxes: Vec<Mailbox>, backend_of: PeeringBackendOf) -> PeeringDriver {
        let config = &shared.config;
        let credentials =
            Credentials { fsid: config.fsid, secret: config.secret.clone(), name: format!("osd.{}", config.id) };
        let scrub_interval_us = config.scrub_interval.as_micros().min(u64::MAX as u128) as u64;
        let schedule = Schedule::new(config.id, scrub_interval_us, config.recovery_bytes_per_sec, backend_of);
        PeeringDriver {
            shared,
            mailboxes,
            credentials,
            schedule,
            clock: Instant::now(),
            conns: HashMap::new(),
            unreachable: HashMap::new(),
            fullness_asked: None,
        }
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_micros() as u64
    }

    pub fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            let now = self.now();
            let asked = std::mem::take(&mut *self.shared.scrub_requests.lock().expect("scrub requests lock"));
            let (shared, metrics) = (&self.shared, &self.shared.metrics);
            let view = shared.map.load();
            self.schedule.reconcile(&view, now, asked, metrics, |key| {
                shared.pgs.get(key).is_some_and(|pg| pg.lock().expect("PG lock").active.is_some())
            });
            self.send_answers();
            self.send_map_commands(now);
            // One action, then look at the map again: a long recovery
            // must not run on for an interval that already ended.
            match self.schedule.next(now) {
                Some(next) => self.carry_out(next, now),
                None => {
                    let idle = Duration::from_micros(self.schedule.wakes_at().saturating_sub(self.now()));
                    std::thread::sleep(idle.min(TICK));
                }
            }
        }
    }

    fn carry_out(&mut self, next: Next, now: u64) {
        let metrics = self.shared.metrics.clone();
        let (pg, to, tag, op, backfill) = match next {
            Next::Peering(pg, Action::Send { to, tag, op }) => (pg, to, tag, op, false),
            Next::Peering(pg, end) => return self.schedule.on_end(pg, end, now, &metrics),
            Next::Backfill(pg, step @ Step::Send { .. }) => {
                if !self.schedule.throttle(pg, &step, now, &self.shared.map.load(), &metrics) {
                    return;
                }
                let Step::Send { to, tag, op } = step else { unreachable!("matched above") };
                (pg, to, tag, op, true)
            }
            Next::Backfill(pg, end) => return self.schedule.on_backfill_end(pg, end, now, &metrics),
        };
        let Some(interval) = self.schedule.interval_of(pg) else { return };
        let request = PeerRequest { pg, interval, op };
        if to == self.shared.config.id {
            let outcome = self.call_local(request);
            self.schedule.on_local_answer(pg, tag, backfill, outcome, &metrics);
        } else {
            let txid = self.schedule.send(pg, tag, to, now, backfill);
            let outcome = self.call(to, txid, request);
            self.schedule.on_answer(txid, to, outcome, &metrics);
        }
    }

    /// Sends the schedule's scrub answers to the requesters' connections.
    fn send_answers(&mut self) {
        for (to, reply) in self.schedule.take_answers() {
            let frame = reply.to_frame(to.txid);
            self.mailboxes[to.thread].post_and_wake(Completion::Send { token: to.token, frame });
        }
    }

    /// Asks the monitors for what the machines wait on (records,
    /// hand-overs, pins to drop), briefly: a monitor that is down must not
    /// hold up peering for long. The schedule asks again if the map does
    /// not show it in time.
    fn send_map_commands(&mut self, now: u64) {
        let mut commands = self.schedule.map_commands_due(now);
        commands.extend(self.fullness_report(now));
        if commands.is_empty() {
            return;
        }
        let config = &self.shared.config;
        let mut client = duplex_mon_client::MonClient::new(config.monitors.clone(), self.credentials.clone());
        client.timeout = CONNECT_TIMEOUT;
        for command in commands {
            match client.command(&command) {
                Ok(outcome) => tracing::debug!(?command, ?outcome, "asked the monitor"),
                Err(err) => tracing::warn!(%err, ?command, "the monitor did not take a command; asking again shortly"),
            }
        }
    }

    /// This OSD's fullness, when it differs from what the map says: the
    /// fullest store partition against the map's ratios. A change is
    /// reported at once; the same report again at most every second, until
    /// the map shows it.
    fn fullness_report(&mut self, now: u64) -> Option<duplex_map::Command> {
        let view = self.shared.map.load();
        let id = self.shared.config.id;
        let reported = view.map.osds.get(&id).filter(|o| o.up)?.fullness;
        let fullness = view.map.full_ratios.classify(self.shared.metrics.fullest_partition_permille());
        let asked_lately =
            self.fullness_asked.is_some_and(|(asked, at)| asked == fullness && now < at + RETRY_AFTER_US);
        if fullness == reported || asked_lately {
            return None;
        }
        self.fullness_asked = Some((fullness, now));
        tracing::warn!(?fullness, was = ?reported, permille = self.shared.metrics.fullest_partition_permille(), "the store's fullness changed");
        Some(duplex_map::Command::SetOsdFullness { id, fullness })
    }

    /// A request to this OSD's own store, through its flusher.
    fn call_local(&self, request: PeerRequest) -> Result<PeerReply, String> {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        let flusher = self.shared.flusher_of(request.pg);
        flusher
            .send(Job::Peer { request, reply: PeerReplyTo::Local(sender) })
            .map_err(|_| "this OSD is stopping".to_string())?;
        receiver.recv_timeout(REQUEST_TIMEOUT).map_err(|_| "the local store did not answer".to_string())
    }

    /// One request to another OSD and its answer.
    fn call(&mut self, to: OsdId, txid: u64, request: PeerRequest) -> Result<PeerReply, String> {
        if self.unreachable.get(&to).is_some_and(|until| Instant::now() < *until) {
            return Err("unreachable (recently)".into());
        }
        let result = self.call_remote(to, txid, &request);
        if result.is_err() {
            self.shared.suspect(to);
            self.conns.remove(&to);
            self.unreachable.insert(to, Instant::now() + RETRY_AFTER);
        }
        result
    }

    fn call_remote(&mut self, to: OsdId, txid: u64, request: &PeerRequest) -> Result<PeerReply, String> {
        if !self.conns.contains_key(&to) {
            let addr = self.shared.map.load().addr_of(to).ok_or("not in the map")?;
            let conn = OsdConnection::connect(addr, &self.credentials, CONNECT_TIMEOUT)
                .map_err(|e| format!("connecting to {addr}: {e}"))?;
            conn.set_read_timeout(Some(REQUEST_TIMEOUT)).map_err(|e| e.to_string())?;
            self.conns.insert(to, conn);
        }
        let conn = self.conns.get_mut(&to).expect("just connected");
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
