//! `duplex image export` and `duplex image import`: an image's bytes to a
//! file or a pipe, and back, streamed a chunk at a time with a few chunks
//! in flight. Holes stay holes: export seeks over chunks that read as
//! zeros when it writes a file (a pipe gets the zeros), and import writes
//! no chunk that is all zeros, so a thin image stays thin.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use bytes::Bytes;
use duplex_client::{Client, ClientError, CreateOptions, Image};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Chunks read or written at once.
const IN_FLIGHT: usize = 8;
/// The largest chunk (an object, if smaller).
const MAX_CHUNK: u64 = 4 << 20;

/// What a transfer moved.
pub struct Moved {
    pub bytes: u64,
    /// Of them, chunks that were all zeros (seeked over, or not written).
    pub zero_bytes: u64,
    pub took: Duration,
}

fn progress(len: u64, what: &str) -> ProgressBar {
    // Drawn on stderr only when it is a terminal: a pipe on stdout stays clean.
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    bar.set_style(
        ProgressStyle::with_template("{spinner} {prefix} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("static template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

fn chunk_of(image: &Image) -> u64 {
    u64::from(image.info().object_size).min(MAX_CHUNK)
}

fn is_zero(data: &[u8]) -> bool {
    data.iter().all(|b| *b == 0)
}

/// Writes `image` to `path` (`-`: standard output).
pub fn export(image: &Image, path: &str) -> Result<Moved> {
    let started = Instant::now();
    let size = image.size();
    let chunk = chunk_of(image);
    let bar = progress(size, &format!("export {}", image.info().name));
    // A file (holes seeked over), or standard output (the zeros written).
    let mut out: Result<File, BufWriter<crate::QuietStdout>> = if path == "-" {
        Err(BufWriter::with_capacity(chunk as usize, crate::QuietStdout::lock()))
    } else {
        Ok(File::create(path).with_context(|| format!("creating {path}"))?)
    };
    let mut pending: VecDeque<mpsc::Receiver<Result<Bytes, ClientError>>> = VecDeque::new();
    let mut next = 0u64;
    let (mut written, mut zero_bytes) = (0u64, 0u64);
    while written < size {
        while next < size && pending.len() < IN_FLIGHT {
            let len = chunk.min(size - next) as u32;
            let (tx, rx) = mpsc::sync_channel(1);
            image.read_async(
                next,
                len,
                Box::new(move |result| {
                    let _ = tx.send(result);
                }),
            );
            pending.push_back(rx);
            next += u64::from(len);
        }
        let data = pending
            .pop_front()
            .expect("a read is in flight while bytes are left")
            .recv()
            .unwrap_or(Err(ClientError::Shutdown))
            .with_context(|| format!("reading bytes {written}.. of the image"))?;
        match out.as_mut() {
            Ok(file) if is_zero(&data) => {
                file.seek(SeekFrom::Current(data.len() as i64))?;
                zero_bytes += data.len() as u64;
            }
            Ok(file) => file.write_all(&data).with_context(|| format!("writing {path}"))?,
            Err(pipe) => pipe.write_all(&data).context("writing to standard output")?,
        }
        written += data.len() as u64;
        bar.set_position(written);
    }
    match out {
        // Seeks past the end make no bytes: the length says where it ends.
        Ok(file) => {
            file.set_len(size)?;
            file.sync_all().with_context(|| format!("syncing {path}"))?;
        }
        Err(mut pipe) => pipe.flush().context("writing to standard output")?,
    }
    bar.finish_and_clear();
    Ok(Moved { bytes: written, zero_bytes, took: started.elapsed() })
}

/// Creates image `name` from `path` (`-`: standard input). Its size is the
/// file's, or `size` (required to read a pipe, whose end it must match).
pub fn import(
    client: &Client,
    pool: u32,
    path: &str,
    name: &str,
    size: Option<u64>,
    options: CreateOptions,
) -> Result<Moved> {
    let started = Instant::now();
    let (mut input, size): (Box<dyn Read>, u64) = if path == "-" {
        let Some(size) = size else { bail!("importing from standard input needs --size (the stream's length)") };
        (Box::new(std::io::stdin().lock()), size)
    } else {
        let file = File::open(path).with_context(|| format!("opening {path}"))?;
        let len = file.metadata()?.len();
        if size.is_some_and(|size| size != len) {
            bail!("--size {} differs from {path}'s length ({len})", size.unwrap_or_default());
        }
        (Box::new(std::io::BufReader::with_capacity(MAX_CHUNK as usize, file)), len)
    };
    if size == 0 {
        bail!("nothing to import: the image would be empty");
    }
    client.create_image(pool, name, size, options).with_context(|| format!("creating image '{name}'"))?;
    match fill(client, pool, name, path, &mut input, size) {
        Ok(zero_bytes) => Ok(Moved { bytes: size, zero_bytes, took: started.elapsed() }),
        Err(err) => {
            // Half an image is worse than none: the operator imports again.
            match client.remove_image(pool, name) {
                Ok(()) => Err(err.context(format!("image '{name}' was removed again"))),
                Err(remove) => Err(err.context(format!("image '{name}' is incomplete (removing it failed: {remove})"))),
            }
        }
    }
}

/// Writes `size` bytes of `input` into image `name`; the bytes of zero
/// chunks it did not write.
fn fill(client: &Client, pool: u32, name: &str, path: &str, input: &mut dyn Read, size: u64) -> Result<u64> {
    let image = client.open_image(pool, name)?;
    let chunk = chunk_of(&image);
    let bar = progress(size, &format!("import {name}"));
    let mut pending: VecDeque<mpsc::Receiver<Result<(), ClientError>>> = VecDeque::new();
    let (mut read, mut zero_bytes) = (0u64, 0u64);
    let mut buffer = vec![0u8; chunk as usize];
    while read < size {
        let len = chunk.min(size - read) as usize;
        input.read_exact(&mut buffer[..len]).with_context(|| {
            format!("reading {path}: it ended after {read} of {size} bytes (a pipe shorter than --size?)")
        })?;
        if is_zero(&buffer[..len]) {
            zero_bytes += len as u64;
        } else {
            if pending.len() == IN_FLIGHT {
                wait_write(&mut pending, read)?;
            }
            let (tx, rx) = mpsc::sync_channel(1);
            image.write_async(
                read,
                Bytes::copy_from_slice(&buffer[..len]),
                Box::new(move |result| {
                    let _ = tx.send(result);
                }),
            );
            pending.push_back(rx);
        }
        read += len as u64;
        bar.set_position(read);
    }
    while !pending.is_empty() {
        wait_write(&mut pending, read)?;
    }
    if path == "-" && input.read(&mut buffer[..1])? != 0 {
        bail!("standard input holds more than --size ({size}) bytes");
    }
    bar.finish_and_clear();
    Ok(zero_bytes)
}

fn wait_write(pending: &mut VecDeque<mpsc::Receiver<Result<(), ClientError>>>, at: u64) -> Result<()> {
    let done = pending.pop_front().expect("a write is in flight");
    done.recv().unwrap_or(Err(ClientError::Shutdown)).with_context(|| format!("writing the image (near byte {at})"))
}
