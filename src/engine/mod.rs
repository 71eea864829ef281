//! The rank engine: message matching, requests, safe points, window
//! bookkeeping, and the glue between the application, the protocol, the
//! checkpoint store and the driver.
//!
//! The engine is single-threaded (it runs on its rank's thread) and touches the
//! world only through its [`Endpoint`]. It turns application operations and
//! arrivals into protocol [`Event`]s and carries out the protocol's
//! [`Action`]s. Failure handling is uniform: when the protocol asks for a
//! rollback or a failure, the engine sets an *interrupt*; every later call
//! returns it, so the rank function unwinds with `?` back to the harness.

pub mod frame;
mod rma_messages;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::driver::shared::apply_to_memory;
use crate::driver::{Endpoint, LockType, RmaOp, RmaReply, Stat, WinId};
use crate::fault::FaultPoint;
use crate::protocol::{Action, Collective, Control, Determinant, Event, Protocol, ProtocolCx};
use crate::segments::Segments;
use crate::store::pool::BufferPool;
use crate::store::{CheckpointStore, Piece, PieceWriter, StoreEvent, StoreOut};
use crate::topology::Placement;
use crate::trace::{Activity, Mark, Tracer};
use crate::{Error, Rank, Result};
use frame::{AgreeValue, AppMessage, Body, ContextId, Envelope, Frame, Incoming, RuntimeMsg, Tag};

/// Identifier of a nonblocking receive request.
pub type ReqId = u64;

/// Which messages a receive or probe accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MatchSpec {
    /// Context.
    pub context: ContextId,
    /// Source world rank, or any.
    pub source: Option<Rank>,
    /// Tag, or any.
    pub tag: Option<Tag>,
}

impl MatchSpec {
    fn matches(&self, e: &Envelope) -> bool {
        e.context == self.context
            && self.source.is_none_or(|s| s == e.src)
            && self.tag.is_none_or(|t| t == e.tag)
    }
}

/// The runtime state saved with the application's state in every checkpoint
/// piece (DESIGN principle 3: the runtime saves what it holds).
///
/// A piece is laid out as `[app length: u64 LE][application state
/// (postcard)][Snapshot (postcard)][protocol state]`
/// ([`Protocol::save_state`], whose logged payloads the piece shares rather
/// than copies: [`Segments`]): the application's state comes first so that
/// it is serialized straight into the piece's buffer (its length is written
/// once it is known) and restored from a slice of the piece (of a copy, if
/// the piece is still in segments).
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Snapshot {
    /// Safe points passed.
    pub safe_points: u64,
    /// Application-reported progress.
    pub progress: f64,
    /// Unexpected (arrived, unmatched) messages, in arrival order.
    pub unexpected: Vec<AppMessage>,
    /// Send sequence numbers per destination (only channels used).
    pub ssn_out: Vec<(Rank, u64)>,
    /// Highest SSN arrived per source (HSR; message logging only).
    pub ssn_in: Vec<(Rank, u64)>,
    /// Wildcard receptions so far (the last RSN).
    pub rsn: u64,
    /// Windows by id: memory, epochs and lock state.
    pub windows: Vec<SavedWindow>,
    /// Collectives completed per collective context.
    pub collectives: Vec<(ContextId, u64)>,
    /// Message logging: the last collective completed per context that
    /// every member entered first (`Engine::coll_synced`).
    pub synced: Vec<(ContextId, u64)>,
    /// Operations that order accesses to this rank's windows (message
    /// logging; see `Engine::op_begin`).
    pub ops: u64,
    /// Communicators created (split, duplicate), in creation order.
    pub communicators: Vec<CreatedCommunicator>,
}

/// A window as a checkpoint saves it (window memory is owned by the runtime
/// and saved by it: DESIGN principle 3).
#[derive(Debug, Serialize, Deserialize)]
pub struct SavedWindow {
    /// The window's id.
    pub id: WinId,
    /// This rank's part of the window.
    pub memory: serde_bytes::ByteBuf,
    /// Its epochs (as origin) and lock state (as target).
    pub state: WindowState,
}

/// How [`append_snapshot`] reads a window's memory: `memory(id, f)` hands
/// window `id`'s memory to `f` where it lies.
pub(crate) type WindowMemory<'f> =
    dyn FnMut(WinId, &mut dyn FnMut(&[u8]) -> Result<()>) -> Result<()> + 'f;

/// Append `snap` to `head` as postcard encodes a [`Snapshot`], with
/// `windows` (id and state, in order) in place of `snap.windows`: each
/// window's memory is read through `memory`, so that it is serialized
/// without a copy. Postcard
/// encodes a struct as its fields in order and a sequence as its length
/// and elements, so appending the fields one by one gives the same bytes
/// (`snapshot_appended_field_by_field_is_the_derived_encoding`); the
/// destructuring below stops compiling when a field is added.
pub(crate) fn append_snapshot(
    snap: &Snapshot,
    windows: &[(WinId, WindowState)],
    memory: &mut WindowMemory<'_>,
    head: &mut Vec<u8>,
) -> Result<()> {
    let Snapshot {
        safe_points,
        progress,
        unexpected,
        ssn_out,
        ssn_in,
        rsn,
        windows: _,
        collectives,
        synced,
        ops,
        communicators,
    } = snap;
    frame::postcard_append(safe_points, head)?;
    frame::postcard_append(progress, head)?;
    frame::postcard_append(unexpected, head)?;
    frame::postcard_append(ssn_out, head)?;
    frame::postcard_append(ssn_in, head)?;
    frame::postcard_append(rsn, head)?;
    frame::postcard_append(&windows.len(), head)?;
    for (id, state) in windows {
        frame::postcard_append(id, head)?;
        memory(*id, &mut |m| {
            frame::postcard_append(serde_bytes::Bytes::new(m), head)
        })?;
        frame::postcard_append(state, head)?;
    }
    frame::postcard_append(collectives, head)?;
    frame::postcard_append(synced, head)?;
    frame::postcard_append(ops, head)?;
    frame::postcard_append(communicators, head)
}

/// The state of one window that a checkpoint saves besides its memory.
///
/// A checkpoint between two fences is inside an access epoch (MPI-3.1
/// §11.5.1: a fence ends one epoch and begins the next, so `fence; loop {
/// put; fence; ...; checkpoint }` checkpoints inside one), so the epoch
/// comes back with the memory; before it did, a restored rank's first put
/// failed with "no access epoch". Passive-target epochs are not in it: a
/// safe point inside one is refused (see [`Engine::safe_point`]).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct WindowState {
    /// A fence has opened an access epoch to every target (GSYNC).
    pub fence_open: bool,
    /// E(p -> q) of 003 §2.2 is `all_targets + per_target[q]`: FLUSH/UNLOCK
    /// to q increments q's term, GSYNC and the `_all` forms the common one
    /// (sparse, so a window costs O(targets used), not O(ranks)).
    pub all_targets: u64,
    /// The per-target terms of E(p -> q).
    pub per_target: BTreeMap<Rank, u64>,
    /// Shared locks held on this rank's window by origins (message logging:
    /// the engine applies lock requests itself, so the state is saved in
    /// checkpoints and replayed like the memory; otherwise the driver
    /// holds it, and no lock is held at a checkpoint).
    pub readers: u32,
    /// An exclusive lock is held on this rank's window (message logging).
    pub writer: bool,
    /// Lock requests of other ranks waiting at this target, in arrival
    /// order (message logging): a contended lock is queued here and
    /// granted by the unlock that frees it, so a waiting origin sends one
    /// request and logs one reply, however long it waits.
    pub waiting: VecDeque<(Rank, LockType)>,
}

/// Bytes of the application state's length at the start of a piece.
const APP_LEN: usize = 8;

/// What [`Engine::safe_point`] calls to have the application's state
/// appended to a piece's buffer.
pub type AppSerializer<'a> = dyn FnMut(&mut Vec<u8>) -> Result<()> + 'a;

/// A piece's application state (a slice of it: no copy) and the rest of it
/// (see [`Snapshot`] for the layout), or why it cannot be.
fn split_piece(data: &Bytes) -> std::result::Result<(Bytes, Bytes), String> {
    let len = data
        .get(..APP_LEN)
        .and_then(|b| <[u8; APP_LEN]>::try_from(b).ok())
        .map(u64::from_le_bytes)
        .ok_or_else(|| format!("{} bytes: too short for a piece", data.len()))?;
    let end = usize::try_from(len)
        .ok()
        .and_then(|l| l.checked_add(APP_LEN))
        .filter(|&e| e <= data.len())
        .ok_or_else(|| {
            format!(
                "the application state's length ({len} bytes) exceeds the piece ({} bytes)",
                data.len()
            )
        })?;
    Ok((data.slice(APP_LEN..end), data.slice(end..)))
}

/// A communicator this rank created: its first context id, and its group
/// in world ranks (`None`: a split this rank joined no part of).
pub type CreatedCommunicator = (ContextId, Option<Vec<Rank>>);

/// Context ids a communicator takes (point-to-point and collective).
pub const COMMUNICATOR_CONTEXTS: u64 = 2;

/// The context that carries one-sided operations as messages under message
/// logging (no communicator ever gets it: contexts are allocated upwards
/// from [`FIRST_FREE_CONTEXT`]).
pub(crate) const RMA_CONTEXT: ContextId = ContextId::MAX;
/// Tag of a one-sided request (origin to target).
pub(crate) const RMA_REQUEST: Tag = 0;
/// Tag of its reply (target to origin).
pub(crate) const RMA_REPLY: Tag = 1;

/// Whether `msg` is a one-sided request (applied by `serve_rma`, not
/// matched by a receive).
fn is_rma_request(msg: &AppMessage) -> bool {
    leg_kind(msg) == crate::cuts::LegKind::Request
}

/// What `msg` is on its channel (for the snapshot wave and the cut
/// checker, 000 §III-B).
pub(crate) fn leg_kind(msg: &AppMessage) -> crate::cuts::LegKind {
    use crate::cuts::LegKind;
    match (msg.envelope.context == RMA_CONTEXT, msg.envelope.tag) {
        (true, RMA_REQUEST) => LegKind::Request,
        (true, _) => LegKind::Reply,
        _ => LegKind::Message,
    }
}

/// Whether `msg` refuses a one-sided request (peek-and-get, 000 §IV-B): a
/// reply without an outcome (an outcome is never empty), which tells the
/// origin to issue the request again.
pub(crate) fn is_refusal(msg: &AppMessage) -> bool {
    leg_kind(msg) == crate::cuts::LegKind::Reply && msg.payload.is_empty()
}

/// A one-sided request as it travels under message logging.
#[derive(Debug, Serialize, Deserialize)]
struct RmaRequest {
    /// First, so that a target can read it without decoding the access.
    after: RmaAfter,
    window: WinId,
    op: RmaOp,
}

/// Collectives the target must have entered before it may apply a request
/// that its log does not place: `(context, index)` of the last collective
/// the origin completed that every member had to enter first, on each
/// communicator the target belongs to (see `Engine::coll_synced`). In a
/// failure-free run the target has always entered them; a restored target
/// re-executing behind them has not, and applying the request then would
/// put it before accesses that the collective ordered before it (a read
/// between two fences). Under ULML the origin can be past them by logged
/// results (002 §3.2); under any logging protocol a survivor is.
type RmaAfter = Vec<(ContextId, u64)>;

/// What the protocol decided about an access (`rma`), other than "issue
/// it".
#[derive(Debug)]
enum AccessVerdict {
    /// Its target has it already: complete it without the driver.
    Skip,
    /// Complete it with this data, read in the first execution.
    Answer(Bytes),
    /// Handle it again once the protocol says it is ready.
    Defer,
}

/// A request-based one-sided operation in flight: the receive of its
/// reply, on `window` to `target`.
#[derive(Debug, Clone)]
struct PendingRma {
    reply: ReqId,
    window: WinId,
    target: Rank,
    /// The operation (issued again if the target refuses it).
    op: RmaOp,
    /// Its request was dropped: the outcome is not kept.
    forgotten: bool,
}

/// The target's answer to an [`RmaRequest`]: the reply, or why the access
/// failed (reported at the origin as [`Error::Rma`]).
type RmaOutcome = std::result::Result<RmaReply, String>;

/// How a collective call proceeds (see [`Engine::coll_begin`]).
#[derive(Debug, Clone, PartialEq)]
pub enum CollStart {
    /// Run the collective's algorithm with messages tagged by
    /// [`collective_tag`]`(kind, index)`; `unlogged`: its messages carry no
    /// SSN and are not logged (the result is logged instead).
    Run {
        /// Collective number on its context.
        index: u64,
        /// Send with [`Engine::send_unlogged`].
        unlogged: bool,
    },
    /// The result is already known from a log (a substitute re-executing a
    /// collective the others completed, 002 §3.3): no message is exchanged.
    Logged {
        /// Collective number on its context.
        index: u64,
        /// The result.
        result: Segments,
    },
}

/// Why the current collective attempt stops early.
#[derive(Debug)]
enum CollOutcome {
    /// Start it again.
    Restart,
    /// Complete it with this logged result.
    Result(Segments),
}

/// Collective numbers are kept in tags modulo this (3 bits hold the kind).
const COLL_INDEX_MOD: u64 = 1 << 28;

/// The tag of the messages of collective number `index` of `kind` on its
/// context: all messages of one call share it (each rank receives at most
/// once per source in one call), and a message is never matched by another
/// call, so a duplicate left by a restarted attempt cannot be.
pub fn collective_tag(kind: Collective, index: u64) -> Tag {
    kind.index() as Tag | (((index % COLL_INDEX_MOD) as Tag) << 3)
}

/// Whether collective number `index` (from a tag) is at or before `done`,
/// modulo the tag's range.
fn coll_index_done(tag: Tag, done: u64) -> bool {
    let index = (tag as u64 >> 3) % COLL_INDEX_MOD;
    let behind = (done % COLL_INDEX_MOD + COLL_INDEX_MOD - index) % COLL_INDEX_MOD;
    behind < COLL_INDEX_MOD / 2
}

/// Per-window bookkeeping of the origin side (epochs, locks).
#[derive(Debug)]
struct WinLocal {
    /// World ranks of the window's group (`lock_all` locks exactly these).
    group: Vec<Rank>,
    /// Passive-target locks held, per target (never at a safe point).
    locks: BTreeMap<Rank, LockType>,
    lock_all: bool,
    /// What checkpoints save: epochs and, as target, lock state.
    state: WindowState,
}

/// Owned events queued inside the engine.
#[derive(Debug)]
enum Ev {
    Control(Rank, Control),
    PieceStored(u64),
    PieceRestored(u64),
    PieceFetchFailed { generation: u64, holder: Rank },
}

/// Per-rank execution statistics.
#[derive(Debug, Default, Clone)]
pub struct RankStats {
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Bytes of this rank's last piece.
    pub checkpoint_bytes: usize,
}

/// The engine of one rank.
pub struct Engine {
    ep: Box<dyn Endpoint>,
    proto: Box<dyn Protocol>,
    store: Box<dyn CheckpointStore>,
    placement: Placement,
    rank: Rank,
    size: usize,
    epoch: u64,
    replacement: bool,
    held_frames: Vec<Frame>,
    /// Arrivals to handle before polling the driver again (frames of a new
    /// epoch that came before its failure notice).
    deferred: VecDeque<Incoming>,

    unexpected: VecDeque<AppMessage>,
    posted: Vec<(ReqId, MatchSpec)>,
    /// Receives matched and not yet picked up (a few at most: a short
    /// vector beats hashing here, on every message).
    completed: Vec<(ReqId, AppMessage)>,
    next_req: ReqId,
    /// Last SSN sent per destination rank (absent: none yet). A map, not
    /// a vector indexed by rank: P counters on each of P ranks was most of
    /// a large simulation's memory (issue 38).
    ssn_out: crate::protocol::SsnOut,
    /// Highest SSN arrived per source (HSR, 002 §3.1); kept under message
    /// logging only.
    ssn_in: BTreeMap<Rank, u64>,
    /// Wildcard-source receptions in this execution (RSN of the last one).
    rsn: u64,
    /// Logged outcomes of the next nondeterministic receptions (wildcard
    /// receptions and applied one-sided requests) in RSN order
    /// (re-execution under message logging).
    replay: VecDeque<Determinant>,
    /// The messages (source, SSN) that determinants still in `replay` name
    /// for wildcard receptions: during a replay no receive naming its
    /// source takes one (in the first execution a wildcard receive had it).
    reserved: HashSet<(Rank, u64)>,
    /// Operations begun that order accesses to this rank's windows
    /// (message logging; see [`Engine::op_begin`]).
    ops: u64,
    /// One-sided requests arrived and not yet applied.
    rma_inbox: VecDeque<AppMessage>,
    /// One-sided operations travel as request and reply messages for
    /// every call (message logging, `chandy-lamport`); otherwise only the
    /// request-based ones do, and the blocking ones access the target's
    /// memory through the driver.
    rma_messages: bool,
    /// Survivors keep their windows (message logging) while blocking
    /// accesses go through the driver (`rma`): windows are exposed and
    /// reached in the window epoch 0, and the protocol, not the world
    /// epoch, keeps accesses away from a rank being recovered.
    direct_logged: bool,
    /// What the protocol said about the access being handled, if it said
    /// not to issue it as it is.
    access_verdict: Option<AccessVerdict>,
    /// Request-based operations of this origin whose reply has not been
    /// taken in (completed by `wait`, `test`, a flush, an unlock or a
    /// fence).
    rma_pending: Vec<PendingRma>,
    /// Outcomes of request-based operations completed by a flush, an
    /// unlock or a fence, until their request asks (by reply id).
    rma_finished: Vec<(ReqId, RmaOutcome)>,
    /// Applying requests now (the replies it sends may wait for progress,
    /// which must not apply requests in turn), or a message waits to leave
    /// (a reply sent meanwhile would overtake it on its channel).
    serving_rma: bool,
    /// The protocol logs messages: a failure rolls back only the dead ranks,
    /// an application message is accepted only as the next SSN of its
    /// channel, and frames of survivors from older epochs stay valid.
    logging: bool,
    /// Application messages that arrived during recovery, handled after
    /// the restore (message logging).
    early: Vec<AppMessage>,
    /// Frames from epochs before this are dropped (a global rollback).
    rollback_floor: u64,
    /// Per rank replaced under message logging: the epoch its current
    /// incarnation started in (older frames from it are dropped).
    incarnations: BTreeMap<Rank, u64>,
    /// The protocol withheld the message being sent.
    withhold: bool,
    /// While a send waits for its determinants to be stored: logged
    /// messages the protocol resends meanwhile (a peer asked), held back
    /// until then, since the one being sent may be among them and nothing
    /// may leave before the determinants it depends on (004 §2.2).
    held_resends: Option<Vec<AppMessage>>,
    /// Taking part in the recovery from this failure event (a survivor
    /// serving logs), for fault injection.
    serving: Option<u64>,
    /// Application messages sent and arrived in this execution (coordinated
    /// checkpointing uses the totals to know no message is in transit).
    app_sent: u64,
    app_arrived: u64,
    /// Receives posted and one-sided calls (accesses, locks, flushes,
    /// fences) in this execution: with `app_sent`, what tells whether the
    /// rank communicated since its last GSYNC.
    comm_calls: u64,
    /// `comm_calls + app_sent` when the last GSYNC (a fence on a window of
    /// every rank) completed (003 §3.1.2's Gsync scheme).
    gsync_mark: Option<u64>,
    /// The fence under way began with no request-based operation pending
    /// on any window: one still pending may reach its target after the
    /// target captured (the fence settles its own window's alone).
    fence_clean: bool,

    interrupt: Option<Error>,
    released: bool,
    capture_due: Option<u64>,
    /// The protocol sees every arrival from another rank
    /// ([`Event::AppArrive`]) and may hold it.
    watch_arrivals: bool,
    /// Whether the protocol wants every send ([`Protocol::watches_sends`]).
    watch_sends: bool,
    /// The protocol held the arrival being handled.
    hold: bool,
    /// The protocol asked to record this rank's state at this safe point
    /// ([`Action::RecordState`]).
    record_due: Option<u64>,
    /// States recorded and not yet stored, per generation: the piece's
    /// head and the seconds recording took.
    recorded: BTreeMap<u64, (Vec<u8>, f64, Duration)>,
    /// A non-blocking snapshot's generation in progress at this rank
    /// (recorded, piece not yet stored): a kill at `R@checkpoint:N` lands
    /// in the N-th one's wave.
    in_wave: Option<u64>,
    /// Pieces stored for generations not yet committed: `generation ->
    /// (bytes, seconds, when this rank recorded it)`, reported when it
    /// commits.
    unreported: BTreeMap<u64, (usize, f64, Duration)>,
    /// Application messages and one-sided requests that arrived while
    /// this rank recovered: after the restored ones and the restored
    /// channel state.
    arrived_in_recovery: (VecDeque<AppMessage>, VecDeque<AppMessage>),
    committed_now: Option<u64>,
    resume: Option<Option<u64>>,
    /// Ranks whose `Done` arrived (finalize, rank 0).
    done_from: BTreeSet<Rank>,
    /// This rank sent `Done` (finalize).
    sent_done: bool,
    /// `Exit` received (finalize, other ranks).
    exit_received: bool,
    /// The driver says every rank's value is known: finalize is over.
    job_complete: bool,
    /// Entering finalize (a fault point of its own).
    finalizing: bool,
    recovering: bool,
    /// `Some(n)` while taking part in the n-th checkpoint this rank entered.
    in_checkpoint: Option<u64>,
    checkpoints_entered: u64,

    safe_points: u64,
    progress: f64,
    restore_app: Option<Bytes>,
    /// Restored windows (memory, epochs, lock state), taken as each is
    /// re-created.
    restore_windows: BTreeMap<WinId, SavedWindow>,
    /// Communicators this execution created, in order (checkpointed).
    communicators: Vec<CreatedCommunicator>,
    /// Under message logging, the restored checkpoint's communicators not
    /// yet re-created (see [`Engine::recreated_communicator`]).
    restore_communicators: VecDeque<CreatedCommunicator>,
    restored_generation: Option<u64>,

    windows: BTreeMap<WinId, WinLocal>,
    next_context: ContextId,
    stats: RankStats,
    /// Buffers of this rank's dropped pieces, for the next ones.
    piece_pool: BufferPool,
    /// Bytes of the application state in the last piece (the likely size
    /// of the next).
    last_app_len: usize,

    /// The protocol logs collectives with the same result everywhere as
    /// results (ULML).
    coll_results: bool,
    /// Collectives begun per collective context.
    coll_seq: BTreeMap<ContextId, u64>,
    /// The collective in progress whose result is logged: `(context, index)`.
    coll_current: Option<(ContextId, u64)>,
    coll_outcome: Option<CollOutcome>,
    /// Message logging: per collective context, the last collective this
    /// rank completed of a kind that completes nowhere before every member
    /// entered it (barrier, all-reduce, all-gather; a fence is a barrier).
    /// A one-sided request carries these ([`RmaAfter`]): a restored target
    /// re-executing behind them applies it only once it has entered them
    /// again, as in the first execution (see `Engine::unplaced_ready`).
    coll_synced: BTreeMap<ContextId, u64>,

    /// ULFM: failures are reported to the program (FailureHandling::Return).
    ulfm: Option<Box<Ulfm>>,

    /// The rank's timeline recorder (`Config::trace`; `None`: off).
    trace: Option<Box<Tracer>>,
    /// Under message logging: seconds spent on the send path for the log
    /// since the last report ([`Stat::SendLogging`]).
    send_logging_s: f64,
    /// The last collective's result came from a log (the rank replays).
    coll_replayed: bool,
}

/// ULFM state of a rank (failures reported to the program, 002 §3.2).
#[derive(Debug, Default)]
struct Ulfm {
    /// World ranks that died (and were not respawned since).
    failed: BTreeSet<Rank>,
    /// Failures the program acknowledged.
    acked: BTreeSet<Rank>,
    /// Revoked contexts.
    revoked: BTreeSet<ContextId>,
    /// Agreements begun per communicator (by point-to-point context).
    agree_seq: BTreeMap<ContextId, u64>,
    /// Contributions received as coordinator: `(context, seq)` → member → value.
    offers: BTreeMap<(ContextId, u64), BTreeMap<Rank, AgreeValue>>,
    /// Decided agreements (the two newest per communicator are kept, with
    /// their group, to hand to a new coordinator if the old one dies).
    decided: BTreeMap<(ContextId, u64), (Vec<Rank>, AgreeValue)>,
    /// Respawned incarnation: the communicator it was told to join.
    join: Option<(ContextId, Vec<Rank>)>,
}

impl Ulfm {
    /// The coordinator of an agreement over `group`: its first live member.
    fn coordinator(&self, group: &[Rank]) -> Option<Rank> {
        group.iter().copied().find(|r| !self.failed.contains(r))
    }

    fn remember(&mut self, key: (ContextId, u64), group: &[Rank], value: AgreeValue) {
        self.decided
            .entry(key)
            .or_insert_with(|| (group.to_vec(), value));
        self.offers.remove(&key);
        let (context, seq) = key;
        self.decided
            .retain(|&(c, s), _| c != context || s + 2 > seq);
    }
}

/// A send held by the protocol this long says what it waits for, once.
const SEND_STALL_REPORT: Duration = Duration::from_secs(30);

/// The first context id free for `dup`/`split`/windows (0 and 1 are the
/// world communicator's point-to-point and collective contexts).
pub const FIRST_FREE_CONTEXT: ContextId = 2;

impl Engine {
    /// An engine for the rank behind `ep`.
    pub fn new(
        ep: Box<dyn Endpoint>,
        proto: Box<dyn Protocol>,
        store: Box<dyn CheckpointStore>,
        placement: Placement,
    ) -> Self {
        let (rank, size, epoch) = (ep.rank(), ep.size(), ep.start_epoch());
        let logging = !proto.rolls_back_survivors();
        let coll_results = proto.logs_collective_results();
        let rma_messages = proto.one_sided_as_messages();
        let direct_logged = logging && !rma_messages;
        let proto_watches = proto.watches_arrivals();
        let proto_watches_sends = proto.watches_sends();
        // A replacement re-executes with every rank that rolled back with
        // it (its correlated set): what they sent before this epoch belongs
        // to the execution that was rolled back.
        let incarnations = if logging && epoch > 0 {
            proto
                .rolled_back_with(&[rank])
                .into_iter()
                .map(|r| (r, epoch))
                .collect()
        } else {
            BTreeMap::new()
        };
        Engine {
            ep,
            proto,
            store,
            placement,
            rank,
            size,
            epoch,
            replacement: epoch > 0,
            held_frames: Vec::new(),
            deferred: VecDeque::new(),
            unexpected: VecDeque::new(),
            posted: Vec::new(),
            completed: Vec::new(),
            next_req: 1,
            ssn_out: BTreeMap::new(),
            ssn_in: BTreeMap::new(),
            rsn: 0,
            replay: VecDeque::new(),
            reserved: HashSet::new(),
            ops: 0,
            rma_inbox: VecDeque::new(),
            rma_messages,
            direct_logged,
            access_verdict: None,
            rma_pending: Vec::new(),
            rma_finished: Vec::new(),
            serving_rma: false,
            logging,
            early: Vec::new(),
            rollback_floor: if logging { 0 } else { epoch },
            incarnations,
            withhold: false,
            held_resends: None,
            serving: None,
            app_sent: 0,
            app_arrived: 0,
            comm_calls: 0,
            gsync_mark: None,
            fence_clean: false,
            interrupt: None,
            released: false,
            capture_due: None,
            watch_arrivals: proto_watches,
            watch_sends: proto_watches_sends,
            hold: false,
            record_due: None,
            recorded: BTreeMap::new(),
            in_wave: None,
            unreported: BTreeMap::new(),
            arrived_in_recovery: (VecDeque::new(), VecDeque::new()),
            committed_now: None,
            resume: None,
            exit_received: false,
            job_complete: false,
            finalizing: false,
            done_from: BTreeSet::new(),
            sent_done: false,
            recovering: false,
            in_checkpoint: None,
            checkpoints_entered: 0,
            safe_points: 0,
            progress: 0.0,
            restore_app: None,
            restore_windows: BTreeMap::new(),
            communicators: Vec::new(),
            restore_communicators: VecDeque::new(),
            restored_generation: None,
            windows: BTreeMap::new(),
            next_context: FIRST_FREE_CONTEXT,
            stats: RankStats::default(),
            piece_pool: BufferPool::new(),
            last_app_len: 0,
            coll_results,
            coll_seq: BTreeMap::new(),
            coll_current: None,
            coll_synced: BTreeMap::new(),
            coll_outcome: None,
            ulfm: None,
            trace: None,
            send_logging_s: 0.0,
            coll_replayed: false,
        }
    }

    /// Record a timeline of this rank, merging spans shorter than
    /// `threshold` (module [`crate::trace`]).
    pub fn record_trace(&mut self, threshold: Duration) {
        self.trace = Some(Box::new(Tracer::new(threshold)));
    }

    /// Run `f` as one span of `activity` on the timeline (just `f` when
    /// none is recorded).
    fn traced<T>(
        &mut self,
        activity: Activity,
        f: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        if self.trace.is_none() {
            return f(self);
        }
        self.span_open(activity);
        let r = f(self);
        self.span_close(activity);
        r
    }

    fn span_open(&mut self, activity: Activity) {
        if self.trace.is_none() {
            return; // no clock read when off
        }
        let now = self.ep.now();
        let replay_over = self
            .trace
            .as_ref()
            .is_some_and(|t| t.is_open(Activity::Replay))
            && !self.replaying();
        if let Some(t) = &mut self.trace {
            if replay_over {
                t.close(Activity::Replay, now);
            }
            t.open(activity, now);
        }
    }

    /// Whether a re-execution under a logging protocol has not caught up
    /// yet: determinants still force receptions, sends are still ones
    /// receivers have, or the last collective was answered from a log.
    fn replaying(&self) -> bool {
        !self.replay.is_empty() || self.proto.regenerating(&self.ssn_out) || self.coll_replayed
    }

    fn span_close(&mut self, activity: Activity) {
        if self.trace.is_none() {
            return;
        }
        let now = self.ep.now();
        if let Some(t) = &mut self.trace {
            t.close(activity, now);
        }
        self.flush_trace(false);
    }

    /// End this incarnation's timeline now: what is open closes here and
    /// everything recorded goes to the driver (the rank was killed).
    pub fn end_timeline(&mut self) {
        self.flush_trace(true);
    }

    fn trace_mark(&mut self, mark: Mark, arg: u64) {
        if self.trace.is_none() {
            return;
        }
        let now = self.ep.now();
        if let Some(t) = &mut self.trace {
            t.mark(mark, now, arg);
        }
    }

    /// Hand the driver what the timeline holds, if a batch is due (`end`:
    /// everything, closing what is open: the rank ends or is killed).
    fn flush_trace(&mut self, end: bool) {
        if self.trace.is_none() {
            return;
        }
        let now = self.ep.now();
        let Some(t) = &mut self.trace else { return };
        if end {
            t.close_all(now);
        }
        if let Some(batch) = t.batch(now, end) {
            self.ep.record(Stat::Trace(batch));
        }
    }

    /// Report failures to the program instead of handing them to the
    /// protocol (ULFM, `FailureHandling::Return`).
    pub fn report_failures(&mut self) {
        self.ulfm = Some(Box::default());
    }

    /// Whether this incarnation starts by recovering (a replacement under a
    /// recovering protocol, or a whole-job restart), as opposed to a rank
    /// respawned by the program (ULFM), which starts fresh.
    pub fn starts_in_recovery(&self) -> bool {
        self.replacement && self.ulfm.is_none()
    }

    /// Whether this incarnation was respawned by the program (ULFM).
    pub fn is_respawned(&self) -> bool {
        self.replacement && self.ulfm.is_some()
    }

    /// This rank (world).
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Job size.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Current world epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether this incarnation starts in recovery: a replacement for a
    /// dead rank, or every rank of a job restarted from a checkpoint.
    pub fn is_replacement(&self) -> bool {
        self.replacement
    }

    /// Start in recovery (whole-job restart from stored checkpoints).
    pub fn start_in_recovery(&mut self) {
        self.replacement = true;
    }

    /// Placement of the job.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// Statistics of this rank.
    pub fn stats(&self) -> &RankStats {
        &self.stats
    }

    /// The generation restored at the last recovery, if any.
    pub fn restored_generation(&self) -> Option<u64> {
        self.restored_generation
    }

    /// Driver time.
    pub fn now(&self) -> Duration {
        self.ep.now()
    }

    // ----- control flow -------------------------------------------------

    fn check(&self) -> Result<()> {
        match &self.interrupt {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn fault(&mut self) -> Result<()> {
        let at = FaultPoint {
            iteration: self.safe_points,
            progress: self.progress,
            recovery: self.recovering.then_some(self.epoch).or(self.serving),
            checkpoint: self.in_checkpoint.or(self.in_wave),
            finalizing: self.finalizing,
            evacuations: 0,
        };
        let r = self.ep.fault_point(&at);
        if r.is_err() {
            // Killed here (threads, sim): what the timeline holds goes
            // first. (A rank process is killed by its launcher: it loses
            // at most the last batch's worth.)
            self.flush_trace(true);
        }
        r
    }

    /// Entry of every application-level operation: pending interrupt, then
    /// fault injection.
    pub fn enter(&mut self) -> Result<()> {
        self.check()?;
        self.fault()?;
        self.serve_rma()
    }

    /// Record application progress (0..=1), used by `--kill R@P%` and
    /// progress bars.
    pub fn set_progress(&mut self, fraction: f64) {
        self.progress = fraction.clamp(0.0, 1.0);
        self.ep.report_progress(self.progress);
    }

    /// Charge `d` of computation (virtual time on the simulator). A rank
    /// with windows serves one-sided requests meanwhile: they are messages
    /// this rank applies (issue 33, defect 9b), and as an MPI library's
    /// progress engine runs inside its calls, a rank that computes through
    /// the runtime must not stall its origins until it is done.
    pub fn compute(&mut self, d: Duration) -> Result<()> {
        self.enter()?;
        if self.windows.is_empty() {
            return self.ep.compute(d);
        }
        let deadline = self.ep.now() + d;
        loop {
            self.check()?;
            let now = self.ep.now();
            if now >= deadline {
                return Ok(());
            }
            self.progress(Some(deadline - now))?;
        }
    }

    /// Safe points passed.
    pub fn safe_points(&self) -> u64 {
        self.safe_points
    }

    // ----- transport ----------------------------------------------------

    fn transmit(&mut self, dest: Rank, body: Body) -> Result<()> {
        let frame = Frame {
            src: self.rank,
            epoch: self.epoch,
            body,
        };
        if dest == self.rank {
            return self.on_frame(frame);
        }
        self.ep.send(dest, frame)
    }

    /// Wait for one arrival (or up to `timeout`) and handle it.
    /// Nothing is handled while an interrupt is pending: arrivals wait until
    /// recovery starts (so a protocol never sees a frame of the new epoch
    /// before its own `Recover` event).
    fn progress(&mut self, timeout: Option<Duration>) -> Result<()> {
        // Requests a replay places at the current operation are applied
        // before blocking: the operation that made them due (a safe point
        // waiting for its set, a request awaiting its reply) may otherwise
        // wait for an arrival that depends on them.
        self.serve_rma()?;
        if self.interrupt.is_some() {
            return Ok(());
        }
        let inc = match self.deferred.pop_front() {
            Some(inc) => Some(inc),
            None => self.ep.poll(timeout)?,
        };
        if let Some(inc) = inc {
            self.handle_arrival(inc)?;
        }
        self.serve_rma()
    }

    /// Handle everything already arrived, without blocking.
    fn drain(&mut self) -> Result<()> {
        self.drain_while(|_| true)
    }

    /// Handle what has already arrived, without blocking, for as long as
    /// `more` holds.
    fn drain_while(&mut self, more: impl Fn(&Self) -> bool) -> Result<()> {
        while self.interrupt.is_none() && more(self) {
            let inc = match self.deferred.pop_front() {
                Some(inc) => inc,
                None => match self.ep.poll(Some(Duration::ZERO))? {
                    Some(inc) => inc,
                    None => break,
                },
            };
            self.handle_arrival(inc)?;
        }
        self.serve_rma()
    }

    /// Handle one arrival. A survivor serving a recovery may be blocked on
    /// a receive the whole time: `R@recovery` kills land before and after
    /// each arrival it handles meanwhile.
    fn handle_arrival(&mut self, inc: Incoming) -> Result<()> {
        if self.serving.is_some() {
            self.fault()?;
        }
        self.on_incoming(inc)?;
        if self.serving.is_some() && self.interrupt.is_none() {
            self.fault()?;
        }
        Ok(())
    }

    fn on_incoming(&mut self, inc: Incoming) -> Result<()> {
        match inc {
            Incoming::Frame(f) => {
                let stale = f.epoch < self.rollback_floor
                    || self.incarnations.get(&f.src).is_some_and(|&e| f.epoch < e);
                if stale {
                    Ok(()) // from an execution that has been rolled back
                } else if f.epoch > self.epoch {
                    self.held_frames.push(f);
                    Ok(())
                } else {
                    self.on_frame(f)
                }
            }
            Incoming::FailureNotice { epoch, dead } => {
                if epoch <= self.epoch {
                    return Ok(());
                }
                self.epoch = epoch;
                self.trace_mark(Mark::Detected, epoch);
                if self.logging || self.ulfm.is_some() {
                    let again = self.proto.rolled_back_with(&dead);
                    for &d in &again {
                        self.incarnations.insert(d, epoch);
                    }
                    // A dead rank's `Done` no longer stands: its replacement
                    // re-executes and needs everyone's logs until it is done.
                    self.done_from.retain(|r| !again.contains(r));
                } else {
                    self.rollback_floor = epoch;
                }
                if self.ulfm.is_some() {
                    self.ulfm_failed(&dead)?;
                } else {
                    self.handle(Event::PeerFailed { epoch, dead: &dead })?;
                }
                if self.logging && self.sent_done && dead.contains(&0) && self.rank != 0 {
                    self.transmit(0, Body::Runtime(RuntimeMsg::Done))?;
                }
                // Frames sent in the new epoch before we heard of it are
                // handled next, before anything else arrives.
                let held = std::mem::take(&mut self.held_frames);
                let mut now = Vec::new();
                for f in held {
                    if f.epoch == self.epoch {
                        now.push(Incoming::Frame(f));
                    } else if f.epoch > self.epoch {
                        self.held_frames.push(f);
                    }
                }
                for inc in now.into_iter().rev() {
                    self.deferred.push_front(inc);
                }
                Ok(())
            }
            Incoming::Abort { rank, reason } => {
                self.interrupt = Some(Error::Aborted { rank, reason });
                Ok(())
            }
            Incoming::JobComplete => {
                self.job_complete = true;
                Ok(())
            }
        }
    }

    fn on_frame(&mut self, f: Frame) -> Result<()> {
        match f.body {
            Body::App(msg) => {
                self.arrive(msg);
                Ok(())
            }
            Body::Control(c) => self.run_events(vec![Ev::Control(f.src, c)]),
            Body::Store(m) => {
                let mut out = StoreOut::default();
                self.store.on_msg(f.src, m, &mut out)?;
                self.apply_store_out(out)
            }
            Body::Runtime(m) => {
                match m {
                    RuntimeMsg::Done => {
                        self.done_from.insert(f.src);
                    }
                    RuntimeMsg::Exit => self.exit_received = true,
                    m => self.on_ulfm_msg(f.src, m)?,
                }
                Ok(())
            }
        }
    }

    fn arrive(&mut self, msg: AppMessage) {
        if let Some(u) = &self.ulfm
            && u.revoked.contains(&msg.envelope.context)
        {
            return;
        }
        if self.watch_arrivals && msg.envelope.src != self.rank {
            self.hold = false;
            // Its actions (holding, recording) cannot fail the arrival.
            let _ = self.handle(Event::AppArrive { msg: &msg });
            if std::mem::take(&mut self.hold) {
                return;
            }
        }
        self.arrive_unwatched(msg);
    }

    /// An arrival past the protocol's watch (delivered by it, or not
    /// watched).
    fn arrive_unwatched(&mut self, msg: AppMessage) {
        if self.logging {
            // A recovering rank's state is about to be replaced: the sender
            // resends logged messages after the restore. Otherwise accept only
            // the channel's next SSN: lower is a duplicate (re-execution,
            // resend), higher follows a message dropped during recovery,
            // which the sender resends from its log with everything after it.
            if self.recovering && msg.ssn != 0 {
                // Judged once the restore set this channel's HSR: a rank
                // of the same correlated set that resumed first sends
                // unlogged messages nobody would resend.
                self.early.push(msg);
                return;
            }
            if msg.ssn == 0 {
                // An unlogged collective message. Kept while recovering (it
                // is never sent again, and another replacement that never
                // saw this rank die sends it without waiting; the restore
                // keeps arrivals); dropped if its collective is over here
                // (a duplicate from a restarted attempt).
                let ctx = msg.envelope.context;
                if self
                    .coll_done(ctx)
                    .is_some_and(|d| coll_index_done(msg.envelope.tag, d))
                {
                    return;
                }
            } else {
                let hsr = self.ssn_in.entry(msg.envelope.src).or_insert(0);
                if msg.ssn != *hsr + 1 {
                    return;
                }
                *hsr = msg.ssn;
            }
        }
        self.app_arrived += 1;
        if is_rma_request(&msg) {
            // Applied by `serve_rma`, outside this arrival (its reply may
            // have to wait for progress).
            self.rma_inbox.push_back(msg);
            return;
        }
        if let Some(i) = self.posted.iter().position(|(_, s)| self.accepts(s, &msg)) {
            let (id, spec) = self.posted.remove(i);
            if self.deliver(id, msg, spec.source.is_none()) {
                self.rematch_replay();
            }
        } else {
            self.unexpected.push_back(msg);
        }
    }

    /// Whether `spec` may match `msg`: during replay a wildcard-source
    /// reception matches only the message its determinant names, and a
    /// reception naming its source never a message a later determinant
    /// names (it may arrive, and wait unexpected, before the wildcard
    /// receive it belongs to may take it).
    fn accepts(&self, spec: &MatchSpec, msg: &AppMessage) -> bool {
        spec.matches(&msg.envelope)
            && match spec.source {
                None => self.replay.front().is_none_or(|d| {
                    d.at.is_none() && d.src == msg.envelope.src && d.ssn == msg.ssn
                }),
                // (An empty set answers without hashing.)
                Some(_) => !self.reserved.contains(&(msg.envelope.src, msg.ssn)),
            }
    }

    /// Consume the front determinant of the replay; whether there was one.
    pub(super) fn pop_determinant(&mut self) -> bool {
        let Some(d) = self.replay.pop_front() else {
            return false;
        };
        if d.at.is_none() {
            self.reserved.remove(&(d.src, d.ssn));
        }
        true
    }

    /// Complete receive `id` with `msg`; returns whether it consumed a
    /// determinant of the replay (the caller then calls
    /// [`Engine::rematch_replay`]).
    fn deliver(&mut self, id: ReqId, msg: AppMessage, wildcard: bool) -> bool {
        let (rsn, replayed) = if wildcard {
            self.rsn += 1;
            (Some(self.rsn), self.pop_determinant())
        } else {
            (None, false)
        };
        // Protocols only observe deliveries; their actions for this event
        // (logging determinants) cannot fail the delivery itself. Only
        // message logging protocols look at single messages, and only a
        // wildcard reception has an outcome to log: a named one is fixed
        // by the program (a protocol call per delivery cost CG W about 1%
        // under `ulml`, for nothing).
        if let Some(rsn) = rsn.filter(|_| self.logging) {
            let _ = self.handle(Event::AppDeliver {
                msg: &msg,
                rsn,
                applied_at: None,
                replayed,
            });
        }
        self.completed.push((id, msg));
        replayed
    }

    /// During a replay, the message the front determinant names may have
    /// arrived while an earlier one was at the front: it waits among the
    /// unexpected messages, and a wildcard receive that will match it may be
    /// posted already (several posted at once, or a one-sided request
    /// applied in between). Once the replay is over, any message it held
    /// back may match a receive posted meanwhile. Nothing else would look at
    /// them again: match them now, as their arrival would have (each to the
    /// earliest posted receive that takes it, in arrival order; `accepts`
    /// lets through only what the replay allows). Called after a
    /// determinant is consumed; a replay only, never the receive path.
    fn rematch_replay(&mut self) {
        while let Some((mi, pi)) = self.unexpected.iter().enumerate().find_map(|(mi, m)| {
            (self.posted.iter())
                .position(|(_, s)| self.accepts(s, m))
                .map(|pi| (mi, pi))
        }) {
            let (id, spec) = self.posted.remove(pi);
            let Some(msg) = self.unexpected.remove(mi) else {
                return;
            };
            self.deliver(id, msg, spec.source.is_none());
        }
    }

    // ----- protocol glue ------------------------------------------------

    fn handle(&mut self, event: Event<'_>) -> Result<()> {
        let ep = &self.ep;
        let mut cx = ProtocolCx {
            rank: self.rank,
            size: self.size,
            placement: &self.placement,
            store: self.store.as_ref(),
            clock: &|| ep.now(),
            app_sent: self.app_sent,
            app_arrived: self.app_arrived,
            hsr: &self.ssn_in,
            ssn_out: &self.ssn_out,
            rsn: self.rsn,
            epoch: self.epoch,
            after_gsync: self.gsync_mark == Some(self.comm_calls + self.app_sent),
            actions: Vec::new(),
        };
        self.proto.handle(event, &mut cx);
        let actions = cx.actions;
        self.execute(actions)
    }

    fn run_events(&mut self, evs: Vec<Ev>) -> Result<()> {
        for ev in evs {
            match ev {
                Ev::Control(src, msg) => self.handle(Event::Control { src, msg })?,
                Ev::PieceStored(generation) => self.handle(Event::PieceStored { generation })?,
                Ev::PieceRestored(generation) => {
                    self.handle(Event::PieceRestored { generation })?
                }
                Ev::PieceFetchFailed { generation, holder } => {
                    self.handle(Event::PieceFetchFailed { generation, holder })?
                }
            }
        }
        Ok(())
    }

    fn apply_store_out(&mut self, out: StoreOut) -> Result<()> {
        for (dest, m) in out.sends {
            self.transmit(dest, Body::Store(m))?;
        }
        let evs = out
            .events
            .into_iter()
            .map(|e| match e {
                StoreEvent::Stored { generation } => Ev::PieceStored(generation),
                StoreEvent::Restored { generation } => Ev::PieceRestored(generation),
                StoreEvent::FetchFailed {
                    generation,
                    holder,
                    detail,
                } => {
                    // Said here: the protocol may well recover from another
                    // holder, but the damage is the user's to know about.
                    tracing::warn!(
                        rank = self.rank,
                        generation,
                        holder,
                        "lazarus: rank {}: fetching its checkpoint generation {generation}: {detail}",
                        self.rank
                    );
                    Ev::PieceFetchFailed { generation, holder }
                }
            })
            .collect();
        self.run_events(evs)
    }

    fn execute(&mut self, actions: Vec<Action>) -> Result<()> {
        for a in actions {
            match a {
                Action::Transmit { dest, msg } => self.transmit(dest, Body::Control(msg))?,
                Action::Capture { generation } => self.capture_due = Some(generation),
                Action::RecordState { generation } => self.record_due = Some(generation),
                Action::StoreRecorded { generation } => self.store_recorded(generation)?,
                Action::Hold => self.hold = true,
                Action::Deliver { msg } => self.arrive_unwatched(msg),
                Action::Commit { generation } => {
                    self.store.commit(generation)?;
                    // A non-blocking snapshot commits after its safe point,
                    // wherever this rank is then.
                    let stored = self.unreported.remove(&generation);
                    self.unreported.retain(|&g, _| g > generation);
                    match stored {
                        Some((bytes, seconds, entered)) => {
                            self.stats.checkpoints += 1;
                            self.stats.checkpoint_bytes = bytes;
                            self.ep.record(Stat::Checkpoint {
                                generation,
                                bytes,
                                seconds,
                                latency_s: (self.ep.now().saturating_sub(entered)).as_secs_f64(),
                            });
                        }
                        _ => self.committed_now = Some(generation),
                    }
                    self.trace_mark(Mark::Commit, generation);
                }
                Action::ReleaseSafePoint => self.released = true,
                Action::Rollback { epoch } => {
                    if self.interrupt.is_none() || self.recovering {
                        self.interrupt = Some(Error::Rollback {
                            epoch,
                            generation: None,
                        });
                    }
                }
                Action::Fail(e) => self.interrupt = Some(e),
                Action::RetainOnly { keep } => self.store.retain_only(keep)?,
                Action::Discard { generation } => self.store.discard(generation),
                Action::Fetch { generation, holder } => {
                    let mut out = StoreOut::default();
                    self.store.fetch(generation, holder, &mut out)?;
                    self.apply_store_out(out)?;
                }
                Action::Rebuild { generation } => {
                    let mut out = StoreOut::default();
                    self.store.rebuild(generation, &mut out)?;
                    self.apply_store_out(out)?;
                }
                Action::Replicate { generation } => {
                    let mut out = StoreOut::default();
                    self.store.replicate(generation, &mut out)?;
                    self.apply_store_out(out)?;
                }
                Action::Resume { generation } => self.resume = Some(generation),
                Action::Record(stat) => self.ep.record(stat),
                Action::Withhold => self.withhold = true,
                Action::Resend { msg } => {
                    self.trace_mark(Mark::Resend, 1);
                    match &mut self.held_resends {
                        Some(held) => held.push(msg),
                        None => self.transmit(msg.envelope.dest, Body::App(msg))?,
                    }
                }
                Action::DropOlderPieces { owner, keep } => self.store.retain_owner(owner, keep),
                Action::Checkpointed { generation } => {
                    self.committed_now = Some(generation);
                    self.trace_mark(Mark::Commit, generation);
                }
                Action::Replay { determinants } => self.load_replay(determinants)?,
                Action::InRecovery(e) => self.serving = e,
                Action::CollectiveResult {
                    context,
                    index,
                    result,
                } => {
                    if self.coll_current == Some((context, index)) {
                        self.coll_outcome = Some(CollOutcome::Result(result));
                    }
                }
                Action::SkipAccess => self.access_verdict = Some(AccessVerdict::Skip),
                Action::AnswerAccess(data) => {
                    self.access_verdict = Some(AccessVerdict::Answer(data));
                }
                Action::DeferAccess => self.access_verdict = Some(AccessVerdict::Defer),
                Action::ApplyAccess { window, op } => {
                    let (mut op, mut outcome) = (Some(op), Ok(RmaReply::Done));
                    self.ep.with_local_window(window, &mut |m| {
                        if let Some(op) = op.take() {
                            outcome = apply_to_memory(m, window, op);
                        }
                    })?;
                    outcome?;
                }
                Action::CollectiveRestart => {
                    if self.coll_current.is_some() && self.coll_outcome.is_none() {
                        self.coll_outcome = Some(CollOutcome::Restart);
                    }
                }
            }
        }
        Ok(())
    }

    // ----- point-to-point -----------------------------------------------

    /// Send `payload` to world rank `dest` (eager; completes at once).
    pub fn send(&mut self, dest: Rank, context: ContextId, tag: Tag, payload: Bytes) -> Result<()> {
        self.traced(Activity::Send, |e| {
            e.send_message(dest, context, tag, payload, true)
        })
    }

    /// Send a message of a collective whose result is logged instead
    /// ([`CollStart::Run`] with `unlogged`): no SSN, never logged.
    pub fn send_unlogged(
        &mut self,
        dest: Rank,
        context: ContextId,
        tag: Tag,
        payload: Bytes,
    ) -> Result<()> {
        self.traced(Activity::Send, |e| {
            e.send_message(dest, context, tag, payload, false)
        })
    }

    fn send_message(
        &mut self,
        dest: Rank,
        context: ContextId,
        tag: Tag,
        payload: Bytes,
        sequenced: bool,
    ) -> Result<()> {
        self.enter()?;
        if dest >= self.size {
            return Err(Error::RankOutOfRange {
                rank: dest,
                size: self.size,
            });
        }
        if let Some(e) = self.ulfm_send_failure(dest, context) {
            return Err(e);
        }
        if self.watch_sends && !self.serving_rma {
            // A protocol may hold the application's communications back
            // for a while (000 §IV-C); a reply the engine serves is never
            // held, as a NIC's is not.
            while !self.proto.may_initiate() {
                self.check()?;
                self.progress(None)?;
            }
        }
        if sequenced && !self.serving_rma {
            self.op_begin()?;
        }
        let ssn = if sequenced {
            let ssn = self.ssn_out.entry(dest).or_insert(0);
            *ssn += 1;
            *ssn
        } else {
            0
        };
        self.app_sent += 1;
        let msg = AppMessage {
            envelope: Envelope {
                src: self.rank,
                dest,
                context,
                tag,
            },
            ssn,
            payload,
        };
        self.withhold = false;
        // Under message logging, what the log costs this send is timed
        // (two clock reads; none without a log).
        let logged_from = self.logging.then(|| self.ep.now());
        if self.logging || self.watch_sends {
            self.handle(Event::AppSend { msg: &msg })?;
            self.check()?;
        }
        if dest == self.rank {
            self.arrive(msg);
            return Ok(());
        }
        // Pessimistic condition: nothing leaves before the determinants it
        // may depend on are stored (also for a withheld message: it may be
        // resent later).
        // No request is applied meanwhile: its reply would take a later SSN
        // on a channel this message has not left on yet, and overtake it.
        let serving = std::mem::replace(&mut self.serving_rma, true);
        let mut ready = Ok(());
        if !self.proto.send_ready() {
            self.held_resends = Some(Vec::new());
            let mut told = false;
            // The clock is first read after a few arrivals: a send that
            // waits for one acknowledgement (most, under pessimistic) pays
            // nothing for the stall report.
            let mut since = None;
            let mut arrivals = 0u32;
            let mut stall_told = false;
            while ready.is_ok() && !self.proto.send_ready() {
                if !told && let Some(why) = self.proto.send_wait() {
                    // Said once per wait: it lasts until a checkpoint, and
                    // a rank that never reaches one waits for ever.
                    tracing::warn!(rank = self.rank, "lazarus: rank {}: {why}", self.rank);
                    told = true;
                }
                arrivals = arrivals.wrapping_add(1);
                if !stall_told
                    && arrivals.is_multiple_of(64)
                    && let now = self.ep.now()
                    && now.saturating_sub(*since.get_or_insert(now)) > SEND_STALL_REPORT
                {
                    stall_told = true;
                    if let Some(why) = self.proto.send_stalled() {
                        tracing::warn!(
                            rank = self.rank,
                            "lazarus: rank {}: a send has waited {} s: {why}",
                            self.rank,
                            SEND_STALL_REPORT.as_secs()
                        );
                    }
                }
                ready = self.check().and_then(|()| self.progress(None));
            }
        }
        self.serving_rma = serving;
        if let Some(from) = logged_from {
            self.send_logging_s += self.ep.now().saturating_sub(from).as_secs_f64();
        }
        // On an error this rank rolls back or the job ends: a peer's
        // request is served again by the next recovery.
        let held = self.held_resends.take();
        ready?;
        let mut sent = false;
        if let Some(held) = held {
            for m in held {
                // (An unlogged message, SSN 0, is resent only if withheld.)
                sent |= msg.ssn != 0 && m.envelope.dest == dest && m.ssn == msg.ssn;
                self.transmit(m.envelope.dest, Body::App(m))?;
            }
        }
        if std::mem::take(&mut self.withhold) || sent {
            return Ok(());
        }
        self.transmit(dest, Body::App(msg))?;
        if self.watch_sends {
            self.handle(Event::AppSent { dest })?;
        }
        Ok(())
    }

    /// Post a receive; it matches the earliest arrived message first, else
    /// the next arrival (MPI matching order).
    pub fn post_receive(&mut self, spec: MatchSpec) -> Result<ReqId> {
        self.enter()?;
        self.comm_calls += 1;
        let id = self.next_req;
        self.next_req += 1;
        if let Some(i) = self.unexpected.iter().position(|m| self.accepts(&spec, m)) {
            // (`pop_front` skips `remove`'s general shifting code for the
            // usual first one.)
            let msg = if i == 0 {
                self.unexpected.pop_front()
            } else {
                self.unexpected.remove(i)
            };
            if let Some(msg) = msg
                && self.deliver(id, msg, spec.source.is_none())
            {
                self.rematch_replay();
            }
            return Ok(id);
        }
        // Whatever arrives now came after every unexpected message: posted,
        // the receive takes the first arrival it matches, and nothing
        // beyond that needs taking in yet (a blocking receive would only
        // poll once more to find nothing).
        self.posted.push((id, spec));
        let taken_in = self
            .drain_while(|e| !e.completed.iter().any(|(r, _)| *r == id))
            .and_then(|()| self.check());
        if let Err(e) = taken_in {
            // Withdrawn. A message it got is the last arrival taken in (the
            // drain stopped there), so the end of the queue is its place;
            // unless a replay gave it one that waited unexpected. Either
            // way the error ends this execution (an interrupt, a kill, a
            // broken driver or request), and the queue's order with it.
            self.posted.retain(|(p, _)| *p != id);
            if let Some(m) = self.take_completed(id) {
                self.unexpected.push_back(m);
            }
            return Err(e);
        }
        Ok(id)
    }

    /// Complete a receive if its message is there.
    pub fn test(&mut self, id: ReqId) -> Result<Option<AppMessage>> {
        self.enter()?;
        self.drain()?;
        self.check()?;
        Ok(self.take_completed(id))
    }

    /// Wait for a receive to complete.
    pub fn wait(&mut self, id: ReqId) -> Result<AppMessage> {
        self.traced(Activity::Receive, |e| {
            e.enter()?;
            e.wait_entered(id)
        })
    }

    /// A blocking receive: post it and wait for it, one operation (one
    /// entry: interrupt check, fault point, RMA service).
    pub fn receive(&mut self, spec: MatchSpec) -> Result<AppMessage> {
        self.traced(Activity::Receive, |e| {
            let id = e.post_receive(spec)?;
            e.wait_entered(id)
        })
    }

    fn wait_entered(&mut self, id: ReqId) -> Result<AppMessage> {
        loop {
            self.check()?;
            // An interrupted collective attempt consumes nothing more: a
            // message a sender will not send again (it arrived after the
            // failure) must be left to the restarted attempt.
            if self.coll_outcome.is_some() {
                self.cancel(id);
                return Err(Error::CollectiveInterrupted);
            }
            if let Some(m) = self.take_completed(id) {
                return Ok(m);
            }
            let Some((_, spec)) = self.posted.iter().find(|(p, _)| *p == id) else {
                return Err(Error::InvalidRequest(format!(
                    "receive request {id} is not pending"
                )));
            };
            if let Some(e) = self.ulfm_receive_failure(spec) {
                self.cancel(id);
                return Err(e);
            }
            self.progress(None)?;
        }
    }

    /// The message receive `id` matched, if it did.
    fn take_completed(&mut self, id: ReqId) -> Option<AppMessage> {
        let i = self.completed.iter().position(|(r, _)| *r == id)?;
        Some(self.completed.swap_remove(i).1)
    }

    /// Cancel a receive (its handle was dropped). A message it already
    /// matched goes back to the front of the unexpected queue.
    pub fn cancel(&mut self, id: ReqId) {
        self.posted.retain(|(p, _)| *p != id);
        if let Some(m) = self.take_completed(id) {
            self.unexpected.push_front(m);
        }
    }

    /// Nonblocking probe: the envelope and length of the first matching
    /// unexpected message.
    ///
    /// Under message logging a wildcard-source probe is refused: which
    /// sender's message it saw is not logged, so a re-execution could see
    /// another and take another path (or wait for a message it already
    /// consumed by name).
    pub fn iprobe(&mut self, spec: MatchSpec) -> Result<Option<(Envelope, usize)>> {
        if self.logging && spec.source.is_none() {
            return Err(Error::config(
                "protocol",
                format!(
                    "protocol `{}` does not log which message a wildcard-source probe saw, \
                     so it could not replay it after a failure; probe a named source, or \
                     receive with a wildcard source (that outcome is logged)",
                    self.proto.name()
                ),
            ));
        }
        self.enter()?;
        self.drain()?;
        self.check()?;
        // A probe looks and takes nothing: a message a determinant still to
        // come names is there for it to see, as it was in the first
        // execution until its wildcard receive took it. (Under message
        // logging a probe names its source, see above; otherwise there is
        // no replay, and this is what a receive would match.)
        Ok(self
            .unexpected
            .iter()
            .find(|m| spec.matches(&m.envelope))
            .map(|m| (m.envelope, m.payload.len())))
    }

    /// Blocking probe.
    pub fn probe(&mut self, spec: MatchSpec) -> Result<(Envelope, usize)> {
        self.traced(Activity::Receive, |e| {
            loop {
                if let Some(x) = e.iprobe(spec)? {
                    return Ok(x);
                }
                if let Some(err) = e.ulfm_receive_failure(&spec) {
                    return Err(err);
                }
                e.progress(None)?;
                e.check()?;
            }
        })
    }

    /// Reserve `count` fresh context ids locally; callers agree on a common
    /// value with a collective (see `Communicator::agree_context`).
    pub fn next_context(&self) -> ContextId {
        self.next_context
    }

    /// After agreement: the ids `[base, base + count)` are taken.
    pub fn take_contexts(&mut self, base: ContextId, count: u64) {
        self.next_context = self.next_context.max(base + count);
    }

    // ----- collectives --------------------------------------------------

    /// Whether collectives with the same result everywhere are logged as
    /// results (the caller then passes the group to [`Engine::coll_begin`]).
    pub fn logs_collective_results(&self) -> bool {
        self.coll_results
    }

    /// Collectives completed on `context` (`None`: none begun).
    fn coll_done(&self, context: ContextId) -> Option<u64> {
        let begun = *self.coll_seq.get(&context)?;
        let current = self.coll_current.is_some_and(|(c, _)| c == context);
        Some(begun - u64::from(current))
    }

    /// Begin a collective of `kind` on collective context `context` over
    /// the world ranks `group` (needed only when
    /// [`Engine::logs_collective_results`]).
    pub fn coll_begin(
        &mut self,
        context: ContextId,
        kind: Collective,
        group: &[Rank],
    ) -> Result<CollStart> {
        self.check()?;
        // Closed by `coll_end`, or by whatever span encloses it when a
        // failure interrupts it.
        if self
            .trace
            .as_ref()
            .is_some_and(|t| !t.is_open(Activity::Collective))
        {
            self.span_open(Activity::Collective);
        }
        let index = {
            let n = self.coll_seq.entry(context).or_insert(0);
            *n += 1;
            *n
        };
        if !(self.coll_results && kind.same_result_everywhere()) {
            return Ok(CollStart::Run {
                index,
                unlogged: false,
            });
        }
        self.coll_current = Some((context, index));
        self.coll_outcome = None;
        self.handle(Event::CollectiveBegin {
            context,
            index,
            kind,
            group,
        })?;
        if let Some(CollOutcome::Result(result)) = self.coll_outcome.take() {
            self.coll_replayed = true;
            return Ok(CollStart::Logged { index, result });
        }
        self.coll_replayed = false;
        Ok(CollStart::Run {
            index,
            unlogged: true,
        })
    }

    /// After [`Error::CollectiveInterrupted`]: the logged result to complete
    /// with, or `None` to start the attempt again.
    pub fn coll_retry(&mut self) -> Result<Option<Segments>> {
        self.check()?;
        Ok(match self.coll_outcome.take() {
            Some(CollOutcome::Result(b)) => Some(b),
            Some(CollOutcome::Restart) | None => None,
        })
    }

    /// A collective completed on this rank with `result` (for kinds with
    /// the same result everywhere).
    pub fn coll_end(
        &mut self,
        context: ContextId,
        index: u64,
        kind: Collective,
        result: Option<&Segments>,
    ) -> Result<()> {
        self.span_close(Activity::Collective);
        if self.logging
            && matches!(
                kind,
                Collective::Barrier | Collective::AllReduce | Collective::AllGather
            )
        {
            self.coll_synced.insert(context, index);
        }
        if !self.coll_results {
            return Ok(());
        }
        if self.coll_current.take().is_some() {
            self.coll_outcome = None;
            // Duplicates left by restarted attempts will never be matched.
            self.unexpected.retain(|m| {
                !(m.ssn == 0
                    && m.envelope.context == context
                    && coll_index_done(m.envelope.tag, index))
            });
        }
        self.handle(Event::CollectiveEnd {
            context,
            index,
            kind,
            result,
        })
    }

    // ----- safe points and checkpoints ----------------------------------

    /// Whether a restored application state is waiting for `restore_or_else`.
    pub fn take_restored_app(&mut self) -> Option<Bytes> {
        self.restore_app.take()
    }

    /// A safe point: the protocol may save here. `serialize` appends the
    /// application's protected state to the buffer it is given when a
    /// checkpoint is taken.
    pub fn safe_point(&mut self, serialize: &mut AppSerializer<'_>) -> Result<()> {
        self.traced(Activity::SafePoint, |e| e.safe_point_here(serialize))
    }

    fn safe_point_here(&mut self, serialize: &mut AppSerializer<'_>) -> Result<()> {
        self.enter()?;
        if self.restore_app.is_some() {
            return Err(Error::NotSafePoint(
                "the rank was restored from a checkpoint but `restore_or_else` was not called before the first safe point".into(),
            ));
        }
        if !self.rma_pending.is_empty() {
            return Err(Error::NotSafePoint(format!(
                "{} one-sided request(s) still pending; wait for them, or flush, before a safe point",
                self.rma_pending.len()
            )));
        }
        if !self.posted.is_empty() || !self.completed.is_empty() {
            return Err(Error::NotSafePoint(format!(
                "{} receive request(s) still pending; complete them before a safe point",
                self.posted.len() + self.completed.len()
            )));
        }
        // A passive-target epoch cannot span a safe point, under any
        // protocol. Where checkpoints are coordinated (`coordinated`, a
        // correlated set) a checkpoint ends only once every rank taking part
        // reaches its safe point, and a rank waiting in `lock` for this lock
        // never gets there (MPI-3.1 §11.5.3: a conflicting lock is granted
        // only once its holder unlocks), so the program would hang where it
        // runs without checkpoints; and the restored targets' lock tables
        // (driver memory, which those protocols do not save since no lock
        // is held at their cut) would not show the lock. Refusing it under
        // every protocol keeps one program valid under all of them (DESIGN
        // principle 1). Fence epochs are saved instead (`WindowState`).
        if let Some((id, w)) = self
            .windows
            .iter()
            .find(|(_, w)| w.lock_all || !w.locks.is_empty())
        {
            let held = match w.locks.keys().next() {
                Some(t) if !w.lock_all => format!("a lock on rank {t}"),
                _ => "lock_all".to_string(),
            };
            return Err(Error::NotSafePoint(format!(
                "window {id}: a safe point inside a passive-target epoch ({held}) is refused; \
                 unlock before the checkpoint and lock again after it"
            )));
        }
        // Under message logging, what arrived meanwhile is handled first:
        // a safe point does not block there, and a rank that only computes
        // between safe points entered the engine nowhere else, so it never
        // saw a protocol's request to checkpoint (a log budget then held
        // nothing back: a rank outside every communicator never
        // checkpointed, and its peers' results could not be dropped).
        // Coordinated checkpointing needs no such drain: it handles
        // arrivals while it blocks in each checkpoint. (Draining for it too
        // once deadlocked `random_kills_never_change_the_answer`, with an
        // earlier engine; with this one the whole of tests/recovery.rs
        // passed four times with the drain on for every protocol, once
        // with a busy loop running alongside.)
        if self.logging {
            self.drain()?;
            self.check()?;
        }
        self.op_begin()?;
        self.safe_points += 1;
        self.released = false;
        self.capture_due = None;
        self.committed_now = None;
        let t0 = self.ep.now();
        self.handle(Event::SafePoint {
            index: self.safe_points,
        })?;
        if !self.released || self.capture_due.is_some() || self.record_due.is_some() {
            // The protocol is saving here: fault points inside the
            // checkpoint let a kill land mid-checkpoint (for a protocol that
            // releases at once, before its piece is captured).
            self.checkpoints_entered += 1;
            self.in_checkpoint = Some(self.checkpoints_entered);
        }
        let r = self.checkpoint_loop(serialize);
        self.in_checkpoint = None;
        r?;
        if let Some(generation) = self.committed_now.take() {
            self.stats.checkpoints += 1;
            let seconds = (self.ep.now() - t0).as_secs_f64();
            self.ep.record(Stat::Checkpoint {
                generation,
                bytes: self.stats.checkpoint_bytes,
                seconds,
                latency_s: seconds,
            });
        }
        if self.ep.migration_due(self.safe_points) {
            self.traced(Activity::Migration, |e| e.migrate_here(serialize))?;
        }
        Ok(())
    }

    /// Move this rank to another worker (001 §3.3) at this safe point: its
    /// state is packed as a checkpoint piece's head is (the application's
    /// protected state, unexpected messages, window memory and epoch
    /// state, communicators), with the protocol's state, and the driver
    /// carries it; no rank rolls back.
    fn migrate_here(&mut self, serialize: &mut AppSerializer<'_>) -> Result<()> {
        let head = self.snapshot_head(serialize)?;
        let bytes = head.len() + self.proto.state_size_hint();
        drop(self.piece_pool.freeze(head)); // back to the pool
        self.ep.migrate(bytes as u64)?;
        self.check()
    }

    fn checkpoint_loop(&mut self, serialize: &mut AppSerializer<'_>) -> Result<()> {
        loop {
            self.check()?;
            if self.in_checkpoint.is_some() {
                self.fault()?;
            }
            if let Some(generation) = self.record_due.take() {
                let t0 = self.ep.now();
                let head = self.traced(Activity::Checkpoint, |e| e.snapshot_head(serialize))?;
                let seconds = (self.ep.now() - t0).as_secs_f64();
                self.recorded.insert(generation, (head, seconds, t0));
                self.in_wave = self.in_checkpoint;
                self.handle(Event::Recorded { generation })?;
                continue;
            }
            if let Some(generation) = self.capture_due.take() {
                let data = self.traced(Activity::Checkpoint, |e| e.snapshot(serialize))?;
                self.stats.checkpoint_bytes = data.len();
                self.put_piece(generation, data)?;
                continue;
            }
            if self.released {
                return Ok(());
            }
            self.progress(None)?;
        }
    }

    /// Hand this rank's piece of `generation` to the store.
    fn put_piece(&mut self, generation: u64, data: Segments) -> Result<()> {
        self.traced(Activity::Storage, |e| {
            let mut out = StoreOut::default();
            e.store
                .put(Piece::new(generation, e.rank, data), &mut out)?;
            e.apply_store_out(out)
        })
    }

    fn snapshot(&mut self, serialize: &mut AppSerializer<'_>) -> Result<Segments> {
        let head = self.snapshot_head(serialize)?;
        self.finish_piece(head)
    }

    /// Store the piece of `generation` recorded at an earlier safe point,
    /// with the protocol's state as it is now (its channel state).
    fn store_recorded(&mut self, generation: u64) -> Result<()> {
        let (head, record_s, entered) = self.recorded.remove(&generation).ok_or_else(|| {
            Error::Unrecoverable(
                format!(
                    "rank {}: the protocol stores generation {generation}, which this rank has not recorded",
                    self.rank
                )
                .into(),
            )
        })?;
        let t0 = self.ep.now();
        let data = self.traced(Activity::Checkpoint, |e| e.finish_piece(head))?;
        let bytes = data.len();
        self.put_piece(generation, data)?;
        if self.recorded.is_empty() {
            self.in_wave = None;
        }
        let seconds = record_s + (self.ep.now() - t0).as_secs_f64();
        self.unreported
            .insert(generation, (bytes, seconds, entered));
        Ok(())
    }

    /// A piece's head: the application's state and the engine's, without
    /// the protocol's ([`Engine::finish_piece`]).
    fn snapshot_head(&mut self, serialize: &mut AppSerializer<'_>) -> Result<Vec<u8>> {
        // Window memory is not copied into the snapshot: it is serialized
        // from the window straight into the piece's buffer
        // (`append_snapshot`). A copy (a fresh vector each checkpoint) cost
        // its size in page faults and a pass over memory: FT class A on 4
        // rank processes spent 39% of its time zeroing fresh pages.
        let mut windows = Vec::with_capacity(self.windows.len());
        let mut window_bytes = 0;
        for (&id, w) in &self.windows {
            self.ep
                .with_local_window(id, &mut |m| window_bytes += m.len())?;
            window_bytes += 32 + 16 * w.state.per_target.len();
            windows.push((id, w.state.clone()));
        }
        let snap = Snapshot {
            safe_points: self.safe_points,
            progress: self.progress,
            // Requests not yet applied count as arrived (their SSNs are in
            // the HSR), so they are saved like unexpected messages.
            unexpected: self
                .unexpected
                .iter()
                .chain(&self.rma_inbox)
                .cloned()
                .collect(),
            ssn_out: (self.ssn_out.iter())
                .filter(|&(_, &n)| n > 0)
                .map(|(&r, &n)| (r, n))
                .collect(),
            ssn_in: self.ssn_in.iter().map(|(&r, &n)| (r, n)).collect(),
            rsn: self.rsn,
            windows: Vec::new(),
            collectives: self.coll_seq.iter().map(|(&c, &n)| (c, n)).collect(),
            synced: self.coll_synced.iter().map(|(&c, &n)| (c, n)).collect(),
            ops: self.ops,
            communicators: self.communicators.clone(),
        };
        let unexpected: usize = (snap.unexpected.iter())
            .map(|m| m.payload.len() + frame::ENCODED_MESSAGE_OVERHEAD)
            .sum();
        // The application's state is as large as last time, most likely.
        let rest = unexpected + window_bytes + 256 + self.proto.state_size_hint();
        let mut head = self.piece_pool.take(APP_LEN + self.last_app_len + rest);
        head.extend_from_slice(&[0; APP_LEN]);
        serialize(&mut head)?;
        let app_len = head.len() - APP_LEN;
        head[..APP_LEN].copy_from_slice(&(app_len as u64).to_le_bytes());
        let ep = &mut self.ep;
        append_snapshot(
            &snap,
            &windows,
            &mut |id, f| {
                let mut out = Ok(());
                ep.with_local_window(id, &mut |m| out = f(m))?;
                out
            },
            &mut head,
        )?;
        self.last_app_len = app_len;
        Ok(head)
    }

    /// The whole piece: `head` and the protocol's state.
    fn finish_piece(&mut self, head: Vec<u8>) -> Result<Segments> {
        let mut piece = PieceWriter::new(&self.piece_pool, head);
        self.proto.save_state(&mut piece)?;
        Ok(piece.finish())
    }

    // ----- recovery -----------------------------------------------------

    /// Forget everything of the execution being rolled back.
    fn reset_execution(&mut self) {
        self.unexpected.clear();
        self.early.clear();
        self.posted.clear();
        self.completed.clear();
        self.exit_received = false;
        // Under message logging the survivors' `Done`s still stand: only
        // the ranks rolled back with this one lost theirs, and the failure
        // notice took those out already. A leader that rolls back with its
        // correlated set (not dead, so nobody sends again) would otherwise
        // wait for ever for ranks that finished (issue 33, defect 2).
        if !self.logging {
            self.done_from.clear();
        }
        self.sent_done = false;
        self.ssn_in.clear();
        self.rsn = 0;
        self.replay.clear();
        self.reserved.clear();
        self.ops = 0;
        self.rma_inbox.clear();
        self.rma_pending.clear();
        self.rma_finished.clear();
        self.serving_rma = false;
        self.capture_due = None;
        self.record_due = None;
        self.recorded.clear();
        self.in_wave = None;
        self.unreported.clear();
        self.hold = false;
        self.committed_now = None;
        self.released = false;
        self.resume = None;
        for id in std::mem::take(&mut self.windows).into_keys() {
            self.ep.window_withdraw(id);
        }
        self.next_context = FIRST_FREE_CONTEXT;
        self.ssn_out.clear();
        self.app_sent = 0;
        self.app_arrived = 0;
        self.comm_calls = 0;
        self.gsync_mark = None;
        self.safe_points = 0;
        self.progress = 0.0;
        self.restore_app = None;
        self.restore_windows.clear();
        self.communicators.clear();
        self.restore_communicators.clear();
        self.coll_seq.clear();
        self.coll_current = None;
        self.coll_outcome = None;
        self.coll_synced.clear();
    }

    /// Run the protocol's recovery until it says resume (or a new failure
    /// interrupts it, returning `Err(Rollback)` again, or the protocol fails).
    /// On success the restored state waits for `restore_or_else`.
    pub fn recover(&mut self) -> Result<()> {
        // What the failure interrupted ends here on the timeline.
        if let Some(t) = &mut self.trace {
            t.close_all(self.ep.now());
        }
        self.traced(Activity::Recovery, Self::recover_here)?;
        if self.logging {
            self.coll_replayed = false;
            self.span_open(Activity::Replay);
        }
        Ok(())
    }

    fn recover_here(&mut self) -> Result<()> {
        match &self.interrupt {
            Some(Error::Rollback { .. }) | None => {}
            Some(e) => return Err(e.clone()),
        }
        self.interrupt = None;
        self.reset_execution();
        self.store.abort_transfers();
        // Damaged pieces and shards must count as lost in the inventory, so
        // that recovery uses another level or an older generation (DESIGN
        // principle 8); the user is told what was damaged and where.
        for e in self.store.scrub() {
            tracing::warn!(rank = self.rank, "lazarus: rank {}: {e}", self.rank);
        }
        self.recovering = true;
        let replacement = self.replacement && self.restored_generation.is_none();
        self.handle(Event::Recover {
            epoch: self.epoch,
            replacement,
        })?;
        loop {
            self.check()?;
            self.fault()?;
            if let Some(generation) = self.resume.take() {
                self.recovering = false;
                self.traced(Activity::Restore, |e| e.restore(generation))?;
                self.handle(Event::Restored { generation })?;
                let (messages, requests) = std::mem::take(&mut self.arrived_in_recovery);
                self.unexpected.extend(messages);
                self.rma_inbox.extend(requests);
                for msg in std::mem::take(&mut self.early) {
                    self.arrive(msg);
                }
                self.ep.record(Stat::Resumed {
                    epoch: self.epoch,
                    rolled_back: true,
                    from_scratch: generation.is_none(),
                });
                return Ok(());
            }
            self.progress(None)?;
        }
    }

    fn restore(&mut self, generation: Option<u64>) -> Result<()> {
        self.restored_generation = generation;
        let Some(g) = generation else {
            return Ok(()); // restart from the beginning
        };
        let piece = self
            .store
            .get(g, self.rank)
            .ok_or_else(|| Error::CorruptCheckpoint {
                owner: self.rank,
                generation: g,
                detail: "piece missing after recovery".into(),
            })?;
        piece.verify()?;
        let corrupt = |detail: String| Error::CorruptCheckpoint {
            owner: self.rank,
            generation: g,
            detail,
        };
        // One buffer to parse (a copy if the piece is still in segments, as
        // one this rank's partner kept in the same process is).
        let (app, rest) = split_piece(&piece.data.to_bytes()).map_err(corrupt)?;
        let (snap, tail): (Snapshot, &[u8]) =
            postcard::take_from_bytes(&rest).map_err(|e| corrupt(format!("undecodable: {e}")))?;
        let protocol_state = rest.slice(rest.len() - tail.len()..);
        self.safe_points = snap.safe_points;
        self.progress = snap.progress;
        // Messages checkpointed as unexpected were sent before the cut; any
        // that arrived during recovery come from ranks that already resumed,
        // so they follow.
        // (They join the queues after the restored channel state, see
        // `recover_here`.)
        self.arrived_in_recovery = (
            std::mem::take(&mut self.unexpected),
            std::mem::take(&mut self.rma_inbox),
        );
        let (requests, unexpected): (Vec<AppMessage>, Vec<AppMessage>) =
            snap.unexpected.into_iter().partition(is_rma_request);
        self.unexpected = unexpected.into();
        self.rma_inbox = requests.into();
        self.ssn_in = snap.ssn_in.into_iter().collect();
        self.ops = snap.ops;
        self.ssn_out.clear();
        for (r, n) in snap.ssn_out {
            if r >= self.size {
                return Err(corrupt(format!(
                    "an SSN to rank {r} in a job of {} ranks",
                    self.size
                )));
            }
            self.ssn_out.insert(r, n);
        }
        self.rsn = snap.rsn;
        self.coll_seq = snap.collectives.into_iter().collect();
        self.coll_synced = snap.synced.into_iter().collect();
        self.proto.load_state(protocol_state)?;
        self.restore_windows = snap.windows.into_iter().map(|w| (w.id, w)).collect();
        if self.logging {
            self.restore_communicators = snap.communicators.iter().cloned().collect();
        }
        self.communicators = snap.communicators;
        self.restore_app = Some(app);
        Ok(())
    }

    /// Force the outcomes of the wildcard receptions after the restored
    /// state's RSN. The determinants must follow on without a gap (a gap
    /// means one was lost, and the replay would diverge).
    fn load_replay(&mut self, mut dets: Vec<Determinant>) -> Result<()> {
        dets.retain(|d| d.rsn > self.rsn);
        dets.sort_by_key(|d| d.rsn);
        for (i, d) in dets.iter().enumerate() {
            if d.rsn != self.rsn + 1 + i as u64 {
                return Err(Error::Unrecoverable(
                    format!(
                        "rank {}: the determinant of nondeterministic reception {} is missing",
                        self.rank,
                        self.rsn + 1 + i as u64
                    )
                    .into(),
                ));
            }
        }
        self.reserved = (dets.iter())
            .filter(|d| d.at.is_none() && d.ssn != 0)
            .map(|d| (d.src, d.ssn))
            .collect();
        self.replay = dets.into();
        Ok(())
    }

    /// Whether a failure (or rollback) is pending.
    pub fn interrupted(&self) -> Option<&Error> {
        self.interrupt.as_ref()
    }

    /// Finalize: every rank reports `Done` to rank 0, which answers `Exit`
    /// once all have; a failure meanwhile makes the protocol roll back (the
    /// rank function runs again) or fail. Entering it is one fault point
    /// (kill moment `finalize`); the driver may end it early
    /// (`Incoming::JobComplete`) when every rank's value is known.
    pub fn finalize(&mut self) -> Result<()> {
        self.check()?;
        self.finalizing = true;
        let fault = self.fault();
        self.finalizing = false;
        fault?;
        // The timeline ends where the rank function did (a batch sent
        // later might reach a launcher that has concluded).
        self.flush_trace(true);
        if self.logging {
            let seconds = std::mem::take(&mut self.send_logging_s);
            self.ep.record(Stat::SendLogging { seconds });
        }
        self.handle(Event::Finish)?;
        self.sent_done = true;
        let mut told = None;
        loop {
            self.check()?;
            if self.job_complete {
                return self.ep.flush();
            }
            // Rank 0 leads, or under ULFM the first rank alive (a survivor
            // re-sends `Done` when the leader it told dies).
            let leader = (0..self.size)
                .find(|&r| !self.is_failed(r))
                .unwrap_or(self.rank);
            if told != Some(leader) {
                told = Some(leader);
                self.transmit(leader, Body::Runtime(RuntimeMsg::Done))?;
            }
            // Every live rank said `Done` only if this many did (`done_from`
            // may hold ranks that died since): the leader looks at each rank
            // once they have, not at every arrival (O(P²) at P ranks).
            let failed = self.ulfm.as_ref().map_or(0, |u| u.failed.len());
            if self.rank == leader && self.done_from.len() + failed >= self.size {
                let others: Vec<Rank> = (0..self.size)
                    .filter(|&r| !self.is_failed(r) && r != self.rank)
                    .collect();
                // A rank may have died since it said `Done` (its notice is
                // on the way): conclude only if the world is still in the
                // epoch this leader knows.
                if self.done_from.contains(&self.rank)
                    && others.iter().all(|r| self.done_from.contains(r))
                    && self.ep.conclude(self.epoch)
                {
                    for d in others {
                        self.transmit(d, Body::Runtime(RuntimeMsg::Exit))?;
                    }
                    return self.ep.flush();
                }
            } else if self.rank != leader && self.exit_received {
                return self.ep.flush();
            }
            self.progress(None)?;
        }
    }

    // ----- ULFM (failures reported to the program, 002 §3.2) -------------

    fn ulfm_process_failed(ranks: Vec<Rank>, why: &str) -> Error {
        Error::ProcessFailed {
            ranks,
            protocol: "none".into(),
            why: why.into(),
        }
    }

    fn ulfm_send_failure(&self, dest: Rank, context: ContextId) -> Option<Error> {
        let u = self.ulfm.as_ref()?;
        if u.revoked.contains(&context) {
            return Some(Error::Revoked { context });
        }
        u.failed
            .contains(&dest)
            .then(|| Self::ulfm_process_failed(vec![dest], "the destination rank failed"))
    }

    /// Why a receive (or probe) matching `spec` cannot complete under ULFM:
    /// its communicator was revoked, its source failed, or (wildcard
    /// source) a failure is not acknowledged yet.
    fn ulfm_receive_failure(&self, spec: &MatchSpec) -> Option<Error> {
        let u = self.ulfm.as_ref()?;
        if u.revoked.contains(&spec.context) {
            return Some(Error::Revoked {
                context: spec.context,
            });
        }
        match spec.source {
            Some(s) if u.failed.contains(&s) => {
                Some(Self::ulfm_process_failed(vec![s], "the source rank failed"))
            }
            Some(_) => None,
            None => {
                let unacked: Vec<Rank> = u.failed.difference(&u.acked).copied().collect();
                (!unacked.is_empty()).then(|| {
                    Self::ulfm_process_failed(
                        unacked,
                        "a wildcard receive fails while failures are not acknowledged \
                         (Communicator::ack_failed)",
                    )
                })
            }
        }
    }

    fn ulfm_mut(&mut self) -> Result<&mut Ulfm> {
        self.ulfm.as_deref_mut().ok_or_else(|| {
            Error::config(
                "failure_handling",
                "ULFM operations need failures reported to the program \
                 (Config::failure_handling(FailureHandling::Return))",
            )
        })
    }

    /// Whether `r` is known dead (ULFM; never otherwise).
    fn is_failed(&self, r: Rank) -> bool {
        self.ulfm.as_ref().is_some_and(|u| u.failed.contains(&r))
    }

    /// Mark `contexts` revoked here and drop what arrived on them.
    fn revoke_local(&mut self, contexts: &[ContextId]) -> Result<()> {
        let u = self.ulfm_mut()?;
        u.revoked.extend(contexts);
        let revoked = u.revoked.clone();
        self.unexpected
            .retain(|m| !revoked.contains(&m.envelope.context));
        Ok(())
    }

    /// `dead` failed: remember it, and hand agreements whose coordinator
    /// died to the new coordinator (a decision some members already have
    /// must be the one everybody gets).
    fn ulfm_failed(&mut self, dead: &[Rank]) -> Result<()> {
        let me = self.rank;
        let Some(u) = self.ulfm.as_deref_mut() else {
            return Ok(());
        };
        let before = u.failed.clone();
        u.failed.extend(dead);
        let mut sends = Vec::new();
        for (&(context, seq), (group, value)) in &u.decided {
            let old = group.iter().copied().find(|r| !before.contains(r));
            let new = u.coordinator(group);
            if old == new {
                continue;
            }
            let msg = RuntimeMsg::AgreeDecided {
                context,
                seq,
                value: value.clone(),
            };
            match new {
                Some(c) if c == me => {
                    for &r in group.iter().filter(|&&r| r != me && !u.failed.contains(&r)) {
                        sends.push((r, msg.clone()));
                    }
                }
                Some(c) => sends.push((c, msg)),
                None => {}
            }
        }
        for (dest, m) in sends {
            self.transmit(dest, Body::Runtime(m))?;
        }
        Ok(())
    }

    fn on_ulfm_msg(&mut self, src: Rank, m: RuntimeMsg) -> Result<()> {
        let Some(u) = self.ulfm.as_deref_mut() else {
            return Ok(()); // not reporting failures: nothing to do with these
        };
        match m {
            RuntimeMsg::Revoke { contexts } => self.revoke_local(&contexts)?,
            RuntimeMsg::AgreeOffer {
                context,
                seq,
                value,
            } => {
                if let Some((_, d)) = u.decided.get(&(context, seq)) {
                    // A late offer: the member missed the decision.
                    let reply = RuntimeMsg::AgreeDecided {
                        context,
                        seq,
                        value: d.clone(),
                    };
                    return self.transmit(src, Body::Runtime(reply));
                }
                u.offers
                    .entry((context, seq))
                    .or_default()
                    .insert(src, value);
            }
            RuntimeMsg::AgreeDecided {
                context,
                seq,
                value,
            } => {
                u.offers.remove(&(context, seq));
                u.decided
                    .entry((context, seq))
                    .or_insert_with(|| (Vec::new(), value));
            }
            RuntimeMsg::Join {
                context,
                group,
                failed,
            } => {
                u.failed = failed.into_iter().collect();
                u.join = Some((context, group));
            }
            RuntimeMsg::Done | RuntimeMsg::Exit => {}
        }
        Ok(())
    }

    /// World ranks that failed (and were not respawned), as this rank knows.
    pub fn failed_ranks(&self) -> Vec<Rank> {
        self.ulfm
            .as_ref()
            .map(|u| u.failed.iter().copied().collect())
            .unwrap_or_default()
    }

    /// Acknowledge every failure known now (wildcard receives work again);
    /// returns the acknowledged world ranks.
    pub fn ack_failed(&mut self) -> Result<Vec<Rank>> {
        self.enter()?;
        self.drain()?;
        let u = self.ulfm_mut()?;
        u.acked = u.failed.clone();
        Ok(u.acked.iter().copied().collect())
    }

    /// Revoke `contexts` here and at every live rank: pending and later
    /// operations on them fail with [`Error::Revoked`].
    pub fn revoke(&mut self, contexts: &[ContextId]) -> Result<()> {
        self.enter()?;
        self.revoke_local(contexts)?;
        let live: Vec<Rank> = (0..self.size)
            .filter(|&r| r != self.rank && !self.is_failed(r))
            .collect();
        for r in live {
            self.transmit(
                r,
                Body::Runtime(RuntimeMsg::Revoke {
                    contexts: contexts.to_vec(),
                }),
            )?;
        }
        Ok(())
    }

    /// Whether `context` was revoked.
    pub fn is_revoked(&self, context: ContextId) -> bool {
        self.ulfm
            .as_ref()
            .is_some_and(|u| u.revoked.contains(&context))
    }

    /// A fault-tolerant agreement among the live members of `group` (world
    /// ranks, in communicator order) of the communicator whose point-to-
    /// point context is `context`; works on a revoked communicator. The
    /// first live member coordinates: it waits for a contribution from
    /// every member still alive (fewer as failures are learned), combines
    /// them with the failures it knows, and sends the outcome to all. If it
    /// dies, members send their contribution (or a decision they already
    /// have) to the next one, so every survivor returns the same outcome
    /// (the failure detector here is perfect: a rank declared dead is dead).
    pub fn agree(
        &mut self,
        context: ContextId,
        group: &[Rank],
        mut value: AgreeValue,
    ) -> Result<AgreeValue> {
        self.enter()?;
        let me = self.rank;
        let seq = {
            let u = self.ulfm_mut()?;
            value
                .failed
                .extend(group.iter().filter(|r| u.failed.contains(r)));
            value.failed.sort_unstable();
            value.failed.dedup();
            let n = u.agree_seq.entry(context).or_insert(0);
            *n += 1;
            *n
        };
        let key = (context, seq);
        let mut offered_to = None;
        loop {
            self.check()?;
            let u = self.ulfm_mut()?;
            if let Some((_, d)) = u.decided.remove(&key) {
                // Received without its group: kept with it from now on.
                u.remember(key, group, d.clone());
                return Ok(d);
            }
            let coordinator = u.coordinator(group).unwrap_or(me);
            if coordinator == me {
                let offers = u.offers.get(&key);
                let all_in = group.iter().all(|r| {
                    *r == me || u.failed.contains(r) || offers.is_some_and(|o| o.contains_key(r))
                });
                if all_in {
                    let mut d = value.clone();
                    for v in offers.into_iter().flat_map(|o| o.values()) {
                        d.combine(v);
                    }
                    let known = AgreeValue {
                        flag: true,
                        failed: group
                            .iter()
                            .copied()
                            .filter(|r| u.failed.contains(r))
                            .collect(),
                        context: 0,
                    };
                    d.combine(&known);
                    let live: Vec<Rank> = group
                        .iter()
                        .copied()
                        .filter(|&r| r != me && !u.failed.contains(&r))
                        .collect();
                    u.remember(key, group, d.clone());
                    for r in live {
                        self.transmit(
                            r,
                            Body::Runtime(RuntimeMsg::AgreeDecided {
                                context,
                                seq,
                                value: d.clone(),
                            }),
                        )?;
                    }
                    return Ok(d);
                }
            } else if offered_to != Some(coordinator) {
                offered_to = Some(coordinator);
                self.transmit(
                    coordinator,
                    Body::Runtime(RuntimeMsg::AgreeOffer {
                        context,
                        seq,
                        value: value.clone(),
                    }),
                )?;
            }
            self.progress(None)?;
        }
    }

    /// Treat `ranks` as failed (an agreement said so before this rank's own
    /// notice came).
    pub fn mark_failed(&mut self, ranks: &[Rank]) -> Result<()> {
        self.ulfm_mut()?.failed.extend(ranks);
        Ok(())
    }

    /// Start new incarnations of the dead `ranks` (only the caller's
    /// driver call starts them; `start` is false on the other survivors,
    /// which just stop dropping frames for them), and count them alive.
    pub fn respawn(&mut self, ranks: &[Rank], start: bool) -> Result<()> {
        self.enter()?;
        for &r in ranks {
            self.ep.await_respawn(r);
            if start {
                self.ep.respawn(r)?;
            }
        }
        let u = self.ulfm_mut()?;
        for r in ranks {
            u.failed.remove(r);
            u.acked.remove(r);
        }
        Ok(())
    }

    /// Tell a respawned rank the communicator it joins.
    pub fn send_join(&mut self, rank: Rank, context: ContextId, group: &[Rank]) -> Result<()> {
        let failed = self.failed_ranks();
        self.transmit(
            rank,
            Body::Runtime(RuntimeMsg::Join {
                context,
                group: group.to_vec(),
                failed,
            }),
        )
    }

    /// A respawned rank: wait to be told the communicator it joins.
    pub fn wait_join(&mut self) -> Result<(ContextId, Vec<Rank>)> {
        self.enter()?;
        loop {
            self.check()?;
            if let Some(j) = self.ulfm_mut()?.join.take() {
                self.take_contexts(j.0, 2);
                return Ok(j);
            }
            self.progress(None)?;
        }
    }

    // ----- windows --------------------------------------------------------

    /// Expose a new window of `bytes` bytes under the agreed id, over the
    /// world ranks `group`.
    pub fn window_create(&mut self, id: WinId, bytes: usize, group: Vec<Rank>) -> Result<()> {
        self.enter()?;
        let init = self.restore_windows.remove(&id);
        if !(self.logging && init.is_some()) {
            // A re-creation from the checkpoint happened before it, in the
            // first execution.
            self.op_begin()?;
        }
        if let Some(w) = &init
            && w.memory.len() != bytes
        {
            return Err(Error::Rma {
                window: id,
                detail: format!(
                    "restored memory is {} bytes but the window is re-created with {bytes}",
                    w.memory.len()
                ),
            });
        }
        // A replacement under `rma` exposes its windows once every rank
        // has heard it is recovering (and holds its accesses until it is
        // live): an access meant for its predecessor must not land here.
        while self.direct_logged && !self.proto.exposure_ready() {
            self.check()?;
            self.progress(None)?;
        }
        let epoch = self.window_epoch();
        self.ep
            .window_expose(id, epoch, bytes, init.as_ref().map(|w| &w.memory[..]))?;
        self.windows.insert(
            id,
            WinLocal {
                group,
                locks: BTreeMap::new(),
                lock_all: false,
                state: init.map(|w| w.state).unwrap_or_default(),
            },
        );
        // Requests that waited for this window (re-created after a restore).
        self.serve_rma()
    }

    /// Under message logging, the id of the next window to re-create from
    /// the restored checkpoint (its contexts are taken): a rank restored
    /// alone re-executes the allocation without the others, so it must not
    /// run the allocation's collectives.
    pub fn recreated_window(&mut self) -> Option<WinId> {
        if !self.logging {
            return None;
        }
        let id = *self.restore_windows.keys().next()?;
        self.take_contexts(id, 1);
        Some(id)
    }

    /// Under message logging, the next communicator to re-create from the
    /// restored checkpoint (its contexts are taken): a rank restored alone
    /// re-executes the creation without the others, which made it before
    /// that checkpoint and do not take part again (as for windows).
    pub fn recreated_communicator(&mut self) -> Option<CreatedCommunicator> {
        let (base, group) = self.restore_communicators.pop_front()?;
        self.take_contexts(base, COMMUNICATOR_CONTEXTS);
        Some((base, group))
    }

    /// A communicator was created (by its collectives): checkpoints record
    /// it.
    pub fn communicator_created(&mut self, base: ContextId, group: Option<Vec<Rank>>) {
        self.communicators.push((base, group));
    }

    /// Withdraw a window. Under message logging the free is an operation
    /// in the order of accesses (`op_begin`): a restored rank first applies
    /// the requests its log places before it. The barrier before a free
    /// does not wait for them when ULML takes it from a logged result, and
    /// a request for a window already withdrawn is never applied, so its
    /// origin waited for the reply for ever.
    pub fn window_free(&mut self, id: WinId) -> Result<()> {
        self.enter()?;
        self.settle(|p| p.window == id)?;
        self.op_begin()?;
        self.windows.remove(&id);
        self.ep.window_withdraw(id);
        Ok(())
    }

    fn win(&mut self, id: WinId) -> Result<&mut WinLocal> {
        self.windows.get_mut(&id).ok_or(Error::Rma {
            window: id,
            detail: "no such window on this rank".into(),
        })
    }

    /// Run `f` on this rank's window memory.
    pub fn window_local(&mut self, id: WinId, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.check()?;
        self.win(id)?;
        self.op_begin()?;
        self.ep.with_local_window(id, f)
    }

    /// A communication action (PUT/GET family) of this rank as origin.
    pub fn rma(&mut self, id: WinId, target: Rank, op: RmaOp) -> Result<RmaReply> {
        self.traced(Activity::OneSided, |e| e.rma_here(id, target, op))
    }

    fn rma_here(&mut self, id: WinId, target: Rank, op: RmaOp) -> Result<RmaReply> {
        self.enter()?;
        self.check_access(id, target)?;
        if !(self.direct_logged && target != self.rank) {
            // Bounds are checked by the driver against the target's own
            // size (windows may differ in size per rank).
            return self.rma_raw(id, target, op);
        }
        let reads = op.reads_target();
        loop {
            self.await_access(id, target)?;
            let ec = self.window_epoch_of(id, target)?;
            let regenerating = self.proto.regenerating(&self.ssn_out);
            self.access_verdict = None;
            self.handle(Event::Access {
                window: id,
                target,
                op: &op,
                ec,
                regenerating,
            })?;
            self.check()?;
            match self.access_verdict.take() {
                Some(AccessVerdict::Skip) => return Ok(RmaReply::Done),
                Some(AccessVerdict::Answer(data)) => return Ok(RmaReply::Data(data)),
                Some(AccessVerdict::Defer) => continue,
                None => {}
            }
            // An access that reads, or combines, waits for its target's N
            // flag (003 Alg. 1 line 1).
            self.await_access(id, target)?;
            if !reads {
                return self.rma_raw(id, target, op);
            }
            match self.ep.rma(self.window_epoch(), target, id, op.clone()) {
                Ok(reply) => {
                    if let RmaReply::Data(data) = &reply {
                        self.handle(Event::Fetched {
                            window: id,
                            target,
                            data,
                        })?;
                    }
                    return Ok(reply);
                }
                // The target died: a read needs its replacement's memory,
                // so the access is handled again once the failure is known
                // (the protocol defers it until the replacement is live).
                Err(Error::Driver(why)) => self.await_failure_of(id, target, &why)?,
                Err(e) => return Err(e),
            }
        }
    }

    /// Wait until the protocol lets an access to `target` go (`rma`).
    fn await_access(&mut self, id: WinId, target: Rank) -> Result<()> {
        while !self.proto.access_ready(target, id) {
            self.check()?;
            self.progress(None)?;
        }
        Ok(())
    }

    /// An access to `target` failed in the driver (`why`): wait until the
    /// protocol knows the target failed ([`Protocol::access_held`]), or
    /// give up after 30 s of driver time with no failure notice.
    fn await_failure_of(&mut self, id: WinId, target: Rank, why: &str) -> Result<()> {
        let deadline = self.ep.now() + Duration::from_secs(30);
        while self.ep.now() < deadline {
            self.check()?;
            if self.proto.access_held(target, id) {
                return Ok(());
            }
            self.progress(Some(Duration::from_millis(50)))?;
        }
        Err(Error::Driver(format!(
            "RMA target {target} unavailable and no failure notice came: {why}"
        )))
    }

    /// The window epoch in which windows are exposed and reached: the
    /// world epoch, unless survivors keep their windows across failures.
    fn window_epoch(&self) -> u64 {
        if self.direct_logged { 0 } else { self.epoch }
    }

    /// Whether this origin may access `target` in window `id` now.
    fn check_access(&mut self, id: WinId, target: Rank) -> Result<()> {
        self.comm_calls += 1;
        if target >= self.size {
            return Err(Error::RankOutOfRange {
                rank: target,
                size: self.size,
            });
        }
        let w = self.win(id)?;
        if !(w.state.fence_open || w.lock_all || w.locks.contains_key(&target)) {
            return Err(Error::Rma {
                window: id,
                detail: format!(
                    "no access epoch to rank {target}: call fence, lock or lock_all first"
                ),
            });
        }
        Ok(())
    }

    /// A request-based operation (MPI's `MPI_Rget`, `MPI_Rput`,
    /// `MPI_Raccumulate`): sent as a request message to `target` and
    /// returned at once, as the id of its reply's receive. It completes by
    /// [`Engine::rma_wait`] or [`Engine::rma_test`], or by the flush,
    /// unlock or fence that ends its epoch. One on this rank's own window
    /// completes at issue.
    pub fn rma_issue(&mut self, id: WinId, target: Rank, op: RmaOp) -> Result<ReqId> {
        self.traced(Activity::OneSided, |e| {
            e.enter()?;
            e.check_access(id, target)?;
            if target == e.rank {
                let outcome = if e.rma_messages {
                    e.rma_own(id, op)?
                } else {
                    Ok(e.ep.rma(e.window_epoch(), target, id, op)?)
                };
                let ticket = e.next_req;
                e.next_req += 1;
                e.rma_finished.push((ticket, outcome));
                return Ok(ticket);
            }
            if e.direct_logged {
                // Under `rma` an access is logged as the blocking form logs
                // it (003 §3.2.3: "if the PUT is blocking then we log it
                // before issuing"), and completes at issue, which MPI
                // allows a request-based operation.
                let reply = e.rma_here(id, target, op)?;
                let ticket = e.next_req;
                e.next_req += 1;
                e.rma_finished.push((ticket, Ok(reply)));
                return Ok(ticket);
            }
            let reply = e.send_request(id, target, op.clone())?;
            e.rma_pending.push(PendingRma {
                reply,
                window: id,
                target,
                op,
                forgotten: false,
            });
            Ok(reply)
        })
    }

    /// Wait for request-based operation `ticket`.
    pub fn rma_wait(&mut self, id: WinId, ticket: ReqId) -> Result<RmaReply> {
        self.traced(Activity::OneSided, |e| {
            e.enter()?;
            e.settle(|p| p.reply == ticket)?;
            e.take_finished(id, ticket)
        })
    }

    /// Request-based operation `ticket`'s reply if it has arrived (what
    /// arrived meanwhile is handled, requests to this rank served).
    pub fn rma_test(&mut self, id: WinId, ticket: ReqId) -> Result<Option<RmaReply>> {
        self.enter()?;
        self.drain()?;
        self.check()?;
        let arrived = self.completed.iter().any(|(r, _)| *r == ticket);
        if arrived {
            self.settle(|p| p.reply == ticket)?;
        }
        if arrived || self.rma_finished.iter().any(|(t, _)| *t == ticket) {
            return self.take_finished(id, ticket).map(Some);
        }
        if self.rma_pending.iter().any(|p| p.reply == ticket) {
            return Ok(None);
        }
        Err(Error::InvalidRequest(format!(
            "one-sided request {ticket} is not pending"
        )))
    }

    /// The request of `ticket` was dropped: it still completes (at the
    /// latest when its epoch ends), its outcome is not kept.
    pub fn rma_forget(&mut self, ticket: ReqId) {
        self.rma_finished.retain(|(t, _)| *t != ticket);
        for p in &mut self.rma_pending {
            if p.reply == ticket {
                p.forgotten = true;
            }
        }
    }

    fn take_finished(&mut self, id: WinId, ticket: ReqId) -> Result<RmaReply> {
        let i = (self.rma_finished.iter().position(|(t, _)| *t == ticket)).ok_or_else(|| {
            Error::InvalidRequest(format!("one-sided request {ticket} is not pending"))
        })?;
        let (_, outcome) = self.rma_finished.swap_remove(i);
        outcome.map_err(|detail| Error::Rma { window: id, detail })
    }

    /// Complete the pending request-based operations that `which` selects,
    /// in issue order, keeping their outcomes for their requests.
    fn settle(&mut self, which: impl Fn(&PendingRma) -> bool) -> Result<()> {
        while let Some(i) = self.rma_pending.iter().position(&which) {
            let p = self.rma_pending[i].clone();
            let outcome = match self.await_reply(p.target, p.reply)? {
                Some(outcome) => outcome,
                None => self.round_trip(p.window, p.target, p.op.clone())?,
            };
            self.rma_pending.remove(i);
            if !p.forgotten {
                self.rma_finished.push((p.reply, outcome));
            }
        }
        Ok(())
    }

    /// Complete every request-based operation on window `id` (before a
    /// collective that ends all its epochs: fence, free).
    pub fn window_settle(&mut self, id: WinId) -> Result<()> {
        self.enter()?;
        self.settle(|p| p.window == id)
    }

    /// Issue an operation to the driver; if the target is gone, wait for the
    /// failure notice and return what the protocol decided.
    fn rma_raw(&mut self, id: WinId, target: Rank, op: RmaOp) -> Result<RmaReply> {
        if self.rma_messages {
            return self.rma_by_message(id, target, op);
        }
        match self.ep.rma(self.window_epoch(), target, id, op) {
            Ok(r) => Ok(r),
            Err(Error::Driver(why)) if self.direct_logged => {
                // The target died: the access is logged, and its
                // replacement pulls it (`rma`) once the protocol knows.
                self.await_failure_of(id, target, &why)?;
                Ok(RmaReply::Done)
            }
            Err(Error::Driver(why)) => {
                let deadline = self.ep.now() + Duration::from_secs(30);
                while self.ep.now() < deadline {
                    self.check()?;
                    self.progress(Some(Duration::from_millis(50)))?;
                }
                Err(Error::Driver(format!(
                    "RMA target {target} unavailable and no failure notice came: {why}"
                )))
            }
            Err(e) => Err(e),
        }
    }

    /// GSYNC (fence): collective over the window's group; the API layer adds
    /// the barrier. Opens an access epoch to every target.
    pub fn window_fence(&mut self, id: WinId) -> Result<()> {
        self.traced(Activity::OneSided, |e| e.window_fence_here(id))
    }

    fn window_fence_here(&mut self, id: WinId) -> Result<()> {
        self.enter()?;
        self.comm_calls += 1;
        self.win(id)?;
        self.settle(|p| p.window == id)?;
        let w = self.win(id)?;
        if w.lock_all || !w.locks.is_empty() {
            return Err(Error::Rma {
                window: id,
                detail: "fence inside a passive-target (lock) epoch".into(),
            });
        }
        w.state.fence_open = true;
        w.state.all_targets += 1;
        self.fence_clean = self.rma_pending.is_empty();
        if self.direct_logged {
            let group = self.win(id)?.group.clone();
            self.handle(Event::FenceEnter {
                window: id,
                group: &group,
            })?;
            // A recovering rank applies the epoch's logged accesses before
            // the barrier (003 Alg. 2).
            while !self.proto.fence_ready(id) {
                self.check()?;
                self.progress(None)?;
            }
        }
        Ok(())
    }

    /// The fence of window `id` completed on every rank of its group (the
    /// API layer's barrier returned): if the group is the world, this is
    /// a GSYNC after which a checkpoint may be captured at once (003
    /// §3.1.2), as long as the rank communicates no more before it.
    pub fn window_fence_done(&mut self, id: WinId) -> Result<()> {
        if self.win(id)?.group.len() == self.size && self.fence_clean {
            self.gsync_mark = Some(self.comm_calls + self.app_sent);
        }
        if self.direct_logged {
            self.handle(Event::FenceDone { window: id })?;
        }
        Ok(())
    }

    /// Take `target`'s lock, retrying while it is contended (arrivals, such
    /// as failure notices, are handled between attempts).
    fn acquire(&mut self, id: WinId, target: Rank, kind: LockType) -> Result<()> {
        loop {
            if self.direct_logged && target != self.rank {
                // `rma`: the epoch's SC and N flag first (003 §4.1 C), so a
                // lock held by a rank that fails is seen by its target. A
                // target that died meanwhile is opened again, at its
                // replacement.
                self.handle(Event::LockOpen { window: id, target })?;
                self.await_access(id, target)?;
            }
            if let RmaReply::Granted(true) = self.rma_raw(id, target, RmaOp::TryLock(kind))? {
                return Ok(());
            }
            self.progress(Some(Duration::from_micros(50)))?;
            self.check()?;
        }
    }

    /// LOCK(p -> q).
    pub fn window_lock(&mut self, id: WinId, target: Rank, kind: LockType) -> Result<()> {
        self.traced(Activity::OneSided, |e| e.window_lock_here(id, target, kind))
    }

    fn window_lock_here(&mut self, id: WinId, target: Rank, kind: LockType) -> Result<()> {
        self.enter()?;
        self.comm_calls += 1;
        let w = self.win(id)?;
        if w.locks.contains_key(&target) || w.lock_all {
            return Err(Error::Rma {
                window: id,
                detail: format!("rank {target} is already locked by this origin"),
            });
        }
        self.acquire(id, target, kind)?;
        self.win(id)?.locks.insert(target, kind);
        Ok(())
    }

    /// UNLOCK(p -> q): closes the epoch to `target`.
    pub fn window_unlock(&mut self, id: WinId, target: Rank) -> Result<()> {
        self.traced(Activity::OneSided, |e| e.window_unlock_here(id, target))
    }

    fn window_unlock_here(&mut self, id: WinId, target: Rank) -> Result<()> {
        self.enter()?;
        self.comm_calls += 1;
        let kind = *self.win(id)?.locks.get(&target).ok_or(Error::Rma {
            window: id,
            detail: format!("unlock of rank {target}, which this origin has not locked"),
        })?;
        // The epoch's request-based operations complete before it ends.
        self.settle(|p| p.window == id && p.target == target)?;
        self.win(id)?.locks.remove(&target);
        self.rma_raw(id, target, RmaOp::Unlock(kind))?;
        *self.win(id)?.state.per_target.entry(target).or_insert(0) += 1;
        self.epoch_closed(id, &[target], true)
    }

    /// Tell a protocol that logs accesses (`rma`) that this origin's
    /// epochs to `targets` on window `id` closed (by an unlock: `unlock`).
    fn epoch_closed(&mut self, id: WinId, targets: &[Rank], unlock: bool) -> Result<()> {
        if !self.direct_logged {
            return Ok(());
        }
        let me = self.rank;
        for &target in targets.iter().filter(|&&t| t != me) {
            self.handle(Event::EpochClosed {
                window: id,
                target,
                unlock,
            })?;
        }
        Ok(())
    }

    /// lock_all: a shared lock on every target.
    pub fn window_lock_all(&mut self, id: WinId) -> Result<()> {
        self.traced(Activity::OneSided, |e| e.window_lock_all_here(id))
    }

    fn window_lock_all_here(&mut self, id: WinId) -> Result<()> {
        self.enter()?;
        self.comm_calls += 1;
        let w = self.win(id)?;
        if w.lock_all || !w.locks.is_empty() {
            return Err(Error::Rma {
                window: id,
                detail: "lock_all while already holding locks".into(),
            });
        }
        for t in self.win(id)?.group.clone() {
            self.acquire(id, t, LockType::Shared)?;
        }
        self.win(id)?.lock_all = true;
        Ok(())
    }

    /// unlock_all.
    pub fn window_unlock_all(&mut self, id: WinId) -> Result<()> {
        self.traced(Activity::OneSided, |e| e.window_unlock_all_here(id))
    }

    fn window_unlock_all_here(&mut self, id: WinId) -> Result<()> {
        self.enter()?;
        self.comm_calls += 1;
        if !self.win(id)?.lock_all {
            return Err(Error::Rma {
                window: id,
                detail: "unlock_all without lock_all".into(),
            });
        }
        self.settle(|p| p.window == id)?;
        let group = self.win(id)?.group.clone();
        for &t in &group {
            self.rma_raw(id, t, RmaOp::Unlock(LockType::Shared))?;
        }
        let w = self.win(id)?;
        w.lock_all = false;
        w.state.all_targets += 1;
        self.epoch_closed(id, &group, true)
    }

    /// FLUSH(p -> q) (all targets if `None`): completes outstanding
    /// operations (blocking ones completed at issue; request-based ones are
    /// waited for here) and closes the epoch.
    pub fn window_flush(&mut self, id: WinId, target: Option<Rank>) -> Result<()> {
        self.traced(Activity::OneSided, |e| e.window_flush_here(id, target))
    }

    fn window_flush_here(&mut self, id: WinId, target: Option<Rank>) -> Result<()> {
        self.enter()?;
        self.comm_calls += 1;
        if let Some(t) = target.filter(|&t| t >= self.size) {
            return Err(Error::RankOutOfRange {
                rank: t,
                size: self.size,
            });
        }
        self.win(id)?;
        self.settle(|p| p.window == id && target.is_none_or(|t| p.target == t))?;
        let w = self.win(id)?;
        let locked: Vec<Rank> = match target {
            Some(t) => {
                *w.state.per_target.entry(t).or_insert(0) += 1;
                vec![t]
            }
            None => {
                w.state.all_targets += 1;
                w.group.clone()
            }
        };
        // A flush inside a fence epoch closes no passive-target epoch.
        let w = self.win(id)?;
        let locked: Vec<Rank> = (locked.into_iter())
            .filter(|t| w.lock_all || w.locks.contains_key(t))
            .collect();
        self.epoch_closed(id, &locked, false)
    }

    /// E(p -> q) of 003 §2.2 for this origin.
    pub fn window_epoch_of(&mut self, id: WinId, target: Rank) -> Result<u64> {
        let w = self.win(id)?;
        Ok(w.state.all_targets + w.state.per_target.get(&target).copied().unwrap_or(0))
    }
}
