//! Issue 30: an eventual pool under the verifying workload. A write is
//! acknowledged from its primary's log; a kill -9 of a primary may lose
//! the writes its replicas had not yet received, and only those of its
//! last `max_lag`. The checker's eventual mode judges the history and
//! reports the loss window it saw.

mod common;

use std::time::Duration;

use common::workload::Verifying;
use common::{kill_9_timed, run_ok, signal, DevCluster};
use duplex_verify::{check_eventual, EventualBounds};

const MIB: u64 = 1 << 20;
/// The pools' max_lag (`DUPLEX_EVENTUAL_MAX_LAG_MS` sets another, for
/// docs/BENCHMARKS.md's loss-window figure).
fn max_lag() -> Duration {
    let ms = std::env::var("DUPLEX_EVENTUAL_MAX_LAG_MS").ok().and_then(|v| v.parse().ok()).unwrap_or(500);
    Duration::from_millis(ms)
}
/// A write's acknowledgement reaches the workload a little after its
/// primary sent it (the reply's trip, the client's thread): the checker's
/// bound allows for that much on a loaded machine.
const REPLY_SLACK: Duration = Duration::from_millis(250);

fn eventual_pool(cluster: &DevCluster) {
    let lag = format!("{}ms", max_lag().as_millis());
    run_ok(cluster.cli().args(["pool", "create", "scratch", "--consistency", "eventual", "--max-lag", &lag]));
}

#[test]
fn a_primary_killed_under_load_loses_nothing_older_than_max_lag() {
    let _alone = common::alone();
    let cluster = DevCluster::start();
    eventual_pool(&cluster);
    let list = String::from_utf8(run_ok(cluster.cli().args(["pool", "list"])).stdout).unwrap();
    let kind =
        format!("replicated, eventual (max lag {})", duplex_map::eventual::format_lag(max_lag().as_millis() as u32));
    assert!(list.contains(&kind), "{list}");
    let json: serde_json::Value =
        serde_json::from_slice(&run_ok(cluster.cli().args(["pool", "list", "--json"])).stdout).unwrap();
    let scratch = json.as_array().unwrap().iter().find(|p| p["name"] == "scratch").unwrap().clone();
    let ms = max_lag().as_millis() as u64;
    assert_eq!((scratch["consistency"].as_str(), scratch["max_lag_ms"].as_u64()), (Some("eventual"), Some(ms)));

    let client = cluster.client();
    let run = Verifying::start_in(&client, "scratch", "tmp", 64 * MIB, Default::default());
    run.wait_for_progress("before the fault");
    let status: serde_json::Value =
        serde_json::from_slice(&run_ok(cluster.cli().args(["status", "--json"])).stdout).unwrap();
    let lags = status["eventual_pgs"].as_array().unwrap();
    assert!(!lags.is_empty(), "the primaries report their PGs' lags: {status}");
    let killed_at = run.recorder.now();
    let ended = kill_9_timed(&cluster, "osd.1");
    // The failure is when its process had gone: no acknowledgement leaves it after.
    let failed_at = killed_at + ended.as_nanos() as u64;
    let resumed = run.wait_for_progress("after kill -9 of osd.1's process");
    std::thread::sleep(Duration::from_secs(2));
    let history = run.history();
    let bounds = EventualBounds { failures: vec![failed_at], max_lag: (max_lag() + REPLY_SLACK).as_nanos() as u64 };
    let report = check_eventual(&history, &bounds);
    eprintln!(
        "kill -9 osd.1 (its process ended after {ended:?}, I/O resumed after {resumed:?}): {report}; \
         loss window {:?} against max_lag {:?}",
        Duration::from_nanos(report.loss_window),
        max_lag()
    );
    assert!(report.is_ok(), "{report}");
    assert!(report.writes_acknowledged > 400, "{report}");
}

/// The lag bound at work: osd.2 hangs (SIGSTOP), so the PGs it is a
/// replica of stop replicating; their primaries go on acknowledging for
/// `max_lag`, then make writes wait. Then osd.1, the primary of some of
/// them, is killed, and osd.2 runs again: it holds those PGs' history now,
/// without what osd.1 acknowledged since osd.2 stopped. Those writes, and
/// only those, are lost: each was acknowledged within `max_lag` of the
/// hang.
#[test]
fn a_primary_killed_while_its_replica_hangs_loses_at_most_max_lag_of_writes() {
    let _alone = common::alone();
    let cluster = DevCluster::start();
    eventual_pool(&cluster);
    let client = cluster.client();
    // Only blocks of PGs osd.1 leads with osd.2 as replica: a write to a
    // PG osd.2 leads would hang with it and hold the workload's slots.
    let map = client.map();
    let scratch = map.pool_by_name("scratch").unwrap().clone();
    let hierarchy = map.hierarchy();
    let options = duplex_client::CreateOptions { object_size: 64 << 10, ..Default::default() };
    let blocks_per_object = u64::from(options.object_size) / 4096;
    let keep = |info: &duplex_client::ImageInfo, block: u64| {
        let pg = duplex_placement::pg_of(&info.object_name(block / blocks_per_object), scratch.pg_num);
        map.acting(&hierarchy, &scratch, pg)[..] == [1, 2]
    };
    let run = Verifying::start_where(&client, "scratch", "tmp", 64 * MIB, options, keep);
    run.wait_for_progress("before the faults");
    let stopped_at = run.recorder.now();
    signal(&cluster, "osd.2", libc::SIGSTOP);
    std::thread::sleep(3 * max_lag());
    let acknowledged_while_hung = run.acknowledged();
    let killed_at = run.recorder.now();
    let ended = kill_9_timed(&cluster, "osd.1");
    signal(&cluster, "osd.2", libc::SIGCONT);
    let resumed = run.wait_for_progress("after osd.1's kill and osd.2's return");
    std::thread::sleep(Duration::from_secs(2));
    let history = run.history();
    let failures = vec![stopped_at, killed_at + ended.as_nanos() as u64];
    let bounds = EventualBounds { failures, max_lag: (max_lag() + REPLY_SLACK).as_nanos() as u64 };
    let report = check_eventual(&history, &bounds);
    eprintln!(
        "osd.2 hung, then osd.1 killed ({acknowledged_while_hung} writes acknowledged by then; I/O resumed after \
         {resumed:?}): {report}; loss window {:?} against max_lag {:?}",
        Duration::from_nanos(report.loss_window),
        max_lag()
    );
    assert!(report.is_ok(), "{report}");
    assert!(report.writes_acknowledged > 400, "{report}");
    // osd.1 acknowledged writes osd.2 never got, and usually those are
    // lost (26 to 68 in the runs recorded in docs/OSD.md). Not always: if
    // the monitor marks osd.2 down during the hang, osd.1 carries the PGs
    // alone and nothing is lost; the bound above is what must hold.
    if report.rollbacks == 0 {
        eprintln!("note: this run lost nothing (osd.1 kept the PGs' history)");
    }
}

/// A primary loses power under load: osd.1's `shm` log goes with it (every
/// write it had not flushed), and so do the store writes its device had
/// not flushed (a simulated volatile cache; the cut comes just before a
/// flush). The writes it acknowledged that its replicas lacked are lost,
/// and only writes acknowledged within `max_lag` of the cut may be; it
/// comes back with its store alone and is repaired from its peers, and no
/// block is torn or comes from nowhere.
#[test]
fn a_primary_that_loses_power_under_load_loses_nothing_older_than_max_lag() {
    let _alone = common::alone();
    let cluster = DevCluster::start();
    eventual_pool(&cluster);
    let trigger = common::with_device_faults(&cluster, 1);
    let client = cluster.client();
    let run = Verifying::start_in(&client, "scratch", "tmp", 64 * MIB, Default::default());
    run.wait_for_progress("before the fault");
    let armed_at = run.recorder.now();
    let ended = common::arm_until_dead(&cluster, 1, &trigger, "power-cut");
    // The cut came at osd.1's first flush after the arming: somewhere in
    // between. Both ends bound the window.
    let failures = vec![armed_at, armed_at + ended.as_nanos() as u64];
    let (lost, resumed, rejoined) = common::back_without_its_log(&cluster, 1, &trigger, &run);
    let history = run.history();
    let bounds = EventualBounds { failures, max_lag: (max_lag() + REPLY_SLACK).as_nanos() as u64 };
    let report = check_eventual(&history, &bounds);
    eprintln!(
        "power loss of osd.1 ({ended:?} after arming; {lost} log files dropped): I/O resumed after {resumed:?}, \
         went on {rejoined:?} after it came back; {report}; loss window {:?} against max_lag {:?}",
        Duration::from_nanos(report.loss_window),
        max_lag()
    );
    assert!(report.is_ok(), "{report}");
    assert!(report.writes_acknowledged > 400, "{report}");
}
