//! `mst run` and `mst grade`. What they show as they go and at the end is
//! [`super::progress`]'s, `mst runs …` is [`super::runs`]'s, detached runs are
//! [`super::detach`]'s.

use super::plugin::SandboxArgs;
use super::progress::{print_summary, ReportKind, Reporter, Tee};
use crate::home::Home;
use crate::results::run_process::Collector;
use crate::results::ResultsRoot;
use crate::run::{self, RunRequest};
use crate::shard::coordinator::ShardSettings;
use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};

/// Set by Ctrl-C: shards send `cancel`, wait a grace period, then kill.
pub(super) static CANCEL: AtomicBool = AtomicBool::new(false);

/// Set once the run is over and `--serve` only serves its report: Ctrl-C then just stops that.
static SERVING_ONLY: AtomicBool = AtomicBool::new(false);

/// What `mst run` and `mst serve` share: the eval, its plugins and secrets, the runner and
/// where results go.
#[derive(Args, Debug)]
pub(crate) struct SetupArgs {
    /// The eval config.
    #[arg(long, short = 'c', default_value = "eval.json")]
    pub(crate) config: PathBuf,
    /// Load a plugin (.wasm file or installed name). Repeatable.
    #[arg(long = "plugin", value_name = "PLUGIN")]
    plugins: Vec<String>,
    /// Where machines come from: `local`, `docker`, or a runner plugin's name (loaded with
    /// --plugin or installed).
    #[arg(long, default_value = "local")]
    runner: String,
    /// A runner option, key=value (`shards`, `keep`, and the runner's own). Repeatable; over
    /// the defaults in `$MST_HOME/runners.json`.
    #[arg(long = "runner-option", value_name = "KEY=VALUE")]
    runner_options: Vec<String>,
    /// Where runs (and playground sessions) are stored.
    #[arg(long, default_value = ".mst/results", value_name = "DIR")]
    pub(crate) results_dir: PathBuf,
    /// Secrets (JSON object or dotenv): servers' `token`, `envSecrets` and `headerSecrets`, model
    /// providers' keys, `secretEnv` (a name written `env:VAR` is read from the environment instead).
    #[arg(long, value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// Grants and caps for plugins loaded with --plugin.
    #[command(flatten)]
    sandbox: SandboxArgs,
}

impl SetupArgs {
    /// The setup these flags describe, its secrets file read.
    pub(crate) fn setup(&self) -> Result<run::Setup> {
        Ok(run::Setup {
            config_path: self.config.clone(),
            results_base: self.results_dir.clone(),
            plugins: self.plugins.clone(),
            plugin_grants: self.sandbox.grants()?,
            plugin_limits: self.sandbox.limits()?,
            runner: self.runner.clone(),
            runner_options: self.runner_options.clone(),
            secrets: load_secrets(self.secrets_file.as_deref())?,
        })
    }
}

/// `mst run`.
#[derive(Args, Debug)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    setup: SetupArgs,
    /// Run only this variant. Repeatable.
    #[arg(long = "variant")]
    variants: Vec<String>,
    /// Run only this case id. Repeatable.
    #[arg(long = "case")]
    cases: Vec<String>,
    /// Repetitions of each case, overriding the config.
    #[arg(long)]
    trials: Option<u32>,
    /// Collect only the trials RUN_ID is missing, into the same run.
    #[arg(long, value_name = "RUN_ID")]
    resume: Option<String>,
    /// With --resume: go on even though the shard count, runner, datasets or a plugin changed
    /// since the run's first collection.
    #[arg(long, requires = "resume")]
    force: bool,
    /// Also write a JUnit XML report here.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
    /// Follow the run in the web UI at ADDR:PORT (loopback): progress and trials as they
    /// finish, then the report, served until Ctrl-C.
    #[arg(long, value_name = "ADDR:PORT")]
    serve: Option<std::net::SocketAddr>,
    /// A shard whose worker sends nothing (not even a heartbeat) for this long is lost.
    #[arg(long, default_value_t = 30.0, value_name = "SECONDS")]
    silence_limit: f64,
    /// After Ctrl-C, how long workers have to stop before they are killed.
    #[arg(long, default_value_t = 5.0, value_name = "SECONDS")]
    cancel_grace: f64,
    /// The most one shard may copy back (traces), in MiB; past it the shard stops.
    #[arg(long, default_value_t = 4096, value_name = "MIB")]
    max_shard_copy: u64,
    /// The most the whole run may copy back, in MiB; past it every shard stops.
    #[arg(long, default_value_t = 16384, value_name = "MIB")]
    max_run_copy: u64,
    /// No progress output.
    #[arg(long, short)]
    quiet: bool,
    /// Return as soon as the run exists: it goes on in the background, supervised by an mst
    /// of its own that logs its progress into the run directory (`mst runs attach RUN_ID`
    /// follows it, `mst runs stop RUN_ID` stops it).
    #[arg(long, conflicts_with = "serve")]
    detach: bool,
    /// The supervisor of a detached run (`--detach` starts it).
    #[arg(long, hide = true)]
    supervise: bool,
}

pub(crate) fn run(home: &Home, args: RunArgs) -> Result<u8> {
    if let Some(run_id) = &args.resume {
        super::detach::refuse_running(&args.setup.results_dir, run_id)
            .map_err(super::Exit::refused)?;
    }
    if args.detach {
        return super::detach::start(&args.setup.results_dir, args.json);
    }
    let _ = ctrlc::set_handler(|| {
        if CANCEL.swap(true, Ordering::SeqCst) {
            super::Code::Interrupted.exit();
        }
        if !SERVING_ONLY.load(Ordering::SeqCst) {
            eprintln!("\ninterrupted: stopping the shards (Ctrl-C again to quit at once)");
        }
    });
    let request = RunRequest {
        setup: args.setup.setup()?,
        filters: crate::eval::plan::Filters {
            variants: args.variants.clone(),
            cases: args.cases.clone(),
            trials: args.trials,
        },
        resume: args.resume.clone(),
        force: args.force,
        shard_settings: Some(ShardSettings {
            silence: crate::eval::config::seconds("--silence-limit", args.silence_limit)?,
            cancel_grace: crate::eval::config::seconds("--cancel-grace", args.cancel_grace)?,
            max_shard_copy_bytes: args.max_shard_copy.saturating_mul(1 << 20),
            max_run_copy_bytes: args.max_run_copy.saturating_mul(1 << 20),
            ..ShardSettings::default()
        }),
        collector: match args.supervise {
            true => Collector::Supervisor,
            false => Collector::Terminal,
        },
    };
    let following = args
        .serve
        .map(|listen| {
            super::serve::Following::start(listen, ResultsRoot::new(&request.setup.results_base))
        })
        .transpose()
        .map_err(super::Exit::refused)?;
    let reporter = Reporter::with(
        args.quiet,
        args.json,
        args.junit.clone(),
        ReportKind::Run(args.setup.config.clone()),
    );
    let supervision = args
        .supervise
        .then(|| super::detach::Supervision::new(&args.setup.results_dir));
    let tee = Tee {
        supervision: supervision.as_ref(),
        terminal: &reporter,
        following: following.as_ref(),
    };
    let outcome = match run::run(home, &request, &tee, &CANCEL) {
        Ok(outcome) => outcome,
        Err(error) => return Err(super::Exit::refused(error)),
    };
    reporter.print(&outcome.summary);
    let failure = reporter.take_failure();
    if let Some(following) = &following {
        SERVING_ONLY.store(true, Ordering::SeqCst);
        following.run.end(None);
        let url = following.url(&format!("/runs/{}", outcome.record.run_id));
        errln!("mst run: the report stays at {url} until Ctrl-C");
        while !CANCEL.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }
    match failure {
        Some(error) => Err(error),
        None => Ok(outcome.summary.exit_code()),
    }
}

/// The secrets `--secrets-file` names, or none.
pub(crate) fn load_secrets(path: Option<&std::path::Path>) -> Result<crate::secrets::Secrets> {
    path.map_or_else(
        || Ok(crate::secrets::Secrets::default()),
        crate::secrets::Secrets::load,
    )
}

/// `mst grade`.
#[derive(Args, Debug)]
pub(crate) struct GradeArgs {
    /// The run whose traces to regrade.
    run_id: String,
    /// The eval config whose judges to use [default: the one the run recorded].
    #[arg(long, short = 'c')]
    config: Option<PathBuf>,
    /// Load a plugin (.wasm file or installed name). Repeatable.
    #[arg(long = "plugin", value_name = "PLUGIN")]
    plugins: Vec<String>,
    #[arg(long, default_value = ".mst/results", value_name = "DIR")]
    results_dir: PathBuf,
    #[arg(long)]
    json: bool,
    /// Secrets (JSON object or dotenv): the keys of the model providers judges may call.
    #[arg(long, value_name = "FILE")]
    secrets_file: Option<PathBuf>,
    /// Run the judges in grade shards on this runner's machines (`local`, `docker`, or a
    /// runner plugin's name) instead of in this process.
    #[arg(long)]
    runner: Option<String>,
    /// A runner option, key=value (`shards`, `keep`, and the runner's own). Repeatable; over
    /// the defaults in `$MST_HOME/runners.json`.
    #[arg(long = "runner-option", value_name = "KEY=VALUE", requires = "runner")]
    runner_options: Vec<String>,
    /// Go on with the regrade RUN_ID.gN (on machines): grade only the trials it lacks.
    #[arg(long, value_name = "RUN_ID.gN", requires = "runner")]
    resume: Option<String>,
    /// With --resume: go on even though the runner, its options, the shard count, the config,
    /// the datasets or a plugin changed since the regrade began.
    #[arg(long, requires = "resume")]
    force: bool,
    /// No progress output (with --runner).
    #[arg(long, short, requires = "runner")]
    quiet: bool,
    #[command(flatten)]
    sandbox: SandboxArgs,
}

pub(crate) fn grade(home: &Home, args: GradeArgs) -> Result<u8> {
    let dir = ResultsRoot::new(&args.results_dir).find(&args.run_id)?;
    // This command line, without any --resume of its own, continues what it leaves.
    let mut words = Vec::new();
    let mut given = std::env::args_os()
        .skip(1)
        .map(|word| word.to_string_lossy().into_owned());
    while let Some(word) = given.next() {
        match word.as_str() {
            "--resume" => drop(given.next()),
            _ if word.starts_with("--resume=") => {}
            _ => words.push(word),
        }
    }
    words.push("--resume".into());
    let resume_hint = crate::runner::shell_words("mst", &words);
    let reporter = Reporter::with(args.quiet, args.json, None, ReportKind::Grade(resume_hint));
    if args.runner.is_some() {
        let _ = ctrlc::set_handler(|| {
            if CANCEL.swap(true, Ordering::SeqCst) {
                super::Code::Interrupted.exit();
            }
            eprintln!("\ninterrupted: stopping the grade shards (Ctrl-C again to quit at once)");
        });
    }
    let on = args.runner.as_deref().map(|runner| run::regrade::GradeOn {
        runner,
        runner_options: &args.runner_options,
        resume: args.resume.as_deref(),
        force: args.force,
        settings: ShardSettings::default(),
        reporter: &reporter,
        cancel: &CANCEL,
    });
    let outcome = run::regrade::regrade(
        home,
        &dir,
        &run::regrade::RegradeRequest {
            config_path: args.config.as_deref(),
            extra_plugins: &args.plugins,
            grants: &args.sandbox.grants()?,
            limits: args.sandbox.limits()?,
            secrets: &load_secrets(args.secrets_file.as_deref())?,
            on,
        },
    )
    .map_err(super::Exit::refused)?;
    if args.runner.is_some() {
        reporter.print(&outcome.summary);
    } else {
        print_summary(&outcome.summary, &outcome.grades, args.json, &outcome.dir);
    }
    if !args.json {
        outln!("regraded into {}", outcome.record.run_id);
    }
    Ok(outcome.summary.exit_code())
}
