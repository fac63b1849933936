//! The gRPC handlers of `LocationBroker` and `LbsGateway`: they read client and provider streams,
//! validate, and talk to the broker actor over its command channel.
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use futures::{Stream, StreamExt};
use tokio::sync::{mpsc, oneshot};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::location::Pseudonym;
use crate::proto::lbs_gateway_server::LbsGateway;
use crate::proto::location_broker_server::LocationBroker;
use crate::proto::{
    AnswerSummary, CloakedRequest, LbsAnswer, LbsSubscription, LocationEvent, LocationRequest,
};
use crate::service::StreamSlot;

use super::LocationServices;
use super::broker::{AnswerTally, Command};
use super::validate::{Rejection, validate};
use crate::auth::Caller;

fn broker_gone() -> Status {
    Status::unavailable("the location broker is shutting down")
}

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
        let slot = self.client_streams.acquire()?;
        let client = self.next_client.fetch_add(1, Ordering::Relaxed);
        let (events, event_rx) = mpsc::channel(self.cfg.client_queue);
        self.commands
            .send(Command::Open {
                client,
                events,
                principal: Arc::from(principal.name.as_str()),
                rate_limited: !principal.is_anonymous(),
            })
            .await
            .map_err(|_| broker_gone())?;
        let mut inbound = request.into_inner();
        let commands = self.commands.clone();
        let cfg = Arc::clone(&self.cfg);
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
                        let request_no = req.request_no;
                        let admitted = validate(req, &cfg).and_then(|request| {
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
                            Ok(request) => Command::Submit { client, request },
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
                    Err(_) => {
                        let _ = commands.send(Command::Gone { client }).await;
                        break;
                    }
                };
                if commands.send(command).await.is_err() {
                    break;
                }
            }
        });
        Ok(Response::new(Box::pin(SlotStream {
            inner: ReceiverStream::new(event_rx),
            _slot: slot,
        })))
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
        let Some(index) = self.cfg.services.iter().position(|s| *s == service) else {
            return Err(Status::invalid_argument(format!(
                "service: unknown service {service:?}; this broker serves {:?}",
                self.cfg.services
            )));
        };
        principal
            .check_service(&service)
            .map_err(|denial| denial.into_status())?;
        let principal_slot = self
            .provider_streams_per_principal
            .acquire(&principal.name)?;
        let slot = self.provider_streams.acquire()?;
        let queue = self.provider_receivers[index].clone();
        let commands = self.commands.clone();
        let name: Arc<str> = Arc::from(principal.name.as_str());
        // Each request is bound to this principal before it leaves the broker, so only this
        // principal's answers for it are routed.
        let delivered = Box::pin(queue).then(move |cloaked| {
            let commands = commands.clone();
            let principal = Arc::clone(&name);
            async move {
                if let Ok(pseudonym) = cloaked.pseudonym.parse::<Pseudonym>() {
                    let _ = commands
                        .send(Command::Delivered {
                            pseudonym,
                            principal,
                        })
                        .await;
                }
                Ok(cloaked)
            }
        });
        Ok(Response::new(Box::pin(SlotStream {
            inner: Box::pin(delivered),
            _slot: (slot, principal_slot),
        })))
    }

    async fn answer(
        &self,
        request: Request<Streaming<LbsAnswer>>,
    ) -> Result<Response<AnswerSummary>, Status> {
        let principal = Caller::of(&request)?;
        let name: Arc<str> = Arc::from(principal.name.as_str());
        let mut inbound = request.into_inner();
        let tally = Arc::new(AnswerTally::default());
        let mut failure = None;
        loop {
            if tally.denied.load(Ordering::Relaxed) > 0 {
                // A refused answer ends the stream (the summary below says why).
                break;
            }
            match inbound.message().await {
                Ok(Some(answer)) => {
                    let pseudonym = match answer.pseudonym.parse::<Pseudonym>() {
                        Ok(p) if answer.pseudonym.len() == 32 => p,
                        _ => {
                            failure = Some(Status::invalid_argument(format!(
                                "pseudonym: must be 32 hex digits as received in CloakedRequest (got {:?})",
                                answer.pseudonym
                            )));
                            break;
                        }
                    };
                    if answer.payload.len() > self.cfg.max_payload_bytes {
                        failure = Some(Status::invalid_argument(format!(
                            "payload: must be at most {} bytes (got {})",
                            self.cfg.max_payload_bytes,
                            answer.payload.len()
                        )));
                        break;
                    }
                    self.commands
                        .send(Command::Answer {
                            pseudonym,
                            payload: answer.payload,
                            tally: Arc::clone(&tally),
                            principal: Arc::clone(&name),
                        })
                        .await
                        .map_err(|_| broker_gone())?;
                }
                Ok(None) => break,
                Err(status) => return Err(status),
            }
        }
        // Every answer sent so far is routed before the summary (or the error) is returned.
        let (done, wait) = oneshot::channel();
        self.commands
            .send(Command::Sync { done })
            .await
            .map_err(|_| broker_gone())?;
        wait.await.map_err(|_| broker_gone())?;
        if let Some(status) = failure {
            return Err(status);
        }
        let denied = tally.denied.load(Ordering::Relaxed);
        if denied > 0 {
            return Err(Status::permission_denied(format!(
                "pseudonym: {denied} answers were for pseudonyms principal {:?} did not receive; an answer is accepted only from the principal whose Subscribe stream received the pseudonym",
                principal.name
            )));
        }
        Ok(Response::new(AnswerSummary {
            delivered: tally.delivered.load(Ordering::Relaxed),
            undeliverable: tally.undeliverable.load(Ordering::Relaxed),
        }))
    }
}
