//! How the `claude-code` and `codex` clients start their CLI for a trial: the program (`claude`
//! or `codex` on the machine's `PATH`, or `clientOptions.command`), its arguments, its own
//! home (so no configuration of the machine's user leaks in, and nothing of one trial reaches
//! the next), the variant's MCP servers in the CLI's own configuration, and the machine's
//! model gateway as its model provider (the trial's token, never a provider's key).
//!
//! `clientOptions` for both: `command` (the program and leading arguments), `args` (more
//! arguments, appended), `env` (more environment), `mockScript` (read by the coordinator when
//! the model is `mock/script`). `claude-code` also takes `allowedTools` (default: every tool
//! of the variant's MCP servers; anything else is denied, never asked); `codex` takes
//! `sandbox` (`read-only`, `workspace-write` or `danger-full-access`, the default: the trial's
//! machine is the boundary mst keeps, and Codex's own sandbox also confines the MCP servers
//! it starts, which breaks servers that write outside the work directory, such as Python
//! behind pyenv's shims).

use super::{claude::ClaudeStream, codex::CodexStream, AgentStream};
use crate::client::command::{Driver, Launch};
use crate::client::tool_proxy::Endpoint;
use crate::client::TrialInput;
use crate::eval::config::VariantSpec;
use crate::llm::ModelRef;
use anyhow::{bail, Context, Result};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// The agent CLIs mst drives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cli {
    ClaudeCode,
    Codex,
}

/// `clientOptions` of an agent CLI client.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Options {
    #[serde(default)]
    command: Option<Vec<String>>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Read by the coordinator (`mock/script`), checked here.
    #[serde(default)]
    mock_script: Option<crate::llm::mock::MockScript>,
    /// `claude-code` only.
    #[serde(default)]
    allowed_tools: Option<Vec<String>>,
    /// `codex` only.
    #[serde(default)]
    sandbox: Option<String>,
}

/// An agent CLI configured for one variant.
pub struct AgentCli {
    cli: Cli,
    options: Options,
    model: ModelRef,
    /// The labels of the variant's servers, which the CLI reaches through the tool proxy.
    servers: Vec<String>,
    /// The CLI's version as `--version` prints it, asked once per worker.
    version: std::sync::OnceLock<Option<String>>,
}

impl AgentCli {
    /// The CLI `cli` for the variant `spec`, its options checked. It never holds a server's
    /// token: it reaches the servers through the trial's tool proxy.
    pub fn new(cli: Cli, spec: &VariantSpec) -> Result<Self> {
        let name = cli.name();
        let options: Options = match &spec.client_options {
            Some(value) => serde_json::from_value(value.clone())
                .map_err(crate::eval::config::suggesting)
                .with_context(|| format!("clientOptions for the `{name}` client"))?,
            None => Options::default(),
        };
        if options.command.as_ref().is_some_and(Vec::is_empty) {
            bail!("clientOptions.command is empty: give the program, or leave it out for `{name}`");
        }
        match (cli, &options) {
            (
                Cli::Codex,
                Options {
                    allowed_tools: Some(_),
                    ..
                },
            ) => {
                bail!("clientOptions.allowedTools is Claude Code's; `codex` takes `sandbox`")
            }
            (
                Cli::ClaudeCode,
                Options {
                    sandbox: Some(_), ..
                },
            ) => {
                bail!("clientOptions.sandbox is Codex's; `claude-code` takes `allowedTools`")
            }
            _ => {}
        }
        if let Some(sandbox) = &options.sandbox {
            if !["read-only", "workspace-write", "danger-full-access"].contains(&sandbox.as_str()) {
                bail!(
                    "clientOptions.sandbox is {sandbox:?}: read-only, workspace-write or \
                     danger-full-access"
                );
            }
        }
        let model = ModelRef::parse(spec.model.as_deref().unwrap_or_default())
            .with_context(|| format!("the `{name}` client's `model`"))?;
        // A script serves only the mock model; it is read by the coordinator.
        if let (Some(script), "mock") = (&options.mock_script, model.provider.as_str()) {
            script.check(&model.model)?;
        }
        Ok(AgentCli {
            cli,
            options,
            model,
            servers: spec.servers.keys().cloned().collect(),
            version: std::sync::OnceLock::new(),
        })
    }

    /// The CLI's version: the last word of the first line `PROGRAM --version` prints that
    /// starts with a digit (`2.1.328 (Claude Code)`, `codex-cli 0.169.0`); `None` when it
    /// cannot say within 10 s.
    fn version(&self) -> Option<String> {
        self.version
            .get_or_init(|| {
                let mut argv = self.program();
                argv.truncate(1);
                argv.push("--version".into());
                let mut command = crate::process::clean_command(&argv, &BTreeMap::new());
                let out = crate::process::run_to_end(
                    &mut command,
                    Vec::new(),
                    std::time::Duration::from_secs(10),
                    4096,
                )
                .ok()?;
                let text = String::from_utf8_lossy(&out.stdout);
                let line = text.lines().next()?;
                let version = line
                    .split_whitespace()
                    .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))?;
                let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '+');
                (version.len() <= 64 && version.chars().all(plain)).then(|| version.to_string())
            })
            .clone()
    }

    /// Claude Code's `--mcp-config` file, naming the tool proxy's `endpoints`.
    fn claude_mcp_config(&self, endpoints: &BTreeMap<String, Endpoint>) -> Value {
        let servers: serde_json::Map<String, Value> = endpoints
            .iter()
            .map(|(label, endpoint)| {
                let entry =
                    json!({"type": "http", "url": endpoint.url, "headers": endpoint.headers});
                (label.clone(), entry)
            })
            .collect();
        json!({ "mcpServers": servers })
    }

    /// Codex's `config.toml`: the gateway as its model provider, and the tool proxy's
    /// `endpoints` as its MCP servers.
    fn codex_config(&self, gateway_url: &str, endpoints: &BTreeMap<String, Endpoint>) -> String {
        let model = match self.model.provider.as_str() {
            // A name Codex knows, so it has the model's metadata; the gateway answers with the
            // variant's model whatever the agent names.
            "mock" => "gpt-5.1-codex".to_string(),
            _ => self.model.model.clone(),
        };
        let mut toml = format!(
            "model = {}\nmodel_provider = \"mst\"\n\n[model_providers.mst]\nname = \"mst gateway\"\n\
             base_url = {}\nenv_key = \"MST_GATEWAY_TOKEN\"\nwire_api = \"responses\"\n",
            toml_string(&model),
            toml_string(&format!("{gateway_url}/v1")),
        );
        for (label, endpoint) in endpoints {
            // Required: Codex then waits for the server before the first model call, and
            // fails plainly when it cannot start (otherwise its tools are silently missing
            // from calls made before it is ready).
            toml.push_str(&format!(
                "\n[mcp_servers.{}]\nrequired = true\nurl = {}\nhttp_headers = {}\n",
                toml_string(label),
                toml_string(&endpoint.url),
                toml_table(&endpoint.headers)
            ));
        }
        toml
    }

    /// Claude Code's command line.
    fn claude_argv(&self, text: &str, mcp_config: &Path, resume: Option<&str>) -> Vec<String> {
        let mut argv = self.program();
        argv.extend(["-p".to_string(), text.to_string()]);
        for arg in [
            "--output-format",
            "stream-json",
            "--verbose",
            "--strict-mcp-config",
        ] {
            argv.push(arg.into());
        }
        argv.extend(["--mcp-config".into(), mcp_config.display().to_string()]);
        let allowed = match &self.options.allowed_tools {
            Some(tools) => tools.clone(),
            None => self
                .servers
                .iter()
                .map(|label| format!("mcp__{label}"))
                .collect(),
        };
        if !allowed.is_empty() {
            argv.push("--allowedTools".into());
            argv.extend(allowed);
        }
        if self.model.provider != "mock" {
            argv.extend(["--model".into(), self.model.model.clone()]);
        }
        if let Some(session) = resume {
            argv.extend(["--resume".into(), session.to_string()]);
        }
        argv.extend(self.options.args.iter().cloned());
        argv
    }

    /// Codex's command line.
    fn codex_argv(&self, text: &str, resume: Option<&str>) -> Vec<String> {
        let mut argv = self.program();
        let sandbox = self
            .options
            .sandbox
            .as_deref()
            .unwrap_or("danger-full-access");
        for arg in [
            "exec",
            "--json",
            "--skip-git-repo-check",
            "--sandbox",
            sandbox,
        ] {
            argv.push(arg.into());
        }
        argv.extend(self.options.args.iter().cloned());
        if let Some(thread) = resume {
            argv.extend(["resume".into(), thread.to_string()]);
        }
        argv.push(text.to_string());
        argv
    }

    /// The program and its leading arguments.
    fn program(&self) -> Vec<String> {
        self.options
            .command
            .clone()
            .unwrap_or_else(|| vec![self.cli.program().to_string()])
    }
}

impl Cli {
    /// The client's name in a config.
    pub fn name(self) -> &'static str {
        match self {
            Cli::ClaudeCode => "claude-code",
            Cli::Codex => "codex",
        }
    }

    /// The program on the machine's `PATH`.
    fn program(self) -> &'static str {
        match self {
            Cli::ClaudeCode => "claude",
            Cli::Codex => "codex",
        }
    }
}

impl Driver for AgentCli {
    fn name(&self) -> &'static str {
        self.cli.name()
    }

    fn launch(
        &self,
        input: &TrialInput<'_>,
        text: &str,
        resume: Option<&str>,
        endpoints: &BTreeMap<String, Endpoint>,
    ) -> Result<Launch, String> {
        let gateway = input.gateway.ok_or_else(|| {
            format!(
                "the `{}` client calls its model through mst's model gateway, and this trial \
                 has none",
                self.cli.name()
            )
        })?;
        // The trial's own home: in a conversation (the playground's turns share a work
        // directory) one kept in it, where the next turn resumes the session the CLI stored.
        let home = input.place.home;
        let write = |name: &str, text: &str| {
            let path = home.join(name);
            std::fs::write(&path, text)
                .map(|()| path.clone())
                .map_err(|e| format!("cannot write {}: {e}", path.display()))
        };
        let mut env: BTreeMap<String, String> = gateway
            .env(Some(&self.model.to_string()))
            .into_iter()
            .collect();
        env.insert("HOME".into(), home.display().to_string());
        let argv = match self.cli {
            Cli::ClaudeCode => {
                let config = write("mcp.json", &self.claude_mcp_config(endpoints).to_string())?;
                // MCP tools offered directly, not behind its tool search; no updates, no
                // telemetry, nothing but the gateway.
                for (var, value) in [
                    ("ENABLE_TOOL_SEARCH", "false"),
                    ("DISABLE_AUTOUPDATER", "1"),
                    ("DISABLE_TELEMETRY", "1"),
                    ("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1"),
                ] {
                    env.insert(var.into(), value.into());
                }
                self.claude_argv(text, &config, resume)
            }
            Cli::Codex => {
                let codex_home = home.join("codex");
                std::fs::create_dir_all(&codex_home)
                    .map_err(|e| format!("cannot make {}: {e}", codex_home.display()))?;
                let path = codex_home.join("config.toml");
                std::fs::write(&path, self.codex_config(&gateway.url, endpoints))
                    .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
                env.insert("CODEX_HOME".into(), codex_home.display().to_string());
                self.codex_argv(text, resume)
            }
        };
        env.extend(self.options.env.clone());
        Ok(Launch {
            argv,
            env,
            version: self.version(),
        })
    }

    fn stream(&self) -> Box<dyn AgentStream + Send> {
        match self.cli {
            Cli::ClaudeCode => Box::new(ClaudeStream::new()),
            Cli::Codex => Box::new(CodexStream::new()),
        }
    }
}

/// `text` as a TOML basic string (JSON's escapes are TOML's).
fn toml_string(text: &str) -> String {
    serde_json::to_string(text).unwrap_or_else(|_| "\"\"".into())
}

/// `table` as a TOML inline table of strings.
fn toml_table(table: &BTreeMap<String, String>) -> String {
    let entries: Vec<String> = table
        .iter()
        .map(|(k, v)| format!("{} = {}", toml_string(k), toml_string(v)))
        .collect();
    format!("{{ {} }}", entries.join(", "))
}
