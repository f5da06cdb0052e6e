//! `mst serve`: the playground, behind its HTTP API or (with `--mcp`) its MCP tools on stdio.

use crate::home::Home;
use crate::results::ResultsRoot;
use crate::serve::batch_runs::{BatchRun, BatchRuns};
use crate::serve::{http, mcp, Playground, ServeRequest};
use crate::shard::coordinator::ShardSettings;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// `mst serve`.
#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// The eval (its variants are what sessions run), plugins, runner, secrets and results.
    #[command(flatten)]
    setup: super::run::SetupArgs,
    /// Where to listen. Loopback by default; any other address needs --token-file.
    #[arg(long, default_value = "127.0.0.1:7420", value_name = "ADDR:PORT")]
    listen: SocketAddr,
    /// Serve the playground as MCP tools on stdin/stdout instead of HTTP (for an agent that
    /// starts `mst serve --mcp` as its MCP server). Ends, closing every session, when stdin
    /// closes.
    #[arg(long, conflicts_with_all = ["listen", "token_file"])]
    mcp: bool,
    /// A file holding the access token every request must send as `Authorization: Bearer
    /// TOKEN`. Without it, mst serve makes a new token and prints it in the URL it listens on.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// Serve with no access token (loopback only): then any local user or process can run
    /// agents with your secrets and read every stored run.
    #[arg(long, conflicts_with_all = ["token_file", "mcp"])]
    no_token: bool,
    /// A session with no task for this long is closed and its machine disposed of.
    #[arg(long, default_value_t = 1800.0, value_name = "SECONDS")]
    idle_ttl: f64,
    /// A worker that sends nothing for this long is lost.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    silence_limit: f64,
    /// The most tokens (in and out, as the traces' usage events count them) all sessions
    /// together may spend; a session's own `budget` is reserved out of it.
    #[arg(long, value_name = "TOKENS")]
    budget_tokens: Option<u64>,
    /// The most US dollars all sessions together may spend (calls to priced models).
    #[arg(long, value_name = "USD")]
    budget_cost: Option<f64>,
    /// The most sessions open at once; each holds a machine.
    #[arg(long, default_value_t = 16, value_name = "N")]
    max_sessions: usize,
    /// The most batch runs started from the page or the API running at once.
    #[arg(long, default_value_t = 2, value_name = "N")]
    max_runs: usize,
    /// On close, how long a running task's worker has to stop before it is killed.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    cancel_grace: f64,
}

/// Runs `mst serve` until Ctrl-C or SIGTERM (or, with `--mcp`, until stdin closes), then closes
/// every session.
pub(crate) fn run(home: &Home, args: ServeArgs) -> Result<u8> {
    // Taken before anything can print: with --mcp, stdout is the protocol's alone.
    let protocol = if args.mcp {
        Some(mcp::take_stdio()?)
    } else {
        None
    };
    let token = match &args.token_file {
        _ if args.mcp => None,
        Some(path) => {
            let bytes = crate::files::read_input(path)
                .with_context(|| format!("cannot read --token-file {}", path.display()))?;
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
            if mode & 0o077 != 0 {
                bail!(
                    "--token-file {}: other users can read it (mode {:o}), and with it use the \
                     playground; `chmod 600` it",
                    path.display(),
                    mode & 0o777
                );
            }
            let token = String::from_utf8_lossy(&bytes).trim().to_string();
            if token.len() < 16 {
                bail!(
                    "--token-file {}: the token must be at least 16 characters",
                    path.display()
                );
            }
            Some(Access::Given(token))
        }
        None if !args.listen.ip().is_loopback() => bail!(
            "--listen {} is not a loopback address: give --token-file FILE so that only holders \
             of the token can use the playground",
            args.listen
        ),
        None if args.no_token => None,
        None => Some(Access::Minted(http::new_access_token())),
    };
    for (flag, n) in [
        ("--max-sessions", args.max_sessions),
        ("--max-runs", args.max_runs),
    ] {
        if n == 0 {
            bail!("{flag} must be at least 1");
        }
    }
    let setup = args.setup.setup()?;
    let budgeted = args.budget_tokens.is_some() || args.budget_cost.is_some();
    let live = Arc::new(BatchRuns::starting(home, &setup, args.max_runs, budgeted));
    let results = ResultsRoot::new(&setup.results_base);
    let request = ServeRequest {
        setup,
        settings: ShardSettings {
            silence: crate::eval::config::seconds("--silence-limit", args.silence_limit)?,
            cancel_grace: crate::eval::config::seconds("--cancel-grace", args.cancel_grace)?,
            ..ShardSettings::default()
        },
        idle_ttl: crate::eval::config::seconds("--idle-ttl", args.idle_ttl)?,
        budget: match args.budget_cost {
            Some(cost) if !(cost.is_finite() && cost >= 0.0) => {
                bail!("--budget-cost must be a number of US dollars ≥ 0, not {cost}")
            }
            cost_usd => crate::serve::budget::Limit {
                tokens: args.budget_tokens,
                cost_usd,
            },
        },
        max_sessions: args.max_sessions,
    };
    let playground = Arc::new(Playground::start(home, request).map_err(super::Exit::refused)?);
    let stop = Arc::new(tokio::sync::Notify::new());
    let on_signal = stop.clone();
    let _ = ctrlc::set_handler(move || on_signal.notify_one());
    let reaper = playground.clone();
    std::thread::spawn(move || loop {
        std::thread::sleep(Duration::from_millis(500));
        reaper.reap();
    });
    let runtime = tokio::runtime::Runtime::new()?;
    if let Some((input, output)) = protocol {
        let served = runtime.block_on(mcp::serve(
            playground.clone(),
            tokio::fs::File::from_std(input),
            tokio::fs::File::from_std(output),
            stop,
        ));
        playground.close_all("mst serve stopped");
        // A read of stdin still pending on a blocking thread must not hold the exit up.
        runtime.shutdown_background();
        served?;
        return Ok(super::Code::Success.into());
    }
    let served = http::Served {
        playground: Some(playground.clone()),
        live: live.clone(),
        results,
    };
    runtime.block_on(serve_http(args.listen, served, token, stop))?;
    live.stop_all();
    playground.close_all("mst serve stopped");
    Ok(super::Code::Success.into())
}

/// The access token every API request must send.
enum Access {
    /// From `--token-file`: the operator has it.
    Given(String),
    /// Made for this server: printed in the URL it listens on, as Jupyter does.
    Minted(String),
}

impl Access {
    /// The token.
    fn token(&self) -> &str {
        match self {
            Access::Given(token) | Access::Minted(token) => token,
        }
    }

    /// The URL fragment that hands the web UI a minted token (`#token=…`); empty otherwise.
    fn fragment(&self) -> String {
        match self {
            Access::Given(_) => String::new(),
            Access::Minted(token) => format!("#token={token}"),
        }
    }
}

/// Serves `served` (the web UI and the API) on `listen` until `stop` is notified; the first line
/// on stdout says where (with a minted token, in the URL's fragment).
async fn serve_http(
    listen: SocketAddr,
    served: http::Served,
    access: Option<Access>,
    stop: Arc<tokio::sync::Notify>,
) -> Result<()> {
    let listener = tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| format!("cannot listen on {listen}"))?;
    let address = listener.local_addr()?;
    let fragment = access.as_ref().map(Access::fragment).unwrap_or_default();
    outln!("mst serve: listening on http://{address}/{fragment}");
    let token = access.as_ref().map(|access| access.token().to_string());
    axum::serve(listener, http::router(served, token))
        .with_graceful_shutdown(async move { stop.notified().await })
        .await
        .context("the server failed")
}

/// The web UI following one run, served from a thread of its own (`mst run --serve`) until
/// dropped.
pub(crate) struct Following {
    /// The run, heard as a reporter.
    pub run: Arc<BatchRun>,
    /// Where the UI is.
    pub address: SocketAddr,
    /// The access token its API asks for, made for it.
    pub token: String,
    stop: Arc<tokio::sync::Notify>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

impl Following {
    /// Serves the web UI on `listen` (loopback only) for the run `run` will hear, and the
    /// stored runs under `results`, behind a token made for it ([`Following::url`]).
    pub(crate) fn start(listen: SocketAddr, results: ResultsRoot) -> Result<Self> {
        if !listen.ip().is_loopback() {
            bail!(
                "--serve {listen} is not a loopback address: use `mst serve --token-file` to \
                 serve other hosts"
            );
        }
        let token = http::new_access_token();
        let router_token = token.clone();
        let run = Arc::new(BatchRun::default());
        let live = Arc::new(BatchRuns::default());
        live.track(run.clone());
        let served = http::Served {
            playground: None,
            live,
            results,
        };
        let stop = Arc::new(tokio::sync::Notify::new());
        let on_stop = stop.clone();
        let runtime = tokio::runtime::Runtime::new()?;
        // Bound here, so a port in use is an error before the run starts.
        let listener = std::net::TcpListener::bind(listen)
            .with_context(|| format!("cannot listen on {listen} (--serve)"))?;
        let address = listener.local_addr()?;
        listener.set_nonblocking(true)?;
        let thread = std::thread::spawn(move || {
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener)?;
                axum::serve(listener, http::router(served, Some(router_token)))
                    .with_graceful_shutdown(async move { on_stop.notified().await })
                    .await
                    .context("the server failed")
            })
        });
        Ok(Following {
            run,
            address,
            token,
            stop,
            thread: Some(thread),
        })
    }
}

impl Following {
    /// The web UI's page for `route` (`/runs/ID`), handing it the token.
    pub(crate) fn url(&self, route: &str) -> String {
        format!("http://{}/#{route}&token={}", self.address, self.token)
    }
}

impl Drop for Following {
    fn drop(&mut self) {
        self.stop.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
