//! The top half: a priority thread (DESIGN.md §6). One event loop over the
//! connections it owns, never blocking and never touching the data device.
//! It runs client operations to the log (or hands them to a pool worker in
//! `threading = pool`), replicates on its own peer connections, logs
//! replicated entries, and replies in request order.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use duplex_map::OsdId;
use duplex_proto::osd::{OpKind, OpReply, OsdStats, RepReply, Status};
use duplex_proto::peering::{PeerOp, PeerReply, PeerRequest};
use duplex_proto::{Frame, Handshake, MessageType, Session};
use mio::net::{TcpListener, TcpStream};
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};

use crate::cluster::ActingCache;
use crate::io::conn::{Conn, ConnError, Inbound, Role, WarnLimit, MAX_IN_FLIGHT};
use crate::io::conn_cell::ConnCell;
use crate::io::ec_settle::{self, EcIo};
use crate::io::erasure::{EcTasks, Settled};
use crate::io::ops;
use crate::io::order::Ticket;
use crate::io::pending::{Finished, PendingWrites, WriteInfo, REPLICATION_TIMEOUT};
use crate::io::pool::Pool;
use crate::io::qos::ClientQos;
use crate::messages::{
    ClientOp, ClientSlot, Completion, EcTask, Job, Mailbox, Outcome, PeerReplyTo, ScrubAsk, SyncDone, MAX_SCRUB_ASKS,
};
use crate::metrics::{record, Histograms, Stage};
use crate::pg::{pg_number, pool_of, ReplyTo};
use crate::shared::Shared;

mod scheduled;

pub const LISTENER: Token = Token(0);
pub const WAKER: Token = Token(1);
/// Accepted connections an OSD holds at once (clients and peers); more are refused.
pub const MAX_CONNECTIONS: usize = 4096;
/// How often pending writes are checked against that timeout.
const PENDING_CHECK: Duration = Duration::from_millis(500);

pub struct PriorityThread {
    pub index: usize,
    pub shared: Arc<Shared>,
    pub poll: Poll,
    pub inbox: Receiver<Completion>,
    pub mailboxes: Vec<Mailbox>,
    pub listener: Option<TcpListener>,
    /// `threading = pool`: where operations run instead of inline.
    pub pool: Option<Pool>,
    /// The connections this thread knows: those it serves, and (under
    /// `lcam`) those it stopped serving but may still answer on. Tokens
    /// are the process's (`Messenger::token`), the same in every thread.
    conns: HashMap<usize, Arc<ConnCell>>,
    /// Those of `conns` in this thread's poll.
    polled: HashSet<usize>,
    /// Messages read in one batch, reused.
    inbound: Vec<Inbound>,
    /// Shared connections whose reading was held for too many requests
    /// waiting their turn, and that may read on now.
    unheld: Vec<usize>,
    peers: HashMap<OsdId, usize>,
    pending: PendingWrites<ClientSlot>,
    /// `threading = lalca`: operations forwarded here that wait for log
    /// room, in arrival order (their claims hold their PGs here); what is
    /// forwarded behind them waits too.
    forwarded_parked: std::collections::VecDeque<ClientOp>,
    /// Threads this turn posted to without waking them (forwarded
    /// operations and their replies, `lalca`): woken once each at the
    /// turn's end, not once per post.
    to_wake: Vec<usize>,
    /// Erasure-coded operations waiting for their shards.
    ec: EcTasks,
    /// Erasure-coded mutations whose object came free, to run again.
    resumes: Vec<ClientOp>,
    /// When this thread last asked for each erasure-coded PG's repair (a
    /// damaged shard block a read met).
    repairs_asked: HashMap<u32, Instant>,
    cache: ActingCache,
    histograms: Histograms,
    touched: Vec<usize>,
    resume: Vec<usize>,
    /// Warnings about refused connections, at most one a second.
    refusals: WarnLimit,
    /// Client QoS (`io::qos`): while the map has settings, client
    /// operations wait here after they are read and run in the
    /// scheduler's order, at most `TURN_COST` a turn.
    qos: ClientQos<ClientOp>,
    /// The scheduler had more than a turn's work: poll without waiting.
    qos_ready: bool,
    /// When the scheduler's or the limiter's next held operation may go.
    qos_wake: Option<Instant>,
    /// Owed operations ran as they were read: what they staged leaves
    /// after the event that read them, not at the turn's end.
    qos_flush: bool,
    /// This thread's classes are in `Shared::qos_views`.
    qos_published: bool,
}

impl PriorityThread {
    pub fn new(
        index: usize,
        shared: Arc<Shared>,
        poll: Poll,
        inbox: Receiver<Completion>,
        mailboxes: Vec<Mailbox>,
        listener: Option<TcpListener>,
        pool: Option<Pool>,
    ) -> PriorityThread {
        assert!(index < mailboxes.len(), "priority thread {index} has no mailbox of its own");
        let cache = ActingCache::new(&shared.map);
        let histograms = shared.metrics.histograms();
        PriorityThread {
            index,
            shared,
            poll,
            inbox,
            mailboxes,
            listener,
            pool,
            conns: HashMap::new(),
            polled: HashSet::new(),
            inbound: Vec::new(),
            unheld: Vec::new(),
            peers: HashMap::new(),
            pending: PendingWrites::default(),
            forwarded_parked: Default::default(),
            to_wake: Vec::new(),
            ec: EcTasks::default(),
            resumes: Vec::new(),
            repairs_asked: HashMap::new(),
            cache,
            histograms,
            touched: Vec::new(),
            resume: Vec::new(),
            refusals: WarnLimit::new(),
            qos: ClientQos::default(),
            qos_ready: false,
            qos_wake: None,
            qos_flush: false,
            qos_published: false,
        }
    }

    pub fn run(mut self) {
        if let Some(listener) = self.listener.as_mut() {
            if let Err(err) = self.poll.registry().register(listener, LISTENER, Interest::READABLE) {
                tracing::error!(%err, "cannot watch the listening socket");
                return;
            }
        }
        let mut max_events = self.shared.messenger.max_events();
        let mut events = Events::with_capacity(max_events);
        let mut next_check = Instant::now() + PENDING_CHECK;
        loop {
            // The paper's maxevents (connections ÷ threads) moves with the
            // placement: each thread takes its share of the ready ones.
            let wanted = self.shared.messenger.max_events();
            if wanted != max_events {
                max_events = wanted;
                events = Events::with_capacity(wanted);
            }
            let timeout = (!self.pending.is_empty() || !self.ec.is_empty() || self.shared.watchers.any())
                .then(|| next_check.saturating_duration_since(Instant::now()));
            let timeout = self.qos_timeout(timeout);
            if let Err(err) = self.poll.poll(&mut events, timeout) {
                if err.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                tracing::error!(%err, "poll failed; the priority thread stops");
                return;
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(token) => {
                        if event.is_readable() || event.is_read_closed() || event.is_error() {
                            self.on_readable(token);
                            if self.qos_flush {
                                self.qos_flush = false;
                                self.write_touched();
                            }
                        }
                        self.touched.push(token);
                    }
                }
            }
            while let Ok(completion) = self.inbox.try_recv() {
                self.on_completion(completion);
            }
            while let Some(op) = self.resumes.pop() {
                self.resume(op);
            }
            while let Some(token) = self.unheld.pop() {
                self.on_readable(token);
            }
            // Connections paused at their in-flight limit that have room again.
            while let Some(token) = self.resume.pop() {
                if self.conns.get(&token).is_some_and(|c| c.lock().paused) {
                    self.on_readable(token);
                }
            }
            if self.qos.is_on() {
                self.run_scheduled();
            }
            let now = Instant::now();
            if now >= next_check {
                self.expire_pending(now);
                self.follow_qos(now);
                let epoch = self.cache.view(&self.shared.map).epoch();
                self.shared.watchers.expire(self.index, now, epoch);
                next_check = now + PENDING_CHECK;
            }
            self.wake_posted();
            self.write_touched();
            // Closing a connection there can finish writes whose replies
            // go to other threads.
            self.wake_posted();
        }
    }

    /// Fails (`Retry`) replicated writes still waiting for replicas after
    /// `REPLICATION_TIMEOUT`, or whose PG peering has moved to a newer
    /// interval; late acknowledgements find nothing and are ignored.
    fn expire_pending(&mut self, now: Instant) {
        let shared = self.shared.clone();
        let shared = &shared;
        let expired = self.pending.expire(now, REPLICATION_TIMEOUT, |pg, epoch| ops::write_outlived(shared, pg, epoch));
        for write in expired {
            self.finish(write);
        }
        let given_up = self.ec.expire(now, REPLICATION_TIMEOUT, |pg, epoch| ops::write_outlived(shared, pg, epoch));
        for settled in given_up {
            self.on_settled(settled);
        }
    }

    fn accept(&mut self) {
        loop {
            let Some(listener) = self.listener.as_ref() else { return };
            match listener.accept() {
                Ok((stream, addr)) => {
                    if self.shared.connections.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                        self.shared.metrics.connections_refused.add(1);
                        if let Some(also) = self.refusals.admit(Instant::now()) {
                            tracing::warn!(%addr, also, "refusing a connection: {MAX_CONNECTIONS} are open");
                        }
                        continue;
                    }
                    let _ = stream.set_nodelay(true);
                    let config = &self.shared.config;
                    let session = Session::new(Handshake::server(config.fsid, &config.secret, rand::random()));
                    let messenger = &self.shared.messenger;
                    let conn = Conn::new(stream, session, Role::Accepted);
                    let cell = Arc::new(ConnCell::new(messenger.token(), conn, messenger.shares_accepted()));
                    self.shared.connections.fetch_add(1, Ordering::Relaxed);
                    for worker in messenger.place_new(&cell) {
                        if worker == self.index {
                            self.serve(cell.clone());
                        } else {
                            self.mailboxes[worker].post_and_wake(Completion::Serve(cell.clone()));
                        }
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    tracing::warn!(%e, "accept failed");
                    return;
                }
            }
        }
    }

    /// Starts serving a connection: it joins this thread's poll (its
    /// socket is registered by descriptor, as under `lcam` it is in
    /// several threads' polls at once). False if it cannot be watched.
    fn serve(&mut self, cell: Arc<ConnCell>) -> bool {
        let token = cell.token;
        debug_assert!(
            cell.role == Role::Accepted || !cell.is_shared(),
            "a peer connection of ours is shared: its acknowledgements would reach the wrong thread"
        );
        if cell.is_closed() || self.polled.contains(&token) {
            return !cell.is_closed();
        }
        let interest = Interest::READABLE | Interest::WRITABLE;
        if let Err(err) = self.poll.registry().register(&mut SourceFd(&cell.fd), Token(token), interest) {
            tracing::warn!(%err, token, "cannot watch a connection");
            if !self.conns.contains_key(&token) && cell.role == Role::Accepted {
                // A new one nobody else may serve: it closes.
                self.close(&cell, ConnError::Io(err));
            }
            // A new peer connection: `peer` reports no connection (nothing
            // was sent on it, and the peer is not suspect for this).
            return false;
        }
        self.polled.insert(token);
        if let Some(known) = self.conns.insert(token, cell.clone()) {
            debug_assert!(Arc::ptr_eq(&known, &cell), "connection token {token} given out twice");
        }
        true
    }

    /// `lcam`: stops watching a connection, keeping it to answer on.
    fn unserve(&mut self, token: usize) {
        if self.polled.remove(&token) {
            if let Some(cell) = self.conns.get(&token) {
                let _ = self.poll.registry().deregister(&mut SourceFd(&cell.fd));
            }
        }
    }

    /// A connection another thread closed: out of this thread's poll and table.
    fn forget(&mut self, token: usize) {
        self.unserve(token);
        self.conns.remove(&token);
    }

    /// This thread's connection to peer `osd`, opened on first use.
    fn peer(&mut self, osd: OsdId) -> Option<usize> {
        if let Some(token) = self.peers.get(&osd) {
            debug_assert!(
                self.conns.get(token).is_some_and(|c| c.role == Role::Peer(osd)),
                "the peer table names a connection that is not ours to osd.{osd}"
            );
            return Some(*token);
        }
        let addr = self.cache.view(&self.shared.map).addr_of(osd)?;
        let stream = match TcpStream::connect(addr) {
            Ok(s) => s,
            Err(err) => {
                tracing::warn!(osd, %addr, %err, "cannot connect to peer");
                return None;
            }
        };
        let _ = stream.set_nodelay(true);
        let config = &self.shared.config;
        let (handshake, hello) =
            Handshake::client(config.fsid, &config.secret, rand::random(), &format!("osd.{}", config.id));
        let mut conn = Conn::new(stream, Session::new(handshake), Role::Peer(osd));
        conn.push(&hello);
        // Ours alone: the replies to our writes come back to this thread.
        let cell = Arc::new(ConnCell::new(self.shared.messenger.token(), conn, false));
        let token = cell.token;
        if !self.serve(cell) {
            return None;
        }
        self.peers.insert(osd, token);
        self.touched.push(token);
        Some(token)
    }

    fn on_readable(&mut self, token: usize) {
        loop {
            let Some(cell) = self.conns.get(&token) else { return };
            if cell.is_closed() {
                self.forget(token);
                return;
            }
            let cell = cell.clone();
            if cell.is_shared() && cell.hold(MAX_IN_FLIGHT) {
                // Too many requests wait for their turn: read on when they ran.
                return;
            }
            let mut inbound = std::mem::take(&mut self.inbound);
            debug_assert!(inbound.is_empty(), "a read batch left over");
            // Under the connection's lock: read, and take the reply slots
            // and tickets in arrival order; the messages run after it is
            // released, so that another thread may read the next batch.
            let read = {
                let mut conn = cell.lock();
                if conn.closing {
                    // Another thread read its end and closes it.
                    Ok(false)
                } else {
                    self.read_batch(&cell, &mut conn, &mut inbound).map(|()| conn.closing)
                }
            };
            // A malformed message ends the connection after the ones before it ran.
            let (closing, malformed) = match read {
                Ok(closing) => (closing, None),
                Err(ConnError::Protocol(why)) => (false, Some(why)),
                Err(err) => {
                    self.inbound = inbound;
                    self.inbound.clear();
                    self.drop_conn(token, err);
                    return;
                }
            };
            let mut failed = None;
            for message in inbound.drain(..) {
                if failed.is_none() {
                    failed = self.admit(&cell, token, message).err();
                }
            }
            self.inbound = inbound;
            if let Some(why) = failed.or(malformed) {
                self.drop_conn(token, ConnError::Protocol(why));
                return;
            }
            if closing {
                self.drop_conn(token, ConnError::Closed);
                return;
            }
            // Paused with room again (the messages were answered at once): read on.
            let conn = cell.lock();
            if !(conn.paused && conn.in_flight() < MAX_IN_FLIGHT) {
                return;
            }
        }
    }

    /// Reads what the socket has and classifies it (slots, tickets) into
    /// `inbound`. On a malformed message, what came before it stays in
    /// `inbound` (it runs, then the connection closes).
    fn read_batch(&self, cell: &ConnCell, conn: &mut Conn, inbound: &mut Vec<Inbound>) -> Result<(), ConnError> {
        let frames = conn.read()?;
        let mut bytes = 0;
        let count = frames.len() as u64;
        let mut malformed = None;
        for frame in frames {
            bytes += (duplex_proto::frame::HEADER_LEN + frame.payload.len()) as u64;
            match conn.classify(frame, cell.is_shared()) {
                Ok(message) => inbound.push(message),
                Err(why) => {
                    malformed = Some(why);
                    break;
                }
            }
        }
        if count > 0 {
            self.shared.messenger.count(self.index, count, bytes);
            cell.carried(bytes);
        }
        malformed.map_or(Ok(()), |why| Err(ConnError::Protocol(why)))
    }

    /// Runs a message now, or (on a shared connection) when every earlier
    /// one of its lane has taken effect (`order.rs`).
    fn admit(&mut self, cell: &Arc<ConnCell>, token: usize, message: Inbound) -> Result<(), String> {
        debug_assert!(message.ticket().is_none() || cell.is_shared(), "a ticket on a connection one thread serves");
        let Some(ticket) = message.ticket() else {
            self.dispatch(token, cell.role, message)?;
            return Ok(());
        };
        if cell.is_closed() {
            // Another thread closed it: what it still held back goes with it.
            return Ok(());
        }
        let Some(message) = cell.enter(ticket, message) else {
            self.shared.messenger.order_waited();
            return Ok(());
        };
        if self.dispatch(token, cell.role, message)? {
            self.advance(cell, token, ticket)?;
        }
        Ok(())
    }

    /// `ticket` took effect: runs the messages of its lane that waited for it.
    fn advance(&mut self, cell: &Arc<ConnCell>, token: usize, mut ticket: Ticket) -> Result<(), String> {
        loop {
            let next = cell.leave(ticket);
            if cell.release(MAX_IN_FLIGHT / 2) {
                self.unheld.push(token);
            }
            let Some((next, message)) = next else { break };
            if cell.is_closed() || !self.dispatch(token, cell.role, message)? {
                break;
            }
            ticket = next;
        }
        Ok(())
    }

    /// Handles one message. False: a client operation was parked (it
    /// waits for log room, so its lane does not move on yet).
    fn dispatch(&mut self, token: usize, role: Role, message: Inbound) -> Result<bool, String> {
        let frame = match message {
            Inbound::Op { txid, request, slot: None, .. } => {
                // A long poll takes no reply slot (watchers.rs): its answer
                // goes out on its own, now or when the watchers send it.
                let op = ClientOp {
                    thread: self.index,
                    token,
                    slot: 0,
                    txid,
                    request,
                    arrived: Instant::now(),
                    ticket: None,
                    claim: None,
                };
                if let Outcome::Reply { reply, .. } =
                    ops::client_op(&self.shared, &mut self.cache, &self.histograms, op)
                {
                    self.send(token, &reply.to_frame(txid));
                }
                return Ok(true);
            }
            Inbound::Op { txid, request, slot: Some(slot), ticket } => {
                let op = ClientOp {
                    thread: self.index,
                    token,
                    slot,
                    txid,
                    request,
                    arrived: Instant::now(),
                    ticket,
                    claim: None,
                };
                let Some(cell) = self.conns.get(&token) else { return Ok(true) };
                let op = {
                    let mut conn = cell.lock();
                    if conn.parked.is_empty() {
                        op
                    } else {
                        conn.parked.push_back(op);
                        return Ok(false);
                    }
                };
                if self.qos.is_on() {
                    // It runs in the scheduler's order, after this turn's reads.
                    self.schedule(op);
                    return Ok(false);
                }
                return Ok(self.run_client(op, false));
            }
            Inbound::Frame { frame, .. } => frame,
        };
        let txid = frame.header.transaction_id;
        match (MessageType::from_u8(frame.header.message_type), role) {
            (Some(MessageType::RepOp), Role::Accepted) => {
                let to = ReplyTo { thread: self.index, token, txid };
                if let Some(pool) = &self.pool {
                    pool.replica(frame.payload, to);
                } else {
                    let outcome = ops::replica_op(&self.shared, &self.histograms, &frame.payload, to)?;
                    self.execute(outcome);
                }
            }
            (Some(MessageType::RepOpReply), Role::Peer(osd)) => {
                let ack = RepReply::decode(&frame.payload).map_err(|e| format!("bad replication reply: {e}"))?;
                if self.ec.waits(txid) {
                    if let Some(settled) = self.ec.on_ack(txid, osd, ack.status == Status::Ok) {
                        self.on_settled(settled);
                    }
                } else {
                    self.on_ack(txid, osd, ack.status == Status::Ok);
                }
            }
            (Some(MessageType::OsdOpReply), Role::Peer(osd)) => {
                // A member's answer to an erasure-coded task's shard read.
                let reply = OpReply::decode(&frame.payload).map_err(|e| format!("bad shard read reply: {e}"))?;
                if let Some(settled) = self.ec.on_read(txid, osd, reply) {
                    self.on_settled(settled);
                }
            }
            (Some(MessageType::PeerRequest), Role::Accepted) => {
                let request = PeerRequest::decode(&frame.payload).map_err(|e| e.to_string())?;
                let view = self.cache.view(&self.shared.map);
                let known = view.pool(pool_of(request.pg)).is_some_and(|pool| pg_number(request.pg) < pool.pg_num);
                let is_scrub = matches!(request.op, PeerOp::Scrub { .. });
                let refusal = if !known {
                    Some(format!("PG {:#x} is not in map epoch {}", request.pg, view.epoch()))
                } else if !is_scrub && request.interval > view.epoch() {
                    // An interval is a map epoch: one this OSD has not seen
                    // yet is refused until its map catches up (the primary
                    // retries). It also keeps a fence from jumping ahead of
                    // every map the cluster will ever have.
                    Some(format!("interval {} is past this OSD's map (epoch {})", request.interval, view.epoch()))
                } else {
                    None
                };
                if let Some(why) = refusal {
                    self.send(token, &PeerReply::Refused(why).to_frame(txid));
                } else if let PeerOp::Scrub { repair } = request.op {
                    // The peering thread runs it and answers when the PG is active again.
                    let reply = ReplyTo { thread: self.index, token, txid };
                    let mut asks = self.shared.scrub_requests.lock().expect("scrub requests lock");
                    if asks.len() >= MAX_SCRUB_ASKS {
                        drop(asks);
                        let busy = PeerReply::Refused("too many scrubs are waiting; ask again later".into());
                        self.send(token, &busy.to_frame(txid));
                    } else {
                        asks.push(ScrubAsk { pg: request.pg, repair, reply: Some(reply) });
                    }
                } else {
                    let reply = PeerReplyTo::Remote(ReplyTo { thread: self.index, token, txid });
                    self.shared.send_job(request.pg, Job::Peer { request, reply });
                }
            }
            (Some(MessageType::OsdStats), Role::Accepted) => {
                let metrics = &self.shared.metrics;
                let stats = OsdStats {
                    capacity_bytes: metrics.store_capacity_bytes.load(Ordering::Relaxed),
                    used_bytes: metrics.store_used_bytes.load(Ordering::Relaxed),
                    writes: metrics.writes.get(),
                    reads: metrics.reads.get(),
                    write_bytes: metrics.write_bytes.get(),
                    read_bytes: metrics.read_bytes.get(),
                    log_entries: metrics.log_entries.load(Ordering::Relaxed),
                    failed_devices: metrics.mirror_failed_devices(),
                    lags: metrics.lags_reported(),
                };
                self.send(token, &stats.to_frame(txid));
            }
            (Some(MessageType::OsdUsage), Role::Accepted) => {
                // Every partition answers on this connection with this txid.
                let to = ReplyTo { thread: self.index, token, txid };
                for flusher in &self.shared.flushers {
                    // A flusher ends only at shutdown: then no one answers.
                    let _ = flusher.send(Job::Usage(crate::messages::UsageTo::Remote(to)));
                }
            }
            (Some(MessageType::Ping), _) => {
                let pong = Frame::new(MessageType::Pong, txid, frame.payload);
                self.send(token, &pong);
            }
            (kind, role) => return Err(format!("unexpected {kind:?} on a {role:?} connection")),
        }
        Ok(true)
    }

    /// Runs (or queues to the pool) a client operation. `retry`: it came
    /// from the front of the parked queue and goes back there if still blocked.
    fn run_client(&mut self, mut op: ClientOp, retry: bool) -> bool {
        debug_assert_eq!(op.thread, self.index, "a client operation runs on the thread that owns its connection");
        if let Some(pool) = &self.pool {
            pool.client(op);
            return true;
        }
        if op.claim.is_none() {
            if let Some(owner) = self.claim_owner(&mut op) {
                self.shared.metrics.lalca_forwarded.add(1);
                self.post_later(owner, Completion::Forwarded(op));
                return true;
            }
        }
        let claim = op.claim;
        match ops::client_op(&self.shared, &mut self.cache, &self.histograms, op) {
            Outcome::Full(mut op) => {
                // Its claim goes back while it waits on its connection (a
                // closed connection drops what it parked): the operations
                // behind it on the connection wait behind it, so they keep
                // their order, and it claims again when it is retried.
                self.release(op.claim.take());
                if let Some(cell) = self.conns.get(&op.token) {
                    let mut conn = cell.lock();
                    if retry {
                        conn.parked.push_front(op);
                    } else {
                        conn.parked.push_back(op);
                    }
                }
                false
            }
            outcome => {
                self.execute_for(outcome, self.index, claim);
                true
            }
        }
    }

    /// `threading = lalca`: takes a claim on an eventual PG's owner slot
    /// for `op`. `Some(owner)`: another thread owns the PG, and `op` is to
    /// be forwarded there; `None`: it runs here (with a claim or without).
    fn claim_owner(&mut self, op: &mut ClientOp) -> Option<usize> {
        let owners = self.shared.owners.as_ref()?;
        let key = crate::pg::pg_key(op.request.pool, op.request.pg)?;
        let view = self.cache.view(&self.shared.map);
        if view.pool(op.request.pool).is_none_or(|pool| pool.eventual.is_none()) {
            return None;
        }
        let slot = crate::io::lalca::Owners::slot_of(key);
        op.claim = Some(slot);
        match owners.claim(slot, self.index) {
            crate::io::lalca::Claim::Here => {
                self.shared.metrics.lalca_owned.add(1);
                None
            }
            crate::io::lalca::Claim::Forward(owner) => Some(owner),
        }
    }

    /// Gives back an operation's owner claim: it has taken effect here.
    fn release(&self, claim: Option<u32>) {
        if let (Some(slot), Some(owners)) = (claim, self.shared.owners.as_ref()) {
            owners.release(slot, self.index);
        }
    }

    /// `threading = lalca`: an operation of a PG this thread owns, from
    /// another thread's connection. Behind one still waiting for log room,
    /// it waits too (it may be the same PG's).
    fn run_forwarded(&mut self, op: ClientOp) -> bool {
        debug_assert!(op.claim.is_some(), "a forwarded operation without a claim on its PG");
        debug_assert_ne!(op.thread, self.index, "an operation forwarded to its own connection's thread");
        let thread = op.thread;
        let claim = op.claim;
        match ops::client_op(&self.shared, &mut self.cache, &self.histograms, op) {
            Outcome::Full(op) => {
                self.forwarded_parked.push_back(op);
                false
            }
            outcome => {
                self.execute_for(outcome, thread, claim);
                true
            }
        }
    }

    /// After a flush: forwarded operations that waited for log room, in order.
    fn retry_forwarded(&mut self) {
        while let Some(op) = self.forwarded_parked.pop_front() {
            if !self.run_forwarded(op) {
                // It went to the back: put it in front again.
                if let Some(op) = self.forwarded_parked.pop_back() {
                    self.forwarded_parked.push_front(op);
                }
                break;
            }
        }
    }

    fn execute(&mut self, outcome: Outcome) {
        self.execute_for(outcome, self.index, None);
    }

    /// Does the network I/O `outcome` asks for. `thread` serves the
    /// client's connection (another thread's under `lalca`, when the
    /// operation was forwarded here); `claim` is the owner claim the
    /// operation holds, given back once it has taken effect.
    fn execute_for(&mut self, outcome: Outcome, thread: usize, claim: Option<u32>) {
        match outcome {
            Outcome::Reply { token, slot, reply, arrived, kind } => {
                let stage = if kind == OpKind::Read { Stage::Read } else { Stage::Write };
                record(&self.histograms, stage, arrived.elapsed().as_micros() as u64);
                self.release(claim);
                self.reply_on(thread, token, slot, reply);
            }
            Outcome::Replicate {
                write,
                token,
                slot,
                entry,
                replicas,
                local,
                arrived,
                map_epoch,
                pg,
                request,
                answered,
                elided,
            } => {
                let txid = write;
                debug_assert!(
                    !replicas.is_empty() || local.is_some(),
                    "a write with nothing to wait for was not answered"
                );
                debug_assert!(answered.is_none() || local.is_none(), "a write answered before its local apply");
                let frame = Frame::new(MessageType::RepOp, txid, entry);
                let info = WriteInfo {
                    reply_to: ClientSlot { thread, token, slot },
                    arrived,
                    map_epoch,
                    pg,
                    request,
                    answered,
                };
                let mut pending = std::mem::take(&mut self.pending);
                let elided = elided.map(|e| (Frame::new(MessageType::RepOp, txid, e.entry), e.to));
                let finished = pending.register(txid, info, replicas, local.is_some(), Instant::now(), |osd| {
                    let Some(peer) = self.peer(osd) else { return false };
                    match &elided {
                        Some((elided, to)) if to.contains(&osd) => self.send(peer, elided),
                        _ => self.send(peer, &frame),
                    }
                    true
                });
                self.pending = pending;
                // Logged here and registered: it has taken effect at the
                // primary, and its PG may change hands (its replicas'
                // answers settle under the PG's lock on this thread).
                self.release(claim);
                // Only now, with the write registered, may its local apply complete.
                if let Some(entry) = local {
                    let done = SyncDone::Primary { thread: self.index, txid };
                    self.shared.send_job(entry.pg, Job::SyncApply { entry, done });
                }
                if answered.is_some() {
                    // Logged here is all an eventual pool's write waits for.
                    record(&self.histograms, Stage::Write, arrived.elapsed().as_micros() as u64);
                    self.reply_on(thread, token, slot, OpReply::ok(map_epoch));
                }
                if let Some(write) = finished {
                    self.finish(write);
                }
            }
            Outcome::Erasure(task) => {
                debug_assert!(claim.is_none(), "an erasure-coded operation with an eventual PG's claim");
                self.release(claim);
                self.start_ec(task)
            }
            Outcome::Queued => self.release(claim),
            Outcome::Full(op) => {
                // run_client parks these itself and pool workers wait for room,
                // so none should come here; parking is still the safe answer.
                tracing::warn!("a full-log outcome reached execute; parking it");
                // Its lane already moved on past it (it was counted as run).
                let mut op = op;
                op.ticket = None;
                self.release(op.claim.take());
                if let Some(cell) = self.conns.get(&op.token) {
                    cell.lock().parked.push_back(op);
                }
            }
            Outcome::Acks { pg, acks, status } => {
                debug_assert!(claim.is_none(), "a replica's entry with a client's claim");
                for ack in acks {
                    debug_assert!(ack.to.thread < self.mailboxes.len(), "an ack for priority thread {}", ack.to.thread);
                    if ack.to.thread == self.index {
                        self.send(ack.to.token, &ack.frame(pg, status));
                    } else {
                        self.mailboxes[ack.to.thread].post_and_wake(Completion::ack(ack, pg, status));
                    }
                }
            }
        }
    }

    /// Replies on a connection `thread` serves: here, or through its mailbox.
    fn reply_on(&mut self, thread: usize, token: usize, slot: u64, reply: OpReply) {
        if thread == self.index {
            self.reply(token, slot, &reply);
        } else {
            debug_assert!(thread < self.mailboxes.len(), "a reply for priority thread {thread}");
            self.post_later(thread, Completion::Reply { token, slot, reply });
        }
    }

    /// Posts to another thread now and wakes it at the end of this turn.
    fn post_later(&mut self, thread: usize, completion: Completion) {
        debug_assert_ne!(thread, self.index, "a thread posting to itself");
        self.mailboxes[thread].post(completion);
        if !self.to_wake.contains(&thread) {
            self.to_wake.push(thread);
        }
    }

    fn wake_posted(&mut self) {
        for thread in self.to_wake.drain(..) {
            self.mailboxes[thread].wake();
        }
    }

    fn reply(&mut self, token: usize, slot: u64, reply: &OpReply) {
        if reply.status != Status::Ok && reply.status != Status::NotFound {
            self.shared.metrics.errors.add(1);
        }
        let Some(cell) = self.conns.get(&token) else { return };
        let resume = {
            let mut conn = cell.lock();
            conn.complete(slot, reply);
            conn.paused && conn.in_flight() < MAX_IN_FLIGHT / 2
        };
        self.touched.push(token);
        if resume {
            self.resume.push(token);
        }
        let bytes = duplex_proto::frame::HEADER_LEN + reply.data.len();
        self.shared.messenger.count(self.index, 0, bytes as u64);
        cell.carried(bytes as u64);
    }

    fn send(&mut self, token: usize, frame: &Frame) {
        if let Some(cell) = self.conns.get(&token) {
            cell.lock().push(frame);
            self.touched.push(token);
        }
    }

    fn on_ack(&mut self, txid: u64, osd: OsdId, ok: bool) {
        if let Some(write) = self.pending.on_ack(txid, osd, ok) {
            self.finish(write);
        }
    }

    /// Replies to a replicated write whose answers are all in.
    /// (Under `lalca` its client may be another thread's: the write was
    /// forwarded here.)
    fn finish(&mut self, write: Finished<ClientSlot>) {
        debug_assert!(
            write.info.reply_to.thread == self.index || self.shared.owners.is_some(),
            "a write finishes on the thread that owns its client"
        );
        record(&self.histograms, Stage::Replication, write.sent.elapsed().as_micros() as u64);
        let reply = write.reply(&self.shared);
        if write.info.answered.is_some() {
            return;
        }
        record(&self.histograms, Stage::Write, write.info.arrived.elapsed().as_micros() as u64);
        let to = write.info.reply_to;
        self.reply_on(to.thread, to.token, to.slot, reply);
    }

    fn on_completion(&mut self, completion: Completion) {
        match completion {
            Completion::Reply { token, slot, reply } => self.reply(token, slot, &reply),
            Completion::LocalApplied { txid, ok } => self.on_local(txid, ok),
            Completion::Send { token, frame } => self.send(token, &frame),
            Completion::Flushed => {
                self.mailboxes[self.index].took_flushed();
                self.retry_forwarded();
                self.retry_parked();
            }
            Completion::Fenced => {
                self.mailboxes[self.index].took_fenced();
                self.expire_pending(Instant::now());
            }
            Completion::Serve(cell) => {
                self.serve(cell);
            }
            Completion::Unserve(token) => self.unserve(token),
            Completion::Forget(token) => self.forget(token),
            Completion::Worked(outcome) => self.execute(*outcome),
            Completion::Resume(op) => self.resumes.push(op),
            Completion::Forwarded(op) => {
                if self.forwarded_parked.is_empty() {
                    self.run_forwarded(op);
                } else {
                    self.forwarded_parked.push_back(op);
                }
            }
        }
    }

    /// Sends an erasure-coded task's shard reads.
    fn start_ec(&mut self, task: Box<EcTask>) {
        let mut ec = std::mem::take(&mut self.ec);
        ec_settle::start(self, &mut ec, task);
        self.ec = ec;
    }

    /// An erasure-coded task's answers are in (or it was given up on).
    fn on_settled(&mut self, settled: Settled) {
        let mut ec = std::mem::take(&mut self.ec);
        ec_settle::settle(self, &mut ec, settled);
        self.ec = ec;
    }

    /// An erasure-coded object came free and `next` holds it now: it runs
    /// on the thread that owns its connection.
    fn hand_on(&mut self, next: Vec<ClientOp>) {
        for op in next {
            if op.thread == self.index {
                self.resumes.push(op);
            } else {
                self.mailboxes[op.thread].post_and_wake(Completion::Resume(op));
            }
        }
    }

    /// Runs again an erasure-coded mutation whose object came free.
    fn resume(&mut self, op: ClientOp) {
        let (outcome, next) = ops::resume(&self.shared, &mut self.cache, &self.histograms, op);
        self.execute(outcome);
        self.hand_on(next);
    }

    fn on_local(&mut self, txid: u64, ok: bool) {
        if let Some(write) = self.pending.on_local(txid, ok) {
            self.finish(write);
        }
    }

    /// After a flush: run held-back requests again, in order, until one is still blocked.
    fn retry_parked(&mut self) {
        let cells: Vec<Arc<ConnCell>> =
            self.conns.values().filter(|c| !c.is_closed() && !c.lock().parked.is_empty()).cloned().collect();
        for cell in cells {
            let token = cell.token;
            loop {
                let Some(mut op) = cell.lock().parked.pop_front() else { break };
                debug_assert_eq!(op.token, token, "an operation parked on another connection than its own");
                // On a shared connection another thread may have parked it:
                // it is this thread's now (its replication, its reply).
                op.thread = self.index;
                let ticket = op.ticket;
                if !self.run_client(op, true) {
                    break;
                }
                // It took effect: what waited behind it in its lane may run.
                if let Some(ticket) = ticket {
                    if let Err(why) = self.advance(&cell, token, ticket) {
                        self.drop_conn(token, ConnError::Protocol(why));
                        break;
                    }
                }
            }
        }
    }

    /// Writes out every connection touched this turn. Dropping one whose
    /// write failed can touch others (a lost peer fails the writes waiting
    /// on it, and their clients' replies are staged), so this goes on until
    /// no touch is left.
    fn write_touched(&mut self) {
        let mut touched = std::mem::take(&mut self.touched);
        while !touched.is_empty() {
            touched.sort_unstable();
            touched.dedup();
            for token in touched.drain(..) {
                let Some(cell) = self.conns.get(&token) else { continue };
                let written = cell.lock().write_out();
                if let Err(err) = written {
                    self.drop_conn(token, ConnError::Io(err));
                }
            }
            // What the drops touched; the buffer is reused either way.
            std::mem::swap(&mut touched, &mut self.touched);
        }
        self.touched = touched;
    }

    fn drop_conn(&mut self, token: usize, why: ConnError) {
        self.unserve(token);
        let Some(cell) = self.conns.remove(&token) else { return };
        self.close(&cell, why);
    }

    /// Closes a connection, once, whichever of its threads comes first;
    /// the others forget it.
    fn close(&mut self, cell: &Arc<ConnCell>, why: ConnError) {
        if !cell.close() {
            return;
        }
        let token = cell.token;
        match &why {
            ConnError::Closed => tracing::debug!(token, "connection closed"),
            ConnError::Refused(_) | ConnError::Protocol(_) => {
                self.shared.metrics.connections_refused.add(1);
                if let Some(also) = self.refusals.admit(Instant::now()) {
                    tracing::warn!(token, %why, also, "dropping connection (also: refused since the last warning)");
                } else {
                    tracing::debug!(token, %why, "dropping connection");
                }
            }
            ConnError::Io(_) => tracing::debug!(token, %why, "connection failed"),
        }
        {
            let mut conn = cell.lock();
            // Best effort: a refusal or the last replies may still go out.
            let _ = conn.write_out();
            // The threads that still hold it see the end in their polls,
            // and so does the peer, before the last of them lets it go.
            let _ = conn.stream.shutdown(std::net::Shutdown::Both);
        }
        if cell.role == Role::Accepted {
            let open = self.shared.connections.fetch_sub(1, Ordering::Relaxed);
            debug_assert!(open > 0, "more accepted connections closed than opened");
            if cell.is_shared() {
                self.shared.messenger.disconnect(cell);
                for (thread, mailbox) in self.mailboxes.iter().enumerate() {
                    if thread != self.index {
                        mailbox.post_and_wake(Completion::Forget(token));
                    }
                }
            }
        }
        if let Role::Peer(osd) = cell.role {
            // Absent when it closed before it was served.
            let known = self.peers.get(&osd).copied();
            debug_assert!(known.is_none_or(|t| t == token), "the peer table names another connection to osd.{osd}");
            if known == Some(token) {
                self.peers.remove(&osd);
            }
            if matches!(why, ConnError::Io(_) | ConnError::Closed) {
                // The peer may be gone: a probe of its address tells.
                self.shared.suspect(osd);
            }
            for write in self.pending.peer_lost(osd) {
                self.finish(write);
            }
            for settled in self.ec.peer_lost(osd) {
                self.on_settled(settled);
            }
        }
    }
}

/// A priority thread carries its erasure-coded tasks' frames on its own
/// connections.
impl EcIo for PriorityThread {
    fn shared(&self) -> &Shared {
        &self.shared
    }

    fn histograms(&self) -> &Histograms {
        &self.histograms
    }

    fn now(&self) -> Instant {
        Instant::now()
    }

    fn send_to(&mut self, osd: OsdId, frame: &Frame) -> bool {
        let Some(peer) = self.peer(osd) else { return false };
        self.send(peer, frame);
        true
    }

    fn answer(&mut self, op: &ClientOp, reply: &OpReply) {
        self.reply(op.token, op.slot, reply);
    }

    fn run_next(&mut self, next: ClientOp) {
        self.hand_on(vec![next]);
    }

    fn repairs_asked(&mut self) -> &mut HashMap<u32, Instant> {
        &mut self.repairs_asked
    }
}
