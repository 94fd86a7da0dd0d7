//! A server's limits, read by the accept loop (`server.rs`) and by every
//! connection (`connection.rs`).

use std::time::Duration;

/// Limits of a server; every one bounds memory or threads.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Connections beyond this are closed right after accept. Each one
    /// costs two threads.
    pub max_connections: usize,
    /// Commands started but not yet answered, per connection; the server
    /// stops reading from a client that reaches it.
    pub max_in_flight_per_connection: usize,
    /// Read and write payload bytes held for in-flight commands, per
    /// connection. A single command is always admitted, however large.
    pub max_in_flight_bytes_per_connection: u64,
    /// The whole handshake, from accept to the chosen export, must finish
    /// within this.
    pub handshake_timeout: Duration,
    /// On shutdown, how long connections get to answer commands already in
    /// flight before they are closed regardless.
    pub shutdown_grace: Duration,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            max_connections: 64,
            max_in_flight_per_connection: 128,
            max_in_flight_bytes_per_connection: 64 * 1024 * 1024,
            handshake_timeout: Duration::from_secs(10),
            shutdown_grace: Duration::from_secs(5),
        }
    }
}
