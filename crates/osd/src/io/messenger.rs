//! What the priority threads share about connections: the policy that
//! says which threads serve each one (`connection_policy`, issue 29), the
//! placement of `lcam` carried out every interval, and what each thread
//! and each shared connection carried, for the metrics and the admin
//! socket (`duplex daemon SOCKET connections`).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use crate::config::ConnectionPolicy;
use crate::io::conn_cell::ConnCell;
use crate::io::lcam::{Decision, IntervalStats, Placement, PlacementConfig};
use crate::messages::{Completion, Mailbox};

/// Tokens below this are the listener's and the waker's.
pub const FIRST_CONN: usize = 2;
/// Events one `epoll_wait` takes under `pinned`.
pub const PINNED_MAX_EVENTS: usize = 256;

/// One thread's counters, each on its own cache line: every read batch
/// adds to them.
#[repr(align(128))]
#[derive(Default)]
struct WorkerCounters {
    messages: AtomicU64,
    bytes: AtomicU64,
}

/// A shared connection as the admin socket shows it.
#[derive(Clone, Debug, serde::Serialize)]
pub struct ConnReport {
    pub token: usize,
    pub peer: Option<String>,
    /// The threads serving it, in the order they were added.
    pub workers: Vec<usize>,
    /// Over the last interval.
    pub lock_wait_us: u64,
    pub bytes: u64,
    /// Since it was accepted.
    pub total_lock_wait_us: u64,
    pub total_bytes: u64,
}

struct Tracked {
    cell: Arc<ConnCell>,
    last_wait_ns: u64,
    last_bytes: u64,
    total_wait_ns: u64,
    total_bytes: u64,
}

impl Tracked {
    fn new(cell: &Arc<ConnCell>) -> Tracked {
        Tracked { cell: cell.clone(), last_wait_ns: 0, last_bytes: 0, total_wait_ns: 0, total_bytes: 0 }
    }
}

struct Inner {
    /// `lcam` and `naive`: the accepted connections, which several threads serve.
    conns: BTreeMap<usize, Tracked>,
    placement: Placement,
    /// Each thread's bytes when the placement last looked.
    worker_bytes_seen: Vec<u64>,
}

pub struct Messenger {
    pub policy: ConnectionPolicy,
    workers: usize,
    next_token: AtomicUsize,
    next_home: AtomicUsize,
    counters: Box<[WorkerCounters]>,
    inner: Mutex<Inner>,
    max_events: AtomicUsize,
    added: AtomicU64,
    removed: AtomicU64,
    /// Lock wait over every connection closed or measured, nanoseconds.
    lock_wait_ns: AtomicU64,
    /// Requests that came to run before an earlier one of their lane and
    /// waited for it (`order.rs`).
    order_waits: AtomicU64,
}

impl Messenger {
    pub fn new(policy: ConnectionPolicy, workers: usize, interval: Duration) -> Messenger {
        assert!(workers > 0, "a messenger without threads");
        Messenger {
            policy,
            workers,
            next_token: AtomicUsize::new(FIRST_CONN),
            next_home: AtomicUsize::new(0),
            counters: (0..workers).map(|_| WorkerCounters::default()).collect(),
            inner: Mutex::new(Inner {
                conns: BTreeMap::new(),
                placement: Placement::new(PlacementConfig::new(workers, interval)),
                worker_bytes_seen: vec![0; workers],
            }),
            max_events: AtomicUsize::new(if policy == ConnectionPolicy::Pinned { PINNED_MAX_EVENTS } else { 1 }),
            added: AtomicU64::new(0),
            removed: AtomicU64::new(0),
            lock_wait_ns: AtomicU64::new(0),
            order_waits: AtomicU64::new(0),
        }
    }

    fn inner(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A connection's token, unique in the process: every thread's poll
    /// and table name it so.
    pub fn token(&self) -> usize {
        let token = self.next_token.fetch_add(1, Ordering::Relaxed);
        debug_assert!(token >= FIRST_CONN, "connection token {token} is the listener's or the waker's");
        token
    }

    /// Whether an accepted connection is served by several threads (and
    /// so its requests take tickets).
    pub fn shares_accepted(&self) -> bool {
        self.policy != ConnectionPolicy::Pinned
    }

    /// The threads that serve a newly accepted connection.
    pub fn place_new(&self, cell: &Arc<ConnCell>) -> Vec<usize> {
        match self.policy {
            ConnectionPolicy::Pinned => vec![self.next_home.fetch_add(1, Ordering::Relaxed) % self.workers],
            ConnectionPolicy::Naive => {
                let mut inner = self.inner();
                inner.conns.insert(cell.token, Tracked::new(cell));
                // Every connection on every thread: each poll holds them all.
                self.max_events.store(inner.conns.len().max(1), Ordering::Relaxed);
                (0..self.workers).collect()
            }
            ConnectionPolicy::Lcam => {
                let mut inner = self.inner();
                inner.conns.insert(cell.token, Tracked::new(cell));
                let home = inner.placement.connect(cell.token as u64);
                debug_assert!(
                    home < self.workers,
                    "connection {} placed on thread {home} of {}",
                    cell.token,
                    self.workers
                );
                self.max_events.store(inner.placement.max_events(), Ordering::Relaxed);
                vec![home]
            }
        }
    }

    /// A shared connection closed: forget it (its lock wait stays counted).
    pub fn disconnect(&self, cell: &ConnCell) {
        if self.policy == ConnectionPolicy::Pinned {
            return;
        }
        let mut inner = self.inner();
        let (wait, _) = cell.take_interval();
        self.lock_wait_ns.fetch_add(wait, Ordering::Relaxed);
        inner.conns.remove(&cell.token);
        if self.policy == ConnectionPolicy::Lcam {
            inner.placement.disconnect(cell.token as u64);
            self.max_events.store(inner.placement.max_events(), Ordering::Relaxed);
        } else {
            self.max_events.store(inner.conns.len().max(1), Ordering::Relaxed);
        }
    }

    /// The `maxevents` of one `epoll_wait` (the paper's connections ÷ threads).
    pub fn max_events(&self) -> usize {
        self.max_events.load(Ordering::Relaxed)
    }

    /// Thread `worker` read `messages` messages of `bytes` bytes, or sent a reply.
    pub fn count(&self, worker: usize, messages: u64, bytes: u64) {
        debug_assert!(worker < self.workers, "thread {worker} of {}", self.workers);
        let counters = &self.counters[worker];
        counters.messages.fetch_add(messages, Ordering::Relaxed);
        counters.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    /// A request on a shared connection waited for an earlier one of its lane.
    pub fn order_waited(&self) {
        self.order_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// One interval's end: measure every shared connection, and under
    /// `lcam` place them anew (Algorithm 1), telling the threads that
    /// start or stop serving one.
    pub fn round(&self, mailboxes: &[Mailbox]) -> Vec<Decision> {
        assert_eq!(mailboxes.len(), self.workers, "a mailbox per thread");
        let mut inner = self.inner();
        let inner = &mut *inner;
        let mut stats = IntervalStats::default();
        for (token, tracked) in inner.conns.iter_mut() {
            let cell = &tracked.cell;
            let (wait, bytes) = cell.take_interval();
            tracked.last_wait_ns = wait;
            tracked.last_bytes = bytes;
            tracked.total_wait_ns += wait;
            tracked.total_bytes += bytes;
            self.lock_wait_ns.fetch_add(wait, Ordering::Relaxed);
            stats.lock_wait.insert(*token as u64, Duration::from_nanos(wait));
            stats.conn_bytes.insert(*token as u64, bytes);
        }
        for (worker, seen) in inner.worker_bytes_seen.iter_mut().enumerate() {
            let now = self.counters[worker].bytes.load(Ordering::Relaxed);
            stats.worker_bytes.push(now - *seen);
            *seen = now;
        }
        debug_assert_eq!(stats.worker_bytes.len(), self.workers, "a figure per thread");
        if self.policy != ConnectionPolicy::Lcam {
            return Vec::new();
        }
        let decisions = inner.placement.place(&stats);
        for decision in &decisions {
            let (conn, worker, completion) = match *decision {
                Decision::Add { conn, worker } => {
                    self.added.fetch_add(1, Ordering::Relaxed);
                    let cell = inner.conns.get(&(conn as usize)).map(|t| t.cell.clone());
                    let Some(cell) = cell else { continue };
                    (conn, worker, Completion::Serve(cell))
                }
                Decision::Remove { conn, worker } => {
                    self.removed.fetch_add(1, Ordering::Relaxed);
                    (conn, worker, Completion::Unserve(conn as usize))
                }
            };
            tracing::debug!(conn, worker, ?decision, "connection placement");
            mailboxes[worker].post_and_wake(completion);
        }
        self.max_events.store(inner.placement.max_events(), Ordering::Relaxed);
        decisions
    }

    /// The shared connections, as the last interval found them.
    pub fn report(&self) -> Vec<ConnReport> {
        let inner = self.inner();
        inner
            .conns
            .iter()
            .map(|(token, tracked)| ConnReport {
                token: *token,
                peer: tracked.cell.peer.map(|a| a.to_string()),
                workers: match self.policy {
                    ConnectionPolicy::Lcam => inner.placement.workers_of(*token as u64).to_vec(),
                    _ => (0..self.workers).collect(),
                },
                lock_wait_us: tracked.last_wait_ns / 1000,
                bytes: tracked.last_bytes,
                total_lock_wait_us: tracked.total_wait_ns / 1000,
                total_bytes: tracked.total_bytes,
            })
            .collect()
    }

    /// The Prometheus lines (`crate::metrics::Metrics::render`).
    /// `threads`: every thread's name and CPU seconds (`crate::metrics::thread_cpu_seconds`).
    pub fn render(&self, out: &mut String, threads: &[(String, f64)]) {
        let policy = match self.policy {
            ConnectionPolicy::Pinned => "pinned",
            ConnectionPolicy::Lcam => "lcam",
            ConnectionPolicy::Naive => "naive",
        };
        let _ = writeln!(
            out,
            "# HELP duplex_osd_connection_policy Which threads serve each connection (the label).\n\
             # TYPE duplex_osd_connection_policy gauge\nduplex_osd_connection_policy{{policy=\"{policy}\"}} 1"
        );
        for (name, help, pick) in [
            (
                "duplex_osd_thread_messages_total",
                "Messages a priority thread read.",
                (|c: &WorkerCounters| c.messages.load(Ordering::Relaxed)) as fn(&WorkerCounters) -> u64,
            ),
            (
                "duplex_osd_thread_bytes_total",
                "Bytes of the messages a priority thread read and the replies it sent.",
                |c: &WorkerCounters| c.bytes.load(Ordering::Relaxed),
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for (thread, counters) in self.counters.iter().enumerate() {
                let _ = writeln!(out, "{name}{{thread=\"{thread}\"}} {}", pick(counters));
            }
        }
        let _ = writeln!(
            out,
            "# HELP duplex_osd_thread_cpu_seconds_total CPU time of each priority thread.\n\
             # TYPE duplex_osd_thread_cpu_seconds_total counter"
        );
        for (name, seconds) in threads {
            if let Some(thread) = name.strip_prefix("osd-prio-") {
                let _ = writeln!(out, "duplex_osd_thread_cpu_seconds_total{{thread=\"{thread}\"}} {seconds:.3}");
            }
        }
        let (shared, most_workers) = {
            let report = self.report();
            (report.len(), report.iter().map(|c| c.workers.len()).max().unwrap_or(0))
        };
        let _ = writeln!(
            out,
            "# HELP duplex_osd_connection_lock_wait_seconds_total Time threads waited for shared connections' locks (measured each interval).\n\
             # TYPE duplex_osd_connection_lock_wait_seconds_total counter\n\
             duplex_osd_connection_lock_wait_seconds_total {:.6}\n\
             # HELP duplex_osd_shared_connections Connections several threads may serve (lcam, naive).\n\
             # TYPE duplex_osd_shared_connections gauge\nduplex_osd_shared_connections {shared}\n\
             # HELP duplex_osd_connection_workers_max The most threads serving one connection.\n\
             # TYPE duplex_osd_connection_workers_max gauge\nduplex_osd_connection_workers_max {most_workers}\n\
             # HELP duplex_osd_order_waits_total Requests on shared connections that came to run before an earlier one of their PG and waited for it.\n\
             # TYPE duplex_osd_order_waits_total counter\nduplex_osd_order_waits_total {}\n\
             # HELP duplex_osd_lcam_decisions_total Placement decisions: a thread added to, or removed from, a connection.\n\
             # TYPE duplex_osd_lcam_decisions_total counter\n\
             duplex_osd_lcam_decisions_total{{decision=\"add\"}} {}\n\
             duplex_osd_lcam_decisions_total{{decision=\"remove\"}} {}",
            self.lock_wait_ns.load(Ordering::Relaxed) as f64 / 1e9,
            self.order_waits.load(Ordering::Relaxed),
            self.added.load(Ordering::Relaxed),
            self.removed.load(Ordering::Relaxed),
        );
    }
}

/// The placement thread of `lcam` (and the measuring one of `naive`):
/// one round every `interval`, for the life of the process.
pub fn run_placer(messenger: Arc<Messenger>, mailboxes: Vec<Mailbox>, interval: Duration) {
    loop {
        std::thread::sleep(interval);
        messenger.round(&mailboxes);
    }
}
