//! # duplex-store: the in-place object store behind every Duplex OSD
//!
//! A special-purpose store on a raw block device or a regular file, opened with
//! `O_DIRECT`. It replaces what BlueStore + RocksDB do in Ceph, with in-place
//! updates and no compaction (DESIGN.md §7, paper 000 §IV-C).
//!
//! ## Shape
//! The device is split into `N` **partitions** ([`layout`]). Each partition has
//! its own metadata journal, bitmaps, crc32c table, 512-byte onode area and
//! 4 KiB data blocks, and is driven by exactly one thread through a
//! [`Partition`] value that owns everything it touches: partitions share the
//! file descriptor and nothing else, so no lock is ever taken between them.
//! The first four bytes of a key (its *group*, the OSD's placement group)
//! select the partition, so one group's objects are contiguous in one
//! partition's ordered index.
//!
//! ## Durability contract
//! [`Partition::apply`] applies a [`Batch`] of operations and returns only
//! after the batch is durable, with one device flush:
//! 1. one journal record (metadata redo: bitmap changes, per-block crc32c
//!    old/new, onode images) is written and completes;
//! 2. the data blocks are written in place;
//! 3. the device is flushed (`fdatasync`).
//!
//! When `apply` returns `Ok`, every operation of the batch survives a process
//! crash and a power loss. If the process dies during `apply`, remounting
//! leaves the batch's metadata either wholly applied or wholly absent, and
//! each of its 4 KiB data blocks holds either its old or its new contents,
//! with a matching checksum (a block the batch copies on write holds its
//! new contents: copies are flushed before their record). Batch atomicity for data is not promised: the
//! OSD's operation log is the redo log that replays an unacknowledged batch.
//! After a *power loss* during `apply` (not a process crash) a block of that
//! batch may be torn; it then reads as [`StoreError::ChecksumMismatch`], never
//! as wrong data, until the operation log rewrites it.
//!
//! Metadata pages are written back lazily at checkpoints ([`journal`]), so a
//! pre-allocated 4 KiB overwrite costs one data write plus its share of one
//! journal sector.
//!
//! ## Example
//! ```
//! use duplex_store::{mkfs, Batch, Key, MkfsOptions, Store, StoreConfig};
//!
//! # fn main() -> Result<(), duplex_store::StoreError> {
//! let dir = tempfile::tempdir().unwrap();
//! let path = dir.path().join("store.img");
//! let config = StoreConfig::default();
//! mkfs(&path, &MkfsOptions { partitions: 2, size_bytes: Some(64 << 20), ..Default::default() }, &config)?;
//!
//! let mut store = Store::open(&path, &config)?;
//! let key = Key::in_group(7, b"image-1.0000")?; // group 7: placement group 7
//! let mut batch = Batch::new();
//! batch.create_preallocated(key.clone(), 4 << 20).write(key.clone(), 8192, vec![0xAB; 4096]);
//! store.partition_for(key.as_bytes()).apply(&batch)?; // durable when it returns
//!
//! let partition = store.partition_for(key.as_bytes());
//! assert_eq!(partition.read(key.as_bytes(), 8192, 4096)?, vec![0xAB; 4096]);
//! assert_eq!(partition.read(key.as_bytes(), 0, 4)?, vec![0; 4]); // pre-allocated, unwritten: zeros
//! store.close()?; // checkpoint: the next mount replays nothing
//! # Ok(())
//! # }
//! ```

#![forbid(unsafe_op_in_unsafe_fn)]

pub mod batch;
pub mod bitmap;
mod blockio;
mod chunks;
mod codec;
pub mod device;
pub mod error;
pub mod faults;
pub mod fsck;
pub mod journal;
pub mod key;
pub mod layout;
pub mod mirror;
pub mod model;
pub mod onode;
pub mod pages;
pub mod partition;
pub mod store;
pub mod units;

pub use batch::{Batch, Op};
pub use device::{DeviceConfig, DirectIo, FlushHandle, IoBackend, IoStats};
pub use error::{Result, StoreError};
pub use faults::{DeviceFaults, Fault, PowerCut};
pub use fsck::{fsck, FsckIssue, FsckReport, PartitionFsck};
pub use key::Key;
pub use layout::MkfsOptions;
pub use partition::{
    CommitInfo, GroupUsage, ObjectInfo, Partition, PartitionMemory, PartitionStats, ReadRequest, Unsynced,
};
pub use store::{mkfs, Store, StoreConfig};

/// Size of a data block, of a metadata page and of the store's I/O unit.
pub const BLOCK_SIZE: usize = 4096;
/// Size of one onode slot.
pub const SLOT_SIZE: usize = 512;
/// Onode slots per metadata page.
pub const SLOTS_PER_PAGE: usize = BLOCK_SIZE / SLOT_SIZE;
/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 200;
/// Largest object. Block images stripe over 4 MiB objects; 64 MiB leaves room
/// for other uses while bounding one object's metadata.
pub const MAX_OBJECT_SIZE: u64 = 64 << 20;
/// Longest attribute name.
pub const MAX_ATTR_NAME_LEN: usize = 255;
/// Longest attribute value.
pub const MAX_ATTR_VALUE_LEN: usize = 4096;
/// All attribute names and values of one object together.
pub const MAX_ATTR_BYTES: usize = 16 << 10;
/// Longest omap key (omap keys are never empty).
pub const MAX_OMAP_KEY_LEN: usize = 255;
/// Longest omap value.
pub const MAX_OMAP_VALUE_LEN: usize = 4096;
/// All omap keys and values of one object together: a 4 MiB object's
/// chunk map at 16 KiB chunks (256 entries) fits with room to spare, and
/// with the largest attributes and extents the blob still fits one chain.
pub const MAX_OMAP_BYTES: usize = 64 << 10;
/// Most partitions in one store. The superblock has room for more (an
/// 88-byte header, then 12 u64s of geometry per partition, in one block);
/// 28 bounds the threads and the per-partition metric arrays.
pub const MAX_PARTITIONS: u32 = 28;

const _: () = assert!(BLOCK_SIZE.is_multiple_of(SLOT_SIZE));
const _: () = assert!(
    layout::SUPERBLOCK_HEADER_LEN + MAX_PARTITIONS as usize * layout::GEOMETRY_WORDS * 8 <= BLOCK_SIZE,
    "the superblock holds every partition's geometry"
);
const _: () = assert!(MAX_OBJECT_SIZE.is_multiple_of(BLOCK_SIZE as u64));
const _: () = assert!(MAX_OBJECT_SIZE / (BLOCK_SIZE as u64) < u32::MAX as u64);

/// Entry points for coverage-guided fuzzing (`fuzz/` at the repository root).
#[doc(hidden)]
pub mod fuzzing {
    /// Feeds `data` to every on-disk decoder; they must return errors, never panic.
    pub fn decode_all(data: &[u8]) {
        let _ = crate::layout::Superblock::decode(data);
        let _ = crate::layout::PartitionHeader::decode(data, &[0; 16], 0);
        let _ = crate::onode::decode_slot(data);
        let _ = crate::onode::ObjectMeta::decode(data, 1 << 20);
        let _ = crate::journal::Record::decode(data, &[0; 16], 0, 1, 512);
    }
}

/// crc32c of a byte slice: the one checksum used everywhere on disk.
pub fn crc32c(bytes: &[u8]) -> u32 {
    crc32c::crc32c(bytes)
}
