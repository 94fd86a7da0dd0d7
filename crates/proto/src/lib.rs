//! # duplex-proto: the wire protocol, without sockets
//!
//! - [`frame`]: length-prefixed frames with a versioned header and one
//!   crc32c over header and payload. The decoder hands payloads out as
//!   [`bytes::Bytes`] slices of the receive buffer: no copy.
//! - [`handshake`]: a sans-I/O state machine. It checks the cluster fsid and
//!   the protocol version, then authenticates both peers with HMAC-SHA256
//!   challenge-response over a shared cluster secret, which never crosses
//!   the wire.
//! - [`osd`]: the OSD's messages (client operations, replication).
//! - [`writev`]: draining a queue of buffers into a socket, without copying them.
//! - [`session`]: the gate. Until the handshake completes, a peer may send
//!   nothing but handshake frames.
//!
//! Every decoder returns an error on malformed input and never panics; the
//! proptest fuzz tests next to each decoder check that on random bytes.

pub mod frame;
pub mod handshake;
pub mod osd;
pub mod session;
pub mod writev;

pub use frame::{Frame, FrameDecoder, FrameError, FrameHeader, MessageType};
pub use handshake::{Handshake, HandshakeError, Role};
pub use session::{Session, SessionError};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;
