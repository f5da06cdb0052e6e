//! Shards: the `mst.shard/v1` protocol between a coordinator and the workers that collect
//! trials on machines. `docs/protocol.md` is the normative description; the types in
//! [`protocol`] are its single source.

pub mod bundle;
pub mod coordinator;
pub mod limits;
pub mod protocol;
pub mod worker;
