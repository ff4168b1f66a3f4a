//! Hints that data will be read soon, for records a loop is about to touch that nothing has
//! touched for a while (no effect where the processor has no such hint; a hint changes nothing
//! the program sees). The scheduler's and the twin's hot loops use them (docs/performance.md,
//! "Cache-line prefetch hints", says what they gain); they live in this crate so that the
//! deployment core holds no `unsafe` code (`#![forbid(unsafe_code)]` in `dstwin-core`).

/// Hints that the cache line holding `at` will be read soon.
#[inline(always)]
pub fn line(at: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and reads nothing the program sees, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = at;
}

/// Hints that every cache line of `v` will be read soon.
#[inline(always)]
pub fn value<T>(v: &T) {
    let at = (v as *const T).cast::<u8>();
    let size = std::mem::size_of::<T>();
    for offset in (0..size).step_by(64).chain([size.saturating_sub(1)]) {
        line(at.wrapping_add(offset));
    }
}
