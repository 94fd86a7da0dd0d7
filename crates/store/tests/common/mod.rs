//! Shared test support: a reference model of the store (a map of byte
//! vectors) and a seeded random batch generator.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use duplex_store::{mkfs, Batch, DeviceConfig, IoBackend, Key, MkfsOptions, Op, StoreConfig, StoreError};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

pub const BLOCK: usize = 4096;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ModelObject {
    pub data: Vec<u8>,
    pub attrs: BTreeMap<Vec<u8>, Vec<u8>>,
    pub omap: BTreeMap<Vec<u8>, Vec<u8>>,
    pub preallocated: bool,
}

/// What the store should hold: key → object.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Model {
    pub objects: BTreeMap<Vec<u8>, ModelObject>,
}

impl Model {
    /// Applies `batch` like the store does: all or nothing.
    pub fn apply(&mut self, batch: &Batch) -> Result<(), &'static str> {
        let mut next = self.clone();
        for op in &batch.ops {
            next.apply_op(op)?;
        }
        *self = next;
        Ok(())
    }

    fn apply_op(&mut self, op: &Op) -> Result<(), &'static str> {
        let key = op.key().as_bytes().to_vec();
        match op {
            Op::Write { offset, data, .. } | Op::WriteJournaled { offset, data, .. } => {
                let object = self.objects.entry(key).or_default();
                let end = *offset as usize + data.len();
                if object.data.len() < end {
                    object.data.resize(end, 0);
                }
                object.data[*offset as usize..end].copy_from_slice(data);
            }
            Op::Truncate { size, .. } => self.objects.entry(key).or_default().data.resize(*size as usize, 0),
            Op::Zero { offset, len, .. } => {
                if let Some(object) = self.objects.get_mut(&key) {
                    let end = offset.saturating_add(*len).min(object.data.len() as u64) as usize;
                    if (*offset as usize) < end {
                        object.data[*offset as usize..end].fill(0);
                    }
                }
            }
            Op::Delete { .. } => {
                self.objects.remove(&key);
            }
            Op::CreatePreallocated { size, .. } => match self.objects.get(&key) {
                Some(_) => {}
                None => {
                    self.objects.insert(
                        key,
                        ModelObject { data: vec![0; *size as usize], preallocated: true, ..ModelObject::default() },
                    );
                }
            },
            Op::SetAttr { name, value, .. } => {
                self.objects.entry(key).or_default().attrs.insert(name.clone(), value.clone());
            }
            Op::RemoveAttr { name, .. } => {
                if let Some(o) = self.objects.get_mut(&key) {
                    o.attrs.remove(name);
                }
            }
            Op::OmapSet { entries, .. } => {
                let object = self.objects.entry(key).or_default();
                let mut next = object.omap.clone();
                next.extend(entries.iter().cloned());
                if next.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > duplex_store::MAX_OMAP_BYTES {
                    return Err("omap too large");
                }
                object.omap = next;
            }
            Op::OmapRemove { keys, .. } => {
                if let Some(o) = self.objects.get_mut(&key) {
                    for k in keys {
                        o.omap.remove(k);
                    }
                }
            }
            Op::OmapRemoveRange { start, end, .. } => {
                if let Some(o) = self.objects.get_mut(&key) {
                    o.omap.retain(|k, _| k < start || end.as_ref().is_some_and(|end| k >= end));
                }
            }
            Op::DeleteIfOmapEmpty { .. } => {
                if self.objects.get(&key).is_some_and(|o| o.omap.is_empty()) {
                    self.objects.remove(&key);
                }
            }
            Op::Clone { source, .. } => {
                if !self.objects.contains_key(&key) {
                    if let Some(original) = self.objects.get(source.as_bytes()).cloned() {
                        self.objects.insert(key, original);
                    }
                }
            }
        }
        Ok(())
    }
}

/// Keys used by the generators: a few names in each of `groups` groups.
pub fn key(group: u32, name: u8) -> Key {
    Key::in_group(group, format!("obj-{name}").as_bytes()).unwrap()
}

/// A random batch of 1..=max_ops operations over `names` names in `groups` groups.
pub fn random_batch(rng: &mut StdRng, groups: u32, names: u8, max_ops: usize) -> Batch {
    let mut batch = Batch::new();
    if rng.gen_bool(0.12) {
        // A clone (it must come first in its batch): later writes to either
        // object copy the blocks they share.
        let group = rng.gen_range(0..groups);
        let (copy, source) = (rng.gen_range(0..names), rng.gen_range(0..names));
        if copy != source && rng.gen_bool(0.3) {
            // A rollback: the copy deleted, then cloned again from the source.
            batch.push(Op::Delete { key: key(group, copy) });
        }
        batch.push(Op::Clone { key: key(group, copy), source: key(group, source) });
    }
    for _ in 0..rng.gen_range(1..=max_ops) {
        let k = key(rng.gen_range(0..groups), rng.gen_range(0..names));
        let op = match rng.gen_range(0..100) {
            0..=44 => {
                // Mostly block-aligned 4 KiB writes, some unaligned and multi-block.
                let (offset, len) = if rng.gen_bool(0.6) {
                    (rng.gen_range(0..24u64) * BLOCK as u64, BLOCK * rng.gen_range(1..=2))
                } else {
                    (rng.gen_range(0..100_000u64), rng.gen_range(1..9000))
                };
                let fill: u8 = rng.gen();
                let data: Vec<u8> = (0..len).map(|i| fill.wrapping_add((i / 7) as u8)).collect();
                Op::Write { key: k, offset, data }
            }
            90..=97 => {
                // Small writes through the journal, often into pre-allocated blocks.
                let offset = rng.gen_range(0..32 * BLOCK as u64);
                let data = vec![rng.gen(); rng.gen_range(1..300)];
                Op::WriteJournaled { key: k, offset, data }
            }
            45..=54 => Op::Truncate { key: k, size: rng.gen_range(0..110_000) },
            55..=62 => Op::Delete { key: k },
            63..=74 => Op::CreatePreallocated { key: k, size: rng.gen_range(1..=32u64) * BLOCK as u64 },
            75..=80 => {
                let name = format!("attr-{}", rng.gen_range(0..4)).into_bytes();
                let value = vec![rng.gen(); rng.gen_range(0..600)];
                Op::SetAttr { key: k, name, value }
            }
            98 if rng.gen_bool(0.5) => {
                // Now and then a large one: whole blocks through the journal.
                let offset = rng.gen_range(0..24u64) * BLOCK as u64 + rng.gen_range(0..2) * 100;
                let data = vec![rng.gen(); BLOCK * rng.gen_range(1..=2)];
                Op::WriteJournaled { key: k, offset, data }
            }
            88..=89 => {
                // Zeroing part of an object (a TRIM): within, across or past its end.
                let (offset, len) = (rng.gen_range(0..110_000u64), rng.gen_range(1..20_000u64));
                Op::Zero { key: k, offset, len }
            }
            81..=84 => {
                // Omap entries: a few small keys (small enough in all that a
                // blob rewrite fits the tests' 16 KiB journals; large omaps
                // have tests of their own).
                let entries = (0..rng.gen_range(1..=4))
                    .map(|_| {
                        let name = format!("om-{:02}", rng.gen_range(0..16)).into_bytes();
                        (name, vec![rng.gen(); rng.gen_range(0..120)])
                    })
                    .collect();
                Op::OmapSet { key: k, entries }
            }
            87 if rng.gen_bool(0.3) => Op::DeleteIfOmapEmpty { key: k },
            87 => {
                if rng.gen_bool(0.5) {
                    let keys =
                        (0..rng.gen_range(1..=3)).map(|_| format!("om-{:02}", rng.gen_range(0..16)).into_bytes());
                    Op::OmapRemove { key: k, keys: keys.collect() }
                } else {
                    let start = format!("om-{:02}", rng.gen_range(0..16)).into_bytes();
                    let end = rng.gen_bool(0.7).then(|| format!("om-{:02}", rng.gen_range(0..16)).into_bytes());
                    Op::OmapRemoveRange { key: k, start, end }
                }
            }
            _ => Op::RemoveAttr { key: k, name: format!("attr-{}", rng.gen_range(0..4)).into_bytes() },
        };
        batch.push(op);
    }
    batch
}

/// The ops of `batch` that belong to its first op's group (one partition
/// per batch), and that group.
pub fn first_group_only(batch: Batch) -> (u32, Batch) {
    let group = batch.ops[0].key().group();
    let mut single = Batch::new();
    for op in batch.ops.into_iter().filter(|op| op.key().group() == group) {
        single.push(op);
    }
    (group, single)
}

pub fn rng(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// A store config for tests: small caches so eviction and checkpoints run often.
pub fn test_config(backend: IoBackend) -> StoreConfig {
    StoreConfig {
        device: DeviceConfig { backend, ..DeviceConfig::default() },
        metadata_cache_bytes: 64 << 10,
        max_dirty_bytes: 256 << 10,
        read_only: false,
    }
}

/// Makes a fresh store file in `dir`.
pub fn make_store(dir: &Path, size: u64, partitions: u32, journal_bytes: u64, config: &StoreConfig) -> PathBuf {
    let path = dir.join("store.img");
    let options = MkfsOptions {
        partitions,
        journal_bytes: Some(journal_bytes),
        bytes_per_onode: 16 << 10,
        size_bytes: Some(size),
    };
    mkfs(&path, &options, config).expect("mkfs");
    path
}

/// Asserts that every partition of the store holds exactly `model`.
pub fn assert_matches_model(store: &mut duplex_store::Store, model: &Model) {
    let mut seen = 0;
    for index in 0..store.partitions().len() {
        let partition = store.partition_mut(index);
        let keys = partition.list(&[], None, usize::MAX);
        for k in keys {
            let expected =
                model.objects.get(k.as_bytes()).unwrap_or_else(|| panic!("store has {k:?}, the model does not"));
            let info = partition.stat(k.as_bytes()).unwrap();
            assert_eq!(info.size, expected.data.len() as u64, "size of {k:?}");
            let data = partition.read(k.as_bytes(), 0, info.size + 100).unwrap();
            assert!(data == expected.data, "contents of {k:?} differ from the model");
            let attrs: BTreeMap<Vec<u8>, Vec<u8>> = partition.list_attrs(k.as_bytes()).unwrap().into_iter().collect();
            assert_eq!(attrs, expected.attrs, "attributes of {k:?}");
            let omap: BTreeMap<Vec<u8>, Vec<u8>> =
                partition.omap_range(k.as_bytes(), &[], None, usize::MAX).unwrap().into_iter().collect();
            assert_eq!(omap, expected.omap, "omap of {k:?}");
            seen += 1;
        }
    }
    assert_eq!(seen, model.objects.len(), "store and model hold different key sets");
}

/// Whether an error is one the model also rejects (the batch had no effect).
pub fn is_rejection(err: &StoreError) -> bool {
    matches!(err, StoreError::AlreadyExists | StoreError::InvalidArgument(_))
}
