//! What an erasure-coded task does when its answers are in, for whichever
//! runtime carries its frames: a priority thread's event loop, or the
//! simulator. [`start`] sends a task's shard reads; [`settle`] takes what
//! [`EcTasks`] settled and replies, commits, sends entries, decodes
//! around a damaged shard, or hands the object on. The runtime provides
//! the I/O through [`EcIo`].

use std::collections::HashMap;
use std::time::{Duration, Instant};

use duplex_map::OsdId;
use duplex_proto::osd::{OpReply, Status};
use duplex_proto::{Frame, MessageType};

use crate::backend::erasure;
use crate::io::erasure::{EcTasks, Settled};
use crate::messages::{ClientOp, EcTask, EcThen, ScrubAsk};
use crate::metrics::{record, Histograms, Stage};
use crate::shared::Shared;

/// An erasure-coded PG's repair is asked at most this often per runtime
/// (a thread, or a simulated OSD).
pub const REPAIR_BACKOFF: Duration = Duration::from_secs(10);

/// The runtime under an erasure-coded task.
pub trait EcIo {
    fn shared(&self) -> &Shared;
    fn histograms(&self) -> &Histograms;
    fn now(&self) -> Instant;
    /// Sends `frame` to member `osd` (this OSD included); `false`: there
    /// is no way to it now.
    fn send_to(&mut self, osd: OsdId, frame: &Frame) -> bool;
    /// Answers the client of `op`.
    fn answer(&mut self, op: &ClientOp, reply: &OpReply);
    /// `next` holds its object now: run it again (on its own thread).
    fn run_next(&mut self, next: ClientOp);
    /// When this runtime last asked for each PG's repair.
    fn repairs_asked(&mut self) -> &mut HashMap<u32, Instant>;
}

/// Sends `task`'s shard reads and registers it.
pub fn start(io: &mut impl EcIo, ec: &mut EcTasks, task: Box<EcTask>) {
    let id = task.id;
    let now = io.now();
    let settled = ec.start(task, now, |osd, request| io.send_to(osd, &request.to_frame(id)));
    if let Some(settled) = settled {
        settle(io, ec, settled);
    }
}

/// A task's answers are in (or it was given up on): what follows.
pub fn settle(io: &mut impl EcIo, ec: &mut EcTasks, settled: Settled) {
    match settled {
        Settled::Read { task, answers } if erasure::damaged_answers(&answers).contains(&true) => {
            on_damaged_shard(io, ec, task, &answers);
        }
        Settled::Read { mut task, answers } => {
            let reply = match &task.then {
                EcThen::Read { pieces } => erasure::assemble(pieces, &answers, task.map_epoch),
                EcThen::DegradedRead { plan, offset, len } => {
                    erasure::assemble_degraded(plan, *offset, *len, &answers, task.map_epoch)
                }
                EcThen::Write(_) => match erasure::commit(io.shared(), &mut task, &answers) {
                    Ok(sends) => {
                        let members: Vec<OsdId> = sends.iter().map(|(osd, _)| *osd).collect();
                        let id = task.id;
                        let now = io.now();
                        let settled = ec.wait_for_acks(task, members, now, |osd| {
                            let Some((_, entry)) = sends.iter().find(|(o, _)| *o == osd) else { return false };
                            io.send_to(osd, &Frame::new(MessageType::RepOp, id, entry.clone()))
                        });
                        if let Some(settled) = settled {
                            settle(io, ec, settled);
                        }
                        return;
                    }
                    Err((status, why)) => {
                        end(io, &task, &OpReply::error(status, task.map_epoch, why));
                        return;
                    }
                },
            };
            io.shared().metrics.read_bytes.add(reply.data.len() as u64);
            record(io.histograms(), Stage::Read, task.op.arrived.elapsed().as_micros() as u64);
            end(io, &task, &reply);
        }
        Settled::ReadFailed { task } => {
            let why = "a member holding a shard did not answer; resend";
            end(io, &task, &OpReply::error(Status::Retry, task.map_epoch, why));
        }
        Settled::Written { task, failed } => {
            let (reply, next) = erasure::finish(io.shared(), &task, true, failed);
            record(io.histograms(), Stage::Write, task.op.arrived.elapsed().as_micros() as u64);
            io.answer(&task.op, &reply);
            for next in next {
                io.run_next(next);
            }
        }
    }
}

/// Answers a task that logged nothing, and hands its object on.
fn end(io: &mut impl EcIo, task: &EcTask, reply: &OpReply) {
    let next = erasure::release(io.shared(), task.pg, &task.op.request.object);
    io.answer(&task.op, reply);
    for next in next {
        io.run_next(next);
    }
}

/// Shard reads of `task` met damaged shards (`Io`, or the object absent
/// where another shard holds it: `erasure::damaged_answers`): the PG's repair is
/// asked for (a scrub that rebuilds them, at most once per
/// [`REPAIR_BACKOFF`]), and a client read is decoded from the other
/// shards, once. A mutation is resent by its client (it needs the old
/// bytes whole).
fn on_damaged_shard(io: &mut impl EcIo, ec: &mut EcTasks, task: Box<EcTask>, answers: &[OpReply]) {
    let damaged: Vec<OsdId> = task
        .reads
        .iter()
        .zip(erasure::damaged_answers(answers))
        .filter(|(_, damaged)| *damaged)
        .map(|((osd, _), _)| *osd)
        .collect();
    tracing::error!(pg = task.pg, ?damaged, "erasure-coded shard reads met damaged blocks; repairing the PG");
    let now = io.now();
    let asked = io.repairs_asked();
    if asked.get(&task.pg).is_none_or(|at| now.saturating_duration_since(*at) >= REPAIR_BACKOFF) {
        asked.insert(task.pg, now);
        let ask = ScrubAsk { pg: task.pg, repair: true, reply: None };
        io.shared().scrub_requests.lock().expect("scrub requests lock").push(ask);
    }
    let (task, why) = match &task.then {
        EcThen::Read { .. } => match erasure::decode_around(io.shared(), task, &damaged) {
            Ok(task) => return start(io, ec, task),
            Err(task) => (task, "too few undamaged shards to decode; the PG is being repaired; resend"),
        },
        _ => (task, "a shard's bytes are damaged; the PG is being repaired; resend"),
    };
    end(io, &task, &OpReply::error(Status::Retry, task.map_epoch, why));
}
