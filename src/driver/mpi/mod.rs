//! The `mpi` backend: the ranks are the processes of an MPI job.
//!
//! Built with the `mpi` feature (rsmpi over the MPI that `mpicc` names).
//! Either `mpiexec -n 4 lazarus run cg --backend mpi` (or `srun`), where
//! each process's call of [`crate::run`] becomes the rank MPI gave it, or
//! `lazarus run ... --backend mpi --ranks 4` from a shell, which starts
//! `mpiexec` on this same program itself ([`launch`], as the processes
//! backend starts its rank processes) and returns every rank's value.
//!
//! Frames, one-sided requests and their replies are MPI messages on a
//! duplicate of `MPI_COMM_WORLD` ([`transport`]); a window's memory lives
//! in its owner's process, and its owner's runtime applies the operations
//! that arrive, whenever it waits, computes or sends. An MPI without ULFM
//! ends the job when a rank dies, so fault-plan kills (real `SIGKILL`s)
//! end the job too, and the job starts again from its newest committed
//! generation on disk: [`launch`] does that for a job it started,
//! `lazarus mpirun` for one a user started with `mpiexec` (as SCR's
//! `scr_srun` does).

mod endpoint;
pub mod launch;
mod transport;
#[cfg(feature = "ulfm")]
mod ulfm;

use std::path::PathBuf;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use self::endpoint::{FailureEvent, MpiEndpoint, Peer, Resume};
use self::transport::{TAG_FRAME, TAG_REPORT, Transport};
use crate::config::{Backend, Config};
use crate::driver::Stat;
use crate::driver::processes::launcher::ProtocolSettings;
use crate::driver::processes::wire::{RemoteError, WireMsg};
use crate::driver::shared::{Finals, StatsBook, rank_body};
use crate::fault::FaultPlan;
use crate::job::{JobReport, JobStats, RankFn};
use crate::{Error, Rank, Result};

/// Environment variables between [`launch`] and the ranks it starts.
pub(crate) mod var {
    /// Set by [`super::launch`]: this process is a rank of a job it started.
    pub const JOB: &str = crate::driver::mpi_env::SELF_LAUNCHED;
    /// Where rank 0 writes the job's report for the launcher.
    pub const REPORT: &str = "LAZARUS_MPI_REPORT";
    /// Where a fired kill is recorded (index and victims, a line each).
    pub const FIRED: &str = "LAZARUS_MPI_FIRED";
    /// Kill specifications that fired in an earlier attempt (indices).
    pub const SKIP_KILLS: &str = "LAZARUS_MPI_SKIP_KILLS";
    /// Set when the job starts again after a failure: restart from the
    /// newest committed generation of the disk level, if it has one.
    pub const RESUME: &str = "LAZARUS_MPI_RESUME";
    /// The earlier attempts (`launch::Attempts`), for the statistics.
    pub const ATTEMPTS: &str = "LAZARUS_MPI_ATTEMPTS";
    /// The protocol the launcher imposes (`lazarus bench` alternates).
    pub const PROTOCOL: &str = "LAZARUS_MPI_PROTOCOL";
    /// The kills the launcher imposes, comma-separated (`lazarus bench
    /// --failure` runs with and without them).
    pub const KILLS: &str = "LAZARUS_MPI_KILLS";
    /// As the processes backend's `LAZARUS_CALL`: which keyed call of a
    /// test harness is the rank.
    pub const CALL: &str = "LAZARUS_MPI_CALL";
    /// File with the harness's earlier calls' results.
    pub const EARLIER: &str = "LAZARUS_MPI_EARLIER";
    /// The `mpiexec` command line to use (split at white space).
    pub const MPIEXEC: &str = "LAZARUS_MPIEXEC";
}

/// This process took part in a repair of the job (ULFM): a survivor or a
/// substitute.
pub(super) static REPAIRED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// How long a process that took part in a repair waits in `MPI_Finalize`
/// before it leaves without it (`run_rank`).
const FINALIZE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What a process started under MPI learns of its job.
#[derive(Debug, Clone)]
pub(crate) struct MpiLaunch {
    /// Started by [`launch`] (not by a user's `mpiexec`): report to it and
    /// exit.
    pub self_launch: bool,
    pub report: Option<PathBuf>,
    pub fired: Option<PathBuf>,
    pub skip_kills: Vec<usize>,
    pub resume: bool,
    pub attempts: launch::Attempts,
    pub protocol: Option<crate::ProtocolKind>,
    /// The settings that go with the imposed protocol.
    pub protocol_settings: Option<ProtocolSettings>,
    pub kills: Option<Vec<crate::KillSpec>>,
    pub call: Option<usize>,
    pub earlier: Option<PathBuf>,
}

impl MpiLaunch {
    /// The launch environment when this call of [`crate::run`] is an MPI
    /// rank: started by [`launch`], or by an MPI launcher with `cfg` on
    /// the mpi backend.
    pub fn from_env(cfg: &Config) -> Option<Result<MpiLaunch>> {
        let self_launch = std::env::var_os(var::JOB).is_some();
        let under_mpi = crate::driver::mpi_env::launcher_rank().is_some();
        if !(self_launch || (cfg.backend == Backend::Mpi && under_mpi)) {
            return None;
        }
        let path = |v: &str| std::env::var_os(v).map(PathBuf::from);
        Some((|| {
            Ok(MpiLaunch {
                self_launch,
                report: path(var::REPORT),
                fired: path(var::FIRED),
                skip_kills: std::env::var(var::SKIP_KILLS)
                    .unwrap_or_default()
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(|s| {
                        s.parse()
                            .map_err(|_| Error::Driver(format!("{}: `{s}`", var::SKIP_KILLS)))
                    })
                    .collect::<Result<_>>()?,
                resume: std::env::var_os(var::RESUME).is_some(),
                attempts: launch::Attempts::from_env(),
                protocol: match std::env::var(var::PROTOCOL) {
                    Ok(p) => Some(p.parse()?),
                    Err(_) => None,
                },
                protocol_settings: match std::env::var_os(var::PROTOCOL) {
                    Some(_) => Some(ProtocolSettings::from_env()?),
                    None => None,
                },
                kills: match std::env::var(var::KILLS) {
                    Ok(k) => Some(
                        k.split(',')
                            .filter(|s| !s.is_empty())
                            .map(str::parse)
                            .collect::<Result<_>>()?,
                    ),
                    Err(_) => None,
                },
                call: std::env::var(var::CALL).ok().and_then(|c| c.parse().ok()),
                earlier: path(var::EARLIER),
            })
        })())
    }
}

/// What each rank sends rank 0 at the end.
#[derive(Serialize, Deserialize)]
struct RankReport {
    outcome: std::result::Result<serde_bytes::ByteBuf, RemoteError>,
    stats: Vec<(std::time::Duration, Stat)>,
    fired: Vec<usize>,
}

/// What rank 0 hands [`launch`]: each rank's encoded value (or the job's
/// error) and the statistics.
pub(crate) type JobOutcome = (Result<Vec<Vec<u8>>>, JobStats);

/// Run this process's rank of the MPI job; rank 0 gets the job's report,
/// the others their own value (`JobReport::rank`). A process started by
/// [`launch`] exits instead of returning.
pub(crate) fn run_rank<T>(env: &MpiLaunch, cfg: &Config, f: &RankFn<T>) -> JobReport<T>
where
    T: Serialize + DeserializeOwned,
{
    let Some(universe) = mpi::initialize() else {
        return JobReport::failed(Error::Driver(
            "MPI is already initialised (or was finalised): the mpi backend runs one job \
             per MPI process"
                .into(),
        ));
    };
    // This process is a rank: its MPI says whether it is fault tolerant.
    let in_place = cfg!(feature = "ulfm") && crate::driver::mpi_env::fault_tolerant();
    let me = Peer {
        host: host_hash(),
        pid: std::process::id(),
    };
    #[cfg(feature = "ulfm")]
    let joined = if in_place {
        // A substitute that cannot join leaves the survivors waiting.
        Ok(ulfm::join([me.host, u64::from(me.pid)]).unwrap_or_else(|e| transport::abort_job(&e)))
    } else {
        Ok(None)
    };
    #[cfg(not(feature = "ulfm"))]
    let joined: Result<Option<std::convert::Infallible>> = Ok(None);
    let report = match joined {
        #[cfg(feature = "ulfm")]
        Ok(Some(j)) => substitute(env, cfg, f, j),
        #[cfg(not(feature = "ulfm"))]
        Ok(Some(never)) => match never {},
        Ok(None) => match Transport::new(in_place) {
            Ok(net) => rank_with(env, cfg, f, net, me),
            Err(e) => JobReport::failed(e),
        },
        Err(e) => JobReport::failed(e),
    };
    if REPAIRED.load(std::sync::atomic::Ordering::Relaxed) {
        // Open MPI 5.0's MPI_Finalize after a repair sometimes never
        // returns (seen after two ranks died at once: the survivors wait in
        // it while the substitutes have left). The job's report is written
        // by now: a rank still there after a while leaves without it.
        std::thread::spawn(|| {
            std::thread::sleep(FINALIZE_GRACE);
            tracing::warn!("lazarus: MPI_Finalize did not return; leaving without it");
            std::process::exit(0);
        });
    }
    drop(universe); // MPI_Finalize
    if env.self_launch {
        // The launcher has the report; what the program does after `run`
        // belongs to the launching process.
        std::process::exit(0);
    }
    report
}

/// The job's configuration as this rank runs it: the MPI job decides the
/// shape (and `mpiexec -n`), the launcher the protocol and the kills.
fn job_config(env: &MpiLaunch, cfg: &Config, size: usize) -> Config {
    // The settings that go with an imposed protocol (`lazarus bench`'s
    // ranks run the call made for the first protocol compared, whose
    // settings `Config::compared_under` cleared for the others).
    let cfg = match env.protocol_settings {
        Some(s) => s.impose(cfg.clone()),
        None => cfg.clone(),
    };
    let mut cfg = Config {
        backend: Backend::Mpi,
        ranks: size,
        protocol: env.protocol.unwrap_or(cfg.protocol),
        kills: env.kills.clone().unwrap_or_else(|| cfg.kills.clone()),
        ..cfg
    };
    cfg.nodes = cfg.nodes.min(size).max(1);
    cfg
}

fn rank_with<T>(
    env: &MpiLaunch,
    cfg: &Config,
    f: &RankFn<T>,
    mut net: Transport,
    me: Peer,
) -> JobReport<T>
where
    T: Serialize + DeserializeOwned,
{
    let rank = net.rank();
    let size = net.size();
    let mut cfg = job_config(env, cfg, size);
    if env.resume {
        // Started again after a failure: from the newest committed
        // generation on disk, or from the beginning if none was committed.
        cfg.restart = cfg.storage.iter().find_map(|l| match l {
            crate::store::levels::LevelSpec::Disk { dir, .. }
                if crate::store::disk::committed_generations(dir).is_ok_and(|g| !g.is_empty()) =>
            {
                Some(dir.clone())
            }
            _ => None,
        });
    }
    // Rank 0 checks and prepares the checkpoint directories (as a
    // launcher does) and tells everyone the outcome.
    let prepared = (rank == 0).then(|| {
        cfg.validate()
            .and_then(|_| crate::job::prepare_storage(&cfg))
            .map_err(|e| RemoteError::from(&e))
    });
    let prepared = postcard::to_allocvec(&prepared.unwrap_or(Ok(None))).unwrap_or_default();
    let prepared = net.broadcast(0, prepared).and_then(|b| {
        postcard::from_bytes::<std::result::Result<Option<u64>, RemoteError>>(&b)
            .map_err(Error::from)
    });
    let placement = match prepared.and_then(|p| p.map_err(|e| e.into_error(0))) {
        Ok(g) => {
            cfg.restart_generation = g;
            match cfg.validate() {
                Ok(pl) => pl,
                Err(e) => return JobReport::failed(e),
            }
        }
        Err(e) => return JobReport::failed(e),
    };
    // Every rank's host and process, for the fault plan's kills.
    let peers = match net.all_gather([me.host, u64::from(me.pid)]) {
        Ok(p) => p,
        Err(e) => return JobReport::failed(e),
    };
    if let Err(e) = net.barrier() {
        return JobReport::failed(e);
    }
    let start = Resume {
        restart_generation: cfg.restart_generation,
        ..Resume::default()
    };
    run_on(env, &cfg, placement, f, (net, &peers, me), start)
}

/// A substitute spawned by a repair (ULFM): start as the replacement of
/// the rank whose number it took.
#[cfg(feature = "ulfm")]
fn substitute<T>(env: &MpiLaunch, cfg: &Config, f: &RankFn<T>, joined: ulfm::Joined) -> JobReport<T>
where
    T: Serialize + DeserializeOwned,
{
    let ulfm::Joined { net, resume, peers } = joined;
    let start: Resume = match postcard::from_bytes(&resume) {
        Ok(r) => r,
        Err(e) => return JobReport::failed(e.into()),
    };
    let mut cfg = job_config(env, cfg, net.size());
    cfg.restart_generation = start.restart_generation;
    let placement = match cfg.validate() {
        Ok(pl) => pl,
        Err(e) => return JobReport::failed(e),
    };
    let me = Peer {
        host: host_hash(),
        pid: std::process::id(),
    };
    run_on(env, &cfg, placement, f, (net, &peers, me), start)
}

/// Run this process's rank on `net` to its end, then gather the job's
/// report on rank 0.
fn run_on<T>(
    env: &MpiLaunch,
    cfg: &Config,
    placement: crate::topology::Placement,
    f: &RankFn<T>,
    (net, peers, me): (Transport, &[[u64; 2]], Peer),
    start: Resume,
) -> JobReport<T>
where
    T: Serialize + DeserializeOwned,
{
    let rank = net.rank();
    let size = net.size();
    crate::driver::mpi_env::set_job_rank(rank);
    let peers: Vec<Peer> = peers
        .iter()
        .map(|p| Peer {
            host: p[0],
            pid: p[1] as u32,
        })
        .collect();
    let host_ranks = peers.iter().filter(|p| p.host == me.host).count();
    let mut plan = FaultPlan::new(&cfg.kills, placement.clone(), cfg.seed ^ rank as u64);
    for &k in &env.skip_kills {
        plan.mark_fired(k);
    }
    let elapsed = start.elapsed;
    let net = std::rc::Rc::new(std::cell::RefCell::new(net));
    let ep = MpiEndpoint::new(
        net.clone(),
        plan,
        peers,
        env.fired.clone(),
        (cfg.max_frame, host_ranks),
        start,
    );
    let book = ep.book();
    let start = std::time::Instant::now()
        .checked_sub(elapsed)
        .unwrap_or_else(std::time::Instant::now);
    let outcome = rank_body(Box::new(ep), cfg, placement, f);
    let mut net = match std::rc::Rc::try_unwrap(net) {
        Ok(n) => n.into_inner(),
        Err(_) => {
            return JobReport::failed(Error::Driver("the rank's engine outlived its job".into()));
        }
    };
    let (mut stats, fired, failures) = book.borrow().take();
    if let Some(u) = crate::driver::shared::process_usage() {
        stats.push((start.elapsed(), u));
    }
    if let Err(e) = &outcome
        && !matches!(e, Error::Aborted { .. })
    {
        // Everyone else may be waiting for this rank: tell them.
        tracing::warn!(rank, "lazarus: rank {rank} failed: {e}");
        let abort = WireMsg::Abort {
            rank,
            reason: e.to_string(),
        };
        let mut scratch = Vec::new();
        for r in (0..size).filter(|&r| r != rank) {
            let _ = endpoint::post_with(&mut net, r, &abort, cfg.max_frame, &mut scratch);
        }
    }
    let mine = RankReport {
        outcome: match &outcome {
            Ok(v) => postcard::to_allocvec(v)
                .map(serde_bytes::ByteBuf::from)
                .map_err(|e| RemoteError::from(&Error::from(e))),
            Err(e) => Err(RemoteError::from(e)),
        },
        stats,
        fired,
    };
    let job = gather(&mut net, cfg, mine, (start, &failures)).map(|j| {
        j.map(|(outcome, mut stats)| {
            env.attempts.add_to(&mut stats);
            (outcome, stats)
        })
    });
    let job = match (rank, job) {
        (0, Ok(Some(job))) => job,
        (_, Ok(_)) => {
            return JobReport {
                outcome: outcome.map(|v| vec![v]),
                stats: JobStats::default(),
                sim: None,
                rank: Some(rank),
            };
        }
        (_, Err(e)) => return JobReport::failed(e),
    };
    if let Some(path) = &env.report {
        let written = postcard::to_allocvec(&job)
            .map_err(Error::from)
            .and_then(|b| {
                std::fs::write(path, b).map_err(|e| {
                    Error::Driver(format!("cannot write the report {}: {e}", path.display()))
                })
            });
        if let Err(e) = written {
            tracing::error!("lazarus: {e}");
        }
    }
    let (raw, stats) = job;
    JobReport {
        outcome: raw.and_then(|all| {
            all.iter()
                .map(|b| postcard::from_bytes::<T>(b).map_err(Error::from))
                .collect()
        }),
        stats,
        sim: None,
        rank: None,
    }
}

/// Every rank's report to rank 0, which returns the job's outcome and
/// statistics (the others `None`).
fn gather(
    net: &mut Transport,
    cfg: &Config,
    mine: RankReport,
    (start, failures): (std::time::Instant, &[FailureEvent]),
) -> Result<Option<JobOutcome>> {
    let rank = net.rank();
    let size = net.size();
    if rank != 0 {
        net.isend(0, TAG_REPORT, postcard::to_allocvec(&mine)?)?;
        net.settle()?;
        return Ok(None);
    }
    let mut reports: Vec<Option<RankReport>> = (0..size).map(|_| None).collect();
    reports[0] = Some(mine);
    let mut missing = size - 1;
    while missing > 0 {
        net.progress()?;
        // Frames still in flight (an abort, a large send to a rank that
        // ended early) are of no use now.
        while net.try_receive(TAG_FRAME)?.is_some() {}
        match net.try_receive(TAG_REPORT)? {
            Some((from, b)) => {
                if from < size && reports[from].is_none() {
                    reports[from] = Some(postcard::from_bytes(&b)?);
                    missing -= 1;
                }
            }
            None => std::thread::sleep(std::time::Duration::from_micros(50)),
        }
    }
    net.settle()?;
    let mut book =
        StatsBook::new(cfg.protocol, cfg.sets, size, cfg.nodes).traced(cfg.trace.is_some(), false);
    let mut finals = Finals::new(size);
    let mut fired = std::collections::BTreeSet::new();
    // The statistics and the failure events in time order, as a launcher
    // sees them: a recovery ends when every rank resumed in the epoch of
    // the newest failure.
    let mut timeline: Vec<(std::time::Duration, Option<(Rank, Stat)>)> =
        failures.iter().map(|(_, _, at)| (*at, None)).collect();
    let mut events = failures.iter();
    let mut outcomes = Vec::new();
    for (r, rep) in reports.into_iter().enumerate() {
        let Some(rep) = rep else { continue };
        timeline.extend(
            rep.stats
                .into_iter()
                .map(|(at, stat)| (at, Some((r, stat)))),
        );
        fired.extend(rep.fired);
        outcomes.push((r, rep.outcome));
    }
    timeline.sort_by_key(|(at, _)| *at);
    let mut epoch = 0;
    for (at, item) in timeline {
        match item {
            Some((r, stat)) => book.record(r, size, stat, at, epoch),
            None => {
                if let Some((e, dead, _)) = events.next() {
                    epoch = *e;
                    book.on_kill(*e, dead, at);
                }
            }
        }
    }
    for (r, outcome) in outcomes {
        let outcome = outcome
            .map(serde_bytes::ByteBuf::into_vec)
            .map_err(|e| e.into_error(r));
        finals.on_exit(r, outcome, false, cfg.protocol.name());
    }
    let mut stats = book.stats;
    stats.wall_s = start.elapsed().as_secs_f64();
    stats.unfired_kills = cfg
        .kills
        .iter()
        .enumerate()
        .filter(|(i, _)| !fired.contains(i))
        .map(|(_, k)| k.to_string())
        .collect();
    Ok(Some((finals.finish(), stats)))
}

/// A hash of this host's name: ranks on one host can signal each other.
fn host_hash() -> u64 {
    use std::hash::{Hash, Hasher};
    let name = nix::unistd::gethostname()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    name.hash(&mut h);
    h.finish()
}
