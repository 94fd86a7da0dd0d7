//! Omap requests' payloads: an object's ordered key-value pairs (the dedup
//! tier keeps an object's chunk map there, issue 27).
//!
//! The same bytes travel in a client's request, in the PG log's entry and
//! to the replicas, so every decoder here sees hostile input and answers an
//! error, never a panic. Little-endian:
//! ```text
//! entries  count u32, then per entry: key length u8, key, value length u16, value
//! keys     count u32, then per key: key length u8, key
//! range    start length u8, start, has end u8 (0 or 1), [end length u8, end]
//! ```
//! Keys are 1 to [`MAX_KEY_LEN`] bytes, in strictly increasing order in an
//! `entries` or `keys` payload (a request that names a key twice is
//! refused, so that what it does never depends on an order); values are at
//! most [`MAX_VALUE_LEN`] bytes. An `entries` payload to set carries at most
//! [`MAX_BYTES`] of keys and values (the object's whole omap is held to the
//! same total by its store).

use crate::osd::DecodeError;

/// Longest omap key (the store's `MAX_OMAP_KEY_LEN`).
pub const MAX_KEY_LEN: usize = 255;
/// Longest omap value (the store's `MAX_OMAP_VALUE_LEN`).
pub const MAX_VALUE_LEN: usize = 4096;
/// Keys and values of one object's omap together (the store's `MAX_OMAP_BYTES`).
pub const MAX_BYTES: usize = 64 << 10;

/// (key, value) pairs, sorted by key.
pub type Entries = Vec<(Vec<u8>, Vec<u8>)>;

/// A range of keys: `[start, end)`, `end = None` reaching the last.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyRange {
    pub start: Vec<u8>,
    pub end: Option<Vec<u8>>,
}

impl KeyRange {
    pub fn contains(&self, key: &[u8]) -> bool {
        key >= self.start.as_slice() && self.end.as_deref().is_none_or(|end| key < end)
    }
}

pub fn encode_entries(entries: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    debug_assert!(entries.windows(2).all(|w| w[0].0 < w[1].0), "omap entries unsorted");
    let mut out = Vec::with_capacity(4 + entries.iter().map(|(k, v)| 3 + k.len() + v.len()).sum::<usize>());
    out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
    for (key, value) in entries {
        debug_assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN && value.len() <= MAX_VALUE_LEN);
        out.push(key.len() as u8);
        out.extend_from_slice(key);
        out.extend_from_slice(&(value.len() as u16).to_le_bytes());
        out.extend_from_slice(value);
    }
    out
}

pub fn decode_entries(bytes: &[u8]) -> Result<Entries, DecodeError> {
    let mut r = Reader(bytes);
    let count = r.count(4)?;
    let mut entries: Entries = Vec::with_capacity(count);
    for _ in 0..count {
        let key = r.key()?;
        let len = u16::from_le_bytes(r.take(2)?.try_into().expect("two bytes")) as usize;
        if len > MAX_VALUE_LEN {
            return Err(DecodeError::Inconsistent("an omap value longer than 4096 bytes"));
        }
        let value = r.take(len)?.to_vec();
        if entries.last().is_some_and(|(last, _)| *last >= key) {
            return Err(DecodeError::Inconsistent("omap keys out of order or repeated"));
        }
        entries.push((key, value));
    }
    r.end()?;
    Ok(entries)
}

/// Decodes entries to set: also at most [`MAX_BYTES`] of keys and values.
pub fn decode_entries_to_set(bytes: &[u8]) -> Result<Entries, DecodeError> {
    let entries = decode_entries(bytes)?;
    if entries.is_empty() {
        return Err(DecodeError::Inconsistent("an omap set of no entries"));
    }
    if entries.iter().map(|(k, v)| k.len() + v.len()).sum::<usize>() > MAX_BYTES {
        return Err(DecodeError::Inconsistent("an omap set larger than an object's omap may be"));
    }
    Ok(entries)
}

pub fn encode_keys(keys: &[Vec<u8>]) -> Vec<u8> {
    debug_assert!(keys.windows(2).all(|w| w[0] < w[1]), "omap keys unsorted");
    let mut out = Vec::with_capacity(4 + keys.iter().map(|k| 1 + k.len()).sum::<usize>());
    out.extend_from_slice(&(keys.len() as u32).to_le_bytes());
    for key in keys {
        out.push(key.len() as u8);
        out.extend_from_slice(key);
    }
    out
}

pub fn decode_keys(bytes: &[u8]) -> Result<Vec<Vec<u8>>, DecodeError> {
    let mut r = Reader(bytes);
    let count = r.count(2)?;
    if count == 0 {
        return Err(DecodeError::Inconsistent("no omap keys"));
    }
    let mut keys: Vec<Vec<u8>> = Vec::with_capacity(count);
    for _ in 0..count {
        let key = r.key()?;
        if keys.last().is_some_and(|last| *last >= key) {
            return Err(DecodeError::Inconsistent("omap keys out of order or repeated"));
        }
        keys.push(key);
    }
    r.end()?;
    Ok(keys)
}

pub fn encode_range(range: &KeyRange) -> Vec<u8> {
    let mut out = Vec::with_capacity(3 + range.start.len() + range.end.as_ref().map_or(0, Vec::len));
    out.push(range.start.len() as u8);
    out.extend_from_slice(&range.start);
    match &range.end {
        Some(end) => {
            out.push(1);
            out.push(end.len() as u8);
            out.extend_from_slice(end);
        }
        None => out.push(0),
    }
    out
}

pub fn decode_range(bytes: &[u8]) -> Result<KeyRange, DecodeError> {
    let mut r = Reader(bytes);
    let start_len = r.take(1)?[0] as usize;
    let start = r.take(start_len)?.to_vec();
    let end = match r.take(1)?[0] {
        0 => None,
        1 => {
            let end_len = r.take(1)?[0] as usize;
            Some(r.take(end_len)?.to_vec())
        }
        _ => return Err(DecodeError::Inconsistent("an omap range's end flag is 0 or 1")),
    };
    r.end()?;
    Ok(KeyRange { start, end })
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.0.len() < n {
            return Err(DecodeError::Short { need: n, got: self.0.len() });
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// A count of items of `min_len` bytes at least: one the rest of the
    /// payload cannot hold is refused before anything is allocated for it.
    fn count(&mut self, min_len: usize) -> Result<usize, DecodeError> {
        let count = u32::from_le_bytes(self.take(4)?.try_into().expect("four bytes")) as usize;
        if count.saturating_mul(min_len) > self.0.len() {
            return Err(DecodeError::Inconsistent("more omap items than the payload holds"));
        }
        Ok(count)
    }

    fn key(&mut self) -> Result<Vec<u8>, DecodeError> {
        let len = self.take(1)?[0] as usize;
        if len == 0 {
            return Err(DecodeError::Inconsistent("an empty omap key"));
        }
        Ok(self.take(len)?.to_vec())
    }

    fn end(&self) -> Result<(), DecodeError> {
        match self.0.is_empty() {
            true => Ok(()),
            false => Err(DecodeError::Inconsistent("bytes after an omap payload")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entries() -> impl Strategy<Value = Entries> {
        proptest::collection::btree_map(
            proptest::collection::vec(any::<u8>(), 1..=MAX_KEY_LEN),
            proptest::collection::vec(any::<u8>(), 0..300),
            0..20,
        )
        .prop_map(|map| map.into_iter().collect())
    }

    proptest! {
        #[test]
        fn payloads_round_trip(entries in entries(), start in proptest::collection::vec(any::<u8>(), 0..=255), end in proptest::option::of(proptest::collection::vec(any::<u8>(), 0..=255))) {
            prop_assert_eq!(decode_entries(&encode_entries(&entries)).unwrap(), entries.clone());
            let keys: Vec<Vec<u8>> = entries.iter().map(|(k, _)| k.clone()).collect();
            if !keys.is_empty() {
                prop_assert_eq!(decode_keys(&encode_keys(&keys)).unwrap(), keys);
            }
            let range = KeyRange { start, end };
            prop_assert_eq!(decode_range(&encode_range(&range)).unwrap(), range);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_entries(&bytes);
            let _ = decode_entries_to_set(&bytes);
            let _ = decode_keys(&bytes);
            let _ = decode_range(&bytes);
        }
    }

    #[test]
    fn repeated_unsorted_empty_and_oversized_payloads_are_refused() {
        let two = |a: &[u8], b: &[u8]| encode_entries(&[(a.to_vec(), vec![]), (b.to_vec(), vec![])]);
        assert!(decode_entries(&two(b"a", b"b")).is_ok());
        // The encoder asserts order; build the bad payloads by hand.
        let mut repeated = 2u32.to_le_bytes().to_vec();
        repeated.extend([1, b'a', 0, 0, 1, b'a', 0, 0]);
        assert!(decode_entries(&repeated).is_err());
        let mut empty_key = 1u32.to_le_bytes().to_vec();
        empty_key.extend([0, 0, 0]);
        assert!(decode_entries(&empty_key).is_err());
        let mut long_value = 1u32.to_le_bytes().to_vec();
        long_value.extend([1, b'a']);
        long_value.extend(((MAX_VALUE_LEN + 1) as u16).to_le_bytes());
        long_value.extend(vec![0; MAX_VALUE_LEN + 1]);
        assert!(decode_entries(&long_value).is_err());
        let huge_count = u32::MAX.to_le_bytes();
        assert!(decode_entries(&huge_count).is_err() && decode_keys(&huge_count).is_err());
        assert!(decode_entries_to_set(&encode_entries(&[])).is_err(), "a set of nothing");
        let too_much: Entries = (0..17u8).map(|i| (vec![i + 1], vec![i; MAX_VALUE_LEN])).collect();
        assert!(decode_entries_to_set(&encode_entries(&too_much)).is_err());
        assert!(decode_keys(&encode_keys(&[])).is_err(), "no keys");
        let mut trailing = encode_range(&KeyRange { start: b"a".to_vec(), end: None });
        trailing.push(0);
        assert!(decode_range(&trailing).is_err());
        assert!(decode_range(&[0, 2]).is_err(), "an end flag of 2");
    }
}
