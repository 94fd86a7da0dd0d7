//! The messages between the OSD's threads, in one place, so no thread's
//! module has to import another's to talk to it (DESIGN.md §6):
//!
//! - to a **flusher** (one per store partition): a [`Job`];
//! - to a **priority thread**: a [`Completion`], through its [`Mailbox`] (a
//!   channel plus a mio waker, so the event loop sleeps in one
//!   `epoll_wait` for both sockets and posted work);
//! - from an operation to the thread that owns its connection: an
//!   [`Outcome`] (what network I/O is left to do), for a [`ClientOp`];
//! - to a **pool worker** (`threading = pool`): a [`PoolTask`];
//! - to the **peering thread**: a [`ScrubAsk`], in [`ScrubRequests`].
//!
//! **Bounds, and why they cannot deadlock.** A flusher's and a pool
//! worker's queues are bounded ([`FLUSHER_QUEUE`], [`POOL_QUEUE`]): a full
//! one blocks its producer, a priority thread (which then stops reading its
//! sockets, so the back-pressure reaches the clients), a pool worker or the
//! peering thread. Neither consumer ever waits on a producer: a flusher
//! waits only on the store and on PG locks, which no producer holds while it
//! sends. A priority thread's mailbox is the other way round: flushers,
//! other priority threads and the peering thread post to it, and the
//! priority thread may be blocked on a flusher's queue, so a post must
//! never block. It is bounded by what its thread admitted instead: every
//! completion answers a request one of its connections has in flight (at
//! most `MAX_IN_FLIGHT` each, `MAX_CONNECTIONS` connections: a forwarded
//! operation is one of those, and so is the reply posted back for it) or an entry a
//! peer has in flight (bounded the same way at the primary), or changes
//! which connections it serves (one per connection and thread, per
//! placement interval or close), and the one
//! broadcast, [`Completion::Flushed`], is coalesced: at most one waits in a
//! mailbox at a time.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use duplex_map::OsdId;
use duplex_oplog::{Entry, RequestId};
use duplex_proto::osd::{OpKind, OpReply, OpRequest, Status};
use duplex_proto::peering::{PeerReply, PeerRequest};
use duplex_proto::Frame;

use crate::pg::{Ack, ReplyTo};

/// Jobs a flusher's queue holds; a producer waits when it is full.
pub const FLUSHER_QUEUE: usize = 4096;
/// Tasks a pool worker's queue holds (`threading = pool`).
pub const POOL_QUEUE: usize = 1024;

/// Where a client reply goes.
#[derive(Clone, Copy, Debug)]
pub struct ClientSlot {
    pub thread: usize,
    pub token: usize,
    pub slot: u64,
}

/// A read from the store: object data, or (by `kind`) a stat, attributes,
/// or a listing of the PG's objects.
pub struct ReadJob {
    pub kind: OpKind,
    pub pg: u32,
    pub object: Bytes,
    /// An attribute's name, or a listing's prefix.
    pub arg: Bytes,
    pub offset: u64,
    pub len: u32,
    pub flush_first: bool,
    pub reply: ClientSlot,
    pub map_epoch: u64,
    /// The snapshot to read at (0: the head).
    pub snap: u64,
}

/// Work for a flusher.
pub enum Job {
    /// A PG's log went from empty to not: flush it within the timeout.
    Dirty(u32),
    /// A PG's log reached the threshold, or is full: flush now.
    Flush(u32),
    /// Read from the store: R2, or R3 when `flush_first`.
    Read(ReadJob),
    /// The sync write path: apply, make durable, then complete.
    SyncApply { entry: Entry, done: SyncDone },
    /// A peering or recovery step a PG's primary asked for.
    Peer { request: PeerRequest, reply: PeerReplyTo },
    /// What each PG holds in this partition, answered at once: to a `duplex
    /// df` over its connection, or to the usage report for the monitors
    /// (the balancer).
    Usage(UsageTo),
    /// A new map: remove the copies of PGs this OSD no longer holds for
    /// anyone (`flusher::strays`).
    Strays(std::sync::Arc<crate::cluster::MapView>),
    /// The snapshot trimmer asks for a PG's dead clones (after a flush).
    TrimScan(TrimScan),
    /// The deduplication agent asks for a PG's evicted chunks (after a
    /// flush): the primary's tier index (`crate::tier`).
    TierLoad(TierLoad),
}

/// Load a deduplicated PG's tier index (its evicted chunks and objects)
/// from the store and install it, if the PG still serves `interval`
/// without one (`crate::tier::load_wanted`, `crate::tier::install`).
#[derive(Debug)]
pub struct TierLoad {
    pub pg: u32,
    pub interval: u64,
}

/// What [`TierLoad`] found.
#[derive(Debug, Default)]
pub struct TierLoaded {
    /// Object → evicted chunk offset → its length.
    pub evicted: std::collections::HashMap<Bytes, std::collections::BTreeMap<u64, u32>>,
    pub objects: Vec<Bytes>,
    /// The snapshot sequence each object with evicted chunks was last
    /// changed under (`crate::snaps::SNAPSEQ_ATTR`; absent: 0).
    pub snapseqs: std::collections::HashMap<Bytes, u64>,
}

/// Which clones of a PG's objects whose names start with `prefix` no
/// snapshot in `live` reads, for the snapshot trimmer (`crate::trimmer`):
/// `limit` at most, those after `after` in name order. A batch is what the
/// trimmer then deletes, and what the flusher's `Trim` class paces
/// (flusher::device).
pub struct TrimScan {
    pub pg: u32,
    pub prefix: Bytes,
    pub live: Vec<u64>,
    pub after: Option<DeadClone>,
    pub limit: usize,
    /// The deletes the trimmer made since its last scan: what this one
    /// pays for in the flusher's `Trim` class.
    pub deletes_before: usize,
    pub reply: crossbeam_channel::Sender<Result<Vec<DeadClone>, String>>,
}

/// A clone no live snapshot reads: its head's name and its sequence.
pub type DeadClone = (Vec<u8>, u64);

/// Where a usage answer goes (as [`PeerReplyTo`] for peering's).
pub enum UsageTo {
    /// An `OsdUsageReply` on the asker's connection.
    Remote(ReplyTo),
    /// This OSD's usage-report thread.
    Local(crossbeam_channel::Sender<duplex_proto::osd::UsageReply>),
}

/// Where a peering answer goes.
pub enum PeerReplyTo {
    /// A remote primary, over the connection its request came on.
    Remote(ReplyTo),
    /// This OSD's own peering thread.
    Local(crossbeam_channel::Sender<PeerReply>),
}

#[derive(Clone, Copy, Debug)]
pub enum SyncDone {
    /// The primary's own copy: tell its thread.
    Primary { thread: usize, txid: u64 },
    /// A replica's copy: acknowledge to the primary.
    Replica(ReplyTo),
}

/// A client request, with where its reply goes.
pub struct ClientOp {
    pub thread: usize,
    pub token: usize,
    pub slot: u64,
    pub txid: u64,
    pub request: OpRequest,
    pub arrived: Instant,
    /// On a connection several threads serve: its place in its PG's
    /// order there (`crate::io::order`); it must take effect before the
    /// next ticket of its lane is let run.
    pub ticket: Option<crate::io::order::Ticket>,
    /// `threading = lalca`: the owner slot of its PG it holds a claim on
    /// (`crate::io::lalca`), given back where it runs once it has taken
    /// effect (or once its replicas answered).
    pub claim: Option<u32>,
}

/// What the owning priority thread does next for an operation.
pub enum Outcome {
    /// Reply now.
    Reply { token: usize, slot: u64, reply: OpReply, arrived: Instant, kind: OpKind },
    /// Send `entry` to each replica; reply to the client when all have
    /// acknowledged and, with `local` (the sync write path), the local
    /// store has applied it. The owning thread hands `local` to the flusher
    /// after it has registered the write, so the completion cannot beat it.
    Replicate {
        /// The write's id: its replication transaction id, and its key
        /// among the PG's uncommitted writes.
        write: u64,
        token: usize,
        slot: u64,
        entry: Bytes,
        replicas: Vec<OsdId>,
        local: Option<Entry>,
        arrived: Instant,
        map_epoch: u64,
        /// The PG and request id, to mark the request finished in the PG's table.
        pg: u32,
        request: RequestId,
        /// `Some(max_lag)`: answer the client now (`Ok`), before the
        /// replicas: an eventual pool's write (`crate::backend::eventual`).
        /// Their answers then only settle the PG's replication lag, and
        /// must all come within `max_lag` (`crate::io::pending`).
        answered: Option<std::time::Duration>,
        /// The entry as backfill targets get it while their walk has not
        /// reached its object (`crate::pg::elide`): sent to those instead.
        elided: Option<Box<ElidedEntry>>,
    },
    /// The flusher has it; the reply comes back as a completion.
    Queued,
    /// The PG's log is full: hold the operation until a flush makes room.
    Full(ClientOp),
    /// Replica side: send these acknowledgements, all with `status`.
    Acks { pg: u32, acks: Vec<Ack>, status: Status },
    /// An erasure-coded PG's operation at its primary: send its shard
    /// reads, then carry on with `then` (`crate::backend::erasure`).
    Erasure(Box<EcTask>),
}

/// A write's entry without its data (`duplex_oplog::OpKind::Elided`), and
/// the replicas of [`Outcome::Replicate`] that get it in place of the whole.
pub struct ElidedEntry {
    pub entry: Bytes,
    pub to: Vec<OsdId>,
}

/// An erasure-coded PG's client operation at its primary, from its
/// admission to its reply: the shard reads it waits for, and what follows
/// them.
pub struct EcTask {
    /// The transaction id of its shard reads and writes (one per task).
    pub id: u64,
    pub op: ClientOp,
    pub pg: u32,
    /// The map epoch it was admitted under.
    pub map_epoch: u64,
    /// A mutation's seq in its PG's log, once its entries are logged (0: not yet).
    pub seq: u64,
    /// A `ShardRead` for each member, in the order `then` takes the answers.
    pub reads: Vec<(OsdId, OpRequest)>,
    pub then: EcThen,
    /// The pool's code, and the PG's acting set by shard position as it
    /// was admitted (a read that meets a damaged shard decodes around it).
    pub profile: duplex_ec::Profile,
    pub shards: Vec<OsdId>,
}

/// What an [`EcTask`] does once its reads are in.
pub enum EcThen {
    /// A client read: its reply is these pieces of the reads' answers, in
    /// order (an answer shorter than asked, or `NotFound`, reads as zeros).
    Read { pieces: Vec<EcPiece> },
    /// A client read that needs a missing data shard: object bytes
    /// `[offset, offset + len)` of the stripes the plan decodes.
    DegradedRead { plan: duplex_ec::ReadPlan, offset: u64, len: u64 },
    /// A mutation: it becomes one entry on every shard.
    Write(Box<EcWrite>),
}

/// Bytes `[at, at + len)` of read `read`'s answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EcPiece {
    pub read: usize,
    pub at: usize,
    pub len: usize,
}

/// A mutation of an erasure-coded object, planned at admission.
/// (Its code and the PG's members by shard position are its task's.)
pub struct EcWrite {
    pub request: RequestId,
    pub change: EcChange,
}

/// What each shard of an object logs for one mutation.
pub enum EcChange {
    /// New data: the plan's shard reads, then each shard's new bytes (a
    /// partial stripe's parity from the data's change).
    Data { plan: duplex_ec::WritePlan, offset: u64, data: Bytes },
    /// The same operation on every shard, over the shard range that
    /// stands for the object's (a delete, a whole-stripe zero, a
    /// truncation to a stripe boundary, a preallocation).
    Same { op: duplex_oplog::OpKind, offset: u64, data: Vec<u8> },
}

/// Scrubs asked for (by an operator, or by a read that met a damaged
/// block), for the peering thread to run; drained every pass.
pub type ScrubRequests = Arc<Mutex<Vec<ScrubAsk>>>;

/// The most scrub asks waiting at once: more are refused (an operator's
/// flood must not grow the queue without bound; read repairs are asked at
/// most once per PG per 10 s).
pub const MAX_SCRUB_ASKS: usize = 4096;

/// A deep scrub of one PG this OSD is primary of.
#[derive(Clone, Copy, Debug)]
pub struct ScrubAsk {
    pub pg: u32,
    pub repair: bool,
    /// Where the report goes (None: no one waits for it).
    pub reply: Option<ReplyTo>,
}

/// Work for a pool worker (`threading = pool`).
pub enum PoolTask {
    Client(ClientOp),
    Replica { payload: Bytes, to: ReplyTo },
}

/// Work posted to a priority thread.
pub enum Completion {
    /// A client request's reply is ready (reads, sync writes; pool mode: anything).
    Reply { token: usize, slot: u64, reply: OpReply },
    /// The sync write path applied a write locally (primary), or failed to.
    LocalApplied { txid: u64, ok: bool },
    /// Send this frame on connection `token` (replica acks).
    Send { token: usize, frame: Frame },
    /// Logs were trimmed: writes waiting for room may go on.
    Flushed,
    /// Peering fenced a PG for a new interval: writes of an older one still
    /// waiting for replicas fail now (`Retry`), not at the next periodic
    /// check, so clients resend to the PG's new interval at once.
    Fenced,
    /// Serve this connection: watch it in this thread's poll (a new one,
    /// or one the placement adds this thread to).
    Serve(Arc<crate::io::conn_cell::ConnCell>),
    /// `lcam`: stop watching this connection (replies to what this thread
    /// took from it still go out on it).
    Unserve(usize),
    /// This connection closed: drop it from this thread's table.
    Forget(usize),
    /// Pool mode: a worker ran a request; the thread does the I/O it asks for.
    Worked(Box<Outcome>),
    /// An erasure-coded object this thread's client waited on is free: run
    /// the operation again (`crate::pg::object_queue`).
    Resume(ClientOp),
    /// `threading = lalca`: an operation of a PG this thread owns, from
    /// the thread serving its connection; its reply goes back there.
    Forwarded(ClientOp),
}

impl Completion {
    /// A replica's acknowledgement, for the priority thread that owns the
    /// primary's connection ([`Ack::frame`]).
    pub fn ack(ack: Ack, pg: u32, status: Status) -> Completion {
        Completion::Send { token: ack.to.token, frame: ack.frame(pg, status) }
    }
}

#[derive(Clone)]
pub struct Mailbox {
    pub sender: Sender<Completion>,
    pub waker: Arc<mio::Waker>,
    /// A `Flushed` waits in this mailbox: another would say nothing more.
    flushed: Arc<AtomicBool>,
    /// Likewise a `Fenced`: a peering storm fences hundreds of PGs, and
    /// one look at the pending writes covers them all (this also keeps the
    /// unbounded mailbox bounded: fences are not admitted operations).
    fenced: Arc<AtomicBool>,
}

impl Mailbox {
    pub fn new(waker: mio::Waker) -> (Mailbox, Receiver<Completion>) {
        let (sender, receiver) = crossbeam_channel::unbounded();
        let (flushed, fenced) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        (Mailbox { sender, waker: Arc::new(waker), flushed, fenced }, receiver)
    }

    /// Posts without waking (call [`Mailbox::wake`] once after a burst).
    /// A `Flushed` or `Fenced` already waiting is not posted again.
    pub fn post(&self, completion: Completion) {
        let waiting = match completion {
            Completion::Flushed => Some(&self.flushed),
            Completion::Fenced => Some(&self.fenced),
            _ => None,
        };
        if waiting.is_some_and(|flag| flag.swap(true, Ordering::AcqRel)) {
            return;
        }
        // The receiver lives as long as the thread; a send after it ended has no one to tell.
        let _ = self.sender.send(completion);
    }

    /// The owner took a `Flushed`: the next flush posts one again. Call it
    /// before acting on the one taken, so that a flush in between is not missed.
    pub fn took_flushed(&self) {
        self.flushed.store(false, Ordering::Release);
    }

    /// The owner took a `Fenced` (as [`Mailbox::took_flushed`]).
    pub fn took_fenced(&self) {
        self.fenced.store(false, Ordering::Release);
    }

    pub fn wake(&self) {
        let _ = self.waker.wake();
    }

    pub fn post_and_wake(&self, completion: Completion) {
        self.post(completion);
        self.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A mailbox waking a poll of its own (which must outlive it).
    fn mailbox() -> (mio::Poll, Mailbox, Receiver<Completion>) {
        let poll = mio::Poll::new().unwrap();
        let (mailbox, inbox) = Mailbox::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        (poll, mailbox, inbox)
    }

    #[test]
    fn a_flushed_broadcast_waits_at_most_once_in_a_mailbox() {
        let (_poll, mailbox, inbox) = mailbox();
        for _ in 0..3 {
            mailbox.post(Completion::Flushed);
        }
        mailbox.post(Completion::LocalApplied { txid: 1, ok: true });
        assert_eq!(inbox.len(), 2, "one Flushed and the other completion");
        assert!(matches!(inbox.try_recv(), Ok(Completion::Flushed)));
        mailbox.took_flushed();
        mailbox.post(Completion::Flushed);
        assert_eq!(inbox.len(), 2, "taken, so the next flush posts one again");
    }

    #[test]
    fn fences_coalesce_apart_from_flushes() {
        let (_poll, mailbox, inbox) = mailbox();
        for _ in 0..100 {
            mailbox.post(Completion::Fenced);
        }
        mailbox.post(Completion::Flushed);
        assert_eq!(inbox.len(), 2, "a hundred fences wait as one, beside a Flushed");
        assert!(matches!(inbox.try_recv(), Ok(Completion::Fenced)));
        mailbox.took_fenced();
        mailbox.post(Completion::Fenced);
        assert_eq!(inbox.len(), 2, "taken, so the next fence posts one again");
    }
}
