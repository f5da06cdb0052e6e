//! The HTTP client mst builds (reqwest with rustls) and the one way it reads a body: streamed,
//! and stopped at a cap, so that a peer sending an endless body costs at most the cap.

use std::fmt;

/// A client builder with what every mst client shares: rustls and a `mst/VERSION` user agent.
/// Callers add their own policy (redirects, resolver, proxies) on top.
pub fn builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder().user_agent(concat!("mst/", env!("CARGO_PKG_VERSION")))
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
    while let Some(chunk) = response.chunk().await.map_err(BodyError::Read)? {
        if body.len() + chunk.len() > cap {
            return Err(BodyError::TooLarge { cap });
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
