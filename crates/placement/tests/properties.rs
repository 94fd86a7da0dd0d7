//! Placement properties: deterministic, replicas on distinct hosts, out
//! OSDs skipped, balanced, minimal movement when OSDs come and go, shares
//! that follow weights.

use std::collections::HashMap;

use duplex_placement::{pg_seed, Hierarchy, HostSpec, OsdSpec};
use proptest::prelude::*;

const ONE: u32 = 1 << 16;

fn cluster(hosts: u32, osds_per_host: u32) -> Vec<HostSpec> {
    (0..hosts)
        .map(|h| HostSpec {
            id: 1000 + h,
            osds: (0..osds_per_host).map(|o| OsdSpec { id: h * osds_per_host + o, weight: ONE, is_in: true }).collect(),
        })
        .collect()
}

fn map_all(h: &Hierarchy, pgs: u32, size: usize) -> Vec<Vec<u32>> {
    (0..pgs).map(|pg| h.place(pg_seed(1, pg), size)).collect()
}

fn counts(mappings: &[Vec<u32>]) -> HashMap<u32, u64> {
    let mut counts = HashMap::new();
    for set in mappings {
        for osd in set {
            *counts.entry(*osd).or_insert(0) += 1;
        }
    }
    counts
}

/// Replicas (PG, OSD) present after but not before.
fn moved(before: &[Vec<u32>], after: &[Vec<u32>]) -> u64 {
    before.iter().zip(after).map(|(b, a)| a.iter().filter(|osd| !b.contains(osd)).count() as u64).sum()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn deterministic_distinct_and_respecting_out(hosts in 1u32..12, per_host in 1u32..6, size in 1usize..5, out_mask in any::<u64>(), seed in any::<u32>()) {
        let mut spec = cluster(hosts, per_host);
        for host in &mut spec {
            for osd in &mut host.osds {
                osd.is_in = out_mask >> (osd.id % 64) & 1 == 0 || osd.id == 0;
            }
        }
        let h = Hierarchy::new(&spec);
        let set = h.place(seed, size);
        prop_assert_eq!(&set, &h.place(seed, size), "deterministic");
        let mut reversed = spec.clone();
        reversed.reverse();
        prop_assert_eq!(&set, &Hierarchy::new(&reversed).place(seed, size), "independent of input order");
        prop_assert_eq!(set.len(), size.min(h.osd_count()));
        let host_of = |osd: u32| osd / per_host;
        let is_in = |osd: u32| spec.iter().flat_map(|h| &h.osds).any(|o| o.id == osd && o.is_in);
        prop_assert!(set.iter().all(|o| is_in(*o)), "an out OSD was chosen");
        let mut unique = set.clone();
        unique.sort_unstable();
        unique.dedup();
        prop_assert_eq!(unique.len(), set.len(), "an OSD was chosen twice");
        let hosts_with_in = spec.iter().filter(|h| h.osds.iter().any(|o| o.is_in)).count();
        let distinct_hosts = { let mut hs: Vec<u32> = set.iter().map(|o| host_of(*o)).collect(); hs.sort_unstable(); hs.dedup(); hs.len() };
        prop_assert_eq!(distinct_hosts, set.len().min(hosts_with_in), "replicas not spread over hosts");
    }
}

#[test]
fn equal_weights_balance_within_ten_percent() {
    // 8 hosts x 4 OSDs, about 1,000 PG replicas per OSD.
    let h = Hierarchy::new(&cluster(8, 4));
    let mappings = map_all(&h, 32 * 1000 / 3, 3);
    let counts = counts(&mappings);
    let mean = counts.values().sum::<u64>() as f64 / counts.len() as f64;
    for (osd, count) in &counts {
        let ratio = *count as f64 / mean;
        assert!((0.9..=1.1).contains(&ratio), "OSD {osd} holds {count} replicas, mean {mean:.0}");
    }
    assert_eq!(counts.len(), 32);
}

#[test]
fn adding_an_osd_moves_little_more_than_its_share() {
    for (hosts, per_host) in [(6, 4), (10, 2), (4, 8)] {
        let before_spec = cluster(hosts, per_host);
        let pgs = 20_000;
        let before = map_all(&Hierarchy::new(&before_spec), pgs, 3);
        // A new OSD in an existing host, and a new host with one OSD.
        let mut in_host = before_spec.clone();
        in_host[0].osds.push(OsdSpec { id: 9999, weight: ONE, is_in: true });
        let mut new_host = before_spec.clone();
        new_host.push(HostSpec { id: 5000, osds: vec![OsdSpec { id: 9999, weight: ONE, is_in: true }] });
        for after_spec in [in_host, new_host] {
            let after = map_all(&Hierarchy::new(&after_spec), pgs, 3);
            let total = (pgs * 3) as f64;
            let ideal = total / (hosts * per_host + 1) as f64;
            let moved = moved(&before, &after) as f64;
            assert!(moved <= 1.5 * ideal, "{hosts}x{per_host}: moved {moved} replicas, ideal {ideal:.0}");
        }
    }
}

#[test]
fn removing_an_osd_moves_only_about_what_it_held() {
    let spec = cluster(6, 4);
    let pgs = 20_000;
    let before = map_all(&Hierarchy::new(&spec), pgs, 3);
    let mut out = spec.clone();
    out[2].osds[1].is_in = false;
    let gone = out[2].osds[1].id;
    let after = map_all(&Hierarchy::new(&out), pgs, 3);
    let held = before.iter().filter(|s| s.contains(&gone)).count() as f64;
    let moved = moved(&before, &after) as f64;
    assert!(moved >= held, "every replica it held must move");
    assert!(moved <= 1.5 * held, "moved {moved} replicas, it held {held}");
}

#[test]
fn an_osds_share_follows_its_weight() {
    let mut spec = cluster(6, 4);
    spec[0].osds[0].weight = 2 * ONE;
    spec[0].osds[1].weight = ONE / 2;
    let counts = counts(&map_all(&Hierarchy::new(&spec), 30_000, 3));
    let base: f64 = (4..24).map(|o| counts[&o] as f64).sum::<f64>() / 20.0;
    let double = counts[&0] as f64 / base;
    let half = counts[&1] as f64 / base;
    assert!((1.8..=2.2).contains(&double), "weight 2 holds {double:.2}x");
    assert!((0.42..=0.58).contains(&half), "weight 0.5 holds {half:.2}x");
}

/// `place_indep` with `out` OSDs marked out.
fn indep_with_out(hosts: u32, per_host: u32, out: &[u32], seed: u32, size: usize) -> Vec<Option<u32>> {
    let mut spec = cluster(hosts, per_host);
    for osd in spec.iter_mut().flat_map(|h| &mut h.osds) {
        osd.is_in = !out.contains(&osd.id);
    }
    Hierarchy::new(&spec).place_indep(seed, size)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    /// Erasure-coded positions: deterministic, one shard a host, every
    /// position filled while enough hosts have an in OSD, no out OSD.
    #[test]
    fn indep_positions_are_distinct_hosts_and_full_when_hosts_allow(hosts in 1u32..10, per_host in 1u32..4, size in 1usize..7, out_mask in any::<u64>(), seed in any::<u32>()) {
        let out: Vec<u32> = (0..hosts * per_host).filter(|id| out_mask >> (id % 64) & 1 == 1 && *id != 0).collect();
        let set = indep_with_out(hosts, per_host, &out, seed, size);
        prop_assert_eq!(&set, &indep_with_out(hosts, per_host, &out, seed, size), "deterministic");
        prop_assert_eq!(set.len(), size);
        prop_assert!(set.iter().flatten().all(|osd| !out.contains(osd)), "an out OSD was chosen: {:?}", set);
        let mut host_ids: Vec<u32> = set.iter().flatten().map(|osd| osd / per_host).collect();
        host_ids.sort_unstable();
        let placed = host_ids.len();
        host_ids.dedup();
        prop_assert_eq!(host_ids.len(), placed, "two shards on one host: {:?}", set);
        let usable_hosts = (0..hosts).filter(|h| (0..per_host).any(|o| !out.contains(&(h * per_host + o)))).count();
        prop_assert_eq!(placed, size.min(usable_hosts), "positions left empty: {:?}", set);
    }

    /// An OSD marked out moves only the positions it held: every other
    /// shard stays where it is (with `place`, every later one would shift).
    #[test]
    fn indep_out_moves_only_the_positions_of_that_osd(hosts in 4u32..12, per_host in 1u32..4, size in 2usize..6, seed in any::<u32>(), victim_pick in any::<u32>()) {
        prop_assume!((size as u32) < hosts);
        let before = indep_with_out(hosts, per_host, &[], seed, size);
        let held: Vec<u32> = before.iter().flatten().copied().collect();
        let victim = held[victim_pick as usize % held.len()];
        let after = indep_with_out(hosts, per_host, &[victim], seed, size);
        for (position, (b, a)) in before.iter().zip(&after).enumerate() {
            if *b == Some(victim) {
                prop_assert!(a.is_some() && *a != Some(victim), "position {} not refilled: {:?} -> {:?}", position, before, after);
            } else {
                prop_assert_eq!(b, a, "position {} moved: {:?} -> {:?}", position, before, after);
            }
        }
    }
}

#[test]
fn indep_positions_balance_and_a_new_host_takes_only_its_share() {
    let h = Hierarchy::new(&cluster(8, 2));
    let sets: Vec<Vec<Option<u32>>> = (0..4000).map(|pg| h.place_indep(pg_seed(2, pg), 3)).collect();
    let mut counts: HashMap<u32, u64> = HashMap::new();
    for osd in sets.iter().flatten().flatten() {
        *counts.entry(*osd).or_insert(0) += 1;
    }
    let mean = counts.values().sum::<u64>() as f64 / counts.len() as f64;
    assert_eq!(counts.len(), 16);
    for (osd, count) in &counts {
        let ratio = *count as f64 / mean;
        assert!((0.85..=1.15).contains(&ratio), "osd.{osd} holds {count} shards, mean {mean:.0}");
    }
    // A ninth host should take about 1/9 of the shards, and nothing else moves.
    let grown = Hierarchy::new(&cluster(9, 2));
    let after: Vec<Vec<Option<u32>>> = (0..4000).map(|pg| grown.place_indep(pg_seed(2, pg), 3)).collect();
    let moved = sets.iter().zip(&after).flat_map(|(b, a)| b.iter().zip(a)).filter(|(b, a)| b != a).count();
    let onto_new = after.iter().flatten().flatten().filter(|osd| **osd >= 16).count();
    assert!(moved as f64 <= onto_new as f64 * 1.25, "{moved} positions moved for {onto_new} taken by the new host");
    let share = onto_new as f64 / (4000.0 * 3.0);
    assert!((0.08..=0.14).contains(&share), "the new host took {share:.3} of the shards");
}

/// A change here moves every shard of every erasure-coded pool.
#[test]
fn indep_placement_is_pinned() {
    let h = Hierarchy::new(&cluster(5, 2));
    assert_eq!(h.place_indep(pg_seed(1, 7), 4), vec![Some(5), Some(0), Some(8), Some(7)]);
}
