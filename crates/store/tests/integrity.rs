//! Integrity: corruption is detected, never returned as data; the last
//! journaled batch is recovered whether or not its data reached the device.

mod common;

use std::os::unix::fs::FileExt;

use common::*;
use duplex_store::{fsck, Batch, DirectIo, IoBackend, Key, MkfsOptions, Store, StoreConfig, StoreError};

fn patch(path: &std::path::Path, offset: u64, bytes: &[u8]) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
    file.sync_all().unwrap();
}

fn peek(path: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    let file = std::fs::File::open(path).unwrap();
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, offset).unwrap();
    buf
}

/// Writes `data` at the start of `key` in a fresh mount and closes it;
/// returns the device offset of the object's block holding byte `at`.
fn write_and_locate(path: &std::path::Path, config: &StoreConfig, key: &Key, data: &[u8], at: u64) -> u64 {
    let mut store = Store::open(path, config).unwrap();
    store.partition_mut(0).write(key, 0, data).unwrap();
    let offset = store.partition_mut(0).locate_data(key.as_bytes(), at).unwrap();
    store.close().unwrap();
    offset
}

fn setup() -> (tempfile::TempDir, std::path::PathBuf, StoreConfig) {
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 16 << 20, 1, 64 << 10, &config);
    (dir, path, config)
}

/// Closes `store` and asserts that fsck finds nothing wrong with it.
fn close_clean(store: Store, path: &std::path::Path, config: &StoreConfig) {
    store.close().unwrap();
    let report = fsck(path, config, true);
    assert!(report.clean, "{report:#?}");
}

#[test]
fn flipped_data_byte_fails_the_read_with_a_checksum_error() {
    let (_dir, path, config) = setup();
    let key = key(0, 1);
    let offset = write_and_locate(&path, &config, &key, &[0xAB; 8192], 4096);
    let mut byte = peek(&path, offset + 100, 1);
    byte[0] ^= 0x01;
    patch(&path, offset + 100, &byte);

    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    assert_eq!(p.read(key.as_bytes(), 0, 4096).unwrap(), vec![0xAB; 4096], "the intact block still reads");
    match p.read(key.as_bytes(), 4096, 10) {
        Err(StoreError::ChecksumMismatch { block, device_offset, .. }) => {
            assert_eq!(device_offset, offset);
            assert!(block > 0 || offset > 0);
        }
        other => panic!("expected a checksum error, got {other:?}"),
    }
    // A partial overwrite of the bad block needs its old contents: refused, not merged with garbage.
    assert!(matches!(p.write(&key, 4096 + 10, b"x"), Err(StoreError::ChecksumMismatch { .. })));
    // A full overwrite repairs it.
    p.write(&key, 4096, &[0xCD; 4096]).unwrap();
    assert_eq!(p.read(key.as_bytes(), 4096, 4096).unwrap(), vec![0xCD; 4096]);
    close_clean(store, &path, &config);
}

#[test]
fn fsck_reports_a_flipped_data_byte() {
    let (_dir, path, config) = setup();
    let key = key(0, 2);
    let offset = write_and_locate(&path, &config, &key, &[7; 4096], 0);
    assert!(fsck(&path, &config, true).clean);
    patch(&path, offset + 4095, &[0]);
    let report = fsck(&path, &config, true);
    assert!(!report.clean);
    assert_eq!(report.partitions[0].issues[0].kind, "data_checksum", "{report:#?}");
    // Without data verification the metadata alone is still consistent.
    assert!(fsck(&path, &config, false).clean);
}

#[test]
fn flipped_onode_byte_is_reported_by_fsck() {
    let (_dir, path, config) = setup();
    let key = key(0, 3);
    let mut store = Store::open(&path, &config).unwrap();
    let mut batch = Batch::new();
    batch.write(key.clone(), 0, vec![1; 5000]).set_attr(key.clone(), "owner", "alice");
    store.partition_mut(0).apply(&batch).unwrap();
    let onode = store.partition_mut(0).locate_onode(key.as_bytes()).unwrap();
    store.close().unwrap();
    let mut byte = peek(&path, onode + 40, 1);
    byte[0] ^= 0x80;
    patch(&path, onode + 40, &byte);

    let report = fsck(&path, &config, true);
    assert!(!report.clean);
    let kinds: Vec<&str> = report.partitions[0].issues.iter().map(|i| i.kind.as_str()).collect();
    assert!(kinds.contains(&"onode_corrupt"), "{report:#?}");
    assert!(kinds.contains(&"block_leaked"), "the object's blocks lose their owner: {report:#?}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["clean"], false);
    // The store still mounts; the damaged object is unreadable, not wrong.
    let mut store = Store::open(&path, &config).unwrap();
    assert!(matches!(store.partition_mut(0).read(key.as_bytes(), 0, 10), Err(StoreError::NotFound)));
}

#[test]
fn corrupt_superblock_refuses_to_mount() {
    let (_dir, path, config) = setup();
    patch(&path, 30, &[0xFF]);
    assert!(matches!(Store::open(&path, &config), Err(StoreError::Corrupt(_))));
    let report = fsck(&path, &config, true);
    assert!(!report.clean);
    assert_eq!(report.issues[0].kind, "mount");
}

/// Commits `first`, checkpoints, commits `second` (journaled only), and
/// drops the store without a checkpoint, as a crash after the flush would.
fn journaled_overwrite(
    path: &std::path::Path,
    config: &StoreConfig,
    key: &Key,
    first: Option<&[u8]>,
    second: &[u8],
) -> u64 {
    let mut store = Store::open(path, config).unwrap();
    if let Some(first) = first {
        store.partition_mut(0).write(key, 0, first).unwrap();
    } else {
        let mut batch = Batch::new();
        batch.create_preallocated(key.clone(), 1 << 20);
        store.partition_mut(0).apply(&batch).unwrap();
    }
    store.close().unwrap();
    let mut store = Store::open(path, config).unwrap();
    store.partition_mut(0).write(key, 0, second).unwrap();
    let offset = store.partition_mut(0).locate_data(key.as_bytes(), 0).unwrap();
    drop(store);
    offset
}

#[test]
fn last_record_whose_data_never_landed_reads_the_old_data() {
    let (_dir, path, config) = setup();
    let key = key(0, 4);
    let offset = journaled_overwrite(&path, &config, &key, Some(&[1; 4096]), &[2; 4096]);
    patch(&path, offset, &[1; 4096]); // the new data "did not reach the device"
    let report = fsck(&path, &config, true);
    assert!(report.clean, "{report:#?}");
    let mut store = Store::open(&path, &config).unwrap();
    assert_eq!(store.partition_mut(0).read(key.as_bytes(), 0, 4096).unwrap(), vec![1; 4096]);
    close_clean(store, &path, &config);
}

#[test]
fn last_record_whose_data_landed_reads_the_new_data() {
    let (_dir, path, config) = setup();
    let key = key(0, 5);
    journaled_overwrite(&path, &config, &key, Some(&[1; 4096]), &[2; 4096]);
    let mut store = Store::open(&path, &config).unwrap();
    assert_eq!(store.partition_mut(0).read(key.as_bytes(), 0, 4096).unwrap(), vec![2; 4096]);
}

#[test]
fn first_write_to_preallocated_block_that_never_landed_reads_zeros() {
    let (_dir, path, config) = setup();
    let key = key(0, 6);
    let offset = journaled_overwrite(&path, &config, &key, None, &[9; 4096]);
    patch(&path, offset, &[0x5A; 4096]); // stale bytes from an earlier owner
    assert!(fsck(&path, &config, true).clean);
    let mut store = Store::open(&path, &config).unwrap();
    assert_eq!(store.partition_mut(0).read(key.as_bytes(), 0, 4096).unwrap(), vec![0; 4096]);
}

/// Mount reads a block of the last record that matches neither crc as a
/// write that never landed, and a first write's block as a hole again
/// (the test above). So a batch must never land data over the previous
/// record's first writes without its own record: with a reordering write
/// cache it could, and the block came back as zeros that pass every check
/// (found by `crash_test_with_a_reordering_write_cache`). Such a batch now
/// flushes its record before its data; other batches still flush once.
#[test]
fn overwriting_the_last_records_first_write_makes_the_record_durable_first() {
    let (_dir, path, config) = setup();
    let key = key(0, 8);
    let mut store = Store::open(&path, &config).unwrap();
    let partition = store.partition_mut(0);
    let flushes = |p: &duplex_store::Partition| (p.stats().io.flushes, p.stats().ordered_commits);
    let start = flushes(partition);
    partition.write(&key, 0, &[1; 4096]).unwrap(); // the block's first write
    assert_eq!(flushes(partition), (start.0 + 1, 0), "one flush per batch");
    partition.write(&key, 512, &[2; 512]).unwrap(); // in place, over that first write
    assert_eq!(flushes(partition), (start.0 + 3, 1), "record flushed, then data flushed");
    partition.write(&key, 1024, &[3; 512]).unwrap(); // the block is no first write of the last record now
    assert_eq!(flushes(partition), (start.0 + 4, 1));
    let mut expected = vec![1u8; 4096];
    expected[512..1024].fill(2);
    expected[1024..1536].fill(3);
    assert_eq!(partition.read(key.as_bytes(), 0, 4096).unwrap(), expected);
    partition.checkpoint().unwrap();
    let after_checkpoint = flushes(partition);
    partition.write(&key, 0, &[4; 512]).unwrap();
    assert_eq!(flushes(partition), (after_checkpoint.0 + 1, 1), "after a checkpoint no record is recovered at mount");
}

/// How a batch that zeroes or cuts off a block and writes part of it
/// again came out of a power cut, and what it cost.
struct CutBatch {
    /// Logical block 2 of the object, read after remount (clipped to its size).
    got: Result<Vec<u8>, StoreError>,
    /// That block before the batch and after it (zero-padded).
    old: Vec<u8>,
    new: Vec<u8>,
    /// Flushes the batch made before the cut, and copies flushed first.
    flushes: u64,
    copies_flushed_first: u64,
}

/// Makes object `k` (blocks 0..4, acknowledged), applies `setup` durably,
/// then cuts the power in `batch` after its record is durable and before
/// its data is: the batch also writes in place over the previous record's
/// first write of another object's block, so it flushes its record before
/// its data (an ordered commit), and the power goes before its last flush.
fn cut_after_the_record(setup: impl Fn(&mut Batch, &Key), batch: impl Fn(&mut Batch, &Key)) -> CutBatch {
    let dir = tempfile::tempdir().unwrap();
    let mut config = test_config(IoBackend::Auto);
    let path = make_store(dir.path(), 16 << 20, 1, 64 << 10, &config);
    let plain = config.clone();
    let faults = duplex_store::DeviceFaults::new();
    config.device.faults = Some(faults.clone());
    let (k, other) = (key(0, 1), key(0, 2));
    let mut before = Batch::new();
    before.write(k.clone(), 0, (0..4 * BLOCK).map(|i| (i / 7) as u8 | 1).collect::<Vec<u8>>());
    let mut prepare = Batch::new();
    setup(&mut prepare, &k);
    let mut model = Model::default();
    model.apply(&before).unwrap();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    p.apply(&before).unwrap();
    if !prepare.is_empty() {
        model.apply(&prepare).unwrap();
        p.apply(&prepare).unwrap();
    }
    p.write(&other, 0, &[5; BLOCK]).unwrap(); // the last record's first write of a block
    let mut cut = Batch::new();
    batch(&mut cut, &k);
    let mut after = model.clone();
    after.apply(&cut).unwrap();
    cut.write(other.clone(), 100, vec![6; 10]); // in place over it: an ordered commit
    let stats = p.stats();
    let unsynced = p.apply_unsynced(&cut).unwrap();
    assert_eq!(p.stats().ordered_commits, stats.ordered_commits + 1, "the record was flushed before the data");
    // Before the cut, the partition reads the batch's result.
    let visible = after.objects[k.as_bytes()].data.len().min(3 * BLOCK) - 2 * BLOCK;
    let read = p.read(k.as_bytes(), 2 * BLOCK as u64, BLOCK as u64).unwrap();
    assert!(read[..] == after.objects[k.as_bytes()].data[2 * BLOCK..2 * BLOCK + visible], "read before the cut");
    let (flushes, copies_flushed_first) =
        (p.stats().io.flushes - stats.io.flushes, p.stats().copies_flushed_first - stats.copies_flushed_first);
    // The power goes before the batch's last flush: its data writes are lost.
    assert!(faults.unflushed_bytes() > 0, "the batch's data is still in the write cache");
    drop(unsynced);
    drop(store);
    let report = fsck(&path, &plain, true);
    assert!(report.clean, "{report:#?}");
    let mut store = Store::open(&path, &plain).unwrap();
    let got = store.partition_mut(0).read(k.as_bytes(), 2 * BLOCK as u64, BLOCK as u64);
    store.close().unwrap();
    // Padded with zeros past the object's end; a read stops at its size.
    let block = |model: &Model| {
        let data = &model.objects[k.as_bytes()].data;
        let mut block = data[2 * BLOCK..data.len().min(3 * BLOCK)].to_vec();
        block.resize(BLOCK, 0);
        block
    };
    CutBatch { got, old: block(&model), new: block(&after), flushes, copies_flushed_first }
}

/// Which of its old and new contents the block came back as.
fn old_or_new(cut: &CutBatch, what: &str) -> &'static str {
    let got = cut.got.as_ref().unwrap_or_else(|err| panic!("{what}: {err}"));
    let visible = got.len();
    assert!(visible > 0 && visible <= BLOCK, "{what}: read {visible} bytes");
    if got[..] == cut.old[..visible] {
        "old"
    } else if got[..] == cut.new[..visible] {
        "new"
    } else {
        panic!(
            "{what}: the block is neither its old nor its new contents (zeros: {}; first bytes {:?})",
            got.iter().all(|b| *b == 0),
            &got[..8]
        )
    }
}

/// Regression (`crash_test_with_chunks_changing_hands`, seed
/// 2864036408060882017): a zero that covers a block whole unmapped it and
/// freed its data block, and a write into the same block in the same batch
/// then took a fresh one. When the record landed and the fresh block's data
/// did not, mount read it as a first write that never landed, a hole:
/// zeros, where the block held acknowledged data and the batch meant other
/// bytes, with no checksum to fail. The write now maps the block the zero
/// (or a truncate) freed back, in place, at no cost: old or new contents,
/// told by its crc32c. One a clone still holds is copied, flushed before
/// the record, as any copy on write.
#[test]
fn a_zeroed_block_written_again_in_one_batch_is_old_or_new_after_a_power_cut() {
    let nothing = |_: &mut Batch, _: &Key| {};
    let at = |offset: usize| 2 * BLOCK as u64 + offset as u64;
    let zero_then_write = |batch: &mut Batch, k: &Key| {
        batch.zero(k.clone(), at(0) - 100, BLOCK as u64 + 200);
        batch.write(k.clone(), at(883), vec![9; 3028]);
    };
    let cut = cut_after_the_record(nothing, zero_then_write);
    assert_eq!(old_or_new(&cut, "zero, then write"), "old", "the block was overwritten in place");
    assert_eq!((cut.flushes, cut.copies_flushed_first), (1, 0), "only the ordered commit's record flush");

    let truncate_then_write = |batch: &mut Batch, k: &Key| {
        batch.truncate(k.clone(), BLOCK as u64 + 10);
        batch.write(k.clone(), at(883), vec![9; 3028]);
    };
    let cut = cut_after_the_record(nothing, truncate_then_write);
    assert_eq!(old_or_new(&cut, "truncate, then write"), "old");

    // Through the journal, the batch's bytes are in its record: new.
    let zero_then_journaled_write = |batch: &mut Batch, k: &Key| {
        batch.zero(k.clone(), at(0), BLOCK as u64);
        batch.write_journaled(k.clone(), at(883), vec![9; 100]);
    };
    let cut = cut_after_the_record(nothing, zero_then_journaled_write);
    assert_eq!(old_or_new(&cut, "zero, then a journaled write"), "new");
    // A block with a deferred image changes only by patches: new too.
    let deferred = |batch: &mut Batch, k: &Key| {
        batch.write_journaled(k.clone(), at(10), vec![8; 20]);
    };
    let cut = cut_after_the_record(deferred, zero_then_write);
    assert_eq!(old_or_new(&cut, "zero a deferred block, then write"), "new");

    // The block is shared with a clone: the zero only drops a reference,
    // and the write's new block is flushed before the record.
    let clone = |batch: &mut Batch, k: &Key| {
        batch.clone_object(k.clone(), key(0, 3));
    };
    let cut = cut_after_the_record(clone, zero_then_write);
    assert_eq!(old_or_new(&cut, "zero a shared block, then write"), "new");
    assert_eq!(cut.copies_flushed_first, 1);

    // Regression (`crash_test`, seed 10963303577232946080, a process
    // crash): the object is made again in the batch as a clone of another,
    // whose copy of the block the batch then cuts off; the write found the
    // block held once and wrote it in place, so the cut showed the
    // source's bytes there. It is copied now, flushed before the record.
    let source = key(0, 3);
    let source_data = {
        let source = source.clone();
        move |batch: &mut Batch, _: &Key| {
            batch.write(source.clone(), 0, vec![0x73; 4 * BLOCK]);
        }
    };
    let made_again = move |batch: &mut Batch, k: &Key| {
        batch.delete(k.clone());
        batch.clone_object(source.clone(), k.clone());
        batch.truncate(source.clone(), BLOCK as u64 + 10);
        batch.write(k.clone(), at(883), vec![9; 3028]);
    };
    let cut = cut_after_the_record(source_data, made_again);
    assert_eq!(old_or_new(&cut, "made again as a clone whose source is cut, then write"), "new");
    assert_eq!(cut.copies_flushed_first, 1);
}

#[test]
fn torn_block_of_the_last_record_is_an_error_not_data() {
    let (_dir, path, config) = setup();
    let key = key(0, 7);
    let offset = journaled_overwrite(&path, &config, &key, Some(&[1; 4096]), &[2; 4096]);
    let mut torn = vec![2u8; 4096];
    torn[2048..].fill(1); // half new, half old: a power loss mid-write
    patch(&path, offset, &torn);
    let report = fsck(&path, &config, true);
    assert_eq!(report.partitions[0].issues[0].kind, "data_checksum");
    let mut store = Store::open(&path, &config).unwrap();
    assert!(matches!(store.partition_mut(0).read(key.as_bytes(), 0, 4096), Err(StoreError::ChecksumMismatch { .. })));
}

#[test]
fn preallocated_overwrites_change_no_metadata() {
    let (_dir, path, config) = setup();
    let key = key(0, 8);
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let mut batch = Batch::new();
    batch.create_preallocated(key.clone(), 4 << 20);
    p.apply(&batch).unwrap();
    let info = p.stat(key.as_bytes()).unwrap();
    assert!(info.preallocated);
    assert_eq!((info.size, info.allocated_bytes), (4 << 20, 4 << 20));
    let mut batch = Batch::new();
    for i in 0..16u64 {
        batch.write(key.clone(), i * 37 * 4096, vec![i as u8; 4096]);
    }
    let commit = p.apply(&batch).unwrap();
    // 16 data blocks and one sector-sized journal record: no onode, no bitmap block.
    assert_eq!(commit.data_blocks, 16);
    assert!(commit.journal_bytes <= 4096, "record of {} bytes", commit.journal_bytes);
    assert_eq!(p.stat(key.as_bytes()).unwrap(), info, "an overwrite inside the extent changes no metadata");
    assert_eq!(p.read(key.as_bytes(), 37 * 4096 * 3, 4096).unwrap(), vec![3; 4096]);
    assert_eq!(
        p.read(key.as_bytes(), 4096, 4096).unwrap(),
        vec![0; 4096],
        "unwritten pre-allocated blocks read as zeros"
    );
}

#[test]
fn no_space_is_an_error_and_changes_nothing() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let free = p.free_blocks();
    let mut batch = Batch::new();
    batch.write(key(0, 1), 0, vec![1; 4096]).create_preallocated(key(0, 2), (free + 1) * 4096);
    assert!(matches!(p.apply(&batch), Err(StoreError::NoSpace { .. }) | Err(StoreError::InvalidArgument(_))));
    assert_eq!(p.free_blocks(), free, "a refused batch reserves nothing");
    assert!(!p.exists(key(0, 1).as_bytes()), "a refused batch applies nothing");
    close_clean(store, &path, &config);
}

#[test]
fn delete_defers_deallocation_until_a_later_commit() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let free = p.free_blocks();
    let mut batch = Batch::new();
    batch.create_preallocated(key(0, 1), 1 << 20);
    p.apply(&batch).unwrap();
    assert_eq!(p.free_blocks(), free - 256);
    let mut batch = Batch::new();
    batch.delete(key(0, 1));
    p.apply(&batch).unwrap();
    assert!(!p.exists(key(0, 1).as_bytes()));
    assert_eq!(p.free_blocks(), free - 256, "blocks stay allocated to the deleted onode");
    store.close().unwrap();
    assert!(fsck(&path, &config, true).clean, "a deleted onode awaiting reclaim still owns its blocks");
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    p.write(&key(0, 2), 0, b"next").unwrap();
    assert_eq!(p.free_blocks(), free - 1, "the next commit reclaimed the space");
    close_clean(store, &path, &config);
}

/// tmpfs refuses O_DIRECT before Linux 6.6 and accepts it after, so probe
/// first: where it is refused, mkfs must say so clearly, and the fallback
/// configuration must work; where it is accepted, the store must just work.
#[test]
fn tmpfs_o_direct_is_refused_clearly_or_used() {
    use std::os::unix::fs::OpenOptionsExt;
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        return;
    };
    let path = dir.path().join("store.img");
    std::fs::write(&path, b"").unwrap();
    let direct_ok = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&path).is_ok();
    let options = MkfsOptions { partitions: 1, size_bytes: Some(8 << 20), ..MkfsOptions::default() };
    let result = mkfs(&path, &options, &StoreConfig::default());
    let config = if direct_ok {
        result.expect("O_DIRECT works here, so mkfs must");
        StoreConfig::default()
    } else {
        match result {
            Err(err @ StoreError::DirectIoUnsupported { .. }) => {
                assert!(err.to_string().contains("direct_io"))
            }
            other => panic!("expected DirectIoUnsupported, got {other:?}"),
        }
        let mut config = StoreConfig::default();
        config.device.direct_io = DirectIo::Fallback;
        mkfs(&path, &options, &config).unwrap();
        config
    };
    let mut store = Store::open(&path, &config).unwrap();
    store.partition_mut(0).write(&key(0, 1), 0, b"hello").unwrap();
    assert_eq!(store.partition_mut(0).read(key(0, 1).as_bytes(), 0, 5).unwrap(), b"hello");
}

use duplex_store::mkfs;

#[test]
fn a_second_writer_is_refused_while_the_store_is_mounted() {
    let (_dir, path, mut config) = setup();
    config.device.lock_wait = std::time::Duration::from_millis(50);
    let store = Store::open(&path, &config).unwrap();
    assert!(matches!(Store::open(&path, &config), Err(StoreError::InUse { .. })));
    let report = fsck(&path, &config, false);
    assert_eq!(report.issues[0].kind, "mount", "a read-only check waits for the writer too");
    drop(store);
    Store::open(&path, &config).unwrap();
}

/// Regression (found by the crash test): an object modified and deleted in
/// one batch left a deleted onode naming blocks the batch had freed; once
/// reused, a remount's reclaim freed them under their new owner.
#[test]
fn delete_after_truncate_in_one_batch_reclaims_only_what_it_owns() {
    let (_dir, path, config) = setup();
    let victim = key(0, 1);
    let mut store = Store::open(&path, &config).unwrap();
    store.partition_mut(0).write(&victim, 0, &[1; 8 * 4096]).unwrap();
    let mut batch = Batch::new();
    batch.truncate(victim.clone(), 4096).delete(victim.clone());
    store.partition_mut(0).apply(&batch).unwrap();
    // Reuse the freed blocks, then "crash" (no checkpoint): remount replays.
    store.partition_mut(0).write(&key(0, 2), 0, &[2; 8 * 4096]).unwrap();
    drop(store);
    let report = fsck(&path, &config, true);
    assert!(report.clean, "{report:#?}");
    let mut store = Store::open(&path, &config).unwrap();
    store.partition_mut(0).write(&key(0, 3), 0, b"reclaim runs now").unwrap();
    assert_eq!(store.partition_mut(0).read(key(0, 2).as_bytes(), 0, 8 * 4096).unwrap(), vec![2; 8 * 4096]);
    close_clean(store, &path, &config);
}

/// Regression (found by the crash test): growing an object whose tail block
/// holds stale bytes past its size, with a crash before the block's new
/// contents land, must not make those stale bytes visible.
#[test]
fn interrupted_growth_never_exposes_bytes_past_the_old_size() {
    let (_dir, path, config) = setup();
    let k = key(0, 9);
    let mut store = Store::open(&path, &config).unwrap();
    store.partition_mut(0).write(&k, 0, &[7; 8192]).unwrap();
    let mut batch = Batch::new();
    batch.truncate(k.clone(), 5000); // bytes 5000..8192 stay on disk, invisible
    store.partition_mut(0).apply(&batch).unwrap();
    let offset = store.partition_mut(0).locate_data(k.as_bytes(), 4096).unwrap();
    store.close().unwrap();
    let old_block = peek(&path, offset, 4096);
    let mut store = Store::open(&path, &config).unwrap();
    let mut batch = Batch::new();
    batch.truncate(k.clone(), 9000);
    store.partition_mut(0).apply(&batch).unwrap();
    drop(store);
    patch(&path, offset, &old_block); // the zeroed tail "did not land"
    let mut store = Store::open(&path, &config).unwrap();
    let data = store.partition_mut(0).read(k.as_bytes(), 0, 9000).unwrap();
    assert_eq!(&data[..5000], &[7; 5000][..]);
    assert!(data[5000..].iter().all(|b| *b == 0), "stale bytes became visible");
    close_clean(store, &path, &config);
}

/// Regression (found by the crash test): shrinking then growing in one batch
/// must not zero bytes that were visible before the batch when recovery
/// finds the old contents.
#[test]
fn interrupted_shrink_and_grow_keeps_bytes_that_were_visible() {
    let (_dir, path, config) = setup();
    let k = key(0, 10);
    let offset = write_and_locate(&path, &config, &k, &[3; 8192], 4096);
    let mut store = Store::open(&path, &config).unwrap();
    let mut batch = Batch::new();
    batch.truncate(k.clone(), 5000).truncate(k.clone(), 8192);
    store.partition_mut(0).apply(&batch).unwrap();
    drop(store);
    patch(&path, offset, &[3; 4096]); // the old block: the batch's data "did not land"
    let mut store = Store::open(&path, &config).unwrap();
    assert_eq!(store.partition_mut(0).read(k.as_bytes(), 0, 8192).unwrap(), vec![3; 8192], "old contents, whole");
    close_clean(store, &path, &config);
}

/// A journaled write never overwrites a block in place, whole blocks
/// included (an interrupted in-place overwrite leaves a block failing its
/// checksum, and journaled data has no other copy); a whole block replaced
/// that way is not read first, so it also repairs a damaged one; and a
/// crash before any checkpoint loses none of it (replay rebuilds it).
#[test]
fn a_journaled_whole_block_goes_through_the_journal_and_repairs_a_damaged_block() {
    let (_dir, path, config) = setup();
    let key = key(0, 3);
    let offset = write_and_locate(&path, &config, &key, &[1; 8192], 0);
    patch(&path, offset + 7, &[0xFF]);

    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    assert!(matches!(p.read(key.as_bytes(), 0, 4096), Err(StoreError::ChecksumMismatch { .. })));
    let mut batch = Batch::new();
    batch.write_journaled(key.clone(), 0, vec![2; 4096]).write_journaled(key.clone(), 4096 + 10, vec![3; 20]);
    let info = p.apply(&batch).unwrap();
    assert_eq!(info.data_blocks, 0, "nothing written in place");
    assert!(info.journal_bytes > 4096, "the whole block travels in the journal");
    assert_eq!(peek(&path, offset, 8)[7], 0xFF, "the damaged block on disk is untouched until a checkpoint");
    let mut expected = vec![1u8; 4096];
    expected[10..30].fill(3);
    assert_eq!(p.read(key.as_bytes(), 0, 4096).unwrap(), vec![2; 4096]);
    assert_eq!(p.read(key.as_bytes(), 4096, 4096).unwrap(), expected);
    // A crash: only the journal holds both blocks.
    drop(store);
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    assert_eq!(p.read(key.as_bytes(), 0, 4096).unwrap(), vec![2; 4096]);
    assert_eq!(p.read(key.as_bytes(), 4096, 4096).unwrap(), expected);
    store.close().unwrap();
    assert_eq!(peek(&path, offset, 4096), vec![2; 4096], "the checkpoint of close wrote it back");
    assert!(fsck(&path, &config, true).clean);
}

/// `Op::Clone` (issue 25's foundation): the copy shares the original's
/// blocks, so it takes no data space; a write to either copies one 4 KiB
/// block first and leaves the other as it was; shared blocks are freed
/// only with their last reference; a remount counts the references again
/// from the onodes, and fsck checks them.
#[test]
fn a_clone_shares_blocks_until_either_copy_writes_one() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let free = p.free_blocks();
    let (original, copy) = (key(0, 1), key(0, 2));
    p.apply(Batch::new().create_preallocated(original.clone(), 1 << 20).set_attr(original.clone(), "a", "1")).unwrap();
    p.write(&original, 0, &[1u8; 1 << 20]).unwrap();
    assert_eq!(p.free_blocks(), free - 256);
    p.apply(Batch::new().clone_object(original.clone(), copy.clone())).unwrap();
    assert_eq!(p.free_blocks(), free - 256, "a clone copies no data");
    assert_eq!(p.read(copy.as_bytes(), 0, 1 << 20).unwrap(), vec![1u8; 1 << 20]);
    assert_eq!(p.get_attr(copy.as_bytes(), b"a").unwrap(), b"1".to_vec());
    // A 4 KiB write to the original copies one block; a partial write to
    // the copy copies one block and keeps the rest of its bytes.
    p.write(&original, 8192, &[2u8; 4096]).unwrap();
    p.write(&copy, 100, b"copy").unwrap();
    assert_eq!(p.free_blocks(), free - 258, "two blocks copied on write");
    let mut expected = vec![1u8; 1 << 20];
    expected[100..104].copy_from_slice(b"copy");
    assert_eq!(p.read(copy.as_bytes(), 0, 1 << 20).unwrap(), expected);
    let mut expected = vec![1u8; 1 << 20];
    expected[8192..12288].fill(2);
    assert_eq!(p.read(original.as_bytes(), 0, 1 << 20).unwrap(), expected);
    // A batch whose clone is not its first operation on the objects is refused whole.
    let refused = p.apply(Batch::new().write(key(0, 3), 0, b"x").clone_object(key(0, 3), key(0, 4)));
    assert!(matches!(refused, Err(StoreError::InvalidArgument(_))), "{refused:?}");
    assert!(!p.exists(key(0, 3).as_bytes()));
    close_clean(store, &path, &config);

    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    assert_eq!(p.free_blocks(), free - 258, "the same after a remount");
    // Deleting the original frees only what it alone held: its copy of
    // block 2, and its block 0, which the copy replaced with its own.
    p.apply(Batch::new().delete(original.clone())).unwrap();
    p.commit_reclaims().unwrap();
    assert_eq!(p.free_blocks(), free - 256, "the original's own blocks are free, the shared ones are the copy's");
    assert_eq!(p.read(copy.as_bytes(), 0, 4).unwrap(), vec![1u8; 4]);
    close_clean(store, &path, &config);
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    p.apply(Batch::new().delete(copy.clone())).unwrap();
    p.commit_reclaims().unwrap();
    assert_eq!(p.free_blocks(), free, "every block free with its last reference");
    close_clean(store, &path, &config);
}

/// After a clone, writes in scattered order copy each block to wherever
/// the allocator finds room: the object's map becomes one extent per block
/// (kept by the index as a direct table). In-place overwrites, growth, a
/// truncate and a delete of such an object, a remount that rebuilds its
/// index entry from the onode, and fsck all agree with a plain model.
#[test]
fn an_object_scattered_by_copies_on_write_reads_remounts_and_frees_like_any() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let free = p.free_blocks();
    let (head, snap) = (key(0, 1), key(0, 2));
    const BLOCKS: u64 = 256;
    p.write(&head, 0, &vec![1u8; (BLOCKS * 4096) as usize]).unwrap();
    p.apply(Batch::new().clone_object(head.clone(), snap.clone())).unwrap();
    let mut model = vec![1u8; (BLOCKS * 4096) as usize];
    // Every block once, in an order with no two neighbours in a row.
    for step in 0..BLOCKS {
        let block = step * 97 % BLOCKS;
        let byte = (step % 250) as u8 + 2;
        p.write(&head, block * 4096, &[byte; 4096]).unwrap();
        model[(block * 4096) as usize..((block + 1) * 4096) as usize].fill(byte);
    }
    assert_eq!(p.free_blocks(), free - 2 * BLOCKS, "each block copied once");
    // In place now: nothing allocated.
    p.write(&head, 5 * 4096 + 10, b"in place").unwrap();
    model[5 * 4096 + 10..5 * 4096 + 18].copy_from_slice(b"in place");
    assert_eq!(p.free_blocks(), free - 2 * BLOCKS, "an overwrite of a copied block is in place");
    assert_eq!(p.read(head.as_bytes(), 0, model.len() as u64).unwrap(), model);
    assert_eq!(p.read(snap.as_bytes(), 0, model.len() as u64).unwrap(), vec![1u8; model.len()]);
    assert_eq!(p.diff(head.as_bytes(), snap.as_bytes()), vec![(0, BLOCKS * 4096)]);
    close_clean(store, &path, &config);

    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    assert_eq!(p.read(head.as_bytes(), 0, model.len() as u64).unwrap(), model, "the same after a remount");
    // Grown by a block, then cut to half: what was cut is freed.
    p.write(&head, BLOCKS * 4096, &[9u8; 4096]).unwrap();
    p.apply(Batch::new().truncate(head.clone(), BLOCKS / 2 * 4096 + 100)).unwrap();
    model.truncate((BLOCKS / 2 * 4096 + 100) as usize);
    assert_eq!(p.read(head.as_bytes(), 0, 2 * model.len() as u64).unwrap(), model);
    assert_eq!(p.free_blocks(), free - BLOCKS - (BLOCKS / 2 + 1));
    close_clean(store, &path, &config);

    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    assert_eq!(p.read(head.as_bytes(), 0, 2 * model.len() as u64).unwrap(), model);
    p.apply(Batch::new().delete(head.clone()).delete(snap.clone())).unwrap();
    p.commit_reclaims().unwrap();
    assert_eq!(p.free_blocks(), free, "nothing leaked");
    close_clean(store, &path, &config);
}

/// A clone of a clone, truncates and zeroes of shared blocks: each object
/// reads as if it had its own copy, and fsck's reference counts agree.
#[test]
fn clones_of_clones_truncated_and_zeroed_read_as_their_own_copies() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let free = p.free_blocks();
    let (a, b, c) = (key(0, 1), key(0, 2), key(0, 3));
    p.write(&a, 0, &[5u8; 64 << 10]).unwrap();
    p.apply(Batch::new().clone_object(a.clone(), b.clone())).unwrap();
    p.apply(Batch::new().clone_object(b.clone(), c.clone()).truncate(b.clone(), 10_000)).unwrap();
    p.apply(Batch::new().zero(c.clone(), 4096, 8192)).unwrap();
    p.apply(Batch::new().truncate(a.clone(), 0)).unwrap();
    assert_eq!(p.read(a.as_bytes(), 0, 10).unwrap(), Vec::<u8>::new());
    assert_eq!(p.read(b.as_bytes(), 0, 20_000).unwrap(), vec![5u8; 10_000]);
    let mut expected = vec![5u8; 64 << 10];
    expected[4096..12288].fill(0);
    assert_eq!(p.read(c.as_bytes(), 0, 64 << 10).unwrap(), expected);
    close_clean(store, &path, &config);
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    p.apply(Batch::new().delete(b.clone()).delete(c.clone())).unwrap();
    p.commit_reclaims().unwrap();
    assert_eq!(p.free_blocks(), free, "nothing leaked");
    close_clean(store, &path, &config);
}

/// `Partition::diff`: after a clone, exactly the blocks either object wrote
/// differ, found from the block maps alone; a grown object differs past
/// the other's end; holes in both, or blocks never written, are equal.
#[test]
fn diff_names_exactly_what_changed_since_a_clone() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let (head, snap) = (key(0, 1), key(0, 2));
    p.apply(Batch::new().create_preallocated(head.clone(), 1 << 20)).unwrap();
    p.write(&head, 0, &[1u8; 64 << 10]).unwrap();
    p.apply(Batch::new().clone_object(head.clone(), snap.clone())).unwrap();
    assert_eq!(p.diff(head.as_bytes(), snap.as_bytes()), vec![], "a fresh clone differs nowhere");
    p.write(&head, 8192, b"x").unwrap(); // block 2
    p.write(&head, 12288, &[2u8; 4096]).unwrap(); // block 3: merged with block 2
    p.write(&head, 40960, &[3u8; 10]).unwrap(); // block 10
    p.write(&head, 512 << 10, &[4u8; 4096]).unwrap(); // block 128: pre-allocated, never written before
    assert_eq!(
        p.diff(head.as_bytes(), snap.as_bytes()),
        vec![(8192, 8192), (40960, 4096), (512 << 10, 4096)],
        "the blocks written since the clone, and nothing else"
    );
    assert_eq!(p.diff(snap.as_bytes(), head.as_bytes()), p.diff(head.as_bytes(), snap.as_bytes()));
    p.write(&head, (1 << 20) + 100, b"grown").unwrap();
    let ranges = p.diff(head.as_bytes(), snap.as_bytes());
    assert_eq!(ranges.last(), Some(&(1 << 20, 105)), "past the clone's end, to the head's: {ranges:?}");
    assert_eq!(p.diff(head.as_bytes(), b"\0\0\0\0absent"), vec![(0, (1 << 20) + 105)], "all of it, against nothing");
}

/// A rollback in one batch: delete the object, clone its snapshot back in
/// its place. It reads as the snapshot, shares every block with it, and
/// the blocks only the rolled-back version held are freed.
#[test]
fn a_rollback_replaces_an_object_with_a_copy_of_its_snapshot_in_one_batch() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let free = p.free_blocks();
    let (head, snap) = (key(0, 1), key(0, 2));
    p.write(&head, 0, &[1u8; 32 << 10]).unwrap();
    p.apply(Batch::new().clone_object(head.clone(), snap.clone())).unwrap();
    p.write(&head, 4096, &[9u8; 8192]).unwrap();
    p.write(&head, 32 << 10, &[9u8; 4096]).unwrap();
    assert_eq!(p.free_blocks(), free - 11);
    p.apply(Batch::new().delete(head.clone()).clone_object(snap.clone(), head.clone())).unwrap();
    assert_eq!(p.read(head.as_bytes(), 0, 64 << 10).unwrap(), vec![1u8; 32 << 10]);
    assert_eq!(p.diff(head.as_bytes(), snap.as_bytes()), vec![]);
    p.commit_reclaims().unwrap();
    assert_eq!(p.free_blocks(), free - 8, "the rolled-back version's own blocks are free");
    // A clone after other operations on its source is refused, whole.
    let refused = p.apply(Batch::new().write(snap.clone(), 0, b"x").clone_object(snap.clone(), key(0, 3)));
    assert!(matches!(refused, Err(StoreError::InvalidArgument(_))), "{refused:?}");
    close_clean(store, &path, &config);
}

/// A batch that copies a block on write flushes the copy before its record
/// (one more flush, for such batches only): the block it copies may be
/// freed by the same batch (here its other object's reclaim drops the last
/// reference) or written in place by it, and a crash must still find the
/// copy whole. Batches without copies pay nothing.
#[test]
fn copies_are_flushed_before_their_record_and_only_they_pay_for_it() {
    let (_dir, path, config) = setup();
    let mut store = Store::open(&path, &config).unwrap();
    let p = store.partition_mut(0);
    let (a, s) = (key(0, 1), key(0, 2));
    p.write(&a, 0, &[1u8; 8192]).unwrap();
    assert_eq!(p.stats().copies_flushed_first, 0);
    p.apply(Batch::new().clone_object(a.clone(), s.clone())).unwrap();
    p.apply(Batch::new().delete(s.clone())).unwrap();
    // The copy of block 0, and in the same record the reclaim that frees
    // the shared block (the deleted clone held its last other reference).
    let flushes = p.stats().io.flushes;
    p.write(&a, 10, b"new").unwrap();
    assert_eq!(p.stats().copies_flushed_first, 1);
    assert_eq!(p.stats().io.flushes, flushes + 2, "the copies' flush, then the batch's");
    let mut expected = vec![1u8; 8192];
    expected[10..13].copy_from_slice(b"new");
    assert_eq!(p.read(a.as_bytes(), 0, 8192).unwrap(), expected);
    p.write(&a, 4096, b"in place").unwrap();
    assert_eq!(p.stats().copies_flushed_first, 1, "a block no clone shares is written in place");
    close_clean(store, &path, &config);
}
