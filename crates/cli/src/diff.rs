//! `duplex image diff`, `export-diff` and `import-diff`: what changed
//! between two snapshots, found from the OSDs' block maps (no data read to
//! find it), and shipped in Ceph's `rbd diff v1` stream, so that
//! `export-diff | import-diff` keeps a backup image in step in time
//! proportional to what changed.
//!
//! ```text
//! "rbd diff v1\n"
//! 'f' u32 length, name      the snapshot the diff starts from (absent: from nothing)
//! 't' u32 length, name      the snapshot it ends at (absent: the image now)
//! 's' u64                   the image's size at the end
//! 'w' u64 offset, u64 length, data   bytes that changed
//! 'z' u64 offset, u64 length         bytes that read as zeros now
//! 'e'                       the end
//! ```
//! Integers are little-endian.

use std::io::{BufReader, BufWriter, Read, Write};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use duplex_client::{Client, Image};
use duplex_store::units::format_size;

const MAGIC: &[u8] = b"rbd diff v1\n";
/// The largest `w` record written (one read of the image).
const MAX_RECORD: u64 = 4 << 20;
/// The largest `w` record read (a stream from elsewhere may use bigger ones).
const MAX_RECORD_IN: u64 = 64 << 20;

#[derive(Debug, serde::Serialize)]
struct DiffExtent {
    offset: u64,
    length: u64,
    exists: bool,
}

/// `duplex image diff IMAGE[@SNAP] [--from-snap S]`.
pub fn diff(client: &Client, pool: u32, spec: &str, from: Option<&str>, json: bool) -> Result<()> {
    let (image, to) = split(spec);
    let (size, extents) = client.diff_image(pool, image, from, to)?;
    if json {
        let rows: Vec<DiffExtent> =
            extents.iter().map(|e| DiffExtent { offset: e.offset, length: e.len, exists: !e.zero }).collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    println!("{:>14}  {:>10}  type", "offset", "length");
    let mut changed = 0;
    for extent in &extents {
        println!("{:>14}  {:>10}  {}", extent.offset, extent.len, if extent.zero { "zero" } else { "data" });
        changed += extent.len;
    }
    eprintln!("{} of {} changed in {} extent(s)", format_size(changed), format_size(size), extents.len());
    Ok(())
}

fn split(spec: &str) -> (&str, Option<&str>) {
    match spec.split_once('@') {
        Some((image, snap)) => (image, Some(snap)),
        None => (spec, None),
    }
}

/// What an export or import moved.
pub struct Moved {
    pub data_bytes: u64,
    pub zero_bytes: u64,
    pub records: u64,
}

/// `duplex image export-diff IMAGE[@SNAP] [--from-snap S] FILE|-`.
pub fn export_diff(client: &Client, pool: u32, spec: &str, from: Option<&str>, path: &str) -> Result<Moved> {
    let (image_name, to) = split(spec);
    let (size, extents) = client.diff_image(pool, image_name, from, to)?;
    let image = client.open_spec(pool, spec)?;
    let out: Box<dyn Write> = if path == "-" {
        Box::new(crate::QuietStdout::lock())
    } else {
        Box::new(std::fs::File::create(path).with_context(|| format!("creating {path}"))?)
    };
    let mut out = BufWriter::with_capacity(1 << 20, out);
    let mut moved = Moved { data_bytes: 0, zero_bytes: 0, records: 0 };
    out.write_all(MAGIC)?;
    for (tag, name) in [(b'f', from), (b't', to)] {
        if let Some(name) = name {
            out.write_all(&[tag])?;
            out.write_all(&(name.len() as u32).to_le_bytes())?;
            out.write_all(name.as_bytes())?;
        }
    }
    out.write_all(b"s")?;
    out.write_all(&size.to_le_bytes())?;
    for extent in extents {
        if extent.zero {
            out.write_all(b"z")?;
            out.write_all(&extent.offset.to_le_bytes())?;
            out.write_all(&extent.len.to_le_bytes())?;
            moved.zero_bytes += extent.len;
            moved.records += 1;
            continue;
        }
        let mut at = extent.offset;
        while at < extent.offset + extent.len {
            let len = (extent.offset + extent.len - at).min(MAX_RECORD);
            let data = image.read(at, len as u32).with_context(|| format!("reading bytes {at}..{}", at + len))?;
            // Runs of zero blocks (a discard inside an object zeroes its
            // blocks in place) go as `z` records, not as data.
            for (offset, run, zeros) in runs(&data) {
                let start = at + offset as u64;
                if zeros {
                    out.write_all(b"z")?;
                    out.write_all(&start.to_le_bytes())?;
                    out.write_all(&(run.len() as u64).to_le_bytes())?;
                    moved.zero_bytes += run.len() as u64;
                } else {
                    out.write_all(b"w")?;
                    out.write_all(&start.to_le_bytes())?;
                    out.write_all(&(run.len() as u64).to_le_bytes())?;
                    out.write_all(run)?;
                    moved.data_bytes += run.len() as u64;
                }
                moved.records += 1;
            }
            at += len;
        }
    }
    out.write_all(b"e")?;
    out.flush().context("writing the diff")?;
    Ok(moved)
}

/// `duplex image import-diff FILE|- IMAGE`: applies a diff; its starting
/// snapshot must exist on the image, and its ending one is created.
pub fn import_diff(client: &Client, pool: u32, path: &str, image_name: &str) -> Result<Moved> {
    let input: Box<dyn Read> = if path == "-" {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::fs::File::open(path).with_context(|| format!("opening {path}"))?)
    };
    let mut input = BufReader::with_capacity(1 << 20, input);
    let mut magic = [0u8; MAGIC.len()];
    input.read_exact(&mut magic).context("reading the diff's header")?;
    if magic != MAGIC {
        bail!("not an rbd diff v1 stream");
    }
    let image = client.open_image(pool, image_name)?;
    let mut to: Option<String> = None;
    let mut moved = Moved { data_bytes: 0, zero_bytes: 0, records: 0 };
    loop {
        let tag = read_u8(&mut input).context("the diff ends without its end record")?;
        match tag {
            b'f' => {
                let from = read_name(&mut input)?;
                if !client.list_snapshots(pool, image_name)?.iter().any(|s| s.name == from) {
                    bail!("the diff starts from snapshot '{from}', which {image_name} does not have: import the earlier diffs first");
                }
            }
            b't' => {
                let name = read_name(&mut input)?;
                if client.list_snapshots(pool, image_name)?.iter().any(|s| s.name == name) {
                    bail!("{image_name} already has snapshot '{name}', where this diff ends");
                }
                to = Some(name);
            }
            b's' => {
                let size = read_u64(&mut input)?;
                if size != image.size() {
                    drop(image);
                    bail!(
                        "the diff is of an image of {} and {image_name} is {}: resize it first (`duplex image resize`)",
                        format_size(size),
                        format_size(client.image_info(pool, image_name)?.size)
                    );
                }
            }
            b'w' => {
                let (offset, len) = (read_u64(&mut input)?, read_u64(&mut input)?);
                if offset.checked_add(len).is_none() {
                    bail!("a data record past the end of any image");
                }
                if len > MAX_RECORD_IN {
                    bail!("a data record of {len} bytes: larger than this reader takes");
                }
                let mut data = vec![0u8; len as usize];
                input.read_exact(&mut data).context("a data record is cut short")?;
                write_at(&image, offset, Bytes::from(data))?;
                moved.data_bytes += len;
                moved.records += 1;
            }
            b'z' => {
                let (offset, len) = (read_u64(&mut input)?, read_u64(&mut input)?);
                if offset.checked_add(len).is_none() {
                    bail!("a zero record past the end of any image");
                }
                image.write_zeroes(offset, len).with_context(|| format!("zeroing bytes {offset}..{}", offset + len))?;
                moved.zero_bytes += len;
                moved.records += 1;
            }
            b'e' => break,
            other => bail!("unknown record type {other:#04x} in the diff"),
        }
    }
    // The image is closed (its watch dropped) before the snapshot waits for writers.
    drop(image);
    if let Some(to) = to {
        client.create_snapshot(pool, image_name, &to)?;
    }
    Ok(moved)
}

/// `data` cut into runs of 4 KiB blocks that are all zeros, or not:
/// (offset, bytes, zeros).
fn runs(data: &[u8]) -> Vec<(usize, &[u8], bool)> {
    const BLOCK: usize = 4096;
    let mut out: Vec<(usize, &[u8], bool)> = Vec::new();
    let mut at = 0;
    while at < data.len() {
        let end = (at + BLOCK).min(data.len());
        let zeros = data[at..end].iter().all(|b| *b == 0);
        match out.last_mut() {
            Some((start, run, was)) if *was == zeros => *run = &data[*start..end],
            _ => out.push((at, &data[at..end], zeros)),
        }
        at = end;
    }
    out
}

fn write_at(image: &Image, offset: u64, data: Bytes) -> Result<()> {
    let end = offset + data.len() as u64;
    image.write(offset, data).with_context(|| format!("writing bytes {offset}..{end}"))?;
    Ok(())
}

fn read_u8(input: &mut impl Read) -> Result<u8> {
    let mut byte = [0u8; 1];
    input.read_exact(&mut byte)?;
    Ok(byte[0])
}

fn read_u64(input: &mut impl Read) -> Result<u64> {
    let mut bytes = [0u8; 8];
    input.read_exact(&mut bytes).context("the diff is cut short")?;
    Ok(u64::from_le_bytes(bytes))
}

fn read_name(input: &mut impl Read) -> Result<String> {
    let mut len = [0u8; 4];
    input.read_exact(&mut len).context("the diff is cut short")?;
    let len = u32::from_le_bytes(len);
    if len > 256 {
        bail!("a snapshot name of {len} bytes in the diff");
    }
    let mut name = vec![0u8; len as usize];
    input.read_exact(&mut name).context("the diff is cut short")?;
    String::from_utf8(name).context("a snapshot name that is not UTF-8")
}

#[cfg(test)]
mod tests {
    #[test]
    fn data_is_cut_into_runs_of_zero_and_other_blocks() {
        let mut data = vec![0u8; 5 * 4096 + 100];
        data[4096] = 1;
        data[3 * 4096 + 5] = 2;
        let runs: Vec<(usize, usize, bool)> =
            super::runs(&data).iter().map(|(at, run, z)| (*at, run.len(), *z)).collect();
        assert_eq!(
            runs,
            vec![(0, 4096, true), (4096, 4096, false), (8192, 4096, true), (12288, 4096, false), (16384, 4196, true)]
        );
        assert!(super::runs(&[]).is_empty());
    }
}
