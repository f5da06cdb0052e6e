//! Before anything runs: the config, its plugins (the config's, `--plugin` ones, installed ones
//! that judges or `--runner` name), its cases and its judges, each checked, so that every
//! mistake in them is found before any machine starts.

use crate::eval::config::{EvalConfig, HttpServer, PluginConfig, PluginRef, ServerConfig};
use crate::eval::dataset::{self, Cases};
use crate::grade::pairwise::PairJudge;
use crate::grade::JudgeSet;
use crate::home::Home;
use crate::llm::ModelAccess;
use crate::plugin::capabilities::GrantLists;
use crate::plugin::installed::PluginSource;
use crate::plugin::set::{PinnedRef, PluginLoader, PluginSet};
use crate::plugin::{Grants, Limits};
use crate::results::{GitState, PluginRecord};
use crate::secrets::Secrets;
use crate::shard::limits::{HostCalls, Limiter};
use crate::shard::protocol::{CoordinatorMessage, MAX_LINE_BYTES};
use crate::shard::tokens::ServerTokens;
use anyhow::{Context, Result};
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The config, its plugins, cases and judges, loaded and checked.
pub struct Prepared {
    pub config: EvalConfig,
    /// sha256 of the config file's bytes.
    pub config_hash: String,
    /// The config's directory: relative paths in it are relative to this.
    pub base: PathBuf,
    pub plugins: PluginSet,
    pub cases: Cases,
    pub judges: JudgeSet,
    /// The config's pairwise judges.
    pub pairwise: Vec<PairJudge>,
    /// The run's `limits`: the coordinators' and the plugins' model calls take room here.
    pub limiter: Arc<Limiter>,
    /// How the plugins reach model providers, with what each plugin used.
    pub model_access: Arc<ModelAccess>,
    /// The run's workspaces, once packed ([`Prepared::pack_workspaces`]); none before.
    pub workspaces: super::workspaces::RunWorkspaces,
    /// The images its trials name, once planned; none before.
    pub images: super::images::TrialImages,
}

/// What to load besides the config's own plugins.
pub struct PluginRequest<'a> {
    /// `--plugin` files or installed names, granted `grants`.
    pub extra: &'a [String],
    pub grants: &'a Grants,
    pub limits: Limits,
    /// `--runner`: a runner plugin not loaded otherwise is looked up among the installed ones
    /// and gets `grants` too.
    pub runner: Option<&'a str>,
    /// The secrets file's values, for the keys of the model providers plugins may call.
    pub secrets: &'a Secrets,
}

/// Loads the config at `config_path` with its plugins, resolves its datasets and builds its
/// judges.
pub fn prepare(home: &Home, config_path: &Path, request: &PluginRequest<'_>) -> Result<Prepared> {
    let (mut config, config_bytes) = EvalConfig::load(config_path)?;
    config.add_providers_from(&home.providers_file())?;
    config.apply_provider_limits();
    let base = config_path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let config_hash = hex::encode(Sha256::digest(&config_bytes));
    let limiter = Arc::new(Limiter::new(config.limits.clone()));
    // Every plugin granted a model provider reaches it the same way, under the run's limits.
    let model_access = Arc::new(ModelAccess::new(
        &config.providers,
        request.secrets,
        Arc::new(HostCalls::new(limiter.clone())),
    ));
    let plugins = load_plugins(home, &config, &base, request, &model_access)?;
    let cases = dataset::resolve(&config.datasets, &base, &plugins)?;
    let judges = JudgeSet::build(&config, cases.iter(), &plugins)?;
    let pairwise = PairJudge::build_all(&config, &plugins)?;
    Ok(Prepared {
        config,
        config_hash,
        base,
        plugins,
        cases,
        judges,
        pairwise,
        limiter,
        model_access,
        workspaces: Default::default(),
        images: Default::default(),
    })
}

fn load_plugins(
    home: &Home,
    config: &EvalConfig,
    base: &Path,
    request: &PluginRequest<'_>,
    access: &Arc<ModelAccess>,
) -> Result<PluginSet> {
    let loader = PluginLoader::new(home, request.limits)?;
    let mut plugins = PluginSet::default();
    let access = Some(access.clone());
    let with_access = |grants: &Grants| Grants {
        model_access: access.clone(),
        ..grants.clone()
    };
    let extra_grants = with_access(request.grants);
    for reference in &config.plugins {
        let (path, pin, grants) = match reference {
            PluginRef::Name(name) => (name.clone(), None, Grants::default()),
            PluginRef::Detailed(detail) => (
                detail.path.clone(),
                detail.sha256.as_deref(),
                with_access(&grants_from(detail, base)?),
            ),
        };
        let source = serde_json::to_value(reference)?;
        let pinned = PinnedRef {
            reference: &path,
            pin,
        };
        plugins
            .load(&loader, base, pinned, &grants, source)
            .with_context(|| format!("plugin `{path}`"))?;
    }
    let cwd = std::env::current_dir()?;
    for reference in request.extra {
        plugins
            .load(
                &loader,
                &cwd,
                PinnedRef::unpinned(reference),
                &extra_grants,
                serde_json::json!("--plugin"),
            )
            .with_context(|| format!("--plugin {reference}"))?;
    }
    // Judges naming installed graders load them; so does `--runner` naming an installed runner.
    for judge in config.all_judges() {
        if let Some(name) = &judge.plugin {
            plugins
                .load_if_missing(&loader, base, name, &Grants::default())
                .with_context(|| format!("a judge names plugin `{name}`"))?;
        }
    }
    for (index, pair) in config.pairwise.iter().enumerate() {
        plugins
            .load_if_missing(&loader, base, &pair.plugin, &Grants::default())
            .with_context(|| format!("pairwise[{index}].plugin names `{}`", pair.plugin))?;
    }
    // `--runner` names a loaded plugin, a file, or an installed runner by its full name or
    // its last part alone (`ssh` for `acme/runner/ssh`).
    if let Some(runner) = request
        .runner
        .filter(|r| !crate::runner::BUILT_IN.contains(r))
        .filter(|r| plugins.find(r).is_none())
    {
        let file = matches!(loader.source(&cwd, runner), Ok(PluginSource::File(_)));
        let reference = match file || runner.starts_with(crate::plugin::oci::SCHEME) {
            true => runner.to_string(),
            false => {
                let found = loader.store().find_runner(runner)?;
                format!("{}@{}", found.manifest.name, found.manifest.version)
            }
        };
        plugins
            .load_if_missing(&loader, &cwd, &reference, &extra_grants)
            .with_context(|| format!("--runner {runner}"))?;
        plugins.alias(runner, &reference);
    }
    Ok(plugins)
}

/// The grants a config's plugin entry gives (`allowExec`, `allowRead`, …).
fn grants_from(config: &PluginConfig, base: &Path) -> Result<Grants> {
    let read_dirs: Vec<PathBuf> = config.allow_read.iter().map(|d| base.join(d)).collect();
    Grants::from_lists(
        GrantLists {
            exec: &config.allow_exec,
            http: &config.allow_http,
            models: &config.allow_model,
            read_dirs: &read_dirs,
            secrets: &config.allow_secret,
            env: &config.allow_env,
        },
        |list| format!("allow{}{}", list[..1].to_uppercase(), &list[1..]),
    )
}

impl Prepared {
    /// Packs the run's workspaces into `$MST_HOME/workspaces/`, before any machine starts
    /// (see [`super::workspaces::RunWorkspaces::pack`]).
    pub fn pack_workspaces(&mut self, home: &Home) -> Result<()> {
        let dir = home.workspaces_dir();
        self.workspaces =
            super::workspaces::RunWorkspaces::pack(&self.config, &self.base, &self.cases, &dir)?;
        Ok(())
    }

    /// A run record of this eval with nothing collected yet: run `run_id`, made now by
    /// `runner` from `config_path`, no trials; callers set what their run differs in.
    pub fn run_record(
        &self,
        run_id: &str,
        config_path: &Path,
        runner: &str,
        runner_options: &crate::runner::RunnerOptions,
    ) -> crate::results::RunRecord {
        crate::results::RunRecord {
            format: crate::results::RUN_FORMAT,
            run_id: run_id.to_string(),
            eval: self.config.name.clone(),
            mst: env!("CARGO_PKG_VERSION").to_string(),
            created_at: crate::clock::unix_secs(),
            config_path: config_path.display().to_string(),
            config_hash: self.config_hash.clone(),
            git: None,
            dataset_hash: self.cases.content_hash.clone(),
            runner: runner.to_string(),
            runner_options: runner_options.rest.clone(),
            shards: runner_options.shards,
            machines: Vec::new(),
            plugins: self.plugin_records(),
            filters: Default::default(),
            trials: Default::default(),
            baseline: self.config.baseline.clone(),
            collect: crate::results::Phase::Partial,
            grade: crate::results::Phase::Partial,
            conversation: false,
            timings: None,
            grading: None,
            workspaces: self.workspaces.records.clone(),
            references: self.config.references.clone(),
            tool_lists: Default::default(),
        }
    }

    /// What `run.json` records of each plugin.
    pub fn plugin_records(&self) -> Vec<PluginRecord> {
        self.plugins
            .plugins()
            .into_iter()
            .map(|(p, source)| PluginRecord {
                name: p.info().name.clone(),
                version: p.info().version.clone(),
                kind: p.kind().to_string(),
                digest: p.digest().to_string(),
                source,
                declared: p.info().capabilities.clone(),
                granted: p.effective_grants().clone(),
                usage: None,
            })
            .collect()
    }

    /// Records in `plugins` what each one's model calls used so far (while this run graded).
    pub fn count_usage(&self, plugins: &mut [PluginRecord]) {
        for plugin in plugins {
            let used = self
                .model_access
                .usage(&format!("{} {}", plugin.name, plugin.version));
            plugin.usage = (!used.is_empty()).then_some(used);
        }
    }

    /// Tokens for the servers that name one, by server label, the secrets of servers'
    /// `envSecrets`/`headerSecrets` and `secretEnv` (`secret:NAME`); a secret the secrets file
    /// does not hold is a config error, a model provider's key included (it stays in the host,
    /// which makes every provider call, but a missing one is better said before any machine).
    pub fn server_tokens(&self, secrets: &Secrets) -> Result<ServerTokens> {
        let mut names = BTreeMap::new();
        for (label, server) in &self.config.servers {
            if let ServerConfig::Http(HttpServer {
                token: Some(name), ..
            }) = server
            {
                if secrets.get(name).is_none() {
                    anyhow::bail!("servers.{label}.token names {}", Secrets::missing(name));
                }
                names.insert(label.clone(), name.clone());
            }
            for (place, name) in server.secrets() {
                if secrets.get(&name).is_none() {
                    anyhow::bail!("servers.{label}.{place} names {}", Secrets::missing(&name));
                }
                names.insert(crate::secrets::secret_token(&name), name);
            }
        }
        for (name, provider) in &self.config.providers {
            if secrets.get(&provider.key).is_none() {
                anyhow::bail!(
                    "providers.{name}.key names {}",
                    Secrets::missing(&provider.key)
                );
            }
        }
        for variant in self.config.variant_names() {
            for (var, name) in self.config.variant(&variant).secret_env() {
                if secrets.get(&name).is_none() {
                    anyhow::bail!(
                        "variant `{variant}`: clientOptions.secretEnv.{var} names {}",
                        Secrets::missing(&name)
                    );
                }
                names.insert(crate::secrets::secret_token(&name), name);
            }
        }
        let tokens = ServerTokens::new(names, secrets.clone());
        // They travel in one `tokens` line, which the worker reads only up to the line cap.
        let line = crate::shard::protocol::encode(&CoordinatorMessage::Tokens {
            tokens: tokens.all(),
        });
        if line.len() > MAX_LINE_BYTES {
            anyhow::bail!(
                "the servers' tokens take {} bytes in one protocol line, over the \
                 {MAX_LINE_BYTES}-byte cap: use fewer or shorter tokens",
                line.len()
            );
        }
        Ok(tokens)
    }

    /// Refuses a variant name or case id that holds a secret's value (the secrets file's, or a
    /// server's token): names and ids travel in every protocol message and name result files,
    /// none of which may hold a secret, so redaction would take such a trial's key away from
    /// it (the worker's report would name no trial of its shard, and the shard would be lost)
    /// and blot it out of the results. The error shows the id redacted, with where it is.
    pub fn check_ids_hold_no_secret(&self) -> Result<()> {
        let redactor = crate::secrets::redactor();
        let fix = "names and ids are written into every result file, which never holds a \
                   secret";
        if let Some(name) = self
            .config
            .variant_names()
            .into_iter()
            .find(|name| redactor.finds(name))
        {
            anyhow::bail!(
                "variant `{}`: its name holds the value of a secret; {fix}: rename it",
                redactor.redact(&name)
            );
        }
        if let Some((index, id)) = self
            .cases
            .ids()
            .iter()
            .enumerate()
            .find(|(_, id)| redactor.finds(id))
        {
            anyhow::bail!(
                "case `{}` ({}): its id holds the value of a secret; {fix}: give the case \
                 another id",
                redactor.redact(id),
                self.cases.origin(index)
            );
        }
        Ok(())
    }

    /// Builds every variant's client once and checks every case's input against it, so that
    /// a client that cannot be configured or a case it cannot read is an error found before
    /// any machine exists.
    pub fn check_clients(&self, filters: &crate::eval::plan::Filters) -> Result<()> {
        // Only what the run was asked for: a broken case or variant left out by `--case` or
        // `--variant` does not stop it.
        let wanted =
            |list: &[String], name: &str| list.is_empty() || list.iter().any(|w| w == name);
        let mut specs = Vec::new();
        for name in self.config.variant_names() {
            if !wanted(&filters.variants, &name) {
                continue;
            }
            let spec = self.config.variant(&name);
            crate::client::client(&spec, &BTreeMap::new())
                .with_context(|| format!("variant `{name}`"))?;
            if let Some(warning) = crate::client::shell_warning(&spec) {
                tracing::warn!("variant `{name}`: {warning}");
            }
            specs.push((name, spec));
        }
        // One pass over the cases, which are read from their file as they come.
        for (index, case) in self.cases.iter().enumerate() {
            let case = case?;
            if wanted(&filters.cases, &case.id) {
                for (name, spec) in &specs {
                    crate::client::check_input(spec, &case.input).with_context(|| {
                        format!(
                            "case `{}` ({}): its input does not suit variant `{name}`'s `{}` \
                             client",
                            case.id,
                            self.cases.origin(index),
                            spec.client
                        )
                    })?;
                }
            }
            // A case's own checks, as the eval's and the variants' were when the config loaded.
            if let Some(checks) = &case.more().checks {
                crate::eval::config::validate_checks(checks, "checks").with_context(|| {
                    format!("case `{}` ({})", case.id, self.cases.origin(index))
                })?;
            }
        }
        Ok(())
    }
}

/// The longest a provenance `git` call may take; a repository that slow is recorded without.
const GIT_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The git commit and dirty flag of the repository holding `dir`, when it is one.
///
/// The repository is someone else's: its own config must not run anything here. git runs with
/// only [`crate::process::minimal_env`], no system or global config, and every setting that
/// starts a program overridden in the environment's config (which wins over the repository's):
/// `core.fsmonitor` (a hook `status` runs), hooks, every configured filter driver (`status`
/// runs clean filters on files whose stat data changed), and no optional locks or untracked
/// cache (nothing written into the repository). Changes inside submodules are not looked at
/// (that would run git in them, under their own config); a submodule moved to another commit
/// still counts.
pub fn git_state(dir: &Path) -> Option<GitState> {
    let git = |overrides: &[(String, String)], args: &[&str]| {
        let mut command = std::process::Command::new("git");
        command
            .env_clear()
            .envs(crate::process::minimal_env())
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("GIT_CONFIG_GLOBAL", "/dev/null")
            .env("GIT_TERMINAL_PROMPT", "0")
            .env("GIT_OPTIONAL_LOCKS", "0");
        // GIT_CONFIG_KEY_n rather than `-c`: a driver's name may hold `=`.
        let settings = NEUTRAL_GIT
            .iter()
            .map(|(key, value)| (key.to_string(), value.to_string()))
            .chain(overrides.iter().cloned());
        let mut count = 0;
        for (index, (key, value)) in settings.enumerate() {
            command
                .env(format!("GIT_CONFIG_KEY_{index}"), key)
                .env(format!("GIT_CONFIG_VALUE_{index}"), value);
            count = index + 1;
        }
        command
            .env("GIT_CONFIG_COUNT", count.to_string())
            .arg("-C")
            .arg(dir)
            .args(args);
        crate::process::run_to_end(&mut command, Vec::new(), GIT_LIMIT, 1 << 20)
            .ok()
            .filter(|o| o.status.is_some_and(|s| s.success()))
    };
    let commit = String::from_utf8(git(&[], &["rev-parse", "HEAD"])?.stdout)
        .ok()?
        .trim()
        .to_string();
    // Filter drivers are defined in config only (attributes merely name them), so the
    // configured ones are every driver `status` could run.
    let pattern = r"^filter\..*\.(clean|smudge|process)$";
    let listed = git(
        &[],
        &["config", "-z", "--name-only", "--get-regexp", pattern],
    )
    .map(|o| o.stdout)
    .unwrap_or_default();
    let mut overrides = Vec::new();
    for key in listed.split(|b| *b == 0).map(String::from_utf8_lossy) {
        let Some((driver, _)) = key.strip_prefix("filter.").and_then(|k| k.rsplit_once('.')) else {
            continue;
        };
        for (setting, value) in [
            ("clean", ""),
            ("smudge", ""),
            ("process", ""),
            ("required", "false"),
        ] {
            overrides.push((format!("filter.{driver}.{setting}"), value.to_string()));
        }
    }
    let status = git(
        &overrides,
        &["status", "--porcelain", "--ignore-submodules=dirty"],
    )?;
    let origin = git(&[], &["config", "--get", "remote.origin.url"])
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|url| without_credentials(url.trim()))
        .filter(|url| !url.is_empty());
    Some(GitState {
        commit,
        dirty: !status.stdout.is_empty(),
        origin,
    })
}

/// A remote URL without the user and password an `https://user:token@host/…` URL may carry.
fn without_credentials(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => format!("{scheme}://{}", &rest[at + 1..]),
        None => url.to_string(),
    }
}

/// Settings that keep a provenance `git` call from starting programs or writing to the
/// repository, whatever its config says.
const NEUTRAL_GIT: [(&str, &str); 4] = [
    ("core.fsmonitor", "false"),
    ("core.hooksPath", "/dev/null"),
    ("core.untrackedCache", "false"),
    ("core.attributesFile", "/dev/null"),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_urls_lose_their_credentials() {
        assert_eq!(
            without_credentials("https://bot:ghp_canary@github.com/acme/evals.git"),
            "https://github.com/acme/evals.git"
        );
        assert_eq!(
            without_credentials("git@github.com:acme/evals.git"),
            "git@github.com:acme/evals.git"
        );
        assert_eq!(
            without_credentials("https://github.com/a/b@c"),
            "https://github.com/a/b@c"
        );
    }
}
