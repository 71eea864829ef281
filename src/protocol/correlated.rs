//! Protocol `correlated`: correlated-set coordinated message logging
//! (004 §3, Bouteiller et al.).
//!
//! Ranks that share a failure domain die together anyway, so they
//! checkpoint and roll back together, while message logging keeps a failure
//! in one set from rolling back the others. A *correlated set* is a failure
//! domain of the placement (`--nodes K`), or, with `--sets N`, a group of N
//! consecutive ranks. With respect to a set, a message is *internal* (both
//! ends in it), *ingoing* or *outgoing* (004 §3.2).
//!
//! **Logging** is that of [`pessimistic`](super::pessimistic), built on it,
//! with one difference: the payload of an internal message is not copied
//! into the sender's log. Set checkpoints are coordinated, so no internal
//! message crosses the set's recovery line, and its payload is never needed
//! again. Determinants are logged for every nondeterministic reception,
//! internal ones included (004 Theorem 1: an outgoing message may depend on
//! the order of internal receptions). Here a determinant is the outcome of
//! a wildcard-source reception; a reception from a named source is fixed by
//! the program, since channels are FIFO and resent in SSN order.
//!
//! **Set checkpoints** follow the three phases of 004 §3.3, at the safe
//! point where the set's schedule (every `every`-th) or an agreed forced
//! checkpoint falls:
//! 1. *eager silence*: the rank sends a token on every channel to a
//!    correlated peer. It sends nothing more meanwhile: it is paused at its
//!    safe point (a send posted after the token waits for the end of the
//!    checkpoint). Channels are FIFO, so once a rank has every peer's token,
//!    every internal message sent to it before the checkpoint has arrived
//!    (the ones not yet matched are saved with its state, as the "unexpected"
//!    queue).
//! 2. *drain* (rendez-vous silence): every reception matched from a
//!    correlated peer must complete. It is immediate here: messages are
//!    whole frames, not fragments, and a safe point has no pending receive.
//! 3. a barrier (through the set's leader, its lowest rank), the capture of
//!    every member's piece, and a second barrier before anyone sends again.
//!
//! The time from entering the checkpoint to the first barrier is the set's
//! synchronisation time (the quantity of 004 Fig. 3), reported per rank.
//! A generation is committed by the set once every member's piece is
//! stored; only then are the senders' logs trimmed (ingoing messages) and
//! older pieces dropped. Sets checkpoint independently of each other. A log
//! budget forces a set checkpoint: the leader asks every member where it is
//! and names a safe point all can still reach.
//!
//! **Recovery.** A failure of any rank rolls its whole set back: the
//! survivors of the set roll back as well, every member (survivor or
//! replacement) asks its holders for its determinants, and the set's
//! leader decides the generation to restore: the newest any member knows
//! committed (every member's piece of it is stored), and the number of the
//! set's next checkpoint (above any member's, so that a survivor and a
//! fresh replacement number it alike and no new piece reuses the number of
//! an uncommitted one). Other sets keep their
//! progress; for them every member of the set is a recovering rank: they
//! resend logged ingoing messages above the HSR it restored, and suppress
//! duplicates it re-sends, exactly as for a replacement under
//! `pessimistic`. Internal messages need no resend: both ends restart from
//! the same coordinated checkpoint. Both ends replay, though: at its
//! restore each member tells every set peer the highest SSN of that peer's
//! messages its replay names, and a member applies no one-sided request its
//! own replay does not place before it has regenerated up to there, so
//! that a message a peer replays as a request is not re-sent as a reply.

use std::collections::{BTreeMap, BTreeSet};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::pessimistic::Pessimistic;
use super::{Action, Control, Event, Protocol, ProtocolCx};
use crate::driver::Stat;
use crate::engine::frame::postcard_append;
use crate::store::PieceWriter;
use crate::topology::Placement;
use crate::{Rank, Result};

/// How ranks are grouped into correlated sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SetRule {
    /// One set per failure domain of the placement (`--nodes K`).
    #[default]
    FailureDomains,
    /// Sets of this many consecutive ranks (`--sets N`; the last may be
    /// smaller).
    Consecutive(usize),
}

impl SetRule {
    /// The set of `rank`.
    pub fn set_of(self, placement: &Placement, rank: Rank) -> usize {
        match self {
            SetRule::FailureDomains => placement.node_of(rank),
            SetRule::Consecutive(n) => rank / n.max(1),
        }
    }

    /// The ranks of `set`, ascending. Both rules give blocks of consecutive
    /// ranks, so a set is a range: no rank holds a table of every rank's
    /// set (P entries on each of P ranks, most of a large simulation's
    /// memory, issue 38).
    pub fn members(self, placement: &Placement, set: usize) -> std::ops::Range<Rank> {
        match self {
            SetRule::FailureDomains => placement.range_on(set),
            SetRule::Consecutive(n) => {
                let n = n.max(1);
                let ranks = placement.ranks();
                let start = set.saturating_mul(n).min(ranks);
                start..start.saturating_add(n).min(ranks)
            }
        }
    }
}

/// The ranks of the sets of `dead` under `rule` over `placement`, ascending.
pub(crate) fn rolled_back_with(rule: SetRule, placement: &Placement, dead: &[Rank]) -> Vec<Rank> {
    let sets: BTreeSet<usize> = dead
        .iter()
        .filter(|&&d| d < placement.ranks())
        .map(|&d| rule.set_of(placement, d))
        .collect();
    // Sets are disjoint blocks, ascending with the set number.
    sets.into_iter()
        .flat_map(|s| rule.members(placement, s))
        .collect()
}

/// Control messages of set coordination.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SetMsg {
    /// Eager silence (004 §3.3): the sender sends nothing more on this
    /// channel before the set's checkpoint `generation` is captured.
    Token {
        /// Generation being checkpointed.
        generation: u64,
    },
    /// To the leader: every peer's token arrived (first barrier).
    Silent {
        /// Generation.
        generation: u64,
    },
    /// From the leader: the set is silent; capture.
    Capture {
        /// Generation.
        generation: u64,
    },
    /// To the leader: captured (second barrier).
    Captured {
        /// Generation.
        generation: u64,
    },
    /// From the leader: every member captured; send again.
    Release {
        /// Generation.
        generation: u64,
    },
    /// To the leader: the sender's piece of `generation` is stored.
    Stored {
        /// Generation.
        generation: u64,
    },
    /// From the leader: every member's piece of `generation` is stored.
    Commit {
        /// Generation.
        generation: u64,
    },
    /// To the leader: the sender's log needs a checkpoint (log budget).
    ///
    /// This and the agreement on a forced checkpoint below carry the set's
    /// epoch (its latest rollback): a message of an execution the set has
    /// rolled back since is dropped. Otherwise a `Query` sent before a
    /// rollback, and delivered to a member's replacement, would hold that
    /// member at its next safe point for an answer the leader, which forgot
    /// the round in its own rollback, never sends.
    Pressure {
        /// The sender's set epoch.
        epoch: u64,
    },
    /// From the leader: at which safe point are you? Stop at your next one
    /// until told where the set checkpoints.
    Query {
        /// The sender's set epoch.
        epoch: u64,
        /// Agreement round.
        round: u64,
    },
    /// To the leader: safe points the sender has passed.
    At {
        /// The sender's set epoch.
        epoch: u64,
        /// Agreement round.
        round: u64,
        /// Safe point index.
        index: u64,
    },
    /// From the leader: the set checkpoints at safe point `index`, which
    /// every member can still reach.
    CheckpointAt {
        /// The sender's set epoch.
        epoch: u64,
        /// Agreement round.
        round: u64,
        /// Safe point index.
        index: u64,
    },
    /// Recovery, to the leader: the newest generation the sender knows
    /// committed (its own knowledge or its holders').
    Report {
        /// The failure event of the set being recovered.
        epoch: u64,
        /// Newest committed generation known.
        committed: Option<u64>,
        /// The next generation number the sender would capture.
        next_generation: u64,
    },
    /// Recovery, from the leader: every member restores `generation`.
    Decision {
        /// The failure event of the set being recovered.
        epoch: u64,
        /// Generation (`None`: from the beginning).
        generation: Option<u64>,
        /// The next generation every member captures: above every number
        /// any member used, so an uncommitted piece never shares its
        /// number with a new one.
        next_generation: u64,
    },
}

/// A set checkpoint this rank takes part in.
#[derive(Debug)]
struct Sync {
    generation: u64,
    entered: std::time::Duration,
    silent_sent: bool,
}

/// What a checkpoint piece holds of this protocol (after the logging part).
#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedState {
    /// Safe point of the set's checkpoint.
    last_index: u64,
}

/// State of the correlated-set protocol on one rank.
#[derive(Debug)]
pub struct Correlated {
    p2p: Pessimistic,
    every: u64,
    /// Set of every rank.
    /// How sets are formed (`SetRule::set_of`, `SetRule::members`), over
    /// `placement`.
    rule: SetRule,
    placement: Placement,
    /// This rank's set, itself included, ascending (known from the first
    /// event).
    members: Vec<Rank>,
    /// Safe point index of the last set checkpoint.
    last_index: u64,
    /// Safe points passed.
    index: u64,
    /// Newest generation this rank knows the set committed.
    committed: Option<u64>,
    sync: Option<Sync>,
    /// Tokens received, per generation (a peer may enter first).
    tokens: BTreeMap<u64, BTreeSet<Rank>>,
    /// Leader: barrier arrivals and stored pieces, per generation.
    silent: BTreeMap<u64, BTreeSet<Rank>>,
    captured: BTreeMap<u64, BTreeSet<Rank>>,
    stored: BTreeMap<u64, BTreeSet<Rank>>,
    /// Forced checkpoints (log budget): asked the leader.
    pressure_sent: bool,
    /// Leader: the agreement round in progress and its answers.
    round: u64,
    querying: bool,
    at: BTreeMap<Rank, u64>,
    /// Answered a query: stop at the next safe point until told.
    hold: bool,
    /// Paused at the current safe point (waiting for the agreement).
    paused: bool,
    /// Agreed forced checkpoint.
    checkpoint_at: Option<u64>,
    /// The failure event of the set's newest rollback.
    set_epoch: u64,
    /// Leader: recovery reports per set failure event: newest committed
    /// generation known and next generation number, per member.
    reports: BTreeMap<u64, BTreeMap<Rank, (Option<u64>, u64)>>,
    /// Reported for `set_epoch`.
    reported: bool,
    /// The set's decision for `set_epoch`, if it came before the holders'
    /// answers.
    decision: Option<Option<u64>>,
    /// The set's next generation number, applied once restored.
    next_generation: Option<u64>,
}

impl Correlated {
    /// Checkpoint every `every` safe points (0: only when a log budget asks
    /// for it), sets by `rule` over `placement`.
    pub fn new(
        every: u64,
        log_budget: Option<usize>,
        rule: SetRule,
        placement: &Placement,
    ) -> Self {
        Self::with_p2p(every, Pessimistic::new(0, log_budget), rule, placement)
    }

    /// Over `p2p`, the point-to-point logging (built to checkpoint only
    /// when told, with its log budget and spill).
    pub(crate) fn with_p2p(
        every: u64,
        p2p: Pessimistic,
        rule: SetRule,
        placement: &Placement,
    ) -> Self {
        Correlated {
            p2p,
            every,
            rule,
            placement: placement.clone(),
            members: Vec::new(),
            last_index: 0,
            index: 0,
            committed: None,
            sync: None,
            tokens: BTreeMap::new(),
            silent: BTreeMap::new(),
            captured: BTreeMap::new(),
            stored: BTreeMap::new(),
            pressure_sent: false,
            round: 0,
            querying: false,
            at: BTreeMap::new(),
            hold: false,
            paused: false,
            checkpoint_at: None,
            set_epoch: 0,
            reports: BTreeMap::new(),
            reported: false,
            decision: None,
            next_generation: None,
        }
    }

    fn init(&mut self, cx: &ProtocolCx<'_>) {
        if !self.members.is_empty() {
            return;
        }
        self.members = self
            .rule
            .members(&self.placement, self.rule.set_of(&self.placement, cx.rank))
            .collect();
        if self.members.is_empty() {
            self.members.push(cx.rank);
        }
        let peers: Vec<Rank> = self
            .members
            .iter()
            .copied()
            .filter(|&r| r != cx.rank)
            .collect();
        self.p2p.set_correlated_set(peers);
    }

    /// The set's leader: its lowest rank (a replacement takes its number).
    fn leader(&self) -> Rank {
        self.members[0]
    }

    fn send(cx: &mut ProtocolCx<'_>, dest: Rank, msg: SetMsg) {
        cx.emit(Action::Transmit {
            dest,
            msg: Control::Set(msg),
        });
    }

    fn to_leader(&self, cx: &mut ProtocolCx<'_>, msg: SetMsg) {
        Self::send(cx, self.leader(), msg);
    }

    fn to_members(&self, cx: &mut ProtocolCx<'_>, msg: SetMsg) {
        for &m in &self.members {
            Self::send(cx, m, msg.clone());
        }
    }

    fn release(&mut self, cx: &mut ProtocolCx<'_>) {
        self.paused = false;
        self.p2p.report(cx);
        cx.emit(Action::ReleaseSafePoint);
    }

    fn on_safe_point(&mut self, index: u64, cx: &mut ProtocolCx<'_>) {
        self.index = index;
        let scheduled = self.every > 0 && index >= self.last_index + self.every;
        if scheduled || self.checkpoint_at == Some(index) {
            self.enter(cx);
        } else if self.hold {
            self.paused = true; // until the leader names the safe point
        } else {
            self.release(cx);
        }
    }

    /// Phase 1: a token on every channel to a correlated peer.
    fn enter(&mut self, cx: &mut ProtocolCx<'_>) {
        let generation = self.p2p.next_generation();
        self.sync = Some(Sync {
            generation,
            entered: cx.now(),
            silent_sent: false,
        });
        let me = cx.rank;
        for &m in self.members.iter().filter(|&&m| m != me) {
            Self::send(cx, m, SetMsg::Token { generation });
        }
        self.check_silent(cx);
    }

    /// Every peer's token arrived: this rank's internal inbound channels
    /// are empty (phase 2 is immediate, see the module doc): barrier.
    fn check_silent(&mut self, cx: &mut ProtocolCx<'_>) {
        let Some(sync) = self.sync.as_mut() else {
            return;
        };
        let g = sync.generation;
        let have = self.tokens.get(&g).map_or(0, BTreeSet::len);
        if sync.silent_sent || have + 1 < self.members.len() {
            return;
        }
        sync.silent_sent = true;
        self.to_leader(cx, SetMsg::Silent { generation: g });
    }

    /// Leader: count an arrival at a barrier; true once every member came.
    fn arrive(
        book: &mut BTreeMap<u64, BTreeSet<Rank>>,
        members: usize,
        generation: u64,
        src: Rank,
    ) -> bool {
        let set = book.entry(generation).or_default();
        set.insert(src);
        if set.len() < members {
            return false;
        }
        book.remove(&generation);
        true
    }

    fn on_set(&mut self, src: Rank, msg: SetMsg, cx: &mut ProtocolCx<'_>) {
        let n = self.members.len();
        if let SetMsg::Pressure { epoch }
        | SetMsg::Query { epoch, .. }
        | SetMsg::At { epoch, .. }
        | SetMsg::CheckpointAt { epoch, .. } = msg
            && epoch != self.set_epoch
        {
            return; // from an execution the set rolled back (see `Pressure`)
        }
        match msg {
            SetMsg::Token { generation } => {
                self.tokens.entry(generation).or_default().insert(src);
                self.check_silent(cx);
            }
            SetMsg::Silent { generation } => {
                if Self::arrive(&mut self.silent, n, generation, src) {
                    self.to_members(cx, SetMsg::Capture { generation });
                }
            }
            SetMsg::Capture { generation } => {
                let Some(sync) = self.sync.as_ref().filter(|s| s.generation == generation) else {
                    return;
                };
                let seconds = (cx.now().saturating_sub(sync.entered)).as_secs_f64();
                cx.emit(Action::Record(Stat::SetSync {
                    seconds,
                    set_size: n,
                }));
                self.last_index = self.index;
                self.p2p.capture(cx);
                self.to_leader(cx, SetMsg::Captured { generation });
            }
            SetMsg::Captured { generation } => {
                if Self::arrive(&mut self.captured, n, generation, src) {
                    self.to_members(cx, SetMsg::Release { generation });
                }
            }
            SetMsg::Release { generation } => {
                if self
                    .sync
                    .as_ref()
                    .is_some_and(|s| s.generation == generation)
                {
                    self.sync = None;
                    self.tokens.retain(|&g, _| g > generation);
                    if self.checkpoint_at == Some(self.index) {
                        self.checkpoint_at = None;
                    }
                    self.pressure_sent = false;
                    self.release(cx);
                }
            }
            SetMsg::Stored { generation } => {
                if Self::arrive(&mut self.stored, n, generation, src) {
                    self.stored.retain(|&g, _| g > generation);
                    self.to_members(cx, SetMsg::Commit { generation });
                }
            }
            SetMsg::Commit { generation } => {
                self.committed = self.committed.max(Some(generation));
                self.p2p.commit_stored(generation, cx);
            }
            SetMsg::Pressure { epoch } => {
                // Not while an agreed forced checkpoint is still to come
                // (it trims the logs too): a new round would name a later
                // safe point, and a member already checkpointing at the
                // agreed one would wait there for the others' tokens
                // forever (found by random kills under a log budget).
                if !self.querying && self.checkpoint_at.is_none() {
                    self.querying = true;
                    self.round += 1;
                    self.at.clear();
                    let round = self.round;
                    self.to_members(cx, SetMsg::Query { epoch, round });
                }
            }
            SetMsg::Query { epoch, round } => {
                self.hold = true;
                let index = self.index;
                self.to_leader(
                    cx,
                    SetMsg::At {
                        epoch,
                        round,
                        index,
                    },
                );
            }
            SetMsg::At {
                epoch,
                round,
                index,
            } => {
                if self.querying && round == self.round {
                    self.at.insert(src, index);
                    if self.at.len() == n {
                        self.querying = false;
                        // Saturating: the indexes come from frames.
                        let index = self
                            .at
                            .values()
                            .copied()
                            .max()
                            .unwrap_or(0)
                            .saturating_add(1);
                        self.to_members(
                            cx,
                            SetMsg::CheckpointAt {
                                epoch,
                                round,
                                index,
                            },
                        );
                    }
                }
            }
            SetMsg::CheckpointAt { index, .. } => {
                self.hold = false;
                self.checkpoint_at = Some(index);
                if self.paused {
                    self.paused = false;
                    if self.index == index {
                        self.enter(cx);
                    } else {
                        self.release(cx);
                    }
                }
            }
            SetMsg::Report {
                epoch,
                committed,
                next_generation,
            } => {
                self.reports
                    .entry(epoch)
                    .or_default()
                    .insert(src, (committed, next_generation));
                self.try_decide(cx);
            }
            SetMsg::Decision {
                epoch,
                generation,
                next_generation,
            } => {
                if epoch == self.set_epoch {
                    self.decision = Some(generation);
                    self.next_generation = Some(next_generation);
                    self.after_p2p(cx);
                }
            }
        }
    }

    /// Leader: once every member reported for the set's newest failure,
    /// restore the newest generation any of them knows committed: every
    /// member's piece of it was stored before the first `Commit` of it.
    fn try_decide(&mut self, cx: &mut ProtocolCx<'_>) {
        let epoch = self.set_epoch;
        self.reports.retain(|&e, _| e >= epoch);
        let Some(reports) = self.reports.get(&epoch) else {
            return;
        };
        if reports.len() < self.members.len() {
            return;
        }
        let generation = reports.values().map(|r| r.0).max().flatten();
        let next_generation = reports
            .values()
            .map(|r| r.1)
            .max()
            .unwrap_or(1)
            .max(generation.map_or(1, |g| g.saturating_add(1)));
        self.reports.remove(&epoch);
        self.to_members(
            cx,
            SetMsg::Decision {
                epoch,
                generation,
                next_generation,
            },
        );
    }

    /// After the logging part handled an event: report what the holders
    /// answered, and restore once the set decided.
    fn after_p2p(&mut self, cx: &mut ProtocolCx<'_>) {
        if self.p2p.checkpoint_wanted() && !self.pressure_sent && self.sync.is_none() {
            // A sender's log for this rank passed half its budget: the set
            // checkpoints at the next safe point all members can reach.
            self.pressure_sent = true;
            let epoch = self.set_epoch;
            self.to_leader(cx, SetMsg::Pressure { epoch });
        }
        let Some(located) = self.p2p.located() else {
            return;
        };
        let holders = located.values().filter_map(|h| h.committed).max();
        if !self.reported {
            self.reported = true;
            let committed = self.committed.max(holders);
            let epoch = self.set_epoch;
            let next_generation = self.p2p.next_generation();
            self.to_leader(
                cx,
                SetMsg::Report {
                    epoch,
                    committed,
                    next_generation,
                },
            );
        }
        if let Some(generation) = self.decision.take() {
            self.p2p.restore_decided(generation, cx);
        }
    }

    /// Forget the execution being rolled back (set coordination).
    fn forget_execution(&mut self) {
        self.sync = None;
        self.tokens.clear();
        self.silent.clear();
        self.captured.clear();
        self.stored.clear();
        self.pressure_sent = false;
        self.querying = false;
        self.at.clear();
        self.hold = false;
        self.paused = false;
        self.checkpoint_at = None;
        self.reported = false;
        self.decision = None;
        self.next_generation = None;
    }
}

impl Protocol for Correlated {
    fn name(&self) -> &'static str {
        "correlated"
    }

    over_p2p!();

    fn one_sided_as_messages(&self) -> bool {
        true // logged as messages (`engine/rma_messages.rs`)
    }

    fn rolled_back_with(&self, dead: &[Rank]) -> Vec<Rank> {
        rolled_back_with(self.rule, &self.placement, dead)
    }

    fn state_size_hint(&self) -> usize {
        self.p2p.state_size_hint()
    }

    fn save_state(&self, piece: &mut PieceWriter<'_>) -> Result<()> {
        self.p2p.save_state(piece)?;
        let st = SavedState {
            last_index: self.last_index,
        };
        postcard_append(&st, piece.buf())
    }

    fn load_state(&mut self, state: Bytes) -> Result<()> {
        let rest = self.p2p.load_prefix(&state)?;
        let st: SavedState = postcard::from_bytes(&rest)?;
        self.last_index = st.last_index;
        self.index = st.last_index;
        Ok(())
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        self.init(cx);
        match event {
            Event::SafePoint { index } => self.on_safe_point(index, cx),
            Event::PieceStored { generation } => {
                self.p2p.stored_again(generation, cx);
                self.to_leader(cx, SetMsg::Stored { generation });
            }
            Event::Control {
                src,
                msg: Control::Set(m),
            } => self.on_set(src, m, cx),
            Event::PeerFailed { epoch, dead } => {
                let again = self.rolled_back_with(dead);
                if again.contains(&cx.rank) {
                    self.set_epoch = epoch;
                    self.p2p.begin_rollback();
                    cx.emit(Action::Rollback { epoch });
                }
                // For the logging part, every member of a set that rolls
                // back is a recovering rank (its own set excepted).
                let others: Vec<Rank> = again
                    .into_iter()
                    .filter(|r| !self.members.contains(r))
                    .collect();
                // Only the dead lost what they held for others: a member
                // that rolls back with its set keeps its store.
                self.p2p.peer_failed(epoch, &others, dead, cx);
                self.after_p2p(cx);
            }
            Event::Recover { epoch, replacement } => {
                if replacement {
                    self.set_epoch = self.set_epoch.max(epoch);
                }
                self.forget_execution();
                self.p2p.handle(Event::Recover { epoch, replacement }, cx);
                self.after_p2p(cx);
            }
            Event::Restored { generation } => {
                if generation.is_none() {
                    // From the beginning: the schedule starts again too
                    // (otherwise `load_state` set it).
                    self.last_index = 0;
                    self.index = 0;
                }
                if let Some(n) = self.next_generation.take() {
                    self.p2p.set_next_generation(n);
                }
                self.p2p.handle(Event::Restored { generation }, cx);
                if let Some(g) = generation {
                    self.committed = self.committed.max(Some(g));
                }
            }
            other => {
                self.p2p.handle(other, cx);
                self.after_p2p(cx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::Harness;
    use std::time::Duration;

    /// Rank `rank` of 4 on 2 nodes: sets {0, 1} and {2, 3}.
    fn harness(rank: Rank) -> Harness {
        Harness::new(rank, 4, 2)
    }

    fn correlated(h: &Harness, every: u64) -> Correlated {
        Correlated::new(every, None, SetRule::FailureDomains, &h.pl)
    }

    fn sent(actions: &[Action]) -> Vec<(Rank, SetMsg)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Transmit {
                    dest,
                    msg: Control::Set(m),
                } => Some((*dest, m.clone())),
                _ => None,
            })
            .collect()
    }

    fn msg(src: Rank, dest: Rank, ssn: u64) -> crate::engine::frame::AppMessage {
        crate::protocol::testing::app_message(src, dest, ssn, 64)
    }

    #[test]
    fn internal_messages_are_spared_and_inter_set_ones_logged() {
        let h = harness(0);
        let mut p = correlated(&h, 2);
        assert!(
            h.run(&mut p, Event::AppSend { msg: &msg(0, 1, 1) })
                .is_empty()
        );
        h.run(&mut p, Event::AppSend { msg: &msg(0, 2, 1) });
        let report = h.run(&mut p, Event::Finish);
        assert_eq!(
            report,
            vec![Action::Record(Stat::Log {
                records: 1,
                bytes: 64,
                spared_bytes: 64,
                determinants: 0,
                resent: 0,
                collectives_from_log: 0,
                spilled_bytes: 0,
                log_records: 1,
                log_bytes: 64,
            })]
        );
    }

    /// 004 §3.3 on the leader (rank 0) of the set {0, 1}: tokens, the first
    /// barrier, capture, the second barrier, then the commit once both
    /// pieces are stored.
    #[test]
    fn a_set_checkpoint_runs_the_three_phases_then_commits() {
        let mut h = harness(0);
        let mut p = correlated(&h, 2);
        // Safe point 1: not scheduled, released at once.
        let a = h.run(&mut p, Event::SafePoint { index: 1 });
        assert!(a.contains(&Action::ReleaseSafePoint));
        // Safe point 2: a token to the peer, and no release.
        let a = h.run(&mut p, Event::SafePoint { index: 2 });
        assert_eq!(sent(&a), vec![(1, SetMsg::Token { generation: 1 })]);
        assert!(!a.contains(&Action::ReleaseSafePoint));
        // The peer's token: silent; the barrier at the leader (itself).
        let a = h.control(&mut p, 1, SetMsg::Token { generation: 1 });
        assert_eq!(sent(&a), vec![(0, SetMsg::Silent { generation: 1 })]);
        assert!(sent(&h.control(&mut p, 0, SetMsg::Silent { generation: 1 })).is_empty());
        let a = h.control(&mut p, 1, SetMsg::Silent { generation: 1 });
        let capture = SetMsg::Capture { generation: 1 };
        assert_eq!(sent(&a), vec![(0, capture.clone()), (1, capture.clone())]);
        // Capture: the synchronisation time is recorded, the piece captured.
        h.now = Duration::from_micros(30);
        let a = h.control(&mut p, 0, capture);
        assert!(a.contains(&Action::Record(Stat::SetSync {
            seconds: 30e-6,
            set_size: 2
        })));
        assert!(a.contains(&Action::Capture { generation: 1 }));
        assert_eq!(sent(&a), vec![(0, SetMsg::Captured { generation: 1 })]);
        // Second barrier: released only when both captured.
        h.control(&mut p, 0, SetMsg::Captured { generation: 1 });
        let a = h.control(&mut p, 1, SetMsg::Captured { generation: 1 });
        let release = SetMsg::Release { generation: 1 };
        assert_eq!(sent(&a), vec![(0, release.clone()), (1, release.clone())]);
        let a = h.control(&mut p, 0, release);
        assert!(a.contains(&Action::ReleaseSafePoint));
        // Stored pieces: committed once both are.
        let a = h.run(&mut p, Event::PieceStored { generation: 1 });
        assert_eq!(sent(&a), vec![(0, SetMsg::Stored { generation: 1 })]);
        assert!(sent(&h.control(&mut p, 0, SetMsg::Stored { generation: 1 })).is_empty());
        let a = h.control(&mut p, 1, SetMsg::Stored { generation: 1 });
        let commit = SetMsg::Commit { generation: 1 };
        assert_eq!(sent(&a), vec![(0, commit.clone()), (1, commit.clone())]);
        h.control(&mut p, 0, commit);
        assert_eq!(p.committed, Some(1));
        // Safe point 3 is not scheduled; 4 is.
        assert!(
            h.run(&mut p, Event::SafePoint { index: 3 })
                .contains(&Action::ReleaseSafePoint)
        );
        let a = h.run(&mut p, Event::SafePoint { index: 4 });
        assert_eq!(sent(&a), vec![(1, SetMsg::Token { generation: 2 })]);
    }

    /// A forced checkpoint: the leader asks where everyone is and names a
    /// safe point every member can still reach; a member that reached its
    /// next safe point waits there for the answer.
    #[test]
    fn a_forced_checkpoint_is_agreed_on_a_reachable_safe_point() {
        let h = harness(0);
        let mut p = correlated(&h, 0);
        let a = h.control(&mut p, 1, SetMsg::Pressure { epoch: 0 });
        let q = SetMsg::Query { epoch: 0, round: 1 };
        assert_eq!(sent(&a), vec![(0, q.clone()), (1, q.clone())]);
        h.run(&mut p, Event::SafePoint { index: 5 });
        let a = h.control(&mut p, 0, q);
        let at5 = SetMsg::At {
            epoch: 0,
            round: 1,
            index: 5,
        };
        assert_eq!(sent(&a), vec![(0, at5.clone())]);
        // Held at the next safe point.
        let a = h.run(&mut p, Event::SafePoint { index: 6 });
        assert!(!a.contains(&Action::ReleaseSafePoint));
        h.control(&mut p, 0, at5);
        let a = h.control(
            &mut p,
            1,
            SetMsg::At {
                epoch: 0,
                round: 1,
                index: 7,
            },
        );
        let at = SetMsg::CheckpointAt {
            epoch: 0,
            round: 1,
            index: 8,
        };
        assert_eq!(sent(&a), vec![(0, at.clone()), (1, at.clone())]);
        // Not there yet: released; the set checkpoints at 8.
        assert!(h.control(&mut p, 0, at).contains(&Action::ReleaseSafePoint));
        assert!(
            h.run(&mut p, Event::SafePoint { index: 7 })
                .contains(&Action::ReleaseSafePoint)
        );
        let a = h.run(&mut p, Event::SafePoint { index: 8 });
        assert_eq!(sent(&a), vec![(1, SetMsg::Token { generation: 1 })]);
    }

    /// A `Query` of a forced checkpoint sent before the set rolled back
    /// (here: delivered to rank 1's replacement, which started in epoch 1)
    /// does not hold the rank at its next safe point: the leader forgot
    /// that round in its own rollback and would never answer. One of the
    /// current epoch does.
    #[test]
    fn a_forced_checkpoint_query_from_before_a_rollback_is_dropped() {
        let h = harness(1);
        let mut p = correlated(&h, 0);
        h.run(
            &mut p,
            Event::Recover {
                epoch: 1,
                replacement: true,
            },
        );
        let a = h.control(&mut p, 0, SetMsg::Query { epoch: 0, round: 3 });
        assert!(sent(&a).is_empty(), "{a:?}");
        assert!(
            h.run(&mut p, Event::SafePoint { index: 1 })
                .contains(&Action::ReleaseSafePoint),
            "a stale query must not hold the rank"
        );
        let a = h.control(&mut p, 0, SetMsg::Query { epoch: 1, round: 4 });
        assert_eq!(
            sent(&a),
            vec![(
                0,
                SetMsg::At {
                    epoch: 1,
                    round: 4,
                    index: 1
                }
            )]
        );
        assert!(
            !h.run(&mut p, Event::SafePoint { index: 2 })
                .contains(&Action::ReleaseSafePoint),
            "a current query holds the rank until the leader answers"
        );
    }

    /// A second pressure while the agreed forced checkpoint is still to
    /// come starts no new round: members must all checkpoint at the safe
    /// point already named, and none may be told a later one.
    #[test]
    fn no_new_forced_checkpoint_round_while_one_is_pending() {
        let h = harness(0);
        let mut p = correlated(&h, 0);
        h.run(&mut p, Event::SafePoint { index: 5 });
        let a = h.control(&mut p, 1, SetMsg::Pressure { epoch: 0 });
        assert_eq!(sent(&a).len(), 2, "a round starts: {a:?}");
        for (src, index) in [(0, 5), (1, 5)] {
            h.control(
                &mut p,
                src,
                SetMsg::At {
                    epoch: 0,
                    round: 1,
                    index,
                },
            );
        }
        let at = SetMsg::CheckpointAt {
            epoch: 0,
            round: 1,
            index: 6,
        };
        h.control(&mut p, 0, at);
        let a = h.control(&mut p, 1, SetMsg::Pressure { epoch: 0 });
        assert!(sent(&a).is_empty(), "no second round: {a:?}");
        let a = h.run(&mut p, Event::SafePoint { index: 6 });
        assert_eq!(sent(&a), vec![(1, SetMsg::Token { generation: 1 })]);
    }

    /// A death in the set rolls the survivor back; a death in the other set
    /// does not, and its members become recovering ranks for the log.
    #[test]
    fn a_failure_rolls_back_the_whole_set_and_only_it() {
        let h = harness(0);
        let mut p = correlated(&h, 2);
        assert_eq!(p.rolled_back_with(&[3]), vec![2, 3]);
        let a = h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[3],
            },
        );
        assert!(!a.iter().any(|x| matches!(x, Action::Rollback { .. })));
        // Both members of the other set are asked for their resend needs.
        for d in [2, 3] {
            assert!(a.iter().any(|x| matches!(
                x,
                Action::Transmit { dest, msg: Control::Log(crate::protocol::pessimistic::LogMsg::Recovering { .. }) } if *dest == d
            )));
        }
        let a = h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 2,
                dead: &[1],
            },
        );
        assert!(a.contains(&Action::Rollback { epoch: 2 }));
    }

    /// The leader restores the newest generation any member knows
    /// committed, once every member reported for the set's failure.
    #[test]
    fn the_leader_decides_the_newest_committed_generation() {
        let h = harness(0);
        let mut p = correlated(&h, 2);
        h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 3,
                dead: &[1],
            },
        );
        // A stale report of an older failure does not count.
        let stale = SetMsg::Report {
            epoch: 2,
            committed: Some(9),
            next_generation: 10,
        };
        assert!(sent(&h.control(&mut p, 1, stale)).is_empty());
        let r = |c, n| SetMsg::Report {
            epoch: 3,
            committed: c,
            next_generation: n,
        };
        // A member that captured generation 7 (never committed): the set
        // numbers its next checkpoint past it.
        assert!(sent(&h.control(&mut p, 0, r(Some(4), 8))).is_empty());
        let a = h.control(&mut p, 1, r(Some(5), 6));
        let d = SetMsg::Decision {
            epoch: 3,
            generation: Some(5),
            next_generation: 8,
        };
        assert_eq!(sent(&a), vec![(0, d.clone()), (1, d)]);
    }
}
