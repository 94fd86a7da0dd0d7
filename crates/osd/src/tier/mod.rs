//! The deduplication tier at a base pool's primary (docs/DEDUP.md).
//!
//! A deduplicated pool's objects keep their chunk maps in their omaps
//! (`duplex_dedup::chunkmap`). A chunk whose entry is not *cached* was
//! evicted: the base object's range is a hole and its bytes live in the
//! chunk object the entry names. What the primary keeps in memory for
//! that, per PG, while it serves ([`TierState`]):
//!
//! - **the evicted index**: which chunks of which objects are evicted,
//!   loaded from the store when the PG goes active here (the agent asks
//!   its flusher: `Job::TierLoad`), and kept up to date as the primary
//!   logs each [`OpKind::TierUpdate`]. A client mutation that would change
//!   an evicted chunk is answered `Retry` and the agent *promotes* the
//!   chunk first (writes its bytes back, marks it cached), so that no
//!   write ever lands on a hole whose bytes are elsewhere.
//! - **generations**: each object's mutations counted in the interval. An
//!   engine's [`OpKind::TierRead`] returns the object's generation; its
//!   `TierUpdate` is logged only if the generation is still that (and the
//!   interval the same), under the PG lock, in the same step as the log
//!   append. So an eviction never zeroes bytes a client wrote after the
//!   engine hashed them, and a replaced primary's engine changes nothing.
//! - **the dirty list**: objects changed since their last pass, with when;
//!   the engine (crate::tier::engine, run by crate::tier::agent) walks
//!   those that have been cold long enough.
//!
//! A pool without a tier never reaches this module: one test of the
//! pool's tier on the write path (the per-write budget referees it).

pub mod agent;
pub mod engine;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use bytes::Bytes;
use duplex_dedup::chunkmap::{entry_offset, ChunkEntry};
use duplex_proto::osd::{OpKind, OpRequest, Status};
// (A stale guard is answered `Invalid` with STALE: the engine hears of it
// at once; a resend would not help.)
use duplex_proto::tier::{Action, Guard, STALE};

use crate::backend::common::{lock_served, peering_reply, reply, uncommitted_reply};
use crate::backend::Primary;
use crate::messages::{ClientOp, ClientSlot, Job, Outcome, ReadJob, TierLoad, TierLoaded};
use crate::pg::{Pg, SharedPg};

/// What a deduplicated PG's primary keeps of its tier while it serves.
#[derive(Debug)]
pub struct TierState {
    /// The interval it was loaded in (it is stale in any other).
    pub interval: u64,
    /// Evicted chunks: object → chunk offset → chunk length.
    evicted: HashMap<Bytes, BTreeMap<u64, u32>>,
    generations: HashMap<Bytes, u64>,
    /// Objects changed since their last pass, and when last.
    pub dirty: BTreeMap<Bytes, Instant>,
    /// Evicted chunks a client waits to change: object → chunk offsets.
    pub promote: BTreeMap<Bytes, BTreeSet<u64>>,
    /// Per object (absent: 0), a lower bound of the snapshot sequence its
    /// head was last changed under, as the store holds it once the logged
    /// entries are applied. A client mutation under a newer snapshot
    /// clones the head when it is applied (crate::snaps), and a clone must
    /// hold the whole object, no hole whose bytes are in a chunk object
    /// only one head's references keep: so such a mutation waits until no
    /// chunk of the object is evicted ([`admit`]). A bound too low costs a
    /// promotion too many, never a clone with holes.
    snapseqs: HashMap<Bytes, u64>,
}

impl TierState {
    /// The state of a PG whose store holds what `walked` found, in
    /// `interval`; every object it found is dirty (a new primary does not
    /// know which changed since their last pass).
    pub fn loaded(interval: u64, walked: TierLoaded, now: Instant) -> TierState {
        let TierLoaded { evicted, objects, snapseqs } = walked;
        debug_assert!(evicted.values().all(|chunks| !chunks.is_empty()), "an object with no evicted chunk indexed");
        let dirty = objects.into_iter().map(|o| (o, now)).collect();
        TierState { interval, evicted, generations: HashMap::new(), dirty, promote: BTreeMap::new(), snapseqs }
    }

    /// The lower bound of `object`'s head's snapshot sequence ([`TierState::snapseqs`]).
    fn snapseq(&self, object: &[u8]) -> u64 {
        self.snapseqs.get(object).copied().unwrap_or(0)
    }

    pub fn generation(&self, object: &[u8]) -> u64 {
        self.generations.get(object).copied().unwrap_or(0)
    }

    /// The evicted chunks of `object` that overlap `[from, to)`.
    pub fn evicted_in(&self, object: &[u8], from: u64, to: u64) -> Vec<(u64, u32)> {
        let Some(chunks) = self.evicted.get(object) else { return Vec::new() };
        debug_assert!(!chunks.is_empty(), "an object with no evicted chunk kept in the index");
        let found: Vec<(u64, u32)> = chunks
            .range(..to)
            .filter(|(offset, len)| **offset + u64::from(**len) > from)
            .map(|(o, l)| (*o, *l))
            .collect();
        debug_assert!(found.windows(2).all(|w| w[0].0 + u64::from(w[0].1) <= w[1].0), "evicted chunks overlap");
        found
    }

    /// How many chunks are evicted (a gauge for `duplex dedup status`).
    pub fn evicted_chunks(&self) -> usize {
        self.evicted.values().map(BTreeMap::len).sum()
    }

    fn changed(&mut self, object: &Bytes) {
        let generation = self.generations.entry(object.clone()).or_insert(0);
        *generation = generation.checked_add(1).expect("an object's generation overflowed");
    }
}

/// How long an index load asked for and not installed (it failed) waits
/// before it is asked for again.
pub const LOAD_RETRY: std::time::Duration = std::time::Duration::from_secs(1);

/// The load of `pg`'s index to ask its flusher for, if the PG is active
/// without one and none was asked for in this interval (or the last one
/// asked failed, [`LOAD_RETRY`] ago). Sent by whoever finds it missing: a
/// client's request, or the engine. The caller sends it once the PG lock
/// is dropped (the flusher's queue may be full).
pub fn load_wanted(pg: &mut Pg, now: Instant) -> Option<TierLoad> {
    let interval = pg.active.as_ref()?.interval;
    if current(pg).is_some() {
        return None;
    }
    if pg.tier_load_asked.is_some_and(|(asked, at)| asked == interval && now < at + LOAD_RETRY) {
        return None;
    }
    pg.tier_load_asked = Some((interval, now));
    Some(TierLoad { pg: pg.key, interval })
}

/// Installs the index that a [`TierLoad`] for `interval` found in the
/// store, if the PG still serves that interval without one; whether it
/// did. Never over a current index: its generations and dirty list are
/// newer than the store's walk (an engine's guard read before a reload
/// would match again).
pub fn install(pg: &SharedPg, interval: u64, loaded: TierLoaded, now: Instant) -> bool {
    let mut guard = pg.lock().expect("PG lock");
    if guard.active.as_ref().is_none_or(|a| a.interval != interval) || current(&mut guard).is_some() {
        return false;
    }
    let evicted: usize = loaded.evicted.values().map(BTreeMap::len).sum();
    let objects = loaded.objects.len();
    tracing::debug!(pg = guard.key, interval, objects, evicted, "deduplicated PG index loaded");
    guard.tier = Some(Box::new(TierState::loaded(interval, loaded, now)));
    debug_assert!(current(&mut guard).is_some(), "an index installed for the interval served");
    true
}

/// The tier state of `pg` if it is loaded for the interval the PG serves.
pub fn current(pg: &mut Pg) -> Option<&mut TierState> {
    let interval = pg.active.as_ref()?.interval;
    pg.tier.as_deref_mut().filter(|tier| tier.interval == interval)
}

/// Why pool `pool`'s kind refuses `request` (`None`: it goes on). A
/// deduplicated pool refuses what its chunk maps cannot follow
/// ([`refuses`]); a chunk pool takes chunk operations only (its replay
/// converges because nothing else changes its objects, docs/DEDUP.md);
/// tier and chunk operations go to their pools only. A plain pool's
/// request costs one test.
pub fn pool_refuses(pool: &duplex_map::Pool, request: &OpRequest) -> Option<String> {
    let kind = request.kind;
    let tier_op = matches!(kind, OpKind::TierRead | OpKind::TierUpdate);
    let chunk_op = matches!(kind, OpKind::ChunkPut | OpKind::ChunkUnref);
    if pool.dedup.is_none() && pool.chunks.is_none() && !tier_op && !chunk_op {
        return None;
    }
    if pool.dedup.is_some() {
        if let Some(why) = refuses(request) {
            return Some(why.into());
        }
    } else if tier_op {
        return Some("the deduplication tier's operations go to a deduplicated pool".into());
    }
    if chunk_op && pool.chunks.is_none() {
        return Some(format!("{kind:?} goes to a chunk pool; pool {} is not one", request.pool));
    }
    if pool.chunks.is_some() && !chunk_op && (kind.is_mutation() || kind == OpKind::TrimSnaps) {
        return Some(format!("pool {} is a chunk pool: only the deduplication tier changes it", request.pool));
    }
    None
}

/// Why a deduplicated pool refuses `request` outright (`None`: it may go
/// on to [`admit`]).
pub fn refuses(request: &OpRequest) -> Option<&'static str> {
    match request.kind {
        OpKind::Read => Some("a deduplicated pool's objects are read with TierRead (this client predates the tier)"),
        OpKind::OmapSet | OpKind::OmapRemove | OpKind::OmapRemoveRange => {
            Some("a deduplicated pool's omaps hold its chunk maps; clients do not change them")
        }
        _ => None,
    }
}

/// How long an object whose chunks a writer waits for stays out of the
/// engine's passes, past its hotness rule (its dirty time is set ahead).
pub const PROMOTED_HOT: std::time::Duration = std::time::Duration::from_secs(2);

/// A refusal: the status and why.
pub type Refused = (Status, String);

/// What an admitted mutation of a deduplicated PG changes in its tier
/// state, applied by [`commit`] once its entry is in the log (a mutation
/// refused after admission, its log full say, changes nothing).
#[derive(Debug)]
pub struct Admitted {
    object: Bytes,
    at: Instant,
    change: Change,
}

#[derive(Debug)]
enum Change {
    /// A client mutation: the object is dirty; a delete's evicted chunks
    /// go; the head's snapshot sequence bound becomes `snapseq`.
    Client { delete: bool, snapseq: u64 },
    /// A tier update: chunks evicted, and chunks cached again or removed.
    Update { evict: Vec<(u64, u32)>, keep: Vec<u64> },
}

/// Admits a mutation of a deduplicated PG at its primary, under the PG
/// lock and before its log append: a [`OpKind::TierUpdate`] whose guard
/// still holds, or a client mutation that touches no evicted chunk. It
/// changes nothing but the promotions wanted; [`commit`] applies the rest.
pub fn admit(pg: &mut Pg, request: &OpRequest, now: Instant) -> Result<Admitted, Refused> {
    debug_assert!(request.kind.is_mutation(), "{:?} admitted as a mutation", request.kind);
    let Some(tier) = current(pg) else {
        if request.kind == OpKind::TierUpdate {
            // Its guard names an interval whose index is gone.
            return Err((Status::Invalid, STALE.into()));
        }
        return Err((Status::Retry, "the deduplication tier's index of this PG is loading; resend".into()));
    };
    let object = &request.object;
    if request.kind == OpKind::TierUpdate {
        let (guard, actions) = duplex_proto::tier::decode_update(&request.data)
            .map_err(|e| (Status::Invalid, format!("a tier update: {e}")))?;
        if guard != guard_of(tier, object) {
            return Err((Status::Invalid, STALE.into()));
        }
        let (evict, keep) = index_changes(&actions)?;
        return Ok(Admitted { object: object.clone(), at: now, change: Change::Update { evict, keep } });
    }
    let snapseq = tier.snapseq(object);
    let touched = match request.kind {
        // It clones the head first, if the head exists: the clone holds
        // every chunk's bytes ([`TierState::snapseqs`]).
        _ if request.snap > snapseq => Some((0, u64::MAX)),
        OpKind::Write => Some((request.offset, request.offset.saturating_add(request.data.len() as u64))),
        OpKind::Zero => {
            let len = duplex_oplog::zero_length(&request.data).unwrap_or(u64::MAX);
            Some((request.offset, request.offset.saturating_add(len)))
        }
        // Every chunk it cuts or passes: were one left evicted past the
        // end, bytes there would read as the chunk's if the object grew.
        OpKind::Truncate => Some((request.offset, u64::MAX)),
        _ => None,
    };
    if let Some((from, to)) = touched {
        let evicted = tier.evicted_in(object, from, to);
        if !evicted.is_empty() {
            tier.promote.entry(object.clone()).or_default().extend(evicted.iter().map(|(offset, _)| *offset));
            // About to be written: hot for a while, so that no pass evicts
            // the chunks again before the writer's retry lands (with a
            // pass due at once, that was a livelock: promote, evict, ...).
            tier.dirty.insert(object.clone(), now + PROMOTED_HOT);
            return Err((Status::Retry, "a deduplicated chunk this changes is being brought back; resend".into()));
        }
    }
    // (A delete's chunk map goes with it; the references it held are
    // leaks the tier scrub reclaims.)
    let delete = request.kind == OpKind::Delete;
    let change = Change::Client { delete, snapseq: snapseq_after(request, snapseq) };
    Ok(Admitted { object: object.clone(), at: now, change })
}

/// The bound of a head's snapshot sequence after `request`, a client
/// mutation, from `before` ([`TierState::snapseqs`]): the store's
/// sequence after it (crate::snaps) is the request's if it is newer and
/// the head exists after it; 0 after a delete; the old one otherwise.
/// Only the operations that always leave a head raise the bound (a zero
/// of an absent object leaves none, a copy-up of an existing one changes
/// nothing).
fn snapseq_after(request: &OpRequest, before: u64) -> u64 {
    match request.kind {
        OpKind::Delete => 0,
        OpKind::Write | OpKind::Truncate | OpKind::CreatePreallocated | OpKind::SetAttr | OpKind::OmapSet => {
            before.max(request.snap)
        }
        _ => before,
    }
}

/// Applies an admitted mutation to its PG's tier state, under the same
/// PG lock as its log append, right after it.
pub fn commit(pg: &mut Pg, admitted: &Admitted) {
    let tier = current(pg).expect("the PG lock held since admission: the index is still current");
    let object = &admitted.object;
    match &admitted.change {
        Change::Client { delete, snapseq } => {
            if *delete {
                tier.evicted.remove(object);
            }
            if *snapseq == 0 {
                tier.snapseqs.remove(object);
            } else {
                tier.snapseqs.insert(object.clone(), *snapseq);
            }
            tier.dirty.insert(object.clone(), admitted.at);
            debug_assert!(
                !*delete || tier.evicted_in(object, 0, u64::MAX).is_empty(),
                "a deleted object's chunks stay"
            );
        }
        Change::Update { evict, keep } => {
            let chunks = tier.evicted.entry(object.clone()).or_default();
            for offset in keep {
                chunks.remove(offset);
            }
            chunks.extend(evict.iter().copied());
            debug_assert!(chunks.values().all(|len| *len > 0), "an evicted chunk of no bytes");
            debug_assert!(keep.iter().all(|offset| !chunks.contains_key(offset)), "a chunk kept stays evicted");
            if chunks.is_empty() {
                tier.evicted.remove(object);
            }
        }
    }
    let before = tier.generation(object);
    tier.changed(object);
    debug_assert_eq!(tier.generation(object), before + 1, "a logged mutation moves its object on once");
}

/// Chunks an update evicts (offset, length), and chunks it caches again or removes.
type IndexChanges = (Vec<(u64, u32)>, Vec<u64>);

/// A tier update's changes of the evicted index (chunks evicted, chunks
/// cached again or removed); refused whole if it would leave an evicted
/// chunk whose bytes it does not zero, or sets anything but chunk map
/// entries.
fn index_changes(actions: &[Action]) -> Result<IndexChanges, Refused> {
    let invalid = |why: &str| Err((Status::Invalid, why.to_string()));
    let mut evict = Vec::new();
    let mut keep = Vec::new();
    for action in actions {
        match action {
            Action::SetEntry { key, value } => {
                let (Some(offset), Some(entry)) = (entry_offset(key), ChunkEntry::decode(value)) else {
                    return invalid("a tier update sets something other than a chunk map entry");
                };
                if entry.cached {
                    keep.push(offset);
                } else {
                    let zeroed = actions.iter().any(|a| {
                        matches!(a, Action::Zero { offset: o, len } if *o == offset && *len == u64::from(entry.len))
                    });
                    if !zeroed {
                        return invalid("a tier update evicts a chunk without zeroing its bytes");
                    }
                    evict.push((offset, entry.len));
                }
            }
            Action::RemoveEntry { key } => match entry_offset(key) {
                Some(offset) => keep.push(offset),
                None => return invalid("a tier update removes something other than a chunk map entry"),
            },
            Action::Zero { .. } | Action::Write { .. } => {}
        }
    }
    if evict.iter().any(|(offset, _)| keep.contains(offset)) {
        return invalid("a tier update evicts and keeps one chunk");
    }
    Ok((evict, keep))
}

/// A deduplicated pool's read: from the store (after a flush when the
/// log holds the object's entries), the bytes with the chunk map entries
/// of their chunks, read there at one moment, and the object's
/// generation now (`crate::tier`).
pub(crate) fn tier_read(at: &Primary<'_>, op: ClientOp) -> Outcome {
    let (shared, epoch) = (at.shared, at.epoch);
    let Some(tier) = at.tier else {
        return reply(&op, Status::Invalid, epoch, "the pool has no deduplication tier");
    };
    let request = &op.request;
    let (guard, flush_first) = {
        let Some(mut pg) = lock_served(at.pg, &at.interval) else { return peering_reply(shared, &op, epoch) };
        if pg.uncommitted.touches(&request.object, 0, u64::MAX) {
            return uncommitted_reply(shared, &op, epoch);
        }
        let flush_first = pg.index.contains(&request.object);
        let Some(state) = crate::tier::current(&mut pg) else {
            let load = load_wanted(&mut pg, op.arrived);
            drop(pg);
            if let Some(load) = load {
                shared.send_job(load.pg, Job::TierLoad(load));
            }
            return reply(&op, Status::Retry, epoch, "the deduplication tier's index of this PG is loading; resend");
        };
        let guard = crate::tier::guard_of(state, &request.object);
        debug_assert_eq!(Some(guard.interval), pg.active.as_ref().map(|a| a.interval), "a guard of another interval");
        (guard, flush_first)
    };
    let arg = read_arg(&guard, tier.max_chunk_len());
    shared.metrics.reads.add(1);
    shared.send_job(
        at.key,
        Job::Read(ReadJob {
            kind: OpKind::TierRead,
            pg: at.key,
            object: request.object.clone(),
            arg,
            offset: request.offset,
            len: request.length,
            flush_first,
            reply: ClientSlot { thread: op.thread, token: op.token, slot: op.slot },
            map_epoch: epoch,
            // At a snapshot: the clone, which holds every chunk, or the
            // head, if unchanged since, with its evicted chunks.
            snap: request.snap,
        }),
    );
    Outcome::Queued
}

/// A diff's flusher job argument (a client's is not kept): in a
/// deduplicated pool, evicted chunks count as changed. (They are holes in
/// the store, which a diff of block maps takes for zeros; over-reporting
/// a clone's and its head's chunks is safe, a diff only says where to look.)
pub fn diff_arg(tiered: bool) -> Bytes {
    Bytes::from_static(if tiered { DIFF_EVICTED } else { b"" })
}

const DIFF_EVICTED: &[u8] = b"evicted";

/// Whether a diff job made with [`diff_arg`] counts evicted chunks.
pub fn diff_counts_evicted(arg: &[u8]) -> bool {
    arg == DIFF_EVICTED
}

/// (offset, length) ranges sorted, with overlapping and touching ones joined.
pub fn merge_ranges(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (offset, len) in ranges.into_iter().filter(|(_, len)| *len > 0) {
        match merged.last_mut() {
            // (Saturating: the ranges come from the store's chunk maps.)
            Some((at, n)) if offset <= at.saturating_add(*n) => *n = (*n).max(offset.saturating_add(len) - *at),
            _ => merged.push((offset, len)),
        }
    }
    debug_assert!(merged.windows(2).all(|w| w[0].0.saturating_add(w[0].1) < w[1].0), "merged ranges touch");
    merged
}

/// What a tier read's flusher job carries besides the range: the guard
/// taken at admission and the pool's longest chunk ([`read_arg_of`] reads
/// it): the entries of the chunks a read overlaps start at most that many
/// bytes less one before it.
fn read_arg(guard: &Guard, max_chunk_len: u32) -> Bytes {
    let mut arg = Vec::with_capacity(READ_ARG_LEN);
    arg.extend_from_slice(&guard.interval.to_le_bytes());
    arg.extend_from_slice(&guard.generation.to_le_bytes());
    arg.extend_from_slice(&max_chunk_len.to_le_bytes());
    Bytes::from(arg)
}

const READ_ARG_LEN: usize = 20;

/// A tier read job's guard and longest chunk (`None`: not one [`read_arg`] made).
pub fn read_arg_of(arg: &[u8]) -> Option<(Guard, u32)> {
    let arg: &[u8; READ_ARG_LEN] = arg.try_into().ok()?;
    let word = |at: usize| u64::from_le_bytes(arg[at..at + 8].try_into().expect("8 bytes"));
    let max_chunk_len = u32::from_le_bytes(arg[16..].try_into().expect("4 bytes"));
    Some((Guard { interval: word(0), generation: word(8) }, max_chunk_len))
}

/// The guard a tier read returns for `object`.
pub fn guard_of(tier: &TierState, object: &[u8]) -> Guard {
    Guard { interval: tier.interval, generation: tier.generation(object) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duplex_dedup::chunkmap::entry_key;
    use duplex_dedup::Fingerprint;

    fn state() -> TierState {
        let mut evicted = HashMap::new();
        evicted.insert(Bytes::from_static(b"o"), BTreeMap::from([(32768u64, 32768u32)]));
        let objects = vec![Bytes::from_static(b"o")];
        TierState::loaded(7, TierLoaded { evicted, objects, snapseqs: HashMap::new() }, Instant::now())
    }

    fn entry(cached: bool) -> Vec<u8> {
        ChunkEntry { len: 32768, nonce: 1, fingerprint: Fingerprint::of(b"x"), cached }.encode()
    }

    #[test]
    fn each_pool_kind_takes_its_own_operations_only() {
        let request = |kind: OpKind| OpRequest {
            kind,
            pool: 1,
            pg: 0,
            map_epoch: 1,
            object: Bytes::from_static(b"o"),
            offset: 0,
            length: 0,
            data: Bytes::new(),
            client: 1,
            snap: 0,
        };
        let plain = duplex_map::Pool::new(1, "p".into(), 2, 1, 8, None);
        let chunks = duplex_map::Pool { chunks: Some(duplex_map::ChunkStore::default()), ..plain.clone() };
        let tiered = duplex_map::Pool { dedup: Some(duplex_map::DedupTier::new(2)), ..plain.clone() };
        let refused = |pool: &duplex_map::Pool, kind| pool_refuses(pool, &request(kind)).is_some();
        for kind in [OpKind::Write, OpKind::Read, OpKind::OmapSet, OpKind::TrimSnaps] {
            assert!(!refused(&plain, kind), "{kind:?} in a plain pool");
        }
        for kind in [OpKind::ChunkPut, OpKind::ChunkUnref, OpKind::TierRead, OpKind::TierUpdate] {
            assert!(refused(&plain, kind), "{kind:?} in a plain pool");
        }
        for kind in [OpKind::ChunkPut, OpKind::ChunkUnref, OpKind::Read, OpKind::Stat, OpKind::OmapList] {
            assert!(!refused(&chunks, kind), "{kind:?} in a chunk pool");
        }
        for kind in [OpKind::Write, OpKind::Delete, OpKind::OmapSet, OpKind::TrimSnaps, OpKind::TierRead] {
            assert!(refused(&chunks, kind), "{kind:?} in a chunk pool");
        }
        for kind in [OpKind::TierRead, OpKind::TierUpdate, OpKind::Write, OpKind::Stat, OpKind::Delete] {
            assert!(!refused(&tiered, kind), "{kind:?} in a deduplicated pool");
        }
        for kind in [OpKind::Read, OpKind::OmapSet, OpKind::ChunkPut] {
            assert!(refused(&tiered, kind), "{kind:?} in a deduplicated pool");
        }
        for kind in [OpKind::CopyUp, OpKind::Diff, OpKind::TrimClone, OpKind::Write, OpKind::TierRead] {
            let snap = OpRequest { snap: 3, ..request(kind) };
            assert!(pool_refuses(&tiered, &snap).is_none(), "{kind:?} under a snapshot in a deduplicated pool");
        }
        // (A tier update under a snapshot does not decode: duplex_proto.)
    }

    #[test]
    fn updates_change_the_index_and_an_eviction_must_zero_its_bytes() {
        let mut tier = state();
        let object = Bytes::from_static(b"o");
        let apply = |tier: &mut TierState, actions: &[Action]| -> Result<(), Refused> {
            let (evict, keep) = index_changes(actions)?;
            let chunks = tier.evicted.entry(object.clone()).or_default();
            for offset in &keep {
                chunks.remove(offset);
            }
            chunks.extend(evict);
            if chunks.is_empty() {
                tier.evicted.remove(&object);
            }
            Ok(())
        };
        let evict =
            [Action::SetEntry { key: entry_key(0), value: entry(false) }, Action::Zero { offset: 0, len: 32768 }];
        apply(&mut tier, &evict).unwrap();
        assert_eq!(tier.evicted_in(b"o", 0, u64::MAX), vec![(0, 32768), (32768, 32768)]);
        assert_eq!(tier.evicted_in(b"o", 32767, 32768), vec![(0, 32768)]);
        let promote = [
            Action::Write { offset: 32768, data: vec![1; 32768] },
            Action::SetEntry { key: entry_key(32768), value: entry(true) },
        ];
        apply(&mut tier, &promote).unwrap();
        assert_eq!(tier.evicted_in(b"o", 0, u64::MAX), vec![(0, 32768)]);
        let unzeroed = [Action::SetEntry { key: entry_key(65536), value: entry(false) }];
        assert_eq!(index_changes(&unzeroed).unwrap_err().0, Status::Invalid);
        let foreign = [Action::SetEntry { key: b"x".to_vec(), value: vec![] }];
        assert!(index_changes(&foreign).is_err());
        let guard = Guard { interval: 7, generation: 42 };
        assert_eq!(read_arg_of(&read_arg(&guard, 32 << 10)), Some((guard, 32 << 10)));
        assert_eq!(read_arg_of(&[0; 19]), None);
        let both = [
            Action::SetEntry { key: entry_key(0), value: entry(false) },
            Action::Zero { offset: 0, len: 32768 },
            Action::RemoveEntry { key: entry_key(0) },
        ];
        assert!(index_changes(&both).is_err());
        apply(&mut tier, &[Action::RemoveEntry { key: entry_key(0) }]).unwrap();
        assert_eq!(tier.evicted_chunks(), 0);
    }

    #[test]
    fn diff_ranges_merge_and_only_a_tiered_pool_counts_evicted_chunks() {
        assert_eq!(
            merge_ranges(vec![(8, 4), (0, 4), (4, 2), (20, 0), (30, 5), (31, 1)]),
            vec![(0, 6), (8, 4), (30, 5)]
        );
        assert_eq!(merge_ranges(vec![(0, 4), (4, 4)]), vec![(0, 8)]);
        assert!(merge_ranges(Vec::new()).is_empty());
        assert!(diff_counts_evicted(&diff_arg(true)));
        assert!(!diff_counts_evicted(&diff_arg(false)));
    }

    /// A mutation under a snapshot newer than its head's waits until no
    /// chunk of the object is evicted (the clone it makes must be whole);
    /// the bound follows what the store will hold.
    #[test]
    fn a_write_that_clones_its_head_waits_for_every_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let table = crate::pg::PgTable::open(crate::config::OplogMode::File, dir.path(), 1 << 20).unwrap();
        let shared = table.get_or_open(7).unwrap();
        let now = Instant::now();
        shared.lock().unwrap().active =
            Some(crate::pg::Activation { interval: 5, members: vec![0, 1], backfill: Vec::new() });
        let object = Bytes::from_static(b"o");
        let walked = TierLoaded {
            evicted: HashMap::from([(object.clone(), BTreeMap::from([(32768u64, 32768u32)]))]),
            objects: vec![object.clone()],
            snapseqs: HashMap::from([(object.clone(), 2)]),
        };
        assert!(install(&shared, 5, walked, now));
        let write = |snap: u64| OpRequest {
            kind: OpKind::Write,
            pool: 1,
            pg: 0,
            map_epoch: 1,
            object: object.clone(),
            offset: 0,
            length: 0,
            data: Bytes::from(vec![1; 4096]),
            client: 1,
            snap,
        };
        let mut pg = shared.lock().unwrap();
        // Under the head's own snapshot, or an older one, the write at 0
        // touches no evicted chunk.
        for snap in [0, 2] {
            let admitted = admit(&mut pg, &write(snap), now).expect("no evicted chunk touched");
            commit(&mut pg, &admitted);
        }
        assert_eq!(current(&mut pg).unwrap().snapseq(b"o"), 2);
        // Under snapshot 3 it clones the head: the chunk at 32 KiB comes back first.
        let (status, _) = admit(&mut pg, &write(3), now).unwrap_err();
        assert_eq!(status, Status::Retry);
        assert_eq!(current(&mut pg).unwrap().promote.get(&object), Some(&BTreeSet::from([32768])));
        // Promoted (a tier update keeps it): the write goes, and the bound moves.
        let guard = guard_of(current(&mut pg).unwrap(), &object);
        let keep = Action::SetEntry { key: duplex_dedup::chunkmap::entry_key(32768), value: entry(true) };
        let update = OpRequest {
            kind: OpKind::TierUpdate,
            data: Bytes::from(duplex_proto::tier::encode_update(&guard, &[keep])),
            ..write(0)
        };
        let admitted = admit(&mut pg, &update, now).expect("the guard holds");
        commit(&mut pg, &admitted);
        let admitted = admit(&mut pg, &write(3), now).expect("nothing evicted");
        commit(&mut pg, &admitted);
        assert_eq!(current(&mut pg).unwrap().snapseq(b"o"), 3);
        // A delete ends the head (the store's sequence with it); a zero may leave none.
        assert_eq!(snapseq_after(&OpRequest { kind: OpKind::Delete, ..write(5) }, 3), 0);
        assert_eq!(snapseq_after(&OpRequest { kind: OpKind::Zero, ..write(9) }, 3), 3);
        assert_eq!(snapseq_after(&OpRequest { kind: OpKind::CopyUp, ..write(9) }, 3), 3);
    }

    /// An index is asked for once per interval (again only after
    /// [`LOAD_RETRY`], a failed load), and installed only in the interval
    /// it was walked for, never over a current one.
    #[test]
    fn an_index_is_loaded_once_per_interval_and_never_over_a_current_one() {
        let dir = tempfile::tempdir().unwrap();
        let table = crate::pg::PgTable::open(crate::config::OplogMode::File, dir.path(), 1 << 20).unwrap();
        let shared = table.get_or_open(7).unwrap();
        let now = Instant::now();
        let activate = |interval: u64| {
            shared.lock().unwrap().active =
                Some(crate::pg::Activation { interval, members: vec![0, 1], backfill: Vec::new() });
        };
        assert!(load_wanted(&mut shared.lock().unwrap(), now).is_none(), "not active: nothing to load");
        activate(5);
        let load = load_wanted(&mut shared.lock().unwrap(), now).expect("active without an index");
        assert_eq!((load.pg, load.interval), (7, 5));
        assert!(load_wanted(&mut shared.lock().unwrap(), now).is_none(), "asked already");
        let later = now + LOAD_RETRY;
        assert!(load_wanted(&mut shared.lock().unwrap(), later).is_some(), "a failed load is asked again");
        let mut evicted = HashMap::new();
        evicted.insert(Bytes::from_static(b"o"), BTreeMap::from([(0u64, 16384u32)]));
        let walked = |evicted: &HashMap<Bytes, BTreeMap<u64, u32>>| TierLoaded {
            evicted: evicted.clone(),
            objects: vec![Bytes::from_static(b"o")],
            snapseqs: HashMap::new(),
        };
        assert!(!install(&shared, 4, walked(&evicted), now), "walked for another interval");
        assert!(install(&shared, 5, walked(&evicted), now));
        assert_eq!(current(&mut shared.lock().unwrap()).unwrap().evicted_chunks(), 1);
        assert!(!install(&shared, 5, walked(&HashMap::new()), now), "never over a current index");
        assert_eq!(current(&mut shared.lock().unwrap()).unwrap().evicted_chunks(), 1);
        assert!(load_wanted(&mut shared.lock().unwrap(), later).is_none(), "loaded: nothing to ask");
        activate(6);
        assert!(current(&mut shared.lock().unwrap()).is_none(), "stale in a new interval");
        assert_eq!(load_wanted(&mut shared.lock().unwrap(), now).map(|l| l.interval), Some(6));
    }
}
