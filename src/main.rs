//! The `lazarus` command line: run an app under a protocol with injected
//! failures, or benchmark protocols side by side.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};

use lazarus::apps::{AppKind, AppParams, iterations, run_app};
use lazarus::config::Hosts;
use lazarus::config::{LevelSpec, SetRule};
use lazarus::driver::processes::launched;
use lazarus::protocol::chandy_lamport::GetFix;
use lazarus::tools::bench::{BenchEvent, bench, median};
use lazarus::tools::summary::RunSummary;
use lazarus::tools::{human_bytes, human_bytes_f64};
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
  R@checkpoint[:N]  rank R dies inside the N-th checkpoint it takes part in (default 1)
  R@finalize      rank R dies as it enters finalize, its function returned

Exit status: 0 VERIFIED, 1 NOT VERIFIED (or the job failed), 2 bad usage.";

const CHAOS_EXAMPLES: &str = "Examples:
  lazarus chaos cg --class S --protocols coordinated --seeds 200
  lazarus chaos dht --ranks 6 --nodes 3 --protocols coordinated --seeds 50 --from 1000 --json chaos.json
  lazarus chaos stencil --class S --ranks 8 --nodes 4 --backend processes --protocols pessimistic,ulml --seeds 20

Each failing case is printed with a `lazarus run ... --seed S --kill ...` command that runs it again:
exactly on the simulator; with the same kills (real SIGKILLs) but the machine's timing on processes.
Exit status: 0 when every case passes, 1 otherwise, 2 bad usage.";

const SIM_EXAMPLES: &str = "Examples:
  lazarus sim stencil --ranks 4096 --protocols none,coordinated --kill 5@50%
  lazarus sim allreduce --ranks 4096 --nodes 64 --protocols coordinated --checkpoint-every 5 --json scale.json
  lazarus sim stencil --ranks 1024,4096,16384 --ranks-per-node 64 --protocols coordinated,correlated,pessimistic --kill 5@50% --json scale.json --plot scale.svg";

const MODEL_EXAMPLES: &str = "Examples:
  lazarus model --checkpoint-cost 60 --mtbf 86400
  lazarus model --processes 4000 --plot pcf.svg
  lazarus model --group-size 21 --t-aware 3
  lazarus model --level nodes:1000:0.4:1.2 --level racks:40:0.01:2.0 --group-size 8 --t-aware 2";

const INSPECT_EXAMPLES: &str = "Examples:
  lazarus run stencil --ranks 4 --protocol coordinated --storage disk:ckpt@5
  lazarus inspect ckpt
  lazarus inspect ckpt --json ckpt.json

Exit status: 0 when a restart would find a usable generation, 1 when none would, 2 bad usage.";

const BENCH_CODEC_EXAMPLES: &str = "Examples:
  lazarus bench-codec --bytes 1MiB --group 4 --parity 2
  lazarus bench-codec --bytes 64KiB,4MiB --group 8 --parity 3 --json codec.json

Sizes are bytes, or a number with a unit (64KiB, 16MiB, 1GB).";

const BENCH_EXAMPLES: &str = "Examples:
  lazarus bench cg --class W --ranks 4 --protocols none,coordinated --json bench.json
  lazarus bench pingpong --ranks 2 --protocols none,coordinated --json pp.json --plot pp.svg";

/// Lazarus: parallel programs that survive failures.
#[derive(Parser, Debug)]
#[command(name = "lazarus", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// What to log on stderr: a level (error, warn, info, debug, trace,
    /// off) or comma-separated TARGET=LEVEL directives (lazarus=debug), as
    /// RUST_LOG takes them. Default: RUST_LOG, else warn. `info` adds each
    /// failure with its cause (a kill, an exit status or signal, heartbeat
    /// silence, a lost agent) and each suspicion of the failure detector;
    /// `debug` the launcher's and ranks' narration. Rank processes log
    /// with the same filter.
    #[arg(long, global = true, value_name = "FILTER", value_parser = log_filter)]
    log_level: Option<lazarus::logging::LogFilter>,
}

/// `--log-level`: a bad filter exits 2 naming the option (clap's error).
fn log_filter(text: &str) -> Result<lazarus::logging::LogFilter, String> {
    text.parse()
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run a built-in app under a protocol, with injected failures.
    #[command(after_help = RUN_EXAMPLES)]
    Run(RunArgs),
    /// Run protocols alternately and report median wall times and ratios to `none`.
    #[command(after_help = BENCH_EXAMPLES)]
    Bench(BenchArgs),
    /// Seeded failure scenarios, on the deterministic simulator or on real
    /// processes.
    #[command(after_help = CHAOS_EXAMPLES)]
    Chaos(ChaosArgs),
    /// Scale studies: communication patterns on many simulated ranks.
    #[command(after_help = SIM_EXAMPLES)]
    Sim(SimArgs),
    /// Daly's checkpoint interval and the catastrophic-failure probability (003 §5-§7).
    #[command(after_help = MODEL_EXAMPLES)]
    Model(ModelArgs),
    /// What a checkpoint directory holds, whether it is intact, and which
    /// generation a restart would use.
    #[command(after_help = INSPECT_EXAMPLES)]
    Inspect(InspectArgs),
    /// Encode throughput of XOR and Reed–Solomon parity next to a plain
    /// memcpy of the same bytes, in the same run.
    #[command(after_help = BENCH_CODEC_EXAMPLES)]
    BenchCodec(BenchCodecArgs),
    /// Draw a `lazarus bench --json` report as an SVG picture: wall-time
    /// ratios per protocol, or ping-pong bandwidth against message size.
    #[command(after_help = PLOT_EXAMPLES)]
    Plot(PlotArgs),
    /// What a run's timeline (`run --trace FILE`) shows: time per activity
    /// and the failures, per rank; with `--svg`, a picture of it.
    #[command(after_help = REPORT_EXAMPLES)]
    Report(ReportArgs),
    /// Start a program built on the library as N rank processes (as
    /// `mpirun` does), detect failures and start replacements.
    #[command(after_help = LAUNCH_EXAMPLES)]
    Launch(LaunchArgs),
    /// Run an MPI job (`mpiexec ... lazarus run ... --backend mpi`) and
    /// start it again from its newest checkpoint on disk while a rank's
    /// death ends it (an MPI without ULFM), as SCR's `scr_srun` does.
    #[cfg(feature = "mpi")]
    #[command(after_help = MPIRUN_EXAMPLES)]
    Mpirun(MpirunArgs),
    /// Started on each node by `srun` for a launcher with `--hosts slurm`:
    /// starts, kills and reports the rank processes of this node.
    #[command(hide = true)]
    Agent,
}

#[cfg(feature = "mpi")]
const MPIRUN_EXAMPLES: &str = "Examples:
  lazarus mpirun -- mpiexec -n 4 lazarus run cg --backend mpi --storage disk:/scratch/ckpt --kill 2@50%
  lazarus mpirun --max-restarts 3 -- srun -n 64 lazarus run stencil --backend mpi --storage disk:ckpt

The ranks write down each kill of the fault plan before they carry it out; when the job then
ends, it starts again with LAZARUS_MPI_RESUME set: its ranks restart from the newest committed
generation of their disk level (from the beginning if none was committed yet), and the kills
that fired do not fire again. A job that ends for any other reason is not started again.
Exit status: the last attempt's (0 when it succeeded), 2 bad usage.";

#[cfg(feature = "mpi")]
#[derive(Args, Debug)]
struct MpirunArgs {
    /// Most times the job is started again.
    #[arg(long, default_value_t = 8)]
    max_restarts: u32,
    /// The command that runs the MPI job (after `--`).
    #[arg(required = true, last = true, value_name = "COMMAND")]
    command: Vec<std::ffi::OsString>,
}

#[cfg(feature = "mpi")]
fn cmd_mpirun(args: &MpirunArgs) -> anyhow::Result<bool> {
    let status = lazarus::driver::mpi::launch::mpirun(&args.command, args.max_restarts).map_err(
        |e| match e {
            e @ lazarus::Error::Config { .. } => usage(e),
            e => e.into(),
        },
    )?;
    Ok(status.success())
}

const LAUNCH_EXAMPLES: &str = "Examples (from the source tree, after `cargo build --release --example launched_solver`):
  lazarus launch -n 4 -- ./target/release/examples/launched_solver 200
  lazarus launch -n 8 --nodes 2 --kill node:1@50% --json job.json -- ./target/release/examples/launched_solver 200

The program calls `lazarus::run(&config, rank_fn)` as usual; started by the launcher, that call
runs one rank (size, nodes and kills come from the launcher; the protocol and checkpoint interval
from the program's config) and returns that rank's value.
Under Slurm, -n and --nodes default to SLURM_NTASKS and SLURM_NNODES.
Exit status: 0 when every rank succeeded, 1 otherwise, 2 bad usage.";

#[derive(Args, Debug)]
struct LaunchArgs {
    /// Number of ranks, at most 4096 (default: SLURM_NTASKS under Slurm).
    #[arg(short = 'n', long = "ranks")]
    ranks: Option<usize>,
    /// Failure domains (default: SLURM_NNODES under Slurm, else 1).
    #[arg(long)]
    nodes: Option<usize>,
    /// Failure to inject (repeatable), as for `run`.
    #[arg(long = "kill", value_name = "SPEC")]
    kills: Vec<String>,
    /// Transport between ranks: unix (Unix sockets, frames in shared-memory
    /// rings), unix-sockets (frames on the sockets too), tcp (loopback) or
    /// tcp:IP.
    #[arg(long, default_value = "unix")]
    listen: String,
    /// Where ranks run: local (this host) or slurm (an agent started by
    /// srun on every node of the allocation starts the ranks of its node;
    /// needs --listen tcp:IP). Default: slurm inside a Slurm allocation of
    /// several nodes, else local.
    #[arg(long)]
    hosts: Option<String>,
    /// The failure detector's shortest timeout (200ms, 1s; a bare number is
    /// milliseconds): no rank is suspected before this much silence (the
    /// timeout grows with the observed heartbeat jitter). Only ranks on
    /// other hosts (--hosts slurm) are declared dead for silence; a rank on
    /// this host is dead when its process is.
    #[arg(long, default_value = "200ms", value_parser = millis, allow_hyphen_values = true)]
    heartbeat_timeout: Duration,
    /// Largest frame (one message, or one checkpoint piece) a connection
    /// carries: bytes, or with a unit (64KiB to 1TiB).
    #[arg(long, value_name = "BYTES", default_value = DEFAULT_MAX_FRAME, value_parser = parse_bytes)]
    max_frame: usize,
    /// Write the job statistics as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the job's timeline here (see `run --trace`): the ranks of a
    /// program that calls `lazarus::run` record theirs.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    #[arg(required = true, last = true, value_name = "PROGRAM")]
    command: Vec<String>,
}

/// Says on stderr which kills never fired and why they may not have, and
/// returns what the summary line adds about them ("" when all fired): a
/// kill that cannot fire (`R@P%` in a program that reports no progress)
/// must not pass for a run that survived it.
fn unfired_kills(stats: &lazarus::JobStats) -> String {
    if stats.unfired_kills.is_empty() {
        return String::new();
    }
    for k in &stats.unfired_kills {
        let why = k.parse::<KillSpec>().map(|k| k.why_unfired());
        eprintln!(
            "warning: kill {k} never fired{}",
            why.map(|w| format!(": {w}")).unwrap_or_default()
        );
    }
    format!("; kill never fired: {}", stats.unfired_kills.join(", "))
}

/// `--max-frame`'s default, [`lazarus::config::DEFAULT_MAX_FRAME`] as
/// the help shows it (a test checks that they agree).
const DEFAULT_MAX_FRAME: &str = "16GiB";

/// `-n`/`--nodes`, or Slurm's task and node counts.
fn slurm_default(given: Option<usize>, var: &str) -> Option<usize> {
    given.or_else(|| {
        std::env::var_os("SLURM_JOB_ID")?;
        std::env::var(var).ok()?.trim().parse().ok()
    })
}

fn cmd_launch(args: &LaunchArgs) -> anyhow::Result<bool> {
    use lazarus::driver::processes::launcher::{LaunchSpec, launch};
    let ranks = slurm_default(args.ranks, "SLURM_NTASKS").ok_or_else(|| {
        usage(lazarus::Error::config(
            "-n",
            "how many ranks? (-n N, or run inside a Slurm allocation)",
        ))
    })?;
    lazarus::config::check_ranks(Backend::Processes, ranks).map_err(usage)?;
    let nodes = slurm_default(args.nodes, "SLURM_NNODES").unwrap_or(1);
    let placement = lazarus::topology::Placement::block(ranks, nodes).map_err(usage)?;
    let hosts = match &args.hosts {
        Some(h) => h.parse().map_err(usage)?,
        None => Hosts::from_slurm_env(),
    };
    let listen: lazarus::driver::processes::net::Listen = args.listen.parse().map_err(usage)?;
    hosts.check_listen(listen).map_err(usage)?;
    let kills = parse_kills(&args.kills)?;
    for k in &kills {
        k.validate(&placement, u64::MAX).map_err(usage)?;
    }
    check_output_opt("--json", &args.json)?;
    check_output_opt("--trace", &args.trace)?;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| usage(lazarus::Error::config("PROGRAM", "missing")))?;
    check_program(program)?;
    let spec = LaunchSpec {
        program: program.into(),
        args: rest.iter().map(Into::into).collect(),
        ranks,
        nodes,
        kills,
        listen,
        hosts,
        sets: Default::default(),
        agent_program: std::env::current_exe()?,
        heartbeat_timeout: heartbeat(args.heartbeat_timeout)?,
        max_frame: {
            lazarus::config::check_max_frame(args.max_frame).map_err(usage)?;
            args.max_frame
        },
        restart_generation: None,
        self_launch: false,
        call: None,
        protocol: "(the program's)".into(),
        protocol_override: None,
        protocol_settings: Default::default(),
        trace: args
            .trace
            .as_ref()
            .map(|_| lazarus::trace::DEFAULT_THRESHOLD),
        quiet_stdout: false,
        progress_bar: false,
        earlier: Vec::new(),
    };
    let (outcome, stats) = launch(&spec);
    let unfired = unfired_kills(&stats);
    eprintln!(
        "lazarus launch: {} ranks; wall {:.3} s; failures {} ({} ranks killed); ranks rolled back {}; recovery {:.4} s{unfired}",
        ranks,
        stats.wall_s,
        stats.failures,
        stats.ranks_killed,
        stats.ranks_rolled_back,
        stats.recovery_s
    );
    if let Some(path) = &args.json {
        write_json(path, &stats)?;
    }
    if let Some(path) = &args.trace {
        match &stats.trace {
            Some(trace) => write_trace(path, trace, &format!("lazarus launch {program}"))?,
            None => eprintln!(
                "lazarus launch: no timeline was recorded: {} not written",
                path.display()
            ),
        }
    }
    match outcome {
        Ok(_) => Ok(true),
        Err(e) => {
            eprintln!("error: {e}");
            Ok(false)
        }
    }
}

/// `lazarus launch`'s PROGRAM must be an executable file (found on `PATH`
/// when it names no directory), checked before any rank starts: a typo is
/// bad usage, not a job whose every rank failed.
fn check_program(program: &str) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let executable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let found = if program.contains('/') {
        executable(std::path::Path::new(program))
    } else {
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| executable(&d.join(program))))
    };
    if found {
        return Ok(());
    }
    Err(usage(lazarus::Error::config(
        "PROGRAM",
        format!("`{program}` is not an executable file (nor one on PATH)"),
    )))
}

#[derive(Args, Debug)]
struct BenchCodecArgs {
    /// Bytes per piece (one rank's checkpoint), or with a unit (1MiB);
    /// comma-separated. The default sizes show a group that fits in this
    /// machine's cache (where memcpy runs at cache speed) and two that do
    /// not.
    #[arg(long, value_delimiter = ',', default_value = "1MiB,16MiB,64MiB", value_parser = parse_bytes)]
    bytes: Vec<usize>,
    /// Pieces per group.
    #[arg(long, default_value_t = 4)]
    group: usize,
    /// Reed–Solomon parity shards.
    #[arg(long, default_value_t = 2)]
    parity: usize,
    /// Write the figures as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn cmd_bench_codec(args: &BenchCodecArgs) -> anyhow::Result<bool> {
    check_output_opt("--json", &args.json)?;
    let mut all = Vec::with_capacity(args.bytes.len());
    for &bytes in &args.bytes {
        let f =
            lazarus::store::codec::bench_encode(bytes, args.group, args.parity).map_err(usage)?;
        println!(
            "{} pieces of {}: memcpy {:.2} GB/s, XOR {:.2} GB/s ({:.2}x), RS(+{}) {:.2} GB/s ({:.2}x)",
            f.group,
            lazarus::tools::binary_size(f.bytes as u64),
            f.memcpy_gb_s,
            f.xor_gb_s,
            f.xor_gb_s / f.memcpy_gb_s,
            f.parity,
            f.rs_gb_s,
            f.rs_gb_s / f.memcpy_gb_s
        );
        println!(
            "  RS(+{}) parts: coding alone {:.2} GB/s ({:.2}x memcpy); CRC32C {:.2} GB/s (the parity, \
             {}/{} of the bytes, is checksummed and copied out of the coder)",
            f.parity,
            f.rs_coding_gb_s,
            f.rs_coding_gb_s / f.memcpy_gb_s,
            f.crc32c_gb_s,
            f.parity,
            f.group
        );
        all.push(f);
    }
    if let Some(path) = &args.json {
        #[derive(serde::Serialize)]
        struct Figures<'a> {
            figures: &'a [lazarus::store::codec::BenchFigures],
        }
        write_json(path, &Figures { figures: &all })?;
    }
    Ok(true)
}

/// `lazarus bench --get-fix`: 000 Table I and the §IV-D marker counts.
fn cmd_table_one(args: &BenchArgs) -> anyhow::Result<bool> {
    use lazarus::tools::table_one::{TableEvent, table_one};
    if protocols(&args.protocols)? != [ProtocolKind::ChandyLamport] {
        return Err(usage(lazarus::Error::config(
            "--protocols",
            "--get-fix measures chandy-lamport's cuts: give --protocols chandy-lamport",
        )));
    }
    let fixes: Vec<GetFix> = match args.job.get_fix.as_deref() {
        Some("all") => GetFix::ALL.to_vec(),
        Some(list) => list
            .split(',')
            .map(|f| f.trim().parse::<GetFix>())
            .collect::<Result<_, _>>()
            .map_err(|e| usage(lazarus::Error::config("--get-fix", e)))?,
        None => Vec::new(),
    };
    if args.seeds == 0 {
        return Err(usage(lazarus::Error::config(
            "--seeds",
            "at least one seed",
        )));
    }
    let mut job = args.job.clone();
    job.get_fix = Some(fixes[0].name().into());
    job.check_cuts = true;
    let (app, params, cfg) = build(&job, ProtocolKind::ChandyLamport)?;
    if !cfg.get_kills().is_empty() || !args.failure.is_empty() {
        return Err(usage(lazarus::Error::config(
            "--kill",
            "the cuts are checked on failure-free runs",
        )));
    }
    check_output_opt("--json", &args.json)?;
    let cfg = cfg.progress_bar(false);
    println!(
        "000 Table I: {} on {} ranks ({}), {} seeds per fix from {}{}{}",
        args.job.what.app,
        cfg.get_ranks(),
        cfg.get_backend().name(),
        args.seeds,
        args.from,
        match cfg.get_wave_interval() {
            Some(d) => format!(", a wave every {}", humantime::format_duration(d)),
            None => ", a wave at every checkpoint".into(),
        },
        if cfg.get_backend() == Backend::Sim && cfg.get_network().straggle > 0.0 {
            format!(", {} of replies straggling", cfg.get_network().straggle)
        } else {
            String::new()
        }
    );
    println!(
        "{:<24} {:>6} {:>8} {:>11} {:>8}   {:>11} {:>11} {:>14}  Table I (overlap, cross)",
        "fix", "runs", "cuts", "overlapped", "crossed", "first/gen", "second/gen", "flush+answers"
    );
    let per_gen = |m: u64, g: u64| if g == 0 { 0.0 } else { m as f64 / g as f64 };
    let yes = |b: bool| if b { "yes" } else { "no" };
    let table = table_one(app, &params, &cfg, &fixes, args.from, args.seeds, |e| {
        let TableEvent::Row(r) = e;
        println!(
            "{:<24} {:>6} {:>8} {:>11} {:>8}   {:>11.1} {:>11.1} {:>14}  paper: {}, {}; measured: {}, {}{}",
            r.fix,
            r.runs,
            r.cuts_checked,
            r.cuts_overlapped,
            r.cuts_crossed,
            per_gen(r.markers.first, r.generations),
            per_gen(r.markers.second, r.generations),
            format!("{}+{}", r.markers.flush, r.markers.flush_answers),
            yes(r.paper_overlap),
            yes(r.paper_cross),
            yes(r.cuts_overlapped > 0),
            yes(r.cuts_crossed > 0),
            if r.agrees { "" } else { "  DIFFERS" }
        );
    })
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    let n = cfg.get_ranks() as u64;
    let formulas = table
        .rows
        .iter()
        .all(|r| r.first_wave_formula && r.second_wave_formula && r.flush_formula);
    println!(
        "markers (000 §IV-D): n(n-1) = {} per generation for the first wave; double barrier +n(n-1); partial double barrier +2g (g = flush markers): {}",
        n * n.saturating_sub(1),
        if formulas {
            "every run agrees"
        } else {
            "SOME RUN DIFFERS"
        }
    );
    if let Some(path) = &args.json {
        write_json(path, &table)?;
        println!("report written to {}", path.display());
    }
    Ok(formulas && table.rows.iter().all(|r| r.agrees))
}

const PLOT_EXAMPLES: &str = "Examples:
  lazarus bench cg --class W --ranks 8 --nodes 4 --protocols none,pessimistic,ulml --failure 1@70% --json cg.json
  lazarus plot cg.json                      # writes cg.svg
  lazarus bench pingpong --ranks 2 --backend processes --protocols none,pessimistic --json pp.json
  lazarus plot pp.json --out pingpong.svg";

#[derive(Args, Debug)]
struct PlotArgs {
    /// A report written by `lazarus bench --json`.
    report: PathBuf,
    /// The SVG file to write (default: the report's name with `.svg`).
    #[arg(long, short)]
    out: Option<PathBuf>,
}

fn cmd_plot(args: &PlotArgs) -> anyhow::Result<bool> {
    let text = std::fs::read_to_string(&args.report).map_err(|e| {
        usage(lazarus::Error::config(
            "REPORT",
            format!("cannot read {}: {e}", args.report.display()),
        ))
    })?;
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.report.with_extension("svg"));
    check_output("--out", &out)?;
    lazarus::tools::plot::plot_bench(&text, &out).map_err(usage)?;
    println!("plot written to {}", out.display());
    Ok(true)
}

const REPORT_EXAMPLES: &str = "Examples:
  lazarus run cg --ranks 8 --nodes 4 --protocol ulml --kill node:1@50% --trace t.json
  lazarus report t.json --svg t.svg";

#[derive(Args, Debug)]
struct ReportArgs {
    /// A timeline written by `lazarus run --trace FILE`.
    trace: PathBuf,
    /// Also draw it as an SVG picture here (one lane per rank).
    #[arg(long, value_name = "OUT")]
    svg: Option<PathBuf>,
}

fn cmd_report(args: &ReportArgs) -> anyhow::Result<bool> {
    let unusable = |why: String| {
        usage(lazarus::Error::config(
            "TRACE",
            format!("{}: {why}", args.trace.display()),
        ))
    };
    check_output_opt("--svg", &args.svg)?;
    let text = std::fs::read_to_string(&args.trace).map_err(|e| unusable(e.to_string()))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| unusable(format!("not JSON: {e}")))?;
    let trace = lazarus::trace::Trace::from_chrome(&value).map_err(unusable)?;
    print!("{}", lazarus::tools::report::render_text(&trace));
    if let Some(out) = &args.svg {
        let title = value
            .pointer("/traceEvents/0/args/name")
            .and_then(|t| t.as_str())
            .unwrap_or("lazarus timeline");
        std::fs::write(out, lazarus::tools::report::render_svg(&trace, title))
            .with_context(|| format!("writing {}", out.display()))?;
        println!("picture written to {}", out.display());
    }
    Ok(true)
}

#[derive(Args, Debug)]
struct InspectArgs {
    /// The checkpoint directory (of a `--storage disk:DIR` run).
    dir: PathBuf,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn cmd_inspect(args: &InspectArgs) -> anyhow::Result<bool> {
    check_output_opt("--json", &args.json)?;
    let report = lazarus::store::disk::inspect(&args.dir).map_err(usage)?;
    print!("{}", lazarus::store::disk::render(&report));
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    Ok(report.restart_from.is_some())
}

#[derive(Args, Debug)]
struct ChaosArgs {
    #[command(flatten)]
    what: AppArgs,
    /// Number of ranks.
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Failure domains (nodes) ranks are placed on, in blocks. The default
    /// is 2, not run's 1: so that the drawn schedules kill whole nodes too,
    /// and checkpoint copies live on another node than their rank.
    #[arg(long, default_value_t = 2)]
    nodes: usize,
    /// Comma-separated protocols to test.
    #[arg(long, default_value = "coordinated")]
    protocols: String,
    /// Backend: sim (seeded schedule, exact replay), processes (real
    /// SIGKILLs, the machine's timing) or threads.
    #[arg(long, default_value = "sim")]
    backend: String,
    /// Processes backend: transport between ranks (as for `run`).
    #[arg(long, default_value = "unix")]
    listen: String,
    /// Number of seeds.
    #[arg(long, default_value_t = 20)]
    seeds: u64,
    /// First seed.
    #[arg(long, default_value_t = 1)]
    from: u64,
    /// Checkpoint every N safe points (0: never), or every P% of the run.
    #[arg(long, default_value = "10%")]
    checkpoint_every: String,
    /// Protocol coordinated: auto, gsync or locks (as for `run`).
    #[arg(long, default_value = "auto")]
    checkpoint_scheme: String,
    /// Checkpoint storage level (repeatable, as for `run`; in-memory levels
    /// only: cases would share a disk directory).
    #[arg(long = "storage", value_name = "LEVEL")]
    storage: Vec<String>,
    /// Message logging: the log budget in bytes (as for `run`), so that
    /// kills land among forced checkpoints.
    #[arg(long, value_parser = parse_bytes)]
    log_budget: Option<usize>,
    /// Protocol correlated: sets of N consecutive ranks (as for `run`).
    #[arg(long)]
    sets: Option<usize>,
    /// Wall-clock bound per case (90s, 5m; a bare number is seconds).
    #[arg(long, default_value = "120s", value_parser = positive_secs, allow_hyphen_values = true)]
    bound_s: Duration,
    /// How kill schedules are drawn: mixed (one to three kills at any
    /// moment) or cascade (a first kill, then kills during its recovery:
    /// of its holders, its replacement, a set peer, another node, at
    /// finalize).
    #[arg(long, default_value = "mixed")]
    schedules: String,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Record every case's timeline and write the first failing case's
    /// here (see `run --trace`); nothing is written when every case passes.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct SimArgs {
    /// The communication pattern: stencil, allreduce.
    #[arg(value_name = "PATTERN")]
    app: String,
    /// Number of simulated ranks, or a comma-separated list of counts for a
    /// scale study (1024,4096,16384). At most 16777216, and what memory
    /// holds: a rank costs some tens of KiB, and the simulator refuses a
    /// count that cannot fit before it starts.
    #[arg(long, default_value = "1024")]
    ranks: String,
    /// Failure domains (nodes) ranks are placed on, in blocks.
    #[arg(long, default_value_t = 1, conflicts_with = "ranks_per_node")]
    nodes: usize,
    /// Ranks per failure domain instead of a node count: each rank count of
    /// a study gets ranks / K nodes (rounded up).
    #[arg(long, value_name = "K")]
    ranks_per_node: Option<usize>,
    /// Comma-separated protocols.
    #[arg(long, default_value = "none,coordinated")]
    protocols: String,
    /// Iterations.
    #[arg(long, default_value_t = 20)]
    iterations: u64,
    /// Virtual compute per iteration per rank (1ms, 2.5s; a bare number is
    /// seconds).
    #[arg(long, default_value = "1ms", value_parser = secs, allow_hyphen_values = true)]
    compute_s: Duration,
    /// Stencil halo message size: bytes, or with a unit (8KiB).
    #[arg(long, default_value = "8KiB", value_parser = parse_bytes)]
    halo_bytes: usize,
    /// Allreduce length, f64 elements.
    #[arg(long, default_value_t = 1)]
    reduce_len: usize,
    /// Protected state of each rank beyond its counters: bytes, or with a
    /// unit (32MiB); checkpointed, restored and moved with the rank.
    #[arg(long, default_value = "0", value_parser = parse_bytes)]
    state_bytes: usize,
    /// Load imbalance: odd ranks compute this many times --compute-s per
    /// iteration (2: twice the work).
    #[arg(long, default_value_t = 1.0)]
    imbalance: f64,
    /// Checkpoint every N iterations (0: never), or every P% of them, as
    /// for `run`. The default is 5, not run's 10%: a scale study runs few
    /// iterations (20 by default), and at 10% every other one would end in
    /// a checkpoint.
    #[arg(long, default_value = "5")]
    checkpoint_every: String,
    /// Failure to inject (repeatable).
    #[arg(long = "kill", value_name = "SPEC")]
    kills: Vec<String>,
    #[command(flatten)]
    proactive: ProactiveArgs,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the JSON rows here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Draw checkpoint coordination and recovery time against the rank
    /// count, per protocol, as SVG here (log-log).
    #[arg(long)]
    plot: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ModelArgs {
    /// Checkpoint cost (60s, 2m; a bare number is seconds). With --mtbf:
    /// print Daly's interval.
    #[arg(long, value_parser = positive_secs, allow_hyphen_values = true)]
    checkpoint_cost: Option<Duration>,
    /// Mean time between failures (1d, 6h; a bare number is seconds).
    #[arg(long, value_parser = positive_secs, allow_hyphen_values = true)]
    mtbf: Option<Duration>,
    /// Processes N of the P_cf table (003 Fig. 10c).
    #[arg(long, default_value_t = lazarus::tools::model::FIG10C_PROCESSES)]
    processes: usize,
    /// Draw the P_cf table as an SVG here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// A failure-domain level, smallest first (repeatable):
    /// NAME:COUNT:A:B, with P(x concurrent failures per day) = A*exp(-B*x).
    /// Without it the TSUBAME2.0 fits of 003 §7.1 are used.
    #[arg(long = "level", value_name = "NAME:COUNT:A:B")]
    levels: Vec<String>,
    /// Checksum-group size |G| (one checksum rank per group): print P_cf for it.
    #[arg(long)]
    group_size: Option<usize>,
    /// Topology-awareness level for --group-size: 0 = none, 1 = the first
    /// level (nodes), 2 = the second, ...
    #[arg(long, default_value_t = 1)]
    t_aware: usize,
}

fn parse_level(text: &str) -> anyhow::Result<lazarus::tools::model::Level> {
    use lazarus::tools::model::{FailureDist, Level};
    let bad = || {
        usage(lazarus::Error::config(
            "--level",
            format!("`{text}`: expected NAME:COUNT:A:B, e.g. nodes:1408:0.5:1.1"),
        ))
    };
    let parts: Vec<&str> = text.split(':').collect();
    let [name, count, a, b] = parts[..] else {
        return Err(bad());
    };
    Ok(Level {
        name: name.to_string(),
        count: count.parse().map_err(|_| bad())?,
        failures: FailureDist::Exponential {
            a: a.parse().map_err(|_| bad())?,
            b: b.parse().map_err(|_| bad())?,
        },
    })
}

/// The app and its problem, positional and the same in every subcommand
/// that runs an app (`run`, `bench`, `chaos`).
#[derive(Args, Debug, Clone)]
struct AppArgs {
    /// The app: stencil, cg, ft, dht, pingpong.
    app: String,
    /// Problem class (cg and ft: S, W, A, B; stencil and dht: S, W, A).
    #[arg(long)]
    class: Option<char>,
    /// Problem size (stencil: grid side; dht: keys per rank; pingpong:
    /// largest message in bytes, or with a unit: 4MiB).
    #[arg(long, value_parser = parse_bytes)]
    size: Option<usize>,
    /// Iterations (stencil: sweeps; dht: insert batches; pingpong: round trips per size).
    #[arg(long)]
    iterations: Option<u64>,
    /// Stencil: load imbalance; odd ranks sweep their block this many
    /// times per iteration (2: twice the work), so ranks reach safe points
    /// at different times.
    #[arg(long)]
    imbalance: Option<u32>,
    /// FT: how a transpose moves the blocks: put (one-sided puts into
    /// the peers' window between fences) or alltoall (two-sided, NPB's MPI
    /// version).
    #[arg(long)]
    transpose: Option<String>,
}

/// Proactive fault tolerance (001), for `run`, `bench` and `sim` (backend
/// sim so far).
#[derive(Args, Debug, Clone, Default)]
struct ProactiveArgs {
    /// Fault warning (repeatable): W@P%, W@iI for worker W, or node:K@P%,
    /// node:K@iI. The warned workers' ranks move to other workers at their
    /// next safe point, with no rollback (001); the summary gives the
    /// evacuation time and the time per iteration before, after the
    /// evacuation and after balancing.
    #[arg(long = "warn", value_name = "SPEC")]
    warnings: Vec<String>,
    /// Workers hosting the ranks (default one a rank): ranks in equal
    /// blocks over the workers, the workers in equal blocks over --nodes;
    /// a worker's ranks share its CPU.
    #[arg(long, value_name = "W")]
    workers: Option<usize>,
    /// After an evacuation, reassign ranks over the remaining workers by
    /// their measured load (001 §4.2): greedy, refine or off.
    #[arg(long, default_value = "greedy")]
    balance: String,
}

impl ProactiveArgs {
    /// `cfg` with these workers, warnings and balancing.
    fn apply(&self, cfg: Config) -> anyhow::Result<Config> {
        let warnings = (self.warnings.iter())
            .map(|w| w.parse())
            .collect::<Result<Vec<_>, _>>()
            .map_err(usage)?;
        let balance =
            (self.balance.parse()).map_err(|e| usage(lazarus::Error::config("--balance", e)))?;
        Ok(cfg
            .warnings(warnings)
            .workers(self.workers)
            .balance(balance))
    }
}

#[derive(Args, Debug, Clone)]
struct JobArgs {
    #[command(flatten)]
    what: AppArgs,
    /// Number of ranks (at most 4096 on threads and processes, 16777216 on
    /// sim, memory permitting).
    #[arg(long, default_value_t = 4)]
    ranks: usize,
    /// Failure domains (nodes) ranks are placed on, in blocks.
    #[arg(long, default_value_t = 1)]
    nodes: usize,
    /// Backend: threads, processes, sim.
    #[arg(long, default_value = "threads")]
    backend: String,
    /// Processes backend: transport between ranks: unix (Unix sockets,
    /// frames in shared-memory rings), unix-sockets, tcp (loopback) or tcp:IP.
    #[arg(long, default_value = "unix")]
    listen: String,
    /// Processes backend: where ranks run: local, or slurm (an agent
    /// started by srun on every node of the allocation starts its ranks;
    /// needs --listen tcp:IP).
    #[arg(long, default_value = "local")]
    hosts: String,
    /// Processes backend: the failure detector's shortest timeout (200ms,
    /// 1s; a bare number is milliseconds); it grows with the observed
    /// heartbeat jitter; only ranks on other hosts are declared dead for
    /// silence.
    #[arg(long, default_value = "200ms", value_parser = millis, allow_hyphen_values = true)]
    heartbeat_timeout: Duration,
    /// Processes backend: largest frame (one message, or one checkpoint
    /// piece with its message log) a connection carries: bytes, or with a
    /// unit (64KiB to 1TiB).
    #[arg(long, value_name = "BYTES", default_value = DEFAULT_MAX_FRAME, value_parser = parse_bytes)]
    max_frame: usize,
    /// Failure to inject (repeatable): R@P%, R@iI, node:K@P%, R@recovery[:N],
    /// R@checkpoint[:N], R@evacuation[:N] (while the N-th warning's ranks
    /// are still moving), R@finalize.
    #[arg(long = "kill", value_name = "SPEC")]
    kills: Vec<String>,
    #[command(flatten)]
    proactive: ProactiveArgs,
    /// Checkpoint every N safe points (0: never, as 002 Fig. 6 measures logging
    /// overhead), or every P% of the run ("10%"). With
    /// `--checkpoint-interval daly`, the first interval only.
    #[arg(long, default_value = "10%")]
    checkpoint_every: String,
    /// `fixed` (--checkpoint-every) or `daly`: Daly's optimal interval
    /// (003 §6.1) from the measured checkpoint cost and --mtbf.
    #[arg(long, default_value = "fixed")]
    checkpoint_interval: String,
    /// Mean time between failures for `--checkpoint-interval daly`, e.g. 90s,
    /// 15m, 2h, 1d (a bare number is seconds).
    #[arg(long, value_parser = positive_secs, allow_hyphen_values = true)]
    mtbf: Option<Duration>,
    /// `coordinated`: how a checkpoint is made consistent (003 §3.1.2):
    /// `locks` (flush, barrier, capture), `gsync` (capture at once right
    /// after a fence; the cut is checked after and taken again by locks if
    /// it does not hold), or `auto` (from the program's synchronisation).
    #[arg(long, default_value = "auto")]
    checkpoint_scheme: String,
    /// `rma`: which accesses are logged (003 §7.2.2): `puts-gets` (writes
    /// at their origin, reads at their target: f-puts-gets) or `puts`
    /// (writes only: f-puts; a recovery that must read again falls back).
    #[arg(long, default_value = "puts-gets")]
    rma_log: String,
    /// Seed of the runtime's random choices (when kills land).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Checkpoint storage level (repeatable): partner (copy on another
    /// node; the default, and kept when no in-memory level is named),
    /// xor[@N], rs:M[@N] (parity over topology-aware groups, every N-th
    /// generation; they replace partner unless it is named too),
    /// disk:DIR[@N] (every N-th generation to DIR, with commit records).
    #[arg(long = "storage", value_name = "LEVEL")]
    storage: Vec<String>,
    /// Restart the whole job from the newest committed generation in DIR.
    #[arg(long, value_name = "DIR")]
    restart: Option<PathBuf>,
    /// Message logging (pessimistic, ulml, correlated): the most memory one
    /// rank's payload log holds (bytes, or with a suffix: 64MiB, 1GiB,
    /// 500K). A sender whose log passes half of it asks its largest
    /// receiver to checkpoint, which trims the log; past it, older payloads
    /// move to a spill file (the disk level's directory, else the temporary
    /// directory) until a trim.
    #[arg(long, value_name = "BYTES", value_parser = parse_bytes)]
    log_budget: Option<usize>,
    /// Protocol correlated: sets of N consecutive ranks checkpoint and roll
    /// back together (default: one set per node of --nodes).
    #[arg(long, value_name = "N")]
    sets: Option<usize>,
    /// Protocol chandy-lamport: also run 000 §IV's snapshot wave (rank 0
    /// initiates it at each checkpoint's safe point, the others enter at
    /// its first marker) with this fix for the GET that straddles it:
    /// vanilla, delay, peek-and-get, double-barrier, partial-double-barrier
    /// (bench: `all`). Its markers are counted by kind.
    #[arg(long, value_name = "FIX")]
    get_fix: Option<String>,
    /// With --get-fix: stamp every message and one-sided operation with the
    /// wave's cuts and report the cuts crossed and overlapped (failure-free
    /// runs).
    #[arg(long)]
    check_cuts: bool,
    /// With --get-fix: rank 0 initiates the wave whenever this much time
    /// has passed (virtual on sim: 1ms, 50us), wherever it is, instead of
    /// at the checkpoints' safe points.
    #[arg(long, value_name = "TIME", value_parser = positive_secs, allow_hyphen_values = true)]
    wave_interval: Option<Duration>,
    /// Backend sim: adversarial schedules; this fraction of one-sided
    /// replies (0 to 1) is held in flight up to 50 latencies longer, so
    /// that markers on other channels pass them.
    #[arg(long, default_value_t = 0.0, value_name = "P")]
    straggle: f64,
}

#[derive(Args, Debug)]
struct RunArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Protocol: none, coordinated, pessimistic, ulml, correlated.
    #[arg(long, default_value = "none")]
    protocol: String,
    /// Write the JSON summary here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the run's timeline here, in the Chrome trace event format
    /// (open it in ui.perfetto.dev or chrome://tracing; draw it with
    /// `lazarus report FILE --svg OUT`): per rank, spans of compute,
    /// sends, receives, collectives, one-sided operations, safe points,
    /// checkpoints, recovery, restore and replay, and marks of kills,
    /// detections, commits and resends.
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct BenchArgs {
    #[command(flatten)]
    job: JobArgs,
    /// Comma-separated protocols.
    #[arg(long, default_value = "none,coordinated")]
    protocols: String,
    /// Runs per protocol. The default, 6, is the fewest that give the
    /// paired ratio a 95% confidence interval.
    #[arg(long, default_value_t = lazarus::tools::bench::MIN_REPS_FOR_CI)]
    reps: usize,
    /// Also run every recovering protocol with this kill (repeatable: one
    /// scenario of several kills), alternating with its failure-free runs,
    /// and report the wall-time ratio with/without failure.
    #[arg(long = "failure", value_name = "SPEC")]
    failure: Vec<String>,
    /// Write the JSON report here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Also run every protocol with its timeline recorded, alternating with
    /// the untraced runs, report what tracing costs (paired ratio), and
    /// write the last traced run's timeline here (see `run --trace`).
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Also draw the report as an SVG picture here (as `lazarus plot`
    /// draws a saved report).
    #[arg(long, value_name = "SVG")]
    plot: Option<PathBuf>,
    /// With --get-fix (000 Table I): seeds per fix.
    #[arg(long, default_value_t = 1000)]
    seeds: u64,
    /// With --get-fix: the first seed.
    #[arg(long, default_value_t = 1)]
    from: u64,
}

/// A usage error: exit status 2.
#[derive(Debug)]
struct Usage(String);

/// A size option's value, as `bytesize` reads it: a bare number of bytes
/// (`1000000`), or a number and a unit, SI or IEC (`500K`, `64MiB`,
/// `16GiB`, `1.5GB`). A clap value parser: a bad value exits 2 naming the
/// option.
fn parse_bytes(s: &str) -> Result<usize, String> {
    let b: bytesize::ByteSize = s.trim().parse().map_err(|e| {
        format!("`{s}` is not a byte count ({e}); write e.g. 1000000, 500K, 64MiB, 16GiB")
    })?;
    usize::try_from(b.as_u64())
        .ok()
        .filter(|&n| n != usize::MAX)
        .ok_or_else(|| format!("`{s}` is too many bytes"))
}

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

/// A library error as a usage error of the command (see [`said`]).
fn usage(e: lazarus::Error) -> anyhow::Error {
    anyhow::Error::new(Usage(said(&e)))
}

/// A library error as the command says it: a setting the library names
/// (`log_budget`, or `Config::log_budget` in a message) is named as the
/// option that sets it (`--log-budget`).
fn said(e: &lazarus::Error) -> String {
    settings_as_options(&match e {
        lazarus::Error::Config { option, detail } => {
            format!("invalid configuration `{}`: {detail}", flag(option))
        }
        _ => e.to_string(),
    })
}

/// `Config::log_budget` in a message as `--log-budget`.
fn settings_as_options(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("`Config::") {
        out.push_str(&rest[..at + 1]);
        let name = &rest[at + "`Config::".len()..];
        let end = name.find('`').unwrap_or(name.len());
        out.push_str(&flag(&name[..end]));
        rest = &name[end..];
    }
    out.push_str(rest);
    out
}

/// The option that sets a `Config` field or a tool's parameter
/// (`log_budget`: `--log-budget`, `kills`: `--kill`; `size/iterations`:
/// `--size/--iterations`). A name that is an option already stays.
fn flag(setting: &str) -> String {
    let one = |s: &str| match s {
        s if s.starts_with("--") => s.to_string(),
        "kills" => "--kill".to_string(),
        s => format!("--{}", s.replace('_', "-")),
    };
    setting.split('/').map(one).collect::<Vec<_>>().join("/")
}

fn build(job: &JobArgs, protocol: ProtocolKind) -> anyhow::Result<(AppKind, AppParams, Config)> {
    let what = &job.what;
    let app: AppKind = what.app.parse().map_err(usage)?;
    let params = AppParams {
        class: what.class.map(|c| c.to_ascii_uppercase()),
        size: what.size,
        iterations: what.iterations,
        imbalance: what.imbalance,
        transpose: what
            .transpose
            .as_deref()
            .map(str::parse)
            .transpose()
            .map_err(usage)?,
    };
    let n = iterations(app, &params).map_err(usage)?;
    let every = checkpoint_every(&job.checkpoint_every, n)?;
    let kills = parse_kills(&job.kills)?;
    let backend: Backend = job.backend.parse().map_err(usage)?;
    let mtbf = match (job.checkpoint_interval.as_str(), &job.mtbf) {
        ("fixed", None) => None,
        ("daly", Some(m)) => Some(*m),
        ("daly", None) => {
            return Err(usage(lazarus::Error::config(
                "--mtbf",
                "--checkpoint-interval daly needs the mean time between failures",
            )));
        }
        ("fixed", Some(_)) => {
            return Err(usage(lazarus::Error::config(
                "--mtbf",
                "only used with --checkpoint-interval daly",
            )));
        }
        (other, _) => {
            return Err(usage(lazarus::Error::config(
                "--checkpoint-interval",
                format!("`{other}` is neither `fixed` nor `daly`"),
            )));
        }
    };
    // No flag: the default (partner). Otherwise exactly the named levels;
    // `levels::partner_on` adds the partner copy when no in-memory level
    // is named.
    let mut levels = Vec::new();
    if job.storage.is_empty() {
        levels.push(LevelSpec::Partner);
    }
    for s in &job.storage {
        let l: LevelSpec = s.parse().map_err(usage)?;
        if !levels.contains(&l) {
            levels.push(l);
        }
    }
    let cfg = Config::new(job.ranks)
        .backend(backend)
        .protocol(protocol)
        .nodes(job.nodes)
        .kills(kills)
        .checkpoint_every(every)
        .mtbf(mtbf)
        .checkpoint_scheme(
            job.checkpoint_scheme
                .parse()
                .map_err(|e| usage(lazarus::Error::config("--checkpoint-scheme", e)))?,
        )
        .rma_log(
            job.rma_log
                .parse()
                .map_err(|e| usage(lazarus::Error::config("--rma-log", e)))?,
        )
        .storage(levels)
        .restart(job.restart.clone())
        .program(lazarus::apps::program(app, &params).map_err(usage)?)
        .log_budget(job.log_budget)
        .sets(match job.sets {
            Some(n) => SetRule::Consecutive(n),
            None => SetRule::default(),
        })
        .seed(job.seed)
        .iterations(n)
        .progress_bar(std::io::stdout().is_terminal())
        .listen(job.listen.parse().map_err(usage)?)
        .hosts(job.hosts.parse().map_err(usage)?)
        .heartbeat_timeout(heartbeat(job.heartbeat_timeout)?)
        .max_frame(job.max_frame)
        .get_fix(match job.get_fix.as_deref() {
            None => None,
            Some("all") => {
                return Err(usage(lazarus::Error::config(
                    "--get-fix",
                    "`all` compares the fixes: use it with lazarus bench",
                )));
            }
            Some(f) => Some(
                f.parse::<GetFix>()
                    .map_err(|e| usage(lazarus::Error::config("--get-fix", e)))?,
            ),
        })
        .check_cuts(job.check_cuts)
        .wave_interval(job.wave_interval);
    if !(0.0..=1.0).contains(&job.straggle) {
        return Err(usage(lazarus::Error::config(
            "--straggle",
            format!("{} is not a fraction from 0 to 1", job.straggle),
        )));
    }
    if job.straggle > 0.0 && backend != Backend::Sim {
        return Err(usage(lazarus::Error::config(
            "--straggle",
            "adversarial schedules are the simulator's (--backend sim)",
        )));
    }
    let cfg = job.proactive.apply(cfg)?;
    let cfg = if backend == Backend::Sim {
        let mut net = cfg.get_network();
        net.straggle = job.straggle;
        cfg.network(net)
    } else {
        cfg
    };
    cfg.validate().map_err(usage)?;
    Ok((app, params, cfg))
}

/// `--checkpoint-every` of a job of `n` iterations: N safe points (0:
/// never), or P% of the run (at least one safe point).
fn checkpoint_every(text: &str, n: u64) -> anyhow::Result<u64> {
    let bad = |why: &str| {
        usage(lazarus::Error::config(
            "--checkpoint-every",
            format!("`{text}` {why}"),
        ))
    };
    match text.strip_suffix('%') {
        Some(p) => {
            let p: f64 = (p.parse().ok())
                .filter(|p: &f64| *p > 0.0 && *p <= 100.0)
                .ok_or_else(|| bad("is not a percentage in (0, 100]"))?;
            Ok(((n as f64 * p / 100.0).round() as u64).max(1))
        }
        None => text.parse().map_err(|_| bad("is neither N nor P%")),
    }
}

/// `--kill` specifications.
fn parse_kills(specs: &[String]) -> anyhow::Result<Vec<KillSpec>> {
    specs
        .iter()
        .map(|k| k.parse::<KillSpec>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)
}

/// `--heartbeat-timeout`, at least `MIN_HEARTBEAT_TIMEOUT`.
fn heartbeat(t: Duration) -> anyhow::Result<Duration> {
    let min = lazarus::config::MIN_HEARTBEAT_TIMEOUT;
    if t < min {
        return Err(usage(lazarus::Error::config(
            "--heartbeat-timeout",
            format!(
                "{} is too short to tell a slow rank from a dead one (at least {})",
                humantime::format_duration(t),
                humantime::format_duration(min)
            ),
        )));
    }
    Ok(t)
}

/// A duration as `humantime` reads it (`90s`, `15m`, `1d`, `200ms`, `1h
/// 30m`), or a bare number of `unit`s: what every duration option took
/// before, in the unit its help still names. Duration options allow
/// hyphen values so that `-3s` is refused here, naming the option, rather
/// than taken for an unknown flag.
fn duration_in(text: &str, unit: Duration, unit_name: &str) -> Result<Duration, String> {
    let t = text.trim();
    if let Ok(n) = t.parse::<f64>() {
        return (n >= 0.0)
            .then(|| Duration::try_from_secs_f64(n * unit.as_secs_f64()).ok())
            .flatten()
            .ok_or_else(|| {
                format!("`{text}` is not a duration: {unit_name} must be finite and not negative")
            });
    }
    humantime::parse_duration(t).map_err(|e| {
        format!("`{text}` is not a duration ({e}); write e.g. 90s, 15m, 2h, 1d, 200ms, or a bare number of {unit_name}")
    })
}

/// A duration option whose bare numbers are seconds.
fn secs(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::from_secs(1), "seconds")
}

/// [`secs`], longer than zero.
fn positive_secs(text: &str) -> Result<Duration, String> {
    secs(text).and_then(|d| {
        if d.is_zero() {
            Err(format!("`{text}` must be longer than zero"))
        } else {
            Ok(d)
        }
    })
}

/// A duration option whose bare numbers are milliseconds.
fn millis(text: &str) -> Result<Duration, String> {
    duration_in(text, Duration::from_millis(1), "milliseconds")
}

/// Check before any work that the file `option` names can be written: a
/// run of minutes must not end in "cannot write" with its results lost.
/// An existing file is opened for writing without truncating it (a FIFO
/// without a reader is refused rather than waited for); a new one is
/// created and removed again.
fn check_output(option: &str, path: &std::path::Path) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let refuse = |why: String| {
        usage(lazarus::Error::config(
            option,
            format!("cannot write {}: {why}", path.display()),
        ))
    };
    if path.is_dir() {
        return Err(refuse("it is a directory".into()));
    }
    let open = |create| {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(create)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
    };
    // The rank processes of the processes backend run the same command
    // line and check it too, at the same moment: a file that another of
    // them created (or removed) in between is no reason to refuse (that
    // refusal was a rank exiting 2 at its start: a spurious failure).
    use std::io::ErrorKind::{AlreadyExists, NotFound};
    match open(false) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == NotFound => match open(true) {
            Ok(_) => match std::fs::remove_file(path) {
                Err(e) if e.kind() != NotFound => Err(refuse(e.to_string())),
                _ => Ok(()),
            },
            Err(e) if e.kind() == AlreadyExists => Ok(()),
            Err(e) => Err(refuse(e.to_string())),
        },
        Err(e) => Err(refuse(e.to_string())),
    }
}

/// [`check_output`] for an optional path.
fn check_output_opt(option: &str, path: &Option<PathBuf>) -> anyhow::Result<()> {
    path.as_deref().map_or(Ok(()), |p| check_output(option, p))
}

/// Write a report as JSON, with the schema and version every report
/// carries (`tools::Versioned`).
fn write_json(path: &PathBuf, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(&lazarus::tools::Versioned::new(value))?;
    std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
}

/// Write a run's timeline as a Chrome trace, and say so.
fn write_trace(path: &PathBuf, trace: &lazarus::trace::Trace, title: &str) -> anyhow::Result<()> {
    let text = serde_json::to_string(&trace.to_chrome(title))?;
    std::fs::write(path, &text).with_context(|| format!("writing {}", path.display()))?;
    println!(
        "trace: {} events of {} ranks, {}, written to {} (open it in ui.perfetto.dev, or `lazarus report {} --svg OUT`)",
        trace.len(),
        trace.ranks.len(),
        human_bytes(text.len() as u64),
        path.display(),
        path.display()
    );
    Ok(())
}

/// `lazarus run`'s first line, and the generation a `--restart` starts from.
fn print_run_header(app: AppKind, cfg: &lazarus::Config, args: &RunArgs) -> anyhow::Result<()> {
    println!(
        "lazarus run {app}: {} ranks on {} node(s), backend {}, protocol {}, checkpoint every {} of {} safe points, kills [{}]",
        cfg.get_ranks(),
        cfg.get_nodes(),
        cfg.get_backend(),
        cfg.get_protocol(),
        cfg.get_checkpoint_every(),
        cfg.get_iterations().unwrap_or(0),
        args.job.kills.join(", ")
    );
    if let Some(dir) = cfg.get_restart() {
        let plan = lazarus::store::disk::plan_restart(dir, cfg)
            .map_err(usage)?
            .1;
        for s in &plan.skipped {
            eprintln!("warning: skipping {s}");
        }
        match plan.generation {
            Some(g) => println!("restarting from generation {g} in {}", dir.display()),
            None => {
                return Err(usage(lazarus::Error::config(
                    "--restart",
                    format!(
                        "{} holds no committed generation usable by {} ranks (see `lazarus inspect {}`)",
                        dir.display(),
                        cfg.get_ranks(),
                        dir.display()
                    ),
                )));
            }
        }
    }
    Ok(())
}

fn cmd_run(args: &RunArgs) -> anyhow::Result<bool> {
    let protocol: ProtocolKind = args.protocol.parse().map_err(usage)?;
    let (app, params, mut cfg) = build(&args.job, protocol)?;
    if args.trace.is_some() {
        cfg = cfg.traced();
    }
    if launched() || lazarus::driver::mpi_env::self_launched() {
        // A rank process of `--backend processes` (or `mpi`): run the rank
        // and leave the printing to the launcher.
        run_app(app, &params, &cfg);
        return Ok(true);
    }
    // A substitute spawned by a repair (ULFM) prints the summary only if
    // it took rank 0's place: the header was printed by the first rank 0.
    let mut substitute_root = None;
    if cfg.get_backend() == Backend::Mpi
        && let Some(rank) = lazarus::driver::mpi_env::launcher_rank()
    {
        // Started by the user's `mpiexec`: MPI says how many ranks; rank 0
        // prints the job's summary, the others only their errors.
        let substitute = lazarus::driver::mpi_env::substitute();
        if !substitute && let Some(n) = lazarus::driver::mpi_env::launcher_size() {
            let nodes = cfg.get_nodes().min(n);
            cfg = cfg.ranks(n).nodes(nodes);
        }
        if rank != 0 || substitute {
            let run = run_app(app, &params, &cfg);
            let rank = lazarus::driver::mpi_env::job_rank().unwrap_or(rank);
            if !substitute || rank != 0 {
                if let Err(e) = &run.outcome {
                    eprintln!("error: rank {rank}: {e}");
                }
                return Ok(run.outcome.is_ok());
            }
            substitute_root = Some(run);
        }
    }
    // Not in rank processes: they would create and remove the file at the
    // same time as one another.
    check_output_opt("--json", &args.json)?;
    check_output_opt("--trace", &args.trace)?;
    if substitute_root.is_none() {
        print_run_header(app, &cfg, args)?;
    }
    let run = substitute_root.unwrap_or_else(|| run_app(app, &params, &cfg));
    if let Err(e @ lazarus::Error::Config { .. }) = &run.outcome {
        return Err(usage(e.clone()));
    }
    let summary = RunSummary::new(app, &params, &cfg, &run);
    let st = &summary.stats;
    let unfired = unfired_kills(st);
    println!(
        "wall {:.3} s; failures {} ({} ranks killed); ranks rolled back {}; recovery {:.4} s; checkpoints {} ({}, longest {:.4} s){unfired}",
        st.wall_s,
        st.failures,
        st.ranks_killed,
        st.ranks_rolled_back,
        st.recovery_s,
        st.checkpoints,
        human_bytes(st.checkpoint_bytes),
        st.checkpoint_s
    );
    if st.gsync_checkpoints + st.locks_checkpoints + st.abandoned_cuts > 0 {
        let daly = match (st.daly_every, st.daly_interval_s, st.daly_cost_s) {
            (Some(every), Some(tau), Some(cost)) => format!(
                "; Daly's interval {tau:.4} s for a {cost:.4} s checkpoint: every {every} safe points"
            ),
            _ => String::new(),
        };
        println!(
            "coordination (003 §3.1.2): {} checkpoint(s) by gsync (captured right after a fence), {} by locks (a barrier first), {} gsync cut(s) abandoned and taken again{daly}",
            st.gsync_checkpoints, st.locks_checkpoints, st.abandoned_cuts
        );
    }
    if st.accesses_logged + st.gets_logged + st.access_fallbacks > 0 {
        println!(
            "access log (003 §3.2): {} accesses ({}) logged at their origin, {} gets ({}) at their target, peak {} on one rank; {} replayed into recovering windows ({} held for them), {} gets answered from the log, {} not issued again by a re-execution; {} demand checkpoints asked for; {} recoveries fell back (N or M flag set, get logs lost, or passive-target epochs to replay)",
            st.accesses_logged,
            human_bytes(st.access_log_bytes),
            st.gets_logged,
            human_bytes(st.get_log_bytes),
            human_bytes(st.peak_access_log_bytes),
            st.accesses_replayed,
            st.accesses_held,
            st.gets_replayed,
            st.accesses_skipped,
            st.demand_checkpoints,
            st.access_fallbacks
        );
    }
    if st.log_records > 0 || st.job_restarts > 0 {
        println!(
            "log: {} records ({}) logged, peak {} in memory on one rank, {} spilled, {} determinants, {} resent, {} collectives from the log; job restarts {}",
            st.log_records,
            human_bytes(st.log_bytes),
            human_bytes(st.peak_log_bytes),
            human_bytes(st.spilled_log_bytes),
            st.determinants,
            st.messages_resent,
            st.collectives_from_log,
            st.job_restarts
        );
    }
    if let Some(m) = &st.migration {
        print!(
            "{}",
            lazarus::tools::scale::describe_migration(
                m,
                cfg.get_protocol().name(),
                cfg.get_ranks(),
                cfg.get_nodes(),
                st.ranks_rolled_back
            )
        );
    }
    if st.false_suspicions > 0 {
        println!(
            "failure detector: {} false suspicion(s) (ranks silent past its timeout, heard from again)",
            st.false_suspicions
        );
    }
    if let (Some(peak), Some(mean), Some(faults)) =
        (st.peak_rss_bytes, st.mean_peak_rss_bytes, st.minor_faults)
    {
        println!(
            "memory: peak resident set {} (largest rank process), {} (mean); {} minor page faults",
            human_bytes(peak),
            human_bytes(mean),
            faults
        );
    }
    if let (Some(user), Some(system)) = (st.user_cpu_s, st.system_cpu_s) {
        println!("cpu: {user:.3} s user, {system:.3} s system (all rank processes)");
    }
    if st.set_syncs > 0 || st.spared_log_bytes > 0 {
        println!(
            "correlated sets (up to {} ranks): {} sent inside sets without a log copy; {} set synchronisations, mean {:.1} us, longest {:.1} us",
            st.set_size,
            human_bytes(st.spared_log_bytes),
            st.set_syncs,
            st.set_sync_s * 1e6,
            st.set_sync_max_s * 1e6
        );
    }
    let w = &st.wave;
    if w.first > 0 {
        println!(
            "wave (000 §IV): {} first markers, {} second, {} flush + {} answers; {} one-sided requests refused until their origin entered",
            w.first, w.second, w.flush, w.flush_answers, w.refused
        );
    }
    if let Some(c) = &st.cuts {
        println!(
            "cuts: {} checked, {} crossed ({} orphan legs, {} replies read before the target's cut and written after the origin's), {} overlapped ({} operations in flight at a cut), {} legs unmatched",
            c.checked,
            c.crossed,
            c.orphans,
            c.lost_replies,
            c.overlapped,
            c.overlapping_operations,
            c.unmatched_legs
        );
        for f in c.findings.iter().take(3) {
            println!("  cut {}: {}", f.generation, f.what);
        }
    }
    if st.markers > 0 {
        println!(
            "snapshots: median latency {:.4} s (rank 0: recording to commit), {} markers, {} messages recorded as channel state ({}), {} held until their receiver recorded",
            st.snapshot_latency_s,
            st.markers,
            st.channel_messages,
            human_bytes(st.channel_bytes),
            st.held_messages
        );
    }
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
    if st.ranks_restarted_from_scratch > 0 {
        eprintln!(
            "warning: {} rank restart(s) began from the beginning: no complete committed checkpoint survived (or none existed yet)",
            st.ranks_restarted_from_scratch
        );
    }
    if st.needless_restarts > 0 {
        eprintln!(
            "warning: {} of those rank(s) had a stored checkpoint with a holder alive: recovery \
             should have restored it",
            st.needless_restarts
        );
    }
    if let Some(path) = &args.json {
        write_json(path, &summary)?;
    }
    if let (Some(path), Some(trace)) = (&args.trace, &st.trace) {
        write_trace(
            path,
            trace,
            &format!("lazarus run {app} ({})", cfg.get_protocol()),
        )?;
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
            let e = said(e);
            eprintln!("error: {e}");
            println!("NOT VERIFIED {e}");
            Ok(false)
        }
    }
}

fn cmd_bench(args: &BenchArgs) -> anyhow::Result<bool> {
    if args.job.get_fix.is_some() {
        return cmd_table_one(args);
    }
    let protocols = protocols(&args.protocols)?;
    let (app, params, cfg) = build(&args.job, validated_as(&protocols))?;
    check_output_opt("--json", &args.json)?;
    check_output_opt("--plot", &args.plot)?;
    let cfg = cfg.progress_bar(false);
    if !cfg.get_kills().is_empty() {
        // The failure-free runs are the baseline of every ratio: a kill
        // there would fail `none` and inflate the others.
        return Err(usage(lazarus::Error::config(
            "--kill",
            "lazarus bench runs failure-free: give kills with --failure SPEC (each recovering \
             protocol is then also run with them), not --kill",
        )));
    }
    let failure = parse_kills(&args.failure)?;
    for k in &failure {
        k.validate(
            &cfg.placement().map_err(usage)?,
            cfg.get_iterations().unwrap_or(u64::MAX),
        )
        .map_err(usage)?;
    }
    check_output_opt("--trace", &args.trace)?;
    let traced = args.trace.is_some();
    let progress = Progress::new();
    let report = bench(
        app,
        &params,
        &cfg,
        &protocols,
        args.reps,
        &failure,
        traced,
        |e| match e {
            BenchEvent::Start {
                run,
                of,
                protocol,
                with_failure,
                with_warnings,
                traced,
            } => progress.start(
                run,
                of,
                format!(
                    "{protocol}{}{}{}",
                    if with_failure { " with failure" } else { "" },
                    if with_warnings { " and warning" } else { "" },
                    if traced { " traced" } else { "" }
                ),
            ),
            BenchEvent::Done(r) => progress.eprintln(format!(
                "  {:<12} wall {:.4} s  {}{}{}",
                r.protocol,
                r.stats.wall_s,
                if r.stats.failures > 0 {
                    "(with failure) "
                } else {
                    ""
                },
                if r.stats.trace.is_some() {
                    "(traced) "
                } else {
                    ""
                },
                if r.verified {
                    "verified"
                } else {
                    "NOT VERIFIED"
                }
            )),
        },
    );
    progress.finish();
    let report = report.map_err(usage)?;
    println!(
        "bench {app}{} on {} ranks ({} node{}), backend {}, {} reps, {}",
        report
            .class
            .as_deref()
            .map(|c| format!(" class {c}"))
            .unwrap_or_default(),
        report.ranks,
        report.nodes,
        if report.nodes == 1 { "" } else { "s" },
        report.backend,
        report.reps,
        match cfg.get_checkpoint_every() {
            0 => "no periodic checkpoint".to_string(),
            n => format!("checkpoint every {n} safe points"),
        }
    );
    println!(
        "{:<14} {:>12} {:>10} {:>8} {:>15}  verified  value",
        "protocol", "median s", "ratio", "paired", "paired 95% CI"
    );
    // A confidence interval as the table shows it (none under 6 reps).
    let ci = |c: Option<[f64; 2]>| c.map_or("-".to_string(), |[lo, hi]| format!("{lo:.3}-{hi:.3}"));
    let mut ok = true;
    let first_value = report.protocols.first().map(|p| p.value.clone());
    for p in &report.protocols {
        println!(
            "{:<14} {:>12.4} {:>10.3} {:>8.3} {:>15}  {:<8}  {}",
            p.protocol,
            p.median_wall_s,
            p.ratio,
            p.paired_ratio,
            ci(p.paired_ratio_ci95),
            p.verified_all,
            p.value
        );
        ok &= p.verified_all && Some(&p.value) == first_value.as_ref();
        for f in p.failure.iter().chain(&p.proactive) {
            let warned = if f.warnings.is_empty() {
                String::new()
            } else {
                format!(" warned {}", f.warnings.join(" "))
            };
            println!(
                "    with {}{warned}: median {:.4} s, {:.3}x its failure-free time (paired {:.3}x, 95% CI {}), \
                 recovery {:.4} s ({:.1}% of its median), ranks rolled back {} (per run){}",
                f.kills.join(" "),
                f.median_wall_s,
                f.ratio_to_failure_free,
                f.paired_ratio_to_failure_free,
                ci(f.paired_ratio_to_failure_free_ci95),
                f.median_recovery_s,
                100.0 * f.median_recovery_s / f.median_wall_s,
                f.ranks_rolled_back
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
                if f.verified_all { "" } else { "  NOT VERIFIED" }
            );
            if let (Some(c), Some(r)) = (f.median_cpu_s, f.paired_cpu_ratio_to_failure_free) {
                println!(
                    "    cpu with {}: median {c:.3} s, {r:.3}x its failure-free cpu (paired; the killed processes' time before their death is not counted)",
                    f.kills.join(" ")
                );
            }
            ok &= f.verified_all;
        }
        if let Some(t) = &p.traced {
            println!(
                "    traced: median {:.4} s, {:.3}x its untraced time (paired, 95% CI {}), {:.0} events per rank per second",
                t.median_wall_s,
                t.paired_ratio_to_untraced,
                ci(t.paired_ratio_to_untraced_ci95),
                t.events_per_rank_s
            );
            ok &= t.runs.iter().all(|r| r.verified);
        }
        // The median over some of the protocol's runs of one of their
        // statistics; `per`: over all of them.
        let over = |runs: &[&lazarus::JobStats], f: fn(&lazarus::JobStats) -> f64| {
            median(&runs.iter().map(|s| f(s)).collect::<Vec<_>>())
        };
        let all: Vec<&lazarus::JobStats> = p.runs.iter().map(|r| &r.stats).collect();
        let per = |f| over(&all, f);
        if p.runs.iter().any(|r| r.stats.log_records > 0) {
            println!(
                "    log: {:.0} records ({}), peak {:.0} records ({}) on one rank, \
                 {:.0} determinants",
                per(|s| s.log_records as f64),
                human_bytes_f64(per(|s| s.log_bytes as f64)),
                per(|s| s.peak_log_records as f64),
                human_bytes_f64(per(|s| s.peak_log_bytes as f64)),
                per(|s| s.determinants as f64)
            );
        }
        let with_pieces: Vec<&lazarus::JobStats> = (all.iter().copied())
            .filter(|s| s.checkpoint_pieces > 0)
            .collect();
        if !with_pieces.is_empty() {
            // What the checkpoints cost apart from logging: under message
            // logging a piece carries the sender's log, which on a short
            // run at the default interval can be most of the overhead.
            // Medians over the runs that took any.
            let of = |f| over(&with_pieces, f);
            let in_checkpoints = of(|s| s.checkpoint_s_total);
            println!(
                "    checkpoints: {:.0} generations per run, {} per piece, {:.4} s per rank \
                 in them ({:.1}% of the median wall time), snapshot latency {:.4} s (median, rank 0)",
                of(|s| s.checkpoints as f64),
                human_bytes_f64(of(
                    |s| s.checkpoint_bytes as f64 / s.checkpoint_pieces as f64
                )),
                in_checkpoints,
                100.0 * in_checkpoints / p.median_wall_s,
                of(|s| s.snapshot_latency_s)
            );
        }
        if p.runs.iter().any(|r| r.stats.log_records > 0) {
            // Where a logging protocol's failure-free cost goes, beside its
            // checkpoints (#40 Build 4): the send path.
            let on_sends = per(|s| s.send_logging_s_total);
            println!(
                "    logging on the send path: {on_sends:.4} s per rank ({:.1}% of the median wall time)",
                100.0 * on_sends / p.median_wall_s,
            );
        }
        if p.runs.iter().all(|r| r.stats.mean_peak_rss_bytes.is_some()) {
            println!(
                "    memory: peak resident set {} per rank process (mean), {} (largest); {:.0} minor page faults",
                human_bytes_f64(per(|s| s.mean_peak_rss_bytes.unwrap_or(0) as f64)),
                human_bytes_f64(per(|s| s.peak_rss_bytes.unwrap_or(0) as f64)),
                per(|s| s.minor_faults.unwrap_or(0) as f64)
            );
        }
        if p.runs.iter().all(|r| r.stats.system_cpu_s.is_some()) {
            println!(
                "    cpu: {:.3} s user, {:.3} s system (all rank processes)",
                per(|s| s.user_cpu_s.unwrap_or(0.0)),
                per(|s| s.system_cpu_s.unwrap_or(0.0))
            );
        }
        if p.runs.iter().any(|r| r.stats.markers > 0) {
            println!(
                "    snapshots: {:.0} markers, {:.0} channel-state messages ({}), {:.0} held",
                per(|s| s.markers as f64),
                per(|s| s.channel_messages as f64),
                human_bytes_f64(per(|s| s.channel_bytes as f64)),
                per(|s| s.held_messages as f64)
            );
        }
        if p.runs.iter().any(|r| r.stats.set_syncs > 0) {
            println!(
                "    correlated sets of up to {:.0}: {} spared from the log, set sync mean {:.1} us, longest {:.1} us",
                per(|s| s.set_size as f64),
                human_bytes_f64(per(|s| s.spared_log_bytes as f64)),
                per(|s| s.set_sync_s * 1e6),
                per(|s| s.set_sync_max_s * 1e6)
            );
        }
        if app == AppKind::Pingpong
            && let Some(points) = p.metrics.as_array()
        {
            for pt in points.iter().filter(|pt| {
                matches!(
                    pt["bytes"].as_u64(),
                    Some(8) | Some(1048576) | Some(4194304)
                )
            }) {
                let f = |k: &str| pt[k].as_f64().unwrap_or(f64::NAN);
                // Bandwidths also as a ratio to the reference protocol's.
                let reference = report.protocols.iter().find(|r| r.protocol == "none");
                let of_reference = |k: &str| match reference {
                    Some(r) if r.protocol != p.protocol => r
                        .metrics
                        .as_array()
                        .and_then(|ps| ps.iter().find(|q| q["bytes"] == pt["bytes"]))
                        .and_then(|q| q[k].as_f64())
                        .map(|b| {
                            use lazarus::tools::bench::{paired_ratio_ci95_key, paired_ratio_key};
                            let paired = pt[paired_ratio_key(k)].as_f64().unwrap_or(f64::NAN);
                            let ci =
                                match pt[paired_ratio_ci95_key(k)].as_array().map(Vec::as_slice) {
                                    Some([lo, hi]) => format!(
                                        ", 95% CI {:.2}-{:.2}",
                                        lo.as_f64().unwrap_or(f64::NAN),
                                        hi.as_f64().unwrap_or(f64::NAN)
                                    ),
                                    _ => String::new(),
                                };
                            format!(" ({:.2}x none, paired {paired:.2}x{ci})", f(k) / b)
                        })
                        .unwrap_or_default(),
                    _ => String::new(),
                };
                println!(
                    "    {:>7}: latency {:.2} us, bandwidth {:.0} MB/s{}, forwarded {:.0} MB/s{}",
                    lazarus::tools::binary_size(pt["bytes"].as_u64().unwrap_or(0)),
                    f("latency_us"),
                    f("bandwidth_mb_s"),
                    of_reference("bandwidth_mb_s"),
                    f("forwarded_bandwidth_mb_s"),
                    of_reference("forwarded_bandwidth_mb_s"),
                );
            }
        }
    }
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    if let Some(path) = &args.trace {
        let last = (report.protocols.iter().rev())
            .filter_map(|p| p.traced.as_ref())
            .find_map(|t| Some((t.runs.last()?, t.runs.last()?.stats.trace.as_ref()?)));
        if let Some((run, trace)) = last {
            write_trace(
                path,
                trace,
                &format!("lazarus bench {app} ({})", run.protocol),
            )?;
        }
    }
    if let Some(path) = &args.plot {
        // Drawn from the report's JSON, as `lazarus plot` draws a saved one.
        let json = serde_json::to_string(&report).context("cannot encode the report")?;
        lazarus::tools::plot::plot_bench(&json, path)?;
        println!("plot written to {}", path.display());
    }
    if !ok {
        println!("NOT VERIFIED: a run failed verification or protocols disagree on the value");
    }
    Ok(ok)
}

/// The progress of `bench`'s runs or `chaos`'s cases on stderr: run i of
/// N, what it runs, the time elapsed and the time left. Only when stderr is
/// a terminal, so never in a test's or CI's output; the lines printed
/// meanwhile go above the bar.
struct Progress(Option<indicatif::ProgressBar>);

impl Progress {
    fn new() -> Self {
        Progress(std::io::stderr().is_terminal().then(|| {
            // Drawn from the first run on (not during a reference run).
            let bar = indicatif::ProgressBar::with_draw_target(
                Some(0),
                indicatif::ProgressDrawTarget::hidden(),
            );
            bar.set_style(
                indicatif::ProgressStyle::with_template(
                    "{msg} [{elapsed_precise} elapsed, ETA {eta}] {wide_bar}",
                )
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            bar
        }))
    }

    /// Run `done` (from 0) of `of` starts, running `what`.
    fn start(&self, done: usize, of: usize, what: String) {
        if let Some(bar) = &self.0 {
            bar.set_length(of as u64);
            bar.set_position(done as u64);
            bar.set_message(format!("run {} of {of}: {what}", done + 1));
            if bar.is_hidden() {
                bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
                bar.tick();
            }
        }
    }

    /// `line` on stderr, above the bar.
    fn eprintln(&self, line: String) {
        match &self.0 {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// `line` on stdout, with the bar out of the way.
    fn println(&self, line: String) {
        match &self.0 {
            Some(bar) => bar.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.0 {
            bar.finish_and_clear();
        }
    }
}

fn protocols(list: &str) -> anyhow::Result<Vec<ProtocolKind>> {
    list.split(',')
        .map(|p| p.trim().parse::<ProtocolKind>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(usage)
}

/// The protocol a comparison's options are validated as: one that takes
/// every option given (`--sets`: `correlated`; `--log-budget`: a logging
/// protocol) when one is chosen; each run then drops what its protocol
/// does not take (`Config::compared_under`).
fn validated_as(chosen: &[ProtocolKind]) -> ProtocolKind {
    if chosen.contains(&ProtocolKind::Correlated) {
        return ProtocolKind::Correlated;
    }
    (chosen.iter().copied())
        .find(|p| p.logs_messages())
        .unwrap_or(ProtocolKind::None)
}

fn cmd_chaos(args: &ChaosArgs) -> anyhow::Result<bool> {
    use lazarus::tools::chaos::{ChaosEvent, ChaosPlan, Verdict, chaos};
    let job = JobArgs {
        what: args.what.clone(),
        ranks: args.ranks,
        nodes: args.nodes,
        backend: args.backend.clone(),
        listen: args.listen.clone(),
        hosts: "local".into(),
        heartbeat_timeout: Config::default().get_heartbeat_timeout(),
        max_frame: lazarus::config::DEFAULT_MAX_FRAME,
        kills: Vec::new(),
        proactive: ProactiveArgs {
            balance: "greedy".into(),
            ..ProactiveArgs::default()
        },
        checkpoint_every: args.checkpoint_every.clone(),
        checkpoint_interval: "fixed".into(),
        mtbf: None,
        checkpoint_scheme: args.checkpoint_scheme.clone(),
        rma_log: "puts-gets".into(),
        storage: args.storage.clone(),
        restart: None,
        log_budget: args.log_budget,
        sets: args.sets,
        seed: args.from,
        get_fix: None,
        check_cuts: false,
        wave_interval: None,
        straggle: 0.0,
    };
    let chosen = protocols(&args.protocols)?;
    let (app, params, base) = build(&job, validated_as(&chosen))?;
    check_output_opt("--json", &args.json)?;
    check_output_opt("--trace", &args.trace)?;
    let base = match args.trace {
        Some(_) => base.traced(),
        None => base,
    };
    if base
        .get_storage()
        .iter()
        .any(|l| matches!(l, LevelSpec::Disk { .. }))
    {
        return Err(usage(lazarus::Error::config(
            "--storage",
            "chaos cases would all write to one disk directory: use in-memory levels \
             (partner, xor, rs:M)",
        )));
    }
    let schedules = args.schedules.parse().map_err(usage)?;
    let plan = ChaosPlan {
        app,
        params,
        backend: base.get_backend(),
        base,
        protocols: chosen,
        from: args.from,
        seeds: args.seeds,
        bound: args.bound_s,
        schedules,
    };
    let progress = Progress::new();
    let report = chaos(&plan, |e| {
        let c = match e {
            ChaosEvent::Start {
                case,
                of,
                protocol,
                seed,
            } => return progress.start(case, of, format!("{protocol}, seed {seed}")),
            ChaosEvent::Done(c) => c,
        };
        if c.verdict != Verdict::Pass {
            progress.println(format!(
                "seed {} {}: {} (kills {})\n  reproduce: {}",
                c.seed,
                c.protocol,
                c.verdict,
                c.kills.join(" "),
                c.reproduce
            ));
        } else {
            let trace = if c.trace_hash.is_empty() {
                String::new()
            } else {
                format!(", trace {}", c.trace_hash)
            };
            let restarts = if c.job_restarts > 0 {
                format!(", {} necessary job restart(s)", c.job_restarts)
            } else {
                String::new()
            };
            progress.eprintln(format!(
                "seed {} {}: pass ({} failures{restarts}{trace}, {:.2} s)",
                c.seed, c.protocol, c.failures, c.wall_s
            ));
        }
    });
    progress.finish();
    let report = report.map_err(usage)?;
    println!(
        "chaos {}: {} cases, {} failed ({} declared unrecoverable by the protocol, {} hung or \
         timed out), {} passed after a necessary job restart, {:.1} s; every case must print {}",
        report.app,
        report.cases,
        report.failed,
        report.unrecoverable,
        report.hangs,
        report.necessary_restarts,
        report.wall_s,
        report.expected
    );
    if let Some(path) = &args.json {
        write_json(path, &report)?;
    }
    if let Some(path) = &args.trace {
        match (report.failures.iter()).find_map(|c| Some((c, c.trace.as_ref()?))) {
            Some((c, trace)) => write_trace(
                path,
                trace,
                &format!(
                    "lazarus chaos {}: seed {} ({})",
                    report.app, c.seed, c.protocol
                ),
            )?,
            None if report.failed == 0 => {
                println!("trace: every case passed: {} not written", path.display());
            }
            None => println!(
                "trace: no failing case returned a timeline (they timed out): {} not written",
                path.display()
            ),
        }
    }
    Ok(report.failed == 0)
}

fn cmd_sim(args: &SimArgs) -> anyhow::Result<bool> {
    use lazarus::apps::patterns::{Pattern, PatternParams};
    use lazarus::tools::scale::{plot_iterations, plot_svg, render, render_proactive, scale_study};
    let pattern: Pattern = args.app.parse().map_err(usage)?;
    let params = PatternParams {
        iterations: args.iterations,
        compute_s: args.compute_s.as_secs_f64(),
        halo_bytes: args.halo_bytes,
        reduce_len: args.reduce_len,
        imbalance: args.imbalance,
        state_bytes: args.state_bytes,
    };
    let counts: Vec<usize> = args
        .ranks
        .split(',')
        .map(|c| {
            c.trim().parse::<usize>().map_err(|e| {
                usage(lazarus::Error::config(
                    "ranks",
                    format!("`{c}` is not a rank count ({e}); write e.g. 4096 or 1024,4096,16384"),
                ))
            })
        })
        .collect::<anyhow::Result<_>>()?;
    if args.ranks_per_node == Some(0) {
        return Err(usage(lazarus::Error::config(
            "ranks_per_node",
            "at least one rank per node",
        )));
    }
    let kills = parse_kills(&args.kills)?;
    let configs = counts
        .iter()
        .map(|&ranks| {
            let nodes = args
                .ranks_per_node
                .map_or(args.nodes, |k| ranks.div_ceil(k));
            let cfg = Config::new(ranks)
                .backend(Backend::Sim)
                .nodes(nodes)
                .kills(kills.clone())
                .checkpoint_every(checkpoint_every(&args.checkpoint_every, args.iterations)?)
                .seed(args.seed)
                .iterations(args.iterations);
            let cfg = args.proactive.apply(cfg)?;
            cfg.validate().map_err(usage)?;
            Ok(cfg)
        })
        .collect::<anyhow::Result<Vec<Config>>>()?;
    check_output_opt("--json", &args.json)?;
    check_output_opt("--plot", &args.plot)?;
    let protocols = protocols(&args.protocols)?;
    let mut rows = Vec::new();
    for base in &configs {
        let these = scale_study(pattern, &params, base, &protocols).map_err(usage)?;
        if configs.len() > 1 {
            // A study's largest counts take minutes: say each as it ends.
            for r in &these {
                eprintln!(
                    "{} ranks, {}: {} in {:.1} s",
                    r.ranks,
                    r.protocol,
                    if r.verified {
                        "verified"
                    } else {
                        "NOT verified"
                    },
                    r.wall_s
                );
            }
        }
        rows.extend(these);
    }
    print!("{}", render(&rows));
    print!("{}", render_proactive(&rows));
    if let Some(path) = &args.json {
        #[derive(serde::Serialize)]
        struct Rows<'a> {
            rows: &'a [lazarus::tools::scale::ScaleRow],
        }
        write_json(path, &Rows { rows: &rows })?;
    }
    if let Some(path) = &args.plot {
        // With warnings, 001 Fig. 5; otherwise the scale study.
        if args.proactive.warnings.is_empty() {
            plot_svg(&rows, path)?;
        } else {
            plot_iterations(&rows, path)?;
        }
    }
    let ok = rows.iter().all(|r| r.verified);
    if !ok {
        println!("NOT VERIFIED: a pattern run failed its check");
    }
    Ok(ok)
}

fn cmd_model(args: &ModelArgs) -> anyhow::Result<bool> {
    check_output_opt("--plot", &args.plot)?;
    use lazarus::tools::model::{
        FIG10C_FRACTIONS, daly_interval, fig10c_table, plot_svg, render_table,
    };
    match (args.checkpoint_cost, args.mtbf) {
        (Some(cost), Some(mtbf)) => {
            let (cost, mtbf) = (cost.as_secs_f64(), mtbf.as_secs_f64());
            let tau = daly_interval(cost, mtbf).map_err(usage)?;
            println!(
                "Daly's optimal interval (003 §6.1): checkpoint cost {cost} s, MTBF {mtbf} s -> compute {tau:.3} s between checkpoints"
            );
        }
        (None, None) => {}
        _ => {
            return Err(usage(lazarus::Error::config(
                "--checkpoint-cost/--mtbf",
                "give both to compute Daly's interval",
            )));
        }
    }
    let hierarchy = if args.levels.is_empty() {
        lazarus::tools::model::tsubame2()
    } else {
        let levels = args
            .levels
            .iter()
            .map(|l| parse_level(l))
            .collect::<anyhow::Result<Vec<_>>>()?;
        lazarus::tools::model::Hierarchy::new(levels).map_err(usage)?
    };
    if let Some(g) = args.group_size {
        let p = hierarchy.p_cf(g, args.t_aware).map_err(usage)?;
        let names: Vec<&str> = hierarchy.levels.iter().map(|l| l.name.as_str()).collect();
        println!(
            "P_cf per day = {p:.4e} for |G| = {g} (m = 1), topology-aware at level {} of [{}]{}",
            args.t_aware,
            names.join(", "),
            if hierarchy.is_feasible(g, args.t_aware) {
                ""
            } else {
                " (placement infeasible: the level has fewer elements than |G|)"
            }
        );
        if !args.levels.is_empty() {
            return Ok(true);
        }
    } else if !args.levels.is_empty() {
        return Err(usage(lazarus::Error::config(
            "--group-size",
            "give the checksum-group size to evaluate a custom hierarchy",
        )));
    }
    let rows = fig10c_table(args.processes, FIG10C_FRACTIONS).map_err(usage)?;
    println!(
        "P_cf per day (003 eq. 7-9, TSUBAME2.0 fits of §7.1) for N = {} processes, one checksum rank per group:",
        args.processes
    );
    print!("{}", render_table(&rows));
    if let Some(path) = &args.plot {
        plot_svg(&rows, path).map_err(usage)?;
        println!("plot written to {}", path.display());
    }
    Ok(true)
}

fn main() -> ExitCode {
    if let Err(err) = lazarus::driver::heap::run_again_with_heap_setting() {
        // Carry on with glibc's defaults: slower under message logging, not wrong.
        eprintln!(
            "warning: cannot run again with the heap on huge pages ({err}); carrying on without"
        );
    }
    let cli = Cli::parse();
    lazarus::logging::init(cli.log_level.as_ref());
    let r = match &cli.command {
        Command::Run(a) => cmd_run(a),
        Command::Report(a) => cmd_report(a),
        Command::Bench(a) => cmd_bench(a),
        Command::Chaos(a) => cmd_chaos(a),
        Command::Sim(a) => cmd_sim(a),
        Command::Model(a) => cmd_model(a),
        Command::Inspect(a) => cmd_inspect(a),
        Command::BenchCodec(a) => cmd_bench_codec(a),
        Command::Plot(a) => cmd_plot(a),
        Command::Launch(a) => cmd_launch(a),
        #[cfg(feature = "mpi")]
        Command::Mpirun(a) => cmd_mpirun(a),
        Command::Agent => lazarus::driver::processes::agent::run_agent()
            .map(|()| true)
            .map_err(Into::into),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) if e.is::<Usage>() => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("error: {}", settings_as_options(&format!("{e:#}")));
            ExitCode::from(1)
        }
    }
}
