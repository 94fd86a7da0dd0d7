//! The deduplication agent: one thread per OSD that runs the engine
//! ([`crate::tier::engine`]) on the deduplicated PGs it is primary of
//! (docs/DEDUP.md, "The engine"). It talks to the cluster as a client
//! does (`duplex_client`, as Ceph's tiering agent uses its Objecter):
//! chunk objects live in other PGs on other OSDs, and its own PGs'
//! changes go through admission, the log and the replicas like any
//! client's, guarded so that they apply only to the object it read
//! ([`crate::tier`]). An OSD whose map has no deduplicated pool never
//! connects.
//!
//! Its I/O blocks ([`ClientIo`]): the engine's steps, `async` for the
//! simulator's sake, finish in the one poll the agent gives them.

use std::cell::RefCell;
use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use duplex_client::{Client, ClientConfig, ClientError};
use duplex_dedup::rate::{Allowance, RateControl, Throttle};
use duplex_map::{DedupTier, PoolId};
use duplex_proto::tier::{Action, Guard, TierReadReply};

use crate::messages::Job;
use crate::pg::pool_of;
use crate::shared::Shared;
use crate::tier::engine::{self, Stop, TierIo, Tiered, Work};

/// How long the agent sleeps with nothing to do (a write or a wanted
/// index wakes it sooner).
const IDLE: Duration = Duration::from_millis(500);

pub fn run(shared: Arc<Shared>, wake: Receiver<()>) {
    let mut agent = Agent {
        shared,
        client: None,
        connect_failed_at: None,
        rate: RefCell::new(Rate { throttle: Throttle::default(), foreground: (Instant::now(), 0, 0) }),
    };
    loop {
        let busy = agent.turn();
        let wait = if busy { Duration::ZERO } else { IDLE };
        if let Err(crossbeam_channel::RecvTimeoutError::Disconnected) = wake.recv_timeout(wait) {
            return;
        }
    }
}

struct Agent {
    shared: Arc<Shared>,
    client: Option<Client>,
    connect_failed_at: Option<Instant>,
    rate: RefCell<Rate>,
}

/// Promotions run side by side at most.
const PROMOTIONS_AT_ONCE: usize = 8;

/// A promotion to run: PG, its pool's tier, object, chunk offsets.
type Promotion = (u32, Tiered, bytes::Bytes, std::collections::BTreeSet<u64>);

/// The rate control's state, kept across turns.
struct Rate {
    throttle: Throttle,
    /// When the foreground rate was last measured, the operations counted
    /// then, and the rate (operations a second).
    foreground: (Instant, u64, u64),
}

impl Agent {
    /// One round over the PGs; whether it found work.
    fn turn(&mut self) -> bool {
        let view = self.shared.map.load();
        let tiered = engine::tiered_pools(&view.map);
        if tiered.is_empty() {
            return false;
        }
        let Some(client) = self.client() else { return false };
        let io = ClientIo { client: &client, shared: &self.shared, rate: Some(&self.rate) };
        let me = self.shared.config.id;
        let cold_after = self.shared.config.dedup_cold_after;
        // Every PG's work first; the promotions (writers wait on them)
        // before the passes, and again before each pass.
        let mut loads = Vec::new();
        let mut promotions = Vec::new();
        let mut passes = Vec::new();
        for pg in self.shared.pgs.all() {
            let work = engine::work_of(&mut pg.lock().expect("PG lock"), &tiered, me, Instant::now(), cold_after, true);
            match work {
                None => {}
                Some(Work::Load(load)) => loads.push(load),
                Some(Work::Objects { key, tiered, promote, cold }) => {
                    promotions.extend(promote.into_iter().map(|(object, offsets)| (key, tiered, object, offsets)));
                    passes.extend(cold.into_iter().map(|object| (pg.clone(), key, tiered, object)));
                }
            }
        }
        let busy = !(loads.is_empty() && promotions.is_empty() && passes.is_empty());
        // The flusher installs each index; the next turn finds it.
        for load in loads {
            self.shared.send_job(load.pg, Job::TierLoad(load));
        }
        self.promote(&client, promotions);
        for (pg, key, pool_tier, object) in passes {
            let asked = self.promotions_asked(&tiered);
            self.promote(&client, asked);
            let metrics = &self.shared.metrics;
            let passed = blocking(engine::pass(&io, metrics, pool_of(key), &pool_tier, &object));
            engine::after_pass(&pg, &object, &passed, metrics, Instant::now());
        }
        busy
    }

    /// Runs `promotions` (PG, pool, object, the chunks' offsets), up to
    /// [`PROMOTIONS_AT_ONCE`] at a time, each on a thread of its own: a
    /// writer waits on each, and one promotion is three round trips the
    /// client library can carry side by side with the others'. (One at a
    /// time, 32 random writers on evicted data made 190 writes a second.)
    fn promote(&self, client: &Client, promotions: Vec<Promotion>) {
        let shared: &Shared = &self.shared;
        let budget = engine::promotion_budget(shared.config.oplog_pg_bytes);
        for batch in promotions.chunks(PROMOTIONS_AT_ONCE) {
            std::thread::scope(|scope| {
                for (key, tiered, object, offsets) in batch {
                    scope.spawn(move || {
                        // A foreground I/O: no rate control.
                        let io = ClientIo { client, shared, rate: None };
                        let promoted =
                            engine::promote(&io, &shared.metrics, budget, pool_of(*key), tiered, object, offsets);
                        if let Err(stop) = blocking(promoted) {
                            tracing::debug!(
                                pg = key,
                                ?stop,
                                "a promotion did not finish; the writer's retry asks again"
                            );
                        }
                    });
                }
            });
        }
    }

    /// The promotions writers asked for since the turn began (the turn's
    /// `work_of`, passes left where they are).
    fn promotions_asked(&self, tiered: &HashMap<PoolId, Tiered>) -> Vec<Promotion> {
        let (me, cold_after) = (self.shared.config.id, self.shared.config.dedup_cold_after);
        let mut asked = Vec::new();
        for pg in self.shared.pgs.all() {
            let work = engine::work_of(&mut pg.lock().expect("PG lock"), tiered, me, Instant::now(), cold_after, false);
            match work {
                Some(Work::Objects { key, tiered, promote, cold }) => {
                    debug_assert!(cold.is_empty(), "passes taken between passes");
                    asked.extend(promote.into_iter().map(|(object, offsets)| (key, tiered, object, offsets)));
                }
                Some(Work::Load(load)) => self.shared.send_job(load.pg, Job::TierLoad(load)),
                None => {}
            }
        }
        asked
    }

    /// The agent's client, connected on first use.
    fn client(&mut self) -> Option<Client> {
        if let Some(client) = &self.client {
            return Some(client.clone());
        }
        if self.connect_failed_at.is_some_and(|at| at.elapsed() < Duration::from_secs(5)) {
            return None;
        }
        let config = &self.shared.config;
        let credentials = duplex_mon_client::Credentials {
            fsid: config.fsid,
            secret: config.secret.clone(),
            name: format!("osd.{}.dedup", config.id),
        };
        let mut client_config = ClientConfig::new(config.monitors.clone(), credentials);
        // The agent works on one object at a time: one that cannot finish
        // soon (its PG moving, say) waits for its next turn instead, and
        // the promotions writers wait on do not wait behind it for long.
        client_config.op_timeout = engine::OP_TIMEOUT;
        match Client::connect(client_config) {
            Ok(client) => {
                self.client = Some(client.clone());
                Some(client)
            }
            Err(err) => {
                tracing::warn!(%err, "the deduplication agent cannot connect to the cluster; trying again");
                self.connect_failed_at = Some(Instant::now());
                None
            }
        }
    }
}

/// Runs an engine step to its end: the agent's I/O blocks, so the step
/// never waits on anything and ends in its first poll.
fn blocking<F: Future>(step: F) -> F::Output {
    let mut step = std::pin::pin!(step);
    match step.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(output) => output,
        Poll::Pending => unreachable!("an engine step over blocking I/O waited"),
    }
}

/// The cluster through the agent's client, one blocking call each.
struct ClientIo<'a> {
    client: &'a Client,
    shared: &'a Shared,
    /// None: no rate control (promotions, which writers wait on).
    rate: Option<&'a RefCell<Rate>>,
}

fn stop(err: ClientError) -> Stop {
    match err {
        ClientError::Invalid(why) if duplex_proto::tier::is_stale(why.as_bytes()) => Stop::Stale,
        ClientError::NotFound => Stop::Gone,
        err => Stop::Failed(err.to_string()),
    }
}

impl TierIo for ClientIo<'_> {
    /// Waits until the pool's rate control lets the agent issue one I/O:
    /// the foreground rate is this OSD's client operations, measured every
    /// 200 ms.
    async fn gate(&self, tier: &DedupTier) {
        let Some(rate) = self.rate else {
            self.shared.metrics.dedup_ios.add(1);
            return;
        };
        let control = RateControl::new(u64::from(tier.low_watermark), u64::from(tier.high_watermark))
            .unwrap_or(RateControl { low_iops: 0, high_iops: 0 });
        let mut rate = rate.borrow_mut();
        loop {
            let metrics = &self.shared.metrics;
            let ops = metrics.writes.get() + metrics.reads.get();
            let (since, counted, _) = rate.foreground;
            let elapsed = since.elapsed();
            if elapsed >= Duration::from_millis(200) {
                let delta = ops.saturating_sub(counted);
                rate.throttle.foreground(delta);
                let per_sec = (delta as f64 / elapsed.as_secs_f64()) as u64;
                rate.foreground = (Instant::now(), ops, per_sec);
            }
            let allowance = match tier.mode {
                duplex_map::DedupMode::Run => Allowance::Unlimited,
                _ => control.allowance(rate.foreground.2),
            };
            if rate.throttle.take(allowance) {
                self.shared.metrics.dedup_ios.add(1);
                return;
            }
            debug_assert!(matches!(allowance, Allowance::OnePer(_)));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    async fn tier_read(&self, pool: u32, object: &[u8], offset: u64, len: u32) -> Result<TierReadReply, Stop> {
        self.client.tier_read(pool, object, offset, len).map_err(stop)
    }

    async fn tier_update(&self, pool: u32, object: &[u8], guard: &Guard, actions: &[Action]) -> Result<(), Stop> {
        self.client.tier_update(pool, object, guard, actions).map_err(stop)
    }

    async fn chunk_put(&self, pool: u32, name: &[u8], reference: &[u8], sealed: &[u8]) -> Result<(), Stop> {
        self.client.chunk_put(pool, name, reference, sealed).map_err(stop)
    }

    async fn has_reference(&self, pool: u32, name: &[u8], reference: &[u8]) -> Result<bool, Stop> {
        let found = self.client.omap_get(pool, name, &[reference.to_vec()]).map_err(stop)?;
        Ok(!found.is_empty())
    }

    async fn chunk_unref(&self, pool: u32, name: &[u8], reference: &[u8]) -> Result<(), Stop> {
        self.client.chunk_unref(pool, name, reference).map_err(stop)
    }

    async fn read(&self, pool: u32, object: &[u8], len: u32) -> Result<Vec<u8>, Stop> {
        self.client.read(pool, object, 0, len).map(|bytes| bytes.to_vec()).map_err(stop)
    }

    fn random(&self) -> u64 {
        rand::random()
    }
}
