//! The provider's connection to the broker: one *session* is a connection, a `Subscribe` stream and
//! an `Answer` stream; [`serve`] runs sessions until it is told to stop, reconnecting after a lost
//! one with a capped, jittered exponential backoff.
//!
//! Invariants:
//! - every request received is acknowledged at once (`LbsAnswer.ack`) and queued on the worker pool,
//!   or, when the queue is full, answered at once with the overloaded answer: the Subscribe loop
//!   never computes an answer, so the broker's `location.provider_ack_ms` is met whatever the load;
//! - within a session the acknowledgement of a request is sent on the Answer stream before its
//!   answer (it is queued before the job is), and answers go out in completion order;
//! - a session ends on a stop request, a closed or failed stream, or a connection error. Only a stop
//!   or a refusal that retrying cannot cure (the broker refuses the credential or the service:
//!   UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT or UNIMPLEMENTED on `Subscribe`) ends
//!   [`serve`]; everything else is retried;
//! - answers still being computed when a session is lost go out on that session's Answer stream if it
//!   still runs (the broker routes them: the requests were acknowledged); otherwise they are dropped;
//! - on a stop, the Subscribe stream is closed first (no new requests), then the queued requests are
//!   answered and the Answer stream closed; a second stop ends at once.
//!
//! Logs name the service, counts and statuses; never a pseudonym, a token or a box.
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

use super::answer::{PoiProvider, overloaded};
use super::pool::Pool;
use crate::proto::lbs_gateway_client::LbsGatewayClient;
use crate::proto::{AnswerSummary, CloakedRequest, LbsAnswer, LbsSubscription};

/// Answers and acknowledgements buffered for the Answer stream.
const ANSWER_BUFFER: usize = 4_096;
/// The first reconnection delay (before jitter), doubled per failed attempt up to the cap.
const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Adds `authorization: Bearer <token>` to every call when a token is given.
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<tonic::metadata::Ascii>>);

impl Bearer {
    pub fn new(token: Option<&str>) -> anyhow::Result<Bearer> {
        token
            .map(|t| {
                format!("Bearer {t}")
                    .parse()
                    .map_err(|_| anyhow::anyhow!("the token must be printable ASCII"))
            })
            .transpose()
            .map(Bearer)
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// The endpoint of `--addr`, with TLS when `ca` is given. Its errors are the caller's (a bad URL,
/// an unreadable CA): not retried.
pub fn endpoint(
    addr: &str,
    ca: Option<&std::path::Path>,
    server_name: Option<&str>,
) -> anyhow::Result<Endpoint> {
    let mut endpoint = Endpoint::from_shared(addr.to_string())
        .with_context(|| format!("--addr: {addr:?} is not a URL"))?
        .tcp_nodelay(true);
    if let Some(ca) = ca {
        let pem =
            std::fs::read(ca).with_context(|| format!("--ca: cannot read {}", ca.display()))?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
        if let Some(name) = server_name {
            tls = tls.domain_name(name);
        }
        endpoint = endpoint.tls_config(tls).context("--ca")?;
    }
    Ok(endpoint)
}

/// Where and as whom to subscribe, and how long to wait at most between reconnections.
pub struct Target {
    pub endpoint: Endpoint,
    pub bearer: Bearer,
    pub service: String,
    pub max_backoff: Duration,
}

/// What [`serve`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Tally {
    /// Requests received (each acknowledged and queued, or shed).
    pub received: u64,
    /// Requests answered with the overloaded answer.
    pub shed: u64,
    /// Sessions that subscribed.
    pub sessions: u64,
}

/// Counts stop requests (SIGINT/SIGTERM): the first stops gracefully, the second at once.
pub type Stop = watch::Receiver<u32>;

/// Waits until `stop` has counted at least `n` stop requests (forever if its sender is gone).
async fn stopped(stop: &mut Stop, n: u32) {
    if stop.wait_for(|&count| count >= n).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Why a session ended.
enum End {
    /// Told to stop.
    Stopped,
    /// A stream or the connection failed; reconnect.
    Lost(String),
    /// The broker refused in a way retrying cannot cure.
    Refused(anyhow::Error),
}

/// Subscribes to `target.service` and answers every request, reconnecting after a lost session,
/// until `stop` fires (Ok) or the broker refuses the credential or the service (Err).
pub async fn serve(
    provider: Arc<PoiProvider>,
    pool: Arc<Pool>,
    target: Target,
    mut stop: Stop,
) -> anyhow::Result<Tally> {
    let mut tally = Tally::default();
    let mut backoff = FIRST_BACKOFF.min(target.max_backoff);
    loop {
        let sessions = tally.sessions;
        let end = session(&provider, &pool, &target, &mut stop, &mut tally).await;
        let why = match end {
            End::Stopped => return Ok(tally),
            End::Refused(error) => return Err(error),
            End::Lost(why) => why,
        };
        if tally.sessions > sessions {
            // It had subscribed: start over from the shortest delay.
            backoff = FIRST_BACKOFF.min(target.max_backoff);
        }
        let delay = jittered(backoff);
        tracing::warn!(
            service = %target.service,
            reason = %why,
            retry_in_ms = delay.as_millis() as u64,
            "lost the broker; reconnecting"
        );
        backoff = (backoff * 2).min(target.max_backoff);
        tokio::select! {
            _ = tokio::time::sleep(delay) => {}
            _ = stopped(&mut stop, 1) => return Ok(tally),
        }
    }
}

/// A delay drawn uniformly from [d/2, d], so providers that lost the same broker do not all come
/// back at the same instant.
fn jittered(d: Duration) -> Duration {
    let ms = d.as_millis().min(u128::from(u64::MAX)) as u64;
    Duration::from_millis(rand::random_range(ms / 2..=ms))
}

/// Whether a refused `Subscribe` is one retrying cannot cure (the credential or the service).
fn unrecoverable(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unauthenticated
            | Code::PermissionDenied
            | Code::InvalidArgument
            | Code::Unimplemented
    )
}

fn describe(rpc: &str, status: &Status) -> String {
    format!("{rpc}: {} {}", status.code(), status.message())
}

/// One connection, Subscribe stream and Answer stream, until one of them ends or `stop` fires.
async fn session(
    provider: &Arc<PoiProvider>,
    pool: &Pool,
    target: &Target,
    stop: &mut Stop,
    tally: &mut Tally,
) -> End {
    let channel = tokio::select! {
        channel = target.endpoint.connect() => channel,
        _ = stopped(stop, 1) => return End::Stopped,
    };
    let channel: Channel = match channel {
        Ok(channel) => channel,
        Err(e) => return End::Lost(format!("cannot connect: {:#}", anyhow::Error::from(e))),
    };
    let mut gateway =
        LbsGatewayClient::new(InterceptedService::new(channel, target.bearer.clone()));
    let subscription = LbsSubscription {
        service: target.service.clone(),
    };
    let subscribed = tokio::select! {
        subscribed = gateway.subscribe(subscription) => subscribed,
        _ = stopped(stop, 1) => return End::Stopped,
    };
    let mut feed = match subscribed {
        Ok(feed) => feed.into_inner(),
        Err(status) if unrecoverable(&status) => {
            return End::Refused(anyhow::anyhow!(
                "the broker refused the subscription to service {:?}: {}",
                target.service,
                describe("Subscribe", &status)
            ));
        }
        Err(status) => return End::Lost(describe("Subscribe", &status)),
    };
    tally.sessions += 1;
    tracing::info!(service = %target.service, "subscribed");
    let (answers, outbox) = mpsc::channel::<LbsAnswer>(ANSWER_BUFFER);
    let mut answer_client = gateway.clone();
    let mut answering = tokio::spawn(async move {
        answer_client
            .answer(ReceiverStream::new(outbox))
            .await
            .map(tonic::Response::into_inner)
    });
    let mut answering_ended = None;
    let end = loop {
        tokio::select! {
            biased;
            _ = stopped(stop, 1) => break End::Stopped,
            ended = &mut answering => {
                let end = match &ended {
                    Ok(Ok(_)) => End::Lost("the broker ended the Answer stream".to_string()),
                    Ok(Err(status)) if status.code() == Code::Unauthenticated => {
                        End::Refused(anyhow::anyhow!("{}", describe("Answer", status)))
                    }
                    Ok(Err(status)) => End::Lost(describe("Answer", status)),
                    Err(e) => End::Lost(format!("the Answer task failed: {e}")),
                };
                answering_ended = Some(ended);
                break end;
            }
            message = feed.message() => match message {
                Ok(Some(request)) => {
                    if !take(request, provider, pool, &answers, tally).await {
                        break End::Lost("the Answer stream closed".to_string());
                    }
                }
                Ok(None) => break End::Lost("the broker ended the subscription".to_string()),
                Err(status) if unrecoverable(&status) && status.code() != Code::InvalidArgument => {
                    break End::Refused(anyhow::anyhow!("{}", describe("Subscribe", &status)));
                }
                Err(status) => break End::Lost(describe("Subscribe", &status)),
            },
        }
    };
    // No more requests on this session; the pool's jobs hold the only other senders of `answers`.
    drop(feed);
    drop(answers);
    if answering_ended.is_some() {
        return end;
    }
    if matches!(end, End::Stopped) {
        tracing::info!(
            queued = pool.queued(),
            "stopping: answering the queued requests"
        );
        tokio::select! {
            ended = &mut answering => log_summary(ended),
            _ = stopped(stop, 2) => tracing::warn!("stopping at once; queued requests get no answer"),
        }
        return End::Stopped;
    }
    // The answers still being computed go out on this Answer stream while it lasts.
    tokio::spawn(async move { log_summary(answering.await) });
    end
}

type Answered = Result<Result<AnswerSummary, Status>, tokio::task::JoinError>;

fn log_summary(ended: Answered) {
    match ended {
        Ok(Ok(summary)) => tracing::info!(
            delivered = summary.delivered,
            undeliverable = summary.undeliverable,
            acknowledged = summary.acknowledged,
            "the Answer stream closed"
        ),
        Ok(Err(status)) => tracing::warn!(
            code = %status.code(),
            message = status.message(),
            "the Answer stream failed"
        ),
        Err(e) => tracing::warn!(error = %e, "the Answer task failed"),
    }
}

/// Acknowledges `request` and queues its computation, or sheds it with the overloaded answer.
/// False when the Answer stream is gone.
async fn take(
    request: CloakedRequest,
    provider: &Arc<PoiProvider>,
    pool: &Pool,
    answers: &mpsc::Sender<LbsAnswer>,
    tally: &mut Tally,
) -> bool {
    tally.received += 1;
    let Ok(permit) = answers.reserve().await else {
        return false;
    };
    let pseudonym = request.pseudonym.clone();
    if pool.is_full() {
        tally.shed += 1;
        if tally.shed.is_power_of_two() {
            tracing::warn!(
                shed = tally.shed,
                queued = pool.queued(),
                "the worker queue is full: answering overloaded"
            );
        }
        permit.send(LbsAnswer {
            pseudonym,
            payload: overloaded(pool.queued(), pool.threads(), provider.max_payload_bytes),
            ack: false,
        });
        return true;
    }
    // The acknowledgement goes out before the job exists, so before its answer.
    permit.send(LbsAnswer {
        pseudonym: pseudonym.clone(),
        payload: Vec::new(),
        ack: true,
    });
    let shed = pseudonym.clone();
    let job = {
        let provider = Arc::clone(provider);
        let answers = answers.clone();
        Box::new(move || {
            let payload = provider.answer(&request);
            // A closed Answer stream (the session is over) drops the answer.
            let _ = answers.blocking_send(LbsAnswer {
                pseudonym,
                payload,
                ack: false,
            });
        })
    };
    if pool.try_submit(job).is_err() {
        // Not reached with one submitter (the queue had room); answered rather than lost.
        tally.shed += 1;
        let payload = overloaded(pool.queued(), pool.threads(), provider.max_payload_bytes);
        let answer = LbsAnswer {
            pseudonym: shed,
            payload,
            ack: false,
        };
        return answers.send(answer).await.is_ok();
    }
    true
}
