//! Reading a request body field by field: each value knows its place in the body
//! (`messages[2].content[0].id`), so that an error names the field the agent got wrong.

use super::WireError;
use serde_json::Value;

/// A value of the request body and where it is.
#[derive(Debug, Clone)]
pub(super) struct At<'a> {
    value: &'a Value,
    path: String,
}

impl<'a> At<'a> {
    /// The body itself.
    pub fn root(value: &'a Value) -> Self {
        At {
            value,
            path: String::new(),
        }
    }

    pub fn value(&self) -> &'a Value {
        self.value
    }

    /// The field `key`, when it is there and not `null`.
    pub fn get(&self, key: &str) -> Option<At<'a>> {
        let value = self.value.get(key).filter(|v| !v.is_null())?;
        let path = if self.path.is_empty() {
            key.to_string()
        } else {
            format!("{}.{key}", self.path)
        };
        Some(At { value, path })
    }

    /// The field `key`, which must be there.
    pub fn req(&self, key: &str) -> Result<At<'a>, WireError> {
        self.get(key).ok_or_else(|| {
            let path = if self.path.is_empty() {
                format!("`{key}`")
            } else {
                format!("`{}.{key}`", self.path)
            };
            WireError(format!("the request's {path} is missing"))
        })
    }

    /// An error about this value: it should be `wanted`.
    pub fn wrong(&self, wanted: &str) -> WireError {
        let found = match self.value {
            Value::Null => "null",
            Value::Bool(_) => "a boolean",
            Value::Number(_) => "a number",
            Value::String(_) => "a string",
            Value::Array(_) => "a list",
            Value::Object(_) => "an object",
        };
        WireError(format!(
            "the request's `{}` must be {wanted}, not {found}",
            self.path
        ))
    }

    pub fn str(&self) -> Result<&'a str, WireError> {
        self.value.as_str().ok_or_else(|| self.wrong("a string"))
    }

    /// The items of this list.
    pub fn items(&self) -> Result<Vec<At<'a>>, WireError> {
        let items = self.value.as_array().ok_or_else(|| self.wrong("a list"))?;
        Ok(items
            .iter()
            .enumerate()
            .map(|(n, value)| At {
                value,
                path: format!("{}[{n}]", self.path),
            })
            .collect())
    }

    /// The items of the list field `key`: none when it is not there.
    pub fn opt_items(&self, key: &str) -> Result<Vec<At<'a>>, WireError> {
        self.get(key).map_or(Ok(Vec::new()), |list| list.items())
    }

    /// This value, which must be a JSON object.
    pub fn object(&self) -> Result<&'a Value, WireError> {
        if self.value.is_object() {
            Ok(self.value)
        } else {
            Err(self.wrong("an object"))
        }
    }

    /// The string field `key`, if there.
    pub fn opt_str(&self, key: &str) -> Result<Option<&'a str>, WireError> {
        self.get(key).map(|v| v.str()).transpose()
    }

    /// The boolean field `key`, if there.
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, WireError> {
        self.get(key)
            .map(|v| v.value.as_bool().ok_or_else(|| v.wrong("true or false")))
            .transpose()
    }

    /// The number field `key`, if there.
    pub fn opt_f64(&self, key: &str) -> Result<Option<f64>, WireError> {
        self.get(key)
            .map(|v| v.value.as_f64().ok_or_else(|| v.wrong("a number")))
            .transpose()
    }

    /// The token count field `key`, if there (a count beyond `u32` is taken as `u32::MAX`).
    pub fn opt_tokens(&self, key: &str) -> Result<Option<u32>, WireError> {
        self.get(key)
            .map(|v| {
                v.value
                    .as_u64()
                    .map(|n| u32::try_from(n).unwrap_or(u32::MAX))
                    .ok_or_else(|| v.wrong("a whole number of tokens"))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn errors_name_the_field_by_its_place_in_the_body() {
        let body = json!({"messages": [{"role": "user"}, {"content": 3}], "n": "x"});
        let root = At::root(&body);
        let messages = root.req("messages").unwrap().items().unwrap();
        assert_eq!(
            messages[0].req("content").unwrap_err().0,
            "the request's `messages[0].content` is missing"
        );
        assert_eq!(
            messages[1].req("content").unwrap().str().unwrap_err().0,
            "the request's `messages[1].content` must be a string, not a number"
        );
        assert_eq!(
            root.req("model").unwrap_err().0,
            "the request's `model` is missing"
        );
        assert!(root
            .opt_tokens("n")
            .unwrap_err()
            .0
            .contains("`n` must be a whole number"));
        assert_eq!(root.opt_str("absent").unwrap(), None);
    }
}
