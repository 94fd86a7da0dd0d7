//! Crash test: a child process applies random batches and reports each one
//! that `apply` returned as durable; the parent kills it with SIGKILL at a
//! random moment, then checks:
//! - fsck (read-only, replaying the journal in memory) is clean;
//! - every batch reported durable is present;
//! - the batch in flight left the metadata wholly before or wholly after it,
//!   and each of its 4 KiB data blocks either old or new;
//!
//! and continues from the store's actual state with a new child, many times.
//! `crash_test_with_a_volatile_write_cache` runs the child's device behind a
//! volatile write cache (`duplex_store::faults`): every write not yet
//! flushed dies with the child, as it would with the machine's power.
//! Bounded by `DUPLEX_CRASH_SECONDS` (default 15, per test) and `DUPLEX_CRASH_ITERATIONS` (default 300).
//! The batches follow from a random seed, printed first; `DUPLEX_CRASH_TEST_SEED`
//! sets it (the moments of the kills stay random, so a failure may take
//! several runs to come back).

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use duplex_store::{fsck, Batch, IoBackend, Store};
use rand::Rng;

const GROUPS: u32 = 1;
const NAMES: u8 = 6;
const MAX_OPS: usize = 5;

fn backend() -> IoBackend {
    match std::env::var("DUPLEX_CRASH_BACKEND").as_deref() {
        Ok("pread") => IoBackend::Pread,
        _ => IoBackend::Auto,
    }
}

fn batch_for(seed: u64, index: u64, churn: bool) -> Batch {
    if churn && index.is_multiple_of(5) {
        // A 9 MiB pre-allocated object, made and deleted in turn: it spans
        // two data chunks, claimed by its create and given back by the
        // first checkpoint after its blocks are freed.
        let mut batch = Batch::new();
        let big = key(0, 200);
        if (index / 5).is_multiple_of(2) {
            batch.create_preallocated(big, 9 << 20);
        } else {
            batch.delete(big);
        }
        return batch;
    }
    random_batch(&mut rng(seed ^ index.wrapping_mul(0x9E37_79B9_7F4A_7C15)), GROUPS, NAMES, MAX_OPS)
}

fn churning() -> bool {
    std::env::var("DUPLEX_CRASH_CHURN").is_ok()
}

/// The child: runs only when the parent re-executes this binary with the
/// environment set (it is `#[ignore]`d in normal runs).
#[test]
#[ignore = "run by crash_test as a child process"]
fn crash_child() {
    let Ok(store_path) = std::env::var("DUPLEX_CRASH_STORE") else {
        return;
    };
    let seed: u64 = std::env::var("DUPLEX_CRASH_SEED").unwrap().parse().unwrap();
    let first: u64 = std::env::var("DUPLEX_CRASH_FIRST").unwrap().parse().unwrap();
    let mut config = test_config(backend());
    match std::env::var("DUPLEX_CRASH_VOLATILE").as_deref() {
        Ok("reordering") => config.device.faults = Some(duplex_store::DeviceFaults::reordering(seed ^ first)),
        Ok(_) => config.device.faults = Some(duplex_store::DeviceFaults::new()),
        Err(_) => {}
    }
    let mut store = Store::open(store_path.as_ref(), &config).unwrap();
    let mut out = std::io::stdout().lock();
    for index in first..first + 10_000 {
        let batch = batch_for(seed, index, churning());
        match store.partition_mut(0).apply(&batch) {
            Ok(_) => writeln!(out, "durable {index}").unwrap(),
            Err(err) if is_rejection(&err) => writeln!(out, "rejected {index}").unwrap(),
            Err(err) => panic!("batch {index}: {err}"),
        }
        out.flush().unwrap();
    }
}

/// Per object: data, attributes, omap, pre-allocated.
type Snapshot = BTreeMap<Vec<u8>, (Vec<u8>, BTreeMap<Vec<u8>, Vec<u8>>, BTreeMap<Vec<u8>, Vec<u8>>, bool)>;

/// Blocks (key, index) that failed their checksum.
type Torn = std::collections::BTreeSet<(Vec<u8>, usize)>;

/// A snapshot that reads block by block; a block that fails its checksum
/// reads as zeros and is listed.
fn snapshot_tolerant(store: &mut Store) -> (Snapshot, Torn) {
    let partition = store.partition_mut(0);
    let mut out = Snapshot::new();
    let mut torn = Torn::new();
    for key in partition.list(&[], None, usize::MAX) {
        let info = partition.stat(key.as_bytes()).unwrap();
        let mut data = vec![0u8; info.size as usize];
        for (index, chunk) in data.chunks_mut(BLOCK).enumerate() {
            match partition.read(key.as_bytes(), (index * BLOCK) as u64, chunk.len() as u64) {
                Ok(bytes) => chunk.copy_from_slice(&bytes),
                Err(duplex_store::StoreError::ChecksumMismatch { .. }) => {
                    torn.insert((key.as_bytes().to_vec(), index));
                }
                Err(err) => panic!("reading {key:?} block {index}: {err}"),
            }
        }
        let attrs = partition.list_attrs(key.as_bytes()).unwrap().into_iter().collect();
        let omap = partition.omap_range(key.as_bytes(), &[], None, usize::MAX).unwrap().into_iter().collect();
        out.insert(key.as_bytes().to_vec(), (data, attrs, omap, info.preallocated));
    }
    (out, torn)
}

/// What the store holds; every block must pass its checksum.
fn snapshot(store: &mut Store) -> Snapshot {
    let (snapshot, torn) = snapshot_tolerant(store);
    assert!(torn.is_empty(), "blocks failing their checksums: {torn:?}");
    snapshot
}

/// Whether the objects' sizes, attributes and omaps are those of `model`.
fn meta_matches(actual: &Snapshot, model: &Model) -> bool {
    model.objects.len() == actual.len()
        && model.objects.iter().all(|(k, o)| {
            actual.get(k).is_some_and(|(data, attrs, omap, _)| {
                data.len() == o.data.len() && *attrs == o.attrs && *omap == o.omap
            })
        })
}

fn block_of(data: Option<&Vec<u8>>, index: usize) -> Vec<u8> {
    let mut block = vec![0u8; BLOCK];
    if let Some(data) = data {
        let start = (index * BLOCK).min(data.len());
        let end = ((index + 1) * BLOCK).min(data.len());
        block[..end - start].copy_from_slice(&data[start..end]);
    }
    block
}

/// Whether the in-flight batch may have moved a logical block of `key`
/// to a new physical block: by deleting the object before writing it again
/// (a new object's blocks are all new). If that block's data did not land,
/// it holds what a new block holds: zeros. A block a zero or a truncate
/// took off the same object and a write of the batch maps again is the
/// same block, overwritten in place (old or new), or a copy made durable
/// before the record (new): never zeros.
fn may_be_new_block(batch: &Batch, key: &[u8]) -> bool {
    batch.ops.iter().any(|op| match op {
        duplex_store::Op::Delete { key: k } => k.as_bytes() == key,
        _ => false,
    })
}

/// Checks `actual` against the states before and after the in-flight batch.
/// `torn` blocks (power loss only) must belong to objects the in-flight
/// batch wrote or truncated: besides the blocks it wrote, growing an object
/// zeroes the rest of its old tail block in place.
fn check_crash_state(actual: &Snapshot, before: &Model, after: &Model, in_flight: &Batch, torn: &Torn, context: &str) {
    let meta_matches = |model: &Model| meta_matches(actual, model);
    for (key, index) in torn {
        let written = in_flight.ops.iter().any(|op| match op {
            duplex_store::Op::Write { key: k, .. }
            | duplex_store::Op::WriteJournaled { key: k, .. }
            | duplex_store::Op::Zero { key: k, .. }
            | duplex_store::Op::Truncate { key: k, .. } => k.as_bytes() == &key[..],
            _ => false,
        });
        assert!(
            written,
            "{context}: {key:?} block {index} fails its checksum but the in-flight batch did not write it"
        );
    }
    assert!(
        meta_matches(before) || meta_matches(after),
        "{context}: metadata is neither the state before nor after the in-flight batch"
    );
    for (key, (data, ..)) in actual {
        for index in 0..data.len().div_ceil(BLOCK) {
            if torn.contains(&(key.clone(), index)) {
                continue;
            }
            let got = block_of(Some(data), index);
            let old = block_of(before.objects.get(key).map(|o| &o.data), index);
            let new = block_of(after.objects.get(key).map(|o| &o.data), index);
            // Only the bytes inside the object are visible; compare those.
            let visible = (data.len() - index * BLOCK).min(BLOCK);
            let zeros_allowed = may_be_new_block(in_flight, key) && got[..visible].iter().all(|b| *b == 0);
            if got[..visible] != old[..visible] && got[..visible] != new[..visible] && !zeros_allowed {
                let first_diff = |a: &[u8]| a.iter().zip(&got[..visible]).position(|(x, y)| x != y);
                panic!(
                    "{context}: {key:?} block {index} (visible {visible}) is neither its old nor its new contents; \
                     first difference from old at {:?}, from new at {:?}; got[0..8]={:?} old={:?} new={:?}; meta matches before: {}, after: {}; \
                     sizes: actual {}, before {:?}, after {:?}",
                    first_diff(&old[..visible]),
                    first_diff(&new[..visible]),
                    &got[..8],
                    &old[..8],
                    &new[..8],
                    meta_matches(before),
                    meta_matches(after),
                    data.len(),
                    before.objects.get(key).map(|o| (o.data.len(), o.preallocated)),
                    after.objects.get(key).map(|o| (o.data.len(), o.preallocated)),
                );
            }
        }
    }
}

fn summarize(batch: &Batch) -> Vec<String> {
    batch
        .ops
        .iter()
        .map(|op| match op {
            duplex_store::Op::Write { key, offset, data } => format!("write {key:?} @{offset} +{}", data.len()),
            duplex_store::Op::WriteJournaled { key, offset, data } => {
                format!("journaled write {key:?} @{offset} +{}", data.len())
            }
            other => format!("{other:?}").chars().take(90).collect(),
        })
        .collect()
}

#[test]
fn crash_test() {
    run_crash_test(None);
}

#[test]
fn crash_test_with_a_volatile_write_cache() {
    run_crash_test(Some("drop"));
}

/// Unflushed writes land early, in any order. This found a batch whose
/// data landed without its record over the previous record's first write
/// of a block, which mount then turned back into a hole (zeros with no
/// checksum to fail); `commit` now makes such a batch's record durable
/// first. Longer runs: `DUPLEX_CRASH_SECONDS=60 DUPLEX_CRASH_ITERATIONS=3000`.
#[test]
fn crash_test_with_a_reordering_write_cache() {
    run_crash_test(Some("reordering"));
}

/// Data chunks change hands all the time: claimed by a create, freed by a
/// delete, given back by a checkpoint, claimed again (layout.rs: why chunks).
#[test]
fn crash_test_with_chunks_changing_hands() {
    run_crash_test_with(Some("drop"), true);
}

fn run_crash_test(cache: Option<&str>) {
    run_crash_test_with(cache, false);
}

fn run_crash_test_with(cache: Option<&str>, churn: bool) {
    let volatile = cache.is_some();
    let budget =
        Duration::from_secs(std::env::var("DUPLEX_CRASH_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(15));
    let dir = tempfile::tempdir().unwrap();
    let config = test_config(backend());
    let path = make_store(dir.path(), 32 << 20, 1, 32 << 10, &config);
    // `DUPLEX_CRASH_TEST_SEED` replays a seed's batches (the kill moments stay random).
    let seed: u64 = match std::env::var("DUPLEX_CRASH_TEST_SEED") {
        Ok(seed) => seed.parse().expect("DUPLEX_CRASH_TEST_SEED is a u64"),
        Err(_) => rand::thread_rng().gen(),
    };
    eprintln!(
        "crash test seed {seed} (store {}, volatile write cache: {volatile}); to run its batches again: \
         DUPLEX_CRASH_TEST_SEED={seed} cargo test -p duplex-store --test crash {}",
        path.display(),
        std::thread::current().name().unwrap_or("crash_test")
    );
    let mut rng = rng(seed);
    let mut model = Model::default();
    let mut next_batch = 0u64;
    let started = Instant::now();
    let (mut iterations, mut total_durable, mut in_flight_seen, mut torn_blocks) = (0, 0, 0, 0);
    let max_iterations: u64 = std::env::var("DUPLEX_CRASH_ITERATIONS").ok().and_then(|s| s.parse().ok()).unwrap_or(300);
    while started.elapsed() < budget && iterations < max_iterations {
        iterations += 1;
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["crash_child", "--exact", "--ignored", "--nocapture", "--test-threads=1"])
            .env("DUPLEX_CRASH_STORE", &path)
            .env("DUPLEX_CRASH_SEED", seed.to_string())
            .env("DUPLEX_CRASH_FIRST", next_batch.to_string())
            .envs(cache.map(|mode| ("DUPLEX_CRASH_VOLATILE", mode)))
            .envs(churn.then_some(("DUPLEX_CRASH_CHURN", "1")))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let reader =
            std::thread::spawn(move || BufReader::new(stdout).lines().map_while(Result::ok).collect::<Vec<String>>());
        std::thread::sleep(Duration::from_millis(rng.gen_range(0..120)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        let lines = reader.join().unwrap();
        for line in lines {
            // libtest may print "test crash_child ... " on the same line first.
            let tokens: Vec<&str> = line.split_whitespace().collect();
            let (verdict, index) = match tokens.as_slice() {
                [.., v @ ("durable" | "rejected"), i] => (*v, i.parse::<u64>().unwrap()),
                _ => continue,
            };
            assert_eq!(index, next_batch, "child reported batches out of order");
            let expected = model.apply(&batch_for(seed, index, churn));
            assert_eq!(expected.is_ok(), verdict == "durable", "batch {index}: model and store disagree");
            total_durable += (verdict == "durable") as u64;
            next_batch += 1;
        }
        let context = format!("seed {seed}, volatile {volatile}, iteration {iterations}, in-flight batch {next_batch}");
        let report = fsck(&path, &config, true);
        // After a power loss (not a process crash) a block of the in-flight
        // batch may have landed without its journal record, or the record
        // without the block: it then fails its checksum (the crate's
        // durability contract). Which blocks, the snapshot below checks.
        let only_torn_blocks = volatile
            && report.issues.is_empty()
            && report.partitions.iter().flat_map(|p| &p.issues).all(|issue| issue.kind == "data_checksum");
        assert!(
            report.clean || only_torn_blocks,
            "{context}: fsck after SIGKILL: {:?} {:?}",
            report.issues,
            report.partitions.iter().map(|p| &p.issues).collect::<Vec<_>>()
        );
        let mut after = model.clone();
        let in_flight = batch_for(seed, next_batch, churn);
        let _ = after.apply(&in_flight);
        let context = format!("{context}; in-flight ops: {:?}", summarize(&in_flight));
        let mut store = Store::open(&path, &config).unwrap();
        let (mut actual, torn) = snapshot_tolerant(&mut store);
        check_crash_state(&actual, &model, &after, &in_flight, &torn, &context);
        if !torn.is_empty() {
            torn_blocks += torn.len();
            // As a redo log (or a peer's copy) would: rewrite the objects
            // whose blocks tore, from the state the metadata shows.
            let settled = if meta_matches(&actual, &model) { &model } else { &after };
            let mut repair = Batch::new();
            for key in torn.iter().map(|(key, _)| key).collect::<std::collections::BTreeSet<_>>() {
                let object = &settled.objects[key];
                let key = duplex_store::Key::new(key).unwrap();
                repair.delete(key.clone());
                if object.preallocated {
                    repair.create_preallocated(key.clone(), object.data.len() as u64);
                }
                repair.write(key.clone(), 0, object.data.clone());
                for (name, value) in &object.attrs {
                    repair.set_attr(key.clone(), name.clone(), value.clone());
                }
                if !object.omap.is_empty() {
                    repair.omap_set(key.clone(), object.omap.clone().into_iter().collect());
                }
            }
            store.partition_mut(0).apply(&repair).unwrap();
            actual = snapshot(&mut store);
        }
        store.close().unwrap();
        if actual.iter().map(|(k, v)| (k, &v.0)).ne(model.objects.iter().map(|(k, o)| (k, &o.data))) {
            in_flight_seen += 1;
        }
        // Continue from what the store holds; the in-flight batch is settled.
        model.objects = actual
            .into_iter()
            .map(|(k, (data, attrs, omap, preallocated))| (k, ModelObject { data, attrs, omap, preallocated }))
            .collect();
        next_batch += 1;
    }
    eprintln!("crash test (volatile write cache: {volatile}): {iterations} kills, {total_durable} durable batches checked, {in_flight_seen} kills caught a batch in flight, {torn_blocks} blocks torn and rewritten");
    assert!(iterations >= 5, "too few iterations to mean anything");
    assert!(total_durable > 0, "no batch was ever reported durable");
}
