//! `lazarus sim`: scale studies of the communication patterns on the
//! simulator.
//!
//! Runs a [`Pattern`] under each protocol on the `sim` backend (forced,
//! whatever `base.backend` says) and reports, per protocol, what a scale
//! study needs: checkpoint coordination and recovery time in virtual
//! seconds, messages and bytes carried, and what the simulation itself cost
//! (wall time, events per second, peak resident memory).

use std::fmt::Write as _;

use serde::Serialize;

use crate::apps::patterns::{Pattern, PatternParams, run_pattern};
use crate::protocol::ProtocolKind;
use crate::{Backend, Config, Error, Result};

/// One protocol's figures in a scale study. Times are virtual (simulated)
/// seconds unless named `wall`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScaleRow {
    /// Protocol name.
    pub protocol: String,
    /// Number of ranks.
    pub ranks: usize,
    /// Number of failure domains.
    pub nodes: usize,
    /// Whether the run verified against the pattern's closed form.
    pub verified: bool,
    /// The verification value (empty when the job failed).
    pub value: String,
    /// Verification details, or the job's error when it failed.
    pub detail: String,
    /// Virtual time at the end of the run.
    pub virtual_s: f64,
    /// Longest time one rank spent in one checkpoint (coordination
    /// included): `JobStats::checkpoint_s`.
    pub checkpoint_s: f64,
    /// Time spent in checkpoints, averaged over ranks:
    /// `JobStats::checkpoint_s_total`.
    pub checkpoint_s_total: f64,
    /// Median snapshot latency at rank 0 (entering a generation to its
    /// commit): `JobStats::snapshot_latency_s`.
    #[serde(default)]
    pub snapshot_latency_s: f64,
    /// Checkpoint generations committed.
    pub checkpoints: u64,
    /// Time from failures until every rank resumed, summed over recoveries.
    pub recovery_s: f64,
    /// Failure events.
    pub failures: u64,
    /// Simulator events (deliveries, wake-ups, scheduling decisions).
    pub events: u64,
    /// The simulator's trace hash, hexadecimal: equal seeds give equal hashes.
    pub trace_hash: String,
    /// Real seconds the simulation took.
    pub wall_s: f64,
    /// Simulator events per real second.
    pub events_per_s: f64,
    /// Frames the simulated network carried (application, protocol, store
    /// and runtime frames).
    pub messages: u64,
    /// Bytes the simulated network carried.
    pub bytes: u64,
    /// Peak resident memory of this process during the run, MiB: Linux's
    /// `VmHWM`, reset before each run when the kernel allows it (Linux 4.0+,
    /// `/proc/self/clear_refs`). It is a process-wide high-water mark, so it
    /// includes whatever else the process held or did concurrently (other
    /// tests, for instance), and an earlier run's peak when the reset is not
    /// available. 0.0 where `/proc` is not available.
    pub peak_rss_mib: f64,
    /// Bytes of the simulated ranks' coroutine stacks resident at the end,
    /// over all ranks (`SimReport::stack_bytes`).
    #[serde(default)]
    pub stack_bytes: u64,
    /// Whether every rank's stack had a guard page
    /// (`SimReport::stacks_guarded`).
    #[serde(default)]
    pub stacks_guarded: bool,
    /// Ranks rolled back by recoveries (0 when warnings moved every rank
    /// off a node in time: 001's point).
    #[serde(default)]
    pub ranks_rolled_back: u64,
    /// Workers, evacuations and time per iteration, with `--workers` or
    /// `--warn` (001).
    #[serde(default)]
    pub migration: Option<crate::migration::MigrationReport>,
}

/// The process's peak resident set size (`VmHWM` of `/proc/self/status`) in
/// MiB; 0.0 when unavailable (not Linux).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

/// Reset the process's peak resident set size to the current one (best
/// effort: writing `5` to `/proc/self/clear_refs`, Linux 4.0+).
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// Run `pattern` with `params` under each of `protocols` on the simulator,
/// with everything else from `base` (ranks, nodes, kills, checkpoint
/// interval, seed, network model). A job that fails (a kill under `none`,
/// say) gives a row with `verified: false` and the error in `detail`; an
/// invalid configuration is an error.
pub fn scale_study(
    pattern: Pattern,
    params: &PatternParams,
    base: &Config,
    protocols: &[ProtocolKind],
) -> Result<Vec<ScaleRow>> {
    if protocols.is_empty() {
        return Err(Error::config("protocols", "name at least one protocol"));
    }
    let mut rows = Vec::with_capacity(protocols.len());
    for &protocol in protocols {
        let cfg = base.clone().backend(Backend::Sim).compared_under(protocol);
        reset_peak_rss();
        let report = run_pattern(pattern, params, &cfg);
        let peak_rss_mib = peak_rss_mib();
        // A configuration the simulator refuses at its start (more ranks
        // than the kernel's mapping limit holds) is a usage error, not a
        // row that failed.
        if let Err(e @ Error::Config { .. }) = &report.outcome {
            return Err(e.clone());
        }
        let Some(sim) = report.sim else {
            // The job did not start: its configuration is invalid.
            return Err(match report.outcome {
                Err(e) => e,
                Ok(_) => Error::Driver("the simulator gave no report".into()),
            });
        };
        let (verified, value, detail) = match report.outcome {
            Ok(v) => match v.into_iter().next() {
                Some(v) => (v.verified, v.value, v.detail),
                None => (false, String::new(), "no rank returned".into()),
            },
            Err(e) => (false, String::new(), e.to_string()),
        };
        let st = &report.stats;
        rows.push(ScaleRow {
            protocol: protocol.name().into(),
            ranks: cfg.ranks,
            nodes: cfg.nodes,
            verified,
            value,
            detail,
            virtual_s: sim.virtual_s,
            checkpoint_s: st.checkpoint_s,
            checkpoint_s_total: st.checkpoint_s_total,
            snapshot_latency_s: st.snapshot_latency_s,
            checkpoints: st.checkpoints,
            recovery_s: st.recovery_s,
            failures: st.failures,
            events: sim.events,
            trace_hash: format!("{:016x}", sim.trace_hash),
            wall_s: sim.wall_s,
            events_per_s: sim.events as f64 / sim.wall_s.max(1e-9),
            messages: sim.messages,
            bytes: sim.bytes,
            peak_rss_mib,
            stack_bytes: sim.stack_bytes,
            stacks_guarded: sim.stacks_guarded,
            ranks_rolled_back: st.ranks_rolled_back,
            migration: st.migration.clone(),
        });
    }
    Ok(rows)
}

/// Draw checkpoint coordination time (`checkpoint_s`, the longest one rank
/// spent in one checkpoint) and recovery time against the rank count, one
/// line per protocol and quantity, log-log, as SVG at `path` (003 §7.1 and
/// 004 §1: how coordination grows with scale). Zero times (a protocol
/// without checkpoints, a run without failures) are left out.
pub fn plot_svg(rows: &[ScaleRow], path: &std::path::Path) -> Result<()> {
    use plotters::prelude::*;

    let fail = super::plot::draw_error(path);
    let mut series: Vec<(String, Vec<(f64, f64)>)> = Vec::new();
    let mut protocols: Vec<&str> = rows.iter().map(|r| r.protocol.as_str()).collect();
    protocols.sort_unstable();
    protocols.dedup();
    for p in &protocols {
        for (what, get) in [
            (
                "checkpoint",
                (|r: &ScaleRow| r.checkpoint_s) as fn(&ScaleRow) -> f64,
            ),
            ("recovery", |r: &ScaleRow| r.recovery_s),
        ] {
            let mut pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.protocol == *p && r.verified && get(r) > 0.0)
                .map(|r| (r.ranks as f64, get(r) * 1e3))
                .collect();
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            if !pts.is_empty() {
                series.push((format!("{p} {what}"), pts));
            }
        }
    }
    let all = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (f64::MAX, 0.0f64, f64::MAX, 0.0f64);
    for &(x, y) in all {
        (x_lo, x_hi, y_lo, y_hi) = (x_lo.min(x), x_hi.max(x), y_lo.min(y), y_hi.max(y));
    }
    if series.is_empty() {
        return Err(Error::config(
            "plot",
            "no verified run with a checkpoint or a recovery to draw",
        ));
    }
    let root = SVGBackend::new(path, (860, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Checkpoint coordination and recovery time against ranks (simulated)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(
            (x_lo / 1.5..x_hi * 1.5).log_scale(),
            (y_lo / 2.0..y_hi * 2.0).log_scale(),
        )
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("ranks")
        .y_desc("virtual time [ms]")
        .x_label_formatter(&|v| format!("{v:.0}"))
        .y_label_formatter(&|v| super::plot::log_tick(*v))
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, pts)) in series.into_iter().enumerate() {
        super::plot::line_with_points(&mut chart, pts, i, name, &fail)?;
    }
    super::plot::finish(&mut chart, SeriesLabelPosition::UpperLeft, &fail)
}

/// 001 Fig. 5 per row that had workers ([`describe_migration`]).
pub fn render_proactive(rows: &[ScaleRow]) -> String {
    (rows.iter())
        .filter_map(|r| {
            let m = r.migration.as_ref()?;
            Some(describe_migration(
                m,
                &r.protocol,
                r.ranks,
                r.nodes,
                r.ranks_rolled_back,
            ))
        })
        .collect()
}

/// What proactive fault tolerance did in one run (001): the moves and the
/// location service's forwarding; each evacuation (when, how many ranks
/// and bytes, how long: 001 §4.1); and the median time per iteration
/// before the first warning, after the evacuation and after load
/// balancing, with their ratios to the time before (Fig. 5).
pub fn describe_migration(
    m: &crate::migration::MigrationReport,
    protocol: &str,
    ranks: usize,
    nodes: usize,
    rolled_back: u64,
) -> String {
    let ms = |s: Option<f64>| s.map_or("-".to_string(), |s| format!("{:.3} ms", s * 1e3));
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!(" ({:.2}x)", a / b),
        _ => String::new(),
    };
    let mut out = format!(
        "proactive (001) under {protocol}: {ranks} ranks on {} workers over {nodes} nodes; {} moves \
         ({}), {} for balance; {} forwarded, {} routing updates; ranks rolled back {rolled_back}\n",
        m.workers,
        m.migrations,
        super::human_bytes(m.migrated_bytes),
        m.balance_moves,
        m.forwarded,
        m.routing_updates,
    );
    for e in &m.evacuations {
        let link = match e.seconds {
            // 001 Fig. 4a's ratio, where the bytes are a part of it worth
            // the name.
            Some(s) if e.link_s * 10.0 >= s && e.link_s > 0.0 => format!(
                " ({:.2}x the {:.3} ms its bytes take over the link)",
                s / e.link_s,
                e.link_s * 1e3
            ),
            Some(_) => format!(
                " (its bytes take {:.3} ms over the link: waiting for the ranks' safe points \
                 dominates)",
                e.link_s * 1e3
            ),
            None => String::new(),
        };
        out.push_str(&format!(
            "  warning {} (workers {:?}) at {:.3} ms: {} ranks, {} moved; evacuation time {}{link}\n",
            e.warning,
            e.workers,
            e.at_s * 1e3,
            e.ranks,
            super::human_bytes(e.bytes),
            ms(e.seconds),
        ));
    }
    if m.empty_node_deaths > 0 {
        out.push_str(&format!(
            "  {} node death(s) found no rank left to kill\n",
            m.empty_node_deaths
        ));
    }
    let (before, evacuated, balanced) = m.phases();
    out.push_str(&format!(
        "  time per iteration (001 Fig. 5): before the warning {}, after evacuation {}{}, after \
         balancing {}{}\n",
        ms(before),
        ms(evacuated),
        ratio(evacuated, before),
        ms(balanced),
        ratio(balanced, before),
    ));
    out
}

/// 001 Fig. 5: time per iteration against the iteration, one line per
/// row that had workers, as SVG at `path`.
pub fn plot_iterations(rows: &[ScaleRow], path: &std::path::Path) -> Result<()> {
    use plotters::prelude::*;

    let fail = super::plot::draw_error(path);
    let series: Vec<(String, Vec<(f64, f64)>)> = (rows.iter())
        .filter_map(|r| {
            let m = r.migration.as_ref()?;
            let pts = (m.iteration_s.iter().enumerate())
                .skip(1) // the first includes start-up
                .map(|(i, &s)| (i as f64 + 1.0, s * 1e3))
                .collect::<Vec<_>>();
            (!pts.is_empty()).then(|| (format!("{} ({} ranks)", r.protocol, r.ranks), pts))
        })
        .collect();
    if series.is_empty() {
        return Err(Error::config(
            "plot",
            "no run with workers (--workers or --warn) to draw",
        ));
    }
    let x_hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.0))
        .fold(1.0, f64::max);
    let y_hi = series
        .iter()
        .flat_map(|(_, p)| p.iter().map(|q| q.1))
        .fold(0.0, f64::max);
    let y_lo = (series.iter().flat_map(|(_, p)| p.iter().map(|q| q.1)))
        .filter(|&y| y > 0.0)
        .fold(f64::MAX, f64::min)
        .min(y_hi);
    let root = SVGBackend::new(path, (860, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Time per iteration with a fault warning (001 Fig. 5, simulated)",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..x_hi + 1.0, (y_lo / 1.3..y_hi * 1.3).log_scale())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("iteration")
        .y_desc("time per iteration [ms]")
        .y_label_formatter(&|v| super::plot::log_tick(*v))
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, (name, pts)) in series.into_iter().enumerate() {
        super::plot::line_with_points(&mut chart, pts, i, name, &fail)?;
    }
    super::plot::finish(&mut chart, SeriesLabelPosition::LowerRight, &fail)
}

/// A plain-text table of `rows`, one line per protocol (virtual times in
/// milliseconds).
pub fn render(rows: &[ScaleRow]) -> String {
    let header = [
        "protocol",
        "ranks",
        "nodes",
        "ok",
        "virtual_ms",
        "ckpt_max_ms",
        "ckpt_avg_ms",
        "snap_ms",
        "ckpts",
        "recov_ms",
        "fail",
        "messages",
        "sent",
        "events",
        "wall_s",
        "events/s",
        "rss",
        "rss/rank",
        "stack/rank",
        "trace_hash",
        "value",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                r.protocol.clone(),
                r.ranks.to_string(),
                r.nodes.to_string(),
                if r.verified { "yes" } else { "NO" }.into(),
                format!("{:.3}", r.virtual_s * 1e3),
                format!("{:.3}", r.checkpoint_s * 1e3),
                format!("{:.3}", r.checkpoint_s_total * 1e3),
                format!("{:.3}", r.snapshot_latency_s * 1e3),
                r.checkpoints.to_string(),
                format!("{:.3}", r.recovery_s * 1e3),
                r.failures.to_string(),
                r.messages.to_string(),
                super::human_bytes(r.bytes),
                r.events.to_string(),
                format!("{:.2}", r.wall_s),
                format!("{:.0}", r.events_per_s),
                super::human_bytes_f64(r.peak_rss_mib * (1u64 << 20) as f64),
                super::human_bytes_f64(
                    r.peak_rss_mib * (1u64 << 20) as f64 / r.ranks.max(1) as f64,
                ),
                super::human_bytes_f64(r.stack_bytes as f64 / r.ranks.max(1) as f64),
                r.trace_hash.clone(),
                r.value.clone(),
            ]
        })
        .collect();
    let widths: Vec<usize> = header
        .iter()
        .enumerate()
        .map(|(i, h)| {
            cells
                .iter()
                .map(|c| c[i].len())
                .chain([h.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let mut line = |cols: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (i, c) in cols.enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            // Names left-aligned, numbers right-aligned.
            if i == 0 || i + 1 >= header.len() - 1 {
                let _ = write!(l, "{c:<w$}", w = widths[i]);
            } else {
                let _ = write!(l, "{c:>w$}", w = widths[i]);
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for c in &cells {
        line(&mut c.iter().map(String::as_str));
    }
    for r in rows.iter().filter(|r| !r.verified) {
        let _ = writeln!(out, "{}: {}", r.protocol, r.detail);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::patterns::expected;

    fn params() -> PatternParams {
        PatternParams {
            iterations: 20,
            ..PatternParams::default()
        }
    }

    fn one(pattern: Pattern, cfg: &Config, protocol: ProtocolKind) -> ScaleRow {
        let rows = scale_study(pattern, &params(), cfg, &[protocol]).expect("valid study");
        assert_eq!(rows.len(), 1);
        rows.into_iter().next().expect("one row")
    }

    /// Failure-free under `none` and `coordinated`, then a kill under
    /// `coordinated`: every run verifies with the same value.
    fn check_pattern(pattern: Pattern, base: &Config, kills: &[&str]) {
        let reference = expected(pattern, base.ranks, &params()).to_string();
        let rows = scale_study(
            pattern,
            &params(),
            base,
            &[ProtocolKind::None, ProtocolKind::Coordinated],
        )
        .expect("valid study");
        for r in &rows {
            assert!(r.verified, "{pattern} {}: {}", r.protocol, r.detail);
            assert_eq!(r.value, reference);
            assert_eq!(r.failures, 0);
            assert!(r.messages > 0 && r.bytes > 0 && r.events > 0);
            assert!(r.virtual_s >= 20.0 * params().compute_s, "{r:?}");
        }
        assert_eq!(rows[1].checkpoints, 4, "every 5 of 20 iterations");
        assert!(rows[1].checkpoint_s > 0.0);
        assert!(
            rows[1].messages > rows[0].messages,
            "checkpoints cost messages"
        );
        for k in kills {
            let cfg = base.clone().kill(k.parse().expect("kill spec"));
            let r = one(pattern, &cfg, ProtocolKind::Coordinated);
            assert!(r.verified, "{pattern} with {k}: {}", r.detail);
            assert_eq!(r.value, reference, "{pattern} with {k}");
            assert!(r.failures >= 1, "{pattern}: {k} did not fire");
            assert!(r.recovery_s > 0.0, "{pattern} with {k}: {r:?}");
            // Without recovery the same kill ends the job.
            let r = one(pattern, &cfg, ProtocolKind::None);
            assert!(!r.verified && r.value.is_empty() && !r.detail.is_empty());
        }
    }

    #[test]
    fn stencil_pattern_64_ranks_survives_rank_and_node_kills() {
        let base = Config::new(64).checkpoint_every(5);
        check_pattern(Pattern::Stencil, &base, &["5@50%"]);
        check_pattern(Pattern::Stencil, &base.nodes(4), &["node:1@40%"]);
    }

    #[test]
    fn allreduce_pattern_33_ranks_survives_a_kill() {
        let base = Config::new(33).checkpoint_every(5);
        check_pattern(Pattern::Allreduce, &base, &["5@50%"]);
    }

    #[test]
    fn same_seed_same_trace() {
        let cfg = Config::new(64)
            .nodes(4)
            .checkpoint_every(5)
            .seed(7)
            .kill("5@50%".parse().expect("kill spec"));
        let a = one(Pattern::Stencil, &cfg, ProtocolKind::Coordinated);
        let b = one(Pattern::Stencil, &cfg, ProtocolKind::Coordinated);
        assert_eq!(a.trace_hash, b.trace_hash);
        assert_eq!(
            (a.events, a.messages, a.bytes, a.virtual_s),
            (b.events, b.messages, b.bytes, b.virtual_s)
        );
        let c = one(Pattern::Stencil, &cfg.seed(8), ProtocolKind::Coordinated);
        assert_ne!(a.trace_hash, c.trace_hash, "the seed drives the schedule");
        assert_eq!(a.value, c.value);
    }

    #[test]
    fn study_refuses_bad_input_and_renders() {
        let base = Config::new(4);
        assert!(scale_study(Pattern::Stencil, &params(), &base, &[]).is_err());
        let bad = PatternParams {
            halo_bytes: 1,
            ..params()
        };
        assert!(scale_study(Pattern::Stencil, &bad, &base, &[ProtocolKind::None]).is_err());
        let rows = scale_study(Pattern::Allreduce, &params(), &base, &[ProtocolKind::None])
            .expect("valid study");
        let table = render(&rows);
        assert!(table.starts_with("protocol"));
        assert_eq!(table.lines().count(), 2, "{table}");
        assert!(peak_rss_mib() >= 0.0);
        let json = serde_json::to_value(&rows).expect("serialize");
        assert_eq!(json[0]["protocol"], "none");
    }

    /// Measurement, not a check: `cargo test --release --lib scale --
    /// --ignored --nocapture` (ranks from `LAZARUS_SCALE_RANKS`, default
    /// `1024,4096`).
    #[test]
    #[ignore]
    fn measure_stencil_scale() {
        let ranks: Vec<usize> = std::env::var("LAZARUS_SCALE_RANKS")
            .unwrap_or_else(|_| "1024,4096".into())
            .split(',')
            .map(|s| s.trim().parse().expect("rank count"))
            .collect();
        for n in ranks {
            let cfg = Config::new(n)
                .nodes(16)
                .checkpoint_every(5)
                .kill("5@50%".parse().expect("kill spec"));
            let rows = scale_study(
                Pattern::Stencil,
                &params(),
                &cfg,
                &[ProtocolKind::Coordinated],
            )
            .expect("valid study");
            eprintln!("{}", render(&rows));
            eprintln!("{}", serde_json::to_string(&rows).expect("json"));
            assert!(rows.iter().all(|r| r.verified));
        }
    }
}
