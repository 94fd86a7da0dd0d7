//! # duplex-dedup: the dedup tier's logic, without I/O
//!
//! The dedup tier (issue 27, docs/DEDUP.md, the dissertation's chapter 4)
//! moves the chunks of a base pool's objects into a chunk pool of
//! content-addressed objects. This crate holds what needs no socket and no
//! store, so that the OSD and the simulator run the same code:
//!
//! - [`Fingerprint`]: a chunk's BLAKE3 hash, and the chunk object's name.
//! - [`chunkmap`]: a base object's chunk map entries (omap key and value)
//!   and a chunk object's references (omap keys), with their codecs.
//! - [`frame`]: a chunk object's bytes, raw or compressed, checked on the way back.
//! - [`plan`]: what one engine pass over one object must do, in order.
//! - [`rate`]: how many engine I/Os the foreground load allows (§4.4.2).
//! - [`locality`]: why dedup must be global (the dissertation's table 2.1).

pub mod chunkmap;
pub mod cut;
pub mod frame;
pub mod locality;
pub mod plan;
pub mod rate;

pub use chunkmap::{ChunkEntry, Reference};
pub use plan::{plan_object, Step};
pub use rate::RateControl;

/// A chunk's content fingerprint: BLAKE3 (a cryptographic hash: two chunks
/// with one fingerprint are taken as equal, as every dedup system does).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub [u8; 32]);

impl Fingerprint {
    pub fn of(bytes: &[u8]) -> Fingerprint {
        Fingerprint(*blake3::hash(bytes).as_bytes())
    }

    /// The chunk object's name in the chunk pool: 64 lowercase hex digits
    /// (object names hold no zero byte, and the name's hash places it).
    pub fn object_name(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The fingerprint a chunk object's name stands for.
    pub fn from_object_name(name: &[u8]) -> Option<Fingerprint> {
        if name.len() != 64 {
            return None;
        }
        let mut out = [0u8; 32];
        for (i, pair) in name.chunks(2).enumerate() {
            let digit = |c: u8| (c as char).to_digit(16).filter(|_| !c.is_ascii_uppercase());
            out[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
        }
        Some(Fingerprint(out))
    }
}

impl std::fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Fingerprint({}…)", &self.object_name()[..12])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_names_its_chunk_object_and_back() {
        let print = Fingerprint::of(b"hello");
        let name = print.object_name();
        assert_eq!(name.len(), 64);
        assert_eq!(Fingerprint::from_object_name(name.as_bytes()), Some(print));
        assert_ne!(Fingerprint::of(b"hello!"), print);
        assert_eq!(Fingerprint::from_object_name(b"zz"), None);
        assert_eq!(Fingerprint::from_object_name(name.to_uppercase().as_bytes()), None, "one spelling per chunk");
        assert_eq!(Fingerprint::from_object_name(&[b'g'; 64]), None);
    }
}
