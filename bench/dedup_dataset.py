#!/usr/bin/env python3
"""The dedup tier's data set (issue 27), made on this machine from its own
files, and its ideal dedup ratio per chunk size, computed independently of
Duplex (the "ideal" column of the dissertation's table 4.1).

Each image is a VM-like raw disk: the installed OS tree (/usr) packed file
after file, each file starting on a 4 KiB boundary as a file system lays
them out. Image i then gets its own changes:

- a seeded few percent of its files hold bytes of their own (an updated
  package, a log, a database),
- files of its own are inserted at a few seeded places, which shifts
  everything after them by whole 4 KiB blocks (another install order),
- its first MiB (partition table, boot area) is its own; its file system
  starts at 1 MiB, aligned as partitioning tools align it.

The ratio is counted as the tier would store it: every chunk the images
hold, over the distinct chunks (by SHA-256) that are not all zeros (a zero
chunk is a hole and takes nothing).

With --cdc it also counts the ideal of content-defined chunking (a
tier's `--chunking content`: docs/DEDUP.md, "Chunking"), cut on
4 KiB block boundaries so that an evicted chunk frees whole blocks: a
chunk of average size A ends after a block whose CRC-32 (zlib's) has its
low log2(A / 8 KiB) bits all set, once it holds A/2, and at 3A/2 at the
latest; chunks never cross a 4 MiB object (the engine cuts one object at
a time). Its ratio counts bytes: the images' over the distinct non-zero
chunks'.

    bench/dedup_dataset.py [--images 4] [--size-mib 256] [--chunk-kib 16,32,64] [--out DIR] [--cdc] [--smoke]
"""

import argparse
import hashlib
import os
import random
import sys
import zlib

BLOCK = 4096
OBJECT = 4 << 20


def usr_files(limit_bytes):
    """Regular files of /usr in a fixed order, up to `limit_bytes` in all."""
    total = 0
    for root, dirs, files in os.walk("/usr"):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(root, name)
            try:
                if os.path.islink(path) or not os.path.isfile(path):
                    continue
                size = os.path.getsize(path)
                if size == 0 or size > 2 << 20:
                    continue
                with open(path, "rb") as f:
                    data = f.read()
            except OSError:
                continue
            yield data
            total += len(data) + (-len(data)) % BLOCK
            if total >= limit_bytes:
                return


def padded(data):
    return data + b"\0" * ((-len(data)) % BLOCK)


def build_image(path, files, index, size, seed):
    rng = random.Random(seed * 1000 + index)
    own = lambda n: rng.randbytes(n)  # noqa: E731 (bytes of this image only)
    with open(path, "wb") as out:
        boot = min(1 << 20, size // 4)
        out.write(own(boot))  # its own partition table and boot area
        written = boot
        inserts = set(rng.sample(range(len(files)), k=min(8, len(files))))
        for n, data in enumerate(files):
            if n in inserts:
                # (Clipped like the files: an image is exactly `size` bytes.)
                extra = padded(own(rng.randrange(1, 64) * BLOCK - rng.randrange(0, BLOCK)))[: size - written]
                out.write(extra)
                written += len(extra)
                if written == size:
                    break
            if rng.random() < 0.04:
                data = own(len(data))
            chunk = padded(data)[: size - written]
            out.write(chunk)
            written += len(chunk)
            if written == size:
                break
        out.write(b"\0" * (size - written))


def ratio(paths, chunk):
    total = zero = 0
    distinct = set()
    zero_chunk = bytes(chunk)
    for path in paths:
        with open(path, "rb") as f:
            while True:
                data = f.read(chunk)
                if not data:
                    break
                total += 1
                if data == zero_chunk[: len(data)]:
                    zero += 1
                else:
                    distinct.add(hashlib.sha256(data).digest())
    return total, zero, len(distinct)


def content_defined(data, avg):
    """The chunks of `data` (an image) cut by content on block boundaries
    (the rule in this script's docstring), object by object."""
    least, most = avg // 2 // BLOCK, avg * 3 // 2 // BLOCK
    mask = (1 << ((avg // 2 // BLOCK).bit_length() - 1)) - 1
    for start in range(0, len(data), OBJECT):
        obj = data[start : start + OBJECT]
        blocks = len(obj) // BLOCK
        first = 0
        for b in range(blocks):
            held = b + 1 - first
            if held >= most or (held >= least and zlib.crc32(obj[b * BLOCK : (b + 1) * BLOCK]) & mask == mask):
                yield obj[first * BLOCK : (b + 1) * BLOCK]
                first = b + 1
        if first * BLOCK < len(obj):
            yield obj[first * BLOCK :]


def cdc_ratio(paths, avg):
    """Chunks, zero chunks, distinct non-zero chunks and their bytes, and
    the images' bytes, cut by content."""
    total = zero = logical = 0
    distinct = {}
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        logical += len(data)
        for chunk in content_defined(data, avg):
            total += 1
            if chunk.count(0) == len(chunk):
                zero += 1
            else:
                distinct[hashlib.sha256(chunk).digest()] = len(chunk)
    return total, zero, len(distinct), sum(distinct.values()), logical


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=4)
    ap.add_argument("--size-mib", type=int, default=256)
    ap.add_argument("--chunk-kib", default="16,32,64")
    ap.add_argument("--out", default="target/dedup-dataset")
    ap.add_argument("--seed", type=int, default=27)
    ap.add_argument("--cdc", action="store_true", help="also the ideal of content-defined chunking")
    ap.add_argument("--smoke", action="store_true", help="2 images of 8 MiB, to check the script works")
    args = ap.parse_args()
    if args.smoke:
        args.images, args.size_mib = 2, 8
    size = args.size_mib << 20
    os.makedirs(args.out, exist_ok=True)
    files = list(usr_files(size))
    if not files:
        sys.exit("no files under /usr to build images from")
    paths = []
    for i in range(args.images):
        path = os.path.join(args.out, f"vm{i}.raw")
        build_image(path, files, i, size, args.seed)
        paths.append(path)
    print(f"{args.images} images of {args.size_mib} MiB from {len(files)} files of /usr (seed {args.seed}) in {args.out}\n")
    print("| chunk | chunks | zero chunks | distinct non-zero | ideal ratio (chunks / distinct) | space saved |")
    print("| --- | --- | --- | --- | --- | --- |")
    for kib in [int(k) for k in args.chunk_kib.split(",")]:
        total, zero, distinct = ratio(paths, kib << 10)
        ideal = total / max(distinct, 1)
        print(f"| {kib} KiB | {total} | {zero} | {distinct} | {ideal:.3f} | {100 * (1 - 1 / ideal):.1f} % |")
        if total == 0 or distinct == 0 or distinct > total:
            sys.exit("the counts make no sense")
    if args.cdc:
        print("\nContent-defined, on block boundaries (average size; the ratio counts bytes):\n")
        print("| chunking | chunks | zero chunks | distinct non-zero | their mean size | ideal ratio (bytes / distinct bytes) | space saved |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        for kib in [int(k) for k in args.chunk_kib.split(",")]:
            total, zero, distinct, stored, logical = cdc_ratio(paths, kib << 10)
            if total == 0 or distinct == 0 or stored > logical:
                sys.exit("the counts make no sense")
            ideal = logical / stored
            mean = stored / distinct / 1024
            print(
                f"| cdc {kib} KiB | {total} | {zero} | {distinct} | {mean:.1f} KiB | {ideal:.3f} | {100 * (1 - 1 / ideal):.1f} % |"
            )


if __name__ == "__main__":
    main()
