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
//! - [`peering`]: what a PG's primary asks its members while it peers and
//!   recovers them (not on the I/O path).
//! - [`writev`]: draining a queue of buffers into a socket, without copying them.
//! - [`session`]: the gate. Until the handshake completes, a peer may send
//!   nothing but handshake frames.
//!
//! Every decoder returns an error on malformed input and never panics; the
//! proptest fuzz tests next to each decoder check that on random bytes.

pub mod frame;
pub mod handshake;
pub mod omap;
pub mod osd;
pub mod peering;
pub mod readbuf;
pub mod session;
pub mod tier;
pub mod writev;

pub use frame::{Frame, FrameDecoder, FrameError, FrameHeader, MessageType};
pub use handshake::{Handshake, HandshakeError, Role};
pub use session::{Session, SessionError};

/// The protocol version this build speaks.
pub const PROTOCOL_VERSION: u8 = 1;

/// A cluster fsid from its 32 hex digits; `None` for anything else.
pub fn parse_fsid(hex: &str) -> Option<[u8; 16]> {
    if hex.len() != 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    let mut fsid = [0u8; 16];
    for (i, byte) in fsid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(fsid)
}

#[cfg(test)]
mod tests {
    #[test]
    fn fsids_parse_from_32_hex_digits_only() {
        assert_eq!(super::parse_fsid("000102030405060708090a0b0c0d0e0F"), Some(std::array::from_fn(|i| i as u8)));
        for bad in [
            "",
            "00",
            "zz0102030405060708090a0b0c0d0e0f",
            "000102030405060708090a0b0c0d0e0f00",
            "é0102030405060708090a0b0c0d0e0",
        ] {
            assert_eq!(super::parse_fsid(bad), None, "{bad:?}");
        }
    }
}

#[cfg(test)]
mod wire_enum_tests {
    use crate::frame::MessageType;
    use crate::osd::{OpKind, Status};

    /// Every byte converts to the variant with that value or to nothing,
    /// and exactly `variants` bytes convert.
    fn check<T: Copy>(from_u8: fn(u8) -> Option<T>, as_u8: fn(T) -> u8, variants: usize) {
        let mut found = 0;
        for byte in 0..=u8::MAX {
            if let Some(value) = from_u8(byte) {
                assert_eq!(as_u8(value), byte);
                found += 1;
            }
        }
        assert_eq!(found, variants);
    }

    #[test]
    fn from_u8_inverts_the_discriminants() {
        check(MessageType::from_u8, |v| v as u8, 18);
        check(OpKind::from_u8, |v| v as u8, 28);
        check(Status::from_u8, |v| v as u8, 7);
    }
}
