//! Opening the database at start-up, with a failure told in one line: where (host:port), the
//! cause, and what to check.
//!
//! The storage's PostgreSQL pool retries a refused connection until its 10 s acquire timeout
//! (right for a running server riding out a database restart, wrong for a start-up with a
//! wrong port), and then reports the time-out rather than the refusal. The storage crate is
//! left as it is: before connecting, the binary opens one TCP connection to the URL's host and
//! port, which tells a refused port or an unknown host at once; the errors PostgreSQL itself
//! answers (authentication, a missing database) come back from the pool at once anyway, and
//! are reduced to their innermost cause, which the error chain otherwise repeated three times.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, Result};
use spindle_storage::{ConnectOptions, Storage, StorageError};
use tokio::net::{lookup_host, TcpStream};

use crate::redact;

/// How long the reachability check waits for a host that does not answer at all.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
const DEFAULT_PORT: u16 = 5432;

/// Opens (and migrates) the database at `url`.
pub async fn open(url: &str, options: &ConnectOptions) -> Result<Arc<dyn Storage>> {
    let target = reachable(url).await?;
    spindle_storage::connect_with(url, options)
        .await
        .map_err(|err| anyhow!(explain("open", url, target.as_deref(), &err)))
}

/// Applies the pending migrations of the database at `url` and says how many ran.
pub async fn migrate(url: &str) -> Result<usize> {
    let target = reachable(url).await?;
    spindle_storage::migrate(url)
        .await
        .map_err(|err| anyhow!(explain("migrate", url, target.as_deref(), &err)))
}

/// For a PostgreSQL URL naming a TCP host: checks that its port accepts connections, and
/// returns `host:port`.
async fn reachable(url: &str) -> Result<Option<String>> {
    let Some((host, port)) = tcp_target(url) else {
        return Ok(None);
    };
    let target = match host.contains(':') {
        true => format!("[{host}]:{port}"),
        false => format!("{host}:{port}"),
    };
    let probe = async {
        let addrs = lookup_host((host.as_str(), port)).await.map_err(|e| {
            format!("cannot resolve the host `{host}` ({e}); check the host in the database URL")
        })?;
        let mut refusal = format!("`{host}` resolves to no address");
        for addr in addrs {
            match TcpStream::connect(addr).await {
                Ok(_) => return Ok(()),
                Err(e) => refusal = io_cause(&e),
            }
        }
        Err(format!(
            "{refusal}; is PostgreSQL running there, and listening on that port?"
        ))
    };
    let outcome = tokio::time::timeout(PROBE_TIMEOUT, probe)
        .await
        .unwrap_or_else(|_| {
            Err(format!(
                "no answer within {} s; check the host and port, and any firewall between",
                PROBE_TIMEOUT.as_secs()
            ))
        });
    outcome.map_err(|cause| {
        anyhow!(
            "cannot reach PostgreSQL at {target} (database URL {}): {cause}",
            redact(url)
        )
    })?;
    Ok(Some(target))
}

fn io_cause(err: &std::io::Error) -> String {
    match err.kind() {
        std::io::ErrorKind::ConnectionRefused => "connection refused".into(),
        _ => err.to_string(),
    }
}

/// The host and port of a `postgres://` URL, when it names a TCP host: not a Unix socket
/// (an empty host, a `host=` parameter, a percent-encoded path) nor a list of hosts, which
/// are left to the driver.
fn tcp_target(url: &str) -> Option<(String, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    if !["postgres", "postgresql"].contains(&scheme.to_ascii_lowercase().as_str()) {
        return None;
    }
    let (authority, path_and_query) = rest.split_at(rest.find(['/', '?']).unwrap_or(rest.len()));
    if path_and_query.contains("host=") {
        return None;
    }
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(v6) => {
            let (host, after) = v6.split_once(']')?;
            (host, after.strip_prefix(':'))
        }
        None => match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    if host.is_empty() || host.contains([',', '%', '/']) {
        return None;
    }
    let port = match port.filter(|p| !p.is_empty()) {
        Some(port) => port.parse().ok()?,
        None => std::env::var("PGPORT")
            .ok()
            .and_then(|p| p.parse().ok())
            .unwrap_or(DEFAULT_PORT),
    };
    Some((host.to_owned(), port))
}

/// One line: the database, its innermost cause (the chain repeats each level's text), and a
/// hint for the failures PostgreSQL names by SQLSTATE.
fn explain(doing: &str, url: &str, target: Option<&str>, err: &StorageError) -> String {
    let mut cause: &(dyn std::error::Error + 'static) = err;
    while let Some(source) = cause.source() {
        cause = source;
    }
    let at = target.map(|t| format!(" at {t}")).unwrap_or_default();
    let hint = match sqlstate(err).as_deref() {
        Some("28P01") => "; check the user and password in the database URL",
        Some("28000") => {
            "; check the user in the database URL, and pg_hba.conf (who may connect from where)"
        }
        Some("3D000") => "; create it (createdb), or name an existing database in the URL",
        _ => "",
    };
    format!(
        "cannot {doing} the database{at} ({}): {cause}{hint}",
        redact(url)
    )
}

fn sqlstate(err: &StorageError) -> Option<String> {
    match err {
        StorageError::Database(e) => Some(e.as_database_error()?.code()?.into_owned()),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_tcp_host_and_port_of_a_postgres_url() {
        let target = |url: &str| tcp_target(url).map(|(h, p)| format!("{h}|{p}"));
        assert_eq!(
            target("postgres://u:p@db.example:6543/x").as_deref(),
            Some("db.example|6543")
        );
        assert_eq!(
            target("postgresql://127.0.0.1:1/test").as_deref(),
            Some("127.0.0.1|1")
        );
        assert_eq!(
            target("postgres://u@[::1]:5433/x").as_deref(),
            Some("::1|5433")
        );
        if std::env::var_os("PGPORT").is_none() {
            assert_eq!(
                target("postgres://u:p:q@h/x?sslmode=disable").as_deref(),
                Some("h|5432")
            );
        }
        // Unix sockets and host lists are the driver's.
        for left in [
            "postgres:///db",
            "postgres://u@/db?host=/var/run/postgresql",
            "postgres://%2Fvar%2Frun/db",
            "postgres://h1,h2/db",
            "sqlite:///tmp/x.db",
            ".spindle/spindle.db",
        ] {
            assert_eq!(tcp_target(left), None, "{left}");
        }
    }

    #[tokio::test]
    async fn a_closed_port_is_told_at_once_naming_host_and_port() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let started = std::time::Instant::now();
        let url = format!("postgres://u:secret@127.0.0.1:{port}/db");
        let err = reachable(&url).await.unwrap_err().to_string();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
        assert!(err.contains("connection refused"), "{err}");
        assert!(!err.contains("secret"), "{err}");
    }
}
