//! One-sided operations as request and reply messages.
//!
//! Three users: the message-logging protocols (`pessimistic`, `ulml`,
//! `correlated`), `chandy-lamport` (whose markers must be ordered with
//! every access on the FIFO channels, 000 §III-B and §IV), and the
//! request-based operations of every protocol (`Window::immediate_get` and
//! friends, MPI's `MPI_Rget`/`MPI_Rput`: a GET is a read request on the
//! channel to the target and a response on the channel back, so a GET whose
//! response has not arrived is observable). The target's engine applies
//! requests in arrival order whenever it makes progress, as an MPI
//! library's progress engine does where the network cannot.
//!
//! Under message logging only the dead ranks roll back, so a restored
//! window must get back every access survivors made to it since its
//! checkpoint, in the order they were applied, and a re-executing origin
//! must neither apply its accesses to survivors' windows a second time nor
//! see other results than the first time (003 §3.2 and §4.2: combining
//! accesses such as compare-and-swap or fetch-and-op cannot be replayed
//! blindly). Rather than a second logging mechanism beside the message log,
//! one-sided operations travel as messages on a context of their own:
//! - the origin sends a request (a sequenced application message, so it is
//!   kept in the origin's payload log by reference, like any other) and
//!   waits for the reply (also sequenced and logged, by the target);
//! - the target's engine applies requests to its window in arrival order.
//!   That order across origins is nondeterministic, so each application is
//!   a reception with a [`Determinant`](crate::protocol::Determinant) that
//!   records the origin's SSN and where it fell among the target's own
//!   operations (`at`), and the reply leaves only once the determinant is
//!   stored (the pessimistic condition);
//! - a restored target re-applies the resent requests exactly where the
//!   determinants say, so its window, its lock state and the replies it
//!   re-sends are those of the first execution (003 §4.1's orders are kept
//!   by recording the actual target-side order, which also covers accesses
//!   that are not access-deterministic);
//! - a re-executing origin's requests are withheld as duplicates (the
//!   target's HSR) and the logged replies are resent to it, so every access
//!   is applied exactly once (003 §4.2) with no fallback to a global
//!   rollback.
//!
//! The position `at` counts the rank's operations that can observe or
//! order accesses to its window: sends of sequenced messages (a reply's SSN
//! depends on what the target sent before it), window creation and free,
//! local window accesses and accesses to its own window, and safe points.
//! Receives are not counted: their outcome is fixed by SSNs and
//! determinants.

use bytes::Bytes;

use super::frame::ContextId;
use super::{
    Engine, MatchSpec, RMA_CONTEXT, RMA_REPLY, RMA_REQUEST, ReqId, RmaAfter, RmaOutcome,
    RmaRequest, WinLocal,
};
use crate::driver::shared::apply_to_memory;
use crate::driver::{LockType, RmaOp, RmaReply, WinId};
use crate::protocol::Event;
use crate::{Error, Rank, Result};

impl Engine {
    /// Begin an operation that orders accesses to this rank's windows. In a
    /// replay, the requests the log places before it are applied first
    /// (waiting for their resent messages if need be).
    pub(super) fn op_begin(&mut self) -> Result<()> {
        if !self.logging {
            return Ok(());
        }
        while self.replay_due() {
            self.check()?;
            self.serve_rma()?;
            if self.replay_due() {
                self.progress(None)?;
            }
        }
        self.ops += 1;
        Ok(())
    }

    /// Whether the replay holds a request to apply at or before the current
    /// operation.
    fn replay_due(&self) -> bool {
        self.replay
            .iter()
            .find_map(|d| d.at)
            .is_some_and(|at| at <= self.ops)
    }

    /// Apply the requests that may be applied now: in a replay, the one the
    /// next determinant names (once due); otherwise every request arrived,
    /// in arrival order. A request for a window not (yet) re-created waits.
    pub(super) fn serve_rma(&mut self) -> Result<()> {
        if self.serving_rma
            || self.rma_inbox.is_empty()
            || self.recovering
            || self.interrupt.is_some()
        {
            return Ok(());
        }
        self.serving_rma = true;
        let r = self.serve_requests();
        self.serving_rma = false;
        r
    }

    fn serve_requests(&mut self) -> Result<()> {
        loop {
            self.check()?;
            // Between the protocol's decision to capture (a set's
            // checkpoint, agreed with its peers) and the snapshot, nothing
            // may change the window: the decision can arrive while a reply
            // waits to leave, and a request applied after it would be in
            // this rank's checkpoint but after the cut in its origin's.
            if self.capture_due.is_some() {
                return Ok(());
            }
            let next = match self.replay.front() {
                Some(d) => match d.at {
                    Some(at) if at <= self.ops => self
                        .rma_inbox
                        .iter()
                        .position(|m| m.envelope.src == d.src && m.ssn == d.ssn),
                    // A wildcard reception, or a later operation, comes first.
                    _ => None,
                },
                // A request the log does not place is applied only once the
                // re-execution has regenerated every message receivers
                // already have: its reply takes the next SSN, which must
                // not be one of theirs.
                None if self.proto.regenerating(&self.ssn_out) => None,
                None => self.unplaced_ready()?,
            };
            let Some(i) = next else {
                return Ok(());
            };
            let request: RmaRequest =
                postcard::from_bytes(&self.rma_inbox[i].payload).map_err(|e| Error::Codec {
                    what: "one-sided request".into(),
                    detail: format!("from rank {}: {e}", self.rma_inbox[i].envelope.src),
                })?;
            if !self.windows.contains_key(&request.window) {
                return Ok(());
            }
            let Some(msg) = self.rma_inbox.remove(i) else {
                return Ok(());
            };
            let origin = msg.envelope.src;
            if self.watch_sends && self.proto.refuses_request(origin) {
                // Peek-and-get (000 §IV-B): not served now; the origin
                // issues it again once it has entered the wave.
                self.send_message(origin, RMA_CONTEXT, RMA_REPLY, Bytes::new(), true)?;
                continue;
            }
            let outcome = match request.op {
                RmaOp::TryLock(kind) => self.lock_or_wait(request.window, origin, kind),
                op => Some(self.apply_own(request.window, op)),
            };
            let replayed = self.pop_determinant();
            self.rsn += 1;
            if self.logging {
                self.handle(Event::AppDeliver {
                    msg: &msg,
                    rsn: self.rsn,
                    applied_at: Some(self.ops),
                    replayed,
                })?;
            }
            if let Some(outcome) = outcome {
                self.send_outcome(origin, &outcome)?;
            }
            self.grant_waiting(request.window)?;
            if replayed {
                self.rematch_replay();
            }
        }
    }

    /// Whether world rank `rank` is a member of the communicator whose
    /// collective context is `context`.
    fn member_of(&self, context: ContextId, rank: Rank) -> bool {
        // A communicator's collective context follows its point-to-point
        // one; the world's is 1.
        let base = context.saturating_sub(1);
        if base == 0 {
            return true;
        }
        (self.communicators.iter())
            .any(|(b, group)| *b == base && group.as_ref().is_some_and(|g| g.contains(&rank)))
    }

    /// The first request in arrival order that may be applied where the log
    /// places nothing: one whose origin's collectives run ahead of this
    /// rank's ([`RmaAfter`]) waits until this rank has entered them, and so
    /// do the later requests of the same origin (each origin's accesses are
    /// applied in its order).
    fn unplaced_ready(&self) -> Result<Option<usize>> {
        let mut waiting: Vec<Rank> = Vec::new();
        for (i, m) in self.rma_inbox.iter().enumerate() {
            let src = m.envelope.src;
            if waiting.contains(&src) {
                continue;
            }
            let (after, _) =
                postcard::take_from_bytes::<RmaAfter>(&m.payload).map_err(|e| Error::Codec {
                    what: "one-sided request".into(),
                    detail: format!("from rank {src}: {e}"),
                })?;
            let entered = |&(context, index): &(u64, u64)| {
                self.coll_seq.get(&context).is_some_and(|&n| n >= index)
            };
            if after.iter().all(entered) {
                return Ok(Some(i));
            }
            waiting.push(src);
        }
        Ok(None)
    }

    /// Send a request's outcome back to its origin (a sequenced message,
    /// logged by this target like any other).
    fn send_outcome(&mut self, origin: Rank, outcome: &RmaOutcome) -> Result<()> {
        let reply = postcard::to_allocvec(outcome)?;
        self.send_message(origin, RMA_CONTEXT, RMA_REPLY, Bytes::from(reply), true)
    }

    /// A lock request from `origin`: granted now (`Some`) when the lock is
    /// free and nobody waits before it, else queued (`None`) until an
    /// unlock frees it ([`Self::grant_waiting`]). Queued in arrival order,
    /// so a writer is not starved by a stream of readers.
    fn lock_or_wait(&mut self, id: WinId, origin: Rank, kind: LockType) -> Option<RmaOutcome> {
        let Some(w) = self.windows.get_mut(&id) else {
            return Some(Err(format!("rank {} has no window {id}", self.rank)));
        };
        if w.state.waiting.is_empty() && take_lock(&mut w.state, kind) {
            return Some(Ok(RmaReply::Granted(true)));
        }
        w.state.waiting.push_back((origin, kind));
        None
    }

    /// Grant the queued lock requests that the lock state now allows, in
    /// order, each with its (deferred) reply. Called after every applied
    /// request and local access, in the same places in a replay, so the
    /// grants and their SSNs are those of the first execution.
    fn grant_waiting(&mut self, id: WinId) -> Result<()> {
        loop {
            let Some(w) = self.windows.get_mut(&id) else {
                return Ok(());
            };
            let Some(&(origin, kind)) = w.state.waiting.front() else {
                return Ok(());
            };
            if !take_lock(&mut w.state, kind) {
                return Ok(());
            }
            w.state.waiting.pop_front();
            // Part of the operation that freed the lock: not an operation
            // of its own in the order of accesses (`op_begin`).
            let serving = std::mem::replace(&mut self.serving_rma, true);
            let sent = self.send_outcome(origin, &Ok(RmaReply::Granted(true)));
            self.serving_rma = serving;
            sent?;
        }
    }

    /// Apply `op` to this rank's own window `id`; lock operations use the
    /// engine's lock state (checkpointed with the window).
    fn apply_own(&mut self, id: WinId, op: RmaOp) -> RmaOutcome {
        let w: &mut WinLocal = self
            .windows
            .get_mut(&id)
            .ok_or_else(|| format!("rank {} has no window {id}", self.rank))?;
        match op {
            // This rank's own lock: not queued (it retries, see
            // `Engine::acquire`), and behind the ranks already waiting.
            RmaOp::TryLock(kind) => Ok(RmaReply::Granted(
                w.state.waiting.is_empty() && take_lock(&mut w.state, kind),
            )),
            RmaOp::Unlock(LockType::Shared) => {
                w.state.readers = w.state.readers.saturating_sub(1);
                Ok(RmaReply::Done)
            }
            RmaOp::Unlock(LockType::Exclusive) => {
                w.state.writer = false;
                Ok(RmaReply::Done)
            }
            op => {
                let mut outcome = Err(String::new());
                let r = self.ep.with_local_window(id, &mut |mem| {
                    outcome = apply_to_memory(mem, id, op.clone()).map_err(|e| match e {
                        Error::Rma { detail, .. } => detail,
                        e => e.to_string(),
                    });
                });
                r.map_err(|e| e.to_string())?;
                outcome
            }
        }
    }

    /// A one-sided operation as messages: applied at once to this rank's
    /// own window, else sent as a request to `target`, whose reply is
    /// awaited (arrivals, including requests to this rank, are handled
    /// meanwhile).
    pub(super) fn rma_by_message(
        &mut self,
        id: WinId,
        target: Rank,
        op: RmaOp,
    ) -> Result<RmaReply> {
        let outcome = if target == self.rank {
            self.rma_own(id, op)?
        } else {
            self.round_trip(id, target, op)?
        };
        outcome.map_err(|detail| Error::Rma { window: id, detail })
    }

    /// An operation on this rank's own window, applied now (an operation
    /// in the order of accesses).
    pub(super) fn rma_own(&mut self, id: WinId, op: RmaOp) -> Result<RmaOutcome> {
        self.op_begin()?;
        let outcome = self.apply_own(id, op);
        self.grant_waiting(id)?;
        Ok(outcome)
    }

    /// Send `op` to `target` as a request (000 §III-B: a GET is a read
    /// request on the channel to the target and a response on the channel
    /// back; a PUT completes when the target's acknowledgement arrives) and
    /// post the receive of its reply: the returned request. Replies come
    /// back in the order of the requests (FIFO channels, applied in
    /// arrival order), which is the order receives of the same source and
    /// tag match in.
    pub(super) fn send_request(&mut self, id: WinId, target: Rank, op: RmaOp) -> Result<ReqId> {
        let after = (self.coll_synced.iter())
            .filter(|&(&context, _)| self.member_of(context, target))
            .map(|(&context, &index)| (context, index))
            .collect();
        let request = postcard::to_allocvec(&RmaRequest {
            after,
            window: id,
            op,
        })?;
        self.send_message(target, RMA_CONTEXT, RMA_REQUEST, Bytes::from(request), true)?;
        self.post_receive(MatchSpec {
            context: RMA_CONTEXT,
            source: Some(target),
            tag: Some(RMA_REPLY),
        })
    }

    /// Send `op` to `target` and wait for its outcome, issuing it again
    /// while the target refuses it.
    pub(super) fn round_trip(&mut self, id: WinId, target: Rank, op: RmaOp) -> Result<RmaOutcome> {
        loop {
            let reply = self.send_request(id, target, op.clone())?;
            if let Some(outcome) = self.await_reply(target, reply)? {
                return Ok(outcome);
            }
        }
    }

    /// Wait for the reply `reply` of a request sent to `target`; `None`:
    /// the target refused the request ([`super::is_refusal`]), which must
    /// be issued again.
    pub(super) fn await_reply(&mut self, target: Rank, reply: ReqId) -> Result<Option<RmaOutcome>> {
        let msg = self.wait_entered(reply)?;
        if msg.payload.is_empty() {
            return Ok(None);
        }
        decode_reply(target, &msg.payload).map(Some)
    }
}

/// The outcome a reply from `target` carries.
fn decode_reply(target: Rank, payload: &[u8]) -> Result<RmaOutcome> {
    postcard::from_bytes::<RmaOutcome>(payload).map_err(|e| Error::Codec {
        what: "one-sided reply".into(),
        detail: format!("from rank {target}: {e}"),
    })
}

/// Take a lock of `kind` on this rank's window if its state allows it.
fn take_lock(state: &mut super::WindowState, kind: LockType) -> bool {
    crate::driver::shared::take_lock(&mut state.readers, &mut state.writer, kind)
}
