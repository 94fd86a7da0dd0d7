//! # duplex-sim: the cluster in one thread, on a seeded clock
//!
//! A deterministic simulator in the way of FoundationDB's and TigerBeetle's:
//! several OSDs, a monitor and clients run in one thread, every message
//! goes over a modelled network ([`network`]: delay, reordering across
//! connections, loss, partitions), every store sits behind a modelled disk
//! (`duplex_store::faults`: a volatile write cache that writes back early
//! in a seeded order; a crash loses what was not flushed on a power loss),
//! and time is virtual. Everything random comes from one seed, so a
//! failing seed replays exactly: `duplex-sim --seed N`.
//!
//! What runs is the product's own logic, not a model of it:
//! - the OSD's operations ([`duplex_osd::io::ops::client_op`],
//!   [`duplex_osd::io::ops::replica_op`], [`duplex_osd::io::ops::finish_write`])
//!   and its PG backend ([`duplex_osd::backend`]), its PG logs and request
//!   tables ([`duplex_osd::pg`]), its table of writes waiting for replicas
//!   ([`duplex_osd::io::pending`]), its flusher and member side of peering
//!   ([`duplex_osd::flusher::Flusher`]), its peering machines and the
//!   schedule that runs them ([`duplex_osd::peering`]) and its log replay
//!   at start;
//! - the store, over a real (tmpfs) file;
//! - the monitor's map commands and failure detector with leases
//!   ([`duplex_map`]).
//!
//! What the simulator supplies instead of the product: the threads and
//! sockets (a client op goes straight to `client_op`; a reply frame from
//! a flusher's mailbox goes on the modelled network), the clock under the
//! schedulers (the peering thread's blocking requests become messages and
//! a deadline), Raft (one monitor), and the client (retries with the same
//! request id, like the real one). It keeps no copy of an OSD scheduler:
//! a seed fails when the OSD's own is wrong.
//!
//! Each run is judged by [`duplex_verify::check`], the checker of the real
//! fault tests: every acknowledged write readable at the end, no stale
//! read, no torn or phantom block.

pub mod client;
pub mod monitor;
pub mod network;
pub mod osd;
pub mod world;

use std::sync::Arc;

use duplex_map::ClusterMap;
use duplex_proto::Frame;

pub use world::{run, FaultKind, RunReport, SimConfig, SimFailure};

/// A simulated process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Node {
    Monitor,
    Osd(u32),
    Client(u32),
}

/// What travels between nodes.
#[derive(Clone, Debug)]
pub enum Msg {
    /// OSD traffic in its wire encoding: client ops and replies,
    /// replication, peering.
    Frame(Frame),
    /// OSD → monitor, sent at `sent` (virtual µs).
    Heartbeat { sent: u64 },
    /// Monitor → OSD: a lease of `lease_us` counted from the heartbeat's send (0: none).
    Lease { sent: u64, lease_us: u64 },
    /// OSD → monitor: register this (new) incarnation.
    Boot,
    /// Monitor → OSD: the boot was applied.
    Booted,
    /// Monitor → everyone: the current map.
    Map(Arc<ClusterMap>),
    /// OSD → monitor: a map command (a backfilled PG's pin to drop).
    Command(duplex_map::Command),
    /// OSD → monitor: what its store holds, for the balancer (only when
    /// the run balances).
    Usage(duplex_map::balancer::OsdUsage),
}

/// Timers; an OSD's carry its incarnation (a restarted OSD ignores the old ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Timer {
    OsdTick,
    OsdHeartbeat,
    /// The flusher's deadline.
    OsdFlush,
    /// Backfill may go on (a lock retry or a full target's wait is due), or
    /// the own flusher answered the peering thread.
    OsdBackfill,
    MonitorTick,
    MonitorGossip,
    /// A client's worker `slot` issues its next operation.
    ClientNext {
        slot: usize,
    },
    /// A client resends request `tid` unless it finished or was resent since (`attempt`).
    ClientResend {
        tid: u64,
        attempt: u32,
    },
    /// The fault schedule's next step.
    Fault,
    /// Bring OSD `osd` back (after a crash) or heal it (after a partition).
    Recover {
        osd: u32,
    },
    /// Take the next snapshot (runs with snapshots).
    Snapshot,
    /// An OSD's deduplication engine looks for work (runs with `--dedup`).
    EngineTurn,
    /// The engine resends request `tid` unless it was answered or resent since.
    EngineResend {
        tid: u64,
        attempt: u32,
    },
}

/// What a node's handler asks the world to do.
#[derive(Debug)]
pub enum Output {
    Send {
        to: Node,
        msg: Msg,
    },
    /// Fire `timer` at virtual time `at`.
    Timer {
        at: u64,
        timer: Timer,
    },
    /// Drop the connections to `peer` (it sent something invalid).
    Disconnect {
        peer: Node,
    },
}

/// A node's view of the world while it handles one event.
pub struct Ctx {
    pub now: u64,
    /// The wall-clock instant virtual time 0 maps to: the OSD code keeps
    /// its deadlines as `Instant`s, and gets `base + now` as its clock.
    pub base: std::time::Instant,
    pub out: Vec<Output>,
}

impl Ctx {
    pub fn instant(&self) -> std::time::Instant {
        self.base + std::time::Duration::from_micros(self.now)
    }

    pub fn send(&mut self, to: Node, msg: Msg) {
        self.out.push(Output::Send { to, msg });
    }

    pub fn timer(&mut self, at: u64, timer: Timer) {
        self.out.push(Output::Timer { at, timer });
    }
}
