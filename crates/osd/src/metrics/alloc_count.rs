//! Counts the process's heap allocations, for the per-write work budget
//! (`crates/cli/tests/budget.rs`): an allocation is a few hundred
//! nanoseconds of allocator work and cache misses, and the budget notices
//! one more per write where a timing never could.
//!
//! The binaries install [`CountingAllocator`] as their global allocator.
//! Its cost is one relaxed add on a per-thread shard (no line shared
//! between threads), a nanosecond or two per allocation.
//!
//! Underneath is mimalloc (feature `mimalloc`, on by default): each thread
//! allocates from a heap of its own, and a block freed by another thread
//! goes back to its owner's page list without a lock. That is the LALCA
//! paper's per-core memory pools (issue 30) for every buffer, not only
//! requests: with threads pinned, a heap is a core's. Measured against
//! glibc's malloc (docs/BENCHMARKS.md, "Session 33"): 5–12% less CPU per
//! 4 KiB write, about 20 MiB more resident memory per OSD.

use std::alloc::{GlobalAlloc, Layout};

#[cfg(feature = "mimalloc")]
use mimalloc::MiMalloc as Heap;
#[cfg(not(feature = "mimalloc"))]
use std::alloc::System as Heap;
use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

const SHARDS: usize = 16;

#[repr(align(128))]
struct Shard(AtomicU64);

static COUNTS: [Shard; SHARDS] = [const { Shard(AtomicU64::new(0)) }; SHARDS];
static NEXT_SHARD: AtomicUsize = AtomicUsize::new(0);
static INSTALLED: AtomicBool = AtomicBool::new(false);

thread_local! {
    // Const-initialized and without a destructor: safe to touch from
    // inside the allocator, at any point of a thread's life.
    static SHARD: Cell<usize> = const { Cell::new(usize::MAX) };
    // Set on threads whose allocations are not the OSD's work: the metrics
    // endpoint's, whose every scrape would count (a budget measurement
    // scrapes while it waits for the flushers to settle).
    static UNCOUNTED: Cell<bool> = const { Cell::new(false) };
}

/// Stops counting the calling thread's allocations (the metrics and admin
/// endpoints: serving a scrape is not work a client's write caused).
pub fn uncounted_thread() {
    let _ = UNCOUNTED.try_with(|uncounted| uncounted.set(true));
}

/// The heap allocator (mimalloc, or glibc's without the feature), counting
/// allocations (and reallocations, which may move) but not frees.
pub struct CountingAllocator;

fn count() {
    if UNCOUNTED.try_with(Cell::get).unwrap_or(false) {
        return;
    }
    let shard = SHARD
        .try_with(|shard| {
            if shard.get() == usize::MAX {
                shard.set(NEXT_SHARD.fetch_add(1, Relaxed) % SHARDS);
            }
            shard.get()
        })
        .unwrap_or(0);
    COUNTS[shard].0.fetch_add(1, Relaxed);
}

// SAFETY: every call is forwarded unchanged to the underlying allocator.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller's contract is passed on as is.
        unsafe { Heap.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { Heap.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { Heap.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: as above.
        unsafe { Heap.realloc(ptr, layout, new_size) }
    }
}

/// Allocations so far, or `None` when this process does not count them
/// (its binary did not install [`CountingAllocator`]).
pub fn allocations() -> Option<u64> {
    if !INSTALLED.load(Relaxed) {
        // The first allocation proves it: one is counted right here (on
        // this thread, even when it is not counted otherwise).
        let uncounted = UNCOUNTED.try_with(|uncounted| uncounted.replace(false)).unwrap_or(false);
        let before: u64 = COUNTS.iter().map(|shard| shard.0.load(Relaxed)).sum();
        drop(std::hint::black_box(Box::new(0u64)));
        let after: u64 = COUNTS.iter().map(|shard| shard.0.load(Relaxed)).sum();
        let _ = UNCOUNTED.try_with(|flag| flag.set(uncounted));
        if after == before {
            return None;
        }
        INSTALLED.store(true, Relaxed);
    }
    Some(COUNTS.iter().map(|shard| shard.0.load(Relaxed)).sum())
}
