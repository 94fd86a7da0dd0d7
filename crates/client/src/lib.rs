//! # duplex-client: talking to a Duplex cluster
//!
//! The client follows the map and computes object → PG → OSDs itself (no
//! metadata server on the data path), then sends each operation to the
//! PG's primary.
//!
//! - [`Client`] ([`client`]): the client applications use. Pipelines many
//!   operations over one connection per OSD, follows the map as it
//!   changes, resends in-flight operations to a new primary with the same
//!   request id, and gives each operation a deadline. Object operations
//!   (read, write, truncate, delete, stat, attributes, listings) in
//!   blocking and callback forms.
//! - [`image`]: block images striped over objects ([`Image`]).
//! - [`object`]: [`ObjectClient`], a minimal one-at-a-time client for tests.
//! - [`load`]: a pipelined object load generator for the OSD benchmark.
//!
//! ```no_run
//! use duplex_client::{Client, ClientConfig, CreateOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::connect(ClientConfig::from_file("duplex-dev/client.toml".as_ref())?)?;
//! let pool = client.pool_id("rbd")?;
//! client.create_image(pool, "disk", 1 << 30, CreateOptions::default())?;
//! let image = client.open_image(pool, "disk")?;
//! image.write((4 << 20) - 512, vec![7u8; 1024].into())?; // crosses an object boundary
//! assert_eq!(image.read((4 << 20) - 512, 1024)?, vec![7u8; 1024]);
//! # Ok(()) }
//! ```

pub mod client;
pub mod error;
pub mod image;
pub mod layering;
pub mod load;
pub mod object;
mod placement;
pub mod qos;
mod runtime;
pub mod snapshot;
pub mod tier;
pub mod watch;

pub use client::{parse_monitor, Client, ClientConfig};
pub use error::ClientError;
pub use image::{CreateOptions, Image, ImageInfo};
pub use object::ObjectClient;
pub use runtime::{Callback, ObjectOp};
pub use snapshot::{SnapInfo, SnapTable};
