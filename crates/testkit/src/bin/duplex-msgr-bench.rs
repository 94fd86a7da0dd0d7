//! `duplex-msgr-bench`: the messenger benchmark of issue 29 (the
//! Async-LCAM paper's MsgrTest, Fig. 15). One OSD with a null backend
//! (`--write-path ideal`, replication 1: a write is answered as soon as it
//! is decoded and checked, and stored nowhere), and skewed clients: a few
//! heavy sessions with many requests in flight beside many light ones with
//! one. For each connection policy (and thread count) it reports IOPS and
//! latency per class of session, the bytes and CPU of each priority thread
//! (Fig. 2 and 12), and the lock wait of each connection (Fig. 4 and 13).
//!
//! The load generator is one thread of this process on the same machine,
//! so it takes a core's share from the OSD: compare policies with each
//! other, not with a machine that drives the OSD from elsewhere.

use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Parser;
use duplex_client::load::{self, Group, LoadSpec, Pattern};
use duplex_client::ObjectClient;
use duplex_testkit::{credentials, metric_in, LocalCluster, LocalOptions};

#[derive(Parser)]
#[command(name = "duplex-msgr-bench", about = "Messenger benchmark: skewed connections into one OSD, null backend")]
struct Args {
    /// Connection policies to compare, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "pinned,lcam,naive")]
    policies: Vec<String>,
    /// Priority threads of the OSD, comma-separated: a run for each.
    #[arg(long, value_delimiter = ',', default_value = "2")]
    threads: Vec<usize>,
    /// Heavy sessions, and the requests each keeps in flight.
    #[arg(long, default_value_t = 2)]
    heavy: usize,
    #[arg(long, default_value_t = 64)]
    heavy_qd: usize,
    /// Light sessions, and the requests each keeps in flight.
    #[arg(long, default_value_t = 30)]
    light: usize,
    #[arg(long, default_value_t = 1)]
    light_qd: usize,
    /// Bytes per write.
    #[arg(long, default_value_t = 4096)]
    block: u32,
    /// Seconds measured per run, after the warm-up.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Seconds of load before measuring (for lcam's placement to settle).
    #[arg(long, default_value_t = 6)]
    warmup: u64,
    /// lcam's placement interval (ms); the paper's is 3000.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// The order sessions connect in: `collide`, so that handing
    /// connections to threads in turn (pinned) puts every heavy one on the
    /// same thread (the skew the paper studies); `spread`, so that it puts
    /// them on different threads (pinned's best case).
    #[arg(long, default_value = "collide")]
    arrival: String,
    /// Tiny runs that check the benchmark works and measure nothing.
    #[arg(long)]
    smoke: bool,
}

struct Run {
    threads: usize,
    policy: String,
    heavy: load::LoadResult,
    light: load::LoadResult,
    /// Per priority thread: bytes handled and CPU seconds, over the measured part.
    per_thread: Vec<(f64, f64)>,
    /// Per connection (the admin socket's report at the end): bytes,
    /// lock wait in µs, and the threads serving it.
    conns: Vec<(u64, u64, usize)>,
    /// The priority threads' context switches over the measured part:
    /// voluntary, involuntary.
    switched: (u64, u64),
}

fn thread_figures(page: &str, threads: usize) -> Vec<(f64, f64)> {
    (0..threads)
        .map(|t| {
            let bytes = metric_in(page, &format!("duplex_osd_thread_bytes_total{{thread=\"{t}\"}}")).unwrap_or(0.0);
            let cpu = metric_in(page, &format!("duplex_osd_thread_cpu_seconds_total{{thread=\"{t}\"}}")).unwrap_or(0.0);
            (bytes, cpu)
        })
        .collect()
}

/// The priority threads' context switches: voluntary (a sleep in
/// `epoll_wait` or on a lock) and involuntary (preempted).
fn switches(pid: u32) -> (u64, u64) {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return (0, 0) };
    let mut total = (0, 0);
    for task in tasks.flatten() {
        let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
        if !comm.starts_with("osd-prio") {
            continue;
        }
        let status = std::fs::read_to_string(task.path().join("status")).unwrap_or_default();
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
        };
        total.0 += field("voluntary_ctxt_switches:");
        total.1 += field("nonvoluntary_ctxt_switches:");
    }
    total
}

fn run_one(args: &Args, threads: usize, policy: &str) -> Result<Run> {
    let options = LocalOptions {
        osd_binary: std::env::current_exe()?,
        osd_prefix_args: vec!["osd".into()],
        dir: None,
        store_bytes: 256 << 20,
        store_partitions: 2,
        osd_args: [
            "--write-path",
            "ideal",
            "--priority-threads",
            &threads.to_string(),
            "--connection-policy",
            policy,
            "--lcam-interval-ms",
            &args.interval_ms.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect(),
        osd_stderr: false,
        monitor_grace_ms: 60_000,
    };
    let cluster = LocalCluster::start(0, options)?;
    cluster.create_pool("msgr", 1, 1, 32)?;
    let mut cluster = cluster;
    cluster.start_osd(0)?;
    cluster.wait_all_up(Duration::from_secs(30))?;
    let client = ObjectClient::connect(cluster.monitors(), credentials("client.msgr"))?;
    let pool = client.pool_id("msgr")?;
    let spec = LoadSpec {
        pool,
        pattern: Pattern::RandomWrite,
        prefix: "msgr".into(),
        objects: 256,
        object_size: 1 << 20,
        block: args.block,
        queue_depth: 0,
        duration: Duration::from_secs(args.seconds),
        warmup: Duration::from_secs(args.warmup),
        seed: threads as u64,
    };
    // Sessions connect group by group; each group is one class.
    let heavy = Group { sessions: 1, queue_depth: args.heavy_qd };
    let light = |sessions| Group { sessions, queue_depth: args.light_qd };
    let mut groups = Vec::new();
    let mut is_heavy = Vec::new();
    let mut lights_left = args.light;
    for _ in 0..args.heavy {
        groups.push(heavy);
        is_heavy.push(true);
        // collide: threads - 1 light ones between two heavy ones, so that
        // every heavy one is the next connection thread 0 gets.
        let between = if args.arrival == "collide" { (threads - 1).min(lights_left) } else { 0 };
        if between > 0 {
            groups.push(light(between));
            is_heavy.push(false);
            lights_left -= between;
        }
    }
    if lights_left > 0 {
        groups.push(light(lights_left));
        is_heavy.push(false);
    }
    // The measured part starts after the warm-up: sample the counters then,
    // and the connections' report just before the sessions end (closed
    // connections leave it).
    let sampler = {
        let (warmup, measured) = (spec.warmup, spec.duration);
        let admin = cluster.osds[&0].admin;
        let pid = cluster.osds[&0].child.id();
        let socket = cluster.osds[&0].oplog_dir.join("admin.sock");
        std::thread::spawn(move || -> Result<(String, serde_json::Value, (u64, u64))> {
            std::thread::sleep(warmup);
            let page = duplex_testkit::metrics_page(admin)?;
            let switched = switches(pid);
            std::thread::sleep(measured.saturating_sub(Duration::from_millis(300)));
            Ok((page, duplex_testkit::admin_command(&socket, r#"{"command":"connections"}"#)?, switched))
        })
    };
    let results = load::run_groups(&client, &spec, &groups)?;
    let (before, report, switched_before) = sampler.join().map_err(|_| anyhow::anyhow!("the sampler panicked"))??;
    let after = cluster.metrics(0)?;
    let switched_after = switches(cluster.osds[&0].child.id());
    let switched = (switched_after.0 - switched_before.0, switched_after.1 - switched_before.1);
    let (mut heavy, mut light) = (load::LoadResult::empty(), load::LoadResult::empty());
    for (result, heavy_one) in results.into_iter().zip(is_heavy) {
        let class = if heavy_one { &mut heavy } else { &mut light };
        class.ops += result.ops;
        class.errors += result.errors;
        class.elapsed = result.elapsed;
        class.latency.add(&result.latency).context("merging latencies")?;
    }
    let per_thread = thread_figures(&before, threads)
        .iter()
        .zip(thread_figures(&after, threads))
        .map(|((b0, c0), (b1, c1))| (b1 - b0, c1 - c0))
        .collect();
    let conns = report["connections"]
        .as_array()
        .map(|conns| {
            conns
                .iter()
                .map(|c| {
                    let workers = c["workers"].as_array().map_or(0, Vec::len);
                    (c["total_bytes"].as_u64().unwrap_or(0), c["total_lock_wait_us"].as_u64().unwrap_or(0), workers)
                })
                .collect()
        })
        .unwrap_or_default();
    if heavy.errors + light.errors > 0 {
        bail!("{policy}: {} requests failed", heavy.errors + light.errors);
    }
    Ok(Run { threads, policy: policy.into(), heavy, light, per_thread, conns, switched })
}

fn main() -> Result<()> {
    // The OSD is this same executable, run as `duplex-msgr-bench osd FLAGS`.
    if let Some(osd) = duplex_testkit::run_as_osd_if_asked() {
        return osd;
    }
    let mut args = Args::parse();
    if args.smoke {
        args.seconds = 1;
        args.warmup = 1;
        args.interval_ms = 200;
        args.light = 4;
    }
    let mut runs = Vec::new();
    for &threads in &args.threads {
        for policy in &args.policies {
            eprintln!("== {threads} threads, {policy}");
            let run = run_one(&args, threads, policy)?;
            eprintln!(
                "   heavy {:.0} IOPS (p99 {} us), light {:.0} IOPS (p99 {} us)",
                run.heavy.iops(),
                run.heavy.latency.value_at_quantile(0.99),
                run.light.iops(),
                run.light.latency.value_at_quantile(0.99)
            );
            runs.push(run);
        }
    }
    println!(
        "Fig. 15: {} heavy sessions (QD {}) and {} light (QD {}), {} B writes, null backend, arrival {}\n",
        args.heavy, args.heavy_qd, args.light, args.light_qd, args.block, args.arrival
    );
    println!("| threads | policy | total IOPS | heavy IOPS | heavy p50 / p99 µs | light IOPS | light p50 / p99 µs | priority-thread CPU µs/op | sleeps / preemptions per 1000 ops |");
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |");
    for run in &runs {
        let ops = (run.heavy.ops + run.light.ops).max(1) as f64;
        let cpu: f64 = run.per_thread.iter().map(|(_, c)| c).sum();
        println!(
            "| {} | {} | {:.0} | {:.0} | {} / {} | {:.0} | {} / {} | {:.1} | {:.0} / {:.0} |",
            run.threads,
            run.policy,
            run.heavy.iops() + run.light.iops(),
            run.heavy.iops(),
            run.heavy.latency.value_at_quantile(0.5),
            run.heavy.latency.value_at_quantile(0.99),
            run.light.iops(),
            run.light.latency.value_at_quantile(0.5),
            run.light.latency.value_at_quantile(0.99),
            cpu * 1e6 / ops,
            run.switched.0 as f64 * 1000.0 / ops,
            run.switched.1 as f64 * 1000.0 / ops,
        );
    }
    println!("\nFig. 2 and 12: what each priority thread handled over the measured seconds\n");
    println!("| threads | policy | thread | MiB handled | CPU s |");
    println!("| ---: | --- | ---: | ---: | ---: |");
    for run in &runs {
        for (thread, (bytes, cpu)) in run.per_thread.iter().enumerate() {
            println!("| {} | {} | {thread} | {:.0} | {cpu:.2} |", run.threads, run.policy, bytes / (1 << 20) as f64);
        }
    }
    println!("\nFig. 4 and 13: lock wait per connection (warm-up included), heaviest first\n");
    println!("| threads | policy | heaviest connections: MiB, lock wait ms, threads serving it at the end | all others: lock wait ms (sum) |");
    println!("| ---: | --- | --- | ---: |");
    for run in &runs {
        let mut conns = run.conns.clone();
        conns.sort_by_key(|c| std::cmp::Reverse(c.0));
        let heavy: Vec<String> = conns
            .iter()
            .take(args.heavy)
            .map(|(bytes, wait, workers)| {
                format!("{:.0} MiB, {:.1} ms, {workers}", *bytes as f64 / (1 << 20) as f64, *wait as f64 / 1000.0)
            })
            .collect();
        let rest: u64 = conns.iter().skip(args.heavy).map(|(_, wait, _)| wait).sum();
        let heavy = if heavy.is_empty() { "(pinned: not shared)".to_string() } else { heavy.join("; ") };
        println!("| {} | {} | {heavy} | {:.1} |", run.threads, run.policy, rest as f64 / 1000.0);
    }
    Ok(())
}
