//! Temporary acting sets: how a PG keeps serving I/O while it moves.
//!
//! When an OSD is added, marked in or out, or re-weighted, placement maps
//! some PGs onto OSDs that do not hold their data. Serving them from there
//! at once would block each such PG until its data was copied over. So the
//! monitor pins each of them to the OSDs that served it until then (its
//! *temporary acting set*); they keep serving while the primary copies the
//! data to the new members of the up set (the *backfill targets*) in the
//! background, and writes go to those too. When every target holds it all,
//! the primary asks the monitor to drop the pin ([`Command::ClearPgTemp`]),
//! and the up set takes over with no more to copy.
//!
//! The rules, applied after every command that moves PGs ([`settle`]):
//! - the new up set has an OSD the OSDs holding the PG lack (its pin, or
//!   else its old acting set and the OSDs of its last active set, down
//!   ones too), or none of its last active set's OSDs (the up set's may
//!   be OSDs that served it unfinished; peering waits for one of those):
//!   pin the PG to those;
//! - the new up set needs nothing new: no pin.
//!
//! A pin stays while none of its OSDs is up, and the PG has no acting set
//! meanwhile (its I/O waits): they may hold its only whole copy, as the up
//! set's OSDs may be unfinished backfills, or never have held it at all.
//! When one of them comes back it serves again and backfill resumes. The
//! simulator found why: a PG pinned to the one OSD that booted first lost
//! it before its backfill ended; handing the PG to its up set then made an
//! OSD that never held it the authority, and acknowledged writes vanished.
//!
//! [`Command::ClearPgTemp`]: crate::Command::ClearPgTemp

use crate::{Change, ClusterMap, OsdId, PoolId};

/// Each OSD's (id, host, weight, in), each pool's (id, size, PG count),
/// and the upmap items.
type PlacementInputs<'a> = (
    Vec<(OsdId, &'a str, u32, bool)>,
    Vec<(PoolId, u8, u32)>,
    &'a std::collections::BTreeMap<(PoolId, u32), Vec<(OsdId, OsdId)>>,
);

/// What placement depends on: when it is unchanged, no PG moved.
fn placement_inputs(map: &ClusterMap) -> PlacementInputs<'_> {
    let osds = map.osds.values().map(|o| (o.id, o.host.as_str(), o.weight, o.is_in)).collect();
    let pools = map.pools.values().map(|p| (p.id, p.size, p.pg_num)).collect();
    (osds, pools, &map.pg_upmap)
}

/// The pin changes that follow from going from `old` to `new` (which is
/// `old` with a command's other changes applied).
///
/// A pin that names exactly the PG's own placement, in its order, changes
/// nothing (the acting set is the up set either way) and is dropped: a
/// primary asks for a pin to go only when it differs from its up set, so
/// such a pin would stay for good. A hand-over back to the placement's
/// own primary made one (simulator seed 10222).
pub(crate) fn settle(old: &ClusterMap, new: &ClusterMap) -> Vec<Change> {
    let new_hierarchy = new.hierarchy();
    let mut changes = moved_pins(old, new, &new_hierarchy);
    // Erasure-coded PGs' pins follow their recorded holders, whatever the
    // command changed (placement, an OSD down or up, a record).
    for pool in new.pools.values().filter(|pool| pool.is_erasure()) {
        for pg in 0..pool.pg_num {
            let current = new.pg_temp.get(&(pool.id, pg)).cloned().unwrap_or_default();
            let mut wanted = erasure_pin(new, &new_hierarchy, pool, pg);
            if wanted.is_empty() && held_for_its_primary(new, pool.id, pg) {
                wanted = current.clone();
            }
            if wanted != current {
                changes.push(Change::SetPgTemp { pool: pool.id, pg, osds: wanted });
            }
        }
    }
    // The pins once these changes apply too.
    let mut pins = new.pg_temp.clone();
    for change in &changes {
        if let Change::SetPgTemp { pool, pg, osds } = change {
            if osds.is_empty() {
                pins.remove(&(*pool, *pg));
            } else {
                pins.insert((*pool, *pg), osds.clone());
            }
        }
    }
    for ((pool, pg), osds) in pins {
        let Some(info) = new.pools.get(&pool) else { continue };
        if pg < info.pg_num && new.pg_osds(&new_hierarchy, info, pg) == osds {
            changes.retain(|c| !matches!(c, Change::SetPgTemp { pool: p, pg: g, .. } if (*p, *g) == (pool, pg)));
            changes.push(Change::SetPgTemp { pool, pg, osds: Vec::new() });
        }
    }
    changes
}

/// Pins set or dropped because placement moved PGs between `old` and `new`.
fn moved_pins(old: &ClusterMap, new: &ClusterMap, new_hierarchy: &duplex_placement::Hierarchy) -> Vec<Change> {
    let mut changes = Vec::new();
    let moved = placement_inputs(old) != placement_inputs(new);
    if moved {
        let old_hierarchy = old.hierarchy();
        for pool in new.pools.values() {
            let Some(old_pool) = old.pools.get(&pool.id) else { continue };
            if pool.is_erasure() {
                continue; // `settle` pins them by their records
            }
            // PGs a split just made have no acting set to keep.
            for pg in 0..pool.pg_num.min(old_pool.pg_num) {
                let current = new.pg_temp.get(&(pool.id, pg)).cloned().unwrap_or_default();
                // Who holds the PG: its pin (down OSDs included), or the
                // OSDs that served it and those of its last active set,
                // which hold every write it acknowledged even while down.
                // Without them, a PG whose one whole OSD was down when
                // placement moved was pinned to others, that OSD became a
                // backfill target (fenced, never heard), and the PG waited
                // for it for good (simulator seed 30680).
                let holders = if current.is_empty() {
                    let mut holders = old.acting(&old_hierarchy, old_pool, pg);
                    let recorded = old.active_sets.get(&(pool.id, pg)).map(|set| set.osds.as_slice()).unwrap_or(&[]);
                    for osd in recorded {
                        if !holders.contains(osd) {
                            holders.push(*osd);
                        }
                    }
                    holders
                } else {
                    current.clone()
                };
                let new_up = new.up_set(new_hierarchy, pool, pg);
                // The up set takes new OSDs, or none of the OSDs known to
                // hold every acknowledged write (its last active set): then
                // peering at the up set alone would wait for one of them.
                let recorded = old.active_sets.get(&(pool.id, pg)).map(|set| set.osds.as_slice()).unwrap_or(&[]);
                let without_record = !recorded.is_empty() && !recorded.iter().any(|osd| new_up.contains(osd));
                let needs_data = new_up.iter().any(|osd| !holders.contains(osd)) || without_record;
                let wanted = if needs_data && !holders.is_empty() { holders } else { Vec::new() };
                if wanted != current {
                    changes.push(Change::SetPgTemp { pool: pool.id, pg, osds: wanted });
                }
            }
        }
    }
    changes
}

/// An erasure-coded PG's pin in `map`. A shard's data is its position's,
/// and the PG's last active set names who holds each position (its
/// positional record, `crate::active_set`); adding a host can shift two
/// positions of a PG at once, so a member moved to another position would
/// hold the wrong shard. When placement keeps at least `k` recorded
/// holders that are up at their positions, the PG goes to placement and
/// its recovery rebuilds the other shards from those (no pin). Otherwise
/// each position stays on its recorded holder while it is up, and one
/// whose holder is down goes to placement's OSD (rebuilt there), or is a
/// hole if that OSD holds another position. Shards do not move in the
/// background yet (issue 26): a PG pinned this way stays on its holders
/// until the map changes again.
fn erasure_pin(map: &ClusterMap, hierarchy: &duplex_placement::Hierarchy, pool: &crate::Pool, pg: u32) -> Vec<OsdId> {
    let placed = map.pg_osds(hierarchy, pool, pg);
    let size = pool.size as usize;
    let Some(recorded) = map.active_sets.get(&(pool.id, pg)).filter(|set| set.osds.len() == size) else {
        return Vec::new(); // never active: no shard to keep anywhere
    };
    let kept: Vec<Option<OsdId>> =
        recorded.osds.iter().map(|osd| Some(*osd).filter(|osd| *osd != crate::NO_OSD && map.is_up(*osd))).collect();
    let k = pool.erasure.map_or(1, |code| usize::from(code.k));
    let unmoved = (0..size).filter(|p| kept[*p].is_some() && kept[*p] == placed.get(*p).copied()).count();
    if unmoved >= k {
        return Vec::new();
    }
    let wanted: Vec<OsdId> = (0..size)
        .map(|p| match kept[p] {
            Some(osd) => osd,
            None => placed.get(p).copied().filter(|osd| !kept.contains(&Some(*osd))).unwrap_or(crate::NO_OSD),
        })
        .collect();
    if wanted == placed {
        return Vec::new();
    }
    wanted
}

/// Whether an erasure-coded PG's pin stays, though placement now keeps
/// `k` of its recorded holders (so [`erasure_pin`] wants none), until its
/// primary says it served there ([`may_release`]): the PG's record names
/// the pin's OSDs, all up. The record is made before the PG serves, and a
/// member rebuilt whole reports its position as unknown until it is
/// activated. Dropping the pin with the record moved the PG before that:
/// the rebuilt member's position stayed unknown, the pin's other current
/// holder was no member any more, and the PG waited for good (simulator
/// `--ec 2+1` seeds 98 and 10480169).
fn held_for_its_primary(map: &ClusterMap, pool: PoolId, pg: u32) -> bool {
    let Some(pin) = map.pg_temp.get(&(pool, pg)) else { return false };
    map.active_sets.get(&(pool, pg)).is_some_and(|set| set.osds == *pin)
        && pin.iter().all(|osd| *osd == crate::NO_OSD || map.is_up(*osd))
}

/// Whether an erasure-coded PG's pin is held only for its primary
/// ([`held_for_its_primary`]): placement alone would drop it, so the
/// primary asks ([`Command::ClearPgTemp`]) once the PG is active there.
///
/// [`Command::ClearPgTemp`]: crate::Command::ClearPgTemp
pub fn erasure_pin_may_go(
    map: &ClusterMap,
    hierarchy: &duplex_placement::Hierarchy,
    pool: &crate::Pool,
    pg: u32,
) -> bool {
    pool.is_erasure() && held_for_its_primary(map, pool.id, pg) && erasure_pin(map, hierarchy, pool, pg).is_empty()
}

/// Whether an erasure-coded PG's pin may go at its primary's word
/// ([`Command::ClearPgTemp`]), which it sends once the PG is active in the
/// interval that began at epoch `interval`: the pin is held only for it
/// ([`erasure_pin_may_go`]), its record is of that interval or older, and
/// none of the pin's OSDs restarted since. Unlike a replicated PG's, its
/// record stays: the pin's OSDs hold their positions' shards, the up
/// set's may not (simulator `--ec 2+1` seed 246).
///
/// [`Command::ClearPgTemp`]: crate::Command::ClearPgTemp
pub(crate) fn may_release(
    map: &ClusterMap,
    hierarchy: &duplex_placement::Hierarchy,
    (pool, pg): (PoolId, u32),
    interval: u64,
) -> bool {
    let (Some(info), Some(pin)) = (map.pools.get(&pool), map.pg_temp.get(&(pool, pg))) else { return false };
    pg < info.pg_num
        && interval <= map.epoch
        && erasure_pin_may_go(map, hierarchy, info, pg)
        && map.active_sets.get(&(pool, pg)).is_some_and(|set| set.since <= interval)
        && pin.iter().all(|osd| *osd == crate::NO_OSD || map.osds.get(osd).is_some_and(|o| o.state_epoch <= interval))
}

/// Whether a primary may hand a PG over ([`Command::HandOver`]): `osds`
/// is its acting set in another order (a new primary first), and none of
/// them restarted since the interval that began at epoch `interval`.
///
/// [`Command::HandOver`]: crate::Command::HandOver
pub(crate) fn may_hand_over(
    map: &ClusterMap,
    hierarchy: &duplex_placement::Hierarchy,
    (pool, pg): (PoolId, u32),
    osds: &[OsdId],
    interval: u64,
) -> bool {
    let Some(info) = map.pools.get(&pool) else { return false };
    if pg >= info.pg_num || interval > map.epoch {
        return false;
    }
    let acting = map.acting(hierarchy, info, pg);
    let (mut sorted_acting, mut sorted_osds) = (acting.clone(), osds.to_vec());
    sorted_acting.sort_unstable();
    sorted_osds.sort_unstable();
    !osds.is_empty()
        && acting.first() != osds.first()
        && sorted_acting == sorted_osds
        && osds.iter().all(|osd| map.osds.get(osd).is_some_and(|o| o.up && o.state_epoch <= interval))
}

/// Whether a pin may be dropped: the up set is the one its primary
/// backfilled, and none of the PG's OSDs restarted since the interval in
/// which it did (a restart begins a new interval, which backfills again).
pub(crate) fn may_clear(
    map: &ClusterMap,
    hierarchy: &duplex_placement::Hierarchy,
    (pool, pg): (PoolId, u32),
    up: &[OsdId],
    interval: u64,
) -> bool {
    let (Some(temp), Some(info)) = (map.pg_temp.get(&(pool, pg)), map.pools.get(&pool)) else { return false };
    // An erasure-coded PG's up set holds other shards than its pin's
    // positions: recording it as the last active set would name OSDs for
    // shards they do not hold (simulator `--ec 2+1` seed 246 read one data
    // shard's bytes for another's). Its pin goes by `settle` only.
    if pg >= info.pg_num || info.is_erasure() || map.up_set(hierarchy, info, pg) != up {
        return false;
    }
    // Only a whole up set: every OSD placement names is up. With one down
    // the primary sees no target to fill, yet the up set it names lacks
    // that OSD: dropping the pin would shed the pin's other whole copies
    // and record fewer holders than there are. Worst, with the whole up
    // set down it would record an empty last active set, which means "its
    // copies were marked lost: any copy will do": the next OSD up served
    // its own old or empty copy while the pin's OSD held every write
    // (simulator seeds 5300047 and 5301127 of size 2, min_size 1). The pin
    // stays until the missing OSDs are back and filled.
    if up.is_empty() || map.pg_osds(hierarchy, info, pg) != up {
        return false;
    }
    temp.iter().chain(up).all(|osd| map.osds.get(osd).is_some_and(|o| o.state_epoch <= interval))
}
