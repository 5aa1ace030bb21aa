//! Wire pieces shared by several resources: enums as the interface spells them, paging,
//! field selection and the pagination headers.

use axum::http::{HeaderMap, HeaderName, HeaderValue};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use spindle_storage::{IfExists, Page, ResourceId, SortOrder, StorageError};
use utoipa::ToSchema;
use uuid::Uuid;

use crate::error::ApiError;
use crate::extract::Violations;

pub type JsonObject = Map<String, Value>;

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema, Default)]
#[serde(rename_all = "snake_case")]
pub enum IfExistsWire {
    #[default]
    Raise,
    DoNothing,
}

impl From<IfExistsWire> for IfExists {
    fn from(w: IfExistsWire) -> Self {
        match w {
            IfExistsWire::Raise => IfExists::Raise,
            IfExistsWire::DoNothing => IfExists::DoNothing,
        }
    }
}

#[derive(Debug, Clone, Copy, Deserialize, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum SortOrderWire {
    Asc,
    Desc,
}

impl From<SortOrderWire> for SortOrder {
    fn from(w: SortOrderWire) -> Self {
        match w {
            SortOrderWire::Asc => SortOrder::Asc,
            SortOrderWire::Desc => SortOrder::Desc,
        }
    }
}

pub const DEFAULT_LIMIT: i64 = 10;
pub const MAX_LIMIT: i64 = 1000;

/// Checks `limit` (1 to 1000) and `offset` (at least 0).
pub fn validate_page(v: &mut Violations, limit: Option<i64>, offset: Option<i64>) {
    v.range("limit", limit, 1, Some(MAX_LIMIT));
    v.range("offset", offset, 0, None);
}

pub fn page(limit: Option<i64>, offset: Option<i64>) -> Page {
    Page {
        limit: limit.unwrap_or(DEFAULT_LIMIT),
        offset: offset.unwrap_or(0),
    }
}

/// `X-Pagination-Total` (the number of matches across all pages) and, when more pages follow,
/// `X-Pagination-Next` (the offset of the next page).
pub fn pagination_headers(page: &Page, returned: usize, total: i64) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        HeaderName::from_static("x-pagination-total"),
        HeaderValue::from(total),
    );
    let next = page.offset + returned as i64;
    if returned > 0 && next < total {
        headers.insert(
            HeaderName::from_static("x-pagination-next"),
            HeaderValue::from(next),
        );
    }
    headers
}

/// Keeps only the selected top-level fields of each item, when a selection was given.
pub fn select_fields<T: Serialize, F: Serialize>(
    items: Vec<T>,
    select: Option<&[F]>,
) -> Result<Vec<Value>, ApiError> {
    let keep: Option<Vec<String>> = select.map(|fields| {
        fields
            .iter()
            .filter_map(|f| serde_json::to_value(f).ok()?.as_str().map(str::to_owned))
            .collect()
    });
    items
        .into_iter()
        .map(|item| {
            let mut value =
                serde_json::to_value(item).map_err(|e| ApiError::internal(e.to_string()))?;
            if let (Some(keep), Value::Object(map)) = (&keep, &mut value) {
                map.retain(|key, _| keep.iter().any(|k| k == key));
            }
            Ok(value)
        })
        .collect()
}

/// A path segment that must be a UUID; a 422 naming `["path", name]` otherwise.
pub fn path_uuid(name: &str, raw: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(raw).map_err(|e| {
        ApiError::validation(vec![crate::error::ValidationItem::new(
            vec![Value::from("path"), Value::from(name)],
            "uuid_parsing",
            format!("Input should be a valid UUID: {e}"),
        )
        .with_input(Value::from(raw))])
    })
}

/// A path's thread id. A string that cannot be an id names no thread: 404, as an unknown id
/// does (a client cannot tell a malformed id from a deleted thread's, and needs not).
pub fn path_thread_id(raw: &str) -> Result<ResourceId, ApiError> {
    ResourceId::parse(raw).map_err(|_| StorageError::NotFound("thread").into())
}

/// A boolean query parameter as clients send it: `true`/`false` (any case) or `1`/`0`.
pub fn query_bool<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<bool>, D::Error> {
    let raw: Option<String> = Option::deserialize(deserializer)?;
    match raw.as_deref().map(str::to_ascii_lowercase).as_deref() {
        None => Ok(None),
        Some("true" | "1") => Ok(Some(true)),
        Some("false" | "0") => Ok(Some(false)),
        Some(other) => Err(serde::de::Error::custom(format!(
            "Input should be a valid boolean (true, false, 1 or 0), got {other:?}"
        ))),
    }
}

/// A JSON number without a fraction, as an `i64`: `2` or `2.0`. JSON Schema's `integer`, and
/// pydantic, admit both; serde's `i64` takes only the first.
pub fn whole_number(value: &Value) -> Option<i64> {
    let whole = |f: f64| f.fract() == 0.0 && f >= i64::MIN as f64 && f < i64::MAX as f64;
    value
        .as_i64()
        .or_else(|| value.as_f64().filter(|f| whole(*f)).map(|f| f as i64))
}

/// An integer field of a JSON body, read by [`whole_number`].
pub fn integer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    let value = Value::deserialize(deserializer)?;
    whole_number(&value)
        .ok_or_else(|| serde::de::Error::custom(format!("invalid type: {value}, expected i64")))
}

/// [`integer`], for a field that may be null or left out (with `#[serde(default)]`).
pub fn opt_integer<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    struct Integer(#[serde(deserialize_with = "integer")] i64);
    Ok(Option::<Integer>::deserialize(deserializer)?.map(|Integer(n)| n))
}
