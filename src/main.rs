//! The `lazarus` command line: run an app under a protocol with injected
//! failures, or benchmark protocols side by side.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use lazarus::apps::{AppKind, AppParams, iterations, run_app};
use lazarus::tools::bench::bench;
use lazarus::tools::summary::RunSummary;
use lazarus::{Backend, Config, KillSpec, ProtocolKind};

const RUN_EXAMPLES: &str = "Examples:
  lazarus run cg --class S --ranks 4
  lazarus run cg --class S --ranks 8 --protocol coordinated --kill 3@40%
  lazarus run cg --class W --ranks 4 --protocol coordinated --nodes 2 --kill node:1@30%
  lazarus run stencil --ranks 4 --protocol coordinated --kill 1@20% --kill 2@recovery
  lazarus run dht --ranks 4 --protocol coordinated --kill 2@i3 --json out.json

Kill specifications (repeatable):
  R@P%            rank R dies when the job is P% through
  R@iI            rank R dies during iteration I (after I safe points)
  node:K@P%       every rank of node K dies at once (also node:K@iI)
  R@recovery[:N]  rank R dies while the N-th recovery is in progress (default 1)

Exit status: 0 VERIFIED, 1 NOT VERIFIED (or the job failed), 2 bad usage.";

const BENCH_EXAMPLES: &str = "Examples:
  lazarus bench cg --class W --ranks 4 --protocols none,coordinated --reps 5 --json bench.json
  lazarus bench pingpong --ranks 2 --protocols none,coordinated --json pp.json";

/// Lazarus: parallel programs that survive failures.
#[derive(Parser, Debug)]
#[command(name = "lazarus", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a built-in app under a protocol, with injected failures.
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Run protocols alternately and report median wall times and ratios to `none`.
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(BenchArgs),
}

#[derive(Args, Debug, Clone)]
struct JobArgs {
    /// The app: stencil, cg, dht, pingpong.
    app: String,
    /// Problem class (cg: S, W, A, B; stencil and dht: S, W, A).
    #[arg(long)]
    class: Option<char>,
    /// Problem size (stencil: grid side; dht: keys per rank; pingpong: largest message in bytes).
    #[arg(long)]
    size: Option<usize>,
    /// Iterations (stencil: sweeps; dht: insert batches; pingpong: round trips per size).
    #[arg(long)]
    iterations: Option<u64>,
    /// Number of ranks.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Failure domains (nodes) ranks are placed on, in blocks.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// Backend: threads, sim.
    #[arg(long, default_value = "threads")]
    backend: String,
    /// Failure to inject (repeatable): R@P%, R@iI, node:K@P%, R@recovery[:N].
    #[arg(long = "kill", value_name = "SPEC")]
    kills: Vec<String>,
    /// Checkpoint every N safe points, or every P% of the run ("10%").
    #[arg(long, default_value = "10%")]
    checkpoint_every: String,
    /// Seed of the runtime's random choices (when kills land).
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Protocol: none, coordinated.
    #[arg(long, default_value = "none")]
    protocol: String,
    /// Write the JSON summary here.
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Comma-separated protocols.
    #[arg(long, default_value = "none,coordinated")]
    protocols: String,
    /// Runs per protocol.
    #[arg(long, default_value_t = 5)]
    reps: usize,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
}

/// A usage error: exit status 2.
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn usage(e: lazarus::Error) -> anyhow::Error {
    anyhow::Error::new(Usage(e.to_string()))
}

fn build(job: &JobArgs, protocol: ProtocolKind) -> anyhow::Result<(AppKind, AppParams, Config)> {
    let app: AppKind = job.app.parse().map_err(usage)?;
    let params = AppParams {
        class: job.class.map(|c| c.to_ascii_uppercase()),
        size: job.size,
        iterations: job.iterations,
    };
    let n = iterations(app, &params).map_err(usage)?;
    let every = match job.checkpoint_every.strip_suffix('%') {
        Some(p) => {
            let p: f64 = p.parse().ok().filter(|p: &f64| *p > 0.0 && *p <= 100.0).ok_or_else(|| {
                anyhow::Error::new(Usage(format!(
                    "invalid configuration `--checkpoint-every`: `{}` is not a percentage in (0, 100]",
                    job.checkpoint_every
                )))
            })?;
            ((n as f64 * p / 100.0).round() as u64).max(1)
        }
        None => job.checkpoint_every.parse().map_err(|_| {
            anyhow::Error::new(Usage(format!(
                "invalid configuration `--checkpoint-every`: `{}` is neither N nor P%",
                job.checkpoint_every
            )))
        })?,
    };
    let kills = job
        .kills
        .iter()
        .map(|k| k.parse::<KillSpec>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    let backend: Backend = job.backend.parse().map_err(usage)?;
    let cfg = Config {
        backend,
        protocol,
        ranks: job.ranks,
        nodes: job.nodes,
        kills,
        checkpoint_every: every,
        seed: job.seed,
        iterations: Some(n),
        progress_bar: std::io::stdout().is_terminal(),
        network: Default::default(),
    };
    cfg.validate().map_err(usage)?;
    Ok((app, params, cfg))
}

fn write_json(path: &PathBuf, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

fn cmd_run(args: &RunArgs) -> anyhow::Result<bool> {
    let protocol: ProtocolKind = args.protocol.parse().map_err(usage)?;
    let (app, params, cfg) = build(&args.job, protocol)?;
    println!(
        "lazarus run {app}: {} ranks on {} node(s), backend {}, protocol {}, checkpoint every {} of {} safe points, kills [{}]",
        cfg.ranks,
        cfg.nodes,
        cfg.backend,
        cfg.protocol,
        cfg.checkpoint_every,
        cfg.iterations.unwrap_or(0),
        args.job.kills.join(", ")
    );
    let run = run_app(app, &params, &cfg);
    let summary = RunSummary::new(app, &params, &cfg, &run);
    let st = &summary.stats;
    println!(
        "wall {:.3} s; failures {} ({} ranks killed); ranks rolled back {}; recovery {:.4} s; checkpoints {} ({} bytes, longest {:.4} s)",
        st.wall_s,
        st.failures,
        st.ranks_killed,
        st.ranks_rolled_back,
        st.recovery_s,
        st.checkpoints,
        st.checkpoint_bytes,
        st.checkpoint_s
    );
    if let Some(sim) = &summary.sim {
        println!(
            "sim: trace hash {:016x}, {} events in {:.3} s wall ({:.0} events/s), virtual time {:.6} s{}",
            sim.trace_hash,
            sim.events,
            sim.wall_s,
            sim.events as f64 / sim.wall_s.max(1e-9),
            sim.virtual_s,
            if sim.hung { ", HUNG" } else { "" }
        );
    }
    if !st.unfired_kills.is_empty() {
        eprintln!(
            "warning: these kills never fired (their moment never came): {}",
            st.unfired_kills.join(", ")
        );
    }
    if let Some(path) = &args.json {
        write_json(path, &summary)?;
    }
    match &run.outcome {
        Ok(v) => {
            println!("{}", v.detail);
            if v.verified {
                println!("VERIFIED {}", v.value);
            } else {
                println!("NOT VERIFIED {} ({})", v.value, v.detail);
            }
            Ok(v.verified)
        }
        Err(e) => {
            eprintln!("error: {e}");
            println!("NOT VERIFIED {e}");
            Ok(false)
        }
    }
}

fn cmd_bench(args: &BenchArgs) -> anyhow::Result<bool> {
    let protocols = args
        .protocols
        .split(',')
        .map(|p| p.trim().parse::<ProtocolKind>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)?;
    let (app, params, cfg) = build(&args.job, ProtocolKind::None)?;
    let cfg = Config {
        progress_bar: false,
        ..cfg
    };
    let report = bench(app, &params, &cfg, &protocols, args.reps, |r| {
        eprintln!(
            "  {:<12} wall {:.4} s  {}",
            r.protocol,
            r.stats.wall_s,
            if r.verified {
                "verified"
            } else {
                "NOT VERIFIED"
            }
        );
    })
    .map_err(usage)?;
    println!(
        "bench {app} class {} on {} ranks ({} nodes), backend {}, {} reps, checkpoint every {} safe points",
        report.class.as_deref().unwrap_or("-"),
        report.ranks,
        report.nodes,
        report.backend,
        report.reps,
        cfg.checkpoint_every
    );
    println!(
        "{:<14} {:>12} {:>10}  verified  value",
        "protocol", "median s", "ratio"
    );
    let mut ok = true;
    let first_value = report.protocols.first().map(|p| p.value.clone());
    for p in &report.protocols {
        println!(
            "{:<14} {:>12.4} {:>10.3}  {:<8}  {}",
            p.protocol, p.median_wall_s, p.ratio, p.verified_all, p.value
        );
        ok &= p.verified_all && Some(&p.value) == first_value.as_ref();
        if app == AppKind::Pingpong
            && let Some(points) = p.metrics.as_array()
        {
            for pt in points.iter().filter(|pt| {
                matches!(
                    pt["bytes"].as_u64(),
                    Some(8) | Some(1048576) | Some(4194304)
                )
            }) {
                println!(
                    "    {:>8} B: latency {:.2} us, bandwidth {:.0} MB/s",
                    pt["bytes"],
                    pt["latency_us"].as_f64().unwrap_or(f64::NAN),
                    pt["bandwidth_mb_s"].as_f64().unwrap_or(f64::NAN)
                );
            }
        }
    }
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    if !ok {
        println!("NOT VERIFIED: a run failed verification or protocols disagree on the value");
    }
    Ok(ok)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match &cli.command {
        Command::Run(a) => cmd_run(a),
        Command::Bench(a) => cmd_bench(a),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) if e.is::<Usage>() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(1)
        }
    }
}
