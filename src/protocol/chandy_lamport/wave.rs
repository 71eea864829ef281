//! 000 §IV: the snapshot wave over one-sided communication, with the fixes
//! for the GET that straddles it (`--get-fix`).
//!
//! Rank 0 initiates generation `g` at its safe point `g × every`; every other
//! rank enters the wave at the first marker of `g` that reaches it, wherever
//! it is (waiting for a GET, computing, in a collective): that is where the
//! paper's cut lies. Entering, a rank sends a marker on each of its n − 1
//! outgoing channels. Its **cut** is where it passes the generation:
//!
//! | fix | enters | cuts |
//! | --- | --- | --- |
//! | `vanilla` | at once | on entering |
//! | `delay` (§IV-A) | once no GET is pending to a target whose marker has not arrived (its reply may be in transit: Fig. 3) | on entering |
//! | `peek-and-get` (§IV-B) | once no GET is pending (the GET is atomic with respect to the cut); a target that has entered refuses a request from an origin that has not, which then enters and issues it again | on entering |
//! | `double-barrier` (§IV-C) | at once | when the second wave is complete: a rank sends its n − 1 second markers once every first marker is in (and every request it received is answered) |
//! | `partial-double-barrier` (§IV-C) | at once | when every first marker is in and every flush is answered: a rank whose GET to a target is pending when that target's marker arrives (request and marker crossed) sends that target a flush marker, answered once the target has answered every request it received from it (3 markers per pair, 2g in all) |
//!
//! Under the double barriers a rank initiates no communication between
//! entering and cutting (000 §IV-C: "the source process cannot initiate any
//! communication during the checkpoint wave"); its sends wait
//! ([`super::ChandyLamport::may_initiate`]). A message that arrives after
//! its sender's marker at a rank that has not cut yet was sent after the
//! sender's cut: it is held until this rank cuts (as the recorded snapshot
//! holds its own, [`super`]). Under the double barriers a reply is not held:
//! its sender served it before its own cut.
//!
//! One-sided requests and replies are served and landed by the engine as
//! they arrive, like a NIC's, and are not recorded as channel state: the
//! problem 000 solves. Every leg and operation is stamped with the cuts its
//! rank has passed, for [`crate::cuts::check`].
//!
//! The wave is measured beside the snapshot a rank records at its safe
//! point (what recovery restores, [`super`]): a restartable rank function
//! has a state to record only at a safe point, and the wave's cuts lie
//! between them. It runs until the first failure (the restored execution's
//! cuts would mix incarnations).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

use super::super::{Action, Control, ProtocolCx};
use crate::Rank;
use crate::cuts::{CutLog, LegKind, Operation, ReceivedLeg, SentLeg, WaveCounts};
use crate::driver::Stat;
use crate::engine::frame::AppMessage;
use crate::engine::{is_refusal, leg_kind};

/// The fixes of 000 §IV for a GET that straddles the snapshot wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum GetFix {
    /// Chandy–Lamport as for two-sided communication.
    Vanilla,
    /// A rank does not enter the wave while a GET whose reply may be in
    /// transit is pending (§IV-A).
    Delay,
    /// Atomic check for a pending marker with the GET (§IV-B).
    PeekAndGet,
    /// A second full flooding wave (§IV-C): n(n − 1) more markers.
    DoubleBarrier,
    /// Flush only the channels of GETs the first wave met (§IV-C): 2g more
    /// markers.
    PartialDoubleBarrier,
}

impl GetFix {
    /// Every fix, in the paper's order.
    pub const ALL: [GetFix; 5] = [
        GetFix::Vanilla,
        GetFix::Delay,
        GetFix::PeekAndGet,
        GetFix::DoubleBarrier,
        GetFix::PartialDoubleBarrier,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            GetFix::Vanilla => "vanilla",
            GetFix::Delay => "delay",
            GetFix::PeekAndGet => "peek-and-get",
            GetFix::DoubleBarrier => "double-barrier",
            GetFix::PartialDoubleBarrier => "partial-double-barrier",
        }
    }

    /// Whether 000 Table I says its cut is never crossed.
    pub fn never_crossed(self) -> bool {
        self != GetFix::Vanilla
    }

    /// Whether 000 Table I says its cut is never overlapped.
    pub fn never_overlapped(self) -> bool {
        !matches!(self, GetFix::Vanilla | GetFix::Delay)
    }

    /// Whether a rank cuts only after the wave has flushed channels, and
    /// initiates nothing meanwhile.
    fn flushes(self) -> bool {
        matches!(self, GetFix::DoubleBarrier | GetFix::PartialDoubleBarrier)
    }
}

impl std::str::FromStr for GetFix {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        GetFix::ALL
            .into_iter()
            .find(|f| f.name() == s)
            .ok_or_else(|| {
                let names: Vec<&str> = GetFix::ALL.iter().map(|f| f.name()).collect();
                format!("unknown get() fix {s:?}; one of {}", names.join(", "))
            })
    }
}

/// The markers of the wave.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WaveMarker {
    /// The first wave: n − 1 from each rank as it enters.
    First,
    /// The double barrier's second wave.
    Second,
    /// Partial double barrier: "flush the channel of my pending GET".
    Flush,
    /// Its answer.
    FlushAnswer,
}

/// How the wave runs (`Config::get_fix`, `check_cuts`, `wave_interval`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WaveConfig {
    /// The `get()` fix.
    pub fix: GetFix,
    /// Keep every stamp for the checker.
    pub check: bool,
    /// Rank 0 initiates a generation whenever this much driver time has
    /// passed since the last (at its next communication: wherever the
    /// application is), instead of at its checkpoints' safe points.
    pub interval: Option<std::time::Duration>,
    /// Safe points the application passes, if known: rank 0 initiates no
    /// generation after its last, so that every generation completes
    /// before the final collective (which waits for every rank's cut) and
    /// no rank enters one after reporting its counters.
    pub last_safe_point: Option<u64>,
}

/// One rank's part of the wave.
#[derive(Debug)]
pub struct Wave {
    fix: GetFix,
    /// Keep the stamps for the checker.
    check: bool,
    /// Rank 0's timer ([`WaveConfig::interval`]) and when it next fires.
    interval: Option<std::time::Duration>,
    next_at: std::time::Duration,
    last_safe_point: Option<u64>,
    /// Rank 0: whether it still initiates generations.
    initiating: bool,
    /// Generations cut.
    cuts: u64,
    /// Generation entered (first markers sent).
    entered: u64,
    /// Highest generation this rank was asked to enter.
    due: u64,
    /// Per source, the highest first (and second) marker arrived.
    first_in: BTreeMap<Rank, u64>,
    second_in: BTreeMap<Rank, u64>,
    /// Generation whose second markers this rank sent.
    second_sent: u64,
    /// Targets whose flush answer this rank awaits.
    flushing: BTreeSet<Rank>,
    /// Origins whose flush waits for this rank to answer their requests.
    flush_asked: BTreeSet<Rank>,
    /// Per target, the one-sided operations in flight (their issue
    /// stamps, in issue order: replies come back in that order).
    pending: BTreeMap<Rank, VecDeque<u64>>,
    /// Per origin, requests handed to the engine and not answered yet.
    unanswered: BTreeMap<Rank, u64>,
    /// Legs sent and arrived per channel (their positions).
    sent_on: BTreeMap<Rank, u64>,
    arrived_on: BTreeMap<Rank, u64>,
    log: CutLog,
    counts: WaveCounts,
}

impl Wave {
    /// The wave as `c` says.
    pub fn new(c: WaveConfig) -> Self {
        Wave {
            fix: c.fix,
            check: c.check,
            interval: c.interval,
            next_at: c.interval.unwrap_or_default(),
            last_safe_point: c.last_safe_point,
            initiating: true,
            cuts: 0,
            entered: 0,
            due: 0,
            first_in: BTreeMap::new(),
            second_in: BTreeMap::new(),
            second_sent: 0,
            flushing: BTreeSet::new(),
            flush_asked: BTreeSet::new(),
            pending: BTreeMap::new(),
            unanswered: BTreeMap::new(),
            sent_on: BTreeMap::new(),
            arrived_on: BTreeMap::new(),
            log: CutLog::default(),
            counts: WaveCounts::default(),
        }
    }

    /// Generations cut.
    pub fn cuts(&self) -> u64 {
        self.cuts
    }

    /// Whether the application may start a communication (not between
    /// entering and cutting under the double barriers).
    pub fn may_initiate(&self) -> bool {
        !self.fix.flushes() || self.entered == self.cuts
    }

    /// Peek-and-get: whether a request from `origin` is refused because
    /// this rank has entered a generation `origin` has not (its marker has
    /// not come): served now, it would be read after this rank's cut for
    /// an origin before its own.
    pub fn refuses(&mut self, origin: Rank) -> bool {
        let refuse = self.fix == GetFix::PeekAndGet && self.first(origin) < self.entered;
        if refuse {
            self.counts.refused += 1;
        }
        refuse
    }

    /// Rank 0's safe point `index`: it initiates generation `index /
    /// every` there.
    pub fn safe_point(&mut self, index: u64, every: u64, cx: &mut ProtocolCx<'_>) -> bool {
        if cx.rank == 0
            && self.initiating
            && self.interval.is_none()
            && every > 0
            && index.is_multiple_of(every)
        {
            self.due = self.due.max(index / every);
        }
        if self.last_safe_point.is_some_and(|last| index >= last) {
            self.initiating = false;
        }
        self.advance(cx)
    }

    /// Rank 0 with a timer: initiate a generation if it is time.
    fn tick(&mut self, cx: &ProtocolCx<'_>) {
        if let Some(iv) = self.interval
            && cx.rank == 0
            && self.initiating
            && cx.now() >= self.next_at
        {
            self.due = self.due.max(self.entered + 1);
            self.next_at = cx.now() + iv;
        }
    }

    /// This rank sends `msg` (before it leaves: nothing may be sent here,
    /// it would overtake `msg` on its channel).
    pub fn sent(&mut self, msg: &AppMessage, rank: Rank) {
        let dest = msg.envelope.dest;
        if dest == rank {
            return;
        }
        let index = next(&mut self.sent_on, dest);
        let kind = leg_kind(msg);
        if self.check && !is_refusal(msg) {
            self.log.sent.push(SentLeg {
                dest,
                index,
                cuts: self.cuts,
                kind,
            });
        }
        match kind {
            LegKind::Request => self.pending.entry(dest).or_default().push_back(self.cuts),
            LegKind::Reply => {
                let n = self.unanswered.entry(dest).or_insert(0);
                *n = n.saturating_sub(1);
            }
            LegKind::Message => {}
        }
    }

    /// The message this rank sent to `dest` has left: a flush it owed
    /// `dest` may be answered, a marker may follow it.
    pub fn after_send(&mut self, dest: Rank, cx: &mut ProtocolCx<'_>) -> bool {
        if dest == cx.rank {
            return false;
        }
        if self.unanswered.get(&dest).copied().unwrap_or(0) == 0 && self.flush_asked.remove(&dest) {
            self.send(cx, dest, self.entered, WaveMarker::FlushAnswer);
        }
        self.tick(cx);
        self.advance(cx)
    }

    /// A leg from another rank arrived (before any hold): its position on
    /// its channel, and the generation until whose cut it must be held,
    /// if any.
    pub fn arrived(&mut self, msg: &AppMessage) -> (u64, Option<u64>) {
        let src = msg.envelope.src;
        let index = next(&mut self.arrived_on, src);
        let marked = self.first(src);
        let exempt = is_refusal(msg) || (self.fix.flushes() && leg_kind(msg) == LegKind::Reply);
        (index, (marked > self.cuts && !exempt).then_some(marked))
    }

    /// A leg that arrived as `index` on its channel is handed to this rank
    /// (at once, or released from a hold); whether the wave cut then.
    pub fn received(&mut self, msg: &AppMessage, index: u64, cx: &mut ProtocolCx<'_>) -> bool {
        self.take(msg, index, cx);
        self.advance(cx)
    }

    /// [`Wave::received`] without moving the wave on: for messages released
    /// together, which all come before the next cut.
    pub fn take(&mut self, msg: &AppMessage, index: u64, cx: &mut ProtocolCx<'_>) {
        let src = msg.envelope.src;
        let refusal = is_refusal(msg);
        self.tick(cx);
        if self.check && !refusal {
            self.log.received.push(ReceivedLeg {
                src,
                index,
                cuts: self.cuts,
            });
        }
        match leg_kind(msg) {
            LegKind::Request => *self.unanswered.entry(src).or_insert(0) += 1,
            LegKind::Reply => {
                let issued = self.pending.get_mut(&src).and_then(VecDeque::pop_front);
                if let Some(issued) = issued
                    && self.check
                    && !refusal
                {
                    self.log.operations.push(Operation {
                        target: src,
                        issued,
                        completed: self.cuts,
                    });
                }
            }
            LegKind::Message => {}
        }
    }

    /// A marker of generation `g` from `src`.
    pub fn marker(&mut self, src: Rank, g: u64, kind: WaveMarker, cx: &mut ProtocolCx<'_>) -> bool {
        match kind {
            WaveMarker::First => {
                let f = self.first_in.entry(src).or_insert(0);
                *f = (*f).max(g);
                self.due = self.due.max(g);
                // Partial double barrier: a GET to `src` is pending as its
                // marker arrives, after this rank entered: they crossed.
                if self.entered == g {
                    self.flush_if_crossed(src, cx);
                }
            }
            WaveMarker::Second => {
                let s = self.second_in.entry(src).or_insert(0);
                *s = (*s).max(g);
            }
            WaveMarker::Flush => {
                if self.unanswered.get(&src).copied().unwrap_or(0) == 0 {
                    self.send(cx, src, g, WaveMarker::FlushAnswer);
                } else {
                    self.flush_asked.insert(src);
                }
            }
            WaveMarker::FlushAnswer => {
                self.flushing.remove(&src);
            }
        }
        self.advance(cx)
    }

    /// Enter and cut what can be entered and cut now, one cut at most:
    /// whether a cut was made. After a cut the caller releases what the
    /// cut lets in (held messages come before the next generation's cut:
    /// a request among them must be answered first) and calls again.
    pub fn advance(&mut self, cx: &mut ProtocolCx<'_>) -> bool {
        let before = self.cuts;
        if self.entered == self.cuts && self.due > self.entered && self.may_enter() {
            self.entered += 1;
            let g = self.entered;
            self.counts.generations = g;
            self.counts.first += cx.size.saturating_sub(1) as u64;
            cx.broadcast(&Control::Wave {
                generation: g,
                kind: WaveMarker::First,
            });
            let crossed: Vec<Rank> = (self.first_in.iter())
                .filter(|&(_, &f)| f >= g)
                .map(|(&r, _)| r)
                .collect();
            for t in crossed {
                self.flush_if_crossed(t, cx);
            }
        }
        if self.entered > self.cuts && self.may_cut(cx) {
            self.cuts = self.entered;
        }
        if self.check {
            self.log.cuts = self.cuts;
        }
        self.cuts > before
    }

    fn may_enter(&self) -> bool {
        let g = self.entered + 1;
        let busy = |t: &Rank, q: &VecDeque<u64>| !q.is_empty() && (self.first(*t) < g);
        match self.fix {
            GetFix::Delay => !self.pending.iter().any(|(t, q)| busy(t, q)),
            GetFix::PeekAndGet => self.pending.values().all(VecDeque::is_empty),
            _ => true,
        }
    }

    fn may_cut(&mut self, cx: &mut ProtocolCx<'_>) -> bool {
        let g = self.entered;
        let (rank, size) = (cx.rank, cx.size);
        let all_in = |m: &BTreeMap<Rank, u64>| {
            (0..size).all(|r| r == rank || m.get(&r).is_some_and(|&x| x >= g))
        };
        match self.fix {
            GetFix::Vanilla | GetFix::Delay | GetFix::PeekAndGet => true,
            GetFix::DoubleBarrier => {
                if self.second_sent < g
                    && all_in(&self.first_in)
                    && self.unanswered.values().all(|&n| n == 0)
                {
                    self.second_sent = g;
                    self.counts.second += cx.size.saturating_sub(1) as u64;
                    cx.broadcast(&Control::Wave {
                        generation: g,
                        kind: WaveMarker::Second,
                    });
                }
                self.second_sent == g && all_in(&self.second_in)
            }
            // Every request that came before its origin's marker is served
            // before the cut (a NIC serves on arrival; the engine serves
            // when it makes progress, so the cut waits for it).
            GetFix::PartialDoubleBarrier => {
                all_in(&self.first_in)
                    && self.flushing.is_empty()
                    && self.unanswered.values().all(|&n| n == 0)
            }
        }
    }

    /// Partial double barrier: flush the channel to `target` if a GET to
    /// it is pending (000 §IV-C).
    fn flush_if_crossed(&mut self, target: Rank, cx: &mut ProtocolCx<'_>) {
        if self.fix == GetFix::PartialDoubleBarrier
            && self.pending.get(&target).is_some_and(|q| !q.is_empty())
            && self.flushing.insert(target)
        {
            self.send(cx, target, self.entered, WaveMarker::Flush);
        }
    }

    /// A flush marker or its answer, to `dest`.
    fn send(&mut self, cx: &mut ProtocolCx<'_>, dest: Rank, generation: u64, kind: WaveMarker) {
        if kind == WaveMarker::Flush {
            self.counts.flush += 1;
        } else {
            self.counts.flush_answers += 1;
        }
        cx.emit(Action::Transmit {
            dest,
            msg: Control::Wave { generation, kind },
        });
    }

    fn first(&self, src: Rank) -> u64 {
        self.first_in.get(&src).copied().unwrap_or(0)
    }

    /// Its counters so far.
    pub fn counts(&self) -> WaveCounts {
        self.counts
    }

    /// The counters and stamps, reported when the rank function returns.
    pub fn finish(&mut self, cx: &mut ProtocolCx<'_>) {
        cx.emit(Action::Record(Stat::Wave(std::mem::take(&mut self.counts))));
        if self.check {
            let mut log = std::mem::take(&mut self.log);
            log.rank = cx.rank;
            log.cuts = self.cuts;
            cx.emit(Action::Record(Stat::Cuts(log)));
        }
    }
}

/// The next position on channel `r`.
fn next(counters: &mut BTreeMap<Rank, u64>, r: Rank) -> u64 {
    let n = counters.entry(r).or_insert(0);
    *n += 1;
    *n
}

#[cfg(test)]
mod tests {
    use super::super::ChandyLamport;
    use super::*;
    use crate::engine::frame::Envelope;
    use crate::engine::{RMA_CONTEXT, RMA_REPLY, RMA_REQUEST};
    use crate::protocol::testing::{Harness, app_message};
    use crate::protocol::{Event, Protocol};

    /// Rank 1 of 3 (no checkpoints: only the wave acts).
    fn rank1(fix: GetFix) -> (Harness, ChandyLamport) {
        let cfg = WaveConfig {
            fix,
            check: true,
            interval: None,
            last_safe_point: None,
        };
        (
            Harness::new(1, 3, 1),
            ChandyLamport::with_wave(0, Some(cfg)),
        )
    }

    fn one_sided(src: Rank, dest: Rank, tag: u64, payload: &'static [u8]) -> AppMessage {
        AppMessage {
            envelope: Envelope {
                src,
                dest,
                context: RMA_CONTEXT,
                tag: if tag == 0 { RMA_REQUEST } else { RMA_REPLY },
            },
            ssn: 0,
            payload: bytes::Bytes::from_static(payload),
        }
    }

    fn request(src: Rank, dest: Rank) -> AppMessage {
        one_sided(src, dest, 0, b"r")
    }

    fn reply(src: Rank, dest: Rank) -> AppMessage {
        one_sided(src, dest, 1, b"d")
    }

    fn wave_markers(actions: &[Action], kind: WaveMarker) -> Vec<Rank> {
        (actions.iter())
            .filter_map(|a| match a {
                Action::Transmit {
                    dest,
                    msg: Control::Wave { kind: k, .. },
                } if *k == kind => Some(*dest),
                _ => None,
            })
            .collect()
    }

    fn marker(h: &Harness, p: &mut ChandyLamport, src: Rank, kind: WaveMarker) -> Vec<Action> {
        h.control(
            p,
            src,
            Control::Wave {
                generation: 1,
                kind,
            },
        )
    }

    /// This rank sends `msg` (the engine's two events around it).
    fn send(h: &Harness, p: &mut ChandyLamport, msg: &AppMessage) -> Vec<Action> {
        let mut a = h.run(p, Event::AppSend { msg });
        a.extend(h.run(
            p,
            Event::AppSent {
                dest: msg.envelope.dest,
            },
        ));
        a
    }

    fn arrive(h: &Harness, p: &mut ChandyLamport, msg: &AppMessage) -> Vec<Action> {
        h.run(p, Event::AppArrive { msg })
    }

    fn cuts(p: &ChandyLamport) -> u64 {
        p.wave.as_ref().map_or(0, Wave::cuts)
    }

    #[test]
    fn vanilla_enters_and_cuts_at_the_first_marker() {
        let (h, mut p) = rank1(GetFix::Vanilla);
        send(&h, &mut p, &request(1, 2));
        let a = marker(&h, &mut p, 0, WaveMarker::First);
        // Entered with the GET pending: n − 1 markers, cut at once.
        assert_eq!(wave_markers(&a, WaveMarker::First), vec![0, 2]);
        assert_eq!(cuts(&p), 1);
        assert!(p.may_initiate());
    }

    #[test]
    fn delay_waits_for_a_get_whose_target_has_not_entered() {
        let (h, mut p) = rank1(GetFix::Delay);
        send(&h, &mut p, &request(1, 2));
        let a = marker(&h, &mut p, 0, WaveMarker::First);
        assert!(wave_markers(&a, WaveMarker::First).is_empty(), "{a:?}");
        assert_eq!(cuts(&p), 0);
        // The reply may be in transit (000 Fig. 3): once it is in, enter.
        let a = arrive(&h, &mut p, &reply(2, 1));
        assert_eq!(wave_markers(&a, WaveMarker::First), vec![0, 2]);
        assert_eq!(cuts(&p), 1);
    }

    #[test]
    fn delay_enters_with_a_get_pending_to_a_target_that_entered() {
        let (h, mut p) = rank1(GetFix::Delay);
        send(&h, &mut p, &request(1, 0));
        // The target's own marker: its reply follows it, after its cut.
        let a = marker(&h, &mut p, 0, WaveMarker::First);
        assert_eq!(wave_markers(&a, WaveMarker::First), vec![0, 2]);
        assert_eq!(cuts(&p), 1);
    }

    #[test]
    fn peek_and_get_refuses_an_origin_that_has_not_entered() {
        let (h, mut p) = rank1(GetFix::PeekAndGet);
        marker(&h, &mut p, 0, WaveMarker::First);
        assert_eq!(cuts(&p), 1);
        assert!(p.refuses_request(2), "rank 2's marker has not come");
        assert!(!p.refuses_request(0), "rank 0 entered");
        marker(&h, &mut p, 2, WaveMarker::First);
        assert!(!p.refuses_request(2));
        // A refusal completes the origin's GET without an outcome; the
        // origin enters (no GET pending any more) before issuing it again.
        let (h, mut q) = rank1(GetFix::PeekAndGet);
        send(&h, &mut q, &request(1, 2));
        let a = marker(&h, &mut q, 0, WaveMarker::First);
        assert!(wave_markers(&a, WaveMarker::First).is_empty());
        let a = arrive(&h, &mut q, &one_sided(2, 1, 1, b""));
        assert_eq!(wave_markers(&a, WaveMarker::First), vec![0, 2]);
    }

    #[test]
    fn double_barrier_cuts_after_the_second_wave_and_sends_nothing_meanwhile() {
        let (h, mut p) = rank1(GetFix::DoubleBarrier);
        // A request from rank 2 arrived before its marker, not answered yet.
        arrive(&h, &mut p, &request(2, 1));
        marker(&h, &mut p, 0, WaveMarker::First);
        assert!(!p.may_initiate(), "in the wave");
        let a = marker(&h, &mut p, 2, WaveMarker::First);
        assert!(
            wave_markers(&a, WaveMarker::Second).is_empty(),
            "the request must be answered before the second wave passes"
        );
        let a = send(&h, &mut p, &reply(1, 2));
        assert_eq!(wave_markers(&a, WaveMarker::Second), vec![0, 2]);
        marker(&h, &mut p, 0, WaveMarker::Second);
        assert_eq!(cuts(&p), 0);
        // A message from rank 0 after its markers is held until the cut; a
        // reply is not (its sender served it before its own cut).
        let m = app_message(0, 1, 1, 8);
        let a = arrive(&h, &mut p, &m);
        assert!(a.contains(&Action::Hold), "{a:?}");
        let a = marker(&h, &mut p, 2, WaveMarker::Second);
        assert_eq!(cuts(&p), 1);
        assert!(p.may_initiate());
        assert!(
            a.iter()
                .any(|x| matches!(x, Action::Deliver { msg } if msg == &m))
        );
    }

    #[test]
    fn partial_double_barrier_flushes_the_channel_a_marker_crossed() {
        let (h, mut p) = rank1(GetFix::PartialDoubleBarrier);
        send(&h, &mut p, &request(1, 2));
        marker(&h, &mut p, 0, WaveMarker::First);
        // Rank 2's marker arrives while the GET to it is pending: they
        // crossed. Flush that channel, and only that one.
        let a = marker(&h, &mut p, 2, WaveMarker::First);
        assert_eq!(wave_markers(&a, WaveMarker::Flush), vec![2]);
        assert_eq!(
            cuts(&p),
            0,
            "every first marker is in, the flush is not answered"
        );
        arrive(&h, &mut p, &reply(2, 1));
        marker(&h, &mut p, 2, WaveMarker::FlushAnswer);
        assert_eq!(cuts(&p), 1);
        let c = p.wave.as_ref().map(Wave::counts).unwrap_or_default();
        assert_eq!((c.first, c.flush, c.flush_answers), (2, 1, 0));
    }

    #[test]
    fn a_flush_is_answered_after_the_requests_it_follows() {
        let (h, mut p) = rank1(GetFix::PartialDoubleBarrier);
        arrive(&h, &mut p, &request(0, 1));
        let a = marker(&h, &mut p, 0, WaveMarker::Flush);
        assert!(wave_markers(&a, WaveMarker::FlushAnswer).is_empty());
        let a = send(&h, &mut p, &reply(1, 0));
        assert_eq!(wave_markers(&a, WaveMarker::FlushAnswer), vec![0]);
    }

    #[test]
    fn the_stamps_show_a_get_that_straddles_a_vanilla_cut() {
        let (h, mut p) = rank1(GetFix::Vanilla);
        send(&h, &mut p, &request(1, 2));
        marker(&h, &mut p, 0, WaveMarker::First);
        arrive(&h, &mut p, &reply(2, 1));
        let log = p.wave.as_ref().map(|w| w.log.clone()).unwrap_or_default();
        assert_eq!(
            log.operations,
            vec![Operation {
                target: 2,
                issued: 0,
                completed: 1
            }]
        );
        assert_eq!(log.sent[0].kind, LegKind::Request);
        assert_eq!((log.received[0].src, log.received[0].cuts), (2, 1));
    }
}
