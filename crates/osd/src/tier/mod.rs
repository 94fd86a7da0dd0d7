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
//!   the agent (crate::tier::agent) walks those that have been cold long
//!   enough.
//!
//! A pool without a tier never reaches this module: one test of the
//! pool's tier on the write path (the per-write budget referees it).

pub mod agent;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Instant;

use bytes::Bytes;
use duplex_dedup::chunkmap::{entry_offset, ChunkEntry};
use duplex_proto::osd::{OpKind, OpRequest, Status};
use duplex_proto::tier::{Action, Guard};

use crate::pg::Pg;

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
    /// Objects with evicted chunks a client waits to change.
    pub promote: BTreeSet<Bytes>,
}

impl TierState {
    /// The state of a PG whose store holds `evicted` (the load's walk),
    /// in `interval`; every object in `objects` is dirty (a new primary
    /// does not know which changed since their last pass).
    pub fn loaded(interval: u64, evicted: HashMap<Bytes, BTreeMap<u64, u32>>, objects: Vec<Bytes>) -> TierState {
        let now = Instant::now();
        let dirty = objects.into_iter().map(|o| (o, now)).collect();
        TierState { interval, evicted, generations: HashMap::new(), dirty, promote: BTreeSet::new() }
    }

    pub fn generation(&self, object: &[u8]) -> u64 {
        self.generations.get(object).copied().unwrap_or(0)
    }

    /// The evicted chunks of `object` that overlap `[from, to)`.
    pub fn evicted_in(&self, object: &[u8], from: u64, to: u64) -> Vec<(u64, u32)> {
        let Some(chunks) = self.evicted.get(object) else { return Vec::new() };
        chunks.range(..to).filter(|(offset, len)| **offset + u64::from(**len) > from).map(|(o, l)| (*o, *l)).collect()
    }

    /// How many chunks are evicted (a gauge for `duplex dedup status`).
    pub fn evicted_chunks(&self) -> usize {
        self.evicted.values().map(BTreeMap::len).sum()
    }

    fn changed(&mut self, object: &Bytes) {
        *self.generations.entry(object.clone()).or_insert(0) += 1;
    }
}

/// The tier state of `pg` if it is loaded for the interval the PG serves.
pub fn current(pg: &mut Pg) -> Option<&mut TierState> {
    let interval = pg.active.as_ref()?.interval;
    pg.tier.as_deref_mut().filter(|tier| tier.interval == interval)
}

/// Why a deduplicated pool refuses `request` outright (`None`: it may go
/// on to [`admit`]).
pub fn refuses(request: &OpRequest) -> Option<&'static str> {
    match request.kind {
        _ if request.snap != 0 => Some("snapshots of a deduplicated pool's objects are not supported yet"),
        OpKind::Read => Some("a deduplicated pool's objects are read with TierRead (this client predates the tier)"),
        OpKind::OmapSet | OpKind::OmapRemove | OpKind::OmapRemoveRange => {
            Some("a deduplicated pool's omaps hold its chunk maps; clients do not change them")
        }
        OpKind::CopyUp | OpKind::Diff | OpKind::TrimClone => {
            Some("clones and snapshots of a deduplicated pool's objects are not supported yet")
        }
        _ => None,
    }
}

/// A refusal: the status and why.
pub type Refused = (Status, String);

/// Admits a mutation of a deduplicated PG at its primary, under the PG
/// lock and before its log append: a [`OpKind::TierUpdate`] whose guard
/// still holds (its index changes made), or a client mutation that
/// touches no evicted chunk (the object counted changed and dirty).
pub fn admit(pg: &mut Pg, request: &OpRequest, now: Instant) -> Result<(), Refused> {
    let Some(tier) = current(pg) else {
        return Err((Status::Retry, "the deduplication tier's index of this PG is loading; resend".into()));
    };
    let object = &request.object;
    if request.kind == OpKind::TierUpdate {
        let stale = || (Status::Retry, "the object changed since the engine read it".to_string());
        let (guard, actions) = duplex_proto::tier::split_update(&request.data)
            .map_err(|e| (Status::Invalid, format!("a tier update: {e}")))?;
        if guard != (Guard { interval: tier.interval, generation: tier.generation(object) }) {
            return Err(stale());
        }
        let actions = duplex_proto::tier::decode_actions(actions).expect("split_update decoded them");
        apply_to_index(tier, object, &actions)?;
        tier.changed(object);
        return Ok(());
    }
    let touched = match request.kind {
        OpKind::Write => Some((request.offset, request.offset.saturating_add(request.data.len() as u64))),
        OpKind::Zero => {
            let len = duplex_oplog::zero_length(&request.data).unwrap_or(u64::MAX);
            Some((request.offset, request.offset.saturating_add(len)))
        }
        // Every chunk it cuts or passes: were one left evicted past the
        // end, bytes there would read as the chunk's if the object grew.
        OpKind::Truncate => Some((request.offset, u64::MAX)),
        // (Its chunk map goes with it; the references it held are leaks
        // the tier scrub reclaims.)
        OpKind::Delete => {
            tier.evicted.remove(object);
            None
        }
        _ => None,
    };
    if let Some((from, to)) = touched {
        if !tier.evicted_in(object, from, to).is_empty() {
            tier.promote.insert(object.clone());
            return Err((Status::Retry, "a deduplicated chunk this changes is being brought back; resend".into()));
        }
    }
    tier.changed(object);
    tier.dirty.insert(object.clone(), now);
    Ok(())
}

/// A tier update's changes of the evicted index; refused whole if it
/// would leave an evicted chunk whose bytes it does not zero.
fn apply_to_index(tier: &mut TierState, object: &Bytes, actions: &[Action]) -> Result<(), Refused> {
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
    let chunks = tier.evicted.entry(object.clone()).or_default();
    for offset in keep {
        chunks.remove(&offset);
    }
    chunks.extend(evict);
    if chunks.is_empty() {
        tier.evicted.remove(object);
    }
    Ok(())
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
        TierState::loaded(7, evicted, vec![Bytes::from_static(b"o")])
    }

    fn entry(cached: bool) -> Vec<u8> {
        ChunkEntry { len: 32768, nonce: 1, fingerprint: Fingerprint::of(b"x"), cached }.encode()
    }

    #[test]
    fn the_index_follows_updates_and_refuses_an_eviction_that_keeps_its_bytes() {
        let mut tier = state();
        let object = Bytes::from_static(b"o");
        let evict =
            [Action::SetEntry { key: entry_key(0), value: entry(false) }, Action::Zero { offset: 0, len: 32768 }];
        apply_to_index(&mut tier, &object, &evict).unwrap();
        assert_eq!(tier.evicted_in(b"o", 0, u64::MAX), vec![(0, 32768), (32768, 32768)]);
        assert_eq!(tier.evicted_in(b"o", 32767, 32768), vec![(0, 32768)]);
        let promote = [
            Action::Write { offset: 32768, data: vec![1; 32768] },
            Action::SetEntry { key: entry_key(32768), value: entry(true) },
        ];
        apply_to_index(&mut tier, &object, &promote).unwrap();
        assert_eq!(tier.evicted_in(b"o", 0, u64::MAX), vec![(0, 32768)]);
        let unzeroed = [Action::SetEntry { key: entry_key(65536), value: entry(false) }];
        assert_eq!(apply_to_index(&mut tier, &object, &unzeroed).unwrap_err().0, Status::Invalid);
        let foreign = [Action::SetEntry { key: b"x".to_vec(), value: vec![] }];
        assert!(apply_to_index(&mut tier, &object, &foreign).is_err());
        apply_to_index(&mut tier, &object, &[Action::RemoveEntry { key: entry_key(0) }]).unwrap();
        assert_eq!(tier.evicted_chunks(), 0);
    }
}
