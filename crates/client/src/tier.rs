//! Reading a deduplicated pool (docs/DEDUP.md): a read of a base object
//! is a [`OpKind::TierRead`], which returns the object's bytes with the
//! chunk map entries of the chunks they overlap, read at one moment. A
//! chunk whose entry is not *cached* was evicted: its bytes are in the
//! chunk pool, in the chunk object its fingerprint names, and are read
//! from there (decompressed, and checked against the fingerprint). Chunk
//! objects never change, so the result is the object as it was at the
//! tier read. A chunk object gone by the time it is read (an overwrite
//! and an engine pass came in between) sends the read back to the start.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use duplex_dedup::chunkmap::entry_offset;
use duplex_dedup::{frame, ChunkEntry};
use duplex_proto::osd::OpKind;
use duplex_proto::tier::TierReadReply;

use crate::runtime::{Callback, ObjectOp};
use crate::{Client, ClientError};

/// Tier reads started again at most, when a chunk went from under one.
const RESTARTS: u32 = 8;

/// The evicted chunks of a tier read's reply: offset → entry.
pub fn evicted(reply: &TierReadReply) -> Result<BTreeMap<u64, ChunkEntry>, ClientError> {
    let mut map = duplex_dedup::chunkmap::decode_map(&reply.entries)
        .ok_or_else(|| ClientError::Corrupt("a malformed chunk map entry".into()))?;
    map.retain(|_, entry| !entry.cached);
    Ok(map)
}

/// Starts `read` (a `Read` of a deduplicated pool whose chunks are in
/// `chunk_pool`); `done` gets its bytes.
pub(crate) fn submit_read(client: &Client, read: ObjectOp, chunk_pool: u32, done: Callback) {
    submit_attempt(client.clone(), read, chunk_pool, done, 0);
}

fn submit_attempt(client: Client, read: ObjectOp, chunk_pool: u32, done: Callback, attempt: u32) {
    let tier_read = ObjectOp { kind: OpKind::TierRead, ..read.clone() };
    let again = client.clone();
    client.submit_direct(
        tier_read,
        Box::new(move |result| {
            let reply = match result.and_then(|bytes| {
                TierReadReply::decode(&bytes).map_err(|e| ClientError::Corrupt(format!("tier read reply: {e}")))
            }) {
                Ok(reply) => reply,
                Err(err) => return done(Err(err)),
            };
            if !reply.exists {
                return done(Err(ClientError::NotFound));
            }
            let evicted = match evicted(&reply) {
                Ok(evicted) => evicted,
                Err(err) => return done(Err(err)),
            };
            let (from, data) = (read.offset, reply.data);
            let to = from + data.len() as u64;
            let pieces: Vec<(u64, ChunkEntry)> = evicted
                .into_iter()
                .filter(|(offset, entry)| *offset < to && offset + u64::from(entry.len) > from)
                .collect();
            if pieces.is_empty() {
                return done(Ok(Bytes::from(data)));
            }
            let gather =
                Arc::new(Mutex::new(Gather { data, left: pieces.len(), done: Some(done), gone: false, failed: None }));
            for (offset, entry) in pieces {
                let gather = gather.clone();
                let (again, read) = (again.clone(), read.clone());
                let chunk = ObjectOp {
                    length: (entry.len as usize + frame::HEADER) as u32,
                    ..ObjectOp::new(chunk_pool, OpKind::Read, Bytes::from(entry.fingerprint.object_name()))
                };
                again.clone().submit_direct(
                    chunk,
                    Box::new(move |result| {
                        let mut g = gather.lock().expect("gather lock");
                        match result.and_then(|bytes| {
                            frame::open(&bytes, &entry.fingerprint)
                                .map_err(|e| ClientError::Corrupt(format!("chunk {:?}: {e}", entry.fingerprint)))
                        }) {
                            Ok(chunk) if chunk.len() == entry.len as usize => {
                                // The overlap of the chunk and the read.
                                let a = offset.max(from);
                                let b = (offset + u64::from(entry.len)).min(to);
                                g.data[(a - from) as usize..(b - from) as usize]
                                    .copy_from_slice(&chunk[(a - offset) as usize..(b - offset) as usize]);
                            }
                            Ok(_) => g.failed = Some(ClientError::Corrupt("a chunk of another length".into())),
                            Err(ClientError::NotFound) => g.gone = true,
                            // (The first error is the one told.)
                            Err(err) => {
                                g.failed.get_or_insert(err);
                            }
                        }
                        g.left -= 1;
                        if g.left > 0 {
                            return;
                        }
                        let done = g.done.take().expect("answered once");
                        let data = std::mem::take(&mut g.data);
                        let (gone, failed) = (g.gone, g.failed.take());
                        drop(g);
                        match (failed, gone) {
                            (Some(err), _) => done(Err(err)),
                            (None, false) => done(Ok(Bytes::from(data))),
                            // Gone since the tier read: read the object again.
                            (None, true) if attempt < RESTARTS => {
                                submit_attempt(again, read, chunk_pool, done, attempt + 1)
                            }
                            (None, true) => done(Err(ClientError::Corrupt(
                                "a deduplicated chunk stayed missing: its chunk map names a chunk the chunk pool lacks"
                                    .into(),
                            ))),
                        }
                    }),
                );
            }
        }),
    );
}

struct Gather {
    data: Vec<u8>,
    left: usize,
    done: Option<Callback>,
    /// A chunk object was gone.
    gone: bool,
    failed: Option<ClientError>,
}

/// What a tier scrub found and did ([`scrub`]).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ScrubReport {
    pub chunks: u64,
    /// References of this base pool found on chunk objects.
    pub references: u64,
    /// References no chunk map named, removed (with their chunk, if it
    /// was its last).
    pub leaks_removed: u64,
    /// Leaked references left for the next scrub: their object changed
    /// while the scrub looked.
    pub leaks_busy: u64,
    /// Chunk map entries checked.
    pub entries: u64,
    /// Entries whose chunk object, or their reference on it, is missing:
    /// data the tier lost. Never expected; named for the operator.
    pub missing: Vec<String>,
    /// Chunk objects whose bytes do not open to their fingerprint
    /// (with `deep`).
    pub damaged: Vec<String>,
}

/// The tier scrub of deduplicated pool `pool` (docs/DEDUP.md): every
/// reference of its objects on its chunk pool's objects that no chunk map
/// names is removed, and never one a chunk map names; every chunk map
/// entry is checked to name a chunk object holding its reference; with
/// `deep`, every chunk object's bytes are checked against its name.
///
/// Before it removes a reference, it bumps the object's generation with
/// an empty guarded update: an engine pass that put that reference and
/// has not yet set its entry then finds its guard stale, sets nothing, and
/// takes its own references back. So a reference an entry is about to
/// name is never removed from under it.
pub fn scrub(client: &Client, pool: u32, deep: bool) -> Result<ScrubReport, ClientError> {
    let map = client.map();
    let tier = map
        .pools
        .get(&pool)
        .and_then(|p| p.dedup)
        .ok_or_else(|| ClientError::Invalid(format!("pool {pool} has no deduplication tier")))?;
    let chunk_pool = tier.chunk_pool;
    let mut report = ScrubReport::default();
    for name in client.list_objects(chunk_pool, b"")? {
        let Some(fingerprint) = duplex_dedup::Fingerprint::from_object_name(&name) else {
            report.damaged.push(format!("{} (not a chunk name)", String::from_utf8_lossy(&name)));
            continue;
        };
        report.chunks += 1;
        if deep {
            match client.read(chunk_pool, &name, 0, (frame::MAX_CHUNK + frame::HEADER) as u32) {
                Ok(bytes) if frame::open(&bytes, &fingerprint).is_ok() => {}
                Ok(_) => report.damaged.push(String::from_utf8_lossy(&name).into_owned()),
                Err(ClientError::NotFound) => continue, // its last reference went meanwhile
                Err(err) => return Err(err),
            }
        }
        let references = match client.omap_list_all(chunk_pool, &name) {
            Ok(references) => references,
            Err(ClientError::NotFound) => continue,
            Err(err) => return Err(err),
        };
        for (key, _) in references {
            let Some(reference) = duplex_dedup::Reference::decode(&key) else { continue };
            if reference.pool != pool {
                continue; // another pool's: its own scrub's
            }
            report.references += 1;
            let read = client.tier_read(pool, &reference.object, reference.offset, 1)?;
            let named = read.exists
                && read.entries.iter().any(|(k, v)| {
                    entry_offset(k) == Some(reference.offset)
                        && ChunkEntry::decode(v)
                            .is_some_and(|e| e.fingerprint == fingerprint && e.nonce == reference.nonce)
                });
            if named {
                continue;
            }
            match client.tier_update(pool, &reference.object, &read.guard, &[]) {
                Ok(()) => {
                    client.chunk_unref(chunk_pool, &name, &key)?;
                    report.leaks_removed += 1;
                }
                Err(ClientError::Invalid(why)) if duplex_proto::tier::is_stale(why.as_bytes()) => {
                    report.leaks_busy += 1
                }
                Err(err) => return Err(err),
            }
        }
    }
    for object in client.list_objects(pool, b"")? {
        let entries = match client.omap_list_all(pool, &object) {
            Ok(entries) => entries,
            Err(ClientError::NotFound) => continue,
            Err(err) => return Err(err),
        };
        for (key, value) in entries {
            let (Some(offset), Some(entry)) = (entry_offset(&key), ChunkEntry::decode(&value)) else { continue };
            report.entries += 1;
            let reference = duplex_dedup::Reference { pool, offset, nonce: entry.nonce, object: object.clone() };
            let Some(reference) = reference.encode() else { continue };
            let name = entry.fingerprint.object_name();
            let held = match client.omap_get(chunk_pool, name.as_bytes(), std::slice::from_ref(&reference)) {
                Ok(found) => !found.is_empty(),
                Err(ClientError::NotFound) => false,
                Err(err) => return Err(err),
            };
            if !held {
                // Changed since it was listed? Look once more before naming it.
                let again = client.omap_get(pool, &object, std::slice::from_ref(&key))?;
                if again.first().is_some_and(|(_, v)| *v == value) {
                    report.missing.push(format!("{}@{offset}", String::from_utf8_lossy(&object)));
                }
            }
        }
    }
    Ok(report)
}
