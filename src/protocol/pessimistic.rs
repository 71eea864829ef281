//! Protocol `pessimistic`: pessimistic sender-based message logging with
//! uncoordinated checkpoints (004 §2.2; the library-level protocol of
//! 002 §2.1). A failure rolls back only the ranks that died; everyone else
//! keeps its progress.
//!
//! **Payload copy (sender-based).** Every application message a rank sends
//! to another rank is kept in the sender's log for that destination, in SSN
//! order. The log holds the payload [`bytes::Bytes`] the transport carries,
//! so logging copies nothing (DESIGN principle 4). The log is part of the
//! sender's checkpoint (004 §2.2: sender-based data is part of the
//! checkpoint), so a sender that dies together with a receiver still has
//! the messages sent before its own checkpoint.
//!
//! **Event logging.** The only nondeterminism is the order of receptions
//! from different senders. A receive from a named source matches that
//! channel's messages in SSN order (channels are FIFO and are resent in SSN
//! order), so its outcome is fixed by the program; a wildcard-source receive
//! is not, and its outcome, a [`Determinant`] (RSN → sender,
//! SSN), is sent to the rank's *determinant holders*: its checkpoint
//! partner, in another failure domain, and a second partner. The rank sends
//! nothing until every holder still alive has acknowledged every
//! determinant (the pessimistic condition: no unlogged nondeterministic
//! event precedes a send; waiting for one holder only would lose, when the
//! rank dies together with it, determinants its sends depended on).
//! Not logged, and so not replayed exactly: which message a wildcard-source
//! probe saw (refused under message logging, with an error saying so), and
//! when a nonblocking check (`iprobe` of a named source, `test`) first
//! succeeded; a program whose sends depend on those timings may take
//! another path when it re-executes.
//!
//! **Checkpoints** are taken by each rank alone, every `every`-th safe
//! point, and stored by the partner level. Once a rank's checkpoint is
//! stored it tells each sender the highest SSN the checkpoint holds from it
//! (`Trim`), and its holder the last RSN (`TrimHeld`): logs and
//! determinants the checkpoint no longer needs are dropped. With a log
//! budget, a sender whose log passes half of it asks its largest consumer to
//! checkpoint at its next safe point (`CheckpointRequest`).
//!
//! **Bounded log.** The budget bounds the memory of the payload log: the
//! distinct payload buffers it holds (a buffer logged for several ranks, or
//! sent again and again as NetPIPE does, costs its size once). When that
//! passes the budget although receivers were asked to checkpoint, the
//! oldest payloads move to a spill the runtime provides
//! ([`crate::store::spill::LogSpill`]; this protocol touches no file) until
//! half the budget is left, and are read back to be resent or saved in a
//! checkpoint piece (the log is part of the checkpoint, 004 §2.2). A rank
//! defers its own scheduled checkpoints while a receiver it asked has not
//! trimmed yet (its piece would carry the log, spilled payloads included,
//! into its holders' memory; a checkpoint another rank asked for is never
//! deferred). A send blocks only while the spill is full too.
//!
//! **Recovery.** A replacement asks its holder for its newest stored piece
//! and its determinants (`Locate`/`Located`), restores the piece (its log
//! included), and tells every rank the highest SSN it has from it
//! (`Recovering`, the HSR of 002 §3.3). Each rank resends its logged
//! messages above that SSN, in order, and answers with its own HSR for the
//! recovering rank (`Hsr`), so the re-executing rank withholds the messages
//! the receiver already has (and the receiver drops any duplicate by SSN).
//! Until its messages reach the highest SSN each receiver ever had from it
//! (or a receiver's replayed determinants name), a re-executing rank applies
//! no one-sided request that its own determinants do not place: a receiver
//! that rolled back meanwhile replays determinants naming those messages.
//! Wildcard receptions are forced to the logged outcomes, in RSN order.
//! When a rank dies, every rank also sends it `Recovering`: its replacement
//! serves those after its restore from the log it restored, so messages
//! sent before its checkpoint reach ranks that had not received them (the
//! logs a dead rank held for others are rebuilt by its re-execution,
//! 004 §2.2). A survivor whose holder died re-sends its determinants and
//! its checkpoint piece to the replacement, and sends nothing meanwhile.
//! Several ranks failing at once, and failures during a recovery, are
//! recovered, except the loss of a rank together with its holder before the
//! rank's replacement fetched its state: that is reported as an error.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};

use bytes::Bytes;

use serde::{Deserialize, Serialize};

use super::{Action, Control, Determinant, Event, Protocol, ProtocolCx};
use crate::driver::Stat;
use crate::engine::frame::{
    AppMessage, ENCODED_MESSAGE_OVERHEAD, Envelope, append_with_blobs, take_with_blobs,
};
use crate::segments::Segments;
use crate::store::PieceWriter;
use crate::store::piece::SHARED_SEGMENT_MIN;
use crate::store::spill::{LogSpill, SpillStream};
use crate::{Error, Rank, Result};

/// Control messages of the logging protocols.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LogMsg {
    /// Receiver to its holder: determinants to keep. `full`: every
    /// determinant since the receiver's stored checkpoint (re-provisioning a
    /// replaced holder).
    Determinants {
        /// The determinants.
        determinants: Vec<Determinant>,
        /// Whether this is the complete set.
        full: bool,
    },
    /// Holder to receiver: determinants up to this RSN are stored.
    DeterminantAck {
        /// Highest RSN acknowledged.
        upto: u64,
    },
    /// Receiver to sender: my stored checkpoint holds your messages up to
    /// this SSN; drop them from your log.
    Trim {
        /// Highest SSN no longer needed.
        upto: u64,
    },
    /// Owner to holder: my checkpoint `generation` is stored; drop my
    /// determinants up to `rsn` and my older pieces.
    TrimHeld {
        /// The stored generation.
        generation: u64,
        /// Last RSN it covers.
        rsn: u64,
    },
    /// Replacement to its holder: what do you hold of mine?
    Locate,
    /// Holder to replacement: the newest piece and the determinants held.
    Located {
        /// Every generation of the replacement's piece held.
        held: Vec<u64>,
        /// The newest generation its owner said was stored for good
        /// (`TrimHeld`).
        committed: Option<u64>,
        /// Determinants held for it.
        determinants: Vec<Determinant>,
        /// Whether the holder's knowledge is complete (false: the holder was
        /// itself replaced and never re-provisioned by this rank).
        complete: bool,
    },
    /// A restored rank (or a rank that learned of the receiver's death):
    /// "I have your messages up to SSN `hsr`; send what follows".
    Recovering {
        /// Highest SSN received from the receiver.
        hsr: u64,
    },
    /// Answer to `Recovering`: the sender has the receiver's messages up to
    /// this SSN (the re-executing receiver withholds them).
    Hsr {
        /// Highest SSN received.
        hsr: u64,
        /// Highest SSN of the recovering rank's messages that the
        /// determinants this rank replays name (0: none): its re-execution
        /// must regenerate them exactly (see `Pessimistic::regen`).
        replayed: u64,
    },
    /// A sender's log for the receiver passed half the budget: checkpoint at
    /// the next safe point.
    CheckpointRequest,
}

/// Counters reported to the driver (totals as deltas, logs as current).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Counters {
    records: u64,
    bytes: u64,
    spared: u64,
    determinants: u64,
    resent: u64,
    collectives_from_log: u64,
    spilled: u64,
}

/// A logged message as a checkpoint piece holds it: its payload is an index
/// into the piece's distinct payloads. A payload sent to several ranks (a
/// broadcast tree forwards the buffer it received) is logged once per
/// destination but saved once.
#[derive(Debug, Serialize, Deserialize)]
struct SavedMsg {
    envelope: Envelope,
    ssn: u64,
    payload: u32,
}

/// What a checkpoint piece holds of this protocol, besides the payloads
/// (which follow it, shared: [`append_with_blobs`]).
#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedState {
    log: Vec<(Rank, Vec<SavedMsg>)>,
    trimmed: Vec<(Rank, u64)>,
    next_generation: u64,
}

/// What a holder answered a replacement: `None` if it lost the
/// replacement's state, else what it holds.
type HolderAnswer = Option<Holding>;

/// What a holder holds of a recovering rank.
#[derive(Debug, Clone, Default)]
pub(crate) struct Holding {
    /// Every generation of its piece held.
    pub(crate) held: Vec<u64>,
    /// Newest generation its owner declared stored for good.
    pub(crate) committed: Option<u64>,
    /// Its determinants.
    pub(crate) determinants: Vec<Determinant>,
}

/// A replacement's recovery.
#[derive(Debug)]
enum Phase {
    /// Asked its holders; what each answered (`None`: nothing yet).
    Locating(BTreeMap<Rank, Option<HolderAnswer>>),
    /// Fetching `generation` from `holder`; `others` hold it too (tried if
    /// `holder` dies).
    Fetching {
        generation: u64,
        holder: Rank,
        others: Vec<Rank>,
    },
    /// Every holder answered; a set-coordinated protocol decides which
    /// generation the whole set restores (see [`Pessimistic::located`]).
    AwaitingDecision(BTreeMap<Rank, Holding>),
    /// Decided; the engine restores.
    Restoring,
    /// Restored (or never failed).
    Done,
}

/// The sender log of one channel.
#[derive(Debug, Default)]
struct ChannelLog {
    /// Messages in SSN order (payloads shared with the transport; those of
    /// the first `spilled.len()` are empty: they are in the spill).
    msgs: VecDeque<AppMessage>,
    /// Where the spilled front of `msgs` is, in order (offsets never
    /// decrease, so a trim frees the spill below the first one left).
    spilled: VecDeque<Spilled>,
    /// Their payload bytes.
    bytes: usize,
}

/// A payload moved to the spill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Spilled {
    offset: u64,
    len: usize,
}

/// A payload buffer told apart by address and length (the same bytes at
/// the same address are the same buffer while a reference to it is held).
fn buffer_key(b: &Bytes) -> (usize, usize) {
    (b.as_ptr() as usize, b.len())
}

/// The distinct payload buffers held in memory by the channel logs, with
/// how many log entries hold each, and their bytes.
#[derive(Debug, Default)]
struct Resident {
    count: HashMap<(usize, usize), u32>,
    bytes: usize,
}

impl Resident {
    /// A log entry holds `b`; returns the bytes this adds to memory.
    fn hold(&mut self, b: &Bytes) -> usize {
        let n = self.count.entry(buffer_key(b)).or_insert(0);
        *n += 1;
        let added = if *n == 1 { b.len() } else { 0 };
        self.bytes += added;
        added
    }

    /// A log entry dropped `b`; returns the bytes this frees.
    fn drop_one(&mut self, b: &Bytes) -> usize {
        let key = buffer_key(b);
        let Some(n) = self.count.get_mut(&key) else {
            return 0;
        };
        *n -= 1;
        if *n > 0 {
            return 0;
        }
        self.count.remove(&key);
        self.bytes -= b.len();
        b.len()
    }
}

/// State of the pessimistic protocol on one rank.
#[derive(Debug)]
pub struct Pessimistic {
    every: u64,
    since_last: u64,
    next_generation: u64,
    log_budget: Option<usize>,
    /// Sender-based payload log per destination, in SSN order.
    log: BTreeMap<Rank, ChannelLog>,
    /// Ranks checkpointed and rolled back together with this one (its
    /// correlated set, 004 §3.2): messages to them are not copied into the
    /// log, and they neither ask for nor serve resends to each other.
    internal: BTreeSet<Rank>,
    /// Checkpoints are coordinated by a set: the set decides which
    /// generation a recovery restores, and a stored piece trims logs only
    /// once the set commits it ([`Pessimistic::commit_stored`]).
    set_coordinated: bool,
    /// Per owner: the newest generation it declared stored (`TrimHeld`).
    committed_of: BTreeMap<Rank, u64>,
    log_bytes: usize,
    log_records: usize,
    /// Per destination: SSNs up to this were trimmed by its checkpoint.
    trimmed: BTreeMap<Rank, u64>,
    /// This rank's determinants since its last stored checkpoint.
    own: Vec<Determinant>,
    /// Whether this rank's determinants are stored safely (sends wait).
    stability: Stability,
    /// This rank's holders that died and have not been re-provisioned.
    dead_holders: BTreeSet<Rank>,
    /// Determinants held for other ranks, by owner and RSN.
    held: BTreeMap<Rank, BTreeMap<u64, Determinant>>,
    /// Owners that re-provisioned this incarnation (after it was replaced).
    provisioned: BTreeSet<Rank>,
    /// Epoch this incarnation started in (0: the original).
    since: u64,
    /// Captured, not yet stored: generation → (HSR per source, last RSN).
    pending: BTreeMap<u64, (Vec<(Rank, u64)>, u64)>,
    stored: Option<u64>,
    forced: bool,
    /// Dead ranks whose replacement has not asked yet: sends wait in the log.
    awaiting: BTreeSet<Rank>,
    /// Per destination: it already has our messages up to this SSN.
    suppress: BTreeMap<Rank, u64>,
    /// Per destination: the highest SSN it has received from this rank's
    /// current line of execution (raised by each `Recovering`/`Hsr`, never
    /// lowered, also not when the destination rolls back). A re-execution
    /// regenerates its messages exactly up to there before it applies a
    /// one-sided request no determinant places: a destination that rolled
    /// back replays determinants naming those messages, so they must come
    /// out the same (a reply placed among them took the SSN of a request
    /// the destination's determinant named, and its replay waited forever:
    /// both sets rolled back, DHT on processes).
    regen: BTreeMap<Rank, u64>,
    /// Ranks asked for their HSR after this rank's restore that have not
    /// answered yet (until then the re-execution may be regenerating
    /// messages they have).
    hsr_pending: BTreeSet<Rank>,
    /// Recovery of this replacement.
    phase: Phase,
    /// A live member rolled back with its correlated set: what it holds of
    /// itself (its own pieces, which its store keeps, and its
    /// determinants), counted as one more holder's answer. Its holders may
    /// all have died while it lives (the second partner sits on its own
    /// node when there is no third), and restarting the job then was
    /// needless (issue 33: found by `lazarus chaos --schedules cascade`).
    local: Option<Holding>,
    replay: Vec<Determinant>,
    /// The highest SSN of each rank's messages that this re-execution's
    /// replay names (`Hsr::replayed`): kept after the replay is handed to
    /// the engine, as ranks asking later must still learn it.
    replay_names: BTreeMap<Rank, u64>,
    /// `Recovering` requests that came before this replacement restored.
    deferred: Vec<(Rank, u64)>,
    /// Destinations asked to checkpoint (log budget), until they trim.
    requested: BTreeSet<Rank>,
    /// Payload buffers the channel logs hold in memory (`log_bytes`
    /// counts these once each).
    resident: Resident,
    /// Where payloads go past the budget (none: the log is not bounded).
    spill: Option<Box<dyn LogSpill>>,
    /// Why the spill refused a payload (full or failing): sends wait while
    /// the log is over its budget, until a trim frees the spill.
    spill_refused: Option<String>,
    counters: Counters,
    reported: Counters,
    reported_bytes: usize,
    /// Scheduled checkpoints wait ([`Pessimistic::hold_schedule`]).
    schedule_held: bool,
}

impl Pessimistic {
    /// Checkpoint every `every` safe points (0: only when asked); with
    /// `log_budget`, ask receivers to checkpoint once the log passes half of
    /// it.
    pub fn new(every: u64, log_budget: Option<usize>) -> Self {
        Pessimistic {
            every,
            since_last: 0,
            next_generation: 1,
            log_budget,
            log: BTreeMap::new(),
            internal: BTreeSet::new(),
            set_coordinated: false,
            committed_of: BTreeMap::new(),
            log_bytes: 0,
            log_records: 0,
            trimmed: BTreeMap::new(),
            own: Vec::new(),
            stability: Stability::default(),
            dead_holders: BTreeSet::new(),
            held: BTreeMap::new(),
            provisioned: BTreeSet::new(),
            since: 0,
            pending: BTreeMap::new(),
            stored: None,
            forced: false,
            awaiting: BTreeSet::new(),
            suppress: BTreeMap::new(),
            regen: BTreeMap::new(),
            hsr_pending: BTreeSet::new(),
            phase: Phase::Done,
            local: None,
            replay: Vec::new(),
            replay_names: BTreeMap::new(),
            deferred: Vec::new(),
            requested: BTreeSet::new(),
            resident: Resident::default(),
            spill: None,
            spill_refused: None,
            counters: Counters::default(),
            reported: Counters::default(),
            reported_bytes: 0,
            schedule_held: false,
        }
    }

    /// Move payloads past the log budget to `spill` (given by the runtime:
    /// a protocol touches no file, DESIGN principle 2).
    pub(crate) fn set_spill(&mut self, spill: Box<dyn LogSpill>) {
        self.spill = Some(spill);
    }

    /// Ranks holding this rank's determinants and checkpoint pieces: its
    /// partner and a second partner (the partner store keeps both copies).
    fn holders(cx: &ProtocolCx<'_>) -> Vec<Rank> {
        cx.placement
            .partner(cx.rank)
            .into_iter()
            .chain(cx.placement.second_partner(cx.rank))
            .collect()
    }

    /// Hand a safe point on; the generation it captured, if it did (a
    /// protocol built over this one records what goes with it).
    pub(crate) fn safe_point_captures(
        &mut self,
        index: u64,
        cx: &mut ProtocolCx<'_>,
    ) -> Option<u64> {
        let before = cx.actions.len();
        self.handle(Event::SafePoint { index }, cx);
        cx.actions[before..].iter().find_map(|a| match a {
            Action::Capture { generation } => Some(*generation),
            _ => None,
        })
    }

    /// Whether every rank asked for its HSR after this rank's restore has
    /// answered: each has then heard of this rank's failure.
    pub(crate) fn hsr_known(&self) -> bool {
        self.hsr_pending.is_empty()
    }

    /// Hold checkpoints, scheduled or requested (`rma`: until a safe point
    /// meets the epoch condition of 003 §3.2.2).
    pub(crate) fn hold_schedule(&mut self, hold: bool) {
        self.schedule_held = hold;
    }

    /// Coordinate checkpoints and rollbacks with `peers` (this rank's
    /// correlated set, itself included or not): no payload copy for
    /// messages to them (004 §3.2), and recovery decided by the set.
    pub(crate) fn set_correlated_set(&mut self, peers: impl IntoIterator<Item = Rank>) {
        self.internal = peers.into_iter().collect();
        self.set_coordinated = true;
    }

    /// The next generation this rank will capture.
    pub(crate) fn next_generation(&self) -> u64 {
        self.next_generation
    }

    /// Number the next captured generation (a set's agreed numbering).
    pub(crate) fn set_next_generation(&mut self, generation: u64) {
        self.next_generation = generation;
    }

    /// Whether a sender asked this rank to checkpoint (its log for this
    /// rank passed half the budget; only this rank's checkpoint trims it).
    pub(crate) fn checkpoint_wanted(&self) -> bool {
        self.forced
    }

    /// This rank is about to roll back with its set: requests for resends
    /// wait until it is restored, and it asks nobody before then.
    pub(crate) fn begin_rollback(&mut self) {
        self.phase = Phase::Restoring;
    }

    /// The holders' answers once all are in (set-coordinated recovery),
    /// for the set's decision.
    pub(crate) fn located(&self) -> Option<&BTreeMap<Rank, Holding>> {
        match &self.phase {
            Phase::AwaitingDecision(a) => Some(a),
            _ => None,
        }
    }

    /// The set decided to restore `generation`: from this rank's own store
    /// if it still holds its piece (a survivor rolling back), else from a
    /// holder that has it.
    pub(crate) fn restore_decided(&mut self, generation: Option<u64>, cx: &mut ProtocolCx<'_>) {
        let Phase::AwaitingDecision(answers) = &self.phase else {
            return;
        };
        match generation {
            Some(g) if cx.store.get(g, cx.rank).is_none() => {
                let holders = answers
                    .iter()
                    .filter(|(_, h)| h.held.contains(&g))
                    .map(|(&r, _)| r)
                    .collect();
                self.fetch_next(g, holders, cx);
            }
            _ => {
                self.phase = Phase::Restoring;
                cx.emit(Action::Resume { generation });
            }
        }
    }

    fn send(cx: &mut ProtocolCx<'_>, dest: Rank, msg: LogMsg) {
        cx.emit(Action::Transmit {
            dest,
            msg: Control::Log(msg),
        });
    }

    /// Whether `r` died and its replacement has not asked for its messages
    /// yet (sends to it wait in the log).
    pub(crate) fn awaits(&self, r: Rank) -> bool {
        self.awaiting.contains(&r)
    }

    /// Count a record of `bytes` kept outside the channel logs (ULML's
    /// collective results): logged now and held.
    pub(crate) fn count_logged(&mut self, bytes: usize) {
        self.counters.records += 1;
        self.counters.bytes += bytes as u64;
        self.log_records += 1;
        self.log_bytes += bytes;
    }

    /// Records kept outside the channel logs came back with a restored
    /// checkpoint: held again (they were counted as logged when first kept).
    pub(crate) fn count_restored(&mut self, records: usize, bytes: usize) {
        self.log_records += records;
        self.log_bytes += bytes;
    }

    /// Past the budget with a spill that takes payloads: records kept
    /// outside the channel logs (ULML's collective results) should move
    /// there too.
    pub(crate) fn spill_wanted(&self) -> bool {
        self.spill.is_some()
            && self.spill_refused.is_none()
            && self.log_budget.is_some_and(|b| self.log_bytes > b)
    }

    /// Half the budget is left (or there is none): spilling may stop.
    pub(crate) fn spilled_enough(&self) -> bool {
        self.log_budget.is_none_or(|b| self.log_bytes <= b / 2)
    }

    /// Move a record kept outside the channel logs to `stream` of the
    /// spill: its offset there, or `None` if the spill refused it (the
    /// record stays in memory, and sends wait while the log is past its
    /// budget, until a trim frees the spill).
    pub(crate) fn spill_record(&mut self, stream: SpillStream, record: &Segments) -> Option<u64> {
        let spill = self.spill.as_mut()?;
        let joined;
        let bytes: &[u8] = match record.segments() {
            [one] => one,
            _ => {
                joined = record.to_vec();
                &joined
            }
        };
        match spill.append(stream, bytes) {
            Ok(offset) => {
                self.counters.spilled += bytes.len() as u64;
                self.log_bytes = self.log_bytes.saturating_sub(bytes.len());
                Some(offset)
            }
            Err(e) => {
                self.spill_refused = Some(e.to_string());
                None
            }
        }
    }

    /// Read back `len` bytes at `offset` of `stream` of the spill.
    pub(crate) fn read_spilled(
        &self,
        stream: SpillStream,
        offset: u64,
        len: usize,
    ) -> Result<Bytes> {
        match &self.spill {
            Some(spill) => spill.read(stream, offset, len),
            None => Err(Error::LogSpill {
                detail: format!("{stream} was spilled, but there is no spill"),
            }),
        }
    }

    /// Nothing of `stream` below `upto` is needed any more (`None`:
    /// nothing at all); the spill may take payloads again.
    pub(crate) fn release_spilled(&mut self, stream: SpillStream, upto: Option<u64>) {
        if let Some(spill) = self.spill.as_mut() {
            spill.release(stream, upto);
            self.spill_refused = None;
        }
    }

    /// Records kept outside the channel logs were dropped.
    pub(crate) fn count_dropped(&mut self, records: usize, bytes: usize) {
        // Saturating: a miscount must not wrap the budget check for ever.
        self.log_records = self.log_records.saturating_sub(records);
        self.log_bytes = self.log_bytes.saturating_sub(bytes);
    }

    /// Whether the log (channel logs and records counted with
    /// [`Pessimistic::count_logged`]) is past half the log budget.
    pub(crate) fn over_half_budget(&self) -> bool {
        self.log_budget.is_some_and(|b| self.log_bytes > b / 2)
    }

    /// Checkpoint at the next safe point.
    pub(crate) fn force_checkpoint(&mut self) {
        self.forced = true;
    }

    /// Count a collective completed from a logged result.
    pub(crate) fn count_collective_from_log(&mut self) {
        self.counters.collectives_from_log += 1;
    }

    /// Report counters that changed since the last report.
    pub(crate) fn report(&mut self, cx: &mut ProtocolCx<'_>) {
        let c = self.counters;
        let r = self.reported;
        if c == r && self.log_bytes == self.reported_bytes {
            return;
        }
        cx.emit(Action::Record(Stat::Log {
            records: c.records - r.records,
            bytes: c.bytes - r.bytes,
            spared_bytes: c.spared - r.spared,
            determinants: c.determinants - r.determinants,
            resent: c.resent - r.resent,
            collectives_from_log: c.collectives_from_log - r.collectives_from_log,
            spilled_bytes: c.spilled - r.spilled,
            log_records: self.log_records,
            log_bytes: self.log_bytes,
        }));
        self.reported = c;
        self.reported_bytes = self.log_bytes;
    }

    fn on_send(&mut self, msg: &AppMessage, cx: &mut ProtocolCx<'_>) {
        let dest = msg.envelope.dest;
        if dest == cx.rank {
            return; // regenerated by re-execution: never needed from a log
        }
        let len = msg.payload.len();
        if self.internal.contains(&dest) {
            // Never in transit across the set's recovery line (004 §3.2).
            self.counters.spared += len as u64;
            return;
        }
        let channel = self.log.entry(dest).or_default();
        channel.msgs.push_back(msg.clone());
        channel.bytes += len;
        self.log_bytes += self.resident.hold(&msg.payload);
        self.log_records += 1;
        self.counters.records += 1;
        self.counters.bytes += len as u64;
        if self.awaiting.contains(&dest) || self.suppress.get(&dest).is_some_and(|&h| msg.ssn <= h)
        {
            cx.emit(Action::Withhold);
        }
        // A set-coordinated receiver first agrees with its set on a safe
        // point (one more interval, 004 §3.3): ask it earlier.
        let ask_at = if self.set_coordinated { 4 } else { 2 };
        if let Some(budget) = self.log_budget
            && self.log_bytes > budget / ask_at
        {
            let largest = self
                .log
                .iter()
                .filter(|(d, _)| !self.requested.contains(d))
                .map(|(&d, c)| (c.bytes, d))
                .max();
            if let Some((bytes, d)) = largest
                && bytes > 0
            {
                self.requested.insert(d);
                Self::send(cx, d, LogMsg::CheckpointRequest);
            }
        }
        self.spill_past_budget();
    }

    /// Whether the log is past its budget with nowhere to spill: sends wait.
    fn spill_blocked(&self) -> bool {
        self.spill_refused.is_some() && self.log_budget.is_some_and(|b| self.log_bytes > b)
    }

    /// Past the budget: move the oldest payloads of each channel to the
    /// spill until half the budget is left (hysteresis: a spill per send
    /// would cost a write call per message).
    fn spill_past_budget(&mut self) {
        let (Some(budget), Some(spill)) = (self.log_budget, self.spill.as_mut()) else {
            return;
        };
        if self.log_bytes <= budget || self.spill_refused.is_some() {
            return;
        }
        // Buffers spilled in this pass stay referenced until it ends, so
        // an address seen again in it is the same buffer (a sender that
        // sends one buffer again and again has it spilled once).
        let mut spilled_now: Vec<Bytes> = Vec::new();
        'channels: for (&dest, c) in self.log.iter_mut() {
            let mut last: Option<((usize, usize), Spilled)> = None;
            while c.spilled.len() < c.msgs.len() {
                if self.log_bytes <= budget / 2 {
                    break 'channels;
                }
                let m = &mut c.msgs[c.spilled.len()];
                let key = buffer_key(&m.payload);
                let at = match last {
                    Some((k, at)) if k == key => at,
                    _ => match spill.append(SpillStream::Channel(dest), &m.payload) {
                        Ok(offset) => {
                            self.counters.spilled += m.payload.len() as u64;
                            Spilled {
                                offset,
                                len: m.payload.len(),
                            }
                        }
                        Err(e) => {
                            self.spill_refused = Some(e.to_string());
                            break 'channels;
                        }
                    },
                };
                last = Some((key, at));
                c.spilled.push_back(at);
                let payload = std::mem::take(&mut m.payload);
                self.log_bytes -= self.resident.drop_one(&payload);
                spilled_now.push(payload);
            }
        }
    }

    /// The payload of `c.msgs[i]`, read back from the spill if it is there.
    fn payload(&self, dest: Rank, c: &ChannelLog, i: usize) -> Result<Bytes> {
        match (c.spilled.get(i), &self.spill) {
            (None, _) => Ok(c.msgs[i].payload.clone()),
            (Some(s), Some(spill)) => spill.read(SpillStream::Channel(dest), s.offset, s.len),
            (Some(_), None) => Err(Error::LogSpill {
                detail: format!("a payload for rank {dest} was spilled, but there is no spill"),
            }),
        }
    }

    fn on_deliver(&mut self, det: Determinant, replayed: bool, cx: &mut ProtocolCx<'_>) {
        self.own.push(det);
        if replayed {
            return; // its holder has it: it came from there
        }
        self.counters.determinants += 1;
        // Counted now: the rank may die before its next safe point.
        self.report(cx);
        let holders = Self::holders(cx);
        self.stability.needed = det.rsn;
        self.stability.holders.clone_from(&holders);
        for h in holders {
            Self::send(
                cx,
                h,
                LogMsg::Determinants {
                    determinants: vec![det],
                    full: false,
                },
            );
        }
    }

    fn on_safe_point(&mut self, cx: &mut ProtocolCx<'_>) {
        self.since_last += 1;
        // A scheduled checkpoint waits while a receiver asked to trim this
        // log has not: the piece holds the log (004 §2.2), spilled payloads
        // read back included, and keeps its buffers alive in the stores
        // after the trim, where the trim would make it small. A checkpoint
        // another rank asked for is never deferred, so two ranks asking
        // each other both take theirs.
        let due = self.every > 0 && self.since_last >= self.every && self.requested.is_empty();
        if (due || self.forced) && !self.schedule_held {
            self.since_last = 0;
            self.capture(cx);
        }
        self.report(cx);
        cx.emit(Action::ReleaseSafePoint);
    }

    /// Capture the next generation here; returns it.
    pub(crate) fn capture(&mut self, cx: &mut ProtocolCx<'_>) -> u64 {
        self.forced = false;
        let generation = self.next_generation;
        self.next_generation += 1;
        let hsr = cx.hsr.iter().map(|(&r, &n)| (r, n)).collect();
        self.pending.insert(generation, (hsr, cx.rsn));
        cx.emit(Action::Capture { generation });
        cx.emit(Action::Checkpointed { generation });
        generation
    }

    /// This rank's piece of `generation` is stored for good: trim the
    /// senders' logs and the holders' determinants it makes unnecessary.
    /// (Under set coordination, once the whole set stored it.)
    pub(crate) fn commit_stored(&mut self, generation: u64, cx: &mut ProtocolCx<'_>) {
        let Some((hsr, rsn)) = self.pending.remove(&generation) else {
            self.stored_again(generation, cx); // a re-replicated older piece
            return;
        };
        self.pending.retain(|&g, _| g > generation);
        // Holders first: a rank killed between the two must not leave
        // senders that dropped what this checkpoint covers while its
        // holders still name an older one as stored for good (a set
        // restoring that one would find those messages gone; issue 33,
        // defect 9). The other way round, senders merely keep more.
        for h in Self::holders(cx) {
            Self::send(cx, h, LogMsg::TrimHeld { generation, rsn });
        }
        for (src, upto) in hsr {
            if src != cx.rank && !self.internal.contains(&src) {
                Self::send(cx, src, LogMsg::Trim { upto });
            }
        }
        cx.emit(Action::DropOlderPieces {
            owner: cx.rank,
            keep: generation,
        });
        self.own.retain(|d| d.rsn > rsn);
        self.replay.retain(|d| d.rsn > rsn);
        self.stability.floor = self.stability.floor.max(rsn);
        self.stored = Some(generation);
        cx.emit(Action::Record(Stat::PieceStored {
            generation,
            epoch: cx.epoch,
        }));
    }

    /// A piece stored for good was stored again (a replaced holder was
    /// re-provisioned): every holder has it once more. Said to the driver,
    /// whose statistics judge restarts from the beginning against it.
    pub(crate) fn stored_again(&self, generation: u64, cx: &mut ProtocolCx<'_>) {
        if self.stored == Some(generation) {
            cx.emit(Action::Record(Stat::PieceStored {
                generation,
                epoch: cx.epoch,
            }));
        }
    }

    /// The other members of this rank's correlated set (none outside
    /// `correlated`).
    fn set_peers(&self, me: Rank) -> impl Iterator<Item = Rank> + use<'_> {
        self.internal.iter().copied().filter(move |&d| d != me)
    }

    /// Tell `r` our HSR for it and the highest SSN of its messages our
    /// replay names: its re-execution regenerates up to there (`regen`).
    fn send_hsr(&self, r: Rank, cx: &mut ProtocolCx<'_>) {
        let hsr = cx.hsr.get(&r).copied().unwrap_or(0);
        let replayed = self.replay_names.get(&r).copied().unwrap_or(0);
        Self::send(cx, r, LogMsg::Hsr { hsr, replayed });
    }

    fn trim(&mut self, dest: Rank, upto: u64) {
        raise(&mut self.trimmed, dest, upto);
        if let Some(c) = self.log.get_mut(&dest) {
            let had_spilled = !c.spilled.is_empty();
            while c.msgs.front().is_some_and(|m| m.ssn <= upto) {
                if let Some(m) = c.msgs.pop_front() {
                    match c.spilled.pop_front() {
                        Some(s) => c.bytes -= s.len,
                        None => {
                            c.bytes -= m.payload.len();
                            self.log_bytes -= self.resident.drop_one(&m.payload);
                        }
                    }
                    self.log_records -= 1;
                }
            }
            if had_spilled && let Some(spill) = self.spill.as_mut() {
                spill.release(
                    SpillStream::Channel(dest),
                    c.spilled.front().map(|s| s.offset),
                );
                self.spill_refused = None;
            }
        }
        self.requested.remove(&dest);
        self.spill_past_budget();
    }

    /// `r` has our messages up to `hsr` and needs the rest (002 §3.3).
    fn serve(&mut self, r: Rank, hsr: u64, cx: &mut ProtocolCx<'_>) {
        if self.internal.contains(&r) {
            return; // re-executes with this rank: nothing to resend
        }
        let trimmed = self.trimmed.get(&r).copied().unwrap_or(0);
        if hsr < trimmed {
            cx.emit(Action::Fail(Error::Unrecoverable(
                format!(
                    "rank {r} restarted with rank {}'s messages only up to SSN {hsr}, but its \
                     stored checkpoint had made SSNs up to {trimmed} unnecessary, so they were \
                     dropped from the log: that checkpoint was lost",
                    cx.rank
                )
                .into(),
            )));
            return;
        }
        if let Some(c) = self.log.get(&r) {
            let mut last: Option<(Spilled, Bytes)> = None;
            for (i, m) in c.msgs.iter().enumerate().filter(|(_, m)| m.ssn > hsr) {
                // A payload spilled once for several messages is read once.
                let payload = match (c.spilled.get(i), &last) {
                    (Some(s), Some((at, b))) if s == at => Ok(b.clone()),
                    _ => self.payload(r, c, i),
                };
                let payload = match payload {
                    Ok(p) => p,
                    Err(e) => {
                        cx.emit(Action::Fail(e));
                        return;
                    }
                };
                if let Some(&s) = c.spilled.get(i) {
                    last = Some((s, payload.clone()));
                }
                let msg = AppMessage {
                    payload,
                    ..m.clone()
                };
                cx.emit(Action::Resend { msg });
                self.counters.resent += 1;
            }
        }
        self.awaiting.remove(&r);
        self.suppress.insert(r, hsr);
        raise(&mut self.regen, r, hsr);
        self.send_hsr(r, cx);
        if Self::holders(cx).contains(&r) {
            // A holder was replaced: give it our determinants and piece
            // again (sends wait meanwhile only if no holder has them).
            self.dead_holders.remove(&r);
            Self::send(
                cx,
                r,
                LogMsg::Determinants {
                    determinants: self.all_determinants(),
                    full: true,
                },
            );
            if let Some(generation) = self.stored {
                cx.emit(Action::Replicate { generation });
                // And that it is stored for good, as `commit_stored` told
                // its predecessor: a holder's `Located` answer names the
                // committed generation, and a set deciding what to restore
                // from re-provisioned holders alone would otherwise know of
                // none and restart the job from the beginning (issue 33,
                // defect 4).
                let rsn = self.stability.floor;
                Self::send(cx, r, LogMsg::TrimHeld { generation, rsn });
            }
        }
        if self.awaiting.is_empty() {
            cx.emit(Action::InRecovery(None));
        }
        self.report(cx);
    }

    fn on_log(&mut self, src: Rank, msg: LogMsg, cx: &mut ProtocolCx<'_>) {
        match msg {
            LogMsg::Determinants { determinants, full } => {
                let held = self.held.entry(src).or_default();
                let upto = determinants.iter().map(|d| d.rsn).max();
                for d in determinants {
                    held.insert(d.rsn, d);
                }
                if full {
                    self.provisioned.insert(src);
                }
                if let Some(upto) = upto {
                    Self::send(cx, src, LogMsg::DeterminantAck { upto });
                }
            }
            LogMsg::DeterminantAck { upto } => raise(&mut self.stability.acked, src, upto),
            LogMsg::Trim { upto } => self.trim(src, upto),
            LogMsg::TrimHeld { generation, rsn } => {
                raise(&mut self.committed_of, src, generation);
                if let Some(h) = self.held.get_mut(&src) {
                    h.retain(|&r, _| r > rsn);
                }
                cx.emit(Action::DropOlderPieces {
                    owner: src,
                    keep: generation,
                });
            }
            LogMsg::Locate => {
                let held: Vec<u64> = cx
                    .store
                    .held()
                    .into_iter()
                    .filter(|&(_, owner)| owner == src)
                    .map(|(g, _)| g)
                    .collect();
                let committed = self.committed_of.get(&src).copied();
                let determinants = self
                    .held
                    .get(&src)
                    .map(|h| h.values().copied().collect())
                    .unwrap_or_default();
                let complete = self.since == 0 || self.provisioned.contains(&src);
                Self::send(
                    cx,
                    src,
                    LogMsg::Located {
                        held,
                        committed,
                        determinants,
                        complete,
                    },
                );
            }
            LogMsg::Located {
                held,
                committed,
                determinants,
                complete,
            } => {
                if let Phase::Locating(located) = &mut self.phase
                    && located.contains_key(&src)
                {
                    let holding = Holding {
                        held,
                        committed,
                        determinants,
                    };
                    located.insert(src, Some(complete.then_some(holding)));
                    self.try_decide(cx);
                }
            }
            LogMsg::Recovering { hsr } => {
                if matches!(self.phase, Phase::Done) {
                    self.serve(src, hsr, cx);
                } else {
                    self.deferred.push((src, hsr));
                }
            }
            LogMsg::Hsr { hsr, replayed } => {
                self.suppress.insert(src, hsr);
                raise(&mut self.regen, src, hsr.max(replayed));
                self.hsr_pending.remove(&src);
            }
            LogMsg::CheckpointRequest => self.forced = true,
        }
    }

    /// Every determinant of this rank since its stored checkpoint: those
    /// of its receptions so far, then those of its replay it has not
    /// reached yet (a holder re-provisioned during a re-execution must get
    /// the whole history, or a later replacement that only it can supply
    /// would choose freely where the dead incarnation had chosen; 004 §2.2).
    fn all_determinants(&self) -> Vec<Determinant> {
        let mut all = self.own.clone();
        let reached = all.last().map_or(0, |d| d.rsn);
        all.extend(self.replay.iter().filter(|d| d.rsn > reached).copied());
        all
    }

    /// The determinants this re-execution replays, and what they name of
    /// each rank's messages.
    fn set_replay(&mut self, replay: Vec<Determinant>) {
        self.replay_names.clear();
        for d in &replay {
            raise(&mut self.replay_names, d.src, d.ssn);
        }
        self.replay = replay;
    }

    /// Once every holder still alive answered `Located`: restore the newest
    /// generation a complete holder has, with every determinant they hold.
    fn try_decide(&mut self, cx: &mut ProtocolCx<'_>) {
        let Phase::Locating(located) = &self.phase else {
            return;
        };
        if located.values().any(Option::is_none) {
            return; // waiting for an answer
        }
        let mut answers: BTreeMap<Rank, Holding> = located
            .iter()
            .filter_map(|(&h, a)| a.clone().flatten().map(|a| (h, a)))
            .collect();
        if let Some(local) = &self.local {
            answers.insert(cx.rank, local.clone());
        }
        let newest_of = |a: &Holding| a.held.iter().copied().max();
        let Some(newest) = answers.values().map(newest_of).max() else {
            let holders = Self::holders(cx);
            cx.emit(Action::Fail(Self::lost_with_holders(cx.rank, &holders)));
            return;
        };
        let mut dets: BTreeMap<u64, Determinant> = BTreeMap::new();
        for a in answers.values() {
            dets.extend(a.determinants.iter().map(|d| (d.rsn, *d)));
        }
        self.set_replay(dets.into_values().collect());
        if self.set_coordinated {
            // The set decides (every member must restore the same one).
            self.phase = Phase::AwaitingDecision(answers);
            return;
        }
        let holders = answers
            .iter()
            .filter(|(_, a)| newest_of(a) == newest)
            .map(|(&h, _)| h)
            .collect();
        match newest {
            Some(generation) => self.fetch_next(generation, holders, cx),
            None => {
                self.phase = Phase::Restoring;
                cx.emit(Action::Resume { generation: None });
            }
        }
    }

    /// Fetch `generation` from one of `holders` (all hold it).
    fn fetch_next(&mut self, generation: u64, mut holders: Vec<Rank>, cx: &mut ProtocolCx<'_>) {
        match holders.pop() {
            Some(holder) => {
                self.phase = Phase::Fetching {
                    generation,
                    holder,
                    others: holders,
                };
                cx.emit(Action::Fetch { generation, holder });
            }
            None => {
                let holders = Self::holders(cx);
                cx.emit(Action::Fail(Self::lost_with_holders(cx.rank, &holders)));
            }
        }
    }

    fn lost_with_holders(rank: Rank, holders: &[Rank]) -> Error {
        Error::Unrecoverable(
            format!(
                "rank {rank}'s checkpoint and determinants were held by rank(s) {}, \
                 which all failed before rank {rank}'s replacement fetched them",
                crate::error::list(holders)
            )
            .into(),
        )
    }
    /// Ranks `recovering` re-execute from their checkpoints (epoch
    /// `epoch`): they are resent what they lack and sent nothing meanwhile.
    /// Of them, `lost` died, and with them what they held for others; a
    /// rank that only rolls back with its correlated set keeps its store.
    pub(crate) fn peer_failed(
        &mut self,
        epoch: u64,
        recovering: &[Rank],
        lost: &[Rank],
        cx: &mut ProtocolCx<'_>,
    ) {
        let holders = Self::holders(cx);
        for &d in recovering {
            self.awaiting.insert(d);
            self.suppress.remove(&d);
            self.requested.remove(&d);
            self.deferred.retain(|&(r, _)| r != d);
            // Its replacement serves this from its restored log:
            // messages sent before its checkpoint that we lack. (A
            // rank still recovering asks everyone once restored.)
            if matches!(self.phase, Phase::Done) {
                let hsr = cx.hsr.get(&d).copied().unwrap_or(0);
                Self::send(cx, d, LogMsg::Recovering { hsr });
            }
        }
        for &h in holders.iter().filter(|h| lost.contains(h)) {
            self.dead_holders.insert(h);
        }
        if !holders.is_empty() && holders.iter().all(|h| self.dead_holders.contains(h)) {
            // No holder has our determinants any more: only this rank.
            // (Its replacement is given them again, and acknowledges.)
            let newest = self.own.iter().map(|d| d.rsn).max().unwrap_or(0);
            self.stability.needed = self.stability.needed.max(newest);
            self.stability.holders = holders.clone();
        }
        // A holder that only rolls back with its set keeps its store, but
        // its answer, sent before, is dropped here as coming from the
        // execution it rolls back: it is asked again.
        let rolled_back = |h: &Rank| recovering.contains(h) && !lost.contains(h);
        match &mut self.phase {
            Phase::Locating(located) => {
                located.retain(|h, _| !lost.contains(h));
                for (&h, answer) in located.iter_mut().filter(|(h, _)| rolled_back(h)) {
                    *answer = None;
                    Self::send(cx, h, LogMsg::Locate);
                }
                self.try_decide(cx);
            }
            Phase::Fetching {
                generation,
                holder,
                others,
            } => {
                others.retain(|h| !lost.contains(h));
                if lost.contains(holder) {
                    let (generation, others) = (*generation, std::mem::take(others));
                    self.fetch_next(generation, others, cx);
                } else if rolled_back(holder) {
                    cx.emit(Action::Fetch {
                        generation: *generation,
                        holder: *holder,
                    });
                }
            }
            Phase::AwaitingDecision(answers) => {
                answers.retain(|h, _| !lost.contains(h));
            }
            Phase::Restoring | Phase::Done => {}
        }
        cx.emit(Action::InRecovery(Some(epoch)));
    }

    /// Restore what `save_state` wrote at the start of `state`; returns the
    /// rest (state a protocol built on this one appended).
    pub(crate) fn load_prefix(&mut self, state: &Bytes) -> Result<Bytes> {
        let (st, payloads, rest): (SavedState, _, _) = take_with_blobs(state)?;

        let mut log = BTreeMap::new();
        for (d, saved) in st.log {
            let mut c = ChannelLog::default();
            for m in saved {
                let payload = payloads
                    .get(m.payload as usize)
                    .ok_or_else(|| Error::Codec {
                        what: "a checkpoint piece's message log".into(),
                        detail: format!(
                            "message {} to rank {d} names payload {} of {}",
                            m.ssn,
                            m.payload,
                            payloads.len()
                        ),
                    })?;
                c.bytes += payload.len();
                c.msgs.push_back(AppMessage {
                    envelope: m.envelope,
                    ssn: m.ssn,
                    payload: payload.clone(),
                });
            }
            log.insert(d, c);
        }
        self.drop_log();
        self.log = log;
        for m in self.log.values().flat_map(|c| &c.msgs) {
            self.log_bytes += self.resident.hold(&m.payload);
        }
        self.log_records = self.log.values().map(|c| c.msgs.len()).sum();
        self.trimmed = st.trimmed.into_iter().collect();
        self.next_generation = st.next_generation;
        self.spill_past_budget();
        Ok(rest)
    }

    /// Forget the channel logs (and what they spilled).
    fn drop_log(&mut self) {
        for (&dest, c) in &self.log {
            if let Some(spill) = self.spill.as_mut()
                && !c.spilled.is_empty()
            {
                spill.release(SpillStream::Channel(dest), None);
            }
        }
        // (Records ULML counts outside the channel logs go too: it counts
        // what it keeps again when it restores them.)
        self.log.clear();
        self.resident = Resident::default();
        self.log_bytes = 0;
        self.log_records = 0;
        self.spill_refused = None;
    }
}

/// The bytes of `payload` a checkpoint piece copies rather than shares
/// ([`append_with_blobs`]).
pub(crate) fn copied_len(payload: &Bytes) -> usize {
    if payload.len() < SHARED_SEGMENT_MIN {
        payload.len()
    } else {
        0
    }
}

/// Raise `r`'s watermark in `map` to `v` (watermarks never go down).
fn raise(map: &mut BTreeMap<Rank, u64>, r: Rank, v: u64) {
    let w = map.entry(r).or_insert(v);
    *w = (*w).max(v);
}

/// Whether a rank's determinants are stored safely (the pessimistic
/// condition of 004 §2.1: nothing that depends on a reception leaves before
/// its determinant is). Safely means acknowledged by every holder still
/// alive, not just the first to answer: a rank that dies together with that
/// holder would otherwise lose a determinant that messages it sent depend
/// on, and its replay would diverge from what the survivors received.
#[derive(Debug, Default)]
struct Stability {
    /// The newest RSN that must be stable before the next send.
    needed: u64,
    /// RSNs up to this one are covered by a stored checkpoint.
    floor: u64,
    /// Per holder: the newest RSN it acknowledged.
    acked: BTreeMap<Rank, u64>,
    /// The rank's holders (fixed by the placement).
    holders: Vec<Rank>,
}

impl Stability {
    fn ready(&self, dead_holders: &BTreeSet<Rank>) -> bool {
        if self.needed <= self.floor {
            return true;
        }
        let mut live = self
            .holders
            .iter()
            .filter(|h| !dead_holders.contains(h))
            .peekable();
        live.peek().is_some() && live.all(|h| self.acked.get(h).is_some_and(|&a| a >= self.needed))
    }
}

impl Protocol for Pessimistic {
    fn name(&self) -> &'static str {
        "pessimistic"
    }

    fn rolls_back_survivors(&self) -> bool {
        false
    }

    fn one_sided_as_messages(&self) -> bool {
        true // logged as messages (`engine/rma_messages.rs`)
    }

    fn send_ready(&self) -> bool {
        self.stability.ready(&self.dead_holders) && !self.spill_blocked()
    }

    fn send_wait(&self) -> Option<String> {
        let why = self
            .spill_refused
            .as_ref()
            .filter(|_| self.spill_blocked())?;
        Some(format!(
            "the payload log holds {} bytes, past its budget of {}, and the spill refused more ({why}); sends wait until a checkpoint trims the log",
            self.log_bytes,
            self.log_budget.unwrap_or(0)
        ))
    }

    fn send_stalled(&self) -> Option<String> {
        let st = &self.stability;
        (!st.ready(&self.dead_holders)).then(|| {
            format!(
                "sends wait for the determinants up to RSN {} (stored up to {}) to be acknowledged by every live holder: holders {:?}, dead {:?}, acknowledged {:?}",
                st.needed, st.floor, st.holders, self.dead_holders, st.acked
            )
        })
    }

    fn regenerating(&self, ssn_out: &super::SsnOut) -> bool {
        !self.hsr_pending.is_empty()
            || self
                .regen
                .iter()
                .any(|(&d, &h)| ssn_out.get(&d).copied().unwrap_or(0) < h)
    }

    fn save_state(&self, piece: &mut PieceWriter<'_>) -> Result<()> {
        // Payloads are told apart by buffer: the same bytes at the same
        // address are the same payload.
        // Spilled payloads are read back (the piece holds the whole log,
        // 004 §2.2), each spilled region once.
        let mut payloads: Vec<Bytes> = Vec::new();
        let mut index: HashMap<(usize, usize), u32> = HashMap::new();
        let mut spilled_index: HashMap<(Rank, u64), u32> = HashMap::new();
        let mut log = Vec::with_capacity(self.log.len());
        for (&d, c) in &self.log {
            let mut msgs = Vec::with_capacity(c.msgs.len());
            for (i, m) in c.msgs.iter().enumerate() {
                let payload = match c.spilled.get(i) {
                    Some(s) => match spilled_index.get(&(d, s.offset)) {
                        Some(&p) => p,
                        None => {
                            payloads.push(self.payload(d, c, i)?);
                            let p = (payloads.len() - 1) as u32;
                            spilled_index.insert((d, s.offset), p);
                            p
                        }
                    },
                    None => *index.entry(buffer_key(&m.payload)).or_insert_with(|| {
                        payloads.push(m.payload.clone());
                        (payloads.len() - 1) as u32
                    }),
                };
                msgs.push(SavedMsg {
                    envelope: m.envelope,
                    ssn: m.ssn,
                    payload,
                });
            }
            log.push((d, msgs));
        }
        let st = SavedState {
            log,
            trimmed: self.trimmed.iter().map(|(&d, &n)| (d, n)).collect(),
            next_generation: self.next_generation,
        };
        let payloads: Vec<&Bytes> = payloads.iter().collect();
        append_with_blobs(&st, &payloads, piece)
    }

    fn load_state(&mut self, state: Bytes) -> Result<()> {
        self.load_prefix(&state).map(|_| ())
    }

    fn state_size_hint(&self) -> usize {
        // Payloads of at least `SHARED_SEGMENT_MIN` bytes are shared, not
        // copied.
        let copied: usize = (self.log.values())
            .flat_map(|c| {
                let spilled = c.spilled.iter().map(|s| s.len);
                let resident = c.msgs.iter().skip(c.spilled.len());
                spilled.chain(resident.map(|m| m.payload.len()))
            })
            .filter(|&n| n < SHARED_SEGMENT_MIN)
            .sum();
        copied + self.log_records * (ENCODED_MESSAGE_OVERHEAD + 10) + 64
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::AppSend { msg } => self.on_send(msg, cx),
            Event::AppSent { .. } => {}
            Event::AppDeliver {
                msg,
                rsn,
                applied_at,
                replayed,
            } => {
                let det = Determinant {
                    rsn,
                    src: msg.envelope.src,
                    ssn: msg.ssn,
                    at: applied_at,
                };
                self.on_deliver(det, replayed, cx);
            }
            Event::SafePoint { .. } => self.on_safe_point(cx),
            Event::PieceStored { generation } => self.commit_stored(generation, cx),
            Event::PieceFetchFailed { generation, holder } => {
                if let Phase::Fetching {
                    generation: g,
                    holder: h,
                    others,
                } = &mut self.phase
                    && (*g, *h) == (generation, holder)
                {
                    // The next holder of the same generation (every holder
                    // of it answered `Located` with it). An older generation
                    // would not do: logs and determinants were trimmed by
                    // this one.
                    let others = std::mem::take(others);
                    if others.is_empty() {
                        cx.emit(Action::Fail(Error::CorruptCheckpoint {
                            owner: cx.rank,
                            generation,
                            detail: format!(
                                "no holder has a sound copy (the last asked was rank {holder})"
                            ),
                        }));
                    } else {
                        self.fetch_next(generation, others, cx);
                    }
                }
            }
            Event::PieceRestored { generation } => {
                if matches!(self.phase, Phase::Fetching { .. }) {
                    self.phase = Phase::Restoring;
                    cx.emit(Action::Resume {
                        generation: Some(generation),
                    });
                }
            }
            Event::Control {
                src,
                msg: Control::Log(m),
            } => self.on_log(src, m, cx),
            Event::Control { .. } => {}
            Event::PeerFailed { epoch, dead } => self.peer_failed(epoch, dead, dead, cx),
            Event::Recover { epoch, replacement } => {
                // Only a replacement recovers under message logging, and,
                // under set coordination, the survivors of its set, which
                // forget the execution they roll back.
                if replacement {
                    self.since = epoch;
                }
                // A recovery that another failure in the set interrupts
                // before the restore (`local` is dropped only there) rolls
                // back the same execution again, whose determinants the
                // first one moved out of `own`: they are kept, or a member
                // whose holders all died meanwhile would replay none and
                // choose freely where it had chosen (its reply took the
                // SSN a peer's replayed determinant names as a request:
                // a hang: dht seed 9 in tests/cascades.rs).
                let earlier = self.local.take().map(|l| l.determinants);
                self.local = (!replacement && self.set_coordinated).then(|| {
                    let mut determinants: BTreeMap<u64, Determinant> = (earlier.into_iter())
                        .flatten()
                        .map(|d| (d.rsn, d))
                        .collect();
                    determinants.extend(self.all_determinants().into_iter().map(|d| (d.rsn, d)));
                    Holding {
                        held: (cx.store.held().into_iter())
                            .filter(|&(_, owner)| owner == cx.rank)
                            .map(|(g, _)| g)
                            .collect(),
                        committed: self.stored,
                        determinants: determinants.into_values().collect(),
                    }
                });
                self.own.clear();
                self.stability = Stability::default();
                self.pending.clear();
                self.suppress.clear();
                // Set peers roll back with this rank and re-execute too:
                // their replays may name messages of ours that our
                // re-execution must regenerate exactly before it applies a
                // request no determinant places. Each tells at its restore
                // (`Hsr`), which the set's decision puts after this point.
                self.hsr_pending = self.set_peers(cx.rank).collect();
                self.requested.clear();
                self.set_replay(Vec::new());
                cx.emit(Action::InRecovery(Some(epoch)));
                let holders = Self::holders(cx);
                if holders.is_empty() {
                    self.phase = Phase::Restoring;
                    cx.emit(Action::Resume { generation: None });
                } else {
                    for &h in &holders {
                        Self::send(cx, h, LogMsg::Locate);
                    }
                    self.phase = Phase::Locating(holders.into_iter().map(|h| (h, None)).collect());
                }
            }
            Event::Restored { generation } => {
                self.phase = Phase::Done;
                self.local = None;
                if generation.is_some() {
                    // The restored piece is stored for good: a holder
                    // replaced from now on gets it again (`serve`).
                    self.stored = generation;
                }
                if generation.is_none() {
                    // From the beginning: a member rolled back with its set
                    // still has the log of the execution it rolls back,
                    // which it must not resend (a restored piece replaces
                    // it in `load_prefix`).
                    self.drop_log();
                    self.trimmed.clear();
                    self.regen.clear();
                }
                // What our replay names of each set peer's messages: it
                // regenerates up to there before applying unplaced requests
                // (as `serve` tells a destination outside the set).
                let me = cx.rank;
                for d in self.set_peers(me) {
                    self.send_hsr(d, cx);
                }
                if self.set_coordinated {
                    // A holder in this rank's own set is never
                    // re-provisioned by a resend request (set peers make
                    // none): give it the determinants being replayed.
                    let internal = Self::holders(cx)
                        .into_iter()
                        .filter(|h| self.internal.contains(h));
                    for h in internal.collect::<Vec<_>>() {
                        Self::send(
                            cx,
                            h,
                            LogMsg::Determinants {
                                determinants: self.replay.clone(),
                                full: true,
                            },
                        );
                    }
                }
                // Kept as well: until the re-execution has replayed them,
                // `own` lacks them, and a holder replaced meanwhile must
                // get them all (`serve`).
                cx.emit(Action::Replay {
                    determinants: self.replay.clone(),
                });
                for d in (0..cx.size).filter(|&d| d != me && !self.internal.contains(&d)) {
                    let hsr = cx.hsr.get(&d).copied().unwrap_or(0);
                    Self::send(cx, d, LogMsg::Recovering { hsr });
                    self.hsr_pending.insert(d);
                }
                for (r, hsr) in std::mem::take(&mut self.deferred) {
                    self.serve(r, hsr, cx);
                }
                if self.awaiting.is_empty() {
                    cx.emit(Action::InRecovery(None));
                }
            }
            Event::Finish => self.report(cx),
            // Collectives are logged by their point-to-point messages here;
            // arrivals are not watched, and states are captured whole.
            Event::CollectiveBegin { .. }
            | Event::CollectiveEnd { .. }
            | Event::AppArrive { .. }
            | Event::Recorded { .. }
            | Event::Access { .. }
            | Event::FenceEnter { .. }
            | Event::Fetched { .. }
            | Event::FenceDone { .. }
            | Event::LockOpen { .. }
            | Event::EpochClosed { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::protocol::testing::Harness;
    use crate::segments::Segments;
    use crate::store::pool::BufferPool;

    use crate::protocol::testing::app_message as msg;

    fn resent(actions: &[Action]) -> Vec<u64> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Resend { msg } => Some(msg.ssn),
                _ => None,
            })
            .collect()
    }

    /// A re-executing rank regenerates exactly what its destinations had
    /// received before it applies a request no determinant places, also
    /// after such a destination rolls back (its replay names those
    /// messages), and up to what a destination's replay names.
    /// The last SSN sent to each rank, as the engine keeps it.
    fn ssns(last: &[u64]) -> crate::protocol::SsnOut {
        (last.iter().enumerate())
            .filter(|&(_, &n)| n > 0)
            .map(|(r, &n)| (r, n))
            .collect()
    }

    #[test]
    fn regeneration_covers_what_rolled_back_destinations_had_received() {
        let h = Harness::new(0, 4, 1);
        let mut p = Pessimistic::new(0, None);
        // The last SSN sent to each of the 4 ranks: `n` to rank 2.
        let out = |n: u64| ssns(&[0, 0, n, 0]);
        h.control(
            &mut p,
            2,
            LogMsg::Hsr {
                hsr: 10,
                replayed: 0,
            },
        );
        assert!(p.regenerating(&out(9)));
        assert!(!p.regenerating(&out(10)));
        // Rank 2 rolls back and asks for what follows its restored SSN 3.
        h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[2],
            },
        );
        assert!(p.regenerating(&out(9)), "the rollback lowered the bound");
        h.control(&mut p, 2, LogMsg::Recovering { hsr: 3 });
        assert!(
            p.regenerating(&out(9)),
            "the restored HSR lowered the bound"
        );
        assert!(!p.regenerating(&out(10)));
        // A destination replaying determinants that name SSN 14 of ours.
        h.control(
            &mut p,
            3,
            LogMsg::Hsr {
                hsr: 5,
                replayed: 14,
            },
        );
        assert!(p.regenerating(&ssns(&[0, 0, 10, 13])));
        assert!(!p.regenerating(&ssns(&[0, 0, 10, 14])));
    }

    /// A member's own determinants survive a second rollback of the same
    /// execution before its restore (another failure in its set), whose
    /// holders may all have died by then (dht seed 9 in tests/cascades.rs).
    #[test]
    fn a_second_rollback_before_the_restore_keeps_the_members_own_determinants() {
        let h = Harness::new(1, 4, 2);
        let mut p = Pessimistic::new(2, None);
        p.set_correlated_set([0, 1]);
        let request = crate::protocol::testing::app_message(3, 1, 9, 64);
        h.run(
            &mut p,
            Event::AppDeliver {
                msg: &request,
                rsn: 1,
                applied_at: Some(5),
                replayed: false,
            },
        );
        let recover = |epoch| Event::Recover {
            epoch,
            replacement: false,
        };
        let expected = vec![Determinant {
            rsn: 1,
            src: 3,
            ssn: 9,
            at: Some(5),
        }];
        h.run(&mut p, recover(1));
        assert_eq!(
            p.local.as_ref().map(|l| l.determinants.clone()),
            Some(expected.clone())
        );
        // Another failure in the set before the restore: the same execution
        // rolls back again, and its holders may all be gone by now.
        h.run(&mut p, recover(2));
        assert_eq!(
            p.local.as_ref().map(|l| l.determinants.clone()),
            Some(expected)
        );
    }

    /// Set peers roll back together and both re-execute: a peer whose
    /// replay names our SSN 44 as a request (a request in the first
    /// execution) must not see SSN 44 become our reply to a request no
    /// determinant places (DHT under `correlated`, 8 ranks, kills 5@5% and
    /// 1@5%: rank 0 replayed request 44 of rank 1 forever).
    #[test]
    fn set_peers_tell_each_other_what_their_replays_name() {
        let h = Harness::new(1, 4, 2);
        let mut p = Pessimistic::new(2, None);
        p.set_correlated_set([0, 1]);
        h.run(
            &mut p,
            Event::Recover {
                epoch: 1,
                replacement: false,
            },
        );
        assert!(
            p.regenerating(&ssns(&[0; 4])),
            "until the set peer told what its replay names"
        );
        h.control(
            &mut p,
            0,
            LogMsg::Hsr {
                hsr: 3,
                replayed: 44,
            },
        );
        assert!(p.regenerating(&ssns(&[43, 0, 0, 0])));
        assert!(!p.regenerating(&ssns(&[44, 0, 0, 0])));
        // And this rank tells its set peer at its own restore what its own
        // replay names of the peer's messages.
        p.set_replay(vec![
            Determinant {
                rsn: 1,
                src: 0,
                ssn: 7,
                at: None,
            },
            Determinant {
                rsn: 2,
                src: 3,
                ssn: 12,
                at: None,
            },
        ]);
        let a = h.run(&mut p, Event::Restored { generation: None });
        assert!(
            a.contains(&Action::Transmit {
                dest: 0,
                msg: Control::Log(LogMsg::Hsr {
                    hsr: 0,
                    replayed: 7
                })
            }),
            "{a:?}"
        );
    }

    #[test]
    fn a_payload_logged_for_several_ranks_is_saved_once_and_restored_shared() {
        let h = Harness::new(0, 4, 1);
        let mut p = Pessimistic::new(0, None);
        // A broadcast tree: one buffer to ranks 1, 2 and 3, then one of
        // its own to rank 2.
        let shared = msg(0, 1, 1, 1000).payload;
        for dest in 1..=3 {
            let mut m = msg(0, dest, 1, 0);
            m.payload = shared.clone();
            h.run(&mut p, Event::AppSend { msg: &m });
        }
        h.run(
            &mut p,
            Event::AppSend {
                msg: &msg(0, 2, 2, 500),
            },
        );
        assert_eq!(p.log_bytes, 1500, "the shared buffer counts once");
        let piece = saved(&p);
        assert!(
            piece.len() < 1600,
            "{} bytes: the shared payload was saved more than once",
            piece.len()
        );
        assert!(p.state_size_hint() >= piece.len());

        let mut q = Pessimistic::new(0, None);
        q.load_state(piece.to_bytes()).expect("loads");
        assert_eq!((q.log_records, q.log_bytes), (4, 1500));
        for (dest, c) in &p.log {
            let got = &q.log[dest].msgs;
            assert_eq!(got, &c.msgs, "log for rank {dest}");
        }
        // Restored, the three copies are one buffer again.
        let first = q.log[&1].msgs[0].payload.as_ptr();
        assert_eq!(q.log[&3].msgs[0].payload.as_ptr(), first);
        assert_eq!(q.log[&2].msgs[0].payload.as_ptr(), first);
        assert_ne!(q.log[&2].msgs[1].payload.as_ptr(), first);

        // A piece naming a payload it does not hold is refused, not a panic.
        let bad = SavedState {
            log: vec![(
                1,
                vec![SavedMsg {
                    envelope: msg(0, 1, 1, 0).envelope,
                    ssn: 1,
                    payload: 0,
                }],
            )],
            trimmed: Vec::new(),
            next_generation: 1,
        };
        let mut bad = postcard::to_allocvec(&bad).expect("encodes");
        bad.extend(postcard::to_allocvec(&Vec::<u64>::new()).expect("encodes"));
        assert!(matches!(
            Pessimistic::new(0, None).load_state(bad.into()),
            Err(Error::Codec { .. })
        ));
    }

    /// The protocol's part of a checkpoint piece, as the engine writes it.
    fn saved(p: &dyn Protocol) -> Segments {
        let pool = BufferPool::new();
        let mut w = PieceWriter::new(&pool, Vec::new());
        p.save_state(&mut w).expect("saves");
        w.finish()
    }

    /// Large payloads are not copied into a checkpoint piece: it holds the
    /// log's own buffers. A restore copies them out (a slice would keep
    /// the whole piece alive). Lengths that run past the piece are refused.
    #[test]
    fn large_payloads_are_shared_with_the_piece_not_copied() {
        let h = Harness::new(0, 3, 1);
        let mut p = Pessimistic::new(0, None);
        let sizes = [SHARED_SEGMENT_MIN, 10, 3 * SHARED_SEGMENT_MIN, 20];
        for (i, n) in sizes.into_iter().enumerate() {
            let m = msg(0, 1 + i % 2, 1 + i as u64 / 2, n);
            h.run(&mut p, Event::AppSend { msg: &m });
        }
        // The first large payload again, to rank 2 (a broadcast tree's
        // forward): still one segment.
        let mut again = msg(0, 2, 3, 0);
        again.payload = p.log[&1].msgs[0].payload.clone();
        h.run(&mut p, Event::AppSend { msg: &again });
        let piece = saved(&p);
        let logged: Vec<&Bytes> = p
            .log
            .values()
            .flat_map(|c| &c.msgs)
            .map(|m| &m.payload)
            .collect();
        let big: Vec<&&Bytes> = logged
            .iter()
            .filter(|b| b.len() >= SHARED_SEGMENT_MIN)
            .collect();
        assert_eq!(big.len(), 3);
        for b in &big {
            let holding = (piece.segments().iter())
                .filter(|s| s.as_ptr() == b.as_ptr() && s.len() == b.len())
                .count();
            assert_eq!(
                holding,
                1,
                "a payload of {} bytes: {holding} segments",
                b.len()
            );
        }
        // The head and the two shared payloads: the small payloads are in
        // the head, not segments of their own.
        assert_eq!(piece.segments().len(), 3);
        // What is copied is the metadata and the small payloads.
        assert!(
            p.state_size_hint() < p.log_bytes,
            "the hint counts shared payloads"
        );
        assert!(piece.segments()[0].len() <= p.state_size_hint());

        let flat = piece.to_bytes();
        let mut q = Pessimistic::new(0, None);
        q.load_state(flat.clone()).expect("loads");
        // Restored payloads are copies: a slice would keep the whole piece
        // alive for as long as one of them stays in the log.
        let range = flat.as_ptr() as usize..flat.as_ptr() as usize + flat.len();
        for (dest, c) in &p.log {
            assert_eq!(&q.log[dest].msgs, &c.msgs, "log for rank {dest}");
            for m in &q.log[dest].msgs {
                assert!(
                    !range.contains(&(m.payload.as_ptr() as usize)),
                    "restored as a slice of the piece"
                );
            }
        }

        // A piece cut short inside a payload, shared or small: a codec error.
        for cut in [flat.len() - 1, piece.segments()[0].len() - 1] {
            assert!(matches!(
                Pessimistic::new(0, None).load_state(flat.slice(..cut)),
                Err(Error::Codec { .. })
            ));
        }
    }

    #[test]
    fn logs_by_reference_trims_on_the_receivers_checkpoint_and_resends_above_hsr() {
        let h = Harness::new(0, 4, 1);
        let mut p = Pessimistic::new(0, None);
        let mut sent = Vec::new();
        for ssn in 1..=5 {
            let m = msg(0, 2, ssn, 100);
            assert!(h.run(&mut p, Event::AppSend { msg: &m }).is_empty());
            sent.push(m);
        }
        // The log shares the sent buffer (DESIGN principle 4).
        let logged = &p.log[&2].msgs[0].payload;
        assert_eq!(logged.as_ptr(), sent[0].payload.as_ptr());
        assert_eq!((p.log_records, p.log_bytes), (5, 500));
        h.control(&mut p, 2, LogMsg::Trim { upto: 2 });
        assert_eq!((p.log_records, p.log_bytes), (3, 300));
        // Rank 2 died; sends to it wait in the log.
        h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[2],
            },
        );
        let m6 = msg(0, 2, 6, 100);
        assert_eq!(
            h.run(&mut p, Event::AppSend { msg: &m6 }),
            vec![Action::Withhold]
        );
        // Its replacement restored SSN 3 from us: 4, 5, 6 are resent in order.
        let a = h.control(&mut p, 2, LogMsg::Recovering { hsr: 3 });
        assert_eq!(resent(&a), vec![4, 5, 6]);
        assert!(p.awaiting.is_empty());
        assert!(a.contains(&Action::InRecovery(None)));
    }

    /// Past its budget the log moves its oldest payloads to the spill and
    /// stays under the budget; resends and checkpoint pieces read them
    /// back, a buffer sent again and again is spilled once, and a trim
    /// frees the spill.
    #[test]
    fn a_log_past_its_budget_spills_and_reads_back() {
        use crate::store::spill::FileSpill;
        let h = Harness::new(0, 4, 1);
        let mut p = Pessimistic::new(0, Some(1000));
        p.set_spill(Box::new(FileSpill::new(std::env::temp_dir(), 1 << 20)));
        let mut sent = Vec::new();
        for ssn in 1..=10 {
            let m = msg(0, 2, ssn, 300);
            h.run(&mut p, Event::AppSend { msg: &m });
            assert!(p.log_bytes <= 1000, "{} bytes in memory", p.log_bytes);
            sent.push(m);
        }
        // One buffer sent five times to rank 3: one copy in the spill.
        let again = msg(0, 3, 1, 900);
        for ssn in 1..=5 {
            let m = AppMessage {
                ssn,
                ..again.clone()
            };
            h.run(&mut p, Event::AppSend { msg: &m });
        }
        assert!(p.log_bytes <= 1000 && !p.log[&2].spilled.is_empty());
        assert!(p.send_ready());
        let spilled = p.spill.as_ref().map(|s| s.held()).unwrap_or(0);
        assert!(
            spilled <= 10 * 300 + 900,
            "{spilled} bytes spilled: duplicates"
        );
        // The piece holds the whole log.
        let mut q = Pessimistic::new(0, None);
        q.load_state(saved(&p).to_bytes()).expect("loads");
        assert_eq!(q.log[&2].msgs, sent);
        assert!(q.log[&3].msgs.iter().all(|m| m.payload == again.payload));
        // Resends read the spill.
        h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[2],
            },
        );
        let a = h.control(&mut p, 2, LogMsg::Recovering { hsr: 4 });
        let resent: Vec<&AppMessage> = a
            .iter()
            .filter_map(|x| match x {
                Action::Resend { msg } => Some(msg),
                _ => None,
            })
            .collect();
        assert_eq!(resent, sent[4..].iter().collect::<Vec<_>>());
        // Trimmed entirely, the spill of rank 2 is empty again.
        let before = p.spill.as_ref().map(|s| s.held()).unwrap_or(0);
        h.control(&mut p, 2, LogMsg::Trim { upto: 10 });
        let after = p.spill.as_ref().map(|s| s.held()).unwrap_or(0);
        assert!(after < before && p.log[&2].spilled.is_empty());
    }

    /// A full spill makes sends wait (the bound holds) and says why, so the
    /// engine can tell the user; a trim frees the spill and sends go on.
    #[test]
    fn a_full_spill_holds_sends_and_says_why_until_a_trim() {
        use crate::store::spill::FileSpill;
        let h = Harness::new(0, 4, 1);
        let mut p = Pessimistic::new(0, Some(1000));
        p.set_spill(Box::new(FileSpill::new(std::env::temp_dir(), 1500)));
        for ssn in 1..=12 {
            h.run(
                &mut p,
                Event::AppSend {
                    msg: &msg(0, 2, ssn, 300),
                },
            );
        }
        assert!(
            !p.send_ready(),
            "the log is past its budget, the spill full"
        );
        let why = p.send_wait().expect("a reason for the user");
        assert!(
            why.contains("the spill is full") && why.contains("budget of 1000"),
            "{why}"
        );
        h.control(&mut p, 2, LogMsg::Trim { upto: 12 });
        assert!(p.send_ready() && p.send_wait().is_none());
    }

    #[test]
    fn a_restart_behind_a_trim_is_an_error_not_a_silent_gap() {
        let h = Harness::new(0, 4, 1);
        let mut p = Pessimistic::new(0, None);
        for ssn in 1..=4 {
            h.run(
                &mut p,
                Event::AppSend {
                    msg: &msg(0, 1, ssn, 8),
                },
            );
        }
        h.control(&mut p, 1, LogMsg::Trim { upto: 3 });
        let a = h.control(&mut p, 1, LogMsg::Recovering { hsr: 1 });
        assert!(matches!(
            a.as_slice(),
            [Action::Fail(Error::Unrecoverable(_))]
        ));
    }

    #[test]
    fn sends_wait_until_every_live_holder_acknowledges_determinants() {
        let mut h = Harness::new(1, 4, 1); // holders: ranks 2 and 3
        let mut p = Pessimistic::new(0, None);
        let m = msg(3, 1, 1, 8);
        h.rsn = 1;
        let a = h.run(
            &mut p,
            Event::AppDeliver {
                msg: &m,
                rsn: 1,
                applied_at: None,
                replayed: false,
            },
        );
        let det = Determinant {
            rsn: 1,
            src: 3,
            ssn: 1,
            at: None,
        };
        assert!(a.contains(&Action::Transmit {
            dest: 2,
            msg: Control::Log(LogMsg::Determinants {
                determinants: vec![det],
                full: false
            })
        }));
        assert!(!p.send_ready());
        h.control(&mut p, 2, LogMsg::DeterminantAck { upto: 1 });
        // One holder is not enough while the other is alive: this rank and
        // rank 2 dying together would lose the determinant.
        assert!(!p.send_ready());
        h.control(&mut p, 3, LogMsg::DeterminantAck { upto: 1 });
        assert!(p.send_ready());
        // A replayed reception is not logged again.
        let a = h.run(
            &mut p,
            Event::AppDeliver {
                msg: &msg(3, 1, 2, 8),
                rsn: 2,
                applied_at: None,
                replayed: true,
            },
        );
        assert!(a.is_empty() && p.send_ready());
        // One holder died: the other still has them.
        h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[2],
            },
        );
        assert!(p.send_ready());
        // Both died: only this rank has its determinants; sends wait until
        // a replaced holder has them all again.
        h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 2,
                dead: &[3],
            },
        );
        assert!(!p.send_ready());
        let a = h.control(&mut p, 2, LogMsg::Recovering { hsr: 0 });
        assert!(a.iter().any(|x| matches!(
            x,
            Action::Transmit {
                dest: 2,
                msg: Control::Log(LogMsg::Determinants { full: true, determinants })
            } if determinants.len() == 2
        )));
        h.control(&mut p, 2, LogMsg::DeterminantAck { upto: 2 });
        assert!(p.send_ready());
    }

    #[test]
    fn a_replacement_locates_fetches_replays_and_asks_everyone() {
        let h = Harness::new(3, 4, 1); // holders: ranks 0 and 1
        let mut p = Pessimistic::new(2, None);
        let a = h.run(
            &mut p,
            Event::Recover {
                epoch: 1,
                replacement: true,
            },
        );
        for dest in [0, 1] {
            assert!(a.contains(&Action::Transmit {
                dest,
                msg: Control::Log(LogMsg::Locate)
            }));
        }
        // A request served only after the restore.
        assert!(
            h.control(&mut p, 1, LogMsg::Recovering { hsr: 0 })
                .is_empty()
        );
        let det = Determinant {
            rsn: 4,
            src: 1,
            ssn: 9,
            at: None,
        };
        // The second holder missed the newest piece; the newest is used.
        let a = h.control(
            &mut p,
            1,
            LogMsg::Located {
                held: vec![1],
                committed: None,
                determinants: Vec::new(),
                complete: true,
            },
        );
        assert!(a.is_empty(), "decided before every holder answered");
        let a = h.control(
            &mut p,
            0,
            LogMsg::Located {
                held: vec![2],
                committed: None,
                determinants: vec![det],
                complete: true,
            },
        );
        assert_eq!(
            a,
            vec![Action::Fetch {
                generation: 2,
                holder: 0
            }]
        );
        let a = h.run(&mut p, Event::PieceRestored { generation: 2 });
        assert_eq!(
            a,
            vec![Action::Resume {
                generation: Some(2)
            }]
        );
        let a = h.run(
            &mut p,
            Event::Restored {
                generation: Some(2),
            },
        );
        assert_eq!(
            a[0],
            Action::Replay {
                determinants: vec![det]
            }
        );
        let asked: Vec<Rank> = a
            .iter()
            .filter_map(|x| match x {
                Action::Transmit {
                    dest,
                    msg: Control::Log(LogMsg::Recovering { .. }),
                } => Some(*dest),
                _ => None,
            })
            .collect();
        assert_eq!(asked, vec![0, 1, 2]);
        // The deferred request of rank 1 was answered, naming the message
        // of rank 1 the replay expects (so that rank 1, re-executing too,
        // regenerates it exactly before applying unplaced requests).
        assert!(a.contains(&Action::Transmit {
            dest: 1,
            msg: Control::Log(LogMsg::Hsr {
                hsr: 0,
                replayed: 9
            })
        }));
        // A rank asking later, after the replay went to the engine, learns
        // it too.
        let a = h.control(&mut p, 1, LogMsg::Recovering { hsr: 0 });
        assert!(a.contains(&Action::Transmit {
            dest: 1,
            msg: Control::Log(LogMsg::Hsr {
                hsr: 0,
                replayed: 9
            })
        }));
        // That rank is a holder, replaced while this rank has not replayed
        // yet: it gets every determinant, the replay's included (it was
        // given only those replayed so far, as a full set), and the
        // restored piece.
        assert!(
            a.contains(&Action::Transmit {
                dest: 1,
                msg: Control::Log(LogMsg::Determinants {
                    determinants: vec![det],
                    full: true
                })
            }),
            "{a:?}"
        );
        assert!(a.contains(&Action::Replicate { generation: 2 }), "{a:?}");
    }

    /// A replacement (checkpoint every 2 safe points) that has started its
    /// recovery: it asked its holders where its piece is.
    fn recovering_replacement(h: &Harness) -> Pessimistic {
        let mut p = Pessimistic::new(2, None);
        h.run(
            &mut p,
            Event::Recover {
                epoch: 1,
                replacement: true,
            },
        );
        p
    }

    /// A holder whose copy is damaged (or gone) is passed over for the next
    /// holder of the same generation; with none left the recovery fails
    /// with the damage named, not with a wait.
    #[test]
    fn a_damaged_copy_is_fetched_from_the_next_holder() {
        let h = Harness::new(3, 4, 1); // holders: ranks 0 and 1
        let mut p = recovering_replacement(&h);
        let located = || LogMsg::Located {
            held: vec![2],
            committed: None,
            determinants: Vec::new(),
            complete: true,
        };
        h.control(&mut p, 0, located());
        let a = h.control(&mut p, 1, located());
        let Some(&Action::Fetch {
            generation: 2,
            holder: first,
        }) = a.first()
        else {
            panic!("no fetch: {a:?}");
        };
        // A failure of some other fetch is not this one's.
        let a = h.run(
            &mut p,
            Event::PieceFetchFailed {
                generation: 1,
                holder: first,
            },
        );
        assert!(a.is_empty(), "{a:?}");
        let a = h.run(
            &mut p,
            Event::PieceFetchFailed {
                generation: 2,
                holder: first,
            },
        );
        let second = 1 - first;
        assert_eq!(
            a,
            vec![Action::Fetch {
                generation: 2,
                holder: second
            }]
        );
        let a = h.run(
            &mut p,
            Event::PieceFetchFailed {
                generation: 2,
                holder: second,
            },
        );
        assert!(
            matches!(
                a.as_slice(),
                [Action::Fail(Error::CorruptCheckpoint { owner: 3, generation: 2, detail })]
                    if detail.contains("no holder has a sound copy")
            ),
            "{a:?}"
        );
    }

    #[test]
    fn holders_that_lost_their_state_make_recovery_fail_clearly() {
        let h = Harness::new(3, 4, 1);
        let mut p = recovering_replacement(&h);
        for holder in [0, 1] {
            let a = h.control(
                &mut p,
                holder,
                LogMsg::Located {
                    held: Vec::new(),
                    committed: None,
                    determinants: Vec::new(),
                    complete: false,
                },
            );
            if holder == 1 {
                match a.as_slice() {
                    [Action::Fail(e)] => {
                        assert!(e.to_string().contains("held by rank(s) 0, 1, which"), "{e}")
                    }
                    other => panic!("{other:?}"),
                }
            }
        }
    }
}
