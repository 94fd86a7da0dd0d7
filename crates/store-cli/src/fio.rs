//! Runs fio on the store's file region with the same block size, queue
//! depth and job count, and reads its JSON output.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};

use crate::result::RunResult;

/// A file region and the load to put on it, matching a store run.
pub struct FioJob<'a> {
    pub path: &'a Path,
    pub offset: u64,
    pub len: u64,
    pub qd: usize,
    pub jobs: u32,
    pub seconds: u64,
}

/// Runs `workload`; with `fdatasync`, one flush per `qd` writes, as a store batch does.
pub fn run(job: &FioJob<'_>, workload: &str, fdatasync: bool) -> Result<RunResult> {
    let FioJob { path, offset, len, qd, jobs, seconds } = *job;
    let mut command = Command::new("fio");
    command.args([
        "--name=raw",
        "--ioengine=io_uring",
        "--direct=1",
        "--bs=4k",
        "--randrepeat=0",
        "--time_based",
        "--group_reporting",
        "--output-format=json",
        "--norandommap",
    ]);
    command.arg(format!("--filename={}", path.display()));
    command.arg(format!("--rw={workload}"));
    command.arg(format!("--iodepth={qd}"));
    command.arg(format!("--numjobs={jobs}"));
    command.arg(format!("--offset={offset}"));
    command.arg(format!("--size={len}"));
    command.arg(format!("--runtime={seconds}"));
    if fdatasync {
        // One flush per queue depth of writes: what a store batch does.
        command.arg(format!("--fdatasync={qd}"));
    }
    eprintln!("  fio {workload} {jobs} job(s) qd{qd}{}", if fdatasync { " fdatasync every qd" } else { "" });
    let output = command.output().context("running fio (install it: apt-get install fio)")?;
    if !output.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&output.stderr));
    }
    let json: serde_json::Value = serde_json::from_slice(&output.stdout).context("parsing fio's JSON output")?;
    let report = &json["jobs"][0];
    let side = if workload == "randwrite" { &report["write"] } else { &report["read"] };
    let iops = side["iops"].as_f64().context("fio output without iops")?;
    let runtime_s = side["runtime"].as_f64().unwrap_or(seconds as f64 * 1000.0) / 1000.0;
    let ops = side["total_ios"].as_u64().unwrap_or((iops * runtime_s) as u64);
    // fio's usr_cpu/sys_cpu are percentages of one CPU over the run, per job.
    let cpu_fraction = (report["usr_cpu"].as_f64().unwrap_or(0.0) + report["sys_cpu"].as_f64().unwrap_or(0.0)) / 100.0;
    let lat_us = side["clat_ns"]["mean"].as_f64().unwrap_or(0.0) / 1000.0;
    Ok(RunResult {
        engine: if fdatasync { "fio io_uring +fdatasync/qd".into() } else { "fio io_uring".into() },
        workload: workload.to_string(),
        partitions: jobs,
        queue_depth: qd,
        seconds: runtime_s,
        ops,
        iops,
        cpu_us_per_op: cpu_fraction * runtime_s * jobs as f64 * 1e6 / ops.max(1) as f64,
        write_amplification: None,
        device_bytes_written: 0,
        user_bytes_written: 0,
        avg_batch_latency_us: lat_us,
        stages_us: None,
    })
}
