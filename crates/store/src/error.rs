//! The store's error type: each failure a caller must tell apart is its own variant.

use std::io;

pub type Result<T, E = StoreError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("I/O error while {context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },

    /// A data block's contents do not match its stored crc32c. The read fails
    /// rather than return wrong data; scrub repairs the block from a replica.
    #[error(
        "checksum mismatch in partition {partition}, data block {block} (device offset {device_offset}): \
         stored crc32c {stored:#010x}, computed {computed:#010x}"
    )]
    ChecksumMismatch { partition: u32, block: u64, device_offset: u64, stored: u32, computed: u32 },

    #[error("object not found")]
    NotFound,

    #[error("object already exists")]
    AlreadyExists,

    #[error("attribute not found")]
    AttrNotFound,

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    #[error("no space left in partition {partition}: {detail}")]
    NoSpace { partition: u32, detail: String },

    #[error("corrupt on-disk structure: {0}")]
    Corrupt(String),

    #[error(
        "{path} does not support O_DIRECT ({detail}). Put the store on a block device or on a file \
         system that supports direct I/O (ext4, xfs), or set direct_io = \"fallback\" to run with \
         buffered I/O (slower, and the page cache then holds data the device has not yet seen)"
    )]
    DirectIoUnsupported { path: String, detail: String },

    /// A device write or flush failed earlier. What reached the device is
    /// unknown, so the partition stops serving instead of retrying and
    /// trusting; remount (replaying the journal) or recover from peers.
    #[error("partition {0} stopped after a device error; remount it or recover it from its peers")]
    PartitionFailed(u32),

    #[error("key belongs to partition {expected}, but was sent to partition {actual}")]
    WrongPartition { expected: u32, actual: u32 },

    #[error(
        "{path} is in use by another process (it holds the store's lock); stop it first, \
         or wait for a crashed process's last I/O to finish"
    )]
    InUse { path: String },

    #[error("the store is mounted read-only")]
    ReadOnly,
}

impl StoreError {
    pub(crate) fn io(context: impl Into<String>, source: io::Error) -> Self {
        StoreError::Io { context: context.into(), source }
    }

    pub(crate) fn invalid(msg: impl Into<String>) -> Self {
        StoreError::InvalidArgument(msg.into())
    }

    pub(crate) fn corrupt(msg: impl Into<String>) -> Self {
        StoreError::Corrupt(msg.into())
    }
}
