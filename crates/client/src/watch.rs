//! Gateways an image's snapshots wait for.
//!
//! Every image opened for writing (an NBD server, `bench`, an import)
//! *watches* its header: a thread renews the attribute `watch.<id>` of
//! the header object every [`HEARTBEAT`] (a counter, and the snapshot
//! sequence it has adopted), then reads the snapshot table and adopts its
//! newest live snapshot for the writes that start from then on.
//!
//! `snap create` writes the new table, then waits until every watcher
//! acknowledged the new sequence, or missed renewals for [`DEAD_AFTER`]
//! (it is then dropped from the header).
//!
//! When a watcher sees a new sequence it quiesces: it holds new writes,
//! lets the writes in flight under the old sequence finish, and
//! acknowledges. Once every watcher has, `snap create` *releases* the
//! sequence ([`RELEASED_ATTR`]), and each watcher adopts it and lets its
//! held writes go. So no gateway writes under the new sequence while
//! another still writes under the old: each gateway's acknowledged writes
//! before the snapshot are all in it, whatever the number of gateways (as
//! Ceph's exclusive-lock owner quiesces for `rbd snap create`, but with
//! many writers). A `snap create` that dies between its two steps is
//! finished by the gateways after [`RELEASE_WAIT`].
//!
//! A watcher that could not renew for [`FENCE`] holds its writes back
//! until it can ([`Watch::when_fresh`]):
//! since `FENCE < DEAD_AFTER`, a gateway that was declared dead (hung,
//! cut off) starts no write under the old sequence after `snap create`
//! returned. That makes a snapshot crash-consistent across every gateway
//! and connection writing the image: each write acknowledged before `snap
//! create` returned is in it, and none started after it is. (The argument
//! is a lease's: it needs the clocks of the two machines to run at about
//! the same rate, not to agree.)
//!
//! **News at once.** Each watcher also keeps a long poll on the header
//! (`OpKind::Watch`), which its primary answers as soon as it accepts a
//! change of the header's data (the table) or of an attribute named
//! `snap.` (the release): the watcher then renews at once instead of at
//! its next beat. `snap create` keeps one on the watchers' attributes
//! while it waits for their acknowledgements. So a served image's
//! snapshot takes a few round trips, and the writes it holds wait as
//! long. The polls only hasten what the renewals would find: an OSD that
//! cannot hold one (or a lost answer) costs a beat, nothing else.
//!
//! **Alone.** Each renewal also lists the watchers. A gateway that saw no
//! other one is *alone* until [`FENCE`] after that renewal was sent
//! ([`Watch::alone`]), and a gateway that found others when it registered
//! starts no write before [`FENCE`] has passed: so while a gateway is
//! alone, no other changed the image. A clone's gateway then remembers
//! which of its objects are absent and reads those straight from the
//! parent (crate::layering), as Ceph's object map does under its exclusive
//! lock. Each time the run of lone renewals breaks (another watcher, or a
//! renewal too late), the *generation* moves and what was remembered goes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_proto::osd::OpKind;

use crate::client::Client;
use crate::error::ClientError;
use crate::runtime::ObjectOp;
use crate::snapshot::read_table;

/// How often a watcher renews.
pub const HEARTBEAT: Duration = Duration::from_millis(500);
/// How long a long poll on the header waits at its OSD before it is sent again.
const POLL_WAIT: Duration = Duration::from_secs(5);
/// The header attributes whose change wakes a watcher's long poll (the release).
const WATCHER_NEWS: &[u8] = b"snap.";
/// A watcher that has not renewed for this long starts no write.
pub const FENCE: Duration = Duration::from_secs(3);
/// `snap create` stops waiting for a watcher whose counter stood still this long.
pub const DEAD_AFTER: Duration = Duration::from_secs(6);
/// The header attributes watchers renew start with this.
pub const WATCH_PREFIX: &[u8] = b"watch.";
/// The header attribute naming the newest sequence writes may go under
/// (u64 little-endian): `snap create` sets it once every watcher quiesced.
pub const RELEASED_ATTR: &[u8] = b"snap.released";
/// A gateway quiesced this long for a sequence nobody released checks
/// whether every live watcher has quiesced, and if so releases it itself
/// (the `snap create` that began it died between its two steps).
pub const RELEASE_WAIT: Duration = Duration::from_secs(10);

/// The released sequence among a header's attributes (0: none yet).
pub fn released_of(attrs: &[(Vec<u8>, Vec<u8>)]) -> u64 {
    attrs
        .iter()
        .find(|(name, _)| name == RELEASED_ATTR)
        .and_then(|(_, value)| <[u8; 8]>::try_from(value.as_slice()).ok())
        .map_or(0, u64::from_le_bytes)
}

/// A watcher's attribute value: its renewal counter and the snapshot
/// sequence it adopted.
pub fn encode_watch(counter: u64, acked: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&counter.to_le_bytes());
    out[8..].copy_from_slice(&acked.to_le_bytes());
    out
}

pub fn decode_watch(value: &[u8]) -> Option<(u64, u64)> {
    let value: &[u8; 16] = value.try_into().ok()?;
    let word = |at: usize| u64::from_le_bytes(value[at..at + 8].try_into().expect("8 bytes"));
    Some((word(0), word(8)))
}

/// A write waiting for the watch: called with the sequence to log under,
/// and its place among the writes in flight (drop it when the write ends).
pub type Held = Box<dyn FnOnce(Result<(u64, InFlight), ClientError>) + Send + 'static>;

/// A write the watch let through: in flight until dropped.
pub struct InFlight(Arc<State>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 && self.0.adopting.load(Ordering::SeqCst) {
            self.0.wake.1.notify_all();
        }
    }
}

/// What the writes of an open image need from its watcher.
struct State {
    /// Writes that started while the watch was stale, with when.
    held: Mutex<Vec<(Instant, Held)>>,
    /// How long a held write waits for a renewal before it fails.
    hold_limit: Duration,
    /// The newest live snapshot: writes are logged under it.
    write_snap: AtomicU64,
    /// Writes let through and not yet ended.
    in_flight: AtomicU64,
    /// A new sequence is being adopted: writes wait.
    adopting: AtomicBool,
    /// Nanoseconds after `base` until which this gateway is alone (0: not).
    alone_until: AtomicU64,
    /// Moves each time a run of lone renewals breaks.
    generation: AtomicU64,
    /// No write starts before this (nanoseconds after `base`): other
    /// watchers were there when this one registered.
    writes_from: AtomicU64,
    /// Nanoseconds after `base` at which the last renewal that completed
    /// was sent (0: none yet).
    renewed_at: AtomicU64,
    /// A long poll on the header is out.
    polling: AtomicBool,
    /// The long poll came back woken: renew now.
    news: AtomicBool,
    base: Instant,
    stop: AtomicBool,
    wake: (Mutex<()>, Condvar),
}

/// An image's watch: its renewal thread, stopped (and the attribute
/// removed) when dropped.
pub struct Watch {
    state: Arc<State>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Watch {
    /// Registers a watcher on `header` and starts renewing; returns once
    /// the first renewal went through, with the newest live snapshot.
    /// `throttle`: the image's limits, which each renewal sets from the
    /// header's `qos.` attributes (a share of them per live watcher).
    pub fn start(
        client: &Client,
        pool: u32,
        header: Vec<u8>,
        throttle: Option<std::sync::Weak<crate::qos::Throttle>>,
    ) -> Result<Watch, ClientError> {
        let id = loop {
            let id = rand::random::<u64>();
            if id != 0 {
                break id;
            }
        };
        let name = [WATCH_PREFIX, format!("{id:016x}").as_bytes()].concat();
        let state = Arc::new(State {
            held: Mutex::new(Vec::new()),
            hold_limit: client.config().op_timeout,
            write_snap: AtomicU64::new(0),
            in_flight: AtomicU64::new(0),
            adopting: AtomicBool::new(false),
            alone_until: AtomicU64::new(0),
            generation: AtomicU64::new(1),
            writes_from: AtomicU64::new(0),
            renewed_at: AtomicU64::new(0),
            polling: AtomicBool::new(false),
            news: AtomicBool::new(false),
            base: Instant::now(),
            stop: AtomicBool::new(false),
            wake: (Mutex::new(()), Condvar::new()),
        });
        let mut renewer = Renewer {
            client: client.clone(),
            pool,
            header,
            name: name.clone(),
            counter: 0,
            acked: 0,
            quiesced_since: None,
            others: Default::default(),
            throttle,
            bad_limits_reported: false,
            holding: crate::qos::HoldingReport::new(&name),
        };
        match renewer.renew(&state) {
            // Registered, or (a full cluster) not, but the table was read.
            Ok(()) | Err(ClientError::NoSpace(_)) => {}
            Err(err) => return Err(err),
        }
        if state.alone_until.load(Ordering::SeqCst) == 0 {
            // Another gateway may believe itself alone for up to FENCE.
            let from = state.base.elapsed().as_nanos() as u64 + FENCE.as_nanos() as u64;
            state.writes_from.store(from, Ordering::SeqCst);
        }
        let thread = {
            let state = state.clone();
            std::thread::Builder::new()
                .name("duplex-watch".into())
                .spawn(move || renewer.run(&state))
                .map_err(|e| ClientError::Unavailable(format!("cannot start the image's watch thread: {e}")))?
        };
        Ok(Watch { state, thread: Mutex::new(Some(thread)) })
    }

    /// Runs `write` with the snapshot sequence a write starting now is
    /// logged under: at once while the watch is fresh (two atomic loads
    /// and a clock read), else after the next renewal. Never blocks, so
    /// it may be called from a completion callback.
    pub fn when_fresh(&self, write: Held) {
        if self.state.stop.load(Ordering::Acquire) {
            return write(Err(ClientError::Shutdown));
        }
        match State::enter(&self.state) {
            Some(entered) => write(Ok(entered)),
            None => {
                self.state.held.lock().unwrap_or_else(|p| p.into_inner()).push((Instant::now(), write));
                self.state.wake.1.notify_all();
            }
        }
    }
}

impl Watch {
    /// While this gateway is alone (no other changed the image since the
    /// generation began): the generation.
    pub fn alone(&self) -> Option<u64> {
        let until = self.state.alone_until.load(Ordering::SeqCst);
        let now = self.state.base.elapsed().as_nanos() as u64;
        (now < until).then(|| self.state.generation.load(Ordering::SeqCst))
    }
}

impl State {
    fn fresh(&self) -> bool {
        let renewed = self.renewed_at.load(Ordering::Acquire);
        let now = self.base.elapsed().as_nanos() as u64;
        renewed != 0 && now.saturating_sub(renewed) < FENCE.as_nanos() as u64
    }

    /// Lets a write through, with the sequence to log it under, unless the
    /// watch is stale or adopting a new sequence. The count goes up before
    /// the check (both sequentially consistent), so an adoption that finds
    /// no write in flight is not overtaken by one under the old sequence.
    fn enter(state: &Arc<State>) -> Option<(u64, InFlight)> {
        state.in_flight.fetch_add(1, Ordering::SeqCst);
        let entered = InFlight(state.clone());
        if state.adopting.load(Ordering::SeqCst) || !state.fresh() {
            return None;
        }
        let from = state.writes_from.load(Ordering::SeqCst);
        if from != 0 && (state.base.elapsed().as_nanos() as u64) < from {
            return None;
        }
        Some((state.write_snap.load(Ordering::SeqCst), entered))
    }

    /// Releases the held writes if the watch is fresh; fails those that
    /// waited too long otherwise.
    fn release(state: &Arc<State>) {
        let mut held = state.held.lock().unwrap_or_else(|p| p.into_inner());
        if held.is_empty() {
            return;
        }
        let waiting = std::mem::take(&mut *held);
        let mut keep = Vec::new();
        let mut run = Vec::new();
        for (since, write) in waiting {
            match State::enter(state) {
                Some(entered) => run.push((write, Ok(entered))),
                None if since.elapsed() >= state.hold_limit => run.push((
                    write,
                    Err(ClientError::TimedOut(
                        state.hold_limit,
                        "the image's header could not be reached to renew its watch, which writes wait for".into(),
                    )),
                )),
                None => keep.push((since, write)),
            }
        }
        *held = keep;
        drop(held);
        for (write, result) in run {
            write(result);
        }
    }
}

impl Watch {
    /// Stops renewing and removes the watcher from the header, so that no
    /// snapshot waits for it; writes waiting for it fail. (Also on drop.)
    pub fn stop(&self) {
        self.state.stop.store(true, Ordering::Release);
        self.state.wake.1.notify_all();
        if let Some(thread) = self.thread.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = thread.join();
        }
        let held = std::mem::take(&mut *self.state.held.lock().unwrap_or_else(|p| p.into_inner()));
        for (_, write) in held {
            write(Err(ClientError::Shutdown));
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Renewer {
    client: Client,
    pool: u32,
    header: Vec<u8>,
    name: Vec<u8>,
    counter: u64,
    acked: u64,
    /// Quiesced for `acked` since then, waiting for its release.
    quiesced_since: Option<Instant>,
    /// Other watchers: their counter, and since when it stood at that.
    others: std::collections::HashMap<Vec<u8>, (u64, Instant)>,
    /// The image's limits, set from the header at each renewal.
    throttle: Option<std::sync::Weak<crate::qos::Throttle>>,
    /// A setting this client cannot read was logged (once).
    bad_limits_reported: bool,
    /// Whether this gateway holds the image's I/O back, for `duplex status`.
    holding: crate::qos::HoldingReport,
}

impl Renewer {
    fn run(mut self, state: &Arc<State>) {
        while !state.stop.load(Ordering::Acquire) {
            // Out before the renewal reads the header: a change after that
            // read wakes it.
            self.poll(state);
            {
                let (lock, cond) = &state.wake;
                let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                // A held write or news wakes it early: renew now, not at the next beat.
                let holding = !state.held.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
                if !state.news.load(Ordering::SeqCst) {
                    let _ = cond.wait_timeout(guard, if holding { Duration::from_millis(20) } else { HEARTBEAT });
                }
                // What came before this renewal's reads, they see.
                state.news.store(false, Ordering::SeqCst);
            }
            if state.stop.load(Ordering::Acquire) {
                break;
            }
            match self.renew(state) {
                // A full cluster refuses the counter's write; the renewal
                // read and adopted all the same (see `renew`): expected,
                // and `duplex status` says the cluster is full already.
                Err(ClientError::NoSpace(why)) => {
                    tracing::debug!(%why, "a full cluster refused the watch's counter; the watch goes on")
                }
                Err(err) => tracing::warn!(%err, "renewing an image's watch failed; retrying"),
                Ok(()) => {}
            }
            State::release(state);
        }
        let _ = self.holding.clear(&self.client, self.pool, &self.header);
        // Gone: `snap create` need not wait for this watcher any more.
        let remove = ObjectOp {
            data: Bytes::copy_from_slice(&self.name),
            ..ObjectOp::new(self.pool, OpKind::RemoveAttr, Bytes::copy_from_slice(&self.header))
        };
        let _ = self.client.call(remove);
    }

    /// Sends a long poll on the header unless one is out.
    fn poll(&self, state: &Arc<State>) {
        if state.polling.swap(true, Ordering::SeqCst) {
            return;
        }
        let state = state.clone();
        poll_header(&self.client, self.pool, &self.header, WATCHER_NEWS, move |woken| {
            state.polling.store(false, Ordering::SeqCst);
            if woken {
                state.news.store(true, Ordering::SeqCst);
                // Under the lock: the renewer checks `news` before it waits.
                let _guard = state.wake.0.lock().unwrap_or_else(|p| p.into_inner());
                state.wake.1.notify_all();
            }
        });
    }

    /// One renewal: the counter goes up, then the table is read and its
    /// newest live snapshot adopted, then (if the sequence moved) acknowledged.
    ///
    /// What keeps writes going is the read: a gateway that knows the table
    /// writes under the right sequence. The counter only tells `snap
    /// create` that the gateway lives; when it cannot be written (a full
    /// cluster refuses attribute writes, while deletes and discards must go
    /// on) the gateway still reads and adopts, and a snapshot waits the 6 s
    /// before it drops it.
    fn renew(&mut self, state: &State) -> Result<(), ClientError> {
        let sent = state.base.elapsed().as_nanos() as u64;
        self.counter += 1;
        let registered = self.set(self.counter, self.acked);
        let table = read_table(&self.client, self.pool, &self.header)?;
        if table.seq != self.acked {
            // Quiesce: hold new writes, let those under the old sequence end.
            state.adopting.store(true, Ordering::SeqCst);
            let deadline = Instant::now() + state.hold_limit;
            while state.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < deadline {
                let (lock, cond) = &state.wake;
                let guard = lock.lock().unwrap_or_else(|p| p.into_inner());
                let _ = cond.wait_timeout(guard, Duration::from_millis(2));
            }
            self.acked = table.seq;
            self.quiesced_since = Some(Instant::now());
            // Unacknowledged, the snapshot drops this watcher after 6 s.
            if let Err(err) = self.set(self.counter, self.acked) {
                tracing::warn!(%err, "acknowledging a snapshot failed");
            }
        }
        let attrs = self.client.list_attrs(self.pool, &self.header)?;
        let mut released = released_of(&attrs);
        if released < self.acked && self.quiesced_since.is_some_and(|since| since.elapsed() >= RELEASE_WAIT) {
            released = self.release_if_all_quiesced(&attrs)?;
        }
        if released >= self.acked {
            // Every watcher quiesced: writes go on under the newest.
            state.write_snap.store(table.newest_live(), Ordering::SeqCst);
            state.adopting.store(false, Ordering::SeqCst);
            self.quiesced_since = None;
        }
        let (limits, errors) = crate::qos::limits_of(self.client.pool_limits(self.pool), &attrs);
        self.look_for_others(state, sent, attrs)?;
        if let Some(throttle) = self.throttle.as_ref().and_then(std::sync::Weak::upgrade) {
            if let (Some(err), false) = (errors.first(), self.bad_limits_reported) {
                tracing::warn!(%err, "an image's QoS setting is not understood; the others apply");
                self.bad_limits_reported = true;
            }
            // Each live gateway takes an equal share: together they keep the image's limits.
            let gateways = self.others.len() + 1;
            throttle.set_limits(limits.scaled(1.0 / gateways as f64));
            if let Err(err) = self.holding.update(&self.client, self.pool, &self.header, throttle.held()) {
                tracing::debug!(%err, "reporting the image's held I/O failed; the next renewal tries again");
            }
        }
        state.renewed_at.store(sent.max(1), Ordering::Release);
        state.wake.1.notify_all();
        registered
    }

    /// Whether another gateway watches the image: ends or extends this
    /// one's time alone.
    fn look_for_others(&mut self, state: &State, sent: u64, attrs: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), ClientError> {
        let now_instant = Instant::now();
        let mut others = false;
        let mut live = std::collections::HashMap::new();
        for (name, value) in attrs {
            if !name.starts_with(WATCH_PREFIX) || name == self.name {
                continue;
            }
            let Some((counter, _)) = decode_watch(&value) else { continue };
            let since = match self.others.get(&name) {
                Some((seen, since)) if *seen == counter => *since,
                _ => now_instant,
            };
            if now_instant.duration_since(since) >= DEAD_AFTER {
                // Fenced for long since (a gateway killed without a goodbye):
                // it writes nothing, and it is not let to spoil being alone.
                let _ = self.client.remove_attr(self.pool, &self.header, &name);
                continue;
            }
            others = true;
            live.insert(name, (counter, since));
        }
        self.others = live;
        let now = state.base.elapsed().as_nanos() as u64;
        let until = state.alone_until.load(Ordering::SeqCst);
        if others {
            state.alone_until.store(0, Ordering::SeqCst);
            state.generation.fetch_add(1, Ordering::SeqCst);
        } else {
            if until == 0 || until <= now {
                // The run broke (or never began): what was known goes.
                state.generation.fetch_add(1, Ordering::SeqCst);
            }
            state.alone_until.store(sent + FENCE.as_nanos() as u64, Ordering::SeqCst);
        }
        Ok(())
    }

    /// The `snap create` that began sequence `acked` did not release it:
    /// if every live watcher has quiesced for it, release it (it is then
    /// what that `snap create` would have done). Returns the released one.
    fn release_if_all_quiesced(&self, attrs: &[(Vec<u8>, Vec<u8>)]) -> Result<u64, ClientError> {
        let waiting = attrs.iter().filter(|(name, _)| name.starts_with(WATCH_PREFIX) && *name != self.name).any(
            |(name, value)| {
                let live = self.others.get(name).is_none_or(|(_, since)| since.elapsed() < DEAD_AFTER);
                live && decode_watch(value).is_none_or(|(_, acked)| acked < self.acked)
            },
        );
        if waiting {
            return Ok(released_of(attrs));
        }
        tracing::warn!(seq = self.acked, "a snapshot was never released (its `snap create` died?): releasing it");
        release(&self.client, self.pool, &self.header, self.acked)?;
        Ok(self.acked)
    }

    fn set(&self, counter: u64, acked: u64) -> Result<(), ClientError> {
        // 16 bytes: far inside the header's attribute budget, so the
        // client-side total check (an extra round trip) is skipped.
        let data = Bytes::from([&self.name[..], &encode_watch(counter, acked)].concat());
        let op = ObjectOp {
            offset: self.name.len() as u64,
            data,
            ..ObjectOp::new(self.pool, OpKind::SetAttr, Bytes::copy_from_slice(&self.header))
        };
        self.client.call(op).map(drop)
    }
}

/// Sends a long poll on `header` (`OpKind::Watch`): `done(true)` once
/// its primary accepted a change of the header's data or of an attribute
/// whose name starts with `prefix`, `done(false)` when it timed out or
/// failed. `done` runs on the client's I/O thread.
fn poll_header(
    client: &Client,
    pool: u32,
    header: &[u8],
    prefix: &'static [u8],
    done: impl FnOnce(bool) + Send + 'static,
) {
    let op = ObjectOp {
        offset: POLL_WAIT.as_millis() as u64,
        data: Bytes::from_static(prefix),
        ..ObjectOp::new(pool, OpKind::Watch, Bytes::copy_from_slice(header))
    };
    client.submit(op, Box::new(move |result| done(matches!(result.as_deref(), Ok([1])))));
}

/// Lets writes go under sequence `seq` (the second step of `snap create`).
pub fn release(client: &Client, pool: u32, header: &[u8], seq: u64) -> Result<(), ClientError> {
    let op = ObjectOp {
        offset: RELEASED_ATTR.len() as u64,
        data: Bytes::from([RELEASED_ATTR, &seq.to_le_bytes()].concat()),
        ..ObjectOp::new(pool, OpKind::SetAttr, Bytes::copy_from_slice(header))
    };
    client.call(op).map(drop)
}

/// Waits until every watcher of `header` acknowledged snapshot sequence
/// `seq`, dropping those whose counter stood still for [`DEAD_AFTER`].
/// Returns how many acknowledged and how many were dropped.
pub fn wait_for_watchers(client: &Client, pool: u32, header: &[u8], seq: u64) -> Result<(usize, usize), ClientError> {
    let mut seen: std::collections::HashMap<Vec<u8>, (u64, Instant)> = Default::default();
    let mut dropped = 0;
    // A long poll on the watchers' attributes, out before each look: an
    // acknowledgement after the look wakes the wait below.
    let (woken, news) = crossbeam_channel::unbounded::<bool>();
    let mut polling = false;
    loop {
        if !polling {
            let woken = woken.clone();
            poll_header(client, pool, header, WATCH_PREFIX, move |result| {
                let _ = woken.send(result);
            });
            polling = true;
        }
        let attrs = match client.list_attrs(pool, header) {
            Ok(attrs) => attrs,
            Err(ClientError::NotFound) => return Ok((0, dropped)),
            Err(err) => return Err(err),
        };
        let now = Instant::now();
        let mut waiting = 0;
        let mut acked = 0;
        for (name, value) in attrs.into_iter().filter(|(name, _)| name.starts_with(WATCH_PREFIX)) {
            let Some((counter, adopted)) = decode_watch(&value) else { continue };
            if adopted >= seq {
                acked += 1;
                continue;
            }
            let since = seen.entry(name.clone()).or_insert((counter, now));
            if since.0 != counter {
                *since = (counter, now);
            }
            if now.duration_since(since.1) >= DEAD_AFTER {
                tracing::warn!(watcher = %String::from_utf8_lossy(&name), "a gateway of the image stopped renewing its watch; the snapshot goes on without it");
                match client.remove_attr(pool, header, &name) {
                    Ok(()) | Err(ClientError::NotFound) => dropped += 1,
                    Err(err) => return Err(err),
                }
                continue;
            }
            waiting += 1;
        }
        if waiting == 0 {
            return Ok((acked, dropped));
        }
        // Woken by a watcher's renewal, or look again in 50 ms anyway.
        if news.recv_timeout(Duration::from_millis(50)).is_ok() {
            polling = false;
        }
    }
}

/// The watchers of `header` still renewing: watched over `HEARTBEAT * 3`.
pub fn live_watchers(client: &Client, pool: u32, header: &[u8]) -> Result<usize, ClientError> {
    let counters = |client: &Client| -> Result<Vec<(Vec<u8>, u64)>, ClientError> {
        Ok(client
            .list_attrs(pool, header)?
            .into_iter()
            .filter(|(name, _)| name.starts_with(WATCH_PREFIX))
            .filter_map(|(name, value)| decode_watch(&value).map(|(counter, _)| (name, counter)))
            .collect())
    };
    let before = counters(client)?;
    if before.is_empty() {
        return Ok(0);
    }
    std::thread::sleep(HEARTBEAT * 3);
    let after = counters(client)?;
    Ok(after.iter().filter(|(name, counter)| before.iter().all(|(n, c)| n != name || c != counter)).count())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_released_sequence_is_read_from_the_header_attributes() {
        let watcher = (b"watch.00000000000000aa".to_vec(), encode_watch(3, 7).to_vec());
        assert_eq!(released_of(std::slice::from_ref(&watcher)), 0, "none released yet");
        let released = (RELEASED_ATTR.to_vec(), 7u64.to_le_bytes().to_vec());
        assert_eq!(released_of(&[watcher.clone(), released]), 7);
        let garbled = (RELEASED_ATTR.to_vec(), vec![1, 2, 3]);
        assert_eq!(released_of(&[watcher, garbled]), 0, "a value of another size counts as none");
    }

    #[test]
    fn watch_values_round_trip_and_reject_other_lengths() {
        assert_eq!(decode_watch(&encode_watch(7, 9)), Some((7, 9)));
        assert_eq!(decode_watch(&[0u8; 15]), None);
        const _: () = assert!(FENCE.as_millis() + HEARTBEAT.as_millis() < DEAD_AFTER.as_millis());
    }
}
