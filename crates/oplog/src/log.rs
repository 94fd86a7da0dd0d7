//! One PG's log: a ring of entries over a region.
//!
//! ```text
//! 0    header slot A (64 bytes)   64  header slot B     128  ring (entries, 8-byte aligned)
//! header: magic "DPXH" u32, crc32c u32, generation u64, pg u32, pad u32, tail offset u64, tail seq u64,
//!         last active interval u64 (peering: the interval in which this PG last went active here),
//!         epoch of the entry before the tail u32 (peering: with the tail seq, names the newest
//!         entry an empty log has held)
//! ```
//! Entries are appended at the head. One that does not fit before the end
//! of the region starts again at the beginning of the ring, after a wrap
//! marker (8 bytes "DPXW" + 0) where there is room for one. Trimming writes
//! the header slot of the next generation: the valid slot with the larger
//! generation says where the oldest live entry is, and which seq it has.
//! Recovery reads entries from there while each one is whole (crc) and
//! carries the next seq; anything after is stale or torn.

use crate::entry::{Entry, EntryRef, OpKind, HEADER_LEN as ENTRY_HEADER_LEN};
use crate::region::Region;

const HEADER_SLOT: u64 = 64;
const RING_START: u64 = 2 * HEADER_SLOT;
/// The smallest region a log can live in: its two headers and 4 KiB of ring.
pub const MIN_REGION_BYTES: u64 = RING_START + 4096;
const HEADER_MAGIC: u32 = u32::from_le_bytes(*b"DPXH");
const WRAP_MARKER: [u8; 8] = *b"DPXW\0\0\0\0";

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("the log is full: flush and trim before appending")]
    Full,
    #[error("entry of {0} bytes can never fit this log")]
    TooLarge(usize),
    #[error("entry seq {got} does not follow {expected}")]
    OutOfOrder { expected: u64, got: u64 },
    #[error("object name of {0} bytes exceeds the log's limit")]
    ObjectTooLong(usize),
    #[error("log I/O: {0}")]
    Io(#[from] std::io::Error),
    #[error("live entry {seq} no longer decodes (the log's memory was damaged)")]
    Damaged { seq: u64 },
}

pub struct PgLog<R: Region> {
    region: R,
    pg: u32,
    generation: u64,
    /// Offset and seq of the oldest live entry.
    tail: u64,
    tail_seq: u64,
    /// Where the next entry goes, and its seq.
    head: u64,
    next_seq: u64,
    /// Live entries in order: (seq, offset, epoch, metadata bytes), for
    /// trimming and replay.
    live: std::collections::VecDeque<(u64, u64, u32, u32)>,
    /// The live entries' metadata bytes ([`crate::OpKind::metadata_bytes`]).
    live_metadata: u64,
    last_active: u64,
    /// The epoch of entry `tail_seq - 1` (0: none, or unknown).
    before_tail_epoch: u32,
}

/// A header's fields after its generation.
#[derive(Clone, Copy)]
struct Header {
    tail: u64,
    tail_seq: u64,
    last_active: u64,
    before_tail_epoch: u32,
}

fn encode_header(generation: u64, pg: u32, header: Header) -> [u8; 64] {
    let Header { tail, tail_seq, last_active, before_tail_epoch } = header;
    let mut h = [0u8; 64];
    h[0..4].copy_from_slice(&HEADER_MAGIC.to_le_bytes());
    h[8..16].copy_from_slice(&generation.to_le_bytes());
    h[16..20].copy_from_slice(&pg.to_le_bytes());
    h[24..32].copy_from_slice(&tail.to_le_bytes());
    h[32..40].copy_from_slice(&tail_seq.to_le_bytes());
    h[40..48].copy_from_slice(&last_active.to_le_bytes());
    h[48..52].copy_from_slice(&before_tail_epoch.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..4]), &h[8..]);
    h[4..8].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Where the header of `generation` goes: the slots alternate, so a torn
/// header write can only destroy the older of the two.
fn slot_of(generation: u64) -> u64 {
    (generation % 2) * HEADER_SLOT
}

/// The generation and fields of a valid header for `pg` in a region of `len` bytes.
fn decode_header(h: &[u8], pg: u32, len: u64) -> Option<(u64, Header)> {
    let word = |at: usize| u32::from_le_bytes(h[at..at + 4].try_into().expect("4 bytes"));
    let long = |at: usize| u64::from_le_bytes(h[at..at + 8].try_into().expect("8 bytes"));
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[..4]), &h[8..64]);
    let tail = long(24);
    let tail_fits = (RING_START..=len).contains(&tail) && tail.is_multiple_of(8);
    (word(0) == HEADER_MAGIC && word(4) == crc && word(16) == pg && tail_fits)
        .then(|| (long(8), Header { tail, tail_seq: long(32), last_active: long(40), before_tail_epoch: word(48) }))
}

impl<R: Region> PgLog<R> {
    /// Opens the log of `pg` in `region`, recovering its live entries
    /// (a region never used before holds none).
    pub fn open(mut region: R, pg: u32) -> Result<(PgLog<R>, Vec<Entry>), LogError> {
        assert!(region.len() >= MIN_REGION_BYTES, "a log region needs at least 4 KiB of ring");
        let headers = [region.read(0, 64).to_vec(), region.read(HEADER_SLOT, 64).to_vec()];
        let len = region.len();
        let best = headers.iter().filter_map(|h| decode_header(h, pg, len)).max_by_key(|(generation, ..)| *generation);
        let (generation, header) = match best {
            Some(found) => found,
            None => {
                let header = Header { tail: RING_START, tail_seq: 1, last_active: 0, before_tail_epoch: 0 };
                region.write(slot_of(1), &encode_header(1, pg, header))?;
                (1, header)
            }
        };
        let Header { tail, tail_seq, last_active, before_tail_epoch } = header;
        let mut log = PgLog {
            region,
            pg,
            generation,
            tail,
            tail_seq,
            head: tail,
            next_seq: tail_seq,
            live: Default::default(),
            live_metadata: 0,
            last_active,
            before_tail_epoch,
        };
        let mut entries = Vec::new();
        let mut position = tail;
        let mut wrapped = false;
        loop {
            if position + ENTRY_HEADER_LEN as u64 > log.region.len() || log.region.read(position, 8) == WRAP_MARKER {
                if wrapped {
                    break;
                }
                wrapped = true;
                position = RING_START;
                continue;
            }
            let available = (log.region.len() - position) as usize;
            let Some(entry) = Entry::decode(log.region.read(position, available)) else { break };
            if entry.seq != log.next_seq || entry.pg != pg {
                break;
            }
            // After wrapping, entries must stay behind the tail.
            if wrapped && position + entry.encoded_len() as u64 > tail {
                break;
            }
            let metadata = entry.op.metadata_bytes(entry.data.len() as u64, entry.offset) as u32;
            log.live.push_back((entry.seq, position, entry.epoch, metadata));
            log.live_metadata += u64::from(metadata);
            position += entry.encoded_len() as u64;
            log.head = position;
            log.next_seq += 1;
            entries.push(entry);
        }
        assert!(log.head >= RING_START && log.head.is_multiple_of(8), "recovered head {}", log.head);
        assert_eq!(log.live.len() as u64, log.next_seq - log.tail_seq, "recovered seqs are not consecutive");
        Ok((log, entries))
    }

    pub fn pg(&self) -> u32 {
        self.pg
    }

    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Bytes of the ring the live entries hold (with the unused end of the
    /// ring when they wrap): what flushing them may need in the store, and more.
    pub fn live_bytes(&self) -> u64 {
        if self.live.is_empty() {
            0
        } else if self.tail < self.head {
            self.head - self.tail
        } else {
            (self.region.len() - self.tail) + (self.head - RING_START)
        }
    }

    /// What the live entries add to their objects' metadata (attributes,
    /// omap entries, chunk maps) when they are applied, in bytes at most:
    /// the room in the store's onodes their flush may need.
    pub fn live_metadata_bytes(&self) -> u64 {
        self.live_metadata
    }

    /// Appends `entry` (whose seq must be [`PgLog::next_seq`]); when this
    /// returns, the entry survives what the region survives.
    pub fn append(&mut self, entry: &Entry) -> Result<u64, LogError> {
        if entry.object.len() > crate::entry::MAX_OBJECT_LEN {
            return Err(LogError::ObjectTooLong(entry.object.len()));
        }
        self.append_encoded(entry.seq, &entry.encode())
    }

    /// Appends an entry already encoded (by [`crate::EntryRef::encode`]), so
    /// that the same bytes can also go to the replicas.
    pub fn append_encoded(&mut self, seq: u64, encoded: &[u8]) -> Result<u64, LogError> {
        // Cheap checks in every build: a mismatch here would make recovery
        // stop at this entry and drop everything logged after it.
        assert!(
            encoded.len() >= ENTRY_HEADER_LEN
                && encoded.len().is_multiple_of(8)
                && encoded[0..4] == *b"DPXL"
                && encoded[8..16] == seq.to_le_bytes(),
            "append_encoded wants one whole encoded entry with seq {seq}"
        );
        debug_assert!(
            Entry::decode(encoded).is_some_and(|e| e.encoded_len() == encoded.len()),
            "append_encoded wants one whole encoded entry"
        );
        if seq != self.next_seq {
            return Err(LogError::OutOfOrder { expected: self.next_seq, got: seq });
        }
        let len = encoded.len() as u64;
        let ring = self.region.len() - RING_START;
        if len + WRAP_MARKER.len() as u64 > ring / 2 {
            return Err(LogError::TooLarge(len as usize));
        }
        let mut at = self.head;
        let wraps = at + len > self.region.len();
        if wraps {
            at = RING_START;
        }
        // Room: live entries span [tail, head), or [tail, end) and
        // [RING_START, head) once wrapped; none may be overwritten.
        let fits = if self.live.is_empty() {
            true
        } else if self.tail < self.head {
            !wraps || RING_START + len <= self.tail
        } else {
            // Wrapped (or exactly full): never wrap a second time.
            !wraps && self.head + len <= self.tail
        };
        if !fits {
            return Err(LogError::Full);
        }
        if wraps && self.head + WRAP_MARKER.len() as u64 <= self.region.len() {
            self.region.write(self.head, &WRAP_MARKER)?;
        }
        debug_assert!(at >= RING_START && at.is_multiple_of(8), "entry at {at}");
        debug_assert!(self.live.back().is_none_or(|(last, ..)| last + 1 == seq), "live seqs are consecutive");
        self.region.write(at, encoded)?;
        if self.live.is_empty() {
            self.tail = at;
            self.tail_seq = seq;
        }
        let epoch = u32::from_le_bytes(encoded[24..28].try_into().expect("4 bytes"));
        let data_len = u32::from_le_bytes(encoded[32..36].try_into().expect("4 bytes"));
        let offset = u64::from_le_bytes(encoded[40..48].try_into().expect("8 bytes"));
        let metadata =
            OpKind::from_u8(encoded[28]).map_or(0, |kind| kind.metadata_bytes(u64::from(data_len), offset)) as u32;
        self.live.push_back((seq, at, epoch, metadata));
        self.live_metadata += u64::from(metadata);
        self.head = at + len;
        self.next_seq += 1;
        debug_assert!(self.head <= self.region.len(), "head past the region");
        debug_assert_eq!(self.live.len() as u64, self.next_seq - self.tail_seq, "live entries are tail_seq..next_seq");
        Ok(at)
    }

    /// Drops every entry with seq <= `through` (they are in the store now).
    pub fn trim(&mut self, through: u64) -> Result<(), LogError> {
        let mut before_tail_epoch = self.before_tail_epoch;
        while let Some((_, _, epoch, metadata)) = self.live.front().filter(|(seq, ..)| *seq <= through) {
            before_tail_epoch = *epoch;
            self.live_metadata -= u64::from(*metadata);
            self.live.pop_front();
        }
        debug_assert!(!self.live.is_empty() || self.live_metadata == 0, "metadata bytes left with no live entry");
        let (tail, tail_seq) = self.live.front().map_or((self.head, self.next_seq), |(seq, at, ..)| (*at, *seq));
        if (tail, tail_seq) == (self.tail, self.tail_seq) {
            return Ok(());
        }
        self.write_header(Header { tail, tail_seq, last_active: self.last_active, before_tail_epoch })?;
        debug_assert_eq!(self.live.len() as u64, self.next_seq - self.tail_seq, "live entries are tail_seq..next_seq");
        Ok(())
    }

    /// Drops every live entry with seq > `seq` (an erasure-coded PG's
    /// entries fewer than k shards logged: peering rolls them back), and
    /// returns how many. Durable when it returns: the first dropped
    /// entry's header is overwritten, so recovery, which reads entries
    /// while each carries the next seq, stops before it; the next append
    /// takes its place.
    pub fn truncate_after(&mut self, seq: u64) -> Result<usize, LogError> {
        let keep = self.live.iter().position(|(s, ..)| *s > seq).unwrap_or(self.live.len());
        let dropped = self.live.len() - keep;
        if dropped == 0 {
            return Ok(0);
        }
        let (first, at, ..) = self.live[keep];
        debug_assert_eq!(first, seq + 1, "live entries are consecutive");
        // Every dropped entry's header goes, the first one first (a crash
        // between two writes leaves the first gone: recovery stops there).
        // Zeroing the first alone was not enough: a new entry of the same
        // length as the first dropped one ends where the second dropped one
        // begins, whose seq follows the new one's, and a recovery took it
        // back (the file log's model test found it).
        for (_, offset, ..) in self.live.range(keep..) {
            self.region.write(*offset, &[0u8; ENTRY_HEADER_LEN])?;
        }
        self.live_metadata -= self.live.range(keep..).map(|(.., metadata)| u64::from(*metadata)).sum::<u64>();
        self.live.truncate(keep);
        debug_assert!(!self.live.is_empty() || self.live_metadata == 0, "metadata bytes left with no live entry");
        self.head = at;
        self.next_seq = first;
        debug_assert_eq!(self.live.len() as u64, self.next_seq - self.tail_seq, "live entries are tail_seq..next_seq");
        Ok(dropped)
    }

    fn write_header(&mut self, header: Header) -> Result<(), LogError> {
        // Recovery ignores a header whose tail decode_header refuses.
        debug_assert!(header.tail >= RING_START && header.tail.is_multiple_of(8), "header tail {}", header.tail);
        self.generation += 1;
        let encoded = encode_header(self.generation, self.pg, header);
        self.region.write(slot_of(self.generation), &encoded)?;
        self.tail = header.tail;
        self.tail_seq = header.tail_seq;
        self.last_active = header.last_active;
        self.before_tail_epoch = header.before_tail_epoch;
        Ok(())
    }

    /// The epoch of the newest entry this log has held (live or trimmed; 0:
    /// none, or unknown). With `next_seq - 1` it names the log's end:
    /// two logs that end at the same (seq, epoch) hold the same history.
    pub fn last_epoch(&self) -> u32 {
        self.live.back().map_or(self.before_tail_epoch, |(_, _, epoch, _)| *epoch)
    }

    /// The interval in which this PG last went active on this OSD (0: never,
    /// or the log was lost), as peering recorded it.
    pub fn last_active(&self) -> u64 {
        self.last_active
    }

    /// Peering's verdict on an empty log: the next entry is `next_seq`
    /// (which may be lower than before: divergent entries were rolled back
    /// in the store), and the PG went active in `interval`. Durable like a
    /// trim: one header write.
    /// `last_epoch` is the epoch of entry `next_seq - 1` in the authority's history.
    pub fn set_position(&mut self, next_seq: u64, last_epoch: u32, interval: u64) -> Result<(), LogError> {
        assert!(self.live.is_empty(), "the log's position moves only when it is empty");
        assert!(next_seq >= 1, "seqs start at 1");
        let header =
            Header { tail: self.head, tail_seq: next_seq, last_active: interval, before_tail_epoch: last_epoch };
        self.write_header(header)?;
        self.next_seq = next_seq;
        Ok(())
    }

    /// The live entry at `offset` (as returned by `append`).
    pub fn read(&self, offset: u64) -> Option<Entry> {
        self.entry_at(offset).map(|e| e.to_owned())
    }

    /// The live entry at `offset`, borrowed from the region (checksum verified, nothing copied).
    pub fn entry_at(&self, offset: u64) -> Option<EntryRef<'_>> {
        let available = self.region.len().checked_sub(offset).filter(|a| *a > 0)?;
        EntryRef::decode(self.region.read(offset, available as usize))
    }

    /// Where each live entry is, oldest first (as `append` returned).
    pub fn offsets(&self) -> impl Iterator<Item = u64> + '_ {
        self.live.iter().map(|(_, at, ..)| *at)
    }

    /// The live entries, oldest first. A live entry that no longer decodes
    /// is an error, never skipped: a flush that skipped it would trim it
    /// and lose an acknowledged write.
    pub fn entries(&self) -> impl Iterator<Item = Result<Entry, LogError>> + '_ {
        self.live.iter().map(|(seq, at, ..)| self.read(*at).ok_or(LogError::Damaged { seq: *seq }))
    }
}
