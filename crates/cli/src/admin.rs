//! `duplex pool …`, `duplex image …`, `duplex mark …` and `duplex status`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use duplex_client::{Client, CreateOptions};
use duplex_map::{ClusterMap, Command as MapCommand};
use duplex_mon_client::MonClient;
use duplex_mon_client::WireOutcome;
use duplex_proto::osd::OsdStats;
use duplex_proto::peering::{PeerOp, PeerReply, PeerRequest};
use duplex_proto::{Frame, MessageType};

use duplex_store::units::format_size;

/// Runs a map command on the monitors' leader; a refusal is an error.
pub fn run_command(mon: &mut MonClient, command: MapCommand) -> Result<u64> {
    match mon.command(&command)? {
        WireOutcome::Applied { epoch } | WireOutcome::Unchanged { epoch } => Ok(epoch),
        WireOutcome::Refused(why) => bail!("the monitor refused: {why}"),
    }
}

/// Placement groups.
#[derive(Debug, clap::Subcommand)]
pub enum PgCommand {
    /// Deep-scrub PGs of the pool: compare every object's copies (size,
    /// data, attributes, block checksums) and report the bad ones.
    Scrub {
        /// PG numbers (default: every PG of the pool).
        pgs: Vec<u32>,
    },
    /// Deep-scrub and replace each bad copy with a good one.
    Repair {
        /// PG numbers (default: every PG of the pool).
        pgs: Vec<u32>,
    },
}

/// An operator's decisions about OSDs, which the monitor records.
#[derive(Debug, clap::Subcommand)]
pub enum MarkCommand {
    /// Take an OSD out of placement: its PGs move to other OSDs, which are
    /// filled in the background while it goes on serving them.
    Out { id: u32 },
    /// Put an OSD back into placement.
    In { id: u32 },
    /// Give up a down OSD's copies for good. PGs that wait for it (it was
    /// among the last OSDs they were active on) go on with the best copies
    /// left: writes only it held are lost. For an OSD that will not return.
    Lost {
        id: u32,
        /// Confirms that losing those writes is accepted.
        #[arg(long)]
        yes_i_really_mean_it: bool,
    },
}

/// Cluster settings kept in the map.
#[derive(Debug, clap::Subcommand)]
pub enum ConfigCommand {
    /// Set one: `nearfull_ratio`, `backfillfull_ratio` or `full_ratio`
    /// (0 to 1; Ceph's defaults 0.85, 0.90, 0.95). Past `full_ratio` of its
    /// store, an OSD refuses writes to its PGs (ENOSPC); deletes and
    /// discards go on. `balancer_max_spread` (0 to 1, default 0.02; 0:
    /// off): the balancer moves PGs while the fullest and the emptiest OSDs
    /// differ by more.
    Set { key: String, value: f64 },
    /// Show them.
    Get,
}

pub fn config(client: &Client, command: ConfigCommand) -> Result<()> {
    let map = client.map();
    let ratios = map.full_ratios;
    match command {
        ConfigCommand::Get => {
            let show = |permille: u16| f64::from(permille) / 1000.0;
            println!("nearfull_ratio {:.3}", show(ratios.nearfull));
            println!("backfillfull_ratio {:.3}", show(ratios.backfillfull));
            println!("full_ratio {:.3}", show(ratios.full));
            println!("balancer_max_spread {:.3}", show(map.balancer_max_spread));
        }
        ConfigCommand::Set { key, value } => {
            if !(0.0..=1.0).contains(&value) {
                bail!("{key} is a ratio from 0 to 1, not {value}");
            }
            let permille = (value * 1000.0).round() as u16;
            let (mut nearfull, mut backfillfull, mut full) = (ratios.nearfull, ratios.backfillfull, ratios.full);
            let command = match key.as_str() {
                "balancer_max_spread" => MapCommand::SetBalancer { max_spread_permille: permille },
                "nearfull_ratio" | "backfillfull_ratio" | "full_ratio" => {
                    match key.as_str() {
                        "nearfull_ratio" => nearfull = permille,
                        "backfillfull_ratio" => backfillfull = permille,
                        _ => full = permille,
                    }
                    MapCommand::SetFullRatios { nearfull, backfillfull, full }
                }
                other => {
                    bail!("no setting '{other}' (nearfull_ratio, backfillfull_ratio, full_ratio, balancer_max_spread)")
                }
            };
            let epoch = run_command(&mut client.monitor(), command)?;
            println!("{key} = {value} (map epoch {epoch})");
        }
    }
    Ok(())
}

pub fn mark(client: &Client, command: MarkCommand) -> Result<()> {
    let mut mon = client.monitor();
    let (command, done) = match command {
        MarkCommand::Out { id } => (MapCommand::MarkOut { id }, format!("marked osd.{id} out")),
        MarkCommand::In { id } => (MapCommand::MarkIn { id }, format!("marked osd.{id} in")),
        MarkCommand::Lost { id, yes_i_really_mean_it } => {
            let map = client.map();
            let waiting = waiting_for(&map, id);
            if !yes_i_really_mean_it {
                bail!(
                    "osd.{id} may hold the only copy of acknowledged writes to {} PGs{}; if it will never come \
                     back, run again with --yes-i-really-mean-it",
                    waiting.len(),
                    if waiting.is_empty() { String::new() } else { format!(" ({})", waiting.join(", ")) }
                );
            }
            (MapCommand::MarkLost { id }, format!("marked osd.{id} lost; {} PGs no longer wait for it", waiting.len()))
        }
    };
    let epoch = run_command(&mut mon, command)?;
    println!("{done} (map epoch {epoch})");
    Ok(())
}

/// The PGs (as "pool.pg") that name `osd` in their last active set or pin.
fn waiting_for(map: &ClusterMap, osd: u32) -> Vec<String> {
    let sets = map.active_sets.iter().filter(|(_, set)| set.osds.contains(&osd)).map(|(key, _)| key);
    let pins = map.pg_temp.iter().filter(|(_, pin)| pin.contains(&osd)).map(|(key, _)| key);
    let keys: std::collections::BTreeSet<_> = sets.chain(pins).collect();
    keys.into_iter().map(|(pool, pg)| format!("{pool}.{pg:x}")).collect()
}

/// How long one PG's scrub may take before the command gives up on it.
const SCRUB_TIMEOUT: Duration = Duration::from_secs(600);

pub fn pg(client: &Client, pool_name: &str, command: PgCommand) -> Result<()> {
    let pool = client.pool_id(pool_name)?;
    let map = client.map();
    let info = map.pools.get(&pool).with_context(|| format!("no pool {pool_name}"))?;
    let (pgs, repair) = match command {
        PgCommand::Scrub { pgs } => (pgs, false),
        PgCommand::Repair { pgs } => (pgs, true),
    };
    let pgs: Vec<u32> = if pgs.is_empty() { (0..info.pg_num).collect() } else { pgs };
    if let Some(bad) = pgs.iter().find(|pg| **pg >= info.pg_num) {
        bail!("pool {pool_name} has PGs 0 to {}; there is no PG {bad}", info.pg_num - 1);
    }
    let hierarchy = map.hierarchy();
    let (mut objects, mut inconsistent, mut repaired) = (0u64, 0usize, 0u64);
    for pg in &pgs {
        let acting = map.acting(&hierarchy, info, *pg);
        let primary = duplex_map::primary_of(&acting).with_context(|| format!("PG {pool}.{pg:x} has no OSD up"))?;
        let addr = map.osds[&primary].addr.parse().with_context(|| format!("osd.{primary}'s address"))?;
        let key = duplex_osd::pg::pg_key(pool, *pg).context("pool id too large")?;
        let mut conn =
            duplex_mon_client::Connection::connect(addr, &client.config().credentials, Duration::from_secs(2))
                .with_context(|| format!("connecting to osd.{primary}"))?;
        conn.set_read_timeout(Some(SCRUB_TIMEOUT))?;
        conn.send(&PeerRequest { pg: key, interval: 0, op: PeerOp::Scrub { repair } }.to_frame(1))?;
        let frame = conn.recv().with_context(|| format!("waiting for osd.{primary} to scrub PG {pool}.{pg:x}"))?;
        if frame.header.message_type != MessageType::PeerReply as u8 {
            bail!("unexpected reply type {}", frame.header.message_type);
        }
        let report = match PeerReply::decode(&frame.payload)? {
            PeerReply::Scrubbed(report) => report,
            PeerReply::Refused(why) => bail!("osd.{primary} did not scrub PG {pool}.{pg:x}: {why}"),
            other => bail!("unexpected answer {other:?}"),
        };
        objects += report.objects;
        inconsistent += report.inconsistent.len();
        repaired += report.repaired;
        if report.inconsistent.is_empty() {
            println!("pg {pool}.{pg:x}: {} objects, consistent", report.objects);
        }
        for bad in &report.inconsistent {
            let osds: Vec<String> = bad.bad.iter().map(|o| format!("osd.{o}")).collect();
            let state = match (bad.unrepairable, repair) {
                (true, _) => "no good copy left, or its shards disagree and the code cannot tell which is wrong",
                (false, true) => "repaired",
                (false, false) => "run `duplex pg repair` to fix",
            };
            println!(
                "pg {pool}.{pg:x}: object {} is bad on {} ({state})",
                String::from_utf8_lossy(&bad.object),
                osds.join(", ")
            );
        }
    }
    println!("scrubbed {} PGs: {objects} objects, {inconsistent} inconsistent, {repaired} copies repaired", pgs.len());
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum PoolCommand {
    /// Create a pool: replicated, or erasure-coded with --ec.
    Create {
        name: String,
        /// Copies of each object (a replicated pool).
        #[arg(long, default_value_t = 2, conflicts_with = "ec")]
        size: u8,
        /// Copies (shards) that must be up for writes (default: size −
        /// size/2; erasure-coded: k + 1).
        #[arg(long)]
        min_size: Option<u8>,
        /// Erasure-code the pool as k+m: k data and m coding shards per
        /// object, on k+m hosts (2+1, 2+2, 4+2). Experimental: see
        /// docs/OSD.md, "Erasure-coded pools".
        #[arg(long)]
        ec: Option<String>,
        /// The bytes of one shard in one stripe: a power of two from 4K to 64K.
        #[arg(long, default_value = "4K", value_parser = duplex_store::units::parse_size, requires = "ec")]
        stripe_unit: u64,
        /// Placement groups (a power of two is best; it can only grow).
        #[arg(long, default_value_t = 32)]
        pg_num: u32,
        /// Deduplicate this pool: its objects' chunks go to this chunk pool
        /// (docs/DEDUP.md). Set once.
        #[arg(long, conflicts_with_all = ["ec", "chunk_pool"])]
        dedup_tier: Option<String>,
        /// The deduplicated pool's chunk size: a power of two from 16K to 128K.
        #[arg(long, default_value = "32K", value_parser = duplex_store::units::parse_size, requires = "dedup_tier")]
        chunk_size: u64,
        /// Where the deduplicated pool's chunks begin: fixed (every
        /// chunk size) or content (on block boundaries chosen by the data,
        /// the chunk size on average: finds runs shifted by whole blocks).
        #[arg(long, default_value = "fixed", value_parser = duplex_map::Chunking::parse, requires = "dedup_tier")]
        chunking: duplex_map::Chunking,
        /// A chunk pool: it holds a deduplicated pool's chunks, and nothing else.
        #[arg(long, conflicts_with = "ec")]
        chunk_pool: bool,
        /// strong (the default: a write is acknowledged once every replica
        /// has it) or eventual (once the primary has it; replicas follow in
        /// the background, and a primary's failure may lose the writes of
        /// the last --max-lag: docs/OSD.md, "Eventual pools").
        #[arg(long, default_value = "strong", value_parser = ["strong", "eventual"],
              conflicts_with_all = ["ec", "chunk_pool", "compression", "dedup_tier"])]
        consistency: String,
        /// An eventual pool's longest replication lag (10ms to 60s): past
        /// it, writes wait for their replicas.
        #[arg(long, value_parser = duplex_map::eventual::parse_lag)]
        max_lag: Option<u32>,
        /// A chunk pool's compression: none, lz4 (the default) or zstd[:LEVEL]
        /// (implies --chunk-pool).
        #[arg(long, conflicts_with = "ec")]
        compression: Option<String>,
    },
    /// Change pool settings, as KEY=VALUE: dedup_low_watermark and
    /// dedup_high_watermark (a deduplicated pool's foreground operations a
    /// second per OSD), compression and compression_min_saving (a chunk
    /// pool's), max_lag (an eventual pool's, e.g. 500ms).
    Set {
        name: String,
        #[arg(required = true)]
        settings: Vec<String>,
    },
    /// List pools.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Delete a pool and everything in it.
    Delete {
        name: String,
        /// Required: deleting a pool cannot be undone.
        #[arg(long)]
        yes_i_really_mean_it: bool,
    },
}

pub fn pool(client: &Client, command: PoolCommand) -> Result<()> {
    let mut mon = client.monitor();
    match command {
        PoolCommand::Create { name, min_size, ec: Some(code), stripe_unit, pg_num, .. } => {
            let profile = duplex_ec::Profile::parse(&code, stripe_unit)?;
            let code = duplex_map::ErasureCode {
                k: profile.k() as u8,
                m: profile.m() as u8,
                stripe_unit: profile.stripe_unit(),
            };
            let command = MapCommand::PoolCreateErasure { name: name.clone(), code, min_size, pg_num };
            let epoch = run_command(&mut mon, command)?;
            let min_size = client.map().pool_by_name(&name).map_or(profile.default_min_size() as u8, |p| p.min_size);
            println!(
                "created erasure-coded pool '{name}' ({profile}, min_size {min_size}, {pg_num} PGs, {:.2} bytes stored \
                 per byte written) at map epoch {epoch}",
                profile.overhead()
            );
        }
        PoolCommand::Create {
            name,
            size,
            min_size,
            ec: None,
            pg_num,
            dedup_tier,
            chunk_size,
            chunking,
            chunk_pool,
            compression,
            consistency,
            max_lag,
            ..
        } => {
            let min_size = min_size.unwrap_or(size - size / 2);
            if consistency == "eventual" {
                let eventual =
                    duplex_map::Eventual { max_lag_ms: max_lag.unwrap_or(duplex_map::Eventual::DEFAULT_MAX_LAG_MS) };
                let command = MapCommand::PoolCreateEventual { name: name.clone(), size, min_size, pg_num, eventual };
                let epoch = run_command(&mut mon, command)?;
                println!(
                    "created eventual pool '{name}' (size {size}, min_size {min_size}, {pg_num} PGs, max lag {}) at map \
                     epoch {epoch}: a primary's failure may lose the writes of its last {0}",
                    duplex_map::eventual::format_lag(eventual.max_lag_ms)
                );
                return Ok(());
            }
            if max_lag.is_some() {
                bail!("--max-lag is an eventual pool's; add --consistency eventual");
            }
            if chunk_pool || compression.is_some() {
                let mut store = duplex_map::ChunkStore::default();
                if let Some(compression) = &compression {
                    store.compression = duplex_map::Compression::parse(compression).map_err(anyhow::Error::msg)?;
                }
                let command = MapCommand::PoolCreateChunks { name: name.clone(), size, min_size, pg_num, store };
                let epoch = run_command(&mut mon, command)?;
                println!(
                    "created chunk pool '{name}' (size {size}, min_size {min_size}, {pg_num} PGs, compression {}) at map epoch {epoch}",
                    store.compression
                );
                return Ok(());
            }
            // Checked before the pool is made, so that a bad tier leaves nothing behind.
            let tier = match &dedup_tier {
                Some(chunk_pool) => {
                    let map = client.map();
                    let Some(chunks) = map.pool_by_name(chunk_pool) else { bail!("no chunk pool '{chunk_pool}'") };
                    let chunk_size = u32::try_from(chunk_size)
                        .map_err(|_| anyhow::anyhow!("chunk size {chunk_size} is too large"))?;
                    let plain = duplex_map::Pool::new(0, name.clone(), size, min_size, pg_num, None);
                    duplex_map::tier::set_tier(&plain, chunks, chunk_size, chunking)?;
                    Some((chunk_pool.clone(), chunk_size))
                }
                None => None,
            };
            let epoch = run_command(&mut mon, MapCommand::PoolCreate { name: name.clone(), size, min_size, pg_num })?;
            match tier {
                Some((chunk_pool, chunk_size)) => {
                    let command = MapCommand::PoolSetTier {
                        name: name.clone(),
                        chunk_pool: chunk_pool.clone(),
                        chunk_size,
                        chunking,
                    };
                    let epoch = run_command(&mut mon, command)?;
                    println!(
                        "created pool '{name}' (size {size}, min_size {min_size}, {pg_num} PGs), deduplicated into '{chunk_pool}' \
                         in {} KiB chunks ({chunking} chunking), at map epoch {epoch}",
                        chunk_size >> 10
                    );
                }
                None => println!(
                    "created pool '{name}' (size {size}, min_size {min_size}, {pg_num} PGs) at map epoch {epoch}"
                ),
            }
        }
        PoolCommand::Set { name, settings } => {
            let mut pairs = Vec::new();
            for setting in &settings {
                let Some((key, value)) = setting.split_once('=') else {
                    bail!("a setting is KEY=VALUE, not '{setting}' (keys: {})", duplex_map::tier::POOL_SET_KEYS)
                };
                pairs.push((key.to_string(), value.to_string()));
            }
            for (key, value) in pairs {
                let epoch = run_command(
                    &mut mon,
                    MapCommand::PoolSet { name: name.clone(), key: key.clone(), value: value.clone() },
                )?;
                println!("pool '{name}': {key}={value} (map epoch {epoch})");
            }
        }
        PoolCommand::List { json } => {
            let map = client.map();
            if json {
                let pools: Vec<_> = map
                    .pools
                    .values()
                    .map(|p| {
                        let erasure = p.erasure.map(|c| serde_json::json!({"k": c.k, "m": c.m, "stripe_unit": c.stripe_unit}));
                        let dedup = p.dedup.map(|t| serde_json::json!({
                            "chunk_pool": map.pools.get(&t.chunk_pool).map(|c| c.name.clone()),
                            "chunk_size": t.chunk_size,
                            "chunking": t.chunking.to_string(),
                            "low_watermark": t.low_watermark,
                            "high_watermark": t.high_watermark,
                        }));
                        let chunks = p.chunks.map(|c| serde_json::json!({
                            "compression": c.compression.to_string(),
                            "min_saving_permille": c.min_saving_permille,
                        }));
                        let consistency = if p.is_eventual() { "eventual" } else { "strong" };
                        let max_lag_ms = p.eventual.map(|e| e.max_lag_ms);
                        let limits = settings_json(&p.qos);
                        serde_json::json!({"id": p.id, "name": p.name, "size": p.size, "min_size": p.min_size, "pg_num": p.pg_num, "consistency": consistency, "max_lag_ms": max_lag_ms, "erasure": erasure, "dedup": dedup, "chunks": chunks, "image_limits": limits})
                    })
                    .collect();
                println!("{}", serde_json::to_string_pretty(&pools)?);
            } else {
                println!("{:<6} {:<20} {:>5} {:>9} {:>7}  {}", "ID", "NAME", "SIZE", "MIN_SIZE", "PG_NUM", "KIND");
                for p in map.pools.values() {
                    let kind = match (p.erasure, p.dedup, p.chunks) {
                        (Some(c), _, _) => format!("erasure {}+{}, {} KiB stripe unit", c.k, c.m, c.stripe_unit >> 10),
                        (None, Some(t), _) => format!(
                            "replicated, deduplicated into '{}' ({} KiB chunks{})",
                            map.pools.get(&t.chunk_pool).map_or("?", |c| c.name.as_str()),
                            t.chunk_size >> 10,
                            match t.chunking {
                                duplex_map::Chunking::Fixed => "",
                                duplex_map::Chunking::Content => " on average, cut by content",
                            }
                        ),
                        (None, None, Some(c)) => format!("replicated, chunk pool ({} compression)", c.compression),
                        (None, None, None) => match p.eventual {
                            Some(e) => format!(
                                "replicated, eventual (max lag {})",
                                duplex_map::eventual::format_lag(e.max_lag_ms)
                            ),
                            None => "replicated".into(),
                        },
                    };
                    let mut kind = kind;
                    if !p.qos.is_empty() {
                        kind.push_str(&format!("; image limits {}", settings_text(&p.qos)));
                    }
                    println!("{:<6} {:<20} {:>5} {:>9} {:>7}  {kind}", p.id, p.name, p.size, p.min_size, p.pg_num);
                }
            }
        }
        PoolCommand::Delete { name, yes_i_really_mean_it } => {
            if !yes_i_really_mean_it {
                bail!("deleting pool '{name}' destroys all its data; add --yes-i-really-mean-it");
            }
            run_command(&mut mon, MapCommand::PoolDelete { name: name.clone() })?;
            println!("deleted pool '{name}'");
        }
    }
    Ok(())
}

#[derive(Debug, clap::Subcommand)]
pub enum ImageCommand {
    /// Create an image.
    Create {
        name: String,
        /// Its size: bytes, or with a suffix (10G, 512M).
        #[arg(long, value_parser = duplex_store::units::parse_size)]
        size: u64,
        /// Bytes per object: a power of two from 4k to 64M.
        #[arg(long, default_value = "4M", value_parser = duplex_store::units::parse_size)]
        object_size: u64,
        /// Reserve every object's extent now: no allocation on the write path later.
        #[arg(long)]
        preallocate: bool,
        /// Keep the data objects in this pool (an erasure-coded one); the
        /// header stays in the image's pool.
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// List images.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Show an image's size, object size and flags.
    Info {
        name: String,
        #[arg(long)]
        json: bool,
    },
    /// Grow or shrink an image (shrinking discards the data past the new end).
    Resize {
        name: String,
        #[arg(long, value_parser = duplex_store::units::parse_size)]
        size: u64,
        /// Required to shrink.
        #[arg(long)]
        allow_shrink: bool,
    },
    /// Delete an image and its objects.
    Remove { name: String },
    /// Set an image's QoS, `KEY=VALUE` each. Limits: qos_iops,
    /// qos_read_iops, qos_write_iops (operations a second), qos_bps,
    /// qos_read_bps, qos_write_bps (bytes a second, K/M/G/T suffixes),
    /// qos_burst_s (seconds of each rate an idle image may spend at once;
    /// 1 if unset); 0 removes a limit. Scheduling at each OSD under
    /// contention: qos_reservation_iops (4 KiB operations a second it is
    /// owed), qos_weight (its share of the rest; 1 if unset). Running
    /// gateways and OSDs apply them within a second.
    Set {
        name: String,
        #[arg(required = true, value_parser = parse_setting)]
        settings: Vec<(String, String)>,
    },
    /// Write an image's bytes (IMAGE, or IMAGE@SNAP for a snapshot) to a
    /// file (sparse: holes are seeked over) or to standard output (`-`).
    Export {
        name: String,
        /// The file, or `-` for standard output.
        path: String,
    },
    /// Create an image from a file or standard input (`-`); chunks of
    /// zeros are not written, so the image stays thin.
    Import {
        /// The file, or `-` for standard input.
        path: String,
        name: String,
        /// The image's size: the file's by default; required for standard
        /// input (the stream must be exactly this long).
        #[arg(long, value_parser = duplex_store::units::parse_size)]
        size: Option<u64>,
        /// Bytes per object: a power of two from 4k to 64M.
        #[arg(long, default_value = "4M", value_parser = duplex_store::units::parse_size)]
        object_size: u64,
        /// Reserve every object's extent first.
        #[arg(long)]
        preallocate: bool,
        /// Keep the data objects in this pool (an erasure-coded one).
        #[arg(long)]
        data_pool: Option<String>,
    },
    /// The byte ranges of IMAGE[@SNAP] that changed since --from-snap (all
    /// written ranges without it), from the OSDs' block maps.
    Diff {
        spec: String,
        #[arg(long)]
        from_snap: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Write what changed from --from-snap to IMAGE[@SNAP] as an `rbd diff
    /// v1` stream, to a file or standard output (`-`).
    ExportDiff {
        spec: String,
        /// The file, or `-` for standard output.
        path: String,
        #[arg(long)]
        from_snap: Option<String>,
    },
    /// Make CHILD a copy-on-write clone of IMAGE@SNAP (a protected
    /// snapshot): it reads through to it until written.
    Clone {
        /// IMAGE@SNAP
        parent: String,
        child: String,
    },
    /// Copy into a clone everything it still reads from its parent, and
    /// cut the link.
    Flatten { name: String },
    /// Apply a diff stream to an image: its starting snapshot must exist
    /// there, and its ending snapshot is created.
    ImportDiff {
        /// The file, or `-` for standard input.
        path: String,
        name: String,
    },
}

pub fn image(client: &Client, pool_name: &str, command: ImageCommand) -> Result<()> {
    let pool = client.pool_id(pool_name)?;
    match command {
        ImageCommand::Create { name, size, object_size, preallocate, data_pool } => {
            let object_size = u32::try_from(object_size).context("--object-size is too large")?;
            let data_pool = data_pool.map(|name| client.pool_id(&name)).transpose()?;
            let started = Instant::now();
            let options = CreateOptions { object_size, preallocate, data_pool };
            let info = client.create_image(pool, &name, size, options)?;
            println!(
                "created image '{}' in pool '{pool_name}': {} in {} objects of {}{} ({:.1?})",
                info.name,
                format_size(info.size),
                info.object_count(),
                format_size(info.object_size as u64),
                if preallocate { ", pre-allocated" } else { "" },
                started.elapsed()
            );
        }
        ImageCommand::List { json } => {
            let names = client.list_images(pool)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&names)?);
            } else {
                for name in names {
                    println!("{name}");
                }
            }
        }
        ImageCommand::Info { name, json } => {
            let info = client.image_info(pool, &name)?;
            let parent = client.parent_of(pool, &name)?;
            if json {
                let snapshots = client.list_snapshots(pool, &name)?;
                let mut value = serde_json::to_value(&info)?;
                value["parent"] = serde_json::to_value(&parent)?;
                value["snapshots"] = serde_json::to_value(&snapshots)?;
                let qos = client.image_qos(pool, &name)?;
                value["limits"] = settings_json(&qos.limits.settings());
                value["reservation_iops"] = qos.reservation_iops.into();
                value["weight"] = qos.weight.into();
                println!("{}", serde_json::to_string_pretty(&value)?);
            } else {
                println!("image:        {}", info.name);
                println!("pool:         {pool_name}");
                println!("id:           {}", info.id);
                println!("size:         {} ({} bytes)", format_size(info.size), info.size);
                println!("object size:  {}", format_size(info.object_size as u64));
                println!("objects:      {}", info.object_count());
                println!("preallocated: {}", info.preallocated);
                if let Some(data_pool) = info.data_pool {
                    let map = client.map();
                    let name =
                        map.pools.get(&data_pool).map_or(format!("id {data_pool} (deleted)"), |p| p.name.clone());
                    println!("data pool:    {name}");
                }
                let qos = client.image_qos(pool, &name)?;
                let limits = qos.limits.settings();
                println!(
                    "limits:       {}",
                    if limits.is_empty() { "none".to_string() } else { settings_text(&limits) }
                );
                println!("reservation:  {} IOPS (4 KiB) at each OSD; weight {}", qos.reservation_iops, qos.weight);
                let snaps = client.list_snapshots(pool, &name)?;
                let names: Vec<&str> = snaps.iter().map(|s| s.name.as_str()).collect();
                println!("snapshots:    {}", if names.is_empty() { "none".to_string() } else { names.join(", ") });
                if let Some(parent) = parent {
                    println!(
                        "parent:       {}@{} (reads through its first {})",
                        parent.image,
                        parent.snap,
                        format_size(parent.overlap)
                    );
                }
            }
        }
        ImageCommand::Set { name, settings } => {
            let own = client.set_image_qos(pool, &name, &settings)?.settings();
            println!(
                "image {pool_name}/{name}: {}",
                if own.is_empty() { "no QoS settings of its own".to_string() } else { settings_text(&own) }
            );
        }
        ImageCommand::Resize { name, size, allow_shrink } => {
            let info = client.image_info(pool, &name)?;
            if size < info.size && !allow_shrink {
                bail!(
                    "{} is smaller than the image ({}): shrinking discards data; add --allow-shrink",
                    format_size(size),
                    format_size(info.size)
                );
            }
            let info = client.resize_image(pool, &name, size)?;
            println!("image '{name}' is now {}", format_size(info.size));
        }
        ImageCommand::Remove { name } => {
            client.remove_image(pool, &name)?;
            println!("removed image '{name}'");
        }
        ImageCommand::Clone { parent, child } => {
            let (image, snap) = crate::snap::split_spec(&parent)?;
            let info = client.clone_image(pool, image, snap, &child)?;
            println!("cloned '{parent}' as '{child}' ({}); it reads through until written", format_size(info.size));
        }
        ImageCommand::Flatten { name } => {
            let started = Instant::now();
            let bar = crate::progress::bar("flattening");
            client.flatten_image(pool, &name, &mut |done, all| bar.update(done, all))?;
            bar.finish();
            println!("flattened '{name}' in {:.1?}: it no longer reads from a parent", started.elapsed());
        }
        ImageCommand::Diff { spec, from_snap, json } => {
            crate::diff::diff(client, pool, &spec, from_snap.as_deref(), json)?;
        }
        ImageCommand::ExportDiff { spec, path, from_snap } => {
            let started = Instant::now();
            let moved = crate::diff::export_diff(client, pool, &spec, from_snap.as_deref(), &path)?;
            eprintln!(
                "exported the diff of '{spec}'{} to {}: {} of data and {} of zeros in {} records, {:.1?}",
                from_snap.map(|s| format!(" since '{s}'")).unwrap_or_default(),
                if path == "-" { "standard output" } else { path.as_str() },
                format_size(moved.data_bytes),
                format_size(moved.zero_bytes),
                moved.records,
                started.elapsed()
            );
        }
        ImageCommand::ImportDiff { path, name } => {
            let started = Instant::now();
            let moved = crate::diff::import_diff(client, pool, &path, &name)?;
            println!(
                "imported a diff into '{name}': {} of data and {} of zeros in {} records, {:.1?}",
                format_size(moved.data_bytes),
                format_size(moved.zero_bytes),
                moved.records,
                started.elapsed()
            );
        }
        ImageCommand::Export { name, path } => {
            let image = client.open_spec(pool, &name)?;
            let moved = crate::transfer::export(&image, &path)?;
            // The report goes to stderr: stdout may be the image itself.
            eprintln!(
                "exported image '{name}' to {}: {} ({} of it holes) in {:.1?}, {}/s",
                if path == "-" { "standard output" } else { path.as_str() },
                format_size(moved.bytes),
                format_size(moved.zero_bytes),
                moved.took,
                format_size((moved.bytes as f64 / moved.took.as_secs_f64().max(1e-6)) as u64)
            );
        }
        ImageCommand::Import { path, name, size, object_size, preallocate, data_pool } => {
            let object_size = u32::try_from(object_size).context("--object-size is too large")?;
            let data_pool = data_pool.map(|name| client.pool_id(&name)).transpose()?;
            let options = CreateOptions { object_size, preallocate, data_pool };
            let moved = crate::transfer::import(client, pool, &path, &name, size, options)?;
            println!(
                "imported {} into image '{name}' in pool '{pool_name}': {} ({} of zeros not written) in {:.1?}",
                if path == "-" { "standard input" } else { path.as_str() },
                format_size(moved.bytes),
                format_size(moved.zero_bytes),
                moved.took
            );
        }
    }
    Ok(())
}

/// One OSD's counters, fetched over its client port.
fn osd_stats(client: &Client, addr: &str) -> Result<OsdStats> {
    let addr = addr.parse().with_context(|| format!("bad OSD address {addr}"))?;
    let mut conn = duplex_mon_client::Connection::connect(addr, &client.config().credentials, Duration::from_secs(2))?;
    conn.set_read_timeout(Some(Duration::from_secs(2)))?;
    conn.send(&Frame::new(MessageType::OsdStats, 1, bytes::Bytes::new()))?;
    let frame = conn.recv()?;
    if frame.header.message_type != MessageType::OsdStatsReply as u8 {
        bail!("unexpected reply type {}", frame.header.message_type);
    }
    Ok(OsdStats::decode(&frame.payload)?)
}

/// PG states over all pools ([`duplex_map::PgState`]: active+clean,
/// degraded, backfilling, recovering, peering, inactive, down), with the
/// down PGs ("pool.pg waits for osd.N, …"), at most `MAX_DOWN_LISTED`.
fn pg_states(map: &ClusterMap) -> (BTreeMap<&'static str, u32>, Vec<String>) {
    let hierarchy = map.hierarchy();
    let mut states = BTreeMap::new();
    let mut down = Vec::new();
    for pool in map.pools.values() {
        for pg in 0..pool.pg_num {
            let state = duplex_map::pg_state(map, &hierarchy, pool, pg);
            if state == duplex_map::PgState::Down && down.len() < MAX_DOWN_LISTED {
                if let Some(waiting) = duplex_map::active_set::down_waiting_for(map, pool.id, pg) {
                    let names: Vec<String> = waiting.iter().map(|osd| format!("osd.{osd}")).collect();
                    down.push(format!("{}.{pg:x} waits for {}", pool.id, names.join(" or ")));
                }
            }
            *states.entry(state.label()).or_default() += 1;
        }
    }
    (states, down)
}

/// What `duplex status` says of the eventual pools' replication.
struct EventualSummary {
    /// One line: PGs, the largest lag and where, writes on their primary only.
    summary: Option<String>,
    /// A health warning: PGs whose lag is past their pool's max_lag.
    over: Option<String>,
}

/// Sorts `lags` (largest first) and sums them up against their pools' max_lag.
fn eventual_lags(map: &ClusterMap, lags: &mut [duplex_proto::osd::PgLagStat]) -> EventualSummary {
    lags.sort_unstable_by_key(|l| (std::cmp::Reverse(l.lag_us), l.pg));
    let eventual_pgs: u32 = map.pools.values().filter(|p| p.is_eventual()).map(|p| p.pg_num).sum();
    if eventual_pgs == 0 {
        return EventualSummary { summary: None, over: None };
    }
    let name = |pg: u32| format!("{}.{:x}", duplex_osd::pg::pool_of(pg), duplex_osd::pg::pg_number(pg));
    let unreplicated: u64 = lags.iter().map(|l| l.unreplicated).sum();
    let largest = lags.first().map_or("no PG reported".to_string(), |l| {
        format!("largest replication lag {:.1} ms (pg {})", l.lag_us as f64 / 1e3, name(l.pg))
    });
    let summary = format!(
        "{eventual_pgs} PGs in eventual pools, {} reported by their primaries: {largest}, {unreplicated} acknowledged \
         writes not yet on every replica",
        lags.len()
    );
    let over: Vec<String> = lags
        .iter()
        .filter(|l| {
            map.pools
                .get(&duplex_osd::pg::pool_of(l.pg))
                .and_then(|p| p.eventual)
                .is_some_and(|e| l.lag_us > u64::from(e.max_lag_ms) * 1000)
        })
        .map(|l| format!("{} ({:.0} ms)", name(l.pg), l.lag_us as f64 / 1e3))
        .collect();
    let over = (!over.is_empty()).then(|| {
        format!(
            "{} eventual PGs past their pool's max_lag (a replica is slow or gone): {}",
            over.len(),
            over.iter().take(MAX_DOWN_LISTED).cloned().collect::<Vec<_>>().join(", ")
        )
    });
    EventualSummary { summary: Some(summary), over }
}

/// Down PGs `duplex status` names one by one.
const MAX_DOWN_LISTED: usize = 10;

/// The pools with a PG one of `osds` serves: the pools a full OSD stops.
fn pools_on(map: &ClusterMap, osds: &[u32]) -> Vec<String> {
    let hierarchy = map.hierarchy();
    let mut pools: Vec<String> = map
        .pools
        .values()
        .filter(|pool| (0..pool.pg_num).any(|pg| map.acting(&hierarchy, pool, pg).iter().any(|osd| osds.contains(osd))))
        .map(|pool| pool.name.clone())
        .collect();
    pools.sort();
    pools
}

/// The cluster's health as Ceph words it: `HEALTH_ERR` when some PGs
/// cannot serve I/O, `HEALTH_WARN` when some are degraded or peering, or OSDs are down,
/// else `HEALTH_OK`; with the reasons, for the text and the JSON alike.
fn health(map: &ClusterMap, up: usize, states: &BTreeMap<&'static str, u32>) -> (&'static str, Vec<String>) {
    let mut reasons = Vec::new();
    let mut error = false;
    for state in ["inactive", "down"] {
        if let Some(n) = states.get(state) {
            reasons.push(format!("{n} PGs {state}: they cannot serve I/O"));
            error = true;
        }
    }
    let degraded: u32 = states.iter().filter(|(state, _)| state.contains("degraded")).map(|(_, n)| n).sum();
    if degraded > 0 {
        reasons.push(format!("{degraded} PGs degraded: fewer copies than the pool's size"));
    }
    if let Some(n) = states.get("peering") {
        reasons.push(format!("{n} PGs peering: their I/O waits until their primaries have peered with their new OSDs"));
    }
    for (fullness, is_error, what) in [
        (duplex_map::Fullness::Full, true, "full: writes to their PGs are refused"),
        (duplex_map::Fullness::BackfillFull, false, "backfill full"),
        (duplex_map::Fullness::NearFull, false, "near full"),
    ] {
        let osds: Vec<u32> = map.osds.values().filter(|o| o.fullness == fullness).map(|o| o.id).collect();
        if !osds.is_empty() {
            let names: Vec<String> = osds.iter().map(|id| format!("osd.{id}")).collect();
            let pools = pools_on(map, &osds);
            let pools = if pools.is_empty() { String::new() } else { format!(" (pools {})", pools.join(", ")) };
            reasons.push(format!("{} {what}{pools}", names.join(", ")));
            error |= is_error;
        }
    }
    let down = map.osds.len() - up;
    if down > 0 {
        let names: Vec<String> = map.osds.values().filter(|o| !o.up).map(|o| format!("osd.{}", o.id)).collect();
        reasons.push(format!("{down} of {} OSDs down ({})", map.osds.len(), names.join(", ")));
    }
    let status = if error {
        "HEALTH_ERR"
    } else if reasons.is_empty() {
        "HEALTH_OK"
    } else {
        "HEALTH_WARN"
    };
    (status, reasons)
}

pub fn status(client: &Client, json: bool) -> Result<()> {
    let map = client.map();
    let up = map.osds.values().filter(|o| o.up).count();
    let is_in = map.osds.values().filter(|o| o.is_in).count();
    // Client I/O: the OSDs' counters one second apart.
    // (And which OSDs run on one device of their mirror.)
    let mut degraded_devices = BTreeSet::new();
    // (And the eventual pools' PGs' replication lags, from the last sample.)
    let mut lags = Vec::new();
    let mut sample = |map: &ClusterMap| -> (u64, u64, u64, u64, u64) {
        let mut totals = (0, 0, 0, 0, 0);
        lags.clear();
        for osd in map.osds.values().filter(|o| o.up) {
            if let Ok(stats) = osd_stats(client, &osd.addr) {
                lags.extend(stats.lags.iter().copied());
                totals.0 += stats.capacity_bytes;
                totals.1 += stats.used_bytes;
                totals.2 += stats.writes;
                totals.3 += stats.reads;
                totals.4 += 1;
                if stats.failed_devices > 0 {
                    degraded_devices.insert(osd.id);
                }
            }
        }
        totals
    };
    let before = sample(&map);
    let started = Instant::now();
    std::thread::sleep(Duration::from_secs(1));
    let after = sample(&map);
    let seconds = started.elapsed().as_secs_f64();
    let write_iops = after.2.saturating_sub(before.2) as f64 / seconds;
    let read_iops = after.3.saturating_sub(before.3) as f64 / seconds;
    let (states, down) = pg_states(&map);
    let (mut health, mut reasons) = health(&map, up, &states);
    let eventual = eventual_lags(&map, &mut lags);
    if let Some(why) = &eventual.over {
        reasons.push(why.clone());
        if health == "HEALTH_OK" {
            health = "HEALTH_WARN";
        }
    }
    if !degraded_devices.is_empty() {
        let names: Vec<String> = degraded_devices.iter().map(|id| format!("osd.{id}")).collect();
        reasons.push(format!(
            "{} on one device of its mirror: replace the failed one (docs/STORE.md, \"Mirrored devices\")",
            names.join(", ")
        ));
        if health == "HEALTH_OK" {
            health = "HEALTH_WARN";
        }
    }
    // Images their gateways hold to their limits (looked for only while
    // some pool or image has QoS settings).
    let throttled = client.throttled_images(THROTTLED_SCAN).map_err(|err| err.to_string());
    if json {
        let (images, unchecked, error) = match &throttled {
            Ok((images, unchecked)) => (images.clone(), *unchecked, None),
            Err(err) => (Vec::new(), 0, Some(err.clone())),
        };
        let value = serde_json::json!({
            "throttled_images": images,
            "throttled_unchecked_images": unchecked,
            "throttled_error": error,
            "health": {"status": health, "reasons": reasons},
            "epoch": map.epoch,
            "osds": {"total": map.osds.len(), "up": up, "in": is_in, "reporting": after.4},
            "pools": map.pools.len(),
            "pgs": states,
            "down_pgs": down,
            "capacity_bytes": after.0,
            "used_bytes": after.1,
            "client_iops": {"write": write_iops, "read": read_iops},
            "balancer": {
                "max_spread": f64::from(map.balancer_max_spread) / 1000.0,
                "remapped_pgs": map.pg_upmap.len(),
            },
            "eventual_pgs": lags.iter().map(|l| serde_json::json!({
                "pg": format!("{}.{:x}", duplex_osd::pg::pool_of(l.pg), duplex_osd::pg::pg_number(l.pg)),
                "replication_lag_seconds": l.lag_us as f64 / 1e6,
                "unreplicated_writes": l.unreplicated,
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&value)?);
        return Ok(());
    }
    if reasons.is_empty() {
        println!("cluster:  {health}, map epoch {}", map.epoch);
    } else {
        println!("cluster:  {health} ({}), map epoch {}", reasons.join("; "), map.epoch);
    }
    println!("osds:     {} total, {up} up, {is_in} in", map.osds.len());
    for osd in map.osds.values() {
        println!(
            "          osd.{:<4} {:<4} {:<4} {:<22} host {}",
            osd.id,
            if osd.up { "up" } else { "down" },
            if osd.is_in { "in" } else { "out" },
            osd.addr,
            osd.host
        );
    }
    let pgs: u32 = states.values().sum();
    let summary: Vec<String> = states.iter().map(|(state, n)| format!("{n} {state}")).collect();
    println!("pools:    {} pools, {pgs} PGs: {}", map.pools.len(), summary.join(", "));
    for line in &down {
        println!("          down: {line} (bring one back, or `duplex mark lost ID` if it is gone for good)");
    }
    let used_pct = if after.0 > 0 { after.1 as f64 * 100.0 / after.0 as f64 } else { 0.0 };
    println!("capacity: {} used of {} ({used_pct:.1}%; raw, all copies)", format_size(after.1), format_size(after.0));
    if map.balancer_max_spread == 0 {
        println!("balancer: off ({} PGs remapped)", map.pg_upmap.len());
    } else {
        let spread = f64::from(map.balancer_max_spread) / 10.0;
        println!("balancer: on, OSDs kept within {spread:.1}% of each other ({} PGs remapped)", map.pg_upmap.len());
    }
    println!("client:   {write_iops:.0} write IOPS, {read_iops:.0} read IOPS (last second)");
    if let Some(line) = &eventual.summary {
        println!("eventual: {line}");
    }
    match &throttled {
        Ok((images, unchecked)) => {
            for image in images {
                println!(
                    "qos:      {}/{} held to its limits ({} gateway(s) holding {:.0} I/Os a second)",
                    image.pool, image.image, image.holding.gateways, image.holding.held_per_second
                );
            }
            if *unchecked > 0 {
                println!("qos:      {unchecked} more images not looked at for throttling");
            }
        }
        Err(err) => println!("qos:      could not look for throttled images: {err}"),
    }
    if (after.4 as usize) < up {
        println!("note:     {} of {up} up OSDs did not report counters", up - after.4 as usize);
    }
    Ok(())
}

/// Images `duplex status` looks at for throttling, at most (two reads each).
const THROTTLED_SCAN: usize = 256;

/// `KEY=VALUE`, for `image set`.
fn parse_setting(text: &str) -> Result<(String, String), String> {
    match text.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok((key.trim().to_string(), value.trim().to_string())),
        _ => Err(format!("'{text}' is not KEY=VALUE (say qos_iops=2000)")),
    }
}

/// QoS settings as `key=value` words, as `image set` takes them.
fn settings_text<K: std::fmt::Display>(settings: &[(K, String)]) -> String {
    let words: Vec<String> = settings.iter().map(|(k, v)| format!("{k}={v}")).collect();
    words.join(" ")
}

/// QoS settings as a JSON object of strings.
fn settings_json<K: ToString>(settings: &[(K, String)]) -> serde_json::Value {
    serde_json::Value::Object(
        settings.iter().map(|(k, v)| (k.to_string(), serde_json::Value::String(v.clone()))).collect(),
    )
}
