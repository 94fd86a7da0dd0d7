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
    let mut out = BTreeMap::new();
    for (key, value) in &reply.entries {
        let (Some(offset), Some(entry)) = (entry_offset(key), ChunkEntry::decode(value)) else {
            return Err(ClientError::Corrupt("a malformed chunk map entry".into()));
        };
        if !entry.cached {
            out.insert(offset, entry);
        }
    }
    Ok(out)
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
            let gather = Arc::new(Mutex::new(Gather { data, left: pieces.len(), done: Some(done), failed: None }));
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
                            Err(err) => g.failed = Some(err),
                        }
                        g.left -= 1;
                        if g.left > 0 {
                            return;
                        }
                        let done = g.done.take().expect("answered once");
                        let data = std::mem::take(&mut g.data);
                        match g.failed.take() {
                            None => done(Ok(Bytes::from(data))),
                            // Gone since the tier read: read the object again.
                            Some(ClientError::NotFound) if attempt < RESTARTS => {
                                drop(g);
                                submit_attempt(again, read, chunk_pool, done, attempt + 1)
                            }
                            Some(ClientError::NotFound) => done(Err(ClientError::Corrupt(
                                "a deduplicated chunk stayed missing: its chunk map names a chunk the chunk pool lacks"
                                    .into(),
                            ))),
                            Some(err) => done(Err(err)),
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
    failed: Option<ClientError>,
}
