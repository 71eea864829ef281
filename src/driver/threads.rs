//! The `threads` backend: every rank a thread of one process.
//!
//! Frames go through one unbounded crossbeam channel per rank; payloads are
//! [`bytes::Bytes`], so a send moves a reference count, never the data. Window
//! memory lives in a registry shared by the threads, and an origin applies
//! its RMA operation to the target's memory directly, under that memory's
//! lock: the target's code does not run (as with RDMA).
//!
//! Failures are real (DESIGN principle 6): a killed rank's thread unwinds and
//! drops its engine (its state, unexpected messages, and the checkpoint pieces
//! it held for others); its inbox and window memory are discarded. The
//! supervisor (the calling thread) plays the failure detector: it tells the
//! survivors, and starts a replacement with the dead rank's number when the
//! protocol wants one.

use std::collections::HashMap;
use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};

use super::{Endpoint, LockType, RmaOp, RmaReply, Stat, WinId};
use crate::api::datatype::combine_bytes;
use crate::config::Config;
use crate::engine::Engine;
use crate::engine::frame::{Frame, Incoming};
use crate::fault::{FaultPlan, FaultPoint};
use crate::job::{JobStats, RankFn, run_rank};
use crate::store::partner::PartnerStore;
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// `None` wakes a rank blocked in `poll` (to notice it was killed).
type Mail = Option<Incoming>;

struct Slot {
    incarnation: u64,
    killed: AtomicBool,
}

#[derive(Default)]
struct LockState {
    readers: usize,
    writer: bool,
}

struct WinMem {
    epoch: u64,
    owner: Arc<Slot>,
    len: usize,
    mem: Mutex<Vec<u64>>,
    lock: Mutex<LockState>,
}

struct KillState {
    epoch: u64,
    plan: FaultPlan,
}

enum SupMsg {
    Spawn {
        rank: Rank,
        slot: Arc<Slot>,
        inbox: Receiver<Mail>,
        epoch: u64,
    },
    Exited {
        rank: Rank,
        incarnation: u64,
        outcome: Box<dyn std::any::Any + Send>,
    },
}

struct World {
    size: usize,
    placement: Placement,
    replaces: bool,
    inboxes: RwLock<Vec<Sender<Mail>>>,
    slots: Mutex<Vec<Arc<Slot>>>,
    windows: Mutex<HashMap<(WinId, Rank), Arc<WinMem>>>,
    kills: Mutex<KillState>,
    armed: AtomicBool,
    stats: Mutex<JobStats>,
    resumed: Mutex<HashMap<u64, usize>>,
    recovery_open: Mutex<Option<Duration>>,
    start: Instant,
    sup: Sender<SupMsg>,
    progress: AtomicU64,
}

/// Lock a mutex, recovering the data if a rank thread panicked while holding
/// it (the panic itself is reported through the rank's outcome).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl World {
    /// Kill `victims` at once (called with the kill lock held).
    fn kill(&self, ks: &mut KillState, victims: &[Rank]) {
        ks.epoch += 1;
        let epoch = ks.epoch;
        let now = self.start.elapsed();
        {
            let mut slots = lock(&self.slots);
            let mut inboxes = self.inboxes.write().unwrap_or_else(|e| e.into_inner());
            let mut windows = lock(&self.windows);
            for &v in victims {
                slots[v].killed.store(true, Ordering::SeqCst);
                let _ = inboxes[v].send(None);
                let (tx, rx) = unbounded();
                inboxes[v] = tx;
                let slot = Arc::new(Slot {
                    incarnation: slots[v].incarnation + 1,
                    killed: AtomicBool::new(false),
                });
                slots[v] = slot.clone();
                windows.retain(|&(_, r), _| r != v);
                if self.replaces {
                    let _ = self.sup.send(SupMsg::Spawn {
                        rank: v,
                        slot,
                        inbox: rx,
                        epoch,
                    });
                }
            }
            for (r, tx) in inboxes.iter().enumerate() {
                if !victims.contains(&r) {
                    let _ = tx.send(Some(Incoming::FailureNotice {
                        epoch,
                        dead: victims.to_vec(),
                    }));
                }
            }
        }
        {
            let mut st = lock(&self.stats);
            st.failures += 1;
            st.ranks_killed += victims.len() as u64;
        }
        let mut open = lock(&self.recovery_open);
        if open.is_none() {
            *open = Some(now);
        }
    }

    fn window(&self, id: WinId, rank: Rank) -> Option<Arc<WinMem>> {
        lock(&self.windows).get(&(id, rank)).cloned()
    }
}

struct ThreadEndpoint {
    world: Arc<World>,
    rank: Rank,
    slot: Arc<Slot>,
    inbox: Receiver<Mail>,
    start_epoch: u64,
}

impl ThreadEndpoint {
    fn alive(&self) -> Result<()> {
        if self.slot.killed.load(Ordering::SeqCst) {
            Err(Error::Killed)
        } else {
            Ok(())
        }
    }
}

fn rma_error(id: WinId, detail: String) -> Error {
    Error::Rma { window: id, detail }
}

fn apply_rma(w: &WinMem, id: WinId, op: RmaOp) -> Result<RmaReply> {
    let range = |offset: usize, len: usize| -> Result<std::ops::Range<usize>> {
        match offset.checked_add(len) {
            Some(end) if end <= w.len => Ok(offset..end),
            _ => Err(rma_error(
                id,
                format!(
                    "access [{offset}, {offset}+{len}) outside the {}-byte target window",
                    w.len
                ),
            )),
        }
    };
    match op {
        RmaOp::TryLock(kind) => {
            let mut l = lock(&w.lock);
            let granted = match kind {
                LockType::Shared if !l.writer => {
                    l.readers += 1;
                    true
                }
                LockType::Exclusive if !l.writer && l.readers == 0 => {
                    l.writer = true;
                    true
                }
                _ => false,
            };
            Ok(RmaReply::Granted(granted))
        }
        RmaOp::Unlock(kind) => {
            let mut l = lock(&w.lock);
            match kind {
                LockType::Shared => l.readers = l.readers.saturating_sub(1),
                LockType::Exclusive => l.writer = false,
            }
            Ok(RmaReply::Done)
        }
        op => {
            let mut guard = lock(&w.mem);
            let mem = &mut bytemuck::cast_slice_mut::<u64, u8>(&mut guard)[..w.len];
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
                    if data.len() % dtype.size() != 0 {
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
    }
}

impl Endpoint for ThreadEndpoint {
    fn rank(&self) -> Rank {
        self.rank
    }

    fn size(&self) -> usize {
        self.world.size
    }

    fn start_epoch(&self) -> u64 {
        self.start_epoch
    }

    fn send(&mut self, dest: Rank, frame: Frame) -> Result<()> {
        self.alive()?;
        let inboxes = self.world.inboxes.read().unwrap_or_else(|e| e.into_inner());
        let tx = inboxes.get(dest).ok_or(Error::RankOutOfRange {
            rank: dest,
            size: self.world.size,
        })?;
        // A dead destination's inbox may be gone: the frame is lost, as it
        // would be on a real network.
        let _ = tx.send(Some(Incoming::Frame(frame)));
        Ok(())
    }

    fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Incoming>> {
        self.alive()?;
        let got = match timeout {
            None => self
                .inbox
                .recv()
                .map_err(|_| RecvTimeoutError::Disconnected),
            Some(t) => self.inbox.recv_timeout(t),
        };
        match got {
            Ok(Some(inc)) => Ok(Some(inc)),
            Ok(None) => {
                self.alive()?;
                Ok(None)
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                self.alive()?;
                Err(Error::Driver("inbox disconnected".into()))
            }
        }
    }

    fn now(&self) -> Duration {
        self.world.start.elapsed()
    }

    fn fault_point(&mut self, at: &FaultPoint) -> Result<()> {
        self.alive()?;
        if !self.world.armed.load(Ordering::Relaxed) {
            return Ok(());
        }
        let mut ks = lock(&self.world.kills);
        if let Some(victims) = ks.plan.check(self.rank, at) {
            self.world.kill(&mut ks, &victims);
            if ks.plan.unfired().is_empty() {
                self.world.armed.store(false, Ordering::Relaxed);
            }
        }
        drop(ks);
        self.alive()
    }

    fn window_expose(
        &mut self,
        id: WinId,
        epoch: u64,
        bytes: usize,
        init: Option<&[u8]>,
    ) -> Result<()> {
        self.alive()?;
        let mut mem = vec![0u64; bytes.div_ceil(8)];
        if let Some(init) = init {
            bytemuck::cast_slice_mut::<u64, u8>(&mut mem)[..init.len()].copy_from_slice(init);
        }
        let w = Arc::new(WinMem {
            epoch,
            owner: self.slot.clone(),
            len: bytes,
            mem: Mutex::new(mem),
            lock: Mutex::new(LockState::default()),
        });
        lock(&self.world.windows).insert((id, self.rank), w);
        Ok(())
    }

    fn window_withdraw(&mut self, id: WinId) {
        let mut ws = lock(&self.world.windows);
        if ws
            .get(&(id, self.rank))
            .is_some_and(|w| Arc::ptr_eq(&w.owner, &self.slot))
        {
            ws.remove(&(id, self.rank));
        }
    }

    fn rma(&mut self, epoch: u64, target: Rank, id: WinId, op: RmaOp) -> Result<RmaReply> {
        self.alive()?;
        let w = self
            .world
            .window(id, target)
            .filter(|w| w.epoch == epoch && !w.owner.killed.load(Ordering::SeqCst))
            .ok_or_else(|| {
                Error::Driver(format!(
                    "rank {target} exposes no window {id} in epoch {epoch}"
                ))
            })?;
        apply_rma(&w, id, op)
    }

    fn with_local_window(&mut self, id: WinId, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.alive()?;
        let w = self
            .world
            .window(id, self.rank)
            .ok_or_else(|| rma_error(id, "not exposed on this rank".into()))?;
        let mut guard = lock(&w.mem);
        f(&mut bytemuck::cast_slice_mut::<u64, u8>(&mut guard)[..w.len]);
        Ok(())
    }

    fn record(&mut self, stat: Stat) {
        let now = self.world.start.elapsed();
        match stat {
            Stat::Checkpoint {
                generation,
                bytes,
                seconds,
            } => {
                let mut st = lock(&self.world.stats);
                st.checkpoint_bytes += bytes as u64;
                st.checkpoint_s = st.checkpoint_s.max(seconds);
                st.checkpoint_s_total += seconds / self.world.size as f64;
                if self.rank == 0 {
                    st.checkpoints += 1;
                    st.last_generation = Some(generation);
                }
            }
            Stat::Resumed { epoch, rolled_back } => {
                if rolled_back {
                    lock(&self.world.stats).ranks_rolled_back += 1;
                }
                let mut resumed = lock(&self.world.resumed);
                let n = resumed.entry(epoch).or_insert(0);
                *n += 1;
                let current = lock(&self.world.kills).epoch;
                if *n == self.world.size && epoch == current {
                    let t0 = lock(&self.world.recovery_open).take();
                    if let Some(t0) = t0 {
                        lock(&self.world.stats).recovery_s += (now - t0).as_secs_f64();
                    }
                }
            }
            Stat::LogBytes(b) => {
                let mut st = lock(&self.world.stats);
                st.peak_log_bytes = st.peak_log_bytes.max(b as u64);
            }
        }
    }

    fn report_progress(&mut self, fraction: f64) {
        if self.rank == 0 {
            self.world
                .progress
                .store(fraction.to_bits(), Ordering::Relaxed);
        }
    }
}

/// Run `f` on `cfg.ranks` threads; returns each rank's result (or the job's
/// error) and the job statistics.
pub(crate) fn run<T: Send + 'static>(
    cfg: &Config,
    placement: Placement,
    f: Arc<RankFn<T>>,
) -> (Result<Vec<T>>, JobStats) {
    let size = cfg.ranks;
    let (sup_tx, sup_rx) = unbounded();
    let mut inboxes = Vec::with_capacity(size);
    let mut receivers = Vec::with_capacity(size);
    for _ in 0..size {
        let (tx, rx) = unbounded();
        inboxes.push(tx);
        receivers.push(rx);
    }
    let slots: Vec<Arc<Slot>> = (0..size)
        .map(|_| {
            Arc::new(Slot {
                incarnation: 0,
                killed: AtomicBool::new(false),
            })
        })
        .collect();
    let world = Arc::new(World {
        size,
        placement: placement.clone(),
        replaces: cfg.protocol.replaces_failed_ranks(),
        inboxes: RwLock::new(inboxes),
        slots: Mutex::new(slots.clone()),
        windows: Mutex::new(HashMap::new()),
        kills: Mutex::new(KillState {
            epoch: 0,
            plan: FaultPlan::new(&cfg.kills, placement.clone(), cfg.seed),
        }),
        armed: AtomicBool::new(!cfg.kills.is_empty()),
        stats: Mutex::new(JobStats::default()),
        resumed: Mutex::new(HashMap::new()),
        recovery_open: Mutex::new(None),
        start: Instant::now(),
        sup: sup_tx.clone(),
        progress: AtomicU64::new(0),
    });

    let spawn =
        |rank: Rank, slot: Arc<Slot>, inbox: Receiver<Mail>, epoch: u64| -> JoinHandle<()> {
            let world = world.clone();
            let f = f.clone();
            let sup = sup_tx.clone();
            let protocol = cfg.protocol;
            let every = cfg.checkpoint_every;
            let incarnation = slot.incarnation;
            std::thread::Builder::new()
                .name(format!("rank-{rank}"))
                .spawn(move || {
                    let placement = world.placement.clone();
                    let ep = ThreadEndpoint {
                        world: world.clone(),
                        rank,
                        slot,
                        inbox,
                        start_epoch: epoch,
                    };
                    let engine = Engine::new(
                        Box::new(ep),
                        protocol.build(every),
                        Box::new(PartnerStore::new(rank, &placement)),
                        placement,
                    );
                    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        run_rank(engine, &*f)
                    }))
                    .unwrap_or_else(|p| {
                        let msg = p
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| p.downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "unknown panic".into());
                        Err(Error::App(format!("rank {rank} panicked: {msg}")))
                    });
                    let _ = sup.send(SupMsg::Exited {
                        rank,
                        incarnation,
                        outcome: Box::new(outcome),
                    });
                })
                .unwrap_or_else(|e| panic!("cannot start a thread for rank {rank}: {e}"))
        };

    let mut handles = Vec::new();
    for (rank, (slot, rx)) in slots.into_iter().zip(receivers).enumerate() {
        handles.push(spawn(rank, slot, rx, 0));
    }

    let bar = cfg.progress_bar && std::io::stderr().is_terminal();
    let bar = bar.then(|| {
        let pb = indicatif::ProgressBar::new(1000);
        pb.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:40}] {percent}% {msg}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        pb
    });

    let mut finals: Vec<Option<Result<T>>> = (0..size).map(|_| None).collect();
    let mut aborted = false;
    while finals.iter().any(Option::is_none) {
        match sup_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(SupMsg::Spawn {
                rank,
                slot,
                inbox,
                epoch,
            }) => handles.push(spawn(rank, slot, inbox, epoch)),
            Ok(SupMsg::Exited {
                rank,
                incarnation,
                outcome,
            }) => {
                let outcome = match outcome.downcast::<Result<T>>() {
                    Ok(o) => *o,
                    Err(_) => Err(Error::Driver("rank outcome of unexpected type".into())),
                };
                let current = lock(&world.slots)[rank].incarnation;
                let killed_old = matches!(outcome, Err(Error::Killed));
                if killed_old && world.replaces && incarnation < current {
                    continue; // a replacement carries on
                }
                if let Err(e) = &outcome
                    && !killed_old
                    && !aborted
                    && !matches!(e, Error::ProcessFailed { .. } | Error::Aborted { .. })
                {
                    // An application error ends the job: tell everyone.
                    aborted = true;
                    let inboxes = world.inboxes.read().unwrap_or_else(|e| e.into_inner());
                    for tx in inboxes.iter() {
                        let _ = tx.send(Some(Incoming::Abort {
                            rank,
                            reason: e.to_string(),
                        }));
                    }
                }
                finals[rank] = Some(outcome.map_err(|e| match e {
                    Error::Killed => Error::ProcessFailed {
                        ranks: vec![rank],
                        protocol: cfg.protocol.name().into(),
                        why: "killed by fault injection".into(),
                    },
                    e => e,
                }));
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => break,
        }
        if let Some(pb) = &bar {
            let p = f64::from_bits(world.progress.load(Ordering::Relaxed));
            pb.set_position((p * 1000.0) as u64);
        }
    }
    if let Some(pb) = bar {
        pb.finish_and_clear();
    }
    for h in handles {
        let _ = h.join();
    }
    let mut stats = lock(&world.stats).clone();
    stats.wall_s = world.start.elapsed().as_secs_f64();
    stats.unfired_kills = lock(&world.kills)
        .plan
        .unfired()
        .iter()
        .map(|k| k.to_string())
        .collect();
    let mut results = Vec::with_capacity(size);
    let mut first_err: Option<Error> = None;
    for r in finals.into_iter().flatten() {
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
        Some(e) => (Err(e), stats),
        None => (Ok(results), stats),
    }
}
