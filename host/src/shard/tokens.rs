//! The MCP access tokens a run hands its workers, and their renewal. Each server that names a
//! token gets the current value of its secret; a secret that carries an expiry is read again
//! from the secrets file when the value held is about to expire, so the operator renews a
//! token by rewriting that file while the run goes on. Both ends use [`renewal_due`]: the
//! worker asks (`need-tokens`, reason `expiring`), and the coordinator renews unasked.

use super::protocol::Token;
use crate::secrets::Secrets;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The longest a token is renewed ahead of its expiry.
const RENEW_AHEAD_MS: u64 = 30_000;

/// How often the secrets file is read again while a token is due for renewal.
const RELOAD_EVERY: Duration = Duration::from_secs(1);

/// Whether a token received at `received_ms` that expires at `expires_ms` should be renewed at
/// `now_ms`: in the last half of its life, or its last 30 seconds, whichever is shorter.
pub fn renewal_due(expires_ms: u64, received_ms: u64, now_ms: u64) -> bool {
    let ahead = (expires_ms.saturating_sub(received_ms) / 2).min(RENEW_AHEAD_MS);
    now_ms >= expires_ms.saturating_sub(ahead)
}

/// The tokens a run holds, by server label.
pub struct ServerTokens {
    /// Server label → the secret that holds its token.
    names: BTreeMap<String, String>,
    state: Mutex<State>,
}

struct State {
    secrets: Secrets,
    /// When each server's current value was first handed out.
    since: BTreeMap<String, u64>,
    reloaded: Option<Instant>,
}

impl ServerTokens {
    /// Tokens for `names` (server label → secret name) from `secrets`, which must hold them all.
    pub fn new(names: BTreeMap<String, String>, secrets: Secrets) -> Self {
        ServerTokens {
            names,
            state: Mutex::new(State {
                secrets,
                since: BTreeMap::new(),
                reloaded: None,
            }),
        }
    }

    /// No tokens at all.
    pub fn none() -> Self {
        Self::new(BTreeMap::new(), Secrets::default())
    }

    /// The current token of `server`, if the run has one. When the value held is due for
    /// renewal, the secrets file is read again (at most once a second) and a renewed value
    /// replaces it; a file that cannot be read keeps the old value (and the worker's trials
    /// meet the server's refusal, which their traces record).
    pub fn token(&self, server: &str) -> Option<Token> {
        let name = self.names.get(server)?;
        let mut state = self.state.lock().expect("tokens lock");
        let now = crate::clock::unix_millis();
        let since = *state.since.entry(server.to_string()).or_insert(now);
        let due = state
            .secrets
            .expires_at(name)
            .is_some_and(|expires| renewal_due(expires, since, now));
        let stale = state.reloaded.is_none_or(|at| at.elapsed() >= RELOAD_EVERY);
        if due && stale {
            state.reloaded = Some(Instant::now());
            if let Some(Ok(fresh)) = state.secrets.reload() {
                if fresh.get(name) != state.secrets.get(name) {
                    state.since.insert(server.to_string(), now);
                }
                state.secrets = fresh;
            }
        }
        let value = state.secrets.get(name)?;
        Some(Token {
            value,
            expires_at: state.secrets.expires_at(name),
        })
    }

    /// Every token, for checking that they fit one protocol line.
    pub fn all(&self) -> BTreeMap<String, Token> {
        self.names
            .keys()
            .filter_map(|server| Some((server.clone(), self.token(server)?)))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_is_due_in_the_last_half_or_the_last_thirty_seconds() {
        // A 10-second token: due from its fifth second.
        assert!(!renewal_due(10_000, 0, 4_999));
        assert!(renewal_due(10_000, 0, 5_000));
        // An hour-long token: due 30 s before it expires.
        let hour = 3_600_000;
        assert!(!renewal_due(hour, 0, hour - 30_001));
        assert!(renewal_due(hour, 0, hour - 30_000));
        assert!(renewal_due(hour, 0, hour + 1), "expired");
    }

    #[test]
    fn a_due_token_is_read_again_from_the_secrets_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("secrets.json");
        let now_s = crate::clock::unix_secs();
        let write = |value: &str, expires: u64| {
            let text = format!(r#"{{"T": {{"value": "{value}", "expiresAt": {expires}}}}}"#);
            std::fs::write(&file, text).unwrap();
        };
        // Already expired.
        write("old", now_s - 1);
        let tokens = ServerTokens::new(
            BTreeMap::from([("api".to_string(), "T".to_string())]),
            Secrets::load(&file).unwrap(),
        );
        write("new", now_s + 3600);
        let token = tokens.token("api").unwrap();
        assert_eq!(token.value.expose(), "new");
        assert_eq!(token.expires_at, Some((now_s + 3600) * 1000));
        assert!(tokens.token("other").is_none());
    }
}
