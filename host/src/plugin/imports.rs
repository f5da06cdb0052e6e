//! Host functions a plugin may import. Every capability-gated call checks the store's
//! effective grants first and fails with `error-code::denied`, naming the plugin and what to
//! grant, before anything happens on the host.

use super::bindings::grader::mst::plugin::{exec, http, log, model, secrets, types};
use super::bindings::{ErrorCode, PluginError};
use super::programs;
use super::sandbox::State;
use crate::process::RunningGroup;
use crate::secrets::redact::terminal_safe;
use std::time::{Duration, Instant};

/// Log lines one call may write; the rest are dropped with one warning.
const MAX_LOG_LINES: u32 = 1_000;
/// Characters kept of one log line.
const MAX_LOG_CHARS: usize = 4_096;
/// Host cap on one program run, whatever the plugin asks.
const MAX_EXEC_TIME: Duration = Duration::from_secs(300);

fn denied(message: String) -> PluginError {
    PluginError {
        code: ErrorCode::Denied,
        message,
    }
}

fn unavailable(message: String) -> PluginError {
    PluginError {
        code: ErrorCode::Unavailable,
        message,
    }
}

/// Makes plugin text safe for a terminal and a log file: length capped, kept to one line
/// (newlines shown as `\n`), and otherwise as [`terminal_safe`] makes anyone's text.
pub(crate) fn sanitize(text: &str, max_chars: usize) -> String {
    let mut capped: String = text.chars().take(max_chars).collect();
    if text.chars().nth(max_chars).is_some() {
        capped.push('…');
    }
    terminal_safe(&capped.replace('\n', "\\n")).into_owned()
}

impl types::Host for State {}

impl log::Host for State {
    fn log(&mut self, level: log::Level, message: String) {
        self.log_lines += 1;
        let plugin = self.identity.label.as_str();
        if self.log_lines > MAX_LOG_LINES {
            if self.log_lines == MAX_LOG_LINES + 1 {
                tracing::warn!(
                    plugin,
                    "more than {MAX_LOG_LINES} log lines in one call; dropping the rest"
                );
            }
            return;
        }
        let message = sanitize(&message, MAX_LOG_CHARS);
        match level {
            log::Level::Trace => tracing::trace!(plugin, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, "{message}"),
            log::Level::Info => tracing::info!(plugin, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, "{message}"),
            log::Level::Error => tracing::error!(plugin, "{message}"),
        }
    }
}

impl exec::Host for State {
    async fn run(
        &mut self,
        program: String,
        args: Vec<String>,
        stdin: Vec<u8>,
        timeout_ms: u32,
    ) -> Result<exec::ExecOutput, PluginError> {
        if let Err(why) = self.grants.allows_exec(&program, &args) {
            return Err(denied(why));
        }
        if let Err(why) = super::manifest::check(&program, &args, &stdin) {
            return Err(denied(why));
        }
        // The program's group is killed (SIGKILL, which no program can ignore) by the call's
        // own deadline at the latest, so that nothing it started outlives the call.
        let remaining = self.deadline.saturating_duration_since(Instant::now());
        let timeout = Duration::from_millis(timeout_ms.into())
            .min(remaining)
            .min(MAX_EXEC_TIME);
        // On a blocking thread, so that this call's future stays droppable: at the call's
        // time limit the caller stops waiting for it whatever the program does, and dropping
        // `_stop` kills the program's group then and there (mst may be about to exit).
        let name = program.clone();
        let group = RunningGroup::default();
        let _stop = KillOnDrop(group.clone());
        let output = tokio::task::spawn_blocking(move || {
            programs::run_in(&program, &args, stdin, timeout, &group)
        })
        .await
        .map_err(|e| unavailable(format!("running `{name}` failed: {e}")))?
        .map_err(|e| unavailable(format!("running `{name}` failed: {e}")))?;
        Ok(exec::ExecOutput {
            status: output.status,
            stdout: output.stdout,
            stderr: output.stderr,
        })
    }
}

/// Kills a program's group when an `exec` call ends, however it ends (a no-op once the
/// program has been run to its end).
struct KillOnDrop(RunningGroup);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.0.kill();
    }
}

impl secrets::Host for State {
    fn get(&mut self, name: String) -> Result<String, PluginError> {
        match self.grants.secret(&name) {
            Some(value) => Ok(value.expose().to_string()),
            None => Err(denied(
                format!("secret `{name}` is not granted (declare it and grant it with --allow-secret {name})"),
            )),
        }
    }
}

impl http::Host for State {
    async fn send(&mut self, request: http::Request) -> Result<http::Response, PluginError> {
        super::egress::send(
            &self.identity.label,
            &self.grants.http,
            self.deadline,
            request,
        )
        .await
    }
}

/// Most tokens a plugin's model call may ask for.
const MAX_MODEL_TOKENS: u32 = 16_384;

impl model::Host for State {
    async fn complete(
        &mut self,
        request: model::CompletionRequest,
    ) -> Result<model::Completion, PluginError> {
        if !self.grants.models.contains(&request.provider) {
            return Err(denied(
                format!(
                    "model provider `{}` is not granted (declare it and grant it with --allow-model {})",
                    request.provider, request.provider
                ),
            ));
        }
        let invalid = |message: String| PluginError {
            code: ErrorCode::InvalidInput,
            message,
        };
        let model = crate::llm::ModelRef {
            provider: request.provider.clone(),
            model: request.model.clone(),
        };
        let Some(access) = self.models.clone() else {
            return Err(unavailable(format!(
                "no model providers are configured for this command (model `{model}`)"
            )));
        };
        let provider = access
            .provider_for_plugin(&model, &self.identity.label)
            .map_err(|e| invalid(format!("{e:#}")))?;
        let mut system = request.system.clone();
        let mut turns = Vec::new();
        for message in request.messages {
            match message.role.as_str() {
                "user" => turns.push(crate::llm::Turn::User(message.text)),
                "assistant" => turns.push(crate::llm::Turn::Assistant {
                    text: Some(message.text),
                    calls: Vec::new(),
                }),
                "system" => system = Some(message.text),
                other => {
                    return Err(invalid(format!(
                        "a message's role is `{other}`; model calls take `system`, `user` and \
                         `assistant`"
                    )))
                }
            }
        }
        let call = crate::llm::ModelRequest {
            model: &model,
            system: system.as_deref(),
            turns: &turns,
            tools: &[],
            tool_choice: crate::llm::ToolChoice::None,
            max_tokens: request.max_tokens.min(MAX_MODEL_TOKENS),
            temperature: request.temperature.map(f64::from),
        };
        // The call's own deadline bounds the model too, and the wait for its provider's slot
        // (the run's `limits.providers`, shared with the workers).
        let left = self.deadline.saturating_duration_since(Instant::now());
        let reply = match tokio::time::timeout(left, provider.complete(access.gate(), &call)).await
        {
            Ok(Ok(reply)) => {
                access.count(&self.identity.label, &model, &reply.usage);
                reply
            }
            Ok(Err(e)) => return Err(unavailable(format!("model `{model}`: {e}"))),
            Err(_) => {
                return Err(unavailable(format!(
                    "model `{model}` did not answer within the call's time limit"
                )))
            }
        };
        Ok(model::Completion {
            text: reply.text.unwrap_or_default(),
            input_tokens: u32::try_from(reply.usage.input_tokens).unwrap_or(u32::MAX),
            output_tokens: u32::try_from(reply.usage.output_tokens).unwrap_or(u32::MAX),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sanitize_escapes_and_caps() {
        assert_eq!(sanitize("a\x1b[31mb\n", 100), "a\\u001b[31mb\\n");
        assert_eq!(
            sanitize("x\u{202e}y", 100),
            "x\\u202ey",
            "reordering marks too"
        );
        assert_eq!(sanitize("abcdef", 3), "abc…");
    }
}
