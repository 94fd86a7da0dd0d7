//! The flusher's device scheduler (issue 31, docs/QOS.md step 3): the
//! background classes of the store's one thread.
//!
//! A flusher is the only thread that does its partition's store I/O, so it
//! is where client work and background work meet on the device. Client
//! work (reads, flushes, sync applies) and the requests of PGs that serve
//! no client until they are answered (peering, recovery inside it, a
//! backfill's join: `Flusher::is_urgent`) run first in each step, as
//! before. The rest is background, queued here by class in a
//! [`duplex_qos::Scheduler`], the same mClock scheduler the priority
//! threads run for clients:
//!
//! - [`DeviceClass::Backfill`]: a backfill's locks at its primary. A walk
//!   moves its data under them, so each lock pays, before it is taken,
//!   for the bytes the walk pulled since the one before (as the peering
//!   thread's throttle, which this replaced, paused before each lock).
//!   The steps under a lock (pull, compare, push, release) are not
//!   queued: they run in the step that takes them, after client work,
//!   so that no lock waits in a queue and a primary's requests never
//!   wait in another OSD's. Its limit is `--recovery-bytes-per-sec`.
//! - [`DeviceClass::Scrub`]: a scrub's digest pages of an active PG, each
//!   paying for the bytes the pages before it read.
//! - [`DeviceClass::Trim`]: the snapshot trimmer's scans, each paying for
//!   the clone deletes the scan before it led to. Its limit is
//!   `--trims-per-sec`.
//! - [`DeviceClass::Strays`]: removal batches of stray copies.
//!
//! Each class has a reservation (cost units a second it gets however busy
//! clients keep the device), a weight (its share of what clients leave)
//! and a limit (cost units a second it never exceeds). Costs are the
//! scheduler's units: one per started 4 KiB the request reads or writes.
//!
//! **Client work as a class.** It is not queued here: it runs at once in
//! each step, since a client waits on it. Its weight ([`CLIENT_WEIGHT`])
//! is kept by credit instead: a step that did client work of cost `c`
//! earns the background `c / CLIENT_WEIGHT` units, which the weight phase
//! spends. In such a step a background request runs only if its class is
//! owed its reservation or there is credit left. A step with no client
//! work serves the background freely, up to its limits: the device is
//! never idle while background work waits (work-conserving).
//!
//! A step serves one background request at most, then the flusher takes
//! its new jobs again: a client read waits behind one background request
//! at most.
//!
//! **Costs nothing unless used.** The flusher asks this queue only while it
//! holds work; with none, a step is what it was before.

use std::time::Instant;

use duplex_proto::peering::PeerOp;
use duplex_qos::{ClassSpec, Phase, Pop, Scheduler, SpecError};

/// A class of background work on a flusher.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DeviceClass {
    Backfill,
    Scrub,
    Trim,
    Strays,
}

impl DeviceClass {
    pub const ALL: [DeviceClass; 4] =
        [DeviceClass::Backfill, DeviceClass::Scrub, DeviceClass::Trim, DeviceClass::Strays];

    pub fn name(self) -> &'static str {
        match self {
            DeviceClass::Backfill => "backfill",
            DeviceClass::Scrub => "scrub",
            DeviceClass::Trim => "trim",
            DeviceClass::Strays => "strays",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Client work's weight against the background's (which is 1 a class):
/// under a saturating client, a backfill gets a quarter of the device
/// beyond its reservation, up to its limit.
pub const CLIENT_WEIGHT: f64 = 3.0;

/// The most credit the background may bank from client work: a quiet
/// spell followed by a burst of client work cannot let a backlog of
/// background requests run ahead of it (64 units: 256 KiB, one backfill
/// chunk).
pub const CREDIT_MAX: f64 = 64.0;

/// A stray copy's removal: objects deleted a second at most (the old pace,
/// a batch of 32 every 2 ms).
pub const STRAY_OBJECTS_PER_SEC: f64 = 16_000.0;

/// The fraction of its limit a class is owed whatever the client load
/// (a class with no limit: [`RESERVATION_UNLIMITED`]).
const RESERVATION_SHARE: f64 = 1.0 / 16.0;

/// The reservation of a class with no limit: 8 MiB a second.
const RESERVATION_UNLIMITED: f64 = 2_048.0;

/// Each background class's share of a flusher.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DeviceSpecs {
    specs: [ClassSpec; 4],
}

impl DeviceSpecs {
    /// The defaults, from the OSD's two knobs: the backfill's bytes a
    /// second and the trimmer's clone deletes a second at each flusher (0:
    /// no limit). Each class is owed a sixteenth of its limit; the scrub
    /// and the strays are limited by what a client's weight leaves them.
    pub fn new(recovery_bytes_per_sec: u64, trims_per_sec: u32) -> Result<DeviceSpecs, DeviceSpecError> {
        if recovery_bytes_per_sec != 0 && recovery_bytes_per_sec < RECOVERY_BYTES_PER_SEC_MIN {
            return Err(DeviceSpecError::RecoveryTooSlow(recovery_bytes_per_sec));
        }
        let limited = |limit: f64| {
            if limit == 0.0 {
                ClassSpec::new(RESERVATION_UNLIMITED, 1.0, 0.0)
            } else {
                ClassSpec::new(limit * RESERVATION_SHARE, 1.0, limit)
            }
        };
        let backfill_limit = if recovery_bytes_per_sec == 0 { 0.0 } else { duplex_qos::cost(recovery_bytes_per_sec) };
        Ok(DeviceSpecs {
            specs: [
                limited(backfill_limit)?,
                limited(0.0)?,
                limited(f64::from(trims_per_sec))?,
                limited(STRAY_OBJECTS_PER_SEC)?,
            ],
        })
    }

    pub fn of(&self, class: DeviceClass) -> ClassSpec {
        self.specs[class.index()]
    }
}

impl Default for DeviceSpecs {
    fn default() -> DeviceSpecs {
        DeviceSpecs::new(crate::config::DEFAULT_RECOVERY_BYTES_PER_SEC, crate::config::DEFAULT_TRIMS_PER_SEC)
            .expect("the defaults are valid")
    }
}

/// The class of a peering request of a PG active here that waits for its
/// turn (see the module doc); None: it runs in the step that takes it,
/// after client work.
pub fn peer_class(op: &PeerOp) -> Option<DeviceClass> {
    match op {
        PeerOp::Digests { .. } => Some(DeviceClass::Scrub),
        PeerOp::BackfillLock { object: Some(_), .. } => Some(DeviceClass::Backfill),
        _ => None,
    }
}

/// The least `--recovery-bytes-per-sec` but 0 (none): at 1 MiB/s a
/// 256 KiB chunk waits 250 ms for its lock, and 4 s at the class's
/// reservation; the primary's peering thread waits that long, and a wait
/// past [`STALE_AFTER`] is refused as given up.
pub const RECOVERY_BYTES_PER_SEC_MIN: u64 = 1 << 20;

/// A queued request older than this is refused when its turn comes: its
/// requester (the peering thread, which gives up after 10 s) may have
/// given up on it and moved on, and what it asked must not happen after.
pub const STALE_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// Background requests a flusher keeps queued at most; a peering request
/// past it is refused (each primary has one request out at a time, so only
/// a misbehaving peer gets there; the trimmer's scans and the strays'
/// batch are one each).
pub const QUEUE_MAX: usize = 4096;

/// A bad knob.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum DeviceSpecError {
    #[error(
        "a backfill limit of {0} bytes a second is below the least, {RECOVERY_BYTES_PER_SEC_MIN} (or 0: no limit)"
    )]
    RecoveryTooSlow(u64),
    #[error(transparent)]
    Spec(#[from] SpecError),
}

/// A flusher's queued background work (see the module doc).
pub struct DeviceQueue<T> {
    scheduler: Scheduler<DeviceClass, (T, f64)>,
    /// The clock's origin: the scheduler counts microseconds.
    base: Option<Instant>,
    /// Units the weight phase may spend while client work goes on.
    credit: f64,
    /// When the next step may serve something without a new push.
    next_at: Option<Instant>,
    /// Requests and cost units served, by class.
    served: [(u64, f64); 4],
}

impl<T> DeviceQueue<T> {
    pub fn new(specs: &DeviceSpecs) -> DeviceQueue<T> {
        let mut scheduler = Scheduler::new(specs.of(DeviceClass::Backfill));
        for class in DeviceClass::ALL {
            scheduler.set_class(class, specs.of(class), 0);
        }
        DeviceQueue { scheduler, base: None, credit: 0.0, next_at: None, served: [(0, 0.0); 4] }
    }

    pub fn is_empty(&self) -> bool {
        self.scheduler.is_empty()
    }

    pub fn len(&self) -> usize {
        self.scheduler.len()
    }

    pub fn queued(&self, class: DeviceClass) -> usize {
        self.scheduler.queued(&class)
    }

    /// Requests and cost units served of `class` since the start.
    pub fn served(&self, class: DeviceClass) -> (u64, f64) {
        self.served[class.index()]
    }

    fn micros(&mut self, now: Instant) -> u64 {
        let base = *self.base.get_or_insert(now);
        now.saturating_duration_since(base).as_micros() as u64
    }

    fn at(&self, micros: u64) -> Instant {
        self.base.expect("set by the first push") + std::time::Duration::from_micros(micros)
    }

    /// Queues `item` of `class`, costing `cost` units (at least 1).
    pub fn push(&mut self, class: DeviceClass, item: T, cost: f64, now: Instant) {
        debug_assert!(cost.is_finite(), "a request costing {cost}");
        debug_assert!(self.len() <= QUEUE_MAX + 2, "{} queued: the flusher's bound is not kept", self.len());
        let cost = cost.clamp(1.0, duplex_qos::scheduler::COST_MAX);
        let now_us = self.micros(now);
        self.scheduler.push(class, (item, cost), cost, now_us);
        self.next_at = Some(now);
    }

    /// When a step may next serve something without a new push (None:
    /// nothing is queued).
    pub fn next_at(&self) -> Option<Instant> {
        self.next_at
    }

    /// The request to serve in a step whose client work cost `client_cost`
    /// units (0: it did none), if any (see the module doc), with its cost.
    pub fn next(&mut self, now: Instant, client_cost: f64) -> Option<(DeviceClass, T, f64)> {
        debug_assert!(client_cost >= 0.0 && client_cost.is_finite(), "client cost {client_cost}");
        if self.scheduler.is_empty() {
            self.next_at = None;
            return None;
        }
        let now_us = self.micros(now);
        let busy = client_cost > 0.0;
        self.credit = (self.credit + client_cost / CLIENT_WEIGHT).min(CREDIT_MAX);
        let owed = if busy { self.scheduler.pop_owed(now_us) } else { None };
        let chosen = match owed {
            Some(chosen) => Some(chosen),
            // Client work goes on and nothing is owed: by weight only on credit.
            None if busy && self.credit <= 0.0 => {
                // A step without client work may serve it.
                self.next_at = Some(now);
                return None;
            }
            None => match self.scheduler.pop(now_us) {
                Pop::Ready { key, item, phase } => Some((key, item, phase)),
                Pop::Wait(until) => {
                    self.next_at = Some(self.at(until));
                    return None;
                }
                Pop::Empty => None,
            },
        };
        let (class, (item, cost), phase) = chosen?;
        if busy && phase == Phase::Weight {
            self.credit -= cost;
        }
        let served = &mut self.served[class.index()];
        served.0 += 1;
        served.1 += cost;
        self.next_at = (!self.scheduler.is_empty()).then_some(now);
        // A busy step spends credit it had: one request's cost below zero at most.
        debug_assert!(self.credit > -duplex_qos::scheduler::COST_MAX, "credit {}", self.credit);
        Some((class, item, cost))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    fn specs() -> DeviceSpecs {
        // Backfill 8 MiB/s (2,048 units), trims 100 a second.
        DeviceSpecs::new(8 << 20, 100).unwrap()
    }

    #[test]
    fn the_defaults_follow_the_knobs() {
        let specs = DeviceSpecs::new(128 << 20, 500).unwrap();
        let backfill = specs.of(DeviceClass::Backfill);
        assert_eq!((backfill.limit(), backfill.reservation(), backfill.weight()), (32_768.0, 2_048.0, 1.0));
        let trim = specs.of(DeviceClass::Trim);
        assert_eq!((trim.limit(), trim.reservation()), (500.0, 500.0 / 16.0));
        let unlimited = DeviceSpecs::new(0, 0).unwrap();
        assert_eq!(unlimited.of(DeviceClass::Backfill).limit(), 0.0, "0: no limit");
        assert_eq!(unlimited.of(DeviceClass::Backfill).reservation(), RESERVATION_UNLIMITED);
        assert_eq!(unlimited.of(DeviceClass::Scrub).limit(), 0.0);
        assert_eq!(DeviceSpecs::new(512 << 10, 500), Err(DeviceSpecError::RecoveryTooSlow(512 << 10)));
    }

    #[test]
    fn only_locks_and_scrub_pages_wait_their_turn() {
        let lock = PeerOp::BackfillLock { object: Some(b"o".to_vec()), start: 0, end: 1 << 18 };
        assert_eq!(peer_class(&lock), Some(DeviceClass::Backfill));
        assert_eq!(peer_class(&PeerOp::Digests { cursor: Vec::new() }), Some(DeviceClass::Scrub));
        // Under a lock: at once, so that no lock waits in a queue.
        for op in [
            PeerOp::BackfillLock { object: None, start: 0, end: 0 },
            PeerOp::Pull { object: b"o".to_vec(), offset: 0, len: 1 << 18 },
            PeerOp::ChunkDigest { object: b"o".to_vec(), offset: 0, len: 1 << 18 },
            PeerOp::PushData { object: b"o".to_vec(), offset: 0, data: vec![0; 16] },
            PeerOp::Stat { object: b"o".to_vec() },
        ] {
            assert_eq!(peer_class(&op), None, "{op:?}");
        }
    }

    /// Cost units served in a second to a backlog of 64-unit backfill
    /// chunks, with `client_cost` of client work in each 100 µs step.
    fn backfill_served_beside(client_cost: f64) -> f64 {
        let start = Instant::now();
        let mut queue = DeviceQueue::new(&specs());
        for n in 0..1_000 {
            queue.push(DeviceClass::Backfill, n, 64.0, start);
        }
        let steps =
            (0..10_000u64).filter(|step| queue.next(start + Duration::from_micros(step * 100), client_cost).is_some());
        steps.count() as f64 * 64.0
    }

    #[test]
    fn a_busy_client_leaves_the_background_its_reservation_and_its_weight_share() {
        // Client work of 30 units every 100 µs earns the background a third
        // of 300 units a millisecond (100/ms), above the backfill's limit
        // of 2,048/s: held to its limit (plus the burst the scheduler
        // allows).
        let served = backfill_served_beside(30.0);
        assert!((1_900.0..=2_048.0 + 128.0).contains(&served), "served {served} units in 1 s");
        // A client too busy to earn much: 0.3 units a step. The backfill
        // still gets its reservation (128/s), not more than it earns.
        let served = backfill_served_beside(0.3);
        assert!((128.0 + 900.0..=128.0 + 1_000.0 + 128.0).contains(&served), "served {served} units in 1 s");
    }

    #[test]
    fn an_idle_device_serves_the_background_up_to_its_limits_and_says_when_next() {
        let start = Instant::now();
        let mut queue = DeviceQueue::new(&specs());
        assert_eq!(queue.next(start, 0.0), None);
        assert_eq!(queue.next_at(), None, "nothing queued: no wake");
        queue.push(DeviceClass::Trim, "a", 50.0, start);
        queue.push(DeviceClass::Trim, "b", 50.0, start);
        queue.push(DeviceClass::Strays, "s", 32.0, start);
        assert_eq!(queue.next_at(), Some(start));
        let first = queue.next(start, 0.0).map(|(_, item, _)| item);
        let second = queue.next(start, 0.0).map(|(_, item, _)| item);
        let mut got = vec![first.unwrap(), second.unwrap()];
        got.sort();
        assert_eq!(got, ["a", "s"], "one of each class at once: the second trim waits for its limit");
        assert_eq!(queue.next(start, 0.0), None);
        // 50 units at 100/s: half a second after the first.
        let wake = queue.next_at().unwrap();
        assert!(wake >= start + Duration::from_millis(499) && wake <= start + Duration::from_millis(501), "{wake:?}");
        assert_eq!(queue.next(wake, 0.0), Some((DeviceClass::Trim, "b", 50.0)));
        assert_eq!(queue.next_at(), None);
        assert_eq!(queue.served(DeviceClass::Trim), (2, 100.0));
    }

    #[derive(Clone, Debug)]
    enum Event {
        /// Time passes (µs), then a step with this much client work.
        Step {
            after_us: u64,
            client_cost: u8,
        },
        Push {
            class: u8,
            cost: u16,
        },
    }

    fn events() -> impl Strategy<Value = Vec<Event>> {
        let event = prop_oneof![
            (1u64..3_000, 0u8..40).prop_map(|(after_us, client_cost)| Event::Step { after_us, client_cost }),
            (0u8..4, 1u16..128).prop_map(|(class, cost)| Event::Push { class, cost }),
        ];
        proptest::collection::vec(event, 1..600)
    }

    proptest! {
        /// Against a model over random arrivals and client loads: no class
        /// exceeds its limit over any window; a step with no client work
        /// serves something whenever a class under its limit waits
        /// (work-conserving); a class is never served while client work
        /// goes on unless it is owed or there is credit; requests leave
        /// their class in order.
        #[test]
        fn limits_hold_and_an_idle_device_is_never_left_idle(events in events()) {
            let start = Instant::now();
            let specs = DeviceSpecs::new(1 << 20, 200).unwrap(); // backfill 256 units/s, trims 200/s
            let mut queue = DeviceQueue::new(&specs);
            let mut now = start;
            let mut next_id = 0u64;
            let mut queued: [std::collections::VecDeque<(u64, f64)>; 4] = Default::default();
            let mut served: Vec<(DeviceClass, Instant, f64)> = Vec::new();
            for event in events {
                match event {
                    Event::Push { class, cost } => {
                        let class = DeviceClass::ALL[class as usize];
                        queue.push(class, next_id, f64::from(cost), now);
                        queued[class as usize].push_back((next_id, f64::from(cost)));
                        next_id += 1;
                    }
                    Event::Step { after_us, client_cost } => {
                        now += Duration::from_micros(after_us);
                        let before = queue.served;
                        let got = queue.next(now, f64::from(client_cost));
                        if let Some((class, id, cost_served)) = got {
                            let (expected, cost) = queued[class as usize].pop_front().expect("a queued request");
                            prop_assert_eq!(id, expected, "FIFO within a class");
                            prop_assert_eq!(cost_served, cost);
                            served.push((class, now, cost));
                        } else if client_cost == 0 && !queue.is_empty() {
                            // Nothing served on an idle device: every class
                            // with work waits for its limit, and says when.
                            let wake = queue.next_at().expect("a wake while work waits");
                            prop_assert!(wake > now, "idle with ready work at {:?}", now - start);
                        }
                        prop_assert!(queue.served.iter().zip(before).filter(|(a, b)| a.0 != b.0).count() <= 1);
                    }
                }
            }
            for class in DeviceClass::ALL {
                let limit = specs.of(class).limit();
                if limit == 0.0 {
                    continue;
                }
                let times: Vec<(Instant, f64)> =
                    served.iter().filter(|(c, _, _)| *c == class).map(|(_, at, cost)| (*at, *cost)).collect();
                // Every window [times[i], times[j]]: cost served ≤ limit × window + 2 requests' worth.
                for i in 0..times.len() {
                    let mut sum = 0.0;
                    for j in i..times.len() {
                        sum += times[j].1;
                        let window = (times[j].0 - times[i].0).as_secs_f64();
                        prop_assert!(
                            sum <= limit * window + 2.0 * 128.0 + 1e-6,
                            "{:?}: {} units in {}s, limit {}/s", class, sum, window, limit
                        );
                    }
                }
            }
        }
    }
}
