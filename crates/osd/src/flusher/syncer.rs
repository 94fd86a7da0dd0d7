//! A partition's device flushes, made on a helper thread so that the
//! flusher answers reads while the device flushes (issue 28: on a disk
//! without power-loss protection a flush takes milliseconds, and a read
//! queued behind it waits as long).
//!
//! The flusher commits a batch without its last flush
//! (`Partition::apply_unsynced`), asks the syncer for the flush, and until
//! the answer comes it answers the reads it can answer at once
//! (`Flusher::read_now`) and keeps every other job for after. A store
//! refuses every change meanwhile, so batches still commit one at a time,
//! each durable before the next is written.
//!
//! The simulator runs without one: its flushers flush on their own thread,
//! so a run stays deterministic.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use duplex_store::FlushHandle;

use crate::messages::Job;

pub struct Syncer {
    asks: Option<Sender<()>>,
    pub(super) done: Receiver<std::io::Result<()>>,
    /// Jobs taken while a flush was out, other than the reads answered
    /// then: the flusher takes them before any new one.
    pub(super) kept: Vec<Job>,
    thread: Option<JoinHandle<()>>,
}

impl Syncer {
    /// Starts the helper thread (`osd-sync-<partition>`) over `handle`.
    pub fn start(partition: u32, handle: Arc<dyn FlushHandle>) -> std::io::Result<Syncer> {
        // One flush is out at a time: a capacity of one never blocks.
        let (asks, asked) = crossbeam_channel::bounded::<()>(1);
        let (answer, done) = crossbeam_channel::bounded(1);
        let thread = std::thread::Builder::new().name(format!("osd-sync-{partition}")).spawn(move || {
            for () in asked {
                if answer.send(handle.flush()).is_err() {
                    return;
                }
            }
        })?;
        Ok(Syncer { asks: Some(asks), done, kept: Vec::new(), thread: Some(thread) })
    }

    /// Asks for a flush; its result comes on `done`.
    pub(super) fn ask(&self) {
        let asks = self.asks.as_ref().expect("asks live until drop");
        debug_assert!(self.done.is_empty(), "a flush asked for with another's answer unread");
        // The thread lives as long as `asks`: it ends only when this drops.
        asks.send(()).expect("the sync thread is alive");
    }
}

impl Drop for Syncer {
    fn drop(&mut self) {
        self.asks = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::time::Duration;

    use bytes::Bytes;
    use duplex_proto::osd::{OpKind, Status};

    use super::*;
    use crate::config::OplogMode;
    use crate::flusher::Flusher;
    use crate::messages::{ClientSlot, Completion, Mailbox, ReadJob};
    use crate::metrics::Metrics;
    use crate::pg::{pg_key, PgTable};

    fn write(key: u32, seq: u64, object: &[u8], data: &[u8]) -> duplex_oplog::Entry {
        duplex_oplog::Entry {
            pg: key,
            epoch: 1,
            version: seq,
            seq,
            op: duplex_oplog::OpKind::Write,
            object: object.to_vec(),
            offset: 0,
            data: data.to_vec(),
            request: Default::default(),
            snap: 0,
        }
    }

    fn log(pgs: &PgTable, key: u32, entry: &duplex_oplog::Entry) {
        let pg = pgs.get_or_open(key).unwrap();
        let mut guard = pg.lock().unwrap();
        guard.active = Some(crate::pg::Activation { interval: 1, members: vec![1], backfill: Vec::new() });
        let encoded = entry.encode();
        let decoded = duplex_oplog::EntryRef::decode(&encoded).unwrap();
        guard.append_encoded(&decoded, &encoded, crate::pg::requests::RequestState::Committed).unwrap();
    }

    /// Issue 28: a read of an object whose entries are in the log is
    /// answered while the device is busy with a commit's flush (one that
    /// takes seconds here, by the device model), from the store and the
    /// log; before, it waited behind the flush.
    #[test]
    fn a_read_is_answered_while_a_commits_flush_holds_the_device() {
        let mut store = crate::TestStore::new(1);
        let stall = Duration::from_secs(3);
        store.config.device.flush_stall = Some(stall);
        let logs = tempfile::tempdir().unwrap();
        let poll = mio::Poll::new().unwrap();
        let (mailbox, inbox) = Mailbox::new(mio::Waker::new(poll.registry(), mio::Token(0)).unwrap());
        let (jobs_in, jobs) = crossbeam_channel::unbounded();
        let partition = store.open().into_partitions().pop().unwrap();
        let syncer = Syncer::start(0, partition.flush_handle()).unwrap();
        let pgs = Arc::new(PgTable::open(OplogMode::File, logs.path(), 1 << 20).unwrap());
        let metrics = Arc::new(Metrics::default());
        let flusher = Flusher {
            id: 1,
            partition,
            jobs,
            pgs: pgs.clone(),
            mailboxes: vec![mailbox],
            metrics: metrics.clone(),
            timeout: Duration::from_secs(60),
            scrub_requests: Default::default(),
            repairs_asked: HashMap::new(),
            snap_heads: Default::default(),
            syncer: Some(syncer),
            device: Default::default(),
            scrub_read_bytes: 0,
        };
        let (flushed_pg, read_pg) = (pg_key(1, 0).unwrap(), pg_key(1, 1).unwrap());
        log(&pgs, flushed_pg, &write(flushed_pg, 1, b"a", b"aaaa"));
        let running = std::thread::spawn(move || flusher.run());
        jobs_in.send(Job::Flush(flushed_pg)).unwrap();
        // The batch is written within this; its flush takes the stall.
        std::thread::sleep(Duration::from_millis(300));
        log(&pgs, read_pg, &write(read_pg, 1, b"b", b"bbbb"));
        let reply = ClientSlot { thread: 0, token: 7, slot: 9 };
        let read = ReadJob {
            kind: OpKind::Read,
            pg: read_pg,
            object: Bytes::from_static(b"b"),
            arg: Bytes::new(),
            offset: 0,
            len: 4,
            flush_first: true,
            reply,
            map_epoch: 1,
            snap: 0,
        };
        let asked = std::time::Instant::now();
        jobs_in.send(Job::Read(read)).unwrap();
        let answer = inbox.recv_timeout(stall).expect("the read was answered before the flush ended");
        let waited = asked.elapsed();
        assert_eq!(metrics.flushes.get(), 0, "the flush was over when the read was answered ({waited:?})");
        match answer {
            Completion::Reply { token: 7, slot: 9, reply } => {
                assert_eq!(reply.status, Status::Ok);
                assert_eq!(&reply.data[..], b"bbbb", "the log's entry laid on the store's bytes");
            }
            _ => panic!("not the read's reply"),
        }
        drop(jobs_in);
        drop(running.join().unwrap());
        assert_eq!(metrics.flushes.get(), 1, "the flush went through");
    }
}
