//! The deduplication engine's work, written once for its two runtimes:
//! the agent's thread ([`crate::tier::agent`], whose I/O is the client
//! library's blocking calls) and the simulator (duplex-sim, whose I/O is
//! messages on its virtual network, answered events later). The work on
//! one object is an `async fn` over [`TierIo`]: the agent polls it once
//! and it runs to its end, the simulator polls it again at each answer.
//! No executor, no runtime: `async` only turns the steps' order into a
//! state machine the simulator can stop between any two I/Os, which is
//! where its faults land.
//!
//! What is done per PG, in turn (docs/DEDUP.md, "The engine"):
//! 1. **Load** the PG's tier index (evicted chunks) when the PG is active
//!    here without one: its flusher walks the store and installs it
//!    (`crate::tier::load_wanted`; a client's request that finds it
//!    missing asks too). Until then its writes wait.
//! 2. **Promote** the objects whose evicted chunks a client waits to
//!    change ([`promote`]): read each chunk object, write its bytes back
//!    and mark the entry cached, in one guarded update.
//! 3. **Pass** over dirty objects not written for `dedup_cold_after`
//!    (the hotness rule: an object written recently stays as it is;
//!    [`pass`]): tier-read the object, plan ([`plan_object`]), put the new
//!    chunks (compressed as their pool says) and read each reference back,
//!    log the entry changes and evictions in one guarded update, then drop
//!    the references of the chunks it replaced.
//!
//! Every I/O asks the pool's rate control first ([`TierIo::gate`], §4.4.2).
//! A crash between any two steps leaves at worst a reference no entry
//! names: never an entry whose chunk is missing, since an entry is set
//! only once its reference was read back, and a reference is dropped only
//! after the update that stopped naming it was acknowledged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_dedup::chunkmap::{entry_key, entry_offset, Reference};
use duplex_dedup::plan::{plan_object, Step};
use duplex_dedup::{frame, ChunkEntry};
use duplex_map::{ChunkStore, ClusterMap, DedupTier, OsdId, PoolId};
use duplex_proto::osd::MAX_IO_BYTES;
use duplex_proto::tier::{Action, Guard, TierReadReply};

use crate::messages::TierLoad;
use crate::metrics::Metrics;
use crate::pg::{pool_of, Pg, SharedPg};

/// How long one engine I/O may take before its step stops (its outcome
/// unknown): the engine works on one object at a time, and writers wait
/// on its promotions.
pub const OP_TIMEOUT: Duration = Duration::from_secs(3);
/// Objects one PG gets passed before the engine moves on to the next.
pub const PASSES_PER_TURN: usize = 8;
/// Chunks one pass update covers at most (two actions each, well inside
/// `duplex_proto::tier::MAX_ACTIONS`).
const CHUNKS_PER_UPDATE: usize = 1024;
/// Bytes of chunks one promotion update writes back at most (inside one
/// request's `MAX_IO_BYTES`), whatever the PG logs' size.
const UPDATE_BYTES: usize = 2 << 20;

/// Bytes of chunks one promotion update may write back, on OSDs whose PG
/// logs hold `oplog_pg_bytes`: a log takes no entry past half its ring,
/// and an update can pass this budget by one chunk (at most 128 KiB), so
/// a quarter of the log, and at least one chunk whatever the log (the
/// simulator's logs are 64 KiB: one 16 KiB chunk an update).
pub fn promotion_budget(oplog_pg_bytes: u64) -> usize {
    usize::try_from(oplog_pg_bytes / 4).unwrap_or(usize::MAX).min(UPDATE_BYTES)
}

/// Why a step stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Stop {
    /// The object changed under the engine, or the PG moved: try later.
    Stale,
    /// The object is gone.
    Gone,
    /// Anything else, an I/O whose outcome is unknown (a timeout) included.
    Failed(String),
}

/// The engine's view of the cluster: each call is one request, sent to
/// the primary of the object's PG and resent as a client resends.
// (No `Send` bound is wanted: each engine is driven by one thread.)
#[allow(async_fn_in_trait)]
pub trait TierIo {
    /// Returns when the pool's rate control lets one engine I/O go.
    async fn gate(&self, tier: &DedupTier);
    /// `OpKind::TierRead` of `len` bytes at `offset`.
    async fn tier_read(&self, pool: u32, object: &[u8], offset: u64, len: u32) -> Result<TierReadReply, Stop>;
    /// `OpKind::TierUpdate`, logged only if `guard` still holds (else `Stop::Stale`).
    async fn tier_update(&self, pool: u32, object: &[u8], guard: &Guard, actions: &[Action]) -> Result<(), Stop>;
    /// `OpKind::ChunkPut`: the chunk object `name` with `sealed`, and `reference` in its set.
    async fn chunk_put(&self, pool: u32, name: &[u8], reference: &[u8], sealed: &[u8]) -> Result<(), Stop>;
    /// Whether chunk object `name`'s reference set holds `reference`.
    async fn has_reference(&self, pool: u32, name: &[u8], reference: &[u8]) -> Result<bool, Stop>;
    /// `OpKind::ChunkUnref` (the chunk object goes with its last reference).
    async fn chunk_unref(&self, pool: u32, name: &[u8], reference: &[u8]) -> Result<(), Stop>;
    /// Up to `len` bytes of `object` from its start.
    async fn read(&self, pool: u32, object: &[u8], len: u32) -> Result<Vec<u8>, Stop>;
    /// A fresh random number (a pass's reference nonce): the simulator's
    /// comes from its seed.
    fn random(&self) -> u64;
}

/// A deduplicated pool as the engine works on it.
#[derive(Clone, Copy, Debug)]
pub struct Tiered {
    pub tier: DedupTier,
    pub store: ChunkStore,
}

/// The deduplicated pools of `map`, with their chunk pools' settings.
pub fn tiered_pools(map: &ClusterMap) -> HashMap<PoolId, Tiered> {
    map.pools
        .values()
        .filter_map(|pool| {
            let tier = pool.dedup?;
            let store = map.pools.get(&tier.chunk_pool)?.chunks?;
            Some((pool.id, Tiered { tier, store }))
        })
        .collect()
}

/// What the engine has to do in one PG.
#[derive(Debug)]
pub enum Work {
    /// Ask the PG's flusher to load its index (the runtime sends it).
    Load(TierLoad),
    /// Promote these objects' chunks (offsets), then pass the cold objects.
    Objects { key: u32, tiered: Tiered, promote: Vec<(Bytes, BTreeSet<u64>)>, cold: Vec<Bytes> },
}

/// What the engine of OSD `me` has to do in `pg` at `now` (None:
/// nothing, or the PG is not a deduplicated one it is primary of). The
/// objects it returns leave the PG's lists: a step that does not finish
/// puts its object back ([`after_pass`]); a promotion that does not
/// finish is asked for again by the writer's resend. With `passes`
/// false, only promotions are taken (the runtime has passes queued).
pub fn work_of(
    pg: &mut Pg,
    tiered: &HashMap<PoolId, Tiered>,
    me: OsdId,
    now: Instant,
    cold_after: Duration,
    passes: bool,
) -> Option<Work> {
    let key = pg.key;
    let tiered = tiered.get(&pool_of(key)).copied()?;
    pg.active.as_ref().filter(|a| a.members.first() == Some(&me))?;
    let Some(state) = crate::tier::current(pg) else {
        return crate::tier::load_wanted(pg, now).map(Work::Load);
    };
    let promote: Vec<(Bytes, BTreeSet<u64>)> = std::mem::take(&mut state.promote).into_iter().collect();
    let paused = tiered.tier.mode == duplex_map::DedupMode::Pause;
    let cold: Vec<Bytes> = state
        .dirty
        .iter()
        .filter(|(_, at)| passes && !paused && now >= **at + cold_after)
        .map(|(object, _)| object.clone())
        .take(PASSES_PER_TURN)
        .collect();
    for object in &cold {
        state.dirty.remove(object);
    }
    debug_assert!(cold.iter().all(|o| !state.dirty.contains_key(o)), "an object both taken and left dirty");
    if promote.is_empty() && cold.is_empty() {
        return None;
    }
    Some(Work::Objects { key, tiered, promote, cold })
}

/// After a pass over `object` of `pg`: an object whose pass put chunks
/// (evicted by its next pass) or did not finish waits its turn again.
pub fn after_pass(pg: &SharedPg, object: &Bytes, passed: &Result<bool, Stop>, metrics: &Metrics, now: Instant) {
    match passed {
        Ok(false) => return,
        Ok(true) => {}
        Err(stop) => {
            if let Stop::Failed(why) = stop {
                let key = pg.lock().expect("PG lock").key;
                tracing::warn!(pg = key, object = %String::from_utf8_lossy(object), %why, "a deduplication pass failed");
            }
            metrics.dedup_stale_passes.add(1);
        }
    }
    let mut guard = pg.lock().expect("PG lock");
    if let Some(state) = crate::tier::current(&mut guard) {
        state.dirty.entry(object.clone()).or_insert(now);
    }
}

/// The whole of `object` as its primary holds it, read in windows of the
/// largest I/O that all return one guard.
async fn read_object<I: TierIo>(io: &I, pool: u32, tier: &DedupTier, object: &[u8]) -> Result<TierReadReply, Stop> {
    io.gate(tier).await;
    let mut reply = io.tier_read(pool, object, 0, MAX_IO_BYTES).await?;
    if !reply.exists {
        return Err(Stop::Gone);
    }
    while (reply.data.len() as u64) < reply.size {
        let at = reply.data.len() as u64;
        io.gate(tier).await;
        let more = io.tier_read(pool, object, at, MAX_IO_BYTES).await?;
        if more.guard != reply.guard || more.data.is_empty() {
            return Err(Stop::Stale);
        }
        reply.data.extend_from_slice(&more.data);
        reply.entries.extend(more.entries.into_iter().filter(|(k, _)| entry_offset(k).is_some_and(|o| o >= at)));
    }
    reply.entries.sort();
    reply.entries.dedup_by(|a, b| a.0 == b.0);
    // The plan slices these bytes by the size: never past them.
    if reply.data.len() as u64 != reply.size {
        return Err(Stop::Failed(format!("{} bytes read of an object of {}", reply.data.len(), reply.size)));
    }
    Ok(reply)
}

/// Writes back the evicted chunks of `object` at `offsets` (those a
/// client waits to change), in updates of `budget` bytes of chunks
/// ([`promotion_budget`]), or one chunk if it is larger.
pub async fn promote<I: TierIo>(
    io: &I,
    metrics: &Metrics,
    budget: usize,
    pool: u32,
    tiered: &Tiered,
    object: &[u8],
    offsets: &BTreeSet<u64>,
) -> Result<(), Stop> {
    // A writer waits on it: no rate control (a foreground I/O).
    let run = DedupTier { mode: duplex_map::DedupMode::Run, ..tiered.tier };
    // Only the wanted chunks' range (its entries and the object's size),
    // not the whole object: a writer waits.
    let (Some(first), Some(last)) = (offsets.first(), offsets.last()) else { return Ok(()) };
    let span = last.saturating_add(u64::from(tiered.tier.max_chunk_len())) - first;
    let reply = match u32::try_from(span) {
        Ok(len) if len <= MAX_IO_BYTES => {
            io.gate(&run).await;
            let reply = io.tier_read(pool, object, *first, len).await?;
            if !reply.exists {
                return Err(Stop::Gone);
            }
            reply
        }
        _ => read_object(io, pool, &run, object).await?,
    };
    let mut guard = reply.guard;
    let mut actions = Vec::new();
    let mut bytes = 0usize;
    let wanted = entries(&reply)?.into_iter().filter(|(offset, e)| !e.cached && offsets.contains(offset));
    for (offset, entry) in wanted {
        io.gate(&run).await;
        let chunk = read_chunk(io, tiered.tier.chunk_pool, &entry).await?;
        let keep = (entry.len as u64).min(reply.size.saturating_sub(offset)) as usize;
        if !actions.is_empty() && bytes + keep > budget {
            update(io, metrics, pool, object, &mut guard, std::mem::take(&mut actions), &run).await?;
            bytes = 0;
        }
        bytes += keep;
        actions.push(Action::Write { offset, data: chunk[..keep].to_vec() });
        actions.push(Action::SetEntry { key: entry_key(offset), value: ChunkEntry { cached: true, ..entry }.encode() });
        debug_assert!(bytes <= budget.max(keep), "a promotion update past its budget");
    }
    if !actions.is_empty() {
        update(io, metrics, pool, object, &mut guard, actions, &run).await?;
    }
    Ok(())
}

/// One guarded update; `guard` moves on with it (an admitted update
/// moves its object's generation on by one).
async fn update<I: TierIo>(
    io: &I,
    metrics: &Metrics,
    pool: u32,
    object: &[u8],
    guard: &mut Guard,
    actions: Vec<Action>,
    tier: &DedupTier,
) -> Result<(), Stop> {
    debug_assert!(!actions.is_empty() && actions.len() <= duplex_proto::tier::MAX_ACTIONS, "{} actions", actions.len());
    let promotions = actions.iter().filter(|a| matches!(a, Action::Write { .. })).count();
    io.gate(tier).await;
    io.tier_update(pool, object, guard, &actions).await?;
    guard.generation += 1;
    metrics.dedup_promotions.add(promotions as u64);
    Ok(())
}

/// One engine pass over `object`; whether it put chunks (which the next
/// pass evicts). Chunks go in groups of [`CHUNKS_PER_UPDATE`]: their
/// puts, then one guarded update, then the unrefs of what they replaced.
pub async fn pass<I: TierIo>(
    io: &I,
    metrics: &Metrics,
    pool: u32,
    tiered: &Tiered,
    object: &[u8],
) -> Result<bool, Stop> {
    let reply = match read_object(io, pool, &tiered.tier, object).await {
        Err(Stop::Gone) => return Ok(false), // deleted since it was written
        other => other?,
    };
    let entries = entries(&reply)?;
    if object.len() > duplex_dedup::chunkmap::MAX_REFERENCED_NAME {
        return Ok(false); // a name no reference can hold: not deduplicated
    }
    let nonce = loop {
        let nonce = io.random();
        if entries.values().all(|e| e.nonce != nonce) {
            break nonce;
        }
    };
    let data = &reply.data;
    let plan = plan_object(
        reply.size,
        tiered.tier.chunking,
        tiered.tier.chunk_size,
        &entries,
        nonce,
        |offset, len| data[offset as usize..(offset + u64::from(len)) as usize].to_vec(),
        |_| false,
    );
    let steps = plan.steps;
    debug_assert!(
        steps.iter().enumerate().all(|(i, step)| match step {
            // An eviction comes right after its entry says so.
            Step::Evict { offset, .. } => matches!(
                steps[..i].last(),
                Some(Step::SetEntry { offset: o, entry }) if o == offset && !entry.cached
            ),
            // A new entry right after its chunk's put.
            Step::SetEntry { offset, entry } if entry.cached => matches!(
                steps[..i].last(),
                Some(Step::Put { offset: o, nonce, .. }) if o == offset && *nonce == entry.nonce
            ),
            _ => true,
        }),
        "a plan out of order: {steps:?}"
    );
    // An all-zero chunk, cached or never deduplicated, needs no chunk
    // object: it becomes a hole (its blocks freed, if the writer wrote
    // them). An evicted one reads as zeros here and is a hole already.
    let block = duplex_store::BLOCK_SIZE as u64;
    let mut zero: Vec<Action> = plan
        .zero_chunks
        .iter()
        .filter_map(|(offset, len)| {
            let whole_blocks = u64::from(*len) / block * block;
            (whole_blocks > 0).then_some(Action::Zero { offset: *offset, len: whole_blocks })
        })
        .collect();
    let mut guard = reply.guard;
    let mut put_any = false;
    // The steps of each chunk, in order, grouped.
    let mut groups: Vec<Vec<&Step>> = Vec::new();
    for step in &steps {
        let offset = step.offset();
        match groups.last_mut() {
            Some(group) if group[0].offset() == offset => group.push(step),
            _ => groups.push(vec![step]),
        }
    }
    debug_assert!(
        groups.iter().all(|g| g.iter().all(|s| s.offset() == g[0].offset())),
        "a chunk's steps grouped with another's"
    );
    let batches: Vec<&[Vec<&Step>]> = groups.chunks(CHUNKS_PER_UPDATE).collect();
    for (i, batch) in batches.iter().enumerate() {
        let zero = if i + 1 == batches.len() { std::mem::take(&mut zero) } else { Vec::new() };
        put_any |= pass_batch(io, metrics, pool, tiered, object, &mut guard, batch, zero).await?;
    }
    if batches.is_empty() && !zero.is_empty() {
        update(io, metrics, pool, object, &mut guard, zero, &tiered.tier).await?;
    }
    metrics.dedup_passes.add(1);
    Ok(put_any)
}

/// The puts, the update and the unrefs of a pass's chunk groups (and the
/// zeroing of all-zero chunks, with the last).
#[allow(clippy::too_many_arguments)]
async fn pass_batch<I: TierIo>(
    io: &I,
    metrics: &Metrics,
    pool: u32,
    tiered: &Tiered,
    object: &[u8],
    guard: &mut Guard,
    batch: &[Vec<&Step>],
    zero: Vec<Action>,
) -> Result<bool, Stop> {
    let chunk_pool = tiered.tier.chunk_pool;
    let reference = |offset: u64, nonce: u64| {
        Reference { pool, offset, nonce, object: object.to_vec() }.encode().expect("the name fits (checked above)")
    };
    // Put the new chunks; an entry is set only for a reference read back.
    let mut put = Vec::new();
    for step in batch.iter().flatten() {
        if let Step::Put { offset, nonce, fingerprint, data } = step {
            let name = fingerprint.object_name();
            let key = reference(*offset, *nonce);
            let sealed = frame::seal(data, tiered.store.compression, tiered.store.min_saving_permille);
            io.gate(&tiered.tier).await;
            io.chunk_put(chunk_pool, name.as_bytes(), &key, &sealed).await?;
            io.gate(&tiered.tier).await;
            if !io.has_reference(chunk_pool, name.as_bytes(), &key).await? {
                tracing::warn!(chunk = %name, "a chunk's reference set is full; the chunk stays in its object");
                continue;
            }
            metrics.dedup_chunks_put.add(1);
            put.push((*offset, *fingerprint, *nonce));
        }
    }
    let was_put = |offset: u64, entry: &ChunkEntry| {
        !entry.cached || put.iter().any(|(o, f, n)| *o == offset && *f == entry.fingerprint && *n == entry.nonce)
    };
    let mut actions = Vec::new();
    let mut unrefs = Vec::new();
    let mut evicted = 0u64;
    for group in batch {
        for step in group {
            match step {
                Step::Put { .. } => {}
                Step::SetEntry { offset, entry } if was_put(*offset, entry) => {
                    actions.push(Action::SetEntry { key: entry_key(*offset), value: entry.encode() });
                }
                Step::SetEntry { .. } => {}
                Step::RemoveEntry { offset } => actions.push(Action::RemoveEntry { key: entry_key(*offset) }),
                Step::Evict { offset, len } => {
                    actions.push(Action::Zero { offset: *offset, len: u64::from(*len) });
                    evicted += u64::from(*len);
                }
                Step::Unref { offset, nonce, fingerprint } => {
                    // Only once nothing names it: its entry replaced or removed.
                    let replaced = put.iter().any(|(o, _, _)| o == offset)
                        || group.iter().any(|s| matches!(s, Step::RemoveEntry { .. }));
                    if replaced {
                        unrefs.push((*offset, *nonce, *fingerprint));
                    }
                }
            }
        }
    }
    actions.extend(zero);
    let longest = u64::from(tiered.tier.max_chunk_len());
    debug_assert!(
        actions.iter().all(|a| match a {
            Action::SetEntry { value, .. } => ChunkEntry::decode(value).is_some(),
            // (Off the grid, or inside a block, only after a short chunk
            // evicted when the object was smaller: duplex_dedup::cut.)
            Action::Zero { len, .. } => *len <= longest,
            Action::RemoveEntry { key } => entry_offset(key).is_some(),
            Action::Write { .. } => false,
        }),
        "a pass's update holds what a pass changes only: {actions:?}"
    );
    if !actions.is_empty() {
        if let Err(stop) = update(io, metrics, pool, object, guard, actions, &tiered.tier).await {
            // Refused before it was logged: nothing names what this batch
            // put, so its references go now. (An error that leaves it
            // unknown whether the update was logged, a timeout say, leaves
            // them: an entry may name them, and the scrub removes them if
            // none does.)
            if stop == Stop::Stale {
                for (offset, fingerprint, nonce) in &put {
                    let name = fingerprint.object_name();
                    let _ = io.chunk_unref(chunk_pool, name.as_bytes(), &reference(*offset, *nonce)).await;
                }
            }
            return Err(stop);
        }
        metrics.dedup_bytes_evicted.add(evicted);
    }
    debug_assert!(
        unrefs.iter().all(|(offset, nonce, _)| !put.iter().any(|(o, _, n)| o == offset && n == nonce)),
        "a pass unreferences what it put"
    );
    for (offset, nonce, fingerprint) in unrefs {
        io.gate(&tiered.tier).await;
        io.chunk_unref(chunk_pool, fingerprint.object_name().as_bytes(), &reference(offset, nonce)).await?;
    }
    Ok(!put.is_empty())
}

/// A tier read's chunk map, by offset.
fn entries(reply: &TierReadReply) -> Result<BTreeMap<u64, ChunkEntry>, Stop> {
    duplex_dedup::chunkmap::decode_map(&reply.entries).ok_or_else(|| Stop::Failed("a malformed chunk map entry".into()))
}

/// The raw bytes of the chunk `entry` names, checked against its fingerprint.
async fn read_chunk<I: TierIo>(io: &I, chunk_pool: u32, entry: &ChunkEntry) -> Result<Vec<u8>, Stop> {
    let name = entry.fingerprint.object_name();
    let sealed = io.read(chunk_pool, name.as_bytes(), (entry.len as usize + frame::HEADER) as u32).await?;
    let chunk = frame::open(&sealed, &entry.fingerprint).map_err(|e| Stop::Failed(format!("chunk {name}: {e}")))?;
    // (The fingerprint covers the bytes; an entry of another length names another chunk.)
    if chunk.len() != entry.len as usize {
        return Err(Stop::Failed(format!("chunk {name} holds {} bytes, its entry {}", chunk.len(), entry.len)));
    }
    Ok(chunk)
}
