//! Plugin HTTP egress: the `http.send` import. A request goes only to a granted host; the host
//! resolves names itself and refuses loopback, private, link-local and other non-public
//! addresses unless the grant names the address (an IP-literal URL the operator granted);
//! redirects are followed only on the same host; bodies and headers are capped.
//!
//! "Names" is exact: a grant names an address only by being it (`--allow-http 127.0.0.1:8080`
//! and the URL `http://127.0.0.1:8080/`). A name that resolves to a non-public address,
//! `localhost` included, is refused, because what a name resolves to can change between the
//! grant and the call (DNS rebinding) and `/etc/hosts` is not the operator's grant.

use super::bindings::grader::mst::plugin::http;
use super::bindings::{ErrorCode, PluginError};
use crate::net::non_public;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::Url;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The largest response body a plugin receives; reading stops there.
pub const MAX_RESPONSE_BODY: usize = 16 << 20;
/// The largest request body a plugin may send.
pub const MAX_REQUEST_BODY: usize = 16 << 20;
/// The most request headers a plugin may set.
pub const MAX_REQUEST_HEADERS: usize = 64;
/// The most bytes, names and values together, of a plugin's request headers.
pub const MAX_REQUEST_HEADER_BYTES: usize = 16 << 10;
/// Redirects followed (all on the request's own host) before the call fails.
pub const MAX_REDIRECTS: usize = 5;

/// Headers the host owns: the target and the framing come from the URL and the body, and a
/// plugin may not steer connection handling or a proxy.
const HOST_HEADERS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "upgrade",
    "te",
    "trailer",
    "proxy-authorization",
    "proxy-connection",
];

fn error(code: ErrorCode, message: String) -> PluginError {
    PluginError { code, message }
}

/// Whether `url` is granted: its host, or its `host:port` (the port written or the scheme's
/// default), is in `grants` (compared without regard to case, as host names are).
fn is_granted(grants: &BTreeSet<String>, url: &Url) -> bool {
    let Some(host) = url.host_str() else {
        return false;
    };
    let port = url.port_or_known_default().unwrap_or(0);
    let with_port = format!("{host}:{port}");
    grants
        .iter()
        .any(|g| g.eq_ignore_ascii_case(host) || g.eq_ignore_ascii_case(&with_port))
}

/// The URL a plugin asked for, parsed, when it is `http://` or `https://` with a host and no
/// user info (which would make the host ambiguous to a reader).
fn parse_url(url: &str) -> Result<Url, PluginError> {
    let invalid = |why: &str| {
        error(
            ErrorCode::InvalidInput,
            format!(
                "`{}` is not a usable URL: {why}",
                super::imports::sanitize(url, 200)
            ),
        )
    };
    let parsed = Url::parse(url).map_err(|e| invalid(&e.to_string()))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(invalid("only http:// and https:// are allowed"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(invalid("it has no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(invalid("user info (`user@host`) is not allowed"));
    }
    Ok(parsed)
}

/// Why a name's addresses are refused: the first non-public address among `addrs` and what
/// the operator would have to grant instead, or `None` when all are public.
fn refuse_resolved(plugin: &str, host: &str, addrs: &[IpAddr]) -> Option<String> {
    let (ip, kind) = addrs
        .iter()
        .find_map(|ip| non_public(*ip).map(|kind| (*ip, kind)))?;
    let literal = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    Some(format!(
        "plugin {plugin}: HTTP to `{host}` refused: it resolves to {ip}, a {kind} address; a \
         plugin reaches such an address only through a grant naming the address itself (use \
         the URL http://{literal}:PORT/ and grant it with --allow-http {literal}:PORT)"
    ))
}

/// Resolves names for one plugin call and refuses non-public answers, remembering why so that
/// the call can fail with `denied` rather than a bare connection error. reqwest connects to
/// IP-literal URLs without asking it; those passed the grant check, which names them.
struct GuardedResolver {
    plugin: String,
    refused: Refusal,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let host = name.as_str().to_string();
        let plugin = self.plugin.clone();
        let refused = self.refused.clone();
        Box::pin(async move {
            let found: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let ips: Vec<IpAddr> = found.iter().map(SocketAddr::ip).collect();
            if let Some(why) = refuse_resolved(&plugin, &host, &ips) {
                *refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(why.clone());
                return Err(why.into());
            }
            Ok(Box::new(found.into_iter()) as Addrs)
        })
    }
}

/// The redirect rule: follow only to the first URL's own host (an http→https upgrade included,
/// a downgrade not), without user info, when the grants cover the target too, at most
/// [`MAX_REDIRECTS`] times.
/// Any other redirect is not followed: the plugin receives the 3xx response itself.
fn redirect_policy(grants: BTreeSet<String>) -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(move |attempt| {
        // `previous` starts with the first URL, which is not a redirect.
        if attempt.previous().len() > MAX_REDIRECTS {
            return attempt.error(format!("more than {MAX_REDIRECTS} redirects"));
        }
        let (Some(first), Some(last)) = (attempt.previous().first(), attempt.previous().last())
        else {
            return attempt.stop();
        };
        let to = attempt.url();
        let same_host = to.host_str() == first.host_str();
        let downgrade = last.scheme() == "https" && to.scheme() == "http";
        let web = matches!(to.scheme(), "http" | "https");
        let user_info = !to.username().is_empty() || to.password().is_some();
        if same_host && web && !downgrade && !user_info && is_granted(&grants, to) {
            attempt.follow()
        } else {
            attempt.stop()
        }
    })
}

/// The plugin's headers, checked: at most [`MAX_REQUEST_HEADERS`] of at most
/// [`MAX_REQUEST_HEADER_BYTES`] together, valid names and values, none the host owns.
fn request_headers(headers: &[(String, String)]) -> Result<HeaderMap, PluginError> {
    let invalid = |message: String| error(ErrorCode::InvalidInput, message);
    if headers.len() > MAX_REQUEST_HEADERS {
        return Err(invalid(format!(
            "the request has {} headers; at most {MAX_REQUEST_HEADERS} are allowed",
            headers.len()
        )));
    }
    let size: usize = headers.iter().map(|(n, v)| n.len() + v.len()).sum();
    if size > MAX_REQUEST_HEADER_BYTES {
        return Err(invalid(format!(
            "the request's headers are {size} bytes; at most {MAX_REQUEST_HEADER_BYTES} are allowed"
        )));
    }
    let mut map = HeaderMap::new();
    for (name, value) in headers {
        let shown = super::imports::sanitize(name, 100);
        let header = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| invalid(format!("`{shown}` is not a valid header name")))?;
        if HOST_HEADERS.contains(&header.as_str()) {
            return Err(invalid(format!(
                "header `{header}` is set by the host (from the URL and the body); remove it"
            )));
        }
        let value = HeaderValue::from_str(value).map_err(|_| {
            invalid(format!(
                "the value of header `{header}` is not a valid header value (control characters?)"
            ))
        })?;
        map.append(header, value);
    }
    Ok(map)
}

/// `url` for a message: without its query and fragment, which may carry a key the plugin
/// added (a message can end up in a log).
fn shown(url: &Url) -> String {
    let mut url = url.clone();
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

/// The source chain of an error, for a message that says what actually failed.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Sends `request` for plugin `plugin` with the effective HTTP `grants`, finishing by
/// `deadline` (the call's) at the latest.
pub async fn send(
    plugin: &str,
    grants: &BTreeSet<String>,
    deadline: Instant,
    request: http::Request,
) -> Result<http::Response, PluginError> {
    let request = CheckedRequest::check(grants, request)?;
    let (client, refused) = guarded_client(plugin, grants)?;
    // The plugin's timeout (0 = none of its own) never outlasts the call's deadline.
    let left = deadline.saturating_duration_since(Instant::now());
    let timeout = match request.timeout_ms {
        0 => left,
        ms => Duration::from_millis(ms.into()).min(left),
    };
    let url = request.url.clone();
    match tokio::time::timeout(timeout, request.exchange(&client)).await {
        Ok(Ok(response)) => Ok(response),
        Ok(Err(e)) => {
            if let Some(why) = refused.lock().unwrap_or_else(|e| e.into_inner()).take() {
                return Err(error(ErrorCode::Denied, why));
            }
            Err(error(
                ErrorCode::Unavailable,
                format!("HTTP {}: {}", shown(&url), chain(e.as_ref())),
            ))
        }
        Err(_) => Err(error(
            ErrorCode::Unavailable,
            format!(
                "HTTP {}: no complete response within {} ms (the request's timeout or the \
                 call's time limit, whichever is sooner)",
                shown(&url),
                timeout.as_millis()
            ),
        )),
    }
}

/// Why the guarded resolver refused an address, when it did: the call's error then says
/// that rather than the connection error it caused.
type Refusal = Arc<Mutex<Option<String>>>;

/// A client for one call: no proxy, redirects only on granted same-host URLs, and names
/// resolved by a [`GuardedResolver`], which leaves in the [`Refusal`] what it refused.
fn guarded_client(
    plugin: &str,
    grants: &BTreeSet<String>,
) -> Result<(reqwest::Client, Refusal), PluginError> {
    let refused = Refusal::default();
    let resolver = Arc::new(GuardedResolver {
        plugin: plugin.to_string(),
        refused: refused.clone(),
    });
    let client = crate::net::client(|builder| {
        builder
            // A proxy would resolve the name itself, out of the resolver's reach.
            .no_proxy()
            .redirect(redirect_policy(grants.clone()))
            .dns_resolver(resolver.clone())
    })
    .map_err(|e| error(ErrorCode::Unavailable, e))?;
    Ok((client, refused))
}

/// A plugin's request once checked against its grants and the caps: what is sent.
struct CheckedRequest {
    url: Url,
    method: reqwest::Method,
    headers: HeaderMap,
    body: Vec<u8>,
    /// The plugin's own timeout; 0 for none.
    timeout_ms: u32,
}

impl CheckedRequest {
    /// `request` checked: a granted URL, a method a plugin may use, headers and body
    /// within the caps.
    fn check(grants: &BTreeSet<String>, request: http::Request) -> Result<Self, PluginError> {
        let url = parse_url(&request.url)?;
        let host = url.host_str().unwrap_or_default().to_string();
        if !is_granted(grants, &url) {
            return Err(error(
                ErrorCode::Denied,
                format!("HTTP to `{host}` is not granted (declare it and grant it with --allow-http {host})"),
            ));
        }
        let method = reqwest::Method::from_bytes(request.method.as_bytes())
            .ok()
            .filter(|m| *m != reqwest::Method::CONNECT)
            .ok_or_else(|| {
                error(
                    ErrorCode::InvalidInput,
                    format!(
                        "`{}` is not an HTTP method a plugin may use (GET, POST, … ; not CONNECT)",
                        super::imports::sanitize(&request.method, 40)
                    ),
                )
            })?;
        let headers = request_headers(&request.headers)?;
        if request.body.len() > MAX_REQUEST_BODY {
            return Err(error(
                ErrorCode::InvalidInput,
                format!(
                    "the request body is {} bytes; at most {MAX_REQUEST_BODY} are allowed",
                    request.body.len()
                ),
            ));
        }
        Ok(Self {
            url,
            method,
            headers,
            body: request.body,
            timeout_ms: request.timeout_ms,
        })
    }

    /// Sends the request with `client` and reads the response, its body capped at
    /// [`MAX_RESPONSE_BODY`].
    async fn exchange(
        self,
        client: &reqwest::Client,
    ) -> Result<http::Response, Box<dyn std::error::Error + Send + Sync>> {
        let response = client
            .request(self.method, self.url)
            .headers(self.headers)
            .body(self.body)
            .send()
            .await
            // The URL is in the message already, without its query.
            .map_err(reqwest::Error::without_url)?;
        let status = response.status().as_u16();
        let headers = response
            .headers()
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_string(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect();
        let body = crate::net::read_capped(response, MAX_RESPONSE_BODY).await?;
        Ok(http::Response {
            status,
            headers,
            body,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(text: &str) -> IpAddr {
        text.parse().unwrap()
    }

    #[test]
    fn non_public_addresses_are_classified() {
        for (addr, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("10.0.0.5", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("::", "unspecified"),
            ("::1", "loopback"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("64:ff9b::a00:5", "private"),
            ("2002:a9fe:a9fe::1", "link-local"),
            ("fc00::1", "private (unique local)"),
            ("fd12:3456::1", "private (unique local)"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("ff02::1", "multicast"),
            ("2001:db8::1", "documentation"),
        ] {
            assert_eq!(non_public(ip(addr)), Some(kind), "{addr}");
        }
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "169.253.1.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
        ] {
            assert_eq!(non_public(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn a_name_resolving_to_a_non_public_address_is_refused_naming_what_to_grant() {
        // DNS rebinding: a public name whose answer includes a private address.
        let why = refuse_resolved(
            "p 1.0",
            "api.example.com",
            &[ip("93.184.216.34"), ip("10.0.0.5")],
        )
        .unwrap();
        assert!(why.contains("plugin p 1.0"), "{why}");
        assert!(why.contains("`api.example.com`"), "{why}");
        assert!(why.contains("10.0.0.5, a private address"), "{why}");
        assert!(why.contains("--allow-http 10.0.0.5:PORT"), "{why}");
        let metadata = refuse_resolved("p", "metadata.internal", &[ip("169.254.169.254")]).unwrap();
        assert!(metadata.contains("link-local"), "{metadata}");
        let v6 = refuse_resolved("p", "h", &[ip("fe80::1")]).unwrap();
        assert!(v6.contains("--allow-http [fe80::1]:PORT"), "{v6}");
        assert_eq!(refuse_resolved("p", "h", &[ip("93.184.216.34")]), None);
    }

    #[tokio::test]
    async fn the_resolver_refuses_localhost_before_connecting() {
        let refused = Arc::new(Mutex::new(None));
        let resolver = GuardedResolver {
            plugin: "p".into(),
            refused: refused.clone(),
        };
        let result = resolver.resolve("localhost".parse().unwrap()).await;
        assert!(result.is_err());
        let why = refused.lock().unwrap().clone().unwrap();
        assert!(why.contains("a loopback address"), "{why}");
    }

    #[test]
    fn grants_match_host_or_host_and_port() {
        let grants: BTreeSet<String> = ["api.example.com", "127.0.0.1:8080", "[::1]"]
            .into_iter()
            .map(String::from)
            .collect();
        let granted = |url: &str| is_granted(&grants, &parse_url(url).unwrap());
        assert!(granted("https://API.example.com/v1?q"));
        assert!(granted("http://127.0.0.1:8080/"));
        assert!(!granted("http://127.0.0.1:8081/"));
        assert!(!granted("http://127.0.0.1/"));
        assert!(granted("http://[::1]:9/"));
        assert!(!granted("https://api.example.com.evil.net/"));
        // The URL parser's normal form is what is compared: 127.1 is 127.0.0.1.
        assert!(granted("http://127.1:8080/"));
    }

    #[test]
    fn bad_urls_and_headers_are_invalid_input() {
        for url in [
            "file:///etc/passwd",
            "https://evil@api.example.com/",
            "ftp://x/",
            "http://",
        ] {
            assert_eq!(
                parse_url(url).unwrap_err().code,
                ErrorCode::InvalidInput,
                "{url}"
            );
        }
        let bad = |name: &str, value: &str| {
            request_headers(&[(name.to_string(), value.to_string())])
                .unwrap_err()
                .message
        };
        assert!(bad("Host", "other.example").contains("`host` is set by the host"));
        assert!(bad("Transfer-Encoding", "chunked").contains("set by the host"));
        assert!(bad("bad name", "x").contains("not a valid header name"));
        assert!(bad("x-a", "a\r\nInjected: 1").contains("not a valid header value"));
        let many: Vec<(String, String)> = (0..65).map(|i| (format!("x-{i}"), "v".into())).collect();
        assert!(request_headers(&many)
            .unwrap_err()
            .message
            .contains("at most 64"));
        assert!(request_headers(&[("x-ok".into(), "v".into())]).is_ok());
    }
}
