//! Partitions are independent: N threads each drive one partition, moved
//! into the thread by value (`Partition: Send`, and nothing is shared), with
//! random batches checked against a per-partition model; afterwards the
//! whole store matches, survives a remount, and fsck is clean.

mod common;

use common::*;
use duplex_store::{fsck, IoBackend, Partition, Store};

fn assert_send<T: Send>() {}

#[test]
fn n_partitions_driven_by_n_threads_concurrently() {
    assert_send::<Partition>();
    const PARTITIONS: u32 = 4;
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 96 << 20, PARTITIONS, 64 << 10, &config);
    let store = Store::open(&path, &config).unwrap();
    let handles: Vec<_> = store
        .into_partitions()
        .into_iter()
        .map(|mut partition| {
            std::thread::spawn(move || {
                let index = partition.index();
                let mut model = Model::default();
                let mut rng = rng(1000 + index as u64);
                let mut committed = 0;
                for _ in 0..150 {
                    // Groups index, index + N, ... all map to this partition.
                    let mut batch = random_batch(&mut rng, 3, 4, 6);
                    for op in &mut batch.ops {
                        let name = &op.key().as_bytes()[4..];
                        let group = op.key().group() * PARTITIONS + index;
                        let key = duplex_store::Key::in_group(group, name).unwrap();
                        set_key(op, key);
                    }
                    let expected = model.apply(&batch);
                    let result = partition.apply(&batch);
                    assert_eq!(expected.is_ok(), result.is_ok(), "partition {index}: {result:?}");
                    committed += result.is_ok() as u64;
                }
                assert_eq!(partition.stats().batches, committed);
                (partition, model)
            })
        })
        .collect();
    let mut combined = Model::default();
    for handle in handles {
        let (partition, model) = handle.join().unwrap();
        partition.close().unwrap();
        combined.objects.extend(model.objects);
    }
    assert!(combined.objects.len() > 10);
    let mut store = Store::open(&path, &config).unwrap();
    assert_matches_model(&mut store, &combined);
    drop(store);
    let report = fsck(&path, &config, true);
    assert!(report.clean, "{report:#?}");
    assert_eq!(report.partitions.len(), PARTITIONS as usize);
}

#[test]
fn a_key_sent_to_the_wrong_partition_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 32 << 20, 2, 64 << 10, &config);
    let mut store = Store::open(&path, &config).unwrap();
    let key = key(1, 0); // group 1 → partition 1
    assert_eq!(store.partition_of(key.as_bytes()), 1);
    let result = store.partition_mut(0).write(&key, 0, b"x");
    assert!(matches!(result, Err(duplex_store::StoreError::WrongPartition { expected: 1, actual: 0 })));
    store.partition_for(key.as_bytes()).write(&key, 0, b"x").unwrap();
}

fn set_key(op: &mut duplex_store::Op, new: duplex_store::Key) {
    use duplex_store::Op::*;
    match op {
        Write { key, .. }
        | WriteJournaled { key, .. }
        | Truncate { key, .. }
        | Zero { key, .. }
        | Delete { key }
        | CreatePreallocated { key, .. }
        | SetAttr { key, .. }
        | RemoveAttr { key, .. }
        | OmapSet { key, .. }
        | OmapRemove { key, .. }
        | OmapRemoveRange { key, .. }
        | DeleteIfOmapEmpty { key } => *key = new,
        Clone { key, source } => {
            let name = &source.as_bytes()[4..];
            *source = duplex_store::Key::in_group(new.group(), name).unwrap();
            *key = new;
        }
    }
}

/// A 32 MiB store of one partition: its directory (kept while it lives),
/// path, configuration, and the store mounted.
fn small_store() -> (tempfile::TempDir, std::path::PathBuf, duplex_store::StoreConfig, Store) {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 32 << 20, 1, 64 << 10, &config);
    let store = Store::open(&path, &config).unwrap();
    (dir, path, config, store)
}

/// Writes 256 KiB objects into `group` until the partition refuses one
/// for want of space (and only for that).
fn fill(partition: &mut Partition, group: u32) {
    for name in 0..=u8::MAX {
        match partition.write(&key(group, name), 0, &[7u8; 256 << 10]) {
            Ok(_) => {}
            Err(duplex_store::StoreError::NoSpace { .. }) => return,
            Err(err) => panic!("{err}"),
        }
    }
    panic!("a 32 MiB store took 64 MiB");
}

/// `duplex df`'s source: per group, the objects, their sizes and the
/// blocks mapped to them; a delete takes its object out, after a remount too.
#[test]
fn usage_by_group_counts_objects_sizes_and_blocks() {
    let (_dir, path, config, mut store) = small_store();
    let partition = store.partition_mut(0);
    partition.write(&key(3, 1), 0, &[1u8; 4096]).unwrap();
    partition.write(&key(3, 2), 8192, &[2u8; 100]).unwrap(); // a hole, then part of a block
    partition.write(&key(5, 1), 0, &[3u8; 3 * 4096]).unwrap();
    partition.write(&key(7, 1), 0, b"gone").unwrap();
    partition.apply(&duplex_store::Batch { ops: vec![duplex_store::Op::Delete { key: key(7, 1) }] }).unwrap();
    let usage = |partition: &Partition| -> Vec<(u32, u64, u64, u64)> {
        partition.usage_by_group().iter().map(|g| (g.group, g.objects, g.logical_bytes, g.allocated_bytes)).collect()
    };
    let expected = vec![(3, 2, 4096 + 8192 + 100, 2 * 4096), (5, 1, 3 * 4096, 3 * 4096)];
    assert_eq!(usage(partition), expected);
    assert_eq!(partition.groups(), vec![3, 5], "the groups with an object, found without a walk");
    partition.write(&key(u32::MAX, 1), 0, b"last").unwrap();
    assert_eq!(partition.groups(), vec![3, 5, u32::MAX]);
    partition.apply(&duplex_store::Batch { ops: vec![duplex_store::Op::Delete { key: key(u32::MAX, 1) }] }).unwrap();
    store.close().unwrap();
    let mut store = Store::open(&path, &config).unwrap();
    assert_eq!(usage(store.partition_mut(0)), expected, "the same after a remount");
}

/// A full partition whose objects were deleted takes new writes: the
/// deletes' blocks are freed by a later record, and planning allocates
/// before it frees, so every batch needing a block was refused and the
/// frees were never committed (issue 24: a full cluster wedged for good).
#[test]
fn a_full_partition_takes_writes_again_after_deletes() {
    let (_dir, path, config, mut store) = small_store();
    let partition = store.partition_mut(0);
    let chunk = vec![7u8; 256 << 10];
    fill(partition, 1);
    let mut deletes = duplex_store::Batch::new();
    for name in 0..4 {
        deletes.push(duplex_store::Op::Delete { key: key(1, name) });
    }
    partition.apply(&deletes).unwrap();
    for name in 0..4 {
        partition.write(&key(2, name), 0, &chunk).expect("the deleted objects' room");
    }
    assert!(matches!(partition.write(&key(3, 0), 0, &chunk), Err(duplex_store::StoreError::NoSpace { .. })));
    store.close().unwrap();
    let report = fsck(&path, &config, true);
    assert!(report.clean, "{report:#?}");
}

/// `Op::Zero`: blocks the object holds in the range read as zeros, whole
/// ones given back (a discard frees space; the dedup tier's eviction
/// relies on it), holes stay holes, nothing is allocated, the size stays,
/// and it works on a full partition (a TRIM on a full cluster).
#[test]
fn zero_clears_held_blocks_and_takes_no_space_even_when_full() {
    let (_dir, path, config, mut store) = small_store();
    let partition = store.partition_mut(0);
    let object = key(1, 1);
    // Blocks 0, 1 and 3 held; block 2 a hole; size 4 blocks.
    partition.write(&object, 0, &[1u8; 8192]).unwrap();
    partition.write(&object, 3 * 4096, &[3u8; 4096]).unwrap();
    let held = partition.stat(object.as_bytes()).unwrap().allocated_bytes;
    assert_eq!(held, 3 * 4096);
    fill(partition, 2);
    let free_before = partition.free_blocks();
    // From the middle of block 0 to past the end: block 2 stays a hole.
    partition.apply(duplex_store::Batch::new().zero(object.clone(), 100, 1 << 20)).expect("zero on a full partition");
    let info = partition.stat(object.as_bytes()).unwrap();
    assert_eq!((info.size, info.allocated_bytes), (4 * 4096, 4096), "blocks 1 and 3 given back, size kept");
    assert_eq!(partition.free_blocks(), free_before + 2, "blocks 1 and 3 free again");
    let data = partition.read(object.as_bytes(), 0, 4 * 4096).unwrap();
    assert_eq!(&data[..100], &[1u8; 100][..]);
    assert!(data[100..].iter().all(|b| *b == 0), "the rest reads as zeros");
    // An absent object stays absent.
    partition.apply(duplex_store::Batch::new().zero(key(1, 2), 0, 4096)).unwrap();
    assert!(!partition.exists(key(1, 2).as_bytes()));
    store.close().unwrap();
    assert!(fsck(&path, &config, true).clean);
}

/// Data blocks are shared: one partition fills nearly the whole store while
/// the others hold nothing, and once it empties, its chunks go back to the
/// pool (at its next checkpoint) and another partition fills the store in
/// turn, across remounts, with fsck clean (issue 24: one partition of an
/// OSD filled at 72% raw while the store had room).
#[test]
fn one_partition_fills_nearly_the_whole_store_and_gives_the_room_back() {
    const PARTITIONS: u32 = 4;
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 56 << 20, PARTITIONS, 64 << 10, &config);
    let mut store = Store::open(&path, &config).unwrap();
    let data_blocks = store.partition_mut(0).data_blocks();
    let superblock_chunks = store.superblock().data.chunks as usize;

    fill(store.partition_mut(1), 1);
    let first = store.partition_mut(1);
    let used = first.used_blocks();
    assert!(used * 100 >= data_blocks * 97, "partition 1 filled {used} of the store's {data_blocks} blocks");
    assert_eq!(first.owned_chunks().0, superblock_chunks, "it holds every chunk");
    assert_eq!(first.free_chunks(), 0);
    let refused = store.partition_mut(2).write(&key(2, 0), 0, &[1u8; 4096]);
    assert!(matches!(refused, Err(duplex_store::StoreError::NoSpace { .. })), "{refused:?}");
    store.close().unwrap();
    assert!(fsck(&path, &config, true).clean);

    let mut store = Store::open(&path, &config).unwrap();
    assert_eq!(store.partition_mut(1).used_blocks(), used, "the same after a remount");
    let partition = store.partition_mut(1);
    let names: Vec<duplex_store::Key> = partition.list(&[], None, usize::MAX);
    assert!(partition.read(names[7].as_bytes(), 0, 256 << 10).unwrap().iter().all(|b| *b == 7));
    for some in names.chunks(16) {
        let mut deletes = duplex_store::Batch::new();
        for name in some {
            deletes.push(duplex_store::Op::Delete { key: name.clone() });
        }
        partition.apply(&deletes).unwrap();
    }
    while partition.reclaims_owed() {
        partition.commit_reclaims().unwrap();
    }
    partition.checkpoint().unwrap();
    assert_eq!(partition.owned_chunks(), (0, 0), "an empty partition holds no chunk after a checkpoint");
    assert_eq!(partition.free_chunks(), superblock_chunks);

    fill(store.partition_mut(2), 2);
    let second = store.partition_mut(2);
    let used = second.used_blocks();
    assert!(used * 100 >= data_blocks * 97, "partition 2 filled {used} of {data_blocks} blocks");
    store.close().unwrap();
    let report = fsck(&path, &config, true);
    assert!(report.clean, "{report:#?}");
    let mut store = Store::open(&path, &config).unwrap();
    assert_eq!(store.partition_mut(1).object_count(), 0);
    let partition = store.partition_mut(2);
    assert!(partition.read(key(2, 3).as_bytes(), 0, 256 << 10).unwrap().iter().all(|b| *b == 7));
}

/// A checkpoint giving chunks back is cut by a power loss before its
/// writes are flushed: after remount the partition still holds them (the
/// journal still claims them) or none, never both it and another partition.
#[test]
fn a_power_cut_while_chunks_go_back_leaves_each_chunk_with_one_owner() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 40 << 20, 2, 64 << 10, &config);
    config.device.faults = Some(duplex_store::DeviceFaults::new());
    let faults = config.device.faults.clone().unwrap();
    let mut store = Store::open(&path, &config).unwrap();
    let partition = store.partition_mut(0);
    for name in 0..40u8 {
        partition.write(&key(0, name), 0, &[name; 256 << 10]).unwrap();
    }
    let claimed = partition.owned_chunks().0;
    assert!(claimed >= 2, "10 MiB take two 8 MiB chunks");
    let mut deletes = duplex_store::Batch::new();
    for name in 0..40u8 {
        deletes.push(duplex_store::Op::Delete { key: key(0, name) });
    }
    partition.apply(&deletes).unwrap();
    while partition.reclaims_owed() {
        partition.commit_reclaims().unwrap();
    }
    faults.cut_power_at_next_flush();
    let cut = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| partition.checkpoint()));
    assert!(cut.is_err(), "the power cut unwinds the checkpoint");
    drop(store);
    faults.disarm_power_cut();
    let mut store = Store::open(&path, &config).unwrap();
    let held = store.partition_mut(0).owned_chunks().0;
    assert!(held == 0 || held == claimed, "partition 0 holds {held} chunks after the cut");
    // Whatever it holds, partition 1 can take everything else, and nothing twice.
    fill(store.partition_mut(1), 1);
    store.close().unwrap();
    let report = fsck(&path, &config, true);
    assert!(report.clean, "{report:#?}");
}

/// A partition's onode slots are counted as objects take them: many small
/// objects run out of slots long before the data fills (the OSD counts
/// this use against its full ratios, issue 24), and a deleted object's
/// slot is free again after the next commit.
#[test]
fn onode_slots_are_counted_and_given_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(IoBackend::Auto);
    let path = dir.path().join("store.img");
    let options = duplex_store::MkfsOptions {
        partitions: 1,
        journal_bytes: Some(1 << 20),
        bytes_per_onode: 256 << 10,
        size_bytes: Some(16 << 20),
    };
    duplex_store::mkfs(&path, &options, &config).unwrap();
    let mut store = Store::open(&path, &config).unwrap();
    let partition = store.partition_mut(0);
    let slots = partition.onode_slots();
    assert!((64..=128).contains(&slots), "{slots} slots for 16 MiB at 256 KiB an onode");
    assert_eq!(partition.used_onode_slots(), 0);
    let mut created = Vec::new();
    'fill: for group in 0..4 {
        for name in 0..=u8::MAX {
            match partition.write(&key(group, name), 0, &[5u8; 4096]) {
                Ok(_) => created.push(key(group, name)),
                Err(duplex_store::StoreError::NoSpace { .. }) => break 'fill,
                Err(other) => panic!("{other}"),
            }
        }
    }
    assert_eq!(created.len() as u64, slots, "one slot an object, until none is left");
    assert_eq!(partition.used_onode_slots(), slots);
    let data_used = partition.used_blocks() * 1000 / partition.data_blocks();
    assert!(data_used < 100, "the slots ran out with {data_used}‰ of the data used");
    let mut deletes = duplex_store::Batch::new();
    for object in &created[..10] {
        deletes.push(duplex_store::Op::Delete { key: object.clone() });
    }
    partition.apply(&deletes).unwrap();
    partition.write(&created[10], 0, &[6u8; 4096]).unwrap();
    assert_eq!(partition.used_onode_slots(), slots - 10, "the deleted objects' slots are free after a commit");
    for name in 0..10 {
        partition.write(&key(9, name), 0, &[7u8; 4096]).expect("a freed slot");
    }
    store.close().unwrap();
    assert!(fsck(&path, &config, true).clean);
}
