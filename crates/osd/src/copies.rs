//! Counts the bytes of client payload the OSD copies in memory, by where,
//! for the per-write work budget (`crates/cli/tests/budget.rs`). Copies
//! the kernel or the device make (socket reads, DMA) are not counted; the
//! store's own copy into its block buffers is its `user_bytes_written`.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Site {
    /// A connection's read chunk appended to its input buffer.
    Receive = 0,
    /// A log entry's bytes copied into the log's ring.
    LogAppend = 1,
    /// A small outgoing frame's payload copied into the send buffer.
    Send = 2,
    /// A logged entry's data copied out of the log for the store.
    Flush = 3,
    /// A client write's payload encoded into its log entry (the primary's
    /// log and every replica's frame then take those bytes).
    Encode = 4,
}

pub const SITES: [(&str, Site); 5] = [
    ("receive", Site::Receive),
    ("encode", Site::Encode),
    ("log_append", Site::LogAppend),
    ("send", Site::Send),
    ("flush", Site::Flush),
];

static BYTES: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];

pub fn count(site: Site, bytes: usize) {
    BYTES[site as usize].fetch_add(bytes as u64, Relaxed);
}

pub fn bytes(site: Site) -> u64 {
    BYTES[site as usize].load(Relaxed)
}
