//! A cluster of `duplex-mon` processes on loopback for tests; every child
//! is killed when the cluster is dropped, whatever the test's outcome.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use duplex_mon_client::Credentials;
use duplex_mon_client::MonClient;

const FSID_HEX: &str = "00112233445566778899aabbccddeeff";

pub struct Cluster {
    dir: tempfile::TempDir,
    peers: BTreeMap<u64, SocketAddr>,
    pub children: BTreeMap<u64, Child>,
    secret: PathBuf,
    extra_args: Vec<String>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Cluster {
    pub fn new(count: u64, extra_args: &[&str]) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"a shared cluster secret for tests").unwrap();
        let peers = (1..=count).map(|id| (id, SocketAddr::from(([127, 0, 0, 1], free_port())))).collect();
        let extra_args = extra_args.iter().map(|s| s.to_string()).collect();
        let mut cluster = Cluster { dir, peers, children: BTreeMap::new(), secret, extra_args };
        for id in 1..=count {
            cluster.start(id);
        }
        cluster
    }

    pub fn start(&mut self, id: u64) {
        let mut process = Process::new(env!("CARGO_BIN_EXE_duplex-mon"));
        process
            .args(["--id", &id.to_string(), "--fsid", FSID_HEX])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("mon{id}")))
            .arg("--secret-file")
            .arg(&self.secret)
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (peer, addr) in &self.peers {
            process.arg("--peer").arg(format!("{peer}={addr}"));
        }
        self.children.insert(id, process.spawn().unwrap());
    }

    pub fn kill(&mut self, id: u64) {
        let mut child = self.children.remove(&id).unwrap();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    pub fn client(&self) -> MonClient {
        let fsid = duplex_proto::parse_fsid(FSID_HEX).unwrap();
        let credentials =
            Credentials { fsid, secret: b"a shared cluster secret for tests".to_vec(), name: "client.test".into() };
        MonClient::new(self.peers.iter().map(|(id, addr)| (*id, *addr)).collect(), credentials)
    }
}

pub fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

pub fn leader(cluster: &Cluster, client: &MonClient) -> Option<u64> {
    cluster.children.keys().copied().find(|id| client.status(*id).is_ok_and(|(_, is_leader, _)| is_leader))
}

/// Registers OSDs `0..count`, each on its own host.
pub fn boot_osds(client: &mut MonClient, count: u32) {
    for id in 0..count {
        client
            .command(&duplex_map::Command::OsdBoot {
                id,
                addr: format!("127.0.0.1:{}", 6800 + id),
                host: format!("h{id}"),
                weight: 1 << 16,
            })
            .unwrap();
    }
}
