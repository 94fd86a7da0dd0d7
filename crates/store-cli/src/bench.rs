//! `duplex-store bench`: 4 KiB random overwrites and reads of pre-allocated
//! 4 MiB objects, one thread per partition, each keeping `--qd` requests in
//! every batch. Reports IOPS, CPU microseconds per op (getrusage of the
//! whole process), and host-side write amplification (bytes the store wrote
//! to the device ÷ bytes the benchmark asked to write, journal and
//! checkpoints included). With `--fio`, runs fio on the same file region
//! with the same block size, queue depth and job count, for the ratio.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use duplex_store::{Batch, Key, MkfsOptions, Partition, ReadRequest, Store};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::result::{RunResult, StageTimes};
use crate::DeviceArgs;
use duplex_store::units::{format_size, parse_size};

const OBJECT_SIZE: u64 = 4 << 20;
const BLOCKS_PER_OBJECT: u64 = OBJECT_SIZE / 4096;

#[derive(clap::Args, Clone)]
pub struct BenchArgs {
    /// Store file (created, formatted and, unless --keep, removed).
    #[arg(long, default_value = "target/duplex-store-bench.img")]
    path: PathBuf,
    /// Size of the store file (sparse).
    #[arg(long, value_parser = parse_size, default_value = "3G")]
    size: u64,
    /// Bytes of pre-allocated 4 MiB objects to create, fill and run over.
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    dataset: u64,
    /// Partition counts to run, comma-separated (one thread each).
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    partitions: Vec<u32>,
    /// Requests per batch per partition (the queue depth).
    #[arg(long, default_value_t = 32)]
    qd: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 10)]
    seconds: u64,
    /// Workloads, comma-separated: randwrite, randread.
    #[arg(long, value_delimiter = ',', default_value = "randwrite,randread")]
    workloads: Vec<String>,
    /// Also run fio (io_uring, direct) on the same file region for comparison.
    #[arg(long)]
    fio: bool,
    /// Print results as JSON on stdout.
    #[arg(long)]
    json: bool,
    /// Tiny sizes and 1-second runs: checks the benchmark works, measures nothing.
    #[arg(long)]
    smoke: bool,
    /// Keep the store file afterwards.
    #[arg(long)]
    keep: bool,
    /// Run everything this many times, store and fio alternating, and report medians.
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    #[command(flatten)]
    device: DeviceArgs,
}

fn stage_totals(workers: &[Worker]) -> [u64; 6] {
    workers.iter().fold([0; 6], |acc, w| {
        let s = w.partition.stats();
        [
            acc[0] + s.plan_ns,
            acc[1] + s.record_write_ns,
            acc[2] + s.data_write_ns,
            acc[3] + s.flush_ns,
            acc[4] + s.checkpoint_ns,
            acc[5] + s.batches,
        ]
    })
}

pub fn run(mut args: BenchArgs) -> Result<()> {
    if args.smoke {
        args.size = 96 << 20;
        args.dataset = 32 << 20;
        args.seconds = 1;
        args.qd = args.qd.min(16);
    }
    for workload in &args.workloads {
        if workload != "randwrite" && workload != "randread" {
            bail!("unknown workload '{workload}' (use randwrite, randread)");
        }
    }
    if args.dataset < OBJECT_SIZE || args.dataset > args.size {
        bail!("--dataset must be at least 4M and at most --size");
    }
    // The bench formats its path. It only ever creates, sizes and deletes a
    // regular file; an existing device or other special file is used as it
    // is (with --keep), never resized or unlinked.
    let device_path = match std::fs::metadata(&args.path) {
        Ok(m) if !m.is_file() => {
            if !args.keep {
                bail!(
                    "{} is not a regular file; to benchmark a device (destroying its contents) pass --keep",
                    args.path.display()
                );
            }
            true
        }
        _ => false,
    };
    if let Some(parent) = args.path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    let mut runs = Vec::new();
    for round in 0..args.repeat.max(1) {
        if args.repeat > 1 {
            eprintln!("bench: round {} of {}", round + 1, args.repeat);
        }
        for &partitions in &args.partitions {
            runs.extend(run_partitions(&args, partitions, device_path)?);
        }
    }
    if !args.keep && !device_path {
        let _ = std::fs::remove_file(&args.path);
    }
    let medians = medians(&runs);
    if args.repeat > 1 {
        eprintln!("\nmedians of {} rounds:", args.repeat);
    }
    print_table(&medians);
    print_ratios(&medians);
    if args.json {
        println!("{}", serde_json::to_string_pretty(&serde_json::json!({ "runs": runs, "medians": medians }))?);
    }
    Ok(())
}

/// One result per (engine, workload, partitions): the run with the median IOPS.
fn medians(runs: &[RunResult]) -> Vec<RunResult> {
    let mut groups: Vec<Vec<&RunResult>> = Vec::new();
    for run in runs {
        match groups
            .iter_mut()
            .find(|g| g[0].engine == run.engine && g[0].workload == run.workload && g[0].partitions == run.partitions)
        {
            Some(group) => group.push(run),
            None => groups.push(vec![run]),
        }
    }
    groups
        .into_iter()
        .map(|mut group| {
            group.sort_by(|a, b| a.iops.total_cmp(&b.iops));
            group[group.len() / 2].clone()
        })
        .collect()
}

fn print_ratios(medians: &[RunResult]) {
    let find = |engine: &str, workload: &str, partitions: u32| {
        medians.iter().find(|r| r.engine.starts_with(engine) && r.workload == workload && r.partitions == partitions)
    };
    for store in medians.iter().filter(|r| r.engine.starts_with("duplex-store")) {
        let (workload, p) = (store.workload.as_str(), store.partitions);
        if let Some(fio) = find("fio io_uring", workload, p).filter(|r| !r.engine.contains("fdatasync")) {
            eprint!("  {workload} {p}p: store/fio IOPS {:.0}%", 100.0 * store.iops / fio.iops);
            if let Some(synced) = find("fio io_uring +fdatasync", workload, p) {
                eprint!(", store/(fio with one fdatasync per qd writes) {:.0}%", 100.0 * store.iops / synced.iops);
            }
            eprintln!();
        }
    }
}

fn run_partitions(args: &BenchArgs, partition_count: u32, device_path: bool) -> Result<Vec<RunResult>> {
    let config = args.device.config();
    let size_bytes = (!device_path).then_some(args.size);
    let options = MkfsOptions { partitions: partition_count, size_bytes, ..MkfsOptions::default() };
    let superblock =
        duplex_store::mkfs(&args.path, &options, &config).with_context(|| format!("making {}", args.path.display()))?;
    let store = Store::open(&args.path, &config)?;
    let engine = store.partitions()[0].io_engine().to_string();
    let objects_per_partition = (args.dataset / OBJECT_SIZE / partition_count as u64).max(1);
    eprintln!(
        "bench: {partition_count} partition(s), {} objects of 4 MiB each, engine {engine}, direct I/O {}",
        objects_per_partition * partition_count as u64,
        store.device().is_direct()
    );
    let mut workers: Vec<Worker> = store
        .into_partitions()
        .into_iter()
        .map(|partition| {
            let index = partition.index();
            let keys = (0..objects_per_partition)
                .map(|n| Key::in_group(index, format!("bench.{n:08}").as_bytes()).expect("valid key"))
                .collect();
            Worker { partition, keys, rng: StdRng::seed_from_u64(index as u64 + 1) }
        })
        .collect();
    let started = Instant::now();
    workers = in_parallel(workers, |w| w.prefill())?;
    eprintln!(
        "bench: created and filled {} in {:.1} s",
        format_size(objects_per_partition * partition_count as u64 * OBJECT_SIZE),
        started.elapsed().as_secs_f64()
    );
    let mut results = Vec::new();
    for workload in &args.workloads {
        let (next, result) = measure(workers, workload, args, partition_count, &engine)?;
        workers = next;
        results.push(result);
    }
    for worker in workers {
        worker.partition.close()?;
    }
    if args.fio {
        // The pre-allocated objects sit at the start of the data region
        // (chunks are claimed lowest first); fio writes the same span raw.
        let job = crate::fio::FioJob {
            path: &args.path,
            offset: superblock.data.data_block(0) * 4096,
            len: objects_per_partition * OBJECT_SIZE,
            qd: args.qd,
            jobs: partition_count,
            seconds: args.seconds,
        };
        for workload in &args.workloads {
            results.push(crate::fio::run(&job, workload, false)?);
            if workload == "randwrite" {
                results.push(crate::fio::run(&job, workload, true)?);
            }
        }
    }
    Ok(results)
}

struct Worker {
    partition: Partition,
    keys: Vec<Key>,
    rng: StdRng,
}

impl Worker {
    fn prefill(&mut self) -> Result<()> {
        for chunk in self.keys.chunks(64) {
            let mut batch = Batch::new();
            for key in chunk {
                batch.create_preallocated(key.clone(), OBJECT_SIZE);
            }
            self.partition.apply(&batch)?;
        }
        // Write every block once so reads hit real data and the file has no holes.
        let fill = vec![0x5Au8; 1 << 20];
        for key in &self.keys {
            for mib in 0..OBJECT_SIZE >> 20 {
                let mut batch = Batch::new();
                batch.write(key.clone(), mib << 20, fill.clone());
                self.partition.apply(&batch)?;
            }
        }
        self.partition.checkpoint()?;
        Ok(())
    }

    fn random_target(&mut self) -> (usize, u64) {
        let object = self.rng.gen_range(0..self.keys.len());
        let block = self.rng.gen_range(0..BLOCKS_PER_OBJECT);
        (object, block * 4096)
    }

    /// One batch of `qd` operations; returns the ops done.
    fn step(&mut self, workload: &str, qd: usize, counter: u64) -> Result<u64> {
        if workload == "randwrite" {
            let mut batch = Batch::new();
            for i in 0..qd {
                let (object, offset) = self.random_target();
                let mut data = vec![0u8; 4096];
                data[..8].copy_from_slice(&(counter + i as u64).to_le_bytes());
                batch.write(self.keys[object].clone(), offset, data);
            }
            self.partition.apply(&batch)?;
        } else {
            let targets: Vec<(usize, u64)> = (0..qd).map(|_| self.random_target()).collect();
            let requests: Vec<ReadRequest<'_>> = targets
                .iter()
                .map(|(o, off)| ReadRequest { key: self.keys[*o].as_bytes(), offset: *off, len: 4096 })
                .collect();
            for result in self.partition.read_many(&requests) {
                result?;
            }
        }
        Ok(qd as u64)
    }
}

fn in_parallel<F>(workers: Vec<Worker>, job: F) -> Result<Vec<Worker>>
where
    F: Fn(&mut Worker) -> Result<()> + Send + Sync + Copy + 'static,
{
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            std::thread::spawn(move || -> Result<Worker> {
                job(&mut w)?;
                Ok(w)
            })
        })
        .collect();
    handles.into_iter().map(|h| h.join().map_err(|_| anyhow::anyhow!("a bench thread panicked"))?).collect()
}

fn cpu_time_us() -> f64 {
    // SAFETY: getrusage fills the zeroed struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) };
    let us = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    us(usage.ru_utime) + us(usage.ru_stime)
}

fn measure(
    workers: Vec<Worker>,
    workload: &str,
    args: &BenchArgs,
    partitions: u32,
    engine: &str,
) -> Result<(Vec<Worker>, RunResult)> {
    let device_before: u64 = workers.iter().map(|w| w.partition.stats().io.bytes_written).sum();
    let user_before: u64 = workers.iter().map(|w| w.partition.stats().user_bytes_written).sum();
    let stages_before = stage_totals(&workers);
    let ops = Arc::new(AtomicU64::new(0));
    let batches = Arc::new(AtomicU64::new(0));
    let duration = Duration::from_secs(args.seconds);
    let cpu_before = cpu_time_us();
    let started = Instant::now();
    let handles: Vec<_> = workers
        .into_iter()
        .map(|mut w| {
            let (ops, batches, workload, qd) = (ops.clone(), batches.clone(), workload.to_string(), args.qd);
            std::thread::spawn(move || -> Result<Worker> {
                let mut counter = 0u64;
                while started.elapsed() < duration {
                    let done = w.step(&workload, qd, counter)?;
                    counter += done;
                    ops.fetch_add(done, Ordering::Relaxed);
                    batches.fetch_add(1, Ordering::Relaxed);
                }
                Ok(w)
            })
        })
        .collect();
    let mut last = 0;
    while handles.iter().any(|h| !h.is_finished()) {
        std::thread::sleep(Duration::from_millis(200));
        if started.elapsed().as_millis() / 1000 != last {
            last = started.elapsed().as_millis() / 1000;
            let done = ops.load(Ordering::Relaxed);
            eprint!(
                "\r  {workload:<9} {partitions}p qd{:<3} {:>3}s  {:>10.0} IOPS",
                args.qd,
                last,
                done as f64 / started.elapsed().as_secs_f64()
            );
        }
    }
    eprintln!();
    let workers: Vec<Worker> = handles
        .into_iter()
        .map(|h| h.join().map_err(|_| anyhow::anyhow!("a bench thread panicked"))?)
        .collect::<Result<_>>()?;
    let elapsed = started.elapsed().as_secs_f64();
    let cpu_us = cpu_time_us() - cpu_before;
    let total_ops = ops.load(Ordering::Relaxed);
    let device_written = workers.iter().map(|w| w.partition.stats().io.bytes_written).sum::<u64>() - device_before;
    let user_written = workers.iter().map(|w| w.partition.stats().user_bytes_written).sum::<u64>() - user_before;
    let total_batches = batches.load(Ordering::Relaxed).max(1);
    let stages_after = stage_totals(&workers);
    let committed = (stages_after[5] - stages_before[5]).max(1) as f64;
    let per_batch = |i: usize| (stages_after[i] - stages_before[i]) as f64 / committed / 1000.0;
    let stages_us = (workload == "randwrite").then(|| StageTimes {
        plan: per_batch(0),
        record_write: per_batch(1),
        data_write: per_batch(2),
        flush: per_batch(3),
        checkpoint: per_batch(4),
    });
    let result = RunResult {
        engine: format!("duplex-store ({engine})"),
        workload: workload.to_string(),
        partitions,
        queue_depth: args.qd,
        seconds: elapsed,
        ops: total_ops,
        iops: total_ops as f64 / elapsed,
        cpu_us_per_op: cpu_us / total_ops.max(1) as f64,
        write_amplification: (user_written > 0).then(|| device_written as f64 / user_written as f64),
        device_bytes_written: device_written,
        user_bytes_written: user_written,
        avg_batch_latency_us: elapsed * 1e6 * partitions as f64 / total_batches as f64,
        stages_us,
    };
    Ok((workers, result))
}

fn print_table(results: &[RunResult]) {
    eprintln!();
    eprintln!(
        "{:<28} {:<10} {:>4} {:>4} {:>11} {:>11} {:>7} {:>13}",
        "engine", "workload", "part", "qd", "IOPS", "CPU us/op", "WAF", "batch lat us"
    );
    for r in results {
        eprintln!(
            "{:<28} {:<10} {:>4} {:>4} {:>11.0} {:>11.2} {:>7} {:>13.0}",
            r.engine,
            r.workload,
            r.partitions,
            r.queue_depth,
            r.iops,
            r.cpu_us_per_op,
            r.write_amplification.map_or("-".into(), |w| format!("{w:.3}")),
            r.avg_batch_latency_us
        );
    }
    for r in results.iter().filter(|r| r.stages_us.is_some()) {
        let t = r.stages_us.unwrap_or_default();
        eprintln!(
            "  {} {}p: per batch: plan {:.0} us, journal record {:.0} us, data {:.0} us, flush {:.0} us, checkpoint {:.0} us",
            r.workload, r.partitions, t.plan, t.record_write, t.data_write, t.flush, t.checkpoint
        );
    }
}
