//! A monitor client: finds the leader, runs commands, reads the map.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use duplex_map::{ClusterMap, Command};

use crate::wire::{Connection, Credentials, MonMessage, WireOutcome};

/// How long one step of a monitor call (connect, handshake, answer) waits.
const CALL_TIMEOUT: Duration = Duration::from_secs(2);

/// A step's timeout within `budget` (never zero: a socket timeout of zero means none).
fn step_timeout(budget: Duration) -> Duration {
    CALL_TIMEOUT.min(budget).max(Duration::from_millis(10))
}

pub struct MonClient {
    monitors: Vec<(u64, SocketAddr)>,
    credentials: Credentials,
    leader_guess: Option<u64>,
    /// Where the next call without a leader guess starts: past the last
    /// monitor that failed, so that a dead first monitor (a black hole
    /// whose connect waits out its timeout) does not take every call's
    /// whole budget (an OSD's heartbeat has one second).
    next_monitor: usize,
    pub timeout: Duration,
    /// Keep the connection to the leader open between requests (an OSD's
    /// heartbeats: the monitor learns of the process's death when it
    /// closes); otherwise each request has a connection of its own, and
    /// holds none of the monitors' connection slots in between.
    pub keep_connection: bool,
    kept: Option<(u64, Connection)>,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("no monitor answered within {0:?} (last error: {1})")]
    Unavailable(Duration, String),
    #[error("the monitor refused: {0}")]
    Refused(String),
}

impl MonClient {
    pub fn new(monitors: Vec<(u64, SocketAddr)>, credentials: Credentials) -> MonClient {
        MonClient {
            monitors,
            credentials,
            leader_guess: None,
            next_monitor: 0,
            timeout: Duration::from_secs(15),
            keep_connection: false,
            kept: None,
        }
    }

    fn addr_of(&self, id: u64) -> std::io::Result<SocketAddr> {
        self.monitors
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, a)| *a)
            .ok_or_else(|| std::io::Error::other(format!("unknown monitor {id}")))
    }

    fn ask(&self, id: u64, message: &MonMessage) -> std::io::Result<MonMessage> {
        self.ask_within(id, message, CALL_TIMEOUT)
    }

    /// [`MonClient::ask`] on a connection of its own, waiting at most
    /// `budget` (and [`CALL_TIMEOUT`]) for each step.
    fn ask_within(&self, id: u64, message: &MonMessage, budget: Duration) -> std::io::Result<MonMessage> {
        let addr = self.addr_of(id)?;
        let mut conn = Connection::connect(addr, &self.credentials, step_timeout(budget))?;
        conn.call(message)
    }

    /// [`MonClient::ask`] on the kept connection to monitor `id`, if
    /// `keep_connection` (a new one when there is none, or the kept one
    /// is to another monitor or failed).
    fn ask_kept(&mut self, id: u64, message: &MonMessage, budget: Duration) -> std::io::Result<MonMessage> {
        if !self.keep_connection {
            return self.ask_within(id, message, budget);
        }
        if let Some((kept_id, mut conn)) = self.kept.take() {
            if kept_id == id {
                match conn.call(message) {
                    Ok(reply) => {
                        self.kept = Some((id, conn));
                        return Ok(reply);
                    }
                    // No answer in time: the caller moves on (another
                    // monitor, or its next beat), not a second wait here.
                    Err(err) if matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                        return Err(err)
                    }
                    // It broke (the monitor restarted, or closed it): a new one.
                    Err(_) => {}
                }
            }
        }
        let addr = self.addr_of(id)?;
        let mut conn = Connection::connect(addr, &self.credentials, step_timeout(budget))?;
        let reply = conn.call(message)?;
        // Kept: its later calls wait the usual time, not this call's rest.
        conn.set_read_timeout(Some(CALL_TIMEOUT))?;
        self.kept = Some((id, conn));
        Ok(reply)
    }

    /// Sends `message` to the leader, following leader hints and retrying
    /// other monitors on errors, until `timeout`; returns the leader's reply.
    fn call_leader(&mut self, message: &MonMessage) -> Result<MonMessage, ClientError> {
        if self.monitors.is_empty() {
            return Err(ClientError::Unavailable(Duration::ZERO, "no monitor addresses configured".into()));
        }
        let started = Instant::now();
        let mut last_error = String::from("none");
        while started.elapsed() < self.timeout {
            let id = self.leader_guess.unwrap_or(self.monitors[self.next_monitor % self.monitors.len()].0);
            // Whatever happens, a call without a guess tries the one after.
            // (`leader_guess` only holds monitors this client knows.)
            let after = self.monitors.iter().position(|(m, _)| *m == id).map_or(0, |i| i + 1);
            // A connect to a monitor that takes connections and never
            // answers waits this call's rest, not more: an OSD's heartbeat
            // has a second, and the connect's own timeout is two.
            let budget = self.timeout.saturating_sub(started.elapsed());
            match self.ask_kept(id, message, budget) {
                Ok(MonMessage::NotLeader { leader }) => {
                    let known = |l: &u64| self.monitors.iter().any(|(m, _)| m == l);
                    self.leader_guess = leader.filter(|l| *l != id && known(l));
                    self.next_monitor = after;
                    last_error = format!("monitor {id} is not the leader");
                }
                Ok(reply) => {
                    self.leader_guess = Some(id);
                    return Ok(reply);
                }
                Err(err) => {
                    self.leader_guess = None;
                    self.next_monitor = after;
                    last_error = format!("monitor {id}: {err}");
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ClientError::Unavailable(self.timeout, last_error))
    }

    /// Runs `command` on the leader; returns once it is committed and applied.
    pub fn command(&mut self, command: &Command) -> Result<WireOutcome, ClientError> {
        match self.call_leader(&MonMessage::Command(command.clone()))? {
            MonMessage::CommandReply(Ok(outcome)) => Ok(outcome),
            MonMessage::CommandReply(Err(err)) => Err(ClientError::Refused(err)),
            other => Err(ClientError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sends `osd`'s heartbeat to the leader; returns the lease it grants
    /// (zero: none).
    pub fn heartbeat(&mut self, osd: u32) -> Result<Duration, ClientError> {
        match self.call_leader(&MonMessage::Heartbeat { osd })? {
            MonMessage::HeartbeatReply { lease_ms } => Ok(Duration::from_millis(lease_ms)),
            other => Err(ClientError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sends a failure report (or another message answered `Ack`) to the leader.
    pub fn notify(&mut self, message: &MonMessage) -> Result<(), ClientError> {
        match self.call_leader(message)? {
            MonMessage::Ack => Ok(()),
            other => Err(ClientError::Refused(format!("unexpected reply {other:?}"))),
        }
    }

    /// (leader hint, is leader, epoch) of one monitor.
    pub fn status(&self, id: u64) -> std::io::Result<(Option<u64>, bool, u64)> {
        match self.ask(id, &MonMessage::Status)? {
            MonMessage::StatusReply { leader, is_leader, epoch, .. } => Ok((leader, is_leader, epoch)),
            other => Err(std::io::Error::other(format!("unexpected reply {other:?}"))),
        }
    }

    /// Follows the map from monitor `id`: a [`Subscription`] that yields the
    /// map's changes as they happen.
    pub fn subscribe(&self, id: u64, from: ClusterMap) -> std::io::Result<Subscription> {
        let addr = self.addr_of(id)?;
        let mut conn = Connection::connect(addr, &self.credentials, CALL_TIMEOUT)?;
        conn.send(&crate::wire::to_frame(&MonMessage::Subscribe { from_epoch: from.epoch }))?;
        Ok(Subscription { conn, map: from })
    }

    /// Follows the map from `from` until `stop` (checked every `poll`):
    /// subscribes to the monitors in turn, moving to the next when a
    /// subscription cannot start or ends, and resumes from the newest map
    /// seen. Calls `on_map` with each new map; `false` from it stops.
    pub fn follow(
        &self,
        from: ClusterMap,
        stop: &AtomicBool,
        poll: Duration,
        mut on_map: impl FnMut(&ClusterMap) -> bool,
    ) {
        let mut latest = from;
        let mut turn = 0usize;
        while !stop.load(Ordering::Relaxed) && !self.monitors.is_empty() {
            let (id, _) = self.monitors[turn % self.monitors.len()];
            turn += 1;
            let mut subscription = match self.subscribe(id, latest.clone()) {
                Ok(s) => s,
                Err(err) => {
                    tracing::debug!(monitor = id, %err, "cannot subscribe; trying the next monitor");
                    std::thread::sleep(Duration::from_millis(200));
                    continue;
                }
            };
            while !stop.load(Ordering::Relaxed) {
                match subscription.next(poll) {
                    Ok(_) => {
                        latest = subscription.map().clone();
                        if !on_map(&latest) {
                            return;
                        }
                    }
                    Err(err) if matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    }
                    Err(err) => {
                        tracing::debug!(monitor = id, %err, "subscription ended; subscribing again");
                        break;
                    }
                }
            }
        }
    }

    /// One monitor's copy of the map.
    pub fn map(&self, id: u64) -> std::io::Result<ClusterMap> {
        match self.ask(id, &MonMessage::GetMap)? {
            MonMessage::Map(bytes) => duplex_map::codec::decode_map(&bytes).map_err(std::io::Error::other),
            other => Err(std::io::Error::other(format!("unexpected reply {other:?}"))),
        }
    }
}

/// A followed map, kept current from pushed deltas.
pub struct Subscription {
    conn: Connection,
    map: ClusterMap,
}

impl Subscription {
    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    /// Waits for the next push (up to `timeout`) and applies it; returns the new epoch.
    pub fn next(&mut self, timeout: Duration) -> std::io::Result<u64> {
        self.conn.set_read_timeout(Some(timeout))?;
        match crate::wire::from_frame(&self.conn.recv()?)? {
            MonMessage::Map(bytes) => {
                self.map = duplex_map::codec::decode_map(&bytes).map_err(std::io::Error::other)?
            }
            MonMessage::Deltas(deltas) => {
                // Apply to a copy and check it, as a decoded whole map is
                // checked: a bad delta must not leave us a map that panics placement.
                let mut map = self.map.clone();
                for bytes in deltas {
                    let delta = duplex_map::codec::decode_delta(&bytes).map_err(std::io::Error::other)?;
                    map.apply(&delta).map_err(std::io::Error::other)?;
                }
                map.validate().map_err(std::io::Error::other)?;
                self.map = map;
            }
            other => return Err(std::io::Error::other(format!("unexpected push {other:?}"))),
        }
        Ok(self.map.epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn credentials() -> Credentials {
        Credentials { fsid: [7; 16], secret: b"secret".to_vec(), name: "test".into() }
    }

    /// A monitor that answers every heartbeat on each connection it accepts, until dropped.
    fn answering_monitor() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = listener.local_addr().expect("addr");
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(stream) = stream else { return };
                std::thread::spawn(move || {
                    let Ok(mut conn) = Connection::accept(stream, &credentials(), Duration::from_secs(5)) else {
                        return;
                    };
                    while let Ok(frame) = conn.recv() {
                        let reply = MonMessage::HeartbeatReply { lease_ms: 1234 };
                        if crate::wire::from_frame(&frame).is_err()
                            || conn.send(&crate::wire::to_frame(&reply)).is_err()
                        {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    /// The first monitor is a black hole (it takes connections and never
    /// answers the handshake), and one call's budget is shorter than the
    /// wait on it: the next call starts at the second monitor, instead of
    /// spending its whole budget on the first again, for good.
    #[test]
    fn a_call_starts_past_the_monitor_that_failed_the_last_one() {
        let black_hole = TcpListener::bind("127.0.0.1:0").expect("bind");
        let monitors = vec![(0, black_hole.local_addr().expect("addr")), (1, answering_monitor())];
        let mut client = MonClient::new(monitors, credentials());
        client.keep_connection = true;
        client.timeout = Duration::from_millis(500);
        let began = Instant::now();
        assert!(client.heartbeat(3).is_err(), "the black hole took the first call's budget");
        // Its budget, not the connect's own 2 s.
        assert!(began.elapsed() < Duration::from_millis(1200), "the first call took {:?}", began.elapsed());
        assert_eq!(client.heartbeat(3).expect("the second monitor answers"), Duration::from_millis(1234));
        assert_eq!(client.heartbeat(3).expect("and keeps answering"), Duration::from_millis(1234));
        drop(black_hole);
    }
}
