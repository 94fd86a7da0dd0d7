//! The index cache: which objects have entries in a PG's log, and reading
//! from the log when it covers a range (R1 in DESIGN.md §5).

use std::collections::HashMap;

use crate::entry::{Entry, EntryRef, OpKind};
use crate::log::PgLog;
use crate::region::Region;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IndexEntry {
    seq: u64,
    op: OpKind,
    offset: u64,
    len: u64,
    log_offset: u64,
}

/// Per object, every live log entry, oldest first (none are overwritten).
#[derive(Default, Debug)]
pub struct IndexCache {
    objects: HashMap<Vec<u8>, Vec<IndexEntry>>,
}

impl IndexCache {
    pub fn insert(&mut self, entry: &Entry, log_offset: u64) {
        self.insert_ref(&entry.as_ref(), log_offset);
    }

    pub fn insert_ref(&mut self, entry: &EntryRef<'_>, log_offset: u64) {
        let item =
            IndexEntry { seq: entry.seq, op: entry.op, offset: entry.offset, len: entry.data.len() as u64, log_offset };
        let list = match self.objects.get_mut(entry.object) {
            Some(list) => list,
            None => self.objects.entry(entry.object.to_vec()).or_default(),
        };
        debug_assert!(list.last().is_none_or(|last| last.seq < entry.seq), "index entries out of order");
        list.push(item);
    }

    /// Forgets entries with seq <= `through` (trimmed from the log).
    pub fn trim(&mut self, through: u64) {
        self.objects.retain(|_, list| {
            list.retain(|e| e.seq > through);
            !list.is_empty()
        });
    }

    /// Forgets entries with seq > `after` (rolled back from the log).
    pub fn truncate_after(&mut self, after: u64) {
        self.objects.retain(|_, list| {
            list.retain(|e| e.seq <= after);
            !list.is_empty()
        });
    }

    /// Where `object`'s live entries lie in the log, oldest first.
    pub fn log_offsets<'a>(&'a self, object: &[u8]) -> impl Iterator<Item = u64> + 'a {
        self.objects.get(object).into_iter().flatten().map(|e| e.log_offset)
    }

    /// The objects with live entries, in no order.
    pub fn objects(&self) -> impl Iterator<Item = &[u8]> {
        self.objects.keys().map(Vec::as_slice)
    }

    pub fn contains(&self, object: &[u8]) -> bool {
        self.objects.contains_key(object)
    }

    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// `len` bytes of `object` from `offset`, if the log alone determines
    /// them all: newer writes win, and a truncate or delete hides what came
    /// before it. `None`: the store is needed (R2 or R3).
    pub fn read<R: Region>(&self, log: &PgLog<R>, object: &[u8], offset: u64, len: u64) -> Option<Vec<u8>> {
        let list = self.objects.get(object)?;
        let end = offset.checked_add(len)?;
        // Byte ranges [from, to) of the request not yet filled; few, since writes are ranges.
        let mut missing = if len == 0 { Vec::new() } else { vec![(offset, end)] };
        let mut out = Vec::new();
        for item in list.iter().rev() {
            if missing.is_empty() {
                break;
            }
            match item.op {
                OpKind::Write => {
                    let (start, stop) = (item.offset, item.offset + item.len);
                    if !missing.iter().any(|(from, to)| *from < stop && start < *to) {
                        continue;
                    }
                    let entry = log.entry_at(item.log_offset)?;
                    // The slot must still hold the entry the index points at.
                    if entry.seq != item.seq {
                        return None;
                    }
                    if out.is_empty() {
                        out = vec![0u8; len as usize];
                    }
                    let mut rest = Vec::with_capacity(missing.len() + 1);
                    for (from, to) in missing {
                        let (a, b) = (from.max(start), to.min(stop));
                        if a >= b {
                            rest.push((from, to));
                            continue;
                        }
                        debug_assert!(offset <= a && b <= end, "filled {a}..{b} outside the read {offset}..{end}");
                        out[(a - offset) as usize..(b - offset) as usize]
                            .copy_from_slice(&entry.data[(a - start) as usize..(b - start) as usize]);
                        if from < a {
                            rest.push((from, a));
                        }
                        if b < to {
                            rest.push((b, to));
                        }
                    }
                    missing = rest;
                }
                // Older data may live in the store below these: only what
                // newer writes cover is known without it.
                // (A zero reads as zeros only where the object reaches,
                // which the store knows.)
                // (A copy-up's bytes count only if the store lacked the object.)
                // (A chunk put's bytes too; an unref may delete.)
                // (An elided write's effect is not here at all: the
                // store gets it from a backfill's copy.)
                OpKind::Truncate
                | OpKind::Delete
                | OpKind::CreatePreallocated
                | OpKind::Zero
                | OpKind::CopyUp
                | OpKind::ChunkPut
                | OpKind::ChunkUnref
                | OpKind::TierUpdate
                | OpKind::Elided => break,
                // Attributes and omaps are not data.
                OpKind::SetAttr | OpKind::RemoveAttr => {}
                OpKind::OmapSet | OpKind::OmapRemove | OpKind::OmapRemoveRange => {}
            }
        }
        debug_assert!(missing.is_empty() || out.is_empty() || out.len() as u64 == len);
        missing.is_empty().then_some(out)
    }
}
