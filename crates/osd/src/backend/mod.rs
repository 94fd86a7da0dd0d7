//! The PG backend seam, as Ceph has it (`PGBackend`: `ReplicatedBackend`,
//! `ECBackend`): the steps of a PG's I/O, peering and recovery that differ
//! by pool kind sit behind one trait, [`PgBackend`], so that an
//! erasure-coded or an eventually consistent pool is a new implementation,
//! not branches through the I/O path.
//!
//! - [`replicated`]: every member holds the whole object.
//! - [`erasure`]: each member holds one shard of every object (an
//!   erasure-coded pool).
//! - [`eventual`]: replicated, but a write is acknowledged from the
//!   primary's log and reaches the replicas in the background (an eventual
//!   pool).
//! - [`write_path`]: inside the replicated backend, the write-path ablation
//!   (`oplog`, `sync`, `ideal`) as a seam of its own.
//! - [`common`]: what every backend's operations share.
//!
//! [`for_pool`] is the one place that picks a backend. Admission (lease,
//! map, primary, limits) stays in [`crate::io::ops`], before the backend
//! is asked; the peering schedule asks the backend for the machine that
//! peers a PG ([`PeeringBackend`]).

use bytes::Bytes;
use duplex_map::Pool;
use duplex_oplog::RequestId;
use duplex_proto::osd::OpReply;

use crate::backend::common::Interval;
use crate::backend::replicated::Replicated;
use crate::backend::write_path::{Ideal, Logged, SyncApply};
use crate::config::WritePath;
use crate::messages::{ClientOp, Outcome};
use crate::metrics::Histograms;
use crate::peering::schedule::PeeringBackend;
use crate::pg::{ReplyTo, SharedPg};
use crate::shared::Shared;

pub mod common;
pub mod erasure;
pub mod eventual;
pub mod replicated;
pub mod write_path;

/// A client operation admitted at a PG's primary: where it runs.
pub struct Primary<'a> {
    pub shared: &'a Shared,
    pub histograms: &'a Histograms,
    pub pg: &'a SharedPg,
    pub(crate) interval: Interval<'a>,
    pub key: u32,
    /// The map epoch the operation is answered under.
    pub epoch: u64,
    /// An erasure-coded mutation whose turn came: it holds its object
    /// already (`crate::pg::object_queue`).
    pub resumed: bool,
    /// The pool's deduplication tier (`crate::tier`), if it has one.
    pub tier: Option<duplex_map::DedupTier>,
    /// An eventual pool's setting.
    pub eventual: Option<duplex_map::Eventual>,
}

/// A replicated write's end at its primary: every replica answered, or it
/// was given up on.
#[derive(Clone, Copy, Debug)]
pub struct WriteEnd {
    pub pg: u32,
    pub write: u64,
    pub request: RequestId,
    /// The map epoch the write was admitted under.
    pub map_epoch: u64,
    /// A replica failed, was lost or timed out.
    pub failed: bool,
    /// Its client was answered when it was logged, before its replicas (an
    /// eventual pool's write): nothing is left to tell it.
    pub answered: bool,
}

/// What a pool kind does with a PG's operations.
pub trait PgBackend: PeeringBackend {
    /// Primary: a read (data, a stat, attributes, a listing).
    fn read(&self, at: &Primary<'_>, op: ClientOp) -> Outcome;

    /// Primary: a mutation, admitted (its limits checked, enough members up).
    fn mutate(&self, at: &Primary<'_>, op: ClientOp) -> Outcome;

    /// Primary: a replicated write's end once every replica answered (or
    /// it was given up on): settles it in its PG and returns the client's reply.
    fn finish_write(&self, shared: &Shared, end: &WriteEnd) -> OpReply;

    /// Replica: one entry from the primary. `Err`: the payload is not one
    /// this OSD could ever apply (the connection that sent it is dropped).
    fn replica_op(
        &self,
        shared: &Shared,
        histograms: &Histograms,
        payload: &Bytes,
        to: ReplyTo,
    ) -> Result<Outcome, String>;
}

pub(crate) static REPLICATED_OPLOG: Replicated<Logged> = Replicated(Logged);
static REPLICATED_SYNC: Replicated<SyncApply> = Replicated(SyncApply);
static REPLICATED_IDEAL: Replicated<Ideal> = Replicated(Ideal);

static ERASURE: erasure::Erasure = erasure::Erasure;
static EVENTUAL: eventual::Eventual = eventual::Eventual { replicated: &REPLICATED_OPLOG, path: &Logged };
static EVENTUAL_IDEAL: eventual::Eventual = eventual::Eventual { replicated: &REPLICATED_IDEAL, path: &Ideal };

/// The backend of pool `pool`'s PGs, on an OSD running `write_path` (an
/// erasure-coded pool's always logs; an eventual pool is eventual on the
/// product's path, `oplog`, and on `ideal`, where its primary answers what
/// it received: the limit issue 30's figures compare against; `sync`
/// measures strong pools). It is
/// on every operation's path, so it looks nothing up that costs.
pub fn for_pool(write_path: WritePath, pool: &Pool) -> &'static dyn PgBackend {
    if pool.is_erasure() {
        return &ERASURE;
    }
    if pool.is_eventual() && write_path == WritePath::Oplog {
        return &EVENTUAL;
    }
    if pool.is_eventual() && write_path == WritePath::Ideal {
        return &EVENTUAL_IDEAL;
    }
    for_replicated(write_path)
}

/// The replicated backend on `write_path`: replicas' entries and
/// replicated writes' ends, which name no pool kind (an erasure-coded
/// PG's shard entries are log entries like a replica's).
pub fn for_replicated(write_path: WritePath) -> &'static dyn PgBackend {
    match write_path {
        WritePath::Oplog => &REPLICATED_OPLOG,
        WritePath::Sync => &REPLICATED_SYNC,
        WritePath::Ideal => &REPLICATED_IDEAL,
    }
}

/// The peering backend of a pool's PGs (the peering schedule's view of [`for_pool`]).
pub fn peering_for(pool: &Pool) -> &'static dyn PeeringBackend {
    if pool.is_erasure() {
        return &ERASURE;
    }
    // Peering does not depend on the write path.
    &REPLICATED_OPLOG
}
