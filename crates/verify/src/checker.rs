//! Per-block linearizability of a register whose writes are unique.
//!
//! Each block is checked on its own (a block device is a set of
//! independent registers). With unique written values, every read names
//! the write it observed, and Gibbons and Korach's zone test decides
//! linearizability in O(n log n): group each write with the reads that
//! returned it (a *cluster*); let `end` be the earliest completion in the
//! cluster and `start` the latest invocation. If `end < start` the cluster
//! has a *forward zone* (end, start): its value must stay visible over that
//! whole span. Otherwise it has a *backward zone* (start, end). The history
//! is linearizable iff no two forward zones overlap, no backward zone lies
//! inside a forward zone, and no read returns a value written only after
//! the read completed or never written at all.
//! (P. Gibbons, E. Korach, "Testing shared memories", SIAM J. Comput. 1997.)

use std::collections::HashMap;
use std::fmt;

use crate::history::{BlockOp, History};
use crate::stamp::{Stamp, StampError};

/// What went wrong on a block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViolationKind {
    /// A final read did not see an acknowledged write (or saw an older one).
    LostWrite,
    /// A read returned a value older than one already acknowledged or
    /// already read.
    StaleRead,
    /// A read returned a stamp no one wrote to this block.
    Phantom,
    /// A read returned a write invoked only after the read completed.
    FromFuture,
    /// A read returned torn, foreign or misplaced data.
    Corrupt,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    pub kind: ViolationKind,
    pub block: u64,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "block {}: {:?}: {}", self.block, self.kind, self.detail)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Report {
    pub blocks: usize,
    pub writes_acknowledged: usize,
    pub writes_unknown: usize,
    pub reads: usize,
    pub violations: Vec<Violation>,
    /// The eventual mode ([`crate::check_eventual`]): writes at risk that
    /// a failure took, and the longest from such a write's acknowledgement
    /// to the nearest failure (on the history's clock).
    pub rollbacks: usize,
    pub loss_window: u64,
}

impl Report {
    pub fn count(&self, kind: ViolationKind) -> usize {
        self.violations.iter().filter(|v| v.kind == kind).count()
    }

    pub fn is_ok(&self) -> bool {
        self.violations.is_empty()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} blocks, {} writes acknowledged, {} unknown, {} reads: {} lost writes, {} stale reads, {} other violations",
            self.blocks,
            self.writes_acknowledged,
            self.writes_unknown,
            self.reads,
            self.count(ViolationKind::LostWrite),
            self.count(ViolationKind::StaleRead),
            self.violations.len() - self.count(ViolationKind::LostWrite) - self.count(ViolationKind::StaleRead)
        )?;
        if self.rollbacks > 0 {
            write!(f, "; {} writes lost to failures, loss window {}", self.rollbacks, self.loss_window)?;
        }
        for violation in self.violations.iter().take(10) {
            write!(f, "\n  {violation}")?;
        }
        Ok(())
    }
}

/// The never-written state counts as a write completed at time 0.
const INITIAL: Option<Stamp> = None;

struct Cluster {
    /// Earliest completion among the write and its reads.
    end: u64,
    /// Latest invocation among them, and whether that op is a final-check read.
    start: u64,
    start_is_final: bool,
}

/// Judges a history. Panics if the history itself is malformed (two writes
/// with one stamp): that is a bug in the workload, not in the system.
pub fn check(history: &History) -> Report {
    let mut per_block: HashMap<u64, Vec<&BlockOp>> = HashMap::new();
    for op in &history.ops {
        per_block.entry(op.block()).or_default().push(op);
    }
    let mut report = Report { blocks: per_block.len(), ..Report::default() };
    let mut blocks: Vec<_> = per_block.into_iter().collect();
    blocks.sort_by_key(|(block, _)| *block);
    for (block, ops) in blocks {
        check_block(block, &ops, &mut report);
    }
    report
}

fn check_block(block: u64, ops: &[&BlockOp], report: &mut Report) {
    let mut clusters: HashMap<Option<Stamp>, Cluster> = HashMap::new();
    clusters.insert(INITIAL, Cluster { end: 0, start: 0, start_is_final: false });
    let mut invoked_at: HashMap<Stamp, u64> = HashMap::new();
    for op in ops {
        if let BlockOp::Write { stamp, invoked, completed } = op {
            let end = match completed {
                Some(at) => {
                    assert!(at >= invoked, "a write completed before it was invoked");
                    report.writes_acknowledged += 1;
                    *at
                }
                None => {
                    report.writes_unknown += 1;
                    u64::MAX
                }
            };
            let fresh = clusters.insert(Some(*stamp), Cluster { end, start: *invoked, start_is_final: false });
            assert!(fresh.is_none(), "two writes with one stamp {stamp:?}: the workload must make stamps unique");
            invoked_at.insert(*stamp, *invoked);
        }
    }
    let violation = |kind, detail: String| Violation { kind, block, detail };
    for op in ops {
        let BlockOp::Read { result, invoked, completed, final_check, .. } = op else { continue };
        report.reads += 1;
        let value = match result {
            Ok(value) => *value,
            Err(error) => {
                report.violations.push(violation(ViolationKind::Corrupt, corrupt_detail(error, *invoked)));
                continue;
            }
        };
        if let Some(stamp) = value {
            match invoked_at.get(&stamp) {
                None => {
                    report.violations.push(violation(
                        ViolationKind::Phantom,
                        format!("read at {invoked} returned unwritten {stamp:?}"),
                    ));
                    continue;
                }
                Some(write_invoked) if write_invoked > completed => {
                    report.violations.push(violation(
                        ViolationKind::FromFuture,
                        format!("read [{invoked}, {completed}] returned {stamp:?}, written from {write_invoked}"),
                    ));
                    continue;
                }
                Some(_) => {}
            }
        }
        let cluster = clusters.get_mut(&value).expect("every read value has a cluster by now");
        cluster.end = cluster.end.min(*completed);
        if *invoked > cluster.start {
            cluster.start = *invoked;
            cluster.start_is_final = *final_check;
        }
    }

    let mut forward = Vec::new(); // (from, to, value, late op is final)
    let mut backward = Vec::new(); // (from, to, value)
    for (value, c) in &clusters {
        if c.end < c.start {
            forward.push((c.end, c.start, *value, c.start_is_final));
        } else {
            backward.push((c.start, c.end, *value));
        }
    }
    // Zones come out of a hash map: order them fully, so that one history
    // always gives one report (a simulator's seed replays to the same words).
    forward.sort_by_key(|z| (z.0, z.1, z.2));
    backward.sort_unstable();
    let kind_of = |is_final: bool| if is_final { ViolationKind::LostWrite } else { ViolationKind::StaleRead };
    for pair in forward.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        if b.0 < a.1 {
            // Both values had to stay visible over a common span: the one
            // read later is older than the other's acknowledged write or read.
            report.violations.push(violation(
                kind_of(a.3 || b.3),
                format!(
                    "{} must be visible over ({}, {}) and {} over ({}, {})",
                    name(a.2),
                    a.0,
                    a.1,
                    name(b.2),
                    b.0,
                    b.1
                ),
            ));
        }
    }
    for (from, to, value) in backward {
        // Forward zones are disjoint when the history passed the test above,
        // so only the last one starting before `from` can contain this zone.
        let index = forward.partition_point(|z| z.0 < from);
        if index == 0 {
            continue;
        }
        let f = forward[index - 1];
        if to < f.1 {
            report.violations.push(violation(
                kind_of(f.3),
                format!(
                    "{} was written within ({}, {}) yet {} was read as current after it",
                    name(value),
                    from,
                    to,
                    name(f.2)
                ),
            ));
        }
    }
}

fn name(value: Option<Stamp>) -> String {
    match value {
        None => "the never-written state".to_string(),
        Some(s) => format!("write {}/{}", s.writer, s.seq),
    }
}

fn corrupt_detail(error: &StampError, at: u64) -> String {
    format!("read at {at}: {error}")
}

#[cfg(test)]
mod tests;
