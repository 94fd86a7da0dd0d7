//! The client's I/O thread: one mio event loop that owns a connection per
//! OSD, every operation in flight, and the retry timers.
//!
//! An operation goes to its PG's primary under the current map. It is
//! sent again, with the same request id (client id, transaction id), when
//! the primary answers "not me" or "retry", when its connection breaks, or
//! when a new map names another primary; the OSD answers a mutation it has
//! already applied without applying it twice. It ends with the OSD's
//! answer, or with [`ClientError::TimedOut`] at its deadline.
//!
//! Callbacks run on this thread: they must be short and must never wait
//! for another client operation (that would wait for this very thread).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::io::ErrorKind;
use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use crossbeam_channel::Receiver;
use duplex_map::{ClusterMap, OsdId};
use duplex_mon_client::Credentials;
use duplex_mon_client::MonClient;
use duplex_placement::Hierarchy;
use duplex_proto::osd::{OpKind, OpReply, OpRequest};
use duplex_proto::{FrameDecoder, MessageType};
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::error::ClientError;
use crate::placement::{self, Deadline, Next, RetryPolicy, Target};
use duplex_mon_client::Connection as OsdConnection;

pub(crate) const WAKER: Token = Token(0);
/// Deadlines are checked this often (an operation may overrun its timeout by this much).
const DEADLINE_TICK: Duration = Duration::from_millis(50);
/// The pauses between two attempts of one operation.
const RETRY: RetryPolicy = RetryPolicy::PIPELINED;
/// How long a failed connect keeps an OSD from being tried again.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);
/// Replies over this size are refused (a read's 4 MiB plus headers).
const MAX_REPLY: u32 = duplex_proto::osd::MAX_IO_BYTES + (64 << 10);

pub type Callback = Box<dyn FnOnce(Result<Bytes, ClientError>) + Send + 'static>;

/// One object operation, as the caller describes it.
#[derive(Clone, Debug)]
pub struct ObjectOp {
    pub pool: u32,
    pub kind: OpKind,
    pub object: Bytes,
    pub offset: u64,
    /// Bytes to read (reads only).
    pub length: u32,
    pub data: Bytes,
    /// The PG, for listings (whose object field is a cursor); else computed.
    pub pg: Option<u32>,
    /// Mutations: the image's newest live snapshot (copy-on-write below
    /// it); reads: the snapshot to read at. 0: none, the head.
    pub snap: u64,
}

impl ObjectOp {
    /// An operation on `object` with no offset, length or data yet (set
    /// them with struct update syntax).
    pub fn new(pool: u32, kind: OpKind, object: Bytes) -> ObjectOp {
        ObjectOp { pool, kind, object, offset: 0, length: 0, data: Bytes::new(), pg: None, snap: 0 }
    }

    /// Where this operation goes under `map`: its PG's primary.
    fn target(&self, map: &ClusterMap, hierarchy: &Hierarchy) -> Result<Target, ClientError> {
        match self.pg {
            Some(pg) => placement::locate_pg(map, hierarchy, self.pool, pg),
            None => placement::locate(map, hierarchy, self.pool, &self.object),
        }
    }
}

pub(crate) enum Command {
    Submit(ObjectOp, Callback),
    Map(Arc<ClusterMap>),
    Shutdown,
}

struct InFlight {
    op: ObjectOp,
    done: Callback,
    deadline: Deadline,
    /// The OSD it was last sent to (and has not answered yet).
    sent_to: Option<OsdId>,
    attempts: u32,
    last_problem: String,
    /// Parked until the map reaches this epoch.
    wait_epoch: u64,
}

struct OsdLink {
    stream: TcpStream,
    token: Token,
    inbuf: BytesMut,
    out: VecDeque<Bytes>,
    /// Transaction ids sent on this connection and not answered yet.
    sent: HashSet<u64>,
}

pub(crate) struct Runtime {
    poll: Poll,
    commands: Receiver<Command>,
    map: Arc<ClusterMap>,
    hierarchy: Hierarchy,
    credentials: Credentials,
    client_id: u64,
    op_timeout: Duration,
    connect_timeout: Duration,
    links: HashMap<OsdId, OsdLink>,
    tokens: HashMap<Token, OsdId>,
    next_token: usize,
    unreachable_until: HashMap<OsdId, Instant>,
    in_flight: HashMap<u64, InFlight>,
    timers: BinaryHeap<Reverse<(Instant, u64)>>,
    /// Operations waiting for a newer map (`InFlight::wait_epoch`).
    parked: HashSet<u64>,
    next_txid: u64,
    decoder: FrameDecoder,
    dirty_links: Vec<OsdId>,
}

pub(crate) struct RuntimeConfig {
    pub map: Arc<ClusterMap>,
    pub credentials: Credentials,
    pub client_id: u64,
    pub op_timeout: Duration,
    pub connect_timeout: Duration,
}

impl Runtime {
    pub fn new(poll: Poll, commands: Receiver<Command>, config: RuntimeConfig) -> Runtime {
        let hierarchy = config.map.hierarchy();
        Runtime {
            poll,
            commands,
            hierarchy,
            map: config.map,
            credentials: config.credentials,
            client_id: config.client_id,
            op_timeout: config.op_timeout,
            connect_timeout: config.connect_timeout,
            links: HashMap::new(),
            tokens: HashMap::new(),
            next_token: 1,
            unreachable_until: HashMap::new(),
            in_flight: HashMap::new(),
            timers: BinaryHeap::new(),
            parked: HashSet::new(),
            next_txid: 1,
            decoder: FrameDecoder::with_max_payload(MAX_REPLY),
            dirty_links: Vec::new(),
        }
    }

    pub fn run(mut self) {
        let mut events = Events::with_capacity(256);
        let mut next_tick = Instant::now() + DEADLINE_TICK;
        loop {
            let now = Instant::now();
            let mut wake_at = next_tick;
            if let Some(Reverse((at, _))) = self.timers.peek() {
                wake_at = wake_at.min(*at);
            }
            let timeout = if self.in_flight.is_empty() { None } else { Some(wake_at.saturating_duration_since(now)) };
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() != ErrorKind::Interrupted {
                    tracing::error!(%err, "client poll failed; failing every operation");
                    self.shutdown();
                    return;
                }
            }
            for event in events.iter() {
                if event.token() == WAKER {
                    continue;
                }
                if let Some(osd) = self.tokens.get(&event.token()).copied() {
                    if event.is_readable() || event.is_read_closed() || event.is_error() {
                        self.on_readable(osd);
                    }
                    if event.is_writable() {
                        self.dirty_links.push(osd);
                    }
                }
            }
            loop {
                match self.commands.try_recv() {
                    Ok(Command::Submit(op, done)) => self.submit(op, done),
                    Ok(Command::Map(map)) => self.on_map(map),
                    Ok(Command::Shutdown) | Err(crossbeam_channel::TryRecvError::Disconnected) => {
                        self.shutdown();
                        return;
                    }
                    Err(crossbeam_channel::TryRecvError::Empty) => break,
                }
            }
            let now = Instant::now();
            while let Some(Reverse((at, txid))) = self.timers.peek().copied() {
                if at > now {
                    break;
                }
                self.timers.pop();
                // A parked op's timer ends its parking: it tries again now.
                self.parked.remove(&txid);
                self.dispatch(txid);
            }
            if now >= next_tick {
                self.expire(now);
                next_tick = now + DEADLINE_TICK;
            }
            self.flush_links();
        }
    }

    fn submit(&mut self, op: ObjectOp, done: Callback) {
        let txid = self.next_txid;
        self.next_txid += 1;
        let deadline = Deadline::after(self.op_timeout);
        self.in_flight.insert(
            txid,
            InFlight { op, done, deadline, sent_to: None, attempts: 0, last_problem: String::new(), wait_epoch: 0 },
        );
        self.dispatch(txid);
    }

    /// Sends (or sends again) operation `txid` to its PG's primary.
    fn dispatch(&mut self, txid: u64) {
        let Some(entry) = self.in_flight.get(&txid) else { return };
        if entry.sent_to.is_some() {
            return; // already out (a timer fired after a resend)
        }
        let op = &entry.op;
        let target = match op.target(&self.map, &self.hierarchy) {
            Ok(target) => target,
            Err(err) => return self.finish(txid, Err(err)),
        };
        let primary = match target.primary_or_wait() {
            Ok(primary) => primary,
            Err(next) => return self.then(txid, next),
        };
        let request = OpRequest {
            snap: op.snap,
            ..target.request(op.kind, op.object.clone(), op.offset, op.length, op.data.clone(), self.client_id)
        };
        if let Err(problem) = self.link(primary) {
            return self.retry_later(txid, placement::at_osd(primary, problem));
        }
        let frame = request.to_frame(txid);
        let link = self.links.get_mut(&primary).expect("linked above");
        link.out.push_back(Bytes::copy_from_slice(&frame.encode_header()));
        link.out.push_back(frame.payload);
        link.sent.insert(txid);
        self.dirty_links.push(primary);
        let entry = self.in_flight.get_mut(&txid).expect("checked above");
        entry.sent_to = Some(primary);
        entry.attempts += 1;
    }

    /// Connects to `osd` if not connected (a blocking handshake, bounded by
    /// the connect timeout; a refused connect is remembered briefly).
    fn link(&mut self, osd: OsdId) -> Result<(), String> {
        if self.links.contains_key(&osd) {
            return Ok(());
        }
        if self.unreachable_until.get(&osd).is_some_and(|until| Instant::now() < *until) {
            return Err("recently unreachable".into());
        }
        let addr: SocketAddr = self
            .map
            .osds
            .get(&osd)
            .and_then(|o| o.addr.parse().ok())
            .ok_or_else(|| "no address in the map".to_string())?;
        let connected = OsdConnection::connect(addr, &self.credentials, self.connect_timeout).and_then(|conn| {
            let (stream, inbuf) = conn.into_parts();
            stream.set_nonblocking(true)?;
            stream.set_nodelay(true)?;
            Ok((stream, inbuf))
        });
        let (stream, inbuf) = match connected {
            Ok(parts) => parts,
            Err(err) => {
                self.unreachable_until.insert(osd, Instant::now() + RECONNECT_BACKOFF);
                return Err(format!("cannot connect to {addr}: {err}"));
            }
        };
        let mut stream = TcpStream::from_std(stream);
        let token = Token(self.next_token);
        self.next_token += 1;
        self.poll
            .registry()
            .register(&mut stream, token, Interest::READABLE | Interest::WRITABLE)
            .map_err(|e| format!("registering the connection: {e}"))?;
        self.tokens.insert(token, osd);
        self.links.insert(osd, OsdLink { stream, token, inbuf, out: VecDeque::new(), sent: HashSet::new() });
        // Bytes that came with the handshake may already hold replies (never
        // in practice: nothing was sent yet), so there is nothing to decode.
        Ok(())
    }

    fn on_readable(&mut self, osd: OsdId) {
        let mut replies = Vec::new();
        let broken = {
            let Some(link) = self.links.get_mut(&osd) else { return };
            let mut broken = None;
            loop {
                match duplex_proto::readbuf::read_into(&link.stream, &mut link.inbuf, 64 << 10) {
                    Ok(0) => {
                        broken = Some("the OSD closed the connection".to_string());
                        break;
                    }
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => {
                        broken = Some(e.to_string());
                        break;
                    }
                }
            }
            loop {
                match self.decoder.decode(&mut link.inbuf) {
                    Ok(Some(frame)) => {
                        if frame.header.message_type != MessageType::OsdOpReply as u8 {
                            broken = Some(format!("unexpected message type {}", frame.header.message_type));
                            break;
                        }
                        match OpReply::decode(&frame.payload) {
                            Ok(reply) => {
                                link.sent.remove(&frame.header.transaction_id);
                                replies.push((frame.header.transaction_id, reply));
                            }
                            Err(err) => {
                                broken = Some(format!("malformed reply: {err}"));
                                break;
                            }
                        }
                    }
                    Ok(None) => break,
                    Err(err) => {
                        broken = Some(format!("malformed frame: {err}"));
                        break;
                    }
                }
            }
            broken
        };
        for (txid, reply) in replies {
            self.on_reply(osd, txid, reply);
        }
        if let Some(why) = broken {
            self.drop_link(osd, &why);
        }
    }

    fn on_reply(&mut self, osd: OsdId, txid: u64, reply: OpReply) {
        let Some(entry) = self.in_flight.get_mut(&txid) else { return };
        if entry.sent_to != Some(osd) {
            return; // an answer from an OSD it was since taken away from
        }
        entry.sent_to = None;
        let next = placement::judge(osd, reply, self.map.epoch);
        self.then(txid, next);
    }

    /// Ends operation `txid`, or schedules its next attempt.
    fn then(&mut self, txid: u64, next: Next) {
        match next {
            Next::Done(result) => self.finish(txid, result),
            Next::Retry(problem) => self.retry_later(txid, problem),
            Next::AwaitMap { epoch, problem } => self.park(txid, problem, epoch),
        }
    }

    fn retry_later(&mut self, txid: u64, problem: String) {
        let Some(entry) = self.in_flight.get_mut(&txid) else { return };
        entry.last_problem = problem;
        let backoff = RETRY.backoff(entry.attempts);
        self.timers.push(Reverse((Instant::now() + backoff, txid)));
    }

    /// Holds an operation until the map reaches `epoch` (with a timer too,
    /// in case the push is slow or the OSD was wrong about its map).
    fn park(&mut self, txid: u64, problem: String, epoch: u64) {
        let Some(entry) = self.in_flight.get_mut(&txid) else { return };
        entry.last_problem = problem;
        entry.wait_epoch = epoch;
        // One timer per parking: a re-park from that timer pushes the next.
        if self.parked.insert(txid) {
            self.timers.push(Reverse((Instant::now() + RETRY.max_backoff, txid)));
        }
    }

    fn on_map(&mut self, map: Arc<ClusterMap>) {
        if map.epoch <= self.map.epoch {
            return;
        }
        tracing::debug!(epoch = map.epoch, "client has a new map");
        self.hierarchy = map.hierarchy();
        self.map = map;
        // Operations whose primary changed go to the new one, same request id.
        let mut moved = Vec::new();
        for (txid, entry) in &self.in_flight {
            let Some(sent_to) = entry.sent_to else { continue };
            let primary = entry.op.target(&self.map, &self.hierarchy).ok().and_then(|target| target.primary);
            if primary != Some(sent_to) {
                moved.push((*txid, sent_to));
            }
        }
        for (txid, from) in moved {
            if let Some(link) = self.links.get_mut(&from) {
                link.sent.remove(&txid);
            }
            if let Some(entry) = self.in_flight.get_mut(&txid) {
                entry.sent_to = None;
            }
            self.dispatch(txid);
        }
        let epoch = self.map.epoch;
        let ready: Vec<u64> = self
            .parked
            .iter()
            .copied()
            .filter(|txid| self.in_flight.get(txid).is_some_and(|entry| entry.wait_epoch <= epoch))
            .collect();
        for txid in ready {
            self.parked.remove(&txid);
            self.dispatch(txid);
        }
        // Down OSDs' connections go; a later up gets a fresh one.
        let down: Vec<OsdId> =
            self.links.keys().filter(|id| !self.map.osds.get(id).is_some_and(|o| o.up)).copied().collect();
        for osd in down {
            self.drop_link(osd, "the map says the OSD is down");
        }
    }

    fn drop_link(&mut self, osd: OsdId, why: &str) {
        let Some(mut link) = self.links.remove(&osd) else { return };
        tracing::debug!(osd, why, "dropping an OSD connection");
        let _ = self.poll.registry().deregister(&mut link.stream);
        self.tokens.remove(&link.token);
        self.unreachable_until.insert(osd, Instant::now() + RECONNECT_BACKOFF);
        for txid in link.sent {
            if let Some(entry) = self.in_flight.get_mut(&txid) {
                if entry.sent_to == Some(osd) {
                    entry.sent_to = None;
                    self.retry_later(txid, placement::at_osd(osd, why));
                }
            }
        }
    }

    fn flush_links(&mut self) {
        let mut dirty = std::mem::take(&mut self.dirty_links);
        dirty.sort_unstable();
        dirty.dedup();
        for osd in dirty {
            let Some(link) = self.links.get_mut(&osd) else { continue };
            if let Err(err) = duplex_proto::writev::drain(&mut link.stream, &mut link.out) {
                self.drop_link(osd, &err.to_string());
            }
        }
    }

    fn expire(&mut self, now: Instant) {
        let expired: Vec<u64> =
            self.in_flight.iter().filter(|(_, entry)| entry.deadline.passed(now)).map(|(txid, _)| *txid).collect();
        for txid in expired {
            let Some(entry) = self.in_flight.get(&txid) else { continue };
            let error = entry.deadline.timed_out(entry.last_problem.clone());
            self.finish(txid, Err(error));
        }
    }

    fn finish(&mut self, txid: u64, result: Result<Bytes, ClientError>) {
        let Some(entry) = self.in_flight.remove(&txid) else { return };
        self.parked.remove(&txid);
        if let Some(osd) = entry.sent_to {
            if let Some(link) = self.links.get_mut(&osd) {
                link.sent.remove(&txid);
            }
        }
        (entry.done)(result);
    }

    fn shutdown(&mut self) {
        let all: Vec<u64> = self.in_flight.keys().copied().collect();
        for txid in all {
            self.finish(txid, Err(ClientError::Shutdown));
        }
        while let Ok(command) = self.commands.try_recv() {
            if let Command::Submit(_, done) = command {
                done(Err(ClientError::Shutdown));
            }
        }
    }
}

/// Follows the map from the monitors (rotating among them when one fails)
/// and hands each new map to the I/O thread, until `stop`.
pub(crate) fn follow_map(
    monitors: Vec<(u64, SocketAddr)>,
    credentials: Credentials,
    published: Arc<RwLock<Arc<ClusterMap>>>,
    to_runtime: crossbeam_channel::Sender<Command>,
    waker: Arc<Waker>,
    stop: Arc<AtomicBool>,
) {
    let from = published.read().expect("map lock").as_ref().clone();
    MonClient::new(monitors, credentials).follow(from, &stop, Duration::from_millis(200), |map| {
        let map = Arc::new(map.clone());
        *published.write().expect("map lock") = map.clone();
        let delivered = to_runtime.send(Command::Map(map)).is_ok();
        let _ = waker.wake();
        delivered
    });
}
