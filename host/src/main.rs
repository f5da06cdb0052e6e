//! The `mst` binary: a thin wrapper over [`mst::cli`].

fn main() -> std::process::ExitCode {
    mst::cli::main()
}
