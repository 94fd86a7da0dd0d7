//! An open image's limits (issue 31): where one gateway's traffic to an
//! image is seen whole, so a limit holds across all its objects and PGs.
//!
//! The limits live in the image's header as attributes `qos.<name>` (see
//! [`attr_name`]), written by `duplex image set`, over its pool's defaults
//! (`duplex pool set POOL qos_…`, in the map). Each gateway's watch
//! reads them at every renewal (every half second, crate::watch), so a
//! change applies to running gateways within a second, without
//! reconnecting. When several gateways serve an image, each takes an
//! equal share of its limits (the watch counts the live ones), so the
//! image as a whole stays within them; a gateway that is idle leaves its
//! share unused (not work-conserving across gateways; the OSD's scheduler
//! is what shares a server's spare capacity). Every watcher counts, an
//! export or a flatten too, and one that vanished counts until it is found
//! dead (6 s); a share is at least 1 a second, so many gateways on a tiny
//! limit may together exceed it.
//!
//! An I/O larger than a bucket passes when the bucket is full and leaves
//! it in debt: a 32 MiB write under a 1 MiB/s limit holds the image's next
//! I/O for about 31 s. Limits this low suit small I/O only.
//!
//! An image with no limit set costs its I/O one atomic load here.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use duplex_qos::{ClassSettings, Direction, Limiter, Limits};

use crate::client::Client;
use crate::error::ClientError;

/// The prefix of the header attributes that hold an image's limits.
pub const ATTR_PREFIX: &[u8] = b"qos.";

/// The header attribute of setting `key` (`qos_iops` → `qos.iops`).
pub fn attr_name(key: &str) -> Vec<u8> {
    let short = key.strip_prefix("qos_").unwrap_or(key);
    [ATTR_PREFIX, short.as_bytes()].concat()
}

/// The settings the header's attributes `attrs` set over `base` (the
/// pool's defaults): an image's own setting of a key wins. Settings this
/// client does not know (a newer one wrote them) or cannot read are
/// skipped and returned as errors, for the caller to report.
pub fn settings_of(base: ClassSettings, attrs: &[(Vec<u8>, Vec<u8>)]) -> (ClassSettings, Vec<duplex_qos::LimitError>) {
    let mut settings = base;
    let mut errors = Vec::new();
    for (name, value) in attrs {
        let Some(short) = name.strip_prefix(ATTR_PREFIX) else { continue };
        let key = format!("qos_{}", String::from_utf8_lossy(short));
        if let Err(err) = settings.set(&key, &String::from_utf8_lossy(value)) {
            errors.push(err);
        }
    }
    (settings, errors)
}

/// The limits of [`settings_of`].
pub fn limits_of(base: Limits, attrs: &[(Vec<u8>, Vec<u8>)]) -> (Limits, Vec<duplex_qos::LimitError>) {
    let (settings, errors) = settings_of(ClassSettings { limits: base, ..ClassSettings::default() }, attrs);
    (settings.limits, errors)
}

/// The header attributes by which a gateway says it holds the image's
/// I/O back (`throttled.<its watch id>`), for `duplex status`.
pub const THROTTLED_PREFIX: &[u8] = b"throttled.";

/// How long a gateway's report counts without a newer one: a few of its
/// watch's renewals (a gateway that died stops renewing it).
pub const HOLDING_FRESH_MS: u64 = 3000;

/// What a gateway reports: when (Unix ms), and how many I/Os it held in
/// the span (ms) before.
pub fn encode_holding(unix_ms: u64, held: u64, span_ms: u64) -> [u8; 24] {
    let mut out = [0u8; 24];
    for (at, word) in [unix_ms, held, span_ms].into_iter().enumerate() {
        out[at * 8..at * 8 + 8].copy_from_slice(&word.to_le_bytes());
    }
    out
}

pub fn decode_holding(value: &[u8]) -> Option<(u64, u64, u64)> {
    let value: &[u8; 24] = value.try_into().ok()?;
    let word = |at: usize| u64::from_le_bytes(value[at * 8..at * 8 + 8].try_into().expect("8 bytes"));
    Some((word(0), word(1), word(2)))
}

/// An image's gateways holding its I/O back now.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Holding {
    pub gateways: usize,
    /// I/Os a second they held, together.
    pub held_per_second: f64,
}

/// The fresh reports among a header's attributes, as of `now_unix_ms`
/// (None: no gateway holds the image's I/O).
pub fn holding_of(attrs: &[(Vec<u8>, Vec<u8>)], now_unix_ms: u64) -> Option<Holding> {
    let reports: Vec<(u64, u64)> = attrs
        .iter()
        .filter(|(name, _)| name.starts_with(THROTTLED_PREFIX))
        .filter_map(|(_, value)| decode_holding(value))
        .filter(|(at, held, _)| *held > 0 && now_unix_ms.saturating_sub(*at) < HOLDING_FRESH_MS)
        .map(|(_, held, span)| (held, span.max(1)))
        .collect();
    (!reports.is_empty()).then(|| Holding {
        gateways: reports.len(),
        held_per_second: reports.iter().map(|(held, span)| *held as f64 * 1000.0 / *span as f64).sum(),
    })
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A gateway's report of its holding, kept by its watch: written at a
/// renewal after which it held I/O, removed at the first after which it
/// held none (so an image under its limits costs no extra write).
pub(crate) struct HoldingReport {
    name: Vec<u8>,
    held_seen: u64,
    since: Instant,
    published: bool,
}

impl HoldingReport {
    /// For the watcher whose attribute is `watch_name` (`watch.<id>`).
    pub(crate) fn new(watch_name: &[u8]) -> HoldingReport {
        let id = watch_name.strip_prefix(crate::watch::WATCH_PREFIX).unwrap_or(watch_name);
        HoldingReport { name: [THROTTLED_PREFIX, id].concat(), held_seen: 0, since: Instant::now(), published: false }
    }

    /// After a renewal: `held_total` I/Os held since the image was opened.
    pub(crate) fn update(
        &mut self,
        client: &Client,
        pool: u32,
        header: &[u8],
        held_total: u64,
    ) -> Result<(), ClientError> {
        let held = held_total.saturating_sub(self.held_seen);
        let span_ms = self.since.elapsed().as_millis() as u64;
        (self.held_seen, self.since) = (held_total, Instant::now());
        if held > 0 {
            client.set_attr(pool, header, &self.name, &encode_holding(unix_ms(), held, span_ms))?;
            self.published = true;
        } else if self.published {
            self.clear(client, pool, header)?;
        }
        Ok(())
    }

    pub(crate) fn clear(&mut self, client: &Client, pool: u32, header: &[u8]) -> Result<(), ClientError> {
        if std::mem::take(&mut self.published) {
            match client.remove_attr(pool, header, &self.name) {
                Ok(()) | Err(ClientError::NotFound) => {}
                Err(err) => return Err(err),
            }
        }
        Ok(())
    }
}

/// An image some gateway holds back to its limits.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ThrottledImage {
    pub pool: String,
    pub image: String,
    #[serde(flatten)]
    pub holding: Holding,
}

/// An I/O held back until its limits let it go.
type Start = Box<dyn FnOnce() + Send + 'static>;

/// Holds an image's I/O to its limits: an I/O passes at once while they
/// allow it, else it waits in arrival order and a thread of the image's
/// own starts it when they do.
pub struct Throttle {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

struct Shared {
    /// No limit is set: I/O passes without taking the lock.
    unlimited: AtomicBool,
    state: Mutex<State>,
    wake: Condvar,
    base: Instant,
    /// I/Os that had to wait, since the image was opened.
    held: AtomicU64,
}

struct State {
    limiter: Limiter,
    queue: VecDeque<(Direction, u64, Start)>,
    stopped: bool,
}

impl Shared {
    fn now(&self) -> u64 {
        self.base.elapsed().as_micros() as u64
    }
}

impl Throttle {
    pub fn new(limits: Limits) -> Throttle {
        let base = Instant::now();
        let shared = Arc::new(Shared {
            unlimited: AtomicBool::new(limits.is_unlimited()),
            state: Mutex::new(State { limiter: Limiter::new(limits, 0), queue: VecDeque::new(), stopped: false }),
            wake: Condvar::new(),
            base,
            held: AtomicU64::new(0),
        });
        Throttle { shared, thread: Mutex::new(None) }
    }

    /// The limits in force (this gateway's share).
    pub fn limits(&self) -> Limits {
        *self.lock().limiter.limits()
    }

    /// I/Os that waited for the limits since the image was opened.
    pub fn held(&self) -> u64 {
        self.shared.held.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.shared.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// New limits, in force for the next I/O; the waiting ones are looked at again.
    pub fn set_limits(&self, limits: Limits) {
        let mut state = self.lock();
        if *state.limiter.limits() == limits {
            return;
        }
        let now = self.shared.now();
        state.limiter.set_limits(limits, now);
        // Set under the lock. While I/O still waits, new I/O queues behind
        // it (in arrival order) until the thread has let it all go; the
        // thread then sets the flag.
        let unlimited = limits.is_unlimited() && state.queue.is_empty();
        self.shared.unlimited.store(unlimited, Ordering::Release);
        drop(state);
        self.shared.wake.notify_all();
    }

    fn start_thread(&self) -> Result<(), ClientError> {
        let mut thread = self.thread.lock().unwrap_or_else(|p| p.into_inner());
        if thread.is_none() {
            let shared = self.shared.clone();
            let handle = std::thread::Builder::new()
                .name("duplex-qos".into())
                .spawn(move || release_when_allowed(&shared))
                .map_err(|e| ClientError::Unavailable(format!("cannot start the image's QoS thread: {e}")))?;
            *thread = Some(handle);
        }
        Ok(())
    }

    /// Whether an I/O of `bytes` going `direction` may start now; if so,
    /// it is counted. `false`: hand it to [`Throttle::hold`].
    pub fn pass(&self, direction: Direction, bytes: u64) -> bool {
        if self.shared.unlimited.load(Ordering::Acquire) {
            return true;
        }
        let mut state = self.lock();
        let now = self.shared.now();
        state.stopped || (state.queue.is_empty() && state.limiter.admit(direction, bytes, now).is_ok())
    }

    /// Starts `start` once the limits allow an I/O of `bytes` going
    /// `direction`, after the I/Os waiting before it. The queue is bounded
    /// by the callers' I/O in flight (an NBD server's gate, a benchmark's
    /// queue depth), not here.
    pub fn hold(&self, direction: Direction, bytes: u64, start: Start) {
        if let Err(err) = self.start_thread() {
            // Nothing would start it: it goes now, over the limit.
            tracing::warn!(%err, "an image's I/O goes unthrottled");
            return start();
        }
        let mut state = self.lock();
        if state.stopped {
            drop(state);
            return start();
        }
        state.queue.push_back((direction, bytes, start));
        self.shared.held.fetch_add(1, Ordering::Relaxed);
        drop(state);
        self.shared.wake.notify_all();
    }

    /// Lets every waiting I/O go and ends the thread (the image is closing).
    pub fn stop(&self) {
        self.lock().stopped = true;
        self.shared.wake.notify_all();
        // Taken out first: the join holds no lock a start could want.
        let thread = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(thread) = thread {
            // Its own last start may drop the image, and with it this.
            if thread.thread().id() != std::thread::current().id() {
                let _ = thread.join();
            }
        }
    }
}

impl Drop for Throttle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The throttle's thread: starts the waiting I/Os, in order, as the
/// limits let them go (all of them once stopped or unlimited).
fn release_when_allowed(shared: &Shared) {
    let mut state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let mut ready = Vec::new();
        let mut wait = None;
        let free = state.stopped || shared.unlimited.load(Ordering::Acquire);
        while let Some((direction, bytes)) = state.queue.front().map(|(d, b, _)| (*d, *b)) {
            let now = shared.now();
            match state.limiter.admit(direction, bytes, now) {
                Err(at) if !free => {
                    wait = Some(Duration::from_micros(at - now));
                    break;
                }
                _ => ready.extend(state.queue.pop_front().map(|(_, _, start)| start)),
            }
        }
        if state.queue.is_empty() && state.limiter.is_unlimited() {
            // Limits removed while I/O waited: all of it is gone now.
            shared.unlimited.store(true, Ordering::Release);
        }
        if !ready.is_empty() {
            // Started outside the lock: an I/O's start may submit at once.
            drop(state);
            for start in ready {
                start();
            }
            state = shared.state.lock().unwrap_or_else(|p| p.into_inner());
            continue;
        }
        if state.stopped {
            debug_assert!(state.queue.is_empty(), "a stopped throttle kept I/O waiting");
            return;
        }
        state = match wait {
            Some(wait) => shared.wake.wait_timeout(state, wait).unwrap_or_else(|p| p.into_inner()).0,
            None => shared.wake.wait(state).unwrap_or_else(|p| p.into_inner()),
        };
    }
}

impl Client {
    /// The limits image `name` keeps to: its pool's defaults, and its
    /// header's `qos.` attributes over them.
    pub fn image_limits(&self, pool: u32, name: &str) -> Result<Limits, ClientError> {
        Ok(self.image_qos(pool, name)?.limits)
    }

    /// Image `name`'s QoS settings: its pool's defaults, and its header's
    /// `qos.` attributes over them.
    pub fn image_qos(&self, pool: u32, name: &str) -> Result<ClassSettings, ClientError> {
        let base = self.map().pools.get(&pool).map(duplex_map::Pool::default_settings).unwrap_or_default();
        self.image_qos_over(pool, name, base)
    }

    /// The default limits of pool `pool`'s images (`duplex pool set POOL qos_…`).
    pub fn pool_limits(&self, pool: u32) -> Limits {
        self.map().pools.get(&pool).map(duplex_map::Pool::default_limits).unwrap_or_default()
    }

    /// The settings image `name`'s own make of `base`.
    fn image_qos_over(&self, pool: u32, name: &str, base: ClassSettings) -> Result<ClassSettings, ClientError> {
        let info = self.image_info(pool, name)?;
        let attrs = self.list_attrs(pool, &crate::image::header_object(&info.id))?;
        let (settings, errors) = settings_of(base, &attrs);
        for err in errors {
            // A newer client's setting, say: the rest still apply (as in the watch).
            tracing::warn!(image = name, %err, "an image's QoS setting is not understood; the others apply");
        }
        Ok(settings)
    }

    /// Sets image `name`'s own QoS from `key=value` settings (the keys of
    /// [`duplex_qos::settings::KEYS`]; 0 removes a limit): all are checked
    /// before any is written. Its header keeps them for the gateways,
    /// which apply limits within a second; the map keeps them for the
    /// OSDs' schedulers and limiters. Returns the image's own settings now.
    pub fn set_image_qos(
        &self,
        pool: u32,
        name: &str,
        settings: &[(String, String)],
    ) -> Result<ClassSettings, ClientError> {
        let info = self.image_info(pool, name)?;
        let header = crate::image::header_object(&info.id);
        // The image's own settings only: the pool's defaults stay the pool's.
        let mut own = self.image_qos_over(pool, name, ClassSettings::default())?;
        for (key, value) in settings {
            own.set(key, value).map_err(|err| ClientError::Invalid(err.to_string()))?;
        }
        own.check().map_err(|err| ClientError::Invalid(err.to_string()))?;
        let set: Vec<(&str, String)> = own.settings();
        // The map first: a refusal there leaves the header as it was.
        self.publish_image_qos(info.data_pool_in(pool), &info.id, &set)?;
        for key in duplex_qos::settings::KEYS {
            let attr = attr_name(key);
            match set.iter().find(|(k, _)| *k == key) {
                Some((_, value)) => self.set_attr(pool, &header, &attr, value.as_bytes())?,
                None => match self.remove_attr(pool, &header, &attr) {
                    Ok(()) | Err(ClientError::NotFound) => {}
                    Err(err) => return Err(err),
                },
            }
        }
        Ok(own)
    }

    /// The images whose gateways hold their I/O back to their limits now,
    /// looked for only while some pool or image has QoS settings, in at
    /// most `max_images` images. Returns them, and how many images were
    /// not looked at.
    pub fn throttled_images(&self, max_images: usize) -> Result<(Vec<ThrottledImage>, usize), ClientError> {
        let map = self.map();
        if map.image_qos.is_empty() && map.pools.values().all(|pool| pool.qos.is_empty()) {
            return Ok((Vec::new(), 0));
        }
        let (mut throttled, mut looked, mut skipped) = (Vec::new(), 0, 0);
        let now = unix_ms();
        for pool in map.pools.values().filter(|pool| pool.chunks.is_none()) {
            for name in self.list_images(pool.id)? {
                if looked == max_images {
                    skipped += 1;
                    continue;
                }
                looked += 1;
                let info = match self.image_info(pool.id, &name) {
                    Ok(info) => info,
                    // Removed meanwhile.
                    Err(ClientError::NoSuchImage(_)) => continue,
                    Err(err) => return Err(err),
                };
                let attrs = self.list_attrs(pool.id, &crate::image::header_object(&info.id))?;
                if let Some(holding) = holding_of(&attrs, now) {
                    throttled.push(ThrottledImage { pool: pool.name.clone(), image: name, holding });
                }
            }
        }
        Ok((throttled, skipped))
    }

    /// A removed image's settings leave the map. Its name is gone already,
    /// so a failure here only leaves an entry no object matches: warned.
    pub(crate) fn forget_image_qos(&self, data_pool: u32, id: &str) {
        let known =
            u64::from_str_radix(id, 16).is_ok_and(|image| self.map().image_qos.contains_key(&(data_pool, image)));
        if known {
            if let Err(err) = self.publish_image_qos(data_pool, id, &[]) {
                tracing::warn!(image = id, %err, "a removed image's QoS settings stay in the map");
            }
        }
    }

    /// Tells the monitors image `id`'s own settings (empty: none), for the
    /// OSDs of its data pool `data_pool`.
    pub(crate) fn publish_image_qos(
        &self,
        data_pool: u32,
        id: &str,
        settings: &[(&str, String)],
    ) -> Result<(), ClientError> {
        let image = u64::from_str_radix(id, 16)
            .map_err(|_| ClientError::Corrupt(format!("image id '{id}' is not 16 hex digits")))?;
        let command = duplex_map::Command::ImageQosSet {
            pool: data_pool,
            image,
            settings: settings.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
        };
        match self.monitor().command(&command) {
            Ok(duplex_mon_client::WireOutcome::Refused(why)) => Err(ClientError::Invalid(why)),
            Ok(_) => Ok(()),
            Err(err) => Err(ClientError::Unavailable(format!("the monitors did not take the QoS settings: {err}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fresh_reports_of_held_io_add_up_and_stale_or_idle_ones_do_not() {
        let report = |id: &str, at: u64, held: u64, span: u64| {
            ([THROTTLED_PREFIX, id.as_bytes()].concat(), encode_holding(at, held, span).to_vec())
        };
        let now = 1_000_000;
        let attrs = vec![
            report("a", now - 500, 100, 500),                  // 200 a second
            report("b", now - 1000, 50, 1000),                 // 50 a second
            report("c", now - HOLDING_FRESH_MS - 1, 900, 500), // a gateway gone: stale
            report("d", now - 10, 0, 500),                     // holds nothing
            (b"throttled.e".to_vec(), b"garbage".to_vec()),
            (b"watch.a".to_vec(), encode_holding(now, 7, 1).to_vec()),
        ];
        let holding = holding_of(&attrs, now).expect("two gateways hold I/O");
        assert_eq!(holding.gateways, 2);
        assert!((holding.held_per_second - 250.0).abs() < 1e-9, "{holding:?}");
        assert_eq!(holding_of(&attrs[2..], now), None);
        assert_eq!(decode_holding(&encode_holding(1, 2, 3)), Some((1, 2, 3)));
        assert_eq!(decode_holding(&[0; 23]), None);
    }
    use std::sync::mpsc;

    fn limits(iops: u64) -> Limits {
        Limits { iops, ..Limits::default() }
    }

    #[test]
    fn attributes_name_their_settings_and_read_back() {
        assert_eq!(attr_name("qos_write_bps"), b"qos.write_bps".to_vec());
        let attrs = vec![
            (b"qos.iops".to_vec(), b"2000".to_vec()),
            (b"qos.burst_s".to_vec(), b"5".to_vec()),
            (b"qos.unknown".to_vec(), b"1".to_vec()),
            (b"watch.0123".to_vec(), b"xx".to_vec()),
        ];
        let (read, errors) = limits_of(Limits::default(), &attrs);
        assert_eq!((read.iops, read.burst_seconds), (2000, 5.0));
        assert_eq!(errors.len(), 1, "the unknown setting is reported, the rest read");
    }

    #[test]
    fn an_unlimited_image_passes_everything_and_starts_no_thread() {
        let throttle = Throttle::new(Limits::default());
        for _ in 0..10_000 {
            assert!(throttle.pass(Direction::Write, 4096));
        }
        assert!(throttle.thread.lock().unwrap().is_none());
        assert_eq!(throttle.held(), 0);
    }

    #[test]
    fn held_ios_start_in_order_at_the_limits_pace_and_all_go_when_stopped() {
        // 200 IOPS with a bucket of 20 (0.1 s): 20 at once, then one every 5 ms.
        let throttle = Throttle::new(Limits { burst_seconds: 0.1, ..limits(200) });
        let (sent, started) = mpsc::channel();
        let began = Instant::now();
        let mut passed = 0;
        for i in 0..60u32 {
            if throttle.pass(Direction::Read, 4096) {
                passed += 1;
                sent.send((i, began.elapsed())).unwrap();
            } else {
                let sent = sent.clone();
                throttle.hold(Direction::Read, 4096, Box::new(move || sent.send((i, began.elapsed())).unwrap()));
            }
        }
        assert_eq!(passed, 20, "the burst passes at once; once one waits, all after it wait");
        let order: Vec<(u32, Duration)> =
            (0..60).map(|_| started.recv_timeout(Duration::from_secs(5)).unwrap()).collect();
        assert!(order.windows(2).all(|w| w[0].0 < w[1].0), "in arrival order");
        let last = order.last().unwrap().1;
        // 40 waited, 5 ms apart: about 200 ms (a loaded machine may be late, never early).
        assert!(last >= Duration::from_millis(195), "the 40 held ones took {last:?}");
        assert_eq!(throttle.held(), 40);
        // A change to unlimited lets the waiting ones go at once.
        throttle.set_limits(limits(1));
        for i in 0..5 {
            let sent = sent.clone();
            if !throttle.pass(Direction::Read, 1) {
                throttle.hold(Direction::Read, 1, Box::new(move || sent.send((100 + i, began.elapsed())).unwrap()));
            }
        }
        throttle.set_limits(Limits::default());
        for _ in 0..4 {
            started.recv_timeout(Duration::from_secs(1)).expect("released by the change");
        }
        throttle.stop();
    }
}
