//! MST's file formats as typed structs, one module per generation: [`v2`] (2.0 eval configs,
//! datasets, cases and their assertions) and [`v1`] (the keys 1.x cases had that 2.0 dropped,
//! read beside 2.0's: a 1.x dataset has 2.0's `{"name", "cases"}` shape).
//!
//! Every struct keeps the keys it does not name in a flattened `rest`, which the converters
//! report (dropped, or no MST key at all), so that nothing is lost silently. A value of the
//! wrong type reads as absent ([`lenient`]), as the importer has always passed over it: mst's
//! own load of the written files then names what is left to fix.

pub(super) mod v1;
pub(super) mod v2;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer};
use serde_json::Value;

/// Reads a present field as `T`, or as absent when its value has another shape. With `T`
/// = [`Value`], a present `null` stays `Some(Value::Null)`: the converters tell a key given
/// as `null` from a missing one, as they did reading the JSON itself.
pub(super) fn lenient<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: DeserializeOwned,
{
    let value = Value::deserialize(deserializer)?;
    Ok(T::deserialize(value).ok())
}

/// Reads `value` as `T`; a value of another shape (not an object) reads as `T`'s default,
/// with nothing present.
pub(super) fn shape<T: DeserializeOwned + Default>(value: &Value) -> T {
    T::deserialize(value).unwrap_or_default()
}
