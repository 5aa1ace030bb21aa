//! JSON containment filters (PostgreSQL's `jsonb @>`) translated to SQLite's JSON functions.
//!
//! PostgreSQL answers `column @> filter` natively. SQLite has no containment operator, so the
//! filter is unrolled into `json_type`/`json_extract` tests on the column, one per leaf, with
//! `EXISTS (... json_each ...)` for arrays (an array contains another when each element of the
//! filter is contained in some element of the column's array). Paths are built in SQL from
//! bound fragments, so nothing from the filter is ever spliced into the query text.

use serde_json::Value;
use sqlx::{Database, QueryBuilder, Sqlite};

use crate::MetadataCondition;

/// The most values (every key's value and every array item, at any depth) a filter may hold.
/// Each costs its query up to three bound parameters and a test per row read; the server
/// refuses a larger filter (422) on both backends alike.
pub const MAX_FILTER_VALUES: usize = 1000;

/// The most levels of objects and arrays a filter may nest, itself included. Each array
/// level is a correlated subquery, which SQLite counts some 30 levels deep of its 1,000
/// ("Expression tree is too large" past 25 arrays); the server refuses a deeper filter (422)
/// on both backends alike.
pub const MAX_FILTER_DEPTH: usize = 16;

/// How many levels of objects and arrays `filter` nests, as [`MAX_FILTER_DEPTH`] counts them.
pub fn filter_depth(filter: &serde_json::Map<String, Value>) -> usize {
    1 + filter.values().map(depth_below).max().unwrap_or(0)
}

fn depth_below(value: &Value) -> usize {
    match value {
        Value::Object(map) => filter_depth(map),
        Value::Array(items) => 1 + items.iter().map(depth_below).max().unwrap_or(0),
        _ => 0,
    }
}

/// The number of values `filter` holds, as [`MAX_FILTER_VALUES`] counts them.
pub fn filter_values(filter: &serde_json::Map<String, Value>) -> usize {
    filter.values().map(|v| 1 + values_below(v)).sum()
}

fn values_below(value: &Value) -> usize {
    match value {
        Value::Object(map) => filter_values(map),
        Value::Array(items) => items.iter().map(|v| 1 + values_below(v)).sum(),
        _ => 0,
    }
}

/// Appends a boolean SQL expression: "`column` contains `filter`" with jsonb semantics.
pub(crate) fn push_sqlite_contains(
    qb: &mut QueryBuilder<'_, Sqlite>,
    column: &str,
    filter: &Value,
) {
    let mut aliases = 0;
    qb.push("(");
    push_contains(qb, column, PathExpr::root(), filter, &mut aliases);
    qb.push(")");
}

/// Appends a boolean SQL expression for a [`MetadataCondition`], each containment written by
/// `contains` (the backend's `@>`): the same tree of `AND` and `OR` on both backends.
pub(crate) fn push_condition<'a, DB: Database>(
    qb: &mut QueryBuilder<'a, DB>,
    condition: &MetadataCondition,
    contains: &mut impl FnMut(&mut QueryBuilder<'a, DB>, &Value),
) {
    let (parts, joiner, none) = match condition {
        MetadataCondition::Contains(wanted) => return contains(qb, wanted),
        MetadataCondition::All(parts) => (parts, " AND ", "1 = 1"),
        MetadataCondition::Any(parts) => (parts, " OR ", "1 = 0"),
    };
    qb.push("(");
    if parts.is_empty() {
        qb.push(none);
    }
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            qb.push(joiner);
        }
        push_condition(qb, part, contains);
    }
    qb.push(")");
}

/// [`push_condition`] on a SQLite JSON column.
pub(crate) fn push_sqlite_condition(
    qb: &mut QueryBuilder<'_, Sqlite>,
    column: &str,
    condition: &MetadataCondition,
) {
    push_condition(qb, condition, &mut |qb, wanted| {
        push_sqlite_contains(qb, column, wanted)
    });
}

/// Appends `items` joined by `AND`, nested as a balanced tree of parenthesised halves. SQLite
/// parses `a AND b AND c ...` into a chain as deep as it is long and refuses one deeper than
/// 1,000 ("Expression tree is too large"); halves keep the depth at log2 of the count.
/// No items is true.
pub(crate) fn push_all<T>(
    qb: &mut QueryBuilder<'_, Sqlite>,
    items: &[T],
    push: &mut impl FnMut(&mut QueryBuilder<'_, Sqlite>, &T),
) {
    match items {
        [] => {
            qb.push("1");
        }
        [item] => push(qb, item),
        _ => {
            let (left, right) = items.split_at(items.len() / 2);
            qb.push("(");
            push_all(qb, left, push);
            qb.push(") AND (");
            push_all(qb, right, push);
            qb.push(")");
        }
    }
}

/// An SQL expression that evaluates to a JSON path into the column: the path of one array
/// element (the `fullkey` of a `json_each` row) or the column's root, followed by object keys.
/// The keys are bound as one string, so a path costs one parameter and one node of the
/// expression however deep it goes.
#[derive(Clone)]
struct PathExpr {
    /// The `json_each` alias whose row's `fullkey` the path starts from; `None`: `$`.
    element: Option<String>,
    /// The object keys after it, each a [`quoted_label`].
    labels: String,
}

impl PathExpr {
    fn root() -> Self {
        PathExpr {
            element: None,
            labels: String::new(),
        }
    }

    fn element(alias: String) -> Self {
        PathExpr {
            element: Some(alias),
            labels: String::new(),
        }
    }

    /// This path with one object key appended.
    fn key(&self, key: &str) -> Self {
        PathExpr {
            element: self.element.clone(),
            labels: format!("{}{}", self.labels, quoted_label(key)),
        }
    }

    fn push(&self, qb: &mut QueryBuilder<'_, Sqlite>) {
        match (&self.element, self.labels.is_empty()) {
            (None, true) => {
                qb.push("'$'");
            }
            (None, false) => {
                qb.push_bind(format!("${}", self.labels));
            }
            (Some(alias), true) => {
                qb.push(alias.as_str()).push(".fullkey");
            }
            (Some(alias), false) => {
                qb.push("(")
                    .push(alias.as_str())
                    .push(".fullkey || ")
                    .push_bind(self.labels.clone())
                    .push(")");
            }
        }
    }
}

/// `."key"`: a path step to an object key. A quoted label may hold dots and brackets, but it
/// ends at the first `"` even after a backslash; SQLite does unescape JSON escapes in it, so
/// quotes are written as `\u0022` and backslashes doubled.
pub(crate) fn quoted_label(key: &str) -> String {
    let mut label = String::with_capacity(key.len() + 3);
    label.push_str(".\"");
    for c in key.chars() {
        match c {
            '"' => label.push_str("\\u0022"),
            '\\' => label.push_str("\\\\"),
            c => label.push(c),
        }
    }
    label.push('"');
    label
}

fn push_json_type(qb: &mut QueryBuilder<'_, Sqlite>, column: &str, path: &PathExpr) {
    qb.push("json_type(").push(column).push(", ");
    path.push(qb);
    qb.push(")");
}

fn push_contains(
    qb: &mut QueryBuilder<'_, Sqlite>,
    column: &str,
    path: PathExpr,
    filter: &Value,
    aliases: &mut usize,
) {
    match filter {
        Value::Object(map) if map.is_empty() => {
            push_json_type(qb, column, &path);
            qb.push(" = 'object'");
        }
        Value::Object(map) => {
            let entries: Vec<(&String, &Value)> = map.iter().collect();
            push_all(qb, &entries, &mut |qb, (key, value)| {
                push_contains(qb, column, path.key(key), value, aliases);
            });
        }
        Value::Array(items) => {
            push_json_type(qb, column, &path);
            qb.push(" = 'array'");
            if items.is_empty() {
                return;
            }
            qb.push(" AND (");
            push_all(qb, items, &mut |qb, item| {
                *aliases += 1;
                let alias = format!("je{aliases}");
                qb.push("EXISTS (SELECT 1 FROM json_each(")
                    .push(column)
                    .push(", ");
                path.push(qb);
                qb.push(") AS ").push(alias.as_str()).push(" WHERE ");
                push_contains(qb, column, PathExpr::element(alias), item, aliases);
                qb.push(")");
            });
            qb.push(")");
        }
        Value::String(s) => {
            qb.push("(");
            push_json_type(qb, column, &path);
            qb.push(" = 'text' AND json_extract(")
                .push(column)
                .push(", ");
            path.push(qb);
            qb.push(") = ").push_bind(s.clone()).push(")");
        }
        Value::Number(n) => {
            qb.push("(");
            push_json_type(qb, column, &path);
            qb.push(" IN ('integer', 'real') AND json_extract(")
                .push(column)
                .push(", ");
            path.push(qb);
            qb.push(") = ");
            match n.as_i64() {
                Some(i) => qb.push_bind(i),
                None => qb.push_bind(n.as_f64().unwrap_or(f64::NAN)),
            };
            qb.push(")");
        }
        Value::Bool(b) => {
            push_json_type(qb, column, &path);
            qb.push(if *b { " = 'true'" } else { " = 'false'" });
        }
        Value::Null => {
            push_json_type(qb, column, &path);
            qb.push(" = 'null'");
        }
    }
}

/// jsonb containment (`doc @> filter`) in Rust: the specification the SQL above must agree
/// with, and how a resource already read is checked against a filter.
pub fn contains(doc: &Value, filter: &Value) -> bool {
    match (doc, filter) {
        (Value::Object(d), Value::Object(f)) => f
            .iter()
            .all(|(k, fv)| d.get(k).is_some_and(|dv| contains(dv, fv))),
        (Value::Array(d), Value::Array(f)) => {
            f.iter().all(|fv| d.iter().any(|dv| contains(dv, fv)))
        }
        (Value::Number(a), Value::Number(b)) => a.as_f64() == b.as_f64(),
        (a, b) => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use sqlx::sqlite::SqlitePoolOptions;
    use sqlx::Row;

    async fn sqlite_contains(doc: &Value, filter: &Value) -> bool {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let mut qb = QueryBuilder::<Sqlite>::new("SELECT ");
        qb.push("CASE WHEN ");
        push_sqlite_contains(&mut qb, "doc", filter);
        qb.push(" THEN 1 ELSE 0 END AS hit FROM (SELECT ")
            .push_bind(doc.to_string())
            .push(" AS doc)");
        let row = qb.build().fetch_one(&pool).await.unwrap();
        row.get::<i64, _>("hit") == 1
    }

    async fn sqlite_holds(doc: &Value, condition: &MetadataCondition) -> bool {
        let pool = SqlitePoolOptions::new()
            .max_connections(1)
            .connect("sqlite::memory:")
            .await
            .unwrap();
        let mut qb = QueryBuilder::<Sqlite>::new("SELECT CASE WHEN ");
        push_sqlite_condition(&mut qb, "doc", condition);
        qb.push(" THEN 1 ELSE 0 END AS hit FROM (SELECT ")
            .push_bind(doc.to_string())
            .push(" AS doc)");
        let row = qb.build().fetch_one(&pool).await.unwrap();
        row.get::<i64, _>("hit") == 1
    }

    #[tokio::test]
    async fn sqlite_conditions_agree_with_holds() {
        use MetadataCondition::{All, Any, Contains};
        let mine = || Contains(json!({"owner": "ann"}));
        let system = || Contains(json!({"created_by": "system"}));
        let tagged = || Contains(json!({"tags": ["x"]}));
        let cases = [
            mine(),
            All(vec![]),
            Any(vec![]),
            Any(vec![mine(), system()]),
            All(vec![mine(), system()]),
            All(vec![Any(vec![mine(), system()]), tagged()]),
            Any(vec![All(vec![mine(), tagged()]), system()]),
            Any(vec![All(vec![]), Any(vec![])]),
        ];
        let docs = [
            json!({"owner": "ann", "tags": ["x", "y"]}),
            json!({"owner": "ben", "created_by": "system"}),
            json!({"owner": "ann", "created_by": "system", "tags": "x"}),
            json!({}),
        ];
        for doc in &docs {
            for condition in &cases {
                assert_eq!(
                    sqlite_holds(doc, condition).await,
                    condition.holds(doc),
                    "{condition:?} on {doc}"
                );
            }
        }
        assert!(Any(vec![mine(), system()]).holds(&docs[1]));
        assert!(!All(vec![mine(), system()]).holds(&docs[1]));
    }

    #[tokio::test]
    async fn sqlite_translation_agrees_with_jsonb_semantics() {
        let doc = json!({
            "name": "a.b", "n": 3, "f": 1.5, "ok": true, "none": null,
            "tags": ["x", "y", {"k": 1}],
            "nested": {"deep": {"v": "w"}, "list": [[1, 2], [3]]},
            "dot.key": "d",
            "q\"uote": {"in": ["a", {"b\\s": true}]},
            "back\\slash": 2,
            "\\u0022": "six characters",
            "line\nbreak": 1,
            "[0]": "brackets",
            "": "empty",
        });
        let cases = [
            json!({}),
            json!({"name": "a.b"}),
            json!({"name": "a"}),
            json!({"n": 3}),
            json!({"n": 3.0}),
            json!({"n": "3"}),
            json!({"f": 1.5}),
            json!({"ok": true}),
            json!({"ok": false}),
            json!({"ok": 1}),
            json!({"none": null}),
            json!({"missing": null}),
            json!({"tags": ["y"]}),
            json!({"tags": ["y", "x"]}),
            json!({"tags": ["z"]}),
            json!({"tags": [{"k": 1}]}),
            json!({"tags": [{"k": 2}]}),
            json!({"tags": []}),
            json!({"nested": {"deep": {"v": "w"}}}),
            json!({"nested": {"deep": {}}}),
            json!({"nested": {"deep": {"v": "x"}}}),
            json!({"nested": {"list": [[2]]}}),
            json!({"nested": {"list": [[4]]}}),
            json!({"dot.key": "d"}),
            json!({"q\"uote": {"in": ["a"]}}),
            json!({"q\"uote": {"in": [{"b\\s": true}]}}),
            json!({"q\"uote": {"in": [{"b\\s": false}]}}),
            json!({"q\"uote": {}}),
            json!({"back\\slash": 2}),
            json!({"back\\slash": 3}),
            json!({"\\u0022": "six characters"}),
            json!({"\"": "six characters"}),
            json!({"line\nbreak": 1}),
            json!({"[0]": "brackets"}),
            json!({"": "empty"}),
            json!({"": "full"}),
            json!({"name": "a.b", "n": 3, "ok": true}),
            json!({"name": "a.b", "n": 4}),
        ];
        for filter in cases {
            assert_eq!(
                sqlite_contains(&doc, &filter).await,
                contains(&doc, &filter),
                "filter {filter}"
            );
        }
    }

    /// The largest filters the server takes (`MAX_FILTER_VALUES` keys, or array items) and the
    /// deepest (`MAX_FILTER_DEPTH`): a chain of 1,000 `AND`s was deeper than SQLite's 1,000
    /// levels.
    #[tokio::test]
    async fn sqlite_translation_takes_the_largest_and_deepest_filters() {
        let keys: serde_json::Map<String, Value> = (0..MAX_FILTER_VALUES)
            .map(|i| (format!("k{i}"), json!(i)))
            .collect();
        let doc = Value::Object(keys.clone());
        let mut other = keys.clone();
        other.insert("k999".into(), json!(-1));
        assert_eq!(filter_values(&keys), MAX_FILTER_VALUES);
        assert!(sqlite_contains(&doc, &Value::Object(keys.clone())).await);
        assert!(!sqlite_contains(&doc, &Value::Object(other)).await);

        let items: Vec<Value> = (0..MAX_FILTER_VALUES - 1).map(|i| json!(i)).collect();
        let doc = json!({ "tags": items });
        let mut missing = items.clone();
        missing.push(json!("absent"));
        assert!(sqlite_contains(&doc, &json!({ "tags": items })).await);
        assert!(!sqlite_contains(&doc, &json!({ "tags": missing })).await);

        // The deepest: arrays in arrays, then objects holding arrays.
        let mut arrays = json!(["bottom"]);
        for _ in 2..MAX_FILTER_DEPTH {
            arrays = json!([arrays]);
        }
        let arrays = json!({ "k": arrays });
        let mut objects = json!("bottom");
        for _ in 0..MAX_FILTER_DEPTH / 2 {
            objects = json!({ "k": [objects] });
        }
        for deep in [arrays, objects] {
            assert_eq!(filter_depth(deep.as_object().unwrap()), MAX_FILTER_DEPTH);
            assert!(sqlite_contains(&deep, &deep).await);
            assert!(!sqlite_contains(&json!({ "k": [] }), &deep).await);
        }
    }
}
