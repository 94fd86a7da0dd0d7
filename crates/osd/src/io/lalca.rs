//! `threading = lalca` (issue 30; the dissertation's LALCA, paper 003
//! §3.3.2): an eventual PG's client operations run on the one priority
//! thread that currently owns the PG, and a thread that receives one for a
//! PG another thread owns forwards it to the owner's mailbox instead of
//! waiting for the PG's lock. A PG's lock is then taken by one priority
//! thread at a time, in turn, and never fought over by two.
//!
//! **The owner map.** The paper's "global object ID map" names the core
//! processing each object. Duplex's unit is the PG (an operation's log
//! append is the PG's, under the PG's lock), so the map is per PG, kept in
//! [`SLOTS`] atomic words indexed by the PG's key: two PGs that share a
//! slot share an owner, which costs only parallelism (as the lanes of
//! `order.rs` do). Each word holds the owning thread and how many
//! operations hold a claim on the slot: those forwarded and not yet run,
//! and those waiting for log room. The owner cannot change while a claim
//! is held, so a connection's operations on a PG, claimed in order, run in
//! order on one thread; the last release frees the slot, and the next
//! operation's thread takes it.
//!
//! **How long a claim lasts.** The paper's lock lasts until the request's
//! storage I/O completes. An eventual write's I/O is its append to the
//! primary's log, which the owner does inline, so its claim ends there;
//! the replicas' answers come later, in the background, and settle under
//! the PG's lock on the thread that sent the entry. Holding the claim
//! until those answers (the first version) forwarded 27% of the writes of
//! eight sessions on two threads, and each forward costs two wake-ups:
//! 43,600 writes/s against 47,400 with the claim ending at the log (both
//! with the threads pinned)
//! (docs/BENCHMARKS.md, "LALCA").
//!
//! **Why there is no Sub worker thread.** The paper pins a Sub worker
//! beside each Main worker because its Main worker sleeps in the network
//! wait and cannot take storage completions or forwarded requests. A
//! priority thread's `epoll_wait` watches its sockets and its mailbox (a
//! waker) at once, so one thread does both workers' work, and a second one
//! on the same core would only add a switch per completion.

use std::sync::atomic::{AtomicU64, Ordering};

/// Owner words: PG keys modulo this share one.
pub const SLOTS: usize = 1024;

const COUNT_BITS: u32 = 32;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

/// Where an operation whose claim was taken runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Claim {
    /// On the claiming thread: it owns the PG (now, or already).
    Here,
    /// On this thread, the PG's owner: post it to its mailbox.
    Forward(usize),
}

/// The PG → owning priority thread map.
pub struct Owners {
    words: Vec<AtomicU64>,
}

impl Default for Owners {
    fn default() -> Owners {
        Owners { words: (0..SLOTS).map(|_| AtomicU64::new(0)).collect() }
    }
}

/// A word's owner (thread + 1; 0: none) and claim count.
fn split(word: u64) -> (u64, u64) {
    (word >> COUNT_BITS, word & COUNT_MASK)
}

impl Owners {
    /// The slot of PG `key`: what a claim holds and its release gives back.
    pub fn slot_of(key: u32) -> u32 {
        key % SLOTS as u32
    }

    /// Takes a claim on `slot` for an operation that `thread` received:
    /// it runs here if the slot is free or already this thread's, else on
    /// the owner. Either way the claim is held until [`Owners::release`].
    pub fn claim(&self, slot: u32, thread: usize) -> Claim {
        let word = &self.words[slot as usize];
        let mut current = word.load(Ordering::Acquire);
        loop {
            let (owner, count) = split(current);
            debug_assert_eq!(
                owner == 0,
                count == 0,
                "owner word {current:#x}: an owner without claims or claims without one"
            );
            let (next, claim) = if owner == 0 {
                (((thread as u64 + 1) << COUNT_BITS) | 1, Claim::Here)
            } else {
                assert!(count < COUNT_MASK, "slot {slot}: claim count overflow");
                let owner = (owner - 1) as usize;
                (current + 1, if owner == thread { Claim::Here } else { Claim::Forward(owner) })
            };
            match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return claim,
                Err(seen) => current = seen,
            }
        }
    }

    /// Gives back one claim on `slot`; `thread` must own it (the claim's
    /// operation ran there). The last one frees the slot.
    pub fn release(&self, slot: u32, thread: usize) {
        let word = &self.words[slot as usize];
        let mut current = word.load(Ordering::Acquire);
        loop {
            let (owner, count) = split(current);
            assert!(
                owner == thread as u64 + 1 && count > 0,
                "slot {slot}: released by thread {thread}, but its word is {current:#x}"
            );
            let next = if count == 1 { 0 } else { current - 1 };
            match word.compare_exchange_weak(current, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return,
                Err(seen) => current = seen,
            }
        }
    }

    /// The thread owning `slot` and its claims (tests and the admin view).
    pub fn owner(&self, slot: u32) -> Option<(usize, u64)> {
        let (owner, count) = split(self.words[slot as usize].load(Ordering::Acquire));
        (owner != 0).then(|| ((owner - 1) as usize, count))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn a_free_slot_goes_to_the_first_claimer_and_comes_free_with_its_last_release() {
        let owners = Owners::default();
        assert_eq!(owners.claim(5, 1), Claim::Here);
        assert_eq!(owners.claim(5, 0), Claim::Forward(1));
        assert_eq!(owners.claim(5, 1), Claim::Here);
        assert_eq!(owners.owner(5), Some((1, 3)));
        owners.release(5, 1);
        owners.release(5, 1);
        assert_eq!(owners.claim(5, 0), Claim::Forward(1), "a claim is still held");
        owners.release(5, 1);
        owners.release(5, 1);
        assert_eq!(owners.owner(5), None);
        assert_eq!(owners.claim(5, 0), Claim::Here, "a free slot goes to whoever asks");
        assert_eq!(owners.owner(6), None, "slots are apart");
    }

    #[test]
    #[should_panic(expected = "released by thread 0")]
    fn only_the_owner_releases() {
        let owners = Owners::default();
        owners.claim(3, 1);
        owners.release(3, 0);
    }

    #[test]
    fn threads_that_claim_and_release_at_once_never_run_one_slot_in_two_places() {
        // Each thread claims, counts itself as running the slot on the
        // thread it was told, checks that no other thread runs the slot
        // meanwhile, then uncounts and releases there. The slot changes
        // hands only once every claim of its owner is given back, so a
        // count on another runner would be a broken hand-off.
        let owners = std::sync::Arc::new(Owners::default());
        let active = std::sync::Arc::new([(); 4].map(|_| [(); 4].map(|_| AtomicU64::new(0))));
        let threads: Vec<_> = (0..4)
            .map(|me| {
                let (owners, active) = (owners.clone(), active.clone());
                std::thread::spawn(move || {
                    for n in 0..20_000u32 {
                        let slot = (n % 4) as usize;
                        let runner = match owners.claim(slot as u32, me) {
                            Claim::Here => me,
                            Claim::Forward(owner) => owner,
                        };
                        active[slot][runner].fetch_add(1, Ordering::AcqRel);
                        for other in (0..4).filter(|other| *other != runner) {
                            let there = active[slot][other].load(Ordering::Acquire);
                            assert_eq!(there, 0, "slot {slot} runs on {runner} and on {other} at once");
                        }
                        active[slot][runner].fetch_sub(1, Ordering::AcqRel);
                        owners.release(slot as u32, runner);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("a claiming thread failed");
        }
        assert!((0..4).all(|slot| owners.owner(slot).is_none()), "every claim was given back");
    }

    proptest! {
        /// Against a model: claims and releases in any order keep the
        /// owner fixed while a claim is held, and free it with the last.
        #[test]
        fn the_owner_word_follows_its_model(steps in proptest::collection::vec((0usize..3, any::<bool>()), 1..200)) {
            let owners = Owners::default();
            let mut model: Option<(usize, u64)> = None;
            for (thread, claim) in steps {
                if claim || model.is_none() {
                    let got = owners.claim(0, thread);
                    let owner = model.map_or(thread, |(owner, _)| owner);
                    prop_assert_eq!(got, if owner == thread { Claim::Here } else { Claim::Forward(owner) });
                    model = Some((owner, model.map_or(0, |(_, count)| count) + 1));
                } else if let Some((owner, count)) = model {
                    owners.release(0, owner);
                    model = (count > 1).then_some((owner, count - 1));
                }
                prop_assert_eq!(owners.owner(0), model);
            }
        }
    }
}
