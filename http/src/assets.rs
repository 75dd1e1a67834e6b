//! The dashboard's files, compiled into the binary: nothing is fetched from anywhere else,
//! and nothing needs building.

use axum::extract::Path;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};

const INDEX_HTML: &str = include_str!("../assets/index.html");
const APP_JS: &str = include_str!("../assets/app.js");
const APP_CSS: &str = include_str!("../assets/app.css");

pub async fn index() -> Response {
    file("text/html; charset=utf-8", INDEX_HTML)
}

pub async fn asset(Path(name): Path<String>) -> Response {
    match name.as_str() {
        "app.js" => file("text/javascript; charset=utf-8", APP_JS),
        "app.css" => file("text/css; charset=utf-8", APP_CSS),
        _ => crate::api::ApiError::not_found(format!("no asset named {name:?}")).into_response(),
    }
}

fn file(content_type: &'static str, body: &'static str) -> Response {
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
