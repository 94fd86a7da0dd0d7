//! One monitor is a complete control plane: OSDs boot through it, and an
//! OSD stub that stops heartbeating is marked down within grace + 2 s, then
//! out after the down-out interval; an OSD that keeps heartbeating stays up.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{boot_osds, leader, wait_for, Cluster};

const GRACE_MS: u64 = 2_000;
const DOWN_OUT_MS: u64 = 3_000;

#[test]
fn a_silent_osd_is_marked_down_within_grace_plus_two_seconds() {
    let cluster = Cluster::new(1, &["--osd-grace-ms", "2000", "--down-out-interval-ms", "3000"]);
    let mut client = cluster.client();
    wait_for("the monitor to lead", Duration::from_secs(20), || leader(&cluster, &client).is_some());
    boot_osds(&mut client, 2);
    // Two OSD stubs heartbeat every 500 ms; OSD 1 stops after the first second.
    let stop_one = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicBool::new(false));
    let stub = {
        let (mut client, stop_one, done) = (cluster.client(), stop_one.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let lease = client.heartbeat(0).unwrap();
                assert!(lease > Duration::ZERO && lease < Duration::from_millis(GRACE_MS), "{lease:?}");
                if !stop_one.load(Ordering::Relaxed) {
                    client.heartbeat(1).unwrap();
                }
                std::thread::sleep(Duration::from_millis(500));
            }
        })
    };
    std::thread::sleep(Duration::from_secs(1));
    stop_one.store(true, Ordering::Relaxed);
    let silent_since = Instant::now();
    wait_for("OSD 1 to be marked down", Duration::from_millis(GRACE_MS + 5_000), || {
        client.map(1).is_ok_and(|m| !m.osds[&1].up)
    });
    let detected_after = silent_since.elapsed();
    assert!(detected_after <= Duration::from_millis(GRACE_MS + 2_000), "marked down after {detected_after:?}");
    assert_eq!(client.heartbeat(1).unwrap(), Duration::ZERO, "a down OSD gets no lease until it boots again");
    wait_for("OSD 1 to be marked out", Duration::from_millis(DOWN_OUT_MS + 5_000), || {
        client.map(1).is_ok_and(|m| !m.osds[&1].is_in)
    });
    let map = client.map(1).unwrap();
    assert!(map.osds[&0].up && map.osds[&0].is_in, "the heartbeating OSD stayed up and in");
    done.store(true, Ordering::Relaxed);
    stub.join().unwrap();
}

/// Issue 24: an OSD whose heartbeat connection (kept for its life) ends,
/// and whose address then refuses connections, is marked down at once,
/// not after the grace (20 s here). One whose heartbeats came on one-off
/// connections, and one whose address still accepts, are left to the grace.
#[test]
fn an_osd_whose_kept_heartbeat_connection_ends_and_whose_port_refuses_is_marked_down_at_once() {
    let cluster = Cluster::new(1, &["--osd-grace-ms", "20000"]);
    let mut client = cluster.client();
    wait_for("the monitor to lead", Duration::from_secs(20), || leader(&cluster, &client).is_some());
    // Three OSDs with real addresses: listeners, closed when the OSD "dies".
    let listeners: Vec<std::net::TcpListener> =
        (0..3).map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap()).collect();
    for (id, listener) in listeners.iter().enumerate() {
        let addr = listener.local_addr().unwrap().to_string();
        let boot = duplex_map::Command::OsdBoot { id: id as u32, addr, host: format!("h{id}"), weight: 1 << 16 };
        client.command(&boot).unwrap();
    }
    let beat = |id: u32, keep: bool| {
        let mut osd = cluster.client();
        osd.keep_connection = keep;
        for _ in 0..3 {
            assert!(osd.heartbeat(id).unwrap() > Duration::ZERO);
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    // osd.0: a kept connection, then its process "dies": the connection
    // closes and the port refuses.
    // osd.1: one-off connections, then its port refuses too.
    // osd.2: a kept connection that closes while its port still accepts.
    let mut listeners = listeners.into_iter();
    let (zero, one, two) = (listeners.next().unwrap(), listeners.next().unwrap(), listeners.next().unwrap());
    drop(zero);
    drop(one);
    beat(0, true);
    beat(1, false);
    beat(2, true);
    let ended = Instant::now();
    wait_for("osd.0 to be marked down", Duration::from_secs(5), || client.map(1).is_ok_and(|m| !m.osds[&0].up));
    eprintln!("osd.0 marked down {:?} after its heartbeat connection ended", ended.elapsed());
    std::thread::sleep(Duration::from_secs(2));
    let map = client.map(1).unwrap();
    assert!(map.osds[&1].up, "one-off heartbeat connections say nothing when they close");
    assert!(map.osds[&2].up, "a port that accepts is a live process");
    drop(two);
}
