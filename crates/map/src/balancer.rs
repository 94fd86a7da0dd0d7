//! The balancer: moves PGs by bytes, from the fullest OSD to the emptiest,
//! through upmap items ([`crate::upmap`]).
//!
//! Placement evens out PG counts, not bytes: with few PGs per OSD, or PGs
//! holding very different amounts, the first OSD to reach the full ratio
//! stops every write to its PGs while the others still have room. Ceph's
//! upmap balancer evens PG counts; this one evens what the OSDs report
//! they hold, which is what the full ratio is checked against.
//!
//! The monitor's leader runs [`plan`] on the usage the OSDs report (five
//! times a second, on reports made twice a second): a few moves at a time
//! ([`MAX_MOVES`]), and none more while any PG is being backfilled
//! (pinned), except to send a backfill waiting on a target past
//! backfillfull elsewhere. Each report lists the
//! bytes of every PG the OSD holds, so the plan sees moves not yet
//! finished: a PG an OSD still holds but is no longer mapped to (a stray
//! copy, removed soon) does not count for it, and one mapped to it that it
//! does not hold yet counts at the size its other OSDs report. A move is
//! made only if it lowers the higher of the two OSDs' use and keeps the
//! target below backfillfull, and a PG moved lately stays where it is.

use std::collections::{BTreeMap, BTreeSet};

use crate::{upmap, ClusterMap, Command, Fullness, OsdId, PoolId};

/// What an OSD reports of its store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OsdUsage {
    /// Its store's capacity.
    pub capacity_bytes: u64,
    /// How full it is, as its full ratio sees it (per mille).
    pub used_permille: u64,
    /// The bytes each PG it holds takes there.
    pub pgs: BTreeMap<(PoolId, u32), u64>,
}

/// The leader's balancer, on its clock (milliseconds): the OSDs' latest
/// reports, and the PGs moved lately. The monitor daemon and the
/// simulator drive the same one.
#[derive(Default)]
pub struct Balancer {
    reports: BTreeMap<OsdId, (u64, OsdUsage)>,
    last_look: Option<u64>,
    /// PGs moved lately, and when.
    moved: BTreeMap<(PoolId, u32), u64>,
}

/// A report older than this (ms) is not used: its OSD counts as unreported.
pub const REPORT_FRESH_MS: u64 = 5_000;
/// How often the leader looks for moves (ms).
pub const LOOK_EVERY_MS: u64 = 200;
/// A PG the balancer moved is not moved again for this long (ms).
pub const SETTLE_MS: u64 = 10_000;

impl Balancer {
    /// Keeps `osd`'s report; one from an OSD `map` does not know is
    /// dropped (reports are kept per OSD, so that bounds them).
    pub fn report(&mut self, map: &ClusterMap, osd: OsdId, usage: OsdUsage, now_ms: u64) {
        if map.osds.contains_key(&osd) {
            self.reports.insert(osd, (now_ms, usage));
        }
    }

    /// Forgets every report (this node is no longer the leader).
    pub fn forget(&mut self) {
        self.reports.clear();
    }

    /// The next moves, if a look is due and they are wanted ([`plan`]).
    pub fn look(&mut self, map: &ClusterMap, now_ms: u64) -> Option<Vec<Move>> {
        if self.last_look.is_some_and(|at| now_ms < at + LOOK_EVERY_MS) {
            return None;
        }
        self.last_look = Some(now_ms);
        self.reports.retain(|_, (at, _)| now_ms < *at + REPORT_FRESH_MS);
        self.moved.retain(|_, at| now_ms < *at + SETTLE_MS);
        let usage: BTreeMap<OsdId, OsdUsage> =
            self.reports.iter().map(|(osd, (_, usage))| (*osd, usage.clone())).collect();
        let settling: BTreeSet<(PoolId, u32)> = self.moved.keys().copied().collect();
        let moves = plan(map, &usage, &settling)?;
        for found in &moves {
            self.moved.insert((found.pool, found.pg), now_ms);
        }
        Some(moves)
    }
}

/// One move: a PG's new upmap items, and what it is expected to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub pool: PoolId,
    pub pg: u32,
    pub from: OsdId,
    pub to: OsdId,
    pub bytes: u64,
    pub items: Vec<(OsdId, OsdId)>,
}

/// The map command that makes `moves`.
pub fn command(moves: &[Move]) -> Command {
    Command::SetPgUpmap { pgs: moves.iter().map(|m| (m.pool, m.pg, m.items.clone())).collect() }
}

/// The next moves (at most [`MAX_MOVES`], of distinct PGs), if the OSDs
/// that are in and up differ by more than the map's `balancer_max_spread`
/// and PGs can narrow that. `usage` must hold a report of every such OSD
/// (otherwise nothing moves). PGs in `settling` (moved lately) stay: under
/// a steady stream of writes the best move changes from one look to the
/// next, and without this a PG went back and forth between three OSDs.
pub fn plan(
    map: &ClusterMap,
    usage: &BTreeMap<OsdId, OsdUsage>,
    settling: &BTreeSet<(PoolId, u32)>,
) -> Option<Vec<Move>> {
    let spread = u64::from(map.balancer_max_spread);
    if spread == 0 {
        return None;
    }
    let osds: Vec<OsdId> = map.osds.values().filter(|o| o.up && o.is_in).map(|o| o.id).collect();
    if osds.len() < 2 || osds.iter().any(|osd| usage.get(osd).is_none_or(|u| u.capacity_bytes == 0)) {
        return None;
    }
    let mut cluster = Cluster::new(map, usage);
    if !map.pg_temp.is_empty() {
        // Moves under way (pins): none more until they end, but a backfill
        // waiting on a target past backfillfull is sent elsewhere. A move
        // holds both copies until the PG is clean (the old one goes then),
        // so moving more while OSDs fill can leave every target past
        // backfillfull and every backfill waiting on another.
        let stuck = cluster.unstick(settling);
        return (!stuck.is_empty()).then_some(stuck);
    }
    let mut projected = cluster.projected(&osds);
    let mut moves: Vec<Move> = Vec::new();
    let mut stay = settling.clone();
    while moves.len() < MAX_MOVES {
        let Some(found) = cluster.next_move(&projected, spread, &stay) else { break };
        stay.insert((found.pool, found.pg));
        // As if made: the next move of the round sees it.
        let from = projected.get_mut(&found.from).expect("an OSD with a report");
        *from = from.saturating_sub(cluster.permille(found.bytes, found.from));
        *projected.get_mut(&found.to).expect("an OSD with a report") += cluster.permille(found.bytes, found.to);
        let osds = cluster.mapped.get_mut(&(found.pool, found.pg)).expect("a mapped PG");
        osds.iter_mut().filter(|osd| **osd == found.from).for_each(|osd| *osd = found.to);
        moves.push(found);
    }
    (!moves.is_empty()).then_some(moves)
}

/// Moves one look makes at most; the next look that moves waits for them
/// to end (no pin left).
pub const MAX_MOVES: usize = 4;

/// How many of the fullest OSDs one look tries to move a PG from, and how
/// many of the emptiest it tries to move one to.
const GIVERS: usize = 4;
const TAKERS: usize = 8;

/// What one look works from: the map, the reports, where every PG is
/// mapped now, and each PG's size (the largest any OSD reports).
struct Cluster<'a> {
    map: &'a ClusterMap,
    usage: &'a BTreeMap<OsdId, OsdUsage>,
    hierarchy: duplex_placement::Hierarchy,
    mapped: BTreeMap<(PoolId, u32), Vec<OsdId>>,
    size: BTreeMap<(PoolId, u32), u64>,
    backfillfull: u64,
}

impl<'a> Cluster<'a> {
    fn new(map: &'a ClusterMap, usage: &'a BTreeMap<OsdId, OsdUsage>) -> Cluster<'a> {
        let hierarchy = map.hierarchy();
        let mut mapped = BTreeMap::new();
        // Erasure-coded PGs are not moved yet: a moved shard is rebuilt,
        // not copied, and their pins keep positions (issue 26).
        for pool in map.pools.values().filter(|pool| !pool.is_erasure()) {
            for pg in 0..pool.pg_num {
                mapped.insert((pool.id, pg), map.pg_osds(&hierarchy, pool, pg));
            }
        }
        let mut size: BTreeMap<(PoolId, u32), u64> = BTreeMap::new();
        for report in usage.values() {
            for (pg, bytes) in &report.pgs {
                let entry = size.entry(*pg).or_default();
                *entry = (*entry).max(*bytes);
            }
        }
        let backfillfull = u64::from(map.full_ratios.backfillfull);
        Cluster { map, usage, hierarchy, mapped, size, backfillfull }
    }

    /// `bytes` as per mille of `osd`'s store.
    fn permille(&self, bytes: u64, osd: OsdId) -> u64 {
        bytes * 1000 / self.usage[&osd].capacity_bytes
    }

    fn size_of(&self, pg: &(PoolId, u32)) -> u64 {
        self.size.get(pg).copied().unwrap_or(0)
    }

    /// Each OSD's use once the moves made are done (per mille): each PG it
    /// reports counts at its full size if the PG is mapped to it, else not
    /// at all (a stray copy, soon gone); one mapped to it that it does not
    /// report yet, or only in part (a backfill under way), counts whole.
    fn projected(&self, osds: &[OsdId]) -> BTreeMap<OsdId, u64> {
        // One pass over the PGs for every OSD's wanted bytes.
        let mut wanted: BTreeMap<OsdId, u64> = osds.iter().map(|osd| (*osd, 0)).collect();
        for (pg, mapped) in &self.mapped {
            for osd in mapped {
                if let Some(bytes) = wanted.get_mut(osd) {
                    *bytes += self.size_of(pg);
                }
            }
        }
        wanted
            .into_iter()
            .map(|(osd, wanted)| {
                let report = &self.usage[&osd];
                let reported: u64 = report.pgs.values().sum();
                let used = (report.used_permille * report.capacity_bytes / 1000 + wanted).saturating_sub(reported);
                (osd, used * 1000 / report.capacity_bytes)
            })
            .collect()
    }

    /// The upmap items that move PG `key` from `from` to `to`, if the
    /// monitor would take them.
    fn items(&self, key: (PoolId, u32), from: OsdId, to: OsdId) -> Option<Vec<(OsdId, OsdId)>> {
        let osds = &self.mapped[&key];
        let placed = self.map.placed_osds(&self.hierarchy, &self.map.pools[&key.0], key.1);
        let wanted: Vec<OsdId> = osds.iter().map(|osd| if *osd == from { to } else { *osd }).collect();
        if placed.len() != wanted.len() {
            return None;
        }
        let items = upmap::items_for(&placed, &wanted);
        upmap::may_set_placed(self.map, &self.hierarchy, key, &items).is_ok().then_some(items)
    }

    /// Pinned PGs whose backfill waits on a target past backfillfull,
    /// moved from it to the OSD with the most room that can take them.
    fn unstick(&self, settling: &BTreeSet<(PoolId, u32)>) -> Vec<Move> {
        let mut room: Vec<(u64, OsdId)> = self
            .usage
            .iter()
            .filter(|(osd, _)| {
                self.map.osds.get(osd).is_some_and(|o| o.up && o.is_in && o.fullness < Fullness::BackfillFull)
            })
            .map(|(osd, u)| (u.used_permille, *osd))
            .collect();
        room.sort_unstable();
        let mut moves = Vec::new();
        for (key, pin) in &self.map.pg_temp {
            if moves.len() == MAX_MOVES || settling.contains(key) {
                continue;
            }
            let Some(osds) = self.mapped.get(key) else { continue };
            // Its backfill targets: the up set's OSDs the pin does not name.
            let full = osds.iter().find(|osd| {
                !pin.contains(osd) && self.map.osds.get(osd).is_some_and(|o| o.fullness >= Fullness::BackfillFull)
            });
            let Some(&full) = full else { continue };
            let bytes = self.size_of(key);
            let mut sent = false;
            for (used, to) in room.iter_mut() {
                let after = *used + self.permille(bytes, *to);
                if osds.contains(to) || after >= self.backfillfull {
                    continue;
                }
                if let Some(items) = self.items(*key, full, *to) {
                    *used = after;
                    moves.push(Move { pool: key.0, pg: key.1, from: full, to: *to, bytes, items });
                    sent = true;
                    break;
                }
            }
            if sent {
                continue;
            }
            // No OSD has room for it: the move goes back to an OSD of the
            // pin, which holds the PG already (nothing to copy), so the PG
            // is clean again and frees what its other moves hold. Else a
            // full cluster given one more OSD could wait for good: the new
            // OSD past backfillfull with what it took, the old ones full.
            let holder =
                pin.iter().find(|osd| !osds.contains(osd) && self.map.osds.get(osd).is_some_and(|o| o.up && o.is_in));
            if let Some(&holder) = holder {
                if let Some(items) = self.items(*key, full, holder) {
                    moves.push(Move { pool: key.0, pg: key.1, from: full, to: holder, bytes, items });
                }
            }
        }
        moves
    }

    /// The best single move from the fullest OSD that can give to the
    /// emptiest that can take.
    fn next_move(&self, projected: &BTreeMap<OsdId, u64>, spread: u64, stay: &BTreeSet<(PoolId, u32)>) -> Option<Move> {
        let mut by_use: Vec<OsdId> = projected.keys().copied().collect();
        by_use.sort_by_key(|osd| (projected[osd], *osd));
        // The fullest few give, the emptiest few take: each pair looks at
        // every PG, so a large cluster must not try all pairs in one look.
        for &from in by_use.iter().rev().take(GIVERS) {
            for &to in by_use.iter().take(TAKERS) {
                let (high, low) = (projected[&from], projected[&to]);
                if high <= low + spread {
                    break;
                }
                if low >= self.backfillfull || self.map.osds[&to].fullness >= Fullness::BackfillFull {
                    continue; // backfill into it would wait
                }
                if let Some(found) = self.best_move(stay, (from, high), (to, low)) {
                    return Some(found);
                }
            }
        }
        None
    }

    /// The PG whose move from `from` to `to` lowers the higher of their
    /// two uses the most (ties: the one that leaves them closest).
    fn best_move(
        &self,
        stay: &BTreeSet<(PoolId, u32)>,
        (from, high): (OsdId, u64),
        (to, low): (OsdId, u64),
    ) -> Option<Move> {
        let mut best: Option<((u64, u64), Move)> = None;
        for (key, osds) in &self.mapped {
            if !osds.contains(&from) || osds.contains(&to) || stay.contains(key) {
                continue;
            }
            let bytes = self.size_of(key);
            if bytes == 0 {
                continue; // moving it changes nothing
            }
            let after_from = high.saturating_sub(self.permille(bytes, from));
            let after_to = low + self.permille(bytes, to);
            let score = (after_from.max(after_to), after_from.abs_diff(after_to));
            // It must lower the higher use, and not take the target past
            // backfillfull, as planned nor as it stands now (copies
            // leaving it still take room there until their PG is clean).
            let to_now = self.usage[&to].used_permille + self.permille(bytes, to);
            if score.0 >= high
                || after_to.max(to_now) >= self.backfillfull
                || best.as_ref().is_some_and(|(b, _)| *b <= score)
            {
                continue;
            }
            if let Some(items) = self.items(*key, from, to) {
                best = Some((score, Move { pool: key.0, pg: key.1, from, to, bytes, items }));
            }
        }
        best.map(|(_, found)| found)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn cluster(osds: u32, pg_num: u32) -> ClusterMap {
        let hosts: Vec<String> = (0..osds).map(|id| format!("h{id}")).collect();
        crate::test_map(&hosts.iter().map(String::as_str).collect::<Vec<_>>(), pg_num)
    }

    /// What each OSD would report if PG `pg` held `bytes(pg)` on each of its OSDs.
    fn reports(map: &ClusterMap, capacity: u64, bytes: impl Fn(u32) -> u64) -> BTreeMap<OsdId, OsdUsage> {
        let hierarchy = map.hierarchy();
        let pool = &map.pools[&1];
        let mut usage: BTreeMap<OsdId, OsdUsage> =
            map.osds.keys().map(|id| (*id, OsdUsage { capacity_bytes: capacity, ..OsdUsage::default() })).collect();
        for pg in 0..pool.pg_num {
            for osd in map.pg_osds(&hierarchy, pool, pg) {
                usage.get_mut(&osd).unwrap().pgs.insert((1, pg), bytes(pg));
            }
        }
        for report in usage.values_mut() {
            report.used_permille = report.pgs.values().sum::<u64>() * 1000 / capacity;
        }
        usage
    }

    fn spread(usage: &BTreeMap<OsdId, OsdUsage>) -> u64 {
        let uses: Vec<u64> = usage.values().map(|u| u.used_permille).collect();
        uses.iter().max().unwrap() - uses.iter().min().unwrap()
    }

    #[test]
    fn moves_narrow_the_spread_until_it_is_within_the_limit_and_then_stop() {
        let mut map = cluster(3, 32);
        // Uneven PGs: 0 to 5 objects of 4 MiB.
        let bytes = |pg: u32| u64::from((pg * 7 + 3) % 6) * 4 * MIB;
        let capacity = 256 * MIB;
        let before = spread(&reports(&map, capacity, bytes));
        let mut moves = 0;
        while let Some(found) = plan(&map, &reports(&map, capacity, bytes), &BTreeSet::new()) {
            let usage = reports(&map, capacity, bytes);
            assert!(found.len() <= MAX_MOVES);
            for one in &found {
                assert_eq!(usage[&one.from].pgs.get(&(one.pool, one.pg)), Some(&one.bytes));
            }
            map.run(&command(&found)).unwrap();
            // The pins the moves made: backfill ends, the pins go.
            map.pg_temp.clear();
            moves += found.len();
            assert!(moves < 50, "the balancer does not settle");
        }
        let after = spread(&reports(&map, capacity, bytes));
        assert!(after <= u64::from(map.balancer_max_spread), "{before} -> {after} per mille in {moves} moves");
        assert!(moves > 0, "nothing moved from a spread of {before}");
        let encoded = crate::codec::encode_map(&map);
        assert_eq!(crate::codec::decode_map(&encoded).unwrap(), map, "upmap items round-trip");
        // An OSD out: its items are ignored, its PGs placed anew.
        let mut out = map.clone();
        let target = map.pg_upmap.values().next().unwrap()[0].1;
        out.run(&Command::MarkOut { id: target }).unwrap();
        let hierarchy = out.hierarchy();
        for pg in 0..32 {
            assert!(!out.pg_osds(&hierarchy, &out.pools[&1], pg).contains(&target), "PG {pg} on the out osd.{target}");
        }
        // Every PG still has two copies on two OSDs.
        let hierarchy = map.hierarchy();
        for pg in 0..32 {
            let osds = map.pg_osds(&hierarchy, &map.pools[&1], pg);
            assert!(osds.len() == 2 && osds[0] != osds[1], "{osds:?}");
        }
    }

    #[test]
    fn nothing_moves_while_a_pg_moves_an_osd_is_unreported_the_pg_moved_lately_or_the_balancer_is_off() {
        let map = cluster(3, 16);
        let capacity = 256 * MIB;
        let lopsided = |pg: u32| if pg < 4 { 40 * MIB } else { 0 };
        let usage = reports(&map, capacity, lopsided);
        assert!(plan(&map, &usage, &BTreeSet::new()).is_some(), "a spread of {} per mille", spread(&usage));
        // A PG moving: nothing more moves.
        let mut pinned = map.clone();
        let hierarchy = map.hierarchy();
        let osds = map.pg_osds(&hierarchy, &map.pools[&1], 9);
        pinned.pg_temp.insert((1, 9), osds);
        assert_eq!(plan(&pinned, &usage, &BTreeSet::new()), None);
        // Moved lately: stays.
        let settling: BTreeSet<(PoolId, u32)> = (0..16).map(|pg| (1, pg)).collect();
        assert_eq!(plan(&map, &usage, &settling), None);
        let mut missing = usage.clone();
        missing.remove(&2);
        assert_eq!(plan(&map, &missing, &BTreeSet::new()), None);
        let mut off = map.clone();
        off.run(&Command::SetBalancer { max_spread_permille: 0 }).unwrap();
        assert_eq!(plan(&off, &usage, &BTreeSet::new()), None);
    }

    /// PG 5 of 4 OSDs moving onto `target` (its up set's second OSD),
    /// pinned to `kept` and `holder` (which holds its 8 MiB).
    struct StuckBackfill {
        map: ClusterMap,
        usage: BTreeMap<OsdId, OsdUsage>,
        up: Vec<OsdId>,
        kept: OsdId,
        target: OsdId,
        holder: OsdId,
    }

    /// That PG, with the OSDs `full(osd, target)` names past backfillfull.
    fn stuck_backfill(full: impl Fn(OsdId, OsdId) -> bool) -> StuckBackfill {
        let mut map = cluster(4, 16);
        let up = map.pg_osds(&map.hierarchy(), &map.pools[&1], 5);
        let (kept, target) = (up[0], up[1]);
        let holder = (0..4).find(|osd| !up.contains(osd)).unwrap();
        map.pg_temp.insert((1, 5), vec![kept, holder]);
        for osd in (0..4).filter(|osd| full(*osd, target)) {
            map.run(&Command::SetOsdFullness { id: osd, fullness: Fullness::BackfillFull }).unwrap();
        }
        let mut usage = reports(&map, 256 * MIB, |pg| if pg == 5 { 8 * MIB } else { MIB });
        usage.get_mut(&target).unwrap().pgs.remove(&(1, 5));
        usage.get_mut(&holder).unwrap().pgs.insert((1, 5), 8 * MIB);
        StuckBackfill { map, usage, up, kept, target, holder }
    }

    #[test]
    fn a_backfill_waiting_on_a_full_target_is_sent_elsewhere() {
        // Only the target is past backfillfull: the backfill waits.
        let StuckBackfill { mut map, mut usage, up, target, .. } = stuck_backfill(|osd, target| osd == target);
        let pool = map.pools[&1].clone();
        usage.get_mut(&target).unwrap().used_permille = 910;
        let moves = plan(&map, &usage, &BTreeSet::new()).expect("the stuck backfill goes elsewhere");
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!((moves[0].pg, moves[0].from), (5, target));
        assert!(moves[0].to != target && !up.contains(&moves[0].to), "{moves:?}");
        map.run(&command(&moves)).unwrap();
        assert!(!map.pg_osds(&map.hierarchy(), &pool, 5).contains(&target));
    }

    /// As above, but no OSD has room for it: it goes back onto the OSD of
    /// its pin that holds it, so that it is clean again without a copy.
    #[test]
    fn a_backfill_waiting_on_a_full_target_with_no_room_anywhere_goes_back_to_its_holder() {
        // Every OSD past backfillfull: no room to send it to.
        let StuckBackfill { mut map, mut usage, kept, target, holder, .. } = stuck_backfill(|_, _| true);
        let pool = map.pools[&1].clone();
        for report in usage.values_mut() {
            report.used_permille = 930;
        }
        let moves = plan(&map, &usage, &BTreeSet::new()).expect("the stuck backfill goes back");
        assert_eq!(moves.len(), 1, "{moves:?}");
        assert_eq!((moves[0].pg, moves[0].from, moves[0].to), (5, target, holder), "{moves:?}");
        map.run(&command(&moves)).unwrap();
        let now = map.pg_osds(&map.hierarchy(), &pool, 5);
        assert!(now.contains(&kept) && now.contains(&holder), "on its holders again: {now:?}");
        // Settling (moved lately): it stays.
        let settling: BTreeSet<(PoolId, u32)> = [(1, 5)].into_iter().collect();
        let mut again = map.clone();
        again.pg_temp.insert((1, 5), vec![kept, holder]);
        again.pg_upmap.clear();
        assert_eq!(plan(&again, &usage, &settling), None);
    }

    #[test]
    fn a_move_under_way_counts_as_made() {
        let mut map = cluster(3, 16);
        let capacity = 256 * MIB;
        let lopsided = |pg: u32| if pg < 4 { 40 * MIB } else { 0 };
        let usage = reports(&map, capacity, lopsided);
        let first = plan(&map, &usage, &BTreeSet::new()).unwrap();
        let moved: Vec<(PoolId, u32)> = first.iter().map(|m| (m.pool, m.pg)).collect();
        map.run(&command(&first)).unwrap();
        map.pg_temp.clear();
        // The reports from before the moves (the copies not yet moved): the
        // plan sees the moves as done, and does not repeat them.
        for next in plan(&map, &usage, &BTreeSet::new()).unwrap_or_default() {
            assert!(!moved.contains(&(next.pool, next.pg)), "{next:?} again");
        }
    }
}
