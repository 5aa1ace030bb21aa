//! Cross-origin access for browsers: `http.cors` of the config file, with LangGraph's keys and
//! meanings (Starlette's `CORSMiddleware`, which LangGraph Platform uses), as a tower-http
//! [`CorsLayer`].
//!
//! Without a `cors` section, `spindle dev` answers as `langgraph dev` does ([`Cors::dev`]: any
//! origin, any method and header, the pagination headers exposed) and `spindle serve` sends
//! no CORS headers at all, so no page of another origin can call it until configured.

use std::time::Duration;

use axum::http::{HeaderName, HeaderValue, Method};
use regex::Regex;
use serde::Deserialize;
use tower_http::cors::{AllowHeaders, AllowMethods, AllowOrigin, ExposeHeaders};

pub use tower_http::cors::CorsLayer;

/// Headers a client of the API reads from cross-origin responses: the reference exposes them.
const EXPOSED_BY_DEFAULT: [&str; 3] = [
    "x-pagination-total",
    "x-pagination-next",
    "content-location",
];

/// `http.cors`: who may call the API from a browser. Unset keys take Starlette's defaults.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cors {
    /// Origins allowed (`"*"` for any).
    #[serde(default)]
    pub allow_origins: Vec<String>,
    /// A regular expression an origin may match instead (the whole origin).
    #[serde(default)]
    pub allow_origin_regex: Option<String>,
    /// Methods allowed (`"*"` for any); `GET` when unset.
    #[serde(default = "default_methods")]
    pub allow_methods: Vec<String>,
    /// Request headers allowed beyond the CORS-safelisted ones (`"*"` for any).
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// Whether cookies and `Authorization` may be sent cross-origin.
    #[serde(default)]
    pub allow_credentials: bool,
    /// Response headers a page's script may read.
    #[serde(default)]
    pub expose_headers: Vec<String>,
    /// Seconds a browser may cache a preflight's answer.
    #[serde(default = "default_max_age")]
    pub max_age: u64,
}

fn default_methods() -> Vec<String> {
    vec!["GET".into()]
}

fn default_max_age() -> u64 {
    600
}

/// A `cors` section that cannot be used, and why (the key is named).
#[derive(Debug, thiserror::Error)]
#[error("http.cors.{key}: {message}")]
pub struct CorsError {
    pub key: &'static str,
    pub message: String,
}

fn invalid(key: &'static str, message: impl Into<String>) -> CorsError {
    CorsError {
        key,
        message: message.into(),
    }
}

impl Cors {
    /// What `langgraph dev` allows without a `cors` section: any origin, method and header,
    /// without credentials, the pagination headers exposed.
    pub fn dev() -> Self {
        Self {
            allow_origins: vec!["*".into()],
            allow_origin_regex: None,
            allow_methods: vec!["*".into()],
            allow_headers: vec!["*".into()],
            allow_credentials: false,
            expose_headers: EXPOSED_BY_DEFAULT.iter().map(|h| (*h).to_owned()).collect(),
            max_age: default_max_age(),
        }
    }

    /// The layer that answers preflights and adds the headers; an error names the key whose
    /// value is unusable (an origin, method or header that is not one, a bad regex).
    pub fn layer(&self) -> Result<CorsLayer, CorsError> {
        let any = |list: &[String]| list.iter().any(|v| v == "*");
        // A wildcard origin never comes with credentials (LangGraph Platform's rule): a page of
        // any origin could act with its visitor's cookies. Starlette would echo the request's
        // origin with them; Spindle refuses the section instead, so the mistake is seen.
        let origins = if any(&self.allow_origins) {
            if self.allow_credentials {
                return Err(invalid(
                    "allow_credentials",
                    "cannot be true with the origin \"*\": name the origins that may send credentials",
                ));
            }
            AllowOrigin::any()
        } else {
            self.origin_list()?
        };
        // Browsers refuse a wildcard method or header with credentials: as Starlette does, the
        // request's own are echoed instead.
        let methods = if any(&self.allow_methods) {
            match self.allow_credentials {
                true => AllowMethods::mirror_request(),
                false => AllowMethods::any(),
            }
        } else {
            AllowMethods::list(parse_all("allow_methods", &self.allow_methods, |m| {
                Method::from_bytes(m.to_ascii_uppercase().as_bytes()).ok()
            })?)
        };
        let headers = if any(&self.allow_headers) {
            match self.allow_credentials {
                true => AllowHeaders::mirror_request(),
                false => AllowHeaders::any(),
            }
        } else {
            AllowHeaders::list(parse_all(
                "allow_headers",
                &self.allow_headers,
                header_name,
            )?)
        };
        let exposed = if any(&self.expose_headers) {
            if self.allow_credentials {
                return Err(invalid(
                    "expose_headers",
                    "\"*\" cannot be used with allow_credentials: name the headers",
                ));
            }
            ExposeHeaders::any()
        } else {
            ExposeHeaders::list(parse_all(
                "expose_headers",
                &self.expose_headers,
                header_name,
            )?)
        };
        Ok(CorsLayer::new()
            .allow_origin(origins)
            .allow_methods(methods)
            .allow_headers(headers)
            .expose_headers(exposed)
            .allow_credentials(self.allow_credentials)
            .max_age(Duration::from_secs(self.max_age)))
    }

    /// The listed origins, or those the regex matches (either one allows).
    fn origin_list(&self) -> Result<AllowOrigin, CorsError> {
        let listed = parse_all("allow_origins", &self.allow_origins, |o| {
            HeaderValue::from_str(o.trim_end_matches('/')).ok()
        })?;
        let Some(pattern) = &self.allow_origin_regex else {
            return Ok(AllowOrigin::list(listed));
        };
        let regex = Regex::new(&format!("^(?:{pattern})$"))
            .map_err(|e| invalid("allow_origin_regex", e.to_string()))?;
        Ok(AllowOrigin::predicate(move |origin, _| {
            listed.contains(origin) || origin.to_str().is_ok_and(|o| regex.is_match(o))
        }))
    }
}

fn header_name(name: &str) -> Option<HeaderName> {
    HeaderName::from_bytes(name.as_bytes()).ok()
}

fn parse_all<T>(
    key: &'static str,
    values: &[String],
    parse: impl Fn(&str) -> Option<T>,
) -> Result<Vec<T>, CorsError> {
    values
        .iter()
        .map(|v| parse(v).ok_or_else(|| invalid(key, format!("{v:?} is not valid here"))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cors(json: serde_json::Value) -> Cors {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn langgraph_keys_read_with_starlettes_defaults() {
        let c = cors(serde_json::json!({"allow_origins": ["https://app.example"]}));
        assert_eq!(c.allow_methods, vec!["GET"]);
        assert!(!c.allow_credentials);
        assert_eq!(c.max_age, 600);
        assert!(c.layer().is_ok());
    }

    #[test]
    fn an_unknown_key_or_a_bad_value_is_named() {
        let err =
            serde_json::from_value::<Cors>(serde_json::json!({"allow_origin": ["x"]})).unwrap_err();
        assert!(err.to_string().contains("allow_origin"), "{err}");
        let bad = cors(serde_json::json!({"allow_headers": ["not a header"]}));
        assert_eq!(bad.layer().unwrap_err().key, "allow_headers");
        let regex = cors(serde_json::json!({"allow_origin_regex": "("}));
        assert_eq!(regex.layer().unwrap_err().key, "allow_origin_regex");
    }

    #[test]
    fn a_wildcard_origin_never_comes_with_credentials() {
        let c = cors(serde_json::json!({
            "allow_origins": ["https://app.example", "*"], "allow_credentials": true
        }));
        assert_eq!(c.layer().unwrap_err().key, "allow_credentials");
        // Named origins may send credentials, with any method and header (echoed).
        let c = cors(serde_json::json!({
            "allow_origins": ["https://app.example"], "allow_methods": ["*"],
            "allow_headers": ["*"], "allow_credentials": true
        }));
        assert!(c.layer().is_ok());
        assert!(!Cors::dev().allow_credentials && Cors::dev().layer().is_ok());
    }
}
