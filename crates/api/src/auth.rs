//! Who may call the API: one bearer token per daemon (decision 0032).
//!
//! The daemon creates a random token at its first start in
//! `STATE_DIR/api.token` (mode 0600) and keeps it across restarts. Every
//! request needs `Authorization: Bearer TOKEN`, or the browser session cookie
//! the web UI sets after its login page checked the token. A cookie alone
//! never authorises a state-changing request from another origin: such
//! requests must carry an `Origin` (or `Sec-Fetch-Site: same-origin`) naming
//! this server, so a page elsewhere cannot act with an admin's cookie.
//!
//! The CLI finds the token of a daemon it can read as the same user on the
//! same machine through a discovery file the daemon writes
//! (`runtime_dir()/api-HOST-PORT.token`, mode 0600); `--token` or
//! `CISTERN_TOKEN` name it for a remote daemon.

use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::io::Write;
use std::net::SocketAddr;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The token file in the daemon's state directory.
pub const TOKEN_FILE: &str = "api.token";
/// The web UI's session cookie.
pub const SESSION_COOKIE: &str = "cistern_session";
/// Bytes of randomness in a token (hex-encoded: twice as many characters).
const TOKEN_BYTES: usize = 32;

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is not a token (expected {chars} hex characters)")]
    Malformed { path: PathBuf, chars: usize },
    #[error("{path} is readable by others (mode {mode:o}); make it 0600")]
    Exposed { path: PathBuf, mode: u32 },
}

fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> AuthError + 'a {
    move |source| AuthError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// The daemon's API credential and the rules applied with it.
#[derive(Clone)]
pub struct Auth {
    token: Arc<str>,
    /// The session cookie's value: derived from the token, so a new token
    /// ends every browser session.
    session: Arc<str>,
    /// `[api] metrics_open`: `/metrics` answers without the token.
    pub metrics_open: bool,
    /// Path prefixes that answer without credentials (the UI's login page
    /// and its static assets).
    public: Arc<Vec<&'static str>>,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the token.
        f.debug_struct("Auth")
            .field("metrics_open", &self.metrics_open)
            .finish_non_exhaustive()
    }
}

impl Auth {
    pub fn new(token: &str) -> Self {
        let session = blake3::derive_key("cistern api session cookie v1", token.as_bytes());
        Self {
            token: token.into(),
            session: hex(&session).into(),
            metrics_open: false,
            public: Arc::new(Vec::new()),
        }
    }

    /// Reads `STATE_DIR/api.token`, creating it (0600) at the first start.
    pub fn load_or_create(state_dir: &Path) -> Result<Self, AuthError> {
        let path = state_dir.join(TOKEN_FILE);
        match std::fs::read_to_string(&path) {
            Ok(text) => {
                let mode = std::fs::metadata(&path)
                    .map_err(io("stat", &path))?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    return Err(AuthError::Exposed {
                        path,
                        mode: mode & 0o777,
                    });
                }
                let token = text.trim();
                if token.len() != 2 * TOKEN_BYTES || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(AuthError::Malformed {
                        path,
                        chars: 2 * TOKEN_BYTES,
                    });
                }
                Ok(Self::new(token))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let mut bytes = [0u8; TOKEN_BYTES];
                getrandom(&mut bytes).map_err(io("read randomness for", &path))?;
                let token = hex(&bytes);
                write_private(&path, &token)?;
                tracing::info!(path = %path.display(), "created the API token");
                Ok(Self::new(&token))
            }
            Err(e) => Err(io("read", &path)(e)),
        }
    }

    /// Lets requests under `prefix` through without credentials.
    pub fn with_public(mut self, prefix: &'static str) -> Self {
        Arc::make_mut(&mut self.public).push(prefix);
        self
    }

    pub fn with_metrics_open(mut self, open: bool) -> Self {
        self.metrics_open = open;
        self
    }

    /// Whether `presented` is the token (constant time).
    pub fn check_token(&self, presented: &str) -> bool {
        ct_eq(presented.as_bytes(), self.token.as_bytes())
    }

    /// The `Set-Cookie` value that logs a browser in, once it presented the
    /// token. HttpOnly, SameSite=Strict, for the whole site.
    pub fn session_cookie(&self, secure: bool) -> String {
        format!(
            "{SESSION_COOKIE}={}; Path=/; HttpOnly; SameSite=Strict{}",
            self.session,
            if secure { "; Secure" } else { "" }
        )
    }

    /// The `Set-Cookie` value that logs a browser out.
    pub fn logout_cookie() -> String {
        format!("{SESSION_COOKIE}=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
    }

    /// How a request proves itself, if it does.
    pub fn credential(&self, headers: &HeaderMap) -> Credential {
        if let Some(v) = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
        {
            let presented = v
                .strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "));
            return match presented {
                Some(t) if self.check_token(t.trim()) => Credential::Token,
                _ => Credential::Refused,
            };
        }
        let from_cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .any(|(k, v)| k == SESSION_COOKIE && ct_eq(v.as_bytes(), self.session.as_bytes()));
        if from_cookie {
            Credential::Session
        } else {
            Credential::None
        }
    }

    fn is_public(&self, path: &str) -> bool {
        path == SESSION_PATH
            || (self.metrics_open && path == "/metrics")
            || self.public.iter().any(|p| path.starts_with(p))
    }
}

/// `POST /v1/session` body: the browser login.
#[derive(Debug, serde::Deserialize)]
pub struct Login {
    pub token: String,
}

/// `POST /v1/session`: checks the token and sets the session cookie (204);
/// 401 for a wrong token. Public: it is where credentials come in.
pub async fn login(
    State(auth): State<Auth>,
    headers: HeaderMap,
    axum::Json(body): axum::Json<Login>,
) -> Response {
    if !same_origin(&headers) {
        return refuse(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "cross-site login refused",
        );
    }
    if !auth.check_token(body.token.trim()) {
        tracing::warn!("API login with a wrong token");
        return refuse(StatusCode::UNAUTHORIZED, "Unauthorized", "wrong token");
    }
    let secure = headers
        .get(header::ORIGIN)
        .and_then(|o| o.to_str().ok())
        .is_some_and(|o| o.starts_with("https://"));
    (
        StatusCode::NO_CONTENT,
        [(header::SET_COOKIE, auth.session_cookie(secure))],
    )
        .into_response()
}

/// `DELETE /v1/session`: forgets the browser's session cookie (204).
pub async fn logout() -> Response {
    (
        StatusCode::NO_CONTENT,
        [(header::SET_COOKIE, Auth::logout_cookie())],
    )
        .into_response()
}

/// The path of [`login`] and [`logout`], open without credentials.
pub const SESSION_PATH: &str = "/v1/session";

/// What a request presented.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Credential {
    /// The bearer token.
    Token,
    /// The browser session cookie (same-origin checks apply).
    Session,
    /// Nothing.
    None,
    /// A wrong token.
    Refused,
}

/// Whether a cookie-authenticated request comes from this site: browsers
/// send `Origin` on every cross-site POST/PUT/PATCH/DELETE (and
/// `Sec-Fetch-Site`); a request without either is not a browser's
/// cross-site request.
pub fn same_origin(headers: &HeaderMap) -> bool {
    let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
    if let Some(origin) = headers.get(header::ORIGIN) {
        let Some(origin) = origin.to_str().ok() else {
            return false;
        };
        let origin_host = origin
            .split_once("://")
            .map(|(_, rest)| rest)
            .unwrap_or(origin);
        return host.is_some_and(|h| h.eq_ignore_ascii_case(origin_host));
    }
    match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        Some(site) => site == "same-origin" || site == "none",
        None => true,
    }
}

fn unsafe_method(m: &Method) -> bool {
    !matches!(*m, Method::GET | Method::HEAD | Method::OPTIONS)
}

/// The middleware: 401 without a credential, 403 for a cross-site request
/// that only has the browser's cookie.
pub async fn require(State(auth): State<Auth>, req: Request, next: Next) -> Response {
    if auth.is_public(req.uri().path()) {
        return next.run(req).await;
    }
    match auth.credential(req.headers()) {
        Credential::Token => next.run(req).await,
        Credential::Session if !unsafe_method(req.method()) || same_origin(req.headers()) => {
            next.run(req).await
        }
        Credential::Session => refuse(
            StatusCode::FORBIDDEN,
            "Forbidden",
            "cross-site request refused: the session cookie only works from this site's own pages",
        ),
        Credential::Refused => refuse(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "the API token was refused",
        ),
        // A browser opening a dashboard page goes to the login page instead.
        Credential::None if is_page(req.method(), req.uri().path()) => {
            let next = req
                .uri()
                .path_and_query()
                .map_or("/", |p| p.as_str())
                .to_string();
            let to = format!("/login?next={}", crate::encode_query(&next));
            (
                StatusCode::SEE_OTHER,
                [(header::LOCATION, to.as_str())],
                "log in first",
            )
                .into_response()
        }
        Credential::None => refuse(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "this API needs `Authorization: Bearer TOKEN` (the token is in the daemon's state directory, api.token)",
        ),
    }
}

/// A GET of a web dashboard page (anything outside `/v1/` and `/metrics`).
fn is_page(method: &Method, path: &str) -> bool {
    *method == Method::GET && !path.starts_with("/v1/") && path != "/metrics"
}

fn refuse(status: StatusCode, kind: &str, msg: &str) -> Response {
    let body = crate::ErrorBody {
        error: msg.to_string(),
        kind: kind.to_string(),
    };
    let mut r = (status, axum::Json(body)).into_response();
    if status == StatusCode::UNAUTHORIZED {
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            header::HeaderValue::from_static("Bearer realm=\"cistern\""),
        );
    }
    r
}

// ------------------------------------------------------------ discovery

/// Where the daemon leaves its token for CLIs of the same user:
/// `$CISTERN_RUNTIME_DIR`, else `$XDG_RUNTIME_DIR/cistern`, else `$HOME/.cistern`.
pub fn runtime_dir() -> Option<PathBuf> {
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("CISTERN_RUNTIME_DIR")
        .or_else(|| env("XDG_RUNTIME_DIR").map(|d| d.join("cistern")))
        .or_else(|| env("HOME").map(|d| d.join(".cistern")))
}

fn discovery_name(host: &str, port: u16) -> String {
    let host: String = host
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("api-{host}-{port}.token")
}

/// Writes the discovery file for a daemon listening on `addr`. Loopback
/// listeners are registered under both `127.0.0.1` and `localhost`.
pub fn publish(addr: SocketAddr, auth: &Auth) -> Result<PathBuf, AuthError> {
    let dir = runtime_dir().ok_or_else(|| AuthError::Io {
        what: "find a runtime directory (HOME is unset) for",
        path: PathBuf::from("the token discovery file"),
        source: std::io::Error::from(std::io::ErrorKind::NotFound),
    })?;
    std::fs::create_dir_all(&dir).map_err(io("create", &dir))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .map_err(io("chmod", &dir))?;
    let mut hosts = vec![addr.ip().to_string()];
    if addr.ip().is_loopback() || addr.ip().is_unspecified() {
        hosts.extend(["127.0.0.1".to_string(), "localhost".to_string()]);
    }
    hosts.dedup();
    let mut first = None;
    for h in hosts {
        let path = dir.join(discovery_name(&h, addr.port()));
        write_private(&path, &auth.token)?;
        first.get_or_insert(path);
    }
    Ok(first.unwrap_or(dir))
}

/// The token a CLI should send to `base_url`: `CISTERN_TOKEN`, else the
/// discovery file of a daemon on that address, else none.
pub fn token_for(base_url: &str) -> Option<String> {
    if let Some(t) = std::env::var("CISTERN_TOKEN")
        .ok()
        .filter(|t| !t.is_empty())
    {
        return Some(t);
    }
    let authority = base_url
        .split_once("://")
        .map(|(_, r)| r)
        .unwrap_or(base_url)
        .split('/')
        .next()?;
    let (host, port) = authority.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port: u16 = port.parse().ok()?;
    let path = runtime_dir()?.join(discovery_name(host, port));
    let text = std::fs::read_to_string(path).ok()?;
    Some(text.trim().to_string()).filter(|t| !t.is_empty())
}

// ------------------------------------------------------------ helpers

/// Replaces `path` with `text`, readable by the owner only.
fn write_private(path: &Path, text: &str) -> Result<(), AuthError> {
    let tmp = path.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(io("create", &tmp))?;
    f.write_all(format!("{text}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io("write", &tmp))?;
    std::fs::rename(&tmp, path).map_err(io("rename into", path))
}

fn getrandom(buf: &mut [u8]) -> std::io::Result<()> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")?.read_exact(buf)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Equal, in time independent of where the first difference is.
fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn token_is_created_private_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let a = Auth::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(TOKEN_FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let b = Auth::load_or_create(dir.path()).unwrap();
        assert_eq!(a.token, b.token);
        assert_eq!(a.token.len(), 64);
    }

    #[test]
    fn exposed_or_malformed_token_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        Auth::load_or_create(dir.path()).unwrap();
        let path = dir.path().join(TOKEN_FILE);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            Auth::load_or_create(dir.path()),
            Err(AuthError::Exposed { .. })
        ));
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::fs::write(&path, "short\n").unwrap();
        assert!(matches!(
            Auth::load_or_create(dir.path()),
            Err(AuthError::Malformed { .. })
        ));
    }

    #[test]
    fn credentials() {
        let a = Auth::new("abc");
        assert_eq!(
            a.credential(&headers(&[("authorization", "Bearer abc")])),
            Credential::Token
        );
        assert_eq!(
            a.credential(&headers(&[("authorization", "Bearer abd")])),
            Credential::Refused
        );
        assert_eq!(a.credential(&headers(&[])), Credential::None);
        let cookie = a.session_cookie(false);
        let value = cookie.split(';').next().unwrap();
        assert_eq!(
            a.credential(&headers(&[("cookie", &format!("x=1; {value}"))])),
            Credential::Session
        );
        // The cookie is not the token itself.
        assert!(!value.contains("abc"));
        assert_eq!(
            a.credential(&headers(&[("cookie", "cistern_session=abc")])),
            Credential::None
        );
    }

    #[test]
    fn cross_site_is_told_apart() {
        let h = |o: &str| headers(&[("host", "127.0.0.1:10810"), ("origin", o)]);
        assert!(same_origin(&h("http://127.0.0.1:10810")));
        assert!(same_origin(&h("https://127.0.0.1:10810")));
        assert!(!same_origin(&h("http://evil.example")));
        assert!(!same_origin(&h("null")));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:10810"),
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(same_origin(&headers(&[("host", "127.0.0.1:10810")])));
    }

    #[test]
    fn discovery_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        // SAFETY: tests in this module are the only readers of this variable.
        unsafe { std::env::set_var("CISTERN_RUNTIME_DIR", dir.path()) };
        let a = Auth::new("feed");
        publish("127.0.0.1:4567".parse().unwrap(), &a).unwrap();
        assert_eq!(token_for("http://127.0.0.1:4567").as_deref(), Some("feed"));
        assert_eq!(token_for("localhost:4567/").as_deref(), Some("feed"));
        assert_eq!(token_for("http://127.0.0.1:4568"), None);
        let mode = std::fs::metadata(dir.path().join("api-127.0.0.1-4567.token"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
    }
}
