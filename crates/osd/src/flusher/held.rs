//! What peering reads of an erasure-coded shard whose log still holds
//! entries back (`Pg::apply_limit`): the store with those entries on top.
//!
//! A member that settles at `S` keeps its entries through `S` in the log,
//! unapplied, until the PG activates (`Pg::settle`): an entry past every
//! watermark may be held by only `k` shards, and if one of them is lost
//! before the activation, the next peering resumes before it and rolls it
//! back. Applied, it could not be: the simulator (`--ec 2+1`, seed 350)
//! had a write that one shard missed kept by a peering whose activation a
//! power cut stopped, then rolled back by the next one, which the member
//! that had applied it refused for good. So the rebuild's reads of such a
//! member (names, sizes, bytes) see its log on top of its store, as client
//! reads do.

use duplex_oplog::{Entry, OpKind};
use duplex_proto::peering::ObjectMeta;

/// An object's metadata once `held` (its entries, in log order) apply on
/// top of `store` (None: absent), as the store applies them
/// (`pg::replay::store_op`): a write creates and extends, a truncation
/// creates and sets the size, a zero changes no size, a copy-up and a
/// pre-allocation create only an absent object, an attribute creates it
/// too, a deletion removes it with its attributes.
pub fn meta_after(store: Option<ObjectMeta>, held: &[Entry]) -> Option<ObjectMeta> {
    debug_assert!(held.windows(2).all(|w| w[0].seq < w[1].seq), "held entries out of order");
    let mut meta = store;
    for entry in held {
        // Only an erasure-coded PG holds entries back, and its backend
        // logs no omap or chunk request (`backend::erasure::change_of`).
        debug_assert!(
            !matches!(
                entry.op,
                OpKind::OmapSet
                    | OpKind::OmapRemove
                    | OpKind::OmapRemoveRange
                    | OpKind::ChunkPut
                    | OpKind::ChunkUnref
                    | OpKind::TierUpdate
            ),
            "an erasure-coded log holds a {:?} entry",
            entry.op
        );
        let Some(size) = size_step(meta.as_ref().map(|object| object.size), entry) else {
            meta = None;
            continue;
        };
        let created = meta.is_none();
        let object =
            meta.get_or_insert_with(|| ObjectMeta { size, preallocated: false, attrs: Vec::new(), omap: Vec::new() });
        object.size = size;
        match entry.op {
            // The store pre-allocates an absent object only.
            OpKind::CreatePreallocated if created => object.preallocated = true,
            OpKind::SetAttr => {
                let split = (entry.offset as usize).min(entry.data.len());
                let (name, value) = entry.data.split_at(split);
                object.attrs.retain(|(n, _)| n[..] != *name);
                object.attrs.push((name.to_vec(), value.to_vec()));
                object.attrs.sort();
            }
            OpKind::RemoveAttr => object.attrs.retain(|(n, _)| n[..] != entry.data[..]),
            _ => {}
        }
    }
    meta
}

/// An object's size once `entries` (its log entries, in order) apply on
/// top of a store that holds it at `stored` (None: absent), as the store
/// applies them; None if they leave it absent. [`meta_after`]'s sizes, for
/// any PG's entries (an omap entry creates an absent object too).
pub fn size_after(stored: Option<u64>, entries: &[Entry]) -> Option<u64> {
    entries.iter().fold(stored, size_step)
}

/// One entry's effect on an object's size (None: absent), as the store
/// applies it: a write creates and extends, a truncation creates and sets
/// the size, a zero changes no size, a copy-up and a pre-allocation create
/// only an absent object, an attribute or omap entry creates it too, a
/// deletion removes it.
fn size_step(size: Option<u64>, entry: &Entry) -> Option<u64> {
    let end = entry.offset.saturating_add(entry.data.len() as u64);
    match entry.op {
        OpKind::Write => Some(size.unwrap_or(0).max(end)),
        OpKind::CopyUp => size.or(Some(end)),
        OpKind::Truncate => Some(entry.offset),
        OpKind::CreatePreallocated => size.or(Some(entry.offset)),
        OpKind::Delete => None,
        OpKind::SetAttr | OpKind::OmapSet => size.or(Some(0)),
        OpKind::Zero | OpKind::RemoveAttr | OpKind::OmapRemove | OpKind::OmapRemoveRange => size,
        // Never overlaid (`overlays_bytes`): the read waits for the flush.
        // (An elided write is a backfill target's, of a replicated PG.)
        OpKind::ChunkPut | OpKind::ChunkUnref | OpKind::TierUpdate | OpKind::Elided => {
            debug_assert!(false, "a size after a {:?} entry", entry.op);
            size
        }
    }
}
