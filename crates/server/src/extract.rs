//! Extractors that turn a request into typed values or a 422 naming the offending field.
//!
//! axum's own `Json` and `Query` answer bad input with plain-text 400/415/422 bodies; these
//! answer with the interface's `{"detail": [{"loc", "msg", "type", ...}]}` instead, locating
//! the field through `serde_path_to_error`, then run the type's [`Validate`] rules (lengths,
//! ranges) that serde cannot express.

use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};

use spindle_storage::{filter_depth, filter_values, MAX_FILTER_DEPTH, MAX_FILTER_VALUES};

use crate::error::{ApiError, ErrorCode, ValidationItem};

/// Rules a request type checks after it deserialised.
pub trait Validate {
    fn validate(&self, _v: &mut Violations) {}

    /// Whether the body is a JSON object (every request type but a list). serde fills a
    /// struct from a sequence too (`["<uuid>", {...}]` by field position), so a body that
    /// is an array where an object is expected is refused before serde sees it.
    fn is_object() -> bool
    where
        Self: Sized,
    {
        true
    }
}

/// A free-form JSON object has no rules of its own.
impl Validate for serde_json::Map<String, Value> {}

/// A list checks each item, locating failures by index (`["body", 2, "limit"]`).
impl<T: Validate> Validate for Vec<T> {
    fn is_object() -> bool {
        false
    }

    fn validate(&self, v: &mut Violations) {
        for (index, item) in self.iter().enumerate() {
            let mut inner = Violations::new(v.prefix);
            item.validate(&mut inner);
            for mut failure in inner.items {
                failure.loc.insert(1, json!(index));
                v.items.push(failure);
            }
        }
    }
}

/// Collects validation failures under one location prefix (`body`, `query`).
pub struct Violations {
    prefix: &'static str,
    items: Vec<ValidationItem>,
}

impl Violations {
    pub fn new(prefix: &'static str) -> Self {
        Self {
            prefix,
            items: Vec::new(),
        }
    }

    fn loc(&self, field: &[&str]) -> Vec<Value> {
        std::iter::once(self.prefix)
            .chain(field.iter().copied())
            .map(|s| Value::String(s.to_owned()))
            .collect()
    }

    pub fn push(
        &mut self,
        field: &[&str],
        kind: &str,
        msg: impl Into<String>,
        input: Value,
        ctx: Value,
    ) {
        let item = ValidationItem::new(self.loc(field), kind, msg).with_input(input);
        self.items.push(if ctx.is_null() {
            item
        } else {
            item.with_ctx(ctx)
        });
    }

    /// `value` has at most `max` characters.
    pub fn max_len(&mut self, field: &str, value: Option<&str>, max: usize) {
        if let Some(s) = value {
            if s.chars().count() > max {
                self.push(
                    &[field],
                    "string_too_long",
                    format!("String should have at most {max} characters"),
                    json!(s),
                    json!({ "max_length": max }),
                );
            }
        }
    }

    /// `value` lies within `min..=max`.
    pub fn range(&mut self, field: &str, value: Option<i64>, min: i64, max: Option<i64>) {
        let Some(n) = value else { return };
        if n < min {
            self.push(
                &[field],
                "greater_than_equal",
                format!("Input should be greater than or equal to {min}"),
                json!(n),
                json!({ "ge": min }),
            );
        } else if let Some(max) = max.filter(|max| n > *max) {
            self.push(
                &[field],
                "less_than_equal",
                format!("Input should be less than or equal to {max}"),
                json!(n),
                json!({ "le": max }),
            );
        }
    }

    /// A search filter holds at most [`MAX_FILTER_VALUES`] values (counted at any depth) and
    /// nests at most [`MAX_FILTER_DEPTH`] levels, so that its query stays within what the
    /// database takes, on both backends alike.
    pub fn filter_size(&mut self, field: &str, filter: Option<&serde_json::Map<String, Value>>) {
        let Some(filter) = filter else { return };
        let count = filter_values(filter);
        let depth = filter_depth(filter);
        let refusal = if count > MAX_FILTER_VALUES {
            format!(
                "A filter should hold at most {MAX_FILTER_VALUES} values (keys' values and array \
                 items, at any depth), not {count}"
            )
        } else if depth > MAX_FILTER_DEPTH {
            format!(
                "A filter should nest at most {MAX_FILTER_DEPTH} levels of objects and arrays, \
                 not {depth}"
            )
        } else {
            return;
        };
        self.push(
            &[field],
            "too_long",
            refusal,
            Value::Object(filter.clone()),
            json!({ "max_values": MAX_FILTER_VALUES, "max_depth": MAX_FILTER_DEPTH }),
        );
    }

    pub fn into_result(self) -> Result<(), ApiError> {
        if self.items.is_empty() {
            Ok(())
        } else {
            Err(ApiError::validation(self.items))
        }
    }
}

/// A JSON body. An empty body reads as `{}`, since clients send none to endpoints whose fields
/// are all optional (their annotations say `request_body = Option<T>`: the body may be left
/// out).
pub struct ApiJson<T>(pub T);

impl<S, T> FromRequest<S> for ApiJson<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::new(ErrorCode::PayloadTooLarge, e.body_text())
            } else {
                ApiError::field(vec![json!("body")], "body_read", e.body_text())
            }
        })?;
        parse_body(&bytes).map(ApiJson)
    }
}

/// Deserialises and validates a JSON body.
pub fn parse_body<T: DeserializeOwned + Validate>(bytes: &[u8]) -> Result<T, ApiError> {
    // No body at all, not a blank one: whitespace alone is not JSON.
    let bytes: &[u8] = if bytes.is_empty() { b"{}" } else { bytes };
    if T::is_object() {
        refuse_array(bytes)?;
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value: T =
        serde_path_to_error::deserialize(&mut de).map_err(|err| body_error(bytes, err))?;
    de.end().map_err(|err| json_invalid(&err))?;
    refuse_nul(bytes)?;
    let mut violations = Violations::new("body");
    value.validate(&mut violations);
    violations.into_result()?;
    Ok(value)
}

fn body_error(bytes: &[u8], err: serde_path_to_error::Error<serde_json::Error>) -> ApiError {
    let inner = err.inner();
    if inner.is_syntax() || inner.is_eof() {
        return json_invalid(inner);
    }
    let mut loc = vec![json!("body")];
    loc.extend(path_segments(err.path()));
    let input = serde_json::from_slice::<Value>(bytes)
        .ok()
        .and_then(|doc| lookup(&doc, &loc[1..]).cloned());
    ApiError::validation(vec![describe(
        loc,
        &strip_position(&inner.to_string()),
        input,
    )])
}

/// Refuses a body that is a JSON array where an object is expected (see
/// [`Validate::is_object`]). Other non-objects (strings, numbers, null) serde refuses itself.
fn refuse_array(bytes: &[u8]) -> Result<(), ApiError> {
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'[') {
        return Ok(());
    }
    let input = serde_json::from_slice::<Value>(bytes).unwrap_or(Value::Null);
    Err(ApiError::validation(vec![ValidationItem::new(
        vec![json!("body")],
        "dict_type",
        "Input should be a valid dictionary or object",
    )
    .with_input(input)]))
}

/// Refuses a NUL character anywhere in the body's strings (keys included). PostgreSQL cannot
/// store it in `text` or `jsonb`, so refusing it up front keeps both backends alike and turns
/// what would be a database error into a 422 naming the field.
fn refuse_nul(bytes: &[u8]) -> Result<(), ApiError> {
    // In valid JSON a NUL can only be written as the escape `\u0000`; skip the walk otherwise.
    let escaped = bytes
        .windows(6)
        .any(|w| w[0] == b'\\' && w[1] == b'u' && w[2..].eq_ignore_ascii_case(b"0000"));
    if !escaped {
        return Ok(());
    }
    let Ok(doc) = serde_json::from_slice::<Value>(bytes) else {
        return Ok(());
    };
    let mut loc = vec![json!("body")];
    if find_nul(&doc, &mut loc) {
        return Err(ApiError::validation(vec![ValidationItem::new(
            loc,
            "string_nul",
            "Strings may not contain the NUL character (\\u0000)",
        )]));
    }
    Ok(())
}

/// Depth-first search for a string holding NUL; `loc` ends at it when found.
fn find_nul(value: &Value, loc: &mut Vec<Value>) -> bool {
    let mut descend = |key: Value, key_has_nul: bool, item: &Value| {
        loc.push(key);
        let found = key_has_nul || find_nul(item, loc);
        if !found {
            loc.pop();
        }
        found
    };
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .any(|(i, item)| descend(json!(i), false, item)),
        Value::Object(map) => map
            .iter()
            .any(|(key, item)| descend(json!(key), key.contains('\0'), item)),
        _ => false,
    }
}

fn json_invalid(err: &serde_json::Error) -> ApiError {
    ApiError::validation(vec![ValidationItem::new(
        vec![json!("body"), json!(err.column())],
        "json_invalid",
        format!("Invalid JSON: {}", strip_position(&err.to_string())),
    )
    .with_ctx(json!({ "line": err.line(), "column": err.column() }))])
}

/// A query string, parsed with repeated keys allowed (`?namespace=a&namespace=b`).
pub struct ApiQuery<T>(pub T);

impl<S, T> FromRequestParts<S> for ApiQuery<T>
where
    S: Send + Sync,
    T: DeserializeOwned + Validate,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let query = parts.uri.query().unwrap_or_default();
        let de = serde_html_form::Deserializer::from_bytes(query.as_bytes());
        let value: T = serde_path_to_error::deserialize(de).map_err(|err| {
            let mut loc = vec![json!("query")];
            loc.extend(path_segments(err.path()));
            ApiError::validation(vec![describe(loc, &err.inner().to_string(), None)])
        })?;
        let mut violations = Violations::new("query");
        value.validate(&mut violations);
        violations.into_result()?;
        Ok(ApiQuery(value))
    }
}

fn path_segments(path: &serde_path_to_error::Path) -> Vec<Value> {
    use serde_path_to_error::Segment;
    path.iter()
        .filter_map(|segment| match segment {
            Segment::Seq { index } => Some(json!(index)),
            Segment::Map { key } => Some(json!(key)),
            Segment::Enum { variant } => Some(json!(variant)),
            Segment::Unknown => None,
        })
        .collect()
}

fn lookup<'a>(doc: &'a Value, loc: &[Value]) -> Option<&'a Value> {
    loc.iter().try_fold(doc, |node, part| match part {
        Value::String(key) => node.get(key.as_str()),
        Value::Number(n) => node.get(n.as_u64()? as usize),
        _ => None,
    })
}

/// serde_json appends " at line L column C"; the location is already in `loc`.
fn strip_position(msg: &str) -> String {
    match msg.rfind(" at line ") {
        Some(at) => msg[..at].to_owned(),
        None => msg.to_owned(),
    }
}

/// Turns a serde message into a validation item with a pydantic-like `type`.
fn describe(mut loc: Vec<Value>, msg: &str, input: Option<Value>) -> ValidationItem {
    if let Some(field) = between(msg, "missing field `", "`") {
        loc.push(json!(field));
        return ValidationItem::new(loc, "missing", "Field required");
    }
    let item = if let Some(rest) = msg.strip_prefix("unknown variant `") {
        let expected = rest
            .split_once(", expected ")
            .map(|(_, e)| e)
            .unwrap_or_default();
        ValidationItem::new(loc, "enum", format!("Input should be {expected}"))
            .with_ctx(json!({ "expected": expected }))
    } else if msg.starts_with("invalid type:") {
        let expected = msg
            .rsplit_once(", expected ")
            .map(|(_, e)| e)
            .unwrap_or_default();
        ValidationItem::new(
            loc,
            type_kind(expected),
            format!("Input should be {expected}"),
        )
    } else if msg.starts_with("unknown field `") {
        ValidationItem::new(loc, "extra_forbidden", msg.to_owned())
    } else if msg.contains("UUID") || msg.contains("uuid") {
        ValidationItem::new(
            loc,
            "uuid_parsing",
            format!("Input should be a valid UUID: {msg}"),
        )
    } else if msg.contains("invalid digit") || msg.contains("number") {
        ValidationItem::new(
            loc,
            "int_parsing",
            "Input should be a valid integer".to_owned(),
        )
    } else {
        ValidationItem::new(loc, "value_error", msg.to_owned())
    };
    match input {
        Some(input) => item.with_input(input),
        None => item,
    }
}

fn type_kind(expected: &str) -> &'static str {
    let e = expected.to_ascii_lowercase();
    if e.contains("string") || e.contains("uuid") {
        "string_type"
    } else if e.contains("map") || e.contains("struct") || e.contains("object") {
        "dict_type"
    } else if e.contains("sequence") || e.contains("array") || e.contains("list") {
        "list_type"
    } else if e.contains("bool") {
        "bool_type"
    } else if e.contains("integer") || e.contains("i64") || e.contains("u32") || e.contains("i32") {
        "int_type"
    } else if e.contains("f64") || e.contains("float") {
        "float_type"
    } else {
        "type_error"
    }
}

fn between<'a>(s: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let rest = &s[s.find(start)? + start.len()..];
    Some(&rest[..rest.find(end)?])
}

/// A field holding an object, for a struct's field of a struct type: serde fills a struct from
/// an array by position too (`"checkpoint": [null, "x"]`), which the document does not allow.
/// The object's fields are read from the request itself, so a failure keeps its location.
pub fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    d.deserialize_map(ObjectVisitor(PhantomData))
}

/// [`object`], for a field that may be null or left out (with `#[serde(default)]`).
pub fn opt_object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    d.deserialize_option(OptionalObjectVisitor(PhantomData))
}

struct ObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for ObjectVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

struct OptionalObjectVisitor<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for OptionalObjectVisitor<T> {
    type Value = Option<T>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object or null")
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<Option<T>, E> {
        Ok(None)
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Option<T>, D::Error> {
        object(d).map(Some)
    }
}

/// A field of a partial update: left out, set to null, or set to a value. (`Option<Option<T>>`
/// cannot tell the first two apart without help, and the rules differ: a null `name` is
/// refused, a null `description` clears it.)
#[derive(Debug, Clone, Default, PartialEq)]
pub enum Patch<T> {
    #[default]
    Absent,
    Null,
    Value(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Patch<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(match Option::<T>::deserialize(deserializer)? {
            Some(value) => Patch::Value(value),
            None => Patch::Null,
        })
    }
}

impl<T> Patch<T> {
    pub fn is_absent(&self) -> bool {
        matches!(self, Patch::Absent)
    }

    pub fn as_value(&self) -> Option<&T> {
        match self {
            Patch::Value(v) => Some(v),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Body {
        #[allow(dead_code)]
        name: String,
        #[serde(default)]
        #[allow(dead_code)]
        nested: Option<Inner>,
        #[serde(default)]
        limit: Option<i64>,
    }

    #[derive(Debug, Deserialize)]
    #[allow(dead_code)]
    struct Inner {
        mode: Mode,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Mode {
        Raise,
        DoNothing,
    }

    impl Validate for Body {
        fn validate(&self, v: &mut Violations) {
            v.range("limit", self.limit, 1, Some(1000));
        }
    }

    fn items(body: &str) -> Vec<ValidationItem> {
        let err = parse_body::<Body>(body.as_bytes()).unwrap_err();
        assert_eq!(err.code(), ErrorCode::Validation);
        err.validation_items().to_vec()
    }

    #[test]
    fn names_the_missing_field() {
        let items = items(r#"{"limit": 3}"#);
        assert_eq!(items[0].loc, vec![json!("body"), json!("name")]);
        assert_eq!(items[0].kind, "missing");
    }

    #[test]
    fn names_a_nested_enum_field_with_its_input() {
        let items = items(r#"{"name": "x", "nested": {"mode": "bogus"}}"#);
        assert_eq!(
            items[0].loc,
            vec![json!("body"), json!("nested"), json!("mode")]
        );
        assert_eq!(items[0].kind, "enum");
        assert_eq!(items[0].input, Some(json!("bogus")));
    }

    #[test]
    fn names_a_wrong_type() {
        let items = items(r#"{"name": 5}"#);
        assert_eq!(items[0].loc, vec![json!("body"), json!("name")]);
        assert_eq!(items[0].kind, "string_type");
        assert_eq!(items[0].input, Some(json!(5)));
    }

    #[test]
    fn malformed_json_is_json_invalid() {
        assert_eq!(items(r#"{"name": "#)[0].kind, "json_invalid");
        assert_eq!(items(r#"{"name": "x"} trailing"#)[0].kind, "json_invalid");
    }

    #[test]
    fn nul_characters_are_refused_where_they_are() {
        let body =
            r#"{"name": "x", "limit": 2, "nested": {"mode": "raise"}, "extra": {"a\u0000": 1}}"#;
        let err = parse_body::<serde_json::Map<String, Value>>(body.as_bytes()).unwrap_err();
        let items = err.validation_items();
        assert_eq!(items[0].kind, "string_nul");
        assert_eq!(
            items[0].loc,
            vec![json!("body"), json!("extra"), json!("a\u{0}")]
        );
        let in_list = r#"{"tags": ["ok", "b\u0000"]}"#;
        let err = parse_body::<serde_json::Map<String, Value>>(in_list.as_bytes()).unwrap_err();
        assert_eq!(
            err.validation_items()[0].loc,
            vec![json!("body"), json!("tags"), json!(1)]
        );
        // An escaped backslash followed by "u0000" is not a NUL.
        assert!(parse_body::<Body>(br#"{"name": "\\u0000"}"#).is_ok());
    }

    #[test]
    fn an_array_is_not_an_object() {
        // serde alone fills a struct from a sequence, by field position.
        for body in [r#"[]"#, r#" ["x", null, 3]"#] {
            let items = items(body);
            assert_eq!(items[0].loc, vec![json!("body")], "{body}");
            assert_eq!(items[0].kind, "dict_type", "{body}");
        }
        assert!(parse_body::<serde_json::Map<String, Value>>(b"[]").is_err());
        // A list body is still a list.
        let list = parse_body::<Vec<serde_json::Map<String, Value>>>(br#"[{"a": 1}]"#).unwrap();
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn range_rules_run_after_deserialising() {
        let items = items(r#"{"name": "x", "limit": 0}"#);
        assert_eq!(items[0].loc, vec![json!("body"), json!("limit")]);
        assert_eq!(items[0].kind, "greater_than_equal");
    }

    #[test]
    fn patch_tells_absent_from_null() {
        #[derive(Deserialize)]
        struct P {
            #[serde(default)]
            a: Patch<String>,
            #[serde(default)]
            b: Patch<String>,
            #[serde(default)]
            c: Patch<String>,
        }
        let p: P = serde_json::from_str(r#"{"b": null, "c": "v"}"#).unwrap();
        assert_eq!(p.a, Patch::Absent);
        assert_eq!(p.b, Patch::Null);
        assert_eq!(p.c, Patch::Value("v".into()));
    }
}
