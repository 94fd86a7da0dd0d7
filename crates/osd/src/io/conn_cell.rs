//! A connection as the priority threads hold it: behind a lock, so that
//! under `connection_policy = lcam | naive` several threads can serve it
//! (each with the socket in its own poll), and with what the placement
//! needs measured on the way: how long threads waited for that lock, and
//! the bytes the connection carried.
//!
//! Under `pinned` one thread holds each connection and the lock is never
//! contended: taking it is one uncontended atomic exchange, and nothing is
//! timed (the wait is timed only when the first attempt fails).

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Instant;

use crate::io::conn::{Conn, Inbound, Role};
use crate::io::order::{Sequencer, Ticket};

pub struct ConnCell {
    /// The connection's name in every thread's poll and table.
    pub token: usize,
    /// As the connection's (fixed for its life).
    pub role: Role,
    /// The socket, for the polls (each thread registers it in its own).
    pub fd: RawFd,
    /// Where it came from, for the admin socket.
    pub peer: Option<std::net::SocketAddr>,
    conn: Mutex<Conn>,
    /// Shared connections only: requests read but waiting for an earlier
    /// one of their lane (`order.rs`).
    order: Option<Mutex<Sequencer<Inbound>>>,
    /// Nanoseconds threads waited for this connection's locks since the
    /// placement last looked.
    lock_wait_ns: AtomicU64,
    /// Bytes it carried since the placement last looked.
    bytes: AtomicU64,
    closed: AtomicBool,
    /// Requests waiting in `order` (replicated entries and peering
    /// requests hold no reply slot, so the in-flight limit does not see
    /// them): past the limit, reading stops (`hold`).
    waiting: AtomicUsize,
    /// Reading stopped for `waiting`: the thread that lets it fall below
    /// half the limit reads on.
    held: AtomicBool,
}

impl ConnCell {
    /// `shared`: several threads may serve it, so its requests take tickets.
    pub fn new(token: usize, conn: Conn, shared: bool) -> ConnCell {
        ConnCell {
            token,
            role: conn.role,
            fd: conn.stream.as_raw_fd(),
            peer: conn.stream.peer_addr().ok(),
            conn: Mutex::new(conn),
            order: shared.then(Default::default),
            lock_wait_ns: AtomicU64::new(0),
            bytes: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            waiting: AtomicUsize::new(0),
            held: AtomicBool::new(false),
        }
    }

    /// Several threads may serve this connection: its requests take tickets.
    pub fn is_shared(&self) -> bool {
        self.order.is_some()
    }

    /// The connection, waiting for it if another thread has it (the wait
    /// is what the placement measures).
    pub fn lock(&self) -> MutexGuard<'_, Conn> {
        self.timed(&self.conn)
    }

    fn order(&self) -> MutexGuard<'_, Sequencer<Inbound>> {
        self.timed(self.order.as_ref().expect("tickets only on a shared connection"))
    }

    /// Takes one of this connection's locks, adding the wait (if the first
    /// try finds it taken) to the connection's lock wait.
    fn timed<'a, T>(&self, mutex: &'a Mutex<T>) -> MutexGuard<'a, T> {
        match mutex.try_lock() {
            Ok(guard) => guard,
            // A thread that panicked holding it took the OSD down with it.
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                let start = Instant::now();
                let guard = mutex.lock().unwrap_or_else(PoisonError::into_inner);
                self.lock_wait_ns.fetch_add(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
                guard
            }
        }
    }

    /// `Some`: the request's turn, run it now; `None`: it waits for an
    /// earlier one of its lane (whose runner runs it next).
    pub fn enter(&self, ticket: Ticket, request: Inbound) -> Option<Inbound> {
        let mut order = self.order();
        let entered = order.enter(ticket, request);
        self.waiting.store(order.waiting(), Ordering::SeqCst);
        entered
    }

    /// `ticket` took effect: the request next in its lane, if it waits.
    pub fn leave(&self, ticket: Ticket) -> Option<(Ticket, Inbound)> {
        let mut order = self.order();
        let next = order.leave(ticket);
        self.waiting.store(order.waiting(), Ordering::SeqCst);
        next
    }

    /// Stops reading while `limit` requests or more wait for their turn:
    /// true if it stopped (the thread that lets them fall is told to read
    /// on by [`ConnCell::release`]).
    pub fn hold(&self, limit: usize) -> bool {
        if self.waiting.load(Ordering::SeqCst) < limit {
            return false;
        }
        // Set before the second look, as `release` clears after its store
        // of `waiting`: one of the two sees the other.
        self.held.store(true, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) >= limit {
            return true;
        }
        self.held.store(false, Ordering::SeqCst);
        false
    }

    /// True once, when reading was held and the waiting requests fell below `low`.
    pub fn release(&self, low: usize) -> bool {
        self.waiting.load(Ordering::SeqCst) < low && self.held.swap(false, Ordering::SeqCst)
    }

    /// Counts bytes for the placement (which places shared connections only).
    pub fn carried(&self, bytes: u64) {
        if self.is_shared() {
            self.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// The lock wait and bytes since the last call (the placement's interval).
    pub fn take_interval(&self) -> (u64, u64) {
        (self.lock_wait_ns.swap(0, Ordering::Relaxed), self.bytes.swap(0, Ordering::Relaxed))
    }

    /// Marks it closed: true for the one caller that closed it.
    pub fn close(&self) -> bool {
        !self.closed.swap(true, Ordering::AcqRel)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
