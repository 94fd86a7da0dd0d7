//! The checker's eventual mode, for an eventually consistent pool (a
//! write is acknowledged from its primary's log, and a failure may lose
//! the writes acknowledged within `max_lag` of it).
//!
//! A write acknowledged within `max_lag` of a failure (a kill, a power
//! cut, a hang, an isolation: whatever may have taken a primary or cut it
//! off from its replicas; before it, or after it, when the primary went
//! on acknowledging for its last `max_lag`) is **at risk**: it may be
//! lost, at whatever moment the PG fails over. Every other write must
//! hold as in a strong pool. So the history is judged by the zone test of
//! [`crate::check`] without the writes at risk and the reads that returned
//! them: no write that was not at risk may be lost, no read may go back
//! past one, and no read may return torn, foreign or unwritten data.
//! Removing a write and its reads from a linearizable history leaves it
//! linearizable, so this only ever excuses.
//!
//! The report counts the writes at risk that were lost (a read after the
//! write's acknowledgement returned a value written wholly before it
//! began) and, as the **loss window**, the longest from such a write's
//! acknowledgement to the nearest failure.

use std::collections::{HashMap, HashSet};

use crate::checker::{check, Report};
use crate::history::{BlockOp, History};
use crate::stamp::Stamp;

/// What an eventual pool may lose, and when failures came.
#[derive(Clone, Debug, Default)]
pub struct EventualBounds {
    /// When failures came, on the history's clock.
    pub failures: Vec<u64>,
    /// The pool's `max_lag`, plus whatever slack the caller grants (a
    /// reply's trip to the workload), on the history's clock.
    pub max_lag: u64,
}

/// Judges `history` as an eventual pool's (see the module's words).
pub fn check_eventual(history: &History, bounds: &EventualBounds) -> Report {
    let distance = |acked: u64| bounds.failures.iter().map(|f| f.abs_diff(acked)).min();
    // Every acknowledged write: when it began and when it was acknowledged.
    let acknowledged: HashMap<Stamp, (u64, u64)> = history
        .ops
        .iter()
        .filter_map(|op| match op {
            BlockOp::Write { stamp, invoked, completed: Some(acked) } => Some((*stamp, (*invoked, *acked))),
            _ => None,
        })
        .collect();
    let at_risk: HashMap<Stamp, (u64, u64)> = acknowledged
        .iter()
        .filter(|(_, (_, acked))| distance(*acked).is_some_and(|d| d <= bounds.max_lag))
        .map(|(stamp, times)| (*stamp, *times))
        .collect();
    let kept: Vec<BlockOp> = history
        .ops
        .iter()
        .filter(|op| match op {
            BlockOp::Write { stamp, .. } => !at_risk.contains_key(stamp),
            BlockOp::Read { result: Ok(Some(stamp)), .. } => !at_risk.contains_key(stamp),
            BlockOp::Read { .. } => true,
        })
        .cloned()
        .collect();
    let mut report = check(&History { ops: kept });
    // Counted over the whole history, not only what was judged.
    let whole = check_counts(history);
    report.writes_acknowledged = whole.0;
    report.writes_unknown = whole.1;
    report.reads = whole.2;
    // Which writes at risk were lost: a read after a write's
    // acknowledgement returned a value written wholly before it began.
    let mut by_block: HashMap<u64, Vec<(Stamp, u64, u64)>> = HashMap::new();
    for (stamp, (began, acked)) in &at_risk {
        by_block.entry(stamp.block).or_default().push((*stamp, *began, *acked));
    }
    let mut lost: HashSet<Stamp> = HashSet::new();
    for op in &history.ops {
        let BlockOp::Read { block, result: Ok(value), invoked, .. } = op else { continue };
        for (stamp, began, acked) in by_block.get(block).into_iter().flatten() {
            if *invoked <= *acked || *value == Some(*stamp) || lost.contains(stamp) {
                continue;
            }
            let older = match value {
                None => true,
                Some(read) => acknowledged.get(read).is_some_and(|(_, at)| at < began),
            };
            if older {
                lost.insert(*stamp);
                let window = distance(*acked).expect("a write at risk lies near a failure");
                report.loss_window = report.loss_window.max(window);
            }
        }
    }
    report.rollbacks = lost.len();
    report
}

/// Acknowledged writes, unknown ones and reads.
fn check_counts(history: &History) -> (usize, usize, usize) {
    history.ops.iter().fold((0, 0, 0), |(a, u, r), op| match op {
        BlockOp::Write { completed: Some(_), .. } => (a + 1, u, r),
        BlockOp::Write { completed: None, .. } => (a, u + 1, r),
        BlockOp::Read { .. } => (a, u, r + 1),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ViolationKind;

    fn stamp(seq: u64) -> Stamp {
        Stamp { writer: 1, seq, block: 0 }
    }

    fn write(seq: u64, invoked: u64, completed: Option<u64>) -> BlockOp {
        BlockOp::Write { stamp: stamp(seq), invoked, completed }
    }

    fn read(value: Option<u64>, invoked: u64, completed: u64, final_check: bool) -> BlockOp {
        BlockOp::Read { block: 0, result: Ok(value.map(stamp)), invoked, completed, final_check }
    }

    fn judge(ops: Vec<BlockOp>, failures: Vec<u64>, max_lag: u64) -> Report {
        check_eventual(&History { ops }, &EventualBounds { failures, max_lag })
    }

    #[test]
    fn a_loss_within_max_lag_of_a_failure_passes_and_is_measured() {
        // Write 2 is acknowledged 30 before the failure at 100, read, then
        // lost when the PG fails over (at 105: any moment after the failure).
        let ops = vec![
            write(1, 1, Some(10)),
            read(Some(1), 11, 12, false),
            write(2, 60, Some(70)),
            read(Some(2), 71, 72, false),
            read(Some(2), 101, 102, false),
            read(Some(1), 110, 111, false),
            write(3, 120, Some(130)),
            read(Some(3), 140, 141, true),
        ];
        let report = judge(ops.clone(), vec![100], 50);
        assert!(report.is_ok(), "{report}");
        assert_eq!((report.loss_window, report.rollbacks), (30, 1));
        // With a max_lag under the loss, the same history fails.
        let report = judge(ops.clone(), vec![100], 20);
        assert_eq!(report.count(ViolationKind::StaleRead), 1, "{report}");
        // And the strong checker fails it whatever the bound.
        assert!(!check(&History { ops }).is_ok());
    }

    #[test]
    fn writes_acknowledged_after_a_replica_stopped_may_go_with_a_later_primary_failure() {
        // A replica stops at 100; its primary acknowledges write 2 at 130
        // and write 3 at 400; it dies at 500 and the replica's state (write
        // 1) survives. Write 2 lay within max_lag (50) of the stop; write 3
        // lay within it of no failure: its loss is a violation.
        let ops = |third: bool| {
            let mut ops = vec![
                write(1, 1, Some(10)),
                write(2, 120, Some(130)),
                read(Some(2), 131, 132, false),
                read(Some(1), 600, 601, true),
            ];
            if third {
                ops.push(write(3, 390, Some(400)));
            }
            ops
        };
        let report = judge(ops(false), vec![100, 500], 50);
        assert!(report.is_ok(), "{report}");
        assert_eq!(report.loss_window, 30);
        let report = judge(ops(true), vec![100, 500], 50);
        assert_eq!(report.count(ViolationKind::LostWrite), 1, "{report}");
    }

    #[test]
    fn without_a_failure_the_eventual_mode_is_as_strict_as_the_strong_one() {
        let ops = vec![
            write(1, 1, Some(10)),
            write(2, 20, Some(30)),
            read(Some(2), 31, 32, false),
            read(Some(1), 40, 41, false),
        ];
        let report = judge(ops, vec![], 1_000);
        assert_eq!(report.count(ViolationKind::StaleRead), 1, "{report}");
    }

    #[test]
    fn torn_and_unwritten_data_fail_whatever_the_failures() {
        let torn = BlockOp::Read {
            block: 0,
            result: Err(crate::StampError::Checksum),
            invoked: 90,
            completed: 105,
            final_check: false,
        };
        let report = judge(vec![write(1, 1, Some(10)), torn], vec![100], 1_000);
        assert_eq!(report.count(ViolationKind::Corrupt), 1, "{report}");
        let report = judge(vec![write(1, 1, Some(95)), read(Some(7), 110, 111, true)], vec![100], 1_000);
        assert_eq!(report.count(ViolationKind::Phantom), 1, "{report}");
    }

    #[test]
    fn a_write_in_flight_across_a_failure_may_land_after_it() {
        // Write 2 was invoked before the failure and acknowledged long
        // after it (a resend to the new primary): not at risk, and held.
        let ops = vec![
            write(1, 1, Some(10)),
            write(2, 95, Some(400)),
            read(Some(1), 110, 111, false),
            read(Some(2), 410, 411, true),
        ];
        let report = judge(ops.clone(), vec![100], 5);
        assert!(report.is_ok(), "{report}");
        assert_eq!(report.rollbacks, 0);
        let mut lost = ops;
        lost[3] = read(Some(1), 410, 411, true);
        assert_eq!(judge(lost, vec![100], 5).count(ViolationKind::LostWrite), 1);
    }
}
