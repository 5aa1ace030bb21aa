//! The filters a custom-auth handler answers (LangGraph's `FilterType`), read into a
//! [`MetadataCondition`] that storage applies in a search and checks on a resource already
//! read, as LangGraph Platform evaluates them:
//!
//! - `{"key": value}` and `{"key": {"$eq": value}}`: the metadata's `key` equals `value`;
//! - `{"key": {"$contains": value}}`: the metadata's `key` is a list holding `value` (or, for a
//!   list, each of its values);
//! - `{"$or": [f, g, ...]}`: one of at least two filters holds; `{"$and": [f, g, ...]}`: all of
//!   them; both combine with the other keys of their object (all must hold), and nest at most
//!   two levels deep.
//!
//! Anything else (another operator, a malformed `$or`, values Spindle cannot compare exactly)
//! is an error for the request, with LangGraph's status (500: the handler is at fault), never a
//! filter that silently matches nothing or everything.
//!
//! A store search's handler filter is a filter on the items' values, in the store's own
//! syntax, as LangGraph applies it: [`store_conditions`] reads it, and the search meets it
//! besides the client's `filter`.

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{json, Map, Value};
use spindle_storage::store::parse_filter;
use spindle_storage::{FilterCondition, MetadataCondition};

/// How deep `$or` and `$and` may nest (LangGraph's limit).
const MAX_DEPTH: usize = 2;

/// A handler's filter that cannot be applied, with what LangGraph says about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterError(String);

impl FilterError {
    fn new(message: impl Into<String>) -> Self {
        Self(message.into())
    }
}

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl IntoResponse for FilterError {
    fn into_response(self) -> Response {
        tracing::warn!(error = %self.0, "a custom auth handler answered a filter that cannot be applied");
        let body = json!({"error": "Internal Server Error", "message": self.0, "details": {}});
        (StatusCode::INTERNAL_SERVER_ERROR, axum::Json(body)).into_response()
    }
}

/// The condition a handler's filters (a non-empty object) put on a resource's metadata.
pub fn parse(filters: &Map<String, Value>) -> Result<MetadataCondition, FilterError> {
    parse_object(filters, 0)
}

/// An object of filters: every key must hold.
fn parse_object(
    filters: &Map<String, Value>,
    depth: usize,
) -> Result<MetadataCondition, FilterError> {
    let mut all = Vec::with_capacity(filters.len());
    for (key, value) in filters {
        match key.as_str() {
            "$or" => all.push(MetadataCondition::Any(branches("$or", value, depth)?)),
            "$and" => all.push(MetadataCondition::All(branches("$and", value, depth)?)),
            _ if key.starts_with('$') => {
                return Err(FilterError::new(format!(
                    "Your auth handler returned a filter with the operator {key} at the top \
                     level; only $or and $and combine filters there. Check the filter returned \
                     by your auth handler."
                )))
            }
            _ => all.push(parse_field(key, value)?),
        }
    }
    Ok(match all.len() {
        1 => all.remove(0),
        _ => MetadataCondition::All(all),
    })
}

/// The filters of an `$or` or `$and`: a list of at least two objects, one level deeper.
fn branches(
    operator: &str,
    value: &Value,
    depth: usize,
) -> Result<Vec<MetadataCondition>, FilterError> {
    if depth >= MAX_DEPTH {
        return Err(FilterError::new(format!(
            "Your auth handler returned a filter with too much nesting. Maximum nesting depth \
             is {MAX_DEPTH}. Check the filter returned by your auth handler."
        )));
    }
    let invalid = || {
        FilterError::new(format!(
            "Your auth handler returned a filter with an invalid {operator} operator. The \
             {operator} operator must be a list of at least 2 filter objects. Check the filter \
             returned by your auth handler."
        ))
    };
    let Some(list) = value.as_array().filter(|list| list.len() >= 2) else {
        return Err(invalid());
    };
    list.iter()
        .map(|branch| match branch {
            Value::Object(filters) => parse_object(filters, depth + 1),
            _ => Err(invalid()),
        })
        .collect()
}

/// One field's filter: a plain value (equality), or `{"$eq": v}` or `{"$contains": v}`.
fn parse_field(key: &str, filter: &Value) -> Result<MetadataCondition, FilterError> {
    let (operator, value) = match filter {
        Value::Object(op) if op.len() == 1 => {
            let (operator, value) = op.iter().next().expect("one entry");
            (operator.as_str(), value)
        }
        Value::Object(_) => {
            return Err(FilterError::new(format!(
                "Your auth handler returned a filter with an invalid value for {key}. The \
                 value must be a dict with one key. Check the filter returned by your auth \
                 handler."
            )))
        }
        plain => ("$eq", plain),
    };
    let wanted = match operator {
        "$eq" => comparable(key, value)?.clone(),
        "$contains" => match value {
            Value::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|item| comparable(key, item).cloned())
                    .collect::<Result<_, _>>()?,
            ),
            item => json!([comparable(key, item)?]),
        },
        other => {
            return Err(FilterError::new(format!(
                "Your auth handler returned a filter with the operator {other} for {key}. The \
                 key must be one of $eq or $contains. Check the filter returned by your auth \
                 handler."
            )))
        }
    };
    Ok(MetadataCondition::Contains(json!({ key: wanted })))
}

/// A value a field can be compared with exactly: a string, number, boolean or null. For
/// these, jsonb containment (what the database applies) is equality; for an object or a list
/// it is not, so they are refused rather than matched loosely.
fn comparable<'v>(key: &str, value: &'v Value) -> Result<&'v Value, FilterError> {
    match value {
        Value::Object(_) | Value::Array(_) => Err(FilterError::new(format!(
            "Your auth handler returned a filter comparing {key} with {value}: Spindle compares \
             metadata with strings, numbers, booleans and null only. Check the filter returned \
             by your auth handler."
        ))),
        _ => Ok(value),
    }
}

/// The conditions a store search handler's filters put on the items' values.
pub fn store_conditions(filters: &Map<String, Value>) -> Result<Vec<FilterCondition>, FilterError> {
    parse_filter(filters).map_err(|e| {
        FilterError::new(format!(
            "Your auth handler returned a store filter that cannot be applied at {}: {}. Check \
             the filter returned by your auth handler.",
            e.path.join("."),
            e.message
        ))
    })
}

/// The conditions a store search handler's filters put on the items (none without).
#[derive(Debug, Clone, Default)]
pub struct StoreHandlerFilter(pub Vec<FilterCondition>);

impl<S: Send + Sync> FromRequestParts<S> for StoreHandlerFilter {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<StoreHandlerFilter>()
            .cloned()
            .unwrap_or_default())
    }
}

/// The condition the `@auth.on` handler's filters put on the resources a search may return,
/// set by the custom-auth middleware (`None`: no handler filter).
#[derive(Debug, Clone, Default)]
pub struct HandlerFilter(pub Option<MetadataCondition>);

impl<S: Send + Sync> FromRequestParts<S> for HandlerFilter {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<HandlerFilter>()
            .cloned()
            .unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MetadataCondition::{All, Any, Contains};

    fn parsed(filters: Value) -> Result<MetadataCondition, FilterError> {
        parse(filters.as_object().unwrap())
    }

    #[test]
    fn equality_and_membership_become_containment() {
        assert_eq!(
            parsed(json!({"owner": "ann"})).unwrap(),
            Contains(json!({"owner": "ann"}))
        );
        assert_eq!(
            parsed(
                json!({"owner": "ann", "org": {"$eq": 7}, "tags": {"$contains": "x"},
                          "team": {"$contains": ["a", "b"]}})
            )
            .unwrap(),
            All(vec![
                Contains(json!({"owner": "ann"})),
                Contains(json!({"org": 7})),
                Contains(json!({"tags": ["x"]})),
                Contains(json!({"team": ["a", "b"]})),
            ])
        );
    }

    #[test]
    fn or_and_and_nest_with_the_other_keys() {
        let filter = json!({
            "$or": [{"owner": "ann"}, {"created_by": "system"}],
            "org": "acme",
        });
        let condition = parsed(filter).unwrap();
        assert_eq!(
            condition,
            All(vec![
                Any(vec![
                    Contains(json!({"owner": "ann"})),
                    Contains(json!({"created_by": "system"})),
                ]),
                Contains(json!({"org": "acme"})),
            ])
        );
        assert!(condition.holds(&json!({"owner": "ann", "org": "acme"})));
        assert!(condition.holds(&json!({"created_by": "system", "org": "acme"})));
        assert!(!condition.holds(&json!({"owner": "ben", "org": "acme"})));
        assert!(!condition.holds(&json!({"owner": "ann"})));

        let nested = parsed(json!({"$and": [
            {"$or": [{"owner": "ann"}, {"shared": {"$contains": "ann"}}]},
            {"org": "acme"},
        ]}))
        .unwrap();
        assert!(nested.holds(&json!({"shared": ["ben", "ann"], "org": "acme"})));
        assert!(!nested.holds(&json!({"shared": "ann", "org": "acme"})));
    }

    #[test]
    fn what_cannot_be_applied_is_an_error() {
        for bad in [
            json!({"owner": {"$ne": "ann"}}),
            json!({"owner": {"$eq": "ann", "$contains": "x"}}),
            json!({"$or": [{"owner": "ann"}]}),
            json!({"$or": {"owner": "ann"}}),
            json!({"$and": [{"owner": "ann"}, "system"]}),
            json!({"$not": {"owner": "ann"}}),
            json!({"owner": {"$eq": {"id": 1}}}),
            json!({"owner": ["ann"]}),
            json!({"tags": {"$contains": [["x"]]}}),
            json!({"$or": [{"$or": [{"$or": [{"a": 1}, {"b": 2}]}, {"c": 3}]}, {"d": 4}]}),
        ] {
            assert!(parsed(bad.clone()).is_err(), "{bad}");
        }
        // Two levels of nesting are allowed, as in LangGraph.
        parsed(json!({"$or": [{"$and": [{"a": 1}, {"b": 2}]}, {"c": 3}]})).unwrap();
    }
}
