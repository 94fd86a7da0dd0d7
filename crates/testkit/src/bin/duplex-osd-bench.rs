//! `duplex-osd-bench`: the object-level benchmark of issue 4 (no NBD in
//! between). Starts a local cluster (an in-process monitor, N `duplex-osd`
//! processes, replication 2), fills a set of objects, then runs 4 KiB
//! random writes and reads at each queue depth, for each combination of
//! the ablation switches. Reports IOPS, client-side p50/p99 latency, CPU
//! microseconds per op by OSD thread class, OSD resident memory and the
//! operation log's size.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Parser;
use duplex_client::load::{self, LoadSpec, Pattern};
use duplex_client::ObjectClient;
use duplex_testkit::{credentials, metric_in, LocalCluster, LocalOptions};

#[derive(Parser)]
#[command(name = "duplex-osd-bench", about = "Object-level benchmark of a local Duplex cluster")]
struct Args {
    #[arg(long, default_value_t = 3)]
    osds: u32,
    /// Seconds per run.
    #[arg(long, default_value_t = 5)]
    seconds: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,32")]
    queue_depths: Vec<usize>,
    /// write_path/threading combinations, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "oplog/prioritized,oplog/pool,sync/prioritized,sync/pool")]
    modes: Vec<String>,
    #[arg(long, default_value_t = 128)]
    objects: u32,
    #[arg(long, default_value_t = 1 << 20)]
    object_size: u64,
    #[arg(long, default_value_t = 32)]
    pg_num: u32,
    /// Store file size per OSD.
    #[arg(long, default_value_t = 1 << 30)]
    store_bytes: u64,
    /// Where the stores go (default: a temporary directory, removed afterwards).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Extra flags for every OSD (space-separated).
    #[arg(long, default_value = "")]
    osd_args: String,
    /// Tiny runs that check the benchmark works and measure nothing.
    #[arg(long)]
    smoke: bool,
}

struct Row {
    mode: String,
    workload: &'static str,
    queue_depth: usize,
    iops: f64,
    errors: u64,
    p50_us: u64,
    p99_us: u64,
    /// CPU µs per op summed over the OSDs, by class.
    cpu: Vec<(String, f64)>,
}

const CLASSES: [&str; 4] = ["priority", "non_priority", "pool_worker", "other"];

fn cpu_by_class(cluster: &LocalCluster) -> Result<Vec<f64>> {
    let mut totals = vec![0.0; CLASSES.len()];
    for id in cluster.osds.keys() {
        let page = cluster.metrics(*id)?;
        for (i, class) in CLASSES.iter().enumerate() {
            totals[i] += metric_in(&page, &format!("duplex_osd_cpu_seconds_total{{class=\"{class}\"}}")).unwrap_or(0.0);
        }
    }
    Ok(totals)
}

fn main() -> Result<()> {
    // The cluster's OSDs are this same executable, run as `duplex-osd-bench osd FLAGS`:
    // one `cargo run` builds everything the benchmark needs.
    if let Some(osd) = duplex_testkit::run_as_osd_if_asked() {
        return osd;
    }
    let mut args = Args::parse();
    if args.smoke {
        args.seconds = 1;
        args.objects = 16;
        args.object_size = 64 << 10;
        args.store_bytes = 256 << 20;
        args.pg_num = 8;
    }
    let osd_binary = std::env::current_exe()?;
    let mut rows = Vec::new();
    let mut memory = Vec::new();
    for mode in &args.modes {
        let (write_path, threading) = mode.split_once('/').context("a mode is WRITE_PATH/THREADING")?;
        let mut osd_args: Vec<String> =
            vec!["--write-path".into(), write_path.into(), "--threading".into(), threading.into()];
        osd_args.extend(args.osd_args.split_whitespace().map(String::from));
        let options = LocalOptions {
            osd_binary: osd_binary.clone(),
            osd_prefix_args: vec!["osd".into()],
            dir: args.dir.clone(),
            store_bytes: args.store_bytes,
            store_partitions: 2,
            osd_args,
            osd_stderr: false,
            monitor_grace_ms: 60_000,
        };
        eprintln!("== {mode}: starting {} OSDs", args.osds);
        let cluster = LocalCluster::start(0, options)?;
        cluster.create_pool("bench", 2, 1, args.pg_num)?;
        // No PG moves while it measures: this load generator does not
        // follow the map, so a move would show as errors (and cost CPU).
        cluster.mon_client().command(&duplex_map::Command::SetBalancer { max_spread_permille: 0 })?;
        let mut cluster = cluster;
        for id in 0..args.osds {
            cluster.start_osd(id)?;
        }
        cluster.wait_all_up(Duration::from_secs(30))?;
        let mut client = ObjectClient::connect(cluster.monitors(), credentials("client.bench"))?;
        let pool = client.pool_id("bench")?;
        // Fill every object, so writes overwrite and reads find data.
        let chunk = vec![0x5Au8; 64 << 10];
        for n in 0..args.objects {
            let name = format!("bench.{n}");
            let mut offset = 0;
            while offset < args.object_size {
                let len = chunk.len().min((args.object_size - offset) as usize);
                client.write(pool, name.as_bytes(), offset, &chunk[..len])?;
                offset += len as u64;
            }
        }
        for (workload, pattern) in [("randwrite", Pattern::RandomWrite), ("randread", Pattern::RandomRead)] {
            for &queue_depth in &args.queue_depths {
                let spec = LoadSpec {
                    pool,
                    pattern,
                    prefix: "bench".into(),
                    objects: args.objects,
                    object_size: args.object_size,
                    block: 4096,
                    queue_depth,
                    duration: Duration::from_secs(args.seconds),
                    warmup: Duration::ZERO,
                    seed: queue_depth as u64,
                };
                let before = cpu_by_class(&cluster)?;
                let result = load::run(&client, &spec)?;
                let after = cpu_by_class(&cluster)?;
                let ops = result.ops.max(1) as f64;
                let cpu = CLASSES
                    .iter()
                    .zip(before.iter().zip(&after))
                    .map(|(class, (b, a))| (class.to_string(), (a - b) * 1e6 / ops))
                    .collect();
                eprintln!(
                    "   {workload} qd {queue_depth}: {:.0} IOPS, p50 {} us, p99 {} us, {} errors",
                    result.iops(),
                    result.latency.value_at_quantile(0.5),
                    result.latency.value_at_quantile(0.99),
                    result.errors
                );
                rows.push(Row {
                    mode: mode.clone(),
                    workload,
                    queue_depth,
                    iops: result.iops(),
                    errors: result.errors,
                    p50_us: result.latency.value_at_quantile(0.5),
                    p99_us: result.latency.value_at_quantile(0.99),
                    cpu,
                });
            }
        }
        let rss: Vec<u64> = cluster.osds.keys().map(|id| cluster.rss_bytes(*id)).collect::<Result<_>>()?;
        let oplog: Vec<(u64, u64)> = cluster.osds.keys().map(|id| cluster.oplog_bytes(*id)).collect::<Result<_>>()?;
        memory.push((mode.clone(), rss, oplog));
        client.refresh_map();
    }
    println!("| mode (write_path/threading) | workload | QD | IOPS | p50 µs | p99 µs | CPU µs/op: priority | non-priority | pool | other | errors |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for row in &rows {
        print!(
            "| {} | {} | {} | {:.0} | {} | {} |",
            row.mode, row.workload, row.queue_depth, row.iops, row.p50_us, row.p99_us
        );
        for (_, micros) in &row.cpu {
            print!(" {micros:.1} |");
        }
        println!(" {} |", row.errors);
    }
    println!();
    println!(
        "| mode | OSD resident memory (MiB, after the runs) | log files: length (MiB) | log files: allocated (MiB) |"
    );
    println!("| --- | --- | --- | --- |");
    let mib = |b: u64| format!("{:.0}", b as f64 / (1 << 20) as f64);
    for (mode, rss, oplog) in &memory {
        let rss = rss.iter().map(|b| mib(*b)).collect::<Vec<_>>().join(" / ");
        let length = oplog.iter().map(|(l, _)| mib(*l)).collect::<Vec<_>>().join(" / ");
        let allocated = oplog.iter().map(|(_, a)| mib(*a)).collect::<Vec<_>>().join(" / ");
        println!("| {mode} | {rss} | {length} | {allocated} |");
    }
    if rows.iter().any(|r| r.errors > 0) {
        anyhow::bail!("some operations failed");
    }
    Ok(())
}
