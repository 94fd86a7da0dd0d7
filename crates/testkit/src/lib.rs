//! # duplex-testkit: a local cluster for tests and benchmarks
//!
//! A local cluster on loopback: one monitor inside this process, OSDs as
//! real `duplex-osd` processes (so they can be SIGKILLed). For tests, the
//! benchmark (`duplex-osd-bench`, this crate's binary), and development.
//! Every child is killed when the cluster is dropped, whatever happened.
//!
//! It is its own crate so that the OSD library does not link the monitor
//! daemon (and Raft) just to test itself.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use duplex_map::Command;
use duplex_mon_client::Credentials;
use duplex_mon_client::MonClient;

pub const FSID_HEX: &str = "00112233445566778899aabbccddeeff";
pub const SECRET: &[u8] = b"a shared cluster secret for local clusters";

pub fn fsid() -> [u8; 16] {
    duplex_proto::parse_fsid(FSID_HEX).expect("a valid constant")
}

pub fn credentials(name: &str) -> Credentials {
    Credentials { fsid: fsid(), secret: SECRET.to_vec(), name: name.into() }
}

fn free_addr() -> Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

#[derive(Clone, Debug)]
pub struct LocalOptions {
    /// The `duplex-osd` executable (or one that runs an OSD when given `osd_prefix_args`).
    pub osd_binary: PathBuf,
    /// Arguments before the OSD's flags (`["osd"]` for `duplex-osd-bench osd ...`).
    pub osd_prefix_args: Vec<String>,
    /// Where stores and the monitor's data go (a fresh temporary directory if `None`).
    pub dir: Option<PathBuf>,
    pub store_bytes: u64,
    pub store_partitions: u32,
    /// Extra `duplex-osd` flags.
    pub osd_args: Vec<String>,
    /// Show the OSDs' logs (stderr) instead of discarding them.
    pub osd_stderr: bool,
    pub monitor_grace_ms: u64,
}

pub struct LocalOsd {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// Log entries replayed into the store at start.
    pub replayed: u64,
    pub oplog_dir: PathBuf,
}

pub struct LocalCluster {
    _temp: Option<tempfile::TempDir>,
    _shm: tempfile::TempDir,
    dir: PathBuf,
    shm: PathBuf,
    pub mon: SocketAddr,
    pub osds: BTreeMap<u32, LocalOsd>,
    secret: PathBuf,
    options: LocalOptions,
}

impl Drop for LocalCluster {
    fn drop(&mut self) {
        for osd in self.osds.values_mut() {
            let _ = osd.child.kill();
            let _ = osd.child.wait();
        }
    }
}

impl LocalCluster {
    /// Starts the monitor (in this process) and `osds` OSDs, each its own host.
    pub fn start(osds: u32, options: LocalOptions) -> Result<LocalCluster> {
        if !options.osd_binary.exists() {
            bail!("{} does not exist: build it first (cargo build -p duplex-osd)", options.osd_binary.display());
        }
        let temp = match &options.dir {
            Some(_) => None,
            None => Some(tempfile::tempdir()?),
        };
        let dir = options.dir.clone().unwrap_or_else(|| temp.as_ref().expect("made above").path().to_path_buf());
        std::fs::create_dir_all(&dir)?;
        let shm = tempfile::tempdir_in("/dev/shm").or_else(|_| tempfile::tempdir())?;
        let secret = dir.join("secret");
        std::fs::write(&secret, SECRET)?;
        let mon = free_addr()?;
        let config = duplex_mon::daemon::MonConfig {
            id: 1,
            peers: [(1, mon)].into_iter().collect(),
            data_dir: dir.join(format!("mon-{}", mon.port())),
            credentials: credentials("mon.1"),
            failure: duplex_map::FailureConfig { grace_ms: options.monitor_grace_ms, ..Default::default() },
        };
        std::thread::Builder::new().name("local-mon".into()).spawn(move || {
            if let Err(err) = duplex_mon::daemon::run(config) {
                tracing::error!(%err, "the local monitor stopped");
            }
        })?;
        let shm_path = shm.path().to_path_buf();
        let mut cluster =
            LocalCluster { _temp: temp, _shm: shm, dir, shm: shm_path, mon, osds: BTreeMap::new(), secret, options };
        for id in 0..osds {
            cluster.start_osd(id)?;
        }
        Ok(cluster)
    }

    pub fn mon_client(&self) -> MonClient {
        MonClient::new(vec![(1, self.mon)], credentials("client.local"))
    }

    pub fn monitors(&self) -> Vec<(u64, SocketAddr)> {
        vec![(1, self.mon)]
    }

    pub fn create_pool(&self, name: &str, size: u8, min_size: u8, pg_num: u32) -> Result<()> {
        self.mon_client()
            .command(&Command::PoolCreate { name: name.into(), size, min_size, pg_num })
            .context("creating the pool")?;
        Ok(())
    }

    pub fn store_path(&self, id: u32) -> PathBuf {
        self.dir.join(format!("osd{id}.store"))
    }

    /// Starts (or restarts) OSD `id`; returns once it serves.
    pub fn start_osd(&mut self, id: u32) -> Result<()> {
        let oplog_dir = self.shm.join(format!("osd{id}"));
        let mut child = Process::new(&self.options.osd_binary)
            .args(&self.options.osd_prefix_args)
            .args(["--id", &id.to_string(), "--fsid", FSID_HEX, "--mon", &format!("1={}", self.mon)])
            .arg("--data")
            .arg(self.store_path(id))
            .args(["--mkfs-size", &self.options.store_bytes.to_string()])
            .args(["--mkfs-partitions", &self.options.store_partitions.to_string(), "--allow-buffered-io"])
            .arg("--oplog-dir")
            .arg(&oplog_dir)
            .arg("--secret-file")
            .arg(&self.secret)
            // Port 0: the OSD binds and reports it. A port picked here and
            // passed on could be taken meanwhile (an outgoing connection's
            // ephemeral port), and the OSD would exit at start.
            .args(["--admin", "127.0.0.1:0"])
            .args(&self.options.osd_args)
            .env("RUST_LOG", std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::piped())
            .stderr(if self.options.osd_stderr { Stdio::inherit() } else { Stdio::null() })
            .spawn()
            .with_context(|| format!("starting {}", self.options.osd_binary.display()))?;
        let stdout = child.stdout.take().context("OSD stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut line = String::new();
            let _ = BufReader::new(stdout).read_line(&mut line);
            let _ = tx.send(line);
        });
        let line = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(line) if !line.is_empty() => line,
            other => {
                let _ = child.kill();
                let _ = child.wait();
                bail!("OSD {id} did not start ({other:?}); run with osd_stderr to see why");
            }
        };
        // "duplex-osd ID serving on ADDR admin ADDR replayed N"
        let words: Vec<&str> = line.split_whitespace().collect();
        let (Some(addr), Some(admin), Some(replayed)) = (words.get(4), words.get(6), words.get(8)) else {
            bail!("unexpected OSD start line: {line}");
        };
        let osd =
            LocalOsd { child, addr: addr.parse()?, admin: admin.parse()?, replayed: replayed.parse()?, oplog_dir };
        self.osds.insert(id, osd);
        Ok(())
    }

    /// SIGKILL, and wait for the process to end.
    pub fn kill_osd(&mut self, id: u32) -> Result<()> {
        let mut osd = self.osds.remove(&id).context("no such OSD")?;
        osd.child.kill()?;
        osd.child.wait()?;
        Ok(())
    }

    /// Waits until the map shows every running OSD up and no PG pinned (no
    /// backfill under way: every acting set is its up set).
    pub fn wait_all_up(&self, timeout: Duration) -> Result<()> {
        let client = self.mon_client();
        let started = Instant::now();
        while started.elapsed() < timeout {
            if let Ok(map) = client.map(1) {
                // Up, and no PG still being backfilled onto an OSD that
                // booted after its pool was made (its acting set is final).
                if self.osds.keys().all(|id| map.osds.get(id).is_some_and(|o| o.up)) && map.pg_temp.is_empty() {
                    return Ok(());
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("OSDs not up (or PGs still backfilling) after {timeout:?}")
    }

    /// The OSD's metrics page.
    pub fn metrics(&self, id: u32) -> Result<String> {
        metrics_page(self.osds.get(&id).context("no such OSD")?.admin)
    }

    /// One request on OSD `id`'s admin socket (`<oplog dir>/admin.sock`),
    /// such as `{"command":"connections"}`: its JSON answer.
    pub fn admin_command(&self, id: u32, request: &str) -> Result<serde_json::Value> {
        admin_command(&self.osds.get(&id).context("no such OSD")?.oplog_dir.join("admin.sock"), request)
    }

    /// One metric of one OSD (the line starting with `name_and_labels `).
    pub fn metric(&self, id: u32, name_and_labels: &str) -> Result<f64> {
        Ok(metric_in(&self.metrics(id)?, name_and_labels).unwrap_or(0.0))
    }

    /// A metric summed over the running OSDs.
    pub fn metric_sum(&self, name_and_labels: &str) -> Result<f64> {
        self.osds.keys().map(|id| self.metric(*id, name_and_labels)).sum()
    }

    /// Resident memory of OSD `id` in bytes (VmRSS: heap, mapped log pages, everything).
    pub fn rss_bytes(&self, id: u32) -> Result<u64> {
        let osd = self.osds.get(&id).context("no such OSD")?;
        let status = std::fs::read_to_string(format!("/proc/{}/status", osd.child.id()))?;
        let kib = status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<u64>().ok())
            .context("no VmRSS")?;
        Ok(kib * 1024)
    }

    /// Operation-log files of OSD `id`: (their total length, the bytes
    /// actually allocated to them; tmpfs allocates a page when first written).
    pub fn oplog_bytes(&self, id: u32) -> Result<(u64, u64)> {
        let osd = self.osds.get(&id).context("no such OSD")?;
        dir_bytes(&osd.oplog_dir)
    }
}

fn dir_bytes(dir: &Path) -> Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let (mut length, mut allocated) = (0, 0);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name().to_string_lossy().ends_with(".log") {
            let meta = entry.metadata()?;
            length += meta.len();
            allocated += meta.blocks() * 512;
        }
    }
    Ok((length, allocated))
}

/// The value of the line starting with `name_and_labels ` in a metrics page.
/// A benchmark whose OSDs are its own executable, run as `BENCH osd
/// FLAGS` (one `cargo run` builds everything it needs): when this process
/// is such an OSD, runs it and returns its result; otherwise `None`.
pub fn run_as_osd_if_asked() -> Option<Result<()>> {
    if std::env::args().nth(1).as_deref() != Some("osd") {
        return None;
    }
    let argv = std::env::args().enumerate().filter(|(i, _)| *i != 1).map(|(_, a)| a);
    Some(duplex_osd::cli::run(<duplex_osd::cli::OsdArgs as clap::Parser>::parse_from(argv)))
}

/// One request on an OSD's admin socket at `socket`: its JSON answer.
pub fn admin_command(socket: &Path, request: &str) -> Result<serde_json::Value> {
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    writeln!(stream, "{request}")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    let answer: serde_json::Value = serde_json::from_str(answer.trim())?;
    if answer["ok"] != serde_json::Value::Bool(true) {
        bail!("{} refused {request}: {answer}", socket.display());
    }
    Ok(answer)
}

/// The metrics page an OSD serves on `admin` (its `--admin` address).
pub fn metrics_page(admin: SocketAddr) -> Result<String> {
    let mut stream = TcpStream::connect(admin)?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
    let mut body = String::new();
    stream.read_to_string(&mut body)?;
    Ok(body)
}

pub fn metric_in(page: &str, name_and_labels: &str) -> Option<f64> {
    page.lines().find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.trim().parse::<f64>().ok()))
}
