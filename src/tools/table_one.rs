//! `lazarus bench APP --protocols chandy-lamport --get-fix all --seeds N`:
//! 000 Table I (which cuts each `get()` fix guarantees) and the marker
//! counts of §IV-D, measured.
//!
//! For every fix and seed the app runs failure-free under `chandy-lamport`
//! with 000 §IV's wave and the cut checker ([`crate::cuts`]); on the
//! simulator the seed fixes the schedule, and `--straggle` holds one-sided
//! replies in flight while markers pass (the adversarial schedules that
//! make crossings happen where the algorithm allows them). A row counts the
//! cuts checked, overlapped and crossed over all seeds, and compares the
//! markers with the paper's formulas: n(n − 1) per generation for the first
//! wave, as many again for the double barrier, and 2g for the partial
//! double barrier (g flush markers, each answered). With a wave timer the
//! runs take no safe-point snapshots, so that the wave is measured alone.

use serde::Serialize;

use crate::apps::{AppKind, AppParams, run_app};
use crate::cuts::WaveCounts;
use crate::protocol::ProtocolKind;
use crate::protocol::chandy_lamport::GetFix;
use crate::{Config, Error, Result};

/// One fix's row.
#[derive(Debug, Clone, Serialize)]
pub struct FixRow {
    /// The fix.
    pub fix: &'static str,
    /// Runs (seeds).
    pub runs: u64,
    /// Cuts checked, over all runs.
    pub cuts_checked: u64,
    /// Cuts some operation overlaps.
    pub cuts_overlapped: u64,
    /// Cuts some communication crosses.
    pub cuts_crossed: u64,
    /// Runs with at least one overlapped cut.
    pub runs_overlapped: u64,
    /// Runs with at least one crossed cut.
    pub runs_crossed: u64,
    /// Markers by kind, over all runs.
    pub markers: WaveCounts,
    /// Generations the wave entered, over all runs.
    pub generations: u64,
    /// Whether every run's first-wave markers were n(n − 1) per generation.
    pub first_wave_formula: bool,
    /// Double barrier: whether every run's second wave was n(n − 1) per
    /// generation (others: that it sent none).
    pub second_wave_formula: bool,
    /// Partial double barrier: whether every run's flush markers were
    /// answered one for one (2g in all; others: that there were none).
    pub flush_formula: bool,
    /// What 000 Table I says of the fix: overlap possible, crossing
    /// possible.
    pub paper_overlap: bool,
    /// Crossing possible per the paper.
    pub paper_cross: bool,
    /// Whether the measurement agrees with Table I: no overlap or crossing
    /// where the paper excludes it, and (over these seeds) both seen where
    /// it allows them.
    pub agrees: bool,
}

/// The whole table.
#[derive(Debug, Clone, Serialize)]
pub struct TableOne {
    /// Ranks.
    pub ranks: usize,
    /// First seed.
    pub from: u64,
    /// Seeds per fix.
    pub seeds: u64,
    /// One row per fix.
    pub rows: Vec<FixRow>,
}

/// What the table reports while it runs.
#[derive(Debug)]
pub enum TableEvent<'a> {
    /// A fix's runs are done.
    Row(&'a FixRow),
}

/// Run `app` under every fix in `fixes` for `seeds` seeds from `from`.
/// `base` gives the backend, ranks and network; the protocol, the fix, the
/// checker and the seed are set here. A run that fails or does not verify
/// is an error (the wave must never change a result).
pub fn table_one(
    app: AppKind,
    params: &AppParams,
    base: &Config,
    fixes: &[GetFix],
    from: u64,
    seeds: u64,
    mut on_event: impl FnMut(TableEvent<'_>),
) -> Result<TableOne> {
    let n = base.get_ranks() as u64;
    let per_generation = n * n.saturating_sub(1);
    let mut rows = Vec::new();
    for &fix in fixes {
        let mut row = FixRow {
            fix: fix.name(),
            runs: 0,
            cuts_checked: 0,
            cuts_overlapped: 0,
            cuts_crossed: 0,
            runs_overlapped: 0,
            runs_crossed: 0,
            markers: WaveCounts::default(),
            generations: 0,
            first_wave_formula: true,
            second_wave_formula: true,
            flush_formula: true,
            paper_overlap: !fix.never_overlapped(),
            paper_cross: !fix.never_crossed(),
            agrees: false,
        };
        for seed in from..from.saturating_add(seeds) {
            // With its own timer the wave is measured alone, as 000 studies
            // it: the snapshots recorded at safe points hold one-sided
            // requests that arrive after their origin recorded until the
            // target records too, and a request held so is served after the
            // target's wave cut (ARCHITECTURE.md, "000 §IV's wave").
            let every = match base.get_wave_interval() {
                Some(_) => 0,
                None => base.get_checkpoint_every(),
            };
            let cfg = base
                .clone()
                .checkpoint_every(every)
                .protocol(ProtocolKind::ChandyLamport)
                .get_fix(fix)
                .check_cuts(true)
                .seed(seed);
            let run = run_app(app, params, &cfg);
            let v = run
                .outcome
                .map_err(|e| Error::app(format!("get() fix {}, seed {seed}: {e}", fix.name())))?;
            if !v.verified {
                return Err(Error::app(format!(
                    "get() fix {}, seed {seed}: not verified: {}",
                    fix.name(),
                    v.detail
                )));
            }
            let cuts = run.stats.cuts.ok_or_else(|| {
                Error::app(format!(
                    "get() fix {}, seed {seed}: no cut report (a rank did not report its stamps)",
                    fix.name()
                ))
            })?;
            let w = run.stats.wave;
            row.runs += 1;
            row.cuts_checked += cuts.checked;
            row.cuts_overlapped += cuts.overlapped;
            row.cuts_crossed += cuts.crossed;
            row.runs_overlapped += u64::from(cuts.overlapped > 0);
            row.runs_crossed += u64::from(cuts.crossed > 0);
            row.generations += w.generations;
            row.first_wave_formula &= w.first == per_generation * w.generations;
            row.second_wave_formula &= w.second
                == if fix == GetFix::DoubleBarrier {
                    per_generation * w.generations
                } else {
                    0
                };
            row.flush_formula &= if fix == GetFix::PartialDoubleBarrier {
                w.flush == w.flush_answers
            } else {
                w.flush == 0 && w.flush_answers == 0
            };
            row.markers.add(&w);
        }
        row.markers.generations = row.generations;
        row.agrees = (row.cuts_overlapped > 0) == row.paper_overlap
            && (row.cuts_crossed > 0) == row.paper_cross;
        on_event(TableEvent::Row(&row));
        rows.push(row);
    }
    Ok(TableOne {
        ranks: base.get_ranks(),
        from,
        seeds,
        rows,
    })
}
