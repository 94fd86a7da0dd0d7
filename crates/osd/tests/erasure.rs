//! An erasure-coded pool (2+1, 4 KiB stripe unit) on three OSD processes:
//! partial and whole-stripe writes, zeros, truncations and deletes against
//! a model, and every stripe's parity checked against its data shards as
//! each OSD holds them; kill -9 of each OSD in turn while partial
//! overwrites are in flight, the PG settling its shards when it is back
//! (entries fewer than k logged rolled back, shards that missed entries
//! rebuilt), with no acknowledged write lost and no torn stripe; a shard
//! down (the PG serving degraded), back (rebuilt), an OSD joining under
//! load (shards pinned to their holders) and one marked out (its shards
//! rebuilt whole on the OSDs that take its positions).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use duplex_client::ClientError;
use duplex_ec::{Codec, Layout, Profile};
use duplex_map::{Command, ErasureCode};
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};
use duplex_proto::MessageType;
use rand::{Rng, SeedableRng};

const UNIT: u64 = 4096;
const WIDTH: u64 = 2 * UNIT;

/// Object → bytes; an erasure-coded object reads as zeros past its end.
#[derive(Default)]
struct Model(HashMap<Vec<u8>, Vec<u8>>);

impl Model {
    fn bytes(&mut self, object: &[u8]) -> &mut Vec<u8> {
        self.0.entry(object.to_vec()).or_default()
    }

    fn write(&mut self, object: &[u8], offset: u64, data: &[u8]) {
        let bytes = self.bytes(object);
        let end = offset as usize + data.len();
        if bytes.len() < end {
            bytes.resize(end, 0);
        }
        bytes[offset as usize..end].copy_from_slice(data);
    }

    fn read(&self, object: &[u8], offset: u64, len: u32) -> Option<Vec<u8>> {
        let bytes = self.0.get(object)?;
        let mut out = vec![0; len as usize];
        let start = (offset as usize).min(bytes.len());
        let end = (offset as usize + len as usize).min(bytes.len());
        out[..end - start].copy_from_slice(&bytes[start..end]);
        Some(out)
    }
}

fn create_ec_pool(cluster: &TestCluster) -> u32 {
    let code = ErasureCode { k: 2, m: 1, stripe_unit: UNIT as u32 };
    cluster
        .mon_client()
        .command(&Command::PoolCreateErasure { name: "cold".into(), code, min_size: None, pg_num: 8 })
        .unwrap();
    let mut client = cluster.client();
    client.refresh_map();
    client.pool_id("cold").unwrap()
}

fn check(client: &mut duplex_client::ObjectClient, pool: u32, model: &Model, object: &[u8], offset: u64, len: u32) {
    match (model.read(object, offset, len), client.read(pool, object, offset, len)) {
        (Some(expected), Ok(data)) => {
            assert!(data.as_ref() == &expected[..], "{:?} @{offset}+{len} differs", String::from_utf8_lossy(object))
        }
        (None, Err(ClientError::NotFound)) => {}
        (expected, got) => panic!(
            "{:?} @{offset}+{len}: model {:?}, cluster {got:?}",
            String::from_utf8_lossy(object),
            expected.map(|e| e.len())
        ),
    }
}

/// Each member's shard of `object`, read from its OSD as the primary would.
fn shards(cluster: &TestCluster, pool: u32, object: &[u8], len: u64) -> Vec<Vec<u8>> {
    let client = cluster.client();
    let map = client.map().clone();
    let info = &map.pools[&pool];
    let pg = duplex_placement::pg_of(object, info.pg_num);
    let acting = map.acting(&map.hierarchy(), info, pg);
    acting
        .iter()
        .map(|osd| {
            let addr = map.osds[osd].addr.parse().unwrap();
            let mut conn =
                duplex_mon_client::Connection::connect(addr, client.credentials(), Duration::from_secs(2)).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let request = OpRequest {
                kind: OpKind::ShardRead,
                pool,
                pg,
                map_epoch: map.epoch,
                object: Bytes::copy_from_slice(object),
                offset: 0,
                length: len as u32,
                data: Bytes::new(),
                client: 0,
                snap: 0,
            };
            conn.send(&request.to_frame(7)).unwrap();
            let frame = conn.recv().unwrap();
            assert_eq!(frame.header.message_type, MessageType::OsdOpReply as u8);
            let reply = OpReply::decode(&frame.payload).unwrap();
            let mut data = match reply.status {
                Status::Ok => reply.data.to_vec(),
                Status::NotFound => Vec::new(),
                other => panic!("osd.{osd} answered a shard read with {other:?}: {:?}", reply.message()),
            };
            data.resize(len as usize, 0);
            data
        })
        .collect()
}

#[test]
fn an_erasure_coded_pool_matches_a_model_and_every_stripe_its_parity() {
    // Entries stay in the logs a while, so shard reads meet both the log and the store.
    let cluster = TestCluster::new(3, 8, &["--flush-timeout-us", "200000"]);
    cluster.wait_all_up();
    let pool = create_ec_pool(&cluster);
    let mut client = cluster.client();
    let mut model = Model::default();
    let mut rng = rand::rngs::StdRng::seed_from_u64(26);
    let objects: Vec<Vec<u8>> = (0..10).map(|i| format!("ec.{i}").into_bytes()).collect();
    let span = 40 * WIDTH;
    // The PGs go active once peered: the first write may wait for that.
    client.write(pool, &objects[0], 0, b"first").unwrap();
    model.write(&objects[0], 0, b"first");
    for round in 0..500 {
        let object = &objects[rng.gen_range(0..objects.len())];
        match rng.gen_range(0..12) {
            0..=3 => {
                // 4 KiB at a unit: one data shard and the parity.
                let offset = rng.gen_range(0..span / UNIT) * UNIT;
                let data: Vec<u8> = (0..UNIT).map(|_| rng.gen()).collect();
                client.write(pool, object, offset, &data).unwrap();
                model.write(object, offset, &data);
            }
            4..=5 => {
                // Anywhere, any length: partial stripes at both ends.
                let offset = rng.gen_range(0..span);
                let len = rng.gen_range(1..30_000usize);
                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                client.write(pool, object, offset, &data).unwrap();
                model.write(object, offset, &data);
            }
            6 => {
                // Whole stripes: nothing read.
                let offset = rng.gen_range(0..span / WIDTH) * WIDTH;
                let data: Vec<u8> = (0..WIDTH * rng.gen_range(1..5)).map(|_| rng.gen()).collect();
                client.write(pool, object, offset, &data).unwrap();
                model.write(object, offset, &data);
            }
            7 => {
                let whole = rng.gen_bool(0.5);
                let (offset, len) = if whole {
                    (rng.gen_range(0..span / WIDTH) * WIDTH, WIDTH * rng.gen_range(1..3))
                } else {
                    (rng.gen_range(0..span), rng.gen_range(1..20_000u64))
                };
                client.zero(pool, object, offset, len).unwrap();
                if !whole {
                    // Part of a stripe: a write of zeros (which creates the object).
                    model.write(object, offset, &vec![0; len as usize]);
                } else if model.0.contains_key(object.as_slice()) {
                    // Whole stripes: zeroed where the object has bytes; absent stays absent.
                    let known = model.bytes(object).len() as u64;
                    let end = (offset + len).min(known);
                    if offset < end {
                        model.write(object, offset, &vec![0; (end - offset) as usize]);
                    }
                }
            }
            8 if round % 4 == 0 => {
                let size = rng.gen_range(0..span / WIDTH) * WIDTH;
                client.truncate(pool, object, size).unwrap();
                model.bytes(object).resize(size as usize, 0);
            }
            9 if round % 6 == 0 => {
                client.delete(pool, object).unwrap();
                model.0.remove(object.as_slice());
            }
            _ => {
                let offset = rng.gen_range(0..span);
                let len = rng.gen_range(1..40_000u32);
                check(&mut client, pool, &model, object, offset, len);
            }
        }
        if round % 125 == 124 {
            std::thread::sleep(Duration::from_millis(300));
        }
    }
    // An unaligned truncation is refused, not torn.
    let refused = client.truncate(pool, &objects[0], 100);
    assert!(matches!(refused, Err(ClientError::Invalid(ref why)) if why.contains("whole stripes")), "{refused:?}");

    let profile = Profile::new(2, 1, UNIT).unwrap();
    let layout = Layout::new(&profile);
    let mut codec = Codec::new(profile);
    for object in &objects {
        check(&mut client, pool, &model, object, 0, span as u32 + 8192);
        let shard_len = layout.shard_size(span + 8192);
        let held = shards(&cluster, pool, object, shard_len);
        let parity = codec.encode(&[&held[0], &held[1]]).unwrap();
        assert!(parity[0] == held[2], "{:?}: parity differs from its data shards", String::from_utf8_lossy(object));
    }
    assert!(cluster.metric_sum("duplex_osd_replica_entries_total") > 0.0, "no shard entry went to a member");
}

#[test]
fn kill_9_of_a_shard_during_partial_overwrites_loses_no_acknowledged_write_and_tears_no_stripe() {
    let mut cluster = TestCluster::new(3, 8, &["--flush-timeout-us", "200000"]);
    cluster.wait_all_up();
    let pool = create_ec_pool(&cluster);
    let objects: Vec<Vec<u8>> = (0..12).map(|i| format!("kill.{i}").into_bytes()).collect();
    let span = 16 * WIDTH;
    let model = std::sync::Arc::new(std::sync::Mutex::new(Model::default()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut client = cluster.client();
    for object in &objects {
        client.write(pool, object, 0, &[1; 8192]).unwrap();
        model.lock().unwrap().write(object, 0, &[1; 8192]);
    }
    // Two writers, each with objects of its own (`start_writers`).
    let writers = start_writers(&cluster, pool, &objects, span, &model, &stop, &written);
    for victim in [2u32, 0, 1] {
        let before = written.load(std::sync::atomic::Ordering::Relaxed);
        while written.load(std::sync::atomic::Ordering::Relaxed) < before + 150 {
            std::thread::sleep(Duration::from_millis(20));
        }
        cluster.kill_osd(victim);
        std::thread::sleep(Duration::from_millis(500));
        cluster.start_osd(victim);
        cluster.wait_all_up();
    }
    let before = written.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while written.load(std::sync::atomic::Ordering::Relaxed) < before + 100 {
        assert!(std::time::Instant::now() < deadline, "writes did not resume after the last restart");
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let given_up: Vec<Vec<u8>> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    assert!(given_up.len() < objects.len() / 2, "most writes failed: {given_up:?}");
    let model = model.lock().unwrap();
    let mut client = cluster.client();
    let profile = Profile::new(2, 1, UNIT).unwrap();
    let layout = Layout::new(&profile);
    let mut codec = Codec::new(profile);
    for object in objects.iter().filter(|o| !given_up.contains(o)) {
        check(&mut client, pool, &model, object, 0, span as u32);
        let held = shards(&cluster, pool, object, layout.shard_size(span));
        let parity = codec.encode(&[&held[0], &held[1]]).unwrap();
        if parity[0] != held[2] {
            let torn: Vec<usize> = (0..held[2].len() / UNIT as usize)
                .filter(|s| {
                    let r = s * UNIT as usize..(s + 1) * UNIT as usize;
                    parity[0][r.clone()] != held[2][r]
                })
                .collect();
            let map = cluster.client().map().clone();
            let info = &map.pools[&pool];
            let pg = duplex_placement::pg_of(object, info.pg_num);
            panic!(
                "{:?} (PG {pg}, on {:?}): a torn stripe (parity differs from its data) in stripes {torn:?}",
                String::from_utf8_lossy(object),
                map.acting(&map.hierarchy(), info, pg)
            );
        }
    }
}

/// Writers over `objects`, each one's own, until `stop`: every write
/// acknowledged is in the model; one that failed takes its object out of
/// the check (its bytes may or may not have landed). Returns those.
fn start_writers(
    cluster: &TestCluster,
    pool: u32,
    objects: &[Vec<u8>],
    span: u64,
    model: &std::sync::Arc<std::sync::Mutex<Model>>,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    written: &std::sync::Arc<std::sync::atomic::AtomicU64>,
) -> Vec<std::thread::JoinHandle<Vec<Vec<u8>>>> {
    (0..2)
        .map(|w| {
            let (model, stop, written) = (model.clone(), stop.clone(), written.clone());
            let mine: Vec<Vec<u8>> = objects.iter().skip(w).step_by(2).cloned().collect();
            let mut client = cluster.client();
            std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(300 + w as u64);
                let mut round = 0usize;
                let mut given_up: Vec<Vec<u8>> = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let object = &mine[round % mine.len()];
                    round += 1;
                    if given_up.contains(object) {
                        continue;
                    }
                    // Partial units, whole units and whole stripes.
                    let offset = rng.gen_range(0..span / UNIT) * UNIT + rng.gen_range(0..2) * 1000;
                    let len = [UNIT as usize, 1500, WIDTH as usize][rng.gen_range(0..3)];
                    let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                    match client.write(pool, object, offset, &data) {
                        Ok(()) => {
                            model.lock().unwrap().write(object, offset, &data);
                            written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(err) => {
                            eprintln!("a write failed ({err}); its object leaves the check");
                            given_up.push(object.clone());
                        }
                    }
                    // Reads of the writer's own objects, against the model.
                    if round.is_multiple_of(5) {
                        let (at, len) = (rng.gen_range(0..span), rng.gen_range(1..3 * WIDTH as u32));
                        let expected = model.lock().unwrap().read(object, at, len);
                        match client.read(pool, object, at, len) {
                            Ok(data) => assert!(
                                expected.as_deref() == Some(data.as_ref()),
                                "{:?} @{at}+{len}: a stale or torn read",
                                String::from_utf8_lossy(object)
                            ),
                            Err(err) => eprintln!("a read failed ({err})"),
                        }
                    }
                }
                given_up
            })
        })
        .collect()
}

fn wait_for_writes(written: &std::sync::atomic::AtomicU64, more: u64, what: &str) {
    let before = written.load(std::sync::atomic::Ordering::Relaxed);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while written.load(std::sync::atomic::Ordering::Relaxed) < before + more {
        assert!(std::time::Instant::now() < deadline, "writes did not go on {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every object not given up reads as the model, and each stripe's parity
/// is the code of its data shards as the PG's members now hold them.
fn check_all(cluster: &TestCluster, pool: u32, model: &Model, objects: &[Vec<u8>], span: u64, k: usize, m: usize) {
    let mut client = cluster.client();
    let profile = Profile::new(k as u32, m as u32, UNIT).unwrap();
    let layout = Layout::new(&profile);
    let mut codec = Codec::new(profile);
    let map = client.map().clone();
    for object in objects {
        check(&mut client, pool, model, object, 0, span as u32 + 8192);
        let pg = duplex_placement::pg_of(object, map.pools[&pool].pg_num);
        if map.acting(&map.hierarchy(), &map.pools[&pool], pg).contains(&duplex_map::NO_OSD) {
            continue; // degraded: its parity is checked where every shard is
        }
        let held = shards(cluster, pool, object, layout.shard_size(span + 8192));
        let data: Vec<&[u8]> = held[..k].iter().map(Vec::as_slice).collect();
        let parity = codec.encode(&data).unwrap();
        assert!(
            parity[..] == held[k..],
            "{:?}: a torn stripe (parity differs from its data)",
            String::from_utf8_lossy(object)
        );
    }
}

#[test]
fn a_pg_with_a_shard_down_serves_degraded_and_the_shard_is_rebuilt_when_it_returns_or_moves() {
    // 2+1 with min_size 2 (an operator's choice: the default, k+1, stops
    // the PG with one shard down), on three OSDs; a fourth joins later.
    let mut cluster = TestCluster::new(3, 8, &["--flush-timeout-us", "200000"]);
    cluster.wait_all_up();
    let code = ErasureCode { k: 2, m: 1, stripe_unit: UNIT as u32 };
    let command = Command::PoolCreateErasure { name: "cold".into(), code, min_size: Some(2), pg_num: 8 };
    cluster.mon_client().command(&command).unwrap();
    let mut client = cluster.client();
    client.refresh_map();
    let pool = client.pool_id("cold").unwrap();
    let objects: Vec<Vec<u8>> = (0..12).map(|i| format!("deg.{i}").into_bytes()).collect();
    let span = 16 * WIDTH;
    let model = std::sync::Arc::new(std::sync::Mutex::new(Model::default()));
    for object in &objects {
        let data: Vec<u8> = (0..span).map(|i| (i % 251) as u8).collect();
        client.write(pool, object, 0, &data).unwrap();
        model.lock().unwrap().write(object, 0, &data);
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writers = start_writers(&cluster, pool, &objects, span, &model, &stop, &written);
    wait_for_writes(&written, 100, "at first");
    // osd.1 dies and the map says so: every PG has a hole, and serves.
    cluster.kill_osd(1);
    cluster.mon_client().command(&Command::MarkDown { id: 1 }).unwrap();
    wait_for_writes(&written, 300, "with a shard down");
    let degraded = cluster.metric_sum("duplex_osd_ec_degraded_total{op=\"read\"}")
        + cluster.metric_sum("duplex_osd_ec_degraded_total{op=\"write\"}");
    assert!(degraded > 0.0, "no operation decoded around the missing shard");
    // Back: it missed writes, and its shards are rebuilt before it serves.
    cluster.start_osd(1);
    cluster.wait_all_up();
    wait_for_writes(&written, 200, "after the shard came back");
    // A fourth OSD joins under load: placement moves positions to it, and
    // the map pins each shard to the OSD that holds it (I/O goes on).
    cluster.start_osd(3);
    wait_until_up(&cluster, 3);
    wait_for_writes(&written, 200, "after an OSD joined");
    // osd.0 dies and is marked out: its positions go to placement's OSDs,
    // whose shards are rebuilt whole from the others.
    cluster.kill_osd(0);
    cluster.mon_client().command(&Command::MarkDown { id: 0 }).unwrap();
    cluster.mon_client().command(&Command::MarkOut { id: 0 }).unwrap();
    wait_for_writes(&written, 300, "after an OSD was marked out");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let given_up: Vec<Vec<u8>> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    assert!(given_up.len() < objects.len() / 2, "most writes failed: {given_up:?}");
    let kept: Vec<Vec<u8>> = objects.iter().filter(|o| !given_up.contains(o)).cloned().collect();
    let mut client = cluster.client();
    client.refresh_map();
    let map = client.map().clone();
    let rebuilt = (0..8).filter(|pg| map.acting(&map.hierarchy(), &map.pools[&pool], *pg).contains(&3)).count();
    assert!(rebuilt > 0, "no shard was rebuilt on the new OSD");
    check_all(&cluster, pool, &model.lock().unwrap(), &kept, span, 2, 1);
}

fn wait_until_up(cluster: &TestCluster, osd: u32) {
    let mut client = cluster.client();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !client.map().is_up(osd) {
        assert!(std::time::Instant::now() < deadline, "osd.{osd} did not come up in the map");
        std::thread::sleep(Duration::from_millis(100));
        client.refresh_map();
    }
}
