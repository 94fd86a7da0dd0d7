//! A global allocator that counts live heap bytes, so the memory report can
//! measure what the store's index costs instead of estimating it.
//!
//! Counting is off until [`enable`]: the counter is one cache line every
//! thread would write on every allocation, which would inflate the CPU the
//! benchmark measures. Only `memory-report` turns it on, at its start.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static ENABLED: AtomicBool = AtomicBool::new(false);

/// Starts counting. Memory allocated before is not counted; freeing it
/// subtracts, so read the counter as differences ([`live_bytes`] wraps).
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

fn count_up(bytes: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

fn count_down(bytes: usize) {
    if ENABLED.load(Ordering::Relaxed) {
        LIVE_BYTES.fetch_sub(bytes as u64, Ordering::Relaxed);
    }
}

pub struct Counting;

// SAFETY: forwards to the system allocator unchanged; only counts sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count_up(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count_down(layout.size());
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count_up(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count_up(new_size);
        count_down(layout.size());
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

/// Heap bytes allocated since [`enable`] (requested sizes, without
/// allocator overhead); subtract two readings with `wrapping_sub`.
pub fn live_bytes() -> u64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// Resident set size of this process, from /proc/self/status.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmRSS:")).map(str::to_owned))
        .and_then(|l| l.split_whitespace().nth(1).and_then(|kb| kb.parse::<u64>().ok()))
        .map_or(0, |kb| kb * 1024)
}
