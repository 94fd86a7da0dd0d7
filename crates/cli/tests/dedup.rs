//! The deduplication tier as an operator meets it (issue 27,
//! docs/DEDUP.md): pools made with the CLI, VM-like images copied in over
//! NBD, deduplicated and evicted by the engine, copied back out byte for
//! byte; `duplex dedup status` and `scrub`; snapshots of a deduplicated
//! image; and the stamped fault workload on a deduplicated image while an
//! OSD is killed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::workload::Verifying;
use common::{kill_9, qemu_io, require_tool, run_ok, DevCluster};

const MIB: u64 = 1 << 20;

fn tiered_cluster() -> DevCluster {
    tiered_cluster_cut_by("fixed")
}

/// A cluster with pool `vms` deduplicated into `chunks` (32 KiB chunks,
/// cut by `chunking`).
fn tiered_cluster_cut_by(chunking: &str) -> DevCluster {
    let cluster = DevCluster::with_args(&["--osd-set", "dedup_cold_s=0"]);
    run_ok(cluster.cli().args(["pool", "create", "chunks", "--size", "2", "--compression", "lz4", "--pg-num", "16"]));
    run_ok(cluster.cli().args([
        "pool",
        "create",
        "vms",
        "--size",
        "2",
        "--dedup-tier",
        "chunks",
        "--chunk-size",
        "32K",
        "--chunking",
        chunking,
        "--pg-num",
        "16",
    ]));
    cluster
}

fn status(cluster: &DevCluster) -> serde_json::Value {
    let out = run_ok(cluster.cli().args(["dedup", "status", "vms", "--json"]));
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).expect("dedup status --json");
    all[0].clone()
}

/// Waits until the engine has deduplicated and evicted what it can (cold
/// after 0 s): the chunk count and the base pool's bytes stay put for 3 s,
/// and with `evicted` the objects keep less than an eighth of their bytes
/// (snapshot clones keep theirs whole: without). Returns `dedup status`.
fn wait_settled(cluster: &DevCluster, evicted: bool) -> serde_json::Value {
    let started = Instant::now();
    let (mut last, mut settled) = (serde_json::Value::Null, 0);
    while settled < 3 {
        assert!(started.elapsed() < Duration::from_secs(180), "the tier did not settle: {last}");
        std::thread::sleep(Duration::from_secs(1));
        let now = status(cluster);
        let small = now["base_bytes"].as_u64().unwrap() < now["logical_bytes"].as_u64().unwrap() / 8;
        let still = now["chunks"] == last["chunks"] && now["base_bytes"] == last["base_bytes"];
        settled = if (small || !evicted) && still { settled + 1 } else { 0 };
        last = now;
    }
    eprintln!("dedup status after the engine: {last}");
    last
}

/// The tier scrub: nothing a chunk map names is missing.
fn scrub_clean(cluster: &DevCluster) -> serde_json::Value {
    let scrub = run_ok(cluster.cli().args(["dedup", "scrub", "vms", "--deep", "--json"]));
    let report: serde_json::Value = serde_json::from_slice(&scrub.stdout).unwrap();
    assert_eq!(report["missing"].as_array().map(Vec::len), Some(0), "{report}");
    assert_eq!(report["damaged"].as_array().map(Vec::len), Some(0), "{report}");
    report
}

/// The data set's three images of 24 MiB in `dir`, each copied over NBD
/// into an image of pool `vms`: (image, file).
fn copy_in(cluster: &DevCluster, dir: &std::path::Path) -> Vec<(String, std::path::PathBuf)> {
    let mut images = Vec::new();
    for i in 0..3 {
        let name = format!("vm{i}");
        run_ok(cluster.cli().args(["--pool", "vms", "image", "create", &name, "--size", "24M"]));
        let input = dir.join(format!("vm{i}.raw"));
        let server = cluster.serve_in("vms", &name);
        run_ok(Command::new("nbdcopy").arg(&input).arg(&server.uri));
        images.push((name, input));
    }
    images
}

/// Each image reads back over NBD byte for byte as its file.
fn read_back(cluster: &DevCluster, images: &[(String, std::path::PathBuf)]) {
    for (name, input) in images {
        let server = cluster.serve_in("vms", name);
        let out = run_ok(Command::new("nbdcopy").arg(&server.uri).arg("-"));
        assert!(out.stdout == std::fs::read(input).unwrap(), "{name} reads back other bytes");
    }
}

#[test]
fn vm_images_round_trip_through_nbd_after_dedup_and_eviction() {
    for tool in ["nbdcopy", "python3"] {
        require_tool(tool);
    }
    let cluster = tiered_cluster();
    let list = run_ok(cluster.cli().args(["pool", "list"]));
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("deduplicated into 'chunks' (32 KiB chunks)") && text.contains("chunk pool (lz4"), "{text}");
    // A chunk pool takes chunk operations only; a tier is set once.
    let refused = cluster.cli().args(["--pool", "chunks", "image", "create", "x", "--size", "4M"]).output().unwrap();
    assert!(!refused.status.success(), "an image in a chunk pool");

    // Three VM-like images of the machine's own /usr (bench/dedup_dataset.py).
    let scratch = tempfile::tempdir().expect("temp dir");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/dedup_dataset.py");
    let made = run_ok(
        Command::new("python3")
            .arg(script)
            .args(["--images", "3", "--size-mib", "24", "--chunk-kib", "32", "--out"])
            .arg(scratch.path()),
    );
    let table = String::from_utf8_lossy(&made.stdout).into_owned();
    eprintln!("{table}");
    // The script's own count (SHA-256 of every chunk): chunks over distinct non-zero ones.
    let ideal = report_cell(&table, "32 KiB", 5);
    let images = copy_in(&cluster, scratch.path());
    let last = wait_settled(&cluster, true);
    let logical = last["logical_bytes"].as_u64().unwrap();
    let base = last["base_bytes"].as_u64().unwrap();
    assert!(logical >= 72 * MIB, "{last}");
    assert!(base < logical / 8, "the objects keep {base} of {logical} bytes: not evicted");
    // As much as the data holds: the chunks' count, and so the ratio, within
    // a few chunks of the script's (the held blocks' few KiB aside).
    let actual = last["dedup_ratio"].as_f64().unwrap();
    assert!(actual > ideal * 0.99 && actual < ideal * 1.01, "dedup {actual:.3}, the data's ideal {ideal:.3}: {last}");
    assert!(last["compression_ratio"].as_f64().unwrap() > 1.0, "{last}");

    // Byte for byte back out, through the chunk pool.
    read_back(&cluster, &images);
    let report = scrub_clean(&cluster);
    assert_eq!(report["references"], report["entries"], "{report}");
    // Pause, run, auto.
    run_ok(cluster.cli().args(["dedup", "pause", "vms"]));
    assert_eq!(status(&cluster)["mode"], "pause");
    run_ok(cluster.cli().args(["dedup", "auto", "vms"]));
}

/// The fault tests' stamped workload on an image whose data pool is
/// deduplicated, evicted as it is written (cold after 0 s: every write
/// meets promotions), while an OSD is killed: nothing acknowledged is
/// lost, no read goes back in time, and the tier scrub finds no chunk
/// missing.
#[test]
fn the_stamped_workload_on_a_deduplicated_image_survives_an_osd_kill() {
    let _alone = common::alone();
    let cluster = tiered_cluster();
    let client = cluster.client();
    let vms = client.pool_id("vms").unwrap();
    let options = duplex_client::CreateOptions { data_pool: Some(vms), ..Default::default() };
    let run = Verifying::start_with(&client, "vm1", 32 * MIB, options);
    run.wait_for_progress("before the fault");
    std::thread::sleep(Duration::from_secs(3));
    kill_9(&cluster, "osd.1");
    run.wait_for_progress("after kill -9 of osd.1");
    std::thread::sleep(Duration::from_secs(3));
    let report = run.finish();
    eprintln!("stamped workload on a deduplicated image, kill -9 osd.1: {report}");
    assert!(report.is_ok(), "{report}");
    assert!(report.writes_acknowledged > 400, "{report}");
    let scrub = run_ok(cluster.cli().args(["dedup", "scrub", "vms", "--json"]));
    let scrub: serde_json::Value = serde_json::from_slice(&scrub.stdout).unwrap();
    eprintln!("tier scrub: {scrub}");
    assert_eq!(scrub["missing"].as_array().map(Vec::len), Some(0), "{scrub}");
    let metrics = status(&cluster);
    assert!(metrics["chunks"].as_u64().unwrap() > 0, "the engine ran: {metrics}");
}

/// 16 MiB of 32 KiB chunks drawn from 48 of their own (pseudo-random, so
/// incompressible) and zeros: most chunks have twins. The chunks at
/// `unique` are each their own: no other reference keeps them.
fn repetitive_image(unique: &[u64]) -> Vec<u8> {
    const CHUNK: u64 = 32 << 10;
    fn fill(chunk: &mut [u8], mut word: u64) {
        for piece in chunk.chunks_mut(8) {
            word ^= word << 13;
            word ^= word >> 7;
            word ^= word << 17;
            piece.copy_from_slice(&word.to_le_bytes());
        }
    }
    let mut out = vec![0u8; 16 * MIB as usize];
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for (i, chunk) in out.chunks_mut(CHUNK as usize).enumerate() {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let pattern = state % 56;
        if unique.contains(&(i as u64 * CHUNK)) {
            fill(chunk, (1000 + i as u64).wrapping_mul(0x2545_f491_4f6c_dd1d));
        } else if pattern < 48 {
            fill(chunk, pattern.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1);
        } // else zeros
    }
    out
}

/// Snapshots of a deduplicated image: taken after the engine evicted its
/// chunks, a snapshot reads back its moment while the head is rewritten
/// and evicted again (a write that clones an object brings its chunks
/// back first, so the clone holds them all), ships as a diff that keeps a
/// backup in step (evicted chunks count as data), rolls back; the tier
/// scrub finds nothing missing throughout, and after the snapshot's
/// removal.
#[test]
fn snapshots_of_a_deduplicated_image_hold_their_moment() {
    for tool in ["qemu-io", "nbdcopy"] {
        require_tool(tool);
    }
    let cluster = tiered_cluster();
    let scratch = tempfile::tempdir().expect("temp dir");
    let file = |name: &str| scratch.path().join(name);
    let same = |a: &str, b: &str| {
        let (a_bytes, b_bytes) = (std::fs::read(file(a)).unwrap(), std::fs::read(file(b)).unwrap());
        assert!(a_bytes == b_bytes, "{a} and {b} differ");
    };
    let cli = || {
        let mut command = cluster.cli();
        command.args(["--pool", "vms"]);
        command
    };
    // Chunks no twin keeps: dropped by the head, they are gone from the
    // chunk pool, and a snapshot that still read them there would fail.
    let unique = [192 << 10, 6 * MIB, 13 * MIB];
    std::fs::write(file("at-s1.raw"), repetitive_image(&unique)).unwrap();
    run_ok(cli().args(["image", "create", "disk", "--size", "16M"]));
    let server = cluster.serve_in("vms", "disk");
    run_ok(Command::new("nbdcopy").arg(file("at-s1.raw")).arg(&server.uri));
    wait_settled(&cluster, true);
    run_ok(cli().args(["snap", "create", "disk@s1"]));
    // Changes under s1, in every object: each clones an evicted head. Then,
    // the heads evicted again, changes of their unique chunks: the head
    // drops those chunks, which the clones must not need.
    qemu_io(
        &server.uri,
        &["write -P 0x44 100k 4k", "write -P 0x55 5M 64k", "discard 9M 1M", "write -P 0x66 15M 4k", "write -z 2M 4k"],
    );
    wait_settled(&cluster, false);
    qemu_io(&server.uri, &["write -P 0x77 200k 4k", "write -P 0x78 6M 4k", "write -P 0x79 13M 4k"]);
    run_ok(Command::new("nbdcopy").arg(&server.uri).arg(file("at-s2.raw")));
    let status_after = wait_settled(&cluster, false);
    assert!(status_after["chunks"].as_u64().unwrap() > 0, "{status_after}");
    scrub_clean(&cluster);

    // The snapshot and the head, each as it was, after the head's new
    // chunks were deduplicated and evicted (and its old ones unreferenced).
    run_ok(cli().args(["image", "export", "disk@s1"]).arg(file("s1.raw")));
    same("s1.raw", "at-s1.raw");
    run_ok(cli().args(["image", "export", "disk"]).arg(file("head.raw")));
    same("head.raw", "at-s2.raw");

    // A full diff of s1 and an incremental one to s2 keep a backup (in a
    // plain pool) in step.
    run_ok(cli().args(["snap", "create", "disk@s2"]));
    run_ok(cluster.cli().args(["image", "create", "backup", "--size", "16M"]));
    run_ok(cli().args(["image", "export-diff", "disk@s1"]).arg(file("d1")));
    run_ok(cluster.cli().args(["image", "import-diff"]).arg(file("d1")).arg("backup"));
    run_ok(cluster.cli().args(["image", "export", "backup"]).arg(file("backup-s1.raw")));
    same("backup-s1.raw", "at-s1.raw");
    run_ok(cli().args(["image", "export-diff", "disk@s2", "--from-snap", "s1"]).arg(file("d2")));
    run_ok(cluster.cli().args(["image", "import-diff"]).arg(file("d2")).arg("backup"));
    run_ok(cluster.cli().args(["image", "export", "backup"]).arg(file("backup-s2.raw")));
    same("backup-s2.raw", "at-s2.raw");

    // Rolled back to s1 (not served meanwhile), then s2 removed: the head
    // reads as s1 did, and the tier scrub still finds every chunk.
    drop(server);
    run_ok(cli().args(["snap", "rollback", "disk@s1"]));
    run_ok(cli().args(["image", "export", "disk"]).arg(file("rolled.raw")));
    same("rolled.raw", "at-s1.raw");
    run_ok(cli().args(["snap", "remove", "disk@s2"]));
    run_ok(cli().args(["snap", "remove", "disk@s1"]));
    // The clones trimmed, the objects are evicted again.
    wait_settled(&cluster, true);
    run_ok(cli().args(["image", "export", "disk"]).arg(file("last.raw")));
    same("last.raw", "at-s1.raw");
    let report = scrub_clean(&cluster);
    eprintln!("tier scrub after the snapshots' removal: {report}");
}

/// One cell of a row of the data set script's report: the row whose first
/// cell is `first`.
fn report_cell(report: &str, first: &str, cell: usize) -> f64 {
    report
        .lines()
        .find(|l| l.split('|').nth(1).is_some_and(|c| c.trim() == first))
        .and_then(|l| l.split('|').nth(cell))
        .and_then(|c| c.trim().parse().ok())
        .unwrap_or_else(|| panic!("no '{first}' row in the data set's report:\n{report}"))
}

/// Content-defined chunks (docs/DEDUP.md, "Chunking"): the VM-like images,
/// whose files are shifted by whole blocks, deduplicate as far as the
/// script's content-defined count says, about twice what fixed chunks
/// find, and read back byte for byte.
#[test]
fn content_defined_chunks_find_runs_shifted_by_whole_blocks() {
    for tool in ["nbdcopy", "python3"] {
        require_tool(tool);
    }
    let cluster = tiered_cluster_cut_by("content");
    let list = run_ok(cluster.cli().args(["pool", "list"]));
    let text = String::from_utf8_lossy(&list.stdout);
    assert!(text.contains("(32 KiB chunks on average, cut by content)"), "{text}");
    let scratch = tempfile::tempdir().expect("temp dir");
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../bench/dedup_dataset.py");
    let made = run_ok(
        Command::new("python3")
            .arg(script)
            .args(["--images", "3", "--size-mib", "24", "--chunk-kib", "32", "--cdc", "--out"])
            .arg(scratch.path()),
    );
    let report = String::from_utf8_lossy(&made.stdout).into_owned();
    eprintln!("{report}");
    let fixed = report_cell(&report, "32 KiB", 5);
    let ideal = report_cell(&report, "cdc 32 KiB", 6);
    assert!(ideal > fixed * 1.5, "the data set's content-defined ideal {ideal} against fixed {fixed}");
    let images = copy_in(&cluster, scratch.path());
    let last = wait_settled(&cluster, true);
    assert_eq!(last["chunking"], "content", "{last}");
    // Objects passed while half written keep some cuts of their own: the
    // cuts meet the data's again within a chunk or two, so a few chunks
    // more than the script's, not more.
    let actual = last["dedup_ratio"].as_f64().unwrap();
    assert!(actual > ideal * 0.97 && actual < ideal * 1.01, "dedup {actual:.3}, the data's ideal {ideal:.3}: {last}");
    read_back(&cluster, &images);
    let report = scrub_clean(&cluster);
    assert_eq!(report["references"], report["entries"], "{report}");
}
