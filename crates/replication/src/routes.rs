//! `/v1/replication`: merged into the daemon's API router (behind its token).
//!
//! | method | path | body in | answer |
//! |---|---|---|---|
//! | GET | /v1/replication | | `[JobStatus]` |
//! | POST | /v1/replication | [`AddJob`] | 201 `JobStatus` |
//! | GET | /v1/replication/{job} | | `JobStatus` (with its history) |
//! | DELETE | /v1/replication/{job} | | `{"notes": [...]}` (holds not released) |
//! | POST | /v1/replication/{job}/run | [`RunRequest`] | `RunRecord` (a failed run: its error, 409 `Diverged` for a changed target) |
//! | POST | /v1/replication/{job}/pause, /resume | | `JobStatus` |

use crate::manager::kind_of;
use crate::{AddJob, Error, Manager, RunRequest};
use api::ApiState;
use axum::extract::Path;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;

fn error_response(status: StatusCode, kind: &str, message: String) -> Response {
    (
        status,
        Json(api::ErrorBody {
            error: message,
            kind: kind.to_string(),
        }),
    )
        .into_response()
}

fn status_of(e: &Error) -> StatusCode {
    match e {
        Error::Invalid(_) => StatusCode::BAD_REQUEST,
        Error::NotFound(_) => StatusCode::NOT_FOUND,
        Error::Exists(_) | Error::Busy(_) | Error::Diverged(_) => StatusCode::CONFLICT,
        Error::Engine(e) => api::status_for(e),
        Error::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        Error::Remote(_) | Error::Stream(_) => StatusCode::BAD_GATEWAY,
        Error::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn reply<T: serde::Serialize>(r: crate::Result<T>) -> Response {
    match r {
        Ok(v) => Json(v).into_response(),
        Err(e) => error_response(status_of(&e), kind_of(&e), e.to_string()),
    }
}

/// Engine and network calls block: off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> crate::Result<T> + Send + 'static,
) -> crate::Result<T> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) => Err(Error::Io(format!("replication call crashed: {e}"))),
    }
}

/// The routes, for `api::server::router_with`'s `pages`.
pub fn routes(m: Arc<Manager>) -> Router<ApiState> {
    let m_page = m.clone();
    let (m1, m2, m3, m4, m5, m6, m7) = (
        m.clone(),
        m.clone(),
        m.clone(),
        m.clone(),
        m.clone(),
        m.clone(),
        m,
    );
    Router::new()
        .route(
            "/v1/replication",
            get(move || {
                let m = m1.clone();
                async move { Json(m.list()).into_response() }
            })
            .post(move |body: Result<Json<AddJob>, axum::extract::rejection::JsonRejection>| {
                let m = m2.clone();
                async move {
                    let Json(add) = match body {
                        Ok(b) => b,
                        Err(e) => {
                            return error_response(StatusCode::BAD_REQUEST, "BadRequest", e.body_text())
                        }
                    };
                    match blocking(move || m.add(&add.job, add.config)).await {
                        Ok(s) => (StatusCode::CREATED, Json(s)).into_response(),
                        Err(e) => reply::<()>(Err(e)),
                    }
                }
            }),
        )
        .route(
            "/v1/replication/{job}",
            get(move |Path(job): Path<String>| {
                let m = m3.clone();
                async move { reply(m.status(&job)) }
            })
            .delete(move |Path(job): Path<String>| {
                let m = m4.clone();
                async move {
                    reply(
                        blocking(move || m.remove(&job))
                            .await
                            .map(|notes| serde_json::json!({ "notes": notes })),
                    )
                }
            }),
        )
        .route(
            "/v1/replication/{job}/run",
            post(
                move |Path(job): Path<String>,
                      body: Result<Json<RunRequest>, axum::extract::rejection::JsonRejection>| {
                    let m = m5.clone();
                    async move {
                        let Json(req) = match body {
                            Ok(b) => b,
                            Err(e) => {
                                return error_response(
                                    StatusCode::BAD_REQUEST,
                                    "BadRequest",
                                    e.body_text(),
                                )
                            }
                        };
                        if req.no_wait {
                            return match m.request_run(&job, req.force) {
                                Ok(()) => (
                                    StatusCode::ACCEPTED,
                                    Json(serde_json::json!({ "started": job })),
                                )
                                    .into_response(),
                                Err(e) => reply::<()>(Err(e)),
                            };
                        }
                        match blocking(move || m.execute(&job, "manual", req.force)).await {
                            Ok(rec) if rec.result == "failed" => {
                                let kind = rec.error_kind.clone().unwrap_or_default();
                                let status = if kind == "Diverged" {
                                    StatusCode::CONFLICT
                                } else {
                                    StatusCode::BAD_GATEWAY
                                };
                                error_response(status, &kind, rec.error.unwrap_or_default())
                            }
                            r => reply(r),
                        }
                    }
                },
            ),
        )
        .route(
            "/v1/replication/{job}/pause",
            post(move |Path(job): Path<String>| {
                let m = m6.clone();
                async move { reply(blocking(move || m.set_paused(&job, true)).await) }
            }),
        )
        .route(
            "/replication",
            get({
                let m = m_page;
                move |axum::extract::State(st): axum::extract::State<ApiState>| {
                    let m = m.clone();
                    async move { page(&m, &st) }
                }
            }),
        )
        .route(
            "/v1/replication/{job}/resume",
            post(move |Path(job): Path<String>| {
                let m = m7.clone();
                async move { reply(blocking(move || m.set_paused(&job, false)).await) }
            }),
        )
}

/// The dashboard's replication page: every job, its state, progress, last error.
fn page(m: &Manager, st: &ApiState) -> Response {
    use std::fmt::Write;
    let esc = ui::esc;
    let t = |v: Option<i64>| v.filter(|v| *v > 0).map_or("-".to_string(), ui::time);
    let mut o = String::from(
        "<section class=\"card\"><h2>Replication jobs</h2><table><tr><th>job</th><th>direction</th>\
         <th>source</th><th>target</th><th>schedule</th><th>state</th><th>last common</th>\
         <th>last success</th><th>sent</th><th>transfer</th><th>last error</th></tr>",
    );
    let jobs = m.list();
    for j in &jobs {
        let transfer = j.progress.as_ref().map_or("-".to_string(), |p| {
            format!(
                "{} of {} at {}/s, ETA {}",
                dataset::props::format_size(p.bytes),
                if p.total > 0 {
                    dataset::props::format_size(p.total)
                } else {
                    "?".into()
                },
                dataset::props::format_size(p.rate as u64),
                p.eta_secs.map_or("-".to_string(), |e| format!("{e}s"))
            )
        });
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&j.name),
            if j.direction == crate::Direction::Push { "push" } else { "pull" },
            esc(&j.source),
            esc(&j.target),
            esc(&j.schedule),
            esc(&j.state),
            esc(&j.last_common.clone().map_or("-".into(), |c| format!("@{c}"))),
            t(j.last_success),
            dataset::props::format_size(j.bytes_total),
            esc(&transfer),
            esc(j.last_error.as_deref().unwrap_or("-"))
        );
    }
    o.push_str("</table>");
    if jobs.is_empty() {
        o.push_str("<p>No jobs: <code>cistern replication add NAME --source POOL/DS --target https://HOST:PORT/POOL/DS</code></p>");
    }
    o.push_str("</section>");
    let pools: Vec<String> = st.engine.list_pools().into_iter().map(|p| p.name).collect();
    (
        [(axum::http::header::CONTENT_TYPE, "text/html; charset=utf-8")],
        ui::page("Replication", "/replication", &pools, &o),
    )
        .into_response()
}
