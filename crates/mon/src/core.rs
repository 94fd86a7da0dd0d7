//! The monitor's sans-I/O core: one Raft node plus the replicated map.

use std::collections::VecDeque;

use duplex_map::{ClusterMap, Command, CommandError, MapDelta};
use raft::eraftpb::{ConfState, Entry, EntryType, HardState, Message};
use raft::storage::MemStorage;
use raft::{Config, RawNode, StateRole};
use serde::{Deserialize, Serialize};

/// A proposal as it travels in the Raft log.
#[derive(Serialize, Deserialize)]
struct Proposal {
    proposer: u64,
    /// Which run of the proposer: a restarted node re-applies its old
    /// entries, whose request numbers must not answer new requests.
    incarnation: u64,
    /// Chosen by the proposer to find its waiting client.
    request: u64,
    command: Command,
}

/// How a committed command ended on this node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandOutcome {
    /// The map moved to this epoch.
    Applied {
        epoch: u64,
    },
    /// The command was valid but changed nothing (no new epoch).
    Unchanged {
        epoch: u64,
    },
    Refused(CommandError),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ProposeError {
    #[error("not the leader (leader hint: {0:?})")]
    NotLeader(Option<u64>),
    #[error("raft refused the proposal: {0}")]
    Raft(String),
}

/// What the runtime must do after driving the core. Order matters: persist
/// `entries` and `hard_state` (and fsync) before sending `messages`.
#[derive(Debug, Default)]
pub struct MonOutput {
    pub messages: Vec<Message>,
    pub entries: Vec<Entry>,
    pub hard_state: Option<HardState>,
    /// Commands this node proposed that are now committed: (request, outcome).
    pub completed: Vec<(u64, CommandOutcome)>,
    /// Map deltas applied on this node, in epoch order (for subscribers).
    pub deltas: Vec<MapDelta>,
}

impl MonOutput {
    pub fn is_empty(&self) -> bool {
        self.messages.is_empty()
            && self.entries.is_empty()
            && self.hard_state.is_none()
            && self.completed.is_empty()
            && self.deltas.is_empty()
    }
}

/// Deltas kept for subscribers that fall a little behind.
pub const DELTA_HISTORY: usize = 1000;

pub struct MonCore {
    id: u64,
    incarnation: u64,
    node: RawNode<MemStorage>,
    map: ClusterMap,
    applied: u64,
    next_request: u64,
    /// Outcomes of this node's proposals, until the runtime takes them.
    completed: Vec<(u64, CommandOutcome)>,
    /// Deltas applied since the runtime last took them.
    new_deltas: Vec<MapDelta>,
    /// The last [`DELTA_HISTORY`] deltas, oldest first.
    history: VecDeque<MapDelta>,
}

fn logger() -> slog::Logger {
    slog::Logger::root(slog::Discard, slog::o!())
}

impl MonCore {
    /// A node of a cluster whose voters are `peers` (this node included),
    /// restarted from `entries` and `hard_state` persisted earlier (empty
    /// for a new cluster). The map is rebuilt by re-applying the log.
    /// `incarnation` must differ between runs of one node (the runtime draws it at random).
    pub fn new(
        id: u64,
        incarnation: u64,
        peers: &[u64],
        fsid: [u8; 16],
        entries: &[Entry],
        hard_state: Option<HardState>,
    ) -> raft::Result<MonCore> {
        assert!(peers.contains(&id), "node {id} is not among the voters {peers:?}");
        let storage = MemStorage::new_with_conf_state(ConfState::from((peers.to_vec(), vec![])));
        {
            let mut store = storage.wl();
            if !entries.is_empty() {
                store.append(entries)?;
            }
            if let Some(hs) = hard_state {
                store.set_hardstate(hs);
            }
        }
        let config = Config {
            id,
            election_tick: 10,
            heartbeat_tick: 2,
            check_quorum: true,
            pre_vote: true,
            ..Default::default()
        };
        config.validate()?;
        let node = RawNode::new(&config, storage, &logger())?;
        Ok(MonCore {
            id,
            incarnation,
            node,
            map: ClusterMap::new(fsid),
            applied: 0,
            next_request: 1,
            completed: Vec::new(),
            new_deltas: Vec::new(),
            history: VecDeque::new(),
        })
    }

    pub fn id(&self) -> u64 {
        self.id
    }

    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    pub fn is_leader(&self) -> bool {
        self.node.raft.state == StateRole::Leader
    }

    pub fn leader(&self) -> Option<u64> {
        let leader = self.node.raft.leader_id;
        (leader != raft::INVALID_ID).then_some(leader)
    }

    /// One logical clock tick (the runtime calls it every 100 ms).
    pub fn tick(&mut self) {
        self.node.tick();
    }

    pub fn step(&mut self, message: Message) -> raft::Result<()> {
        self.node.step(message)
    }

    /// Proposes `command`; its outcome appears in a later [`MonOutput::completed`]
    /// under the returned request id, once committed. Only the leader proposes.
    pub fn propose(&mut self, command: Command) -> Result<u64, ProposeError> {
        if !self.is_leader() {
            return Err(ProposeError::NotLeader(self.leader()));
        }
        let request = self.next_request;
        self.next_request += 1;
        let data =
            postcard::to_allocvec(&Proposal { proposer: self.id, incarnation: self.incarnation, request, command })
                .expect("encoding to a Vec");
        self.node.propose(vec![], data).map_err(|e| ProposeError::Raft(e.to_string()))?;
        Ok(request)
    }

    /// Collects everything the runtime must do now. Call after ticks, steps
    /// and proposals; the runtime persists, then sends, then calls again
    /// until the output is empty.
    pub fn drive(&mut self) -> MonOutput {
        let mut out = MonOutput::default();
        if !self.node.has_ready() {
            out.completed = std::mem::take(&mut self.completed);
            out.deltas = std::mem::take(&mut self.new_deltas);
            return out;
        }
        let mut ready = self.node.ready();
        out.messages.extend(ready.take_messages());
        let committed = ready.take_committed_entries();
        self.apply_entries(&committed);
        if !ready.entries().is_empty() {
            out.entries = ready.entries().clone();
            self.node.mut_store().wl().append(ready.entries()).expect("raft hands out appendable entries");
        }
        if let Some(hs) = ready.hs() {
            out.hard_state = Some(hs.clone());
            self.node.mut_store().wl().set_hardstate(hs.clone());
        }
        out.messages.extend(ready.take_persisted_messages());
        let mut light = self.node.advance(ready);
        if let Some(commit) = light.commit_index() {
            let mut hs = self.node.store().rl().hard_state().clone();
            hs.set_commit(commit);
            self.node.mut_store().wl().set_hardstate(hs.clone());
            out.hard_state = Some(hs);
        }
        out.messages.extend(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply_entries(&committed);
        self.node.advance_apply();
        out.completed = std::mem::take(&mut self.completed);
        out.deltas = std::mem::take(&mut self.new_deltas);
        out
    }

    /// The deltas after `epoch`, if the history still holds them all.
    pub fn deltas_since(&self, epoch: u64) -> Option<Vec<MapDelta>> {
        if epoch >= self.map.epoch {
            return Some(Vec::new());
        }
        let first = self.history.front()?.epoch;
        (epoch + 1 >= first).then(|| self.history.iter().filter(|d| d.epoch > epoch).cloned().collect())
    }

    fn apply_entries(&mut self, entries: &[Entry]) {
        for entry in entries {
            if entry.index <= self.applied {
                continue;
            }
            self.applied = entry.index;
            if entry.get_entry_type() != EntryType::EntryNormal || entry.data.is_empty() {
                continue; // leader no-ops and configuration changes
            }
            let Ok(proposal) = postcard::from_bytes::<Proposal>(&entry.data) else {
                tracing::error!(index = entry.index, "undecodable monitor log entry skipped");
                continue;
            };
            let outcome = match self.map.run(&proposal.command) {
                Ok(Some(delta)) => {
                    let epoch = delta.epoch;
                    if self.history.len() == DELTA_HISTORY {
                        self.history.pop_front();
                    }
                    self.history.push_back(delta.clone());
                    self.new_deltas.push(delta);
                    CommandOutcome::Applied { epoch }
                }
                Ok(None) => CommandOutcome::Unchanged { epoch: self.map.epoch },
                Err(err) => CommandOutcome::Refused(err),
            };
            if proposal.proposer == self.id && proposal.incarnation == self.incarnation {
                self.completed.push((proposal.request, outcome));
            }
        }
    }
}

/// Appends a batch of entries to a persisted log the way raft storage does:
/// entries from the batch's first index on are replaced (a new leader may
/// overwrite an uncommitted tail).
pub fn append_to_log(log: &mut Vec<Entry>, batch: &[Entry]) {
    let Some(first) = batch.first() else { return };
    let keep = log.iter().position(|e| e.index >= first.index).unwrap_or(log.len());
    log.truncate(keep);
    debug_assert!(log.last().is_none_or(|e| e.index + 1 == first.index), "a gap in the monitor log");
    log.extend_from_slice(batch);
}

/// The outcome as the monitor answers it on the wire.
impl From<CommandOutcome> for duplex_mon_client::WireOutcome {
    fn from(outcome: CommandOutcome) -> Self {
        match outcome {
            CommandOutcome::Applied { epoch } => Self::Applied { epoch },
            CommandOutcome::Unchanged { epoch } => Self::Unchanged { epoch },
            CommandOutcome::Refused(err) => Self::Refused(err.to_string()),
        }
    }
}
