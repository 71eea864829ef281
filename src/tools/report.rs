//! `lazarus report`: what a run's timeline ([`crate::trace`]) says, as text
//! (time per activity and the marks, per rank) and as a Projections-style
//! SVG picture: one lane per rank, a colour per activity, spans inside
//! others drawn thinner on top of them, kills, detections and commits
//! marked, and a time axis.

use std::fmt::Write as _;

use crate::trace::{Activity, Mark, Trace, TraceEvent};

/// Colour of each activity's spans.
fn colour(a: Activity) -> &'static str {
    match a {
        Activity::Compute => "#d0d0d0",
        Activity::Send => "#4e79a7",
        Activity::Receive => "#a0cbe8",
        Activity::Collective => "#f28e2b",
        Activity::OneSided => "#59a14f",
        Activity::SafePoint => "#edc948",
        Activity::Checkpoint => "#b07aa1",
        Activity::Storage => "#76b7b2",
        Activity::Recovery => "#e15759",
        Activity::Restore => "#ff9da7",
        Activity::Replay => "#9c755f",
        Activity::Migration => "#17becf",
    }
}

/// A rank's spans with their nesting depth (0: top level), in drawing
/// order: enclosing spans before what they enclose.
fn nested(lane: &[TraceEvent]) -> Vec<(Activity, u64, u64, usize, u32)> {
    let mut spans: Vec<(Activity, u64, u64, u32)> = lane
        .iter()
        .filter_map(|e| match *e {
            TraceEvent::Span {
                activity,
                start,
                end,
                count,
                ..
            } => Some((activity, start, end, count)),
            TraceEvent::Mark { .. } => None,
        })
        .collect();
    // Longer first at the same start: the parent before its first child.
    spans.sort_by_key(|&(_, s, e, _)| (s, std::cmp::Reverse(e)));
    let mut ends: Vec<u64> = Vec::new();
    spans
        .into_iter()
        .map(|(a, s, e, c)| {
            while ends.last().is_some_and(|&open| open <= s) {
                ends.pop();
            }
            let depth = ends.len();
            ends.push(e);
            (a, s, e, depth, c)
        })
        .collect()
}

/// Time inside spans of each activity: the union of its spans, so a span
/// inside another of the same activity is not counted twice, and a span
/// inside another activity's counts for both (a checkpoint inside a safe
/// point is time in each).
fn time_per_activity(lane: &[TraceEvent]) -> std::collections::BTreeMap<Activity, u64> {
    let mut per = std::collections::BTreeMap::new();
    let mut covered: std::collections::BTreeMap<Activity, u64> = Default::default();
    for (a, s, e, ..) in nested(lane) {
        // Spans come sorted by start: of one activity's, only the part
        // beyond what the earlier ones covered is new.
        let reach = covered.entry(a).or_insert(0);
        let from = s.max(*reach);
        if e > from {
            *per.entry(a).or_insert(0u64) += e - from;
            *reach = e;
        }
    }
    per
}

/// Per rank: time in each activity (nested spans count for their own
/// activity too), and the marks.
pub fn render_text(trace: &Trace) -> String {
    let mut out = String::new();
    let end = trace.end();
    let clock = if trace.virtual_time {
        "simulated"
    } else {
        "real"
    };
    let _ = writeln!(
        out,
        "timeline: {} ranks, {} events, {:.6} s ({clock} time); seconds in each activity, \
         a span inside another counting for both",
        trace.ranks.len(),
        trace.len(),
        end as f64 / 1e9
    );
    let top: Vec<Activity> = Activity::ALL.to_vec();
    let _ = write!(out, "{:>6}", "rank");
    for a in &top {
        let _ = write!(out, " {:>11}", a.name());
    }
    let _ = writeln!(out, "  marks (seconds)");
    for (rank, lane) in trace.ranks.iter().enumerate() {
        let per = time_per_activity(lane);
        let _ = write!(out, "{rank:>6}");
        for a in &top {
            let _ = write!(
                out,
                " {:>11.6}",
                per.get(a).copied().unwrap_or(0) as f64 / 1e9
            );
        }
        let marks: Vec<String> = lane
            .iter()
            .filter_map(|e| match *e {
                TraceEvent::Mark {
                    mark: m @ (Mark::Kill | Mark::Detected),
                    at,
                    arg,
                } => Some(match m {
                    Mark::Kill => format!("killed {:.6}", at as f64 / 1e9),
                    _ => format!("detected epoch {arg} {:.6}", at as f64 / 1e9),
                }),
                _ => None,
            })
            .collect();
        let _ = writeln!(out, "  {}", marks.join(", "));
    }
    out
}

/// A "nice" tick step (1, 2 or 5 times a power of ten) giving about
/// `target` ticks over `span`.
fn tick_step(span: f64, target: f64) -> f64 {
    let raw = (span / target).max(f64::MIN_POSITIVE);
    let mag = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag)
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The timeline as an SVG picture titled `title`.
pub fn render_svg(trace: &Trace, title: &str) -> String {
    const WIDTH: f64 = 1200.0;
    const LEFT: f64 = 70.0;
    const RIGHT: f64 = 20.0;
    const TOP: f64 = 44.0;
    let ranks = trace.ranks.len().max(1);
    let lane = (640.0 / ranks as f64).clamp(6.0, 28.0);
    let gap = (lane * 0.15).max(1.0);
    let plot_h = ranks as f64 * lane;
    let axis_y = TOP + plot_h + 4.0;
    let legend_y = axis_y + 36.0;
    let height = legend_y + 40.0;
    let plot_w = WIDTH - LEFT - RIGHT;
    let end = trace.end().max(1) as f64;
    let x = |t: u64| LEFT + t as f64 / end * plot_w;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height:.0}" viewBox="0 0 {WIDTH} {height:.0}" font-family="sans-serif">"#
    );
    let _ = writeln!(
        s,
        r#"<rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="24" font-size="15">{}</text>"#,
        escape(title)
    );
    for (rank, events) in trace.ranks.iter().enumerate() {
        let y0 = TOP + rank as f64 * lane;
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" font-size="{:.0}" text-anchor="end">rank {rank}</text>"#,
            LEFT - 6.0,
            y0 + lane * 0.7,
            (lane * 0.6).clamp(6.0, 12.0)
        );
        // Per depth and pixel column, the activity that covers most of
        // it: a lane of thousands of short spans stays a picture of at
        // most a rectangle per pixel, and what dominates shows.
        let columns = plot_w.ceil() as usize;
        let ns_per_px = end / plot_w;
        let mut cover: Vec<Vec<[u64; Activity::ALL.len()]>> = Vec::new();
        for (a, st, en, depth, _) in nested(events) {
            if cover.len() <= depth {
                cover.resize(depth + 1, vec![[0; Activity::ALL.len()]; columns]);
            }
            let k = Activity::ALL.iter().position(|&b| b == a).unwrap_or(0);
            let first = ((st as f64 / ns_per_px) as usize).min(columns - 1);
            let last = ((en as f64 / ns_per_px) as usize).min(columns - 1);
            for (c, col) in cover[depth]
                .iter_mut()
                .enumerate()
                .take(last + 1)
                .skip(first)
            {
                let lo = (c as f64 * ns_per_px) as u64;
                let hi = ((c + 1) as f64 * ns_per_px) as u64;
                // At least 1: a span shorter than a nanosecond shows too.
                col[k] += (en.min(hi).saturating_sub(st.max(lo))).max(1);
            }
        }
        for (depth, cols) in cover.iter().enumerate() {
            let inset = (gap + depth as f64 * lane * 0.15).min(lane * 0.45);
            let dominant = |c: &[u64; Activity::ALL.len()]| {
                let (k, &n) = c.iter().enumerate().max_by_key(|&(_, n)| *n)?;
                (n > 0).then_some(k)
            };
            let mut c = 0;
            while c < columns {
                let Some(k) = dominant(&cols[c]) else {
                    c += 1;
                    continue;
                };
                let start = c;
                while c < columns && dominant(&cols[c]) == Some(k) {
                    c += 1;
                }
                let a = Activity::ALL[k];
                let _ = writeln!(
                    s,
                    r#"<rect x="{:.1}" y="{:.2}" width="{}" height="{:.2}" fill="{}"><title>rank {rank}: {} {:.6}-{:.6} s</title></rect>"#,
                    LEFT + start as f64,
                    y0 + inset,
                    c - start,
                    lane - 2.0 * inset,
                    colour(a),
                    a.name(),
                    start as f64 * ns_per_px / 1e9,
                    c as f64 * ns_per_px / 1e9
                );
            }
        }
        for e in events {
            let TraceEvent::Mark { mark, at, arg } = *e else {
                continue;
            };
            let mx = x(at);
            let label = format!(
                "rank {rank}: {} ({arg}) at {:.6} s",
                mark.name(),
                at as f64 / 1e9
            );
            let _ = match mark {
                Mark::Kill => writeln!(
                    s,
                    r##"<g stroke="#c00000" stroke-width="2"><title>{label}</title><line x1="{:.2}" y1="{:.2}" x2="{:.2}" y2="{:.2}"/><line x1="{:.2}" y1="{:.2}" x2="{:.2}" y2="{:.2}"/></g>"##,
                    mx - lane * 0.35,
                    y0 + 1.0,
                    mx + lane * 0.35,
                    y0 + lane - 1.0,
                    mx + lane * 0.35,
                    y0 + 1.0,
                    mx - lane * 0.35,
                    y0 + lane - 1.0
                ),
                Mark::Detected => writeln!(
                    s,
                    r##"<path d="M{:.2},{:.2} l{:.2},{:.2} l{:.2},0 z" fill="#ff7f0e"><title>{label}</title></path>"##,
                    mx,
                    y0 + lane * 0.5,
                    -lane * 0.3,
                    -lane * 0.45,
                    lane * 0.6
                ),
                Mark::Commit => writeln!(
                    s,
                    r##"<line x1="{mx:.2}" y1="{:.2}" x2="{mx:.2}" y2="{:.2}" stroke="#2ca02c" stroke-width="1"><title>{label}</title></line>"##,
                    y0,
                    y0 + lane * 0.35
                ),
                Mark::Resend => writeln!(
                    s,
                    r##"<circle cx="{mx:.2}" cy="{:.2}" r="{:.2}" fill="#7b3294"><title>{label}</title></circle>"##,
                    y0 + lane * 0.8,
                    (lane * 0.12).max(1.0)
                ),
            };
        }
    }
    // Time axis.
    let secs = end / 1e9;
    let (unit, scale) = if secs < 2e-3 {
        ("µs", 1e6)
    } else if secs < 2.0 {
        ("ms", 1e3)
    } else {
        ("s", 1.0)
    };
    let step = tick_step(secs * scale, 8.0);
    let _ = writeln!(
        s,
        r#"<line x1="{LEFT}" y1="{axis_y:.1}" x2="{:.1}" y2="{axis_y:.1}" stroke="black"/>"#,
        LEFT + plot_w
    );
    let mut k = 0.0;
    while k <= secs * scale * (1.0 + 1e-9) {
        let tx = LEFT + k / (secs * scale) * plot_w;
        let label = format!("{}", (k * 1e6).round() / 1e6);
        let _ = writeln!(
            s,
            r#"<line x1="{tx:.1}" y1="{axis_y:.1}" x2="{tx:.1}" y2="{:.1}" stroke="black"/><text x="{tx:.1}" y="{:.1}" font-size="11" text-anchor="middle">{label}</text>"#,
            axis_y + 5.0,
            axis_y + 18.0
        );
        k += step;
    }
    let clock = if trace.virtual_time {
        "simulated time"
    } else {
        "time"
    };
    let _ = writeln!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{clock} ({unit})</text>"#,
        LEFT + plot_w / 2.0,
        axis_y + 32.0
    );
    // Legend.
    let mut lx = LEFT;
    for a in Activity::ALL {
        let _ = writeln!(
            s,
            r#"<rect x="{lx:.1}" y="{legend_y:.1}" width="12" height="12" fill="{}"/><text x="{:.1}" y="{:.1}" font-size="11">{}</text>"#,
            colour(a),
            lx + 16.0,
            legend_y + 10.5,
            a.name()
        );
        lx += 24.0 + 7.0 * a.name().len() as f64;
    }
    let _ = writeln!(
        s,
        r##"<text x="{LEFT}" y="{:.1}" font-size="11">marks: <tspan fill="#c00000">X kill</tspan>, <tspan fill="#ff7f0e">&#9660; failure detected</tspan>, <tspan fill="#2ca02c">| commit</tspan>, <tspan fill="#7b3294">&#9679; resend</tspan></text>"##,
        legend_y + 30.0
    );
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(activity: Activity, start: u64, end: u64) -> TraceEvent {
        TraceEvent::Span {
            activity,
            start,
            end,
            depth: 0,
            count: 1,
        }
    }

    #[test]
    fn nesting_is_found_from_times_alone() {
        let lane = [
            span(Activity::Send, 2, 3),
            span(Activity::Collective, 1, 5),
            span(Activity::Compute, 5, 9),
        ];
        let n: Vec<(Activity, usize)> = nested(&lane).iter().map(|&(a, .., d, _)| (a, d)).collect();
        assert_eq!(
            n,
            vec![
                (Activity::Collective, 0),
                (Activity::Send, 1),
                (Activity::Compute, 0)
            ]
        );
    }

    #[test]
    fn nested_spans_count_for_their_own_activity_once() {
        // A checkpoint inside a safe point, two overlapping receives
        // (aggregated ones can be), and a send inside the collective.
        let lane = [
            span(Activity::SafePoint, 0, 10),
            span(Activity::Checkpoint, 2, 6),
            span(Activity::Collective, 20, 40),
            span(Activity::Send, 21, 23),
            span(Activity::Receive, 24, 30),
            span(Activity::Receive, 26, 34),
        ];
        let per = time_per_activity(&lane);
        assert_eq!(per[&Activity::SafePoint], 10);
        assert_eq!(per[&Activity::Checkpoint], 4);
        assert_eq!(per[&Activity::Collective], 20);
        assert_eq!(per[&Activity::Send], 2);
        assert_eq!(per[&Activity::Receive], 10);
        assert!(!per.contains_key(&Activity::Compute));
    }

    #[test]
    fn the_picture_has_a_lane_per_rank_and_marks_the_kill() {
        let mut t = Trace::new(3, false);
        t.extend(1, vec![span(Activity::Recovery, 4_000_000, 9_000_000)]);
        t.kill(&[2], std::time::Duration::from_millis(3));
        let svg = render_svg(&t, "a <test>");
        assert!(svg.contains("a &lt;test&gt;"));
        for r in 0..3 {
            assert!(svg.contains(&format!(">rank {r}</text>")));
        }
        assert!(svg.contains("rank 2: kill"));
        assert!(svg.contains("rank 1: recovery"));
        assert!(svg.contains("time (ms)"));
        let text = render_text(&t);
        assert!(text.contains("killed 0.003000"), "{text}");
    }

    #[test]
    fn ticks_are_one_two_or_five_times_a_power_of_ten() {
        assert_eq!(tick_step(10.0, 8.0), 2.0);
        assert_eq!(tick_step(0.7, 8.0), 0.1);
        assert_eq!(tick_step(3000.0, 8.0), 500.0);
    }
}
