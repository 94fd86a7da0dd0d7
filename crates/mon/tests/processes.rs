//! Three `duplex-mon` processes on loopback. The leader is killed with
//! SIGKILL during a stream of commands. Every acknowledged command is in the
//! map afterwards, epochs never go backwards, the survivors keep accepting
//! commands, and the killed monitor restarts from its data directory and
//! catches up. Children are killed on every exit path.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command as Process, Stdio};
use std::time::{Duration, Instant};

use duplex_map::Command;
use duplex_mon::client::MonClient;
use duplex_mon::wire::{Credentials, WireOutcome};

const FSID_HEX: &str = "00112233445566778899aabbccddeeff";

struct Cluster {
    dir: tempfile::TempDir,
    peers: BTreeMap<u64, SocketAddr>,
    children: BTreeMap<u64, Child>,
    secret: PathBuf,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for child in self.children.values_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Cluster {
    fn new() -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"a shared cluster secret for tests").unwrap();
        let peers = (1..=3).map(|id| (id, SocketAddr::from(([127, 0, 0, 1], free_port())))).collect();
        let mut cluster = Cluster { dir, peers, children: BTreeMap::new(), secret };
        for id in 1..=3 {
            cluster.start(id);
        }
        cluster
    }

    fn start(&mut self, id: u64) {
        let mut process = Process::new(env!("CARGO_BIN_EXE_duplex-mon"));
        process
            .args(["--id", &id.to_string(), "--fsid", FSID_HEX])
            .arg("--data-dir")
            .arg(self.dir.path().join(format!("mon{id}")))
            .arg("--secret-file")
            .arg(&self.secret)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        for (peer, addr) in &self.peers {
            process.arg("--peer").arg(format!("{peer}={addr}"));
        }
        self.children.insert(id, process.spawn().unwrap());
    }

    fn kill(&mut self, id: u64) {
        let mut child = self.children.remove(&id).unwrap();
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
    }

    fn client(&self) -> MonClient {
        let mut fsid = [0u8; 16];
        for (i, byte) in fsid.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&FSID_HEX[2 * i..2 * i + 2], 16).unwrap();
        }
        let credentials =
            Credentials { fsid, secret: b"a shared cluster secret for tests".to_vec(), name: "client.test".into() };
        MonClient::new(self.peers.iter().map(|(id, addr)| (*id, *addr)).collect(), credentials)
    }
}

fn wait_for(what: &str, timeout: Duration, mut done: impl FnMut() -> bool) {
    let started = Instant::now();
    while started.elapsed() < timeout {
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

fn leader(cluster: &Cluster, client: &MonClient) -> Option<u64> {
    cluster.children.keys().copied().find(|id| client.status(*id).is_ok_and(|(_, is_leader, _)| is_leader))
}

#[test]
fn killing_the_leader_loses_no_acknowledged_command() {
    let mut cluster = Cluster::new();
    let mut client = cluster.client();
    wait_for("a leader", Duration::from_secs(20), || leader(&cluster, &client).is_some());

    let mut acknowledged = Vec::new();
    let mut highest_epoch = 0;
    let mut killed = None;
    for i in 0..60 {
        if i == 20 {
            let victim = leader(&cluster, &client).expect("a leader");
            cluster.kill(victim);
            killed = Some(victim);
        }
        let name = format!("pool-{i}");
        let outcome = client
            .command(&Command::PoolCreate { name: name.clone(), size: 2, min_size: 1, pg_num: 32 })
            .unwrap_or_else(|err| panic!("command {i} failed: {err}"));
        match outcome {
            WireOutcome::Applied { epoch } | WireOutcome::Unchanged { epoch } => {
                assert!(
                    epoch > highest_epoch || matches!(outcome, WireOutcome::Unchanged { .. }),
                    "epoch went backwards"
                );
                highest_epoch = highest_epoch.max(epoch);
            }
            // A retry after a lost reply finds the pool already made: it was applied.
            WireOutcome::Refused(reason) => assert!(reason.contains("already exists"), "{reason}"),
        }
        acknowledged.push(name);
    }

    let killed = killed.unwrap();
    cluster.start(killed);
    let survivors_epoch = || leader(&cluster, &client).and_then(|l| client.status(l).ok()).map(|s| s.2);
    wait_for("the restarted monitor to catch up", Duration::from_secs(30), || {
        let target = survivors_epoch();
        client.status(killed).is_ok_and(|(_, _, epoch)| Some(epoch) == target)
    });
    for id in 1..=3 {
        let map = client.map(id).unwrap();
        assert_eq!(map.epoch, highest_epoch, "monitor {id} is at another epoch");
        for name in &acknowledged {
            assert!(map.pool_by_name(name).is_some(), "monitor {id} lacks acknowledged {name}");
        }
    }
}
