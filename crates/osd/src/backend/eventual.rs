//! The eventual backend (issue 30): an eventual pool's PGs are replicated
//! PGs whose writes are acknowledged once the primary has logged them.
//!
//! - A mutation is logged at the primary and answered at once; the same
//!   entry goes to the replicas on the thread's peer connections, as a
//!   strong pool's does, and their answers only settle the PG's
//!   replication lag (`crate::pg::lag`). The replicas take the entries in
//!   seq order (a replica's log holds early ones back), so they converge
//!   on the primary's history.
//! - The lag is the age of the oldest acknowledged write a replica still
//!   lacks. Once it reaches the pool's `max_lag`, new writes are answered
//!   only when their replicas have them, as in a strong pool: the
//!   back-pressure that keeps what a primary's failure can lose to the
//!   writes of its last `max_lag`.
//! - A replica that fails an entry (or never answers within the
//!   replication timeout) makes the PG peer again, as in a strong pool:
//!   recovery copies what it lacks from the primary, whose log is the
//!   longest of the interval.
//! - Reads are the primary's, from its log or store: a write is readable
//!   as soon as it is acknowledged (read-your-writes for every client of
//!   the primary).
//! - If the primary fails, the next interval's authority is a replica
//!   (newest interval, then longest log): the writes only the failed
//!   primary held are lost, none partly (an entry is whole or absent),
//!   and when it comes back it is recovered to the survivors' state.
//!
//! - A PG moved by the map (its pin dropped once its backfill is done: a
//!   balancer's move, an OSD out or back) must not lose what only its
//!   primary holds: the primary asks for the move only with no such write
//!   ([`may_move`]), and acknowledges none early until the next interval.
//!
//! Only the mutation differs from the replicated backend; reads, replica
//! entries, write ends and peering are its.

use std::time::Duration;

use bytes::Bytes;
use duplex_proto::osd::OpReply;

use crate::backend::replicated::mutate;
use crate::backend::write_path::WritePath;
use crate::backend::{PgBackend, Primary, WriteEnd, REPLICATED_OPLOG};
use crate::messages::{ClientOp, Outcome};
use crate::metrics::Histograms;
use crate::peering::schedule::{PeeringBackend, Wanted};
use crate::peering::{Action, Peering};
use crate::pg::ReplyTo;
use crate::shared::Shared;

/// On the replicated backend of a write path: `oplog` (the product), or
/// `ideal` (the benchmark's limit: answered on receipt, nothing logged).
pub struct Eventual {
    /// What is not an eventual pool's own: reads, replicas' entries, write ends.
    pub(crate) replicated: &'static dyn PgBackend,
    /// Where its mutations go at the primary.
    pub(crate) path: &'static dyn WritePath,
}

/// Whether PG `key` may move to other OSDs now (its primary asks the map
/// to drop its pin, and the next interval's members may not include this
/// one): not while it holds an acknowledged write some member lacks, or
/// that write would be lost with the move. From the first ask on, its
/// writes wait for their replicas until the next interval, so the lag
/// drains and stays empty. A PG this OSD does not have moves freely.
pub fn may_move(shared: &Shared, key: u32) -> bool {
    let Some(pg) = shared.pgs.get(key) else { return true };
    let mut guard = pg.lock().expect("PG lock");
    guard.moving = true;
    guard.lag.unreplicated() == 0
}

impl PgBackend for Eventual {
    fn read(&self, at: &Primary<'_>, op: ClientOp) -> Outcome {
        self.replicated.read(at, op)
    }

    fn mutate(&self, at: &Primary<'_>, op: ClientOp) -> Outcome {
        let Some(eventual) = at.eventual else {
            debug_assert!(false, "the eventual backend for a strong pool");
            return self.replicated.mutate(at, op);
        };
        let max_lag = Duration::from_millis(u64::from(eventual.max_lag_ms));
        mutate(self.path, at, op, Some(max_lag))
    }

    fn finish_write(&self, shared: &Shared, end: &WriteEnd) -> OpReply {
        self.replicated.finish_write(shared, end)
    }

    fn replica_op(
        &self,
        shared: &Shared,
        histograms: &Histograms,
        payload: &Bytes,
        to: ReplyTo,
    ) -> Result<Outcome, String> {
        self.replicated.replica_op(shared, histograms, payload, to)
    }
}

impl PeeringBackend for Eventual {
    fn start_peering(&self, key: u32, interval: u64, want: Wanted, scrub: Option<bool>) -> (Peering, Vec<Action>) {
        REPLICATED_OPLOG.start_peering(key, interval, want, scrub)
    }
}
