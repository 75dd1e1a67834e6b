//! The routes: each turns one HTTP request into one client-protocol call and its answer into
//! the JSON the CLI prints, or a typed error with the status that fits it.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::Arc;

use axum::extract::rejection::{JsonRejection, QueryRejection};
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, patch, post};
use axum::{Json, Router};
use herder_core::auth::ClientToken;
use herder_core::client::ClientConfig;
use herder_core::client::ClientError;
use herder_core::ids::{JobId, NodeId};
use herder_core::job::JobState;
use herder_core::limits::FRAME_BYTES_MAX_DEFAULT;
use herder_core::limits::{GROUP_MEMBERS_MAX, LIST_LIMIT_DEFAULT, LIST_LIMIT_MAX};
use herder_core::protocol::{ClusterView, ErrorCode, JobSubmission, Partitions};
use herder_core::queues::{check_queue_name, QueueChange, RateLimit};
use herder_runtime::auth::Tokens;
use herder_runtime::client::{retry_submission, CallError};
use herder_runtime::coordinator::Observer;
use herder_runtime::tls::ClientTls;
use herder_runtime::{HerderClient, SubmitOptions, Submitted};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::{Mutex, Semaphore};

use crate::views::{self, Failure};
use crate::{HTTP_REQUESTS_IN_FLIGHT_MAX, WAIT_MILLIS_DEFAULT, WAIT_MILLIS_MAX};

pub struct Gateway {
    /// Dials this member first and follows redirects to the leader.
    pub group: HerderClient,
    /// This member alone (its own view of the group).
    pub own: Option<HerderClient>,
    /// One client per other member, made when first asked for its view (at most
    /// `GROUP_MEMBERS_MAX`).
    pub members: Mutex<HashMap<String, HerderClient>>,
    pub node_id: NodeId,
    pub observer: Option<Observer>,
    /// The tokens this member checks; `None`: no route asks for one.
    pub tokens: Option<Tokens>,
    /// Client-protocol addresses, this member's own first (for clients made per token).
    pub coordinators: Vec<String>,
    /// How the gateway's clients verify the members' client ports, when they speak TLS.
    pub client_tls: Option<ClientTls>,
    /// One client per token presented, made on its first valid use (at most
    /// [`TOKEN_CLIENTS_MAX`]; beyond them the map starts again), for the generation of the
    /// tokens table they were made under: a reload drops them all, so a token whose role
    /// changed authenticates again with its new role.
    pub by_token: Mutex<(u64, HashMap<String, HerderClient>)>,
}

/// Clients kept for distinct tokens: each holds one connection to the group.
pub const TOKEN_CLIENTS_MAX: usize = 64;

type Shared = State<Arc<Gateway>>;

/// The client a request's calls go through: the shared one on a member that checks no tokens,
/// otherwise one that presents the request's own bearer token, so the group judges its role.
pub struct Group(HerderClient, Option<String>);

/// The token of `Authorization: Bearer TOKEN`, once the table knows it.
fn bearer(g: &Gateway, parts: &axum::http::request::Parts) -> Result<Option<String>, ApiError> {
    let Some(tokens) = &g.tokens else {
        return Ok(None);
    };
    let presented = parts
        .headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| {
            // The scheme's name is case-insensitive.
            let (scheme, token) = value.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then_some(token)
        })
        .map(str::trim);
    let Some(token) = presented else {
        return Err(ApiError::unauthenticated(
            "this coordinator checks tokens: send `Authorization: Bearer TOKEN`",
        ));
    };
    if tokens.current().lookup(token).is_none() {
        return Err(ApiError::unauthenticated("unknown token"));
    }
    Ok(Some(token.to_owned()))
}

impl axum::extract::FromRequestParts<Arc<Gateway>> for Group {
    type Rejection = ApiError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        g: &Arc<Gateway>,
    ) -> Result<Group, ApiError> {
        let Some(token) = bearer(g, parts)? else {
            return Ok(Group(g.group.clone(), None));
        };
        let generation = g.tokens.as_ref().map_or(0, Tokens::generation);
        let mut cache = g.by_token.lock().await;
        let (made_under, clients) = &mut *cache;
        if *made_under != generation
            || (!clients.contains_key(&token) && clients.len() >= TOKEN_CLIENTS_MAX)
        {
            clients.clear();
            *made_under = generation;
        }
        let client = clients.entry(token.clone()).or_insert_with(|| {
            let parsed = ClientToken::from_text(&token).ok().map(Arc::new);
            HerderClient::secured(
                ClientConfig::new(g.coordinators.clone()),
                FRAME_BYTES_MAX_DEFAULT,
                parsed,
                g.client_tls.clone(),
            )
            .with_call_timeout(crate::CALL_TIMEOUT)
        });
        Ok(Group(client.clone(), Some(token)))
    }
}

pub fn router(gateway: Arc<Gateway>, max_body_bytes: usize) -> Router {
    let in_flight = Arc::new(Semaphore::new(HTTP_REQUESTS_IN_FLIGHT_MAX));
    let node = HeaderValue::from_str(&gateway.node_id.0).ok();
    Router::new()
        .route("/", get(crate::assets::index))
        .route("/assets/{name}", get(crate::assets::asset))
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/api/v1/jobs", post(submit).get(list))
        .route("/api/v1/jobs/batch", post(submit_batch))
        .route("/api/v1/jobs/{id}", get(status))
        .route("/api/v1/jobs/{id}/wait", get(wait))
        .route("/api/v1/jobs/{id}/cancel", post(cancel))
        .route("/api/v1/jobs/{id}/retry", post(retry))
        .route("/api/v1/workers", get(workers))
        .route("/api/v1/queues", get(queues))
        .route("/api/v1/queues/{name}", patch(set_queue))
        .route("/api/v1/cluster", get(cluster))
        .route("/api/v1/purge", post(purge))
        .fallback(|| async { ApiError::not_found("no such route".to_owned()) })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "METHOD_NOT_ALLOWED",
                "this route does not take that method".to_owned(),
            )
        })
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .layer(middleware::from_fn(move |request: Request, next: Next| {
            let in_flight = in_flight.clone();
            let node = node.clone();
            async move {
                let Ok(_permit) = in_flight.try_acquire() else {
                    return ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "TOO_MANY_REQUESTS",
                        format!("this coordinator is already serving {HTTP_REQUESTS_IN_FLIGHT_MAX} HTTP requests; retry shortly"),
                    )
                    .retryable()
                    .into_response();
                };
                let mut response = next.run(request).await;
                if let Some(node) = node {
                    response.headers_mut().insert("x-herder-node", node);
                }
                response
            }
        }))
        .with_state(gateway)
}

/// A typed error answer: `{"error": {"kind", "code", "retryable", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    failure: Failure,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &str, message: String) -> ApiError {
        ApiError {
            status,
            failure: Failure {
                kind: "invalid",
                code: Some(code.to_owned()),
                retryable: false,
                message,
            },
        }
    }

    /// The same request may succeed later.
    pub fn retryable(mut self) -> ApiError {
        self.failure.retryable = true;
        self
    }

    pub fn invalid(message: String) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
    }

    pub fn unauthenticated(message: &str) -> ApiError {
        let mut error = ApiError::new(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            message.to_owned(),
        );
        error.failure.kind = "unauthenticated";
        error
    }

    pub fn not_found(message: String) -> ApiError {
        let mut error = ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", message);
        error.failure.kind = "not_found";
        error
    }
}

impl From<CallError> for ApiError {
    fn from(error: CallError) -> ApiError {
        let failure = Failure::of(&error);
        let status = match &error {
            CallError::Client(ClientError::Server { code, .. }) => match code {
                ErrorCode::InvalidTask | ErrorCode::InvalidRequest => StatusCode::BAD_REQUEST,
                ErrorCode::JobNotFound => StatusCode::NOT_FOUND,
                ErrorCode::Unauthenticated => StatusCode::UNAUTHORIZED,
                ErrorCode::Forbidden => StatusCode::FORBIDDEN,
                ErrorCode::IdempotencyConflict | ErrorCode::TooManyQueues => StatusCode::CONFLICT,
                ErrorCode::TooManyWaiters | ErrorCode::TooManyConnections => {
                    StatusCode::SERVICE_UNAVAILABLE
                }
                ErrorCode::ReplyTooLarge | ErrorCode::FrameTooLarge => {
                    StatusCode::PAYLOAD_TOO_LARGE
                }
                _ => StatusCode::BAD_GATEWAY,
            },
            CallError::Client(ClientError::Rejected { .. }) => StatusCode::TOO_MANY_REQUESTS,
            CallError::Client(
                ClientError::Unreachable { .. } | ClientError::TooManyRedirects(_),
            )
            | CallError::Closed => StatusCode::SERVICE_UNAVAILABLE,
            CallError::Client(ClientError::Unsendable { .. }) | CallError::Invalid(_) => {
                StatusCode::BAD_REQUEST
            }
            CallError::Client(ClientError::Ambiguous { .. }) | CallError::UnexpectedReply(_) => {
                StatusCode::BAD_GATEWAY
            }
            CallError::TimedOut { .. } => StatusCode::GATEWAY_TIMEOUT,
        };
        ApiError { status, failure }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(self.failure.json())).into_response()
    }
}

type Answer = Result<Response, ApiError>;

fn ok(value: Value) -> Answer {
    Ok((StatusCode::OK, Json(value)).into_response())
}

fn job_id(raw: &str) -> Result<JobId, ApiError> {
    JobId::from_str(raw).map_err(|_| ApiError::invalid(format!("{raw:?} is not a job id (a UUID)")))
}

fn body<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, ApiError> {
    body.map(|Json(value)| value).map_err(|rejection| {
        // A body that is JSON but not a request's shape is as bad a request as one that is
        // not JSON at all.
        let status = match rejection.status() {
            StatusCode::UNPROCESSABLE_ENTITY => StatusCode::BAD_REQUEST,
            other => other,
        };
        let code = if status == StatusCode::PAYLOAD_TOO_LARGE {
            "PAYLOAD_TOO_LARGE"
        } else {
            "INVALID_REQUEST"
        };
        ApiError::new(status, code, rejection.body_text())
    })
}

fn query<T>(query: Result<Query<T>, QueryRejection>) -> Result<T, ApiError> {
    query
        .map(|Query(value)| value)
        .map_err(|rejection| ApiError::invalid(rejection.body_text()))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SubmitBody {
    task: Value,
    max_attempts: Option<u32>,
    idempotency_key: Option<String>,
    partitions: Option<Partitions>,
    timeout_millis: Option<u64>,
    queue: Option<String>,
    priority: Option<u8>,
    fairness_key: Option<String>,
    run_at_unix_ms: Option<u64>,
    delay_millis: Option<u64>,
    #[serde(default)]
    after: Vec<JobId>,
    #[serde(default)]
    after_any_outcome: bool,
}

async fn submit(
    Group(client, _): Group,
    request: Result<Json<SubmitBody>, JsonRejection>,
) -> Answer {
    let request = body(request)?;
    let options = SubmitOptions {
        max_attempts: request.max_attempts,
        idempotency_key: request.idempotency_key,
        partitions: request.partitions,
        timeout_millis: request.timeout_millis,
        fairness_key: request.fairness_key,
        priority: request.priority,
        queue: request.queue,
        run_at_unix_ms: request.run_at_unix_ms,
        delay_millis: request.delay_millis,
        after: request.after,
        after_any_outcome: request.after_any_outcome,
        retry_of: None,
    };
    let submitted = client.submit_json(request.task, options).await?;
    Ok(created(&submitted, views::submitted(&submitted)))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchBody {
    jobs: Vec<JobSubmission>,
}

/// Many jobs in one request and one durable write: 200 with one result per job, in order.
async fn submit_batch(
    Group(client, _): Group,
    request: Result<Json<BatchBody>, JsonRejection>,
) -> Answer {
    let results = client.submit_batch(body(request)?.jobs).await?;
    ok(json!({ "results": results }))
}

/// 201 for a new job, 200 when an idempotency key named one that existed.
fn created(submitted: &Submitted, body: Value) -> Response {
    let status = if submitted.existing {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    let location = format!("/api/v1/jobs/{}", submitted.job_id);
    let mut response = (status, Json(body)).into_response();
    if let Ok(location) = HeaderValue::from_str(&location) {
        response.headers_mut().insert(header::LOCATION, location);
    }
    response
}

async fn status(Group(client, _): Group, Path(id): Path<String>) -> Answer {
    let job = client.status(job_id(&id)?).await?;
    ok(views::job(&job))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct WaitQuery {
    timeout_millis: Option<u64>,
}

async fn wait(
    Group(client, _): Group,
    Path(id): Path<String>,
    params: Result<Query<WaitQuery>, QueryRejection>,
) -> Answer {
    let job_id = job_id(&id)?;
    let timeout = query(params)?.timeout_millis.unwrap_or(WAIT_MILLIS_DEFAULT);
    if timeout > WAIT_MILLIS_MAX {
        return Err(ApiError::invalid(format!(
            "timeout_millis must be at most {WAIT_MILLIS_MAX} (got {timeout}); wait again for longer"
        )));
    }
    let (job, timed_out) = client.wait(job_id, Some(timeout)).await?;
    ok(views::waited(&job, timed_out))
}

async fn cancel(Group(client, _): Group, Path(id): Path<String>) -> Answer {
    let (job, cancelled) = client.cancel(job_id(&id)?).await?;
    ok(views::cancelled(&job, cancelled))
}

/// Submits a failed or cancelled job's task again, as a new job with the same options.
async fn retry(Group(client, _): Group, Path(id): Path<String>) -> Answer {
    let original = client.status(job_id(&id)?).await?;
    let job = retry_submission(&original)
        .map_err(|why| ApiError::new(StatusCode::CONFLICT, "NOT_RETRYABLE", why))?;
    let submitted = client.submit_job(job).await?;
    let mut answer = views::submitted(&submitted);
    answer["retry_of"] = json!(original.id);
    Ok(created(&submitted, answer))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ListQuery {
    state: Option<String>,
    limit: Option<u32>,
    before: Option<String>,
}

async fn list(Group(client, _): Group, params: Result<Query<ListQuery>, QueryRejection>) -> Answer {
    let params = query(params)?;
    let state = match params.state.as_deref() {
        None | Some("") => None,
        Some(raw) => Some(JobState::parse(raw).ok_or_else(|| {
            ApiError::invalid(format!(
                "unknown state {raw:?}; one of BLOCKED, SCHEDULED, QUEUED, RUNNING, RETRY_WAIT, COMPLETED, FAILED, CANCELLED"
            ))
        })?),
    };
    let limit = params.limit.unwrap_or(LIST_LIMIT_DEFAULT);
    if limit == 0 || limit > LIST_LIMIT_MAX {
        return Err(ApiError::invalid(format!(
            "limit must be between 1 and {LIST_LIMIT_MAX} (got {limit})"
        )));
    }
    let before = match params.before.as_deref() {
        None | Some("") => None,
        Some(raw) => Some(job_id(raw)?),
    };
    // One more than asked says whether the page stopped at the limit.
    let fetch = (limit + 1).min(LIST_LIMIT_MAX);
    let mut jobs = client.list_before(state, Some(fetch), before).await?;
    let truncated = jobs.len() > limit as usize;
    jobs.truncate(limit as usize);
    ok(views::job_list(&jobs, truncated))
}

async fn workers(Group(client, _): Group) -> Answer {
    let workers = client.workers().await?;
    ok(views::workers(&workers))
}

async fn queues(Group(client, _): Group) -> Answer {
    let queues = client.queues().await?;
    ok(json!({ "queues": queues }))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct QueueBody {
    weight: Option<u32>,
    paused: Option<bool>,
    aging_millis: Option<u64>,
    concurrency: Option<u32>,
    key_concurrency: Option<u32>,
    rate: Option<RateLimit>,
    key_rate: Option<RateLimit>,
    max_active_jobs: Option<u64>,
}

/// Changes the settings the body names (creating the queue if it is new); the others stay.
async fn set_queue(
    Group(client, _): Group,
    Path(name): Path<String>,
    request: Result<Json<QueueBody>, JsonRejection>,
) -> Answer {
    let request = body(request)?;
    let change = QueueChange {
        weight: request.weight,
        paused: request.paused,
        aging_millis: request.aging_millis,
        concurrency: request.concurrency,
        key_concurrency: request.key_concurrency,
        rate: request.rate,
        key_rate: request.key_rate,
        max_active_jobs: request.max_active_jobs,
    };
    check_queue_name(&name)
        .and(change.check())
        .map_err(ApiError::invalid)?;
    let queue = client.set_queue(&name, change).await?;
    ok(json!({ "queue": queue }))
}

/// Every member's own view: this member's first, then each member it names.
async fn cluster(State(g): Shared, Group(caller, token): Group) -> Answer {
    let own = match (&g.tokens, &g.own) {
        (None, Some(own)) => own,
        _ => &caller,
    };
    let mine = own.cluster().await?;
    let mut views: Vec<ClusterView> = vec![mine.clone()];
    let mut unreachable = Vec::new();
    for member in mine.members.iter().filter(|m| m.node_id != mine.node_id) {
        let Some(address) = member.client_address.clone() else {
            unreachable.push((
                member.node_id.0.clone(),
                "its client address is not known yet".to_owned(),
            ));
            continue;
        };
        let client = {
            // Each member is asked with the caller's token (if any), one client per member and
            // token.
            let key = format!("{address}\n{}", token.as_deref().unwrap_or_default());
            let mut members = g.members.lock().await;
            if !members.contains_key(&key) && members.len() >= GROUP_MEMBERS_MAX * 4 {
                // Addresses the group no longer names, or tokens gone: start again.
                members.clear();
            }
            members
                .entry(key)
                .or_insert_with(|| {
                    let token = token
                        .as_deref()
                        .and_then(|t| ClientToken::from_text(t).ok())
                        .map(Arc::new);
                    HerderClient::secured(
                        ClientConfig::new(vec![address.clone()]),
                        FRAME_BYTES_MAX_DEFAULT,
                        token,
                        g.client_tls.clone(),
                    )
                    .with_call_timeout(MEMBER_VIEW_TIMEOUT)
                })
                .clone()
        };
        match client.cluster().await {
            Ok(view) => views.push(view),
            Err(error) => unreachable.push((address, error.to_string())),
        }
    }
    ok(views::cluster(&views, &unreachable))
}

/// How long the cluster view waits for each other member's own view.
const MEMBER_VIEW_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PurgeBody {
    state: Option<String>,
    older_than_millis: u64,
}

/// One batch: how many went and how many more match (ask again to purge them).
async fn purge(Group(client, _): Group, request: Result<Json<PurgeBody>, JsonRejection>) -> Answer {
    let request = body(request)?;
    let state = match request.state.as_deref() {
        None => None,
        Some(raw) => match JobState::parse(raw) {
            Some(state) if state.is_terminal() => Some(state),
            _ => {
                return Err(ApiError::invalid(format!(
                    "state must be COMPLETED, FAILED or CANCELLED (got {raw:?})"
                )))
            }
        },
    };
    let older_than = std::time::Duration::from_millis(request.older_than_millis);
    let (purged, remaining) = client.purge(state, older_than).await?;
    ok(json!({ "purged": purged, "remaining": remaining }))
}

/// Liveness, for probes that carry no token: 200 while this member's coordinator answers.
async fn healthz(State(g): Shared) -> Response {
    match observe(&g).await {
        Ok(_) => (
            StatusCode::OK,
            Json(serde_json::json!({ "status": "alive" })),
        )
            .into_response(),
        Err(stopped) => stopped.into_response(),
    }
}

/// Readiness, for probes that carry no token: 200 once this member knows a leader (or is
/// one), so that it can serve or relay what it is asked.
async fn readyz(State(g): Shared) -> Response {
    match observe(&g).await {
        Ok(observation) if observation.leader.is_some() => (
            StatusCode::OK,
            Json(serde_json::json!({ "status": "ready" })),
        )
            .into_response(),
        Ok(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "this member knows no leader yet".to_owned(),
        )
        .retryable()
        .into_response(),
        Err(stopped) => stopped.into_response(),
    }
}

async fn observe(g: &Gateway) -> Result<herder_runtime::metrics::Observation, ApiError> {
    let observed = match &g.observer {
        Some(observer) => observer.observe().await,
        None => None,
    };
    observed.ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "this process has no running coordinator".to_owned(),
        )
        .retryable()
    })
}

async fn metrics(State(g): Shared, request: Request) -> Response {
    let (parts, _) = request.into_parts();
    if let Err(refused) = bearer(&g, &parts) {
        return refused.into_response();
    }
    let text = match &g.observer {
        Some(observer) => observer.metrics_text().await,
        None => None,
    };
    match text {
        Some(text) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        None => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "this process has no running coordinator to report on".to_owned(),
        )
        .retryable()
        .into_response(),
    }
}
