//! One provider's Subscribe stream: takes cloaked requests off its service's shared queue while it
//! holds fewer than `location.provider_window` unacknowledged ones, tells the broker which stream took
//! each request (so the broker can wait for its acknowledgement, `location.provider_ack_ms`), and ends
//! with the status the broker sends when it closes the stream (a provider that stopped acknowledging).
//!
//! Invariants: the broker hears of a stream (`ProviderOpen`) before any request it takes
//! (`Delivered`), and of its end (`ProviderGone`, sent when the stream is dropped) after all of them,
//! so every request a stream took is either acknowledged or handed on by the broker. The window count
//! is raised here when a request is taken and lowered only by the broker (acknowledgement, answer, or
//! the request handed on), so a stream that never acknowledges takes at most the window. A stream
//! takes whatever its queue holds at once (up to the window), reports it in one `Delivered`, and then
//! hands it out in order; what it took and had not handed out when it ends is handed on like the rest.
use std::collections::VecDeque;
use std::sync::Arc;

use futures::Stream;
use tokio::sync::{mpsc, oneshot};

use crate::proto::CloakedRequest;

use super::message::{Command, ProviderId, ProviderWindow, StreamEnd};
use super::provider_queues::{Queued, RequestQueue};

/// Tells the broker the stream ended when it is dropped (the provider went away, or the stream was
/// closed), so the requests it has not acknowledged are handed on.
struct ProviderGuard {
    provider: ProviderId,
    commands: mpsc::Sender<Command>,
}

impl Drop for ProviderGuard {
    fn drop(&mut self) {
        let gone = Command::ProviderGone {
            provider: self.provider,
        };
        if let Err(mpsc::error::TrySendError::Full(gone)) = self.commands.try_send(gone)
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            let commands = self.commands.clone();
            runtime.spawn(async move {
                let _ = commands.send(gone).await;
            });
        }
    }
}

/// What a provider stream needs besides its queue.
pub(crate) struct ProviderStream {
    pub(crate) provider: ProviderId,
    pub(crate) principal: Arc<str>,
    pub(crate) window: Arc<ProviderWindow>,
    pub(crate) window_limit: usize,
    /// The status the broker closes the stream with.
    pub(crate) close: oneshot::Receiver<StreamEnd>,
    pub(crate) commands: mpsc::Sender<Command>,
}

struct State {
    stream: ProviderStream,
    queue: RequestQueue,
    /// Requests taken (and reported `Delivered`) but not yet handed to the stream.
    taken: VecDeque<Queued>,
    _guard: ProviderGuard,
    ended: bool,
}

/// Most requests a stream takes off its queue at once (one `Delivered` command for all of them).
const TAKE_BATCH: usize = 256;

impl ProviderStream {
    /// The response stream of Subscribe over the service's `queue`.
    pub(crate) fn into_stream(
        self,
        queue: RequestQueue,
    ) -> impl Stream<Item = Result<CloakedRequest, StreamEnd>> + Send + 'static {
        let guard = ProviderGuard {
            provider: self.provider,
            commands: self.commands.clone(),
        };
        let state = State {
            stream: self,
            queue,
            taken: VecDeque::new(),
            _guard: guard,
            ended: false,
        };
        futures::stream::unfold(state, |mut state| async move {
            if state.ended {
                return None;
            }
            if let Some(cloaked) = state.taken.pop_front() {
                // A close from the broker still ends the stream first.
                return match state.stream.close.try_recv() {
                    Err(oneshot::error::TryRecvError::Empty) => Some((Ok(owned(cloaked)), state)),
                    Ok(end) => {
                        state.ended = true;
                        Some((Err(end), state))
                    }
                    Err(oneshot::error::TryRecvError::Closed) => None,
                };
            }
            let s = &mut state.stream;
            // Wait for room in the window, then for a request; the broker may close the stream meanwhile.
            let taken = tokio::select! {
                biased;
                closed = &mut s.close => Err(closed.ok()),
                taken = async {
                    s.window.room(s.window_limit).await;
                    state.queue.take().await
                } => Ok(taken),
            };
            let cloaked = match taken {
                Ok(Some(cloaked)) => cloaked,
                // The daemon is shutting down and the queue is drained.
                Ok(None) => return None,
                Err(Some(end)) => {
                    state.ended = true;
                    return Some((Err(end), state));
                }
                Err(None) => return None,
            };
            s.window.take();
            // Whatever else is queued already, while the window has room: one command for all.
            while state.taken.len() + 1 < TAKE_BATCH && s.window.has_room(s.window_limit) {
                let Some(more) = state.queue.try_take() else {
                    break;
                };
                s.window.take();
                state.taken.push_back(more);
            }
            let pseudonyms = std::iter::once(&cloaked)
                .chain(state.taken.iter())
                .map(|q| q.pseudonym)
                .collect();
            let _ = s
                .commands
                .send(Command::Delivered {
                    pseudonyms,
                    principal: Arc::clone(&s.principal),
                    provider: s.provider,
                })
                .await;
            Some((Ok(owned(cloaked)), state))
        })
    }
}

/// The request to encode: the broker's route still holds it until it is acknowledged, so this is
/// the one copy of a forwarded request, made on the stream's task rather than on the broker's.
fn owned(cloaked: Queued) -> CloakedRequest {
    Arc::unwrap_or_clone(cloaked.request)
}
