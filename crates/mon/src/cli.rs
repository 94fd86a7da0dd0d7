//! The `duplex-mon` command line: flags and start-up (also `duplex mon`).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Parser;

use crate::daemon::{run as run_daemon, MonConfig};
use duplex_mon_client::Credentials;

#[derive(Parser)]
#[command(name = "duplex-mon", version, about = "One monitor of a Duplex cluster (Raft-replicated cluster map)")]
pub struct MonArgs {
    /// This monitor's id (one of the --peer ids).
    #[arg(long)]
    id: u64,
    /// Every monitor of the cluster, this one included: ID=IP:PORT (repeat).
    #[arg(long = "peer", required = true)]
    peers: Vec<String>,
    /// Where the Raft log and hard state live.
    #[arg(long)]
    data_dir: PathBuf,
    /// The cluster fsid: 32 hex digits.
    #[arg(long)]
    fsid: String,
    /// File holding the shared cluster secret.
    #[arg(long)]
    secret_file: PathBuf,
    /// An OSD silent for longer than this is marked down.
    #[arg(long, default_value_t = 6000)]
    osd_grace_ms: u64,
    /// A down OSD is marked out after this long.
    #[arg(long, default_value_t = 600_000)]
    down_out_interval_ms: u64,
}

/// Runs a monitor until it is killed.
pub fn run(args: MonArgs) -> Result<()> {
    let mut peers = BTreeMap::new();
    for peer in &args.peers {
        let (id, addr) = peer.split_once('=').with_context(|| format!("--peer {peer}: expected ID=IP:PORT"))?;
        let id: u64 = id.parse().with_context(|| format!("--peer {peer}: bad id"))?;
        let addr: SocketAddr = addr.parse().with_context(|| format!("--peer {peer}: bad address"))?;
        peers.insert(id, addr);
    }
    let fsid = duplex_proto::parse_fsid(&args.fsid).context("--fsid must be 32 hex digits")?;
    let secret = std::fs::read(&args.secret_file).with_context(|| format!("reading {}", args.secret_file.display()))?;
    if secret.len() < 16 {
        bail!("the cluster secret must be at least 16 bytes");
    }
    let credentials = Credentials { fsid, secret, name: format!("mon.{}", args.id) };
    let failure = duplex_map::FailureConfig {
        grace_ms: args.osd_grace_ms,
        down_out_interval_ms: args.down_out_interval_ms,
        ..Default::default()
    };
    run_daemon(MonConfig { id: args.id, peers, data_dir: args.data_dir, credentials, failure })
}
