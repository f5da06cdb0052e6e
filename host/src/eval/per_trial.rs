//! What some trials get from their case, else from their variant: a workspace's digest, an
//! image. Most evals name few, so only those that name one are held.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A value by case id and by variant name; a trial gets its case's, else its variant's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaseOrVariant<T> {
    /// By variant name.
    #[serde(default = "BTreeMap::new", skip_serializing_if = "BTreeMap::is_empty")]
    pub variants: BTreeMap<String, T>,
    /// By case id: the cases that have their own.
    #[serde(default = "BTreeMap::new", skip_serializing_if = "BTreeMap::is_empty")]
    pub cases: BTreeMap<String, T>,
}

impl<T> Default for CaseOrVariant<T> {
    fn default() -> Self {
        CaseOrVariant {
            variants: BTreeMap::new(),
            cases: BTreeMap::new(),
        }
    }
}

impl<T> CaseOrVariant<T> {
    /// Whether no trial gets one.
    pub fn is_empty(&self) -> bool {
        self.variants.is_empty() && self.cases.is_empty()
    }

    /// What `variant`'s trials of `case` get: the case's, else the variant's.
    pub fn of(&self, variant: &str, case: &str) -> Option<&T> {
        self.cases.get(case).or_else(|| self.variants.get(variant))
    }
}
