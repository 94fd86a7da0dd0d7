//! Bringing a PG's members to one history whenever its interval changes,
//! before the PG serves I/O (DESIGN.md §7; docs/RELIABILITY.md):
//!
//! - [`machine`]: the sans-I/O peering machine of one PG (query, choose
//!   the authority, recover, record, activate; a deep scrub after).
//! - [`backfill`]: the sans-I/O background copy of a PG to members that
//!   joined whole-less, paced by the flushers'
//!   `Backfill` class.
//! - [`schedule`]: which PGs peer when, one request at a time, and the
//!   background backfill after: sans I/O, driven by the OSD's thread and
//!   by the simulator alike.
//! - [`driver`]: the peering thread of the primary, which runs the
//!   schedule and carries its requests to the members over the network.
//!
//! The member side (what a member's store does when asked) is the
//! flusher's: [`crate::flusher::member`].

pub mod backfill;
pub mod driver;
pub mod machine;
pub mod schedule;
pub mod to_monitor;

pub use machine::{choose_authority, Action, Peering, Progress};
