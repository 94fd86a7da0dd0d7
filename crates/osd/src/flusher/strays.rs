//! Stray copies: PGs this OSD still holds objects of, though it is no
//! longer one of their OSDs, are removed, so that moving a PG away (an OSD
//! added, marked out, a balancer's remap, a pool deleted) frees its room
//! here. Without this, adding an OSD to a full cluster freed nothing on
//! the old ones, and a balancer could only make things worse.
//!
//! As Ceph does, a copy is removed only once the PG is clean elsewhere:
//! not pinned (nothing left to backfill), and its last active set in the
//! map is its whole acting set, a full pool's worth of OSDs that are up,
//! without this one. Those hold every write the PG acknowledged
//! (`duplex_map::active_set`), so this copy adds nothing but room taken.
//! A PG whose pool was deleted is removed at once. Only a map that has
//! this OSD up judges: a process starts with an empty map (no pools, so
//! every PG's pool looked deleted), and the simulator caught an OSD that
//! had just restarted removing a PG's one recorded copy so (seed 303).
//!
//! An OSD marked out keeps its copies: it takes no new data, its room
//! counts for nothing, and when it is marked in again backfill compares
//! those copies and sends only what changed (an operator's maintenance
//! costs no full refill). Copies left on OSDs that are in, which is where
//! room matters (an OSD added to a full cluster, a balancer's move), go.
//!
//! Safety against the map moving on while the copy goes: the first batch
//! that deletes marks the copy an unfinished backfill (`stored_interval`'s
//! flag, in the same store batch), so peering never counts it whole again;
//! and a PG a primary has asked about in an interval newer than the map
//! the removal was judged by is left alone (it is a member again, and its
//! answer may have said its copy is whole). Queries and removals run on
//! this partition's flusher thread, one after the other, so nothing falls
//! between the two checks. The ids record and the interval record (in
//! pool 0's group) stay: they describe the copy, which stays incomplete
//! until a backfill fills it again.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use duplex_map::OsdId;
use duplex_store::{Batch, Op};

use super::device::DeviceClass;
use super::{Background, Flusher, Pending};
use crate::cluster::MapView;
use crate::pg::{pg_number, pool_of, stored_interval};

/// Objects one removal batch deletes: its cost in the device queue's
/// `Strays` class, which paces the batches behind client work.
const STRAY_BATCH: usize = 32;

/// The removal under way: the map it was judged by, and the PGs still to
/// look at. While it lasts, one `Background::Strays` waits in the device
/// queue for the next batch (`Pending::stray_batch_queued`).
pub struct StrayWork {
    view: Arc<MapView>,
    candidates: VecDeque<u32>,
}

/// When the flushers are given a map to judge stray copies by: each new
/// epoch, and again every [`STRAY_RECHECK_US`] (a PG skipped while it held
/// log entries is looked at again). Kept by the peering thread, on its clock.
#[derive(Default)]
pub struct StrayWatch {
    last: Option<(u64, u64)>,
}

/// Microseconds between two looks at the same map.
pub const STRAY_RECHECK_US: u64 = 30_000_000;

impl StrayWatch {
    /// Whether the map at `epoch` is to be sent to the flushers at `now_us`.
    pub fn due(&mut self, epoch: u64, now_us: u64) -> bool {
        let due = self.last.is_none_or(|(seen, at)| epoch != seen || now_us >= at + STRAY_RECHECK_US);
        if due {
            self.last = Some((epoch, now_us));
        }
        due
    }
}

/// Whether OSD `me` holds PG `key` for no reason in `view` (see the module doc).
pub fn is_stray(view: &MapView, me: OsdId, key: u32) -> bool {
    let (pool_id, pg) = (pool_of(key), pg_number(key));
    if pool_id == 0 {
        return false; // the OSD's own records (stored_interval.rs)
    }
    let map = &view.map;
    // Only a map that has this OSD up judges (not the empty one a process
    // starts with, nor one from before it was marked down).
    let Some(osd) = map.osds.get(&me).filter(|osd| osd.up) else { return false };
    let Some(pool) = map.pools.get(&pool_id) else {
        // Deleted: the map made that pool id (ids are never reused). A
        // pool id the map has not reached yet is one it does not know.
        return pool_id < map.next_pool_id;
    };
    if !osd.is_in {
        return false; // out: drained, its copies kept for when it is in again
    }
    if pg >= pool.pg_num || map.pg_temp.contains_key(&(pool_id, pg)) || pool.is_erasure() {
        // An erasure-coded PG's copies are shards: kept until its own
        // recovery knows which are whole (issue 26).
        return false;
    }
    let mapped = map.pg_osds(&view.hierarchy, pool, pg);
    if mapped.contains(&me) {
        return false;
    }
    let Some(record) = map.active_sets.get(&(pool_id, pg)) else { return false };
    let acting = map.acting(&view.hierarchy, pool, pg);
    !record.osds.contains(&me) && record.osds.len() == pool.size as usize && record.osds == acting
}

impl Flusher {
    /// Takes a new map to judge stray copies by: the removal starts over
    /// with this partition's PGs.
    pub(super) fn take_strays(&self, view: Arc<MapView>, pending: &mut Pending, now: Instant) {
        let candidates: VecDeque<u32> =
            self.partition.groups().into_iter().filter(|key| is_stray(&view, self.id, *key)).collect();
        pending.strays = (!candidates.is_empty()).then_some(StrayWork { view, candidates });
        queue_batch(pending, now);
    }

    /// One removal batch, as the device queue allows: up to
    /// [`STRAY_BATCH`] objects of the first stray PG left.
    pub(super) fn remove_strays(&mut self, pending: &mut Pending, now: Instant) {
        debug_assert!(pending.stray_batch_queued, "a removal batch served that was never queued");
        pending.stray_batch_queued = false;
        let Some(work) = pending.strays.as_mut() else { return };
        while let Some(&key) = work.candidates.front() {
            // Asked about since (a member again), or holding entries: kept.
            let keep = self.pgs.get(key).is_some_and(|pg| {
                let pg = pg.lock().expect("PG lock");
                pg.asked_interval > work.view.epoch() || !pg.log.is_empty()
            });
            let keys = if keep { Vec::new() } else { self.partition.list_group(key, STRAY_BATCH) };
            if keys.is_empty() {
                work.candidates.pop_front();
                if !keep {
                    self.metrics.stray_pgs_removed.add(1);
                    tracing::info!(pg = key, "a stray copy of the PG is removed: it is clean on its own OSDs");
                }
                continue;
            }
            let mut ops = vec![stored_interval::mark_backfilling(self.partition.index(), key, true)];
            ops.extend(keys.into_iter().map(|key| Op::Delete { key }));
            let removed = ops.len() as u64 - 1;
            self.snap_heads.clear();
            match self.partition.apply(&Batch { ops }) {
                Ok(_) => self.metrics.stray_objects_removed.add(removed),
                Err(err) => {
                    // Left for the next map; nothing else depends on it.
                    tracing::warn!(pg = key, %err, "removing a stray copy failed");
                    work.candidates.pop_front();
                }
            }
            queue_batch(pending, now);
            return;
        }
        pending.strays = None;
    }
}

/// Queues the next removal batch of the work in hand, unless one is queued.
fn queue_batch(pending: &mut Pending, now: Instant) {
    if pending.strays.is_some() && !pending.stray_batch_queued {
        pending.stray_batch_queued = true;
        pending.device.push(DeviceClass::Strays, Background::Strays, STRAY_BATCH as f64, now);
    }
    debug_assert!(pending.strays.is_none() || pending.stray_batch_queued, "stray work with no batch queued");
}

#[cfg(test)]
mod tests {
    use super::*;
    use duplex_map::{ActiveSet, ClusterMap, Command};

    #[test]
    fn a_copy_is_stray_only_once_its_pg_is_clean_on_a_whole_acting_set_without_it() {
        let mut map = crate::test_map(4, 8);
        let view = MapView::new(map.clone());
        let pool = map.pools[&1].clone();
        let pg = 3;
        let key = crate::pg::pg_key(1, pg).unwrap();
        let acting = view.map.acting(&view.hierarchy, &pool, pg);
        let outsider = (0..4).find(|osd| !acting.contains(osd)).unwrap();
        // No record yet: not known clean.
        assert!(!is_stray(&view, outsider, key));
        map.active_sets.insert((1, pg), ActiveSet { since: map.epoch, osds: acting.clone() });
        let view = MapView::new(map.clone());
        assert!(is_stray(&view, outsider, key), "clean on {acting:?}");
        for member in &acting {
            assert!(!is_stray(&view, *member, key), "osd.{member} is one of its OSDs");
        }
        // Pinned (moving), or recorded on fewer OSDs than the pool's size: kept.
        let mut pinned = map.clone();
        pinned.pg_temp.insert((1, pg), vec![outsider, acting[0]]);
        assert!(!is_stray(&MapView::new(pinned), outsider, key));
        let mut short = map.clone();
        short.active_sets.insert((1, pg), ActiveSet { since: map.epoch, osds: vec![acting[0]] });
        assert!(!is_stray(&MapView::new(short), outsider, key));
        // Recorded with this OSD (it holds every write): kept.
        let mut recorded = map.clone();
        recorded.active_sets.insert((1, pg), ActiveSet { since: map.epoch, osds: vec![acting[0], outsider] });
        assert!(!is_stray(&MapView::new(recorded), outsider, key));
        // An OSD marked out keeps its copies (for when it is in again).
        let mut out = map.clone();
        out.run(&Command::MarkOut { id: outsider }).unwrap();
        out.pg_temp.clear();
        out.active_sets.insert((1, pg), ActiveSet { since: map.epoch, osds: acting.clone() });
        assert!(!is_stray(&MapView::new(out), outsider, key));
        // A map that does not have this OSD up (the empty one a restarted
        // process starts with, which has no pools either): nothing is
        // stray (simulator seed 303 removed a PG's one recorded copy so).
        let empty = MapView::new(ClusterMap::new([1; 16]));
        assert!(!is_stray(&empty, outsider, key));
        let mut down = map.clone();
        down.run(&Command::MarkDown { id: outsider }).unwrap();
        assert!(!is_stray(&MapView::new(down), outsider, key));
        // The pool is gone: stray at once. Pool 0 is the OSD's own.
        map.run(&Command::PoolDelete { name: "rbd".into() }).unwrap();
        assert!(is_stray(&MapView::new(map.clone()), acting[0], key));
        assert!(!is_stray(&MapView::new(map), acting[0], 3));
    }
}
