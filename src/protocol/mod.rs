//! Rollback-recovery protocols: state machines from events to actions.
//!
//! A protocol owns no thread, socket, clock or random generator (DESIGN
//! principle 2). The rank engine feeds it [`Event`]s (the application posted a
//! send, a safe point was reached, a control frame arrived, a peer died, ...)
//! and carries out the [`Action`]s it emits (transmit a control frame, capture a
//! checkpoint, commit a generation, roll back, resume). That makes every
//! protocol testable alone with scripted events, and lets the same code run on
//! every driver.
//!
//! One module per paper's protocol:
//!
//! | module | paper | status |
//! | --- | --- | --- |
//! | [`none`] | baseline | implemented |
//! | [`coordinated`] | 004 §2.2, 003 §3.1 | implemented |
//! | [`chandy_lamport`] | 000 | implemented (markers, channel state, RMA as messages; the get() fixes planned) |
//! | [`pessimistic`] | 004 §2, 002 §2.1 | implemented (messages and RMA windows) |
//! | [`ulml`] | 002 | implemented (messages and RMA windows) |
//! | [`correlated`] | 004 §3 | implemented (messages and RMA windows) |
//! | [`rma`] | 003 §3–§4 | fence epochs (puts, accumulates, gets, fetching atomics) with causal replay; lock epochs logged with SC, their replay (Alg. 3) planned |
//! | `proactive` | 001 | planned |

/// The `Protocol` methods of a protocol built over
/// [`pessimistic::Pessimistic`] (its field `p2p`) that it hands on: only the
/// dead roll back, sends leave when the point-to-point log says, and the
/// re-execution regenerates what it says.
macro_rules! over_p2p {
    () => {
        fn rolls_back_survivors(&self) -> bool {
            false
        }

        fn send_ready(&self) -> bool {
            self.p2p.send_ready()
        }

        fn send_wait(&self) -> Option<String> {
            self.p2p.send_wait()
        }

        fn send_stalled(&self) -> Option<String> {
            self.p2p.send_stalled()
        }

        fn regenerating(&self, ssn_out: &$crate::protocol::SsnOut) -> bool {
            self.p2p.regenerating(ssn_out)
        }
    };
}

pub mod chandy_lamport;
pub mod coordinated;
pub mod correlated;
pub mod none;
pub mod pessimistic;
pub mod rma;
pub mod ulml;

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use bytes::Bytes;

use crate::engine::frame::{AppMessage, ContextId};
use crate::segments::Segments;
use crate::store::spill::LogSpill;
use crate::store::{CheckpointStore, PieceWriter};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// What a protocol is built with ([`ProtocolKind::build`]).
#[derive(Debug, Clone, Copy)]
pub struct BuildOptions {
    /// Checkpoint every this many safe points (0: never).
    pub checkpoint_every: u64,
    /// With a mean time between failures (seconds), the interval becomes
    /// Daly's (003 §6.1) from the measured checkpoint cost, starting with
    /// `checkpoint_every`.
    pub mtbf_s: Option<f64>,
    /// Message logging: the log budget in bytes.
    pub log_budget: Option<usize>,
    /// `correlated`: how sets are formed.
    pub sets: correlated::SetRule,
    /// `chandy-lamport`: 000 §IV's wave, if a `get()` fix is chosen.
    pub wave: Option<chandy_lamport::WaveConfig>,
    /// `coordinated`: how a checkpoint is coordinated (003 §3.1.2).
    pub scheme: coordinated::CheckpointScheme,
    /// `rma`: which accesses are logged (003 §7.2.2).
    pub rma_log: rma::AccessLogging,
}

/// The protocols a run can choose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProtocolKind {
    /// No fault tolerance: a failure ends the run with an error.
    None,
    /// Blocking coordinated checkpointing.
    Coordinated,
    /// Non-blocking coordinated checkpointing by markers and recorded
    /// channel state (Chandy–Lamport, 000).
    ChandyLamport,
    /// Pessimistic sender-based message logging with uncoordinated
    /// checkpoints: only failed ranks roll back.
    Pessimistic,
    /// User-level message logging (002): point-to-point logged as under
    /// `pessimistic`, collectives logged as one result per rank.
    Ulml,
    /// Correlated-set coordinated message logging (004 §3): checkpoints
    /// coordinated inside a correlated set, messages between sets logged.
    Correlated,
    /// ftRMA (003 §3.2–§4): uncoordinated checkpoints, one-sided accesses
    /// logged where they are cheap (puts at their origin) and replayed
    /// causally into a recovering rank's window; messages logged as under
    /// `pessimistic`.
    Rma,
}

impl ProtocolKind {
    /// All protocols that exist.
    pub const ALL: [ProtocolKind; 7] = [
        ProtocolKind::None,
        ProtocolKind::Coordinated,
        ProtocolKind::ChandyLamport,
        ProtocolKind::Pessimistic,
        ProtocolKind::Ulml,
        ProtocolKind::Correlated,
        ProtocolKind::Rma,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            ProtocolKind::None => "none",
            ProtocolKind::Coordinated => "coordinated",
            ProtocolKind::ChandyLamport => "chandy-lamport",
            ProtocolKind::Pessimistic => "pessimistic",
            ProtocolKind::Ulml => "ulml",
            ProtocolKind::Correlated => "correlated",
            ProtocolKind::Rma => "rma",
        }
    }

    /// Build the protocol state machine for one rank, as `o` says;
    /// `placement` forms the correlated sets of `correlated`. A logging
    /// protocol moves payloads past the log budget to `spill` (given by the
    /// runtime; without one the budget only asks receivers to checkpoint).
    pub fn build(
        self,
        o: BuildOptions,
        spill: Option<Box<dyn LogSpill>>,
        placement: &Placement,
    ) -> Box<dyn Protocol> {
        let BuildOptions {
            checkpoint_every,
            mtbf_s,
            log_budget,
            sets,
            wave,
            scheme,
            rma_log,
        } = o;
        let bounded = |mut p: pessimistic::Pessimistic| {
            if let Some(s) = spill {
                p.set_spill(s);
            }
            p
        };
        match self {
            ProtocolKind::None => Box::new(none::NoProtocol),
            ProtocolKind::Coordinated => Box::new(
                coordinated::Coordinated::new(checkpoint_every)
                    .with_daly(mtbf_s)
                    .with_scheme(scheme),
            ),
            ProtocolKind::ChandyLamport => Box::new(chandy_lamport::ChandyLamport::with_wave(
                checkpoint_every,
                wave,
            )),
            ProtocolKind::Pessimistic => Box::new(bounded(pessimistic::Pessimistic::new(
                checkpoint_every,
                log_budget,
            ))),
            ProtocolKind::Ulml => Box::new(ulml::Ulml::with_p2p(bounded(
                pessimistic::Pessimistic::new(checkpoint_every, log_budget),
            ))),
            ProtocolKind::Correlated => Box::new(correlated::Correlated::with_p2p(
                checkpoint_every,
                bounded(pessimistic::Pessimistic::new(0, log_budget)),
                sets,
                placement,
            )),
            ProtocolKind::Rma => Box::new(
                rma::Rma::with_p2p(bounded(pessimistic::Pessimistic::new(
                    checkpoint_every,
                    log_budget,
                )))
                .with_log_budget(log_budget)
                .with_logging(rma_log),
            ),
        }
    }

    /// Whether a failure rolls the survivors back too (checkpointing
    /// without logs), or only the ranks that died (message logging).
    pub fn rolls_back_survivors(self) -> bool {
        !self.logs_messages()
    }

    /// The ranks that roll back when `dead` die: every rank under
    /// checkpointing without logs, the dead under message logging, their
    /// correlated sets (formed by `sets` over `placement`) under
    /// `correlated`.
    pub fn rolled_back_with(
        self,
        dead: &[Rank],
        sets: correlated::SetRule,
        placement: &Placement,
    ) -> Vec<Rank> {
        let ranks = placement.ranks();
        match self {
            ProtocolKind::None | ProtocolKind::Coordinated | ProtocolKind::ChandyLamport => {
                (0..ranks).collect()
            }
            ProtocolKind::Pessimistic | ProtocolKind::Ulml | ProtocolKind::Rma => dead.to_vec(),
            ProtocolKind::Correlated => correlated::rolled_back_with(sets, placement, dead),
        }
    }

    /// Whether the protocol keeps sender-based message logs (survivors keep
    /// their progress and replay what a recovering rank needs).
    pub fn logs_messages(self) -> bool {
        matches!(
            self,
            ProtocolKind::Pessimistic
                | ProtocolKind::Ulml
                | ProtocolKind::Correlated
                | ProtocolKind::Rma
        )
    }

    /// Whether the driver starts a replacement for a dead rank.
    pub fn replaces_failed_ranks(self) -> bool {
        !matches!(self, ProtocolKind::None)
    }
}

impl fmt::Display for ProtocolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ProtocolKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        ProtocolKind::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = ProtocolKind::ALL.iter().map(|p| p.name()).collect();
                Error::config(
                    "protocol",
                    format!("unknown protocol `{s}` (known: {})", names.join(", ")),
                )
            })
    }
}

/// Protocol control messages (carried in `Body::Control`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Control {
    /// Channel-silencing marker for `generation` on one channel: the sender
    /// sends no more application messages on it before the generation
    /// commits (Chandy–Lamport markers, 004 §3.3 tokens).
    Marker {
        /// Generation being saved.
        generation: u64,
    },
    /// A marker of 000 §IV's wave (`chandy-lamport` with a `get()` fix).
    Wave {
        /// The wave's generation.
        generation: u64,
        /// Which marker.
        kind: chandy_lamport::WaveMarker,
    },
    /// Silence detection, up the reduction tree: application messages sent
    /// and arrived in the sender's subtree, for one round of `generation`.
    Count {
        /// Generation being saved.
        generation: u64,
        /// Detection round.
        round: u32,
        /// Messages sent in the subtree.
        sent: u64,
        /// Messages arrived in the subtree.
        arrived: u64,
    },
    /// Down the tree: the totals differed, count again in `round`.
    Recount {
        /// Generation being saved.
        generation: u64,
        /// The new round.
        round: u32,
    },
    /// Down the tree: no message is in transit; capture now.
    Silent {
        /// Generation being saved.
        generation: u64,
    },
    /// Up the tree: every piece of the sender's subtree is stored, with
    /// what the root needs to judge the cut (the Gsync scheme checks it
    /// after the capture instead of before).
    Stored {
        /// Generation.
        generation: u64,
        /// The subtree's counts at its captures.
        tally: coordinated::Tally,
    },
    /// Commit record of `generation`, down the tree, with the checkpoint
    /// interval (in safe points) and the scheme every rank uses from now on.
    Commit {
        /// Generation.
        generation: u64,
        /// Safe points between checkpoints from now on.
        every: u64,
        /// How the next checkpoint is coordinated (003 §3.1.2).
        scheme: coordinated::CheckpointScheme,
    },
    /// Down the tree: the pieces of `generation`, captured at once under
    /// the Gsync scheme, do not form a consistent cut (a message or an
    /// access crossed it): drop them and checkpoint again, after a barrier.
    Abandon {
        /// Generation.
        generation: u64,
    },
    /// Recovery: what the sender holds (to the recovery leader).
    Inventory {
        /// Newest generation whose commit record the sender holds.
        committed: Option<u64>,
        /// Pieces held: `(generation, owner)`.
        held: Vec<(u64, Rank)>,
        /// Intact parity shards held: `(generation, stripe)`.
        parity: Vec<(u64, usize)>,
    },
    /// Recovery: the generation everyone restores, where the receiver's
    /// piece comes from, and whether its redundancy survived.
    Decision {
        /// Generation to restore (`None`: restart from the beginning).
        generation: Option<u64>,
        /// A rank holding the receiver's piece (unless `rebuild`).
        holder: Rank,
        /// No rank holds the piece: rebuild it from the group's parity.
        rebuild: bool,
        /// Whether every redundant copy or parity shard protecting the
        /// receiver's piece survived (otherwise it is re-created).
        redundancy_intact: bool,
        /// Safe points between checkpoints (the replacement must agree).
        every: u64,
    },
    /// Recovery: the sender has its piece back and its redundancy rebuilt.
    Ready,
    /// Recovery: everyone is ready; resume.
    Go,
    /// Message logging (pessimistic, ulml, correlated).
    Log(pessimistic::LogMsg),
    /// Set coordination (correlated).
    Set(correlated::SetMsg),
    /// User-level logging of collectives (ulml).
    Collective(ulml::CollMsg),
    /// Access logging and causal recovery of one-sided accesses (rma).
    Access(rma::AccessMsg),
}

impl From<pessimistic::LogMsg> for Control {
    fn from(m: pessimistic::LogMsg) -> Self {
        Control::Log(m)
    }
}

impl From<rma::AccessMsg> for Control {
    fn from(m: rma::AccessMsg) -> Self {
        Control::Access(m)
    }
}

impl From<correlated::SetMsg> for Control {
    fn from(m: correlated::SetMsg) -> Self {
        Control::Set(m)
    }
}

/// The kinds of collective operation (MPI chapter 5), for the per-kind
/// collective counters of 002 §3.1 ("statistics of collectives").
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Collective {
    /// `barrier`.
    Barrier,
    /// `broadcast_into`, `broadcast_value`.
    Broadcast,
    /// `all_reduce_into`, `all_reduce`.
    AllReduce,
    /// `all_gather`, `all_gather_varcount`.
    AllGather,
    /// `reduce` (to a root).
    Reduce,
    /// `gather`, `gather_varcount` (to a root).
    Gather,
    /// `scatter`.
    Scatter,
    /// `all_to_all`.
    AllToAll,
}

impl Collective {
    /// Every kind, in counter order.
    pub const ALL: [Collective; 8] = [
        Collective::Barrier,
        Collective::Broadcast,
        Collective::AllReduce,
        Collective::AllGather,
        Collective::Reduce,
        Collective::Gather,
        Collective::Scatter,
        Collective::AllToAll,
    ];

    /// Whether every member ends with the same result (a barrier's is
    /// empty). Such a collective can be logged as a whole result (002 §2.2)
    /// and any member that completed it can hand the result to another; a
    /// rooted or personalized one cannot (no other rank holds a dead rank's
    /// part), so its messages are logged point-to-point.
    pub fn same_result_everywhere(self) -> bool {
        matches!(
            self,
            Collective::Barrier
                | Collective::Broadcast
                | Collective::AllReduce
                | Collective::AllGather
        )
    }

    /// Its position in [`Collective::ALL`] (counter and tag order).
    pub fn index(self) -> usize {
        self as usize
    }

    /// The kind's name.
    pub fn name(self) -> &'static str {
        match self {
            Collective::Barrier => "barrier",
            Collective::Broadcast => "broadcast",
            Collective::AllReduce => "all_reduce",
            Collective::AllGather => "all_gather",
            Collective::Reduce => "reduce",
            Collective::Gather => "gather",
            Collective::Scatter => "scatter",
            Collective::AllToAll => "all_to_all",
        }
    }
}

/// A determinant (004 §2.2, event logging): the outcome of one
/// nondeterministic reception. The `rsn`-th reception of the receiver that
/// could have matched messages of several senders (a wildcard-source
/// receive, or a one-sided request applied to the receiver's window)
/// matched message `ssn` of `src`. Receptions from a named source need none:
/// channels are FIFO and resent in SSN order, so their outcome is fixed by
/// the program.
///
/// One-sided accesses under message logging travel as request messages that
/// the target's engine applies to its window in arrival order; that order
/// across origins is the target-side access order 003 §4.1 asks to record
/// (here exactly, so even combining accesses such as compare-and-swap replay
/// to the same result). `at` places the access among the target's own
/// operations that touch its window or its channels (see
/// `Engine::op_begin`): a replay applies it before the target's operation
/// number `at + 1`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Determinant {
    /// Reception sequence number among the receiver's nondeterministic
    /// receptions (wildcard receptions and applied one-sided requests).
    pub rsn: u64,
    /// Sender of the matched message.
    pub src: Rank,
    /// Its send sequence number.
    pub ssn: u64,
    /// For a one-sided request: the receiver's operation count when it was
    /// applied. `None` for a wildcard reception.
    pub at: Option<u64>,
}

/// What happened, as the protocol sees it.
#[derive(Debug)]
pub enum Event<'a> {
    /// The application posted a send (before it is transmitted).
    AppSend {
        /// The message.
        msg: &'a AppMessage,
    },
    /// The application message just sent to `dest` has left (a protocol
    /// that watches arrivals: what it sends now follows the message on its
    /// channel).
    AppSent {
        /// Its receiver.
        dest: Rank,
    },
    /// A nondeterministic reception: an application message matched by a
    /// wildcard-source receive, or a one-sided request applied (the
    /// reception event whose outcome a logging protocol records; a
    /// named-source reception's outcome is fixed by the program and is not
    /// reported).
    AppDeliver {
        /// The message.
        msg: &'a AppMessage,
        /// Its reception sequence number (the determinant to log).
        rsn: u64,
        /// For a one-sided request: the operation count it was applied at
        /// ([`Determinant::at`]).
        applied_at: Option<u64>,
        /// The reception was forced by a logged determinant (replay).
        replayed: bool,
    },
    /// An application message arrived from another rank (before it is
    /// matched), for a protocol that [`Protocol::watches_arrivals`]: it
    /// may hold it back ([`Action::Hold`]) and deliver it later.
    AppArrive {
        /// The message.
        msg: &'a AppMessage,
    },
    /// The engine recorded this rank's state for `generation`
    /// ([`Action::RecordState`]) and the application goes on.
    Recorded {
        /// Generation.
        generation: u64,
    },
    /// The application reached safe point number `index` (1-based).
    SafePoint {
        /// Index of the safe point.
        index: u64,
    },
    /// A control frame arrived.
    Control {
        /// Sender.
        src: Rank,
        /// Message.
        msg: Control,
    },
    /// The store finished putting this rank's piece of `generation`.
    PieceStored {
        /// Generation.
        generation: u64,
    },
    /// This rank's own piece of `generation` is local again.
    PieceRestored {
        /// Generation.
        generation: u64,
    },
    /// Fetching this rank's piece of `generation` from `holder` failed (a
    /// damaged copy, or none there any more; the engine told the user).
    PieceFetchFailed {
        /// Generation.
        generation: u64,
        /// The holder asked.
        holder: Rank,
    },
    /// The failure detector declared `dead` failed; world epoch is `epoch`.
    PeerFailed {
        /// New world epoch.
        epoch: u64,
        /// The ranks that died.
        dead: &'a [Rank],
    },
    /// This rank starts recovery in `epoch` (a survivor after rolling back, or
    /// a replacement that just started).
    Recover {
        /// World epoch.
        epoch: u64,
        /// Whether this rank is a freshly started replacement.
        replacement: bool,
    },
    /// Recovery ended: the engine restored `generation` (with the protocol's
    /// own saved state, see [`Protocol::load_state`]) and the rank function
    /// is about to run again.
    Restored {
        /// Generation restored (`None`: from the beginning).
        generation: Option<u64>,
    },
    /// The rank function returned; the rank is finalizing.
    Finish,
    /// The application entered collective number `index` of communicator
    /// context `context` (counted per context), one whose result is the
    /// same everywhere, under a protocol that logs collective results.
    CollectiveBegin {
        /// Collective context of the communicator.
        context: ContextId,
        /// Collectives begun on that context so far, this one included.
        index: u64,
        /// Kind.
        kind: Collective,
        /// World ranks of the communicator.
        group: &'a [Rank],
    },
    /// A collective completed on this rank (every kind, for the counters;
    /// `result` only for kinds whose result is the same everywhere, under a
    /// protocol that logs them).
    CollectiveEnd {
        /// Collective context of the communicator.
        context: ContextId,
        /// Its number on that context.
        index: u64,
        /// Kind.
        kind: Collective,
        /// The result (shared with the application's copy source; an
        /// all-gather's is the members' blocks as they arrived).
        result: Option<&'a Segments>,
    },
    /// This rank is about to issue a one-sided access to another rank's
    /// window through the driver (only to a protocol that does not take
    /// [`Protocol::one_sided_as_messages`] under message logging: `rma`).
    /// The protocol may log it and may answer [`Action::SkipAccess`].
    Access {
        /// Window.
        window: crate::driver::WinId,
        /// Target (world rank).
        target: Rank,
        /// The access.
        op: &'a crate::driver::RmaOp,
        /// The origin's epoch counter `E(p -> q)` (003 §2.2, the EC field).
        ec: u64,
        /// Whether this rank's re-execution is still regenerating messages
        /// its receivers already have ([`Protocol::regenerating`]): the
        /// access came before them in the first execution.
        regenerating: bool,
    },
    /// This rank entered a fence (GSYNC) on `window`, its requests settled,
    /// before the fence's barrier: the epoch closes here.
    FenceEnter {
        /// Window.
        window: crate::driver::WinId,
        /// The window's group (world ranks).
        group: &'a [Rank],
    },
    /// The fence on `window` completed (its barrier returned).
    FenceDone {
        /// Window.
        window: crate::driver::WinId,
    },
    /// This origin is about to take the lock of `target`'s window (LOCK,
    /// or one of `lock_all`'s): a passive-target epoch opens. The engine
    /// then waits until [`Protocol::access_ready`] before the lock (`rma`:
    /// the target's SC is fetched and its N flag set, 003 §4.1 C).
    LockOpen {
        /// Window.
        window: crate::driver::WinId,
        /// Target (world rank, not this rank).
        target: Rank,
    },
    /// This origin's epoch to `target` on `window` closed: by an UNLOCK
    /// (`unlock`, the passive-target epoch ends) or a FLUSH (the lock is
    /// still held).
    EpochClosed {
        /// Window.
        window: crate::driver::WinId,
        /// Target (world rank, not this rank).
        target: Rank,
        /// Whether the lock was released.
        unlock: bool,
    },
    /// An access of the `Access` event just handled read `data` from
    /// `target` (a get, or the old contents a fetching accumulate or a
    /// compare-and-swap returned): 003 Alg. 1's `#get`, whose data is
    /// valid once the epoch ends.
    Fetched {
        /// Window.
        window: crate::driver::WinId,
        /// Target (world rank).
        target: Rank,
        /// What the access returned.
        data: &'a bytes::Bytes,
    },
}

/// What the protocol asks the engine to do.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send a control message (to self is allowed: it is looped back).
    Transmit {
        /// Destination.
        dest: Rank,
        /// Message.
        msg: Control,
    },
    /// Record this rank's state for `generation` now, at this safe point,
    /// and keep it until [`Action::StoreRecorded`] (non-blocking snapshots: the
    /// piece also holds channel state recorded after the safe point).
    /// The engine answers with [`Event::Recorded`].
    RecordState {
        /// Generation.
        generation: u64,
    },
    /// Store the piece of `generation` recorded earlier, with the
    /// protocol's state ([`Protocol::save_state`]) as it is now.
    StoreRecorded {
        /// Generation.
        generation: u64,
    },
    /// Do not deliver the message of the `AppArrive` being handled; the
    /// protocol delivers it later with [`Action::Deliver`].
    Hold,
    /// Deliver an application message to this rank as if it arrived now
    /// (a held one, or a recorded channel's after a restore).
    Deliver {
        /// The message.
        msg: AppMessage,
    },
    /// Capture this rank's state as the piece of `generation` and store it.
    Capture {
        /// Generation.
        generation: u64,
    },
    /// Write the commit record of `generation`.
    Commit {
        /// Generation.
        generation: u64,
    },
    /// Let the application continue past the current safe point.
    ReleaseSafePoint,
    /// Roll this rank back: unwind the rank function with `Error::Rollback`
    /// and start recovery in `epoch`.
    Rollback {
        /// World epoch.
        epoch: u64,
    },
    /// End this rank's run with an error.
    Fail(Error),
    /// Drop every checkpoint piece except those of `keep`.
    RetainOnly {
        /// Generation kept.
        keep: Option<u64>,
    },
    /// Drop every piece of `generation` alone: it will never be committed.
    Discard {
        /// Generation dropped.
        generation: u64,
    },
    /// Bring this rank's piece of `generation` back from `holder`.
    Fetch {
        /// Generation.
        generation: u64,
        /// Who holds it.
        holder: Rank,
    },
    /// Rebuild this rank's piece of `generation` from its group's parity.
    Rebuild {
        /// Generation.
        generation: u64,
    },
    /// Re-create the redundancy of this rank's piece of `generation` (the
    /// partner copy, the group's parity).
    Replicate {
        /// Generation.
        generation: u64,
    },
    /// Recovery is complete: restart the rank function from `generation`.
    Resume {
        /// Generation restored (`None`: from the beginning).
        generation: Option<u64>,
    },
    /// Report a statistic to the driver.
    Record(crate::driver::Stat),
    /// Do not transmit the message of the `AppSend` being handled (it is
    /// logged; the protocol sends it later with `Resend`, or the receiver
    /// already has it).
    Withhold,
    /// Transmit a logged application message again (or for the first time,
    /// after a `Withhold`).
    Resend {
        /// The message (its payload shared with the log).
        msg: AppMessage,
    },
    /// Drop the checkpoint pieces of `owner` older than `keep`
    /// (uncoordinated checkpoints: each rank has its own generations).
    DropOlderPieces {
        /// Whose pieces.
        owner: Rank,
        /// Oldest generation kept.
        keep: u64,
    },
    /// Count a checkpoint of `generation` taken at this safe point (without
    /// a commit record: uncoordinated checkpoints).
    Checkpointed {
        /// Generation.
        generation: u64,
    },
    /// Force the outcomes of wildcard receptions during re-execution (those
    /// with an `rsn` past the restored state's are used, in `rsn` order).
    Replay {
        /// Logged determinants.
        determinants: Vec<Determinant>,
    },
    /// This rank takes part in the recovery from failure event `epoch`
    /// (`None`: no longer), for fault injection at `R@recovery` (a
    /// survivor serving logs to a recovering rank under message logging).
    InRecovery(Option<u64>),
    /// The result of collective `index` on `context`, from a log: if the
    /// rank is inside that collective, it completes with this result.
    CollectiveResult {
        /// Collective context.
        context: ContextId,
        /// Collective number.
        index: u64,
        /// The logged result.
        result: Segments,
    },
    /// Abandon the attempt at the current collective and start it again
    /// (a member failed during it: messages it was owed may be lost).
    CollectiveRestart,
    /// Do not issue the access of the `Access` event being handled: its
    /// target already has it (a re-execution regenerating it).
    SkipAccess,
    /// Do not issue the access of the `Access` event being handled; it
    /// returns `data`, what the first execution read (a re-execution's get
    /// answered from the target's log, 003 Alg. 2's get replay).
    AnswerAccess(bytes::Bytes),
    /// Do not issue the access of the `Access` event being handled yet:
    /// once [`Protocol::access_ready`] says so, it is handled again (a
    /// re-execution waiting for its logged gets, or a get to a target
    /// being recovered).
    DeferAccess,
    /// Apply a logged access to this rank's own window (a replay, 003
    /// Alg. 2's `replayEachAction`).
    ApplyAccess {
        /// Window.
        window: crate::driver::WinId,
        /// The access.
        op: crate::driver::RmaOp,
    },
}

/// Read-only facts and the action sink handed to a protocol with each event.
pub struct ProtocolCx<'a> {
    /// This rank.
    pub rank: Rank,
    /// Job size.
    pub size: usize,
    /// Placement of ranks into failure domains.
    pub placement: &'a Placement,
    /// The checkpoint store (read-only view).
    pub store: &'a dyn CheckpointStore,
    /// Driver time, read only by a protocol that asks ([`ProtocolCx::now`]):
    /// the logging protocols handle an event per message and never do.
    pub clock: &'a dyn Fn() -> Duration,
    /// Application messages this rank sent in the current execution.
    pub app_sent: u64,
    /// Application messages that arrived at this rank in the current
    /// execution (matched or not).
    pub app_arrived: u64,
    /// Highest SSN arrived per source (HSR, 002 §3.1), channels used only;
    /// kept for protocols that log messages (empty otherwise).
    pub hsr: &'a BTreeMap<Rank, u64>,
    /// This rank's SSN per destination (messages sent), to tell whether
    /// a re-execution still regenerates messages receivers have
    /// ([`Protocol::regenerating`]).
    pub ssn_out: &'a SsnOut,
    /// Wildcard receptions so far in this execution (the last RSN).
    pub rsn: u64,
    /// The world epoch (failure events) this rank has seen.
    pub epoch: u64,
    /// The rank's last communication was a GSYNC (a fence on a window of
    /// every rank) and nothing since: neither a send, a receive nor an
    /// access (003 §3.1.2, the Gsync scheme's point).
    pub after_gsync: bool,
    /// Emitted actions, executed in order after the handler returns.
    pub actions: Vec<Action>,
}

impl ProtocolCx<'_> {
    /// Driver time now.
    pub fn now(&self) -> Duration {
        (self.clock)()
    }

    /// Emit an action.
    pub fn emit(&mut self, a: Action) {
        self.actions.push(a);
    }

    /// Transmit `msg` to every rank except this one.
    pub fn broadcast(&mut self, msg: &Control) {
        for dest in (0..self.size).filter(|&d| d != self.rank) {
            self.actions.push(Action::Transmit {
                dest,
                msg: msg.clone(),
            });
        }
    }
}

/// The last SSN a rank sent to each destination (absent: none yet).
/// Sparse, as a rank talks to few others: a million simulated ranks cannot
/// each hold a counter per rank.
pub type SsnOut = std::collections::BTreeMap<Rank, u64>;

/// A rollback-recovery protocol.
pub trait Protocol: Send {
    /// Name (as on the command line).
    fn name(&self) -> &'static str;
    /// Consume one event, emitting actions into `cx`.
    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>);
    /// Whether a failure rolls back the survivors as well (otherwise only
    /// the dead ranks re-execute, and frames of survivors sent in an older
    /// epoch stay valid).
    fn rolls_back_survivors(&self) -> bool {
        true
    }
    /// Under message logging (and ULFM): the ranks that re-execute from a
    /// checkpoint when `dead` died, the dead themselves, or their whole
    /// correlated sets under `correlated` (004 §3.2). Frames those ranks
    /// sent before the failure belong to an execution that is rolled back.
    /// (A protocol that rolls every rank back drops older frames by epoch
    /// instead; [`ProtocolKind::rolled_back_with`] names its ranks.)
    fn rolled_back_with(&self, dead: &[Rank]) -> Vec<Rank> {
        dead.to_vec()
    }
    /// Whether the rank may transmit an application message now. Pessimistic
    /// logging holds sends until every determinant they may depend on is
    /// stored (004 §2.2: no unlogged nondeterministic event precedes a send).
    fn send_ready(&self) -> bool {
        true
    }
    /// Why sends wait, when it is the user's to know (a bounded log with
    /// its spill full); `None` for the waits of the protocol itself.
    fn send_wait(&self) -> Option<String> {
        None
    }
    /// What a send that has waited long for `send_ready` waits for, in the
    /// protocol's terms (said once, so that a wait that never ends can be
    /// told from a slow one).
    fn send_stalled(&self) -> Option<String> {
        None
    }
    /// Whether this rank's re-execution may still regenerate messages that
    /// receivers already have (`ssn_out`: the last SSN sent to each rank,
    /// indexed by rank). Their SSNs must come out as in the first execution, so
    /// a nondeterministic event the log does not order (applying a new
    /// one-sided request) waits until this is false.
    fn regenerating(&self, _ssn_out: &SsnOut) -> bool {
        false
    }
    /// Whether every one-sided operation must travel as request and reply
    /// messages on the FIFO channels (where markers can order them, 000
    /// §III-B), rather than access the target's memory through the driver.
    /// The message-logging protocols (`pessimistic`, `ulml`, `correlated`)
    /// log them as messages; `rma` logs accesses itself (003 §3.2).
    fn one_sided_as_messages(&self) -> bool {
        false
    }
    /// Whether an access to `target` may be issued now (the engine waits,
    /// handling arrivals, until it may): under `rma`, a replacement's until
    /// every rank told it what it has (so it knows what it regenerates),
    /// and a combining access until its target acknowledged the flag that
    /// says it is pending.
    fn access_ready(&self, _target: Rank, _window: crate::driver::WinId) -> bool {
        true
    }
    /// Whether an access to `target` on `window` is held in the protocol's
    /// log instead of issued (`rma`: `target` is being recovered and pulls
    /// it at its fences); the engine then completes it without the driver.
    fn access_held(&self, _target: Rank, _window: crate::driver::WinId) -> bool {
        false
    }
    /// Whether the fence entered on `window` may go on to its barrier
    /// (`rma`: a recovering rank first applies the epoch's logged accesses).
    fn fence_ready(&self, _window: crate::driver::WinId) -> bool {
        true
    }
    /// Whether this rank may expose a window now (`rma`: a replacement
    /// exposes its windows only once every rank knows it is recovering, so
    /// that no access meant for its predecessor lands in it).
    fn exposure_ready(&self) -> bool {
        true
    }
    /// Whether the protocol sees every application message that arrives
    /// from another rank ([`Event::AppArrive`]), to record or hold it
    /// (channel state, 000 §II).
    fn watches_arrivals(&self) -> bool {
        false
    }
    /// Whether the protocol wants every send from the application and the
    /// engine (`AppSend` and `AppSent`) and answers [`Protocol::may_initiate`]
    /// (the logging protocols get `AppSend` regardless).
    fn watches_sends(&self) -> bool {
        false
    }
    /// Whether the application may start a communication now; the engine
    /// waits (handling arrivals) until it may. `chandy-lamport` under a
    /// double barrier: not during the wave (000 §IV-C).
    fn may_initiate(&self) -> bool {
        true
    }
    /// Whether a one-sided request from `origin` is refused instead of
    /// served: its origin is told to issue it again (peek-and-get, 000
    /// §IV-B).
    fn refuses_request(&mut self, _origin: Rank) -> bool {
        false
    }
    /// Whether collectives whose result is the same everywhere are logged
    /// as one result per rank (002 §2.2) instead of as their point-to-point
    /// messages. Their internal messages then carry no SSN and are never
    /// logged; the engine brackets them with `CollectiveBegin`/`End`.
    fn logs_collective_results(&self) -> bool {
        false
    }
    /// Append the protocol's own state to a checkpoint piece being built (a
    /// logging protocol's sender log: 004 §2.2, sender-based data is part of
    /// the checkpoint). Logged payloads are shared with the piece, not
    /// copied ([`crate::engine::frame::append_with_blobs`]).
    fn save_state(&self, _piece: &mut PieceWriter<'_>) -> Result<()> {
        Ok(())
    }
    /// About how many bytes [`Protocol::save_state`] copies into the
    /// piece's buffer (shared payloads not counted): the buffer is
    /// allocated once at its full size (grown by doubling, it was copied
    /// again at every step, each time into fresh pages).
    fn state_size_hint(&self) -> usize {
        0
    }
    /// Restore what [`Protocol::save_state`] appended (the rest of the
    /// piece; logged payloads are copied out of it, so that the restored
    /// piece is not kept alive by the log).
    fn load_state(&mut self, _state: Bytes) -> Result<()> {
        Ok(())
    }
}

/// A scripted stand-in for the engine in protocol tests: one rank's view
/// (placement, store, HSR, RSN, time), feeding events and collecting the
/// actions.
#[cfg(test)]
pub(crate) mod testing {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::{Action, Control, Event, Protocol, ProtocolCx};
    use crate::Rank;
    use crate::engine::frame::{AppMessage, Envelope};
    use crate::store::partner::PartnerStore;
    use crate::topology::Placement;

    /// An application message of `len` bytes (each `ssn as u8`).
    pub(crate) fn app_message(src: Rank, dest: Rank, ssn: u64, len: usize) -> AppMessage {
        AppMessage {
            envelope: Envelope {
                src,
                dest,
                context: 0,
                tag: 0,
            },
            ssn,
            payload: bytes::Bytes::from(vec![ssn as u8; len]),
        }
    }

    /// Rank `rank` of a job placed in blocks.
    pub(crate) struct Harness {
        pub(crate) rank: Rank,
        pub(crate) pl: Placement,
        pub(crate) store: PartnerStore,
        pub(crate) hsr: BTreeMap<Rank, u64>,
        pub(crate) rsn: u64,
        pub(crate) now: Duration,
    }

    impl Harness {
        /// Rank `rank` of `ranks` on `nodes` nodes.
        pub(crate) fn new(rank: Rank, ranks: usize, nodes: usize) -> Self {
            let pl = Placement::block(ranks, nodes).expect("valid placement");
            Harness {
                rank,
                store: PartnerStore::new(rank, &pl),
                pl,
                hsr: BTreeMap::new(),
                rsn: 0,
                now: Duration::ZERO,
            }
        }

        /// Feed `ev` to `p`; the actions it emitted.
        pub(crate) fn run(&self, p: &mut dyn Protocol, ev: Event<'_>) -> Vec<Action> {
            let mut cx = ProtocolCx {
                rank: self.rank,
                size: self.pl.ranks(),
                placement: &self.pl,
                store: &self.store,
                clock: &|| self.now,
                app_sent: 0,
                app_arrived: 0,
                hsr: &self.hsr,
                ssn_out: &self.hsr,
                rsn: self.rsn,
                epoch: 0,
                after_gsync: false,
                actions: Vec::new(),
            };
            p.handle(ev, &mut cx);
            cx.actions
        }

        /// Feed a control frame from `src`.
        pub(crate) fn control(
            &self,
            p: &mut dyn Protocol,
            src: Rank,
            msg: impl Into<Control>,
        ) -> Vec<Action> {
            self.run(
                p,
                Event::Control {
                    src,
                    msg: msg.into(),
                },
            )
        }
    }
}
