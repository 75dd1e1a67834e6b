//! Starting a coordinator's HTTP server (API, dashboard, metrics) from the command line.

use std::net::SocketAddr;

use herder_core::ids::NodeId;
use herder_http::{HttpOptions, HttpServer};
use herder_runtime::auth::Tokens;
use herder_runtime::coordinator::CoordinatorHandle;
use herder_runtime::tls::ServerTls;

use crate::verbs::parse_listen_addr;

/// Where the HTTP server should listen, as the command line said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HttpListen {
    /// `--http-port off`.
    Off,
    /// A default: if the port is taken, the coordinator runs without HTTP and says so.
    Default(SocketAddr),
    /// Given on the command line: a port that cannot be had is an error.
    Given(SocketAddr),
}

impl HttpListen {
    /// Where it would listen, unless off.
    pub fn addr(&self) -> Option<SocketAddr> {
        match self {
            HttpListen::Off => None,
            HttpListen::Default(addr) | HttpListen::Given(addr) => Some(*addr),
        }
    }

    /// Parses `--http-port` (`None`: the default `default`).
    pub fn parse(raw: Option<&str>, default: SocketAddr) -> Result<HttpListen, String> {
        match raw {
            None => Ok(HttpListen::Default(default)),
            Some(off) if off.eq_ignore_ascii_case("off") => Ok(HttpListen::Off),
            Some(raw) => parse_listen_addr(raw, "127.0.0.1").map(HttpListen::Given),
        }
    }
}

/// Starts the HTTP server in front of `coordinator` (whose own client address is first in
/// `coordinators`). `Err` carries the message for a port that was asked for and is taken.
pub async fn start(
    listen: HttpListen,
    node_id: NodeId,
    coordinator: &CoordinatorHandle,
    coordinators: Vec<String>,
    max_frame_bytes: usize,
    tokens: Option<Tokens>,
    tls: Option<ServerTls>,
) -> Result<Option<HttpServer>, String> {
    let (addr, given) = match listen {
        HttpListen::Off => return Ok(None),
        HttpListen::Default(addr) => (addr, false),
        HttpListen::Given(addr) => (addr, true),
    };
    let listener = match herder_http::bind(addr).await {
        Ok(listener) => listener,
        Err(error) if !given => {
            tracing::warn!(
                %addr,
                %error,
                "HTTP port unavailable: this coordinator runs without its HTTP API, dashboard and metrics (choose a port with --http-port)"
            );
            return Ok(None);
        }
        Err(error) => {
            return Err(format!(
                "cannot listen on {addr} for HTTP: {error} (pick another --http-port, or `--http-port off`)"
            ))
        }
    };
    let options = HttpOptions {
        node_id,
        coordinators,
        observer: Some(coordinator.observer()),
        max_body_bytes: max_frame_bytes,
        tokens,
        tls,
    };
    herder_http::serve(listener, options)
        .map(Some)
        .map_err(|error| format!("cannot serve HTTP on {addr}: {error}"))
}
