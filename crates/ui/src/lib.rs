//! Cistern's web dashboard: pages rendered on the server from the same
//! engine calls the `/v1` handlers make, and a small script that performs
//! every action as a `/v1` JSON request (the requests the CLI makes), so
//! nothing is UI-only. Assets are compiled into the binary. See
//! `crates/ui/README.md` and decision 0028.

mod html;
mod pages;

use api::ApiState;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub use html::esc;
/// For pages other crates add (crates/replication): the page frame and times.
pub use html::{page, time};

/// Paths that answer without the token or a session: the login page and
/// the stylesheet, script and logo it uses (nothing about the pools).
pub const PUBLIC: &[&str] = &["/login", "/ui/"];

const CSS: &str = include_str!("../assets/ui.css");
const JS: &str = include_str!("../assets/ui.js");
const LOGO: &str = include_str!("../assets/logo.svg");

/// The dashboard's routes (pages under `/`, assets under `/ui/`), to be
/// merged with the API by `api::server::serve_with`.
pub fn router() -> Router<ApiState> {
    Router::new()
        .route("/", get(pages::overview))
        .route("/pools/{pool}", get(pages::pool))
        .route("/datasets", get(pages::datasets))
        .route("/dataset", get(pages::dataset))
        .route("/snapshots", get(pages::snapshots))
        .route("/diff", get(pages::diff))
        .route("/policies", get(pages::policies))
        .route("/users", get(pages::users))
        .route("/shares", get(pages::shares))
        .route("/bench", get(pages::bench))
        .route("/bench/chart/{file}", get(pages::bench_file))
        .route("/login", get(pages::login))
        .route("/ui/ui.css", get(|| asset("text/css; charset=utf-8", CSS)))
        .route(
            "/ui/ui.js",
            get(|| asset("text/javascript; charset=utf-8", JS)),
        )
        .route("/ui/logo.svg", get(|| asset("image/svg+xml", LOGO)))
}

async fn asset(kind: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, kind),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// Security headers every page carries: no framing, no inline script,
/// nothing loaded from anywhere but the daemon.
pub(crate) fn html_response(status: StatusCode, body: String) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; \
                 script-src 'self'; frame-ancestors 'none'; form-action 'self'",
            ),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::REFERRER_POLICY, "same-origin"),
        ],
        body,
    )
        .into_response()
}
