//! Pieces every in-process driver shares: window memory and RMA application,
//! rank incarnations, job statistics, and collecting the ranks' outcomes.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{Endpoint, LockType, RmaOp, RmaReply, Stat, WinId};
use crate::api::datatype::combine_bytes;
use crate::config::Config;
use crate::engine::Engine;
use crate::job::{BorrowedRankFn, JobStats, run_rank};
use crate::store::levels::{LevelSpec, MultiLevel};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// How long a waiting rank watches for a frame before it yields or blocks,
/// when it has a core of its own: a reply between ranks on one host is
/// usually this close, and waking a blocked thread takes several
/// microseconds.
pub(crate) const WAIT_SPIN: Duration = Duration::from_micros(20);

/// Yields in `poll` before it blocks (while `Yielding` allows them).
pub(crate) const SPIN_YIELDS: usize = 50;

/// How often a rank that would yield looks again at how many tasks the
/// host runs (`Yielding`).
const YIELD_RECHECK: Duration = Duration::from_millis(10);

/// Whether a waiting rank may yield its core (to the rank it waits for, or
/// to a rank process's own reading threads) before it sleeps.
///
/// With more ranks than cores a yield hands the core to that rank at once,
/// three times cheaper than sleeping and being woken (dht under
/// `pessimistic`, 3 rank processes on 2 cores: 5.3 s, against 13.4 s). But under
/// EEVDF (Linux 6.6 on) a yield forfeits the rest of the slice: beside
/// busy processes that are not ranks, a rank that yields while it waits
/// runs a few microseconds per round of their slices, and that job took
/// over 150 s beside four busy loops on 2 cores, against 30 s sleeping
/// (issue 33); on threads it never ended. So ranks yield unless the host ran more tasks than it has
/// ranks (and their launcher) at two looks in a row, as `/proc/loadavg`
/// counts them.
#[derive(Debug)]
pub(crate) struct Yielding {
    /// Runnable tasks on the host up to which yields are allowed.
    limit: usize,
    checked: Option<Instant>,
    /// Whether the last look found more tasks than `limit`.
    over: bool,
    allowed: bool,
}

impl Yielding {
    pub(crate) fn new(host_ranks: usize) -> Self {
        Self {
            limit: host_ranks + 2,
            checked: None,
            over: false,
            allowed: true,
        }
    }

    pub(crate) fn may(&mut self, now: Instant) -> bool {
        if self.checked.is_none_or(|t| now - t >= YIELD_RECHECK) {
            self.checked = Some(now);
            // Unknown (not Linux): as if alone. A count over the limit once
            // is often the ranks' own reading threads woken together (5% of
            // the looks of dht with 3 ranks on 2 cores); busy processes stay.
            let over = runnable_tasks().is_some_and(|n| n > self.limit);
            self.allowed = !(over && self.over);
            self.over = over;
        }
        self.allowed
    }
}

/// Tasks runnable on this host now: the fourth field of `/proc/loadavg`
/// ("running/total").
fn runnable_tasks() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/loadavg").ok()?;
    s.split_whitespace().nth(3)?.split('/').next()?.parse().ok()
}

/// Whether a host running `ranks` ranks has a core for each. Only then does
/// a waiting rank spin: with more ranks than cores, the rank it waits for
/// may need that very core (Open MPI's `mpi_yield_when_idle` is on when
/// oversubscribed for the same reason).
pub(crate) fn core_per_rank(ranks: usize) -> bool {
    ranks <= std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Lock a mutex, recovering the data if a rank thread panicked while holding
/// it (the panic itself is reported through the rank's outcome).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// ULFM respawn (002 §3.2) in an in-process driver: the frames a survivor
/// sends to a dead rank after it agreed to respawn it wait for the new
/// incarnation, instead of being lost with the old one. Survivors agree
/// before the first of them starts the incarnation, so another survivor's
/// first frame on the repaired communicator can leave before it exists.
/// Frames sent before a survivor's agreement are lost, as on a network
/// (the processes driver's `PeerState::Respawning` is the same rule).
pub(crate) struct RespawnHold<F> {
    /// (sender, dead rank) pairs whose frames are held.
    awaiting: HashSet<(Rank, Rank)>,
    /// Per dead rank: (sender, frame) in the order sent.
    held: HashMap<Rank, Vec<(Rank, F)>>,
}

impl<F> Default for RespawnHold<F> {
    fn default() -> Self {
        RespawnHold {
            awaiting: HashSet::new(),
            held: HashMap::new(),
        }
    }
}

impl<F> RespawnHold<F> {
    /// `from` agreed that the dead rank `dest` is started again.
    pub fn await_respawn(&mut self, from: Rank, dest: Rank) {
        self.awaiting.insert((from, dest));
    }

    /// Whether no frame can be held (the fast path of a send).
    pub fn is_empty(&self) -> bool {
        self.awaiting.is_empty()
    }

    /// Keep `frame` if `from` awaits `dest`'s new incarnation; otherwise
    /// hand it back to be sent.
    pub fn hold(&mut self, from: Rank, dest: Rank, frame: F) -> Option<F> {
        if self.awaiting.contains(&(from, dest)) {
            self.held.entry(dest).or_default().push((from, frame));
            None
        } else {
            Some(frame)
        }
    }

    /// `dest`'s new incarnation exists: its held frames, in the order sent.
    pub fn release(&mut self, dest: Rank) -> Vec<(Rank, F)> {
        self.awaiting.retain(|&(_, d)| d != dest);
        self.held.remove(&dest).unwrap_or_default()
    }
}

/// One incarnation of a rank.
#[derive(Debug)]
pub(crate) struct Slot {
    pub incarnation: u64,
    pub killed: AtomicBool,
}

impl Slot {
    pub fn new(incarnation: u64) -> Arc<Self> {
        Arc::new(Slot {
            incarnation,
            killed: AtomicBool::new(false),
        })
    }

    pub fn alive(&self) -> Result<()> {
        if self.killed.load(Ordering::SeqCst) {
            Err(Error::Killed)
        } else {
            Ok(())
        }
    }
}

/// The passive-target lock state of a window at its target (MPI's
/// LOCK/UNLOCK; origins retry a lock that is not granted).
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub(crate) struct LockState {
    /// Origins holding a shared lock.
    pub readers: usize,
    /// Whether an origin holds the exclusive lock.
    pub writer: bool,
}

impl LockState {
    /// Apply a TRY_LOCK or UNLOCK; `None` for any other operation.
    fn apply(&mut self, op: &RmaOp) -> Option<RmaReply> {
        match op {
            RmaOp::TryLock(kind) => {
                let granted = take_lock(&mut self.readers, &mut self.writer, *kind);
                Some(RmaReply::Granted(granted))
            }
            RmaOp::Unlock(kind) => {
                match kind {
                    LockType::Shared => self.readers = self.readers.saturating_sub(1),
                    LockType::Exclusive => self.writer = false,
                }
                Some(RmaReply::Done)
            }
            _ => None,
        }
    }
}

/// Take a passive-target lock of `kind` if the state (`readers` holding a
/// shared lock, `writer` the exclusive one) allows it. Shared by the
/// drivers' lock state and the engine's under message logging.
pub(crate) fn take_lock<R>(readers: &mut R, writer: &mut bool, kind: LockType) -> bool
where
    R: Copy + PartialEq + From<u8> + std::ops::AddAssign,
{
    match kind {
        LockType::Shared if !*writer => {
            *readers += R::from(1);
            true
        }
        LockType::Exclusive if !*writer && *readers == R::from(0) => {
            *writer = true;
            true
        }
        _ => false,
    }
}

/// Apply `op` to a window whose lock state and memory the caller holds
/// exclusively: a lock operation to the lock state, any other to the memory.
pub(crate) fn apply_rma(
    lock: &mut LockState,
    mem: &mut [u8],
    id: WinId,
    op: RmaOp,
) -> Result<RmaReply> {
    match lock.apply(&op) {
        Some(reply) => Ok(reply),
        None => apply_to_memory(mem, id, op),
    }
}

/// Where a window's memory lives. Every operation is atomic with respect
/// to every other on the same memory, whoever applies it.
pub(crate) trait WindowMemory: Send + Sync {
    /// Apply `op` (see [`apply_rma`]).
    fn apply(&self, id: WinId, op: RmaOp) -> Result<RmaReply>;
    /// Run `f` over the memory (its owner's local access).
    fn with_memory(&self, f: &mut dyn FnMut(&mut [u8]));
}

/// Window memory in this process's heap: the threads and sim backends, and
/// the processes backend when no shared-memory window could be made.
struct HeapMemory {
    len: usize,
    /// `u128` words keep the memory aligned for every element type.
    inner: Mutex<(Vec<u128>, LockState)>,
}

impl HeapMemory {
    fn new(bytes: usize, init: Option<&[u8]>) -> Self {
        let mut mem = vec![0u128; bytes.div_ceil(16)];
        if let Some(init) = init {
            let n = init.len().min(bytes);
            bytemuck::cast_slice_mut::<u128, u8>(&mut mem)[..n].copy_from_slice(&init[..n]);
        }
        HeapMemory {
            len: bytes,
            inner: Mutex::new((mem, LockState::default())),
        }
    }
}

impl WindowMemory for HeapMemory {
    fn apply(&self, id: WinId, op: RmaOp) -> Result<RmaReply> {
        let (mem, state) = &mut *lock(&self.inner);
        apply_rma(
            state,
            &mut bytemuck::cast_slice_mut::<u128, u8>(mem)[..self.len],
            id,
            op,
        )
    }

    fn with_memory(&self, f: &mut dyn FnMut(&mut [u8])) {
        let (mem, _) = &mut *lock(&self.inner);
        f(&mut bytemuck::cast_slice_mut::<u128, u8>(mem)[..self.len]);
    }
}

/// Window memory exposed by one rank incarnation in one epoch.
struct WinMem {
    epoch: u64,
    owner: Arc<Slot>,
    mem: Box<dyn WindowMemory>,
}

fn rma_error(id: WinId, detail: String) -> Error {
    Error::Rma { window: id, detail }
}

/// All window memory of a job, by `(window, rank)`. An origin applies its
/// operation directly under the memory's lock: the target's code does not run.
#[derive(Default)]
pub(crate) struct WindowRegistry {
    map: Mutex<HashMap<(WinId, Rank), Arc<WinMem>>>,
}

impl WindowRegistry {
    /// Expose `mem` (already initialised) as `rank`'s window `id`.
    fn expose_memory(
        &self,
        id: WinId,
        rank: Rank,
        owner: &Arc<Slot>,
        epoch: u64,
        mem: Box<dyn WindowMemory>,
    ) {
        let w = Arc::new(WinMem {
            epoch,
            owner: owner.clone(),
            mem,
        });
        lock(&self.map).insert((id, rank), w);
    }

    /// `Endpoint::window_expose` for the live incarnation `owner` of `rank`:
    /// `mem`, or heap memory of `bytes` bytes (from `init`) when `None`.
    pub fn expose_live(
        &self,
        (rank, owner): (Rank, &Arc<Slot>),
        id: WinId,
        epoch: u64,
        (bytes, init): (usize, Option<&[u8]>),
        mem: Option<Box<dyn WindowMemory>>,
    ) -> Result<()> {
        owner.alive()?;
        let mem = mem.unwrap_or_else(|| Box::new(HeapMemory::new(bytes, init)));
        self.expose_memory(id, rank, owner, epoch, mem);
        Ok(())
    }

    /// `Endpoint::with_local_window` for the live incarnation `owner`.
    pub fn with_local_live(
        &self,
        (rank, owner): (Rank, &Arc<Slot>),
        id: WinId,
        f: &mut dyn FnMut(&mut [u8]),
    ) -> Result<()> {
        owner.alive()?;
        self.with_local(id, rank, f)
    }

    pub fn withdraw(&self, id: WinId, rank: Rank, owner: &Arc<Slot>) {
        let mut ws = lock(&self.map);
        if ws
            .get(&(id, rank))
            .is_some_and(|w| Arc::ptr_eq(&w.owner, owner))
        {
            ws.remove(&(id, rank));
        }
    }

    /// A rank died: its window memory is lost.
    pub fn remove_rank(&self, rank: Rank) {
        lock(&self.map).retain(|&(_, r), _| r != rank);
    }

    fn get(&self, id: WinId, rank: Rank) -> Option<Arc<WinMem>> {
        lock(&self.map).get(&(id, rank)).cloned()
    }

    pub fn rma(&self, epoch: u64, target: Rank, id: WinId, op: RmaOp) -> Result<RmaReply> {
        let w = self
            .get(id, target)
            .filter(|w| w.epoch == epoch && !w.owner.killed.load(Ordering::SeqCst))
            .ok_or_else(|| {
                Error::Driver(format!(
                    "rank {target} exposes no window {id} in epoch {epoch}"
                ))
            })?;
        w.mem.apply(id, op)
    }

    pub fn with_local(&self, id: WinId, rank: Rank, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        let w = self
            .get(id, rank)
            .ok_or_else(|| rma_error(id, "not exposed on this rank".into()))?;
        w.mem.with_memory(f);
        Ok(())
    }
}

/// Apply a communication action (PUT/GET family) to window memory `mem`
/// (the target's, under its lock). Lock operations touch no memory and
/// return `Done`: the caller keeps the lock state.
pub(crate) fn apply_to_memory(mem: &mut [u8], id: WinId, op: RmaOp) -> Result<RmaReply> {
    let len = mem.len();
    let range = |offset: usize, n: usize| -> Result<std::ops::Range<usize>> {
        match offset.checked_add(n) {
            Some(end) if end <= len => Ok(offset..end),
            _ => Err(rma_error(
                id,
                format!("access [{offset}, {offset}+{n}) outside the {len}-byte target window"),
            )),
        }
    };
    match op {
        RmaOp::Put { offset, data } => {
            mem[range(offset, data.len())?].copy_from_slice(&data);
            Ok(RmaReply::Done)
        }
        RmaOp::Get { offset, len } => Ok(RmaReply::Data(Bytes::copy_from_slice(
            &mem[range(offset, len)?],
        ))),
        RmaOp::Accumulate {
            offset,
            data,
            dtype,
            op,
            fetch,
        } => {
            if !data.len().is_multiple_of(dtype.size()) {
                return Err(rma_error(
                    id,
                    "operand is not a whole number of elements".into(),
                ));
            }
            let r = range(offset, data.len())?;
            let old = fetch.then(|| Bytes::copy_from_slice(&mem[r.clone()]));
            combine_bytes(dtype, op, &mut mem[r], &data);
            Ok(old.map_or(RmaReply::Done, RmaReply::Data))
        }
        RmaOp::CompareAndSwap {
            offset,
            compare,
            swap,
            dtype,
        } => {
            if compare.len() != dtype.size() || swap.len() != dtype.size() {
                return Err(rma_error(id, "compare_and_swap takes one element".into()));
            }
            let r = range(offset, compare.len())?;
            let old = Bytes::copy_from_slice(&mem[r.clone()]);
            if old == compare {
                mem[r].copy_from_slice(&swap);
            }
            Ok(RmaReply::Data(old))
        }
        RmaOp::TryLock(_) | RmaOp::Unlock(_) => Ok(RmaReply::Done),
    }
}

/// Job statistics as the driver aggregates them.
pub(crate) struct StatsBook {
    pub stats: JobStats,
    resumed: HashMap<u64, usize>,
    recovery_open: Option<Duration>,
    protocol: crate::ProtocolKind,
    sets: crate::protocol::correlated::SetRule,
    placement: Option<crate::topology::Placement>,
    /// Ranks rolling back in the open recovery (every rank without logs,
    /// the killed ones under message logging, their sets under
    /// `correlated`): it ends when they all resumed.
    rolling_back: std::collections::BTreeSet<Rank>,
    /// `Stat::Usage` reports so far and their summed peak resident sets.
    memory_reports: u64,
    peak_rss_sum: u64,
    /// Rank 0's snapshot latencies, one per committed generation.
    latencies: Vec<f64>,
    /// The wave's stamps, per rank, until every rank's are in.
    cut_logs: std::collections::BTreeMap<Rank, crate::cuts::CutLog>,
    /// Under message logging, per rank: the holders of its newest stored
    /// checkpoint that have not died since it was stored (`None`: none
    /// stored, or every holder died). A rank restarting from the
    /// beginning while this is `Some` had a checkpoint to restore
    /// (`JobStats::needless_restarts`).
    protected: Vec<Option<std::collections::BTreeSet<Rank>>>,
    /// Every failure event so far: its world epoch and victims.
    deaths: Vec<(u64, Vec<Rank>)>,
}

impl StatsBook {
    /// Collect the ranks' timelines too (`Config::trace`), in virtual time
    /// on the simulator.
    pub fn traced(mut self, on: bool, virtual_time: bool) -> Self {
        let ranks = self.protected.len();
        self.stats.trace = on.then(|| crate::trace::Trace::new(ranks, virtual_time));
        self
    }
}

impl StatsBook {
    /// Statistics of a job under `protocol` on `ranks` ranks over `nodes`
    /// failure domains, correlated sets formed by `sets`.
    pub fn new(
        protocol: crate::ProtocolKind,
        sets: crate::protocol::correlated::SetRule,
        ranks: usize,
        nodes: usize,
    ) -> Self {
        StatsBook {
            stats: JobStats::default(),
            resumed: HashMap::new(),
            recovery_open: None,
            protocol,
            sets,
            placement: crate::topology::Placement::block(ranks, nodes).ok(),
            rolling_back: std::collections::BTreeSet::new(),
            memory_reports: 0,
            peak_rss_sum: 0,
            latencies: Vec::new(),
            cut_logs: Default::default(),
            protected: vec![None; ranks],
            deaths: Vec::new(),
        }
    }

    /// The failure event `epoch` killed `victims`.
    pub fn on_kill(&mut self, epoch: u64, victims: &[Rank], now: Duration) {
        self.deaths.push((epoch, victims.to_vec()));
        self.stats.failures += 1;
        self.stats.ranks_killed += victims.len() as u64;
        match &self.placement {
            Some(pl) => self
                .rolling_back
                .extend(self.protocol.rolled_back_with(victims, self.sets, pl)),
            None => self.rolling_back.extend(victims),
        }
        if self.recovery_open.is_none() {
            self.recovery_open = Some(now);
        }
        if let Some(t) = &mut self.stats.trace {
            t.kill(victims, now);
        }
        for holders in self.protected.iter_mut() {
            if let Some(h) = holders {
                h.retain(|r| !victims.contains(r));
                if h.is_empty() {
                    *holders = None;
                }
            }
        }
    }

    /// `current_epoch` is the world epoch now: a recovery ends when every
    /// rank resumed in the newest epoch.
    pub fn record(
        &mut self,
        rank: Rank,
        size: usize,
        stat: Stat,
        now: Duration,
        current_epoch: u64,
    ) {
        let st = &mut self.stats;
        match stat {
            Stat::Checkpoint {
                generation,
                bytes,
                seconds,
                latency_s,
            } => {
                st.checkpoint_bytes += bytes as u64;
                st.checkpoint_pieces += 1;
                st.checkpoint_s = st.checkpoint_s.max(seconds);
                st.checkpoint_s_total += seconds / size as f64;
                if rank == 0 {
                    st.checkpoints += 1;
                    st.last_generation = Some(generation);
                    self.latencies.push(latency_s);
                    let mut sorted = self.latencies.clone();
                    sorted.sort_by(f64::total_cmp);
                    st.snapshot_latency_s = sorted[sorted.len() / 2];
                }
            }
            Stat::Resumed {
                epoch,
                rolled_back,
                from_scratch,
            } => {
                if rolled_back {
                    st.ranks_rolled_back += 1;
                }
                if from_scratch {
                    st.ranks_restarted_from_scratch += 1;
                    if self.protected.get(rank).is_some_and(Option::is_some) {
                        st.needless_restarts += 1;
                    }
                }
                let n = self.resumed.entry(epoch).or_insert(0);
                *n += 1;
                let expected = self.rolling_back.len().min(size);
                if *n >= expected
                    && epoch == current_epoch
                    && let Some(t0) = self.recovery_open.take()
                {
                    st.recovery_s += (now - t0).as_secs_f64();
                    self.rolling_back.clear();
                }
            }
            Stat::Log {
                records,
                bytes,
                spared_bytes,
                determinants,
                resent,
                collectives_from_log,
                spilled_bytes,
                log_records,
                log_bytes,
            } => {
                st.collectives_from_log += collectives_from_log;
                st.spilled_log_bytes += spilled_bytes;
                st.spared_log_bytes += spared_bytes;
                st.log_records += records;
                st.log_bytes += bytes;
                st.determinants += determinants;
                st.messages_resent += resent;
                st.peak_log_records = st.peak_log_records.max(log_records as u64);
                st.peak_log_bytes = st.peak_log_bytes.max(log_bytes as u64);
            }
            Stat::SetSync { seconds, set_size } => {
                st.set_sync_s =
                    (st.set_sync_s * st.set_syncs as f64 + seconds) / (st.set_syncs + 1) as f64;
                st.set_syncs += 1;
                st.set_sync_max_s = st.set_sync_max_s.max(seconds);
                st.set_size = st.set_size.max(set_size as u64);
            }
            Stat::Snapshot {
                markers_sent,
                channel_messages,
                channel_bytes,
                held,
            } => {
                st.markers += markers_sent;
                st.channel_messages += channel_messages;
                st.channel_bytes += channel_bytes;
                st.held_messages += held;
            }
            Stat::Wave(counts) => st.wave.add(&counts),
            Stat::Cuts(log) => {
                self.cut_logs.insert(rank, log);
                if self.cut_logs.len() == size {
                    let logs: Vec<_> = std::mem::take(&mut self.cut_logs).into_values().collect();
                    st.cuts = Some(crate::cuts::check(&logs));
                }
            }
            Stat::Interval {
                every,
                tau_s,
                cost_s,
            } => {
                st.daly_every = Some(every);
                st.daly_interval_s = Some(tau_s);
                st.daly_cost_s = Some(cost_s);
            }
            Stat::Accesses {
                logged,
                logged_bytes,
                replayed,
                skipped,
                held,
                demanded,
                fallbacks,
                log_bytes,
                gets_logged,
                get_bytes,
                gets_replayed,
            } => {
                st.gets_logged += gets_logged;
                st.get_log_bytes += get_bytes;
                st.gets_replayed += gets_replayed;
                st.demand_checkpoints += demanded;
                st.accesses_held += held;
                st.accesses_logged += logged;
                st.access_log_bytes += logged_bytes;
                st.accesses_replayed += replayed;
                st.accesses_skipped += skipped;
                st.access_fallbacks += fallbacks;
                st.peak_access_log_bytes = st.peak_access_log_bytes.max(log_bytes as u64);
            }
            Stat::Coordination { scheme, abandoned } => {
                use crate::protocol::coordinated::CheckpointScheme;
                match (scheme, abandoned) {
                    (_, true) => st.abandoned_cuts += 1,
                    (CheckpointScheme::Gsync, false) => st.gsync_checkpoints += 1,
                    _ => st.locks_checkpoints += 1,
                }
            }
            Stat::PieceStored { epoch, .. } => {
                if let (Some(pl), Some(p)) = (&self.placement, self.protected.get_mut(rank)) {
                    // A holder killed in a failure event the rank had not
                    // seen when it reported died after storing the piece,
                    // and its kill may have been counted before this
                    // report arrived.
                    let died_since =
                        |h: &Rank| (self.deaths.iter()).any(|(e, v)| *e > epoch && v.contains(h));
                    let holders: std::collections::BTreeSet<Rank> = pl
                        .partner(rank)
                        .into_iter()
                        .chain(pl.second_partner(rank))
                        .filter(|h| !died_since(h))
                        .collect();
                    *p = (!holders.is_empty()).then_some(holders);
                }
            }
            Stat::SendLogging { seconds } => {
                st.send_logging_s_total += seconds / size as f64;
            }
            Stat::Trace(events) => {
                if let Some(t) = &mut st.trace {
                    t.extend(rank, events);
                }
            }
            Stat::Usage {
                peak_rss_bytes,
                minor_faults,
                user_cpu_s,
                system_cpu_s,
            } => {
                self.memory_reports += 1;
                self.peak_rss_sum += peak_rss_bytes;
                st.peak_rss_bytes = st.peak_rss_bytes.max(Some(peak_rss_bytes));
                st.mean_peak_rss_bytes = Some(self.peak_rss_sum / self.memory_reports);
                *st.minor_faults.get_or_insert(0) += minor_faults;
                *st.user_cpu_s.get_or_insert(0.0) += user_cpu_s;
                *st.system_cpu_s.get_or_insert(0.0) += system_cpu_s;
            }
        }
    }
}

/// A progress bar on stderr (rank 0's reported progress), when `enabled`
/// and stderr is a terminal.
pub(crate) fn progress_bar(enabled: bool) -> Option<indicatif::ProgressBar> {
    use std::io::IsTerminal;
    (enabled && std::io::stderr().is_terminal()).then(|| {
        let pb = indicatif::ProgressBar::new(1000);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {percent}% {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    })
}

/// Build the engine of one rank incarnation and run the rank function on it,
/// turning a panic into an error outcome.
pub(crate) fn rank_body<T>(
    ep: Box<dyn Endpoint>,
    cfg: &Config,
    placement: Placement,
    f: &BorrowedRankFn<'_, T>,
) -> Result<T> {
    let rank = ep.rank();
    let engine = new_engine(ep, cfg, placement);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_rank(engine, f))).unwrap_or_else(
        |p| {
            let msg = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(Error::App(format!("rank {rank} panicked: {msg}")))
        },
    )
}

/// The engine of one rank incarnation, on the heap. Not inlined: the
/// engine is built by value (kilobytes), and a frame that held it would
/// stay under the rank function for the whole run (3.6 KiB of every
/// simulated rank's coroutine stack, issue 38).
#[inline(never)]
fn new_engine(ep: Box<dyn Endpoint>, cfg: &Config, placement: Placement) -> Rc<RefCell<Engine>> {
    let rank = ep.rank();
    let storage: &[LevelSpec] = &cfg.storage;
    let mut engine = Engine::new(
        ep,
        cfg.protocol.build(
            crate::protocol::BuildOptions {
                checkpoint_every: cfg.checkpoint_every,
                mtbf_s: cfg.mtbf.map(|d| d.as_secs_f64()),
                log_budget: cfg.log_budget,
                sets: cfg.sets,
                wave: cfg
                    .get_fix
                    .map(|fix| crate::protocol::chandy_lamport::WaveConfig {
                        fix,
                        check: cfg.check_cuts,
                        interval: cfg.wave_interval,
                        last_safe_point: cfg.iterations,
                    }),
                scheme: cfg.checkpoint_scheme,
                rma_log: cfg.rma_log,
            },
            cfg.log_budget.map(|budget| {
                let dir = cfg.spill_dir();
                let limit = crate::store::spill::FileSpill::limit_for(&dir, budget);
                Box::new(crate::store::spill::FileSpill::new(dir, limit))
                    as Box<dyn crate::store::spill::LogSpill>
            }),
            &placement,
        ),
        Box::new({
            let store = MultiLevel::new(
                rank,
                &placement,
                storage,
                cfg.restart.as_deref().zip(cfg.restart_generation),
            );
            // A logging protocol restores one rank from its own pieces
            // alone: keep two copies, so a failure of the partner during
            // the replacement's recovery leaves one.
            if cfg.protocol.logs_messages() {
                store.with_second_partner_copy()
            } else {
                store
            }
        }),
        placement,
    );
    if cfg.restart.is_some() {
        engine.start_in_recovery();
    }
    if let Some(threshold) = cfg.trace {
        engine.record_trace(threshold);
    }
    if cfg.failure_handling == crate::config::FailureHandling::Return {
        engine.report_failures();
    }
    Rc::new(RefCell::new(engine))
}

/// The final outcome of every rank.
pub(crate) struct Finals<T> {
    finals: Vec<Option<Result<T>>>,
    /// The abort (the rank whose error ended the job, and the error), once
    /// the job is aborted.
    aborted: Option<(Rank, String)>,
    /// Ranks that died for good (not replaced).
    dead: Vec<bool>,
    /// Failures are reported to the program (ULFM): a rank that died and
    /// was not respawned has no value, and the job goes on without it.
    reporting: bool,
}

/// What the driver must do after an exit.
pub(crate) enum ExitAction {
    /// Nothing more.
    None,
    /// Abort the job: tell every rank that `rank` failed with `reason`.
    Abort { rank: Rank, reason: String },
}

impl<T> Finals<T> {
    pub fn new(size: usize) -> Self {
        Finals {
            finals: (0..size).map(|_| None).collect(),
            aborted: None,
            dead: vec![false; size],
            reporting: false,
        }
    }

    /// Under ULFM (`FailureHandling::Return`): ranks that die without a
    /// replacement are left out of the job's values instead of failing it.
    pub fn reporting_failures(mut self, on: bool) -> Self {
        self.set_reporting(on);
        self
    }

    /// See [`Finals::reporting_failures`].
    pub fn set_reporting(&mut self, on: bool) {
        self.reporting = on;
    }

    /// A new incarnation of `rank` was started (ULFM respawn): its earlier
    /// death is not final.
    pub fn reopen(&mut self, rank: Rank) {
        if let Some(f) = self.finals.get_mut(rank) {
            *f = None;
        }
        if let Some(d) = self.dead.get_mut(rank) {
            *d = false;
        }
    }

    pub fn done(&self) -> bool {
        self.finals.iter().all(Option::is_some)
    }

    /// A rank incarnation exited. `superseded`: a newer incarnation of this
    /// rank exists (the protocol replaced it), so a killed one is not final.
    pub fn on_exit(
        &mut self,
        rank: Rank,
        outcome: Result<T>,
        superseded: bool,
        protocol: &str,
    ) -> ExitAction {
        let killed = matches!(outcome, Err(Error::Killed));
        if killed && superseded {
            return ExitAction::None;
        }
        let mut action = ExitAction::None;
        if let Err(e) = &outcome
            && !killed
            && self.aborted.is_none()
            && !matches!(e, Error::ProcessFailed { .. } | Error::Aborted { .. })
        {
            // An application error ends the job: everyone must be told.
            self.aborted = Some((rank, e.to_string()));
            action = ExitAction::Abort {
                rank,
                reason: e.to_string(),
            };
        }
        // A rank that dies once the job is aborted is not replaced; its
        // death is a consequence, not the job's cause (which `finish`
        // reports: an unrecoverable rank makes the job start again).
        let outcome = match (&self.aborted, outcome) {
            (Some((r, why)), Err(Error::Killed)) => Err(Error::Aborted {
                rank: *r,
                reason: why.clone(),
            }),
            (_, o) => o,
        };
        if let Some(d) = self.dead.get_mut(rank) {
            *d = killed;
        }
        if let Some(slot) = self.finals.get_mut(rank) {
            *slot = Some(outcome.map_err(|e| match e {
                Error::Killed => Error::ProcessFailed {
                    ranks: vec![rank],
                    protocol: protocol.into(),
                    why: "the rank died".into(),
                },
                e => e,
            }));
        }
        action
    }

    /// Every rank's value, or the root-cause error.
    pub fn finish(self) -> Result<Vec<T>> {
        let mut results = Vec::with_capacity(self.finals.len());
        let mut first_err: Option<Error> = None;
        let reporting = self.reporting;
        let finals = self
            .finals
            .into_iter()
            .zip(self.dead)
            .filter_map(|(f, dead)| if reporting && dead { None } else { f });
        for r in finals {
            match r {
                Ok(v) => results.push(v),
                Err(e) => {
                    // Prefer the root cause over the errors it caused elsewhere.
                    let better = match (&first_err, &e) {
                        (None, _) => true,
                        (Some(Error::Aborted { .. }), x) => !matches!(x, Error::Aborted { .. }),
                        _ => false,
                    };
                    if better {
                        first_err = Some(e);
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(results),
        }
    }
}

/// This process's resource use so far (`getrusage(RUSAGE_SELF)`), as a
/// [`Stat::Usage`]; `None` if the call fails.
#[allow(unsafe_code)]
pub(crate) fn process_usage() -> Option<Stat> {
    // SAFETY: `getrusage` writes one `rusage` into the zeroed struct we pass.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        (libc::getrusage(libc::RUSAGE_SELF, &mut u) == 0).then_some(u)
    }?;
    let seconds = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    Some(Stat::Usage {
        // Linux reports kilobytes.
        peak_rss_bytes: u64::try_from(usage.ru_maxrss).ok()? * 1024,
        minor_faults: u64::try_from(usage.ru_minflt).ok()?,
        user_cpu_s: seconds(usage.ru_utime),
        system_cpu_s: seconds(usage.ru_stime),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProtocolKind;
    use crate::protocol::correlated::SetRule;

    fn from_scratch(book: &mut StatsBook, rank: Rank, epoch: u64) {
        let stat = Stat::Resumed {
            epoch,
            rolled_back: true,
            from_scratch: true,
        };
        book.record(rank, 4, stat, Duration::ZERO, epoch);
    }

    /// A restart from the beginning is needless only while a holder of the
    /// rank's stored checkpoint lives; a report that reaches the book after
    /// its holders' deaths (processes: another connection) does not bring
    /// them back to life.
    #[test]
    fn a_late_piece_stored_report_does_not_count_dead_holders() {
        let pl = Placement::block(4, 2).expect("valid");
        let holders: Vec<Rank> = pl
            .partner(0)
            .into_iter()
            .chain(pl.second_partner(0))
            .collect();
        let stored = |epoch| Stat::PieceStored {
            generation: 1,
            epoch,
        };
        // In order: stored at epoch 0, then the holders die at epoch 1.
        let mut book = StatsBook::new(ProtocolKind::Pessimistic, SetRule::default(), 4, 2);
        book.record(0, 4, stored(0), Duration::ZERO, 0);
        book.on_kill(1, &holders, Duration::ZERO);
        from_scratch(&mut book, 0, 1);
        assert_eq!(book.stats.needless_restarts, 0);
        // The same report arriving after the deaths.
        let mut book = StatsBook::new(ProtocolKind::Pessimistic, SetRule::default(), 4, 2);
        book.on_kill(1, &holders, Duration::ZERO);
        book.record(0, 4, stored(0), Duration::ZERO, 1);
        from_scratch(&mut book, 0, 1);
        assert_eq!(book.stats.needless_restarts, 0);
        // Stored again after the deaths (re-provisioned holders): a
        // restart from the beginning would be needless.
        book.record(0, 4, stored(1), Duration::ZERO, 1);
        from_scratch(&mut book, 0, 1);
        assert_eq!(book.stats.needless_restarts, 1);
    }
}
