//! Placement groups on this OSD: each one's operation log, index cache and
//! (on a replica) the entries that arrived ahead of their turn.
//!
//! A PG is shared by every priority thread (any connection may carry a write
//! for it) and its non-priority thread (which flushes and trims it), so it
//! sits behind its own mutex: the "PG log lock" of DESIGN.md §4, held for an
//! append or a trim, never across I/O other than the log region's own.

pub mod elide;
pub mod lag;
pub mod object_queue;
pub mod replay;
pub mod requests;
pub mod stored_interval;
pub mod stored_requests;

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::fs::{File, OpenOptions};
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_oplog::{Entry, EntryRef, FileRegion, IndexCache, LogError, MmapRegion, PgLog, Region, RequestId};
use duplex_proto::osd::{RepReply, Status};
use duplex_proto::peering::LoggedRequest;
use duplex_proto::Frame;
use duplex_store::{Op, Partition, StoreError};

use crate::config::OplogMode;
use crate::pg::requests::{RequestState, RequestTable};

/// Pools whose id fits the 12 bits left to it in a PG key.
pub const MAX_POOL_ID: u32 = (1 << 12) - 1;
const PG_BITS: u32 = 20;

/// The PG key: pool in the high 12 bits, PG number in the low 20. It is the
/// log's `pg` field and the store key's group, so a PG's objects are
/// contiguous in the store and its partition is `key % partitions`.
pub fn pg_key(pool: u32, pg: u32) -> Option<u32> {
    (pool <= MAX_POOL_ID && pg < (1 << PG_BITS)).then_some((pool << PG_BITS) | pg)
}

pub fn pool_of(key: u32) -> u32 {
    key >> PG_BITS
}

pub fn pg_number(key: u32) -> u32 {
    key & ((1 << PG_BITS) - 1)
}

/// Where a replication acknowledgement goes: the priority thread, the
/// connection (its token there) and the request's transaction id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTo {
    pub thread: usize,
    pub token: usize,
    pub txid: u64,
}

pub type SharedPg = Arc<Mutex<Pg>>;

/// Replica side: the most entries a PG keeps waiting for their turn. More
/// means a gap that is not about to fill (a predecessor was lost), or a
/// peer misbehaving: further early entries are refused, not buffered.
pub const MAX_EARLY_ENTRIES: usize = 1024;

/// A replicated entry's acknowledgement, due now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub seq: u64,
    pub to: ReplyTo,
}

impl Ack {
    /// The acknowledgement on the wire, for an entry of PG `pg`: the one
    /// place a replica's answer to a replicated entry is built (logged,
    /// applied on the sync path, or refused by a fence).
    pub fn frame(&self, pg: u32, status: Status) -> Frame {
        RepReply { status, pg, seq: self.seq }.to_frame(self.to.txid)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum OfferError {
    #[error("entry {seq} is too far ahead of the log ({waiting} entries already wait for a gap)")]
    TooFarAhead { seq: u64, waiting: usize },
    #[error(
        "entry {seq} of epoch {epoch} reuses a seq this replica logged by epoch {logged}: the logs diverged (peering must reconcile them)"
    )]
    Diverged { seq: u64, epoch: u32, logged: u32 },
    #[error(transparent)]
    Log(#[from] LogError),
}

pub struct Pg {
    pub key: u32,
    pub log: PgLog<Box<dyn Region>>,
    pub index: IndexCache,
    /// Replica side: encoded entries ahead of the log's next seq (they came
    /// over another connection than their predecessors), or waiting for room.
    early: BTreeMap<u64, (Bytes, ReplyTo)>,
    /// The sync write path's last assigned seq (it keeps no log).
    pub sync_seq: u64,
    /// A writer is waiting for room in this log: tell the priority threads after a trim.
    pub waiters: bool,
    /// Entries were added since the flusher last took this PG.
    pub dirty: bool,
    /// Request ids of recent mutations, to answer resends.
    pub requests: RequestTable,
    /// This PG's flushes asked the store to create its id record whole
    /// (stored_requests.rs), so that their slots go through its journal.
    ids_record_created: bool,
    /// The table holds the ids the store's record kept (loaded at start or
    /// at the first peering query, or replaced by activation), so that
    /// resends of flushed writes are answered.
    stored_ids_loaded: bool,
    /// Primary side: the writes it logged that not every replica has
    /// acknowledged yet. Their objects are not readable meanwhile.
    pub uncommitted: Uncommitted,
    /// Primary of an eventual pool's PG: the writes acknowledged before
    /// every replica had them.
    pub lag: lag::ReplicationLag,
    /// Primary: it asked the map to move this PG (`backend::eventual::may_move`):
    /// no write is acknowledged before its replicas until the next interval.
    pub moving: bool,
    /// Replica side: since when early entries have waited on a gap, and
    /// whether that was reported.
    gap_since: Option<Instant>,
    gap_reported: bool,
    /// The newest epoch among the entries this log took since it opened or
    /// was activated (None: none). Not the log's `last_epoch`: two priority
    /// threads may stamp entries with maps a moment apart, so epochs can dip
    /// along the seqs.
    newest_epoch: Option<u32>,
    /// Peering: the interval this PG is active in here (None: peering, or
    /// never peered since this OSD started). Client operations and
    /// replicated entries are taken only while active.
    pub active: Option<Activation>,
    /// Peering: the newest interval a primary has asked this OSD about;
    /// requests for older ones come from a replaced primary and are refused.
    pub asked_interval: u64,
    /// Which object each recent seq touched, contiguous up to the newest
    /// entry: peering recovers a member that is only a little behind by
    /// copying just these objects.
    /// (seq, epoch, object, snapshot sequence the entry was logged under).
    history: VecDeque<(u64, u32, Vec<u8>, u64)>,
    /// Primary side, background backfill: the object, and its byte range,
    /// being copied to the backfill targets. Client writes to it wait (are
    /// answered `Retry`) until the copy is on every target: one landing in
    /// between would reach a target and then be overwritten there by the
    /// older copy.
    pub backfill_lock: Option<(Bytes, u64, u64)>,
    /// Primary side, background backfill: writes to objects the walk has
    /// not reached go to the targets without their data (`elide.rs`).
    /// Set at activation, when there are targets that are no members.
    pub elide: Option<elide::Elide>,
    /// Member side, peering's recovery: the object being copied here, its
    /// bytes kept in memory until it is installed whole in one store batch
    /// (at most `duplex_store::MAX_OBJECT_SIZE`). A fence drops it.
    pub staged: Option<StagedCopy>,
    /// The newest seq the flusher may apply to the store: the newest
    /// `version` among the entries taken (or the activation's seq). A
    /// replicated entry's version is its own seq, so its whole log is
    /// applied; an erasure-coded shard entry's is the seq through which
    /// every shard had logged when it was sent (its primary's watermark),
    /// so the entries after it wait in the log, where peering can still
    /// roll back one that fewer than k shards hold (`crate::backend::erasure`).
    pub apply_limit: u64,
    /// An entry was held back here once (its version behind its seq: an
    /// erasure-coded PG's): reads of the store overlay what the log holds.
    pub holds_back: bool,
    /// Primary of an erasure-coded PG: the seqs of its mutations that not
    /// every shard has acknowledged yet (one that failed stays until the
    /// next interval's fence).
    pub ec_pending: BTreeSet<u64>,
    /// Primary of a deduplicated PG: its tier's index, generations and
    /// dirty list (`crate::tier`; stale in another interval than the one
    /// it was loaded in).
    pub tier: Option<Box<crate::tier::TierState>>,
    /// Primary of a deduplicated PG: the interval its index was last asked
    /// to load in, and when (`crate::tier::load_wanted`).
    pub tier_load_asked: Option<(u64, std::time::Instant)>,
    /// Member side, peering's recovery: the (interval, authority's last
    /// seq) whose install already forgot this member's ids past that seq
    /// (`flusher::member`, install), so later installs skip the record's read.
    pub ids_purged_past: Option<(u64, u64)>,
}

/// An object copy peering's recovery is staging on this member.
#[derive(Debug, Default)]
pub struct StagedCopy {
    pub interval: u64,
    pub object: Vec<u8>,
    pub chunks: Vec<(u64, Vec<u8>)>,
    pub bytes: u64,
}

/// A primary's writes in flight to its replicas, by write id, with the
/// byte range each one changes, listed under their object. A read must
/// not see such a write: until every replica has it, it may fail (the
/// client then resends it, and it lands again after writes that came in
/// between) or be lost with its primary, and a value once read must not
/// come back or go away that way. The log and, after a flush, the store
/// hold it already, so reads that overlap it wait (are answered `Retry`)
/// until it is acknowledged or failed.
#[derive(Debug, Default)]
pub struct Uncommitted {
    /// Each write's object.
    writes: HashMap<u64, Bytes>,
    /// Per object with writes in flight: each one's id and byte range.
    objects: HashMap<Bytes, Vec<(u64, u64, u64)>>,
}

impl Uncommitted {
    /// Write `write` changes bytes `start..end` of `object` (a truncate, a
    /// delete or an attribute: `0..u64::MAX`).
    pub fn begin(&mut self, write: u64, object: Bytes, start: u64, end: u64) {
        debug_assert!(start <= end, "a range runs forward");
        self.objects.entry(object.clone()).or_default().push((write, start, end));
        let previous = self.writes.insert(write, object);
        debug_assert!(previous.is_none(), "write ids are unique");
    }

    /// The write is acknowledged or failed (an unknown id: nothing to do).
    pub fn end(&mut self, write: u64) {
        let Some(object) = self.writes.remove(&write) else { return };
        let ranges = self.objects.get_mut(&object).expect("every write is listed under its object");
        ranges.retain(|(id, ..)| *id != write);
        if ranges.is_empty() {
            self.objects.remove(&object);
        }
        debug_assert_eq!(
            self.writes.len(),
            self.objects.values().map(Vec::len).sum::<usize>(),
            "each write is listed once"
        );
    }

    /// Whether a write in flight changes any of bytes `start..end` of `object`.
    pub fn touches(&self, object: &[u8], start: u64, end: u64) -> bool {
        self.objects.get(object).is_some_and(|ranges| ranges.iter().any(|(_, s, e)| *s < end && start < *e))
    }

    pub fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }
}

/// The seqs of recent history a PG remembers (object names, in memory).
pub const HISTORY_LEN: usize = 4096;

/// The interval a PG went active in, as peering set it up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Activation {
    /// The map epoch at which the primary started peering it.
    pub interval: u64,
    /// The acting set, primary first.
    pub members: Vec<u32>,
    /// The OSDs being backfilled in this interval: they take every write
    /// like the members do, while the primary copies the rest to them.
    pub backfill: Vec<u32>,
}

impl Activation {
    /// Where the primary sends each write: the other members, then the
    /// backfill targets.
    pub fn replicas(&self) -> Vec<u32> {
        let replicas: Vec<u32> = self.members[1..].iter().chain(self.outside_targets()).copied().collect();
        debug_assert!(!replicas.contains(&self.members[0]), "the primary is among its own replicas: {self:?}");
        replicas
    }

    /// The backfill targets that are not members (a member filled in the
    /// background is a member and a target).
    pub fn outside_targets(&self) -> impl Iterator<Item = &u32> {
        self.backfill.iter().filter(|t| !self.members.contains(t))
    }

    /// The targets `osd`, this interval's primary, sends writes ahead of
    /// the backfill's walk without their data (`elide.rs`): the outside
    /// ones, unless the primary is the PG's one whole copy (a member filled
    /// in the background is not whole yet). Its targets are then the only
    /// other place its writes live, where closing the known gap "The one
    /// whole copy of a PG being filled" (docs/RELIABILITY.md) would take
    /// them from.
    pub fn elided_targets(&self, osd: u32) -> Vec<u32> {
        let whole = self.members.iter().filter(|m| **m != duplex_map::NO_OSD && !self.backfill.contains(m)).count();
        if whole < 2 || duplex_map::primary_of(&self.members) != Some(osd) {
            return Vec::new();
        }
        self.outside_targets().copied().collect()
    }

    /// Whether `osd` takes this interval's writes without their data.
    pub fn takes_elided(&self, osd: u32) -> bool {
        self.outside_targets().any(|t| *t == osd)
    }
}

/// A replica PG waiting this long on a sequence gap is reported: it missed
/// entries (it was down) and only peering can bring them back.
pub const STALLED_GAP: Duration = Duration::from_secs(5);

impl Pg {
    fn new(key: u32, log: PgLog<Box<dyn Region>>) -> Pg {
        let sync_seq = log.next_seq() - 1;
        Pg {
            key,
            log,
            index: IndexCache::default(),
            early: BTreeMap::new(),
            sync_seq,
            waiters: false,
            dirty: false,
            requests: RequestTable::default(),
            ids_record_created: false,
            stored_ids_loaded: false,
            uncommitted: Uncommitted::default(),
            lag: lag::ReplicationLag::default(),
            moving: false,
            gap_since: None,
            gap_reported: false,
            newest_epoch: None,
            active: None,
            asked_interval: 0,
            history: VecDeque::new(),
            backfill_lock: None,
            elide: None,
            staged: None,
            apply_limit: 0,
            holds_back: false,
            ec_pending: BTreeSet::new(),
            tier: None,
            tier_load_asked: None,
            ids_purged_past: None,
        }
    }

    /// Primary of an erasure-coded PG: the seq through which every shard
    /// has logged every entry (an entry's `version`).
    pub fn ec_watermark(&self) -> u64 {
        self.ec_pending.first().map_or(self.last_seq(), |seq| seq - 1)
    }

    /// Peering of an erasure-coded PG: drops the log's entries after seq
    /// `to` (fewer than k shards logged them), with their index, request
    /// ids and history. The rest stay held back until the activation
    /// applies them (`flusher/held.rs` says why, and how the rebuild reads
    /// them meanwhile); `to == u64::MAX` (a member rebuilt next) applies
    /// its whole log now instead. `Err`: an entry after `to` reached the
    /// store already (it cannot be rolled back; the apply limit exists so
    /// that this never happens).
    pub fn settle(&mut self, to: u64) -> Result<usize, String> {
        if self.flushed_through() > to {
            return Err(format!(
                "entries through seq {} were applied here, past the seq {to} to settle at",
                self.flushed_through()
            ));
        }
        let dropped = self.log.truncate_after(to).map_err(|e| e.to_string())?;
        if dropped > 0 {
            self.index.truncate_after(to);
            self.requests.forget_after(to);
            while self.history.back().is_some_and(|(seq, ..)| *seq > to) {
                self.history.pop_back();
            }
            self.early.clear();
        }
        // A limit past `to` (raised for entries now dropped) must not let
        // the next interval's entries be applied before their watermark.
        // (It may lie below what the store holds: after a restart the
        // limit counts from the replayed entries only.)
        self.apply_limit = self.apply_limit.min(to);
        if to == u64::MAX {
            // Rebuilt next (or behind): its own log applies first.
            self.apply_limit = self.apply_limit.max(self.last_seq());
        }
        debug_assert!(self.last_seq() <= to, "entries past the settled seq remain");
        Ok(dropped)
    }

    /// Whether live entries the flusher may apply remain in the log (the
    /// ones after [`Pg::apply_limit`] wait there).
    pub fn has_applicable_entries(&self) -> bool {
        !self.log.is_empty() && self.flushed_through() < self.apply_limit
    }

    /// Primary side: whether this PG is active for the acting set `acting`
    /// of the current map, none of whose members restarted (a restart
    /// moves an OSD's `state_epoch` past the interval), and no interval
    /// went active after this one: `recorded_since` is the interval of the
    /// PG's last active set in the map (`duplex_map::active_set`).
    ///
    /// The acting set alone does not tell intervals apart: a PG may move
    /// away to OSDs that exclude this one (which is then never fenced, as
    /// no one queries it), take writes there, and come back to the very
    /// same acting set. This OSD's activation then looks current, but its
    /// copy misses every write of the intervals between (simulator seed
    /// 50631 read a value 22 s old that way). Every interval that goes
    /// active without this OSD records its members, since its own epoch,
    /// before it serves: a record newer than the activation means the PG
    /// was active elsewhere meanwhile.
    pub fn serves(&self, acting: &[u32], state_epoch: impl Fn(u32) -> u64, recorded_since: Option<u64>) -> bool {
        self.active.as_ref().is_some_and(|active| {
            active.members == acting
                // (An erasure-coded PG's hole is no OSD to have restarted.)
                && acting.iter().filter(|osd| **osd != duplex_map::NO_OSD).all(|osd| state_epoch(*osd) <= active.interval)
                && recorded_since.is_none_or(|since| since <= active.interval)
        })
    }

    /// Replica side: whether an entry its primary stamped with `epoch`
    /// belongs to the interval this PG is active in.
    pub fn accepts(&self, epoch: u32) -> bool {
        self.active.as_ref().is_some_and(|active| epoch as u64 >= active.interval)
    }

    /// Peering's fence: from now on nothing of an older interval is taken.
    /// Returns the early entries dropped (their primary is answered Retry).
    pub fn fence(&mut self, interval: u64) -> Vec<Ack> {
        debug_assert!(interval >= self.asked_interval, "fences only move forward");
        self.asked_interval = interval;
        self.active = None;
        self.backfill_lock = None;
        self.elide = None;
        self.staged = None;
        self.gap_since = None;
        self.gap_reported = false;
        self.ec_pending.clear();
        self.lag.clear();
        self.moving = false;
        std::mem::take(&mut self.early).into_iter().map(|(seq, (_, to))| Ack { seq, to }).collect()
    }

    /// Notes a logged entry: its epoch, and its object in the recent
    /// history (the oldest falls out).
    fn remember(&mut self, seq: u64, epoch: u32, object: &[u8], snap: u64) {
        self.newest_epoch = Some(self.newest_epoch.map_or(epoch, |e| e.max(epoch)));
        debug_assert!(self.history.back().is_none_or(|(last, ..)| *last + 1 == seq), "the history is contiguous");
        // The name falling out lends its buffer to the new one: no
        // allocation per write once the history is full.
        let mut name = match self.history.len() == HISTORY_LEN {
            true => self.history.pop_front().map(|(.., name, _)| name).unwrap_or_default(),
            false => Vec::new(),
        };
        name.clear();
        name.extend_from_slice(object);
        self.history.push_back((seq, epoch, name, snap));
        debug_assert!(self.history.len() <= HISTORY_LEN, "the recent history outgrew its bound");
    }

    /// The oldest seq whose object the history names (`last_seq + 1`: none).
    pub fn history_from(&self) -> u64 {
        debug_assert!(
            self.history.back().is_none_or(|(last, ..)| *last == self.last_seq()),
            "the recent history does not end at the log's last entry"
        );
        self.history.front().map_or(self.last_seq() + 1, |(seq, ..)| *seq)
    }

    /// The objects entries `(after, through]` touched, if the history still
    /// covers them and holds entry `after` with epoch `after_epoch` (the
    /// asker's log is then a prefix of this one).
    pub fn touched(&self, after: u64, after_epoch: u32, through: u64) -> Option<Vec<Vec<u8>>> {
        let from = self.history_from();
        if after < from || through > self.last_seq() {
            return None;
        }
        let (seq, epoch, ..) = self.history.get((after - from) as usize)?;
        debug_assert_eq!(*seq, after, "the history is contiguous");
        if *epoch != after_epoch {
            return None;
        }
        // An entry logged under a snapshot may have made the head's clone
        // for it (crate::snaps): a copy of the object carries that too.
        let mut names: Vec<Vec<u8>> = Vec::new();
        for (_, _, object, snap) in self.history.iter().filter(|(seq, ..)| *seq > after && *seq <= through) {
            names.push(object.to_vec());
            if *snap != 0 {
                names.push(crate::snaps::clone_name(object, *snap));
            }
        }
        names.sort_unstable();
        names.dedup();
        Some(names)
    }

    /// The ids of the recent mutations of `object` this PG's history names
    /// and its table tracks: an object copied from here carries their
    /// effects, so the copy's receiver must know them (a resend of one
    /// would otherwise run a second time).
    pub fn requests_touching(&self, object: &[u8]) -> Vec<LoggedRequest> {
        self.history
            .iter()
            .filter(|(_, _, touched, _)| touched[..] == *object)
            .filter_map(|(seq, ..)| {
                self.requests.at_seq(*seq).map(|id| LoggedRequest { client: id.client, tid: id.tid, seq: *seq })
            })
            .collect()
    }

    /// The store operations that record ids which came with an object
    /// peering's recovery installs, in the same batch as the object: the
    /// slots of their seqs. The table itself changes only once that batch
    /// applied ([`Pg::take_installed_ids`]).
    pub fn installed_ids_ops(&self, partition: u32, installed: &[LoggedRequest]) -> Vec<Op> {
        stored_requests::record_ids(partition, self.key, installed)
    }

    /// Adds ids that came with an object peering's recovery installed
    /// (their effects are in the store now, and so is their record).
    pub fn take_installed_ids(&mut self, installed: &[LoggedRequest]) {
        set_committed(&mut self.requests, installed);
    }

    /// Peering's end: the log (empty) continues after `last_seq` (an entry
    /// of `last_epoch`), and the PG is active in `activation.interval`,
    /// persisted as its last active one. `rebuilt`: recovery changed this
    /// member's store, so its own history no longer holds. `requests`: the
    /// ids of the authoritative history, which replace this member's own.
    /// Returns whether this member's own history was replaced (it was
    /// rebuilt, or its log ends elsewhere than the authority's).
    pub fn activate(
        &mut self,
        last_seq: u64,
        last_epoch: u32,
        activation: Activation,
        rebuilt: bool,
        requests: &[LoggedRequest],
    ) -> Result<bool, LogError> {
        assert!(self.log.is_empty(), "activation follows a flush");
        assert_eq!(activation.interval, self.asked_interval, "activation in another interval than the one queried");
        assert!(
            duplex_map::primary_of(&activation.members).is_some_and(|primary| !activation.backfill.contains(&primary)),
            "an activation without a primary, or backfilling it: {activation:?}"
        );
        let replaced = rebuilt || (last_seq, last_epoch) != (self.last_seq(), self.log.last_epoch());
        if replaced {
            self.history.clear();
        }
        self.log.set_position(last_seq + 1, last_epoch, activation.interval)?;
        // Every member holds every entry through the activation's seq.
        self.apply_limit = self.apply_limit.max(last_seq);
        debug_assert_eq!(self.last_seq(), last_seq, "the log continues after the authority's last entry");
        self.sync_seq = last_seq;
        self.newest_epoch = None;
        self.requests.replace(requests);
        self.stored_ids_loaded = true;
        self.backfill_lock = None;
        self.elide = None;
        self.lag.clear();
        self.moving = false;
        self.active = Some(activation);
        Ok(replaced)
    }

    /// Appends an encoded entry (the same bytes go to the replicas, or came
    /// from the primary), indexes it, and records its request id in
    /// `state`: a replica's entry is committed as far as it knows; the
    /// primary's is in flight until the replicas acknowledge.
    pub fn append_encoded(
        &mut self,
        entry: &EntryRef<'_>,
        encoded: &[u8],
        state: RequestState,
    ) -> Result<(), LogError> {
        debug_assert_eq!(entry.pg, self.key, "entry for another PG");
        debug_assert_eq!(entry.seq, self.log.next_seq(), "entries are appended in seq order");
        let at = self.log.append_encoded(entry.seq, encoded)?;
        debug_assert!(entry.version <= entry.seq, "an entry may be applied only once logged");
        self.apply_limit = self.apply_limit.max(entry.version);
        self.holds_back |= entry.version < entry.seq;
        crate::metrics::copies::count(crate::metrics::copies::Site::LogAppend, entry.data.len());
        self.remember(entry.seq, entry.epoch, entry.object, entry.snap);
        self.index.insert_ref(entry, at);
        self.requests.set(entry.request, state, entry.seq);
        debug_assert_eq!(self.last_seq(), entry.seq, "the appended entry is the log's newest");
        Ok(())
    }

    /// Replica side: logs `entry` (decoded from `encoded`) if it is next,
    /// keeps it for later if it is early or the log is full; returns the
    /// acknowledgements now due (entries logged by this call, or before).
    pub fn offer(&mut self, entry: &EntryRef<'_>, encoded: &Bytes, to: ReplyTo) -> Result<Vec<Ack>, OfferError> {
        let next = self.log.next_seq();
        if entry.seq < next {
            // A resend of an entry already logged is acknowledged again; but
            // one from a newer epoch reuses the seq for another write, and
            // acknowledging it without applying it would lose that write.
            if let Some(logged) = self.newest_epoch.filter(|logged| entry.epoch > *logged) {
                return Err(OfferError::Diverged { seq: entry.seq, epoch: entry.epoch, logged });
            }
            return Ok(vec![Ack { seq: entry.seq, to }]);
        }
        if entry.seq == next && self.early.is_empty() {
            // The common case: in order, nothing waiting.
            return match self.append_encoded(entry, encoded, RequestState::Committed) {
                Ok(()) => Ok(vec![Ack { seq: entry.seq, to }]),
                Err(LogError::Full) => {
                    self.early.insert(entry.seq, (encoded.clone(), to));
                    Ok(Vec::new())
                }
                Err(err) => Err(err.into()),
            };
        }
        if self.early.len() >= MAX_EARLY_ENTRIES && entry.seq != next {
            return Err(OfferError::TooFarAhead { seq: entry.seq, waiting: self.early.len() });
        }
        self.early.insert(entry.seq, (encoded.clone(), to));
        let acks = self.drain_early()?;
        self.track_gap();
        debug_assert!(acks.iter().all(|ack| ack.seq <= self.last_seq()), "an ack for an entry not logged");
        Ok(acks)
    }

    /// Notes when early entries start waiting on a gap (not on room).
    fn track_gap(&mut self) {
        let gap = self.early.first_key_value().is_some_and(|(seq, _)| *seq > self.log.next_seq());
        match (gap, self.gap_since) {
            (true, None) => self.gap_since = Some(Instant::now()),
            (false, Some(_)) => {
                self.gap_since = None;
                self.gap_reported = false;
            }
            _ => {}
        }
    }

    /// Once per gap: whether this PG has waited on one for `after`
    /// ([`STALLED_GAP`]); then the seq it waits for and the first it holds.
    pub fn take_stalled_gap(&mut self, after: Duration) -> Option<(u64, u64)> {
        let since = self.gap_since?;
        if self.gap_reported || since.elapsed() < after {
            return None;
        }
        self.gap_reported = true;
        let first = self.early.first_key_value().map_or(0, |(seq, _)| *seq);
        Some((self.log.next_seq(), first))
    }

    /// Logs the kept entries that are now in turn, while there is room.
    pub fn drain_early(&mut self) -> Result<Vec<Ack>, LogError> {
        let mut acks = Vec::new();
        while let Some(slot) = self.early.first_entry() {
            if *slot.key() != self.log.next_seq() {
                break;
            }
            let (encoded, to) = slot.remove();
            // Checked when it arrived; decoding again only re-borrows its fields.
            let entry = EntryRef::decode(&encoded).expect("kept entries were decoded once already");
            match self.append_encoded(&entry, &encoded, RequestState::Committed) {
                Ok(()) => acks.push(Ack { seq: entry.seq, to }),
                Err(LogError::Full) => {
                    self.early.insert(entry.seq, (encoded.clone(), to));
                    break;
                }
                Err(err) => return Err(err),
            }
        }
        self.track_gap();
        debug_assert!(acks.windows(2).all(|w| w[0].seq + 1 == w[1].seq), "early entries logged out of turn");
        Ok(acks)
    }

    /// The next entry in turn is here but the log had no room for it.
    pub fn waiting_for_room(&self) -> bool {
        self.early.first_key_value().is_some_and(|(seq, _)| *seq == self.log.next_seq())
    }

    pub fn has_early(&self) -> bool {
        !self.early.is_empty()
    }

    /// The seq of the newest logged entry (0: none ever).
    pub fn last_seq(&self) -> u64 {
        self.log.next_seq() - 1
    }

    /// Adds to the id table, once, the ids the store kept for this PG
    /// (stored_requests.rs) up to seq `end`: one past where this member's
    /// history ends is of no history it continues.
    pub fn load_stored_ids(&mut self, partition: &mut Partition, end: u64) -> Result<(), StoreError> {
        if !self.stored_ids_loaded {
            let stored = stored_requests::read_record(partition, self.key)?;
            // Its room is taken already: no more to keep for it.
            self.ids_record_created |= stored.is_some();
            let stored: Vec<LoggedRequest> =
                stored.unwrap_or_default().into_iter().filter(|request| request.seq <= end).collect();
            self.requests.load(&stored);
            self.stored_ids_loaded = true;
        }
        Ok(())
    }

    /// The store room this PG may still need for what it holds: its log's
    /// entries, and its request-id record until that exists (its first
    /// flush here allocates it whole, [`stored_requests::RECORD_BYTES`]).
    /// The OSD counts it against its full ratio, so that an accepted write
    /// always finds room when it is flushed (issue 24).
    pub fn reserved_bytes(&self) -> u64 {
        let record = if self.ids_record_created { 0 } else { stored_requests::RECORD_BYTES as u64 };
        self.log.live_bytes() + record
    }

    /// The onode slots this PG's flush may still need in its partition (an
    /// object's metadata is a chain of slots, `duplex_store::onode`),
    /// counted against the OSD's full ratios like [`Pg::reserved_bytes`]:
    /// - each object the log names may be created (a head slot): one per
    ///   object, not per entry, or a burst of small writes to a few objects
    ///   made an OSD with a small store refuse writes as full at once, with
    ///   most of its slots free (`lcam_keeps_each_pgs_writes_in_connection_order_at_primary_and_replica`
    ///   in CI, session 37);
    /// - each entry may split or add a couple of extents (the slack);
    /// - a write's extents take 12 bytes of the chain for each 4 KiB it
    ///   maps at most;
    /// - an attribute's, omap's or chunk map's entry puts its bytes in it;
    /// - the request-id record needs its chain until it exists.
    ///
    /// Not counted: the clone a write makes of its head under a new
    /// snapshot, whose chain is the head's (the full ratio's margin covers
    /// a few).
    pub fn reserved_onode_slots(&self) -> u64 {
        const FRAGMENT: u64 = duplex_store::onode::FRAGMENT_CAPACITY as u64;
        const SLACK: u64 = 32;
        let entries = self.log.len() as u64;
        let chain_bytes = self.log.live_bytes() * 12 / 4096 + self.log.live_metadata_bytes() + SLACK * entries;
        let record = if self.ids_record_created {
            0
        } else {
            1 + (stored_requests::RECORD_BYTES as u64 / 4096 * 12).div_ceil(FRAGMENT)
        };
        // Every live entry is indexed, so the index names each object once.
        let heads = self.index.len() as u64;
        debug_assert!(heads <= entries, "the index names an object with no live entry");
        heads + chain_bytes.div_ceil(FRAGMENT) + record
    }

    /// The store operations that keep the ids of the entries `flushed`
    /// (now in the store, in log order) past the log's trim.
    pub fn record_flushed_ids(&mut self, partition: u32, flushed: RangeInclusive<u64>) -> Vec<Op> {
        debug_assert_eq!(*flushed.start(), self.flushed_through() + 1, "ids recorded from the first unflushed entry");
        debug_assert!(*flushed.end() <= self.last_seq(), "ids recorded for entries never logged");
        let mut ops = Vec::new();
        if !std::mem::replace(&mut self.ids_record_created, true) {
            ops.push(stored_requests::create(partition, self.key));
        }
        ops.extend(stored_requests::record(partition, self.key, &self.requests, flushed));
        ops
    }

    /// The ids of entries in the store, for a rewrite of the whole record
    /// (those still in the log are not: a power cut could take their writes).
    pub fn flushed_ids(&mut self) -> Vec<LoggedRequest> {
        let flushed = self.flushed_through();
        self.requests.logged().into_iter().filter(|request| request.seq <= flushed).collect()
    }

    /// Where this PG's primary sends a write: the other members, and the
    /// backfill targets but those whose walk has not begun (dormant:
    /// `elide.rs`).
    pub fn replicas(&self) -> Vec<u32> {
        let mut replicas = self.active.as_ref().map(Activation::replicas).unwrap_or_default();
        if let Some(elide) = &self.elide {
            replicas.retain(|osd| !elide.is_dormant(*osd));
        }
        replicas
    }

    /// The seq of the newest entry in the store: the log holds the ones
    /// after it (a log's live entries have consecutive seqs).
    pub fn flushed_through(&self) -> u64 {
        self.last_seq() - self.log.len() as u64
    }

    /// After the store holds every entry through `seq`: drop them from the log and index.
    pub fn trim(&mut self, seq: u64) -> Result<(), LogError> {
        debug_assert!(seq <= self.last_seq(), "a trim through {seq}, past the last entry {}", self.last_seq());
        self.log.trim(seq)?;
        self.index.trim(seq);
        debug_assert!(self.flushed_through() >= seq, "entries through {seq} are still in the log after a trim");
        debug_assert!(self.index.len() <= self.log.len(), "the index names an object with no live entry");
        Ok(())
    }
}

/// Every PG this OSD has a log for.
pub struct PgTable {
    mode: OplogMode,
    dir: PathBuf,
    region_bytes: u64,
    pgs: RwLock<HashMap<u32, SharedPg>>,
    opening: Mutex<()>,
    _lock: File,
}

#[derive(Debug, thiserror::Error)]
pub enum PgTableError {
    #[error("operation-log directory {0}: {1}")]
    Dir(PathBuf, std::io::Error),
    #[error("operation-log directory {0} is in use by another OSD")]
    Busy(PathBuf),
    #[error("opening the log of PG {key:#x} at {path}: {source}")]
    Open { key: u32, path: PathBuf, source: LogError },
}

fn open_region(mode: OplogMode, path: &Path, len: u64) -> std::io::Result<Box<dyn Region>> {
    Ok(match mode {
        OplogMode::Shm => Box::new(MmapRegion::open(path, len, false)?),
        OplogMode::Pmem => Box::new(MmapRegion::open(path, len, true)?),
        OplogMode::File => Box::new(FileRegion::open(path, len)?),
    })
}

impl PgTable {
    /// Opens the log directory (creating it) and locks it against a second OSD.
    pub fn open(mode: OplogMode, dir: &Path, region_bytes: u64) -> Result<PgTable, PgTableError> {
        let err = |e| PgTableError::Dir(dir.to_path_buf(), e);
        std::fs::create_dir_all(dir).map_err(err)?;
        let lock = OpenOptions::new().create(true).truncate(false).write(true).open(dir.join("LOCK")).map_err(err)?;
        // SAFETY: flock on an fd we own; no memory is involved.
        if unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(PgTableError::Busy(dir.to_path_buf()));
        }
        Ok(PgTable {
            mode,
            dir: dir.to_path_buf(),
            region_bytes,
            pgs: RwLock::new(HashMap::new()),
            opening: Mutex::new(()),
            _lock: lock,
        })
    }

    fn path_of(&self, key: u32) -> PathBuf {
        self.dir.join(format!("pg-{key:08x}.log"))
    }

    /// Opens every log already in the directory; returns each PG with its
    /// live entries (to replay before serving).
    pub fn recover(&self) -> Result<Vec<(SharedPg, Vec<Entry>)>, PgTableError> {
        let mut found = Vec::new();
        let entries = std::fs::read_dir(&self.dir).map_err(|e| PgTableError::Dir(self.dir.clone(), e))?;
        for item in entries {
            let item = item.map_err(|e| PgTableError::Dir(self.dir.clone(), e))?;
            let name = item.file_name();
            let Some(key) = name
                .to_str()
                .and_then(|n| n.strip_prefix("pg-"))
                .and_then(|n| n.strip_suffix(".log"))
                .and_then(|hex| u32::from_str_radix(hex, 16).ok())
            else {
                continue;
            };
            found.push(self.open_pg(key)?);
        }
        found.sort_by_key(|(pg, _)| pg.lock().map(|p| p.key).unwrap_or(0));
        Ok(found)
    }

    fn open_pg(&self, key: u32) -> Result<(SharedPg, Vec<Entry>), PgTableError> {
        let path = self.path_of(key);
        let open_err = |source| PgTableError::Open { key, path: path.clone(), source };
        let region = open_region(self.mode, &path, self.region_bytes).map_err(|e| open_err(LogError::Io(e)))?;
        let (log, entries) = PgLog::open(region, key).map_err(open_err)?;
        let mut pg = Pg::new(key, log);
        // Index the recovered entries so reads see them until they are flushed.
        let offsets: Vec<u64> = pg.log.offsets().collect();
        debug_assert_eq!(offsets.len(), entries.len(), "one offset per live entry");
        assert!(entries.last().is_none_or(|e| e.seq == pg.last_seq()), "the recovered entries end at the log's end");
        for (entry, at) in entries.iter().zip(offsets) {
            pg.apply_limit = pg.apply_limit.max(entry.version);
            pg.holds_back |= entry.version < entry.seq;
            pg.index.insert(entry, at);
            pg.requests.set(entry.request, RequestState::Committed, entry.seq);
            pg.remember(entry.seq, entry.epoch, &entry.object, entry.snap);
        }
        let shared = Arc::new(Mutex::new(pg));
        self.pgs.write().expect("PG table lock").insert(key, shared.clone());
        Ok((shared, entries))
    }

    pub fn get(&self, key: u32) -> Option<SharedPg> {
        self.pgs.read().expect("PG table lock").get(&key).cloned()
    }

    /// The PG's log, created on first use.
    pub fn get_or_open(&self, key: u32) -> Result<SharedPg, PgTableError> {
        if let Some(pg) = self.get(key) {
            return Ok(pg);
        }
        // Two threads may race here: one opens (maps) the file, the other waits.
        let _opening = self.opening.lock().expect("PG open lock");
        if let Some(pg) = self.get(key) {
            return Ok(pg);
        }
        Ok(self.open_pg(key)?.0)
    }

    /// Every open PG.
    pub fn all(&self) -> Vec<SharedPg> {
        self.pgs.read().expect("PG table lock").values().cloned().collect()
    }
}

/// Sets each of `requests` in `table` as committed at its seq.
fn set_committed(table: &mut RequestTable, requests: &[LoggedRequest]) {
    for request in requests {
        table.set(RequestId { client: request.client, tid: request.tid }, RequestState::Committed, request.seq);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use duplex_oplog::OpKind;

    #[test]
    fn a_read_waits_only_for_writes_in_flight_that_overlap_it() {
        let mut uncommitted = Uncommitted::default();
        let object = Bytes::from_static(b"obj");
        uncommitted.begin(1, object.clone(), 4096, 8192);
        uncommitted.begin(2, object.clone(), 0, u64::MAX);
        assert!(uncommitted.touches(b"obj", 0, 10), "the whole-object write covers it");
        uncommitted.end(2);
        assert!(!uncommitted.touches(b"obj", 0, 4096), "adjacent, not overlapping");
        assert!(uncommitted.touches(b"obj", 8191, 8192));
        assert!(!uncommitted.touches(b"other", 4096, 8192), "another object");
        uncommitted.end(7);
        uncommitted.end(1);
        assert!(uncommitted.is_empty() && !uncommitted.touches(b"obj", 0, u64::MAX));
    }

    fn entry(seq: u64, len: usize) -> Entry {
        Entry {
            pg: 7,
            epoch: 1,
            version: seq,
            seq,
            op: OpKind::Write,
            object: b"obj".to_vec(),
            offset: 0,
            data: vec![seq as u8; len],
            request: Default::default(),
            snap: 0,
        }
    }

    fn to(txid: u64) -> ReplyTo {
        ReplyTo { thread: 0, token: 2, txid }
    }

    #[test]
    fn a_seq_reused_by_a_newer_epoch_is_refused_not_acknowledged() {
        let (_dir, _table, shared) = pg_7();
        let mut pg = shared.lock().unwrap();
        for seq in 1..=3 {
            offer(&mut pg, seq, 100, seq);
        }
        // A resend of a logged entry (same epoch) is acknowledged again.
        assert_eq!(offer(&mut pg, 2, 100, 9).len(), 1);
        // The same seq from a later epoch is another write: refused.
        let mut newer = entry(2, 100);
        newer.epoch += 1;
        let encoded = Bytes::from(newer.encode());
        let refused = pg.offer(&EntryRef::decode(&encoded).unwrap(), &encoded, to(10));
        assert!(matches!(refused, Err(OfferError::Diverged { seq: 2, .. })), "{refused:?}");
    }

    /// Seed 50631: a PG that moved away from this OSD and came back to the
    /// same acting set is not served on the activation of before: the map
    /// records a newer active interval.
    #[test]
    fn an_activation_older_than_the_maps_record_does_not_serve() {
        let (_dir, _table, shared) = pg_7();
        let mut pg = shared.lock().unwrap();
        let acting = [0, 2, 1];
        let fresh = |_: u32| 40;
        assert!(!pg.serves(&acting, fresh, None), "never activated");
        pg.active = Some(Activation { interval: 48, members: acting.to_vec(), backfill: Vec::new() });
        assert!(pg.serves(&acting, fresh, None), "no record (a new pool)");
        assert!(pg.serves(&acting, fresh, Some(48)), "recorded by its own peering");
        assert!(pg.serves(&acting, fresh, Some(30)), "an older record of the same members");
        assert!(!pg.serves(&acting, fresh, Some(62)), "active elsewhere since: stale");
        assert!(!pg.serves(&[2, 1, 3], fresh, Some(48)), "another acting set");
        assert!(!pg.serves(&acting, |osd| if osd == 1 { 50 } else { 40 }, Some(48)), "a member restarted since");
    }

    #[test]
    fn a_gap_that_does_not_fill_is_reported_once() {
        let (_dir, _table, shared) = pg_7();
        let mut pg = shared.lock().unwrap();
        offer(&mut pg, 1, 100, 1);
        assert_eq!(pg.take_stalled_gap(Duration::ZERO), None, "no gap yet");
        assert!(offer(&mut pg, 5, 100, 5).is_empty(), "entry 5 waits for 2..4");
        assert_eq!(pg.take_stalled_gap(Duration::from_secs(3600)), None, "not waited long enough");
        assert_eq!(pg.take_stalled_gap(Duration::ZERO), Some((2, 5)));
        assert_eq!(pg.take_stalled_gap(Duration::ZERO), None, "reported once");
        for seq in 2..=4 {
            offer(&mut pg, seq, 100, seq);
        }
        assert_eq!(pg.last_seq(), 5, "the gap filled and 5 was logged");
        assert_eq!(pg.take_stalled_gap(Duration::ZERO), None);
    }

    fn offer(pg: &mut Pg, seq: u64, len: usize, txid: u64) -> Vec<(u64, ReplyTo)> {
        let encoded = Bytes::from(entry(seq, len).encode());
        let decoded = EntryRef::decode(&encoded).unwrap();
        pg.offer(&decoded, &encoded, to(txid)).unwrap().into_iter().map(|a| (a.seq, a.to)).collect()
    }

    fn drain(pg: &mut Pg) -> Vec<(u64, ReplyTo)> {
        pg.drain_early().unwrap().into_iter().map(|a| (a.seq, a.to)).collect()
    }

    fn table(dir: &Path, bytes: u64) -> PgTable {
        PgTable::open(OplogMode::Shm, dir, bytes).unwrap()
    }

    /// PG 7 in a fresh table with 1 MiB logs (and what must outlive it).
    fn pg_7() -> (tempfile::TempDir, PgTable, SharedPg) {
        let dir = tempfile::tempdir().unwrap();
        let table = table(dir.path(), 1 << 20);
        let shared = table.get_or_open(7).unwrap();
        (dir, table, shared)
    }

    #[test]
    fn a_pg_keeps_room_for_its_log_and_for_its_id_record_until_that_exists() {
        let (_dir, _table, shared) = pg_7();
        let mut pg = shared.lock().unwrap();
        let record = stored_requests::RECORD_BYTES as u64;
        assert_eq!(pg.reserved_bytes(), record, "a new PG's first flush allocates its record");
        offer(&mut pg, 1, 100, 1);
        let logged = pg.log.live_bytes();
        assert!(logged >= 100);
        assert_eq!(pg.reserved_bytes(), logged + record);
        let ops = pg.record_flushed_ids(0, 1..=1);
        assert!(matches!(ops[0], Op::CreatePreallocated { size, .. } if size == record));
        assert_eq!(pg.reserved_bytes(), logged, "the record is asked for with the flush");

        // After a restart: a record the store holds needs no more room.
        let test_store = crate::TestStore::new(1);
        let mut store = test_store.open();
        let partition = store.partition_mut(0);
        let mut batch = duplex_store::Batch::new();
        batch.push(stored_requests::create(0, 7));
        partition.apply(&batch).unwrap();
        let (_dir, _table, reopened) = pg_7();
        let mut reopened = reopened.lock().unwrap();
        assert_eq!(reopened.reserved_bytes(), record);
        reopened.load_stored_ids(partition, 0).unwrap();
        assert_eq!(reopened.reserved_bytes(), 0);
        // And one it does not hold still does.
        let (_dir, _table, other) = pg_7();
        let mut other = other.lock().unwrap();
        let empty = crate::TestStore::new(1);
        let mut empty_store = empty.open();
        other.load_stored_ids(empty_store.partition_mut(0), 0).unwrap();
        assert_eq!(other.reserved_bytes(), record);
    }

    #[test]
    fn replica_logs_in_seq_order_whatever_the_arrival_order() {
        let dir = tempfile::tempdir().unwrap();
        let pgs = table(dir.path(), 1 << 20);
        let pg = pgs.get_or_open(7).unwrap();
        let mut pg = pg.lock().unwrap();
        assert_eq!(offer(&mut pg, 2, 10, 2), vec![], "seq 2 waits for seq 1");
        assert_eq!(offer(&mut pg, 3, 10, 3), vec![]);
        assert_eq!(offer(&mut pg, 1, 10, 1), vec![(1, to(1)), (2, to(2)), (3, to(3))]);
        // A duplicate (a resend) is acknowledged, not logged again.
        assert_eq!(offer(&mut pg, 2, 10, 9), vec![(2, to(9))]);
        let seqs: Vec<u64> = pg.log.entries().map(|e| e.unwrap().seq).collect();
        assert_eq!(seqs, vec![1, 2, 3]);
        assert!(pg.index.contains(b"obj"));
    }

    #[test]
    fn a_full_replica_log_keeps_the_entry_until_a_trim_makes_room() {
        let dir = tempfile::tempdir().unwrap();
        let pgs = table(dir.path(), 128 + 8192);
        let pg = pgs.get_or_open(7).unwrap();
        let mut pg = pg.lock().unwrap();
        assert_eq!(offer(&mut pg, 1, 3000, 1).len(), 1);
        assert_eq!(offer(&mut pg, 2, 3000, 2).len(), 1);
        assert_eq!(offer(&mut pg, 3, 3000, 3), vec![], "no room for a third");
        assert!(pg.waiting_for_room());
        pg.trim(2).unwrap();
        assert_eq!(drain(&mut pg), vec![(3, to(3))]);
        assert!(!pg.has_early());
    }

    #[test]
    fn logs_are_recovered_and_indexed_on_reopen() {
        let dir = tempfile::tempdir().unwrap();
        {
            let pgs = table(dir.path(), 1 << 20);
            let pg = pgs.get_or_open(7).unwrap();
            let mut pg = pg.lock().unwrap();
            for seq in 1..=3 {
                let encoded = entry(seq, 100).encode();
                pg.append_encoded(&EntryRef::decode(&encoded).unwrap(), &encoded, RequestState::Committed).unwrap();
            }
        }
        let pgs = table(dir.path(), 1 << 20);
        let recovered = pgs.recover().unwrap();
        assert_eq!(recovered.len(), 1);
        let (pg, entries) = &recovered[0];
        assert_eq!(entries.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
        let pg = pg.lock().unwrap();
        assert_eq!(pg.index.read(&pg.log, b"obj", 0, 100), Some(vec![3u8; 100]), "the newest entry wins");
    }

    #[test]
    fn early_entries_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let pgs = table(dir.path(), 1 << 20);
        let pg = pgs.get_or_open(7).unwrap();
        let mut pg = pg.lock().unwrap();
        for seq in 2..2 + MAX_EARLY_ENTRIES as u64 {
            assert_eq!(offer(&mut pg, seq, 1, seq), vec![]);
        }
        let encoded = Bytes::from(entry(5000, 1).encode());
        let refused = pg.offer(&EntryRef::decode(&encoded).unwrap(), &encoded, to(5000));
        assert!(matches!(refused, Err(OfferError::TooFarAhead { .. })));
        // The missing predecessor still gets in, and releases the others.
        assert_eq!(offer(&mut pg, 1, 1, 1).len(), 1 + MAX_EARLY_ENTRIES);
    }

    #[test]
    fn a_second_table_on_the_same_directory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let _first = table(dir.path(), 1 << 20);
        assert!(matches!(PgTable::open(OplogMode::Shm, dir.path(), 1 << 20), Err(PgTableError::Busy(_))));
    }

    #[test]
    fn pg_keys_pack_pool_and_number() {
        let key = pg_key(3, 1000).unwrap();
        assert_eq!((pool_of(key), pg_number(key)), (3, 1000));
        assert_eq!(pg_key(MAX_POOL_ID + 1, 0), None);
        assert_eq!(pg_key(1, 1 << 20), None);
    }
}
