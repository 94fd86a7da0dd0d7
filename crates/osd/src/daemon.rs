//! Starting an OSD: replay the logs into the store, register with the
//! monitors, then start the flushers, the priority threads (and the pool in
//! `threading = pool`), and the admin endpoint.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use duplex_mon_client::Credentials;
use duplex_store::{Store, StoreConfig};

use crate::cluster::{boot, follow, heartbeat, heartbeat_client, MapCell, MonLink};
use crate::config::{ConnectionPolicy, OsdConfig, Threading};
use crate::flusher::Flusher;
use crate::io::event_loop::{PriorityThread, WAKER};
use crate::io::pool::{pool_worker, Pool};
use crate::messages::{Mailbox, ScrubRequests, FLUSHER_QUEUE};
use crate::metrics::{serve, Metrics};
use crate::peering::driver::PeeringDriver;
use crate::pg::replay::replay_recovered;
use crate::pg::PgTable;
use crate::shared::Shared;

/// A running OSD's addresses.
pub struct Running {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    pub shared: Arc<Shared>,
    /// Log entries replayed into the store before serving.
    pub replayed: usize,
    link: MonLink,
}

impl Running {
    /// Follows the map and heartbeats until the process ends.
    pub fn follow_forever(self) {
        let stop = Arc::new(AtomicBool::new(false));
        follow(self.link, self.shared.map.clone(), self.shared.lease.clone(), stop);
    }
}

/// Replays the logs, joins the cluster and starts serving.
pub fn start(config: OsdConfig, store_config: StoreConfig) -> Result<Running> {
    if config.priority_threads == 0 {
        bail!("at least one priority thread is needed");
    }
    if config.monitors.is_empty() {
        bail!("at least one monitor address is needed");
    }
    if config.write_path == crate::config::WritePath::Ideal {
        tracing::warn!("write_path=ideal: writes are acknowledged and thrown away, never stored; benchmark only");
    }
    let mut store = Store::open(&config.data, &store_config)
        .with_context(|| format!("opening the object store at {}", config.data.display()))?;
    let mirror = store.device().mirror().cloned();
    let pgs = Arc::new(
        PgTable::open(config.oplog_mode, &config.oplog_dir, config.oplog_pg_bytes)
            .context("opening the operation logs")?,
    );
    let recovered = pgs.recover().context("recovering the operation logs")?;
    let replayed = replay_recovered(&recovered, &mut store)?;
    tracing::info!(pgs = recovered.len(), entries = replayed, "operation logs replayed into the store");

    let listener =
        std::net::TcpListener::bind(config.listen).with_context(|| format!("listening on {}", config.listen))?;
    listener.set_nonblocking(true)?;
    let bound = listener.local_addr()?;
    let public = config.public_addr.unwrap_or(bound);
    let credentials =
        Credentials { fsid: config.fsid, secret: config.secret.clone(), name: format!("osd.{}", config.id) };
    let link = MonLink {
        monitors: config.monitors.clone(),
        credentials,
        id: config.id,
        addr: public.to_string(),
        host: config.host.clone(),
        weight: config.weight,
        heartbeat: config.heartbeat_interval,
    };
    let map = boot(&link, Duration::from_secs(30)).context("registering with the monitors")?;
    tracing::info!(epoch = map.epoch, addr = %public, "registered");
    let cell = Arc::new(MapCell::new(map));
    let metrics = Arc::new(Metrics::default());
    if let Some(mirror) = mirror.clone() {
        let _ = metrics.mirror.set(mirror);
    }

    // Priority threads' polls and mailboxes first: flushers post to them.
    let mut polls = Vec::new();
    let mut mailboxes = Vec::new();
    let mut inboxes = Vec::new();
    for _ in 0..config.priority_threads {
        let poll = mio::Poll::new()?;
        let (mailbox, inbox) = Mailbox::new(mio::Waker::new(poll.registry(), WAKER)?);
        polls.push(poll);
        mailboxes.push(mailbox);
        inboxes.push(inbox);
    }
    // Flushers and pool workers share the cores not given to priority
    // threads; which of those is idle is the OS scheduler's call.
    let shared_cores = non_priority_cores(&config.priority_cores);
    let mut flusher_senders = Vec::new();
    let scrub_requests = ScrubRequests::default();
    let device_specs =
        config.device_specs().map_err(|err| std::io::Error::new(std::io::ErrorKind::InvalidInput, err))?;
    for partition in store.into_partitions() {
        let index = partition.index();
        // Shared::flusher_of finds a PG's flusher by position: keep them in partition order.
        assert_eq!(index as usize, flusher_senders.len(), "partitions handed out out of order");
        // Bounded: a full queue blocks its producer (a priority thread, a
        // pool worker, the peering thread), which stops reading its
        // sockets meanwhile. The flusher waits on none of them, so this
        // cannot deadlock (messages.rs says why).
        let (sender, jobs) = crossbeam_channel::bounded(FLUSHER_QUEUE);
        let syncer = crate::flusher::syncer::Syncer::start(index, partition.flush_handle())?;
        let flusher = Flusher {
            id: config.id,
            partition,
            jobs,
            pgs: pgs.clone(),
            mailboxes: mailboxes.clone(),
            metrics: metrics.clone(),
            timeout: config.flush_timeout,
            scrub_requests: scrub_requests.clone(),
            repairs_asked: HashMap::new(),
            snap_heads: Default::default(),
            syncer: Some(syncer),
            device: device_specs,
            scrub_read_bytes: 0,
        };
        let cores = shared_cores.clone();
        std::thread::Builder::new().name(format!("osd-flush-{index}")).spawn(move || {
            pin_to_cores(&cores);
            let partition = flusher.run();
            if let Err(err) = partition.close() {
                tracing::error!(%err, "closing a partition");
            }
        })?;
        flusher_senders.push(sender);
    }
    let shared =
        Arc::new(Shared::new(config.clone(), pgs.clone(), cell, metrics.clone(), flusher_senders, scrub_requests));
    let _ = metrics.messenger.set(shared.messenger.clone());
    if let Some(path) = &config.admin_socket {
        let targets = crate::admin_socket::AdminTargets {
            mirror: mirror.clone(),
            messenger: Some(shared.messenger.clone()),
            qos: Some(crate::admin_socket::QosTarget {
                device: device_specs,
                views: shared.qos_views.clone(),
                map: shared.map.clone(),
                metrics: metrics.clone(),
            }),
        };
        match crate::admin_socket::serve(path, targets) {
            Ok(()) => tracing::info!(socket = %path.display(), "admin socket"),
            // The OSD serves without it; the operator is told why.
            Err(err) => tracing::error!(socket = %path.display(), %err, "no admin socket"),
        }
    }
    if config.connection_policy != ConnectionPolicy::Pinned {
        // Under lcam it places; under naive it only measures.
        let (messenger, mailboxes, interval) = (shared.messenger.clone(), mailboxes.clone(), config.lcam_interval);
        std::thread::Builder::new()
            .name("osd-lcam".into())
            .spawn(move || crate::io::messenger::run_placer(messenger, mailboxes, interval))?;
    }
    shared.watchers.connect(mailboxes.clone());
    {
        let (sender, jobs) = crossbeam_channel::bounded(crate::trimmer::TRIM_QUEUE);
        let _ = shared.snap_trims.set(sender);
        let (shared, mailboxes, cores) = (shared.clone(), mailboxes.clone(), shared_cores.clone());
        std::thread::Builder::new().name("osd-snaptrim".into()).spawn(move || {
            pin_to_cores(&cores);
            crate::trimmer::run(shared, jobs, mailboxes)
        })?;
    }
    {
        let (sender, wake) = crossbeam_channel::bounded(1);
        let _ = shared.tier_wake.set(sender);
        let (shared, cores) = (shared.clone(), shared_cores.clone());
        std::thread::Builder::new().name("osd-dedup".into()).spawn(move || {
            pin_to_cores(&cores);
            crate::tier::agent::run(shared, wake)
        })?;
    }

    let pool = if config.threading == Threading::Pool {
        let pool = Pool::start(config.pool_threads, |worker, tasks| {
            let (shared, mailboxes, cores) = (shared.clone(), mailboxes.clone(), shared_cores.clone());
            std::thread::Builder::new().name(format!("osd-pool-{worker}")).spawn(move || {
                pin_to_cores(&cores);
                pool_worker(shared, tasks, mailboxes)
            })?;
            Ok(())
        })?;
        Some(pool)
    } else {
        None
    };

    let mut listener = Some(mio::net::TcpListener::from_std(listener));
    // LALCA's Main workers are pinned when --priority-cores names the
    // cores, not by default: several OSDs sharing a host's cores lose
    // more to a pinned thread's wait for its own core than the pinning
    // saves (docs/BENCHMARKS.md, "LALCA").
    let priority_cores = config.priority_cores.clone();
    for (index, (poll, inbox)) in polls.into_iter().zip(inboxes).enumerate() {
        let thread =
            PriorityThread::new(index, shared.clone(), poll, inbox, mailboxes.clone(), listener.take(), pool.clone());
        let core = (!priority_cores.is_empty()).then(|| priority_cores[index % priority_cores.len()]);
        std::thread::Builder::new().name(format!("osd-prio-{index}")).spawn(move || {
            if let Some(core) = core {
                pin_to_cores(&[core]);
            }
            thread.run();
        })?;
    }
    let suspects = crate::suspects::watch_suspects(link.clone(), shared.map.clone())?;
    let _ = shared.suspects.set(suspects);
    // The first lease, so that the first clients are not turned away.
    heartbeat(&mut heartbeat_client(&link), config.id, &shared.lease);
    shared.serving.store(true, Ordering::Release);
    crate::cluster::report_usage(link.clone(), shared.clone(), Arc::new(AtomicBool::new(false)))?;
    let driver = PeeringDriver::new(shared.clone(), mailboxes.clone(), crate::backend::peering_for)?;
    std::thread::Builder::new()
        .name("osd-peering".into())
        .spawn(move || driver.run(Arc::new(AtomicBool::new(false))))?;

    let admin = match config.admin {
        Some(addr) => Some(serve(addr, metrics).with_context(|| format!("serving metrics on {addr}"))?),
        None => None,
    };
    Ok(Running { addr: bound, admin, shared, replayed, link })
}

/// The online cores left when `priority` ones are taken (empty: no pinning).
fn non_priority_cores(priority: &[usize]) -> Vec<usize> {
    if priority.is_empty() {
        return Vec::new();
    }
    let online = std::thread::available_parallelism().map_or(1, |n| n.get());
    let rest: Vec<usize> = (0..online).filter(|c| !priority.contains(c)).collect();
    if rest.is_empty() {
        tracing::warn!("every core is a priority core; flushers float on all of them");
    }
    rest
}

/// Restricts the calling thread to `cores` (nothing to do when empty).
fn pin_to_cores(cores: &[usize]) {
    if cores.is_empty() {
        return;
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for core in cores {
            libc::CPU_SET(*core, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            tracing::warn!(?cores, err = %std::io::Error::last_os_error(), "cannot set the thread's cores");
        }
    }
}
