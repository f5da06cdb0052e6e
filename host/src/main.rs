//! The `mst` binary: a thin wrapper over [`mst::cli`].

fn main() -> std::process::ExitCode {
    give_large_blocks_back();
    mst::cli::main()
}

/// Asks glibc's allocator to map every block of 128 KiB or more on its own, for good.
///
/// A run's large blocks are lists of one entry per trial (the plan, a shard's keys, the
/// grading spill's index, the cases), each made and dropped once in a phase of the run. By
/// default glibc raises this threshold to the size of the first such block freed, so the
/// later ones are carved from the main heap, and once dropped they stay there as holes the
/// process keeps. Fixed, each is returned to the system when dropped: at 100,000 trials this
/// is the difference between 64 and 58 MiB of peak RSS (docs/performance.md). musl, which the
/// static worker is built with, maps large blocks on its own already.
fn give_large_blocks_back() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets an allocator parameter; it is called before any thread
    // starts.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
    }
}
