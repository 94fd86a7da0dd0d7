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

use duplex_client::conn::OsdConnection;
use duplex_map::OsdId;
use duplex_mon::wire::Credentials;
use duplex_proto::peering::{PeerReply, PeerRequest};
use duplex_proto::MessageType;

use crate::cluster::MapView;
use crate::flusher::{Job, PeerReplyTo};
use crate::ops::Shared;
use crate::peering::{Action, Peering};
use crate::pg::pg_key;

/// How long a member has to answer one request. Long enough for a query
/// that flushes a full log, or a digest page over big objects.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Connecting to a member that may be down.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// After a machine got stuck (or a member could not be reached), the next attempt.
const RETRY_AFTER: Duration = Duration::from_secs(1);
/// How often the thread looks at the map and the PGs when idle.
const TICK: Duration = Duration::from_millis(50);

/// A PG's interval: its acting set, with each member's incarnation.
type Identity = Vec<(OsdId, u64)>;

struct Machine {
    peering: Peering,
    identity: Identity,
    /// When a stuck machine may start again.
    retry_at: Option<Instant>,
    started: Instant,
}

pub struct PeeringDriver {
    shared: Arc<Shared>,
    credentials: Credentials,
    machines: HashMap<u32, Machine>,
    /// Actions to carry out, oldest first, with the PG they belong to.
    queue: VecDeque<(u32, Action)>,
    conns: HashMap<OsdId, OsdConnection>,
    /// Peers that could not be reached, and until when not to try again.
    unreachable: HashMap<OsdId, Instant>,
    next_txid: u64,
    seen_epoch: u64,
}

impl PeeringDriver {
    pub fn new(shared: Arc<Shared>) -> PeeringDriver {
        let config = &shared.config;
        let credentials =
            Credentials { fsid: config.fsid, secret: config.secret.clone(), name: format!("osd.{}", config.id) };
        PeeringDriver {
            shared,
            credentials,
            machines: HashMap::new(),
            queue: VecDeque::new(),
            conns: HashMap::new(),
            unreachable: HashMap::new(),
            next_txid: 1,
            seen_epoch: 0,
        }
    }

    pub fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            self.reconcile();
            if self.queue.is_empty() {
                std::thread::sleep(TICK);
                continue;
            }
            // One action, then look at the map again: a long recovery
            // must not run on for an interval that already ended.
            if let Some((pg, action)) = self.queue.pop_front() {
                self.carry_out(pg, action);
            }
        }
    }

    /// Starts machines for PGs whose interval changed (or that a failed
    /// write deactivated), restarts stuck ones when due, drops the others.
    fn reconcile(&mut self) {
        let view = self.shared.map.load();
        let me = self.shared.config.id;
        let epoch_moved = view.epoch() != self.seen_epoch;
        self.seen_epoch = view.epoch();
        let mut wanted: BTreeMap<u32, (Identity, Vec<OsdId>)> = BTreeMap::new();
        for pool in view.map.pools.values() {
            for number in 0..pool.pg_num {
                let acting = view.map.acting(&view.hierarchy, pool, number);
                if acting.first() != Some(&me) {
                    continue;
                }
                let Some(key) = pg_key(pool.id, number) else { continue };
                wanted.insert(key, (identity(&view, &acting), acting));
            }
        }
        if epoch_moved {
            self.machines.retain(|key, _| wanted.contains_key(key));
        }
        let now = Instant::now();
        let mut inactive = 0u64;
        for (key, (identity, acting)) in wanted {
            let restart = match self.machines.get(&key) {
                None => true,
                Some(machine) if machine.identity != identity => true,
                Some(machine) if machine.peering.is_stuck() => machine.retry_at.is_none_or(|at| now >= at),
                Some(machine) if machine.peering.is_active() => !self.locally_active(key),
                Some(_) => false,
            };
            if restart {
                self.start(key, view.epoch(), identity, acting);
            }
            if self.machines.get(&key).is_none_or(|m| !m.peering.is_active()) {
                inactive += 1;
            }
        }
        self.shared.metrics.inactive_pgs.store(inactive, Ordering::Relaxed);
    }

    fn locally_active(&self, key: u32) -> bool {
        self.shared.pgs.get(key).is_some_and(|pg| pg.lock().expect("PG lock").active.is_some())
    }

    fn start(&mut self, key: u32, epoch: u64, identity: Identity, acting: Vec<OsdId>) {
        // The interval is named by the epoch peering starts at: members
        // refuse older ones, so a replaced primary cannot drive them.
        let interval = epoch;
        self.queue.retain(|(pg, _)| *pg != key);
        let (peering, actions) = Peering::start(key, interval, acting);
        tracing::debug!(pg = key, interval, members = ?peering.members(), "peering");
        self.queue.extend(actions.into_iter().map(|a| (key, a)));
        self.machines.insert(key, Machine { peering, identity, retry_at: None, started: Instant::now() });
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
            Action::Active { authority, last_seq, recovered_objects } => {
                let metrics = &self.shared.metrics;
                metrics.peerings_active.add(1);
                metrics.recovered_objects.add(recovered_objects);
                if let Some(machine) = self.machines.get(&key) {
                    let took = machine.started.elapsed();
                    let progress = machine.peering.progress;
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
        loop {
            let frame = conn.recv().map_err(|e| e.to_string())?;
            if frame.header.message_type != MessageType::PeerReply as u8 || frame.header.transaction_id != txid {
                continue; // an answer to a request that timed out before
            }
            return PeerReply::decode(&frame.payload).map_err(|e| e.to_string());
        }
    }
}

fn identity(view: &MapView, acting: &[OsdId]) -> Identity {
    acting.iter().map(|osd| (*osd, view.map.osds.get(osd).map_or(0, |o| o.state_epoch))).collect()
}
