//! A pipelined object-level load generator: keeps `queue_depth` requests in
//! flight over one connection per OSD, sends each to its PG's primary, and
//! records client-side latency. One thread, one `epoll` loop: the load
//! generator should cost the machine as little as the cluster allows.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use duplex_map::OsdId;
use duplex_proto::osd::{OpKind, OpReply};
use duplex_proto::FrameDecoder;
use hdrhistogram::Histogram;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use rand::{Rng, SeedableRng};

use crate::placement::{self, Next, Target};
use crate::{ClientError, ObjectClient};
use duplex_mon_client::Connection as OsdConnection;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    RandomWrite,
    RandomRead,
    /// Random reads and writes, `read_percent` of them reads.
    Mix {
        read_percent: u8,
    },
}

#[derive(Clone, Debug)]
pub struct LoadSpec {
    pub pool: u32,
    pub pattern: Pattern,
    /// Objects named `{prefix}.{n}` for n in 0..objects.
    pub prefix: String,
    pub objects: u32,
    pub object_size: u64,
    pub block: u32,
    /// Requests each session keeps in flight ([`run`]; [`run_groups`] says its own).
    pub queue_depth: usize,
    /// Counted from the end of `warmup`, which runs first on the same
    /// connections (for an OSD to settle, e.g. its connection placement).
    pub duration: Duration,
    pub warmup: Duration,
    pub seed: u64,
}

#[derive(Debug)]
pub struct LoadResult {
    pub ops: u64,
    pub errors: u64,
    pub elapsed: Duration,
    /// Latency in microseconds.
    pub latency: Histogram<u64>,
}

impl LoadResult {
    /// No operation yet.
    pub fn empty() -> LoadResult {
        LoadResult {
            ops: 0,
            errors: 0,
            elapsed: Duration::ZERO,
            latency: Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("static bounds"),
        }
    }

    pub fn iops(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64()
    }
}

struct Peer {
    stream: TcpStream,
    inbuf: BytesMut,
    out: std::collections::VecDeque<Bytes>,
}

impl Peer {
    fn flush(&mut self) -> std::io::Result<()> {
        duplex_proto::writev::drain(&mut self.stream, &mut self.out)
    }
}

/// Runs `spec` against the cluster `client` knows; errors are counted, not fatal.
pub fn run(client: &ObjectClient, spec: &LoadSpec) -> std::io::Result<LoadResult> {
    let group = Group { sessions: 1, queue_depth: spec.queue_depth };
    let mut results = run_groups(client, spec, &[group])?;
    Ok(results.pop().expect("one group, one result"))
}

/// Sessions alike: each its own connections (one per OSD it sends to)
/// and its own queue depth, as separate clients would be.
#[derive(Clone, Copy, Debug)]
pub struct Group {
    pub sessions: usize,
    pub queue_depth: usize,
}

struct Session {
    group: usize,
    queue_depth: usize,
    peers: HashMap<OsdId, Peer>,
    in_flight: HashMap<u64, Instant>,
}

/// Runs `spec` (its queue depth aside) from every session of `groups` at
/// once, in one thread: skewed load, such as a few busy clients beside
/// many quiet ones. A result per group, its sessions' operations summed.
pub fn run_groups(client: &ObjectClient, spec: &LoadSpec, groups: &[Group]) -> std::io::Result<Vec<LoadResult>> {
    let map = client.map();
    if !map.pools.contains_key(&spec.pool) {
        return Err(std::io::Error::other("no such pool"));
    }
    let hierarchy = map.hierarchy();
    // Each object's PG and primary, computed once: this generator does not
    // follow the map or retry.
    let mut targets: Vec<(Bytes, Target, OsdId)> = Vec::with_capacity(spec.objects as usize);
    for n in 0..spec.objects {
        let name = format!("{}.{n}", spec.prefix).into_bytes();
        let target = placement::locate(map, &hierarchy, spec.pool, &name).map_err(std::io::Error::other)?;
        let primary = target.primary.ok_or_else(|| std::io::Error::other(format!("PG {} has no OSD up", target.pg)))?;
        targets.push((Bytes::from(name), target, primary));
    }
    let mut poll = Poll::new()?;
    let mut sessions: Vec<Session> = Vec::new();
    let mut tokens: Vec<(usize, OsdId)> = Vec::new();
    for (index, group) in groups.iter().enumerate() {
        for _ in 0..group.sessions {
            let mut session = Session {
                group: index,
                queue_depth: group.queue_depth,
                peers: HashMap::new(),
                in_flight: HashMap::new(),
            };
            for (_, _, osd) in &targets {
                if session.peers.contains_key(osd) {
                    continue;
                }
                let addr = client.addr_of(*osd).ok_or_else(|| std::io::Error::other("OSD without address"))?;
                let (stream, inbuf) =
                    OsdConnection::connect(addr, client.credentials(), Duration::from_secs(5))?.into_parts();
                stream.set_nonblocking(true)?;
                let mut stream = TcpStream::from_std(stream);
                poll.registry().register(&mut stream, Token(tokens.len()), Interest::READABLE | Interest::WRITABLE)?;
                tokens.push((sessions.len(), *osd));
                session.peers.insert(*osd, Peer { stream, inbuf, out: Default::default() });
            }
            sessions.push(session);
        }
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let blocks_per_object = (spec.object_size / spec.block as u64).max(1);
    let payload = Bytes::from(vec![0xA5u8; spec.block as usize]);
    let decoder = FrameDecoder::default();
    let mut results: Vec<LoadResult> = groups.iter().map(|_| LoadResult::empty()).collect();
    let mut next_txid = 1u64;
    // A request id per operation, as a real client sends: the OSD tracks them.
    let client_id = rand::random::<u64>() | 1;
    let started = Instant::now() + spec.warmup;
    let deadline = started + spec.duration;
    let mut events = Events::with_capacity(64);
    loop {
        let sending = Instant::now() < deadline;
        for session in &mut sessions {
            while sending && session.in_flight.len() < session.queue_depth {
                let (name, target, osd) = &targets[rng.gen_range(0..targets.len())];
                let offset = rng.gen_range(0..blocks_per_object) * spec.block as u64;
                let read = match spec.pattern {
                    Pattern::RandomWrite => false,
                    Pattern::RandomRead => true,
                    Pattern::Mix { read_percent } => rng.gen_range(0..100) < read_percent as u32,
                };
                let (kind, data) = if read { (OpKind::Read, Bytes::new()) } else { (OpKind::Write, payload.clone()) };
                let request = target.request(kind, name.clone(), offset, spec.block, data, client_id);
                let frame = request.to_frame(next_txid);
                let peer = session.peers.get_mut(osd).expect("connected above");
                peer.out.push_back(Bytes::copy_from_slice(&frame.encode_header()));
                peer.out.push_back(frame.payload);
                session.in_flight.insert(next_txid, Instant::now());
                next_txid += 1;
            }
            for peer in session.peers.values_mut() {
                peer.flush()?;
            }
        }
        if sessions.iter().all(|s| s.in_flight.is_empty()) {
            break;
        }
        poll.poll(&mut events, Some(Duration::from_secs(10)))?;
        if events.is_empty() {
            return Err(std::io::Error::new(ErrorKind::TimedOut, "no reply for 10 s"));
        }
        for event in events.iter() {
            let Some((index, osd)) = tokens.get(event.token().0).copied() else { continue };
            let session = &mut sessions[index];
            let result = &mut results[session.group];
            let peer = session.peers.get_mut(&osd).expect("token of a peer");
            loop {
                match duplex_proto::readbuf::read_into(&peer.stream, &mut peer.inbuf, 64 << 10) {
                    Ok(0) => return Err(std::io::Error::new(ErrorKind::UnexpectedEof, format!("OSD {osd} closed"))),
                    Ok(_) => {}
                    Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
            }
            while let Some(frame) = decoder.decode(&mut peer.inbuf).map_err(std::io::Error::other)? {
                let Some(sent) = session.in_flight.remove(&frame.header.transaction_id) else { continue };
                if sent < started {
                    continue;
                }
                let _ = result.latency.record(sent.elapsed().as_micros().max(1) as u64);
                // What a client would end with success or "no such object"
                // counts; what it would fail or retry is an error here.
                match OpReply::decode(&frame.payload).map(|reply| placement::judge(osd, reply, map.epoch)) {
                    Ok(Next::Done(Ok(_) | Err(ClientError::NotFound))) => result.ops += 1,
                    _ => result.errors += 1,
                }
            }
        }
    }
    let elapsed = started.elapsed();
    for result in &mut results {
        result.elapsed = elapsed;
    }
    Ok(results)
}
