//! `duplex bench`: load on an image or on objects, with a progress bar and
//! a results table (or JSON).

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use bytes::Bytes;
use duplex_client::{Client, ClientError, Image, ObjectOp};
use duplex_proto::osd::OpKind;
use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use rand::{Rng, SeedableRng};

use duplex_store::units::format_size;

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Random writes.
    Randwrite,
    /// Random reads.
    Randread,
    /// Random reads and writes (--read-percent of them reads).
    Randrw,
    /// Sequential writes.
    Seqwrite,
    /// Sequential reads.
    Seqread,
}

#[derive(Clone, Debug, clap::Args)]
pub struct BenchArgs {
    /// Benchmark this image, or IMAGE@SNAP (reads only; else objects named bench.N in the pool).
    #[arg(long)]
    pub image: Option<String>,
    #[arg(long, value_enum, default_value_t = Pattern::Randwrite)]
    pub pattern: Pattern,
    /// Bytes per I/O.
    #[arg(long = "bs", default_value = "4k", value_parser = duplex_store::units::parse_size)]
    pub block_size: u64,
    /// I/Os in flight.
    #[arg(long = "qd", default_value_t = 32)]
    pub queue_depth: usize,
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub seconds: u64,
    /// Reads among I/Os with --pattern randrw (percent).
    #[arg(long, default_value_t = 70)]
    pub read_percent: u8,
    /// Object-level: how many objects (of 4 MiB) the I/O spreads over.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub objects: u64,
    /// Print the result as JSON (no progress bar).
    #[arg(long)]
    pub json: bool,
    /// Open loop: start this many I/Os a second on a fixed schedule (at
    /// most --qd in flight), each I/O's latency counted from when it was
    /// due, so time spent waiting for a slot counts too. 0: closed loop,
    /// --qd I/Os always in flight.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u64).range(0..=10_000_000))]
    pub rate: u64,
    /// Also print, each second, that second's IOPS and latency as one line
    /// of JSON on standard error (`unix_ms` is the second's end), with its
    /// latencies (`[µs, count]` pairs) for merging seconds into a window.
    #[arg(long)]
    pub intervals: bool,
}

#[derive(Debug, serde::Serialize)]
pub struct BenchResult {
    pub target: String,
    pub pattern: Pattern,
    pub block_size: u64,
    pub queue_depth: usize,
    pub seconds: f64,
    pub ops: u64,
    pub reads: u64,
    pub writes: u64,
    pub errors: u64,
    pub iops: f64,
    pub mib_per_second: f64,
    pub latency_us: Latency,
    /// The first error seen, if any.
    pub first_error: Option<String>,
}

#[derive(Debug, serde::Serialize)]
pub struct Latency {
    pub mean: f64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// What the load runs against: an image, or objects of a pool.
enum Target {
    Image(Arc<Image>),
    Objects { client: Client, pool: u32, objects: u64 },
}

const OBJECT_SPAN: u64 = 4 << 20;

impl Target {
    fn span(&self) -> u64 {
        match self {
            Target::Image(image) => image.size(),
            Target::Objects { objects, .. } => objects * OBJECT_SPAN,
        }
    }

    fn start(
        &self,
        read: bool,
        offset: u64,
        len: u64,
        data: &Bytes,
        done: Box<dyn FnOnce(Result<(), ClientError>) + Send>,
    ) {
        match self {
            Target::Image(image) if read => image.read_async(offset, len as u32, Box::new(move |r| done(r.map(drop)))),
            Target::Image(image) => image.write_async(offset, data.clone(), done),
            Target::Objects { client, pool, .. } => {
                let kind = if read { OpKind::Read } else { OpKind::Write };
                let op = ObjectOp {
                    offset: offset % OBJECT_SPAN,
                    length: if read { len as u32 } else { 0 },
                    data: if read { Bytes::new() } else { data.clone() },
                    ..ObjectOp::new(*pool, kind, Bytes::from(format!("bench.{}", offset / OBJECT_SPAN)))
                };
                client.submit(
                    op,
                    Box::new(move |r| {
                        done(match r {
                            // A never-written object reads as nothing: not an error here.
                            Err(ClientError::NotFound) => Ok(()),
                            other => other.map(drop),
                        })
                    }),
                )
            }
        }
    }
}

pub fn run(client: &Client, pool_name: &str, args: &BenchArgs) -> Result<BenchResult> {
    let pool = client.pool_id(pool_name)?;
    let (target, label) = match &args.image {
        // IMAGE@SNAP: a snapshot, for the read patterns.
        Some(name) => (Target::Image(Arc::new(client.open_spec(pool, name)?)), format!("image {pool_name}/{name}")),
        None => (
            Target::Objects { client: client.clone(), pool, objects: args.objects.max(1) },
            format!("{} objects in pool {pool_name}", args.objects.max(1)),
        ),
    };
    let block = args.block_size;
    if block == 0 || block > duplex_proto::osd::MAX_IO_BYTES as u64 {
        bail!("--bs must be between 1 byte and {}", format_size(duplex_proto::osd::MAX_IO_BYTES as u64));
    }
    let blocks = target.span() / block;
    if blocks == 0 {
        bail!("the target ({}) is smaller than one block", format_size(target.span()));
    }
    let queue_depth = args.queue_depth.max(1);
    let duration = Duration::from_secs(args.seconds.max(1));
    let data = Bytes::from((0..block).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>());
    let mut rng = rand::rngs::StdRng::from_entropy();
    let (tx, rx) = crossbeam_channel::unbounded::<(bool, Instant, Result<(), ClientError>)>();
    let progress = if args.json {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(duration.as_secs());
        bar.set_style(
            ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {pos}/{len} s  {msg}")
                .expect("static template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("{:?} {} QD{queue_depth}", args.pattern, format_size(block)).to_lowercase());
        bar
    };
    let mut latency = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).expect("static bounds");
    let mut second = latency.clone();
    let (mut ops, mut reads, mut writes, mut errors, mut in_flight) = (0u64, 0u64, 0u64, 0u64, 0usize);
    let mut first_error = None;
    let mut sequential = 0u64;
    let started = Instant::now();
    let deadline = started + duration;
    let (mut last_report, mut ops_at_report) = (started, 0u64);
    let mut next_interval = started + Duration::from_secs(1);
    let reporter = args.intervals.then(IntervalReporter::start);
    // Open loop: the I/Os started so far, and when the next one is due.
    let mut scheduled = 0u64;
    let due = |n: u64| started + Duration::from_secs_f64(n as f64 / args.rate as f64);
    loop {
        let now = Instant::now();
        while now < deadline && in_flight < queue_depth {
            let issued = if args.rate == 0 {
                now
            } else {
                let at = due(scheduled);
                if at > now || at >= deadline {
                    break;
                }
                scheduled += 1;
                at
            };
            let read = match args.pattern {
                Pattern::Randread | Pattern::Seqread => true,
                Pattern::Randwrite | Pattern::Seqwrite => false,
                Pattern::Randrw => rng.gen_range(0..100) < args.read_percent as u32,
            };
            let index = match args.pattern {
                Pattern::Seqread | Pattern::Seqwrite => {
                    sequential = (sequential + 1) % blocks;
                    sequential
                }
                _ => rng.gen_range(0..blocks),
            };
            let tx = tx.clone();
            target.start(
                read,
                index * block,
                block,
                &data,
                Box::new(move |r| {
                    let _ = tx.send((read, issued, r));
                }),
            );
            in_flight += 1;
        }
        let open_loop_due = (args.rate > 0 && now < deadline).then(|| due(scheduled)).filter(|at| *at < deadline);
        if in_flight == 0 && open_loop_due.is_none() {
            break;
        }
        // Wait for a completion, or (open loop, a slot free) the next due I/O.
        let wait = match open_loop_due {
            Some(at) if in_flight < queue_depth => at.saturating_duration_since(Instant::now()),
            _ => Duration::from_secs(60),
        };
        let completion = match rx.recv_timeout(wait) {
            Ok(completion) => Some(completion),
            Err(_) if wait < Duration::from_secs(60) => None,
            Err(_) => bail!("no I/O completed for 60 s"),
        };
        if let Some((read, issued, result)) = completion {
            in_flight -= 1;
            match result {
                Ok(()) => {
                    ops += 1;
                    if read {
                        reads += 1;
                    } else {
                        writes += 1;
                    }
                    let micros = issued.elapsed().as_micros().max(1) as u64;
                    let _ = latency.record(micros);
                    let _ = second.record(micros);
                }
                Err(err) => {
                    errors += 1;
                    first_error.get_or_insert_with(|| err.to_string());
                }
            }
        }
        let now = Instant::now();
        if now >= next_interval {
            if let Some(reporter) = &reporter {
                let unix_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64);
                let fresh = reporter.spare.try_recv().unwrap_or_else(|_| Histogram::new_from(&latency));
                let _ = reporter.seconds.send((unix_ms, std::mem::replace(&mut second, fresh), errors));
            }
            next_interval += Duration::from_secs(1);
        }
        if now.duration_since(last_report) >= Duration::from_millis(250) {
            let rate = (ops - ops_at_report) as f64 / now.duration_since(last_report).as_secs_f64();
            progress.set_position(now.duration_since(started).as_secs().min(duration.as_secs()));
            progress.set_message(format!("{rate:>8.0} IOPS  {errors} errors"));
            (last_report, ops_at_report) = (now, ops);
        }
    }
    let seconds = started.elapsed().as_secs_f64().max(1e-9);
    if let Some(reporter) = reporter {
        reporter.finish();
    }
    progress.finish_and_clear();
    Ok(BenchResult {
        target: label,
        pattern: args.pattern,
        block_size: block,
        queue_depth,
        seconds,
        ops,
        reads,
        writes,
        errors,
        iops: ops as f64 / seconds,
        mib_per_second: (ops * block) as f64 / seconds / (1 << 20) as f64,
        latency_us: Latency {
            mean: latency.mean(),
            p50: latency.value_at_quantile(0.5),
            p99: latency.value_at_quantile(0.99),
            p999: latency.value_at_quantile(0.999),
            max: latency.max(),
        },
        first_error,
    })
}

/// `--intervals`: each second's histogram is printed by a thread of its
/// own. Printed from the I/O loop, the JSON of a second's latencies (more
/// distinct values, the more they spread) held the loop for milliseconds
/// once a second, and the open-loop I/Os due meanwhile counted the pause:
/// a tail the cluster never had, larger while it recovered.
struct IntervalReporter {
    seconds: crossbeam_channel::Sender<(u64, Histogram<u64>, u64)>,
    /// Histograms printed and reset, handed back for the next second.
    spare: crossbeam_channel::Receiver<Histogram<u64>>,
    thread: std::thread::JoinHandle<()>,
}

impl IntervalReporter {
    fn start() -> IntervalReporter {
        // Bounded: a reader that stopped reading (a full stderr pipe) holds
        // the loop back after a few seconds, instead of a histogram a second
        // piling up in memory.
        let (seconds, to_print) = crossbeam_channel::bounded::<(u64, Histogram<u64>, u64)>(4);
        let (give_back, spare) = crossbeam_channel::unbounded();
        let thread = std::thread::Builder::new()
            .name("duplex-intervals".into())
            .spawn(move || {
                // Last in line for a CPU: on a machine of two, even this
                // thread's milliseconds a second showed in the OSDs' tail.
                // SAFETY: setpriority on this thread's own id touches no memory.
                unsafe {
                    libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
                }
                for (unix_ms, mut second, errors) in to_print {
                    eprintln!("{}", interval_json(unix_ms, &second, errors));
                    second.reset();
                    let _ = give_back.send(second);
                }
            })
            .expect("a thread for --intervals");
        IntervalReporter { seconds, spare, thread }
    }

    /// Prints what is left and waits for it.
    fn finish(self) {
        drop(self.seconds);
        let _ = self.thread.join();
    }
}

/// One second of `--intervals`: its ops, percentiles and errors so far,
/// and `latencies`, [µs, count] per recorded value (3 significant digits),
/// so that windows merge into exact percentiles. Written by hand: a JSON
/// value per pair cost milliseconds a second.
fn interval_json(unix_ms: u64, second: &Histogram<u64>, errors: u64) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(4096);
    let _ = write!(
        out,
        r#"{{"unix_ms":{unix_ms},"ops":{},"p50_us":{},"p99_us":{},"max_us":{},"errors":{errors},"latencies":["#,
        second.len(),
        second.value_at_quantile(0.5),
        second.value_at_quantile(0.99),
        second.max(),
    );
    for (i, value) in second.iter_recorded().enumerate() {
        let comma = if i == 0 { "" } else { "," };
        let _ = write!(out, "{comma}[{},{}]", value.value_iterated_to(), value.count_at_value());
    }
    out.push_str("]}");
    out
}

pub fn print_table(results: &[BenchResult]) {
    println!(
        "{:<10} {:>6} {:>4} {:>10} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7}",
        "pattern", "bs", "qd", "IOPS", "MiB/s", "mean µs", "p50 µs", "p99 µs", "p99.9 µs", "errors"
    );
    for r in results {
        println!(
            "{:<10} {:>6} {:>4} {:>10.0} {:>9.1} {:>9.0} {:>9} {:>9} {:>9} {:>7}",
            format!("{:?}", r.pattern).to_lowercase(),
            format_size(r.block_size).replace(".0 ", "").replace(' ', ""),
            r.queue_depth,
            r.iops,
            r.mib_per_second,
            r.latency_us.mean,
            r.latency_us.p50,
            r.latency_us.p99,
            r.latency_us.p999,
            r.errors
        );
    }
    for r in results {
        if let Some(err) = &r.first_error {
            println!("first error ({:?}): {err}", r.pattern);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_line_is_json_whose_latencies_add_up_to_the_seconds_ops() {
        let mut second = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
        for micros in [90, 90, 250, 1_000, 12_345, 12_345, 12_346] {
            second.record(micros).unwrap();
        }
        let line: serde_json::Value = serde_json::from_str(&interval_json(1_700_000_000_000, &second, 2)).unwrap();
        assert_eq!(line["unix_ms"], 1_700_000_000_000u64);
        assert_eq!(line["ops"], 7);
        assert_eq!(line["errors"], 2);
        assert_eq!(line["p50_us"], second.value_at_quantile(0.5));
        let pairs: Vec<(u64, u64)> = line["latencies"]
            .as_array()
            .unwrap()
            .iter()
            .map(|pair| (pair[0].as_u64().unwrap(), pair[1].as_u64().unwrap()))
            .collect();
        assert_eq!(pairs.iter().map(|(_, count)| count).sum::<u64>(), 7);
        assert_eq!(pairs.first(), Some(&(90, 2)));
        assert!(pairs.iter().all(|(value, _)| second.equivalent(*value, second.highest_equivalent(*value))));
        let empty = Histogram::<u64>::new_from(&second);
        let line: serde_json::Value = serde_json::from_str(&interval_json(1, &empty, 0)).unwrap();
        assert_eq!(line["latencies"], serde_json::json!([]));
    }
}
