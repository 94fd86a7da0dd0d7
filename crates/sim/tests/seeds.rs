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
    for seed in 0..ci_seeds() {
        let report = run_seed(seed);
        assert!(report.reads >= SimConfig::new(seed).blocks, "seed {seed}: the final pass read every block");
        acknowledged += report.acknowledged_writes;
        faults += report.faults.len();
    }
    assert!(acknowledged > 0 && faults > 0, "the seeds did work under faults: {acknowledged} writes, {faults} faults");
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

/// Found by seed 1, and still caught by seed 5 (and 8) once the fix below
/// was in: a read served a write its primary had logged but not yet
/// replicated; the write then failed or was lost with its primary, and a
/// later read went back to the older value (or a newer acknowledged write
/// vanished under its resend). Reads of an object with a write in flight
/// now wait (`Pg::uncommitted`).
#[test]
fn regression_seed_5_no_read_of_an_unreplicated_write() {
    run_seed(5);
}

/// Found by seed 7: a write failed at its primary (the interval moved on)
/// but its entry survived peering and was read; the client's resend ran
/// it again, after a newer write. Activation now commits every request
/// whose entry survived (`RequestTable::commit_all`).
#[test]
fn regression_seed_7_a_resend_of_a_surviving_write_is_not_run_again() {
    run_seed(7);
}

/// A seed that still fails (a stale read): an open bug, see docs/RELIABILITY.md.
#[test]
#[ignore = "an open bug the simulator found; see docs/RELIABILITY.md"]
fn known_failing_seeds() {
    run_seed(25);
}
