//! The `command` client: runs a configured program (an agent CLI, a script) per trial.
//!
//! `clientOptions`: `command` (argv; `{input}`, `{case}`, `{variant}` and `{trial}` are
//! replaced in each argument), `input` (`stdin`, the default, `argv` or `none`: how the case
//! input reaches the program), `events` (when true, stdout lines that are JSON trace events,
//! `{"type": "tool-call", …}`, become trace events instead of answer text), `env` (its
//! environment besides [`crate::process::MINIMAL_ENV`]: nothing else of the worker's reaches
//! it), `cwd`, and `resume` (`{"capture": REGEX, "arg": [..., "{token}"]}`: in a playground
//! conversation, the token REGEX finds in the stdout lines is captured, and the next turn
//! appends `arg` with the token to the command; see [`crate::eval::config::Resume`]). The
//! program's stdout (minus event lines) is the final answer, its stderr lines become `log`
//! events, and its exit code is recorded. At the deadline the whole process group is killed
//! and the trial is `timed-out`. The program runs as a [`crate::process::AsyncGroupChild`].

use super::{input_text, Client, Recorder, ResumeSink, TrialInput, RESUME_TOKEN};
use crate::diagnosis::TailReader;
use crate::eval::config::Resume;
use crate::eval::trial::{EventKind, TraceRecord, TrialStatus};
use crate::process::{read_lines_capped, AsyncGroupChild, GroupCommand};
use crate::secrets::Secret;
use anyhow::{bail, Context, Result};
use futures_util::future::{FusedFuture, FutureExt};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::io::AsyncWriteExt;

/// Bytes of stdout kept as the answer.
const MAX_ANSWER: usize = 4 * 1024 * 1024;
/// How long output is still read after the program ended, when the trial's deadline is nearer.
const PIPE_GRACE: Duration = Duration::from_secs(2);
/// stderr lines kept as log events.
const MAX_LOG_LINES: usize = 1_000;
/// How often a running program's trial looks whether the shard was cancelled.
const CANCEL_CHECK: Duration = Duration::from_millis(50);

#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq)]
#[serde(rename_all = "lowercase")]
enum InputMode {
    #[default]
    Stdin,
    Argv,
    None,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Options {
    command: Vec<String>,
    #[serde(default)]
    input: InputMode,
    #[serde(default)]
    events: bool,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Environment variables whose values are secrets, by the secret's name: delivered to the
    /// worker as tokens (`secret:NAME`), set for the program only.
    #[serde(default, rename = "secretEnv")]
    secret_env: BTreeMap<String, String>,
    cwd: Option<String>,
    /// Checked by [`Resume::parse`].
    #[serde(default)]
    resume: Option<serde_json::Value>,
    /// When true, the program calls models through the machine's model gateway: it gets
    /// the variables of [`super::GatewayAccess::env`] (the gateway's URL and the trial's
    /// token as the Anthropic and OpenAI base URL and key, `MST_MODEL`).
    #[serde(default, rename = "modelGateway")]
    model_gateway: bool,
}

/// An agent CLI that a [`CommandClient`] runs (`super::agent_cli`): how the CLI is started for
/// a trial, and how its output is read into the trace.
pub trait Driver: Send + Sync {
    /// The client's name (`claude-code`, `codex`).
    fn name(&self) -> &'static str;
    /// The command for one trial on `text`, continuing the conversation `resume` names
    /// (the session or thread id the CLI printed last turn), if any; the CLI's MCP
    /// configuration names `endpoints`, the trial's tool proxy, never the servers.
    fn launch(
        &self,
        input: &TrialInput<'_>,
        text: &str,
        resume: Option<&str>,
        endpoints: &BTreeMap<String, super::tool_proxy::Endpoint>,
    ) -> Result<Launch, String>;
    /// A new reader of its stdout.
    fn stream(&self) -> Box<dyn super::agent_cli::AgentStream + Send>;
}

/// One trial's start of an agent CLI: its argv, its environment (besides the minimal one),
/// and its version, recorded as the trace's [`AGENT_CLI_EVENT`].
pub struct Launch {
    pub argv: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub version: Option<String>,
}

/// The `custom` event naming the agent CLI that ran a trial: `{"client", "version"}`. The
/// coordinator records its version as the trace's `collectedBy.clientVersion`.
pub const AGENT_CLI_EVENT: &str = "agent-cli";

/// Runs a program per trial.
pub struct CommandClient {
    options: Options,
    /// The `secretEnv` values the worker has received, by variable.
    secret_values: BTreeMap<String, Secret>,
    /// How a conversation continues, when `clientOptions.resume` says.
    resume: Option<Resume>,
    /// The conversation to continue, when the worker was handed one ([`RESUME_TOKEN`]).
    resume_token: Option<Secret>,
    /// The variant's model, `MST_MODEL` with `modelGateway`.
    model: Option<String>,
    /// The agent CLI it runs, when it is one.
    driver: Option<std::sync::Arc<dyn Driver>>,
    /// The variant's MCP servers, which its program reaches through the tool proxy.
    tools: Option<Tools>,
}

/// What a trial's tool proxy serves: the variant's servers, its tool policy and the tokens
/// the servers take.
struct Tools {
    servers: BTreeMap<String, crate::eval::config::ServerConfig>,
    policy: crate::eval::config::ToolPolicy,
    tokens: BTreeMap<String, Secret>,
}

impl CommandClient {
    /// Validates `clientOptions`; `tokens` holds the secrets `secretEnv` names, once the
    /// worker has them (as `secret:NAME`).
    pub fn new(
        options: Option<&serde_json::Value>,
        tokens: &BTreeMap<String, Secret>,
    ) -> Result<Self> {
        let value = options
            .cloned()
            .context("the `command` client needs `clientOptions` with a `command` list")?;
        let options: Options = serde_json::from_value(value)
            .map_err(crate::eval::config::suggesting)
            .context("clientOptions for the `command` client")?;
        if options.command.is_empty() {
            bail!("clientOptions.command is empty: give the program and its arguments");
        }
        let secret_values = options
            .secret_env
            .iter()
            .filter_map(|(var, name)| {
                let value = tokens.get(&crate::secrets::secret_token(name))?;
                Some((var.clone(), value.clone()))
            })
            .collect();
        let resume = options
            .resume
            .as_ref()
            .map(|value| Resume::parse(value, "clientOptions.resume"))
            .transpose()?;
        Ok(Self {
            options,
            secret_values,
            resume_token: resume
                .as_ref()
                .and_then(|_| tokens.get(RESUME_TOKEN).cloned()),
            resume,
            model: None,
            driver: None,
            tools: None,
        })
    }

    /// A client running the agent CLI `driver`: its program, arguments and environment come
    /// from the driver, the case's input is its prompt (never its stdin), its stdout is read by
    /// the driver's stream, and a conversation continues with the id it printed.
    pub fn for_agent(
        driver: std::sync::Arc<dyn Driver>,
        tokens: &BTreeMap<String, Secret>,
    ) -> Self {
        CommandClient {
            options: Options {
                command: vec![driver.name().to_string()],
                input: InputMode::None,
                events: false,
                env: BTreeMap::new(),
                secret_env: BTreeMap::new(),
                cwd: None,
                resume: None,
                model_gateway: false,
            },
            secret_values: BTreeMap::new(),
            resume: None,
            resume_token: tokens.get(RESUME_TOKEN).cloned(),
            model: None,
            driver: Some(driver),
            tools: None,
        }
    }

    /// The client, with the variant's `model` for `MST_MODEL`.
    pub fn with_model(mut self, model: Option<&str>) -> Self {
        self.model = model.map(str::to_string);
        self
    }

    /// The client, its program reaching the variant's MCP servers (if it has any) through the
    /// tool proxy, which `MST_MCP_CONFIG` names; `tokens` holds the servers' tokens.
    pub fn with_tools(
        mut self,
        spec: &crate::eval::config::VariantSpec,
        tokens: &BTreeMap<String, Secret>,
    ) -> Self {
        self.tools = (!spec.servers.is_empty()).then(|| Tools {
            servers: spec.servers.clone(),
            policy: spec.tool_policy.clone(),
            tokens: tokens.clone(),
        });
        self
    }
}

enum Output {
    Line(String, Duration),
    Err(String, Duration),
}

/// `template` with its placeholders replaced in one pass: `{input}` by `text`, `{case}`,
/// `{variant}` and `{trial}` by the trial's, so that a value holding a placeholder's name (an
/// input that says `{case}`) is never replaced again.
fn fill(template: &str, input: &TrialInput<'_>, text: &str) -> String {
    let trial = input.trial.to_string();
    let values = [
        ("{input}", text),
        ("{case}", &*input.case.id),
        ("{variant}", input.variant),
        ("{trial}", &trial),
    ];
    let mut filled = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(at) = rest.find('{') {
        filled.push_str(&rest[..at]);
        rest = &rest[at..];
        match values.iter().find(|(name, _)| rest.starts_with(name)) {
            Some((name, value)) => {
                filled.push_str(value);
                rest = &rest[name.len()..];
            }
            None => {
                filled.push('{');
                rest = &rest[1..];
            }
        }
    }
    filled.push_str(rest);
    filled
}

/// Why `command` (a `command` client's argv template) runs case text as shell code: a
/// placeholder a case fills (`{input}`, `{case}`) inside the script of a shell's `-c`
/// (`sh -c`, `bash -lc`), where the text is read as commands, not passed as a word.
pub fn script_placeholder(command: &[String]) -> Option<String> {
    let is_shell = |program: &str| {
        let name = program.rsplit('/').next().unwrap_or(program);
        ["sh", "bash", "dash", "zsh", "ksh", "ash", "fish"].contains(&name)
    };
    if !command.first().is_some_and(|p| is_shell(p)) {
        return None;
    }
    // The script is the word after the first option holding `c` (`-c`, `-lc`, `-ec`).
    let script = command
        .iter()
        .skip(1)
        .position(|a| a.starts_with('-') && !a.starts_with("--") && a.contains('c'))
        .and_then(|at| command.get(at + 2))?;
    let placeholder = ["{input}", "{case}"]
        .into_iter()
        .find(|p| script.contains(p))?;
    Some(format!(
        "clientOptions.command puts {placeholder} inside the `{} -c` script, so each case's \
         text runs as shell code; pass it as an argument of its own instead (`\"sh\", \"-c\", \
         \"agent \\\"$1\\\"\", \"sh\", \"{placeholder}\"`) or use `\"input\": \"stdin\"`",
        command[0]
    ))
}

/// An infra trace: what was recorded, then `message` as its last log event.
fn infra(mut trace: Recorder<'_>, message: String) -> TraceRecord {
    trace.push(EventKind::Log { text: message });
    trace.finish(TrialStatus::Infra, None, None)
}

impl Client for CommandClient {
    fn name(&self) -> &'static str {
        self.driver.as_ref().map_or("command", |d| d.name())
    }

    fn run(&self, input: &TrialInput<'_>) -> TraceRecord {
        // A batch trial of a conversation case (exported from the playground) replays its
        // turns; a playground turn is one turn.
        let resumes = self.resume.is_some() || self.driver.is_some();
        if input.resume.is_none() && resumes {
            if let Some(turns) = super::conversation_turns(&input.case.input) {
                return self.replay(input, turns);
            }
        }
        let started = Instant::now();
        let mut trace = Recorder::new(input, started);
        let resume_with = input
            .resume
            .and(self.resume_token.as_ref())
            .map(Secret::expose);
        let text = input_text(input.case);
        let deadline = started + input.timeout;
        match self.run_program(
            input,
            &text,
            resume_with,
            input.resume,
            deadline,
            &mut trace,
        ) {
            Ok(end) => end.into_trace(trace),
            Err(why) => infra(trace, why),
        }
    }
}

/// The last resume token a replayed turn printed, held for redaction the moment it is seen,
/// as a playground turn's is.
#[derive(Default)]
struct LastToken(std::sync::Mutex<Option<Secret>>);

impl ResumeSink for LastToken {
    fn token(&self, token: Secret) {
        crate::secrets::hold("resume token", &token);
        *self.0.lock().expect("token") = Some(token);
    }
}

/// How one run of the program ended.
struct ProgramEnd {
    answer: String,
    exit_code: Option<i32>,
    /// A limit stopped it: the deadline, or the token budget.
    stopped: bool,
}

impl ProgramEnd {
    fn into_trace(self, trace: Recorder<'_>) -> TraceRecord {
        let status = match self.stopped {
            true => TrialStatus::TimedOut,
            false => TrialStatus::Completed,
        };
        trace.finish(status, Some(self.answer), self.exit_code)
    }
}

impl CommandClient {
    /// Replays a conversation case in one trial: each turn runs the program on the turn's
    /// input, continuing the thread with the token the previous turn printed (as the
    /// playground does), under the trial's one deadline. The answer is the last turn's; a turn
    /// that times out or exits non-zero ends the replay there.
    fn replay(&self, input: &TrialInput<'_>, turns: &[serde_json::Value]) -> TraceRecord {
        let started = Instant::now();
        let deadline = started + input.timeout;
        let mut trace = Recorder::new(input, started);
        let sink = LastToken::default();
        let mut last = None;
        for (n, turn) in turns.iter().enumerate() {
            let text = format!("turn {} of {}", n + 1, turns.len());
            trace.push(EventKind::Log { text });
            let token = sink.0.lock().expect("token").clone();
            let end = match self.run_program(
                input,
                &super::text_of(turn),
                token.as_ref().map(Secret::expose),
                Some(&sink),
                deadline,
                &mut trace,
            ) {
                Ok(end) => end,
                Err(why) => return infra(trace, why),
            };
            let stop = end.stopped || end.exit_code != Some(0);
            last = Some(end);
            if stop {
                break;
            }
        }
        last.expect("a conversation case has turns")
            .into_trace(trace)
    }

    /// Runs the program once on `text` (continuing `resume_with`'s thread when given) until
    /// it ends or `deadline`; its output goes to `trace` and the answer. `Err` when it could
    /// not start or the shard was cancelled. Its pipes are served on the trial thread's async
    /// runtime: no thread per pipe, and the program's exit is seen the moment it happens.
    fn run_program<'t>(
        &self,
        input: &TrialInput<'t>,
        text: &str,
        resume_with: Option<&str>,
        sink: Option<&dyn ResumeSink>,
        deadline: Instant,
        trace: &mut Recorder<'t>,
    ) -> Result<ProgramEnd, String> {
        super::mcp::on_trial_runtime(async {
            // The tool proxy's calls, recorded as they are answered.
            let (events, mut proxied) = tokio::sync::mpsc::unbounded_channel();
            let proxy = match &self.tools {
                Some(tools) => Some(start_proxy(tools, input, events, trace.started()).await?),
                None => None,
            };
            let mcp_config = proxy.as_ref().map(|(_, path)| path.as_path());
            let (command, name) = match &self.driver {
                Some(driver) => {
                    let endpoints = proxy.as_ref().map(|(p, _)| p.endpoints()).unwrap_or_default();
                    let launch = driver.launch(input, text, resume_with, &endpoints)?;
                    trace.push(EventKind::Custom {
                        name: AGENT_CLI_EVENT.into(),
                        data: serde_json::json!({"client": driver.name(), "version": launch.version}),
                    });
                    self.launched(input, launch.argv, &launch.env)?
                }
                None => self.command(input, text, resume_with, mcp_config)?,
            };
            let run = ProgramRun {
                client: self,
                input,
                sink,
                deadline,
                trace: &mut *trace,
                answer: String::new(),
                stream: self.driver.as_ref().map(|d| d.stream()),
                proxied: &mut proxied,
                reported_by_proxy: Default::default(),
            };
            let end = run.run(command, &name, text).await;
            if let Some((proxy, _)) = proxy {
                proxy.close().await;
            }
            while let Ok((kind, at)) = proxied.try_recv() {
                trace.push_at(at, kind);
            }
            end
        })
        .map_err(|e| format!("{e:#}"))?
    }

    /// An agent CLI's command for one trial, as its driver launched it: stdio piped, stdin
    /// empty, the environment the minimal one plus `env`, in the trial's scratch directory.
    fn launched(
        &self,
        input: &TrialInput<'_>,
        mut argv: Vec<String>,
        env: &BTreeMap<String, String>,
    ) -> Result<(GroupCommand, String), String> {
        let mut group_command = input
            .place
            .program(&argv, env)
            .map_err(|why| format!("cannot start `{}`: {why}", argv[0]))?;
        group_command
            .command_mut()
            .envs(input.evidence.map(|e| (super::ARTIFACTS_ENV, e.hand_out())))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .current_dir(input.place.work);
        let name = argv.swap_remove(0);
        Ok((group_command, name))
    }

    /// The program for one trial, set up to run (stdio piped, the environment cleared to
    /// what it is given, in the trial's scratch directory), and the name it was given.
    fn command(
        &self,
        input: &TrialInput<'_>,
        text: &str,
        resume_with: Option<&str>,
        mcp_config: Option<&Path>,
    ) -> Result<(GroupCommand, String), String> {
        let argv_text = if self.options.input == InputMode::Argv {
            text
        } else {
            ""
        };
        let mut argv: Vec<String> = self
            .options
            .command
            .iter()
            .map(|a| fill(a, input, argv_text))
            .collect();
        // Only when continuing a thread: a playground turn's, or a replayed conversation's.
        if let (Some(resume), Some(token)) = (&self.resume, resume_with) {
            argv.extend(resume.args(token));
        }
        let mut group_command = input
            .place
            .program(&argv, &self.options.env)
            .map_err(|why| format!("cannot start `{}`: {why}", argv[0]))?;
        let gateway = input.gateway.filter(|_| self.options.model_gateway);
        let gateway_env = gateway.map(|g| g.env(self.model.as_deref()));
        let command = group_command.command_mut();
        command
            .envs(gateway_env.into_iter().flatten())
            .envs(self.secret_values.iter().map(|(k, v)| (k, v.expose())))
            .envs(input.evidence.map(|e| (super::ARTIFACTS_ENV, e.hand_out())))
            .envs(mcp_config.map(|path| (super::tool_proxy::MCP_CONFIG_ENV, path)))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.stdin(if self.options.input == InputMode::Stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        });
        // The trial's scratch directory unless the config names one.
        command.current_dir(
            self.options
                .cwd
                .as_deref()
                .map_or(input.place.work, Path::new),
        );
        let name = argv.swap_remove(0);
        Ok((group_command, name))
    }
}

/// How the program's run ended, before its leftover output is read.
struct Ended {
    status: Option<std::process::ExitStatus>,
    /// A limit stopped it: the deadline, or the token budget.
    stopped: bool,
}

/// One run of the program, on the trial runtime: its stdin fed while it runs, its stdout and
/// stderr recorded as they come, and the limits that stop it (the deadline, the token budget,
/// the shard's cancel).
struct ProgramRun<'a, 't> {
    client: &'a CommandClient,
    input: &'a TrialInput<'t>,
    /// Where a conversation turn's resume token goes, when the run is one.
    sink: Option<&'a dyn ResumeSink>,
    deadline: Instant,
    trace: &'a mut Recorder<'t>,
    /// The stdout lines that are answer text, so far.
    answer: String,
    /// An agent CLI's stdout reader: its lines become events and its final answer the
    /// answer.
    stream: Option<Box<dyn super::agent_cli::AgentStream + Send>>,
    /// The calls the tool proxy answered, recorded as they come.
    proxied: &'a mut tokio::sync::mpsc::UnboundedReceiver<super::tool_proxy::ProxyEvent>,
    /// The ids of the calls an agent CLI reported to a proxied server: the proxy recorded
    /// them, as it saw them, so the CLI's own report of them and their results is left out.
    reported_by_proxy: std::collections::HashSet<String>,
}

impl ProgramRun<'_, '_> {
    /// Starts `command` (named `name`) on `text` and runs it to its end.
    async fn run(
        mut self,
        command: GroupCommand,
        name: &str,
        text: &str,
    ) -> Result<ProgramEnd, String> {
        let mut child =
            AsyncGroupChild::spawn(command).map_err(|e| format!("cannot start `{name}`: {e}"))?;
        let (stdin, stdout, stderr) = child.take_pipes();
        let (tx, mut outputs) = tokio::sync::mpsc::unbounded_channel();
        let feed = Box::pin(feed(stdin, text).fuse());
        let pipes = self.read_pipes(stdout.expect("piped"), stderr.expect("piped"), tx);
        let mut pipes = std::pin::pin!(pipes.fuse());
        let exit = self
            .watch(&mut child, &mut outputs, feed, pipes.as_mut())
            .await?;
        // A program that failed: the processes it left running are part of the evidence, so
        // they are listed before the group is killed.
        if !exit.status.is_some_and(|s| s.success()) {
            self.at_failure();
        }
        // The program is gone; its pipes close once every process of the group is gone.
        child.kill_group();
        self.drain(&mut outputs, pipes).await;
        Ok(self.end(exit))
    }

    /// Reads the program's stdout and stderr, capped, into `outputs` as lines timed from the
    /// trial's start. With artefacts on, the end of each stream is kept too, for a failed
    /// trial's diagnosis (the trace keeps their start).
    fn read_pipes(
        &self,
        stdout: tokio::process::ChildStdout,
        stderr: tokio::process::ChildStderr,
        outputs: tokio::sync::mpsc::UnboundedSender<Output>,
    ) -> impl std::future::Future<Output = ()> {
        let started = self.trace.started();
        let tails = self
            .input
            .evidence
            .map(|e| (e.stdout.clone(), e.stderr.clone()));
        let (out_tail, err_tail) = tails.unzip();
        let err_outputs = outputs.clone();
        let out = read_lines_capped(
            TailReader::new(stdout, out_tail),
            MAX_ANSWER as u64 * 2,
            usize::MAX,
            move |line| outputs.send(Output::Line(line, started.elapsed())).is_ok(),
        );
        let err = read_lines_capped(
            TailReader::new(stderr, err_tail),
            MAX_ANSWER as u64,
            MAX_LOG_LINES,
            move |line| {
                err_outputs
                    .send(Output::Err(line, started.elapsed()))
                    .is_ok()
            },
        );
        async {
            tokio::join!(out, err);
        }
    }

    /// Serves the program until it exits, or a limit stops it with its group. `feed` goes
    /// with this: a process the program left behind may hold its stdin unread, and that must
    /// not keep the trial waiting. `Err` when the shard was cancelled.
    async fn watch(
        &mut self,
        child: &mut AsyncGroupChild,
        outputs: &mut tokio::sync::mpsc::UnboundedReceiver<Output>,
        mut feed: std::pin::Pin<Box<impl FusedFuture<Output = ()>>>,
        mut pipes: std::pin::Pin<&mut impl FusedFuture<Output = ()>>,
    ) -> Result<Ended, String> {
        let mut cancel_check = tokio::time::interval(CANCEL_CHECK);
        let stopped = |status| Ended {
            status,
            stopped: true,
        };
        loop {
            tokio::select! {
                Some((kind, at)) = self.proxied.recv() => self.trace.push_at(at, kind),
                Some(output) = outputs.recv() => {
                    self.record(output);
                    // The token budget is checked as the agent reports its usage, not after
                    // it ends.
                    if self.trace.past_budget().is_some() {
                        self.at_failure();
                        return Ok(stopped(child.stop().await));
                    }
                }
                () = &mut feed, if !feed.is_terminated() => {}
                () = &mut pipes, if !pipes.is_terminated() => {}
                status = child.wait() => return Ok(Ended { status, stopped: false }),
                () = tokio::time::sleep_until(self.deadline.into()) => {
                    // The processes as they hung, before they are killed.
                    self.at_failure();
                    return Ok(stopped(child.stop().await));
                }
                _ = cancel_check.tick() => if self.input.cancel.load(Ordering::Relaxed) {
                    child.stop().await;
                    return Err("cancelled".into());
                }
            }
        }
    }

    /// Records the output still coming after the program ended, until its pipes close. A
    /// process that left the group (`setsid`) may hold them open: reading stops at the
    /// trial's deadline, or shortly after the program ended, whichever is later.
    async fn drain(
        &mut self,
        outputs: &mut tokio::sync::mpsc::UnboundedReceiver<Output>,
        mut pipes: std::pin::Pin<&mut impl FusedFuture<Output = ()>>,
    ) {
        let stop_reading = self.deadline.max(Instant::now() + PIPE_GRACE);
        let read_rest = async {
            loop {
                tokio::select! {
                    Some(output) = outputs.recv() => self.record(output),
                    () = &mut pipes, if !pipes.is_terminated() => {}
                    else => break,
                }
            }
        };
        let held_open = tokio::time::timeout_at(stop_reading.into(), read_rest)
            .await
            .is_err();
        if held_open {
            let text = "the program's output stayed open after it ended (a process outside \
                        its process group holds it); stopped reading"
                .to_string();
            self.trace.push(EventKind::Log { text });
        }
    }

    /// How the run ended, with its answer.
    fn end(mut self, exit: Ended) -> ProgramEnd {
        if let Some(stream) = &self.stream {
            self.answer = stream.final_answer().unwrap_or_default().to_string();
        }
        if self.answer.ends_with('\n') {
            self.answer.pop();
        }
        ProgramEnd {
            answer: self.answer,
            exit_code: exit.status.and_then(|s| s.code()),
            stopped: exit.stopped,
        }
    }

    /// Takes the process list for the trial's diagnosis, when artefacts are on.
    fn at_failure(&self) {
        if let Some(evidence) = self.input.evidence {
            evidence.at_failure();
        }
    }

    /// One line of output into the answer or the events: stderr lines are `log` events, stdout
    /// lines are answer text (or, with `events`, trace events when they parse as one).
    /// In a conversation turn, a line holding a resume token goes to the sink first, so the
    /// token is held for redaction before the line is recorded anywhere.
    fn record(&mut self, output: Output) {
        match output {
            Output::Line(line, at) if self.stream.is_some() => self.record_agent_line(&line, at),
            Output::Line(line, at) => {
                let resume = self.client.resume.as_ref();
                if let (Some(sink), Some(token)) =
                    (self.sink, resume.and_then(|r| r.capture(&line)))
                {
                    sink.token(Secret::new(token));
                }
                if self.client.options.events {
                    if let Ok(kind) = serde_json::from_str::<EventKind>(&line) {
                        self.trace.push_at(at, kind);
                        return;
                    }
                }
                if self.answer.len() < MAX_ANSWER {
                    self.answer.push_str(&line);
                    self.answer.push('\n');
                }
            }
            Output::Err(text, at) => self.trace.push_at(at, EventKind::Log { text }),
        }
    }
}

impl ProgramRun<'_, '_> {
    /// One line of an agent CLI's stdout, read by its stream: its events recorded, the id
    /// that continues its conversation handed to the sink (held for redaction, never in the
    /// trace).
    fn record_agent_line(&mut self, line: &str, at: Duration) {
        let Some(stream) = self.stream.as_mut() else {
            return;
        };
        for event in stream.parse_line(line, at) {
            if let super::agent_cli::CliEvent::Session(id) = &event {
                let token = Secret::new(id.clone());
                crate::secrets::hold("agent session", &token);
                if let Some(sink) = self.sink {
                    sink.token(token);
                }
                continue;
            }
            if let Some(kind) = event.into_trace_event() {
                if !self.seen_by_proxy(&kind) {
                    self.trace.push_at(at, kind);
                }
            }
        }
    }
}

/// Starts the trial's tool proxy for `tools` and writes its `mcpServers` file into the
/// trial's home: the proxy and the file's path. The proxy's token is the trial's own, refused
/// once the proxy closes with the trial, like a gateway token; so it is not redacted.
async fn start_proxy(
    tools: &Tools,
    input: &TrialInput<'_>,
    events: tokio::sync::mpsc::UnboundedSender<super::tool_proxy::ProxyEvent>,
    started: Instant,
) -> Result<(super::tool_proxy::ToolProxy, std::path::PathBuf), String> {
    let proxy = super::tool_proxy::ToolProxy::start(
        &tools.servers,
        &tools.policy,
        &tools.tokens,
        &input.place,
        events,
        started,
    )
    .await
    .map_err(|e| format!("{e:#}"))?;
    let path = input.place.home.join("mcp-servers.json");
    if let Err(e) = std::fs::write(&path, proxy.mcp_config().to_string()) {
        proxy.close().await;
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    Ok((proxy, path))
}

impl ProgramRun<'_, '_> {
    /// Whether `kind`, an event an agent CLI reported, is a call to one of the servers the tool
    /// proxy stands in front of (or its result): the proxy recorded it already.
    fn seen_by_proxy(&mut self, kind: &EventKind) -> bool {
        let Some(tools) = &self.client.tools else {
            return false;
        };
        match kind {
            EventKind::ToolCall {
                id,
                server: Some(server),
                ..
            } if tools.servers.contains_key(server) => {
                self.reported_by_proxy.insert(id.clone());
                true
            }
            EventKind::ToolResult { id, .. } => self.reported_by_proxy.contains(id),
            _ => false,
        }
    }
}

/// Writes `text` to the program's stdin, if it has one, then closes it: the program sees the
/// end of its input.
async fn feed(stdin: Option<tokio::process::ChildStdin>, text: &str) {
    if let Some(mut stdin) = stdin {
        let _ = stdin.write_all(text.as_bytes()).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eval::trial::{CaseRecord, TraceEvent};
    use serde_json::json;
    use std::process::Command;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn a_mistyped_option_is_suggested_from_the_clients_own_options() {
        let error = |options: serde_json::Value| {
            let err = CommandClient::new(Some(&options), &BTreeMap::new()).err();
            format!("{:#}", err.expect("refused"))
        };
        let err = error(json!({"command": ["true"], "secretEnvs": {}}));
        assert!(err.contains("(did you mean `secretEnv`?)"), "{err}");
        // `model` is a config key, not a `command` option: no suggestion from elsewhere.
        let err = error(json!({"command": ["true"], "mode": "x"}));
        assert!(
            err.contains("unknown field `mode`") && !err.contains("did you mean"),
            "{err}"
        );
    }

    #[test]
    fn a_placeholder_inside_a_shell_script_is_named() {
        let argv = |words: &[&str]| words.iter().map(|w| w.to_string()).collect::<Vec<_>>();
        for (command, warned) in [
            (&["sh", "-c", "agent {input}"][..], true),
            (&["/bin/bash", "-lc", "echo {case} | agent"], true),
            (&["sh", "-c", "agent \"$1\"", "sh", "{input}"], false),
            (&["agent", "-c", "{input}"], false),
            (&["sh", "script.sh", "{input}"], false),
            (&["sh", "-c", "agent --from-stdin"], false),
        ] {
            let warning = script_placeholder(&argv(command));
            assert_eq!(warning.is_some(), warned, "{command:?}: {warning:?}");
        }
        let warning = script_placeholder(&argv(&["sh", "-c", "a {input}"])).unwrap();
        assert!(
            warning.contains("{input} inside the `sh -c` script"),
            "{warning}"
        );
    }

    fn run(options: serde_json::Value, input: serde_json::Value, timeout: Duration) -> TraceRecord {
        run_told(options, input, timeout, &crate::client::NoEvents, None)
    }

    fn run_told(
        options: serde_json::Value,
        input: serde_json::Value,
        timeout: Duration,
        events: &dyn crate::client::EventSink,
        token_budget: Option<u64>,
    ) -> TraceRecord {
        let client = CommandClient::new(Some(&options), &BTreeMap::new()).unwrap();
        let case = CaseRecord::new("c1", input);
        client.run(&TrialInput {
            case: &case,
            variant: "v",
            trial: 0,
            timeout,
            cancel: &AtomicBool::new(false),
            place: crate::client::TrialPlace {
                work: &std::env::temp_dir(),
                home: &std::env::temp_dir(),
                sandbox: None,
                proxy: None,
            },
            events,
            resume: None,
            history: &[],
            token_budget,
            evidence: None,
            gateway: None,
        })
    }

    /// Keeps what it hears, with when it heard it.
    #[derive(Default)]
    struct Heard(std::sync::Mutex<Vec<(TraceEvent, Instant)>>);

    impl crate::client::EventSink for Heard {
        fn emit(&self, event: &TraceEvent) {
            self.0.lock().unwrap().push((event.clone(), Instant::now()));
        }
    }

    #[test]
    fn each_event_is_told_as_it_is_recorded_and_the_trace_is_what_was_told() {
        let script = r#"echo '{"type":"log","text":"one"}'; sleep 1; echo two >&2; echo answer"#;
        let heard = Heard::default();
        let started = Instant::now();
        let trace = run_told(
            json!({"command": ["sh", "-c", script], "events": true}),
            json!(null),
            Duration::from_secs(10),
            &heard,
            None,
        );
        let heard = heard.0.into_inner().unwrap();
        let told: Vec<TraceEvent> = heard.iter().map(|(e, _)| e.clone()).collect();
        // The program's own event, then its stderr line.
        assert_eq!(trace.events.len(), 2, "{:?}", trace.events);
        assert_eq!(told, trace.events);
        assert!(
            heard[0].1 < started + Duration::from_millis(900),
            "told before the program went on: {:?}",
            heard[0].1 - started
        );
    }

    #[test]
    fn stdin_to_stdout() {
        let trace = run(
            json!({"command": ["cat"]}),
            json!("hello"),
            Duration::from_secs(10),
        );
        assert_eq!(trace.status, TrialStatus::Completed);
        assert_eq!(trace.final_text.as_deref(), Some("hello"));
        assert_eq!(trace.exit_code, Some(0));
    }

    #[test]
    fn argv_placeholders_events_and_stderr() {
        let script = r#"echo "{\"type\":\"message\",\"role\":\"assistant\",\"text\":\"thinking\"}"; echo "answer for $1 in {variant}"; echo oops >&2; exit 3"#;
        let trace = run(
            json!({"command": ["sh", "-c", script, "sh", "{input}"], "input": "argv", "events": true}),
            json!("q1"),
            Duration::from_secs(10),
        );
        assert_eq!(trace.final_text.as_deref(), Some("answer for q1 in v"));
        assert_eq!(trace.exit_code, Some(3));
        assert!(trace
            .events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Message { text, .. } if text == "thinking")));
        assert!(trace
            .events
            .iter()
            .any(|e| matches!(&e.kind, EventKind::Log { text } if text == "oops")));
        let seqs: Vec<u64> = trace.events.iter().map(|e| e.seq).collect();
        assert_eq!(
            seqs,
            (0..trace.events.len() as u64).collect::<Vec<_>>(),
            "append-only cursor"
        );
    }

    #[test]
    fn a_placeholder_inside_a_value_is_never_replaced_again() {
        let trace = run(
            json!({"command": ["echo", "{input}|{case}|{unknown}|{"], "input": "argv"}),
            json!("say {case} and {variant}"),
            Duration::from_secs(10),
        );
        let said = trace.final_text.unwrap_or_default();
        assert!(
            said.starts_with("say {case} and {variant}|") && said.ends_with("|{unknown}|{"),
            "{said}"
        );
    }

    #[test]
    fn the_deadline_kills_the_whole_group() {
        let started = Instant::now();
        let trace = run(
            json!({"command": ["sh", "-c", "sleep 30 & sleep 30"], "input": "none"}),
            json!(null),
            Duration::from_millis(300),
        );
        assert_eq!(trace.status, TrialStatus::TimedOut);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the pipes closed: the group is dead"
        );
    }

    #[test]
    fn an_agent_past_its_token_budget_is_stopped_as_it_reports_the_usage() {
        let usage = |n: u32| {
            format!(
                r#"echo '{{"type":"custom","name":"usage","data":{{"usage":{{"inputTokens":{n},"outputTokens":10}}}}}}'"#
            )
        };
        // 110 tokens, within 150; then 220 in all, past it; the agent would go on for 30 s.
        let script = format!(
            "{}; echo partial; {}; sleep 30; echo done",
            usage(100),
            usage(100)
        );
        let started = Instant::now();
        let trace = run_told(
            json!({"command": ["sh", "-c", script], "events": true}),
            json!(null),
            Duration::from_secs(60),
            &crate::client::NoEvents,
            Some(150),
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "stopped as the usage came, not at the end: {:?}",
            started.elapsed()
        );
        assert_eq!(trace.status, TrialStatus::TimedOut);
        let stopped = trace.stopped.as_deref().unwrap_or_default();
        assert!(
            stopped.contains("past its token budget")
                && stopped.contains("220 tokens, over the 150"),
            "{stopped}"
        );
        assert_eq!(trace.final_text.as_deref(), Some("partial"));
        assert!(trace.events.iter().any(
            |e| matches!(&e.kind, EventKind::Log { text } if text == &format!("stopped: {stopped}"))
        ));
        // Within the budget, the same agent is not stopped.
        let script = format!("{}; echo whole", usage(100));
        let trace = run_told(
            json!({"command": ["sh", "-c", script], "events": true}),
            json!(null),
            Duration::from_secs(60),
            &crate::client::NoEvents,
            Some(150),
        );
        assert_eq!(trace.status, TrialStatus::Completed);
        assert_eq!(trace.stopped, None);
    }

    #[test]
    fn hostile_usage_reports_neither_wrap_the_count_nor_stop_an_agent_within_its_budget() {
        // Usage that does not read as tokens (text, negative) counts nothing; two reports at
        // u64::MAX saturate instead of wrapping round to a small count that would pass.
        let script = r#"echo '{"type":"custom","name":"usage","data":{"usage":{"inputTokens":"lots","outputTokens":-5}}}'; echo '{"type":"custom","name":"usage","data":{"usage":{"inputTokens":18446744073709551615,"outputTokens":18446744073709551615}}}'; echo '{"type":"custom","name":"usage","data":{"usage":{"inputTokens":18446744073709551615,"outputTokens":2}}}'; sleep 30"#;
        let started = Instant::now();
        let trace = run_told(
            json!({"command": ["sh", "-c", script], "events": true}),
            json!(null),
            Duration::from_secs(60),
            &crate::client::NoEvents,
            Some(100),
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "stopped at once"
        );
        assert_eq!(trace.status, TrialStatus::TimedOut);
        let stopped = trace.stopped.unwrap_or_default();
        assert!(
            stopped.contains("used 18446744073709551615 tokens, over the 100"),
            "{stopped}"
        );
        // The unreadable report alone stops nothing.
        let script = r#"echo '{"type":"custom","name":"usage","data":{"usage":{"inputTokens":"lots","outputTokens":-5}}}'; echo done"#;
        let trace = run_told(
            json!({"command": ["sh", "-c", script], "events": true}),
            json!(null),
            Duration::from_secs(60),
            &crate::client::NoEvents,
            Some(1),
        );
        assert_eq!(
            (trace.status, trace.stopped),
            (TrialStatus::Completed, None)
        );
    }

    #[test]
    fn a_process_left_holding_stdin_unread_does_not_hold_the_trial() {
        // The program hands its stdin to a process outside its group (which never reads
        // it), answers and exits, while 1 MiB of input still waits to be written. It waits a
        // moment first, so that the group's kill at its exit does not catch the other process
        // before it has left the group.
        let pid_file = tempfile::NamedTempFile::new().unwrap();
        let script = format!(
            "exec 3<&0; setsid sleep 20 <&3 >/dev/null 2>&1 & echo $! > {}; sleep 1; echo done",
            pid_file.path().display()
        );
        let started = Instant::now();
        let trace = run(
            json!({"command": ["sh", "-c", script]}),
            json!("x".repeat(1 << 20)),
            Duration::from_secs(15),
        );
        let took = started.elapsed();
        if let Ok(pid) = std::fs::read_to_string(pid_file.path()) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        assert_eq!(trace.status, TrialStatus::Completed, "{:?}", trace.events);
        assert_eq!(trace.final_text.as_deref(), Some("done"));
        assert!(took < Duration::from_secs(5), "the trial waited {took:?}");
    }

    #[test]
    fn a_missing_program_is_infra() {
        let trace = run(
            json!({"command": ["/nonexistent/agent"]}),
            json!(1),
            Duration::from_secs(5),
        );
        assert_eq!(trace.status, TrialStatus::Infra);
    }

    #[test]
    fn the_program_gets_a_minimal_environment_and_the_configured_one() {
        // The test process stands in for the worker; its canary must not reach the program.
        std::env::set_var("MST_CLIENT_CANARY", "canary-client-env");
        let trace = run(
            json!({"command": ["env"], "input": "none", "env": {"FROM_CONFIG": "yes"}}),
            json!(null),
            Duration::from_secs(10),
        );
        let env = trace.final_text.unwrap();
        assert!(!env.contains("canary-client-env"), "{env}");
        assert!(
            env.contains("FROM_CONFIG=yes") && env.contains("PATH="),
            "{env}"
        );
    }

    #[test]
    fn options_are_strict() {
        let none = BTreeMap::new();
        assert!(
            CommandClient::new(Some(&json!({"command": ["x"], "stdin": true})), &none).is_err()
        );
        assert!(CommandClient::new(None, &none).is_err());
    }
}
