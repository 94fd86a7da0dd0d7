//! Upmap items: exceptions to placement, per PG (Ceph's `pg_upmap_items`).
//!
//! Placement (straw2 over the hierarchy) spreads PGs by weight, which
//! evens out *PG counts* over many PGs; it knows nothing of how many bytes
//! each PG holds. On a small cluster, or one whose images are written
//! unevenly, one OSD fills while another has room. The balancer
//! ([`crate::balancer`]) then moves single PGs: an item `(from, to)` says
//! "where placement names `from` for this PG, use `to`". Items apply all
//! at once, position by position, to placement's own list, so a PG's items
//! are simply the positions where the wanted set differs from placement's.
//!
//! An item whose `to` is out (or gone) is ignored, and so are all of a
//! PG's items if applying them would name an OSD twice: the PG falls back
//! to placement, which is always a valid set. A change of items moves PGs
//! like any other placement change: the monitor pins the PG to the OSDs
//! that hold it while the new ones are backfilled ([`crate::pg_temp`]).

use std::collections::BTreeSet;

use crate::{ClusterMap, OsdId, PoolId};

/// A PG's upmap items: `(from, to)`, an OSD placement names and the one used instead.
pub type Items = Vec<(OsdId, OsdId)>;

/// Applies a PG's `items` to `osds` (placement's list for it), in place.
pub fn apply(map: &ClusterMap, items: &[(OsdId, OsdId)], osds: &mut Vec<OsdId>) {
    let usable = |osd: &OsdId| map.osds.get(osd).is_some_and(|info| info.is_in);
    let mapped: Vec<OsdId> = osds
        .iter()
        .map(|osd| items.iter().find(|(from, to)| from == osd && usable(to)).map_or(*osd, |(_, to)| *to))
        .collect();
    let distinct = mapped.iter().collect::<BTreeSet<_>>().len() == mapped.len();
    if distinct {
        *osds = mapped;
    }
}

/// The items that take a PG from placement's `placed` to `wanted` (as long,
/// distinct): one per position where they differ.
pub fn items_for(placed: &[OsdId], wanted: &[OsdId]) -> Vec<(OsdId, OsdId)> {
    debug_assert_eq!(placed.len(), wanted.len(), "a wanted set of another size");
    placed.iter().zip(wanted).filter(|(p, w)| p != w).map(|(p, w)| (*p, *w)).collect()
}

/// Whether `items` can be a PG's at all: the PG exists, every OSD is known,
/// no OSD maps to itself, and no OSD is named twice as a source or as a
/// target (what a decoded map must hold; the balancer's commands are
/// checked further by [`may_set`]).
pub fn items_are_valid(map: &ClusterMap, (pool, pg): (PoolId, u32), items: &[(OsdId, OsdId)]) -> bool {
    let Some(info) = map.pools.get(&pool) else { return false };
    let froms: BTreeSet<OsdId> = items.iter().map(|(from, _)| *from).collect();
    let tos: BTreeSet<OsdId> = items.iter().map(|(_, to)| *to).collect();
    pg < info.pg_num
        && !items.is_empty()
        && items.len() <= info.size as usize
        && froms.len() == items.len()
        && tos.len() == items.len()
        && items.iter().all(|(from, to)| from != to && map.osds.contains_key(from) && map.osds.contains_key(to))
}

/// Whether the monitor takes `items` for PG `(pool, pg)` now: valid, every
/// target in, each source one placement names, and the resulting set
/// spread over no fewer hosts than placement's (a move never puts two
/// copies on one host that placement kept apart).
pub fn may_set(map: &ClusterMap, pg: (PoolId, u32), items: &[(OsdId, OsdId)]) -> Result<(), String> {
    may_set_placed(map, &map.hierarchy(), pg, items)
}

/// [`may_set`] with the map's placement hierarchy at hand (the balancer
/// asks for many PGs in one look; compiling it each time was the cost).
pub fn may_set_placed(
    map: &ClusterMap,
    hierarchy: &duplex_placement::Hierarchy,
    (pool, pg): (PoolId, u32),
    items: &[(OsdId, OsdId)],
) -> Result<(), String> {
    if items.is_empty() {
        return Ok(()); // removing them is always allowed
    }
    if !items_are_valid(map, (pool, pg), items) {
        return Err(format!("upmap items {items:?} of PG {pool}.{pg:x} are not valid"));
    }
    let info = &map.pools[&pool];
    let placed = map.placed_osds(hierarchy, info, pg);
    if let Some((from, _)) = items.iter().find(|(from, _)| !placed.contains(from)) {
        return Err(format!("osd.{from} is not where placement puts PG {pool}.{pg:x} ({placed:?})"));
    }
    if let Some((_, to)) = items.iter().find(|(_, to)| !map.osds[to].is_in) {
        return Err(format!("osd.{to} is out"));
    }
    let mut moved = placed.clone();
    apply(map, items, &mut moved);
    if items.iter().any(|(_, to)| !moved.contains(to)) {
        return Err(format!("upmap items {items:?} would name an OSD twice in PG {pool}.{pg:x}"));
    }
    if hosts(map, &moved) < hosts(map, &placed) {
        return Err(format!("upmap items {items:?} would put two copies of PG {pool}.{pg:x} on one host"));
    }
    Ok(())
}

/// The distinct hosts of `osds`.
pub fn hosts(map: &ClusterMap, osds: &[OsdId]) -> usize {
    osds.iter().filter_map(|osd| map.osds.get(osd).map(|info| info.host.as_str())).collect::<BTreeSet<_>>().len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Command;

    fn map_of(hosts: &[&str]) -> ClusterMap {
        crate::test_map(hosts, 8)
    }

    #[test]
    fn items_apply_at_once_and_fall_back_to_placement_when_they_cannot() {
        let map = map_of(&["a", "b", "c", "d"]);
        // Simultaneous: [0, 1] with 0→1 and 1→2 is [1, 2].
        let mut osds = vec![0, 1];
        apply(&map, &[(0, 1), (1, 2)], &mut osds);
        assert_eq!(osds, vec![1, 2]);
        // One item alone would name osd.1 twice: placement's set stays.
        let mut osds = vec![0, 1];
        apply(&map, &[(0, 1)], &mut osds);
        assert_eq!(osds, vec![0, 1]);
        // A target that is out is ignored.
        let mut out = map.clone();
        out.run(&Command::MarkOut { id: 3 }).unwrap();
        let mut osds = vec![0, 1];
        apply(&out, &[(0, 3)], &mut osds);
        assert_eq!(osds, vec![0, 1]);
        assert_eq!(items_for(&[0, 1, 2], &[0, 3, 2]), vec![(1, 3)]);
    }

    #[test]
    fn the_monitor_takes_only_moves_that_keep_copies_on_distinct_hosts() {
        let map = map_of(&["a", "a", "b", "c"]);
        let hierarchy = map.hierarchy();
        let pool = map.pools[&1].clone();
        let pg = (0..8).find(|pg| map.placed_osds(&hierarchy, &pool, *pg).contains(&2)).unwrap();
        let placed = map.placed_osds(&hierarchy, &pool, pg);
        let other = *placed.iter().find(|osd| **osd != 2).unwrap();
        // osd.2 (host b) to osd.3 (host c): fine unless the other copy is on c.
        let to_c = may_set(&map, (1, pg), &[(2, 3)]);
        assert_eq!(to_c.is_ok(), other != 3, "{to_c:?} with {placed:?}");
        // To an OSD on the other copy's host: refused.
        let same_host = (0..4).find(|osd| *osd != other && map.osds[osd].host == map.osds[&other].host);
        if let Some(twin) = same_host {
            assert!(may_set(&map, (1, pg), &[(2, twin)]).unwrap_err().contains("one host"));
        }
        assert!(may_set(&map, (1, pg), &[(9, 3)]).is_err(), "an unknown OSD");
        assert!(may_set(&map, (1, pg), &[(2, 2)]).is_err(), "an OSD to itself");
        assert!(may_set(&map, (1, 99), &[(2, 3)]).is_err(), "no such PG");
        assert!(may_set(&map, (1, pg), &[]).is_ok(), "removing items");
    }
}
