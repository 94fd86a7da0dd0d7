//! # duplex-map: the cluster map
//!
//! The map says which OSDs exist (address, host, weight, up/down, in/out),
//! which pools exist (replication size, min_size, PG count), and at which
//! epoch. Every change is a [`MapDelta`] from epoch N to N+1, so subscribers
//! apply small deltas instead of refetching the map.
//!
//! [`ClusterMap::execute`] is the monitor's logic as a pure function: it
//! checks a [`Command`] against the map and returns the delta that carries
//! it out. The monitor replicates deltas through Raft, and every replica
//! applies them with [`ClusterMap::apply`]. No I/O, no clock: it is tested
//! without Raft or sockets.
//!
//! Encoding ([`codec`]): magic, format version, a postcard body and a
//! crc32c. The decoder refuses bad input and never panics.
//!
//! **Temporary acting sets** ([`ClusterMap::pg_temp`], [`pg_temp`]): when
//! placement moves a PG onto OSDs that do not hold its data yet, the PG
//! keeps being served by the OSDs that do, while its primary copies the
//! data to the new ones in the background; then the primary asks the
//! monitor to drop the temporary set ([`Command::ClearPgTemp`]).
//!
//! **Last active sets** ([`ClusterMap::active_sets`], [`active_set`]): the
//! OSDs that hold every write a PG acknowledged. A PG none of whose set is
//! up is *down*: peering among the others would serve older data.

pub mod active_set;
pub mod balancer;
pub mod codec;
mod command;
pub mod eventual;
pub mod failure;
pub mod pg_state;
pub mod pg_temp;
pub mod tier;
pub mod upmap;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use active_set::ActiveSet;
pub use eventual::Eventual;
pub use pg_state::{pg_state, Filling, PgState};
pub use tier::{ChunkStore, Chunking, Compression, DedupMode, DedupTier};

pub use command::{Command, CommandError, MAX_PGS_PER_COMMAND};
pub use failure::{FailureConfig, FailureDetector};

pub type OsdId = u32;
pub type PoolId = u32;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct OsdInfo {
    pub id: OsdId,
    /// Where peers and clients reach it ("ip:port").
    pub addr: String,
    pub host: String,
    /// 16.16 fixed point; conventionally capacity in TiB.
    pub weight: u32,
    pub up: bool,
    pub is_in: bool,
    /// Epoch of the last up/down change or boot (the failure detector's
    /// clock, and the OSD's incarnation: peering keys intervals on it).
    pub state_epoch: u64,
    /// How full its store is, against the map's [`FullRatios`], as the OSD
    /// last reported it.
    pub fullness: Fullness,
}

/// An OSD's store use against the map's [`FullRatios`], as Ceph's OSD
/// states: writes to a PG with a `Full` member are refused (`NoSpace`,
/// ENOSPC at the client); deletes, truncates and discards go on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Fullness {
    #[default]
    Normal,
    /// Past `nearfull`: a warning.
    NearFull,
    /// Past `backfillfull`: backfill into it should wait.
    BackfillFull,
    /// Past `full`: client writes to its PGs are refused.
    Full,
}

/// The use ratios (per mille of a store's fullest partition) at which an
/// OSD becomes near full, backfill full and full (Ceph's defaults: 85%,
/// 90%, 95%).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct FullRatios {
    pub nearfull: u16,
    pub backfillfull: u16,
    pub full: u16,
}

impl Default for FullRatios {
    fn default() -> Self {
        FullRatios { nearfull: 850, backfillfull: 900, full: 950 }
    }
}

impl FullRatios {
    /// Ordered and at most 100%.
    pub fn is_valid(&self) -> bool {
        self.nearfull <= self.backfillfull && self.backfillfull <= self.full && self.full <= 1000
    }

    /// An OSD's state at `used_permille` of its fullest partition.
    pub fn classify(&self, used_permille: u64) -> Fullness {
        debug_assert!(self.is_valid(), "{self:?}");
        if used_permille >= u64::from(self.full) {
            Fullness::Full
        } else if used_permille >= u64::from(self.backfillfull) {
            Fullness::BackfillFull
        } else if used_permille >= u64::from(self.nearfull) {
            Fullness::NearFull
        } else {
            Fullness::Normal
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pool {
    pub id: PoolId,
    pub name: String,
    /// Replicas per PG; shards (`k + m`) in an erasure-coded pool.
    pub size: u8,
    /// Below this many up replicas (shards) a PG stops accepting writes.
    pub min_size: u8,
    pub pg_num: u32,
    /// `Some`: the pool is erasure-coded, and its PGs' sets are positional
    /// (see [`ClusterMap::pg_osds`]).
    pub erasure: Option<ErasureCode>,
    /// `Some`: a deduplicated pool, whose objects' chunks go to a chunk
    /// pool ([`tier`]).
    pub dedup: Option<DedupTier>,
    /// `Some`: a chunk pool, holding content-addressed chunk objects only.
    pub chunks: Option<ChunkStore>,
    /// `Some`: an eventually consistent pool ([`eventual`]): writes are
    /// acknowledged from the primary's log and replicated in the background.
    pub eventual: Option<Eventual>,
    /// Its images' limits unless an image sets its own (issue 31): QoS
    /// settings as `duplex image set` takes them (`qos_iops`, ...), checked
    /// when set, an image's own setting of a key winning over the pool's.
    pub qos: Vec<(String, String)>,
}

impl Pool {
    pub fn is_erasure(&self) -> bool {
        self.erasure.is_some()
    }

    pub fn is_eventual(&self) -> bool {
        self.eventual.is_some()
    }

    /// A pool of its kind with none of the options (a replicated pool
    /// unless `erasure`).
    pub fn new(id: PoolId, name: String, size: u8, min_size: u8, pg_num: u32, erasure: Option<ErasureCode>) -> Pool {
        Pool { id, name, size, min_size, pg_num, erasure, dedup: None, chunks: None, eventual: None, qos: Vec::new() }
    }

    /// The limits its images keep to unless they set their own.
    pub fn default_limits(&self) -> duplex_qos::Limits {
        self.default_settings().limits
    }

    /// The QoS settings its images have unless they set their own.
    pub fn default_settings(&self) -> duplex_qos::ClassSettings {
        settings_over(duplex_qos::ClassSettings::default(), &self.qos, &self.name)
    }
}

/// `base` with `pairs` (checked when they were set) over it.
pub fn settings_over(
    mut base: duplex_qos::ClassSettings,
    pairs: &[(String, String)],
    whose: &str,
) -> duplex_qos::ClassSettings {
    for (key, value) in pairs {
        // Checked when set ([`Command::PoolSet`], [`Command::ImageQosSet`]): none fails here.
        let checked = base.set(key, value);
        debug_assert!(checked.is_ok(), "{whose} holds the unchecked setting {key}={value}");
    }
    base
}

/// An erasure-coded pool's code: each PG holds `k` data shards and `m`
/// coding shards on `k + m` hosts, and an object is cut into stripes of
/// `k` units of `stripe_unit` bytes (the `duplex-ec` crate's `Profile`,
/// which the OSDs and clients build from this).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ErasureCode {
    pub k: u8,
    pub m: u8,
    pub stripe_unit: u32,
}

impl ErasureCode {
    /// The smallest and the largest stripe unit (powers of two between).
    pub const MIN_STRIPE_UNIT: u32 = 4 << 10;
    pub const MAX_STRIPE_UNIT: u32 = 64 << 10;

    /// Why this code cannot make a pool (`None`: it can).
    pub fn invalid_because(&self) -> Option<String> {
        let shards = u16::from(self.k) + u16::from(self.m);
        if self.k < 2 || self.m < 1 {
            return Some(format!(
                "an erasure code needs k >= 2 data shards and m >= 1 coding shards (got {}+{})",
                self.k, self.m
            ));
        }
        if shards > u16::from(command::MAX_POOL_SIZE) {
            return Some(format!(
                "{}+{} is {shards} shards; a PG holds at most {}",
                self.k,
                self.m,
                command::MAX_POOL_SIZE
            ));
        }
        let unit = self.stripe_unit;
        if !unit.is_power_of_two() || !(Self::MIN_STRIPE_UNIT..=Self::MAX_STRIPE_UNIT).contains(&unit) {
            return Some(format!("a stripe unit is a power of two from 4 to 64 KiB (got {unit} bytes)"));
        }
        None
    }

    pub fn shards(&self) -> usize {
        usize::from(self.k) + usize::from(self.m)
    }
}

/// The hole in an erasure-coded PG's positional set: no OSD holds that
/// shard now (its OSD is down, or placement found no host for it). Never
/// an OSD's id (the monitor refuses it at boot).
pub const NO_OSD: OsdId = OsdId::MAX;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterMap {
    pub fsid: [u8; 16],
    pub epoch: u64,
    pub osds: BTreeMap<OsdId, OsdInfo>,
    /// Host name → placement id; ids are never reused.
    pub hosts: BTreeMap<String, u32>,
    pub pools: BTreeMap<PoolId, Pool>,
    pub next_pool_id: PoolId,
    /// PGs served by another set than the one placement names: the OSDs
    /// that hold the data, while the new ones are backfilled ([`pg_temp`]).
    pub pg_temp: BTreeMap<(PoolId, u32), Vec<OsdId>>,
    /// The OSDs each PG was last active on ([`active_set`]).
    pub active_sets: BTreeMap<(PoolId, u32), ActiveSet>,
    /// When OSDs count as near full, backfill full and full.
    pub full_ratios: FullRatios,
    /// Per PG, OSDs placement named replaced by others ([`upmap`]): the
    /// balancer's moves, applied on top of placement.
    pub pg_upmap: BTreeMap<(PoolId, u32), Vec<(OsdId, OsdId)>>,
    /// The balancer moves PGs while the fullest and the emptiest OSDs that
    /// are in differ by more than this, per mille of their stores (0: off).
    pub balancer_max_spread: u16,
    /// Per image (its data pool, its id), its own QoS settings as
    /// `duplex image set` takes them, over its pool's defaults: what the
    /// OSDs' schedulers and limiters hold it to (issue 31).
    pub image_qos: BTreeMap<(PoolId, u64), Vec<(String, String)>>,
}

/// The balancer's default: OSDs within 2% of each other are left alone.
pub const DEFAULT_BALANCER_MAX_SPREAD: u16 = 20;

/// Where a PG lives ([`ClusterMap::pg_sets`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PgSets {
    pub up: Vec<OsdId>,
    pub acting: Vec<OsdId>,
    pub backfill: Vec<OsdId>,
    /// The map pins the PG (even to OSDs in its up set's order): its
    /// primary asks for the pin to go once nothing is left to fill.
    pub pinned: bool,
}

/// One change inside a delta.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Change {
    SetOsd(OsdInfo),
    AddHost {
        name: String,
        id: u32,
    },
    SetPool(Pool),
    RemovePool(PoolId),
    /// Sets a PG's temporary acting set (empty: removes it).
    SetPgTemp {
        pool: PoolId,
        pg: u32,
        osds: Vec<OsdId>,
    },
    /// Sets a PG's last active set (`None`: removes it).
    SetActiveSet {
        pool: PoolId,
        pg: u32,
        set: Option<ActiveSet>,
    },
    SetFullRatios(FullRatios),
    /// Sets a PG's upmap items (empty: removes them).
    SetPgUpmap {
        pool: PoolId,
        pg: u32,
        items: Vec<(OsdId, OsdId)>,
    },
    SetBalancerMaxSpread(u16),
    /// Sets an image's QoS settings (empty: removes them).
    SetImageQos {
        pool: PoolId,
        image: u64,
        settings: Vec<(String, String)>,
    },
}

/// The change from epoch `epoch - 1` to `epoch`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MapDelta {
    pub epoch: u64,
    pub changes: Vec<Change>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ApplyError {
    #[error("delta for epoch {delta} does not follow map epoch {map}")]
    WrongEpoch { map: u64, delta: u64 },
    #[error("delta removes pool {0}, which does not exist")]
    NoSuchPool(PoolId),
}

impl ClusterMap {
    /// The empty map of a new cluster (epoch 0).
    pub fn new(fsid: [u8; 16]) -> ClusterMap {
        ClusterMap {
            fsid,
            epoch: 0,
            osds: BTreeMap::new(),
            hosts: BTreeMap::new(),
            pools: BTreeMap::new(),
            next_pool_id: 1,
            pg_temp: BTreeMap::new(),
            active_sets: BTreeMap::new(),
            full_ratios: FullRatios::default(),
            pg_upmap: BTreeMap::new(),
            balancer_max_spread: DEFAULT_BALANCER_MAX_SPREAD,
            image_qos: BTreeMap::new(),
        }
    }

    /// Applies `delta` (which must be for the next epoch).
    pub fn apply(&mut self, delta: &MapDelta) -> Result<(), ApplyError> {
        if delta.epoch != self.epoch + 1 {
            return Err(ApplyError::WrongEpoch { map: self.epoch, delta: delta.epoch });
        }
        // Validate first so that a refused delta changes nothing.
        for change in &delta.changes {
            if let Change::RemovePool(id) = change {
                if !self.pools.contains_key(id)
                    && !delta.changes.iter().any(|c| matches!(c, Change::SetPool(p) if p.id == *id))
                {
                    return Err(ApplyError::NoSuchPool(*id));
                }
            }
        }
        for change in &delta.changes {
            match change {
                Change::SetOsd(osd) => {
                    self.osds.insert(osd.id, osd.clone());
                }
                Change::AddHost { name, id } => {
                    self.hosts.insert(name.clone(), *id);
                }
                Change::SetPool(pool) => {
                    self.next_pool_id = self.next_pool_id.max(pool.id.saturating_add(1));
                    self.pools.insert(pool.id, pool.clone());
                }
                Change::RemovePool(id) => {
                    self.pools.remove(id);
                    self.pg_temp.retain(|(pool, _), _| pool != id);
                    self.active_sets.retain(|(pool, _), _| pool != id);
                    self.pg_upmap.retain(|(pool, _), _| pool != id);
                    self.image_qos.retain(|(pool, _), _| pool != id);
                }
                Change::SetPgTemp { pool, pg, osds } => set_or_remove(&mut self.pg_temp, (*pool, *pg), osds),
                Change::SetFullRatios(ratios) => self.full_ratios = *ratios,
                Change::SetPgUpmap { pool, pg, items } => set_or_remove(&mut self.pg_upmap, (*pool, *pg), items),
                Change::SetBalancerMaxSpread(spread) => self.balancer_max_spread = *spread,
                Change::SetImageQos { pool, image, settings } => {
                    set_or_remove(&mut self.image_qos, (*pool, *image), settings)
                }
                Change::SetActiveSet { pool, pg, set } => match set {
                    Some(set) => {
                        self.active_sets.insert((*pool, *pg), set.clone());
                    }
                    None => {
                        self.active_sets.remove(&(*pool, *pg));
                    }
                },
            }
        }
        self.epoch = delta.epoch;
        Ok(())
    }

    /// Checks the map's invariants (every decoded map passes through here).
    pub fn validate(&self) -> Result<(), String> {
        for (id, osd) in &self.osds {
            if *id != osd.id {
                return Err(format!("OSD key {id} holds OSD {}", osd.id));
            }
            if !self.hosts.contains_key(&osd.host) {
                return Err(format!("OSD {id} is on unknown host '{}'", osd.host));
            }
            if osd.weight == 0 || osd.state_epoch > self.epoch {
                return Err(format!("OSD {id}: zero weight or state from the future"));
            }
        }
        if !self.full_ratios.is_valid() {
            return Err(format!("full ratios out of order: {:?}", self.full_ratios));
        }
        // Decoded settings are hostile input like any other: a default_settings
        // or settings_over call must find them checked.
        let pools = self.pools.values().map(|p| (format!("pool '{}'", p.name), &p.qos));
        let images = self.image_qos.iter().map(|((pool, image), v)| (format!("image {image:016x} in pool {pool}"), v));
        for (whose, pairs) in pools.chain(images) {
            duplex_qos::ClassSettings::from_strings(pairs)
                .map_err(|err| format!("the QoS settings of {whose}: {err}"))?;
        }
        if let Some((pool, image)) = self.image_qos.keys().find(|(pool, _)| !self.pools.contains_key(pool)) {
            return Err(format!("image {image:016x}'s QoS settings name pool {pool}, which is not in the map"));
        }
        let mut host_ids: Vec<u32> = self.hosts.values().copied().collect();
        host_ids.sort_unstable();
        if host_ids.windows(2).any(|w| w[0] == w[1]) {
            return Err("two hosts share a placement id".into());
        }
        for (id, pool) in &self.pools {
            if *id != pool.id || *id >= self.next_pool_id {
                return Err(format!("pool key {id} holds pool {} (next id {})", pool.id, self.next_pool_id));
            }
            if let Some(code) = &pool.erasure {
                if let Some(why) = code.invalid_because() {
                    return Err(format!("pool '{}': {why}", pool.name));
                }
                if code.shards() != pool.size as usize || pool.min_size < code.k {
                    return Err(format!(
                        "erasure-coded pool '{}' has size {} and min_size {} for {}+{}",
                        pool.name, pool.size, pool.min_size, code.k, code.m
                    ));
                }
            }
            if pool.size == 0
                || pool.size > command::MAX_POOL_SIZE
                || pool.min_size == 0
                || pool.min_size > pool.size
                || pool.pg_num == 0
                || pool.pg_num > command::MAX_PG_NUM
            {
                return Err(format!(
                    "pool '{}' has size {}, min_size {}, pg_num {}",
                    pool.name, pool.size, pool.min_size, pool.pg_num
                ));
            }
        }
        for ((pool, pg), osds) in &self.pg_temp {
            if !self.names_pg_and_osds((*pool, *pg), osds) || osds.is_empty() {
                return Err(format!("the temporary acting set of PG {pool}.{pg:x} ({osds:?}) is not valid"));
            }
        }
        for ((pool, pg), items) in &self.pg_upmap {
            if !upmap::items_are_valid(self, (*pool, *pg), items) {
                return Err(format!("the upmap items of PG {pool}.{pg:x} ({items:?}) are not valid"));
            }
        }
        if self.balancer_max_spread > 1000 {
            return Err(format!("balancer spread {} per mille", self.balancer_max_spread));
        }
        for ((pool, pg), set) in &self.active_sets {
            if !self.names_pg_and_osds((*pool, *pg), &set.osds) || set.since > self.epoch {
                return Err(format!("the last active set of PG {pool}.{pg:x} ({set:?}) is not valid"));
            }
        }
        Ok(())
    }

    /// Whether a per-PG entry (a pin, a last active set) names an existing
    /// PG and at most a pool's worth of distinct, known OSDs.
    fn names_pg_and_osds(&self, (pool, pg): (PoolId, u32), osds: &[OsdId]) -> bool {
        // An erasure-coded pool's sets are positional, with holes.
        let Some(info) = self.pools.get(&pool) else { return false };
        let hole = |id: &OsdId| info.is_erasure() && *id == NO_OSD;
        pg < info.pg_num
            && osds.len() <= command::MAX_POOL_SIZE as usize
            && (!info.is_erasure() || osds.len() == info.size as usize)
            && osds.iter().all(|id| hole(id) || self.osds.contains_key(id))
            && osds.iter().enumerate().all(|(i, id)| hole(id) || !osds[..i].contains(id))
    }

    pub fn pool_by_name(&self, name: &str) -> Option<&Pool> {
        self.pools.values().find(|p| p.name == name)
    }

    /// The placement hierarchy of this map (out OSDs keep their weight and are rejected).
    pub fn hierarchy(&self) -> duplex_placement::Hierarchy {
        let mut hosts: BTreeMap<u32, duplex_placement::HostSpec> = BTreeMap::new();
        for osd in self.osds.values() {
            // A validated map names only known hosts; skip rather than panic otherwise.
            let Some(&host_id) = self.hosts.get(&osd.host) else { continue };
            hosts
                .entry(host_id)
                .or_insert_with(|| duplex_placement::HostSpec { id: host_id, osds: Vec::new() })
                .osds
                .push(duplex_placement::OsdSpec { id: osd.id, weight: osd.weight, is_in: osd.is_in });
        }
        duplex_placement::Hierarchy::new(&hosts.into_values().collect::<Vec<_>>())
    }

    /// The OSDs a PG maps to (its "up set" before filtering down OSDs):
    /// placement's, with the PG's upmap items applied ([`upmap`]).
    pub fn pg_osds(&self, hierarchy: &duplex_placement::Hierarchy, pool: &Pool, pg: u32) -> Vec<OsdId> {
        let mut osds = self.placed_osds(hierarchy, pool, pg);
        if let Some(items) = self.pg_upmap.get(&(pool.id, pg)) {
            upmap::apply(self, items, &mut osds);
        }
        osds
    }

    /// The OSDs placement alone maps a PG to (no upmap items). An
    /// erasure-coded pool's are positional: entry `i` holds shard `i`, and
    /// a position placement found no host for is [`NO_OSD`]
    /// ([`duplex_placement::Hierarchy::place_indep`]).
    pub fn placed_osds(&self, hierarchy: &duplex_placement::Hierarchy, pool: &Pool, pg: u32) -> Vec<OsdId> {
        let seed = duplex_placement::pg_seed(pool.id, pg);
        if pool.is_erasure() {
            hierarchy.place_indep(seed, pool.size as usize).into_iter().map(|osd| osd.unwrap_or(NO_OSD)).collect()
        } else {
            hierarchy.place(seed, pool.size as usize)
        }
    }

    /// The up set: the mapped OSDs that are up, in order. It is where the
    /// PG's data belongs, and its acting set once backfill is done. An
    /// erasure-coded pool's keeps its positions: a down OSD's is [`NO_OSD`].
    pub fn up_set(&self, hierarchy: &duplex_placement::Hierarchy, pool: &Pool, pg: u32) -> Vec<OsdId> {
        let mut osds = self.pg_osds(hierarchy, pool, pg);
        self.keep_up(pool, &mut osds);
        osds
    }

    /// Drops the OSDs that are not up (an erasure-coded pool: leaves a hole).
    fn keep_up(&self, pool: &Pool, osds: &mut Vec<OsdId>) {
        if pool.is_erasure() {
            for osd in osds.iter_mut() {
                if !self.is_up(*osd) {
                    *osd = NO_OSD;
                }
            }
        } else {
            osds.retain(|id| self.is_up(*id));
        }
    }

    /// The acting set, which serves the PG (the first is the primary): the
    /// up members of its temporary set if it has one (none: the PG waits for
    /// one to come back, see [`pg_temp`]), else the up set. Positional
    /// for an erasure-coded pool (see [`primary_of`] for its primary).
    pub fn acting(&self, hierarchy: &duplex_placement::Hierarchy, pool: &Pool, pg: u32) -> Vec<OsdId> {
        match self.pg_temp.get(&(pool.id, pg)) {
            Some(temp) => {
                let mut osds = temp.clone();
                self.keep_up(pool, &mut osds);
                osds
            }
            None => self.up_set(hierarchy, pool, pg),
        }
    }

    /// A PG's up set, acting set and backfill targets (the up set's OSDs
    /// that are not acting, which its primary fills), placing it once.
    pub fn pg_sets(&self, hierarchy: &duplex_placement::Hierarchy, pool: &Pool, pg: u32) -> PgSets {
        let up = self.up_set(hierarchy, pool, pg);
        if !self.pg_temp.contains_key(&(pool.id, pg)) {
            return PgSets { acting: up.clone(), up, backfill: Vec::new(), pinned: false };
        }
        let acting = self.acting(hierarchy, pool, pg);
        // A pin with no OSD up leaves the PG without a primary to fill
        // anyone; an erasure-coded PG's pin keeps shards on their holders,
        // and nothing fills the others in the background (yet).
        let backfill = if primary_of(&acting).is_none() || pool.is_erasure() {
            Vec::new()
        } else {
            up.iter().copied().filter(|id| *id != NO_OSD && !acting.contains(id)).collect()
        };
        PgSets { up, acting, backfill, pinned: true }
    }

    pub fn is_up(&self, id: OsdId) -> bool {
        self.osds.get(&id).is_some_and(|o| o.up)
    }
}

/// The primary of an acting set: its first OSD (an erasure-coded PG's
/// first position that has one). `None`: no OSD of it is up.
pub fn primary_of(acting: &[OsdId]) -> Option<OsdId> {
    acting.iter().copied().find(|osd| *osd != NO_OSD)
}

/// A per-PG entry set to `value`, or removed when it is empty.
fn set_or_remove<K: Ord, T: Clone>(entries: &mut BTreeMap<K, Vec<T>>, key: K, value: &[T]) {
    if value.is_empty() {
        entries.remove(&key);
    } else {
        entries.insert(key, value.to_vec());
    }
}

/// A map of one OSD per entry of `hosts` (on that host, up, weight 1) and
/// pool 1 of 2 copies over `pg_num` PGs, for unit tests.
#[cfg(test)]
pub(crate) fn test_map(hosts: &[&str], pg_num: u32) -> ClusterMap {
    let mut map = ClusterMap::new([3; 16]);
    for (id, host) in (0..).zip(hosts) {
        let boot =
            Command::OsdBoot { id, addr: format!("127.0.0.1:{}", 7000 + id), host: host.to_string(), weight: 1 << 16 };
        map.run(&boot).unwrap();
    }
    map.run(&Command::PoolCreate { name: "p".into(), size: 2, min_size: 1, pg_num }).unwrap();
    map
}
