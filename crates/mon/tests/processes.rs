//! Three `duplex-mon` processes on loopback. The leader is killed with
//! SIGKILL during a stream of commands. Every acknowledged command is in the
//! map afterwards, epochs never go backwards, the survivors keep accepting
//! commands, and the killed monitor restarts from its data directory and
//! catches up. Children are killed on every exit path.

mod common;

use std::time::Duration;

use common::{leader, wait_for, Cluster};
use duplex_map::Command;
use duplex_mon_client::WireOutcome;

#[test]
fn killing_the_leader_loses_no_acknowledged_command() {
    let mut cluster = Cluster::new(3, &[]);
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
        // Alternate pool and OSD commands.
        let (name, command) = if i % 2 == 0 {
            let name = format!("pool-{i}");
            (name.clone(), Command::PoolCreate { name, size: 2, min_size: 1, pg_num: 32 })
        } else {
            let id = i as u32;
            (
                format!("osd.{id}"),
                Command::OsdBoot {
                    id,
                    addr: format!("127.0.0.1:{}", 6800 + id),
                    host: format!("host-{}", id % 4),
                    weight: 1 << 16,
                },
            )
        };
        let outcome = client.command(&command).unwrap_or_else(|err| panic!("command {i} failed: {err}"));
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
            let present = match name.strip_prefix("osd.") {
                Some(osd) => map.osds.get(&osd.parse::<u32>().unwrap()).is_some_and(|o| o.up),
                None => map.pool_by_name(name).is_some(),
            };
            assert!(present, "monitor {id} lacks acknowledged {name}");
        }
    }
}
