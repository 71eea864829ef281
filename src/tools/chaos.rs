//! `lazarus chaos`: seeded failure scenarios, on the simulator or on real
//! processes.
//!
//! For each seed, a scenario of one to three kills is drawn from the seed:
//! ranks or whole nodes, at a fraction of progress, at an iteration, during a
//! checkpoint, or during a recovery. The app runs with those kills, and the
//! case passes only if the run ends, verifies, and prints the same value as
//! the failure-free run on the same backend. A failing case is reported with
//! a one-line `lazarus run` command that runs it again.
//!
//! On the simulator (the default) the seed also fixes the schedule and the
//! network jitter, so that command replays the case exactly, and the
//! simulator detects a hang deterministically. On the processes backend the
//! kills are real `SIGKILL`s from the launcher and the timing is the
//! machine's: the command runs the same kills again, not the same
//! interleaving, and a case that outlives the wall-clock bound ends the sweep
//! (its processes go when this process exits, as a dead launcher's ranks do).

use std::sync::mpsc;
use std::time::{Duration, Instant};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::apps::{AppKind, AppParams, iterations, run_app};
use crate::driver::processes::net::Listen;
use crate::fault::{KillSpec, Moment, Victim};
use crate::protocol::ProtocolKind;
use crate::protocol::correlated::SetRule;
use crate::store::levels::LevelSpec;
use crate::{Backend, Config, Error, Rank, Result};

/// What a chaos sweep runs.
#[derive(Debug, Clone)]
pub struct ChaosPlan {
    /// The app.
    pub app: AppKind,
    /// Its parameters.
    pub params: AppParams,
    /// Ranks, nodes, checkpoint interval (the backend is `backend`; the
    /// protocol and the kills are set per case).
    pub base: Config,
    /// Where the cases run: [`Backend::Sim`] (seeded schedule, exact
    /// replay), [`Backend::Processes`] (real `SIGKILL`s) or
    /// [`Backend::Threads`].
    pub backend: Backend,
    /// Protocols to test.
    pub protocols: Vec<ProtocolKind>,
    /// First seed.
    pub from: u64,
    /// Number of seeds.
    pub seeds: u64,
    /// Wall-clock bound per case.
    pub bound: Duration,
    /// How kill schedules are drawn.
    pub schedules: Schedules,
}

/// How `lazarus chaos` draws a case's kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Schedules {
    /// One to three kills of ranks or nodes, at a fraction of progress, an
    /// iteration, a checkpoint, or a recovery ([`scenario`]).
    #[default]
    Mixed,
    /// Failures that cascade into recovery ([`cascade`]): a first kill,
    /// then kills during its recovery of its holders, of its replacement,
    /// of a set peer, at finalize, and of several nodes in a row.
    Cascade,
}

impl std::str::FromStr for Schedules {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "mixed" => Ok(Schedules::Mixed),
            "cascade" => Ok(Schedules::Cascade),
            _ => Err(Error::config(
                "schedules",
                format!("`{s}` is not one of mixed, cascade"),
            )),
        }
    }
}

/// The verdict on one case.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum Verdict {
    /// Verified, with the failure-free value.
    Pass,
    /// The right value, but a rank restarted from the beginning although
    /// a stored checkpoint of it had a holder alive
    /// (`JobStats::needless_restarts`), or the job restarted although no
    /// rank died together with every holder of its checkpoint.
    NeedlessRestart {
        /// What was restarted.
        detail: String,
    },
    /// Verified or not, the value differs.
    Mismatch {
        /// What the case printed.
        got: String,
    },
    /// The app's own check failed.
    NotVerified {
        /// Its explanation.
        detail: String,
    },
    /// The protocol declared the failures beyond what it can recover
    /// (`Error::Unrecoverable`: for example a rank lost together with every
    /// holder of its checkpoint under message logging), with a clear error.
    Unrecoverable {
        /// The error.
        error: String,
    },
    /// The job ended with an error (a hang detected by the simulator, a
    /// panic, any other failure).
    Failed {
        /// The error.
        error: String,
    },
    /// The case did not finish within the wall-clock bound (on a real
    /// backend, the sweep stops there).
    Timeout,
}

/// What a user reads (the JSON keeps the variant's name and fields).
impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Pass => f.write_str("pass"),
            Verdict::NeedlessRestart { detail } => write!(f, "needless restart: {detail}"),
            Verdict::Mismatch { got } => write!(f, "wrong value: {got}"),
            Verdict::NotVerified { detail } => write!(f, "not verified: {detail}"),
            Verdict::Unrecoverable { error } => write!(f, "unrecoverable: {error}"),
            Verdict::Failed { error } => write!(f, "failed: {error}"),
            Verdict::Timeout => f.write_str("timed out"),
        }
    }
}

/// One case of the sweep.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosCase {
    /// Seed (of the scenario, the schedule and the network).
    pub seed: u64,
    /// Protocol.
    pub protocol: String,
    /// The kills drawn.
    pub kills: Vec<String>,
    /// Verdict.
    pub verdict: Verdict,
    /// Failure events that happened.
    pub failures: u64,
    /// Times the job started again from the beginning because a rank died
    /// together with every holder of its checkpoint (a restart the case
    /// judged necessary; a needless one fails the case).
    pub job_restarts: u64,
    /// The simulator's trace hash (empty on other backends).
    pub trace_hash: String,
    /// Wall time of the case, seconds.
    pub wall_s: f64,
    /// The command that runs this case again (exactly, on the simulator).
    pub reproduce: String,
    /// The case's timeline, when the sweep records them (`Config::trace`
    /// of the plan's base): kept for the first failing case only, whose
    /// timeline is what a user looks at (a case that timed out has none:
    /// its job never returned).
    #[serde(skip)]
    pub trace: Option<crate::trace::Trace>,
}

/// The whole sweep.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosReport {
    /// App name.
    pub app: String,
    /// The failure-free value every case must print.
    pub expected: String,
    /// Cases run.
    pub cases: usize,
    /// Cases that did not pass (including the declared unrecoverable ones).
    pub failed: usize,
    /// Of those, cases the protocol declared unrecoverable.
    pub unrecoverable: usize,
    /// Of those, cases that ran out of time or hung (the simulator's hang
    /// verdict is a `Failed` naming it).
    pub hangs: usize,
    /// Passing cases in which the job started again from the beginning,
    /// necessarily (every holder of a rank's checkpoint died).
    pub necessary_restarts: usize,
    /// Wall time of the sweep, seconds.
    pub wall_s: f64,
    /// The failing cases.
    pub failures: Vec<ChaosCase>,
}

/// The kills of the scenario of `seed` for this job.
pub fn scenario(seed: u64, base: &Config, iterations: u64) -> Vec<KillSpec> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xc4a0_5eed);
    let n = rng.random_range(1..=3u32);
    let mut kills = Vec::new();
    for i in 0..n {
        let victim = if base.nodes > 1 && rng.random_range(0..10) < 3 {
            Victim::Node(rng.random_range(0..base.nodes))
        } else {
            Victim::Rank(rng.random_range(0..base.ranks))
        };
        let roll = rng.random_range(0..10);
        let moment = if i > 0 && roll < 4 {
            Moment::Recovery(rng.random_range(1..=u64::from(i)))
        } else if roll < 7 || iterations < 2 {
            Moment::Progress(f64::from(rng.random_range(2..98u32)))
        } else if roll < 9 {
            Moment::Checkpoint(rng.random_range(1..=3))
        } else {
            Moment::Iteration(rng.random_range(0..iterations))
        };
        kills.push(KillSpec { victim, moment });
    }
    kills
}

/// The kills of the cascade scenario of `seed` (see
/// [`Schedules::Cascade`]): a first kill of a rank or a node while the job
/// computes, then one to three kills each aimed at a moment where an
/// earlier failure is still being recovered from: a holder of the first
/// victim's checkpoint, the replacement itself, a rank of its node (a set
/// peer under `correlated`), another node, or a rank entering finalize.
pub fn cascade(seed: u64, base: &Config, iterations: u64) -> Vec<KillSpec> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xca5c_ade5);
    let Ok(pl) = base.placement() else {
        return scenario(seed, base, iterations);
    };
    let first_rank = rng.random_range(0..base.ranks);
    let first = if base.nodes > 1 && rng.random_range(0..10) < 3 {
        Victim::Node(pl.node_of(first_rank))
    } else {
        Victim::Rank(first_rank)
    };
    let moment = if iterations >= 2 && rng.random_range(0..10) < 2 {
        Moment::Checkpoint(rng.random_range(1..=2))
    } else {
        Moment::Progress(f64::from(rng.random_range(5..95u32)))
    };
    let mut kills = vec![KillSpec {
        victim: first,
        moment,
    }];
    let more = rng.random_range(1..=3u32);
    for i in 1..=u64::from(more) {
        let during = Moment::Recovery(rng.random_range(1..=i));
        let holders: Vec<Rank> = pl
            .partner(first_rank)
            .into_iter()
            .chain(pl.second_partner(first_rank))
            .collect();
        let peers: Vec<Rank> = (0..base.ranks)
            .filter(|&r| r != first_rank && pl.node_of(r) == pl.node_of(first_rank))
            .collect();
        let (victim, moment) = match rng.random_range(0..6) {
            0 if !holders.is_empty() => (
                Victim::Rank(holders[rng.random_range(0..holders.len())]),
                during,
            ),
            1 => (Victim::Rank(first_rank), during),
            2 if !peers.is_empty() => (
                Victim::Rank(peers[rng.random_range(0..peers.len())]),
                during,
            ),
            3 if base.nodes > 1 => (Victim::Node(rng.random_range(0..base.nodes)), during),
            4 => (
                Victim::Rank(rng.random_range(0..base.ranks)),
                Moment::Finalize,
            ),
            _ => (Victim::Rank(rng.random_range(0..base.ranks)), during),
        };
        kills.push(KillSpec { victim, moment });
    }
    kills
}

/// Whether some rank died together with every holder of its checkpoint
/// (its partner and second partner, 004 §2.2) in `fired`: only then may a
/// logging protocol start the job again from the beginning.
fn holders_lost(cfg: &Config, fired: &[KillSpec]) -> bool {
    let Ok(pl) = cfg.placement() else {
        return false;
    };
    let mut dead = std::collections::BTreeSet::new();
    for k in fired {
        match k.victim {
            Victim::Rank(r) => {
                dead.insert(r);
            }
            Victim::Node(n) => dead.extend((0..cfg.ranks).filter(|&r| pl.node_of(r) == n)),
        }
    }
    dead.iter().any(|&r| {
        let holders: Vec<Rank> = pl
            .partner(r)
            .into_iter()
            .chain(pl.second_partner(r))
            .collect();
        !holders.is_empty() && holders.iter().all(|h| dead.contains(h))
    })
}

/// The `lazarus run` command that replays a case.
pub fn reproduce_command(app: AppKind, params: &AppParams, cfg: &Config) -> String {
    let mut c = format!("lazarus run {}", app.name());
    if let Some(class) = params.class {
        c += &format!(" --class {class}");
    }
    if let Some(size) = params.size {
        c += &format!(" --size {size}");
    }
    if let Some(it) = params.iterations {
        c += &format!(" --iterations {it}");
    }
    if let Some(k) = params.imbalance {
        c += &format!(" --imbalance {k}");
    }
    if let Some(t) = params.transpose {
        c += &format!(" --transpose {t}");
    }
    c += &format!(
        " --ranks {} --nodes {} --backend {} --protocol {} --checkpoint-every {} --seed {}",
        cfg.ranks, cfg.nodes, cfg.backend, cfg.protocol, cfg.checkpoint_every, cfg.seed
    );
    if cfg.backend == Backend::Processes && cfg.listen != Listen::default() {
        c += &format!(" --listen {}", cfg.listen);
    }
    // The default storage (partner alone) needs no flag.
    if cfg.storage != [LevelSpec::Partner] {
        for l in &cfg.storage {
            c += &format!(" --storage {l}");
        }
    }
    if let Some(b) = cfg.log_budget {
        c += &format!(" --log-budget {b}");
    }
    if cfg.checkpoint_scheme != Default::default() {
        c += &format!(" --checkpoint-scheme {}", cfg.checkpoint_scheme.name());
    }
    if let SetRule::Consecutive(n) = cfg.sets {
        c += &format!(" --sets {n}");
    }
    for k in &cfg.kills {
        c += &format!(" --kill {k}");
    }
    c
}

/// Run one case with a wall-clock bound.
fn run_case(
    app: AppKind,
    params: &AppParams,
    cfg: &Config,
    expected: &str,
    bound: Duration,
) -> ChaosCase {
    let t0 = Instant::now();
    let (tx, rx) = mpsc::channel();
    {
        let (params, cfg) = (params.clone(), cfg.clone());
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                run_app(app, &params, &cfg)
            }));
            let _ = tx.send(r);
        });
    }
    let mut case = ChaosCase {
        seed: cfg.seed,
        protocol: cfg.protocol.name().into(),
        kills: cfg.kills.iter().map(|k| k.to_string()).collect(),
        verdict: Verdict::Timeout,
        failures: 0,
        job_restarts: 0,
        trace_hash: String::new(),
        wall_s: 0.0,
        reproduce: reproduce_command(app, params, cfg),
        trace: None,
    };
    case.verdict = match rx.recv_timeout(bound) {
        Err(_) => Verdict::Timeout,
        Ok(Err(_)) => Verdict::Failed {
            error: "the runtime panicked outside any rank".into(),
        },
        Ok(Ok(mut run)) => {
            case.trace = run.stats.trace.take();
            case.failures = run.stats.failures;
            case.job_restarts = run.stats.job_restarts;
            // The kills that fired: each unfired one takes out one kill
            // of the same spelling (a schedule may name one twice).
            let mut unfired = run.stats.unfired_kills.clone();
            let fired: Vec<KillSpec> = (cfg.kills.iter())
                .filter(|k| {
                    let s = k.to_string();
                    match unfired.iter().position(|u| *u == s) {
                        Some(i) => {
                            unfired.swap_remove(i);
                            false
                        }
                        None => true,
                    }
                })
                .copied()
                .collect();
            let needless = if run.stats.needless_restarts > 0 {
                Some(format!(
                    "{} rank(s) restarted from the beginning with a stored checkpoint whose \
                     holder was alive",
                    run.stats.needless_restarts
                ))
            } else if run.stats.job_restarts > run.stats.access_fallbacks
                && cfg.protocol.logs_messages()
                && !holders_lost(cfg, &fired)
            {
                // `rma` falls back on purpose when an N or M flag says a
                // replay is unsafe (003 §3.2.3, §4.2): those restarts are
                // the protocol's, not needless.
                Some(format!(
                    "the job started again from the beginning {} time(s) ({} by an access \
                     log's N or M flag), yet no rank died with every holder of its checkpoint",
                    run.stats.job_restarts, run.stats.access_fallbacks
                ))
            } else {
                None
            };
            case.trace_hash = run
                .sim
                .map(|s| format!("{:016x}", s.trace_hash))
                .unwrap_or_default();
            match run.outcome {
                Err(e @ Error::Unrecoverable(_)) => Verdict::Unrecoverable {
                    error: e.to_string(),
                },
                Err(e) => Verdict::Failed {
                    error: e.to_string(),
                },
                Ok(v) if v.value != expected => Verdict::Mismatch { got: v.value },
                Ok(v) if !v.verified => Verdict::NotVerified { detail: v.detail },
                Ok(_) => match needless {
                    Some(detail) => Verdict::NeedlessRestart { detail },
                    None => Verdict::Pass,
                },
            }
        }
    };
    case.wall_s = t0.elapsed().as_secs_f64();
    if case.verdict == Verdict::Pass {
        case.trace = None;
    }
    case
}

/// What [`chaos`] tells its caller as it goes (a progress display).
#[derive(Debug)]
pub enum ChaosEvent<'a> {
    /// Case `case` (counted from 0) of the sweep's `of` starts.
    Start {
        /// Cases done so far.
        case: usize,
        /// Cases in all (fewer run when a hung case stops the sweep).
        of: usize,
        /// Its protocol.
        protocol: ProtocolKind,
        /// Its seed.
        seed: u64,
    },
    /// A case ended.
    Done(&'a ChaosCase),
}

/// Run the sweep; `on_event` sees every case start and end.
pub fn chaos(plan: &ChaosPlan, mut on_event: impl FnMut(ChaosEvent<'_>)) -> Result<ChaosReport> {
    if plan.seeds == 0 {
        return Err(Error::config("seeds", "at least one seed"));
    }
    let t0 = Instant::now();
    let n = iterations(plan.app, &plan.params)?;
    let base = Config {
        backend: plan.backend,
        iterations: Some(n),
        progress_bar: false,
        ..plan.base.clone()
    };
    // The base as the failure-free reference runs it (`--sets` belongs to
    // `correlated` alone), then as each protocol does.
    base.clone().compared_under(ProtocolKind::None).validate()?;
    // A protocol that cannot run this configuration (say, `correlated` with
    // an erasure level) is a usage error, not a failure of every case.
    for &protocol in &plan.protocols {
        base.clone().compared_under(protocol).validate()?;
    }
    let reference = run_app(
        plan.app,
        &plan.params,
        &base.clone().compared_under(ProtocolKind::None),
    );
    let expected = match reference.outcome {
        Ok(v) if v.verified => v.value,
        Ok(v) => {
            return Err(Error::app(format!(
                "the failure-free run does not verify: {}",
                v.detail
            )));
        }
        Err(e) => return Err(Error::app(format!("the failure-free run failed: {e}"))),
    };
    let mut failures = Vec::new();
    let mut cases = 0;
    let mut necessary_restarts = 0;
    'sweep: for seed in plan.from..plan.from + plan.seeds {
        for &protocol in &plan.protocols {
            let mut cfg = base.clone().compared_under(protocol).seed(seed);
            cfg.kills = match plan.schedules {
                Schedules::Mixed => scenario(seed, &cfg, n),
                Schedules::Cascade => cascade(seed, &cfg, n),
            };
            on_event(ChaosEvent::Start {
                case: cases,
                of: usize::try_from(plan.seeds)
                    .unwrap_or(usize::MAX)
                    .saturating_mul(plan.protocols.len()),
                protocol,
                seed,
            });
            let case = run_case(plan.app, &plan.params, &cfg, &expected, plan.bound);
            cases += 1;
            on_event(ChaosEvent::Done(&case));
            // A hung job on a real backend still holds its processes and
            // cores: nothing after it would be measured fairly.
            let stop = case.verdict == Verdict::Timeout && base.backend != Backend::Sim;
            if case.verdict == Verdict::Pass && case.job_restarts > 0 {
                necessary_restarts += 1;
            }
            if case.verdict != Verdict::Pass {
                failures.push(case);
            }
            // Timelines are large: only the first failing case that has
            // one keeps it.
            if failures.iter().filter(|c| c.trace.is_some()).count() > 1
                && let Some(last) = failures.last_mut()
            {
                last.trace = None;
            }
            if stop {
                break 'sweep;
            }
        }
    }
    Ok(ChaosReport {
        app: plan.app.name().into(),
        expected,
        cases,
        failed: failures.len(),
        unrecoverable: failures
            .iter()
            .filter(|c| matches!(c.verdict, Verdict::Unrecoverable { .. }))
            .count(),
        hangs: failures
            .iter()
            .filter(|c| match &c.verdict {
                Verdict::Timeout => true,
                Verdict::Failed { error } => error.contains("hang"),
                _ => false,
            })
            .count(),
        necessary_restarts,
        wall_s: t0.elapsed().as_secs_f64(),
        failures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenarios_are_seeded_and_valid() {
        let cfg = Config::new(6).nodes(3);
        let pl = cfg.placement().expect("valid");
        for seed in 0..200 {
            let a = scenario(seed, &cfg, 15);
            assert_eq!(a, scenario(seed, &cfg, 15));
            assert!((1..=3).contains(&a.len()));
            for k in &a {
                k.validate(&pl, 15).expect("scenario kills are valid");
            }
        }
        assert_ne!(scenario(1, &cfg, 15), scenario(2, &cfg, 15));
    }

    #[test]
    fn a_protocol_that_cannot_take_the_storage_is_refused_before_any_case() {
        let mut base = Config::new(8).nodes(4);
        base.storage = vec![LevelSpec::Rs {
            parity: 2,
            every: 1,
        }];
        let plan = ChaosPlan {
            app: AppKind::Stencil,
            params: AppParams {
                class: Some('S'),
                ..AppParams::default()
            },
            base,
            backend: Backend::Sim,
            protocols: vec![ProtocolKind::Coordinated, ProtocolKind::Correlated],
            from: 1,
            seeds: 3,
            bound: Duration::from_secs(60),
            schedules: Schedules::Mixed,
        };
        let mut seen = 0;
        let r = chaos(&plan, |_| seen += 1);
        // Not even a case's start.
        assert!(
            matches!(&r, Err(Error::Config { option, .. }) if option == "storage"),
            "{r:?}"
        );
        assert_eq!(seen, 0, "no case runs");
    }

    #[test]
    fn reproduce_command_parses_back() {
        let cfg = Config::new(4)
            .nodes(2)
            .protocol(ProtocolKind::Coordinated)
            .seed(9)
            .kill("node:1@recovery:1".parse().expect("spec"));
        let params = AppParams {
            class: Some('S'),
            ..AppParams::default()
        };
        let c = reproduce_command(AppKind::Cg, &params, &cfg);
        assert_eq!(
            c,
            "lazarus run cg --class S --ranks 4 --nodes 2 --backend threads --protocol coordinated \
             --checkpoint-every 1 --seed 9 --kill node:1@recovery:1"
        );
        // What a logging or storage sweep sets is in the command too.
        let mut cfg = Config::new(8)
            .nodes(4)
            .protocol(ProtocolKind::Correlated)
            .backend(Backend::Processes)
            .seed(3)
            .kill("2@40%".parse().expect("spec"));
        cfg.listen = "tcp".parse().expect("listen");
        cfg.storage = vec![LevelSpec::Rs {
            parity: 2,
            every: 1,
        }];
        cfg.log_budget = Some(342_080);
        cfg.sets = SetRule::Consecutive(2);
        let c = reproduce_command(AppKind::Cg, &params, &cfg);
        assert_eq!(
            c,
            format!(
                "lazarus run cg --class S --ranks 8 --nodes 4 --backend processes --protocol \
                 correlated --checkpoint-every 1 --seed 3 --listen {} --storage rs:2@1 \
                 --log-budget 342080 --sets 2 --kill 2@40%",
                cfg.listen
            )
        );
    }
}
