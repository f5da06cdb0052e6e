//! What serde cannot check in an eval config: ranges, names and references between sections,
//! one validator per section.

use super::clients::{Resume, CLIENTS};
use super::validate_checks;
use super::{EvalConfig, PluginConfig, PluginRef};
use anyhow::{bail, Result};

/// The longest duration a config may set, in seconds: one day. Anything longer is almost
/// always milliseconds written where seconds belong (MST's configs use milliseconds).
pub const MAX_SECONDS: f64 = 86_400.0;

/// Checks a duration in seconds named `field`: positive, finite and at most a day.
pub fn seconds(field: &str, value: f64) -> Result<std::time::Duration> {
    if !(value.is_finite() && value > 0.0) {
        bail!("{field} must be a positive number of seconds, not {value}");
    }
    if value > MAX_SECONDS {
        bail!(
            "{field} is {value} seconds, more than a day; MST wrote milliseconds: did you mean {}?",
            value / 1000.0
        );
    }
    Ok(std::time::Duration::from_secs_f64(value))
}

impl EvalConfig {
    /// Checks what serde cannot: ranges, names, references between sections.
    pub fn validate(&self) -> Result<()> {
        self.validate_top()?;
        self.validate_plugins()?;
        self.validate_numbers()?;
        validate_checks(&self.checks, "checks")?;
        if let Some(workspace) = &self.workspace {
            workspace.validate("workspace")?;
        }
        let names = self.variant_names();
        if let Some(unknown) = self.references.keys().find(|r| !names.contains(r)) {
            bail!("`references` names `{unknown}`, which is not a variant");
        }
        self.validate_variants()?;
        self.validate_resumes()?;
        self.validate_gateway_clients()?;
        self.validate_limits()?;
        self.validate_judges()?;
        self.validate_pairwise()
    }

    /// `name` (it names the results directory), `datasets`, `client`, `providers`.
    fn validate_top(&self) -> Result<()> {
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if self.name.is_empty() || !self.name.chars().all(plain) {
            bail!("`name` must be letters, digits, `-`, `_` or `.` (it names the results directory), not {:?}", self.name);
        }
        if self.datasets.is_empty() {
            bail!("`datasets` is empty: name at least one dataset file, directory or plugin");
        }
        if !CLIENTS.contains(&self.client.as_str()) {
            bail!(
                "`client` is {:?}; the clients are {}",
                self.client,
                CLIENTS.join(", ")
            );
        }
        for (name, provider) in &self.providers {
            provider.validate(name, "providers.")?;
        }
        Ok(())
    }

    /// Each `plugins[].sha256` pin is a sha256 in hex.
    fn validate_plugins(&self) -> Result<()> {
        for (index, plugin) in self.plugins.iter().enumerate() {
            if let PluginRef::Detailed(PluginConfig {
                sha256: Some(pin), ..
            }) = plugin
            {
                let hex = pin.strip_prefix("sha256:").unwrap_or(pin);
                if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                    bail!(
                        "`plugins[{index}].sha256` is {pin:?}: write the component's sha256 as 64 \
                         hex digits (`mst plugin list` shows it)"
                    );
                }
            }
        }
        Ok(())
    }

    /// `trials`, `passThreshold`, `casePass`, `concurrency` and `timeout` in their ranges.
    fn validate_numbers(&self) -> Result<()> {
        if self.trials == 0 {
            bail!("`trials` must be at least 1");
        }
        if !(0.0..=1.0).contains(&self.pass_threshold) {
            bail!(
                "`passThreshold` must be between 0 and 1, not {}",
                self.pass_threshold
            );
        }
        if let Some(case_pass) = &self.case_pass {
            case_pass.rule()?;
        }
        if self.concurrency == 0 {
            bail!("`concurrency` must be at least 1");
        }
        seconds("`timeout`", self.timeout)?;
        Ok(())
    }

    /// Each variant: a usable directory name, a known client, servers of `servers`, checks.
    fn validate_variants(&self) -> Result<()> {
        for (name, variant) in &self.variants {
            if let Some(checks) = &variant.checks {
                validate_checks(checks, &format!("variants.{name}.checks"))?;
            }
            if let Some(workspace) = &variant.workspace {
                workspace.validate(&format!("variants.{name}.workspace"))?;
            }
            if name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.') {
                bail!("variant name {name:?} cannot be used as a directory name");
            }
            if let Some(client) = &variant.client {
                if !CLIENTS.contains(&client.as_str()) {
                    bail!(
                        "variants.{name}.client is {client:?}; the clients are {}",
                        CLIENTS.join(", ")
                    );
                }
            }
            for server in variant.servers.iter().flatten() {
                if !self.servers.contains_key(server) {
                    bail!("variants.{name}.servers names `{server}`, which is not in `servers`");
                }
            }
        }
        Ok(())
    }

    /// Each variant's `clientOptions.resume` (its own, or the eval's it inherits): only on the
    /// `command` client, and well formed.
    fn validate_resumes(&self) -> Result<()> {
        for name in self.variant_names() {
            let own = self
                .variants
                .get(&name)
                .is_some_and(|v| v.client_options.is_some());
            let place = match own {
                true => format!("variants.{name}.clientOptions.resume"),
                false => "clientOptions.resume".to_string(),
            };
            let spec = self.variant(&name);
            let labels: Vec<&str> = spec.servers.keys().map(String::as_str).collect();
            let tools_place = match self.variants.get(&name).is_some_and(|v| v.tools.is_some()) {
                true => format!("variants.{name}.tools"),
                false => format!("tools (variant `{name}`)"),
            };
            spec.tool_policy.check(&labels, &tools_place)?;
            if let Some(value) = spec.client_options.as_ref().and_then(|o| o.get("resume")) {
                if spec.client != "command" {
                    bail!(
                        "{place} is set, but variant `{name}` uses the `{}` client: only the \
                         `command` client resumes conversations this way",
                        spec.client
                    );
                }
                Resume::parse(value, &place)?;
            }
        }
        Ok(())
    }

    /// A variant whose agent calls models through the gateway (an agent CLI, or `command`
    /// with `modelGateway`) names the model it gets: the eval chooses it, not the agent.
    fn validate_gateway_clients(&self) -> Result<()> {
        for name in self.variant_names() {
            let spec = self.variant(&name);
            if !spec.uses_gateway() {
                continue;
            }
            let Some(model) = &spec.model else {
                bail!(
                    "variant `{name}`: the `{}` client calls its model through mst's model \
                     gateway; give `model` (`provider/model`, e.g. `mock/script` or \
                     `anthropic/claude-sonnet-4-5`)",
                    spec.client
                );
            };
            crate::llm::ModelRef::parse(model)
                .map_err(|e| e.context(format!("variant `{name}`: `model`")))?;
        }
        Ok(())
    }

    /// `limits.servers` names only configured servers.
    fn validate_limits(&self) -> Result<()> {
        for server in self.limits.servers.keys() {
            if !self.servers.contains_key(server) {
                bail!("limits.servers names `{server}`, which is not in `servers`");
            }
        }
        Ok(())
    }

    /// Each judge, the eval's and the variants', is a plugin or an assertion, not both.
    fn validate_judges(&self) -> Result<()> {
        for judge in self.all_judges() {
            match (&judge.plugin, &judge.assert) {
                (Some(_), None) | (None, Some(_)) => {}
                _ => bail!("each judge needs exactly one of `plugin` and `assert`"),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn durations_above_a_day_are_taken_for_milliseconds() {
        let with = |timeout: &str| {
            EvalConfig::parse(
                &format!(r#"{{"name": "t", "datasets": ["c"], "client": "command", "timeout": {timeout}}}"#),
                Path::new("e.json"),
            )
            .map(|c| c.timeout)
            .map_err(|e| format!("{e:#}"))
        };
        let err = with("120000").unwrap_err();
        assert!(
            err.contains("`timeout` is 120000 seconds")
                && err.contains("MST wrote milliseconds: did you mean 120?"),
            "{err}"
        );
        assert_eq!(with("86400"), Ok(86400.0));
        assert!(with("0")
            .unwrap_err()
            .contains("positive number of seconds"));
        let err = seconds("--silence-limit", 90_000.0)
            .unwrap_err()
            .to_string();
        assert!(err.contains("did you mean 90?"), "{err}");
    }
}
