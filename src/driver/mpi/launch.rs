//! Starting an MPI job, and starting it again when a rank's death ended it.
//!
//! An MPI without ULFM ends the whole job when a rank dies. A rank that
//! carries out a kill of the fault plan first writes it down (the
//! `FIRED` file); the command that started the job sees the job end,
//! reads which kills fired, and starts it again with `RESUME` set, so
//! that its ranks restart from the newest committed generation of their
//! disk level (or from the beginning if none was committed yet), and with
//! those kills marked fired. [`launch`] does this for a job that
//! `lazarus::run` started on the mpi backend, [`mpirun`] for any command
//! (`lazarus mpirun -- mpiexec -n 4 lazarus run ...`), as SCR's
//! `scr_srun` restarts a job from its checkpoints.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Instant;

use super::{JobOutcome, var};
use crate::driver::processes::EarlierCall;
use crate::{Error, Rank, Result};

/// Restarts a job gets before [`launch`] gives up (`lazarus mpirun
/// --max-restarts` chooses its own).
pub const DEFAULT_MAX_RESTARTS: u32 = 8;

/// The earlier attempts of a job, as the next attempt's rank 0 adds them
/// to its statistics (`RunSummary`'s failures, ranks killed and job
/// restarts count every attempt).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Attempts {
    /// Attempts that ended with a failure (each started the job again).
    pub restarts: u64,
    /// Ranks the fault plan killed in them.
    pub ranks_killed: u64,
    /// Their wall time, seconds.
    pub wall_s: f64,
}

impl Attempts {
    fn to_env(self) -> String {
        format!("{},{},{}", self.restarts, self.ranks_killed, self.wall_s)
    }

    /// What the environment says of the earlier attempts (none if unset).
    pub(crate) fn from_env() -> Attempts {
        let v = std::env::var(var::ATTEMPTS).unwrap_or_default();
        let mut it = v.split(',');
        let mut next = || it.next().unwrap_or_default();
        Attempts {
            restarts: next().parse().unwrap_or(0),
            ranks_killed: next().parse().unwrap_or(0),
            wall_s: next().parse().unwrap_or(0.0),
        }
    }

    /// Add them to the statistics of the attempt that completed.
    pub(crate) fn add_to(self, stats: &mut crate::JobStats) {
        stats.job_restarts += self.restarts;
        stats.failures += self.restarts;
        stats.ranks_killed += self.ranks_killed;
        stats.wall_s += self.wall_s;
    }
}

/// The kills a rank wrote down in `path`: specification index and victims.
fn fired_kills(path: &Path) -> Vec<(usize, Vec<Rank>)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (i, v) = l.split_once(' ')?;
            let victims = v.split(',').filter_map(|r| r.parse().ok()).collect();
            Some((i.parse().ok()?, victims))
        })
        .collect()
}

/// The `mpiexec` to run: `LAZARUS_MPIEXEC` (split at white space), else
/// `mpiexec`, with the options Open MPI needs to run as many ranks as
/// asked on one machine (`--oversubscribe`) and, as root,
/// `--allow-run-as-root` (MPICH's Hydra needs neither); a `ulfm` build asks
/// Open MPI for its fault tolerance (`--with-ft ulfm`): ranks survive the
/// death of others in place.
pub fn mpiexec() -> Vec<OsString> {
    if let Some(v) = std::env::var_os(var::MPIEXEC) {
        return v
            .to_string_lossy()
            .split_whitespace()
            .map(OsString::from)
            .collect();
    }
    static OPEN_MPI: OnceLock<bool> = OnceLock::new();
    let open_mpi = *OPEN_MPI.get_or_init(|| {
        Command::new("mpiexec")
            .arg("--version")
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .is_ok_and(|o| {
                let s = String::from_utf8_lossy(&o.stdout);
                s.contains("Open MPI") || s.contains("OpenRTE")
            })
    });
    let mut cmd = vec![OsString::from("mpiexec")];
    if open_mpi {
        cmd.push("--oversubscribe".into());
        if cfg!(feature = "ulfm") {
            cmd.extend(["--with-ft".into(), "ulfm".into()]);
        }
        if nix::unistd::geteuid().is_root() {
            cmd.push("--allow-run-as-root".into());
        }
    }
    cmd
}

/// Run `command` until it completes, starting it again (at most
/// `max_restarts` times) while it ends because a rank the fault plan
/// killed died: each attempt gets the files and variables of this module.
/// `done` looks at an attempt that ended for another reason, and returns
/// its outcome.
fn attempts<R>(
    command: &[OsString],
    max_restarts: u32,
    dir: &Path,
    mut env: impl FnMut(&mut Command),
    mut done: impl FnMut(ExitStatus) -> Result<R>,
) -> Result<R> {
    let (program, args) = command
        .split_first()
        .ok_or_else(|| Error::config("command", "no command to run"))?;
    let fired_file = dir.join("fired");
    let mut earlier = Attempts::default();
    let mut skip: Vec<usize> = Vec::new();
    loop {
        let _ = std::fs::remove_file(&fired_file);
        let started = Instant::now();
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env(var::FIRED, &fired_file)
            .env(var::ATTEMPTS, earlier.to_env());
        if !skip.is_empty() {
            cmd.env(
                var::SKIP_KILLS,
                skip.iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(","),
            )
            .env(var::RESUME, "1");
        }
        env(&mut cmd);
        let status = cmd.status().map_err(|e| {
            Error::Driver(format!("cannot start {}: {e}", program.to_string_lossy()))
        })?;
        let fired = fired_kills(&fired_file);
        if fired.is_empty() || status.success() {
            return done(status);
        }
        let victims: Vec<Rank> = fired.iter().flat_map(|(_, v)| v.clone()).collect();
        if earlier.restarts >= u64::from(max_restarts) {
            return Err(Error::Driver(format!(
                "the MPI job ended when rank(s) {} died, after {} restart(s): no restart left",
                crate::error::list(&victims),
                earlier.restarts
            )));
        }
        tracing::warn!(
            "lazarus: rank(s) {} killed by the fault plan ended the MPI job ({status}); \
             starting it again from its newest checkpoint on disk",
            crate::error::list(&victims)
        );
        earlier.restarts += 1;
        earlier.ranks_killed += victims.len() as u64;
        earlier.wall_s += started.elapsed().as_secs_f64();
        skip.extend(fired.iter().map(|(i, _)| *i));
    }
}

/// A private directory for one job's files.
fn job_dir() -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("lazarus-mpi-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| Error::Driver(format!("cannot create {}: {e}", dir.display())))?;
    Ok(dir)
}

use std::os::unix::fs::DirBuilderExt;

/// How [`launch`] starts this program's ranks.
pub(crate) struct LaunchSpec {
    /// This program, and the arguments that make its `run` call the rank.
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub ranks: usize,
    /// The protocol of this call (imposed on the ranks).
    pub protocol: String,
    /// The settings that go with it (imposed too: a rank of `lazarus
    /// bench` runs the program's call made for the first protocol
    /// compared).
    pub protocol_settings: crate::driver::processes::launcher::ProtocolSettings,
    /// The kills of this call, comma-separated (imposed on the ranks).
    pub kills: String,
    /// A test harness: which keyed call is the rank, and what the
    /// earlier ones returned.
    pub call: Option<usize>,
    pub earlier: Vec<EarlierCall>,
    /// Keep the ranks' standard output off ours (a test harness prints
    /// its own lines in each rank).
    pub quiet_stdout: bool,
}

/// Start `mpiexec -n RANKS` on this program and return what its rank 0
/// reported: every rank's encoded value and the job's statistics.
pub(crate) fn launch(spec: &LaunchSpec) -> JobOutcome {
    let dir = match job_dir() {
        Ok(d) => d,
        Err(e) => return (Err(e), crate::JobStats::default()),
    };
    let out = launch_in(spec, &dir);
    let _ = std::fs::remove_dir_all(&dir);
    match out {
        Ok(o) => o,
        Err(e) => (Err(e), crate::JobStats::default()),
    }
}

fn launch_in(spec: &LaunchSpec, dir: &Path) -> Result<JobOutcome> {
    let report = dir.join("report");
    let earlier = dir.join("earlier");
    if spec.call.is_some() {
        std::fs::write(&earlier, postcard::to_allocvec(&spec.earlier)?)
            .map_err(|e| Error::Driver(format!("cannot write {}: {e}", earlier.display())))?;
    }
    let mut command = mpiexec();
    command.extend(["-n".into(), spec.ranks.to_string().into()]);
    command.push(spec.program.clone().into());
    command.extend(spec.args.iter().cloned());
    attempts(
        &command,
        DEFAULT_MAX_RESTARTS,
        dir,
        |cmd| {
            let _ = std::fs::remove_file(&report);
            // The launching process, as the processes backend names it to
            // its ranks (a test harness's ranks name its files by it).
            cmd.env(var::JOB, "1")
                .env("LAZARUS_LAUNCHER_PID", std::process::id().to_string())
                .env(var::REPORT, &report)
                .env(var::PROTOCOL, &spec.protocol)
                .envs(spec.protocol_settings.to_env())
                .env(var::KILLS, &spec.kills);
            if let Some(k) = spec.call {
                cmd.env(var::CALL, k.to_string())
                    .env(var::EARLIER, &earlier);
            }
            if spec.quiet_stdout {
                cmd.stdout(Stdio::null());
            }
        },
        |status| match std::fs::read(&report) {
            Ok(b) => Ok(postcard::from_bytes::<JobOutcome>(&b)?),
            Err(_) => Err(Error::Driver(format!(
                "the MPI job ended ({status}) without a report from rank 0 (its ranks' \
                 errors are above)"
            ))),
        },
    )
}

/// `lazarus mpirun`: run `command` (an `mpiexec` or `srun` of a Lazarus
/// program on the mpi backend), and run it again from the newest
/// committed checkpoint while a rank's death ends it, at most
/// `max_restarts` times. Returns the last attempt's exit status.
pub fn mpirun(command: &[OsString], max_restarts: u32) -> Result<ExitStatus> {
    let dir = job_dir()?;
    let out = attempts(command, max_restarts, &dir, |_| {}, Ok);
    let _ = std::fs::remove_dir_all(&dir);
    out
}
