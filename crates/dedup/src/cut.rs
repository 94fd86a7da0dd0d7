//! Where an object's chunks begin (docs/DEDUP.md, "Chunking").
//!
//! **Fixed**: every `chunk_size` bytes from the region's start.
//!
//! **Content**: on 4 KiB block boundaries, so that an evicted chunk still
//! frees whole store blocks (a `Zero` frees blocks, not bytes), chosen by
//! the blocks' contents, so that bytes shifted by whole blocks (a file
//! inserted before them in one VM image and not in another) are cut the
//! same way and meet their twins. A chunk of average size A ends after a
//! block whose CRC-32 has its low log2(A / 8 KiB) bits all set, once it
//! holds A/2, and at 3A/2 at the latest. bench/dedup_dataset.py counts
//! the ideal ratio with the same rule (zlib's CRC-32 is this one), so
//! the engine's result can be checked against it.
//!
//! The engine cuts the object's *cached* regions only (between evicted
//! chunks, which stay as they are), one object at a time.

use duplex_map::Chunking;

/// The unit content-defined cuts fall on: the store's block.
pub const BLOCK: usize = 4096;

/// The chunks, `(offset, length)`, that cover `bytes`, the object's bytes
/// from `start`, cut by `chunking` into chunks of `chunk_size` (on
/// average, by content). In order, touching, none empty, none longer than
/// `DedupTier::max_chunk_len`. Both rules count from the object's start,
/// not the region's: a region that starts off the grid or inside a block
/// (after a short chunk evicted when the object was smaller) ends its
/// first chunk on the grid, or cuts on the object's blocks, so that the
/// rest lines up with other objects' chunks as if it had started there.
pub fn cut(chunking: Chunking, chunk_size: u32, start: u64, bytes: &[u8]) -> Vec<(u64, u32)> {
    assert!(chunk_size > 0, "chunks of no bytes");
    assert!(chunking == Chunking::Fixed || chunk_size as usize >= 2 * BLOCK, "content chunks of {chunk_size} bytes");
    let pieces = match chunking {
        Chunking::Fixed => fixed(u64::from(chunk_size), start, bytes.len()),
        Chunking::Content => by_content(chunk_size as usize, start, bytes),
    };
    let cuts: Vec<(u64, u32)> = pieces.into_iter().map(|(at, len)| (start + at as u64, len as u32)).collect();
    debug_assert!(cuts.iter().all(|(_, len)| *len > 0), "an empty chunk");
    debug_assert!(cuts.windows(2).all(|w| w[0].0 + u64::from(w[0].1) == w[1].0), "chunks that do not touch");
    debug_assert_eq!(cuts.iter().map(|(_, len)| *len as usize).sum::<usize>(), bytes.len(), "chunks that miss bytes");
    cuts
}

/// Pieces of `len` bytes from object offset `start`, ending on multiples
/// of `chunk`.
fn fixed(chunk: u64, start: u64, len: usize) -> Vec<(usize, usize)> {
    let mut pieces = Vec::with_capacity(len / chunk as usize + 2);
    let mut at = 0usize;
    while at < len {
        let to_grid = (chunk - (start + at as u64) % chunk) as usize;
        let piece = to_grid.min(len - at);
        pieces.push((at, piece));
        at += piece;
    }
    pieces
}

/// Pieces of `bytes` (from object offset `start`) cut after blocks of the
/// object (the first one partial if `start` is inside a block).
fn by_content(average: usize, start: u64, bytes: &[u8]) -> Vec<(usize, usize)> {
    let least = average / 2 / BLOCK;
    let most = average / 2 * 3 / BLOCK;
    // (least is a power of two: average is, and at least two blocks.)
    let mask = (1u32 << least.trailing_zeros()) - 1;
    let mut cuts = Vec::with_capacity(bytes.len() / average + 1);
    let (mut first, mut held, mut at) = (0usize, 0usize, 0usize);
    let head = (BLOCK - (start % BLOCK as u64) as usize) % BLOCK;
    while at < bytes.len() {
        let end = if at == 0 && head > 0 { head } else { at + BLOCK };
        if end > bytes.len() {
            break; // a partial last block: the tail
        }
        held += 1;
        if held >= most || (held >= least && crc32fast::hash(&bytes[at..end]) & mask == mask) {
            cuts.push((first, end - first));
            (first, held) = (end, 0);
        }
        at = end;
    }
    if first < bytes.len() {
        cuts.push((first, bytes.len() - first));
    }
    cuts
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn blocks(seeds: &[u64]) -> Vec<u8> {
        let mut out = Vec::with_capacity(seeds.len() * BLOCK);
        for seed in seeds {
            let mut word = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            for _ in 0..BLOCK / 8 {
                word ^= word << 13;
                word ^= word >> 7;
                word ^= word << 17;
                out.extend_from_slice(&word.to_le_bytes());
            }
        }
        out
    }

    #[test]
    fn fixed_chunks_follow_the_object_s_grid() {
        assert_eq!(
            cut(Chunking::Fixed, 16384, 32768, &[1; 40000]),
            vec![(32768, 16384), (49152, 16384), (65536, 7232)]
        );
        assert_eq!(cut(Chunking::Fixed, 16384, 64, &[1; 20000]), vec![(64, 16320), (16384, 3680)]);
        assert!(cut(Chunking::Fixed, 16384, 0, &[]).is_empty());
    }

    /// A region that starts inside a block cuts on the object's blocks:
    /// past its first partial block, the cuts meet those of the whole.
    #[test]
    fn content_cuts_count_the_object_s_blocks() {
        let data = blocks(&(0..64).collect::<Vec<_>>());
        let ends = |cuts: Vec<(u64, u32)>| -> Vec<u64> { cuts.iter().map(|(at, len)| at + u64::from(*len)).collect() };
        let whole = ends(cut(Chunking::Content, 16384, 0, &data));
        let from_inside = ends(cut(Chunking::Content, 16384, 100, &data[100..]));
        assert!(from_inside.iter().all(|end| end % BLOCK as u64 == 0), "{from_inside:?}");
        assert_eq!(whole[whole.len() - 4..], from_inside[from_inside.len() - 4..], "the cuts meet again");
    }

    /// The rule bench/dedup_dataset.py counts with: the same cuts for the
    /// same blocks (the script's own figures on its smoke data set are in
    /// docs/BENCHMARKS.md).
    #[test]
    fn content_cuts_fall_on_blocks_within_their_bounds() {
        let data = blocks(&(0..400).collect::<Vec<_>>());
        for average in [16384usize, 32768, 65536, 131072] {
            let cuts = cut(Chunking::Content, average as u32, 0, &data);
            assert!(cuts
                .iter()
                .all(|(at, len)| at.is_multiple_of(BLOCK as u64) && (*len as usize).is_multiple_of(BLOCK)));
            assert!(cuts.iter().all(|(_, len)| *len as usize <= average / 2 * 3));
            assert!(cuts[..cuts.len() - 1].iter().all(|(_, len)| *len as usize >= average / 2));
            let mean = data.len() / cuts.len();
            assert!(mean > average / 2 && mean < average * 3 / 2, "mean {mean} for {average}");
        }
    }

    /// The point of it: runs shifted by whole blocks are cut alike once
    /// past the shift, so their chunks meet.
    #[test]
    fn a_shift_by_whole_blocks_finds_the_same_chunks_again() {
        let run: Vec<u64> = (1000..1300).collect();
        let a = blocks(&run);
        let b = blocks(&[7, 8, 9].iter().copied().chain(run.iter().copied()).collect::<Vec<_>>());
        let chunks = |data: &[u8]| -> std::collections::HashSet<Vec<u8>> {
            cut(Chunking::Content, 32768, 0, data)
                .into_iter()
                .map(|(at, len)| data[at as usize..at as usize + len as usize].to_vec())
                .collect()
        };
        let (ca, cb) = (chunks(&a), chunks(&b));
        let shared = ca.intersection(&cb).count();
        assert!(shared * 10 >= ca.len() * 8, "{shared} of {} chunks found again", ca.len());
        // Fixed chunks find none after a shift of three blocks.
        let fixed =
            |data: &[u8]| -> std::collections::HashSet<Vec<u8>> { data.chunks(32768).map(<[u8]>::to_vec).collect() };
        assert_eq!(fixed(&a).intersection(&fixed(&b)).count(), 0);
    }

    proptest! {
        #[test]
        fn cuts_cover_every_byte_once(len in 0usize..300_000, start in 0u64..1_000_000, content in any::<bool>()) {
            let data: Vec<u8> = (0..len).map(|i| (i / 4096 % 7) as u8).collect();
            let chunking = if content { Chunking::Content } else { Chunking::Fixed };
            let cuts = cut(chunking, 16384, start, &data);
            let mut at = start;
            for (offset, len) in &cuts {
                prop_assert_eq!(*offset, at);
                prop_assert!(*len > 0 && *len <= 24576);
                at += u64::from(*len);
            }
            prop_assert_eq!(at, start + len as u64);
        }
    }
}
