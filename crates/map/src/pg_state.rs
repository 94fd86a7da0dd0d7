//! What a PG is doing, as far as the map tells: the states `duplex status`
//! counts.
//!
//! The acting set alone is not enough. When an OSD comes back up, the map
//! names it in its PGs' acting sets at once, but its copies are stale
//! until the primary brings them level: from the log while peering, or by
//! a fill in the background that may take minutes for an OSD that was gone
//! long. Reading only the acting set, `status` said `active+clean` all
//! that while, so an operator who took another OSD down "now that all is
//! clean" took down the only whole copy of those PGs, and they stopped
//! serving until it came back.
//!
//! The PG's last active set ([`crate::active_set`]) tells: a primary
//! records the members of each new interval before it serves, and leaves
//! members being filled out of the record until they are level. So an
//! acting OSD missing from the record is still being brought level, and
//! an OSD of the record that is up but no longer acting (and no pin keeps
//! it: the monitor pins a PG that placement moves, [`crate::pg_temp`])
//! means the PG has not peered since its members changed.

use crate::{ClusterMap, OsdId, Pool, NO_OSD};

/// A PG's state under one map, worst first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum PgState {
    /// Every OSD it was last active on is down: it waits for one of them.
    Down,
    /// Fewer than `min_size` of its OSDs are up: I/O waits.
    Inactive,
    /// Its members changed since it last went active (an OSD of its last
    /// active set is up but no longer acting): its primary peers with the
    /// new ones before it serves again.
    Peering,
    Active {
        /// Fewer than `size` of its acting OSDs hold every write.
        degraded: bool,
        filling: Filling,
    },
}

/// How a PG's missing copies are being made.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Filling {
    Nothing,
    /// Pinned to its old OSDs, which serve it while its new ones are filled.
    Backfilling,
    /// Some acting OSDs are not level yet (not in its last active set):
    /// brought level from the log while peering, or filled in the background.
    Recovering,
}

impl PgState {
    /// The name `duplex status` shows (Ceph's words where they mean the same).
    pub fn label(self) -> &'static str {
        match self {
            PgState::Down => "down",
            PgState::Inactive => "inactive",
            PgState::Peering => "peering",
            PgState::Active { degraded: false, filling: Filling::Nothing } => "active+clean",
            PgState::Active { degraded: true, filling: Filling::Nothing } => "active+degraded",
            PgState::Active { degraded: false, filling: Filling::Backfilling } => "active+backfilling",
            PgState::Active { degraded: true, filling: Filling::Backfilling } => "active+degraded+backfilling",
            PgState::Active { degraded: false, filling: Filling::Recovering } => "active+recovering",
            PgState::Active { degraded: true, filling: Filling::Recovering } => "active+degraded+recovering",
        }
    }
}

/// PG `pg` of `pool`'s state under `map` (`hierarchy` is the map's).
pub fn pg_state(map: &ClusterMap, hierarchy: &duplex_placement::Hierarchy, pool: &Pool, pg: u32) -> PgState {
    if crate::active_set::down_waiting_for(map, pool.id, pg).is_some() {
        return PgState::Down;
    }
    let acting: Vec<OsdId> = map.acting(hierarchy, pool, pg).into_iter().filter(|osd| *osd != NO_OSD).collect();
    if acting.len() < pool.min_size as usize {
        return PgState::Inactive;
    }
    // No record (a new pool, or every OSD it named was marked lost): the
    // acting set is all there is to go by.
    let recorded: &[OsdId] = map.active_sets.get(&(pool.id, pg)).map_or(&[], |set| set.osds.as_slice());
    let recorded: Vec<OsdId> = recorded.iter().copied().filter(|osd| *osd != NO_OSD).collect();
    if recorded.iter().any(|osd| map.is_up(*osd) && !acting.contains(osd)) {
        return PgState::Peering;
    }
    let level =
        if recorded.is_empty() { acting.len() } else { acting.iter().filter(|osd| recorded.contains(osd)).count() };
    let filling = if map.pg_temp.contains_key(&(pool.id, pg)) {
        Filling::Backfilling
    } else if level < acting.len() {
        Filling::Recovering
    } else {
        Filling::Nothing
    };
    PgState::Active { degraded: level < pool.size as usize, filling }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{test_map, ActiveSet, Change, Command, MapDelta};

    /// pool 1, PG `pg`: its state in `map`.
    fn state(map: &ClusterMap, pg: u32) -> PgState {
        pg_state(map, &map.hierarchy(), &map.pools[&1], pg)
    }

    fn change(map: &mut ClusterMap, changes: Vec<Change>) {
        map.apply(&MapDelta { epoch: map.epoch + 1, changes }).unwrap();
    }

    fn record(map: &mut ClusterMap, pg: u32, osds: &[OsdId]) {
        let set = ActiveSet { since: map.epoch, osds: osds.to_vec() };
        change(map, vec![Change::SetActiveSet { pool: 1, pg, set: Some(set) }]);
    }

    fn pin(map: &mut ClusterMap, pg: u32, osds: &[OsdId]) {
        change(map, vec![Change::SetPgTemp { pool: 1, pg, osds: osds.to_vec() }]);
    }

    fn set_up(map: &mut ClusterMap, osds: &[OsdId], up: bool) {
        for id in osds {
            let command = if up { Command::MarkUp { id: *id } } else { Command::MarkDown { id: *id } };
            map.run(&command).unwrap();
        }
    }

    /// A map of three OSDs, pool 1 of 2 copies and 8 PGs, every PG active
    /// on its up set (as its primaries recorded).
    fn settled() -> ClusterMap {
        let mut map = test_map(&["a", "b", "c"], 8);
        for pg in 0..8 {
            let acting = map.acting(&map.hierarchy(), &map.pools[&1], pg);
            record(&mut map, pg, &acting);
        }
        map
    }

    /// A PG of `map` with `osd` in its acting set.
    fn pg_with(map: &ClusterMap, osd: OsdId) -> u32 {
        (0..8).find(|pg| map.acting(&map.hierarchy(), &map.pools[&1], *pg).contains(&osd)).expect("a PG on the OSD")
    }

    #[test]
    fn a_pg_moved_by_placement_is_backfilling_while_pinned_and_peering_until_its_up_set_is_recorded() {
        let mut map = settled();
        let pg = pg_with(&map, 0);
        assert_eq!(state(&map, pg).label(), "active+clean");
        map.run(&Command::MarkOut { id: 0 }).unwrap();
        // The monitor pinned the PG to its old OSDs in the same epoch.
        assert!(map.pg_temp.contains_key(&(1, pg)));
        assert_eq!(state(&map, pg).label(), "active+backfilling");
        // Unpinned without the up set recorded (ClearPgTemp records it in
        // the same epoch; a hand-over may not): osd.0 is up, out of the
        // acting set, and still the record's.
        let up = map.up_set(&map.hierarchy(), &map.pools[&1], pg);
        pin(&mut map, pg, &[]);
        assert_eq!(state(&map, pg), PgState::Peering);
        record(&mut map, pg, &up);
        assert_eq!(state(&map, pg).label(), "active+clean");
    }

    #[test]
    fn a_returning_osd_is_recovering_until_recorded_and_a_down_one_leaves_the_pg_degraded() {
        let mut map = settled();
        let pg = pg_with(&map, 0);
        let acting = map.acting(&map.hierarchy(), &map.pools[&1], pg);
        let other = *acting.iter().find(|osd| **osd != 0).unwrap();
        set_up(&mut map, &[0], false);
        // Down, not out: the PG goes on with one copy (no new OSD to peer with).
        assert_eq!(state(&map, pg).label(), "active+degraded");
        record(&mut map, pg, &[other]);
        assert_eq!(state(&map, pg).label(), "active+degraded");
        set_up(&mut map, &[0], true);
        assert_eq!(state(&map, pg).label(), "active+degraded+recovering", "osd.0 is back but not level");
        record(&mut map, pg, &acting);
        assert_eq!(state(&map, pg).label(), "active+clean");
        set_up(&mut map, &[0, other], false);
        assert_eq!(state(&map, pg), PgState::Down);
    }

    #[test]
    fn a_pg_without_a_record_goes_by_its_acting_set() {
        let mut map = test_map(&["a", "b", "c"], 8);
        assert!((0..8).all(|pg| state(&map, pg).label() == "active+clean"));
        set_up(&mut map, &[0, 1, 2], false);
        assert!((0..8).all(|pg| state(&map, pg) == PgState::Inactive));
    }
}
