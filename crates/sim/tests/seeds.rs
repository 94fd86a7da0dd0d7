//! The simulator in CI: a bounded number of seeds, each judged by the
//! linearizability checker; a replay check (same seed, same run); and one
//! test per bug the simulator found, pinned to the seed that found it.
//! A failing seed is replayed with `cargo run -p duplex-sim -- --seed N`.

use duplex_sim::{run, RunReport, SimConfig};

/// Seeds run in CI (`DUPLEX_SIM_SEEDS` overrides: more locally, for a soak).
fn ci_seeds() -> u64 {
    std::env::var("DUPLEX_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(8)
}

fn run_seed(seed: u64) -> RunReport {
    match run(&SimConfig::new(seed)) {
        Ok(report) => report,
        Err(failure) => panic!("{failure}\n  reproduce: cargo run -p duplex-sim -- --seed {seed}"),
    }
}

#[test]
fn seeds_pass_the_checker() {
    let mut acknowledged = 0;
    let mut faults = 0;
    let mut marked_down = 0;
    for seed in 0..ci_seeds() {
        let report = run_seed(seed);
        assert!(report.reads >= SimConfig::new(seed).blocks, "seed {seed}: the final pass read every block");
        acknowledged += report.acknowledged_writes;
        faults += report.faults.len();
        marked_down += report.marked_down;
    }
    assert!(acknowledged > 0 && faults > 0, "the seeds did work under faults: {acknowledged} writes, {faults} faults");
    // Failover is what the simulator is for: the failure detector must run.
    assert!(marked_down > 0, "no OSD was ever marked down: the monitor's failure detector did not run");
}

#[test]
fn the_same_seed_replays_the_same_run() {
    let first = run_seed(3);
    let second = run_seed(3);
    assert_eq!(first.digest, second.digest, "same seed, same messages and history");
    assert_eq!(first.events, second.events);
    assert_eq!(first.faults, second.faults);
    let other = run_seed(4);
    assert_ne!(first.digest, other.digest, "another seed, another run");
}

/// The power goes in the middle of a store commit (only that fault here):
/// the device's unlanded writes are lost or torn at sector boundaries, the
/// `shm` logs are gone, and the OSD comes back with damaged blocks, which
/// its store reports and peering replaces from a good copy. Nothing
/// acknowledged is lost and no read is stale.
#[test]
fn power_cuts_in_the_middle_of_a_commit_tear_blocks_that_peering_replaces() {
    let (mut cuts, mut damaged) = (0, 0);
    // Seeds 24, 28 and 169 each tear a block that peering then finds
    // (about 1 seed in 40 does: since issue 32 a member that lost its log
    // is compared or filled in the background more often than listed as
    // the authority). It was seed 6 until broken connections failed
    // peering requests at once, and seed 19 until backfill locks waited in
    // the flushers' device queues (issue 31): each moved every seed's
    // course, and the next such change will need new seeds here.
    for seed in [24, 28, 169] {
        let mut config = SimConfig::new(seed);
        config.faults = vec![duplex_sim::FaultKind::PowerLossInCommit];
        let report = match run(&config) {
            Ok(report) => report,
            Err(failure) => panic!("{failure}\n  reproduce: duplex-sim --seed {seed} --faults power-loss-in-commit"),
        };
        cuts += report.power_cuts_in_commit;
        damaged += report.damaged_objects;
    }
    assert!(cuts > 0, "no power cut fired in a commit");
    assert!(damaged > 0, "{cuts} power cuts tore no block a peer had to replace");
}

// Each regression seed below was checked to fail with its fix reverted
// (and to pass with it), on the simulator as it is now. Seeds that found a
// bug in an earlier version of the simulator may replay differently today:
// the pin is the seed that catches the bug *now*.

/// A write failed at its primary (its interval moved on) but its entry
/// survived peering and was read; the client's resend, finding the request
/// `Failed`, ran it again after a newer write, and the old value came
/// back. Activation now marks every request of the history `Committed`.
/// (Found by seed 7 of an earlier simulator; seed 1 catches it now.)
#[test]
fn regression_seed_1_a_resend_of_a_surviving_write_is_not_run_again() {
    run_seed(1);
}

/// A member rebuilt by recovery (here, after a power loss took its log)
/// forgot every request id; as primary it then ran a client's resend of a
/// write that was already in the history, after newer writes. Peering now
/// carries the history's request ids to every member. (Found by seed 25
/// of an earlier simulator; seed 12 catches it now.)
#[test]
fn regression_seed_12_a_rebuilt_member_knows_the_request_ids_of_the_history() {
    run_seed(12);
}

/// A power loss took the `shm` log of osd.2, the only survivor of the PG's
/// last active interval, while its peer from that interval was down.
/// Peering among osd.2 and osd.0 (which had missed that interval) saw two
/// members that knew of no interval, chose osd.0, and backfill removed
/// acknowledged objects from osd.2. Each activation now records the
/// interval in the store, which a power loss does not take
/// (`stored_interval.rs`). (Found by seed 228 of the sweep.)
#[test]
fn regression_seed_228_a_member_that_lost_its_log_still_knows_its_last_interval() {
    run_seed(228);
}

/// Every fault kind and an operator's mark-out and mark-in: PGs move under
/// load, are backfilled in the background while pinned to their old OSDs,
/// and move on once filled. Every run ends with no pin left (the world's
/// settle check), and the checker finds nothing.
#[test]
fn placement_changes_under_load_are_backfilled_in_the_background() {
    let (mut backfilled, mut copied, mut dropped) = (0, 0, 0);
    for seed in 0..6 {
        let report = run_with_mark_out(seed);
        backfilled += report.backfilled_pgs;
        copied += report.backfill_objects;
        dropped += report.pins_cleared;
    }
    assert!(
        backfilled > 0 && copied > 0 && dropped > 0,
        "{backfilled} PGs backfilled, {copied} objects, {dropped} pins"
    );
}

/// The balancer moves PGs by upmap under every fault, two at once: each
/// move is pinned and backfilled, the old OSD removes its stray copy once
/// the PG is clean, and the checker finds nothing.
#[test]
fn the_balancer_moves_pgs_under_faults() {
    let mut moves = 0;
    for seed in 0..4 {
        let mut config = every_fault_config(seed);
        config.balancer = true;
        match run(&config) {
            Ok(report) => moves += report.balancer_moves,
            Err(failure) => panic!(
                "{failure}\n  reproduce: duplex-sim --seed {seed} --balancer --concurrent-faults 2 --faults <all>"
            ),
        }
    }
    assert!(moves > 0, "the balancer moved nothing: the seeds test nothing");
}

/// The rule of seed 53159 first asked every OSD of the last active set
/// to answer *whole* when none had kept its log. PG 1.4 was last active on
/// osd.3, osd.1 and osd.2; osd.1 had since become a backfill target (the
/// balancer's move) and osd.3 and osd.2 lost their logs to power cuts one
/// after the other: all three answered, none could do better, and the PG
/// waited for good. Now all of the set present (one whole) is enough.
/// (Seed 2058 with the balancer, one fault at a time.)
#[test]
fn regression_seed_2058_a_set_all_present_with_lost_logs_does_not_wait_for_good() {
    let mut config = SimConfig::new(2058);
    config.balancer = true;
    if let Err(failure) = run(&config) {
        panic!("{failure}\n  reproduce: duplex-sim --seed 2058 --balancer");
    }
}

/// Snapshots under faults: the checker reads every block of each snapshot
/// as of its span, and no snapshot may hold a write made under it.
#[test]
fn snapshots_hold_their_moment_under_faults() {
    let mut snapshots = 0;
    for seed in 0..3 {
        let mut config = SimConfig::new(seed);
        config.faults = duplex_sim::FaultKind::ALL.to_vec();
        config.concurrent_faults = 2;
        config.snapshots = true;
        match run(&config) {
            Ok(report) => snapshots += report.snapshot_reads,
            Err(failure) => panic!(
                "{failure}\n  reproduce: duplex-sim --seed {seed} --snapshots --concurrent-faults 2 --faults <all>"
            ),
        }
    }
    assert!(snapshots > 500, "only {snapshots} reads of snapshots");
}

/// A backfill target that lacked a head when a write under a new snapshot
/// arrived made no clone, and the backfill, walking a listing taken before
/// the primary made its clone, never copied it: the snapshot then read as
/// never written on that OSD once it led. (Seed 33 with snapshots, one
/// fault at a time; RELIABILITY.md bug 27.)
#[test]
fn regression_seed_33_a_clone_made_after_the_backfill_listing_is_copied() {
    let mut config = SimConfig::new(33);
    config.snapshots = true;
    if let Err(failure) = run(&config) {
        panic!("{failure}\n  reproduce: duplex-sim --seed 33 --snapshots");
    }
}

fn run_with_mark_out(seed: u64) -> RunReport {
    let mut config = SimConfig::new(seed);
    config.faults = duplex_sim::FaultKind::ALL.to_vec();
    let names: Vec<&str> = config.faults.iter().map(|k| k.name()).collect();
    match run(&config) {
        Ok(report) => report,
        Err(failure) => panic!("{failure}\n  reproduce: duplex-sim --seed {seed} --faults {}", names.join(",")),
    }
}

/// A PG pinned to the one OSD that booted first lost it before its
/// backfill ended. Dropping the pin handed the PG to OSDs that never held
/// it (one was down when the backfill began, so not even marked as an
/// unfinished copy), one became the authority, and acknowledged writes
/// vanished. A pin whose OSDs are all down now stays, and the PG waits.
/// (Seed 105 with mark-out faults.)
#[test]
fn regression_seed_105_a_pin_whose_osds_are_down_stays() {
    run_with_mark_out(105);
}

/// Size 2, min_size 1, and up to two OSDs under a fault at once (power
/// faults still come alone: two lost `shm` logs are beyond that mode's
/// promise). A PG whose last active set is all down waits for one of them.
fn run_two_faults_at_once(seed: u64) -> RunReport {
    let mut config = SimConfig::new(seed);
    config.pool_size = 2;
    config.min_size = 1;
    config.concurrent_faults = 2;
    match run(&config) {
        Ok(report) => report,
        Err(failure) => {
            panic!("{failure}\n  reproduce: duplex-sim --seed {seed} --pool-size 2 --min-size 1 --concurrent-faults 2")
        }
    }
}

/// Two faults at once on a size 2 pool: each new acting set is recorded in
/// the map before it serves, and the checker finds nothing.
#[test]
fn two_faults_at_once_on_a_size_2_pool() {
    let mut recorded = 0;
    for seed in 0..3 {
        recorded += run_two_faults_at_once(seed).sets_recorded;
    }
    assert!(recorded > 0, "no PG ever recorded its active set");
}

/// osd.A alone took writes while osd.B was down; then osd.A went down and
/// osd.B came back. Peering among the members present made osd.B's older
/// copy the authority: stale reads, lost writes. A PG now waits until an
/// OSD of its last active set (kept in the map) answers. (Seeds 7 and 35
/// with two faults at once; 10 of the first 40 such seeds failed before.)
#[test]
fn regression_seeds_7_and_35_a_pg_waits_for_an_osd_of_its_last_active_set() {
    run_two_faults_at_once(7);
    run_two_faults_at_once(35);
}

/// A write logged by the one member left (its replica was down) was
/// answered `Retry`; then that member restarted after its log was flushed
/// and trimmed. Peering kept the write, but its request id was gone with
/// the trimmed log, and the client's resend ran it again after newer
/// writes: a stale read. Flushes now keep the ids in the store
/// (stored_requests.rs). (Seeds 4 and 65 with two faults at once.)
#[test]
fn regression_seeds_4_and_65_a_resend_after_the_logging_member_restarted_is_not_run_again() {
    run_two_faults_at_once(4);
    run_two_faults_at_once(65);
}

/// A power cut in the middle of a store commit left a block of a PG's
/// stored request ids failing its checksum. The first version of the id
/// record wrote only the flushed slots, so every later flush of the PG read
/// that block first, failed, and the log never drained (the cluster never
/// settled). Flushes then wrote whole blocks; since issue 22 the slots go
/// through the store's journal, so a commit never writes them in place (a
/// checkpoint's write-back that a cut tears is rebuilt from the journal),
/// and a block found damaged when the record is loaded is replaced. (Seed
/// 63 with two faults at once. Background fills, session 12, moved its run
/// so that its power cut no longer lands in a commit; seed 55 cuts one
/// there now. Seed 59 did too until issue 22 moved its run onto a known
/// gap: see the test below. Session 16's hand-over of a primary far behind
/// moved 63, 55 and 62 off their cuts; 60 and 78 cut there now.)
#[test]
fn regression_seed_63_a_torn_block_of_the_id_record_does_not_wedge_flushes() {
    let seeds = [63, 55, 62, 60, 78];
    let cuts: u64 = seeds.into_iter().map(|seed| run_two_faults_at_once(seed).power_cuts_in_commit).sum();
    assert!(cuts > 0, "no seed cuts the power in a commit any more: the test tests nothing");
}

/// A journaled write's whole blocks went in place in the first version of
/// issue 22's deferred writes: a power cut in a commit landed such an
/// overwrite of a PG's id record but not its record, the block failed its
/// checksum for good, and every flush of its partition failed on it (the
/// cluster never settled). Journaled writes never go in place now. (Seed
/// 7634 with the default faults, one at a time, found by a 10,000-seed
/// sweep; it fails with whole blocks in place again.)
#[test]
fn regression_seed_7634_a_journaled_block_is_never_overwritten_in_place() {
    let report = run_seed(7634);
    assert!(report.power_cuts_in_commit > 0, "the seed no longer cuts the power in a commit: it tests nothing");
}

/// A PG's last active set was [osd.1] when osd.1 was marked out and in
/// again, and placement then gave the PG [0, 3], OSDs that had served it
/// (osd.0 filled in the background, its record not yet written): no pin
/// put osd.1 back into the acting set, though it was up and held the PG,
/// so peering at [0, 3] waited for it for good ("PG is down: it was last
/// active on osd.1"). Now a PG whose up set holds none of its recorded
/// active set is pinned to its holders, that set's OSDs with them.
/// (Session 36's sweep, size 2, min_size 1, two faults at once, no power
/// fault in the run.)
#[test]
fn regression_seed_9920536_a_pg_is_pinned_back_to_its_recorded_holder() {
    use duplex_sim::FaultKind::{Crash, CutPeer, Isolate, MarkOut, PowerLoss};
    let mut config = SimConfig::new(9920536);
    config.pool_size = 2;
    config.min_size = 1;
    config.concurrent_faults = 2;
    config.faults = vec![Crash, PowerLoss, Isolate, CutPeer, MarkOut];
    if let Err(failure) = run(&config) {
        panic!(
            "{failure}\n  reproduce: duplex-sim --seed 9920536 --pool-size 2 --min-size 1 --concurrent-faults 2 \
             --faults crash,power-loss,isolate,cut-peer,mark-out"
        );
    }
}

/// Known gap, "The one whole copy of a PG being filled"
/// (docs/RELIABILITY.md): with min_size 1 a PG served by its one whole OSD
/// while others are backfilled takes writes, which reach the backfill
/// targets too. When that OSD then loses its power (and its `shm` log) in
/// a store commit, the acknowledged writes of that commit are in the
/// targets alone, which never lead, and a block the cut tore has no good
/// copy: a write is lost, a read fails, or the backfill from the torn copy
/// restarts forever. Its variant: a PG served by its one member, the other
/// copy stale and not yet back, loses that member's power (a second copy's
/// loss the fault model leaves out; the simulator counts only faults under
/// way). The seeds pinned until session 32 (59, 303, 385, 969) pass since
/// session 33's map change moved their runs; these fail at 0f0f6b2, each
/// diagnosed as the gap or its variant: 5300225 with the default faults;
/// 5300053, 5300225, 5301527, 5901064 (the gap) and 5900100, 5900942 (the
/// variant) with every fault; 7700615 (the gap: osd.1 back from a power
/// loss and being filled, osd.2 its PGs' one whole copy, then osd.2's power
/// cut in a commit; session 34's sweep, failing identically at d2da8f7);
/// 10200295 (a backfill from the one whole copy, torn by osd.2's power cut
/// in a commit, restarts for good) and 10200394 (a read of that torn block
/// fails), session 36's sweep, both failing identically at dfec435;
/// 10930077 (a write acknowledged as osd.2's power went in a commit reads
/// back as never written) and 10930206 (PG 1.6 stays pinned after osd.0's
/// power cut in a commit tore two blocks), session 37's sweep, both
/// failing identically at 6e63205; 11430137 (osd.3, PG 1.5's one whole
/// copy while osd.0 was isolated, lost its power in a commit that tore
/// block 67: reads and peering meet it damaged with no good copy),
/// session 38's sweep, failing at 157693a too (its PG never settled
/// there); 11530200 (osd.1's power cut in a commit tore blocks 71 and 73
/// of PG 1.5, whose peering then meets them damaged for good), session
/// 38's second sweep, failing identically at 157693a; 11982006 (osd.3 the one copy a
/// write was acknowledged on under min_size 1, its power cut 3 ms later:
/// the write reads back as never written), session 40's sweep, failing
/// identically at 636da3e. Closing the gap needs the targets' log
/// entries merged into the authority's history (which is why a primary
/// that is its PG's one whole copy sends its targets whole writes, not
/// elided ones: `flusher/member.rs`, pg/elide.rs). Run with `-- --ignored` to
/// see where it stands.
#[test]
#[ignore = "known gap: the one whole copy of a PG being filled (docs/RELIABILITY.md)"]
fn known_gap_the_one_whole_copy_of_a_pg_being_filled() {
    run_two_faults_at_once(5300225);
    for seed in [
        5300053, 5300225, 5301527, 5900100, 5900942, 5901064, 7700615, 10200295, 10200394, 10930077, 10930206,
        11430137, 11530200, 11982006,
    ] {
        run_size_two_every_fault(seed);
    }
    // The same gap with the backfill at its least rate (a slower backfill
    // keeps the other copy unfinished for longer).
    let seed = 11920034;
    let config =
        SimConfig { pool_size: 2, min_size: 1, recovery_bytes_per_sec: Some(1 << 20), ..every_fault_config(seed) };
    if let Err(failure) = run(&config) {
        panic!("{failure}\n  reproduce: duplex-sim --seed {seed} --pool-size 2 --min-size 1 --concurrent-faults 2 --faults <all> --recovery-bytes-per-sec 1048576");
    }
}

/// Erasure-coded PGs that waited for good for a shard holder nobody
/// asked (session 37; each failed identically at 6e63205, before it).
/// - 10480169 (`--ec 2+1`, one fault at a time): PG 1.5, recorded on
///   [2, 1, 3], was pinned there after a mark-out and an isolation, and
///   its peering rebuilt osd.2 whole (its position unknown until an
///   activation, seed 230675's rule). The record made before the PG
///   served left two holders at placement's positions, so the monitor
///   dropped the pin in that epoch; on [2, 1, 0] osd.2's position stayed
///   unknown, osd.0 was stale, and osd.3 was no member any more. Now the
///   pin stays until its primary says the PG is active there
///   (`duplex_map::pg_temp::may_release`).
/// - 98 and 10610699 (`--ec 2+1`, two faults at once): placement kept two
///   recorded holders in place, so nothing was pinned, but one of them had
///   lost its shard's position, and the third holder was no member. Now
///   the primary has such members taken out of the record
///   (`Command::UnrecordShards`), and the PG is pinned back to the holders.
#[test]
fn regression_seeds_98_10480169_10610699_an_erasure_coded_pg_goes_back_to_its_current_holders() {
    for (seed, concurrent) in [(98, 2), (10480169, 1), (10610699, 2)] {
        let mut config = every_fault_config(seed);
        config.concurrent_faults = concurrent;
        config.erasure = Some((2, 1));
        if let Err(failure) = run(&config) {
            panic!(
                "{failure}\n  reproduce: duplex-sim --seed {seed} --ec 2+1 --concurrent-faults {concurrent} --faults <all>"
            );
        }
    }
}

/// An erasure-coded member rebuilt whole applied its log, with entries
/// the others rolled back (seqs 28 and 29), and the peering ended before
/// activation but after the map recorded it at its position. The next
/// peering took it for current, and it refused to settle at 27 for good
/// (PG 1.5 waited; no power loss in this run: crashes, marks out and an
/// isolation). Now a member rebuilt whole reports its position as unknown
/// until an activation ends. (Session 23's closing sweep, `--ec 2+2` with
/// every fault two at once, 1 seed of 2,000 from 230000.)
#[test]
fn regression_seed_230675_an_erasure_coded_member_rebuilt_whole_is_not_current_until_activated() {
    let mut config = every_fault_config(230675);
    config.erasure = Some((2, 2));
    if let Err(failure) = run(&config) {
        panic!("{failure}\n  reproduce: duplex-sim --seed 230675 --ec 2+2 --concurrent-faults 2 --faults <all>");
    }
}

/// A member that lost its log with the power stood for its PG's last
/// active set: PG 1.5, active on [2,3,0], acknowledged a write; osd.2
/// lost its power (and its `shm` log, whose write its store had not
/// taken) 4 ms later, then osd.3 and osd.0 crashed with their logs
/// intact. osd.2 alone peered as the set's OSD with a whole copy, was
/// activated, and then won over osd.0 (the write in its log) by its newer
/// interval: a stale read of block 45. Now a member with a lost log
/// stands for the set only when all its OSDs answered. (Seed 53159 with
/// every fault two at once, found by session 17's sweep of 52000–53999.)
#[test]
fn regression_seed_53159_a_lost_log_does_not_stand_for_its_active_set() {
    let report = run_every_fault_two_at_once(53159);
    assert!(report.power_cuts_in_commit > 0, "the seed no longer cuts the power in a commit: it tests nothing");
}

/// A pin's backfill target that could not be reached was left out of its
/// interval, but the background fill of a member (behind by history) stood
/// in for it in the primary's count of targets reached: when that fill
/// ended, the primary dropped the pin, the map recorded the up set (the
/// unfilled target too) as holding every write, and made that OSD primary.
/// Its PG still held its activation of an interval 14 epochs older, with
/// the same acting set (it had been no member since, so no one fenced it),
/// and it served a read from its copy 22 s old before it peered (a stale
/// read of block 41). Now the pin stays until every target is filled, and
/// a primary serves only if the map records no newer active interval than
/// its own. Each fix alone passes this seed. (Seed 50631, every fault two
/// at once; found by session 15's sweep of seeds 50000–51999.)
#[test]
fn regression_seed_50631_an_unfilled_target_is_not_handed_the_pg_nor_an_old_activation_served() {
    run_every_fault_two_at_once(50631);
}

/// A member that needs a backfill is filled in the background, and the PG
/// peers again when that ends. The first version left a PG that had never
/// been written to peering forever: its members were at no entry (seq and
/// epoch 0), which never counts as level, so each peering filled them in
/// the background again (1,252 times; the cluster never settled). A member
/// active in the peered interval itself now counts as level. (Seed 95 with
/// two faults at once.)
#[test]
fn regression_seed_95_a_pg_never_written_to_is_not_filled_in_the_background_forever() {
    let report = run_two_faults_at_once(95);
    assert!(report.background_fills > 0, "no member was filled in the background: the seed tests nothing");
}

/// A primary whose copy needs a backfill hands its PG to a whole member,
/// which pins it to their acting set in a new order and fills the old
/// primary in the background; the pin goes when that ends. In the first
/// version only the end of that backfill asked for it, so when a member
/// restarted in between (the monitor refused the request: a new interval)
/// the next interval, with nothing left to fill, never asked again and
/// the PG stayed pinned for good. A PG pinned to its own up set's OSDs
/// now asks each time it goes active. (Seed 48, default faults.)
#[test]
fn regression_seed_48_a_hand_over_pin_goes_even_after_a_refused_request() {
    let report = run_seed(48);
    assert!(report.hand_overs > 0, "no PG was handed over: the seed tests nothing");
}

/// The simulated network loses messages, commands to the monitor among
/// them (with their connection, which the real driver's request-reply
/// sees and retries). A lost request to drop a pin after backfill was
/// never sent again: three PGs stayed pinned and the cluster never
/// settled. The simulator's driver now asks until the map shows the pin
/// gone, as it does for active-set records. (Seed 73, default faults.)
#[test]
fn regression_seed_73_a_lost_request_to_drop_a_pin_is_sent_again() {
    let report = run_seed(73);
    assert!(report.pins_cleared > 0, "no pin was dropped: the seed tests nothing");
}

/// Every fault kind (mark-out too), up to two OSDs under a fault at once,
/// the default size 3, min_size 2 pool: the mode of the 5,000-seed sweep
/// in docs/RELIABILITY.md.
/// Seed `seed`'s configuration with every fault, two at once.
fn every_fault_config(seed: u64) -> SimConfig {
    let mut config = SimConfig::new(seed);
    config.faults = duplex_sim::FaultKind::ALL.to_vec();
    config.concurrent_faults = 2;
    config
}

fn run_every_fault_two_at_once(seed: u64) -> RunReport {
    let config = every_fault_config(seed);
    let names: Vec<&str> = config.faults.iter().map(|k| k.name()).collect();
    match run(&config) {
        Ok(report) => report,
        Err(failure) => panic!(
            "{failure}\n  reproduce: duplex-sim --seed {seed} --faults {} --concurrent-faults 2",
            names.join(",")
        ),
    }
}

/// A fixed window of that mode (the release-build sweep in scripts/test-all
/// runs a wider one).
#[test]
fn every_fault_two_at_once() {
    let mut faults = 0;
    for seed in 0..ci_seeds().min(6) {
        faults += run_every_fault_two_at_once(seed).faults.len();
    }
    assert!(faults > 0);
}

/// The omap mode (issue 27: chunk maps live in omaps): every block is an
/// omap entry, set and read under every fault two at once, through
/// peering's installs, backfill's copies and replays; the checker finds
/// no lost or stale entry. (The release sweep in scripts/test-all runs a
/// wider window.)
#[test]
fn omap_entries_under_every_fault_two_at_once() {
    let mut acknowledged = 0;
    for seed in 0..ci_seeds().min(2) {
        let mut config = every_fault_config(seed);
        config.omap = true;
        match run(&config) {
            Ok(report) => acknowledged += report.acknowledged_writes,
            Err(failure) => {
                panic!("{failure}\n  reproduce: duplex-sim --seed {seed} --omap --faults <all> --concurrent-faults 2")
            }
        }
    }
    assert!(acknowledged > 0, "no omap set was acknowledged: the test tested nothing");
}

/// An authority began to recover a member behind it by history, copying
/// whole objects that held writes no one had acknowledged, and lost its
/// power before it activated anyone. The member kept reporting its old
/// position with none of those writes' ids, became the authority of the
/// next interval, which reused their seqs, and the client's resend of one
/// of them ran again after a newer write: a stale read. Peering now
/// installs each object whole with the ids of the writes it carries, and a
/// copy so changed reports an unknown position past every id it holds.
/// (Seed 20869, every fault, two at once, failed at 8f135f5; seed 22606
/// fails with just the changed copy's report reverted. The unit test
/// `a_recovery_cut_short_leaves_whole_objects_with_their_ids_and_no_seq_is_reused`
/// pins the rule itself.)
#[test]
fn regression_seeds_20869_and_22606_a_recovery_cut_short_leaves_no_write_without_its_id() {
    run_every_fault_two_at_once(20869);
    run_every_fault_two_at_once(22606);
}

/// A member lost its `shm` log with a write flushed to its store and its id
/// in the store's record, and became the authority at an unknown position,
/// reported as seq 0: the new interval reused seq 1 onwards, a new entry
/// displaced that write's id, and the client's 986th resend of it ran
/// again after four newer writes (a stale read). A copy at an unknown
/// position now reports a seq past every id it holds, and a member of its
/// interval that kept its log still wins over it. (Seed 20420, every
/// fault, two at once, found it; seed 20602 fails, a lost write, with that
/// rule reverted in the final code.)
#[test]
fn regression_seeds_20420_and_20602_an_authority_that_lost_its_log_never_reuses_a_seq_it_holds_an_id_of() {
    run_every_fault_two_at_once(20420);
    run_every_fault_two_at_once(20602);
}

/// The rule above made a member that lost its log report the newest seq
/// its store's record names. In seed 8840 (default faults) that record
/// named a write whose data block the power cut in that very commit never
/// landed (the store promises batch atomicity for metadata, not data);
/// the other members of its interval had kept their logs but held no entry
/// (seq and epoch 0, which also meant "unknown"), so the lost one led, gave
/// everyone the write's id, and the client's resend was answered Ok
/// without running: a lost write. `PeerInfo::position_lost` now says it
/// outright, and a member whose log knows its position wins over a lost
/// one of its interval, even with no entry. (Fails with that ranking
/// reverted; the machine test
/// `the_authority_is_the_newest_interval_then_the_longest_log_then_the_primary`
/// pins the rule.)
#[test]
fn regression_seed_8840_a_member_that_kept_its_log_leads_over_one_that_lost_it() {
    run_seed(8840);
}

/// A member filled in the background was recorded in the PG's last active
/// set with the whole ones, before its activation marked its copy as an
/// unfinished backfill. The activation never came; the whole members died;
/// the recorded, empty member answered as a complete copy of the last
/// active set and led at seq 0: ten acknowledged writes gone. The map now
/// records only the members whole when the interval begins (the filled
/// one joins when the PG peers again after its fill). (Seed 1280, every
/// fault, two at once; fails with the record of every member restored.)
#[test]
fn regression_seed_1280_a_member_filled_in_the_background_is_not_recorded_before_its_fill_ends() {
    run_every_fault_two_at_once(1280);
}

/// A primary whose copy needed a backfill handed its PG back to the first
/// OSD of its placement, pinning it to its up set in the up set's own
/// order. Its primary asked for a pin to go only when the pin differed
/// from the up set, so the PG stayed pinned for good (the cluster never
/// settled). The monitor keeps no pin equal to a PG's placement, and a
/// primary asks for any pin to go. (Seed 10222, default faults, found it;
/// seed 10007 fails with both rules reverted in the final code. The map
/// test `a_hand_over_back_to_the_placements_own_order_leaves_no_pin` pins
/// the monitor's rule.)
#[test]
fn regression_seeds_10222_and_10007_a_hand_over_back_to_the_up_sets_order_leaves_no_pin() {
    let hand_overs = run_seed(10222).hand_overs + run_seed(10007).hand_overs;
    assert!(hand_overs > 0, "no PG was handed over: the seeds test nothing");
}

/// A PG served by one OSD alone (its last active set) had that OSD go
/// down, and an operator's mark-out moved the PG meanwhile: the monitor
/// pinned it to the acting set of that moment, without the one OSD that
/// held it, which came back as a backfill target (fenced, never heard),
/// and the PG waited for it for good. A pin now keeps the OSDs of the last
/// active set. (Seed 30680, every fault, two at once, of a sweep after the
/// review; the map test `a_pin_keeps_the_osds_of_the_last_active_set_even_while_they_are_down`
/// fails without the rule.)
#[test]
fn regression_seed_30680_a_pin_keeps_the_osd_that_holds_the_pg() {
    run_every_fault_two_at_once(30680);
}

/// osd.0 lost its PG log with the power in a commit; its store held
/// writes 199-204 (with their ids) that osd.1, the authority at 198,
/// never logged. Recovery began installing osd.1's copies on osd.0 (sim-0
/// went back to its state at 198) and was cut short when osd.1 lost its
/// power too. In the next peering both had lost their logs, and osd.0 won
/// with ids through 204: a client's resend of write 2/601, never applied
/// at 198, was answered as done, and the block read back older. A member
/// a recovery installs copies on now forgets its own ids past the
/// authority's last seq, in the install's batch. (Session 25's closing
/// sweep, one fault at a time, 1 seed of 1,500 from 500000; it failed at
/// session 24's end too.)
#[test]
fn regression_seed_500221_a_copy_recovery_rolled_back_does_not_vouch_for_writes_it_lost() {
    run_seed(500221);
}

/// The deduplication tier (issue 27): every OSD runs the engine on its
/// PGs (load, promotions, passes: the same steps as the agent's thread,
/// duplex_osd::tier::engine) under the faults, one at a time and every
/// fault two at once; reads follow evicted chunks, and the final pass
/// checks that each evicted chunk a chunk map names is there and holds
/// the entry's reference. The engine must have put, evicted and promoted
/// chunks, or the test tested nothing. (The release sweep in
/// scripts/test-all runs a wider window.)
#[test]
fn the_dedup_engine_under_faults() {
    let mut counts = duplex_sim::osd::DedupCounts::default();
    for seed in 0..ci_seeds().min(4) {
        for two_at_once in [false, true] {
            let mut config = if two_at_once { every_fault_config(seed) } else { SimConfig::new(seed) };
            config.dedup = true;
            // Odd seeds with snapshots (writes that clone an evicted
            // head), seeds from 2 with chunks cut by content.
            config.snapshots = seed % 2 == 1;
            if seed >= 2 {
                config.chunking = duplex_map::Chunking::Content;
            }
            match run(&config) {
                Ok(report) => counts.add(report.dedup.expect("a deduplicated run counts its engine's work")),
                Err(failure) => panic!(
                    "{failure}\n  reproduce: duplex-sim --seed {seed} --dedup{}{}{}",
                    if config.snapshots { " --snapshots" } else { "" },
                    if seed >= 2 { " --chunking content" } else { "" },
                    if two_at_once { " --faults <all> --concurrent-faults 2" } else { "" }
                ),
            }
        }
    }
    assert!(
        counts.passes > 0 && counts.chunks_put > 0 && counts.bytes_evicted > 0 && counts.promotions > 0,
        "the engine did every kind of work: {counts:?}"
    );
}

/// A pinned PG whose whole up set was down went active on its pin's one
/// OSD with nothing to fill, and asked for the pin to go with an empty up
/// set; the monitor granted it and recorded an empty last active set,
/// which means "its copies were marked lost". The next OSD up served its
/// own empty copy: a stale read of block 23 (seed 5300047, with no power
/// fault at all: osd.0 cut from the monitor, osd.2 isolated), and an
/// acknowledged write lost (5301127). The pin now stays while its up set
/// is down. (Found by the first sweep of size 2, min_size 1 with every
/// fault two at once, session 33; diagnosed by a helper session.)
#[test]
fn regression_seeds_5300047_and_5301127_a_pin_stays_while_its_up_set_is_down() {
    for seed in [5300047, 5301127] {
        run_size_two_every_fault(seed);
    }
}

/// A size 2, min_size 1 pool under every fault, two at once.
fn run_size_two_every_fault(seed: u64) {
    let config = SimConfig { pool_size: 2, min_size: 1, ..every_fault_config(seed) };
    if let Err(failure) = run(&config) {
        panic!("{failure}\n  reproduce: duplex-sim --seed {seed} --pool-size 2 --min-size 1 --concurrent-faults 2 --faults <all>");
    }
}
