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
/// creates and sets the size, a zero changes no size, a copy-up writes only
/// an absent object, a deletion removes it with its attributes.
pub fn meta_after(store: Option<ObjectMeta>, held: &[Entry]) -> Option<ObjectMeta> {
    debug_assert!(held.windows(2).all(|w| w[0].seq < w[1].seq), "held entries out of order");
    let mut meta = store;
    for entry in held {
        let end = entry.offset.saturating_add(entry.data.len() as u64);
        let fresh = || ObjectMeta { size: 0, preallocated: false, attrs: Vec::new() };
        match entry.op {
            OpKind::Write => {
                let object = meta.get_or_insert_with(fresh);
                object.size = object.size.max(end);
            }
            OpKind::CopyUp => {
                if meta.is_none() {
                    meta = Some(ObjectMeta { size: end, ..fresh() });
                }
            }
            OpKind::Truncate => meta.get_or_insert_with(fresh).size = entry.offset,
            OpKind::CreatePreallocated => {
                let object = meta.get_or_insert_with(fresh);
                object.size = entry.offset;
                object.preallocated = true;
            }
            OpKind::Delete => meta = None,
            OpKind::Zero => {}
            OpKind::SetAttr => {
                if let Some(object) = meta.as_mut() {
                    let split = (entry.offset as usize).min(entry.data.len());
                    let (name, value) = entry.data.split_at(split);
                    object.attrs.retain(|(n, _)| n[..] != *name);
                    object.attrs.push((name.to_vec(), value.to_vec()));
                    object.attrs.sort();
                }
            }
            OpKind::RemoveAttr => {
                if let Some(object) = meta.as_mut() {
                    object.attrs.retain(|(n, _)| n[..] != entry.data[..]);
                }
            }
        }
    }
    meta
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(seq: u64, op: OpKind, offset: u64, data: &[u8]) -> Entry {
        Entry {
            pg: 1,
            epoch: 1,
            version: 0,
            seq,
            op,
            object: b"o".to_vec(),
            offset,
            data: data.to_vec(),
            request: Default::default(),
            snap: 0,
        }
    }

    fn size(meta: Option<ObjectMeta>) -> Option<u64> {
        meta.map(|m| m.size)
    }

    #[test]
    fn held_entries_change_an_objects_size_and_existence_as_the_store_would() {
        let stored = Some(ObjectMeta { size: 8192, preallocated: false, attrs: vec![(b"a".to_vec(), b"1".to_vec())] });
        assert_eq!(meta_after(stored.clone(), &[]), stored, "nothing held: the store's");
        // A write of no bytes (a shard a write left alone) creates it.
        assert_eq!(size(meta_after(None, &[entry(1, OpKind::Write, 0, b"")])), Some(0));
        assert_eq!(size(meta_after(stored.clone(), &[entry(1, OpKind::Write, 8192, &[7; 4096])])), Some(12288));
        assert_eq!(size(meta_after(stored.clone(), &[entry(1, OpKind::Write, 0, &[7; 4096])])), Some(8192));
        assert_eq!(size(meta_after(stored.clone(), &[entry(1, OpKind::Zero, 0, &[0; 8])])), Some(8192));
        assert_eq!(size(meta_after(None, &[entry(1, OpKind::Zero, 0, &[0; 8])])), None, "a zero creates nothing");
        assert_eq!(size(meta_after(stored.clone(), &[entry(1, OpKind::Truncate, 4096, b"")])), Some(4096));
        let deleted = meta_after(stored.clone(), &[entry(1, OpKind::Delete, 0, b"")]);
        assert_eq!(deleted, None);
        let again =
            meta_after(stored.clone(), &[entry(1, OpKind::Delete, 0, b""), entry(2, OpKind::Write, 0, &[1; 10])]);
        assert_eq!(again, Some(ObjectMeta { size: 10, preallocated: false, attrs: Vec::new() }), "attributes go too");
        assert_eq!(size(meta_after(stored.clone(), &[entry(1, OpKind::CopyUp, 0, &[1; 65536])])), Some(8192));
        assert_eq!(size(meta_after(None, &[entry(1, OpKind::CopyUp, 0, &[1; 100])])), Some(100));
        let attrs = meta_after(stored, &[entry(1, OpKind::SetAttr, 1, b"b2"), entry(2, OpKind::RemoveAttr, 0, b"a")]);
        assert_eq!(attrs.map(|m| m.attrs), Some(vec![(b"b".to_vec(), b"2".to_vec())]));
    }
}
