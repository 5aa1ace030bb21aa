//! JWT bearer tokens: signed with a shared secret (HS256/384/512), with a public key (RS*,
//! PS*, ES256/384, EdDSA), or with a key of a JWKS (a file, or a URL such as an identity
//! provider's `/.well-known/jwks.json`, cached and fetched again when a token names a key id
//! it does not hold). `exp` is required; `exp`, `nbf`, `aud` and `iss` are checked, with a
//! small clock skew allowed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{decode, decode_header, DecodingKey, Validation};
use serde_json::{Map, Value};
use tokio::sync::{Mutex, RwLock};

use super::AuthUser;

/// Which claims say who the caller is.
#[derive(Debug, Clone)]
pub struct ClaimNames {
    pub identity: String,
    pub display_name: String,
    pub permissions: String,
}

pub struct JwtVerifier {
    keys: Keys,
    /// One per accepted algorithm, accepting that one only: jsonwebtoken wants every
    /// algorithm of a validation to be of the key's family, and a JWKS mixes RSA and EC keys.
    validations: Vec<Validation>,
    claims: ClaimNames,
}

pub enum Keys {
    Fixed(DecodingKey),
    Jwks(Jwks),
}

impl JwtVerifier {
    /// A verifier of tokens that `validation` accepts (its algorithms, claims and leeway).
    pub fn new(keys: Keys, validation: Validation, claims: ClaimNames) -> Self {
        let validations = validation
            .algorithms
            .iter()
            .map(|alg| {
                let mut one = validation.clone();
                one.algorithms = vec![*alg];
                one
            })
            .collect();
        Self {
            keys,
            validations,
            claims,
        }
    }

    /// The user a valid token names, or why the token is not valid (said to the client).
    pub async fn verify(&self, token: &str) -> Result<AuthUser, String> {
        let header = decode_header(token).map_err(|_| "Invalid token: not a JWT".to_owned())?;
        let validation = self
            .validations
            .iter()
            .find(|v| v.algorithms[0] == header.alg)
            .ok_or_else(|| format!("Invalid token: algorithm {:?} is not accepted", header.alg))?;
        let claims = match &self.keys {
            Keys::Fixed(key) => decode::<Map<String, Value>>(token, key, validation),
            Keys::Jwks(jwks) => {
                let key = jwks.key_for(header.kid.as_deref()).await?;
                decode::<Map<String, Value>>(token, &key, validation)
            }
        }
        .map_err(|e| describe(e.kind()))?
        .claims;
        self.user(&claims)
    }

    fn user(&self, claims: &Map<String, Value>) -> Result<AuthUser, String> {
        let identity = match claims.get(&self.claims.identity) {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => {
                return Err(format!(
                    "Invalid token: no `{}` claim naming the user",
                    self.claims.identity
                ))
            }
        };
        let display_name = claims
            .get(&self.claims.display_name)
            .and_then(Value::as_str)
            .map(str::to_owned);
        let permissions = match claims.get(&self.claims.permissions) {
            Some(Value::Array(items)) => items
                .iter()
                .filter_map(|p| p.as_str().map(str::to_owned))
                .collect(),
            // OAuth's `scope` claim: names separated by spaces.
            Some(Value::String(names)) => names.split_whitespace().map(str::to_owned).collect(),
            _ => Vec::new(),
        };
        Ok(AuthUser::authenticated(identity, display_name, permissions))
    }
}

/// What a client is told about a token that failed validation.
fn describe(kind: &ErrorKind) -> String {
    let why = match kind {
        ErrorKind::ExpiredSignature => "it has expired".to_owned(),
        ErrorKind::ImmatureSignature => "it is not valid yet (nbf)".to_owned(),
        ErrorKind::InvalidAudience => "it is not meant for this server (aud)".to_owned(),
        ErrorKind::InvalidIssuer => "its issuer is not accepted (iss)".to_owned(),
        ErrorKind::InvalidSignature => "its signature does not match".to_owned(),
        ErrorKind::InvalidAlgorithm => "its algorithm does not match the key".to_owned(),
        ErrorKind::MissingRequiredClaim(claim) => format!("it has no `{claim}` claim"),
        ErrorKind::InvalidClaimFormat(claim) => format!("its `{claim}` claim is malformed"),
        _ => "it cannot be read".to_owned(),
    };
    format!("Invalid token: {why}")
}

/// Where a JWKS is read from.
#[derive(Debug, Clone)]
pub enum JwksSource {
    Url(String),
    File(PathBuf),
}

/// A JWKS, cached: read again when a token names a key id it lacks (keys rotated at the
/// provider), at most once a second, and when older than [`Jwks::MAX_AGE`].
pub struct Jwks {
    source: JwksSource,
    client: reqwest::Client,
    cached: RwLock<Option<(JwkSet, Instant)>>,
    /// One fetch at a time; the others wait for it and use its answer.
    fetching: Mutex<Option<Instant>>,
}

impl Jwks {
    const MAX_AGE: Duration = Duration::from_secs(600);
    const MIN_INTERVAL: Duration = Duration::from_secs(1);
    const TIMEOUT: Duration = Duration::from_secs(5);

    pub fn new(source: JwksSource) -> Self {
        Self {
            source,
            client: reqwest::Client::new(),
            cached: RwLock::new(None),
            fetching: Mutex::new(None),
        }
    }

    async fn key_for(&self, kid: Option<&str>) -> Result<DecodingKey, String> {
        if let Some(key) = self.cached_key(kid, true).await {
            return key;
        }
        self.refresh().await;
        self.cached_key(kid, false).await.unwrap_or_else(|| {
            Err(match kid {
                Some(kid) => format!("Invalid token: no key `{kid}` in the server's JWKS"),
                None => "Invalid token: no `kid`, and the server's JWKS has several keys".into(),
            })
        })
    }

    /// The cached key the token names (by `kid`, or the only key when it names none); `None`
    /// when there is none, or (`fresh_only`) the cache is older than [`Self::MAX_AGE`].
    async fn cached_key(
        &self,
        kid: Option<&str>,
        fresh_only: bool,
    ) -> Option<Result<DecodingKey, String>> {
        let cached = self.cached.read().await;
        let (set, fetched) = cached.as_ref()?;
        if fresh_only && fetched.elapsed() > Self::MAX_AGE {
            return None;
        }
        let jwk = match kid {
            Some(kid) => set.find(kid)?,
            None if set.keys.len() == 1 => &set.keys[0],
            None => return None,
        };
        Some(
            DecodingKey::from_jwk(jwk)
                .map_err(|_| "Invalid token: the server's JWKS key for it is unusable".into()),
        )
    }

    /// Reads the JWKS again, unless it was read less than a second ago. A failure keeps the
    /// keys already cached (and is logged: the operator's provider may be down).
    pub async fn refresh(&self) {
        let mut last = self.fetching.lock().await;
        if last.is_some_and(|at| at.elapsed() < Self::MIN_INTERVAL) {
            return;
        }
        *last = Some(Instant::now());
        match self.fetch().await {
            Ok(set) => *self.cached.write().await = Some((set, Instant::now())),
            Err(err) => tracing::warn!(source = ?self.source, error = %err, "cannot read the JWKS"),
        }
    }

    async fn fetch(&self) -> Result<JwkSet, String> {
        let text = match &self.source {
            JwksSource::File(path) => tokio::fs::read_to_string(path)
                .await
                .map_err(|e| e.to_string())?,
            JwksSource::Url(url) => self
                .client
                .get(url)
                .timeout(Self::TIMEOUT)
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| e.to_string())?
                .text()
                .await
                .map_err(|e| e.to_string())?,
        };
        serde_json::from_str(&text).map_err(|e| format!("not a JWKS: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
    use serde_json::json;

    use super::*;

    fn verifier(validation: Validation) -> JwtVerifier {
        let claims = ClaimNames {
            identity: "sub".into(),
            display_name: "name".into(),
            permissions: "permissions".into(),
        };
        JwtVerifier::new(
            Keys::Fixed(DecodingKey::from_secret(b"s3cret")),
            validation,
            claims,
        )
    }

    fn token(claims: Value) -> String {
        encode(
            &Header::new(Algorithm::HS256),
            &claims,
            &EncodingKey::from_secret(b"s3cret"),
        )
        .unwrap()
    }

    fn now() -> u64 {
        jsonwebtoken::get_current_timestamp()
    }

    #[tokio::test]
    async fn a_valid_token_names_its_user_and_permissions() {
        let v = verifier(Validation::new(Algorithm::HS256));
        let user = v
            .verify(&token(
                json!({"sub": "ann", "name": "Ann", "exp": now() + 60,
                                   "permissions": ["threads:read"]}),
            ))
            .await
            .unwrap();
        assert_eq!(user.identity, "ann");
        assert_eq!(user.display_name, "Ann");
        assert_eq!(user.permissions, ["threads:read"]);
        // A `scope`-style string of permissions.
        let user = v
            .verify(&token(
                json!({"sub": 7, "exp": now() + 60, "permissions": "a b"}),
            ))
            .await
            .unwrap();
        assert_eq!((user.identity.as_str(), user.permissions.len()), ("7", 2));
    }

    #[tokio::test]
    async fn expired_immature_foreign_and_forged_tokens_are_refused_saying_why() {
        let mut validation = Validation::new(Algorithm::HS256);
        validation.leeway = 5;
        validation.validate_nbf = true;
        validation.set_audience(&["spindle"]);
        validation.set_issuer(&["https://idp"]);
        let v = verifier(validation);
        let good = json!({"sub": "a", "aud": "spindle", "iss": "https://idp", "exp": now() + 60});
        assert!(v.verify(&token(good.clone())).await.is_ok());
        let with = |key: &str, value: Value| {
            let mut claims = good.clone();
            claims[key] = value;
            token(claims)
        };
        let cases = [
            (with("exp", json!(now() - 30)), "expired"),
            (with("nbf", json!(now() + 30)), "not valid yet"),
            (with("aud", json!("other")), "aud"),
            (with("iss", json!("https://evil")), "iss"),
            (with("sub", json!("")), "`sub`"),
        ];
        for (token, why) in cases {
            let err = v.verify(&token).await.expect_err(why);
            assert!(err.contains(why), "{why}: {err}");
        }
        // Within the clock skew, an expired token still passes.
        assert!(v.verify(&with("exp", json!(now() - 2))).await.is_ok());
        let signed = |alg, secret: &[u8]| {
            encode(&Header::new(alg), &good, &EncodingKey::from_secret(secret)).unwrap()
        };
        let forged = signed(Algorithm::HS256, b"guess");
        assert!(v.verify(&forged).await.unwrap_err().contains("signature"));
        let other_alg = signed(Algorithm::HS512, b"s3cret");
        assert!(v.verify(&other_alg).await.unwrap_err().contains("HS512"));
        assert!(v.verify("not.a.jwt").await.is_err());
    }
}
