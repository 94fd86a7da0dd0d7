//! What one benchmark run measured, whoever ran it: the store (`bench.rs`)
//! or fio (`fio.rs`).

use serde::Serialize;

#[derive(Serialize, Clone, Debug)]
pub struct RunResult {
    pub engine: String,
    pub workload: String,
    pub partitions: u32,
    pub queue_depth: usize,
    pub seconds: f64,
    pub ops: u64,
    pub iops: f64,
    pub cpu_us_per_op: f64,
    /// Device bytes written ÷ user bytes written (writes only).
    pub write_amplification: Option<f64>,
    pub device_bytes_written: u64,
    pub user_bytes_written: u64,
    pub avg_batch_latency_us: f64,
    /// Writes only: mean time per batch in each commit stage (µs).
    pub stages_us: Option<StageTimes>,
}

#[derive(Serialize, Clone, Copy, Debug, Default)]
pub struct StageTimes {
    pub plan: f64,
    pub record_write: f64,
    pub data_write: f64,
    pub flush: f64,
    pub checkpoint: f64,
}
