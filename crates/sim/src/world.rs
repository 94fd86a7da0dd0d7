//! One simulated run: the event loop, the fault schedule, and the verdict.
//!
//! A run has three phases. **Load:** clients write and read stamped blocks
//! while the fault schedule crashes OSDs (process crash or power loss),
//! isolates them, or cuts them from the monitor or from one peer, one OSD
//! at a time, each fault healed after a seeded while. **Settle:** faults
//! stop, everything is healed and restarted, client operations finish (or
//! give up); the run waits until every OSD is up, leased and has its PGs
//! active. **Verify:** one client reads every block. The history then goes
//! to [`duplex_verify::check`]. A run that does not settle within its
//! limit fails too: liveness is part of the verdict.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;
use std::time::Instant;

use duplex_map::{Command, FailureConfig};
use duplex_store::PowerCut;
use duplex_verify::{check, BlockOp, History};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::client::{SimClient, CHUNK_POOL, DEDUP_BLOCKS_PER_OBJECT, POOL};
use crate::monitor::SimMonitor;
use crate::network::{InFlight, Lost, NetConfig, Network};
use crate::osd::{DedupCounts, SimOsd};
use crate::{Ctx, Msg, Node, Output, Timer};

/// Faults the schedule may inject.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// kill -9: the logs and the device's cache survive.
    Crash,
    /// The machine loses power: its `shm` logs and unflushed device writes are gone.
    PowerLoss,
    /// The machine loses power in the middle of a store commit (at the
    /// OSD's next device flush): what the device had not landed is lost or
    /// torn at sector boundaries, and the `shm` logs are gone.
    PowerLossInCommit,
    /// The OSD's host is cut from every other node.
    Isolate,
    /// The OSD can reach its peers and clients but not the monitor.
    CutFromMonitor,
    /// The OSD cannot reach one other OSD.
    CutPeer,
    /// An operator marks the OSD out (and in again when the fault ends):
    /// its PGs move to other OSDs, which are backfilled in the background
    /// while the client load runs, and back again.
    MarkOut,
}

impl FaultKind {
    /// The kind named `name` (as `--faults` spells it: `power-loss-in-commit`).
    pub fn parse(name: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|kind| kind.name() == name)
    }

    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Crash => "crash",
            FaultKind::PowerLoss => "power-loss",
            FaultKind::PowerLossInCommit => "power-loss-in-commit",
            FaultKind::Isolate => "isolate",
            FaultKind::CutFromMonitor => "cut-from-monitor",
            FaultKind::CutPeer => "cut-peer",
            FaultKind::MarkOut => "mark-out",
        }
    }

    /// The faults a run injects unless told otherwise. `mark-out` came
    /// later and is asked for by name: adding it here would change what
    /// every seed does, and the regression seeds would no longer replay
    /// the runs that found their bugs.
    pub const DEFAULT: &[FaultKind] = FaultKind::ALL.split_at(6).0;

    pub const ALL: [FaultKind; 7] = [
        FaultKind::Crash,
        FaultKind::PowerLoss,
        FaultKind::PowerLossInCommit,
        FaultKind::Isolate,
        FaultKind::CutFromMonitor,
        FaultKind::CutPeer,
        FaultKind::MarkOut,
    ];
}

#[derive(Clone, Debug)]
pub struct SimConfig {
    pub seed: u64,
    pub osds: u32,
    pub pool_size: u8,
    pub min_size: u8,
    pub pg_num: u32,
    pub clients: u32,
    /// Operations each client keeps in flight.
    pub slots: usize,
    /// Distinct 4 KiB blocks the clients share.
    pub blocks: u64,
    /// Virtual time of the load phase, in µs.
    pub load_us: u64,
    pub faults: Vec<FaultKind>,
    /// At most this many OSDs under a fault at once (1: faults come one at
    /// a time, as the seeds in CI were recorded with).
    pub concurrent_faults: usize,
    /// Between two faults (µs, a range).
    pub fault_gap_us: (u64, u64),
    /// How long a fault lasts before it is healed (µs, a range).
    pub fault_length_us: (u64, u64),
    pub net: NetConfig,
    pub failure: FailureConfig,
    /// Bytes of log per PG: small, so that logs fill and flushes interleave.
    pub log_bytes: u64,
    pub store_bytes: u64,
    /// A client operation not done after this long is given up (unknown outcome).
    pub give_up_us: u64,
    /// Settling and verifying must end within this much virtual time.
    pub settle_limit_us: u64,
    /// Where the stores and logs go (default: a new directory in /dev/shm, or the temp dir).
    pub dir: Option<PathBuf>,
    /// The OSDs report their usage and the monitor runs the balancer
    /// (duplex_map::balancer), which moves PGs by upmap under the faults.
    pub balancer: bool,
    /// Snapshots are taken under the load, every few seconds; writes carry
    /// the newest, and reads of the snapshots are checked (crate::client).
    pub snapshots: bool,
    /// The pool is erasure-coded, `(k, m)` with a 4 KiB stripe unit, and
    /// `pool_size` is ignored (`k + m` shards a PG): each client block is
    /// a stripe unit, so its writes are partial-stripe read-modify-writes.
    pub erasure: Option<(u8, u8)>,
    /// Each client block lives in its object's omap (key `b<offset>`, the
    /// stamped 4 KiB block as the value) instead of its data: omap sets
    /// and gets are logged, replicated, recovered and checked as the
    /// blocks are (issue 27's chunk maps live in omaps).
    pub omap: bool,
    /// The pool is deduplicated: a tier of 16 KiB chunks in a chunk pool
    /// (lz4), an engine on every OSD, objects of two chunks
    /// (`client::DEDUP_BLOCKS_PER_OBJECT`), and reads that follow evicted
    /// chunks. The hotness rule alternates with the seed: even seeds pass
    /// an object at once (a chunk is evicted by the pass after the one
    /// that put it, and writes meet evicted chunks all the time), odd ones
    /// after 300 ms.
    pub dedup: bool,
    /// How a deduplicated run's engines cut objects into chunks.
    pub chunking: duplex_map::Chunking,
    /// The pool is eventually consistent with this max_lag (ms): writes
    /// are acknowledged from their primary's log, and the checker's
    /// eventual mode judges the history (a failure may lose the writes
    /// acknowledged within max_lag of it, nothing else).
    pub eventual: Option<u32>,
    /// The OSDs' `--recovery-bytes-per-sec` (None: the default): a low
    /// one makes a backfill's locks wait in the flushers' device queues.
    pub recovery_bytes_per_sec: Option<u64>,
}

impl SimConfig {
    pub fn new(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            osds: 4,
            pool_size: 3,
            min_size: 2,
            pg_num: 8,
            clients: 3,
            slots: 2,
            blocks: 48,
            load_us: 30_000_000,
            faults: FaultKind::DEFAULT.to_vec(),
            concurrent_faults: 1,
            fault_gap_us: (500_000, 4_000_000),
            fault_length_us: (200_000, 12_000_000),
            net: NetConfig::default(),
            failure: FailureConfig { grace_ms: 6_000, down_out_interval_ms: 15_000, min_reporters: 2 },
            log_bytes: 64 << 10,
            store_bytes: 48 << 20,
            give_up_us: 40_000_000,
            settle_limit_us: 180_000_000,
            dir: None,
            balancer: false,
            snapshots: false,
            erasure: None,
            omap: false,
            dedup: false,
            chunking: duplex_map::Chunking::Fixed,
            eventual: None,
            recovery_bytes_per_sec: None,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RunReport {
    pub seed: u64,
    pub virtual_us: u64,
    pub events: u64,
    pub messages: u64,
    pub messages_lost: u64,
    pub acknowledged_writes: u64,
    pub unknown_writes: u64,
    pub reads: u64,
    pub faults: Vec<String>,
    /// An eventual run's: acknowledged writes a failure took, and the
    /// longest from such a write to the nearest failure (µs).
    pub rollbacks: u64,
    pub loss_window_us: u64,
    /// OSDs the monitor's failure detector marked down.
    pub marked_down: u64,
    /// Power cuts that fired in the middle of a store commit.
    pub power_cuts_in_commit: u64,
    /// Damaged object copies (blocks failing their checksum, torn by power
    /// cuts) the OSDs found while peering, which then copies a good one over.
    pub damaged_objects: u64,
    pub peerings: u64,
    pub recovered_objects: u64,
    /// Background backfill: PGs filled (by OSDs still running at the end),
    /// objects copied, and pins the monitor dropped after.
    pub backfilled_pgs: u64,
    pub backfill_objects: u64,
    /// Writes sent to backfill targets without their data (duplex_osd::pg::elide).
    pub elided_writes: u64,
    /// Background requests the flushers served after client work, and the
    /// times a primary's peering waited on its own flusher's device queue.
    pub background_requests: u64,
    pub local_waits: u64,
    pub pins_cleared: u64,
    /// PGs the balancer moved (runs that balance).
    pub balancer_moves: u64,
    /// Snapshots taken (runs with snapshots), and reads of them checked.
    pub snapshots: u64,
    pub snapshot_reads: u64,
    /// Members activated to be filled in the background (by OSDs still
    /// running at the end).
    pub background_fills: u64,
    /// PGs named in hand-overs the monitor took (a primary that needed a
    /// backfill gave the PG to a whole member).
    pub hand_overs: u64,
    /// Commands that recorded PGs' last active sets (each for one or more PGs).
    pub sets_recorded: u64,
    /// What the deduplication engines did (runs with `--dedup`).
    pub dedup: Option<DedupCounts>,
    /// A digest of every delivered message and the history: equal for equal seeds.
    pub digest: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum SimFailure {
    #[error("seed {seed}: the checker found {count} violations; first: {first}")]
    Violations {
        seed: u64,
        count: usize,
        /// The first violation's kind (`StaleRead`, `LostWrite`, ...).
        kind: String,
        first: String,
    },
    #[error("seed {seed}: the cluster did not settle by {at_us} µs ({why})")]
    Stuck { seed: u64, at_us: u64, why: String },
    #[error("seed {seed}: {message}")]
    Broken { seed: u64, message: String },
}

enum Event {
    Deliver {
        from: Node,
        to: Node,
        flight: InFlight,
        msg: Msg,
    },
    /// A connection between two OSDs broke: `node` (in `incarnation`)
    /// learns of it, as a socket error on its side.
    ConnectionBroke {
        node: u32,
        incarnation: u64,
        peer: u32,
        /// When it broke: requests sent later went over a new connection.
        at: u64,
    },
    /// `node` None: the world's own (faults).
    Timer {
        node: Option<Node>,
        incarnation: u64,
        timer: Timer,
    },
}

#[derive(PartialEq, Eq, PartialOrd, Ord, Clone, Copy, Debug)]
enum Phase {
    Load,
    Settle,
    Verify,
}

/// A fault in force on one OSD.
#[derive(Clone, Copy, Debug)]
enum Active {
    Down,
    /// Down after a power loss: its `shm` log is gone.
    PowerLost,
    Cut,
    /// A power cut armed at the OSD's next flush (it becomes `PowerLost` when it fires).
    PowerCutArmed,
    /// A power cut disarmed before it fired (an erasure-coded shard stopped
    /// being whole first): nothing left to heal.
    Disarmed,
    /// Marked out by the operator: marked in again when healed.
    Out,
}

struct World {
    config: SimConfig,
    rng: StdRng,
    now: u64,
    base: Instant,
    next_seq: u64,
    queue: BinaryHeap<Reverse<(u64, u64)>>,
    events: BTreeMap<u64, Event>,
    net: Network,
    monitor: SimMonitor,
    osds: Vec<SimOsd>,
    clients: Vec<SimClient>,
    faulty: BTreeMap<u32, (Active, Vec<Node>)>,
    faults: Vec<String>,
    /// When each fault began, when a power cut armed for a commit fired,
    /// and when a connection between OSDs broke (an eventual run's
    /// failures, on the clients' clock).
    failure_times: Vec<u64>,
    phase: Phase,
    settle_by: u64,
    digest: DefaultHasher,
    delivered: u64,
    power_cuts_in_commit: u64,
    /// Pins (temporary acting sets) dropped after their PG's backfill.
    pins_cleared: u64,
    hand_overs: u64,
    sets_recorded: u64,
    /// The monitor's balancer (only looks when the run balances).
    balancer: duplex_map::balancer::Balancer,
    balancer_moves: u64,
    /// Snapshots taken; the newest one's id.
    snapshots: u64,
    _dir: tempfile::TempDir,
}

/// Runs one seed to its verdict.
pub fn run(config: &SimConfig) -> Result<RunReport, SimFailure> {
    quiet_power_cuts();
    let seed = config.seed;
    let broken = |message: String| SimFailure::Broken { seed, message };
    let parent = config.dir.clone().unwrap_or_else(|| {
        let shm = PathBuf::from("/dev/shm");
        if shm.is_dir() {
            shm
        } else {
            std::env::temp_dir()
        }
    });
    let dir = tempfile::Builder::new()
        .prefix("duplex-sim-")
        .tempdir_in(&parent)
        .map_err(|e| broken(format!("making a directory in {}: {e}", parent.display())))?;
    let mut osds = Vec::new();
    for id in 0..config.osds {
        let mut osd =
            SimOsd::create(id, dir.path(), config.store_bytes).map_err(|e| broken(format!("osd.{id}: {e:#}")))?;
        osd.report_usage = config.balancer;
        osd.recovery_bytes_per_sec = config.recovery_bytes_per_sec;
        osds.push(osd);
    }
    let mut monitor = SimMonitor::new([7; 16], config.failure);
    if config.erasure.is_some() {
        // An erasure-coded pool needs its hosts known: the OSDs are in the
        // map (down) before they start, as an operator's would be.
        for id in 0..config.osds {
            monitor.boot(id);
            monitor.run(&Command::MarkDown { id });
        }
    }
    let created = match config.erasure {
        Some((k, m)) => monitor.run(&Command::PoolCreateErasure {
            name: POOL.into(),
            code: duplex_map::ErasureCode { k, m, stripe_unit: 4096 },
            min_size: Some(config.min_size.max(k)),
            pg_num: config.pg_num,
        }),
        None => match config.eventual {
            Some(max_lag_ms) => monitor.run(&Command::PoolCreateEventual {
                name: POOL.into(),
                size: config.pool_size,
                min_size: config.min_size,
                pg_num: config.pg_num,
                eventual: duplex_map::Eventual { max_lag_ms },
            }),
            None => monitor.run(&Command::PoolCreate {
                name: POOL.into(),
                size: config.pool_size,
                min_size: config.min_size,
                pg_num: config.pg_num,
            }),
        },
    };
    if !created {
        return Err(broken(format!("the monitor refused the pool of {config:?}")));
    }
    if config.dedup {
        if config.erasure.is_some() || config.omap {
            return Err(broken("a deduplicated run has a replicated pool and no omap blocks".into()));
        }
        monitor.run(&Command::PoolCreateChunks {
            name: CHUNK_POOL.into(),
            size: config.pool_size,
            min_size: config.min_size,
            pg_num: config.pg_num,
            store: duplex_map::ChunkStore::default(),
        });
        monitor.run(&Command::PoolSetTier {
            name: POOL.into(),
            chunk_pool: CHUNK_POOL.into(),
            chunk_size: 16 << 10,
            chunking: config.chunking,
        });
        let cold_after = std::time::Duration::from_millis(if seed.is_multiple_of(2) { 0 } else { 300 });
        for osd in &mut osds {
            osd.dedup_cold_after = Some(cold_after);
        }
    }
    let verifier_id = config.clients;
    let clients = (0..=config.clients)
        .map(|id| {
            let mut client = SimClient::new(id, config.blocks, config.give_up_us);
            client.omap = config.omap;
            client.dedup = config.dedup;
            if config.dedup {
                client.blocks_per_object = DEDUP_BLOCKS_PER_OBJECT;
            }
            client
        })
        .collect();
    let mut world = World {
        config: config.clone(),
        rng: StdRng::seed_from_u64(seed),
        now: 0,
        base: Instant::now(),
        next_seq: 0,
        queue: BinaryHeap::new(),
        events: BTreeMap::new(),
        net: Network::new(config.net),
        monitor,
        osds,
        clients,
        faulty: BTreeMap::new(),
        faults: Vec::new(),
        failure_times: Vec::new(),
        phase: Phase::Load,
        settle_by: u64::MAX,
        digest: DefaultHasher::new(),
        delivered: 0,
        power_cuts_in_commit: 0,
        pins_cleared: 0,
        hand_overs: 0,
        sets_recorded: 0,
        balancer: Default::default(),
        balancer_moves: 0,
        snapshots: 0,
        _dir: dir,
    };
    for id in 0..config.osds {
        world.start_osd(id)?;
    }
    // The monitor's own timers (a world timer would never reach it).
    world.schedule(Some(Node::Monitor), 0, 100_000, Timer::MonitorTick);
    world.schedule(Some(Node::Monitor), 0, 500_000, Timer::MonitorGossip);
    world.schedule(None, 0, 1_000_000, Timer::Fault);
    if config.snapshots {
        world.schedule(None, 0, 5_000_000, Timer::Snapshot);
    }
    for id in 0..config.clients {
        let mut ctx = world.ctx(3_000_000);
        let client = &mut world.clients[id as usize];
        client.start(&mut ctx, &mut world.rng, config.slots);
        world.apply(Node::Client(id), ctx.out);
    }
    let load_end = config.load_us + 3_000_000;
    while let Some(Reverse((at, seq))) = world.queue.pop() {
        let event = world.events.remove(&seq).expect("every queued event is stored");
        world.now = at;
        if world.phase == Phase::Load && at >= load_end {
            world.end_load();
        }
        if world.now > world.settle_by {
            let why = world.unsettled();
            return Err(SimFailure::Stuck { seed, at_us: world.now, why });
        }
        world.dispatch(event)?;
        match world.phase {
            Phase::Settle if world.settled() => {
                world.phase = Phase::Verify;
                let mut ctx = world.ctx(0);
                world.clients[verifier_id as usize].verify_all(&mut ctx);
                world.apply(Node::Client(verifier_id), ctx.out);
            }
            Phase::Verify if world.clients[verifier_id as usize].final_pass_done() => break,
            _ => {}
        }
    }
    if world.phase != Phase::Verify || !world.clients[verifier_id as usize].final_pass_done() {
        return Err(SimFailure::Stuck { seed, at_us: world.now, why: "the event queue ran dry".into() });
    }
    world.verdict()
}

/// A simulated power cut unwinds the OSD's stack with a [`PowerCut`]
/// payload, which the world catches: the default panic hook would print it
/// as a crash. Other panics are reported as before.
fn quiet_power_cuts() {
    static INSTALL: std::sync::Once = std::sync::Once::new();
    INSTALL.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !info.payload().is::<PowerCut>() {
                previous(info);
            }
        }));
    });
}

impl World {
    fn ctx(&self, delay: u64) -> Ctx {
        Ctx { now: self.now + delay, base: self.base, out: Vec::new() }
    }

    fn schedule(&mut self, node: Option<Node>, incarnation: u64, after: u64, timer: Timer) {
        self.push(self.now + after, Event::Timer { node, incarnation, timer });
    }

    fn push(&mut self, at: u64, event: Event) {
        self.next_seq += 1;
        self.queue.push(Reverse((at, self.next_seq)));
        self.events.insert(self.next_seq, event);
    }

    fn incarnation(&self, node: Node) -> u64 {
        match node {
            Node::Osd(id) => self.osds[id as usize].incarnation,
            _ => 0,
        }
    }

    /// Carries out what a node's handler asked for.
    fn apply(&mut self, from: Node, outputs: Vec<Output>) {
        for output in outputs {
            match output {
                Output::Send { to, msg } => {
                    match self.net.send(&mut self.rng, self.now, from, to) {
                        Ok(flight) => self.push(flight.arrives, Event::Deliver { from, to, flight, msg }),
                        Err(Lost::ConnectionBroke) => {
                            // Between OSDs, both ends see the reset (clients
                            // and monitors resend on their own timers).
                            if let (Node::Osd(a), Node::Osd(b)) = (from, to) {
                                let (at, heard) = (self.now, self.now + self.net.config.max_delay_us);
                                // A replication stream's reset is a failure an
                                // eventual pool's writes in flight may be lost to.
                                self.failure_times.push(at);
                                for (node, peer) in [(a, b), (b, a)] {
                                    let incarnation = self.incarnation(Node::Osd(node));
                                    self.push(heard, Event::ConnectionBroke { node, incarnation, peer, at });
                                }
                            }
                        }
                        Err(Lost::Cut) => {}
                    }
                }
                Output::Timer { at, timer } => {
                    let incarnation = self.incarnation(from);
                    self.push(at.max(self.now), Event::Timer { node: Some(from), incarnation, timer });
                }
                Output::Disconnect { peer } => self.net.break_pair(from, peer),
            }
        }
    }

    fn start_osd(&mut self, id: u32) -> Result<(), SimFailure> {
        let disk_seed = self.rng.gen::<u64>();
        let mut ctx = self.ctx(0);
        let log_bytes = self.config.log_bytes;
        self.osds[id as usize]
            .start(&mut ctx, disk_seed, log_bytes)
            .map_err(|e| SimFailure::Broken { seed: self.config.seed, message: format!("starting osd.{id}: {e:#}") })?;
        self.apply(Node::Osd(id), ctx.out);
        Ok(())
    }

    fn broadcast_map(&mut self) {
        let map = self.monitor.map.clone();
        let mut ctx = self.ctx(0);
        for id in 0..self.config.osds {
            ctx.send(Node::Osd(id), Msg::Map(map.clone()));
        }
        for id in 0..self.clients.len() as u32 {
            ctx.send(Node::Client(id), Msg::Map(map.clone()));
        }
        self.apply(Node::Monitor, ctx.out);
    }

    fn dispatch(&mut self, event: Event) -> Result<(), SimFailure> {
        match event {
            Event::Deliver { from, to, flight, msg } => {
                if !self.net.arrives(&flight) {
                    return Ok(());
                }
                self.delivered += 1;
                (self.now, from, to, kind_of(&msg)).hash(&mut self.digest);
                self.deliver(from, to, msg)?;
            }
            Event::ConnectionBroke { node, incarnation, peer, at } => {
                let osd = &self.osds[node as usize];
                if osd.is_live() && osd.incarnation == incarnation {
                    let mut ctx = self.ctx(0);
                    self.osd_call(node, &mut ctx, |osd, ctx| osd.on_connection_broke(ctx, peer, at))?;
                    self.apply(Node::Osd(node), ctx.out);
                }
            }
            Event::Timer { node: None, timer, .. } => self.world_timer(timer)?,
            Event::Timer { node: Some(node), incarnation, timer } => {
                let mut ctx = self.ctx(0);
                match node {
                    Node::Monitor => {
                        let changed = match timer {
                            Timer::MonitorTick => {
                                ctx.timer(self.now + 100_000, Timer::MonitorTick);
                                let mut changed = self.monitor.tick(self.now);
                                let moves = if self.config.balancer {
                                    self.balancer.look(&self.monitor.map, self.now / 1000)
                                } else {
                                    None
                                };
                                if let Some(moves) = moves {
                                    tracing::debug!(at = self.now, ?moves, "the balancer moves PGs");
                                    self.balancer_moves += moves.len() as u64;
                                    changed |= self.monitor.run(&duplex_map::balancer::command(&moves));
                                }
                                changed
                            }
                            Timer::MonitorGossip => {
                                // Repeats the map, as the real monitor answers
                                // subscriptions: a map lost in flight still arrives.
                                ctx.timer(self.now + 500_000, Timer::MonitorGossip);
                                true
                            }
                            other => panic!("the monitor has no timer {other:?}"),
                        };
                        if changed {
                            self.broadcast_map();
                        }
                    }
                    Node::Osd(id) => {
                        let osd = &self.osds[id as usize];
                        if osd.is_live() && osd.incarnation == incarnation {
                            self.osd_call(id, &mut ctx, |osd, ctx| osd.on_timer(ctx, timer))?;
                        }
                    }
                    Node::Client(id) => self.clients[id as usize].on_timer(&mut ctx, &mut self.rng, timer),
                }
                self.apply(node, ctx.out);
            }
        }
        Ok(())
    }

    fn deliver(&mut self, from: Node, to: Node, msg: Msg) -> Result<(), SimFailure> {
        let mut ctx = self.ctx(0);
        match to {
            Node::Monitor => match (from, msg) {
                (Node::Osd(id), Msg::Boot) => {
                    if self.monitor.boot(id) {
                        self.broadcast_map();
                    }
                    ctx.send(from, Msg::Booted);
                    ctx.send(from, Msg::Map(self.monitor.map.clone()));
                }
                (Node::Osd(id), Msg::Heartbeat { sent }) => {
                    let lease_us = self.monitor.heartbeat(id, self.now);
                    ctx.send(from, Msg::Lease { sent, lease_us });
                }
                (Node::Osd(id), Msg::Usage(usage)) => {
                    self.balancer.report(&self.monitor.map, id, usage, self.now / 1000)
                }
                (Node::Osd(_), Msg::Command(command)) => {
                    tracing::debug!(at = self.now, ?command, "command from an OSD");
                    if self.monitor.run(&command) {
                        match command {
                            Command::ClearPgTemp { .. } => self.pins_cleared += 1,
                            Command::HandOver { pgs, .. } => self.hand_overs += pgs.len() as u64,
                            Command::RecordActive { .. } => self.sets_recorded += 1,
                            _ => {}
                        }
                        self.broadcast_map();
                    }
                }
                (from, msg) => panic!("the monitor got {msg:?} from {from:?}"),
            },
            Node::Osd(id) => {
                if self.osds[id as usize].is_live() {
                    self.osd_call(id, &mut ctx, |osd, ctx| osd.on_message(ctx, from, msg))?;
                }
            }
            Node::Client(id) => {
                let client = &mut self.clients[id as usize];
                match msg {
                    Msg::Map(map) => client.on_map(map),
                    Msg::Frame(frame) => client.on_frame(&mut ctx, &mut self.rng, frame),
                    other => panic!("client.{id} got {other:?}"),
                }
            }
        }
        self.apply(to, ctx.out);
        Ok(())
    }

    fn world_timer(&mut self, timer: Timer) -> Result<(), SimFailure> {
        match timer {
            Timer::Fault => {
                if self.phase != Phase::Load {
                    return Ok(());
                }
                if self.faulty.len() < self.config.concurrent_faults && !self.config.faults.is_empty() {
                    self.inject()?;
                }
                let (low, high) = self.config.fault_gap_us;
                let gap = self.rng.gen_range(low..=high);
                self.schedule(None, 0, gap, Timer::Fault);
            }
            Timer::Recover { osd } => self.recover(osd)?,
            Timer::Snapshot => {
                if self.phase != Phase::Load {
                    return Ok(());
                }
                // Every writer adopts it at once: what `snap create` waits for.
                self.snapshots += 1;
                tracing::debug!(at = self.now, id = self.snapshots, "snapshot");
                for client in &mut self.clients {
                    client.take_snapshot(self.snapshots, self.now);
                }
                let gap = self.rng.gen_range(2_000_000..=8_000_000);
                self.schedule(None, 0, gap, Timer::Snapshot);
            }
            // A node's timer scheduled as the world's would silently never
            // fire (the monitor once never ticked that way): fail loudly.
            other => panic!("{other:?} is a node's timer, scheduled as the world's"),
        }
        Ok(())
    }

    fn inject(&mut self) -> Result<(), SimFailure> {
        let kind = self.config.faults[self.rng.gen_range(0..self.config.faults.len())];
        let id = self.rng.gen_range(0..self.config.osds);
        if self.faulty.contains_key(&id) {
            return Ok(()); // one fault per OSD at a time
        }
        // Two OSDs' `shm` logs lost at once is a power loss of the cluster
        // for the PGs they share: that log mode promises nothing then. A
        // power fault only comes alone.
        let power = |active: &Active| matches!(active, Active::PowerLost | Active::PowerCutArmed);
        let power_kind = matches!(kind, FaultKind::PowerLoss | FaultKind::PowerLossInCommit);
        if self.faulty.values().any(|(active, _)| power(active)) || (power_kind && !self.faulty.is_empty()) {
            return Ok(());
        }
        // An erasure-coded shard that missed writes (its OSD was down or
        // cut off) or lost its log counts as lost until it is rebuilt: a
        // power loss before that loses a second shard's newest state, past
        // what a 2+1 pool (m = 1) promises with `shm` logs, and the PG
        // rightly waits for good (docs/OSD.md). So for such a pool a power
        // fault comes only when every PG is active on the current map with
        // every OSD up: each shard rebuilt.
        // (A cut armed for a commit is disarmed if a shard stops being
        // whole before the commit comes: `disarm_cuts_past_erasure_margin`.)
        if power_kind && self.config.erasure.is_some() && !self.erasure_shards_whole() {
            return Ok(());
        }
        let node = Node::Osd(id);
        let (low, high) = self.config.fault_length_us;
        let length = self.rng.gen_range(low..=high);
        let seed = self.config.seed;
        let others: Vec<Node> = (0..self.config.osds)
            .filter(|o| *o != id)
            .map(Node::Osd)
            .chain((0..self.clients.len() as u32).map(Node::Client))
            .chain([Node::Monitor])
            .collect();
        let (active, cut) = match kind {
            FaultKind::Crash | FaultKind::PowerLoss => {
                let power = kind == FaultKind::PowerLoss;
                self.osds[id as usize]
                    .crash(power)
                    .map_err(|e| SimFailure::Broken { seed, message: format!("crashing osd.{id}: {e:#}") })?;
                self.net.break_node(node);
                (if power { Active::PowerLost } else { Active::Down }, Vec::new())
            }
            FaultKind::PowerLossInCommit => {
                if !self.osds[id as usize].arm_power_cut() {
                    return Ok(());
                }
                (Active::PowerCutArmed, Vec::new())
            }
            FaultKind::Isolate => (Active::Cut, others),
            FaultKind::CutFromMonitor => (Active::Cut, vec![Node::Monitor]),
            FaultKind::CutPeer => {
                let peers: Vec<u32> = (0..self.config.osds).filter(|o| *o != id).collect();
                let peer = peers[self.rng.gen_range(0..peers.len())];
                (Active::Cut, vec![Node::Osd(peer)])
            }
            FaultKind::MarkOut => {
                if !self.monitor.map.osds.contains_key(&id) {
                    return Ok(()); // not booted yet
                }
                if self.monitor.run(&Command::MarkOut { id }) {
                    self.broadcast_map();
                }
                (Active::Out, Vec::new())
            }
        };
        for other in &cut {
            self.net.cut(node, *other);
        }
        self.faults.push(format!(
            "{:.3}s {kind:?} osd.{id} for {:.3}s {cut:?}",
            self.now as f64 / 1e6,
            length as f64 / 1e6
        ));
        tracing::info!(at = self.now, ?kind, osd = id, length, "fault");
        self.failure_times.push(self.now);
        self.faulty.insert(id, (active, cut));
        self.schedule(None, 0, length, Timer::Recover { osd: id });
        Ok(())
    }

    /// Every PG active on the current map, with every OSD up and in and
    /// no hole in any active set: every erasure-coded shard whole.
    fn erasure_shards_whole(&self) -> bool {
        let map = &self.monitor.map;
        map.osds.values().all(|o| o.up && o.is_in)
            && map.active_sets.values().all(|set| !set.osds.contains(&duplex_map::NO_OSD))
            && self.osds.iter().all(|o| o.pgs_active_at(map.epoch, self.now))
    }

    /// An erasure-coded pool: a power cut armed for an OSD's next commit
    /// is disarmed if a shard stopped being whole before that commit came
    /// (the reason `inject` waits for whole shards). Checked before each
    /// call into the armed OSD, the only place the cut fires.
    fn disarm_cuts_past_erasure_margin(&mut self) {
        if self.config.erasure.is_none() {
            return;
        }
        let armed: Vec<u32> =
            self.faulty.iter().filter(|(_, (a, _))| matches!(a, Active::PowerCutArmed)).map(|(id, _)| *id).collect();
        if armed.is_empty() || self.erasure_shards_whole() {
            return;
        }
        for id in armed {
            tracing::info!(at = self.now, osd = id, "a shard is being rebuilt: the armed power cut is disarmed");
            self.osds[id as usize].disarm_power_cut();
            if let Some((active, _)) = self.faulty.get_mut(&id) {
                *active = Active::Disarmed;
            }
        }
    }

    fn recover(&mut self, id: u32) -> Result<(), SimFailure> {
        let Some((active, cut)) = self.faulty.remove(&id) else { return Ok(()) };
        for other in cut {
            self.net.heal(Node::Osd(id), other);
        }
        match active {
            Active::Down | Active::PowerLost => self.start_osd(id)?,
            Active::PowerCutArmed => self.osds[id as usize].disarm_power_cut(),
            Active::Cut | Active::Disarmed => {}
            Active::Out => {
                if self.monitor.run(&Command::MarkIn { id }) {
                    self.broadcast_map();
                }
            }
        }
        Ok(())
    }

    /// Runs `call` on OSD `id`; if its device's power cut fires inside (the
    /// store unwinds with [`PowerCut`]), the OSD goes down as in a power
    /// loss, with the device's cache torn. What the OSD sent before the cut
    /// was sent.
    fn osd_call(&mut self, id: u32, ctx: &mut Ctx, call: impl FnOnce(&mut SimOsd, &mut Ctx)) -> Result<(), SimFailure> {
        if matches!(self.faulty.get(&id), Some((Active::PowerCutArmed, _))) {
            self.disarm_cuts_past_erasure_margin();
        }
        let osd = &mut self.osds[id as usize];
        // Every log line the OSD's code writes names the simulated OSD.
        let span = tracing::info_span!("osd", id).entered();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| call(osd, ctx)));
        drop(span);
        let Err(payload) = outcome else { return Ok(()) };
        if !payload.is::<PowerCut>() {
            std::panic::resume_unwind(payload);
        }
        let seed = self.config.seed;
        // A cut is armed only as a fault, whose entry stays until it is healed.
        let Some((active @ Active::PowerCutArmed, _)) = self.faulty.get_mut(&id) else {
            return Err(SimFailure::Broken { seed, message: format!("osd.{id} lost power with no power cut armed") });
        };
        *active = Active::PowerLost;
        tracing::info!(at = self.now, osd = id, "the power went in the middle of a store commit");
        self.power_cuts_in_commit += 1;
        self.failure_times.push(self.now);
        self.osds[id as usize]
            .crash(true)
            .map_err(|e| SimFailure::Broken { seed, message: format!("cutting the power of osd.{id}: {e:#}") })?;
        self.net.break_node(Node::Osd(id));
        Ok(())
    }

    fn end_load(&mut self) {
        self.phase = Phase::Settle;
        self.settle_by = self.now + self.config.settle_limit_us;
        let faulty: Vec<u32> = self.faulty.keys().copied().collect();
        for id in faulty {
            // Errors surface as an unsettled cluster.
            if let Err(err) = self.recover(id) {
                tracing::error!(%err, "recovering at the end of the load");
            }
        }
        self.net.heal_all();
        for client in &mut self.clients {
            client.stopped = true;
        }
    }

    fn settled(&self) -> bool {
        self.clients.iter().all(|c| c.in_flight() == 0)
            && self.monitor.map.osds.values().all(|o| o.up && o.is_in)
            // Every backfill ran to its end and the up sets serve.
            && self.monitor.map.pg_temp.is_empty()
            && self.osds.iter().all(|o| o.is_settled(self.now))
    }

    fn unsettled(&self) -> String {
        let busy: Vec<u32> = self.clients.iter().filter(|c| c.in_flight() > 0).map(|c| c.id).collect();
        let down: Vec<u32> = self.monitor.map.osds.values().filter(|o| !o.up || !o.is_in).map(|o| o.id).collect();
        let unsettled: Vec<u32> = self.osds.iter().filter(|o| !o.is_settled(self.now)).map(|o| o.id).collect();
        let pinned: Vec<&(u32, u32)> = self.monitor.map.pg_temp.keys().collect();
        // A final-pass read that failed is tried again, and may never
        // end: what it met says why.
        let errors: Vec<&String> = self.clients.iter().flat_map(|c| c.errors.iter()).take(3).collect();
        format!(
            "phase {:?}; clients busy {busy:?}; OSDs down or out {down:?}; OSDs not settled {unsettled:?}; PGs pinned {pinned:?}; client errors {errors:?}",
            self.phase
        )
    }

    /// Adds the reads at snapshots to `history`, each as a read over its
    /// snapshot's span (taken, to adopted by the last client); returns the
    /// snapshot reads that saw a write made under that snapshot or later.
    fn snapshot_reads(&self, history: &mut History) -> Vec<String> {
        let mut errors = Vec::new();
        let Some(verifier) = self.clients.last() else { return errors };
        for client in &self.clients {
            for read in &client.snap_reads {
                let taken = verifier.snapshots[&read.snap].0;
                let adopted = self
                    .clients
                    .iter()
                    .map(|c| c.snapshots.get(&read.snap).and_then(|(_, at)| *at).unwrap_or(self.now))
                    .max()
                    .unwrap_or(self.now);
                if let Ok(Some(stamp)) = &read.result {
                    let under = self.clients.get(stamp.writer as usize).and_then(|w| w.write_snaps.get(&stamp.seq));
                    if under.is_some_and(|under| *under >= read.snap) {
                        errors.push(format!(
                            "block {}: snapshot {} holds write {}/{}, made under snapshot {}",
                            read.block,
                            read.snap,
                            stamp.writer,
                            stamp.seq,
                            under.copied().unwrap_or(0)
                        ));
                    }
                }
                history.ops.push(BlockOp::Read {
                    block: read.block,
                    result: read.result.clone(),
                    invoked: taken + 1,
                    completed: adopted + 1,
                    final_check: false,
                });
            }
        }
        errors
    }

    fn verdict(self) -> Result<RunReport, SimFailure> {
        let seed = self.config.seed;
        let mut errors = Vec::new();
        let mut history = History::default();
        for client in &self.clients {
            errors.extend(client.errors.iter().cloned());
            history.ops.extend(client.history.iter().cloned());
        }
        errors.extend(self.snapshot_reads(&mut history));
        if let Some(first) = errors.first() {
            return Err(SimFailure::Broken {
                seed,
                message: format!("{} client errors; first: {first}", errors.len()),
            });
        }
        let report = match self.config.eventual {
            None => check(&history),
            Some(max_lag_ms) => {
                // A reply's trip to its client comes on top of the lag
                // (the simulated network's latency, resends after a loss).
                let net = &self.config.net;
                let slack = 2 * (net.max_delay_us + net.spike_max_us);
                let bounds = duplex_verify::EventualBounds {
                    failures: self.failure_times.clone(),
                    max_lag: u64::from(max_lag_ms) * 1000 + slack,
                };
                duplex_verify::check_eventual(&history, &bounds)
            }
        };
        if !report.is_ok() {
            return Err(SimFailure::Violations {
                seed,
                count: report.violations.len(),
                kind: format!("{:?}", report.violations[0].kind),
                first: format!("{:?}", report.violations[0]),
            });
        }
        let mut digest = self.digest;
        format!("{:?}", history.ops).hash(&mut digest);
        let (peerings, recovered_objects) =
            self.osds.iter().map(|o| o.activations()).fold((0, 0), |(a, b), (c, d)| (a + c, b + d));
        let (backfilled_pgs, backfill_objects, elided_writes, background_requests, local_waits) = self
            .osds
            .iter()
            .map(|o| o.backfills())
            .fold((0, 0, 0, 0, 0), |(a, b, c, d, e), (f, g, h, i, j)| (a + f, b + g, c + h, d + i, e + j));
        let writers = &self.clients[..self.clients.len() - 1];
        Ok(RunReport {
            backfilled_pgs,
            backfill_objects,
            elided_writes,
            background_requests,
            local_waits,
            pins_cleared: self.pins_cleared,
            balancer_moves: self.balancer_moves,
            snapshots: self.snapshots,
            snapshot_reads: self.clients.iter().map(|c| c.snapshot_reads).sum(),
            hand_overs: self.hand_overs,
            background_fills: self.osds.iter().map(|o| o.background_fills()).sum(),
            sets_recorded: self.sets_recorded,
            seed,
            virtual_us: self.now,
            events: self.next_seq,
            messages: self.net.sent,
            messages_lost: self.net.lost,
            acknowledged_writes: writers.iter().map(|c| c.acknowledged).sum(),
            unknown_writes: writers.iter().map(|c| c.unknown).sum(),
            reads: self.clients.iter().map(|c| c.reads).sum(),
            faults: self.faults,
            rollbacks: report.rollbacks as u64,
            loss_window_us: report.loss_window,
            marked_down: self.monitor.marked_down,
            power_cuts_in_commit: self.power_cuts_in_commit,
            damaged_objects: self.osds.iter().map(SimOsd::damaged_objects).sum(),
            peerings,
            recovered_objects,
            dedup: self.config.dedup.then(|| {
                let mut counts = DedupCounts::default();
                for osd in &self.osds {
                    counts.add(osd.dedup_counts());
                }
                counts
            }),
            digest: digest.finish(),
        })
    }
}

fn kind_of(msg: &Msg) -> (u8, u64) {
    match msg {
        Msg::Frame(frame) => (frame.header.message_type, frame.header.transaction_id),
        Msg::Heartbeat { sent } => (200, *sent),
        Msg::Lease { lease_us, .. } => (201, *lease_us),
        Msg::Boot => (202, 0),
        Msg::Booted => (203, 0),
        Msg::Map(map) => (204, map.epoch),
        Msg::Command(_) => (205, 0),
        Msg::Usage(usage) => (206, usage.used_permille),
    }
}
