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

/// Writes 4 KiB blocks with `depth` threads until `stop`, counting them.
fn load(
    image: Arc<Image>,
    depth: usize,
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..depth)
        .map(|thread| {
            let (image, stop, done) = (image.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut block = thread as u64;
                while !stop.load(Ordering::Relaxed) {
                    image.write((block % 4096) * 4096, Bytes::from(vec![thread as u8; 4096])).expect("a write");
                    done.fetch_add(1, Ordering::Relaxed);
                    block += depth as u64;
                }
            })
        })
        .collect()
}

/// Waits until `image`'s gateway keeps to `iops` (its watch read the header).
fn wait_for_share(image: &Image, iops: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while image.limits().expect("opened for writing").0.iops != iops {
        assert!(Instant::now() < deadline, "the share is {:?}, not {iops}", image.limits());
        std::thread::sleep(Duration::from_millis(20));
    }
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
    stop.store(true, Ordering::Relaxed);
    for thread in threads {
        thread.join().expect("a writer");
    }
}
