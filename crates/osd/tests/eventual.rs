//! Issue 30: an eventual pool on three OSD processes (size 2). A write is
//! acknowledged from its primary's log and readable at once; its replica
//! follows in the background. A replica's kill -9 loses nothing; so does a
//! primary's once its replicas caught up (the lag is the only window).

mod common;

use std::collections::HashMap;

use common::TestCluster;
use duplex_client::ObjectClient;
use duplex_map::{Command, Eventual};
use rand::{Rng, SeedableRng};

const POOL: &str = "scratch";

fn eventual_cluster(max_lag_ms: u32) -> TestCluster {
    // Entries stay in the logs: a restart replays them, a read finds them there.
    let cluster = TestCluster::new(3, 16, &["--flush-timeout-us", "30000000", "--flush-threshold", "100000"]);
    let create = Command::PoolCreateEventual {
        name: POOL.into(),
        size: 2,
        min_size: 1,
        pg_num: 16,
        eventual: Eventual { max_lag_ms },
    };
    cluster.mon_client().command(&create).unwrap();
    cluster.wait_all_up();
    cluster
}

fn pool_of(client: &ObjectClient) -> u32 {
    client.pool_id(POOL).unwrap()
}

/// Objects of `pool` whose PG has `osd` as its primary (`primary`), or
/// else as its replica; and the primary they share (the most common one,
/// for a replica's).
fn objects_where(client: &ObjectClient, pool: u32, osd: u32, primary: bool) -> (Vec<Vec<u8>>, u32) {
    let map = client.map().clone();
    let hierarchy = map.hierarchy();
    let info = map.pools[&pool].clone();
    assert!(info.is_eventual());
    let mut by_primary: HashMap<u32, Vec<Vec<u8>>> = HashMap::new();
    for i in 0..4000 {
        let name = format!("scratch.{i}").into_bytes();
        let acting = map.acting(&hierarchy, &info, duplex_placement::pg_of(&name, info.pg_num));
        let role = if primary { acting.first() == Some(&osd) } else { acting.get(1) == Some(&osd) };
        if role {
            by_primary.entry(acting[0]).or_default().push(name);
        }
    }
    let (lead, mut objects) = by_primary.into_iter().max_by_key(|(_, o)| o.len()).expect("some PG has that role");
    objects.truncate(30);
    assert!(objects.len() >= 10, "too few objects with osd.{osd} in that role");
    (objects, lead)
}

/// Random 4 KiB writes; each read right after its write must see it (the
/// primary serves what it acknowledged). Returns object → bytes.
fn burst(client: &mut ObjectClient, pool: u32, objects: &[Vec<u8>], seed: u64) -> HashMap<Vec<u8>, Vec<u8>> {
    let mut model: HashMap<Vec<u8>, Vec<u8>> = HashMap::new();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for round in 0..300 {
        let object = &objects[round % objects.len()];
        let offset = rng.gen_range(0..8u64) * 4096;
        let data: Vec<u8> = (0..4096).map(|_| rng.gen()).collect();
        client.write(pool, object, offset, &data).unwrap();
        let bytes = model.entry(object.clone()).or_default();
        if bytes.len() < offset as usize + 4096 {
            bytes.resize(offset as usize + 4096, 0);
        }
        bytes[offset as usize..offset as usize + 4096].copy_from_slice(&data);
        let back = client.read(pool, object, offset, 4096).unwrap();
        assert_eq!(&back[..], &data[..], "read-your-writes at the primary, round {round}");
    }
    model
}

fn check_all(client: &mut ObjectClient, pool: u32, model: &HashMap<Vec<u8>, Vec<u8>>, when: &str) {
    for (object, bytes) in model {
        let got = client.read(pool, object, 0, bytes.len() as u32).unwrap();
        assert!(got[..] == bytes[..], "{when}: {:?} differs", String::from_utf8_lossy(object));
    }
}

#[test]
fn a_replica_killed_under_an_eventual_pool_loses_nothing() {
    let mut cluster = eventual_cluster(1000);
    let mut client = cluster.client();
    let pool = pool_of(&client);
    let victim = 1u32;
    let (objects, other) = objects_where(&client, pool, victim, false);
    let model = burst(&mut client, pool, &objects, 1);
    let early = cluster.metric_sum("duplex_osd_eventual_writes_total{ack=\"logged\"}");
    // (The first write to each PG waits for its replicas: none was heard from yet.)
    assert!(early >= 250.0, "{early} of 300 writes acknowledged once logged at the primary");
    // No wait: some entries may still be on their way to the replica.
    cluster.kill_osd(victim);
    cluster.start_osd(victim);
    cluster.wait_all_up();
    let mut client = cluster.client();
    check_all(&mut client, pool, &model, "from the primary after its replica's restart");
    // Peering brought the restarted replica level with the primary: it
    // holds every acknowledged write when the primary goes.
    cluster.wait_replicated(3);
    cluster.kill_osd(other);
    cluster.mon_client().command(&Command::MarkDown { id: other }).unwrap();
    let mut client = cluster.client();
    check_all(&mut client, pool, &model, "from the restarted replica, its primary gone");
}

#[test]
fn a_primary_killed_after_its_replicas_caught_up_loses_nothing() {
    let mut cluster = eventual_cluster(500);
    let mut client = cluster.client();
    let pool = pool_of(&client);
    let victim = 1u32;
    let (objects, _) = objects_where(&client, pool, victim, true);
    let model = burst(&mut client, pool, &objects, 2);
    // The lag is the whole window: once it is zero, a failover loses nothing.
    cluster.wait_replicated(3);
    // A quiet burst never lagged 500 ms: only each PG's first write waited
    // for its replicas (none was heard from yet in its interval).
    let waited = cluster.metric_sum("duplex_osd_eventual_writes_total{ack=\"replicated\"}");
    assert!(waited <= 16.0, "{waited} writes waited for their replicas");
    cluster.kill_osd(victim);
    cluster.mon_client().command(&Command::MarkDown { id: victim }).unwrap();
    let mut client = cluster.client();
    check_all(&mut client, pool, &model, "from the replicas, the primary gone");
    // It comes back and is recovered to the survivors' state.
    cluster.start_osd(victim);
    cluster.wait_all_up();
    let mut client = cluster.client();
    check_all(&mut client, pool, &model, "after the old primary came back");
}
