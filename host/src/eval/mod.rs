//! The eval data model: the config, cases and datasets, trial keys and traces, and the plan.
//! Pure data and its rules: nothing here starts a process, a machine or a plugin call (dataset
//! plugins are called through [`crate::plugin`] when a config names one).

pub mod case_ids;
pub mod config;
pub mod dataset;
pub mod per_trial;
pub mod plan;
pub mod positions;
pub mod trial;
