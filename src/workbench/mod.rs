//! The analyst's workbench in the browser (docs/workbench.md): an HTTP listener of its own
//! (`[ui] listen`) serving the page's embedded assets ([`assets`]) and a JSON API under `/api/v1/`:
//! tables ([`tables`]) and their risk before anonymization ([`risk`]), sweeps of the frontier
//! ([`sweeps`]) and their releases ([`releases`]). An
//! HTTP adapter like the gRPC services: the table work runs through the same
//! [`crate::jobs::TableJobs`] (places, budget, metrics) and the same sweep
//! ([`crate::jobs::sweep`]) as `cloakd table frontier`.
//!
//! Invariants: every request passes [`guard`] first (its `Host` names this listener, a
//! state-changing request's `Origin` is the page's, an API body is `application/json`); the
//! listener holds at most `ui.max_connections` connections within its timeouts ([`listener`]);
//! every response carries the security headers ([`SECURITY_HEADERS`]: a CSP without
//! inline scripts, nosniff, no referrer, no framing) and every `/api/` response `Cache-Control:
//! no-store`; with `auth.required` every `/api/` route needs `Authorization: Bearer` of an analyst
//! or operator principal (no cookies: CSRF-safe), 401 without or with an unknown token, 403 for
//! other roles; a principal sees only its own tables and sweeps; at most `ui.max_tables` tables and
//! `ui.max_sweeps` sweeps are kept per principal (its own oldest goes first, never another
//! principal's); request bodies are bounded by
//! `tables.max_bytes` before they are buffered; errors are [`error::ApiError`], mapped to a response
//! in one place.
pub mod assets;
pub mod distribution;
pub mod error;
pub mod guard;
pub mod hierarchies;
pub mod listener;
pub mod releases;
pub mod risk;
pub mod sweeps;
pub mod tables;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use anyhow::Context;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use http::{HeaderValue, StatusCode, header};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::auth::{ANALYSTS, Authenticator, Principal};
use crate::config::{TablesConfig, UiConfig};
use crate::jobs::TableJobs;
use error::{ApiError, Code};

/// The headers of every response.
pub const SECURITY_HEADERS: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
];

/// Items kept per kind, each belonging to one principal; at most `max` per principal, its own oldest
/// evicted first.
#[derive(Debug)]
pub struct Kept<T> {
    max: usize,
    order: VecDeque<String>,
    items: HashMap<String, (String, Arc<T>)>,
}

impl<T> Kept<T> {
    fn new(max: usize) -> Kept<T> {
        Kept {
            max,
            order: VecDeque::new(),
            items: HashMap::new(),
        }
    }

    /// Keeps `item` for `owner` under a new random id, evicting `owner`'s oldest item that
    /// `evictable` allows while `owner` has more than `max`; another principal's items are never
    /// evicted.
    pub fn insert(&mut self, owner: &str, item: Arc<T>, evictable: impl Fn(&T) -> bool) -> String {
        let id = random_id();
        self.items.insert(id.clone(), (owner.to_string(), item));
        self.order.push_back(id.clone());
        while self.owned_by(owner) > self.max {
            let Some(at) = self.order.iter().position(|id| {
                self.items
                    .get(id)
                    .is_some_and(|(o, t)| o == owner && evictable(t))
            }) else {
                break;
            };
            if let Some(old) = self.order.remove(at) {
                self.items.remove(&old);
            }
        }
        id
    }

    /// How many items `owner` has.
    fn owned_by(&self, owner: &str) -> usize {
        self.items.values().filter(|(o, _)| o == owner).count()
    }

    /// The item `id` if `owner` owns it.
    pub fn get(&self, owner: &str, id: &str) -> Option<Arc<T>> {
        self.items
            .get(id)
            .filter(|(o, _)| o == owner)
            .map(|(_, t)| Arc::clone(t))
    }

    /// Keeps `item` as the new version of `owner`'s item `id` (its place in the eviction order
    /// unchanged); false when there is no such item (evicted meanwhile).
    pub fn replace(&mut self, owner: &str, id: &str, item: Arc<T>) -> bool {
        match self.items.get_mut(id) {
            Some((o, t)) if o == owner => {
                *t = item;
                true
            }
            _ => false,
        }
    }
}

/// 128 random bits, hex.
fn random_id() -> String {
    use rand::Rng;
    hex::encode(rand::rng().random::<[u8; 16]>())
}

/// The workbench's state: authentication, the table-job places and the kept tables and sweeps.
pub struct Workbench {
    ui: UiConfig,
    allowed: Arc<guard::Allowed>,
    auth: Arc<Authenticator>,
    jobs: TableJobs,
    limits: TablesConfig,
    tables: Mutex<Kept<tables::StoredTable>>,
    sweeps: Mutex<Kept<sweeps::Sweep>>,
}

impl Workbench {
    /// The workbench of the listener bound to `addr` (its `Host` names, [`guard`]).
    pub fn new(
        addr: SocketAddr,
        ui: &UiConfig,
        limits: &TablesConfig,
        auth: Arc<Authenticator>,
        jobs: TableJobs,
    ) -> Arc<Workbench> {
        Arc::new(Workbench {
            ui: ui.clone(),
            allowed: Arc::new(guard::Allowed::new(addr)),
            auth,
            jobs,
            limits: limits.clone(),
            tables: Mutex::new(Kept::new(ui.max_tables)),
            sweeps: Mutex::new(Kept::new(ui.max_sweeps)),
        })
    }
}

/// A JSON response with `Cache-Control: no-store`.
pub fn json_response(status: StatusCode, body: &serde_json::Value) -> Response {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    (
        status,
        [
            (header::CONTENT_TYPE, "application/json"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        bytes,
    )
        .into_response()
}

/// The principal of an API call, as [`authorize`] resolved it.
#[derive(Debug, Clone)]
pub struct Caller(pub Arc<Principal>);

/// Authenticates an `/api/` call and checks its role (analyst or operator), as the gRPC auth layer
/// does for TableAnonymizer; puts the principal into the request.
async fn authorize(
    State(workbench): State<Arc<Workbench>>,
    mut request: Request,
    next: Next,
) -> Response {
    let peer = request
        .extensions()
        .get::<axum::extract::ConnectInfo<SocketAddr>>()
        .map(|c| c.0);
    let principal = match workbench.auth.authenticate(request.headers(), None, peer) {
        Ok(p) => p,
        Err(failure) => {
            let status = failure.to_status();
            return ApiError::new(
                Code::Unauthenticated,
                Some("authorization"),
                status
                    .message()
                    .replace("metadata `authorization", "header `Authorization"),
            )
            .into_response();
        }
    };
    if !principal.has_role(ANALYSTS) {
        let denial = crate::auth::role_denial(&principal, "the workbench API", ANALYSTS);
        denial.record();
        return ApiError::new(Code::PermissionDenied, Some("role"), denial.to_string())
            .into_response();
    }
    request.extensions_mut().insert(Caller(principal));
    next.run(request).await
}

/// Adds the security headers (and `no-store` under `/api/`) and counts the request.
async fn headers(request: Request, next: Next) -> Response {
    let api = request.uri().path().starts_with("/api/");
    let route = route_label(request.uri().path());
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    for (name, value) in SECURITY_HEADERS {
        h.insert(name, HeaderValue::from_static(value));
    }
    if api {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    crate::telemetry::record_ui_request(route, response.status().as_u16());
    response
}

/// The routes, as metric labels (static strings, never a path with ids).
const ROUTES: &[&str] = &[
    "/",
    "/app.js",
    "/app.css",
    "/LICENSES.txt",
    "/api/v1/session",
    "/api/v1/examples",
    "/api/v1/tables",
    "/api/v1/tables/{id}/columns/{name}/values",
    "/api/v1/tables/{id}/hierarchies",
    "/api/v1/tables/{id}/risk",
    "/api/v1/sweeps",
    "/api/v1/sweeps/{id}",
    "/api/v1/sweeps/{id}/releases/{n}",
    "/api/v1/sweeps/{id}/releases/{n}/release.csv",
    "/api/v1/sweeps/{id}/releases/{n}/sensitive.csv",
    "/api/v1/sweeps/{id}/releases/{n}/report.json",
    "/api/v1/sweeps/{id}/releases/{n}/job.toml",
    "/api/v1/sweeps/{id}/releases/{n}/classes/{c}",
    "/api/v1/sweeps/{id}/releases/{n}/distribution/{column}",
];

/// The route pattern a path matches (`{...}` matches one segment), or `other`.
fn route_label(path: &str) -> &'static str {
    let segments: Vec<&str> = path.split('/').collect();
    ROUTES
        .iter()
        .find(|route| {
            let pattern: Vec<&str> = route.split('/').collect();
            pattern.len() == segments.len()
                && pattern
                    .iter()
                    .zip(&segments)
                    .all(|(p, s)| p.starts_with('{') || p == s)
        })
        .copied()
        .unwrap_or("other")
}

async fn session(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
) -> Response {
    let anonymous = principal.is_anonymous();
    json_response(
        StatusCode::OK,
        &serde_json::json!({
            "principal": (!anonymous).then(|| principal.name.clone()),
            "role": principal.role.map(|r| r.as_str()),
            "auth_required": workbench.auth.required(),
            "limits": {
                "max_rows": workbench.limits.max_rows,
                "max_bytes": workbench.limits.max_bytes,
                "max_concurrent_jobs": workbench.limits.max_concurrent_jobs,
                "max_queries": workbench.limits.max_queries,
            },
        }),
    )
}

async fn examples() -> Response {
    json_response(StatusCode::OK, &tables::examples_json())
}

async fn not_found(request: Request) -> Response {
    ApiError::new(
        Code::NotFound,
        None,
        format!(
            "no route {} {} (rule: the workbench serves /, its assets and /api/v1/...)",
            request.method(),
            crate::text::quote(request.uri().path())
        ),
    )
    .into_response()
}

/// The workbench's router: assets (public) and the API (authenticated), behind [`guard`].
pub fn router(workbench: Arc<Workbench>) -> Router {
    let allowed = Arc::clone(&workbench.allowed);
    let api = Router::new()
        .route("/api/v1/session", get(session))
        .route("/api/v1/examples", get(examples))
        .route("/api/v1/tables", post(tables_post))
        .route(
            "/api/v1/tables/{id}/columns/{name}/values",
            get(hierarchies::values),
        )
        .route("/api/v1/tables/{id}/hierarchies", post(hierarchies::add))
        .route("/api/v1/tables/{id}/risk", post(risk::table_risk))
        .route("/api/v1/sweeps", post(sweeps::create))
        .route(
            "/api/v1/sweeps/{id}",
            get(sweeps::status).delete(sweeps::cancel),
        )
        .route("/api/v1/sweeps/{id}/releases/{n}", get(releases::release))
        .route(
            "/api/v1/sweeps/{id}/releases/{n}/release.csv",
            get(releases::release_csv),
        )
        .route(
            "/api/v1/sweeps/{id}/releases/{n}/sensitive.csv",
            get(releases::sensitive_csv),
        )
        .route(
            "/api/v1/sweeps/{id}/releases/{n}/report.json",
            get(releases::report_json),
        )
        .route(
            "/api/v1/sweeps/{id}/releases/{n}/job.toml",
            get(releases::job_toml),
        )
        .route(
            "/api/v1/sweeps/{id}/releases/{n}/classes/{c}",
            get(releases::class),
        )
        .route(
            "/api/v1/sweeps/{id}/releases/{n}/distribution/{column}",
            get(distribution::distribution),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            Arc::clone(&workbench),
            authorize,
        ));
    Router::new()
        .route("/", get(assets::index))
        .route("/app.js", get(assets::app_js))
        .route("/app.css", get(assets::app_css))
        .route("/LICENSES.txt", get(assets::licenses))
        .merge(api)
        .fallback(not_found)
        .with_state(workbench)
        .layer(axum::middleware::from_fn_with_state(allowed, guard::guard))
        .layer(axum::middleware::from_fn(headers))
}

/// Reads a request body of at most `tables.max_bytes`: a declared length past it is refused before
/// anything is read, and reading stops as soon as the limit is passed.
pub async fn read_body(
    body: Body,
    headers: &http::HeaderMap,
    max_bytes: usize,
) -> Result<bytes::Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max_bytes as u64) {
        return Err(tables::too_large("body", max_bytes));
    }
    axum::body::to_bytes(body, max_bytes).await.map_err(|e| {
        // http-body's `LengthLimitError`, under axum's error.
        let mut source: Option<&dyn std::error::Error> = Some(&e);
        let mut too_large = false;
        let mut idle = None;
        while let Some(s) = source {
            too_large |= s.to_string().contains("length limit exceeded");
            idle = idle.or(s.downcast_ref::<listener::BodyIdle>());
            source = s.source();
        }
        if too_large {
            tables::too_large("body", max_bytes)
        } else if let Some(idle) = idle {
            ApiError::new(Code::RequestTimeout, Some("body"), format!("body: {idle}"))
        } else {
            ApiError::invalid("body", format!("cannot be read: {e}"))
        }
    })
}

/// Parses a JSON body into `T`; errors name the body and serde's rule (which names the field).
pub fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes)
        .map_err(|e| ApiError::invalid("body", format!("not a valid request: {e}")))
}

async fn tables_post(
    State(workbench): State<Arc<Workbench>>,
    axum::Extension(Caller(principal)): axum::Extension<Caller>,
    request: Request,
) -> Response {
    match create_table(&workbench, &principal, request).await {
        Ok(body) => json_response(StatusCode::OK, &body),
        Err(e) => e.into_response(),
    }
}

async fn create_table(
    workbench: &Arc<Workbench>,
    principal: &Principal,
    request: Request,
) -> Result<serde_json::Value, ApiError> {
    let record = crate::jobs::JobRecord::start("upload");
    let result = upload_table(workbench, principal, request).await;
    record.finish(crate::jobs::Outcome::of(
        result.as_ref().map_err(|e| e.code.failure()),
    ));
    result
}

/// An upload is a table job: it takes a place before its body is read, and its body and what is
/// kept of it are charged to its memory budget (tables.rs).
async fn upload_table(
    workbench: &Arc<Workbench>,
    principal: &Principal,
    request: Request,
) -> Result<serde_json::Value, ApiError> {
    let (parts, body) = request.into_parts();
    let slot = workbench.jobs.acquire().map_err(|e| {
        ApiError::new(
            Code::ResourceExhausted,
            None,
            format!("tables.max_concurrent_jobs: {e}"),
        )
    })?;
    let budget = workbench.jobs.budget();
    let max_bytes = workbench.limits.max_bytes;
    let bytes = read_body(body, &parts.headers, max_bytes).await?;
    let max_rows = workbench.limits.max_rows;
    let (stored, _slot) = workbench
        .jobs
        .run_within(
            "upload",
            slot,
            budget,
            |_: &ApiError| false,
            move |_, budget| {
                // The body, then the request parsed out of it (its texts are no longer than the
                // body); the body is dropped once parsed, the CSV text becomes the kept table.
                let body_held = budget
                    .try_reserve(bytes.len() as u64, "the upload's body")
                    .map_err(|e| ApiError::memory(&e))?;
                let mut held = budget
                    .try_reserve(bytes.len() as u64, "the upload's parsed request")
                    .map_err(|e| ApiError::memory(&e))?;
                let table_request: tables::TableRequest = parse_json(&bytes)?;
                drop((bytes, body_held));
                tables::build(table_request, max_rows, max_bytes, &mut held)
            },
        )
        .await
        .map_err(|e| {
            ApiError::new(
                Code::DeadlineExceeded,
                None,
                format!("tables.max_job_ms: {e}"),
            )
        })?;
    let stored = stored?;
    let id = workbench
        .tables
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(&principal.name, Arc::new(stored), |_| true);
    let stored = workbench
        .tables
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&principal.name, &id)
        .ok_or_else(|| ApiError::not_found("table", "table", &id))?;
    Ok(table_json(&id, &stored))
}

/// A kept table as the API answers it (`POST /api/v1/tables` and its hierarchies).
pub fn table_json(id: &str, stored: &tables::StoredTable) -> serde_json::Value {
    serde_json::json!({
        "table": id,
        "name": stored.name,
        "rows": stored.rows,
        "columns": stored.columns,
        "files": stored.files(),
        "job": stored.job,
    })
}

/// Binds the workbench's listener (`ui.listen`).
pub async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr} (ui.listen)"))
}

/// Serves the workbench on `listener` until `stop` turns true; running sweeps are cancelled then.
pub async fn serve(
    listener: TcpListener,
    workbench: Arc<Workbench>,
    stop: watch::Receiver<bool>,
) -> anyhow::Result<()> {
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(ui_addr = %addr, "workbench listening (http://{addr}/)");
    }
    let limits = listener::Limits {
        max_connections: workbench.ui.max_connections,
        header_timeout: workbench.ui.header_timeout,
        idle_timeout: workbench.ui.idle_timeout,
    };
    let app = router(Arc::clone(&workbench));
    listener::serve(listener, app, limits, stop).await;
    workbench.cancel_all();
    Ok(())
}
