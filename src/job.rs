//! Running a job: the restartable rank function and its harness.
//!
//! The harness calls the rank function; when it unwinds with
//! `Error::Rollback`, the harness runs the protocol's recovery and calls the
//! function again (the Reinit/Fenix model, DESIGN principle 3). A replacement
//! rank starts in recovery. When the function returns `Ok`, the rank
//! finalizes with the others (a failure during finalize still rolls back).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::api::Ctx;
use crate::config::{Backend, Config};
use crate::driver::processes::{self, launcher};
use crate::driver::sim::{self, SimReport};
use crate::driver::threads;
use crate::engine::Engine;
use crate::{Error, Result};

/// The type of a rank function.
pub type RankFn<T> = dyn Fn(&mut Ctx) -> Result<T> + Send + Sync;

/// A rank function that may borrow (a driver's wrapper around the user's).
pub(crate) type BorrowedRankFn<'a, T> = dyn Fn(&mut Ctx) -> Result<T> + Send + Sync + 'a;

/// Job-wide statistics (the JSON summary's measured fields).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobStats {
    /// Wall time of the whole job.
    pub wall_s: f64,
    /// Failure events (a node kill is one event).
    pub failures: u64,
    /// Ranks killed.
    pub ranks_killed: u64,
    /// Rank restarts from a checkpoint (survivors and replacements).
    pub ranks_rolled_back: u64,
    /// Of those, restarts from the very beginning because no complete
    /// committed generation survived (or none existed yet).
    pub ranks_restarted_from_scratch: u64,
    /// Of those, restarts from the beginning of a rank that had a stored
    /// checkpoint with a holder alive since it was stored (message
    /// logging): a restart that recovery should not have needed. The
    /// driver counts them from what it saw (stored pieces, kills,
    /// placement), not from what the protocol decided; `lazarus chaos`
    /// fails such a case.
    #[serde(default)]
    pub needless_restarts: u64,
    /// Time from a failure until every rank resumed, summed over recoveries.
    pub recovery_s: f64,
    /// Checkpoint generations committed.
    pub checkpoints: u64,
    /// Bytes of all committed pieces (all ranks, all generations).
    pub checkpoint_bytes: u64,
    /// Committed pieces (all ranks, all generations): `checkpoint_bytes`
    /// over this is the mean piece size, whether every rank commits every
    /// generation (coordinated) or ranks commit on their own (message
    /// logging, forced by a log budget).
    #[serde(default)]
    pub checkpoint_pieces: u64,
    /// Longest time a rank spent in one checkpoint.
    pub checkpoint_s: f64,
    /// Time spent in checkpoints, averaged over ranks.
    pub checkpoint_s_total: f64,
    /// Under message logging: time spent on the send path for the log
    /// (the protocol's handling of each send and the wait before a send
    /// may leave), averaged over ranks; ranks that did not finish their
    /// rank function (killed) do not report theirs.
    #[serde(default)]
    pub send_logging_s_total: f64,
    /// Median over committed generations of rank 0's snapshot latency:
    /// from entering the generation at its safe point to its commit (the
    /// whole blocking checkpoint under `coordinated`; under
    /// `chandy-lamport` the wave, which the application does not wait for).
    #[serde(default)]
    pub snapshot_latency_s: f64,
    /// Newest committed generation.
    pub last_generation: Option<u64>,
    /// Peak bytes of message logs in memory on one rank (each distinct
    /// payload buffer once; spilled payloads not included).
    pub peak_log_bytes: u64,
    /// Peak number of messages in the log of one rank.
    #[serde(default)]
    pub peak_log_records: u64,
    /// Messages logged by senders (all ranks, all incarnations).
    #[serde(default)]
    pub log_records: u64,
    /// Payload bytes logged by senders.
    #[serde(default)]
    pub log_bytes: u64,
    /// Determinants logged (outcomes of wildcard receptions).
    #[serde(default)]
    pub determinants: u64,
    /// Logged messages sent again to recovering ranks.
    #[serde(default)]
    pub messages_resent: u64,
    /// Collectives completed from a logged result (ULML).
    #[serde(default)]
    pub collectives_from_log: u64,
    /// Payload bytes sent inside correlated sets without a log copy
    /// (`correlated`, 004 §3.2); every logged byte is inter-set.
    #[serde(default)]
    pub spared_log_bytes: u64,
    /// Payload bytes message logs moved to their spill files because the
    /// log budget was reached (all ranks).
    #[serde(default)]
    pub spilled_log_bytes: u64,
    /// Set synchronisations for checkpoints (`correlated`, 004 §3.3), one
    /// per rank per set checkpoint.
    #[serde(default)]
    pub set_syncs: u64,
    /// Their mean time (entering the checkpoint to the set's first
    /// barrier), seconds.
    #[serde(default)]
    pub set_sync_s: f64,
    /// Their longest, seconds.
    #[serde(default)]
    pub set_sync_max_s: f64,
    /// Ranks in the largest correlated set.
    #[serde(default)]
    pub set_size: u64,
    /// Markers sent by non-blocking snapshots (`chandy-lamport`, all
    /// ranks and generations; n(n − 1) a generation, 000 §IV-D).
    #[serde(default)]
    pub markers: u64,
    /// Messages recorded as channel state (sent before their sender's
    /// cut, received after their receiver's).
    #[serde(default)]
    pub channel_messages: u64,
    /// Their payload bytes.
    #[serde(default)]
    pub channel_bytes: u64,
    /// Messages held out of the application's reach: they arrived after
    /// their channel's marker, before their receiver recorded.
    #[serde(default)]
    pub held_messages: u64,
    /// 000 §IV's wave (`chandy-lamport` with a `get()` fix): markers by
    /// kind, all ranks and generations.
    #[serde(default)]
    pub wave: crate::cuts::WaveCounts,
    /// What the cut checker found (`--check-cuts`, failure-free runs).
    #[serde(default)]
    pub cuts: Option<crate::cuts::CutReport>,
    /// `coordinated`: generations committed by the Gsync scheme of 003
    /// §3.1.2 (captured at once, right after a GSYNC).
    #[serde(default)]
    pub gsync_checkpoints: u64,
    /// `coordinated`: generations committed by the Locks scheme (a barrier,
    /// the counting rounds, before the capture).
    #[serde(default)]
    pub locks_checkpoints: u64,
    /// `coordinated`: Gsync cuts that did not hold (a message or an access
    /// crossed them), dropped and taken again by Locks.
    #[serde(default)]
    pub abandoned_cuts: u64,
    /// `rma`: one-sided accesses logged at their origin (LP, 003 §3.2.3).
    #[serde(default)]
    pub accesses_logged: u64,
    /// `rma`: their payload bytes.
    #[serde(default)]
    pub access_log_bytes: u64,
    /// `rma`: the most payload bytes one rank's access log held.
    #[serde(default)]
    pub peak_access_log_bytes: u64,
    /// `rma`: logged accesses applied to a recovering rank's window.
    #[serde(default)]
    pub accesses_replayed: u64,
    /// `rma`: accesses a re-executing rank did not issue again.
    #[serde(default)]
    pub accesses_skipped: u64,
    /// `rma`: gets and fetching accesses logged at their target (LG, 003
    /// Alg. 1).
    #[serde(default)]
    pub gets_logged: u64,
    /// `rma`: their data bytes (sent back to the target once the epoch
    /// closed).
    #[serde(default)]
    pub get_log_bytes: u64,
    /// `rma`: gets of a re-executing rank answered from its target's log.
    #[serde(default)]
    pub gets_replayed: u64,
    /// `rma`: accesses to a rank being recovered, held in the log for it
    /// to pull.
    #[serde(default)]
    pub accesses_held: u64,
    /// `rma`: demand checkpoints asked for because an access log passed
    /// half of `--log-budget` (003 §6.2).
    #[serde(default)]
    pub demand_checkpoints: u64,
    /// `rma`: recoveries that fell back to the last coordinated checkpoint
    /// because an N or M flag was set (003 §3.2.3, §4.2).
    #[serde(default)]
    pub access_fallbacks: u64,
    /// Proactive fault tolerance (001): evacuations, moves, forwarding and
    /// time per iteration, when the run had workers or warnings.
    #[serde(default)]
    pub migration: Option<crate::migration::MigrationReport>,
    /// With `--checkpoint-interval daly`: the last interval chosen, in safe
    /// points.
    pub daly_every: Option<u64>,
    /// Daly's interval (compute seconds between checkpoints) it came from.
    pub daly_interval_s: Option<f64>,
    /// The measured checkpoint cost Daly's formula used, seconds.
    pub daly_cost_s: Option<f64>,
    /// Kill specifications whose moment never came.
    pub unfired_kills: Vec<String>,
    /// Failures as the processes backend's launcher detected them.
    #[serde(default)]
    pub failure_detections: Vec<FailureDetection>,
    /// Suspicions of the processes backend's failure detector that turned
    /// out false: a rank silent past the adaptive timeout was heard from
    /// again. Counted for every rank, though only ranks on other hosts are
    /// ever declared dead for silence (see `driver::processes::detector`).
    #[serde(default)]
    pub false_suspicions: u64,
    /// Times the whole job started again from the beginning because the
    /// protocol could not rebuild a lost rank (message logging, when a rank
    /// died together with every holder of its checkpoint).
    #[serde(default)]
    pub job_restarts: u64,
    /// Largest peak resident set of one rank's process, bytes (backends
    /// with a process per rank; `None` elsewhere). Logged payloads, checkpoint
    /// pieces held for others and receive buffers show here.
    #[serde(default)]
    pub peak_rss_bytes: Option<u64>,
    /// Mean over rank processes of their peak resident set, bytes.
    #[serde(default)]
    pub mean_peak_rss_bytes: Option<u64>,
    /// Minor page faults of all rank processes (first touches of fresh
    /// memory: what retaining logged buffers costs in the kernel).
    #[serde(default)]
    pub minor_faults: Option<u64>,
    /// CPU time of all rank processes in user mode, seconds (backends with
    /// a process per rank).
    #[serde(default)]
    pub user_cpu_s: Option<f64>,
    /// CPU time the kernel spent for all rank processes, seconds: page
    /// faults of fresh memory, system calls, scheduling.
    #[serde(default)]
    pub system_cpu_s: Option<f64>,
    /// The run's timeline, when `Config::trace` asked for one (written by
    /// `--trace FILE`, not part of the JSON summary).
    #[serde(skip)]
    pub trace: Option<crate::trace::Trace>,
}

impl JobStats {
    /// Fold in the statistics of an earlier attempt of the same job (it
    /// ended unrecoverably and the job started again).
    fn add_earlier_attempt(&mut self, e: JobStats) {
        self.wall_s += e.wall_s;
        self.failures += e.failures;
        self.ranks_killed += e.ranks_killed;
        self.ranks_rolled_back += e.ranks_rolled_back;
        self.ranks_restarted_from_scratch += e.ranks_restarted_from_scratch;
        self.needless_restarts += e.needless_restarts;
        self.recovery_s += e.recovery_s;
        self.checkpoints += e.checkpoints;
        self.checkpoint_bytes += e.checkpoint_bytes;
        self.checkpoint_pieces += e.checkpoint_pieces;
        self.checkpoint_s = self.checkpoint_s.max(e.checkpoint_s);
        self.checkpoint_s_total += e.checkpoint_s_total;
        self.send_logging_s_total += e.send_logging_s_total;
        self.peak_log_bytes = self.peak_log_bytes.max(e.peak_log_bytes);
        self.peak_log_records = self.peak_log_records.max(e.peak_log_records);
        self.log_records += e.log_records;
        self.log_bytes += e.log_bytes;
        self.determinants += e.determinants;
        self.messages_resent += e.messages_resent;
        self.collectives_from_log += e.collectives_from_log;
        self.spared_log_bytes += e.spared_log_bytes;
        self.spilled_log_bytes += e.spilled_log_bytes;
        self.gsync_checkpoints += e.gsync_checkpoints;
        self.locks_checkpoints += e.locks_checkpoints;
        self.abandoned_cuts += e.abandoned_cuts;
        self.accesses_logged += e.accesses_logged;
        self.access_log_bytes += e.access_log_bytes;
        self.peak_access_log_bytes = self.peak_access_log_bytes.max(e.peak_access_log_bytes);
        self.accesses_replayed += e.accesses_replayed;
        self.accesses_skipped += e.accesses_skipped;
        self.gets_logged += e.gets_logged;
        self.get_log_bytes += e.get_log_bytes;
        self.gets_replayed += e.gets_replayed;
        self.accesses_held += e.accesses_held;
        self.demand_checkpoints += e.demand_checkpoints;
        self.access_fallbacks += e.access_fallbacks;
        let syncs = self.set_syncs + e.set_syncs;
        if syncs > 0 {
            self.set_sync_s = (self.set_sync_s * self.set_syncs as f64
                + e.set_sync_s * e.set_syncs as f64)
                / syncs as f64;
        }
        self.set_syncs = syncs;
        self.set_sync_max_s = self.set_sync_max_s.max(e.set_sync_max_s);
        self.set_size = self.set_size.max(e.set_size);
        self.job_restarts += e.job_restarts + 1;
        self.false_suspicions += e.false_suspicions;
        self.peak_rss_bytes = self.peak_rss_bytes.max(e.peak_rss_bytes);
        // The mean of this attempt's processes (or the earlier one's when
        // none of this attempt's reported).
        self.mean_peak_rss_bytes = self.mean_peak_rss_bytes.or(e.mean_peak_rss_bytes);
        if let Some(f) = e.minor_faults {
            *self.minor_faults.get_or_insert(0) += f;
        }
        if let Some(t) = e.user_cpu_s {
            *self.user_cpu_s.get_or_insert(0.0) += t;
        }
        if let Some(t) = e.system_cpu_s {
            *self.system_cpu_s.get_or_insert(0.0) += t;
        }
        let mut detections = e.failure_detections;
        detections.append(&mut self.failure_detections);
        self.failure_detections = detections;
    }
}

/// How many times a job under message logging may start again from the
/// beginning after an unrecoverable loss.
const MAX_JOB_RESTARTS: u64 = 3;

/// One failure event seen by the launcher of the processes backend.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureDetection {
    /// The world epoch the failure opened.
    pub epoch: u64,
    /// Ranks that died.
    pub ranks: Vec<crate::Rank>,
    /// How it was noticed (lost connection, exit status, missed heartbeats,
    /// or a fault-injection kill).
    pub cause: String,
    /// When the launcher noticed it (Unix time, seconds).
    pub detected_unix_s: f64,
    /// When every survivor had been sent the notice (Unix time, seconds).
    pub notified_unix_s: f64,
}

/// What a job produced.
#[derive(Debug)]
pub struct JobReport<T> {
    /// Each rank's return value (rank order), or the job's error.
    pub outcome: Result<Vec<T>>,
    /// Statistics.
    pub stats: JobStats,
    /// What the simulator reports (backend `sim` only).
    pub sim: Option<SimReport>,
    /// `Some(r)` in a program started by `lazarus launch`: this process is
    /// rank `r`, and `outcome` holds that rank's value only.
    pub rank: Option<crate::Rank>,
}

impl<T> JobReport<T> {
    pub(crate) fn failed(e: Error) -> Self {
        JobReport {
            outcome: Err(e),
            stats: JobStats::default(),
            sim: None,
            rank: None,
        }
    }
}

/// Run `f` as the rank function of every rank under `cfg`.
///
/// ```
/// use lazarus::{Config, ProtocolKind, ReduceOp};
/// let report = lazarus::run(&Config::new(4).protocol(ProtocolKind::Coordinated), |ctx| {
///     let world = ctx.world();
///     let mut sum = [0u64];
///     world.all_reduce_into(&[world.rank() as u64], &mut sum, ReduceOp::Sum)?;
///     Ok(sum[0])
/// });
/// assert_eq!(report.outcome.unwrap(), vec![6, 6, 6, 6]);
/// ```
///
/// Rank values cross process boundaries on the processes backend, hence the
/// `Serialize + DeserializeOwned` bound.
///
/// In a process started by a launcher (`lazarus launch`, or the processes
/// backend of a `run` call), this call runs one rank instead of a job (see
/// [`crate::driver::processes`]).
///
/// The runtime logs through `tracing` ([`crate::logging`]): the first call
/// installs a subscriber that prints warnings (or what `RUST_LOG`, or a
/// launcher's filter, asks for) on stderr, unless the program installed
/// one of its own before.
pub fn run<T, F>(cfg: &Config, f: F) -> JobReport<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
    F: Fn(&mut Ctx) -> Result<T> + Send + Sync + 'static,
{
    // Warnings reach stderr in a program that installed no subscriber
    // (a launched rank installs its launcher's filter, `LAZARUS_LOG`).
    crate::logging::init_default();
    let role = match processes::role_of_this_call(cfg.worker_args.is_some()) {
        Ok(r) => r,
        Err(e) => return JobReport::failed(e),
    };
    #[cfg(feature = "mpi")]
    let role = match (role, crate::driver::mpi::MpiLaunch::from_env(cfg)) {
        (processes::Role::Job, Some(env)) => {
            let turn = env.and_then(|env| {
                let turn =
                    processes::turn(env.call, env.earlier.as_deref(), cfg.worker_args.is_some())?;
                Ok((env, turn))
            });
            match turn {
                Ok((env, processes::Turn::Mine)) => {
                    let f: Box<RankFn<T>> = Box::new(f);
                    return crate::driver::mpi::run_rank(&env, cfg, &*f);
                }
                Ok((_, processes::Turn::Earlier(replay))) => processes::Role::Earlier(replay),
                Err(e) => return JobReport::failed(e),
            }
        }
        (role, _) => role,
    };
    let cfg = &match role {
        processes::Role::Job => cfg.clone(),
        processes::Role::Rank(env) => return run_launched_rank(&env, cfg, f),
        processes::Role::Earlier(Some(earlier)) => return decoded_report(*earlier),
        // A call the launcher did not record: run it here, on threads
        // (the same results), not as another launcher.
        processes::Role::Earlier(_) if matches!(cfg.backend, Backend::Processes | Backend::Mpi) => {
            Config {
                backend: Backend::Threads,
                ..cfg.clone()
            }
        }
        processes::Role::Earlier(_) => cfg.clone(),
    };
    let prepared = cfg.validate().and_then(|p| {
        let mut cfg = cfg.clone();
        cfg.restart_generation = prepare_storage(&cfg)?;
        Ok((p, cfg))
    });
    let (placement, cfg) = match prepared {
        Ok(x) => x,
        Err(e) => return JobReport::failed(e),
    };
    let f: Arc<RankFn<T>> = Arc::new(f);
    // Message logging cannot rebuild a rank whose checkpoint and
    // determinants died with every holder: then the job starts again from
    // the beginning (the kills that fired are not repeated), as coordinated
    // checkpointing restarts from scratch when no generation survives.
    let mut cfg = cfg;
    let mut earlier: Option<JobStats> = None;
    loop {
        let (outcome, mut stats, sim, record) = run_backend(&cfg, placement.clone(), f.clone());
        if let Some(e) = earlier.take() {
            stats.add_earlier_attempt(e);
        }
        match &outcome {
            Err(Error::Unrecoverable(why))
                if cfg.protocol.logs_messages() && stats.job_restarts < MAX_JOB_RESTARTS =>
            {
                tracing::warn!(
                    restart = stats.job_restarts + 1,
                    "lazarus: {why}; the job starts again from the beginning"
                );
                cfg.kills = stats
                    .unfired_kills
                    .iter()
                    .filter_map(|k| k.parse().ok())
                    .collect();
                earlier = Some(stats);
            }
            _ => {
                if let Some(key) = &cfg.worker_args {
                    remember_call(key, &outcome, record, &stats, &sim);
                }
                return JobReport {
                    outcome,
                    stats,
                    sim,
                    rank: None,
                };
            }
        }
    }
}

/// What one attempt of a job returned: each rank's value, statistics, the
/// simulator's report, and (processes backend) the values as the ranks
/// encoded them.
type Attempt<T> = (
    Result<Vec<T>>,
    JobStats,
    Option<SimReport>,
    Option<Result<Vec<Vec<u8>>>>,
);

/// Run the job once on `cfg.backend`.
fn run_backend<T>(
    cfg: &Config,
    placement: crate::topology::Placement,
    f: Arc<RankFn<T>>,
) -> Attempt<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
{
    match cfg.backend {
        Backend::Threads => {
            let (outcome, stats) = threads::run(cfg, placement, f);
            (outcome, stats, None, None)
        }
        Backend::Sim => {
            let (outcome, stats, report) = sim::run(cfg, placement, f);
            (outcome, stats, Some(report), None)
        }
        Backend::Processes => {
            let (raw, stats) = launcher::launch(&launch_spec(cfg));
            let outcome = decoded(raw.clone());
            (outcome, stats, None, Some(raw))
        }
        #[cfg(feature = "mpi")]
        Backend::Mpi => {
            let (raw, stats) = crate::driver::mpi::launch::launch(&mpi_launch_spec(cfg));
            let outcome = decoded(raw.clone());
            (outcome, stats, None, Some(raw))
        }
        #[cfg(not(feature = "mpi"))]
        Backend::Mpi => (
            Err(Error::config("backend", "built without the `mpi` feature")),
            JobStats::default(),
            None,
            None,
        ),
    }
}

/// How the mpi backend starts this program under `mpiexec` for `cfg`
/// (the same program and arguments as [`launch_spec`]).
#[cfg(feature = "mpi")]
fn mpi_launch_spec(cfg: &Config) -> crate::driver::mpi::launch::LaunchSpec {
    let (program, args, call, earlier) = self_launch(cfg);
    crate::driver::mpi::launch::LaunchSpec {
        program,
        args,
        ranks: cfg.ranks,
        protocol: cfg.protocol.name().into(),
        protocol_settings: launcher::ProtocolSettings::of(cfg),
        kills: (cfg.kills.iter())
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
        call,
        earlier,
        quiet_stdout: cfg.worker_args.is_some(),
    }
}

/// This program, the arguments that make its `run` call a rank, and (a
/// test harness) which keyed call that is and what the earlier ones
/// returned.
fn self_launch(
    cfg: &Config,
) -> (
    std::path::PathBuf,
    Vec<std::ffi::OsString>,
    Option<usize>,
    Vec<processes::EarlierCall>,
) {
    let program = std::env::current_exe().unwrap_or_else(|_| "lazarus".into());
    let (args, call, earlier) = match &cfg.worker_args {
        Some(a) => {
            let calls = HARNESS_CALLS.lock().unwrap_or_else(|e| e.into_inner());
            let earlier: Vec<processes::EarlierCall> = calls
                .iter()
                .find(|(k, _)| k == a)
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            (a.clone(), Some(earlier.len()), earlier)
        }
        None => (std::env::args().skip(1).collect(), None, Vec::new()),
    };
    (
        program,
        args.into_iter().map(Into::into).collect(),
        call,
        earlier,
    )
}

/// A test harness's calls of `run` so far (those naming `worker_args`, on
/// every backend), per worker command (a test binary runs several; its rank
/// processes must find the same one), with what each returned: a rank
/// process replays them instead of running them again on its way to its
/// own call.
static HARNESS_CALLS: std::sync::Mutex<Vec<(Vec<String>, Vec<processes::EarlierCall>)>> =
    std::sync::Mutex::new(Vec::new());

/// Record a harness call: the ranks' encoded values as they came (processes)
/// or encoded here.
fn remember_call<T: Serialize>(
    key: &[String],
    outcome: &Result<Vec<T>>,
    raw: Option<Result<Vec<Vec<u8>>>>,
    stats: &JobStats,
    sim: &Option<SimReport>,
) {
    let raw = raw.unwrap_or_else(|| match outcome {
        Ok(values) => values
            .iter()
            .map(|v| postcard::to_allocvec(v).map_err(Error::from))
            .collect(),
        Err(e) => Err(e.clone()),
    });
    let mut calls = HARNESS_CALLS.lock().unwrap_or_else(|e| e.into_inner());
    let entry = (raw, stats.clone(), sim.clone());
    match calls.iter_mut().find(|(a, _)| a == key) {
        Some((_, v)) => v.push(entry),
        None => calls.push((key.to_vec(), vec![entry])),
    }
}

/// Each rank's value decoded from its postcard encoding.
fn decoded<T: DeserializeOwned>(raw: Result<Vec<Vec<u8>>>) -> Result<Vec<T>> {
    raw.and_then(|all| {
        all.iter()
            .map(|b| postcard::from_bytes::<T>(b).map_err(Error::from))
            .collect()
    })
}

/// The report of a processes-backend job replayed from the launcher's
/// record: each rank's value decoded.
fn decoded_report<T: DeserializeOwned>(job: processes::EarlierCall) -> JobReport<T> {
    let (outcome, stats, sim) = job;
    JobReport {
        outcome: decoded(outcome),
        stats,
        sim,
        rank: None,
    }
}

/// How the processes backend starts this program's rank processes for
/// `cfg`: the same program with the same arguments, whose first `run` call
/// is the rank (with the protocol of this call, so that `lazarus bench`
/// can alternate protocols); or the program with `cfg.worker_args`, whose
/// k-th `run` call with `worker_args` is the rank (a test harness: see
/// `processes::role_of_this_call`).
fn launch_spec(cfg: &Config) -> launcher::LaunchSpec {
    let (program, args, call, earlier) = self_launch(cfg);
    launcher::LaunchSpec {
        program,
        args,
        ranks: cfg.ranks,
        nodes: cfg.nodes,
        kills: cfg.kills.clone(),
        listen: cfg.listen,
        hosts: cfg.hosts,
        sets: cfg.sets,
        agent_program: agent_program(),
        heartbeat_timeout: cfg.heartbeat_timeout,
        max_frame: cfg.max_frame,
        restart_generation: cfg.restart_generation,
        self_launch: true,
        call,
        protocol: cfg.protocol.name().into(),
        protocol_override: Some(cfg.protocol),
        protocol_settings: launcher::ProtocolSettings::of(cfg),
        quiet_stdout: cfg.worker_args.is_some(),
        progress_bar: cfg.progress_bar,
        earlier,
        trace: cfg.trace,
    }
}

/// The `lazarus` executable agents run as: this one if it is `lazarus`,
/// else `LAZARUS_AGENT_PROGRAM`, else `lazarus` on the `PATH`.
fn agent_program() -> std::path::PathBuf {
    let me = std::env::current_exe().ok();
    match me {
        Some(p) if p.file_name().is_some_and(|n| n == "lazarus") => p,
        _ => std::env::var_os("LAZARUS_AGENT_PROGRAM")
            .map(Into::into)
            .unwrap_or_else(|| "lazarus".into()),
    }
}

/// This process is rank `env.rank` of a launched job: run that rank.
fn run_launched_rank<T, F>(env: &processes::LaunchEnv, cfg: &Config, f: F) -> JobReport<T>
where
    T: Serialize + DeserializeOwned + Send + 'static,
    F: Fn(&mut Ctx) -> Result<T> + Send + Sync + 'static,
{
    // The launcher decides the job's shape and failures, and the protocol
    // with its settings when it imposes one.
    let cfg = match env.protocol {
        Some(_) => env.protocol_settings.impose(cfg.clone()),
        None => cfg.clone(),
    };
    let cfg = Config {
        backend: Backend::Processes,
        protocol: env.protocol.unwrap_or(cfg.protocol),
        ranks: env.size,
        nodes: env.nodes,
        kills: env.kills.clone(),
        restart_generation: env.restart_generation,
        ..cfg
    };
    let outcome = cfg
        .placement()
        .and_then(|pl| processes::worker::run_worker(env, &cfg, pl, &f));
    if let Err(e @ Error::Driver(_)) = &outcome {
        // Set-up failures never reach the launcher: say them here.
        tracing::error!(rank = env.rank, "lazarus: rank {}: {e}", env.rank);
    }
    if env.self_launch {
        // The launcher has the outcome; the program's own code after `run`
        // belongs to the launcher's process, not to this rank.
        std::process::exit(0);
    }
    JobReport {
        outcome: outcome.map(|v| vec![v]),
        stats: JobStats::default(),
        sim: None,
        rank: Some(env.rank),
    }
}

/// Check the checkpoint directories before any rank starts. A fresh run must
/// not find an earlier run's checkpoints in its disk level (it would restore
/// them at a recovery). A restart uses the newest intact committed
/// generation, and when the same directory is also written, the unusable
/// generations newer than that one are removed first, so that this run's
/// generations replace them cleanly. A restart directory's manifest must
/// match the job (`disk::plan_restart`), and each disk level's directory
/// is given the job's manifest, which also proves it writable.
pub(crate) fn prepare_storage(cfg: &Config) -> Result<Option<u64>> {
    use crate::store::disk;
    use crate::store::levels::LevelSpec;
    let mut manifest = disk::Manifest::of(cfg);
    let restart = match &cfg.restart {
        Some(dir) => {
            let (recorded, plan) = disk::plan_restart(dir, cfg)?;
            // Restarted by a job that does not name its program, a
            // directory keeps the name it had.
            if manifest.program.is_none() {
                manifest.program = recorded.and_then(|m| m.program);
            }
            let g = plan.generation.ok_or_else(|| {
                Error::config(
                    "restart",
                    format!(
                        "{} holds no committed generation usable by {} ranks",
                        dir.display(),
                        cfg.ranks
                    ),
                )
            })?;
            Some((dir.clone(), g))
        }
        None => None,
    };
    for level in &cfg.storage {
        let LevelSpec::Disk { dir, .. } = level else {
            continue;
        };
        let unusable = |e: Error| {
            Error::config(
                "storage",
                format!(
                    "cannot write checkpoints to {}: {}",
                    dir.display(),
                    match e {
                        Error::Driver(m) => m,
                        e => e.to_string(),
                    }
                ),
            )
        };
        let existing = if dir.exists() {
            disk::committed_generations(dir).map_err(unusable)?
        } else {
            Vec::new()
        };
        match &restart {
            Some((rdir, g)) if rdir == dir => disk::remove_newer_than(dir, *g)?,
            _ if !existing.is_empty() => {
                return Err(Error::config(
                    "storage",
                    format!(
                        "{} already holds checkpoints of an earlier run (generations {}); \
                         restart from them (`Config::restart`), or choose an empty directory",
                        dir.display(),
                        crate::error::list(&existing)
                    ),
                ));
            }
            _ => {}
        }
        // Written before any rank starts: it records what the directory
        // will hold, and a directory that cannot be written is refused now
        // rather than at the first checkpoint.
        disk::write_manifest(dir, &manifest).map_err(unusable)?;
    }
    Ok(restart.map(|(_, g)| g))
}

/// The harness of one rank incarnation.
pub(crate) fn run_rank<T>(engine: Rc<RefCell<Engine>>, f: &BorrowedRankFn<'_, T>) -> Result<T> {
    let r = run_incarnation(&engine, f);
    if matches!(r, Err(Error::Killed)) {
        // Killed while it waited (another rank's fault plan took its
        // node): the span it waited in ends at the kill on the timeline,
        // instead of vanishing with the incarnation.
        engine.borrow_mut().end_timeline();
    }
    r
}

fn run_incarnation<T>(engine: &Rc<RefCell<Engine>>, f: &BorrowedRankFn<'_, T>) -> Result<T> {
    let starts_in_recovery = engine.borrow().starts_in_recovery();
    if starts_in_recovery {
        recover(engine)?;
    }
    loop {
        let mut ctx = Ctx::new(engine.clone());
        let r = f(&mut ctx).and_then(|v| engine.borrow_mut().finalize().map(|()| v));
        match r {
            Ok(v) => return Ok(v),
            Err(Error::Rollback { .. }) => recover(engine)?,
            Err(e) => {
                // An error may be the consequence of a failure the engine
                // already knows about (the rank function turned it into its
                // own error): the interrupt wins.
                let pending = engine.borrow().interrupted().cloned();
                match pending {
                    Some(Error::Rollback { .. }) => recover(engine)?,
                    Some(i) if !e.is_control_flow() => return Err(i),
                    _ => return Err(e),
                }
            }
        }
    }
}

fn recover(engine: &Rc<RefCell<Engine>>) -> Result<()> {
    loop {
        match engine.borrow_mut().recover() {
            Ok(()) => return Ok(()),
            Err(Error::Rollback { .. }) => continue, // a failure during recovery
            Err(e) => return Err(e),
        }
    }
}
