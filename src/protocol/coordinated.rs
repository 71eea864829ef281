//! Protocol `coordinated`: blocking coordinated checkpointing (004 §2.2, the
//! "coordinated checkpoint" of 003 §3.1).
//!
//! **Checkpoint.** Every `every`-th safe point is a checkpoint of generation
//! `g`, and every rank blocks in it until `g` commits (blocking coordinated
//! checkpointing), so no application message is sent while it is taken.
//! Channels are silenced by counting rather than by a marker on each of the
//! P² channels: ranks sum the application messages sent and arrived in their
//! subtree of a fixed 4-ary tree rooted at rank 0 (`Count`). Sends are frozen
//! once a rank is in the checkpoint and arrivals never exceed sends, so when
//! the root sees the totals equal, every message sent before the cut has
//! arrived (consumed, or in an unexpected queue that the engine saves with the
//! state): the saved states form a consistent cut with no channel state. If
//! the totals differ the root starts another round (`Recount`); otherwise it
//! sends `Silent` down the tree and each rank captures its piece. The store
//! keeps it locally and in its in-memory level (partner copy or group parity,
//! see `store::levels`); `Stored` climbs the tree once a whole
//! subtree is stored, and the root sends the commit record (`Commit`) down.
//! Only a committed generation is ever restored. Every phase costs O(P)
//! messages and O(log P) latency, so this scales to the 10,000-rank studies.
//!
//! **Schemes (003 §3.1.2).** What is described above is the *Locks* scheme
//! of 003: a rank at a safe point holds no lock (the engine refuses a safe
//! point inside a passive-target epoch: LC = 0) and has completed its
//! one-sided requests (FLUSH), and the counting round is the barrier (BAR)
//! after which every rank captures, so no access and no message crosses the
//! cut. The *Gsync* scheme captures at once, with no message before the
//! capture: a rank at a safe point right after a GSYNC (a fence on a window
//! of every rank, and no send, receive or access since:
//! `ProtocolCx::after_gsync`) has every access of the epoch completed at
//! every target (the fence), and no rank issues another before its own
//! capture or after it until the commit. The root checks the cut when the
//! pieces are stored instead of before: `Stored` carries each subtree's
//! counts at its captures and how many of its ranks were not right after a
//! GSYNC; if a message crossed the cut (sent ≠ arrived) or a rank was not
//! after a GSYNC (its accesses since may have reached a target that had
//! captured; a fence begun with a request-based access pending on any
//! window is no GSYNC either, since the access may be applied after its
//! target's capture), the generation is abandoned (`Abandon` down the
//! tree: every rank drops that generation's pieces, `Action::Discard`) and
//! checkpointed again at once, in the same safe point, by the Locks
//! scheme. With `CheckpointScheme::Auto` the first
//! checkpoint uses Locks and the root chooses the next one's scheme from
//! what the ranks report: Gsync while every rank checkpoints right after a
//! GSYNC, Locks otherwise, and Locks for good once a Gsync cut was
//! abandoned. The scheme travels with the commit record, so every rank
//! uses the same one. Never fewer phases are saved than that a wrong cut
//! could commit: consistency is checked either way, only its moment moves.
//!
//! **Recovery.** Any failure rolls every rank back. Survivors and replacements
//! send an `Inventory` (newest commit record seen, pieces and intact parity
//! shards held) to the recovery leader (rank 0). The leader picks the newest
//! committed generation of which every rank's piece survives somewhere or can
//! be rebuilt by the store (from its group's parity, 003 §5) and tells each
//! rank who holds its piece (or to rebuild it) and whether its redundancy
//! survived. Each rank fetches or rebuilds its piece, re-creates its lost
//! redundancy if needed (so a replacement is protected again), and reports
//! `Ready`; the leader then sends `Go` and every rank
//! restarts its rank function from that generation. A failure during any of
//! this starts a new recovery in the new epoch (frames of the old epoch are
//! dropped by the engine).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::{Action, Control, Event, Protocol, ProtocolCx};
use crate::store::Inventory;
use crate::{Error, Rank};

/// The root of the tree: coordinator of checkpoints, leader of recoveries.
const LEADER: Rank = 0;

/// Fan-out of the reduction tree.
const FANOUT: usize = 4;

fn parent(r: Rank) -> Option<Rank> {
    (r > 0).then(|| (r - 1) / FANOUT)
}

fn children(r: Rank, size: usize) -> impl Iterator<Item = Rank> {
    (FANOUT * r + 1..=FANOUT * r + FANOUT).filter(move |&c| c < size)
}

fn child_count(r: Rank, size: usize) -> usize {
    children(r, size).count()
}

/// How a coordinated checkpoint is made consistent (003 §3.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CheckpointScheme {
    /// Chosen from the program's synchronisation: Locks first, then Gsync
    /// while every rank checkpoints right after a GSYNC.
    #[default]
    Auto,
    /// Capture at once; the cut is checked when the pieces are stored and
    /// abandoned (checkpointed again by Locks) if a message or an access
    /// crossed it.
    Gsync,
    /// Flush, barrier (the counting rounds), capture.
    Locks,
}

impl CheckpointScheme {
    /// Every scheme, as the command line names them.
    pub const ALL: [CheckpointScheme; 3] = [
        CheckpointScheme::Auto,
        CheckpointScheme::Gsync,
        CheckpointScheme::Locks,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            CheckpointScheme::Auto => "auto",
            CheckpointScheme::Gsync => "gsync",
            CheckpointScheme::Locks => "locks",
        }
    }
}

impl std::str::FromStr for CheckpointScheme {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| format!("`{s}` is not one of auto, gsync, locks"))
    }
}

/// What a subtree's captures say about the cut (`Control::Stored`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Tally {
    /// Application messages sent, as of each rank's safe point.
    pub sent: u64,
    /// Application messages arrived, as of each rank's safe point.
    pub arrived: u64,
    /// Ranks whose safe point did not follow a GSYNC directly.
    pub outside_gsync: u64,
}

impl Tally {
    fn add(&mut self, o: Tally) {
        self.sent += o.sent;
        self.arrived += o.arrived;
        self.outside_gsync += o.outside_gsync;
    }

    /// Whether pieces captured without a barrier form a consistent cut: no
    /// message is in transit (arrivals never exceed sends, and no rank
    /// sends between its capture and the commit), and every rank captured
    /// right after the same GSYNC, before any access of its own.
    fn gsync_cut_holds(&self) -> bool {
        self.sent == self.arrived && self.outside_gsync == 0
    }
}

/// Where each piece is, from the inventories (leader only).
#[derive(Debug, Default)]
struct Recovery {
    reported: usize,
    newest_commit: Option<u64>,
    /// What every rank holds.
    inv: Inventory,
    decided: Option<Option<u64>>,
    replicate: bool,
    ready: usize,
}

/// Per-generation sums received from children.
#[derive(Debug, Default, Clone, Copy)]
struct Sums {
    reports: usize,
    sent: u64,
    arrived: u64,
}

/// State of the coordinated protocol on one rank.
#[derive(Debug)]
pub struct Coordinated {
    /// Safe points between checkpoints (agreed: set by the root's commit).
    every: u64,
    /// Safe points since the last checkpoint (or restore).
    since_last: u64,
    /// With Daly's interval: the MTBF, seconds.
    mtbf_s: Option<f64>,
    /// Root: when the current checkpoint began and the previous one ended.
    started_at: Option<std::time::Duration>,
    last_end: std::time::Duration,
    next_generation: u64,
    /// Generation this rank is saving, if any.
    saving: Option<u64>,
    /// Current silence-detection round and whether this rank reported in it.
    round: u32,
    reported: bool,
    /// Counts from children per (generation, round); they may arrive before
    /// this rank reaches its own safe point.
    counts: BTreeMap<(u64, u32), Sums>,
    /// Children whose subtree is stored, per generation, and their tally.
    stored_children: BTreeMap<u64, (usize, Tally)>,
    /// This rank's tally at the safe point of the generation it saves.
    own_tally: Tally,
    /// The scheme asked for.
    configured: CheckpointScheme,
    /// The scheme of the next checkpoint (agreed: set by the root's
    /// commit; never `Auto`).
    scheme: CheckpointScheme,
    /// Root: a Gsync cut was abandoned, so the program is not one that
    /// only synchronises with GSYNCs; `Auto` stays with Locks.
    gsync_refuted: bool,
    /// Whether this instance takes the checkpoints at safe points (and
    /// reports their schemes); not inside `chandy-lamport`, which only
    /// borrows its commit and recovery.
    schemes: bool,
    /// Generations whose piece this rank has stored and not yet seen
    /// commit (one under blocking checkpoints; under `chandy-lamport` a
    /// rank may store the next before the previous commits).
    own_stored: BTreeSet<u64>,
    recovery: Option<Recovery>,
}

impl Coordinated {
    /// Checkpoint at every `every`-th safe point (0 disables checkpoints).
    pub fn new(every: u64) -> Self {
        Coordinated {
            every,
            since_last: 0,
            mtbf_s: None,
            started_at: None,
            last_end: std::time::Duration::ZERO,
            next_generation: 1,
            saving: None,
            round: 0,
            reported: false,
            counts: BTreeMap::new(),
            stored_children: BTreeMap::new(),
            own_tally: Tally::default(),
            configured: CheckpointScheme::Auto,
            scheme: CheckpointScheme::Locks,
            gsync_refuted: false,
            schemes: true,
            own_stored: BTreeSet::new(),
            recovery: None,
        }
    }

    /// The commit and recovery of generations that another protocol
    /// records (`chandy-lamport`): no scheme is chosen or reported.
    pub fn for_recorded_snapshots(every: u64) -> Self {
        Coordinated {
            schemes: false,
            ..Self::new(every)
        }
    }

    /// Coordinate checkpoints by this scheme (003 §3.1.2).
    pub fn with_scheme(mut self, scheme: CheckpointScheme) -> Self {
        self.configured = scheme;
        self.scheme = Self::first_scheme(scheme);
        self
    }

    /// The scheme of the first checkpoint (and the first after a
    /// recovery, which a replacement must agree on without a message).
    fn first_scheme(configured: CheckpointScheme) -> CheckpointScheme {
        match configured {
            CheckpointScheme::Gsync => CheckpointScheme::Gsync,
            CheckpointScheme::Auto | CheckpointScheme::Locks => CheckpointScheme::Locks,
        }
    }

    /// Root, at commit: the next checkpoint's scheme, from what every rank
    /// reported of its synchronisation.
    fn next_scheme(&self, t: Tally) -> CheckpointScheme {
        if !self.schemes {
            return CheckpointScheme::Locks;
        }
        match self.configured {
            CheckpointScheme::Auto if t.outside_gsync == 0 && !self.gsync_refuted => {
                CheckpointScheme::Gsync
            }
            CheckpointScheme::Auto => CheckpointScheme::Locks,
            c => c,
        }
    }

    /// Follow Daly's interval (003 §6.1) for this MTBF: after each
    /// checkpoint the root measures its cost and the time per safe point,
    /// and sets the number of safe points between checkpoints to the
    /// optimum, which travels to every rank with the commit record.
    pub fn with_daly(mut self, mtbf_s: Option<f64>) -> Self {
        self.mtbf_s = mtbf_s.filter(|m| m.is_finite() && *m > 0.0);
        self
    }

    /// Root, at commit: Daly's interval in safe points.
    fn daly_every(&mut self, cx: &mut ProtocolCx<'_>) -> u64 {
        let (Some(mtbf), Some(start)) = (self.mtbf_s, self.started_at) else {
            return self.every;
        };
        let cost = (cx.now().saturating_sub(start)).as_secs_f64().max(1e-9);
        let per_safe_point =
            (start.saturating_sub(self.last_end)).as_secs_f64() / self.every.max(1) as f64;
        let Ok(tau) = crate::tools::model::daly_interval(cost, mtbf) else {
            return self.every;
        };
        let every = if per_safe_point > 0.0 {
            (tau / per_safe_point).round().clamp(1.0, 1e9) as u64
        } else {
            self.every
        };
        cx.emit(Action::Record(crate::driver::Stat::Interval {
            every,
            tau_s: tau,
            cost_s: cost,
        }));
        every
    }

    fn send_down(&self, msg: &Control, cx: &mut ProtocolCx<'_>) {
        for c in children(cx.rank, cx.size) {
            cx.emit(Action::Transmit {
                dest: c,
                msg: msg.clone(),
            });
        }
    }

    /// Report this subtree's counts once every child reported in this round.
    fn try_report(&mut self, cx: &mut ProtocolCx<'_>) {
        let Some(g) = self.saving else { return };
        if self.reported {
            return;
        }
        let sums = self
            .counts
            .get(&(g, self.round))
            .copied()
            .unwrap_or_default();
        if sums.reports < child_count(cx.rank, cx.size) {
            return;
        }
        self.reported = true;
        self.counts.remove(&(g, self.round));
        let sent = sums.sent + cx.app_sent;
        let arrived = sums.arrived + cx.app_arrived;
        match parent(cx.rank) {
            Some(p) => cx.emit(Action::Transmit {
                dest: p,
                msg: Control::Count {
                    generation: g,
                    round: self.round,
                    sent,
                    arrived,
                },
            }),
            None if sent == arrived => self.on_silent(g, cx),
            // A root without children (a one-rank job) counts only itself:
            // its next round starts when a `Recount` to itself arrives, after
            // the messages it sent itself before it (the channel to self is
            // FIFO), rather than again at once with the same counts.
            None if child_count(cx.rank, cx.size) == 0 => cx.emit(Action::Transmit {
                dest: cx.rank,
                msg: Control::Recount {
                    generation: g,
                    round: self.round + 1,
                },
            }),
            None => self.on_recount(g, self.round + 1, cx),
        }
    }

    fn on_recount(&mut self, generation: u64, round: u32, cx: &mut ProtocolCx<'_>) {
        if self.saving != Some(generation) {
            return;
        }
        self.send_down(&Control::Recount { generation, round }, cx);
        self.round = round;
        self.reported = false;
        self.try_report(cx);
    }

    fn on_silent(&mut self, generation: u64, cx: &mut ProtocolCx<'_>) {
        self.send_down(&Control::Silent { generation }, cx);
        cx.emit(Action::Capture { generation });
    }

    /// Report `Stored` up once this rank's piece and all its children's
    /// subtrees are stored; the root commits.
    fn try_stored(&mut self, generation: u64, cx: &mut ProtocolCx<'_>) {
        let (children, mut tally) = self
            .stored_children
            .get(&generation)
            .copied()
            .unwrap_or_default();
        if !self.own_stored.contains(&generation) || children < child_count(cx.rank, cx.size) {
            return;
        }
        self.stored_children.remove(&generation);
        tally.add(self.own_tally);
        match parent(cx.rank) {
            Some(p) => cx.emit(Action::Transmit {
                dest: p,
                msg: Control::Stored { generation, tally },
            }),
            None if self.scheme == CheckpointScheme::Gsync && !tally.gsync_cut_holds() => {
                self.gsync_refuted = true;
                cx.emit(Action::Record(crate::driver::Stat::Coordination {
                    scheme: CheckpointScheme::Gsync,
                    abandoned: true,
                }));
                self.on_abandon(generation, cx);
            }
            None => {
                let every = self.daly_every(cx);
                self.last_end = cx.now();
                if self.schemes {
                    cx.emit(Action::Record(crate::driver::Stat::Coordination {
                        scheme: self.scheme,
                        abandoned: false,
                    }));
                }
                let scheme = self.next_scheme(tally);
                self.on_commit(generation, every, scheme, cx)
            }
        }
    }

    /// Start saving generation `next_generation` at this safe point.
    fn begin(&mut self, cx: &mut ProtocolCx<'_>) {
        let g = self.next_generation;
        self.next_generation += 1;
        self.saving = Some(g);
        self.round = 0;
        self.reported = false;
        self.own_stored.clear();
        match self.scheme {
            CheckpointScheme::Gsync => cx.emit(Action::Capture { generation: g }),
            _ => self.try_report(cx),
        }
    }

    /// The Gsync cut of `generation` does not hold: drop its pieces (every
    /// rank drops those it holds, so no recovery can mistake them for a
    /// checkpoint) and checkpoint again here by the Locks scheme.
    fn on_abandon(&mut self, generation: u64, cx: &mut ProtocolCx<'_>) {
        if self.saving != Some(generation) {
            return;
        }
        self.send_down(&Control::Abandon { generation }, cx);
        cx.emit(Action::Discard { generation });
        self.stored_children.remove(&generation);
        self.scheme = CheckpointScheme::Locks;
        self.begin(cx);
    }

    fn on_commit(
        &mut self,
        generation: u64,
        every: u64,
        scheme: CheckpointScheme,
        cx: &mut ProtocolCx<'_>,
    ) {
        self.every = every;
        self.scheme = scheme;
        self.own_stored.retain(|&g| g > generation);
        self.send_down(
            &Control::Commit {
                generation,
                every,
                scheme,
            },
            cx,
        );
        cx.emit(Action::Commit { generation });
        if self.saving == Some(generation) {
            self.saving = None;
            cx.emit(Action::ReleaseSafePoint);
        }
    }

    /// Leader: choose the generation to restore and tell each rank where
    /// its piece is.
    fn decide(rec: &Recovery, every: u64, cx: &mut ProtocolCx<'_>) -> Vec<(Rank, Control)> {
        // Every generation held somewhere and not newer than the newest
        // commit record was committed (generations commit in order and only
        // the uncommitted newest can be newer); try them newest first.
        let inv = &rec.inv;
        let mut candidates = inv.generations();
        candidates.retain(|&g| rec.newest_commit.is_some_and(|c| g <= c));
        let whole = candidates.into_iter().rev().find(|&g| {
            (0..cx.size).all(|r| !inv.holders(g, r).is_empty() || cx.store.can_rebuild(g, r, inv))
        });
        (0..cx.size)
            .map(|r| {
                let msg = match whole {
                    Some(g) => {
                        let hs = inv.holders(g, r);
                        let holder = if hs.contains(&r) {
                            r
                        } else {
                            hs.iter().copied().min().unwrap_or(r)
                        };
                        Control::Decision {
                            generation: Some(g),
                            holder,
                            rebuild: hs.is_empty(),
                            redundancy_intact: !cx.store.redundancy_lost(g, r, inv),
                            every,
                        }
                    }
                    // No committed generation survives whole: restart from
                    // the beginning (a valid, if costly, rollback).
                    None => Control::Decision {
                        generation: None,
                        holder: r,
                        rebuild: false,
                        redundancy_intact: true,
                        every,
                    },
                };
                (r, msg)
            })
            .collect()
    }

    fn ready(&mut self, cx: &mut ProtocolCx<'_>) {
        cx.emit(Action::Transmit {
            dest: LEADER,
            msg: Control::Ready,
        });
    }

    fn on_control(&mut self, src: Rank, msg: Control, cx: &mut ProtocolCx<'_>) {
        match msg {
            Control::Count {
                generation,
                round,
                sent,
                arrived,
            } => {
                let s = self.counts.entry((generation, round)).or_default();
                s.reports += 1;
                s.sent += sent;
                s.arrived += arrived;
                if self.saving == Some(generation) && self.round == round {
                    self.try_report(cx);
                }
            }
            Control::Recount { generation, round } => self.on_recount(generation, round, cx),
            Control::Silent { generation } => {
                if self.saving == Some(generation) {
                    self.on_silent(generation, cx);
                }
            }
            Control::Stored { generation, tally } => {
                let (n, t) = self.stored_children.entry(generation).or_default();
                *n += 1;
                t.add(tally);
                self.try_stored(generation, cx);
            }
            Control::Commit {
                generation,
                every,
                scheme,
            } => self.on_commit(generation, every, scheme, cx),
            Control::Abandon { generation } => self.on_abandon(generation, cx),
            Control::Marker { .. }
            | Control::Wave { .. }
            | Control::Log(_)
            | Control::Collective(_)
            | Control::Access(_)
            | Control::Set(_) => {}
            Control::Inventory {
                committed,
                held,
                parity,
            } => {
                let Some(rec) = self.recovery.as_mut() else {
                    return;
                };
                rec.reported += 1;
                rec.newest_commit = rec.newest_commit.max(committed);
                rec.inv.add(src, &held, &parity);
                if rec.reported == cx.size {
                    for (dest, d) in Self::decide(rec, self.every, cx) {
                        if dest == cx.rank {
                            self.on_control(cx.rank, d, cx);
                        } else {
                            cx.emit(Action::Transmit { dest, msg: d });
                        }
                    }
                }
            }
            Control::Decision {
                generation,
                holder,
                rebuild,
                redundancy_intact,
                every,
            } => {
                let Some(rec) = self.recovery.as_mut() else {
                    return;
                };
                // Everyone resumes right after the restored checkpoint, with
                // the leader's interval (a replacement has no other source).
                self.every = every;
                self.scheme = Self::first_scheme(self.configured);
                self.since_last = 0;
                rec.decided = Some(generation);
                rec.replicate = !redundancy_intact;
                self.next_generation = generation.map_or(1, |g| g + 1);
                cx.emit(Action::RetainOnly { keep: generation });
                match generation {
                    Some(g) => {
                        cx.emit(Action::Commit { generation: g });
                        cx.emit(if rebuild {
                            Action::Rebuild { generation: g }
                        } else {
                            Action::Fetch {
                                generation: g,
                                holder,
                            }
                        });
                    }
                    None => self.ready(cx),
                }
            }
            Control::Ready => {
                let Some(rec) = self.recovery.as_mut() else {
                    return;
                };
                rec.ready += 1;
                if rec.ready == cx.size {
                    cx.broadcast(&Control::Go);
                    self.on_control(cx.rank, Control::Go, cx);
                }
            }
            Control::Go => {
                self.last_end = cx.now();
                if let Some(rec) = self.recovery.take() {
                    cx.emit(Action::Resume {
                        generation: rec.decided.flatten(),
                    });
                }
            }
        }
    }
}

impl Protocol for Coordinated {
    fn name(&self) -> &'static str {
        "coordinated"
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::SafePoint { .. } => {
                self.since_last += 1;
                if self.every == 0 || self.since_last < self.every {
                    cx.emit(Action::ReleaseSafePoint);
                    return;
                }
                self.since_last = 0;
                self.started_at = Some(cx.now());
                self.own_tally = Tally {
                    sent: cx.app_sent,
                    arrived: cx.app_arrived,
                    outside_gsync: u64::from(!cx.after_gsync),
                };
                self.begin(cx);
            }
            Event::Control { src, msg } => self.on_control(src, msg, cx),
            Event::PieceStored { generation } => match self.recovery.as_ref() {
                Some(rec) if rec.decided.is_some() => self.ready(cx),
                Some(_) => {}
                None => {
                    self.own_stored.insert(generation);
                    self.try_stored(generation, cx);
                }
            },
            Event::PieceRestored { generation } => {
                let Some(rec) = self.recovery.as_ref() else {
                    return;
                };
                if rec.replicate {
                    cx.emit(Action::Replicate { generation });
                } else {
                    self.ready(cx);
                }
            }
            Event::PeerFailed { epoch, .. } => {
                self.saving = None;
                self.counts.clear();
                self.stored_children.clear();
                self.own_stored.clear();
                self.recovery = None;
                cx.emit(Action::Rollback { epoch });
            }
            Event::Recover { .. } => {
                self.recovery = Some(Recovery::default());
                cx.emit(Action::Transmit {
                    dest: LEADER,
                    msg: Control::Inventory {
                        committed: cx.store.committed(),
                        held: cx.store.held(),
                        parity: cx.store.parity_held(),
                    },
                });
            }
            // The leader chose this holder for the restored generation:
            // there is no other copy to ask.
            Event::PieceFetchFailed { generation, holder } => {
                if self.recovery.is_some() {
                    cx.emit(Action::Fail(Error::CorruptCheckpoint {
                        owner: cx.rank,
                        generation,
                        detail: format!("its copy at rank {holder} could not be fetched"),
                    }));
                }
            }
            Event::AppSend { .. }
            | Event::AppSent { .. }
            | Event::AppArrive { .. }
            | Event::Recorded { .. }
            | Event::AppDeliver { .. }
            | Event::Restored { .. }
            | Event::CollectiveBegin { .. }
            | Event::CollectiveEnd { .. }
            | Event::Access { .. }
            | Event::FenceEnter { .. }
            | Event::Fetched { .. }
            | Event::FenceDone { .. }
            | Event::LockOpen { .. }
            | Event::EpochClosed { .. }
            | Event::Finish => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::partner::PartnerStore;
    use crate::topology::Placement;
    use std::time::Duration;

    struct Harness {
        pl: Placement,
        store: PartnerStore,
        sent: u64,
        arrived: u64,
        after_gsync: bool,
        now: Duration,
    }

    impl Harness {
        fn new(rank: Rank, ranks: usize, nodes: usize) -> Self {
            let pl = Placement::block(ranks, nodes).expect("valid");
            let store = PartnerStore::new(rank, &pl);
            Harness {
                pl,
                store,
                sent: 0,
                arrived: 0,
                after_gsync: false,
                now: Duration::ZERO,
            }
        }

        fn run(&self, p: &mut Coordinated, rank: Rank, ev: Event<'_>) -> Vec<Action> {
            let mut cx = ProtocolCx {
                rank,
                size: self.pl.ranks(),
                placement: &self.pl,
                store: &self.store,
                clock: &|| self.now,
                app_sent: self.sent,
                app_arrived: self.arrived,
                hsr: &BTreeMap::new(),
                ssn_out: &BTreeMap::new(),
                rsn: 0,
                epoch: 0,
                after_gsync: self.after_gsync,
                actions: Vec::new(),
            };
            p.handle(ev, &mut cx);
            cx.actions
        }
    }

    fn count(generation: u64, round: u32, sent: u64, arrived: u64) -> Control {
        Control::Count {
            generation,
            round,
            sent,
            arrived,
        }
    }

    #[test]
    fn tree_shape() {
        assert_eq!(parent(0), None);
        assert_eq!(parent(4), Some(0));
        assert_eq!(parent(5), Some(1));
        assert_eq!(children(1, 7).collect::<Vec<_>>(), vec![5, 6]);
        // Every rank but the root has exactly one parent that lists it.
        for size in 1..40 {
            for r in 1..size {
                let p = parent(r).expect("non-root");
                assert!(children(p, size).any(|c| c == r));
            }
        }
    }

    #[test]
    fn interior_rank_reports_subtree_counts_then_captures_and_commits() {
        // 7 ranks: rank 1's children are 5 and 6.
        let mut h = Harness::new(1, 7, 1);
        h.sent = 3;
        h.arrived = 2;
        let mut p = Coordinated::new(2);
        assert_eq!(
            h.run(&mut p, 1, Event::SafePoint { index: 1 }),
            vec![Action::ReleaseSafePoint]
        );
        // A child's count may arrive before our own safe point.
        let a = h.run(
            &mut p,
            1,
            Event::Control {
                src: 5,
                msg: count(1, 0, 1, 1),
            },
        );
        assert!(a.is_empty());
        assert!(h.run(&mut p, 1, Event::SafePoint { index: 2 }).is_empty());
        let a = h.run(
            &mut p,
            1,
            Event::Control {
                src: 6,
                msg: count(1, 0, 0, 2),
            },
        );
        assert_eq!(
            a,
            vec![Action::Transmit {
                dest: 0,
                msg: count(1, 0, 4, 5)
            }]
        );
        // The root saw unequal totals: recount; our counts changed meanwhile.
        h.arrived = 3;
        let a = h.run(
            &mut p,
            1,
            Event::Control {
                src: 0,
                msg: Control::Recount {
                    generation: 1,
                    round: 1,
                },
            },
        );
        let recount = |dest| Action::Transmit {
            dest,
            msg: Control::Recount {
                generation: 1,
                round: 1,
            },
        };
        assert_eq!(
            a,
            vec![recount(5), recount(6)],
            "recount forwarded to both children"
        );
        h.run(
            &mut p,
            1,
            Event::Control {
                src: 5,
                msg: count(1, 1, 1, 1),
            },
        );
        let a = h.run(
            &mut p,
            1,
            Event::Control {
                src: 6,
                msg: count(1, 1, 0, 0),
            },
        );
        assert_eq!(
            a,
            vec![Action::Transmit {
                dest: 0,
                msg: count(1, 1, 4, 4)
            }]
        );
        let a = h.run(
            &mut p,
            1,
            Event::Control {
                src: 0,
                msg: Control::Silent { generation: 1 },
            },
        );
        assert_eq!(a.last(), Some(&Action::Capture { generation: 1 }));
        assert!(
            h.run(&mut p, 1, Event::PieceStored { generation: 1 })
                .is_empty()
        );
        h.run(
            &mut p,
            1,
            Event::Control {
                src: 5,
                msg: Control::Stored {
                    generation: 1,
                    tally: Tally::default(),
                },
            },
        );
        let a = h.run(
            &mut p,
            1,
            Event::Control {
                src: 6,
                msg: Control::Stored {
                    generation: 1,
                    tally: Tally::default(),
                },
            },
        );
        assert_eq!(
            a,
            vec![Action::Transmit {
                dest: 0,
                // Its own counts at the safe point, and not after a GSYNC.
                msg: Control::Stored {
                    generation: 1,
                    tally: Tally {
                        sent: 3,
                        arrived: 2,
                        outside_gsync: 1,
                    },
                }
            }]
        );
        let a = h.run(
            &mut p,
            1,
            Event::Control {
                src: 0,
                msg: Control::Commit {
                    generation: 1,
                    every: 2,
                    scheme: CheckpointScheme::Locks,
                },
            },
        );
        assert_eq!(
            a[a.len() - 2..],
            [Action::Commit { generation: 1 }, Action::ReleaseSafePoint]
        );
    }

    #[test]
    fn root_alone_checks_its_own_counts() {
        let mut h = Harness::new(0, 1, 1);
        let mut p = Coordinated::new(1);
        h.sent = 2;
        h.arrived = 2;
        let a = h.run(&mut p, 0, Event::SafePoint { index: 1 });
        assert_eq!(a, vec![Action::Capture { generation: 1 }]);
        let a = h.run(&mut p, 0, Event::PieceStored { generation: 1 });
        assert_eq!(
            a,
            vec![
                coordination(CheckpointScheme::Locks, false),
                Action::Commit { generation: 1 },
                Action::ReleaseSafePoint
            ]
        );
    }

    fn coordination(scheme: CheckpointScheme, abandoned: bool) -> Action {
        Action::Record(crate::driver::Stat::Coordination { scheme, abandoned })
    }

    /// Root of ranks 0..4 (children 1, 2, 3): the messages it sends.
    fn sent_down(a: &[Action]) -> Vec<(Rank, Control)> {
        a.iter()
            .filter_map(|a| match a {
                Action::Transmit { dest, msg } => Some((*dest, msg.clone())),
                _ => None,
            })
            .collect()
    }

    fn stored(generation: u64, sent: u64, arrived: u64, outside_gsync: u64) -> Control {
        Control::Stored {
            generation,
            tally: Tally {
                sent,
                arrived,
                outside_gsync,
            },
        }
    }

    /// Root of ranks 0..4: `msg(c)` from each child `c` in turn; the
    /// actions after the last.
    fn from_children(
        h: &Harness,
        p: &mut Coordinated,
        msg: impl Fn(Rank) -> Control,
    ) -> Vec<Action> {
        let mut a = Vec::new();
        for src in 1..4 {
            a = h.run(p, 0, Event::Control { src, msg: msg(src) });
        }
        a
    }

    /// 003 §3.1.2, chosen from the program's synchronisation: the first
    /// checkpoint has its barrier (Locks); every rank reports it was right
    /// after a GSYNC, so the next one is captured at once with no message
    /// before it (Gsync), and commits when its cut holds.
    #[test]
    fn auto_moves_to_gsync_when_every_rank_checkpoints_after_a_gsync() {
        let mut h = Harness::new(0, 4, 1);
        let mut p = Coordinated::new(1);
        h.after_gsync = true;
        // Locks: the counting round (the barrier) comes first.
        assert!(h.run(&mut p, 0, Event::SafePoint { index: 1 }).is_empty());
        let a = from_children(&h, &mut p, |_| count(1, 0, 0, 0));
        assert_eq!(a.last(), Some(&Action::Capture { generation: 1 }));
        h.run(&mut p, 0, Event::PieceStored { generation: 1 });
        let a = from_children(&h, &mut p, |_| stored(1, 0, 0, 0));
        assert_eq!(a[0], coordination(CheckpointScheme::Locks, false));
        assert!(sent_down(&a).iter().all(|(_, m)| *m
            == Control::Commit {
                generation: 1,
                every: 1,
                scheme: CheckpointScheme::Gsync
            }));
        // Gsync: captured at once.
        assert_eq!(
            h.run(&mut p, 0, Event::SafePoint { index: 2 }),
            vec![Action::Capture { generation: 2 }]
        );
        h.run(&mut p, 0, Event::PieceStored { generation: 2 });
        let a = from_children(&h, &mut p, |_| stored(2, 5, 5, 0));
        assert_eq!(a[0], coordination(CheckpointScheme::Gsync, false));
        assert!(a.contains(&Action::Commit { generation: 2 }));
    }

    /// A Gsync cut that a message crossed (a child's subtree sent one that
    /// had not arrived at its capture) is never committed: the root tells
    /// every rank to drop it and checkpoints again by Locks, and stays
    /// with Locks under `Auto`.
    #[test]
    fn a_gsync_cut_crossed_by_a_message_is_abandoned_and_taken_again_after_a_barrier() {
        let mut h = Harness::new(0, 4, 1);
        let mut p = Coordinated::new(1).with_scheme(CheckpointScheme::Gsync);
        h.after_gsync = true;
        assert_eq!(
            h.run(&mut p, 0, Event::SafePoint { index: 1 }),
            vec![Action::Capture { generation: 1 }]
        );
        h.run(&mut p, 0, Event::PieceStored { generation: 1 });
        // Child 1's subtree sent a message not arrived at its capture.
        let a = from_children(&h, &mut p, |c| stored(1, u64::from(c == 1), 0, 0));
        assert_eq!(a[0], coordination(CheckpointScheme::Gsync, true));
        assert!(!a.iter().any(|a| matches!(a, Action::Commit { .. })));
        assert_eq!(
            sent_down(&a),
            (1..4)
                .map(|c| (c, Control::Abandon { generation: 1 }))
                .collect::<Vec<_>>()
        );
        assert!(a.contains(&Action::Discard { generation: 1 }));
        // Generation 2 at the same safe point, after the counting round.
        assert!(!a.iter().any(|a| matches!(a, Action::Capture { .. })));
        // (Child 2's subtree has the message now.)
        let a = from_children(&h, &mut p, |c| {
            count(2, 0, u64::from(c == 1), u64::from(c == 2))
        });
        assert_eq!(a.last(), Some(&Action::Capture { generation: 2 }));
        // A cut that a GSYNC did not precede on one rank is abandoned too.
        let mut p = Coordinated::new(1).with_scheme(CheckpointScheme::Gsync);
        h.run(&mut p, 0, Event::SafePoint { index: 1 });
        h.run(&mut p, 0, Event::PieceStored { generation: 1 });
        let a = from_children(&h, &mut p, |c| stored(1, 0, 0, u64::from(c == 3)));
        assert_eq!(a[0], coordination(CheckpointScheme::Gsync, true));
    }

    /// A rank told to abandon drops the pieces it holds of that generation
    /// and joins the counting round of the next at the same safe point.
    #[test]
    fn an_abandoned_generation_is_dropped_and_counted_again() {
        let mut h = Harness::new(2, 4, 1);
        let mut p = Coordinated::new(1).with_scheme(CheckpointScheme::Gsync);
        h.after_gsync = true;
        h.sent = 3;
        h.arrived = 2;
        assert_eq!(
            h.run(&mut p, 2, Event::SafePoint { index: 1 }),
            vec![Action::Capture { generation: 1 }]
        );
        let a = h.run(&mut p, 2, Event::PieceStored { generation: 1 });
        assert_eq!(sent_down(&a), vec![(0, stored(1, 3, 2, 0))]);
        h.arrived = 3;
        let a = h.run(
            &mut p,
            2,
            Event::Control {
                src: 0,
                msg: Control::Abandon { generation: 1 },
            },
        );
        assert_eq!(
            a,
            vec![
                Action::Discard { generation: 1 },
                Action::Transmit {
                    dest: 0,
                    msg: count(2, 0, 3, 3)
                }
            ]
        );
    }

    /// Alone with a message to itself still on its way: it counts again when
    /// its own `Recount` arrives (after that message), not in a loop.
    #[test]
    fn root_alone_waits_for_its_message_to_itself() {
        let mut h = Harness::new(0, 1, 1);
        let mut p = Coordinated::new(1);
        h.sent = 3;
        h.arrived = 2;
        let recount = |round| Action::Transmit {
            dest: 0,
            msg: Control::Recount {
                generation: 1,
                round,
            },
        };
        let a = h.run(&mut p, 0, Event::SafePoint { index: 1 });
        assert_eq!(a, vec![recount(1)]);
        // Its recount came back before the message: again.
        let msg = Control::Recount {
            generation: 1,
            round: 1,
        };
        let a = h.run(&mut p, 0, Event::Control { src: 0, msg });
        assert_eq!(a, vec![recount(2)]);
        h.arrived = 3;
        let msg = Control::Recount {
            generation: 1,
            round: 2,
        };
        let a = h.run(&mut p, 0, Event::Control { src: 0, msg });
        assert_eq!(a, vec![Action::Capture { generation: 1 }]);
    }

    #[test]
    fn daly_interval_is_measured_at_the_root_and_used() {
        let mut h = Harness::new(0, 1, 1);
        let mut p = Coordinated::new(1).with_daly(Some(100.0));
        // One safe point took 10 ms; the checkpoint then costs 2 ms.
        h.now = Duration::from_millis(10);
        assert_eq!(
            h.run(&mut p, 0, Event::SafePoint { index: 1 }),
            vec![Action::Capture { generation: 1 }]
        );
        h.now = Duration::from_millis(12);
        let a = h.run(&mut p, 0, Event::PieceStored { generation: 1 });
        let tau = crate::tools::model::daly_interval(0.002, 100.0).expect("valid");
        let every = (tau / 0.010).round() as u64;
        assert_eq!(every, 63, "tau {tau}");
        assert!(
            matches!(
                a.first(),
                Some(Action::Record(crate::driver::Stat::Interval {
                    every: 63,
                    ..
                }))
            ),
            "{a:?}"
        );
        assert!(a.contains(&Action::Commit { generation: 1 }));
        // The next 62 safe points pass; the 63rd checkpoints.
        for i in 2..=63 {
            assert_eq!(
                h.run(&mut p, 0, Event::SafePoint { index: i }),
                vec![Action::ReleaseSafePoint]
            );
        }
        assert_eq!(
            h.run(&mut p, 0, Event::SafePoint { index: 64 }),
            vec![Action::Capture { generation: 2 }]
        );
    }

    #[test]
    fn leader_picks_newest_complete_generation() {
        // Rank 3 died (its replacement holds nothing); its partner is rank 1.
        // Generation 2 is committed at ranks 0 and 1; rank 2 had not seen it.
        let h = Harness::new(0, 4, 2);
        let mut cx = ProtocolCx {
            rank: 0,
            size: 4,
            placement: &h.pl,
            store: &h.store,
            clock: &|| Duration::ZERO,
            app_sent: 0,
            app_arrived: 0,
            hsr: &BTreeMap::new(),
            ssn_out: &BTreeMap::new(),
            rsn: 0,
            epoch: 0,
            after_gsync: false,
            actions: Vec::new(),
        };
        let mut rec = Recovery::default();
        let inv = [
            (0, Some(2), vec![(2, 0), (2, 2)]),
            (1, Some(2), vec![(2, 1), (2, 3)]),
            (2, Some(1), vec![(1, 2), (2, 2), (2, 0)]),
            (3, None, vec![]),
        ];
        for (src, c, held) in inv {
            rec.newest_commit = rec.newest_commit.max(c);
            rec.inv.add(src, &held, &[]);
        }
        let d = Coordinated::decide(&rec, 3, &mut cx);
        let expect = |holder, redundancy_intact| Control::Decision {
            generation: Some(2),
            holder,
            rebuild: false,
            redundancy_intact,
            every: 3,
        };
        assert_eq!(
            d,
            vec![
                (0, expect(0, true)),
                (1, expect(1, false)),
                (2, expect(2, true)),
                (3, expect(1, true)),
            ]
        );
        // Lose rank 3's copy of generation 2, but an older committed
        // generation survives whole (on disk, say): fall back to it.
        rec.inv.pieces.remove(&(2, 3));
        for r in 0..4 {
            rec.inv.add(r, &[(1, r)], &[]);
        }
        let d = Coordinated::decide(&rec, 3, &mut cx);
        assert!(
            d.iter().all(|(_, m)| matches!(
                m,
                Control::Decision {
                    generation: Some(1),
                    ..
                }
            )),
            "{d:?}"
        );
        // Nothing complete at all: restart from scratch.
        for r in 0..4 {
            rec.inv.pieces.remove(&(1, r));
        }
        let d = Coordinated::decide(&rec, 3, &mut cx);
        assert!(d.iter().all(|(_, m)| matches!(
            m,
            Control::Decision {
                generation: None,
                ..
            }
        )));
    }
}
