//! A simulated OSD's deduplication engine (runs with `--dedup`): the
//! engine's own steps ([`duplex_osd::tier::engine`]: which PGs and objects
//! to work on, loading an index, promotions and passes), with the
//! simulator as their I/O in place of the agent's client library.
//!
//! A step is an `async fn` over [`TierIo`]; each of its I/Os here parks
//! its request in a [`Slot`] and pends. The OSD sends the request to the
//! primary of the object's PG as a client would (resent with the same
//! request id after a second without an answer or after a `Retry`, given
//! up after the agent's 10 s), and polls the step again with the answer.
//! So a fault can fall between any two of a pass's I/Os, and a restarted
//! OSD's engine starts from nothing, as the real one does.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use duplex_map::DedupTier;
use duplex_osd::messages::Job;
use duplex_osd::metrics::Metrics;
use duplex_osd::pg::pool_of;
use duplex_osd::tier::engine::{self, Stop, TierIo, Tiered, Work};
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};
use duplex_proto::tier::{Action, Guard, TierReadReply};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::SimOsd;
use crate::{Ctx, Msg, Node, Timer};

/// Transaction ids of the engine's requests start here (the OSD's other
/// requests to OSDs, erasure-coded shard reads, count from 1).
pub const ENGINE_TXID: u64 = 1 << 62;
/// How often the engine looks for work (the agent sleeps at most 500 ms
/// and is woken by writes that wait on it; this stands for both).
const TURN_US: u64 = 100_000;
/// A request unanswered this long is sent again.
const RESEND_US: u64 = 1_000_000;
/// After a `Retry` or `WrongOsd`, or with no primary known.
const BACKOFF_US: u64 = 20_000;
/// The agent's client's operation timeout.
const GIVE_UP_US: u64 = engine::OP_TIMEOUT.as_micros() as u64;

/// One request between a step and the OSD that carries it.
#[derive(Default)]
struct Slot {
    asked: Option<Asked>,
    answer: Option<Result<Bytes, Stop>>,
}

struct Asked {
    kind: OpKind,
    pool: u32,
    object: Bytes,
    offset: u64,
    length: u32,
    data: Bytes,
}

/// The simulator as the engine's I/O.
#[derive(Clone)]
struct SimIo {
    slot: Rc<RefCell<Slot>>,
    rng: Rc<RefCell<StdRng>>,
    metrics: Arc<Metrics>,
}

/// One exchange: pends until the OSD puts the answer in the slot.
struct Exchange<'a> {
    slot: &'a RefCell<Slot>,
    asked: Option<Asked>,
}

impl Future for Exchange<'_> {
    type Output = Result<Bytes, Stop>;

    fn poll(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Self::Output> {
        if let Some(asked) = self.asked.take() {
            let mut slot = self.slot.borrow_mut();
            debug_assert!(slot.asked.is_none() && slot.answer.is_none(), "one request at a time");
            slot.asked = Some(asked);
            return Poll::Pending;
        }
        match self.slot.borrow_mut().answer.take() {
            Some(answer) => Poll::Ready(answer),
            None => Poll::Pending,
        }
    }
}

impl SimIo {
    async fn call(
        &self,
        kind: OpKind,
        pool: u32,
        object: &[u8],
        offset: u64,
        length: u32,
        data: Vec<u8>,
    ) -> Result<Bytes, Stop> {
        let asked =
            Asked { kind, pool, object: Bytes::copy_from_slice(object), offset, length, data: Bytes::from(data) };
        Exchange { slot: &self.slot, asked: Some(asked) }.await
    }
}

impl TierIo for SimIo {
    /// The simulated OSDs' foreground rate is not the real one's: the
    /// rate control's arithmetic has its own tests (duplex_dedup::rate),
    /// and the engine goes at once here, so that faults meet it often.
    async fn gate(&self, _: &DedupTier) {
        self.metrics.dedup_ios.add(1);
    }

    async fn tier_read(&self, pool: u32, object: &[u8], offset: u64, len: u32) -> Result<TierReadReply, Stop> {
        let bytes = self.call(OpKind::TierRead, pool, object, offset, len, Vec::new()).await?;
        let reply = TierReadReply::decode(&bytes).map_err(|e| Stop::Failed(format!("tier read reply: {e}")))?;
        tracing::trace!(
            object = %String::from_utf8_lossy(object),
            guard = ?reply.guard,
            size = reply.size,
            entries = ?duplex_dedup::chunkmap::decode_map(&reply.entries),
            zero = ?reply.data.chunks(16 << 10).map(|c| c.iter().all(|b| *b == 0)).collect::<Vec<_>>(),
            "engine tier read"
        );
        Ok(reply)
    }

    async fn tier_update(&self, pool: u32, object: &[u8], guard: &Guard, actions: &[Action]) -> Result<(), Stop> {
        tracing::trace!(object = %String::from_utf8_lossy(object), ?guard, ?actions, "engine tier update");
        let data = duplex_proto::tier::encode_update(guard, actions);
        self.call(OpKind::TierUpdate, pool, object, 0, 0, data).await.map(drop)
    }

    async fn chunk_put(&self, pool: u32, name: &[u8], reference: &[u8], sealed: &[u8]) -> Result<(), Stop> {
        // As duplex_client::Client::chunk_put lays it out.
        let data = [reference, sealed].concat();
        self.call(OpKind::ChunkPut, pool, name, reference.len() as u64, 0, data).await.map(drop)
    }

    async fn has_reference(&self, pool: u32, name: &[u8], reference: &[u8]) -> Result<bool, Stop> {
        let keys = duplex_proto::omap::encode_keys(&[reference.to_vec()]);
        let bytes = self.call(OpKind::OmapGet, pool, name, 0, 0, keys).await?;
        let found = duplex_proto::omap::decode_entries(&bytes).map_err(|e| Stop::Failed(format!("omap reply: {e}")))?;
        Ok(!found.is_empty())
    }

    async fn chunk_unref(&self, pool: u32, name: &[u8], reference: &[u8]) -> Result<(), Stop> {
        self.call(OpKind::ChunkUnref, pool, name, 0, 0, reference.to_vec()).await.map(drop)
    }

    async fn read(&self, pool: u32, object: &[u8], len: u32) -> Result<Vec<u8>, Stop> {
        self.call(OpKind::Read, pool, object, 0, len, Vec::new()).await.map(|b| b.to_vec())
    }

    fn random(&self) -> u64 {
        self.rng.borrow_mut().gen()
    }
}

/// A step the engine is to run.
enum Task {
    Promote { key: u32, tiered: Tiered, object: Bytes, offsets: std::collections::BTreeSet<u64> },
    Pass { key: u32, tiered: Tiered, object: Bytes },
}

/// A step under way: its future, and (a pass) its PG and object.
struct Running {
    pass: Option<(u32, Bytes)>,
    step: Pin<Box<dyn Future<Output = Result<bool, Stop>>>>,
}

/// The request in flight.
struct Flight {
    tid: u64,
    attempt: u32,
    give_up: u64,
}

/// One incarnation's engine.
pub struct SimEngine {
    io: SimIo,
    /// Its requests' client id: new at each start, so that a restarted
    /// engine's request ids never meet the old one's.
    client: u64,
    next_tid: u64,
    cold_after: std::time::Duration,
    queue: VecDeque<Task>,
    running: Option<Running>,
    flight: Option<Flight>,
    /// Steps (a pass or a promotion) that stopped short.
    pub stopped: u64,
}

impl SimEngine {
    pub fn new(
        osd: u32,
        incarnation: u64,
        seed: u64,
        cold_after: std::time::Duration,
        metrics: Arc<Metrics>,
    ) -> SimEngine {
        SimEngine {
            io: SimIo { slot: Rc::default(), rng: Rc::new(RefCell::new(StdRng::seed_from_u64(seed))), metrics },
            client: 1_000_000 + u64::from(osd) * 100_000 + incarnation,
            next_tid: 0,
            cold_after,
            queue: VecDeque::new(),
            running: None,
            flight: None,
            stopped: 0,
        }
    }
}

impl SimOsd {
    /// The engine's turn: finds the PGs' work (in PG order: the simulator
    /// must not depend on a hash map's) and starts it: promotions ahead of
    /// everything queued (writers wait on them), passes once none are queued.
    pub(super) fn engine_turn(&mut self, ctx: &mut Ctx) {
        ctx.timer(ctx.now + TURN_US, Timer::EngineTurn);
        let me = self.id;
        let Some(live) = self.live.as_mut() else { return };
        let Some(engine) = live.engine.as_mut() else { return };
        let passes = !engine.queue.iter().any(|task| matches!(task, Task::Pass { .. }));
        let view = live.shared.map.load();
        let tiered = engine::tiered_pools(&view.map);
        let mut pgs = live.shared.pgs.all();
        pgs.sort_by_key(|pg| pg.lock().expect("PG lock").key);
        let mut loads = Vec::new();
        for pg in &pgs {
            let mut guard = pg.lock().expect("PG lock");
            match engine::work_of(&mut guard, &tiered, me, ctx.instant(), engine.cold_after, passes) {
                None => {}
                Some(Work::Load(load)) => loads.push(load),
                Some(Work::Objects { key, tiered, promote, cold }) => {
                    for (object, offsets) in promote.into_iter().rev() {
                        engine.queue.push_front(Task::Promote { key, tiered, object, offsets });
                    }
                    for object in cold {
                        engine.queue.push_back(Task::Pass { key, tiered, object });
                    }
                }
            }
        }
        // The flusher installs each index (the next turn finds it).
        for load in loads {
            live.flusher.take(Job::TierLoad(load), &mut live.pending, ctx.instant());
        }
        self.drain(ctx);
        self.engine_next(ctx);
    }

    /// Starts the next queued step, if none is under way.
    fn engine_next(&mut self, ctx: &mut Ctx) {
        let Some(live) = self.live.as_mut() else { return };
        let Some(engine) = live.engine.as_mut() else { return };
        if engine.running.is_some() {
            return;
        }
        let Some(task) = engine.queue.pop_front() else { return };
        let io = engine.io.clone();
        let metrics = live.shared.metrics.clone();
        let budget = engine::promotion_budget(live.shared.config.oplog_pg_bytes);
        let running = match task {
            Task::Promote { key, tiered, object, offsets } => Running {
                pass: None,
                step: Box::pin(async move {
                    let promoted = engine::promote(&io, &metrics, budget, pool_of(key), &tiered, &object, &offsets);
                    promoted.await.map(|()| false)
                }),
            },
            Task::Pass { key, tiered, object } => Running {
                pass: Some((key, object.clone())),
                step: Box::pin(async move { engine::pass(&io, &metrics, pool_of(key), &tiered, &object).await }),
            },
        };
        engine.running = Some(running);
        self.engine_poll(ctx);
    }

    /// Polls the step under way: it ends, or it asked for its next I/O.
    fn engine_poll(&mut self, ctx: &mut Ctx) {
        let Some(live) = self.live.as_mut() else { return };
        let Some(engine) = live.engine.as_mut() else { return };
        let Some(running) = engine.running.as_mut() else { return };
        match running.step.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(result) => {
                let running = engine.running.take().expect("polled");
                if let Err(stop) = &result {
                    engine.stopped += 1;
                    tracing::debug!(at = ctx.now, osd = self.id, pass = ?running.pass, ?stop, "an engine step stopped short");
                }
                if let Some((key, object)) = running.pass {
                    if let Some(pg) = live.shared.pgs.get(key) {
                        engine::after_pass(&pg, &object, &result, &live.shared.metrics, ctx.instant());
                    }
                }
                self.engine_next(ctx);
            }
            Poll::Pending => {
                debug_assert!(engine.flight.is_none(), "a step asked while a request was in flight");
                engine.next_tid += 1;
                engine.flight = Some(Flight { tid: engine.next_tid, attempt: 0, give_up: ctx.now + GIVE_UP_US });
                self.engine_send(ctx);
            }
        }
    }

    /// Sends the request in flight to its PG's primary (in this OSD's map).
    fn engine_send(&mut self, ctx: &mut Ctx) {
        let Some(live) = self.live.as_mut() else { return };
        let Some(engine) = live.engine.as_mut() else { return };
        let Some(flight) = engine.flight.as_ref() else { return };
        let slot = engine.io.slot.borrow();
        let asked = slot.asked.as_ref().expect("a request in flight is in its slot");
        let view = live.shared.map.load();
        let target = view.map.pools.get(&asked.pool).and_then(|pool| {
            let pg = duplex_placement::pg_of(&asked.object, pool.pg_num);
            let primary = duplex_map::primary_of(&view.map.acting(&view.hierarchy, pool, pg))?;
            Some((primary, pg))
        });
        let (tid, attempt) = (flight.tid, flight.attempt);
        match target {
            Some((primary, pg)) => {
                let request = OpRequest {
                    kind: asked.kind,
                    pool: asked.pool,
                    pg,
                    map_epoch: view.epoch(),
                    object: asked.object.clone(),
                    offset: asked.offset,
                    length: asked.length,
                    data: asked.data.clone(),
                    client: engine.client,
                    snap: 0,
                };
                tracing::trace!(at = ctx.now, osd = self.id, tid, kind = ?asked.kind, object = %String::from_utf8_lossy(&asked.object), pg, primary, attempt, "engine request");
                ctx.send(Node::Osd(primary), Msg::Frame(request.to_frame(ENGINE_TXID + tid)));
                ctx.timer(ctx.now + RESEND_US, Timer::EngineResend { tid, attempt });
            }
            None => ctx.timer(ctx.now + BACKOFF_US, Timer::EngineResend { tid, attempt }),
        }
    }

    /// The request in flight was not answered in time, or waited out a backoff.
    pub(super) fn engine_resend(&mut self, ctx: &mut Ctx, tid: u64, attempt: u32) {
        let Some(live) = self.live.as_mut() else { return };
        let Some(engine) = live.engine.as_mut() else { return };
        let Some(flight) = engine.flight.as_mut().filter(|f| f.tid == tid && f.attempt == attempt) else { return };
        if ctx.now >= flight.give_up {
            self.engine_answer(ctx, Err(Stop::Failed("timed out".into())));
            return;
        }
        flight.attempt += 1;
        self.engine_send(ctx);
    }

    /// An answer to one of the engine's requests (transaction `txid`).
    pub(super) fn engine_reply(&mut self, ctx: &mut Ctx, txid: u64, reply: OpReply) {
        let Some(live) = self.live.as_mut() else { return };
        let Some(engine) = live.engine.as_mut() else { return };
        let Some(flight) = engine.flight.as_mut().filter(|f| ENGINE_TXID + f.tid == txid) else { return };
        tracing::trace!(at = ctx.now, osd = self.id, txid, status = ?reply.status, "engine reply");
        // As the client library sorts answers (duplex_client::ClientError).
        let answer = match reply.status {
            Status::Ok => Ok(reply.data),
            Status::Retry | Status::WrongOsd => {
                flight.attempt += 1;
                let (tid, attempt) = (flight.tid, flight.attempt);
                ctx.timer(ctx.now + BACKOFF_US, Timer::EngineResend { tid, attempt });
                return;
            }
            Status::NotFound => Err(Stop::Gone),
            Status::Invalid if duplex_proto::tier::is_stale(&reply.data) => Err(Stop::Stale),
            status => Err(Stop::Failed(format!("{status:?}: {}", String::from_utf8_lossy(&reply.data)))),
        };
        self.engine_answer(ctx, answer);
    }

    fn engine_answer(&mut self, ctx: &mut Ctx, answer: Result<Bytes, Stop>) {
        let Some(live) = self.live.as_mut() else { return };
        let Some(engine) = live.engine.as_mut() else { return };
        engine.flight = None;
        {
            let mut slot = engine.io.slot.borrow_mut();
            slot.asked = None;
            slot.answer = Some(answer);
        }
        self.engine_poll(ctx);
    }
}
