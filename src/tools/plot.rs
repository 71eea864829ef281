//! `lazarus plot`: an SVG picture of a `lazarus bench` JSON report (DESIGN
//! principle 7: benchmarks write JSON, plots are made from that JSON).
//!
//! - An application bench (cg, stencil, dht): one bar per protocol, its
//!   median failure-free wall time over the baseline's (`none`), and with
//!   `--failure` a second bar, its median wall time with the failure over
//!   the same baseline; each bar is labelled with its ratio. On the
//!   failure-free bar, a dot marks the paired ratio and a whisker its 95%
//!   confidence interval, when the report has them (`bench` module docs).
//! - A ping-pong bench: bandwidth against message size, one line per
//!   protocol (log–log axes), from the medians the report holds.
//!
//! The report is read as plain JSON, so a report written by an older
//! `lazarus` still plots as long as it has these fields.

use std::path::Path;

use serde_json::Value;

use crate::{Error, Result};

/// Series colours, in protocol order.
const COLORS: [(u8, u8, u8); 8] = [
    (0, 0, 0),
    (200, 30, 30),
    (30, 60, 200),
    (0, 140, 60),
    (170, 0, 170),
    (220, 130, 0),
    (0, 150, 170),
    (110, 110, 110),
];

/// The SVG chart of a line plot with a linear or logarithmic x axis `X`
/// and a logarithmic y axis (ping-pong bandwidth here, `P_cf` in
/// [`super::model`], coordination time against ranks in [`super::scale`]).
pub(crate) type LogChart<'a, 'b, X = plotters::coord::types::RangedCoordf64> =
    plotters::chart::ChartContext<
        'a,
        plotters::backend::SVGBackend<'b>,
        plotters::coord::cartesian::Cartesian2d<X, plotters::coord::combinators::LogCoord<f64>>,
    >;

/// Series colour `i` (cycling through [`COLORS`]).
pub(crate) fn color(i: usize) -> plotters::style::RGBColor {
    let (r, g, b) = COLORS[i % COLORS.len()];
    plotters::style::RGBColor(r, g, b)
}

/// Draw `points` as series `i` of `chart`: a line with a dot at each point,
/// named `label` in the legend.
pub(crate) fn line_with_points<X: plotters::coord::ranged1d::Ranged<ValueType = f64>>(
    chart: &mut LogChart<'_, '_, X>,
    points: Vec<(f64, f64)>,
    i: usize,
    label: String,
    fail: &dyn Fn(&dyn std::fmt::Display) -> Error,
) -> Result<()> {
    use plotters::prelude::*;
    let color = color(i);
    chart
        .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
        .map_err(|e| fail(&e))?
        .label(label)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    chart
        .draw_series(
            points
                .into_iter()
                .map(|xy| Circle::new(xy, 3, color.filled())),
        )
        .map_err(|e| fail(&e))?;
    Ok(())
}

/// Draw the legend of `chart`'s series at `position` and finish the picture.
pub(crate) fn finish<'b, X: plotters::coord::ranged1d::Ranged<ValueType = f64>>(
    chart: &mut LogChart<'b, 'b, X>,
    position: plotters::chart::SeriesLabelPosition,
    fail: &dyn Fn(&dyn std::fmt::Display) -> Error,
) -> Result<()> {
    use plotters::prelude::*;
    chart
        .configure_series_labels()
        .position(position)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(|e| fail(&e))?;
    chart.plotting_area().present().map_err(|e| fail(&e))
}

/// One protocol's figures as the plot needs them.
#[derive(Debug, Clone, PartialEq)]
struct Protocol {
    name: String,
    /// Failure-free median wall over the baseline's.
    ratio: f64,
    /// Median wall with the bench's failure over the baseline's
    /// failure-free median (`None` without `--failure`).
    failure_ratio: Option<f64>,
    /// The paired ratio and its 95% confidence interval, where the report
    /// has them (the interval needs 6 repetitions).
    paired: Option<(f64, Option<[f64; 2]>)>,
    /// Ping-pong: `(bytes, MB/s)` medians per size.
    bandwidth: Vec<(f64, f64)>,
}

/// What a bench report says, for plotting.
#[derive(Debug, Clone, PartialEq)]
struct Report {
    title: String,
    /// The bench's failure scenario (`--failure`), as its kills.
    failure: Option<String>,
    baseline: String,
    pingpong: bool,
    protocols: Vec<Protocol>,
    /// What failed, one entry per protocol (and failure scenario) with a
    /// run that did not verify: the picture says so.
    failed: Vec<String>,
}

fn bad(detail: impl Into<String>) -> Error {
    Error::config("plot", detail)
}

impl Report {
    /// Read the fields the plot uses from a `lazarus bench --json` report.
    fn from_json(v: &Value) -> Result<Self> {
        let list = v["protocols"]
            .as_array()
            .ok_or_else(|| bad("not a `lazarus bench --json` report: no `protocols` list"))?;
        let app = v["app"].as_str().unwrap_or("?");
        let baseline = v["baseline"].as_str().unwrap_or("none").to_string();
        let base_wall = list
            .iter()
            .find(|p| p["protocol"].as_str() == Some(baseline.as_str()))
            .and_then(|p| p["median_wall_s"].as_f64());
        let mut protocols = Vec::with_capacity(list.len());
        for p in list {
            let name = p["protocol"]
                .as_str()
                .ok_or_else(|| bad("a protocol entry has no `protocol` name"))?
                .to_string();
            let ratio = p["ratio"]
                .as_f64()
                .ok_or_else(|| bad(format!("protocol `{name}` has no `ratio`")))?;
            let failure_ratio = match (p["failure"]["median_wall_s"].as_f64(), base_wall) {
                (Some(w), Some(b)) if b > 0.0 => Some(w / b),
                _ => None,
            };
            let paired = p["paired_ratio"]
                .as_f64()
                .filter(|r| r.is_finite())
                .map(|r| {
                    let ci = match p["paired_ratio_ci95"].as_array().map(Vec::as_slice) {
                        Some([lo, hi]) => lo.as_f64().zip(hi.as_f64()).map(|(lo, hi)| [lo, hi]),
                        _ => None,
                    };
                    (
                        r,
                        ci.filter(|[lo, hi]| lo.is_finite() && hi.is_finite() && lo <= hi),
                    )
                });
            let bandwidth = p["metrics"]
                .as_array()
                .map(|points| {
                    points
                        .iter()
                        .filter_map(|pt| {
                            Some((pt["bytes"].as_f64()?, pt["bandwidth_mb_s"].as_f64()?))
                        })
                        .filter(|(b, w)| *b > 0.0 && *w > 0.0 && w.is_finite())
                        .collect()
                })
                .unwrap_or_default();
            protocols.push(Protocol {
                name,
                ratio,
                failure_ratio,
                paired,
                bandwidth,
            });
        }
        if protocols.is_empty() {
            return Err(bad("the report has no protocols"));
        }
        let class = v["class"]
            .as_str()
            .map(|c| format!(" class {c}"))
            .unwrap_or_default();
        let nodes = v["nodes"].as_u64().unwrap_or(1);
        let title = format!(
            "{app}{class} on {} ranks ({nodes} node{}), backend {}, {} reps",
            v["ranks"],
            if nodes == 1 { "" } else { "s" },
            v["backend"].as_str().unwrap_or("?"),
            v["reps"]
        );
        let failed = list.iter().flat_map(failed_runs).collect();
        let failure = list.iter().find_map(|p| {
            let kills = p["failure"]["kills"].as_array()?;
            Some(
                kills
                    .iter()
                    .filter_map(Value::as_str)
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        });
        Ok(Report {
            title,
            failure,
            baseline,
            pingpong: app == "pingpong",
            protocols,
            failed,
        })
    }

    /// The line that says which runs failed, if any did.
    fn failure_note(&self) -> Option<String> {
        (!self.failed.is_empty()).then(|| format!("NOT VERIFIED: {}", self.failed.join("; ")))
    }
}

/// What failed among one protocol's runs of a bench report, failure-free
/// and with the failure scenario: "coordinated: 1 of 6 runs failed",
/// "ulml with 1@70%: 2 of 6 runs failed" (or "a run failed" in a report
/// without its runs).
fn failed_runs(p: &Value) -> Vec<String> {
    let name = p["protocol"].as_str().unwrap_or("?");
    let scenario = |v: &Value| -> Option<String> {
        let runs = v["runs"].as_array().map(Vec::as_slice).unwrap_or_default();
        let bad = (runs.iter())
            .filter(|r| r["verified"].as_bool() == Some(false))
            .count();
        if v["verified_all"].as_bool() != Some(false) && bad == 0 {
            return None;
        }
        Some(if bad > 0 {
            format!("{bad} of {} runs failed", runs.len())
        } else {
            "a run failed".into()
        })
    };
    let kills = (p["failure"]["kills"].as_array().into_iter().flatten())
        .filter_map(Value::as_str)
        .collect::<Vec<_>>()
        .join(" ");
    [
        scenario(p).map(|s| format!("{name}: {s}")),
        scenario(&p["failure"])
            .filter(|_| p["failure"].is_object())
            .map(|s| format!("{name} with {kills}: {s}")),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Title font size, pixels.
const TITLE_PX: u32 = 18;
/// The failure note's font size, pixels.
const NOTE_PX: u32 = 15;
/// Space around the picture's content, pixels.
const MARGIN: u32 = 15;

/// A generous width of `text` in a sans-serif font of `px` pixels (0.6 em
/// per character: wider than the average glyph, so a title estimated to
/// fit does).
fn text_width(text: &str, px: u32) -> u32 {
    let chars = u32::try_from(text.chars().count()).unwrap_or(u32::MAX);
    chars.saturating_mul(px).saturating_mul(3) / 5
}

/// The width of a picture whose content needs `content` pixels: wider when
/// the title or the failure note needs it, so that they fit.
fn picture_width(r: &Report, content: u32) -> u32 {
    let note = r.failure_note().map_or(0, |n| text_width(&n, NOTE_PX));
    content
        .max(text_width(&r.title, TITLE_PX))
        .max(note)
        .saturating_add(2 * MARGIN)
}

/// Draw the title and, when a run failed, the failure note (in red) at the
/// top of `root`; returns the area below them, for the chart.
fn heading<'a>(
    root: &plotters::drawing::DrawingArea<
        plotters::backend::SVGBackend<'a>,
        plotters::coord::Shift,
    >,
    r: &Report,
    fail: &dyn Fn(&dyn std::fmt::Display) -> Error,
) -> Result<plotters::drawing::DrawingArea<plotters::backend::SVGBackend<'a>, plotters::coord::Shift>>
{
    use plotters::prelude::*;
    let note = r.failure_note();
    let height = MARGIN + TITLE_PX + 8 + note.as_ref().map_or(0, |_| NOTE_PX + 8);
    let (top, rest) = root.split_vertically(height);
    let x = i32::try_from(MARGIN).unwrap_or(0);
    let mut y = i32::try_from(MARGIN).unwrap_or(0);
    top.draw(&Text::new(
        r.title.clone(),
        (x, y),
        ("sans-serif", TITLE_PX).into_font(),
    ))
    .map_err(|e| fail(&e))?;
    if let Some(note) = note {
        y += i32::try_from(TITLE_PX + 8).unwrap_or(0);
        let style = ("sans-serif", NOTE_PX)
            .into_font()
            .color(&RGBColor(200, 0, 0));
        top.draw(&Text::new(note, (x, y), style))
            .map_err(|e| fail(&e))?;
    }
    Ok(rest)
}

/// A tick label of a logarithmic axis (and of the ratio axis): plain
/// decimals from 0.01 to 999,999 (`0.1`, `2.5`, `1000`), with no more than
/// 3 significant digits and no trailing zeros; scientific notation
/// (`1e-3`) outside, so that an axis of small probabilities reads alike
/// throughout.
pub(crate) fn log_tick(v: f64) -> String {
    let a = v.abs();
    if !(1e-2..1e6).contains(&a) {
        return if v == 0.0 || !v.is_finite() {
            format!("{v}")
        } else {
            format!("{v:.0e}")
        };
    }
    let decimals = usize::try_from((2 - a.log10().floor() as i64).max(0)).unwrap_or(0);
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Draw the bench report in `json` (the text of a `lazarus bench --json`
/// file) as an SVG file at `out`.
///
/// Errors with [`Error::Config`] when the text is not such a report (naming
/// what is missing), when a ping-pong report has no bandwidth figures, or when
/// the file cannot be written.
pub fn plot_bench(json: &str, out: &Path) -> Result<()> {
    let v: Value =
        serde_json::from_str(json).map_err(|e| bad(format!("the report is not JSON: {e}")))?;
    let report = Report::from_json(&v)?;
    if report.pingpong {
        bandwidth_svg(&report, out)
    } else {
        ratio_svg(&report, out)
    }
}

/// The error of a failed drawing into `out`.
pub(crate) fn draw_error(out: &Path) -> impl Fn(&dyn std::fmt::Display) -> Error + '_ {
    move |e| bad(format!("cannot draw SVG `{}`: {e}", out.display()))
}

/// The y range of a ratio plot: from a little below the lowest figure
/// (never below 0) to above the highest, with room for the bars' labels,
/// so that differences of a few percent show.
fn ratio_range(r: &Report) -> (f64, f64) {
    let figures = r.protocols.iter().flat_map(|p| {
        let ci = p.paired.and_then(|(_, ci)| ci).unwrap_or([f64::NAN; 2]);
        [Some(p.ratio), p.failure_ratio, Some(ci[0]), Some(ci[1])]
            .into_iter()
            .flatten()
    });
    // The baseline's level, 1, is always shown.
    let (lo, hi) = figures
        .filter(|v| v.is_finite())
        .fold((1.0f64, 1.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let span = (hi - lo).max(0.05 * hi);
    ((lo - 0.3 * span).max(0.0), hi + 0.25 * span)
}

/// Bars of wall-time ratios to the baseline, per protocol.
fn ratio_svg(r: &Report, out: &Path) -> Result<()> {
    use plotters::prelude::*;
    let fail = draw_error(out);
    let with_failure = r.protocols.iter().any(|p| p.failure_ratio.is_some());
    let (bottom, top) = ratio_range(r);
    let label_room = (top - bottom) * 0.04;
    let n = r.protocols.len();
    let free_color = RGBColor(30, 60, 200);
    let failure_color = RGBColor(200, 30, 30);
    // Legend: which bar is which.
    let legend = [
        (
            free_color,
            "failure-free (dot and whisker: paired ratio, its 95% CI)".to_string(),
        ),
        (
            failure_color,
            format!(
                "with {} (in brackets: over its own failure-free time)",
                r.failure.as_deref().unwrap_or("the failure")
            ),
        ),
    ];
    let legend = &legend[..if with_failure { 2 } else { 1 }];
    const LEGEND_PX: u32 = 13;
    let bars = 180 + 130 * u32::try_from(n).unwrap_or(64).min(64);
    let widest_legend = (legend.iter())
        .map(|(_, l)| 30 + text_width(l, LEGEND_PX))
        .max()
        .unwrap_or(0);
    let width = picture_width(r, bars.max(widest_legend));
    let legend_h = 10 + 20 * u32::try_from(legend.len()).unwrap_or(2);
    let root = SVGBackend::new(out, (width, 520 + legend_h)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let below = heading(&root, r, &fail)?;
    let (plot, legend_area) = below.split_vertically(below.dim_in_pixel().1 - legend_h);
    let mut chart = ChartBuilder::on(&plot)
        .margin(i32::try_from(MARGIN).unwrap_or(15))
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..n as f64, bottom..top)
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_label_formatter(&|v| log_tick(*v))
        .y_desc(format!("median wall time / {}", r.baseline))
        .draw()
        .map_err(|e| fail(&e))?;
    // The baseline level.
    chart
        .draw_series(LineSeries::new(
            [(0.0, 1.0), (n as f64, 1.0)],
            BLACK.mix(0.4).stroke_width(1),
        ))
        .map_err(|e| fail(&e))?;
    for (i, p) in r.protocols.iter().enumerate() {
        let x = i as f64;
        // Side by side with a failure bar, else one centred bar.
        let (x0, x1) = if with_failure {
            (x + 0.12, x + 0.48)
        } else {
            (x + 0.2, x + 0.8)
        };
        let free = (x0, x1, p.ratio, free_color, format!("{:.3}", p.ratio));
        // Also over the protocol's own failure-free time (002 Table 2).
        let failure = p.failure_ratio.map(|f| {
            let label = format!("{f:.3} ({:.2}x)", f / p.ratio);
            (x + 0.52, x + 0.88, f, failure_color, label)
        });
        let bars = std::iter::once(free).chain(failure);
        for (x0, x1, y, c, label) in bars {
            if !y.is_finite() {
                continue;
            }
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(x0, bottom), (x1, y)],
                    c.filled(),
                )))
                .map_err(|e| fail(&e))?;
            chart
                .draw_series(std::iter::once(Text::new(
                    label,
                    (x0, y + label_room),
                    ("sans-serif", 13),
                )))
                .map_err(|e| fail(&e))?;
        }
        // The paired ratio (a dot) and its confidence interval (a
        // whisker), on the failure-free bar's right half.
        if let Some((paired, ci)) = p.paired {
            let xm = x0 + (x1 - x0) * 0.75;
            if let Some([lo, hi]) = ci {
                let cap = (x1 - x0) * 0.08;
                let lines = [
                    [(xm, lo), (xm, hi)],
                    [(xm - cap, lo), (xm + cap, lo)],
                    [(xm - cap, hi), (xm + cap, hi)],
                ];
                chart
                    .draw_series(lines.map(|l| PathElement::new(l, BLACK.stroke_width(2))))
                    .map_err(|e| fail(&e))?;
            }
            chart
                .draw_series(std::iter::once(Circle::new(
                    (xm, paired),
                    4,
                    BLACK.filled(),
                )))
                .map_err(|e| fail(&e))?;
        }
        // The protocol's name under its bars, in the label area (in the
        // backend's coordinates, which are the whole picture's).
        let (px, py) = chart.backend_coord(&(x + 0.2, bottom));
        root.draw(&Text::new(
            p.name.clone(),
            (px, py + 12),
            ("sans-serif", 15),
        ))
        .map_err(|e| fail(&e))?;
    }
    // The legend, under the chart.
    for (k, (c, label)) in legend.iter().enumerate() {
        let x = i32::try_from(MARGIN).unwrap_or(15);
        let y = 5 + 20 * i32::try_from(k).unwrap_or(0);
        legend_area
            .draw(&Rectangle::new([(x, y), (x + 20, y + 12)], c.filled()))
            .map_err(|e| fail(&e))?;
        legend_area
            .draw(&Text::new(
                label.clone(),
                (x + 30, y),
                ("sans-serif", LEGEND_PX),
            ))
            .map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))?;
    Ok(())
}

/// Bandwidth against message size, one line per protocol.
fn bandwidth_svg(r: &Report, out: &Path) -> Result<()> {
    use plotters::prelude::*;
    let fail = draw_error(out);
    let points = r.protocols.iter().flat_map(|p| p.bandwidth.iter().copied());
    let (mut x_lo, mut x_hi, mut y_lo, mut y_hi) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for (x, y) in points {
        x_lo = x_lo.min(x);
        x_hi = x_hi.max(x);
        y_lo = y_lo.min(y);
        y_hi = y_hi.max(y);
    }
    if !(x_lo.is_finite() && y_lo.is_finite()) {
        return Err(bad("the ping-pong report has no bandwidth figures"));
    }
    // Sizes are powers of two: the x axis is log2 of the size, so that its
    // ticks fall on them.
    let (x_lo, x_hi) = (
        x_lo.log2().floor(),
        x_hi.log2().ceil().max(x_lo.log2().floor() + 1.0),
    );
    let root = SVGBackend::new(out, (picture_width(r, 770), 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| fail(&e))?;
    let below = heading(&root, r, &fail)?;
    let mut chart = ChartBuilder::on(&below)
        .margin(i32::try_from(MARGIN).unwrap_or(15))
        .x_label_area_size(45)
        .y_label_area_size(70)
        .build_cartesian_2d(x_lo..x_hi, (y_lo / 2.0..y_hi * 2.0).log_scale())
        .map_err(|e| fail(&e))?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("bandwidth [MB/s]")
        .x_labels(((x_hi - x_lo) as usize / 2).max(2))
        .x_label_formatter(&|v| {
            if (v - v.round()).abs() < 1e-6 {
                super::binary_size(v.round().exp2() as u64)
            } else {
                String::new()
            }
        })
        .y_label_formatter(&|v| log_tick(*v))
        .draw()
        .map_err(|e| fail(&e))?;
    for (i, p) in r.protocols.iter().enumerate() {
        if p.bandwidth.is_empty() {
            continue;
        }
        let points = p.bandwidth.iter().map(|&(b, w)| (b.log2(), w)).collect();
        let label = format!("{} ({:.3}x wall)", p.name, p.ratio);
        line_with_points(&mut chart, points, i, label, &fail)?;
    }
    finish(&mut chart, SeriesLabelPosition::UpperLeft, &fail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(app: &str) -> Value {
        serde_json::json!({
            "app": app, "class": "W", "ranks": 8, "nodes": 4, "backend": "processes",
            "reps": 5, "baseline": "none",
            "protocols": [
                {"protocol": "none", "median_wall_s": 0.5, "ratio": 1.0,
                 "metrics": [{"bytes": 8, "latency_us": 0.4, "bandwidth_mb_s": 20.0},
                             {"bytes": 1048576, "latency_us": 80.0, "bandwidth_mb_s": 13000.0}],
                 "failure": null},
                {"protocol": "ulml", "median_wall_s": 0.6, "ratio": 1.2,
                 "paired_ratio": 1.15, "paired_ratio_ci95": [1.05, 1.3],
                 "metrics": [{"bytes": 8, "latency_us": 0.5, "bandwidth_mb_s": 16.0},
                             {"bytes": 1048576, "latency_us": 120.0, "bandwidth_mb_s": 8700.0}],
                 "failure": {"median_wall_s": 0.66}}
            ]
        })
    }

    #[test]
    fn a_report_gives_each_protocol_its_ratios() {
        let r = Report::from_json(&report("cg")).expect("a bench report");
        assert!(!r.pingpong);
        assert_eq!(r.protocols.len(), 2);
        assert_eq!(r.protocols[0].failure_ratio, None);
        assert_eq!(r.protocols[0].paired, None, "a report without them");
        assert_eq!(r.protocols[1].paired, Some((1.15, Some([1.05, 1.3]))));
        let f = r.protocols[1].failure_ratio.expect("failure ratio");
        assert!((f - 0.66 / 0.5).abs() < 1e-12, "{f}");
        assert_eq!(
            r.protocols[1].bandwidth,
            vec![(8.0, 16.0), (1048576.0, 8700.0)]
        );
    }

    #[test]
    fn both_kinds_of_report_draw_an_svg_naming_every_protocol() {
        let dir = std::env::temp_dir().join(format!("lazarus-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for app in ["cg", "pingpong"] {
            let out = dir.join(format!("{app}.svg"));
            plot_bench(&report(app).to_string(), &out).expect("drawn");
            let svg = std::fs::read_to_string(&out).expect("written");
            assert!(
                svg.starts_with("<svg"),
                "{app}: {}",
                &svg[..svg.len().min(80)]
            );
            for name in ["none", "ulml"] {
                assert!(svg.contains(name), "{app}: {name} missing");
            }
            if app == "cg" {
                assert!(svg.contains("1.320"), "the failure bar's label");
                // One dot for the one protocol with a paired ratio.
                assert_eq!(svg.matches("<circle").count(), 1, "the paired ratio's dot");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The texts of an SVG's `<text>` elements.
    fn texts(svg: &str) -> Vec<String> {
        (svg.split("<text").skip(1))
            .filter_map(|t| Some(t.split_once('>')?.1.split("</text>").next()?.trim()))
            .map(String::from)
            .collect()
    }

    /// Draw `report` and return the SVG's text.
    fn drawn(report: &Value, name: &str) -> String {
        // Not in the directory of the test above, which removes it.
        let out = std::env::temp_dir().join(format!("lazarus-plot-{}-{name}", std::process::id()));
        plot_bench(&report.to_string(), &out).expect("drawn");
        let svg = std::fs::read_to_string(&out).expect("written");
        let _ = std::fs::remove_file(&out);
        svg
    }

    #[test]
    fn log_ticks_read_as_decimals() {
        for (v, shown) in [
            (0.1, "0.1"),
            (0.01, "0.01"),
            (0.25, "0.25"),
            (1.0, "1"),
            (1.05, "1.05"),
            (10.0, "10"),
            (1000.0, "1000"),
            (1e-3, "1e-3"),
            (1e-6, "1e-6"),
            (1e7, "1e7"),
        ] {
            assert_eq!(log_tick(v), shown, "{v}");
        }
    }

    #[test]
    fn a_log_axis_labels_a_tenth_as_0_1() {
        let mut r = report("pingpong");
        r["protocols"][0]["metrics"] = serde_json::json!([
            {"bytes": 1, "bandwidth_mb_s": 0.08},
            {"bytes": 1024, "bandwidth_mb_s": 3.0},
            {"bytes": 1048576, "bandwidth_mb_s": 40.0}
        ]);
        let t = texts(&drawn(&r, "log.svg"));
        for tick in ["0.1", "1", "10"] {
            assert!(t.iter().any(|x| x == tick), "no `{tick}` tick in {t:?}");
        }
        assert!(
            !t.iter().any(|x| x == "0" || x == "1e-1" || x == "1e0"),
            "{t:?}"
        );
    }

    #[test]
    fn a_ratio_axis_starts_near_the_data() {
        let t = texts(&drawn(&report("cg"), "ratio.svg"));
        let numbers: Vec<f64> = t.iter().filter_map(|x| x.parse().ok()).collect();
        assert!(numbers.len() > 4, "{t:?}");
        // Every figure is 1 or more: no tick near 0.
        let lowest = numbers.iter().copied().fold(f64::INFINITY, f64::min);
        assert!(lowest > 0.8, "lowest tick {lowest} in {t:?}");
        let (bottom, top) = ratio_range(&Report::from_json(&report("cg")).expect("report"));
        assert!(bottom > 0.8 && top > 1.32, "{bottom}..{top}");
    }

    #[test]
    fn the_title_fits_the_picture() {
        // One protocol: a narrow picture by its bars alone.
        let mut r = report("cg");
        r["backend"] = "processes, with a long name to make the title long".into();
        r["protocols"] = serde_json::json!([r["protocols"][0].clone()]);
        let svg = drawn(&r, "title.svg");
        let width: u32 = (svg.split("width=\"").nth(1))
            .and_then(|w| w.split('"').next())
            .and_then(|w| w.parse().ok())
            .expect("an SVG width");
        let title = Report::from_json(&r).expect("report").title;
        assert!(texts(&svg).contains(&title), "{svg}");
        assert!(
            width >= text_width(&title, TITLE_PX) + 2 * MARGIN,
            "{width} px for `{title}`"
        );
    }

    #[test]
    fn a_bench_whose_run_failed_says_so() {
        let mut r = report("cg");
        r["protocols"][1]["verified_all"] = false.into();
        r["protocols"][1]["runs"] = serde_json::json!([{"verified": true}, {"verified": false}]);
        r["protocols"][1]["failure"]["kills"] = serde_json::json!(["1@70%"]);
        r["protocols"][1]["failure"]["verified_all"] = false.into();
        let note = "NOT VERIFIED: ulml: 1 of 2 runs failed; ulml with 1@70%: a run failed";
        for app in ["cg", "pingpong"] {
            r["app"] = app.into();
            let t = texts(&drawn(&r, &format!("failed-{app}.svg")));
            assert!(t.iter().any(|x| x == note), "{app}: {t:?}");
        }
        // A report whose runs all verified has no such note.
        let t = texts(&drawn(&report("cg"), "verified.svg"));
        assert!(!t.iter().any(|x| x.contains("NOT VERIFIED")), "{t:?}");
    }

    #[test]
    fn what_is_not_a_bench_report_is_a_clear_error() {
        let out = std::env::temp_dir().join("lazarus-plot-never-written.svg");
        for (text, says) in [
            ("{", "not JSON"),
            ("{\"app\": \"cg\"}", "no `protocols` list"),
            ("{\"protocols\": []}", "no protocols"),
            ("{\"protocols\": [{\"protocol\": \"none\"}]}", "no `ratio`"),
        ] {
            let e = plot_bench(text, &out).expect_err(text);
            assert!(e.to_string().contains(says), "{text}: {e}");
        }
        let empty = serde_json::json!({"app": "pingpong", "protocols": [{"protocol": "none", "ratio": 1.0}]});
        let e = plot_bench(&empty.to_string(), &out).expect_err("no figures");
        assert!(e.to_string().contains("no bandwidth figures"), "{e}");
        assert!(!out.exists());
    }
}
