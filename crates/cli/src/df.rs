//! `duplex df`: raw and per-pool space, as an operator knows it from
//! `ceph df`.
//!
//! Every up OSD reports, per store partition, what each PG holds there
//! (`OsdUsage`: objects, their sizes, the blocks mapped to them). A pool's
//! *stored* bytes and objects are its PGs' as their acting primary holds
//! them (one copy, counted once); its *used* bytes are the blocks of every
//! copy on every OSD. *Available* is what clients can still write into the
//! pool before the first OSD reaches the `full` ratio, if new data spreads
//! by weight as placement spreads it (Ceph's MAX AVAIL), divided by the
//! pool's copies. *Provisioned* is the sum of its images' sizes: thin
//! images promise more than is there, and the over-commit says how much.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use duplex_client::Client;
use duplex_map::{ClusterMap, OsdId};
use duplex_proto::osd::UsageReply;
use duplex_proto::{Frame, MessageType};
use serde::Serialize;

use duplex_store::units::format_size;

/// How long one OSD has for all its partitions' answers.
const OSD_TIMEOUT: Duration = Duration::from_secs(5);

/// One OSD's report: its store's data capacity and each store partition's
/// use, and per PG key what it holds.
struct OsdReport {
    /// (store capacity, bytes the partition holds) of each store partition,
    /// in partition order. The partitions share the store's data space, so
    /// each reports the same capacity.
    partitions: Vec<(u64, u64)>,
    /// (onode slots, slots in use) of each store partition, in partition
    /// order (an OSD from before they were reported: none).
    onodes: Vec<(u64, u64)>,
    /// PG key → (objects, logical bytes, allocated bytes).
    pgs: HashMap<u32, (u64, u64, u64)>,
}

impl OsdReport {
    fn capacity_bytes(&self) -> u64 {
        self.partitions.iter().map(|(capacity, _)| *capacity).max().unwrap_or(0)
    }

    fn used_bytes(&self) -> u64 {
        self.partitions.iter().map(|(_, used)| used).sum()
    }

    /// The store's use, per mille.
    fn used_permille(&self) -> u64 {
        self.used_bytes() * 1000 / self.capacity_bytes().max(1)
    }

    /// The onode slots (objects' metadata) its fullest partition uses, per
    /// mille: many small objects fill them before the data.
    fn onode_permille(&self) -> u64 {
        let permille = |(slots, used): &(u64, u64)| (*slots > 0).then(|| used.min(slots) * 1000 / slots);
        self.onodes.iter().filter_map(permille).max().unwrap_or(0)
    }

    /// Bytes it can still take before its store reaches `full` (per mille).
    fn room_bytes(&self, full: u64) -> u64 {
        let limit = u128::from(self.capacity_bytes()) * u128::from(full) / 1000;
        limit.saturating_sub(u128::from(self.used_bytes())).min(u128::from(u64::MAX)) as u64
    }
}

#[derive(Debug, Default, Serialize)]
pub struct OsdUsage {
    pub id: OsdId,
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    /// The use of its fullest store partition, per mille (its fullness is judged by it).
    /// The store's use, per mille (its partitions share its data space).
    pub used_permille: u64,
    /// The onode slots its fullest partition uses, per mille (an OSD is
    /// full when these are, whatever its data).
    pub onode_used_permille: u64,
    pub partitions: usize,
    /// PGs with objects in its store.
    pub pgs: usize,
    /// As the map has it: normal, near full, backfill full, full.
    pub fullness: String,
}

#[derive(Debug, Default, Serialize)]
pub struct RawUsage {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub available_bytes: u64,
    pub osds_reporting: usize,
    pub osds_up: usize,
}

#[derive(Debug, Default, Serialize)]
pub struct PoolUsage {
    pub name: String,
    pub id: u32,
    pub size: u8,
    pub pgs: u32,
    pub objects: u64,
    /// One copy of what clients stored.
    pub stored_bytes: u64,
    /// Store blocks of every copy.
    pub used_bytes: u64,
    /// What clients can still write into the pool (after replication).
    pub available_bytes: u64,
    pub images: usize,
    /// The sum of the images' sizes.
    pub provisioned_bytes: u64,
    /// `provisioned_bytes` over what the pool could hold (stored plus
    /// available); above 1 means the thin images promise more than is there.
    pub overcommit: Option<f64>,
    /// PGs whose primary did not report (their stored bytes are missing).
    pub pgs_unreported: u32,
}

#[derive(Debug, Default, Serialize)]
pub struct Df {
    pub raw: RawUsage,
    pub osds: Vec<OsdUsage>,
    pub pools: Vec<PoolUsage>,
}

pub fn df(client: &Client, json: bool) -> Result<()> {
    let (usage, silent) = usage(client)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&usage)?);
    } else {
        print_text(&usage);
    }
    for line in &silent {
        eprintln!("warning: {line}: its copies are not counted");
    }
    Ok(())
}

/// The cluster's usage, and the OSDs that did not answer (why).
pub fn usage(client: &Client) -> Result<(Df, Vec<String>)> {
    let map = client.map();
    let mut reports = BTreeMap::new();
    let mut silent = Vec::new();
    for osd in map.osds.values().filter(|o| o.up) {
        match osd_report(client, &osd.addr) {
            Ok(report) => {
                reports.insert(osd.id, report);
            }
            Err(err) => silent.push(format!("osd.{}: {err:#}", osd.id)),
        }
    }
    let mut usage = compute(&map, &reports);
    for pool in &mut usage.pools {
        let names =
            client.list_images(pool.id).with_context(|| format!("listing the images of pool '{}'", pool.name))?;
        pool.images = names.len();
        for name in names {
            // An image removed since the listing is not counted.
            if let Ok(info) = client.image_info(pool.id, &name) {
                pool.provisioned_bytes += info.size;
            }
        }
        let could_hold = pool.stored_bytes + pool.available_bytes;
        pool.overcommit = (could_hold > 0).then(|| pool.provisioned_bytes as f64 / could_hold as f64);
    }
    Ok((usage, silent))
}

/// Raw and per-pool figures from the OSDs' reports, under `map`.
fn compute(map: &ClusterMap, reports: &BTreeMap<OsdId, OsdReport>) -> Df {
    let hierarchy = map.hierarchy();
    let raw_available = max_available_raw(map, reports);
    let raw = RawUsage {
        capacity_bytes: reports.values().map(OsdReport::capacity_bytes).sum(),
        used_bytes: reports.values().map(OsdReport::used_bytes).sum(),
        available_bytes: raw_available,
        osds_reporting: reports.len(),
        osds_up: map.osds.values().filter(|o| o.up).count(),
    };
    let osds = reports
        .iter()
        .map(|(id, report)| OsdUsage {
            id: *id,
            capacity_bytes: report.capacity_bytes(),
            used_bytes: report.used_bytes(),
            used_permille: report.used_permille(),
            onode_used_permille: report.onode_permille(),
            partitions: report.partitions.len(),
            pgs: report.pgs.keys().filter(|key| map.pools.contains_key(&duplex_osd::pg::pool_of(**key))).count(),
            fullness: map.osds.get(id).map_or("unknown".into(), |o| format!("{:?}", o.fullness)),
        })
        .collect();
    let mut pools = Vec::new();
    for pool in map.pools.values() {
        let mut usage = PoolUsage {
            name: pool.name.clone(),
            id: pool.id,
            size: pool.size,
            pgs: pool.pg_num,
            // An erasure-coded pool stores (k + m) / k bytes per byte.
            available_bytes: match pool.erasure {
                Some(code) => raw_available / u64::from(pool.size.max(1)) * u64::from(code.k),
                None => raw_available / u64::from(pool.size.max(1)),
            },
            ..PoolUsage::default()
        };
        // The primary's copy is one shard of k in an erasure-coded pool.
        let shares = pool.erasure.map_or(1, |code| u64::from(code.k));
        for pg in 0..pool.pg_num {
            let Some(key) = duplex_osd::pg::pg_key(pool.id, pg) else { continue };
            let primary = duplex_map::primary_of(&map.acting(&hierarchy, pool, pg));
            match primary.and_then(|osd| reports.get(&osd)) {
                Some(report) => {
                    let (objects, stored, _) = report.pgs.get(&key).copied().unwrap_or_default();
                    usage.objects += objects;
                    usage.stored_bytes += stored * shares;
                }
                None => usage.pgs_unreported += 1,
            }
            usage.used_bytes +=
                reports.values().filter_map(|r| r.pgs.get(&key)).map(|(_, _, allocated)| allocated).sum::<u64>();
        }
        pools.push(usage);
    }
    Df { raw, osds, pools }
}

/// Raw bytes clients can still write before the first OSD reaches the
/// `full` ratio, if new data lands on the up and in OSDs in proportion to
/// their weights (Ceph's MAX AVAIL): the tightest OSD's room over its share.
/// One the map has full has none.
fn max_available_raw(map: &ClusterMap, reports: &BTreeMap<OsdId, OsdReport>) -> u64 {
    let placed: Vec<(&OsdReport, u32, bool)> = map
        .osds
        .values()
        .filter(|o| o.up && o.is_in && o.weight > 0)
        .filter_map(|o| reports.get(&o.id).map(|r| (r, o.weight, o.fullness == duplex_map::Fullness::Full)))
        .collect();
    let total_weight: u64 = placed.iter().map(|(_, w, _)| u64::from(*w)).sum();
    if total_weight == 0 {
        return 0;
    }
    let full = u64::from(map.full_ratios.full);
    placed
        .iter()
        .map(|(report, weight, is_full)| {
            if *is_full {
                return 0;
            }
            u128::from(report.room_bytes(full)) * u128::from(total_weight) / u128::from(*weight)
        })
        .min()
        .map_or(0, |bytes| bytes.min(u128::from(u64::MAX)) as u64)
}

/// One OSD's partitions' usage replies.
fn osd_report(client: &Client, addr: &str) -> Result<OsdReport> {
    let addr = addr.parse().with_context(|| format!("bad OSD address {addr}"))?;
    let mut conn = duplex_mon_client::Connection::connect(addr, &client.config().credentials, Duration::from_secs(2))?;
    conn.set_read_timeout(Some(OSD_TIMEOUT))?;
    conn.send(&Frame::new(MessageType::OsdUsage, 1, bytes::Bytes::new()))?;
    let deadline = Instant::now() + OSD_TIMEOUT;
    let mut pgs: HashMap<u32, (u64, u64, u64)> = HashMap::new();
    let mut answered: Vec<u32> = Vec::new();
    let mut partitions: Vec<(u32, u64, u64, u64, u64)> = Vec::new();
    let mut expected = None;
    while expected.is_none_or(|n| answered.len() < n as usize) {
        if Instant::now() > deadline {
            bail!("{} of {} store partitions answered in time", answered.len(), expected.unwrap_or(0));
        }
        let frame = conn.recv()?;
        if frame.header.message_type != MessageType::OsdUsageReply as u8 {
            bail!("unexpected reply type {}", frame.header.message_type);
        }
        let reply = UsageReply::decode(&frame.payload)?;
        if expected.is_some_and(|n| n != reply.partitions) || answered.contains(&reply.partition) {
            bail!("inconsistent usage replies (partition {} of {})", reply.partition, reply.partitions);
        }
        expected = Some(reply.partitions);
        answered.push(reply.partition);
        partitions.push((
            reply.partition,
            reply.capacity_bytes,
            reply.used_bytes,
            reply.onode_slots,
            reply.used_onode_slots,
        ));
        for row in reply.pgs {
            let entry = pgs.entry(row.pg).or_default();
            entry.0 += row.objects;
            entry.1 += row.logical_bytes;
            entry.2 += row.allocated_bytes;
        }
    }
    partitions.sort_unstable();
    let onodes = partitions.iter().map(|(.., slots, used)| (*slots, *used)).collect();
    let partitions = partitions.into_iter().map(|(_, capacity, used, ..)| (capacity, used)).collect();
    Ok(OsdReport { partitions, onodes, pgs })
}

fn print_text(usage: &Df) {
    let raw = &usage.raw;
    let pct = |part: u64, whole: u64| if whole > 0 { part as f64 * 100.0 / whole as f64 } else { 0.0 };
    println!("RAW STORAGE (all copies; {} of {} up OSDs reporting)", raw.osds_reporting, raw.osds_up);
    println!(
        "  size {}   used {} ({:.1}%)   available before full {}",
        format_size(raw.capacity_bytes),
        format_size(raw.used_bytes),
        pct(raw.used_bytes, raw.capacity_bytes),
        format_size(raw.available_bytes),
    );
    println!();
    println!("OSDS");
    println!("  {:<6} {:>10} {:>10} {:>6} {:>7} {:>5} {:>13}", "OSD", "SIZE", "USED", "%USE", "%ONODE", "PGS", "STATE");
    for osd in &usage.osds {
        println!(
            "  {:<6} {:>10} {:>10} {:>5.1}% {:>6.1}% {:>5} {:>13}",
            format!("osd.{}", osd.id),
            format_size(osd.capacity_bytes),
            format_size(osd.used_bytes),
            osd.used_permille as f64 / 10.0,
            osd.onode_used_permille as f64 / 10.0,
            osd.pgs,
            osd.fullness,
        );
    }
    println!();
    println!("POOLS");
    println!(
        "  {:<12} {:>3} {:>4} {:>5} {:>8} {:>10} {:>10} {:>10} {:>6} {:>12} {:>10}",
        "NAME", "ID", "COPY", "PGS", "OBJECTS", "STORED", "USED", "AVAIL", "IMAGES", "PROVISIONED", "OVERCOMMIT"
    );
    for pool in &usage.pools {
        let overcommit = pool.overcommit.map_or("-".to_string(), |x| format!("{x:.2}x"));
        println!(
            "  {:<12} {:>3} {:>4} {:>5} {:>8} {:>10} {:>10} {:>10} {:>6} {:>12} {:>10}",
            pool.name,
            pool.id,
            pool.size,
            pool.pgs,
            pool.objects,
            format_size(pool.stored_bytes),
            format_size(pool.used_bytes),
            format_size(pool.available_bytes),
            pool.images,
            format_size(pool.provisioned_bytes),
            overcommit,
        );
        if pool.pgs_unreported > 0 {
            println!(
                "  {:<12} {} PGs' primaries did not report: STORED and OBJECTS are short",
                "", pool.pgs_unreported
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duplex_map::Pool;

    fn map_of(osds: u32, full_ratio: u16) -> ClusterMap {
        let mut map = ClusterMap::new([0; 16]);
        for id in 0..osds {
            let addr = format!("127.0.0.1:{}", 7000 + id);
            map.run(&duplex_map::Command::OsdBoot { id, addr, host: format!("h{id}"), weight: 1 << 16 }).unwrap();
        }
        map.run(&duplex_map::Command::PoolCreate { name: "rbd".into(), size: 2, min_size: 1, pg_num: 8 }).unwrap();
        map.full_ratios.full = full_ratio;
        map
    }

    fn pool(map: &ClusterMap) -> &Pool {
        map.pools.values().next().unwrap()
    }

    /// Each PG holds 1 object of 4 KiB on each of its two copies; one store partition each.
    fn reports(map: &ClusterMap, capacity: u64, used: [u64; 3]) -> BTreeMap<OsdId, OsdReport> {
        let hierarchy = map.hierarchy();
        let mut reports: BTreeMap<OsdId, OsdReport> = (0..3)
            .map(|id| {
                let report = OsdReport {
                    partitions: vec![(capacity, used[id as usize])],
                    onodes: vec![(4096, 40)],
                    pgs: HashMap::new(),
                };
                (id, report)
            })
            .collect();
        for pg in 0..pool(map).pg_num {
            let key = duplex_osd::pg::pg_key(pool(map).id, pg).unwrap();
            for osd in map.acting(&hierarchy, pool(map), pg) {
                reports.get_mut(&osd).unwrap().pgs.insert(key, (1, 4096, 4096));
            }
        }
        reports
    }

    #[test]
    fn stored_counts_one_copy_and_used_counts_every_copy() {
        let map = map_of(3, 1000);
        let usage = compute(&map, &reports(&map, 1 << 30, [0; 3]));
        let rbd = &usage.pools[0];
        assert_eq!((rbd.objects, rbd.stored_bytes, rbd.used_bytes), (8, 8 * 4096, 2 * 8 * 4096));
        assert_eq!(rbd.pgs_unreported, 0);
        // Nothing used, full at 100%: the raw room is all three OSDs, halved by two copies.
        assert_eq!(usage.raw.available_bytes, 3 << 30);
        assert_eq!(rbd.available_bytes, (3 << 30) / 2);
    }

    #[test]
    fn the_fullest_osd_bounds_what_is_available() {
        let map = map_of(3, 950);
        let capacity = 1000 << 20;
        let usage = compute(&map, &reports(&map, capacity, [0, 900 << 20, 0]));
        // osd.1 has 50 MiB before 95%; it takes a third of new data.
        assert_eq!(usage.raw.available_bytes, 3 * (50 << 20));
        assert_eq!(usage.pools[0].available_bytes, 3 * (50 << 20) / 2);
        let past_full = compute(&map, &reports(&map, capacity, [0, 990 << 20, 0]));
        assert_eq!(past_full.raw.available_bytes, 0, "an OSD past full leaves no room");
        let mut one_full = map.clone();
        one_full.run(&duplex_map::Command::SetOsdFullness { id: 2, fullness: duplex_map::Fullness::Full }).unwrap();
        let partition_full = compute(&one_full, &reports(&one_full, capacity, [0; 3]));
        assert_eq!(partition_full.raw.available_bytes, 0, "full in the map (a full partition): no room");
    }

    /// An OSD's partitions share its store's space: their use adds up
    /// against the one capacity.
    #[test]
    fn an_osds_partitions_share_its_capacity() {
        let report = OsdReport {
            partitions: vec![(1000 << 20, 100 << 20), (1000 << 20, 800 << 20)],
            onodes: vec![(4096, 4000), (4096, 1024)],
            pgs: HashMap::new(),
        };
        assert_eq!((report.capacity_bytes(), report.used_bytes()), (1000 << 20, 900 << 20));
        assert_eq!(report.used_permille(), 900);
        assert_eq!(report.onode_permille(), 976, "the fullest partition's slots");
        assert_eq!(report.room_bytes(950), 50 << 20);
        assert_eq!(report.room_bytes(900), 0);
        let map = map_of(3, 950);
        let mut reports = reports(&map, 1000 << 20, [0; 3]);
        reports.insert(1, report);
        let usage = compute(&map, &reports);
        assert_eq!(usage.raw.available_bytes, 3 * (50 << 20));
        assert_eq!(usage.osds[1].used_permille, 900);
        assert_eq!((usage.osds[1].onode_used_permille, usage.osds[0].onode_used_permille), (976, 9));
        assert_eq!(usage.osds[1].partitions, 2);
    }

    #[test]
    fn a_primary_that_did_not_report_is_named() {
        let map = map_of(3, 950);
        let mut reports = reports(&map, 1 << 30, [0; 3]);
        reports.remove(&0);
        let usage = compute(&map, &reports);
        let rbd = &usage.pools[0];
        let led_by_0 = (0..8).filter(|pg| map.acting(&map.hierarchy(), pool(&map), *pg).first() == Some(&0)).count();
        assert!(led_by_0 > 0, "osd.0 leads some PG of 8");
        assert_eq!(rbd.pgs_unreported as usize, led_by_0);
        assert_eq!(rbd.objects as usize, 8 - led_by_0);
        assert_eq!(usage.raw.osds_reporting, 2);
    }
}
