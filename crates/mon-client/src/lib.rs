//! # duplex-mon-client: talking to the monitors
//!
//! What every other part of Duplex needs to reach a monitor, and nothing
//! of how the monitors agree (no Raft here, so clients and OSDs do not link
//! it):
//!
//! - [`wire`]: the monitor messages inside `MessageType::Monitor` frames,
//!   [`Credentials`], and the blocking authenticated [`Connection`]. The
//!   same connection and handshake reach an OSD; only the messages differ.
//! - [`client`]: [`MonClient`], which finds the leader, runs commands,
//!   sends heartbeats and follows the map.

pub mod client;
pub mod wire;

pub use client::{ClientError, MonClient, Subscription};
pub use wire::{from_frame, to_frame, Connection, Credentials, MonMessage, WireOutcome};
