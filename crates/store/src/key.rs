//! Object keys: byte strings of 1..=[`MAX_KEY_LEN`] bytes, ordered bytewise.
//!
//! The first four bytes, big-endian, are the key's **group** (the OSD puts the
//! placement group there), so all keys of one group sort together and live in
//! one partition. Keys of up to 30 bytes are stored inline: the in-memory
//! index costs no heap allocation per key for the common case.

use std::borrow::Borrow;
use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};

use crate::{StoreError, MAX_KEY_LEN};

const INLINE_CAPACITY: usize = 30;

#[derive(Clone)]
pub struct Key(Repr);

#[derive(Clone)]
enum Repr {
    Inline { len: u8, bytes: [u8; INLINE_CAPACITY] },
    Heap(Box<[u8]>),
}

const _: () = assert!(std::mem::size_of::<Key>() == 32);

impl Key {
    /// A key from bytes; fails on an empty key or one longer than [`MAX_KEY_LEN`].
    pub fn new(bytes: &[u8]) -> Result<Key, StoreError> {
        if bytes.is_empty() || bytes.len() > MAX_KEY_LEN {
            return Err(StoreError::invalid(format!("key length {} is outside 1..={MAX_KEY_LEN}", bytes.len())));
        }
        if bytes.len() <= INLINE_CAPACITY {
            let mut inline = [0u8; INLINE_CAPACITY];
            inline[..bytes.len()].copy_from_slice(bytes);
            Ok(Key(Repr::Inline { len: bytes.len() as u8, bytes: inline }))
        } else {
            Ok(Key(Repr::Heap(bytes.into())))
        }
    }

    /// A key made of a group id followed by a name: the layout the OSD uses.
    pub fn in_group(group: u32, name: &[u8]) -> Result<Key, StoreError> {
        let len = 4 + name.len();
        let key = if len <= INLINE_CAPACITY {
            let mut bytes = [0u8; INLINE_CAPACITY];
            bytes[..4].copy_from_slice(&group.to_be_bytes());
            bytes[4..len].copy_from_slice(name);
            Key::new(&bytes[..len])
        } else if len > MAX_KEY_LEN {
            Err(StoreError::invalid(format!("key length {len} is outside 1..={MAX_KEY_LEN}")))
        } else {
            // Built where it stays: one allocation per key, not a
            // buffer and then its copy (a flush makes a key per entry).
            let mut bytes = Vec::with_capacity(len);
            bytes.extend_from_slice(&group.to_be_bytes());
            bytes.extend_from_slice(name);
            debug_assert_eq!(bytes.capacity(), len, "boxing reallocates nothing");
            Ok(Key(Repr::Heap(bytes.into_boxed_slice())))
        };
        debug_assert!(key.as_ref().ok().is_none_or(|k| k.group() == group), "the key lost its group");
        debug_assert!(key.as_ref().ok().is_none_or(|k| k.as_bytes()[4..] == *name), "the key lost its name");
        key
    }

    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => &bytes[..*len as usize],
            Repr::Heap(bytes) => bytes,
        }
    }

    /// The key's group: its first four bytes, big-endian (zero-padded when shorter).
    pub fn group(&self) -> u32 {
        group_of(self.as_bytes())
    }
}

/// The group of raw key bytes (see [`Key::group`]).
pub fn group_of(bytes: &[u8]) -> u32 {
    let mut first = [0u8; 4];
    let n = bytes.len().min(4);
    first[..n].copy_from_slice(&bytes[..n]);
    u32::from_be_bytes(first)
}

impl Borrow<[u8]> for Key {
    fn borrow(&self) -> &[u8] {
        self.as_bytes()
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}
impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_bytes().hash(state)
    }
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key(")?;
        for byte in self.as_bytes() {
            if byte.is_ascii_graphic() {
                write!(f, "{}", *byte as char)?;
            } else {
                write!(f, "\\x{byte:02x}")?;
            }
        }
        write!(f, ")")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_heap_keys_compare_by_bytes() {
        let short = Key::new(b"abc").unwrap();
        let long = Key::new(&[b'a'; 40]).unwrap();
        assert!(short > long, "'abc' sorts after 'aaaa...'");
        assert_eq!(Key::new(b"abc").unwrap(), short);
        assert_eq!(short.as_bytes(), b"abc");
        assert_eq!(long.as_bytes().len(), 40);
    }

    #[test]
    fn rejects_empty_and_overlong_keys() {
        assert!(Key::new(b"").is_err());
        assert!(Key::new(&[0u8; MAX_KEY_LEN + 1]).is_err());
        assert!(Key::new(&[0u8; MAX_KEY_LEN]).is_ok());
    }

    #[test]
    fn a_grouped_key_is_its_group_then_its_name_at_every_length() {
        for len in 0..=MAX_KEY_LEN - 4 + 2 {
            let name: Vec<u8> = (0..len).map(|i| i as u8).collect();
            let mut whole = 0x0a0b0c0du32.to_be_bytes().to_vec();
            whole.extend_from_slice(&name);
            match Key::in_group(0x0a0b0c0d, &name) {
                Ok(key) => assert_eq!(key, Key::new(&whole).unwrap(), "name of {len} bytes"),
                Err(_) => assert!(whole.len() > MAX_KEY_LEN, "name of {len} bytes refused"),
            }
        }
    }

    #[test]
    fn group_is_the_big_endian_prefix() {
        assert_eq!(Key::in_group(0x01020304, b"x").unwrap().group(), 0x01020304);
        assert_eq!(Key::new(&[0xff]).unwrap().group(), 0xff00_0000);
    }
}
