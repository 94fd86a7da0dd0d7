//! Counts the bytes of client payload the OSD copies in memory, by where,
//! for the per-write work budget (`crates/cli/tests/budget.rs`). Copies
//! the kernel or the device make (socket reads, DMA) are not counted; the
//! store's own copy into its block buffers is its `user_bytes_written`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A log entry's bytes copied into the log's ring.
    LogAppend = 0,
    /// A small outgoing frame's payload copied into the send buffer.
    Send = 1,
    /// A logged entry's data copied out of the log for the store.
    Flush = 2,
    /// A client write's payload encoded into its log entry (the primary's
    /// log and every replica's frame then take those bytes).
    Encode = 3,
}

// Socket reads land in the frame buffer straight from the kernel
// (`duplex_proto::readbuf`), so receiving is no longer a site here.
pub const SITES: [(&str, Site); 4] =
    [("encode", Site::Encode), ("log_append", Site::LogAppend), ("send", Site::Send), ("flush", Site::Flush)];

static BYTES: [AtomicU64; 4] = [const { AtomicU64::new(0) }; 4];

pub fn count(site: Site, bytes: usize) {
    BYTES[site as usize].fetch_add(bytes as u64, Relaxed);
}

pub fn bytes(site: Site) -> u64 {
    BYTES[site as usize].load(Relaxed)
}
