//! The monitor's map logic, as the real monitor runs it minus Raft: the
//! map's commands ([`ClusterMap::run`]) and the failure detector with its
//! leases ([`FailureDetector`]), on the simulated clock. One monitor: the
//! simulator tests what the map logic decides, not the consensus under it
//! (Raft is openraft's/raft-rs's job and the real cluster tests cover the
//! three-monitor case).

use std::sync::Arc;

use duplex_map::{ClusterMap, Command, FailureConfig, FailureDetector, OsdId};

pub struct SimMonitor {
    pub map: Arc<ClusterMap>,
    detector: FailureDetector,
    /// OSDs the failure detector marked down (a run with none tested no failover).
    pub marked_down: u64,
}

impl SimMonitor {
    pub fn new(fsid: [u8; 16], failure: FailureConfig) -> SimMonitor {
        SimMonitor { map: Arc::new(ClusterMap::new(fsid)), detector: FailureDetector::new(failure), marked_down: 0 }
    }

    /// Runs a command; whether the map changed. A refused command is a bug
    /// of the simulator's, not a fault to survive.
    pub fn run(&mut self, command: &Command) -> bool {
        let mut map = (*self.map).clone();
        match map.run(command) {
            Ok(Some(_)) => {
                self.map = Arc::new(map);
                true
            }
            Ok(None) => false,
            Err(err) => panic!("the simulated monitor refused {command:?}: {err}"),
        }
    }

    pub fn boot(&mut self, osd: OsdId) -> bool {
        tracing::debug!(osd, "boot");
        self.run(&Command::OsdBoot {
            id: osd,
            addr: format!("sim-osd-{osd}"),
            host: format!("host-{osd}"),
            weight: 1 << 16,
        })
    }

    /// A heartbeat that arrived at `now_us`: the lease granted, in microseconds.
    pub fn heartbeat(&mut self, osd: OsdId, now_us: u64) -> u64 {
        self.detector.heartbeat(osd, now_us / 1000, &self.map) * 1000
    }

    /// The detector's pass; whether the map changed.
    pub fn tick(&mut self, now_us: u64) -> bool {
        let commands = self.detector.tick(&self.map, now_us / 1000);
        let mut changed = false;
        for command in commands {
            tracing::debug!(at = now_us, ?command, "failure detector");
            let applied = self.run(&command);
            if applied && matches!(command, Command::MarkDown { .. } | Command::MarkIncarnationDown { .. }) {
                self.marked_down += 1;
            }
            changed |= applied;
        }
        changed
    }
}
