//! # duplex-oplog: the operation log
//!
//! The top half of every write (DESIGN.md §4): a write is acknowledged once
//! it is in the operation log of every replica, and applied to the object
//! store later, in batches. One [`PgLog`] per placement group is a ring of
//! checksummed [`Entry`]s over a [`Region`]. The [`IndexCache`] says which
//! objects have entries in the log, and serves a read from the log when the
//! log covers it (R1).
//!
//! What each region kind survives ([`region`]):
//!
//! | mode | where | survives a process crash | survives a power loss |
//! | --- | --- | --- | --- |
//! | `shm` | a file on tmpfs (`/dev/shm`), mapped | yes | no |
//! | `pmem` | a file on persistent memory, mapped, flushed per append | yes | yes |
//! | `file` | a file on a disk, written with O_DSYNC | yes | yes |
//!
//! A ring that is full refuses the append ([`LogError::Full`]): the caller
//! waits for a flush to trim it (back-pressure), and never drops a write.

pub mod entry;
pub mod index;
pub mod log;
pub mod region;

pub use entry::{zero_length, Entry, EntryRef, OpKind, RequestId};
pub use index::IndexCache;
pub use log::{LogError, PgLog, MIN_REGION_BYTES};
pub use region::{FileRegion, MmapRegion, Region};
