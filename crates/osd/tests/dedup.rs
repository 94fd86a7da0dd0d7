//! The deduplication tier through real OSD processes (issue 27,
//! docs/DEDUP.md): objects of a deduplicated pool are cut into chunks by
//! their primaries' agents, equal chunks meet in one chunk object, cold
//! chunks are evicted from their objects, and every read still returns
//! what was written: through the chunk pool, after a partial overwrite
//! (the chunk promoted back first), and from a new primary.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::TestCluster;
use duplex_client::{Client, ClientConfig};
use duplex_dedup::ChunkEntry;
use duplex_map::{ChunkStore, Command, Compression};

const CHUNK: usize = 32 << 10;

/// Pool `vms` deduplicated into `chunks` in CHUNK-byte fixed chunks.
fn vms_tier() -> Command {
    Command::PoolSetTier {
        name: "vms".into(),
        chunk_pool: "chunks".into(),
        chunk_size: CHUNK as u32,
        chunking: duplex_map::Chunking::Fixed,
    }
}

fn connect(cluster: &TestCluster) -> Client {
    let mut config = ClientConfig::new(cluster.monitors(), duplex_testkit::credentials("client.test"));
    config.op_timeout = Duration::from_secs(60);
    Client::connect(config).unwrap()
}

/// A 32 KiB chunk of its own bytes (compressible: a pattern of `seed`).
fn chunk(seed: u8) -> Vec<u8> {
    (0..CHUNK).map(|i| seed.wrapping_mul(31).wrapping_add((i / 64) as u8)).collect()
}

/// The chunk map of `object`: offset → entry.
fn chunk_map(client: &Client, pool: u32, object: &[u8]) -> BTreeMap<u64, ChunkEntry> {
    let reply = client.tier_read(pool, object, 0, 4 << 20).unwrap();
    reply
        .entries
        .iter()
        .map(|(k, v)| {
            (duplex_dedup::chunkmap::entry_offset(k).unwrap(), ChunkEntry::decode(v).expect("a well-formed entry"))
        })
        .collect()
}

/// Waits until every non-zero chunk of every object is evicted.
fn wait_evicted(client: &Client, pool: u32, objects: &BTreeMap<Vec<u8>, Vec<u8>>) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = objects.iter().all(|(name, data)| {
            let map = chunk_map(client, pool, name);
            let wanted = data.chunks(CHUNK).filter(|c| c.iter().any(|b| *b != 0)).count();
            map.len() == wanted && map.values().all(|e| !e.cached)
        });
        if done {
            return;
        }
        assert!(Instant::now() < deadline, "the engine did not deduplicate and evict every object within 60 s");
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn check_reads(client: &Client, pool: u32, objects: &BTreeMap<Vec<u8>, Vec<u8>>) {
    for (name, data) in objects {
        let read = client.read(pool, name, 0, 4 << 20).unwrap();
        assert!(read[..] == data[..], "{} reads back other bytes", String::from_utf8_lossy(name));
        // A read of a piece inside one evicted chunk, and one across two.
        let piece = client.read(pool, name, 1000, 100).unwrap();
        assert!(piece[..] == data[1000..1100]);
        let across = client.read(pool, name, CHUNK as u64 - 10, 20).unwrap();
        assert!(across[..] == data[CHUNK - 10..CHUNK + 10]);
    }
}

#[test]
fn objects_are_deduplicated_evicted_and_read_back_whole() {
    let mut cluster = TestCluster::new(3, 8, &["--dedup-cold-s", "0"]);
    cluster.wait_all_up();
    let mut mon = cluster.mon_client();
    let store = ChunkStore { compression: Compression::Lz4, min_saving_permille: 125 };
    mon.command(&Command::PoolCreateChunks { name: "chunks".into(), size: 2, min_size: 1, pg_num: 8, store }).unwrap();
    mon.command(&Command::PoolCreate { name: "vms".into(), size: 2, min_size: 1, pg_num: 8 }).unwrap();
    mon.command(&vms_tier()).unwrap();
    let client = connect(&cluster);
    let (vms, chunks) = (client.pool_id("vms").unwrap(), client.pool_id("chunks").unwrap());

    // Three objects of 8 chunks: a..d twice; a..h; d, zeros, d and a tail.
    let mut objects: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    objects.insert(b"vm1.0".to_vec(), [0, 1, 2, 3, 0, 1, 2, 3].iter().flat_map(|s| chunk(*s)).collect());
    objects.insert(b"vm2.0".to_vec(), (0..8).flat_map(chunk).collect());
    let mut third: Vec<u8> = [chunk(3), vec![0; CHUNK], chunk(3)].concat();
    third.extend_from_slice(&chunk(9)[..5000]);
    objects.insert(b"vm3.0".to_vec(), third);
    for (name, data) in &objects {
        client.write(vms, name, 0, Bytes::from(data.clone())).unwrap();
    }
    check_reads(&client, vms, &objects);
    wait_evicted(&client, vms, &objects);

    // Equal chunks met: one chunk object per distinct non-zero chunk.
    let distinct: BTreeSet<Vec<u8>> = objects
        .values()
        .flat_map(|data| data.chunks(CHUNK).map(<[u8]>::to_vec).collect::<Vec<_>>())
        .filter(|c| c.iter().any(|b| *b != 0))
        .collect();
    let names = client.list_objects(chunks, b"").unwrap();
    assert_eq!(names.len(), distinct.len(), "one chunk object per distinct chunk");
    let expected: BTreeSet<Vec<u8>> =
        distinct.iter().map(|c| duplex_dedup::Fingerprint::of(c).object_name().into_bytes()).collect();
    assert_eq!(names.into_iter().collect::<BTreeSet<_>>(), expected);
    // Compressed there (the patterns shrink), and gone from the objects.
    let stored: u64 = expected.iter().map(|name| client.stat(chunks, name).unwrap().size).sum();
    assert!(stored < (distinct.len() * CHUNK) as u64 / 2, "chunks stored in {stored} bytes: not compressed");
    for name in objects.keys() {
        let stat = client.stat(vms, name).unwrap();
        assert!(
            stat.allocated_bytes < CHUNK as u64,
            "{} keeps {} bytes",
            String::from_utf8_lossy(name),
            stat.allocated_bytes
        );
    }
    check_reads(&client, vms, &objects);

    // The tier scrub removes references no chunk map names (a leak on a
    // chunk others use, and one on a chunk nobody else does, which goes
    // with it), and keeps every one an entry names.
    let leak = |nonce: u64| {
        duplex_dedup::Reference { pool: vms, offset: 0, nonce, object: b"vm1.0".to_vec() }.encode().unwrap()
    };
    let shared_name = duplex_dedup::Fingerprint::of(&chunk(0)).object_name();
    let sealed = |c: &[u8]| duplex_dedup::frame::seal(c, Compression::None, 0);
    client.chunk_put(chunks, shared_name.as_bytes(), &leak(7), &sealed(&chunk(0))).unwrap();
    let lonely = chunk(42);
    let lonely_name = duplex_dedup::Fingerprint::of(&lonely).object_name();
    client.chunk_put(chunks, lonely_name.as_bytes(), &leak(8), &sealed(&lonely)).unwrap();
    let report = duplex_client::tier::scrub(&client, vms, true).unwrap();
    assert_eq!((report.leaks_removed, report.leaks_busy), (2, 0), "{report:?}");
    assert!(report.missing.is_empty() && report.damaged.is_empty(), "{report:?}");
    assert!(matches!(client.stat(chunks, lonely_name.as_bytes()), Err(duplex_client::ClientError::NotFound)));
    assert!(client.stat(chunks, shared_name.as_bytes()).is_ok(), "a chunk entries name stays");
    let again = duplex_client::tier::scrub(&client, vms, false).unwrap();
    assert_eq!((again.leaks_removed, again.references, again.entries), (0, report.entries, report.entries));
    check_reads(&client, vms, &objects);

    // A partial overwrite of an evicted chunk: promoted first, then written.
    let patch = vec![0xEEu8; 4096];
    client.write(vms, b"vm1.0", 40_000, Bytes::from(patch.clone())).unwrap();
    objects.get_mut(&b"vm1.0"[..]).unwrap()[40_000..44_096].copy_from_slice(&patch);
    check_reads(&client, vms, &objects);
    wait_evicted(&client, vms, &objects);
    check_reads(&client, vms, &objects);
    assert!(cluster.metric_sum("duplex_osd_dedup_promotions_total") >= 1.0);

    // A new primary loads its index from its store and serves the same.
    let map = client.map();
    let pg = duplex_placement::pg_of(b"vm1.0", 8);
    let primary = map.acting(&map.hierarchy(), &map.pools[&vms], pg)[0];
    cluster.kill_osd(primary);
    mon.command(&Command::MarkDown { id: primary }).unwrap();
    let client = connect(&cluster);
    check_reads(&client, vms, &objects);
}

/// The engine's OSD is killed (-9) while writers change deduplicated
/// objects and the agents pass over them: no acknowledged write is lost,
/// every chunk map entry still names its chunk, and the tier scrub finds
/// only leaked references (which it removes), then nothing.
#[test]
fn a_killed_engine_loses_no_write_and_leaks_only_what_the_scrub_reclaims() {
    let mut cluster = TestCluster::new(3, 8, &["--dedup-cold-s", "0"]);
    cluster.wait_all_up();
    let mut mon = cluster.mon_client();
    let store = ChunkStore { compression: Compression::Zstd(1), min_saving_permille: 125 };
    mon.command(&Command::PoolCreateChunks { name: "chunks".into(), size: 2, min_size: 1, pg_num: 8, store }).unwrap();
    mon.command(&Command::PoolCreate { name: "vms".into(), size: 2, min_size: 1, pg_num: 8 }).unwrap();
    mon.command(&vms_tier()).unwrap();
    let client = connect(&cluster);
    let vms = client.pool_id("vms").unwrap();
    const OBJECTS: usize = 6;
    const SIZE: usize = 8 * CHUNK;
    let names: Vec<Vec<u8>> = (0..OBJECTS).map(|i| format!("img.{i}").into_bytes()).collect();
    let mut model: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
    for (i, name) in names.iter().enumerate() {
        let data: Vec<u8> = (0..8).flat_map(|c| chunk(((i + c) % 5) as u8)).collect();
        client.write(vms, name, 0, Bytes::from(data.clone())).unwrap();
        model.insert(name.clone(), data);
    }
    let victim = {
        let map = client.map();
        map.acting(&map.hierarchy(), &map.pools[&vms], duplex_placement::pg_of(&names[0], 8))[0]
    };
    // Writers change chunks (some back to earlier contents: duplicates),
    // while the agents pass; the primary of img.0's PG dies in the middle.
    let mut rng = 0x2545_F491_4F6C_DD1Du64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let started = Instant::now();
    let mut killed = false;
    let mut writes = 0;
    while started.elapsed() < Duration::from_secs(12) {
        let object = &names[next() as usize % OBJECTS];
        let offset = (next() as usize % (SIZE / 4096)) * 4096;
        let fill = chunk((next() % 5) as u8)[..4096].to_vec();
        client.write(vms, object, offset as u64, Bytes::from(fill.clone())).unwrap();
        model.get_mut(object).unwrap()[offset..offset + 4096].copy_from_slice(&fill);
        writes += 1;
        if !killed && started.elapsed() > Duration::from_secs(3) {
            cluster.kill_osd(victim);
            mon.command(&Command::MarkDown { id: victim }).unwrap();
            killed = true;
        }
        if writes % 50 == 0 {
            std::thread::sleep(Duration::from_millis(100)); // let passes in
        }
    }
    cluster.start_osd(victim);
    cluster.wait_all_up();
    for (name, data) in &model {
        let read = client.read(vms, name, 0, SIZE as u32).unwrap();
        assert!(read[..] == data[..], "{} lost an acknowledged write", String::from_utf8_lossy(name));
    }
    wait_evicted(&client, vms, &model);
    let first = duplex_client::tier::scrub(&client, vms, true).unwrap();
    assert!(first.missing.is_empty() && first.damaged.is_empty(), "{first:?}");
    assert!(first.entries > 0);
    let second = duplex_client::tier::scrub(&client, vms, true).unwrap();
    assert_eq!((second.leaks_removed, second.leaks_busy), (0, 0), "the first scrub left leaks: {second:?}");
    assert_eq!(second.references, second.entries, "every reference is an entry's, and every entry has one");
    check_reads(&client, vms, &model);
    eprintln!("{writes} writes; first scrub: {first:?}");
}
