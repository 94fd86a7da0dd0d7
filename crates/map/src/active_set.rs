//! Each PG's last active set: the OSDs that hold every write it acknowledged.
//!
//! Peering picks its authority among the members it can reach. That alone
//! is not enough: with size 2 and min_size 1, say osd.A alone took writes
//! while osd.B was down; then osd.A died and osd.B came back. Peering among
//! the members present (osd.B alone) would make osd.B's older copy the
//! authority, and the writes acknowledged by osd.A would be gone (or come
//! back later as a divergent history, and be thrown away). Ceph prevents
//! this with its *past intervals*: the PG stays down until an OSD of its
//! last interval that may have taken writes answers.
//!
//! Duplex keeps the answer in the map instead of deriving it from old maps:
//! - **The rule:** before a PG serves I/O in a new interval whose members
//!   differ from its recorded set, its primary has the monitor record them
//!   ([`Command::RecordActive`]), and waits until the map shows it. So
//!   every write a PG ever acknowledged is on every OSD of its set (each
//!   member of an interval takes each write, and is brought level with
//!   the authority before the interval begins).
//! - **The check:** peering goes on only if one OSD of the recorded set is
//!   among the members that answered, with a complete copy. Else the PG
//!   is *down* and waits for one of them.
//! - **The monitor accepts a record only of members of the PG's acting
//!   set in its current map, its primary first**: a primary whose interval
//!   ended cannot record its members after its successor began peering
//!   with the set before. Members being filled in the background are not
//!   recorded until their fill ends (the PG then peers again): they lack
//!   writes until then (simulator seed 1280 lost ten acknowledged writes
//!   when such a member, recorded, led after the whole ones died).
//! - **A pin dropped after backfill** ([`Command::ClearPgTemp`]) records
//!   the up set in the same epoch: the targets hold everything by then, and
//!   the OSDs of the pin may leave the PG at once. Never an empty up set
//!   (every OSD of it down): that would read as "marked lost".
//! - **An OSD the operator marks lost** ([`Command::MarkLost`]) leaves
//!   every set and pin: the PG is given up to the OSDs still named. A set
//!   left empty means "its last copies are lost": peering then takes the
//!   best copy present, even an unfinished backfill.
//!
//! A PG with no record (a new pool) has nothing to wait for; its first
//! activation records one.
//!
//! [`Command::RecordActive`]: crate::Command::RecordActive
//! [`Command::ClearPgTemp`]: crate::Command::ClearPgTemp
//! [`Command::MarkLost`]: crate::Command::MarkLost

use serde::{Deserialize, Serialize};

use crate::{Change, ClusterMap, OsdId, PoolId};

/// The OSDs a PG was last active on, and since which interval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ActiveSet {
    /// The map epoch its interval began at (records only move forward).
    pub since: u64,
    /// Empty: the OSDs it named were marked lost; any copy will do.
    pub osds: Vec<OsdId>,
}

/// Whether a primary may record `osds` as PG `(pool, pg)`'s active set for
/// the interval that began at epoch `interval`: they are members of its
/// acting set in this map, its primary first (members being filled in the
/// background are left out: they hold every write only once their backfill
/// ends, and the PG records them when it peers again then), and the record
/// is not older than the one in place.
pub(crate) fn may_record(
    map: &ClusterMap,
    hierarchy: &duplex_placement::Hierarchy,
    (pool, pg): (PoolId, u32),
    interval: u64,
    osds: &[OsdId],
) -> bool {
    let Some(info) = map.pools.get(&pool) else { return false };
    if pg >= info.pg_num || osds.is_empty() || interval > map.epoch {
        return false;
    }
    if map.active_sets.get(&(pool, pg)).is_some_and(|set| set.since > interval || set.osds == osds) {
        return false;
    }
    let acting = map.acting(hierarchy, info, pg);
    // An erasure-coded PG's sets are positional: holes repeat, and every
    // OSD recorded is at its acting position.
    if info.is_erasure() {
        return osds.len() == acting.len()
            && osds.iter().any(|osd| *osd != crate::NO_OSD)
            && osds.iter().zip(&acting).all(|(osd, at)| *osd == crate::NO_OSD || osd == at);
    }
    acting.first() == osds.first()
        && osds.iter().all(|osd| acting.contains(osd))
        && osds.iter().enumerate().all(|(i, osd)| !osds[..i].contains(osd))
}

/// The changes that give `osd`'s copies up: it leaves every active set
/// and every pin (a pin left empty goes: the PG moves to its up set).
pub(crate) fn lose(map: &ClusterMap, osd: OsdId) -> Vec<Change> {
    let mut changes = Vec::new();
    // An erasure-coded PG's sets are positional: the OSD leaves a hole.
    let without = |pool: PoolId, osds: &[OsdId]| -> Vec<OsdId> {
        if map.pools.get(&pool).is_some_and(|p| p.is_erasure()) {
            let left: Vec<OsdId> = osds.iter().map(|o| if *o == osd { crate::NO_OSD } else { *o }).collect();
            if left.iter().all(|o| *o == crate::NO_OSD) {
                Vec::new()
            } else {
                left
            }
        } else {
            osds.iter().copied().filter(|o| *o != osd).collect()
        }
    };
    for (&(pool, pg), set) in &map.active_sets {
        if set.osds.contains(&osd) {
            let osds = without(pool, &set.osds);
            changes.push(Change::SetActiveSet { pool, pg, set: Some(ActiveSet { since: set.since, osds }) });
        }
    }
    for (&(pool, pg), pin) in &map.pg_temp {
        if pin.contains(&osd) {
            changes.push(Change::SetPgTemp { pool, pg, osds: without(pool, pin) });
        }
    }
    changes
}

/// An erasure-coded PG's record once `stale`, OSDs it names, leave holes
/// at their positions (`Command::UnrecordShards`): its primary, peering
/// in the interval that began at epoch `interval`, found their copies no
/// longer hold their positions' shards as recorded (a recovery that no
/// activation ended changed them, or their log was lost). Then the PG's
/// pin goes back to the recorded holders that do (`pg_temp::erasure_pin`),
/// where the monitor would otherwise count those copies and leave the PG
/// on a placement that holds fewer than `k` current shards for good
/// (simulator `--ec 2+1` with two faults at once, seed 10610699). `None`:
/// nothing to change, or not allowed: not erasure-coded, no record, a
/// record newer than the interval, an OSD it does not name, or no holder
/// left (an empty record means "marked lost", which only the operator
/// says).
pub(crate) fn unrecorded(
    map: &ClusterMap,
    hierarchy: &duplex_placement::Hierarchy,
    (pool, pg): (PoolId, u32),
    (interval, acting): (u64, &[OsdId]),
    stale: &[OsdId],
) -> Option<ActiveSet> {
    let info = map.pools.get(&pool).filter(|info| info.is_erasure() && pg < info.pg_num)?;
    let set = map.active_sets.get(&(pool, pg)).filter(|set| set.since <= interval && interval <= map.epoch)?;
    debug_assert_eq!(set.osds.len(), info.size as usize, "an erasure-coded record is positional");
    if stale.is_empty() || stale.iter().any(|osd| *osd == crate::NO_OSD || !set.osds.contains(osd)) {
        return None;
    }
    // Only while the PG is still in the interval it was asked in: its
    // acting set the same, none of it restarted or went down and up since,
    // and each stale OSD at its recorded position there. A late request
    // must not take out a member rebuilt and activated since (the record
    // is not made again when its members are the same).
    let same_interval = map.acting(hierarchy, info, pg) == acting
        && acting
            .iter()
            .all(|osd| *osd == crate::NO_OSD || map.osds.get(osd).is_some_and(|o| o.state_epoch <= interval))
        && stale.iter().all(|osd| {
            let at = set.osds.iter().position(|o| o == osd);
            at.is_some() && at == acting.iter().position(|o| o == osd)
        });
    if !same_interval {
        return None;
    }
    let osds: Vec<OsdId> = set.osds.iter().map(|osd| if stale.contains(osd) { crate::NO_OSD } else { *osd }).collect();
    osds.iter().any(|osd| *osd != crate::NO_OSD).then_some(ActiveSet { since: set.since, osds })
}

/// Whether none of a PG's last active OSDs is up: it cannot go active
/// until one comes back or is marked lost (`None`: not down).
pub fn down_waiting_for(map: &ClusterMap, pool: PoolId, pg: u32) -> Option<&[OsdId]> {
    let set = map.active_sets.get(&(pool, pg))?;
    (!set.osds.is_empty() && !set.osds.iter().any(|osd| map.is_up(*osd))).then_some(set.osds.as_slice())
}
