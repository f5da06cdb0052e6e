//! Rate limits across all shards: most trials at once per model provider and per MCP server.
//! Workers `acquire` before each trial; the coordinator grants when every resource the trial
//! needs has room, and the trial's `trial` message gives the room back.

use crate::eval::config::RateLimits;
use crate::eval::trial::TrialKey;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Shared by the coordinators of every shard.
pub struct Limiter {
    limits: RateLimits,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Trials running per `provider:NAME` / `server:NAME`.
    in_use: BTreeMap<String, u32>,
    /// What each granted trial holds.
    held: BTreeMap<(u32, TrialKey), Vec<String>>,
    /// The most trials ever running at once per resource (for tests and reports).
    peak: BTreeMap<String, u32>,
}

impl Limiter {
    /// A limiter enforcing `limits`.
    pub fn new(limits: RateLimits) -> Self {
        Self {
            limits,
            state: Mutex::new(State::default()),
        }
    }

    fn resources(&self, providers: &[String], servers: &[String]) -> Vec<(String, Option<u32>)> {
        providers
            .iter()
            .map(|p| {
                (
                    format!("provider:{p}"),
                    self.limits.providers.get(p).copied(),
                )
            })
            .chain(
                servers
                    .iter()
                    .map(|s| (format!("server:{s}"), self.limits.servers.get(s).copied())),
            )
            .collect()
    }

    /// Grants `key` (of `shard`) its resources if all have room; all or nothing. A key that
    /// already holds its room is granted again without taking more.
    pub fn try_acquire(
        &self,
        shard: u32,
        key: &TrialKey,
        providers: &[String],
        servers: &[String],
    ) -> bool {
        let wanted = self.resources(providers, servers);
        let mut state = self.state.lock().expect("limiter lock");
        if state.held.contains_key(&(shard, key.clone())) {
            return true;
        }
        let full = wanted.iter().any(|(name, limit)| {
            limit.is_some_and(|l| state.in_use.get(name).copied().unwrap_or(0) >= l)
        });
        if full {
            return false;
        }
        for (name, _) in &wanted {
            let used = state.in_use.entry(name.clone()).or_default();
            *used += 1;
            let now = *used;
            let peak = state.peak.entry(name.clone()).or_default();
            *peak = (*peak).max(now);
        }
        state.held.insert(
            (shard, key.clone()),
            wanted.into_iter().map(|(n, _)| n).collect(),
        );
        true
    }

    /// Returns what `key` (of `shard`) held, if anything.
    pub fn release(&self, shard: u32, key: &TrialKey) {
        let mut state = self.state.lock().expect("limiter lock");
        if let Some(held) = state.held.remove(&(shard, key.clone())) {
            for name in held {
                if let Some(used) = state.in_use.get_mut(&name) {
                    *used = used.saturating_sub(1);
                }
            }
        }
    }

    /// Releases everything a shard held (when it ends or is lost).
    pub fn release_shard(&self, shard: u32) {
        let keys: Vec<TrialKey> = {
            let state = self.state.lock().expect("limiter lock");
            state
                .held
                .keys()
                .filter(|(s, _)| *s == shard)
                .map(|(_, k)| k.clone())
                .collect()
        };
        for key in keys {
            self.release(shard, &key);
        }
    }

    /// The most trials that ever ran at once per resource.
    pub fn peaks(&self) -> BTreeMap<String, u32> {
        self.state.lock().expect("limiter lock").peak.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(case: &str) -> TrialKey {
        TrialKey {
            variant: "v".into(),
            case: case.into(),
            trial: 0,
        }
    }

    #[test]
    fn limits_hold_across_shards_and_release() {
        let limiter = Limiter::new(RateLimits {
            servers: [("time".to_string(), 2)].into(),
            ..RateLimits::default()
        });
        let time = ["time".to_string()];
        assert!(limiter.try_acquire(0, &key("a"), &[], &time));
        assert!(limiter.try_acquire(1, &key("b"), &[], &time));
        assert!(
            !limiter.try_acquire(2, &key("c"), &[], &time),
            "two at once across shards"
        );
        assert!(
            limiter.try_acquire(2, &key("d"), &[], &[]),
            "unlimited resources always pass"
        );
        limiter.release(0, &key("a"));
        assert!(limiter.try_acquire(2, &key("c"), &[], &time));
        limiter.release_shard(1);
        limiter.release_shard(2);
        assert_eq!(limiter.peaks()["server:time"], 2);
        assert!(limiter.try_acquire(3, &key("e"), &[], &time));
    }

    #[test]
    fn asking_twice_for_one_trial_takes_room_once() {
        let limiter = Limiter::new(RateLimits {
            servers: [("time".to_string(), 2)].into(),
            ..RateLimits::default()
        });
        let time = ["time".to_string()];
        assert!(limiter.try_acquire(0, &key("a"), &[], &time));
        assert!(limiter.try_acquire(0, &key("a"), &[], &time));
        limiter.release(0, &key("a"));
        assert!(limiter.try_acquire(0, &key("b"), &[], &time));
        assert!(
            limiter.try_acquire(1, &key("c"), &[], &time),
            "a's room came back whole"
        );
        assert!(!limiter.try_acquire(1, &key("d"), &[], &time));
    }
}
