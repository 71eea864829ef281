//! The `processes` backend: one OS process per rank, started and watched by
//! a launcher.
//!
//! - [`launcher`]: starts the rank processes (`lazarus run --backend
//!   processes`, or `lazarus launch -n N -- PROGRAM` for a user's own
//!   program), detects deaths by exit status and lost control connection
//!   (and, for ranks on other hosts, missed heartbeats), tells the survivors, starts replacements with the
//!   dead rank's number, and fires the fault plan's kills with `SIGKILL`.
//! - [`agent`]: with ranks on several hosts (`--hosts slurm`), one agent per
//!   host, started by `srun`, starts, kills and reaps that host's ranks.
//! - `worker`: a rank process's endpoint, its connections and the threads
//!   serving them (frame delivery, RMA progress, heartbeats).
//! - [`detector`]: the adaptive (phi accrual) heartbeat failure detector
//!   the launcher runs for each rank.
//! - [`wire`]: the length-prefixed, versioned frame format.
//! - [`auth`]: mutual HMAC challenge–response with the per-job secret.
//! - [`net`]: Unix domain sockets on one host, TCP between hosts.
//!
//! A rank process is the same program as the launcher's caller, run again
//! with `LAZARUS_*` variables in its environment (the way `mpirun` starts
//! MPI programs). Its call to [`crate::run`] notices them and becomes that
//! rank instead of starting a job ([`launched`] tells a program whether it
//! was started so). The rank's result travels back to the launcher
//! (postcard), so `run` returns every rank's value as on the other
//! backends.
//!
//! Under Slurm (`SLURM_JOB_ID` set), `lazarus launch` takes the task count
//! and node count from `SLURM_NTASKS` and `SLURM_NNODES` when `-n` and
//! `--nodes` are not given, and in an allocation of several nodes starts
//! the ranks on them ([`agent`]: one agent per host, started by `srun`).

pub mod agent;
pub mod auth;
pub mod detector;
pub mod launcher;
pub mod net;
pub(crate) mod shm;
pub(crate) mod shm_window;
pub mod wire;
pub(crate) mod worker;

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use crate::fault::KillSpec;
use crate::{Error, Rank, Result};
use net::{Addr, Listen};

/// How often a rank heartbeats for a heartbeat timeout of `timeout`: four
/// times per timeout, and at least every millisecond apart (a zero timeout
/// from the environment must not make a busy loop; the launcher refuses
/// one under 10 ms).
pub(crate) fn heartbeat_period(timeout: Duration) -> Duration {
    (timeout / 4).max(Duration::from_millis(1))
}

/// Environment variable names (the launcher's handover to a rank process).
pub(crate) mod var {
    pub const JOB: &str = "LAZARUS_JOB";
    pub const RANK: &str = "LAZARUS_RANK";
    pub const SIZE: &str = "LAZARUS_SIZE";
    pub const NODES: &str = "LAZARUS_NODES";
    pub const INCARNATION: &str = "LAZARUS_INCARNATION";
    pub const EPOCH: &str = "LAZARUS_EPOCH";
    pub const LAUNCHER: &str = "LAZARUS_LAUNCHER";
    pub const LAUNCHER_PID: &str = "LAZARUS_LAUNCHER_PID";
    pub const SECRET_FILE: &str = "LAZARUS_SECRET_FILE";
    pub const DIR: &str = "LAZARUS_DIR";
    pub const LISTEN: &str = "LAZARUS_LISTEN";
    pub const T0_NS: &str = "LAZARUS_T0_NS";
    pub const FIRED: &str = "LAZARUS_FIRED";
    pub const KILLS: &str = "LAZARUS_KILLS";
    pub const RESTART_GENERATION: &str = "LAZARUS_RESTART_GENERATION";
    pub const MAX_FRAME: &str = "LAZARUS_MAX_FRAME";
    pub const HEARTBEAT_MS: &str = "LAZARUS_HEARTBEAT_MS";
    pub const SELF_LAUNCH: &str = "LAZARUS_SELF_LAUNCH";
    pub const CALL: &str = "LAZARUS_CALL";
    pub const PROTOCOL: &str = "LAZARUS_PROTOCOL";
    pub const LOG_BUDGET: &str = "LAZARUS_LOG_BUDGET";
    pub const SETS: &str = "LAZARUS_SETS";
    pub const CHECKPOINT_SCHEME: &str = "LAZARUS_CHECKPOINT_SCHEME";
    /// `Config::rma_log`, by name.
    pub const RMA_LOG: &str = "LAZARUS_RMA_LOG";
    pub const EARLIER: &str = "LAZARUS_EARLIER";
    pub const SHM_DIR: &str = "LAZARUS_SHM_DIR";
    pub const HOST_RANKS: &str = "LAZARUS_HOST_RANKS";
    pub const TRACE_NS: &str = "LAZARUS_TRACE_NS";
    /// The launcher's log filter (see `crate::logging`), for ranks and agents.
    pub const LOG: &str = crate::logging::HANDOVER_VAR;
    /// Agent: the launcher's address for agents.
    pub const AGENT_LAUNCHER: &str = "LAZARUS_AGENT_LAUNCHER";
    /// Agent: the job secret, hexadecimal (never passed on to ranks).
    pub const AGENT_SECRET: &str = "LAZARUS_AGENT_SECRET";
    /// Agent: the launcher's process id (on the launcher's host).
    pub const AGENT_LAUNCHER_PID: &str = "LAZARUS_AGENT_LAUNCHER_PID";
    /// Agent: node number when not under Slurm (`SLURM_NODEID` otherwise).
    pub const AGENT_NODE: &str = "LAZARUS_AGENT_NODE";
}

/// What a rank process learns from its launcher.
#[derive(Debug, Clone)]
pub(crate) struct LaunchEnv {
    pub job: u64,
    pub rank: Rank,
    pub size: usize,
    pub nodes: usize,
    pub incarnation: u64,
    pub epoch: u64,
    pub launcher: Addr,
    pub launcher_pid: Option<u32>,
    pub secret_file: PathBuf,
    pub dir: PathBuf,
    pub listen: Listen,
    pub t0: SystemTime,
    pub fired: Vec<usize>,
    pub kills: Vec<KillSpec>,
    pub restart_generation: Option<u64>,
    pub max_frame: usize,
    pub heartbeat: Duration,
    /// Started by `run --backend processes` (exit after reporting), not by
    /// `lazarus launch` (return to the program).
    pub self_launch: bool,
    /// Which call of [`crate::run`] in this process is the rank: `None`,
    /// the first; `Some(k)` (a test harness), the `k`-th of the calls whose
    /// configuration names `worker_args` (the launcher counts only those).
    pub call: Option<usize>,
    /// The protocol the launcher imposes, if any, with its settings.
    pub protocol: Option<crate::protocol::ProtocolKind>,
    /// The settings imposed with `protocol`.
    pub protocol_settings: launcher::ProtocolSettings,
    /// File with the results of the program's earlier `run` calls.
    pub earlier: Option<PathBuf>,
    /// The job's shared-memory directory (rings between ranks on this
    /// host), when the launcher made one.
    pub shm_dir: Option<PathBuf>,
    /// Rank processes the launcher (or the node's agent) runs on this
    /// host, this one included: with more than the host's cores, a rank
    /// that waits gives its core away instead of spinning.
    pub host_ranks: usize,
    /// Record a timeline, merging spans shorter than this (the launcher's
    /// `--trace`; a launched program's own `Config` need not ask).
    pub trace: Option<Duration>,
}

/// Whether a file name a peer sent names a file directly inside a
/// directory of ours (no path, no parent, no hidden file).
pub(crate) fn plain_file_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && !name.starts_with('.')
}

fn get(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| Error::Driver(format!("launched without {name}")))
}

fn num<T: std::str::FromStr>(name: &str) -> Result<T> {
    let v = get(name)?;
    v.parse()
        .map_err(|_| Error::Driver(format!("{name}=`{v}` is not a number")))
}

fn list<T: std::str::FromStr>(name: &str) -> Result<Vec<T>> {
    let v = std::env::var(name).unwrap_or_default();
    v.split(',')
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse()
                .map_err(|_| Error::Driver(format!("{name}: bad element `{s}`")))
        })
        .collect()
}

impl LaunchEnv {
    /// The launch environment, if this process was started by a launcher.
    fn from_env() -> Option<Result<LaunchEnv>> {
        std::env::var_os(var::JOB)?;
        Some(Self::parse())
    }

    fn parse() -> Result<LaunchEnv> {
        let kills = std::env::var(var::KILLS).unwrap_or_default();
        let kills = kills
            .split(';')
            .filter(|s| !s.is_empty())
            .map(str::parse)
            .collect::<Result<Vec<KillSpec>>>()?;
        Ok(LaunchEnv {
            job: u64::from_str_radix(&get(var::JOB)?, 16)
                .map_err(|_| Error::Driver(format!("{} is not hexadecimal", var::JOB)))?,
            rank: num(var::RANK)?,
            size: num(var::SIZE)?,
            nodes: num(var::NODES)?,
            incarnation: num(var::INCARNATION)?,
            epoch: num(var::EPOCH)?,
            launcher: get(var::LAUNCHER)?.parse()?,
            launcher_pid: num(var::LAUNCHER_PID).ok(),
            secret_file: PathBuf::from(get(var::SECRET_FILE)?),
            dir: PathBuf::from(get(var::DIR)?),
            listen: get(var::LISTEN)?.parse()?,
            t0: SystemTime::UNIX_EPOCH + Duration::from_nanos(num(var::T0_NS)?),
            fired: list(var::FIRED)?,
            kills,
            restart_generation: num(var::RESTART_GENERATION).ok(),
            max_frame: num(var::MAX_FRAME)?,
            heartbeat: Duration::from_millis(num(var::HEARTBEAT_MS)?),
            self_launch: std::env::var_os(var::SELF_LAUNCH).is_some(),
            call: num(var::CALL).ok(),
            earlier: std::env::var_os(var::EARLIER).map(PathBuf::from),
            shm_dir: std::env::var_os(var::SHM_DIR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            host_ranks: num(var::HOST_RANKS).unwrap_or(1),
            trace: num(var::TRACE_NS).ok().map(Duration::from_nanos),
            protocol: match std::env::var(var::PROTOCOL) {
                Ok(p) => Some(p.parse()?),
                Err(_) => None,
            },
            protocol_settings: launcher::ProtocolSettings::from_env()?,
        })
    }
}

/// Whether this process is a rank started by a Lazarus launcher (its call
/// to [`crate::run`] will run one rank, not a whole job).
pub fn launched() -> bool {
    std::env::var_os(var::JOB).is_some()
}

/// Calls of [`crate::run`] made so far by this process: all of them, or
/// (a test harness's rank process) those whose configuration names
/// `worker_args`.
static CALLS: AtomicUsize = AtomicUsize::new(0);

/// How this process's current call of [`crate::run`] must behave.
pub(crate) enum Role {
    /// Not launched: run the job as configured.
    Job,
    /// Launched, and this call is the rank.
    Rank(Box<LaunchEnv>),
    /// Launched, but this is an earlier call of the same program (a test
    /// running several jobs): replay what it returned in the launching
    /// process (or, for a call the launcher did not record, run it
    /// in-process on threads, which gives the same results) to reach the
    /// call that is the rank.
    Earlier(Option<Box<EarlierCall>>),
}

/// What an earlier `run` call returned: each rank's encoded value (or the
/// job's error), the statistics, and the simulator's report (backend `sim`).
pub(crate) type EarlierCall = (
    Result<Vec<Vec<u8>>>,
    crate::JobStats,
    Option<crate::driver::sim::SimReport>,
);

/// The launcher's record of the earlier calls, handed to rank processes in
/// a file of the job's private directory.
fn earlier_calls(path: &std::path::Path) -> Result<Vec<EarlierCall>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::Driver(format!("cannot read {}: {e}", path.display())))?;
    Ok(postcard::from_bytes(&bytes)?)
}

/// Decide the role of a call of [`crate::run`] whose configuration names
/// `worker_args` (`keyed`) or not.
///
/// A test harness's launcher counts only its keyed calls (a test names
/// `worker_args` on every backend, see `tests/common`), and records what
/// each returned: its rank processes count the same calls, replay the
/// recorded ones, and run an unkeyed call (which the launcher did not count)
/// for real without counting it, so that the `k`-th keyed call is the same
/// call on both sides whatever backends the test mixes.
pub(crate) fn role_of_this_call(keyed: bool) -> Result<Role> {
    let Some(env) = LaunchEnv::from_env() else {
        return Ok(Role::Job);
    };
    let env = env?;
    Ok(match turn(env.call, env.earlier.as_deref(), keyed)? {
        Turn::Mine => Role::Rank(Box::new(env)),
        Turn::Earlier(replay) => Role::Earlier(replay),
    })
}

/// Where a call of [`crate::run`] in a launched process stands.
pub(crate) enum Turn {
    /// This call is the rank.
    Mine,
    /// An earlier call (see [`Role::Earlier`]).
    Earlier(Option<Box<EarlierCall>>),
}

/// Count this call of [`crate::run`] (keyed or not) against `call`, the
/// keyed call that is the rank (`None`: the first call), replaying earlier
/// ones from the launcher's record in `earlier` (see
/// [`role_of_this_call`]; the mpi backend's launcher counts the same way).
pub(crate) fn turn(
    call: Option<usize>,
    earlier: Option<&std::path::Path>,
    keyed: bool,
) -> Result<Turn> {
    let call = match call {
        Some(_) if !keyed => return Ok(Turn::Earlier(None)),
        Some(c) => c,
        None => 0,
    };
    let k = CALLS.fetch_add(1, Ordering::SeqCst);
    match k.cmp(&call) {
        std::cmp::Ordering::Less => {
            let replay = match earlier {
                Some(path) => earlier_calls(path)?.into_iter().nth(k).map(Box::new),
                None => None,
            };
            Ok(Turn::Earlier(replay))
        }
        std::cmp::Ordering::Equal => Ok(Turn::Mine),
        std::cmp::Ordering::Greater => Err(Error::Driver(
            "a launched program runs one job: call lazarus::run once".into(),
        )),
    }
}
