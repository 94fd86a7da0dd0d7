//! The leader's side of the balancer: the OSDs' usage reports go to the
//! map's sans-I/O [`Balancer`], whose moves are proposed as map commands.
//! Reports live in memory on the leader only (a new leader waits for a
//! round of them); they are not part of the map.

use std::time::Instant;

use duplex_map::balancer::{self, Balancer, OsdUsage};
use duplex_map::{ClusterMap, Command, OsdId};

pub struct Balancing {
    balancer: Balancer,
    started: Instant,
}

impl Default for Balancing {
    fn default() -> Self {
        Balancing { balancer: Balancer::default(), started: Instant::now() }
    }
}

impl Balancing {
    fn now_ms(&self) -> u64 {
        self.started.elapsed().as_millis() as u64
    }

    pub fn report(&mut self, map: &ClusterMap, osd: OsdId, usage: OsdUsage) {
        let now = self.now_ms();
        self.balancer.report(map, osd, usage, now);
    }

    /// The balancer's next moves as one command, if due and wanted. Not
    /// the leader: nothing, and the reports are dropped.
    pub fn proposal(&mut self, map: &ClusterMap, is_leader: bool) -> Option<Command> {
        if !is_leader {
            self.balancer.forget();
            return None;
        }
        let now = self.now_ms();
        let moves = self.balancer.look(map, now)?;
        for found in &moves {
            tracing::info!(
                pool = found.pool,
                pg = found.pg,
                from = found.from,
                to = found.to,
                bytes = found.bytes,
                "the balancer moves a PG from a fuller OSD to an emptier one"
            );
        }
        Some(balancer::command(&moves))
    }
}
