//! Verifying a block device under faults.
//!
//! A verifying workload writes *stamped* blocks ([`Stamp`]): every write
//! carries a unique (writer, sequence) and the block's own address, and the
//! rest of the block is derived from them, so a read identifies exactly
//! which write it returned, or that it returned a torn or misplaced block.
//! The workload records each operation's invocation and completion times
//! in a [`History`]; [`check`] then judges it, block by block, against the
//! semantics of a linearizable register:
//!
//! - an acknowledged write is never lost: a read that starts after the
//!   write completed never returns an older value (unless a concurrent or
//!   later write replaced it);
//! - no stale read: once a read has returned a value, no later read returns
//!   an older one;
//! - a read never returns a value that was never written, or one that was
//!   written only after the read completed.
//!
//! Writes whose outcome is unknown (timed out, connection lost) may or may
//! not have taken effect, at any time after they were invoked.

mod checker;
mod eventual;
mod history;
mod stamp;

pub use checker::{check, Report, Violation, ViolationKind};
pub use eventual::{check_eventual, EventualBounds};
pub use history::{BlockOp, History, Outcome, Recorder, Ticket};
pub use stamp::{Stamp, StampError, STAMP_HEADER_LEN};
