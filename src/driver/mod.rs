//! Drivers: the only way the engine and the protocols touch the world.
//!
//! A driver gives each rank an [`Endpoint`]: frame transport, a clock, failure
//! notices, fault injection, and the window memory that remote ranks access
//! without the target's code running (RMA). Nothing in `engine`, `protocol` or
//! `store` uses a socket, thread, clock or random generator except through this
//! trait (DESIGN principle 2), which is what lets the same engine run on
//! threads, processes, MPI and the deterministic simulator.
//!
//! Backends: [`threads`] (all ranks in one process), [`processes`] (one OS
//! process per rank, a launcher as failure detector) and [`sim`] (a
//! deterministic discrete-event simulator), and with the `mpi` feature
//! `mpi` (the ranks of an MPI job). [`heap`]
//! says how rank processes get their heap on transparent huge pages.

pub mod heap;
#[cfg(feature = "mpi")]
pub mod mpi;
pub mod mpi_env;
pub mod processes;
pub(crate) mod shared;
pub mod sim;
pub mod threads;

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::api::datatype::{DType, ReduceOp};
use crate::engine::frame::{Frame, Incoming};
use crate::fault::FaultPoint;
use crate::{Rank, Result};

/// Identifier of a window (agreed collectively at allocation).
pub type WinId = u64;

/// Kind of passive-target lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockType {
    /// Shared: any number of holders (MPI_LOCK_SHARED).
    Shared,
    /// Exclusive: one holder (MPI_LOCK_EXCLUSIVE).
    Exclusive,
}

/// A one-sided operation on a target's window memory. Offsets and lengths are
/// in bytes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RmaOp {
    /// Replace bytes at `offset` with `data`.
    Put {
        /// Byte offset.
        offset: usize,
        /// Data (shared buffer).
        data: Bytes,
    },
    /// Read `len` bytes at `offset`.
    Get {
        /// Byte offset.
        offset: usize,
        /// Length.
        len: usize,
    },
    /// Combine `data` into the target element-wise; if `fetch`, return the
    /// previous contents (get_accumulate, fetch_and_op).
    Accumulate {
        /// Byte offset.
        offset: usize,
        /// Operand.
        data: Bytes,
        /// Element type.
        dtype: DType,
        /// Operation.
        op: ReduceOp,
        /// Return the old contents.
        fetch: bool,
    },
    /// Atomically: if the element equals `compare`, store `swap`; return the
    /// old element.
    CompareAndSwap {
        /// Byte offset.
        offset: usize,
        /// Expected value (one element).
        compare: Bytes,
        /// New value (one element).
        swap: Bytes,
        /// Element type.
        dtype: DType,
    },
    /// Try to take a passive-target lock; replies `Granted(bool)`.
    TryLock(LockType),
    /// Release a lock taken earlier.
    Unlock(LockType),
}

impl RmaOp {
    /// Whether the access returns the target's memory (a get, a fetching
    /// accumulate, a compare-and-swap): 003's GET, logged by Alg. 1.
    pub fn reads_target(&self) -> bool {
        matches!(
            self,
            RmaOp::Get { .. }
                | RmaOp::Accumulate { fetch: true, .. }
                | RmaOp::CompareAndSwap { .. }
        )
    }

    /// Whether the access changes the target's memory depending on what is
    /// there (an accumulate, a compare-and-swap): applying it twice is
    /// wrong (003 §4.2's `combine`).
    pub fn combines(&self) -> bool {
        matches!(
            self,
            RmaOp::Accumulate { .. } | RmaOp::CompareAndSwap { .. }
        )
    }
}

/// The reply to an [`RmaOp`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum RmaReply {
    /// Done, nothing to return.
    Done,
    /// Data read from the target.
    Data(Bytes),
    /// Whether a lock was granted.
    Granted(bool),
}

/// Statistics a rank reports to the driver, which aggregates them per job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Stat {
    /// A checkpoint generation of `bytes` (this rank's piece) was committed.
    Checkpoint {
        /// Generation.
        generation: u64,
        /// Piece size.
        bytes: usize,
        /// Seconds this rank spent inside the checkpoint.
        seconds: f64,
        /// Seconds from this rank entering the generation (its safe
        /// point) to the commit reaching it: the snapshot's latency, which
        /// a non-blocking snapshot does not make the application wait.
        latency_s: f64,
    },
    /// Under message logging: this rank's checkpoint `generation` is
    /// stored for good (at every holder, and under `correlated` committed
    /// by its set).
    PieceStored {
        /// Generation.
        generation: u64,
        /// The world epoch the rank had seen when it learnt it: a holder
        /// killed in a later failure event may have died before the
        /// report reached the statistics (processes: the report and the
        /// death travel on different connections).
        epoch: u64,
    },
    /// This rank resumed computation after recovering from the failure event
    /// `epoch`.
    Resumed {
        /// World epoch recovered to.
        epoch: u64,
        /// Whether the rank re-executes from a checkpoint (rolled back).
        rolled_back: bool,
        /// Whether no usable checkpoint existed, so the rank restarts its
        /// rank function from the beginning.
        from_scratch: bool,
    },
    /// Message-logging counters of this rank: totals since the last report
    /// (`records` … `resent`) and the log held now.
    Log {
        /// Messages logged.
        records: u64,
        /// Payload bytes logged.
        bytes: u64,
        /// Payload bytes sent to ranks of the sender's correlated set,
        /// which need no log copy (004 §3.2).
        spared_bytes: u64,
        /// Determinants logged (sent to the holder).
        determinants: u64,
        /// Logged messages sent again to a recovering rank.
        resent: u64,
        /// Collectives completed from a logged result instead of their
        /// messages (ULML: a substitute re-executing, or a survivor whose
        /// attempt a failure interrupted).
        collectives_from_log: u64,
        /// Payload bytes moved to the log's spill file (`--log-budget`).
        spilled_bytes: u64,
        /// Messages in the log now (in memory or spilled).
        log_records: usize,
        /// Payload bytes the log holds in memory now (each distinct buffer
        /// once; spilled payloads not included).
        log_bytes: usize,
    },
    /// A correlated set synchronised for a checkpoint (004 §3.3): the time
    /// from this rank entering the checkpoint to the set's first barrier
    /// (tokens on every internal channel, then the barrier).
    SetSync {
        /// Seconds.
        seconds: f64,
        /// Ranks in the set.
        set_size: usize,
    },
    /// Non-blocking snapshots (`chandy-lamport`): this rank incarnation's
    /// counters, reported when its rank function returns.
    Snapshot {
        /// Markers sent (n − 1 per generation recorded).
        markers_sent: u64,
        /// Messages recorded as channel state.
        channel_messages: u64,
        /// Their payload bytes.
        channel_bytes: u64,
        /// Messages held because they arrived after their channel's
        /// marker, before this rank recorded.
        held: u64,
    },
    /// 000 §IV's wave (`chandy-lamport` with a `get()` fix): this rank
    /// incarnation's markers by kind, reported when its rank function
    /// returns.
    Wave(crate::cuts::WaveCounts),
    /// The wave's stamps of this rank's communications, for the cut
    /// checker (`Config::check_cuts`; not sent by an incarnation that saw a
    /// failure).
    Cuts(crate::cuts::CutLog),
    /// The checkpoint interval was set by Daly's formula (003 §6.1).
    Interval {
        /// Safe points between checkpoints.
        every: u64,
        /// Daly's optimal compute time between checkpoints, seconds.
        tau_s: f64,
        /// The measured checkpoint cost it was computed from, seconds.
        cost_s: f64,
    },
    /// The root of a coordinated checkpoint judged its cut (003 §3.1.2):
    /// committed under `scheme`, or (Gsync only) abandoned and taken again.
    Coordination {
        /// The scheme the generation was taken by.
        scheme: crate::protocol::coordinated::CheckpointScheme,
        /// Whether the cut did not hold and the pieces were dropped.
        abandoned: bool,
    },
    /// `rma` (003 §3.2–§4): one-sided accesses logged at their origin and
    /// replayed, since the last report.
    Accesses {
        /// Accesses logged (LP).
        logged: u64,
        /// Their payload bytes.
        logged_bytes: u64,
        /// Logged accesses applied to a recovering rank's window.
        replayed: u64,
        /// Accesses a re-execution did not issue again (their targets had
        /// them).
        skipped: u64,
        /// Accesses to a rank being recovered, held in the log for it to
        /// pull instead of issued.
        held: u64,
        /// Demand checkpoints asked for (003 §6.2, `--log-budget`).
        demanded: u64,
        /// Recoveries that fell back because an N or M flag was set.
        fallbacks: u64,
        /// Payload bytes the access log holds now (LP and LG).
        log_bytes: usize,
        /// Gets (and fetching accesses) logged at their target (LG, 003
        /// Alg. 1), counted at the origin.
        gets_logged: u64,
        /// Their data bytes.
        get_bytes: u64,
        /// Gets of a re-execution answered from the target's log.
        gets_replayed: u64,
    },
    /// Resource use of the process that ran this rank incarnation, measured
    /// when its rank function returned (`getrusage`): what message logs,
    /// checkpoint pieces and receive buffers cost in fresh memory, and the
    /// CPU time spent in the process and in the kernel on its behalf
    /// (page faults show in the latter). Sent by backends that run each
    /// rank in its own process.
    Usage {
        /// Peak resident set, bytes.
        peak_rss_bytes: u64,
        /// Page faults served without I/O: mostly first touches of memory
        /// the process had not used before (each one zeroes a page).
        minor_faults: u64,
        /// CPU time in user mode, seconds.
        user_cpu_s: f64,
        /// CPU time in the kernel, seconds.
        system_cpu_s: f64,
    },
    /// A batch of this rank's timeline (`Config::trace`).
    Trace(Vec<crate::trace::TraceEvent>),
    /// Under message logging: seconds this rank incarnation spent on the
    /// send path for the log (the protocol's handling of each send, and the
    /// wait for what must be stored before a send leaves: acknowledged
    /// determinants under `pessimistic`), reported when its rank function
    /// returns.
    SendLogging {
        /// Seconds.
        seconds: f64,
    },
}

/// One rank's view of the driver.
pub trait Endpoint {
    /// This rank's world rank.
    fn rank(&self) -> Rank;
    /// Number of ranks in the job.
    fn size(&self) -> usize;
    /// The world epoch this incarnation started in (0 for the first).
    fn start_epoch(&self) -> u64;
    /// Send a frame (eager: returns once the frame is handed over).
    fn send(&mut self, dest: Rank, frame: Frame) -> Result<()>;
    /// Wait up to `timeout` (forever if `None`) for something to arrive.
    fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Incoming>>;
    /// Time since the job started.
    fn now(&self) -> Duration;
    /// Charge `d` of computation to this rank: real time on real backends
    /// (a sleep), virtual time on the simulator.
    fn compute(&mut self, d: Duration) -> Result<()>;
    /// Fault injection: returns `Err(Killed)` if the fault plan kills this
    /// rank here. Called at every runtime call of the rank.
    fn fault_point(&mut self, at: &FaultPoint) -> Result<()>;
    /// This rank passed safe point `index` (its checkpoint, if any, is
    /// done): whether it must move to another worker now (001: its worker
    /// was warned, or the load balancer moves it). Drivers that host one
    /// rank a worker never move ranks.
    fn migration_due(&mut self, index: u64) -> bool {
        let _ = index;
        false
    }
    /// Move this rank, whose packed state (001 §3.3: its protected state,
    /// unexpected messages, window memory and epoch state, communicators,
    /// protocol state) is `bytes` long, to the worker the driver chose; it
    /// returns once the rank resumes there, with no rollback.
    fn migrate(&mut self, bytes: u64) -> Result<()> {
        let _ = bytes;
        Ok(())
    }
    /// Expose `bytes` bytes of zeroed window memory under `id` at `epoch`,
    /// initialised with `init` if given.
    fn window_expose(
        &mut self,
        id: WinId,
        epoch: u64,
        bytes: usize,
        init: Option<&[u8]>,
    ) -> Result<()>;
    /// Withdraw window `id` (at free or rollback).
    fn window_withdraw(&mut self, id: WinId);
    /// Perform `op` on `target`'s window `id`, as an origin in `epoch`. Fails
    /// with `Error::Driver` if the target is not (or no longer) exposing that
    /// window in the same epoch (it died, or rolled back).
    fn rma(&mut self, epoch: u64, target: Rank, id: WinId, op: RmaOp) -> Result<RmaReply>;
    /// Run `f` on this rank's own memory of window `id`.
    fn with_local_window(&mut self, id: WinId, f: &mut dyn FnMut(&mut [u8])) -> Result<()>;
    /// Report a statistic.
    fn record(&mut self, stat: Stat);
    /// Report this rank's progress (0..=1), for progress bars.
    fn report_progress(&mut self, fraction: f64);
    /// ULFM respawn: start a new incarnation of the dead rank `rank`, with
    /// its number, at the current epoch; its rank function starts from the
    /// beginning.
    fn respawn(&mut self, rank: Rank) -> Result<()>;
    /// ULFM respawn: `rank` is being started again; frames for it wait for
    /// the new incarnation instead of being dropped.
    fn await_respawn(&mut self, rank: Rank);
    /// Finalize's leader has every live rank's `Done` as of world epoch
    /// `epoch`: conclude the job if no failure happened since (no fault
    /// plan kill fires any more) and return true; return false if one did
    /// (its notice is on the way, and it may void a `Done`).
    fn conclude(&mut self, epoch: u64) -> bool;
    /// Before this rank leaves (the end of finalize): deliver what was
    /// handed over but is not delivered yet (a send returns once a frame
    /// is handed over). On processes: payloads a receiver is still to copy
    /// out of this process's memory, and frames held for a rank being
    /// replaced until it is up. Without it a partner read the last
    /// checkpoint piece from freed memory, or lost the ring with the
    /// finalize leader's `Exit` behind a payload gone with its sender and
    /// waited forever. Backends that deliver at the send have nothing to
    /// do.
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}
