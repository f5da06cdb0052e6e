//! Shards: the `mst.shard/v1` protocol between a coordinator and the workers that collect
//! trials on machines. `docs/protocol.md` is the normative description; the types in
//! [`protocol`] are its single source, and its `read_messages` frames lines for both ends.
//! [`coordinator`] holds `ShardSession` (one bundle on one channel, as a state machine),
//! [`worker`] the worker's state machine (its trials on [`threads`]), [`bundle`] what a worker
//! receives, [`artifacts`] the files trials leave and how they come back, [`machine_checks`] what
//! the worker runs in the machine after a trial, [`check_files`] the hidden files those checks
//! get only then, [`limits`] the
//! rate limits shared by every shard of a run, and [`tokens`] the access tokens workers get
//! and their renewal.

pub mod artifacts;
pub mod bundle;
pub mod check_files;
pub mod coordinator;
pub mod gateway;
pub mod limits;
pub mod machine_checks;
pub mod model_calls;
pub mod protocol;
pub mod threads;
pub mod tokens;
pub mod worker;
