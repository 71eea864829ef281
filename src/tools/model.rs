//! Analytic resilience model of Besta & Hoefler (003): Daly's checkpoint
//! interval (§6.1) and the probability of a catastrophic failure `P_cf` of
//! in-memory checksum groups placed over a failure-domain hierarchy (§5,
//! equations 7–9), with the TSUBAME2.0 failure fits of §7.1 and the
//! comparison of topology-aware placements of Fig. 10c (§7.1.1).
//!
//! # The model (003 §5)
//!
//! A failure-domain hierarchy (FDH) has `h` levels; level `j` (1 = smallest
//! domain, e.g. nodes) has `H_j` elements. The `N` computing processes are
//! split into `g` groups and every group gets `m = 1` checksum process (XOR,
//! like the parity disk of RAID 5), so a group survives one crash and two
//! crashes in one group are a *catastrophic failure* (CF). A placement is
//! *t-aware at level n* (eq. 6) when no two members of a group share an
//! element of any level `k ≤ n`.
//!
//! With `P_j(x_j)` the (per-day) probability of `x_j` concurrent failures at
//! level `j` and `P_j(x_{j,cf} | x_j)` the probability that such a failure is
//! catastrophic, eq. 7 gives
//!
//! ```text
//! P_cf = Σ_j Σ_{x_j=1..H_j} P_j(x_j) · P_j(x_{j,cf} | x_j)
//! ```
//!
//! For t-aware levels `j ≤ n` eq. 8 counts the catastrophic pairs:
//!
//! ```text
//! P_j(x_{j,cf} | x_j) = D_j · C(|G|, 2) · C(H_j − 2, x_j − 2) / C(H_j, x_j),
//! D_j = ⌈H_j / |G|⌉
//! ```
//!
//! and for the levels `j > n` the worst case is that any crash is
//! catastrophic (`P_j(x_{j,cf} | x_j) = 1`), which yields eq. 9.
//!
//! # Choices where the paper is silent or loose
//!
//! - Eq. 8 is a union bound (it counts failure scenarios that contain a
//!   catastrophic pair, Fig. 8 scenario C), so it can exceed 1 for large
//!   `x_j`; it is capped at 1 here so that it stays a probability.
//! - `C(H−2, x−2) / C(H, x)` is evaluated in the exact closed form
//!   `x (x − 1) / (H (H − 1))` (0 for `x = 1`), which avoids huge binomials.
//! - The upper limit `N_j` of the second sum of eq. 9 is read as `H_j`
//!   (the same sum as in eq. 7).
//! - `N` in "|CH| = 5 % N" is read as the number of computing processes
//!   `|P|` of §5, so `g = |CH|` groups (m = 1) and `|G| = ⌈N / g⌉ + 1`
//!   (the ceiling takes the largest group when `g` does not divide `N`).
//! - The paper does not list the element counts `H_j` of TSUBAME2.0; see
//!   [`tsubame2`] for the counts used.

use std::fmt::Write as _;
use std::path::Path;

use crate::{Error, Result};

/// Checksum processes per group, `m` of 003 §5. The paper's P_cf derivation
/// (§5.2) fixes `m = 1` (XOR code), and so does this model.
pub const CHECKSUMS_PER_GROUP: usize = 1;

/// Number of processes of the Fig. 10c study (003 §7.1.1: "The number of
/// processes N is 4,000").
pub const FIG10C_PROCESSES: usize = 4000;

/// A reasonable x axis for Fig. 10c: checksum fractions `|CH| / N` from 1 %
/// to 50 %.
pub const FIG10C_FRACTIONS: &[f64] = &[
    0.01, 0.02, 0.025, 0.03, 0.04, 0.05, 0.0625, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.4, 0.5,
];

/// Daly's higher-order optimum compute interval between coordinated
/// checkpoints (003 §6.1, Daly 2006), in the unit of the inputs:
///
/// ```text
/// τ = sqrt(2δM) · [1 + (1/3)·sqrt(δ/(2M)) + (1/9)·(δ/(2M))] − δ   for δ < 2M
/// τ = M                                                          for δ ≥ 2M
/// ```
///
/// with `δ = checkpoint_cost_s` (time to take a checkpoint) and
/// `M = mtbf_s` (mean time between failures). Both must be positive and
/// finite; otherwise a [`Error::Config`] naming the parameter is returned.
pub fn daly_interval(checkpoint_cost_s: f64, mtbf_s: f64) -> Result<f64> {
    check_positive("checkpoint-cost", checkpoint_cost_s)?;
    check_positive("mtbf", mtbf_s)?;
    let delta = checkpoint_cost_s;
    let m = mtbf_s;
    if delta >= 2.0 * m {
        return Ok(m);
    }
    let ratio = delta / (2.0 * m);
    Ok((2.0 * delta * m).sqrt() * (1.0 + ratio.sqrt() / 3.0 + ratio / 9.0) - delta)
}

fn check_positive(option: &str, v: f64) -> Result<()> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(Error::config(
            option,
            format!("must be a positive finite number of seconds, got {v}"),
        ))
    }
}

/// The distribution `P_j(x_j)` of concurrent failures at one hierarchy level
/// (003 §5.2, eq. 7): the probability per day that exactly `x_j` elements of
/// the level fail together.
#[derive(Debug, Clone, PartialEq)]
pub enum FailureDist {
    /// The exponential fits of 003 §7.1: `P(x) = a · e^(−b·x)` per day.
    Exponential {
        /// Scale `a` (failures per day).
        a: f64,
        /// Decay `b` per additional concurrent failure.
        b: f64,
    },
    /// Measured per-day probabilities: element `i` is `P(x = i + 1)`; larger
    /// `x` have probability 0.
    Table(Vec<f64>),
}

impl FailureDist {
    /// `P(x)` per day for `x ≥ 1` concurrent failures (0 for `x = 0`).
    pub fn rate(&self, x: usize) -> f64 {
        if x == 0 {
            return 0.0;
        }
        match self {
            FailureDist::Exponential { a, b } => a * (-b * x as f64).exp(),
            FailureDist::Table(t) => t.get(x - 1).copied().unwrap_or(0.0),
        }
    }

    /// `Σ_{x=1..max_x} P(x)`: the per-day probability that the level fails
    /// at all (closed-form geometric sum for the exponential fits).
    pub fn total(&self, max_x: usize) -> f64 {
        match self {
            FailureDist::Exponential { a, b } => {
                let r = (-b).exp();
                // Σ_{x=1..H} a r^x = a r (1 − r^H) / (1 − r)
                a * r * (1.0 - r.powi(i32::try_from(max_x).unwrap_or(i32::MAX))) / (1.0 - r)
            }
            FailureDist::Table(t) => t.iter().take(max_x).sum(),
        }
    }

    fn validate(&self, level: &str) -> Result<()> {
        let bad = |detail: String| Err(Error::config(format!("level `{level}`"), detail));
        match self {
            FailureDist::Exponential { a, b } => {
                if !(a.is_finite() && *a >= 0.0) {
                    return bad(format!(
                        "exponential scale a must be finite and ≥ 0, got {a}"
                    ));
                }
                if !(b.is_finite() && *b > 0.0) {
                    return bad(format!(
                        "exponential decay b must be finite and > 0, got {b}"
                    ));
                }
            }
            FailureDist::Table(t) => {
                if let Some(v) = t.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
                    return bad(format!(
                        "failure table entries must be finite and ≥ 0, got {v}"
                    ));
                }
            }
        }
        Ok(())
    }
}

/// One level `j` of a failure-domain hierarchy (003 §5): its name, the
/// number `H_j` of its elements in the machine, and the distribution
/// `P_j(x_j)` of concurrent failures of those elements.
#[derive(Debug, Clone, PartialEq)]
pub struct Level {
    /// Name of the failure domain (e.g. "nodes", "PSUs").
    pub name: String,
    /// `H_j`: elements of this level in the machine.
    pub count: usize,
    /// `P_j(x_j)`: per-day probability of `x_j` concurrent element failures.
    pub failures: FailureDist,
}

/// A failure-domain hierarchy (FDH, 003 §5): levels ordered from the
/// smallest domain (level 1, e.g. nodes) to the largest (level `h`).
#[derive(Debug, Clone, PartialEq)]
pub struct Hierarchy {
    /// The levels, smallest failure domain first.
    pub levels: Vec<Level>,
}

impl Hierarchy {
    /// A validated hierarchy: at least one level, every level with at least
    /// one element and a valid failure distribution.
    pub fn new(levels: Vec<Level>) -> Result<Self> {
        let h = Hierarchy { levels };
        h.validate()?;
        Ok(h)
    }

    /// Number of levels, `h`.
    pub fn height(&self) -> usize {
        self.levels.len()
    }

    fn validate(&self) -> Result<()> {
        if self.levels.is_empty() {
            return Err(Error::config("hierarchy", "needs at least one level"));
        }
        for l in &self.levels {
            if l.count == 0 {
                return Err(Error::config(
                    format!("level `{}`", l.name),
                    "must have at least one element",
                ));
            }
            l.failures.validate(&l.name)?;
        }
        Ok(())
    }

    fn check_args(&self, group_size: usize, t_aware: usize) -> Result<()> {
        self.validate()?;
        if group_size < 1 + CHECKSUMS_PER_GROUP {
            return Err(Error::config(
                "group-size",
                format!(
                    "a checksum group holds at least one computing and {CHECKSUMS_PER_GROUP} checksum process, got |G| = {group_size}"
                ),
            ));
        }
        if t_aware > self.height() {
            return Err(Error::config(
                "t-awareness",
                format!(
                    "level {t_aware} does not exist in a hierarchy of {} levels",
                    self.height()
                ),
            ));
        }
        Ok(())
    }

    /// Whether a placement t-aware at level `t_aware` (eq. 6) exists for
    /// groups of `group_size`: every level `k ≤ t_aware` needs at least
    /// `|G|` distinct elements. `t_aware = 0` (no t-awareness) is always
    /// feasible.
    pub fn is_feasible(&self, group_size: usize, t_aware: usize) -> bool {
        self.levels
            .iter()
            .take(t_aware)
            .all(|l| l.count >= group_size)
    }

    /// The per-level terms of eq. 9 (one per level, smallest domain first):
    /// `Σ_{x_j} P_j(x_j) · P_j(x_{j,cf} | x_j)` with eq. 8 (capped at 1) for
    /// levels `j ≤ t_aware` and `1` for the others. Their sum is `P_cf`.
    ///
    /// `group_size` is `|G|` (computing plus checksum processes of a group);
    /// `t_aware` is the t-awareness level `n` (0 = none, 1 = the first
    /// level, …). The formula is evaluated even when the placement is not
    /// feasible (see [`Hierarchy::is_feasible`]).
    pub fn level_terms(&self, group_size: usize, t_aware: usize) -> Result<Vec<f64>> {
        self.check_args(group_size, t_aware)?;
        let g = group_size as f64;
        Ok(self
            .levels
            .iter()
            .enumerate()
            .map(|(idx, l)| {
                if idx >= t_aware {
                    // Levels n+1..h: any crash is catastrophic (second sum of eq. 9).
                    return l.failures.total(l.count);
                }
                let h = l.count as f64;
                if l.count < 2 {
                    // Fewer than two elements: no two crashes at this level.
                    return 0.0;
                }
                // Eq. 8: D_j · C(|G|,2) · C(H_j−2, x_j−2) / C(H_j, x_j), with
                // C(H−2, x−2) / C(H, x) = x(x−1) / (H(H−1)).
                let d = l.count.div_ceil(group_size) as f64;
                let pairs = g * (g - 1.0) / 2.0;
                let k = d * pairs / (h * (h - 1.0));
                (2..=l.count)
                    .map(|x| {
                        let xf = x as f64;
                        let cf = (k * xf * (xf - 1.0)).min(1.0);
                        l.failures.rate(x) * cf
                    })
                    .sum()
            })
            .collect())
    }

    /// `P_cf` per day (eq. 7 with eq. 8 and 9) for checksum groups of
    /// `group_size` processes placed t-aware up to level `t_aware`
    /// (0 = no t-awareness, then every crash of any domain is catastrophic).
    pub fn p_cf(&self, group_size: usize, t_aware: usize) -> Result<f64> {
        Ok(self.level_terms(group_size, t_aware)?.iter().sum())
    }
}

/// The group size `|G| = ⌈N / g⌉ + m` (003 §5) when `N` computing processes
/// get `checksum_ranks` checksum processes, i.e. `g = checksum_ranks / m`
/// groups with `m = 1`. With `g ∤ N` the largest group is returned.
pub fn group_size(processes: usize, checksum_ranks: usize) -> Result<usize> {
    if processes == 0 {
        return Err(Error::config("processes", "needs at least one process"));
    }
    if checksum_ranks == 0 || checksum_ranks > processes {
        return Err(Error::config(
            "checksum-ranks",
            format!("must be between 1 and N = {processes}, got {checksum_ranks}"),
        ));
    }
    let groups = checksum_ranks / CHECKSUMS_PER_GROUP;
    Ok(processes.div_ceil(groups) + CHECKSUMS_PER_GROUP)
}

/// TSUBAME2.0 as modelled in 003 §7.1: four levels (nodes, power supply
/// units, edge switches, racks; `h = 4`) with the paper's exponential fits
/// of 1962 crashes, in failures per day:
///
/// | level    | `P_j(x)`                      |
/// |----------|-------------------------------|
/// | nodes    | `0.30142e-2 · e^(−1.3567 x)`  |
/// | PSUs     | `1.1836e-4 · e^(−1.4831 x)`   |
/// | switches | `3.9249e-5 · e^(−1.5902 x)`   |
/// | racks    | `3.2257e-5 · e^(−1.5488 x)`   |
///
/// The paper does not print the element counts `H_j`. Used here: 1408 thin
/// compute nodes in 44 racks of 32 (public TSUBAME2.0 figures); 4 nodes per
/// power supply unit (352 PSUs) and 16 nodes per edge switch (88 switches)
/// are assumptions (the failure domains of TSUBAME2.0 as described by Sato
/// et al., SC'12, reference 76 of the paper, not checked against that
/// text). Change [`Level::count`] if the exact figures differ.
pub fn tsubame2() -> Hierarchy {
    let level = |name: &str, count: usize, a: f64, b: f64| Level {
        name: name.to_string(),
        count,
        failures: FailureDist::Exponential { a, b },
    };
    Hierarchy {
        levels: vec![
            level("nodes", 1408, 0.30142e-2, 1.3567),
            level("PSUs", 352, 1.1836e-4, 1.4831),
            level("switches", 88, 3.9249e-5, 1.5902),
            level("racks", 44, 3.2257e-5, 1.5488),
        ],
    }
}

/// The five placements compared in 003 Fig. 10c.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Placement {
    /// No t-awareness: one crash of any domain is catastrophic.
    NoTopo,
    /// Group members on distinct nodes (t-aware at level 1).
    Nodes,
    /// Group members on distinct PSUs (t-aware at level 2).
    Psus,
    /// Group members on distinct edge switches (t-aware at level 3).
    Switches,
    /// Group members on distinct racks (t-aware at level 4).
    Racks,
}

impl Placement {
    /// All five, in the order of Fig. 10c and of [`Fig10Row::p_cf`].
    pub const ALL: [Placement; 5] = [
        Placement::NoTopo,
        Placement::Nodes,
        Placement::Psus,
        Placement::Switches,
        Placement::Racks,
    ];

    /// The name used in Fig. 10c.
    pub fn name(self) -> &'static str {
        match self {
            Placement::NoTopo => "no-topo",
            Placement::Nodes => "nodes",
            Placement::Psus => "PSUs",
            Placement::Switches => "switches",
            Placement::Racks => "racks",
        }
    }

    /// The t-awareness level `n` in the TSUBAME2.0 hierarchy (0 = none).
    pub fn t_aware_level(self) -> usize {
        self as usize
    }
}

/// One x value of Fig. 10c: `P_cf` per day of the five placements.
#[derive(Debug, Clone, PartialEq)]
pub struct Fig10Row {
    /// `|CH| / N` as requested.
    pub fraction: f64,
    /// `|CH|`: checksum processes (= groups, since m = 1).
    pub checksum_ranks: usize,
    /// `|G|`: processes per group, checksum process included.
    pub group_size: usize,
    /// `P_cf` per day, indexed like [`Placement::ALL`].
    pub p_cf: [f64; 5],
    /// Whether the placement exists (`|G|` distinct elements available at
    /// every t-aware level), indexed like [`Placement::ALL`].
    pub feasible: [bool; 5],
}

impl Fig10Row {
    /// `P_cf` per day of one placement.
    pub fn get(&self, placement: Placement) -> f64 {
        self.p_cf[placement as usize]
    }
}

/// Fig. 10c of 003: `P_cf` per day on TSUBAME2.0 ([`tsubame2`]) against
/// `|CH| / N` for the five placements, with `n` computing processes (the
/// paper uses 4000). `|CH| = round(fraction · n)` (at least 1); every
/// fraction must lie in `(0, 1]`.
pub fn fig10c_table(n: usize, checksum_fractions: &[f64]) -> Result<Vec<Fig10Row>> {
    if n == 0 {
        return Err(Error::config("processes", "needs at least one process"));
    }
    if checksum_fractions.is_empty() {
        return Err(Error::config(
            "checksum-fractions",
            "needs at least one fraction",
        ));
    }
    let machine = tsubame2();
    checksum_fractions
        .iter()
        .map(|&fraction| {
            if !(fraction.is_finite() && fraction > 0.0 && fraction <= 1.0) {
                return Err(Error::config(
                    "checksum-fractions",
                    format!("|CH|/N must lie in (0, 1], got {fraction}"),
                ));
            }
            let checksum_ranks = ((fraction * n as f64).round() as usize).clamp(1, n);
            let g = group_size(n, checksum_ranks)?;
            let mut p_cf = [0.0; 5];
            let mut feasible = [false; 5];
            for (i, p) in Placement::ALL.into_iter().enumerate() {
                p_cf[i] = machine.p_cf(g, p.t_aware_level())?;
                feasible[i] = machine.is_feasible(g, p.t_aware_level());
            }
            Ok(Fig10Row {
                fraction,
                checksum_ranks,
                group_size: g,
                p_cf,
                feasible,
            })
        })
        .collect()
}

/// A plain-text table of Fig. 10c rows: one line per `|CH| / N`, one column
/// per placement. Values of infeasible placements are marked with `*`.
pub fn render_table(rows: &[Fig10Row]) -> String {
    let mut out = String::new();
    let _ = write!(out, "{:>8} {:>6} {:>5}", "|CH|/N", "|CH|", "|G|");
    for p in Placement::ALL {
        let _ = write!(out, " {:>11}", p.name());
    }
    out.push('\n');
    let mut any_infeasible = false;
    for r in rows {
        let _ = write!(
            out,
            "{:>7.2}% {:>6} {:>5}",
            r.fraction * 100.0,
            r.checksum_ranks,
            r.group_size
        );
        for (v, ok) in r.p_cf.iter().zip(r.feasible) {
            let mark = if ok { ' ' } else { '*' };
            any_infeasible |= !ok;
            let _ = write!(out, " {v:>10.3e}{mark}");
        }
        out.push('\n');
    }
    out.push_str("P_cf per day (003 eq. 7-9, TSUBAME2.0 fits of §7.1)\n");
    if any_infeasible {
        out.push_str("* placement infeasible: fewer elements than |G| at a t-aware level\n");
    }
    out
}

/// Draws Fig. 10c as an SVG file: `P_cf` per day (log scale) against
/// `|CH| / N` (percent) for the five placements. Infeasible points are left
/// out.
pub fn plot_svg(rows: &[Fig10Row], path: &Path) -> Result<()> {
    use plotters::prelude::*;

    if rows.is_empty() {
        return Err(Error::config("plot", "no rows to plot"));
    }
    let fail = super::plot::draw_error(path);
    let xs = rows.iter().map(|r| r.fraction * 100.0);
    let x_min = xs.clone().fold(f64::INFINITY, f64::min);
    let x_max = xs.fold(f64::NEG_INFINITY, f64::max);
    let (x_lo, x_hi) = if x_max > x_min {
        (x_min, x_max)
    } else {
        (x_min * 0.5, x_min * 1.5)
    };
    let ys = rows.iter().flat_map(|r| {
        r.p_cf
            .iter()
            .zip(r.feasible)
            .filter(|(v, ok)| *ok && **v > 0.0 && v.is_finite())
            .map(|(v, _)| *v)
    });
    let y_min = ys.clone().fold(f64::INFINITY, f64::min);
    let y_max = ys.fold(f64::NEG_INFINITY, f64::max);
    if !(y_min.is_finite() && y_max.is_finite()) {
        return Err(Error::config("plot", "no positive P_cf value to plot"));
    }
    let (y_lo, y_hi) = (y_min / 2.0, y_max * 2.0);

    let root = SVGBackend::new(path, (800, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "P_cf per day, TSUBAME2.0 (003 Fig. 10c)",
            ("sans-serif", 22),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(80)
        .build_cartesian_2d(x_lo..x_hi, (y_lo..y_hi).log_scale())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("|CH| / N [%]")
        .y_desc("P_cf per day")
        .y_label_formatter(&|v| super::plot::log_tick(*v))
        .draw()
        .map_err(|e| fail(&e))?;

    for (i, p) in Placement::ALL.into_iter().enumerate() {
        let pts: Vec<(f64, f64)> = rows
            .iter()
            .filter(|r| r.feasible[i] && r.p_cf[i] > 0.0)
            .map(|r| (r.fraction * 100.0, r.p_cf[i]))
            .collect();
        if pts.is_empty() {
            continue;
        }
        super::plot::line_with_points(&mut chart, pts, i, p.name().to_string(), &fail)?;
    }
    super::plot::finish(&mut chart, SeriesLabelPosition::LowerLeft, &fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binom(n: u64, k: u64) -> f64 {
        if k > n {
            return 0.0;
        }
        (0..k).fold(1.0, |acc, i| acc * (n - i) as f64 / (i + 1) as f64)
    }

    #[test]
    fn pair_ratio_matches_the_binomials_of_eq_8() {
        // C(H−2, x−2) / C(H, x) = x(x−1) / (H(H−1)).
        for (h, x) in [(10u64, 2u64), (10, 5), (44, 3), (88, 10), (352, 7)] {
            let lhs = binom(h - 2, x - 2) / binom(h, x);
            let rhs = (x * (x - 1)) as f64 / (h * (h - 1)) as f64;
            assert!((lhs - rhs).abs() <= 1e-12 * rhs, "H={h} x={x}");
        }
    }

    #[test]
    fn exponential_total_equals_the_explicit_sum() {
        let d = FailureDist::Exponential { a: 0.3, b: 1.2 };
        let direct: f64 = (1..=50).map(|x| d.rate(x)).sum();
        assert!((d.total(50) - direct).abs() < 1e-15);
        assert_eq!(d.rate(0), 0.0);
        let t = FailureDist::Table(vec![0.5, 0.25]);
        assert_eq!(t.rate(3), 0.0);
        assert_eq!(t.total(1), 0.5);
        assert_eq!(t.total(10), 0.75);
    }

    #[test]
    fn eq_8_term_by_hand_for_a_tiny_level() {
        // One level, H = 4, |G| = 2, t-aware: D = 2, C(2,2) = 1,
        // P(cf|x) = 2 · x(x−1)/12 → x=2: 1/3, x=3: 1 (capped), x=4: 1 (capped).
        let h = Hierarchy::new(vec![Level {
            name: "n".into(),
            count: 4,
            failures: FailureDist::Table(vec![0.4, 0.3, 0.2, 0.1]),
        }])
        .expect("valid");
        let v = h.p_cf(2, 1).expect("p_cf");
        assert!((v - (0.3 / 3.0 + 0.2 + 0.1)).abs() < 1e-12, "{v}");
        // Not t-aware: every failure is catastrophic.
        assert!((h.p_cf(2, 0).expect("p_cf") - 1.0).abs() < 1e-12);
        assert!(h.is_feasible(2, 1));
        assert!(!h.is_feasible(5, 1));
    }

    #[test]
    fn bad_arguments_are_config_errors() {
        let h = tsubame2();
        assert!(matches!(h.p_cf(1, 1), Err(Error::Config { .. })));
        assert!(matches!(h.p_cf(10, 5), Err(Error::Config { .. })));
        assert!(Hierarchy::new(vec![]).is_err());
        let bad = Hierarchy::new(vec![Level {
            name: "x".into(),
            count: 3,
            failures: FailureDist::Exponential { a: 1.0, b: -1.0 },
        }]);
        assert!(matches!(bad, Err(Error::Config { .. })));
        assert!(group_size(10, 0).is_err());
        assert!(group_size(10, 11).is_err());
        assert_eq!(group_size(4000, 200).expect("size"), 21);
        assert_eq!(group_size(10, 3).expect("size"), 5);
        assert!(fig10c_table(4000, &[0.0]).is_err());
        assert!(fig10c_table(4000, &[f64::NAN]).is_err());
        assert!(fig10c_table(0, &[0.05]).is_err());
    }

    #[test]
    fn no_topo_is_flat_and_t_aware_decreases_with_ch() {
        let rows = fig10c_table(FIG10C_PROCESSES, &[0.05, 0.1, 0.2]).expect("table");
        assert_eq!(
            rows[0].get(Placement::NoTopo),
            rows[2].get(Placement::NoTopo)
        );
        for p in &Placement::ALL[1..] {
            assert!(rows[0].get(*p) > rows[1].get(*p) && rows[1].get(*p) > rows[2].get(*p));
        }
        let text = render_table(&rows);
        assert!(
            text.contains("switches") && text.lines().count() >= 5,
            "{text}"
        );
    }
}
