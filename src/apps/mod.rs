//! The applications shipped with Lazarus. They are the test oracles and the
//! benchmarks: each ends with a verification value that must be bit-identical
//! under every protocol, failure schedule and backend.
//!
//! | app | workload | verification |
//! | --- | --- | --- |
//! | [`stencil`] | 2-D 5-point Jacobi, halo exchange (001) | checksum equal to a one-rank computation |
//! | [`cg`] | NAS CG, classes S, W, A (002) | NPB's published zeta within NPB's tolerance |
//! | [`ft`] | NAS FT, classes S, W, A, B: 3-D FFTs in pencils, transposes by puts or all-to-all (003 §7) | NPB's published checksum of every time step within NPB's tolerance |
//! | [`dht`] | distributed hash table over RMA atomics (003 §7.2.2) | every key found once with its value |
//! | [`pingpong`] | latency and bandwidth, 1 B to 4 MiB (004 §4.2) | payloads sent and forwarded intact |

pub mod cg;
pub mod dht;
pub mod ft;
pub mod patterns;
pub mod pingpong;
pub mod stencil;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::{Config, Ctx, Error, JobStats, Result};

/// What rank 0 of an app reports at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Verification {
    /// The verification value, printed after `VERIFIED` (full precision: it is
    /// compared as a string across runs).
    pub value: String,
    /// Whether it passed the app's own check.
    pub verified: bool,
    /// Why not, when it did not (or details when it did).
    pub detail: String,
    /// App-specific measurements (pingpong latencies, for instance).
    #[serde(with = "json_value")]
    pub metrics: serde_json::Value,
}

/// A JSON value as itself in JSON, and as JSON text in binary formats
/// (postcard cannot carry a self-describing value), so a verification can
/// cross from a rank process to the launcher.
mod json_value {
    use serde::{Deserialize, Deserializer, Serialize, Serializer, de::Error as _};

    pub fn serialize<S: Serializer>(v: &serde_json::Value, s: S) -> Result<S::Ok, S::Error> {
        if s.is_human_readable() {
            v.serialize(s)
        } else {
            v.to_string().serialize(s)
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<serde_json::Value, D::Error> {
        if d.is_human_readable() {
            serde_json::Value::deserialize(d)
        } else {
            let text = String::deserialize(d)?;
            serde_json::from_str(&text).map_err(D::Error::custom)
        }
    }
}

/// The shipped applications.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum AppKind {
    /// 2-D Jacobi stencil.
    Stencil,
    /// NAS CG.
    Cg,
    /// NAS FT.
    Ft,
    /// Distributed hash table over RMA.
    Dht,
    /// Ping-pong latency/bandwidth.
    Pingpong,
}

impl AppKind {
    /// All apps.
    pub const ALL: [AppKind; 5] = [
        AppKind::Stencil,
        AppKind::Cg,
        AppKind::Ft,
        AppKind::Dht,
        AppKind::Pingpong,
    ];

    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            AppKind::Stencil => "stencil",
            AppKind::Cg => "cg",
            AppKind::Ft => "ft",
            AppKind::Dht => "dht",
            AppKind::Pingpong => "pingpong",
        }
    }
}

impl fmt::Display for AppKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for AppKind {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        AppKind::ALL
            .into_iter()
            .find(|a| a.name() == s)
            .ok_or_else(|| {
                Error::config(
                    "APP",
                    format!("unknown app `{s}` (known: stencil, cg, ft, dht, pingpong)"),
                )
            })
    }
}

/// Size parameters common to the apps (each uses what applies to it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AppParams {
    /// Problem class (CG: S, W, A; dht: S, W, A sizes).
    pub class: Option<char>,
    /// Problem size (stencil: grid side; dht: keys per rank).
    pub size: Option<usize>,
    /// Iterations (stencil: sweeps; dht: insert batches; pingpong: repetitions).
    pub iterations: Option<u64>,
    /// Stencil: load imbalance. Odd ranks sweep their block this many
    /// times per iteration (the extra sweeps' results are discarded), so
    /// ranks reach safe points at different times. `None` or 1: balanced.
    pub imbalance: Option<u32>,
    /// FT: how transposes move data (`--transpose put|alltoall`).
    pub transpose: Option<ft::Exchange>,
}

/// The result of running an app.
#[derive(Debug)]
pub struct AppRun {
    /// Rank 0's verification, or the job's error.
    pub outcome: Result<Verification>,
    /// Job statistics.
    pub stats: JobStats,
    /// Safe points (iterations) of the run.
    pub iterations: u64,
    /// The simulator's report (backend `sim`).
    pub sim: Option<crate::driver::sim::SimReport>,
}

/// Number of safe points an app will pass with these parameters (validates
/// `--kill R@iI` and `--checkpoint-every`).
pub fn iterations(app: AppKind, p: &AppParams) -> Result<u64> {
    if app != AppKind::Stencil && p.imbalance.is_some() {
        return Err(Error::config(
            "imbalance",
            format!("only the stencil has a load imbalance, not {app}"),
        ));
    }
    if app != AppKind::Ft && p.transpose.is_some() {
        return Err(Error::config(
            "transpose",
            format!("only ft has transposes, not {app}"),
        ));
    }
    match app {
        AppKind::Stencil => Ok(stencil::Params::from_app(p)?.iterations),
        AppKind::Cg => Ok(cg::Params::from_app(p)?.niter),
        AppKind::Ft => Ok(ft::Params::from_app(p)?.niter),
        AppKind::Dht => Ok(dht::Params::from_app(p)?.batches),
        AppKind::Pingpong => Ok(pingpong::Params::from_app(p)?.sizes().len() as u64),
    }
}

/// `app` with the parameters that shape its checkpointed state (the
/// problem, not how long it runs): what a checkpoint directory records
/// (`Config::program`) so that a restart of another problem is refused.
pub fn program(app: AppKind, p: &AppParams) -> Result<String> {
    Ok(match app {
        AppKind::Stencil => format!("stencil grid {}", stencil::Params::from_app(p)?.n),
        AppKind::Cg => format!("cg class {}", cg::Params::from_app(p)?.class.class),
        // The transpose changes the window (so the checkpointed state).
        AppKind::Ft => {
            let f = ft::Params::from_app(p)?;
            format!("ft class {} transpose {}", f.class.class, f.exchange)
        }
        AppKind::Dht => {
            let d = dht::Params::from_app(p)?;
            format!(
                "dht {} keys per rank in {} slots",
                d.keys_per_rank, d.table_slots
            )
        }
        AppKind::Pingpong => format!(
            "pingpong messages up to {} bytes",
            pingpong::Params::from_app(p)?.max_bytes
        ),
    })
}

/// Run `app` under `cfg` (its `iterations` and `program` are filled in
/// here).
pub fn run_app(app: AppKind, p: &AppParams, cfg: &Config) -> AppRun {
    let iterations = match self::iterations(app, p) {
        Ok(n) => n,
        Err(e) => {
            return AppRun {
                outcome: Err(e),
                stats: JobStats::default(),
                iterations: 0,
                sim: None,
            };
        }
    };
    let mut cfg = cfg.clone();
    cfg.iterations = Some(iterations);
    match program(app, p) {
        Ok(name) => cfg.program = Some(name),
        Err(e) => return failed(e),
    }
    let report = match app {
        AppKind::Stencil => match stencil::Params::from_app(p) {
            Ok(params) => crate::run(&cfg, move |ctx| stencil::rank_main(ctx, &params)),
            Err(e) => return failed(e),
        },
        AppKind::Cg => match cg::Params::from_app(p) {
            Ok(params) => {
                // Ranks sharing a process share the whole matrix, made
                // before the clock starts. A rank process makes its own
                // block of rows (as NPB's MPI CG does), kept for the next
                // call of the rank function (a coordinated rollback), and
                // the launcher makes none. Blocks are kept by their rows:
                // a processes-backend job can also run its ranks as
                // threads of one process (`processes::Role::Earlier`).
                let whole =
                    (!matches!(cfg.backend, crate::Backend::Processes | crate::Backend::Mpi))
                        .then(|| std::sync::Arc::new(cg::npb::makea(&params.class)));
                let blocks = std::sync::Mutex::new(Vec::<std::sync::Arc<cg::npb::Csr>>::new());
                crate::run(&cfg, move |ctx| {
                    if let Some(a) = &whole {
                        return cg::rank_main(ctx, &params, a);
                    }
                    let world = ctx.world();
                    let (lo, hi) = cg::block(params.class.na, world.rank(), world.size());
                    let a = {
                        let mut blocks = blocks.lock().unwrap_or_else(|e| e.into_inner());
                        match blocks.iter().find(|a| a.rows() == (lo..hi)) {
                            Some(a) => a.clone(),
                            None => {
                                let a =
                                    std::sync::Arc::new(cg::npb::makea_rows(&params.class, lo..hi));
                                blocks.push(a.clone());
                                a
                            }
                        }
                    };
                    cg::rank_main(ctx, &params, &a)
                })
            }
            Err(e) => return failed(e),
        },
        AppKind::Ft => match ft::Params::from_app(p) {
            Ok(params) => crate::run(&cfg, move |ctx| ft::rank_main(ctx, &params)),
            Err(e) => return failed(e),
        },
        AppKind::Dht => match dht::Params::from_app(p) {
            Ok(params) => crate::run(&cfg, move |ctx| dht::rank_main(ctx, &params)),
            Err(e) => return failed(e),
        },
        AppKind::Pingpong => match pingpong::Params::from_app(p) {
            Ok(params) => crate::run(&cfg, move |ctx| pingpong::rank_main(ctx, &params)),
            Err(e) => return failed(e),
        },
    };
    let outcome = report.outcome.and_then(|mut v| {
        if v.is_empty() {
            return Err(Error::app("no rank returned"));
        }
        Ok(v.swap_remove(0))
    });
    AppRun {
        outcome,
        stats: report.stats,
        iterations,
        sim: report.sim,
    }
}

fn failed(e: Error) -> AppRun {
    AppRun {
        outcome: Err(e),
        stats: JobStats::default(),
        iterations: 0,
        sim: None,
    }
}

/// Helper for apps: mark progress `done / total` and pass a safe point.
pub fn safe_point<S: Serialize>(ctx: &mut Ctx, state: &S, done: u64, total: u64) -> Result<()> {
    ctx.set_progress(done as f64 / total.max(1) as f64);
    ctx.checkpoint(state)
}
