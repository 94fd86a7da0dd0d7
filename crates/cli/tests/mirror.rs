//! OSDs on mirrored pairs of devices (issue 28), as real processes: a
//! power loss of the pair's caches, and a device that fails.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::workload::Verifying;
use common::{pid_of, run_ok, DevCluster};

const MIB: u64 = 1 << 20;

/// Restarts `osd` with a simulated volatile write cache in front of each
/// device of its pair, armed by the two trigger files returned.
fn with_mirror_faults(cluster: &DevCluster, osd: u32) -> [PathBuf; 2] {
    let triggers = [0, 1].map(|device| cluster.path().join(format!("osd.{osd}.device{device}.faults")));
    let first = format!("inject_device_faults={}", triggers[0].display());
    let second = format!("inject_second_device_faults={}", triggers[1].display());
    run_ok(
        cluster
            .cli()
            .args(["dev", "restart", "--osd", &osd.to_string(), "--osd-set", &first, "--osd-set", &second, "--dir"])
            .arg(cluster.path()),
    );
    triggers
}

/// Three OSDs on mirrored pairs (read-flush-split), osd.1's devices
/// behind simulated caches armed by the two triggers, and a stamped
/// workload under way; osd.1's pid.
fn mirrored_cluster_under_load() -> (DevCluster, [PathBuf; 2], Verifying, i32) {
    let cluster = DevCluster::with_args(&["--mirror", "read-flush-split"]);
    let triggers = with_mirror_faults(&cluster, 1);
    let run = Verifying::start(&cluster.client(), "vm1", 64 * MIB);
    run.wait_for_progress("before the fault");
    let pid = pid_of(&cluster, "osd.1");
    (cluster, triggers, run, pid)
}

fn osd_log(cluster: &DevCluster, osd: u32) -> String {
    std::fs::read_to_string(cluster.path().join(format!("osd.{osd}.log"))).unwrap()
}

fn status(cluster: &DevCluster) -> serde_json::Value {
    let output = run_ok(cluster.cli().args(["status", "--json"]));
    serde_json::from_slice(&output.stdout).expect("status JSON")
}

/// The thesis's setting: the operation log survives a power cut (NVDIMM;
/// here, shm survives the process), the data devices' caches do not. The
/// cut comes at a flush of osd.1's flush device; both devices lose what
/// they had not flushed, the read device (never flushed by a commit) the
/// most. At restart the mirror resyncs the regions its bitmap names, the
/// log replays, and osd.1 serves again, its reads from the read device:
/// the stamped-block checker finds no lost write and no stale read, and no
/// read met a stale block (which the checksum would have caught and the
/// other device repaired), and the devices, compared whole after the
/// resync, are identical (without the resync they are not: tried).
#[test]
fn a_mirrored_osd_that_loses_its_caches_resyncs_and_serves_what_it_acknowledged() {
    let (cluster, triggers, run, pid) = mirrored_cluster_under_load();
    std::fs::write(&triggers[0], "power-cut\n").unwrap();
    common::wait_until_ended(pid, "power-cut");
    assert!(osd_log(&cluster, 1).contains("injected power cut"), "the cut came at a flush");
    for trigger in &triggers {
        if trigger.exists() {
            std::fs::remove_file(trigger).unwrap();
        }
    }
    let resumed = run.wait_for_progress("after osd.1 lost its caches");
    // Back with its devices compared whole after the resync.
    let check = "mirror_check_at_start=true";
    run_ok(cluster.cli().args(["dev", "restart", "--osd", "1", "--osd-set", check, "--dir"]).arg(cluster.path()));
    let log = osd_log(&cluster, 1);
    let resync = log.lines().find(|l| l.contains("resynced a mirror's dirty regions")).map(str::to_string);
    let rejoined = run.wait_for_progress("after osd.1 came back");
    std::thread::sleep(Duration::from_secs(2));
    let report = run.finish();
    eprintln!("power cut of osd.1's mirror: resumed after {resumed:?}, went on {rejoined:?} after it came back; {resync:?}; {report}");
    assert!(report.is_ok(), "{report}");
    // Every read checks its block's crc32c and would repair a stale block
    // of the read device from the flush device: after a resync none is.
    // (This alone would not catch a missing resync: the stale store then
    // misses flushed entries its log no longer holds, and peering has the
    // OSD recovered from its peers. Hence the check at start.)
    let repairs =
        osd_log(&cluster, 1).lines().filter(|l| l.contains("failed its checksum on one mirror device")).count();
    assert_eq!(repairs, 0, "reads found stale blocks on the read device: the resync missed them");
    assert!(resync.is_some(), "the restart resynced the regions written since the last clean");
    assert!(
        log.contains("mirror check: the devices are identical after the resync"),
        "the devices differed after the resync: {}",
        log.lines().filter(|l| l.contains("mirror check")).collect::<Vec<_>>().join("\n")
    );
}

/// One device of osd.1's pair fails (its flushes return EIO and drop what
/// they were to make durable): the mirror goes on on the other, which
/// holds every write; the OSD keeps serving, `duplex status` warns, and
/// nothing acknowledged is lost.
#[test]
fn a_failed_mirror_device_leaves_the_osd_serving_on_the_other() {
    let (cluster, triggers, run, pid) = mirrored_cluster_under_load();
    std::fs::write(&triggers[0], "flush-eio\n").unwrap();
    let started = Instant::now();
    while !osd_log(&cluster, 1).contains("a mirror device failed") {
        assert!(started.elapsed() < Duration::from_secs(30), "the flush device never failed");
        std::thread::sleep(Duration::from_millis(50));
    }
    run.wait_for_progress("after osd.1's flush device failed");
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(pid_of(&cluster, "osd.1"), pid, "osd.1 kept running");
    let health = status(&cluster)["health"].clone();
    assert_eq!(health["status"], "HEALTH_WARN", "{health}");
    assert!(health["reasons"].to_string().contains("osd.1 on one device of its mirror"), "{health}");
    let report = run.finish();
    eprintln!("flush EIO on osd.1's flush device: {health}; {report}");
    assert!(report.is_ok(), "{report}");
    assert!(!osd_log(&cluster, 1).contains("the data device failed"), "the OSD did not stop");
}

/// A device of osd.1's pair fails; the operator replaces it with a new
/// file through the OSD's admin socket (`duplex daemon … mirror replace`)
/// while the stamped workload runs. The new device is filled in the
/// background, the pair is in sync again, the cluster is healthy, nothing
/// was lost or read stale, and the two devices hold the same store bytes.
#[test]
fn a_failed_mirror_device_is_replaced_online_and_filled_while_the_osd_serves() {
    let cluster = DevCluster::with_args(&["--mirror", "read-flush-split", "--osd-size", "256M"]);
    let triggers = with_mirror_faults(&cluster, 1);
    let run = Verifying::start(&cluster.client(), "vm1", 64 * MIB);
    run.wait_for_progress("before the fault");
    let pid = pid_of(&cluster, "osd.1");
    std::fs::write(&triggers[1], "write-eio\n").unwrap();
    let started = Instant::now();
    while !osd_log(&cluster, 1).contains("a mirror device failed") {
        assert!(started.elapsed() < Duration::from_secs(30), "the read device never failed");
        std::thread::sleep(Duration::from_millis(50));
    }
    let socket = cluster.path().join("osd.1").join("admin.sock");
    let mirror_status = || -> serde_json::Value {
        let output = run_ok(cluster.cli().arg("daemon").arg(&socket).args(["mirror", "status", "--json"]));
        serde_json::from_slice(&output.stdout).expect("mirror status JSON")
    };
    assert_eq!(mirror_status()["health"], serde_json::json!(["in-sync", "failed"]));
    assert_eq!(pid_of(&cluster, "osd.1"), pid, "osd.1 kept running");
    let fresh = cluster.path().join("osd.1").join("replacement.img");
    std::fs::File::create(&fresh).unwrap().set_len(256 * MIB).unwrap();
    let replaced = Instant::now();
    let output = run_ok(
        cluster.cli().arg("daemon").arg(&socket).args(["mirror", "replace", "--device", "1", "--path"]).arg(&fresh),
    );
    eprintln!("{}", String::from_utf8_lossy(&output.stdout));
    let mut seen_rebuilding = false;
    let mirror = loop {
        let mirror = mirror_status();
        if mirror["health"] == serde_json::json!(["in-sync", "in-sync"]) {
            break mirror;
        }
        seen_rebuilding |= mirror["rebuild"].is_object();
        assert!(replaced.elapsed() < Duration::from_secs(120), "not in sync 120 s after the replacement: {mirror}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let took = replaced.elapsed();
    assert!(seen_rebuilding || took < Duration::from_millis(500), "the rebuild was never seen under way: {mirror}");
    run.wait_for_progress("after the rebuild");
    std::thread::sleep(Duration::from_secs(1));
    let report = run.finish();
    eprintln!("osd.1's read device replaced online: in sync after {took:?}; {report}");
    assert!(report.is_ok(), "{report}");
    assert_eq!(pid_of(&cluster, "osd.1"), pid, "osd.1 kept running");
    let healthy = Instant::now();
    while status(&cluster)["health"]["status"] != "HEALTH_OK" {
        assert!(healthy.elapsed() < Duration::from_secs(20), "{}", status(&cluster)["health"]);
        std::thread::sleep(Duration::from_millis(200));
    }
    // Restarted on the new pair (its fault triggers gone), compared whole: identical.
    for trigger in &triggers {
        let _ = std::fs::remove_file(trigger);
    }
    let data = format!("data=[\"{}\", \"{}\"]", cluster.path().join("osd.1/store.img").display(), fresh.display());
    let check = "mirror_check_at_start=true";
    run_ok(
        cluster
            .cli()
            .args(["dev", "restart", "--osd", "1", "--osd-set", &data, "--osd-set", check, "--dir"])
            .arg(cluster.path()),
    );
    let log = osd_log(&cluster, 1);
    assert!(
        log.contains("mirror check: the devices are identical after the resync"),
        "the devices differed after the rebuild: {}",
        log.lines().filter(|l| l.contains("mirror check")).collect::<Vec<_>>().join("\n")
    );
}
