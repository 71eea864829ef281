//! ftRMA (003 §3.2–§4): uncoordinated checkpoints, one-sided accesses
//! logged where they are cheap, and causal recovery of a failed rank's
//! window.
//!
//! Under `pessimistic` an access travels as a request and a reply message,
//! each logged, with a determinant per application at the target: a
//! message-logging emulation of RMA that costs a round trip per access and
//! makes the target take part. This protocol keeps accesses one-sided
//! (through the driver, straight into the target's memory) and follows 003:
//!
//! - **LP at the origin** (§3.2.3, Table 2): a PUT or an accumulate is
//!   logged by its origin before it is issued (the payload shared with the
//!   access, not copied), with the order information of §4.1: the window's
//!   GNC (fences entered on the window, pattern E; every fence is
//!   collective over the window's group, so origin and target count alike)
//!   and the origin's epoch counter EC = `E(p -> q)` (pattern A).
//! - **Epoch condition** (§3.2.2): a rank checkpoints only at a safe point
//!   right after a GSYNC, before any communication, so every access with a
//!   smaller GNC than the fences it had entered is in its piece. Once the
//!   piece is stored it says so (`Trim`), and origins drop those accesses.
//! - **M flags** (§4.2): `M_p[q]` is "LP_p[q] holds a combining access" (an
//!   accumulate): one with the GNC of the target's checkpoint may or may
//!   not be in it, and applying it twice is wrong.
//! - **N flags** (§3.2.3, Alg. 1 lines 1 and 8): before its first combining
//!   access to a target in an epoch, an origin sets `N_q[p]` at the target
//!   (and waits for the acknowledgement, as the paper's blocking remote
//!   write does), and clears it when the fence closing the epoch returns.
//!   003 sets N for GETs, whose data is logged only after the epoch; here a
//!   re-executing origin also cannot tell which of its accumulates of an
//!   unfinished epoch were applied (the paper does not re-execute the
//!   failed process's own accesses), so N covers those too.
//! - **Causal recovery** (§4.3, Alg. 2). A replacement restores its piece
//!   (window memory, the fence counts, its own LP), asks every rank for its
//!   N and M flags about it (`Gather`, Alg. 2 lines 4–11) and falls back to
//!   the last coordinated checkpoint when one is set (today the start of
//!   the job: `rma` takes no coordinated checkpoints yet). Otherwise it
//!   re-executes: its messages and collectives come from the senders' logs
//!   (the inner [`Pessimistic`]); its own accesses that come before
//!   messages its receivers already have are skipped (the targets have
//!   them) and logged again; at each fence it enters, before the fence's
//!   barrier, it pulls the window group's logged accesses of the epoch that
//!   closes (`Pull`: the paper's "more memory-efficient scheme" of §4.4,
//!   which fetches logs while recovering) and applies them by minimum GNC,
//!   then EC (Alg. 2 lines 12–26: the epoch's GNC is the minimum left).
//!   Once no rank of the group has passed that fence, it is live on the
//!   window (`Live`): until then other ranks hold their accesses to it
//!   (003 §4.3: "other processes resume their communication with p_new
//!   after it fully recovers"), and a replacement exposes its windows only
//!   once every rank has heard of the failure
//!   ([`Protocol::exposure_ready`]), so nothing meant for its predecessor
//!   lands in them.
//!
//! - **Gets** (§3.2.3, Alg. 1): a read of the target (a get, a fetching
//!   accumulate, a compare-and-swap) sets `N_q[p]` at the target before
//!   the first of its epoch (acknowledged before it is issued); what it
//!   returned goes into Q at the origin, and once the fence closing the
//!   epoch returns, to the target's LG (`LogGets`), then `Close` clears N
//!   (one channel, in that order). A fetching access is also combining,
//!   logged in LP with M. A replacement re-executing an epoch its
//!   predecessor may have closed pulls that epoch's LG from the target
//!   (`PullGets`, Alg. 2's `get_logs`) and answers its reads from it in
//!   issue order (per origin and target that is the GC order of §4.1 B);
//!   a read the predecessor never made is issued. LG lives at the target,
//!   so a target that failed too lost what it logged after its checkpoint
//!   until it went live again: a re-execution that needs such an epoch
//!   falls back. Reads of a target being recovered wait until it is live.
//!
//! - **Lock epochs** (§4.1 C–D): before LOCK(p -> q) the origin fetches
//!   and increments `SC_q` at the target (`LockOpen`; the target sets N
//!   too), and logs the epoch's writes in LP with it; its reads go to Q,
//!   and to the target's LG when a flush or the unlock closes the epoch
//!   (`LogLockGets`), then the unlock clears N (`LockClose`). A target
//!   checkpoints only at a safe point where no lock epoch on it is open
//!   (§3.2.2: "locking the application data"), so its `Trim` cuts LP by
//!   SC.
//!
//! Not yet here (issue 35): the replay of lock epochs (Alg. 3: a recovery
//! whose rank shared one since its checkpoint falls back, `Flags::locks`)
//! and coordinated checkpoints to fall back to.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::pessimistic::{LogMsg, Pessimistic};
use super::{Action, Control, Event, Protocol, ProtocolCx};
use crate::api::datatype::{DType, ReduceOp};
use crate::driver::{RmaOp, Stat, WinId};
use crate::engine::frame::{append_with_blobs, take_with_blobs};
use crate::store::PieceWriter;
use crate::{Error, Rank, Result};

/// Protocol messages of `rma` (in `Control::Access`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AccessMsg {
    /// Origin to target: `N_q[p] := true` on `window` (a combining access
    /// is about to be issued in this epoch); answered by `Opened`.
    Open {
        /// Window.
        window: WinId,
    },
    /// Target to origin: the N flag is set.
    Opened {
        /// Window.
        window: WinId,
    },
    /// Origin to target: `N_q[p] := false` on `window` (the epoch closed).
    Close {
        /// Window.
        window: WinId,
    },
    /// A rank's checkpoint is stored, taken with these fences entered per
    /// window: accesses to it with a smaller GNC are in it (§3.2.2).
    Trim {
        /// `(window, fences entered)` at the capture.
        fences: Vec<(WinId, u64)>,
        /// Where its passive-target epochs stood at the capture.
        locks: LockCut,
    },
    /// Origin to target, before the lock of a passive-target epoch: fetch
    /// and increment `SC_q` (003 §4.1 C) and set `N_q[p]` (the epoch is
    /// open); answered by `LockOpened`.
    LockOpen {
        /// Window.
        window: WinId,
    },
    /// Target to origin: the epoch's SC (its accesses carry it).
    LockOpened {
        /// Window.
        window: WinId,
        /// `SC_q` before the increment.
        sc: u64,
    },
    /// Origin to target, after the unlock: the epoch closed (`N_q[p] :=
    /// false`), the `closes`-th passive-target epoch the origin closed.
    LockClose {
        /// Window.
        window: WinId,
        /// The origin's count of closed passive-target epochs.
        closes: u64,
    },
    /// Origin to target, when a passive-target epoch closes (unlock or
    /// flush): the data its gets there returned, for `LG_q[p]` (003 Alg. 1
    /// lines 4–7, §4.1 D), numbered per origin.
    LogLockGets {
        /// Window.
        window: WinId,
        /// The origin's count of such messages before this one.
        seq: u64,
        /// What each returned, in issue order.
        gets: Reads,
    },
    /// A replacement asks every rank for its flags about it (Alg. 2 lines
    /// 4–11).
    Gather,
    /// The answer: `N_q[p_f]` (any window) and `M_q[p_f]`, with the
    /// fences the sender has completed per window.
    Flags {
        /// An origin-side epoch with combining accesses was open.
        n: bool,
        /// The log holds a combining access to the replacement's rank.
        m: bool,
        /// The replacement's predecessor took part in a passive-target
        /// epoch with the sender since its checkpoint (its accesses there,
        /// or the sender's to it, would be replayed by 003 Alg. 3, which
        /// is not implemented yet).
        locks: bool,
        /// `(window, fences completed)`.
        done: Vec<(WinId, u64)>,
    },
    /// A replacement entering a fence on `window`: the accesses logged for
    /// it with GNC `epoch` (the epoch that closes).
    Pull {
        /// Window.
        window: WinId,
        /// GNC asked for.
        epoch: u64,
    },
    /// The answer to `Pull`, with the fences the sender has entered on the
    /// window (more than the replacement's: it is still behind).
    Pulled {
        /// Window.
        window: WinId,
        /// GNC.
        epoch: u64,
        /// Fences the sender has entered on `window`.
        entered: u64,
        /// Fences the sender has completed on `window`.
        done: u64,
        /// The accesses, as `(EC, access)`, in issue order.
        accesses: Vec<(u64, RmaOp)>,
    },
    /// A replacement not yet live on `window` has replayed the epochs
    /// before `epoch`: its window is as the fence opening `epoch` left it,
    /// so reads of that epoch may go ahead (writes are still held).
    Readable {
        /// Window.
        window: WinId,
        /// Fences the replacement has entered on it.
        epoch: u64,
    },
    /// A replacement is live on `window`: accesses to it go ahead through
    /// the driver from now on; answered by `LiveAck`.
    Live {
        /// Window.
        window: WinId,
    },
    /// Origin to target, once the epoch `epoch` on `window` closed: the
    /// data of the gets (and fetching accesses) it made to the target in
    /// it, in issue order, for `LG_q[p]` (003 Alg. 1 lines 4–7).
    LogGets {
        /// Window.
        window: WinId,
        /// GNC of the epoch.
        epoch: u64,
        /// What each returned.
        gets: Reads,
    },
    /// A replacement re-executing epoch `epoch` on `window` asks a target
    /// for the gets its predecessor logged there (`LG_q[p_f]`).
    PullGets {
        /// Window.
        window: WinId,
        /// GNC asked for.
        epoch: u64,
    },
    /// The answer to `PullGets`, in issue order; `lost`: the target is a
    /// replacement itself whose log of that epoch may have been lost with
    /// its predecessor (received after its checkpoint).
    PulledGets {
        /// Window.
        window: WinId,
        /// GNC.
        epoch: u64,
        /// The logged data.
        gets: Vec<Bytes>,
        /// The log of this epoch may be incomplete.
        lost: bool,
    },
    /// The sender holds no more accesses for the replacement on `window`;
    /// those it held have at most the GNC `entered` (its fences entered).
    LiveAck {
        /// Window.
        window: WinId,
        /// Fences the sender had entered on `window`.
        entered: u64,
    },
}

/// What an epoch's reads returned, in issue order, in one buffer: one
/// allocation on the wire and at the target per epoch and target, not one
/// per read (a DHT's reads are 8 bytes each). The target's LG entries are
/// slices of it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reads {
    data: Bytes,
    lens: Vec<u32>,
}

impl Reads {
    /// `items`, in order, copied into one buffer.
    pub fn of(items: &[Bytes]) -> Reads {
        let mut data = Vec::with_capacity(items.iter().map(Bytes::len).sum());
        let mut lens = Vec::with_capacity(items.len());
        for b in items {
            data.extend_from_slice(b);
            // A read returns at most a window's worth: far below 4 GiB.
            lens.push(u32::try_from(b.len()).unwrap_or(u32::MAX));
        }
        Reads {
            data: data.into(),
            lens,
        }
    }

    /// The reads, in order (slices of the buffer). A length past its end
    /// (a corrupt message) gives what is left.
    pub fn items(&self) -> impl Iterator<Item = Bytes> + '_ {
        let mut at = 0usize;
        self.lens.iter().map(move |&n| {
            let end = at.saturating_add(n as usize).min(self.data.len());
            let item = self.data.slice(at.min(end)..end);
            at = end;
            item
        })
    }
}

/// Which accesses `rma` logs: 003 §7.2.2's two ftRMA variants.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessLogging {
    /// Writes at their origin (LP) and reads at their target (LG):
    /// "f-puts-gets". A re-executed read is answered from LG.
    #[default]
    PutsGets,
    /// Writes only: "f-puts". Reads still set N, but what they returned
    /// is not logged, so a re-execution that reads again in an epoch its
    /// predecessor closed falls back.
    Puts,
}

impl AccessLogging {
    /// Every variant, as the command line names them.
    pub const ALL: [AccessLogging; 2] = [AccessLogging::PutsGets, AccessLogging::Puts];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AccessLogging::PutsGets => "puts-gets",
            AccessLogging::Puts => "puts",
        }
    }
}

impl std::str::FromStr for AccessLogging {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("`{s}` is not one of puts-gets, puts"))
    }
}

/// Where a rank's passive-target epochs stood when it captured a
/// checkpoint (the §6.2 confirmation's counters, for lock codes).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LockCut {
    /// `SC_q` per window: accesses to it with a smaller SC are in the
    /// checkpoint (no passive-target epoch on it was open: §3.2.2's lock
    /// of the local data).
    pub sc: Vec<(WinId, u64)>,
    /// `LogLockGets` sent before: the gets they logged are not read again.
    pub gets_sent: u64,
    /// Passive-target epochs closed before.
    pub closes: u64,
}

/// One entry of `LP_p[q]` (003 Table 2) with its §4.1 order information.
#[derive(Debug, Clone, PartialEq)]
struct Logged {
    window: WinId,
    /// Fences entered on the window when it was issued (GNC).
    gnc: u64,
    /// The origin's epoch counter `E(p -> q)` (EC).
    ec: u64,
    /// The target's SC of the passive-target epoch it was issued in (003
    /// §4.1 C); `None` in a fence epoch.
    sc: Option<u64>,
    op: RmaOp,
    /// May be pulled by a replacement of the target: every access but
    /// those issued to a replacement after it said it is live (which has
    /// them). An access held for a recovering target has it too.
    held: bool,
}

impl Logged {
    fn combining(&self) -> bool {
        self.op.combines()
    }

    fn bytes(&self) -> usize {
        match &self.op {
            RmaOp::Put { data, .. } | RmaOp::Accumulate { data, .. } => data.len(),
            RmaOp::CompareAndSwap { compare, swap, .. } => compare.len() + swap.len(),
            _ => 0,
        }
    }
}

/// What a deferred read waits for.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ReadWait {
    /// The target's log of `(target, window, epoch)` (`PullGets`).
    Log(Rank, WinId, u64),
    /// Target `.0`, being recovered, to have replayed up to epoch `.2` of
    /// window `.1` (`Readable`, or `Live`).
    Target(Rank, WinId, u64),
}

/// One entry of `LG_q[p]` (003 Table 2), kept at the target: what a get
/// of `p` returned, logged once its epoch closed.
#[derive(Debug, Clone, PartialEq)]
struct LoggedGet {
    window: WinId,
    /// The epoch's GNC.
    gnc: u64,
    /// In a passive-target epoch: the `LogLockGets` it came in.
    seq: Option<u64>,
    data: Bytes,
}

/// An access as a piece saves it: its payload is a blob of its own (two
/// for a compare-and-swap: compare, then swap).
#[derive(Debug, Serialize, Deserialize)]
enum SavedOp {
    Put {
        offset: usize,
    },
    Accumulate {
        offset: usize,
        dtype: DType,
        op: ReduceOp,
        fetch: bool,
    },
    CompareAndSwap {
        offset: usize,
        dtype: DType,
    },
}

#[derive(Debug, Serialize, Deserialize)]
struct SavedAccess {
    window: WinId,
    gnc: u64,
    ec: u64,
    sc: Option<u64>,
    op: SavedOp,
}

/// An LG entry as a piece saves it: `(window, GNC, seq)`.
type SavedGet = (WinId, u64, Option<u64>);

#[derive(Debug, Serialize, Deserialize)]
struct SavedState {
    fences: Vec<(WinId, u64)>,
    lp: Vec<(Rank, Vec<SavedAccess>)>,
    /// LG: per origin, `(window, GNC, seq)` of each logged get, whose
    /// data are the blobs after LP's.
    lg: Vec<(Rank, Vec<SavedGet>)>,
    /// SC, `LogLockGets` sent and passive-target epochs closed.
    locks: LockCut,
}

/// A pull of one epoch's accesses, while its answers come in.
#[derive(Debug)]
struct Pull {
    epoch: u64,
    waiting: BTreeSet<Rank>,
    got: Vec<(u64, Rank, RmaOp)>,
    /// Some rank has entered more fences than this one: still behind.
    behind: bool,
}

/// A replacement's causal recovery (Alg. 2).
#[derive(Debug, Default)]
struct Recovery {
    /// Ranks whose N and M flags have not come.
    flags_pending: BTreeSet<Rank>,
    /// Per window, the pull under way.
    pulls: BTreeMap<WinId, Pull>,
    /// Windows this replacement is live on: the ranks that have not
    /// acknowledged it yet, and the most fences entered by one that did
    /// (epochs up to there may still hold accesses for it).
    live: BTreeMap<WinId, (BTreeSet<Rank>, u64)>,
    /// Gets of the predecessor per `(target, window, epoch)`, as the
    /// target logged them, taken in issue order by the re-execution.
    gets: BTreeMap<(Rank, WinId, u64), VecDeque<Bytes>>,
    /// `PullGets` sent, not answered.
    asking: BTreeSet<(Rank, WinId, u64)>,
}

impl Recovery {
    /// Whether the epoch `closing` on `window` must be pulled.
    fn pulls_epoch(&self, window: WinId, closing: u64) -> bool {
        self.live
            .get(&window)
            .is_none_or(|(unacked, last)| !unacked.is_empty() || closing <= *last)
    }
}

/// The passive-target (lock) side of a rank: as an origin and as a target.
#[derive(Debug, Default)]
struct Locks {
    /// Target: `SC_q` per window.
    sc: BTreeMap<WinId, u64>,
    /// Target: the origins' open passive-target epochs on it.
    open_here: BTreeSet<(Rank, WinId)>,
    /// Target: per origin, the most passive-target epochs it said it had
    /// closed (`LockClose`), and as many as its last checkpoint had.
    closes_from: BTreeMap<Rank, (u64, u64)>,
    /// Target: lock requests that wait until this replacement caught up.
    queued: Vec<(Rank, WinId)>,
    /// Origin: the SC of each open passive-target epoch, by target.
    open: BTreeMap<(Rank, WinId), u64>,
    /// Origin: of those, the ones whose target died since they opened.
    stale: BTreeSet<(Rank, WinId)>,
    /// Origin: a lock that waits until its target's replacement announced
    /// itself.
    waiting: Option<(Rank, WinId)>,
    /// Origin: `LogLockGets` sent.
    gets_sent: u64,
    /// Origin: passive-target epochs closed.
    closes: u64,
    /// Replacements that announced themselves (`Gather`).
    announced: BTreeSet<Rank>,
}

impl Locks {
    /// Where the epochs stand, for a checkpoint's `Trim`.
    fn cut(&self) -> LockCut {
        LockCut {
            sc: self.sc.iter().map(|(&w, &n)| (w, n)).collect(),
            gets_sent: self.gets_sent,
            closes: self.closes,
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq)]
struct Counters {
    logged: u64,
    logged_bytes: u64,
    replayed: u64,
    skipped: u64,
    held: u64,
    fallbacks: u64,
    demanded: u64,
    gets_logged: u64,
    get_bytes: u64,
    gets_replayed: u64,
}

/// State of the `rma` protocol on one rank.
#[derive(Debug)]
pub struct Rma {
    /// Messages and collectives: pessimistic sender-based logging.
    p2p: Pessimistic,
    /// Fences entered per window (the GNC of accesses on it).
    fences: BTreeMap<WinId, u64>,
    /// Fences completed per window (their barriers returned).
    done: BTreeMap<WinId, u64>,
    /// The most fences each other rank said it had completed per window:
    /// an access of an epoch it has closed for good reached it already.
    peer_done: BTreeMap<(Rank, WinId), u64>,
    /// LP: accesses this rank issued to each other rank, in issue order.
    lp: BTreeMap<Rank, VecDeque<Logged>>,
    /// Payload bytes in `lp`.
    lp_bytes: usize,
    /// Ranks being recovered, with the windows they are live on again
    /// (accesses to them on other windows are held in the log, not
    /// issued, and pulled by them).
    recovering: BTreeMap<Rank, BTreeSet<WinId>>,
    /// Pulls that wait until this rank closes the epoch they ask for:
    /// `(replacement, window, epoch)`.
    deferred_pulls: Vec<(Rank, WinId, u64)>,
    /// `N_q[p]` held here: origins with an epoch of combining accesses to
    /// this rank open, per window.
    n_flags: BTreeSet<(Rank, WinId)>,
    /// Targets whose N flag this rank set in the open epoch, per window.
    opened: BTreeSet<(Rank, WinId)>,
    /// Of those, the ones not acknowledged yet (accesses wait).
    opening: BTreeSet<(Rank, WinId)>,
    /// Captured, not yet stored: generation → fences entered per window.
    capturing: BTreeMap<u64, (Vec<(WinId, u64)>, LockCut)>,
    /// A replacement's recovery, until it is live on every window it
    /// fences.
    recovery: Option<Recovery>,
    /// `--log-budget`: past half of it, the target with the most logged
    /// bytes is asked for a checkpoint (003 §6.2's demand checkpoint).
    log_budget: Option<usize>,
    /// Ranks asked for a demand checkpoint that have not trimmed since.
    asked: BTreeSet<Rank>,
    /// Logged bytes (LP and LG) at which the log is looked at again for a
    /// demand checkpoint: finding the largest rank walks the whole log, so
    /// it is done once per eighth of the budget of growth, not per access
    /// (per access it made a DHT run under a small budget 15× slower).
    next_demand_check: usize,
    /// Q: what this rank's gets returned in the open epochs, by target
    /// and window, in issue order (003 Alg. 1 line 3), sent to the targets'
    /// LG when the epoch closes.
    q: Vec<(Rank, WinId, Bytes)>,
    /// LG: the gets other ranks made to this one, by origin.
    lg: BTreeMap<Rank, VecDeque<LoggedGet>>,
    /// Data bytes in `lg`.
    lg_bytes: usize,
    /// A replacement's fences at its checkpoint, per window: gets logged
    /// here from the epoch before on, until it went live (`live_at`), may
    /// have been lost with its predecessor.
    lg_lost_from: Option<BTreeMap<WinId, u64>>,
    /// The fences at which this replacement went live, per window.
    live_at: BTreeMap<WinId, u64>,
    /// A read deferred, and what it waits for.
    waiting_get: Option<ReadWait>,
    /// Replacements not yet live, per window: the epoch their window is
    /// in (`Readable`).
    readable: BTreeMap<(Rank, WinId), u64>,
    /// Passive-target epochs (003 §4.1 C–D).
    locks: Locks,
    /// Whether reads are logged (LG).
    logging: AccessLogging,
    counters: Counters,
    reported: Counters,
}

impl Rma {
    /// Over `p2p`, the logging of messages (its checkpoint schedule, log
    /// budget and spill).
    pub(crate) fn with_p2p(p2p: Pessimistic) -> Self {
        Rma {
            p2p,
            fences: BTreeMap::new(),
            done: BTreeMap::new(),
            peer_done: BTreeMap::new(),
            lp: BTreeMap::new(),
            lp_bytes: 0,
            recovering: BTreeMap::new(),
            deferred_pulls: Vec::new(),
            n_flags: BTreeSet::new(),
            opened: BTreeSet::new(),
            opening: BTreeSet::new(),
            capturing: BTreeMap::new(),
            recovery: None,
            log_budget: None,
            asked: BTreeSet::new(),
            next_demand_check: 0,
            q: Vec::new(),
            lg: BTreeMap::new(),
            lg_bytes: 0,
            lg_lost_from: None,
            live_at: BTreeMap::new(),
            waiting_get: None,
            readable: BTreeMap::new(),
            locks: Locks::default(),
            logging: AccessLogging::default(),
            counters: Counters::default(),
            reported: Counters::default(),
        }
    }

    fn send(cx: &mut ProtocolCx<'_>, dest: Rank, m: AccessMsg) {
        cx.emit(Action::Transmit {
            dest,
            msg: Control::Access(m),
        });
    }

    /// Log the accesses `logging` says (003 §7.2.2's f-puts or
    /// f-puts-gets).
    pub(crate) fn with_logging(mut self, logging: AccessLogging) -> Self {
        self.logging = logging;
        self
    }

    /// Ask targets for demand checkpoints once the access log passes half
    /// of `log_budget` (003 §6.2: "the target checkpoints, sources trim").
    pub(crate) fn with_log_budget(mut self, log_budget: Option<usize>) -> Self {
        self.log_budget = log_budget;
        self
    }

    /// Past half the budget: the rank with the most bytes logged for it,
    /// not asked yet, checkpoints at its next safe point that meets the
    /// epoch condition; its `Trim` shrinks this log (LP for a target's
    /// checkpoint, LG for an origin's).
    fn demand_checkpoint(&mut self, cx: &mut ProtocolCx<'_>) {
        let Some(budget) = self.log_budget else {
            return;
        };
        let logged = self.lp_bytes + self.lg_bytes;
        if logged <= budget / 2 || logged < self.next_demand_check {
            return;
        }
        self.next_demand_check = logged + (budget / 8).max(1);
        let mut per_rank: BTreeMap<Rank, usize> = BTreeMap::new();
        for (&t, log) in &self.lp {
            *per_rank.entry(t).or_default() += log.iter().map(Logged::bytes).sum::<usize>();
        }
        for (&o, log) in &self.lg {
            *per_rank.entry(o).or_default() += log.iter().map(|g| g.data.len()).sum::<usize>();
        }
        let largest = (per_rank.into_iter())
            .filter(|(r, _)| !self.asked.contains(r))
            .map(|(r, bytes)| (bytes, r))
            .max();
        if let Some((bytes, t)) = largest
            && bytes > 0
        {
            self.asked.insert(t);
            self.counters.demanded += 1;
            cx.emit(Action::Transmit {
                dest: t,
                msg: Control::Log(LogMsg::CheckpointRequest),
            });
        }
    }

    /// Log an access before it is issued; skip it when the target has it,
    /// answer a re-executed get from the target's log.
    fn on_access(
        &mut self,
        (window, target): (WinId, Rank),
        op: &RmaOp,
        ec: u64,
        regenerating: bool,
        cx: &mut ProtocolCx<'_>,
    ) {
        self.waiting_get = None;
        let gnc = self.entered(window);
        if let Some(&sc) = self.locks.open.get(&(target, window)) {
            self.on_locked_access((window, target), op, (gnc, ec, sc), cx);
            return;
        }
        if op.reads_target() && self.read_replayed((window, target), op, gnc, ec, cx) {
            return;
        }
        // A rank being recovered pulls what is held for it at its fences;
        // an access issued to it once it is live must not be pulled again.
        let live = self
            .recovering
            .get(&target)
            .map(|live| live.contains(&window));
        let held = live == Some(false);
        if op.reads_target() {
            if held && !self.readable_in(target, window, gnc) {
                // A read needs the window as this epoch has it: it waits
                // until the target has replayed up to here.
                self.waiting_get = Some(ReadWait::Target(target, window, gnc));
                cx.emit(Action::DeferAccess);
                return;
            }
            // Alg. 1 line 1: N_q[p] before the first get of the epoch. The
            // data is logged once it is read (`Event::Fetched`).
            self.open_epoch(target, window, cx);
            if !op.combines() {
                return;
            }
        }
        let logged = Logged {
            window,
            gnc,
            ec,
            sc: None,
            op: op.clone(),
            held: live != Some(true),
        };
        let combining = logged.combining();
        self.log_access(target, logged, cx);
        if op.reads_target() {
            return; // issued: the first execution did not make it
        }
        // The first execution applied it already when it came before
        // messages a receiver has (`regenerating`), or when the target has
        // completed the fence that closes its epoch (all its origins had
        // entered that fence, so completed the epoch's accesses). Neither
        // holds only where the target cannot have completed that fence
        // yet: no later message of the first execution reached a live
        // rank, so it waits for this re-execution's, and nobody writes the
        // accessed memory before (MPI's epoch rule): issuing it again is
        // harmless for a put; an accumulate's epoch has its N flag.
        let closed = (self.peer_done.get(&(target, window))).is_some_and(|&d| d > gnc);
        if held {
            self.counters.held += 1;
            cx.emit(Action::SkipAccess);
        } else if regenerating || closed {
            // Logged again, not applied twice.
            self.counters.skipped += 1;
            cx.emit(Action::SkipAccess);
        } else if combining {
            self.open_epoch(target, window, cx);
        }
    }

    /// An access in a passive-target epoch (003 §4.1 C–D): logged in LP
    /// with its SC (a write), or in Q (a read, once it returned). None of
    /// them was made by a predecessor this rank re-executes for (that
    /// recovery falls back: `Flags::locks`), so each is issued, unless the
    /// target died in the epoch: then it is held, and a read waits (the
    /// target's replacement falls back, the epoch being open).
    fn on_locked_access(
        &mut self,
        (window, target): (WinId, Rank),
        op: &RmaOp,
        (gnc, ec, sc): (u64, u64, u64),
        cx: &mut ProtocolCx<'_>,
    ) {
        let stale = self.locks.stale.contains(&(target, window));
        if op.reads_target() {
            if stale {
                self.waiting_get = Some(ReadWait::Target(target, window, u64::MAX));
                cx.emit(Action::DeferAccess);
                return;
            }
            if !op.combines() {
                return;
            }
        }
        let logged = Logged {
            window,
            gnc,
            ec,
            sc: Some(sc),
            op: op.clone(),
            held: true,
        };
        self.log_access(target, logged, cx);
        if stale {
            self.counters.held += 1;
            cx.emit(Action::SkipAccess);
        }
    }

    /// LOCK(p -> q) is next: fetch `SC_q` and set `N_q[p]` first (accesses
    /// wait for the answer), at the target's replacement once it announced
    /// itself if the target died.
    fn on_lock_open(&mut self, window: WinId, target: Rank, cx: &mut ProtocolCx<'_>) {
        self.locks.waiting = None;
        if self.opened.contains(&(target, window)) {
            return;
        }
        if self.recovering.contains_key(&target) && !self.locks.announced.contains(&target) {
            self.locks.waiting = Some((target, window));
            return;
        }
        self.opened.insert((target, window));
        self.opening.insert((target, window));
        Self::send(cx, target, AccessMsg::LockOpen { window });
    }

    /// The epoch to `target` on `window` closed (an unlock if `unlock`, else
    /// a flush): its gets go to the target's LG, then an unlock clears the
    /// N flag (Alg. 1 lines 4–8, one channel, so in that order).
    fn close_lock_epoch(
        &mut self,
        (window, target): (WinId, Rank),
        unlock: bool,
        cx: &mut ProtocolCx<'_>,
    ) {
        let mut gets = Vec::new();
        self.q.retain(|(t, w, data)| {
            let this = (*t, *w) == (target, window);
            if this {
                gets.push(data.clone());
            }
            !this
        });
        // A target that died in the epoch has no LG for it any more.
        if !gets.is_empty() && !self.locks.stale.contains(&(target, window)) {
            let seq = self.locks.gets_sent;
            self.locks.gets_sent += 1;
            let gets = Reads::of(&gets);
            Self::send(cx, target, AccessMsg::LogLockGets { window, seq, gets });
        }
        if !unlock {
            return;
        }
        self.locks.open.remove(&(target, window));
        self.locks.stale.remove(&(target, window));
        self.opening.remove(&(target, window));
        if self.opened.remove(&(target, window)) {
            self.locks.closes += 1;
            Self::send(
                cx,
                target,
                AccessMsg::LockClose {
                    window,
                    closes: self.locks.closes,
                },
            );
        }
    }

    /// Target: open an origin's passive-target epoch (`SC_q`, fetched and
    /// incremented, and `N_q[p]`).
    fn grant_lock(&mut self, origin: Rank, window: WinId, cx: &mut ProtocolCx<'_>) {
        let sc = self.locks.sc.entry(window).or_insert(0);
        let at = *sc;
        *sc += 1;
        self.n_flags.insert((origin, window));
        self.locks.open_here.insert((origin, window));
        Self::send(cx, origin, AccessMsg::LockOpened { window, sc: at });
    }

    /// Whether locks of this rank's windows wait: at a replacement, until
    /// it has heard every rank's flags and regenerated what receivers
    /// already have. An epoch opened before then would be
    /// one the first execution ordered after this rank's messages, whose
    /// re-execution could then read what it writes (003 §4.3: "other
    /// processes resume their communication with p_new after it fully
    /// recovers").
    fn holds_locks(&self, cx: &ProtocolCx<'_>) -> bool {
        self.recovery.is_some() && (!self.flags_known() || self.p2p.regenerating(cx.ssn_out))
    }

    /// Grant the locks that waited, once nothing holds them.
    fn release_locks(&mut self, cx: &mut ProtocolCx<'_>) {
        if self.locks.queued.is_empty() || self.holds_locks(cx) {
            return;
        }
        for (origin, window) in std::mem::take(&mut self.locks.queued) {
            self.grant_lock(origin, window, cx);
        }
    }

    /// Whether a lock waits for its target's replacement to announce
    /// itself.
    fn lock_waits(&self, target: Rank, window: WinId) -> bool {
        self.locks.waiting == Some((target, window))
            && self.recovering.contains_key(&target)
            && !self.locks.announced.contains(&target)
    }

    /// Whether this rank took part in passive-target epochs (a replacement
    /// that did cannot say what its predecessor had since its checkpoint).
    fn any_passive(&self) -> bool {
        !self.locks.sc.is_empty()
            || self.locks.closes > 0
            || !self.locks.open.is_empty()
            || self.lp.values().flatten().any(|a| a.sc.is_some())
    }

    /// Append `a` to `LP_p[target]`.
    fn log_access(&mut self, target: Rank, a: Logged, cx: &mut ProtocolCx<'_>) {
        self.counters.logged += 1;
        self.counters.logged_bytes += a.bytes() as u64;
        self.lp_bytes += a.bytes();
        self.lp.entry(target).or_default().push_back(a);
        self.demand_checkpoint(cx);
    }

    /// Set `N_q[p]` at `target` for this epoch on `window`, once (accesses
    /// wait for the acknowledgement: [`Protocol::access_ready`]).
    fn open_epoch(&mut self, target: Rank, window: WinId, cx: &mut ProtocolCx<'_>) {
        if self.opened.insert((target, window)) {
            self.opening.insert((target, window));
            Self::send(cx, target, AccessMsg::Open { window });
        }
    }

    /// A re-execution's read of an epoch its predecessor may have closed:
    /// answered from `LG_q[p_f]` (pulled from the target first: deferred)
    /// when the predecessor made it; then a fetching access is logged
    /// again, not applied twice (the epoch closed, so the target has it).
    /// Returns whether the access is answered or deferred.
    fn read_replayed(
        &mut self,
        (window, target): (WinId, Rank),
        op: &RmaOp,
        gnc: u64,
        ec: u64,
        cx: &mut ProtocolCx<'_>,
    ) -> bool {
        // Once live on the window, no rank has closed the epoch this
        // replacement is in: its predecessor logged no get of it.
        let Some(rec) = self
            .recovery
            .as_mut()
            .filter(|r| !r.live.contains_key(&window))
        else {
            return false;
        };
        let key = (target, window, gnc);
        let Some(logged) = rec.gets.get_mut(&key) else {
            if rec.asking.insert(key) {
                Self::send(cx, target, AccessMsg::PullGets { window, epoch: gnc });
            }
            self.waiting_get = Some(ReadWait::Log(target, window, gnc));
            cx.emit(Action::DeferAccess);
            return true;
        };
        // None left: the predecessor died before this read.
        let Some(data) = logged.pop_front() else {
            return false;
        };
        let expected = match op {
            RmaOp::Get { len, .. } => *len,
            RmaOp::Accumulate { data, .. } => data.len(),
            RmaOp::CompareAndSwap { compare, .. } => compare.len(),
            _ => data.len(),
        };
        if data.len() != expected {
            cx.emit(Action::Fail(Error::Rma {
                window,
                detail: format!(
                    "a re-executed read of rank {target} asks {expected} bytes where the first \
                     execution read {}: the rank function is not deterministic",
                    data.len()
                ),
            }));
            return true;
        }
        self.counters.gets_replayed += 1;
        if op.combines() {
            self.counters.skipped += 1;
            let held = self.recovering.get(&target).map(|l| l.contains(&window)) != Some(true);
            let logged = Logged {
                window,
                gnc,
                ec,
                sc: None,
                op: op.clone(),
                held,
            };
            self.log_access(target, logged, cx);
        }
        cx.emit(Action::AnswerAccess(data));
        true
    }

    /// A read returned `data`: `Q_p := Q_p ∪ #get` (Alg. 1 line 3).
    fn on_fetched(&mut self, window: WinId, target: Rank, data: &Bytes) {
        if self.logging == AccessLogging::Puts {
            return;
        }
        self.counters.gets_logged += 1;
        self.counters.get_bytes += data.len() as u64;
        self.q.push((target, window, data.clone()));
    }

    /// The fence closing an epoch on `window` returned: its gets go to
    /// their targets' LG, then their N flags are cleared (Alg. 1 lines
    /// 4–8; one channel, so in that order).
    fn close_epoch(&mut self, window: WinId, cx: &mut ProtocolCx<'_>) {
        let epoch = self
            .fences
            .get(&window)
            .copied()
            .unwrap_or(0)
            .saturating_sub(1);
        let mut gets: BTreeMap<Rank, Vec<Bytes>> = BTreeMap::new();
        self.q.retain(|(t, w, data)| {
            if *w != window {
                return true;
            }
            gets.entry(*t).or_default().push(data.clone());
            false
        });
        for (t, gets) in gets {
            Self::send(
                cx,
                t,
                AccessMsg::LogGets {
                    window,
                    epoch,
                    gets: Reads::of(&gets),
                },
            );
        }
        let closed: Vec<(Rank, WinId)> = (self.opened.iter())
            .filter(|&&(_, w)| w == window)
            .copied()
            .collect();
        for (t, w) in closed {
            self.opened.remove(&(t, w));
            Self::send(cx, t, AccessMsg::Close { window: w });
        }
    }

    /// Whether gets of `epoch` on `window` logged here may have been lost
    /// with this rank's predecessor: received after its checkpoint (the
    /// epoch before it on: they arrive after the fence closing their
    /// epoch) and before it went live (from then on, no rank had closed
    /// an epoch it had not).
    fn lg_lost(&self, window: WinId, epoch: u64) -> bool {
        self.lg_lost_from.as_ref().is_some_and(|from| {
            epoch + 1 >= from.get(&window).copied().unwrap_or(0)
                && self.live_at.get(&window).is_none_or(|&at| epoch < at)
        })
    }

    fn on_fence_enter(&mut self, window: WinId, group: &[Rank], cx: &mut ProtocolCx<'_>) {
        let entered = self.fences.entry(window).or_insert(0);
        *entered += 1;
        let (entered, closing) = (*entered, *entered - 1);
        // Pulls of the epoch that closes here can be answered now: every
        // access of it was logged.
        let due: Vec<(Rank, WinId, u64)> = (self.deferred_pulls.iter())
            .filter(|&&(_, w, e)| w == window && e < entered)
            .copied()
            .collect();
        self.deferred_pulls
            .retain(|&(_, w, e)| !(w == window && e < entered));
        for (r, w, e) in due {
            self.answer_pull(r, w, e, cx);
        }
        let Some(rec) = self.recovery.as_mut() else {
            return;
        };
        if !rec.pulls_epoch(window, closing) {
            return;
        }
        let waiting: BTreeSet<Rank> = group.iter().copied().filter(|&r| r != cx.rank).collect();
        for &r in &waiting {
            Self::send(
                cx,
                r,
                AccessMsg::Pull {
                    window,
                    epoch: closing,
                },
            );
        }
        rec.pulls.insert(
            window,
            Pull {
                epoch: closing,
                waiting,
                got: Vec::new(),
                behind: false,
            },
        );
        self.try_replay(window, cx);
    }

    /// Replay the epoch pulled on `window` once every answer is in (Alg. 2
    /// lines 12–26: every access pulled has the minimum GNC left; by
    /// minimum EC, then any order), and go live when no rank is ahead.
    fn try_replay(&mut self, window: WinId, cx: &mut ProtocolCx<'_>) {
        let Some(rec) = self.recovery.as_mut() else {
            return;
        };
        if !rec.flags_pending.is_empty() {
            return; // the fallback decision comes first
        }
        let done = rec.pulls.get(&window).is_some_and(|p| p.waiting.is_empty());
        if !done {
            return;
        }
        let Some(mut pull) = rec.pulls.remove(&window) else {
            return;
        };
        pull.got.sort_by_key(|&(ec, origin, _)| (ec, origin));
        for (_, _, op) in pull.got {
            self.counters.replayed += 1;
            cx.emit(Action::ApplyAccess { window, op });
        }
        let entered = self.fences.get(&window).copied().unwrap_or(0);
        if pull.behind {
            // A rank ahead may be reading this epoch of the window, which
            // is as it was now (the next fence's pull waits for every
            // reader to close the epoch).
            cx.broadcast(&Control::Access(AccessMsg::Readable {
                window,
                epoch: entered,
            }));
        }
        // No rank has passed this fence: this rank is at the front, its
        // window as it would have been. Until every rank acknowledges, some
        // may still hold accesses for it, which later pulls fetch.
        if !pull.behind && !rec.live.contains_key(&window) {
            let others = (0..cx.size).filter(|&r| r != cx.rank).collect();
            rec.live.insert(window, (others, 0));
            self.live_at.insert(window, entered);
            cx.broadcast(&Control::Access(AccessMsg::Live { window }));
        }
    }

    /// Answer a replacement's pull of `epoch` on `window` (this rank has
    /// closed that epoch).
    fn answer_pull(&self, r: Rank, window: WinId, epoch: u64, cx: &mut ProtocolCx<'_>) {
        let accesses = (self.lp.get(&r).into_iter().flatten())
            .filter(|a| a.held && a.sc.is_none() && a.window == window && a.gnc == epoch)
            .map(|a| (a.ec, a.op.clone()))
            .collect();
        let entered = self.entered(window);
        let done = self.done.get(&window).copied().unwrap_or(0);
        Self::send(
            cx,
            r,
            AccessMsg::Pulled {
                window,
                epoch,
                entered,
                done,
                accesses,
            },
        );
    }

    fn on_message(&mut self, src: Rank, m: AccessMsg, cx: &mut ProtocolCx<'_>) {
        match m {
            AccessMsg::Open { window } => {
                self.n_flags.insert((src, window));
                Self::send(cx, src, AccessMsg::Opened { window });
            }
            AccessMsg::Opened { window } => {
                self.opening.remove(&(src, window));
            }
            AccessMsg::Close { window } => {
                self.n_flags.remove(&(src, window));
            }
            AccessMsg::Trim { fences, locks } => {
                self.asked.remove(&src);
                // The log shrinks: look again at the next access.
                self.next_demand_check = 0;
                let captured = |w: WinId, gnc: u64| {
                    (fences.iter()).any(|&(fw, entered)| fw == w && gnc < entered)
                };
                // Passive-target epochs with a smaller SC were closed at
                // the capture (§3.2.2), so their accesses are in it.
                let sc_cut = |w: WinId| {
                    (locks.sc.iter())
                        .find(|&&(lw, _)| lw == w)
                        .map_or(0, |&(_, sc)| sc)
                };
                let closes = self.locks.closes_from.entry(src).or_default();
                closes.1 = closes.1.max(locks.closes);
                if let Some(log) = self.lp.get_mut(&src) {
                    let before: usize = log.iter().map(Logged::bytes).sum();
                    log.retain(|a| match a.sc {
                        None => !captured(a.window, a.gnc),
                        Some(sc) => sc >= sc_cut(a.window),
                    });
                    let after: usize = log.iter().map(Logged::bytes).sum();
                    self.lp_bytes -= before - after;
                }
                // LG_q[p] too: `src` re-executes none of those gets.
                if let Some(log) = self.lg.get_mut(&src) {
                    let before: usize = log.iter().map(|g| g.data.len()).sum();
                    log.retain(|g| match g.seq {
                        None => !captured(g.window, g.gnc),
                        Some(seq) => seq >= locks.gets_sent,
                    });
                    let after: usize = log.iter().map(|g| g.data.len()).sum();
                    self.lg_bytes -= before - after;
                }
            }
            AccessMsg::LogGets {
                window,
                epoch,
                gets,
            } => {
                let log = self.lg.entry(src).or_default();
                for data in gets.items() {
                    self.lg_bytes += data.len();
                    log.push_back(LoggedGet {
                        window,
                        gnc: epoch,
                        seq: None,
                        data,
                    });
                }
                self.demand_checkpoint(cx);
            }
            AccessMsg::LogLockGets { window, seq, gets } => {
                let log = self.lg.entry(src).or_default();
                for data in gets.items() {
                    self.lg_bytes += data.len();
                    log.push_back(LoggedGet {
                        window,
                        gnc: 0,
                        seq: Some(seq),
                        data,
                    });
                }
                self.demand_checkpoint(cx);
            }
            AccessMsg::LockOpen { window } => {
                if self.holds_locks(cx) {
                    self.locks.queued.push((src, window));
                } else {
                    self.grant_lock(src, window, cx);
                }
            }
            AccessMsg::LockOpened { window, sc } => {
                self.opening.remove(&(src, window));
                self.locks.open.insert((src, window), sc);
                self.locks.stale.remove(&(src, window));
            }
            AccessMsg::LockClose { window, closes } => {
                self.n_flags.remove(&(src, window));
                self.locks.open_here.remove(&(src, window));
                let c = self.locks.closes_from.entry(src).or_default();
                c.0 = c.0.max(closes);
            }
            AccessMsg::PullGets { window, epoch } => {
                // Every get of that epoch is here, or none was made: the
                // replacement pulls only after its `Gather` found no N
                // flag, and frames of its predecessor are dropped.
                let gets = (self.lg.get(&src).into_iter().flatten())
                    .filter(|g| g.seq.is_none() && g.window == window && g.gnc == epoch)
                    .map(|g| g.data.clone())
                    .collect();
                // Under f-puts no read was logged: one re-executed there
                // cannot be answered.
                let lost = self.lg_lost(window, epoch) || self.logging == AccessLogging::Puts;
                Self::send(
                    cx,
                    src,
                    AccessMsg::PulledGets {
                        window,
                        epoch,
                        gets,
                        lost,
                    },
                );
            }
            AccessMsg::PulledGets {
                window,
                epoch,
                gets,
                lost,
            } => self.on_pulled_gets(src, (window, epoch), gets, lost, cx),
            AccessMsg::Gather => {
                // `src` is a replacement: its windows get no access of ours
                // until it is live on them (it exposes them only once every
                // rank has answered this).
                self.locks.announced.insert(src);
                if let std::collections::btree_map::Entry::Vacant(e) = self.recovering.entry(src) {
                    e.insert(BTreeSet::new());
                    for a in self.lp.get_mut(&src).into_iter().flatten() {
                        a.held = true;
                    }
                }
                self.ask_again(src, cx);
                let n = self.n_flags.iter().any(|&(r, _)| r == src);
                // A replacement recovering too lost its N flags and has not
                // regenerated its log yet: any combining access it logged
                // may have been meant for the asker.
                let m = if self.recovery.is_some() && !self.flags_known() {
                    self.lp.values().flatten().any(Logged::combining)
                } else {
                    (self.lp.get(&src)).is_some_and(|l| l.iter().any(Logged::combining))
                };
                // Passive-target epochs of the predecessor since its
                // checkpoint, as an origin here (closed ones, or open: the
                // epoch held for it), or as a target (logged here).
                let locks = (self.lp.get(&src)).is_some_and(|l| l.iter().any(|a| a.sc.is_some()))
                    || self.locks.stale.iter().any(|&(t, _)| t == src)
                    || (self.locks.closes_from.get(&src))
                        .is_some_and(|&(closed, trimmed)| closed > trimmed)
                    || (self.lg_lost_from.is_some() && self.any_passive());
                // The replacement starts a new line of epochs.
                self.n_flags.retain(|&(r, _)| r != src);
                let done = self.done.iter().map(|(&w, &d)| (w, d)).collect();
                Self::send(cx, src, AccessMsg::Flags { n, m, locks, done });
            }
            AccessMsg::Flags { n, m, locks, done } => {
                for (w, d) in done {
                    self.learn_done(src, w, d);
                }
                self.on_flags(src, (n, m, locks), cx)
            }
            AccessMsg::Pull { window, epoch } => {
                if self.entered(window) > epoch {
                    self.answer_pull(src, window, epoch, cx);
                } else {
                    // Still in that epoch (or a replacement behind): its
                    // accesses are not all logged yet.
                    self.deferred_pulls.push((src, window, epoch));
                }
            }
            AccessMsg::Pulled {
                window,
                epoch,
                entered,
                done,
                accesses,
            } => {
                self.learn_done(src, window, done);
                let mine = self.entered(window);
                if let Some(pull) = (self.recovery.as_mut())
                    .and_then(|r| r.pulls.get_mut(&window))
                    .filter(|p| p.epoch == epoch && p.waiting.contains(&src))
                {
                    pull.waiting.remove(&src);
                    pull.behind |= entered > mine;
                    pull.got
                        .extend(accesses.into_iter().map(|(ec, op)| (ec, src, op)));
                    self.try_replay(window, cx);
                }
            }
            AccessMsg::Readable { window, epoch } => {
                if self.recovering.contains_key(&src) {
                    self.readable.insert((src, window), epoch);
                }
            }
            AccessMsg::Live { window } => {
                if let Some(live) = self.recovering.get_mut(&src) {
                    live.insert(window);
                }
                let entered = self.entered(window);
                Self::send(cx, src, AccessMsg::LiveAck { window, entered });
            }
            AccessMsg::LiveAck { window, entered } => {
                if let Some((unacked, last)) =
                    (self.recovery.as_mut()).and_then(|r| r.live.get_mut(&window))
                    && unacked.remove(&src)
                {
                    *last = (*last).max(entered);
                }
            }
        }
    }

    /// `r` said it has completed `done` fences on `window`.
    fn learn_done(&mut self, r: Rank, window: WinId, done: u64) {
        let d = self.peer_done.entry((r, window)).or_insert(0);
        *d = (*d).max(done);
    }

    /// `r` was replaced while this rank's recovery waited for it: ask its
    /// replacement again (its log is restored and regenerated; it answers
    /// a pull once it has closed that epoch).
    fn ask_again(&mut self, r: Rank, cx: &mut ProtocolCx<'_>) {
        let unfinished = !self.recovered();
        let Some(rec) = self.recovery.as_mut() else {
            return;
        };
        // Until this rank is live and acknowledged on every window, `r`'s
        // replacement must hold its accesses to it too: it learns so from
        // a `Gather` (whose answer is ignored unless still awaited), and
        // where this rank is live already, from `Live`, acknowledged again
        // (both before its answer to `r`'s own `Gather`, for which `r`
        // waits before any access).
        if rec.flags_pending.contains(&r) || unfinished {
            Self::send(cx, r, AccessMsg::Gather);
            for (&window, (unacked, _)) in rec.live.iter_mut() {
                Self::send(cx, r, AccessMsg::Live { window });
                unacked.insert(r);
            }
        }
        let pulls: Vec<(WinId, u64)> = (rec.pulls.iter())
            .filter(|(_, p)| p.waiting.contains(&r))
            .map(|(&w, p)| (w, p.epoch))
            .collect();
        for (window, epoch) in pulls {
            Self::send(cx, r, AccessMsg::Pull { window, epoch });
        }
        let asking: Vec<(WinId, u64)> = (rec.asking.iter())
            .filter(|&&(t, _, _)| t == r)
            .map(|&(_, w, e)| (w, e))
            .collect();
        for (window, epoch) in asking {
            Self::send(cx, r, AccessMsg::PullGets { window, epoch });
        }
    }

    /// `src` answered a `PullGets` of `(window, epoch)`.
    fn on_pulled_gets(
        &mut self,
        src: Rank,
        (window, epoch): (WinId, u64),
        gets: Vec<Bytes>,
        lost: bool,
        cx: &mut ProtocolCx<'_>,
    ) {
        let Some(rec) = self.recovery.as_mut() else {
            return;
        };
        if !rec.asking.remove(&(src, window, epoch)) {
            return;
        }
        if lost {
            // The predecessor may have read there in that epoch, and what
            // it read is gone: the re-execution cannot read it again.
            self.counters.fallbacks += 1;
            self.report(cx);
            cx.emit(Action::Fail(Error::Unrecoverable(
                format!(
                    "rank {src} failed too after rank {} logged gets there in epoch {epoch} \
                     of window {window} (003 Alg. 1's LG lives at the target): the \
                     re-execution cannot read them again, so the job falls back to the \
                     last coordinated checkpoint, which under rma is the start",
                    cx.rank
                )
                .into(),
            )));
            return;
        }
        rec.gets.insert((src, window, epoch), gets.into());
    }

    fn on_flags(&mut self, src: Rank, (n, m, locks): (bool, bool, bool), cx: &mut ProtocolCx<'_>) {
        let Some(rec) = self.recovery.as_mut() else {
            return;
        };
        if !rec.flags_pending.remove(&src) {
            return;
        }
        if locks && !n && !m {
            self.counters.fallbacks += 1;
            self.report(cx);
            cx.emit(Action::Fail(Error::Unrecoverable(
                format!(
                    "rank {src} shared passive-target (lock) epochs with rank {} since its \
                     checkpoint: their causal replay (003 Alg. 3) is not implemented yet, so \
                     the job falls back to the last coordinated checkpoint, which under rma \
                     is the start",
                    cx.rank
                )
                .into(),
            )));
            return;
        }
        if n || m {
            let which = match (n, m) {
                (true, true) => "N and M flags",
                (true, false) => {
                    "N flag (an epoch of its reads or combining accesses to this rank, or \
                     its lock of it, was open)"
                }
                _ => "M flag (its log holds a combining access this rank's checkpoint may include)",
            };
            self.counters.fallbacks += 1;
            self.report(cx);
            cx.emit(Action::Fail(Error::Unrecoverable(
                format!(
                    "rank {src} has the {which} set for rank {} (003 §3.2.3, §4.2): replaying its \
                     accesses is unsafe, so the job falls back to the last coordinated \
                     checkpoint, which under rma is the start",
                    cx.rank
                )
                .into(),
            )));
            return;
        }
        if rec.flags_pending.is_empty() {
            let windows: Vec<WinId> = rec.pulls.keys().copied().collect();
            for w in windows {
                self.try_replay(w, cx);
            }
        }
    }

    fn report(&mut self, cx: &mut ProtocolCx<'_>) {
        let (c, r) = (self.counters, self.reported);
        if c == r {
            return;
        }
        cx.emit(Action::Record(Stat::Accesses {
            logged: c.logged - r.logged,
            logged_bytes: c.logged_bytes - r.logged_bytes,
            replayed: c.replayed - r.replayed,
            skipped: c.skipped - r.skipped,
            held: c.held - r.held,
            demanded: c.demanded - r.demanded,
            fallbacks: c.fallbacks - r.fallbacks,
            log_bytes: self.lp_bytes + self.lg_bytes,
            gets_logged: c.gets_logged - r.gets_logged,
            get_bytes: c.get_bytes - r.get_bytes,
            gets_replayed: c.gets_replayed - r.gets_replayed,
        }));
        self.reported = c;
    }
}

impl Protocol for Rma {
    fn name(&self) -> &'static str {
        "rma"
    }

    over_p2p!();

    fn access_ready(&self, target: Rank, window: WinId) -> bool {
        // A replacement knows which accesses it regenerates only once every
        // rank told it what it has (`Hsr`), and which ranks recover with it
        // once every rank answered its `Gather` (a rank recovering too
        // says so first, `ask_again`).
        self.p2p.hsr_known()
            && self.flags_known()
            && !self.opening.contains(&(target, window))
            && !self.get_waits(target, window)
            && !self.lock_waits(target, window)
    }

    fn access_held(&self, target: Rank, window: WinId) -> bool {
        (self.recovering.get(&target)).is_some_and(|live| !live.contains(&window))
    }

    fn fence_ready(&self, window: WinId) -> bool {
        self.recovery
            .as_ref()
            .is_none_or(|r| r.flags_pending.is_empty() && !r.pulls.contains_key(&window))
    }

    fn exposure_ready(&self) -> bool {
        // Every rank has heard this rank is recovering (`Gather` answered).
        self.p2p.hsr_known() && self.flags_known()
    }

    fn save_state(&self, piece: &mut PieceWriter<'_>) -> Result<()> {
        self.p2p.save_state(piece)?;
        let mut blobs: Vec<&Bytes> = Vec::new();
        let lp = (self.lp.iter())
            .map(|(&t, log)| {
                let saved = log.iter().filter_map(|a| {
                    let op = match &a.op {
                        RmaOp::Put { offset, data } => {
                            blobs.push(data);
                            SavedOp::Put { offset: *offset }
                        }
                        RmaOp::Accumulate {
                            offset,
                            data,
                            dtype,
                            op,
                            fetch,
                        } => {
                            blobs.push(data);
                            SavedOp::Accumulate {
                                offset: *offset,
                                dtype: *dtype,
                                op: *op,
                                fetch: *fetch,
                            }
                        }
                        RmaOp::CompareAndSwap {
                            offset,
                            compare,
                            swap,
                            dtype,
                        } => {
                            blobs.push(compare);
                            blobs.push(swap);
                            SavedOp::CompareAndSwap {
                                offset: *offset,
                                dtype: *dtype,
                            }
                        }
                        _ => return None,
                    };
                    Some(SavedAccess {
                        window: a.window,
                        gnc: a.gnc,
                        ec: a.ec,
                        sc: a.sc,
                        op,
                    })
                });
                (t, saved.collect())
            })
            .collect();
        let lg = (self.lg.iter())
            .map(|(&o, log)| {
                let saved = log.iter().map(|g| {
                    blobs.push(&g.data);
                    (g.window, g.gnc, g.seq)
                });
                (o, saved.collect())
            })
            .collect();
        let st = SavedState {
            fences: self.fences.iter().map(|(&w, &n)| (w, n)).collect(),
            lp,
            lg,
            locks: self.locks.cut(),
        };
        append_with_blobs(&st, &blobs, piece)
    }

    fn load_state(&mut self, state: Bytes) -> Result<()> {
        let rest = self.p2p.load_prefix(&state)?;
        let (st, blobs, _): (SavedState, Vec<Bytes>, _) = take_with_blobs(&rest)?;
        let listed: usize = (st.lp.iter().flat_map(|(_, l)| l))
            .map(|a| match a.op {
                SavedOp::CompareAndSwap { .. } => 2,
                _ => 1,
            })
            .sum::<usize>()
            + st.lg.iter().map(|(_, l)| l.len()).sum::<usize>();
        if listed != blobs.len() {
            return Err(Error::Codec {
                what: "a checkpoint piece's access log".into(),
                detail: format!("{listed} payloads listed, {} saved", blobs.len()),
            });
        }
        let mut blobs = blobs.into_iter();
        let mut next = || blobs.next().unwrap_or_default();
        self.lp.clear();
        self.lp_bytes = 0;
        for (t, saved) in st.lp {
            let log = self.lp.entry(t).or_default();
            for a in saved {
                let op = match a.op {
                    SavedOp::Put { offset } => RmaOp::Put {
                        offset,
                        data: next(),
                    },
                    SavedOp::Accumulate {
                        offset,
                        dtype,
                        op,
                        fetch,
                    } => RmaOp::Accumulate {
                        offset,
                        data: next(),
                        dtype,
                        op,
                        fetch,
                    },
                    SavedOp::CompareAndSwap { offset, dtype } => RmaOp::CompareAndSwap {
                        offset,
                        compare: next(),
                        swap: next(),
                        dtype,
                    },
                };
                let logged = Logged {
                    window: a.window,
                    gnc: a.gnc,
                    ec: a.ec,
                    sc: a.sc,
                    op,
                    // Restored: the targets may have died with this rank.
                    held: true,
                };
                self.lp_bytes += logged.bytes();
                log.push_back(logged);
            }
        }
        self.lg.clear();
        self.lg_bytes = 0;
        for (o, saved) in st.lg {
            let log = self.lg.entry(o).or_default();
            for (window, gnc, seq) in saved {
                let data = next();
                self.lg_bytes += data.len();
                log.push_back(LoggedGet {
                    window,
                    gnc,
                    seq,
                    data,
                });
            }
        }
        self.locks.sc = st.locks.sc.into_iter().collect();
        self.locks.gets_sent = st.locks.gets_sent;
        self.locks.closes = st.locks.closes;
        self.fences = st.fences.into_iter().collect();
        // A piece is captured right after a fence completed.
        self.done = self.fences.clone();
        Ok(())
    }

    fn state_size_hint(&self) -> usize {
        self.p2p.state_size_hint()
            + 64 * self.lp.values().map(VecDeque::len).sum::<usize>()
            + 32 * self.lg.values().map(VecDeque::len).sum::<usize>()
            + 64
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        self.handle_event(event, cx);
        self.release_locks(cx);
    }
}

impl Rma {
    fn handle_event(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::Access {
                window,
                target,
                op,
                ec,
                regenerating,
            } => self.on_access((window, target), op, ec, regenerating, cx),
            Event::FenceEnter { window, group } => self.on_fence_enter(window, group, cx),
            Event::FenceDone { window } => {
                *self.done.entry(window).or_insert(0) += 1;
                self.close_epoch(window, cx);
            }
            Event::LockOpen { window, target } => self.on_lock_open(window, target, cx),
            Event::EpochClosed {
                window,
                target,
                unlock,
            } => self.close_lock_epoch((window, target), unlock, cx),
            Event::Fetched {
                window,
                target,
                data,
            } => self.on_fetched(window, target, data),
            Event::Control {
                src,
                msg: Control::Access(m),
            } => self.on_message(src, m, cx),
            Event::SafePoint { index } => {
                // The epoch condition (§3.2.2): right after a GSYNC, before
                // any communication, or no window fenced at all.
                // §3.2.2 (1), "locking the application data": no
                // passive-target epoch on this rank is open, so SC is a
                // clean cut (the capture follows at once, and no lock is
                // granted before it). Waiting here for open ones to close
                // instead deadlocks with an origin that holds its lock
                // across a collective: the checkpoint waits for a later
                // safe point.
                let condition =
                    (cx.after_gsync || self.fences.is_empty()) && self.locks.open_here.is_empty();
                self.p2p
                    .hold_schedule(!condition || self.recovery_pending());
                if let Some(generation) = self.p2p.safe_point_captures(index, cx) {
                    let fences = self.fences.iter().map(|(&w, &n)| (w, n)).collect();
                    self.capturing
                        .insert(generation, (fences, self.locks.cut()));
                }
                self.report(cx);
            }
            Event::PieceStored { generation } => {
                self.p2p.handle(Event::PieceStored { generation }, cx);
                if let Some((fences, locks)) = self.capturing.remove(&generation) {
                    self.capturing.retain(|&g, _| g > generation);
                    if !fences.is_empty() || locks != LockCut::default() {
                        cx.broadcast(&Control::Access(AccessMsg::Trim { fences, locks }));
                    }
                }
            }
            Event::PeerFailed { epoch, dead } => {
                // A rank this replacement still waits for died: its
                // replacement is asked again when it announces itself
                // (`Gather`, `ask_again`).
                for &d in dead {
                    // Its replacement starts again from its checkpoint.
                    self.peer_done.retain(|&(r, _), _| r != d);
                    self.readable.retain(|&(r, _), _| r != d);
                    self.recovering.insert(d, BTreeSet::new());
                    self.opened.retain(|&(t, _)| t != d);
                    self.opening.retain(|&(t, _)| t != d);
                    self.deferred_pulls.retain(|&(r, _, _)| r != d);
                    self.asked.remove(&d);
                    // Its open passive-target epochs: those on it are held
                    // (its replacement falls back, they being open), those
                    // here are over.
                    self.locks.announced.remove(&d);
                    let stale: Vec<(Rank, WinId)> = (self.locks.open.keys())
                        .filter(|&&(t, _)| t == d)
                        .copied()
                        .collect();
                    self.locks.stale.extend(stale);
                    self.locks.open_here.retain(|&(r, _)| r != d);
                    self.locks.queued.retain(|&(r, _)| r != d);
                    // What its window had is gone with it.
                    for a in self.lp.get_mut(&d).into_iter().flatten() {
                        a.held = true;
                    }
                    if let Some(rec) = self.recovery.as_mut() {
                        for (unacked, _) in rec.live.values_mut() {
                            unacked.remove(&d);
                        }
                    }
                }
                self.p2p.handle(Event::PeerFailed { epoch, dead }, cx);
            }
            Event::Recover { epoch, replacement } => {
                self.recovery = Some(Recovery::default());
                self.opened.clear();
                self.opening.clear();
                self.locks.open.clear();
                self.locks.stale.clear();
                self.p2p.handle(Event::Recover { epoch, replacement }, cx);
            }
            Event::Restored { generation } => {
                self.p2p.handle(Event::Restored { generation }, cx);
                if generation.is_none() {
                    self.lp.clear();
                    self.lp_bytes = 0;
                    self.lg.clear();
                    self.lg_bytes = 0;
                    self.fences.clear();
                    self.done.clear();
                    self.locks = Locks::default();
                }
                // Its predecessor's epochs, origin or target side, died
                // with it (the ranks that shared them report it).
                self.locks.open.clear();
                self.locks.stale.clear();
                self.locks.open_here.clear();
                // Gets logged here after the checkpoint are gone; what
                // this incarnation read is not logged yet.
                self.q.clear();
                self.lg_lost_from = Some(self.fences.clone());
                self.live_at.clear();
                let others: BTreeSet<Rank> = (0..cx.size).filter(|&r| r != cx.rank).collect();
                for &r in &others {
                    Self::send(cx, r, AccessMsg::Gather);
                }
                self.recovery = Some(Recovery {
                    flags_pending: others,
                    ..Recovery::default()
                });
            }
            Event::Finish => {
                self.p2p.handle(Event::Finish, cx);
                self.report(cx);
            }
            other => self.p2p.handle(other, cx),
        }
    }
}

impl Rma {
    /// Whether a deferred read of `target` on `window` still waits: for
    /// the target to be live, or for its logged gets.
    fn get_waits(&self, target: Rank, window: WinId) -> bool {
        match self.waiting_get {
            Some(ReadWait::Log(t, w, e)) if (t, w) == (target, window) => {
                (self.recovery.as_ref()).is_some_and(|r| r.asking.contains(&(t, w, e)))
            }
            Some(ReadWait::Target(t, w, e)) if (t, w) == (target, window) => {
                self.access_held(t, w) && !self.readable_in(t, w, e)
            }
            _ => false,
        }
    }

    /// Fences this rank has entered on `window` (the GNC of its accesses).
    fn entered(&self, window: WinId) -> u64 {
        self.fences.get(&window).copied().unwrap_or(0)
    }

    /// Whether replacement `target`, not live on `window`, has replayed up
    /// to epoch `gnc` (its window is as that epoch reads it).
    fn readable_in(&self, target: Rank, window: WinId, gnc: u64) -> bool {
        self.readable
            .get(&(target, window))
            .is_some_and(|&e| e >= gnc)
    }

    /// Whether this replacement has not yet heard every rank's flags.
    fn recovery_pending(&self) -> bool {
        !self.flags_known()
    }

    /// Whether this rank's recovery, if any, is over: flags heard, live on
    /// every window it fenced (at least one) and acknowledged by all.
    fn recovered(&self) -> bool {
        self.recovery.as_ref().is_none_or(|r| {
            r.flags_pending.is_empty()
                && r.pulls.is_empty()
                && !r.live.is_empty()
                && r.live.values().all(|(unacked, _)| unacked.is_empty())
                && self.fences.keys().all(|w| r.live.contains_key(w))
        })
    }

    /// Whether no recovery of this rank waits for flags.
    fn flags_known(&self) -> bool {
        self.recovery
            .as_ref()
            .is_none_or(|r| r.flags_pending.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::Harness;

    const W: WinId = 7;

    fn rma() -> Rma {
        Rma::with_p2p(Pessimistic::new(0, None))
    }

    fn put(offset: usize) -> RmaOp {
        RmaOp::Put {
            offset,
            data: Bytes::from(vec![1u8; 8]),
        }
    }

    fn accumulate() -> RmaOp {
        RmaOp::Accumulate {
            offset: 0,
            data: Bytes::from(vec![1u8; 8]),
            dtype: DType::U64,
            op: ReduceOp::Sum,
            fetch: false,
        }
    }

    fn access(
        h: &Harness,
        p: &mut Rma,
        target: Rank,
        op: &RmaOp,
        regenerating: bool,
    ) -> Vec<Action> {
        h.run(
            p,
            Event::Access {
                window: W,
                target,
                op,
                ec: 1,
                regenerating,
            },
        )
    }

    fn fence(h: &Harness, p: &mut Rma) -> Vec<Action> {
        h.run(
            p,
            Event::FenceEnter {
                window: W,
                group: &[0, 1, 2, 3],
            },
        )
    }

    /// A replacement of `h`'s rank, restored from the beginning; what it
    /// emitted at the restore.
    fn replacement(h: &Harness) -> (Rma, Vec<Action>) {
        let mut p = rma();
        h.run(
            &mut p,
            Event::Recover {
                epoch: 1,
                replacement: true,
            },
        );
        let a = h.run(&mut p, Event::Restored { generation: None });
        (p, a)
    }

    /// The flags rank `asker` gets when it asks `p` (003 Alg. 2 lines 4–11).
    fn flags(h: &Harness, p: &mut Rma, asker: Rank) -> (bool, bool) {
        let a = h.control(p, asker, AccessMsg::Gather);
        a.iter()
            .find_map(|a| match a {
                Action::Transmit {
                    dest,
                    msg: Control::Access(AccessMsg::Flags { n, m, .. }),
                } if *dest == asker => Some((*n, *m)),
                _ => None,
            })
            .expect("flags answered")
    }

    /// Every rank of `ranks` answers `p`'s `Gather`: no flag set.
    fn no_flags(h: &Harness, p: &mut Rma, ranks: &[Rank]) {
        for &r in ranks {
            h.control(
                p,
                r,
                AccessMsg::Flags {
                    n: false,
                    m: false,
                    locks: false,
                    done: vec![],
                },
            );
        }
    }

    fn sent(actions: &[Action]) -> Vec<(Rank, AccessMsg)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Transmit {
                    dest,
                    msg: Control::Access(m),
                } => Some((*dest, m.clone())),
                _ => None,
            })
            .collect()
    }

    /// What `target` (run by `h`) answers `asker`'s `PullGets` of `epoch`:
    /// the logged gets and whether they may be lost.
    fn pull_gets(h: &Harness, target: &mut Rma, asker: Rank, epoch: u64) -> (Vec<Bytes>, bool) {
        let a = h.control(target, asker, AccessMsg::PullGets { window: W, epoch });
        sent(&a)
            .into_iter()
            .find_map(|(d, m)| match m {
                AccessMsg::PulledGets { gets, lost, .. } if d == asker => Some((gets, lost)),
                _ => None,
            })
            .expect("PullGets answered")
    }

    /// Alg. 1 at the origin and the target: N before the first read of an
    /// epoch, what it returned kept in Q, sent to the target's LG when the
    /// fence closing the epoch returns and only then N cleared (one
    /// channel: `LogGets` before `Close`); the target keeps it until the
    /// origin's checkpoint trims it and answers a replacement's
    /// `PullGets` with it; a replacement answers its re-executed read from
    /// that log, in issue order, and issues a read the log does not have.
    #[test]
    fn gets_are_logged_at_the_target_once_the_epoch_closes_and_answer_a_re_execution() {
        let h = Harness::new(1, 4, 2);
        let get = RmaOp::Get { offset: 0, len: 4 };
        let mut origin = rma();
        fence(&h, &mut origin); // epoch 1
        let a = access(&h, &mut origin, 0, &get, false);
        assert_eq!(sent(&a), vec![(0, AccessMsg::Open { window: W })]);
        assert!(!origin.access_ready(0, W), "the read waits for N");
        h.control(&mut origin, 0, AccessMsg::Opened { window: W });
        assert!(origin.access_ready(0, W));
        let data = Bytes::from_static(b"abcd");
        h.run(
            &mut origin,
            Event::Fetched {
                window: W,
                target: 0,
                data: &data,
            },
        );
        fence(&h, &mut origin);
        let a = h.run(&mut origin, Event::FenceDone { window: W });
        assert_eq!(
            sent(&a),
            vec![
                (
                    0,
                    AccessMsg::LogGets {
                        window: W,
                        epoch: 1,
                        gets: Reads::of(std::slice::from_ref(&data))
                    }
                ),
                (0, AccessMsg::Close { window: W }),
            ]
        );
        // The target (rank 0).
        let t = Harness::new(0, 4, 2);
        let mut target = rma();
        t.control(&mut target, 1, AccessMsg::Open { window: W });
        for (_, m) in sent(&a) {
            t.control(&mut target, 1, m);
        }
        assert_eq!(target.n_flags, BTreeSet::new(), "N cleared after the log");
        let pulled = |target: &mut Rma, epoch| pull_gets(&t, target, 1, epoch);
        assert_eq!(pulled(&mut target, 1), (vec![data.clone()], false));
        assert_eq!(pulled(&mut target, 2), (vec![], false));
        // The origin (rank 1) dies; its replacement re-executes epoch 1.
        let (mut rep, _) = replacement(&h);
        no_flags(&h, &mut rep, &[0, 2, 3]);
        fence(&h, &mut rep);
        let a = access(&h, &mut rep, 0, &get, false);
        assert!(a.contains(&Action::DeferAccess), "{a:?}");
        assert_eq!(
            sent(&a),
            vec![(
                0,
                AccessMsg::PullGets {
                    window: W,
                    epoch: 1
                }
            )]
        );
        assert!(!rep.access_ready(0, W), "waits for the log");
        h.control(
            &mut rep,
            0,
            AccessMsg::PulledGets {
                window: W,
                epoch: 1,
                gets: vec![data.clone()],
                lost: false,
            },
        );
        let a = access(&h, &mut rep, 0, &get, false);
        assert_eq!(a, vec![Action::AnswerAccess(data)], "from the log");
        // A second read in that epoch: the predecessor died before it.
        let a = access(&h, &mut rep, 0, &get, false);
        assert_eq!(sent(&a), vec![(0, AccessMsg::Open { window: W })], "issued");
        // The origin's checkpoint trims the target's log.
        t.control(
            &mut target,
            1,
            AccessMsg::Trim {
                fences: vec![(W, 2)],
                locks: LockCut::default(),
            },
        );
        assert_eq!(pulled(&mut target, 1), (vec![], false));
        assert_eq!(target.lg_bytes, 0);
    }

    /// A target that is a replacement itself lost the gets logged with its
    /// predecessor after its checkpoint: it answers `lost` for those
    /// epochs until it went live, and the asking replacement falls back.
    #[test]
    fn a_target_that_failed_too_says_its_get_log_is_lost_and_the_reader_falls_back() {
        let t = Harness::new(0, 4, 2);
        let (mut target, _) = replacement(&t);
        assert!(pull_gets(&t, &mut target, 1, 0).1, "lost");
        let h = Harness::new(1, 4, 2);
        let (mut rep, _) = replacement(&h);
        no_flags(&h, &mut rep, &[0, 2, 3]);
        access(&h, &mut rep, 0, &RmaOp::Get { offset: 0, len: 4 }, false);
        let a = h.control(
            &mut rep,
            0,
            AccessMsg::PulledGets {
                window: W,
                epoch: 0,
                gets: vec![],
                lost: true,
            },
        );
        assert!(
            a.iter()
                .any(|a| matches!(a, Action::Fail(Error::Unrecoverable(_)))),
            "{a:?}"
        );
    }

    /// M (§4.2): set exactly while the origin's log to a rank holds a
    /// combining access, cleared by the trim of that rank's checkpoint;
    /// puts never set it. (Asking for the flags is a recovery, so each
    /// case starts afresh.)
    #[test]
    fn m_is_set_exactly_while_a_combining_access_is_logged() {
        let h = Harness::new(0, 4, 2);
        let origin = |combining: bool, trim: Option<u64>| {
            let mut p = rma();
            fence(&h, &mut p); // GNC 1
            access(&h, &mut p, 1, &put(0), false);
            if combining {
                let a = access(&h, &mut p, 1, &accumulate(), false);
                // N first (Alg. 1 line 1): the access waits for the
                // acknowledgement.
                assert_eq!(sent(&a), vec![(1, AccessMsg::Open { window: W })]);
                assert!(!p.access_ready(1, W));
                h.control(&mut p, 1, AccessMsg::Opened { window: W });
                assert!(p.access_ready(1, W));
            }
            if let Some(entered) = trim {
                h.control(
                    &mut p,
                    1,
                    AccessMsg::Trim {
                        fences: vec![(W, entered)],
                        locks: LockCut::default(),
                    },
                );
            }
            p
        };
        assert_eq!(
            flags(&h, &mut origin(false, None), 1),
            (false, false),
            "puts only"
        );
        assert_eq!(
            flags(&h, &mut origin(true, None), 1),
            (false, true),
            "combining"
        );
        assert_eq!(
            flags(&h, &mut origin(true, None), 2),
            (false, false),
            "its target only"
        );
        // Rank 1 checkpointed having entered one fence: GNC 1 may be in
        // its piece or not, so the access stays.
        assert_eq!(flags(&h, &mut origin(true, Some(1)), 1), (false, true));
        let mut trimmed = origin(true, Some(2));
        assert_eq!(trimmed.lp_bytes, 0);
        assert_eq!(flags(&h, &mut trimmed, 1), (false, false), "trimmed");
    }

    /// Rank `asker`'s `locks` flag when it asks `p`.
    fn lock_flag(h: &Harness, p: &mut Rma, asker: Rank) -> bool {
        let a = h.control(p, asker, AccessMsg::Gather);
        a.iter()
            .find_map(|a| match a {
                Action::Transmit {
                    dest,
                    msg: Control::Access(AccessMsg::Flags { locks, .. }),
                } if *dest == asker => Some(*locks),
                _ => None,
            })
            .expect("flags answered")
    }

    fn cut(sc: u64, gets_sent: u64, closes: u64) -> AccessMsg {
        AccessMsg::Trim {
            fences: vec![],
            locks: LockCut {
                sc: vec![(W, sc)],
                gets_sent,
                closes,
            },
        }
    }

    /// A passive-target epoch at its origin (003 §4.1 C–D): the lock
    /// waits for the target's SC, writes are logged with it, reads go to
    /// Q and to the target's LG when a flush or the unlock closes the
    /// epoch, then the unlock clears N; the target's checkpoint past that
    /// SC trims the log.
    #[test]
    fn a_lock_epoch_fetches_sc_logs_with_it_and_closes() {
        let h = Harness::new(0, 4, 2);
        let mut p = rma();
        let a = h.run(
            &mut p,
            Event::LockOpen {
                window: W,
                target: 1,
            },
        );
        assert_eq!(sent(&a), vec![(1, AccessMsg::LockOpen { window: W })]);
        assert!(!p.access_ready(1, W), "the lock waits for SC");
        h.control(&mut p, 1, AccessMsg::LockOpened { window: W, sc: 5 });
        assert!(p.access_ready(1, W));
        let a = h.run(
            &mut p,
            Event::LockOpen {
                window: W,
                target: 1,
            },
        );
        assert!(sent(&a).is_empty(), "a retried lock opens once");
        let a = access(&h, &mut p, 1, &put(0), false);
        assert!(!a.contains(&Action::SkipAccess), "issued");
        assert_eq!(p.lp[&1].back().map(|l| l.sc), Some(Some(5)));
        let get = RmaOp::Get { offset: 0, len: 8 };
        let a = access(&h, &mut p, 1, &get, false);
        assert!(sent(&a).is_empty() && !a.contains(&Action::DeferAccess));
        assert_eq!(p.lp[&1].len(), 1, "a get is not in LP");
        let data = Bytes::from(vec![3u8; 8]);
        h.run(
            &mut p,
            Event::Fetched {
                window: W,
                target: 1,
                data: &data,
            },
        );
        let closed = |p: &mut Rma, unlock| {
            sent(&h.run(
                p,
                Event::EpochClosed {
                    window: W,
                    target: 1,
                    unlock,
                },
            ))
        };
        assert_eq!(
            closed(&mut p, false),
            vec![(
                1,
                AccessMsg::LogLockGets {
                    window: W,
                    seq: 0,
                    gets: Reads::of(std::slice::from_ref(&data)),
                }
            )],
            "a flush logs the gets, the lock stays"
        );
        assert_eq!(
            closed(&mut p, true),
            vec![(
                1,
                AccessMsg::LockClose {
                    window: W,
                    closes: 1
                }
            )]
        );
        assert!(lock_flag(&h, &mut p, 1), "LP holds an access of the epoch");
        assert!(!lock_flag(&h, &mut p, 2), "to rank 1 only");
        h.control(&mut p, 1, cut(5, 0, 0));
        assert!(lock_flag(&h, &mut p, 1), "SC 5 is not before the cut");
        h.control(&mut p, 1, cut(6, 0, 0));
        assert_eq!(p.lp_bytes, 0);
        assert!(!lock_flag(&h, &mut p, 1), "trimmed");
    }

    /// The target side: SC per window, N held while an epoch is open, its
    /// closes remembered until the origin's checkpoint, LG trimmed by it.
    #[test]
    fn a_target_numbers_lock_epochs_and_remembers_closes_until_a_checkpoint() {
        let h = Harness::new(1, 4, 2);
        let mut t = rma();
        let a = h.control(&mut t, 0, AccessMsg::LockOpen { window: W });
        assert_eq!(
            sent(&a),
            vec![(0, AccessMsg::LockOpened { window: W, sc: 0 })]
        );
        let a = h.control(&mut t, 2, AccessMsg::LockOpen { window: W });
        assert_eq!(
            sent(&a),
            vec![(2, AccessMsg::LockOpened { window: W, sc: 1 })]
        );
        assert_eq!(flags(&h, &mut t, 2), (true, false), "open: N");
        let mut t = rma();
        h.control(&mut t, 0, AccessMsg::LockOpen { window: W });
        h.control(
            &mut t,
            0,
            AccessMsg::LogLockGets {
                window: W,
                seq: 0,
                gets: Reads::of(&[Bytes::from(vec![1u8; 8])]),
            },
        );
        h.control(
            &mut t,
            0,
            AccessMsg::LockClose {
                window: W,
                closes: 1,
            },
        );
        assert_eq!(t.lg_bytes, 8);
        assert!(t.locks.open_here.is_empty());
        assert_eq!(
            (flags(&h, &mut t, 0), lock_flag(&h, &mut t, 0)),
            ((false, false), true),
            "closed since the origin's checkpoint"
        );
        h.control(&mut t, 0, cut(0, 1, 1));
        assert_eq!(t.lg_bytes, 0, "its gets are in the origin's checkpoint");
        assert!(!lock_flag(&h, &mut t, 0));
    }

    /// §3.2.2's lock of the local data: a safe point captures only while
    /// no passive-target epoch on its rank is open (a later one does once
    /// it closed), and the cut it sends is SC then.
    #[test]
    fn a_checkpoint_is_taken_only_while_no_lock_epoch_on_its_rank_is_open() {
        let h = Harness::new(1, 4, 2);
        let mut t = Rma::with_p2p(Pessimistic::new(1, None));
        h.control(&mut t, 0, AccessMsg::LockOpen { window: W });
        let captured = |a: &[Action]| {
            a.iter().find_map(|a| match a {
                Action::Capture { generation } => Some(*generation),
                _ => None,
            })
        };
        let a = h.run(&mut t, Event::SafePoint { index: 1 });
        assert_eq!(captured(&a), None, "epoch of rank 0 open");
        assert!(
            a.contains(&Action::ReleaseSafePoint),
            "the safe point does not wait: {a:?}"
        );
        let a = h.control(&mut t, 2, AccessMsg::LockOpen { window: W });
        assert_eq!(
            sent(&a),
            vec![(2, AccessMsg::LockOpened { window: W, sc: 1 })],
            "locks are not held"
        );
        for origin in [0, 2] {
            h.control(
                &mut t,
                origin,
                AccessMsg::LockClose {
                    window: W,
                    closes: 1,
                },
            );
        }
        let a = h.run(&mut t, Event::SafePoint { index: 2 });
        let generation = captured(&a).expect("captured once the epochs closed");
        let a = h.run(&mut t, Event::PieceStored { generation });
        assert!(sent(&a).iter().any(|(_, m)| *m == cut(2, 0, 0)), "{a:?}");
    }

    /// f-puts (003 §7.2.2): reads set N but are not logged; a target
    /// asked for a re-execution's reads says they are lost (the reader
    /// falls back).
    #[test]
    fn under_f_puts_reads_are_not_logged_and_a_re_read_falls_back() {
        let h = Harness::new(1, 4, 2);
        let mut origin = rma().with_logging(AccessLogging::Puts);
        fence(&h, &mut origin);
        let get = RmaOp::Get { offset: 0, len: 8 };
        let a = access(&h, &mut origin, 0, &get, false);
        assert_eq!(sent(&a), vec![(0, AccessMsg::Open { window: W })], "N");
        let data = Bytes::from(vec![5u8; 8]);
        h.run(
            &mut origin,
            Event::Fetched {
                window: W,
                target: 0,
                data: &data,
            },
        );
        let closed = h.run(&mut origin, Event::FenceDone { window: W });
        assert_eq!(sent(&closed), vec![(0, AccessMsg::Close { window: W })]);
        assert_eq!(origin.counters.gets_logged, 0);
        let t = Harness::new(0, 4, 2);
        let mut target = rma().with_logging(AccessLogging::Puts);
        assert!(pull_gets(&t, &mut target, 1, 0).1, "lost");
    }

    /// A replacement grants locks of its windows only once it heard every
    /// rank's flags and regenerated what receivers have (003 §4.3: others
    /// resume with it once it fully recovered).
    #[test]
    fn a_replacement_holds_locks_until_it_has_caught_up() {
        let h = Harness::new(2, 4, 2);
        let (mut p, _) = replacement(&h);
        let a = h.control(&mut p, 0, AccessMsg::LockOpen { window: W });
        assert!(sent(&a).is_empty(), "flags not heard yet");
        no_flags(&h, &mut p, &[0, 1, 3]);
        let hsr = |p: &mut Rma, r: Rank, hsr: u64| {
            h.run(
                p,
                Event::Control {
                    src: r,
                    msg: Control::Log(LogMsg::Hsr { hsr, replayed: 0 }),
                },
            )
        };
        hsr(&mut p, 0, 0);
        hsr(&mut p, 1, 0);
        // Rank 3 has a message of the first execution: until this rank
        // sent it again, rank 0's lock waits.
        assert!(sent(&hsr(&mut p, 3, 1)).is_empty(), "regenerating");
        let mut caught_up = Harness::new(2, 4, 2);
        caught_up.hsr.insert(3, 1); // the harness passes it as SSN out
        let a = caught_up.run(&mut p, Event::Finish);
        assert!(
            sent(&a).contains(&(0, AccessMsg::LockOpened { window: W, sc: 0 })),
            "{a:?}"
        );
    }

    /// N (§3.2.3): held by the target from `Open` to `Close`; the origin
    /// closes when the fence that ends the epoch returns, once per epoch.
    #[test]
    fn n_is_held_by_the_target_while_the_epoch_is_open() {
        let h = Harness::new(1, 4, 2);
        let mut target = rma();
        let a = h.control(&mut target, 0, AccessMsg::Open { window: W });
        assert_eq!(sent(&a), vec![(0, AccessMsg::Opened { window: W })]);
        h.control(&mut target, 0, AccessMsg::Close { window: W });
        assert_eq!(flags(&h, &mut target, 0), (false, false));
        h.control(&mut target, 0, AccessMsg::Open { window: W });
        assert_eq!(flags(&h, &mut target, 0), (true, false));

        let o = Harness::new(0, 4, 2);
        let mut origin = rma();
        fence(&o, &mut origin);
        access(&o, &mut origin, 1, &accumulate(), false);
        o.control(&mut origin, 1, AccessMsg::Opened { window: W });
        let again = access(&o, &mut origin, 1, &accumulate(), false);
        assert!(sent(&again).is_empty(), "one Open per epoch");
        let closed = o.run(&mut origin, Event::FenceDone { window: W });
        assert_eq!(sent(&closed), vec![(1, AccessMsg::Close { window: W })]);
    }

    /// A replacement falls back exactly when some rank reports N or M,
    /// and otherwise replays: fences wait for the flags.
    #[test]
    fn a_replacement_falls_back_exactly_when_a_flag_is_set() {
        for (bad, n, m) in [
            (None, false, false),
            (Some(3), false, true),
            (Some(1), true, false),
        ] {
            let h = Harness::new(2, 4, 2);
            let (mut p, a) = replacement(&h);
            let asked: Vec<Rank> = (sent(&a).into_iter())
                .filter(|(_, m)| *m == AccessMsg::Gather)
                .map(|(d, _)| d)
                .collect();
            assert_eq!(asked, vec![0, 1, 3]);
            fence(&h, &mut p);
            assert!(!p.fence_ready(W), "waits for the flags");
            let mut failed = false;
            for r in [0, 1, 3] {
                let (n, m) = if Some(r) == bad {
                    (n, m)
                } else {
                    (false, false)
                };
                let a = h.control(
                    &mut p,
                    r,
                    AccessMsg::Flags {
                        n,
                        m,
                        locks: false,
                        done: vec![],
                    },
                );
                failed |= a
                    .iter()
                    .any(|a| matches!(a, Action::Fail(Error::Unrecoverable(_))));
            }
            assert_eq!(failed, bad.is_some(), "{bad:?}");
            assert_eq!(p.counters.fallbacks, u64::from(bad.is_some()));
        }
    }

    /// Alg. 2's replay at a replacement's fence: the pulled accesses are
    /// applied by EC, then origin, before the barrier; the replacement goes
    /// live once no rank is past that fence, and pulls again until every
    /// rank has acknowledged.
    #[test]
    fn a_replacement_replays_each_epoch_in_order_and_goes_live_at_the_front() {
        let h = Harness::new(2, 4, 2);
        let (mut p, _) = replacement(&h);
        for r in [0, 1, 3] {
            h.control(
                &mut p,
                r,
                AccessMsg::Flags {
                    n: false,
                    m: false,
                    locks: false,
                    done: vec![],
                },
            );
        }
        let a = fence(&h, &mut p); // entered 1: pulls GNC 0
        let pulls: Vec<Rank> = (sent(&a).into_iter())
            .filter(|(_, m)| {
                *m == AccessMsg::Pull {
                    window: W,
                    epoch: 0,
                }
            })
            .map(|(d, _)| d)
            .collect();
        assert_eq!(pulls, vec![0, 1, 3]);
        let pulled = |entered, accesses| AccessMsg::Pulled {
            window: W,
            epoch: 0,
            entered,
            done: entered - 1,
            accesses,
        };
        h.control(&mut p, 3, pulled(1, vec![(2, put(30)), (1, put(31))]));
        h.control(&mut p, 0, pulled(2, vec![(1, put(0))]));
        assert!(!p.fence_ready(W));
        let a = h.control(&mut p, 1, pulled(1, vec![]));
        let applied: Vec<usize> = (a.iter())
            .filter_map(|a| match a {
                Action::ApplyAccess {
                    op: RmaOp::Put { offset, .. },
                    ..
                } => Some(*offset),
                _ => None,
            })
            .collect();
        assert_eq!(applied, vec![0, 31, 30], "by EC, then origin");
        assert!(p.fence_ready(W));
        // Rank 0 is past this fence: not live, but its reads of this
        // epoch may go ahead.
        assert!(
            sent(&a).iter().all(|(_, m)| *m
                == AccessMsg::Readable {
                    window: W,
                    epoch: 1
                }),
            "{a:?}"
        );
        // Next fence: nobody is ahead any more.
        fence(&h, &mut p);
        let mut live = Vec::new();
        for r in [0, 1, 3] {
            let a = h.control(
                &mut p,
                r,
                AccessMsg::Pulled {
                    window: W,
                    epoch: 1,
                    entered: 2,
                    done: 1,
                    accesses: vec![],
                },
            );
            live.extend(sent(&a));
        }
        assert_eq!(live.len(), 3);
        assert!(
            live.iter()
                .all(|(_, m)| *m == AccessMsg::Live { window: W })
        );
        // Until every rank acknowledged, it still pulls.
        h.control(
            &mut p,
            0,
            AccessMsg::LiveAck {
                window: W,
                entered: 2,
            },
        );
        assert!(!sent(&fence(&h, &mut p)).is_empty(), "pulls GNC 2");
    }

    /// An origin holds an access to a rank being recovered in its log (the
    /// replacement pulls it), answers a pull only once it has closed the
    /// epoch, and issues directly once the replacement is live; a
    /// re-executing origin skips what its targets already have.
    #[test]
    fn an_origin_holds_accesses_for_a_rank_being_recovered() {
        let h = Harness::new(0, 4, 2);
        let mut p = rma();
        fence(&h, &mut p); // entered 1
        access(&h, &mut p, 1, &put(8), false);
        h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[1],
            },
        );
        let a = access(&h, &mut p, 1, &put(16), false);
        assert!(a.contains(&Action::SkipAccess), "held for the replacement");
        assert!(p.access_held(1, W));
        let a = h.control(
            &mut p,
            1,
            AccessMsg::Pull {
                window: W,
                epoch: 1,
            },
        );
        assert!(sent(&a).is_empty(), "epoch 1 is still open here");
        let a = fence(&h, &mut p); // closes epoch 1
        match sent(&a).as_slice() {
            [(1, AccessMsg::Pulled { accesses, .. })] => {
                let offsets: Vec<usize> = (accesses.iter())
                    .filter_map(|(_, op)| match op {
                        RmaOp::Put { offset, .. } => Some(*offset),
                        _ => None,
                    })
                    .collect();
                assert_eq!(
                    offsets,
                    vec![8, 16],
                    "both: the first went to the dead rank"
                );
            }
            other => panic!("expected the pull answered, got {other:?}"),
        }
        h.control(&mut p, 1, AccessMsg::Live { window: W });
        let a = access(&h, &mut p, 1, &put(24), false);
        assert!(!a.contains(&Action::SkipAccess), "live: issued");
        let a = access(&h, &mut p, 2, &put(0), true);
        assert!(
            a.contains(&Action::SkipAccess),
            "regenerated: the target has it"
        );
        // A target that completed the fence closing this epoch (GNC 2) has
        // it too, regenerating or not; one still before that fence not.
        let done = |d| AccessMsg::Flags {
            n: false,
            m: false,
            locks: false,
            done: vec![(W, d)],
        };
        let a = access(&h, &mut p, 3, &put(0), false);
        assert!(!a.contains(&Action::SkipAccess));
        h.control(&mut p, 3, done(2));
        let a = access(&h, &mut p, 3, &put(0), false);
        assert!(!a.contains(&Action::SkipAccess), "fence 2 closed epoch 1");
        h.control(&mut p, 3, done(3));
        let a = access(&h, &mut p, 3, &put(0), false);
        assert!(a.contains(&Action::SkipAccess), "fence 3 closed epoch 2");
    }
}
