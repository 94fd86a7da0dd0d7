//! Erasure coding for EC pools (issue 26): what an EC pool stores and how.
//!
//! An object of an EC pool is cut into stripes of `k` stripe units; shard
//! `i < k` holds the `i`-th unit of every stripe, and shards `k..k+m` hold
//! the stripes' parity, so that any `k` shards give the object back.
//!
//! - [`profile`]: the pool's `k+m` and stripe unit, checked before a pool
//!   is made.
//! - [`layout`]: where an object's bytes are among its shards.
//! - [`codec`]: Reed-Solomon encoding, reconstruction from any `k`
//!   shards, and the parity delta of a partial overwrite (parity is
//!   linear in the data, so a small write changes the parity by the code
//!   of its change alone: the read-modify-write reads the old bytes of the
//!   range and the parity, never the rest of the stripe).
//!
//! Pure functions: the OSD's EC backend calls them.

pub mod codec;
pub mod degraded;
pub mod layout;
pub mod plan;
pub mod profile;

pub use codec::{Codec, CodecError};
pub use degraded::{ReadPlan, TooFewShards};
pub use layout::{Layout, Piece};
pub use plan::{ShardRange, ShardWrite, WritePlan};
pub use profile::{Profile, ProfileError};
