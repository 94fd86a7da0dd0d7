//! The monitor's commands, as a pure function from (map, command) to delta.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::{
    active_set, pg_temp, upmap, ActiveSet, Change, ClusterMap, FullRatios, Fullness, MapDelta, OsdId, OsdInfo, Pool,
    PoolId,
};

/// Limits that keep one map sane.
pub const MAX_PG_NUM: u32 = 1 << 20;
pub const MAX_POOL_SIZE: u8 = 10;
pub const MAX_NAME_LEN: usize = 128;
/// PGs one [`Command::ClearPgTemp`] or [`Command::RecordActive`] may name.
pub const MAX_PGS_PER_COMMAND: usize = 1 << 16;

/// One PG of [`Command::UnrecordShards`]: (pool, PG, the interval it peered,
/// the stale OSDs, the acting set it peered by position).
pub type UnrecordRequest = (PoolId, u32, u64, Vec<OsdId>, Vec<OsdId>);

/// Refuses a command naming more than [`MAX_PGS_PER_COMMAND`] PGs whole.
fn at_most_max_pgs(pgs: usize) -> Result<(), CommandError> {
    if pgs > MAX_PGS_PER_COMMAND {
        return Err(CommandError::Invalid(format!("at most {MAX_PGS_PER_COMMAND} PGs per command")));
    }
    Ok(())
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Command {
    /// An OSD starts: registers (or re-registers) its address, host and weight, and is marked up and in.
    OsdBoot {
        id: OsdId,
        addr: String,
        host: String,
        weight: u32,
    },
    MarkDown {
        id: OsdId,
    },
    /// The failure detector's verdict: marks `id` down only if its
    /// incarnation (`state_epoch`) is still `incarnation`. A verdict about a
    /// process that has since restarted (its boot committed between the
    /// detector's tick and this command) changes nothing: it must not take
    /// down the new process.
    MarkIncarnationDown {
        id: OsdId,
        incarnation: u64,
    },
    MarkUp {
        id: OsdId,
    },
    MarkOut {
        id: OsdId,
    },
    MarkIn {
        id: OsdId,
    },
    PoolCreate {
        name: String,
        size: u8,
        min_size: u8,
        pg_num: u32,
    },
    PoolDelete {
        name: String,
    },
    /// An erasure-coded pool: `k + m` shards a PG, on as many hosts
    /// (refused while fewer hosts have an OSD that is in); `min_size`
    /// defaults to `k + 1`.
    PoolCreateErasure {
        name: String,
        code: crate::ErasureCode,
        min_size: Option<u8>,
        pg_num: u32,
    },
    /// A chunk pool (replicated, `size` copies): it holds a deduplicated
    /// pool's chunk objects, and takes chunk operations only (crate::tier).
    PoolCreateChunks {
        name: String,
        size: u8,
        min_size: u8,
        pg_num: u32,
        store: crate::ChunkStore,
    },
    /// Give pool `name` a deduplication tier in chunk pool `chunk_pool`,
    /// cut into `chunk_size`-byte chunks by `chunking` (set once:
    /// crate::tier::set_tier).
    PoolSetTier {
        name: String,
        chunk_pool: String,
        chunk_size: u32,
        chunking: crate::Chunking,
    },
    /// Set one of a pool's settings (crate::tier::POOL_SET_KEYS).
    PoolSet {
        name: String,
        key: String,
        value: String,
    },
    /// Set image `image`'s own QoS settings (issue 31): the whole set,
    /// `key=value` as `duplex image set` takes them, checked as a whole;
    /// empty removes them. `pool` is the image's data pool.
    ImageQosSet {
        pool: PoolId,
        image: u64,
        settings: Vec<(String, String)>,
    },
    /// Grow the PG count (PGs split; shrinking is not supported yet).
    PoolSetPgNum {
        name: String,
        pg_num: u32,
    },
    /// A primary backfilled these PGs' up sets in the interval that began
    /// at map epoch `interval`: their temporary acting sets may go
    /// (crate::pg_temp). A PG whose up set or members moved on since is
    /// left pinned. For an erasure-coded PG: it is active on a pin the
    /// monitor held for it past its record (crate::pg_temp::may_release),
    /// which goes; its record stays.
    ClearPgTemp {
        interval: u64,
        pgs: Vec<(PoolId, u32, Vec<OsdId>)>,
    },
    /// A primary whose own copy of these PGs needs a backfill hands each
    /// to a member that holds it whole: pin it to the given OSDs, its
    /// acting set with that member first, so it serves while the old
    /// primary is filled in the background (crate::pg_temp). Its pin goes
    /// like any other ([`Command::ClearPgTemp`]) once that ends. A PG whose
    /// acting set moved on, or one of whose OSDs restarted since the
    /// interval that began at map epoch `interval`, is left.
    HandOver {
        interval: u64,
        pgs: Vec<(PoolId, u32, Vec<OsdId>)>,
    },
    /// A primary is about to serve these PGs from these OSDs, in the
    /// interval that began at the given epoch: record them as each PG's
    /// last active set (crate::active_set). One that is not the PG's acting
    /// set in the current map any more, or older than its record, is left.
    RecordActive {
        pgs: Vec<(PoolId, u32, u64, Vec<OsdId>)>,
    },
    /// The operator gives up a down OSD's copies for good: PGs that wait
    /// for it (their last active set, or their pin) go on without it, with
    /// the best copies left. Acknowledged writes only it held are lost.
    MarkLost {
        id: OsdId,
    },
    /// An OSD reports how full its store is (it sends this itself when
    /// its state against the map's ratios changes).
    SetOsdFullness {
        id: OsdId,
        fullness: Fullness,
    },
    /// The operator sets the ratios (per mille) at which OSDs are near
    /// full, backfill full and full.
    SetFullRatios {
        nearfull: u16,
        backfillfull: u16,
        full: u16,
    },
    /// The balancer (or an operator) sets these PGs' upmap items (empty:
    /// back to placement's OSDs); PGs that move are pinned and backfilled
    /// (crate::upmap, crate::pg_temp). Refused whole if any is not valid.
    SetPgUpmap {
        pgs: Vec<(PoolId, u32, upmap::Items)>,
    },
    /// The operator sets the spread (per mille) beyond which the balancer
    /// moves PGs (0: off).
    SetBalancer {
        max_spread_permille: u16,
    },
    /// An eventually consistent pool (crate::eventual): replicated, its
    /// writes acknowledged from the primary's log.
    PoolCreateEventual {
        name: String,
        size: u8,
        min_size: u8,
        pg_num: u32,
        eventual: crate::Eventual,
    },
    /// An erasure-coded PG's primary, peering on the acting set given (by
    /// position) in the interval that began at the given epoch, found
    /// these OSDs of its last active set no longer holding their
    /// positions' shards as recorded: each leaves a hole in the record,
    /// and the PG's pin follows the holders left
    /// (crate::active_set::unrecorded). A PG for which that is not
    /// allowed, or whose interval has moved on, is left.
    UnrecordShards {
        pgs: Vec<UnrecordRequest>,
    },
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq, Serialize, Deserialize)]
pub enum CommandError {
    #[error("OSD {0} does not exist")]
    NoSuchOsd(OsdId),
    #[error("pool '{0}' does not exist")]
    NoSuchPool(String),
    #[error("pool '{0}' already exists")]
    PoolExists(String),
    #[error("invalid command: {0}")]
    Invalid(String),
}

fn check_name(what: &str, name: &str) -> Result<(), CommandError> {
    if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(CommandError::Invalid(format!(
            "{what} name '{name}' must be 1 to {MAX_NAME_LEN} characters without spaces"
        )));
    }
    Ok(())
}

impl ClusterMap {
    /// Hosts with at least one OSD that is in: the failure domains an
    /// erasure-coded PG can spread its shards over.
    pub fn hosts_with_in_osds(&self) -> usize {
        self.osds.values().filter(|osd| osd.is_in).map(|osd| osd.host.as_str()).collect::<BTreeSet<_>>().len()
    }

    /// A new replicated pool, checked: its name free, its sizes and PG count in range.
    fn new_replicated_pool(&self, name: &str, size: u8, min_size: u8, pg_num: u32) -> Result<Pool, CommandError> {
        check_name("pool", name)?;
        if self.pool_by_name(name).is_some() {
            return Err(CommandError::PoolExists(name.to_string()));
        }
        if size == 0 || size > MAX_POOL_SIZE || min_size == 0 || min_size > size {
            return Err(CommandError::Invalid(format!(
                "need 1 <= min_size ({min_size}) <= size ({size}) <= {MAX_POOL_SIZE}"
            )));
        }
        if pg_num == 0 || pg_num > MAX_PG_NUM {
            return Err(CommandError::Invalid(format!("pg_num must be 1..={MAX_PG_NUM}")));
        }
        Ok(Pool::new(self.next_pool_id, name.to_string(), size, min_size, pg_num, None))
    }

    /// The delta that carries out `command` on this map. `Ok(None)`: the
    /// command changes nothing (marking an up OSD up, say), so no new epoch.
    pub fn execute(&self, command: &Command) -> Result<Option<MapDelta>, CommandError> {
        let epoch = self.epoch + 1;
        let osd = |id: &OsdId| self.osds.get(id).cloned().ok_or(CommandError::NoSuchOsd(*id));
        let changes = match command {
            Command::OsdBoot { id, addr, host, weight } => {
                check_name("host", host)?;
                if *id == crate::NO_OSD {
                    return Err(CommandError::Invalid(format!("OSD id {id} is reserved")));
                }
                if addr.is_empty() || addr.len() > MAX_NAME_LEN {
                    return Err(CommandError::Invalid(format!("OSD address '{addr}' is not valid")));
                }
                if *weight == 0 {
                    return Err(CommandError::Invalid("an OSD's weight must be positive".into()));
                }
                let mut changes = Vec::new();
                if !self.hosts.contains_key(host) {
                    let id = self.hosts.values().max().map_or(1, |m| m + 1);
                    changes.push(Change::AddHost { name: host.clone(), id });
                }
                let previous = self.osds.get(id);
                let info = OsdInfo {
                    id: *id,
                    addr: addr.clone(),
                    host: host.clone(),
                    weight: *weight,
                    up: true,
                    // A returning OSD keeps an operator's "out"; a new one starts in.
                    is_in: previous.is_none_or(|p| p.is_in || !p.up),
                    // Every boot is a new incarnation, even of an OSD the
                    // map still shows up (it restarted within the failure
                    // grace): its PGs' intervals change, so their primaries
                    // peer again and recover what it missed.
                    state_epoch: epoch,
                    // Its store is the one it had: it reports a change.
                    fullness: previous.map_or(Fullness::Normal, |p| p.fullness),
                };
                changes.push(Change::SetOsd(info));
                changes
            }
            Command::MarkIncarnationDown { id, incarnation } => {
                let mut info = osd(id)?;
                if !info.up || info.state_epoch != *incarnation {
                    return Ok(None);
                }
                info.up = false;
                info.state_epoch = epoch;
                vec![Change::SetOsd(info)]
            }
            Command::MarkDown { id } | Command::MarkUp { id } => {
                let mut info = osd(id)?;
                let up = matches!(command, Command::MarkUp { .. });
                if info.up == up {
                    return Ok(None);
                }
                info.up = up;
                info.state_epoch = epoch;
                vec![Change::SetOsd(info)]
            }
            Command::SetOsdFullness { id, fullness } => {
                let mut info = osd(id)?;
                if info.fullness == *fullness {
                    return Ok(None);
                }
                info.fullness = *fullness;
                vec![Change::SetOsd(info)]
            }
            Command::SetFullRatios { nearfull, backfillfull, full } => {
                let ratios = FullRatios { nearfull: *nearfull, backfillfull: *backfillfull, full: *full };
                if !ratios.is_valid() {
                    return Err(CommandError::Invalid(format!(
                        "ratios must be nearfull <= backfillfull <= full <= 1000 per mille, not {nearfull}, {backfillfull}, {full}"
                    )));
                }
                if ratios == self.full_ratios {
                    return Ok(None);
                }
                vec![Change::SetFullRatios(ratios)]
            }
            Command::SetPgUpmap { pgs } => {
                at_most_max_pgs(pgs.len())?;
                let mut named = std::collections::BTreeSet::new();
                let mut changes = Vec::new();
                for (pool, pg, items) in pgs {
                    if !named.insert((*pool, *pg)) {
                        return Err(CommandError::Invalid(format!("PG {pool}.{pg:x} named twice")));
                    }
                    upmap::may_set(self, (*pool, *pg), items).map_err(CommandError::Invalid)?;
                    let current = self.pg_upmap.get(&(*pool, *pg)).map(Vec::as_slice).unwrap_or(&[]);
                    if current != items.as_slice() {
                        changes.push(Change::SetPgUpmap { pool: *pool, pg: *pg, items: items.clone() });
                    }
                }
                if changes.is_empty() {
                    return Ok(None);
                }
                changes
            }
            Command::SetBalancer { max_spread_permille } => {
                if *max_spread_permille > 1000 {
                    return Err(CommandError::Invalid(format!(
                        "the balancer's spread is at most 1000 per mille, not {max_spread_permille}"
                    )));
                }
                if *max_spread_permille == self.balancer_max_spread {
                    return Ok(None);
                }
                vec![Change::SetBalancerMaxSpread(*max_spread_permille)]
            }
            Command::MarkOut { id } | Command::MarkIn { id } => {
                let mut info = osd(id)?;
                let is_in = matches!(command, Command::MarkIn { .. });
                if info.is_in == is_in {
                    return Ok(None);
                }
                info.is_in = is_in;
                vec![Change::SetOsd(info)]
            }
            Command::PoolCreate { name, size, min_size, pg_num } => {
                vec![Change::SetPool(self.new_replicated_pool(name, *size, *min_size, *pg_num)?)]
            }
            Command::PoolCreateChunks { name, size, min_size, pg_num, store } => {
                let mut pool = self.new_replicated_pool(name, *size, *min_size, *pg_num)?;
                pool.chunks = Some(*store);
                vec![Change::SetPool(pool)]
            }
            Command::PoolCreateEventual { name, size, min_size, pg_num, eventual } => {
                if let Some(why) = eventual.invalid_because() {
                    return Err(CommandError::Invalid(why));
                }
                let mut pool = self.new_replicated_pool(name, *size, *min_size, *pg_num)?;
                pool.eventual = Some(*eventual);
                vec![Change::SetPool(pool)]
            }
            Command::PoolSetTier { name, chunk_pool, chunk_size, chunking } => {
                let pool = self.pool_by_name(name).ok_or_else(|| CommandError::NoSuchPool(name.clone()))?;
                let chunks =
                    self.pool_by_name(chunk_pool).ok_or_else(|| CommandError::NoSuchPool(chunk_pool.clone()))?;
                match crate::tier::set_tier(pool, chunks, *chunk_size, *chunking)? {
                    Some(pool) => vec![Change::SetPool(pool)],
                    None => return Ok(None),
                }
            }
            Command::PoolSet { name, key, value } => {
                let pool = self.pool_by_name(name).ok_or_else(|| CommandError::NoSuchPool(name.clone()))?;
                match crate::tier::pool_set(pool, key, value)? {
                    Some(pool) => vec![Change::SetPool(pool)],
                    None => return Ok(None),
                }
            }
            Command::ImageQosSet { pool, image, settings } => {
                if !self.pools.contains_key(pool) {
                    return Err(CommandError::Invalid(format!("no pool with id {pool}")));
                }
                let checked = duplex_qos::ClassSettings::from_strings(settings)
                    .map_err(|err| CommandError::Invalid(err.to_string()))?;
                // Kept in their canonical text, defaults left out, so the
                // same settings always make the same map.
                let settings: Vec<(String, String)> =
                    checked.settings().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
                if self.image_qos.get(&(*pool, *image)).map_or(settings.is_empty(), |old| *old == settings) {
                    return Ok(None);
                }
                vec![Change::SetImageQos { pool: *pool, image: *image, settings }]
            }
            Command::PoolCreateErasure { name, code, min_size, pg_num } => {
                check_name("pool", name)?;
                if self.pool_by_name(name).is_some() {
                    return Err(CommandError::PoolExists(name.clone()));
                }
                if let Some(why) = code.invalid_because() {
                    return Err(CommandError::Invalid(why));
                }
                let size = code.k + code.m;
                let min_size = min_size.unwrap_or(code.k + 1).min(size);
                if min_size < code.k {
                    return Err(CommandError::Invalid(format!(
                        "min_size {min_size} is below k = {}: a PG could take writes it cannot read back",
                        code.k
                    )));
                }
                if *pg_num == 0 || *pg_num > MAX_PG_NUM {
                    return Err(CommandError::Invalid(format!("pg_num must be 1..={MAX_PG_NUM}")));
                }
                let hosts = self.hosts_with_in_osds();
                if hosts < usize::from(size) {
                    return Err(CommandError::Invalid(format!(
                        "{}+{} puts each PG's {size} shards on {size} hosts, and {hosts} host{} an OSD that is in",
                        code.k,
                        code.m,
                        if hosts == 1 { " has" } else { "s have" }
                    )));
                }
                vec![Change::SetPool(Pool::new(self.next_pool_id, name.clone(), size, min_size, *pg_num, Some(*code)))]
            }
            Command::PoolDelete { name } => {
                let pool = self.pool_by_name(name).ok_or_else(|| CommandError::NoSuchPool(name.clone()))?;
                if let Some(base) = self.pools.values().find(|p| p.dedup.is_some_and(|t| t.chunk_pool == pool.id)) {
                    return Err(CommandError::Invalid(format!(
                        "pool '{name}' holds the chunks of pool '{}'; delete that pool first",
                        base.name
                    )));
                }
                vec![Change::RemovePool(pool.id)]
            }
            Command::PoolSetPgNum { name, pg_num } => {
                let mut pool =
                    self.pool_by_name(name).cloned().ok_or_else(|| CommandError::NoSuchPool(name.clone()))?;
                if *pg_num < pool.pg_num || *pg_num > MAX_PG_NUM {
                    return Err(CommandError::Invalid(format!(
                        "pg_num can only grow (from {} up to {MAX_PG_NUM}); merging PGs is not supported",
                        pool.pg_num
                    )));
                }
                if *pg_num == pool.pg_num {
                    return Ok(None);
                }
                pool.pg_num = *pg_num;
                vec![Change::SetPool(pool)]
            }
            Command::ClearPgTemp { interval, pgs } => {
                at_most_max_pgs(pgs.len())?;
                let hierarchy = self.hierarchy();
                let erasure = |pool: &PoolId| self.pools.get(pool).is_some_and(|p| p.is_erasure());
                // An erasure-coded PG's pin held for its primary goes, and
                // its record stays (pg_temp::may_release).
                let released = pgs
                    .iter()
                    .filter(|(pool, pg, _)| {
                        erasure(pool) && pg_temp::may_release(self, &hierarchy, (*pool, *pg), *interval)
                    })
                    .map(|(pool, pg, _)| Change::SetPgTemp { pool: *pool, pg: *pg, osds: Vec::new() });
                let changes: Vec<Change> = pgs
                    .iter()
                    .filter(|(pool, pg, up)| pg_temp::may_clear(self, &hierarchy, (*pool, *pg), up, *interval))
                    .flat_map(|(pool, pg, up)| {
                        // The backfilled up set holds every write now, and
                        // the pin's OSDs may leave the PG in this epoch.
                        let set = ActiveSet { since: epoch, osds: up.clone() };
                        [
                            Change::SetPgTemp { pool: *pool, pg: *pg, osds: Vec::new() },
                            Change::SetActiveSet { pool: *pool, pg: *pg, set: Some(set) },
                        ]
                    })
                    .chain(released)
                    .collect();
                if changes.is_empty() {
                    return Ok(None);
                }
                changes
            }
            Command::HandOver { interval, pgs } => {
                at_most_max_pgs(pgs.len())?;
                let hierarchy = self.hierarchy();
                let mut named = std::collections::BTreeSet::new();
                let changes: Vec<Change> = pgs
                    .iter()
                    .filter(|(pool, pg, osds)| {
                        named.insert((*pool, *pg))
                            && pg_temp::may_hand_over(self, &hierarchy, (*pool, *pg), osds, *interval)
                    })
                    .map(|(pool, pg, osds)| Change::SetPgTemp { pool: *pool, pg: *pg, osds: osds.clone() })
                    .collect();
                if changes.is_empty() {
                    return Ok(None);
                }
                changes
            }
            Command::RecordActive { pgs } => {
                at_most_max_pgs(pgs.len())?;
                let hierarchy = self.hierarchy();
                let mut changes: Vec<Change> = Vec::new();
                let mut named = std::collections::BTreeSet::new();
                for (pool, pg, interval, osds) in pgs {
                    // A PG named twice: its first record counts.
                    if named.insert((*pool, *pg))
                        && active_set::may_record(self, &hierarchy, (*pool, *pg), *interval, osds)
                    {
                        let set = ActiveSet { since: *interval, osds: osds.clone() };
                        changes.push(Change::SetActiveSet { pool: *pool, pg: *pg, set: Some(set) });
                    }
                }
                if changes.is_empty() {
                    return Ok(None);
                }
                changes
            }
            Command::UnrecordShards { pgs } => {
                at_most_max_pgs(pgs.len())?;
                let hierarchy = self.hierarchy();
                let mut named = std::collections::BTreeSet::new();
                let changes: Vec<Change> = pgs
                    .iter()
                    .filter(|(pool, pg, ..)| named.insert((*pool, *pg)))
                    .filter_map(|(pool, pg, interval, stale, acting)| {
                        let set = active_set::unrecorded(self, &hierarchy, (*pool, *pg), (*interval, acting), stale)?;
                        Some(Change::SetActiveSet { pool: *pool, pg: *pg, set: Some(set) })
                    })
                    .collect();
                if changes.is_empty() {
                    return Ok(None);
                }
                changes
            }
            Command::MarkLost { id } => {
                let info = osd(id)?;
                if info.up {
                    return Err(CommandError::Invalid(format!(
                        "osd.{id} is up: only a down OSD's copies can be given up (stop it first)"
                    )));
                }
                let changes = active_set::lose(self, *id);
                if changes.is_empty() {
                    return Ok(None);
                }
                changes
            }
        };
        // What the command changes may move PGs: pin those that move onto
        // OSDs without their data.
        let mut next = self.clone();
        next.apply(&MapDelta { epoch, changes: changes.clone() })
            .map_err(|e| CommandError::Invalid(format!("the command's own changes do not apply: {e}")))?;
        let mut changes = changes;
        changes.extend(pg_temp::settle(self, &next));
        Ok(Some(MapDelta { epoch, changes }))
    }

    /// Executes and applies: the monitor's state transition in one call.
    pub fn run(&mut self, command: &Command) -> Result<Option<MapDelta>, CommandError> {
        let delta = self.execute(command)?;
        if let Some(delta) = &delta {
            self.apply(delta).expect("a delta made from this map applies to it");
        }
        Ok(delta)
    }
}
