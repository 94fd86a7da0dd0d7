//! The map's state machine and encoding: commands make one epoch each,
//! incremental deltas rebuild the same map, encodings round-trip and
//! reject corruption, placement follows up/down and in/out.

use duplex_map::codec::{decode_delta, decode_map, encode_delta, encode_map};
use duplex_map::{primary_of, ActiveSet, ClusterMap, Command, CommandError, ErasureCode, MapDelta, NO_OSD};
use proptest::prelude::*;

const ONE: u32 = 1 << 16;

fn boot(id: u32, host: &str) -> Command {
    Command::OsdBoot { id, addr: format!("127.0.0.1:{}", 6800 + id), host: host.into(), weight: ONE }
}

fn small_cluster() -> ClusterMap {
    let mut map = ClusterMap::new([1; 16]);
    for id in 0..6 {
        map.run(&boot(id, &format!("host-{}", id / 2))).unwrap();
    }
    map.run(&Command::PoolCreate { name: "rbd".into(), size: 2, min_size: 1, pg_num: 64 }).unwrap();
    map
}

#[test]
fn each_effective_command_is_one_epoch_and_no_ops_are_none() {
    let mut map = small_cluster();
    assert_eq!(map.epoch, 7);
    assert_eq!(map.hosts.len(), 3);
    assert_eq!(map.run(&Command::MarkUp { id: 0 }), Ok(None), "already up: no new epoch");
    let delta = map.run(&Command::MarkDown { id: 0 }).unwrap().unwrap();
    assert_eq!((delta.epoch, map.epoch), (8, 8));
    assert!(!map.osds[&0].up);
    assert_eq!(map.osds[&0].state_epoch, 8);
    assert_eq!(map.run(&Command::MarkDown { id: 42 }), Err(CommandError::NoSuchOsd(42)));
    assert_eq!(
        map.run(&Command::PoolCreate { name: "rbd".into(), size: 2, min_size: 1, pg_num: 8 }),
        Err(CommandError::PoolExists("rbd".into()))
    );
    assert!(matches!(
        map.run(&Command::PoolCreate { name: "x".into(), size: 2, min_size: 3, pg_num: 8 }),
        Err(CommandError::Invalid(_))
    ));
    assert!(matches!(
        map.run(&Command::PoolSetPgNum { name: "rbd".into(), pg_num: 32 }),
        Err(CommandError::Invalid(_))
    ));
    map.run(&Command::PoolSetPgNum { name: "rbd".into(), pg_num: 100 }).unwrap();
    assert_eq!(map.pool_by_name("rbd").unwrap().pg_num, 100);
    map.run(&Command::PoolDelete { name: "rbd".into() }).unwrap();
    assert!(map.pool_by_name("rbd").is_none());
    assert_eq!(map.epoch, 10, "refused commands made no epoch");
}

#[test]
fn a_delta_applies_only_to_the_epoch_before_it() {
    let mut map = small_cluster();
    let delta = map.execute(&Command::MarkOut { id: 1 }).unwrap().unwrap();
    let mut stale = delta.clone();
    stale.epoch += 1;
    assert!(map.apply(&stale).is_err());
    map.apply(&delta).unwrap();
    assert!(map.apply(&delta).is_err(), "applying twice is refused");
}

#[test]
fn placement_follows_down_and_out() {
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    let hierarchy = map.hierarchy();
    let before: Vec<Vec<u32>> = (0..64).map(|pg| map.pg_osds(&hierarchy, &pool, pg)).collect();
    assert!(before.iter().all(|set| set.len() == 2));
    let (pg, victim) = (0..64).map(|pg| (pg, before[pg as usize][0])).next().unwrap();

    // Down: same mapping, the victim leaves the acting set (the next replica becomes primary).
    map.run(&Command::MarkDown { id: victim }).unwrap();
    let hierarchy = map.hierarchy();
    assert_eq!(map.pg_osds(&hierarchy, &pool, pg), before[pg as usize]);
    assert_eq!(map.acting(&hierarchy, &pool, pg), vec![before[pg as usize][1]]);

    // Out: the PG maps elsewhere; PGs that did not use the victim stay put.
    map.run(&Command::MarkOut { id: victim }).unwrap();
    let hierarchy = map.hierarchy();
    for pg in 0..64u32 {
        let now = map.pg_osds(&hierarchy, &pool, pg);
        assert!(!now.contains(&victim));
        if !before[pg as usize].contains(&victim) {
            assert_eq!(now, before[pg as usize], "PG {pg} moved although it never used OSD {victim}");
        }
    }
}

fn command_strategy() -> impl Strategy<Value = Command> {
    prop_oneof![
        (0u32..8, 0u8..4).prop_map(|(id, h)| boot(id, &format!("h{h}"))),
        (0u32..9).prop_map(|id| Command::MarkDown { id }),
        (0u32..9).prop_map(|id| Command::MarkUp { id }),
        (0u32..9).prop_map(|id| Command::MarkOut { id }),
        (0u32..9).prop_map(|id| Command::MarkIn { id }),
        (0u8..3, 0u8..5, 0u8..5, 0u32..300).prop_map(|(n, size, min_size, pg_num)| Command::PoolCreate {
            name: format!("p{n}"),
            size,
            min_size,
            pg_num
        }),
        (0u8..3, 0u8..5, 0u8..3, 0u32..3, proptest::option::of(0u8..6), 0u32..300).prop_map(
            |(n, k, m, unit, min_size, pg_num)| Command::PoolCreateErasure {
                name: format!("p{n}"),
                code: ErasureCode { k, m, stripe_unit: [4096, 65536, 6144][unit as usize] },
                min_size,
                pg_num
            }
        ),
        (0u8..3, 0u8..5, 0u8..5, 0u32..300, 0u32..70_000).prop_map(|(n, size, min_size, pg_num, max_lag_ms)| {
            Command::PoolCreateEventual {
                name: format!("p{n}"),
                size,
                min_size,
                pg_num,
                eventual: duplex_map::Eventual { max_lag_ms },
            }
        }),
        (0u8..3, prop_oneof![Just("250ms"), Just("2s"), Just("0"), Just("x")]).prop_map(|(n, lag)| Command::PoolSet {
            name: format!("p{n}"),
            key: "max_lag".into(),
            value: lag.into()
        }),
        (0u8..3).prop_map(|n| Command::PoolDelete { name: format!("p{n}") }),
        (0u8..3, 0u32..600).prop_map(|(n, pg_num)| Command::PoolSetPgNum { name: format!("p{n}"), pg_num }),
        (0u64..40, 1u32..4, 0u32..300, proptest::collection::vec(0u32..9, 0..3))
            .prop_map(|(interval, pool, pg, up)| Command::ClearPgTemp { interval, pgs: vec![(pool, pg, up)] }),
        (0u64..40, 1u32..4, 0u32..300, proptest::collection::vec(0u32..9, 0..3))
            .prop_map(|(interval, pool, pg, osds)| Command::HandOver { interval, pgs: vec![(pool, pg, osds)] }),
        (0u32..9, 0u8..4).prop_map(|(id, level)| Command::SetOsdFullness {
            id,
            fullness: [
                duplex_map::Fullness::Normal,
                duplex_map::Fullness::NearFull,
                duplex_map::Fullness::BackfillFull,
                duplex_map::Fullness::Full
            ][usize::from(level)]
        }),
        (0u16..1100, 0u16..1100, 0u16..1100).prop_map(|(nearfull, backfillfull, full)| Command::SetFullRatios {
            nearfull,
            backfillfull,
            full
        }),
        (1u32..4, 0u32..300, proptest::collection::vec((0u32..9, 0u32..9), 0..3))
            .prop_map(|(pool, pg, items)| Command::SetPgUpmap { pgs: vec![(pool, pg, items)] }),
        (0u16..1100).prop_map(|max_spread_permille| Command::SetBalancer { max_spread_permille }),
    ]
}

proptest! {
    #[test]
    fn deltas_rebuild_the_same_map_and_everything_round_trips(commands in proptest::collection::vec(command_strategy(), 0..60)) {
        let mut map = ClusterMap::new([9; 16]);
        let mut deltas: Vec<MapDelta> = Vec::new();
        for command in &commands {
            let epoch = map.epoch;
            match map.run(command) {
                Ok(Some(delta)) => {
                    prop_assert_eq!(map.epoch, epoch + 1);
                    deltas.push(delta);
                }
                Ok(None) | Err(_) => prop_assert_eq!(map.epoch, epoch),
            }
            prop_assert!(map.validate().is_ok(), "{:?}", map.validate());
        }
        // A subscriber that only ever saw deltas holds the same map.
        let mut follower = ClusterMap::new([9; 16]);
        for delta in &deltas {
            let decoded = decode_delta(&encode_delta(delta)).unwrap();
            prop_assert_eq!(&decoded, delta);
            follower.apply(&decoded).unwrap();
        }
        prop_assert_eq!(&follower, &map);
        prop_assert_eq!(decode_map(&encode_map(&map)).unwrap(), map);
    }

    #[test]
    fn corrupt_encodings_are_refused(commands in proptest::collection::vec(command_strategy(), 1..20), flip in any::<usize>()) {
        let mut map = ClusterMap::new([9; 16]);
        for command in &commands {
            let _ = map.run(command);
        }
        let mut bytes = encode_map(&map);
        let bit = flip % (bytes.len() * 8);
        bytes[bit / 8] ^= 1 << (bit % 8);
        prop_assert!(decode_map(&bytes).is_err());
    }

    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = decode_map(&bytes);
        let _ = decode_delta(&bytes);
        // Valid framing around a garbage body, to reach the body decoder.
        let mut framed = b"DPXM\x02\x00".to_vec();
        framed.extend_from_slice(&bytes);
        let crc = crc32c::crc32c(&framed);
        framed.extend_from_slice(&crc.to_le_bytes());
        let _ = decode_map(&framed);
    }
}

#[test]
fn a_boot_is_a_new_incarnation_even_while_marked_up() {
    let mut map = small_cluster();
    let before = map.osds[&1].state_epoch;
    let delta = map.run(&boot(1, "host-0")).unwrap().expect("a re-boot is a change");
    assert_eq!(map.osds[&1].state_epoch, delta.epoch);
    assert!(delta.epoch > before);
    assert!(map.osds[&1].up);
}

/// A primary whose copy needs a backfill hands its PG to another member:
/// the PG is pinned to its acting set in that order, and the pin goes once
/// the old primary is filled, like any other.
#[test]
fn a_primary_hands_its_pg_over_to_another_member() {
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    let hierarchy = map.hierarchy();
    let pg = 5;
    let acting = map.acting(&hierarchy, &pool, pg);
    assert!(acting.len() >= 2, "{acting:?}");
    let interval = map.epoch;
    let mut reordered = acting.clone();
    reordered.rotate_left(1);
    let hand_over = |osds: Vec<u32>, interval| Command::HandOver { interval, pgs: vec![(pool.id, pg, osds)] };
    assert_eq!(map.run(&hand_over(acting.clone(), interval)), Ok(None), "the same primary: nothing to hand over");
    let mut stranger = reordered.clone();
    stranger[0] = (0..9).find(|osd| !acting.contains(osd)).unwrap();
    assert_eq!(map.run(&hand_over(stranger, interval)), Ok(None), "only to OSDs of the acting set");
    assert_eq!(map.run(&hand_over(reordered[1..].to_vec(), interval)), Ok(None), "with all of them");
    assert_eq!(map.run(&hand_over(reordered.clone(), interval + 5)), Ok(None), "an interval the map has not reached");
    map.run(&hand_over(reordered.clone(), interval)).unwrap().unwrap();
    let hierarchy = map.hierarchy();
    assert_eq!(map.acting(&hierarchy, &pool, pg), reordered);
    assert!(map.pg_sets(&hierarchy, &pool, pg).backfill.is_empty(), "no new OSD to fill");
    // The new primary filled the old one: the up set (the old order) takes over.
    let up = map.up_set(&hierarchy, &pool, pg);
    assert_eq!(up, acting);
    map.run(&Command::ClearPgTemp { interval: map.epoch, pgs: vec![(pool.id, pg, up.clone())] }).unwrap().unwrap();
    assert_eq!(map.acting(&map.hierarchy(), &pool, pg), acting);
    // A restart of a member since the interval the primary peered: left.
    let interval = map.epoch;
    map.run(&boot(reordered[0], &format!("host-{}", reordered[0] / 2))).unwrap().unwrap();
    assert!(map.osds[&reordered[0]].state_epoch > interval);
    assert_eq!(map.run(&hand_over(reordered, interval)), Ok(None), "a member restarted since");
}

#[test]
fn a_hand_over_back_to_the_placements_own_order_leaves_no_pin() {
    // Simulator seed 10222: a PG was handed to its second OSD (a pin), that
    // one lost its copy and handed it back to the first, in the up set's
    // own order. A pin equal to the up set changes nothing, and its primary
    // never asks for it to go (it is not pinned away from its up set): the
    // PG stayed pinned for good. The monitor keeps no such pin.
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    let pg = 5;
    let placed = map.acting(&map.hierarchy(), &pool, pg);
    let mut reordered = placed.clone();
    reordered.rotate_left(1);
    let hand_over = |osds: Vec<u32>, interval| Command::HandOver { interval, pgs: vec![(pool.id, pg, osds)] };
    map.run(&hand_over(reordered.clone(), map.epoch)).unwrap().unwrap();
    assert_eq!(map.pg_temp.get(&(pool.id, pg)), Some(&reordered));
    let sets = map.pg_sets(&map.hierarchy(), &pool, pg);
    assert!(sets.pinned && sets.acting == reordered);
    map.run(&hand_over(placed.clone(), map.epoch)).unwrap().unwrap();
    assert_eq!(map.pg_temp.get(&(pool.id, pg)), None, "no pin equal to the placement");
    let sets = map.pg_sets(&map.hierarchy(), &pool, pg);
    assert!(!sets.pinned);
    assert_eq!(sets.acting, placed);
    assert_eq!(sets.up, placed);
}

#[test]
fn a_pin_keeps_the_osds_of_the_last_active_set_even_while_they_are_down() {
    // Simulator seed 30680: a PG served by osd.A alone (its record) while
    // its other OSD was down; osd.A went down too, and an operator's mark
    // out moved the PG. The pin named only the acting set of that moment,
    // so osd.A, back up, was a backfill target: fenced, never heard, and
    // the PG waited for it for good.
    let map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    let mut checked = 0;
    for pg in 0..64 {
        let mut map = map.clone();
        let acting = map.acting(&map.hierarchy(), &pool, pg);
        let (a, b) = (acting[0], acting[1]);
        map.run(&Command::MarkDown { id: b }).unwrap();
        map.run(&Command::RecordActive { pgs: vec![(pool.id, pg, map.epoch, vec![a])] }).unwrap().unwrap();
        map.run(&boot(b, &format!("host-{}", b / 2))).unwrap();
        map.run(&Command::MarkDown { id: a }).unwrap();
        map.run(&Command::MarkOut { id: b }).unwrap();
        let Some(pin) = map.pg_temp.get(&(pool.id, pg)).cloned() else { continue };
        checked += 1;
        assert!(pin.contains(&a), "PG {pg}: the pin {pin:?} names the OSD that holds it, {a}");
        map.run(&boot(a, &format!("host-{}", a / 2))).unwrap();
        let sets = map.pg_sets(&map.hierarchy(), &pool, pg);
        assert!(sets.acting.contains(&a) && !sets.backfill.contains(&a), "PG {pg}: {sets:?}");
    }
    assert!(checked > 0, "no PG was pinned: the test tests nothing");
    map.validate().unwrap();
}

/// The pins of `map`'s pool "rbd", as (pg, osds).
fn pins(map: &ClusterMap) -> Vec<(u32, Vec<u32>)> {
    map.pg_temp.iter().map(|((_, pg), osds)| (*pg, osds.clone())).collect()
}

#[test]
fn a_new_osd_is_backfilled_while_the_old_acting_sets_serve() {
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    let hierarchy = map.hierarchy();
    let before: Vec<Vec<u32>> = (0..64).map(|pg| map.acting(&hierarchy, &pool, pg)).collect();
    assert!(map.pg_temp.is_empty());

    map.run(&boot(6, "host-3")).unwrap();
    let hierarchy = map.hierarchy();
    let moved: Vec<u32> = (0..64).filter(|pg| map.up_set(&hierarchy, &pool, *pg).contains(&6)).collect();
    assert!(!moved.is_empty(), "a fourth host takes some PGs");
    for pg in 0..64u32 {
        assert_eq!(map.acting(&hierarchy, &pool, pg), before[pg as usize], "PG {pg}: the same OSDs serve it");
        let targets = map.pg_sets(&hierarchy, &pool, pg).backfill;
        if moved.contains(&pg) {
            assert_eq!(map.pg_temp[&(pool.id, pg)], before[pg as usize]);
            assert_eq!(targets, vec![6], "PG {pg}: the new OSD is its one backfill target");
        } else {
            assert!(!map.pg_temp.contains_key(&(pool.id, pg)) && targets.is_empty());
        }
    }

    // The primary of a moved PG backfilled it: the up set takes over.
    let pg = moved[0];
    let up = map.up_set(&hierarchy, &pool, pg);
    let interval = map.epoch;
    let stale = Command::ClearPgTemp { interval: interval - 1, pgs: vec![(pool.id, pg, up.clone())] };
    assert_eq!(map.run(&stale), Ok(None), "osd.6 booted after that interval began: it was not backfilled then");
    let wrong_up = Command::ClearPgTemp { interval, pgs: vec![(pool.id, pg, vec![6])] };
    assert_eq!(map.run(&wrong_up), Ok(None), "not the up set the primary backfilled");
    map.run(&Command::ClearPgTemp { interval, pgs: vec![(pool.id, pg, up.clone())] }).unwrap().unwrap();
    assert_eq!(map.acting(&map.hierarchy(), &pool, pg), up);
    assert_eq!(map.pg_temp.len(), moved.len() - 1);
}

/// A pinned PG whose up set is partly or wholly down: its primary went
/// active with nothing to fill, and asked for the pin to go with the up set
/// it saw (at worst empty).
/// Granting it recorded an empty last active set ("marked lost"), and the
/// next OSD up served its own old copy while the pin's OSD held every
/// write (simulator seed 5300047, size 2, min_size 1). The pin stays.
#[test]
fn a_pin_stays_while_its_up_set_is_not_whole() {
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    map.run(&boot(6, "host-3")).unwrap();
    let hierarchy = map.hierarchy();
    let pg = (0..64).find(|pg| map.pg_temp.contains_key(&(pool.id, *pg))).expect("a pinned PG");
    let temp = map.pg_temp[&(pool.id, pg)].clone();
    for osd in map.up_set(&hierarchy, &pool, pg) {
        if !temp.contains(&osd) {
            map.run(&Command::MarkDown { id: osd }).unwrap();
        }
    }
    // Part of the up set down (the primary sees no target to fill): the
    // pin stays, or its other whole copies would leave with it.
    let partial = map.up_set(&map.hierarchy(), &pool, pg);
    assert!(!partial.is_empty(), "the pin shares an OSD with the up set (the case needs one)");
    let clear = Command::ClearPgTemp { interval: map.epoch, pgs: vec![(pool.id, pg, partial)] };
    assert_eq!(map.run(&clear), Ok(None), "a pin dropped while an up-set OSD is down");
    // The pin's OSDs that are also in the up set go down last: all of it is down now.
    for osd in map.up_set(&map.hierarchy(), &pool, pg) {
        map.run(&Command::MarkDown { id: osd }).unwrap();
    }
    let hierarchy = map.hierarchy();
    assert!(map.up_set(&hierarchy, &pool, pg).is_empty(), "the whole up set is down");
    assert!(!map.acting(&hierarchy, &pool, pg).is_empty(), "a pinned OSD still serves");
    let record = map.active_sets.get(&(pool.id, pg)).cloned();
    let clear = Command::ClearPgTemp { interval: map.epoch, pgs: vec![(pool.id, pg, Vec::new())] };
    assert_eq!(map.run(&clear), Ok(None), "a pin dropped for an empty up set");
    assert!(map.pg_temp.contains_key(&(pool.id, pg)), "the pin stays");
    assert_eq!(map.active_sets.get(&(pool.id, pg)).cloned(), record, "no empty record");
    map.validate().unwrap();
}

#[test]
fn pins_follow_failures_and_further_moves() {
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    map.run(&boot(6, "host-3")).unwrap();
    let pinned = pins(&map);
    let (pg, temp) = pinned[0].clone();

    // A pinned OSD going down leaves the rest of the pin serving.
    map.run(&Command::MarkDown { id: temp[0] }).unwrap();
    assert_eq!(map.acting(&map.hierarchy(), &pool, pg), temp[1..].to_vec());
    assert_eq!(map.pg_temp[&(pool.id, pg)], temp, "the pin stays while one of its OSDs is up");
    // With every pinned OSD down the pin stays (they may hold the only
    // whole copy) and the PG waits; an OSD of the pin that comes back
    // serves again.
    map.run(&Command::MarkDown { id: temp[1] }).unwrap();
    assert_eq!(map.pg_temp[&(pool.id, pg)], temp);
    assert!(map.acting(&map.hierarchy(), &pool, pg).is_empty());
    map.run(&Command::MarkOut { id: temp[1] }).unwrap();
    assert_eq!(map.pg_temp[&(pool.id, pg)], temp, "not even placement moves a pin none of whose OSDs is up");
    map.run(&boot(temp[1], &format!("host-{}", temp[1] / 2))).unwrap();
    assert_eq!(map.acting(&map.hierarchy(), &pool, pg), vec![temp[1]]);

    // The new OSD leaves again before its backfill ended: the PGs it took
    // go back where they were and need no pin.
    let mut map = small_cluster();
    let before: Vec<Vec<u32>> = (0..64).map(|pg| map.acting(&map.hierarchy(), &pool, pg)).collect();
    map.run(&boot(6, "host-3")).unwrap();
    assert!(!map.pg_temp.is_empty());
    map.run(&Command::MarkOut { id: 6 }).unwrap();
    assert!(map.pg_temp.is_empty(), "{:?}", pins(&map));
    for pg in 0..64u32 {
        assert_eq!(map.acting(&map.hierarchy(), &pool, pg), before[pg as usize]);
    }

    // Marking an OSD out pins its PGs to their old acting sets, the
    // leaving OSD included: it still holds the data.
    let mut map = small_cluster();
    let hierarchy = map.hierarchy();
    let used: Vec<u32> = (0..64).filter(|pg| map.acting(&hierarchy, &pool, *pg).contains(&1)).collect();
    map.run(&Command::MarkOut { id: 1 }).unwrap();
    for pg in used {
        assert!(map.pg_temp[&(pool.id, pg)].contains(&1), "PG {pg}");
        assert!(!map.pg_sets(&map.hierarchy(), &pool, pg).backfill.is_empty());
    }
}

#[test]
fn a_pg_records_only_members_of_its_current_acting_set_and_records_only_move_forward() {
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    let pg = 5;
    let acting_now = |map: &ClusterMap| map.acting(&map.hierarchy(), &pool, pg);
    let record =
        |interval: u64, osds: &[u32]| Command::RecordActive { pgs: vec![(pool.id, pg, interval, osds.to_vec())] };
    let acting = acting_now(&map);
    assert_eq!(acting.len(), 2);
    let interval = map.epoch;
    let strangers: Vec<u32> = (0..6).filter(|o| !acting.contains(o)).take(2).collect();
    assert_eq!(map.run(&record(interval, &strangers)), Ok(None), "not the PG's acting set");
    assert_eq!(map.run(&record(interval + 1, &acting)), Ok(None), "an interval from the future");
    assert_eq!(map.run(&record(interval, &acting[1..])), Ok(None), "the acting primary first");
    let reversed: Vec<u32> = acting.iter().rev().copied().collect();
    assert_eq!(map.run(&record(interval, &reversed)), Ok(None), "the acting primary first");
    // A member filled in the background is recorded once its fill ends (the
    // PG peers again in the same interval): the whole members first.
    map.run(&record(interval, &acting[..1])).unwrap().expect("the whole members recorded");
    map.run(&record(interval, &acting)).unwrap().expect("recorded");
    assert_eq!(map.active_sets[&(pool.id, pg)], ActiveSet { since: interval, osds: acting.clone() });
    assert_eq!(map.run(&record(interval, &acting)), Ok(None), "already recorded: no new epoch");

    // A member fails: the primary of the next interval records the survivor.
    map.run(&Command::MarkDown { id: acting[1] }).unwrap();
    assert_eq!(acting_now(&map), acting[..1]);
    assert_eq!(map.run(&record(interval, &acting)), Ok(None), "the old interval's set is not acting any more");
    let degraded_since = map.epoch;
    map.run(&record(degraded_since, &acting[..1])).unwrap().expect("recorded");
    // It comes back: a late ask from the first interval cannot undo the record.
    map.run(&boot(acting[1], &format!("host-{}", acting[1] / 2))).unwrap();
    assert_eq!(acting_now(&map), acting);
    assert_eq!(map.run(&record(interval, &acting)), Ok(None), "older than the record in place");
    assert_eq!(map.active_sets[&(pool.id, pg)].osds, acting[..1]);

    // The survivor goes down too: the PG is down, waiting for it, even
    // though the other member is up (it missed the survivor's writes).
    assert_eq!(duplex_map::active_set::down_waiting_for(&map, pool.id, pg), None);
    map.run(&Command::MarkDown { id: acting[0] }).unwrap();
    assert_eq!(duplex_map::active_set::down_waiting_for(&map, pool.id, pg), Some(&acting[..1]));
    assert!(matches!(map.run(&Command::MarkLost { id: acting[1] }), Err(CommandError::Invalid(_))), "up: not lost");
    // The operator gives its copy up: the PG takes the best one left.
    map.run(&Command::MarkLost { id: acting[0] }).unwrap().expect("a set named it");
    assert_eq!(map.active_sets[&(pool.id, pg)], ActiveSet { since: degraded_since, osds: vec![] });
    assert_eq!(duplex_map::active_set::down_waiting_for(&map, pool.id, pg), None);
    assert_eq!(map.run(&Command::MarkLost { id: acting[0] }), Ok(None), "nothing left to give up");
    map.validate().unwrap();
    assert_eq!(decode_map(&encode_map(&map)).unwrap(), map);
}

#[test]
fn a_dropped_pin_records_the_up_set_and_a_lost_osd_leaves_pins() {
    let mut map = small_cluster();
    let pool = map.pool_by_name("rbd").unwrap().clone();
    map.run(&boot(6, "host-3")).unwrap();
    let pg = pins(&map)[0].0;
    let up = map.up_set(&map.hierarchy(), &pool, pg);
    let interval = map.epoch;
    let delta = map.run(&Command::ClearPgTemp { interval, pgs: vec![(pool.id, pg, up.clone())] }).unwrap().unwrap();
    assert!(!map.pg_temp.contains_key(&(pool.id, pg)));
    assert_eq!(map.active_sets[&(pool.id, pg)], ActiveSet { since: delta.epoch, osds: up }, "filled: they hold it all");

    // Every OSD of a pin down, then lost: the pin goes, and the up set
    // serves what it has.
    let (pg, pin) = pins(&map)[0].clone();
    for osd in &pin {
        map.run(&Command::MarkDown { id: *osd }).unwrap();
    }
    assert!(map.acting(&map.hierarchy(), &pool, pg).is_empty(), "pinned to down OSDs: waits");
    for osd in &pin {
        map.run(&Command::MarkLost { id: *osd }).unwrap();
    }
    assert!(!map.pg_temp.contains_key(&(pool.id, pg)));
    assert_eq!(map.acting(&map.hierarchy(), &pool, pg), map.up_set(&map.hierarchy(), &pool, pg));
    map.validate().unwrap();
}

#[test]
fn osds_report_their_fullness_against_ratios_the_operator_sets() {
    use duplex_map::{FullRatios, Fullness};
    let mut map = small_cluster();
    let ratios = FullRatios::default();
    assert_eq!(map.full_ratios, ratios);
    assert_eq!(ratios.classify(849), Fullness::Normal);
    assert_eq!(ratios.classify(850), Fullness::NearFull);
    assert_eq!(ratios.classify(900), Fullness::BackfillFull);
    assert_eq!(ratios.classify(1000), Fullness::Full);
    let full = Command::SetOsdFullness { id: 1, fullness: Fullness::Full };
    let delta = map.execute(&full).unwrap().expect("a change");
    map.apply(&delta).unwrap();
    assert_eq!(map.osds[&1].fullness, Fullness::Full);
    assert!(map.execute(&full).unwrap().is_none(), "the same report again changes nothing");
    // A restart keeps what the store reported until it reports again.
    let delta = map.execute(&boot(1, "h1")).unwrap().unwrap();
    map.apply(&delta).unwrap();
    assert_eq!(map.osds[&1].fullness, Fullness::Full);
    // Ratios must stay ordered, within 100%.
    let refused = map.execute(&Command::SetFullRatios { nearfull: 950, backfillfull: 900, full: 960 });
    assert!(matches!(refused, Err(CommandError::Invalid(_))), "{refused:?}");
    assert!(map.execute(&Command::SetFullRatios { nearfull: 850, backfillfull: 900, full: 1001 }).is_err());
    let delta = map.execute(&Command::SetFullRatios { nearfull: 500, backfillfull: 600, full: 700 }).unwrap().unwrap();
    map.apply(&delta).unwrap();
    assert_eq!(map.full_ratios, FullRatios { nearfull: 500, backfillfull: 600, full: 700 });
    let decoded = decode_map(&encode_map(&map)).unwrap();
    assert_eq!(decoded, map, "fullness and ratios round-trip");
}

fn ec(k: u8, m: u8) -> ErasureCode {
    ErasureCode { k, m, stripe_unit: 4096 }
}

#[test]
fn an_erasure_coded_pool_is_refused_with_the_reason_before_anything_is_created() {
    let mut map = small_cluster(); // 6 OSDs on 3 hosts
    let refused = |map: &mut ClusterMap, code: ErasureCode, min_size: Option<u8>| {
        let epoch = map.epoch;
        let command = Command::PoolCreateErasure { name: "cold".into(), code, min_size, pg_num: 16 };
        let err = map.run(&command).expect_err("refused");
        assert_eq!(map.epoch, epoch, "a refused pool made an epoch");
        assert!(map.pool_by_name("cold").is_none());
        err.to_string()
    };
    let too_wide = refused(&mut map, ec(2, 2), None);
    assert!(too_wide.contains("2+2") && too_wide.contains("3 hosts have"), "{too_wide}");
    assert!(refused(&mut map, ec(1, 1), None).contains("k >= 2"));
    assert!(refused(&mut map, ec(2, 0), None).contains("m >= 1"));
    assert!(refused(&mut map, ec(8, 4), None).contains("at most 10"));
    let unit = refused(&mut map, ErasureCode { k: 2, m: 1, stripe_unit: 6144 }, None);
    assert!(unit.contains("power of two"), "{unit}");
    assert!(refused(&mut map, ec(2, 1), Some(1)).contains("below k"));
    // Out OSDs are no failure domain: a host of only out OSDs does not count.
    let mut out = map.clone();
    out.run(&Command::MarkOut { id: 4 }).unwrap();
    out.run(&Command::MarkOut { id: 5 }).unwrap();
    assert!(refused(&mut out, ec(2, 1), None).contains("2 hosts have"));

    map.run(&Command::PoolCreateErasure { name: "cold".into(), code: ec(2, 1), min_size: None, pg_num: 16 }).unwrap();
    let pool = map.pool_by_name("cold").unwrap().clone();
    assert_eq!((pool.size, pool.min_size, pool.erasure), (3, 3, Some(ec(2, 1))), "min_size defaults to k + 1");
    let encoded = encode_map(&map);
    assert_eq!(decode_map(&encoded).unwrap(), map);
}

#[test]
fn an_erasure_coded_pgs_sets_keep_their_positions_through_down_and_out() {
    let mut map = ClusterMap::new([1; 16]);
    for id in 0..5 {
        map.run(&boot(id, &format!("host-{id}"))).unwrap();
    }
    map.run(&Command::PoolCreateErasure { name: "cold".into(), code: ec(2, 1), min_size: None, pg_num: 32 }).unwrap();
    let pool = map.pool_by_name("cold").unwrap().clone();
    let hierarchy = map.hierarchy();
    let before: Vec<Vec<u32>> = (0..32).map(|pg| map.acting(&hierarchy, &pool, pg)).collect();
    for set in &before {
        assert_eq!(set.len(), 3);
        assert!(!set.contains(&NO_OSD), "5 hosts fill every position: {set:?}");
    }
    // Down: the position becomes a hole, the others stay; the primary is
    // the first position that has an OSD.
    let victim = before[0][0];
    let mut down = map.clone();
    down.run(&Command::MarkDown { id: victim }).unwrap();
    let hierarchy = down.hierarchy();
    for (pg, old) in before.iter().enumerate() {
        let now = down.acting(&hierarchy, &pool, pg as u32);
        let expected: Vec<u32> = old.iter().map(|o| if *o == victim { NO_OSD } else { *o }).collect();
        assert_eq!(now, expected, "PG {pg}");
        assert_eq!(primary_of(&now), expected.iter().copied().find(|o| *o != NO_OSD));
        let sets = down.pg_sets(&hierarchy, &pool, pg as u32);
        assert!(sets.backfill.is_empty());
    }
    // Out: only the positions it held move, to OSDs the PG did not use.
    down.run(&Command::MarkOut { id: victim }).unwrap();
    let hierarchy = down.hierarchy();
    for (pg, old) in before.iter().enumerate() {
        let now = down.acting(&hierarchy, &pool, pg as u32);
        for (position, (o, n)) in old.iter().zip(&now).enumerate() {
            if *o == victim {
                assert!(*n != victim && *n != NO_OSD && !old.contains(n), "PG {pg} position {position}: {now:?}");
            } else {
                assert_eq!(o, n, "PG {pg} position {position} moved: {old:?} -> {now:?}");
            }
        }
    }
    // Every position of a PG whose OSDs are all down is a hole.
    let mut dark = map.clone();
    for id in 0..5 {
        dark.run(&Command::MarkDown { id }).unwrap();
    }
    let acting = dark.acting(&dark.hierarchy(), &pool, 0);
    assert_eq!(acting, vec![NO_OSD; 3]);
    assert_eq!(primary_of(&acting), None);
}

#[test]
fn an_erasure_coded_pg_keeps_its_shards_on_their_holders_when_an_osd_joins() {
    let mut map = ClusterMap::new([1; 16]);
    for id in 0..3 {
        map.run(&boot(id, &format!("host-{id}"))).unwrap();
    }
    map.run(&Command::PoolCreateErasure { name: "cold".into(), code: ec(2, 1), min_size: Some(2), pg_num: 64 })
        .unwrap();
    let pool = map.pool_by_name("cold").unwrap().clone();
    let before: Vec<Vec<u32>> = (0..64).map(|pg| map.acting(&map.hierarchy(), &pool, pg)).collect();
    // Each PG went active on its placement: the records name its holders.
    let pgs = (0..64).map(|pg| (pool.id, pg, map.epoch, before[pg as usize].clone())).collect();
    map.run(&Command::RecordActive { pgs }).unwrap();
    // A fourth host: placement moves positions. A PG that keeps k shards
    // in place goes to placement (the moved ones are rebuilt); one that
    // would keep fewer (two positions shifted at once) stays pinned to its
    // holders.
    map.run(&boot(3, "host-3")).unwrap();
    let hierarchy = map.hierarchy();
    let (mut moved, mut pinned) = (0, 0);
    for (pg, old) in before.iter().enumerate() {
        let placed = map.pg_osds(&hierarchy, &pool, pg as u32);
        let acting = map.acting(&hierarchy, &pool, pg as u32);
        let unmoved = old.iter().zip(&placed).filter(|(o, p)| o == p).count();
        if unmoved >= 2 {
            assert_eq!(acting, placed, "PG {pg}: k shards stay, yet it is pinned");
            moved += usize::from(placed != *old);
        } else {
            assert_eq!(acting, *old, "PG {pg}: a shard left its holder with fewer than k in place");
            pinned += 1;
        }
    }
    assert!(moved > 0 && pinned > 0, "{moved} PGs moved, {pinned} pinned: the test does not cover both");
    // Its primary cannot ask the pin to go (as a replicated hand-over's
    // does): the up set's OSDs do not hold the pinned positions' shards.
    let pinned_pg = (0..64u32).find(|pg| map.pg_temp.contains_key(&(pool.id, *pg))).unwrap();
    let up = map.up_set(&map.hierarchy(), &pool, pinned_pg);
    let record_before = map.active_sets.get(&(pool.id, pinned_pg)).cloned();
    let cleared = map.run(&Command::ClearPgTemp { interval: map.epoch, pgs: vec![(pool.id, pinned_pg, up)] }).unwrap();
    assert!(cleared.is_none(), "an erasure-coded pin went by ClearPgTemp");
    assert_eq!(map.active_sets.get(&(pool.id, pinned_pg)).cloned(), record_before);
    // A pinned holder goes down (not out): placement did not move, yet its
    // position goes to placement's OSD, whose shard recovery rebuilds, or
    // stays a hole when that OSD holds another position.
    let pinned_pg = (0..64u32).find(|pg| map.pg_temp.contains_key(&(pool.id, *pg))).unwrap();
    let holder = map.acting(&map.hierarchy(), &pool, pinned_pg)[0];
    let mut down = map.clone();
    down.run(&Command::MarkDown { id: holder }).unwrap();
    let hierarchy = down.hierarchy();
    let acting = down.acting(&hierarchy, &pool, pinned_pg);
    let placed = down.pg_osds(&hierarchy, &pool, pinned_pg);
    assert!(!acting.contains(&holder), "{acting:?}");
    assert!(acting[0] == NO_OSD || acting[0] == placed[0], "{acting:?} (placed {placed:?})");
    let in_place = acting.iter().zip(&placed).filter(|(a, p)| a == p).count();
    assert!(acting[0] == placed[0] || in_place < 2, "{acting:?}: the hole at 0 was placement's to fill");
    // Each PG peers on its acting set (rebuilding the moved shards) and
    // records it. Then a holder dies and is marked out: no PG keeps it, and
    // a pinned PG's other positions stay on their holders.
    let holders: Vec<Vec<u32>> = (0..64).map(|pg| map.acting(&map.hierarchy(), &pool, pg)).collect();
    let pgs = (0..64).map(|pg| (pool.id, pg, map.epoch, holders[pg as usize].clone())).collect();
    map.run(&Command::RecordActive { pgs }).unwrap();
    let victim = before[0][0];
    map.run(&Command::MarkDown { id: victim }).unwrap();
    map.run(&Command::MarkOut { id: victim }).unwrap();
    let hierarchy = map.hierarchy();
    for (pg, old) in holders.iter().enumerate() {
        let acting = map.acting(&hierarchy, &pool, pg as u32);
        let placed = map.pg_osds(&hierarchy, &pool, pg as u32);
        for (position, osd) in acting.iter().enumerate() {
            if old[position] == victim {
                assert!(*osd == placed[position] || *osd == NO_OSD, "PG {pg}: {acting:?} (placed {placed:?})");
            } else if acting != placed {
                assert_eq!(*osd, old[position], "PG {pg}: a live holder moved: {old:?} -> {acting:?}");
            }
            assert!(*osd != victim);
        }
        let distinct = acting.iter().enumerate().all(|(i, o)| *o == NO_OSD || !acting[..i].contains(o));
        assert!(distinct, "PG {pg}: {acting:?}");
    }
}

/// Simulator `--ec 2+1` seeds 98, 10480169 and 10610699: placement kept
/// two of a PG's recorded holders in place, so the monitor pinned nothing,
/// but one of those two had lost its shard; the third current holder was
/// no member, and the PG waited for good. Its primary now takes the stale
/// holder out of the record, the PG is pinned back to the holders that
/// have their shards, and that pin stays past the record made before the
/// PG serves, until its primary says it is active there.
#[test]
fn an_erasure_coded_pg_goes_back_to_its_current_holders_and_stays_until_it_served() {
    let mut map = ClusterMap::new([1; 16]);
    for id in 0..5 {
        map.run(&boot(id, &format!("host-{id}"))).unwrap();
    }
    map.run(&Command::PoolCreateErasure { name: "cold".into(), code: ec(2, 1), min_size: Some(2), pg_num: 8 }).unwrap();
    let pool = map.pool_by_name("cold").unwrap().clone();
    let pg = 3;
    let placed = map.acting(&map.hierarchy(), &pool, pg);
    let (a, b, c) = (placed[0], placed[1], placed[2]);
    map.run(&Command::RecordActive { pgs: vec![(pool.id, pg, map.epoch, placed.clone())] }).unwrap().unwrap();
    // c goes out: placement keeps a and b, so the PG goes to placement.
    map.run(&Command::MarkOut { id: c }).unwrap().unwrap();
    let moved = map.acting(&map.hierarchy(), &pool, pg);
    assert_eq!(&moved[..2], &[a, b]);
    assert!(moved[2] != c && !map.pg_temp.contains_key(&(pool.id, pg)), "{moved:?}");
    let interval = map.epoch;
    // Its primary finds b's shard lost: stale requests, and ones that
    // would leave no holder, change nothing.
    let unrecord = |interval: u64, stale: &[u32]| Command::UnrecordShards {
        pgs: vec![(pool.id, pg, interval, stale.to_vec(), moved.clone())],
    };
    let since = map.active_sets[&(pool.id, pg)].since;
    assert_eq!(map.run(&unrecord(since - 1, &[b])).unwrap(), None, "older than the record");
    assert_eq!(map.run(&unrecord(interval, &[a, b, c])).unwrap(), None, "no holder left");
    assert_eq!(map.run(&unrecord(interval, &[moved[2]])).unwrap(), None, "not recorded");
    let elsewhere = Command::UnrecordShards { pgs: vec![(pool.id, pg, interval, vec![b], placed.clone())] };
    assert_eq!(map.run(&elsewhere).unwrap(), None, "asked on an acting set the PG no longer has");
    map.run(&unrecord(interval, &[b])).unwrap().unwrap();
    assert_eq!(map.active_sets[&(pool.id, pg)].osds, vec![a, NO_OSD, c]);
    // Pinned back to the holders (b's position to placement's OSD, b).
    assert_eq!(map.pg_temp.get(&(pool.id, pg)), Some(&vec![a, b, c]));
    let pinned_interval = map.epoch;
    // Its peering rebuilds b and records the pin's OSDs before serving:
    // the pin stays, though placement alone would drop it now.
    map.run(&Command::RecordActive { pgs: vec![(pool.id, pg, pinned_interval, vec![a, b, c])] }).unwrap().unwrap();
    assert_eq!(map.pg_temp.get(&(pool.id, pg)), Some(&vec![a, b, c]), "the pin went with the record");
    assert!(duplex_map::pg_temp::erasure_pin_may_go(&map, &map.hierarchy(), &pool, pg));
    // Once active there, its primary asks: the pin goes, the record stays.
    let up = map.up_set(&map.hierarchy(), &pool, pg);
    map.run(&Command::ClearPgTemp { interval: pinned_interval, pgs: vec![(pool.id, pg, up)] }).unwrap().unwrap();
    assert!(!map.pg_temp.contains_key(&(pool.id, pg)));
    assert_eq!(map.active_sets[&(pool.id, pg)].osds, vec![a, b, c], "the holders stay recorded");
    assert_eq!(map.acting(&map.hierarchy(), &pool, pg), moved);
}

#[test]
fn an_eventual_pool_keeps_its_lag_through_deltas_and_encodings_and_only_it_has_one() {
    let mut map = small_cluster();
    let eventual = duplex_map::Eventual { max_lag_ms: 500 };
    let create = |name: &str, max_lag_ms| Command::PoolCreateEventual {
        name: name.into(),
        size: 2,
        min_size: 1,
        pg_num: 8,
        eventual: duplex_map::Eventual { max_lag_ms },
    };
    map.run(&create("scratch", 500)).unwrap();
    let pool = map.pool_by_name("scratch").unwrap().clone();
    assert_eq!(pool.eventual, Some(eventual));
    assert!(!map.pool_by_name("rbd").unwrap().is_eventual());
    assert!(matches!(map.run(&create("fast", 5)), Err(CommandError::Invalid(_))), "below the least lag");
    assert!(matches!(map.run(&create("rbd", 500)), Err(CommandError::PoolExists(_))));
    let set =
        |pool: &str, value: &str| Command::PoolSet { name: pool.into(), key: "max_lag".into(), value: value.into() };
    map.run(&set("scratch", "2s")).unwrap().expect("a change");
    assert_eq!(map.pool_by_name("scratch").unwrap().eventual.unwrap().max_lag_ms, 2000);
    assert_eq!(map.run(&set("scratch", "2000ms")), Ok(None), "the same lag: no new epoch");
    for bad in ["0", "61s", "soon"] {
        assert!(matches!(map.run(&set("scratch", bad)), Err(CommandError::Invalid(_))), "{bad}");
    }
    assert!(matches!(map.run(&set("rbd", "1s")), Err(CommandError::Invalid(_))), "a strong pool has no lag");
    assert_eq!(decode_map(&encode_map(&map)).unwrap(), map);
}
