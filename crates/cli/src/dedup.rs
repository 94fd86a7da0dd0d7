//! `duplex dedup`: the deduplication tier as an operator runs it
//! (docs/DEDUP.md): how much it saves, the engine's mode, the tier scrub.

use anyhow::{bail, Context, Result};
use duplex_client::Client;
use duplex_map::Command as MapCommand;
use duplex_proto::osd::OpKind;
use serde::Serialize;

use crate::admin::run_command;
use duplex_store::units::format_size;

#[derive(Debug, clap::Subcommand)]
pub enum DedupCommand {
    /// What the tier saves: logical bytes, what the pool and its chunk
    /// pool store (one copy), the dedup and compression ratios.
    Status {
        /// A deduplicated pool (default: every one).
        pool: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Run the engine unthrottled, whatever the foreground load.
    Run { pool: String },
    /// Stop the engine's passes (promotions for writers still run).
    Pause { pool: String },
    /// Back to the rate control of the pool's watermarks.
    Auto { pool: String },
    /// Remove the references no chunk map names, and check every entry's
    /// chunk (`--deep`: every chunk's bytes too).
    Scrub {
        pool: String,
        #[arg(long)]
        deep: bool,
        #[arg(long)]
        json: bool,
    },
}

/// One deduplicated pool's figures (one copy of everything).
#[derive(Debug, Default, Serialize)]
pub struct TierStatus {
    pub pool: String,
    pub chunk_pool: String,
    pub chunk_size: u32,
    /// fixed, or content (the chunk size is then the average).
    pub chunking: String,
    pub mode: String,
    pub objects: u64,
    /// What clients wrote: the objects' sizes.
    pub logical_bytes: u64,
    /// Blocks the pool's objects still hold (cached chunks, not yet
    /// deduplicated data, partial blocks), one copy.
    pub base_bytes: u64,
    pub chunks: u64,
    /// The chunks' bytes before and after compression, one copy.
    pub chunk_raw_bytes: u64,
    pub chunk_stored_bytes: u64,
    /// logical ÷ (base + chunks' raw bytes): what deduplication alone saves.
    pub dedup_ratio: f64,
    /// Chunks' raw ÷ stored bytes.
    pub compression_ratio: f64,
    /// logical ÷ (base + chunks' stored bytes).
    pub total_ratio: f64,
}

pub fn dedup(client: &Client, command: DedupCommand) -> Result<()> {
    let mut mon = client.monitor();
    let mut mode = |pool: &str, mode: &str| -> Result<()> {
        let command = MapCommand::PoolSet { name: pool.into(), key: "dedup_mode".into(), value: mode.into() };
        let epoch = run_command(&mut mon, command)?;
        println!("pool '{pool}': deduplication engine {mode} (map epoch {epoch})");
        Ok(())
    };
    match command {
        DedupCommand::Run { pool } => mode(&pool, "run"),
        DedupCommand::Pause { pool } => mode(&pool, "pause"),
        DedupCommand::Auto { pool } => mode(&pool, "auto"),
        DedupCommand::Status { pool, json } => status(client, pool.as_deref(), json),
        DedupCommand::Scrub { pool, deep, json } => {
            let id = client.pool_id(&pool)?;
            let report = duplex_client::tier::scrub(client, id, deep)
                .with_context(|| format!("scrubbing the tier of pool '{pool}'"))?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                println!(
                    "pool '{pool}': {} chunks, {} references, {} entries; {} leaked references removed, {} left (busy)",
                    report.chunks, report.references, report.entries, report.leaks_removed, report.leaks_busy
                );
                for missing in &report.missing {
                    println!("  MISSING chunk for {missing}");
                }
                for damaged in &report.damaged {
                    println!("  DAMAGED chunk object {damaged}");
                }
            }
            if !report.missing.is_empty() || !report.damaged.is_empty() {
                bail!("the tier of pool '{pool}' lost chunks: see above");
            }
            Ok(())
        }
    }
}

fn status(client: &Client, only: Option<&str>, json: bool) -> Result<()> {
    let map = client.map();
    let (usage, silent) = crate::df::usage(client)?;
    let mut out = Vec::new();
    for pool in map.pools.values() {
        let Some(tier) = pool.dedup else { continue };
        if only.is_some_and(|name| name != pool.name) {
            continue;
        }
        let base = usage.pools.iter().find(|p| p.id == pool.id);
        let chunks = usage.pools.iter().find(|p| p.id == tier.chunk_pool);
        let chunk_pool = map.pools.get(&tier.chunk_pool).map_or("?".into(), |p| p.name.clone());
        let chunk_raw_bytes = chunk_raw_bytes(client, tier.chunk_pool)?;
        let mut status = TierStatus {
            pool: pool.name.clone(),
            chunk_pool,
            chunk_size: tier.chunk_size,
            chunking: tier.chunking.to_string(),
            mode: tier.mode.to_string(),
            objects: base.map_or(0, |b| b.objects),
            logical_bytes: base.map_or(0, |b| b.stored_bytes),
            base_bytes: base.map_or(0, |b| b.used_bytes / u64::from(b.size.max(1))),
            chunks: chunks.map_or(0, |c| c.objects),
            chunk_raw_bytes,
            chunk_stored_bytes: chunks.map_or(0, |c| c.stored_bytes),
            ..TierStatus::default()
        };
        let ratio = |a: u64, b: u64| if b == 0 { 1.0 } else { a as f64 / b as f64 };
        status.dedup_ratio = ratio(status.logical_bytes, status.base_bytes + status.chunk_raw_bytes);
        status.compression_ratio = ratio(status.chunk_raw_bytes, status.chunk_stored_bytes);
        status.total_ratio = ratio(status.logical_bytes, status.base_bytes + status.chunk_stored_bytes);
        out.push(status);
    }
    if let Some(name) = only {
        if out.is_empty() {
            bail!("pool '{name}' is not deduplicated (or does not exist)");
        }
    }
    if json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        for s in &out {
            println!(
                "pool '{}' → chunk pool '{}' ({} KiB chunks, {} chunking, engine {})",
                s.pool,
                s.chunk_pool,
                s.chunk_size >> 10,
                s.chunking,
                s.mode
            );
            println!(
                "  {} objects, {} logical; held in the pool {}, in {} chunks {} raw, {} stored",
                s.objects,
                format_size(s.logical_bytes),
                format_size(s.base_bytes),
                s.chunks,
                format_size(s.chunk_raw_bytes),
                format_size(s.chunk_stored_bytes)
            );
            println!(
                "  dedup {:.2}x, compression {:.2}x, together {:.2}x (one copy; the engine's rate: duplex_osd_dedup_ios_total)",
                s.dedup_ratio, s.compression_ratio, s.total_ratio
            );
        }
        if out.is_empty() {
            println!("no deduplicated pools");
        }
    }
    for line in &silent {
        eprintln!("warning: {line}: its copies are not counted");
    }
    Ok(())
}

/// The chunks' raw bytes: each chunk object's frame header, read in
/// parallel (a few bytes per chunk).
fn chunk_raw_bytes(client: &Client, chunk_pool: u32) -> Result<u64> {
    let names = client.list_objects(chunk_pool, b"")?;
    let (tx, rx) = std::sync::mpsc::channel();
    let mut total = 0u64;
    for window in names.chunks(256) {
        for name in window {
            let tx = tx.clone();
            let op = duplex_client::ObjectOp {
                length: duplex_dedup::frame::HEADER as u32,
                ..duplex_client::ObjectOp::new(chunk_pool, OpKind::Read, bytes::Bytes::from(name.clone()))
            };
            client.submit(op, Box::new(move |result| drop(tx.send(result))));
        }
        for _ in window {
            match rx.recv().context("the client stopped")? {
                Ok(header) => total += duplex_dedup::frame::raw_len(&header).unwrap_or(0) as u64,
                Err(duplex_client::ClientError::NotFound) => {}
                Err(err) => return Err(err.into()),
            }
        }
    }
    Ok(total)
}
