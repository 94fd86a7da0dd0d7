//! This OSD's view of the cluster: the current map, shared by every
//! thread, kept current by the monitor thread (registration, heartbeats,
//! map subscription).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use duplex_map::{ClusterMap, Command, OsdId, Pool};
use duplex_mon_client::MonClient;
use duplex_mon_client::{Credentials, MonMessage, WireOutcome};
use duplex_placement::Hierarchy;

pub struct MapView {
    pub map: ClusterMap,
    pub hierarchy: Hierarchy,
    /// The OSDs the map has full: computed once per map, so that a write's
    /// admission looks at nothing when none is (the usual case).
    pub full_osds: Vec<OsdId>,
}

impl MapView {
    pub fn new(map: ClusterMap) -> MapView {
        let hierarchy = map.hierarchy();
        let full_osds =
            map.osds.values().filter(|osd| osd.fullness == duplex_map::Fullness::Full).map(|osd| osd.id).collect();
        MapView { map, hierarchy, full_osds }
    }

    pub fn epoch(&self) -> u64 {
        self.map.epoch
    }

    pub fn pool(&self, id: u32) -> Option<&Pool> {
        self.map.pools.get(&id)
    }

    pub fn addr_of(&self, osd: OsdId) -> Option<SocketAddr> {
        self.map.osds.get(&osd).and_then(|o| o.addr.parse().ok())
    }
}

/// The map every thread reads: a lock around an `Arc`, plus its epoch in an
/// atomic so a thread's cached copy is checked without taking the lock.
pub struct MapCell {
    epoch: AtomicU64,
    view: RwLock<Arc<MapView>>,
}

impl MapCell {
    pub fn new(map: ClusterMap) -> MapCell {
        MapCell { epoch: AtomicU64::new(map.epoch), view: RwLock::new(Arc::new(MapView::new(map))) }
    }

    pub fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    pub fn load(&self) -> Arc<MapView> {
        self.view.read().expect("map lock").clone()
    }

    pub fn store(&self, map: ClusterMap) {
        let epoch = map.epoch;
        *self.view.write().expect("map lock") = Arc::new(MapView::new(map));
        self.epoch.store(epoch, Ordering::Release);
    }
}

/// A thread's cached map and acting sets, refreshed when the epoch moves.
pub struct ActingCache {
    view: Arc<MapView>,
    acting: HashMap<(u32, u32), Arc<[OsdId]>>,
}

impl ActingCache {
    pub fn new(cell: &MapCell) -> ActingCache {
        ActingCache { view: cell.load(), acting: HashMap::new() }
    }

    /// The current map (reloaded if the cell moved on).
    pub fn view(&mut self, cell: &MapCell) -> &Arc<MapView> {
        if cell.epoch() != self.view.epoch() {
            self.view = cell.load();
            self.acting.clear();
        }
        &self.view
    }

    /// The acting set of (pool, pg) at the cached epoch; `None` if the pool does not exist.
    pub fn acting(&mut self, cell: &MapCell, pool: u32, pg: u32) -> Option<Arc<[OsdId]>> {
        let view = self.view(cell).clone();
        if let Some(set) = self.acting.get(&(pool, pg)) {
            return Some(set.clone());
        }
        let pool_info = view.pool(pool)?;
        let set: Arc<[OsdId]> = view.map.acting(&view.hierarchy, pool_info, pg).into();
        self.acting.insert((pool, pg), set.clone());
        Some(set)
    }
}

/// This OSD's lease from the monitors: it serves clients only while it
/// holds one (duplex_map::failure explains why the monitors never make a
/// new primary while it may still run). Each acknowledged heartbeat renews
/// it, counted from when the heartbeat was sent; a map that says this OSD
/// is down revokes it at once.
pub struct Lease {
    origin: Instant,
    /// Milliseconds from `origin` until which the lease runs.
    until_ms: AtomicU64,
    /// Heartbeats sent before this (ms from `origin`) no longer renew it.
    revoked_ms: AtomicU64,
}

impl Default for Lease {
    fn default() -> Self {
        Lease { origin: Instant::now(), until_ms: AtomicU64::new(0), revoked_ms: AtomicU64::new(0) }
    }
}

impl Lease {
    fn ms_since_origin(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_millis() as u64
    }

    /// Whether this OSD may serve clients now.
    pub fn holds(&self) -> bool {
        self.ms_since_origin(Instant::now()) < self.until_ms.load(Ordering::Acquire)
    }

    /// A heartbeat sent at `sent` was answered with a lease of `length`.
    pub fn renew(&self, sent: Instant, length: Duration) {
        let sent_ms = self.ms_since_origin(sent);
        if length.is_zero() || sent_ms < self.revoked_ms.load(Ordering::Acquire) {
            return;
        }
        // Saturating: the length comes off the wire.
        let until = sent_ms.saturating_add(u64::try_from(length.as_millis()).unwrap_or(u64::MAX));
        self.until_ms.fetch_max(until, Ordering::AcqRel);
    }

    /// Ends the lease now; only heartbeats sent from now on renew it.
    pub fn revoke(&self) {
        // A heartbeat sent in this same millisecond may have been answered
        // before the monitor saw the map: it must not count.
        self.revoked_ms.store(self.ms_since_origin(Instant::now()) + 1, Ordering::Release);
        self.until_ms.store(0, Ordering::Release);
    }
}

/// Sends one heartbeat and renews `lease` with its answer.
pub fn heartbeat(client: &mut MonClient, id: OsdId, lease: &Lease) {
    let sent = Instant::now();
    match client.heartbeat(id) {
        Ok(length) if length.is_zero() => tracing::debug!("the monitor granted no lease (this OSD is down in its map)"),
        Ok(length) => lease.renew(sent, length),
        Err(err) => tracing::warn!(%err, "heartbeat not delivered"),
    }
}

/// What the monitor thread needs.
#[derive(Clone)]
pub struct MonLink {
    pub monitors: Vec<(u64, SocketAddr)>,
    pub credentials: Credentials,
    pub id: OsdId,
    pub addr: String,
    pub host: String,
    pub weight: u32,
    pub heartbeat: Duration,
}

/// Registers with the monitors (retrying until they answer), returns the map.
/// A map that shows this OSD down after its boot committed (a verdict on
/// the process before it, or a grace that ran out meanwhile) gets a new
/// boot, at most once a second, as Ceph's "wrongly marked me down" does.
pub fn boot(link: &MonLink, give_up_after: Duration) -> anyhow::Result<ClusterMap> {
    let started = Instant::now();
    loop {
        let mut client = MonClient::new(link.monitors.clone(), link.credentials.clone());
        client.timeout = give_up_after.saturating_sub(started.elapsed()).max(Duration::from_secs(1));
        let command =
            Command::OsdBoot { id: link.id, addr: link.addr.clone(), host: link.host.clone(), weight: link.weight };
        let booted_at = match client.command(&command)? {
            WireOutcome::Applied { epoch } | WireOutcome::Unchanged { epoch } => epoch,
            WireOutcome::Refused(why) => anyhow::bail!("the monitor refused this OSD's boot: {why}"),
        };
        let left = give_up_after.saturating_sub(started.elapsed());
        match fetch_map(link, left, booted_at)? {
            Some(map) => return Ok(map),
            None if started.elapsed() >= give_up_after => {
                anyhow::bail!("every boot within {give_up_after:?} was followed by a map with this OSD down")
            }
            None => {
                tracing::warn!(booted_at, "a map after this OSD's boot shows it down; booting again");
                std::thread::sleep(Duration::from_secs(1));
            }
        }
    }
}

/// A map with this OSD up; `None` if one at or after `booted_at` shows it
/// down (it must boot again).
fn fetch_map(link: &MonLink, give_up_after: Duration, booted_at: u64) -> anyhow::Result<Option<ClusterMap>> {
    let client = MonClient::new(link.monitors.clone(), link.credentials.clone());
    let started = Instant::now();
    loop {
        for (id, _) in &link.monitors {
            if let Ok(map) = client.map(*id) {
                match map.osds.get(&link.id) {
                    Some(osd) if osd.up => return Ok(Some(map)),
                    Some(_) if map.epoch > booted_at => return Ok(None),
                    _ => {}
                }
            }
        }
        if started.elapsed() > give_up_after {
            anyhow::bail!("no monitor returned a map with this OSD up within {give_up_after:?}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A monitor client for heartbeats: it gives up within one interval.
pub fn heartbeat_client(link: &MonLink) -> MonClient {
    let mut client = MonClient::new(link.monitors.clone(), link.credentials.clone());
    client.timeout = link.heartbeat.max(Duration::from_millis(500));
    client
}

/// Until `stop`: heartbeats to the leader (its own thread), renewing
/// `lease`, and follows the map into `cell`. If the map says this OSD is
/// down while it runs (a heartbeat was late), its lease ends and it boots
/// again.
pub fn follow(link: MonLink, cell: Arc<MapCell>, lease: Arc<Lease>, stop: Arc<AtomicBool>) {
    let beat = link.clone();
    let beat_stop = stop.clone();
    let beat_lease = lease.clone();
    let spawned = std::thread::Builder::new().name("osd-heartbeat".into()).spawn(move || {
        let mut client = heartbeat_client(&beat);
        // One connection for the process's life: when the process dies,
        // the monitor sees it close and probes the OSD's port (issue 24).
        client.keep_connection = true;
        while !beat_stop.load(Ordering::Relaxed) {
            heartbeat(&mut client, beat.id, &beat_lease);
            std::thread::sleep(beat.heartbeat);
        }
    });
    if let Err(err) = spawned {
        tracing::error!(%err, "cannot start the heartbeat thread");
    }
    let client = MonClient::new(link.monitors.clone(), link.credentials.clone());
    let from = cell.load().map.clone();
    client.follow(from, &stop, Duration::from_millis(500), |map| {
        let me_up = map.osds.get(&link.id).is_some_and(|o| o.up);
        tracing::info!(epoch = map.epoch, "new map");
        cell.store(map.clone());
        if !me_up {
            lease.revoke();
            tracing::warn!("the map says this OSD is down; booting again");
            if let Err(err) = boot(&link, Duration::from_secs(10)) {
                tracing::error!(%err, "re-boot failed");
            }
        }
        true
    });
}

/// How often the OSD reports what its store holds to the monitors.
pub const USAGE_REPORT_EVERY: Duration = Duration::from_millis(500);

/// Until `stop`: reports what this OSD's store holds to the leader twice a
/// second (its own thread), for the balancer: the store's capacity, its
/// fullness against the full ratio (current), and each PG's bytes (each
/// partition's flusher walks its index at most once a second, so those
/// may be a second old).
pub fn report_usage(link: MonLink, shared: Arc<crate::shared::Shared>, stop: Arc<AtomicBool>) -> std::io::Result<()> {
    std::thread::Builder::new().name("osd-usage".into()).spawn(move || {
        let mut client = heartbeat_client(&link);
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(USAGE_REPORT_EVERY);
            let Some(report) = usage_report(&shared) else { continue };
            if let Err(err) = client.notify(&report) {
                tracing::debug!(%err, "usage report not delivered");
            }
        }
    })?;
    Ok(())
}

/// This OSD's usage report, from every partition (None: one did not answer in time).
fn usage_report(shared: &crate::shared::Shared) -> Option<MonMessage> {
    let mut pgs = Vec::new();
    for flusher in &shared.flushers {
        let (sender, receiver) = crossbeam_channel::bounded(1);
        flusher.try_send(crate::messages::Job::Usage(crate::messages::UsageTo::Local(sender))).ok()?;
        let reply = receiver.recv_timeout(USAGE_REPORT_EVERY).ok()?;
        for pg in reply.pgs {
            let pool = crate::pg::pool_of(pg.pg);
            if pool != 0 {
                pgs.push((pool, crate::pg::pg_number(pg.pg), pg.allocated_bytes));
            }
        }
    }
    let metrics = &shared.metrics;
    Some(MonMessage::UsageReport {
        osd: shared.config.id,
        capacity_bytes: metrics.store_capacity_bytes.load(Ordering::Relaxed),
        used_permille: metrics.fullness_permille(),
        pgs,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_from_the_send_and_a_revocation_outlasts_older_answers() {
        let lease = Lease::default();
        assert!(!lease.holds(), "none before the first answer");
        let sent = Instant::now();
        lease.renew(sent, Duration::ZERO);
        assert!(!lease.holds(), "a zero lease grants nothing");
        lease.renew(sent, Duration::from_secs(60));
        assert!(lease.holds());
        lease.revoke();
        assert!(!lease.holds());
        lease.renew(sent, Duration::from_secs(60));
        assert!(!lease.holds(), "an answer to a heartbeat sent before the revocation does not count");
        std::thread::sleep(Duration::from_millis(2));
        lease.renew(Instant::now(), Duration::MAX);
        assert!(lease.holds(), "a later heartbeat renews it; an absurd length saturates instead of overflowing");
    }
}
