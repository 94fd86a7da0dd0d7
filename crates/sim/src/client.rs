//! A verifying client: stamped 4 KiB writes and reads of a few blocks,
//! recorded on the virtual clock for the checker. Like the real client it
//! sends each request to its PG's primary in its map and resends with the
//! same request id on a timeout or a `Retry`/`WrongOsd` answer, until it
//! gives up (the write's outcome is then unknown).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use duplex_map::ClusterMap;
use duplex_osd::cluster::MapView;
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};
use duplex_proto::MessageType;
use duplex_verify::{BlockOp, Stamp};
use rand::rngs::StdRng;
use rand::Rng;

use crate::{Ctx, Msg, Node, Timer};

pub const BLOCK: usize = 4096;
pub const BLOCKS_PER_OBJECT: u64 = 4;
pub const POOL: &str = "sim";
/// A request unanswered this long is sent again.
const RESEND_US: u64 = 1_000_000;
/// After an error answer, the wait before resending.
const BACKOFF_US: u64 = 20_000;

struct Op {
    slot: usize,
    block: u64,
    write: Option<Stamp>,
    invoked: u64,
    give_up: u64,
    attempt: u32,
    final_check: bool,
}

pub struct SimClient {
    pub id: u32,
    blocks: u64,
    view: Option<MapView>,
    next_tid: u64,
    next_seq: u64,
    ops: BTreeMap<u64, Op>,
    pub history: Vec<BlockOp>,
    /// No new operations (the run is ending).
    pub stopped: bool,
    /// Blocks a final pass still has to read (the verifier).
    final_blocks: VecDeque<u64>,
    give_up_us: u64,
    pub acknowledged: u64,
    pub unknown: u64,
    pub reads: u64,
    /// Answers that say the simulator (or the OSD) is wrong, not the network.
    pub errors: Vec<String>,
}

pub fn object_of(block: u64) -> (Bytes, u64) {
    (Bytes::from(format!("sim-{}", block / BLOCKS_PER_OBJECT)), (block % BLOCKS_PER_OBJECT) * BLOCK as u64)
}

impl SimClient {
    pub fn new(id: u32, blocks: u64, give_up_us: u64) -> SimClient {
        SimClient {
            id,
            blocks,
            view: None,
            next_tid: 0,
            next_seq: 0,
            ops: BTreeMap::new(),
            history: Vec::new(),
            stopped: false,
            final_blocks: VecDeque::new(),
            give_up_us,
            acknowledged: 0,
            unknown: 0,
            reads: 0,
            errors: Vec::new(),
        }
    }

    /// Starts `slots` workers, each with one operation in flight at a time.
    pub fn start(&mut self, ctx: &mut Ctx, rng: &mut StdRng, slots: usize) {
        for slot in 0..slots {
            ctx.timer(ctx.now + rng.gen_range(0..10_000), Timer::ClientNext { slot });
        }
    }

    /// Reads every block once, as the final pass, one at a time.
    pub fn verify_all(&mut self, ctx: &mut Ctx) {
        self.final_blocks = (0..self.blocks).collect();
        ctx.timer(ctx.now, Timer::ClientNext { slot: 0 });
    }

    pub fn in_flight(&self) -> usize {
        self.ops.len()
    }

    pub fn final_pass_done(&self) -> bool {
        self.final_blocks.is_empty() && self.ops.is_empty()
    }

    pub fn on_map(&mut self, map: Arc<ClusterMap>) {
        if self.view.as_ref().is_none_or(|v| v.epoch() < map.epoch) {
            self.view = Some(MapView::new((*map).clone()));
        }
    }

    pub fn on_timer(&mut self, ctx: &mut Ctx, rng: &mut StdRng, timer: Timer) {
        match timer {
            Timer::ClientNext { slot } => self.next(ctx, rng, slot),
            Timer::ClientResend { tid, attempt } => {
                let Some(op) = self.ops.get_mut(&tid) else { return };
                if op.attempt != attempt {
                    return;
                }
                tracing::debug!(client = self.id, tid, attempt, "resending (no answer in time, or after a backoff)");
                if ctx.now >= op.give_up {
                    self.end(ctx, rng, tid, None);
                    return;
                }
                op.attempt += 1;
                self.issue(ctx, tid);
            }
            _ => {}
        }
    }

    fn next(&mut self, ctx: &mut Ctx, rng: &mut StdRng, slot: usize) {
        let (block, write, final_check) = if let Some(block) = self.final_blocks.pop_front() {
            (block, None, true)
        } else if self.stopped {
            return;
        } else {
            let block = rng.gen_range(0..self.blocks);
            let write = rng.gen_bool(0.6).then(|| {
                self.next_seq += 1;
                Stamp { writer: self.id, seq: self.next_seq, block }
            });
            (block, write, false)
        };
        self.next_tid += 1;
        let tid = self.next_tid;
        let give_up = if final_check { u64::MAX } else { ctx.now + self.give_up_us };
        self.ops.insert(tid, Op { slot, block, write, invoked: ctx.now, give_up, attempt: 0, final_check });
        self.issue(ctx, tid);
    }

    /// Sends request `tid` to its primary (or waits for a map that has one).
    fn issue(&mut self, ctx: &mut Ctx, tid: u64) {
        let op = &self.ops[&tid];
        let attempt = op.attempt;
        let target = self.view.as_ref().and_then(|view| {
            let pool = view.map.pools.values().find(|p| p.name == POOL)?;
            let (object, offset) = object_of(op.block);
            let pg = duplex_placement::pg_of(&object, pool.pg_num);
            let primary = *view.map.acting(&view.hierarchy, pool, pg).first()?;
            let request = OpRequest {
                kind: if op.write.is_some() { OpKind::Write } else { OpKind::Read },
                pool: pool.id,
                pg,
                map_epoch: view.epoch(),
                object,
                offset,
                length: if op.write.is_some() { 0 } else { BLOCK as u32 },
                data: op.write.map_or_else(Bytes::new, |stamp| Bytes::from(stamp.encode(BLOCK))),
                client: 1000 + self.id as u64,
                snap: 0,
            };
            Some((primary, request))
        });
        match target {
            Some((primary, request)) => {
                tracing::trace!(at = ctx.now, client = self.id, tid, pg = request.pg, block = op.block, write = ?op.write.map(|s| s.seq), attempt, primary, epoch = request.map_epoch, "issue");
                ctx.send(Node::Osd(primary), Msg::Frame(request.to_frame(tid)));
                ctx.timer(ctx.now + RESEND_US, Timer::ClientResend { tid, attempt });
            }
            None => ctx.timer(ctx.now + BACKOFF_US, Timer::ClientResend { tid, attempt }),
        }
    }

    pub fn on_frame(&mut self, ctx: &mut Ctx, rng: &mut StdRng, frame: duplex_proto::Frame) {
        if MessageType::from_u8(frame.header.message_type) != Some(MessageType::OsdOpReply) {
            self.errors.push(format!("client.{} got a frame of type {}", self.id, frame.header.message_type));
            return;
        }
        let tid = frame.header.transaction_id;
        let Some(op) = self.ops.get_mut(&tid) else { return };
        let reply = match OpReply::decode(&frame.payload) {
            Ok(reply) => reply,
            Err(err) => {
                self.errors.push(format!("client.{}: undecodable reply: {err}", self.id));
                return;
            }
        };
        tracing::trace!(at = ctx.now, client = self.id, tid, status = ?reply.status, "reply");
        match reply.status {
            Status::Ok => self.end(ctx, rng, tid, Some(reply.data)),
            Status::NotFound if op.write.is_none() => self.end(ctx, rng, tid, Some(Bytes::new())),
            Status::Retry | Status::WrongOsd => {
                tracing::debug!(client = self.id, tid, status = ?reply.status, why = %String::from_utf8_lossy(&reply.data), "resending");
                op.attempt += 1;
                let attempt = op.attempt;
                ctx.timer(ctx.now + BACKOFF_US, Timer::ClientResend { tid, attempt });
            }
            status => {
                let message = String::from_utf8_lossy(&reply.data).into_owned();
                self.errors.push(format!("client.{} request {tid}: {status:?}: {message}", self.id));
                self.end(ctx, rng, tid, None);
            }
        }
    }

    /// The operation's end: `data` is the answer (None: no answer, it gave up).
    fn end(&mut self, ctx: &mut Ctx, rng: &mut StdRng, tid: u64, data: Option<Bytes>) {
        let Some(op) = self.ops.remove(&tid) else { return };
        match (op.write, data) {
            (Some(stamp), Some(_)) => {
                self.acknowledged += 1;
                self.history.push(BlockOp::Write { stamp, invoked: op.invoked + 1, completed: Some(ctx.now + 1) });
            }
            (Some(stamp), None) => {
                self.unknown += 1;
                self.history.push(BlockOp::Write { stamp, invoked: op.invoked + 1, completed: None });
            }
            (None, Some(data)) => {
                self.reads += 1;
                let mut block = data.to_vec();
                block.resize(BLOCK, 0);
                let result = Stamp::decode(&block, op.block);
                tracing::trace!(at = ctx.now, client = self.id, tid, block = op.block, ?result, "read");
                self.history.push(BlockOp::Read {
                    block: op.block,
                    result,
                    invoked: op.invoked + 1,
                    completed: ctx.now + 1,
                    final_check: op.final_check,
                });
            }
            (None, None) => {
                if op.final_check {
                    self.final_blocks.push_front(op.block);
                }
            }
        }
        let think = if op.final_check { 0 } else { rng.gen_range(0..2_000) };
        ctx.timer(ctx.now + think, Timer::ClientNext { slot: op.slot });
    }
}
