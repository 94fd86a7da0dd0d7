//! What a client operation can end with.

use std::time::Duration;

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum ClientError {
    #[error("no such object")]
    NotFound,
    #[error("no pool named '{0}'")]
    NoSuchPool(String),
    #[error("no image named '{0}' (list them with `duplex image list`)")]
    NoSuchImage(String),
    #[error("an image named '{0}' already exists")]
    ImageExists(String),
    #[error("the request was refused: {0}")]
    Invalid(String),
    #[error("the OSD's store failed: {0}")]
    Io(String),
    #[error("cluster full: {0}")]
    NoSpace(String),
    #[error("no answer within {0:?}; last problem: {1}")]
    TimedOut(Duration, String),
    #[error("cannot reach the cluster: {0}")]
    Unavailable(String),
    #[error("the client has shut down")]
    Shutdown,
    #[error("corrupt metadata: {0}")]
    Corrupt(String),
    #[error("no snapshot {0} (list them with `duplex snap list`)")]
    NoSuchSnapshot(String),
    #[error("a snapshot {0} already exists")]
    SnapshotExists(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0} is a snapshot: it is read-only")]
    ReadOnly(String),
}
