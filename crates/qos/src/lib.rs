//! Quality of service (issue 31), sans I/O: nothing here reads a clock,
//! sleeps or spawns. Callers pass the time in microseconds.
//!
//! - [`limit`]: an image's limits (IOPS and bytes per second, for reads,
//!   writes or both, with a burst allowance), enforced by token buckets
//!   where one client's traffic to an image is seen whole (the client
//!   library, and so the NBD gateway).
//! - [`scheduler`]: the OSD's mClock scheduler: per class (an image, a
//!   client, recovery, backfill, scrub) a reservation, a weight and a
//!   limit, and urgent classes (recovery of a PG that cannot serve I/O)
//!   first.
//! - [`settings`]: limits, reservation and weight as operators set them.

pub mod limit;
pub mod scheduler;
pub mod settings;

pub use limit::{Direction, LimitError, Limiter, Limits, TokenBucket};
pub use scheduler::{ClassSpec, ClassStats, Phase, Pop, Scheduler, SpecError};
pub use settings::{cost, ClassSettings};
