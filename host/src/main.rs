//! The `mst` binary: a thin wrapper over [`mst::cli`].

fn main() -> std::process::ExitCode {
    give_large_blocks_back();
    allow_every_file_descriptor();
    mst::cli::main()
}

/// Raises the soft limit on open files to the hard one, as Go's runtime does for every program.
///
/// A coordinator holds a few descriptors per shard (the worker's pipes, its channel's), so the
/// common soft limit of 1,024 would end a run at a few hundred machines while the hard limit,
/// the operator's real ceiling, is far higher (docs/scale.md).
fn allow_every_file_descriptor() {
    #[cfg(unix)]
    // SAFETY: getrlimit fills the struct it is given; setrlimit only changes this process's
    // soft limit, within the hard one.
    unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 && limit.rlim_cur < limit.rlim_max
        {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
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
