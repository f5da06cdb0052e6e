//! Rate limits across all shards: most trials at once per MCP server, and most model calls at
//! once per provider. Workers `acquire` before each trial (its servers); the coordinator grants
//! when every server has room, a trial's `trial` message gives its room back, and a shard that
//! ends or is lost gives back all of its room. Every model call to a provider is the host's
//! own (an agent's, made through the machine's model gateway; a plugin's, while grading) and
//! takes its provider's slot from the same limiter through [`HostCalls`].

use crate::eval::config::RateLimits;
use crate::eval::trial::TrialKey;
use crate::llm::{CallGate, CallSlot};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Who holds room.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Holder {
    /// A trial of a shard: its MCP servers, for the whole trial.
    Trial { shard: u32, key: TrialKey },
    /// One model call the host makes (an agent's through the gateway, a plugin's): its
    /// provider, for that call.
    Host { call: u64 },
}

impl Holder {
    /// The shard and trial this holder belongs to, if any.
    fn trial(&self) -> Option<(u32, &TrialKey)> {
        match self {
            Holder::Trial { shard, key } => Some((*shard, key)),
            Holder::Host { .. } => None,
        }
    }
}

/// Shared by the coordinators of every shard and by the host's own model calls.
pub struct Limiter {
    limits: RateLimits,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// Holders per `provider:NAME` / `server:NAME`.
    in_use: BTreeMap<String, u32>,
    /// What each holder holds.
    held: BTreeMap<Holder, Vec<String>>,
    /// The most holders ever at once per resource (for tests and reports).
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

    /// Grants `holder` the `providers` and `servers` if all have room; all or nothing. A
    /// holder that already holds its room is granted again without taking more.
    pub fn try_acquire(&self, holder: &Holder, providers: &[String], servers: &[String]) -> bool {
        let wanted = self.resources(providers, servers);
        let mut state = self.state.lock().expect("limiter lock");
        if state.held.contains_key(holder) {
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
        state
            .held
            .insert(holder.clone(), wanted.into_iter().map(|(n, _)| n).collect());
        true
    }

    /// Gives back what the holders `which` picks held.
    fn release_where(&self, which: impl Fn(&Holder) -> bool) {
        let mut state = self.state.lock().expect("limiter lock");
        let holders: Vec<Holder> = state.held.keys().filter(|h| which(h)).cloned().collect();
        for holder in holders {
            for name in state.held.remove(&holder).unwrap_or_default() {
                if let Some(used) = state.in_use.get_mut(&name) {
                    *used = used.saturating_sub(1);
                }
            }
        }
    }

    /// Returns what `holder` held, if anything.
    pub fn release(&self, holder: &Holder) {
        self.release_where(|h| h == holder);
    }

    /// Returns what trial `key` of `shard` held.
    pub fn release_trial(&self, shard: u32, key: &TrialKey) {
        self.release_where(|h| h.trial() == Some((shard, key)));
    }

    /// Releases everything a shard held (when it ends or is lost).
    pub fn release_shard(&self, shard: u32) {
        self.release_where(|h| h.trial().is_some_and(|(s, _)| s == shard));
    }

    /// The most holders that ever held each resource at once.
    pub fn peaks(&self) -> BTreeMap<String, u32> {
        self.state.lock().expect("limiter lock").peak.clone()
    }
}

/// How often a host call waiting for a provider slot looks again (the coordinators look as
/// often).
const HOST_POLL: Duration = Duration::from_millis(10);

/// The host's model calls (agents' through the gateway, plugins' while grading) through the
/// run's [`Limiter`], so a provider's limit holds across every shard and the grading.
pub struct HostCalls {
    limiter: Arc<Limiter>,
    next: AtomicU64,
}

impl HostCalls {
    /// Calls through `limiter`.
    pub fn new(limiter: Arc<Limiter>) -> Self {
        HostCalls {
            limiter,
            next: AtomicU64::new(0),
        }
    }
}

impl CallGate for HostCalls {
    fn acquire<'a>(
        &'a self,
        provider: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = CallSlot> + Send + 'a>> {
        let holder = Holder::Host {
            call: self.next.fetch_add(1, Ordering::Relaxed),
        };
        Box::pin(async move {
            let limiter = self.limiter.clone();
            let release = holder.clone();
            // Made before waiting: a call abandoned while it waits holds nothing afterwards.
            let slot = CallSlot::new(move || limiter.release(&release));
            let providers = [provider.to_string()];
            while !self.limiter.try_acquire(&holder, &providers, &[]) {
                tokio::time::sleep(HOST_POLL).await;
            }
            slot
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(case: &str) -> TrialKey {
        TrialKey::new("v", case, 0)
    }

    fn trial(shard: u32, case: &str) -> Holder {
        Holder::Trial {
            shard,
            key: key(case),
        }
    }

    #[test]
    fn limits_hold_across_shards_and_release() {
        let limiter = Limiter::new(RateLimits {
            servers: [("time".to_string(), 2)].into(),
            ..RateLimits::default()
        });
        let time = ["time".to_string()];
        assert!(limiter.try_acquire(&trial(0, "a"), &[], &time));
        assert!(limiter.try_acquire(&trial(1, "b"), &[], &time));
        assert!(
            !limiter.try_acquire(&trial(2, "c"), &[], &time),
            "two at once across shards"
        );
        assert!(
            limiter.try_acquire(&trial(2, "d"), &[], &[]),
            "unlimited resources always pass"
        );
        limiter.release(&trial(0, "a"));
        assert!(limiter.try_acquire(&trial(2, "c"), &[], &time));
        limiter.release_shard(1);
        limiter.release_shard(2);
        assert_eq!(limiter.peaks()["server:time"], 2);
        assert!(limiter.try_acquire(&trial(3, "e"), &[], &time));
    }

    #[test]
    fn asking_twice_for_one_trial_takes_room_once() {
        let limiter = Limiter::new(RateLimits {
            servers: [("time".to_string(), 2)].into(),
            ..RateLimits::default()
        });
        let time = ["time".to_string()];
        assert!(limiter.try_acquire(&trial(0, "a"), &[], &time));
        assert!(limiter.try_acquire(&trial(0, "a"), &[], &time));
        limiter.release(&trial(0, "a"));
        assert!(limiter.try_acquire(&trial(0, "b"), &[], &time));
        assert!(
            limiter.try_acquire(&trial(1, "c"), &[], &time),
            "a's room came back whole"
        );
        assert!(!limiter.try_acquire(&trial(1, "d"), &[], &time));
    }

    #[test]
    fn a_providers_calls_wait_for_its_slot_and_an_abandoned_wait_holds_nothing() {
        let limiter = Arc::new(Limiter::new(RateLimits {
            providers: [("acme".to_string(), 1)].into(),
            ..RateLimits::default()
        }));
        let calls = HostCalls::new(limiter.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let first = calls.acquire("acme").await;
            let waiting = tokio::time::timeout(Duration::from_millis(100), calls.acquire("acme"));
            assert!(waiting.await.is_err(), "the first call holds the only slot");
            let other = tokio::time::timeout(Duration::from_millis(100), calls.acquire("other"));
            assert!(other.await.is_ok(), "another provider has no limit");
            drop(first);
            let second = calls.acquire("acme").await;
            assert_eq!(limiter.peaks()["provider:acme"], 1);
            drop(second);
        });
        // The wait abandoned at its timeout took nothing: the slot is free.
        assert!(limiter.try_acquire(&Holder::Host { call: 99 }, &["acme".into()], &[]));
    }
}
