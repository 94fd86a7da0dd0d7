//! What a verifying workload did: every write and read on every block,
//! with when it was invoked and when (or whether) it completed.

use std::sync::Mutex;
use std::time::Instant;

use crate::stamp::{Stamp, StampError};

/// A write's outcome as its issuer knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Acknowledged: it must be durable and visible.
    Acknowledged,
    /// Failed, timed out, or lost with its connection: it may or may not
    /// have taken effect.
    Unknown,
}

/// One operation; times are on one clock (nanoseconds, or simulated ticks).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BlockOp {
    Write {
        stamp: Stamp,
        invoked: u64,
        /// `None` for an unknown outcome.
        completed: Option<u64>,
    },
    Read {
        block: u64,
        /// The stamp read (`None`: the block was never written), or why the
        /// data was not a clean stamped block.
        result: Result<Option<Stamp>, StampError>,
        invoked: u64,
        completed: u64,
        /// A read of the final verification pass (its violations count as
        /// lost writes rather than stale reads).
        final_check: bool,
    },
}

impl BlockOp {
    pub fn block(&self) -> u64 {
        match self {
            BlockOp::Write { stamp, .. } => stamp.block,
            BlockOp::Read { block, .. } => *block,
        }
    }
}

#[derive(Clone, Debug, Default)]
pub struct History {
    pub ops: Vec<BlockOp>,
}

/// When an operation was invoked, from [`Recorder::invoke`].
#[derive(Clone, Copy, Debug)]
pub struct Ticket(u64);

/// Records a live workload's history from any number of threads, on the
/// monotonic clock.
pub struct Recorder {
    start: Instant,
    ops: Mutex<Vec<BlockOp>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder { start: Instant::now(), ops: Mutex::new(Vec::new()) }
    }
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    /// Now on the history's clock (nanoseconds; what `invoked` and
    /// `completed` are measured in), to split a history at an event.
    pub fn now(&self) -> u64 {
        // +1: time 0 belongs to the blocks' initial (never written) state.
        self.start.elapsed().as_nanos() as u64 + 1
    }

    /// Call just before issuing the operation.
    pub fn invoke(&self) -> Ticket {
        Ticket(self.now())
    }

    fn push(&self, op: BlockOp) {
        self.ops.lock().unwrap_or_else(|p| p.into_inner()).push(op);
    }

    /// Call when the write's reply arrives (or it fails: `Outcome::Unknown`).
    pub fn write_done(&self, ticket: Ticket, stamp: Stamp, outcome: Outcome) {
        let completed = match outcome {
            Outcome::Acknowledged => Some(self.now()),
            Outcome::Unknown => None,
        };
        self.push(BlockOp::Write { stamp, invoked: ticket.0, completed });
    }

    /// Call when a read returns data (a failed read tells nothing: skip it).
    pub fn read_done(&self, ticket: Ticket, block: u64, data: &[u8], final_check: bool) {
        let completed = self.now();
        let result = Stamp::decode(data, block);
        self.push(BlockOp::Read { block, result, invoked: ticket.0, completed, final_check });
    }

    pub fn history(&self) -> History {
        History { ops: self.ops.lock().unwrap_or_else(|p| p.into_inner()).clone() }
    }
}
