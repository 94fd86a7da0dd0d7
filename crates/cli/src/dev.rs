//! `duplex dev up|down`: a whole cluster on this machine, in one command.
//!
//! Everything lives under one directory: the secret, a TOML configuration
//! per daemon, the monitor's data, each OSD's store (a file), the daemons'
//! logs, `client.toml` for clients, and `state.json` naming the processes
//! started (so that `down` stops exactly those). Operation logs are on
//! tmpfs (`/dev/shm`, survives a daemon crash, not a reboot), in
//! directories `state.json` also records.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use duplex_map::Command as MapCommand;
use duplex_mon_client::Credentials;
use duplex_mon_client::MonClient;

use duplex_store::units::format_size;

#[derive(Clone, Debug, clap::Args)]
pub struct UpArgs {
    /// OSD processes to start.
    #[arg(long, default_value_t = 3)]
    pub osds: u32,
    /// Monitor processes (Raft: 3 survive the loss of one).
    #[arg(long, default_value_t = 1)]
    pub monitors: u32,
    /// Copies of each object (the pool's size).
    #[arg(long, default_value_t = 2)]
    pub replicas: u8,
    /// Copies that must be up for writes (default: replicas − replicas/2, as Ceph).
    #[arg(long)]
    pub min_size: Option<u8>,
    /// The pool to create.
    #[arg(long, default_value = "rbd")]
    pub pool: String,
    /// Placement groups in the pool.
    #[arg(long, default_value_t = 32)]
    pub pg_num: u32,
    /// Size of each OSD's store file.
    #[arg(long, default_value = "2G", value_parser = duplex_store::units::parse_size)]
    pub osd_size: u64,
    /// Operation log per PG (bytes).
    #[arg(long, default_value = "1M", value_parser = duplex_store::units::parse_size)]
    pub oplog_pg_bytes: u64,
    /// Any other OSD setting, as KEY=VALUE where KEY is a `duplex osd` flag
    /// (repeatable): e.g. --osd-set write_path=sync --osd-set flush_threshold=4;
    /// `{id}` in VALUE is each OSD's id (--osd-set oplog_dir=/logs/osd{id}).
    #[arg(long = "osd-set", value_name = "KEY=VALUE")]
    pub osd_settings: Vec<String>,
    /// Put each OSD's store on a mirrored pair of files, used this way
    /// (read-flush-split or plain: docs/STORE.md, "Mirrored devices").
    #[arg(long, value_name = "MODE")]
    pub mirror: Option<String>,
    /// The address monitors and OSDs listen on (the fault tests run
    /// clusters inside network namespaces).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: IpAddr,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct State {
    pub fsid: String,
    pub pool: String,
    pub processes: Vec<Process>,
    /// Directories outside the cluster directory that `down --wipe` removes.
    pub oplog_dirs: Vec<PathBuf>,
}

#[derive(Debug, serde::Serialize, serde::Deserialize)]
pub struct Process {
    pub name: String,
    pub pid: u32,
}

pub fn state_path(dir: &Path) -> PathBuf {
    dir.join("state.json")
}

pub fn read_state(dir: &Path) -> Result<Option<State>> {
    let path = state_path(dir);
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
    Ok(Some(serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))?))
}

/// Whether `process` is alive and is the daemon we started: one of its
/// arguments is exactly its configuration file in `dir` (a recycled pid
/// belongs to someone else, and so does a `tail -f` of a log in `dir`).
fn is_ours(process: &Process, dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    if process.pid == 0 || i32::try_from(process.pid).is_err() {
        return false; // kill(0) or kill(-1) would signal whole groups
    }
    let Ok(cmdline) = std::fs::read(format!("/proc/{}/cmdline", process.pid)) else { return false };
    let conf = dir.join(format!("{}.toml", process.name));
    cmdline.split(|b| *b == 0).any(|arg| arg == conf.as_os_str().as_bytes())
}

/// The state of the cluster in `dir`, if any of its processes runs.
pub fn running(dir: &Path) -> Result<Option<State>> {
    let Ok(dir) = dir.canonicalize() else { return Ok(None) };
    Ok(read_state(&dir)?.filter(|state| state.processes.iter().any(|p| is_ours(p, &dir))))
}

fn free_port(ip: IpAddr) -> Result<u16> {
    Ok(TcpListener::bind((ip, 0)).with_context(|| format!("finding a free port on {ip}"))?.local_addr()?.port())
}

fn random_hex(bytes: usize) -> String {
    (0..bytes).map(|_| format!("{:02x}", rand::random::<u8>())).collect()
}

/// Starts `duplex <args>` detached (its own process group, so a Ctrl-C on
/// this command does not reach it), output to `log`.
fn spawn_daemon(dir: &Path, name: &str, args: &[&str]) -> Result<Process> {
    let exe = std::env::current_exe().context("finding the duplex executable")?;
    let log_path = dir.join(format!("{name}.log"));
    let log = OpenOptions::new().create(true).append(true).open(&log_path)?;
    let child = Command::new(&exe)
        .args(args)
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting {name}"))?;
    Ok(Process { name: name.into(), pid: child.id() })
}

fn write_file(path: &Path, text: &str) -> Result<()> {
    let mut file = File::create(path).with_context(|| format!("writing {}", path.display()))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

/// The cluster secret: readable by its owner only.
fn write_secret(path: &Path, text: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    use std::os::unix::fs::PermissionsExt;
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    // A file left by an earlier attempt keeps its mode: set it.
    file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    file.write_all(text.as_bytes())?;
    Ok(())
}

pub fn up(dir: &Path, args: &UpArgs) -> Result<State> {
    if args.monitors == 0 || args.monitors > 7 {
        bail!("need 1 to 7 monitors (got {})", args.monitors);
    }
    if args.osds == 0 || args.replicas == 0 || args.replicas as u32 > args.osds {
        bail!("need at least one OSD and 1 ≤ replicas ≤ OSDs (got {} OSDs, {} replicas)", args.osds, args.replicas);
    }
    if args.min_size.is_some_and(|m| m == 0 || m > args.replicas) {
        bail!("need 1 ≤ min_size ≤ replicas (got min_size {:?}, {} replicas)", args.min_size, args.replicas);
    }
    if let Some(state) = running(dir)? {
        bail!(
            "a cluster is already running in {} ({} processes); stop it with `duplex dev down --dir {}`",
            dir.display(),
            state.processes.len(),
            dir.display()
        );
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    let dir = dir.as_path();
    // A previous cluster's leftovers would be mistaken for this one's.
    for stale in ["mon.1", "state.json"] {
        let path = dir.join(stale);
        if path.exists() {
            bail!(
                "{} holds a stopped cluster; remove it with `duplex dev down --wipe --dir {}`",
                dir.display(),
                dir.display()
            );
        }
    }
    let fsid = random_hex(16);
    write_secret(&dir.join("secret"), &random_hex(32))?;
    let mut monitors = Vec::new();
    for id in 1..=args.monitors as u64 {
        let addr = SocketAddr::new(args.bind, free_port(args.bind)?);
        monitors.push((id, addr));
    }
    let mon_lines: Vec<String> = monitors.iter().map(|(id, addr)| format!("{id}={addr}")).collect();
    let mon_list = mon_lines.iter().map(|l| format!("\"{l}\"")).collect::<Vec<_>>().join(", ");
    let common = format!("fsid = \"{fsid}\"\nsecret_file = \"{}\"\n", dir.join("secret").display());
    let mut state =
        State { fsid: fsid.clone(), pool: args.pool.clone(), processes: Vec::new(), oplog_dirs: Vec::new() };
    let save =
        |state: &State| write_file(&state_path(dir), &serde_json::to_string_pretty(state).expect("serializable"));
    for (id, _) in &monitors {
        let name = format!("mon.{id}");
        let mon_conf = dir.join(format!("{name}.toml"));
        write_file(
            &mon_conf,
            &format!("id = {id}\npeer = [{mon_list}]\ndata_dir = \"{}\"\n{common}", dir.join(&name).display()),
        )?;
        state.processes.push(spawn_daemon(dir, &name, &["mon", "--config", &mon_conf.to_string_lossy()])?);
        save(&state)?;
    }

    let secret = std::fs::read(dir.join("secret"))?;
    let fsid_bytes = duplex_proto::parse_fsid(&fsid).expect("generated above");
    let credentials = Credentials { fsid: fsid_bytes, secret, name: "client.admin".into() };
    let mut mon = MonClient::new(monitors.clone(), credentials);
    let ids: Vec<u64> = monitors.iter().map(|(id, _)| *id).collect();
    wait_for("the monitors to elect a leader", Duration::from_secs(30), || {
        ids.iter().any(|id| mon.status(*id).is_ok_and(|(leader, _, _)| leader.is_some()))
    })?;

    for id in 0..args.osds {
        let name = format!("osd.{id}");
        let osd_dir = dir.join(&name);
        std::fs::create_dir_all(&osd_dir)?;
        let oplog_dir = PathBuf::from(format!("/dev/shm/duplex-{}-{name}", &fsid[..12]));
        let conf = dir.join(format!("{name}.toml"));
        write_osd_config(
            &conf,
            &format!(
                "id = {id}\ndata = {}\nmkfs_size = {}\nallow_buffered_io = true\noplog_mode = \"shm\"\n\
                 oplog_dir = \"{}\"\noplog_pg_bytes = {}\nmon = [{mon_list}]\nlisten = \"{}\"\n\
                 admin = \"127.0.0.1:0\"\nadmin_socket = \"{}\"\n# One host per OSD, so replicas spread over OSDs.\nhost = \"local-{id}\"\n{common}",
                match &args.mirror {
                    None => format!("\"{}\"", osd_dir.join("store.img").display()),
                    Some(mode) => format!(
                        "[\"{}\", \"{}\"]\ndata_mirror = \"{mode}\"",
                        osd_dir.join("store.img").display(),
                        osd_dir.join("store-mirror.img").display()
                    ),
                },
                args.osd_size,
                oplog_dir.display(),
                args.oplog_pg_bytes,
                SocketAddr::new(args.bind, 0),
                osd_dir.join("admin.sock").display(),
            ),
            // "{id}" in a setting is this OSD's id (a directory of its own).
            &args.osd_settings.iter().map(|setting| setting.replace("{id}", &id.to_string())).collect::<Vec<_>>(),
        )?;
        state.oplog_dirs.push(oplog_dir);
        state.processes.push(spawn_daemon(dir, &name, &["osd", "--config", &conf.to_string_lossy()])?);
        save(&state)?;
    }
    let wanted = args.osds as usize;
    wait_for("every OSD to boot", Duration::from_secs(60), || {
        map_from_any(&mon, &ids).is_some_and(|map| map.osds.values().filter(|o| o.up).count() >= wanted)
    })
    .with_context(|| format!("see the logs in {}", dir.display()))?;

    let size = args.replicas;
    let min_size = args.min_size.unwrap_or(size - size / 2);
    crate::admin::run_command(
        &mut mon,
        MapCommand::PoolCreate { name: args.pool.clone(), size, min_size, pg_num: args.pg_num },
    )
    .with_context(|| format!("creating pool '{}'", args.pool))?;
    write_file(
        &dir.join("client.toml"),
        &format!(
            "# How clients reach this cluster (duplex --conf, or DUPLEX_CONF).\nfsid = \"{fsid}\"\nsecret_file = \"secret\"\nmonitors = [{mon_list}]\n"
        ),
    )?;
    save(&state)?;
    println!(
        "cluster up in {}: {} monitor(s) at {}, {} OSDs of {} each, pool '{}' ({} replicas, {} PGs)",
        dir.display(),
        monitors.len(),
        mon_lines.join(" "),
        args.osds,
        format_size(args.osd_size),
        args.pool,
        args.replicas,
        args.pg_num
    );
    Ok(state)
}

/// Writes an OSD's configuration: `base` (TOML) with `settings`
/// (KEY=VALUE) applied on top, checked by the OSD's own flag parser so
/// that a typo fails here, not in a daemon's log.
fn write_osd_config(path: &Path, base: &str, settings: &[String]) -> Result<()> {
    let mut table: toml::Table = toml::from_str(base).with_context(|| format!("parsing {}", path.display()))?;
    for setting in settings {
        let (key, value) = setting
            .split_once('=')
            .with_context(|| format!("--osd-set {setting}: expected KEY=VALUE (a `duplex osd` flag name)"))?;
        let key = key.trim().trim_start_matches("--").replace('-', "_");
        table.insert(key, toml_value(value.trim()));
    }
    let text = toml::to_string(&table).context("serializing an OSD configuration")?;
    let candidate = path.with_extension("toml.new");
    write_file(&candidate, &text)?;
    if let Err(err) = crate::daemons::parse_with_config::<duplex_osd::cli::OsdArgs>("duplex osd", Some(&candidate), &[])
    {
        let _ = std::fs::remove_file(&candidate);
        return Err(err.context(format!("the OSD configuration {} is not valid", path.display())));
    }
    std::fs::rename(&candidate, path).with_context(|| format!("replacing {}", path.display()))?;
    Ok(())
}

/// A command-line value as TOML: a number or boolean when it reads as
/// one, a list when it is one in TOML (`data=["a.img","b.img"]`).
fn toml_value(text: &str) -> toml::Value {
    if text.starts_with('[') {
        if let Some(list) = toml::from_str::<toml::Table>(&format!("v = {text}")).ok().and_then(|mut t| t.remove("v")) {
            return list;
        }
    }
    if let Ok(i) = text.parse::<i64>() {
        toml::Value::Integer(i)
    } else if let Ok(b) = text.parse::<bool>() {
        toml::Value::Boolean(b)
    } else {
        toml::Value::String(text.to_string())
    }
}

/// The map from whichever monitor answers first.
fn map_from_any(mon: &MonClient, ids: &[u64]) -> Option<duplex_map::ClusterMap> {
    ids.iter().find_map(|id| mon.map(*id).ok())
}

/// A monitor client as the cluster's `client.toml` describes it, and the monitors' ids.
fn admin_client(dir: &Path) -> Result<(MonClient, Vec<u64>)> {
    let config = duplex_client::ClientConfig::from_file(&dir.join("client.toml"))?;
    let ids = config.monitors.iter().map(|(id, _)| *id).collect();
    Ok((MonClient::new(config.monitors, config.credentials), ids))
}

/// Stops `process` (SIGTERM, then SIGKILL after 5 s) if it is still ours.
fn stop_process(process: &Process, dir: &Path) -> bool {
    if !is_ours(process, dir) {
        return false;
    }
    // SAFETY: kill(2) on a pid we started and just checked is ours.
    unsafe { libc::kill(process.pid as i32, libc::SIGTERM) };
    let started = Instant::now();
    while is_ours(process, dir) && started.elapsed() < Duration::from_secs(5) {
        reap(process.pid);
        std::thread::sleep(Duration::from_millis(20));
    }
    if is_ours(process, dir) {
        // SAFETY: as above.
        unsafe { libc::kill(process.pid as i32, libc::SIGKILL) };
        reap(process.pid);
    }
    true
}

/// `duplex dev restart`: restarts every OSD, or those in `only` (with
/// `settings` applied to their configurations), keeping the data, the logs
/// and the monitor, and waits until each is back in the map at its new
/// address. An OSD that is not running (killed) is started again. Each OSD
/// replays its operation log when it starts.
pub fn restart(dir: &Path, settings: &[String], only: &[u32]) -> Result<()> {
    let Some(mut state) = running(dir)? else {
        bail!("no cluster runs in {}; start one with `duplex dev up --dir {}`", dir.display(), dir.display());
    };
    let dir = dir.canonicalize()?;
    let dir = dir.as_path();
    let (mon, ids) = admin_client(dir)?;
    let before = map_from_any(&mon, &ids).context("no monitor answered with the map")?;
    // The id of an OSD process to restart.
    let chosen = |name: &str| {
        name.strip_prefix("osd.")
            .and_then(|id| id.parse::<u32>().ok())
            .filter(|id| only.is_empty() || only.contains(id))
    };
    for id in only {
        if !state.processes.iter().any(|p| p.name == format!("osd.{id}")) {
            bail!("this cluster has no osd.{id}");
        }
    }
    // Every configuration is checked before any OSD stops.
    for process in state.processes.iter().filter(|p| chosen(&p.name).is_some()) {
        let conf = dir.join(format!("{}.toml", process.name));
        let base = std::fs::read_to_string(&conf).with_context(|| format!("reading {}", conf.display()))?;
        write_osd_config(&conf, &base, settings)?;
    }
    let mut restarted = Vec::new();
    for index in 0..state.processes.len() {
        let Some(id) = chosen(&state.processes[index].name) else { continue };
        let process = &mut state.processes[index];
        let conf = dir.join(format!("{}.toml", process.name));
        stop_process(process, dir);
        *process = spawn_daemon(dir, &process.name, &["osd", "--config", &conf.to_string_lossy()])?;
        // Recorded at once, so that `down` can stop it whatever fails next.
        write_file(&state_path(dir), &serde_json::to_string_pretty(&state).expect("serializable"))?;
        restarted.push(id);
    }
    wait_for("every OSD to come back", Duration::from_secs(60), || {
        map_from_any(&mon, &ids).is_some_and(|map| {
            restarted.iter().all(|id| {
                let old = before.osds.get(id).map(|o| o.addr.as_str());
                map.osds.get(id).is_some_and(|o| o.up && Some(o.addr.as_str()) != old)
            })
        })
    })
    .with_context(|| format!("see the logs in {}", dir.display()))?;
    println!("restarted {} OSDs in {}", restarted.len(), dir.display());
    Ok(())
}

/// Adds one OSD to a running dev cluster, configured like osd.0 (its own
/// store and log), and waits until the map has it up. Its PGs' primaries
/// then backfill it.
pub fn add_osd(dir: &Path) -> Result<u32> {
    let Some(mut state) = running(dir)? else {
        bail!("no cluster runs in {}; start one with `duplex dev up --dir {}`", dir.display(), dir.display());
    };
    let dir = dir.canonicalize()?;
    let dir = dir.as_path();
    let (mon, ids) = admin_client(dir)?;
    let ids_in_use: Vec<u32> =
        state.processes.iter().filter_map(|p| p.name.strip_prefix("osd.")?.parse().ok()).collect();
    let id = ids_in_use.iter().max().map_or(0, |max| max + 1);
    let name = format!("osd.{id}");
    let template = dir.join("osd.0.toml");
    let text = std::fs::read_to_string(&template).with_context(|| format!("reading {}", template.display()))?;
    let mut table: toml::Table = toml::from_str(&text).with_context(|| format!("parsing {}", template.display()))?;
    let osd_dir = dir.join(&name);
    std::fs::create_dir_all(&osd_dir)?;
    let oplog_dir = PathBuf::from(format!("/dev/shm/duplex-{}-{name}", &state.fsid[..12]));
    table.insert("id".into(), toml::Value::Integer(id.into()));
    table.insert("data".into(), toml::Value::String(osd_dir.join("store.img").to_string_lossy().into_owned()));
    table.insert("oplog_dir".into(), toml::Value::String(oplog_dir.to_string_lossy().into_owned()));
    table.insert("host".into(), toml::Value::String(format!("local-{id}")));
    table.insert("admin_socket".into(), toml::Value::String(osd_dir.join("admin.sock").to_string_lossy().into_owned()));
    let conf = dir.join(format!("{name}.toml"));
    write_osd_config(&conf, &toml::to_string(&table).context("serializing an OSD configuration")?, &[])?;
    state.oplog_dirs.push(oplog_dir);
    state.processes.push(spawn_daemon(dir, &name, &["osd", "--config", &conf.to_string_lossy()])?);
    write_file(&state_path(dir), &serde_json::to_string_pretty(&state).expect("serializable"))?;
    wait_for(&format!("{name} to boot"), Duration::from_secs(60), || {
        map_from_any(&mon, &ids).is_some_and(|map| map.osds.get(&id).is_some_and(|o| o.up))
    })
    .with_context(|| format!("see {}", dir.join(format!("{name}.log")).display()))?;
    println!("added {name} to the cluster in {}", dir.display());
    Ok(id)
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) -> Result<()> {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if ready() {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("timed out after {timeout:?} waiting for {what}")
}

pub fn down(dir: &Path, wipe: bool) -> Result<()> {
    let Some(state) = read_state(dir)? else {
        if wipe && dir.exists() {
            bail!("{} has no state.json: not a `duplex dev` directory, not removing it", dir.display());
        }
        println!("no cluster in {}", dir.display());
        return Ok(());
    };
    let dir = dir.canonicalize()?;
    let mut stopped = 0;
    // OSDs first, the monitor last, so none is marked down needlessly.
    for process in state.processes.iter().rev() {
        if stop_process(process, &dir) {
            stopped += 1;
        }
    }
    println!("stopped {stopped} processes");
    if wipe {
        for oplog in &state.oplog_dirs {
            // Only the logs `up` made: /dev/shm/duplex-* (state.json could be edited).
            let ours = oplog.parent() == Some(Path::new("/dev/shm"))
                && oplog.file_name().is_some_and(|n| n.to_string_lossy().starts_with("duplex-"));
            if ours && oplog.exists() {
                std::fs::remove_dir_all(oplog).with_context(|| format!("removing {}", oplog.display()))?;
            }
        }
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        println!("removed {}", dir.display());
    }
    Ok(())
}

/// Collects the exit status if `pid` is our child (when `up` and `down` run
/// in one process, as in tests); harmless otherwise.
fn reap(pid: u32) {
    let mut status = 0;
    // SAFETY: waitpid with WNOHANG on a pid; no memory is shared.
    unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) };
}
