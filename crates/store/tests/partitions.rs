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
        | Delete { key }
        | CreatePreallocated { key, .. }
        | SetAttr { key, .. }
        | RemoveAttr { key, .. } => *key = new,
    }
}
