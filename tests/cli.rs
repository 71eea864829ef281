//! The `lazarus` command line: verification lines, exit codes, clear errors
//! for malformed input, the JSON summary and the bench report.

use std::process::{Command, Output};

fn lazarus(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lazarus"))
        .args(args)
        .output()
        .expect("the lazarus binary runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `args` is a usage error: exit 2, naming `needle` on stderr, no panic,
/// and no job run.
fn assert_usage_error(args: &[&str], needle: &str) {
    let o = lazarus(args);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{args:?}: stdout {} stderr {}",
        stdout(&o),
        stderr(&o)
    );
    assert!(
        stderr(&o).contains(needle) && !stderr(&o).contains("panicked"),
        "{args:?}: `{}` lacks `{needle}`",
        stderr(&o)
    );
    assert!(!stdout(&o).contains("VERIFIED"), "{args:?}: the job ran");
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn last_line(o: &Output) -> String {
    stdout(o).lines().last().unwrap_or_default().to_string()
}

/// The number of failures a `lazarus run` summary reports.
fn failures(o: &Output) -> Option<u64> {
    stdout(o)
        .lines()
        .find_map(|l| l.split("; failures ").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

#[test]
fn cg_s_prints_verified_zeta_and_survives_kills_with_the_same_string() {
    let base = lazarus(&["run", "cg", "--class", "S", "--ranks", "4"]);
    assert_eq!(base.status.code(), Some(0), "{}", stderr(&base));
    let line = last_line(&base);
    assert!(line.starts_with("VERIFIED 8.5971775078648"), "{line}");
    // Each with the number of failures it must cause.
    for (extra, kills) in [
        (&["--protocol", "coordinated", "--kill", "1@50%"][..], 1),
        (
            &[
                "--protocol",
                "coordinated",
                "--nodes",
                "2",
                "--kill",
                "node:1@30%",
            ][..],
            1,
        ),
        (
            &[
                "--protocol",
                "coordinated",
                "--kill",
                "1@30%",
                "--kill",
                "3@60%",
            ][..],
            2,
        ),
        (
            &[
                "--protocol",
                "coordinated",
                "--kill",
                "1@30%",
                "--kill",
                "2@recovery",
            ][..],
            2,
        ),
    ] {
        let mut args = vec!["run", "cg", "--class", "S", "--ranks", "4"];
        args.extend_from_slice(extra);
        let o = lazarus(&args);
        assert_eq!(o.status.code(), Some(0), "{extra:?}: {}", stderr(&o));
        assert_eq!(last_line(&o), line, "{extra:?}");
        assert!(
            !stderr(&o).contains("never fired"),
            "{extra:?}: {}",
            stderr(&o)
        );
        assert_eq!(failures(&o), Some(kills), "{extra:?}: {}", stdout(&o));
    }
}

#[test]
fn json_summary_has_the_documented_fields() {
    let dir = std::env::temp_dir().join(format!("lazarus-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("summary.json");
    let o = lazarus(&[
        "run",
        "stencil",
        "--ranks",
        "4",
        "--nodes",
        "2",
        "--protocol",
        "coordinated",
        "--kill",
        "node:1@40%",
        "--json",
        path.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("summary written"))
            .expect("valid JSON");
    for key in [
        "app",
        "class",
        "ranks",
        "nodes",
        "backend",
        "protocol",
        "verified",
        "result",
        "wall_s",
        "failures",
        "ranks_rolled_back",
        "recovery_s",
        "checkpoints",
        "checkpoint_bytes",
        "peak_log_bytes",
    ] {
        assert!(v.get(key).is_some(), "missing `{key}` in {v}");
    }
    assert_eq!(v["app"], "stencil");
    assert_eq!(v["protocol"], "coordinated");
    assert_eq!(v["verified"], true);
    assert_eq!(v["failures"], 1);
    assert_eq!(v["ranks_rolled_back"], 4);
    assert!(v["result"].is_string());
    assert_eq!(
        format!("VERIFIED {}", v["result"].as_str().unwrap_or("")),
        last_line(&o)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_input_exits_2_with_a_clear_message() {
    let cases: &[(&[&str], &str)] = &[
        (&["run", "fft"], "unknown app `fft`"),
        // The app is positional in every subcommand.
        (&["chaos", "fft"], "unknown app `fft`"),
        (&["sim", "fft"], "PATTERN"),
        (&["chaos", "--app", "cg"], "--app"),
        (
            &["run", "cg", "--ranks", "4", "--kill", "9@50%"],
            "rank 9 is out of range",
        ),
        (
            &[
                "run",
                "cg",
                "--ranks",
                "4",
                "--kill",
                "node:3@50%",
                "--nodes",
                "2",
            ],
            "node 3 is out of range",
        ),
        (
            &["run", "cg", "--class", "S", "--kill", "1@i99"],
            "iteration 99 is beyond the run",
        ),
        (&["run", "cg", "--class", "Z"], "--class"),
        (
            &[
                "run",
                "dht",
                "--protocol",
                "pessimistic",
                "--rma-log",
                "puts",
            ],
            "--rma-log",
        ),
        (
            &["run", "dht", "--protocol", "rma", "--rma-log", "x"],
            "--rma-log",
        ),
        (&["run", "stencil", "--class", "Q"], "--class"),
        (&["run", "cg", "--kill", "1@150%"], "--kill"),
        (&["run", "cg", "--kill", "banana"], "--kill"),
        (
            &["run", "cg", "--protocol", "magic"],
            "unknown protocol `magic`",
        ),
        (&["run", "cg", "--ranks", "2", "--nodes", "3"], "--nodes"),
        (
            &["run", "cg", "--checkpoint-every", "often"],
            "--checkpoint-every",
        ),
        (&["run", "cg", "--bogus"], "--bogus"),
        (
            &["run", "cg", "--backend", "processes", "--hosts", "slurm"],
            "hosts `slurm` need `--listen` tcp:IP",
        ),
        (
            &[
                "run",
                "cg",
                "--backend",
                "processes",
                "--hosts",
                "slurm",
                "--listen",
                "tcp:0.0.0.0",
            ],
            "no address the other nodes can reach",
        ),
        (&["run", "cg", "--hosts", "moon"], "--hosts"),
        (
            &["launch", "-n", "2", "--hosts", "slurm", "--", "/bin/true"],
            "hosts `slurm` need `--listen` tcp:IP",
        ),
        (
            &["bench", "cg", "--protocols", "none,nope"],
            "unknown protocol `nope`",
        ),
        (
            &["run", "cg", "--backend", "processes", "--max-frame", "100"],
            "--max-frame",
        ),
        (
            &[
                "launch",
                "-n",
                "2",
                "--max-frame",
                "2000000000000",
                "--",
                "/bin/true",
            ],
            "--max-frame",
        ),
    ];
    for (args, needle) in cases {
        assert_usage_error(args, needle);
    }
}

/// A checkpoint piece over the frame limit (a message log that grew large)
/// ends the job with an error that says what it was and what bounds it; the
/// peer blocked sending to the failed rank stops at the abort.
#[test]
fn a_checkpoint_piece_over_the_frame_limit_is_a_clear_error() {
    let o = lazarus(&[
        "run",
        "pingpong",
        "--size",
        "32768",
        "--iterations",
        "100",
        "--backend",
        "processes",
        "--protocol",
        "pessimistic",
        "--ranks",
        "2",
        "--nodes",
        "2",
        "--max-frame",
        "65536",
    ]);
    assert_eq!(o.status.code(), Some(1), "stderr {}", stderr(&o));
    let line = last_line(&o);
    assert!(line.starts_with("NOT VERIFIED"), "{line}");
    for needle in ["a checkpoint piece", "--log-budget", "--max-frame", "65536"] {
        assert!(line.contains(needle), "`{line}` lacks `{needle}`");
    }
}

#[test]
fn failure_under_none_is_not_verified_with_exit_1() {
    let o = lazarus(&["run", "stencil", "--ranks", "4", "--kill", "2@50%"]);
    assert_eq!(o.status.code(), Some(1));
    let line = last_line(&o);
    assert!(line.starts_with("NOT VERIFIED"), "{line}");
    assert!(
        line.contains("rank(s) 2 failed") && line.contains("none"),
        "{line}"
    );
}

#[test]
fn help_shows_examples() {
    let o = lazarus(&["run", "--help"]);
    assert_eq!(o.status.code(), Some(0));
    let text = stdout(&o);
    assert!(
        text.contains("Examples:") && text.contains("--kill 3@40%"),
        "{text}"
    );
    let o = lazarus(&["bench", "--help"]);
    assert!(stdout(&o).contains("Examples:"));
}

#[test]
fn bench_reports_ratios_to_none() {
    let dir = std::env::temp_dir().join(format!("lazarus-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bench.json");
    let o = lazarus(&[
        "bench",
        "cg",
        "--class",
        "S",
        "--ranks",
        "4",
        "--protocols",
        "none,coordinated",
        "--reps",
        "3",
        "--json",
        path.to_str().expect("utf-8 path"),
        "--plot",
        dir.join("drawn.svg").to_str().expect("utf-8 path"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    // What the checkpoints cost is shown for the protocol that takes them,
    // right under its row, and not for `none`.
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    let at: Vec<usize> = (lines.iter().enumerate())
        .filter(|(_, l)| l.trim_start().starts_with("checkpoints:"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(at.len(), 1, "{out}");
    assert!(lines[at[0] - 1].starts_with("coordinated "), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("report written"))
            .expect("valid JSON");
    // Its piece size is the median over the runs of bytes over pieces,
    // printed as people read sizes (`22.4 MB`).
    let shown = (lines[at[0]].split(", ").nth(1))
        .and_then(|f| f.strip_suffix(" per piece"))
        .and_then(|n| n.parse::<bytesize::ByteSize>().ok())
        .unwrap_or_else(|| panic!("no piece size in `{}`", lines[at[0]]))
        .as_u64() as f64;
    let sizes: Vec<f64> = (v["protocols"][1]["runs"].as_array().expect("runs").iter())
        .map(|r| {
            let n = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("`{k}` in {r}"));
            n("checkpoint_bytes") / n("checkpoint_pieces")
        })
        .collect();
    let median = lazarus::tools::bench::median(&sizes);
    assert!(
        shown > 0.0
            && lazarus::tools::human_bytes_f64(median) == lazarus::tools::human_bytes_f64(shown),
        "{shown} against {sizes:?}"
    );
    // The picture drawn with the bench, and the one `plot` draws from the
    // saved JSON, name every protocol.
    let o = lazarus(&["plot", path.to_str().expect("utf-8 path")]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    for svg in ["drawn.svg", "bench.svg"].map(|f| dir.join(f)) {
        let text = std::fs::read_to_string(&svg).expect("SVG written");
        assert!(text.starts_with("<svg") && text.contains("coordinated"));
    }
    let o = lazarus(&[
        "plot",
        dir.join("missing.json").to_str().expect("utf-8 path"),
    ]);
    // A report that cannot be read is bad usage, as every other input.
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("cannot read"), "{}", stderr(&o));
    let not_a_report = dir.join("other.json");
    std::fs::write(&not_a_report, "{}").expect("written");
    let o = lazarus(&["plot", not_a_report.to_str().expect("utf-8 path")]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no `protocols` list"), "{}", stderr(&o));
    let ps = v["protocols"].as_array().expect("protocols");
    assert_eq!(ps.len(), 2);
    assert_eq!(ps[0]["protocol"], "none");
    assert_eq!(ps[0]["ratio"], 1.0);
    assert_eq!(ps[1]["protocol"], "coordinated");
    // The ratio is the quotient of the two medians.
    let median = |p: &serde_json::Value| {
        let v: Vec<f64> = (p["wall_s"].as_array().expect("wall times").iter())
            .map(|x| x.as_f64().expect("seconds"))
            .collect();
        lazarus::tools::bench::median(&v)
    };
    let want = median(&ps[1]) / median(&ps[0]);
    let ratio = ps[1]["ratio"].as_f64().expect("ratio");
    assert!(
        want > 0.0 && (ratio - want).abs() <= 1e-9 * want,
        "ratio {ratio}, medians give {want}"
    );
    // The paired ratio is the median of the per-repetition quotients.
    let walls = |p: &serde_json::Value| -> Vec<f64> {
        (p["wall_s"].as_array().expect("wall times").iter())
            .map(|x| x.as_f64().expect("seconds"))
            .collect()
    };
    let want = lazarus::tools::bench::paired_ratio(&walls(&ps[1]), &walls(&ps[0]));
    let paired = ps[1]["paired_ratio"].as_f64().expect("paired ratio");
    assert!(
        want > 0.0 && (paired - want).abs() <= 1e-9 * want,
        "paired ratio {paired}, runs give {want}"
    );
    assert_eq!(ps[0]["paired_ratio"], 1.0);
    // Three repetitions are too few for a 95% interval of the median.
    assert!(ps[1].get("paired_ratio_ci95").is_some_and(|c| c.is_null()));
    assert_eq!(ps[0]["value"], ps[1]["value"]);
    assert_eq!(ps[1]["wall_s"].as_array().map(Vec::len), Some(3));
    assert!(
        ps[1]["runs"][0]["checkpoints"]
            .as_u64()
            .is_some_and(|c| c > 0)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn chaos_sweep_passes_and_reports_json() {
    let dir = std::env::temp_dir().join(format!("lazarus-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("chaos.json");
    let o = lazarus(&[
        "chaos",
        "cg",
        "--class",
        "S",
        "--protocols",
        "coordinated",
        "--seeds",
        "4",
        "--json",
        path.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("report written"))
            .expect("valid JSON");
    assert_eq!(v["cases"], 4);
    assert_eq!(v["failed"], 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `--sets`, `--log-budget` and `--storage` reach the cases as for `run`;
/// an option no chosen protocol takes is a usage error before any case.
#[test]
fn chaos_takes_the_logging_and_storage_options_of_run() {
    let base = [
        "chaos", "dht", "--size", "64", "--ranks", "8", "--nodes", "4", "--seeds", "2",
    ];
    let run = |extra: &[&str]| {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        lazarus(&args)
    };
    let o = run(&[
        "--protocols",
        "correlated,pessimistic",
        "--sets",
        "2",
        "--log-budget",
        "20000",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    assert!(
        stderr(&o).contains("correlated: pass") && stderr(&o).contains("pessimistic: pass"),
        "{}",
        stderr(&o)
    );
    let o = run(&["--protocols", "coordinated", "--storage", "rs:2"]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    for bad in [
        &["--protocols", "pessimistic", "--sets", "2"][..],
        &["--protocols", "coordinated,ulml", "--storage", "xor"][..],
        &["--protocols", "coordinated", "--storage", "disk:/tmp/x"][..],
    ] {
        let o = run(bad);
        assert_eq!(o.status.code(), Some(2), "{bad:?}: {}", stderr(&o));
        assert!(!stderr(&o).contains(": pass"), "{bad:?}: no case runs");
    }
}

#[test]
fn chaos_failure_prints_a_replay_command_and_exits_1() {
    let o = lazarus(&[
        "chaos",
        "stencil",
        "--protocols",
        "none",
        "--seeds",
        "1",
        "--from",
        "5",
    ]);
    assert_eq!(o.status.code(), Some(1));
    let out = stdout(&o);
    let line = out
        .lines()
        .find(|l| l.trim_start().starts_with("reproduce: "))
        .expect("a reproduce line");
    let cmd = line.trim_start().trim_start_matches("reproduce: lazarus ");
    let args: Vec<&str> = cmd.split_whitespace().collect();
    let replay = lazarus(&args);
    assert_eq!(
        replay.status.code(),
        Some(1),
        "the replay fails the same way: {}",
        stdout(&replay)
    );
    assert!(last_line(&replay).starts_with("NOT VERIFIED"));
}

#[test]
fn model_prints_daly_and_the_pcf_table() {
    let dir = std::env::temp_dir().join(format!("lazarus-model-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let svg = dir.join("pcf.svg");
    let o = lazarus(&[
        "model",
        "--checkpoint-cost",
        "300",
        "--mtbf",
        "120",
        "--plot",
        svg.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(
        out.contains("compute 120.000 s"),
        "delta >= 2M gives tau = M: {out}"
    );
    assert!(out.contains("switches") && out.contains("5.00%"), "{out}");
    assert!(std::fs::read_to_string(&svg).expect("svg").contains("<svg"));
    let bad = lazarus(&["model", "--checkpoint-cost", "-1", "--mtbf", "10"]);
    assert_eq!(bad.status.code(), Some(2));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sim_scale_study_reports_rows() {
    let o = lazarus(&[
        "sim",
        "stencil",
        "--ranks",
        "256",
        "--nodes",
        "16",
        "--protocols",
        "none,coordinated",
        "--iterations",
        "10",
        "--kill",
        "node:3@50%",
    ]);
    // `none` cannot survive the kill: the study still reports both rows,
    // and only the coordinated one verified.
    let out = stdout(&o);
    let row = |p: &str| -> Vec<String> {
        out.lines()
            .find(|l| l.split_whitespace().next() == Some(p))
            .unwrap_or_else(|| panic!("no `{p}` row in {out}{}", stderr(&o)))
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    // Columns: protocol, ranks, nodes, ok, ...
    assert_eq!(row("coordinated")[1..4], ["256", "16", "yes"], "{out}");
    assert_eq!(row("none")[3], "NO", "{out}");
    assert_eq!(
        o.status.code(),
        Some(1),
        "a failed row makes the study exit 1"
    );
}

/// A scale study in one command (issue 38, Build 4): several rank counts,
/// nodes from `--ranks-per-node`, JSON rows per count and protocol, and a
/// log-log plot of coordination and recovery time against ranks.
#[test]
fn sim_sweeps_rank_counts_with_json_and_plot() {
    let dir = std::env::temp_dir().join(format!("lazarus-sim-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, svg) = (dir.join("scale.json"), dir.join("scale.svg"));
    let o = lazarus(&[
        "sim",
        "allreduce",
        "--ranks",
        "64,256",
        "--ranks-per-node",
        "16",
        "--protocols",
        "coordinated,pessimistic",
        "--iterations",
        "6",
        "--checkpoint-every",
        "2",
        "--kill",
        "5@50%",
        "--json",
        json.to_str().expect("utf-8"),
        "--plot",
        svg.to_str().expect("utf-8"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("json written")).expect("json");
    let rows = report["rows"].as_array().expect("rows");
    let got: Vec<(u64, u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["ranks"].as_u64().expect("ranks"),
                r["nodes"].as_u64().expect("nodes"),
                r["protocol"].as_str().expect("protocol"),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            (64, 4, "coordinated"),
            (64, 4, "pessimistic"),
            (256, 16, "coordinated"),
            (256, 16, "pessimistic")
        ]
    );
    for r in rows {
        assert_eq!(r["verified"], true, "{r}");
        assert!(r["recovery_s"].as_f64().expect("recovery") > 0.0, "{r}");
        assert!(r["stack_bytes"].as_u64().expect("stack bytes") > 0, "{r}");
    }
    let picture = std::fs::read_to_string(&svg).expect("svg written");
    assert!(
        picture.contains("coordinated checkpoint"),
        "legend names the series"
    );
    assert!(
        picture.contains("pessimistic recovery"),
        "legend names the series"
    );
    // The table has one row per count and protocol, under one header.
    assert_eq!(
        stdout(&o)
            .lines()
            .filter(|l| l.starts_with("protocol"))
            .count(),
        1
    );
    assert_eq!(
        stdout(&o)
            .lines()
            .filter(|l| l.starts_with("coordinated"))
            .count(),
        2
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn daly_interval_is_used_and_reported() {
    let dir = std::env::temp_dir().join(format!("lazarus-daly-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("daly.json");
    let o = lazarus(&[
        "run",
        "cg",
        "--class",
        "S",
        "--ranks",
        "4",
        "--protocol",
        "coordinated",
        "--checkpoint-interval",
        "daly",
        "--mtbf",
        "1h",
        "--checkpoint-every",
        "1",
        "--kill",
        "2@60%",
        "--json",
        path.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}{}", stdout(&o), stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("summary")).expect("JSON");
    let cost = v["daly_cost_s"].as_f64().expect("measured cost reported");
    let tau = v["daly_interval_s"].as_f64().expect("interval reported");
    let expected = lazarus::tools::model::daly_interval(cost, 3600.0).expect("valid");
    assert!(
        (tau - expected).abs() <= 1e-12 * expected.max(1.0),
        "{tau} vs {expected}"
    );
    // Used: a checkpoint of a few milliseconds at most against a 1 h MTBF
    // gives an interval of about a second or more, many of CG S's 15 safe
    // points, not the first interval's every one. (With a 5 s MTBF the
    // interval was a few tens of milliseconds, one safe point when other
    // work slowed CG down.)
    let every = v["daly_every"].as_u64().expect("daly_every reported");
    assert!(every > 1, "daly_every {every}");
    let checkpoints = v["checkpoints"].as_u64().expect("checkpoints reported");
    assert!(
        (1..15).contains(&checkpoints),
        "{checkpoints} checkpoints with daly_every {every}"
    );
    for bad in [
        &["--checkpoint-interval", "daly"][..],
        &["--mtbf", "5s"][..],
        &["--checkpoint-interval", "daly", "--mtbf", "-3s"][..],
    ] {
        let mut args = vec!["run", "cg"];
        args.extend_from_slice(bad);
        assert_eq!(lazarus(&args).status.code(), Some(2), "{bad:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// 002 Table 2's CPU column: on rank processes a bench with failures gives
/// the CPU time of its failure runs next to the failure-free runs'.
#[test]
fn bench_with_failures_reports_their_cpu_time_on_processes() {
    let dir = std::env::temp_dir().join(format!("lazarus-bench-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (o, v) = succeeds_with_json(
        &[
            "bench",
            "cg",
            "--class",
            "S",
            "--backend",
            "processes",
            "--protocols",
            "coordinated",
            "--failure",
            "1@50%",
            "--reps",
            "2",
        ],
        &dir.join("bench.json"),
    );
    let out = stdout(&o);
    assert!(
        out.lines()
            .any(|l| l.trim_start().starts_with("cpu with 1@50%: median ")),
        "{out}"
    );
    let failure = &v["protocols"][0]["failure"];
    let cpu = failure["median_cpu_s"].as_f64().expect("median_cpu_s");
    let ratio = failure["paired_cpu_ratio_to_failure_free"]
        .as_f64()
        .expect("paired_cpu_ratio_to_failure_free");
    assert!(cpu > 0.0 && ratio > 0.0, "{failure}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A logging protocol's row says where its failure-free time goes beside
/// its checkpoints (the send path), and a run with failures what share of
/// its time recovery took; the JSON carries the send path's seconds.
#[test]
fn bench_shows_where_a_logging_protocols_time_goes() {
    let dir = std::env::temp_dir().join(format!("lazarus-bench-share-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bench.json");
    let o = lazarus(&[
        "bench",
        "cg",
        "--class",
        "S",
        "--ranks",
        "4",
        "--protocols",
        "none,pessimistic",
        "--failure",
        "1@50%",
        "--reps",
        "2",
        "--json",
        path.to_str().expect("utf-8 path"),
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let out = stdout(&o);
    let lines: Vec<&str> = out.lines().collect();
    let row = |name: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no `{name}` row in {out}"))
    };
    let (none, pessimistic) = (row("none "), row("pessimistic "));
    let send_path: Vec<usize> = (lines.iter().enumerate())
        .filter(|(_, l)| l.trim_start().starts_with("logging on the send path:"))
        .map(|(i, _)| i)
        .collect();
    assert_eq!(send_path.len(), 1, "{out}");
    assert!(send_path[0] > pessimistic && none < pessimistic, "{out}");
    assert!(
        lines[send_path[0]].contains("% of the median wall time"),
        "{out}"
    );
    let failure = lines
        .iter()
        .find(|l| l.trim_start().starts_with("with 1@50%"))
        .unwrap_or_else(|| panic!("no failure line in {out}"));
    assert!(
        failure.contains("% of its median), ranks rolled back"),
        "{failure}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("report written"))
            .expect("valid JSON");
    for run in v["protocols"][1]["runs"].as_array().expect("runs") {
        let s = run["send_logging_s_total"]
            .as_f64()
            .expect("send path seconds");
        // Pessimistic sends wait for their determinants' acknowledgement:
        // some time, and less than the run.
        assert!(
            s > 0.0 && s < run["wall_s"].as_f64().expect("wall"),
            "{run}"
        );
    }
    for run in v["protocols"][0]["runs"].as_array().expect("runs") {
        assert_eq!(run["send_logging_s_total"].as_f64(), Some(0.0), "{run}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bench_codec_reports_every_figure() {
    let dir = std::env::temp_dir().join(format!("lazarus-codec-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // A size with a unit and a bare number of bytes (`sizes_parse_...`).
    let (o, v) = succeeds_with_json(
        &["bench-codec", "--bytes", "64KiB,131072", "--group", "4"],
        &dir.join("codec.json"),
    );
    let sizes = v["figures"].as_array().expect("one entry per size");
    assert_eq!(sizes.len(), 2);
    for shown in ["4 pieces of 64 KiB", "4 pieces of 128 KiB"] {
        assert!(stdout(&o).contains(shown), "{}", stdout(&o));
    }
    for (f, bytes) in sizes.iter().zip([65536, 131072]) {
        assert_eq!(f["bytes"], bytes);
        assert_eq!(f["group"], 4);
        assert_eq!(f["parity"], 2);
        for k in [
            "memcpy_gb_s",
            "xor_gb_s",
            "rs_gb_s",
            "rs_coding_gb_s",
            "crc32c_gb_s",
        ] {
            assert!(f[k].as_f64().is_some_and(|x| x > 0.0), "{k}: {f}");
        }
    }
    assert_eq!(
        lazarus(&["bench-codec", "--group", "0"]).status.code(),
        Some(2)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Hostile values never reach an allocator or a blocking call: each is a
/// usage error (exit 2) naming its option, before any work. A rank count
/// has a bound per backend (`18446744073709551615` panicked with "capacity
/// overflow", 10^8 aborted in the allocator); bench's `--kill`, an
/// unreadable `plot` report and too many simulated ranks exited 1.
#[test]
fn hostile_inputs_are_usage_errors_naming_the_option() {
    let huge = "18446744073709551615";
    let cases: &[(&[&str], &str)] = &[
        (&["run", "cg", "--ranks", huge], "at most 4096"),
        (&["run", "cg", "--ranks", "100000000"], "at most 4096"),
        (
            &["run", "cg", "--backend", "processes", "--ranks", "5000"],
            "at most 4096",
        ),
        (
            &["run", "cg", "--backend", "sim", "--ranks", "20000000"],
            "at most 16777216",
        ),
        (&["bench", "cg", "--ranks", huge], "--ranks"),
        (&["chaos", "cg", "--ranks", huge], "--ranks"),
        (&["sim", "stencil", "--ranks", huge], "--ranks"),
        (&["launch", "-n", huge, "--", "/bin/true"], "--ranks"),
        (
            &["sim", "stencil", "--ranks", "16", "--halo-bytes", huge],
            "--halo-bytes",
        ),
        (
            &["run", "pingpong", "--ranks", "2", "--size", huge],
            "--size",
        ),
        (
            &[
                "bench", "cg", "--class", "S", "--ranks", "2", "--kill", "1@50%",
            ],
            "--kill",
        ),
        (&["plot", "nosuch.json"], "nosuch.json"),
        (
            &["launch", "-n", "2", "--", "/nonexistent/program"],
            "PROGRAM",
        ),
        (
            &["run", "cg", "--ranks", "2", "--json", "/nonexistent/x.json"],
            "--json",
        ),
        (&["run", "cg", "--ranks", "2", "--json", "/tmp"], "--json"),
        (
            &[
                "bench",
                "cg",
                "--ranks",
                "2",
                "--plot",
                "/nonexistent/x.svg",
            ],
            "--plot",
        ),
        (&["model", "--plot", "/nonexistent/x.svg"], "--plot"),
        (
            &[
                "run",
                "cg",
                "--ranks",
                "2",
                "--protocol",
                "coordinated",
                "--storage",
                "disk:/proc/no/such/dir",
            ],
            "--storage",
        ),
        (
            &[
                "run",
                "cg",
                "--ranks",
                "2",
                "--protocol",
                "coordinated",
                "--storage",
                "disk:/etc/passwd",
            ],
            "--storage",
        ),
        (
            &["run", "cg", "--ranks", "2", "--log-budget", "100000"],
            "--log-budget",
        ),
        (
            &[
                "run",
                "cg",
                "--ranks",
                "2",
                "--protocol",
                "coordinated",
                "--log-budget",
                "100000",
            ],
            "--log-budget",
        ),
        (
            &[
                "run",
                "cg",
                "--ranks",
                "2",
                "--protocol",
                "pessimistic",
                "--log-budget",
                "0",
            ],
            "--log-budget",
        ),
        (
            &[
                "run",
                "cg",
                "--ranks",
                "2",
                "--protocol",
                "pessimistic",
                "--log-budget",
                "64MB/s",
            ],
            "--log-budget",
        ),
        (
            &[
                "bench",
                "cg",
                "--ranks",
                "2",
                "--protocols",
                "none,coordinated",
                "--log-budget",
                "100000",
            ],
            "--log-budget",
        ),
    ];
    for (args, needle) in cases {
        assert_usage_error(args, needle);
    }
    // More simulated ranks than memory holds (12 KiB each at the least): a
    // usage error too, before the run starts, on any machine with less than
    // 192 GiB available.
    let available: Option<u64> = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            let line = t
                .lines()
                .find(|l| l.starts_with("MemAvailable:"))?
                .to_owned();
            line.split_whitespace().nth(1)?.parse::<u64>().ok()
        })
        .map(|kib| kib * 1024);
    if available.is_some_and(|b| b < 192 << 30) {
        let o = lazarus(&["sim", "stencil", "--ranks", "16777216"]);
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains("--ranks"), "{}", stderr(&o));
        assert!(stderr(&o).contains("available"), "{}", stderr(&o));
    }
}

/// A checkpoint directory records what wrote it, and `--restart` refuses
/// another app, class, rank count or protocol with exit 2 naming
/// `--restart` (a cg directory restarted as dht used to run and print
/// `NOT VERIFIED 0 of 16384 keys found`).
#[test]
fn restart_refuses_a_directory_written_by_another_job() {
    let dir = std::env::temp_dir().join(format!("lazarus-cli-manifest-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let d = dir.to_str().expect("utf-8");
    let storage = format!("disk:{d}");
    let job = [
        "--ranks",
        "2",
        "--protocol",
        "coordinated",
        "--checkpoint-every",
        "3",
    ];
    let mut args = vec!["run", "cg", "--class", "S"];
    args.extend_from_slice(&job);
    args.extend_from_slice(&["--storage", &storage]);
    let o = lazarus(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let manifest = std::fs::read_to_string(dir.join("MANIFEST")).expect("manifest written");
    assert!(manifest.contains("cg class S"), "{manifest}");
    let o = lazarus(&["inspect", d]);
    assert!(
        stdout(&o).contains("written by `cg class S` on 2 ranks, protocol coordinated"),
        "{}",
        stdout(&o)
    );
    let restart = |app: &[&str], ranks: &str| {
        let mut args = vec!["run"];
        args.extend_from_slice(app);
        args.extend_from_slice(&[
            "--ranks",
            ranks,
            "--protocol",
            "coordinated",
            "--restart",
            d,
        ]);
        lazarus(&args)
    };
    for (app, ranks) in [
        (&["dht"][..], "2"),
        (&["cg", "--class", "W"][..], "2"),
        (&["stencil"][..], "2"),
        (&["cg", "--class", "S"][..], "3"),
    ] {
        let o = restart(app, ranks);
        assert_eq!(o.status.code(), Some(2), "{app:?}: {}", stderr(&o));
        assert!(
            stderr(&o).contains("`--restart`") && stderr(&o).contains("cg class S"),
            "{app:?}: {}",
            stderr(&o)
        );
        assert!(!stdout(&o).contains("VERIFIED"), "{app:?}: the job ran");
    }
    let o = restart(&["cg", "--class", "S"], "2");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(last_line(&o).starts_with("VERIFIED"), "{}", stdout(&o));
    let _ = std::fs::remove_dir_all(&dir);
}

/// A kill whose moment never comes is said on stderr with its reason and
/// in the summary line, not only in the JSON's `unfired_kills`: above all a
/// `R@P%` kill in a program that never reports progress, which cannot fire
/// (the example `launched_solver`, built by `cargo test`, with
/// `no-progress`).
#[test]
fn a_kill_that_never_fired_says_so() {
    let o = lazarus(&[
        "run",
        "cg",
        "--class",
        "S",
        "--ranks",
        "2",
        "--protocol",
        "coordinated",
        "--kill",
        "1@recovery:2",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(
        stdout(&o)
            .lines()
            .any(|l| l.starts_with("wall ") && l.contains("kill never fired: 1@recovery:2")),
        "{}",
        stdout(&o)
    );
    assert!(
        stderr(&o).contains("kill 1@recovery:2 never fired: the job had fewer recoveries"),
        "{}",
        stderr(&o)
    );
    let example = std::path::Path::new(env!("CARGO_BIN_EXE_lazarus"))
        .parent()
        .map(|d| d.join("examples").join("launched_solver"))
        .expect("target directory");
    assert!(example.exists(), "{} not built", example.display());
    let example = example.to_str().expect("utf-8");
    let o = lazarus(&[
        "launch",
        "-n",
        "2",
        "--kill",
        "1@50%",
        "--",
        example,
        "20",
        "no-progress",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("warning: kill 1@50% never fired") && err.contains("ctx.set_progress"),
        "{err}"
    );
    assert!(
        err.lines()
            .any(|l| l.starts_with("lazarus launch:") && l.contains("kill never fired: 1@50%")),
        "{err}"
    );
}

/// A bench of a few milliseconds per run: `none` against `coordinated` on a
/// small stencil.
const SMALL_BENCH: &[&str] = &[
    "bench",
    "stencil",
    "--ranks",
    "2",
    "--size",
    "32",
    "--iterations",
    "10",
    "--protocols",
    "none,coordinated",
];

/// A simulation of a few milliseconds: all-reduces on 4 ranks, no protocol.
const SMALL_SIM: &[&str] = &[
    "sim",
    "allreduce",
    "--ranks",
    "4",
    "--iterations",
    "3",
    "--protocols",
    "none",
];

#[test]
fn bench_defaults_to_the_fewest_reps_that_give_an_interval() {
    let dir = std::env::temp_dir().join(format!("lazarus-reps-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("bench.json");
    let o = lazarus(&[SMALL_BENCH, &["--json", path.to_str().expect("utf-8 path")]].concat());
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("report written"))
            .expect("valid JSON");
    assert_eq!(v["reps"], 6);
    let coordinated = &v["protocols"][1];
    assert_eq!(coordinated["wall_s"].as_array().map(Vec::len), Some(6));
    assert!(
        coordinated["paired_ratio_ci95"].is_array(),
        "no interval: {coordinated}"
    );
    let help = stdout(&lazarus(&["bench", "--help"]));
    assert!(help.contains("[default: 6]"), "{help}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench --trace` runs each protocol traced too, alternating with its
/// untraced runs, reports the paired cost in the JSON, and writes the last
/// traced run's timeline.
#[test]
fn bench_trace_reports_what_tracing_costs_and_writes_a_timeline() {
    let dir = std::env::temp_dir().join(format!("lazarus-bench-trace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (json, trace) = (dir.join("bench.json"), dir.join("t.json"));
    let o = lazarus(
        &[
            SMALL_BENCH,
            &[
                "--reps",
                "2",
                "--json",
                json.to_str().expect("utf-8"),
                "--trace",
                trace.to_str().expect("utf-8"),
            ],
        ]
        .concat(),
    );
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).expect("report written"))
            .expect("valid JSON");
    for p in v["protocols"].as_array().expect("protocols") {
        let t = &p["traced"];
        assert_eq!(t["wall_s"].as_array().map(Vec::len), Some(2), "{p}");
        assert!(
            t["paired_ratio_to_untraced"]
                .as_f64()
                .is_some_and(|r| r > 0.0),
            "{p}"
        );
        assert!(
            t["events_per_rank_s"].as_f64().is_some_and(|r| r > 0.0),
            "{p}"
        );
    }
    read_trace(&trace);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn durations_take_humantime_forms_and_bare_numbers_in_the_documented_unit() {
    // Daly's interval from humantime forms equals the one from bare seconds.
    let daly = |cost: &str, mtbf: &str| -> String {
        let o = lazarus(&["model", "--checkpoint-cost", cost, "--mtbf", mtbf]);
        assert_eq!(o.status.code(), Some(0), "{cost} {mtbf}: {}", stderr(&o));
        let out = stdout(&o);
        (out.lines())
            .find_map(|l| l.split("-> compute ").nth(1))
            .unwrap_or_else(|| panic!("no interval in {out}"))
            .to_string()
    };
    assert_eq!(daly("1m", "1d"), daly("60", "86400"));
    assert_eq!(daly("1.5s", "90m"), daly("1.5", "5400"));
    assert_ne!(daly("1m", "1d"), daly("1m", "1h"));
    // Virtual compute per iteration: the same simulated run either way.
    let sim = |compute: &str| -> Vec<String> {
        let o = lazarus(&[SMALL_SIM, &["--compute-s", compute]].concat());
        assert_eq!(o.status.code(), Some(0), "{compute}: {}", stderr(&o));
        let out = stdout(&o);
        // Cells are two spaces apart (a size is `22.4 kB`).
        let cells = |l: &str| -> Vec<String> {
            (l.split("  ").map(str::trim))
                .filter(|c| !c.is_empty())
                .map(String::from)
                .collect()
        };
        let header = cells(out.lines().next().unwrap_or_default());
        let row = cells(
            (out.lines())
                .find(|l| l.starts_with("none "))
                .unwrap_or_else(|| panic!("no row in {out}")),
        );
        let cell = |name: &str| -> String {
            let at = (header.iter().position(|h| h == name))
                .unwrap_or_else(|| panic!("no `{name}` column in {out}"));
            row[at].clone()
        };
        vec![cell("virtual_ms"), cell("trace_hash")]
    };
    assert_eq!(sim("2ms"), sim("0.002"));
    assert_ne!(sim("2ms"), sim("3ms"));
    // A bare heartbeat timeout is milliseconds: 5 is too short, 5s is not.
    let run = |hb: &str| {
        lazarus(&[
            "run",
            "stencil",
            "--ranks",
            "2",
            "--size",
            "16",
            "--iterations",
            "2",
            "--heartbeat-timeout",
            hb,
        ])
    };
    assert_usage_error(
        &["run", "stencil", "--ranks", "2", "--heartbeat-timeout", "5"],
        "5ms is too short",
    );
    for hb in ["5s", "300", "1s 500ms"] {
        assert_eq!(run(hb).status.code(), Some(0), "{hb}: {}", stderr(&run(hb)));
    }
    // Bad values are usage errors naming the option.
    for (args, option) in [
        (
            &["model", "--mtbf", "1x", "--checkpoint-cost", "1"][..],
            "--mtbf",
        ),
        (
            &["model", "--mtbf", "0s", "--checkpoint-cost", "1"][..],
            "--mtbf",
        ),
        (
            &["model", "--mtbf", "1d", "--checkpoint-cost=-3s"][..],
            "--checkpoint-cost",
        ),
        (
            &["model", "--mtbf", "nan", "--checkpoint-cost", "1"][..],
            "--mtbf",
        ),
        (
            &[
                "run",
                "cg",
                "--checkpoint-interval",
                "daly",
                "--mtbf",
                "soon",
            ][..],
            "--mtbf",
        ),
        (
            &["run", "cg", "--heartbeat-timeout", "2 fortnights"][..],
            "--heartbeat-timeout",
        ),
        (
            &[
                "launch",
                "-n",
                "2",
                "--heartbeat-timeout",
                "x",
                "--",
                "true",
            ][..],
            "--heartbeat-timeout",
        ),
        (&["chaos", "cg", "--bound-s", "0"][..], "--bound-s"),
        (
            &["sim", "stencil", "--compute-s", "1parsec"][..],
            "--compute-s",
        ),
    ] {
        assert_usage_error(args, option);
    }
}

/// Where `text` shows Debug formatting: `Some(..)`, `None`, a struct's
/// `{ field: .. }`, or a list of numbers as `[1, 2]`.
fn debug_formatting(text: &str) -> Option<String> {
    for line in text.lines() {
        if ["Some(", "None", "{", "}"].iter().any(|p| line.contains(p)) {
            return Some(line.to_string());
        }
        for (i, _) in line.match_indices('[') {
            let rest = &line[i + 1..];
            let Some(end) = rest.find(']') else { continue };
            let inner = &rest[..end];
            if !inner.is_empty() && inner.split(", ").all(|n| n.parse::<u64>().is_ok()) {
                return Some(line.to_string());
            }
        }
    }
    None
}

#[test]
fn no_debug_formatting_reaches_users() {
    let chaos = lazarus(&[
        "chaos",
        "stencil",
        "--protocols",
        "none",
        "--seeds",
        "1",
        "--from",
        "5",
    ]);
    let out = stdout(&chaos);
    assert!(out.contains("seed 5 none: failed: rank(s) "), "{out}");
    // A node failure: both of its ranks in the message, as a list.
    let run = lazarus(&[
        "run",
        "stencil",
        "--ranks",
        "4",
        "--nodes",
        "2",
        "--kill",
        "node:1@50%",
    ]);
    assert!(
        stderr(&run).contains("rank(s) 2, 3 failed"),
        "{}",
        stderr(&run)
    );
    let bench = lazarus(&[SMALL_BENCH, &["--reps", "2", "--failure", "1@50%"]].concat());
    assert_eq!(bench.status.code(), Some(0), "{}", stderr(&bench));
    // Coordinated rolls both ranks back, in each of the two runs.
    assert!(
        stdout(&bench).contains("ranks rolled back 2, 2 (per run)"),
        "{}",
        stdout(&bench)
    );
    for o in [&chaos, &run, &bench] {
        for text in [stdout(o), stderr(o)] {
            assert_eq!(debug_formatting(&text), None, "{text}");
        }
    }
    // The detector itself catches what it must.
    assert!(debug_formatting("seed 5 none: Failed { error: \"x\" }").is_some());
    assert!(debug_formatting("rolled back to generation Some(21)").is_some());
    assert!(debug_formatting("ranks rolled back [1, 1]").is_some());
    assert!(debug_formatting("kills [1@50%]").is_none());
}

/// The example program `cargo test` builds next to the binary.
fn example(name: &str) -> String {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_lazarus"))
        .parent()
        .map(|d| d.join("examples").join(name))
        .expect("target directory");
    assert!(path.exists(), "{} not built", path.display());
    path.to_str().expect("utf-8").to_string()
}

#[test]
fn every_json_output_carries_schema_and_version() {
    let dir = std::env::temp_dir().join(format!("lazarus-schema-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = |name: &str| dir.join(name).to_str().expect("utf-8").to_string();
    let ckpt = file("ckpt");
    let small = ["--ranks", "2", "--size", "16", "--iterations", "4"];
    let solver = example("launched_solver");
    let disk = format!("disk:{ckpt}");
    let mut runs: Vec<(&str, Vec<&str>)> = Vec::new();
    let run_json = file("run.json");
    let mut run = vec![
        "run",
        "stencil",
        "--protocol",
        "coordinated",
        "--storage",
        &disk,
    ];
    run.extend(small);
    run.extend(["--json", &run_json]);
    runs.push(("run.json", run));
    // After the run, which wrote the checkpoints it reads.
    let inspect_json = file("inspect.json");
    runs.push((
        "inspect.json",
        vec!["inspect", &ckpt, "--json", &inspect_json],
    ));
    let bench_json = file("bench.json");
    let mut bench = vec!["bench", "stencil", "--protocols", "none", "--reps", "1"];
    bench.extend(small);
    bench.extend(["--json", &bench_json]);
    runs.push(("bench.json", bench));
    let chaos_json = file("chaos.json");
    runs.push((
        "chaos.json",
        vec![
            "chaos",
            "stencil",
            "--ranks",
            "2",
            "--seeds",
            "1",
            "--json",
            &chaos_json,
        ],
    ));
    let sim_json = file("sim.json");
    runs.push(("sim.json", [SMALL_SIM, &["--json", &sim_json]].concat()));
    let codec_json = file("codec.json");
    runs.push((
        "codec.json",
        vec!["bench-codec", "--bytes", "65536", "--json", &codec_json],
    ));
    let launch_json = file("launch.json");
    runs.push((
        "launch.json",
        vec![
            "launch",
            "-n",
            "2",
            "--json",
            &launch_json,
            "--",
            &solver,
            "5",
        ],
    ));
    for (name, args) in &runs {
        let o = lazarus(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        let text = std::fs::read_to_string(dir.join(name)).expect("JSON written");
        let v: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
        assert!(v["schema"].is_u64(), "{name}: no integer schema in {text}");
        assert_eq!(v["schema"], lazarus::tools::JSON_SCHEMA, "{name}");
        assert_eq!(v["lazarus_version"], env!("CARGO_PKG_VERSION"), "{name}");
        // The report's own fields are still at top level beside them.
        assert!(v.as_object().is_some_and(|o| o.len() > 2), "{name}: {text}");
    }
    let rows = serde_json::from_str::<serde_json::Value>(
        &std::fs::read_to_string(&sim_json).expect("sim JSON"),
    )
    .expect("valid JSON");
    assert_eq!(rows["rows"].as_array().map(Vec::len), Some(1), "{rows}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The subcommands `lazarus --help` lists.
fn subcommands() -> Vec<String> {
    let help = stdout(&lazarus(&["--help"]));
    (help.lines())
        .skip_while(|l| !l.starts_with("Commands:"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(String::from)
        .collect()
}

/// The example command lines of `sub --help`, without trailing comments.
fn help_examples(sub: &str) -> Vec<String> {
    let help = stdout(&lazarus(&[sub, "--help"]));
    (help.lines())
        .map(|l| l.split(" #").next().unwrap_or_default().trim())
        .filter(|l| l.starts_with("lazarus "))
        .map(String::from)
        .collect()
}

/// Every example the help shows names a real subcommand and, where it
/// names a program, one that exists; the examples of `run`, `model`,
/// `launch`, `report`, `inspect` and `bench-codec` (seconds each) are run,
/// in the order the help shows them, and must succeed. Those of `bench`,
/// `chaos` and `sim` take minutes and are left to a person.
#[test]
fn help_examples_run() {
    let subs = subcommands();
    assert!(
        subs.len() >= 9 && subs.contains(&"launch".to_string()),
        "{subs:?}"
    );
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_lazarus"))
        .parent()
        .expect("target directory")
        .to_str()
        .expect("utf-8")
        .to_string();
    let dir = std::env::temp_dir().join(format!("lazarus-examples-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    example("launched_solver");
    let run_here = ["run", "model", "launch", "report", "inspect", "bench-codec"];
    let mut ran = 0;
    let mut ran_in: std::collections::BTreeSet<&str> = Default::default();
    for sub in &subs {
        for line in help_examples(sub) {
            // The help names paths in the source tree; the test's build
            // may live elsewhere (CARGO_TARGET_DIR).
            let line = line.replace("./target/release", &bin_dir);
            let args: Vec<&str> = line.split_whitespace().skip(1).collect();
            assert!(
                subs.iter().any(|s| s == args[0]),
                "`{line}`: no such subcommand"
            );
            if let Some(at) = args.iter().position(|a| *a == "--") {
                let program = std::path::Path::new(args[at + 1]);
                assert!(
                    program.is_file(),
                    "`{line}`: {} does not exist",
                    program.display()
                );
            }
            if run_here.contains(&args[0]) {
                let o = Command::new(env!("CARGO_BIN_EXE_lazarus"))
                    .args(&args)
                    .current_dir(&dir)
                    .output()
                    .expect("the lazarus binary runs");
                assert_eq!(o.status.code(), Some(0), "`{line}`: {}", stderr(&o));
                ran += 1;
                if args[0] == sub.as_str() {
                    ran_in.insert(sub.as_str());
                }
            }
        }
    }
    assert!(ran >= 15, "only {ran} examples ran");
    // Each of them shows examples of its own.
    for sub in run_here {
        assert!(
            ran_in.contains(sub),
            "`{sub} --help` shows no example of it"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The papers `text` cites by number: `003 eq. 7`, `004 §2.2`, `002 Table 2`.
fn papers_cited(text: &str) -> std::collections::BTreeSet<String> {
    let markers = ["§", "eq.", "Fig.", "Table", "Alg.", "Theorem"];
    let mut cited = std::collections::BTreeSet::new();
    for (i, _) in text.match_indices("00") {
        let Some(number) = text.get(i..i + 3) else {
            continue;
        };
        let rest = &text[i + 3..];
        let standalone = text[..i]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_alphanumeric());
        if number.chars().all(|c| c.is_ascii_digit())
            && standalone
            && rest.starts_with(' ')
            && markers.iter().any(|m| rest[1..].starts_with(m))
        {
            cited.insert(number.to_string());
        }
    }
    cited
}

/// docs/papers.md gives a full reference for every paper the code, the
/// help and the docs cite, and the README links it and says how to put
/// `lazarus` on PATH.
#[test]
fn every_cited_paper_is_in_docs_papers() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    let mut texts = vec![
        read(&root.join("README.md")),
        read(&root.join("ARCHITECTURE.md")),
    ];
    let mut dirs = vec![root.join("src"), root.join("examples")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("source directory").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                texts.push(read(&p));
            }
        }
    }
    for sub in subcommands() {
        texts.push(stdout(&lazarus(&[&sub, "--help"])));
    }
    let cited: std::collections::BTreeSet<String> =
        texts.iter().flat_map(|t| papers_cited(t)).collect();
    assert!(cited.contains("003") && cited.contains("004"), "{cited:?}");
    let papers = read(&root.join("docs/papers.md"));
    for n in &cited {
        // A row of the reference table: number, then authors and title.
        let row = (papers.lines())
            .find(|l| l.starts_with(&format!("| {n} | ")) && l.contains('*'))
            .unwrap_or_else(|| panic!("docs/papers.md has no reference for {n}"));
        assert!(row.contains(". *"), "{row}");
    }
    assert_eq!(
        papers_cited("see 003 eq. 7 and 004 §2.2, not 1004 §1"),
        ["003", "004"].map(String::from).into()
    );
    let readme = read(&root.join("README.md"));
    assert!(
        readme.contains("(docs/papers.md)"),
        "README does not link docs/papers.md"
    );
    assert!(
        readme.contains("cargo install --path ."),
        "README does not say how to install"
    );
}

/// `chaos --trace` writes the first failing case's timeline (a kill under
/// `none` fails every case), with the kill on the victim's lane; with
/// every case passing it writes nothing and says so.
#[test]
fn chaos_trace_is_the_first_failing_cases_timeline() {
    let dir = std::env::temp_dir().join(format!("lazarus-chaos-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let trace = dir.join("chaos.json");
    let trace_s = trace.to_str().expect("utf-8");
    let chaos = |protocols: &str| {
        let args = format!(
            "chaos stencil --class S --ranks 4 --nodes 2 --seeds 2 --protocols {protocols} \
             --trace {trace_s}"
        );
        lazarus(&args.split_whitespace().collect::<Vec<_>>())
    };
    let o = chaos("none");
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("trace: ") && out.contains(trace_s), "{out}");
    let v = read_trace(&trace);
    let title = v["traceEvents"][0]["args"]["name"]
        .as_str()
        .unwrap_or_default();
    assert!(
        title.starts_with("lazarus chaos stencil: seed 1 (none)"),
        "{title}"
    );
    let kills = (v["traceEvents"].as_array().expect("events").iter())
        .filter(|e| e["name"] == "kill")
        .count();
    assert!(kills >= 1, "no kill on the failing case's timeline");
    std::fs::remove_file(&trace).expect("remove");
    let o = chaos("coordinated");
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(stdout(&o).contains("every case passed"), "{}", stdout(&o));
    assert!(!trace.exists(), "a trace written though every case passed");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `launch --trace` writes the timeline of a user's program: its ranks,
/// the kill, the restore and the replay.
#[test]
fn launch_trace_records_the_users_program() {
    let example = std::path::Path::new(env!("CARGO_BIN_EXE_lazarus"))
        .parent()
        .map(|d| d.join("examples").join("launched_solver"))
        .expect("target directory");
    assert!(example.exists(), "{} not built", example.display());
    let dir = std::env::temp_dir().join(format!("lazarus-launch-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let trace = dir.join("launch.json");
    let o = lazarus(&[
        "launch",
        "-n",
        "3",
        "--kill",
        "1@50%",
        "--trace",
        trace.to_str().expect("utf-8"),
        "--",
        example.to_str().expect("utf-8"),
        "40",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let v = read_trace(&trace);
    let on = |tid: u64, name: &str| has_event(&v, tid, name);
    for kind in ["kill", "restore"] {
        assert!(on(1, kind), "rank 1 has no `{kind}`");
    }
    for r in 0..3 {
        assert!(on(r, "collective"), "rank {r} has no collective");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A timeline `--trace` wrote: JSON, with none of the defects
/// [`chrome_trace_defect`] finds.
fn read_trace(path: &std::path::Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).expect("trace written");
    let v: serde_json::Value = serde_json::from_str(&text).expect("the trace is JSON");
    assert_eq!(chrome_trace_defect(&v), None, "{}", path.display());
    v
}

/// Whether rank `tid`'s lane of a timeline has an event called `name`.
fn has_event(v: &serde_json::Value, tid: u64, name: &str) -> bool {
    (v["traceEvents"].as_array())
        .is_some_and(|es| es.iter().any(|e| e["tid"] == tid && e["name"] == name))
}

/// The ways a Chrome trace event file breaks Perfetto and chrome://tracing
/// (the format's documented fields, and slices of one thread properly
/// nested), or `None` if it has none.
fn chrome_trace_defect(v: &serde_json::Value) -> Option<String> {
    let events = v["traceEvents"].as_array()?;
    let mut per_tid: std::collections::BTreeMap<u64, Vec<(f64, f64)>> = Default::default();
    for e in events {
        let (Some(_), Some(ph), Some(_), Some(tid)) = (
            e["name"].as_str(),
            e["ph"].as_str(),
            e["pid"].as_u64(),
            e["tid"].as_u64(),
        ) else {
            return Some(format!("an event without name, ph, pid or tid: {e}"));
        };
        match ph {
            "M" => {}
            "X" | "i" => {
                let ts = e["ts"].as_f64().filter(|t| *t >= 0.0);
                let Some(ts) = ts else {
                    return Some(format!("no time: {e}"));
                };
                if ph == "i" {
                    if !["t", "p", "g"].contains(&e["s"].as_str().unwrap_or("t")) {
                        return Some(format!("bad instant scope: {e}"));
                    }
                    continue;
                }
                let Some(dur) = e["dur"].as_f64().filter(|d| *d >= 0.0) else {
                    return Some(format!("no duration: {e}"));
                };
                per_tid.entry(tid).or_default().push((ts, ts + dur));
            }
            other => return Some(format!("unexpected phase {other}: {e}")),
        }
    }
    // Slices of a thread must nest: each lies inside the enclosing open
    // one or starts after it ends (1 ns of rounding allowed).
    for (tid, mut spans) in per_tid {
        spans.sort_by(|a, b| a.0.total_cmp(&b.0).then(b.1.total_cmp(&a.1)));
        let mut open: Vec<f64> = Vec::new();
        for (s, e) in spans {
            while open.last().is_some_and(|&end| end <= s + 1e-3) {
                open.pop();
            }
            if let Some(&end) = open.last()
                && e > end + 1e-3
            {
                return Some(format!(
                    "tid {tid}: [{s}, {e}] overlaps a slice ending at {end}"
                ));
            }
            open.push(e);
        }
    }
    None
}

/// `run --trace` writes a timeline on every backend that the Chrome trace
/// format accepts, with the kill, its detection, the recovery, restore and
/// replay of the killed rank, checkpoints and commits; `report` reads it
/// back, as text and as a picture; bad trace files are usage errors.
/// `lazarus run stencil` (class S, 4 ranks on 2 nodes) on `backend` under
/// `protocol` with `kill`, its timeline written to `trace`.
fn traced_stencil(backend: &str, protocol: &str, kill: &str, trace: &std::path::Path) -> Output {
    lazarus(&[
        "run",
        "stencil",
        "--class",
        "S",
        "--ranks",
        "4",
        "--nodes",
        "2",
        "--backend",
        backend,
        "--protocol",
        protocol,
        "--kill",
        kill,
        "--trace",
        trace.to_str().expect("utf-8"),
    ])
}

/// A rank killed while it waits (its node died under another rank's
/// fault plan) has the span it waited in end at the kill, not lost with the
/// incarnation. On the simulator the kill has one time for all.
#[test]
fn a_rank_killed_while_waiting_has_its_span_end_at_the_kill() {
    let dir = std::env::temp_dir().join(format!("lazarus-trace-kill-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let trace = dir.join("sim.json");
    let o = traced_stencil("sim", "coordinated", "node:1@50%", &trace);
    assert!(last_line(&o).starts_with("VERIFIED"), "{}", stderr(&o));
    let v = read_trace(&trace);
    let events = v["traceEvents"].as_array().expect("events");
    let kill_at = |tid: u64| {
        events
            .iter()
            .find(|e| e["tid"] == tid && e["name"] == "kill")
            .and_then(|e| e["ts"].as_f64())
            .unwrap_or_else(|| panic!("rank {tid} has no kill"))
    };
    // Ranks 2 and 3 share node 1: one reached the kill point, the other
    // was waiting in its safe point when the node died. Both lanes' last
    // spans before the kill end there.
    let ended_at_kill = [2u64, 3].iter().all(|&tid| {
        let at = kill_at(tid);
        events.iter().any(|e| {
            e["tid"] == tid
                && e["ph"] == "X"
                && e["name"] != "compute"
                && (e["ts"].as_f64().unwrap_or(0.0) + e["dur"].as_f64().unwrap_or(0.0) - at).abs()
                    < 1e-3
        })
    });
    assert!(
        ended_at_kill,
        "a span of rank 2 or 3 does not end at its kill"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn run_trace_is_a_valid_chrome_trace_and_report_draws_it() {
    let dir = std::env::temp_dir().join(format!("lazarus-trace-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    for backend in ["threads", "processes", "sim"] {
        let trace = dir.join(format!("{backend}.json"));
        let trace_s = trace.to_str().expect("utf-8");
        let o = traced_stencil(backend, "pessimistic", "1@50%", &trace);
        assert!(
            last_line(&o).starts_with("VERIFIED"),
            "{backend}: {}",
            stderr(&o)
        );
        assert!(stdout(&o).contains("trace: "), "{backend}: {}", stdout(&o));
        let v = read_trace(&trace);
        assert_eq!(v["otherData"]["schema"], 1);
        let on = |tid: u64, name: &str| has_event(&v, tid, name);
        for kind in ["kill", "recovery", "restore", "replay", "safe point"] {
            assert!(on(1, kind), "{backend}: rank 1 has no `{kind}`");
        }
        for kind in [
            "failure detected",
            "checkpoint",
            "storage",
            "commit",
            "send",
            "receive",
        ] {
            assert!(on(0, kind), "{backend}: rank 0 has no `{kind}`");
        }
        // Under pessimistic only the killed rank rolls back.
        assert!(!on(0, "recovery") && !on(0, "restore"), "{backend}");
        let svg = dir.join(format!("{backend}.svg"));
        let r = lazarus(&["report", trace_s, "--svg", svg.to_str().expect("utf-8")]);
        assert_eq!(r.status.code(), Some(0), "{backend}: {}", stderr(&r));
        assert!(stdout(&r).contains("killed "), "{}", stdout(&r));
        let picture = std::fs::read_to_string(&svg).expect("picture written");
        assert!(picture.contains("rank 1: kill") && picture.contains(">rank 3</text>"));
    }
    assert_usage_error(&["report", "/nonexistent/t.json"], "TRACE");
    let not_a_trace = dir.join("other.json");
    std::fs::write(&not_a_trace, "{\"rows\": []}").expect("write");
    assert_usage_error(&["report", not_a_trace.to_str().expect("utf-8")], "TRACE");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Run `lazarus args --json path`, which must succeed, and read the JSON
/// it wrote.
fn succeeds_with_json(args: &[&str], path: &std::path::Path) -> (Output, serde_json::Value) {
    let o = lazarus(&[args, &["--json", path.to_str().expect("utf-8 path")]].concat());
    assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
    let text = std::fs::read_to_string(path).expect("JSON written");
    (o, serde_json::from_str(&text).expect("valid JSON"))
}

/// The help paragraph of `option` in `sub --help` (its line and the
/// description under it).
fn option_help(sub: &str, option: &str) -> Option<String> {
    let help = stdout(&lazarus(&[sub, "--help"]));
    let mut lines = help.lines().skip_while(|l| {
        let l = l.trim_start();
        !(l.starts_with(&format!("{option} ")) || l.contains(&format!(", {option} ")))
    });
    let head = lines.next()?;
    let rest: Vec<&str> = lines
        .take_while(|l| !l.trim().is_empty() && !l.trim_start().starts_with('-'))
        .collect();
    Some(format!("{head} {}", rest.join(" ")))
}

/// The default a help paragraph shows: clap's `[default: X]`, or the
/// `else X)` of a default that depends on the environment.
fn shown_default(paragraph: &str) -> Option<String> {
    let from = |tag: &str, end: char| {
        let at = paragraph.rfind(tag)? + tag.len();
        paragraph[at..].split(end).next().map(String::from)
    };
    from("[default: ", ']').or_else(|| from("else ", ')'))
}

/// `--nodes` and `--checkpoint-every` have run's defaults in every
/// subcommand that takes them, or the help says why not ("not run's").
#[test]
fn defaults_agree_across_subcommands_or_the_help_says_why() {
    for option in ["--nodes", "--checkpoint-every"] {
        let run = option_help("run", option).expect("run takes it");
        let run_default = shown_default(&run).expect("run shows its default");
        let mut seen = 0;
        for sub in ["bench", "chaos", "sim", "launch", "model"] {
            let Some(help) = option_help(sub, option) else {
                continue;
            };
            seen += 1;
            let default = shown_default(&help);
            assert!(
                default.as_ref() == Some(&run_default) || help.contains("not run's"),
                "{sub} {option}: default {default:?}, run's {run_default}, and no reason: {help}"
            );
        }
        assert!(seen >= 3, "{option} in only {seen} other subcommands");
    }
    // The two that differ, and say why.
    let chaos = option_help("chaos", "--nodes").expect("chaos --nodes");
    assert_eq!(shown_default(&chaos).as_deref(), Some("2"), "{chaos}");
    let sim = option_help("sim", "--checkpoint-every").expect("sim --checkpoint-every");
    assert_eq!(shown_default(&sim).as_deref(), Some("5"), "{sim}");
}

/// Size options take bytes or a number with a unit (`bytesize`'s forms;
/// `bench_codec_reports_every_figure` gives both) and refuse anything
/// else, naming the option; summaries print sizes as people read them,
/// and the JSON keeps the exact integers.
#[test]
fn sizes_parse_and_print_human_readably() {
    let dir = std::env::temp_dir().join(format!("lazarus-sizes-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    for (args, option) in [
        (
            &["run", "cg", "--log-budget", "12parsecs"][..],
            "--log-budget",
        ),
        (&["chaos", "cg", "--log-budget", "lots"][..], "--log-budget"),
        (&["run", "cg", "--max-frame", "1XB"][..], "--max-frame"),
        (
            &["launch", "-n", "2", "--max-frame", "big", "--", "/bin/true"][..],
            "--max-frame",
        ),
        (&["run", "pingpong", "--size", "4ZiB"][..], "--size"),
        (
            &["sim", "stencil", "--halo-bytes", "8 KB/s"][..],
            "--halo-bytes",
        ),
        (&["bench-codec", "--bytes", "1MiB,x"][..], "--bytes"),
    ] {
        assert_usage_error(args, option);
    }
    // The default frame limit as the help shows it is the library's.
    let help = option_help("run", "--max-frame").expect("run --max-frame");
    let shown: bytesize::ByteSize = shown_default(&help)
        .expect("a default")
        .parse()
        .expect("a size");
    assert_eq!(shown.as_u64(), lazarus::config::DEFAULT_MAX_FRAME as u64);
    // A run's summary: the checkpoint and log sizes as the JSON's bytes
    // print.
    let (o, v) = succeeds_with_json(
        &[
            "run",
            "stencil",
            "--ranks",
            "2",
            "--protocol",
            "pessimistic",
            "--log-budget",
            "64MiB",
        ],
        &dir.join("run.json"),
    );
    let out = stdout(&o);
    for key in ["checkpoint_bytes", "log_bytes", "peak_log_bytes"] {
        let n = v[key]
            .as_u64()
            .unwrap_or_else(|| panic!("integer `{key}` in {v}"));
        let human = lazarus::tools::human_bytes(n);
        assert!(n >= 1000 && !human.ends_with(" B"), "{key}: {n} as {human}");
        assert!(out.contains(&human), "{key}: no `{human}` in {out}");
    }
    assert!(!out.contains(" bytes"), "raw byte counts in {out}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// `bench` and `chaos` show a progress bar (run i of N, protocol, elapsed,
/// ETA) on a terminal, and nothing of it anywhere else.
#[test]
fn progress_shows_on_a_terminal_only() {
    let chaos: &[&str] = &["chaos", "stencil", "--ranks", "2", "--seeds", "2"];
    for args in [SMALL_BENCH, chaos] {
        let o = lazarus(args);
        assert_eq!(o.status.code(), Some(0), "{args:?}: {}", stderr(&o));
        for text in [stdout(&o), stderr(&o)] {
            assert!(
                !text.contains("ETA") && !text.contains("run 1 of"),
                "{args:?}: a progress bar off a terminal: {text}"
            );
        }
        // Under a pseudo-terminal (util-linux `script`, where present).
        let line = format!("{} {}", env!("CARGO_BIN_EXE_lazarus"), args.join(" "));
        let Ok(o) = Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("TERM", "xterm")
            .output()
        else {
            eprintln!("no `script` here: the terminal half is not checked");
            continue;
        };
        assert_eq!(
            o.status.code(),
            Some(0),
            "{args:?} under script: {}",
            stdout(&o)
        );
        let text = stdout(&o);
        assert!(
            text.contains("run 1 of ") && text.contains("ETA"),
            "{args:?}: no progress on a terminal: {text}"
        );
    }
}

/// `--log-level` takes a level or `TARGET=LEVEL` directives, before or
/// after the subcommand; anything else is bad usage naming the option.
#[test]
fn a_bad_log_level_is_a_usage_error() {
    assert_usage_error(
        &["run", "cg", "--class", "S", "--log-level", "bogus"],
        "--log-level",
    );
    assert_usage_error(
        &["--log-level", "lazarus=loud", "run", "cg", "--class", "S"],
        "--log-level",
    );
}

/// `lazarus` with no `RUST_LOG`, `LAZARUS_LOG` nor `--log-level`: the
/// environment of a user who asked for nothing.
fn lazarus_unlogged(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_lazarus"))
        .args(args)
        .env_remove("RUST_LOG")
        .env_remove("LAZARUS_LOG")
        .output()
        .expect("the lazarus binary runs")
}

/// Lines of `o`'s stderr logged at `info` or finer.
fn chatty_lines(o: &Output) -> Vec<String> {
    stderr(o)
        .lines()
        .filter(|l| {
            ["INFO ", "DEBUG ", "TRACE "]
                .iter()
                .any(|p| l.starts_with(p))
        })
        .map(str::to_string)
        .collect()
}

/// With `--log-level info` a detected failure is on stderr with its cause:
/// the launcher's verdict, and each surviving rank process's notice of it
/// (the filter reaches the rank processes: under `lazarus launch` too,
/// whose program never sees the option). Without `--log-level` (nor
/// `RUST_LOG`) the same runs log nothing at `info` or `debug`.
#[test]
fn log_level_info_shows_a_failure_with_its_cause_on_every_process() {
    let run = [
        "run",
        "cg",
        "--class",
        "S",
        "--ranks",
        "4",
        "--backend",
        "processes",
        "--protocol",
        "coordinated",
        "--kill",
        "1@50%",
    ];
    let cause = "failed: killed by fault injection (1@50%)";
    let told = "told that rank 1 failed: killed by fault injection (1@50%)";
    let quiet = lazarus_unlogged(&run);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert_eq!(failures(&quiet), Some(1), "{}", stdout(&quiet));
    assert!(chatty_lines(&quiet).is_empty(), "{}", stderr(&quiet));
    assert!(!stderr(&quiet).contains(cause), "{}", stderr(&quiet));

    let mut loud = run.to_vec();
    loud.extend(["--log-level", "info"]);
    let o = lazarus_unlogged(&loud);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(failures(&o), Some(1), "{}", stdout(&o));
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("INFO lazarus launcher: rank 1 ") && l.contains(cause)),
        "no launcher line with the cause: {err}"
    );
    // A line from a surviving rank's process (ranks 0, 2 and 3 are told).
    assert!(
        err.lines()
            .any(|l| l.starts_with("INFO lazarus: rank ") && l.contains(told)),
        "no rank line with the cause: {err}"
    );

    let solver = example("launched_solver");
    let launch = |extra: &[&str]| {
        let mut args = vec!["launch", "-n", "4", "--kill", "1@50%"];
        args.extend_from_slice(extra);
        args.extend(["--", &solver, "200"]);
        lazarus_unlogged(&args)
    };
    let quiet = launch(&[]);
    assert_eq!(quiet.status.code(), Some(0), "{}", stderr(&quiet));
    assert!(chatty_lines(&quiet).is_empty(), "{}", stderr(&quiet));
    let o = launch(&["--log-level", "info"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.lines()
            .any(|l| l.starts_with("INFO lazarus: rank ") && l.contains(told)),
        "no line from the program's rank processes: {err}"
    );
}
