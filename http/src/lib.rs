//! # herder-http
//!
//! The HTTP face of a coordinator: a JSON API over the client protocol, the web dashboard,
//! and Prometheus metrics, on one port (`--http-port`).
//!
//! The API holds no state and makes no decisions. Each request becomes one client-protocol
//! call made through a [`HerderClient`] that dials this member first and follows the group's
//! redirects, so a follower's port relays to the leader and every member answers alike; the
//! answers are the very JSON that `herder <verb> --json` prints ([`views`]). Metrics are read
//! from this member's own coordinator, since they describe this process.
//!
//! Every bound is named: connections ([`HTTP_CONNECTIONS_MAX`]), requests being served
//! ([`HTTP_REQUESTS_IN_FLIGHT_MAX`]), body size (the coordinator's frame limit), list pages
//! and long-polls ([`WAIT_MILLIS_MAX`]).

mod api;
mod assets;
mod listener;
pub mod views;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use herder_core::client::ClientConfig;
use herder_core::ids::NodeId;
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_runtime::auth::Tokens;
use herder_runtime::coordinator::Observer;
use herder_runtime::tls::ServerTls;
use herder_runtime::HerderClient;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// HTTP connections one coordinator keeps open; a further one waits in the kernel's backlog
/// until another closes.
pub const HTTP_CONNECTIONS_MAX: usize = 256;
/// Requests served at once; beyond them a request is answered 503 at once.
pub const HTTP_REQUESTS_IN_FLIGHT_MAX: usize = 1024;
/// Longest long-poll `GET /api/v1/jobs/{id}/wait` may ask for, and what it gets by default.
pub const WAIT_MILLIS_MAX: u64 = 60_000;
pub const WAIT_MILLIS_DEFAULT: u64 = 30_000;
/// Longest any one call to the group may take (a wait gets its own timeout on top).
pub const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// The default port, as the CLI offers it.
pub const HTTP_PORT_DEFAULT: u16 = 7080;

/// What the server needs to know about the coordinator it fronts.
#[derive(Clone)]
pub struct HttpOptions {
    /// This member's id (every answer says which member served it).
    pub node_id: NodeId,
    /// Client-protocol addresses: this member's own first, then the other members'.
    pub coordinators: Vec<String>,
    /// Reads this member's metrics (`None`: `/metrics` answers 503).
    pub observer: Option<Observer>,
    /// Largest request body (the coordinator's frame limit: a larger one could not be relayed).
    pub max_body_bytes: usize,
    /// The client tokens this member's client port checks, if any: then every route but the
    /// dashboard's page and assets needs `Authorization: Bearer TOKEN`, and each call is made
    /// with that token, so the group enforces its role.
    pub tokens: Option<Tokens>,
    /// TLS for the HTTP port (HTTPS), and for the server's own calls to the members' client
    /// ports (verified against the same CA), if the coordinator speaks it.
    pub tls: Option<ServerTls>,
}

/// A running HTTP server.
pub struct HttpServer {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl HttpServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops serving at once (long-polls in progress are cut off).
    pub fn shutdown(self) {
        self.task.abort();
    }
}

/// The group's client addresses in the order a member's HTTP server dials them: its own
/// (`addresses[own]`) first, then the others, so it answers locally what it can and a follower
/// relays the rest to the leader.
pub fn own_first(addresses: &[String], own: usize) -> Vec<String> {
    let mine = addresses.get(own);
    mine.into_iter()
        .chain(addresses.iter().filter(|a| Some(*a) != mine))
        .cloned()
        .collect()
}

/// Binds `addr` for [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the API, the dashboard and the metrics on `listener` until shut down. Must be called
/// on a tokio runtime.
pub fn serve(listener: TcpListener, options: HttpOptions) -> std::io::Result<HttpServer> {
    let addr = listener.local_addr()?;
    let own = options.coordinators.first().cloned();
    let client_tls = options.tls.as_ref().and_then(ServerTls::client);
    let plain_client = |addresses: Vec<String>| {
        HerderClient::secured(
            ClientConfig::new(addresses),
            FRAME_BYTES_MAX_DEFAULT,
            None,
            client_tls.clone(),
        )
        .with_call_timeout(CALL_TIMEOUT)
    };
    let gateway = api::Gateway {
        group: plain_client(options.coordinators.clone()),
        own: own.map(|address| plain_client(vec![address])),
        members: Default::default(),
        node_id: options.node_id,
        observer: options.observer,
        tokens: options.tokens,
        coordinators: options.coordinators,
        client_tls,
        by_token: Default::default(),
    };
    let app = api::router(Arc::new(gateway), options.max_body_bytes);
    let tls = options.tls.is_some();
    let listener = listener::Bounded::new(listener, HTTP_CONNECTIONS_MAX, options.tls);
    let task = tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "HTTP server stopped");
        }
    });
    tracing::info!(%addr, tls, "HTTP API listening (dashboard at /, metrics at /metrics)");
    Ok(HttpServer { addr, task })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_member_dials_itself_first_then_the_others_in_order() {
        let all: Vec<String> = ["a:1", "b:2", "c:3"].map(String::from).to_vec();
        assert_eq!(super::own_first(&all, 1), ["b:2", "a:1", "c:3"]);
        assert_eq!(super::own_first(&all, 0), all);
    }
}
