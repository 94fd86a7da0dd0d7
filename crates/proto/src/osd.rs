//! The OSD's messages: client operations and their replies, and the
//! replication acknowledgement. (A replication request's payload is the
//! operation-log entry itself, in the log's own checksummed encoding, so the
//! replica logs exactly the bytes the primary logged.)
//!
//! Fixed little-endian layouts, decoded as [`Bytes`] slices of the frame
//! payload: object data is never copied on the way in. Every decoder
//! returns an error on malformed input and never panics.
//!
//! ```text
//! OpRequest  0 kind u8   1 flags u8   2 object length u16   4 pool u32   8 pg u32
//!            12 length u32 (bytes to read; a write's data length)   16 map epoch u64
//!            24 offset u64 (a truncate's new size)   32 object   then data (writes)
//! OpReply    0 status u8   1..8 reserved   8 map epoch u64   16 data (reads) or error text
//! RepReply   0 status u8   1..4 reserved   4 pg u32   8 seq u64
//! ```

use bytes::{BufMut, Bytes, BytesMut};

use crate::frame::{Frame, MessageType};

/// Longest object name: the store's 200-byte key less the 4-byte PG prefix.
pub const MAX_OBJECT_NAME: usize = 196;
/// Largest read or write in one request.
pub const MAX_IO_BYTES: u32 = 4 << 20;

const REQUEST_HEADER: usize = 32;
const REPLY_HEADER: usize = 16;
const REP_REPLY_LEN: usize = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum OpKind {
    Read = 1,
    Write = 2,
    /// Sets the object's size to `offset`.
    Truncate = 3,
    Delete = 4,
}

impl OpKind {
    pub fn from_u8(value: u8) -> Option<OpKind> {
        Some(match value {
            1 => OpKind::Read,
            2 => OpKind::Write,
            3 => OpKind::Truncate,
            4 => OpKind::Delete,
            _ => return None,
        })
    }

    pub fn is_mutation(self) -> bool {
        self != OpKind::Read
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Status {
    Ok = 0,
    /// The object does not exist.
    NotFound = 1,
    /// This OSD is not the PG's primary at its map epoch (in the reply):
    /// fetch a newer map and resend.
    WrongOsd = 2,
    /// Transient (a replica is unreachable, the OSD is starting): resend later.
    Retry = 3,
    /// The request is malformed or out of limits; resending will not help.
    Invalid = 4,
    /// The store failed; the text says how.
    Io = 5,
}

impl Status {
    pub fn from_u8(value: u8) -> Option<Status> {
        Some(match value {
            0 => Status::Ok,
            1 => Status::NotFound,
            2 => Status::WrongOsd,
            3 => Status::Retry,
            4 => Status::Invalid,
            5 => Status::Io,
            _ => return None,
        })
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("message is {got} bytes, shorter than its {need}-byte layout")]
    Short { need: usize, got: usize },
    #[error("unknown {what} {value}")]
    Unknown { what: &'static str, value: u8 },
    #[error("object name of {0} bytes (limit {MAX_OBJECT_NAME}, at least 1)")]
    ObjectName(usize),
    #[error("I/O of {0} bytes exceeds the {MAX_IO_BYTES}-byte limit")]
    TooLarge(u64),
    #[error("{0}")]
    Inconsistent(&'static str),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpRequest {
    pub kind: OpKind,
    pub pool: u32,
    pub pg: u32,
    /// The client's map epoch when it chose this OSD.
    pub map_epoch: u64,
    pub object: Bytes,
    pub offset: u64,
    /// Bytes to read (reads); writes carry `data` instead.
    pub length: u32,
    pub data: Bytes,
}

impl OpRequest {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        let mut out = BytesMut::with_capacity(REQUEST_HEADER + self.object.len() + self.data.len());
        out.put_u8(self.kind as u8);
        out.put_u8(0);
        out.put_u16_le(self.object.len() as u16);
        out.put_u32_le(self.pool);
        out.put_u32_le(self.pg);
        let length = if self.kind == OpKind::Write { self.data.len() as u32 } else { self.length };
        out.put_u32_le(length);
        out.put_u64_le(self.map_epoch);
        out.put_u64_le(self.offset);
        out.put_slice(&self.object);
        out.put_slice(&self.data);
        Frame::new(MessageType::OsdOp, transaction_id, out.freeze())
    }

    pub fn decode(payload: &Bytes) -> Result<OpRequest, DecodeError> {
        if payload.len() < REQUEST_HEADER {
            return Err(DecodeError::Short { need: REQUEST_HEADER, got: payload.len() });
        }
        let kind = OpKind::from_u8(payload[0]).ok_or(DecodeError::Unknown { what: "operation", value: payload[0] })?;
        let object_len = u16::from_le_bytes([payload[2], payload[3]]) as usize;
        if object_len == 0 || object_len > MAX_OBJECT_NAME {
            return Err(DecodeError::ObjectName(object_len));
        }
        let length = le_u32(payload, 12);
        if length > MAX_IO_BYTES {
            return Err(DecodeError::TooLarge(length as u64));
        }
        let object_end = REQUEST_HEADER + object_len;
        if payload.len() < object_end {
            return Err(DecodeError::Short { need: object_end, got: payload.len() });
        }
        let data = payload.slice(object_end..);
        match kind {
            OpKind::Write if data.len() != length as usize => {
                return Err(DecodeError::Inconsistent("write length differs from its data"))
            }
            OpKind::Read | OpKind::Truncate | OpKind::Delete if !data.is_empty() => {
                return Err(DecodeError::Inconsistent("only writes carry data"))
            }
            _ => {}
        }
        let offset = le_u64(payload, 24);
        if offset.checked_add(length as u64).is_none() {
            return Err(DecodeError::Inconsistent("offset + length overflows"));
        }
        Ok(OpRequest {
            kind,
            pool: le_u32(payload, 4),
            pg: le_u32(payload, 8),
            map_epoch: le_u64(payload, 16),
            object: payload.slice(REQUEST_HEADER..object_end),
            offset,
            length,
            data,
        })
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpReply {
    pub status: Status,
    /// The OSD's map epoch.
    pub map_epoch: u64,
    /// Read data, or the error's text.
    pub data: Bytes,
}

impl OpReply {
    pub fn error(status: Status, map_epoch: u64, message: impl std::fmt::Display) -> OpReply {
        OpReply { status, map_epoch, data: Bytes::from(message.to_string()) }
    }

    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        let mut out = BytesMut::with_capacity(REPLY_HEADER + self.data.len());
        out.put_u8(self.status as u8);
        out.put_bytes(0, 7);
        out.put_u64_le(self.map_epoch);
        out.put_slice(&self.data);
        Frame::new(MessageType::OsdOpReply, transaction_id, out.freeze())
    }

    pub fn decode(payload: &Bytes) -> Result<OpReply, DecodeError> {
        if payload.len() < REPLY_HEADER {
            return Err(DecodeError::Short { need: REPLY_HEADER, got: payload.len() });
        }
        let status = Status::from_u8(payload[0]).ok_or(DecodeError::Unknown { what: "status", value: payload[0] })?;
        Ok(OpReply { status, map_epoch: le_u64(payload, 8), data: payload.slice(REPLY_HEADER..) })
    }

    /// The error text of a failed reply.
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.data).into_owned()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RepReply {
    pub status: Status,
    pub pg: u32,
    pub seq: u64,
}

impl RepReply {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        let mut out = BytesMut::with_capacity(REP_REPLY_LEN);
        out.put_u8(self.status as u8);
        out.put_bytes(0, 3);
        out.put_u32_le(self.pg);
        out.put_u64_le(self.seq);
        Frame::new(MessageType::RepOpReply, transaction_id, out.freeze())
    }

    pub fn decode(payload: &[u8]) -> Result<RepReply, DecodeError> {
        if payload.len() != REP_REPLY_LEN {
            return Err(DecodeError::Short { need: REP_REPLY_LEN, got: payload.len() });
        }
        let status = Status::from_u8(payload[0]).ok_or(DecodeError::Unknown { what: "status", value: payload[0] })?;
        Ok(RepReply { status, pg: le_u32(payload, 4), seq: le_u64(payload, 8) })
    }
}

fn le_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

fn le_u64(bytes: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(bytes[at..at + 8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn request_strategy() -> impl Strategy<Value = OpRequest> {
        (
            1u8..5,
            any::<u32>(),
            any::<u32>(),
            any::<u64>(),
            proptest::collection::vec(any::<u8>(), 1..MAX_OBJECT_NAME),
            0u64..1 << 40,
            0u32..1 << 20,
            proptest::collection::vec(any::<u8>(), 0..300),
        )
            .prop_map(|(kind, pool, pg, map_epoch, object, offset, length, data)| {
                let kind = OpKind::from_u8(kind).expect("1..5");
                let (length, data) = match kind {
                    OpKind::Write => (data.len() as u32, Bytes::from(data)),
                    OpKind::Read => (length, Bytes::new()),
                    _ => (0, Bytes::new()),
                };
                OpRequest { kind, pool, pg, map_epoch, object: Bytes::from(object), offset, length, data }
            })
    }

    proptest! {
        #[test]
        fn requests_round_trip(request in request_strategy(), txid in any::<u64>()) {
            let frame = request.to_frame(txid);
            prop_assert_eq!(frame.header.transaction_id, txid);
            prop_assert_eq!(OpRequest::decode(&frame.payload), Ok(request));
        }

        #[test]
        fn replies_round_trip(status in 0u8..6, epoch in any::<u64>(), data in proptest::collection::vec(any::<u8>(), 0..100)) {
            let reply = OpReply { status: Status::from_u8(status).expect("0..6"), map_epoch: epoch, data: Bytes::from(data) };
            prop_assert_eq!(OpReply::decode(&reply.to_frame(1).payload), Ok(reply));
            let rep = RepReply { status: Status::Ok, pg: status as u32, seq: epoch };
            prop_assert_eq!(RepReply::decode(&rep.to_frame(1).payload), Ok(rep));
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let bytes = Bytes::from(bytes);
            let _ = OpRequest::decode(&bytes);
            let _ = OpReply::decode(&bytes);
            let _ = RepReply::decode(&bytes);
        }
    }

    #[test]
    fn refuses_lies_about_lengths() {
        let request = OpRequest {
            kind: OpKind::Write,
            pool: 1,
            pg: 2,
            map_epoch: 3,
            object: Bytes::from_static(b"obj"),
            offset: 0,
            length: 0,
            data: Bytes::from_static(b"data"),
        };
        let mut payload = BytesMut::from(&request.to_frame(1).payload[..]);
        payload[12] = 9; // claims 9 bytes of data, carries 4
        assert!(matches!(OpRequest::decode(&payload.freeze()), Err(DecodeError::Inconsistent(_))));
        let mut payload = BytesMut::from(&request.to_frame(1).payload[..]);
        payload[2] = 0; // empty object name
        payload[3] = 0;
        assert_eq!(OpRequest::decode(&payload.freeze()), Err(DecodeError::ObjectName(0)));
    }
}
