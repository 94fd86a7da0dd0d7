//! Peering and recovery messages: what a PG's primary asks the members of a
//! new interval (and itself) before the PG goes active, and their answers.
//!
//! These are off the I/O path (a handful per PG per map change, plus one
//! per recovered object chunk), so they are postcard-encoded serde types
//! rather than hand-laid-out frames. Decoding is still hostile-input safe:
//! postcard returns an error on anything malformed, and the property test
//! below feeds it random bytes.
//!
//! Every request names the PG (its key: pool and number) and the interval
//! (the map epoch at which the primary started peering). A member refuses a
//! request for an interval older than the one it was last asked about, so
//! a primary that was replaced cannot drive it any more.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::frame::{Frame, MessageType};

/// The most bytes one pull or push moves: recovery of a large object is
/// several round trips, each well under a frame's limit.
pub const CHUNK_BYTES: u32 = 1 << 20;
/// Objects one digest listing returns at most (then the next page).
pub const DIGEST_PAGE: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerRequest {
    pub pg: u32,
    pub interval: u64,
    pub op: PeerOp,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerOp {
    /// Stop taking replicated entries for this PG (they belong to an older
    /// interval), apply the operation log to the store, and report
    /// [`PeerReply::Info`] with the request ids it logged.
    Query,
    /// The objects touched by log entries in `(after, through]`, if this
    /// member's recent history still covers them and its entry `after` has
    /// epoch `after_epoch` (so the asker's log is a prefix of this one's)
    /// ([`PeerReply::Touched`]).
    Touched {
        after: u64,
        after_epoch: u32,
        through: u64,
    },
    /// A page of the PG's objects with a digest of each, names strictly
    /// after `cursor` ([`PeerReply::Digests`]).
    Digests {
        cursor: Vec<u8>,
    },
    /// An object's size and attributes, after applying the log
    /// ([`PeerReply::Meta`]).
    Stat {
        object: Vec<u8>,
    },
    /// A crc32c of object bytes `offset..offset + len` (at most
    /// [`CHUNK_BYTES`], holes as zeros), after applying the log
    /// ([`PeerReply::ChunkDigest`]): background backfill compares a chunk
    /// a target kept with the primary's before it copies it.
    ChunkDigest {
        object: Vec<u8>,
        offset: u64,
        len: u32,
    },
    /// Object bytes ([`PeerReply::Data`]); at most [`CHUNK_BYTES`].
    Pull {
        object: Vec<u8>,
        offset: u64,
        len: u32,
    },
    /// Replace the object with an empty one of this size, these
    /// attributes and this omap; the data follows in `PushData`.
    PushStart {
        object: Vec<u8>,
        size: u64,
        preallocated: bool,
        attrs: Vec<(Vec<u8>, Vec<u8>)>,
        omap: Vec<(Vec<u8>, Vec<u8>)>,
    },
    PushData {
        object: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    Remove {
        object: Vec<u8>,
    },
    /// The PG is consistent: continue the log after `last_seq` (whose entry
    /// had `last_epoch`), remember this interval as the last one this
    /// member was active in, and take replicated entries of this interval
    /// from `members[0]`. `rebuilt`: recovery changed this member's store,
    /// so its own recent history no longer holds. `requests`: the ids whose
    /// entries are in the authoritative history (a resend of one is
    /// answered, not applied again); they replace the member's own.
    ///
    /// `backfill`: the OSDs being backfilled in this interval (a pin's
    /// targets, or members whose copy needs it). They take the interval's
    /// entries like members (the primary sends every write to them too)
    /// but their stores are filled in the background. A
    /// member named there marks its copy of the PG incomplete first (and
    /// keeps it, for the backfill to compare) until [`PeerOp::BackfillDone`].
    Activate {
        last_seq: u64,
        last_epoch: u32,
        members: Vec<u32>,
        rebuilt: bool,
        requests: Vec<LoggedRequest>,
        backfill: Vec<u32>,
    },
    /// A page of the PG's object names, strictly after `cursor`
    /// ([`PeerReply::Names`]).
    List {
        cursor: Vec<u8>,
    },
    /// Background backfill, to the primary itself: hold client writes to
    /// bytes `start..end` of `object` (releasing what was held before;
    /// `None`: just release), and once none is in flight, apply the log and
    /// report the object ([`PeerReply::Meta`]); [`PeerReply::Busy`] while
    /// writes to that range are still in flight (ask again).
    ///
    /// The primary sends its targets writes to objects its walk has not
    /// reached without their data, and the walk owes each such object a
    /// visit. So a lock of a whole object (the walk stepping onto it), and
    /// [`PeerOp::backfill_end`], are answered [`PeerReply::Names`] when the
    /// walk owes objects before it: it walks those first, then asks again.
    BackfillLock {
        object: Option<Vec<u8>>,
        start: u64,
        end: u64,
    },
    /// Background backfill, to a target: it now holds every object of the
    /// PG, so it is a complete copy of this interval from now on.
    BackfillDone,
    /// Peering's recovery, to the member an object is copied to: keep
    /// these object bytes (at most [`CHUNK_BYTES`]) in memory for
    /// [`PeerOp::Install`]; the store is not touched yet.
    Stage {
        object: Vec<u8>,
        offset: u64,
        data: Vec<u8>,
    },
    /// The ids of this member's recent mutations of `object` (its history
    /// names the object, its id table the request) ([`PeerReply::Requests`]):
    /// they go with the object's copy.
    ObjectRequests {
        object: Vec<u8>,
    },
    /// Peering's recovery: replace the object, in one store batch, with
    /// one of `meta`'s size and attributes holding the bytes staged for it
    /// (`None`: remove it), and take `requests`, the ids of the mutations
    /// whose effects the copy carries. `staged_bytes`: what was staged,
    /// checked, so a lost chunk is never installed as a hole. The member
    /// marks its copy as changed by a recovery that its activation has not
    /// ended (docs/RELIABILITY.md, "Unfinished recoveries").
    Install {
        object: Vec<u8>,
        meta: Option<ObjectMeta>,
        staged_bytes: u64,
        requests: Vec<LoggedRequest>,
        /// The last seq of the history the copy comes from: the member
        /// forgets its own ids past it (writes that history does not hold,
        /// whose effects the copies may overwrite).
        authority_seq: u64,
    },
    /// Operator → the PG's primary (interval ignored): peer the PG again
    /// with a deep scrub, comparing every object's digest on every member;
    /// with `repair`, bad copies are replaced by good ones. Answered
    /// [`PeerReply::Scrubbed`] when the PG is active again.
    Scrub {
        repair: bool,
    },
    /// An erasure-coded PG's recovery: drop the log's entries after seq
    /// `to` (fewer than k shards logged them: they are rolled back), and
    /// hold the rest back until activation (`to == u64::MAX`: a member
    /// rebuilt next applies its whole log). Refused if an entry after `to`
    /// was applied already. With `replaced`, the member's copy is compared
    /// and replaced whole next: until an activation ends, it reports its
    /// position as unknown (its log's end is not what its store holds).
    Settle {
        to: u64,
        replaced: bool,
    },
    /// Background backfill's first request, to the primary itself: the
    /// backfill targets of `targets` that are no members took no write of
    /// the interval yet (they are *dormant*: a PG waiting for its turn
    /// costs its targets nothing). Hold the PG's client writes, and once
    /// none is in flight, answer [`PeerReply::Join`] with what the targets
    /// are activated at again; [`PeerReply::Busy`] while writes are in
    /// flight (ask again).
    BackfillJoin {
        targets: Vec<u32>,
    },
    /// Background backfill, to the primary itself: the targets of the
    /// [`PeerReply::Join`] are activated at its seq; send them the PG's
    /// writes from the next seq on, and release the hold. Refused if the
    /// hold expired meanwhile (the targets stay dormant).
    BackfillJoined,
}

/// What a member reports when queried.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PeerInfo {
    /// The seq of its newest entry (0: none).
    pub last_seq: u64,
    /// That entry's epoch (0: unknown). Logs ending at the same seq and
    /// epoch hold the same history.
    pub last_epoch: u32,
    /// The interval it was last active in (0: never, or its log was lost).
    pub last_active: u64,
    /// The oldest seq whose object its recent history still names; entries
    /// after `history_from - 1` can be recovered object by object.
    pub history_from: u64,
    /// Its copy is an unfinished backfill: it lacks objects, so it is never
    /// the authority (and never level with one).
    pub backfilling: bool,
    /// Its log cannot place what its store holds: the log was lost with
    /// the power, or a recovery no activation ended changed the copy. Its
    /// `last_seq` is then the newest seq it holds a request id of, and its
    /// epoch 0: it is never level with anyone, and a member of its interval
    /// whose log knows its position, even one with no entry, wins over it.
    pub position_lost: bool,
    /// Its log was lost with the power (so its position is lost too): the
    /// writes that log held and its store had not taken yet are missing
    /// from this copy, though they may have been acknowledged (they live on
    /// in the logs of the other members that logged them). Such a copy
    /// does not stand for its active set in peering.
    pub log_lost: bool,
}

/// A client request id a member logged, and the seq of its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoggedRequest {
    pub client: u64,
    pub tid: u64,
    pub seq: u64,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectDigest {
    pub object: Vec<u8>,
    /// crc32c over size, data (holes as zeros) and attributes; `None`: a
    /// data block failed its checksum (this copy is damaged).
    pub digest: Option<u32>,
}

/// What a deep scrub found.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubReport {
    /// Objects compared (on the authority, or on any member).
    pub objects: u64,
    pub inconsistent: Vec<Inconsistency>,
    /// Bad copies replaced (0 without `repair`).
    pub repaired: u64,
}

/// An object whose copies disagree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inconsistency {
    pub object: Vec<u8>,
    /// Members whose copy differs from the good one, is missing, or is damaged.
    pub bad: Vec<u32>,
    /// No member holds a good copy: nothing to repair from.
    pub unrepairable: bool,
}

impl PeerOp {
    /// Background backfill's last request to the primary: release the
    /// lock; the walk is over unless it is answered [`PeerReply::Names`]
    /// (objects it still owes a visit, see [`PeerOp::BackfillLock`]).
    pub fn backfill_end() -> PeerOp {
        PeerOp::BackfillLock { object: None, start: 0, end: u64::MAX }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerReply {
    Info {
        info: PeerInfo,
        /// The request ids of recent mutations this member logged.
        requests: Vec<LoggedRequest>,
    },
    /// `None`: the history no longer reaches back that far.
    Touched(Option<Vec<Vec<u8>>>),
    Digests {
        objects: Vec<ObjectDigest>,
        more: bool,
    },
    /// `None`: no such object.
    Meta(Option<ObjectMeta>),
    Data(Vec<u8>),
    /// `None`: no such object, or a block of the range failed its checksum.
    ChunkDigest(Option<u32>),
    Done,
    Scrubbed(ScrubReport),
    Names {
        objects: Vec<Vec<u8>>,
        more: bool,
    },
    /// Not yet: ask again shortly.
    Busy,
    /// The ids of an object's recent mutations ([`PeerOp::ObjectRequests`]).
    Requests(Vec<LoggedRequest>),
    /// The member could not (or would not) do it; the primary starts over later.
    Refused(String),
    /// A block of the range failed its checksum ([`PeerOp::Pull`]): this
    /// member's copy is damaged there.
    Damaged(String),
    /// The answer to [`PeerOp::BackfillJoin`]: the dormant targets to
    /// activate again ([`PeerOp::Activate`] with these fields; none: no
    /// target is dormant, nothing is held), at the primary's last seq.
    Join {
        targets: Vec<u32>,
        last_seq: u64,
        last_epoch: u32,
        members: Vec<u32>,
        backfill: Vec<u32>,
        requests: Vec<LoggedRequest>,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectMeta {
    pub size: u64,
    pub preallocated: bool,
    pub attrs: Vec<(Vec<u8>, Vec<u8>)>,
    /// Sorted by key ([`crate::omap`]).
    pub omap: Vec<(Vec<u8>, Vec<u8>)>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("malformed peering message: {0}")]
pub struct PeeringDecodeError(String);

impl PeerRequest {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        Frame::new(MessageType::PeerRequest, transaction_id, encode(self))
    }

    pub fn decode(payload: &[u8]) -> Result<PeerRequest, PeeringDecodeError> {
        postcard::from_bytes(payload).map_err(|e| PeeringDecodeError(e.to_string()))
    }
}

impl PeerReply {
    pub fn to_frame(&self, transaction_id: u64) -> Frame {
        Frame::new(MessageType::PeerReply, transaction_id, encode(self))
    }

    pub fn decode(payload: &[u8]) -> Result<PeerReply, PeeringDecodeError> {
        postcard::from_bytes(payload).map_err(|e| PeeringDecodeError(e.to_string()))
    }
}

fn encode<T: Serialize>(message: &T) -> Bytes {
    Bytes::from(postcard::to_allocvec(message).expect("encoding to a Vec cannot fail"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..40)
    }

    fn requests() -> impl Strategy<Value = Vec<LoggedRequest>> {
        proptest::collection::vec(
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(client, tid, seq)| LoggedRequest {
                client,
                tid,
                seq,
            }),
            0..4,
        )
    }

    fn op() -> impl Strategy<Value = PeerOp> {
        prop_oneof![
            Just(PeerOp::Query),
            (any::<u64>(), any::<u32>(), any::<u64>()).prop_map(|(after, after_epoch, through)| PeerOp::Touched {
                after,
                after_epoch,
                through
            }),
            name().prop_map(|cursor| PeerOp::Digests { cursor }),
            name().prop_map(|object| PeerOp::Stat { object }),
            (name(), any::<u64>(), any::<u32>()).prop_map(|(object, offset, len)| PeerOp::Pull { object, offset, len }),
            (name(), any::<u64>(), any::<u32>()).prop_map(|(object, offset, len)| PeerOp::ChunkDigest {
                object,
                offset,
                len
            }),
            (
                name(),
                any::<u64>(),
                any::<bool>(),
                proptest::collection::vec((name(), name()), 0..4),
                proptest::collection::vec((name(), name()), 0..4)
            )
                .prop_map(|(object, size, preallocated, attrs, omap)| PeerOp::PushStart {
                    object,
                    size,
                    preallocated,
                    attrs,
                    omap
                }),
            (name(), any::<u64>(), name()).prop_map(|(object, offset, data)| PeerOp::PushData { object, offset, data }),
            name().prop_map(|object| PeerOp::Remove { object }),
            any::<bool>().prop_map(|repair| PeerOp::Scrub { repair }),
            (
                any::<u64>(),
                any::<u32>(),
                proptest::collection::vec(any::<u32>(), 0..4),
                any::<bool>(),
                requests(),
                proptest::collection::vec(any::<u32>(), 0..3)
            )
                .prop_map(|(last_seq, last_epoch, members, rebuilt, requests, backfill)| {
                    PeerOp::Activate { last_seq, last_epoch, members, rebuilt, requests, backfill }
                }),
            name().prop_map(|cursor| PeerOp::List { cursor }),
            (proptest::option::of(name()), any::<u64>(), any::<u64>())
                .prop_map(|(object, start, end)| PeerOp::BackfillLock { object, start, end }),
            Just(PeerOp::BackfillDone),
            (name(), any::<u64>(), name()).prop_map(|(object, offset, data)| PeerOp::Stage { object, offset, data }),
            name().prop_map(|object| PeerOp::ObjectRequests { object }),
            (any::<u64>(), any::<bool>()).prop_map(|(to, replaced)| PeerOp::Settle { to, replaced }),
            (
                name(),
                proptest::option::of((any::<u64>(), any::<bool>(), proptest::collection::vec((name(), name()), 0..3))),
                any::<u64>(),
                requests(),
                any::<u64>()
            )
                .prop_map(|(object, meta, staged_bytes, requests, authority_seq)| PeerOp::Install {
                    object,
                    meta: meta.map(|(size, preallocated, attrs)| ObjectMeta {
                        size,
                        preallocated,
                        omap: attrs.clone(),
                        attrs
                    }),
                    staged_bytes,
                    requests,
                    authority_seq,
                }),
            proptest::collection::vec(any::<u32>(), 0..3).prop_map(|targets| PeerOp::BackfillJoin { targets }),
            Just(PeerOp::BackfillJoined),
        ]
    }

    fn reply() -> impl Strategy<Value = PeerReply> {
        prop_oneof![
            (
                any::<u64>(),
                any::<u32>(),
                any::<u64>(),
                any::<u64>(),
                (any::<bool>(), any::<bool>(), any::<bool>()),
                requests()
            )
                .prop_map(
                    |(last_seq, last_epoch, last_active, history_from, flags, requests): (
                        _,
                        _,
                        _,
                        _,
                        (bool, bool, bool),
                        _
                    )| {
                        let (backfilling, position_lost, log_lost) = flags;
                        let info = PeerInfo {
                            last_seq,
                            last_epoch,
                            last_active,
                            history_from,
                            backfilling,
                            position_lost,
                            log_lost,
                        };
                        PeerReply::Info { info, requests }
                    }
                ),
            proptest::option::of(proptest::collection::vec(name(), 0..4)).prop_map(PeerReply::Touched),
            (proptest::collection::vec((name(), proptest::option::of(any::<u32>())), 0..4), any::<bool>()).prop_map(
                |(objects, more)| {
                    let objects = objects.into_iter().map(|(object, digest)| ObjectDigest { object, digest }).collect();
                    PeerReply::Digests { objects, more }
                }
            ),
            proptest::option::of((any::<u64>(), any::<bool>(), proptest::collection::vec((name(), name()), 0..3)))
                .prop_map(|meta| PeerReply::Meta(meta.map(|(size, preallocated, attrs)| ObjectMeta {
                    size,
                    preallocated,
                    omap: attrs.iter().rev().cloned().collect(),
                    attrs
                }))),
            name().prop_map(PeerReply::Data),
            proptest::option::of(any::<u32>()).prop_map(PeerReply::ChunkDigest),
            Just(PeerReply::Done),
            (proptest::collection::vec(name(), 0..4), any::<bool>())
                .prop_map(|(objects, more)| PeerReply::Names { objects, more }),
            Just(PeerReply::Busy),
            (
                any::<u64>(),
                proptest::collection::vec((name(), proptest::collection::vec(any::<u32>(), 0..3), any::<bool>()), 0..3),
                any::<u64>()
            )
                .prop_map(|(objects, bad, repaired)| PeerReply::Scrubbed(ScrubReport {
                    objects,
                    inconsistent: bad
                        .into_iter()
                        .map(|(object, bad, unrepairable)| Inconsistency { object, bad, unrepairable })
                        .collect(),
                    repaired,
                })),
            ".{0,20}".prop_map(PeerReply::Refused),
            ".{0,20}".prop_map(PeerReply::Damaged),
            requests().prop_map(PeerReply::Requests),
            (
                proptest::collection::vec(any::<u32>(), 0..3),
                any::<u64>(),
                any::<u32>(),
                proptest::collection::vec(any::<u32>(), 0..4),
                proptest::collection::vec(any::<u32>(), 0..3),
                requests()
            )
                .prop_map(|(targets, last_seq, last_epoch, members, backfill, requests)| PeerReply::Join {
                    targets,
                    last_seq,
                    last_epoch,
                    members,
                    backfill,
                    requests
                }),
        ]
    }

    proptest! {
        #[test]
        fn requests_and_replies_round_trip(pg in any::<u32>(), interval in any::<u64>(), op in op(), reply in reply(), txid in any::<u64>()) {
            let request = PeerRequest { pg, interval, op };
            let frame = request.to_frame(txid);
            prop_assert_eq!(frame.header.transaction_id, txid);
            prop_assert_eq!(PeerRequest::decode(&frame.payload), Ok(request));
            prop_assert_eq!(PeerReply::decode(&reply.to_frame(txid).payload), Ok(reply));
        }

        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = PeerRequest::decode(&bytes);
            let _ = PeerReply::decode(&bytes);
        }
    }

    #[test]
    fn a_length_prefix_larger_than_the_message_is_an_error() {
        // A Data reply (variant 4) claiming 2^35 bytes, carrying three.
        let lie = [4u8, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01, 1, 2, 3];
        assert!(PeerReply::decode(&lie).is_err());
    }
}
