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
            "/v1/replication/{job}/resume",
            post(move |Path(job): Path<String>| {
                let m = m7.clone();
                async move { reply(blocking(move || m.set_paused(&job, false)).await) }
            }),
        )
}
