//! A compiled, checked plugin and its typed calls.
//!
//! Loading runs the whole static check first (nothing incompatible is ever instantiated), then
//! compiles through the cache, pre-instantiates once, and reads the plugin's own description
//! with no capabilities granted. Every later call gets a fresh `Store`, so no state, and no
//! instance that trapped, survives from one call to the next.

use super::bindings::{self, ErrorCode, PluginError};
use super::bounds;
use super::cache::CacheOutcome;
use super::capabilities::{Capability, Effective, Grants};
use super::engine::PluginHost;
use super::imports::sanitize;
use super::inspect::{self, Kind, Problem, Severity, Surface, Unreadable};
use super::sandbox::{self, Identity, Limits, State};
use serde::Serialize;
use sha2::{Digest, Sha256};
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::component::InstancePre;
use wasmtime::{Store, Trap};

/// What a plugin says about itself (its `info` export), as the host records it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Info {
    /// `namespace/kind/name`.
    pub name: String,
    /// Semantic version.
    pub version: String,
    /// One line.
    pub description: String,
    /// Everything it may ask for.
    pub capabilities: Vec<Capability>,
    /// JSON Schema of its options.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub options_schema: Option<serde_json::Value>,
}

/// The sha256 of `bytes`, as lowercase hex.
pub fn digest(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// The world bindings, pre-instantiated once per plugin.
#[derive(Clone)]
enum WorldPre {
    Grader(bindings::grader::GraderPre<State>),
    Pairwise(bindings::pairwise::PairwiseGraderPre<State>),
    Dataset(bindings::dataset::DatasetPre<State>),
    Runner(bindings::runner::RunnerPre<State>),
}

impl WorldPre {
    fn new(kind: Kind, pre: InstancePre<State>) -> wasmtime::Result<Self> {
        Ok(match kind {
            Kind::Grader => WorldPre::Grader(bindings::grader::GraderPre::new(pre)?),
            Kind::PairwiseGrader => {
                WorldPre::Pairwise(bindings::pairwise::PairwiseGraderPre::new(pre)?)
            }
            Kind::Dataset => WorldPre::Dataset(bindings::dataset::DatasetPre::new(pre)?),
            Kind::Runner => WorldPre::Runner(bindings::runner::RunnerPre::new(pre)?),
        })
    }

    /// Calls the `info` export every world has.
    async fn info(&self, store: &mut Store<State>) -> wasmtime::Result<bindings::PluginInfo> {
        match self {
            WorldPre::Grader(pre) => {
                pre.instantiate_async(&mut *store)
                    .await?
                    .mst_plugin_plugin()
                    .call_info(store)
                    .await
            }
            WorldPre::Pairwise(pre) => {
                pre.instantiate_async(&mut *store)
                    .await?
                    .mst_plugin_plugin()
                    .call_info(store)
                    .await
            }
            WorldPre::Dataset(pre) => {
                pre.instantiate_async(&mut *store)
                    .await?
                    .mst_plugin_plugin()
                    .call_info(store)
                    .await
            }
            WorldPre::Runner(pre) => {
                pre.instantiate_async(&mut *store)
                    .await?
                    .mst_plugin_plugin()
                    .call_info(store)
                    .await
            }
        }
    }
}

thread_local! {
    /// Each calling thread's own runtime for plugin calls: the WASI host functions and the
    /// call's timer run on it, on the calling thread, with no hand-off to another thread.
    static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .enable_io()
        .build()
        .expect("a tokio runtime for plugin calls");
}

/// Runs `future` to its end on this thread's runtime.
fn block_on<F: Future>(future: F) -> F::Output {
    RUNTIME.with(|runtime| runtime.block_on(future))
}

/// The body of one call: a future borrowing the world, the store and the call's arguments.
type Body<'a, R> = Pin<Box<dyn Future<Output = wasmtime::Result<R>> + 'a>>;

/// Which step of loading failed, which decides `mst plugin check`'s exit code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailedStep {
    /// Not a readable component (exit 2).
    Read,
    /// Readable, but this host cannot use it (exit 1).
    Compatibility,
}

/// A plugin that could not be loaded, with everything learned before the failure.
#[derive(Debug, Clone)]
pub struct LoadError {
    /// Which step failed.
    pub step: FailedStep,
    /// What the file was called, for messages.
    pub label: String,
    /// sha256 of the bytes.
    pub digest: String,
    /// Imports and exports, when the component could be read.
    pub surface: Option<Surface>,
    /// The kind its exports name.
    pub kind: Option<Kind>,
    /// Its own description, when it could be read.
    pub info: Option<Info>,
    /// Why it failed (errors) and anything else noticed (warnings).
    pub problems: Vec<Problem>,
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.step {
            FailedStep::Read => "is not a readable plugin component",
            FailedStep::Compatibility => "is not compatible with this mst",
        };
        write!(f, "{} {what}", self.label)?;
        for problem in self
            .problems
            .iter()
            .filter(|p| p.severity == Severity::Error)
        {
            write!(f, "\n  - {}", problem.message)?;
        }
        Ok(())
    }
}

impl std::error::Error for LoadError {}

/// A failed call into a plugin. Each variant names the plugin and its version.
#[derive(Debug)]
pub enum CallError {
    /// The plugin returned an error of its own.
    Plugin {
        plugin: String,
        code: ErrorCode,
        message: String,
    },
    /// The call ran past its wall-time cap and was stopped.
    Timeout {
        plugin: String,
        limit: Duration,
        /// Whether it was waiting in a host call (a sleep, a poll, a program it ran) rather
        /// than running its own code.
        blocked: bool,
        stderr: String,
    },
    /// The plugin hit its memory cap.
    OutOfMemory {
        plugin: String,
        limit: usize,
        stderr: String,
    },
    /// The plugin trapped (a panic in Rust plugins), or broke the ABI's rules.
    Trap {
        plugin: String,
        trap: String,
        stderr: String,
    },
}

fn code_name(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::InvalidOptions => "invalid options",
        ErrorCode::InvalidInput => "invalid input",
        ErrorCode::Denied => "denied",
        ErrorCode::Unavailable => "unavailable",
        ErrorCode::Internal => "internal error",
    }
}

fn with_stderr(f: &mut fmt::Formatter<'_>, stderr: &str) -> fmt::Result {
    if stderr.trim().is_empty() {
        return Ok(());
    }
    write!(f, "\n  plugin stderr:")?;
    for line in stderr.lines() {
        write!(f, "\n    {line}")?;
    }
    Ok(())
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CallError::Plugin {
                plugin,
                code,
                message,
            } => {
                write!(
                    f,
                    "plugin {plugin} failed ({}): {}",
                    code_name(*code),
                    // Already cut to its cap, with a note this must not cut off.
                    sanitize(message, 2 * bounds::MAX_ERROR)
                )
            }
            CallError::Timeout {
                plugin,
                limit,
                blocked,
                stderr,
            } => {
                let doing = match blocked {
                    true => "waiting in a host call (a sleep, a poll, or a program it ran)",
                    false => "running its own code",
                };
                write!(
                    f,
                    "plugin {plugin} was stopped after its time limit of {:.1}s, {doing} (raise \
                     it with --plugin-timeout)",
                    limit.as_secs_f64()
                )?;
                with_stderr(f, stderr)
            }
            CallError::OutOfMemory {
                plugin,
                limit,
                stderr,
            } => {
                write!(
                    f,
                    "plugin {plugin} ran out of memory: it may use {} MiB (raise it with --plugin-memory)",
                    limit / (1024 * 1024)
                )?;
                with_stderr(f, stderr)
            }
            CallError::Trap {
                plugin,
                trap,
                stderr,
            } => {
                write!(f, "plugin {plugin} crashed: {trap}")?;
                with_stderr(f, stderr)
            }
        }
    }
}

impl std::error::Error for CallError {}

/// The last lines of captured stderr, sanitized for a terminal.
fn stderr_tail(state: &State) -> String {
    let text = state.stderr();
    let lines: Vec<&str> = text.lines().collect();
    let tail = &lines[lines.len().saturating_sub(20)..];
    sanitize(tail.join("\n").trim(), 4096).replace("\\n", "\n")
}

/// A loaded plugin: compiled, checked, described, ready to call.
#[derive(Clone)]
pub struct LoadedPlugin {
    label: String,
    digest: String,
    surface: Surface,
    kind: Kind,
    info: Info,
    warnings: Vec<Problem>,
    cache: CacheOutcome,
    engine: wasmtime::Engine,
    world: WorldPre,
    identity: Arc<Identity>,
    grants: Arc<Effective>,
    limits: Limits,
}

/// Converts the WIT description into the host's record, checking what the host relies on.
fn describe(raw: bindings::PluginInfo, surface: &Surface, problems: &mut Vec<Problem>) -> Info {
    let capabilities: Vec<Capability> = raw
        .capabilities
        .into_iter()
        .map(|c| match c {
            bindings::WitCapability::Exec(e) => Capability::Exec {
                program: e.program,
                args: e.args,
            },
            bindings::WitCapability::ReadDir(path) => Capability::ReadDir { path },
            bindings::WitCapability::Http(host) => Capability::Http { host },
            bindings::WitCapability::Model(provider) => Capability::Model { provider },
            bindings::WitCapability::Secret(name) => Capability::Secret { name },
        })
        .collect();
    if !valid_name(&raw.name) {
        problems.push(Problem::error(format!(
            "declares the name {:?}; a plugin name is `namespace/kind/name` in lowercase letters, \
             digits and dashes, e.g. `acme/grader/exact`",
            sanitize(&raw.name, 200)
        )));
    }
    if semver::Version::parse(&raw.version).is_err() {
        problems.push(Problem::error(format!(
            "declares the version {:?}, which is not a semantic version like `1.2.0`",
            sanitize(&raw.version, 100)
        )));
    }
    let options_schema = raw
        .options_schema
        .and_then(|text| match serde_json::from_str(&text) {
            Ok(schema) => Some(schema),
            Err(e) => {
                problems.push(Problem::error(format!(
                    "declares an options schema that is not JSON: {e}"
                )));
                None
            }
        });
    for (interface, declared) in [
        (
            "exec",
            capabilities
                .iter()
                .any(|c| matches!(c, Capability::Exec { .. })),
        ),
        (
            "http",
            capabilities
                .iter()
                .any(|c| matches!(c, Capability::Http { .. })),
        ),
        (
            "model",
            capabilities
                .iter()
                .any(|c| matches!(c, Capability::Model { .. })),
        ),
        (
            "secrets",
            capabilities
                .iter()
                .any(|c| matches!(c, Capability::Secret { .. })),
        ),
    ] {
        if surface.imports_host_interface(interface) && !declared {
            problems.push(Problem::warning(format!(
                "imports mst:plugin/{interface} but declares no {interface} capability, so every \
                 such call will be denied"
            )));
        }
    }
    for capability in &capabilities {
        if let Capability::Exec { program, args } = capability {
            review_exec(program, args, problems);
        }
    }
    Info {
        name: sanitize(&raw.name, 200),
        version: sanitize(&raw.version, 100),
        description: sanitize(&raw.description, 1000),
        capabilities,
        options_schema,
    }
}

/// What `mst plugin check` and loading say about one `exec` declaration: an error for a
/// template that does not parse, warnings for a bag of words, a broad declaration, or a
/// remote-execution wildcard.
fn review_exec(program: &str, args: &[String], problems: &mut Vec<Problem>) {
    // Several templates of one program often share a finding: it is said once.
    let note = |problems: &mut Vec<Problem>, problem: Problem| {
        if !problems.contains(&problem) {
            problems.push(problem);
        }
    };
    if let Err(why) = mst_argv_patterns::Declaration::parse(args) {
        note(
            problems,
            Problem::error(format!(
                "declares `{program}` with the argument patterns {:?}: {why}",
                sanitize(&args.join(" "), 400)
            )),
        );
    } else if let Some(bag) = super::capabilities::bag_of_words(program, args) {
        note(problems, Problem::warning(format!("declares {bag}")));
    }
    if let Some(broad) = super::capabilities::broad_exec(program, args) {
        note(
            problems,
            Problem::warning(format!(
                "declares {broad}: granting `{program}` admits any command (or options you \
             cannot review in advance, which run other programs or read files)"
            )),
        );
    } else if let Some(remote) = super::capabilities::remote_wildcard(program, args) {
        note(
            problems,
            Problem::warning(format!(
                "declares {remote}: granting `{program}` lets the plugin, not you, choose \
             where (pin it to a runner option with `{{option:NAME}}`)"
            )),
        );
    }
}

/// `namespace/kind/name`: three segments of `[a-z0-9][a-z0-9-]*`, at most 128 bytes.
pub fn valid_name(name: &str) -> bool {
    let segments: Vec<&str> = name.split('/').collect();
    name.len() <= 128
        && segments.len() == 3
        && segments.iter().all(|s| {
            s.bytes()
                .next()
                .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        })
}

/// The static ABI check: a readable component whose imports and exports fit this host; its
/// surface and kind. What was learned goes into `failure` either way.
fn check_surface(bytes: &[u8], failure: &mut LoadError) -> Result<(Surface, Kind), Box<LoadError>> {
    let surface = match inspect::inspect(bytes) {
        Ok(surface) => surface,
        Err(why @ (Unreadable::NotWasm | Unreadable::CoreModule | Unreadable::Malformed(_))) => {
            failure.problems.push(Problem::error(why.to_string()));
            return Err(Box::new(failure.clone()));
        }
    };
    let assessment = surface.assess();
    failure.surface = Some(surface.clone());
    failure.kind = assessment.kind;
    failure.problems = assessment.problems.clone();
    match assessment.kind {
        Some(kind) if assessment.compatible() => Ok((surface, kind)),
        _ => {
            failure.step = FailedStep::Compatibility;
            Err(Box::new(failure.clone()))
        }
    }
}

/// Compiles the component (through the cache) and pre-instantiates it as a `kind` world.
fn link(
    host: &PluginHost,
    digest: &str,
    bytes: &[u8],
    kind: Kind,
    failure: &mut LoadError,
) -> Result<(WorldPre, CacheOutcome), Box<LoadError>> {
    let (component, cache) = host.compile(digest, bytes).map_err(|e| {
        failure
            .problems
            .push(Problem::error(format!("cannot compile: {e:#}")));
        Box::new(failure.clone())
    })?;
    failure.step = FailedStep::Compatibility;
    let world = host
        .linker()
        .instantiate_pre(&component)
        .and_then(|pre| WorldPre::new(kind, pre))
        .map_err(|e| {
            failure.problems.push(Problem::error(format!(
                "cannot link against this host: {e:#}"
            )));
            Box::new(failure.clone())
        })?;
    Ok((world, cache))
}

impl LoadedPlugin {
    /// Loads `bytes` (called `label` in messages) with the operator's `grants` and `limits`.
    pub fn load(
        host: &PluginHost,
        bytes: &[u8],
        label: &str,
        grants: &Grants,
        limits: Limits,
    ) -> Result<Self, Box<LoadError>> {
        let digest = digest(bytes);
        let mut failure = LoadError {
            step: FailedStep::Read,
            label: label.to_string(),
            digest: digest.clone(),
            surface: None,
            kind: None,
            info: None,
            problems: Vec::new(),
        };
        let (surface, kind) = check_surface(bytes, &mut failure)?;
        let (world, cache) = link(host, &digest, bytes, kind, &mut failure)?;

        // Read the description with nothing granted: `info` must be pure.
        let mut plugin = LoadedPlugin {
            label: label.to_string(),
            digest,
            surface,
            kind,
            info: Info {
                name: String::new(),
                version: String::new(),
                description: String::new(),
                capabilities: Vec::new(),
                options_schema: None,
            },
            warnings: Vec::new(),
            cache,
            engine: host.engine().clone(),
            world,
            identity: Arc::new(Identity {
                label: label.to_string(),
            }),
            grants: Arc::new(Effective::none()),
            limits,
        };
        let raw = match plugin.call(&(), |world, store, _| Box::pin(world.info(store))) {
            Ok(raw) => raw,
            Err(e) => {
                failure
                    .problems
                    .push(Problem::error(format!("its `info` export failed: {e}")));
                return Err(Box::new(failure));
            }
        };
        if let Err(why) = bounds::info(&raw) {
            failure.problems.push(Problem::error(why));
            return Err(Box::new(failure));
        }
        let mut problems = failure.problems.clone();
        let info = describe(raw, &plugin.surface, &mut problems);
        if problems.iter().any(|p| p.severity == Severity::Error) {
            failure.info = Some(info);
            failure.problems = problems;
            return Err(Box::new(failure));
        }
        plugin.identity = Arc::new(Identity {
            label: format!("{} {}", info.name, info.version),
        });
        plugin.grants = Arc::new(Effective::intersect(&info.capabilities, grants));
        plugin.info = info;
        plugin.warnings = problems;
        Ok(plugin)
    }

    /// Runs `f` (with `data`) in a fresh store, and turns traps and timeouts into
    /// [`CallError`]s. The call returns by its time limit whatever the plugin does: at the
    /// limit its future is dropped, which ends a host call it is blocked in, and the store
    /// (never reused) goes with it.
    fn call<D: ?Sized, R>(
        &self,
        data: &D,
        f: impl for<'a> FnOnce(&'a WorldPre, &'a mut Store<State>, &'a D) -> Body<'a, R>,
    ) -> Result<R, CallError> {
        self.call_with(self.grants.model_access.clone(), data, f)
    }

    /// [`LoadedPlugin::call`], its `model` import reaching models through `models`.
    fn call_with<D: ?Sized, R>(
        &self,
        models: Option<Arc<crate::llm::ModelAccess>>,
        data: &D,
        f: impl for<'a> FnOnce(&'a WorldPre, &'a mut Store<State>, &'a D) -> Body<'a, R>,
    ) -> Result<R, CallError> {
        let plugin = self.identity.label.clone();
        let mut store = sandbox::new_store(
            &self.engine,
            self.identity.clone(),
            self.grants.clone(),
            models,
            self.limits,
        )
        .map_err(|e| CallError::Trap {
            plugin: plugin.clone(),
            trap: format!("{e:#}"),
            stderr: String::new(),
        })?;
        let limit = self.limits.call_timeout;
        let body = f(&self.world, &mut store, data);
        // The timer is made inside the runtime, which it needs.
        let result = block_on(async { tokio::time::timeout(limit, body).await });
        let error = match result {
            Ok(Ok(value)) => return Ok(value),
            Ok(Err(error)) => error,
            Err(_elapsed) => {
                return Err(CallError::Timeout {
                    plugin,
                    limit,
                    blocked: true,
                    stderr: stderr_tail(store.data()),
                })
            }
        };
        let state = store.data();
        let stderr = stderr_tail(state);
        if state.memory.refused {
            return Err(CallError::OutOfMemory {
                plugin,
                limit: self.limits.memory_bytes,
                stderr,
            });
        }
        if matches!(error.downcast_ref::<Trap>(), Some(Trap::Interrupt)) {
            return Err(CallError::Timeout {
                plugin,
                limit,
                blocked: false,
                stderr,
            });
        }
        let trap = match error.downcast_ref::<Trap>() {
            Some(trap) => trap.to_string(),
            None => format!("{error:#}"),
        };
        Err(CallError::Trap {
            plugin,
            trap,
            stderr,
        })
    }

    fn plugin_error(&self, error: PluginError) -> CallError {
        CallError::Plugin {
            plugin: self.identity.label.clone(),
            code: error.code,
            message: bounds::cut(error.message, bounds::MAX_ERROR),
        }
    }

    /// A result the host refuses (over a cap, out of range), as the plugin's own error.
    fn refused(&self, message: String) -> CallError {
        CallError::Plugin {
            plugin: self.identity.label.clone(),
            code: ErrorCode::Internal,
            message,
        }
    }

    /// Scores one trial (grader plugins).
    pub fn grade(
        &self,
        options: &str,
        trial: &bindings::Trial,
    ) -> Result<bindings::Score, CallError> {
        self.grade_with(options, trial, None)
    }

    /// Scores one trial as [`LoadedPlugin::grade`], its model calls made through `models`
    /// when given (a grade machine's gateway, with the trial's token) instead of the run's
    /// providers. Its grants still decide which providers it may call.
    pub fn grade_with(
        &self,
        options: &str,
        trial: &bindings::Trial,
        models: Option<&Arc<crate::llm::ModelAccess>>,
    ) -> Result<bindings::Score, CallError> {
        let models = models.or(self.grants.model_access.as_ref()).cloned();
        let result = self.call_with(
            models,
            &(options, trial, self.kind),
            |world, store, (options, trial, kind)| {
                Box::pin(async move {
                    match world {
                        WorldPre::Grader(pre) => {
                            pre.instantiate_async(&mut *store)
                                .await?
                                .mst_plugin_grading()
                                .call_grade_trial(store, options, trial)
                                .await
                        }
                        _ => Err(wasmtime::Error::msg(format!(
                            "a {kind} plugin cannot grade trials"
                        ))),
                    }
                })
            },
        )?;
        let score = result.map_err(|e| self.plugin_error(e))?;
        if !(0.0..=1.0).contains(&score.value) {
            return Err(self.refused(format!("returned the score {}, outside 0..1", score.value)));
        }
        bounds::score(score).map_err(|why| self.refused(why))
    }

    /// Compares two traces of `case` (pairwise-grader plugins): which is better, as the
    /// plugin sees it. A confidence outside 0..1 is refused as the plugin's error.
    pub fn compare(
        &self,
        options: &str,
        case: &bindings::Case,
        first: &bindings::Trace,
        second: &bindings::Trace,
    ) -> Result<bindings::Preference, CallError> {
        let data = (options, case, first, second, self.kind);
        let result = self.call(
            &data,
            |world, store, (options, case, first, second, kind)| {
                Box::pin(async move {
                    match world {
                        WorldPre::Pairwise(pre) => {
                            pre.instantiate_async(&mut *store)
                                .await?
                                .mst_plugin_pairwise()
                                .call_compare(store, options, case, first, second)
                                .await
                        }
                        _ => Err(wasmtime::Error::msg(format!(
                            "a {kind} plugin cannot compare traces"
                        ))),
                    }
                })
            },
        )?;
        let mut preference = result.map_err(|e| self.plugin_error(e))?;
        if !(0.0..=1.0).contains(&preference.confidence) {
            return Err(self.refused(format!(
                "returned the confidence {}, outside 0..1",
                preference.confidence
            )));
        }
        preference.reason = bounds::cut(preference.reason, bounds::MAX_REASON);
        Ok(preference)
    }

    /// Resolves a dataset into cases (dataset plugins).
    pub fn resolve(
        &self,
        options: &str,
        content: Option<&[u8]>,
    ) -> Result<Vec<bindings::Case>, CallError> {
        let data = (options, content, self.kind);
        let result = self.call(&data, |world, store, (options, content, kind)| {
            Box::pin(async move {
                match world {
                    WorldPre::Dataset(pre) => {
                        pre.instantiate_async(&mut *store)
                            .await?
                            .mst_plugin_datasets()
                            .call_resolve(store, options, *content)
                            .await
                    }
                    _ => Err(wasmtime::Error::msg(format!(
                        "a {kind} plugin cannot resolve datasets"
                    ))),
                }
            })
        })?;
        let cases = result.map_err(|e| self.plugin_error(e))?;
        bounds::cases(&cases).map_err(|why| self.refused(why))?;
        Ok(cases)
    }

    /// Runs `f` (with `data`) on a runner plugin's `machines` interface in a fresh instance.
    fn machines<D: ?Sized, R>(
        &self,
        what: &str,
        data: &D,
        f: impl for<'a> Fn(
            &'a bindings::runner::exports::mst::plugin::machines::Guest,
            &'a mut Store<State>,
            &'a D,
        ) -> Body<'a, Result<R, PluginError>>,
    ) -> Result<R, CallError> {
        // `f` travels with the data: what the body borrows must come in through its arguments.
        let result = self.call(
            &(data, &f, what, self.kind),
            |world, store, (data, f, what, kind)| {
                Box::pin(async move {
                    match world {
                        WorldPre::Runner(pre) => {
                            let instance = pre.instantiate_async(&mut *store).await?;
                            f(instance.mst_plugin_machines(), store, data).await
                        }
                        _ => Err(wasmtime::Error::msg(format!(
                            "a {kind} plugin cannot {what}"
                        ))),
                    }
                })
            },
        )?;
        result.map_err(|e| self.plugin_error(e))
    }

    /// A runner plugin's static facts.
    pub fn runner_info(&self) -> Result<bindings::RunnerInfo, CallError> {
        self.machines("describe a runner", &(), |machines, store, _| {
            Box::pin(async move { machines.call_info(store).await.map(Ok) })
        })
    }

    /// Lets a runner plugin validate its options (JSON text) before any machine exists.
    pub fn check_runner_options(&self, options: &str) -> Result<(), CallError> {
        self.machines(
            "check runner options",
            options,
            |machines, store, options| Box::pin(machines.call_check_options(store, options)),
        )
    }

    /// Asks a runner plugin for the machine of one shard.
    pub fn create_machine(
        &self,
        shard: &bindings::Shard,
        options: &str,
    ) -> Result<bindings::Machine, CallError> {
        let machine = self.machines(
            "create machines",
            &(shard, options),
            |machines, store, (shard, options)| {
                Box::pin(machines.call_create_machine(store, shard, options))
            },
        )?;
        bounds::machine(machine).map_err(|why| self.refused(why))
    }

    /// Tells a runner plugin to release a machine (or keep it, with `keep`).
    pub fn dispose_machine(&self, id: &str, keep: bool) -> Result<(), CallError> {
        self.machines(
            "dispose of machines",
            &(id, keep),
            |machines, store, (id, keep)| Box::pin(machines.call_dispose_machine(store, id, *keep)),
        )
    }

    /// The file name or path it was loaded from.
    pub fn label(&self) -> &str {
        &self.label
    }
    /// Its declared `name version`: what its model calls are counted under.
    pub fn name_version(&self) -> &str {
        &self.identity.label
    }
    /// sha256 of the component, lowercase hex: what runs record.
    pub fn digest(&self) -> &str {
        &self.digest
    }
    /// Its imports and exports.
    pub fn surface(&self) -> &Surface {
        &self.surface
    }
    /// What kind of plugin it is.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// Its own description.
    pub fn info(&self) -> &Info {
        &self.info
    }
    /// Warnings found while loading.
    pub fn warnings(&self) -> &[Problem] {
        &self.warnings
    }
    /// Whether the compiled artifact came from the cache.
    pub fn cache_outcome(&self) -> CacheOutcome {
        self.cache
    }
    /// This plugin with its `exec` grants pinned to a runner's `options` (see
    /// [`Effective::pinned_to`]).
    pub fn pinned_to(
        &self,
        options: &std::collections::BTreeMap<String, String>,
    ) -> Result<Self, String> {
        Ok(LoadedPlugin {
            grants: Arc::new(self.grants.pinned_to(options)?),
            ..self.clone()
        })
    }

    /// What the plugin actually receives: its declaration intersected with the grants.
    pub fn effective_grants(&self) -> &Effective {
        &self.grants
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_names() {
        assert!(valid_name("mst/grader/contains"));
        assert!(valid_name("acme/runner/k8s-2"));
        for bad in [
            "contains",
            "mst/grader",
            "a/b/c/d",
            "Mst/grader/x",
            "mst/grader/../x",
            "mst//x",
            "mst/grader/-x",
            "mst/grader/x y",
        ] {
            assert!(!valid_name(bad), "{bad}");
        }
    }
}
