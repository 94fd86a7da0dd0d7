//! The verifying workload of the fault tests: stamped 4 KiB blocks written
//! and read at random through an image, every operation recorded with its
//! times, then a final read of every block; `duplex_verify::check` judges
//! the history (no acknowledged write lost, no read back in time).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_client::Image;
use duplex_verify::{History, Outcome, Recorder, Stamp};
use rand::{Rng, SeedableRng};

pub const BLOCK: u64 = 4096;

pub struct Counters {
    pub acknowledged: AtomicU64,
    pub failed: AtomicU64,
    pub reads: AtomicU64,
}

/// Random stamped writes (and 1 in 5 reads) over `blocks`, `in_flight`
/// at a time, until `stop`. Failed writes are recorded as unknown outcomes.
pub fn run(
    image: &Arc<Image>,
    recorder: &Arc<Recorder>,
    writer: u32,
    blocks: &[u64],
    in_flight: usize,
    stop: &AtomicBool,
    counters: &Arc<Counters>,
) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(writer as u64);
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let mut outstanding = 0;
    let mut seq = 0u64;
    while !stop.load(Ordering::Relaxed) {
        while outstanding < in_flight {
            let block = blocks[rng.gen_range(0..blocks.len())];
            let ticket = recorder.invoke();
            let (recorder, counters, done) = (Arc::clone(recorder), Arc::clone(counters), done_tx.clone());
            if rng.gen_ratio(1, 5) {
                image.read_async(
                    block * BLOCK,
                    BLOCK as u32,
                    Box::new(move |result| {
                        if let Ok(data) = result {
                            recorder.read_done(ticket, block, &data, false);
                            counters.reads.fetch_add(1, Ordering::Relaxed);
                        }
                        let _ = done.send(());
                    }),
                );
            } else {
                seq += 1;
                let stamp = Stamp { writer, seq, block };
                image.write_async(
                    block * BLOCK,
                    Bytes::from(stamp.encode(BLOCK as usize)),
                    Box::new(move |result| {
                        let outcome = if result.is_ok() { Outcome::Acknowledged } else { Outcome::Unknown };
                        recorder.write_done(ticket, stamp, outcome);
                        let counter = if result.is_ok() { &counters.acknowledged } else { &counters.failed };
                        counter.fetch_add(1, Ordering::Relaxed);
                        let _ = done.send(());
                    }),
                );
            }
            outstanding += 1;
        }
        if done_rx.recv().is_ok() {
            outstanding -= 1;
        }
    }
    while outstanding > 0 && done_rx.recv().is_ok() {
        outstanding -= 1;
    }
}

/// Reads every block once more (the final check) and returns the history.
pub fn finish(image: &Image, recorder: &Recorder, blocks: u64) -> History {
    for block in 0..blocks {
        let ticket = recorder.invoke();
        let data =
            image.read(block * BLOCK, BLOCK as u32).unwrap_or_else(|e| panic!("final read of block {block}: {e}"));
        recorder.read_done(ticket, block, &data, true);
    }
    recorder.history()
}

/// The verifying workload on a new image of a dev cluster (a 64 MiB one
/// has 16 objects, over PGs whose primaries are all three OSDs), 16
/// writes in flight, with what the fault tests ask of it.
pub struct Verifying {
    image: Arc<duplex_client::Image>,
    pub recorder: Arc<duplex_verify::Recorder>,
    pub counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
    worker: Option<std::thread::JoinHandle<()>>,
    pub blocks: u64,
}

impl Verifying {
    /// Creates image `name` of `size` bytes in pool `rbd` and starts writing.
    pub fn start(client: &duplex_client::Client, name: &str, size: u64) -> Verifying {
        Verifying::start_with(client, name, size, duplex_client::CreateOptions::default())
    }

    /// As [`Verifying::start`], the image created with `options` (a data pool).
    pub fn start_with(
        client: &duplex_client::Client,
        name: &str,
        size: u64,
        options: duplex_client::CreateOptions,
    ) -> Verifying {
        Verifying::start_in(client, "rbd", name, size, options)
    }

    /// As [`Verifying::start_with`], the image in pool `pool`.
    pub fn start_in(
        client: &duplex_client::Client,
        pool: &str,
        name: &str,
        size: u64,
        options: duplex_client::CreateOptions,
    ) -> Verifying {
        Verifying::start_where(client, pool, name, size, options, |_, _| true)
    }

    /// As [`Verifying::start_in`], writing and reading only the blocks
    /// `keep(image, block)` keeps (the final pass reads every block).
    pub fn start_where(
        client: &duplex_client::Client,
        pool: &str,
        name: &str,
        size: u64,
        options: duplex_client::CreateOptions,
        keep: impl Fn(&duplex_client::ImageInfo, u64) -> bool,
    ) -> Verifying {
        let pool = client.pool_id(pool).unwrap();
        client.create_image(pool, name, size, options).unwrap();
        let image = Arc::new(client.open_image(pool, name).unwrap());
        let recorder = Arc::new(duplex_verify::Recorder::new());
        let counters =
            Arc::new(Counters { acknowledged: AtomicU64::new(0), failed: AtomicU64::new(0), reads: AtomicU64::new(0) });
        let stop = Arc::new(AtomicBool::new(false));
        let blocks = size / BLOCK;
        let kept: Vec<u64> = (0..blocks).filter(|block| keep(image.info(), *block)).collect();
        assert!(!kept.is_empty(), "no block to write");
        let worker = {
            let (image, recorder, stop, counters) = (image.clone(), recorder.clone(), stop.clone(), counters.clone());
            std::thread::spawn(move || run(&image, &recorder, 1, &kept, 16, &stop, &counters))
        };
        Verifying { image, recorder, counters, stop, worker: Some(worker), blocks }
    }

    pub fn acknowledged(&self) -> u64 {
        self.counters.acknowledged.load(Ordering::Relaxed)
    }

    /// Waits until 200 more writes are acknowledged than now; how long that took.
    pub fn wait_for_progress(&self, what: &str) -> Duration {
        let (from, started) = (self.acknowledged(), Instant::now());
        while self.acknowledged() < from + 200 {
            if started.elapsed() > Duration::from_secs(90) {
                self.stop.store(true, Ordering::Relaxed);
                panic!(
                    "I/O did not go on within 90 s {what} ({} writes acknowledged, {} failed in all)",
                    self.acknowledged(),
                    self.counters.failed.load(Ordering::Relaxed)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        started.elapsed()
    }

    /// The longest a write has waited so far for its acknowledgement (or
    /// for its failure, a timeout). A write to a PG whose primary died waits
    /// for the failover, while the other writers go on.
    pub fn longest_write_wait(&self) -> Duration {
        let longest = (self.recorder.history().ops.iter())
            .filter_map(|op| match op {
                duplex_verify::BlockOp::Write { invoked, completed: Some(at), .. } => Some(at - invoked),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        Duration::from_nanos(longest)
    }

    /// The longest any write waited before `at` (on the history's clock),
    /// and the longest any waited after it: a write in flight at `at` counts
    /// in both, with the part of its wait on each side.
    pub fn longest_write_waits_around(&self, at: u64) -> (Duration, Duration) {
        let (mut before, mut after) = (0, 0);
        for op in self.recorder.history().ops {
            if let duplex_verify::BlockOp::Write { invoked, completed: Some(done), .. } = op {
                if invoked < at {
                    before = before.max(done.min(at) - invoked);
                }
                if done > at {
                    after = after.max(done - invoked.max(at));
                }
            }
        }
        (Duration::from_nanos(before), Duration::from_nanos(after))
    }

    /// Stops the workload and reads every block: the whole history.
    pub fn history(mut self) -> History {
        self.stop.store(true, Ordering::Relaxed);
        self.worker.take().unwrap().join().expect("the workload ends");
        finish(&self.image, &self.recorder, self.blocks)
    }

    /// Stops the workload, reads every block, and judges the whole history.
    pub fn finish(self) -> duplex_verify::Report {
        duplex_verify::check(&self.history())
    }
}
