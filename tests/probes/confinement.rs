//! A probe the Docker tests build (static, musl) into a test image, to see from inside a shard
//! container what a process may do there. It prints `vsock=… unix=… files=N`:
//!
//! - `vsock`: `socket(AF_VSOCK)`, which mst's seccomp profile refuses (`errno1`, EPERM);
//! - `unix`: `socket(AF_UNIX)`, which it allows (`open`);
//! - `files`: how many files it could hold open at once, trying 100,000 (the `nofile` limit,
//!   less the three standard streams).

extern "C" {
    fn socket(domain: i32, kind: i32, protocol: i32) -> i32;
}

/// `open`, or `errno<N>` for a refused `socket(domain, SOCK_STREAM, 0)`.
fn try_socket(domain: i32) -> String {
    // SAFETY: socket(2) takes plain integers; the descriptor is left to the process's exit.
    match unsafe { socket(domain, 1, 0) } {
        fd if fd >= 0 => "open".to_string(),
        _ => format!(
            "errno{}",
            std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
        ),
    }
}

fn main() {
    let (vsock, unix) = (try_socket(40), try_socket(1));
    let files: Vec<std::fs::File> = (0..100_000)
        .map_while(|_| std::fs::File::open("/dev/null").ok())
        .collect();
    println!("vsock={vsock} unix={unix} files={}", files.len());
}
