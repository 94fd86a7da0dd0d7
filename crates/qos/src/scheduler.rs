//! The OSD's QoS scheduler: mClock (Gulati, Merchant and Varman, OSDI 2010),
//! as dmClock runs it on each server, sans I/O. Time is an argument in
//! microseconds; nothing here reads a clock.
//!
//! Work is queued by class (an image, a client, or a background class such
//! as recovery, backfill or scrub). Each class has a [`ClassSpec`]: a
//! reservation (cost units a second it is owed even when others are busy),
//! a weight (its share of what is left) and a limit (cost units a second it
//! never exceeds). A request's cost is in abstract units (the OSD uses
//! 1 + bytes/4096); rates are cost units a second.
//!
//! # Tags
//!
//! Each class's head request carries three tags, from the tags of the
//! request before it (`prev`) and its cost `c`:
//!
//! - reservation `R = max(R_prev + c/r, arrival, active_since)` (µs),
//! - limit `L = max(L_prev + c/l, head_since)` (µs),
//! - proportion `P = max(P_prev, floor) + c/w` (virtual: only compared).
//!
//! `pop(now)` serves, in order:
//!
//! 1. urgent classes ([`Scheduler::set_urgent`]), FIFO by arrival, ignoring
//!    limits and tags ([`Phase::Urgent`]);
//! 2. the constraint phase: among heads with `L <= now` and `R <= now`, the
//!    least `R` ([`Phase::Reservation`]);
//! 3. the weight phase: among heads with `L <= now`, the least `P`
//!    ([`Phase::Weight`]). A request served here lowers its class's later `R`
//!    tags by `c/r`, so weight-phase service is not counted against the
//!    reservation (mClock's adjustment);
//! 4. otherwise [`Pop::Wait`] until the least `L` of the heads, or
//!    [`Pop::Empty`].
//!
//! A class's requests leave in FIFO order.
//!
//! # Where this differs from the paper, and why
//!
//! - Tags are computed when a request becomes its class's head, not on
//!   arrival (dmClock's "delayed tag calculation"). For `R` this gives the
//!   paper's tags (the floor is still the arrival time), but a live
//!   [`Scheduler::set_class`] acts on the very next request instead of after
//!   the queue drains, and the weight-phase adjustment is one subtraction
//!   instead of one per queued request.
//! - `L` floors at the time the request became head, not its arrival: a
//!   backlogged class held below its limit by others would otherwise keep
//!   tags far behind `now` and, when the others stop, burst above its limit
//!   until they catch up. With this floor a class gets at most
//!   `l × window + 2` requests' cost in any window (one for the window's
//!   edge, one for a head that was served after its `L`).
//! - The constraint phase also needs `L <= now`: the limit is a hard cap.
//!   Since `r <= l` this takes nothing from a class owed its reservation in
//!   steady state; it stops a catch-up of missed reservation (after urgent
//!   work, say) from exceeding the limit.
//! - `P` tags are virtual: they advance by `c/w` per request, so they run
//!   ahead of real time when weights are small and behind it when they are
//!   large. Floored at real time (`max(P_prev + c/w, t)`), a class returning
//!   from idle would get either everything until it caught up (tags ahead)
//!   or be starved (tags behind). As in the paper's tag adjustment, a class
//!   that becomes active starts from the virtual time (the least `P` among
//!   heads that may be served, or if none, the largest `P` served in the
//!   weight phase): it neither hoards credit from idling nor is penalised.
//! - `P` counts service in every phase (as in the paper), so reservation
//!   is a floor under a class's weighted share of the whole, not added to a
//!   share of the rest; classes without reservations split what the others
//!   leave by weight.
//! - Urgent service takes no tags. When a class stops being urgent its head
//!   is tagged as if the class had just become active: no debt from the
//!   urgent burst, no credit from the wait.
//!
//! # Time
//!
//! Time never goes back: a call with an earlier `now` than one before it is
//! taken at the latest time seen.
//!
//! # Cost
//!
//! With `n` classes holding queued work and `N` classes known: `push`,
//! `set_class`, `set_urgent` and `queued` are O(log N); `pop` is O(log N)
//! amortized (a head waiting for its limit moves to the ready set once);
//! `remove_class` is O(log N) plus its queue. Each allocates at most a
//! queue slot and a few index entries (clones of the key).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt::Debug;

use thiserror::Error;

/// Microseconds per second.
const MICROS_PER_SECOND: f64 = 1_000_000.0;

/// The least non-zero reservation or limit, cost units a second: below it
/// is a typo, and its tag step (`cost / rate`) would leave f64's range.
pub const RATE_PER_SECOND_MIN: f64 = 1e-3;
/// The largest reservation or limit, cost units a second.
pub const RATE_PER_SECOND_MAX: f64 = 1e12;
/// The least weight.
pub const WEIGHT_MIN: f64 = 1e-3;
/// The largest weight. With [`WEIGHT_MIN`] this bounds the ratio of two
/// classes' `P` steps to 1e9, well inside f64's 53 bits of precision.
pub const WEIGHT_MAX: f64 = 1e6;
/// The largest cost of one request.
pub const COST_MAX: f64 = 1e9;

/// The `R` and `L` of "no request before": far enough back that the first
/// request's tags are its floors (the step added, at most
/// `COST_MAX / RATE_PER_SECOND_MIN` seconds, is 1e18 µs), and finite.
const TAG_BEFORE_ANY_US: f64 = -1e30;

/// A class's share of the server. Rates are cost units a second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassSpec {
    reservation: f64,
    weight: f64,
    limit: f64,
}

#[derive(Clone, Debug, Error, PartialEq)]
pub enum SpecError {
    #[error("{field} is {value}: it must be a finite number")]
    NotFinite { field: &'static str, value: f64 },
    #[error(
        "{field} is {value}/s: it must be 0 (none) or from {RATE_PER_SECOND_MIN} to {RATE_PER_SECOND_MAX} per second"
    )]
    RateOutOfRange { field: &'static str, value: f64 },
    #[error("weight is {value}: it must be from {WEIGHT_MIN} to {WEIGHT_MAX}")]
    WeightOutOfRange { value: f64 },
    #[error("limit {limit}/s is below reservation {reservation}/s")]
    LimitBelowReservation { reservation: f64, limit: f64 },
}

impl ClassSpec {
    /// `reservation` and `limit` are cost units a second, 0 for none;
    /// `weight` is positive. A limit, if any, is at least the reservation.
    pub fn new(reservation: f64, weight: f64, limit: f64) -> Result<ClassSpec, SpecError> {
        for (field, value) in [("reservation", reservation), ("weight", weight), ("limit", limit)] {
            if !value.is_finite() {
                return Err(SpecError::NotFinite { field, value });
            }
        }
        for (field, value) in [("reservation", reservation), ("limit", limit)] {
            if value != 0.0 && !(RATE_PER_SECOND_MIN..=RATE_PER_SECOND_MAX).contains(&value) {
                return Err(SpecError::RateOutOfRange { field, value });
            }
        }
        if !(WEIGHT_MIN..=WEIGHT_MAX).contains(&weight) {
            return Err(SpecError::WeightOutOfRange { value: weight });
        }
        if limit > 0.0 && limit < reservation {
            return Err(SpecError::LimitBelowReservation { reservation, limit });
        }
        Ok(ClassSpec { reservation, weight, limit })
    }

    /// Cost units a second the class is owed, 0 for none.
    pub fn reservation(&self) -> f64 {
        self.reservation
    }

    pub fn weight(&self) -> f64 {
        self.weight
    }

    /// Cost units a second the class never exceeds, 0 for none.
    pub fn limit(&self) -> f64 {
        self.limit
    }
}

/// Why a request was chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Its class is urgent.
    Urgent,
    /// Its class's reservation was due.
    Reservation,
    /// Its class had the least proportion tag among those under their limits.
    Weight,
}

/// One class as [`Scheduler::stats`] shows it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClassStats {
    pub spec: ClassSpec,
    pub urgent: bool,
    pub queued: usize,
    /// Requests served while the class was urgent, in its reservation
    /// phase, and in the weight phase, since the class became known.
    pub served_urgent: u64,
    pub served_reservation: u64,
    pub served_weight: u64,
}

/// What [`Scheduler::pop`] gives.
#[derive(Debug, PartialEq)]
pub enum Pop<K, T> {
    Ready {
        key: K,
        item: T,
        phase: Phase,
    },
    /// Work is queued but every class holding it is at its limit: call
    /// again at this time (µs, later than `now`), or when work arrives.
    Wait(u64),
    /// Nothing is queued.
    Empty,
}

/// A tag in a BTreeSet: totally ordered. Tags are asserted finite where
/// they are made, so the order is the numeric one.
#[derive(Clone, Copy, Debug)]
struct Tag(f64);

impl PartialEq for Tag {
    fn eq(&self, other: &Tag) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Tag {}

impl PartialOrd for Tag {
    fn partial_cmp(&self, other: &Tag) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Tag {
    fn cmp(&self, other: &Tag) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Tags {
    reservation_us: f64,
    limit_us: f64,
    proportion: f64,
}

impl Tags {
    fn is_finite(&self) -> bool {
        self.reservation_us.is_finite() && self.limit_us.is_finite() && self.proportion.is_finite()
    }
}

#[derive(Debug)]
struct Queued<T> {
    item: T,
    cost: f64,
    arrival_us: u64,
    /// Order of arrival over all classes: urgent classes are served by it.
    arrival_seq: u64,
}

#[derive(Debug)]
struct Class<T> {
    spec: ClassSpec,
    urgent: bool,
    queue: VecDeque<Queued<T>>,
    /// The tags of the request served before the head (after the
    /// weight-phase adjustment), from which the head's are made.
    prev: Tags,
    /// The head's tags while the class is indexed: queued and not urgent.
    head: Option<Tags>,
    /// The head's `L <= now` (the latest now seen): it is in the ready
    /// indexes, else in the limited one. Once ready a head stays ready.
    head_ready: bool,
    /// When the head became the head: its `L` floor.
    head_since_us: u64,
    /// When the class last became active (queued, not urgent): with the
    /// head's arrival, its `R` floor.
    active_since_us: u64,
    /// The virtual time when the class last became active: its `P` floor.
    proportion_floor: f64,
    /// Requests served, by [`Phase`] (urgent, reservation, weight).
    served: [u64; 3],
}

impl<T> Class<T> {
    fn new(spec: ClassSpec) -> Class<T> {
        Class {
            spec,
            urgent: false,
            queue: VecDeque::new(),
            prev: Tags { reservation_us: TAG_BEFORE_ANY_US, limit_us: TAG_BEFORE_ANY_US, proportion: 0.0 },
            head: None,
            head_ready: false,
            head_since_us: 0,
            served: [0; 3],
            active_since_us: 0,
            proportion_floor: 0.0,
        }
    }

    /// The head's tags, from `prev`, the spec and the floors.
    fn head_tags(&self) -> Tags {
        let head = self.queue.front().expect("only a class with queued work has a head to tag");
        let spec = &self.spec;
        let prev = &self.prev;
        let reservation_us = if spec.reservation > 0.0 {
            let floor_us = head.arrival_us.max(self.active_since_us) as f64;
            (prev.reservation_us + head.cost * MICROS_PER_SECOND / spec.reservation).max(floor_us)
        } else {
            prev.reservation_us
        };
        let limit_us = if spec.limit > 0.0 {
            (prev.limit_us + head.cost * MICROS_PER_SECOND / spec.limit).max(self.head_since_us as f64)
        } else {
            // No limit: ready from when it became head.
            self.head_since_us as f64
        };
        let proportion = prev.proportion.max(self.proportion_floor) + head.cost / spec.weight;
        let tags = Tags { reservation_us, limit_us, proportion };
        assert!(tags.is_finite(), "tags {tags:?} from {prev:?} and cost {}", head.cost);
        // Monotone per class, for the tags its spec uses.
        debug_assert!(tags.reservation_us >= prev.reservation_us);
        debug_assert!(spec.limit == 0.0 || tags.limit_us >= prev.limit_us);
        debug_assert!(tags.proportion >= prev.proportion);
        tags
    }
}

/// The scheduler. `K` names a class; `T` is the queued work.
#[derive(Debug)]
pub struct Scheduler<K, T> {
    default_spec: ClassSpec,
    classes: BTreeMap<K, Class<T>>,
    /// Urgent classes with queued work, by their head's arrival.
    urgent_by_arrival: BTreeSet<(u64, K)>,
    /// Heads waiting for their limit (`L > now`), by `L`.
    limited_by_limit_tag: BTreeSet<(Tag, K)>,
    /// Ready heads (`L <= now`) of classes with a reservation, by `R`.
    ready_by_reservation_tag: BTreeSet<(Tag, K)>,
    /// Ready heads, by `P`.
    ready_by_proportion_tag: BTreeSet<(Tag, K)>,
    queued_total: usize,
    arrivals_total: u64,
    /// The latest time seen.
    now_us: u64,
    /// The largest `P` served in the weight phase: the virtual time when no
    /// head is ready.
    proportion_served_max: f64,
}

impl<K: Ord + Clone + Debug, T> Scheduler<K, T> {
    /// A scheduler giving classes not configured with
    /// [`Scheduler::set_class`] `default_spec`.
    pub fn new(default_spec: ClassSpec) -> Scheduler<K, T> {
        Scheduler {
            default_spec,
            classes: BTreeMap::new(),
            urgent_by_arrival: BTreeSet::new(),
            limited_by_limit_tag: BTreeSet::new(),
            ready_by_reservation_tag: BTreeSet::new(),
            ready_by_proportion_tag: BTreeSet::new(),
            queued_total: 0,
            arrivals_total: 0,
            now_us: 0,
            proportion_served_max: 0.0,
        }
    }

    pub fn default_spec(&self) -> ClassSpec {
        self.default_spec
    }

    /// Requests queued over all classes.
    pub fn len(&self) -> usize {
        self.queued_total
    }

    pub fn is_empty(&self) -> bool {
        self.queued_total == 0
    }

    /// Requests queued for `key`.
    pub fn queued(&self, key: &K) -> usize {
        self.classes.get(key).map_or(0, |class| class.queue.len())
    }

    /// Classes known: configured, urgent, or pushed to and not removed.
    /// Each keeps its tags until [`Scheduler::remove_class`], so the caller
    /// removes the classes it is done with (a closed image, a gone client).
    pub fn classes(&self) -> usize {
        self.classes.len()
    }

    /// The spec `key` is scheduled by, if it is known.
    pub fn class_spec(&self, key: &K) -> Option<ClassSpec> {
        self.classes.get(key).map(|class| class.spec)
    }

    pub fn is_urgent(&self, key: &K) -> bool {
        self.classes.get(key).is_some_and(|class| class.urgent)
    }

    /// Configures `key`, live: its next request (the queued head included)
    /// is tagged by the new spec; the tags of requests already served stand.
    pub fn set_class(&mut self, key: K, spec: ClassSpec, now_us: u64) {
        self.advance_to(now_us);
        // Out of the indexes under the old spec, back in under the new.
        if self.classes.contains_key(&key) {
            self.unindex_head(&key);
        }
        self.classes.entry(key.clone()).or_insert_with(|| Class::new(spec)).spec = spec;
        self.index_head(&key);
    }

    /// Raises `key` above every other class (a PG inactive or below
    /// min_size has its recovery go first), or lowers it back. Urgent
    /// classes are served FIFO by arrival, limits ignored, tags untouched.
    pub fn set_urgent(&mut self, key: K, urgent: bool, now_us: u64) {
        let now_us = self.advance_to(now_us);
        if !self.classes.contains_key(&key) {
            self.classes.insert(key.clone(), Class::new(self.default_spec));
        }
        if self.class_mut(&key).urgent == urgent {
            return;
        }
        self.unindex_head(&key);
        let virtual_time = self.virtual_time();
        let class = self.class_mut(&key);
        class.urgent = urgent;
        if !urgent {
            // Tagged as if it had just become active.
            class.active_since_us = now_us;
            class.head_since_us = now_us;
            class.proportion_floor = virtual_time;
        }
        self.index_head(&key);
    }

    /// Queues `item` for `key` (a class not known gets the default spec).
    ///
    /// Panics unless `0 < cost <= COST_MAX`: the cost is the caller's own
    /// computation, not outside input.
    pub fn push(&mut self, key: K, item: T, cost: f64, now_us: u64) {
        assert!(cost > 0.0 && cost <= COST_MAX, "a request costing {cost}");
        let now_us = self.advance_to(now_us);
        let virtual_time = self.virtual_time();
        let arrival_seq = self.arrivals_total;
        self.arrivals_total += 1;
        let default_spec = self.default_spec;
        let class = self.classes.entry(key.clone()).or_insert_with(|| Class::new(default_spec));
        let activates = class.queue.is_empty();
        class.queue.push_back(Queued { item, cost, arrival_us: now_us, arrival_seq });
        self.queued_total += 1;
        if activates {
            class.active_since_us = now_us;
            class.head_since_us = now_us;
            class.proportion_floor = virtual_time;
            self.index_head(&key);
        }
    }

    /// The next request to serve at `now_us`, or how long to wait.
    pub fn pop(&mut self, now_us: u64) -> Pop<K, T> {
        let now_us = self.advance_to(now_us);
        if let Some((key, phase)) = self.choose(now_us) {
            return self.serve(key, phase);
        }
        if self.queued_total == 0 {
            return Pop::Empty;
        }
        let (limit, key) =
            self.limited_by_limit_tag.first().expect("work is queued, none urgent or ready: a head awaits its limit");
        assert!(limit.0 > now_us as f64, "{key:?} is held with L {} at {now_us}", limit.0);
        // Saturates for a tag beyond u64 (a tiny limit and a huge cost).
        let until_us = limit.0.ceil() as u64;
        assert!(until_us > now_us);
        Pop::Wait(until_us)
    }

    /// The next request if it is owed now (its class is urgent, or its
    /// reservation is due): what [`Scheduler::pop`] would serve in
    /// [`Phase::Urgent`] or [`Phase::Reservation`]. A request the weight
    /// phase would serve stays queued, its tags untouched. So a caller
    /// can run owed work the moment it arrives and leave the rest for a
    /// batch.
    pub fn pop_owed(&mut self, now_us: u64) -> Option<(K, T, Phase)> {
        let now_us = self.advance_to(now_us);
        match self.choose(now_us)? {
            (key, phase @ (Phase::Urgent | Phase::Reservation)) => match self.serve(key, phase) {
                Pop::Ready { key, item, phase } => Some((key, item, phase)),
                _ => unreachable!("a chosen class serves its head"),
            },
            (_, Phase::Weight) => None,
        }
    }

    /// The class [`Scheduler::pop`] serves at `now_us`, and in which phase.
    fn choose(&self, now_us: u64) -> Option<(K, Phase)> {
        if let Some((_, key)) = self.urgent_by_arrival.first() {
            return Some((key.clone(), Phase::Urgent));
        }
        if let Some((_, key)) =
            self.ready_by_reservation_tag.first().filter(|(reservation, _)| reservation.0 <= now_us as f64)
        {
            return Some((key.clone(), Phase::Reservation));
        }
        self.ready_by_proportion_tag.first().map(|(_, key)| (key.clone(), Phase::Weight))
    }

    /// Each known class's spec, queue and service so far, by key: what an
    /// operator's view of the queues shows.
    pub fn stats(&self) -> impl Iterator<Item = (&K, ClassStats)> + '_ {
        self.classes.iter().map(|(key, class)| {
            let [urgent, reservation, weight] = class.served;
            let stats = ClassStats {
                spec: class.spec,
                urgent: class.urgent,
                queued: class.queue.len(),
                served_urgent: urgent,
                served_reservation: reservation,
                served_weight: weight,
            };
            (key, stats)
        })
    }

    /// Forgets `key` (its tags and spec), handing back its queued work in
    /// arrival order.
    pub fn remove_class(&mut self, key: &K) -> Vec<T> {
        if !self.classes.contains_key(key) {
            return Vec::new();
        }
        self.unindex_head(key);
        let class = self.classes.remove(key).expect("checked above");
        assert!(self.queued_total >= class.queue.len());
        self.queued_total -= class.queue.len();
        class.queue.into_iter().map(|queued| queued.item).collect()
    }

    /// Checks every invariant, panicking on the first broken: for tests
    /// and the simulator. O(classes × log classes).
    pub fn check_invariants(&self) {
        let (mut queued, mut urgent, mut limited, mut ready, mut ready_reserved) = (0, 0, 0, 0, 0);
        for (key, class) in &self.classes {
            queued += class.queue.len();
            if let (Some(front), Some(back)) = (class.queue.front(), class.queue.back()) {
                assert!(front.arrival_seq <= back.arrival_seq && front.arrival_us <= back.arrival_us);
            }
            assert!(class.prev.is_finite(), "{key:?}: prev tags {:?}", class.prev);
            let Some(front) = class.queue.front() else {
                assert!(class.head.is_none() && !class.head_ready, "{key:?}: an empty class is tagged");
                continue;
            };
            assert!(front.arrival_us <= self.now_us && class.head_since_us <= self.now_us);
            if class.urgent {
                assert!(class.head.is_none(), "{key:?}: an urgent class is tagged");
                assert!(self.urgent_by_arrival.contains(&(front.arrival_seq, key.clone())), "{key:?}: not indexed");
                urgent += 1;
                continue;
            }
            let tags = class.head.unwrap_or_else(|| panic!("{key:?}: an active class has no head tags"));
            // Pair assertion: the tags indexed are the tags its state gives.
            assert_eq!(tags, class.head_tags(), "{key:?}: head tags are stale");
            if class.head_ready {
                assert!(tags.limit_us <= self.now_us as f64, "{key:?}: ready with L {}", tags.limit_us);
                assert!(self.ready_by_proportion_tag.contains(&(Tag(tags.proportion), key.clone())));
                ready += 1;
                if class.spec.reservation > 0.0 {
                    assert!(self.ready_by_reservation_tag.contains(&(Tag(tags.reservation_us), key.clone())));
                    ready_reserved += 1;
                }
            } else {
                assert!(tags.limit_us > self.now_us as f64, "{key:?}: not ready with L {}", tags.limit_us);
                assert!(self.limited_by_limit_tag.contains(&(Tag(tags.limit_us), key.clone())));
                limited += 1;
            }
        }
        assert_eq!(queued, self.queued_total, "queued count");
        assert_eq!(urgent, self.urgent_by_arrival.len(), "urgent index");
        assert_eq!(limited, self.limited_by_limit_tag.len(), "limited index");
        assert_eq!(ready, self.ready_by_proportion_tag.len(), "proportion index");
        assert_eq!(ready_reserved, self.ready_by_reservation_tag.len(), "reservation index");
    }

    fn class_mut(&mut self, key: &K) -> &mut Class<T> {
        self.classes.get_mut(key).unwrap_or_else(|| panic!("{key:?} is not a class"))
    }

    /// Moves time to `now_us` (never back) and moves the heads whose limit
    /// has come to the ready indexes. Returns the time.
    fn advance_to(&mut self, now_us: u64) -> u64 {
        self.now_us = self.now_us.max(now_us);
        let now = self.now_us as f64;
        while self.limited_by_limit_tag.first().is_some_and(|(limit, _)| limit.0 <= now) {
            let (_, key) = self.limited_by_limit_tag.pop_first().expect("just seen");
            let class = self.classes.get_mut(&key).unwrap_or_else(|| panic!("{key:?} indexed but not a class"));
            let tags = class.head.unwrap_or_else(|| panic!("{key:?} indexed without a head"));
            assert!(!class.head_ready && !class.urgent);
            class.head_ready = true;
            if class.spec.reservation > 0.0 {
                self.ready_by_reservation_tag.insert((Tag(tags.reservation_us), key.clone()));
            }
            self.ready_by_proportion_tag.insert((Tag(tags.proportion), key));
        }
        self.now_us
    }

    /// Where a class becoming active starts its `P` tags: the least `P`
    /// of the heads that may be served, else the largest served.
    fn virtual_time(&self) -> f64 {
        self.ready_by_proportion_tag.first().map_or(self.proportion_served_max, |(proportion, _)| proportion.0)
    }

    /// Tags `key`'s head, if it has one, and indexes it.
    fn index_head(&mut self, key: &K) {
        let now = self.now_us as f64;
        let class = self.classes.get_mut(key).unwrap_or_else(|| panic!("{key:?} is not a class"));
        assert!(class.head.is_none() && !class.head_ready, "{key:?} is indexed twice");
        let Some(front) = class.queue.front() else { return };
        if class.urgent {
            let inserted = self.urgent_by_arrival.insert((front.arrival_seq, key.clone()));
            assert!(inserted);
            return;
        }
        let tags = class.head_tags();
        class.head = Some(tags);
        let inserted = if tags.limit_us <= now {
            class.head_ready = true;
            if class.spec.reservation > 0.0 {
                self.ready_by_reservation_tag.insert((Tag(tags.reservation_us), key.clone()));
            }
            self.ready_by_proportion_tag.insert((Tag(tags.proportion), key.clone()))
        } else {
            self.limited_by_limit_tag.insert((Tag(tags.limit_us), key.clone()))
        };
        assert!(inserted, "{key:?} is indexed twice");
    }

    /// Takes `key`'s head out of the indexes, returning its tags (none if
    /// it is urgent or has nothing queued).
    fn unindex_head(&mut self, key: &K) -> Option<Tags> {
        let class = self.classes.get_mut(key).unwrap_or_else(|| panic!("{key:?} is not a class"));
        if class.urgent {
            assert!(class.head.is_none());
            if let Some(front) = class.queue.front() {
                let removed = self.urgent_by_arrival.remove(&(front.arrival_seq, key.clone()));
                assert!(removed, "{key:?} urgent but not indexed");
            }
            return None;
        }
        let Some(tags) = class.head.take() else {
            assert!(class.queue.is_empty() && !class.head_ready, "{key:?} queued but not tagged");
            return None;
        };
        let removed = if class.head_ready {
            if class.spec.reservation > 0.0 {
                let removed = self.ready_by_reservation_tag.remove(&(Tag(tags.reservation_us), key.clone()));
                assert!(removed, "{key:?} ready but not in the reservation index");
            }
            self.ready_by_proportion_tag.remove(&(Tag(tags.proportion), key.clone()))
        } else {
            self.limited_by_limit_tag.remove(&(Tag(tags.limit_us), key.clone()))
        };
        assert!(removed, "{key:?} tagged but not indexed");
        class.head_ready = false;
        Some(tags)
    }

    /// Serves `key`'s head in `phase` and tags the next.
    fn serve(&mut self, key: K, phase: Phase) -> Pop<K, T> {
        let now_us = self.now_us;
        let tags = self.unindex_head(&key);
        let class = self.class_mut(&key);
        let queued = class.queue.pop_front().expect("an indexed class has queued work");
        match (phase, tags) {
            (Phase::Urgent, None) => assert!(class.urgent),
            (Phase::Reservation | Phase::Weight, Some(tags)) => {
                assert!(tags.limit_us <= now_us as f64, "{key:?} served before its limit: {tags:?} at {now_us}");
                class.prev = tags;
                if phase == Phase::Reservation {
                    assert!(class.spec.reservation > 0.0 && tags.reservation_us <= now_us as f64);
                } else if class.spec.reservation > 0.0 {
                    // mClock's adjustment: weight-phase service does not
                    // move the reservation schedule on.
                    class.prev.reservation_us -= queued.cost * MICROS_PER_SECOND / class.spec.reservation;
                }
                if phase == Phase::Weight {
                    self.proportion_served_max = self.proportion_served_max.max(tags.proportion);
                }
            }
            (phase, tags) => panic!("{key:?} served in {phase:?} with tags {tags:?}"),
        }
        let class = self.class_mut(&key);
        class.head_since_us = now_us;
        let counter = match phase {
            Phase::Urgent => 0,
            Phase::Reservation => 1,
            Phase::Weight => 2,
        };
        class.served[counter] += 1;
        assert!(self.queued_total > 0);
        self.queued_total -= 1;
        self.index_head(&key);
        Pop::Ready { key, item: queued.item, phase }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(reservation: f64, weight: f64, limit: f64) -> ClassSpec {
        ClassSpec::new(reservation, weight, limit).expect("a valid spec")
    }

    /// What a server took: when, which class, the item, in which phase.
    type Served<K, T> = Vec<(u64, K, T, Phase)>;

    #[test]
    fn stats_count_each_classs_service_by_phase_and_its_queue() {
        let mut scheduler: Scheduler<&str, u32> = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("reserved", spec(100.0, 1.0, 0.0), 0);
        scheduler.set_urgent("urgent", true, 0);
        for i in 0..50 {
            scheduler.push("reserved", i, 1.0, 0);
            scheduler.push("best effort", i, 1.0, 0);
        }
        scheduler.push("urgent", 0, 1.0, 0);
        let served = serve_until(&mut scheduler, 0, 200_000, 2_000);
        let stats: BTreeMap<&str, ClassStats> = scheduler.stats().map(|(key, stats)| (*key, stats)).collect();
        for (key, stats) in &stats {
            let count = |phase| served.iter().filter(|(_, k, _, p)| k == key && *p == phase).count() as u64;
            assert_eq!(stats.served_urgent, count(Phase::Urgent), "{key}");
            assert_eq!(stats.served_reservation, count(Phase::Reservation), "{key}");
            assert_eq!(stats.served_weight, count(Phase::Weight), "{key}");
            assert_eq!(stats.queued, scheduler.queued(key), "{key}");
        }
        assert_eq!(stats["urgent"].served_urgent, 1);
        assert!(stats["urgent"].urgent);
        assert!(stats["reserved"].served_reservation >= 19, "{:?}", stats["reserved"]);
        assert!(stats["best effort"].served_weight > 0 && stats["best effort"].served_reservation == 0);
        assert_eq!(stats["reserved"].spec, spec(100.0, 1.0, 0.0));
        assert!(stats.values().map(|s| s.queued).sum::<usize>() > 0, "the server was slower than the arrivals");
    }

    /// A server taking `service_us` for each request, from `start_us` until
    /// `end_us` or nothing is queued, checking invariants after each pop.
    fn serve_until<K: Ord + Clone + Debug, T>(
        scheduler: &mut Scheduler<K, T>,
        start_us: u64,
        end_us: u64,
        service_us: u64,
    ) -> Served<K, T> {
        let (mut now, mut served) = (start_us, Vec::new());
        while now < end_us {
            match scheduler.pop(now) {
                Pop::Ready { key, item, phase } => {
                    served.push((now, key, item, phase));
                    now += service_us;
                }
                Pop::Wait(until) => {
                    assert!(until > now, "told at {now} to wait until {until}");
                    now = until;
                }
                Pop::Empty => break,
            }
            scheduler.check_invariants();
        }
        served
    }

    fn count<K: PartialEq, T>(served: &Served<K, T>, key: K, phase: Option<Phase>) -> usize {
        served.iter().filter(|(_, k, _, p)| *k == key && phase.is_none_or(|phase| phase == *p)).count()
    }

    fn backlog(scheduler: &mut Scheduler<&'static str, u64>, key: &'static str, requests: u64, now_us: u64) {
        for item in 0..requests {
            scheduler.push(key, item, 1.0, now_us);
        }
    }

    #[test]
    fn only_owed_work_is_popped_early_and_the_rest_keeps_its_tags() {
        let mut scheduler: Scheduler<&str, u64> = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("reserved", spec(1000.0, 1.0, 0.0), 0);
        backlog(&mut scheduler, "noisy", 10, 0);
        assert_eq!(scheduler.pop_owed(0), None, "weight-phase work waits for the batch");
        assert_eq!(scheduler.len(), 10);
        scheduler.push("reserved", 7, 1.0, 0);
        assert_eq!(scheduler.pop_owed(0), Some(("reserved", 7, Phase::Reservation)));
        // Its next is not due before 1 ms (1,000 a second).
        scheduler.push("reserved", 8, 1.0, 0);
        assert_eq!(scheduler.pop_owed(500), None);
        assert_eq!(scheduler.pop_owed(1000), Some(("reserved", 8, Phase::Reservation)));
        scheduler.set_urgent("recovery", true, 1000);
        scheduler.push("recovery", 9, 1.0, 1000);
        assert_eq!(scheduler.pop_owed(1000), Some(("recovery", 9, Phase::Urgent)));
        scheduler.check_invariants();
        // The rest goes in the weight phase, in order, as if never asked.
        let served = serve_until(&mut scheduler, 1000, 10_000, 1);
        assert_eq!(served.iter().map(|s| s.2).collect::<Vec<_>>(), (0..10).collect::<Vec<_>>());
        assert!(served.iter().all(|s| s.3 == Phase::Weight));
    }

    #[test]
    fn specs_are_validated_with_clear_errors() {
        assert!(ClassSpec::new(0.0, 1.0, 0.0).is_ok(), "no reservation, no limit");
        assert!(ClassSpec::new(100.0, 0.5, 100.0).is_ok(), "a limit equal to the reservation");
        assert!(matches!(ClassSpec::new(f64::NAN, 1.0, 0.0), Err(SpecError::NotFinite { field: "reservation", .. })));
        assert!(matches!(ClassSpec::new(0.0, f64::INFINITY, 0.0), Err(SpecError::NotFinite { field: "weight", .. })));
        assert!(matches!(ClassSpec::new(-1.0, 1.0, 0.0), Err(SpecError::RateOutOfRange { field: "reservation", .. })));
        assert!(matches!(ClassSpec::new(0.0, 1.0, -5.0), Err(SpecError::RateOutOfRange { field: "limit", .. })));
        assert!(matches!(ClassSpec::new(0.0, 1.0, 1e-9), Err(SpecError::RateOutOfRange { field: "limit", .. })));
        assert!(matches!(ClassSpec::new(0.0, 0.0, 0.0), Err(SpecError::WeightOutOfRange { .. })));
        assert!(matches!(ClassSpec::new(0.0, -1.0, 0.0), Err(SpecError::WeightOutOfRange { .. })));
        let below = ClassSpec::new(200.0, 1.0, 100.0).unwrap_err();
        assert_eq!(below, SpecError::LimitBelowReservation { reservation: 200.0, limit: 100.0 });
        assert!(below.to_string().contains("below reservation"), "{below}");
    }

    #[test]
    fn the_reservation_is_met_first() {
        // A server of 1,000 units/s. By weight alone A would get 1%.
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("a", spec(300.0, 1.0, 0.0), 0);
        scheduler.set_class("b", spec(0.0, 100.0, 0.0), 0);
        backlog(&mut scheduler, "a", 20_000, 0);
        backlog(&mut scheduler, "b", 20_000, 0);
        let served = serve_until(&mut scheduler, 0, 10_000_000, 1_000);
        assert_eq!(served.len(), 10_000);
        let reserved = count(&served, "a", Some(Phase::Reservation));
        assert!((2_999..=3_001).contains(&reserved), "A got {reserved} by reservation of 3,000 owed");
        assert!(count(&served, "a", None) <= 3_001, "and its weight share is below its reservation");
        assert_eq!(count(&served, "b", Some(Phase::Reservation)), 0);
        // Its reservation was met as it fell due: 300 in every second.
        for second in 0..10u64 {
            let in_second = served.iter().filter(|(at, key, ..)| *key == "a" && at / 1_000_000 == second).count();
            assert!((299..=301).contains(&in_second), "second {second}: {in_second}");
        }
    }

    #[test]
    fn weights_share_what_reservations_leave_proportionally() {
        // A's weight share of the whole (1/5) is below its reservation
        // (1/2), so it gets its reservation; B and C split the rest 1:3.
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("a", spec(500.0, 1.0, 0.0), 0);
        scheduler.set_class("c", spec(0.0, 3.0, 0.0), 0);
        for key in ["a", "b", "c"] {
            backlog(&mut scheduler, key, 20_000, 0);
        }
        let served = serve_until(&mut scheduler, 0, 10_000_000, 1_000);
        let (a, b, c) = (count(&served, "a", None), count(&served, "b", None), count(&served, "c", None));
        assert!((4_999..=5_001).contains(&a), "A got {a}");
        assert!(b.abs_diff(1_250) <= 2 && c.abs_diff(3_750) <= 2, "B got {b} and C {c} of 5,000 split 1:3");
        assert_eq!(count(&served, "a", Some(Phase::Weight)), 0, "A's P ran ahead on its reservation");
    }

    #[test]
    fn a_limit_holds_and_wait_says_until_when_while_others_use_the_server() {
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("a", spec(0.0, 100.0, 100.0), 0);
        backlog(&mut scheduler, "a", 1_000, 0);
        assert_eq!(scheduler.pop(0), Pop::Ready { key: "a", item: 0, phase: Phase::Weight });
        assert_eq!(scheduler.pop(10), Pop::Wait(10_000), "100/s: one every 10 ms");
        assert_eq!(scheduler.pop(10_000), Pop::Ready { key: "a", item: 1, phase: Phase::Weight });
        // With an unlimited class beside it, A still gets 100/s despite its
        // weight, and B takes the rest: the server never idles.
        backlog(&mut scheduler, "b", 20_000, 10_000);
        let served = serve_until(&mut scheduler, 10_010, 1_010_010, 100);
        assert_eq!(served.len(), 10_000, "work-conserving");
        let a = count(&served, "a", None);
        assert!((99..=101).contains(&a), "A got {a} in a second at 100/s");
    }

    #[test]
    fn an_idle_class_hoards_no_credit() {
        // Server of 1,000 units/s; B alone for 10 s, then A returns.
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("a", spec(100.0, 1.0, 0.0), 0);
        scheduler.push("a", 0, 1.0, 0);
        backlog(&mut scheduler, "b", 30_000, 0);
        let before = serve_until(&mut scheduler, 0, 10_000_000, 1_000);
        assert_eq!(count(&before, "a", None), 1);
        backlog(&mut scheduler, "a", 5_000, 10_000_000);
        let after = serve_until(&mut scheduler, 10_000_000, 11_000_000, 1_000);
        // Not 10 s of missed reservation at once: 100 in its first second.
        let reserved = count(&after, "a", Some(Phase::Reservation));
        assert!((99..=101).contains(&reserved), "A got {reserved} by reservation in a second");
        // And no head start in the weight phase: B's P tags ran 10 s ahead
        // of a real-time floor, A starts beside B and they split evenly.
        let a = count(&after, "a", None);
        assert!(a.abs_diff(500) <= 2, "A got {a} of 1,000 at equal weights");
        // Nor penalised: A's first request went at once.
        assert_eq!(after[0].1, "a");
    }

    #[test]
    fn weight_phase_service_does_not_use_up_the_reservation() {
        // A gets most of the server by weight for 5 s; then B's weight
        // rises and A's share falls to its reservation. mClock's adjustment
        // keeps A's R tags at the present, so its reservation goes on at
        // once: without it they would be 45 s ahead.
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("a", spec(100.0, 10.0, 0.0), 0);
        backlog(&mut scheduler, "a", 20_000, 0);
        backlog(&mut scheduler, "b", 20_000, 0);
        let first = serve_until(&mut scheduler, 0, 5_000_000, 1_000);
        let a = count(&first, "a", None);
        assert!(a.abs_diff(5_000 * 10 / 11) <= 2, "A got {a} of 5,000 at weights 10:1");
        scheduler.set_class("b", spec(0.0, 10_000.0, 0.0), 5_000_000);
        let second = serve_until(&mut scheduler, 5_000_000, 5_500_000, 1_000);
        let a = count(&second, "a", None);
        assert!((49..=52).contains(&a), "A got {a} in 0.5 s at a reservation of 100/s");
    }

    #[test]
    fn urgent_classes_go_first_fifo_by_arrival_ignoring_limits() {
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("recovery-x", spec(0.0, 1.0, 10.0), 0);
        scheduler.set_class("recovery-y", spec(0.0, 1.0, 10.0), 0);
        for (key, item) in [("recovery-x", 1), ("client", 1), ("recovery-y", 1), ("recovery-x", 2), ("recovery-y", 2)] {
            scheduler.push(key, item, 1.0, 0);
        }
        scheduler.push("client", 2, 1.0, 0);
        scheduler.set_urgent("recovery-x", true, 0);
        scheduler.set_urgent("recovery-y", true, 0);
        assert!(scheduler.is_urgent(&"recovery-x") && !scheduler.is_urgent(&"client"));
        let order: Vec<_> = (0..6)
            .map(|_| match scheduler.pop(0) {
                Pop::Ready { key, item, phase } => (key, item, phase),
                other => panic!("{other:?}"),
            })
            .collect();
        let urgent = Phase::Urgent;
        assert_eq!(
            order,
            [
                ("recovery-x", 1, urgent),
                ("recovery-y", 1, urgent),
                ("recovery-x", 2, urgent),
                ("recovery-y", 2, urgent),
                ("client", 1, Phase::Weight),
                ("client", 2, Phase::Weight),
            ],
            "urgent by arrival, two of each at one instant despite a limit of 10/s"
        );
        assert_eq!(scheduler.pop(0), Pop::Empty);
        // Lowered again, X keeps its limit, with no debt from the urgent burst.
        scheduler.push("recovery-x", 3, 1.0, 0);
        scheduler.push("recovery-x", 4, 1.0, 0);
        scheduler.set_urgent("recovery-x", false, 0);
        scheduler.check_invariants();
        assert_eq!(scheduler.pop(0), Pop::Ready { key: "recovery-x", item: 3, phase: Phase::Weight });
        assert_eq!(scheduler.pop(0), Pop::Wait(100_000));
        // Raised while held by its limit, it goes at once.
        scheduler.set_urgent("recovery-x", true, 1);
        assert_eq!(scheduler.pop(1), Pop::Ready { key: "recovery-x", item: 4, phase: Phase::Urgent });
        assert!(scheduler.is_empty());
    }

    #[test]
    fn a_live_change_of_a_spec_acts_on_the_next_request() {
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("a", spec(0.0, 1.0, 10.0), 0);
        backlog(&mut scheduler, "a", 100, 0);
        assert!(matches!(scheduler.pop(0), Pop::Ready { item: 0, .. }));
        assert_eq!(scheduler.pop(1_000), Pop::Wait(100_000), "10/s");
        // Raised: the head, tagged at 10/s, is retagged at 1,000/s.
        scheduler.set_class("a", spec(0.0, 1.0, 1_000.0), 1_000);
        assert_eq!(scheduler.pop(1_000), Pop::Ready { key: "a", item: 1, phase: Phase::Weight });
        assert_eq!(scheduler.pop(1_000), Pop::Wait(2_000));
        // Lowered: 1/s from the last request served.
        scheduler.set_class("a", spec(0.0, 1.0, 1.0), 1_500);
        assert_eq!(scheduler.pop(2_000), Pop::Wait(1_001_000));
        // Removed: unlimited at once.
        scheduler.set_class("a", spec(0.0, 1.0, 0.0), 3_000);
        assert!(matches!(scheduler.pop(3_000), Pop::Ready { item: 2, .. }));
        assert!(matches!(scheduler.pop(3_000), Pop::Ready { item: 3, .. }));
        assert_eq!(scheduler.class_spec(&"a"), Some(spec(0.0, 1.0, 0.0)));
        assert_eq!(scheduler.queued(&"a"), 96);
    }

    #[test]
    fn remove_class_hands_back_its_queue_in_order() {
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 0.0));
        scheduler.set_class("limited", spec(0.0, 1.0, 1.0), 0);
        for item in 1..=3 {
            scheduler.push("limited", item * 10, 1.0, 0);
            scheduler.push("a", item, 1.0, 0);
        }
        scheduler.push("b", 7, 2.0, 0);
        scheduler.set_urgent("u", true, 0);
        scheduler.push("u", 100, 1.0, 0);
        assert!(matches!(scheduler.pop(0), Pop::Ready { key: "u", .. }));
        assert!(matches!(scheduler.pop(0), Pop::Ready { key: "limited", item: 10, .. }));
        assert_eq!((scheduler.len(), scheduler.queued(&"a"), scheduler.queued(&"limited")), (6, 3, 2));
        assert_eq!(scheduler.remove_class(&"a"), vec![1, 2, 3]);
        assert_eq!(scheduler.remove_class(&"limited"), vec![20, 30], "a class held by its limit");
        scheduler.push("u", 101, 1.0, 0);
        assert_eq!(scheduler.remove_class(&"u"), vec![101], "an urgent class");
        assert_eq!(scheduler.remove_class(&"nobody"), Vec::<u64>::new());
        scheduler.check_invariants();
        assert_eq!((scheduler.len(), scheduler.classes()), (1, 1));
        assert_eq!(scheduler.pop(0), Pop::Ready { key: "b", item: 7, phase: Phase::Weight });
        assert_eq!(scheduler.pop(0), Pop::Empty);
        // A removed class comes back with the default spec and no tags.
        scheduler.push("limited", 40, 1.0, 0);
        assert_eq!(scheduler.class_spec(&"limited"), Some(spec(0.0, 1.0, 0.0)));
        assert!(matches!(scheduler.pop(0), Pop::Ready { item: 40, .. }));
    }

    #[test]
    fn time_never_goes_back() {
        let mut scheduler = Scheduler::new(spec(0.0, 1.0, 10.0));
        scheduler.push("a", 0, 1.0, 500_000);
        scheduler.push("a", 1, 1.0, 0);
        assert!(matches!(scheduler.pop(0), Pop::Ready { item: 0, .. }), "taken at 500 ms");
        assert_eq!(scheduler.pop(0), Pop::Wait(600_000));
    }

    // The model test. A server takes `cost × UNIT_US` per request (10,000
    // units a second) for `RUN_US`, from 2 to 6 classes with random specs
    // (reservations summing below 80% of the server, some limits) and
    // random arrivals, against a model that keeps each class's queue, what
    // it was served and when, and its limit tags by the rule in the header.

    const UNIT_US: u64 = 100;
    const CAPACITY_PER_SECOND: f64 = MICROS_PER_SECOND / UNIT_US as f64;
    const RUN_US: u64 = 2_500_000;

    #[derive(Clone, Copy, Debug)]
    enum Arrivals {
        /// More work at 0 than the run can serve: always queued.
        Backlogged,
        /// Exponential gaps at a mean rate (requests a second).
        Poisson { rate_per_second: f64 },
        /// Bursts of `size` requests, `gap_us` apart.
        Bursty { size: u64, gap_us: u64 },
    }

    #[derive(Clone, Debug)]
    struct Plan {
        spec: ClassSpec,
        arrivals: Arrivals,
        /// Each request costs from 1 to this, at random.
        cost_max: u64,
    }

    fn arrivals() -> impl Strategy<Value = Arrivals> {
        prop_oneof![
            Just(Arrivals::Backlogged),
            (10.0f64..6_000.0).prop_map(|rate_per_second| Arrivals::Poisson { rate_per_second }),
            (1u64..200, 1_000u64..400_000).prop_map(|(size, gap_us)| Arrivals::Bursty { size, gap_us }),
        ]
    }

    /// Plans with reservations summing to `reserved_fraction` of the server.
    fn plans() -> impl Strategy<Value = Vec<Plan>> {
        let class = (
            prop::bool::weighted(0.5),
            0.05f64..1.0,
            0.1f64..10.0,
            prop_oneof![Just(None), (0.02f64..0.6).prop_map(Some)],
            arrivals(),
            1u64..=3,
        );
        (prop::collection::vec(class, 2..=6), 0.05f64..0.8).prop_map(|(classes, reserved_fraction)| {
            let shares: f64 = classes.iter().filter(|c| c.0).map(|c| c.1).sum();
            classes
                .into_iter()
                .map(|(reserves, share, weight, limit_above, arrivals, cost_max)| {
                    let reservation =
                        if reserves { CAPACITY_PER_SECOND * reserved_fraction * share / shares } else { 0.0 };
                    let limit = limit_above.map_or(0.0, |above| reservation + above * CAPACITY_PER_SECOND);
                    Plan { spec: spec(reservation, weight, limit), arrivals, cost_max }
                })
                .collect()
        })
    }

    /// SplitMix64: arrivals from one seed, so a case shrinks and replays.
    struct Random(u64);

    impl Random {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }

        /// In [0, 1).
        fn unit(&mut self) -> f64 {
            (self.next() >> 11) as f64 / (1u64 << 53) as f64
        }
    }

    /// (time, class, cost), by time.
    fn arrival_times(plans: &[Plan], seed: u64) -> Vec<(u64, usize, u64)> {
        let mut random = Random(seed);
        let mut out = Vec::new();
        for (class, plan) in plans.iter().enumerate() {
            let cost = |random: &mut Random| 1 + random.next() % plan.cost_max;
            match plan.arrivals {
                Arrivals::Backlogged => {
                    let enough = RUN_US / UNIT_US + 1;
                    out.extend((0..enough).map(|_| (0, class, cost(&mut random))));
                }
                Arrivals::Poisson { rate_per_second } => {
                    let mut at = 0.0;
                    loop {
                        at += -(1.0 - random.unit()).ln() / rate_per_second * MICROS_PER_SECOND;
                        if at >= RUN_US as f64 {
                            break;
                        }
                        out.push((at as u64, class, cost(&mut random)));
                    }
                }
                Arrivals::Bursty { size, gap_us } => {
                    let mut at = random.next() % gap_us;
                    while at < RUN_US {
                        out.extend((0..size).map(|_| (at, class, cost(&mut random))));
                        at += gap_us;
                    }
                }
            }
        }
        out.sort_by_key(|&(at, class, _)| (at, class));
        out
    }

    #[derive(Default)]
    struct ModelClass {
        /// (arrival, cost) of each request queued.
        queue: VecDeque<(u64, u64)>,
        /// (time, cost) of each request served.
        served: Vec<(u64, u64)>,
        served_last_us: u64,
        /// The limit tag of the request served last.
        limit_prev_us: f64,
    }

    impl ModelClass {
        /// The head's limit tag: `max(L_prev + c/l, when it became head)`.
        fn head_limit_us(&self, limit: f64) -> f64 {
            let (arrival_us, cost) = *self.queue.front().expect("queued");
            let head_since_us = arrival_us.max(self.served_last_us) as f64;
            (self.limit_prev_us + cost as f64 * MICROS_PER_SECOND / limit).max(head_since_us)
        }
    }

    /// The most `served` (time, cost) exceeds `rate × span` by in any
    /// window from one service to another: O(n), by prefix sums.
    fn excess_over_rate(served: &[(u64, u64)], rate_per_second: f64) -> f64 {
        let (mut before, mut best, mut excess) = (0.0, f64::NEG_INFINITY, f64::NEG_INFINITY);
        for &(at_us, cost) in served {
            let at = at_us as f64 / MICROS_PER_SECOND;
            best = f64::max(best, rate_per_second * at - before);
            before += cost as f64;
            excess = excess.max(before - rate_per_second * at + best);
        }
        excess
    }

    fn run_against_model(plans: &[Plan], seed: u64) -> Result<(), TestCaseError> {
        let arrivals = arrival_times(plans, seed);
        let mut scheduler: Scheduler<usize, (u64, u64)> = Scheduler::new(spec(0.0, 1.0, 0.0));
        for (class, plan) in plans.iter().enumerate() {
            scheduler.set_class(class, plan.spec, 0);
        }
        let mut model: Vec<ModelClass> =
            plans.iter().map(|_| ModelClass { limit_prev_us: f64::NEG_INFINITY, ..Default::default() }).collect();
        let mut pushed = vec![0u64; plans.len()];
        let (mut now, mut next_arrival) = (0u64, 0usize);
        let mut must_serve = false;
        while now < RUN_US {
            let pushed_before = next_arrival;
            while let Some(&(at, class, cost)) = arrivals.get(next_arrival).filter(|a| a.0 <= now) {
                scheduler.push(class, (pushed[class], cost), cost as f64, at);
                pushed[class] += 1;
                model[class].queue.push_back((at, cost));
                next_arrival += 1;
            }
            let queued: usize = model.iter().map(|m| m.queue.len()).sum();
            prop_assert_eq!(scheduler.len(), queued);
            let next_arrival_us = arrivals.get(next_arrival).map_or(RUN_US, |a| a.0);
            let popped = scheduler.pop(now);
            prop_assert!(
                !must_serve || next_arrival > pushed_before || matches!(popped, Pop::Ready { .. }),
                "the time Wait gave came, and nothing was ready: {:?}",
                popped
            );
            must_serve = false;
            match popped {
                Pop::Ready { key, item: (number, cost), phase } => {
                    let class = &mut model[key];
                    prop_assert_eq!(number, class.served.len() as u64, "class {} out of FIFO order", key);
                    let limit = plans[key].spec.limit();
                    if limit > 0.0 {
                        let head_limit_us = class.head_limit_us(limit);
                        prop_assert!(head_limit_us <= now as f64 + 1e-6, "class {} above its limit", key);
                        class.limit_prev_us = head_limit_us;
                    }
                    prop_assert!(phase != Phase::Urgent);
                    class.queue.pop_front();
                    class.served.push((now, cost));
                    class.served_last_us = now;
                    now += cost * UNIT_US;
                }
                Pop::Empty => {
                    prop_assert_eq!(queued, 0, "Empty with work queued");
                    now = next_arrival_us;
                }
                Pop::Wait(until) => {
                    prop_assert!(until > now);
                    // Work-conserving: idle only while every class with work
                    // queued is limited and its head's L is still to come.
                    for (key, class) in model.iter().enumerate().filter(|(_, m)| !m.queue.is_empty()) {
                        let limit = plans[key].spec.limit();
                        prop_assert!(limit > 0.0, "idle at {} while unlimited class {} has work", now, key);
                        let head_limit_us = class.head_limit_us(limit);
                        prop_assert!(head_limit_us > now as f64 - 1e-6, "idle at {} while {} may go", now, key);
                        prop_assert!(until as f64 <= head_limit_us.ceil() + 1e-6, "waits past {}'s L", key);
                    }
                    must_serve = until <= next_arrival_us;
                    now = until.min(next_arrival_us);
                }
            }
            scheduler.check_invariants();
        }
        let cost_max = plans.iter().map(|p| p.cost_max).max().unwrap_or(1) as f64;
        let backlogged = |key: usize| matches!(plans[key].arrivals, Arrivals::Backlogged);
        for (key, class) in model.iter().enumerate() {
            let spec = plans[key].spec;
            // (a) In any window, at most the limit over it plus two
            // requests: one for the window's edge, one because a head's L
            // counts from when it became head, which may be before it left.
            if spec.limit() > 0.0 {
                let excess = excess_over_rate(&class.served, spec.limit());
                prop_assert!(excess <= 2.0 * cost_max + 1e-6, "class {} {} over its limit", key, excess);
            }
            // (b) A backlogged class gets its reservation over the run, less
            // a request for each class (their reservations may fall due at
            // once), the one in service and the one at the run's end.
            if backlogged(key) && spec.reservation() > 0.0 {
                let got: u64 = class.served.iter().map(|s| s.1).sum();
                let owed = spec.reservation() * RUN_US as f64 / MICROS_PER_SECOND;
                let slack = (plans.len() + 2) as f64 * cost_max;
                prop_assert!(got as f64 >= owed - slack, "class {} got {} of {} reserved", key, got, owed);
            }
        }
        // (d) Backlogged classes with no reservation and no limit share by
        // weight: the weight phase serves the least P, P is a class's
        // service over its weight, so two such classes' service over weight
        // differ by at most a request of each, plus the one of another
        // class that set the virtual time when they became active.
        let free: Vec<usize> = (0..plans.len())
            .filter(|&key| backlogged(key) && plans[key].spec.reservation() == 0.0 && plans[key].spec.limit() == 0.0)
            .collect();
        let weight_min = plans.iter().map(|p| p.spec.weight()).fold(f64::INFINITY, f64::min);
        for &i in &free {
            for &j in &free {
                let share =
                    |key: usize| model[key].served.iter().map(|s| s.1).sum::<u64>() as f64 / plans[key].spec.weight();
                let (weight_i, weight_j) = (plans[i].spec.weight(), plans[j].spec.weight());
                let tolerance = cost_max * (1.0 / weight_i + 1.0 / weight_j + 1.0 / weight_min) + 1e-6;
                prop_assert!(
                    (share(i) - share(j)).abs() <= tolerance,
                    "classes {} and {}: {} and {} by weight",
                    i,
                    j,
                    share(i),
                    share(j)
                );
            }
        }
        Ok(())
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

        /// Reservations met, limits never exceeded, work-conserving, and
        /// weights shared, over random specs and arrival patterns.
        #[test]
        fn the_scheduler_keeps_its_promises_against_a_model(plans in plans(), seed in any::<u64>()) {
            run_against_model(&plans, seed)?;
        }
    }
}
