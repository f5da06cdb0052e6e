//! What the playground may spend on models: the server's budget (`mst serve --budget-tokens`,
//! `--budget-cost`) and each session's (`POST /sessions {"budget": …}`), in tokens and US
//! dollars as the traces' `usage` events count them (the agents' own word, as in a run's
//! summary).
//!
//! A session with a budget reserves it out of the server's when it is created, so sessions can
//! never promise more than the server has: a create the server cannot cover is a 402 before any
//! machine is made, and a create that fails afterwards gives its reservation back. A task is
//! admitted while its session (or, for a session without a budget of its own, the server) has
//! budget left, and refused with 402 otherwise; what a task cost is known only once it has run,
//! so the last admitted task may take a session past its budget (never the server past its
//! own, by more than that one task). When a session closes, what it reserved and did not spend
//! returns to the server.

use super::ServeError;
use crate::llm::UsageTotals;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

/// A spending limit: tokens (in and out), US dollars, either or both.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Limit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

impl Limit {
    /// Whether nothing is limited.
    pub fn is_none(&self) -> bool {
        self.tokens.is_none() && self.cost_usd.is_none()
    }

    /// Refuses a negative or non-finite cost, naming `what`.
    pub fn check(&self, what: &str) -> Result<(), String> {
        match self.cost_usd {
            Some(cost) if !(cost.is_finite() && cost >= 0.0) => {
                Err(format!("{what}'s `costUsd` must be a number ≥ 0"))
            }
            _ => Ok(()),
        }
    }
}

/// An amount spent or reserved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Amount {
    pub tokens: u64,
    pub cost_usd: f64,
}

impl Amount {
    fn of(usage: &UsageTotals) -> Self {
        Amount {
            tokens: usage.input_tokens + usage.output_tokens,
            cost_usd: usage.cost_usd.unwrap_or(0.0),
        }
    }

    fn add(&mut self, other: Amount) {
        self.tokens += other.tokens;
        self.cost_usd += other.cost_usd;
    }

    /// This amount less `other`, never below zero.
    fn minus(self, other: Amount) -> Amount {
        Amount {
            tokens: self.tokens.saturating_sub(other.tokens),
            cost_usd: (self.cost_usd - other.cost_usd).max(0.0),
        }
    }

    /// Whether `limit` is reached on either of its dimensions.
    fn reaches(self, limit: Limit) -> bool {
        limit.tokens.is_some_and(|t| self.tokens >= t)
            || limit.cost_usd.is_some_and(|c| self.cost_usd >= c)
    }
}

/// A session's budget as the API shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BudgetView {
    #[serde(default, skip_serializing_if = "Limit::is_none")]
    pub limit: Limit,
    pub spent: Amount,
}

/// One session's account.
struct Account {
    limit: Limit,
    /// What it holds of the server's budget (its own limit, on the dimensions the server
    /// limits).
    reserved: Amount,
    spent: Amount,
    /// The tasks already counted.
    charged: BTreeSet<String>,
}

#[derive(Default)]
struct Ledger {
    /// Everything spent, by open and closed sessions.
    spent: Amount,
    accounts: BTreeMap<String, Account>,
    /// Reservations of sessions being created.
    pending: Amount,
}

impl Ledger {
    /// Spent, plus what open (and opening) sessions hold and have not spent yet.
    fn committed(&self) -> Amount {
        let mut committed = self.spent;
        committed.add(self.pending);
        for account in self.accounts.values() {
            committed.add(account.reserved.minus(account.spent));
        }
        committed
    }
}

/// A reservation made for a session being created; give it to [`Budgets::open`] or
/// [`Budgets::release`].
#[must_use]
pub struct Reservation {
    limit: Limit,
    amount: Amount,
}

/// The server's budget and every session's.
pub struct Budgets {
    server: Limit,
    ledger: Mutex<Ledger>,
}

impl Budgets {
    /// The budgets under the server's `limit` (unlimited when it limits nothing).
    pub fn new(server: Limit) -> Self {
        Budgets {
            server,
            ledger: Mutex::new(Ledger::default()),
        }
    }

    /// Reserves `limit` for a session about to be made: 402 when the server's budget cannot
    /// cover it.
    pub fn reserve(&self, limit: Limit) -> Result<Reservation, ServeError> {
        let mut ledger = self.ledger.lock().expect("budgets");
        let committed = ledger.committed();
        let amount = Amount {
            tokens: self.server.tokens.and(limit.tokens).unwrap_or(0),
            cost_usd: self.server.cost_usd.and(limit.cost_usd).unwrap_or(0.0),
        };
        if let (Some(total), Some(asked)) = (self.server.tokens, limit.tokens) {
            if committed.tokens + asked > total {
                return Err(ServeError::payment_required(format!(
                    "a session budget of {asked} tokens is more than this server has left: \
                     {} of its {total} are spent or held by open sessions; ask for less, or \
                     close a session",
                    committed.tokens
                )));
            }
        }
        if let (Some(total), Some(asked)) = (self.server.cost_usd, limit.cost_usd) {
            if committed.cost_usd + asked > total {
                return Err(ServeError::payment_required(format!(
                    "a session budget of ${asked} is more than this server has left: ${:.4} of \
                     its ${total} is spent or held by open sessions; ask for less, or close a \
                     session",
                    committed.cost_usd
                )));
            }
        }
        ledger.pending.add(amount);
        Ok(Reservation { limit, amount })
    }

    /// Gives back the reservation of a create that failed.
    pub fn release(&self, reservation: Reservation) {
        let mut ledger = self.ledger.lock().expect("budgets");
        ledger.pending = ledger.pending.minus(reservation.amount);
    }

    /// Opens session `id`'s account with its reservation.
    pub fn open(&self, id: &str, reservation: Reservation) {
        let mut ledger = self.ledger.lock().expect("budgets");
        ledger.pending = ledger.pending.minus(reservation.amount);
        ledger.accounts.insert(
            id.to_string(),
            Account {
                limit: reservation.limit,
                reserved: reservation.amount,
                spent: Amount::default(),
                charged: BTreeSet::new(),
            },
        );
    }

    /// Counts what task `task` of session `id` used (once).
    pub fn charge(&self, id: &str, task: &str, usage: &UsageTotals) {
        let mut ledger = self.ledger.lock().expect("budgets");
        let Some(account) = ledger.accounts.get_mut(id) else {
            return;
        };
        if !account.charged.insert(task.to_string()) {
            return;
        }
        let amount = Amount::of(usage);
        account.spent.add(amount);
        ledger.spent.add(amount);
    }

    /// Whether task `task` of session `id` is counted already.
    pub fn charged(&self, id: &str, task: &str) -> bool {
        let ledger = self.ledger.lock().expect("budgets");
        ledger
            .accounts
            .get(id)
            .is_some_and(|a| a.charged.contains(task))
    }

    /// Admits a task on session `id`: 402 when its budget, or (on what it does not limit) the
    /// server's, is spent.
    pub fn admit(&self, id: &str) -> Result<(), ServeError> {
        let ledger = self.ledger.lock().expect("budgets");
        let Some(account) = ledger.accounts.get(id) else {
            return Ok(());
        };
        if account.spent.reaches(account.limit) {
            return Err(ServeError::payment_required(format!(
                "session `{id}` has spent its budget ({} tokens, ${:.4} of {}): open a new \
                 session, with a budget, to go on",
                account.spent.tokens,
                account.spent.cost_usd,
                describe(account.limit)
            )));
        }
        // The server's budget, on the dimensions the session's own does not cover.
        let uncovered = Limit {
            tokens: self
                .server
                .tokens
                .filter(|_| account.limit.tokens.is_none()),
            cost_usd: self
                .server
                .cost_usd
                .filter(|_| account.limit.cost_usd.is_none()),
        };
        let committed = ledger.committed();
        if committed.reaches(uncovered) {
            return Err(ServeError::payment_required(format!(
                "this server's budget ({}) is spent or held by open sessions ({} tokens, \
                 ${:.4}): close sessions, or restart mst serve with a larger budget",
                describe(self.server),
                committed.tokens,
                committed.cost_usd
            )));
        }
        Ok(())
    }

    /// Closes session `id`'s account: what it reserved and did not spend returns.
    pub fn close(&self, id: &str) {
        self.ledger.lock().expect("budgets").accounts.remove(id);
    }

    /// Session `id`'s budget and spend.
    pub fn view(&self, id: &str) -> Option<BudgetView> {
        let ledger = self.ledger.lock().expect("budgets");
        ledger.accounts.get(id).map(|a| BudgetView {
            limit: a.limit,
            spent: a.spent,
        })
    }

    /// The server's budget, spend and what open sessions hold.
    pub fn server_view(&self) -> serde_json::Value {
        let ledger = self.ledger.lock().expect("budgets");
        serde_json::json!({"limit": self.server, "spent": ledger.spent,
                           "committed": ledger.committed()})
    }
}

/// A limit in words.
fn describe(limit: Limit) -> String {
    match (limit.tokens, limit.cost_usd) {
        (Some(t), Some(c)) => format!("{t} tokens and ${c}"),
        (Some(t), None) => format!("{t} tokens"),
        (None, Some(c)) => format!("${c}"),
        (None, None) => "no limit".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tokens: u64) -> UsageTotals {
        UsageTotals {
            calls: 1,
            input_tokens: tokens,
            output_tokens: 0,
            cost_usd: None,
        }
    }

    #[test]
    fn sessions_reserve_out_of_the_server_and_give_back_what_they_did_not_spend() {
        let budgets = Budgets::new(Limit {
            tokens: Some(100),
            cost_usd: None,
        });
        let eighty = Limit {
            tokens: Some(80),
            cost_usd: None,
        };
        let fifty = Limit {
            tokens: Some(50),
            cost_usd: None,
        };
        budgets.open("a", budgets.reserve(eighty).unwrap());
        let refused = budgets.reserve(fifty).err().unwrap();
        assert_eq!(refused.status, 402, "{refused}");
        // A failed create gives its reservation back.
        let twenty = budgets
            .reserve(Limit {
                tokens: Some(20),
                cost_usd: None,
            })
            .unwrap();
        budgets.release(twenty);
        budgets.charge("a", "t1", &usage(30));
        budgets.charge("a", "t1", &usage(30));
        assert_eq!(budgets.view("a").unwrap().spent.tokens, 30, "charged once");
        budgets.close("a");
        // 30 spent; 70 free again.
        budgets.open("b", budgets.reserve(fifty).unwrap());
        assert!(budgets
            .reserve(Limit {
                tokens: Some(21),
                cost_usd: None
            })
            .is_err());
    }

    #[test]
    fn a_task_is_refused_once_its_session_or_the_server_has_spent_its_budget() {
        let budgets = Budgets::new(Limit {
            tokens: Some(100),
            cost_usd: None,
        });
        budgets.open(
            "own",
            budgets
                .reserve(Limit {
                    tokens: Some(40),
                    cost_usd: None,
                })
                .unwrap(),
        );
        budgets.open("shared", budgets.reserve(Limit::default()).unwrap());
        budgets.admit("own").unwrap();
        budgets.charge("own", "t1", &usage(45));
        assert_eq!(budgets.admit("own").err().unwrap().status, 402);
        // 45 spent by `own`, nothing held: `shared` has 55 left.
        budgets.admit("shared").unwrap();
        budgets.charge("shared", "t1", &usage(55));
        let refused = budgets.admit("shared").err().unwrap();
        assert_eq!(refused.status, 402);
        assert!(refused.message.contains("server's budget"), "{refused}");
    }
}
