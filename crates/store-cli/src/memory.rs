//! `duplex-store memory-report`: what the in-memory index costs per object,
//! measured with the counting allocator across a mount (heap growth minus
//! the bitmaps and the page cache, which do not scale with objects), and
//! the process's resident memory after mount.
//!
//! Two shapes: many small objects (`--small-objects`), and a large sparse
//! file filled with pre-allocated 4 MiB objects (`--preallocated`).

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use duplex_store::{Batch, Key, MkfsOptions, Store};
use serde::Serialize;

use crate::counting_alloc::{enable, live_bytes, resident_bytes};
use crate::DeviceArgs;
use duplex_store::units::{format_size, parse_size};

#[derive(clap::Args, Clone)]
pub struct MemoryArgs {
    /// Directory for the (sparse) store files.
    #[arg(long, default_value = "target")]
    dir: PathBuf,
    /// Number of small objects (0 to skip).
    #[arg(long, default_value_t = 1_000_000)]
    small_objects: u64,
    /// Size of each small object.
    #[arg(long, value_parser = parse_size, default_value = "4K")]
    small_object_size: u64,
    /// Bytes of pre-allocated 4 MiB objects (0 to skip); the file is sparse.
    #[arg(long, value_parser = parse_size, default_value = "1T")]
    preallocated: u64,
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

#[derive(Serialize, Debug)]
struct MemoryResult {
    shape: String,
    objects: u64,
    store_bytes: u64,
    mount_seconds: f64,
    index_bytes: u64,
    index_bytes_per_object: f64,
    bitmap_bytes: u64,
    page_cache_bytes: u64,
    heap_growth_at_mount: u64,
    resident_bytes_after_mount: u64,
}

pub fn run(args: MemoryArgs) -> Result<()> {
    enable();
    std::fs::create_dir_all(&args.dir)?;
    let mut results = Vec::new();
    if args.small_objects > 0 {
        if args.small_object_size == 0 || args.small_object_size > 64 << 20 {
            bail!("--small-object-size must be 1 byte to 64 MiB");
        }
        let blocks_each = args.small_object_size.div_ceil(4096);
        // Data, plus one 512-byte onode slot per 4 KiB (12.5%), crc table and bitmaps.
        let size = args
            .small_objects
            .checked_mul(blocks_each * 4096 * 6 / 5)
            .and_then(|bytes| bytes.checked_add(256 << 20))
            .context("--small-objects is too large")?;
        let path = args.dir.join("duplex-memory-small.img");
        let data = vec![0xA5u8; args.small_object_size as usize];
        results.push(measure(&args, &path, size, 4096, "small objects", args.small_objects, |i| {
            let mut batch = Batch::new();
            for n in i..i + 512 {
                batch.write(small_key(n), 0, data.clone());
            }
            batch
        })?);
    }
    if args.preallocated > 0 {
        let objects = args.preallocated / (4 << 20);
        let size = args.preallocated * 102 / 100 + (256 << 20);
        let path = args.dir.join("duplex-memory-prealloc.img");
        results.push(measure(&args, &path, size, 64 << 10, "pre-allocated 4 MiB objects", objects, |i| {
            let mut batch = Batch::new();
            for n in i..i + 512 {
                batch.create_preallocated(small_key(n), 4 << 20);
            }
            batch
        })?);
    }
    eprintln!();
    eprintln!(
        "{:<30} {:>10} {:>12} {:>12} {:>14} {:>12} {:>12}",
        "shape", "objects", "store", "index", "index B/obj", "RSS", "mount s"
    );
    for r in &results {
        eprintln!(
            "{:<30} {:>10} {:>12} {:>12} {:>14.1} {:>12} {:>12.2}",
            r.shape,
            r.objects,
            format_size(r.store_bytes),
            format_size(r.index_bytes),
            r.index_bytes_per_object,
            format_size(r.resident_bytes_after_mount),
            r.mount_seconds
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&results)?);
    }
    Ok(())
}

fn small_key(n: u64) -> Key {
    Key::in_group(0, format!("rbd_data.{n:016x}").as_bytes()).expect("valid key")
}

#[allow(clippy::too_many_arguments)]
fn measure(
    args: &MemoryArgs,
    path: &std::path::Path,
    size: u64,
    bytes_per_onode: u64,
    shape: &str,
    objects: u64,
    make_batch: impl Fn(u64) -> Batch,
) -> Result<MemoryResult> {
    let config = args.device.config();
    let options = MkfsOptions { partitions: 1, size_bytes: Some(size), bytes_per_onode, journal_bytes: Some(64 << 20) };
    duplex_store::mkfs(path, &options, &config).with_context(|| format!("making {}", path.display()))?;
    let objects = objects / 512 * 512;
    {
        let mut store = Store::open(path, &config)?;
        let started = Instant::now();
        for i in (0..objects).step_by(512) {
            store.partition_mut(0).apply(&make_batch(i))?;
            if i % (64 * 512) == 0 {
                eprint!("\r{shape}: {i} of {objects} created ({:.0} s)", started.elapsed().as_secs_f64());
            }
        }
        eprintln!("\r{shape}: {objects} of {objects} created ({:.0} s)", started.elapsed().as_secs_f64());
        store.close()?;
    }
    let heap_before = live_bytes();
    let started = Instant::now();
    let store = Store::open(path, &config)?;
    let mount_seconds = started.elapsed().as_secs_f64();
    let heap_growth = live_bytes().wrapping_sub(heap_before);
    let memory = store.partitions()[0].memory();
    if memory.objects as u64 != objects {
        bail!("mounted {} objects, created {objects}", memory.objects);
    }
    let index_bytes =
        heap_growth.saturating_sub((memory.bitmap_bytes + memory.page_cache_bytes + memory.deferred_bytes) as u64);
    let result = MemoryResult {
        shape: shape.into(),
        objects,
        store_bytes: size,
        mount_seconds,
        index_bytes,
        index_bytes_per_object: index_bytes as f64 / objects.max(1) as f64,
        bitmap_bytes: memory.bitmap_bytes as u64,
        page_cache_bytes: memory.page_cache_bytes as u64,
        heap_growth_at_mount: heap_growth,
        resident_bytes_after_mount: resident_bytes(),
    };
    drop(store);
    let _ = std::fs::remove_file(path);
    Ok(result)
}
