//! Frames.
//!
//! ```text
//! 0  magic u32 = "DPXW" (little-endian bytes 'D','P','X','W')
//! 4  version u8            5  message type u8      6  flags u16
//! 8  transaction id u64    16 payload length u32   20 crc32c u32
//! 24 payload (length bytes)
//! ```
//! The crc32c covers header bytes 0..20 and then the payload, so a bit flip
//! anywhere in a frame is detected. Payloads longer than the decoder's limit
//! are refused before anything is buffered for them.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use num_enum::TryFromPrimitive;

pub const HEADER_LEN: usize = 24;
pub const MAGIC: [u8; 4] = *b"DPXW";
/// Default payload limit: 64 MiB (a 4 MiB object write plus room).
pub const DEFAULT_MAX_PAYLOAD: u32 = 64 << 20;

/// Message types. Values are part of the protocol: never reuse one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, TryFromPrimitive)]
#[repr(u8)]
pub enum MessageType {
    Hello = 1,
    Challenge = 2,
    Response = 3,
    Accepted = 4,
    Refused = 5,
    Ping = 16,
    Pong = 17,
    /// Monitor traffic: a postcard-encoded `duplex_mon_client::MonMessage`.
    Monitor = 32,
    /// Client → primary: an object operation ([`crate::osd::OpRequest`]).
    OsdOp = 48,
    /// Primary → client: its outcome ([`crate::osd::OpReply`]).
    OsdOpReply = 49,
    /// Primary → replica: one operation-log entry to log (the entry's own encoding).
    RepOp = 50,
    /// Replica → primary: the entry is logged ([`crate::osd::RepReply`]).
    RepOpReply = 51,
    /// Client → OSD: report your counters (empty payload).
    OsdStats = 52,
    /// OSD → client: [`crate::osd::OsdStats`].
    OsdStatsReply = 53,
    /// Primary → member: a peering or recovery step ([`crate::peering::PeerRequest`]).
    PeerRequest = 54,
    /// Member → primary: its answer ([`crate::peering::PeerReply`]).
    PeerReply = 55,
    /// Client → OSD: report what each PG holds in your store (empty payload; `duplex df`).
    OsdUsage = 56,
    /// OSD → client: one per store partition ([`crate::osd::UsageReply`]).
    OsdUsageReply = 57,
}

impl MessageType {
    /// The variant whose value is `value` (`None` for any other byte).
    pub fn from_u8(value: u8) -> Option<MessageType> {
        MessageType::try_from(value).ok()
    }
}

impl MessageType {
    pub fn is_handshake(self) -> bool {
        matches!(
            self,
            MessageType::Hello
                | MessageType::Challenge
                | MessageType::Response
                | MessageType::Accepted
                | MessageType::Refused
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FrameHeader {
    pub version: u8,
    /// Raw type byte: the session decides what it accepts.
    pub message_type: u8,
    pub flags: u16,
    pub transaction_id: u64,
    pub payload_len: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub header: FrameHeader,
    pub payload: Bytes,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("bad frame magic {0:02x?}: not a Duplex peer")]
    BadMagic([u8; 4]),
    #[error("payload of {len} bytes exceeds the limit of {limit}")]
    TooLarge { len: u32, limit: u32 },
    #[error("frame checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    Checksum { stored: u32, computed: u32 },
}

impl Frame {
    pub fn new(message_type: MessageType, transaction_id: u64, payload: Bytes) -> Frame {
        let payload_len = u32::try_from(payload.len()).expect("payloads are bounded far below 4 GiB");
        Frame {
            header: FrameHeader {
                version: crate::PROTOCOL_VERSION,
                message_type: message_type as u8,
                flags: 0,
                transaction_id,
                payload_len,
            },
            payload,
        }
    }

    /// The encoded header, checksum included: sent before the payload, it
    /// lets a sender write the payload from where it already is (no copy).
    pub fn encode_header(&self) -> [u8; HEADER_LEN] {
        debug_assert_eq!(self.header.payload_len as usize, self.payload.len());
        let mut head = [0u8; HEADER_LEN];
        head[0..4].copy_from_slice(&MAGIC);
        head[4] = self.header.version;
        head[5] = self.header.message_type;
        head[6..8].copy_from_slice(&self.header.flags.to_le_bytes());
        head[8..16].copy_from_slice(&self.header.transaction_id.to_le_bytes());
        head[16..20].copy_from_slice(&self.header.payload_len.to_le_bytes());
        let crc = crc32c::crc32c_append(crc32c::crc32c(&head[..20]), &self.payload);
        head[20..24].copy_from_slice(&crc.to_le_bytes());
        head
    }

    /// Appends the encoded frame to `out`.
    pub fn encode(&self, out: &mut BytesMut) {
        out.reserve(HEADER_LEN + self.payload.len());
        out.put_slice(&self.encode_header());
        out.put_slice(&self.payload);
    }

    pub fn to_bytes(&self) -> Bytes {
        let mut out = BytesMut::new();
        self.encode(&mut out);
        out.freeze()
    }
}

/// Splits frames off a receive buffer.
#[derive(Clone, Debug)]
pub struct FrameDecoder {
    max_payload: u32,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder { max_payload: DEFAULT_MAX_PAYLOAD }
    }
}

impl FrameDecoder {
    pub fn with_max_payload(max_payload: u32) -> FrameDecoder {
        FrameDecoder { max_payload }
    }

    /// The next complete frame in `buffer`, removed from it; `Ok(None)` when
    /// more bytes are needed. After an error the connection must be closed:
    /// the stream has lost its framing.
    pub fn decode(&self, buffer: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        if buffer.len() < HEADER_LEN {
            // Reject garbage as early as its first bytes allow.
            let seen = buffer.len().min(4);
            if buffer[..seen] != MAGIC[..seen] {
                let mut magic = [0u8; 4];
                magic[..seen].copy_from_slice(&buffer[..seen]);
                return Err(FrameError::BadMagic(magic));
            }
            return Ok(None);
        }
        let mut head = &buffer[..HEADER_LEN];
        let mut magic = [0u8; 4];
        head.copy_to_slice(&mut magic);
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let version = head.get_u8();
        let message_type = head.get_u8();
        let flags = head.get_u16_le();
        let transaction_id = head.get_u64_le();
        let payload_len = head.get_u32_le();
        let stored = head.get_u32_le();
        if payload_len > self.max_payload {
            return Err(FrameError::TooLarge { len: payload_len, limit: self.max_payload });
        }
        let total = HEADER_LEN + payload_len as usize;
        if buffer.len() < total {
            buffer.reserve(total - buffer.len());
            return Ok(None);
        }
        let computed = crc32c::crc32c_append(crc32c::crc32c(&buffer[..20]), &buffer[HEADER_LEN..total]);
        if computed != stored {
            return Err(FrameError::Checksum { stored, computed });
        }
        let mut frame = buffer.split_to(total);
        let payload = frame.split_off(HEADER_LEN).freeze();
        Ok(Some(Frame { header: FrameHeader { version, message_type, flags, transaction_id, payload_len }, payload }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn frame_strategy() -> impl Strategy<Value = Frame> {
        (any::<u8>(), any::<u16>(), any::<u64>(), proptest::collection::vec(any::<u8>(), 0..3000)).prop_map(
            |(message_type, flags, transaction_id, payload)| {
                let mut frame = Frame::new(MessageType::Ping, transaction_id, Bytes::from(payload));
                frame.header.message_type = message_type;
                frame.header.flags = flags;
                frame
            },
        )
    }

    proptest! {
        #[test]
        fn frames_round_trip_in_any_chunking(frames in proptest::collection::vec(frame_strategy(), 1..8), chunk in 1usize..700) {
            let mut wire = BytesMut::new();
            for frame in &frames {
                frame.encode(&mut wire);
            }
            let decoder = FrameDecoder::default();
            let mut buffer = BytesMut::new();
            let mut decoded = Vec::new();
            for piece in wire.chunks(chunk) {
                buffer.extend_from_slice(piece);
                while let Some(frame) = decoder.decode(&mut buffer).unwrap() {
                    decoded.push(frame);
                }
            }
            prop_assert_eq!(decoded, frames);
            prop_assert!(buffer.is_empty());
        }

        #[test]
        fn any_flipped_bit_is_detected(frame in frame_strategy(), bit in any::<usize>()) {
            let mut wire = BytesMut::new();
            frame.encode(&mut wire);
            let bit = bit % (wire.len() * 8);
            wire[bit / 8] ^= 1 << (bit % 8);
            // Flips in the length field may leave the frame incomplete; that is not acceptance.
            if let Ok(Some(decoded)) = FrameDecoder::default().decode(&mut wire) {
                prop_assert!(false, "corrupt frame accepted: {:?}", decoded.header);
            }
        }

        #[test]
        fn decoder_never_panics_on_garbage(bytes in proptest::collection::vec(any::<u8>(), 0..4000), limit in 0u32..5000) {
            let mut buffer = BytesMut::from(&bytes[..]);
            let decoder = FrameDecoder::with_max_payload(limit);
            while let Ok(Some(_)) = decoder.decode(&mut buffer) {}
        }
    }

    #[test]
    fn oversized_payload_is_refused_from_the_header_alone() {
        let frame = Frame::new(MessageType::Ping, 1, Bytes::from(vec![0u8; 100]));
        let mut wire = BytesMut::new();
        frame.encode(&mut wire);
        wire.truncate(HEADER_LEN);
        assert_eq!(
            FrameDecoder::with_max_payload(99).decode(&mut wire),
            Err(FrameError::TooLarge { len: 100, limit: 99 })
        );
    }

    #[test]
    fn payload_is_a_slice_of_the_receive_buffer() {
        let frame = Frame::new(MessageType::Ping, 7, Bytes::from(vec![9u8; 4096]));
        let mut buffer = BytesMut::new();
        frame.encode(&mut buffer);
        let base = buffer.as_ptr() as usize;
        let decoded = FrameDecoder::default().decode(&mut buffer).unwrap().unwrap();
        assert_eq!(decoded.payload.as_ptr() as usize, base + HEADER_LEN, "the payload was copied");
    }
}
