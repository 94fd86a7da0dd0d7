//! The monitor daemon: drives a [`MonCore`] with a data directory, a
//! listener and one sender thread per peer.
//!
//! Threads: the core thread owns the core and the data directory, and is
//! the only one that touches them. The listener spawns a thread per accepted
//! connection, which authenticates it and forwards its requests to the core
//! thread. Each peer's sender thread keeps one outgoing connection and
//! re-establishes it after errors; raft tolerates the messages lost
//! meanwhile. Everything is persisted (and fsynced) before the messages that
//! depend on it are handed to the senders.

use std::collections::{BTreeMap, HashMap};
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, SyncSender, TryRecvError, TrySendError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use protobuf::Message as _;
use raft::eraftpb::Message;

use duplex_map::{Command, FailureConfig, FailureDetector};

use crate::core::{MonCore, ProposeError};
use crate::datadir::DataDir;
use duplex_mon_client::{from_frame, to_frame, Connection, Credentials, MonMessage};

pub const TICK: Duration = Duration::from_millis(100);
/// Most inputs taken into one log write: bounds how long a burst of
/// requests holds the Raft messages and replies queued behind it.
const MAX_INPUTS_PER_WRITE: usize = 256;
/// Requests and raft messages waiting for the core thread.
const INPUT_QUEUE: usize = 4096;
/// Raft messages waiting for one peer's connection.
const PEER_QUEUE: usize = 4096;
/// Pushes waiting for one subscriber's connection.
const SUBSCRIBER_QUEUE: usize = 1024;
/// After a failed connection to a peer, messages are dropped this long before trying again.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(200);
const IO_TIMEOUT: Duration = Duration::from_secs(2);

pub struct MonConfig {
    pub id: u64,
    pub peers: BTreeMap<u64, SocketAddr>,
    pub data_dir: PathBuf,
    pub credentials: Credentials,
    pub failure: FailureConfig,
}

enum Input {
    Raft(Message),
    Request(MonMessage, Sender<MonMessage>),
    /// A subscriber from an epoch, and where to push its messages.
    Subscribe(u64, SyncSender<MonMessage>),
    /// The connection an OSD sent its heartbeats on ended (closed or
    /// reset): probe its address.
    HeartbeatsEnded(duplex_map::OsdId),
    /// A probe found this incarnation's address refusing connections.
    Gone {
        osd: duplex_map::OsdId,
        incarnation: u64,
    },
}

/// How long a kept heartbeat connection may send nothing before it is closed.
const IDLE_LIMIT: Duration = Duration::from_secs(30);
/// How long a probe of a silent OSD's address waits for the connection.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// Runs the monitor until the process ends.
pub fn run(config: MonConfig) -> Result<()> {
    let own = *config.peers.get(&config.id).context("--id must be one of the --peer entries")?;
    let (mut data_dir, entries, hard_state) = DataDir::open(&config.data_dir)?;
    let peer_ids: Vec<u64> = config.peers.keys().copied().collect();
    let mut core = MonCore::new(config.id, rand::random(), &peer_ids, config.credentials.fsid, &entries, hard_state)
        .context("starting raft")?;
    tracing::info!(id = config.id, entries = entries.len(), "monitor starting");
    let listener = TcpListener::bind(own).with_context(|| format!("listening on {own}"))?;
    // Bounded: connection threads block (back-pressure) when the core is behind.
    let (inputs, input_rx) = mpsc::sync_channel::<Input>(INPUT_QUEUE);
    {
        let inputs = inputs.clone();
        let credentials = config.credentials.clone();
        std::thread::spawn(move || accept_loop(listener, inputs, credentials));
    }
    let senders: HashMap<u64, SyncSender<Message>> = config
        .peers
        .iter()
        .filter(|(id, _)| **id != config.id)
        .map(|(id, addr)| {
            let (tx, rx) = mpsc::sync_channel(PEER_QUEUE);
            let (addr, credentials) = (*addr, config.credentials.clone());
            std::thread::spawn(move || peer_sender(addr, credentials, rx));
            (*id, tx)
        })
        .collect();
    core_loop(&mut core, &mut data_dir, (inputs, input_rx), &senders, config.failure)
}

/// Failure detection on the leader: a fresh detector per leadership (every
/// OSD gets a full grace), and each proposal at most once per second.
struct Detection {
    config: FailureConfig,
    detector: Option<FailureDetector>,
    started: Instant,
    recently_proposed: HashMap<Command, Instant>,
    balancing: crate::balancing::Balancing,
}

impl Detection {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    fn detector(&mut self, is_leader: bool) -> Option<&mut FailureDetector> {
        if !is_leader {
            self.detector = None;
            return None;
        }
        let config = self.config;
        Some(self.detector.get_or_insert_with(|| FailureDetector::new(config)))
    }

    fn proposals(&mut self, core: &MonCore) -> Vec<Command> {
        let now = self.now_ms();
        let Some(detector) = self.detector(core.is_leader()) else { return Vec::new() };
        let mut commands = detector.tick(core.map(), now);
        let fresh = Instant::now();
        commands.extend(self.balancing.proposal(core.map(), core.is_leader()));
        self.recently_proposed.retain(|_, at| fresh.duration_since(*at) < Duration::from_secs(1));
        commands.into_iter().filter(|command| self.recently_proposed.insert(command.clone(), fresh).is_none()).collect()
    }
}

fn core_loop(
    core: &mut MonCore,
    data_dir: &mut DataDir,
    (probes, inputs): (SyncSender<Input>, Receiver<Input>),
    senders: &HashMap<u64, SyncSender<Message>>,
    failure: FailureConfig,
) -> Result<()> {
    let mut pending: HashMap<u64, Sender<MonMessage>> = HashMap::new();
    let mut subscribers: Vec<SyncSender<MonMessage>> = Vec::new();
    let mut detection = Detection {
        config: failure,
        detector: None,
        started: Instant::now(),
        recently_proposed: HashMap::new(),
        balancing: Default::default(),
    };
    let mut next_tick = Instant::now() + TICK;
    loop {
        // Group commit: every input already queued is taken before the log
        // is written, so that proposals arriving together (a failover's
        // peering records, from every OSD at once) share one append and
        // one fsync instead of queueing behind each other's.
        let mut received = Some(inputs.recv_timeout(next_tick.saturating_duration_since(Instant::now())));
        let mut taken = 0;
        let mut detect_now = false;
        while let Some(input) = received.take() {
            taken += 1;
            if taken < MAX_INPUTS_PER_WRITE {
                received = match inputs.try_recv() {
                    Ok(next) => Some(Ok(next)),
                    Err(TryRecvError::Empty) => None,
                    Err(TryRecvError::Disconnected) => Some(Err(RecvTimeoutError::Disconnected)),
                };
            }
            match input {
                Ok(Input::Raft(message)) => {
                    if let Err(err) = core.step(message) {
                        tracing::debug!(error = %err, "raft message refused");
                    }
                }
                Ok(Input::Request(request, reply_to)) => match request {
                    MonMessage::Command(command) => match core.propose(command) {
                        Ok(request) => {
                            pending.insert(request, reply_to);
                        }
                        Err(ProposeError::NotLeader(leader)) => {
                            let _ = reply_to.send(MonMessage::NotLeader { leader });
                        }
                        Err(err) => {
                            let _ = reply_to.send(MonMessage::CommandReply(Err(err.to_string())));
                        }
                    },
                    MonMessage::GetMap => {
                        let _ = reply_to.send(MonMessage::Map(duplex_map::codec::encode_map(core.map())));
                    }
                    MonMessage::Heartbeat { osd } => {
                        let now = detection.now_ms();
                        let reply = match detection.detector(core.is_leader()) {
                            Some(detector) => {
                                MonMessage::HeartbeatReply { lease_ms: detector.heartbeat(osd, now, core.map()) }
                            }
                            None => MonMessage::NotLeader { leader: core.leader() },
                        };
                        let _ = reply_to.send(reply);
                    }
                    MonMessage::FailureReport { target, reporter } => {
                        let now = detection.now_ms();
                        let reply = match detection.detector(core.is_leader()) {
                            Some(detector) => {
                                detector.report_failure(target, reporter, now);
                                MonMessage::Ack
                            }
                            None => MonMessage::NotLeader { leader: core.leader() },
                        };
                        let _ = reply_to.send(reply);
                    }
                    MonMessage::PeerRefused { target, incarnation, reporter } => {
                        let reply = match detection.detector(core.is_leader()) {
                            Some(detector) => {
                                tracing::info!(
                                    target,
                                    incarnation,
                                    reporter,
                                    "a peer found the OSD's address refusing connections"
                                );
                                detector.report_refused(target, incarnation, reporter);
                                detect_now = true;
                                MonMessage::Ack
                            }
                            None => MonMessage::NotLeader { leader: core.leader() },
                        };
                        let _ = reply_to.send(reply);
                    }
                    MonMessage::UsageReport { osd, capacity_bytes, used_permille, pgs } => {
                        let reply = if core.is_leader() {
                            let pgs = pgs.into_iter().map(|(pool, pg, bytes)| ((pool, pg), bytes)).collect();
                            let usage = duplex_map::balancer::OsdUsage { capacity_bytes, used_permille, pgs };
                            detection.balancing.report(core.map(), osd, usage);
                            MonMessage::Ack
                        } else {
                            MonMessage::NotLeader { leader: core.leader() }
                        };
                        let _ = reply_to.send(reply);
                    }
                    MonMessage::Status => {
                        let _ = reply_to.send(MonMessage::StatusReply {
                            id: core.id(),
                            leader: core.leader(),
                            is_leader: core.is_leader(),
                            epoch: core.map().epoch,
                        });
                    }
                    other => tracing::debug!(?other, "unexpected request"),
                },
                Ok(Input::Subscribe(from_epoch, push)) => {
                    let catch_up = match core.deltas_since(from_epoch) {
                        Some(deltas) => {
                            MonMessage::Deltas(deltas.iter().map(duplex_map::codec::encode_delta).collect())
                        }
                        None => MonMessage::Map(duplex_map::codec::encode_map(core.map())),
                    };
                    if push.try_send(catch_up).is_ok() {
                        subscribers.push(push);
                    }
                }
                Ok(Input::HeartbeatsEnded(osd)) => {
                    // Only the leader detects failures; a process that
                    // died has closed its sockets, so its port refuses
                    // (Ceph's osd_fast_fail_on_connection_refused, from
                    // the monitor's side: an OSD with no peers is found
                    // too). A hang or a cut resets nothing and is left to
                    // the grace.
                    let target = core.map().osds.get(&osd).filter(|o| o.up).map(|o| (o.addr.clone(), o.state_epoch));
                    if let (true, Some((addr, incarnation))) = (core.is_leader(), target) {
                        let probes = probes.clone();
                        std::thread::spawn(move || {
                            if refuses_connections(&addr) {
                                let _ = probes.send(Input::Gone { osd, incarnation });
                            }
                        });
                    }
                }
                Ok(Input::Gone { osd, incarnation }) => {
                    if let Some(detector) = detection.detector(core.is_leader()) {
                        tracing::info!(
                            osd,
                            incarnation,
                            "the OSD's heartbeat connection ended and its address refuses connections"
                        );
                        detector.report_gone(osd, incarnation);
                        detect_now = true;
                    }
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => anyhow::bail!("input channel closed"),
            }
        }
        let tick_due = Instant::now() >= next_tick;
        if tick_due {
            core.tick();
            next_tick += TICK;
        }
        // A gone OSD is marked down now, not at the next tick.
        if tick_due || detect_now {
            for command in detection.proposals(core) {
                tracing::info!(?command, "the leader proposes");
                let _ = core.propose(command);
            }
        }
        loop {
            let out = core.drive();
            if out.is_empty() {
                break;
            }
            data_dir.append(&out.entries)?;
            if let Some(hs) = &out.hard_state {
                data_dir.save_hard_state(hs)?;
            }
            for message in out.messages {
                if let Some(sender) = senders.get(&message.to) {
                    // A full queue means the peer is unreachable or slow: raft resends.
                    if let Err(TrySendError::Full(_)) = sender.try_send(message) {
                        tracing::debug!("peer queue full; raft message dropped");
                    }
                }
            }
            if !out.deltas.is_empty() {
                let encoded: Vec<Vec<u8>> = out.deltas.iter().map(duplex_map::codec::encode_delta).collect();
                // A subscriber too far behind is dropped; it reconnects and catches up.
                subscribers.retain(|push| push.try_send(MonMessage::Deltas(encoded.clone())).is_ok());
            }
            for (request, outcome) in out.completed {
                if let Some(reply) = pending.remove(&request) {
                    let _ = reply.send(MonMessage::CommandReply(Ok(outcome.into())));
                }
            }
        }
        // A node that lost leadership will not complete its proposals: clients retry.
        if !core.is_leader() && !pending.is_empty() {
            for (_, reply) in pending.drain() {
                let _ = reply.send(MonMessage::NotLeader { leader: core.leader() });
            }
        }
    }
}

/// Most connections served at once (each has a thread, with a small
/// stack in use). Each OSD holds two for its life (its map subscription
/// and its heartbeat thread's), so this bounds a monitor at about 500 OSDs
/// beside its clients: a larger cluster needs the connections served by
/// an event loop instead. Half-open heartbeat ones go after [`IDLE_LIMIT`].
const MAX_CONNECTIONS: usize = 1024;

/// Releases a connection slot when its thread ends, however it ends.
struct ConnectionSlot(Arc<AtomicUsize>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Whether `addr` refuses a TCP connection now (a timeout or an address
/// that does not parse says nothing: no).
fn refuses_connections(addr: &str) -> bool {
    let Ok(addr) = addr.parse::<SocketAddr>() else { return false };
    matches!(
        std::net::TcpStream::connect_timeout(&addr, PROBE_TIMEOUT),
        Err(err) if err.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

fn accept_loop(listener: TcpListener, inputs: SyncSender<Input>, credentials: Credentials) {
    let open = Arc::new(AtomicUsize::new(0));
    // A flood of connections is told once a second, with a count, not per connection.
    let (mut warned_at, mut refused_since): (Option<Instant>, u64) = (None, 0);
    for stream in listener.incoming().flatten() {
        // Threads are spawned before peers authenticate: bound them.
        if open.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
            refused_since += 1;
            if warned_at.is_none_or(|at| at.elapsed() >= Duration::from_secs(1)) {
                tracing::warn!(refused = refused_since, "connection limit reached; refusing connections");
                (warned_at, refused_since) = (Some(Instant::now()), 0);
            }
            drop(stream);
            continue;
        }
        open.fetch_add(1, Ordering::Relaxed);
        let guard = ConnectionSlot(open.clone());
        let (inputs, credentials) = (inputs.clone(), credentials.clone());
        std::thread::spawn(move || {
            let _slot = guard;
            let Ok(conn) = Connection::accept(stream, &credentials, IO_TIMEOUT) else { return };
            // The OSD whose heartbeats this connection carried: now that it
            // ended, the core probes that OSD. Only a connection kept for
            // them (an OSD's heartbeat thread keeps one for the process's
            // life): one that carried a single heartbeat was a one-off
            // call, whose close says nothing.
            let mut heartbeats = (None, 0);
            serve_connection(conn, &inputs, &mut heartbeats);
            if let (Some(osd), 2..) = heartbeats {
                let _ = inputs.send(Input::HeartbeatsEnded(osd));
            }
        });
    }
}

/// Serves one authenticated connection until it ends, noting the OSD
/// whose heartbeats it carries and how many.
fn serve_connection(
    mut conn: Connection,
    inputs: &SyncSender<Input>,
    heartbeats: &mut (Option<duplex_map::OsdId>, u32),
) {
    while let Ok(frame) = conn.recv() {
        let Ok(message) = from_frame(&frame) else { return };
        match message {
            MonMessage::Raft(bytes) => {
                let Ok(message) = Message::parse_from_bytes(&bytes) else { return };
                if inputs.send(Input::Raft(message)).is_err() {
                    return;
                }
            }
            MonMessage::Subscribe { from_epoch } => {
                let (push, pushed) = mpsc::sync_channel(SUBSCRIBER_QUEUE);
                if inputs.send(Input::Subscribe(from_epoch, push)).is_err() {
                    return;
                }
                // From here on this connection only carries pushes.
                while let Ok(message) = pushed.recv() {
                    if conn.send(&to_frame(&message)).is_err() {
                        return;
                    }
                }
                return;
            }
            request => {
                if let MonMessage::Heartbeat { osd } = request {
                    *heartbeats = (Some(osd), heartbeats.1.saturating_add(1));
                    // A kept heartbeat connection hears from its OSD every
                    // second; silent this long, it is half open (its host
                    // lost power or was cut off, and no reset came): its
                    // thread and slot go.
                    if heartbeats.1 == 2 && conn.set_read_timeout(Some(IDLE_LIMIT)).is_err() {
                        return;
                    }
                }
                let (tx, rx) = mpsc::channel();
                if inputs.send(Input::Request(request, tx)).is_err() {
                    return;
                }
                let reply = rx.recv_timeout(Duration::from_secs(10)).unwrap_or(MonMessage::NotLeader { leader: None });
                if conn.send(&to_frame(&reply)).is_err() {
                    return;
                }
            }
        }
    }
}

fn peer_sender(addr: SocketAddr, credentials: Credentials, messages: Receiver<Message>) {
    let mut conn: Option<Connection> = None;
    let mut retry_at = Instant::now();
    while let Ok(message) = messages.recv() {
        if conn.is_none() {
            // While the peer is unreachable, drop messages rather than queue
            // them behind connection attempts: raft resends what matters.
            if Instant::now() < retry_at {
                continue;
            }
            conn = Connection::connect(addr, &credentials, IO_TIMEOUT).ok();
            if conn.is_none() {
                retry_at = Instant::now() + RECONNECT_BACKOFF;
                continue;
            }
        }
        let Some(c) = conn.as_mut() else { continue };
        let frame = to_frame(&MonMessage::Raft(message.write_to_bytes().expect("encoding a raft message")));
        if c.send(&frame).is_err() {
            conn = None;
            retry_at = Instant::now() + RECONNECT_BACKOFF;
        }
    }
}
