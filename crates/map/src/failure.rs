//! Failure detection, as a pure state machine run by the monitor leader.
//!
//! Inputs carry their own time (milliseconds from any monotonic origin):
//! OSD heartbeats, failure reports from peers, and ticks. Output: the
//! commands to propose, which are `MarkIncarnationDown` and `MarkOut`.
//!
//! - An up OSD whose last heartbeat is older than `grace` is marked down.
//! - An up OSD reported failed by `min_reporters` distinct peers within
//!   `grace` gets no lease from then on, and is marked down as soon as the
//!   last one it got has run out. One flaky peer cannot evict a healthy
//!   OSD.
//!
//! **Leases.** Each acknowledged heartbeat grants the OSD a lease of
//! [`FailureDetector::lease_ms`] (two thirds of the grace), counted by the
//! OSD from when it *sent* the heartbeat; it serves clients only while it
//! holds one. The detector never marks an OSD down while a lease it granted
//! may still run: a silent OSD is marked down after the grace, a third
//! longer than its last lease, and a condemned one gets no new lease. So by
//! the time any OSD acts on the map that makes a new primary, the old one
//! has stopped serving reads, even when it is cut off and never sees that
//! map (issue 7's stale-read scenario). The third of the grace in between
//! absorbs scheduling delays and clock-rate differences; no clocks need to
//! agree.
//! - **A process that is gone** is marked down at once: a peer whose
//!   connection to it broke found its address refusing connections
//!   ([`FailureDetector::report_refused`]; Ceph's
//!   `osd_fast_fail_on_connection_refused`). Nothing listens there, so no
//!   process of that incarnation can serve a read any more, and its lease
//!   need not run out first. A hung OSD (stopped, a stuck disk) still
//!   accepts connections, and is found by the grace as before.
//! - A down OSD that stays down (and in) for `down_out_interval` is marked
//!   out, so its data is re-replicated elsewhere.
//! - A down OSD returns through `OsdBoot`, not through a heartbeat: it must
//!   re-register before it serves again.
//! - A boot is a new incarnation (a new `state_epoch`), and a sign of life:
//!   the detector forgets the old incarnation's silence, reports and
//!   condemnation, and gives the new one a fresh grace. Without this, an
//!   OSD that restarted within the grace (the map still showing it up) was
//!   marked down for its old process's silence, and one that booted again
//!   between two ticks stayed condemned, so it was marked down at every
//!   tick and flapped for good (found by the simulator, seed 130).
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
    /// When each OSD was last granted a lease (the heartbeat's arrival,
    /// which is after the OSD sent it: the lease ends no later than this
    /// plus `lease_ms`).
    last_granted: BTreeMap<OsdId, u64>,
    /// OSDs to be marked down: they get no lease any more.
    condemned: BTreeSet<OsdId>,
    /// The incarnation (`state_epoch`) each up OSD had at the last tick.
    incarnation: BTreeMap<OsdId, u64>,
    /// OSDs whose address refused a peer's connection, with the
    /// incarnation the peer meant: marked down at the next tick.
    refused: BTreeMap<OsdId, u64>,
}

impl FailureDetector {
    pub fn new(config: FailureConfig) -> FailureDetector {
        FailureDetector { config, ..FailureDetector::default() }
    }

    /// How long a lease lasts: two thirds of the grace.
    pub fn lease_ms(&self) -> u64 {
        self.config.grace_ms * 2 / 3
    }

    /// Takes a heartbeat; returns the lease it grants in milliseconds, or
    /// 0 when the OSD may not serve: `map` has it down (it must boot again)
    /// or it is about to be marked down.
    pub fn heartbeat(&mut self, osd: OsdId, now_ms: u64, map: &ClusterMap) -> u64 {
        let last = self.last_heard.entry(osd).or_insert(now_ms);
        *last = (*last).max(now_ms);
        // Peer reports stand even so: an OSD that reaches the monitor but
        // not its peers cannot replicate, and must go down. They expire instead.
        let up = map.osds.get(&osd).is_some_and(|o| o.up);
        if !up || self.condemned.contains(&osd) {
            return 0;
        }
        let granted = self.last_granted.entry(osd).or_insert(now_ms);
        *granted = (*granted).max(now_ms);
        self.lease_ms()
    }

    /// `reporter` could not reach `target`.
    pub fn report_failure(&mut self, target: OsdId, reporter: OsdId, now_ms: u64) {
        if target != reporter {
            self.reports.entry(target).or_default().insert(reporter, now_ms);
        }
    }

    /// `reporter`'s connection to `target` broke, and `target`'s address
    /// (of its incarnation `incarnation`, as the reporter's map had it)
    /// refuses connections: the process is gone. A report about an older
    /// incarnation than the map's is ignored at the tick (it restarted).
    pub fn report_refused(&mut self, target: OsdId, incarnation: u64, reporter: OsdId) {
        if target != reporter {
            self.report_gone(target, incarnation);
        }
    }

    /// The monitor's own finding: `target`'s heartbeat connection ended and
    /// its address (of incarnation `incarnation`) refuses connections. As
    /// [`FailureDetector::report_refused`], for an OSD no peer reports
    /// (one with no PGs shared, or alone).
    pub fn report_gone(&mut self, target: OsdId, incarnation: u64) {
        self.refused.insert(target, incarnation);
    }

    /// The commands to propose now, in OSD order.
    pub fn tick(&mut self, map: &ClusterMap, now_ms: u64) -> Vec<Command> {
        let mut commands = Vec::new();
        let grace = self.config.grace_ms;
        for osd in map.osds.values() {
            let id = osd.id;
            if osd.up {
                self.down_since.remove(&id);
                if self.incarnation.insert(id, osd.state_epoch).is_some_and(|seen| seen != osd.state_epoch) {
                    // It booted since the last tick: what the detector
                    // knew was about the process before.
                    self.last_heard.insert(id, now_ms);
                    self.reports.remove(&id);
                    self.condemned.remove(&id);
                }
                if self.refused.get(&id).is_some_and(|incarnation| *incarnation != osd.state_epoch) {
                    // About a process before this one.
                    self.refused.remove(&id);
                }
                if self.refused.contains_key(&id) {
                    // Gone: no process of this incarnation serves any more.
                    self.condemned.insert(id);
                    commands.push(Command::MarkIncarnationDown { id, incarnation: osd.state_epoch });
                    continue;
                }
                let last = *self.last_heard.entry(id).or_insert(now_ms);
                let reporters: BTreeSet<OsdId> = self
                    .reports
                    .get(&id)
                    .map(|r| r.iter().filter(|(_, t)| now_ms.saturating_sub(**t) <= grace).map(|(r, _)| *r).collect())
                    .unwrap_or_default();
                let silent = now_ms.saturating_sub(last) > grace;
                if reporters.len() >= self.config.min_reporters.max(1) {
                    self.condemned.insert(id);
                }
                let lease_over = self.last_granted.get(&id).is_none_or(|t| now_ms.saturating_sub(*t) > self.lease_ms());
                debug_assert!(!silent || lease_over, "the grace outlasts every lease");
                if silent || (self.condemned.contains(&id) && lease_over) {
                    self.condemned.insert(id);
                    commands.push(Command::MarkIncarnationDown { id, incarnation: osd.state_epoch });
                }
            } else {
                self.incarnation.remove(&id);
                self.last_heard.remove(&id);
                self.reports.remove(&id);
                self.last_granted.remove(&id);
                self.condemned.remove(&id);
                self.refused.remove(&id);
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
        self.last_granted.retain(|id, _| map.osds.contains_key(id));
        self.condemned.retain(|id| map.osds.contains_key(id));
        self.incarnation.retain(|id, _| map.osds.contains_key(id));
        self.refused.retain(|id, _| map.osds.contains_key(id));
        commands
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The detector's verdict on `id` as the map has it now.
    fn down(map: &ClusterMap, id: OsdId) -> Command {
        Command::MarkIncarnationDown { id, incarnation: map.osds[&id].state_epoch }
    }

    fn map_with(osds: u32) -> ClusterMap {
        let mut map = ClusterMap::new([0; 16]);
        for id in 0..osds {
            boot(&mut map, id);
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
                    detector.heartbeat(id, now, map);
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
        assert!(matches!(down, Command::MarkIncarnationDown { id: 1, .. }), "{down:?}");
        // Last heartbeat at 9 s; down once silent for more than 6 s, within one tick.
        assert!((15_000..=15_200).contains(&down_at), "down at {down_at}");
        let (out_at, ref out) = log[1];
        assert_eq!(*out, Command::MarkOut { id: 1 });
        // Counted from the first tick that sees it down (one tick after the proposal).
        assert!((down_at + 600_000..=down_at + 600_100).contains(&out_at), "out at {out_at}");
    }

    #[test]
    fn two_reporters_condemn_an_osd_which_goes_down_when_its_lease_ends() {
        let map = map_with(4);
        let mut detector = FailureDetector::new(FailureConfig::default());
        for id in 0..4 {
            assert_eq!(detector.heartbeat(id, 0, &map), 4_000, "a lease of two thirds of the grace");
        }
        detector.report_failure(3, 0, 1000);
        assert!(detector.tick(&map, 1000).is_empty(), "a single reporter is not enough");
        detector.report_failure(3, 3, 1000); // an OSD cannot report itself
        assert!(detector.tick(&map, 1000).is_empty());
        assert_eq!(detector.heartbeat(3, 1000, &map), 4_000);
        detector.report_failure(3, 1, 1100);
        assert!(detector.tick(&map, 1100).is_empty(), "its lease from 1 s still runs");
        assert_eq!(detector.heartbeat(3, 2000, &map), 0, "condemned: no new lease");
        assert!(detector.tick(&map, 5000).is_empty(), "the lease runs until 5 s");
        assert_eq!(detector.tick(&map, 5001), vec![down(&map, 3)]);
    }

    #[test]
    fn a_gone_process_is_marked_down_at_once_but_not_a_newer_incarnation() {
        let mut map = map_with(3);
        let mut detector = FailureDetector::new(FailureConfig::default());
        for id in 0..3 {
            detector.heartbeat(id, 0, &map);
        }
        assert!(detector.tick(&map, 0).is_empty());
        let gone = map.osds[&2].state_epoch;
        detector.report_refused(2, 2, 0); // an OSD cannot report itself
        assert!(detector.tick(&map, 10).is_empty());
        detector.report_refused(2, gone, 0);
        assert_eq!(detector.tick(&map, 20), vec![down(&map, 2)], "without waiting for its lease");
        assert_eq!(detector.heartbeat(2, 30, &map), 0, "and no lease any more");
        map.run(&Command::MarkDown { id: 2 }).unwrap();
        // A report about a process before the one the map has now is stale.
        boot(&mut map, 1);
        detector.tick(&map, 40);
        detector.report_refused(1, map.osds[&1].state_epoch - 1, 0);
        assert!(detector.tick(&map, 50).is_empty(), "osd.1 restarted since");
    }

    #[test]
    fn reports_expire_after_the_grace_and_heartbeats_do_not_clear_them() {
        let map = map_with(3);
        let mut detector = FailureDetector::new(FailureConfig::default());
        let beat_all = |d: &mut FailureDetector, t| {
            (0..3).for_each(|id| {
                d.heartbeat(id, t, &map);
            })
        };
        beat_all(&mut detector, 0);
        detector.report_failure(2, 0, 1_000);
        beat_all(&mut detector, 7_000);
        detector.report_failure(2, 1, 7_500);
        assert!(detector.tick(&map, 7_500).is_empty(), "the report from 1 s expired before the one at 7.5 s");
        detector.report_failure(2, 0, 8_000);
        beat_all(&mut detector, 8_000);
        // Two fresh reports stand although OSD 2 still reaches the monitor:
        // it cannot reach its peers, so it cannot replicate. It goes down
        // once the lease of its last heartbeat has run out.
        assert!(detector.tick(&map, 8_000).is_empty());
        assert_eq!(detector.tick(&map, 12_001), vec![down(&map, 2)]);
    }

    #[test]
    fn no_lease_for_a_down_osd_and_none_outlives_the_grace() {
        let mut map = map_with(2);
        let mut detector = FailureDetector::new(FailureConfig::default());
        let lease = detector.heartbeat(1, 0, &map);
        assert!(lease > 0 && lease < FailureConfig::default().grace_ms);
        map.run(&Command::MarkDown { id: 1 }).unwrap();
        assert_eq!(detector.heartbeat(1, 100, &map), 0, "down in the map: boot first");
        // Silent after its last lease: marked down only once that lease is over.
        let map = map_with(2);
        let mut detector = FailureDetector::new(FailureConfig::default());
        detector.heartbeat(0, 0, &map);
        detector.heartbeat(1, 0, &map);
        for now in (0..=6_000).step_by(100) {
            detector.heartbeat(0, now, &map);
            assert!(detector.tick(&map, now).is_empty(), "at {now}");
        }
        assert_eq!(detector.tick(&map, 6_100), vec![down(&map, 1)]);
        assert_eq!(detector.heartbeat(1, 6_200, &map), 0, "a late heartbeat gets no lease once condemned");
    }

    #[test]
    fn an_operator_out_is_not_repeated_and_a_fresh_leader_grants_a_grace() {
        let mut map = map_with(2);
        map.run(&Command::MarkDown { id: 0 }).unwrap();
        map.run(&Command::MarkOut { id: 0 }).unwrap();
        let mut detector = FailureDetector::new(FailureConfig::default());
        assert!(detector.tick(&map, 10_000_000).is_empty(), "already out; OSD 1 is in its first grace");
        assert!(detector.tick(&map, 10_005_000).is_empty());
        assert_eq!(detector.tick(&map, 10_006_100), vec![down(&map, 1)]);
    }

    fn boot(map: &mut ClusterMap, id: OsdId) {
        map.run(&Command::OsdBoot {
            id,
            addr: format!("127.0.0.1:{}", 7000 + id),
            host: format!("h{id}"),
            weight: 1 << 16,
        })
        .unwrap();
    }

    /// Issue 24: an OSD restarted so fast that the map still shows its old
    /// incarnation up replaces it with its boot alone, at once: a new
    /// `state_epoch` (so every PG it serves has a new interval and its
    /// primary peers again), the new address, and the operator's "in" kept;
    /// the old incarnation's refused-connection reports no longer count.
    #[test]
    fn a_boot_replaces_an_incarnation_the_map_still_shows_up() {
        let mut map = map_with(3);
        let before = map.osds[&1].clone();
        assert!(before.up);
        let mut detector = FailureDetector::new(FailureConfig::default());
        for id in 0..3 {
            detector.heartbeat(id, 0, &map);
        }
        map.run(&Command::OsdBoot { id: 1, addr: "127.0.0.1:7999".into(), host: "h1".into(), weight: 1 << 16 })
            .unwrap();
        let after = &map.osds[&1];
        assert!(after.up && after.is_in);
        assert_eq!(after.addr, "127.0.0.1:7999");
        assert_eq!(after.state_epoch, map.epoch, "a new incarnation, in the boot's own epoch");
        assert!(after.state_epoch > before.state_epoch);
        // A peer that saw the old incarnation refuse connections reports it:
        // the report names the old incarnation, so the new one stays up.
        detector.report_refused(1, before.state_epoch, 0);
        detector.report_refused(1, before.state_epoch, 2);
        assert!(detector.tick(&map, 100).is_empty(), "a report about the old incarnation marks nothing down");
    }

    #[test]
    fn the_monitors_own_finding_marks_the_incarnation_down_at_the_next_tick() {
        let map = map_with(3);
        let mut detector = FailureDetector::new(FailureConfig::default());
        for id in 0..3 {
            detector.heartbeat(id, 0, &map);
        }
        let incarnation = map.osds[&1].state_epoch;
        detector.report_gone(1, incarnation - 1);
        assert!(detector.tick(&map, 100).is_empty(), "a finding about an older incarnation marks nothing down");
        detector.report_gone(1, incarnation);
        assert_eq!(detector.tick(&map, 200), vec![Command::MarkIncarnationDown { id: 1, incarnation }]);
    }

    /// Found by CI (a_device_flush_error_stops_the_osd_and_the_cluster_recovers):
    /// a peer reports the old process refused, the detector proposes its
    /// verdict, and the restarted OSD's boot commits first. The verdict names
    /// the old incarnation, so it leaves the new one up (a plain MarkDown
    /// took it down, and the new process waited 30 s for a map with itself up).
    #[test]
    fn a_verdict_on_an_old_incarnation_committed_after_a_boot_changes_nothing() {
        let mut map = map_with(3);
        let mut detector = FailureDetector::new(FailureConfig::default());
        detector.tick(&map, 0);
        detector.report_refused(1, map.osds[&1].state_epoch, 0);
        let verdict = detector.tick(&map, 10);
        assert_eq!(verdict, vec![down(&map, 1)]);
        boot(&mut map, 1);
        assert_eq!(map.run(&verdict[0]).unwrap(), None, "the verdict is about a process that is gone");
        assert!(map.osds[&1].up);
        let current = down(&map, 1);
        assert!(map.run(&current).unwrap().is_some(), "a verdict on the current incarnation marks it down");
        assert!(!map.osds[&1].up);
    }

    /// Found by the simulator (seed 130): a restart within the grace, then
    /// boots between ticks, flapped for good.
    #[test]
    fn a_boot_is_a_sign_of_life_and_clears_the_old_incarnations_condemnation() {
        let mut map = map_with(2);
        let mut detector = FailureDetector::new(FailureConfig::default());
        detector.heartbeat(1, 0, &map);
        assert!(detector.tick(&map, 0).is_empty());
        // osd.1 dies at once and restarts at 5.5 s, within the grace: the
        // map still shows it up. Its first heartbeat would come later.
        for now in (100..=11_500).step_by(100) {
            if now == 5_500 {
                boot(&mut map, 1);
            }
            detector.heartbeat(0, now, &map);
            assert!(detector.tick(&map, now).is_empty(), "the new incarnation gets a fresh grace (at {now})");
        }
        // Silent for the whole grace since its boot: condemned and marked
        // down. It boots again before the next tick, and heartbeats: it is
        // up for good.
        assert_eq!(detector.tick(&map, 11_600), vec![down(&map, 1)]);
        map.run(&Command::MarkDown { id: 1 }).unwrap();
        boot(&mut map, 1);
        for now in (11_700..=30_000).step_by(100) {
            detector.heartbeat(0, now, &map);
            if now % 1_000 == 0 {
                assert!(detector.heartbeat(1, now, &map) > 0, "the new incarnation gets leases (at {now})");
            }
            assert!(detector.tick(&map, now).is_empty(), "no flapping (at {now})");
        }
    }
}
