//! The modelled network: what TCP between daemons does, and what a bad
//! network does to it.
//!
//! Each ordered pair of nodes talks over a few *lanes* (the real OSD has
//! one connection per priority thread, so a primary's entries for one PG
//! can reach a replica out of order): a lane delivers in order, after a
//! seeded delay, until it breaks. A break (a dropped segment, a crash, a
//! partition) loses everything in flight on it; later messages go over a
//! new connection. Partitions cut a pair of nodes in both directions.

use std::collections::{BTreeMap, BTreeSet};

use rand::rngs::StdRng;
use rand::Rng;

use crate::Node;

/// How the network behaves; all times in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct NetConfig {
    pub min_delay_us: u64,
    pub max_delay_us: u64,
    /// The chance that a message waits a long time (a retransmit, a queue).
    pub spike_chance: f64,
    pub spike_max_us: u64,
    /// The chance that a message is lost, and its connection with it.
    pub drop_chance: f64,
    /// Connections per ordered pair of nodes.
    pub lanes: u8,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            min_delay_us: 50,
            max_delay_us: 400,
            spike_chance: 0.01,
            spike_max_us: 30_000,
            drop_chance: 0.001,
            lanes: 2,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct LaneId {
    pub from: Node,
    pub to: Node,
    pub lane: u8,
}

#[derive(Default)]
struct Lane {
    /// Bumped at every break: messages sent before it are lost.
    generation: u64,
    /// When the last message sent on it arrives (later ones arrive after).
    last_arrival: u64,
}

/// Why a message did not go out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lost {
    /// The pair is cut (a partition): nothing tells either end; their
    /// requests time out.
    Cut,
    /// Its connection broke (a reset): both ends see the error at once, as
    /// a socket read or write that fails, and a request waiting on it fails
    /// without waiting for its deadline.
    ConnectionBroke,
}

/// Where a sent message is, for the event queue.
#[derive(Clone, Copy, Debug)]
pub struct InFlight {
    pub lane: LaneId,
    pub generation: u64,
    pub arrives: u64,
}

pub struct Network {
    pub config: NetConfig,
    lanes: BTreeMap<LaneId, Lane>,
    /// Pairs that cannot reach each other, smaller node first.
    cut: BTreeSet<(Node, Node)>,
    pub sent: u64,
    pub lost: u64,
}

fn pair(a: Node, b: Node) -> (Node, Node) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

impl Network {
    pub fn new(config: NetConfig) -> Network {
        Network { config, lanes: BTreeMap::new(), cut: BTreeSet::new(), sent: 0, lost: 0 }
    }

    /// Sends a message at `now`: when and on what it arrives, or why it
    /// is lost (the pair is cut, or the seeded network drops it and its
    /// connection).
    pub fn send(&mut self, rng: &mut StdRng, now: u64, from: Node, to: Node) -> Result<InFlight, Lost> {
        self.sent += 1;
        let lane = LaneId { from, to, lane: rng.gen_range(0..self.config.lanes.max(1)) };
        if self.is_cut(from, to) {
            self.lost += 1;
            return Err(Lost::Cut);
        }
        if rng.gen_bool(self.config.drop_chance) {
            self.lost += 1;
            self.break_lane(lane);
            return Err(Lost::ConnectionBroke);
        }
        let mut delay = rng.gen_range(self.config.min_delay_us..=self.config.max_delay_us);
        if rng.gen_bool(self.config.spike_chance) {
            delay += rng.gen_range(0..=self.config.spike_max_us);
        }
        let state = self.lanes.entry(lane).or_default();
        let arrives = (now + delay).max(state.last_arrival);
        state.last_arrival = arrives;
        Ok(InFlight { lane, generation: state.generation, arrives })
    }

    /// Whether a message sent as `flight` still arrives (its connection
    /// did not break, its pair is not cut).
    pub fn arrives(&mut self, flight: &InFlight) -> bool {
        let alive = !self.is_cut(flight.lane.from, flight.lane.to)
            && self.lanes.get(&flight.lane).is_some_and(|l| l.generation == flight.generation);
        if !alive {
            self.lost += 1;
        }
        alive
    }

    fn break_lane(&mut self, lane: LaneId) {
        let state = self.lanes.entry(lane).or_default();
        state.generation += 1;
        state.last_arrival = 0;
    }

    /// Breaks every connection of `node` (it crashed, or a peer dropped it).
    pub fn break_node(&mut self, node: Node) {
        let touching: Vec<LaneId> = self.lanes.keys().filter(|l| l.from == node || l.to == node).copied().collect();
        for lane in touching {
            self.break_lane(lane);
        }
    }

    /// Breaks the connections between `a` and `b` (one side dropped them).
    pub fn break_pair(&mut self, a: Node, b: Node) {
        let touching: Vec<LaneId> =
            self.lanes.keys().filter(|l| (l.from == a && l.to == b) || (l.from == b && l.to == a)).copied().collect();
        for lane in touching {
            self.break_lane(lane);
        }
    }

    pub fn is_cut(&self, a: Node, b: Node) -> bool {
        self.cut.contains(&pair(a, b))
    }

    pub fn cut(&mut self, a: Node, b: Node) {
        if a != b {
            self.cut.insert(pair(a, b));
            self.break_pair(a, b);
        }
    }

    pub fn heal_all(&mut self) {
        self.cut.clear();
    }

    pub fn heal(&mut self, a: Node, b: Node) {
        self.cut.remove(&pair(a, b));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn a_lane_delivers_in_order_and_a_break_loses_what_was_in_flight() {
        let mut rng = StdRng::seed_from_u64(7);
        let config = NetConfig { drop_chance: 0.0, lanes: 1, ..NetConfig::default() };
        let mut net = Network::new(config);
        let (a, b) = (Node::Osd(0), Node::Osd(1));
        let flights: Vec<InFlight> = (0..100).map(|t| net.send(&mut rng, t, a, b).unwrap()).collect();
        assert!(flights.windows(2).all(|w| w[0].arrives <= w[1].arrives), "one lane is FIFO");
        net.break_pair(a, b);
        assert!(flights.iter().all(|f| !net.arrives(f)), "a break loses everything in flight");
        let later = net.send(&mut rng, 1_000, a, b).unwrap();
        assert!(net.arrives(&later), "a new connection carries later messages");
        net.cut(a, b);
        assert!(matches!(net.send(&mut rng, 2_000, b, a), Err(Lost::Cut)), "a cut pair reaches nothing");
        assert!(!net.arrives(&later), "nor does what was in flight");
        net.heal(a, b);
        let healed = net.send(&mut rng, 3_000, b, a).unwrap();
        assert!(net.arrives(&healed));
    }
}
