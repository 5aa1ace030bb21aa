//! What each route does, in LangGraph's authorization vocabulary (`@auth.on.<resource>.<action>`):
//! threads `create`, `read`, `update`, `delete`, `search`, `create_run`; assistants and crons
//! `create`, `read`, `update`, `delete`, `search`; store `put`, `get`, `search`,
//! `list_namespaces`, `delete`. Runs belong to their thread: reading one reads the thread,
//! cancelling one updates it.
//!
//! A permission grants an action as `resource:action`, `resource:*`, `*:action` or `*`.

use axum::http::Method;

/// A route's resource and action, as a permission names them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Action {
    pub resource: &'static str,
    pub action: &'static str,
}

/// The action of a route (its method and path template); `None` for the routes that touch no
/// resource (`/info`, the graph file schema, the health checks), which any authenticated
/// caller may call.
pub fn of(method: &Method, path: &str) -> Option<Action> {
    let (resource, action) = if path.ends_with("/runs/crons") || path.starts_with("/runs/crons") {
        ("crons", cron_action(method, path)?)
    } else if let Some(rest) = path.strip_prefix("/threads") {
        ("threads", thread_action(method, rest)?)
    } else if let Some(rest) = path.strip_prefix("/runs") {
        ("threads", stateless_run_action(method, rest)?)
    } else if let Some(rest) = path.strip_prefix("/assistants") {
        ("assistants", assistant_action(method, rest)?)
    } else if let Some(rest) = path.strip_prefix("/store") {
        ("store", store_action(method, rest)?)
    } else {
        return None;
    };
    Some(Action { resource, action })
}

/// Read, update and delete of one item, by method.
fn item_action(method: &Method) -> Option<&'static str> {
    Some(match *method {
        Method::GET => "read",
        Method::PATCH => "update",
        Method::DELETE => "delete",
        _ => return None,
    })
}

fn cron_action(method: &Method, path: &str) -> Option<&'static str> {
    match (method, path) {
        (&Method::POST, "/runs/crons" | "/threads/{thread_id}/runs/crons") => Some("create"),
        (&Method::POST, "/runs/crons/search" | "/runs/crons/count") => Some("search"),
        _ => item_action(method),
    }
}

fn thread_action(method: &Method, rest: &str) -> Option<&'static str> {
    Some(match (method, rest) {
        (&Method::POST, "" | "/{thread_id}/copy") => "create",
        (&Method::POST, "/search" | "/count") => "search",
        (&Method::POST, "/prune") => "delete",
        (
            &Method::POST,
            "/{thread_id}/runs" | "/{thread_id}/runs/stream" | "/{thread_id}/runs/wait",
        ) => "create_run",
        (&Method::POST, "/{thread_id}/state" | "/{thread_id}/runs/{run_id}/cancel") => "update",
        (
            &Method::POST,
            "/{thread_id}/history"
            | "/{thread_id}/state/checkpoint"
            | "/{thread_id}/stream/events"
            // The least a command needs; a command that starts a run is checked by
            // `protocol::commands` for `create_run`.
            | "/{thread_id}/commands",
        ) => "read",
        (&Method::POST, _) => return None,
        _ => item_action(method)?,
    })
}

fn stateless_run_action(method: &Method, rest: &str) -> Option<&'static str> {
    Some(match (method, rest) {
        (&Method::POST, "" | "/stream" | "/wait" | "/batch") => "create_run",
        (&Method::POST, "/cancel") => "update",
        (&Method::GET, _) => "read",
        _ => return None,
    })
}

fn assistant_action(method: &Method, rest: &str) -> Option<&'static str> {
    Some(match (method, rest) {
        (&Method::POST, "") => "create",
        (&Method::POST, "/search" | "/count") => "search",
        (&Method::POST, "/{assistant_id}/latest") => "update",
        (&Method::POST, "/{assistant_id}/versions") => "read",
        (&Method::POST, _) => return None,
        _ => item_action(method)?,
    })
}

fn store_action(method: &Method, rest: &str) -> Option<&'static str> {
    Some(match (method, rest) {
        (&Method::PUT, "/items") => "put",
        (&Method::GET, "/items") => "get",
        (&Method::DELETE, "/items") => "delete",
        (&Method::POST, "/items/search") => "search",
        (&Method::POST, "/namespaces") => "list_namespaces",
        _ => return None,
    })
}

/// The action of a protocol command (`run.start`, `state.get`, ...), on its thread.
pub fn of_command(method: &str) -> Action {
    let action = match method {
        "run.start" | "input.respond" | "state.fork" => "create_run",
        _ => "read",
    };
    Action {
        resource: "threads",
        action,
    }
}

/// Whether `permissions` grant `action`.
pub fn granted(action: Action, permissions: &[String]) -> bool {
    permissions.iter().any(|p| {
        let (resource, act) = p.split_once(':').unwrap_or((p.as_str(), "*"));
        (resource == "*" || resource == action.resource) && (act == "*" || act == action.action)
    })
}

/// Why `permissions` do not allow `action` (the permission it needs), or `None` when they do.
/// The answer depends on the action alone, never on a resource, so it tells nothing of what
/// exists.
pub fn missing(action: Action, permissions: &[String]) -> Option<String> {
    (!granted(action, permissions)).then(|| {
        format!(
            "Not allowed: this needs the permission {}:{}",
            action.resource, action.action
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn action(method: Method, path: &str) -> Option<(&'static str, &'static str)> {
        of(&method, path).map(|a| (a.resource, a.action))
    }

    #[test]
    fn routes_map_to_langgraphs_actions() {
        let cases = [
            (Method::POST, "/threads", ("threads", "create")),
            (
                Method::POST,
                "/threads/{thread_id}/copy",
                ("threads", "create"),
            ),
            (Method::POST, "/threads/search", ("threads", "search")),
            (
                Method::GET,
                "/threads/{thread_id}/state",
                ("threads", "read"),
            ),
            (
                Method::POST,
                "/threads/{thread_id}/state",
                ("threads", "update"),
            ),
            (
                Method::POST,
                "/threads/{thread_id}/runs/stream",
                ("threads", "create_run"),
            ),
            (
                Method::POST,
                "/threads/{thread_id}/commands",
                ("threads", "read"),
            ),
            (
                Method::GET,
                "/threads/{thread_id}/runs/{run_id}/join",
                ("threads", "read"),
            ),
            (
                Method::POST,
                "/threads/{thread_id}/runs/{run_id}/cancel",
                ("threads", "update"),
            ),
            (
                Method::DELETE,
                "/threads/{thread_id}/runs/{run_id}",
                ("threads", "delete"),
            ),
            (Method::POST, "/runs/wait", ("threads", "create_run")),
            (Method::POST, "/runs/cancel", ("threads", "update")),
            (
                Method::POST,
                "/threads/{thread_id}/runs/crons",
                ("crons", "create"),
            ),
            (Method::POST, "/runs/crons", ("crons", "create")),
            (Method::PATCH, "/runs/crons/{cron_id}", ("crons", "update")),
            (Method::POST, "/runs/crons/count", ("crons", "search")),
            (Method::POST, "/assistants", ("assistants", "create")),
            (
                Method::POST,
                "/assistants/{assistant_id}/latest",
                ("assistants", "update"),
            ),
            (
                Method::GET,
                "/assistants/{assistant_id}/graph",
                ("assistants", "read"),
            ),
            (Method::PUT, "/store/items", ("store", "put")),
            (
                Method::POST,
                "/store/namespaces",
                ("store", "list_namespaces"),
            ),
        ];
        for (method, path, expected) in cases {
            assert_eq!(
                action(method.clone(), path),
                Some(expected),
                "{method} {path}"
            );
        }
        assert_eq!(action(Method::GET, "/info"), None);
    }

    #[test]
    fn every_api_route_has_an_action() {
        let (_, api) = crate::openapi::router().split_for_parts();
        for (path, item) in api.paths.paths {
            let methods = [
                (Method::GET, item.get.is_some()),
                (Method::POST, item.post.is_some()),
                (Method::PUT, item.put.is_some()),
                (Method::PATCH, item.patch.is_some()),
                (Method::DELETE, item.delete.is_some()),
            ];
            for (method, served) in methods {
                let system = [
                    "/ok",
                    "/health",
                    "/live",
                    "/ready",
                    "/info",
                    "/graph-file.schema.json",
                    "/metrics",
                ]
                .contains(&path.as_str());
                if served && !system {
                    assert!(
                        of(&method, &path).is_some(),
                        "{method} {path} has no action"
                    );
                }
            }
        }
    }

    #[test]
    fn permissions_grant_by_resource_action_or_wildcard() {
        let read = Action {
            resource: "threads",
            action: "read",
        };
        let grants =
            |p: &[&str]| granted(read, &p.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert!(grants(&["threads:read"]));
        assert!(grants(&["threads:*"]));
        assert!(grants(&["*:read"]));
        assert!(grants(&["*"]));
        assert!(grants(&["threads"]));
        assert!(!grants(&["threads:update", "store:*"]));
        assert!(!grants(&[]));
    }
}
