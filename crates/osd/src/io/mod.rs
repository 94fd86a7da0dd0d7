//! The top half (DESIGN.md §6): the priority threads' event loops, their
//! connections, and what a client or replicated operation does on the way
//! to the log, without disk I/O.
//!
//! - [`event_loop`]: a priority thread, one `epoll` loop over the
//!   connections it owns.
//! - [`conn`]: one connection's buffers, in-flight slots and ordering.
//! - [`ops`]: the write and read paths, whichever thread runs them.
//! - [`pending`]: replicated writes waiting for their replicas (sans I/O:
//!   the simulator drives the same table).
//! - [`erasure`]: erasure-coded operations waiting for their shards'
//!   reads and acknowledgements (sans I/O, as `pending`), and
//!   [`ec_settle`]: what each does once its answers are in, for the event
//!   loop and the simulator alike.
//! - [`pool`]: the `threading = pool` ablation's workers.
//! - [`qos`]: client QoS (issue 31): the OSD's limiter and each thread's
//!   mClock scheduler, consulted only while the map has QoS settings.
//! - [`conn_cell`]: a connection behind its lock, as the threads share it;
//!   [`messenger`]: which threads serve each connection
//!   (`connection_policy`), and what they carried; [`lcam`]: the
//!   lock-contention-aware placement (issue 29; pure, decided per
//!   interval); [`order`]: the tickets that keep a shared connection's
//!   requests in order per PG.

pub mod conn;
pub mod conn_cell;
pub mod ec_settle;
pub mod erasure;
pub mod event_loop;
pub mod lalca;
pub mod lcam;
pub mod messenger;
pub mod ops;
pub mod order;
pub mod pending;
pub mod pool;
pub mod qos;
