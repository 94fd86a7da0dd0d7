//! # duplex-mon: the monitor
//!
//! The cluster map, replicated with Raft (raft-rs, never a home-made
//! consensus). [`core::MonCore`] is sans I/O: it takes ticks, Raft messages
//! and client commands, and returns what to send, what to persist and which
//! commands completed. A runtime drives it with real sockets and a data
//! directory; tests drive three of them with an in-memory network.
//!
//! Raft log entries carry encoded [`duplex_map::Command`]s. Every replica
//! executes a committed command against its own map with the pure
//! [`duplex_map::ClusterMap::run`], so all replicas reach the same map and
//! epoch. A command that changes nothing, or that the map refuses, makes no
//! epoch, identically everywhere.

pub mod balancing;
pub mod cli;
pub mod core;
pub mod daemon;
pub mod datadir;

pub use crate::core::{append_to_log, CommandOutcome, MonCore, MonOutput, ProposeError};
