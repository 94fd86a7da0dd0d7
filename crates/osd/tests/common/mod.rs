//! A test cluster on loopback: one monitor in this process, OSDs as real
//! `duplex-osd` processes (so tests can SIGKILL them). Every child is
//! killed when the cluster is dropped, whatever the test's outcome.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use duplex_client::ObjectClient;
use duplex_map::Command;
use duplex_mon::client::MonClient;
use duplex_mon::wire::Credentials;

pub const FSID_HEX: &str = "00112233445566778899aabbccddeeff";
pub const SECRET: &[u8] = b"a shared cluster secret for tests";

pub fn fsid() -> [u8; 16] {
    let mut fsid = [0u8; 16];
    for (i, byte) in fsid.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&FSID_HEX[2 * i..2 * i + 2], 16).unwrap();
    }
    fsid
}

pub fn credentials(name: &str) -> Credentials {
    Credentials { fsid: fsid(), secret: SECRET.to_vec(), name: name.into() }
}

pub fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap()
}

pub struct Osd {
    pub child: Child,
    pub addr: SocketAddr,
    pub admin: SocketAddr,
    /// Log entries replayed into the store at start.
    pub replayed: u64,
}

pub struct TestCluster {
    dir: tempfile::TempDir,
    shm: tempfile::TempDir,
    pub mon: SocketAddr,
    pub osds: BTreeMap<u32, Osd>,
    secret: PathBuf,
    osd_args: Vec<String>,
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for osd in self.osds.values_mut() {
            let _ = osd.child.kill();
            let _ = osd.child.wait();
        }
    }
}

impl TestCluster {
    /// A monitor, `osds` OSDs (each its own host) and pool "test" (size 2, min_size 1, `pg_num` PGs).
    pub fn new(osds: u32, pg_num: u32, osd_args: &[&str]) -> TestCluster {
        let dir = tempfile::tempdir().unwrap();
        let shm = tempfile::tempdir_in("/dev/shm").unwrap_or_else(|_| tempfile::tempdir().unwrap());
        let secret = dir.path().join("secret");
        std::fs::write(&secret, SECRET).unwrap();
        let mon = free_addr();
        let config = duplex_mon::daemon::MonConfig {
            id: 1,
            peers: [(1, mon)].into_iter().collect(),
            data_dir: dir.path().join("mon"),
            credentials: credentials("mon.1"),
            failure: duplex_map::FailureConfig { grace_ms: 20_000, ..Default::default() },
        };
        std::thread::spawn(move || duplex_mon::daemon::run(config));
        let mut cluster = TestCluster {
            dir,
            shm,
            mon,
            osds: BTreeMap::new(),
            secret,
            osd_args: osd_args.iter().map(|s| s.to_string()).collect(),
        };
        let mut client = cluster.mon_client();
        client
            .command(&Command::PoolCreate { name: "test".into(), size: 2, min_size: 1, pg_num })
            .expect("creating the pool");
        for id in 0..osds {
            cluster.start_osd(id);
        }
        cluster
    }

    pub fn mon_client(&self) -> MonClient {
        MonClient::new(vec![(1, self.mon)], credentials("client.test"))
    }

    pub fn start_osd(&mut self, id: u32) {
        let admin = free_addr();
        let mut child = Process::new(env!("CARGO_BIN_EXE_duplex-osd"))
            .args(["--id", &id.to_string(), "--fsid", FSID_HEX, "--mon", &format!("1={}", self.mon)])
            .arg("--data")
            .arg(self.dir.path().join(format!("osd{id}.store")))
            .args(["--mkfs-size", &(256u64 << 20).to_string(), "--allow-buffered-io"])
            .arg("--oplog-dir")
            .arg(self.shm.path().join(format!("osd{id}")))
            .arg("--secret-file")
            .arg(&self.secret)
            .args(["--admin", &admin.to_string()])
            .args(&self.osd_args)
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
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
                panic!("OSD {id} did not start: {other:?}");
            }
        };
        // "duplex-osd ID serving on ADDR admin ADDR replayed N"
        let words: Vec<&str> = line.split_whitespace().collect();
        let addr = words[4].parse().unwrap();
        let replayed = words[8].parse().unwrap();
        self.osds.insert(id, Osd { child, addr, admin, replayed });
    }

    /// SIGKILL.
    pub fn kill_osd(&mut self, id: u32) {
        let mut osd = self.osds.remove(&id).unwrap();
        osd.child.kill().unwrap();
        osd.child.wait().unwrap();
    }

    pub fn client(&self) -> ObjectClient {
        let mut client = ObjectClient::connect(vec![(1, self.mon)], credentials("client.test")).unwrap();
        client.timeout = Duration::from_secs(60);
        client
    }

    pub fn pool(&self, client: &ObjectClient) -> u32 {
        client.pool_id("test").unwrap()
    }

    /// Waits until the map shows every started OSD up.
    pub fn wait_all_up(&self) {
        let client = self.mon_client();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            if let Ok(map) = client.map(1) {
                if self.osds.keys().all(|id| map.osds.get(id).is_some_and(|o| o.up)) {
                    return;
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("OSDs not up");
    }

    /// The OSD's metrics page.
    pub fn metrics(&self, id: u32) -> String {
        let mut stream = TcpStream::connect(self.osds[&id].admin).unwrap();
        stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).unwrap();
        body
    }

    /// A metric's value (the line starting with `name_and_labels `), summed over OSDs.
    pub fn metric_sum(&self, name_and_labels: &str) -> f64 {
        self.osds
            .keys()
            .map(|id| {
                self.metrics(*id)
                    .lines()
                    .find_map(|l| l.strip_prefix(name_and_labels).and_then(|v| v.trim().parse::<f64>().ok()))
                    .unwrap_or(0.0)
            })
            .sum()
    }
}
