//! Connection policies (issue 29): under `lcam` and `naive` several
//! priority threads serve one connection, reading batches of it in turn
//! and running them at once. Writes to one PG must still take effect in
//! the order they arrived on their connection (`io/order.rs`), at the
//! primary and, over the primary's replication connection, at the replica;
//! replies must still leave in request order. With the tickets switched
//! off (every request let run at once) both policies' tests fail within a
//! run: a read sees a value older than the write before it.
//!
//! Under `--threading lalca` (issue 30) an eventual PG's operations run
//! on the thread that owns the PG at the time, forwarded there from the
//! thread serving their connection: the same checks hold.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::TestCluster;
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};

/// Connections pipelining at once, each on a thread of its own.
const CONNECTIONS: u64 = 2;
/// Under lalca: more connections than threads, so that connections served
/// by different threads write to the same PGs (the OSD gives connections
/// out in turn).
const LALCA_CONNECTIONS: u64 = 4;
/// Requests each sends before it reads a reply (past the OSD's in-flight
/// limit, so reading pauses and resumes too); every fifth is a read.
const BATCH: u64 = 600;
const ROUNDS: u64 = 20;
/// 8-byte slots per object per connection: each round writes every slot
/// of every object several times, so a reordered pair of writes to one
/// slot shows as a stale last value.
const SLOTS: u64 = 8;

/// Where write `txid` of connection `conn` goes: its object (by index) and
/// the offset of its slot there (each connection has a region of its own).
fn place(conn: u64, txid: u64, objects: usize) -> (usize, u64) {
    let object = txid as usize % objects;
    let slot = (txid / objects as u64) % SLOTS;
    (object, (conn * SLOTS + slot) * 8)
}

fn pipelined_writes_keep_their_order_per_pg(policy: &str) {
    let lalca = policy == "lalca";
    let connections = if lalca { LALCA_CONNECTIONS } else { CONNECTIONS };
    let mut cluster = if lalca {
        // Small logs: writes wait for log room too, parked with (or
        // without) their claims on the PG, and forwarded ones at the owner.
        let cluster =
            TestCluster::new(3, 8, &["--threading", "lalca", "--priority-threads", "2", "--oplog-pg-bytes", "16384"]);
        let create = duplex_map::Command::PoolCreateEventual {
            name: "scratch".into(),
            size: 2,
            min_size: 1,
            pg_num: 8,
            eventual: duplex_map::Eventual { max_lag_ms: 1000 },
        };
        cluster.mon_client().command(&create).unwrap();
        cluster
    } else {
        TestCluster::new(3, 8, &["--connection-policy", policy, "--priority-threads", "4", "--lcam-interval-ms", "40"])
    };
    cluster.wait_all_up();
    let mut client = cluster.client();
    let pool = if lalca { client.pool_id("scratch").unwrap() } else { cluster.pool(&client) };
    let map = client.map().clone();
    let info = map.pools[&pool].clone();
    let hierarchy = map.hierarchy();
    // Objects whose PGs one OSD leads (the one leading most), one per PG:
    // every connection goes to it, and its replication streams carry the
    // same interleaving on.
    let leader = (0..3u32)
        .max_by_key(|osd| (0..info.pg_num).filter(|pg| map.acting(&hierarchy, &info, *pg)[0] == *osd).count())
        .unwrap();
    let mut pgs_seen = Vec::new();
    let objects: Vec<(Vec<u8>, u32)> = (0..4000)
        .map(|i| format!("order.{i}").into_bytes())
        .filter_map(|name| {
            let pg = duplex_placement::pg_of(&name, info.pg_num);
            (map.acting(&hierarchy, &info, pg)[0] == leader && !pgs_seen.contains(&pg)).then(|| {
                pgs_seen.push(pg);
                (name, pg)
            })
        })
        .take(3)
        .collect();
    assert!(objects.len() >= 2, "too few PGs led by osd.{leader}: {objects:?}");
    // Through the client first (it retries while the PGs peer): the raw
    // requests below expect active PGs.
    for (name, _) in &objects {
        client.write(pool, name, 0, &vec![0; (connections * SLOTS * 8) as usize]).unwrap();
    }
    let addr = client.addr_of(leader).unwrap();
    let epoch = map.epoch;
    let senders: Vec<_> = (0..connections)
        .map(|conn| {
            let objects = objects.clone();
            std::thread::spawn(move || {
                let mut link = duplex_mon_client::Connection::connect(
                    addr,
                    &duplex_testkit::credentials(&format!("client.order{conn}")),
                    Duration::from_secs(10),
                )
                .unwrap();
                let mut last = std::collections::HashMap::new();
                let mut checked = 0;
                for round in 0..ROUNDS {
                    let first = round * BATCH + 1;
                    // Every fifth request reads the slot it would have
                    // written: it must see the write before it on this
                    // connection (same PG, so same lane) or a later one,
                    // never an older one.
                    let mut reads = std::collections::HashMap::new();
                    for txid in first..first + BATCH {
                        let (object, offset) = place(conn, txid, objects.len());
                        let (name, pg) = &objects[object];
                        let read = txid % 5 == 0;
                        let request = OpRequest {
                            kind: if read { OpKind::Read } else { OpKind::Write },
                            pool,
                            pg: *pg,
                            map_epoch: epoch,
                            object: Bytes::from(name.clone()),
                            offset,
                            length: 8,
                            data: if read { Bytes::new() } else { Bytes::copy_from_slice(&txid.to_le_bytes()) },
                            client: 0,
                            snap: 0,
                        };
                        link.send(&request.to_frame(txid)).unwrap();
                        if read {
                            reads.insert(txid, last.get(&(object, offset)).copied().unwrap_or(0u64));
                        } else {
                            last.insert((object, offset), txid);
                        }
                    }
                    for txid in first..first + BATCH {
                        let frame = link.recv().unwrap();
                        assert_eq!(frame.header.transaction_id, txid, "replies leave in request order");
                        let reply = OpReply::decode(&frame.payload).unwrap();
                        let read = reads.get(&txid);
                        // A read of an object with a write not yet on every
                        // replica is answered Retry (the client resends).
                        if read.is_some() && reply.status == Status::Retry {
                            continue;
                        }
                        assert_eq!(reply.status, Status::Ok, "request {txid}: {}", reply.message());
                        if let Some(expected) = read {
                            checked += 1;
                            // A write sent after the read may already show
                            // (the two were in flight together); one sent
                            // before it must.
                            let seen = u64::from_le_bytes(reply.data[..].try_into().expect("8 bytes read"));
                            assert!(
                                seen >= *expected && (seen == 0 || place(conn, seen, objects.len()) == place(conn, txid, objects.len())),
                                "read {txid} (connection {conn}) saw {seen}, older than the write before it ({expected})"
                            );
                        }
                    }
                }
                assert!(checked >= 20, "connection {conn}: only {checked} reads came back Ok: the test checked little");
                last
            })
        })
        .collect();
    let mut expected = std::collections::HashMap::new();
    for sender in senders {
        expected.extend(sender.join().expect("a pipelining connection failed"));
    }
    assert_eq!(expected.len() as u64, connections * SLOTS * objects.len() as u64);
    let check = |client: &mut duplex_client::ObjectClient, whose: &str| {
        for ((object, offset), txid) in &expected {
            let data = client.read(pool, &objects[*object].0, *offset, 8).unwrap();
            assert_eq!(
                u64::from_le_bytes(data[..].try_into().unwrap()),
                *txid,
                "{policy}, {whose}: the last write to object {object} at {offset} did not win"
            );
        }
    };
    check(&mut client, "the primary");
    if policy == "lcam" {
        assert!(
            cluster.metric_sum("duplex_osd_lcam_decisions_total{decision=\"add\"}") > 0.0,
            "no connection gained a thread: the test tested pinned"
        );
    } else if policy == "naive" {
        assert!(cluster.metric_sum("duplex_osd_connection_workers_max") >= 4.0, "naive: every thread on each");
    } else if lalca {
        let forwarded = cluster.metric_sum("duplex_osd_lalca_ops_total{ran=\"forwarded\"}");
        let received = cluster.metric_sum("duplex_osd_lalca_ops_total{ran=\"received\"}");
        assert!(forwarded > 0.0 && received > 0.0, "lalca: {forwarded} forwarded, {received} run where received");
        let waited = cluster.metric_sum("duplex_osd_backpressure_waits_total");
        assert!(waited > 0.0, "lalca: no write waited for log room: the small logs tested nothing");
    }
    // Requests did come to run before earlier ones of their PG (batches of
    // one connection ran at once on two threads) and waited: what the
    // tickets are for. Under pinned they never do.
    let waits = cluster.metric_sum("duplex_osd_order_waits_total");
    if policy == "pinned" || lalca {
        assert_eq!(waits, 0.0);
    } else {
        assert!(waits > 0.0, "{policy}: no request ever waited for an earlier one: the test tested little");
    }
    // The replicas applied the replication stream (itself shared by the
    // replica's threads) in order too: with the primary gone, they serve.
    // (An eventual pool's replicas first catch up: its acknowledged writes
    // of the last max_lag may go with the primary.)
    if lalca {
        cluster.wait_replicated(3);
    }
    cluster.kill_osd(leader);
    cluster.mon_client().command(&duplex_map::Command::MarkDown { id: leader }).unwrap();
    let mut client = cluster.client();
    check(&mut client, "the replicas");
}

#[test]
fn lcam_keeps_each_pgs_writes_in_connection_order_at_primary_and_replica() {
    pipelined_writes_keep_their_order_per_pg("lcam");
}

#[test]
fn naive_keeps_each_pgs_writes_in_connection_order_at_primary_and_replica() {
    pipelined_writes_keep_their_order_per_pg("naive");
}

/// The same load under `pinned`: what the checks above expect holds where
/// one thread serves each connection (so a failure there is the policy's).
#[test]
fn pinned_passes_the_same_checks() {
    pipelined_writes_keep_their_order_per_pg("pinned");
}

/// An eventual pool under `--threading lalca`: two threads, four
/// connections, so operations of one PG arrive on both threads and one
/// forwards them to the other.
#[test]
fn lalca_keeps_each_pgs_writes_in_connection_order_at_primary_and_replica() {
    pipelined_writes_keep_their_order_per_pg("lalca");
}
