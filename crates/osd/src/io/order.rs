//! The order a shared connection's requests take effect in, when several
//! worker threads serve it (`connection_policy = lcam | naive`, issue 29).
//!
//! A worker reads a batch of frames under the connection's lock, then
//! runs them after releasing it, so that another worker can read the next
//! batch meanwhile. Two batches then run at once, and a write to a PG in
//! the second could overtake one to the same PG in the first. To keep the
//! order the protocol needs without holding the lock across the whole
//! operation, each request that must keep its place takes a ticket while
//! it is read (under the connection's lock): a lane (its PG, folded onto
//! [`LANES`]) and its sequence number in that lane. It runs only when
//! every earlier ticket of its lane has run; one that comes too early
//! waits here, and the worker that runs the ticket before it runs it next.
//!
//! What is kept: per connection, the requests of one PG (client
//! operations, replicated entries, peering requests) take effect in the
//! order they arrived; PGs that share a lane are kept in order too, which
//! costs only parallelism. Replies leave in request order regardless
//! (the reply slots, taken under the same lock: `conn.rs`). Requests of
//! different lanes may take effect in any order, as they may when a
//! client sends them on two connections.

/// Lanes per connection: independent orders, one for each group of PGs.
pub const LANES: usize = 64;

/// A request's place: its lane and its sequence number in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    lane: u16,
    seq: u64,
}

/// The tickets a connection has given out, per lane (kept under the
/// connection's lock, where frames are read in arrival order).
#[derive(Debug)]
pub struct Tickets {
    next: [u64; LANES],
}

impl Default for Tickets {
    fn default() -> Self {
        Tickets { next: [0; LANES] }
    }
}

impl Tickets {
    /// The next ticket of the lane `key` (a PG key) falls in.
    pub fn issue(&mut self, key: u32) -> Ticket {
        let lane = (key as usize % LANES) as u16;
        let seq = self.next[lane as usize];
        self.next[lane as usize] += 1;
        Ticket { lane, seq }
    }
}

/// Which tickets have run, and the requests waiting for their turn.
#[derive(Debug)]
pub struct Sequencer<T> {
    done: [u64; LANES],
    waiting: Vec<(Ticket, T)>,
}

impl<T> Default for Sequencer<T> {
    fn default() -> Self {
        Sequencer { done: [0; LANES], waiting: Vec::new() }
    }
}

impl<T> Sequencer<T> {
    /// `Some(item)`: its turn, run it (then call [`Sequencer::leave`]);
    /// `None`: an earlier ticket of its lane has not run yet, so it waits
    /// here and `leave` hands it out when that one has.
    pub fn enter(&mut self, ticket: Ticket, item: T) -> Option<T> {
        let done = self.done[ticket.lane as usize];
        debug_assert!(ticket.seq >= done, "ticket {ticket:?} entered after its lane ran past it ({done})");
        if ticket.seq == done {
            return Some(item);
        }
        debug_assert!(self.waiting.iter().all(|(t, _)| *t != ticket), "ticket {ticket:?} entered twice");
        self.waiting.push((ticket, item));
        None
    }

    /// `ticket` has taken effect: its lane moves on, and the request next
    /// in it, if it already waits, is handed out (with its ticket) to run.
    pub fn leave(&mut self, ticket: Ticket) -> Option<(Ticket, T)> {
        let lane = ticket.lane as usize;
        assert_eq!(self.done[lane], ticket.seq, "ticket {ticket:?} left out of turn");
        self.done[lane] += 1;
        let next = self.done[lane];
        let at = self.waiting.iter().position(|(t, _)| t.lane == ticket.lane && t.seq == next)?;
        Some(self.waiting.swap_remove(at))
    }

    /// Requests waiting for an earlier one.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_request_that_comes_early_waits_for_the_one_before_it_in_its_lane_only() {
        let mut tickets = Tickets::default();
        let first = tickets.issue(7);
        let second = tickets.issue(7);
        let other = tickets.issue(8);
        let mut order = Sequencer::default();
        assert_eq!(order.enter(second, "second"), None, "the first of its lane has not run");
        assert_eq!(order.enter(other, "other"), Some("other"), "another lane runs at once");
        assert_eq!(order.leave(other), None);
        assert_eq!(order.enter(first, "first"), Some("first"));
        assert_eq!(order.leave(first), Some((second, "second")), "the waiting one is handed out next");
        assert_eq!(order.leave(second), None);
        assert_eq!(order.waiting(), 0);
        let same_lane = tickets.issue(7 + LANES as u32);
        assert_eq!(order.enter(same_lane, "folded"), Some("folded"), "PG 7+64 shares lane 7, now at its turn");
    }

    #[test]
    #[should_panic(expected = "left out of turn")]
    fn leaving_out_of_turn_is_a_bug() {
        let mut tickets = Tickets::default();
        let _first = tickets.issue(1);
        let second = tickets.issue(1);
        let mut order: Sequencer<()> = Sequencer::default();
        order.leave(second);
    }

    proptest! {
        /// Whatever order workers present the tickets in, each lane's
        /// requests run in the order they were issued, and every one runs.
        #[test]
        fn every_lane_runs_in_issue_order_whatever_order_the_workers_come_in(
            keys in proptest::collection::vec(0u32..200, 1..120),
            shuffle in proptest::collection::vec(any::<u32>(), 120),
        ) {
            let mut tickets = Tickets::default();
            let issued: Vec<(Ticket, usize)> = keys.iter().enumerate().map(|(i, k)| (tickets.issue(*k), i)).collect();
            let mut arrival = issued.clone();
            for (i, r) in shuffle.iter().enumerate().take(arrival.len()) {
                let j = *r as usize % arrival.len();
                arrival.swap(i, j);
            }
            let mut order = Sequencer::default();
            let mut ran: Vec<usize> = Vec::new();
            for (ticket, item) in arrival {
                let Some(mut item) = order.enter(ticket, item) else { continue };
                let mut ticket = ticket;
                loop {
                    ran.push(item);
                    match order.leave(ticket) {
                        Some((next, next_item)) => { ticket = next; item = next_item; }
                        None => break,
                    }
                }
            }
            prop_assert_eq!(ran.len(), keys.len(), "every request ran");
            prop_assert_eq!(order.waiting(), 0);
            for lane in 0..LANES {
                let in_lane: Vec<usize> = ran.iter().copied().filter(|i| keys[*i] as usize % LANES == lane).collect();
                let mut sorted = in_lane.clone();
                sorted.sort_unstable();
                prop_assert_eq!(in_lane, sorted, "lane {} out of order", lane);
            }
        }
    }
}
