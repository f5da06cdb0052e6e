//! Building HTTP clients (reqwest with rustls) the same way everywhere mst makes requests:
//! model providers, streamable-HTTP MCP servers.
//!
//! reqwest verifies servers against the machine's CA store, and refuses to build a client on
//! a machine that has none (a minimal worker image). mst then verifies against Mozilla's
//! roots, built in, so a worker in any container can reach an `https://` provider; and never
//! panics: a client that cannot be built is an error for the caller's trial.

use reqwest::redirect::{Attempt, Policy};

/// Redirects followed for one request, at most.
const MAX_REDIRECTS: usize = 10;

/// A client with `configure`'s settings, verifying servers against the machine's CA store or,
/// where it has none, against Mozilla's roots.
pub fn client(
    configure: impl Fn(reqwest::ClientBuilder) -> reqwest::ClientBuilder,
) -> Result<reqwest::Client, String> {
    configure(reqwest::Client::builder())
        .build()
        .or_else(|system| {
            let roots = webpki_root_certs::TLS_SERVER_ROOT_CERTS
                .iter()
                .filter_map(|der| reqwest::Certificate::from_der(der).ok());
            configure(reqwest::Client::builder())
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
