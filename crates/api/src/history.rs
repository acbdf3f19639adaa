//! The middleware that records every successful request changing a pool in
//! that pool's history (`pool history`), with the command line, user and
//! host the CLI sends as headers. One place for every route, so a new verb
//! is recorded without code of its own.

use crate::server::ApiState;
use crate::{decode_header, HEADER_COMMAND, HEADER_HOST, HEADER_USER};
use axum::body::{to_bytes, Body};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use dataset::Caller;

/// Bodies of the requests recorded are small JSON documents.
const MAX_BODY: usize = 2 << 20;

fn caller(headers: &HeaderMap, method: &Method, uri: &axum::http::Uri) -> Caller {
    let get = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(decode_header)
    };
    Caller {
        command: get(HEADER_COMMAND).unwrap_or_else(|| format!("{method} {uri}")),
        user: get(HEADER_USER).unwrap_or_default(),
        host: get(HEADER_HOST).unwrap_or_default(),
    }
}

/// The pool a dataset or snapshot name belongs to.
fn pool_of(name: &str) -> String {
    name.split(['/', '@']).next().unwrap_or(name).to_string()
}

/// The pool a request is about: the path (`/v1/pools/{pool}/...`), the
/// `name=` query parameter, or the first name in the JSON body.
fn pool_from(segments: &[&str], query: Option<&str>, body: &[u8]) -> Option<String> {
    if segments.len() >= 3 && segments[1] == "pools" {
        return Some(segments[2].to_string());
    }
    if let Some(q) = query {
        for pair in q.split('&') {
            if let Some(v) = pair
                .strip_prefix("name=")
                .or_else(|| pair.strip_prefix("target="))
            {
                let v = v.replace('+', " ");
                return Some(pool_of(&decode_header(&v)));
            }
        }
    }
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    for key in ["name", "snapshot", "from", "names", "snapshots"] {
        let found = match v.get(key) {
            Some(serde_json::Value::String(s)) => Some(s.clone()),
            Some(serde_json::Value::Array(a)) => {
                a.first().and_then(|x| x.as_str()).map(str::to_string)
            }
            _ => None,
        };
        if let Some(name) = found {
            return Some(pool_of(&name));
        }
    }
    None
}

async fn log(st: &ApiState, pool: String, caller: Caller) {
    let engine = st.engine.clone();
    let done = tokio::task::spawn_blocking(move || engine.log_history(&pool, &caller)).await;
    match done {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!(error = %e, "not recorded in a pool history"),
        Err(e) => tracing::warn!(error = %e, "history record failed"),
    }
}

/// axum middleware: see the module comment.
pub async fn record(State(st): State<ApiState>, req: Request, next: Next) -> Response {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    if !matches!(method, Method::POST | Method::PATCH | Method::DELETE)
        || path == "/v1/labelclear"
        || path.starts_with("/v1/events")
        || path.starts_with("/v1/users")
    {
        return next.run(req).await;
    }
    let segments: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let caller = caller(req.headers(), &method, req.uri());
    if path == "/v1/receive" || path == "/v1/send" {
        // A stream, not a small JSON body: never buffered. Only a receive
        // changes a pool (its target is in the query).
        let pool = pool_from(&segments, req.uri().query(), b"");
        let resp = next.run(req).await;
        if let Some(pool) = pool.filter(|_| resp.status().is_success() && path == "/v1/receive") {
            log(&st, pool, caller).await;
        }
        return resp;
    }
    let query = req.uri().query().map(str::to_string);
    let is_pool = segments.len() >= 3 && segments[1] == "pools";
    if is_pool && segments.len() == 3 && method == Method::DELETE {
        // `pool destroy`: nothing is left to record it in.
        return next.run(req).await;
    }
    if is_pool && segments.get(3) == Some(&"export") {
        // Recorded before: the history closes with the pool.
        log(&st, segments[2].to_string(), caller).await;
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let bytes = match to_bytes(body, MAX_BODY).await {
        Ok(b) => b,
        Err(e) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                axum::Json(crate::ErrorBody {
                    error: format!("request body: {e}"),
                    kind: "BadRequest".into(),
                }),
            )
                .into_response()
        }
    };
    let pool = pool_from(&segments, query.as_deref(), &bytes);
    // A dry run (`destroy -n`, a rollback preview) changes nothing.
    let dry_run = query
        .as_deref()
        .is_some_and(|q| q.split('&').any(|kv| kv == "dry_run=true"))
        || serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("dry_run").and_then(|d| d.as_bool()))
            .unwrap_or(false);
    let pool = pool.filter(|_| !dry_run);
    let resp = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if !resp.status().is_success() {
        return resp;
    }
    if path == "/v1/import" {
        // Imported by name or guid: the answer names it.
        let (parts, body) = resp.into_parts();
        let bytes = to_bytes(body, usize::MAX).await.unwrap_or_default();
        if let Ok(status) = serde_json::from_slice::<dataset::PoolStatus>(&bytes) {
            log(&st, status.summary.name, caller).await;
        }
        return Response::from_parts(parts, Body::from(bytes));
    }
    if let Some(pool) = pool {
        log(&st, pool, caller).await;
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_of_each_kind_of_request() {
        let segs = |p: &'static str| p.trim_start_matches('/').split('/').collect::<Vec<_>>();
        assert_eq!(
            pool_from(&segs("/v1/pools/tank/scrub"), None, b""),
            Some("tank".into())
        );
        assert_eq!(
            pool_from(&segs("/v1/pools"), None, br#"{"name":"new","groups":[]}"#),
            Some("new".into())
        );
        assert_eq!(
            pool_from(&segs("/v1/dataset"), Some("name=tank%2Fvol"), b""),
            Some("tank".into())
        );
        assert_eq!(
            pool_from(&segs("/v1/snapshots"), None, br#"{"names":["b/v@1"]}"#),
            Some("b".into())
        );
        assert_eq!(pool_from(&segs("/v1/snapshots"), None, b"{}"), None);
    }
}
