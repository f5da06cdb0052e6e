//! Egress by name (`network=allow:HOST,…`): a sandboxed machine has no network but its own
//! loopback, and one way out, an HTTP proxy that lets through only the hosts the operator
//! named.
//!
//! Two halves, joined by a unix socket in the machine's directory (which its sandbox shows at
//! the same path):
//! - [`EgressProxy`], in mst outside the sandbox, decides: `CONNECT host:port` (HTTPS) or an
//!   absolute-form request (`GET http://host/…`) to a host on the list, by name; an IP literal
//!   only when the list names it; a name whose addresses are not public (loopback, private,
//!   link-local, …) only when the list names the address. Everything else gets a 403 saying
//!   why.
//! - [`TrialForwarder`], in the worker inside the sandbox, listens on a loopback port of the
//!   trial's own (`HTTP_PROXY`/`HTTPS_PROXY` for its programs), passes each connection to the
//!   socket, and notes each request and the proxy's answer, which the worker writes into the
//!   trial's trace as `egress` events.
//!
//! Where no socket can join them (a container: mst binds nothing into one), a [`Tunnel`] at
//! each end carries the connections over the shard protocol instead: the worker's forwarder
//! gets one end of a local socket pair whose bytes travel as `egress-data` lines, and the
//! coordinator hands the other end of its own pair to the same [`EgressGate`].

use crate::net::non_public;
use std::io::{Read, Write};
use std::net::{IpAddr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// The most bytes of a request's head (its request line and headers) read before it is
/// refused: a proxy request's head is small.
const MAX_HEAD: usize = 16 * 1024;

/// The most connections one machine's proxy relays at once; past it a request gets a 503, so
/// that a flood from the machine costs mst a bounded number of threads.
const MAX_CONNECTIONS: usize = 64;

/// How long either half waits for a request's head before it drops the connection.
const HEAD_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the proxy waits for an allowed host to accept a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The hosts a machine may reach: names (`pypi.org`, or `*.pythonhosted.org` for any name
/// below one) and IP addresses, as the operator wrote them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allowed {
    entries: Vec<String>,
}

impl Allowed {
    /// The list of `network=allow:HOST,…` (`list` without the `allow:`): refused when empty,
    /// or when an entry is no host name or address.
    pub fn parse(list: &str) -> Result<Self, String> {
        let mut entries = Vec::new();
        for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let name = entry.strip_prefix("*.").unwrap_or(entry);
            let valid = entry.parse::<IpAddr>().is_ok()
                || (!name.is_empty()
                    && name.split('.').all(|l| {
                        !l.is_empty() && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                    }));
            if !valid {
                return Err(format!(
                    "`{entry}` is no host name (`pypi.org`, `*.example.com`) or IP address"
                ));
            }
            entries.push(entry.to_ascii_lowercase());
        }
        if entries.is_empty() {
            return Err("`allow:` names no host".into());
        }
        Ok(Allowed { entries })
    }

    /// The entries, as `allow:` lists them again.
    pub fn entries(&self) -> &[String] {
        &self.entries
    }

    /// Whether the list names `host` (a name, or an address written as one).
    fn names(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        self.entries
            .iter()
            .any(|entry| match entry.strip_prefix("*.") {
                Some(domain) => host.ends_with(&format!(".{domain}")),
                None => *entry == host,
            })
    }

    /// Where `host:port` may be reached, or why not: the addresses it resolves to, each public
    /// unless the list names that address itself.
    fn resolve(&self, host: &str, port: u16) -> Result<Vec<SocketAddr>, String> {
        let literal = host.trim_start_matches('[').trim_end_matches(']');
        if let Ok(ip) = literal.parse::<IpAddr>() {
            return match self.names(&ip.to_string()) {
                true => Ok(vec![SocketAddr::new(ip, port)]),
                false => Err(format!(
                    "{ip} is an address the operator did not name (network=allow: names hosts)"
                )),
            };
        }
        if !self.names(host) {
            return Err(format!(
                "{host} is not on the operator's list (network=allow:…)"
            ));
        }
        let addrs: Vec<SocketAddr> = (host, port)
            .to_socket_addrs()
            .map_err(|e| format!("{host} does not resolve: {e}"))?
            .collect();
        if let Some(refused) = addrs
            .iter()
            .find(|a| non_public(a.ip()).is_some() && !self.names(&a.ip().to_string()))
        {
            return Err(format!(
                "{host} resolves to {}, a {} address the operator did not name",
                refused.ip(),
                non_public(refused.ip()).unwrap_or("non-public")
            ));
        }
        Ok(addrs)
    }
}

/// The deciding half for one machine: each connection it is given is served on a thread of
/// its own, at most [`MAX_CONNECTIONS`] at once.
#[derive(Clone)]
pub struct EgressGate {
    allowed: Arc<Allowed>,
    open: Arc<std::sync::atomic::AtomicUsize>,
}

impl EgressGate {
    /// A gate letting through `allowed`.
    pub fn new(allowed: Allowed) -> Self {
        EgressGate {
            allowed: Arc::new(allowed),
            open: Arc::default(),
        }
    }

    /// Serves the connection `stream` (its request decided, then relayed), or answers 503
    /// when too many are open.
    pub fn accept(&self, mut stream: UnixStream) {
        if self.open.fetch_add(1, Ordering::SeqCst) >= MAX_CONNECTIONS {
            self.open.fetch_sub(1, Ordering::SeqCst);
            let why = format!("{MAX_CONNECTIONS} connections are open already");
            return refuse(&mut stream, 503, &why);
        }
        let gate = self.clone();
        std::thread::spawn(move || {
            serve(stream, &gate.allowed);
            gate.open.fetch_sub(1, Ordering::SeqCst);
        });
    }
}

/// The proxy half, outside the sandbox: answers the machine's connections on its socket
/// until dropped.
pub struct EgressProxy {
    socket: PathBuf,
    stop: Arc<AtomicBool>,
}

impl EgressProxy {
    /// Listens on `socket` (created here; the machine's directory holds it) for `allowed`.
    pub fn start(socket: &Path, allowed: Allowed) -> std::io::Result<Self> {
        let listener = UnixListener::bind(socket)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let gate = EgressGate::new(allowed);
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    gate.accept(stream);
                }
            }
        });
        Ok(EgressProxy {
            socket: socket.to_path_buf(),
            stop,
        })
    }
}

impl Drop for EgressProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wakes the accepting thread, which then sees the flag.
        let _ = UnixStream::connect(&self.socket);
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// One client connection: its request decided, then, if allowed, relayed both ways.
fn serve(mut client: UnixStream, allowed: &Allowed) {
    let _ = client.set_read_timeout(Some(HEAD_TIMEOUT));
    let Ok(head) = read_head(&mut client) else {
        return;
    };
    let _ = client.set_read_timeout(None);
    let request = match Request::parse(&head) {
        Ok(request) => request,
        Err(why) => return refuse(&mut client, 400, &why),
    };
    let addrs = match allowed.resolve(&request.host, request.port) {
        Ok(addrs) => addrs,
        Err(why) => return refuse(&mut client, 403, &why),
    };
    let upstream = addrs
        .iter()
        .find_map(|addr| TcpStream::connect_timeout(addr, CONNECT_TIMEOUT).ok());
    let Some(mut upstream) = upstream else {
        let why = format!(
            "{}:{} did not accept a connection",
            request.host, request.port
        );
        return refuse(&mut client, 502, &why);
    };
    let sent = match &request.forward {
        None => client.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n"),
        Some(head) => upstream.write_all(head),
    };
    if sent.is_ok() {
        relay(client, upstream);
    }
}

/// Answers `status` with `why` and closes.
fn refuse(client: &mut UnixStream, status: u16, why: &str) {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        503 => "Service Unavailable",
        _ => "Bad Gateway",
    };
    let body = format!("mst egress: {why}\n");
    let _ = write!(
        client,
        "HTTP/1.1 {status} {reason}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\n\
         connection: close\r\n\r\n{body}",
        body.len()
    );
}

/// A connection [`relay`] copies between: a unix or a TCP stream.
trait Duplex: Read + Write + Send + Sized + 'static {
    fn try_clone(&self) -> std::io::Result<Self>;
    fn shutdown_write(&self);
}

impl Duplex for UnixStream {
    fn try_clone(&self) -> std::io::Result<Self> {
        UnixStream::try_clone(self)
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

impl Duplex for TcpStream {
    fn try_clone(&self) -> std::io::Result<Self> {
        TcpStream::try_clone(self)
    }
    fn shutdown_write(&self) {
        let _ = self.shutdown(Shutdown::Write);
    }
}

/// Copies bytes both ways between `a` and `b` until either side closes.
fn relay(a: impl Duplex, b: impl Duplex) {
    let (Ok(mut a_in), Ok(mut b_in)) = (a.try_clone(), b.try_clone()) else {
        return;
    };
    let (mut a_out, mut b_out) = (a, b);
    let up = std::thread::spawn(move || {
        let _ = std::io::copy(&mut a_in, &mut b_out);
        b_out.shutdown_write();
    });
    let _ = std::io::copy(&mut b_in, &mut a_out);
    a_out.shutdown_write();
    let _ = up.join();
}

/// Reads a request's head, up to its blank line, byte by byte (nothing after it is consumed),
/// at most [`MAX_HEAD`] bytes.
fn read_head(stream: &mut impl Read) -> std::io::Result<Vec<u8>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() >= MAX_HEAD || stream.read(&mut byte)? == 0 {
            return Err(std::io::ErrorKind::InvalidData.into());
        }
        head.push(byte[0]);
    }
    Ok(head)
}

/// A proxy request: where it goes, and for an absolute-form request the head to send there.
#[derive(Debug, PartialEq)]
struct Request {
    host: String,
    port: u16,
    /// `None` for `CONNECT`; else the head with its target in origin form (`/path`).
    forward: Option<Vec<u8>>,
}

impl Request {
    fn parse(head: &[u8]) -> Result<Request, String> {
        let text = String::from_utf8_lossy(head);
        let line = text.lines().next().unwrap_or_default();
        let mut words = line.split(' ');
        let (method, target) = match (words.next(), words.next()) {
            (Some(method), Some(target)) => (method, target),
            _ => return Err(format!("not an HTTP request line: {line:?}")),
        };
        if method == "CONNECT" {
            let (host, port) = split_port(target, None)?;
            return Ok(Request {
                host,
                port,
                forward: None,
            });
        }
        let rest = target.strip_prefix("http://").ok_or_else(|| {
            format!("`{method} {target}`: a proxy takes `CONNECT host:port` or an `http://` URL")
        })?;
        let (authority, path) = match rest.find('/') {
            Some(at) => (&rest[..at], &rest[at..]),
            None => (rest, "/"),
        };
        let (host, port) = split_port(authority, Some(80))?;
        let forward = text.replacen(target, path, 1).into_bytes();
        Ok(Request {
            host,
            port,
            forward: Some(forward),
        })
    }
}

/// `host:port` (or `[v6]:port`), the port `default` when missing.
fn split_port(authority: &str, default: Option<u16>) -> Result<(String, u16), String> {
    let (host, port) = match authority.rsplit_once(':') {
        Some((host, port)) if !port.contains(']') => (host, Some(port)),
        _ => (authority, None),
    };
    let port = match (port, default) {
        (Some(port), _) => port
            .parse()
            .map_err(|_| format!("`{authority}`: a bad port"))?,
        (None, Some(default)) => default,
        (None, None) => return Err(format!("`{authority}` names no port")),
    };
    if host.is_empty() || host.contains('@') {
        return Err(format!("`{authority}` names no host"));
    }
    Ok((host.to_string(), port))
}

/// One request a trial's program sent through the proxy, and the proxy's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRecord {
    /// Its request line (`CONNECT pypi.org:443 HTTP/1.1`).
    pub request: String,
    /// The proxy's status: 200 (through), 403 (not allowed), 400, 502, 503; 0 when none came.
    pub status: u16,
}

/// How a trial's forwarder reaches the deciding half: a new connection to it each call.
pub type Connector = Arc<dyn Fn() -> std::io::Result<UnixStream> + Send + Sync>;

/// A [`Connector`] to the proxy listening on `socket`.
pub fn socket_connector(socket: &Path) -> Connector {
    let socket = socket.to_path_buf();
    Arc::new(move || UnixStream::connect(&socket))
}

/// The most bytes one tunnelled message carries: base64 of it fits a protocol line.
pub const TUNNEL_CHUNK: usize = 32 * 1024;

/// Chunks waiting to be written into one tunnelled connection; past it the connection is cut
/// (its reader is not keeping up), so a flood costs bounded memory.
const TUNNEL_QUEUE: usize = 64;

/// What a [`Tunnel`] sends the other end: bytes of connection `conn`, or its end (`None`).
pub type TunnelSend = Box<dyn Fn(u32, Option<&[u8]>) + Send + Sync>;

/// One end of connections carried over a line protocol: each connection a local unix stream,
/// whose bytes go out through `send` and whose incoming bytes are written by a thread of its
/// own, queued at most [`TUNNEL_QUEUE`] chunks deep.
pub struct Tunnel {
    send: Arc<TunnelSend>,
    writers: Mutex<std::collections::BTreeMap<u32, std::sync::mpsc::SyncSender<Vec<u8>>>>,
    next: std::sync::atomic::AtomicU32,
}

impl Tunnel {
    /// A tunnel end sending through `send`.
    pub fn new(send: TunnelSend) -> Arc<Self> {
        Arc::new(Tunnel {
            send: Arc::new(send),
            writers: Mutex::default(),
            next: Default::default(),
        })
    }

    /// A new connection number, for the end that opens connections.
    pub fn next_conn(&self) -> u32 {
        self.next.fetch_add(1, Ordering::SeqCst)
    }

    /// Carries connection `conn` on `stream`: what is read from it is sent, what arrives for
    /// it is written to it.
    pub fn attach(self: &Arc<Self>, conn: u32, stream: UnixStream) -> std::io::Result<()> {
        let mut reading = stream.try_clone()?;
        let (queue, queued) = std::sync::mpsc::sync_channel::<Vec<u8>>(TUNNEL_QUEUE);
        self.writers.lock().expect("tunnel").insert(conn, queue);
        let tunnel = self.clone();
        std::thread::spawn(move || {
            let mut chunk = vec![0u8; TUNNEL_CHUNK];
            loop {
                match reading.read(&mut chunk) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => (tunnel.send)(conn, Some(&chunk[..n])),
                }
            }
            (tunnel.send)(conn, None);
        });
        std::thread::spawn(move || {
            let mut writing = stream;
            for bytes in queued {
                if writing.write_all(&bytes).is_err() {
                    break;
                }
            }
            let _ = writing.shutdown(Shutdown::Write);
        });
        Ok(())
    }

    /// Bytes for connection `conn` (`None`: the other end closed it). A connection whose
    /// queue is full is cut; one that is gone is ignored.
    pub fn deliver(&self, conn: u32, bytes: Option<Vec<u8>>) {
        let mut writers = self.writers.lock().expect("tunnel");
        let Some(bytes) = bytes else {
            writers.remove(&conn);
            return;
        };
        let cut = match writers.get(&conn) {
            Some(queue) => queue.try_send(bytes).is_err(),
            None => false,
        };
        if cut {
            writers.remove(&conn);
        }
    }
}

/// The worker's half for one trial: a loopback port whose connections go to the proxy's
/// socket, each noted. Stopped (and its notes taken) by [`TrialForwarder::finish`].
pub struct TrialForwarder {
    port: u16,
    stop: Arc<AtomicBool>,
    records: Arc<Mutex<Vec<EgressRecord>>>,
}

impl TrialForwarder {
    /// A forwarder to the proxy `connect` reaches, on a fresh loopback port.
    pub fn start(connect: &Connector) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0))?;
        let port = listener.local_addr()?.port();
        let stop = Arc::new(AtomicBool::new(false));
        let records = Arc::new(Mutex::new(Vec::new()));
        let (stopped, noted, connect) = (stop.clone(), records.clone(), connect.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stopped.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(stream) = stream else { continue };
                let (noted, connect) = (noted.clone(), connect.clone());
                std::thread::spawn(move || forward(stream, &connect, &noted));
            }
        });
        Ok(TrialForwarder {
            port,
            stop,
            records,
        })
    }

    /// The loopback port the trial's programs use as their proxy.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Stops listening; what went through it, in order.
    pub fn finish(self) -> Vec<EgressRecord> {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        std::mem::take(&mut *self.records.lock().expect("egress records"))
    }
}

/// One connection of a trial's program: its head passed to the proxy, the answer's status
/// noted, then relayed both ways.
fn forward(mut client: TcpStream, connect: &Connector, records: &Mutex<Vec<EgressRecord>>) {
    let _ = client.set_read_timeout(Some(HEAD_TIMEOUT));
    let Ok(head) = read_head(&mut client) else {
        return;
    };
    let _ = client.set_read_timeout(None);
    let request = String::from_utf8_lossy(&head)
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .take(512)
        .collect::<String>();
    let note = |status: u16| {
        records.lock().expect("egress records").push(EgressRecord {
            request: request.clone(),
            status,
        })
    };
    let Ok(mut proxy) = connect() else {
        return note(0);
    };
    if proxy.write_all(&head).is_err() {
        return note(0);
    }
    // The answer's status line, read a byte at a time and passed on as it is.
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while !line.ends_with(b"\n") && line.len() < 256 {
        match proxy.read(&mut byte) {
            Ok(1) => line.push(byte[0]),
            _ => break,
        }
    }
    let status = String::from_utf8_lossy(&line)
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    note(status);
    if client.write_all(&line).is_ok() {
        relay(client, proxy);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_tunnel_ends_carry_a_connection_both_ways_and_its_end() {
        use std::sync::mpsc;
        type Carried = (u32, Option<Vec<u8>>);
        // What each end sends, the other is delivered, as the protocol's lines would.
        let (to_b, for_b) = mpsc::channel::<Carried>();
        let (to_a, for_a) = mpsc::channel::<Carried>();
        let a = Tunnel::new(Box::new(move |c, bytes| {
            let _ = to_b.send((c, bytes.map(<[u8]>::to_vec)));
        }));
        let b = Tunnel::new(Box::new(move |c, bytes| {
            let _ = to_a.send((c, bytes.map(<[u8]>::to_vec)));
        }));
        let (a_to, b_to) = (a.clone(), b.clone());
        std::thread::spawn(move || for_b.into_iter().for_each(|(c, x)| b_to.deliver(c, x)));
        std::thread::spawn(move || for_a.into_iter().for_each(|(c, x)| a_to.deliver(c, x)));
        let (mut program, a_end) = UnixStream::pair().unwrap();
        let (b_end, mut service) = UnixStream::pair().unwrap();
        let conn = a.next_conn();
        b.attach(conn, b_end).unwrap();
        a.attach(conn, a_end).unwrap();
        program.write_all(b"ping").unwrap();
        program.shutdown(Shutdown::Write).unwrap();
        let mut heard = Vec::new();
        service.read_to_end(&mut heard).unwrap();
        assert_eq!(heard, b"ping");
        service.write_all(b"pong").unwrap();
        service.shutdown(Shutdown::Write).unwrap();
        let mut answer = Vec::new();
        program.read_to_end(&mut answer).unwrap();
        assert_eq!(answer, b"pong");
    }

    #[test]
    fn the_list_takes_names_wildcard_domains_and_addresses_only() {
        let allowed = Allowed::parse("pypi.org, *.pythonhosted.org,127.0.0.1").unwrap();
        assert!(allowed.names("PyPI.org") && allowed.names("files.pythonhosted.org"));
        assert!(!allowed.names("pythonhosted.org") && !allowed.names("evil.org"));
        for bad in ["", "a b", "http://x", "*.", "x..y"] {
            assert!(Allowed::parse(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn addresses_pass_only_where_the_list_names_them() {
        let allowed = Allowed::parse("localhost,127.0.0.1").unwrap();
        assert!(allowed.resolve("127.0.0.1", 80).is_ok());
        let unnamed = allowed.resolve("10.0.0.1", 80).unwrap_err();
        assert!(unnamed.contains("did not name"), "{unnamed}");
        // A name resolving to loopback passes here only because the list names 127.0.0.1.
        let by_name = Allowed::parse("localhost").unwrap();
        let private = by_name.resolve("localhost", 80).unwrap_err();
        assert!(private.contains("loopback"), "{private}");
        assert!(by_name
            .resolve("example.com", 443)
            .unwrap_err()
            .contains("not on"));
    }

    #[test]
    fn requests_are_read_as_connect_or_absolute_form() {
        let connect = Request::parse(b"CONNECT pypi.org:443 HTTP/1.1\r\nhost: x\r\n\r\n").unwrap();
        assert_eq!(
            (connect.host.as_str(), connect.port, connect.forward),
            ("pypi.org", 443, None)
        );
        let get =
            Request::parse(b"GET http://a.org/simple/x HTTP/1.1\r\nhost: a.org\r\n\r\n").unwrap();
        assert_eq!((get.host.as_str(), get.port), ("a.org", 80));
        assert!(String::from_utf8(get.forward.unwrap())
            .unwrap()
            .starts_with("GET /simple/x HTTP/1.1"));
        for bad in [
            &b"GET /x HTTP/1.1\r\n\r\n"[..],
            b"CONNECT a.org HTTP/1.1\r\n\r\n",
            b"CONNECT u@a.org:1 HTTP/1.1\r\n\r\n",
        ] {
            assert!(
                Request::parse(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
