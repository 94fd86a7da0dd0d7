//! Three monitor cores on a deterministic in-memory network: election,
//! replication, losing the leader mid-stream, and a restarted node catching
//! up from its persisted log. Every acknowledged command is in the map,
//! epochs never go backwards, and all replicas converge.

use std::collections::{BTreeMap, VecDeque};

use duplex_map::{ClusterMap, Command};
use duplex_mon::{append_to_log, CommandOutcome, MonCore};
use raft::eraftpb::{Entry, HardState, Message};

const PEERS: [u64; 3] = [1, 2, 3];
const FSID: [u8; 16] = [4; 16];

#[derive(Default)]
struct Disk {
    log: Vec<Entry>,
    hard_state: Option<HardState>,
}

struct Sim {
    cores: BTreeMap<u64, MonCore>,
    disks: BTreeMap<u64, Disk>,
    network: VecDeque<Message>,
    incarnations: u64,
    /// (node, request) → outcome, for every proposal acknowledged to a client.
    acknowledged: Vec<(Command, CommandOutcome)>,
    pending: BTreeMap<(u64, u64), Command>,
    highest_epoch_seen: u64,
}

impl Sim {
    fn new() -> Sim {
        let mut sim = Sim {
            cores: BTreeMap::new(),
            disks: BTreeMap::new(),
            network: VecDeque::new(),
            incarnations: 0,
            acknowledged: Vec::new(),
            pending: BTreeMap::new(),
            highest_epoch_seen: 0,
        };
        for id in PEERS {
            sim.disks.insert(id, Disk::default());
            sim.start(id);
        }
        sim
    }

    fn start(&mut self, id: u64) {
        self.incarnations += 1;
        let disk = &self.disks[&id];
        let core = MonCore::new(id, self.incarnations, &PEERS, FSID, &disk.log, disk.hard_state.clone()).unwrap();
        self.cores.insert(id, core);
    }

    /// kill -9: the core vanishes; its disk stays; pending proposals are lost to their clients.
    fn kill(&mut self, id: u64) {
        self.cores.remove(&id);
        self.pending.retain(|(node, _), _| *node != id);
    }

    fn leader(&self) -> Option<u64> {
        self.cores.values().find(|c| c.is_leader()).map(|c| c.id())
    }

    /// One round: tick everyone, then drive and deliver until quiet.
    fn round(&mut self) {
        for core in self.cores.values_mut() {
            core.tick();
        }
        for _ in 0..50 {
            let mut progressed = false;
            let ids: Vec<u64> = self.cores.keys().copied().collect();
            for id in ids {
                let out = self.cores.get_mut(&id).unwrap().drive();
                let disk = self.disks.get_mut(&id).unwrap();
                append_to_log(&mut disk.log, &out.entries);
                if let Some(hs) = out.hard_state {
                    disk.hard_state = Some(hs);
                }
                progressed |= !out.messages.is_empty() || !out.completed.is_empty();
                self.network.extend(out.messages);
                for (request, outcome) in out.completed {
                    if let Some(command) = self.pending.remove(&(id, request)) {
                        if let CommandOutcome::Applied { epoch } | CommandOutcome::Unchanged { epoch } = outcome {
                            assert!(epoch >= self.highest_epoch_seen, "epoch went backwards");
                            self.highest_epoch_seen = epoch;
                        }
                        self.acknowledged.push((command, outcome));
                    }
                }
            }
            while let Some(message) = self.network.pop_front() {
                progressed = true;
                if let Some(core) = self.cores.get_mut(&message.to) {
                    let _ = core.step(message);
                }
            }
            if !progressed {
                break;
            }
        }
    }

    fn until(&mut self, what: &str, mut done: impl FnMut(&Sim) -> bool) {
        for _ in 0..500 {
            if done(self) {
                return;
            }
            self.round();
        }
        panic!("timed out waiting for {what}");
    }

    fn propose(&mut self, command: Command) -> bool {
        let Some(leader) = self.leader() else { return false };
        match self.cores.get_mut(&leader).unwrap().propose(command.clone()) {
            Ok(request) => {
                self.pending.insert((leader, request), command);
                true
            }
            Err(_) => false,
        }
    }
}

fn boot(id: u32) -> Command {
    Command::OsdBoot { id, addr: format!("127.0.0.1:{}", 6800 + id), host: format!("host-{}", id % 3), weight: 1 << 16 }
}

fn assert_acknowledged_commands_hold(map: &ClusterMap, acknowledged: &[(Command, CommandOutcome)]) {
    for (command, outcome) in acknowledged {
        if let (Command::OsdBoot { id, .. }, CommandOutcome::Applied { .. }) = (command, outcome) {
            assert!(map.osds.contains_key(id), "acknowledged boot of OSD {id} is missing");
        }
        if let (Command::PoolCreate { name, .. }, CommandOutcome::Applied { .. }) = (command, outcome) {
            assert!(map.pool_by_name(name).is_some(), "acknowledged pool {name} is missing");
        }
    }
}

#[test]
fn three_monitors_elect_replicate_and_converge() {
    let mut sim = Sim::new();
    sim.until("a leader", |s| s.leader().is_some());
    for id in 0..10 {
        assert!(sim.propose(boot(id)));
    }
    assert!(sim.propose(Command::MarkDown { id: 99 }));
    sim.until("all commands acknowledged", |s| s.pending.is_empty());
    sim.until("replicas to converge", |s| s.cores.values().all(|c| c.map().epoch == 10));
    let maps: Vec<&ClusterMap> = sim.cores.values().map(|c| c.map()).collect();
    assert!(maps.windows(2).all(|w| w[0] == w[1]), "replicas differ");
    assert!(sim.acknowledged.iter().any(|(_, o)| matches!(o, CommandOutcome::Refused(_))), "unknown OSD refused");
    assert_acknowledged_commands_hold(maps[0], &sim.acknowledged);
}

#[test]
fn losing_the_leader_mid_stream_loses_no_acknowledged_command() {
    let mut sim = Sim::new();
    sim.until("a leader", |s| s.leader().is_some());
    let mut next = 0u32;
    for round in 0..300 {
        if sim.propose(boot(next)) {
            next += 1;
        }
        if round % 7 == 0 {
            let _ = sim.propose(Command::PoolCreate { name: format!("pool-{round}"), size: 2, min_size: 1, pg_num: 8 });
        }
        if round == 60 {
            let leader = sim.leader().expect("a leader by now");
            sim.kill(leader);
        }
        if round == 200 {
            // The killed node comes back from its disk.
            let dead = *PEERS.iter().find(|id| !sim.cores.contains_key(id)).unwrap();
            sim.start(dead);
        }
        sim.round();
    }
    sim.until("pending commands to settle", |s| s.pending.is_empty());
    let epochs: Vec<u64> = sim.cores.values().map(|c| c.map().epoch).collect();
    sim.until("the restarted node to catch up", |s| {
        let e: Vec<u64> = s.cores.values().map(|c| c.map().epoch).collect();
        e.windows(2).all(|w| w[0] == w[1])
    });
    assert_eq!(sim.cores.len(), 3);
    let map = sim.cores.values().next().unwrap().map().clone();
    assert!(sim.cores.values().all(|c| *c.map() == map), "replicas differ after the restart: {epochs:?}");
    assert!(sim.acknowledged.len() > 150, "only {} commands acknowledged", sim.acknowledged.len());
    assert_acknowledged_commands_hold(&map, &sim.acknowledged);
}
