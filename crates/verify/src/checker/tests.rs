use proptest::prelude::*;

use super::*;

fn stamp(seq: u64) -> Stamp {
    Stamp { writer: 1, seq, block: 0 }
}

fn write(seq: u64, invoked: u64, completed: Option<u64>) -> BlockOp {
    BlockOp::Write { stamp: stamp(seq), invoked, completed }
}

fn read(value: Option<u64>, invoked: u64, completed: u64) -> BlockOp {
    BlockOp::Read { block: 0, result: Ok(value.map(stamp)), invoked, completed, final_check: false }
}

fn final_read(value: Option<u64>, invoked: u64, completed: u64) -> BlockOp {
    BlockOp::Read { block: 0, result: Ok(value.map(stamp)), invoked, completed, final_check: true }
}

fn kinds(ops: Vec<BlockOp>) -> Vec<ViolationKind> {
    check(&History { ops }).violations.iter().map(|v| v.kind).collect()
}

#[test]
fn sequential_histories_pass() {
    let ops = vec![
        read(None, 1, 2),
        write(1, 3, Some(4)),
        read(Some(1), 5, 6),
        write(2, 7, Some(8)),
        final_read(Some(2), 9, 10),
    ];
    let report = check(&History { ops });
    assert!(report.is_ok(), "{report}");
    assert_eq!((report.writes_acknowledged, report.reads), (2, 3));
}

#[test]
fn an_acknowledged_write_missing_from_the_final_read_is_lost() {
    let ops = vec![write(1, 1, Some(2)), write(2, 3, Some(4)), final_read(Some(1), 5, 6)];
    assert_eq!(kinds(ops), vec![ViolationKind::LostWrite]);
    // ...and so is one whose block reads back as never written.
    assert_eq!(kinds(vec![write(1, 1, Some(2)), final_read(None, 5, 6)]), vec![ViolationKind::LostWrite]);
}

#[test]
fn a_read_going_back_in_time_is_stale() {
    // write 1, then write 2 concurrent with two reads: 2 then 1 is a new-old inversion.
    let ops = vec![write(1, 1, Some(2)), write(2, 3, Some(20)), read(Some(2), 4, 5), read(Some(1), 6, 7)];
    assert_eq!(kinds(ops), vec![ViolationKind::StaleRead]);
}

#[test]
fn concurrent_writes_may_be_read_in_either_order() {
    let ops = vec![write(1, 1, Some(10)), write(2, 2, Some(9)), read(Some(1), 11, 12), final_read(Some(1), 13, 14)];
    assert!(check(&History { ops }).is_ok());
    let ops = vec![write(1, 1, Some(10)), read(Some(1), 2, 3), read(None, 4, 5)];
    assert_eq!(kinds(ops), vec![ViolationKind::StaleRead], "once read, the write cannot be undone");
}

#[test]
fn unknown_outcomes_may_or_may_not_take_effect() {
    // Taken effect late, seen by the final read:
    let ops = vec![write(1, 1, Some(2)), write(2, 3, None), final_read(Some(2), 100, 101)];
    assert!(check(&History { ops }).is_ok());
    // Never taken effect:
    let ops = vec![write(1, 1, Some(2)), write(2, 3, None), final_read(Some(1), 100, 101)];
    assert!(check(&History { ops }).is_ok());
    // But once seen, it cannot vanish again.
    let ops = vec![write(1, 1, Some(2)), write(2, 3, None), read(Some(2), 10, 11), final_read(Some(1), 100, 101)];
    assert_eq!(kinds(ops), vec![ViolationKind::LostWrite]);
}

#[test]
fn phantoms_futures_and_corruption_are_named() {
    assert_eq!(kinds(vec![read(Some(9), 1, 2)]), vec![ViolationKind::Phantom]);
    assert_eq!(kinds(vec![read(Some(1), 1, 2), write(1, 3, Some(4))]), vec![ViolationKind::FromFuture]);
    let torn =
        BlockOp::Read { block: 0, result: Err(StampError::Checksum), invoked: 1, completed: 2, final_check: true };
    assert_eq!(kinds(vec![torn]), vec![ViolationKind::Corrupt]);
}

#[test]
fn blocks_are_independent() {
    let other = |seq| Stamp { writer: 1, seq, block: 1 };
    let ops = vec![
        write(1, 1, Some(2)),
        BlockOp::Write { stamp: other(2), invoked: 3, completed: Some(4) },
        final_read(Some(1), 5, 6),
        BlockOp::Read { block: 1, result: Ok(Some(other(2))), invoked: 5, completed: 6, final_check: true },
    ];
    let report = check(&History { ops });
    assert!(report.is_ok(), "{report}");
    assert_eq!(report.blocks, 2);
}

/// The reference: try every order of the operations that respects real
/// time (and, for unknown writes, both with and without them), replaying a
/// register. Exponential; for small histories only.
fn brute_force(ops: &[BlockOp]) -> bool {
    let unknown: Vec<usize> =
        (0..ops.len()).filter(|&i| matches!(ops[i], BlockOp::Write { completed: None, .. })).collect();
    for mask in 0..(1u32 << unknown.len()) {
        let included: Vec<usize> = (0..ops.len())
            .filter(|i| unknown.iter().position(|u| u == i).is_none_or(|bit| mask & (1 << bit) != 0))
            .collect();
        if orders(ops, &included, &mut Vec::new(), &mut vec![false; ops.len()]) {
            return true;
        }
    }
    false
}

fn span(op: &BlockOp) -> (u64, u64) {
    match op {
        BlockOp::Write { invoked, completed, .. } => (*invoked, completed.unwrap_or(u64::MAX)),
        BlockOp::Read { invoked, completed, .. } => (*invoked, *completed),
    }
}

fn orders(ops: &[BlockOp], included: &[usize], order: &mut Vec<usize>, used: &mut [bool]) -> bool {
    if order.len() == included.len() {
        let mut value = None;
        for &i in order.iter() {
            match &ops[i] {
                BlockOp::Write { stamp, .. } => value = Some(*stamp),
                BlockOp::Read { result, .. } => {
                    if result.as_ref().ok() != Some(&value) {
                        return false;
                    }
                }
            }
        }
        return true;
    }
    for &i in included {
        if used[i] {
            continue;
        }
        // i may go next only if no other remaining op completed before i began.
        let blocked = included.iter().any(|&j| j != i && !used[j] && span(&ops[j]).1 < span(&ops[i]).0);
        if blocked {
            continue;
        }
        used[i] = true;
        order.push(i);
        if orders(ops, included, order, used) {
            return true;
        }
        order.pop();
        used[i] = false;
    }
    false
}

fn small_history() -> impl Strategy<Value = Vec<BlockOp>> {
    let op = (any::<bool>(), 0u64..4, 1u64..30, 0u64..12, prop::bool::weighted(0.2));
    prop::collection::vec(op, 1..7).prop_map(|raw| {
        let writes = raw.iter().filter(|r| r.0).count() as u64;
        let mut seq = 0;
        raw.into_iter()
            .map(|(is_write, pick, invoked, length, unknown)| {
                if is_write {
                    seq += 1;
                    write(seq, invoked, if unknown { None } else { Some(invoked + length) })
                } else {
                    // A value some write of this history writes (or the initial one).
                    let value = if writes == 0 { None } else { Some(pick % (writes + 1)).filter(|v| *v > 0) };
                    read(value, invoked, invoked + length)
                }
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 4000, ..ProptestConfig::default() })]

    /// The zone test agrees with exhaustive search, both ways.
    #[test]
    fn agrees_with_brute_force(ops in small_history()) {
        let report = check(&History { ops: ops.clone() });
        let no_future = report.violations.iter().all(|v| v.kind != ViolationKind::FromFuture);
        let expected = brute_force(&ops);
        if no_future {
            prop_assert_eq!(report.is_ok(), expected, "ops {:?}: {}", ops, report);
        } else {
            prop_assert!(!expected, "a read from the future cannot be linearizable: {:?}", ops);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// With no failure, the eventual mode is the strong checker.
    #[test]
    fn the_eventual_mode_without_failures_is_the_strong_one(ops in small_history()) {
        let history = History { ops };
        let strong: Vec<ViolationKind> = check(&history).violations.iter().map(|v| v.kind).collect();
        let bounds = crate::EventualBounds { failures: Vec::new(), max_lag: 0 };
        let eventual: Vec<ViolationKind> =
            crate::check_eventual(&history, &bounds).violations.iter().map(|v| v.kind).collect();
        prop_assert_eq!(eventual, strong, "{:?}", history.ops);
    }

    /// A failure only ever excuses: what passes the strong checker passes
    /// the eventual mode, wherever failures fall.
    #[test]
    fn a_linearizable_history_passes_the_eventual_mode_wherever_failures_fall(
        ops in small_history(),
        failures in prop::collection::vec(0u64..45, 0..3),
        max_lag in 0u64..50,
    ) {
        let history = History { ops };
        if !check(&history).is_ok() {
            return Ok(()); // (About half are: too many to reject.)
        }
        let report = crate::check_eventual(&history, &crate::EventualBounds { failures, max_lag });
        prop_assert!(report.is_ok(), "{:?}: {}", history.ops, report);
    }
}
