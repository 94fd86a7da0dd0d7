//! `duplex-osd-bench`: the object-level benchmark of issue 4 (no NBD in
//! between). Starts a local cluster (an in-process monitor, N `duplex-osd`
//! processes, replication 2), fills a set of objects, then runs 4 KiB
//! random writes and reads at each queue depth, for each combination of
//! the ablation switches. Reports IOPS, client-side p50/p99 latency, CPU
//! microseconds per op by OSD thread class, the OSDs' context switches
//! per op, OSD resident memory and the operation log's size.
//!
//! A mode's optional third part, `eventual`, runs it on an eventual pool
//! (issue 30): `oplog/prioritized/eventual`, `oplog/lalca/eventual`, and
//! `ideal/prioritized/eventual` (the primary answers on receipt). With
//! `--osd-cpus`, the OSDs run on those cores only (the load generator on
//! the others, if any are left): the cores-against-IOPS figure.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Result;
use clap::Parser;
use duplex_client::load::{self, LoadSpec, Pattern};
use duplex_client::ObjectClient;
use duplex_testkit::{credentials, metric_in, LocalCluster, LocalOptions};

// The OSD processes it runs are this executable: the same heap as `duplex-osd`.
#[global_allocator]
static ALLOCATOR: duplex_osd::metrics::alloc_count::CountingAllocator =
    duplex_osd::metrics::alloc_count::CountingAllocator;

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
    /// Cores the OSD processes may use (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    osd_cpus: Vec<usize>,
    /// Client sessions, each with its own connections, sharing the queue
    /// depth (at least 1 each): many clients reach each OSD, as in the
    /// LALCA paper's figures, so one PG's operations come in on several
    /// of its threads.
    #[arg(long, default_value_t = 1)]
    sessions: usize,
    /// The eventual pool's max_lag, for `/eventual` modes (ms).
    #[arg(long, default_value_t = 1000)]
    max_lag_ms: u32,
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
    /// Context switches per op, over every thread of every OSD.
    switches: f64,
    /// `threading = lalca`: the share of ops forwarded to their PG's owner.
    forwarded: f64,
}

fn forwarded_ops(cluster: &LocalCluster) -> f64 {
    cluster.metric_sum("duplex_osd_lalca_ops_total{ran=\"forwarded\"}").unwrap_or(0.0)
}

/// Context switches (voluntary and involuntary) of every thread of
/// process `pid` so far; threads that ended are not counted.
fn switches_of(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return 0 };
    tasks
        .flatten()
        .map(|task| {
            let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
            status
                .lines()
                .filter(|l| l.starts_with("voluntary_ctxt_switches:") || l.starts_with("nonvoluntary_ctxt_switches:"))
                .filter_map(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

fn osd_switches(cluster: &LocalCluster) -> u64 {
    cluster.osds.values().map(|osd| switches_of(osd.child.id())).sum()
}

/// Restricts this process's calling thread (and what it starts from now
/// on) to `cores`; empty: every core.
fn run_on(cores: &[usize]) -> Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        let all: Vec<usize> = (0..online).collect();
        for core in if cores.is_empty() { &all[..] } else { cores } {
            libc::CPU_SET(*core, &mut set);
        }
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            anyhow::bail!("cannot run on cores {cores:?}: {}", std::io::Error::last_os_error());
        }
    }
    Ok(())
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
        let mut parts = mode.split('/');
        let (Some(write_path), Some(threading)) = (parts.next(), parts.next()) else {
            anyhow::bail!("a mode is WRITE_PATH/THREADING[/eventual]: {mode}");
        };
        let eventual = match parts.next() {
            None => false,
            Some("eventual") => true,
            Some(other) => anyhow::bail!("a mode's third part is `eventual`, not {other:?}"),
        };
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
        if eventual {
            cluster.mon_client().command(&duplex_map::Command::PoolCreateEventual {
                name: "bench".into(),
                size: 2,
                min_size: 1,
                pg_num: args.pg_num,
                eventual: duplex_map::Eventual { max_lag_ms: args.max_lag_ms },
            })?;
        } else {
            cluster.create_pool("bench", 2, 1, args.pg_num)?;
        }
        // No PG moves while it measures: this load generator does not
        // follow the map, so a move would show as errors (and cost CPU).
        cluster.mon_client().command(&duplex_map::Command::SetBalancer { max_spread_permille: 0 })?;
        let mut cluster = cluster;
        // The OSDs inherit this thread's cores; the load generator then
        // takes the rest.
        run_on(&args.osd_cpus)?;
        for id in 0..args.osds {
            cluster.start_osd(id)?;
        }
        let online = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rest: Vec<usize> = (0..online).filter(|c| !args.osd_cpus.contains(c)).collect();
        run_on(if args.osd_cpus.is_empty() || rest.is_empty() { &[] } else { &rest })?;
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
                let switched_before = osd_switches(&cluster);
                let forwarded_before = forwarded_ops(&cluster);
                let group = load::Group {
                    sessions: args.sessions.max(1),
                    queue_depth: (queue_depth / args.sessions.max(1)).max(1),
                };
                let result = load::run_groups(&client, &spec, &[group])?.pop().expect("one group, one result");
                let switched = osd_switches(&cluster).saturating_sub(switched_before);
                let forwarded = forwarded_ops(&cluster) - forwarded_before;
                let after = cpu_by_class(&cluster)?;
                let ops = result.ops.max(1) as f64;
                let cpu = CLASSES
                    .iter()
                    .zip(before.iter().zip(&after))
                    .map(|(class, (b, a))| (class.to_string(), (a - b) * 1e6 / ops))
                    .collect();
                eprintln!(
                    "   {workload} qd {queue_depth}: {:.0} IOPS, p50 {} us, p99 {} us, {:.1} switches/op, {} errors",
                    result.iops(),
                    result.latency.value_at_quantile(0.5),
                    result.latency.value_at_quantile(0.99),
                    switched as f64 / ops,
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
                    switches: switched as f64 / ops,
                    forwarded: forwarded / ops,
                });
            }
        }
        let rss: Vec<u64> = cluster.osds.keys().map(|id| cluster.rss_bytes(*id)).collect::<Result<_>>()?;
        let oplog: Vec<(u64, u64)> = cluster.osds.keys().map(|id| cluster.oplog_bytes(*id)).collect::<Result<_>>()?;
        memory.push((mode.clone(), rss, oplog));
        client.refresh_map();
    }
    println!("| mode (write_path/threading) | workload | QD | IOPS | p50 µs | p99 µs | CPU µs/op: priority | non-priority | pool | other | switches/op | forwarded | errors |");
    println!("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for row in &rows {
        print!(
            "| {} | {} | {} | {:.0} | {} | {} |",
            row.mode, row.workload, row.queue_depth, row.iops, row.p50_us, row.p99_us
        );
        for (_, micros) in &row.cpu {
            print!(" {micros:.1} |");
        }
        println!(" {:.2} | {:.0}% | {} |", row.switches, row.forwarded * 100.0, row.errors);
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
