//! The `sim` backend: a deterministic discrete-event simulator.
//!
//! The real engine and protocols run, unchanged, in one stackful coroutine per
//! rank (corosensei), all on the thread that called the simulator: a rank runs
//! until it blocks (waits for a frame, charges computation, or finishes), and
//! then suspends back to the scheduler, which picks the next rank. No rank
//! costs an OS thread, so neither the kernel's thread limit nor a futex
//! hand-over bounds the scale; a rank's stack is a slot of a few large
//! mappings (`stack.rs`), committed only where it is touched. Which
//! rank runs next among those ready at the same virtual instant, the jitter of
//! every link, and when kills land are all drawn from one seeded generator, so
//! a seed reproduces the whole run: its schedule, its failures and its result.
//! A trace hash over every scheduling decision and delivery proves it.
//!
//! Time is virtual. A frame from `a` to `b` arrives after the link's latency
//! (inside or between failure domains), its size over the link's bandwidth,
//! and a seeded jitter; each channel stays FIFO. Computation costs time only
//! when charged (`Ctx::compute`), so communication-pattern apps can model
//! 10,000+ ranks. RMA operations are applied at the target at once and charge
//! the origin a round trip. If every rank is blocked and no event is pending,
//! the run is a hang: the simulator says so and ends the job.

use std::cell::{Cell, RefCell, RefMut};
use std::cmp::Reverse;
use std::collections::{HashMap, VecDeque};
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use corosensei::{Coroutine, CoroutineResult, Yielder};
use radix_heap::RadixHeapMap;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use super::shared::{ExitAction, Finals, RespawnHold, Slot, StatsBook, WindowRegistry, rank_body};
use super::{Endpoint, RmaOp, RmaReply, Stat, WinId};
use crate::config::Config;
use crate::engine::frame::{Body, Frame, Incoming};
use crate::fault::{FaultPlan, FaultPoint, Victim};
use crate::job::{JobStats, RankFn};
use crate::migration::location::{Envelope, LocationMsg, Worker};
use crate::store::StoreMsg;
use crate::topology::Placement;
use crate::{Error, Rank, Result};

mod proactive;
mod stack;

use proactive::{Proactive, Routed, Step};
use stack::{RankStack, Sentinel, StackPool};

pub use crate::network::{NetworkModel, STRAGGLE_LATENCIES};

/// What the simulator reports besides the job's statistics.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
pub struct SimReport {
    /// Hash of every scheduling decision and delivery: equal seeds give
    /// equal hashes.
    pub trace_hash: u64,
    /// Events processed (deliveries, wake-ups, scheduling decisions).
    pub events: u64,
    /// Virtual time at the end, seconds.
    pub virtual_s: f64,
    /// Wall time of the simulation, seconds.
    pub wall_s: f64,
    /// Whether the run hung (every rank blocked, nothing pending).
    pub hung: bool,
    /// Frames sent (application, protocol, store and runtime).
    pub messages: u64,
    /// Bytes of those frames (payload plus a 64-byte header each).
    pub bytes: u64,
    /// Bytes of the ranks' coroutine stacks resident at the end (what the
    /// kernel committed of their slots), over all ranks.
    #[serde(default)]
    pub stack_bytes: u64,
    /// Whether every rank's stack had a guard page (false when the
    /// kernel's mapping limit cannot hold one per rank: a canary check
    /// stands in, `stack.rs`).
    #[serde(default)]
    pub stacks_guarded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum St {
    Ready,
    Running,
    BlockedPoll(u64),
    BlockedCompute(u64),
    Exited,
}

struct Entity {
    /// The rank this entity is an incarnation of.
    rank: Rank,
    /// The world epoch it started in.
    start_epoch: u64,
    slot: Arc<Slot>,
    inbox: VecDeque<Incoming>,
    st: St,
    /// Consecutive empty non-blocking polls (a spinning rank must yield).
    spins: u32,
}

enum Ev {
    Deliver {
        entity: usize,
        inc: Incoming,
    },
    Wake {
        entity: usize,
        token: u64,
    },
    /// A frame reaches a worker's location service (workers, 001 §3.1).
    Route {
        at: Worker,
        routed: Box<Routed>,
    },
    /// A location message reaches a worker.
    Locate {
        to: Worker,
        msg: LocationMsg,
    },
}

/// Bytes of a location message on the wire (a header).
const LOCATION_MSG_BYTES: usize = 64;

/// When an event fires, `(at, seq)`: `seq` orders events of one instant as
/// they were scheduled. The queue is a monotone radix heap (virtual time
/// never goes back: an event is scheduled at `now` or later, and `seq`
/// grows), as a max-heap of reversed keys; it holds keys and slab slots
/// only, the events sit in the slab (an event, a frame, is large, and
/// moving it between buckets or at every sift was a tenth of a large run's
/// time).
type EventQueue = RadixHeapMap<Reverse<(u64, u64)>, u32>;

/// The pending events, by slot (`Timed::slot`), with the free slots.
#[derive(Default)]
struct EventSlab {
    events: Vec<Option<Ev>>,
    free: Vec<u32>,
}

impl EventSlab {
    fn insert(&mut self, ev: Ev) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.events[i as usize] = Some(ev);
                i
            }
            None => {
                self.events.push(Some(ev));
                u32::try_from(self.events.len() - 1).unwrap_or(u32::MAX)
            }
        }
    }

    fn take(&mut self, slot: u32) -> Option<Ev> {
        let ev = self.events.get_mut(slot as usize)?.take();
        self.free.push(slot);
        ev
    }
}

struct Sched<T> {
    now: u64,
    seq: u64,
    queue: EventQueue,
    pending: EventSlab,
    entities: Vec<Entity>,
    current: Vec<usize>,
    ready: Vec<usize>,
    running: Option<usize>,
    rng: ChaCha8Rng,
    last_on_channel: HashMap<(Rank, Rank), u64>,
    /// When each rank's network interface is free again.
    nic_free: Vec<u64>,
    trace: u64,
    events: u64,
    messages: u64,
    bytes: u64,
    epoch: u64,
    plan: FaultPlan,
    stats: StatsBook,
    finals: Finals<T>,
    /// Frames waiting for a respawned rank (ULFM).
    respawning: RespawnHold<Frame>,
    hung: bool,
    finished: bool,
    token: u64,
    /// Workers, warnings and migration (001), when the run has them.
    mig: Option<Box<Proactive>>,
}

/// What a rank's coroutine yields to the scheduler (nothing: the rank's
/// state in `Sched` says why it blocked) and gets back on resumption.
type RankYielder = Yielder<(), ()>;

/// A rank's coroutine: it returns the rank's outcome.
type RankCoroutine<T> = Coroutine<(), (), Result<T>, RankStack>;

/// A rank's coroutine and its stack's overflow check.
type Running<T> = (RankCoroutine<T>, Sentinel);

struct SimWorld<T> {
    size: usize,
    placement: Placement,
    net: NetworkModel,
    cfg: Config,
    f: Arc<RankFn<T>>,
    replaces: bool,
    windows: WindowRegistry,
    sched: RefCell<Sched<T>>,
    /// The entity whose coroutine runs now (none while the scheduler does):
    /// an endpoint suspends only from inside its own coroutine.
    inside: Cell<Option<usize>>,
}

const FNV_PRIME: u64 = 0x100_0000_01b3;

fn mix(h: &mut u64, x: u64) {
    for b in x.to_le_bytes() {
        *h ^= u64::from(b);
        *h = h.wrapping_mul(FNV_PRIME);
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn frame_bytes(f: &Frame) -> usize {
    64 + match &f.body {
        Body::App(m) => m.payload.len(),
        Body::Store(StoreMsg::Put(p) | StoreMsg::Piece(p)) => p.data.len(),
        _ => 0,
    }
}

impl<T> Sched<T> {
    fn push(&mut self, at: u64, ev: Ev) {
        self.seq += 1;
        let slot = self.pending.insert(ev);
        // Never before `now` (every caller adds a delay to it), so the key
        // is at most the heap's top: the monotone queue's precondition.
        self.queue.push(Reverse((at.max(self.now), self.seq)), slot);
    }

    fn make_ready(&mut self, e: usize) {
        if !matches!(self.entities[e].st, St::Ready | St::Running | St::Exited) {
            self.entities[e].st = St::Ready;
            self.ready.push(e);
        }
    }

    fn apply(&mut self, ev: Ev) {
        self.events += 1;
        match ev {
            Ev::Deliver { entity, inc } => self.deliver(entity, inc),
            Ev::Wake { entity, token } => {
                let st = self.entities[entity].st;
                if st == St::BlockedPoll(token) || st == St::BlockedCompute(token) {
                    self.make_ready(entity);
                }
            }
            Ev::Route { at, routed } => {
                if let Some(mut m) = self.mig.take() {
                    let step = m.reach(at, *routed);
                    self.step(&mut m, at, step);
                    self.mig = Some(m);
                }
            }
            Ev::Locate { to, msg } => {
                if let Some(mut m) = self.mig.take() {
                    for (w, msg) in m.locate(to, msg) {
                        let at = self.now + m.hop_ns(to, w, LOCATION_MSG_BYTES);
                        self.push(at, Ev::Locate { to: w, msg });
                    }
                    self.mig = Some(m);
                }
            }
        }
    }

    /// Put `inc` in `entity`'s inbox (lost with a dead destination).
    fn deliver(&mut self, entity: usize, inc: Incoming) {
        let ent = &mut self.entities[entity];
        if ent.st == St::Exited || ent.slot.killed.load(Ordering::SeqCst) {
            return; // lost with its destination
        }
        mix(&mut self.trace, entity as u64);
        mix(&mut self.trace, self.now);
        ent.inbox.push_back(inc);
        if matches!(ent.st, St::BlockedPoll(_)) {
            self.make_ready(entity);
        }
    }

    /// Carry out what worker `at`'s location service decided for a frame.
    fn step(&mut self, m: &mut Proactive, at: Worker, step: Step) {
        match step {
            Step::Deliver(r, update) => {
                if let Some((w, msg)) = update {
                    let t = self.now + m.hop_ns(at, w, LOCATION_MSG_BYTES);
                    self.push(t, Ev::Locate { to: w, msg });
                }
                for (entity, inc) in m.in_order(r) {
                    self.deliver(entity, inc);
                }
            }
            Step::Forward(next, r) => {
                mix(&mut self.trace, 0xf0_0000 ^ next as u64);
                let t = self.now + m.hop_ns(at, next, r.bytes);
                self.push(
                    t,
                    Ev::Route {
                        at: next,
                        routed: Box::new(r),
                    },
                );
            }
            Step::Held => {}
        }
    }

    /// Choose the next entity to run, advancing virtual time as needed.
    fn switch(&mut self, limit: u64) -> Option<usize> {
        loop {
            if !self.ready.is_empty() {
                let i = self.rng.random_range(0..self.ready.len());
                let e = self.ready.swap_remove(i);
                self.entities[e].st = St::Running;
                self.running = Some(e);
                self.events += 1;
                mix(&mut self.trace, e as u64 ^ 0x5c4e_d000);
                return Some(e);
            }
            self.running = None;
            let (Reverse((at, _)), slot) = self.queue.pop()?;
            self.now = self.now.max(at);
            if self.now > limit {
                return None;
            }
            if let Some(ev) = self.pending.take(slot) {
                self.apply(ev);
            }
        }
    }

    fn all_exited(&self) -> bool {
        self.entities.iter().all(|e| e.st == St::Exited)
    }
}

struct SimEndpoint<T: Send + 'static> {
    world: Rc<SimWorld<T>>,
    rank: Rank,
    entity: usize,
    slot: Arc<Slot>,
    start_epoch: u64,
    /// The yielder corosensei gave this rank's coroutine body; it lives on
    /// that coroutine's stack for as long as the body runs.
    yielder: *const RankYielder,
    /// The last safe point this rank passed.
    safe_point: u64,
}

fn simulation_ended() -> Error {
    Error::Driver("the simulation ended".into())
}

impl<T: Send + 'static> SimWorld<T> {
    fn sched(&self) -> RefMut<'_, Sched<T>> {
        self.sched.borrow_mut()
    }

    /// Pick who runs next; `None` when nobody can: the job ended, or it
    /// hung, which ends it once every rank has been told.
    fn hand_over(&self) -> Option<usize> {
        let mut s = self.sched();
        if let Some(next) = s.switch(nanos(self.net.time_limit)) {
            return Some(next);
        }
        if !s.all_exited() && !s.hung {
            // Every rank blocked, nothing pending: a hang. End it
            // deterministically by aborting every rank.
            s.hung = true;
            s.plan.conclude();
            let why = format!(
                "simulated hang at t = {:.6} s: every rank is blocked and nothing is in flight",
                s.now as f64 * 1e-9
            );
            for e in 0..s.entities.len() {
                if s.entities[e].st != St::Exited {
                    s.entities[e].inbox.push_back(Incoming::Abort {
                        rank: usize::MAX,
                        reason: why.clone(),
                    });
                    s.make_ready(e);
                }
            }
            if let Some(next) = s.switch(u64::MAX) {
                return Some(next);
            }
        }
        s.finished = true;
        None
    }

    /// A new incarnation of `rank`, ready to run; its coroutine (and stack)
    /// is made when it first runs.
    fn spawn(s: &mut Sched<T>, rank: Rank, slot: Arc<Slot>, epoch: u64) {
        let entity = s.entities.len();
        s.entities.push(Entity {
            rank,
            start_epoch: epoch,
            slot,
            inbox: VecDeque::new(),
            st: St::Ready,
            spins: 0,
        });
        s.ready.push(entity);
        if let Some(c) = s.current.get_mut(rank) {
            *c = entity;
        } else {
            s.current.push(entity);
        }
    }

    /// The coroutine that runs `entity`'s rank function on a stack of `pool`.
    fn coroutine(self: &Rc<Self>, entity: usize, pool: &StackPool) -> Result<Running<T>> {
        let (rank, slot, start_epoch) = {
            let s = self.sched();
            let e = &s.entities[entity];
            (e.rank, e.slot.clone(), e.start_epoch)
        };
        let stack = pool.take().map_err(|e| {
            Error::Driver(format!(
                "no memory for the stack of simulated rank {rank}: {}",
                e.0
            ))
        })?;
        let sentinel = stack.sentinel();
        let world = self.clone();
        let co = Coroutine::with_stack(stack, move |yielder: &RankYielder, ()| {
            let ep = SimEndpoint {
                world: world.clone(),
                rank,
                entity,
                slot,
                start_epoch,
                yielder,
                safe_point: 0,
            };
            rank_body(Box::new(ep), &world.cfg, world.placement.clone(), &*world.f)
        });
        Ok((co, sentinel))
    }

    /// `entity`'s rank function returned `outcome`.
    fn exited(&self, entity: usize, outcome: Result<T>) {
        let mut s = self.sched();
        s.entities[entity].st = St::Exited;
        s.entities[entity].inbox.clear();
        let rank = s.entities[entity].rank;
        let superseded = s.current[rank] != entity;
        if let ExitAction::Abort { rank, reason } =
            s.finals
                .on_exit(rank, outcome, superseded, self.cfg.protocol.name())
        {
            // No kill fires once the job is aborted: a replacement started
            // after this would never be told (issue 33, defect 5).
            s.plan.conclude();
            for e in 0..s.entities.len() {
                if s.entities[e].st != St::Exited {
                    s.entities[e].inbox.push_back(Incoming::Abort {
                        rank,
                        reason: reason.clone(),
                    });
                    s.make_ready(e);
                }
            }
        }
    }

    /// Run every rank to its end: resume the one the scheduler picks until
    /// none is left, then let the ranks still blocked (the job hung or
    /// ended without them) return "the simulation ended" from their next
    /// call and finish.
    fn drive(self: &Rc<Self>, pool: &StackPool) -> Result<()> {
        let mut coroutines: Vec<Option<Running<T>>> = Vec::new();
        let mut failure = None;
        while let Some(e) = self.hand_over() {
            if coroutines.len() <= e {
                coroutines.resize_with(e + 1, || None);
            }
            if coroutines[e].is_none() {
                match self.coroutine(e, pool) {
                    Ok(co) => coroutines[e] = Some(co),
                    Err(err) => {
                        failure = Some(err);
                        self.sched().finished = true;
                        break;
                    }
                }
            }
            self.resume(e, &mut coroutines);
        }
        for e in 0..coroutines.len() {
            while coroutines[e].is_some() {
                self.resume(e, &mut coroutines);
            }
        }
        failure.map_or(Ok(()), Err)
    }

    fn resume(&self, e: usize, coroutines: &mut [Option<Running<T>>]) {
        let Some((co, sentinel)) = coroutines[e].as_mut() else {
            return;
        };
        self.inside.set(Some(e));
        let result = co.resume(());
        self.inside.set(None);
        if sentinel.overflowed() {
            // The rank wrote below its stack into a neighbouring slot; stop
            // before any rank runs on that memory (as a thread's guard page
            // would).
            eprintln!(
                "simulated rank {} overflowed its {} KiB coroutine stack; aborting",
                self.sched().entities[e].rank,
                stack::SLOT_BYTES >> 10
            );
            std::process::abort();
        }
        if let CoroutineResult::Return(outcome) = result {
            coroutines[e] = None; // its stack goes back to the pool
            self.exited(e, outcome);
        }
    }

    /// Put `frame` from `from` on the network to `dest`: it arrives after
    /// the link's latency and its size over the bandwidth, in FIFO order
    /// per channel.
    fn transmit(&self, s: &mut Sched<T>, from: Rank, dest: Rank, frame: Frame) {
        let entity = s.current[dest];
        // With workers, the frame goes first from the sender's worker to
        // where that worker believes the receiver is (001 §3.1).
        let route = s.mig.as_mut().map(|m| {
            let (a, b, seq) = m.send(from, dest, entity);
            (a, b, seq, m.link(a, b))
        });
        let (lat, bw) = match route {
            Some((.., link)) => link,
            None => self.latency_and_bandwidth(from, dest),
        };
        let bytes = frame_bytes(&frame);
        let jitter = if self.net.jitter > 0.0 {
            s.rng.random_range(0.0..self.net.jitter) * lat.as_nanos() as f64
        } else {
            0.0
        };
        // The message leaves when the sender's interface is free, and keeps
        // it busy for the per-message overhead plus its size over bandwidth.
        let wire = (bytes as f64 / bw * 1e9) as u64;
        let depart = s.now.max(s.nic_free[from]) + nanos(self.net.overhead);
        s.nic_free[from] = depart + wire;
        let mut at = depart + nanos(lat) + wire + jitter as u64;
        if self.net.straggle > 0.0
            && let Body::App(msg) = &frame.body
            && crate::engine::leg_kind(msg) == crate::cuts::LegKind::Reply
            && s.rng.random_bool(self.net.straggle.min(1.0))
        {
            at += (s.rng.random_range(0.0..STRAGGLE_LATENCIES) * lat.as_nanos() as f64) as u64;
        }
        let last = s.last_on_channel.entry((from, dest)).or_insert(0);
        at = at.max(*last + 1); // channels are FIFO
        *last = at;
        s.messages += 1;
        s.bytes += bytes as u64;
        mix(&mut s.trace, (from as u64) << 32 | dest as u64);
        mix(&mut s.trace, bytes as u64);
        let ev = match route {
            Some((origin, first, seq, _)) => Ev::Route {
                at: first,
                routed: Box::new(Routed {
                    entity,
                    src: from,
                    seq,
                    env: Envelope {
                        dest,
                        origin,
                        hops: 0,
                    },
                    bytes,
                    inc: Incoming::Frame(frame),
                }),
            },
            None => Ev::Deliver {
                entity,
                inc: Incoming::Frame(frame),
            },
        };
        s.push(at, ev);
    }

    /// The link between ranks `a` and `b` where they reside now.
    fn link(&self, s: &Sched<T>, a: Rank, b: Rank) -> (Duration, f64) {
        match &s.mig {
            Some(m) => m.link(m.residence(a), m.residence(b)),
            None => self.latency_and_bandwidth(a, b),
        }
    }

    fn latency_and_bandwidth(&self, a: Rank, b: Rank) -> (Duration, f64) {
        if self.placement.node_of(a) == self.placement.node_of(b) {
            (self.net.latency_intra, self.net.bandwidth_intra)
        } else {
            (self.net.latency_inter, self.net.bandwidth_inter)
        }
    }

    /// Fire the warnings due at `rank`'s fault point `at`: the warned
    /// workers announce their evacuation.
    fn warn(&self, s: &mut Sched<T>, rank: Rank, at: &FaultPoint) {
        let Some(mut m) = s.mig.take() else {
            return;
        };
        let now = s.now;
        for i in m.check_warnings(rank, at) {
            for (from, to, msg) in m.warn(i, now, at.iteration) {
                let t = now + m.hop_ns(from, to, LOCATION_MSG_BYTES);
                s.push(t, Ev::Locate { to, msg });
            }
            mix(&mut s.trace, 0x3a4e ^ i as u64);
        }
        s.mig = Some(m);
    }

    /// Kill `victims` at once (sched lock held by the caller).
    fn kill(&self, s: &mut Sched<T>, victims: &[Rank]) {
        s.epoch += 1;
        let epoch = s.epoch;
        let now = Duration::from_nanos(s.now);
        for &v in victims {
            if let Some(m) = s.mig.as_mut() {
                m.rank_died(v);
            }
            let e = s.current[v];
            s.entities[e].slot.killed.store(true, Ordering::SeqCst);
            s.entities[e].inbox.clear();
            s.make_ready(e); // so it runs, sees it is dead, and ends
            self.windows.remove_rank(v);
            let slot = Slot::new(s.entities[e].slot.incarnation + 1);
            if self.replaces {
                Self::spawn(s, v, slot, epoch);
            }
        }
        let at = s.now + nanos(self.net.detection);
        for r in 0..self.size {
            if !victims.contains(&r) {
                let entity = s.current[r];
                s.push(
                    at,
                    Ev::Deliver {
                        entity,
                        inc: Incoming::FailureNotice {
                            epoch,
                            dead: victims.to_vec(),
                        },
                    },
                );
            }
        }
        mix(&mut s.trace, 0xdead ^ epoch);
        s.stats.on_kill(epoch, victims, now);
    }
}

impl<T: Send + 'static> SimEndpoint<T> {
    /// Block this rank until woken (by a delivery if `poll`, else only by the
    /// timer), charging nothing else: suspend its coroutine back to the
    /// scheduler.
    fn block(&self, wake_after: Option<u64>, poll: bool) -> Result<()> {
        {
            let mut s = self.world.sched();
            if s.finished {
                return Err(simulation_ended());
            }
            if self.world.inside.get() != Some(self.entity) {
                // Only reachable if a program kept a communicator past its
                // rank's end: its coroutine (and yielder) are gone.
                return Err(Error::Driver(format!(
                    "simulated rank {} was used outside its own rank function",
                    self.rank
                )));
            }
            s.token += 1;
            let token = s.token;
            s.entities[self.entity].st = if poll {
                St::BlockedPoll(token)
            } else {
                St::BlockedCompute(token)
            };
            if let Some(d) = wake_after {
                let at = s.now.saturating_add(d);
                s.push(
                    at,
                    Ev::Wake {
                        entity: self.entity,
                        token,
                    },
                );
            }
        }
        self.suspend();
        let s = self.world.sched();
        if s.finished && s.running != Some(self.entity) {
            return Err(simulation_ended());
        }
        Ok(())
    }

    /// Give the thread back to the scheduler until it resumes this rank.
    #[allow(unsafe_code)]
    fn suspend(&self) {
        // SAFETY: `yielder` is the one corosensei passed to this rank's
        // coroutine body, and it lives on that coroutine's stack until the
        // body returns. `block` checked that this entity's coroutine is the
        // one running now (the scheduler sets `inside` around each resume),
        // so the body has not returned and this call runs on its stack.
        unsafe { (*self.yielder).suspend(()) }
    }
}

impl<T: Send + 'static> Endpoint for SimEndpoint<T> {
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
        if dest >= self.world.size {
            return Err(Error::RankOutOfRange {
                rank: dest,
                size: self.world.size,
            });
        }
        let mut s = self.world.sched();
        let frame = if s.respawning.is_empty() {
            frame
        } else {
            match s.respawning.hold(self.rank, dest, frame) {
                Some(f) => f,
                None => return Ok(()),
            }
        };
        self.world.transmit(&mut s, self.rank, dest, frame);
        Ok(())
    }

    fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Incoming>> {
        self.slot.alive()?;
        let after = {
            let mut s = self.world.sched();
            let me = &mut s.entities[self.entity];
            if let Some(inc) = me.inbox.pop_front() {
                me.spins = 0;
                return Ok(Some(inc));
            }
            match timeout {
                Some(t) if t.is_zero() => {
                    // A rank that keeps testing must let the others (and
                    // time) move.
                    me.spins += 1;
                    if me.spins < 16 {
                        return Ok(None);
                    }
                    me.spins = 0;
                    Some(100)
                }
                t => t.map(nanos),
            }
        };
        self.block(after, true)?;
        self.slot.alive()?;
        let mut s = self.world.sched();
        Ok(s.entities[self.entity].inbox.pop_front())
    }

    fn now(&self) -> Duration {
        Duration::from_nanos(self.world.sched.borrow().now)
    }

    fn compute(&mut self, d: Duration) -> Result<()> {
        self.slot.alive()?;
        let wait = {
            let mut s = self.world.sched();
            let now = s.now;
            match s.mig.as_mut() {
                // The worker's CPU is shared by the ranks it hosts.
                Some(m) => m.compute(self.rank, now, nanos(d)) - now,
                None => nanos(d),
            }
        };
        self.block(Some(wait), false)?;
        self.slot.alive()
    }

    fn conclude(&mut self, epoch: u64) -> bool {
        let mut s = self.world.sched();
        if s.epoch != epoch {
            return false;
        }
        s.plan.conclude();
        true
    }

    fn fault_point(&mut self, at: &FaultPoint) -> Result<()> {
        self.slot.alive()?;
        let mut s = self.world.sched();
        if s.mig.as_ref().is_some_and(|m| m.armed()) {
            self.world.warn(&mut s, self.rank, at);
        }
        let at = &FaultPoint {
            evacuations: s.mig.as_ref().map_or(0, |m| m.evacuations_in_progress()),
            ..*at
        };
        if let Some((i, victims)) = s.plan.check_indexed(self.rank, at) {
            let node = s.plan.spec(i).and_then(|k| match k.victim {
                Victim::Node(n) => Some(n),
                Victim::Rank(_) => None,
            });
            // With workers, a node takes the ranks that reside on it now.
            let victims = match (s.mig.as_mut(), node) {
                (Some(m), Some(n)) => m.node_died(n),
                _ => victims,
            };
            if !victims.is_empty() {
                self.world.kill(&mut s, &victims);
            }
        }
        drop(s);
        self.slot.alive()
    }

    fn migration_due(&mut self, index: u64) -> bool {
        let mut s = self.world.sched();
        let now = s.now;
        self.safe_point = index;
        s.mig
            .as_mut()
            .is_some_and(|m| m.safe_point(self.rank, index, now))
    }

    fn migrate(&mut self, bytes: u64) -> Result<()> {
        self.slot.alive()?;
        let (to, transfer) = {
            let mut s = self.world.sched();
            let Some(mut m) = s.mig.take() else {
                return Ok(());
            };
            let now = s.now;
            let moving = m
                .depart(self.rank, now, self.safe_point)
                .map(|(from, to, msgs)| {
                    for (w, msg) in msgs {
                        s.push(
                            now + m.hop_ns(from, w, LOCATION_MSG_BYTES),
                            Ev::Locate { to: w, msg },
                        );
                    }
                    (to, m.transfer_ns(self.rank, now, (from, to), bytes))
                });
            s.mig = Some(m);
            match moving {
                Some(x) => x,
                None => return Ok(()),
            }
        };
        // The rank travels: its state crosses the link.
        self.block(Some(transfer), false)?;
        self.slot.alive()?;
        let mut s = self.world.sched();
        let Some(mut m) = s.mig.take() else {
            return Ok(());
        };
        let now = s.now;
        let (held, _) = m.arrive(self.rank, to, bytes, now, self.safe_point);
        for r in held {
            let step = m.reach(to, r);
            s.step(&mut m, to, step);
        }
        s.mig = Some(m);
        mix(
            &mut s.trace,
            0x3c9a_0000 ^ (self.rank as u64) << 20 ^ to as u64,
        );
        Ok(())
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
        let bytes = match &op {
            RmaOp::Put { data, .. } | RmaOp::Accumulate { data, .. } => data.len(),
            RmaOp::Get { len, .. } => *len,
            _ => 8,
        };
        let reply = self.world.windows.rma(epoch, target, id, op)?;
        // The origin waits a round trip (the target's CPU is not involved).
        let (lat, bw) = {
            let s = self.world.sched();
            self.world.link(&s, self.rank, target)
        };
        let rtt = 2 * nanos(lat) + (bytes as f64 / bw * 1e9) as u64;
        self.block(Some(rtt), false)?;
        self.slot.alive()?;
        Ok(reply)
    }

    fn with_local_window(&mut self, id: WinId, f: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        self.world
            .windows
            .with_local_live((self.rank, &self.slot), id, f)
    }

    fn record(&mut self, stat: Stat) {
        let mut s = self.world.sched();
        let (now, epoch) = (Duration::from_nanos(s.now), s.epoch);
        s.stats.record(self.rank, self.world.size, stat, now, epoch);
    }

    fn report_progress(&mut self, _fraction: f64) {}

    fn respawn(&mut self, rank: Rank) -> Result<()> {
        self.slot.alive()?;
        let world = &self.world;
        let mut s = world.sched();
        let Some(&e) = s.current.get(rank) else {
            return Err(Error::RankOutOfRange {
                rank,
                size: world.size,
            });
        };
        let slot = Slot::new(s.entities[e].slot.incarnation + 1);
        let epoch = s.epoch;
        SimWorld::<T>::spawn(&mut s, rank, slot, epoch);
        for (from, frame) in s.respawning.release(rank) {
            world.transmit(&mut s, from, rank, frame);
        }
        s.finals.reopen(rank);
        mix(&mut s.trace, 0x5ba3 ^ rank as u64);
        Ok(())
    }

    fn await_respawn(&mut self, rank: Rank) {
        let mut s = self.world.sched();
        let dead = s
            .current
            .get(rank)
            .is_some_and(|&e| s.entities[e].slot.killed.load(Ordering::SeqCst));
        if dead {
            s.respawning.await_respawn(self.rank, rank);
        }
    }
}

/// Memory a simulated rank needs at the least, measured: two pages of its
/// coroutine stack and about 5 KiB of engine, protocol and communicator
/// state (13.2 kB a rank at 16,384 ranks of the allreduce pattern under
/// `none`; the stencil under `coordinated` takes 17 kB, under
/// `pessimistic` 30 kB, the log included).
pub const MIN_BYTES_PER_RANK: u64 = 12 << 10;

/// Refuse, before anything is allocated per rank, a rank count whose least
/// memory exceeds what the machine has available (`available` bytes;
/// `None` when unknown, which refuses nothing).
fn check_memory(ranks: usize, available: Option<u64>) -> Result<()> {
    let need = ranks as u64 * MIN_BYTES_PER_RANK;
    match available {
        Some(have) if need > have => Err(Error::config(
            "ranks",
            format!(
                "{ranks} simulated ranks need at least {} of memory ({} a rank: its stack and engine), \
                 but {} is available",
                iec(need),
                iec(MIN_BYTES_PER_RANK),
                iec(have)
            ),
        )),
        _ => Ok(()),
    }
}

fn iec(n: u64) -> String {
    bytesize::ByteSize(n).display().iec().to_string()
}

/// Memory available to a new allocation now: Linux's `MemAvailable` plus
/// free swap, from `/proc/meminfo`.
fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let field = |name: &str| -> Option<u64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let kib: u64 = line[name.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    };
    Some(field("MemAvailable:")? + field("SwapFree:").unwrap_or(0))
}

/// Run `f` on `cfg.ranks` simulated ranks.
pub(crate) fn run<T: Send + 'static>(
    cfg: &Config,
    placement: Placement,
    f: Arc<RankFn<T>>,
) -> (Result<Vec<T>>, JobStats, SimReport) {
    let size = cfg.ranks;
    let wall = Instant::now();
    if let Err(e) = check_memory(size, available_memory()) {
        return (Err(e), JobStats::default(), SimReport::default());
    }
    let mig = match Proactive::new(cfg) {
        Ok(m) => m,
        Err(e) => return (Err(e), JobStats::default(), SimReport::default()),
    };
    let world = Rc::new(SimWorld {
        size,
        placement: placement.clone(),
        net: cfg.network,
        cfg: cfg.clone(),
        f,
        replaces: cfg.protocol.replaces_failed_ranks(),
        windows: WindowRegistry::default(),
        sched: RefCell::new(Sched {
            now: 0,
            seq: 0,
            queue: EventQueue::new(),
            pending: EventSlab::default(),
            entities: Vec::with_capacity(size),
            current: Vec::with_capacity(size),
            ready: Vec::new(),
            running: None,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            last_on_channel: HashMap::new(),
            nic_free: vec![0; size],
            trace: 0xcbf2_9ce4_8422_2325,
            events: 0,
            messages: 0,
            bytes: 0,
            epoch: 0,
            plan: FaultPlan::new(&cfg.kills, placement, cfg.seed),
            stats: StatsBook::new(cfg.protocol, cfg.sets, cfg.ranks, cfg.nodes)
                .traced(cfg.trace.is_some(), true),
            finals: Finals::new(size)
                .reporting_failures(cfg.failure_handling == crate::config::FailureHandling::Return),
            respawning: RespawnHold::default(),
            hung: false,
            finished: false,
            token: 0,
            mig,
        }),
        inside: Cell::new(None),
    });
    {
        let mut s = world.sched();
        for r in 0..size {
            SimWorld::<T>::spawn(&mut s, r, Slot::new(0), 0);
        }
    }
    // Stacks for every rank, and for the replacements of a few kills.
    let pool = StackPool::new(size + size.min(64) * cfg.kills.len());
    let driven = world.drive(&pool);
    let mut s = world.sched();
    let mut stats = s.stats.stats.clone();
    stats.wall_s = s.now as f64 * 1e-9;
    stats.unfired_kills = s.plan.unfired().iter().map(|k| k.to_string()).collect();
    stats.migration = s.mig.take().map(|m| m.finish());
    let report = SimReport {
        trace_hash: s.trace,
        events: s.events,
        virtual_s: s.now as f64 * 1e-9,
        wall_s: wall.elapsed().as_secs_f64(),
        hung: s.hung,
        messages: s.messages,
        bytes: s.bytes,
        stack_bytes: pool.resident_bytes(),
        stacks_guarded: pool.guarded(),
    };
    let finals = std::mem::replace(&mut s.finals, Finals::new(0));
    let outcome = if let Err(e) = driven {
        Err(e)
    } else if s.hung {
        Err(Error::Driver(format!(
            "simulated hang at t = {:.6} s (seed {})",
            report.virtual_s, cfg.seed
        )))
    } else {
        finals.finish()
    };
    (outcome, stats, report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_beyond_memory_are_refused_naming_the_setting() {
        let gib = 1u64 << 30;
        assert!(check_memory(1 << 20, Some(24 * gib)).is_ok());
        assert!(check_memory(1 << 20, None).is_ok());
        let e = check_memory(4 << 20, Some(24 * gib)).expect_err("48 GiB at the least");
        match &e {
            Error::Config { option, detail } => {
                assert_eq!(option, "ranks");
                assert!(detail.contains("available"), "{detail}");
            }
            other => panic!("not a configuration error: {other}"),
        }
        assert!(available_memory().is_some_and(|b| b > 0));
    }
}
