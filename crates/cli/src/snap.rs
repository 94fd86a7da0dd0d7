//! `duplex snap ...`: an image's snapshots (names as `rbd snap`).

use anyhow::{bail, Context, Result};
use duplex_client::Client;
use duplex_store::units::format_size;

#[derive(Debug, clap::Subcommand)]
pub enum SnapCommand {
    /// Take a snapshot of an image: IMAGE@SNAP. Returns once every
    /// gateway writing the image has adopted it (crash-consistent).
    Create { spec: String },
    /// List an image's snapshots, oldest first.
    List {
        image: String,
        #[arg(long)]
        json: bool,
    },
    /// Remove a snapshot (IMAGE@SNAP) and free what only it held.
    Remove { spec: String },
    /// Remove every unprotected snapshot of an image.
    Purge { image: String },
    /// Make the image what it was at IMAGE@SNAP (the image must not be
    /// served: stop its NBD server first).
    Rollback { spec: String },
    /// Protect a snapshot from removal (clones need it).
    Protect { spec: String },
    /// Lift a snapshot's protection (refused while clones read from it).
    Unprotect { spec: String },
    /// The clones of IMAGE@SNAP.
    Children { spec: String },
}

/// `IMAGE@SNAP`, split.
pub fn split_spec(spec: &str) -> Result<(&str, &str)> {
    match spec.split_once('@') {
        Some((image, snap)) if !image.is_empty() && !snap.is_empty() => Ok((image, snap)),
        _ => bail!("expected IMAGE@SNAP, got '{spec}'"),
    }
}

pub fn snap(client: &Client, pool_name: &str, command: SnapCommand) -> Result<()> {
    let pool = client.pool_id(pool_name)?;
    match command {
        SnapCommand::Create { spec } => {
            let (image, name) = split_spec(&spec)?;
            let started = std::time::Instant::now();
            let (snap, quiesced) = client.create_snapshot(pool, image, name)?;
            println!(
                "created snapshot '{image}@{name}' (id {}, {}) in {:.1?}; {} writer(s) adopted it{}",
                snap.id,
                format_size(snap.size),
                started.elapsed(),
                quiesced.acknowledged,
                if quiesced.dropped > 0 {
                    format!(", {} that stopped renewing were dropped", quiesced.dropped)
                } else {
                    String::new()
                }
            );
        }
        SnapCommand::List { image, json } => {
            let snaps = client.list_snapshots(pool, &image)?;
            if json {
                println!("{}", serde_json::to_string_pretty(&snaps)?);
            } else if snaps.is_empty() {
                println!("image '{image}' has no snapshots");
            } else {
                println!("{:>6}  {:<24} {:>10}  {:<9} created", "id", "name", "size", "protected");
                for snap in snaps {
                    println!(
                        "{:>6}  {:<24} {:>10}  {:<9} {}",
                        snap.id,
                        snap.name,
                        format_size(snap.size),
                        if snap.protected { "yes" } else { "no" },
                        crate::progress::format_time(snap.created)
                    );
                }
            }
        }
        SnapCommand::Remove { spec } => {
            let (image, name) = split_spec(&spec)?;
            let bar = crate::progress::bar("trimming");
            let background = client.remove_snapshot(pool, image, name, &mut |done, all| bar.update(done, all))?;
            bar.finish();
            println!("removed snapshot '{image}@{name}'{}", trimmed(background));
        }
        SnapCommand::Purge { image } => {
            let snaps = client.list_snapshots(pool, &image)?;
            let (mut removed, mut background) = (0, true);
            for snap in snaps.iter().filter(|s| !s.protected) {
                let bar = crate::progress::bar("trimming");
                background &= client
                    .remove_snapshot(pool, &image, &snap.name, &mut |done, all| bar.update(done, all))
                    .with_context(|| format!("removing {image}@{}", snap.name))?;
                bar.finish();
                removed += 1;
            }
            let kept = snaps.len() - removed;
            println!(
                "removed {removed} snapshot(s) of '{image}'{}{}",
                if kept > 0 { format!("; {kept} protected kept") } else { String::new() },
                if removed > 0 { trimmed(background) } else { "" }
            );
        }
        SnapCommand::Rollback { spec } => {
            let (image, name) = split_spec(&spec)?;
            let bar = crate::progress::bar("rolling back");
            client.rollback_snapshot(pool, image, name, &mut |done, all| bar.update(done, all))?;
            bar.finish();
            println!("rolled '{image}' back to '{image}@{name}'");
        }
        SnapCommand::Protect { spec } | SnapCommand::Unprotect { spec } if spec.is_empty() => {
            bail!("expected IMAGE@SNAP")
        }
        SnapCommand::Protect { spec } => {
            let (image, name) = split_spec(&spec)?;
            client.protect_snapshot(pool, image, name, true)?;
            println!("protected '{image}@{name}'");
        }
        SnapCommand::Children { spec } => {
            let (image, name) = split_spec(&spec)?;
            for child in client.children_of(pool, image, name)? {
                println!("{child}");
            }
        }
        SnapCommand::Unprotect { spec } => {
            let (image, name) = split_spec(&spec)?;
            client.protect_snapshot(pool, image, name, false)?;
            println!("unprotected '{image}@{name}'");
        }
    }
    Ok(())
}

/// How the clones of a removed snapshot went.
fn trimmed(background: bool) -> &'static str {
    if background {
        "; the OSDs trim its clones in the background"
    } else {
        ""
    }
}
