//! The launcher: starts one process per rank and is the job's failure
//! detector and supervisor.
//!
//! A rank's death is noticed when its control connection closes (the
//! kernel closes it when the process dies, so this is immediate) or its
//! exit status is collected. On this host that is the whole truth: a local
//! rank is dead when its process is, and never for silence alone (on a
//! loaded machine a live rank may be descheduled for seconds; a stopped
//! one is alive too), though a long silence is reported on stderr. A rank
//! on another host (`--hosts slurm`) whose host dies or is cut off closes
//! nothing: there the heartbeats decide, judged by an adaptive detector
//! ([`PhiAccrual`]) whose timeout grows with the jitter it observes and
//! never falls under `--heartbeat-timeout`; such a rank is then killed
//! with `SIGKILL` through its agent. A suspicion that a later heartbeat
//! proves false is counted (`false_suspicions` in the job's statistics).
//! Each suspicion, each false one and each declared failure is logged
//! (`info`, see [`crate::logging`]) with its cause: the silence against the
//! timeout, the fault plan's kill, the exit status or signal of a process
//! that ended by itself, a lost agent; the survivors get the cause with
//! their failure notice.
//! The launcher then raises the world epoch, tells every
//! survivor, and, when the protocol replaces failed ranks, starts a
//! replacement with the dead rank's number and a new incarnation; once it is
//! up, everyone learns its address. Kills of the fault plan are requested by
//! the rank that reaches the kill's moment and carried out here with
//! `SIGKILL`, all victims of a node kill back to back before anyone is told.
//!
//! Rank processes die with the launcher (`PR_SET_PDEATHSIG`, and a lost
//! control connection), so killing the launcher leaves no process behind.
//!
//! With `--hosts slurm` the rank processes are started, killed and reaped
//! by an agent on each node ([`super::agent`]); everything else stays here.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};
use rand::RngExt;

use super::agent::{Hosts, srun_command};
use super::auth::{Identity, Role, Secret, handshake};
use super::detector::{PHI_THRESHOLD, PhiAccrual, Verdict};
use super::net::{AcceptStop, Listen, Listener, Stream};
use super::var;
use super::wire::{WireMsg, decode, read_frame, write_msg};
use crate::driver::heap;
use crate::driver::shared::{ExitAction, Finals, StatsBook, progress_bar};
use crate::fault::KillSpec;
use crate::job::{FailureDetection, JobStats};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// The settings of `Config` that go with its protocol, imposed on rank
/// processes with it (see [`LaunchSpec::protocol_settings`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProtocolSettings {
    /// `Config::log_budget`.
    pub log_budget: Option<usize>,
    /// `Config::sets`.
    pub sets: crate::protocol::correlated::SetRule,
    /// `Config::checkpoint_scheme`.
    pub checkpoint_scheme: crate::protocol::coordinated::CheckpointScheme,
    /// `Config::rma_log`.
    pub rma_log: crate::protocol::rma::AccessLogging,
}

impl ProtocolSettings {
    /// The settings of `cfg`.
    pub fn of(cfg: &crate::Config) -> Self {
        ProtocolSettings {
            log_budget: cfg.log_budget,
            sets: cfg.sets,
            checkpoint_scheme: cfg.checkpoint_scheme,
            rma_log: cfg.rma_log,
        }
    }

    /// `cfg` with these settings.
    pub fn impose(&self, cfg: crate::Config) -> crate::Config {
        crate::Config {
            log_budget: self.log_budget,
            sets: self.sets,
            checkpoint_scheme: self.checkpoint_scheme,
            rma_log: self.rma_log,
            ..cfg
        }
    }

    /// The environment variables that carry them to a rank process (the
    /// processes and the mpi backends' launchers both use them).
    pub fn to_env(&self) -> Vec<(&'static str, String)> {
        let mut env = Vec::new();
        if let Some(b) = self.log_budget {
            env.push((super::var::LOG_BUDGET, b.to_string()));
        }
        if let crate::protocol::correlated::SetRule::Consecutive(n) = self.sets {
            env.push((super::var::SETS, n.to_string()));
        }
        env.push((
            super::var::CHECKPOINT_SCHEME,
            self.checkpoint_scheme.name().into(),
        ));
        env.push((super::var::RMA_LOG, self.rma_log.name().into()));
        env
    }

    /// What [`ProtocolSettings::to_env`] set in this process's environment
    /// (each missing one at its default).
    pub fn from_env() -> Result<Self> {
        let num = |v: &str| -> Option<usize> { std::env::var(v).ok()?.parse().ok() };
        Ok(ProtocolSettings {
            log_budget: num(super::var::LOG_BUDGET),
            sets: match num(super::var::SETS) {
                Some(n) => crate::protocol::correlated::SetRule::Consecutive(n),
                None => Default::default(),
            },
            checkpoint_scheme: match std::env::var(super::var::CHECKPOINT_SCHEME) {
                Ok(s) => {
                    (s.parse()).map_err(|e| Error::config(super::var::CHECKPOINT_SCHEME, e))?
                }
                Err(_) => Default::default(),
            },
            rma_log: match std::env::var(super::var::RMA_LOG) {
                Ok(s) => s
                    .parse()
                    .map_err(|e| Error::config(super::var::RMA_LOG, e))?,
                Err(_) => Default::default(),
            },
        })
    }
}

/// How to start a job's rank processes.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    /// The program every rank runs.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Number of ranks.
    pub ranks: usize,
    /// Failure domains (block placement).
    pub nodes: usize,
    /// Kills to inject (the ranks evaluate them; the launcher fires them).
    pub kills: Vec<KillSpec>,
    /// Socket kind.
    pub listen: Listen,
    /// No rank is suspected before this much silence; a rank on another
    /// host suspected and then silent for as long again is declared dead
    /// (see [`PhiAccrual`]).
    pub heartbeat_timeout: Duration,
    /// Largest frame accepted on any connection.
    pub max_frame: usize,
    /// Generation a whole-job restart resumes from.
    pub restart_generation: Option<u64>,
    /// Started by `run --backend processes`: ranks report and exit.
    pub self_launch: bool,
    /// Which call of `lazarus::run` in the program is the rank: `None`, the
    /// first; `Some(k)`, the `k`-th that names `worker_args` (a test
    /// harness; see `processes::role_of_this_call`).
    pub call: Option<usize>,
    /// Protocol name for error messages until the ranks report theirs.
    pub protocol: String,
    /// What the program's earlier `run` calls returned (see
    /// `processes::Role::Earlier`).
    pub earlier: Vec<super::EarlierCall>,
    /// Draw rank 0's progress on stderr (when it is a terminal).
    pub progress_bar: bool,
    /// Discard the ranks' standard output (a test harness's ranks would
    /// print its progress lines).
    pub quiet_stdout: bool,
    /// Impose this protocol on the ranks (the launching `run` call's), or
    /// leave it to the program (`lazarus launch`).
    pub protocol_override: Option<crate::protocol::ProtocolKind>,
    /// With `protocol_override`: the settings that go with the protocol
    /// (`Config::compared_under` clears them for others), imposed too: a
    /// rank process of `lazarus bench` runs the program's first `run`
    /// call, made for the first protocol compared.
    pub protocol_settings: ProtocolSettings,
    /// Record the ranks' timeline (`Config::trace`), into `JobStats::trace`.
    pub trace: Option<Duration>,
    /// Where the rank processes run.
    pub hosts: Hosts,
    /// Protocol `correlated`: how ranks form correlated sets (for the
    /// recovery statistics).
    pub sets: crate::protocol::correlated::SetRule,
    /// The program agents run as (`PROGRAM agent`), with `--hosts slurm`:
    /// the `lazarus` executable.
    pub agent_program: PathBuf,
}

/// An event from one of the launcher's socket threads.
struct Event {
    who: Who,
    conn: Conn,
}

/// Who is on a connection to the launcher.
#[derive(Debug, Clone, Copy)]
enum Who {
    /// Incarnation `.1` of rank `.0`.
    Rank(Rank, u64),
    /// The agent of node `.0` (`--hosts slurm`).
    Agent(usize),
}

impl std::fmt::Display for Who {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Who::Rank(r, inc) => write!(f, "rank {r} (incarnation {inc})"),
            Who::Agent(n) => write!(f, "the agent of node {n}"),
        }
    }
}

/// What happened on a connection.
enum Conn {
    /// It is authenticated; the stream writes to it, and the activity
    /// tells when bytes last arrived on it.
    Up(Stream, Arc<Activity>),
    /// A message arrived.
    Msg(WireMsg),
    /// It ended.
    Lost(String),
}

/// When bytes last arrived on a connection. A rank is alive while a long
/// message of its (a large `Finishing` value) is still arriving, though no
/// whole message has been read for a while: its heartbeats wait behind it.
/// So it is while such a message, arrived whole, is being decoded.
struct Activity {
    origin: Instant,
    /// From `origin` to the latest read that returned data, in nanoseconds.
    nanos: AtomicU64,
    /// A frame that has arrived is being decoded.
    decoding: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Activity {
            origin: Instant::now(),
            nanos: AtomicU64::new(0),
            decoding: AtomicBool::new(false),
        }
    }

    /// Decode `frame`, active throughout: that time is the launcher's,
    /// not silence of the rank.
    fn decode(&self, frame: bytes::Bytes) -> Result<WireMsg, super::wire::WireError> {
        self.decoding.store(true, Ordering::Relaxed);
        let msg = decode(frame);
        self.touch();
        self.decoding.store(false, Ordering::Relaxed);
        msg
    }

    /// Bytes arrived now.
    fn touch(&self) {
        let ns = u64::try_from(self.origin.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.nanos.store(ns, Ordering::Relaxed);
    }

    /// When bytes last arrived (the connection's start before any did;
    /// now while a frame is being decoded).
    fn last(&self) -> Instant {
        if self.decoding.load(Ordering::Relaxed) {
            return Instant::now();
        }
        self.origin + Duration::from_nanos(self.nanos.load(Ordering::Relaxed))
    }
}

/// A connection's reading end that records every read returning data in
/// its [`Activity`], so liveness counts bytes, not whole messages.
struct Counted<R> {
    inner: R,
    activity: Arc<Activity>,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n > 0 {
            self.activity.touch();
        }
        Ok(n)
    }
}

/// A rank process, on this host or on an agent's.
enum Process {
    Local(Child),
    /// Started by the agent of `node`; `exit` once it reported the end.
    Remote {
        node: usize,
        exit: Option<String>,
    },
}

impl Process {
    /// The exit status, once the process has ended.
    fn try_exit(&mut self) -> Option<String> {
        match self {
            Process::Local(c) => match c.try_wait() {
                Ok(Some(status)) => Some(status.to_string()),
                _ => None,
            },
            Process::Remote { exit, .. } => exit.take(),
        }
    }
}

/// The agents of a job with `--hosts slurm`.
struct Agents {
    /// `srun`, which started them (and ends when they all have).
    srun: Child,
    /// The thread that accepts the agents' connections.
    _acceptor: Acceptor,
    /// Per node: the connection to its agent, while it lasts.
    links: Vec<Option<Stream>>,
    /// Per node: its host name, once the agent said hello.
    hosts: Vec<Option<String>>,
    /// Agents' acknowledgements of `KillRanks`, and the loss of an
    /// agent's connection (which ends its ranks too), by node.
    acks: Receiver<AgentAck>,
    placement: Placement,
}

impl Agents {
    /// The node whose agent starts `rank`: its own, or, when that node is
    /// gone (its agent lost), the live node with the fewest running ranks,
    /// so the job survives the loss of a host (that node then holds two
    /// failure domains' ranks).
    fn node_for(&self, procs: &[RankProc], rank: Rank) -> Result<usize> {
        let home = self.placement.node_of(rank);
        if self.links[home].is_some() {
            return Ok(home);
        }
        let load = |n: usize| {
            procs
                .iter()
                .filter(|p| matches!(p.child, Some(Process::Remote { node, .. }) if node == n))
                .count()
        };
        let n = (0..self.links.len())
            .filter(|&n| self.links[n].is_some())
            .min_by_key(|&n| load(n))
            .ok_or_else(|| driver_err(&format!("cannot start rank {rank}"), "no agent is left"))?;
        tracing::warn!(
            rank,
            node = n,
            "lazarus launcher: node {home} is gone; rank {rank} restarts on node {n} ({})",
            self.hosts[n].as_deref().unwrap_or("?")
        );
        Ok(n)
    }

    /// Have the agent of `rank`'s node start incarnation `incarnation` of
    /// it with the environment `env`.
    fn spawn(
        &mut self,
        procs: &[RankProc],
        spec: &LaunchSpec,
        rank: Rank,
        incarnation: u64,
        env: Vec<(&'static str, String)>,
    ) -> Result<Process> {
        use std::os::unix::ffi::OsStrExt;
        let msg = WireMsg::Spawn {
            rank,
            incarnation,
            program: spec.program.as_os_str().as_bytes().to_vec(),
            args: spec.args.iter().map(|a| a.as_bytes().to_vec()).collect(),
            env: env.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
            quiet_stdout: spec.quiet_stdout,
        };
        // An agent whose connection broke is gone even before its loss
        // reaches the event loop (which then fails the ranks still on its
        // node): the rank goes to another node.
        loop {
            let node = self.node_for(procs, rank)?;
            if let Some(link) = self.links[node].as_mut()
                && write_msg(link, &msg, spec.max_frame).is_ok()
            {
                return Ok(Process::Remote { node, exit: None });
            }
            self.links[node] = None;
        }
    }

    /// The ranks whose current incarnation runs (or starts) on `node`.
    fn ranks_on(procs: &[RankProc], node: usize) -> Vec<Rank> {
        (0..procs.len())
            .filter(|&r| {
                matches!(procs[r].status, Status::Starting | Status::Ready)
                    && matches!(procs[r].child, Some(Process::Remote { node: n, .. }) if n == node)
            })
            .collect()
    }
}

/// What the agents' connections tell [`Launcher::kill_remote`].
enum AgentAck {
    /// The agent of this node reaped the ranks it was asked to kill.
    Killed(usize),
    /// The agent of this node is gone; its ranks end with it.
    Lost(usize),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Status {
    Starting,
    Ready,
    Finished,
    Dead,
}

struct RankProc {
    incarnation: u64,
    child: Option<Process>,
    ctl: Option<Stream>,
    addr: Option<String>,
    status: Status,
    /// Newest failure epoch this incarnation has been told of.
    told: u64,
    /// Its heartbeats and other signs of life (whole messages, or bytes
    /// of one still arriving: `activity`), and the suspicion they raise.
    detector: PhiAccrual,
    /// The last sign of life before the latest silence reported on stderr
    /// (one report per silence).
    warned: Option<Duration>,
    /// Bytes arriving on the control connection, once it is up.
    activity: Option<Arc<Activity>>,
    /// When it was started (time since the launcher's start).
    started: Duration,
    /// The value this incarnation reported on entering finalize (since the
    /// last failure event).
    finishing: Option<Vec<u8>>,
    /// How its process ended, once collected before its failure was
    /// declared (the failure's cause then says it).
    exit: Option<String>,
}

impl RankProc {
    /// Incarnation `incarnation` of a rank, started at `now` (time since
    /// the launcher's start) as `child`, told of failures up to `told`.
    fn starting(
        incarnation: u64,
        child: Option<Process>,
        told: u64,
        detector: PhiAccrual,
        now: Duration,
    ) -> Self {
        RankProc {
            incarnation,
            child,
            ctl: None,
            addr: None,
            status: Status::Starting,
            told,
            detector,
            warned: None,
            activity: None,
            started: now,
            finishing: None,
            exit: None,
        }
    }

    /// The process's id, when it runs on this host.
    fn pid(&self) -> Option<u32> {
        match &self.child {
            Some(Process::Local(c)) => Some(c.id()),
            _ => None,
        }
    }

    /// The process was killed: collect it, close its control connection,
    /// and give it `status`.
    fn reap(&mut self, status: Status) {
        if let Some(Process::Local(mut c)) = self.child.take() {
            let _ = c.wait();
        }
        if let Some(ctl) = self.ctl.take() {
            ctl.shutdown();
        }
        self.status = status;
    }
}

/// A failure event as the survivors hear it.
struct FailureEvent {
    epoch: u64,
    dead: Vec<(Rank, u64)>,
    respawn: bool,
    cause: String,
}

struct Launcher<'a> {
    spec: &'a LaunchSpec,
    job: u64,
    dir: PathBuf,
    /// Shared-memory directory for the rings between ranks (`shm`), if made.
    shm_dir: Option<PathBuf>,
    secret_file: PathBuf,
    listener_addr: String,
    t0: SystemTime,
    start: Instant,
    rx: crossbeam_channel::Receiver<Event>,
    procs: Vec<RankProc>,
    epoch: u64,
    events: Vec<FailureEvent>,
    replaces: Option<bool>,
    protocol: String,
    fired: BTreeSet<usize>,
    stats: StatsBook,
    finals: Finals<Vec<u8>>,
    peers_sent: bool,
    detections: Vec<FailureDetection>,
    bar: Option<indicatif::ProgressBar>,
    /// Finalize's leader concluded the job (`WireMsg::Conclude`): no fault
    /// plan kill fires any more.
    concluded: bool,
    /// The abort, once the job is aborted (for ranks that become ready later).
    abort: Option<WireMsg>,
    /// Per rank: incarnations in a row that died before they were ready.
    early_deaths: Vec<u32>,
    /// With `--hosts slurm`.
    agents: Option<Agents>,
    /// Events set aside while a failure waited for finalize reports.
    stash: VecDeque<Event>,
    /// The thread that accepts the ranks' connections (ended with the
    /// launcher).
    _acceptor: Acceptor,
}

/// How long a failure of ranks that had entered finalize waits for the
/// other ranks' reports of having entered it too (see
/// `Launcher::died_after_the_end`).
const AFTER_THE_END_WAIT: Duration = Duration::from_millis(100);

/// A local rank silent this long is reported on stderr (once per
/// silence); it is not killed: its process is alive, and a false suspicion
/// must not end a run.
const LOCAL_SILENCE_WARNING: Duration = Duration::from_secs(10);

/// A rank whose processes die this many times in a row before connecting
/// fails the job instead of being restarted again.
const MAX_EARLY_DEATHS: u32 = 3;

/// How often the supervisor checks exit statuses and heartbeats: every
/// 5 ms, or four times per heartbeat timeout when that is shorter, so that
/// a check on time never looks late (see [`heartbeats_trusted`]).
fn check_tick(timeout: Duration) -> Duration {
    Duration::from_millis(5)
        .min(timeout / 4)
        .max(Duration::from_millis(1))
}

/// Whether silence may be held against the ranks at a check that came
/// `since` after the previous one, which was due `tick` after it.
///
/// A check that ran late means the launcher itself was held up (loaded,
/// descheduled, stopped): heartbeats that arrived meanwhile may still sit
/// unread in its sockets, and a live rank (which heartbeats every quarter
/// timeout) looks silent for about the delay plus a quarter timeout. A
/// delay under half the timeout leaves a margin; a longer one is not the
/// ranks' fault. The delay is measured past the due time: measuring the
/// whole gap would call every check late once the tick is not well under
/// half the timeout, and a dead rank would never be declared.
fn heartbeats_trusted(since: Duration, tick: Duration, timeout: Duration) -> bool {
    since.saturating_sub(tick) < timeout / 2
}

/// Start the job's rank processes and supervise them until every rank has
/// a final outcome; returns each rank's encoded result and the statistics.
pub fn launch(spec: &LaunchSpec) -> (Result<Vec<Vec<u8>>>, JobStats) {
    let mut l = match Launcher::new(spec) {
        Ok(l) => l,
        Err(e) => return (Err(e), JobStats::default()),
    };
    let outcome = match l.start_all() {
        Ok(()) => l.supervise(),
        Err(e) => Err(e),
    };
    l.cleanup();
    let mut stats = l.stats.stats.clone();
    stats.wall_s = l.start.elapsed().as_secs_f64();
    stats.unfired_kills = spec
        .kills
        .iter()
        .enumerate()
        .filter(|(i, _)| !l.fired.contains(i))
        .map(|(_, k)| k.to_string())
        .collect();
    stats.failure_detections = std::mem::take(&mut l.detections);
    (outcome, stats)
}

fn unix_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Where shared-memory ring directories go.
const SHM_ROOT: &str = "/dev/shm";

/// The file in each job directory (temporary and shared-memory) that holds
/// its launcher's PID, so that a later launcher can tell the job is gone.
const LAUNCHER_PID: &str = "launcher.pid";

/// The name of job `job`'s directories.
fn job_dir_name(job: u64) -> String {
    format!("lazarus-{job:016x}")
}

/// The job's shared-memory directory (mode 0700) for the rings between
/// ranks, with `--listen unix` (one host) when `/dev/shm` exists;
/// otherwise frames stay on the sockets.
fn shm_dir(listen: Listen, job: u64) -> Option<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    if listen != (Listen::Unix { rings: true }) {
        return None;
    }
    let dir = Path::new(SHM_ROOT).join(job_dir_name(job));
    std::fs::DirBuilder::new().mode(0o700).create(&dir).ok()?;
    mark_launcher(&dir);
    Some(dir)
}

/// Record this launcher's PID in a job directory it made. Best effort: a
/// directory without it is never swept.
fn mark_launcher(dir: &Path) {
    let _ = std::fs::write(dir.join(LAUNCHER_PID), std::process::id().to_string());
}

/// Remove the job directories under `roots` whose launcher is gone. A
/// launcher killed by SIGKILL cannot clean up (its ranks die with it, by
/// their parent-death signal), and its directories stayed for ever. Only
/// directories named like a job's and holding a launcher PID that no
/// process has any more are removed; anything else (another user's, a job
/// starting, an older build's) is left alone.
fn sweep_stale_jobs(roots: &[&Path]) {
    for root in roots {
        let Ok(entries) = std::fs::read_dir(root) else {
            continue;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(hex) = name.to_str().and_then(|n| n.strip_prefix("lazarus-")) else {
                continue;
            };
            if hex.len() != 16 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
                continue;
            }
            let dir = entry.path();
            let pid = std::fs::read_to_string(dir.join(LAUNCHER_PID))
                .ok()
                .and_then(|s| s.trim().parse::<i32>().ok())
                .filter(|&p| p > 0);
            let gone = pid.is_some_and(|p| {
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None)
                    == Err(nix::errno::Errno::ESRCH)
            });
            if gone {
                let _ = std::fs::remove_dir_all(&dir);
            }
        }
    }
}

fn driver_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Driver(format!("launcher: {what}: {e}"))
}

impl<'a> Launcher<'a> {
    fn new(spec: &'a LaunchSpec) -> Result<Self> {
        // Before the per-rank tables below are sized by it.
        crate::config::check_ranks(crate::Backend::Processes, spec.ranks)?;
        let job: u64 = rand::rng().random();
        let tmp = std::env::temp_dir();
        sweep_stale_jobs(&[&tmp, Path::new(SHM_ROOT)]);
        let dir = tmp.join(job_dir_name(job));
        {
            use std::os::unix::fs::DirBuilderExt;
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| driver_err(&format!("cannot create {}", dir.display()), e))?;
        }
        mark_launcher(&dir);
        let shm_dir = shm_dir(spec.listen, job);
        let secret = Secret::generate();
        let secret_file = dir.join("secret");
        secret
            .write_to(&secret_file)
            .map_err(|e| driver_err("cannot write the job secret", e))?;
        if !spec.earlier.is_empty() {
            let bytes = postcard::to_allocvec(&spec.earlier)?;
            std::fs::write(dir.join("earlier"), bytes)
                .map_err(|e| driver_err("cannot write the earlier results", e))?;
        }
        let listener = Listener::bind(spec.listen, &dir, "launcher.sock")
            .map_err(|e| driver_err("cannot listen", e))?;
        let listener_addr = listener
            .addr()
            .map_err(|e| driver_err("no listening address", e))?
            .to_string();
        let (tx, rx) = unbounded();
        let agents = match spec.hosts {
            Hosts::Local => None,
            Hosts::Slurm => Some(start_agents(spec, job, &dir, &secret, tx.clone())?),
        };
        let acceptor = spawn_acceptor(listener, secret, job, spec.max_frame, tx, None)?;
        Ok(Launcher {
            spec,
            job,
            dir,
            shm_dir,
            secret_file,
            listener_addr,
            t0: SystemTime::now(),
            start: Instant::now(),
            rx,
            procs: Vec::new(),
            epoch: 0,
            events: Vec::new(),
            replaces: None,
            protocol: spec.protocol.clone(),
            fired: BTreeSet::new(),
            stats: StatsBook::new(
                spec.protocol_override
                    .or_else(|| spec.protocol.parse().ok())
                    .unwrap_or(crate::ProtocolKind::Coordinated),
                spec.sets,
                spec.ranks,
                spec.nodes,
            )
            .traced(spec.trace.is_some(), false),
            finals: Finals::new(spec.ranks),
            peers_sent: false,
            detections: Vec::new(),
            bar: progress_bar(spec.progress_bar),
            abort: None,
            concluded: false,
            early_deaths: vec![0; spec.ranks],
            agents,
            stash: Default::default(),
            _acceptor: acceptor,
        })
    }

    fn start_all(&mut self) -> Result<()> {
        self.await_agents()?;
        for rank in 0..self.spec.ranks {
            let child = self.spawn(rank, 0, 0)?;
            let now = self.now();
            let p = RankProc::starting(0, Some(child), 0, self.detector(now), now);
            self.procs.push(p);
        }
        Ok(())
    }

    /// With `--hosts slurm`: wait until every node's agent has connected
    /// and said hello (or fail, naming the nodes missing).
    fn await_agents(&mut self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let Some(a) = self.agents.as_mut() else {
                return Ok(());
            };
            if a.hosts.iter().all(Option::is_some) {
                tracing::debug!(
                    "lazarus launcher: agents on {}",
                    crate::error::list(a.hosts.iter().flatten())
                );
                return Ok(());
            }
            let missing: Vec<usize> = (0..a.hosts.len())
                .filter(|&n| a.hosts[n].is_none())
                .collect();
            if let Ok(Some(status)) = a.srun.try_wait() {
                return Err(driver_err(
                    "agents",
                    format!(
                        "the agent starter (srun) ended ({status}) before the agents of nodes \
                         {} connected; see its error output above",
                        crate::error::list(&missing)
                    ),
                ));
            }
            if Instant::now() > deadline {
                return Err(driver_err(
                    "agents",
                    format!(
                        "the agents of nodes {} did not connect within 60 s",
                        crate::error::list(&missing)
                    ),
                ));
            }
            match self.rx.recv_timeout(Duration::from_millis(5)) {
                Ok(ev) => self.on_event(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(driver_err("listener", "stopped"));
                }
            }
        }
    }

    /// The `LAZARUS_*` environment of incarnation `incarnation` of `rank`
    /// in world epoch `epoch`.
    fn rank_env(&self, rank: Rank, incarnation: u64, epoch: u64) -> Vec<(&'static str, String)> {
        let s = self.spec;
        let t0 = self
            .t0
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0);
        let list = |v: Vec<String>, sep: &str| v.join(sep);
        let mut env = vec![
            (var::JOB, format!("{:016x}", self.job)),
            (var::RANK, rank.to_string()),
            (var::SIZE, s.ranks.to_string()),
            (var::NODES, s.nodes.to_string()),
            (var::INCARNATION, incarnation.to_string()),
            (var::EPOCH, epoch.to_string()),
            (var::LAUNCHER, self.listener_addr.clone()),
            (var::LAUNCHER_PID, std::process::id().to_string()),
            (var::SECRET_FILE, self.secret_file.display().to_string()),
            (var::DIR, self.dir.display().to_string()),
            (
                var::SHM_DIR,
                self.shm_dir
                    .as_deref()
                    .map(|d| d.display().to_string())
                    .unwrap_or_default(),
            ),
            (var::LISTEN, s.listen.to_string()),
            (var::T0_NS, t0.to_string()),
            (
                var::FIRED,
                list(self.fired.iter().map(|i| i.to_string()).collect(), ","),
            ),
            (
                var::KILLS,
                list(s.kills.iter().map(|k| k.to_string()).collect(), ";"),
            ),
            (var::MAX_FRAME, s.max_frame.to_string()),
            (
                var::HEARTBEAT_MS,
                s.heartbeat_timeout.as_millis().to_string(),
            ),
        ];
        if let Some(c) = s.call {
            env.push((var::CALL, c.to_string()));
        }
        if let Some(g) = s.restart_generation {
            env.push((var::RESTART_GENERATION, g.to_string()));
        }
        if s.self_launch {
            env.push((var::SELF_LAUNCH, "1".into()));
        }
        if !s.earlier.is_empty() {
            env.push((var::EARLIER, self.dir.join("earlier").display().to_string()));
        }
        if let Some(p) = s.protocol_override {
            env.push((var::PROTOCOL, p.name().into()));
            env.extend(s.protocol_settings.to_env());
        }
        // Ranks sharing this rank's host: every rank here, or those of its
        // failure domain when an agent per node starts them (a rank moved
        // to another node after a host loss is not counted there).
        let host_ranks = match &self.agents {
            Some(a) => a.placement.ranks_on(a.placement.node_of(rank)).len(),
            None => s.ranks,
        };
        env.push((var::HOST_RANKS, host_ranks.to_string()));
        if let Some(t) = s.trace {
            env.push((var::TRACE_NS, t.as_nanos().to_string()));
        }
        // The filter this process logs with (`--log-level`, `RUST_LOG`):
        // the ranks log with the same.
        if let Some(f) = crate::logging::installed() {
            env.push((var::LOG, f.into()));
        }
        // The heap on transparent huge pages (`driver::heap`): memory a
        // logging protocol keeps is new memory for every message, and
        // faulting it in 4 KiB pages cost more than the copy (pingpong at
        // 1 MiB under `pessimistic`: 3.0 -> 10.2 GB/s with glibc's large
        // allocations on huge pages).
        if let Some(t) = heap::huge_page_tunables() {
            env.push((heap::GLIBC_TUNABLES, t.into()));
        }
        env
    }

    /// Start incarnation `incarnation` of `rank`, in world epoch `epoch`:
    /// here, or through the agent of its node.
    fn spawn(&mut self, rank: Rank, incarnation: u64, epoch: u64) -> Result<Process> {
        let s = self.spec;
        let env = self.rank_env(rank, incarnation, epoch);
        if let Some(a) = self.agents.as_mut() {
            return a.spawn(&self.procs, s, rank, incarnation, env);
        }
        let mut cmd = Command::new(&s.program);
        cmd.args(&s.args).stdin(Stdio::null()).envs(env);
        if s.quiet_stdout {
            cmd.stdout(Stdio::null());
        }
        cmd.spawn().map(Process::Local).map_err(|e| {
            driver_err(
                &format!("cannot start rank {rank} ({})", s.program.display()),
                e,
            )
        })
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    /// A failure detector for a rank first heard of at `now`.
    fn detector(&self, now: Duration) -> PhiAccrual {
        let t = self.spec.heartbeat_timeout;
        PhiAccrual::new(super::heartbeat_period(t), t, now)
    }

    /// `rank` showed at `now` that it is alive (by a heartbeat when
    /// `beat`); a suspicion this ends was false, and is counted.
    fn heard(&mut self, rank: Rank, now: Duration, beat: bool) {
        let p = &mut self.procs[rank];
        let silent_since = p.detector.last_sign();
        let ended = if beat {
            p.detector.heartbeat(now)
        } else {
            p.detector.sign_of_life(now)
        };
        if ended {
            self.stats.stats.false_suspicions += 1;
            let secs = now.saturating_sub(silent_since).as_secs_f64();
            // A warning where the suspicion was on its way to a kill (a
            // rank on another host) or its silence was reported; on this
            // host a suspicion alone never kills (a loaded machine makes
            // many), and is told at `info`.
            if self.agents.is_some() || p.warned == Some(silent_since) {
                tracing::warn!(
                    rank,
                    silence_s = secs,
                    "lazarus launcher: rank {rank} is heard of again after {secs:.3} s of silence \
                     (a false suspicion)"
                );
            } else {
                tracing::info!(
                    rank,
                    silence_s = secs,
                    "lazarus launcher: rank {rank} is heard of again after {secs:.3} s of silence \
                     (a false suspicion)"
                );
            }
        }
    }

    fn send_to(&mut self, rank: Rank, msg: &WireMsg) {
        let max = self.spec.max_frame;
        if let Some(ctl) = self.procs.get_mut(rank).and_then(|p| p.ctl.as_mut()) {
            // A failed write means the rank is dying: its loss is noticed
            // by the reader of its connection.
            let _ = write_msg(ctl, msg, max);
        }
    }

    fn broadcast(&mut self, msg: &WireMsg, except: &[Rank]) {
        for r in 0..self.procs.len() {
            if self.procs[r].status == Status::Ready && !except.contains(&r) {
                self.send_to(r, msg);
                if let WireMsg::FailureNotice { epoch, .. } = msg {
                    self.procs[r].told = *epoch;
                }
            }
        }
    }

    /// Send `rank` the peer table and every failure it has not heard of
    /// (it started before them, or became ready after them).
    fn send_table(&mut self, rank: Rank) {
        let table = self.peer_table();
        self.send_to(rank, &WireMsg::Peers { addrs: table });
        let told = self.procs[rank].told;
        let backlog: Vec<WireMsg> = self
            .events
            .iter()
            .filter(|e| e.epoch > told)
            .map(|e| WireMsg::FailureNotice {
                epoch: e.epoch,
                dead: e.dead.clone(),
                respawn: e.respawn,
                cause: e.cause.clone(),
            })
            .collect();
        for m in backlog {
            self.send_to(rank, &m);
        }
        self.procs[rank].told = self.epoch;
        if let Some(abort) = self.abort.clone() {
            self.send_to(rank, &abort);
        }
    }

    fn peer_table(&self) -> Vec<Option<(u64, String)>> {
        self.procs
            .iter()
            .map(|p| match p.status {
                Status::Ready | Status::Finished => p.addr.clone().map(|a| (p.incarnation, a)),
                _ => None,
            })
            .collect()
    }

    /// Supervise until every rank has its final outcome.
    fn supervise(&mut self) -> Result<Vec<Vec<u8>>> {
        let timeout = self.spec.heartbeat_timeout;
        let tick = check_tick(timeout);
        let mut last_check = Instant::now();
        while !self.finals.done() {
            let next = match self.stash.pop_front() {
                Some(ev) => Ok(ev),
                None => self.rx.recv_timeout(tick),
            };
            match next {
                Ok(ev) => self.on_event(ev),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(driver_err("listener", "stopped"));
                }
            }
            // Everything that has arrived counts before any verdict.
            while let Some(ev) = self.stash.pop_front().or_else(|| self.rx.try_recv().ok()) {
                self.on_event(ev);
            }
            let since = last_check.elapsed();
            if since >= tick {
                self.check_children(heartbeats_trusted(since, tick, timeout));
                last_check = Instant::now();
            }
        }
        self.results()
    }

    /// Those of `ranks` whose current incarnation is starting or running.
    fn running(&self, ranks: &[Rank]) -> Vec<Rank> {
        ranks
            .iter()
            .copied()
            .filter(|&r| {
                self.procs
                    .get(r)
                    .is_some_and(|p| matches!(p.status, Status::Starting | Status::Ready))
            })
            .collect()
    }

    /// Whether `incarnation` is `rank`'s current one and still running (its
    /// messages count; its loss is a failure).
    fn is_live(&self, rank: Rank, incarnation: u64) -> bool {
        self.procs.get(rank).is_some_and(|p| {
            p.incarnation == incarnation && matches!(p.status, Status::Starting | Status::Ready)
        })
    }

    fn on_event(&mut self, ev: Event) {
        let Event { who, conn } = ev;
        match &conn {
            Conn::Up(..) => tracing::debug!("lazarus launcher: connected {who}"),
            Conn::Msg(WireMsg::Heartbeat | WireMsg::Stat(_) | WireMsg::Progress(_)) => {}
            Conn::Msg(msg) => tracing::debug!("lazarus launcher: from {who}: {msg:?}"),
            Conn::Lost(why) => tracing::debug!("lazarus launcher: lost {who}: {why}"),
        }
        let (rank, incarnation) = match who {
            Who::Rank(rank, incarnation) => (rank, incarnation),
            Who::Agent(node) => return self.on_agent(node, conn),
        };
        match conn {
            Conn::Up(stream, activity) => {
                let detector = self.detector(self.now());
                if let Some(p) = self.procs.get_mut(rank)
                    && p.incarnation == incarnation
                    && p.status == Status::Starting
                {
                    p.ctl = Some(stream);
                    p.activity = Some(activity);
                    // Silence counts from the connection on.
                    p.detector = detector;
                } else {
                    stream.shutdown();
                }
            }
            Conn::Msg(msg) => {
                if !self.is_live(rank, incarnation) {
                    return;
                }
                let now = self.now();
                self.heard(rank, now, matches!(msg, WireMsg::Heartbeat));
                self.on_msg(rank, msg);
            }
            Conn::Lost(why) => {
                if self.is_live(rank, incarnation) {
                    self.failure(&[rank], &format!("control connection lost ({why})"));
                }
            }
        }
    }

    /// An event on the connection of the agent of `node`.
    fn on_agent(&mut self, node: usize, conn: Conn) {
        let Some(a) = self.agents.as_mut() else {
            return;
        };
        let Some(link) = a.links.get_mut(node) else {
            return;
        };
        match conn {
            Conn::Up(stream, _) => {
                if link.is_some() {
                    // One agent per node: a second is refused.
                    tracing::warn!(
                        node,
                        "lazarus launcher: a second agent for node {node} refused"
                    );
                    stream.shutdown();
                } else {
                    *link = Some(stream);
                }
            }
            Conn::Msg(WireMsg::AgentHello { host, .. }) => {
                a.hosts[node] = Some(host);
                if !self.spec.earlier.is_empty() {
                    // The ranks of a test harness replay earlier calls.
                    let bytes = std::fs::read(self.dir.join("earlier")).unwrap_or_default();
                    let file = WireMsg::AgentFile {
                        var: var::EARLIER.into(),
                        name: "earlier".into(),
                        bytes,
                    };
                    if let Some(l) = a.links[node].as_mut() {
                        let _ = write_msg(l, &file, self.spec.max_frame);
                    }
                }
            }
            Conn::Msg(WireMsg::RankExited {
                rank,
                incarnation,
                status,
            }) => {
                if let Some(p) = self.procs.get_mut(rank)
                    && p.incarnation == incarnation
                    && let Some(Process::Remote { exit, .. }) = p.child.as_mut()
                {
                    *exit = Some(status);
                }
            }
            Conn::Msg(other) => {
                tracing::warn!(
                    node,
                    "lazarus launcher: unexpected message from the agent of node {node}: {other:?}"
                );
            }
            Conn::Lost(why) => {
                *link = None;
                let host = a.hosts[node]
                    .clone()
                    .unwrap_or_else(|| format!("node {node}"));
                // Every rank on that host is lost with it (its own ranks,
                // or replacements of another node's started there).
                let victims = Agents::ranks_on(&self.procs, node);
                if !victims.is_empty() {
                    self.failure(&victims, &format!("the agent on {host} was lost ({why})"));
                }
            }
        }
    }

    fn on_msg(&mut self, rank: Rank, msg: WireMsg) {
        match msg {
            WireMsg::Ready {
                addr,
                replaces,
                protocol,
                reports_failures,
                ..
            } => {
                self.replaces = Some(replaces);
                self.finals.set_reporting(reports_failures);
                self.protocol = protocol;
                let p = &mut self.procs[rank];
                p.addr = Some(addr.clone());
                p.status = Status::Ready;
                let incarnation = p.incarnation;
                if self.peers_sent {
                    // A replacement: it gets the table and the failures it
                    // started too early to hear of; the others its address.
                    self.send_table(rank);
                    self.broadcast(
                        &WireMsg::PeerUp {
                            rank,
                            incarnation,
                            addr,
                        },
                        &[rank],
                    );
                } else if self.procs.len() == self.spec.ranks
                    && self
                        .procs
                        .iter()
                        .all(|p| matches!(p.status, Status::Ready | Status::Dead))
                {
                    self.peers_sent = true;
                    for r in 0..self.procs.len() {
                        self.send_table(r);
                    }
                }
            }
            WireMsg::Heartbeat => {}
            WireMsg::Stat(stat) => {
                let now = self.now();
                self.stats
                    .record(rank, self.spec.ranks, stat, now, self.epoch);
            }
            WireMsg::Progress(f) => {
                if let Some(pb) = &self.bar {
                    pb.set_position((f.clamp(0.0, 1.0) * 1000.0) as u64);
                }
            }
            WireMsg::KillRequest { index, victims } => {
                // No kill fires once the job is aborted (nobody would be
                // replaced, and the victim's death would hide the cause) or
                // concluded (its ranks are leaving).
                let granted = self.abort.is_none() && !self.concluded && self.fired.insert(index);
                self.send_to(rank, &WireMsg::KillAnswer { granted });
                if granted {
                    let spec = self.spec.kills.get(index).map(|k| k.to_string());
                    self.failure(
                        &victims,
                        &format!(
                            "killed by fault injection ({})",
                            spec.unwrap_or_else(|| format!("kill #{index}"))
                        ),
                    );
                }
            }
            WireMsg::Conclude { epoch } => {
                let granted = epoch == self.epoch && self.abort.is_none();
                self.concluded |= granted;
                self.send_to(rank, &WireMsg::Concluded { granted });
            }
            WireMsg::Respawn { rank: r } => {
                if self.procs.get(r).is_some_and(|p| p.status == Status::Dead) {
                    self.finals.reopen(r);
                    let incarnation = self.procs[r].incarnation + 1;
                    self.start_replacement(r, incarnation);
                }
            }
            WireMsg::Finishing(value) => self.procs[rank].finishing = Some(value),
            WireMsg::Exited(outcome) => {
                self.procs[rank].status = Status::Finished;
                let outcome = outcome
                    .map(serde_bytes::ByteBuf::into_vec)
                    .map_err(|e| e.into_error(rank));
                self.settle(rank, outcome);
            }
            other => {
                tracing::warn!(
                    rank,
                    "lazarus launcher: unexpected message from rank {rank}: {other:?}"
                );
            }
        }
    }

    /// Collect exit statuses; judge silences (`trust_heartbeats`: this
    /// check is on time, see [`heartbeats_trusted`]).
    fn check_children(&mut self, trust_heartbeats: bool) {
        let timeout = self.spec.heartbeat_timeout;
        // Ranks on other hosts die unseen with their host; here the
        // process's end is seen, and silence alone proves nothing.
        let remote = self.agents.is_some();
        let now = self.now();
        for r in 0..self.procs.len() {
            let p = &mut self.procs[r];
            let exited = p.child.as_mut().and_then(Process::try_exit);
            if exited.is_some() {
                p.child = None;
                // Said with the failure its connection's end declares.
                if p.ctl.is_some() {
                    p.exit.clone_from(&exited);
                }
            }
            if !matches!(p.status, Status::Starting | Status::Ready) {
                continue;
            }
            if let Some(a) = &p.activity {
                let at = a.last().saturating_duration_since(self.start);
                self.heard(r, at, false);
            }
            let p = &mut self.procs[r];
            // With a control connection, its end (after every message the
            // rank sent, such as its outcome) tells the story.
            if let Some(status) = exited.filter(|_| p.ctl.is_none()) {
                self.failure(&[r], &format!("process exited ({status})"));
            } else if p.ctl.is_none() {
                if now.saturating_sub(p.started) > Duration::from_secs(60) {
                    self.failure(&[r], "did not connect within 60 s");
                }
            } else if !trust_heartbeats {
                p.detector.excuse(now, timeout / 2);
            } else {
                let verdict = p.detector.check(now);
                let silence = p.detector.silence(now);
                let phi = p.detector.phi(now);
                let (ms, timeout_ms) = (silence.as_millis(), timeout.as_millis());
                if verdict == Verdict::NewSuspicion {
                    let then = if remote {
                        format!("declared dead if the silence reaches {} ms", ms * 2)
                    } else {
                        "it runs on this host, where only its process's end fails it".into()
                    };
                    tracing::info!(
                        rank = r,
                        silence_ms = ms as u64,
                        phi,
                        timeout_ms = timeout_ms as u64,
                        "lazarus launcher: rank {r} suspected: silent for {ms} ms (phi {phi:.1}; \
                         suspected from phi {PHI_THRESHOLD} and a heartbeat timeout of \
                         {timeout_ms} ms); {then}"
                    );
                }
                if remote && verdict == Verdict::Dead {
                    let since = p.detector.suspected_after().unwrap_or_default().as_millis();
                    self.failure(
                        &[r],
                        &format!(
                            "no heartbeat for {ms} ms (phi {phi:.1}; suspected after {since} ms \
                             of silence, heartbeat timeout {timeout_ms} ms)"
                        ),
                    );
                } else if !remote
                    && silence >= LOCAL_SILENCE_WARNING
                    && p.warned != Some(p.detector.last_sign())
                {
                    p.warned = Some(p.detector.last_sign());
                    tracing::warn!(
                        rank = r,
                        "lazarus launcher: rank {r} (pid {}) has sent nothing for {:.1} s; its \
                         process is alive (stopped, or hung?), so the job waits for it",
                        p.pid().map_or_else(|| "?".into(), |pid| pid.to_string()),
                        silence.as_secs_f64()
                    );
                }
            }
        }
    }

    /// `rank`'s final outcome; an application error aborts the job (told to
    /// every rank, now and when it becomes ready).
    fn settle(&mut self, rank: Rank, outcome: Result<Vec<u8>>) {
        if let ExitAction::Abort { rank, reason } =
            self.finals.on_exit(rank, outcome, false, &self.protocol)
        {
            let abort = WireMsg::Abort { rank, reason };
            self.broadcast(&abort, &[]);
            self.abort = Some(abort);
        }
    }

    /// `victims` died (or are killed now): one failure event.
    fn failure(&mut self, victims: &[Rank], why: &str) {
        if tracing::enabled!(tracing::Level::DEBUG) {
            let st: Vec<_> = self
                .procs
                .iter()
                .map(|p| (p.incarnation, p.status, p.ctl.is_some()))
                .collect();
            tracing::debug!(
                "lazarus launcher: failure of rank(s) {}: {why}; states {st:?}",
                crate::error::list(victims)
            );
        }
        // Kill them all first, back to back, before anyone is told.
        let mut remote: BTreeMap<usize, Vec<(Rank, u64)>> = BTreeMap::new();
        for &v in victims {
            let Some(p) = self.procs.get_mut(v) else {
                continue;
            };
            match p.child.as_mut() {
                Some(Process::Local(c)) => {
                    // One that had ended by itself says how (for the cause).
                    if let Ok(Some(status)) = c.try_wait() {
                        p.exit.get_or_insert_with(|| status.to_string());
                    }
                    let _ = c.kill();
                }
                Some(Process::Remote { node, .. }) => {
                    remote.entry(*node).or_default().push((v, p.incarnation));
                }
                None => {}
            }
        }
        self.kill_remote(remote);
        let detected = SystemTime::now();
        let cause = self.cause(victims, why);
        if self.died_after_the_end(victims, &cause) {
            return;
        }
        let mut dead = Vec::new();
        let started_only: Vec<Rank> = victims
            .iter()
            .copied()
            .filter(|&v| {
                self.procs
                    .get(v)
                    .is_some_and(|p| p.status == Status::Starting)
            })
            .collect();
        for &v in victims {
            let Some(p) = self.procs.get_mut(v) else {
                continue;
            };
            if !matches!(p.status, Status::Starting | Status::Ready) {
                continue;
            }
            p.reap(Status::Dead);
            dead.push((v, p.incarnation));
        }
        if dead.is_empty() {
            return;
        }
        self.epoch += 1;
        // Values reported before this failure may be rolled back.
        for p in &mut self.procs {
            p.finishing = None;
        }
        let now = self.now();
        let ranks: Vec<Rank> = dead.iter().map(|d| d.0).collect();
        self.stats.on_kill(self.epoch, &ranks, now);
        // Before any rank reported its protocol, the launching call's
        // protocol decides; under `lazarus launch` a rank lost that early
        // is replaced (a program without recovery then fails as it would).
        // Nobody to recover with once the job is aborted or a rank has
        // left. Decided before the survivors are told: told of a
        // replacement, they would keep frames for one that never starts.
        let respawn = self
            .replaces
            .or(self
                .spec
                .protocol_override
                .map(|p| p.replaces_failed_ranks()))
            .unwrap_or(true)
            && self.abort.is_none()
            && !self.procs.iter().any(|p| p.status == Status::Finished);
        let notice = WireMsg::FailureNotice {
            epoch: self.epoch,
            dead: dead.clone(),
            respawn,
            cause: cause.clone(),
        };
        self.broadcast(&notice, &ranks);
        tracing::info!(
            epoch = self.epoch,
            ranks = %crate::error::list(&ranks),
            cause = %cause,
            "lazarus launcher: rank{} {} failed: {cause}; {}",
            if ranks.len() == 1 { "" } else { "s" },
            crate::error::list(&ranks),
            if respawn {
                "replacements start"
            } else {
                "no replacement starts"
            }
        );
        self.detections.push(FailureDetection {
            epoch: self.epoch,
            ranks: ranks.clone(),
            cause: cause.clone(),
            notified_unix_s: unix_s(SystemTime::now()),
            detected_unix_s: unix_s(detected),
        });
        self.events.push(FailureEvent {
            epoch: self.epoch,
            dead: dead.clone(),
            respawn,
            cause,
        });
        // A rank whose processes keep dying before they connect (a broken
        // program, a setup error) is not restarted forever (its failure
        // aborts the job, which the survivors hear of).
        for (r, inc) in dead {
            let early = &mut self.early_deaths[r];
            if started_only.contains(&r) {
                *early += 1;
            } else {
                *early = 0;
            }
            if *early >= MAX_EARLY_DEATHS {
                let n = *early;
                self.settle(
                    r,
                    Err(driver_err(
                        &format!("rank {r}"),
                        format!(
                            "its process ended before connecting {n} times in a row (last: {why}); \
                             see its error output above"
                        ),
                    )),
                );
                continue;
            }
            if respawn {
                self.start_replacement(r, inc + 1);
            } else {
                self.settle(r, Err(Error::Killed));
            }
        }
    }

    /// Why `victims` failed: `why`, and how those of their processes that
    /// had ended by themselves ended (an exit status, a signal), as far as
    /// that is known when the failure is declared.
    fn cause(&self, victims: &[Rank], why: &str) -> String {
        let ended: Vec<(Rank, &str)> = victims
            .iter()
            .filter_map(|&v| {
                let p = self.procs.get(v)?;
                if !matches!(p.status, Status::Starting | Status::Ready) {
                    return None;
                }
                let remote = match &p.child {
                    Some(Process::Remote { exit: Some(e), .. }) => Some(e.as_str()),
                    _ => None,
                };
                Some((v, p.exit.as_deref().or(remote)?))
            })
            .collect();
        match ended.as_slice() {
            [] => why.to_string(),
            [(_, e)] if victims.len() == 1 => format!("{why}; its process ended ({e})"),
            _ => {
                let each: Vec<String> = ended
                    .iter()
                    .map(|(v, e)| format!("rank {v}'s process ended ({e})"))
                    .collect();
                format!("{why}; {}", each.join(", "))
            }
        }
    }

    /// Whether `victims` (killed already) died after the job's end: every
    /// rank still running has reported its value on entering finalize
    /// since the last failure event, so nobody will roll back and every
    /// value is known. The victims are then finished with their values,
    /// the others are told to leave finalize (`JobComplete`: a victim may
    /// have died before its `Done` reached the finalize leader), and nobody
    /// hears of a failure.
    fn died_after_the_end(&mut self, victims: &[Rank], cause: &str) -> bool {
        let running = self.running(victims);
        if running.is_empty() || running.iter().any(|&v| self.procs[v].finishing.is_none()) {
            return false;
        }
        // Every victim had entered finalize. The others' reports may still
        // be on their way (each connection has its own reader thread): wait
        // for them a moment, keeping every other event for later. A rank
        // that left finalize proves every rank entered it.
        let deadline = Instant::now() + AFTER_THE_END_WAIT;
        loop {
            let all_in = self.procs.iter().all(|p| match p.status {
                Status::Starting | Status::Ready => p.finishing.is_some(),
                Status::Finished | Status::Dead => true,
            });
            if all_in || self.procs.iter().any(|p| p.status == Status::Finished) {
                break;
            }
            let Ok(ev) = self.rx.recv_deadline(deadline) else {
                return false;
            };
            match (&ev.who, &ev.conn) {
                (Who::Rank(r, _), Conn::Msg(WireMsg::Finishing(_) | WireMsg::Exited(_)))
                    if !running.contains(r) =>
                {
                    self.on_event(ev)
                }
                _ => self.stash.push_back(ev),
            }
        }
        // The kill happened, and counts; nobody rolls back.
        self.stats.stats.failures += 1;
        self.stats.stats.ranks_killed += running.len() as u64;
        for v in running {
            let p = &mut self.procs[v];
            p.reap(Status::Finished);
            let value = p.finishing.take().unwrap_or_default();
            tracing::info!(
                rank = v,
                cause,
                "lazarus launcher: rank {v} died after the end ({cause}); its reported value stands"
            );
            self.settle(v, Ok(value));
        }
        self.broadcast(&WireMsg::JobComplete, &[]);
        true
    }

    /// Have the agents kill `per_node[n]` on node `n`, all at once, and
    /// wait (boundedly) until they are reaped, so that nobody hears of the
    /// failure while a victim still runs.
    fn kill_remote(&mut self, per_node: BTreeMap<usize, Vec<(Rank, u64)>>) {
        let Some(a) = self.agents.as_mut() else {
            return;
        };
        // Stale confirmations; a loss noticed here drops the link at once
        // (the event loop hears of it as well and fails what ran there).
        while let Ok(ack) = a.acks.try_recv() {
            if let AgentAck::Lost(node) = ack {
                a.links[node] = None;
            }
        }
        let mut asked = BTreeSet::new();
        for (node, ranks) in per_node {
            if let Some(link) = a.links.get_mut(node).and_then(Option::as_mut)
                && write_msg(link, &WireMsg::KillRanks { ranks }, self.spec.max_frame).is_ok()
            {
                asked.insert(node);
            }
        }
        // A lost agent answers nothing, but its ranks end with it (they
        // die with their parent, and an agent kills them when its launcher
        // connection ends).
        let deadline = Instant::now() + Duration::from_secs(5);
        while !asked.is_empty() {
            match a.acks.recv_deadline(deadline) {
                Ok(AgentAck::Killed(node)) => {
                    asked.remove(&node);
                }
                Ok(AgentAck::Lost(node)) => {
                    asked.remove(&node);
                    a.links[node] = None;
                }
                Err(_) => {
                    tracing::warn!(
                        "lazarus launcher: the agent(s) of node(s) {} did not confirm a kill within 5 s",
                        crate::error::list(&asked)
                    );
                    break;
                }
            }
        }
    }

    /// Start incarnation `incarnation` of rank `r` in the current epoch.
    fn start_replacement(&mut self, r: Rank, incarnation: u64) {
        match self.spawn(r, incarnation, self.epoch) {
            Ok(child) => {
                let now = self.now();
                let detector = self.detector(now);
                self.procs[r] =
                    RankProc::starting(incarnation, Some(child), self.epoch, detector, now);
            }
            Err(e) => self.settle(r, Err(e)),
        }
    }

    /// Let finished ranks exit, kill what is left, remove the job directory.
    fn cleanup(&mut self) {
        if let Some(pb) = self.bar.take() {
            pb.finish_and_clear();
        }
        // A user's program may still work after its rank finished (write
        // results): under `lazarus launch` it gets all the time it needs.
        let grace = if self.spec.self_launch {
            Duration::from_secs(5)
        } else {
            Duration::from_secs(3600 * 24 * 365)
        };
        let deadline = Instant::now() + grace;
        for p in &mut self.procs {
            if let Some(Process::Local(c)) = p.child.as_mut() {
                loop {
                    match c.try_wait() {
                        Ok(Some(_)) | Err(_) => break,
                        Ok(None) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(2));
                        }
                        Ok(None) => {
                            let _ = c.kill();
                            let _ = c.wait();
                            break;
                        }
                    }
                }
            }
        }
        self.stop_agents(deadline);
        for p in &mut self.procs {
            if let Some(ctl) = p.ctl.take() {
                ctl.shutdown();
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
        if let Some(d) = &self.shm_dir {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    /// Wait until the agents report every rank process ended (or
    /// `deadline`), then tell them to kill what is left and exit, and
    /// collect `srun`.
    fn stop_agents(&mut self, deadline: Instant) {
        if self.agents.is_none() {
            return;
        }
        while self.remote_running() && Instant::now() < deadline {
            if let Ok(ev) = self.rx.recv_timeout(Duration::from_millis(5))
                && let Who::Agent(node) = ev.who
            {
                self.on_agent_quietly(node, ev.conn);
            }
        }
        let Some(mut a) = self.agents.take() else {
            return;
        };
        for link in a.links.iter_mut().flatten() {
            let _ = write_msg(link, &WireMsg::Shutdown, self.spec.max_frame);
        }
        let until = Instant::now() + Duration::from_secs(5);
        while matches!(a.srun.try_wait(), Ok(None)) && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = a.srun.kill();
        let _ = a.srun.wait();
        for link in a.links.iter().flatten() {
            link.shutdown();
        }
    }

    /// Whether an agent still connected runs a rank process of ours.
    fn remote_running(&self) -> bool {
        let Some(a) = &self.agents else {
            return false;
        };
        self.procs.iter().any(|p| match &p.child {
            Some(Process::Remote { exit: None, node }) => a.links[*node].is_some(),
            _ => false,
        })
    }

    /// After the job: an agent's news only updates exit statuses (a lost
    /// agent is no failure any more).
    fn on_agent_quietly(&mut self, node: usize, conn: Conn) {
        match conn {
            Conn::Lost(_) => {
                if let Some(l) = self.agents.as_mut().and_then(|a| a.links.get_mut(node)) {
                    *l = None;
                }
            }
            other => self.on_agent(node, other),
        }
    }

    /// The job's results, in rank order.
    fn results(&mut self) -> Result<Vec<Vec<u8>>> {
        std::mem::replace(&mut self.finals, Finals::new(0)).finish()
    }
}

/// Start the agents of a `--hosts slurm` job: a listener for them (TCP on
/// the launcher's address) and `srun`, which starts one on every node.
fn start_agents(
    spec: &LaunchSpec,
    job: u64,
    dir: &Path,
    secret: &Secret,
    tx: Sender<Event>,
) -> Result<Agents> {
    spec.hosts.check_listen(spec.listen)?;
    let placement = Placement::block(spec.ranks, spec.nodes)?;
    let listener = Listener::bind(spec.listen, dir, "agents.sock")
        .map_err(|e| driver_err("cannot listen for agents", e))?;
    let addr = listener
        .addr()
        .map_err(|e| driver_err("no listening address", e))?;
    let (ack_tx, acks) = unbounded();
    let acceptor = spawn_acceptor(
        listener,
        secret.clone(),
        job,
        spec.max_frame,
        tx,
        Some(ack_tx),
    )?;
    let mut cmd = srun_command(spec.nodes, &spec.agent_program)?;
    if let Some(f) = crate::logging::installed() {
        cmd.env(var::LOG, f);
    }
    cmd.env(var::JOB, format!("{job:016x}"))
        .env(var::AGENT_LAUNCHER, addr.to_string())
        .env(var::AGENT_SECRET, secret.to_hex())
        .env(var::AGENT_LAUNCHER_PID, std::process::id().to_string())
        .env(var::MAX_FRAME, spec.max_frame.to_string());
    let srun = cmd.spawn().map_err(|e| {
        driver_err(
            "cannot start the agents (srun; LAZARUS_SRUN names another command)",
            e,
        )
    })?;
    Ok(Agents {
        srun,
        _acceptor: acceptor,
        links: (0..spec.nodes).map(|_| None).collect(),
        hosts: vec![None; spec.nodes],
        acks,
        placement,
    })
}

/// Accept connections: authenticate each, then forward what happens on it
/// as events. With `acks`, the peers are agents (their identity's rank is
/// their node) and their kill confirmations go to `acks`.
fn spawn_acceptor(
    listener: Listener,
    secret: Secret,
    job: u64,
    max: usize,
    tx: Sender<Event>,
    acks: Option<Sender<AgentAck>>,
) -> Result<Acceptor> {
    let stop = listener
        .stopper()
        .map_err(|e| driver_err("cannot duplicate the listening socket", e))?;
    let stopping = stop.flag();
    let me = Identity {
        job,
        rank: None,
        incarnation: 0,
    };
    std::thread::Builder::new()
        .name("launcher-accept".into())
        .spawn(move || {
            let what = if acks.is_some() {
                "launcher (agents)"
            } else {
                "launcher"
            };
            listener.serve(what, &stopping, |mut s, place| {
                let secret = secret.clone();
                let tx = tx.clone();
                let acks = acks.clone();
                // No thread (none left): the connection and its place are
                // dropped with the closure.
                let _ = std::thread::Builder::new()
                    .name("launcher-conn".into())
                    .spawn(move || {
                        let authenticated = handshake(&mut s, &secret, me, Role::Acceptor);
                        drop(place);
                        let peer = match authenticated {
                            Ok(p) => p,
                            // A rank killed while it connected: its death
                            // is seen on its process, not reported here.
                            Err(e) if e.peer_vanished() => return,
                            Err(e) => {
                                tracing::warn!("lazarus launcher: refused a connection: {e}");
                                return;
                            }
                        };
                        let Some(id) = peer.rank else {
                            tracing::warn!("lazarus launcher: refused a connection from {peer}");
                            return;
                        };
                        let who = match acks {
                            Some(_) => Who::Agent(id),
                            None => Who::Rank(id, peer.incarnation),
                        };
                        let Ok(wr) = s.try_clone() else { return };
                        let send = |conn| tx.send(Event { who, conn }).is_ok();
                        let activity = Arc::new(Activity::new());
                        if !send(Conn::Up(wr, activity.clone())) {
                            return;
                        }
                        let mut s = Counted {
                            inner: s,
                            activity: activity.clone(),
                        };
                        loop {
                            let msg = read_frame(&mut s, max).and_then(|f| activity.decode(f));
                            let conn = match (msg, &acks) {
                                (Ok(WireMsg::Killed { .. }), Some(a)) => {
                                    let _ = a.send(AgentAck::Killed(id));
                                    continue;
                                }
                                (Ok(msg), _) => Conn::Msg(msg),
                                (Err(e), acks) => {
                                    if let Some(a) = acks {
                                        let _ = a.send(AgentAck::Lost(id));
                                    }
                                    Conn::Lost(e.to_string())
                                }
                            };
                            let lost = matches!(conn, Conn::Lost(_));
                            if !send(conn) || lost {
                                return;
                            }
                        }
                    });
            });
        })
        .map(|thread| Acceptor {
            stop,
            thread: Some(thread),
        })
        .map_err(|e| driver_err("cannot start a thread", e))
}

/// A listener's accept thread, ended when this is dropped.
struct Acceptor {
    stop: AcceptStop,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long dropping an [`Acceptor`] waits for its thread to end.
const ACCEPTOR_END_WAIT: Duration = Duration::from_secs(1);

impl Acceptor {
    /// Stop the accept loop and join its thread; whether it ended. Its
    /// connections' threads end with their connections (the rank processes
    /// are gone by then). Should the thread not end in time, it is left: a
    /// leaked thread is better than a launcher that hangs on its way out.
    fn end(&mut self) -> bool {
        self.stop.stop();
        let Some(thread) = self.thread.take() else {
            return true;
        };
        let deadline = Instant::now() + ACCEPTOR_END_WAIT;
        while !thread.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        thread.is_finished() && thread.join().is_ok()
    }
}

impl Drop for Acceptor {
    fn drop(&mut self) {
        self.end();
    }
}

#[cfg(test)]
mod tests {
    use super::super::wire::read_msg;
    use super::*;

    /// The launcher's accept thread ends with the launcher: a process that
    /// runs job after job (`lazarus bench`, a test suite) kept one thread
    /// and listening socket per job before.
    #[test]
    fn the_accept_thread_ends_with_its_launcher() {
        let dir = std::env::temp_dir().join(format!("lazarus-acceptor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        for kind in [
            Listen::Unix { rings: false },
            Listen::Tcp(std::net::IpAddr::from([127, 0, 0, 1])),
        ] {
            let listener = Listener::bind(kind, &dir, "launcher.sock").expect("bind");
            let addr = listener.addr().expect("addr");
            let (tx, _rx) = unbounded();
            let mut acceptor =
                spawn_acceptor(listener, Secret::generate(), 7, 1 << 20, tx, None).expect("spawn");
            // A stranger connects (and is refused by the handshake) while
            // the loop runs: connections are accepted until the end.
            let stranger = Stream::connect(&addr);
            assert!(stranger.is_ok(), "{kind:?}: the listener accepts");
            assert!(acceptor.end(), "{kind:?}: the accept thread did not end");
            assert!(Stream::connect(&addr).is_err(), "{kind:?}: still listening");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The directories of a job whose launcher died by SIGKILL are removed
    /// by the next launcher; those of live launchers, of jobs that wrote no
    /// PID yet (or an older build's), and anything not named like a job's
    /// stay.
    #[test]
    fn a_later_launcher_sweeps_the_directories_of_dead_launchers() {
        let root = std::env::temp_dir().join(format!("lazarus-sweep-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let (tmp, shm) = (root.join("tmp"), root.join("shm"));
        // A PID no process has: a child that exited and was reaped.
        let mut child = Command::new("true").spawn().expect("spawn true");
        let dead = child.id();
        child.wait().expect("reap");
        let make = |base: &Path, name: &str, pid: Option<u32>| {
            let d = base.join(name);
            std::fs::create_dir_all(&d).expect("dir");
            if let Some(p) = pid {
                std::fs::write(d.join(LAUNCHER_PID), p.to_string()).expect("pid file");
            }
            d
        };
        let gone = [
            make(&tmp, &job_dir_name(1), Some(dead)),
            make(&shm, &job_dir_name(1), Some(dead)),
        ];
        let kept = [
            make(&tmp, &job_dir_name(2), Some(std::process::id())),
            make(&shm, &job_dir_name(3), None),
            make(&tmp, "lazarus-00000000000001-node0", Some(dead)),
            make(&tmp, "lazarus-not-a-job-at-all", Some(dead)),
        ];
        std::fs::write(
            make(&tmp, &job_dir_name(4), None).join(LAUNCHER_PID),
            "garbage",
        )
        .expect("pid file");
        sweep_stale_jobs(&[&tmp, &shm]);
        for d in &gone {
            assert!(!d.exists(), "{} stayed", d.display());
        }
        for d in &kept {
            assert!(d.exists(), "{} was removed", d.display());
        }
        assert!(
            tmp.join(job_dir_name(4)).exists(),
            "an unreadable PID is not a dead one"
        );
        let _ = std::fs::remove_dir_all(&root);
    }

    /// Bytes of a message still arriving count as signs of life, though no
    /// whole message (a heartbeat) can be read meanwhile.
    #[test]
    fn bytes_of_a_message_still_arriving_count_as_signs_of_life() {
        let mut bytes = Vec::new();
        write_msg(
            &mut bytes,
            &WireMsg::Finishing(vec![7; 3 << 20]),
            usize::MAX,
        )
        .expect("encodes");
        let activity = Arc::new(Activity::new());
        let start = activity.last();
        std::thread::sleep(Duration::from_millis(5));
        // Half the value has arrived when the connection stalls (here: ends).
        let mut rd = Counted {
            inner: &bytes[..bytes.len() / 2],
            activity: activity.clone(),
        };
        assert!(read_msg(&mut rd, usize::MAX).is_err(), "no whole message");
        assert!(activity.last() >= start + Duration::from_millis(5));
        // A connection on which nothing arrives shows no activity.
        let idle = Arc::new(Activity::new());
        let mut rd = Counted {
            inner: &[][..],
            activity: idle.clone(),
        };
        assert!(read_msg(&mut rd, usize::MAX).is_err());
        assert_eq!(idle.last(), idle.origin);
        // Decoding a frame that has arrived counts as well: as activity
        // now while it lasts, and up to its end afterwards.
        let frame = read_frame(&mut bytes.as_slice(), usize::MAX).expect("whole");
        let before = Instant::now();
        idle.decoding.store(true, Ordering::Relaxed);
        assert!(idle.last() >= before);
        idle.decoding.store(false, Ordering::Relaxed);
        assert!(matches!(idle.decode(frame), Ok(WireMsg::Finishing(_))));
        assert!(idle.last() >= before);
    }

    /// A rank dying after another has finished is not replaced (nobody
    /// could roll back with it), and the survivors hear so: a notice
    /// promising a replacement would have them keep frames, and wait, for
    /// one that never starts.
    #[test]
    fn a_failure_after_a_rank_finished_promises_no_replacement() {
        let spec = test_spec();
        let mut l = Launcher::new(&spec).expect("launcher");
        l.replaces = Some(true);
        let mut survivor = None;
        for (r, status) in [Status::Finished, Status::Ready, Status::Ready]
            .into_iter()
            .enumerate()
        {
            let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
            if r == 1 {
                survivor = Some(theirs);
            }
            let now = l.now();
            let mut p = RankProc::starting(0, None, 0, l.detector(now), now);
            p.ctl = Some(Stream::Unix(ours));
            p.status = status;
            l.procs.push(p);
        }
        l.failure(&[2], "test");
        let mut survivor = survivor.expect("rank 1's end");
        match read_msg(&mut survivor, 1 << 20) {
            Ok(WireMsg::FailureNotice { dead, respawn, .. }) => {
                assert_eq!(dead, vec![(2, 0)]);
                assert!(!respawn, "no replacement starts, and none may be promised");
            }
            other => panic!("expected a failure notice, got {other:?}"),
        }
        assert!(l.events.iter().all(|e| !e.respawn));
        assert_eq!(l.procs[2].status, Status::Dead);
        assert_eq!(l.procs[2].incarnation, 0, "no replacement started");
        l.cleanup();
    }

    /// A failure's cause says how the rank's process ended when it had
    /// ended by itself (its exit status: what a lost control connection
    /// alone does not say), and nothing of the kind when the launcher
    /// killed it; the survivors get the cause with the notice, and the
    /// job's statistics keep it.
    #[test]
    fn a_failure_is_told_with_its_cause() {
        for (script, why, want) in [
            (
                "exit 3",
                "control connection lost (test)",
                "control connection lost (test); its process ended (exit status: 3)",
            ),
            (
                "sleep 30",
                "killed by fault injection (2@50%)",
                "killed by fault injection (2@50%)",
            ),
        ] {
            let spec = test_spec();
            let mut l = Launcher::new(&spec).expect("launcher");
            l.replaces = Some(true);
            let mut survivor = None;
            let mut child = None;
            // Rank 0 finished: nobody is replaced (no process is started).
            for (r, status) in [Status::Finished, Status::Ready, Status::Ready]
                .into_iter()
                .enumerate()
            {
                let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("pair");
                if r == 1 {
                    survivor = Some(theirs);
                }
                let now = l.now();
                let process = (r == 2).then(|| {
                    let c = Command::new("sh")
                        .args(["-c", script])
                        .spawn()
                        .expect("start sh");
                    child = Some(c.id());
                    Process::Local(c)
                });
                let mut p = RankProc::starting(0, process, 0, l.detector(now), now);
                p.ctl = Some(Stream::Unix(ours));
                p.status = status;
                l.procs.push(p);
            }
            if script.starts_with("exit") {
                // Ended (a zombie, not yet collected), however loaded the
                // machine is.
                let stat = format!("/proc/{}/stat", child.expect("pid"));
                let deadline = Instant::now() + Duration::from_secs(60);
                while std::fs::read_to_string(&stat)
                    .map(|s| {
                        s.rsplit(')')
                            .next()
                            .map(str::trim_start)
                            .map(|t| t.starts_with('Z'))
                    })
                    .ok()
                    .flatten()
                    != Some(true)
                {
                    assert!(Instant::now() < deadline, "sh did not end");
                    std::thread::sleep(Duration::from_millis(5));
                }
            }
            l.failure(&[2], why);
            let mut survivor = survivor.expect("rank 1's end");
            match read_msg(&mut survivor, 1 << 20) {
                Ok(WireMsg::FailureNotice { dead, cause, .. }) => {
                    assert_eq!(dead, vec![(2, 0)]);
                    assert_eq!(cause, want, "{script}");
                }
                other => panic!("expected a failure notice, got {other:?}"),
            }
            assert_eq!(l.detections.len(), 1);
            assert_eq!(l.detections[0].cause, want, "{script}");
            l.cleanup();
        }
    }

    fn test_spec() -> LaunchSpec {
        LaunchSpec {
            program: "/bin/false".into(),
            args: Vec::new(),
            ranks: 3,
            nodes: 1,
            kills: Vec::new(),
            listen: Listen::Unix { rings: false },
            heartbeat_timeout: Duration::from_millis(200),
            max_frame: 1 << 20,
            restart_generation: None,
            self_launch: true,
            call: None,
            protocol: "coordinated".into(),
            earlier: Vec::new(),
            progress_bar: false,
            quiet_stdout: true,
            protocol_override: Some(crate::ProtocolKind::Coordinated),
            protocol_settings: ProtocolSettings::default(),
            trace: None,
            hosts: Hosts::Local,
            sets: Default::default(),
            agent_program: "/bin/false".into(),
        }
    }

    fn ms(v: f64) -> Duration {
        Duration::from_secs_f64(v / 1e3)
    }

    /// The check interval stays well within the heartbeat timeout, and a
    /// check on time (give or take scheduling delays) is trusted at every
    /// timeout from the minimum up: with the old rule (gap under half the
    /// timeout, tick 5 ms) a 10 ms timeout was never enforced.
    #[test]
    fn a_check_on_time_is_trusted_and_a_stalled_one_is_not() {
        assert_eq!(check_tick(ms(200.0)), ms(5.0));
        assert_eq!(check_tick(ms(10.0)), ms(2.5));
        for timeout in [10.0, 12.0, 20.0, 50.0, 200.0, 5000.0] {
            let t = ms(timeout);
            let tick = check_tick(t);
            assert!(tick <= t / 4, "{timeout} ms: tick {tick:?}");
            for late in [0.0, 0.5, 1.0, timeout / 2.0 - 0.5] {
                assert!(
                    heartbeats_trusted(tick + ms(late), tick, t),
                    "{timeout} ms timeout, check {late} ms late"
                );
            }
            for late in [timeout / 2.0, timeout, 10.0 * timeout] {
                assert!(
                    !heartbeats_trusted(tick + ms(late), tick, t),
                    "{timeout} ms timeout, launcher stalled {late} ms"
                );
            }
        }
    }
}
