//! The last interval a PG was active in on this OSD, kept in the store.
//!
//! The PG log's header holds it too, and peering chooses its authority by
//! it first. But an `shm` log dies with the power: a member that lost it
//! would report "never active", and peering could then prefer an older
//! copy to the newest one. The simulator found exactly that (seed 228):
//! osd.2, the survivor of a PG's last active interval, lost its log to a
//! power cut while its peer from that interval was down; peering among
//! osd.2 and osd.0 (which had missed the interval) saw two "never active"
//! members, chose osd.0, and backfill removed acknowledged objects from
//! osd.2.
//!
//! The store survives a power loss, so every activation also records the
//! interval there, durably, before it is acknowledged (one store batch per
//! PG per peering; nothing on the write path). A member whose log knows of
//! an older interval than its store lost its log; it reports the store's
//! interval with an *unknown* position (seq and epoch 0). Its log, and so
//! which entries its store holds, is gone, and the store's last batch may
//! have been torn by the same power cut: so it never counts as level with
//! another member (it is always backfilled when it is not the authority),
//! and any member of the same interval that kept its log wins over it.
//! Nor does it stand for its interval's active set in peering: the writes
//! its log held are gone from it but live on in the logs of the set's
//! other OSDs, so the PG waits for one of those, unless every OSD of the
//! set lost its log (peering/machine/recovery.rs, `active_set_answered`;
//! simulator seed 53159). Only then is its store the authority, which is
//! what it is: the newest copy there is.
//!
//! The record is an attribute of one object per PG, in the store group of
//! pool 0: no pool has id 0, so no PG lists it, copies it or serves it, and
//! its group number is the partition's index, so it sits in the PG's own
//! partition.

use duplex_store::{Key, Op, Partition, StoreError};

const ATTR: &[u8] = b"last_active";
/// A backfill target's copy of the PG, until its backfill ends: 1 while
/// incomplete, 0 after.
const BACKFILLING: &[u8] = b"backfilling";

/// A copy that peering's recovery changed (an object installed or
/// removed) and no activation has ended since: 1 while so, 0 after. Such a
/// copy holds its own history plus objects of the authority's, whose ids
/// came with them; it reports an unknown position past every id it holds
/// (see [`recovered`]).
const RECOVERED: &[u8] = b"recovered";

/// The object that holds PG `pg`'s record, on partition `partition`.
fn key(partition: u32, pg: u32) -> Key {
    Key::in_group(partition, &pg.to_be_bytes()).expect("a 4-byte name in a group is a valid key")
}

/// The store operation that records `interval` as `pg`'s last active one.
pub fn record(partition: u32, pg: u32, interval: u64) -> Op {
    Op::SetAttr { key: key(partition, pg), name: ATTR.to_vec(), value: interval.to_le_bytes().to_vec() }
}

/// The store operation that marks this OSD's copy of `pg` as incomplete
/// (`true`: a backfill into it began) or complete again.
pub fn mark_backfilling(partition: u32, pg: u32, incomplete: bool) -> Op {
    set_flag(partition, pg, BACKFILLING, incomplete)
}

/// The store operation that marks this OSD's copy of `pg` as changed by a
/// recovery of peering (`true`, in the same batch as the change) or
/// settled again by an activation (`false`).
pub fn mark_recovered(partition: u32, pg: u32, changed: bool) -> Op {
    set_flag(partition, pg, RECOVERED, changed)
}

/// Whether peering's recovery changed this OSD's copy of `pg` and no
/// activation followed: the peering that began it was cut short (its
/// primary died, or a new interval began), and the copy's log position no
/// longer says which writes its store holds.
///
/// Why it matters (simulator seed 20869): an authority began to copy two
/// objects into a member behind it by four entries, none acknowledged yet,
/// and lost its power before activating anyone. The member still reported
/// its old position, so a later peering made it the authority and reused
/// those four seqs, while its store showed one of the four writes and its
/// id table did not know it: the client's resend of that write ran again,
/// after a newer write, and a read saw the old value come back.
pub fn recovered(partition: &mut Partition, pg: u32) -> Result<bool, StoreError> {
    flag(partition, pg, RECOVERED)
}

/// Whether a backfill into this OSD's copy of `pg` began and did not end:
/// such a copy lacks objects, and is never level with a complete one.
pub fn backfilling(partition: &mut Partition, pg: u32) -> Result<bool, StoreError> {
    flag(partition, pg, BACKFILLING)
}

/// The operation that sets one of the record's flags (1 or 0).
fn set_flag(partition: u32, pg: u32, name: &[u8], set: bool) -> Op {
    Op::SetAttr { key: key(partition, pg), name: name.to_vec(), value: vec![u8::from(set)] }
}

/// One of the record's flags: set unless absent or 0.
fn flag(partition: &mut Partition, pg: u32, name: &[u8]) -> Result<bool, StoreError> {
    let key = key(partition.index(), pg);
    match partition.get_attr(key.as_bytes(), name) {
        Ok(bytes) => Ok(bytes != [0]),
        Err(StoreError::NotFound | StoreError::AttrNotFound) => Ok(false),
        Err(err) => Err(err),
    }
}

/// The last active interval the store knows for `pg` (0: none recorded,
/// or a record that does not decode, which counts as none).
pub fn read(partition: &mut Partition, pg: u32) -> Result<u64, StoreError> {
    let key = key(partition.index(), pg);
    match partition.get_attr(key.as_bytes(), ATTR) {
        Ok(bytes) => Ok(bytes.try_into().map_or(0, u64::from_le_bytes)),
        Err(StoreError::NotFound | StoreError::AttrNotFound) => Ok(0),
        Err(err) => Err(err),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_lives_in_the_pgs_partition_outside_every_pool() {
        for (partitions, pg) in [(1u32, 0x0010_0003u32), (4, 0x0020_0007), (7, 0xFFF0_0001)] {
            let partition = pg % partitions;
            let key = key(partition, pg);
            let group = u32::from_be_bytes(key.as_bytes()[..4].try_into().unwrap());
            assert_eq!(group % partitions, partition, "the PG's own partition");
            assert_eq!(crate::pg::pool_of(group), 0, "pool 0, which never exists");
        }
    }

    #[test]
    fn the_record_round_trips_through_a_store_and_a_bad_one_is_none() {
        let test_store = crate::TestStore::new(2);
        let mut store = test_store.open();
        let pg = crate::pg::pg_key(1, 5).unwrap();
        let partition = store.partition_mut((pg % 2) as usize);
        assert_eq!(read(partition, pg).unwrap(), 0, "nothing recorded");
        let mut batch = duplex_store::Batch::new();
        batch.push(record(partition.index(), pg, 1 << 40));
        partition.apply(&batch).unwrap();
        assert_eq!(read(partition, pg).unwrap(), 1 << 40);
        let mut bad = duplex_store::Batch::new();
        bad.set_attr(key(partition.index(), pg), ATTR.to_vec(), vec![1, 2, 3]);
        partition.apply(&bad).unwrap();
        assert_eq!(read(partition, pg).unwrap(), 0, "a record that does not decode counts as none");

        assert!(!backfilling(partition, pg).unwrap(), "no mark: complete");
        let mut mark = duplex_store::Batch::new();
        mark.push(mark_backfilling(partition.index(), pg, true));
        partition.apply(&mark).unwrap();
        assert!(backfilling(partition, pg).unwrap());
        let mut done = duplex_store::Batch::new();
        done.push(mark_backfilling(partition.index(), pg, false));
        partition.apply(&done).unwrap();
        assert!(!backfilling(partition, pg).unwrap());
        assert_eq!(read(partition, pg).unwrap(), 0, "the mark leaves the interval alone");

        assert!(!recovered(partition, pg).unwrap(), "no mark: no recovery changed it");
        for changed in [true, false] {
            let mut mark = duplex_store::Batch::new();
            mark.push(mark_recovered(partition.index(), pg, changed));
            partition.apply(&mark).unwrap();
            assert_eq!(recovered(partition, pg).unwrap(), changed);
        }
        assert!(!backfilling(partition, pg).unwrap(), "the marks are independent");
    }
}
