//! Real NBD clients against the MemoryExport: libnbd's `nbdinfo` and QEMU's
//! `qemu-io`. Missing tools fail the test (CI installs them) rather than
//! skipping it silently.

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use duplex_nbd::memory::MemoryExport;
use duplex_nbd::{Export, ExportMap, ServerConfig};

use crate::{exports, TestServer, DISK_BYTES};

/// Generous for a cold start on a loaded machine; the tools normally finish in well under a second.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

fn tool(name: &str, package: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path).map(|dir| dir.join(name)).find(|candidate| candidate.is_file()).unwrap_or_else(|| {
        panic!("`{name}` not found on PATH: install the `{package}` package (apt-get install {package})")
    })
}

struct Output {
    success: bool,
    stdout: String,
    stderr: String,
}

/// Kills the child if the test panics or times out, so no process outlives the test.
struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(program: PathBuf, args: &[&str]) -> Output {
    let description = format!("{} {}", program.display(), args.join(" "));
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|error| panic!("could not start {description}: {error}"));
    let mut child = KillOnDrop(child);
    let collect = |mut pipe: Box<dyn Read + Send>| {
        thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = collect(Box::new(child.0.stdout.take().unwrap()));
    let stderr = collect(Box::new(child.0.stderr.take().unwrap()));
    let deadline = Instant::now() + TOOL_TIMEOUT;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "{description} did not finish within {TOOL_TIMEOUT:?}");
        thread::sleep(Duration::from_millis(10));
    };
    Output { success: status.success(), stdout: stdout.join().unwrap(), stderr: stderr.join().unwrap() }
}

fn nbdinfo(args: &[&str]) -> Output {
    run(tool("nbdinfo", "libnbd-bin"), args)
}

/// Runs qemu-io commands against `uri`; fails on a non-zero exit or any
/// failure or pattern mismatch in the output.
fn qemu_io(uri: &str, commands: &[&str]) -> String {
    let mut args = vec!["-f", "raw"];
    for command in commands {
        args.extend(["-c", command]);
    }
    args.push(uri);
    let output = run(tool("qemu-io", "qemu-utils"), &args);
    let all = format!("{}{}", output.stdout, output.stderr);
    assert!(output.success, "qemu-io failed:\n{all}");
    // qemu-io exits 0 even when a command fails, so read what it said;
    // " -- " is its usage line, printed for a command it could not parse.
    let bad = ["failed", "Pattern verification", "invalid", "error", " -- "];
    assert!(!bad.iter().any(|word| all.contains(word)), "qemu-io reported:\n{all}");
    all
}

#[test]
fn nbdinfo_reports_size_and_lists_exports() {
    let (_, exports) = exports();
    let server = TestServer::tcp(exports, ServerConfig::default());
    let base = format!("nbd://{}", server.addr.unwrap());

    let size = nbdinfo(&["--size", &format!("{base}/disk")]);
    assert!(size.success, "nbdinfo --size failed: {}", size.stderr);
    assert_eq!(size.stdout.trim(), DISK_BYTES.to_string());

    let full = nbdinfo(&[&format!("{base}/ro")]);
    assert!(full.success, "nbdinfo failed: {}", full.stderr);
    assert!(full.stdout.contains("export-size: 65536"), "{}", full.stdout);
    assert!(full.stdout.contains("is_read_only: true"), "{}", full.stdout);
    assert!(full.stdout.contains("can_multi_conn: true"), "{}", full.stdout);
    assert!(full.stdout.contains("block_size_maximum: 33554432"), "{}", full.stdout);

    let list = nbdinfo(&["--list", &base]);
    assert!(list.success, "nbdinfo --list failed: {}", list.stderr);
    assert!(list.stdout.contains("export=\"disk\""), "{}", list.stdout);
    assert!(list.stdout.contains("description: a test disk"), "{}", list.stdout);
    assert!(list.stdout.contains("export=\"ro\""), "{}", list.stdout);

    let missing = nbdinfo(&["--size", &format!("{base}/missing")]);
    assert!(!missing.success, "an unknown export must fail");
    server.assert_serves();
}

#[test]
fn qemu_io_writes_then_reads_back_with_pattern_checks() {
    let disk = Arc::new(MemoryExport::from_vec(vec![0x5A; DISK_BYTES]));
    let exports = ExportMap::new().with("disk", disk.clone() as Arc<dyn Export>);
    let server = TestServer::tcp(Arc::new(exports), ServerConfig::default());
    let uri = format!("nbd://{}/disk", server.addr.unwrap());

    qemu_io(
        &uri,
        &[
            "read -P 0x5a 0 64k",
            "write -P 0xab 4096 131072",
            "write -P 0xcd -f 200704 512", // -f: FUA
            "write -z 262144 65536",       // without -u: NBD_CMD_FLAG_NO_HOLE
            "write -z -u 327680 4096",
            "discard 393216 4096",
            "flush",
            "read -P 0xab 4096 131072",
            "read -P 0xcd 200704 512",
            "read -P 0 262144 65536",
            "read -P 0 327680 4096",
            "read -P 0x5a 0 4096",
        ],
    );
    let contents = disk.contents();
    assert!(contents[4096..4096 + 131_072].iter().all(|&byte| byte == 0xAB));
    assert!(contents[200_704..200_704 + 512].iter().all(|&byte| byte == 0xCD));
    assert!(contents[262_144..262_144 + 65_536 + 4096].iter().all(|&byte| byte == 0));
    assert!(contents[..4096].iter().all(|&byte| byte == 0x5A));
    let stats = disk.stats();
    assert!(stats.fua_writes >= 1, "qemu-io -F must arrive as FUA: {stats:?}");
    assert!(stats.flushes >= 1, "{stats:?}");
    assert!(stats.write_zeroes >= 2, "{stats:?}");
    assert!(stats.write_zeroes_no_hole >= 1, "write -z without -u must arrive as NO_HOLE: {stats:?}");
    assert_eq!(stats.trims, 1, "{stats:?}");
}

#[test]
fn unix_socket_export_with_real_clients() {
    let (disk, exports) = exports();
    let server = TestServer::unix(exports, ServerConfig::default());
    let path = server.socket_path.clone().unwrap();
    let uri = format!("nbd+unix:///disk?socket={}", path.display());

    let size = nbdinfo(&["--size", &uri]);
    assert!(size.success, "nbdinfo over unix failed: {}", size.stderr);
    assert_eq!(size.stdout.trim(), DISK_BYTES.to_string());

    qemu_io(&uri, &["write -P 0x42 1024 8192", "read -P 0x42 1024 8192", "read -P 0 0 1024"]);
    assert!(disk.contents()[1024..1024 + 8192].iter().all(|&byte| byte == 0x42));
    server.stop().unwrap();
}
