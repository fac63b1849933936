//! The workbench page's static assets, embedded in the binary from `ui/dist/` (built by the page's
//! npm build, docs/workbench.md): nothing is loaded from anywhere else, and they are public (no
//! token needed to load the page; the page asks for one when the API says 401).
use axum::response::{IntoResponse, Response};
use http::{StatusCode, header};

const INDEX_HTML: &str = include_str!("../../ui/dist/index.html");
const APP_JS: &str = include_str!("../../ui/dist/app.js");
const APP_CSS: &str = include_str!("../../ui/dist/app.css");
const LICENSES_TXT: &str = include_str!("../../ui/dist/LICENSES.txt");

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

pub async fn index() -> Response {
    asset("text/html; charset=utf-8", INDEX_HTML)
}

pub async fn app_js() -> Response {
    asset("text/javascript; charset=utf-8", APP_JS)
}

pub async fn app_css() -> Response {
    asset("text/css; charset=utf-8", APP_CSS)
}

pub async fn licenses() -> Response {
    asset("text/plain; charset=utf-8", LICENSES_TXT)
}
