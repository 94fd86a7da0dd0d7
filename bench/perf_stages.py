#!/usr/bin/env python3
"""Per-stage breakdown (bench/profile-write) of an OSD profile: `perf script -F comm,ip,sym,dso`
on stdin; each sample goes to one stage by its stack (the syscall it is in,
else its leaf symbol). Prints the share of samples per thread class and stage."""
import collections, re, sys

USER = [
    (r"crc32c", "checksums (crc32c)"),
    (r"^__mem(move|cpy|set)|memcpy|memmove|memset", "memory copies and fills"),
    (r"malloc|free|_int_|realloc|alloc::alloc|__rust_alloc|__rust_dealloc|CountingAllocator|unlink_chunk|cfree|tcache", "heap allocation"),
    (r"crossbeam|std::sync::mpmc", "thread hand-offs (channels)"),
    (r"duplex_oplog", "operation log (user)"),
    (r"duplex_store", "store (user: plan, journal, index)"),
    (r"stored_requests|requests::|stored_interval", "request ids and interval records"),
    (r"hashbrown|btree|BTreeMap|HashMap|DefaultHasher|sip", "maps (hash, B-tree)"),
    (r"duplex_proto|frame::|FrameDecoder|Session", "wire protocol (frames, decode)"),
    (r"duplex_osd|duplex_", "OSD logic (ops, PG, flusher, event loop)"),
]

KERNEL = [
    (r"io_uring|iomap|blk_|ext4_|virtblk|__submit_bio|bio_", "store device I/O (io_uring, ext4, block layer, virtio)"),
    (r"epoll", "waiting: epoll_wait and the switch back"),
    (r"futex|sched_yield", "waiting: futex (channels, locks) and the switch back"),
    (r"tcp_sendmsg|sock_write_iter|do_writev|vfs_writev|__sys_sendto|sock_sendmsg|unix_stream_sendmsg", "network send (TCP, loopback)"),
    (r"tcp_recvmsg|sock_read_iter|vfs_read|ksys_read|sock_recvmsg|unix_stream_recvmsg", "network receive (TCP, loopback)"),
    (r"fdatasync|vfs_fsync|pwrite", "store device I/O (io_uring, ext4, block layer, virtio)"),
    (r"msync", "operation log (user)"),
]

def classify(stack):
    kernel = [s for s in stack if s[1] == "k"]
    user = [s for s in stack if s[1] == "u"]
    if kernel:
        names = [sym for sym, _ in kernel]
        # Outermost first: the syscall's own path decides, not what it called.
        for sym in reversed(names):
            for pattern, stage in KERNEL:
                if re.search(pattern, sym):
                    return stage
        if any("interrupt" in n or "softirq" in n for n in names):
            return "kernel: interrupts"
        if any("finish_task_switch" in n or "schedule" in n for n in names):
            return "scheduler (context switches)"
        return "kernel: other"
    leaf = user[0][0] if user else "?"
    for pattern, stage in USER:
        if re.search(pattern, leaf):
            return stage
    return "other user code"

def samples(lines):
    comm, stack = None, []
    for line in lines:
        if not line.strip():
            if comm is not None:
                yield comm, stack
            comm, stack = None, []
            continue
        if not line.startswith(("\t", " ")) and comm is None:
            comm = line.split()[0]
            continue
        m = re.match(r"\s*[0-9a-f]+ (.*) \((.*)\)$", line)
        if m:
            sym, dso = m.groups()
            stack.append((sym, "k" if "kernel" in dso else "u"))
    if comm is not None:
        yield comm, stack

counts = collections.Counter()
classes = collections.Counter()
total = 0
for comm, stack in samples(sys.stdin):
    cls = re.sub(r"-\d+$", "", comm)
    stage = classify(stack)
    counts[(cls, stage)] += 1
    classes[cls] += 1
    total += 1
per_write = float(sys.argv[1]) if len(sys.argv) > 1 else None
for cls, n in classes.most_common():
    print(f"## {cls}: {100*n/total:.1f}% of OSD CPU" + (f" ({per_write*n/total:.1f} µs per write)" if per_write else ""))
    for (c, stage), k in sorted(counts.items(), key=lambda kv: -kv[1]):
        if c == cls and 100 * k / total >= 0.3:
            print(f"  {100*k/total:5.1f}%  " + (f"{per_write*k/total:5.2f} µs  " if per_write else "") + stage)
