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

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::thread::{JoinHandle, Thread};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError, unbounded};

use super::shared::{
    ExitAction, Finals, RespawnHold, SPIN_YIELDS, Slot, StatsBook, WAIT_SPIN, WindowRegistry,
    Yielding, core_per_rank, lock, progress_bar, rank_body,
};
use super::{Endpoint, RmaOp, RmaReply, Stat, WinId};
use crate::config::Config;
use crate::engine::frame::{Frame, Incoming};
use crate::fault::{FaultPlan, FaultPoint};
use crate::job::{JobStats, RankFn};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// `None` wakes a rank blocked in `poll` (to notice it was killed).
type Mail = Option<Incoming>;

/// The sending side of a rank's inbox.
///
/// The receiver blocks by parking its thread, never in crossbeam's
/// blocking receive: that yields the core some eight times before it
/// sleeps whatever the load, and under EEVDF (Linux 6.6 on) each yield
/// beside busy processes costs a round of their slices: a dht cascade on
/// threads never ended beside four busy loops on 2 cores (issue 33). It
/// yields only while [`Yielding`] allows.
#[derive(Clone)]
struct MailTx {
    tx: Sender<Mail>,
    reader: Arc<OnceLock<Thread>>,
}

impl MailTx {
    fn send(&self, m: Mail) -> std::result::Result<(), crossbeam_channel::SendError<Mail>> {
        let r = self.tx.send(m);
        // With the fence in `MailRx::recv`: a reader that registers after
        // this sees the message before it parks (neither misses the other).
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(t) = self.reader.get() {
            t.unpark();
        }
        r
    }
}

/// The receiving side of a rank's inbox (see [`MailTx`]).
#[derive(Clone)]
struct MailRx {
    rx: Receiver<Mail>,
    reader: Arc<OnceLock<Thread>>,
}

impl MailRx {
    fn try_recv(&self) -> std::result::Result<Mail, TryRecvError> {
        self.rx.try_recv()
    }

    /// Wait for mail until `deadline` (`None`: for ever), yielding the
    /// core first while `yielding` allows (with more ranks than cores, the
    /// sender is often the rank that gets it).
    fn recv(
        &self,
        deadline: Option<Instant>,
        yielding: &mut Yielding,
    ) -> std::result::Result<Mail, RecvTimeoutError> {
        if self.reader.get().is_none() {
            let _ = self.reader.set(std::thread::current());
            std::sync::atomic::fence(Ordering::SeqCst);
        }
        let mut yields = 0;
        loop {
            match self.rx.try_recv() {
                Ok(m) => return Ok(m),
                Err(TryRecvError::Disconnected) => return Err(RecvTimeoutError::Disconnected),
                Err(TryRecvError::Empty) => {}
            }
            if yields < SPIN_YIELDS && yielding.may(Instant::now()) {
                yields += 1;
                std::thread::yield_now();
                continue;
            }
            // An unpark since the last park returns at once: nothing sent
            // after the check above is missed.
            match deadline {
                None => std::thread::park(),
                Some(d) => {
                    let now = Instant::now();
                    if now >= d {
                        return Err(RecvTimeoutError::Timeout);
                    }
                    std::thread::park_timeout(d - now);
                }
            }
        }
    }
}

fn mailbox() -> (MailTx, MailRx) {
    let (tx, rx) = unbounded();
    let reader = Arc::new(OnceLock::new());
    (
        MailTx {
            tx,
            reader: reader.clone(),
        },
        MailRx { rx, reader },
    )
}

struct KillState {
    epoch: u64,
    plan: FaultPlan,
    /// Dead ranks no replacement was started for (ULFM respawn may start
    /// one later).
    unreplaced: std::collections::HashSet<Rank>,
}

enum SupMsg {
    Spawn {
        rank: Rank,
        slot: Arc<Slot>,
        inbox: MailRx,
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
    inboxes: RwLock<Vec<MailTx>>,
    slots: Mutex<Vec<Arc<Slot>>>,
    windows: WindowRegistry,
    kills: Mutex<KillState>,
    armed: AtomicBool,
    /// Frames waiting for a respawned rank (lock order: `kills`, `slots`,
    /// `inboxes`, then this); `holding` is its fast path for sends.
    respawning: Mutex<RespawnHold<Frame>>,
    holding: AtomicBool,
    stats: Mutex<StatsBook>,
    start: Instant,
    sup: Sender<SupMsg>,
    progress: AtomicU64,
    /// [`core_per_rank`]: a waiting rank watches its inbox for
    /// [`WAIT_SPIN`] before it blocks.
    spin: bool,
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
            for &v in victims {
                slots[v].killed.store(true, Ordering::SeqCst);
                let _ = inboxes[v].send(None);
                let (tx, rx) = mailbox();
                inboxes[v] = tx;
                let slot = Slot::new(slots[v].incarnation + 1);
                slots[v] = slot.clone();
                self.windows.remove_rank(v);
                if self.replaces {
                    let _ = self.sup.send(SupMsg::Spawn {
                        rank: v,
                        slot,
                        inbox: rx,
                        epoch,
                    });
                } else {
                    ks.unreplaced.insert(v);
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
        lock(&self.stats).on_kill(epoch, victims, now);
    }
}

impl World {
    /// A world of `cfg.ranks` live ranks: their first incarnations and
    /// inboxes, which the caller starts threads with.
    fn new(
        cfg: &Config,
        placement: Placement,
        sup: Sender<SupMsg>,
    ) -> (Arc<World>, Vec<Arc<Slot>>, Vec<MailRx>) {
        let size = cfg.ranks;
        let (inboxes, receivers) = (0..size).map(|_| mailbox()).unzip();
        let slots: Vec<Arc<Slot>> = (0..size).map(|_| Slot::new(0)).collect();
        let world = Arc::new(World {
            size,
            placement: placement.clone(),
            replaces: cfg.protocol.replaces_failed_ranks(),
            inboxes: RwLock::new(inboxes),
            slots: Mutex::new(slots.clone()),
            windows: WindowRegistry::default(),
            kills: Mutex::new(KillState {
                epoch: 0,
                plan: FaultPlan::new(&cfg.kills, placement, cfg.seed),
                unreplaced: Default::default(),
            }),
            armed: AtomicBool::new(!cfg.kills.is_empty()),
            respawning: Mutex::default(),
            holding: AtomicBool::new(false),
            stats: Mutex::new(
                StatsBook::new(cfg.protocol, cfg.sets, cfg.ranks, cfg.nodes)
                    .traced(cfg.trace.is_some(), false),
            ),
            start: Instant::now(),
            sup,
            progress: AtomicU64::new(0),
            spin: core_per_rank(size),
        });
        (world, slots, receivers)
    }

    /// Start a new incarnation of the dead rank `v` (ULFM respawn).
    fn respawn(&self, v: Rank) -> Result<()> {
        let mut ks = lock(&self.kills);
        let mut slots = lock(&self.slots);
        let mut inboxes = self.inboxes.write().unwrap_or_else(|e| e.into_inner());
        let (Some(old), Some(inbox)) = (slots.get(v), inboxes.get_mut(v)) else {
            return Err(Error::RankOutOfRange {
                rank: v,
                size: self.size,
            });
        };
        let slot = Slot::new(old.incarnation + 1);
        let (tx, rx) = mailbox();
        ks.unreplaced.remove(&v);
        let mut hold = lock(&self.respawning);
        for (_, frame) in hold.release(v) {
            let _ = tx.send(Some(Incoming::Frame(frame)));
        }
        self.holding.store(!hold.is_empty(), Ordering::SeqCst);
        drop(hold);
        *inbox = tx;
        slots[v] = slot.clone();
        self.sup
            .send(SupMsg::Spawn {
                rank: v,
                slot,
                inbox: rx,
                epoch: ks.epoch,
            })
            .map_err(|_| Error::Driver("the supervisor is gone".into()))
    }
}

struct ThreadEndpoint {
    world: Arc<World>,
    rank: Rank,
    slot: Arc<Slot>,
    inbox: MailRx,
    start_epoch: u64,
    yielding: Yielding,
}

impl ThreadEndpoint {
    /// With a core for every rank: watch the inbox for up to [`WAIT_SPIN`].
    fn spin_for_mail(&self) -> Option<Mail> {
        if !self.world.spin {
            return None;
        }
        let start = Instant::now();
        loop {
            for _ in 0..64 {
                match self.inbox.try_recv() {
                    Ok(m) => return Some(m),
                    Err(TryRecvError::Disconnected) => return None,
                    Err(TryRecvError::Empty) => std::hint::spin_loop(),
                }
            }
            if start.elapsed() >= WAIT_SPIN {
                return None;
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
        self.slot.alive()?;
        let frame = if self.world.holding.load(Ordering::SeqCst) {
            match lock(&self.world.respawning).hold(self.rank, dest, frame) {
                Some(f) => f,
                None => return Ok(()),
            }
        } else {
            frame
        };
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
        self.slot.alive()?;
        let got = match timeout {
            // `recv_timeout(0)` backs off (spins and yields) before it gives
            // up: several microseconds per poll that finds nothing.
            Some(Duration::ZERO) => self.inbox.try_recv().map_err(|e| match e {
                TryRecvError::Empty => RecvTimeoutError::Timeout,
                TryRecvError::Disconnected => RecvTimeoutError::Disconnected,
            }),
            None => match self.spin_for_mail() {
                Some(m) => Ok(m),
                None => self.inbox.recv(None, &mut self.yielding),
            },
            Some(t) => self
                .inbox
                .recv(Some(Instant::now() + t), &mut self.yielding),
        };
        match got {
            Ok(Some(inc)) => Ok(Some(inc)),
            Ok(None) => {
                self.slot.alive()?;
                Ok(None)
            }
            Err(RecvTimeoutError::Timeout) => Ok(None),
            Err(RecvTimeoutError::Disconnected) => {
                self.slot.alive()?;
                Err(Error::Driver("inbox disconnected".into()))
            }
        }
    }

    fn now(&self) -> Duration {
        self.world.start.elapsed()
    }

    fn compute(&mut self, d: Duration) -> Result<()> {
        self.slot.alive()?;
        std::thread::sleep(d);
        Ok(())
    }

    fn conclude(&mut self, epoch: u64) -> bool {
        let mut ks = lock(&self.world.kills);
        if ks.epoch != epoch {
            return false;
        }
        ks.plan.conclude();
        self.world.armed.store(false, Ordering::Relaxed);
        true
    }

    fn fault_point(&mut self, at: &FaultPoint) -> Result<()> {
        self.slot.alive()?;
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
        self.slot.alive()
    }

    fn window_expose(
        &mut self,
        id: WinId,
        epoch: u64,
        bytes: usize,
        init: Option<&[u8]>,
    ) -> Result<()> {
        self.world
            .windows
            .expose_live((self.rank, &self.slot), id, epoch, (bytes, init), None)
    }

    fn window_withdraw(&mut self, id: WinId) {
        self.world.windows.withdraw(id, self.rank, &self.slot);
    }

    fn rma(&mut self, epoch: u64, target: Rank, id: WinId, op: RmaOp) -> Result<RmaReply> {
        self.slot.alive()?;
        self.world.windows.rma(epoch, target, id, op)
    }

    fn with_local_window(&mut self, id: WinId, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.world
            .windows
            .with_local_live((self.rank, &self.slot), id, f)
    }

    fn record(&mut self, stat: Stat) {
        let now = self.world.start.elapsed();
        let epoch = lock(&self.world.kills).epoch;
        lock(&self.world.stats).record(self.rank, self.world.size, stat, now, epoch);
    }

    fn report_progress(&mut self, fraction: f64) {
        if self.rank == 0 {
            self.world
                .progress
                .store(fraction.to_bits(), Ordering::Relaxed);
        }
    }

    fn respawn(&mut self, rank: Rank) -> Result<()> {
        self.slot.alive()?;
        self.world.respawn(rank)
    }

    fn await_respawn(&mut self, rank: Rank) {
        let ks = lock(&self.world.kills);
        if ks.unreplaced.contains(&rank) {
            lock(&self.world.respawning).await_respawn(self.rank, rank);
            self.world.holding.store(true, Ordering::SeqCst);
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
    let (sup_tx, sup_rx) = unbounded();
    let (world, slots, receivers) = World::new(cfg, placement, sup_tx.clone());
    let size = cfg.ranks;

    let spawn = |rank: Rank, slot: Arc<Slot>, inbox: MailRx, epoch: u64| -> JoinHandle<()> {
        let world = world.clone();
        let f = f.clone();
        let sup = sup_tx.clone();
        let cfg = cfg.clone();
        let incarnation = slot.incarnation;
        std::thread::Builder::new()
            .name(format!("rank-{rank}"))
            .spawn(move || {
                let placement = world.placement.clone();
                let ep = ThreadEndpoint {
                    world,
                    rank,
                    slot,
                    inbox,
                    start_epoch: epoch,
                    yielding: Yielding::new(size),
                };
                let outcome = rank_body(Box::new(ep), &cfg, placement, &*f);
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

    let bar = progress_bar(cfg.progress_bar);

    let mut finals = Finals::new(size)
        .reporting_failures(cfg.failure_handling == crate::config::FailureHandling::Return);
    // Incarnation of the newest thread started per rank: an older one's
    // exit is not final.
    let mut started = vec![0u64; size];
    while !finals.done() {
        match sup_rx.recv_timeout(Duration::from_millis(100)) {
            Ok(SupMsg::Spawn {
                rank,
                slot,
                inbox,
                epoch,
            }) => {
                started[rank] = slot.incarnation;
                finals.reopen(rank);
                handles.push(spawn(rank, slot, inbox, epoch));
            }
            Ok(SupMsg::Exited {
                rank,
                incarnation,
                outcome,
            }) => {
                let outcome = match outcome.downcast::<Result<T>>() {
                    Ok(o) => *o,
                    Err(_) => Err(Error::Driver("rank outcome of unexpected type".into())),
                };
                let superseded = incarnation < started[rank];
                if let ExitAction::Abort { rank, reason } =
                    finals.on_exit(rank, outcome, superseded, cfg.protocol.name())
                {
                    // No kill fires once the job is aborted: a replacement
                    // started after this broadcast would never be told,
                    // and would wait for ever (issue 33, defect 5). One
                    // started before it has its inbox in the list already.
                    lock(&world.kills).plan.conclude();
                    world.armed.store(false, Ordering::Relaxed);
                    let inboxes = world.inboxes.read().unwrap_or_else(|e| e.into_inner());
                    for tx in inboxes.iter() {
                        let _ = tx.send(Some(Incoming::Abort {
                            rank,
                            reason: reason.clone(),
                        }));
                    }
                }
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
    let mut stats = lock(&world.stats).stats.clone();
    stats.wall_s = world.start.elapsed().as_secs_f64();
    stats.unfired_kills = lock(&world.kills)
        .plan
        .unfired()
        .iter()
        .map(|k| k.to_string())
        .collect();
    (finals.finish(), stats)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::frame::{Body, RuntimeMsg};

    fn endpoint(
        world: &Arc<World>,
        slots: &[Arc<Slot>],
        inboxes: &[MailRx],
        rank: Rank,
    ) -> ThreadEndpoint {
        ThreadEndpoint {
            world: world.clone(),
            rank,
            slot: slots[rank].clone(),
            inbox: inboxes[rank].clone(),
            start_epoch: 0,
            yielding: Yielding::new(inboxes.len()),
        }
    }

    fn frame(src: Rank) -> Frame {
        Frame {
            src,
            epoch: 1,
            body: Body::Runtime(RuntimeMsg::Done),
        }
    }

    /// The respawn example hung under load (issue 33): survivor 2 agreed to
    /// respawn rank 0 and sent its first frame on the repaired communicator
    /// before survivor 1, the starter, had started the new incarnation; the
    /// frame went to the dead incarnation's inbox and was lost.
    #[test]
    fn frames_sent_after_agreeing_to_a_respawn_wait_for_the_new_incarnation() {
        let cfg = Config::new(3);
        let placement = Placement::block(3, 1).expect("valid");
        let (sup_tx, sup_rx) = unbounded();
        let (world, slots, inboxes) = World::new(&cfg, placement, sup_tx);
        world.kill(&mut lock(&world.kills), &[0]);
        let mut starter = endpoint(&world, &slots, &inboxes, 1);
        let mut other = endpoint(&world, &slots, &inboxes, 2);
        // Sent before agreeing: lost with the dead incarnation.
        other.send(0, frame(2)).expect("send");
        other.await_respawn(0);
        other.send(0, frame(2)).expect("send");
        starter.await_respawn(0);
        starter.send(0, frame(1)).expect("send");
        starter.respawn(0).expect("respawn");
        other.send(0, frame(2)).expect("send");
        let Ok(SupMsg::Spawn { inbox, .. }) = sup_rx.try_recv() else {
            panic!("no new incarnation was started");
        };
        let got: Vec<Rank> = inbox
            .rx
            .try_iter()
            .map(|m| match m {
                Some(Incoming::Frame(f)) => f.src,
                other => panic!("not a frame: {other:?}"),
            })
            .collect();
        assert_eq!(got, vec![2, 1, 2]);
        // Nothing is held any more: sends take the fast path again.
        assert!(!world.holding.load(Ordering::SeqCst));
    }
}
