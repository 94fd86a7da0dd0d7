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
    pub queue_depth: usize,
    pub duration: Duration,
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
    let mut peers: HashMap<OsdId, Peer> = HashMap::new();
    let mut tokens: HashMap<usize, OsdId> = HashMap::new();
    for (_, _, osd) in &targets {
        if peers.contains_key(osd) {
            continue;
        }
        let addr = client.addr_of(*osd).ok_or_else(|| std::io::Error::other("OSD without address"))?;
        let (stream, inbuf) = OsdConnection::connect(addr, client.credentials(), Duration::from_secs(5))?.into_parts();
        stream.set_nonblocking(true)?;
        let mut stream = TcpStream::from_std(stream);
        let token = tokens.len();
        poll.registry().register(&mut stream, Token(token), Interest::READABLE | Interest::WRITABLE)?;
        tokens.insert(token, *osd);
        peers.insert(*osd, Peer { stream, inbuf, out: Default::default() });
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(spec.seed);
    let blocks_per_object = (spec.object_size / spec.block as u64).max(1);
    let payload = Bytes::from(vec![0xA5u8; spec.block as usize]);
    let decoder = FrameDecoder::default();
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3).expect("static bounds");
    let mut in_flight: HashMap<u64, Instant> = HashMap::new();
    let (mut ops, mut errors, mut next_txid) = (0u64, 0u64, 1u64);
    // A request id per operation, as a real client sends: the OSD tracks them.
    let client_id = rand::random::<u64>() | 1;
    let started = Instant::now();
    let deadline = started + spec.duration;
    let mut events = Events::with_capacity(64);
    loop {
        let sending = Instant::now() < deadline;
        while sending && in_flight.len() < spec.queue_depth {
            let (name, target, osd) = &targets[rng.gen_range(0..targets.len())];
            let offset = rng.gen_range(0..blocks_per_object) * spec.block as u64;
            let (kind, length, data) = match spec.pattern {
                Pattern::RandomWrite => (OpKind::Write, spec.block, payload.clone()),
                Pattern::RandomRead => (OpKind::Read, spec.block, Bytes::new()),
            };
            let request = target.request(kind, name.clone(), offset, length, data, client_id);
            let frame = request.to_frame(next_txid);
            let peer = peers.get_mut(osd).expect("connected above");
            peer.out.push_back(Bytes::copy_from_slice(&frame.encode_header()));
            peer.out.push_back(frame.payload);
            in_flight.insert(next_txid, Instant::now());
            next_txid += 1;
        }
        for peer in peers.values_mut() {
            peer.flush()?;
        }
        if in_flight.is_empty() {
            break;
        }
        poll.poll(&mut events, Some(Duration::from_secs(10)))?;
        if events.is_empty() {
            return Err(std::io::Error::new(ErrorKind::TimedOut, "no reply for 10 s"));
        }
        for event in events.iter() {
            let Some(osd) = tokens.get(&event.token().0) else { continue };
            let peer = peers.get_mut(osd).expect("token of a peer");
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
                let Some(sent) = in_flight.remove(&frame.header.transaction_id) else { continue };
                let _ = latency.record(sent.elapsed().as_micros().max(1) as u64);
                // What a client would end with success or "no such object"
                // counts; what it would fail or retry is an error here.
                match OpReply::decode(&frame.payload).map(|reply| placement::judge(*osd, reply, map.epoch)) {
                    Ok(Next::Done(Ok(_) | Err(ClientError::NotFound))) => ops += 1,
                    _ => errors += 1,
                }
            }
        }
    }
    Ok(LoadResult { ops, errors, elapsed: started.elapsed(), latency })
}
