//! A chunk object's bytes: the chunk, raw or compressed, in a frame
//! (docs/DEDUP.md, "Compression"). Chunk objects are immutable, so a
//! compressed one never needs a read-modify-write.
//!
//! ```text
//! 0  format u8: 0 raw, 1 lz4 (block), 2 zstd
//! 1  the chunk's length u32 LE (its raw bytes)
//! 5  payload: the raw bytes, or their compressed block
//! ```
//! The fingerprint is of the raw bytes: [`open`] decompresses and checks
//! it, so a chunk read back is the chunk named, or an error (never wrong
//! bytes). The decoder meets bytes from disk and the wire: it returns an
//! error on anything malformed and never allocates past [`MAX_CHUNK`].

use duplex_map::Compression;

use crate::Fingerprint;

/// The largest chunk a frame holds (a `ChunkPut` carries at most 1 MiB).
pub const MAX_CHUNK: usize = 1 << 20;
/// Bytes of a frame before its payload.
pub const HEADER: usize = 5;
const RAW: u8 = 0;
const LZ4: u8 = 1;
const ZSTD: u8 = 2;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("a chunk frame of {0} bytes is shorter than its header")]
    Short(usize),
    #[error("unknown chunk frame format {0}")]
    Format(u8),
    #[error("a chunk frame claims {0} bytes, past the largest chunk")]
    TooLarge(usize),
    #[error("a chunk frame's payload does not decode: {0}")]
    Corrupt(String),
    #[error("a chunk's bytes do not hash to its name: the chunk object is damaged")]
    Fingerprint,
}

/// The frame of `chunk`, compressed with `compression` if that saves at
/// least `min_saving_permille` of its bytes, else raw.
pub fn seal(chunk: &[u8], compression: Compression, min_saving_permille: u16) -> Vec<u8> {
    assert!(chunk.len() <= MAX_CHUNK, "a chunk of {} bytes", chunk.len());
    let compressed = match compression {
        Compression::None => None,
        Compression::Lz4 => Some((LZ4, lz4_flex::block::compress(chunk))),
        // (A zstd error here would be a bug of ours, not of the input:
        // storing the chunk raw is correct either way.)
        Compression::Zstd(level) => zstd::bulk::compress(chunk, i32::from(level)).ok().map(|out| (ZSTD, out)),
    };
    let limit = chunk.len() - chunk.len() * usize::from(min_saving_permille.min(1000)) / 1000;
    let (format, payload) = match compressed {
        Some((format, out)) if out.len() < limit || (min_saving_permille == 0 && out.len() <= chunk.len()) => {
            (format, out)
        }
        _ => (RAW, chunk.to_vec()),
    };
    let mut frame = Vec::with_capacity(HEADER + payload.len());
    frame.push(format);
    frame.extend_from_slice(&(chunk.len() as u32).to_le_bytes());
    frame.extend_from_slice(&payload);
    frame
}

/// The raw chunk in `frame`, checked against `fingerprint`.
pub fn open(frame: &[u8], fingerprint: &Fingerprint) -> Result<Vec<u8>, FrameError> {
    let chunk = unseal(frame)?;
    if Fingerprint::of(&chunk) != *fingerprint {
        return Err(FrameError::Fingerprint);
    }
    Ok(chunk)
}

/// The raw chunk in `frame`, unchecked (the scrub compares it itself).
pub fn unseal(frame: &[u8]) -> Result<Vec<u8>, FrameError> {
    if frame.len() < HEADER {
        return Err(FrameError::Short(frame.len()));
    }
    let len = u32::from_le_bytes(frame[1..HEADER].try_into().expect("4 bytes")) as usize;
    if len > MAX_CHUNK {
        return Err(FrameError::TooLarge(len));
    }
    let payload = &frame[HEADER..];
    let chunk = match frame[0] {
        RAW => payload.to_vec(),
        LZ4 => lz4_flex::block::decompress(payload, len).map_err(|e| FrameError::Corrupt(e.to_string()))?,
        ZSTD => zstd::bulk::decompress(payload, len).map_err(|e| FrameError::Corrupt(e.to_string()))?,
        other => return Err(FrameError::Format(other)),
    };
    if chunk.len() != len {
        return Err(FrameError::Corrupt(format!("{} bytes where the header says {len}", chunk.len())));
    }
    Ok(chunk)
}

/// Whether `frame` is stored compressed.
pub fn is_compressed(frame: &[u8]) -> bool {
    frame.first().is_some_and(|f| *f != RAW)
}

/// The raw length a frame declares (`None`: not a frame).
pub fn raw_len(frame: &[u8]) -> Option<usize> {
    let len = u32::from_le_bytes(frame.get(1..HEADER)?.try_into().ok()?) as usize;
    (len <= MAX_CHUNK).then_some(len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const ALL: [Compression; 4] = [Compression::None, Compression::Lz4, Compression::Zstd(1), Compression::Zstd(19)];

    fn text(len: usize) -> Vec<u8> {
        b"the quick brown fox jumps over the lazy dog; ".iter().copied().cycle().take(len).collect()
    }

    #[test]
    fn compressible_chunks_shrink_and_random_ones_stay_raw() {
        let chunk = text(32 << 10);
        for compression in [Compression::Lz4, Compression::Zstd(3)] {
            let frame = seal(&chunk, compression, 125);
            assert!(is_compressed(&frame) && frame.len() < chunk.len() / 4, "{compression}: {}", frame.len());
            assert_eq!(open(&frame, &Fingerprint::of(&chunk)).unwrap(), chunk);
        }
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let noise: Vec<u8> = (0..32 << 10)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 32) as u8
            })
            .collect();
        let frame = seal(&noise, Compression::Lz4, 125);
        assert!(!is_compressed(&frame), "noise does not shrink by 12.5 %");
        assert_eq!(frame.len(), noise.len() + HEADER);
        assert_eq!(raw_len(&frame), Some(noise.len()));
        // Asking for more saving than compression gives keeps it raw.
        assert!(!is_compressed(&seal(&chunk, Compression::Lz4, 1000)));
        assert!(!is_compressed(&seal(&chunk, Compression::None, 0)));
    }

    #[test]
    fn damaged_frames_are_errors_never_wrong_bytes() {
        let chunk = text(16 << 10);
        let print = Fingerprint::of(&chunk);
        let frame = seal(&chunk, Compression::Lz4, 0);
        assert_eq!(unseal(&frame[..3]), Err(FrameError::Short(3)));
        let mut bad = frame.clone();
        bad[0] = 9;
        assert_eq!(unseal(&bad), Err(FrameError::Format(9)));
        let mut huge = frame.clone();
        huge[1..5].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(unseal(&huge), Err(FrameError::TooLarge(u32::MAX as usize)));
        let mut flipped = seal(&chunk, Compression::None, 0);
        flipped[100] ^= 1;
        assert_eq!(open(&flipped, &print), Err(FrameError::Fingerprint));
        assert!(open(&frame[..frame.len() - 1], &print).is_err());
    }

    proptest! {
        #[test]
        fn every_chunk_round_trips(chunk in proptest::collection::vec(0u8..4, 0..4096), which in 0usize..4, saving in 0u16..=1000) {
            let frame = seal(&chunk, ALL[which], saving);
            prop_assert_eq!(open(&frame, &Fingerprint::of(&chunk)).unwrap(), chunk);
        }

        #[test]
        fn any_bytes_decode_to_an_error_or_a_chunk(frame in proptest::collection::vec(any::<u8>(), 0..512), format in 0u8..3) {
            let mut frame = frame;
            if let Some(first) = frame.first_mut() {
                *first = format;
            }
            if let Ok(chunk) = unseal(&frame) {
                prop_assert_eq!(Some(chunk.len()), raw_len(&frame));
            }
        }
    }
}
