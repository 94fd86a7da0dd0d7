//! The deduplication agent: one thread per OSD that moves the chunks of
//! the deduplicated PGs it is primary of into their chunk pools
//! (docs/DEDUP.md, "The engine"). It talks to the cluster as a client
//! does (`duplex_client`, as Ceph's tiering agent uses its Objecter):
//! chunk objects live in other PGs on other OSDs, and its own PGs'
//! changes go through admission, the log and the replicas like any
//! client's, guarded so that they apply only to the object it read
//! ([`crate::tier`]). An OSD whose map has no deduplicated pool never
//! connects.
//!
//! Per PG, in turn:
//! 1. **Load** the PG's tier index (evicted chunks) from its flusher when
//!    the PG is active here without one; until then its writes wait.
//! 2. **Promote** the objects whose evicted chunks a client waits to
//!    change: read each chunk object, write its bytes back and mark the
//!    entry cached, in one guarded update.
//! 3. **Pass** over dirty objects not written for `dedup_cold_after`
//!    (the hotness rule: an object written recently stays as it is):
//!    tier-read the object, plan ([`duplex_dedup::plan_object`]), put the
//!    new chunks (compressed as their pool says) and read each reference
//!    back, log the entry changes and evictions in one guarded update,
//!    then drop the references of the chunks it replaced.
//!
//! Every I/O of the agent asks the pool's rate control first (§4.4.2).
//! A crash between any two steps leaves at worst a reference no entry
//! names: never an entry whose chunk is missing, since an entry is set
//! only once its reference was read back, and a reference is dropped only
//! after the update that stopped naming it was acknowledged.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::Receiver;
use duplex_client::{Client, ClientConfig, ClientError};
use duplex_dedup::chunkmap::{entry_key, entry_offset, Reference};
use duplex_dedup::plan::{plan_object, Step};
use duplex_dedup::rate::{Allowance, RateControl, Throttle};
use duplex_dedup::{frame, ChunkEntry};
use duplex_map::{ChunkStore, DedupTier, PoolId};
use duplex_proto::osd::MAX_IO_BYTES;
use duplex_proto::tier::{Action, TierReadReply};

use crate::messages::{Job, TierLoad};
use crate::pg::{pool_of, SharedPg};
use crate::shared::Shared;
use crate::tier::TierState;

/// How long the agent sleeps with nothing to do (a write or a wanted
/// index wakes it sooner).
const IDLE: Duration = Duration::from_millis(500);
/// Objects one PG gets passed before the agent moves on to the next.
const PASSES_PER_TURN: usize = 8;
/// Chunks one pass update covers at most (two actions each, well inside
/// `duplex_proto::tier::MAX_ACTIONS`).
const CHUNKS_PER_UPDATE: usize = 1024;
/// Bytes of chunks one promotion update writes back at most (inside one
/// request's `MAX_IO_BYTES`).
const UPDATE_BYTES: usize = 2 << 20;

/// A deduplicated pool as the agent works on it.
#[derive(Clone, Copy)]
struct Tiered {
    tier: DedupTier,
    store: ChunkStore,
}

pub fn run(shared: Arc<Shared>, wake: Receiver<()>) {
    let mut agent = Agent {
        shared,
        client: None,
        connect_failed_at: None,
        throttle: Throttle::default(),
        foreground: (Instant::now(), 0, 0),
        load_failed: HashMap::new(),
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
    throttle: Throttle,
    /// When the foreground rate was last measured, the operations counted
    /// then, and the rate (operations a second).
    foreground: (Instant, u64, u64),
    /// PGs whose index failed to load, and when: tried again after
    /// [`LOAD_RETRY`], not at every turn (each load flushes and walks the PG).
    load_failed: HashMap<u32, Instant>,
}

/// How long a PG whose index failed to load waits for another try.
const LOAD_RETRY: Duration = Duration::from_secs(1);

/// Why a step stopped.
#[derive(Debug)]
enum Stop {
    /// The object changed under the agent, or the PG moved: try later.
    Stale,
    /// The object is gone.
    Gone,
    Failed(String),
}

impl From<ClientError> for Stop {
    fn from(err: ClientError) -> Stop {
        match err {
            ClientError::Invalid(why) if why.contains(duplex_proto::tier::STALE) => Stop::Stale,
            ClientError::NotFound => Stop::Gone,
            err => Stop::Failed(err.to_string()),
        }
    }
}

impl Agent {
    /// One round over the PGs; whether it found work.
    fn turn(&mut self) -> bool {
        let view = self.shared.map.load();
        let tiered: HashMap<PoolId, Tiered> = view
            .map
            .pools
            .values()
            .filter_map(|pool| {
                let tier = pool.dedup?;
                let store = view.map.pools.get(&tier.chunk_pool)?.chunks?;
                Some((pool.id, Tiered { tier, store }))
            })
            .collect();
        if tiered.is_empty() {
            return false;
        }
        let Some(client) = self.client() else { return false };
        let me = self.shared.config.id;
        let cold_after = self.shared.config.dedup_cold_after;
        let mut busy = false;
        for pg in self.shared.pgs.all() {
            let work = {
                let mut guard = pg.lock().expect("PG lock");
                let key = guard.key;
                let Some(tiered) = tiered.get(&pool_of(key)).copied() else { continue };
                let Some(active) = guard.active.as_ref().filter(|a| a.members.first() == Some(&me)) else { continue };
                let interval = active.interval;
                match crate::tier::current(&mut guard) {
                    None if self.load_failed.get(&key).is_some_and(|at| at.elapsed() < LOAD_RETRY) => continue,
                    None => Work::Load { key, interval },
                    Some(state) => {
                        let promote: Vec<(Bytes, BTreeSet<u64>)> =
                            std::mem::take(&mut state.promote).into_iter().collect();
                        let now = Instant::now();
                        let paused = tiered.tier.mode == duplex_map::DedupMode::Pause;
                        let cold: Vec<Bytes> = state
                            .dirty
                            .iter()
                            .filter(|(_, at)| !paused && now >= **at + cold_after)
                            .map(|(object, _)| object.clone())
                            .take(PASSES_PER_TURN)
                            .collect();
                        for object in &cold {
                            state.dirty.remove(object);
                        }
                        if promote.is_empty() && cold.is_empty() {
                            continue;
                        }
                        Work::Objects { key, tiered, promote, cold }
                    }
                }
            };
            busy = true;
            match work {
                Work::Load { key, interval } => self.load(&pg, key, interval),
                Work::Objects { key, tiered, promote, cold } => {
                    let pool = pool_of(key);
                    for (object, offsets) in promote {
                        if let Err(stop) = self.promote(&client, pool, &tiered, &object, &offsets) {
                            tracing::debug!(
                                pg = key,
                                ?stop,
                                "a promotion did not finish; the writer's retry asks again"
                            );
                        }
                    }
                    for object in cold {
                        let passed = self.pass(&client, pool, &tiered, &object);
                        if let Ok(true) = passed {
                            // Chunks it put stay cached one pass: the next evicts them.
                            redirty(&pg, &object);
                        }
                        if let Err(stop) = passed {
                            if let Stop::Failed(why) = &stop {
                                tracing::warn!(pg = key, object = %String::from_utf8_lossy(&object), %why, "a deduplication pass failed");
                            }
                            self.shared.metrics.dedup_stale_passes.add(1);
                            redirty(&pg, &object);
                        }
                    }
                }
            }
        }
        busy
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
        // soon (its PG moving, say) waits for its next turn instead.
        client_config.op_timeout = Duration::from_secs(10);
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

    /// Loads PG `key`'s tier index for `interval` from its flusher.
    fn load(&mut self, pg: &SharedPg, key: u32, interval: u64) {
        let (reply, answer) = crossbeam_channel::bounded(1);
        self.shared.send_job(key, Job::TierLoad(TierLoad { pg: key, reply }));
        let loaded = match answer.recv() {
            Ok(Ok(loaded)) => loaded,
            Ok(Err(err)) => {
                tracing::warn!(pg = key, %err, "loading a deduplicated PG's index failed; trying again shortly");
                self.load_failed.insert(key, Instant::now());
                return;
            }
            Err(_) => return, // the flusher ended: the OSD stops
        };
        let mut guard = pg.lock().expect("PG lock");
        // Only for the interval it was asked in: a newer one loads anew.
        if guard.active.as_ref().is_some_and(|a| a.interval == interval) {
            let evicted: usize = loaded.evicted.values().map(BTreeMap::len).sum();
            tracing::debug!(pg = key, objects = loaded.objects.len(), evicted, "deduplicated PG index loaded");
            guard.tier = Some(Box::new(TierState::loaded(interval, loaded.evicted, loaded.objects)));
            self.load_failed.remove(&key);
        }
    }

    /// Waits until the pool's rate control lets the agent issue one I/O.
    fn gate(&mut self, tier: &DedupTier) {
        let rate = RateControl::new(u64::from(tier.low_watermark), u64::from(tier.high_watermark))
            .unwrap_or(RateControl { low_iops: 0, high_iops: 0 });
        loop {
            let metrics = &self.shared.metrics;
            let ops = metrics.writes.get() + metrics.reads.get();
            let (since, counted, _) = self.foreground;
            let elapsed = since.elapsed();
            if elapsed >= Duration::from_millis(200) {
                let delta = ops.saturating_sub(counted);
                self.throttle.foreground(delta);
                let per_sec = (delta as f64 / elapsed.as_secs_f64()) as u64;
                self.foreground = (Instant::now(), ops, per_sec);
            }
            let allowance = match tier.mode {
                duplex_map::DedupMode::Run => Allowance::Unlimited,
                _ => rate.allowance(self.foreground.2),
            };
            if self.throttle.take(allowance) {
                self.shared.metrics.dedup_ios.add(1);
                return;
            }
            debug_assert!(matches!(allowance, Allowance::OnePer(_)));
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The whole of `object` as its primary holds it, read in windows of
    /// the largest I/O that all return one guard.
    fn read_object(
        &mut self,
        client: &Client,
        pool: u32,
        tier: &DedupTier,
        object: &[u8],
    ) -> Result<TierReadReply, Stop> {
        self.gate(tier);
        let mut reply = client.tier_read(pool, object, 0, MAX_IO_BYTES)?;
        if !reply.exists {
            return Err(Stop::Gone);
        }
        while (reply.data.len() as u64) < reply.size {
            let at = reply.data.len() as u64;
            self.gate(tier);
            let more = client.tier_read(pool, object, at, MAX_IO_BYTES)?;
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
    /// client waits to change), in updates of at most [`UPDATE_BYTES`].
    fn promote(
        &mut self,
        client: &Client,
        pool: u32,
        tiered: &Tiered,
        object: &[u8],
        offsets: &BTreeSet<u64>,
    ) -> Result<(), Stop> {
        // A writer waits on it: no rate control (a foreground I/O).
        let run = DedupTier { mode: duplex_map::DedupMode::Run, ..tiered.tier };
        let reply = self.read_object(client, pool, &run, object)?;
        let mut guard = reply.guard;
        let mut actions = Vec::new();
        let mut bytes = 0usize;
        let wanted = entries(&reply)?.into_iter().filter(|(offset, e)| !e.cached && offsets.contains(offset));
        for (offset, entry) in wanted {
            self.gate(&run);
            let chunk = read_chunk(client, tiered.tier.chunk_pool, &entry)?;
            let keep = (entry.len as u64).min(reply.size.saturating_sub(offset)) as usize;
            bytes += keep;
            actions.push(Action::Write { offset, data: chunk[..keep].to_vec() });
            actions.push(Action::SetEntry {
                key: entry_key(offset),
                value: ChunkEntry { cached: true, ..entry }.encode(),
            });
            debug_assert!(bytes < UPDATE_BYTES + duplex_proto::osd::MAX_CHUNK, "a promotion update past its budget");
            if bytes >= UPDATE_BYTES {
                self.update(client, pool, object, &mut guard, std::mem::take(&mut actions), &run)?;
                bytes = 0;
            }
        }
        if !actions.is_empty() {
            self.update(client, pool, object, &mut guard, actions, &run)?;
        }
        Ok(())
    }

    /// One guarded update; `guard` moves on with it (an admitted update
    /// moves its object's generation on by one).
    fn update(
        &mut self,
        client: &Client,
        pool: u32,
        object: &[u8],
        guard: &mut duplex_proto::tier::Guard,
        actions: Vec<Action>,
        tier: &DedupTier,
    ) -> Result<(), ClientError> {
        debug_assert!(
            !actions.is_empty() && actions.len() <= duplex_proto::tier::MAX_ACTIONS,
            "{} actions",
            actions.len()
        );
        let promotions = actions.iter().filter(|a| matches!(a, Action::Write { .. })).count();
        self.gate(tier);
        client.tier_update(pool, object, guard, &actions)?;
        guard.generation += 1;
        self.shared.metrics.dedup_promotions.add(promotions as u64);
        Ok(())
    }

    /// One engine pass over `object`; whether it put chunks (which the
    /// next pass evicts). Chunks go in groups of [`CHUNKS_PER_UPDATE`]:
    /// their puts, then one guarded update, then the unrefs of what they
    /// replaced.
    fn pass(&mut self, client: &Client, pool: u32, tiered: &Tiered, object: &[u8]) -> Result<bool, Stop> {
        let reply = match self.read_object(client, pool, &tiered.tier, object) {
            Err(Stop::Gone) => return Ok(false), // deleted since it was written
            other => other?,
        };
        let entries = entries(&reply)?;
        if object.len() > duplex_dedup::chunkmap::MAX_REFERENCED_NAME {
            return Ok(false); // a name no reference can hold: not deduplicated
        }
        let nonce = loop {
            let nonce = rand::random::<u64>();
            if entries.values().all(|e| e.nonce != nonce) {
                break nonce;
            }
        };
        let data = &reply.data;
        let steps = plan_object(
            reply.size,
            tiered.tier.chunk_size,
            &entries,
            nonce,
            |offset, len| data[offset as usize..(offset + u64::from(len)) as usize].to_vec(),
            |_| false,
        );
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
        let chunk = u64::from(tiered.tier.chunk_size);
        let mut zero = Vec::new();
        for (i, bytes) in data.chunks(chunk as usize).enumerate() {
            let offset = i as u64 * chunk;
            let whole_blocks = bytes.len() as u64 / duplex_store::BLOCK_SIZE as u64 * duplex_store::BLOCK_SIZE as u64;
            let evicted = entries.get(&offset).is_some_and(|e| !e.cached);
            if whole_blocks > 0 && !evicted && bytes.iter().all(|b| *b == 0) {
                zero.push(Action::Zero { offset, len: whole_blocks });
            }
        }
        let mut guard = reply.guard;
        let mut put_any = false;
        // The steps of each chunk, in order, grouped.
        let mut groups: Vec<Vec<&Step>> = Vec::new();
        for step in &steps {
            let offset = step_offset(step);
            match groups.last_mut() {
                Some(group) if step_offset(group[0]) == offset => group.push(step),
                _ => groups.push(vec![step]),
            }
        }
        debug_assert!(
            groups.iter().all(|g| g.iter().all(|s| step_offset(s) == step_offset(g[0]))),
            "a chunk's steps grouped with another's"
        );
        let batches: Vec<&[Vec<&Step>]> = groups.chunks(CHUNKS_PER_UPDATE).collect();
        for (i, batch) in batches.iter().enumerate() {
            let zero = if i + 1 == batches.len() { std::mem::take(&mut zero) } else { Vec::new() };
            put_any |= self.pass_batch(client, pool, tiered, object, &mut guard, batch, zero)?;
        }
        if batches.is_empty() && !zero.is_empty() {
            self.update(client, pool, object, &mut guard, zero, &tiered.tier)?;
        }
        self.shared.metrics.dedup_passes.add(1);
        Ok(put_any)
    }

    /// The puts, the update and the unrefs of a pass's chunk groups (and
    /// the zeroing of all-zero chunks, with the last).
    #[allow(clippy::too_many_arguments)]
    fn pass_batch(
        &mut self,
        client: &Client,
        pool: u32,
        tiered: &Tiered,
        object: &[u8],
        guard: &mut duplex_proto::tier::Guard,
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
                self.gate(&tiered.tier);
                client.chunk_put(chunk_pool, name.as_bytes(), &key, &sealed)?;
                self.gate(&tiered.tier);
                if client.omap_get(chunk_pool, name.as_bytes(), std::slice::from_ref(&key))?.is_empty() {
                    tracing::warn!(chunk = %name, "a chunk's reference set is full; the chunk stays in its object");
                    continue;
                }
                self.shared.metrics.dedup_chunks_put.add(1);
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
        let chunk = u64::from(tiered.tier.chunk_size);
        debug_assert!(
            actions.iter().all(|a| match a {
                Action::SetEntry { value, .. } => ChunkEntry::decode(value).is_some(),
                Action::Zero { offset, len } => offset % chunk == 0 && *len <= chunk,
                Action::RemoveEntry { key } => entry_offset(key).is_some(),
                Action::Write { .. } => false,
            }),
            "a pass's update holds what a pass changes only: {actions:?}"
        );
        if !actions.is_empty() {
            if let Err(err) = self.update(client, pool, object, guard, actions, &tiered.tier) {
                let stop = Stop::from(err);
                // Refused before it was logged: nothing names what this
                // batch put, so its references go now. (An error that
                // leaves it unknown whether the update was logged, a
                // timeout say, leaves them: an entry may name them, and
                // the scrub removes them if none does.)
                if matches!(stop, Stop::Stale) {
                    for (offset, fingerprint, nonce) in &put {
                        let name = fingerprint.object_name();
                        let _ = client.chunk_unref(chunk_pool, name.as_bytes(), &reference(*offset, *nonce));
                    }
                }
                return Err(stop);
            }
            self.shared.metrics.dedup_bytes_evicted.add(evicted);
        }
        debug_assert!(
            unrefs.iter().all(|(offset, nonce, _)| !put.iter().any(|(o, _, n)| o == offset && n == nonce)),
            "a pass unreferences what it put"
        );
        for (offset, nonce, fingerprint) in unrefs {
            self.gate(&tiered.tier);
            client.chunk_unref(chunk_pool, fingerprint.object_name().as_bytes(), &reference(offset, nonce))?;
        }
        Ok(!put.is_empty())
    }
}

/// The chunk a plan's step is about.
fn step_offset(step: &Step) -> u64 {
    match step {
        Step::Put { offset, .. }
        | Step::SetEntry { offset, .. }
        | Step::RemoveEntry { offset }
        | Step::Unref { offset, .. }
        | Step::Evict { offset, .. } => *offset,
    }
}

enum Work {
    Load { key: u32, interval: u64 },
    Objects { key: u32, tiered: Tiered, promote: Vec<(Bytes, BTreeSet<u64>)>, cold: Vec<Bytes> },
}

/// A pass that did not finish: the object waits its turn again.
fn redirty(pg: &SharedPg, object: &Bytes) {
    let mut guard = pg.lock().expect("PG lock");
    if let Some(state) = crate::tier::current(&mut guard) {
        state.dirty.entry(object.clone()).or_insert_with(Instant::now);
    }
}

/// A tier read's chunk map, by offset.
fn entries(reply: &TierReadReply) -> Result<BTreeMap<u64, ChunkEntry>, Stop> {
    duplex_dedup::chunkmap::decode_map(&reply.entries).ok_or_else(|| Stop::Failed("a malformed chunk map entry".into()))
}

/// The raw bytes of the chunk `entry` names, checked against its fingerprint.
fn read_chunk(client: &Client, chunk_pool: u32, entry: &ChunkEntry) -> Result<Vec<u8>, Stop> {
    let name = entry.fingerprint.object_name();
    let sealed = client.read(chunk_pool, name.as_bytes(), 0, (entry.len as usize + frame::HEADER) as u32)?;
    let chunk = frame::open(&sealed, &entry.fingerprint).map_err(|e| Stop::Failed(format!("chunk {name}: {e}")))?;
    // (The fingerprint covers the bytes; an entry of another length names another chunk.)
    if chunk.len() != entry.len as usize {
        return Err(Stop::Failed(format!("chunk {name} holds {} bytes, its entry {}", chunk.len(), entry.len)));
    }
    Ok(chunk)
}
