//! What every backend's operations share: the replies that end an
//! operation early, the PG's interval as the map has it, and the checks an
//! entry passes before any OSD logs it.

use std::sync::MutexGuard;

use duplex_map::OsdId;
use duplex_oplog::OpKind as LogOp;
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};

use crate::cluster::MapView;
use crate::messages::{ClientOp, Job, Outcome};
use crate::pg::{pg_number, pool_of, Pg, SharedPg};
use crate::shared::Shared;

/// The reply to a mutation that is done (or was done before: a resend).
pub(crate) fn ok_reply(op: &ClientOp, epoch: u64) -> Outcome {
    Outcome::Reply {
        token: op.token,
        slot: op.slot,
        reply: OpReply { status: Status::Ok, map_epoch: epoch, data: bytes::Bytes::new() },
        arrived: op.arrived,
        kind: op.request.kind,
    }
}

pub(crate) fn reply(op: &ClientOp, status: Status, epoch: u64, message: impl std::fmt::Display) -> Outcome {
    debug_assert_ne!(status, Status::Ok, "an early end is an error reply");
    Outcome::Reply {
        token: op.token,
        slot: op.slot,
        reply: OpReply::error(status, epoch, message),
        arrived: op.arrived,
        kind: op.request.kind,
    }
}

/// The PG's interval in the current map: its acting set, and the map that
/// says which of its members restarted since the PG went active.
pub(crate) struct Interval<'a> {
    pub acting: &'a [OsdId],
    pub view: &'a MapView,
}

impl Interval<'_> {
    /// Whether the PG went active (peered) for this interval; until then its
    /// operations are answered `Retry` (they never see a half-recovered PG).
    pub(crate) fn served_by(&self, pg: &Pg) -> bool {
        let map = &self.view.map;
        let recorded_since = map.active_sets.get(&(pool_of(pg.key), pg_number(pg.key))).map(|set| set.since);
        pg.serves(self.acting, |osd| map.osds.get(&osd).map_or(u64::MAX, |o| o.state_epoch), recorded_since)
    }
}

/// Locks the PG if it serves this interval (`None`: it is peering, answer
/// [`peering_reply`]). Under this one lock a write's append cannot slip
/// past a fence.
pub(crate) fn lock_served<'a>(pg: &'a SharedPg, interval: &Interval<'_>) -> Option<MutexGuard<'a, Pg>> {
    let guard = pg.lock().expect("PG lock");
    interval.served_by(&guard).then_some(guard)
}

pub(crate) fn peering_reply(shared: &Shared, op: &ClientOp, epoch: u64) -> Outcome {
    shared.metrics.peering_retries.add(1);
    reply(op, Status::Retry, epoch, "the PG is peering (its replicas are being brought up to date)")
}

/// The bytes a mutation changes, for [`crate::pg::Uncommitted`]: a write
/// its range; anything else (size, existence, attributes) the whole object.
pub(crate) fn changed_range(op: LogOp, offset: u64, data: &[u8]) -> (u64, u64) {
    match op {
        LogOp::Write => (offset, offset.saturating_add(data.len() as u64)),
        LogOp::Zero => (offset, offset.saturating_add(duplex_oplog::zero_length(data).unwrap_or(u64::MAX))),
        _ => (0, u64::MAX),
    }
}

pub(crate) fn uncommitted_reply(shared: &Shared, op: &ClientOp, epoch: u64) -> Outcome {
    shared.metrics.uncommitted_retries.add(1);
    reply(op, Status::Retry, epoch, "a write to this object is not yet on every replica")
}

/// The log op a mutation becomes (`None`: not a mutation).
pub(crate) fn log_op_of(kind: OpKind) -> Option<LogOp> {
    Some(match kind {
        OpKind::Write => LogOp::Write,
        OpKind::Truncate => LogOp::Truncate,
        OpKind::Delete => LogOp::Delete,
        OpKind::SetAttr => LogOp::SetAttr,
        OpKind::RemoveAttr => LogOp::RemoveAttr,
        OpKind::CreatePreallocated => LogOp::CreatePreallocated,
        OpKind::Zero => LogOp::Zero,
        // Rewritten at admission into a delete of the clone's own name.
        OpKind::TrimClone => LogOp::Delete,
        OpKind::CopyUp => LogOp::CopyUp,
        OpKind::OmapSet => LogOp::OmapSet,
        OpKind::OmapRemove => LogOp::OmapRemove,
        OpKind::OmapRemoveRange => LogOp::OmapRemoveRange,
        OpKind::ChunkPut => LogOp::ChunkPut,
        OpKind::ChunkUnref => LogOp::ChunkUnref,
        OpKind::TierUpdate => LogOp::TierUpdate,
        OpKind::Read
        | OpKind::Stat
        | OpKind::GetAttr
        | OpKind::ListAttrs
        | OpKind::Watch
        | OpKind::TrimSnaps
        | OpKind::ShardRead
        | OpKind::List
        | OpKind::ListSnaps
        | OpKind::OmapGet
        | OpKind::OmapList
        | OpKind::TierRead
        | OpKind::Diff => return None,
    })
}

/// A mutation's log entry `offset` and `data` (the table in the oplog's entry docs).
pub(crate) fn log_fields(request: &OpRequest) -> (u64, &[u8]) {
    match request.kind {
        OpKind::Write | OpKind::SetAttr | OpKind::Zero | OpKind::CopyUp | OpKind::ChunkPut => {
            (request.offset, &request.data)
        }
        OpKind::Truncate | OpKind::CreatePreallocated => (request.offset, &[]),
        // The guard is the primary's to check; the actions are logged.
        OpKind::TierUpdate => (0, request.data.get(16..).unwrap_or_default()),
        OpKind::RemoveAttr | OpKind::OmapSet | OpKind::OmapRemove | OpKind::OmapRemoveRange | OpKind::ChunkUnref => {
            (0, &request.data)
        }
        _ => (0, &[]),
    }
}

/// Wakes the PG's flusher: arm its timer on the first entry, flush at
/// once at each multiple of the threshold.
pub(crate) fn notify_flusher(shared: &Shared, key: u32, depth: usize, was_dirty: bool) {
    debug_assert!(depth > 0, "the flusher is told of an append to an empty log");
    let threshold = shared.config.flush_threshold.max(1);
    if depth >= threshold && depth.is_multiple_of(threshold) {
        shared.send_job(key, Job::Flush(key));
    } else if !was_dirty {
        shared.send_job(key, Job::Dirty(key));
    }
}

/// Refuses what the store could never apply: an entry that passed here is
/// logged and acknowledged, so a flush must not fail on it later. (One
/// thing cannot be checked without the store: that a new attribute keeps
/// its object's attributes within their total; see the flusher.)
pub(crate) fn check_limits(op: LogOp, offset: u64, data: &[u8]) -> Result<(), String> {
    let limit = duplex_store::MAX_OBJECT_SIZE;
    let end = match op {
        LogOp::Write | LogOp::CopyUp => offset.saturating_add(data.len() as u64),
        LogOp::Truncate | LogOp::CreatePreallocated => offset,
        LogOp::Delete => 0,
        LogOp::Zero => match duplex_oplog::zero_length(data) {
            Some(_) => offset,
            None => return Err("a zero carries its length in 8 bytes".into()),
        },
        LogOp::SetAttr | LogOp::RemoveAttr => {
            let name_len = if op == LogOp::SetAttr { offset as usize } else { data.len() };
            let value_len = data.len().saturating_sub(name_len);
            if name_len == 0 || name_len > duplex_store::MAX_ATTR_NAME_LEN || name_len > data.len() {
                return Err(format!("attribute names are 1 to {} bytes", duplex_store::MAX_ATTR_NAME_LEN));
            }
            if value_len > duplex_store::MAX_ATTR_VALUE_LEN {
                return Err(format!("attribute values are at most {} bytes", duplex_store::MAX_ATTR_VALUE_LEN));
            }
            0
        }
        // (Request decoding checked the payload; a replica's entry is
        // checked again here. Whether a set keeps the object's whole omap
        // within its total, only the store knows: see the flusher.)
        LogOp::OmapSet => match duplex_proto::omap::decode_entries_to_set(data) {
            Ok(_) => 0,
            Err(err) => return Err(format!("an omap set: {err}")),
        },
        LogOp::OmapRemove => match duplex_proto::omap::decode_keys(data) {
            Ok(_) => 0,
            Err(err) => return Err(format!("an omap removal: {err}")),
        },
        LogOp::OmapRemoveRange => match duplex_proto::omap::decode_range(data) {
            Ok(_) => 0,
            Err(err) => return Err(format!("an omap range removal: {err}")),
        },
        LogOp::ChunkPut => {
            let reference = offset as usize;
            if reference == 0 || reference > duplex_proto::omap::MAX_KEY_LEN || reference >= data.len() {
                return Err("a chunk put carries a 1 to 255-byte reference, then bytes".into());
            }
            let chunk = (data.len() - reference) as u64;
            if chunk > duplex_proto::osd::MAX_CHUNK as u64 {
                return Err(format!("a chunk of {chunk} bytes; chunks are at most {}", duplex_proto::osd::MAX_CHUNK));
            }
            chunk
        }
        LogOp::ChunkUnref => {
            if data.is_empty() || data.len() > duplex_proto::omap::MAX_KEY_LEN {
                return Err("a chunk unref carries a 1 to 255-byte reference".into());
            }
            0
        }
        LogOp::TierUpdate => match duplex_proto::tier::decode_actions(data) {
            Ok(actions) => {
                let mut end = 0u64;
                for action in &actions {
                    end = end.max(match action {
                        duplex_proto::tier::Action::Zero { offset, len } => offset.saturating_add(*len),
                        duplex_proto::tier::Action::Write { offset, data } => offset.saturating_add(data.len() as u64),
                        duplex_proto::tier::Action::SetEntry { .. }
                        | duplex_proto::tier::Action::RemoveEntry { .. } => 0,
                    });
                }
                end
            }
            Err(err) => return Err(format!("a tier update: {err}")),
        },
        LogOp::Elided => {
            if offset != 0 || !data.is_empty() {
                return Err("an elided write carries neither an offset nor data".into());
            }
            0
        }
    };
    if end > limit {
        return Err(format!("the operation reaches byte {end}; objects end at {limit}"));
    }
    Ok(())
}
