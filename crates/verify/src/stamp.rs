//! A stamped block: a header naming the write, then filler derived from
//! it, so that any mix of two writes, a stale block from another address,
//! or a torn write is told apart from a clean read.

use thiserror::Error;

const MAGIC: u32 = 0x5354_4d50; // "STMP"
/// magic u32, writer u32, seq u64, block u64, crc32c u32 (of everything else), pad u32.
pub const STAMP_HEADER_LEN: usize = 32;

/// Which write a block holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stamp {
    /// The writer (a client, a thread): with `seq`, unique per write.
    pub writer: u32,
    pub seq: u64,
    /// The block address the write was for.
    pub block: u64,
}

#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum StampError {
    #[error("block is {0} bytes; a stamped block needs at least {STAMP_HEADER_LEN}")]
    TooShort(usize),
    #[error("no stamp header (and not all zeros): foreign or torn data")]
    NoStamp,
    #[error("stamp checksum mismatch: torn or corrupted block")]
    Checksum,
    #[error("block {found} returned where block {expected} was read: misplaced data")]
    Misplaced { expected: u64, found: u64 },
}

impl Stamp {
    /// The block's bytes (`len` of them, at least the header).
    pub fn encode(&self, len: usize) -> Vec<u8> {
        assert!(len >= STAMP_HEADER_LEN, "a stamped block needs at least {STAMP_HEADER_LEN} bytes");
        let mut block = vec![0u8; len];
        block[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        block[4..8].copy_from_slice(&self.writer.to_le_bytes());
        block[8..16].copy_from_slice(&self.seq.to_le_bytes());
        block[16..24].copy_from_slice(&self.block.to_le_bytes());
        fill(&mut block[STAMP_HEADER_LEN..], self);
        let crc = checksum(&block);
        block[24..28].copy_from_slice(&crc.to_le_bytes());
        block
    }

    /// What a read of `block` returned: `None` for a never-written (all
    /// zero) block, the stamp of a clean block, or why it is not clean.
    pub fn decode(bytes: &[u8], block: u64) -> Result<Option<Stamp>, StampError> {
        if bytes.len() < STAMP_HEADER_LEN {
            return Err(StampError::TooShort(bytes.len()));
        }
        let u32_at = |at: usize| u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
        let u64_at = |at: usize| u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"));
        if u32_at(0) != MAGIC {
            return if bytes.iter().all(|b| *b == 0) { Ok(None) } else { Err(StampError::NoStamp) };
        }
        if u32_at(24) != checksum(bytes) {
            return Err(StampError::Checksum);
        }
        let stamp = Stamp { writer: u32_at(4), seq: u64_at(8), block: u64_at(16) };
        if stamp.block != block {
            return Err(StampError::Misplaced { expected: block, found: stamp.block });
        }
        Ok(Some(stamp))
    }
}

/// crc32c of the block with the checksum field taken as zero.
fn checksum(block: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&block[..24]);
    let crc = crc32c::crc32c_append(crc, &[0u8; 4]);
    crc32c::crc32c_append(crc, &block[28..])
}

/// Filler that differs for every write (xorshift seeded by the stamp).
fn fill(out: &mut [u8], stamp: &Stamp) {
    let mut state = (stamp.seq ^ ((stamp.writer as u64) << 40) ^ stamp.block.rotate_left(17)) | 1;
    for chunk in out.chunks_mut(8) {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        chunk.copy_from_slice(&state.to_le_bytes()[..chunk.len()]);
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn round_trip_and_zero_blocks() {
        let stamp = Stamp { writer: 3, seq: 99, block: 7 };
        assert_eq!(Stamp::decode(&stamp.encode(4096), 7), Ok(Some(stamp)));
        assert_eq!(Stamp::decode(&[0u8; 4096], 7), Ok(None));
        assert_eq!(Stamp::decode(&stamp.encode(4096), 8), Err(StampError::Misplaced { expected: 8, found: 7 }));
        assert_eq!(Stamp::decode(&[0u8; 8], 0), Err(StampError::TooShort(8)));
        let mut foreign = vec![0u8; 4096];
        foreign[100] = 1;
        assert_eq!(Stamp::decode(&foreign, 0), Err(StampError::NoStamp));
    }

    #[test]
    fn a_torn_mix_of_two_writes_is_caught() {
        let a = Stamp { writer: 1, seq: 1, block: 0 }.encode(4096);
        let b = Stamp { writer: 1, seq: 2, block: 0 }.encode(4096);
        let mut torn = a.clone();
        torn[2048..].copy_from_slice(&b[2048..]);
        assert_eq!(Stamp::decode(&torn, 0), Err(StampError::Checksum));
    }

    proptest! {
        /// Hostile input: any bytes decode to a result, never a panic, and
        /// a single flipped bit of a stamped block is always caught.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300), block in any::<u64>()) {
            let _ = Stamp::decode(&bytes, block);
        }

        #[test]
        fn a_flipped_bit_is_caught(writer in any::<u32>(), seq in any::<u64>(), block in any::<u64>(), bit in 0usize..(512 * 8)) {
            let mut bytes = Stamp { writer, seq, block }.encode(512);
            bytes[bit / 8] ^= 1 << (bit % 8);
            prop_assert!(Stamp::decode(&bytes, block).is_err());
        }
    }
}
