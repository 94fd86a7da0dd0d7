//! `duplex daemon SOCKET …`: commands to one daemon through its admin
//! socket, on the daemon's host (`duplex_osd::admin_socket` has the
//! protocol: a JSON line each way).

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Subcommand;
use serde_json::{json, Value};

#[derive(Subcommand)]
pub enum DaemonCommand {
    /// The store's mirrored pair (docs/STORE.md, "Mirrored devices").
    #[command(subcommand)]
    Mirror(MirrorCommand),
    /// The OSD's connection policy and, for connections several threads
    /// serve (lcam, naive), the threads serving each and their lock wait
    /// (docs/OSD.md, "Connections and threads").
    Connections {
        #[arg(long)]
        json: bool,
    },
    /// The OSD's client QoS classes per priority thread: what each has
    /// queued and held by its limit, its reservation and weight, and what
    /// it was served in each phase (docs/QOS.md).
    Qos {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
pub enum MirrorCommand {
    /// Each device's health and role, dirty regions, a rebuild's progress.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Put a new device in a failed one's place; it is filled from the
    /// other in the background while the OSD serves (what the new device
    /// held is overwritten). Then update the OSD's --data to name it.
    Replace {
        /// The failed device: 0 (the first --data) or 1 (the second).
        #[arg(long)]
        device: u8,
        /// The new device (a block device or a file as large as the other).
        #[arg(long)]
        path: PathBuf,
        /// Pace of the fill, MiB a second (default: as fast as the devices go).
        #[arg(long)]
        rate_mib: Option<u64>,
        #[arg(long)]
        json: bool,
    },
}

/// Sends `request` to the daemon at `socket`; its reply, if it says ok.
pub fn ask(socket: &Path, request: &Value) -> Result<Value> {
    let mut stream = UnixStream::connect(socket).with_context(|| {
        format!("connecting to the admin socket {} (is the daemon running here?)", socket.display())
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    writeln!(stream, "{request}")?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line).context("reading the daemon's answer")?;
    let reply: Value = serde_json::from_str(line.trim()).context("the daemon's answer is not JSON")?;
    if reply["ok"] != json!(true) {
        bail!("{}", reply["error"].as_str().unwrap_or("the daemon refused without saying why"));
    }
    Ok(reply)
}

pub fn run(socket: &Path, command: DaemonCommand) -> Result<()> {
    match command {
        DaemonCommand::Mirror(MirrorCommand::Status { json }) => {
            let reply = ask(socket, &json!({ "command": "mirror status" }))?;
            print_mirror(&reply["mirror"], json)
        }
        DaemonCommand::Mirror(MirrorCommand::Replace { device, path, rate_mib, json }) => {
            let path = std::path::absolute(&path).with_context(|| format!("{}", path.display()))?;
            let request = json!({
                "command": "mirror replace",
                "device": device,
                "path": path,
                "bytes_per_sec": rate_mib.unwrap_or(0) << 20,
            });
            let reply = ask(socket, &request)?;
            if !json {
                println!("device {device} is now {}; it is being filled from the other", path.display());
            }
            print_mirror(&reply["mirror"], json)
        }
        DaemonCommand::Connections { json } => {
            let reply = ask(socket, &json!({ "command": "connections" }))?;
            print_connections(&reply, json)
        }
        DaemonCommand::Qos { json } => {
            let reply = ask(socket, &json!({ "command": "qos" }))?;
            print_qos(&reply, json)
        }
    }
}

fn print_qos(reply: &Value, json: bool) -> Result<()> {
    if json {
        let shown = json!({
            "on": reply["on"],
            "background": reply["background"],
            "threads": reply["threads"],
            "scheduled_total": reply["scheduled_total"],
            "held_by_limiter_total": reply["held_by_limiter_total"],
        });
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(());
    }
    let on = reply["on"].as_bool().unwrap_or(false);
    println!(
        "client QoS {} ({} operations scheduled, {} held by a limit, since start)",
        if on { "on: some pool or image has a setting" } else { "off: no pool or image has a setting" },
        reply["scheduled_total"],
        reply["held_by_limiter_total"]
    );
    // (A JSON value's Display ignores widths: numbers become strings first.)
    let number = |value: &Value| value.as_f64().map_or("-".to_string(), |n| format!("{n}"));
    let background = reply["background"].as_array().cloned().unwrap_or_default();
    if !background.is_empty() {
        println!("background work, behind client work at each flusher (device scheduler):");
        println!(
            "  {:<10} {:>7} {:>10} {:>12} {:>11} {:>7} {:>10}",
            "class", "queued", "served", "cost", "reservation", "weight", "limit"
        );
        for class in &background {
            let limit =
                class["limit"]
                    .as_f64()
                    .map_or("-".to_string(), |l| if l == 0.0 { "none".into() } else { format!("{l}") });
            println!(
                "  {:<10} {:>7} {:>10} {:>12} {:>11} {:>7} {:>10}",
                class["class"].as_str().unwrap_or("?"),
                number(&class["queued"]),
                number(&class["served"]),
                number(&class["cost"]),
                number(&class["reservation"]),
                number(&class["weight"]),
                limit
            );
        }
        println!("  (cost, reservation and limit in 4 KiB units, a second for the rates; served since start)");
    }
    let threads = reply["threads"].as_array().cloned().unwrap_or_default();
    if threads.is_empty() {
        return Ok(());
    }
    println!(
        "{:>6}  {:<28} {:>7} {:>6} {:>11} {:>7} {:>12} {:>12}",
        "thread", "class", "queued", "held", "reservation", "weight", "served (R)", "served (W)"
    );
    for thread in &threads {
        for class in thread["classes"].as_array().cloned().unwrap_or_default() {
            println!(
                "{:>6}  {:<28} {:>7} {:>6} {:>11} {:>7} {:>12} {:>12}",
                number(&thread["thread"]),
                class["class"].as_str().unwrap_or("?"),
                number(&class["queued"]),
                number(&class["held"]),
                number(&class["reservation"]),
                number(&class["weight"]),
                number(&class["served_reservation"]),
                number(&class["served_weight"])
            );
        }
    }
    println!("(reservation in 4 KiB operations a second at each thread; served since the class was last met after 10 s idle)");
    Ok(())
}

fn print_connections(reply: &Value, json: bool) -> Result<()> {
    if json {
        let shown = json!({ "policy": reply["policy"], "connections": reply["connections"] });
        println!("{}", serde_json::to_string_pretty(&shown)?);
        return Ok(());
    }
    let policy = reply["policy"].as_str().unwrap_or("?");
    let conns = reply["connections"].as_array().cloned().unwrap_or_default();
    println!("connection policy {policy}");
    if policy == "pinned" {
        println!("each connection is served by one thread; none is shared");
        return Ok(());
    }
    println!(
        "{:>6}  {:<22} {:<10} {:>14} {:>12} {:>16}",
        "token", "peer", "threads", "lock wait µs", "bytes", "total wait µs"
    );
    for conn in &conns {
        let threads: Vec<String> =
            conn["workers"].as_array().map(|w| w.iter().map(|t| t.to_string()).collect()).unwrap_or_default();
        println!(
            "{:>6}  {:<22} {:<10} {:>14} {:>12} {:>16}",
            conn["token"],
            conn["peer"].as_str().unwrap_or("-"),
            threads.join(","),
            conn["lock_wait_us"],
            conn["bytes"],
            conn["total_lock_wait_us"]
        );
    }
    println!("(over the last placement interval; totals since each was accepted)");
    Ok(())
}

fn print_mirror(status: &Value, json: bool) -> Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(status)?);
        return Ok(());
    }
    println!("mode {}  flush device {}", status["mode"].as_str().unwrap_or("?"), status["flush_slot"]);
    for slot in 0..2 {
        println!(
            "device {slot}: {}  {}",
            status["health"][slot].as_str().unwrap_or("?"),
            status["paths"][slot].as_str().unwrap_or("?")
        );
    }
    let region_mib = status["region_bytes"].as_u64().unwrap_or(0) as f64 / (1 << 20) as f64;
    println!("dirty regions {} of {region_mib} MiB", status["dirty_regions"]);
    if let Some(rebuild) = status["rebuild"].as_object() {
        let (done, all) = (rebuild["regions_copied"].as_u64().unwrap_or(0), rebuild["regions"].as_u64().unwrap_or(1));
        println!(
            "rebuilding device {}: {done} of {all} regions ({:.1}%)",
            rebuild["device"],
            100.0 * done as f64 / all.max(1) as f64
        );
    }
    Ok(())
}
