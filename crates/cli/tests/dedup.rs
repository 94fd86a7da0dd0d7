//! The deduplication tier as an operator meets it (issue 27,
//! docs/DEDUP.md): pools made with the CLI, VM-like images copied in over
//! NBD, deduplicated and evicted by the engine, copied back out byte for
//! byte; `duplex dedup status` and `scrub`; and the stamped fault workload
//! on a deduplicated image while an OSD is killed.

mod common;

use std::process::Command;
use std::time::{Duration, Instant};

use common::workload::Verifying;
use common::{kill_9, require_tool, run_ok, DevCluster};

const MIB: u64 = 1 << 20;

fn tiered_cluster() -> DevCluster {
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
    let ideal: f64 = table
        .lines()
        .find(|l| l.starts_with("| 32 KiB |"))
        .and_then(|l| l.split('|').nth(5))
        .and_then(|cell| cell.trim().parse().ok())
        .expect("the data set script prints its ideal ratio");
    let mut images = Vec::new();
    for i in 0..3 {
        let name = format!("vm{i}");
        run_ok(cluster.cli().args(["--pool", "vms", "image", "create", &name, "--size", "24M"]));
        let input = scratch.path().join(format!("vm{i}.raw"));
        let server = cluster.serve_in("vms", &name);
        run_ok(Command::new("nbdcopy").arg(&input).arg(&server.uri));
        images.push((name, input));
    }
    // The engine deduplicates and evicts what it can (cold after 0 s): the
    // objects keep less than an eighth of their bytes, and the chunk count
    // stays put for 3 s.
    let started = Instant::now();
    let (mut last, mut settled) = (serde_json::Value::Null, 0);
    while settled < 3 {
        assert!(started.elapsed() < Duration::from_secs(180), "the tier did not settle: {last}");
        std::thread::sleep(Duration::from_secs(1));
        let now = status(&cluster);
        let evicted = now["base_bytes"].as_u64().unwrap() < now["logical_bytes"].as_u64().unwrap() / 8;
        settled = if evicted && now["chunks"] == last["chunks"] { settled + 1 } else { 0 };
        last = now;
    }
    eprintln!("dedup status after the engine: {last}");
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
    for (name, input) in &images {
        let server = cluster.serve_in("vms", name);
        let out = run_ok(Command::new("nbdcopy").arg(&server.uri).arg("-"));
        assert!(out.stdout == std::fs::read(input).unwrap(), "{name} reads back other bytes");
    }
    let scrub = run_ok(cluster.cli().args(["dedup", "scrub", "vms", "--deep", "--json"]));
    let report: serde_json::Value = serde_json::from_slice(&scrub.stdout).unwrap();
    assert_eq!(report["missing"].as_array().map(Vec::len), Some(0), "{report}");
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
