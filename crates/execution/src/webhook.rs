//! Webhooks: when a run ends, its payload is POSTed to the URL the run was created with.
//!
//! A webhook is a request the server makes on a client's behalf, so an unchecked URL would let
//! any client reach what only the server can: its own loopback services, the private network,
//! the cloud's metadata endpoint (server-side request forgery). Hence two guards:
//!
//! - At creation, [`Webhooks::check`] refuses URLs that are not http(s) or whose host resolves
//!   to an address webhooks may not reach ([`AddressKind`]); the route answers 422.
//! - At delivery, the HTTP client resolves names through the same rule ([`GuardedResolver`])
//!   and checks redirect targets, so a name that resolved to a public address at creation and
//!   to a private one later (DNS rebinding), or a redirect to `http://127.0.0.1/`, is refused
//!   too.
//!
//! Private and loopback addresses are allowed when the server is configured so (a receiver on
//! the same host or network). Link-local, unspecified, multicast and reserved addresses never
//! are: no legitimate receiver lives there, and 169.254.169.254 is where cloud metadata lives.
//!
//! [`Webhooks::deliver`] is not tied to runs (crons reuse it): it POSTs a JSON payload with a
//! timeout per attempt, retrying connection failures, timeouts, 408, 429 and 5xx with
//! exponential backoff, and logs every attempt's outcome.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use reqwest::{StatusCode, Url};
use serde_json::{json, Map, Value};
use spindle_storage::Run;
use tracing::Instrument;
use uuid::Uuid;

use crate::metrics::{Metrics, WebhookOutcome};
use crate::run_view::RunOut;

/// Webhook settings.
#[derive(Debug, Clone)]
pub struct WebhookConfig {
    /// Allow private (RFC 1918, CGN, IPv6 unique local) and loopback receivers.
    pub allow_private: bool,
    /// Attempts per delivery, the first included.
    pub max_attempts: u32,
    /// Wait before the second attempt; it doubles at each further one, up to `max_backoff`.
    pub first_backoff: Duration,
    pub max_backoff: Duration,
    /// Time to connect, then time for the whole attempt.
    pub connect_timeout: Duration,
    pub attempt_timeout: Duration,
    /// Time to resolve the URL's host.
    pub resolve_timeout: Duration,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        Self {
            allow_private: false,
            max_attempts: 5,
            first_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(30),
            resolve_timeout: Duration::from_secs(5),
        }
    }
}

/// Redirects a delivery follows (each target checked like the URL itself).
const MAX_REDIRECTS: usize = 5;
/// The longest a receiver's `Retry-After` makes a delivery wait.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// What an IP address is, as far as webhooks care.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressKind {
    Public,
    /// 10/8, 172.16/12, 192.168/16, 100.64/10 (carrier-grade NAT), fc00::/7, fec0::/10.
    Private,
    /// 127/8, ::1.
    Loopback,
    /// 169.254/16, fe80::/10 (where cloud metadata endpoints answer).
    LinkLocal,
    /// 0.0.0.0, :: (which reach the local host on most systems).
    Unspecified,
    /// 224/4, ff00::/8.
    Multicast,
    /// Not routable on the internet: 0/8, 192.0.0/24, documentation and benchmarking ranges,
    /// 240/4 (with the broadcast address), 2001:db8::/32, 100::/64, 64:ff9b:1::/48, and the
    /// deprecated IPv4-compatible ::/96.
    Reserved,
}

impl AddressKind {
    /// Whether webhooks may be delivered to such an address.
    pub fn permitted(self, allow_private: bool) -> bool {
        match self {
            AddressKind::Public => true,
            AddressKind::Private | AddressKind::Loopback => allow_private,
            AddressKind::LinkLocal
            | AddressKind::Unspecified
            | AddressKind::Multicast
            | AddressKind::Reserved => false,
        }
    }

    fn describe(self) -> &'static str {
        match self {
            AddressKind::Public => "a public address",
            AddressKind::Private => "a private address",
            AddressKind::Loopback => "a loopback address",
            AddressKind::LinkLocal => "a link-local address",
            AddressKind::Unspecified => "an unspecified address",
            AddressKind::Multicast => "a multicast address",
            AddressKind::Reserved => "a reserved address",
        }
    }
}

/// Classifies an address. IPv6 forms that carry an IPv4 address (mapped `::ffff:a.b.c.d`,
/// NAT64 `64:ff9b::/96`, 6to4 `2002::/16`) are classified by that IPv4 address, since that is
/// where a connection to them ends up.
pub fn classify(ip: IpAddr) -> AddressKind {
    match ip {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> AddressKind {
    let [a, b, c, _] = ip.octets();
    match (a, b, c) {
        _ if ip.is_unspecified() => AddressKind::Unspecified,
        (0, _, _) => AddressKind::Reserved,
        (127, _, _) => AddressKind::Loopback,
        (10, _, _) | (192, 168, _) => AddressKind::Private,
        (172, 16..=31, _) | (100, 64..=127, _) => AddressKind::Private,
        (169, 254, _) => AddressKind::LinkLocal,
        (224..=239, _, _) => AddressKind::Multicast,
        (240..=255, _, _) => AddressKind::Reserved,
        (192, 0, 0) | (192, 0, 2) | (198, 18..=19, _) | (198, 51, 100) | (203, 0, 113) => {
            AddressKind::Reserved
        }
        _ => AddressKind::Public,
    }
}

fn classify_v6(ip: Ipv6Addr) -> AddressKind {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return classify_v4(v4);
    }
    let s = ip.segments();
    let embedded = |high: u16, low: u16| {
        let [a, b] = high.to_be_bytes();
        let [c, d] = low.to_be_bytes();
        classify_v4(Ipv4Addr::new(a, b, c, d))
    };
    match s {
        _ if ip.is_unspecified() => AddressKind::Unspecified,
        _ if ip.is_loopback() => AddressKind::Loopback,
        [0x64, 0xff9b, 0, 0, 0, 0, high, low] => embedded(high, low),
        [0x64, 0xff9b, 1, ..] => AddressKind::Reserved,
        [0x2002, high, low, ..] => embedded(high, low),
        [0, 0, 0, 0, 0, 0, _, _] => AddressKind::Reserved,
        [0x100, 0, 0, 0, ..] => AddressKind::Reserved,
        [0x2001, 0xdb8, ..] => AddressKind::Reserved,
        [first, ..] if first & 0xfe00 == 0xfc00 => AddressKind::Private,
        [first, ..] if first & 0xffc0 == 0xfec0 => AddressKind::Private,
        [first, ..] if first & 0xffc0 == 0xfe80 => AddressKind::LinkLocal,
        [first, ..] if first & 0xff00 == 0xff00 => AddressKind::Multicast,
        _ => AddressKind::Public,
    }
}

/// Why a webhook URL is refused, with the validation error type a 422 reports it as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `url_parsing`, `url_scheme` or `value_error`.
    pub kind: &'static str,
    pub message: String,
}

impl Refusal {
    fn new(kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    fn address(host: &str, ip: IpAddr, kind: AddressKind) -> Self {
        let rule = if kind.permitted(true) {
            "webhooks to private and loopback addresses are refused unless the server allows \
             them (--webhook-allow-private)"
        } else {
            "webhooks may never be delivered there"
        };
        let target = if host == ip.to_string() {
            format!("{ip} is {}", kind.describe())
        } else {
            format!("{host} resolves to {ip}, {}", kind.describe())
        };
        Self::new("value_error", format!("{target}: {rule}"))
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refusal {}

/// What a webhook starts with, as the OpenAPI document's pattern says it (ECMA syntax): an
/// http(s) scheme, `//` and a host. The URL parser alone also took `http:host` and spaces
/// before the scheme, which the document could not say and LangGraph refuses.
pub const URL_PATTERN: &str = "^[Hh][Tt][Tt][Pp][Ss]?://[^\\s/?#]";

/// Whether `raw` starts as [`URL_PATTERN`] says.
fn starts_as_documented(raw: &str) -> bool {
    let rest = ["https://", "http://"].iter().find_map(|scheme| {
        let head = raw.get(..scheme.len())?;
        head.eq_ignore_ascii_case(scheme)
            .then(|| &raw[scheme.len()..])
    });
    rest.and_then(|rest| rest.chars().next())
        .is_some_and(|c| !c.is_whitespace() && !matches!(c, '/' | '?' | '#'))
}

/// The syntax half of the check, which needs no network: an absolute http(s) URL with a host.
pub fn parse(raw: &str) -> Result<Url, Refusal> {
    let url = Url::parse(raw)
        .map_err(|e| Refusal::new("url_parsing", format!("Input should be a valid URL, {e}")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(Refusal::new(
            "url_scheme",
            "URL scheme should be 'http' or 'https'",
        ));
    }
    if url.host_str().is_none_or(str::is_empty) || !starts_as_documented(raw) {
        return Err(Refusal::new(
            "url_parsing",
            "Input should be a URL with a host, starting with http:// or https://",
        ));
    }
    Ok(url)
}

/// The URL's host as an IP address, when it is one (`[::1]` included).
fn literal_ip(url: &Url) -> Option<IpAddr> {
    let host = url.host_str()?;
    match host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        Some(v6) => v6.parse::<Ipv6Addr>().ok().map(IpAddr::V6),
        // The URL parser already turned every IPv4 spelling (0x7f.1, 2130706433) into
        // dotted decimal.
        None => host.parse::<Ipv4Addr>().ok().map(IpAddr::V4),
    }
}

/// Refuses an IP literal that webhooks may not reach; names are left to the resolver.
fn check_literal(url: &Url, allow_private: bool) -> Result<(), Refusal> {
    match literal_ip(url) {
        Some(ip) if !classify(ip).permitted(allow_private) => {
            Err(Refusal::address(&ip.to_string(), ip, classify(ip)))
        }
        _ => Ok(()),
    }
}

/// The addresses `host` resolves to; `None` when it does not resolve (in time).
async fn lookup(host: &str, port: u16, timeout: Duration) -> Option<Vec<SocketAddr>> {
    let found = tokio::time::timeout(timeout, tokio::net::lookup_host((host, port)))
        .await
        .ok()?
        .ok()?;
    let addrs: Vec<SocketAddr> = found.collect();
    (!addrs.is_empty()).then_some(addrs)
}

/// Refuses `host` when any of its addresses is not permitted: connecting picks one of them,
/// so one bad address is enough to reach the wrong place.
fn check_addrs(host: &str, addrs: &[SocketAddr], allow_private: bool) -> Result<(), Refusal> {
    for addr in addrs {
        let kind = classify(addr.ip());
        if !kind.permitted(allow_private) {
            return Err(Refusal::address(host, addr.ip(), kind));
        }
    }
    Ok(())
}

/// The HTTP client's resolver: every name a delivery connects to (redirect targets included)
/// is checked when it is resolved, which is what the connection then uses. A name that does
/// not resolve is an ordinary connection failure (retried); a forbidden address is a
/// [`Refusal`] (not retried).
struct GuardedResolver {
    allow_private: bool,
    timeout: Duration,
}

impl Resolve for GuardedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (allow_private, timeout) = (self.allow_private, self.timeout);
        let host = name.as_str().to_owned();
        Box::pin(async move {
            // Port 0: the client puts in the URL's port.
            let addrs = lookup(&host, 0, timeout).await.ok_or_else(|| {
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("cannot resolve {host}"),
                )
            })?;
            check_addrs(&host, &addrs, allow_private)?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// How a delivery ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// The receiver answered 2xx.
    Delivered { status: u16, attempts: u32 },
    /// The URL is not allowed (any more); nothing was sent.
    Refused(Refusal),
    /// The receiver refused it (a 4xx other than 408/429), or every attempt failed.
    Failed { attempts: u32, reason: String },
}

/// What one attempt came to.
enum Attempt {
    Delivered(StatusCode),
    /// Worth another attempt, after at least this long when the receiver said so.
    Retry {
        reason: String,
        after: Option<Duration>,
    },
    GiveUp(String),
    Refused(Refusal),
}

/// The webhook sender: settings and one HTTP client (its connection pool shared by all
/// deliveries). Lives in the server state.
pub struct Webhooks {
    config: WebhookConfig,
    /// `None` when the client could not be built (logged once, then at each delivery).
    client: Option<reqwest::Client>,
    /// Counts deliveries by outcome.
    metrics: Arc<Metrics>,
}

impl Webhooks {
    pub fn new(config: WebhookConfig, metrics: Arc<Metrics>) -> Self {
        let client = build_client(&config)
            .inspect_err(|e| tracing::error!(error = %e, "cannot build the webhook HTTP client; webhooks will not be delivered"))
            .ok();
        Self {
            config,
            client,
            metrics,
        }
    }

    /// Checks a webhook URL before a run is stored with it: syntax, then every address its
    /// host resolves to.
    pub async fn check(&self, raw: &str) -> Result<(), Refusal> {
        let url = parse(raw)?;
        check_literal(&url, self.config.allow_private)?;
        if literal_ip(&url).is_some() {
            return Ok(());
        }
        let host = url.host_str().unwrap_or_default();
        let port = url.port_or_known_default().unwrap_or(80);
        let addrs = lookup(host, port, self.config.resolve_timeout)
            .await
            .ok_or_else(|| {
                Refusal::new(
                    "value_error",
                    format!("the webhook's host {host} cannot be resolved"),
                )
            })?;
        check_addrs(host, &addrs, self.config.allow_private)
    }

    /// POSTs `payload` to `url`, retrying what may succeed later, and logs each attempt.
    /// When `payload` is an object, its `webhook_sent_at` is set to each attempt's time.
    pub async fn deliver(&self, payload: &Value, url: &str) -> Delivery {
        let delivery = self.send(payload, url).await;
        self.metrics.webhook_delivered(match delivery {
            Delivery::Delivered { .. } => WebhookOutcome::Success,
            Delivery::Failed { .. } => WebhookOutcome::Failed,
            Delivery::Refused(_) => WebhookOutcome::Refused,
        });
        delivery
    }

    async fn send(&self, payload: &Value, url: &str) -> Delivery {
        let parsed = parse(url);
        // The host only in logs: paths and queries of webhook URLs often carry secrets.
        let host = parsed
            .as_ref()
            .ok()
            .and_then(Url::host_str)
            .unwrap_or_default()
            .to_owned();
        // Checked again: the settings may have changed since the run was created, and IP
        // literals do not go through the resolver (which checks names at each attempt, and
        // lets one that does not resolve right now be retried).
        let checked = parsed.and_then(|u| check_literal(&u, self.config.allow_private));
        if let Err(refusal) = checked {
            tracing::warn!(%host, reason = %refusal, "webhook refused; not sent");
            return Delivery::Refused(refusal);
        }
        let Some(client) = &self.client else {
            tracing::error!(%host, "webhook not sent: the HTTP client could not be built");
            return Delivery::Failed {
                attempts: 0,
                reason: "no HTTP client".into(),
            };
        };
        self.attempt_all(client, url, &host, payload.clone()).await
    }

    async fn attempt_all(
        &self,
        client: &reqwest::Client,
        url: &str,
        host: &str,
        mut payload: Value,
    ) -> Delivery {
        let max_attempts = self.config.max_attempts.max(1);
        let mut attempt = 1;
        loop {
            if let Value::Object(fields) = &mut payload {
                fields.insert("webhook_sent_at".into(), json!(Utc::now()));
            }
            let started = std::time::Instant::now();
            let outcome = attempt_once(client, url, &payload).await;
            let elapsed_ms = started.elapsed().as_millis() as u64;
            let (reason, after) = match outcome {
                Attempt::Retry { reason, after } if attempt < max_attempts => (reason, after),
                last => return last_attempt(last, host, attempt, elapsed_ms),
            };
            let wait = after.unwrap_or_else(|| self.backoff(attempt));
            tracing::warn!(%host, attempt, elapsed_ms, %reason, retry_in_ms = wait.as_millis() as u64,
                "webhook attempt failed; retrying");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }

    /// Delivers in the background, logging under the run's id; never delays the caller.
    pub fn spawn(self: &Arc<Self>, payload: Value, url: String, run_id: Uuid) {
        let webhooks = self.clone();
        // A root span: the delivery outlives whatever span the caller is in (a run's).
        let span = tracing::info_span!(parent: None, "webhook", %run_id);
        tokio::spawn(
            async move {
                webhooks.deliver(&payload, &url).await;
            }
            .instrument(span),
        );
    }

    /// Exponential backoff after the given (1-based) attempt, with up to 25% jitter so that
    /// the deliveries of runs that ended together do not retry together.
    fn backoff(&self, attempt: u32) -> Duration {
        let doubled = self
            .config
            .first_backoff
            .saturating_mul(1u32 << (attempt - 1).min(16));
        let base = doubled.min(self.config.max_backoff);
        base + crate::random_below(base / 4)
    }
}

/// Logs the attempt that ended a delivery, and says how it ended.
fn last_attempt(outcome: Attempt, host: &str, attempt: u32, elapsed_ms: u64) -> Delivery {
    match outcome {
        Attempt::Delivered(status) => {
            let status = status.as_u16();
            tracing::info!(%host, status, attempt, elapsed_ms, "webhook delivered");
            Delivery::Delivered {
                status,
                attempts: attempt,
            }
        }
        Attempt::Refused(refusal) => {
            tracing::warn!(%host, attempt, reason = %refusal, "webhook refused; not sent");
            Delivery::Refused(refusal)
        }
        Attempt::GiveUp(reason) => {
            tracing::warn!(%host, attempt, elapsed_ms, %reason, "webhook rejected by its receiver; not retried");
            Delivery::Failed {
                attempts: attempt,
                reason,
            }
        }
        Attempt::Retry { reason, .. } => {
            tracing::error!(%host, attempt, elapsed_ms, %reason, "webhook not delivered; giving up");
            Delivery::Failed {
                attempts: attempt,
                reason,
            }
        }
    }
}

fn build_client(config: &WebhookConfig) -> reqwest::Result<reqwest::Client> {
    let allow_private = config.allow_private;
    reqwest::Client::builder()
        .user_agent(concat!("spindle/", env!("CARGO_PKG_VERSION"), " (webhook)"))
        .connect_timeout(config.connect_timeout)
        .timeout(config.attempt_timeout)
        // A proxy would resolve the receiver's name itself, out of the resolver's sight.
        .no_proxy()
        .dns_resolver(Arc::new(GuardedResolver {
            allow_private,
            timeout: config.resolve_timeout,
        }))
        .redirect(reqwest::redirect::Policy::custom(move |next| {
            if next.previous().len() > MAX_REDIRECTS {
                return next.error("too many redirects");
            }
            let checked =
                parse(next.url().as_str()).and_then(|url| check_literal(&url, allow_private));
            match checked {
                Ok(()) => next.follow(),
                Err(refusal) => next.error(refusal),
            }
        }))
        .build()
}

async fn attempt_once(client: &reqwest::Client, url: &str, payload: &Value) -> Attempt {
    match client.post(url).json(payload).send().await {
        Ok(response) => judge_status(response.status(), retry_after(response.headers())),
        Err(err) => match refusal_in(&err) {
            Some(refusal) => Attempt::Refused(refusal.clone()),
            // A request that cannot be built, or redirects that go round, will not do
            // better next time.
            None if err.is_builder() || err.is_redirect() => Attempt::GiveUp(error_chain(&err)),
            None => Attempt::Retry {
                reason: error_chain(&err),
                after: None,
            },
        },
    }
}

/// 2xx is delivered; 408, 429 and 5xx may pass later; any other answer is the receiver's
/// final word.
fn judge_status(status: StatusCode, retry_after: Option<Duration>) -> Attempt {
    if status.is_success() {
        Attempt::Delivered(status)
    } else if status.is_server_error()
        || status == StatusCode::TOO_MANY_REQUESTS
        || status == StatusCode::REQUEST_TIMEOUT
    {
        Attempt::Retry {
            reason: format!("HTTP {}", status.as_u16()),
            after: retry_after,
        }
    } else {
        Attempt::GiveUp(format!("HTTP {}", status.as_u16()))
    }
}

/// `Retry-After` in seconds (the date form is rare from webhook receivers), capped.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds).min(MAX_RETRY_AFTER))
}

/// The refusal that stopped a request (from the resolver or the redirect policy), if any.
fn refusal_in(err: &reqwest::Error) -> Option<&Refusal> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(refusal) = e.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        source = e.source();
    }
    None
}

/// An error with its causes, which reqwest keeps out of its own message.
fn error_chain(err: &reqwest::Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// The payload of a run's webhook, as the reference sends it: the run as clients read it, then
/// `status`, `run_started_at`, `run_ended_at`, `webhook_sent_at` (set at each attempt), the
/// thread's final `values`, and `error` when the run failed.
pub fn run_payload(run: &Run, values: Option<Value>) -> Value {
    let mut payload = match serde_json::to_value(RunOut::from(run.clone())) {
        Ok(Value::Object(fields)) => fields,
        _ => Map::new(),
    };
    payload.insert("status".into(), json!(run.status.as_str()));
    payload.insert("run_started_at".into(), json!(run.started_at));
    payload.insert("run_ended_at".into(), json!(run.ended_at));
    payload.insert("webhook_sent_at".into(), Value::Null);
    payload.insert("values".into(), values.unwrap_or(Value::Null));
    if let Some(error) = &run.error {
        payload.insert("error".into(), error.clone());
    }
    Value::Object(payload)
}

/// The payload for a run rolled back before it ended: the run as it was, with status
/// `rollback` (a status no stored run has) and no values, as the reference server sends.
pub fn rollback_payload(run: &Run, ended_at: DateTime<Utc>) -> Value {
    let mut payload = run_payload(run, None);
    payload["status"] = json!("rollback");
    payload["run_ended_at"] = json!(ended_at);
    payload
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_storage::ResourceId;

    fn kind(ip: &str) -> AddressKind {
        classify(ip.parse().unwrap())
    }

    #[test]
    fn classifies_every_ipv4_range() {
        use AddressKind::*;
        for (ip, expected) in [
            ("8.8.8.8", Public),
            ("1.1.1.1", Public),
            ("0.0.0.0", Unspecified),
            ("0.1.2.3", Reserved),
            ("127.0.0.1", Loopback),
            ("127.255.255.254", Loopback),
            ("10.0.0.1", Private),
            ("10.255.255.255", Private),
            ("172.16.0.1", Private),
            ("172.31.255.255", Private),
            ("172.15.0.1", Public),
            ("172.32.0.1", Public),
            ("192.168.1.1", Private),
            ("100.64.0.1", Private),
            ("100.127.255.255", Private),
            ("100.63.255.255", Public),
            ("100.128.0.0", Public),
            ("169.254.169.254", LinkLocal),
            ("169.254.0.1", LinkLocal),
            ("224.0.0.1", Multicast),
            ("239.255.255.255", Multicast),
            ("240.0.0.1", Reserved),
            ("255.255.255.255", Reserved),
            ("192.0.0.8", Reserved),
            ("192.0.2.1", Reserved),
            ("198.18.0.1", Reserved),
            ("198.19.255.255", Reserved),
            ("198.51.100.7", Reserved),
            ("203.0.113.9", Reserved),
            ("192.0.1.1", Public),
            ("198.20.0.1", Public),
        ] {
            assert_eq!(kind(ip), expected, "{ip}");
        }
    }

    #[test]
    fn classifies_every_ipv6_range() {
        use AddressKind::*;
        for (ip, expected) in [
            ("2606:4700:4700::1111", Public),
            ("::", Unspecified),
            ("::1", Loopback),
            ("fc00::1", Private),
            ("fd12:3456::1", Private),
            ("fec0::1", Private),
            ("fe80::1", LinkLocal),
            ("febf::1", LinkLocal),
            ("ff02::1", Multicast),
            ("2001:db8::1", Reserved),
            ("100::1", Reserved),
            ("::7f00:1", Reserved),
            ("64:ff9b:1::1", Reserved),
            // IPv4 inside IPv6 is judged by the IPv4 address.
            ("::ffff:127.0.0.1", Loopback),
            ("::ffff:169.254.169.254", LinkLocal),
            ("::ffff:10.1.2.3", Private),
            ("::ffff:8.8.8.8", Public),
            ("64:ff9b::7f00:1", Loopback),
            ("64:ff9b::a9fe:a9fe", LinkLocal),
            ("64:ff9b::808:808", Public),
            ("2002:7f00:1::", Loopback),
            ("2002:c0a8:101::1", Private),
            ("2002:808:808::1", Public),
        ] {
            assert_eq!(kind(ip), expected, "{ip}");
        }
    }

    #[test]
    fn only_public_addresses_pass_by_default() {
        use AddressKind::*;
        let all = [
            Public,
            Private,
            Loopback,
            LinkLocal,
            Unspecified,
            Multicast,
            Reserved,
        ];
        let by_default: Vec<_> = all.into_iter().filter(|k| k.permitted(false)).collect();
        assert_eq!(by_default, [Public]);
        let allowed: Vec<_> = all.into_iter().filter(|k| k.permitted(true)).collect();
        assert_eq!(allowed, [Public, Private, Loopback]);
    }

    #[test]
    fn parse_wants_an_http_url_with_a_host() {
        assert!(parse("https://hooks.example.com/x?token=1").is_ok());
        assert!(parse("http://127.0.0.1:8080/").is_ok());
        assert_eq!(parse("not a url").unwrap_err().kind, "url_parsing");
        assert_eq!(parse("/relative/path").unwrap_err().kind, "url_parsing");
        assert_eq!(parse("ftp://example.com/").unwrap_err().kind, "url_scheme");
        assert_eq!(parse("file:///etc/passwd").unwrap_err().kind, "url_scheme");
        assert_eq!(parse("http://").unwrap_err().kind, "url_parsing");
        assert_eq!(parse("").unwrap_err().kind, "url_parsing");
        // What the URL parser takes but the document's pattern does not say.
        for raw in [
            "http:example.com",
            " http://example.com",
            "http:/example.com",
        ] {
            assert_eq!(parse(raw).unwrap_err().kind, "url_parsing", "{raw}");
        }
        assert!(parse("HTTPS://Example.com").is_ok());
    }

    #[test]
    fn literal_ips_are_read_in_every_spelling() {
        let ip = |raw: &str| literal_ip(&parse(raw).unwrap());
        assert_eq!(ip("http://[::1]:8000/"), Some("::1".parse().unwrap()));
        assert_eq!(ip("http://0x7f.1/"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ip("http://2130706433/"), Some("127.0.0.1".parse().unwrap()));
        assert_eq!(ip("http://example.com/"), None);
    }

    fn webhooks(allow_private: bool) -> Webhooks {
        Webhooks::new(
            WebhookConfig {
                allow_private,
                ..WebhookConfig::default()
            },
            Arc::default(),
        )
    }

    #[tokio::test]
    async fn check_refuses_private_targets_unless_allowed() {
        let strict = webhooks(false);
        for url in [
            "http://127.0.0.1:1/x",
            "http://[::1]/",
            "http://169.254.169.254/latest/meta-data/",
            "http://10.0.0.1/",
            "http://[::ffff:127.0.0.1]/",
            "http://localhost:8080/",
            "http://0.0.0.0/",
        ] {
            let refusal = strict.check(url).await.unwrap_err();
            assert_eq!(refusal.kind, "value_error", "{url}");
        }
        let open = webhooks(true);
        assert!(open.check("http://127.0.0.1:1/x").await.is_ok());
        assert!(open.check("http://[::1]/").await.is_ok());
        assert!(open.check("http://10.0.0.1/").await.is_ok());
        // Link-local stays refused: that is where cloud metadata answers.
        assert!(open
            .check("http://169.254.169.254/latest/meta-data/")
            .await
            .is_err());
        assert!(open.check("http://0.0.0.0/").await.is_err());
    }

    #[tokio::test]
    async fn an_unresolvable_host_is_refused() {
        let refusal = webhooks(false)
            .check("http://no-such-host.invalid/")
            .await
            .unwrap_err();
        assert!(refusal.message.contains("cannot be resolved"), "{refusal}");
    }

    #[test]
    fn refusals_say_what_the_address_is_and_what_would_allow_it() {
        let loopback = Refusal::address(
            "localhost",
            "127.0.0.1".parse().unwrap(),
            AddressKind::Loopback,
        );
        assert!(loopback.message.contains("localhost resolves to 127.0.0.1"));
        assert!(loopback.message.contains("--webhook-allow-private"));
        let metadata = Refusal::address(
            "169.254.169.254",
            "169.254.169.254".parse().unwrap(),
            AddressKind::LinkLocal,
        );
        assert!(metadata
            .message
            .starts_with("169.254.169.254 is a link-local address"));
        assert!(!metadata.message.contains("--webhook-allow-private"));
    }

    #[test]
    fn statuses_are_delivered_retried_or_final() {
        let judged = |code: u16| match judge_status(StatusCode::from_u16(code).unwrap(), None) {
            Attempt::Delivered(_) => "delivered",
            Attempt::Retry { .. } => "retry",
            Attempt::GiveUp(_) => "give up",
            Attempt::Refused(_) => "refused",
        };
        assert_eq!(judged(200), "delivered");
        assert_eq!(judged(204), "delivered");
        for code in [408, 429, 500, 502, 503, 504] {
            assert_eq!(judged(code), "retry", "{code}");
        }
        for code in [301, 400, 401, 404, 410, 422] {
            assert_eq!(judged(code), "give up", "{code}");
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_cap_with_bounded_jitter() {
        let w = webhooks(false);
        for (attempt, base) in [(1, 1), (2, 2), (3, 4), (4, 8), (5, 16), (6, 30), (40, 30)] {
            let wait = w.backoff(attempt);
            let base = Duration::from_secs(base);
            assert!(
                wait >= base && wait <= base + base / 4,
                "{attempt}: {wait:?}"
            );
        }
    }

    #[test]
    fn retry_after_is_read_in_seconds_and_capped() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, "3".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3)));
        headers.insert(reqwest::header::RETRY_AFTER, "86400".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(MAX_RETRY_AFTER));
        headers.insert(
            reqwest::header::RETRY_AFTER,
            "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    /// A receiver on 127.0.0.1 that answers the scripted statuses in turn (then 200) and keeps
    /// the bodies it got; `/redirect` sends elsewhere.
    async fn receiver(script: Vec<u16>) -> (String, Arc<std::sync::Mutex<Vec<Value>>>) {
        use axum::routing::post;
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let script = Arc::new(std::sync::Mutex::new(script));
        let (seen, answers) = (got.clone(), script.clone());
        let app = axum::Router::new()
            .route(
                "/hook",
                post(move |axum::Json(body): axum::Json<Value>| async move {
                    seen.lock().unwrap().push(body);
                    let mut answers = answers.lock().unwrap();
                    let code = if answers.is_empty() {
                        200
                    } else {
                        answers.remove(0)
                    };
                    axum::http::StatusCode::from_u16(code).unwrap()
                }),
            )
            .route(
                "/redirect",
                post(|| async {
                    (
                        axum::http::StatusCode::TEMPORARY_REDIRECT,
                        [("location", "http://169.254.169.254/latest/meta-data/")],
                    )
                }),
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}"), got)
    }

    fn quick(allow_private: bool) -> Webhooks {
        Webhooks::new(
            WebhookConfig {
                allow_private,
                max_attempts: 3,
                first_backoff: Duration::from_millis(10),
                ..WebhookConfig::default()
            },
            Arc::default(),
        )
    }

    #[tokio::test]
    async fn delivers_once_and_stamps_each_attempt() {
        let (base, got) = receiver(vec![]).await;
        let payload = json!({"run_id": "r", "webhook_sent_at": null, "values": {"n": 1}});
        let outcome = quick(true).deliver(&payload, &format!("{base}/hook")).await;
        assert_eq!(
            outcome,
            Delivery::Delivered {
                status: 200,
                attempts: 1
            }
        );
        let got = got.lock().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0]["values"], json!({"n": 1}));
        assert!(got[0]["webhook_sent_at"].is_string(), "{}", got[0]);
    }

    #[tokio::test]
    async fn retries_server_errors_and_stops_at_client_errors() {
        let (base, got) = receiver(vec![500, 503]).await;
        let outcome = quick(true)
            .deliver(&json!({}), &format!("{base}/hook"))
            .await;
        assert_eq!(
            outcome,
            Delivery::Delivered {
                status: 200,
                attempts: 3
            }
        );
        assert_eq!(got.lock().unwrap().len(), 3);

        let (base, got) = receiver(vec![500, 500, 500]).await;
        let outcome = quick(true)
            .deliver(&json!({}), &format!("{base}/hook"))
            .await;
        assert!(
            matches!(outcome, Delivery::Failed { attempts: 3, .. }),
            "{outcome:?}"
        );
        assert_eq!(got.lock().unwrap().len(), 3);

        let (base, got) = receiver(vec![404]).await;
        let outcome = quick(true)
            .deliver(&json!({}), &format!("{base}/hook"))
            .await;
        assert!(
            matches!(outcome, Delivery::Failed { attempts: 1, .. }),
            "{outcome:?}"
        );
        assert_eq!(got.lock().unwrap().len(), 1);
    }

    #[tokio::test]
    async fn connection_failures_are_retried() {
        // Nothing listens on port 1.
        let outcome = quick(true)
            .deliver(&json!({}), "http://127.0.0.1:1/x")
            .await;
        assert!(
            matches!(outcome, Delivery::Failed { attempts: 3, .. }),
            "{outcome:?}"
        );
        // A name that does not resolve now may resolve later.
        let outcome = quick(false)
            .deliver(&json!({}), "http://no-such-host.invalid/")
            .await;
        assert!(
            matches!(outcome, Delivery::Failed { attempts: 3, .. }),
            "{outcome:?}"
        );
    }

    #[tokio::test]
    async fn redirects_to_forbidden_addresses_are_not_followed() {
        let (base, _) = receiver(vec![]).await;
        let outcome = quick(true)
            .deliver(&json!({}), &format!("{base}/redirect"))
            .await;
        assert!(matches!(outcome, Delivery::Refused(_)), "{outcome:?}");
    }

    #[tokio::test]
    async fn the_client_resolves_names_through_the_rule() {
        // As if the name had resolved to a public address when the run was created: the
        // connection's own resolution is refused.
        let (base, got) = receiver(vec![]).await;
        let port = base.rsplit(':').next().unwrap();
        let strict = quick(false);
        let client = strict.client.as_ref().unwrap();
        let outcome =
            attempt_once(client, &format!("http://localhost:{port}/hook"), &json!({})).await;
        assert!(matches!(outcome, Attempt::Refused(_)));
        assert!(got.lock().unwrap().is_empty());
        let refused = strict.deliver(&json!({}), &format!("{base}/hook")).await;
        assert!(matches!(refused, Delivery::Refused(_)), "{refused:?}");
    }

    fn ended_run(status: spindle_storage::RunStatus, error: Option<Value>) -> Run {
        let now = Utc::now();
        Run {
            run_id: Uuid::now_v7(),
            thread_id: ResourceId::generate(),
            assistant_id: ResourceId::generate(),
            user_id: None,
            status,
            kwargs: serde_json::from_value(
                json!({"input": {"n": 1}, "webhook": "https://h.example/x"}),
            )
            .unwrap(),
            metadata: serde_json::from_value(json!({"tag": "t"})).unwrap(),
            multitask_strategy: spindle_storage::MultitaskStrategy::Enqueue,
            attempt: 1,
            run_after: now,
            cancel: None,
            error,
            output: None,
            created_at: now,
            updated_at: now,
            started_at: Some(now),
            ended_at: Some(now),
        }
    }

    #[test]
    fn the_payload_is_the_run_with_its_times_values_and_error() {
        let run = ended_run(spindle_storage::RunStatus::Success, None);
        let payload = run_payload(&run, Some(json!({"n": 4})));
        let keys: Vec<&str> = payload
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            keys,
            [
                "run_id",
                "thread_id",
                "assistant_id",
                "created_at",
                "updated_at",
                "status",
                "metadata",
                "kwargs",
                "multitask_strategy",
                "user_id",
                "input",
                "output",
                "error_message",
                "config",
                "context",
                "run_started_at",
                "run_ended_at",
                "webhook_sent_at",
                "values",
            ]
        );
        assert_eq!(payload["run_id"], json!(run.run_id.to_string()));
        assert_eq!(payload["status"], json!("success"));
        assert_eq!(payload["values"], json!({"n": 4}));
        assert_eq!(payload["kwargs"]["webhook"], json!("https://h.example/x"));
        assert_eq!(payload["run_started_at"], json!(run.started_at));
        assert_eq!(payload["run_ended_at"], json!(run.ended_at));
        assert!(payload["run_ended_at"].is_string());

        let failure = json!({"error": "ValueError", "message": "boom"});
        let failed = ended_run(spindle_storage::RunStatus::Error, Some(failure.clone()));
        let payload = run_payload(&failed, None);
        assert_eq!(payload["status"], json!("error"));
        assert_eq!(payload["error"], failure);
        assert_eq!(payload["values"], Value::Null);
    }
}
