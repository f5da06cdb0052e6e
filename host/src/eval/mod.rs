//! Evaluations: the data model of cases, trials and traces as mst stores them.
//!
//! The runner, the shard protocol and the eval config build on these types; today they are
//! used by `mst plugin grade` and `mst plugin resolve` to feed plugins and print their output.

pub mod client;
pub mod config;
pub mod dataset;
pub mod dry_run;
pub mod plan;
pub mod run;
pub mod trial;
