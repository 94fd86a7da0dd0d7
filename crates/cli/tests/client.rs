//! The client library against a `duplex dev up` cluster: object operations,
//! request-id deduplication, images, and in-flight I/O across an OSD failure.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::workload::Verifying;
use common::{
    arm_until_dead, back_without_its_log, kill_9, kill_9_timed, pid_of, restart_osd, run_ok, with_device_faults,
    workload, DevCluster,
};
use duplex_client::{ClientError, CreateOptions};
use duplex_mon_client::Connection as OsdConnection;
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};

const MIB: u64 = 1 << 20;

#[test]
fn objects_images_and_resends() {
    let cluster = DevCluster::start();
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    assert!(matches!(client.pool_id("nope"), Err(ClientError::NoSuchPool(_))));

    // Objects: data, size, attributes, listings.
    client.write(pool, b"alpha", 10, Bytes::from_static(b"hello")).unwrap();
    assert_eq!(&client.read(pool, b"alpha", 10, 100).unwrap()[..], b"hello");
    assert_eq!(client.stat(pool, b"alpha").unwrap().size, 15);
    client.truncate(pool, b"alpha", 12).unwrap();
    assert_eq!(&client.read(pool, b"alpha", 0, 100).unwrap()[..], b"\0\0\0\0\0\0\0\0\0\0he");
    client.set_attr(pool, b"alpha", b"color", b"blue").unwrap();
    client.set_attr(pool, b"alpha", b"shape", b"round").unwrap();
    assert_eq!(&client.get_attr(pool, b"alpha", b"color").unwrap()[..], b"blue");
    assert_eq!(client.list_attrs(pool, b"alpha").unwrap().len(), 2);
    client.remove_attr(pool, b"alpha", b"color").unwrap();
    assert_eq!(client.get_attr(pool, b"alpha", b"color"), Err(ClientError::NotFound));
    let big = vec![1u8; 4000];
    for n in 0..4 {
        client.set_attr(pool, b"alpha", format!("big{n}").as_bytes(), &big).unwrap();
    }
    assert!(matches!(client.set_attr(pool, b"alpha", b"big4", &big), Err(ClientError::Invalid(_))), "attribute budget");
    assert!(matches!(client.set_attr(pool, b"alpha", b"x", &vec![0; 5000]), Err(ClientError::Invalid(_))));
    for n in 0..40 {
        client.write(pool, format!("listed.{n:02}").as_bytes(), 0, Bytes::from_static(b"x")).unwrap();
    }
    let mut listed = client.list_objects(pool, b"listed.").unwrap();
    listed.sort();
    assert_eq!(listed.len(), 40);
    assert_eq!(listed[0], b"listed.00");
    client.create_preallocated(pool, b"pre", 64 << 10).unwrap();
    let stat = client.stat(pool, b"pre").unwrap();
    assert!(stat.preallocated && stat.size == 64 << 10, "{stat:?}");
    client.delete(pool, b"alpha").unwrap();
    assert_eq!(client.stat(pool, b"alpha"), Err(ClientError::NotFound));
    assert_eq!(client.read(pool, b"alpha", 0, 1), Err(ClientError::NotFound));

    // A resent request (same client and transaction id) is answered, not applied again.
    let map = client.map();
    let hierarchy = map.hierarchy();
    let info = map.pools.get(&pool).unwrap();
    let pg = duplex_placement::pg_of(b"dedup", info.pg_num);
    let primary = map.acting(&hierarchy, info, pg)[0];
    let addr = map.osds[&primary].addr.parse().unwrap();
    let mut conn = OsdConnection::connect(addr, &client.config().credentials, Duration::from_secs(5)).unwrap();
    let request = |data: &'static [u8]| OpRequest {
        kind: OpKind::Write,
        pool,
        pg,
        map_epoch: map.epoch,
        object: Bytes::from_static(b"dedup"),
        offset: 0,
        length: 0,
        data: Bytes::from_static(data),
        client: 0xC11E47,
        snap: 0,
    };
    let mut call = |request: OpRequest, txid: u64| {
        conn.send(&request.to_frame(txid)).unwrap();
        OpReply::decode(&conn.recv().unwrap().payload).unwrap()
    };
    assert_eq!(call(request(b"first"), 1).status, Status::Ok);
    assert_eq!(call(request(b"later"), 2).status, Status::Ok);
    assert_eq!(call(request(b"first"), 1).status, Status::Ok, "a resend is answered Ok");
    assert_eq!(&client.read(pool, b"dedup", 0, 5).unwrap()[..], b"later", "the resend was not applied again");

    // Images.
    let info = client.create_image(pool, "vm1", 64 * MIB, CreateOptions::default()).unwrap();
    assert_eq!(info.object_count(), 16);
    assert!(matches!(
        client.create_image(pool, "vm1", MIB, CreateOptions::default()),
        Err(ClientError::ImageExists(_))
    ));
    assert!(matches!(
        client.create_image(pool, "bad/name", MIB, CreateOptions::default()),
        Err(ClientError::Invalid(_))
    ));
    client
        .create_image(
            pool,
            "vm2",
            32 * MIB,
            CreateOptions { object_size: MIB as u32, preallocate: true, data_pool: None },
        )
        .unwrap();
    assert_eq!(client.list_images(pool).unwrap(), vec!["vm1".to_string(), "vm2".to_string()]);
    let image = client.open_image(pool, "vm1").unwrap();
    let data: Vec<u8> = (0..3 * MIB as usize + 1000).map(|i| (i % 253) as u8).collect();
    let at = 4 * MIB - 700; // crosses two object boundaries
    image.write(at, Bytes::from(data.clone())).unwrap();
    assert_eq!(image.read(at, data.len() as u32).unwrap(), data);
    assert_eq!(image.read(0, 4096).unwrap(), vec![0u8; 4096], "never written reads as zeros");
    assert!(image.read(at, 0).unwrap().is_empty(), "an empty read completes");
    assert!(matches!(image.read(64 * MIB - 10, 11), Err(ClientError::Invalid(_))), "past the end");
    image.write_zeroes(at + 100, 2 * MIB).unwrap();
    let after = image.read(at, data.len() as u32).unwrap();
    assert_eq!(&after[..100], &data[..100]);
    assert!(after[100..100 + 2 * MIB as usize].iter().all(|b| *b == 0));
    assert_eq!(&after[100 + 2 * MIB as usize..], &data[100 + 2 * MIB as usize..]);
    // Shrink below the data, grow again: the cut part reads as zeros.
    client.resize_image(pool, "vm1", 5 * MIB).unwrap();
    client.resize_image(pool, "vm1", 64 * MIB).unwrap();
    let image = client.open_image(pool, "vm1").unwrap();
    let regrown = image.read(at, data.len() as u32).unwrap();
    let cut = (5 * MIB - at) as usize;
    assert_eq!(&regrown[..100], &data[..100]);
    assert!(regrown[cut..].iter().all(|b| *b == 0), "data past a shrink is gone");
    // The pre-allocated image's objects exist from creation.
    let vm2 = client.image_info(pool, "vm2").unwrap();
    let object = format!("{}.{:016x}", vm2.id, 7);
    assert!(client.stat(pool, object.as_bytes()).unwrap().preallocated);
    // Zeroing it all writes zeros in place: 128 pieces, more than one window.
    let pre = client.open_image(pool, "vm2").unwrap();
    pre.write(5 * MIB + 3, Bytes::from(vec![7u8; 3 * MIB as usize])).unwrap();
    pre.write_zeroes(0, 32 * MIB).unwrap();
    assert!(pre.read(4 * MIB, 5 * MIB as u32).unwrap().iter().all(|b| *b == 0), "zeroed in full");
    assert!(client.stat(pool, object.as_bytes()).unwrap().preallocated, "extents kept");
    // Refused while open (its watch would write the header again), as `rbd rm` refuses.
    assert!(matches!(client.remove_image(pool, "vm2"), Err(ClientError::Busy(_))));
    pre.close();
    client.remove_image(pool, "vm2").unwrap();
    assert_eq!(client.list_objects(pool, format!("{}.", vm2.id).as_bytes()).unwrap(), Vec::<Vec<u8>>::new());
    assert_eq!(client.list_images(pool).unwrap(), vec!["vm1".to_string()]);
    assert!(matches!(client.image_info(pool, "vm2"), Err(ClientError::NoSuchImage(_))));

    // The CLI sees the same.
    let listed = run_ok(cluster.cli().args(["image", "list"]));
    assert_eq!(String::from_utf8_lossy(&listed.stdout).trim(), "vm1");
    // The balancer may be moving a PG the images' bytes left uneven (a
    // pre-allocated image takes its whole size at once): clean within a while.
    let status_now = || -> serde_json::Value {
        serde_json::from_slice(&run_ok(cluster.cli().args(["status", "--json"])).stdout).unwrap()
    };
    assert!(
        wait_until(Duration::from_secs(60), || status_now()["pgs"]["active+clean"] == 32),
        "PGs not all active+clean: {}",
        status_now()["pgs"]
    );
    let status = status_now();
    assert_eq!(status["osds"]["up"], 3);
    assert!(status["used_bytes"].as_u64().unwrap() > 0);

    // Export to a sparse file and import it back; export to a pipe and
    // import from one: byte-equal, and the holes stay holes.
    let file = cluster.path().join("vm1.raw");
    let file_arg = file.to_str().unwrap();
    run_ok(cluster.cli().args(["image", "export", "vm1", file_arg]));
    let exported = std::fs::read(&file).unwrap();
    assert_eq!(exported.len() as u64, 64 * MIB);
    assert_eq!(&exported[at as usize..at as usize + 100], &data[..100]);
    assert!(exported[..at as usize].iter().all(|b| *b == 0));
    use std::os::unix::fs::MetadataExt;
    let allocated = std::fs::metadata(&file).unwrap().blocks() * 512;
    assert!(
        allocated < 16 * MIB,
        "the export is sparse: {allocated} bytes allocated for a 64 MiB image with 1 MiB of data"
    );
    let imported = run_ok(cluster.cli().args(["image", "import", file_arg, "vm1-copy"]));
    assert!(String::from_utf8_lossy(&imported.stdout).contains("of zeros not written"), "{imported:?}");
    let copy = client.open_image(pool, "vm1-copy").unwrap();
    assert_eq!(copy.size(), 64 * MIB);
    assert_eq!(copy.read(0, 64 * MIB as u32).unwrap(), exported, "the import reads back as the export");
    let objects = client.list_objects(pool, format!("{}.", copy.info().id).as_bytes()).unwrap();
    assert!(objects.len() <= 2, "zero chunks were not written: {} objects", objects.len());
    let piped = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("{cli} image export vm1 - | {cli} image import - vm1-piped --size 64M", cli = cluster.cli_line()))
        .output()
        .unwrap();
    assert!(piped.status.success(), "{piped:?}");
    // A reader that stops early (`| head -c 4096`) ends the export
    // quietly (issue 24), with success and nothing on stderr.
    let mut export = cluster
        .cli()
        .args(["image", "export", "vm1", "-"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut head = [0u8; 4096];
    std::io::Read::read_exact(export.stdout.as_mut().unwrap(), &mut head).unwrap();
    assert_eq!(&head[..], &exported[..4096], "the export's first bytes");
    drop(export.stdout.take());
    let stopped = export.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&stopped.stderr);
    assert!(stopped.status.success() && stderr.trim().is_empty(), "{}: {stderr}", stopped.status);
    let piped = client.open_image(pool, "vm1-piped").unwrap();
    assert_eq!(piped.read(0, 64 * MIB as u32).unwrap(), exported, "the pipe carried every byte");
    // A stream shorter than --size: refused, and no half image is left.
    let short = std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("head -c 1000 {file_arg} | {} image import - vm1-short --size 64M", cluster.cli_line()))
        .output()
        .unwrap();
    assert!(!short.status.success());
    assert!(String::from_utf8_lossy(&short.stderr).contains("ended after"), "{short:?}");
    assert!(matches!(client.image_info(pool, "vm1-short"), Err(ClientError::NoSuchImage(_))));
}

/// `duplex <args> --json` against `cluster`, parsed.
fn cli_json(cluster: &DevCluster, args: &[&str]) -> serde_json::Value {
    let output = run_ok(cluster.cli().args(args).arg("--json"));
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("duplex {args:?} --json: {e}"))
}

/// Writes `chunk(n)` at MiB `n` of `image`, from 0 on, until the cluster
/// refuses one, within 5 minutes and `limit` MiB; the MiBs acknowledged,
/// and the refusal, which must be "cluster full" (`NoSpace`).
fn fill_until_refused(image: &duplex_client::Image, limit: u64, chunk: impl Fn(u64) -> Bytes) -> (u64, ClientError) {
    const MIB: u64 = 1 << 20;
    let started = Instant::now();
    let mut acknowledged = 0;
    let refusal = loop {
        assert!(started.elapsed() < Duration::from_secs(300), "still writing after 5 minutes");
        match image.write(acknowledged * MIB, chunk(acknowledged)) {
            Ok(()) => acknowledged += 1,
            Err(err) => break err,
        }
        assert!(acknowledged < limit, "the cluster took all {limit} MiB");
    };
    assert!(matches!(refusal, ClientError::NoSpace(_)), "refused with {refusal:?}, not 'cluster full'");
    (acknowledged, refusal)
}

/// Writes `object` until the cluster takes it, while it answers "cluster
/// full" for at most `within`; how long that took.
fn write_once_not_full(client: &duplex_client::Client, pool: u32, object: &[u8], within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        match client.write(pool, object, 0, Bytes::from(vec![3u8; 4096])) {
            Ok(()) => return started.elapsed(),
            Err(ClientError::NoSpace(_)) if started.elapsed() < within => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("writes did not resume within {within:?}: {other:?}"),
        }
    }
}

/// Polls `ready` every 100 ms for up to `within`; whether it became true.
fn wait_until(within: Duration, mut ready: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    while started.elapsed() < within {
        if ready() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    ready()
}

/// Issue 7, scenario 1: kill -9 an OSD (primary of some of the busy PGs)
/// during stamped random writes and reads; I/O resumes after the failover,
/// no acknowledged write is lost and no read goes back in time.
#[test]
fn acknowledged_writes_survive_an_osd_kill() {
    let _alone = common::alone();
    let cluster = DevCluster::start();
    let client = cluster.client();
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the fault");
    let before = run.longest_write_wait();
    let ended = kill_9_timed(&cluster, "osd.1");
    let resumed = run.wait_for_progress("after kill -9 of osd.1");
    std::thread::sleep(Duration::from_secs(2));
    let pause = run.longest_write_wait();
    let report = run.finish();
    eprintln!(
        "kill -9 osd.1: its process ended after {ended:?}; I/O resumed after {resumed:?}; longest write {pause:?} (before the kill {before:?}); {report}"
    );
    assert!(report.is_ok(), "{report}");
    assert!(report.writes_acknowledged > 400, "{report}");
    // Once the process has ended, its peers find its address refusing
    // connections and the monitor marks it down at once, well inside the
    // 6 s heartbeat grace. Until then its sockets are open (a thread of it
    // may sit in an fsync: under CI's load that once took 1.3 s), and no
    // one can tell it from a slow OSD.
    assert!(
        pause <= ended + Duration::from_millis(1500),
        "a write waited {pause:?} across a kill -9 (the process took {ended:?} to end)"
    );
}

/// Issue 24: a hung OSD (SIGSTOP: its sockets stay open, its port still
/// accepts) is not mistaken for a gone one. The probe finds it there, so
/// the heartbeat grace finds it, and its lease keeps it from serving:
/// while it hangs no write waits longer than the grace plus a second,
/// nothing is lost, and once it runs again it boots anew and rejoins.
///
/// The rejoin is a second, separate pause for the PGs it leads again: a
/// primary behind by history is brought level inside peering (a known gap,
/// docs/RELIABILITY.md), so it is measured apart, from SIGCONT on; before,
/// one bound over both failed in CI (7.9 s: 5.8 s of hang, then 2.1 s of
/// rejoin for a write bounced back to osd.1).
#[test]
fn a_hung_osd_is_found_by_the_grace_and_rejoins() {
    let _alone = common::alone();
    let cluster = DevCluster::start();
    let client = cluster.client();
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the fault");
    let pid = pid_of(&cluster, "osd.1");
    // SAFETY: kill(2) on a process this test's cluster started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let resumed = run.wait_for_progress("after SIGSTOP of osd.1");
    let continued = run.recorder.now();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    let rejoined = run.wait_for_progress("after SIGCONT of osd.1");
    std::thread::sleep(Duration::from_secs(2));
    let (hung, rejoining) = run.longest_write_waits_around(continued);
    let report = run.finish();
    eprintln!(
        "SIGSTOP osd.1: I/O resumed after {resumed:?}, went on {rejoined:?} after SIGCONT; longest write while it hung {hung:?}, after SIGCONT {rejoining:?}; {report}"
    );
    assert!(report.is_ok(), "{report}");
    assert!(
        hung <= Duration::from_secs(7),
        "a write waited {hung:?} while osd.1 hung: more than the 6 s grace plus 1 s"
    );
    assert!(rejoining <= Duration::from_secs(10), "a write waited {rejoining:?} while osd.1 rejoined");
}

/// Issue 24: a full OSD refuses writes to its PGs at once with ENOSPC
/// ("cluster full"), not a hang and an EIO; `duplex status` says which
/// OSDs are full; deletes still work; and writes resume by themselves once
/// the OSDs are under the ratio again. The ratios are lowered to 0 so
/// that any use counts as full (a real fill takes minutes).
#[test]
fn a_full_cluster_refuses_writes_with_enospc_and_resumes_when_it_is_not() {
    let _alone = common::alone();
    let cluster = DevCluster::with_pgs(8);
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    client.write(pool, b"kept", 0, Bytes::from(vec![1u8; 4096])).unwrap();
    run_ok(cluster.cli().args(["image", "create", "thin", "--size", "64G"]));
    let thin = client.open_image(pool, "thin").unwrap();
    thin.write(0, Bytes::from(vec![7u8; 16384])).unwrap();
    drop(thin);
    // `duplex df`: one copy stored, every copy used, room, and what the thin image promises.
    // (From the OSDs' usage reports: the ones after the writes reached the
    // stores; CI under load once read a report from before them.)
    // Each OSD reports what its store holds when asked, so the copies of a
    // write one OSD flushed and the other not yet show as one stored copy:
    // wait for every copy (reads no longer flush first: issue 28).
    let reported = |df: &serde_json::Value| {
        let pool = &df["pools"][0];
        let (stored, used, size) =
            (pool["stored_bytes"].as_u64(), pool["used_bytes"].as_u64(), pool["size"].as_u64().unwrap_or(1));
        stored >= Some(4096) && pool["objects"].as_u64() >= Some(2) && used >= stored.map(|stored| stored * size)
    };
    let mut before = cli_json(&cluster, &["df"]);
    let asked = Instant::now();
    while !reported(&before) && asked.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        before = cli_json(&cluster, &["df"]);
    }
    let rbd = &before["pools"][0];
    eprintln!("df: {before}");
    let (stored, used, copies) =
        (rbd["stored_bytes"].as_u64().unwrap(), rbd["used_bytes"].as_u64().unwrap(), rbd["size"].as_u64().unwrap());
    assert!(stored >= 4096 && rbd["objects"].as_u64().unwrap() >= 2, "the object and the image's: {rbd}");
    assert!(used >= stored * copies, "every copy's blocks: {rbd}");
    assert_eq!(rbd["images"], 1);
    assert_eq!(rbd["provisioned_bytes"].as_u64(), Some(64 << 30));
    let available = rbd["available_bytes"].as_u64().unwrap();
    assert!(available > 0 && available < ((3 * 768) << 20) / copies, "{rbd}");
    assert!(rbd["overcommit"].as_f64().unwrap() > 1.0, "64 GiB promised on a 2.3 GiB cluster: {rbd}");
    assert_eq!(before["raw"]["osds_reporting"], 3);
    let osds = before["osds"].as_array().unwrap();
    assert_eq!(osds.len(), 3, "{before}");
    assert!(osds.iter().all(|o| o["partitions"] == 2 && o["fullness"] == "Normal"), "{before}");
    for key in ["nearfull_ratio", "backfillfull_ratio", "full_ratio"] {
        run_ok(cluster.cli().args(["config", "set", key, "0"]));
    }
    assert_eq!(cli_json(&cluster, &["df"])["pools"][0]["available_bytes"], 0, "nothing is available on a full cluster");
    let started = Instant::now();
    let refused = loop {
        match client.write(pool, b"more", 0, Bytes::from(vec![2u8; 4096])) {
            Err(ClientError::NoSpace(why)) => break why,
            Ok(()) if started.elapsed() < Duration::from_secs(10) => std::thread::sleep(Duration::from_millis(50)),
            other => panic!("a write to a full cluster: {other:?}"),
        }
    };
    eprintln!("full: writes refused {:?} after the ratio fell ({refused})", started.elapsed());
    let refusal = Instant::now();
    assert!(matches!(client.write(pool, b"more", 0, Bytes::from(vec![2u8; 4096])), Err(ClientError::NoSpace(_))));
    assert!(refusal.elapsed() < Duration::from_secs(1), "refused at once, not after a timeout");
    // The refusing OSD reported itself full at once (its store and the
    // room its logs hold). Once those logs are flushed it may be back
    // under the full ratio, where it takes writes again: status then says
    // backfill full. Either way it names the fullness, never HEALTH_OK
    // (CI once read it after that flush).
    let status = cli_json(&cluster, &["status"]);
    let health = &status["health"];
    // The reason names the OSDs and the pools they stop (issue 24).
    let names_fullness = health["reasons"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r.as_str().is_some_and(|r| r.contains("full") && r.contains("pools rbd"))));
    assert!((health["status"] == "HEALTH_ERR" || health["status"] == "HEALTH_WARN") && names_fullness, "{status}");
    assert!(status["health"]["reasons"].to_string().contains("full"), "{status}");
    // What frees space goes on: a discard of part of an object too (zeroed
    // in place, no space taken), and of whole objects.
    let thin = client.open_image(pool, "thin").unwrap();
    thin.write_zeroes(4096, 8192).expect("a partial discard on a full cluster");
    let mut expected = vec![7u8; 16384];
    expected[4096..12288].fill(0);
    assert_eq!(&thin.read(0, 16384).unwrap()[..], &expected[..], "zeroed in place, the rest kept");
    thin.write_zeroes(0, 8 << 20).expect("a discard of whole objects on a full cluster");
    assert!(matches!(thin.write(0, Bytes::from(vec![1u8; 4096])), Err(ClientError::NoSpace(_))));
    drop(thin);
    client.delete(pool, b"kept").unwrap();
    run_ok(cluster.cli().args(["image", "remove", "thin"]));
    for (key, value) in [("full_ratio", "0.95"), ("backfillfull_ratio", "0.9"), ("nearfull_ratio", "0.85")] {
        run_ok(cluster.cli().args(["config", "set", key, value]));
    }
    let resumed = write_once_not_full(&client, pool, b"more", Duration::from_secs(10));
    eprintln!("writes resumed {resumed:?} after the ratio rose");
    assert_eq!(&client.read(pool, b"more", 0, 4096).unwrap()[..], &[3u8; 4096][..]);
}

/// Issue 24's fill test, as a new user found the problem: small OSDs, a
/// thin image written 1 MiB at a time until the cluster refuses. The
/// refusal is ENOSPC (`NoSpace`), not a hang or EIO; `duplex status` says
/// so; every acknowledged write reads back; `image remove` frees the space
/// and writes go on; no OSD exits. It prints how full the cluster got.
#[test]
fn a_cluster_filled_to_the_brim_refuses_writes_and_recovers_when_emptied() {
    let _alone = common::alone();
    let cluster = DevCluster::with_args(&["--osd-size", "256M"]);
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    const MIB: u64 = 1 << 20;
    client.create_image(pool, "big", 2048 * MIB, CreateOptions::default()).unwrap();
    let image = client.open_image(pool, "big").unwrap();
    let chunk = |n: u64| Bytes::from((0..MIB).map(|i| (n as u8) ^ (i as u8) ^ ((i >> 8) as u8)).collect::<Vec<u8>>());
    let started = Instant::now();
    let (mut acknowledged, refusal) = fill_until_refused(&image, 2048, chunk);
    let filled = started.elapsed();
    let df = cli_json(&cluster, &["df"]);
    let (used, capacity) = (df["raw"]["used_bytes"].as_u64().unwrap(), df["raw"]["capacity_bytes"].as_u64().unwrap());
    eprintln!(
        "fill: {acknowledged} MiB acknowledged in {filled:?}, then {refusal}; raw use {:.1}% ({used} of {capacity} bytes); df: {df}",
        used as f64 * 100.0 / capacity as f64
    );
    // The OSD that refused had its store nearly full: its partitions share
    // the store's data space (before they did, one filled at 72%). How full
    // the cluster got as a whole is the placement's balance across OSDs.
    // The refusal counts the room kept for what the logs hold too, so the
    // stores show it once those entries are flushed and the usage reports
    // come in (CI under load once saw 897 per mille at the refusal itself).
    let fullest_of = |df: &serde_json::Value| {
        df["osds"].as_array().unwrap().iter().map(|osd| osd["used_permille"].as_u64().unwrap()).max()
    };
    let mut df = df;
    let flushed = Instant::now();
    while fullest_of(&df) < Some(900) && flushed.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        df = cli_json(&cluster, &["df"]);
    }
    let fullest = fullest_of(&df);
    assert!(fullest >= Some(900), "the fullest OSD refused writes at {fullest:?} per mille of its store: {df}");
    // The refusing OSD reported itself full at once (its store and the
    // room its logs hold). Once those logs are flushed it may be back
    // under the full ratio, where it takes writes again: status then says
    // backfill full. Either way it names the fullness, never HEALTH_OK
    // (CI once read it after that flush).
    let status = cli_json(&cluster, &["status"]);
    let health = &status["health"];
    // The reason names the OSDs and the pools they stop (issue 24).
    let names_fullness = health["reasons"]
        .as_array()
        .is_some_and(|r| r.iter().any(|r| r.as_str().is_some_and(|r| r.contains("full") && r.contains("pools rbd"))));
    assert!((health["status"] == "HEALTH_ERR" || health["status"] == "HEALTH_WARN") && names_fullness, "{status}");
    assert_eq!(status["osds"]["up"], 3, "no OSD exits: {status}");
    for n in 0..acknowledged {
        assert_eq!(image.read(n * MIB, MIB as u32).unwrap(), chunk(n), "acknowledged MiB {n} reads back");
    }
    // The operator's other way out: one OSD more. PGs move to it, the old
    // OSDs remove their copies of them (stray copies) once each is clean
    // there, and the full OSD takes writes again; nothing is lost on the way.
    let added = Instant::now();
    run_ok(cluster.cli().args(["dev", "add-osd", "--dir"]).arg(cluster.path()));
    // The write that was refused (its PG is on the full OSD), until it goes.
    loop {
        match image.write(acknowledged * MIB, chunk(acknowledged)) {
            Ok(()) => break,
            Err(ClientError::NoSpace(_)) if added.elapsed() < Duration::from_secs(120) => {
                std::thread::sleep(Duration::from_millis(50))
            }
            other => panic!("the refused write still fails {:?} after an OSD was added: {other:?}", added.elapsed()),
        }
    }
    acknowledged += 1;
    eprintln!("fill: the refused write went through {:?} after `dev add-osd` began", added.elapsed());
    let settled = wait_until(Duration::from_secs(120), || client.monitor().map(1).is_ok_and(|m| m.pg_temp.is_empty()));
    let df = cli_json(&cluster, &["df"]);
    eprintln!("fill: after adding osd.3 (settled: {settled}): {}", df["osds"]);
    let fullest = df["osds"].as_array().unwrap().iter().map(|osd| osd["used_permille"].as_u64().unwrap()).max();
    assert!(fullest < Some(950), "the old OSDs freed the room of the PGs that moved: {df}");
    for n in 0..acknowledged {
        assert_eq!(
            image.read(n * MIB, MIB as u32).unwrap(),
            chunk(n),
            "acknowledged MiB {n} reads back after the move"
        );
    }
    drop(image);
    run_ok(cluster.cli().args(["image", "remove", "big"]));
    let resumed = write_once_not_full(&client, pool, b"after", Duration::from_secs(20));
    eprintln!("fill: writes resumed {resumed:?} after the image was removed");
    assert_eq!(cli_json(&cluster, &["status"])["osds"]["up"], 4, "no OSD exits");
}

/// Issue 7, scenario 2: kill -9 an OSD, let the others go on without it,
/// then restart it; it must catch up before it serves or acknowledges
/// anything, and nothing acknowledged may be lost.
#[test]
fn a_killed_osd_restarts_and_catches_up() {
    let cluster = DevCluster::start();
    let client = cluster.client();
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the fault");
    kill_9(&cluster, "osd.1");
    let resumed = run.wait_for_progress("after kill -9 of osd.1");
    restart_osd(&cluster, 1);
    let rejoined = run.wait_for_progress("after osd.1 restarted");
    std::thread::sleep(Duration::from_secs(2));
    let report = run.finish();
    eprintln!(
        "kill -9 osd.1, restart: I/O resumed after {resumed:?}, went on {rejoined:?} after the restart; {report}"
    );
    assert!(report.is_ok(), "{report}");
}

/// Issue 7, scenario 6: a node loses power. The `shm` operation log, with
/// every entry not yet flushed to the store, is gone, and so is every
/// store write the device had not flushed: osd.1 runs with a simulated
/// volatile write cache and the power cut lands just before one of its
/// flushes. It comes back with empty logs, no record of the intervals it
/// was active in, and a store that misses those writes. Peering must not
/// trust it: it is backfilled from its peers before it serves, and nothing
/// acknowledged is lost.
#[test]
fn a_node_that_loses_power_is_repaired_from_its_peers() {
    let cluster = DevCluster::start();
    let trigger = with_device_faults(&cluster, 1);
    let client = cluster.client();
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the fault");
    arm_until_dead(&cluster, 1, &trigger, "power-cut");
    let log = std::fs::read_to_string(cluster.path().join("osd.1.log")).unwrap();
    let cut = log.lines().find(|l| l.contains("injected power cut")).expect("the cut came at a flush").to_string();
    let unflushed: u64 = cut
        .split("unflushed_bytes=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("the cut logs what it dropped");
    assert!(unflushed > 0, "a flush was due, so writes were waiting for it: {cut}");
    let (lost, resumed, rejoined) = back_without_its_log(&cluster, 1, &trigger, &run);
    let report = run.finish();
    eprintln!(
        "power loss of osd.1 ({lost} log files and {unflushed} bytes of unflushed device writes dropped): \
         I/O resumed after {resumed:?}, went on {rejoined:?} after it came back; {report}"
    );
    assert!(report.is_ok(), "{report}");
}

/// Issue 26: the same power loss on an erasure-coded pool (2+1, min_size
/// 2): the image's data objects are striped over the three OSDs, osd.1's
/// log and unflushed device writes are gone. The PG serves degraded from
/// the two other shards meanwhile (reads decode osd.1's data shard), and
/// when it is back every object of its shard is compared with the one
/// decoded from the others and rebuilt where it differs. The stamped-block
/// checker finds no lost write, stale read or torn stripe.
#[test]
fn a_shard_that_loses_power_is_rebuilt_from_the_others() {
    let cluster = DevCluster::start();
    run_ok(cluster.cli().args(["pool", "create", "cold", "--ec", "2+1", "--min-size", "2", "--pg-num", "16"]));
    let trigger = with_device_faults(&cluster, 1);
    let client = cluster.client();
    let cold = client.pool_id("cold").unwrap();
    let options = duplex_client::CreateOptions { data_pool: Some(cold), ..Default::default() };
    let run = Verifying::start_with(&client, "vm1", 64 * MIB, options);
    run.wait_for_progress("before the fault");
    arm_until_dead(&cluster, 1, &trigger, "power-cut");
    let (_, resumed, rejoined) = back_without_its_log(&cluster, 1, &trigger, &run);
    let report = run.finish();
    eprintln!(
        "power loss of shard osd.1: I/O resumed (degraded) after {resumed:?}, went on {rejoined:?} after it came \
         back; {report}"
    );
    assert!(report.is_ok(), "{report}");
}

/// Issue 7, scenario 8: osd.1's data device starts failing its flushes with
/// EIO (and drops what they were to make durable). The OSD must not retry
/// and trust it: it stops, the cluster serves its PGs from the replicas,
/// and once restarted on a mended device it catches up; nothing
/// acknowledged is lost.
#[test]
fn a_device_flush_error_stops_the_osd_and_the_cluster_recovers() {
    let cluster = DevCluster::start();
    let trigger = with_device_faults(&cluster, 1);
    let client = cluster.client();
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the fault");
    let stopped = arm_until_dead(&cluster, 1, &trigger, "flush-eio");
    let log = std::fs::read_to_string(cluster.path().join("osd.1.log")).unwrap();
    assert!(log.contains("the data device failed"), "osd.1 stopped because of its device");
    let resumed = run.wait_for_progress("after osd.1's device failed");
    std::fs::remove_file(&trigger).unwrap();
    restart_osd(&cluster, 1);
    let rejoined = run.wait_for_progress("after osd.1 came back on a mended device");
    std::thread::sleep(Duration::from_secs(2));
    let report = run.finish();
    eprintln!(
        "flush EIO on osd.1: it stopped {stopped:?} after the fault was armed, I/O resumed {resumed:?} later, \
         went on {rejoined:?} after it came back; {report}"
    );
    assert!(report.is_ok(), "{report}");
}

/// The store file of `osd` in a dev cluster (its `data` setting).
fn store_file(cluster: &DevCluster, osd: u32) -> std::path::PathBuf {
    let config = std::fs::read_to_string(cluster.path().join(format!("osd.{osd}.toml"))).unwrap();
    let line = config.lines().find(|l| l.starts_with("data = ")).expect("a data setting");
    std::path::PathBuf::from(line.trim_start_matches("data = ").trim_matches('"'))
}

/// Flips a byte of the 4 KiB block holding exactly `block` in `path` (as a
/// failing disk would), found by scanning: the store keeps data blocks
/// 4 KiB-aligned and verbatim.
fn corrupt_block(path: &std::path::Path, block: &[u8]) {
    use std::io::Read;
    use std::os::unix::fs::FileExt;
    assert_eq!(block.len(), 4096);
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut chunk = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = file.read(&mut chunk).unwrap();
        assert!(n > 0, "block not found in {}", path.display());
        if let Some(i) = chunk[..n].chunks_exact(4096).position(|b| b == block) {
            let offset = at + i as u64 * 4096 + 100;
            file.write_at(&[block[100] ^ 0xff], offset).unwrap();
            file.sync_all().unwrap();
            return;
        }
        at += n as u64;
    }
}

/// Issue 7, scenario 4: a block rots in one OSD's backing file. A client
/// read of it on the primary still returns the right data (the primary
/// repairs its copy from a replica); a rotten replica copy is found by a
/// deep scrub and fixed by `duplex pg repair`.
#[test]
fn a_damaged_block_is_read_repaired_and_scrub_finds_and_repairs_another() {
    let cluster = DevCluster::start();
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    let object = b"rot-target";
    // 16 blocks, each unlike any other block in the cluster.
    let data: Vec<u8> = (0..16 * 4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    client.write(pool, object, 0, Bytes::from(data.clone())).unwrap();
    std::thread::sleep(Duration::from_millis(500)); // flushed to the stores (1 ms timeout)
    let map = client.map();
    let info = &map.pools[&pool];
    let pg = duplex_placement::pg_of(object, info.pg_num);
    let acting = map.acting(&map.hierarchy(), info, pg);
    assert_eq!(acting.len(), 2, "size 2 and every OSD up");
    let (primary, replica) = (acting[0], acting[1]);

    corrupt_block(&store_file(&cluster, primary), &data[4096..8192]);
    let read = client.read(pool, object, 0, data.len() as u32).unwrap();
    assert!(read[..] == data[..], "the read returned the repaired data");
    let log = std::fs::read_to_string(cluster.path().join(format!("osd.{primary}.log"))).unwrap();
    assert!(log.contains("a read found a damaged block"), "the read met the damage (not a cached copy)");

    corrupt_block(&store_file(&cluster, replica), &data[3 * 4096..4 * 4096]);
    let pg_arg = pg.to_string();
    let scrub = run_ok(cluster.cli().args(["pg", "scrub", &pg_arg]));
    let scrub = String::from_utf8_lossy(&scrub.stdout).into_owned();
    assert!(scrub.contains(&format!("object rot-target is bad on osd.{replica}")), "{scrub}");
    assert!(scrub.contains("1 inconsistent, 0 copies repaired"), "{scrub}");
    let repair = run_ok(cluster.cli().args(["pg", "repair", &pg_arg]));
    let repair = String::from_utf8_lossy(&repair.stdout).into_owned();
    assert!(repair.contains("1 inconsistent, 1 copies repaired"), "{repair}");
    let all = run_ok(cluster.cli().args(["pg", "scrub"]));
    let all = String::from_utf8_lossy(&all.stdout).into_owned();
    assert!(all.contains("scrubbed 32 PGs") && all.contains(" 0 inconsistent"), "{all}");
    eprintln!("scrub: {}\nrepair: {}\nwhole pool: {}", scrub.trim(), repair.trim(), all.lines().last().unwrap_or(""));
    let read = client.read(pool, object, 0, data.len() as u32).unwrap();
    assert!(read[..] == data[..]);
}

/// Issue 26: a block of an erasure-coded shard rots. A client read of it
/// still returns the right bytes (the primary decodes them from the other
/// shards and has the PG repaired); a rotten parity block, which no read
/// touches, is found by a deep scrub checking every stripe's parity and
/// rebuilt by `duplex pg repair`.
#[test]
fn a_damaged_shard_block_is_decoded_around_and_scrub_finds_and_repairs_another() {
    let cluster = DevCluster::start();
    run_ok(cluster.cli().args(["pool", "create", "cold", "--ec", "2+1", "--pg-num", "8"]));
    let client = cluster.client();
    let pool = client.pool_id("cold").unwrap();
    let object = b"rot-shards";
    // 8 stripes of 2 units: unit i lands on data shard i % 2.
    let data: Vec<u8> = (0..16 * 4096u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    client.write(pool, object, 0, Bytes::from(data.clone())).unwrap();
    let map = client.map();
    let info = &map.pools[&pool];
    let pg = duplex_placement::pg_of(object, info.pg_num);
    // A member applies an entry once the next one says every shard logged
    // it (the last stays in its log until then): a write of another object
    // of the PG.
    let other = (0..).map(|i| format!("other.{i}")).find(|o| duplex_placement::pg_of(o.as_bytes(), info.pg_num) == pg);
    client.write(pool, other.unwrap().as_bytes(), 0, Bytes::from_static(b"next")).unwrap();
    std::thread::sleep(Duration::from_millis(500)); // flushed to the stores
    let acting = map.acting(&map.hierarchy(), info, pg);
    assert_eq!(acting.len(), 3, "2+1 and every OSD up");

    // Data shard 1's first unit is object bytes 4096..8192.
    corrupt_block(&store_file(&cluster, acting[1]), &data[4096..8192]);
    let read = client.read(pool, object, 0, data.len() as u32).unwrap();
    assert!(read[..] == data[..], "the read returned the data decoded around the damage");
    let log = std::fs::read_to_string(cluster.path().join(format!("osd.{}.log", acting[1]))).unwrap();
    assert!(log.contains("a shard read found a damaged block"), "the read met the damage");
    // The read asked for the PG's repair: a scrub then finds it whole.
    let pg_arg = pg.to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let scrub = run_ok(cluster.cli().args(["--pool", "cold", "pg", "scrub", &pg_arg]));
        if String::from_utf8_lossy(&scrub.stdout).contains(" 0 inconsistent") {
            break;
        }
        assert!(Instant::now() < deadline, "the damaged shard block was not repaired");
        std::thread::sleep(Duration::from_millis(500));
    }

    // The parity of stripe 3 (units 6 and 7) rots on the coding shard.
    let profile = duplex_ec::Profile::new(2, 1, 4096).unwrap();
    let parity =
        duplex_ec::Codec::new(profile).encode(&[&data[6 * 4096..7 * 4096], &data[7 * 4096..8 * 4096]]).unwrap();
    corrupt_block(&store_file(&cluster, acting[2]), &parity[0]);
    let scrub = run_ok(cluster.cli().args(["--pool", "cold", "pg", "scrub", &pg_arg]));
    let scrub = String::from_utf8_lossy(&scrub.stdout).into_owned();
    assert!(scrub.contains(&format!("object rot-shards is bad on osd.{}", acting[2])), "{scrub}");
    assert!(scrub.contains("1 inconsistent, 0 copies repaired"), "{scrub}");
    let repair = run_ok(cluster.cli().args(["--pool", "cold", "pg", "repair", &pg_arg]));
    let repair = String::from_utf8_lossy(&repair.stdout).into_owned();
    assert!(repair.contains("1 inconsistent, 1 copies repaired"), "{repair}");
    let all = run_ok(cluster.cli().args(["--pool", "cold", "pg", "scrub"]));
    let all = String::from_utf8_lossy(&all.stdout).into_owned();
    assert!(all.contains("scrubbed 8 PGs") && all.contains(" 0 inconsistent"), "{all}");
    eprintln!(
        "ec scrub: {}\nrepair: {}\nwhole pool: {}",
        scrub.trim(),
        repair.trim(),
        all.lines().last().unwrap_or("")
    );
    let read = client.read(pool, object, 0, data.len() as u32).unwrap();
    assert!(read[..] == data[..]);
}

/// Issue 7, scenario 9: add a fourth OSD under load. The PGs that map to
/// it stay served by their old OSDs while it is backfilled in the
/// background (it starts empty), then move to it; no acknowledged write is
/// lost, no read is stale, and client I/O never stops for a second.
#[test]
fn an_osd_added_under_load_is_backfilled() {
    let _alone = common::alone();
    let cluster = DevCluster::start();
    let client = cluster.client();
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before adding an OSD");
    let watch = StallWatch::start(run.counters.clone());
    let started = Instant::now();
    run_ok(cluster.cli().args(["dev", "add-osd", "--dir"]).arg(cluster.path()));
    let added = started.elapsed();
    // The moved PGs stay pinned to their old OSDs while osd.3 is filled in
    // the background; then their primaries ask for the pins to go.
    let pool_id = client.pool_id("rbd").unwrap();
    // Every PG pinned at some point (the balancer may pin others too, as it
    // evens the new OSD's bytes out).
    let mut ever_pinned = std::collections::BTreeSet::new();
    let map = loop {
        let map = client.monitor().map(1).expect("the monitor answers");
        ever_pinned.extend(map.pg_temp.keys().copied());
        if map.osds.contains_key(&3) && map.pg_temp.is_empty() && !ever_pinned.is_empty() {
            break map;
        }
        assert!(started.elapsed() < Duration::from_secs(120), "backfill did not finish: {:?}", map.pg_temp);
        std::thread::sleep(Duration::from_millis(50));
    };
    let backfilled = started.elapsed();
    run.wait_for_progress("after the backfill");
    let (longest_stall, stalls) = watch.stop();
    let pool = &map.pools[&pool_id];
    let hierarchy = map.hierarchy();
    let moved: Vec<u32> = (0..pool.pg_num).filter(|pg| map.acting(&hierarchy, pool, *pg).contains(&3)).collect();
    assert!(!moved.is_empty(), "some PGs are served by the new OSD");
    let unpinned: Vec<&u32> = moved.iter().filter(|pg| !ever_pinned.contains(&(pool_id, **pg))).collect();
    assert!(unpinned.is_empty(), "moved PGs {unpinned:?} were never pinned while backfilled (pinned: {ever_pinned:?})");
    let moved = moved.len();
    // Reads now come from osd.3 for the PGs it is primary of: the checker
    // sees every acknowledged write there.
    let report = run.finish();
    eprintln!(
        "add osd.3 under load ({moved} of {} PGs moved to it): added in {added:?}, backfilled and serving after \
         {backfilled:?}; longest time without an acknowledged write: {longest_stall:?} (over 200 ms, at and for: \
         {stalls:?}); {report}",
        pool.pg_num
    );
    assert!(report.is_ok(), "{report}");
    assert!(
        longest_stall < Duration::from_secs(1),
        "client I/O stopped for {longest_stall:?} while the new OSD was backfilled"
    );
}

/// An OSD marked out and back in still holds its old copies of the PGs
/// that come back to it: backfill compares them with the primary's and
/// sends only what differs (here nothing, as no write came in between),
/// where it used to empty them and copy everything again.
#[test]
fn an_osd_marked_back_in_is_compared_not_filled_again() {
    let cluster = DevCluster::start();
    // The claim needs placement to come back to where it was: a balancer
    // move (an upmap) between the marks would send a PG to osd.0 that it
    // never held (CI saw 3 MiB sent on the mark in, once in many runs).
    run_ok(cluster.cli().args(["config", "set", "balancer_max_spread", "0"]));
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    let objects: Vec<(String, Vec<u8>)> = (0..24u32)
        .map(|n| {
            let data = (0..MIB as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8 ^ n as u8).collect();
            (format!("kept.{n:02}"), data)
        })
        .collect();
    for (name, data) in &objects {
        // In pieces: one write must fit an OSD's PG log.
        for (piece, bytes) in data.chunks(256 << 10).enumerate() {
            let offset = (piece << 18) as u64;
            client.write(pool, name.as_bytes(), offset, Bytes::copy_from_slice(bytes)).unwrap();
        }
    }
    let sent_by_backfill = || -> u64 {
        (0..3)
            .flat_map(|osd| {
                std::fs::read_to_string(cluster.path().join(format!("osd.{osd}.log")))
                    .unwrap_or_default()
                    .lines()
                    .map(str::to_owned)
                    .collect::<Vec<_>>()
            })
            .filter(|line| line.contains("backfill complete"))
            .filter_map(|line| line.split_whitespace().find_map(|f| f.strip_prefix("bytes=")?.parse::<u64>().ok()))
            .sum()
    };
    // The mark makes one epoch, with the pins; their drops come later.
    let mark_and_settle = |how: &str| -> Duration {
        let before = client.monitor().map(1).expect("the monitor answers").epoch;
        let started = Instant::now();
        run_ok(cluster.cli().args(["mark", how, "0"]));
        loop {
            let map = client.monitor().map(1).expect("the monitor answers");
            if map.epoch >= before + 2 && map.pg_temp.is_empty() {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(120),
                "mark {how}: backfill did not end: {:?}",
                map.pg_temp
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let out_took = mark_and_settle("out");
    let sent_out = sent_by_backfill();
    let in_took = mark_and_settle("in");
    let sent_in = sent_by_backfill() - sent_out;
    eprintln!("mark out osd.0: {sent_out} bytes sent in {out_took:?}; mark in: {sent_in} bytes sent in {in_took:?}");
    assert!(sent_out >= 4 * MIB, "re-replication after the out sent its PGs' data ({sent_out} bytes)");
    assert_eq!(sent_in, 0, "osd.0's copies were equal to the primaries': nothing to send");
    for (name, data) in &objects {
        let read = client.read(pool, name.as_bytes(), 0, MIB as u32).unwrap();
        assert!(read[..] == data[..], "{name} reads back as written");
    }
}

/// Samples a workload's acknowledged writes every 10 ms, to find the
/// longest time none was acknowledged, and when the stalls over 200 ms
/// began (from the start of the watch).
struct StallWatch {
    stop: Arc<AtomicBool>,
    sampler: std::thread::JoinHandle<(Duration, Vec<(Duration, Duration)>)>,
}

impl StallWatch {
    fn start(counters: Arc<workload::Counters>) -> StallWatch {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let sampler = std::thread::spawn(move || {
            let started = Instant::now();
            let (mut last, mut since, mut longest, mut stalls) = (0, started, Duration::ZERO, Vec::new());
            let mut note = |since: Instant, longest: &mut Duration| {
                let stall = since.elapsed();
                *longest = (*longest).max(stall);
                if stall > Duration::from_millis(200) {
                    stalls.push((since - started, stall));
                }
            };
            while !flag.load(Ordering::Relaxed) {
                let now = counters.acknowledged.load(Ordering::Relaxed);
                if now != last {
                    note(since, &mut longest);
                    (last, since) = (now, Instant::now());
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            note(since, &mut longest);
            (longest, stalls)
        });
        StallWatch { stop, sampler }
    }

    /// The longest stall seen, and the long ones.
    fn stop(self) -> (Duration, Vec<(Duration, Duration)>) {
        self.stop.store(true, Ordering::Relaxed);
        self.sampler.join().expect("the sampler does not panic")
    }
}

/// Issue 7, scenario 5: with three monitors, kill -9 an OSD and, while it
/// is being detected, the monitor leader. The survivors elect a leader,
/// mark the OSD down, and I/O resumes with nothing lost.
#[test]
fn the_cluster_converges_when_the_monitor_leader_dies_during_an_osd_failure() {
    let cluster = DevCluster::with_args(&["--monitors", "3"]);
    let client = cluster.client();
    let monitors = client.monitor();
    let leader = (1..=3u64)
        .find_map(|id| monitors.status(id).ok().and_then(|(leader, _, _)| leader))
        .expect("the monitors have a leader");
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the faults");
    kill_9(&cluster, "osd.1");
    kill_9(&cluster, &format!("mon.{leader}"));
    let resumed = run.wait_for_progress("after killing osd.1 and the monitor leader");
    let survivors: Vec<u64> = (1..=3).filter(|id| *id != leader).collect();
    let new_leader = survivors.iter().find_map(|id| monitors.status(*id).ok().and_then(|(l, _, _)| l));
    assert!(new_leader.is_some_and(|l| l != leader), "the surviving monitors elected a new leader: {new_leader:?}");
    let map = survivors.iter().find_map(|id| monitors.map(*id).ok()).expect("a surviving monitor answers");
    assert!(!map.osds[&1].up, "the new leader marked osd.1 down (epoch {})", map.epoch);
    std::thread::sleep(Duration::from_secs(2));
    let report = run.finish();
    eprintln!("kill -9 osd.1 and mon.{leader}: I/O resumed after {resumed:?}; {report}");
    assert!(report.is_ok(), "{report}");
}

#[test]
fn the_cli_explains_its_errors() {
    let dir = tempfile::tempdir().unwrap();
    let output =
        common::duplex().current_dir(dir.path()).env_remove("DUPLEX_CONF").args(["image", "list"]).output().unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("duplex dev up"), "{stderr}");
    let output = common::duplex().args(["image", "create", "x", "--size", "12Q"]).output().unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("size suffix"));
    let output = common::duplex().args(["dev", "down", "--dir"]).arg(dir.path()).output().unwrap();
    assert!(output.status.success(), "down on a directory without a cluster is fine");
}

/// `dev restart --osd-set` restarts every OSD with a changed setting: the
/// data written before is read back after, and a bad key is refused
/// before any OSD stops.
#[test]
fn a_restart_changes_settings_and_keeps_data() {
    let cluster = DevCluster::with_pgs(8);
    let pool;
    {
        let client = cluster.client();
        pool = client.pool_id("rbd").unwrap();
        for n in 0..16u8 {
            client.write(pool, format!("kept.{n}").as_bytes(), 0, Bytes::from(vec![n; 4096])).unwrap();
        }
    }
    // `status --json` says the health as the text does, with the reasons.
    let status = run_ok(cluster.cli().args(["status", "--json"]));
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).expect("status --json is JSON");
    assert_eq!(status["health"]["status"], "HEALTH_OK", "{status}");
    assert_eq!(status["health"]["reasons"], serde_json::json!([]), "{status}");
    // A reader that stops reading (`duplex status | head -1`) ends the
    // command quietly, as with Unix tools: no panic, no error.
    let mut piped = cluster
        .cli()
        .arg("status")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(piped.stdout.take());
    let output = piped.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success() && !stderr.contains("panicked"), "{}: {stderr}", output.status);

    let refused = cluster
        .cli()
        .args(["dev", "restart", "--osd-set", "no_such_flag=1", "--dir"])
        .arg(cluster.path())
        .output()
        .unwrap();
    assert!(!refused.status.success(), "an unknown OSD setting must be refused");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("not valid"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );

    run_ok(
        cluster
            .cli()
            .args(["dev", "restart", "--osd-set", "write_path=sync", "--osd-set", "flush_threshold=4", "--dir"])
            .arg(cluster.path()),
    );
    for osd in 0..3 {
        let conf = std::fs::read_to_string(cluster.path().join(format!("osd.{osd}.toml"))).unwrap();
        assert!(conf.contains("write_path = \"sync\"") && conf.contains("flush_threshold = 4"), "{conf}");
    }
    let client = cluster.client();
    for n in 0..16u8 {
        assert_eq!(&client.read(pool, format!("kept.{n}").as_bytes(), 0, 4096).unwrap()[..], &vec![n; 4096][..]);
    }
    client.write(pool, b"after", 0, Bytes::from_static(b"synced")).unwrap();
    assert_eq!(&client.read(pool, b"after", 0, 6).unwrap()[..], b"synced");
    drop(client);

    // The connection policy switches the same way (issue 29), and the
    // admin socket says which one serves.
    let lcam = ["connection_policy=lcam", "priority_threads=2", "lcam_interval_ms=100"];
    let mut restart = cluster.cli();
    restart.args(["dev", "restart"]);
    for setting in lcam {
        restart.args(["--osd-set", setting]);
    }
    run_ok(restart.arg("--dir").arg(cluster.path()));
    let client = cluster.client();
    for n in 0..16u8 {
        assert_eq!(&client.read(pool, format!("kept.{n}").as_bytes(), 0, 4096).unwrap()[..], &vec![n; 4096][..]);
    }
    for n in 0..64u64 {
        client.write(pool, b"after", n * 8, Bytes::copy_from_slice(&n.to_le_bytes())).unwrap();
    }
    let socket = cluster.path().join("osd.0").join("admin.sock");
    let shown = run_ok(cluster.cli().arg("daemon").arg(&socket).args(["connections", "--json"]));
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).expect("connections --json is JSON");
    assert_eq!(shown["policy"], "lcam", "{shown}");
    assert!(shown["connections"].as_array().is_some_and(|c| !c.is_empty()), "osd.0 shares no connection: {shown}");
    let data = client.read(pool, b"after", 0, 512).unwrap();
    for n in 0..64u64 {
        assert_eq!(&data[n as usize * 8..n as usize * 8 + 8], &n.to_le_bytes(), "write {n} under lcam");
    }
}

/// Issue 7, scenarios 3 and 7: osd.1 runs on its own host (network
/// namespace B); the monitor, the other OSDs and the verifying workload run
/// on host A. A reader on host B, pinned to osd.1 (it reads only objects
/// osd.1 is primary of), keeps reading while the link between the hosts is
/// cut. osd.1 must stop serving before the monitor makes a new primary (its
/// lease runs out first), so the pinned reader never gets data older than a
/// write the new primary acknowledged; the monitor marks osd.1 down, I/O
/// goes on without it, and once the link is back osd.1 rejoins and catches
/// up. Nothing acknowledged is lost.
#[test]
fn an_isolated_host_is_marked_down_and_rejoins_and_a_reader_cut_off_with_it_reads_nothing_stale() {
    on_two_hosts(partition_scenario);
}

/// Runs `scenario` on host A of two network namespaces joined by a link it
/// can cut (host B's name, both addresses, the link); the namespaces go
/// whatever the scenario's outcome.
fn on_two_hosts(scenario: fn(&str, std::net::IpAddr, std::net::IpAddr, &common::netns::Link)) {
    let hosts = common::netns::Hosts::create();
    let (a, b, ip_a, ip_b, link) = (hosts.a.clone(), hosts.b.clone(), hosts.ip_a, hosts.ip_b, hosts.link());
    let body = std::thread::spawn(move || {
        common::netns::Hosts::enter(&a);
        scenario(&b, ip_a, ip_b, &link);
    });
    let outcome = body.join();
    drop(hosts);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

fn partition_scenario(b: &str, ip_a: std::net::IpAddr, ip_b: std::net::IpAddr, link: &common::netns::Link) {
    let cluster = DevCluster::with_args(&["--bind", &ip_a.to_string()]);
    // osd.1 moves to host B.
    run_ok(
        common::netns::Hosts::duplex_in(b)
            .args(["dev", "restart", "--osd", "1", "--osd-set", &format!("listen={ip_b}:0"), "--dir"])
            .arg(cluster.path()),
    );
    let client = cluster.client();
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the cut");

    let recorder = run.recorder.clone();
    let conf = cluster.conf();
    let stop_reader = Arc::new(AtomicBool::new(false));
    let (served, refused) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let cut_at = Arc::new(std::sync::Mutex::new(None::<Instant>));
    let served_after_cut = Arc::new(AtomicU64::new(0));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = {
        let (b, stop, served, refused, cut_at, served_after_cut) = (
            b.to_string(),
            stop_reader.clone(),
            served.clone(),
            refused.clone(),
            cut_at.clone(),
            served_after_cut.clone(),
        );
        std::thread::spawn(move || {
            common::netns::Hosts::enter(&b);
            let mut config = duplex_client::ClientConfig::from_file(&conf).unwrap();
            config.op_timeout = Duration::from_secs(2);
            let client = duplex_client::Client::connect(config).unwrap();
            let pool = client.pool_id("rbd").unwrap();
            let info = client.image_info(pool, "vm1").unwrap();
            let image = client.open_image(pool, "vm1").unwrap();
            let blocks_per_object = info.object_size as u64 / workload::BLOCK;
            // osd.1 restarted on host B under the workload: until its PGs
            // are filled and handed back, whole members may be their
            // primaries (pins). Wait for the map to make it primary again.
            let pinned_to_osd_1 = || -> Vec<u64> {
                let map = client.map();
                let pool_info = &map.pools[&pool];
                (0..info.object_count())
                    .filter(|object| {
                        let name = format!("{}.{:016x}", info.id, object);
                        let pg = duplex_placement::pg_of(name.as_bytes(), pool_info.pg_num);
                        map.acting(&map.hierarchy(), pool_info, pg).first() == Some(&1)
                    })
                    .flat_map(|object| object * blocks_per_object..(object + 1) * blocks_per_object)
                    .collect()
            };
            let waiting_since = Instant::now();
            let mut pinned = pinned_to_osd_1();
            while pinned.is_empty() && waiting_since.elapsed() < Duration::from_secs(45) {
                std::thread::sleep(Duration::from_millis(200));
                pinned = pinned_to_osd_1();
            }
            assert!(!pinned.is_empty(), "osd.1 is primary of some of the image's objects within 45 s");
            ready_tx.send(pinned.len()).unwrap();
            let mut next = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let block = pinned[next % pinned.len()];
                next = next.wrapping_add(7919);
                let ticket = recorder.invoke();
                match image.read(block * workload::BLOCK, workload::BLOCK as u32) {
                    Ok(data) => {
                        recorder.read_done(ticket, block, &data, false);
                        served.fetch_add(1, Ordering::Relaxed);
                        if cut_at.lock().unwrap().is_some() {
                            served_after_cut.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Err(_) => {
                        refused.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };
    let pinned_blocks = ready_rx.recv_timeout(Duration::from_secs(60)).expect("the pinned reader starts");
    std::thread::sleep(Duration::from_secs(1));
    assert!(served.load(Ordering::Relaxed) > 0, "the pinned reader reads through osd.1");

    let hosts_cut = Instant::now();
    *cut_at.lock().unwrap() = Some(hosts_cut);
    link.cut();
    let down_wait = wait_for_osd(&client, 1, false, "osd.1 to be marked down");
    let resumed = run.wait_for_progress("after osd.1's host was cut off");
    // Give the pinned reader time to read what the new primaries wrote.
    std::thread::sleep(Duration::from_secs(3));
    let (served_cut, refused_cut) = (served_after_cut.load(Ordering::Relaxed), refused.load(Ordering::Relaxed));

    link.heal();
    let healed = Instant::now();
    let rejoin_wait = wait_for_osd(&client, 1, true, "osd.1 to rejoin");
    let rejoined = run.wait_for_progress("after osd.1 rejoined");
    stop_reader.store(true, Ordering::Relaxed);
    reader.join().expect("the pinned reader ends");
    std::thread::sleep(Duration::from_secs(2));
    let report = run.finish();
    eprintln!(
        "host of osd.1 cut off: marked down {down_wait:?} after the cut, I/O resumed {resumed:?} after that; the \
         pinned reader ({pinned_blocks} blocks) had {served_cut} reads served after the cut and {refused_cut} \
         refused; link back: osd.1 up again {rejoin_wait:?} after it (healed at {:?} after the cut), I/O went on \
         {rejoined:?} later; {report}",
        healed - hosts_cut
    );
    assert!(refused_cut > 0, "osd.1 stopped serving the pinned reader");
    assert!(report.is_ok(), "{report}");
}

/// Two faults at once on real processes (issue 32): a pool of size 3,
/// min_size 2. osd.1's host is cut off (network namespaces, as in the
/// partition scenario) and marked down; while it is still cut off, osd.2
/// is killed with -9, so osd.0 alone holds the PGs and they take no
/// writes; osd.2 restarts and catches up, and the PGs serve again from
/// osd.0 and osd.2; then the link comes back and osd.1 rejoins. Every
/// acknowledged write reads back and no read goes back in time.
#[test]
fn an_osd_killed_while_another_is_cut_off_loses_nothing() {
    on_two_hosts(two_fault_scenario);
}

fn two_fault_scenario(b: &str, ip_a: std::net::IpAddr, ip_b: std::net::IpAddr, link: &common::netns::Link) {
    let cluster = DevCluster::with_args(&["--bind", &ip_a.to_string(), "--replicas", "3", "--min-size", "2"]);
    run_ok(
        common::netns::Hosts::duplex_in(b)
            .args(["dev", "restart", "--osd", "1", "--osd-set", &format!("listen={ip_b}:0"), "--dir"])
            .arg(cluster.path()),
    );
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    assert_eq!(client.map().pools[&pool].size, 3);
    let run = Verifying::start(&client, "vm1", 64 * MIB);
    run.wait_for_progress("before the faults");

    let cut = Instant::now();
    link.cut();
    let down_1 = wait_for_osd(&client, 1, false, "osd.1 (cut off) to be marked down");
    let resumed_2 = run.wait_for_progress("with osd.1 cut off");
    let acknowledged_before_kill = run.acknowledged();
    kill_9(&cluster, "osd.2");
    let down_2 = wait_for_osd(&client, 2, false, "osd.2 (killed) to be marked down");
    // osd.0 alone: below min_size, nothing is acknowledged meanwhile.
    let stalled_at = run.acknowledged();
    std::thread::sleep(Duration::from_secs(2));
    let while_alone = run.acknowledged() - stalled_at;
    restart_osd(&cluster, 2);
    let restarted = Instant::now();
    let resumed_after_restart = run.wait_for_progress("after osd.2 restarted, osd.1 still cut off");
    link.heal();
    let rejoin = wait_for_osd(&client, 1, true, "osd.1 to rejoin");
    let resumed_after_heal = run.wait_for_progress("after osd.1 rejoined");
    std::thread::sleep(Duration::from_secs(2));
    let report = run.finish();
    eprintln!(
        "size 3, min_size 2: osd.1 cut off, marked down after {down_1:?}, I/O went on {resumed_2:?} later; \
         kill -9 osd.2 ({acknowledged_before_kill} writes acknowledged by then), marked down after {down_2:?}; \
         {while_alone} writes acknowledged in 2 s with osd.0 alone; osd.2 restarted, I/O went on \
         {resumed_after_restart:?} later ({:?} after the cut); link healed, osd.1 up after {rejoin:?}, I/O went on \
         {resumed_after_heal:?} later; {report}",
        restarted.duration_since(cut) + resumed_after_restart,
    );
    assert_eq!(while_alone, 0, "one copy of three is below min_size: nothing may be acknowledged");
    assert!(report.is_ok(), "{report}");
    assert!(report.writes_acknowledged > 600, "{report}");
}

/// Size 2, min_size 1: osd.A alone takes a write while osd.B is down; then
/// osd.A dies and osd.B comes back. osd.B must not serve its older copy:
/// the PG is down (as `duplex status` says) until osd.A returns, and then
/// the write is there. The monitor refuses to give osd.A up unasked.
#[test]
fn a_pg_whose_last_active_osds_are_down_waits_for_them() {
    let cluster = DevCluster::with_pgs(8);
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    let object = b"last-copy";
    client.write(pool, object, 0, Bytes::from_static(b"version 1")).unwrap();
    let map = client.map();
    let info = map.pools.get(&pool).unwrap();
    let pg = duplex_placement::pg_of(object, info.pg_num);
    let acting = map.acting(&map.hierarchy(), info, pg);
    let (a, b) = (acting[0], acting[1]);

    kill_9(&cluster, &format!("osd.{b}"));
    wait_for_osd(&client, b, false, "the replica marked down");
    client.write(pool, object, 0, Bytes::from_static(b"version 2")).unwrap();
    kill_9(&cluster, &format!("osd.{a}"));
    wait_for_osd(&client, a, false, "the survivor marked down");
    restart_osd(&cluster, b);
    wait_for_osd(&client, b, true, "the stale replica back up");

    let status = String::from_utf8(run_ok(cluster.cli().arg("status")).stdout).unwrap();
    let waits = format!("{pool}.{pg:x} waits for osd.{a}");
    assert!(status.contains("down") && status.contains(&waits), "{status}");
    let mut impatient = duplex_client::ClientConfig::from_file(&cluster.conf()).unwrap();
    impatient.op_timeout = Duration::from_secs(3);
    let impatient = duplex_client::Client::connect(impatient).unwrap();
    let read = impatient.read(pool, object, 0, 9);
    assert!(matches!(read, Err(ClientError::TimedOut(..))), "the PG must wait, not serve osd.{b}'s copy: {read:?}");
    let refused = cluster.cli().args(["mark", "lost", &a.to_string()]).output().unwrap();
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && said.contains("--yes-i-really-mean-it"), "{said}");

    restart_osd(&cluster, a);
    let started = Instant::now();
    let read = client.read(pool, object, 0, 9).unwrap();
    eprintln!("osd.{a} back: the PG served again after {:?}", started.elapsed());
    assert_eq!(&read[..], b"version 2");
    let status = String::from_utf8(run_ok(cluster.cli().arg("status")).stdout).unwrap();
    assert!(!status.contains("down:"), "{status}");
}

/// Waits (up to 60 s) until the client's map has `osd` up or down; how long that took.
fn wait_for_osd(client: &duplex_client::Client, osd: u32, up: bool, what: &str) -> Duration {
    let started = Instant::now();
    while client.map().osds.get(&osd).map(|o| o.up) != Some(up) {
        assert!(started.elapsed() < Duration::from_secs(60), "waiting for {what}: still not after 60 s");
        std::thread::sleep(Duration::from_millis(20));
    }
    started.elapsed()
}

/// Issue 24: a store's partitions share its data space, so a lone OSD
/// (two partitions, one copy) takes writes until the store as a whole is
/// at the full ratio: the fill refuses at ≥ 93% raw. (With three OSDs,
/// what is left below 95% at the first refusal is the objects' balance
/// between OSDs, not between partitions: the test above.)
#[test]
fn a_lone_osd_fills_its_whole_store_before_it_refuses() {
    let _alone = common::alone();
    let cluster = DevCluster::with_args(&["--osd-size", "256M", "--osds", "1", "--replicas", "1"]);
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    const MIB: u64 = 1 << 20;
    client.create_image(pool, "big", 1024 * MIB, CreateOptions::default()).unwrap();
    let image = client.open_image(pool, "big").unwrap();
    let chunk = |n: u64| Bytes::from((0..MIB).map(|i| (n as u8) ^ (i as u8) ^ ((i >> 7) as u8)).collect::<Vec<u8>>());
    let (acknowledged, refusal) = fill_until_refused(&image, 1024, chunk);
    // The raw use once the logs' entries are flushed and reported.
    let raw_of = |df: &serde_json::Value| {
        df["raw"]["used_bytes"].as_u64().unwrap() as f64 / df["raw"]["capacity_bytes"].as_u64().unwrap() as f64
    };
    let mut df = cli_json(&cluster, &["df"]);
    let waited = Instant::now();
    while raw_of(&df) < 0.93 && waited.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(200));
        df = cli_json(&cluster, &["df"]);
    }
    eprintln!("lone fill: {acknowledged} MiB acknowledged, then {refusal}; raw use {:.1}%", raw_of(&df) * 100.0);
    assert!(raw_of(&df) >= 0.93, "refused at {:.1}% raw: {df}", raw_of(&df) * 100.0);
    for n in 0..acknowledged {
        assert_eq!(image.read(n * MIB, MIB as u32).unwrap(), chunk(n), "acknowledged MiB {n} reads back");
    }
    // A VM's disk over NBD sees the refusal as ENOSPC (errno 28), at once.
    common::require_tool("qemu-io");
    let server = cluster.serve("big", None);
    let asked = Instant::now();
    let output = std::process::Command::new("qemu-io")
        .args(["-f", "raw", "-c", &format!("write -P 0x5a {} {}", 900 * MIB, MIB)])
        .arg(&server.uri)
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(said.contains("No space left on device"), "qemu-io over NBD on a full cluster said: {said}");
    assert!(asked.elapsed() < Duration::from_secs(10), "the refusal took {:?}", asked.elapsed());
    assert_eq!(cli_json(&cluster, &["status"])["osds"]["up"], 1, "the OSD did not exit");
}

/// Issue 24: an object takes onode slots (its metadata) as well as data
/// blocks. A lone OSD with the default format (64 KiB of data a slot)
/// takes 4 KiB objects until its fullest partition's slots, with those
/// its logs may still need, reach the full ratio, then refuses with
/// "cluster full" while most of its data is free, before any flush meets
/// ENOSPC from the store; every acknowledged object reads back, and
/// deleting some lets writes go on.
#[test]
fn a_lone_osd_out_of_onode_slots_refuses_small_objects_before_a_flush_fails() {
    let _alone = common::alone();
    let cluster = DevCluster::with_args(&["--osd-size", "256M", "--osds", "1", "--replicas", "1"]);
    let client = cluster.client();
    let pool = client.pool_id("rbd").unwrap();
    let object = |n: u64| format!("small.{n:06}").into_bytes();
    let data = |n: u64| Bytes::from(vec![n as u8; 4096]);
    let started = Instant::now();
    let mut acknowledged = 0;
    let refusal = loop {
        assert!(started.elapsed() < Duration::from_secs(300), "still writing after 5 minutes");
        match client.write(pool, &object(acknowledged), 0, data(acknowledged)) {
            Ok(()) => acknowledged += 1,
            Err(err) => break err,
        }
        assert!(acknowledged < 20_000, "the OSD took {acknowledged} objects: more than its onode slots");
    };
    assert!(matches!(refusal, ClientError::NoSpace(_)), "refused with {refusal:?}, not 'cluster full'");
    let osd = common::osds(cluster.path()).pop().expect("the OSD");
    let metrics = common::scrape(osd.admin);
    let gauge = |name: &str| metrics.get(name).copied().unwrap_or_else(|| panic!("no {name} in the metrics"));
    let (onodes, data_used) =
        (gauge("duplex_osd_store_onode_permille"), gauge("duplex_osd_store_fullest_partition_permille"));
    eprintln!(
        "onode fill: {acknowledged} objects of 4 KiB acknowledged in {:?}, then {refusal}; onode slots {onodes}‰, data {data_used}‰",
        started.elapsed()
    );
    assert!(onodes >= 900.0, "refused with the onode slots at {onodes}‰");
    assert!(data_used < 300.0, "the data was {data_used}‰ used: not a refusal for the slots");
    assert_eq!(gauge("duplex_osd_flush_no_space_total"), 0.0, "a flush met ENOSPC from the store");
    // `duplex df` says why: the data is far from full, the slots are not.
    let df = cli_json(&cluster, &["df"]);
    let osd_row = &df["osds"][0];
    let (used, onode) = (osd_row["used_permille"].as_u64().unwrap(), osd_row["onode_used_permille"].as_u64().unwrap());
    assert!(used < 300 && onode >= 900, "df shows {used}‰ of the data and {onode}‰ of the onode slots used: {df}");
    for n in 0..acknowledged {
        assert_eq!(client.read(pool, &object(n), 0, 4096).unwrap(), data(n), "acknowledged object {n} reads back");
    }
    for n in 0..acknowledged / 4 {
        client.delete(pool, &object(n)).expect("a delete on a full OSD");
    }
    let waited = write_once_not_full(&client, pool, b"small.after", Duration::from_secs(30));
    eprintln!("onode fill: writes went on {waited:?} after a quarter of the objects were deleted");
    assert_eq!(cli_json(&cluster, &["status"])["osds"]["up"], 1, "the OSD did not exit");
}
