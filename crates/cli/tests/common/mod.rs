//! A local cluster for tests, started and stopped with the `duplex` binary
//! itself (`dev up` / `dev down --wipe`), and NBD servers it runs.

#![allow(dead_code)]

pub mod metrics;
pub mod netns;
pub mod workload;

#[allow(unused_imports)] // each test crate uses a part
pub use metrics::{osds, scrape, Osd};

use std::cell::Cell;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

pub fn duplex() -> Command {
    Command::new(env!("CARGO_BIN_EXE_duplex"))
}

/// Runs a command; panics with its output unless it succeeds.
pub fn run_ok(command: &mut Command) -> Output {
    let output = command.output().unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// Fails loudly when a tool the test needs is missing: CI installs them
/// (scripts/test-all), and a silent skip would hide a broken install.
/// Runs qemu-io's `commands` on a raw image at `uri`; panics if one fails.
pub fn qemu_io(uri: &str, commands: &[&str]) {
    let mut command = Command::new("qemu-io");
    command.args(["-f", "raw"]);
    for c in commands {
        command.arg("-c").arg(c);
    }
    let output = run_ok(command.arg(uri));
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(!text.contains("failed") && !text.contains("error"), "qemu-io {commands:?}:\n{text}");
}

pub fn require_tool(tool: &str) {
    let found =
        Command::new("sh").arg("-c").arg(format!("command -v {tool}")).output().is_ok_and(|o| o.status.success());
    assert!(found, "{tool} is not installed: run ./scripts/test-all, which installs fio, qemu-utils and libnbd-bin");
}

/// Tests whose figures are timings (a failover bound, a stall bound) run
/// alone: on a 2-core machine a second cluster beside them measures the
/// machine, not Duplex. Every other cluster of this test binary holds the
/// lock shared; a timing test holds it whole ([`alone`]).
static CLUSTERS: RwLock<()> = RwLock::new(());

thread_local! {
    static ALONE: Cell<bool> = const { Cell::new(false) };
}

/// This test runs with no other cluster of the binary beside it, until the
/// guard goes (declare it before the cluster, so the cluster goes first).
pub struct Alone {
    _whole: RwLockWriteGuard<'static, ()>,
}

pub fn alone() -> Alone {
    let whole = CLUSTERS.write().unwrap_or_else(|poisoned| poisoned.into_inner());
    ALONE.with(|alone| alone.set(true));
    Alone { _whole: whole }
}

impl Drop for Alone {
    fn drop(&mut self) {
        ALONE.with(|alone| alone.set(false));
    }
}

pub struct DevCluster {
    pub dir: tempfile::TempDir,
    /// Shares the binary's clusters lock (none when this test runs alone).
    _turn: Option<RwLockReadGuard<'static, ()>>,
}

impl DevCluster {
    pub fn start() -> DevCluster {
        DevCluster::with_pgs(32)
    }

    /// Few PGs put many writes in each PG's log: back-pressure on primaries and replicas.
    pub fn with_pgs(pg_num: u32) -> DevCluster {
        DevCluster::with_args(&["--pg-num", &pg_num.to_string()])
    }

    /// `dev up` with these extra arguments.
    pub fn with_args(args: &[&str]) -> DevCluster {
        let turn = (!ALONE.with(Cell::get)).then(|| CLUSTERS.read().unwrap_or_else(|poisoned| poisoned.into_inner()));
        let dir = tempfile::Builder::new().prefix("duplex-test-").tempdir().expect("temp dir");
        let cluster = DevCluster { dir, _turn: turn };
        let size: &[&str] = if args.contains(&"--osd-size") { &[] } else { &["--osd-size", "768M"] };
        // DUPLEX_TEST_OSD_SET="connection_policy=lcam priority_threads=2":
        // every cluster's OSDs with these settings (the fault scenarios
        // under another OSD configuration; docs/RELIABILITY.md).
        let extra: Vec<String> = std::env::var("DUPLEX_TEST_OSD_SET")
            .unwrap_or_default()
            .split_whitespace()
            .flat_map(|setting| ["--osd-set".to_string(), setting.to_string()])
            .collect();
        run_ok(duplex().args(["dev", "up"]).args(size).args(args).args(&extra).arg("--dir").arg(cluster.path()));
        cluster
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn conf(&self) -> PathBuf {
        self.path().join("client.toml")
    }

    /// `duplex <args>` against this cluster.
    pub fn cli(&self) -> Command {
        let mut command = duplex();
        command.env("DUPLEX_CONF", self.conf());
        command
    }

    /// `duplex` against this cluster as a shell command line (for pipes).
    pub fn cli_line(&self) -> String {
        format!("DUPLEX_CONF='{}' '{}'", self.conf().display(), env!("CARGO_BIN_EXE_duplex"))
    }

    pub fn client(&self) -> duplex_client::Client {
        let mut config = duplex_client::ClientConfig::from_file(&self.conf()).expect("client config");
        // Failover waits for the monitor's grace (6 s) and the map push; a
        // loaded CI machine can stretch that, and the tests assert outcomes, not speed.
        config.op_timeout = Duration::from_secs(120);
        duplex_client::Client::connect(config).expect("client connects")
    }

    /// Starts `duplex nbd serve` for `image`; returns it with its URI.
    pub fn serve(&self, image: &str, socket: Option<&Path>) -> NbdServer {
        self.serve_from(None, image, socket)
    }

    /// [`DevCluster::serve`] of an image in `pool`, over TCP.
    pub fn serve_in(&self, pool: &str, image: &str) -> NbdServer {
        self.serve_from(Some(pool), image, None)
    }

    fn serve_from(&self, pool: Option<&str>, image: &str, socket: Option<&Path>) -> NbdServer {
        let mut command = self.cli();
        if let Some(pool) = pool {
            command.args(["--pool", pool]);
        }
        command.args(["nbd", "serve", "--image", image]);
        match socket {
            Some(path) => command.arg("--socket").arg(path),
            None => command.args(["--listen", "127.0.0.1:0"]),
        };
        let mut child = command.stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().expect("nbd serve starts");
        let stdout = child.stdout.take().expect("piped");
        let mut line = String::new();
        let started = Instant::now();
        BufReader::new(stdout).read_line(&mut line).expect("nbd serve prints its address");
        let uri = line.trim().rsplit(" at ").next().unwrap_or_default().to_string();
        assert!(uri.starts_with("nbd"), "unexpected first line from nbd serve: {line:?}");
        assert!(started.elapsed() < Duration::from_secs(30));
        NbdServer { child, uri }
    }
}

impl Drop for DevCluster {
    fn drop(&mut self) {
        let _ = duplex().args(["dev", "down", "--dir"]).arg(self.path()).output();
        // Keep the daemons' logs of a failed test where CI can show them
        // (or of any test, with DUPLEX_KEEP_LOGS set: for diagnosis).
        if std::thread::panicking() || std::env::var_os("DUPLEX_KEEP_LOGS").is_some() {
            let keep = Path::new(env!("CARGO_TARGET_TMPDIR")).join("failed-cluster-logs");
            let _ = std::fs::create_dir_all(&keep);
            for entry in std::fs::read_dir(self.path()).into_iter().flatten().flatten() {
                if entry.path().extension().is_some_and(|e| e == "log") {
                    let _ = std::fs::copy(entry.path(), keep.join(entry.file_name()));
                }
            }
            eprintln!("daemon logs kept in {}", keep.display());
        }
        let _ = duplex().args(["dev", "down", "--wipe", "--dir"]).arg(self.path()).output();
    }
}

pub struct NbdServer {
    child: Child,
    pub uri: String,
}

impl NbdServer {
    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NbdServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The dev cluster's state.json.
pub fn dev_state(cluster: &DevCluster) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(cluster.path().join("state.json")).unwrap()).unwrap()
}

/// The process id of a daemon of the dev cluster (`osd.1`, `mon.0`).
pub fn pid_of(cluster: &DevCluster, name: &str) -> i32 {
    let state = dev_state(cluster);
    let process = state["processes"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap();
    process["pid"].as_u64().unwrap() as i32
}

pub fn kill_9(cluster: &DevCluster, name: &str) {
    signal(cluster, name, libc::SIGKILL);
}

/// Sends `signal` to a daemon of the dev cluster (SIGSTOP: it hangs).
pub fn signal(cluster: &DevCluster, name: &str, signal: i32) {
    // SAFETY: kill(2) on a process this test's cluster started.
    assert_eq!(unsafe { libc::kill(pid_of(cluster, name), signal) }, 0);
}

/// kill -9 of a daemon, then how long until its process had ended: every
/// thread of it gone, so its sockets closed. That is not at once: a thread
/// in an uninterruptible device wait (an fsync under load) keeps them all
/// open until the wait ends, and until then its peers cannot tell.
pub fn kill_9_timed(cluster: &DevCluster, name: &str) -> Duration {
    let pid = pid_of(cluster, name);
    // SAFETY: kill(2) on a process this test's cluster started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    wait_until_ended(pid, &format!("kill -9 of {name}"))
}

/// Waits until process `pid` has ended ([`process_ended`]); how long that took.
pub fn wait_until_ended(pid: i32, what: &str) -> Duration {
    let started = Instant::now();
    while !process_ended(pid) {
        assert!(started.elapsed() < Duration::from_secs(30), "{what}: process {pid} still runs after 30 s");
        std::thread::sleep(Duration::from_millis(2));
    }
    started.elapsed()
}

/// Whether process `pid` has ended: reaped, or a zombie with no thread left
/// running (a zombie leader whose other threads still run has not).
fn process_ended(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { return true };
    // The state follows the command's closing parenthesis.
    let state = stat.rsplit_once(')').and_then(|(_, rest)| rest.trim_start().chars().next());
    if !matches!(state, Some('Z') | Some('X')) {
        return false;
    }
    match std::fs::read_dir(format!("/proc/{pid}/task")) {
        Ok(tasks) => tasks.count() <= 1,
        Err(_) => true,
    }
}

// Device faults and power loss on a dev cluster's OSD (issue 7's scenario 6).

/// Restarts `osd` with its data device behind a simulated volatile write
/// cache and a fault trigger file; returns the trigger's path (absent: no
/// fault armed).
pub fn with_device_faults(cluster: &DevCluster, osd: u32) -> std::path::PathBuf {
    let trigger = cluster.path().join(format!("osd.{osd}.faults"));
    let setting = format!("inject_device_faults={}", trigger.display());
    run_ok(
        cluster
            .cli()
            .args(["dev", "restart", "--osd", &osd.to_string(), "--osd-set", &setting, "--dir"])
            .arg(cluster.path()),
    );
    trigger
}

/// `duplex dev restart --osd N`: starts `osd` again (with its data and logs).
pub fn restart_osd(cluster: &DevCluster, osd: u32) {
    run_ok(cluster.cli().args(["dev", "restart", "--osd", &osd.to_string(), "--dir"]).arg(cluster.path()));
}

/// Arms device fault `word` on `osd` (through its `trigger` file) and waits
/// until the OSD process is gone; how long that took.
pub fn arm_until_dead(cluster: &DevCluster, osd: u32, trigger: &std::path::Path, word: &str) -> Duration {
    let pid = pid_of(cluster, &format!("osd.{osd}"));
    std::fs::write(trigger, format!("{word}\n")).unwrap();
    wait_until_ended(pid, word)
}

/// After a power cut of `osd`: its `shm` log goes too (the files it
/// held, returned), I/O goes on without it, it restarts with its store
/// alone and I/O goes on again; how long each took.
pub fn back_without_its_log(
    cluster: &DevCluster,
    osd: u32,
    trigger: &std::path::Path,
    run: &workload::Verifying,
) -> (usize, Duration, Duration) {
    let log_dir = log_dir_of(cluster, osd);
    let lost = std::fs::read_dir(&log_dir).unwrap().count();
    std::fs::remove_dir_all(&log_dir).unwrap();
    std::fs::remove_file(trigger).unwrap();
    let resumed = run.wait_for_progress(&format!("after osd.{osd} lost power"));
    restart_osd(cluster, osd);
    let rejoined = run.wait_for_progress(&format!("after osd.{osd} came back without its log"));
    std::thread::sleep(Duration::from_secs(2));
    (lost, resumed, rejoined)
}

/// The operation-log directory of `osd` in a dev cluster.
pub fn log_dir_of(cluster: &DevCluster, osd: u32) -> std::path::PathBuf {
    dev_state(cluster)["oplog_dirs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|dir| std::path::PathBuf::from(dir.as_str().unwrap()))
        .find(|dir| dir.to_string_lossy().ends_with(&format!("-osd.{osd}")))
        .expect("the OSD's operation-log directory")
}
