//! Ranks on several hosts: one agent per host, started by Slurm's `srun`,
//! starts, kills and reports the rank processes of its host for the
//! launcher.
//!
//! With `--hosts slurm` the launcher runs `srun --nodes=K --ntasks=K
//! --ntasks-per-node=1 lazarus agent` inside the allocation. Each agent
//! learns its node number from `SLURM_NODEID` and its host name from
//! `SLURMD_NODENAME`, connects to the launcher over TCP and authenticates
//! with the job secret, which reaches it in the environment (`srun` passes
//! the launcher's environment on; the secret never appears on a command
//! line). Ranks are placed on nodes by the job's block placement, so a
//! failure domain is a host. The launcher stays the failure detector: ranks
//! keep their control connections and heartbeats to it; an agent only does
//! what needs a process on the rank's host (fork/exec, `SIGKILL`,
//! `waitpid`). An agent whose launcher connection ends kills its ranks and
//! exits (no orphans), and its ranks die with it (`PR_SET_PDEATHSIG`).
//!
//! The same machinery runs on one machine for tests: `LAZARUS_SRUN` names
//! the command used in place of `srun`. Agents run the `lazarus`
//! executable: the launcher's own when it is `lazarus`, else
//! `LAZARUS_AGENT_PROGRAM`, else `lazarus` on the `PATH`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::str::FromStr;
use std::time::Duration;

use crossbeam_channel::{RecvTimeoutError, unbounded};

use super::auth::{Identity, Role, Secret, handshake};
use super::net::{Addr, Stream};
use super::var;
use super::wire::{WireMsg, read_msg, write_msg};
use crate::{Error, Rank, Result};

/// Where rank processes run (`--hosts`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Hosts {
    /// Every rank on the launcher's host.
    #[default]
    Local,
    /// Node `n` of the placement is node `n` of the Slurm allocation; an
    /// agent per node started with `srun` starts its ranks.
    Slurm,
}

impl fmt::Display for Hosts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hosts::Local => "local",
            Hosts::Slurm => "slurm",
        })
    }
}

impl FromStr for Hosts {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "local" => Ok(Hosts::Local),
            "slurm" => Ok(Hosts::Slurm),
            _ => Err(Error::config(
                "hosts",
                format!("`{s}`: expected local or slurm"),
            )),
        }
    }
}

impl Hosts {
    /// The default: `slurm` inside a Slurm allocation of more than one
    /// node, else `local`.
    pub fn from_slurm_env() -> Hosts {
        let nodes = std::env::var("SLURM_NNODES")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok());
        match (std::env::var_os("SLURM_JOB_ID"), nodes) {
            (Some(_), Some(n)) if n > 1 => Hosts::Slurm,
            _ => Hosts::Local,
        }
    }

    /// Whether ranks placed this way can reach each other over `listen`:
    /// across hosts only TCP on an address the other nodes reach will do.
    pub fn check_listen(self, listen: super::net::Listen) -> Result<()> {
        if self == Hosts::Local {
            return Ok(());
        }
        match listen {
            super::net::Listen::Tcp(ip) if ip.is_unspecified() => Err(Error::config(
                "listen",
                format!("{ip} is no address the other nodes can reach: name one of this host's"),
            )),
            super::net::Listen::Tcp(_) => Ok(()),
            super::net::Listen::Unix { .. } => Err(Error::config(
                "listen",
                "ranks on several hosts talk over TCP: hosts `slurm` need `Config::listen` \
                 tcp:IP (an address of this host the other nodes reach)",
            )),
        }
    }
}

/// The `srun` command line that starts one agent on each of `nodes` nodes:
/// `LAZARUS_SRUN` (split at white space) or `srun`, then the placement
/// options, then `agent_program agent`.
pub(crate) fn srun_command(nodes: usize, agent_program: &Path) -> Result<Command> {
    let srun = std::env::var("LAZARUS_SRUN").unwrap_or_else(|_| "srun".into());
    let mut words = srun.split_whitespace();
    let first = words.next().ok_or_else(|| {
        Error::config("LAZARUS_SRUN", "empty: name the command that starts agents")
    })?;
    let mut cmd = Command::new(first);
    cmd.args(words)
        .arg(format!("--nodes={nodes}"))
        .arg(format!("--ntasks={nodes}"))
        .arg("--ntasks-per-node=1")
        .arg("--kill-on-bad-exit=0")
        .arg(agent_program)
        .arg("agent")
        .stdin(Stdio::null());
    Ok(cmd)
}

/// What an agent needs from its environment.
struct AgentEnv {
    job: u64,
    node: usize,
    host: String,
    launcher: Addr,
    secret: Secret,
    max_frame: usize,
}

fn env_var(name: &str) -> Result<String> {
    std::env::var(name).map_err(|_| {
        Error::Driver(format!(
            "agent: {name} is not set (agents are started by a launcher whose hosts are `slurm`)"
        ))
    })
}

impl AgentEnv {
    fn from_env() -> Result<AgentEnv> {
        let bad = |name: &str| Error::Driver(format!("agent: {name} is malformed"));
        let node = std::env::var(var::AGENT_NODE)
            .or_else(|_| env_var("SLURM_NODEID"))?
            .trim()
            .parse()
            .map_err(|_| bad("SLURM_NODEID"))?;
        let host = std::env::var("SLURMD_NODENAME")
            .ok()
            .or_else(|| {
                let h = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
                Some(h.trim().to_string())
            })
            .unwrap_or_else(|| format!("node{node}"));
        Ok(AgentEnv {
            job: u64::from_str_radix(&env_var(var::JOB)?, 16).map_err(|_| bad(var::JOB))?,
            node,
            host,
            launcher: env_var(var::AGENT_LAUNCHER)?.parse()?,
            secret: Secret::from_hex(&env_var(var::AGENT_SECRET)?)
                .ok_or_else(|| bad(var::AGENT_SECRET))?,
            max_frame: env_var(var::MAX_FRAME)?
                .parse()
                .map_err(|_| bad(var::MAX_FRAME))?,
        })
    }
}

/// The agent's private directory (mode 0700): the secret file and the
/// files the launcher hands over, for the ranks of this host.
struct PrivateDir(PathBuf);

impl PrivateDir {
    fn create(job: u64, node: usize) -> Result<PrivateDir> {
        use std::os::unix::fs::DirBuilderExt;
        let dir = std::env::temp_dir().join(format!("lazarus-{job:016x}-node{node}"));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::Driver(format!("agent: cannot create {}: {e}", dir.display())))?;
        Ok(PrivateDir(dir))
    }
}

impl Drop for PrivateDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `lazarus agent`: serve the launcher until it says the job is over (or
/// goes away). Returns an error when the agent cannot join the job.
pub fn run_agent() -> Result<()> {
    let env = AgentEnv::from_env()?;
    let node = env.node;
    let fail = |what: &str, e: &dyn fmt::Display| {
        Error::Driver(format!("agent on {} (node {node}): {what}: {e}", env.host))
    };
    // Ranks die with this process.
    #[cfg(target_os = "linux")]
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(|e| fail("PR_SET_PDEATHSIG", &e))?;
    let mut link = Stream::connect(&env.launcher).map_err(|e| {
        fail(
            &format!(
                "cannot reach the launcher at {} (with ranks on several hosts it must \
                 listen on a TCP address they reach: `Config::listen`)",
                env.launcher
            ),
            &e,
        )
    })?;
    let me = Identity {
        job: env.job,
        rank: Some(node),
        incarnation: 0,
    };
    handshake(&mut link, &env.secret, me, Role::Connector)
        .map_err(|e| fail("handshake with the launcher", &e))?;
    let dir = PrivateDir::create(env.job, node)?;
    let secret_file = dir.0.join("secret");
    env.secret
        .write_to(&secret_file)
        .map_err(|e| fail("cannot write the job secret", &e))?;
    // Ranks listen on the interface that reaches the launcher.
    let listen = link.local_ip().map(|ip| format!("tcp:{ip}"));
    let max = env.max_frame;
    write_msg(
        &mut link,
        &WireMsg::AgentHello {
            host: env.host.clone(),
            pid: std::process::id(),
        },
        max,
    )
    .map_err(|e| fail("cannot greet the launcher", &e))?;

    let (tx, rx) = unbounded();
    let mut rd = link
        .try_clone()
        .map_err(|e| fail("cannot clone the connection", &e))?;
    std::thread::Builder::new()
        .name("agent-link".into())
        .spawn(move || {
            loop {
                let m = read_msg(&mut rd, max).map_err(|e| e.to_string());
                let end = m.is_err();
                if tx.send(m).is_err() || end {
                    return;
                }
            }
        })
        .map_err(|e| fail("cannot start a thread", &e))?;

    let mut ranks = Ranks {
        children: BTreeMap::new(),
        overrides: vec![
            (var::DIR.to_string(), dir.0.display().to_string()),
            (
                var::SECRET_FILE.to_string(),
                secret_file.display().to_string(),
            ),
            (
                var::LAUNCHER_PID.to_string(),
                std::process::id().to_string(),
            ),
            (var::SHM_DIR.to_string(), String::new()),
        ],
    };
    if let Some(l) = listen {
        ranks.overrides.push((var::LISTEN.to_string(), l));
    }
    let outcome = loop {
        match rx.recv_timeout(Duration::from_millis(2)) {
            Ok(Ok(msg)) => match msg {
                WireMsg::AgentFile { var, name, bytes } => {
                    // Only plain names: the file stays in the directory.
                    if !super::plain_file_name(&name) {
                        break Err(fail("bad file name from the launcher", &name));
                    }
                    let path = dir.0.join(&name);
                    if let Err(e) = std::fs::write(&path, bytes) {
                        break Err(fail(&format!("cannot write {}", path.display()), &e));
                    }
                    ranks.overrides.push((var, path.display().to_string()));
                }
                WireMsg::Spawn {
                    rank,
                    incarnation,
                    program,
                    args,
                    env,
                    quiet_stdout,
                } => {
                    if let Err(e) =
                        ranks.spawn(rank, incarnation, &program, &args, &env, quiet_stdout)
                    {
                        let status = format!("cannot start: {e}");
                        let m = WireMsg::RankExited {
                            rank,
                            incarnation,
                            status,
                        };
                        if write_msg(&mut link, &m, max).is_err() {
                            break Ok(());
                        }
                    }
                }
                WireMsg::KillRanks { ranks: victims } => {
                    ranks.kill(&victims);
                    if write_msg(&mut link, &WireMsg::Killed { ranks: victims }, max).is_err() {
                        break Ok(());
                    }
                }
                WireMsg::Shutdown => break Ok(()),
                other => {
                    tracing::warn!(
                        node,
                        "lazarus agent (node {node}): unexpected message {other:?}"
                    );
                }
            },
            // The launcher is gone: so is the job.
            Ok(Err(_)) | Err(RecvTimeoutError::Disconnected) => break Ok(()),
            Err(RecvTimeoutError::Timeout) => {}
        }
        for (rank, incarnation, status) in ranks.reap() {
            let m = WireMsg::RankExited {
                rank,
                incarnation,
                status,
            };
            if write_msg(&mut link, &m, max).is_err() {
                break;
            }
        }
    };
    ranks.kill_all();
    link.shutdown();
    outcome
}

/// The rank processes of this host.
struct Ranks {
    children: BTreeMap<(Rank, u64), Child>,
    /// Variables that differ from the launcher's host.
    overrides: Vec<(String, String)>,
}

impl Ranks {
    fn spawn(
        &mut self,
        rank: Rank,
        incarnation: u64,
        program: &[u8],
        args: &[Vec<u8>],
        env: &[(String, String)],
        quiet_stdout: bool,
    ) -> std::io::Result<()> {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let mut cmd = Command::new(OsStr::from_bytes(program));
        cmd.args(args.iter().map(|a| OsStr::from_bytes(a)))
            .stdin(Stdio::null())
            .env_remove(var::AGENT_SECRET)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .envs(self.overrides.iter().map(|(k, v)| (k, v)));
        if quiet_stdout {
            cmd.stdout(Stdio::null());
        }
        let child = cmd.spawn()?;
        self.children.insert((rank, incarnation), child);
        Ok(())
    }

    /// Ranks that ended since the last call, with their exit status.
    fn reap(&mut self) -> Vec<(Rank, u64, String)> {
        let mut out = Vec::new();
        self.children.retain(|&(rank, inc), c| match c.try_wait() {
            Ok(Some(status)) => {
                out.push((rank, inc, status.to_string()));
                false
            }
            Ok(None) => true,
            Err(e) => {
                out.push((rank, inc, format!("cannot wait: {e}")));
                false
            }
        });
        out
    }

    /// Kill `victims` with `SIGKILL`, all first, back to back; then reap
    /// them.
    fn kill(&mut self, victims: &[(Rank, u64)]) {
        for v in victims {
            if let Some(c) = self.children.get_mut(v) {
                let _ = c.kill();
            }
        }
        for v in victims {
            if let Some(mut c) = self.children.remove(v) {
                let _ = c.wait();
            }
        }
    }

    fn kill_all(&mut self) {
        let all: Vec<(Rank, u64)> = self.children.keys().copied().collect();
        self.kill(&all);
    }
}
