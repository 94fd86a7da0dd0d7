//! The deduplication tier's requests to a base pool's primary
//! (docs/DEDUP.md): the engine's read of an object with its chunk map, and
//! its guarded changes of the object. The same bytes travel from the
//! engine, into the PG log (the actions, without the guard) and to the
//! replicas; every decoder answers an error on hostile input, never a
//! panic. Little-endian:
//! ```text
//! read reply  interval u64, generation u64, exists u8 (0 or 1), size u64, entries length u32,
//!             entries (crate::omap entries: the chunk map's records in
//!             the range), then the object's bytes of the range
//! update      interval u64, generation u64, then the actions:
//! actions     count u32, then per action a tag u8 and its fields:
//!             1 set entry     key length u8, key, value length u16, value
//!             2 remove entry  key length u8, key
//!             3 zero          offset u64, length u64
//!             4 write         offset u64, length u32, bytes
//! ```
//! An update is applied, all of it or nothing, only if the object has not
//! changed since the read that returned its generation (the primary counts
//! its mutations) in the same interval: it is the engine's
//! compare-and-swap.

use crate::omap::{Entries, MAX_KEY_LEN, MAX_VALUE_LEN};
use crate::osd::{DecodeError, MAX_IO_BYTES};

/// What the primary says an object's state was at a tier read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Guard {
    /// The PG's interval (the map epoch it began at).
    pub interval: u64,
    /// The object's mutations counted by the primary in that interval.
    pub generation: u64,
}

const GUARD_LEN: usize = 16;

/// A tier read's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TierReadReply {
    pub guard: Guard,
    /// The object exists (else the rest is empty: the guard is what an
    /// engine or a tier scrub needs to act on a deleted object).
    pub exists: bool,
    pub size: u64,
    pub entries: Entries,
    pub data: Vec<u8>,
}

impl TierReadReply {
    pub fn encode(&self) -> Vec<u8> {
        let entries = crate::omap::encode_entries(&self.entries);
        let mut out = Vec::with_capacity(GUARD_LEN + 13 + entries.len() + self.data.len());
        encode_guard(&self.guard, &mut out);
        out.push(u8::from(self.exists));
        out.extend_from_slice(&self.size.to_le_bytes());
        out.extend_from_slice(&(entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&entries);
        out.extend_from_slice(&self.data);
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<TierReadReply, DecodeError> {
        let (guard, rest) = decode_guard(bytes)?;
        if rest.len() < 13 {
            return Err(DecodeError::Short { need: GUARD_LEN + 13, got: bytes.len() });
        }
        let exists = match rest[0] {
            0 => false,
            1 => true,
            _ => return Err(DecodeError::Inconsistent("a tier read's exists flag is 0 or 1")),
        };
        let rest = &rest[1..];
        let size = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
        let len = u32::from_le_bytes(rest[8..12].try_into().expect("4 bytes")) as usize;
        let rest = &rest[12..];
        if rest.len() < len {
            return Err(DecodeError::Short { need: len, got: rest.len() });
        }
        let entries = crate::omap::decode_entries(&rest[..len])?;
        let reply = TierReadReply { guard, exists, size, entries, data: rest[len..].to_vec() };
        if !exists && (reply.size != 0 || !reply.entries.is_empty() || !reply.data.is_empty()) {
            return Err(DecodeError::Inconsistent("an absent object with bytes or entries"));
        }
        Ok(reply)
    }
}

/// One change of a tier update.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    SetEntry { key: Vec<u8>, value: Vec<u8> },
    RemoveEntry { key: Vec<u8> },
    Zero { offset: u64, len: u64 },
    Write { offset: u64, data: Vec<u8> },
}

const SET: u8 = 1;
const REMOVE: u8 = 2;
const ZERO: u8 = 3;
const WRITE: u8 = 4;

/// The message of an update refused because its guard no longer holds
/// (status `Invalid`: resending it would not help; read again).
pub const STALE: &str = "the object changed since the engine read it";

/// Whether a refusal's message (as an OSD sent it, or as a client error
/// quotes it) is [`STALE`]'s.
pub fn is_stale(message: &[u8]) -> bool {
    message.windows(STALE.len()).any(|part| part == STALE.as_bytes())
}

/// Actions an update holds at most.
pub const MAX_ACTIONS: usize = 4096;

fn encode_guard(guard: &Guard, out: &mut Vec<u8>) {
    out.extend_from_slice(&guard.interval.to_le_bytes());
    out.extend_from_slice(&guard.generation.to_le_bytes());
}

fn decode_guard(bytes: &[u8]) -> Result<(Guard, &[u8]), DecodeError> {
    if bytes.len() < GUARD_LEN {
        return Err(DecodeError::Short { need: GUARD_LEN, got: bytes.len() });
    }
    let interval = u64::from_le_bytes(bytes[..8].try_into().expect("8 bytes"));
    let generation = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    Ok((Guard { interval, generation }, &bytes[GUARD_LEN..]))
}

/// An update request's data: the guard, then the actions.
pub fn encode_update(guard: &Guard, actions: &[Action]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_guard(guard, &mut out);
    out.extend_from_slice(&encode_actions(actions));
    out
}

/// An update request's guard, and its actions' bytes (what is logged),
/// checked.
pub fn split_update(data: &[u8]) -> Result<(Guard, &[u8]), DecodeError> {
    decode_update(data).map(|(guard, _)| (guard, &data[GUARD_LEN..]))
}

/// An update request's guard and actions.
pub fn decode_update(data: &[u8]) -> Result<(Guard, Vec<Action>), DecodeError> {
    let (guard, actions) = decode_guard(data)?;
    Ok((guard, decode_actions(actions)?))
}

pub fn encode_actions(actions: &[Action]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(actions.len() as u32).to_le_bytes());
    for action in actions {
        match action {
            Action::SetEntry { key, value } => {
                debug_assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN && value.len() <= MAX_VALUE_LEN);
                out.push(SET);
                out.push(key.len() as u8);
                out.extend_from_slice(key);
                out.extend_from_slice(&(value.len() as u16).to_le_bytes());
                out.extend_from_slice(value);
            }
            Action::RemoveEntry { key } => {
                debug_assert!(!key.is_empty() && key.len() <= MAX_KEY_LEN);
                out.push(REMOVE);
                out.push(key.len() as u8);
                out.extend_from_slice(key);
            }
            Action::Zero { offset, len } => {
                out.push(ZERO);
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&len.to_le_bytes());
            }
            Action::Write { offset, data } => {
                out.push(WRITE);
                out.extend_from_slice(&offset.to_le_bytes());
                out.extend_from_slice(&(data.len() as u32).to_le_bytes());
                out.extend_from_slice(data);
            }
        }
    }
    out
}

pub fn decode_actions(bytes: &[u8]) -> Result<Vec<Action>, DecodeError> {
    let short = |need: usize, got: usize| DecodeError::Short { need, got };
    if bytes.len() < 4 {
        return Err(short(4, bytes.len()));
    }
    let count = u32::from_le_bytes(bytes[..4].try_into().expect("4 bytes")) as usize;
    // Every action takes at least 2 bytes: a count past that is a lie.
    if count > MAX_ACTIONS || count.saturating_mul(2) > bytes.len() - 4 {
        return Err(DecodeError::Inconsistent("more tier actions than allowed, or than the payload holds"));
    }
    let mut actions = Vec::with_capacity(count);
    let mut r = &bytes[4..];
    let mut take = |n: usize| -> Result<&[u8], DecodeError> {
        if r.len() < n {
            return Err(short(n, r.len()));
        }
        let (head, rest) = r.split_at(n);
        r = rest;
        Ok(head)
    };
    let mut written = 0u64;
    for _ in 0..count {
        let tag = take(1)?[0];
        let action = match tag {
            SET | REMOVE => {
                let len = take(1)?[0] as usize;
                if len == 0 {
                    return Err(DecodeError::Inconsistent("an empty chunk map key"));
                }
                let key = take(len)?.to_vec();
                if tag == REMOVE {
                    Action::RemoveEntry { key }
                } else {
                    let len = u16::from_le_bytes(take(2)?.try_into().expect("2 bytes")) as usize;
                    if len > MAX_VALUE_LEN {
                        return Err(DecodeError::Inconsistent("a chunk map value longer than 4096 bytes"));
                    }
                    Action::SetEntry { key, value: take(len)?.to_vec() }
                }
            }
            ZERO => {
                let offset = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
                let len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
                if offset.checked_add(len).is_none() {
                    return Err(DecodeError::Inconsistent("a tier zero past the largest offset"));
                }
                Action::Zero { offset, len }
            }
            WRITE => {
                let offset = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes"));
                let len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
                written += u64::from(len);
                if written > u64::from(MAX_IO_BYTES) || offset.checked_add(u64::from(len)).is_none() {
                    return Err(DecodeError::TooLarge(written));
                }
                Action::Write { offset, data: take(len as usize)?.to_vec() }
            }
            value => return Err(DecodeError::Unknown { what: "tier action", value }),
        };
        actions.push(action);
    }
    if !r.is_empty() {
        return Err(DecodeError::Inconsistent("bytes after a tier update's actions"));
    }
    Ok(actions)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn action() -> impl Strategy<Value = Action> {
        let key = proptest::collection::vec(any::<u8>(), 1..=MAX_KEY_LEN);
        prop_oneof![
            (key.clone(), proptest::collection::vec(any::<u8>(), 0..100))
                .prop_map(|(key, value)| Action::SetEntry { key, value }),
            key.prop_map(|key| Action::RemoveEntry { key }),
            (0u64..1 << 40, 0u64..1 << 30).prop_map(|(offset, len)| Action::Zero { offset, len }),
            (0u64..1 << 40, proptest::collection::vec(any::<u8>(), 0..300))
                .prop_map(|(offset, data)| Action::Write { offset, data }),
        ]
    }

    proptest! {
        #[test]
        fn updates_and_replies_round_trip(actions in proptest::collection::vec(action(), 0..20), interval in any::<u64>(), generation in any::<u64>(), size in any::<u64>(), data in proptest::collection::vec(any::<u8>(), 0..100)) {
            let guard = Guard { interval, generation };
            let update = encode_update(&guard, &actions);
            let (got, logged) = split_update(&update).unwrap();
            prop_assert_eq!(got, guard);
            prop_assert_eq!(decode_actions(logged).unwrap(), actions);
            let entries = vec![(b"c1".to_vec(), vec![1, 2]), (b"c2".to_vec(), vec![])];
            let reply = TierReadReply { guard, exists: true, size, entries, data };
            prop_assert_eq!(TierReadReply::decode(&reply.encode()).unwrap(), reply);
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
            let _ = split_update(&bytes);
            let _ = decode_actions(&bytes);
            let _ = TierReadReply::decode(&bytes);
        }
    }

    #[test]
    fn a_stale_refusal_is_known_as_sent_and_as_quoted() {
        assert!(is_stale(STALE.as_bytes()));
        assert!(is_stale(format!("OSD 3: {STALE}").as_bytes()), "a client error quotes it after its OSD");
        assert!(!is_stale(b"the object changed"));
        assert!(!is_stale(b""));
    }

    #[test]
    fn lies_about_counts_and_lengths_are_refused() {
        let mut huge = (u32::MAX).to_le_bytes().to_vec();
        huge.extend_from_slice(&[0; 16]);
        assert!(decode_actions(&huge).is_err());
        let mut write = encode_actions(&[Action::Write { offset: 0, data: vec![1; 10] }]);
        write.truncate(write.len() - 1);
        assert!(decode_actions(&write).is_err());
        let past = encode_actions(&[Action::Zero { offset: u64::MAX, len: 2 }]);
        assert!(decode_actions(&past).is_err());
        let mut trailing = encode_actions(&[Action::RemoveEntry { key: b"c".to_vec() }]);
        trailing.push(0);
        assert!(decode_actions(&trailing).is_err());
        assert!(TierReadReply::decode(&[0; 20]).is_err());
        let absent = TierReadReply {
            guard: Guard { interval: 1, generation: 2 },
            exists: false,
            size: 0,
            entries: vec![],
            data: vec![],
        };
        assert_eq!(TierReadReply::decode(&absent.encode()).unwrap(), absent);
        let lying = TierReadReply { size: 5, ..absent };
        assert!(TierReadReply::decode(&lying.encode()).is_err());
    }
}
