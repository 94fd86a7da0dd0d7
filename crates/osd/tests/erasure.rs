//! An erasure-coded pool (2+1, 4 KiB stripe unit) on three OSD processes:
//! partial and whole-stripe writes, zeros, truncations and deletes against
//! a model, and every stripe's parity checked against its data shards as
//! each OSD holds them.

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
