//! The gRPC handlers of `LocationBroker` and `LbsGateway`: they read client and provider streams,
//! validate, and talk to the broker actor over its command channel.
//!
//! Request streams are always drained: a reader never waits on the broker (a full command queue
//! rejects that one request with RESOURCE_EXHAUSTED), so HTTP/2 never buffers frames the daemon does
//! not read, and one stalled stream cannot make the connection's frame budget run out for the others.
//! A broken request stream (oversized or undecodable message) ends the event stream with its status
//! after every request already accepted has had its outcome.
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::connections::StreamSlot;
use crate::location::Pseudonym;
use crate::proto::lbs_gateway_server::LbsGateway;
use crate::proto::location_broker_server::LocationBroker;
use crate::proto::{
    AnswerSummary, CloakedRequest, LbsAnswer, LbsSubscription, LocationEvent, LocationRequest,
    PositionUpdate, ReportSummary,
};
use crate::service::{InboundError, drain};

use super::LocationServices;
use super::error::LocationError;
use super::validate::{Rejection, validate, validate_update};
use crate::broker::message::{AnswerTally, Command, EventQueue, ProviderWindow, StreamEnd};
use crate::broker::provider_stream::ProviderStream;

/// Position updates handed to the broker actor at once, at most (whatever the stream has ready).
const REPORT_BATCH: usize = 512;
/// Answers handed to the broker actor at once, at most (whatever the stream has ready).
const ANSWER_BATCH: usize = 512;
use crate::auth::Caller;

/// A response stream that holds its stream-limit place while it lives.
struct SlotStream<S, G = StreamSlot> {
    inner: S,
    _slot: G,
}

impl<S: Stream + Unpin, G: Unpin> Stream for SlotStream<S, G> {
    type Item = S::Item;
    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }
}

/// The status of a stream the broker ended (the service's one mapping, [`LocationError`]).
fn ended(end: StreamEnd) -> Status {
    LocationError::Ended(end).into()
}

type EventStream = Pin<Box<dyn Stream<Item = Result<LocationEvent, Status>> + Send>>;
type CloakedStream = Pin<Box<dyn Stream<Item = Result<CloakedRequest, Status>> + Send>>;

#[tonic::async_trait]
impl LocationBroker for LocationServices {
    type SubmitStream = EventStream;

    async fn submit(
        &self,
        request: Request<Streaming<LocationRequest>>,
    ) -> Result<Response<Self::SubmitStream>, Status> {
        let principal = Caller::of(&request)?;
        let slot = self.client_streams.acquire().map_err(LocationError::from)?;
        let client = self.next_client.fetch_add(1, Ordering::Relaxed);
        let (events, event_rx) = EventQueue::channel(self.cfg.borrow().client_queue);
        self.commands
            .send(Command::Open {
                client,
                events: events.clone(),
                principal: Arc::from(principal.name.as_str()),
                rate_limited: !principal.is_anonymous(),
            })
            .await
            .map_err(|_| LocationError::ShuttingDown)?;
        let mut inbound = request.into_inner();
        let commands = self.commands.clone();
        let cfg = self.cfg.clone();
        let provider_queues = Arc::clone(&self.provider_queues);
        let max_message_bytes = self.max_message_bytes;
        let mut stop = self.stop.clone();
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    message = inbound.message() => message,
                    // At shutdown stop reading, so the stream (and its connection) can close.
                    _ = stop.wait_for(|stop| *stop) => break,
                };
                let command = match message {
                    Ok(Some(req)) => {
                        if events.is_closed() {
                            // The event stream is over; keep draining so HTTP/2 buffers nothing.
                            continue;
                        }
                        let received = std::time::Instant::now();
                        let request_no = req.request_no;
                        // The configuration in force now (a reload applies from the next request).
                        let admitted =
                            validate(req, &cfg.borrow(), &provider_queues).and_then(|request| {
                                principal
                                    .check_user_id(&request.user_id)
                                    .map(|()| request)
                                    .map_err(|denial| {
                                        denial.record();
                                        Rejection {
                                            field: denial.field,
                                            reason: format!(
                                                "principal {:?} may not {} ({})",
                                                denial.principal, denial.action, denial.rule
                                            ),
                                            code: tonic::Code::PermissionDenied,
                                        }
                                    })
                            });
                        match admitted {
                            Ok(request) => Command::Submit {
                                client,
                                request,
                                received,
                            },
                            Err(rejection) => Command::Reject {
                                client,
                                request_no,
                                rejection,
                            },
                        }
                    }
                    Ok(None) => {
                        let _ = commands.send(Command::InboundClosed { client }).await;
                        break;
                    }
                    Err(status) => {
                        let error = InboundError::classify(&status, max_message_bytes);
                        let command = match error {
                            InboundError::Transport { .. } => Command::Gone { client },
                            error => Command::InboundFailed {
                                client,
                                status: LocationError::from(error).into(),
                            },
                        };
                        let _ = commands.send(command).await;
                        break;
                    }
                };
                let request_no = match &command {
                    Command::Submit { request, .. } => request.request_no,
                    Command::Reject { request_no, .. } => *request_no,
                    _ => continue,
                };
                match commands.try_send(command) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        let overloaded = LocationError::Overloaded {
                            queue: commands.max_capacity(),
                            what: "the request was",
                        };
                        let rejection = Rejection::exhausted("request_no", overloaded.to_string());
                        events.try_event(rejection.to_event(request_no));
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => break,
                }
            }
        });
        Ok(Response::new(Box::pin(SlotStream {
            inner: ReceiverStream::new(event_rx).map(|event| event.map_err(ended)),
            _slot: slot,
        })))
    }

    async fn report(
        &self,
        request: Request<Streaming<PositionUpdate>>,
    ) -> Result<Response<ReportSummary>, Status> {
        // A mobile principal reports only for its own user ids, as for Submit.
        let principal = Caller::of(&request)?;
        let _slot = self.client_streams.acquire().map_err(LocationError::from)?;
        let mut inbound = request.into_inner().ready_chunks(REPORT_BATCH);
        let mut accepted: u64 = 0;
        let mut failure: Option<LocationError> = None;
        while let Some(chunk) = inbound.next().await {
            let mut updates = Vec::with_capacity(chunk.len());
            for message in chunk {
                match message {
                    Ok(update) => match validate_update(update) {
                        Ok(update) => {
                            if let Err(denial) = principal.check_user_id(&update.user_id) {
                                failure = Some(denial.into());
                                break;
                            }
                            updates.push(update)
                        }
                        Err(rejection) => {
                            failure = Some(LocationError::UpdateRefused {
                                rejection,
                                applied: accepted + updates.len() as u64,
                            });
                            break;
                        }
                    },
                    Err(status) => {
                        match InboundError::classify(&status, self.max_message_bytes) {
                            InboundError::Transport { .. } => return Err(status),
                            error => failure = Some(error.into()),
                        }
                        break;
                    }
                }
            }
            if !updates.is_empty() {
                let sent = updates.len() as u64;
                let (done, result) = oneshot::channel();
                match self.commands.try_send(Command::Report { updates, done }) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        failure = Some(LocationError::Overloaded {
                            queue: self.commands.max_capacity(),
                            what: "these position updates and the ones after them were",
                        });
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        return Err(LocationError::ShuttingDown.into());
                    }
                }
                let result = result.await.map_err(|_| LocationError::ShuttingDown)?;
                match result.refused {
                    None => accepted += sent,
                    Some(rejection) => {
                        accepted += result.applied as u64;
                        failure = Some(LocationError::UpdateRefused {
                            rejection,
                            applied: accepted,
                        });
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if let Some(error) = failure {
            drain(inbound.into_inner());
            return Err(error.into());
        }
        Ok(Response::new(ReportSummary { accepted }))
    }
}

impl LocationServices {
    /// Checks one answer of an Answer stream: its pseudonym, its payload size, and that an
    /// acknowledgement carries no payload.
    fn admit_answer(
        &self,
        answer: LbsAnswer,
    ) -> Result<(Pseudonym, Option<Vec<u8>>), LocationError> {
        let pseudonym = match answer.pseudonym.parse::<Pseudonym>() {
            Ok(p) if answer.pseudonym.len() == 32 => p,
            _ => return Err(LocationError::InvalidPseudonym(answer.pseudonym)),
        };
        let max_payload_bytes = self.cfg.borrow().max_payload_bytes;
        if answer.payload.len() > max_payload_bytes {
            return Err(LocationError::PayloadTooLarge {
                limit: max_payload_bytes,
                got: answer.payload.len(),
            });
        }
        if answer.ack && !answer.payload.is_empty() {
            return Err(LocationError::AckWithPayload {
                got: answer.payload.len(),
            });
        }
        Ok((pseudonym, (!answer.ack).then_some(answer.payload)))
    }
}

#[tonic::async_trait]
impl LbsGateway for LocationServices {
    type SubscribeStream = CloakedStream;

    async fn subscribe(
        &self,
        request: Request<LbsSubscription>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let principal = Caller::of(&request)?;
        let service = request.into_inner().service;
        let services = self.cfg.borrow().services.clone();
        let queue = services
            .contains(&service)
            .then(|| self.provider_queues.get(&service))
            .flatten();
        let Some(queue) = queue else {
            return Err(LocationError::UnknownService { service, services }.into());
        };
        principal
            .check_service(&service)
            .map_err(LocationError::from)?;
        let principal_slot = self
            .provider_streams_per_principal
            .acquire(&principal.name)
            .map_err(LocationError::from)?;
        let slot = self
            .provider_streams
            .acquire()
            .map_err(LocationError::from)?;
        let Some(index) = self.provider_queues.index_of(&service) else {
            return Err(LocationError::UnknownService { service, services }.into());
        };
        let provider = self.next_provider.fetch_add(1, Ordering::Relaxed);
        let window = Arc::new(ProviderWindow::default());
        let (close, closed) = oneshot::channel();
        self.commands
            .send(Command::ProviderOpen {
                provider,
                service: index,
                window: Arc::clone(&window),
                close,
            })
            .await
            .map_err(|_| LocationError::ShuttingDown)?;
        // Each request is bound to this principal (and stream) before it leaves the broker, so only
        // this principal's answers for it are routed, and the broker waits for its acknowledgement.
        let stream = ProviderStream {
            provider,
            principal: Arc::from(principal.name.as_str()),
            window,
            window_limit: self.cfg.borrow().provider_window,
            close: closed,
            commands: self.commands.clone(),
        }
        .into_stream(queue.queue)
        .map(|request| request.map_err(ended));
        Ok(Response::new(Box::pin(SlotStream {
            inner: Box::pin(stream),
            _slot: (slot, principal_slot),
        })))
    }

    async fn answer(
        &self,
        request: Request<Streaming<LbsAnswer>>,
    ) -> Result<Response<AnswerSummary>, Status> {
        let principal = Caller::of(&request)?;
        let name: Arc<str> = Arc::from(principal.name.as_str());
        let mut inbound = request.into_inner().ready_chunks(ANSWER_BATCH);
        let tally = Arc::new(AnswerTally::default());
        let mut failure: Option<LocationError> = None;
        // Whatever the stream has read at once goes to the broker in one command.
        while let Some(chunk) = inbound.next().await {
            if tally.denied.load(Ordering::Relaxed) > 0 {
                // A refused answer ends the stream (the summary below says why).
                break;
            }
            let mut answers = Vec::with_capacity(chunk.len());
            for message in chunk {
                match message.map(|answer| self.admit_answer(answer)) {
                    Ok(Ok(answer)) => answers.push(answer),
                    Ok(Err(error)) => {
                        failure = Some(error);
                        break;
                    }
                    Err(status) => {
                        match InboundError::classify(&status, self.max_message_bytes) {
                            InboundError::Transport { .. } => return Err(status),
                            error => failure = Some(error.into()),
                        }
                        break;
                    }
                }
            }
            if !answers.is_empty() {
                let command = Command::Answers {
                    answers,
                    tally: Arc::clone(&tally),
                    principal: Arc::clone(&name),
                };
                match self.commands.try_send(command) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(_)) => {
                        failure = Some(LocationError::Overloaded {
                            queue: self.commands.max_capacity(),
                            what: "these answers and the ones after them were",
                        });
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        return Err(LocationError::ShuttingDown.into());
                    }
                }
            }
            if failure.is_some() {
                break;
            }
        }
        if failure.is_some() {
            drain(inbound.into_inner());
        }
        // Every answer sent so far is routed before the summary (or the error) is returned.
        let (done, wait) = oneshot::channel();
        self.commands
            .send(Command::Sync { done })
            .await
            .map_err(|_| LocationError::ShuttingDown)?;
        wait.await.map_err(|_| LocationError::ShuttingDown)?;
        if let Some(error) = failure {
            return Err(error.into());
        }
        let denied = tally.denied.load(Ordering::Relaxed);
        if denied > 0 {
            return Err(LocationError::AnswerNotReceived {
                denied,
                principal: principal.name.clone(),
            }
            .into());
        }
        Ok(Response::new(AnswerSummary {
            delivered: tally.delivered.load(Ordering::Relaxed),
            undeliverable: tally.undeliverable.load(Ordering::Relaxed),
            acknowledged: tally.acknowledged.load(Ordering::Relaxed),
        }))
    }
}
