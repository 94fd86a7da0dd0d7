//! Client QoS at the OSD (issue 31; docs/QOS.md), sans I/O: what a priority
//! thread's event loop asks before it runs a client operation.
//!
//! Two steps, in this order:
//!
//! 1. **The OSD's limiter** ([`OsdLimits`]): an image with limits (its own,
//!    or its pool's defaults) is held to them here too, with twice the
//!    gateway's burst allowance. Honest gateways, whose shares of a limit
//!    sum to it, never meet it; a client that ignores its limit gets no
//!    more than the limit at each OSD. One per OSD, behind a lock only the
//!    operations of limited images take, so two gateways landing on two
//!    threads share it.
//! 2. **The thread's mClock scheduler** ([`ClientQos`]): each image is a
//!    class with its reservation and weight (the map's settings); other
//!    objects go by client. A thread pops at most [`TURN_COST`] a turn, after
//!    reading every ready connection, so under contention what it runs
//!    first is the scheduler's choice, not the sockets' order.
//!
//! Nothing here runs while no pool and no image has a QoS setting
//! ([`enabled`]): then the event loop takes today's path, untouched.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Instant;

use duplex_map::ClusterMap;
use duplex_proto::osd::OpRequest;
use duplex_qos::{ClassSettings, ClassSpec, Direction, Limiter, Limits, Pop, Scheduler};

/// The cost a thread pops from its scheduler in one turn of its loop
/// before it reads its sockets again: 64 operations of 4 KiB. Large enough
/// that a turn's work dwarfs the poll between turns, small enough that
/// what arrived meanwhile competes within a fraction of a millisecond.
pub const TURN_COST: f64 = 64.0;

/// Classes and limiters idle this long are forgotten (a client instance
/// lives as long as one CLI command, and each is a class).
pub const IDLE_CLASS_US: u64 = 10_000_000;

/// Who an operation is scheduled as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ClassKey {
    /// An image's objects (header and data): its data pool (where the
    /// request goes) and its id.
    Image { pool: u32, image: u64 },
    /// Any other object, by client instance (or by connection for an
    /// anonymous client): not an image's, so it has no settings.
    Client(u64),
}

impl ClassKey {
    /// `request`'s class, arriving on connection `token`. An image's
    /// objects are named `<16 hex digits>.<anything>` (its id, then
    /// `header` or the object number); parsing allocates nothing.
    pub fn of(request: &OpRequest, token: usize) -> ClassKey {
        match image_of(&request.object) {
            Some(image) => ClassKey::Image { pool: request.pool, image },
            None if request.client != 0 => ClassKey::Client(request.client),
            // The top bit keeps connection tokens apart from client ids.
            None => ClassKey::Client(token as u64 | 1 << 63),
        }
    }
}

impl std::fmt::Display for ClassKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClassKey::Image { pool, image } => write!(f, "image {pool}/{image:016x}"),
            ClassKey::Client(id) if id >> 63 == 1 => write!(f, "connection {}", id & !(1 << 63)),
            ClassKey::Client(id) => write!(f, "client {id:x}"),
        }
    }
}

/// Each priority thread's classes, as it last published them.
pub type QosViews = Mutex<BTreeMap<usize, Vec<ClassView>>>;

/// One class of one priority thread, as `duplex daemon SOCKET qos` shows it.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ClassView {
    /// `image POOL/ID` (the id as in the image's object names), `client
    /// ID`, or `connection N` (a client that gave no id).
    pub class: String,
    /// Operations waiting in the scheduler, and behind the OSD's limiter.
    pub queued: usize,
    pub held: usize,
    /// 4 KiB operations a second owed at each OSD's thread, and its share.
    pub reservation: f64,
    pub weight: f64,
    pub urgent: bool,
    /// Operations served in the reservation phase, by weight, and urgent,
    /// since the class was last met after an idle spell.
    pub served_reservation: u64,
    pub served_weight: u64,
    pub served_urgent: u64,
}

fn image_of(object: &[u8]) -> Option<u64> {
    if object.len() < 17 || object[16] != b'.' {
        return None;
    }
    object[..16].iter().try_fold(0u64, |id, &b| {
        let digit = match b {
            b'0'..=b'9' => b - b'0',
            b'a'..=b'f' => b - b'a' + 10,
            _ => return None,
        };
        Some(id << 4 | u64::from(digit))
    })
}

/// Whether `map` asks for QoS at all: some pool or image has a setting.
pub fn enabled(map: &ClusterMap) -> bool {
    !map.image_qos.is_empty() || map.pools.values().any(|pool| !pool.qos.is_empty())
}

/// `key`'s settings in `map`: its pool's defaults, its own over them.
pub fn settings_in(map: &ClusterMap, key: ClassKey) -> ClassSettings {
    let ClassKey::Image { pool, image } = key else { return ClassSettings::default() };
    let base = map.pools.get(&pool).map(duplex_map::Pool::default_settings).unwrap_or_default();
    match map.image_qos.get(&(pool, image)) {
        Some(own) => duplex_map::settings_over(base, own, "an image"),
        None => base,
    }
}

/// The limits an OSD holds a class to: the image's, with twice its burst
/// allowance, so that gateways keeping to their shares never meet them.
fn at_osd(limits: &Limits) -> Limits {
    Limits { burst_seconds: (limits.burst_seconds * 2.0).min(duplex_qos::limit::MAX_BURST_SECONDS), ..*limits }
}

/// The OSD's limiters, one per limited class, shared by its threads.
pub struct OsdLimits {
    base: Instant,
    limiters: Mutex<HashMap<ClassKey, (Limiter, u64)>>,
}

impl Default for OsdLimits {
    fn default() -> Self {
        OsdLimits { base: Instant::now(), limiters: Mutex::new(HashMap::new()) }
    }
}

impl OsdLimits {
    /// `now` in the microseconds every QoS clock of this OSD counts.
    pub fn micros(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base).as_micros() as u64
    }

    /// Admits an operation of `key`'s (`Ok`) against `limits`, or says
    /// when it may go (`Err(at)`): then nothing is taken.
    pub fn admit(&self, key: ClassKey, limits: &Limits, direction: Direction, bytes: u64, now: u64) -> Result<(), u64> {
        debug_assert!(!limits.is_unlimited(), "an unlimited class asks the limiter");
        let wanted = at_osd(limits);
        let mut limiters = self.limiters.lock().expect("QoS limiters lock");
        let (limiter, used) = limiters.entry(key).or_insert_with(|| (Limiter::new(wanted, now), now));
        if *limiter.limits() != wanted {
            limiter.set_limits(wanted, now);
        }
        *used = now;
        limiter.admit(direction, bytes, now)
    }

    /// Forgets the limiters idle since `before`. A forgotten one starts
    /// full again: an idle image has earned its burst by then anyway.
    pub fn sweep(&self, before: u64) {
        self.limiters.lock().expect("QoS limiters lock").retain(|_, (_, used)| *used >= before);
    }

    pub fn len(&self) -> usize {
        self.limiters.lock().expect("QoS limiters lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// An item with what it costs the scheduler.
struct Costed<T> {
    item: T,
    cost: f64,
}

/// A class's items over its limit, in arrival order.
struct Held<T> {
    queue: VecDeque<(T, Direction, u64)>,
    /// When the head may try the limiter again (µs).
    until: u64,
}

/// One priority thread's client scheduling: its scheduler, the items its
/// OSD's limiter holds back, and each class's settings in the map it saw
/// last.
pub struct ClientQos<T> {
    scheduler: Scheduler<ClassKey, Costed<T>>,
    held: BTreeMap<ClassKey, Held<T>>,
    /// Per class met: its settings in map `epoch`, and when it last had work.
    classes: HashMap<ClassKey, (ClassSettings, u64)>,
    epoch: u64,
    on: bool,
    next_sweep: u64,
}

impl<T> Default for ClientQos<T> {
    fn default() -> Self {
        let default_spec = ClassSettings::default().class_spec();
        ClientQos {
            scheduler: Scheduler::new(default_spec),
            held: BTreeMap::new(),
            classes: HashMap::new(),
            epoch: 0,
            on: false,
            next_sweep: 0,
        }
    }
}

impl<T> ClientQos<T> {
    /// Scheduling is on (the map asked for it), or items still wait.
    pub fn is_on(&self) -> bool {
        self.on || !self.is_empty()
    }

    /// Nothing is queued or held.
    pub fn is_empty(&self) -> bool {
        self.scheduler.is_empty() && self.held.is_empty()
    }

    /// Items queued or held.
    pub fn len(&self) -> usize {
        self.scheduler.len() + self.held.values().map(|h| h.queue.len()).sum::<usize>()
    }

    /// Takes map `map`'s settings, once per epoch: classes met before are
    /// re-read, live (their queued items keep their places).
    pub fn follow(&mut self, map: &ClusterMap, now: u64) {
        if map.epoch == self.epoch {
            return;
        }
        self.epoch = map.epoch;
        self.on = enabled(map);
        for (key, (settings, _)) in self.classes.iter_mut() {
            let new = settings_in(map, *key);
            if new != *settings {
                *settings = new;
                self.scheduler.set_class(*key, new.class_spec(), now);
            }
        }
    }

    /// Queues `item` of class `key` (its settings looked up in `map` the
    /// first time the class is met): held first if its limits say so
    /// (then true).
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        map: &ClusterMap,
        limits: &OsdLimits,
        key: ClassKey,
        item: T,
        direction: Direction,
        bytes: u64,
        now: u64,
    ) -> bool {
        let settings = match self.classes.get_mut(&key) {
            Some((settings, seen)) => {
                *seen = now;
                *settings
            }
            None => {
                let settings = settings_in(map, key);
                self.classes.insert(key, (settings, now));
                if !settings.is_default() {
                    self.scheduler.set_class(key, settings.class_spec(), now);
                }
                settings
            }
        };
        if !settings.limits.is_unlimited() {
            if let Some(held) = self.held.get_mut(&key) {
                held.queue.push_back((item, direction, bytes));
                return true;
            }
            if let Err(until) = limits.admit(key, &settings.limits, direction, bytes, now) {
                self.held.insert(key, Held { queue: VecDeque::from([(item, direction, bytes)]), until });
                return true;
            }
        }
        let cost = duplex_qos::cost(bytes);
        self.scheduler.push(key, Costed { item, cost }, cost, now);
        false
    }

    /// The next item to run, with its cost, or when to ask again (µs):
    /// held items whose limiter lets them go move into the scheduler first.
    pub fn pop(&mut self, limits: &OsdLimits, now: u64) -> Pop<ClassKey, (T, f64)> {
        self.release(limits, now);
        match self.scheduler.pop(now) {
            Pop::Ready { key, item, phase } => Pop::Ready { key, item: (item.item, item.cost), phase },
            Pop::Wait(until) => Pop::Wait(self.held_until().map_or(until, |held| held.min(until))),
            Pop::Empty => self.held_until().map_or(Pop::Empty, Pop::Wait),
        }
    }

    /// The next item if it is owed now (its class's reservation is due):
    /// run at once, not in the turn's batch. Others stay queued.
    pub fn pop_owed(&mut self, limits: &OsdLimits, now: u64) -> Option<(T, f64)> {
        self.release(limits, now);
        self.scheduler.pop_owed(now).map(|(_, costed, _)| (costed.item, costed.cost))
    }

    /// When the first held class may try its limiter again.
    fn held_until(&self) -> Option<u64> {
        self.held.values().map(|h| h.until).min()
    }

    fn release(&mut self, limits: &OsdLimits, now: u64) {
        let due: Vec<ClassKey> = self.held.iter().filter(|(_, h)| h.until <= now).map(|(k, _)| *k).collect();
        for key in due {
            let settings = self.classes.get(&key).map(|(s, _)| *s).unwrap_or_default();
            let held = self.held.get_mut(&key).expect("listed above");
            while let Some(&(_, direction, bytes)) = held.queue.front() {
                // Limits removed since: everything held goes on.
                let admitted = if settings.limits.is_unlimited() {
                    Ok(())
                } else {
                    limits.admit(key, &settings.limits, direction, bytes, now)
                };
                match admitted {
                    Ok(()) => {
                        let (item, _, bytes) = held.queue.pop_front().expect("a front");
                        let cost = duplex_qos::cost(bytes);
                        self.scheduler.push(key, Costed { item, cost }, cost, now);
                    }
                    Err(until) => {
                        held.until = until;
                        break;
                    }
                }
            }
            if held.queue.is_empty() {
                self.held.remove(&key);
            }
        }
    }

    /// Forgets classes idle for [`IDLE_CLASS_US`] (at most once that
    /// often), and the OSD's idle limiters with them.
    pub fn sweep(&mut self, limits: &OsdLimits, now: u64) {
        if now < self.next_sweep {
            return;
        }
        self.next_sweep = now + IDLE_CLASS_US;
        let before = now.saturating_sub(IDLE_CLASS_US);
        let idle: Vec<ClassKey> = self
            .classes
            .iter()
            .filter(|(key, (_, seen))| {
                *seen < before && self.scheduler.queued(key) == 0 && !self.held.contains_key(key)
            })
            .map(|(key, _)| *key)
            .collect();
        for key in idle {
            self.classes.remove(&key);
            let left = self.scheduler.remove_class(&key);
            debug_assert!(left.is_empty(), "an idle class had work queued");
        }
        limits.sweep(before);
    }

    /// Each class this thread knows: its settings as scheduled, what waits
    /// in its queue and behind the OSD's limiter, and what it was served,
    /// for `duplex daemon SOCKET qos`.
    pub fn view(&self) -> Vec<ClassView> {
        // A held class has limits, so the scheduler knows it (set_class
        // when first met or when the map changed its settings).
        debug_assert!(
            self.held.keys().all(|key| self.scheduler.class_spec(key).is_some()),
            "a class held by its limit that the scheduler does not know"
        );
        self.scheduler
            .stats()
            .map(|(key, stats)| ClassView {
                class: key.to_string(),
                queued: stats.queued,
                held: self.held.get(key).map_or(0, |held| held.queue.len()),
                reservation: stats.spec.reservation(),
                weight: stats.spec.weight(),
                urgent: stats.urgent,
                served_reservation: stats.served_reservation,
                served_weight: stats.served_weight,
                served_urgent: stats.served_urgent,
            })
            .collect()
    }

    /// The scheduler's spec for `key`, for tests.
    pub fn spec_of(&self, key: &ClassKey) -> Option<ClassSpec> {
        self.scheduler.class_spec(key)
    }

    /// Classes this thread knows.
    pub fn classes(&self) -> usize {
        self.classes.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use duplex_map::{Command, Pool};
    use duplex_qos::Phase;

    fn request(object: &str, client: u64) -> OpRequest {
        OpRequest {
            kind: duplex_proto::osd::OpKind::Write,
            pool: 1,
            pg: 0,
            map_epoch: 1,
            object: bytes::Bytes::from(object.to_string()),
            offset: 0,
            length: 0,
            data: bytes::Bytes::new(),
            client,
            snap: 0,
        }
    }

    #[test]
    fn an_images_objects_are_its_class_and_others_go_by_client() {
        let image = ClassKey::Image { pool: 1, image: 0x00ab_cdef_0123_4567 };
        assert_eq!(ClassKey::of(&request("00abcdef01234567.0000000000000003", 9), 5), image);
        assert_eq!(ClassKey::of(&request("00abcdef01234567.header", 9), 5), image);
        assert_eq!(ClassKey::of(&request("00abcdef01234567.0000000000000003@4", 9), 5), image, "a clone");
        for other in ["image.disk", "00ABCDEF01234567.x", "00abcdef0123456.x", "00abcdef01234567x", "", "rbd_directory"]
        {
            assert_eq!(ClassKey::of(&request(other, 9), 5), ClassKey::Client(9), "{other}");
        }
        assert_eq!(ClassKey::of(&request("x", 0), 5), ClassKey::Client(5 | 1 << 63));
    }

    fn map_with(image_settings: &[(&str, &str)]) -> ClusterMap {
        let mut map = ClusterMap::new([0; 16]);
        map.pools.insert(1, Pool::new(1, "vms".into(), 2, 1, 8, None));
        map.next_pool_id = 2;
        if !image_settings.is_empty() {
            let settings = image_settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            map.run(&Command::ImageQosSet { pool: 1, image: 7, settings }).unwrap();
        }
        map
    }

    const A: ClassKey = ClassKey::Image { pool: 1, image: 7 };
    const B: ClassKey = ClassKey::Image { pool: 1, image: 8 };

    #[test]
    fn off_until_the_map_has_a_setting_then_specs_follow_the_map_live() {
        let limits = OsdLimits::default();
        let mut qos: ClientQos<u32> = ClientQos::default();
        qos.follow(&map_with(&[]), 0);
        assert!(!qos.is_on());
        let map = map_with(&[("qos_reservation_iops", "300"), ("qos_weight", "4")]);
        qos.follow(&map, 0);
        assert!(qos.is_on());
        qos.push(&map, &limits, A, 1, Direction::Write, 4096, 0);
        assert_eq!(qos.spec_of(&A).unwrap().reservation(), 300.0);
        let mut changed = map_with(&[("qos_weight", "2")]);
        changed.epoch = map.epoch + 1;
        qos.follow(&changed, 10);
        assert_eq!(qos.spec_of(&A).unwrap().weight(), 2.0);
        assert_eq!(qos.spec_of(&A).unwrap().reservation(), 0.0);
        assert!(matches!(qos.pop(&limits, 20), Pop::Ready { key: A, item: (1, 1.0), .. }));
    }

    /// Virtual time: a noisy image queues 64 writes of 64 KiB every 10 ms
    /// (a backlog that only grows), a reserved one writes 4 KiB at a time,
    /// the next once the last ran; each turn pops at most [`TURN_COST`].
    /// The reserved image is served in the turn its write arrives.
    #[test]
    fn a_reserved_class_is_served_first_in_its_turn_under_a_backlog() {
        let limits = OsdLimits::default();
        let map = map_with(&[("qos_reservation_iops", "1000")]);
        let (reserved, noisy) = (A, B);
        let mut qos: ClientQos<(ClassKey, u64)> = ClientQos::default();
        qos.follow(&map, 0);
        let (mut waits, mut in_flight) = (Vec::new(), false);
        for turn in 0..1000u64 {
            let now = turn * 1000;
            if turn % 10 == 0 {
                for _ in 0..64 {
                    qos.push(&map, &limits, noisy, (noisy, now), Direction::Write, 65536, now);
                }
            }
            if !in_flight {
                qos.push(&map, &limits, reserved, (reserved, now), Direction::Write, 4096, now);
                in_flight = true;
            }
            let mut budget = TURN_COST;
            while budget > 0.0 {
                let Pop::Ready { item: ((key, at), cost), phase, .. } = qos.pop(&limits, now) else { break };
                budget -= cost;
                if key == reserved {
                    assert_eq!(phase, Phase::Reservation, "the reserved class goes by its reservation");
                    waits.push(now - at);
                    in_flight = false;
                }
            }
        }
        assert_eq!(waits.len(), 1000, "the reserved image ran once a turn");
        assert!(waits.iter().all(|&w| w == 0), "it waited a turn or more: {:?}", waits.iter().max());
        assert!(qos.len() > 2000, "the noisy image's backlog grew: {}", qos.len());
    }

    #[test]
    fn a_limited_image_is_held_at_the_osd_and_goes_on_as_its_tokens_come() {
        let limits = OsdLimits::default();
        // 100 IOPS with a 1 s burst: the OSD allows a 2 s burst, 200.
        let map = map_with(&[("qos_iops", "100")]);
        let mut qos: ClientQos<u32> = ClientQos::default();
        qos.follow(&map, 0);
        for i in 0..500 {
            qos.push(&map, &limits, A, i, Direction::Read, 4096, 0);
        }
        // The operator's view: 200 went into the scheduler, 300 are held.
        let view = qos.view();
        assert_eq!(view.len(), 1);
        assert_eq!((view[0].class.as_str(), view[0].queued, view[0].held), ("image 1/0000000000000007", 200, 300));
        let mut served = Vec::new();
        let mut now = 0;
        while served.len() < 500 {
            match qos.pop(&limits, now) {
                Pop::Ready { item: (i, _), .. } => served.push((i, now)),
                Pop::Wait(until) => {
                    assert!(until > now);
                    now = until;
                }
                Pop::Empty => panic!("items lost"),
            }
        }
        assert!(served.windows(2).all(|w| w[0].0 < w[1].0), "a class's items keep their order");
        let view = qos.view();
        assert_eq!((view[0].queued, view[0].held, view[0].served_weight), (0, 0, 500));
        let at_once = served.iter().filter(|(_, at)| *at == 0).count();
        assert_eq!(at_once, 200, "the OSD's burst is twice the image's");
        let done = served.last().unwrap().1 as f64 / 1e6;
        assert!((2.9..=3.1).contains(&done), "300 more at 100 a second take 3 s, not {done}");
        // An unlimited neighbour is never held.
        qos.push(&map, &limits, B, 9999, Direction::Read, 4096, now);
        assert!(matches!(qos.pop(&limits, now), Pop::Ready { key: B, .. }));
        // Idle classes and limiters are forgotten.
        assert_eq!(limits.len(), 1);
        qos.sweep(&limits, now + 2 * IDLE_CLASS_US);
        assert_eq!((qos.classes(), limits.len()), (0, 0));
    }
}
