//! Run timelines: what each rank did when, for a user to look at.
//!
//! The engine opens and closes a span around each runtime operation
//! (a send, a receive, a collective, a one-sided operation, a safe point
//! and the checkpoint inside it, a recovery and its restore, a replay) and
//! marks instants (a failure detected, a generation committed, messages
//! resent); the driver marks kills. Time is the driver's clock: real time
//! on threads and processes (one clock for the whole job), virtual time on
//! the simulator. Compute is the time between two top-level operations.
//!
//! Spans shorter than a threshold that follow one of the same kind at the
//! same depth are merged into it (with a count), so that a trace of a
//! chatty program stays small; a merged span never leaves its parent, so
//! spans stay properly nested, as the Chrome trace event format (read by
//! Perfetto and chrome://tracing) requires of slices on one thread.
//!
//! Ranks hand their events to the driver in batches ([`Stat::Trace`]),
//! the driver collects them per rank ([`Trace`]), and [`Trace::to_chrome`]
//! writes the file (`lazarus run --trace FILE`); `lazarus report FILE
//! --svg OUT` draws it.
//!
//! [`Stat::Trace`]: crate::driver::Stat::Trace

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::Rank;

/// What a rank was doing during a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Activity {
    /// Application code between two runtime operations.
    Compute,
    /// A point-to-point send.
    Send,
    /// A receive, probe or wait for a message.
    Receive,
    /// A collective operation (its sends and receives inside it).
    Collective,
    /// A one-sided operation or a window synchronisation.
    OneSided,
    /// A safe point (the protocol may checkpoint, or wait for others).
    SafePoint,
    /// Capturing this rank's checkpoint piece (application state,
    /// windows, unexpected messages, the protocol's log).
    Checkpoint,
    /// Handing the piece to the storage levels (local copy, partner and
    /// parity transfers started, disk writes).
    Storage,
    /// Recovery from a failure: locating, fetching, waiting for others.
    Recovery,
    /// Restoring the state from a checkpoint piece.
    Restore,
    /// Re-execution after a restore under a logging protocol, until the
    /// rank has caught up: receptions forced by logged determinants,
    /// messages receivers already have, collectives answered from a log.
    Replay,
    /// Moving to another worker (001): packing the rank's state and its
    /// transfer, until it resumes there.
    Migration,
}

impl Activity {
    /// Every activity, in lane-legend order.
    pub const ALL: [Activity; 12] = [
        Activity::Compute,
        Activity::Send,
        Activity::Receive,
        Activity::Collective,
        Activity::OneSided,
        Activity::SafePoint,
        Activity::Checkpoint,
        Activity::Storage,
        Activity::Recovery,
        Activity::Restore,
        Activity::Replay,
        Activity::Migration,
    ];

    /// Whether spans of this kind are few (one per checkpoint or
    /// recovery) and always kept whole, however short (on the simulator a
    /// checkpoint takes no virtual time); the others are merged and
    /// dropped below the threshold.
    pub fn is_rare(self) -> bool {
        matches!(
            self,
            Activity::Checkpoint
                | Activity::Storage
                | Activity::Recovery
                | Activity::Restore
                | Activity::Replay
                | Activity::Migration
        )
    }

    /// The span's name in a trace file.
    pub fn name(self) -> &'static str {
        match self {
            Activity::Compute => "compute",
            Activity::Send => "send",
            Activity::Receive => "receive",
            Activity::Collective => "collective",
            Activity::OneSided => "one-sided",
            Activity::SafePoint => "safe point",
            Activity::Checkpoint => "checkpoint",
            Activity::Storage => "storage",
            Activity::Recovery => "recovery",
            Activity::Restore => "restore",
            Activity::Replay => "replay",
            Activity::Migration => "migration",
        }
    }

    /// The activity a trace file's span name stands for.
    pub fn from_name(name: &str) -> Option<Activity> {
        Activity::ALL.into_iter().find(|a| a.name() == name)
    }
}

/// An instant worth marking on a rank's lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mark {
    /// The rank was killed (marked by the driver).
    Kill,
    /// The rank learnt of a failure event (`arg`: the world epoch).
    Detected,
    /// The rank learnt that a generation committed (`arg`: generation).
    Commit,
    /// The rank resent logged messages to a recovering rank (`arg`: how many).
    Resend,
}

impl Mark {
    /// The instant's name in a trace file.
    pub fn name(self) -> &'static str {
        match self {
            Mark::Kill => "kill",
            Mark::Detected => "failure detected",
            Mark::Commit => "commit",
            Mark::Resend => "resend",
        }
    }

    /// The name of `arg` in a trace file.
    fn arg_name(self) -> &'static str {
        match self {
            Mark::Kill => "incarnation",
            Mark::Detected => "epoch",
            Mark::Commit => "generation",
            Mark::Resend => "messages",
        }
    }

    /// The mark a trace file's instant name stands for.
    pub fn from_name(name: &str) -> Option<Mark> {
        [Mark::Kill, Mark::Detected, Mark::Commit, Mark::Resend]
            .into_iter()
            .find(|m| m.name() == name)
    }
}

/// One recorded event of a rank (times in nanoseconds of the driver clock).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub enum TraceEvent {
    /// A span: what the rank did from `start` to `end`.
    Span {
        /// What it did.
        activity: Activity,
        /// Start (ns).
        start: u64,
        /// End (ns).
        end: u64,
        /// Nesting depth when it was open (0: top level).
        depth: u8,
        /// Operations merged into this span.
        count: u32,
    },
    /// An instant.
    Mark {
        /// What happened.
        mark: Mark,
        /// When (ns).
        at: u64,
        /// Its number (epoch, generation, message count, incarnation).
        arg: u64,
    },
}

/// Spans shorter than this are merged into a preceding one of the same
/// kind, and compute shorter than this is not drawn.
pub const DEFAULT_THRESHOLD: Duration = Duration::from_micros(50);

/// A rank's batch is handed to the driver once it holds this many events
/// (or `FLUSH_EVERY` passed), so a rank killed loses little.
const FLUSH_EVENTS: usize = 512;
const FLUSH_EVERY: u64 = 50_000_000;

/// A rank's recorder: the engine's half of a timeline.
#[derive(Debug)]
pub struct Tracer {
    threshold: u64,
    /// Open spans, outermost first: activity, start, and how many events
    /// there were when it opened (its children follow).
    open: Vec<(Activity, u64, usize)>,
    events: Vec<TraceEvent>,
    /// End of the last top-level span (compute starts there).
    last_top_end: Option<u64>,
    last_flush: u64,
}

fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Tracer {
    /// A recorder that merges spans shorter than `threshold`.
    pub fn new(threshold: Duration) -> Self {
        Tracer {
            threshold: ns(threshold),
            open: Vec::new(),
            events: Vec::new(),
            last_top_end: None,
            last_flush: 0,
        }
    }

    /// Whether a span of `activity` is open (at any depth).
    pub fn is_open(&self, activity: Activity) -> bool {
        self.open.iter().any(|&(a, ..)| a == activity)
    }

    /// Open a span of `activity` at `now`.
    pub fn open(&mut self, activity: Activity, now: Duration) {
        let now = ns(now);
        if self.open.is_empty()
            && let Some(prev) = self.last_top_end
            && now.saturating_sub(prev) >= self.threshold
        {
            self.push(Activity::Compute, prev, now, 0, 1);
        }
        self.open.push((activity, now, self.events.len()));
    }

    /// Close the innermost open span of `activity` at `now`, and any
    /// opened inside it that are still open (an operation a failure
    /// interrupted). Nothing happens if none is open.
    pub fn close(&mut self, activity: Activity, now: Duration) {
        let Some(i) = self.open.iter().rposition(|&(a, ..)| a == activity) else {
            return;
        };
        let now = ns(now);
        while self.open.len() > i {
            if let Some((a, start, first)) = self.open.pop() {
                let end = now.max(start);
                // A span too short to see keeps no children (its marks
                // and rare spans stay): a collective of a few small
                // messages is one span.
                if end - start < self.threshold && first < self.events.len() {
                    let mut k = first;
                    for j in first..self.events.len() {
                        let keep = match self.events[j] {
                            TraceEvent::Mark { .. } => true,
                            TraceEvent::Span { activity, .. } => activity.is_rare(),
                        };
                        if keep {
                            self.events.swap(k, j);
                            k += 1;
                        }
                    }
                    self.events.truncate(k);
                }
                let depth = u8::try_from(self.open.len()).unwrap_or(u8::MAX);
                self.push(a, start, end, depth, 1);
            }
        }
        if self.open.is_empty() {
            self.last_top_end = Some(now);
        }
    }

    /// Close every open span at `now` (the rank was killed or rolls back).
    pub fn close_all(&mut self, now: Duration) {
        if let Some(&(a, ..)) = self.open.first() {
            self.close(a, now);
        }
    }

    /// Mark an instant. Resends within the threshold of the previous
    /// resend mark add to it.
    pub fn mark(&mut self, mark: Mark, now: Duration, arg: u64) {
        let at = ns(now);
        if mark == Mark::Resend
            && let Some(TraceEvent::Mark {
                mark: Mark::Resend,
                at: prev,
                arg: n,
            }) = self.events.last_mut()
            && at.saturating_sub(*prev) < self.threshold
        {
            *n += arg;
            return;
        }
        self.events.push(TraceEvent::Mark { mark, at, arg });
    }

    fn push(&mut self, activity: Activity, start: u64, end: u64, depth: u8, count: u32) {
        // Merge into the previous event if it is a span of the same kind
        // at the same depth, both are short, and the gap is short: both
        // then lie in the same parent (a parent closes after its children).
        if end - start < self.threshold
            && !activity.is_rare()
            && let Some(TraceEvent::Span {
                activity: pa,
                end: pe,
                depth: pd,
                count: pc,
                ..
            }) = self.events.last_mut()
            && *pa == activity
            && *pd == depth
            && start.saturating_sub(*pe) < self.threshold
        {
            *pe = end.max(*pe);
            *pc = pc.saturating_add(count);
            return;
        }
        self.events.push(TraceEvent::Span {
            activity,
            start,
            end,
            depth,
            count,
        });
    }

    /// The events to hand to the driver now, if a batch is due (`force`:
    /// whatever there is, as at the end of the rank or at a kill).
    pub fn batch(&mut self, now: Duration, force: bool) -> Option<Vec<TraceEvent>> {
        let now = ns(now);
        let due = force
            || self.events.len() >= FLUSH_EVENTS
            || now.saturating_sub(self.last_flush) >= FLUSH_EVERY;
        if !due || self.events.is_empty() {
            return None;
        }
        self.last_flush = now;
        // Children handed over stay: an open span's own start on.
        for o in &mut self.open {
            o.2 = 0;
        }
        // The next batch starts at its usual size: no chain of regrowths
        // per batch on the traced rank's path.
        Some(std::mem::replace(
            &mut self.events,
            Vec::with_capacity(FLUSH_EVENTS),
        ))
    }
}

/// A job's timeline: every rank's events, and the kills.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Trace {
    /// Per rank, its events in the order they were recorded (incarnations
    /// of a rank share its lane).
    pub ranks: Vec<Vec<TraceEvent>>,
    /// Whether the times are the simulator's virtual time.
    pub virtual_time: bool,
}

impl Trace {
    /// An empty timeline of `ranks` lanes.
    pub fn new(ranks: usize, virtual_time: bool) -> Self {
        Trace {
            ranks: vec![Vec::new(); ranks],
            virtual_time,
        }
    }

    /// Add a batch of `rank`'s events. A killed incarnation's last batch
    /// may arrive after the kill (on threads and the simulator, it sends
    /// what it holds when it notices): its spans end at the kill, so that
    /// they do not overlap its replacement's.
    pub fn extend(&mut self, rank: Rank, mut events: Vec<TraceEvent>) {
        let Some(lane) = self.ranks.get_mut(rank) else {
            return;
        };
        let mut kills: Vec<u64> = lane
            .iter()
            .filter_map(|e| match *e {
                TraceEvent::Mark {
                    mark: Mark::Kill,
                    at,
                    ..
                } => Some(at),
                _ => None,
            })
            .collect();
        kills.sort_unstable();
        for e in &mut events {
            if let TraceEvent::Span { start, end, .. } = e
                && let Some(&k) = kills.iter().find(|&&k| k > *start)
            {
                *end = (*end).min(k);
            }
        }
        lane.extend(events);
    }

    /// Mark kills of `victims` at `now`.
    pub fn kill(&mut self, victims: &[Rank], now: Duration) {
        for &r in victims {
            if let Some(lane) = self.ranks.get_mut(r) {
                let incarnation = lane
                    .iter()
                    .filter(|e| {
                        matches!(
                            e,
                            TraceEvent::Mark {
                                mark: Mark::Kill,
                                ..
                            }
                        )
                    })
                    .count() as u64;
                lane.push(TraceEvent::Mark {
                    mark: Mark::Kill,
                    at: ns(now),
                    arg: incarnation,
                });
            }
        }
    }

    /// Number of events.
    pub fn len(&self) -> usize {
        self.ranks.iter().map(Vec::len).sum()
    }

    /// Whether no event was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The timeline in the Chrome trace event format (JSON object form),
    /// which Perfetto and chrome://tracing open: one process (the job,
    /// named `title`), one thread per rank, complete events ("X") for spans
    /// and thread-scoped instants ("i") for marks; times in microseconds.
    pub fn to_chrome(&self, title: &str) -> serde_json::Value {
        use serde_json::json;
        let us = |t: u64| t as f64 / 1000.0;
        let mut events = vec![json!({
            "name": "process_name", "ph": "M", "pid": 1, "tid": 0,
            "args": { "name": title },
        })];
        for (rank, lane) in self.ranks.iter().enumerate() {
            events.push(json!({
                "name": "thread_name", "ph": "M", "pid": 1, "tid": rank,
                "args": { "name": format!("rank {rank}") },
            }));
            events.push(json!({
                "name": "thread_sort_index", "ph": "M", "pid": 1, "tid": rank,
                "args": { "sort_index": rank },
            }));
            for e in lane {
                events.push(match *e {
                    TraceEvent::Span {
                        activity,
                        start,
                        end,
                        count,
                        ..
                    } => json!({
                        "name": activity.name(), "cat": activity.name(), "ph": "X",
                        "ts": us(start), "dur": us(end - start),
                        "pid": 1, "tid": rank, "args": { "count": count },
                    }),
                    TraceEvent::Mark { mark, at, arg } => json!({
                        "name": mark.name(), "cat": mark.name(), "ph": "i", "s": "t",
                        "ts": us(at), "pid": 1, "tid": rank,
                        "args": { mark.arg_name(): arg },
                    }),
                });
            }
        }
        json!({
            "traceEvents": events,
            "displayTimeUnit": "ms",
            "otherData": {
                "schema": 1,
                "lazarus_version": env!("CARGO_PKG_VERSION"),
                "clock": if self.virtual_time { "simulated" } else { "real" },
            },
        })
    }

    /// Read a timeline back from a Chrome trace written by
    /// [`Trace::to_chrome`] (events of other names are skipped).
    pub fn from_chrome(v: &serde_json::Value) -> Result<Trace, String> {
        let events = v
            .get("traceEvents")
            .and_then(|e| e.as_array())
            .ok_or("no \"traceEvents\" array: not a Chrome trace")?;
        let virtual_time = v
            .pointer("/otherData/clock")
            .and_then(|c| c.as_str())
            .is_some_and(|c| c == "simulated");
        let mut trace = Trace::new(0, virtual_time);
        let ns = |x: Option<&serde_json::Value>| -> Result<u64, String> {
            let us = x
                .and_then(|x| x.as_f64())
                .ok_or("an event without a time")?;
            if !us.is_finite() || us < 0.0 {
                return Err(format!("a time of {us} µs"));
            }
            Ok((us * 1000.0).round() as u64)
        };
        for e in events {
            let (Some(name), Some(ph), Some(tid)) = (
                e.get("name").and_then(|n| n.as_str()),
                e.get("ph").and_then(|p| p.as_str()),
                e.get("tid").and_then(|t| t.as_u64()),
            ) else {
                continue;
            };
            let Ok(rank) = usize::try_from(tid) else {
                continue;
            };
            let event = match ph {
                "X" => {
                    let Some(activity) = Activity::from_name(name) else {
                        continue;
                    };
                    let start = ns(e.get("ts"))?;
                    let end = start + ns(e.get("dur"))?;
                    let count = e
                        .pointer("/args/count")
                        .and_then(|c| c.as_u64())
                        .unwrap_or(1);
                    TraceEvent::Span {
                        activity,
                        start,
                        end,
                        depth: 0,
                        count: u32::try_from(count).unwrap_or(u32::MAX),
                    }
                }
                "i" | "I" => {
                    let Some(mark) = Mark::from_name(name) else {
                        continue;
                    };
                    let arg = e
                        .get("args")
                        .and_then(|a| a.as_object())
                        .and_then(|a| a.values().next())
                        .and_then(|a| a.as_u64())
                        .unwrap_or(0);
                    TraceEvent::Mark {
                        mark,
                        at: ns(e.get("ts"))?,
                        arg,
                    }
                }
                _ => continue,
            };
            if rank >= 1 << 20 {
                return Err(format!("rank {rank}: more lanes than a trace may draw"));
            }
            if trace.ranks.len() <= rank {
                trace.ranks.resize(rank + 1, Vec::new());
            }
            trace.ranks[rank].push(event);
        }
        Ok(trace)
    }

    /// Time of the last event (ns).
    pub fn end(&self) -> u64 {
        self.ranks
            .iter()
            .flatten()
            .map(|e| match *e {
                TraceEvent::Span { end, .. } => end,
                TraceEvent::Mark { at, .. } => at,
            })
            .max()
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    fn spans(t: &mut Tracer) -> Vec<(Activity, u64, u64, u8, u32)> {
        t.batch(Duration::ZERO, true)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|e| match e {
                TraceEvent::Span {
                    activity,
                    start,
                    end,
                    depth,
                    count,
                } => Some((activity, start / 1000, end / 1000, depth, count)),
                TraceEvent::Mark { .. } => None,
            })
            .collect()
    }

    #[test]
    fn short_spans_of_a_kind_merge_and_long_gaps_are_compute() {
        let mut t = Tracer::new(us(50));
        for i in 0..3 {
            t.open(Activity::Send, us(10 * i));
            t.close(Activity::Send, us(10 * i + 5));
        }
        t.open(Activity::Receive, us(200));
        t.close(Activity::Receive, us(210));
        assert_eq!(
            spans(&mut t),
            vec![
                (Activity::Send, 0, 25, 0, 3),
                (Activity::Compute, 25, 200, 0, 1),
                (Activity::Receive, 200, 210, 0, 1),
            ]
        );
    }

    #[test]
    fn merged_children_stay_inside_their_parent() {
        let mut t = Tracer::new(us(2));
        t.open(Activity::Collective, us(0));
        t.open(Activity::Send, us(1));
        t.close(Activity::Send, us(2));
        t.open(Activity::Receive, us(3));
        t.close(Activity::Receive, us(4));
        t.close(Activity::Collective, us(5));
        // A second collective: its send does not merge with the first's.
        t.open(Activity::Collective, us(6));
        t.open(Activity::Send, us(7));
        t.close(Activity::Send, us(8));
        t.close(Activity::Collective, us(9));
        let s = spans(&mut t);
        assert_eq!(
            s,
            vec![
                (Activity::Send, 1, 2, 1, 1),
                (Activity::Receive, 3, 4, 1, 1),
                (Activity::Collective, 0, 5, 0, 1),
                (Activity::Send, 7, 8, 1, 1),
                (Activity::Collective, 6, 9, 0, 1),
            ]
        );
    }

    #[test]
    fn a_short_span_keeps_its_marks_and_rare_spans_but_not_other_children() {
        let mut t = Tracer::new(us(50));
        t.open(Activity::SafePoint, us(0));
        t.open(Activity::Send, us(1));
        t.close(Activity::Send, us(2));
        t.open(Activity::Checkpoint, us(2));
        t.mark(Mark::Commit, us(2), 7);
        t.close(Activity::Checkpoint, us(3));
        t.close(Activity::SafePoint, us(4));
        let all = t.batch(Duration::ZERO, true).unwrap();
        let kinds: Vec<&str> = all
            .iter()
            .map(|e| match e {
                TraceEvent::Mark { mark, .. } => mark.name(),
                TraceEvent::Span { activity, .. } => activity.name(),
            })
            .collect();
        // The send goes; the commit, and the checkpoint (rare), stay.
        assert_eq!(kinds, ["commit", "checkpoint", "safe point"]);
    }

    #[test]
    fn closing_an_outer_span_closes_what_a_failure_left_open() {
        let mut t = Tracer::new(us(1));
        t.open(Activity::SafePoint, us(0));
        t.open(Activity::Checkpoint, us(10));
        t.close(Activity::SafePoint, us(30));
        assert_eq!(
            spans(&mut t),
            vec![
                (Activity::Checkpoint, 10, 30, 1, 1),
                (Activity::SafePoint, 0, 30, 0, 1)
            ]
        );
        t.close(Activity::Send, us(40)); // none open: nothing
        assert!(spans(&mut t).is_empty());
    }

    #[test]
    fn a_dead_incarnations_late_spans_end_at_its_kill() {
        let mut trace = Trace::new(1, false);
        trace.kill(&[0], us(10));
        let late = |start, end| TraceEvent::Span {
            activity: Activity::Collective,
            start,
            end,
            depth: 0,
            count: 1,
        };
        trace.extend(0, vec![late(5_000, 30_000), late(12_000, 30_000)]);
        assert_eq!(trace.ranks[0][1], late(5_000, 10_000));
        assert_eq!(trace.ranks[0][2], late(12_000, 30_000));
    }

    #[test]
    fn chrome_format_round_trips_spans_and_marks() {
        let mut trace = Trace::new(2, false);
        trace.extend(
            1,
            vec![
                TraceEvent::Span {
                    activity: Activity::Checkpoint,
                    start: 1_000,
                    end: 3_000,
                    depth: 0,
                    count: 1,
                },
                TraceEvent::Mark {
                    mark: Mark::Commit,
                    at: 3_000,
                    arg: 2,
                },
            ],
        );
        trace.kill(&[0], us(4));
        let v = trace.to_chrome("test");
        assert_eq!(v["otherData"]["schema"], 1);
        let back = Trace::from_chrome(&v).unwrap();
        assert_eq!(back.ranks[1], trace.ranks[1]);
        assert_eq!(back.ranks[0], trace.ranks[0]);
        assert!(Trace::from_chrome(&serde_json::json!({"x": 1})).is_err());
    }
}
