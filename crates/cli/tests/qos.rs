//! Image limits (issue 31) on a real local cluster: set with `duplex image
//! set`, shown by `image info`, kept by two gateways together, and
//! changed live.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{run_ok, DevCluster};
use duplex_client::image::Image;

/// `depth` threads each calling `write(thread, round)` until `stop`, counting the calls.
fn writers(
    depth: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    write: impl Fn(usize, u64) + Send + Sync + 'static,
) -> Vec<std::thread::JoinHandle<()>> {
    let write = Arc::new(write);
    (0..depth)
        .map(|thread| {
            let (write, stop, done) = (write.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut round = 0;
                while !stop.load(Ordering::Relaxed) {
                    write(thread, round);
                    done.fetch_add(1, Ordering::Relaxed);
                    round += 1;
                }
            })
        })
        .collect()
}

/// Writes 4 KiB blocks of `image` with `depth` threads until `stop`, counting them.
fn load(
    image: Arc<Image>,
    depth: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    writers(depth, stop, done, move |thread, round| {
        let block = (thread as u64 + round * depth as u64) % 4096;
        image.write(block * 4096, Bytes::from(vec![thread as u8; 4096])).expect("a write");
    })
}

/// Waits until `image`'s gateway keeps to `iops` (its watch read the header).
fn wait_for_share(image: &Image, iops: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while image.limits().expect("opened for writing").0.iops != iops {
        assert!(Instant::now() < deadline, "the share is {:?}, not {iops}", image.limits());
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Client operations the OSDs' schedulers took, and those their
/// limiters held, summed over the OSDs.
fn qos_ops(cluster: &DevCluster) -> (f64, f64) {
    let mut sums = (0.0, 0.0);
    for osd in common::osds(cluster.path()) {
        let metrics = common::scrape(osd.admin);
        sums.0 += metrics.get("duplex_osd_qos_ops_total{by=\"scheduler\"}").copied().unwrap_or(0.0);
        sums.1 += metrics.get("duplex_osd_qos_ops_total{by=\"limiter\"}").copied().unwrap_or(0.0);
    }
    sums
}

/// Completions counted over `span`, after the gateways settled.
fn rate_over(done: &AtomicU64, span: Duration) -> f64 {
    let before = done.load(Ordering::Relaxed);
    std::thread::sleep(span);
    (done.load(Ordering::Relaxed) - before) as f64 / span.as_secs_f64()
}

#[test]
fn an_image_limit_holds_across_two_gateways_and_changes_apply_within_a_second() {
    let cluster = DevCluster::start();
    run_ok(cluster.cli().args(["image", "create", "disk", "--size", "64M"]));

    // Bad input is refused with the setting named, and changes nothing.
    for bad in ["qos_iops=-1", "qos_iosp=5", "qos_burst_s=0", "qos_bps=12Q", "qos_iops"] {
        let out = cluster.cli().args(["image", "set", "disk", bad]).output().expect("duplex runs");
        assert!(!out.status.success(), "'{bad}' was taken");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("qos_") || stderr.contains("KEY=VALUE"), "'{bad}': {stderr}");
    }
    let info = run_ok(cluster.cli().args(["image", "info", "disk"]));
    assert!(String::from_utf8_lossy(&info.stdout).contains("limits:       none"));

    run_ok(cluster.cli().args(["image", "set", "disk", "qos_iops=400", "qos_burst_s=0.25"]));
    let info = String::from_utf8_lossy(&run_ok(cluster.cli().args(["image", "info", "disk"])).stdout).to_string();
    assert!(info.contains("qos_iops=400 qos_burst_s=0.25"), "{info}");

    // Two gateways (clients of their own) on the image, 8 writers each.
    let pool = cluster.client().pool_id("rbd").expect("the pool");
    let (first, second) = (cluster.client(), cluster.client());
    let a = Arc::new(first.open_image(pool, "disk").expect("open"));
    let b = Arc::new(second.open_image(pool, "disk").expect("open"));
    wait_for_share(&a, 200);
    wait_for_share(&b, 200);
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let mut threads = load(a.clone(), 8, stop.clone(), done.clone());
    threads.extend(load(b.clone(), 8, stop.clone(), done.clone()));
    // The second gateway starts no write until the first can no longer
    // believe itself alone (crate::watch::FENCE after it registered).
    std::thread::sleep(duplex_client::watch::FENCE + Duration::from_millis(500));
    let limited = rate_over(&done, Duration::from_secs(3));
    // The two shares' buckets (0.25 s each) may add 200 I/Os to the 3 s.
    assert!((360.0..=470.0).contains(&limited), "{limited:.0} IOPS against a limit of 400");
    assert!(a.limits().unwrap().1 > 0 && b.limits().unwrap().1 > 0, "both gateways held I/O back");
    // The OSDs scheduled the image's operations but never held one: the
    // gateways kept to their shares (the OSDs allow twice their burst).
    // `duplex status` names the image its gateways hold back.
    let status = String::from_utf8_lossy(&run_ok(cluster.cli().args(["status"])).stdout).to_string();
    assert!(status.contains("qos:      rbd/disk held to its limits (2 gateway(s) holding"), "{status}");
    let (scheduled, limited) = qos_ops(&cluster);
    assert!(scheduled > 1000.0, "{scheduled} operations went through the OSDs' schedulers");
    assert_eq!(limited, 0.0, "an OSD held honest gateways' operations");

    // Raised live: both gateways take the new share within a second.
    let changed = Instant::now();
    run_ok(cluster.cli().args(["image", "set", "disk", "qos_iops=800"]));
    wait_for_share(&a, 400);
    wait_for_share(&b, 400);
    assert!(changed.elapsed() < Duration::from_millis(1500), "took {:?}", changed.elapsed());
    std::thread::sleep(Duration::from_millis(300));
    let raised = rate_over(&done, Duration::from_secs(2));
    assert!(raised > limited * 1.4 && raised <= 920.0, "{raised:.0} IOPS against a limit of 800");

    // A pool's default applies to an image with no setting of that key;
    // the image's own wins over it.
    run_ok(cluster.cli().args(["pool", "set", "rbd", "qos_iops=600"]));
    run_ok(cluster.cli().args(["pool", "set", "rbd", "qos_write_iops=300"]));
    let pools = String::from_utf8_lossy(&run_ok(cluster.cli().args(["pool", "list"])).stdout).to_string();
    assert!(pools.contains("image limits qos_iops=600 qos_write_iops=300"), "{pools}");
    let deadline = Instant::now() + Duration::from_secs(5);
    // The pool's write limit, shared by two gateways; the image's own IOPS limit stays.
    while a.limits().unwrap().0.write_iops != 150 {
        assert!(Instant::now() < deadline, "{:?}", a.limits());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(a.limits().unwrap().0.iops, 400, "the image's own setting wins over the pool's");
    run_ok(cluster.cli().args(["pool", "set", "rbd", "qos_write_iops=0"]));

    // Removed: unlimited again.
    run_ok(cluster.cli().args(["image", "set", "disk", "qos_iops=0"]));
    let info = String::from_utf8_lossy(&run_ok(cluster.cli().args(["image", "info", "disk"])).stdout).to_string();
    assert!(info.contains("limits:       qos_iops=600 qos_burst_s=0.25"), "{info}");
    run_ok(cluster.cli().args(["pool", "set", "rbd", "qos_iops=0"]));
    wait_for_share(&a, 0);
    // Unlimited, the gateways withdraw their reports at their next renewal.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let status: serde_json::Value =
            serde_json::from_slice(&run_ok(cluster.cli().args(["status", "--json"])).stdout).expect("JSON");
        if status["throttled_images"].as_array().is_some_and(|images| images.is_empty()) {
            break;
        }
        assert!(Instant::now() < deadline, "still reported: {}", status["throttled_images"]);
    }
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a writer");
    }
}

/// Writes one object of the image's with `depth` threads of one client
/// that knows nothing of limits, until `stop`.
fn raw_load(
    client: Arc<duplex_client::Client>,
    pool: u32,
    object: Vec<u8>,
    depth: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    writers(depth, stop, done, move |thread, _| {
        let offset = (thread as u64 % 64) * 4096;
        client.write(pool, &object, offset, Bytes::from(vec![thread as u8; 4096])).expect("a write");
    })
}

#[test]
fn an_osd_holds_a_client_that_ignores_its_images_limit() {
    let cluster = DevCluster::start();
    run_ok(cluster.cli().args(["image", "create", "disk", "--size", "64M"]));
    let client = Arc::new(cluster.client());
    let pool = client.pool_id("rbd").expect("the pool");
    let id = client.image_info(pool, "disk").expect("the image").id;
    // One data object: one PG, one primary OSD.
    let object = format!("{id}.{:016x}", 3).into_bytes();
    let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
    let threads = raw_load(client.clone(), pool, object, 16, stop.clone(), done.clone());
    std::thread::sleep(Duration::from_millis(500));
    let free = rate_over(&done, Duration::from_secs(2));
    assert!(free > 1000.0, "unlimited, one object takes {free:.0} writes a second: too few for the test");

    // The image's limit reaches the OSDs through the map within a second;
    // the client's own writes never asked its throttle.
    run_ok(cluster.cli().args(["image", "set", "disk", "qos_write_iops=200", "qos_burst_s=0.25"]));
    std::thread::sleep(Duration::from_millis(1500));
    let held = rate_over(&done, Duration::from_secs(3));
    // The OSD's burst is twice the image's (0.5 s): at most 100 more in 3 s.
    assert!((150.0..=240.0).contains(&held), "{held:.0} writes a second against an OSD limit of 200");
    assert!(qos_ops(&cluster).1 > 100.0, "the limiter's holds are counted");

    // Reservations and weights are taken too, and shown; removing the
    // settings frees the client again.
    run_ok(cluster.cli().args(["image", "set", "disk", "qos_reservation_iops=100", "qos_weight=3"]));
    let info = String::from_utf8_lossy(&run_ok(cluster.cli().args(["image", "info", "disk"])).stdout).to_string();
    assert!(info.contains("reservation:  100 IOPS (4 KiB) at each OSD; weight 3"), "{info}");
    // The OSD that holds the object shows the image's class, as scheduled
    // (its threads publish every half second).
    std::thread::sleep(Duration::from_millis(1500));
    let class_name = format!("image {pool}/{id}");
    let shown: Vec<serde_json::Value> = common::osds(cluster.path())
        .iter()
        .flat_map(|osd| {
            let socket = cluster.path().join(&osd.name).join("admin.sock");
            let out = run_ok(cluster.cli().arg("daemon").arg(&socket).args(["qos", "--json"]));
            let reply: serde_json::Value = serde_json::from_slice(&out.stdout).expect("qos --json is JSON");
            assert_eq!(reply["on"], true, "{}: {reply}", osd.name);
            // The flushers' background classes, with the OSD's defaults
            // (128 MiB/s of backfill in 4 KiB units, 500 trims a second).
            let background = reply["background"].as_array().cloned().unwrap_or_default();
            let limits: Vec<(String, f64)> = background
                .iter()
                .map(|c| (c["class"].as_str().unwrap_or("?").to_string(), c["limit"].as_f64().unwrap_or(-1.0)))
                .collect();
            let expected = [("backfill", 32_768.0), ("scrub", 0.0), ("trim", 500.0), ("strays", 16_000.0)];
            assert_eq!(limits, expected.map(|(c, l)| (c.to_string(), l)), "{}: {reply}", osd.name);
            reply["threads"].as_array().cloned().unwrap_or_default()
        })
        .flat_map(|thread| thread["classes"].as_array().cloned().unwrap_or_default())
        .filter(|class| class["class"] == class_name.as_str())
        .collect();
    assert!(!shown.is_empty(), "no OSD shows {class_name}");
    assert!(shown.iter().all(|c| c["reservation"] == 100.0 && c["weight"] == 3.0), "{shown:?}");
    let served: u64 =
        shown.iter().map(|c| c["served_reservation"].as_u64().unwrap() + c["served_weight"].as_u64().unwrap()).sum();
    assert!(served > 0, "{shown:?}");
    let out = cluster.cli().args(["image", "set", "disk", "qos_reservation_iops=500"]).output().expect("duplex runs");
    assert!(!out.status.success(), "a reservation above the image's limit was taken");
    run_ok(cluster.cli().args(["image", "set", "disk", "qos_write_iops=0", "qos_burst_s=1"]));
    std::thread::sleep(Duration::from_millis(1500));
    let freed = rate_over(&done, Duration::from_secs(2));
    eprintln!("one object's writes a second: {free:.0} free, {held:.0} held, {freed:.0} freed");
    assert!(freed > 3.0 * held, "{freed:.0} writes a second once the limit went, {held:.0} before");
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a writer");
    }
    // Removing the image takes its settings out of the map.
    run_ok(cluster.cli().args(["image", "remove", "disk"]));
    assert!(cluster.client().map().image_qos.is_empty(), "the removed image's settings stay in the map");
}

/// `duplex status --json`'s PG states.
fn pg_states(cluster: &DevCluster) -> serde_json::Value {
    let status: serde_json::Value =
        serde_json::from_slice(&run_ok(cluster.cli().args(["status", "--json"])).stdout).expect("status JSON");
    status["pgs"].clone()
}

/// Waits until every one of the 32 PGs is active+clean; false after `within`.
fn clean_within(cluster: &DevCluster, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if pg_states(cluster)["active+clean"] == 32 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// The writers' span at the start of each object: the rest of it is
/// theirs to leave alone, so the backfill must copy it.
const WRITTEN: u64 = 1 << 20;

#[test]
fn recovery_completes_under_a_saturating_client() {
    let cluster = DevCluster::start();
    // The PGs osd.0 holds are counted from the map at the end: no balancer
    // moving them meanwhile.
    run_ok(cluster.cli().args(["config", "set", "balancer_max_spread", "0"]));
    run_ok(cluster.cli().args(["image", "create", "disk", "--size", "64M"]));
    let client = cluster.client();
    let pool = client.pool_id("rbd").expect("the pool");
    let image = Arc::new(client.open_image(pool, "disk").expect("open"));
    let object_size = u64::from(image.info().object_size);
    assert!(object_size > WRITTEN, "objects of {object_size} bytes: nothing past the writers' span");
    // Every block written once, so the backfill has the whole image to move.
    for block in 0..64u64 {
        image.write(block << 20, Bytes::from(vec![block as u8; 1 << 20])).expect("a fill write");
    }
    run_ok(cluster.cli().args(["mark", "out", "0"]));
    assert!(clean_within(&cluster, Duration::from_secs(120)), "after mark out: {}", pg_states(&cluster));
    // osd.0 keeps its copies while out (flusher/strays.rs), and a backfill
    // sends only the chunks that changed: change them all.
    for block in 0..64u64 {
        image.write(block << 20, Bytes::from(vec![!(block as u8); 1 << 20])).expect("a rewrite");
    }

    // 16 writers as fast as the cluster takes them, each on blocks of its
    // own in the first 1 MiB of every object, remembering what it wrote
    // last to each. (Writing everywhere, they rewrote whole chunks before
    // the backfill reached them, and it rightly had less to copy.)
    let stop = Arc::new(AtomicBool::new(false));
    let objects = image.info().object_count();
    let writers: Vec<_> = (0..16u64)
        .map(|writer| {
            let (image, stop) = (image.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut last = std::collections::HashMap::new();
                let mut round = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let slot = writer + 16 * ((round / objects) % (WRITTEN / 4096 / 16));
                    let offset = (round % objects) * object_size + slot * 4096;
                    let byte = (round % 251) as u8;
                    image.write(offset, Bytes::from(vec![byte; 4096])).expect("a write under recovery");
                    last.insert(offset, byte);
                    round += 1;
                }
                (last, round)
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let backfilled = || -> f64 {
        common::osds(cluster.path())
            .iter()
            .map(|osd| common::scrape(osd.admin).get("duplex_osd_backfill_bytes_total").copied().unwrap_or(0.0))
            .sum()
    };
    let before = backfilled();
    let marked = Instant::now();
    run_ok(cluster.cli().args(["mark", "in", "0"]));
    let clean = clean_within(&cluster, Duration::from_secs(180));
    let took = marked.elapsed();
    stop.store(true, Ordering::Relaxed);
    let mut writes = 0;
    for writer in writers {
        let (last, rounds) = writer.join().expect("a writer");
        writes += rounds;
        for (offset, byte) in last {
            let read = image.read(offset, 4096).expect("a read back");
            assert!(read.iter().all(|b| *b == byte), "the 4 KiB at {offset} lost their last write");
        }
    }
    assert!(clean, "the backfill did not finish under load in {took:?}: {}", pg_states(&cluster));
    // Every object whose PG has osd.0 came back to it, at least the bytes
    // past the writers' span (each was rewritten while it was out). Counted from
    // the map, not guessed: the image id is random, so osd.0's share of the
    // 16 objects varies from run to run (8 in one CI run, 10.7 on average).
    let map = cluster.client().map();
    let hierarchy = map.hierarchy();
    let data_pool = map.pools.get(&pool).expect("the pool's info");
    let info = image.info();
    let owed = (0..objects)
        .filter(|number| {
            let pg = duplex_placement::pg_of(&info.object_name(*number), data_pool.pg_num);
            map.acting(&hierarchy, data_pool, pg).contains(&0)
        })
        .count() as u64;
    let moved = backfilled() - before;
    assert!(owed > 0, "no object of the image is placed on osd.0");
    let least = (owed * (object_size - WRITTEN)) as f64;
    assert!(moved >= least, "{moved} bytes backfilled; osd.0's {owed} objects lacked {least} the writers left alone");
    eprintln!("{moved} bytes backfilled to osd.0 ({owed} objects) in {took:?} under {writes} client writes");
    assert!(writes > 1000, "the client was not saturating: {writes} writes");
    // The backfill went through the flushers' backfill class: at least
    // the chunks written at targets (one unit per 4 KiB), and the
    // primaries' chunk locks on top (flusher::device).
    let backfill_cost: f64 = common::osds(cluster.path())
        .iter()
        .map(|osd| {
            common::scrape(osd.admin)
                .get("duplex_osd_background_cost_total{class=\"backfill\"}")
                .copied()
                .unwrap_or(0.0)
        })
        .sum();
    assert!(backfill_cost >= moved / 4096.0, "the backfill class was charged {backfill_cost} units for {moved} bytes");
}
