//! The axum router. Every engine call is blocking, so it runs in
//! `spawn_blocking`; handlers only translate HTTP <-> engine types.

use crate::{
    AddUser, AttachRequest, ClearRequest, CloneRequest, CreateVolume, DeviceRequest, ErrorBody,
    GrantRequest, Health, HoldRequest, ImportRequest, InheritRequest, LabelclearRequest,
    MountRequest, PolicyRunRequest, RenameRequest, ReplaceRequest, RollbackRequest, ScrubRequest,
    SetProperty, ShareRequest, SnapshotRequest, UnmountRequest,
};
use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use dataset::{DestroyOptions, Engine};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::Arc;

/// Renders extra Prometheus text (e.g. the NBD server's counters) appended to `/metrics`.
pub type MetricsSource = Arc<dyn Fn() -> String + Send + Sync>;

/// What the handlers share.
#[derive(Clone)]
pub struct ApiState {
    pub engine: Arc<Engine>,
    /// Further metric families, rendered on every scrape.
    pub extra_metrics: Vec<MetricsSource>,
    /// The S3 endpoint's access keys (`/v1/users`); None: not kept here.
    pub users: Option<Arc<s3::access::Users>>,
    /// SMB, NFS: `cistern share`/`unshare` (crate::shares).
    pub share_services: Vec<Arc<dyn crate::shares::ShareService>>,
    /// Run after requests that may change datasets or properties.
    pub change_hooks: Vec<crate::shares::ChangeHook>,
    /// The FUSE mounts (`/v1/mounts`); None: this daemon mounts nothing.
    pub mounts: Option<fuse::Mounts>,
    /// The last hour of I/O samples (`/v1/samples`), taken while [`serve`] runs.
    pub samples: Arc<crate::samples::Samples>,
    /// Who may call (crate::auth); None only in tests that run the router in-process.
    pub auth: Option<crate::auth::Auth>,
}

impl ApiState {
    pub fn new(engine: Arc<Engine>) -> Self {
        Self {
            engine,
            extra_metrics: Vec::new(),
            users: None,
            share_services: Vec::new(),
            change_hooks: Vec::new(),
            mounts: None,
            samples: crate::samples::Samples::new(),
            auth: None,
        }
    }

    /// Requires the token (or the UI's session cookie) on every request.
    pub fn with_auth(mut self, auth: crate::auth::Auth) -> Self {
        self.auth = Some(auth);
        self
    }

    pub fn with_mounts(mut self, mounts: fuse::Mounts) -> Self {
        self.mounts = Some(mounts);
        self
    }

    /// A sharing protocol: served by `/v1/shares` and refreshed after every change.
    pub fn with_share_service(mut self, svc: Arc<dyn crate::shares::ShareService>) -> Self {
        let s = svc.clone();
        self.change_hooks.push(Arc::new(move || {
            if let Err(e) = s.refresh() {
                tracing::warn!(protocol = s.protocol(), "cannot update shares: {e}");
            }
        }));
        self.share_services.push(svc);
        self
    }

    /// Anything else that follows datasets and properties (mounts...).
    pub fn with_change_hook(mut self, hook: crate::shares::ChangeHook) -> Self {
        self.change_hooks.push(hook);
        self
    }

    pub fn with_users(mut self, users: Arc<s3::access::Users>) -> Self {
        self.users = Some(users);
        self
    }

    pub fn with_metrics(mut self, source: MetricsSource) -> Self {
        self.extra_metrics.push(source);
        self
    }
}

/// The full API under `/v1`, plus `/metrics`.
pub fn router(state: ApiState) -> Router {
    router_with(state, Router::new())
}

/// The API plus `pages` (the web dashboard), behind the same middleware.
pub fn router_with(state: ApiState, pages: Router<ApiState>) -> Router {
    let auth = state.auth.clone();
    let routes = Router::new()
        .merge(pages)
        .route("/v1/health", get(health))
        .route("/v1/samples", get(samples))
        .route("/v1/pools", get(list_pools).post(create_pool))
        .route("/v1/pools/{pool}", get(pool_status).delete(destroy_pool))
        .route("/v1/pools/{pool}/iostat", get(pool_iostat))
        .route("/v1/pools/{pool}/export", post(export_pool))
        .route("/v1/pools/{pool}/scrub", post(scrub_pool))
        .route("/v1/pools/{pool}/offline", post(offline_device))
        .route("/v1/pools/{pool}/online", post(online_device))
        .route("/v1/pools/{pool}/clear", post(clear_errors))
        .route(
            "/v1/pools/{pool}/properties",
            get(pool_properties).patch(set_pool_property),
        )
        .route("/v1/pools/{pool}/replace", post(replace_device))
        .route("/v1/pools/{pool}/add", post(add_groups))
        .route("/v1/pools/{pool}/cache", post(add_cache_devices))
        .route("/v1/pools/{pool}/attach", post(attach_device))
        .route("/v1/pools/{pool}/detach", post(detach_device))
        .route("/v1/pools/{pool}/remove", post(remove_device))
        .route(
            "/v1/pools/{pool}/upgrade",
            get(pool_versions).post(upgrade_pool),
        )
        .route("/v1/pools/{pool}/history", get(pool_history))
        .route("/v1/events", get(list_events).delete(clear_events))
        .route("/v1/labelclear", post(labelclear))
        .route("/v1/import", get(importable).post(import_pool))
        .route("/v1/datasets", get(list_datasets).post(create_volume))
        .route(
            "/v1/dataset",
            get(get_dataset).patch(set_property).delete(destroy_dataset),
        )
        .route("/v1/snapshots", post(snapshot))
        .route("/v1/rollback", post(rollback))
        .route("/v1/clone", post(clone))
        .route("/v1/promote", post(promote))
        .route("/v1/rename", post(rename))
        .route("/v1/keys/load", post(load_key))
        .route("/v1/keys/unload", post(unload_key))
        .route("/v1/keys/change", post(change_key))
        .route("/v1/inherit", post(inherit))
        .route("/v1/holds", get(holds).post(hold).delete(release))
        .route("/v1/diff", get(diff))
        .route("/v1/policies", get(policies))
        .route("/v1/policy", get(policy_show))
        .route("/v1/policy/run", post(policy_run))
        .route("/v1/policy/history", get(policy_history))
        .route("/v1/users", get(list_users).post(add_user))
        .route("/v1/users/{user}", axum::routing::delete(remove_user))
        .route(
            "/v1/users/{user}/grants",
            post(grant_user).delete(revoke_user),
        )
        .route("/v1/shares", get(list_shares).post(share).delete(unshare))
        .route("/v1/mounts", get(list_mounts).post(mount))
        .route("/v1/unmount", post(unmount))
        .route("/metrics", get(metrics))
        .merge(crate::send::routes())
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::shares::notify,
        ))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            crate::history::record,
        ))
        .with_state(state);
    // Outermost: nothing runs for a request without credentials.
    match auth {
        Some(auth) => routes
            .merge(
                Router::new()
                    .route(
                        crate::auth::SESSION_PATH,
                        post(crate::auth::login).delete(crate::auth::logout),
                    )
                    .with_state(auth.clone()),
            )
            .layer(axum::middleware::from_fn_with_state(
                auth,
                crate::auth::require,
            )),
        None => routes,
    }
}

/// HTTP status for an engine error.
pub fn status_for(err: &dataset::Error) -> StatusCode {
    use dataset::Error as E;
    match err {
        E::NotFound(_) => StatusCode::NOT_FOUND,
        E::AlreadyExists(_) | E::Busy(_) | E::ReadOnly(_) => StatusCode::CONFLICT,
        E::InvalidArgument(_) | E::NeedsUpgrade(_) => StatusCode::BAD_REQUEST,
        E::KeyUnavailable(_) => StatusCode::FORBIDDEN,
        E::NoSpace(_) => StatusCode::INSUFFICIENT_STORAGE,
        E::Corrupt(_) | E::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The `kind` field for an engine error: the variant's name.
pub fn kind_for(err: &dataset::Error) -> &'static str {
    use dataset::Error as E;
    match err {
        E::NotFound(_) => "NotFound",
        E::AlreadyExists(_) => "AlreadyExists",
        E::InvalidArgument(_) => "InvalidArgument",
        E::Busy(_) => "Busy",
        E::NoSpace(_) => "NoSpace",
        E::ReadOnly(_) => "ReadOnly",
        E::Corrupt(_) => "Corrupt",
        E::Io(_) => "Io",
        E::NeedsUpgrade(_) => "NeedsUpgrade",
        E::KeyUnavailable(_) => "KeyUnavailable",
    }
}

/// An error response: status plus [`ErrorBody`].
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub body: ErrorBody,
}

impl ApiError {
    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self {
            status: StatusCode::BAD_REQUEST,
            body: ErrorBody {
                error: msg.into(),
                kind: "BadRequest".into(),
            },
        }
    }

    fn internal(msg: impl Into<String>) -> Self {
        Self {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            body: ErrorBody {
                error: msg.into(),
                kind: "Internal".into(),
            },
        }
    }
}

impl From<dataset::Error> for ApiError {
    fn from(err: dataset::Error) -> Self {
        Self {
            status: status_for(&err),
            body: ErrorBody {
                error: err.to_string(),
                kind: kind_for(&err).into(),
            },
        }
    }
}

impl From<s3::access::Error> for ApiError {
    fn from(err: s3::access::Error) -> Self {
        let kind = err.kind();
        let status = match kind {
            "NotFound" => StatusCode::NOT_FOUND,
            "AlreadyExists" => StatusCode::CONFLICT,
            "InvalidArgument" => StatusCode::BAD_REQUEST,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        };
        Self {
            status,
            body: ErrorBody {
                error: err.to_string(),
                kind: kind.into(),
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = %self.status, kind = %self.body.kind, "api error: {}", self.body.error);
        } else {
            tracing::debug!(status = %self.status, kind = %self.body.kind, "api error: {}", self.body.error);
        }
        (self.status, axum::Json(self.body)).into_response()
    }
}

type ApiResult<T> = Result<T, ApiError>;

/// JSON body extractor whose rejection is a 400 with an [`ErrorBody`].
pub struct Json<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        match axum::Json::<T>::from_request(req, state).await {
            Ok(axum::Json(v)) => Ok(Json(v)),
            Err(rej) => Err(ApiError::bad_request(json_rejection_message(&rej))),
        }
    }
}

fn json_rejection_message(rej: &JsonRejection) -> String {
    match rej {
        JsonRejection::MissingJsonContentType(_) => {
            "bad request body: expected Content-Type: application/json".to_string()
        }
        other => format!("bad request body: {}", other.body_text()),
    }
}

/// Query extractor whose rejection is a 400 with an [`ErrorBody`].
pub struct Q<T>(pub T);

impl<S: Send + Sync, T: DeserializeOwned> FromRequestParts<S> for Q<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        match Query::<T>::from_request_parts(parts, state).await {
            Ok(Query(v)) => Ok(Q(v)),
            Err(rej) => Err(ApiError::bad_request(query_rejection_message(&rej))),
        }
    }
}

fn query_rejection_message(rej: &QueryRejection) -> String {
    format!("bad query string: {}", rej.body_text())
}

/// Runs a blocking engine call on tokio's blocking pool.
async fn blocking<T, F>(state: &ApiState, f: F) -> ApiResult<T>
where
    T: Send + 'static,
    F: FnOnce(&Engine) -> dataset::Result<T> + Send + 'static,
{
    let engine = state.engine.clone();
    match tokio::task::spawn_blocking(move || f(&engine)).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(join) => {
            tracing::error!("engine call failed: {join}");
            Err(ApiError::internal(format!("engine call failed: {join}")))
        }
    }
}

fn json<T: Serialize>(v: T) -> Response {
    axum::Json(v).into_response()
}

fn created<T: Serialize>(v: T) -> Response {
    (StatusCode::CREATED, axum::Json(v)).into_response()
}

fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

async fn not_found() -> ApiError {
    ApiError {
        status: StatusCode::NOT_FOUND,
        body: ErrorBody {
            error: "no such route".into(),
            kind: "NotFound".into(),
        },
    }
}

async fn health() -> Response {
    json(Health {
        status: "ok".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    })
}

async fn list_pools(State(st): State<ApiState>) -> ApiResult<Response> {
    blocking(&st, |e| Ok(e.list_pools())).await.map(json)
}

async fn create_pool(
    State(st): State<ApiState>,
    Json(spec): Json<dataset::PoolSpec>,
) -> ApiResult<Response> {
    if spec.name.is_empty() {
        return Err(ApiError::bad_request("pool name is empty"));
    }
    if spec.groups.is_empty() {
        return Err(ApiError::bad_request("a pool needs at least one device"));
    }
    tracing::info!(pool = %spec.name, "creating pool");
    blocking(&st, move |e| e.create_pool(spec))
        .await
        .map(created)
}

async fn pool_iostat(State(st): State<ApiState>, Path(pool): Path<String>) -> ApiResult<Response> {
    blocking(&st, move |e| e.pool_iostat(&pool)).await.map(json)
}

async fn pool_status(State(st): State<ApiState>, Path(pool): Path<String>) -> ApiResult<Response> {
    blocking(&st, move |e| e.pool_status(&pool)).await.map(json)
}

/// `?force=true`: disconnect clients of the pool's datasets instead of refusing.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct ForceQuery {
    #[serde(default)]
    force: bool,
}

async fn destroy_pool(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Q(q): Q<ForceQuery>,
) -> ApiResult<Response> {
    tracing::info!(%pool, force = q.force, "destroying pool");
    let mounts = st.mounts.clone();
    blocking(&st, move |e| {
        if let Some(m) = mounts {
            m.unmount_all(Some(&pool), q.force)?;
        }
        e.destroy_pool_with(&pool, q.force)
    })
    .await
    .map(|()| no_content())
}

async fn export_pool(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Q(q): Q<ForceQuery>,
) -> ApiResult<Response> {
    tracing::info!(%pool, force = q.force, "exporting pool");
    // As zpool export: its filesystems are unmounted first (busy ones refuse).
    let mounts = st.mounts.clone();
    blocking(&st, move |e| {
        if let Some(m) = mounts {
            m.unmount_all(Some(&pool), q.force)?;
        }
        e.export_pool_with(&pool, q.force)
    })
    .await
    .map(|()| no_content())
}

async fn scrub_pool(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<ScrubRequest>,
) -> ApiResult<Response> {
    tracing::info!(%pool, action = ?req.action, "scrub");
    blocking(&st, move |e| e.scrub_pool(&pool, req.action))
        .await
        .map(json)
}

async fn offline_device(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<DeviceRequest>,
) -> ApiResult<Response> {
    tracing::info!(%pool, device = %req.device, "offline");
    blocking(&st, move |e| e.offline_device(&pool, &req.device))
        .await
        .map(json)
}

async fn online_device(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<DeviceRequest>,
) -> ApiResult<Response> {
    tracing::info!(%pool, device = %req.device, "online");
    blocking(&st, move |e| e.online_device(&pool, &req.device))
        .await
        .map(json)
}

async fn clear_errors(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<ClearRequest>,
) -> ApiResult<Response> {
    tracing::info!(%pool, device = ?req.device, "clear");
    blocking(&st, move |e| e.clear_errors(&pool, req.device.as_deref()))
        .await
        .map(json)
}

async fn pool_properties(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
) -> ApiResult<Response> {
    blocking(&st, move |e| e.pool_properties(&pool))
        .await
        .map(json)
}

async fn set_pool_property(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<SetProperty>,
) -> ApiResult<Response> {
    tracing::info!(%pool, property = %req.property, value = %req.value, "setting pool property");
    blocking(&st, move |e| {
        e.set_pool_property(&pool, &req.property, &req.value)
    })
    .await
    .map(json)
}

async fn replace_device(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<ReplaceRequest>,
) -> ApiResult<Response> {
    if req.old.is_empty() {
        return Err(ApiError::bad_request("name the device to replace"));
    }
    tracing::info!(%pool, old = %req.old, new = %req.new.display(), "replace");
    blocking(&st, move |e| {
        e.replace_device(&pool, &req.old, &req.new, req.force)
    })
    .await
    .map(json)
}

async fn add_groups(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(spec): Json<dataset::PoolAddSpec>,
) -> ApiResult<Response> {
    tracing::info!(%pool, groups = spec.groups.len(), "add");
    blocking(&st, move |e| e.add_groups(&pool, spec))
        .await
        .map(json)
}

async fn add_cache_devices(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(spec): Json<dataset::CacheAddSpec>,
) -> ApiResult<Response> {
    tracing::info!(%pool, devices = spec.devices.len(), "add cache");
    blocking(&st, move |e| e.add_cache_devices(&pool, spec))
        .await
        .map(json)
}

async fn attach_device(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<AttachRequest>,
) -> ApiResult<Response> {
    tracing::info!(%pool, device = %req.device, new = %req.new.display(), "attach");
    blocking(&st, move |e| {
        e.attach_device(&pool, &req.device, &req.new, req.force)
    })
    .await
    .map(json)
}

async fn detach_device(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<DeviceRequest>,
) -> ApiResult<Response> {
    tracing::info!(%pool, device = %req.device, "detach");
    blocking(&st, move |e| e.detach_device(&pool, &req.device))
        .await
        .map(json)
}

async fn remove_device(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
    Json(req): Json<DeviceRequest>,
) -> ApiResult<Response> {
    tracing::info!(%pool, device = %req.device, "remove");
    blocking(&st, move |e| e.remove_device(&pool, &req.device))
        .await
        .map(json)
}

async fn pool_versions(
    State(st): State<ApiState>,
    Path(pool): Path<String>,
) -> ApiResult<Response> {
    blocking(&st, move |e| e.upgrade_pool(&pool, false))
        .await
        .map(json)
}

async fn upgrade_pool(State(st): State<ApiState>, Path(pool): Path<String>) -> ApiResult<Response> {
    tracing::info!(%pool, "upgrade");
    blocking(&st, move |e| e.upgrade_pool(&pool, true))
        .await
        .map(json)
}

async fn pool_history(State(st): State<ApiState>, Path(pool): Path<String>) -> ApiResult<Response> {
    blocking(&st, move |e| e.pool_history(&pool))
        .await
        .map(json)
}

/// Longest a `GET /v1/events` waits for a new event.
const MAX_EVENT_WAIT_MS: u64 = 10_000;

async fn list_events(
    State(st): State<ApiState>,
    Q(q): Q<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let (mut after, mut wait_ms, mut pools) = (0u64, 0u64, Vec::new());
    for (k, v) in q {
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| ApiError::bad_request(format!("{k}={v}: not a number")))
        };
        match k.as_str() {
            "after" => after = num(&v)?,
            "wait_ms" => wait_ms = num(&v)?.min(MAX_EVENT_WAIT_MS),
            "pool" => pools.push(v),
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter '{other}'"
                )))
            }
        }
    }
    let engine = st.engine.clone();
    let known: Vec<String> = engine.list_pools().into_iter().map(|p| p.name).collect();
    for p in &pools {
        if !known.contains(p) && dataset::events::list(0, std::slice::from_ref(p)).is_empty() {
            return Err(dataset::Error::NotFound(format!("pool '{p}'")).into());
        }
    }
    blocking(&st, move |_| {
        Ok(dataset::events::wait_after(
            after,
            &pools,
            std::time::Duration::from_millis(wait_ms),
        ))
    })
    .await
    .map(json)
}

async fn clear_events(
    State(st): State<ApiState>,
    Q(q): Q<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let mut pools = Vec::new();
    for (k, v) in q {
        match k.as_str() {
            "pool" => pools.push(v),
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter '{other}'"
                )))
            }
        }
    }
    let _ = &st;
    let cleared = dataset::events::clear(&pools);
    Ok(json(serde_json::json!({ "cleared": cleared })))
}

async fn labelclear(
    State(st): State<ApiState>,
    Json(req): Json<LabelclearRequest>,
) -> ApiResult<Response> {
    tracing::info!(device = %req.device.display(), force = req.force, "labelclear");
    blocking(&st, move |e| e.labelclear(&req.device, req.force))
        .await
        .map(|()| no_content())
}

async fn importable(
    State(st): State<ApiState>,
    Q(q): Q<Vec<(String, String)>>,
) -> ApiResult<Response> {
    let mut dirs = Vec::new();
    for (k, v) in q {
        match k.as_str() {
            "dir" => dirs.push(PathBuf::from(v)),
            other => {
                return Err(ApiError::bad_request(format!(
                    "unknown query parameter '{other}'"
                )))
            }
        }
    }
    if dirs.is_empty() {
        return Err(ApiError::bad_request("give at least one ?dir= to search"));
    }
    blocking(&st, move |e| e.importable_pools(&dirs))
        .await
        .map(json)
}

async fn import_pool(
    State(st): State<ApiState>,
    Json(req): Json<ImportRequest>,
) -> ApiResult<Response> {
    // Without directories only a forced import (`pool takeover POOL` on a
    // warm standby, decision 0048) makes sense.
    if req.dirs.is_empty() && !req.force {
        return Err(ApiError::bad_request(
            "give at least one directory to search",
        ));
    }
    tracing::info!(pool = %req.pool, "importing pool");
    let mounts = st.mounts.clone();
    blocking(&st, move |e| {
        let status = e.import_pool_with(&req.pool, &req.dirs, req.force, req.missing_log)?;
        // As zpool import: filesystems with a mountpoint are mounted (failures logged).
        if let Some(m) = mounts {
            m.mount_all(Some(&status.summary.name));
        }
        Ok(status)
    })
    .await
    .map(json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RootQuery {
    root: Option<String>,
    /// `filesystem,volume,bucket,snapshot` (any of them): only these kinds.
    #[serde(rename = "type")]
    kinds: Option<String>,
    /// Paging (snapshots in creation order per dataset): the answer carries
    /// the count before paging in [`HEADER_TOTAL`].
    offset: Option<usize>,
    limit: Option<usize>,
    /// As `list -d N`.
    depth: Option<usize>,
}

/// `GET /v1/datasets` with `type`, `offset` or `limit`: the number of
/// datasets that matched before paging.
pub const HEADER_TOTAL: &str = "x-total-count";

/// Parses `?type=volume,snapshot` (as `cistern list -t`).
pub fn parse_kinds(s: &str) -> Result<Vec<dataset::DatasetKind>, String> {
    use dataset::DatasetKind as K;
    s.split(',')
        .filter(|t| !t.is_empty())
        .map(|t| match t {
            "filesystem" => Ok(K::Filesystem),
            "volume" => Ok(K::Volume),
            "snapshot" | "snap" => Ok(K::Snapshot),
            "bucket" => Ok(K::Bucket),
            other => Err(format!(
                "unknown type '{other}' (filesystem, volume, bucket, snapshot)"
            )),
        })
        .collect()
}

async fn list_datasets(State(st): State<ApiState>, Q(q): Q<RootQuery>) -> ApiResult<Response> {
    if q.kinds.is_none() && q.offset.is_none() && q.limit.is_none() && q.depth.is_none() {
        return blocking(&st, move |e| e.list_datasets(q.root.as_deref()))
            .await
            .map(json);
    }
    let kinds = parse_kinds(q.kinds.as_deref().unwrap_or("")).map_err(ApiError::bad_request)?;
    let (offset, limit) = (q.offset.unwrap_or(0), q.limit.unwrap_or(usize::MAX));
    let (total, page) = blocking(&st, move |e| {
        e.list_datasets_page(q.root.as_deref(), &kinds, q.depth, offset, limit)
    })
    .await?;
    let mut r = json(page);
    if let Ok(v) = header::HeaderValue::from_str(&total.to_string()) {
        r.headers_mut().insert(HEADER_TOTAL, v);
    }
    Ok(r)
}

/// `sharenfs` options are checked when set, so a typo is an error here and
/// not a share that silently does not exist (the NFS server parses them).
fn check_share_options(name: &str, props: &[(String, String)]) -> ApiResult<()> {
    for (prop, value) in props {
        if prop == "sharenfs" {
            if let Err(why) = nfs::ShareOptions::parse(value) {
                return Err(ApiError::bad_request(format!(
                    "cannot set property for '{name}': {why}"
                )));
            }
        }
    }
    Ok(())
}

async fn create_volume(
    State(st): State<ApiState>,
    Json(req): Json<CreateVolume>,
) -> ApiResult<Response> {
    check_share_options(&req.name, &req.properties)?;
    match req.kind {
        None | Some(dataset::DatasetKind::Volume) => {
            tracing::info!(name = %req.name, volsize = req.volsize, "creating volume");
            blocking(&st, move |e| {
                e.create_volume_keyed(&req.name, req.volsize, &req.properties, req.key.as_ref())
            })
            .await
            .map(created)
        }
        Some(kind) => {
            if req.volsize != 0 {
                return Err(ApiError::bad_request(format!(
                    "volsize is only for volumes, not a {kind:?}"
                )));
            }
            tracing::info!(name = %req.name, ?kind, "creating dataset");
            let mounts = st.mounts.clone();
            blocking(&st, move |e| {
                let info =
                    e.create_dataset_keyed(&req.name, kind, &req.properties, req.key.as_ref())?;
                // As zfs create: a filesystem with a mountpoint is mounted.
                if let (Some(m), dataset::DatasetKind::Filesystem) = (mounts, kind) {
                    m.mountpoint_changed(&req.name)?;
                }
                Ok(info)
            })
            .await
            .map(created)
        }
    }
}

/// The S3 users table, or 503 when this daemon keeps none.
fn users_of(st: &ApiState) -> ApiResult<Arc<s3::access::Users>> {
    st.users.clone().ok_or_else(|| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: ErrorBody {
            error: "this daemon keeps no S3 users".into(),
            kind: "Unavailable".into(),
        },
    })
}

/// Runs a users-table call (it fsyncs) on the blocking pool.
async fn users_call<T, F>(st: &ApiState, f: F) -> ApiResult<T>
where
    T: Send + 'static,
    F: FnOnce(&s3::access::Users) -> Result<T, s3::access::Error> + Send + 'static,
{
    let users = users_of(st)?;
    match tokio::task::spawn_blocking(move || f(&users)).await {
        Ok(r) => r.map_err(ApiError::from),
        Err(join) => Err(ApiError::internal(format!("users call failed: {join}"))),
    }
}

async fn list_users(State(st): State<ApiState>) -> ApiResult<Response> {
    Ok(json(users_of(&st)?.list()))
}

async fn add_user(State(st): State<ApiState>, Json(req): Json<AddUser>) -> ApiResult<Response> {
    tracing::info!(user = %req.name, grants = req.grants.len(), "adding S3 user");
    users_call(&st, move |u| u.add(&req.name, &req.grants))
        .await
        .map(created)
}

async fn remove_user(State(st): State<ApiState>, Path(user): Path<String>) -> ApiResult<Response> {
    tracing::info!(%user, "removing S3 user");
    users_call(&st, move |u| u.remove(&user))
        .await
        .map(|()| no_content())
}

async fn grant_user(
    State(st): State<ApiState>,
    Path(user): Path<String>,
    Json(req): Json<GrantRequest>,
) -> ApiResult<Response> {
    tracing::info!(%user, bucket = %req.bucket, access = %req.access, "S3 grant");
    users_call(&st, move |u| u.grant(&user, &req.bucket, req.access))
        .await
        .map(json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BucketQuery {
    bucket: String,
}

async fn revoke_user(
    State(st): State<ApiState>,
    Path(user): Path<String>,
    Q(q): Q<BucketQuery>,
) -> ApiResult<Response> {
    tracing::info!(%user, bucket = %q.bucket, "S3 revoke");
    users_call(&st, move |u| u.revoke(&user, &q.bucket))
        .await
        .map(json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameQuery {
    name: String,
}

async fn get_dataset(State(st): State<ApiState>, Q(q): Q<NameQuery>) -> ApiResult<Response> {
    blocking(&st, move |e| e.dataset(&q.name)).await.map(json)
}

async fn set_property(
    State(st): State<ApiState>,
    Q(q): Q<NameQuery>,
    Json(req): Json<SetProperty>,
) -> ApiResult<Response> {
    tracing::info!(name = %q.name, property = %req.property, value = %req.value, "setting property");
    check_share_options(&q.name, &[(req.property.clone(), req.value.clone())])?;
    let mounts = st.mounts.clone();
    blocking(&st, move |e| {
        e.set_property(&q.name, &req.property, &req.value)?;
        // As zfs set mountpoint: remounted at the new place.
        if let (Some(m), "mountpoint") = (mounts, req.property.as_str()) {
            m.mountpoint_changed(&q.name)?;
        }
        e.dataset(&q.name)
    })
    .await
    .map(json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DestroyQuery {
    name: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default)]
    dry_run: bool,
    #[serde(default)]
    force: bool,
    dependents: bool,
}

async fn destroy_dataset(State(st): State<ApiState>, Q(q): Q<DestroyQuery>) -> ApiResult<Response> {
    tracing::info!(name = %q.name, recursive = q.recursive, dry_run = q.dry_run, force = q.force, "destroying");
    let opts = DestroyOptions {
        recursive: q.recursive,
        dry_run: q.dry_run,
        force: q.force,
        dependents: q.dependents,
    };
    blocking(&st, move |e| e.destroy(&q.name, &opts))
        .await
        .map(json)
}

async fn snapshot(
    State(st): State<ApiState>,
    Json(req): Json<SnapshotRequest>,
) -> ApiResult<Response> {
    tracing::info!(names = ?req.names, recursive = req.recursive, "snapshot");
    blocking(&st, move |e| e.snapshot(&req.names, req.recursive))
        .await
        .map(created)
}

async fn rollback(
    State(st): State<ApiState>,
    Json(req): Json<RollbackRequest>,
) -> ApiResult<Response> {
    if req.dry_run {
        return blocking(&st, move |e| e.rollback_preview(&req.snapshot))
            .await
            .map(json);
    }
    tracing::info!(snapshot = %req.snapshot, recursive = req.recursive, force = req.force, "rollback");
    blocking(&st, move |e| {
        e.rollback_with(&req.snapshot, req.recursive, req.force)
    })
    .await
    .map(json)
}

async fn clone(State(st): State<ApiState>, Json(req): Json<CloneRequest>) -> ApiResult<Response> {
    tracing::info!(origin = %req.snapshot, name = %req.name, "clone");
    blocking(&st, move |e| {
        e.clone_snapshot(&req.snapshot, &req.name, &req.properties)
    })
    .await
    .map(created)
}

async fn promote(State(st): State<ApiState>, Q(q): Q<NameQuery>) -> ApiResult<Response> {
    tracing::info!(name = %q.name, "promote");
    blocking(&st, move |e| e.promote(&q.name))
        .await
        .map(|()| no_content())
}

async fn rename(State(st): State<ApiState>, Json(req): Json<RenameRequest>) -> ApiResult<Response> {
    tracing::info!(from = %req.from, to = %req.to, recursive = req.recursive, "rename");
    blocking(&st, move |e| e.rename(&req.from, &req.to, req.recursive))
        .await
        .map(json)
}

/// The datasets a key command acts on: the one named, or with `-a` every
/// encryption root.
fn key_targets(
    e: &Engine,
    name: Option<&String>,
    all: bool,
    what: &str,
) -> Result<Vec<String>, dataset::Error> {
    match (name, all) {
        (Some(n), false) => Ok(vec![n.clone()]),
        (None, true) => Ok(e.encryption_roots()),
        _ => Err(dataset::Error::InvalidArgument(format!(
            "{what}: give one dataset or -a"
        ))),
    }
}

/// `load-key`: loads the key(s); filesystems under them are mounted (as `zfs mount -l`).
async fn load_key(
    State(st): State<ApiState>,
    Json(req): Json<crate::LoadKeyRequest>,
) -> ApiResult<Response> {
    tracing::info!(name = ?req.name, all = req.all, noop = req.noop, "load-key");
    let mounts = st.mounts.clone();
    blocking(&st, move |e| {
        let names = key_targets(e, req.name.as_ref(), req.all, "load-key")?;
        let mut out = crate::KeyResult::default();
        for n in names {
            let r = e.load_key(&n, req.location.as_deref(), req.key.as_ref(), req.noop);
            match r {
                Ok(()) => out.done.push(n),
                Err(dataset::Error::AlreadyExists(_)) if req.all => {}
                Err(err) if req.all => out.failed.push((n, err.to_string())),
                Err(err) => return Err(err),
            }
        }
        if !req.noop {
            if let Some(m) = &mounts {
                for n in &out.done {
                    for d in e.list_datasets(Some(n))? {
                        if d.kind == dataset::DatasetKind::Filesystem {
                            m.mountpoint_changed(&d.name)?;
                        }
                    }
                }
            }
        }
        Ok(out)
    })
    .await
    .map(json)
}

/// `unload-key`: refused while a dataset under the root is served (busy, as zfs).
async fn unload_key(
    State(st): State<ApiState>,
    Json(req): Json<crate::UnloadKeyRequest>,
) -> ApiResult<Response> {
    tracing::info!(name = ?req.name, all = req.all, "unload-key");
    blocking(&st, move |e| {
        let names = key_targets(e, req.name.as_ref(), req.all, "unload-key")?;
        let mut out = crate::KeyResult::default();
        for n in names {
            match e.unload_key(&n) {
                Ok(()) => out.done.push(n),
                Err(err) if req.all => out.failed.push((n, err.to_string())),
                Err(err) => return Err(err),
            }
        }
        Ok(out)
    })
    .await
    .map(json)
}

async fn change_key(
    State(st): State<ApiState>,
    Json(req): Json<crate::ChangeKeyRequest>,
) -> ApiResult<Response> {
    tracing::info!(name = %req.name, "change-key");
    blocking(&st, move |e| {
        if req.inherit {
            if !req.properties.is_empty() || req.key.is_some() {
                return Err(dataset::Error::InvalidArgument(
                    "change-key -i takes no properties and no key".into(),
                ));
            }
            e.change_key_inherit(&req.name)?;
        } else {
            e.change_key(&req.name, &req.properties, req.key.as_ref())?;
        }
        Ok(crate::KeyResult {
            done: vec![req.name.clone()],
            failed: Vec::new(),
        })
    })
    .await
    .map(json)
}

async fn inherit(
    State(st): State<ApiState>,
    Json(req): Json<InheritRequest>,
) -> ApiResult<Response> {
    tracing::info!(name = %req.name, property = %req.property, recursive = req.recursive, "inherit");
    let mounts = st.mounts.clone();
    blocking(&st, move |e| {
        e.inherit_property(&req.name, &req.property, req.recursive)?;
        if let (Some(m), "mountpoint") = (mounts, req.property.as_str()) {
            m.mountpoint_changed(&req.name)?;
        }
        Ok(())
    })
    .await
    .map(|()| no_content())
}

async fn list_shares(State(st): State<ApiState>) -> ApiResult<Response> {
    let s = st.clone();
    blocking(&st, move |_| Ok(crate::shares::list(&s)))
        .await
        .map(json)
}

async fn share(State(st): State<ApiState>, Json(req): Json<ShareRequest>) -> ApiResult<Response> {
    tracing::info!(dataset = ?req.dataset, protocol = ?req.protocol, "share");
    let s = st.clone();
    blocking(&st, move |_| crate::shares::share(&s, &req))
        .await
        .map(json)
}

async fn unshare(State(st): State<ApiState>, Json(req): Json<ShareRequest>) -> ApiResult<Response> {
    tracing::info!(dataset = ?req.dataset, protocol = ?req.protocol, "unshare");
    let s = st.clone();
    blocking(&st, move |_| crate::shares::unshare(&s, &req))
        .await
        .map(json)
}

async fn hold(State(st): State<ApiState>, Json(req): Json<HoldRequest>) -> ApiResult<Response> {
    blocking(&st, move |e| {
        e.set_hold(&req.tag, &req.snapshots, req.recursive, true)
    })
    .await
    .map(|()| no_content())
}

async fn release(State(st): State<ApiState>, Json(req): Json<HoldRequest>) -> ApiResult<Response> {
    blocking(&st, move |e| {
        e.set_hold(&req.tag, &req.snapshots, req.recursive, false)
    })
    .await
    .map(|()| no_content())
}

async fn holds(State(st): State<ApiState>, Q(q): Q<NameQuery>) -> ApiResult<Response> {
    let names: Vec<String> = q.name.split(',').map(str::to_string).collect();
    blocking(&st, move |e| e.holds(&names)).await.map(json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DiffQuery {
    from: String,
    to: Option<String>,
}

async fn diff(State(st): State<ApiState>, Q(q): Q<DiffQuery>) -> ApiResult<Response> {
    blocking(&st, move |e| e.diff(&q.from, q.to.as_deref()))
        .await
        .map(json)
}

async fn policies(State(st): State<ApiState>) -> ApiResult<Response> {
    blocking(&st, |e| Ok(e.policies())).await.map(json)
}

async fn policy_show(State(st): State<ApiState>, Q(q): Q<NameQuery>) -> ApiResult<Response> {
    blocking(&st, move |e| e.policy_show(&q.name))
        .await
        .map(json)
}

async fn policy_run(
    State(st): State<ApiState>,
    Json(req): Json<PolicyRunRequest>,
) -> ApiResult<Response> {
    blocking(&st, move |e| e.policy_run(&req.dataset, req.dry_run))
        .await
        .map(json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HistoryQuery {
    name: Option<String>,
}

async fn policy_history(State(st): State<ApiState>, Q(q): Q<HistoryQuery>) -> ApiResult<Response> {
    blocking(&st, move |e| Ok(e.policy_history(q.name.as_deref())))
        .await
        .map(json)
}

/// The mount table, or 503 when this daemon mounts nothing.
fn mounts_of(st: &ApiState) -> ApiResult<fuse::Mounts> {
    st.mounts.clone().ok_or_else(|| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        body: ErrorBody {
            error: "this daemon does not mount filesystems".into(),
            kind: "Unavailable".into(),
        },
    })
}

async fn list_mounts(State(st): State<ApiState>) -> ApiResult<Response> {
    Ok(json(mounts_of(&st)?.list()))
}

async fn mount(State(st): State<ApiState>, Json(req): Json<MountRequest>) -> ApiResult<Response> {
    let m = mounts_of(&st)?;
    tracing::info!(dataset = ?req.dataset, dir = ?req.dir, all = req.all, "mount");
    blocking(&st, move |_| match (req.all, req.dataset) {
        (true, None) => {
            let (done, failed) = m.mount_all(None);
            if failed.is_empty() {
                Ok(done)
            } else {
                Err(dataset::Error::Io(format!(
                    "mounted {} filesystem(s); not mounted: {}",
                    done.len(),
                    failed.join("; ")
                )))
            }
        }
        (false, Some(ds)) => Ok(vec![m.mount(&ds, req.dir.as_deref())?]),
        _ => Err(dataset::Error::InvalidArgument(
            "give a dataset, or all".into(),
        )),
    })
    .await
    .map(created)
}

async fn unmount(
    State(st): State<ApiState>,
    Json(req): Json<UnmountRequest>,
) -> ApiResult<Response> {
    let m = mounts_of(&st)?;
    tracing::info!(target = ?req.target, force = req.force, all = req.all, "unmount");
    blocking(&st, move |_| match (req.all, req.target) {
        (true, None) => m.unmount_all(None, req.force),
        (false, Some(t)) => Ok(vec![m.unmount(&t, req.force)?]),
        _ => Err(dataset::Error::InvalidArgument(
            "give a dataset or directory, or all".into(),
        )),
    })
    .await
    .map(json)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PoolQuery {
    pool: Option<String>,
}

async fn samples(State(st): State<ApiState>, Q(q): Q<PoolQuery>) -> ApiResult<Response> {
    Ok(json(st.samples.history(q.pool.as_deref())))
}

async fn metrics(State(st): State<ApiState>) -> ApiResult<Response> {
    let (stats, health, policy) = blocking(&st, |e| {
        let statuses: Vec<_> = e
            .list_pools()
            .iter()
            .filter_map(|p| e.pool_status(&p.name).ok())
            .collect();
        let iostat: Vec<_> = e
            .list_pools()
            .iter()
            .filter_map(|p| e.pool_iostat(&p.name).ok())
            .collect();
        Ok((e.stats(), (statuses, iostat), e.policy_counters()))
    })
    .await?;
    let (health, iostat) = health;
    let mut text = crate::metrics::render_pool_stats(&stats);
    text.push_str(&crate::metrics::render_iostat(&iostat));
    text.push_str(&crate::metrics::render_pool_health(&health));
    text.push_str(&crate::metrics::render_policy(&policy));
    for source in &st.extra_metrics {
        text.push_str(&source());
    }
    Ok(([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], text).into_response())
}

/// Serves `router(state)` on `listener` until `shutdown` resolves, then
/// finishes in-flight requests.
pub async fn serve<F>(
    listener: tokio::net::TcpListener,
    state: ApiState,
    shutdown: F,
) -> std::io::Result<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    serve_with(listener, None, state, Router::new(), shutdown).await
}

/// [`serve`] with `pages` (the web dashboard) next to the API, over TLS
/// when `tls` is given (`[api] tls_cert`/`tls_key`); samples I/O for
/// `/v1/samples` while it runs.
pub async fn serve_with<F>(
    listener: tokio::net::TcpListener,
    tls: Option<std::sync::Arc<tls::rustls::ServerConfig>>,
    state: ApiState,
    pages: Router<ApiState>,
    shutdown: F,
) -> std::io::Result<()>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let sampler = crate::samples::spawn(state.engine.clone(), state.samples.clone());
    let app = router_with(state, pages);
    let r = match tls {
        None => {
            axum::serve(listener, app)
                .with_graceful_shutdown(shutdown)
                .await
        }
        Some(tls) => {
            let incoming = tls::Incoming::new(
                listener,
                tls::TlsAcceptor::from(tls),
                64,
                std::time::Duration::from_secs(10),
                "API",
            )?;
            axum::serve(TlsListener(incoming), app)
                .with_graceful_shutdown(shutdown)
                .await
        }
    };
    sampler.abort();
    r
}

struct TlsListener(tls::Incoming);

impl axum::serve::Listener for TlsListener {
    type Io = tls::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.0.accept().await {
            Some(c) => c,
            // The accept task ended (it only does when dropped).
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.0.local_addr())
    }
}
