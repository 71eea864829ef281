//! The JSON summary of one run (`lazarus run --json FILE`).

use serde::Serialize;

use crate::apps::{AppKind, AppParams, AppRun};
use crate::{Config, JobStats};

/// Everything a run reports. Field names are the stable JSON schema.
#[derive(Debug, Clone, Serialize)]
pub struct RunSummary {
    /// App name.
    pub app: String,
    /// Problem class, if the app has classes.
    pub class: Option<String>,
    /// Number of ranks.
    pub ranks: usize,
    /// Number of failure domains.
    pub nodes: usize,
    /// Backend name.
    pub backend: String,
    /// Protocol name.
    pub protocol: String,
    /// Whether the result verified.
    pub verified: bool,
    /// The printed verification value (or the error, if the run failed).
    pub result: String,
    /// Details of the verification or of the failure.
    pub detail: String,
    /// Safe points (iterations) of the run.
    pub iterations: u64,
    /// Checkpoint every N safe points.
    pub checkpoint_every: u64,
    /// Seed.
    pub seed: u64,
    /// Kill specifications given.
    pub kills: Vec<String>,
    /// Measured statistics (flattened: wall_s, failures, ranks_rolled_back,
    /// recovery_s, checkpoints, checkpoint_bytes, peak_log_bytes, ...).
    #[serde(flatten)]
    pub stats: JobStats,
    /// App-specific measurements.
    pub metrics: serde_json::Value,
    /// The simulator's report (trace hash, events, virtual time), on `sim`.
    pub sim: Option<crate::driver::sim::SimReport>,
}

impl RunSummary {
    /// Summarise `run` of `app` under `cfg`.
    pub fn new(app: AppKind, params: &AppParams, cfg: &Config, run: &AppRun) -> Self {
        let (verified, result, detail, metrics) = match &run.outcome {
            Ok(v) => (
                v.verified,
                v.value.clone(),
                v.detail.clone(),
                v.metrics.clone(),
            ),
            Err(e) => (false, String::new(), e.to_string(), serde_json::Value::Null),
        };
        RunSummary {
            app: app.name().into(),
            class: match app {
                AppKind::Pingpong => None,
                _ => Some(params.class.unwrap_or('S').to_string()),
            },
            ranks: cfg.ranks,
            nodes: cfg.nodes,
            backend: cfg.backend.name().into(),
            protocol: cfg.protocol.name().into(),
            verified,
            result,
            detail,
            iterations: run.iterations,
            checkpoint_every: cfg.checkpoint_every,
            seed: cfg.seed,
            kills: cfg.kills.iter().map(|k| k.to_string()).collect(),
            stats: run.stats.clone(),
            metrics,
            sim: run.sim.clone(),
        }
    }
}
