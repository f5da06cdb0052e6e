//! A probe the Docker tests build (static, musl) into a test image: it tries to open an
//! `AF_VSOCK` socket, which mst's seccomp profile refuses, and a Unix socket, which it allows,
//! and prints what happened: `vsock=errno1 unix=open` under mst's profile.

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
    println!("vsock={} unix={}", try_socket(40), try_socket(1));
}
