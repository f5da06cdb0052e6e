//! Rate limits across all shards: most trials at once per MCP server, and most model calls at
//! once per provider. Workers `acquire` before each trial (its servers) and `acquire-call`
//! before each model call (its provider); the coordinator grants when every resource has room.
//! A call's `release-call` gives its slot back, a trial's `trial` message gives back the trial's
//! and any call slot it still held, and a shard that ends or is lost gives back all of its
//! room. The host's own model calls (plugins' calls while grading) take slots from the same
//! limiter through [`HostCalls`].

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
    /// One model call of a trial: its provider, for that call.
    Call {
        shard: u32,
        key: TrialKey,
        call: u32,
    },
    /// One model call the host itself makes (a plugin's, while grading).
    Host { call: u64 },
}

impl Holder {
    /// The shard and trial this holder belongs to, if any.
    fn trial(&self) -> Option<(u32, &TrialKey)> {
        match self {
            Holder::Trial { shard, key } | Holder::Call { shard, key, .. } => Some((*shard, key)),
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

    /// Returns what trial `key` of `shard` held: its own room and its calls' slots.
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

/// The host's own model calls (plugins' calls while grading) through the run's [`Limiter`]:
/// the same slots the workers' calls take.
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

    fn call(shard: u32, case: &str, call: u32) -> Holder {
        Holder::Call {
            shard,
            key: key(case),
            call,
        }
    }

    #[test]
    fn call_slots_come_back_with_their_trial_and_with_a_lost_shard() {
        let limiter = Limiter::new(RateLimits {
            providers: [("acme".to_string(), 1)].into(),
            ..RateLimits::default()
        });
        let acme = ["acme".to_string()];
        assert!(limiter.try_acquire(&trial(0, "a"), &[], &[]));
        assert!(limiter.try_acquire(&call(0, "a", 0), &acme, &[]));
        assert!(
            !limiter.try_acquire(&call(1, "b", 0), &acme, &[]),
            "one call at once"
        );
        // The trial ended (its `trial` message) while its call slot was still held.
        limiter.release_trial(0, &key("a"));
        assert!(limiter.try_acquire(&call(1, "b", 0), &acme, &[]));
        assert!(
            !limiter.try_acquire(&call(2, "c", 0), &acme, &[]),
            "b holds the slot"
        );
        // The worker of shard 1 is lost mid-call: its slot is not leaked.
        limiter.release_shard(1);
        assert!(limiter.try_acquire(&call(2, "c", 0), &acme, &[]));
        limiter.release(&call(2, "c", 0));
        assert!(limiter.try_acquire(&call(2, "c", 1), &acme, &[]));
        assert_eq!(limiter.peaks()["provider:acme"], 1);
    }

    #[test]
    fn host_calls_wait_for_the_slots_workers_hold() {
        let limiter = Arc::new(Limiter::new(RateLimits {
            providers: [("acme".to_string(), 1)].into(),
            ..RateLimits::default()
        }));
        let acme = ["acme".to_string()];
        assert!(limiter.try_acquire(&call(0, "a", 0), &acme, &[]));
        let host = HostCalls::new(limiter.clone());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let waiting = tokio::time::timeout(Duration::from_millis(100), host.acquire("acme"));
            assert!(waiting.await.is_err(), "the worker's call holds the slot");
            limiter.release(&call(0, "a", 0));
            let slot = host.acquire("acme").await;
            assert!(
                !limiter.try_acquire(&call(0, "a", 1), &acme, &[]),
                "the host's call holds it now"
            );
            drop(slot);
            assert!(limiter.try_acquire(&call(0, "a", 1), &acme, &[]));
        });
    }
}
