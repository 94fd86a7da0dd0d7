//! Binary encoding of maps and deltas.
//!
//! ```text
//! 0  magic [4]: "DPXM" (map) or "DPXD" (delta)
//! 4  format version u16 (little-endian)
//! 6  body: postcard
//! .. crc32c u32 of everything before it
//! ```
//! postcard is compact (varints), and its decoder returns errors on
//! malformed input. It caps preallocation, so a hostile length prefix
//! cannot exhaust memory.

use serde::{de::DeserializeOwned, Serialize};

use crate::{ClusterMap, MapDelta};

/// 2: temporary acting sets (`pg_temp`); 3: last active sets (`active_sets`);
/// 4: fullness; 5: upmap items and the balancer's spread; 6: erasure-coded
/// pools; 7: deduplicated and chunk pools; 8: a tier's chunking; 9:
/// eventual pools; 10: pools' default image limits; 11: images' QoS settings.
pub const FORMAT_VERSION: u16 = 11;
const MAP_MAGIC: [u8; 4] = *b"DPXM";
const DELTA_MAGIC: [u8; 4] = *b"DPXD";

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("not an encoded {0} (bad magic or too short)")]
    NotThis(&'static str),
    #[error("format version {0}; this build reads version {FORMAT_VERSION}")]
    Version(u16),
    #[error("checksum mismatch")]
    Checksum,
    #[error("malformed body: {0}")]
    Body(String),
}

fn encode<T: Serialize>(magic: [u8; 4], value: &T) -> Vec<u8> {
    let mut out = magic.to_vec();
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    postcard::to_io(value, &mut out).expect("writing to a Vec cannot fail");
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn decode<T: DeserializeOwned>(magic: [u8; 4], what: &'static str, bytes: &[u8]) -> Result<T, DecodeError> {
    if bytes.len() < 10 || bytes[..4] != magic {
        return Err(DecodeError::NotThis(what));
    }
    let (body, crc) = bytes.split_at(bytes.len() - 4);
    if crc32c::crc32c(body).to_le_bytes() != crc {
        return Err(DecodeError::Checksum);
    }
    let version = u16::from_le_bytes([body[4], body[5]]);
    if version != FORMAT_VERSION {
        return Err(DecodeError::Version(version));
    }
    let (value, rest) = postcard::take_from_bytes(&body[6..]).map_err(|e| DecodeError::Body(e.to_string()))?;
    if !rest.is_empty() {
        return Err(DecodeError::Body("trailing bytes".into()));
    }
    Ok(value)
}

pub fn encode_map(map: &ClusterMap) -> Vec<u8> {
    encode(MAP_MAGIC, map)
}

/// Decodes and validates a map.
pub fn decode_map(bytes: &[u8]) -> Result<ClusterMap, DecodeError> {
    let map: ClusterMap = decode(MAP_MAGIC, "cluster map", bytes)?;
    map.validate().map_err(DecodeError::Body)?;
    Ok(map)
}

pub fn encode_delta(delta: &MapDelta) -> Vec<u8> {
    encode(DELTA_MAGIC, delta)
}

pub fn decode_delta(bytes: &[u8]) -> Result<MapDelta, DecodeError> {
    decode(DELTA_MAGIC, "map delta", bytes)
}
