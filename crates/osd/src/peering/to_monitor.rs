//! The peering thread's monitor commands, sent from a thread of their own.
//!
//! A command waits for the monitors to commit it (a Raft write and its
//! fsync). Sent from the peering thread, each waited in line: after a
//! failover every PG that had the lost OSD records its new members, one at
//! a time, and under load the last of 16 PGs an OSD leads waited for 15
//! commits before it served again (a write stalled 1.5 s across a kill -9).
//! Sent from here, peering goes on with the next PG while one commits, and
//! the records that piled up meanwhile go as one command.
//!
//! Nothing waits for the answer: the schedule asks again if the map does
//! not show a command's effect in time, so a command lost here (a full
//! queue, a monitor that is away) costs a retry, not a PG.

use std::collections::BTreeMap;
use std::time::Duration;

use duplex_map::{Command, OsdId};
use duplex_mon_client::{Credentials, MonClient};

/// Batches of commands waiting for the sending thread. Small: the schedule
/// re-asks anything dropped.
const QUEUE: usize = 64;

/// Where the peering thread hands its commands.
pub struct ToMonitor {
    queue: crossbeam_channel::Sender<Vec<Command>>,
}

impl ToMonitor {
    /// Starts the sending thread (`osd-to-mon`); it ends when this is dropped.
    pub fn start(
        monitors: Vec<(u64, std::net::SocketAddr)>,
        credentials: Credentials,
        timeout: Duration,
    ) -> std::io::Result<ToMonitor> {
        let (queue, batches) = crossbeam_channel::bounded::<Vec<Command>>(QUEUE);
        std::thread::Builder::new().name("osd-to-mon".into()).spawn(move || {
            let mut client = MonClient::new(monitors, credentials);
            client.timeout = timeout;
            while let Ok(first) = batches.recv() {
                let mut pending = vec![first];
                pending.extend(batches.try_iter());
                for command in coalesce(pending) {
                    match client.command(&command) {
                        Ok(outcome) => tracing::debug!(?command, ?outcome, "asked the monitor"),
                        Err(err) => {
                            tracing::warn!(%err, ?command, "the monitor did not take a command; asking again shortly")
                        }
                    }
                }
            }
        })?;
        Ok(ToMonitor { queue })
    }

    /// Hands `commands` to the sending thread, without waiting.
    pub fn send(&self, commands: Vec<Command>) {
        if commands.is_empty() {
            return;
        }
        if self.queue.try_send(commands).is_err() {
            tracing::debug!("monitor commands queue full; the schedule asks again");
        }
    }
}

/// The commands of `batches` (oldest first) as few commands as say the
/// same: every PG's record in one [`Command::RecordActive`] (a PG recorded
/// twice keeps its newest record), per [`duplex_map::MAX_PGS_PER_COMMAND`]
/// PGs; the other commands once each, in the order first asked.
pub fn coalesce(batches: Vec<Vec<Command>>) -> Vec<Command> {
    type Record = (duplex_map::PoolId, u32, u64, Vec<OsdId>);
    let mut records: BTreeMap<(duplex_map::PoolId, u32), Record> = BTreeMap::new();
    let mut others: Vec<Command> = Vec::new();
    for command in batches.into_iter().flatten() {
        match command {
            Command::RecordActive { pgs } => {
                for record in pgs {
                    records.insert((record.0, record.1), record);
                }
            }
            other if !others.contains(&other) => others.push(other),
            _ => {}
        }
    }
    let records: Vec<Record> = records.into_values().collect();
    debug_assert!(records.windows(2).all(|w| (w[0].0, w[0].1) < (w[1].0, w[1].1)), "one record per PG");
    let mut commands: Vec<Command> = records
        .chunks(duplex_map::MAX_PGS_PER_COMMAND)
        .map(|chunk| Command::RecordActive { pgs: chunk.to_vec() })
        .collect();
    commands.extend(others);
    commands
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pg: u32, interval: u64, members: &[OsdId]) -> Command {
        Command::RecordActive { pgs: vec![(1, pg, interval, members.to_vec())] }
    }

    #[test]
    fn records_asked_apart_go_as_one_command_with_each_pgs_newest() {
        let batches = vec![
            vec![record(3, 39, &[0])],
            vec![record(7, 39, &[2]), Command::MarkOut { id: 4 }],
            vec![record(3, 41, &[0, 2]), Command::MarkOut { id: 4 }],
        ];
        let commands = coalesce(batches);
        assert_eq!(
            commands,
            vec![
                Command::RecordActive { pgs: vec![(1, 3, 41, vec![0, 2]), (1, 7, 39, vec![2])] },
                Command::MarkOut { id: 4 },
            ]
        );
    }

    #[test]
    fn nothing_asked_sends_nothing() {
        assert!(coalesce(vec![]).is_empty());
        assert!(coalesce(vec![vec![]]).is_empty());
    }

    #[test]
    fn every_record_is_kept_whatever_the_batches() {
        let mut batches = Vec::new();
        for pg in 0..100u32 {
            batches.push(vec![record(pg, 5, &[pg % 3])]);
        }
        let commands = coalesce(batches);
        assert_eq!(commands.len(), 1);
        let Command::RecordActive { pgs } = &commands[0] else { panic!("{commands:?}") };
        assert_eq!(pgs.len(), 100);
        assert!(pgs.iter().enumerate().all(|(i, (_, pg, _, members))| *pg == i as u32 && members == &[i as u32 % 3]));
    }
}
