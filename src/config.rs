//! All configuration of a run in one documented struct (as lamellar does),
//! covering every backend (as timely-dataflow's `Config` does).

use std::fmt;
use std::str::FromStr;

pub use crate::driver::processes::agent::Hosts;
pub use crate::driver::processes::net::Listen;
use crate::fault::{KillSpec, WarnSpec, Warned};
use crate::migration::balancer::Strategy as Balance;
pub use crate::network::NetworkModel;
use crate::protocol::ProtocolKind;
use crate::protocol::chandy_lamport::GetFix;
use crate::protocol::coordinated::CheckpointScheme;
pub use crate::protocol::correlated::SetRule;
use crate::protocol::rma::AccessLogging;
pub use crate::store::levels::LevelSpec;
use crate::topology::Placement;
use crate::{Error, Result};

/// Where ranks run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Every rank a thread of this process.
    Threads,
    /// The deterministic simulator (virtual time, seeded schedule).
    Sim,
    /// One OS process per rank, started and watched by a launcher.
    Processes,
    /// One MPI process per rank, started by `mpiexec` or `srun` (built with
    /// the `mpi` feature; [`crate::driver::mpi`]).
    Mpi,
}

impl Backend {
    /// Every backend this build has, for the shared conformance suite.
    #[cfg(feature = "mpi")]
    pub const ALL: [Backend; 4] = [
        Backend::Processes,
        Backend::Threads,
        Backend::Sim,
        Backend::Mpi,
    ];
    /// Every backend this build has, for the shared conformance suite.
    #[cfg(not(feature = "mpi"))]
    pub const ALL: [Backend; 3] = [Backend::Processes, Backend::Threads, Backend::Sim];

    /// The backends that recover a failed rank in place, without ending
    /// the job: the suites that kill ranks run on these. (`mpi` without
    /// ULFM loses the job with any rank; `lazarus mpirun` restarts it.)
    pub const RECOVERING: [Backend; 3] = [Backend::Processes, Backend::Threads, Backend::Sim];

    /// Every backend's name, built or not (what `--backend` accepts).
    const NAMED: [Backend; 4] = [
        Backend::Processes,
        Backend::Threads,
        Backend::Sim,
        Backend::Mpi,
    ];

    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Threads => "threads",
            Backend::Sim => "sim",
            Backend::Processes => "processes",
            Backend::Mpi => "mpi",
        }
    }
}

/// Most ranks of a job on `threads` (one thread per rank, in one process):
/// a few thousand threads is what an ordinary Linux account gets
/// (`ulimit -u`) and far more than the machine has cores.
pub const MAX_THREAD_RANKS: usize = 4096;

/// Most ranks of a job on `processes` (one OS process per rank, each with a
/// socket and a connection to every peer it talks to): as many as
/// `threads`, for the same per-user limits, and file descriptors.
pub const MAX_PROCESS_RANKS: usize = 4096;

/// Most ranks of a simulated job: 2^24. Each rank is a coroutine of a
/// few tens of KiB (stack, engine, protocol and the program's data), so
/// memory, checked when the simulator starts, refuses far fewer on most
/// machines (a 24 GiB machine holds 2^20 ranks of the stencil pattern).
pub const MAX_SIM_RANKS: usize = 1 << 24;

impl Backend {
    /// Most ranks a job may have on this backend ([`MAX_THREAD_RANKS`],
    /// [`MAX_PROCESS_RANKS`], [`MAX_SIM_RANKS`]).
    pub fn max_ranks(self) -> usize {
        match self {
            Backend::Threads => MAX_THREAD_RANKS,
            Backend::Processes | Backend::Mpi => MAX_PROCESS_RANKS,
            Backend::Sim => MAX_SIM_RANKS,
        }
    }
}

/// Check a rank count (`--ranks`, `-n`) against the backend's bound, before
/// anything is allocated per rank: a count from the user must never reach
/// an allocator that aborts on it.
pub fn check_ranks(backend: Backend, ranks: usize) -> Result<()> {
    let max = backend.max_ranks();
    if ranks > max {
        return Err(Error::config(
            "ranks",
            format!("{ranks} ranks: backend {backend} runs at most {max}"),
        ));
    }
    Ok(())
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Backend::NAMED
            .into_iter()
            .find(|b| b.name() == s)
            .ok_or_else(|| {
                Error::config(
                    "backend",
                    format!("unknown backend `{s}` (available: threads, processes, sim, mpi)"),
                )
            })
    }
}

/// What a failure does to the ranks that survive it (MPI's error handlers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureHandling {
    /// The protocol handles it; under `none` the run ends with
    /// [`Error::ProcessFailed`] (MPI_ERRORS_ARE_FATAL).
    #[default]
    Fatal,
    /// The program handles it (MPI_ERRORS_RETURN with ULFM, 002 §3.2): an
    /// operation that involves a failed rank returns
    /// [`Error::ProcessFailed`], one on a revoked communicator
    /// [`Error::Revoked`], and the program acknowledges, revokes, agrees,
    /// shrinks or respawns (`api::ulfm`). Protocol `none` only.
    Return,
}

/// Shortest heartbeat timeout of the processes backend: ranks heartbeat
/// four times per timeout and the launcher checks at least as often, so
/// anything shorter cannot tell a slow rank from a dead one (and 0 would
/// have ranks heartbeat in a busy loop).
pub const MIN_HEARTBEAT_TIMEOUT: std::time::Duration = std::time::Duration::from_millis(10);

/// Smallest `max_frame` accepted: below it even runtime messages may not fit.
pub const MIN_MAX_FRAME: usize = 64 << 10;

/// Largest `max_frame` accepted (1 TiB): a sanity bound, far above any
/// rank's memory (frames of 4 GiB or more carry a 64-bit length).
pub const MAX_MAX_FRAME: usize = 1 << 40;

/// Default `max_frame` (16 GiB): a checkpoint piece (a rank's state, plus
/// its message log under logging) of a few GB goes through as it is. The
/// limit bounds what a faulty peer can make a rank allocate; a receiver
/// grows a frame's buffer only as its bytes arrive.
pub const DEFAULT_MAX_FRAME: usize = 16 << 30;

/// Check a frame limit (`--max-frame`): between [`MIN_MAX_FRAME`] and
/// [`MAX_MAX_FRAME`] bytes.
pub fn check_max_frame(bytes: usize) -> Result<()> {
    if (MIN_MAX_FRAME..=MAX_MAX_FRAME).contains(&bytes) {
        return Ok(());
    }
    Err(Error::config(
        "max_frame",
        format!(
            "{bytes} bytes: a frame limit must lie between {} and {}",
            bytesize::ByteSize(MIN_MAX_FRAME as u64).display().iec(),
            bytesize::ByteSize(MAX_MAX_FRAME as u64).display().iec()
        ),
    ))
}

/// Configuration of one job.
///
/// | field | CLI | default |
/// | --- | --- | --- |
/// | `backend` | `--backend` | threads |
/// | `protocol` | `--protocol` | none |
/// | `ranks` | `--ranks` | 4 |
/// | `nodes` | `--nodes` | 1 (failure domains, block placement) |
/// | `kills` | `--kill` (repeatable) | none |
/// | `checkpoint_every` | `--checkpoint-every` | 1 (every safe point) |
/// | `mtbf` | `--checkpoint-interval daly --mtbf D` | none (fixed interval) |
/// | `checkpoint_scheme` | `--checkpoint-scheme auto\|gsync\|locks` (`coordinated`) | auto (003 §3.1.2: from the program's synchronisation) |
/// | `rma_log` | `--rma-log puts-gets\|puts` (`rma`) | puts-gets (003 §7.2.2's f-puts-gets) |
/// | `storage` | `--storage partner\|xor[@N]\|rs:M[@N]\|disk:DIR[@N]` (repeatable) | partner |
/// | `restart` | `--restart DIR` | none |
/// | `program` | the app and its class or size (`lazarus run`) | none |
/// | `log_budget` | `--log-budget BYTES` (message logging) | none |
/// | `sets` | `--sets N` (protocol `correlated`) | one set per failure domain |
/// | `failure_handling` | (set by the program) | fatal |
/// | `seed` | `--seed` | 1 |
/// | `iterations` | set by the application | unknown |
/// | `progress_bar` | on when stdout is a terminal | off |
/// | `network` | (sim only) | 0.5/2 us latency, 20/10 GB/s |
/// | `listen` | `--listen unix\|unix-sockets\|tcp[:IP]` (processes only) | unix (frames in shared-memory rings) |
/// | `hosts` | `--hosts local\|slurm` (processes only) | local |
/// | `heartbeat_timeout` | `--heartbeat-timeout D` (processes only, at least 10 ms; a bare number is ms) | 200 ms |
/// | `max_frame` | `--max-frame BYTES` (processes only, 64 KiB to 1 TiB) | 16 GiB |
/// | `worker_args` | (processes; a test harness names it on every backend) | this program's own arguments |
///
/// Logging is not a setting of the job: it is the process's (`--log-level`,
/// else `RUST_LOG`, else `warn`; see [`crate::logging`]), and a launcher
/// hands its filter to its rank processes.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where ranks run.
    pub(crate) backend: Backend,
    /// The rollback-recovery protocol.
    pub(crate) protocol: ProtocolKind,
    /// Number of ranks.
    pub(crate) ranks: usize,
    /// Number of failure domains ranks are placed on.
    pub(crate) nodes: usize,
    /// Failures to inject.
    pub(crate) kills: Vec<KillSpec>,
    /// Checkpoint at every N-th safe point (0: never). With `mtbf`, the
    /// first interval only: later ones follow Daly's formula.
    pub(crate) checkpoint_every: u64,
    /// Checkpoint storage levels (see `store::levels`: partner is on unless
    /// `xor` or `rs:M` replaces it).
    pub(crate) storage: Vec<LevelSpec>,
    /// Restart the whole job from the newest committed generation in this
    /// checkpoint directory (written by a `disk:DIR` level).
    pub(crate) restart: Option<std::path::PathBuf>,
    /// The generation a restart resumes from (set by [`crate::run`] from the
    /// restart directory before any rank starts).
    pub(crate) restart_generation: Option<u64>,
    /// What the job runs, with the parameters that shape its checkpointed
    /// state (`cg class S`): recorded in the manifest of a disk level's
    /// directory, and a restart from a directory that records another
    /// program is refused. `None` (a library job that does not say): not
    /// recorded, and not compared.
    pub(crate) program: Option<String>,
    /// Message logging: a sender whose log passes half of this many bytes
    /// asks its largest receiver to checkpoint (trimming the log).
    pub(crate) log_budget: Option<usize>,
    /// Protocol `correlated`: how ranks form correlated sets.
    pub(crate) sets: SetRule,
    /// Whether failures end the run (or are recovered by the protocol), or
    /// are reported to the program (ULFM).
    pub(crate) failure_handling: FailureHandling,
    /// Mean time between failures: when set, the checkpoint interval is
    /// Daly's optimum (003 §6.1) for the measured checkpoint cost.
    pub(crate) mtbf: Option<std::time::Duration>,
    /// `coordinated`: how checkpoints are made consistent (003 §3.1.2).
    pub(crate) checkpoint_scheme: CheckpointScheme,
    /// `rma`: which accesses are logged (003 §7.2.2).
    pub(crate) rma_log: AccessLogging,
    /// Seed of every random choice the runtime makes (fault timing).
    pub(crate) seed: u64,
    /// Safe points the application will pass, if known (validates kills).
    pub(crate) iterations: Option<u64>,
    /// Draw a progress bar on stderr.
    pub(crate) progress_bar: bool,
    /// The simulated network (backend `sim` only).
    pub(crate) network: NetworkModel,
    /// Socket kind of the processes backend.
    pub(crate) listen: Listen,
    /// Processes backend: where rank processes run (`Slurm`: an agent on
    /// every node of the allocation starts them; needs `listen` TCP on an
    /// address the nodes reach).
    pub(crate) hosts: Hosts,
    /// Processes backend: the failure detector's shortest timeout. No rank
    /// is suspected before this much silence; the timeout grows with the
    /// observed heartbeat jitter, and only a rank on another host is
    /// declared dead (and killed) for silence.
    pub(crate) heartbeat_timeout: std::time::Duration,
    /// Processes backend: largest frame a connection accepts; a bigger one
    /// closes the connection.
    pub(crate) max_frame: usize,
    /// Processes backend: the arguments rank processes are started with
    /// (the program is this executable). `None`: this process's own
    /// arguments, which is right for a program whose `main` builds the same
    /// job again; a test harness names the test to run instead, and names
    /// it on its jobs of every backend: a rank process counts the calls
    /// that name it to find its own, and replays the earlier ones from the
    /// launcher's record instead of running them again.
    pub(crate) worker_args: Option<Vec<String>>,
    /// Record a timeline of the run ([`crate::trace`]): spans shorter than
    /// this are merged with their neighbours of the same kind. `None`: no
    /// timeline (nothing is recorded, nothing costs).
    pub(crate) trace: Option<std::time::Duration>,
    /// `chandy-lamport`: run 000 §IV's wave with this `get()` fix beside
    /// the recorded snapshots.
    pub(crate) get_fix: Option<GetFix>,
    /// Stamp every communication with the wave's cuts and check them
    /// (`JobStats::cuts`).
    pub(crate) check_cuts: bool,
    /// With a `get()` fix: rank 0 initiates the wave whenever this much
    /// time has passed, wherever it is, instead of at checkpoints.
    pub(crate) wave_interval: Option<std::time::Duration>,
    /// Workers hosting the ranks (001's processors; `None`: one a rank).
    pub(crate) workers: Option<usize>,
    /// Fault warnings (001): the warned workers' ranks are evacuated.
    pub(crate) warnings: Vec<WarnSpec>,
    /// Load balancing after an evacuation (001 §4.2).
    pub(crate) balance: Balance,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            backend: Backend::Threads,
            protocol: ProtocolKind::None,
            ranks: 4,
            nodes: 1,
            kills: Vec::new(),
            checkpoint_every: 1,
            mtbf: None,
            checkpoint_scheme: CheckpointScheme::Auto,
            rma_log: AccessLogging::PutsGets,
            storage: vec![LevelSpec::Partner],
            restart: None,
            restart_generation: None,
            program: None,
            log_budget: None,
            sets: Default::default(),
            failure_handling: FailureHandling::Fatal,
            seed: 1,
            iterations: None,
            progress_bar: false,
            network: NetworkModel::default(),
            listen: Listen::Unix { rings: true },
            hosts: Default::default(),
            heartbeat_timeout: std::time::Duration::from_millis(200),
            max_frame: DEFAULT_MAX_FRAME,
            worker_args: None,
            trace: None,
            get_fix: None,
            check_cuts: false,
            wave_interval: None,
            workers: None,
            warnings: Vec::new(),
            balance: Balance::Greedy,
        }
    }
}

impl Config {
    /// Where a message log past `log_budget` spills payloads: the first
    /// `disk:DIR` level's directory, else the system's temporary directory
    /// (the spill files are unlinked: nothing is left behind).
    pub fn spill_dir(&self) -> std::path::PathBuf {
        self.storage
            .iter()
            .find_map(|l| match l {
                LevelSpec::Disk { dir, .. } => Some(dir.clone()),
                _ => None,
            })
            .unwrap_or_else(std::env::temp_dir)
    }

    /// A configuration for `ranks` ranks with defaults otherwise.
    pub fn new(ranks: usize) -> Self {
        Config {
            ranks,
            ..Config::default()
        }
    }

    /// This configuration as one protocol of a comparison (`lazarus bench`,
    /// `chaos`, `scale`): options only protocol `correlated` takes
    /// (`--sets`) are kept for it and dropped for the others, likewise
    /// the log budget for protocols that keep no message log, and the
    /// checkpoint scheme for protocols other than `coordinated`.
    pub fn compared_under(mut self, p: ProtocolKind) -> Self {
        self.protocol = p;
        if p != ProtocolKind::Correlated {
            self.sets = SetRule::default();
        }
        if !p.logs_messages() {
            self.log_budget = None;
        }
        if p != ProtocolKind::Coordinated {
            self.checkpoint_scheme = CheckpointScheme::Auto;
        }
        if p != ProtocolKind::Rma {
            self.rma_log = AccessLogging::default();
        }
        self
    }

    /// Record a timeline of the run (`JobStats::trace`), merging spans
    /// shorter than [`crate::trace::DEFAULT_THRESHOLD`].
    pub fn traced(mut self) -> Self {
        self.trace = Some(crate::trace::DEFAULT_THRESHOLD);
        self
    }

    /// Add a failure to inject.
    pub fn kill(mut self, k: KillSpec) -> Self {
        self.kills.push(k);
        self
    }

    /// Add a fault warning (001).
    pub fn warn(mut self, w: WarnSpec) -> Self {
        self.warnings.push(w);
        self
    }

    /// The number of workers: `workers`, or one a rank.
    pub fn worker_count(&self) -> usize {
        self.workers.unwrap_or(self.ranks)
    }

    /// Virtual ranks and warnings (001): workers hosting several ranks, and
    /// the warnings that move them, checked against the job.
    fn check_workers(&self, pl: &Placement) -> Result<()> {
        let at_evacuation =
            (self.kills.iter()).find(|k| matches!(k.moment, crate::fault::Moment::Evacuation(_)));
        if let Some(k) = at_evacuation
            && self.warnings.is_empty()
        {
            return Err(Error::config(
                "kills",
                format!("`{k}`: a kill during an evacuation needs a warning (--warn) to begin one"),
            ));
        }
        if self.workers.is_none() && self.warnings.is_empty() {
            return Ok(());
        }
        let option = if self.workers.is_some() {
            "workers"
        } else {
            "warnings"
        };
        if self.backend != Backend::Sim {
            return Err(Error::config(
                option,
                "workers hosting several ranks, and the warnings that move ranks between \
                 them (001), run on the simulator so far (--backend sim)",
            ));
        }
        let w = self.worker_count();
        if w == 0 || w > self.ranks || !self.ranks.is_multiple_of(w) {
            return Err(Error::config(
                "workers",
                format!(
                    "{w} workers cannot host {} ranks in equal blocks (need a divisor of the \
                     rank count)",
                    self.ranks
                ),
            ));
        }
        if w < pl.nodes() || !w.is_multiple_of(pl.nodes()) {
            return Err(Error::config(
                "workers",
                format!(
                    "{w} workers cannot fill {} nodes equally (need a multiple of the node count)",
                    pl.nodes()
                ),
            ));
        }
        for warn in &self.warnings {
            let bad = |d: String| Error::config("warnings", format!("`{warn}`: {d}"));
            match warn.warned {
                Warned::Worker(x) if x >= w => {
                    return Err(bad(format!("worker {x} is out of range ({w} workers)")));
                }
                Warned::Node(k) if k >= pl.nodes() => {
                    return Err(bad(format!(
                        "node {k} is out of range ({} nodes)",
                        pl.nodes()
                    )));
                }
                _ => {}
            }
            if let crate::fault::Moment::Iteration(i) = warn.moment
                && i >= self.iterations.unwrap_or(u64::MAX)
            {
                return Err(bad(format!("iteration {i} is beyond the run")));
            }
        }
        Ok(())
    }

    /// The placement this configuration describes.
    pub fn placement(&self) -> Result<Placement> {
        Placement::block(self.ranks, self.nodes)
    }

    /// What the `mpi` backend cannot do (yet) or needs.
    fn check_mpi(&self) -> Result<()> {
        if !cfg!(feature = "mpi") {
            return Err(Error::config(
                "backend",
                "this lazarus was built without MPI: build it with `--features mpi` \
                 (which needs an MPI's `mpicc` on the PATH and libclang)",
            ));
        }
        check_max_frame(self.max_frame)?;
        if self.failure_handling == FailureHandling::Return {
            return Err(Error::config(
                "failure_handling",
                "failures reported to the program need ULFM, which the mpi backend does not \
                 drive yet: use the processes backend",
            ));
        }
        let on_disk = self
            .storage
            .iter()
            .any(|l| matches!(l, crate::store::levels::LevelSpec::Disk { .. }));
        if !self.kills.is_empty() && !on_disk && !crate::driver::mpi_env::recovers_in_place() {
            return Err(Error::config(
                "kills",
                "on the mpi backend a rank's death ends the MPI job (no in-place recovery \
                 without ULFM), which then restarts from its newest generation on disk: \
                 add a disk level to `Config::storage` (disk:DIR)",
            ));
        }
        Ok(())
    }

    /// Check the configuration as a whole.
    pub fn validate(&self) -> Result<Placement> {
        check_ranks(self.backend, self.ranks)?;
        let pl = self.placement()?;
        if self.backend == Backend::Processes {
            self.hosts.check_listen(self.listen)?;
            check_max_frame(self.max_frame)?;
            if self.heartbeat_timeout < MIN_HEARTBEAT_TIMEOUT {
                return Err(Error::config(
                    "heartbeat_timeout",
                    format!(
                        "{} ms is too short to tell a slow rank from a dead one (at least {})",
                        self.heartbeat_timeout.as_millis(),
                        MIN_HEARTBEAT_TIMEOUT.as_millis()
                    ),
                ));
            }
        }
        if self.backend == Backend::Mpi {
            self.check_mpi()?;
        }
        if (self.get_fix.is_some() || self.check_cuts)
            && self.protocol != ProtocolKind::ChandyLamport
        {
            return Err(Error::config(
                if self.get_fix.is_some() {
                    "get_fix"
                } else {
                    "check_cuts"
                },
                "the snapshot wave and its cuts are chandy-lamport's (--protocol chandy-lamport)",
            ));
        }
        if self.wave_interval.is_some() && self.get_fix.is_none() {
            return Err(Error::config(
                "wave_interval",
                "it times 000 §IV's wave: choose its get() fix (--get-fix)",
            ));
        }
        if self.wave_interval.is_some_and(|d| d.is_zero()) {
            return Err(Error::config("wave_interval", "must be longer than 0"));
        }
        if self.check_cuts && self.get_fix.is_none() {
            return Err(Error::config(
                "check_cuts",
                "the cuts checked are those of 000 §IV's wave: choose its get() fix (--get-fix)",
            ));
        }
        if self.get_fix == Some(GetFix::Vanilla) && !self.kills.is_empty() {
            // Its cuts can be crossed by a GET (000 Fig. 3): it is there to
            // be measured, not to recover from.
            return Err(Error::config(
                "get_fix",
                "vanilla Chandy-Lamport lets a one-sided GET cross its cut (000 Fig. 3); it is measured on failure-free runs only: choose delay, peek-and-get, double-barrier or partial-double-barrier to inject failures",
            ));
        }
        // (`none` is a comparison's baseline: it takes no checkpoint.)
        if self.checkpoint_scheme != CheckpointScheme::Auto
            && !matches!(
                self.protocol,
                ProtocolKind::Coordinated | ProtocolKind::None
            )
        {
            return Err(Error::config(
                "checkpoint_scheme",
                format!(
                    "the Gsync and Locks schemes coordinate `coordinated`'s checkpoints, not `{}`'s",
                    self.protocol
                ),
            ));
        }
        if self.rma_log != AccessLogging::default()
            && !matches!(self.protocol, ProtocolKind::Rma | ProtocolKind::None)
        {
            return Err(Error::config(
                "rma_log",
                format!(
                    "which accesses are logged is `rma`'s choice (003 §7.2.2), not `{}`'s",
                    self.protocol
                ),
            ));
        }
        if self.mtbf.is_some() && self.protocol == ProtocolKind::ChandyLamport {
            // Every rank records generation g at its safe point g × every
            // without asking anyone (protocol::chandy_lamport), so the
            // interval cannot change during the run.
            return Err(Error::config(
                "mtbf",
                "Daly's interval changes the checkpoint interval during the run; chandy-lamport needs a fixed one (--checkpoint-interval fixed)",
            ));
        }
        if let SetRule::Consecutive(n) = self.sets
            && (n == 0 || n > self.ranks)
        {
            return Err(Error::config(
                "sets",
                format!("a correlated set needs 1 to {} ranks, not {n}", self.ranks),
            ));
        }
        if self.sets != SetRule::default() && self.protocol != ProtocolKind::Correlated {
            return Err(Error::config(
                "sets",
                format!(
                    "correlated sets are formed by protocol `correlated` only, not `{}`",
                    self.protocol
                ),
            ));
        }
        match self.log_budget {
            Some(0) => {
                return Err(Error::config(
                    "log_budget",
                    "a budget of 0 bytes holds no message; give a positive number of bytes",
                ));
            }
            Some(_) if !self.protocol.logs_messages() => {
                return Err(Error::config(
                    "log_budget",
                    format!(
                        "protocol `{}` keeps no message log to bound (a log budget is for \
                         pessimistic, ulml and correlated)",
                        self.protocol
                    ),
                ));
            }
            _ => {}
        }
        if self.restart.is_some() && self.protocol == ProtocolKind::None {
            return Err(Error::config(
                "restart",
                "restarting from a checkpoint needs a checkpointing protocol (coordinated, for one)",
            ));
        }
        if self.failure_handling == FailureHandling::Return && self.protocol != ProtocolKind::None {
            return Err(Error::config(
                "failure_handling",
                format!(
                    "failures are reported to the program (ULFM) only under protocol `none`;                      protocol `{}` recovers them itself",
                    self.protocol
                ),
            ));
        }
        for k in &self.kills {
            k.validate(&pl, self.iterations.unwrap_or(u64::MAX))?;
        }
        self.check_workers(&pl)?;
        crate::store::levels::validate(&self.storage, &pl)?;
        if self.protocol.logs_messages() {
            // Uncoordinated checkpoints: each rank has its own generations,
            // which parity groups and commit records cannot combine.
            let partner_only = self.storage.iter().all(|l| {
                matches!(
                    l,
                    LevelSpec::Partner | LevelSpec::CorruptPartnerCopiesAt { .. }
                )
            });
            if !partner_only || self.restart.is_some() {
                return Err(Error::config(
                    "storage",
                    format!(
                        "protocol `{}` takes uncoordinated checkpoints, stored by the partner \
                         level only (xor, rs:M, disk and a restart need coordinated generations)",
                        self.protocol
                    ),
                ));
            }
        }
        Ok(pl)
    }
}

/// Each field's builder method (named after it; an `Option` field takes
/// the value or `None`) and its reader, named `get_` and the field, as
/// `std::process::Command` names its readers (the field's name is the
/// builder's).
macro_rules! settings {
    ($(
        $(#[doc = $doc:literal])*
        $name:ident: $arg:ty => $get:ident($read:path) -> $out:ty;
    )*) => {
        impl Config {$(
            $(#[doc = $doc])*
            pub fn $name(mut self, value: $arg) -> Self {
                self.$name = value.into();
                self
            }

            #[doc = concat!("What [`Config::", stringify!($name), "`] set (see the table on [`Config`]).")]
            pub fn $get(&self) -> $out {
                $read(&self.$name)
            }
        )*}
    };
}

/// A field read as a copy.
fn copied<T: Copy>(value: &T) -> T {
    *value
}

settings! {
    /// Where ranks run.
    backend: Backend => get_backend(copied) -> Backend;
    /// The rollback-recovery protocol.
    protocol: ProtocolKind => get_protocol(copied) -> ProtocolKind;
    /// Number of ranks ([`Config::new`] sets it too).
    ranks: usize => get_ranks(copied) -> usize;
    /// Place ranks on `k` failure domains (block placement).
    nodes: usize => get_nodes(copied) -> usize;
    /// The failures to inject (replacing any given before; [`Config::kill`]
    /// adds one).
    kills: Vec<KillSpec> => get_kills(Vec::as_slice) -> &[KillSpec];
    /// Checkpoint at every `n`-th safe point (0: never). With
    /// [`Config::mtbf`], the first interval only: later ones follow Daly's
    /// formula.
    checkpoint_every: u64 => get_checkpoint_every(copied) -> u64;
    /// Checkpoint storage levels, in the order given (the partner copy is
    /// kept unless `xor` or `rs:M` replaces it; see [`LevelSpec`]).
    storage: Vec<LevelSpec> => get_storage(Vec::as_slice) -> &[LevelSpec];
    /// Restart the whole job from the newest committed generation in this
    /// checkpoint directory (written by a `disk:DIR` level).
    restart: impl Into<Option<std::path::PathBuf>> => get_restart(Option::as_deref) -> Option<&std::path::Path>;
    /// What the job runs, with the parameters that shape its checkpointed
    /// state (`cg class S`): recorded by a disk level, and a restart from a
    /// directory that records another program is refused.
    program: impl Into<Option<String>> => get_program(Option::as_deref) -> Option<&str>;
    /// Message logging: a sender whose log passes half of this many bytes
    /// asks its largest receiver to checkpoint (trimming the log); past
    /// the budget, payloads spill to disk.
    log_budget: impl Into<Option<usize>> => get_log_budget(copied) -> Option<usize>;
    /// Protocol `correlated`: how ranks form correlated sets (004 §3).
    sets: SetRule => get_sets(copied) -> SetRule;
    /// Whether the protocol recovers failures, or the program handles them
    /// (ULFM; protocol `none` only).
    failure_handling: FailureHandling => get_failure_handling(copied) -> FailureHandling;
    /// Mean time between failures: the checkpoint interval becomes Daly's
    /// optimum (003 §6.1) for the measured checkpoint cost.
    mtbf: impl Into<Option<std::time::Duration>> => get_mtbf(copied) -> Option<std::time::Duration>;
    /// `coordinated`: how a checkpoint is made consistent (003 §3.1.2):
    /// a barrier before the capture (Locks), none right after a GSYNC
    /// (Gsync, the cut checked after the capture), or chosen from the
    /// program's synchronisation (Auto).
    checkpoint_scheme: CheckpointScheme => get_checkpoint_scheme(copied) -> CheckpointScheme;
    /// `rma`: log writes and reads (f-puts-gets, the default) or writes
    /// only (f-puts), 003 §7.2.2.
    rma_log: AccessLogging => get_rma_log(copied) -> AccessLogging;
    /// Seed of every random choice the runtime makes (fault timing, the
    /// simulator's schedule).
    seed: u64 => get_seed(copied) -> u64;
    /// Safe points the application will pass, if known (kills at a
    /// percentage of the run need it).
    iterations: impl Into<Option<u64>> => get_iterations(copied) -> Option<u64>;
    /// Draw a progress bar on stderr.
    progress_bar: bool => get_progress_bar(copied) -> bool;
    /// The simulated network and failure detector (backend `sim` only).
    network: NetworkModel => get_network(copied) -> NetworkModel;
    /// Processes backend: the kind of socket ranks listen on.
    listen: Listen => get_listen(copied) -> Listen;
    /// Processes backend: where rank processes run (`Slurm`: an agent on
    /// every node of the allocation starts them; needs TCP on an address
    /// the nodes reach).
    hosts: Hosts => get_hosts(copied) -> Hosts;
    /// Processes backend: the failure detector's shortest timeout (at least
    /// [`MIN_HEARTBEAT_TIMEOUT`]). No rank is suspected before this much
    /// silence; the timeout grows with the observed heartbeat jitter.
    heartbeat_timeout: std::time::Duration => get_heartbeat_timeout(copied) -> std::time::Duration;
    /// Processes backend: the largest frame a connection accepts
    /// ([`MIN_MAX_FRAME`] to [`MAX_MAX_FRAME`] bytes).
    max_frame: usize => get_max_frame(copied) -> usize;
    /// Processes backend: the arguments rank processes are started with
    /// (the program is this executable); `None`: this process's own. A
    /// test harness names the test to run.
    worker_args: impl Into<Option<Vec<String>>> => get_worker_args(Option::as_deref) -> Option<&[String]>;
    /// Record a timeline of the run (`JobStats::trace`): spans shorter than
    /// this are merged with their neighbours of the same kind; `None`: no
    /// timeline, and nothing costs ([`Config::traced`] sets the default).
    trace: impl Into<Option<std::time::Duration>> => get_trace(copied) -> Option<std::time::Duration>;
    /// `chandy-lamport`: run 000 §IV's snapshot wave with this `get()` fix
    /// beside the recorded snapshots (marker counts in `JobStats::wave`).
    get_fix: impl Into<Option<GetFix>> => get_get_fix(copied) -> Option<GetFix>;
    /// With a `get()` fix: stamp every communication with the wave's cuts
    /// and check them at the end (`JobStats::cuts`; failure-free runs).
    check_cuts: bool => get_check_cuts(copied) -> bool;
    /// With a `get()` fix: rank 0 initiates the wave whenever this much
    /// time (virtual on the simulator) has passed since the last, at its
    /// next communication, wherever the application is, instead of at
    /// the checkpoints' safe points.
    wave_interval: impl Into<Option<std::time::Duration>> => get_wave_interval(copied) -> Option<std::time::Duration>;
    /// Workers (001's processors) hosting the ranks, in blocks of
    /// consecutive ranks, the workers in blocks over the nodes; `None`: one
    /// worker a rank. Backend `sim` so far.
    workers: impl Into<Option<usize>> => get_workers(copied) -> Option<usize>;
    /// Fault warnings (001): the warned workers' ranks are moved to other
    /// workers at their next safe point, with no rollback ([`Config::warn`]
    /// adds one). Backend `sim` so far.
    warnings: Vec<WarnSpec> => get_warnings(Vec::as_slice) -> &[WarnSpec];
    /// After an evacuation: reassign ranks over the remaining workers by
    /// measured load (001 §4.2), greedily (the default), by refinement, or
    /// not at all.
    balance: Balance => get_balance(copied) -> Balance;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A heartbeat timeout of 0 (ranks would heartbeat in a busy loop) or
    /// below the minimum is refused on the processes backend.
    #[test]
    fn too_short_a_heartbeat_timeout_is_refused() {
        let cfg = |ms| Config {
            heartbeat_timeout: Duration::from_millis(ms),
            ..Config::new(2).backend(Backend::Processes)
        };
        for ms in [0, 1, 9] {
            match cfg(ms).validate() {
                Err(Error::Config { option, .. }) => assert_eq!(option, "heartbeat_timeout"),
                other => panic!("{ms} ms: {other:?}"),
            }
        }
        assert!(cfg(10).validate().is_ok());
        assert!(cfg(200).validate().is_ok());
    }

    /// A library error names the setting (the `Config` method), never a
    /// command-line option or advice meant for the command: the `lazarus`
    /// command maps settings to its flags itself.
    #[test]
    fn configuration_errors_name_settings_not_options() {
        let bad = [
            Config::new(0),
            Config::new(4).nodes(5),
            Config::new(4).log_budget(0),
            Config::new(4).log_budget(1000),
            Config::new(4)
                .sets(SetRule::Consecutive(9))
                .protocol(ProtocolKind::Correlated),
            Config::new(4).restart(std::path::PathBuf::from("/nonexistent")),
            Config::new(4).backend(Backend::Processes).max_frame(1),
            Config::new(4)
                .protocol(ProtocolKind::Pessimistic)
                .storage(vec!["xor".parse().expect("a level")]),
            Config::new(MAX_THREAD_RANKS + 1),
        ];
        for cfg in bad {
            let e = cfg.validate().expect_err("invalid");
            let Error::Config { option, .. } = &e else {
                panic!("not a configuration error: {e}");
            };
            assert!(!option.starts_with('-'), "{e}");
            assert!(!e.to_string().contains("--"), "command-line advice: {e}");
        }
    }
}
