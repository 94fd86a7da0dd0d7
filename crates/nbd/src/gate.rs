//! The in-flight bound of one connection.
//!
//! The reader acquires a slot before it starts a command and the writer
//! releases it once the reply is on the socket, so a client that pipelines
//! faster than the export completes (or than it reads its replies) stops
//! being read from: TCP back-pressure instead of unbounded queues. Bytes are
//! bounded as well as commands, because one WRITE may hold 32 MiB.

use std::sync::{Condvar, Mutex, MutexGuard};

pub(crate) struct InFlightGate {
    state: Mutex<State>,
    changed: Condvar,
    commands_max: usize,
    bytes_max: u64,
}

#[derive(Default)]
struct State {
    commands: usize,
    bytes: u64,
    closed: bool,
}

impl InFlightGate {
    pub(crate) fn new(commands_max: usize, bytes_max: u64) -> Self {
        assert!(commands_max > 0 && bytes_max > 0);
        InFlightGate { state: Mutex::new(State::default()), changed: Condvar::new(), commands_max, bytes_max }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters updated in single statements.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits for room for one command holding `bytes`; false once closed.
    /// A command alone always fits, however large, so progress is guaranteed.
    pub(crate) fn acquire(&self, bytes: u64) -> bool {
        let mut state = self.lock();
        loop {
            if state.closed {
                return false;
            }
            let fits = state.commands == 0
                || (state.commands < self.commands_max && state.bytes.saturating_add(bytes) <= self.bytes_max);
            if fits {
                state.commands += 1;
                state.bytes += bytes;
                return true;
            }
            state = self.changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    pub(crate) fn release(&self, commands: usize, bytes: u64) {
        let mut state = self.lock();
        assert!(state.commands >= commands && state.bytes >= bytes, "released more than acquired");
        state.commands -= commands;
        state.bytes -= bytes;
        drop(state);
        self.changed.notify_all();
    }

    /// Waits until every acquired command has been released; false if closed first.
    pub(crate) fn wait_idle(&self) -> bool {
        let mut state = self.lock();
        loop {
            if state.closed {
                return false;
            }
            if state.commands == 0 {
                assert_eq!(state.bytes, 0);
                return true;
            }
            state = self.changed.wait(state).unwrap_or_else(|poisoned| poisoned.into_inner());
        }
    }

    /// Wakes every waiter for good: the connection is going away.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.changed.notify_all();
    }

    #[cfg(test)]
    fn in_flight(&self) -> (usize, u64) {
        let state = self.lock();
        (state.commands, state.bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::thread;
    use std::time::Duration;

    use super::*;

    #[test]
    fn bounds_commands_and_bytes_but_always_admits_one() {
        let gate = InFlightGate::new(2, 100);
        assert!(gate.acquire(1000)); // alone: admitted although over the byte bound
        gate.release(1, 1000);
        assert!(gate.acquire(60));
        assert!(gate.acquire(40));
        assert_eq!(gate.in_flight(), (2, 100));
        gate.release(2, 100);
        assert_eq!(gate.in_flight(), (0, 0));
    }

    #[test]
    fn acquire_blocks_until_release_and_close_wakes_waiters() {
        let gate = Arc::new(InFlightGate::new(1, 100));
        assert!(gate.acquire(0));
        let waiter = {
            let gate = Arc::clone(&gate);
            thread::spawn(move || gate.acquire(0))
        };
        thread::sleep(Duration::from_millis(20));
        assert!(!waiter.is_finished(), "second command must wait for the first");
        gate.release(1, 0);
        assert!(waiter.join().unwrap());

        let idle = {
            let gate = Arc::clone(&gate);
            thread::spawn(move || gate.wait_idle())
        };
        thread::sleep(Duration::from_millis(20));
        assert!(!idle.is_finished());
        gate.close();
        assert!(!idle.join().unwrap());
        assert!(!gate.acquire(0));
    }
}
