//! A priority thread's turn with client QoS on (`crate::io::qos`): client
//! operations are queued in the thread's scheduler as they are read, and
//! run in its order; an owed one (its reservation due) at once, the rest
//! at most `TURN_COST` a turn, after every ready connection was read.

use std::time::{Duration, Instant};

use crate::io::conn::ConnError;
use crate::io::qos::{ClassKey, TURN_COST};
use crate::messages::ClientOp;

use super::PriorityThread;

impl PriorityThread {
    /// Takes the map's QoS settings when it moved to a new epoch (every
    /// `PENDING_CHECK`, and at each turn while the scheduler is on), and
    /// forgets idle classes.
    pub(super) fn follow_qos(&mut self, now: Instant) {
        let view = self.cache.view(&self.shared.map);
        let limits = &self.shared.qos_limits;
        let micros = limits.micros(now);
        self.qos.follow(&view.map, micros);
        self.qos.sweep(limits, micros);
        // The operator's view: published while on, and once more when off.
        if self.qos.is_on() || self.qos_published {
            self.qos_published = self.qos.is_on();
            let classes = if self.qos_published { self.qos.view() } else { Vec::new() };
            let mut views = self.shared.qos_views.lock().expect("QoS views lock");
            if classes.is_empty() {
                views.remove(&self.index);
            } else {
                views.insert(self.index, classes);
            }
        }
    }

    /// Queues a client operation in the QoS scheduler (its lane, on a
    /// shared connection, waits until it has run).
    pub(super) fn schedule(&mut self, op: ClientOp) {
        let key = ClassKey::of(&op.request, op.token);
        let (direction, bytes) = if op.request.kind.is_data_read() {
            (duplex_qos::Direction::Read, u64::from(op.request.length))
        } else {
            (duplex_qos::Direction::Write, op.request.data.len() as u64)
        };
        let view = self.cache.view(&self.shared.map);
        let limits = &self.shared.qos_limits;
        let now = limits.micros(Instant::now());
        let held = self.qos.push(&view.map, limits, key, op, direction, bytes, now);
        self.shared.metrics.qos_scheduled.add(1);
        if held {
            self.shared.metrics.qos_limited.add(1);
        }
        // An operation owed its reservation runs now, ahead of what the
        // rest of this turn reads (replicas' work included).
        while let Some((op, _)) = self.qos.pop_owed(&self.shared.qos_limits, now) {
            self.run_scheduled_op(op);
            self.qos_flush = true;
        }
    }

    /// Runs what the QoS scheduler lets go this turn: at most `TURN_COST`,
    /// then what is left waits for the next turn (polled without waiting)
    /// or for the time the scheduler names.
    pub(super) fn run_scheduled(&mut self) {
        let started = Instant::now();
        let now = self.shared.qos_limits.micros(started);
        {
            let view = self.cache.view(&self.shared.map);
            self.qos.follow(&view.map, now);
        }
        self.qos_wake = None;
        // What this turn's events staged (replies, replicas' acks, sends)
        // leaves before a turn's worth of operations runs, not after it.
        self.write_touched();
        let mut budget = TURN_COST;
        while budget > 0.0 {
            match self.qos.pop(&self.shared.qos_limits, now) {
                duplex_qos::Pop::Ready { item: (op, cost), phase, .. } => {
                    budget -= cost;
                    self.run_scheduled_op(op);
                    if phase != duplex_qos::Phase::Weight {
                        // Owed or urgent: its replication (or its reply)
                        // leaves now, not behind the rest of the turn.
                        self.write_touched();
                    }
                }
                duplex_qos::Pop::Wait(until) => {
                    self.qos_wake = Some(started + Duration::from_micros(until.saturating_sub(now)));
                    break;
                }
                duplex_qos::Pop::Empty => break,
            }
        }
        self.qos_ready = budget <= 0.0 && !self.qos.is_empty();
    }

    /// Runs an operation the scheduler let go, as `dispatch` would have.
    fn run_scheduled_op(&mut self, mut op: ClientOp) {
        let token = op.token;
        // Its connection closed meanwhile: nobody waits for the answer
        // (tokens are never reused).
        let Some(cell) = self.conns.get(&token).filter(|c| !c.is_closed()).cloned() else { return };
        {
            let mut conn = cell.lock();
            if !conn.parked.is_empty() {
                // Operations wait for log room: it waits behind them.
                conn.parked.push_back(op);
                return;
            }
        }
        op.thread = self.index;
        let ticket = op.ticket;
        if self.run_client(op, false) {
            if let Some(ticket) = ticket {
                if let Err(why) = self.advance(&cell, token, ticket) {
                    self.drop_conn(token, ConnError::Protocol(why));
                }
            }
        }
    }

    /// The poll's timeout with QoS: none while a turn's work waits, else
    /// at most until the scheduler's next held operation may go.
    pub(super) fn qos_timeout(&self, timeout: Option<Duration>) -> Option<Duration> {
        if self.qos_ready {
            return Some(Duration::ZERO);
        }
        let Some(wake) = self.qos_wake else { return timeout };
        let until = wake.saturating_duration_since(Instant::now());
        Some(timeout.map_or(until, |t| t.min(until)))
    }
}
