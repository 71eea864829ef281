//! The analytic resilience model of 003 (`lazarus::tools::model`): Daly's
//! checkpoint interval (§6.1) checked against hand-computed values, the
//! probability of a catastrophic failure (§5.2, eq. 7–9) on the TSUBAME2.0
//! fits of §7.1, the claims of §7.1.1 about Fig. 10c, and the SVG plot.

use lazarus::Error;
use lazarus::tools::model::{
    FIG10C_FRACTIONS, FIG10C_PROCESSES, Placement, daly_interval, fig10c_table, group_size,
    plot_svg, render_table, tsubame2,
};

fn close(got: f64, want: f64, rel: f64) -> bool {
    (got - want).abs() <= rel * want.abs()
}

// For δ < 2M Daly's formula expands to
//   τ = sqrt(2δM) + δ/3 + (δ/9)·sqrt(δ/(2M)) − δ = sqrt(2δM) − 2δ/3 + (δ/9)·sqrt(δ/(2M)),
// because sqrt(2δM)·(1/3)·sqrt(δ/(2M)) = δ/3 and sqrt(2δM)·(1/9)·δ/(2M) = (δ/9)·sqrt(δ/(2M)).
#[test]
fn daly_matches_hand_computed_values() {
    // δ = 2, M = 100: sqrt(400) = 20, sqrt(δ/(2M)) = sqrt(0.01) = 0.1,
    // τ = 20 − 4/3 + (2/9)·0.1 = (900 − 60 + 1)/45 = 841/45 = 18.68888…
    let t = daly_interval(2.0, 100.0).expect("valid");
    assert!(close(t, 841.0 / 45.0, 1e-12), "{t}");

    // δ = 50, M = 100: sqrt(10000) = 100, sqrt(0.25) = 0.5,
    // τ = 100 − 100/3 + (50/9)·0.5 = (900 − 300 + 25)/9 = 625/9 = 69.444…
    let t = daly_interval(50.0, 100.0).expect("valid");
    assert!(close(t, 625.0 / 9.0, 1e-12), "{t}");

    // δ = 60 s, M = 86400 s (one day): 2δM = 10,368,000, sqrt = 3219.9379
    // (3220² = 10,368,400, so sqrt ≈ 3220 − 400/6440); δ/(2M) = 3.4722e-4,
    // sqrt = 0.0186339; τ = 3219.9379 − 40 + (60/9)·0.0186339
    // = 3219.9379 − 40 + 0.1242 = 3180.0621 s.
    let t = daly_interval(60.0, 86_400.0).expect("valid");
    assert!((t - 3180.0621).abs() < 1e-3, "{t}");

    // δ ≥ 2M: τ = M. δ = 300, M = 120 (300 ≥ 240) → 120; and the boundary
    // δ = 2M exactly (200, 100) → 100.
    assert_eq!(daly_interval(300.0, 120.0).expect("valid"), 120.0);
    assert_eq!(daly_interval(200.0, 100.0).expect("valid"), 100.0);

    // The interval grows with the MTBF.
    assert!(daly_interval(60.0, 3600.0).expect("valid") < t);
}

#[test]
fn daly_rejects_invalid_inputs() {
    for (delta, m) in [
        (0.0, 100.0),
        (-1.0, 100.0),
        (f64::NAN, 100.0),
        (f64::INFINITY, 100.0),
        (10.0, 0.0),
        (10.0, -5.0),
        (10.0, f64::NAN),
        (10.0, f64::INFINITY),
    ] {
        let err = daly_interval(delta, m).expect_err("must be rejected");
        assert!(matches!(err, Error::Config { .. }), "{err}");
        let option = if delta.is_finite() && delta > 0.0 {
            "mtbf"
        } else {
            "checkpoint-cost"
        };
        assert!(err.to_string().contains(option), "{err}");
    }
}

#[test]
fn tsubame2_preset_has_the_fits_of_section_7_1() {
    let h = tsubame2();
    let names: Vec<&str> = h.levels.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["nodes", "PSUs", "switches", "racks"]);
    // Nodes: 0.30142e-2 · e^(−1.3567 x) per day.
    assert!(close(
        h.levels[0].failures.rate(1),
        0.30142e-2 * (-1.3567f64).exp(),
        1e-12
    ));
    // The node fit reproduces the paper's assumption that single crashes are
    // ~75 % and double crashes ~20 % of node failures.
    let total = h.levels[0].failures.total(h.levels[0].count);
    let single = h.levels[0].failures.rate(1) / total;
    let double = h.levels[0].failures.rate(2) / total;
    assert!((0.72..0.78).contains(&single), "{single}");
    assert!((0.17..0.23).contains(&double), "{double}");
}

// No-topo: every crash is catastrophic, so P_cf = Σ_j a_j r_j/(1 − r_j) with
// r_j = e^(−b_j) (the r^H tails are negligible):
//   nodes    0.0030142 · 0.25752/0.74248 = 1.0454e-3
//   PSUs     1.1836e-4 · 0.22693/0.77307 = 3.4744e-5
//   switches 3.9249e-5 · 0.20389/0.79611 = 1.0052e-5
//   racks    3.2257e-5 · 0.21251/0.78749 = 8.7047e-6
//   sum                                  = 1.0989e-3 per day.
#[test]
fn no_topo_is_the_sum_of_all_failure_rates_and_flat_in_ch() {
    let rows = fig10c_table(FIG10C_PROCESSES, FIG10C_FRACTIONS).expect("table");
    for r in &rows {
        let v = r.get(Placement::NoTopo);
        assert!(close(v, 1.0989e-3, 1e-3), "{v}");
    }
}

// Eq. 8 evaluated independently with log-binomials for the node level at
// |CH| = 5 % of N = 4000: g = 200 groups, |G| = 4000/200 + 1 = 21,
// D = ⌈1408/21⌉ = 68, C(21, 2) = 210.
#[test]
fn node_level_term_matches_eq_8_with_explicit_binomials() {
    fn ln_binom(n: usize, k: usize) -> f64 {
        (0..k)
            .map(|i| ((n - i) as f64).ln() - ((i + 1) as f64).ln())
            .sum()
    }
    let h = tsubame2();
    let g = group_size(FIG10C_PROCESSES, 200).expect("size");
    assert_eq!(g, 21);
    let (hn, d, pairs) = (1408usize, 68.0, 210.0);
    let want: f64 = (2..=200)
        .map(|x| {
            let ratio = (ln_binom(hn - 2, x - 2) - ln_binom(hn, x)).exp();
            let cf = (d * pairs * ratio).min(1.0);
            0.30142e-2 * (-1.3567 * x as f64).exp() * cf
        })
        .sum();
    let got = h.level_terms(g, 1).expect("terms")[0];
    assert!(close(got, want, 1e-9), "{got} vs {want}");
    // Levels above the t-awareness level keep their full failure rate.
    let terms = h.level_terms(g, 1).expect("terms");
    assert!(close(terms[3], 8.7047e-6, 1e-3), "{}", terms[3]);
}

// 003 §7.1.1: "if CH = 5%N, P_cf in the switches scenario is ≈ 4 times lower
// than in nodes. Furthermore, all t-aware schemes are 1-3 orders of
// magnitude more resilient than no-topo."
//
// What the model gives at N = 4000, |CH| = 200 (|G| = 21), per day:
//   no-topo 1.099e-3, nodes 6.054e-5, PSUs 2.656e-5, switches 1.731e-5,
//   racks 9.970e-6;
//   no-topo / t-aware = 18.2 (nodes), 41.4 (PSUs), 63.5 (switches),
//   110.2 (racks); nodes / switches = 3.50.
#[test]
fn section_7_1_1_claims_hold_at_five_percent() {
    let rows = fig10c_table(FIG10C_PROCESSES, &[0.05]).expect("table");
    let r = &rows[0];
    assert_eq!((r.checksum_ranks, r.group_size), (200, 21));
    assert!(r.feasible.iter().all(|ok| *ok));
    let no_topo = r.get(Placement::NoTopo);
    for p in &Placement::ALL[1..] {
        let ratio = no_topo / r.get(*p);
        assert!(
            (10.0..=1000.0).contains(&ratio),
            "{}: no-topo/{} = {ratio}",
            p.name(),
            p.name()
        );
    }
    let nodes_over_switches = r.get(Placement::Nodes) / r.get(Placement::Switches);
    assert!(
        (2.5..=6.0).contains(&nodes_over_switches),
        "nodes/switches = {nodes_over_switches}"
    );
    assert!(
        close(nodes_over_switches, 3.50, 0.01),
        "{nodes_over_switches}"
    );
    // Higher t-awareness levels are more resilient.
    let v: Vec<f64> = Placement::ALL.iter().map(|p| r.get(*p)).collect();
    assert!(v.windows(2).all(|w| w[0] > w[1]), "{v:?}");
}

// The "1-3 orders of magnitude" claim over the x axis: it holds for every
// feasible placement from |CH|/N = 1 % to 40 % (the smallest ratio is
// nodes at 1 %, 12.5; the largest racks at 40 %, 746). At 50 % (|G| = 3)
// racks reach 1.1e3, just past three orders of magnitude.
#[test]
fn t_aware_placements_stay_one_to_three_orders_below_no_topo() {
    let rows = fig10c_table(FIG10C_PROCESSES, FIG10C_FRACTIONS).expect("table");
    for r in rows.iter().filter(|r| r.fraction <= 0.4) {
        for (i, p) in Placement::ALL.iter().enumerate().skip(1) {
            if !r.feasible[i] {
                continue;
            }
            let ratio = r.get(Placement::NoTopo) / r.p_cf[i];
            assert!(
                (10.0..=1000.0).contains(&ratio),
                "{} at {}: {ratio}",
                p.name(),
                r.fraction
            );
        }
    }
    // P_cf of every t-aware placement falls as |CH| grows.
    for w in rows.windows(2) {
        for i in 1..5 {
            assert!(w[1].p_cf[i] <= w[0].p_cf[i], "{i} at {}", w[1].fraction);
        }
    }
}

#[test]
fn infeasible_placements_are_flagged() {
    // |CH| = 1 % of 4000 → |G| = 101 > 88 switches and 44 racks.
    let rows = fig10c_table(FIG10C_PROCESSES, &[0.01]).expect("table");
    assert_eq!(rows[0].group_size, 101);
    assert_eq!(rows[0].feasible, [true, true, true, false, false]);
    let text = render_table(&rows);
    assert!(text.contains('*'), "{text}");
}

#[test]
fn fig10c_rejects_bad_parameters() {
    for f in [0.0, -0.1, 1.5, f64::NAN] {
        let err = fig10c_table(FIG10C_PROCESSES, &[f]).expect_err("bad fraction");
        assert!(matches!(err, Error::Config { .. }), "{err}");
    }
    assert!(fig10c_table(0, &[0.05]).is_err());
    assert!(fig10c_table(FIG10C_PROCESSES, &[]).is_err());
}

#[test]
fn render_table_lists_every_placement_and_row() {
    let rows = fig10c_table(FIG10C_PROCESSES, &[0.05, 0.1]).expect("table");
    let text = render_table(&rows);
    for p in Placement::ALL {
        assert!(text.contains(p.name()), "{text}");
    }
    assert!(text.contains("5.00%") && text.contains("10.00%"), "{text}");
    assert!(text.contains("1.731e-5"), "{text}");
}

#[test]
fn plot_svg_writes_an_svg_file() {
    let rows = fig10c_table(FIG10C_PROCESSES, FIG10C_FRACTIONS).expect("table");
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("fig10c-{}.svg", std::process::id()));
    plot_svg(&rows, &path).expect("plot");
    let svg = std::fs::read_to_string(&path).expect("svg written");
    assert!(!svg.is_empty());
    assert!(svg.contains("<svg"), "{}", &svg[..svg.len().min(200)]);
    assert!(svg.contains("switches"));
    let _ = std::fs::remove_file(&path);

    // Nothing to draw is an error, not a panic.
    assert!(plot_svg(&[], &path).is_err());
}
