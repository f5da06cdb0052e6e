//! The HTTP clients mst builds (reqwest with rustls: model providers, streamable-HTTP MCP
//! servers, plugins' `http.send`) and the one way it reads a body: streamed, and stopped at a
//! cap, so that a peer sending an endless body costs at most the cap. And which addresses are
//! public ([`non_public`]), for every path that lets something reach out by name.
//!
//! reqwest verifies servers against the machine's CA store, and refuses to build a client on a
//! machine that has none (a minimal worker image). [`client`] then verifies against Mozilla's
//! roots, built in, so a worker in any container can reach an `https://` provider; and never
//! panics: a client that cannot be built is an error for the caller.

use reqwest::redirect::{Attempt, Policy};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Makes ring rustls's crypto provider for the process, once. reqwest, rmcp and oci-client are
/// built without a provider of their own (aws-lc is minutes of C to compile and nothing needs
/// it), so every path that builds an HTTP client calls this first; [`builder`] does.
pub fn install_tls_provider() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // An error means another provider is already the default: that one serves.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// A client builder with what every mst client shares: rustls and a `mst/VERSION` user agent.
/// Callers add their own policy (redirects, resolver, proxies) on top.
pub fn builder() -> reqwest::ClientBuilder {
    install_tls_provider();
    reqwest::Client::builder().user_agent(concat!("mst/", env!("CARGO_PKG_VERSION")))
}

/// A client with what every mst client shares ([`builder`]) and `configure`'s settings,
/// verifying servers against the machine's CA store or, where it has none, against Mozilla's
/// roots.
pub fn client(
    configure: impl Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> Result<reqwest::Client, String> {
    configure(builder()).build().or_else(|system| {
        let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
            .iter()
            .filter_map(|der| reqwest::Certificate::from_der(der).ok());
        configure(builder())
            .tls_certs_only(roots)
            .build()
            .map_err(|bundled| {
                format!(
                    "cannot set up an HTTP client: {system} (with the machine's CA store); \
                     {bundled} (with Mozilla's roots)"
                )
            })
    })
}

/// Redirects followed for one request, at most, under [`same_origin_redirects`].
const MAX_REDIRECTS: usize = 10;

/// Follows a redirect only to the same origin (scheme, host and port), at most
/// [`MAX_REDIRECTS`] times: a server cannot send a request, and the credentials it carries,
/// elsewhere.
pub fn same_origin_redirects() -> Policy {
    Policy::custom(|attempt: Attempt<'_>| {
        let first = attempt.previous().first();
        let same = first.is_some_and(|first| {
            let next = attempt.url();
            first.scheme() == next.scheme()
                && first.host_str() == next.host_str()
                && first.port_or_known_default() == next.port_or_known_default()
        });
        if same && attempt.previous().len() <= MAX_REDIRECTS {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// Why a capped body read failed.
#[derive(Debug)]
pub enum BodyError {
    /// The body is longer than `cap` bytes (announced or seen while reading).
    TooLarge {
        /// The cap, in bytes.
        cap: usize,
    },
    /// The connection failed while reading.
    Read(reqwest::Error),
}

impl fmt::Display for BodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BodyError::TooLarge { cap } => write!(f, "the body is larger than the {cap}-byte cap"),
            BodyError::Read(e) => write!(f, "reading the body failed: {e}"),
        }
    }
}

impl std::error::Error for BodyError {}

/// Reads `response`'s body chunk by chunk, stopping (and dropping the connection) as soon as
/// it exceeds `cap` bytes, rather than buffering an unbounded body before checking it.
pub async fn read_capped(
    mut response: reqwest::Response,
    cap: usize,
) -> Result<Vec<u8>, BodyError> {
    // A body announced as too large is refused before any of it is read.
    if response
        .content_length()
        .is_some_and(|length| length > cap as u64)
    {
        return Err(BodyError::TooLarge { cap });
    }
    let mut body = Vec::new();
    // Errors leave the URL out: a query may carry a key, and callers name the URL themselves.
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| BodyError::Read(e.without_url()))?
    {
        if body.len() + chunk.len() > cap {
            return Err(BodyError::TooLarge { cap });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// The first `cap` bytes of `response`'s body (all of it when shorter), the rest never read:
/// for an error body, of which only the start is ever shown. A body that fails midway gives
/// what came.
pub async fn read_prefix(mut response: reqwest::Response, cap: usize) -> Vec<u8> {
    let mut body = Vec::new();
    while let Ok(Some(chunk)) = response.chunk().await {
        let room = cap - body.len();
        body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        if body.len() == cap {
            break;
        }
    }
    body
}

/// The kind of a non-public address (one a plugin reaches only through a grant naming it), or
/// `None` for a public one. IPv4 addresses embedded in IPv6 (mapped, NAT64, 6to4) are judged
/// as the IPv4 address they reach.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => non_public_v4(v4),
        IpAddr::V6(v6) => non_public_v6(v6),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        (0, _, _) => "unspecified",
        (127, _, _) => "loopback",
        (10, _, _) | (192, 168, _) => "private",
        (172, 16..=31, _) => "private",
        (100, 64..=127, _) => "shared (carrier-grade NAT)",
        (169, 254, _) => "link-local",
        (192, 0, 0) => "reserved",
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => "documentation",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, _, _) => "multicast",
        (240..=255, _, _) => "reserved",
        _ => return None,
    })
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return non_public_v4(v4);
    }
    let s = ip.segments();
    let embedded = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        Ipv4Addr::new(a, b, c, d)
    };
    Some(match s {
        [0, 0, 0, 0, 0, 0, 0, 0] => "unspecified",
        [0, 0, 0, 0, 0, 0, 0, 1] => "loopback",
        // IPv4-compatible (deprecated): no public host is reached this way.
        [0, 0, 0, 0, 0, 0, _, _] => "reserved",
        // NAT64 reaches the IPv4 address in the last 32 bits.
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => return non_public_v4(embedded(high, low)),
        [0x64, 0xff9b, 1, ..] => "private",
        // 6to4 reaches the IPv4 address in bits 16..48.
        [0x2002, high, low, ..] => return non_public_v4(embedded(high, low)),
        [0x100, 0, 0, 0, ..] => "reserved",
        [0x2001, 0xdb8, ..] => "documentation",
        [first, ..] if first & 0xfe00 == 0xfc00 => "private (unique local)",
        [first, ..] if first & 0xffc0 == 0xfe80 => "link-local",
        [first, ..] if first & 0xffc0 == 0xfec0 => "site-local",
        [first, ..] if first & 0xff00 == 0xff00 => "multicast",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpListener;
    use std::sync::mpsc;

    /// A client that reaches loopback directly whatever the environment's proxy settings.
    fn client() -> reqwest::Client {
        builder().no_proxy().build().unwrap()
    }

    /// A one-request server on loopback that sends `head` and then `body_bytes` of body in
    /// 64 KiB chunks; reports how many body bytes it wrote before the client went away.
    fn serve(head: &'static str, body_bytes: u64) -> (String, mpsc::Receiver<u64>) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        let (done, written) = mpsc::channel();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 4096];
            let _ = stream.read(&mut request);
            let _ = stream.write_all(head.as_bytes());
            let chunk = vec![b'x'; 64 << 10];
            let mut sent = 0;
            while sent < body_bytes && stream.write_all(&chunk).is_ok() {
                sent += chunk.len() as u64;
            }
            let _ = done.send(sent);
        });
        (url, written)
    }

    // Several threads: the connection's task must run to close the socket while the test
    // waits for the server.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_body_past_the_cap_stops_the_read_there() {
        let (url, written) = serve("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", 1 << 30);
        let response = client().get(url).send().await.unwrap();
        let error = read_capped(response, 1 << 20).await.unwrap_err();
        assert!(
            matches!(error, BodyError::TooLarge { cap: 1048576 }),
            "{error}"
        );
        assert_eq!(
            error.to_string(),
            "the body is larger than the 1048576-byte cap"
        );
        // The server saw the client go away long before its gigabyte.
        let written = tokio::task::spawn_blocking(move || written.recv().unwrap())
            .await
            .unwrap();
        assert!(written < 64 << 20, "{written} bytes were taken");
    }

    #[tokio::test]
    async fn a_body_announced_past_the_cap_is_refused_unread() {
        let head = "HTTP/1.1 200 OK\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n";
        let (url, _) = serve(head, 0);
        let response = client().get(url).send().await.unwrap();
        let error = read_capped(response, 1 << 20).await.unwrap_err();
        assert!(matches!(error, BodyError::TooLarge { .. }), "{error}");
    }

    #[tokio::test]
    async fn a_body_within_the_cap_is_read_whole() {
        let (url, _) = serve("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", 3 << 16);
        let response = client().get(url).send().await.unwrap();
        assert_eq!(read_capped(response, 1 << 20).await.unwrap().len(), 3 << 16);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn only_the_prefix_of_an_endless_error_body_is_read() {
        let (url, written) = serve("HTTP/1.1 500 Oops\r\nConnection: close\r\n\r\n", 1 << 30);
        let response = client().get(url).send().await.unwrap();
        let body = read_prefix(response, 1000).await;
        assert_eq!(body, vec![b'x'; 1000]);
        let written = tokio::task::spawn_blocking(move || written.recv().unwrap())
            .await
            .unwrap();
        assert!(written < 64 << 20, "{written} bytes were taken");
        let (url, _) = serve("HTTP/1.1 500 Oops\r\nConnection: close\r\n\r\n", 1 << 16);
        let response = client().get(url).send().await.unwrap();
        assert_eq!(
            read_prefix(response, 1 << 20).await.len(),
            1 << 16,
            "a short one whole"
        );
    }
}
