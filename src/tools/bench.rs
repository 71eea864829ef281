//! `lazarus bench`: protocols side by side in one invocation.
//!
//! Runs alternate between protocols (A B A B ...) so that machine noise hits
//! all of them alike; each protocol's figure is the median wall time of its
//! runs, reported with its ratio to `none` (DESIGN principle 7). Every run must
//! verify, and every protocol must print the same value.

use serde::Serialize;

use super::summary::RunSummary;
use crate::apps::{AppKind, AppParams, run_app};
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
    /// Every run's wall time, in order.
    pub wall_s: Vec<f64>,
    /// Whether every run verified.
    pub verified_all: bool,
    /// The verification value (identical across runs, or the bench fails).
    pub value: String,
    /// Median of the app's metrics per key, for pingpong: latency and
    /// bandwidth per size.
    pub metrics: serde_json::Value,
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

/// Pingpong: median latency and bandwidth per size over the runs.
fn pingpong_medians(runs: &[RunSummary]) -> serde_json::Value {
    let mut sizes: Vec<u64> = Vec::new();
    let mut lat: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    let mut bw: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for r in runs {
        if let Some(points) = r.metrics.as_array() {
            for p in points {
                let (Some(b), Some(l), Some(w)) = (
                    p["bytes"].as_u64(),
                    p["latency_us"].as_f64(),
                    p["bandwidth_mb_s"].as_f64(),
                ) else {
                    continue;
                };
                if !sizes.contains(&b) {
                    sizes.push(b);
                }
                lat.entry(b).or_default().push(l);
                bw.entry(b).or_default().push(w);
            }
        }
    }
    serde_json::Value::Array(
        sizes
            .iter()
            .map(|b| {
                serde_json::json!({
                    "bytes": b,
                    "latency_us": median(&lat[b]),
                    "bandwidth_mb_s": median(&bw[b]),
                })
            })
            .collect(),
    )
}

/// Run `app` under each protocol `reps` times, alternating.
pub fn bench(
    app: AppKind,
    params: &AppParams,
    base: &Config,
    protocols: &[ProtocolKind],
    reps: usize,
    mut on_run: impl FnMut(&RunSummary),
) -> Result<BenchReport> {
    if protocols.is_empty() {
        return Err(Error::config("--protocols", "name at least one protocol"));
    }
    if reps == 0 {
        return Err(Error::config("--reps", "at least one repetition"));
    }
    let mut runs: Vec<Vec<RunSummary>> = vec![Vec::new(); protocols.len()];
    for _ in 0..reps {
        for (i, &p) in protocols.iter().enumerate() {
            let cfg = base.clone().protocol(p);
            let run = run_app(app, params, &cfg);
            let s = RunSummary::new(app, params, &cfg, &run);
            on_run(&s);
            runs[i].push(s);
        }
    }
    let baseline_idx = protocols
        .iter()
        .position(|&p| p == ProtocolKind::None)
        .unwrap_or(0);
    let base_median = median(
        &runs[baseline_idx]
            .iter()
            .map(|r| r.stats.wall_s)
            .collect::<Vec<_>>(),
    );
    let mut figures = Vec::new();
    for (i, &p) in protocols.iter().enumerate() {
        let walls: Vec<f64> = runs[i].iter().map(|r| r.stats.wall_s).collect();
        let m = median(&walls);
        let metrics = match app {
            AppKind::Pingpong => pingpong_medians(&runs[i]),
            _ => serde_json::Value::Null,
        };
        figures.push(ProtocolFigures {
            protocol: p.name().into(),
            median_wall_s: m,
            ratio: m / base_median,
            wall_s: walls,
            verified_all: runs[i].iter().all(|r| r.verified),
            value: runs[i]
                .first()
                .map(|r| r.result.clone())
                .unwrap_or_default(),
            metrics,
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
