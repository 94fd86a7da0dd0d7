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
use crate::peering::to_monitor::ToMonitor;
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
    /// When the flushers last got a map to remove stray copies by.
    strays: crate::flusher::strays::StrayWatch,
    /// Where the schedule's monitor commands go, not to wait in line here.
    to_monitor: ToMonitor,
}

impl PeeringDriver {
    /// `backend_of`: which peering backend peers a pool's PGs (`crate::backend::peering_for`).
    pub fn new(
        shared: Arc<Shared>,
        mailboxes: Vec<Mailbox>,
        backend_of: PeeringBackendOf,
    ) -> std::io::Result<PeeringDriver> {
        let config = &shared.config;
        let credentials =
            Credentials { fsid: config.fsid, secret: config.secret.clone(), name: format!("osd.{}", config.id) };
        let scrub_interval_us = config.scrub_interval.as_micros().min(u64::MAX as u128) as u64;
        let schedule = Schedule::new(config.id, scrub_interval_us, backend_of);
        let to_monitor = ToMonitor::start(config.monitors.clone(), credentials.clone(), CONNECT_TIMEOUT)?;
        Ok(PeeringDriver {
            shared,
            mailboxes,
            credentials,
            schedule,
            clock: Instant::now(),
            conns: HashMap::new(),
            unreachable: HashMap::new(),
            fullness_asked: None,
            strays: Default::default(),
            to_monitor,
        })
    }

    fn now(&self) -> u64 {
        self.clock.elapsed().as_micros() as u64
    }

    pub fn run(mut self, stop: Arc<AtomicBool>) {
        while !stop.load(Ordering::Relaxed) {
            let now = self.now();
            let asked = std::mem::take(&mut *self.shared.scrub_requests.lock().expect("scrub requests lock"));
            self.reconcile(now, asked);
            self.judge_strays(now);
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

    /// Brings the schedule up to the map (and the scrubs `asked`).
    fn reconcile(&mut self, now: u64, asked: Vec<crate::messages::ScrubAsk>) {
        let (shared, metrics) = (&self.shared, &self.shared.metrics);
        let view = shared.map.load();
        self.schedule.reconcile(&view, now, asked, metrics, |key| {
            shared.pgs.get(key).is_some_and(|pg| pg.lock().expect("PG lock").active.is_some())
        });
    }

    fn carry_out(&mut self, next: Next, now: u64) {
        let metrics = self.shared.metrics.clone();
        let (pg, to, tag, op, backfill) = match next {
            Next::Peering(pg, Action::Send { to, tag, op }) => (pg, to, tag, op, false),
            Next::Peering(pg, end) => return self.schedule.on_end(pg, end, now, &metrics),
            Next::Backfill(pg, step @ Step::Send { .. }) => {
                if !self.schedule.may_send(pg, &step, now, &self.shared.map.load(), &metrics) {
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

    /// Gives every flusher a new map to remove stray copies by, when due.
    /// A full queue skips it: the next map, or the recheck, sends it again.
    fn judge_strays(&mut self, now: u64) {
        // The epoch is an atomic: the map itself is loaded only when due.
        if self.strays.due(self.shared.map.epoch(), now) {
            let view = self.shared.map.load();
            for flusher in &self.shared.flushers {
                let _ = flusher.try_send(Job::Strays(view.clone()));
            }
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
    /// hand-overs, pins to drop), without waiting for them
    /// (`to_monitor`). The schedule asks again if the map does not show
    /// it in time.
    fn send_map_commands(&mut self, now: u64) {
        let shared = &self.shared;
        let mut commands =
            self.schedule.map_commands_due(now, &mut |key| crate::backend::eventual::may_move(shared, key));
        commands.extend(self.fullness_report(now));
        self.to_monitor.send(commands);
    }

    /// This OSD's fullness, when it differs from what the map says: the
    /// fullest store partition, plus the room kept for what the PG logs
    /// hold, against the map's ratios. A change is reported at once; the
    /// same report again at most every second, until the map shows it.
    /// Full here also makes this OSD's primary PGs refuse writes at once.
    fn fullness_report(&mut self, now: u64) -> Option<duplex_map::Command> {
        let metrics = &self.shared.metrics;
        // One walk of the logs keeps the log gauges and the eventual PGs'
        // lags (the metrics page and `OsdStats` read them).
        let (mut entries, mut logged) = (0u64, 0u64);
        let mut onode_slots = [0u64; duplex_store::MAX_PARTITIONS as usize];
        let view = self.shared.map.load();
        let id = self.shared.config.id;
        let mut lags = Vec::new();
        let wall = std::time::Instant::now();
        for pg in self.shared.pgs.all() {
            if let Ok(pg) = pg.lock() {
                entries += pg.log.len() as u64;
                logged += pg.reserved_bytes();
                onode_slots[self.shared.partition_of(pg.key)] += pg.reserved_onode_slots();
                let eventual = view.pool(crate::pg::pool_of(pg.key)).is_some_and(|pool| pool.is_eventual());
                let primary = pg.active.as_ref().is_some_and(|a| duplex_map::primary_of(&a.members) == Some(id));
                if eventual && primary {
                    let lag_us = pg.lag.lag(wall).as_micros() as u64;
                    lags.push(duplex_proto::osd::PgLagStat {
                        pg: pg.key,
                        lag_us,
                        unreplicated: pg.lag.unreplicated() as u64,
                    });
                }
            }
        }
        *metrics.eventual_lags.lock().expect("metrics lock") = lags;
        metrics.log_entries.store(entries, std::sync::atomic::Ordering::Relaxed);
        metrics.log_reserved_bytes.store(logged, std::sync::atomic::Ordering::Relaxed);
        for (gauge, slots) in metrics.partition_reserved_onode_slots.iter().zip(onode_slots) {
            gauge.store(slots, std::sync::atomic::Ordering::Relaxed);
        }
        let ratios = view.map.full_ratios;
        let fullness = ratios.classify(metrics.fullness_permille());
        metrics.locally_full.store(fullness == duplex_map::Fullness::Full, std::sync::atomic::Ordering::Relaxed);
        for (gauge, ratio) in metrics.full_ratios.iter().zip([ratios.nearfull, ratios.backfillfull, ratios.full]) {
            gauge.store(u64::from(ratio), std::sync::atomic::Ordering::Relaxed);
        }
        // Normal, near full, backfill full, full: 0 to 3, in declaration order.
        const _: () = assert!(duplex_map::Fullness::Normal as u64 == 0 && duplex_map::Fullness::Full as u64 == 3);
        metrics.fullness_state.store(fullness as u64, std::sync::atomic::Ordering::Relaxed);
        let reported = view.map.osds.get(&id).filter(|o| o.up)?.fullness;
        let asked_lately =
            self.fullness_asked.is_some_and(|(asked, at)| asked == fullness && now < at + RETRY_AFTER_US);
        if fullness == reported || asked_lately {
            return None;
        }
        self.fullness_asked = Some((fullness, now));
        tracing::warn!(
            ?fullness,
            was = ?reported,
            permille = metrics.fullness_permille(),
            onode_permille = metrics.onode_fullness_permille(),
            log_reserved_bytes = logged,
            "the store's fullness changed"
        );
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
        match self.call_remote(to, txid, &request) {
            Ok(reply) => Ok(reply),
            Err(Failed::Superseded) => {
                // The schedule already moved on; the connection may still
                // carry the late answer, which is dropped by its txid, but a
                // target that went down is reconnected afresh.
                self.conns.remove(&to);
                Err("superseded by a newer map".into())
            }
            Err(Failed::Peer(why)) => {
                self.shared.suspect(to);
                self.conns.remove(&to);
                self.unreachable.insert(to, Instant::now() + RETRY_AFTER);
                Err(why)
            }
        }
    }

    /// Sends the request and waits for its answer in slices of [`TICK`],
    /// bringing the schedule up to each new map in between: a map that
    /// ends the request (its target went down, its PG's interval moved)
    /// ends the wait, so a hung member holds no PG past the map that marks
    /// it down.
    fn call_remote(&mut self, to: OsdId, txid: u64, request: &PeerRequest) -> Result<PeerReply, Failed> {
        if !self.conns.contains_key(&to) {
            let addr = self.shared.map.load().addr_of(to).ok_or(Failed::Peer("not in the map".into()))?;
            let conn = OsdConnection::connect(addr, &self.credentials, CONNECT_TIMEOUT)
                .map_err(|e| Failed::Peer(format!("connecting to {addr}: {e}")))?;
            conn.set_read_timeout(Some(TICK)).map_err(|e| Failed::Peer(e.to_string()))?;
            self.conns.insert(to, conn);
        }
        let conn = self.conns.get_mut(&to).expect("just connected");
        conn.send(&request.to_frame(txid)).map_err(|e| Failed::Peer(e.to_string()))?;
        let deadline = Instant::now() + REQUEST_TIMEOUT;
        loop {
            if Instant::now() >= deadline {
                return Err(Failed::Peer(format!("no answer within {REQUEST_TIMEOUT:?}")));
            }
            let conn = self.conns.get_mut(&to).expect("connected above");
            let frame = match conn.recv() {
                Ok(frame) => frame,
                // A slice passed: `recv` keeps what it read of a frame.
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    if self.shared.map.epoch() != self.schedule.seen_epoch() {
                        self.reconcile(self.now(), Vec::new());
                    }
                    if !self.schedule.awaits(txid) {
                        return Err(Failed::Superseded);
                    }
                    continue;
                }
                Err(e) => return Err(Failed::Peer(e.to_string())),
            };
            if frame.header.message_type != MessageType::PeerReply as u8 || frame.header.transaction_id != txid {
                continue; // an answer to a request that timed out before
            }
            return PeerReply::decode(&frame.payload).map_err(|e| Failed::Peer(e.to_string()));
        }
    }
}

/// Why a request to another OSD got no answer.
enum Failed {
    /// The member did not answer (or could not be reached).
    Peer(String),
    /// A newer map ended the request while it waited (the schedule has
    /// already dealt with it).
    Superseded,
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use duplex_map::{ClusterMap, Command};
    use duplex_proto::peering::PeerOp;

    use super::*;
    use crate::cluster::{MapCell, MapView};
    use crate::config::{OplogMode, OsdConfig};
    use crate::metrics::Metrics;
    use crate::peering::schedule::primary_intervals;
    use crate::pg::PgTable;

    /// Issue 24: a peer that accepts and authenticates but then never
    /// answers (SIGSTOP, a stuck disk) held the peering thread, and so every
    /// PG this OSD peers, for the whole 10 s request timeout, even after
    /// the map marked it down. The wait ends with the map now.
    #[test]
    fn a_request_to_a_hung_peer_ends_with_the_map_that_marks_it_down() {
        let credentials = Credentials { fsid: [7; 16], secret: b"s".to_vec(), name: "osd.0".into() };
        let hung = TcpListener::bind("127.0.0.1:0").unwrap();
        let hung_addr = hung.local_addr().unwrap();
        let server_credentials = Credentials { name: "osd.1".into(), ..credentials.clone() };
        let (release, released) = crossbeam_channel::bounded::<()>(1);
        let held = std::thread::spawn(move || {
            let (stream, _) = hung.accept().unwrap();
            // Authenticates, then reads and answers nothing until the test ends.
            let conn = OsdConnection::accept(stream, &server_credentials, Duration::from_secs(5)).unwrap();
            let _ = released.recv_timeout(Duration::from_secs(15));
            drop(conn);
        });

        let mut map = ClusterMap::new(credentials.fsid);
        for id in 0..3 {
            let addr = if id == 1 { hung_addr.to_string() } else { format!("127.0.0.1:{}", 1 + id) };
            map.run(&Command::OsdBoot { id, addr, host: format!("h{id}"), weight: 1 << 16 }).unwrap();
        }
        map.run(&Command::PoolCreate { name: "rbd".into(), size: 3, min_size: 1, pg_num: 4 }).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let mut config = OsdConfig::new(0, dir.path().join("store"), dir.path().join("logs"), Vec::new());
        config.fsid = credentials.fsid;
        config.secret = credentials.secret.clone();
        let pgs = Arc::new(PgTable::open(OplogMode::File, dir.path(), 1 << 20).unwrap());
        let cell = Arc::new(MapCell::new(map.clone()));
        let shared = Arc::new(Shared::new(
            config,
            pgs,
            cell.clone(),
            Arc::new(Metrics::default()),
            Vec::new(),
            Default::default(),
        ));
        let mut driver = PeeringDriver::new(shared, Vec::new(), crate::backend::peering_for).unwrap();
        driver.reconcile(0, Vec::new());
        let pg = *primary_intervals(&MapView::new(map.clone()), 0).keys().next().expect("osd.0 is a primary");
        let interval = driver.schedule.interval_of(pg).expect("a machine for the PG");

        let txid = driver.schedule.send(pg, 1, 1, 0, false);
        let marks_down = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            map.run(&Command::MarkDown { id: 1 }).unwrap();
            cell.store(map);
        });
        let started = Instant::now();
        let outcome = driver.call(1, txid, PeerRequest { pg, interval, op: PeerOp::Query });
        let waited = started.elapsed();
        marks_down.join().unwrap();
        assert!(outcome.as_ref().is_err_and(|why| why.contains("superseded")), "{outcome:?}");
        assert!(waited < Duration::from_secs(3), "waited {waited:?} for a peer the map had down after 0.3 s");
        assert!(!driver.schedule.awaits(txid), "the schedule moved on");
        assert!(!driver.unreachable.contains_key(&1), "not taken for unreachable: the map said why");
        release.send(()).unwrap();
        held.join().unwrap();
    }
}
