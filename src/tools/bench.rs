//! `lazarus bench`: protocols side by side in one invocation.
//!
//! Runs alternate between protocols so that machine noise hits all of them
//! alike: each repetition runs every protocol once, in the orders of a
//! Williams design (a Latin square balanced for the run before: over `n`
//! repetitions, or `2n` for an odd number `n` of protocols, every protocol
//! runs as often right after each other one, and once in every position of
//! the order per `n` repetitions). With one fixed order an effect of the run
//! before lands on one protocol: on this machine the run right after a run
//! that used little memory pays most for fresh memory, and with `none,
//! pessimistic, ulml` that was always `pessimistic`. Each
//! protocol's figure is the median wall time of its runs, reported with its
//! ratio to `none` (DESIGN principle 7). Every run must verify, and every
//! protocol must print the same value.
//!
//! Two ratios are reported, because this kind of machine (shared, with
//! other tenants' load arriving in bursts of seconds) moves a 0.1 s run by
//! up to 2× from one repetition to the next:
//! - `ratio`, the median of a protocol's runs over the median of the
//!   baseline's;
//! - `paired_ratio`, the median over repetitions of each run's wall time
//!   over the baseline run of the same repetition (they ran one after the
//!   other, so a burst that slows both cancels out). When the two disagree
//!   the noise was larger than the difference being measured.
//!
//! The paired ratio comes with a 95% confidence interval for the median
//! (`paired_ratio_ci95`), from order statistics: with `n` repetitions, the
//! interval between the `k`-th smallest and the `k`-th largest per-pair
//! ratio holds the true median with probability `1 − 2·P(Bin(n, ½) < k)`,
//! whatever the noise's distribution, as long as repetitions are
//! independent. It needs at least 6 repetitions; a target is met when the
//! whole interval is on its side.

use serde::Serialize;

use super::summary::RunSummary;

/// The fewest repetitions whose paired ratio gets a 95% confidence
/// interval (`median_ci95`), and so `lazarus bench`'s default.
pub const MIN_REPS_FOR_CI: usize = 6;
use crate::apps::{AppKind, AppParams, run_app};
use crate::fault::{KillSpec, WarnSpec};
use crate::protocol::ProtocolKind;
use crate::{Config, Error, Result};

/// Figures of one protocol.
#[derive(Debug, Clone, Serialize)]
pub struct ProtocolFigures {
    /// Protocol name.
    pub protocol: String,
    /// Median wall time, seconds.
    pub median_wall_s: f64,
    /// Median wall time divided by that of `none` (or of the first protocol
    /// when `none` is not benchmarked).
    pub ratio: f64,
    /// Median over repetitions of this protocol's wall time over the
    /// baseline's in the same repetition (see the module docs).
    pub paired_ratio: f64,
    /// 95% confidence interval of the paired ratio (see the module docs);
    /// `None` with fewer than 6 repetitions.
    pub paired_ratio_ci95: Option<[f64; 2]>,
    /// Every run's wall time, in order.
    pub wall_s: Vec<f64>,
    /// Whether every run verified.
    pub verified_all: bool,
    /// The verification value (identical across runs, or the bench fails).
    pub value: String,
    /// Median of the app's metrics per key, for pingpong: latency,
    /// bandwidth and forwarded bandwidth per size.
    pub metrics: serde_json::Value,
    /// Summaries of every run.
    pub runs: Vec<RunSummary>,
    /// With failures (`--failure`): the same job with those kills.
    pub failure: Option<FailureFigures>,
    /// With failures and warnings (`--failure` and `--warn`): the same
    /// kills, the warned nodes evacuated first (001): proactive against
    /// the reactive `failure` runs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub proactive: Option<FailureFigures>,
    /// With timelines recorded (`--trace`): the same job traced.
    pub traced: Option<TraceFigures>,
}

/// A protocol's runs with its timeline recorded, next to its untraced
/// runs: what tracing costs.
#[derive(Debug, Clone, Serialize)]
pub struct TraceFigures {
    /// Median wall time traced, seconds.
    pub median_wall_s: f64,
    /// Median over repetitions of the traced run's wall time over the
    /// untraced run of the same repetition.
    pub paired_ratio_to_untraced: f64,
    /// 95% confidence interval of that paired ratio.
    pub paired_ratio_to_untraced_ci95: Option<[f64; 2]>,
    /// Every traced run's wall time.
    pub wall_s: Vec<f64>,
    /// Median events recorded per rank and second of wall time.
    pub events_per_rank_s: f64,
    /// Summaries of every traced run (their timelines in `stats.trace`,
    /// not serialised).
    #[serde(skip)]
    pub runs: Vec<RunSummary>,
}

/// A protocol's runs with the bench's failure scenario, next to its
/// failure-free runs (002 Table 2: wall time with a failure over without).
#[derive(Debug, Clone, Serialize)]
pub struct FailureFigures {
    /// The kills of every run.
    pub kills: Vec<String>,
    /// The warnings of every run (001; empty for reactive runs).
    #[serde(default)]
    pub warnings: Vec<String>,
    /// Median wall time with the failures, seconds.
    pub median_wall_s: f64,
    /// That median over the protocol's own failure-free median.
    pub ratio_to_failure_free: f64,
    /// Median over repetitions of the failure run's wall time over the
    /// failure-free run of the same repetition (which ran just before it).
    pub paired_ratio_to_failure_free: f64,
    /// 95% confidence interval of that paired ratio.
    pub paired_ratio_to_failure_free_ci95: Option<[f64; 2]>,
    /// Every run's wall time.
    pub wall_s: Vec<f64>,
    /// Median time from a failure until the ranks that roll back resumed.
    pub median_recovery_s: f64,
    /// Ranks rolled back per run.
    pub ranks_rolled_back: Vec<u64>,
    /// Median CPU time with the failures (user and system, every rank
    /// process), seconds, where the backend measures it (processes, mpi):
    /// 002 Table 2's other column. A killed process's time before its
    /// death is in no report, so this undercounts.
    pub median_cpu_s: Option<f64>,
    /// Median over repetitions of the failure run's CPU time over the
    /// failure-free run's of the same repetition.
    pub paired_cpu_ratio_to_failure_free: Option<f64>,
    /// Whether every run verified with the failure-free value.
    pub verified_all: bool,
    /// Summaries of every run.
    pub runs: Vec<RunSummary>,
}

/// The bench report.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// App name.
    pub app: String,
    /// Class.
    pub class: Option<String>,
    /// Ranks.
    pub ranks: usize,
    /// Nodes.
    pub nodes: usize,
    /// Backend.
    pub backend: String,
    /// Repetitions per protocol.
    pub reps: usize,
    /// The baseline protocol of the ratios.
    pub baseline: String,
    /// Per protocol.
    pub protocols: Vec<ProtocolFigures>,
}

/// The failure runs of one protocol, summarised against its failure-free
/// median.
fn failure_figures(
    kills: &[KillSpec],
    warnings: &[WarnSpec],
    failed: &mut Vec<RunSummary>,
    free: &[RunSummary],
    free_median: f64,
) -> Option<FailureFigures> {
    if failed.is_empty() {
        return None;
    }
    let wall_s: Vec<f64> = failed.iter().map(|r| r.stats.wall_s).collect();
    let free_s: Vec<f64> = free.iter().map(|r| r.stats.wall_s).collect();
    let m = median(&wall_s);
    let each = ratios(&wall_s, &free_s);
    let value = free.first().map(|r| r.result.clone());
    // Every run's CPU time, or none if a run lacks it.
    let cpu = |runs: &[RunSummary]| -> Option<Vec<f64>> {
        runs.iter()
            .map(|r| Some(r.stats.user_cpu_s? + r.stats.system_cpu_s?))
            .collect()
    };
    let (cpu_failed, cpu_free) = (cpu(failed), cpu(free));
    Some(FailureFigures {
        kills: kills.iter().map(ToString::to_string).collect(),
        warnings: warnings.iter().map(ToString::to_string).collect(),
        median_wall_s: m,
        ratio_to_failure_free: m / free_median,
        paired_ratio_to_failure_free: median(&each),
        paired_ratio_to_failure_free_ci95: median_ci95(&each),
        median_recovery_s: median(
            &failed
                .iter()
                .map(|r| r.stats.recovery_s)
                .collect::<Vec<_>>(),
        ),
        ranks_rolled_back: failed.iter().map(|r| r.stats.ranks_rolled_back).collect(),
        median_cpu_s: cpu_failed.as_deref().map(median),
        paired_cpu_ratio_to_failure_free: cpu_failed
            .as_deref()
            .zip(cpu_free.as_deref())
            .map(|(f, free)| median(&ratios(f, free))),
        verified_all: failed
            .iter()
            .all(|r| r.verified && Some(&r.result) == value.as_ref()),
        wall_s,
        runs: std::mem::take(failed),
    })
}

/// The median of `v` (mean of the middle two for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// `a[i] / b[i]` for every `i` of the common length.
fn ratios(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| x / y).collect()
}

/// The median over `i` of `a[i] / b[i]` (over the common length).
pub fn paired_ratio(a: &[f64], b: &[f64]) -> f64 {
    median(&ratios(a, b))
}

/// A distribution-free 95% confidence interval for the median of the
/// population `v` was drawn from: `[v_(k), v_(n+1−k)]` (order statistics,
/// 1-based) for the largest `k` whose coverage `1 − 2·P(Bin(n, ½) ≤ k − 1)`
/// is at least 0.95. `None` for fewer than 6 samples (even the widest
/// interval, `[min, max]`, covers less than 95% then) or a NaN among them.
pub fn median_ci95(v: &[f64]) -> Option<[f64; 2]> {
    let n = v.len();
    if v.iter().any(|x| x.is_nan()) {
        return None;
    }
    // P(Bin(n, ½) ≤ j) for j = 0, 1, ...: the running sum of C(n, j) / 2^n,
    // each term from its logarithm (C(n, j) and 2^n overflow past n ≈ 1000).
    let mut below = 0.0; // P(Bin ≤ k − 1)
    let mut ln_term = -(n as f64) * std::f64::consts::LN_2; // ln(C(n, k) / 2^n)
    let mut k = 0;
    while k < n / 2 {
        let next = below + ln_term.exp();
        if 1.0 - 2.0 * next < 0.95 {
            break;
        }
        below = next;
        ln_term += ((n - k) as f64).ln() - ((k + 1) as f64).ln();
        k += 1;
    }
    if k == 0 {
        return None;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    Some([s[k - 1], s[n - k]])
}

/// Pingpong: per size, the median over the runs of each figure (latency,
/// bandwidth, forwarded bandwidth).
fn pingpong_medians(runs: &[&serde_json::Value]) -> serde_json::Value {
    use std::collections::BTreeMap;
    // bytes -> figure -> samples; sizes in the order the app measured them.
    let mut sizes: Vec<u64> = Vec::new();
    let mut samples: BTreeMap<u64, BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for m in runs {
        for p in m.as_array().into_iter().flatten() {
            let (Some(b), Some(fields)) = (p["bytes"].as_u64(), p.as_object()) else {
                continue;
            };
            if !sizes.contains(&b) {
                sizes.push(b);
            }
            let at = samples.entry(b).or_default();
            for (k, v) in fields.iter().filter(|(k, _)| *k != "bytes") {
                if let Some(v) = v.as_f64() {
                    at.entry(k.clone()).or_default().push(v);
                }
            }
        }
    }
    serde_json::Value::Array(
        sizes
            .iter()
            .map(|b| {
                let mut point = serde_json::Map::new();
                point.insert("bytes".into(), (*b).into());
                for (k, v) in &samples[b] {
                    point.insert(k.clone(), median(v).into());
                }
                serde_json::Value::Object(point)
            })
            .collect(),
    )
}

/// The app metrics of each run.
fn metrics_of(runs: &[RunSummary]) -> Vec<&serde_json::Value> {
    runs.iter().map(|r| &r.metrics).collect()
}

/// Pingpong: `key` of the point of `bytes` in each run's metrics, in run
/// order (NaN where a run has none).
fn per_run(runs: &[&serde_json::Value], bytes: u64, key: &str) -> Vec<f64> {
    runs.iter()
        .map(|m| {
            (m.as_array().into_iter().flatten())
                .find(|p| p["bytes"].as_u64() == Some(bytes))
                .and_then(|p| p[key].as_f64())
                .unwrap_or(f64::NAN)
        })
        .collect()
}

/// The name of the paired ratio of the pingpong figure `metric`
/// (`bandwidth_mb_s` → `bandwidth_paired_ratio`).
pub fn paired_ratio_key(metric: &str) -> String {
    format!("{}_paired_ratio", metric.trim_end_matches("_mb_s"))
}

/// The name of the 95% confidence interval of that paired ratio
/// (`bandwidth_mb_s` → `bandwidth_paired_ratio_ci95`).
pub fn paired_ratio_ci95_key(metric: &str) -> String {
    format!("{}_ci95", paired_ratio_key(metric))
}

/// Pingpong: add to each size of `metrics` the paired ratios of its
/// bandwidths to the baseline's (`bandwidth_paired_ratio`,
/// `forwarded_bandwidth_paired_ratio`; see the module docs), from the
/// metrics of each run and of the baseline's runs.
fn add_paired_bandwidths(
    metrics: &mut serde_json::Value,
    runs: &[&serde_json::Value],
    base: &[&serde_json::Value],
) {
    for point in metrics.as_array_mut().into_iter().flatten() {
        let Some(bytes) = point["bytes"].as_u64() else {
            continue;
        };
        for key in ["bandwidth_mb_s", "forwarded_bandwidth_mb_s"] {
            let each = ratios(&per_run(runs, bytes, key), &per_run(base, bytes, key));
            let Some(obj) = point.as_object_mut() else {
                continue;
            };
            if let Some(r) = serde_json::Number::from_f64(median(&each)) {
                obj.insert(paired_ratio_key(key), serde_json::Value::Number(r));
            }
            if let Some(ci) = median_ci95(&each) {
                obj.insert(paired_ratio_ci95_key(key), ci.into());
            }
        }
    }
}

/// The protocols (indices into a list of `n`) in the order repetition
/// `rep` runs them: row `rep` of a Williams design (see the module docs).
/// The first row is `0, 1, n−1, 2, n−2, ...`; row `r` adds `r` to it
/// (mod `n`); for an odd `n`, rows `n..2n` are rows `0..n` reversed.
fn run_order(rep: usize, n: usize) -> Vec<usize> {
    let shift = rep % n.max(1);
    let mut order: Vec<usize> = (0..n)
        .map(|k| match k {
            0 => 0,
            k if k % 2 == 1 => k.div_ceil(2),
            k => n - k / 2,
        })
        .map(|b| (b + shift) % n)
        .collect();
    if n % 2 == 1 && (rep / n) % 2 == 1 {
        order.reverse();
    }
    order
}

/// A protocol's traced runs, summarised against its untraced ones.
fn trace_figures(traced: &mut Vec<RunSummary>, plain: &[RunSummary]) -> Option<TraceFigures> {
    if traced.is_empty() {
        return None;
    }
    let wall_s: Vec<f64> = traced.iter().map(|r| r.stats.wall_s).collect();
    let plain_s: Vec<f64> = plain.iter().map(|r| r.stats.wall_s).collect();
    let each = ratios(&wall_s, &plain_s);
    let rates: Vec<f64> = (traced.iter())
        .filter_map(|r| {
            let t = r.stats.trace.as_ref()?;
            Some(t.len() as f64 / t.ranks.len().max(1) as f64 / r.stats.wall_s.max(1e-9))
        })
        .collect();
    Some(TraceFigures {
        median_wall_s: median(&wall_s),
        paired_ratio_to_untraced: median(&each),
        paired_ratio_to_untraced_ci95: median_ci95(&each),
        wall_s,
        events_per_rank_s: median(&rates),
        runs: std::mem::take(traced),
    })
}

/// What [`bench`] tells its caller as it goes (a progress display).
#[derive(Debug)]
pub enum BenchEvent<'a> {
    /// Run `run` (counted from 0) of the bench's `of` runs starts.
    Start {
        /// Runs done so far.
        run: usize,
        /// Runs in all.
        of: usize,
        /// The protocol it runs.
        protocol: ProtocolKind,
        /// Whether it runs with the bench's failure scenario.
        with_failure: bool,
        /// Whether it runs with the bench's warnings too (001).
        with_warnings: bool,
        /// Whether it records its timeline.
        traced: bool,
    },
    /// A run ended.
    Done(&'a RunSummary),
}

/// Run `app` under each protocol `reps` times, alternating; with `traced`,
/// each run is followed or preceded (alternately) by the same run with its
/// timeline recorded. `on_event` sees every run start and end. The
/// warnings of `base` (001) are not part of the failure-free runs: with a
/// `failure` scenario, each recovering protocol runs it once reactively
/// (the kills alone) and once proactively (the warnings, then the kills).
#[allow(clippy::too_many_arguments)]
pub fn bench(
    app: AppKind,
    params: &AppParams,
    base: &Config,
    protocols: &[ProtocolKind],
    reps: usize,
    failure: &[KillSpec],
    traced: bool,
    mut on_event: impl FnMut(BenchEvent<'_>),
) -> Result<BenchReport> {
    if protocols.is_empty() {
        return Err(Error::config("protocols", "name at least one protocol"));
    }
    if reps == 0 {
        return Err(Error::config("reps", "at least one repetition"));
    }
    // A protocol that cannot run this configuration is a usage error, not
    // a row of failed runs.
    for &p in protocols {
        base.clone().compared_under(p).validate()?;
    }
    let warnings = base.warnings.clone();
    if !warnings.is_empty() && failure.is_empty() {
        return Err(Error::config(
            "warnings",
            "a bench compares a warned failure with an unwarned one: give the kills with \
             --failure too",
        ));
    }
    let base = &Config {
        warnings: Vec::new(),
        ..base.clone()
    };
    let mut runs: Vec<Vec<RunSummary>> = vec![Vec::new(); protocols.len()];
    let mut failed: Vec<Vec<RunSummary>> = vec![Vec::new(); protocols.len()];
    let mut warned: Vec<Vec<RunSummary>> = vec![Vec::new(); protocols.len()];
    let mut with_trace: Vec<Vec<RunSummary>> = vec![Vec::new(); protocols.len()];
    let with_failure = |p: ProtocolKind| !failure.is_empty() && p.replaces_failed_ranks();
    let of = reps
        * (protocols.iter())
            .map(|&p| {
                1 + usize::from(traced)
                    + usize::from(with_failure(p)) * (1 + usize::from(!warnings.is_empty()))
            })
            .sum::<usize>();
    let mut done = 0;
    let mut run_one = |cfg: &Config, with_failure| {
        on_event(BenchEvent::Start {
            run: done,
            of,
            protocol: cfg.protocol,
            with_failure,
            with_warnings: !cfg.warnings.is_empty(),
            traced: cfg.trace.is_some(),
        });
        let run = run_app(app, params, cfg);
        let s = RunSummary::new(app, params, cfg, &run);
        on_event(BenchEvent::Done(&s));
        done += 1;
        s
    };
    // Failure-free and failure runs alternate too, so noise hits both alike.
    for rep in 0..reps {
        for i in run_order(rep, protocols.len()) {
            let p = protocols[i];
            let cfg = base.clone().compared_under(p);
            // Traced and untraced runs take turns going first.
            let variants: &[bool] = match (traced, rep % 2) {
                (false, _) => &[false],
                (true, 0) => &[false, true],
                (true, _) => &[true, false],
            };
            for &t in variants {
                let cfg = if t { cfg.clone().traced() } else { cfg.clone() };
                let s = run_one(&cfg, false);
                if t {
                    with_trace[i].push(s);
                } else {
                    runs[i].push(s);
                }
            }
            if with_failure(p) {
                let mut cfg = cfg.clone();
                cfg.kills = failure.to_vec();
                // Reactive and proactive take turns going first.
                let proactive_first = rep % 2 == 1;
                for proactive in [proactive_first, !proactive_first] {
                    if proactive && warnings.is_empty() {
                        continue;
                    }
                    if proactive {
                        let cfg = Config {
                            warnings: warnings.clone(),
                            ..cfg.clone()
                        };
                        warned[i].push(run_one(&cfg, true));
                    } else {
                        failed[i].push(run_one(&cfg, true));
                    }
                }
            }
        }
    }
    let baseline_idx = protocols
        .iter()
        .position(|&p| p == ProtocolKind::None)
        .unwrap_or(0);
    let base_walls: Vec<f64> = runs[baseline_idx].iter().map(|r| r.stats.wall_s).collect();
    let base_median = median(&base_walls);
    // Before each protocol's runs move into its figures below.
    let all_metrics: Vec<serde_json::Value> = (runs.iter())
        .map(|r| match app {
            AppKind::Pingpong => {
                let mut m = pingpong_medians(&metrics_of(r));
                add_paired_bandwidths(&mut m, &metrics_of(r), &metrics_of(&runs[baseline_idx]));
                m
            }
            _ => serde_json::Value::Null,
        })
        .collect();
    let mut figures = Vec::new();
    for ((i, &p), metrics) in protocols.iter().enumerate().zip(all_metrics) {
        let walls: Vec<f64> = runs[i].iter().map(|r| r.stats.wall_s).collect();
        let m = median(&walls);
        let each = ratios(&walls, &base_walls);
        figures.push(ProtocolFigures {
            protocol: p.name().into(),
            median_wall_s: m,
            ratio: m / base_median,
            paired_ratio: median(&each),
            paired_ratio_ci95: median_ci95(&each),
            wall_s: walls,
            verified_all: runs[i].iter().all(|r| r.verified),
            value: runs[i]
                .first()
                .map(|r| r.result.clone())
                .unwrap_or_default(),
            metrics,
            failure: failure_figures(failure, &[], &mut failed[i], &runs[i], m),
            proactive: failure_figures(failure, &warnings, &mut warned[i], &runs[i], m),
            traced: trace_figures(&mut with_trace[i], &runs[i]),
            runs: std::mem::take(&mut runs[i]),
        });
    }
    Ok(BenchReport {
        app: app.name().into(),
        class: figures
            .first()
            .and_then(|f| f.runs.first())
            .and_then(|r| r.class.clone()),
        ranks: base.ranks,
        nodes: base.nodes,
        backend: base.backend.name().into(),
        reps,
        baseline: protocols[baseline_idx].name().into(),
        protocols: figures,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repetitions_follow_a_williams_design() {
        assert_eq!(run_order(0, 3), [0, 1, 2]);
        assert_eq!(run_order(1, 3), [1, 2, 0]);
        assert_eq!(run_order(3, 3), [2, 1, 0]);
        assert_eq!(run_order(0, 4), [0, 1, 3, 2]);
        assert_eq!(run_order(7, 1), [0]);
        assert!(run_order(0, 0).is_empty());
        for n in 2..=7 {
            let rows = if n % 2 == 0 { n } else { 2 * n };
            // Every row runs every protocol once.
            for r in 0..rows {
                let mut o = run_order(r, n);
                o.sort_unstable();
                assert_eq!(o, (0..n).collect::<Vec<_>>(), "n {n} row {r}");
            }
            // Every protocol right after every other one equally often.
            let mut after = vec![vec![0; n]; n];
            for r in 0..rows {
                for w in run_order(r, n).windows(2) {
                    after[w[1]][w[0]] += 1;
                }
            }
            let times = rows / n;
            for (b, row) in after.iter().enumerate() {
                for (a, &count) in row.iter().enumerate() {
                    let want = if a == b { 0 } else { times };
                    assert_eq!(count, want, "n {n}: {b} after {a}");
                }
            }
            // Every protocol in every position once per n rows.
            for p in 0..n {
                let mut at: Vec<usize> = (0..n)
                    .map(|r| run_order(r, n).iter().position(|&q| q == p).unwrap_or(n))
                    .collect();
                at.sort_unstable();
                assert_eq!(at, (0..n).collect::<Vec<_>>(), "n {n}: protocol {p}");
            }
        }
    }

    #[test]
    fn median_interval_is_the_order_statistics_of_95_percent_coverage() {
        // Coverage of [x_(k), x_(n+1-k)] is 1 - 2 P(Bin(n, 1/2) <= k - 1):
        // n = 5: k = 1 covers 93.75%, no interval; n = 6: k = 1 (96.9%);
        // n = 9: k = 2 (96.1%; k = 3 would be 82.0%); n = 21: k = 6 (97.3%;
        // k = 7 would be 92.2%).
        let ladder = |n: usize| (1..=n).map(|i| i as f64).collect::<Vec<_>>();
        assert_eq!(median_ci95(&ladder(MIN_REPS_FOR_CI - 1)), None);
        assert_eq!(median_ci95(&ladder(MIN_REPS_FOR_CI)), Some([1.0, 6.0]));
        assert_eq!(median_ci95(&ladder(9)), Some([2.0, 8.0]));
        assert_eq!(median_ci95(&ladder(21)), Some([6.0, 16.0]));
        // Past the range of C(n, k) in floating point, the normal
        // approximation's k ≈ (n − 1.96·√n)/2: 4,902 for n = 10,000.
        let [lo, hi] = median_ci95(&ladder(10_000)).expect("an interval");
        assert!((4_895.0..=4_905.0).contains(&lo), "{lo}");
        assert_eq!(hi, 10_001.0 - lo);
        // Order, not position, counts.
        let mut shuffled = ladder(21);
        shuffled.reverse();
        shuffled.swap(0, 7);
        assert_eq!(median_ci95(&shuffled), Some([6.0, 16.0]));
        assert_eq!(median_ci95(&[]), None);
        assert_eq!(median_ci95(&[1.0, 2.0, f64::NAN, 4.0, 5.0, 6.0, 7.0]), None);
        // Empirically: intervals from samples of a known median hold it in
        // about 95% of draws (at least, as the coverage is at least 0.95).
        use rand::{RngExt, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        let trials = 4000;
        let held = (0..trials)
            .filter(|_| {
                let v: Vec<f64> = (0..15).map(|_| rng.random_range(0.0..2.0)).collect();
                median_ci95(&v).is_some_and(|[lo, hi]| lo <= 1.0 && 1.0 <= hi)
            })
            .count();
        let rate = held as f64 / trials as f64;
        assert!((0.94..0.99).contains(&rate), "coverage {rate}");
    }

    #[test]
    fn paired_ratio_cancels_a_burst_that_slows_both_runs_of_a_repetition() {
        // The protocol costs 5% in every repetition; a burst doubles
        // repetitions 0 and 1, and one of the baseline's quiet runs.
        let base = [0.2, 0.2, 0.1, 0.2, 0.1];
        let prot = [0.21, 0.21, 0.105, 0.105, 0.105];
        assert!((paired_ratio(&prot, &base) - 1.05).abs() < 1e-12);
        // The ratio of medians (0.105 / 0.2) cannot tell.
        assert!((median(&prot) / median(&base) - 0.525).abs() < 1e-12);
        assert!(paired_ratio(&[], &[]).is_nan());
    }

    #[test]
    fn pingpong_points_get_paired_bandwidth_ratios() {
        let run = |bw: f64, fwd: f64| {
            serde_json::json!([
                {"bytes": 8, "bandwidth_mb_s": 10.0, "forwarded_bandwidth_mb_s": 10.0},
                {"bytes": 1048576, "bandwidth_mb_s": bw, "forwarded_bandwidth_mb_s": fwd},
            ])
        };
        let base = [run(1000.0, 1000.0), run(2000.0, 500.0), run(1000.0, 1000.0)];
        let prot = [run(900.0, 500.0), run(1800.0, 250.0), run(950.0, 500.0)];
        fn refs(v: &[serde_json::Value]) -> Vec<&serde_json::Value> {
            v.iter().collect()
        }
        let mut medians = pingpong_medians(&refs(&prot));
        add_paired_bandwidths(&mut medians, &refs(&prot), &refs(&base));
        let p = &medians[1];
        assert_eq!(p["bytes"], 1048576);
        assert!((p["bandwidth_paired_ratio"].as_f64().expect("ratio") - 0.9).abs() < 1e-12);
        assert!(
            (p["forwarded_bandwidth_paired_ratio"]
                .as_f64()
                .expect("ratio")
                - 0.5)
                .abs()
                < 1e-12
        );
        assert_eq!(medians[0]["bandwidth_paired_ratio"], 1.0);
        // Three runs give no interval; six give [min, max] of the ratios.
        assert!(p.get("bandwidth_paired_ratio_ci95").is_none());
        let base: Vec<_> = (0..6).map(|_| run(1000.0, 1000.0)).collect();
        let prot: Vec<_> = (0..6)
            .map(|i| run(950.0 - 10.0 * i as f64, 500.0))
            .collect();
        let mut medians = pingpong_medians(&refs(&prot));
        add_paired_bandwidths(&mut medians, &refs(&prot), &refs(&base));
        assert_eq!(
            medians[1]["bandwidth_paired_ratio_ci95"],
            serde_json::json!([0.9, 0.95])
        );
    }
}
