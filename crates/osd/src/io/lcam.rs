//! Lock-contention-aware placement of connections on worker threads
//! (issue 29; ../shared/papers/002, Async-LCAM, Algorithm 1): which worker
//! threads serve each connection, decided anew every interval from what
//! the last one measured. Pure: the runtime measures and carries out.
//!
//! Every connection starts on one worker (its home, the one serving the
//! fewest connections). At the end of each interval (3 s by default), per
//! connection, the lock wait its workers summed up (the time from arriving
//! at the connection's lock to holding it) is compared with the threshold
//! (10% of the interval by default):
//! - above it, the workers fight over the connection more than they help
//!   it: the one added most recently stops serving it (never the last one);
//! - at or below it, one more worker serves it: the one, not serving it
//!   yet, that handled the fewest bytes in the interval.
//!
//! One departure from the paper: a connection that carried nothing in the
//! interval gains no worker (another thread polling an idle socket buys
//! nothing and costs wake-ups); the paper's Algorithm 1 adds one to every
//! connection under the threshold.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// A connection, as the runtime names it.
pub type ConnId = u64;
/// A worker thread, by index.
pub type Worker = usize;

/// The paper's interval.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PlacementConfig {
    pub workers: usize,
    /// Lock wait per connection per interval above which it loses a worker.
    pub threshold: Duration,
}

impl PlacementConfig {
    /// `workers` threads, re-placed every `interval`, the threshold at
    /// 10% of it (the paper's choice).
    pub fn new(workers: usize, interval: Duration) -> PlacementConfig {
        assert!(workers > 0, "a placement needs a worker");
        PlacementConfig { workers, threshold: interval / 10 }
    }
}

/// What the runtime measured over one interval.
#[derive(Clone, Debug, Default)]
pub struct IntervalStats {
    /// Per connection: its workers' lock wait, summed.
    pub lock_wait: HashMap<ConnId, Duration>,
    /// Per connection: bytes it carried (received and sent).
    pub conn_bytes: HashMap<ConnId, u64>,
    /// Per worker: bytes it handled, over every connection.
    pub worker_bytes: Vec<u64>,
}

/// A change of which workers serve a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// `worker` starts serving `conn` (adds it to its poll's interest list).
    Add { conn: ConnId, worker: Worker },
    /// `worker` stops serving `conn`.
    Remove { conn: ConnId, worker: Worker },
}

#[derive(Debug)]
pub struct Placement {
    config: PlacementConfig,
    /// Each connection's workers, in the order they were added (the first: its home).
    conns: BTreeMap<ConnId, Vec<Worker>>,
}

impl Placement {
    pub fn new(config: PlacementConfig) -> Placement {
        Placement { config, conns: BTreeMap::new() }
    }

    /// A new connection: its home, the worker serving the fewest
    /// connections (the lowest index among equals).
    pub fn connect(&mut self, conn: ConnId) -> Worker {
        assert!(!self.conns.contains_key(&conn), "connection {conn} placed twice");
        let mut serving = vec![0usize; self.config.workers];
        for workers in self.conns.values() {
            for worker in workers {
                serving[*worker] += 1;
            }
        }
        let home = (0..self.config.workers).min_by_key(|worker| (serving[*worker], *worker)).expect("a worker");
        self.conns.insert(conn, vec![home]);
        home
    }

    /// The connection closed: the workers that served it.
    pub fn disconnect(&mut self, conn: ConnId) -> Vec<Worker> {
        self.conns.remove(&conn).unwrap_or_default()
    }

    pub fn workers_of(&self, conn: ConnId) -> &[Worker] {
        self.conns.get(&conn).map_or(&[], Vec::as_slice)
    }

    /// The paper's `maxevents` for each worker's `epoll_wait`: the
    /// connections placed on the pool (each placement counted) over the
    /// workers, at least 1, so that every worker takes an even share of
    /// the ready connections instead of the first to wake taking them all.
    pub fn max_events(&self) -> usize {
        let placed: usize = self.conns.values().map(Vec::len).sum();
        (placed / self.config.workers).max(1)
    }

    /// Algorithm 1 over every connection, in order: the decisions, which
    /// are already in effect here.
    pub fn place(&mut self, stats: &IntervalStats) -> Vec<Decision> {
        let workers = self.config.workers;
        // The bytes each worker is expected to handle, moved by this round's
        // additions, so that two busy connections do not both pick one worker.
        let mut load: Vec<u64> = (0..workers).map(|w| stats.worker_bytes.get(w).copied().unwrap_or(0)).collect();
        let mut decisions = Vec::new();
        for (conn, serving) in &mut self.conns {
            debug_assert!(!serving.is_empty() && serving.len() <= workers, "connection {conn} on {serving:?}");
            let waited = stats.lock_wait.get(conn).copied().unwrap_or_default();
            let carried = stats.conn_bytes.get(conn).copied().unwrap_or(0);
            if waited > self.config.threshold {
                if serving.len() > 1 {
                    let worker = serving.pop().expect("more than one");
                    decisions.push(Decision::Remove { conn: *conn, worker });
                }
            } else if carried > 0 && serving.len() < workers {
                let worker = (0..workers)
                    .filter(|w| !serving.contains(w))
                    .min_by_key(|w| (load[*w], *w))
                    .expect("a worker not serving it");
                load[worker] += carried / (serving.len() as u64 + 1);
                serving.push(worker);
                decisions.push(Decision::Add { conn: *conn, worker });
            }
            debug_assert!(
                serving.iter().enumerate().all(|(i, w)| !serving[..i].contains(w)),
                "a worker twice on connection {conn}: {serving:?}"
            );
        }
        decisions
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn stats(waits: &[(ConnId, Duration)], bytes: &[(ConnId, u64)], workers: &[u64]) -> IntervalStats {
        IntervalStats {
            lock_wait: waits.iter().copied().collect(),
            conn_bytes: bytes.iter().copied().collect(),
            worker_bytes: workers.to_vec(),
        }
    }

    fn placement(workers: usize) -> Placement {
        Placement::new(PlacementConfig::new(workers, DEFAULT_INTERVAL))
    }

    #[test]
    fn connections_start_on_the_worker_serving_fewest() {
        let mut p = placement(3);
        assert_eq!([p.connect(10), p.connect(11), p.connect(12), p.connect(13)], [0, 1, 2, 0]);
        assert_eq!(p.disconnect(11), vec![1]);
        assert_eq!(p.connect(14), 1, "the worker the closed connection left");
        assert_eq!(p.max_events(), 1);
    }

    /// A busy connection without contention gains a worker an interval,
    /// the least loaded not serving it, until every worker serves it.
    #[test]
    fn a_busy_connection_without_contention_gains_the_least_loaded_worker_each_interval() {
        let mut p = placement(4);
        let heavy = p.connect(1);
        assert_eq!(heavy, 0);
        let quiet = stats(&[(1, 2 * MS)], &[(1, 1 << 30)], &[900, 50, 10, 300]);
        assert_eq!(p.place(&quiet), vec![Decision::Add { conn: 1, worker: 2 }]);
        assert_eq!(p.place(&quiet), vec![Decision::Add { conn: 1, worker: 1 }]);
        assert_eq!(p.place(&quiet), vec![Decision::Add { conn: 1, worker: 3 }]);
        assert!(p.place(&quiet).is_empty(), "every worker serves it already");
        assert_eq!(p.workers_of(1), &[0, 2, 1, 3]);
        assert_eq!(p.max_events(), 1, "one connection placed four times, over four workers");
    }

    /// Lock wait over the threshold (10% of 3 s: 300 ms) takes away the
    /// worker added last; never the home.
    #[test]
    fn contention_over_the_threshold_removes_the_worker_added_last_never_the_home() {
        let mut p = placement(3);
        p.connect(1);
        let busy = stats(&[], &[(1, 1 << 20)], &[0, 0, 0]);
        p.place(&busy);
        p.place(&busy);
        assert_eq!(p.workers_of(1), &[0, 1, 2]);
        let fighting = stats(&[(1, 301 * MS)], &[(1, 1 << 20)], &[0, 0, 0]);
        assert_eq!(p.place(&fighting), vec![Decision::Remove { conn: 1, worker: 2 }]);
        assert_eq!(p.place(&fighting), vec![Decision::Remove { conn: 1, worker: 1 }]);
        assert!(p.place(&fighting).is_empty(), "the home stays");
        assert_eq!(p.workers_of(1), &[0]);
        let at_threshold = stats(&[(1, 300 * MS)], &[(1, 1 << 20)], &[0, 0, 0]);
        assert_eq!(p.place(&at_threshold), vec![Decision::Add { conn: 1, worker: 1 }], "at the threshold it gains");
    }

    /// Under a contention that appears with the third worker, the
    /// connection settles between two and three: it gains the third, loses
    /// it, gains it again (the paper's behaviour: a probe each interval).
    #[test]
    fn the_placement_hovers_at_the_workers_a_connection_can_use() {
        let mut p = placement(4);
        p.connect(1);
        let mut sizes = Vec::new();
        for _ in 0..8 {
            let waited = if p.workers_of(1).len() >= 3 { 500 * MS } else { 10 * MS };
            p.place(&stats(&[(1, waited)], &[(1, 1 << 20)], &[0, 0, 0, 0]));
            sizes.push(p.workers_of(1).len());
        }
        assert_eq!(sizes, vec![2, 3, 2, 3, 2, 3, 2, 3]);
    }

    #[test]
    fn idle_connections_gain_nothing_and_two_busy_ones_spread() {
        let mut p = placement(4);
        for conn in 1..=4 {
            p.connect(conn);
        }
        // Connections 1 and 2 busy (homes 0 and 1), 3 and 4 idle.
        let round = stats(&[], &[(1, 1000), (2, 1000)], &[1000, 1000, 0, 0]);
        let decisions = p.place(&round);
        assert_eq!(
            decisions,
            vec![Decision::Add { conn: 1, worker: 2 }, Decision::Add { conn: 2, worker: 3 }],
            "the second busy connection does not pile onto the worker the first just took"
        );
        assert_eq!(p.workers_of(3), &[2]);
        assert_eq!(p.workers_of(4), &[3]);
        assert_eq!(p.max_events(), 1, "6 placements over 4 workers");
    }
}
