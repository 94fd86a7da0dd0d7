//! # duplex-client: talking to a Duplex cluster
//!
//! The client follows the map and computes object → PG → OSDs itself (no
//! metadata server on the data path), then sends each operation to the
//! PG's primary.
//!
//! - [`conn`]: an authenticated blocking connection to an OSD.
//! - [`object`]: [`object::ObjectClient`], synchronous object operations
//!   with retries on map changes and transient errors.
//! - [`load`]: a pipelined load generator (queue depth N over one
//!   connection per OSD) for benchmarks.

pub mod conn;
pub mod load;
pub mod object;

pub use object::{ClientError, ObjectClient};
