//! Protocol `ulml`: user-level message logging (002, Liu et al.).
//!
//! **Point-to-point** messages are logged exactly as under
//! [`pessimistic`](super::pessimistic) (002 §3.1): the sender keeps the
//! payload by reference with its SSN, the receiver keeps the highest SSN it
//! received (HSR), a restored rank tells every rank its HSR so that each
//! resends its logged messages above it (the HSD of 002 §3.3), duplicates
//! are dropped by SSN, and wildcard receptions are replayed from their
//! determinants. This protocol is built on that one and adds the part that
//! makes it user-level:
//!
//! **Collectives are logged as whole results** (002 §2.2, Table 1). A
//! collective whose result is the same at every member (barrier, broadcast,
//! all-reduce, all-gather) sends its internal messages without SSN and
//! without logging them; when it completes, each rank keeps its result (the
//! very buffer the application copies from) and counts it in the per-kind
//! collective counters. An all-reduce over P ranks thus costs P log records
//! instead of the 2(P−1) of library-level logging. Rooted and personalized
//! collectives (reduce, gather, scatter, all-to-all) have no result another
//! member could hand over for a dead rank, so their messages are logged
//! point-to-point.
//!
//! **Recovery** (002 §3.2–§3.3). The dead rank's substitute restores its
//! checkpoint, with its collective counters, and re-executes. When it
//! enters a collective whose result it does not have, it asks the other
//! members (`ResultRequest`); a member that completed that collective sends
//! its logged results from there on (`Results`), so the substitute replays
//! the following collectives without a message: barriers are skipped and
//! the others become receptions of the logged result. A member that has not
//! completed the collective yet answers when it does. Survivors that were
//! inside a collective when a member died may have been owed messages that
//! died with it: they abandon the attempt (`CollectiveRestart`, the revoke of
//! 002 §3.2), ask the other members for the result, and start the attempt
//! again; duplicates of restarted attempts are dropped by the engine (every
//! message carries its collective's number). A substitute asks at each
//! collective on a communicator from its restore until one completes there
//! by a real attempt (or by a result a member sent on completing it); a
//! rank that completes from a log still sends what the algorithm has it
//! send (the result down its broadcast subtree, its block of an
//! all-gather to every member), so no other rank waits for a message the
//! log replaced. An all-gather's result is logged as the blocks that
//! arrived ([`Segments`]), not a copy of their concatenation. Unlogged
//! messages to a dead rank wait until its substitute asks for its
//! messages.
//!
//! Each rank's logged results are dropped once every member's stored
//! checkpoint is past them: ranks announce their stored checkpoints'
//! collective counts to rank 0 (`Checkpointed`), which tells everyone how
//! far to drop (`Trim`), O(P) messages per checkpoint round. A
//! sub-communicator's members come with its counts, and each rank is told
//! its own communicators' minimum: a split gives every part the same
//! context, and ranks outside a communicator never report it, so a minimum
//! over all ranks would mix parts or hold results back for ever.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::pessimistic::{LogMsg, Pessimistic, copied_len};
use super::{Action, Collective, Control, Event, Protocol, ProtocolCx};
use crate::engine::frame::{AppMessage, ContextId, append_with_blobs, take_with_blobs};
use crate::segments::Segments;
use crate::store::PieceWriter;
use crate::store::spill::SpillStream;
use crate::{Error, Rank, Result};

/// Control messages of user-level collective logging.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CollMsg {
    /// "I need the result of collective `index` on `context`."
    ResultRequest {
        /// Collective context.
        context: ContextId,
        /// Collective number.
        index: u64,
    },
    /// Logged results of collectives `from`, `from + 1`, ... on `context`.
    Results {
        /// Collective context.
        context: ContextId,
        /// Number of the first.
        from: u64,
        /// The results, in order (each arrives as one segment on the
        /// processes backend).
        results: Vec<Segments>,
        /// The sender completed collective `from` after the request came
        /// (so the requester was taking part in it, not re-executing
        /// history).
        on_completion: bool,
    },
    /// Answer to a `ResultRequest` for a collective whose result the
    /// sender dropped: every member's stored checkpoint had passed it.
    /// Only a requester still waiting in that collective needs it (its
    /// restored checkpoint is older than the one it stored last); to any
    /// other, the request was stale (it completed the collective otherwise
    /// and checkpointed past it since asking).
    Dropped {
        /// Collective context.
        context: ContextId,
        /// Collective number.
        index: u64,
    },
    /// To the trim coordinator (rank 0): the sender's stored checkpoint
    /// holds its collectives up to these numbers.
    Checkpointed {
        /// `(context, collectives completed)`.
        counts: Vec<(ContextId, u64)>,
        /// World ranks of the sub-communicators among `counts` (a context
        /// not listed is the world's: every rank takes part).
        members: Vec<(ContextId, Vec<Rank>)>,
    },
    /// From the trim coordinator: every rank's stored checkpoint is past
    /// these numbers; drop the results up to them.
    Trim {
        /// `(context, last collective not needed)`.
        counts: Vec<(ContextId, u64)>,
    },
    /// To the trim coordinator: the sender's log passed half its budget;
    /// ask the ranks whose stored checkpoint is oldest to checkpoint.
    TrimPressure {
        /// World ranks of the sender's sub-communicators (the coordinator
        /// may take part in none of their collectives).
        members: Vec<(ContextId, Vec<Rank>)>,
    },
}

/// A communicator's members, or every rank when it is the world's.
fn or_world(group: Option<&Vec<Rank>>, size: usize) -> Vec<Rank> {
    group.cloned().unwrap_or_else(|| (0..size).collect())
}

/// Logged results of one context, by collective number, ascending.
///
/// A rank's own results come in number order and go at the back, and a
/// collective looks for its result at the back first: the common case
/// touches one entry, where a tree search walked several nodes the
/// application had evicted from cache since the previous collective.
/// Results a member sends ahead of this rank (recovery) are inserted in
/// order; trims drop from the front.
#[derive(Debug, Default, Clone, PartialEq)]
struct ResultLog(VecDeque<(u64, Held)>);

/// A logged result: in memory (shared with the engine's buffers), or moved
/// to the spill past the log budget (issue 33, build 2).
#[derive(Debug, Clone, PartialEq)]
enum Held {
    Memory(Segments),
    Spilled { offset: u64, len: usize },
}

impl Held {
    /// Bytes it holds in memory.
    fn resident(&self) -> usize {
        match self {
            Held::Memory(r) => r.len(),
            Held::Spilled { .. } => 0,
        }
    }
}

impl ResultLog {
    /// Position of `index`, or where it would go.
    fn position(&self, index: u64) -> std::result::Result<usize, usize> {
        match self.0.back() {
            None => Err(0),
            Some(&(last, _)) if last < index => Err(self.0.len()),
            Some(&(last, _)) if last == index => Ok(self.0.len() - 1),
            _ => self.0.binary_search_by_key(&index, |&(i, _)| i),
        }
    }

    fn get(&self, index: u64) -> Option<&Held> {
        let at = self.position(index).ok()?;
        self.0.get(at).map(|(_, r)| r)
    }

    /// Keep `result` as number `index` unless one is kept already; whether
    /// it was.
    fn insert(&mut self, index: u64, result: &Segments) -> bool {
        match self.position(index) {
            Ok(_) => false,
            Err(at) => {
                self.0.insert(at, (index, Held::Memory(result.clone())));
                true
            }
        }
    }

    /// The results numbered `index` and after.
    fn from(&self, index: u64) -> impl Iterator<Item = (u64, &Held)> {
        let at = self.position(index).unwrap_or_else(|at| at);
        self.0.range(at..).map(|(i, r)| (*i, r))
    }

    /// Drop the results numbered up to `upto`: records dropped, bytes they
    /// held in memory, and whether one was spilled.
    fn drop_upto(&mut self, upto: u64) -> (usize, usize, bool) {
        let (mut records, mut bytes, mut spilled) = (0, 0, false);
        while let Some((_, r)) = self.0.pop_front_if(|(i, _)| *i <= upto) {
            records += 1;
            bytes += r.resident();
            spilled |= matches!(r, Held::Spilled { .. });
        }
        (records, bytes, spilled)
    }

    /// The lowest spill offset still needed (`None`: nothing spilled). A
    /// result sent ahead by a member may be spilled after higher numbers,
    /// so this is the minimum, not the front's.
    fn spill_floor(&self) -> Option<u64> {
        (self.0.iter())
            .filter_map(|(_, r)| match r {
                Held::Spilled { offset, .. } => Some(*offset),
                Held::Memory(_) => None,
            })
            .min()
    }

    fn iter(&self) -> impl Iterator<Item = (u64, &Held)> {
        self.0.iter().map(|(i, r)| (*i, r))
    }
}

/// What a rank holds of one communicator's collectives (one record, so that
/// a collective looks up one thing: its bookkeeping runs between the
/// application's computations, with its data out of cache).
#[derive(Debug, Default)]
struct ContextLog {
    /// Results by number: this rank's own, and those other members sent
    /// for collectives it has not reached.
    results: ResultLog,
    /// Collectives with a logged result completed (numbers start at 1).
    done: u64,
    /// Results up to this number were dropped.
    trimmed: u64,
    /// A real attempt completed here since the last failure or restore:
    /// no need to ask for results any more.
    settled: bool,
    /// World ranks, when this is a sub-communicator (learned at its
    /// collectives); `None` for the world's.
    members: Option<Vec<Rank>>,
}

/// The rank that collects stored checkpoints' collective counts and says
/// how far everyone may drop results.
const TRIM_COORDINATOR: Rank = 0;

/// The collective in progress (one whose result is logged).
#[derive(Debug)]
struct Current {
    context: ContextId,
    index: u64,
    /// Its members; `None` for the world (every rank).
    group: Option<Vec<Rank>>,
    /// A member died during it.
    disturbed: bool,
    /// Completed from a logged result.
    from_log: bool,
    /// That result was sent on the sender's completion of this very
    /// collective: the rank is caught up, as after a real attempt.
    caught_up: bool,
    /// Asked the other members for the result.
    requested: bool,
}

/// What a checkpoint piece holds of this protocol (after the point-to-point
/// part).
#[derive(Debug, Default, Serialize, Deserialize)]
struct SavedState {
    done: Vec<(ContextId, u64)>,
    per_kind: Vec<u64>,
    /// The indices of the logged results not yet trimmed, per context: like
    /// the sender log, they are part of the checkpoint (a rank restored past
    /// a collective still owes its result to a member that restores from
    /// before it), with the number of segments of each. The segments
    /// follow, in this order, shared with the log ([`append_with_blobs`]).
    results: Vec<(ContextId, Vec<(u64, u32)>)>,
    /// How far each context's results were trimmed.
    trimmed: Vec<(ContextId, u64)>,
    /// Members of the sub-communicators this rank knows.
    members: Vec<(ContextId, Vec<Rank>)>,
}

/// State of the ULML protocol on one rank.
#[derive(Debug)]
pub struct Ulml {
    p2p: Pessimistic,
    /// Logged results and counters, per communicator context.
    contexts: BTreeMap<ContextId, ContextLog>,
    current: Option<Current>,
    /// Asking for results at each collective (since a failure or restore),
    /// except on contexts [`ContextLog::settled`] since.
    asking: bool,
    /// Requests for results this rank does not have yet.
    pending: BTreeMap<(ContextId, u64), BTreeSet<Rank>>,
    /// Unlogged messages to dead ranks, sent when the substitute asks.
    withheld: BTreeMap<Rank, Vec<AppMessage>>,
    /// Completed collectives by kind (002 §3.1 "statistics of
    /// collectives"), in [`Collective::ALL`] order.
    per_kind: [u64; 8],
    /// Captured, not yet stored checkpoints: generation → collective counts.
    capturing: BTreeMap<u64, Vec<(ContextId, u64)>>,
    /// Each rank's newest stored checkpoint's collective counts.
    stored_counts: BTreeMap<Rank, BTreeMap<ContextId, u64>>,
    /// Trim coordinator: each rank's sub-communicator of a context, as it
    /// reported it (the parts of a split share the context).
    groups: BTreeMap<(Rank, ContextId), Vec<Rank>>,
    /// Trim coordinator: how far each rank was told to drop each context.
    told: BTreeMap<(Rank, ContextId), u64>,
    /// Ranks asked to checkpoint (log budget) whose checkpoint has not been
    /// announced since (trim coordinator).
    asked: BTreeSet<Rank>,
    /// This rank told the coordinator its log is past half the budget, and
    /// no `Trim` came since.
    pressed: bool,
}

impl Ulml {
    /// Checkpoint every `every` safe points (0: only when asked); with
    /// `log_budget`, ask receivers to checkpoint once the log passes half of
    /// it.
    pub fn new(every: u64, log_budget: Option<usize>) -> Self {
        Self::with_p2p(Pessimistic::new(every, log_budget))
    }

    /// Over `p2p`, the point-to-point logging (its checkpoint schedule, log
    /// budget and spill).
    pub(crate) fn with_p2p(p2p: Pessimistic) -> Self {
        Ulml {
            p2p,
            contexts: BTreeMap::new(),
            current: None,
            asking: false,
            pending: BTreeMap::new(),
            withheld: BTreeMap::new(),
            per_kind: [0; 8],
            capturing: BTreeMap::new(),
            stored_counts: BTreeMap::new(),
            groups: BTreeMap::new(),
            told: BTreeMap::new(),
            asked: BTreeSet::new(),
            pressed: false,
        }
    }

    /// Log budget: results are dropped only once every rank's checkpoint
    /// passed them, so past half the budget the ranks whose stored
    /// checkpoint is oldest are asked to checkpoint at their next safe
    /// point (by the trim coordinator, which knows them).
    fn enforce_budget(&mut self, cx: &mut ProtocolCx<'_>) {
        self.spill_results();
        if !self.p2p.over_half_budget() {
            return;
        }
        if cx.rank == TRIM_COORDINATOR {
            self.ask_laggards(cx);
        } else if !self.pressed {
            self.pressed = true;
            let members = self.members_of(self.contexts.keys().copied());
            Self::send(cx, TRIM_COORDINATOR, CollMsg::TrimPressure { members });
        }
    }

    /// Trim coordinator: ask the ranks whose stored checkpoint is oldest on
    /// some communicator (among its members) to checkpoint.
    fn ask_laggards(&mut self, cx: &mut ProtocolCx<'_>) {
        let mut communicators: BTreeSet<(ContextId, Vec<Rank>)> = (self.contexts.iter())
            .filter(|(_, l)| l.done > 0)
            .map(|(&c, l)| (c, or_world(l.members.as_ref(), cx.size)))
            .collect();
        communicators.extend(self.groups.iter().map(|(&(_, c), g)| (c, g.clone())));
        let mut laggards = BTreeSet::new();
        for (context, members) in communicators {
            if let Some(oldest) = members.iter().map(|&r| self.stored_count(r, context)).min() {
                laggards.extend(
                    members
                        .into_iter()
                        .filter(|&r| self.stored_count(r, context) == oldest),
                );
            }
        }
        for r in laggards {
            if !self.asked.insert(r) {
                continue;
            }
            if r == cx.rank {
                self.p2p.force_checkpoint();
            } else {
                cx.emit(Action::Transmit {
                    dest: r,
                    msg: Control::Log(LogMsg::CheckpointRequest),
                });
            }
        }
    }

    /// Trim coordinator: `src` stored a checkpoint with these collective
    /// counts; each rank whose communicators' members all passed more
    /// results drops them.
    fn on_checkpointed(
        &mut self,
        src: Rank,
        counts: Vec<(ContextId, u64)>,
        members: Vec<(ContextId, Vec<Rank>)>,
        cx: &mut ProtocolCx<'_>,
    ) {
        self.learn_groups(src, members, cx.size);
        self.stored_counts.insert(src, counts.into_iter().collect());
        self.asked.remove(&src);
        // The minimum of each communicator, once; then what each rank that
        // reported a context is told (one that never reported holds
        // nothing its communicators' members all passed).
        let mut minimum: BTreeMap<(ContextId, Vec<Rank>), u64> = BTreeMap::new();
        let mut tell: BTreeMap<Rank, Vec<(ContextId, u64)>> = BTreeMap::new();
        for (&d, contexts) in &self.stored_counts {
            for &context in contexts.keys() {
                let group = self.group_of(d, context, cx.size);
                let min = *minimum
                    .entry((context, group))
                    .or_insert_with_key(|(_, g)| {
                        g.iter()
                            .map(|&r| self.stored_count(r, context))
                            .min()
                            .unwrap_or(0)
                    });
                if min > self.told.get(&(d, context)).copied().unwrap_or(0) {
                    tell.entry(d).or_default().push((context, min));
                }
            }
        }
        let me = cx.rank;
        for (d, counts) in tell {
            for &(context, upto) in &counts {
                self.told.insert((d, context), upto);
            }
            if d == me {
                self.trim(&counts);
            } else {
                Self::send(cx, d, CollMsg::Trim { counts });
            }
        }
    }

    /// Collectives of `context` that `r`'s newest stored checkpoint holds
    /// (trim coordinator).
    fn stored_count(&self, r: Rank, context: ContextId) -> u64 {
        self.stored_counts
            .get(&r)
            .and_then(|c| c.get(&context))
            .copied()
            .unwrap_or(0)
    }

    /// World ranks of `r`'s communicator of `context`, as `r` reported it
    /// (trim coordinator); the world when it reported none.
    fn group_of(&self, r: Rank, context: ContextId, size: usize) -> Vec<Rank> {
        or_world(self.groups.get(&(r, context)), size)
    }

    /// The members of those of `contexts` that are this rank's
    /// sub-communicators.
    fn members_of(&self, contexts: impl Iterator<Item = ContextId>) -> Vec<(ContextId, Vec<Rank>)> {
        contexts
            .filter_map(|c| {
                let members = self.contexts.get(&c)?.members.as_ref()?;
                Some((c, members.clone()))
            })
            .collect()
    }

    /// `src`'s sub-communicators (trim coordinator). They come from the
    /// network: a group must hold `src` and only ranks of the job, or it is
    /// ignored (the context then counts as the world's, which only delays
    /// trims).
    fn learn_groups(&mut self, src: Rank, members: Vec<(ContextId, Vec<Rank>)>, size: usize) {
        for (context, group) in members {
            if group.contains(&src) && group.len() < size && group.iter().all(|&r| r < size) {
                self.groups.insert((src, context), group);
            }
        }
    }

    /// Results of `context` up to this number were dropped.
    fn trimmed_upto(&self, context: ContextId) -> u64 {
        self.contexts.get(&context).map_or(0, |l| l.trimmed)
    }

    /// Every held result, in context and number order.
    fn held(&self) -> impl Iterator<Item = (ContextId, &Held)> {
        (self.contexts.iter()).flat_map(|(&c, l)| l.results.iter().map(move |(_, r)| (c, r)))
    }

    /// A held result's bytes, read back from the spill if it is there.
    fn bytes_of(&self, context: ContextId, held: &Held) -> Result<Segments> {
        match held {
            Held::Memory(r) => Ok(r.clone()),
            Held::Spilled { offset, len } => self
                .p2p
                .read_spilled(SpillStream::Results(context), *offset, *len)
                .map(Segments::from),
        }
    }

    /// Past the log budget: move results to the spill, oldest first context
    /// by context, until half the budget is left (the point-to-point log
    /// spills its channels' payloads the same way at its next send). Empty
    /// results (barriers) stay: spilling them frees nothing.
    fn spill_results(&mut self) {
        if !self.p2p.spill_wanted() {
            return;
        }
        'contexts: for (&context, log) in self.contexts.iter_mut() {
            for (_, held) in log.results.0.iter_mut() {
                if self.p2p.spilled_enough() {
                    break 'contexts;
                }
                let Held::Memory(r) = held else { continue };
                if r.is_empty() {
                    continue;
                }
                match self.p2p.spill_record(SpillStream::Results(context), r) {
                    Some(offset) => {
                        *held = Held::Spilled {
                            offset,
                            len: r.len(),
                        }
                    }
                    None => break 'contexts,
                }
            }
        }
    }

    /// Completed collectives by kind.
    pub fn collective_counts(&self) -> Vec<(Collective, u64)> {
        Collective::ALL.into_iter().zip(self.per_kind).collect()
    }

    fn send(cx: &mut ProtocolCx<'_>, dest: Rank, msg: CollMsg) {
        cx.emit(Action::Transmit {
            dest,
            msg: Control::Collective(msg),
        });
    }

    /// Count every held result in the log counters, which a restore has
    /// just set to the channel logs alone (results kept before the restore
    /// are held still, and a later trim subtracts them).
    fn count_results(&mut self) {
        let (records, bytes) =
            (self.held()).fold((0, 0), |(n, b), (_, r)| (n + 1, b + r.resident()));
        self.p2p.count_restored(records, bytes);
    }

    /// Keep a result in `log` unless trimmed or held already (counted as a
    /// log record).
    fn keep_in(log: &mut ContextLog, p2p: &mut Pessimistic, index: u64, result: &Segments) {
        if index <= log.trimmed {
            return;
        }
        if log.results.insert(index, result) {
            p2p.count_logged(result.len());
        }
    }

    /// The members of the current collective other than this rank.
    fn others(cur: &Current, me: Rank, size: usize) -> impl Iterator<Item = Rank> + '_ {
        let world = cur.group.is_none().then_some(0..size);
        (cur.group.iter().flatten().copied())
            .chain(world.into_iter().flatten())
            .filter(move |&r| r != me)
    }

    /// Ask the members of the current collective (alive, or restored) for
    /// its result.
    fn request(&mut self, cx: &mut ProtocolCx<'_>) {
        let Some(cur) = &mut self.current else { return };
        if cur.requested {
            return;
        }
        cur.requested = true;
        let (context, index) = (cur.context, cur.index);
        let dests: Vec<Rank> = Self::others(cur, cx.rank, cx.size)
            .filter(|&r| !self.p2p.awaits(r))
            .collect();
        for d in dests {
            Self::send(cx, d, CollMsg::ResultRequest { context, index });
        }
    }

    /// A member of the collective this rank waits in is back from its
    /// recovery: it was skipped when the others were asked (a recovering
    /// rank is), and may be the only one left to have the result, or to
    /// complete it.
    fn ask_recovered(&mut self, member: Rank, cx: &mut ProtocolCx<'_>) {
        let Some(cur) = &self.current else { return };
        if cur.requested
            && !cur.from_log
            && Self::others(cur, cx.rank, cx.size).any(|r| r == member)
        {
            let (context, index) = (cur.context, cur.index);
            Self::send(cx, member, CollMsg::ResultRequest { context, index });
        }
    }

    /// Complete the current collective from `result` if it is the one.
    fn offer(&mut self, context: ContextId, index: u64, cx: &mut ProtocolCx<'_>) {
        let Some(cur) = &mut self.current else { return };
        if (cur.context, cur.index) != (context, index) || cur.from_log {
            return;
        }
        let Some(held) = (self.contexts.get(&context)).and_then(|l| l.results.get(index)) else {
            return;
        };
        let result = match self.bytes_of(context, held) {
            Ok(r) => r,
            Err(e) => return cx.emit(Action::Fail(e)),
        };
        if let Some(cur) = &mut self.current {
            cur.from_log = true;
        }
        cx.emit(Action::CollectiveResult {
            context,
            index,
            result,
        });
    }

    fn on_begin(
        &mut self,
        context: ContextId,
        index: u64,
        group: &[Rank],
        cx: &mut ProtocolCx<'_>,
    ) {
        let world = group.len() == cx.size;
        let log = self.contexts.entry(context).or_default();
        if !world && log.members.as_deref() != Some(group) {
            log.members = Some(group.to_vec());
        }
        let settled = log.settled;
        self.current = Some(Current {
            context,
            index,
            group: (!world).then(|| group.to_vec()),
            disturbed: false,
            from_log: false,
            caught_up: false,
            requested: false,
        });
        self.offer(context, index, cx);
        let from_log = self.current.as_ref().is_some_and(|c| c.from_log);
        if !from_log && self.asking && !settled {
            self.request(cx);
        }
    }

    fn on_end(
        &mut self,
        context: ContextId,
        index: u64,
        kind: Collective,
        result: Option<&Segments>,
        cx: &mut ProtocolCx<'_>,
    ) {
        self.per_kind[kind.index()] += 1;
        let Some(result) = result else { return };
        let cur = self.current.take();
        // Completed with every member at this collective now (a real
        // attempt, or caught up with a member that made one): a requester
        // told so may stop asking. A result taken from a log says nothing
        // about the other members, which may be far ahead and never take
        // part in this collective again.
        let with_members = cur
            .as_ref()
            .is_some_and(|c| c.caught_up || (!c.from_log && !c.disturbed));
        if cur.as_ref().is_some_and(|c| c.from_log) {
            self.p2p.count_collective_from_log();
        }
        let log = self.contexts.entry(context).or_default();
        log.settled |= with_members;
        log.done = index;
        Self::keep_in(log, &mut self.p2p, index, result);
        self.enforce_budget(cx);
        if let Some(requesters) = self.pending.remove(&(context, index)) {
            for r in requesters {
                Self::send(
                    cx,
                    r,
                    CollMsg::Results {
                        context,
                        from: index,
                        results: vec![result.clone()],
                        on_completion: with_members,
                    },
                );
            }
        }
        // Counters are reported at safe points and at the end (a report
        // per collective is a message to the launcher on the processes
        // backend: it cost 20% of CG W).
    }

    fn on_request(&mut self, src: Rank, context: ContextId, index: u64, cx: &mut ProtocolCx<'_>) {
        if index <= self.trimmed_upto(context) {
            // Not fatal here: the request may be stale (issue 33, defect
            // 7). The requester knows whether it still needs the result.
            Self::send(cx, src, CollMsg::Dropped { context, index });
            return;
        }
        // The results from `index` on, up to the first gap.
        let run: Result<Vec<Segments>> = match self.contexts.get(&context) {
            // Inclusive ranges: a number from the network near u64::MAX
            // ends the run instead of overflowing.
            Some(l) => (index..=u64::MAX)
                .zip(l.results.from(index))
                .take_while(|(next, (i, _))| i == next)
                .map(|(_, (_, b))| self.bytes_of(context, b))
                .collect(),
            _ => Ok(Vec::new()),
        };
        let run = match run {
            Ok(run) => run,
            Err(e) => return cx.emit(Action::Fail(e)),
        };
        if run.is_empty() {
            self.pending
                .entry((context, index))
                .or_default()
                .insert(src);
        } else {
            Self::send(
                cx,
                src,
                CollMsg::Results {
                    context,
                    from: index,
                    results: run,
                    on_completion: false,
                },
            );
        }
    }

    fn on_results(
        &mut self,
        context: ContextId,
        from: u64,
        results: Vec<Segments>,
        on_completion: bool,
        cx: &mut ProtocolCx<'_>,
    ) {
        if let Some(cur) = &mut self.current
            && on_completion
            && (cur.context, cur.index) == (context, from)
            && !cur.from_log
        {
            cur.caught_up = true;
        }
        let log = self.contexts.entry(context).or_default();
        for (i, b) in (from..=u64::MAX).zip(results) {
            if i > log.done {
                Self::keep_in(log, &mut self.p2p, i, &b);
            }
        }
        self.spill_results();
        if let Some((c, i)) = self.current.as_ref().map(|c| (c.context, c.index)) {
            self.offer(c, i, cx);
        }
    }

    /// Drop results up to these numbers (every rank's stored checkpoint
    /// passed them).
    fn trim(&mut self, upto: &[(ContextId, u64)]) {
        for &(context, upto) in upto {
            let log = self.contexts.entry(context).or_default();
            log.trimmed = log.trimmed.max(upto);
            let (records, bytes, spilled) = log.results.drop_upto(upto);
            self.p2p.count_dropped(records, bytes);
            if spilled {
                let floor = log.results.spill_floor();
                self.p2p
                    .release_spilled(SpillStream::Results(context), floor);
            }
        }
    }

    fn counts(&self) -> Vec<(ContextId, u64)> {
        (self.contexts.iter())
            .filter(|(_, l)| l.done > 0)
            .map(|(&c, l)| (c, l.done))
            .collect()
    }
}

impl Protocol for Ulml {
    fn name(&self) -> &'static str {
        "ulml"
    }

    over_p2p!();

    fn one_sided_as_messages(&self) -> bool {
        true // logged as messages (`engine/rma_messages.rs`)
    }

    fn logs_collective_results(&self) -> bool {
        true
    }

    fn state_size_hint(&self) -> usize {
        let (records, copied) = self.held().fold((0, 0), |(n, b), (_, r)| {
            let copied = match r {
                Held::Memory(r) => r.segments().iter().map(copied_len).sum::<usize>(),
                Held::Spilled { len, .. } => *len,
            };
            (n + 1, b + copied)
        });
        self.p2p.state_size_hint() + copied + records * 20 + 64
    }

    fn save_state(&self, piece: &mut PieceWriter<'_>) -> Result<()> {
        self.p2p.save_state(piece)?;
        // Spilled results are read back (a piece holds the log, 004 §2.2).
        let held: Vec<Segments> = (self.held())
            .map(|(c, r)| self.bytes_of(c, r))
            .collect::<Result<_>>()?;
        let blobs: Vec<&Bytes> = held.iter().flat_map(Segments::segments).collect();
        let mut counts = held.iter().map(|r| r.segments().len() as u32);
        let st = SavedState {
            done: self.counts(),
            per_kind: self.per_kind.to_vec(),
            results: (self.contexts.iter())
                .map(|(&c, l)| {
                    let list = (l.results.iter()).map(|(i, _)| (i, counts.next().unwrap_or(0)));
                    (c, list.collect())
                })
                .collect(),
            trimmed: (self.contexts.iter())
                .filter(|(_, l)| l.trimmed > 0)
                .map(|(&c, l)| (c, l.trimmed))
                .collect(),
            members: self.members_of(self.contexts.keys().copied()),
        };
        append_with_blobs(&st, &blobs, piece)
    }

    fn load_state(&mut self, state: Bytes) -> Result<()> {
        let rest = self.p2p.load_prefix(&state)?;
        let (st, blobs, _): (SavedState, _, _) = take_with_blobs(&rest)?;
        let listed: u64 = (st.results.iter().flat_map(|(_, l)| l))
            .map(|&(_, n)| u64::from(n))
            .sum();
        if listed != blobs.len() as u64 {
            return Err(Error::Codec {
                what: "a checkpoint piece's collective results".into(),
                detail: format!("{listed} segments listed, {} saved", blobs.len()),
            });
        }
        for log in self.contexts.values_mut() {
            log.done = 0;
        }
        for (context, done) in st.done {
            self.contexts.entry(context).or_default().done = done;
        }
        for (context, members) in st.members {
            self.contexts.entry(context).or_default().members = Some(members);
        }
        for (slot, n) in self.per_kind.iter_mut().zip(st.per_kind) {
            *slot = n;
        }
        // Results members sent while this rank recovered are kept too, and
        // a trim it heard of meanwhile (the coordinator re-sends its last
        // one to a dead rank) applies to the restored results.
        for (context, upto) in st.trimmed {
            let log = self.contexts.entry(context).or_default();
            log.trimmed = log.trimmed.max(upto);
        }
        let mut blobs = blobs.into_iter();
        for (context, list) in st.results {
            let log = self.contexts.entry(context).or_default();
            for (index, n) in list {
                let result: Segments = blobs.by_ref().take(n as usize).collect();
                if index > log.trimmed {
                    log.results.insert(index, &result);
                }
            }
        }
        self.count_results();
        self.spill_results();
        Ok(())
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::AppSend { msg } if msg.ssn == 0 => {
                // An unlogged collective message: nothing to log; a dead
                // destination gets it once its substitute asks.
                let dest = msg.envelope.dest;
                if self.p2p.awaits(dest) {
                    self.withheld.entry(dest).or_default().push(msg.clone());
                    cx.emit(Action::Withhold);
                }
            }
            Event::CollectiveBegin {
                context,
                index,
                group,
                ..
            } => self.on_begin(context, index, group, cx),
            Event::CollectiveEnd {
                context,
                index,
                kind,
                result,
            } => self.on_end(context, index, kind, result, cx),
            Event::Control {
                src,
                msg: Control::Collective(m),
            } => match m {
                CollMsg::ResultRequest { context, index } => {
                    self.on_request(src, context, index, cx)
                }
                CollMsg::Results {
                    context,
                    from,
                    results,
                    on_completion,
                } => self.on_results(context, from, results, on_completion, cx),
                CollMsg::Dropped { context, index } => {
                    let waiting = self
                        .current
                        .as_ref()
                        .is_some_and(|c| (c.context, c.index) == (context, index) && !c.from_log);
                    if waiting {
                        cx.emit(Action::Fail(Error::Unrecoverable(
                            format!(
                                "rank {} re-executes collective {index} of context {context}, \
                                 but every rank's stored checkpoint had passed it, so rank {src} \
                                 dropped its result: the checkpoint rank {} restored from is \
                                 older than the one it stored last",
                                cx.rank, cx.rank
                            )
                            .into(),
                        )));
                    }
                }
                CollMsg::Checkpointed { counts, members } => {
                    self.on_checkpointed(src, counts, members, cx)
                }
                CollMsg::Trim { counts } => {
                    self.pressed = false;
                    self.trim(&counts);
                }
                CollMsg::TrimPressure { members } => {
                    self.learn_groups(src, members, cx.size);
                    self.ask_laggards(cx)
                }
            },
            Event::Control {
                src,
                msg: Control::Log(LogMsg::Recovering { hsr }),
            } => {
                let was_awaited = self.p2p.awaits(src);
                self.p2p.handle(
                    Event::Control {
                        src,
                        msg: Control::Log(LogMsg::Recovering { hsr }),
                    },
                    cx,
                );
                if !self.p2p.awaits(src) {
                    for msg in self.withheld.remove(&src).unwrap_or_default() {
                        cx.emit(Action::Resend { msg });
                    }
                    if was_awaited {
                        self.ask_recovered(src, cx);
                    }
                }
            }
            Event::SafePoint { index } => {
                if let Some(generation) = self.p2p.safe_point_captures(index, cx) {
                    self.capturing.insert(generation, self.counts());
                }
            }
            Event::PieceStored { generation } => {
                self.p2p.handle(Event::PieceStored { generation }, cx);
                if let Some(counts) = self.capturing.remove(&generation) {
                    self.capturing.retain(|&g, _| g > generation);
                    let members = self.members_of(counts.iter().map(|&(c, _)| c));
                    if cx.rank == TRIM_COORDINATOR {
                        self.on_checkpointed(cx.rank, counts, members, cx);
                    } else {
                        Self::send(
                            cx,
                            TRIM_COORDINATOR,
                            CollMsg::Checkpointed { counts, members },
                        );
                    }
                }
            }
            Event::PeerFailed { epoch, dead } => {
                self.p2p.handle(Event::PeerFailed { epoch, dead }, cx);
                // A survivor asks only for the collective the failure
                // interrupted: at later ones, a member that takes a result
                // from a log still sends what the algorithm has it send, so
                // nothing a survivor waits for is missing.
                for set in self.pending.values_mut() {
                    set.retain(|r| !dead.contains(r));
                }
                // A replacement restores results its checkpoint held; tell
                // it how far its communicators' members' stored checkpoints
                // have passed.
                if cx.rank == TRIM_COORDINATOR {
                    let me = cx.rank;
                    for &d in dead.iter().filter(|&&d| d != me) {
                        let counts: Vec<(ContextId, u64)> = self
                            .told
                            .range((d, ContextId::MIN)..=(d, ContextId::MAX))
                            .map(|(&(_, c), &n)| (c, n))
                            .collect();
                        if !counts.is_empty() {
                            Self::send(cx, d, CollMsg::Trim { counts });
                        }
                    }
                }
                self.pending.retain(|_, s| !s.is_empty());
                if let Some(cur) = &mut self.current
                    && !cur.from_log
                    && Self::others(cur, cx.rank, cx.size).any(|r| dead.contains(&r))
                {
                    // Messages owed to this attempt may have died with the
                    // member: start again, and ask whoever completed it.
                    cur.disturbed = true;
                    cur.requested = false;
                    cx.emit(Action::CollectiveRestart);
                    self.request(cx);
                }
            }
            Event::Restored { generation } => {
                self.p2p.handle(Event::Restored { generation }, cx);
                if generation.is_none() {
                    // The channel logs' counters were zeroed.
                    self.count_results();
                }
                self.asking = true;
                for log in self.contexts.values_mut() {
                    log.settled = false;
                }
                // Requests that came before the restore: the restored
                // results may answer them (else they wait for this rank's
                // completion, as before).
                for ((context, index), requesters) in std::mem::take(&mut self.pending) {
                    for r in requesters {
                        self.on_request(r, context, index, cx);
                    }
                }
            }
            other => self.p2p.handle(other, cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::frame::Envelope;
    use crate::store::partner::PartnerStore;
    use crate::topology::Placement;
    use std::time::Duration;

    fn run(rank: Rank, p: &mut Ulml, ev: Event<'_>) -> Vec<Action> {
        let pl = Placement::block(4, 1).expect("valid");
        let store = PartnerStore::new(rank, &pl);
        let hsr = BTreeMap::new();
        let mut cx = ProtocolCx {
            rank,
            size: 4,
            placement: &pl,
            store: &store,
            clock: &|| Duration::ZERO,
            app_sent: 0,
            app_arrived: 0,
            hsr: &hsr,
            ssn_out: &hsr,
            rsn: 0,
            epoch: 0,
            after_gsync: false,
            actions: Vec::new(),
        };
        p.handle(ev, &mut cx);
        cx.actions
    }

    fn control(rank: Rank, p: &mut Ulml, src: Rank, m: CollMsg) -> Vec<Action> {
        run(
            rank,
            p,
            Event::Control {
                src,
                msg: Control::Collective(m),
            },
        )
    }

    const GROUP: [Rank; 4] = [0, 1, 2, 3];

    fn begin(rank: Rank, p: &mut Ulml, index: u64, kind: Collective) -> Vec<Action> {
        run(
            rank,
            p,
            Event::CollectiveBegin {
                context: 1,
                index,
                kind,
                group: &GROUP,
            },
        )
    }

    /// A substitute for `rank`, restored from generation 1.
    fn substitute(rank: Rank) -> Ulml {
        let mut p = Ulml::new(0, None);
        run(
            rank,
            &mut p,
            Event::Restored {
                generation: Some(1),
            },
        );
        p
    }

    fn complete(rank: Rank, p: &mut Ulml, index: u64, result: &Segments) -> Vec<Action> {
        let mut a = begin(rank, p, index, Collective::AllReduce);
        a.extend(run(
            rank,
            p,
            Event::CollectiveEnd {
                context: 1,
                index,
                kind: Collective::AllReduce,
                result: Some(result),
            },
        ));
        a
    }

    /// Numbers of the results `p` holds on context 1.
    fn held_numbers(p: &Ulml) -> Vec<u64> {
        p.contexts[&1].results.iter().map(|(i, _)| i).collect()
    }

    fn requests(a: &[Action]) -> Vec<Rank> {
        a.iter()
            .filter_map(|x| match x {
                Action::Transmit {
                    dest,
                    msg: Control::Collective(CollMsg::ResultRequest { .. }),
                } => Some(*dest),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn one_record_per_collective_by_reference_and_no_request_without_failure() {
        let mut p = Ulml::new(0, None);
        let r = Segments::from(vec![7u8; 16]);
        let a = complete(0, &mut p, 1, &r);
        assert!(requests(&a).is_empty());
        assert_eq!(
            match p.contexts[&1].results.get(1).expect("kept") {
                Held::Memory(r) => r.segments()[0].as_ptr(),
                Held::Spilled { .. } => std::ptr::null(),
            },
            r.segments()[0].as_ptr(),
            "logged by reference"
        );
        assert_eq!(
            p.collective_counts()[2],
            (Collective::AllReduce, 1),
            "per-kind counter"
        );
        // Counted once: one record of the result's 16 bytes.
        let a = run(0, &mut p, Event::Finish);
        assert_eq!(
            a,
            vec![Action::Record(crate::driver::Stat::Log {
                records: 1,
                bytes: 16,
                spared_bytes: 0,
                determinants: 0,
                resent: 0,
                collectives_from_log: 0,
                spilled_bytes: 0,
                log_records: 1,
                log_bytes: 16,
            })]
        );
    }

    /// A substitute asks at each collective until one completes by a real
    /// attempt: a member that completed it after the request came
    /// (`on_completion`) shows the substitute was taking part, and it stops
    /// asking; results of history (not `on_completion`) do not.
    #[test]
    fn a_substitute_stops_asking_once_a_member_completed_with_it() {
        for on_completion in [true, false] {
            let mut p = substitute(2);
            let a = begin(2, &mut p, 1, Collective::AllReduce);
            assert_eq!(requests(&a), vec![0, 1, 3]);
            let r = Segments::from(Bytes::from_static(b"r1"));
            control(
                2,
                &mut p,
                0,
                CollMsg::Results {
                    context: 1,
                    from: 1,
                    results: vec![r.clone()],
                    on_completion,
                },
            );
            run(
                2,
                &mut p,
                Event::CollectiveEnd {
                    context: 1,
                    index: 1,
                    kind: Collective::AllReduce,
                    result: Some(&r),
                },
            );
            let a = begin(2, &mut p, 2, Collective::AllReduce);
            if on_completion {
                assert!(requests(&a).is_empty(), "caught up: {a:?}");
            } else {
                assert_eq!(requests(&a), vec![0, 1, 3], "still re-executing history");
            }
        }
    }

    /// Results that reach a replacement before its restore stay held
    /// through it and stay counted, so that the trim that drops them later
    /// leaves the counters at what is held (they went below zero).
    #[test]
    fn results_held_across_a_restore_stay_counted() {
        fn log_now(a: &[Action]) -> (usize, usize) {
            a.iter()
                .find_map(|x| match x {
                    Action::Record(crate::driver::Stat::Log {
                        log_records,
                        log_bytes,
                        ..
                    }) => Some((*log_records, *log_bytes)),
                    _ => None,
                })
                .expect("a log record")
        }
        let mut p = Ulml::new(0, None);
        let results: Vec<Segments> = vec![b"r1".to_vec().into(), b"r-2".to_vec().into()];
        control(
            2,
            &mut p,
            0,
            CollMsg::Results {
                context: 1,
                from: 1,
                results,
                on_completion: false,
            },
        );
        run(2, &mut p, Event::Restored { generation: None });
        assert_eq!(log_now(&run(2, &mut p, Event::Finish)), (2, 5), "held");
        control(
            2,
            &mut p,
            0,
            CollMsg::Trim {
                counts: vec![(1, 2)],
            },
        );
        assert_eq!(log_now(&run(2, &mut p, Event::Finish)), (0, 0), "trimmed");
    }

    #[test]
    fn a_survivor_inside_a_collective_restarts_it_asks_and_completes_from_a_log_then_stops_asking()
    {
        let mut p = Ulml::new(0, None);
        begin(1, &mut p, 5, Collective::AllReduce);
        let a = run(
            1,
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[3],
            },
        );
        assert!(a.contains(&Action::CollectiveRestart));
        assert_eq!(requests(&a), vec![0, 2], "the dead rank is not asked");
        let r = Segments::from(Bytes::from_static(b"result"));
        let a = control(
            1,
            &mut p,
            0,
            CollMsg::Results {
                context: 1,
                from: 5,
                results: vec![r.clone()],
                on_completion: false,
            },
        );
        assert!(a.contains(&Action::CollectiveResult {
            context: 1,
            index: 5,
            result: r.clone()
        }));
        run(
            1,
            &mut p,
            Event::CollectiveEnd {
                context: 1,
                index: 5,
                kind: Collective::AllReduce,
                result: Some(&r),
            },
        );
        // The next collective is a plain real attempt: nothing asked.
        let a = complete(1, &mut p, 6, &r);
        assert!(requests(&a).is_empty());
    }

    #[test]
    fn a_member_answers_with_its_results_from_the_index_on_or_when_it_has_it() {
        let mut p = Ulml::new(0, None);
        for i in 1..=3u64 {
            complete(0, &mut p, i, &Segments::from(vec![i as u8]));
        }
        let a = control(
            0,
            &mut p,
            2,
            CollMsg::ResultRequest {
                context: 1,
                index: 2,
            },
        );
        assert_eq!(
            a,
            vec![Action::Transmit {
                dest: 2,
                msg: Control::Collective(CollMsg::Results {
                    context: 1,
                    from: 2,
                    results: vec![vec![2u8].into(), vec![3u8].into()],
                    on_completion: false,
                })
            }]
        );
        // Not reached yet: answered on completion.
        assert!(
            control(
                0,
                &mut p,
                2,
                CollMsg::ResultRequest {
                    context: 1,
                    index: 4
                }
            )
            .is_empty()
        );
        let a = complete(0, &mut p, 4, &Segments::from(vec![4u8]));
        assert!(a.contains(&Action::Transmit {
            dest: 2,
            msg: Control::Collective(CollMsg::Results {
                context: 1,
                from: 4,
                results: vec![vec![4u8].into()],
                on_completion: true,
            })
        }));
    }

    #[test]
    fn a_substitute_replays_collectives_from_received_results_without_asking_again() {
        let mut p = substitute(2);
        let a = begin(2, &mut p, 1, Collective::Barrier);
        assert_eq!(requests(&a), vec![0, 1, 3]);
        let results: Vec<Segments> = (1..=3u8).map(|i| Segments::from(vec![i])).collect();
        let a = control(
            2,
            &mut p,
            0,
            CollMsg::Results {
                context: 1,
                from: 1,
                results: results.clone(),
                on_completion: false,
            },
        );
        assert!(matches!(
            a.as_slice(),
            [Action::CollectiveResult { index: 1, .. }, ..]
        ));
        run(
            2,
            &mut p,
            Event::CollectiveEnd {
                context: 1,
                index: 1,
                kind: Collective::Barrier,
                result: Some(&results[0]),
            },
        );
        let a = begin(2, &mut p, 2, Collective::AllReduce);
        assert_eq!(
            a,
            vec![Action::CollectiveResult {
                context: 1,
                index: 2,
                result: results[1].clone()
            }],
            "taken from the received results, no request"
        );
    }

    #[test]
    fn unlogged_messages_to_a_dead_rank_wait_for_its_substitute() {
        let mut p = Ulml::new(0, None);
        run(
            0,
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[2],
            },
        );
        let m = AppMessage {
            envelope: Envelope {
                src: 0,
                dest: 2,
                context: 1,
                tag: 0,
            },
            ssn: 0,
            payload: Bytes::from_static(b"x"),
        };
        assert_eq!(
            run(0, &mut p, Event::AppSend { msg: &m }),
            vec![Action::Withhold]
        );
        let a = run(
            0,
            &mut p,
            Event::Control {
                src: 2,
                msg: Control::Log(LogMsg::Recovering { hsr: 0 }),
            },
        );
        assert!(a.contains(&Action::Resend { msg: m }));
    }

    #[test]
    fn results_are_dropped_once_every_stored_checkpoint_passed_them() {
        let mut p = Ulml::new(0, None);
        for i in 1..=4u64 {
            complete(0, &mut p, i, &Segments::from(vec![0u8; 10]));
        }
        for (r, n) in [(0, 3), (1, 2), (2, 3), (3, 4)] {
            control(
                0,
                &mut p,
                r,
                CollMsg::Checkpointed {
                    counts: vec![(1, n)],
                    members: Vec::new(),
                },
            );
        }
        assert_eq!(held_numbers(&p), vec![3, 4]);
        // Another rank drops what the coordinator says.
        let mut q = Ulml::new(0, None);
        for i in 1..=4u64 {
            complete(1, &mut q, i, &Segments::from(vec![0u8; 10]));
        }
        control(
            1,
            &mut q,
            0,
            CollMsg::Trim {
                counts: vec![(1, 3)],
            },
        );
        assert_eq!(held_numbers(&q), vec![4]);
        // A request behind the trim is answered, not fatal: it may be
        // stale (issue 33, defect 7).
        let a = control(
            0,
            &mut p,
            1,
            CollMsg::ResultRequest {
                context: 1,
                index: 2,
            },
        );
        let dropped = CollMsg::Dropped {
            context: 1,
            index: 2,
        };
        assert_eq!(
            a,
            vec![Action::Transmit {
                dest: 1,
                msg: Control::Collective(dropped.clone()),
            }]
        );
        // The requester completed collective 2 since it asked: stale.
        assert!(control(1, &mut q, 0, dropped.clone()).is_empty());
        // A requester still waiting in collective 2 restored a checkpoint
        // older than the one it stored last: that is unrecoverable.
        let mut r = substitute(1);
        begin(1, &mut r, 2, Collective::AllReduce);
        let a = control(1, &mut r, 0, dropped);
        assert!(
            matches!(a.as_slice(), [Action::Fail(Error::Unrecoverable(_))]),
            "{a:?}"
        );
    }

    /// A sub-communicator's results are dropped once its members' stored
    /// checkpoints passed them, and each rank is told its own part's
    /// minimum: the parts of a split share a context (a minimum over all
    /// ranks mixes them), and ranks outside a communicator never report it
    /// (a minimum over all ranks held it back for ever).
    #[test]
    fn each_rank_is_trimmed_by_its_own_communicators_members() {
        let mut p = Ulml::new(0, None);
        // Context 5: a split into {1, 2} and {0, 3}. Context 9: ranks 0, 1
        // and 2 (rank 3 is in none). Context 1: the world.
        let mut trims: BTreeMap<Rank, Vec<(ContextId, u64)>> = BTreeMap::new();
        for (r, counts, members) in [
            (3, vec![(1, 2), (5, 9)], vec![(5, vec![0, 3])]),
            (
                1,
                vec![(1, 2), (5, 7), (9, 5)],
                vec![(5, vec![1, 2]), (9, vec![0, 1, 2])],
            ),
            (
                2,
                vec![(1, 2), (5, 4), (9, 8)],
                vec![(5, vec![1, 2]), (9, vec![0, 1, 2])],
            ),
            (
                0,
                vec![(1, 3), (5, 6), (9, 6)],
                vec![(5, vec![0, 3]), (9, vec![0, 1, 2])],
            ),
        ] {
            let a = control(0, &mut p, r, CollMsg::Checkpointed { counts, members });
            for x in a {
                if let Action::Transmit {
                    dest,
                    msg: Control::Collective(CollMsg::Trim { counts }),
                } = x
                {
                    trims.entry(dest).or_default().extend(counts);
                }
            }
        }
        for t in trims.values_mut() {
            t.sort();
        }
        assert_eq!(trims[&1], vec![(1, 2), (5, 4), (9, 5)]);
        assert_eq!(trims[&2], vec![(1, 2), (5, 4), (9, 5)]);
        assert_eq!(trims[&3], vec![(1, 2), (5, 6)]);
        assert_eq!(trims.len(), 3, "the coordinator trims itself: {trims:?}");
        // A member's log pressure makes the coordinator ask the members
        // that lag on its communicator, not the other ranks.
        let mut q = Ulml::new(0, None);
        let sub = || vec![(5, vec![1, 2])];
        control(
            0,
            &mut q,
            1,
            CollMsg::Checkpointed {
                counts: vec![(5, 7)],
                members: sub(),
            },
        );
        let a = control(0, &mut q, 1, CollMsg::TrimPressure { members: sub() });
        let asked: Vec<Rank> = a
            .iter()
            .filter_map(|x| match x {
                Action::Transmit {
                    dest,
                    msg: Control::Log(LogMsg::CheckpointRequest),
                } => Some(*dest),
                _ => None,
            })
            .collect();
        assert_eq!(asked, vec![2]);
        // Groups come from the network: one with a rank out of range, of
        // every rank, or without its sender counts as the world.
        q.learn_groups(
            1,
            vec![(6, vec![1, 99]), (7, vec![0, 1, 2, 3]), (8, vec![2, 3])],
            4,
        );
        for c in [6, 7, 8] {
            assert_eq!(q.group_of(1, c, 4), vec![0, 1, 2, 3], "context {c}");
        }
    }

    /// A request that reaches a replacement before its restore is answered
    /// from the restored results (it waited for a completion of a
    /// collective the replacement had already passed).
    #[test]
    fn a_request_parked_before_the_restore_is_answered_from_the_restored_results() {
        let r = Segments::from(Bytes::from_static(b"result-1"));
        let mut before = Ulml::new(0, None);
        complete(2, &mut before, 1, &r);
        let pool = crate::store::pool::BufferPool::new();
        let mut piece = PieceWriter::new(&pool, Vec::new());
        before.save_state(&mut piece).expect("saved");
        let piece = piece.finish().to_bytes();
        let mut q = Ulml::new(0, None);
        let a = control(
            2,
            &mut q,
            0,
            CollMsg::ResultRequest {
                context: 1,
                index: 1,
            },
        );
        assert!(a.is_empty(), "nothing to answer yet: {a:?}");
        q.load_state(piece).expect("restored");
        let a = run(
            2,
            &mut q,
            Event::Restored {
                generation: Some(1),
            },
        );
        assert!(
            a.contains(&Action::Transmit {
                dest: 0,
                msg: Control::Collective(CollMsg::Results {
                    context: 1,
                    from: 1,
                    results: vec![r],
                    on_completion: false,
                }),
            }),
            "{a:?}"
        );
    }

    /// Logged collective results are shared with a checkpoint piece, not
    /// copied into it (the large ones), and restored in their contexts and
    /// indices, an all-gather's with its segments; a piece whose list of
    /// results and saved results disagree is refused.
    #[test]
    fn logged_results_are_shared_with_the_piece_and_restored() {
        let big = Bytes::from(vec![3u8; 2 * crate::store::piece::SHARED_SEGMENT_MIN]);
        let small = Bytes::from_static(b"result-2");
        let gathered: Segments = [Bytes::from_static(b"head"), big.clone(), small.clone()]
            .into_iter()
            .collect();
        let mut before = Ulml::new(0, None);
        complete(2, &mut before, 1, &big.clone().into());
        complete(2, &mut before, 2, &small.clone().into());
        complete(2, &mut before, 3, &gathered);
        let pool = crate::store::pool::BufferPool::new();
        let mut w = PieceWriter::new(&pool, Vec::new());
        before.save_state(&mut w).expect("saved");
        let piece = w.finish();
        assert!(
            (piece.segments().iter()).any(|s| s.as_ptr() == big.as_ptr() && s.len() == big.len()),
            "the large result was copied"
        );
        assert!(
            before.state_size_hint() < big.len(),
            "the hint counts a shared result"
        );
        let mut q = Ulml::new(0, None);
        q.load_state(piece.to_bytes()).expect("restored");
        assert_eq!(q.contexts[&1].results, before.contexts[&1].results);
        assert!(
            matches!(q.contexts[&1].results.get(3), Some(Held::Memory(r)) if r.segments().len() == 3),
            "the all-gather's segments"
        );

        // Cut inside the last result: refused.
        let flat = piece.to_bytes();
        let err = Ulml::new(0, None).load_state(flat.slice(..flat.len() - 1));
        assert!(matches!(err, Err(Error::Codec { .. })), "{err:?}");
        // Two results listed, one saved: refused.
        let mut w = PieceWriter::new(&pool, Vec::new());
        Pessimistic::new(0, None).save_state(&mut w).expect("saved");
        let st = SavedState {
            results: vec![(1, vec![(1, 1), (2, 1)])],
            ..SavedState::default()
        };
        append_with_blobs(&st, &[&small], &mut w).expect("saved");
        let err = Ulml::new(0, None).load_state(w.finish().to_bytes());
        assert!(matches!(err, Err(Error::Codec { .. })), "{err:?}");
    }

    /// A survivor whose collective lost members asks the members that are
    /// not recovering; one that comes back from its recovery is asked then
    /// (with every other member recovering, nobody was asked at all).
    #[test]
    fn a_member_back_from_recovery_is_asked_for_the_result() {
        let mut p = Ulml::new(0, None);
        begin(0, &mut p, 1, Collective::AllReduce);
        let a = run(
            0,
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[1, 2, 3],
            },
        );
        assert!(a.contains(&Action::CollectiveRestart), "{a:?}");
        assert!(requests(&a).is_empty(), "every member recovers: {a:?}");
        let a = run(
            0,
            &mut p,
            Event::Control {
                src: 2,
                msg: Control::Log(LogMsg::Recovering { hsr: 0 }),
            },
        );
        assert_eq!(requests(&a), vec![2]);
        // Not again, nor for a rank that was not recovering.
        let a = run(
            0,
            &mut p,
            Event::Control {
                src: 2,
                msg: Control::Log(LogMsg::Recovering { hsr: 0 }),
            },
        );
        assert!(requests(&a).is_empty(), "{a:?}");
    }

    /// The result log answers by number wherever a result was inserted:
    /// at the back (a rank's own, in order), or before results it holds
    /// (a member's, sent during a recovery), and keeps the first of two.
    #[test]
    fn the_result_log_is_ordered_by_number_wherever_results_come_in() {
        let r = |b: u8| Segments::from(vec![b; usize::from(b)]);
        let mut log = ResultLog::default();
        for i in [5, 6, 9] {
            assert!(log.insert(i, &r(i as u8)));
        }
        assert!(log.insert(2, &r(2)), "before all");
        assert!(log.insert(7, &r(7)), "in the middle");
        assert!(!log.insert(6, &r(1)), "a second result for 6");
        assert_eq!(log.get(6).map(Held::resident), Some(6), "the first kept");
        assert_eq!(log.get(8), None);
        assert_eq!(log.get(10), None);
        assert_eq!(log.get(1), None);
        let numbers = |it: &mut dyn Iterator<Item = (u64, &Held)>| -> Vec<u64> {
            it.map(|(i, _)| i).collect()
        };
        assert_eq!(numbers(&mut log.iter()), vec![2, 5, 6, 7, 9]);
        assert_eq!(numbers(&mut log.from(6)), vec![6, 7, 9]);
        assert_eq!(numbers(&mut log.from(3)), vec![5, 6, 7, 9]);
        assert_eq!(numbers(&mut log.from(10)), Vec::<u64>::new());
        assert_eq!(log.drop_upto(5), (2, 2 + 5, false));
        assert_eq!(numbers(&mut log.iter()), vec![6, 7, 9]);
        assert_eq!(log.drop_upto(u64::MAX), (3, 6 + 7 + 9, false));
        assert_eq!(log.get(9), None);
    }

    /// Collective numbers come from other ranks: the largest do not
    /// overflow (a trim to the end drops everything).
    #[test]
    fn collective_numbers_at_the_end_of_the_range_do_not_overflow() {
        let mut q = Ulml::new(0, None);
        for i in 1..=2u64 {
            complete(1, &mut q, i, &Segments::from(vec![0u8; 10]));
        }
        control(
            1,
            &mut q,
            2,
            CollMsg::Results {
                context: 1,
                from: u64::MAX,
                results: vec![vec![1u8].into(), vec![2u8].into()],
                on_completion: false,
            },
        );
        assert_eq!(held_numbers(&q), vec![1, 2, u64::MAX]);
        let a = control(
            1,
            &mut q,
            2,
            CollMsg::ResultRequest {
                context: 1,
                index: u64::MAX,
            },
        );
        assert!(
            a.iter().any(|x| matches!(
                x,
                Action::Transmit { dest: 2, msg: Control::Collective(CollMsg::Results { from: u64::MAX, results, .. }) }
                    if results.len() == 1
            )),
            "{a:?}"
        );
        control(
            1,
            &mut q,
            0,
            CollMsg::Trim {
                counts: vec![(1, u64::MAX)],
            },
        );
        assert!(q.contexts[&1].results.0.is_empty());
    }

    /// Past the log budget, logged collective results move to the spill
    /// like channel payloads (the budget bounds the memory a rank's payload
    /// log holds, issue 33 build 2): they are read back to answer a
    /// request and into a checkpoint piece, and a trim releases them.
    #[test]
    fn results_past_the_budget_are_spilled_read_back_and_released() {
        use crate::store::spill::FileSpill;
        let mut p = Ulml::new(0, Some(1000));
        p.p2p
            .set_spill(Box::new(FileSpill::new(std::env::temp_dir(), 1 << 20)));
        let result = |i: u64| Segments::from(vec![i as u8; 300]);
        for i in 1..=10 {
            complete(2, &mut p, i, &result(i));
        }
        let spilled = |p: &Ulml| -> Vec<u64> {
            (p.contexts[&1].results.iter())
                .filter(|(_, r)| matches!(r, Held::Spilled { .. }))
                .map(|(i, _)| i)
                .collect()
        };
        let resident: usize = p.held().map(|(_, r)| r.resident()).sum();
        assert!(resident <= 1000, "{resident} bytes in memory");
        assert!(
            spilled(&p).contains(&1),
            "the oldest went first: {:?}",
            spilled(&p)
        );
        assert_eq!(held_numbers(&p), (1..=10).collect::<Vec<_>>());
        // A request is answered with the bytes read back.
        let a = control(
            2,
            &mut p,
            0,
            CollMsg::ResultRequest {
                context: 1,
                index: 1,
            },
        );
        let sent = a.iter().find_map(|x| match x {
            Action::Transmit {
                dest: 0,
                msg:
                    Control::Collective(CollMsg::Results {
                        from: 1, results, ..
                    }),
            } => Some(results.clone()),
            _ => None,
        });
        assert_eq!(sent, Some((1..=10).map(result).collect::<Vec<_>>()));
        // A piece holds them all, in memory again once restored.
        let pool = crate::store::pool::BufferPool::new();
        let mut w = PieceWriter::new(&pool, Vec::new());
        p.save_state(&mut w).expect("saved");
        let mut q = Ulml::new(0, None);
        q.load_state(w.finish().to_bytes()).expect("restored");
        for i in 1..=10 {
            assert_eq!(
                q.contexts[&1].results.get(i),
                Some(&Held::Memory(result(i)))
            );
        }
        // A trim drops them and frees the spill for more.
        control(
            2,
            &mut p,
            0,
            CollMsg::Trim {
                counts: vec![(1, 10)],
            },
        );
        assert!(p.contexts[&1].results.0.is_empty());
        assert_eq!(
            p.p2p.spill_record(SpillStream::Results(1), &result(1)),
            Some(0)
        );
    }
}
