//! The web UI of `mst serve`: one page and its assets, embedded in the binary (no network, no
//! build step), drawing the stored runs with the report's own script, live runs, and the
//! playground. The pages hold no data: everything they show comes from the API, with its token.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

/// The page's assets only ever come from this server, and it talks to nothing else.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                   connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

const INDEX_HTML: &str = include_str!("../view/assets/index.html");
const APP_JS: &str = include_str!("../view/assets/app.js");

fn served(content_type: &'static str, body: &'static str) -> Response {
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, content_type),
            (header::CONTENT_SECURITY_POLICY, CSP),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        body,
    )
        .into_response()
}

/// `GET /`: the web UI's one page.
pub fn page() -> Response {
    served("text/html; charset=utf-8", INDEX_HTML)
}

/// `GET /ui/{asset}`: the page's script and styles.
pub async fn asset(Path(name): Path<String>) -> Response {
    use crate::view::html::{REPORT_JS, STYLE_CSS};
    match name.as_str() {
        "style.css" => served("text/css; charset=utf-8", STYLE_CSS),
        "report.js" => served("text/javascript; charset=utf-8", REPORT_JS),
        "app.js" => served("text/javascript; charset=utf-8", APP_JS),
        _ => super::ServeError::not_found(format!(
            "no UI asset `{name}`: the UI has style.css, report.js and app.js"
        ))
        .into_response(),
    }
}
