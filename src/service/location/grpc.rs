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
    PositionUpdate, ReportSummary,
};
use crate::service::StreamSlot;

use super::LocationServices;
use super::broker::{AnswerTally, Command};
use super::validate::{validate, validate_update};

/// Position updates handed to the broker actor at once, at most (whatever the stream has ready).
const REPORT_BATCH: usize = 512;

fn broker_gone() -> Status {
    Status::unavailable("the location broker is shutting down")
}

/// A response stream that holds its stream-limit place while it lives.
struct SlotStream<S> {
    inner: S,
    _slot: StreamSlot,
}

impl<S: Stream + Unpin> Stream for SlotStream<S> {
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
        let slot = self.client_streams.acquire()?;
        let client = self.next_client.fetch_add(1, Ordering::Relaxed);
        let (events, event_rx) = mpsc::channel(self.cfg.client_queue);
        self.commands
            .send(Command::Open { client, events })
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
                        match validate(req, &cfg) {
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

    async fn report(
        &self,
        request: Request<Streaming<PositionUpdate>>,
    ) -> Result<Response<ReportSummary>, Status> {
        // Authorization hook: no authentication layer exists yet. When it does, a mobile principal
        // may report only for its own user ids; apply its scope check to each update here, as for
        // Submit.
        let _slot = self.client_streams.acquire()?;
        let mut inbound = request.into_inner().ready_chunks(REPORT_BATCH);
        let mut accepted: u64 = 0;
        while let Some(chunk) = inbound.next().await {
            let mut updates = Vec::with_capacity(chunk.len());
            let mut failure = None;
            for message in chunk {
                match message.map(validate_update) {
                    Ok(Ok(update)) => updates.push(update),
                    Ok(Err(rejection)) => {
                        let position = accepted + updates.len() as u64;
                        failure = Some(rejection.into_report_status(position));
                        break;
                    }
                    Err(status) => {
                        failure = Some(status);
                        break;
                    }
                }
            }
            if !updates.is_empty() {
                let sent = updates.len() as u64;
                let (done, result) = oneshot::channel();
                self.commands
                    .send(Command::Report { updates, done })
                    .await
                    .map_err(|_| broker_gone())?;
                let result = result.await.map_err(|_| broker_gone())?;
                match result.refused {
                    None => accepted += sent,
                    Some(rejection) => {
                        accepted += result.applied as u64;
                        return Err(rejection.into_report_status(accepted));
                    }
                }
            }
            if let Some(status) = failure {
                return Err(status);
            }
        }
        Ok(Response::new(ReportSummary { accepted }))
    }
}

#[tonic::async_trait]
impl LbsGateway for LocationServices {
    type SubscribeStream = CloakedStream;

    async fn subscribe(
        &self,
        request: Request<LbsSubscription>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let service = request.into_inner().service;
        let Some(index) = self.cfg.services.iter().position(|s| *s == service) else {
            return Err(Status::invalid_argument(format!(
                "service: unknown service {service:?}; this broker serves {:?}",
                self.cfg.services
            )));
        };
        let slot = self.provider_streams.acquire()?;
        let queue = self.provider_receivers[index].clone();
        Ok(Response::new(Box::pin(SlotStream {
            inner: Box::pin(queue).map(Ok),
            _slot: slot,
        })))
    }

    async fn answer(
        &self,
        request: Request<Streaming<LbsAnswer>>,
    ) -> Result<Response<AnswerSummary>, Status> {
        let mut inbound = request.into_inner();
        let tally = Arc::new(AnswerTally::default());
        let mut failure = None;
        loop {
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
        Ok(Response::new(AnswerSummary {
            delivered: tally.delivered.load(Ordering::Relaxed),
            undeliverable: tally.undeliverable.load(Ordering::Relaxed),
        }))
    }
}
