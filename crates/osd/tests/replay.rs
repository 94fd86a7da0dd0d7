//! Replaying the live log over any partial application of it ends in the
//! state the whole log defines.

use std::collections::BTreeMap;

use duplex_oplog::{Entry, OpKind};
use duplex_osd::pg::replay::{replay, store_op};
use duplex_store::{mkfs, Batch, MkfsOptions, Store, StoreConfig};
use proptest::prelude::*;

type Attrs = BTreeMap<Vec<u8>, Vec<u8>>;

fn model_apply(model: &mut BTreeMap<Vec<u8>, Vec<u8>>, entry: &Entry) {
    model_apply_attrs(model, &mut BTreeMap::new(), &mut BTreeMap::new(), entry)
}

/// The model: object data by name, and attributes and omaps by object name.
fn model_apply_attrs(
    model: &mut BTreeMap<Vec<u8>, Vec<u8>>,
    attrs: &mut BTreeMap<Vec<u8>, Attrs>,
    omaps: &mut BTreeMap<Vec<u8>, Attrs>,
    entry: &Entry,
) {
    match entry.op {
        OpKind::Write => {
            let object = model.entry(entry.object.clone()).or_default();
            let end = entry.offset as usize + entry.data.len();
            if object.len() < end {
                object.resize(end, 0);
            }
            object[entry.offset as usize..end].copy_from_slice(&entry.data);
        }
        OpKind::Truncate => model.entry(entry.object.clone()).or_default().resize(entry.offset as usize, 0),
        OpKind::Delete => {
            model.remove(&entry.object);
            attrs.remove(&entry.object);
            omaps.remove(&entry.object);
        }
        OpKind::OmapSet => {
            model.entry(entry.object.clone()).or_default();
            let set = duplex_proto::omap::decode_entries(&entry.data).unwrap();
            omaps.entry(entry.object.clone()).or_default().extend(set);
        }
        OpKind::OmapRemove => {
            if let Some(omap) = omaps.get_mut(&entry.object) {
                for key in duplex_proto::omap::decode_keys(&entry.data).unwrap() {
                    omap.remove(&key);
                }
            }
        }
        OpKind::OmapRemoveRange => {
            if let Some(omap) = omaps.get_mut(&entry.object) {
                let range = duplex_proto::omap::decode_range(&entry.data).unwrap();
                omap.retain(|key, _| !range.contains(key));
            }
        }
        OpKind::ChunkPut => {
            let (reference, chunk) = entry.data.split_at(entry.offset as usize);
            model.entry(entry.object.clone()).or_insert_with(|| chunk.to_vec());
            omaps.entry(entry.object.clone()).or_default().insert(reference.to_vec(), Vec::new());
        }
        OpKind::ChunkUnref => {
            if let Some(omap) = omaps.get_mut(&entry.object) {
                omap.remove(&entry.data);
            }
            if model.contains_key(&entry.object) && omaps.get(&entry.object).is_none_or(|o| o.is_empty()) {
                model.remove(&entry.object);
                attrs.remove(&entry.object);
                omaps.remove(&entry.object);
            }
        }
        OpKind::TierUpdate => {
            // Each action as the kind it stands for.
            for action in duplex_proto::tier::decode_actions(&entry.data).unwrap() {
                let (op, offset, data) = match action {
                    duplex_proto::tier::Action::SetEntry { key, value } => {
                        (OpKind::OmapSet, 0, duplex_proto::omap::encode_entries(&[(key, value)]))
                    }
                    duplex_proto::tier::Action::RemoveEntry { key } => {
                        (OpKind::OmapRemove, 0, duplex_proto::omap::encode_keys(&[key]))
                    }
                    duplex_proto::tier::Action::Zero { offset, len } => {
                        (OpKind::Zero, offset, len.to_le_bytes().to_vec())
                    }
                    duplex_proto::tier::Action::Write { offset, data } => (OpKind::Write, offset, data),
                };
                let part = Entry { op, offset, data, ..entry.clone() };
                model_apply_attrs(model, attrs, omaps, &part);
            }
        }
        OpKind::SetAttr => {
            model.entry(entry.object.clone()).or_default();
            let (name, value) = entry.data.split_at(entry.offset as usize);
            attrs.entry(entry.object.clone()).or_default().insert(name.to_vec(), value.to_vec());
        }
        OpKind::RemoveAttr => {
            if let Some(list) = attrs.get_mut(&entry.object) {
                list.remove(&entry.data);
            }
        }
        OpKind::CreatePreallocated => {
            model.entry(entry.object.clone()).or_insert_with(|| vec![0; entry.offset as usize]);
        }
        // A backfill target's: its effect comes by copy, not from the log.
        OpKind::Elided => {}
        OpKind::CopyUp if model.contains_key(&entry.object) => {}
        OpKind::CopyUp => {
            let mut object = vec![0; entry.offset as usize];
            object.extend_from_slice(&entry.data);
            model.insert(entry.object.clone(), object);
        }
        OpKind::Zero => {
            if let Some(object) = model.get_mut(&entry.object) {
                let len = duplex_oplog::zero_length(&entry.data).expect("8 bytes");
                let end = entry.offset.saturating_add(len).min(object.len() as u64) as usize;
                if (entry.offset as usize) < end {
                    object[entry.offset as usize..end].fill(0);
                }
            }
        }
    }
}

/// Entry `seq` of PG 5 on object `o<name>`.
fn entry(seq: u64, name: u8, op: OpKind, offset: u64, data: Vec<u8>) -> Entry {
    let object = vec![b'o', b'0' + name];
    Entry { pg: 5, epoch: 1, version: seq, seq, op, object, offset, data, request: Default::default(), snap: 0 }
}

fn entries() -> impl Strategy<Value = Vec<Entry>> {
    proptest::collection::vec((0u8..3, 0u8..10, 0u64..20_000, 1usize..9000, any::<u8>()), 1..40).prop_map(|ops| {
        ops.into_iter()
            .enumerate()
            .map(|(i, (name, kind, offset, len, fill))| {
                let seq = i as u64 + 1;
                let (op, data) = match kind {
                    0 => (OpKind::Delete, vec![]),
                    1 => (OpKind::Truncate, vec![]),
                    2 => (OpKind::Zero, (len as u64).to_le_bytes().to_vec()),
                    _ => (OpKind::Write, vec![fill; len]),
                };
                entry(seq, name, op, offset, data)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn replay_over_a_partial_application_converges(log in entries(), trimmed in 0usize..40, applied_extra in proptest::collection::vec(any::<bool>(), 40)) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.img");
        let config = StoreConfig::default();
        mkfs(&path, &MkfsOptions { partitions: 1, size_bytes: Some(32 << 20), bytes_per_onode: 16 << 10, ..Default::default() }, &config).unwrap();
        let mut store = Store::open(&path, &config).unwrap();
        let partition = store.partition_mut(0);
        // Entries before `trimmed` were flushed and trimmed: applied, and gone from the log.
        let trimmed = trimmed.min(log.len());
        for entry in &log[..trimmed] {
            let mut batch = Batch::new();
            batch.push(store_op(entry.clone()).unwrap());
            partition.apply(&batch).unwrap();
        }
        // A crash mid-flush left an arbitrary subset of the live entries applied.
        for (entry, applied) in log[trimmed..].iter().zip(&applied_extra) {
            if *applied {
                let mut batch = Batch::new();
                batch.push(store_op(entry.clone()).unwrap());
                partition.apply(&batch).unwrap();
            }
        }
        replay(&log[trimmed..], partition).unwrap();
        let mut model = BTreeMap::new();
        for entry in &log {
            model_apply(&mut model, entry);
        }
        for name in b'0'..b'3' {
            let key = duplex_store::Key::in_group(5, &[b'o', name]).unwrap();
            let expected = model.get(&vec![b'o', name]);
            match (expected, partition.stat(key.as_bytes())) {
                (None, Err(duplex_store::StoreError::NotFound)) => {}
                (Some(data), Ok(info)) => {
                    prop_assert_eq!(info.size, data.len() as u64);
                    prop_assert!(partition.read(key.as_bytes(), 0, info.size).unwrap() == *data, "contents differ");
                }
                (expected, actual) => prop_assert!(false, "object o{}: model {:?} bytes, store {:?}", name as char, expected.map(|d| d.len()), actual),
            }
        }
    }
}

/// Every kind of entry, attributes and pre-allocated creates included. A
/// crash leaves a prefix of the flush batches applied (the store commits a
/// batch's metadata all or nothing, batches in order).
fn all_kinds() -> impl Strategy<Value = Vec<Entry>> {
    proptest::collection::vec((0u8..14, 0u8..6, 0u64..20_000, 1usize..9000, any::<u8>()), 1..40).prop_map(|ops| {
        ops.into_iter()
            .enumerate()
            .map(|(i, (kind, name, offset, len, fill))| {
                // Chunk operations go to objects of their own (o3..o5), and
                // nothing else does (o0..o2): a chunk object takes chunk
                // operations only (docs/DEDUP.md). Anything else changing
                // one would let a replayed unref's conditional delete see
                // another object than it first did (a truncate, then an
                // unref that deleted, then a put: replayed over the put's
                // result, the truncate empties it and the unref keeps it).
                let name = match kind {
                    9 | 10 => 3 + name % 3,
                    _ => name % 3,
                };
                let seq = i as u64 + 1;
                let (op, offset, data) = match kind {
                    0 => (OpKind::Delete, 0, vec![]),
                    1 => (OpKind::Truncate, offset, vec![]),
                    2 => (OpKind::Write, offset, vec![fill; len]),
                    3 => (OpKind::SetAttr, 1, vec![b'a' + fill % 3, fill, fill]),
                    4 => (OpKind::RemoveAttr, 0, vec![b'a' + fill % 3]),
                    5 => (OpKind::CopyUp, offset, vec![fill; len]),
                    6 => {
                        let set = [(vec![b'k', fill % 5], vec![fill; len % 100]), (vec![b'l'], vec![fill])];
                        (OpKind::OmapSet, 0, duplex_proto::omap::encode_entries(&set))
                    }
                    7 => (OpKind::OmapRemove, 0, duplex_proto::omap::encode_keys(&[vec![b'k', fill % 5]])),
                    9 => {
                        // A chunk put: a reference, then the chunk's bytes.
                        let mut data = vec![b'r', fill % 3];
                        data.extend(vec![fill; len % 300 + 1]);
                        (OpKind::ChunkPut, 2, data)
                    }
                    10 => (OpKind::ChunkUnref, 0, vec![b'r', fill % 3]),
                    11 => {
                        // The dedup engine's update: an entry, an eviction
                        // (zero), a promotion (write back) in one entry.
                        use duplex_proto::tier::Action;
                        let actions = [
                            Action::SetEntry { key: vec![b'c', fill % 4], value: vec![fill; 46] },
                            Action::Zero { offset, len: len as u64 },
                            Action::Write { offset: offset / 2, data: vec![fill; len % 5000] },
                            Action::RemoveEntry { key: vec![b'c', fill.wrapping_add(1) % 4] },
                        ];
                        (OpKind::TierUpdate, 0, duplex_proto::tier::encode_actions(&actions))
                    }
                    8 => {
                        let range = duplex_proto::omap::KeyRange {
                            start: vec![b'k', fill % 5],
                            end: (fill % 2 == 0).then(|| vec![b'k', 4]),
                        };
                        (OpKind::OmapRemoveRange, 0, duplex_proto::omap::encode_range(&range))
                    }
                    13 => (OpKind::Elided, 0, vec![]),
                    _ => (OpKind::CreatePreallocated, (len as u64).div_ceil(4096) * 4096, vec![]),
                };
                entry(seq, name, op, offset, data)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn replay_of_every_kind_over_an_applied_prefix_converges(log in all_kinds(), trimmed in 0usize..40, applied in 0usize..40) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("store.img");
        let config = StoreConfig::default();
        mkfs(&path, &MkfsOptions { partitions: 1, size_bytes: Some(32 << 20), bytes_per_onode: 16 << 10, ..Default::default() }, &config).unwrap();
        let mut store = Store::open(&path, &config).unwrap();
        let partition = store.partition_mut(0);
        let trimmed = trimmed.min(log.len());
        let applied = (trimmed + applied).min(log.len());
        // Applied as the flusher applies them (a copy-up only where the
        // object is absent then).
        replay(&log[..applied], partition).unwrap();
        replay(&log[trimmed..], partition).unwrap();
        let (mut model, mut attrs, mut omaps) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
        for entry in &log {
            model_apply_attrs(&mut model, &mut attrs, &mut omaps, entry);
        }
        for name in b'0'..b'6' {
            let object = vec![b'o', name];
            let key = duplex_store::Key::in_group(5, &object).unwrap();
            match (model.get(&object), partition.stat(key.as_bytes())) {
                (None, Err(duplex_store::StoreError::NotFound)) => {}
                (Some(data), Ok(info)) => {
                    prop_assert_eq!(info.size, data.len() as u64);
                    prop_assert!(partition.read(key.as_bytes(), 0, info.size).unwrap() == *data, "contents differ");
                    let stored: Attrs = partition.list_attrs(key.as_bytes()).unwrap().into_iter().collect();
                    let expected = attrs.get(&object).cloned().unwrap_or_default();
                    prop_assert_eq!(stored, expected);
                    let stored: Attrs = partition.omap_range(key.as_bytes(), &[], None, usize::MAX).unwrap().into_iter().collect();
                    prop_assert_eq!(stored, omaps.get(&object).cloned().unwrap_or_default());
                }
                (expected, actual) => prop_assert!(false, "object o{}: model {:?} bytes, store {:?}", name as char, expected.map(|d| d.len()), actual),
            }
        }
    }
}
