//! An erasure-coded data pool with real clients (issue 26): a 2+1 pool on
//! the dev cluster's three OSDs holds an image's data while its header
//! stays in the replicated pool; qemu-io writes (whole stripes, single
//! units, sub-block pieces, discards and zeros) read back as a local copy
//! given the same writes; bad requests are refused with the reason before
//! anything is created.

mod common;

use std::process::Command;

use common::{require_tool, run_ok, DevCluster};

/// The command's stderr; it must fail.
fn fails(command: &mut Command) -> String {
    let output = command.output().expect("runs");
    assert!(!output.status.success(), "{command:?} succeeded");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn stdout(command: &mut Command) -> String {
    String::from_utf8_lossy(&run_ok(command).stdout).into_owned()
}

fn qemu_io(target: &str, format: &str, commands: &[&str]) {
    let mut command = Command::new("qemu-io");
    command.args(["-f", format]);
    for c in commands {
        command.arg("-c").arg(c);
    }
    let output = run_ok(command.arg(target));
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(!text.contains("failed") && !text.contains("error"), "qemu-io {commands:?}:\n{text}");
}

#[test]
fn an_image_on_an_erasure_coded_pool_serves_real_clients_and_bad_requests_say_why() {
    for tool in ["qemu-io", "qemu-img"] {
        require_tool(tool);
    }
    let cluster = DevCluster::start();
    let said = fails(cluster.cli().args(["pool", "create", "wide", "--ec", "2+2"]));
    assert!(said.contains("2+2") && said.contains("3 hosts"), "{said}");
    let said = fails(cluster.cli().args(["pool", "create", "bad", "--ec", "2:1"]));
    assert!(said.contains("k+m"), "{said}");
    let said = fails(cluster.cli().args(["pool", "create", "bad", "--ec", "2+1", "--stripe-unit", "6K"]));
    assert!(said.contains("power of two"), "{said}");
    let said = fails(cluster.cli().args(["pool", "create", "bad", "--ec", "1+1"]));
    assert!(said.contains("k >= 2"), "{said}");
    let pools = stdout(cluster.cli().args(["pool", "list"]));
    assert!(!pools.contains("wide") && !pools.contains("bad"), "a refused pool was created:\n{pools}");

    let created = stdout(cluster.cli().args(["pool", "create", "cold", "--ec", "2+1", "--pg-num", "16"]));
    assert!(created.contains("min_size 3") && created.contains("1.50 bytes stored"), "{created}");
    run_ok(cluster.cli().args(["pool", "create", "coarse", "--ec", "2+1", "--stripe-unit", "64K", "--pg-num", "8"]));
    let pools = stdout(cluster.cli().args(["pool", "list"]));
    assert!(pools.contains("erasure 2+1, 4 KiB stripe unit"), "{pools}");
    // The header needs a replicated pool; the stripe must tile the objects.
    let said = fails(cluster.cli().args(["--pool", "cold", "image", "create", "x", "--size", "8M"]));
    assert!(said.contains("replicated pool") && said.contains("--data-pool cold"), "{said}");
    let said = fails(cluster.cli().args([
        "image",
        "create",
        "y",
        "--size",
        "8M",
        "--object-size",
        "64K",
        "--data-pool",
        "coarse",
    ]));
    assert!(said.contains("does not divide the object size"), "{said}");
    let said = fails(cluster.cli().args(["image", "create", "z", "--size", "8M", "--data-pool", "nowhere"]));
    assert!(said.contains("nowhere"), "{said}");

    run_ok(cluster.cli().args(["image", "create", "disk", "--size", "32M", "--data-pool", "cold"]));
    let info = stdout(cluster.cli().args(["image", "info", "disk"]));
    assert!(info.contains("data pool:    cold"), "{info}");

    let scratch = tempfile::tempdir().expect("temp dir");
    let local = scratch.path().join("expected.raw");
    run_ok(Command::new("qemu-img").args(["create", "-f", "raw"]).arg(&local).arg("32M"));
    let writes = [
        "write -P 0x11 0 8M",      // whole stripes
        "write -P 0x22 4096 4096", // one unit: read-modify-write of one data shard and the parity
        "write -P 0x33 9000 700",  // inside a block
        "write -P 0x44 12M 1M",    // whole stripes in a new object
        "write -P 0x55 20M 12345", // ragged both ends
        "discard 12M 64k",         // whole stripes: the same zero on every shard
        "write -z 4M 6000",        // partial stripes of zeros
        "write -P 0x66 31M 1M",    // the last object
        "write -P 0x77 100000 3",  // three bytes
    ];
    let server = cluster.serve("disk", None);
    qemu_io(&server.uri, "raw", &writes);
    qemu_io(local.to_str().unwrap(), "raw", &writes);
    run_ok(Command::new("qemu-img").args(["compare", "-f", "raw", "-F", "raw"]).arg(&local).arg(&server.uri));

    let said = fails(cluster.cli().args(["snap", "create", "disk@s1"]));
    assert!(said.contains("erasure-coded"), "{said}");
    drop(server);
    // The data went to the erasure-coded pool (once flushed to the
    // stores, which `df` reads); removing the image empties it.
    let objects_in_cold = || {
        let df = stdout(cluster.cli().args(["df", "--json"]));
        let df: serde_json::Value = serde_json::from_str(&df).expect("df --json");
        let cold = df["pools"].as_array().unwrap().iter().find(|p| p["name"] == "cold").expect("cold in df").clone();
        cold["objects"].as_u64().expect("a count")
    };
    let settled = |want: &dyn Fn(u64) -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let objects = objects_in_cold();
            if want(objects) || std::time::Instant::now() > deadline {
                return objects;
            }
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
    };
    let written = settled(&|n| n >= 4);
    assert!(written >= 4, "{written} objects in the erasure-coded pool");
    run_ok(cluster.cli().args(["image", "remove", "disk"]));
    assert_eq!(settled(&|n| n == 0), 0, "objects left after the image was removed");
}
