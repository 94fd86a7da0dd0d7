//! A verifying client: stamped 4 KiB writes and reads of a few blocks,
//! recorded on the virtual clock for the checker. Like the real client it
//! sends each request to its PG's primary in its map and resends with the
//! same request id on a timeout or a `Retry`/`WrongOsd` answer, until it
//! gives up (the write's outcome is then unknown).
//!
//! With snapshots (crate::world), a client quiesces as a real gateway
//! does (duplex_client::watch): it holds new operations, lets its writes
//! in flight end, then adopts the snapshot, and its writes carry it from
//! then on (a write keeps the snapshot it was first sent with through its
//! resends). Some reads, and a final pass, read at a snapshot. Such a read
//! is recorded as a read over the snapshot's span, from when it was taken
//! to when the last client adopted it (the world fixes the times at the
//! end): the checker then demands that every block of a snapshot hold
//! what a read over that span could return. And no snapshot may hold a
//! write made under it or a later one (`SnapRead`, checked exactly).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use duplex_dedup::{frame, ChunkEntry};
use duplex_map::ClusterMap;
use duplex_osd::cluster::MapView;
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};
use duplex_proto::tier::TierReadReply;
use duplex_proto::MessageType;
use duplex_verify::{BlockOp, Stamp};
use rand::rngs::StdRng;
use rand::Rng;

use crate::{Ctx, Msg, Node, Timer};

pub const BLOCK: usize = 4096;
pub const BLOCKS_PER_OBJECT: u64 = 4;
pub const POOL: &str = "sim";
/// The chunk pool of a deduplicated run (`--dedup`).
pub const CHUNK_POOL: &str = "sim-chunks";
/// Blocks an object holds in a deduplicated run: two 16 KiB chunks.
pub const DEDUP_BLOCKS_PER_OBJECT: u64 = 8;
/// A deduplicated read goes back to its tier read at most this often
/// when the chunk it was sent to is gone (an overwrite and a pass came in
/// between), as the client library's does.
const RESTARTS: u32 = 8;
/// A request unanswered this long is sent again.
const RESEND_US: u64 = 1_000_000;
/// After an error answer, the wait before resending.
const BACKOFF_US: u64 = 20_000;

struct Op {
    slot: usize,
    block: u64,
    write: Option<Stamp>,
    /// A write's snapshot context; a read's snapshot to read at (0: the head).
    snap: u64,
    invoked: u64,
    give_up: u64,
    attempt: u32,
    final_check: bool,
    /// A deduplicated read's step after its tier read (None: the tier read).
    step: Option<DedupStep>,
    restarts: u32,
}

/// A deduplicated read's steps after its tier read.
enum DedupStep {
    /// The block is in an evicted chunk (its offset, entry): read it, over
    /// the tier read's bytes.
    Chunk { at: u64, entry: ChunkEntry, base: Bytes },
    /// The final pass checks that the evicted chunk the block's entry
    /// names holds the entry's reference (a chunk object goes with its
    /// last reference: an entry whose reference is missing names a chunk
    /// that another object's overwrite may remove); `block` is the answer
    /// then. (No client writes then: an evicted entry stays as it is.)
    Reference { chunk: Bytes, key: Vec<u8>, block: Bytes },
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
    /// Blocks a final pass still has to read (the verifier), and at which
    /// snapshot (0: the head).
    final_blocks: VecDeque<(u64, u64)>,
    /// The newest snapshot adopted: writes carry it.
    write_snap: u64,
    /// Snapshots taken and not adopted yet (writes in flight under the old one).
    adopting: Vec<u64>,
    /// The snapshots taken, by id: when taken and when this client adopted it.
    pub snapshots: BTreeMap<u64, (u64, Option<u64>)>,
    /// Reads at a snapshot, kept apart: their times are the snapshot's span.
    pub snap_reads: Vec<SnapRead>,
    /// The snapshot each of this client's writes was sent under.
    pub write_snaps: BTreeMap<u64, u64>,
    pub snapshot_reads: u64,
    give_up_us: u64,
    pub acknowledged: u64,
    pub unknown: u64,
    pub reads: u64,
    /// Answers that say the simulator (or the OSD) is wrong, not the network.
    pub errors: Vec<String>,
    /// Blocks live in omap entries, not object data (`SimConfig::omap`).
    pub omap: bool,
    /// The pool is deduplicated (`SimConfig::dedup`): reads are tier
    /// reads, and evicted chunks are read from the chunk pool.
    pub dedup: bool,
    pub blocks_per_object: u64,
}

/// A block's omap key in its object (the omap mode).
fn omap_key(offset: u64) -> Vec<u8> {
    format!("b{offset}").into_bytes()
}

/// A read at a snapshot: its times are the snapshot's span, known at the end.
#[derive(Clone, Debug)]
pub struct SnapRead {
    pub snap: u64,
    pub block: u64,
    pub result: Result<Option<Stamp>, duplex_verify::StampError>,
}

/// The object block `block` is in, and its offset there.
pub fn object_of(block: u64, per_object: u64) -> (Bytes, u64) {
    (Bytes::from(format!("sim-{}", block / per_object)), (block % per_object) * BLOCK as u64)
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
            write_snap: 0,
            adopting: Vec::new(),
            snapshots: BTreeMap::new(),
            snap_reads: Vec::new(),
            write_snaps: BTreeMap::new(),
            snapshot_reads: 0,
            give_up_us,
            acknowledged: 0,
            unknown: 0,
            reads: 0,
            errors: Vec::new(),
            omap: false,
            dedup: false,
            blocks_per_object: BLOCKS_PER_OBJECT,
        }
    }

    /// Starts `slots` workers, each with one operation in flight at a time.
    pub fn start(&mut self, ctx: &mut Ctx, rng: &mut StdRng, slots: usize) {
        for slot in 0..slots {
            ctx.timer(ctx.now + rng.gen_range(0..10_000), Timer::ClientNext { slot });
        }
    }

    /// A snapshot was taken now: writes issued from here on carry it.
    pub fn take_snapshot(&mut self, id: u64, now: u64) {
        debug_assert!(self.snapshots.keys().all(|old| *old < id), "snapshot ids only grow");
        self.snapshots.insert(id, (now, None));
        self.adopting.push(id);
        self.adopt_if_quiet(now);
    }

    /// Adopts the snapshots taken once no write is in flight.
    fn adopt_if_quiet(&mut self, now: u64) {
        if self.adopting.is_empty() || self.ops.values().any(|op| op.write.is_some()) {
            return;
        }
        for id in std::mem::take(&mut self.adopting) {
            self.write_snap = self.write_snap.max(id);
            self.snapshots.get_mut(&id).expect("taken").1 = Some(now);
        }
    }

    /// Reads every block once, and once at each snapshot, as the final
    /// pass, one at a time.
    pub fn verify_all(&mut self, ctx: &mut Ctx) {
        let snaps = std::iter::once(0).chain(self.snapshots.keys().copied());
        let blocks = self.blocks;
        self.final_blocks = snaps.flat_map(|snap| (0..blocks).map(move |block| (block, snap))).collect();
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
        let (block, write, final_check, snap) = if let Some((block, snap)) = self.final_blocks.pop_front() {
            (block, None, true, snap)
        } else if self.stopped {
            return;
        } else if !self.adopting.is_empty() {
            // Quiescing for a snapshot: nothing new until the writes end.
            ctx.timer(ctx.now + 5_000, Timer::ClientNext { slot });
            return;
        } else {
            let block = rng.gen_range(0..self.blocks);
            let write = rng.gen_bool(0.6).then(|| {
                self.next_seq += 1;
                Stamp { writer: self.id, seq: self.next_seq, block }
            });
            let snap = match write {
                Some(_) => self.write_snap,
                // (Only a run with snapshots draws here: the others' seeds stay as they were.)
                None if !self.snapshots.is_empty() && rng.gen_bool(0.3) => {
                    *self.snapshots.keys().nth(rng.gen_range(0..self.snapshots.len())).expect("in range")
                }
                None => 0,
            };
            (block, write, false, snap)
        };
        self.next_tid += 1;
        let tid = self.next_tid;
        let give_up = if final_check { u64::MAX } else { ctx.now + self.give_up_us };
        let op = Op {
            slot,
            block,
            write,
            snap,
            invoked: ctx.now,
            give_up,
            attempt: 0,
            final_check,
            step: None,
            restarts: 0,
        };
        self.ops.insert(tid, op);
        self.issue(ctx, tid);
    }

    /// Sends request `tid` to its primary (or waits for a map that has one).
    fn issue(&mut self, ctx: &mut Ctx, tid: u64) {
        let op = &self.ops[&tid];
        let attempt = op.attempt;
        let target = self.view.as_ref().and_then(|view| {
            let (object, offset) = object_of(op.block, self.blocks_per_object);
            let (pool, object) = match &op.step {
                Some(DedupStep::Chunk { entry, .. }) => (CHUNK_POOL, Bytes::from(entry.fingerprint.object_name())),
                Some(DedupStep::Reference { chunk, .. }) => (CHUNK_POOL, chunk.clone()),
                None => (POOL, object),
            };
            let pool = view.map.pools.values().find(|p| p.name == pool)?;
            let pg = duplex_placement::pg_of(&object, pool.pg_num);
            let primary = duplex_map::primary_of(&view.map.acting(&view.hierarchy, pool, pg))?;
            let (kind, offset, length, data) = match (self.omap, op.write) {
                (_, None) if op.step.is_some() => match op.step.as_ref().expect("matched") {
                    DedupStep::Chunk { entry, .. } => (OpKind::Read, 0, entry.len + frame::HEADER as u32, Bytes::new()),
                    DedupStep::Reference { key, .. } => {
                        (OpKind::OmapGet, 0, 0, Bytes::from(duplex_proto::omap::encode_keys(std::slice::from_ref(key))))
                    }
                },
                (false, None) if self.dedup => (OpKind::TierRead, offset, BLOCK as u32, Bytes::new()),
                (false, Some(stamp)) => (OpKind::Write, offset, 0, Bytes::from(stamp.encode(BLOCK))),
                (false, None) => (OpKind::Read, offset, BLOCK as u32, Bytes::new()),
                (true, Some(stamp)) => {
                    let entries = [(omap_key(offset), stamp.encode(BLOCK))];
                    (OpKind::OmapSet, 0, 0, Bytes::from(duplex_proto::omap::encode_entries(&entries)))
                }
                (true, None) => {
                    (OpKind::OmapGet, 0, 0, Bytes::from(duplex_proto::omap::encode_keys(&[omap_key(offset)])))
                }
            };
            let request = OpRequest {
                kind,
                pool: pool.id,
                pg,
                map_epoch: view.epoch(),
                object,
                offset,
                length,
                data,
                client: 1000 + self.id as u64,
                // (A chunk object has no snapshots: its steps read the head.)
                snap: if op.step.is_some() { 0 } else { op.snap },
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
            Status::Ok if self.dedup && op.write.is_none() => self.dedup_read(ctx, rng, tid, reply.data),
            Status::NotFound if matches!(op.step, Some(DedupStep::Reference { .. })) => {
                let Some(DedupStep::Reference { chunk, .. }) = op.step.take() else { unreachable!("matched") };
                let (id, block) = (self.id, op.block);
                let chunk = String::from_utf8_lossy(&chunk).into_owned();
                self.errors
                    .push(format!("client.{id} block {block}: its chunk map entry names chunk {chunk}, which is gone"));
                self.end(ctx, rng, tid, None);
            }
            Status::NotFound if op.step.is_some() => {
                // Gone since the tier read: read the block again.
                op.step = None;
                op.restarts += 1;
                if op.restarts > RESTARTS {
                    self.errors.push(format!(
                        "client.{} block {}: its chunk map names a chunk the chunk pool lacks",
                        self.id, op.block
                    ));
                    self.end(ctx, rng, tid, None);
                    return;
                }
                op.attempt += 1;
                self.issue(ctx, tid);
            }
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

    /// A deduplicated pool's read answered: the tier read's (the block's
    /// bytes, or the evicted chunk to read them from), the chunk's, or
    /// (the final pass) the reference check's.
    fn dedup_read(&mut self, ctx: &mut Ctx, rng: &mut StdRng, tid: u64, data: Bytes) {
        let id = self.id;
        let op = self.ops.get_mut(&tid).expect("answered");
        let (object, offset) = object_of(op.block, self.blocks_per_object);
        let (from, to) = (offset, offset + BLOCK as u64);
        let pool = self.view.as_ref().and_then(|v| v.map.pools.values().find(|p| p.name == POOL).map(|p| p.id));
        // The reference an entry at `at` with `nonce` holds, on its chunk.
        let reference = |at: u64, nonce: u64| {
            duplex_dedup::chunkmap::Reference { pool: pool.unwrap_or(0), offset: at, nonce, object: object.to_vec() }
                .encode()
                .expect("the simulator's names fit")
        };
        let failed = match op.step.take() {
            None => match TierReadReply::decode(&data) {
                Err(err) => format!("an undecodable tier read reply: {err}"),
                Ok(reply) if !reply.exists => return self.end(ctx, rng, tid, Some(Bytes::new())),
                Ok(reply) => match duplex_dedup::chunkmap::decode_map(&reply.entries) {
                    None => "a malformed chunk map entry".to_string(),
                    Some(map) => {
                        let named = map.into_iter().find(|(at, entry)| *at < to && at + u64::from(entry.len) > from);
                        let base = Bytes::from(reply.data);
                        op.step = match named {
                            Some((at, entry)) if !entry.cached => Some(DedupStep::Chunk { at, entry, base }),
                            // (A cached entry may be stale, the object written
                            // since its pass: the engine replaces it and drops
                            // its reference, also while the final pass runs.)
                            _ => return self.end(ctx, rng, tid, Some(base)),
                        };
                        op.attempt += 1;
                        return self.issue(ctx, tid);
                    }
                },
            },
            Some(DedupStep::Chunk { at, entry, base }) => match frame::open(&data, &entry.fingerprint) {
                Ok(chunk) if chunk.len() == entry.len as usize => {
                    // The chunk's part of the block over the base object's hole.
                    let mut block = base.to_vec();
                    block.resize(BLOCK, 0);
                    let (a, b) = (at.max(from), (at + u64::from(entry.len)).min(to));
                    block[(a - from) as usize..(b - from) as usize]
                        .copy_from_slice(&chunk[(a - at) as usize..(b - at) as usize]);
                    let block = Bytes::from(block);
                    if !op.final_check {
                        return self.end(ctx, rng, tid, Some(block));
                    }
                    let chunk = Bytes::from(entry.fingerprint.object_name());
                    op.step = Some(DedupStep::Reference { chunk, key: reference(at, entry.nonce), block });
                    op.attempt += 1;
                    return self.issue(ctx, tid);
                }
                Ok(chunk) => format!("a chunk of {} bytes for an entry of {}", chunk.len(), entry.len),
                Err(err) => format!("chunk {}: {err}", entry.fingerprint.object_name()),
            },
            Some(DedupStep::Reference { chunk, key, block }) => match duplex_proto::omap::decode_entries(&data) {
                Ok(found) if found.iter().any(|(k, _)| *k == key) => return self.end(ctx, rng, tid, Some(block)),
                Ok(_) => format!(
                    "its chunk map entry names chunk {} without a reference to it",
                    String::from_utf8_lossy(&chunk)
                ),
                Err(err) => format!("an undecodable omap reply: {err}"),
            },
        };
        self.errors.push(format!("client.{id} block {}: {failed}", op.block));
        self.end(ctx, rng, tid, None);
    }

    /// The operation's end: `data` is the answer (None: no answer, it gave up).
    fn end(&mut self, ctx: &mut Ctx, rng: &mut StdRng, tid: u64, data: Option<Bytes>) {
        let Some(op) = self.ops.remove(&tid) else { return };
        if let Some(stamp) = op.write {
            self.write_snaps.insert(stamp.seq, op.snap);
        }
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
                let data = if self.omap && !data.is_empty() {
                    // The entry's value, or nothing (never written).
                    match duplex_proto::omap::decode_entries(&data) {
                        Ok(entries) => entries.into_iter().next().map(|(_, value)| value).unwrap_or_default().into(),
                        Err(err) => {
                            self.errors.push(format!("client.{}: an undecodable omap reply: {err}", self.id));
                            Bytes::new()
                        }
                    }
                } else {
                    data
                };
                let mut block = data.to_vec();
                block.resize(BLOCK, 0);
                let result = Stamp::decode(&block, op.block);
                tracing::trace!(at = ctx.now, client = self.id, tid, block = op.block, snap = op.snap, ?result, "read");
                if op.snap == 0 {
                    self.history.push(BlockOp::Read {
                        block: op.block,
                        result,
                        invoked: op.invoked + 1,
                        completed: ctx.now + 1,
                        final_check: op.final_check,
                    });
                } else {
                    self.snapshot_reads += 1;
                    self.snap_reads.push(SnapRead { snap: op.snap, block: op.block, result });
                }
            }
            (None, None) => {
                if op.final_check {
                    self.final_blocks.push_front((op.block, op.snap));
                }
            }
        }
        self.adopt_if_quiet(ctx.now);
        let think = if op.final_check { 0 } else { rng.gen_range(0..2_000) };
        ctx.timer(ctx.now + think, Timer::ClientNext { slot: op.slot });
    }
}
