//! LangGraph's `http` settings that change what the API serves (`cors` lives in `cors.rs`):
//! route groups turned off, request headers copied into runs' `configurable`, webhooks off.

use axum::http::HeaderMap;
use serde_json::{Map, Value};

use crate::wire::JsonObject;

/// What the server serves and how runs are made from requests.
#[derive(Clone, Debug, Default)]
pub struct HttpConfig {
    pub disabled: Disabled,
    /// Which request headers a run created over HTTP gets in `config.configurable`.
    pub configurable_headers: HeaderFilter,
    /// `disable_webhooks`: a run or cron asking for a webhook is refused (422).
    pub disable_webhooks: bool,
}

/// Route groups not served (`http.disable_*`), grouped as LangGraph Platform groups them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Disabled {
    /// `/assistants...`.
    pub assistants: bool,
    /// `/threads...`: threads, their state and history, and the thread's join stream.
    pub threads: bool,
    /// Runs (`/runs...`, `/threads/{id}/runs...`), crons, and the agent protocol's thread
    /// stream and commands, which start runs too.
    pub runs: bool,
    /// `/store/...`.
    pub store: bool,
    /// `/info`, `/metrics`, `/docs` and `/openapi.json`; the health checks (`/ok`,
    /// `/health`, `/live`, `/ready`) stay.
    pub meta: bool,
    /// The agent protocol's thread stream and commands alone.
    pub event_streaming: bool,
}

/// Headers whose values are credentials: never copied, whatever the patterns say. The
/// reference keeps out the first four; cookies carry sessions as well.
const NEVER_COPIED: [&str; 6] = [
    "authorization",
    "x-api-key",
    "x-service-key",
    "x-tenant-id",
    "cookie",
    "proxy-authorization",
];

/// `http.configurable_headers`: the request headers copied into a run's `configurable`. As in
/// LangGraph Platform, none is copied unless `include` names it; `exclude` wins over
/// `include`. Patterns are header names with `*` for any run of characters, matched against
/// the lowercase name (they are lowercased too).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeaderFilter {
    include: Vec<String>,
    exclude: Vec<String>,
}

impl HeaderFilter {
    pub fn new(include: &[String], exclude: &[String]) -> Self {
        let lower = |patterns: &[String]| patterns.iter().map(|p| p.to_ascii_lowercase()).collect();
        Self {
            include: lower(include),
            exclude: lower(exclude),
        }
    }

    /// Whether a header (its lowercase name) is copied.
    pub fn copies(&self, name: &str) -> bool {
        let matches = |patterns: &[String]| patterns.iter().any(|p| glob_match(p, name));
        !NEVER_COPIED.contains(&name) && !matches(&self.exclude) && matches(&self.include)
    }

    /// The headers of a request that are copied, name to value. A header sent twice keeps its
    /// last value, and values are read as Latin-1, as the reference (Starlette) reads them.
    pub fn select(&self, headers: &HeaderMap) -> Map<String, Value> {
        let mut copied = Map::new();
        if self.include.is_empty() {
            return copied;
        }
        for (name, value) in headers.iter().filter(|(n, _)| self.copies(n.as_str())) {
            let text: String = value.as_bytes().iter().map(|&b| char::from(b)).collect();
            copied.insert(name.as_str().to_owned(), Value::String(text));
        }
        copied
    }

    /// Copies the selected headers into `config.configurable`. They win over the client's own
    /// values of the same names, as the reference's `configurable.update(headers)` does.
    pub fn apply(&self, headers: &HeaderMap, config: &mut Option<JsonObject>) {
        let copied = self.select(headers);
        if copied.is_empty() {
            return;
        }
        let config = config.get_or_insert_with(Map::new);
        let configurable = config
            .entry("configurable")
            .or_insert_with(|| Value::Object(Map::new()));
        if configurable.is_null() {
            *configurable = Value::Object(Map::new());
        }
        // A `configurable` that is not an object is the client's mistake to keep: the run
        // reports it as it would without headers.
        if let Value::Object(configurable) = configurable {
            configurable.extend(copied);
        }
    }
}

/// `*` matches any run of characters, everything else itself. Greedy with one backtrack
/// point, so a pattern costs at most (pattern × name) steps: no regex, no blow-up.
fn glob_match(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ni));
            pi += 1;
        } else if pi < p.len() && p[pi] == n[ni] {
            pi += 1;
            ni += 1;
        } else if let Some((star_pi, star_ni)) = star {
            // The last `*` takes one more character.
            pi = star_pi + 1;
            ni = star_ni + 1;
            star = Some((star_pi, star_ni + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn globs_match_stars_and_literals_only() {
        for (pattern, name, expected) in [
            ("x-*", "x-user-id", true),
            ("x-*", "x-", true),
            ("x-*", "y-user", false),
            ("*-id", "x-user-id", true),
            ("*", "anything", true),
            ("x-user-id", "x-user-id", true),
            ("x-user-id", "x-user-ids", false),
            ("my-*-id", "my-org-id", true),
            ("my-*-id", "my-org-idx", false),
            ("x.?", "x-a", false),
            ("a*b*c", "aXbYbZc", true),
            ("a*b*c", "aXbYbZ", false),
        ] {
            assert_eq!(glob_match(pattern, name), expected, "{pattern} ~ {name}");
        }
    }

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(
                axum::http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
                value.parse().unwrap(),
            );
        }
        map
    }

    #[test]
    fn nothing_is_copied_unless_included_and_credentials_never() {
        let sent = headers(&[
            ("x-user-id", "u1"),
            ("X-Org", "acme"),
            ("authorization", "Bearer t"),
            ("x-api-key", "k"),
            ("cookie", "s=1"),
            ("user-agent", "ua"),
        ]);
        assert!(HeaderFilter::default().select(&sent).is_empty());
        let all = HeaderFilter::new(&["*".into()], &[]);
        assert_eq!(
            Value::Object(all.select(&sent)),
            json!({"x-user-id": "u1", "x-org": "acme", "user-agent": "ua"})
        );
        let some = HeaderFilter::new(&["X-*".into()], &["x-org".into()]);
        assert_eq!(
            Value::Object(some.select(&sent)),
            json!({"x-user-id": "u1"})
        );
    }

    #[test]
    fn copied_headers_win_over_the_clients_configurable() {
        let filter = HeaderFilter::new(&["x-user-*".into()], &[]);
        let sent = headers(&[("x-user-id", "first"), ("x-user-id", "last")]);
        let mut config = Some(
            json!({"configurable": {"x-user-id": "body", "k": 1}, "tags": ["t"]})
                .as_object()
                .unwrap()
                .clone(),
        );
        filter.apply(&sent, &mut config);
        assert_eq!(
            Value::Object(config.unwrap()),
            json!({"configurable": {"x-user-id": "last", "k": 1}, "tags": ["t"]})
        );
        let mut none = None;
        filter.apply(&headers(&[("x-other", "v")]), &mut none);
        assert!(none.is_none(), "no config is made when nothing is copied");
        filter.apply(&sent, &mut none);
        assert_eq!(
            Value::Object(none.unwrap()),
            json!({"configurable": {"x-user-id": "last"}})
        );
    }
}
