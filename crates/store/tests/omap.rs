//! Omaps: an object's ordered key-value pairs, written in the same batch as
//! its data, durable as the batch is, read back in ranges; a clone copies
//! them, a delete drops them, and a batch that would break a limit changes
//! nothing.

mod common;

use common::*;
use duplex_store::{fsck, Batch, IoBackend, Key, Store, StoreError, MAX_OMAP_BYTES, MAX_OMAP_VALUE_LEN};

fn entries(count: u8, value_len: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    (0..count).map(|i| (format!("chunk-{i:03}").into_bytes(), vec![i; value_len])).collect()
}

/// Every entry of `key`'s omap, read `page` at a time as a client lists it.
fn read_paged(store: &mut Store, key: &Key, page: usize) -> Vec<(Vec<u8>, Vec<u8>)> {
    let partition = store.partition_for(key.as_bytes());
    let mut all = Vec::new();
    let mut start = Vec::new();
    loop {
        let got = partition.omap_range(key.as_bytes(), &start, None, page).unwrap();
        let Some((last, _)) = got.last() else { break };
        start = last.clone();
        start.push(0);
        all.extend(got);
    }
    all
}

#[test]
fn a_large_omap_lands_with_its_batch_survives_a_crash_and_reads_back_in_pages() {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 64 << 20, 1, 1 << 20, &config);
    let key = Key::in_group(3, b"image.0001").unwrap();
    let copy = Key::in_group(3, b"image.0001@snap").unwrap();
    // 15 values of 4 KiB and 100 small entries: near the 64 KiB limit.
    let mut big = entries(15, MAX_OMAP_VALUE_LEN);
    big.extend((0..100u8).map(|i| (format!("small-{i:03}").into_bytes(), vec![i; 24])));
    let total: usize = big.iter().map(|(k, v)| k.len() + v.len()).sum();
    assert!(total <= MAX_OMAP_BYTES && total > MAX_OMAP_BYTES - 8192, "{total} bytes");
    let mut store = Store::open(&path, &config).unwrap();
    let mut batch = Batch::new();
    batch.write(key.clone(), 0, vec![7u8; 8192]).omap_set(key.clone(), big.clone());
    store.partition_for(key.as_bytes()).apply(&batch).unwrap();
    // A data write that allocates rewrites the blob: the omap stays.
    store.partition_for(key.as_bytes()).write(&key, 65536, &[9u8; 4096]).unwrap();
    drop(store); // no checkpoint: the mount replays the journal
    let mut store = Store::open(&path, &config).unwrap();
    big.sort();
    assert_eq!(read_paged(&mut store, &key, 7), big, "the omap read in pages of 7");
    let partition = store.partition_for(key.as_bytes());
    assert_eq!(partition.read(key.as_bytes(), 0, 4).unwrap(), vec![7u8; 4]);
    assert_eq!(partition.omap_get(key.as_bytes(), b"small-042").unwrap(), Some(vec![42u8; 24]));
    assert_eq!(partition.omap_get(key.as_bytes(), b"small-04").unwrap(), None, "a prefix is no key");
    let range = partition.omap_range(key.as_bytes(), b"small-010", Some(b"small-013"), 100).unwrap();
    assert_eq!(range.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), [b"small-010", b"small-011", b"small-012"]);

    // A batch that would pass the limit changes nothing, its write included.
    let mut too_much = Batch::new();
    let extra = vec![(b"extra-1".to_vec(), vec![1; MAX_OMAP_VALUE_LEN]), (b"extra-2".to_vec(), vec![2; 4000])];
    too_much.write(key.clone(), 0, vec![1u8; 4096]).omap_set(key.clone(), extra);
    let refused = partition.apply(&too_much);
    assert!(matches!(refused, Err(StoreError::InvalidArgument(_))), "{refused:?}");
    assert_eq!(partition.read(key.as_bytes(), 0, 4).unwrap(), vec![7u8; 4]);

    // A clone copies the omap; changing either leaves the other alone.
    let mut batch = Batch::new();
    batch.clone_object(key.clone(), copy.clone());
    batch.omap_remove_range(key.clone(), b"small-".to_vec(), Some(b"small-~".to_vec()));
    batch.omap_remove(key.clone(), vec![b"chunk-000".to_vec(), b"absent".to_vec()]);
    partition.apply(&batch).unwrap();
    assert_eq!(partition.omap_range(copy.as_bytes(), &[], None, usize::MAX).unwrap(), big);
    let left = partition.omap_range(key.as_bytes(), &[], None, usize::MAX).unwrap();
    assert_eq!(left, big[1..15].to_vec(), "the head kept chunk-001..014");
    store.close().unwrap();

    // A delete drops it; an omap set on an absent object creates it empty.
    let mut store = Store::open(&path, &config).unwrap();
    let partition = store.partition_for(key.as_bytes());
    let mut batch = Batch::new();
    batch.delete(key.clone()).omap_set(key.clone(), entries(1, 3));
    partition.apply(&batch).unwrap();
    assert_eq!(partition.stat(key.as_bytes()).unwrap().size, 0);
    assert_eq!(partition.omap_range(key.as_bytes(), &[], None, 10).unwrap(), entries(1, 3));
    let mut batch = Batch::new();
    batch.omap_remove_range(key.clone(), Vec::new(), None);
    partition.apply(&batch).unwrap();
    assert!(partition.omap_range(key.as_bytes(), &[], None, 10).unwrap().is_empty(), "cleared");
    assert!(matches!(partition.omap_range(b"\0\0\0\x03nothing", &[], None, 1), Err(StoreError::NotFound)));
    store.close().unwrap();
    let report = fsck(&path, &config, true);
    assert!(report.clean, "fsck: {report:#?}");
}
