//! One engine pass over one base object (docs/DEDUP.md, "The engine"),
//! as a list of steps the OSD carries out in order. The order is the crash
//! safety: a chunk map entry is set only after its chunk is put, a chunk
//! is unreferenced only after no entry names it, and eviction marks the
//! entry before the bytes go. Stopping after any step leaves at worst a
//! reference no entry names (a leak the tier scrub reclaims).

use std::collections::BTreeMap;

use duplex_map::Chunking;

use crate::chunkmap::ChunkEntry;
use crate::Fingerprint;

/// What to do, in the order given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Put the chunk at `offset` (its bytes) into the chunk pool with this
    /// object's reference at that offset. Its answer comes once it is
    /// logged; the store may yet drop the reference (a chunk object whose
    /// reference set is full: the flusher drops an omap set past its
    /// object's total, loudly), so before the `SetEntry` that follows, the
    /// engine reads the reference back, and sets no entry without it.
    Put { offset: u64, nonce: u64, fingerprint: Fingerprint, data: Vec<u8> },
    /// Set the chunk map entry at `offset`.
    SetEntry { offset: u64, entry: ChunkEntry },
    /// Remove the chunk map entry at `offset`.
    RemoveEntry { offset: u64 },
    /// Drop this object's reference at `offset` of pass `nonce` from the
    /// chunk object of `fingerprint` (it goes with its last reference).
    Unref { offset: u64, nonce: u64, fingerprint: Fingerprint },
    /// Zero the base object's `offset..offset + len`: its chunk lives in
    /// the chunk pool only (after a `SetEntry` with `cached: false`).
    Evict { offset: u64, len: u32 },
}

impl Step {
    /// The offset of the chunk the step is about.
    pub fn offset(&self) -> u64 {
        match self {
            Step::Put { offset, .. }
            | Step::SetEntry { offset, .. }
            | Step::RemoveEntry { offset }
            | Step::Unref { offset, .. }
            | Step::Evict { offset, .. } => *offset,
        }
    }
}

/// A pass's plan over one object.
#[derive(Debug)]
pub struct Plan {
    /// What to do, grouped by chunk offset, in offset order.
    pub steps: Vec<Step>,
    /// The all-zero chunks it cut, `(offset, length)`: they need no chunk
    /// object, and the engine makes them holes.
    pub zero_chunks: Vec<(u64, u32)>,
}

/// The steps that bring an object of `size` bytes, whose chunk map is
/// `entries` (offset → entry), level with its bytes, chunk by chunk, cut
/// by `chunking` into `chunk_size` chunks ([`crate::cut`]).
/// `cached_bytes(offset, len)` reads the base object's bytes of a cached
/// region; `is_hot(offset)` says whether the chunk there should stay
/// cached. The chunks it puts carry references of pass `nonce` (one the
/// object's chunk map does not hold yet: each pass draws its own).
///
/// - Evicted chunks stay as they are: their bytes are in the chunk pool.
///   The regions between them (and after the last) are cut afresh; a cut
///   starts at a region's start, so a layout the rule made is cut the
///   same way again.
/// - A chunk whose bytes hash to the entry at its offset (of its length)
///   is clean; a cold one is evicted.
/// - A new or changed chunk is put, its entry set (cached), and the old
///   chunk it replaced unreferenced.
/// - An all-zero chunk needs no chunk object: its entry (if any) goes, and
///   so does the reference.
/// - Any other cached entry (one at or past the object's end after a
///   truncate, or one of a layout the bytes no longer cut to) goes with
///   its reference. (A truncate marks every entry it cuts or passes
///   cached, writing back the part of an evicted chunk it keeps: bytes
///   past an object's end read as zeros, never as a chunk's.)
///
/// The steps come grouped by chunk offset, in offset order.
pub fn plan_object(
    size: u64,
    chunking: Chunking,
    chunk_size: u32,
    entries: &BTreeMap<u64, ChunkEntry>,
    nonce: u64,
    mut cached_bytes: impl FnMut(u64, u32) -> Vec<u8>,
    is_hot: impl Fn(u64) -> bool,
) -> Plan {
    assert!(chunk_size > 0, "chunks of no bytes");
    let mut zero_chunks = Vec::new();
    let mut groups: BTreeMap<u64, Vec<Step>> = BTreeMap::new();
    let mut cuts = std::collections::BTreeSet::new();
    for (from, to) in cached_regions(size, entries) {
        let len = u32::try_from(to - from).expect("an object region over 4 GiB");
        let bytes = cached_bytes(from, len);
        debug_assert_eq!(bytes.len(), len as usize, "a region read of another length");
        for (offset, len) in crate::cut::cut(chunking, chunk_size, from, &bytes) {
            cuts.insert(offset);
            let data = bytes[(offset - from) as usize..(offset - from) as usize + len as usize].to_vec();
            let zero = data.iter().all(|b| *b == 0);
            if zero {
                zero_chunks.push((offset, len));
            }
            let steps = plan_chunk(offset, len, data, zero, entries.get(&offset), nonce, &is_hot);
            if !steps.is_empty() {
                groups.insert(offset, steps);
            }
        }
    }
    // Cached entries no cut starts at (a layout the bytes no longer make),
    // and any entry past the end.
    for (offset, old) in entries.iter().filter(|(o, e)| (e.cached && !cuts.contains(*o)) || **o >= size) {
        let steps = vec![
            Step::RemoveEntry { offset: *offset },
            Step::Unref { offset: *offset, nonce: old.nonce, fingerprint: old.fingerprint },
        ];
        debug_assert!(!groups.contains_key(offset), "two groups at {offset}");
        groups.insert(*offset, steps);
    }
    let steps: Vec<Step> = groups.into_values().flatten().collect();
    debug_assert!(steps.windows(2).all(|w| w[0].offset() <= w[1].offset()), "a plan out of offset order");
    Plan { steps, zero_chunks }
}

/// The regions `[from, to)` of an object of `size` bytes that its evicted
/// chunks (in `entries`) leave: what a pass cuts afresh.
pub fn cached_regions(size: u64, entries: &BTreeMap<u64, ChunkEntry>) -> Vec<(u64, u64)> {
    let mut regions = Vec::new();
    let mut at = 0u64;
    for (offset, entry) in entries.range(..size).filter(|(_, e)| !e.cached) {
        debug_assert!(*offset >= at, "evicted chunks overlap at {offset}");
        debug_assert!(offset + u64::from(entry.len) <= size, "an evicted chunk past the object's end");
        if *offset > at {
            regions.push((at, *offset));
        }
        at = offset + u64::from(entry.len);
    }
    if at < size {
        regions.push((at, size));
    }
    regions
}

/// The steps of the cut chunk at `offset` (`data`, `len` bytes, all
/// `zero` or not), whose entry there was `entry`.
fn plan_chunk(
    offset: u64,
    len: u32,
    data: Vec<u8>,
    zero: bool,
    entry: Option<&ChunkEntry>,
    nonce: u64,
    is_hot: &impl Fn(u64) -> bool,
) -> Vec<Step> {
    debug_assert!(entry.is_none_or(|e| e.cached), "a cut over an evicted chunk at {offset}");
    let mut steps = Vec::new();
    let fingerprint = Fingerprint::of(&data);
    match entry {
        _ if zero => {
            if let Some(old) = entry {
                steps.push(Step::RemoveEntry { offset });
                steps.push(Step::Unref { offset, nonce: old.nonce, fingerprint: old.fingerprint });
            }
        }
        Some(old) if old.fingerprint == fingerprint && old.len == len => {
            if !is_hot(offset) {
                let entry = ChunkEntry { cached: false, ..*old };
                steps.push(Step::SetEntry { offset, entry });
                steps.push(Step::Evict { offset, len });
            }
        }
        _ => {
            debug_assert!(entry.is_none_or(|old| old.nonce != nonce), "a pass's nonce reused");
            steps.push(Step::Put { offset, nonce, fingerprint, data });
            steps.push(Step::SetEntry { offset, entry: ChunkEntry { len, nonce, fingerprint, cached: true } });
            if let Some(old) = entry {
                // (Even for the same bytes: the new entry names the new
                // pass's reference.)
                steps.push(Step::Unref { offset, nonce: old.nonce, fingerprint: old.fingerprint });
            }
        }
    }
    steps
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::{BTreeSet, HashMap};

    const CHUNK: u32 = 64;

    /// A chunk's references: (offset, nonce).
    type References = BTreeSet<(u64, u64)>;

    /// A base object, its chunk map, and the chunk pool (fingerprint →
    /// bytes and references), as the OSD would hold them.
    #[derive(Default, Clone)]
    struct Tier {
        chunking: Chunking,
        chunk: u32,
        data: Vec<u8>,
        entries: BTreeMap<u64, ChunkEntry>,
        chunks: HashMap<Fingerprint, (Vec<u8>, References)>,
        passes: u64,
    }

    impl Tier {
        /// What a client reads: cached bytes, or the chunk object's.
        fn read(&self) -> Vec<u8> {
            let mut out = self.data.clone();
            for (offset, entry) in &self.entries {
                if !entry.cached {
                    let (bytes, _) = &self.chunks[&entry.fingerprint];
                    let at = *offset as usize;
                    out[at..at + entry.len as usize].copy_from_slice(&bytes[..entry.len as usize]);
                }
            }
            out
        }

        fn run(&mut self, steps: &[Step]) {
            for step in steps {
                match step {
                    Step::Put { offset, nonce, fingerprint, data } => {
                        assert_eq!(Fingerprint::of(data), *fingerprint);
                        self.chunks
                            .entry(*fingerprint)
                            .or_insert_with(|| (data.clone(), BTreeSet::new()))
                            .1
                            .insert((*offset, *nonce));
                    }
                    Step::SetEntry { offset, entry } => {
                        let (bytes, refs) = &self.chunks[&entry.fingerprint];
                        assert!(refs.contains(&(*offset, entry.nonce)), "an entry set before its chunk's reference");
                        assert!(bytes.len() >= entry.len as usize);
                        self.entries.insert(*offset, *entry);
                    }
                    Step::RemoveEntry { offset } => {
                        self.entries.remove(offset);
                    }
                    Step::Unref { offset, nonce, fingerprint } => {
                        assert!(
                            self.entries.get(offset).is_none_or(|e| e.fingerprint != *fingerprint || e.nonce != *nonce),
                            "a chunk unreferenced while an entry names it"
                        );
                        let (_, refs) = self.chunks.get_mut(fingerprint).expect("unref of a missing chunk");
                        refs.remove(&(*offset, *nonce));
                        if refs.is_empty() {
                            self.chunks.remove(fingerprint);
                        }
                    }
                    Step::Evict { offset, len } => {
                        assert!(!self.entries[offset].cached, "bytes evicted before the entry says so");
                        self.data[*offset as usize..(*offset + u64::from(*len)) as usize].fill(0);
                    }
                }
            }
        }

        /// Every entry's chunk exists and holds this object's reference at
        /// that offset; every reference is an entry's (no leak).
        fn check(&self) {
            let ends: Vec<(u64, u64)> = self.entries.iter().map(|(o, e)| (*o, o + u64::from(e.len))).collect();
            assert!(ends.windows(2).all(|w| w[0].1 <= w[1].0), "entries overlap: {ends:?}");
            assert!(ends.last().is_none_or(|(_, end)| *end <= self.data.len() as u64), "an entry past the end");
            let mut named = BTreeSet::new();
            for (offset, entry) in &self.entries {
                let (_, refs) = self.chunks.get(&entry.fingerprint).expect("an entry names a missing chunk");
                assert!(refs.contains(&(*offset, entry.nonce)));
                named.insert((entry.fingerprint, (*offset, entry.nonce)));
            }
            let held: BTreeSet<(Fingerprint, (u64, u64))> =
                self.chunks.iter().flat_map(|(f, (_, refs))| refs.iter().map(|o| (*f, *o))).collect();
            assert_eq!(held, named, "references and entries differ");
        }

        fn plan(&mut self, hot: &BTreeSet<u64>) -> Vec<Step> {
            self.passes += 1;
            plan_object(
                self.data.len() as u64,
                self.chunking,
                self.chunk,
                &self.entries,
                self.passes,
                |offset, len| self.data[offset as usize..(offset + u64::from(len)) as usize].to_vec(),
                |offset| hot.contains(&offset),
            )
            .steps
        }
    }

    /// A client change to the base object, as the write path makes it:
    /// an evicted chunk it touches is promoted first (its bytes written
    /// back, its entry cached again).
    fn promote(tier: &mut Tier, from: u64, to: u64) {
        let touched: Vec<u64> =
            tier.entries.range(..to).filter(|(o, e)| *o + u64::from(e.len) > from).map(|(o, _)| *o).collect();
        for offset in touched {
            let entry = tier.entries[&offset];
            if !entry.cached {
                let (bytes, _) = &tier.chunks[&entry.fingerprint];
                let at = offset as usize;
                // Only what lies inside the object (a truncate keeps a prefix).
                let keep = (entry.len as usize).min(tier.data.len().saturating_sub(at));
                tier.data[at..at + keep].copy_from_slice(&bytes[..keep]);
                tier.entries.insert(offset, ChunkEntry { cached: true, ..entry });
            }
        }
    }

    #[derive(Clone, Debug)]
    enum Change {
        Write { offset: u16, len: u16, fill: u8 },
        Truncate { size: u16 },
        Pass { hot: Vec<u16> },
    }

    fn change() -> impl Strategy<Value = Change> {
        prop_oneof![
            (0u16..1200, 1u16..300, 0u8..4).prop_map(|(offset, len, fill)| Change::Write { offset, len, fill }),
            (0u16..1500).prop_map(|size| Change::Truncate { size }),
            proptest::collection::vec(0u16..24, 0..6).prop_map(|hot| Change::Pass { hot }),
        ]
    }

    proptest! {
        /// Writes, truncates and engine passes in any order: a client reads
        /// what it wrote, every entry's chunk is there with its reference,
        /// no two entries overlap, and nothing leaks. Fills of 0..4 make
        /// chunks repeat (dedup hits) and some all-zero. Content-defined
        /// chunks (of 16 KiB on average, cut on 4 KiB blocks) see the same
        /// changes at a larger scale.
        #[test]
        fn passes_keep_reads_and_references_whole(
            changes in proptest::collection::vec(change(), 1..40),
            content in any::<bool>(),
        ) {
            let (chunking, chunk, scale) =
                if content { (Chunking::Content, 16384, 97u64) } else { (Chunking::Fixed, CHUNK, 1) };
            let mut tier = Tier { chunking, chunk, ..Tier::default() };
            let mut model: Vec<u8> = Vec::new();
            for change in changes {
                match change {
                    Change::Write { offset, len, fill } => {
                        let (from, to) = (u64::from(offset) * scale, (u64::from(offset) + u64::from(len)) * scale);
                        promote(&mut tier, from, to);
                        if tier.data.len() < to as usize {
                            tier.data.resize(to as usize, 0);
                            model.resize(to as usize, 0);
                        }
                        tier.data[from as usize..to as usize].fill(fill);
                        model[from as usize..to as usize].fill(fill);
                    }
                    Change::Truncate { size } => {
                        // The write path: every entry the truncate cuts or
                        // passes becomes cached (the kept part of an evicted
                        // one written back), so that bytes past the end read
                        // as zeros if the object grows again.
                        let size = u64::from(size) * scale;
                        promote(&mut tier, size, u64::MAX);
                        tier.data.resize(size as usize, 0);
                        model.resize(size as usize, 0);
                    }
                    Change::Pass { hot } => {
                        let hot: BTreeSet<u64> = hot.into_iter().map(|c| u64::from(c) * u64::from(CHUNK)).collect();
                        let steps = tier.plan(&hot);
                        prop_assert!(steps.windows(2).all(|w| w[0].offset() <= w[1].offset()), "{steps:?}");
                        tier.run(&steps);
                        tier.check();
                        // A second pass at once only evicts what the first
                        // put (a fresh chunk stays cached one pass); a
                        // third finds nothing.
                        let again = tier.plan(&hot);
                        prop_assert!(
                            again.iter().all(|s| matches!(s, Step::Evict { .. } | Step::SetEntry { entry: ChunkEntry { cached: false, .. }, .. })),
                            "a pass left work: {again:?}"
                        );
                        tier.run(&again);
                        tier.check();
                        let third = tier.plan(&hot);
                        prop_assert!(third.is_empty(), "two passes left work: {third:?}");
                    }
                }
                prop_assert_eq!(tier.read(), model.clone());
            }
        }
    }

    #[test]
    fn equal_chunks_share_one_chunk_object_and_zero_chunks_none() {
        let mut tier = Tier { chunk: CHUNK, ..Tier::default() };
        let mut data = vec![7u8; CHUNK as usize * 3];
        data.extend(vec![0u8; CHUNK as usize]);
        tier.data = data;
        let steps = tier.plan(&BTreeSet::new());
        let puts = steps.iter().filter(|s| matches!(s, Step::Put { .. })).count();
        assert_eq!(puts, 3, "each chunk is put (with its own reference)");
        tier.run(&steps);
        assert_eq!(tier.chunks.len(), 1, "three equal chunks, one chunk object");
        assert_eq!(tier.chunks.values().next().unwrap().1.len(), 3, "with three references");
        assert!(!tier.entries.contains_key(&(u64::from(CHUNK) * 3)), "a zero chunk has no entry");
        // Cold on the next pass: evicted, the bytes still read back.
        let steps = tier.plan(&BTreeSet::new());
        assert!(steps.iter().all(|s| matches!(s, Step::SetEntry { .. } | Step::Evict { .. })), "{steps:?}");
        tier.run(&steps);
        assert!(tier.data.iter().all(|b| *b == 0), "every chunk evicted");
        assert_eq!(&tier.read()[..CHUNK as usize * 3], &vec![7u8; CHUNK as usize * 3][..]);
    }
}
