//! The `auth` section of the config file, checked whole at start-up: a mistake stops the
//! server naming its key, since a server that quietly served everyone instead would be worse
//! than one that does not start.

use std::path::Path;

use jsonwebtoken::{Algorithm, AlgorithmFamily, DecodingKey, Validation};
use serde::Deserialize;
use serde_json::Value;

use super::api_keys::{self, ApiKeys};
use super::jwt::{ClaimNames, Jwks, JwksSource, JwtVerifier, Keys};
use super::{Auth, AuthUser};

/// `auth`: LangGraph's keys (`path`, `disable_studio_auth`, `openapi`, `cache`) and Spindle's
/// own ways to authenticate (`api_keys`, `jwt`).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// LangGraph's custom auth: a Python `Auth` object, `./auth.py:auth`.
    pub path: Option<String>,
    /// LangGraph Studio's own access; Spindle has no Studio to exempt.
    #[serde(default)]
    pub disable_studio_auth: bool,
    /// How LangGraph documents the security scheme in its OpenAPI document.
    #[serde(default)]
    pub openapi: Option<Value>,
    /// LangGraph's cache of custom-auth answers.
    #[serde(default)]
    pub cache: Option<Value>,
    #[serde(default)]
    pub api_keys: Vec<ApiKeyConfig>,
    pub jwt: Option<JwtConfig>,
    /// Whether `/docs` and `/openapi.json` answer without credentials.
    #[serde(default = "yes")]
    pub public_docs: bool,
    /// Whether `/metrics` answers without credentials, as the health checks do (Prometheus
    /// scrapes without them).
    #[serde(default = "yes")]
    pub public_metrics: bool,
    /// Whether each route's action (`threads:create`, `store:get`, ...) must be granted by
    /// the caller's permissions (403 otherwise).
    #[serde(default)]
    pub enforce_permissions: bool,
}

fn yes() -> bool {
    true
}

/// One API key: the user it names, and the key itself as its SHA-256 digest or in an
/// environment variable.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiKeyConfig {
    pub key_sha256: Option<String>,
    pub key_env: Option<String>,
    pub identity: String,
    pub display_name: Option<String>,
    #[serde(default)]
    pub permissions: Vec<String>,
}

/// JWT bearer tokens: one source of keys, the algorithms accepted, the claims checked and
/// the claims that name the user.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JwtConfig {
    /// The HMAC secret, in an environment variable (HS256/384/512).
    pub secret_env: Option<String>,
    /// A public key in PEM (RSA, EC or Ed25519), inline or in a file.
    pub public_key: Option<String>,
    pub public_key_file: Option<String>,
    /// A JWKS, at a URL or in a file.
    pub jwks_url: Option<String>,
    pub jwks_file: Option<String>,
    /// Accepted `alg`s; by default the one the key is for (`HS256`, `RS256`, `ES256`, `EdDSA`;
    /// `RS256` and `ES256` for a JWKS).
    #[serde(default)]
    pub algorithms: Vec<String>,
    /// Required `aud` (one of them) and `iss` (one of them), when set.
    #[serde(default)]
    pub audience: OneOrMany,
    #[serde(default)]
    pub issuer: OneOrMany,
    #[serde(default = "sub")]
    pub identity_claim: String,
    #[serde(default = "name")]
    pub display_name_claim: String,
    #[serde(default = "permissions")]
    pub permissions_claim: String,
    /// The clock skew allowed on `exp` and `nbf`, in seconds.
    #[serde(default = "leeway")]
    pub leeway_secs: u64,
}

fn sub() -> String {
    "sub".into()
}
fn name() -> String {
    "name".into()
}
fn permissions() -> String {
    "permissions".into()
}
fn leeway() -> u64 {
    30
}

/// A string or a list of them.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    #[default]
    None,
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn values(&self) -> Vec<String> {
        match self {
            OneOrMany::None => Vec::new(),
            OneOrMany::One(v) => vec![v.clone()],
            OneOrMany::Many(v) => v.clone(),
        }
    }
}

/// An `auth` section that cannot be used, and why (the key is named).
#[derive(Debug, thiserror::Error)]
#[error("auth.{key}: {message}")]
pub struct AuthConfigError {
    pub key: String,
    pub message: String,
}

fn invalid(key: impl Into<String>, message: impl Into<String>) -> AuthConfigError {
    AuthConfigError {
        key: key.into(),
        message: message.into(),
    }
}

impl AuthConfig {
    /// The authentication this section describes. Relative files are read from `base_dir`
    /// (the config file's folder); `env` reads environment variables.
    pub fn build(
        &self,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Auth, AuthConfigError> {
        let custom = self.path.is_some();
        if custom && (!self.api_keys.is_empty() || self.jwt.is_some()) {
            return Err(invalid(
                "path",
                "LangGraph's custom auth decides alone: give path, or api_keys and jwt, not both",
            ));
        }
        if !custom && self.api_keys.is_empty() && self.jwt.is_none() {
            return Err(invalid(
                "api_keys",
                "the auth section names no way to authenticate: give api_keys, jwt or path",
            ));
        }
        let api_keys = self.api_keys(env)?;
        let jwt = match &self.jwt {
            Some(jwt) => Some(jwt.build(base_dir, env)?),
            None => None,
        };
        Ok(Auth {
            api_keys,
            jwt,
            custom: self.path.clone(),
            public_docs: self.public_docs,
            public_metrics: self.public_metrics,
            enforce_permissions: self.enforce_permissions,
        })
    }

    fn api_keys(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<ApiKeys, AuthConfigError> {
        let mut keys = ApiKeys::default();
        for (i, entry) in self.api_keys.iter().enumerate() {
            let key = |field: &str| format!("api_keys[{i}].{field}");
            if entry.identity.trim().is_empty() {
                return Err(invalid(key("identity"), "must name the key's user"));
            }
            let digest = match (&entry.key_sha256, &entry.key_env) {
                (Some(hex), None) => api_keys::parse_digest(hex).ok_or_else(|| {
                    invalid(
                        key("key_sha256"),
                        "must be 64 hexadecimal digits (`printf %s \"$KEY\" | sha256sum`)",
                    )
                })?,
                (None, Some(var)) => {
                    api_keys::digest(required_env(env, var, &key("key_env"))?.trim())
                }
                _ => {
                    return Err(invalid(
                        key("key_sha256"),
                        "give the key as key_sha256 or key_env (one of them)",
                    ))
                }
            };
            let user = AuthUser::authenticated(
                entry.identity.clone(),
                entry.display_name.clone(),
                entry.permissions.clone(),
            );
            if !keys.insert(digest, user) {
                return Err(invalid(key("key_sha256"), "the same key is listed twice"));
            }
        }
        Ok(keys)
    }
}

impl JwtConfig {
    fn build(
        &self,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<JwtVerifier, AuthConfigError> {
        let (keys, family) = self.keys(base_dir, env)?;
        let algorithms = self.algorithms(family)?;
        let mut validation = Validation::new(algorithms[0]);
        validation.algorithms = algorithms;
        validation.leeway = self.leeway_secs;
        validation.validate_nbf = true;
        let audience = self.audience.values();
        if audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&audience);
        }
        let issuer = self.issuer.values();
        if !issuer.is_empty() {
            validation.set_issuer(&issuer);
        }
        let claims = ClaimNames {
            identity: self.identity_claim.clone(),
            display_name: self.display_name_claim.clone(),
            permissions: self.permissions_claim.clone(),
        };
        Ok(JwtVerifier::new(keys, validation, claims))
    }

    /// The one source of keys the section gives, and the family of its key (`None` for a
    /// JWKS, whose keys can be of any).
    fn keys(
        &self,
        base_dir: &Path,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<(Keys, Option<AlgorithmFamily>), AuthConfigError> {
        let given = [
            self.secret_env.is_some(),
            self.public_key.is_some(),
            self.public_key_file.is_some(),
            self.jwks_url.is_some(),
            self.jwks_file.is_some(),
        ];
        if given.iter().filter(|g| **g).count() != 1 {
            return Err(invalid(
                "jwt",
                "give exactly one of secret_env, public_key, public_key_file, jwks_url, jwks_file",
            ));
        }
        if let Some(var) = &self.secret_env {
            let secret = required_env(env, var, "jwt.secret_env")?;
            let key = DecodingKey::from_secret(secret.as_bytes());
            return Ok((Keys::Fixed(key), Some(AlgorithmFamily::Hmac)));
        }
        let pem = match (&self.public_key, &self.public_key_file) {
            (Some(pem), _) => Some(("jwt.public_key", "it".to_owned(), pem.clone().into_bytes())),
            (None, Some(file)) => {
                let path = base_dir.join(file);
                let pem = std::fs::read(&path).map_err(|e| {
                    invalid("jwt.public_key_file", format!("{}: {e}", path.display()))
                })?;
                Some(("jwt.public_key_file", path.display().to_string(), pem))
            }
            (None, None) => None,
        };
        if let Some((field, what, pem)) = pem {
            let key = public_key(&pem).ok_or_else(|| {
                invalid(
                    field,
                    format!("{what} is not a PEM public key (RSA, EC or Ed25519)"),
                )
            })?;
            let family = key.family();
            return Ok((Keys::Fixed(key), Some(family)));
        }
        let source = match (&self.jwks_url, &self.jwks_file) {
            (Some(url), _) => {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(invalid("jwt.jwks_url", "must be an http(s) URL"));
                }
                JwksSource::Url(url.clone())
            }
            (None, Some(file)) => JwksSource::File(base_dir.join(file)),
            (None, None) => unreachable!("one source is given (checked above)"),
        };
        Ok((Keys::Jwks(Jwks::new(source)), None))
    }

    fn algorithms(
        &self,
        family: Option<AlgorithmFamily>,
    ) -> Result<Vec<Algorithm>, AuthConfigError> {
        if self.algorithms.is_empty() {
            return Ok(match family {
                Some(AlgorithmFamily::Hmac) => vec![Algorithm::HS256],
                Some(AlgorithmFamily::Rsa) => vec![Algorithm::RS256],
                Some(AlgorithmFamily::Ec) => vec![Algorithm::ES256],
                Some(AlgorithmFamily::Ed) => vec![Algorithm::EdDSA],
                None => vec![Algorithm::RS256, Algorithm::ES256],
            });
        }
        let mut out = Vec::new();
        for name in &self.algorithms {
            let alg: Algorithm = name
                .parse()
                .map_err(|_| invalid("jwt.algorithms", format!("unknown algorithm {name}")))?;
            if family.is_some_and(|f| f != alg.family()) {
                return Err(invalid(
                    "jwt.algorithms",
                    format!("{name} cannot be verified with the configured key"),
                ));
            }
            out.push(alg);
        }
        Ok(out)
    }
}

/// The value of the environment variable `var` that the section's `field` names; unset or
/// empty is an error naming both.
fn required_env(
    env: &dyn Fn(&str) -> Option<String>,
    var: &str,
    field: &str,
) -> Result<String, AuthConfigError> {
    env(var)
        .filter(|value| !value.trim().is_empty())
        .ok_or_else(|| invalid(field, format!("the environment variable {var} is not set")))
}

/// A PEM public key of whichever kind it is.
fn public_key(pem: &[u8]) -> Option<DecodingKey> {
    DecodingKey::from_rsa_pem(pem)
        .or_else(|_| DecodingKey::from_ec_pem(pem))
        .or_else(|_| DecodingKey::from_ed_pem(pem))
        .ok()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn build(section: Value, env: &[(&str, &str)]) -> Result<Auth, String> {
        let config: AuthConfig = serde_json::from_value(section).map_err(|e| e.to_string())?;
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let read = move |name: &str| env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        config
            .build(Path::new("."), &read)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn mistakes_name_their_key() {
        let cases = [
            (json!({}), "auth.api_keys"),
            (
                json!({"path": "./auth.py:auth", "jwt": {"secret_env": "K"}}),
                "auth.path",
            ),
            (
                json!({"api_keys": [{"identity": "a"}]}),
                "auth.api_keys[0].key_sha256",
            ),
            (
                json!({"api_keys": [{"identity": "a", "key_sha256": "abc"}]}),
                "64 hexadecimal",
            ),
            (
                json!({"api_keys": [{"identity": "a", "key_env": "NOPE"}]}),
                "NOPE is not set",
            ),
            (
                json!({"api_keys": [{"identity": "", "key_env": "K"}]}),
                "api_keys[0].identity",
            ),
            (
                json!({"api_keys": [{"identity": "a", "key_env": "K"}, {"identity": "b", "key_env": "K"}]}),
                "twice",
            ),
            (json!({"jwt": {}}), "exactly one"),
            (
                json!({"jwt": {"secret_env": "NOPE"}}),
                "auth.jwt.secret_env",
            ),
            (
                json!({"jwt": {"secret_env": "K", "algorithms": ["RS256"]}}),
                "cannot be verified",
            ),
            (
                json!({"jwt": {"secret_env": "K", "algorithms": ["XX1"]}}),
                "unknown algorithm",
            ),
            (
                json!({"jwt": {"public_key": "nope"}}),
                "auth.jwt.public_key",
            ),
            (json!({"jwt": {"jwks_url": "ftp://x"}}), "http(s)"),
        ];
        for (section, expected) in cases {
            let err = build(section.clone(), &[("K", "key")])
                .err()
                .unwrap_or_default();
            assert!(err.contains(expected), "{section}: {err}");
        }
        let unknown = build(json!({"api_key": []}), &[]).err().unwrap();
        assert!(unknown.contains("unknown field `api_key`"), "{unknown}");
    }

    #[tokio::test]
    async fn api_keys_from_digests_and_the_environment_name_their_users() {
        let auth = build(
            json!({"api_keys": [
                {"identity": "ann", "key_sha256":
                    "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b"},
                {"identity": "bob", "key_env": "BOB_KEY", "display_name": "Bob",
                 "permissions": ["threads:read"]}
            ]}),
            &[("BOB_KEY", "bob-key")],
        )
        .unwrap();
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("x-api-key", "secret".parse().unwrap());
        assert_eq!(auth.authenticate(&headers).await.unwrap().identity, "ann");
        let mut headers = axum::http::HeaderMap::new();
        headers.insert("authorization", "Bearer bob-key".parse().unwrap());
        let bob = auth.authenticate(&headers).await.unwrap();
        assert_eq!(
            (bob.display_name.as_str(), bob.permissions.as_slice()),
            ("Bob", ["threads:read".to_owned()].as_slice())
        );
        headers.insert("authorization", "Bearer wrong".parse().unwrap());
        assert!(auth.authenticate(&headers).await.unwrap_err().invalid_token);
        assert!(
            !auth
                .authenticate(&axum::http::HeaderMap::new())
                .await
                .unwrap_err()
                .invalid_token
        );
    }
}
