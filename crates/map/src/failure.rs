//! Failure detection, as a pure state machine run by the monitor leader.
//!
//! Inputs carry their own time (milliseconds from any monotonic origin):
//! OSD heartbeats, failure reports from peers, and ticks. Output: the
//! commands to propose, which are `MarkDown` and `MarkOut`.
//!
//! - An up OSD whose last heartbeat is older than `grace` is marked down.
//! - An up OSD reported failed by `min_reporters` distinct peers within
//!   `grace` is marked down at once. One flaky peer cannot evict a healthy
//!   OSD.
//! - A down OSD that stays down (and in) for `down_out_interval` is marked
//!   out, so its data is re-replicated elsewhere.
//! - A down OSD returns through `OsdBoot`, not through a heartbeat: it must
//!   re-register before it serves again.
//!
//! This is soft state. A new leader starts with empty timers, giving every
//! OSD a fresh grace period, so a leader change can delay detection but
//! never evicts an OSD early.

use std::collections::{BTreeMap, BTreeSet};

use crate::{ClusterMap, Command, OsdId};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FailureConfig {
    pub grace_ms: u64,
    pub down_out_interval_ms: u64,
    pub min_reporters: usize,
}

impl Default for FailureConfig {
    fn default() -> Self {
        FailureConfig { grace_ms: 6_000, down_out_interval_ms: 600_000, min_reporters: 2 }
    }
}

#[derive(Clone, Debug, Default)]
pub struct FailureDetector {
    config: FailureConfig,
    /// Last heartbeat, or the time the detector first saw the OSD up.
    last_heard: BTreeMap<OsdId, u64>,
    /// When the detector first saw the OSD down.
    down_since: BTreeMap<OsdId, u64>,
    /// Recent failure reports: target → reporter → time.
    reports: BTreeMap<OsdId, BTreeMap<OsdId, u64>>,
}

impl FailureDetector {
    pub fn new(config: FailureConfig) -> FailureDetector {
        FailureDetector { config, ..FailureDetector::default() }
    }

    pub fn heartbeat(&mut self, osd: OsdId, now_ms: u64) {
        let last = self.last_heard.entry(osd).or_insert(now_ms);
        *last = (*last).max(now_ms);
        // Peer reports stand even so: an OSD that reaches the monitor but
        // not its peers cannot replicate, and must go down. They expire instead.
    }

    /// `reporter` could not reach `target`.
    pub fn report_failure(&mut self, target: OsdId, reporter: OsdId, now_ms: u64) {
        if target != reporter {
            self.reports.entry(target).or_default().insert(reporter, now_ms);
        }
    }

    /// The commands to propose now, in OSD order.
    pub fn tick(&mut self, map: &ClusterMap, now_ms: u64) -> Vec<Command> {
        let mut commands = Vec::new();
        let grace = self.config.grace_ms;
        for osd in map.osds.values() {
            let id = osd.id;
            if osd.up {
                self.down_since.remove(&id);
                let last = *self.last_heard.entry(id).or_insert(now_ms);
                let reporters: BTreeSet<OsdId> = self
                    .reports
                    .get(&id)
                    .map(|r| r.iter().filter(|(_, t)| now_ms.saturating_sub(**t) <= grace).map(|(r, _)| *r).collect())
                    .unwrap_or_default();
                let silent = now_ms.saturating_sub(last) > grace;
                let reported = reporters.len() >= self.config.min_reporters.max(1);
                if silent || reported {
                    commands.push(Command::MarkDown { id });
                }
            } else {
                self.last_heard.remove(&id);
                self.reports.remove(&id);
                let since = *self.down_since.entry(id).or_insert(now_ms);
                if osd.is_in && now_ms.saturating_sub(since) >= self.config.down_out_interval_ms {
                    commands.push(Command::MarkOut { id });
                }
            }
        }
        // Forget OSDs that left the map.
        self.last_heard.retain(|id, _| map.osds.contains_key(id));
        self.down_since.retain(|id, _| map.osds.contains_key(id));
        self.reports.retain(|id, _| map.osds.contains_key(id));
        commands
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map_with(osds: u32) -> ClusterMap {
        let mut map = ClusterMap::new([0; 16]);
        for id in 0..osds {
            map.run(&Command::OsdBoot {
                id,
                addr: format!("127.0.0.1:{}", 7000 + id),
                host: format!("h{id}"),
                weight: 1 << 16,
            })
            .unwrap();
        }
        map
    }

    /// Runs the detector with 100 ms ticks, applying what it proposes;
    /// `beating(osd, t)` says whether the OSD heartbeats at time t.
    fn simulate(map: &mut ClusterMap, until_ms: u64, beating: impl Fn(OsdId, u64) -> bool) -> Vec<(u64, Command)> {
        let mut detector = FailureDetector::new(FailureConfig::default());
        let mut log = Vec::new();
        for now in (0..=until_ms).step_by(100) {
            for id in map.osds.keys().copied().collect::<Vec<_>>() {
                if beating(id, now) && now % 1000 == 0 {
                    detector.heartbeat(id, now);
                }
            }
            for command in detector.tick(map, now) {
                if map.run(&command).unwrap().is_some() {
                    log.push((now, command));
                }
            }
        }
        log
    }

    #[test]
    fn healthy_osds_stay_up() {
        let mut map = map_with(3);
        assert!(simulate(&mut map, 60_000, |_, _| true).is_empty());
    }

    #[test]
    fn a_silent_osd_is_marked_down_after_the_grace_and_out_after_the_interval() {
        let mut map = map_with(3);
        let log = simulate(&mut map, 700_000, |id, t| id != 1 || t < 10_000);
        assert_eq!(log.len(), 2, "{log:?}");
        let (down_at, ref down) = log[0];
        assert_eq!(*down, Command::MarkDown { id: 1 });
        // Last heartbeat at 9 s; down once silent for more than 6 s, within one tick.
        assert!((15_000..=15_200).contains(&down_at), "down at {down_at}");
        let (out_at, ref out) = log[1];
        assert_eq!(*out, Command::MarkOut { id: 1 });
        // Counted from the first tick that sees it down (one tick after the proposal).
        assert!((down_at + 600_000..=down_at + 600_100).contains(&out_at), "out at {out_at}");
    }

    #[test]
    fn two_reporters_mark_down_at_once_but_one_does_not() {
        let map = map_with(4);
        let mut detector = FailureDetector::new(FailureConfig::default());
        for id in 0..4 {
            detector.heartbeat(id, 0);
        }
        detector.report_failure(3, 0, 1000);
        assert!(detector.tick(&map, 1000).is_empty(), "a single reporter is not enough");
        detector.report_failure(3, 3, 1000); // an OSD cannot report itself
        assert!(detector.tick(&map, 1000).is_empty());
        detector.report_failure(3, 1, 1100);
        assert_eq!(detector.tick(&map, 1100), vec![Command::MarkDown { id: 3 }]);
    }

    #[test]
    fn reports_expire_after_the_grace_and_heartbeats_do_not_clear_them() {
        let map = map_with(3);
        let mut detector = FailureDetector::new(FailureConfig::default());
        let beat_all = |d: &mut FailureDetector, t| (0..3).for_each(|id| d.heartbeat(id, t));
        beat_all(&mut detector, 0);
        detector.report_failure(2, 0, 1_000);
        beat_all(&mut detector, 7_000);
        detector.report_failure(2, 1, 7_500);
        assert!(detector.tick(&map, 7_500).is_empty(), "the report from 1 s expired before the one at 7.5 s");
        detector.report_failure(2, 0, 8_000);
        beat_all(&mut detector, 8_000);
        // Two fresh reports stand although OSD 2 still reaches the monitor:
        // it cannot reach its peers, so it cannot replicate.
        assert_eq!(detector.tick(&map, 8_000), vec![Command::MarkDown { id: 2 }]);
    }

    #[test]
    fn an_operator_out_is_not_repeated_and_a_fresh_leader_grants_a_grace() {
        let mut map = map_with(2);
        map.run(&Command::MarkDown { id: 0 }).unwrap();
        map.run(&Command::MarkOut { id: 0 }).unwrap();
        let mut detector = FailureDetector::new(FailureConfig::default());
        assert!(detector.tick(&map, 10_000_000).is_empty(), "already out; OSD 1 is in its first grace");
        assert!(detector.tick(&map, 10_005_000).is_empty());
        assert_eq!(detector.tick(&map, 10_006_100), vec![Command::MarkDown { id: 1 }]);
    }
}
