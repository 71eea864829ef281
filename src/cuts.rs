//! The cut-consistency checker (000 §II and §IV): which communications cross
//! or overlap the cuts a snapshot wave made.
//!
//! Every rank numbers the cuts it passes (generation 1, 2, …) and stamps
//! each communication it takes part in with that number: a leg (a message,
//! a one-sided request, or its reply) when it is sent and when it is
//! received (handed to the rank: a message held out of its reach is
//! received when released), and a one-sided operation when its origin
//! issues it and when its reply arrives. A leg is identified by its
//! channel and its position on it (channels are FIFO), so the sender's and
//! the receiver's stamps meet here. For cut `g`, with `s` and `r` a leg's
//! stamps and `i`, `c` an operation's:
//!
//! - a leg **crosses** the cut if it was sent after its sender's cut and
//!   received before its receiver's (`r < g ≤ s`: an orphan, whose effect
//!   the receiver's recorded state holds though the sender's does not send
//!   it), or if it is a one-sided reply read before the target's cut and
//!   written after the origin's (`s < g ≤ r`: 000 Fig. 3; a NIC writes the
//!   data with no process recording it as channel state, so no recorded
//!   state holds it and the restored origin waits for it for ever);
//! - an operation **overlaps** the cut if it was issued before its origin's
//!   cut and completed after it (`i < g ≤ c`): a state recorded with the
//!   operation in flight can be restored only if the snapshot also holds
//!   the network interface's state (000 §IV-D b).
//!
//! Two-sided messages in transit (`s < g ≤ r`) are neither: they are the
//! channel state the receiver records.

use serde::{Deserialize, Serialize};

use crate::Rank;

/// What a leg is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LegKind {
    /// A two-sided message (point to point, or inside a collective).
    Message,
    /// A one-sided operation's request, origin to target.
    Request,
    /// Its reply (data of a GET, acknowledgement of a PUT), target to
    /// origin.
    Reply,
}

/// A leg as its sender saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SentLeg {
    /// Receiver.
    pub dest: Rank,
    /// Position on the channel (1 for the first leg sent on it).
    pub index: u64,
    /// Cuts the sender had passed when it sent the leg.
    pub cuts: u64,
    /// What it is.
    pub kind: LegKind,
}

/// A leg as its receiver saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceivedLeg {
    /// Sender.
    pub src: Rank,
    /// Position on the channel.
    pub index: u64,
    /// Cuts the receiver had passed when it received the leg.
    pub cuts: u64,
}

/// A one-sided operation as its origin saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation {
    /// Target.
    pub target: Rank,
    /// Cuts the origin had passed when it issued the operation.
    pub issued: u64,
    /// Cuts it had passed when the reply arrived.
    pub completed: u64,
}

/// One rank's stamps, reported when its rank function returns.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CutLog {
    /// The rank.
    pub rank: Rank,
    /// Cuts it passed.
    pub cuts: u64,
    /// Legs it sent.
    pub sent: Vec<SentLeg>,
    /// Legs it received.
    pub received: Vec<ReceivedLeg>,
    /// One-sided operations it issued and saw complete.
    pub operations: Vec<Operation>,
}

/// Markers a snapshot wave sent, by kind, and requests refused
/// (`chandy-lamport` with a `get()` fix, 000 §IV).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WaveCounts {
    /// First-wave markers.
    pub first: u64,
    /// Second-wave markers (double barrier).
    pub second: u64,
    /// Flush markers (partial double barrier: g).
    pub flush: u64,
    /// Their answers (g).
    pub flush_answers: u64,
    /// Requests refused because their origin had not entered the wave
    /// (peek-and-get).
    pub refused: u64,
    /// Generations entered: the most any rank entered (with `first` =
    /// n(n − 1) × this when every rank entered them all, 000 §IV-D).
    pub generations: u64,
}

impl WaveCounts {
    /// Add `o`.
    pub fn add(&mut self, o: &WaveCounts) {
        self.first += o.first;
        self.second += o.second;
        self.flush += o.flush;
        self.flush_answers += o.flush_answers;
        self.refused += o.refused;
        self.generations = self.generations.max(o.generations);
    }
}

/// A communication that crosses or overlaps a cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// The first cut it crosses or overlaps.
    pub generation: u64,
    /// What happened, in words.
    pub what: String,
}

/// What the checker found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CutReport {
    /// Cuts checked: those every rank passed.
    pub checked: u64,
    /// Cuts some communication crosses.
    pub crossed: u64,
    /// Cuts some operation overlaps.
    pub overlapped: u64,
    /// Legs sent after their sender's cut and received before their
    /// receiver's (counted once per cut).
    pub orphans: u64,
    /// One-sided replies read before the target's cut and written after
    /// the origin's.
    pub lost_replies: u64,
    /// Operations issued before their origin's cut and completed after.
    pub overlapping_operations: u64,
    /// Legs whose sender and receiver stamps did not both arrive (in flight
    /// when the job ended, or lost with a rank): not judged.
    pub unmatched_legs: u64,
    /// The first findings, for the user to look at.
    pub findings: Vec<Finding>,
}

impl CutReport {
    /// Whether no checked cut is crossed or overlapped.
    pub fn clean(&self) -> bool {
        self.crossed == 0 && self.overlapped == 0
    }
}

/// Findings kept in a report.
const KEPT_FINDINGS: usize = 16;

/// Check the cuts of one failure-free execution, given every rank's log.
pub fn check(logs: &[CutLog]) -> CutReport {
    let checked = logs.iter().map(|l| l.cuts).min().unwrap_or(0);
    let mut report = CutReport {
        checked,
        ..CutReport::default()
    };
    // Per cut 0..=checked: whether something crosses / overlaps it.
    let mut crossed = vec![false; checked as usize + 1];
    let mut overlapped = vec![false; checked as usize + 1];
    // Mark the checked cuts in (lo, hi] on `flags`; how many there are.
    // The first finding of each communication is kept, up to a limit.
    let mut judge = |lo: u64, hi: u64, flags: &mut [bool], what: &dyn Fn() -> String| {
        let cuts = (lo + 1)..=hi.min(checked);
        for g in cuts.clone() {
            flags[g as usize] = true;
        }
        let n = cuts.clone().count() as u64;
        if n > 0 && report.findings.len() < KEPT_FINDINGS {
            report.findings.push(Finding {
                generation: *cuts.start(),
                what: what(),
            });
        }
        n
    };

    let mut received = std::collections::HashMap::new();
    for log in logs {
        for r in &log.received {
            received.insert((r.src, log.rank, r.index), r.cuts);
        }
    }
    let (mut orphans, mut lost_replies, mut overlapping, mut unmatched) = (0, 0, 0, 0);
    for log in logs {
        for s in &log.sent {
            let Some(&r) = received.get(&(log.rank, s.dest, s.index)) else {
                unmatched += 1;
                continue;
            };
            let leg = |why: &str| {
                format!(
                    "{:?} {} → {} (#{} on its channel): {why}",
                    s.kind, log.rank, s.dest, s.index
                )
            };
            if r < s.cuts {
                orphans += judge(r, s.cuts, &mut crossed, &|| {
                    leg("sent after its sender's cut, received before its receiver's")
                });
            } else if s.kind == LegKind::Reply && s.cuts < r {
                lost_replies += judge(s.cuts, r, &mut crossed, &|| {
                    leg("read before the target's cut, written after the origin's (000 Fig. 3)")
                });
            }
        }
        for op in &log.operations {
            overlapping += judge(op.issued, op.completed, &mut overlapped, &|| {
                format!(
                    "one-sided operation {} → {}: issued before the origin's cut, completed after",
                    log.rank, op.target
                )
            });
        }
    }
    report.orphans = orphans;
    report.lost_replies = lost_replies;
    report.overlapping_operations = overlapping;
    report.unmatched_legs = unmatched;
    report.crossed = crossed.iter().filter(|&&c| c).count() as u64;
    report.overlapped = overlapped.iter().filter(|&&c| c).count() as u64;
    report
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(dest: Rank, index: u64, cuts: u64, kind: LegKind) -> SentLeg {
        SentLeg {
            dest,
            index,
            cuts,
            kind,
        }
    }

    fn recv(src: Rank, index: u64, cuts: u64) -> ReceivedLeg {
        ReceivedLeg { src, index, cuts }
    }

    fn log(rank: Rank, cuts: u64) -> CutLog {
        CutLog {
            rank,
            cuts,
            ..CutLog::default()
        }
    }

    /// Rank 0 issues a GET to rank 1 before its cut: the reply leaves rank
    /// 1 with stamp `reply_sent` and lands with `reply_received`.
    fn get(reply_sent: u64, reply_received: u64, request_received: u64) -> Vec<CutLog> {
        let mut a = log(0, 1);
        let mut b = log(1, 1);
        a.sent.push(sent(1, 1, 0, LegKind::Request));
        b.received.push(recv(0, 1, request_received));
        b.sent.push(sent(0, 1, reply_sent, LegKind::Reply));
        a.received.push(recv(1, 1, reply_received));
        a.operations.push(Operation {
            target: 1,
            issued: 0,
            completed: reply_received,
        });
        vec![a, b]
    }

    #[test]
    fn a_get_wholly_before_the_cut_is_clean() {
        let r = check(&get(0, 0, 0));
        assert_eq!((r.checked, r.crossed, r.overlapped), (1, 0, 0));
        assert!(r.clean());
        assert_eq!(r.unmatched_legs, 0);
    }

    #[test]
    fn a_reply_read_before_the_cut_and_written_after_it_crosses_it() {
        // 000 Fig. 3: the origin records with the GET in flight, the
        // target served it before its own cut.
        let r = check(&get(0, 1, 0));
        assert_eq!((r.crossed, r.overlapped), (1, 1));
        assert_eq!(
            (r.lost_replies, r.orphans, r.overlapping_operations),
            (1, 0, 1)
        );
        assert!(r.findings.iter().any(|f| f.what.contains("Fig. 3")));
    }

    #[test]
    fn a_get_served_after_the_targets_cut_overlaps_only() {
        // The request is in transit across the cut (recorded at the
        // target), the reply is after both cuts.
        let r = check(&get(1, 1, 1));
        assert_eq!((r.crossed, r.overlapped), (0, 1));
    }

    #[test]
    fn a_reply_sent_after_the_cut_and_received_before_it_is_an_orphan() {
        let r = check(&get(1, 0, 1));
        assert_eq!((r.crossed, r.overlapped, r.orphans), (1, 0, 1));
    }

    #[test]
    fn two_sided_messages_in_transit_are_channel_state_not_crossings() {
        let mut a = log(0, 1);
        let mut b = log(1, 1);
        a.sent.push(sent(1, 1, 0, LegKind::Message));
        b.received.push(recv(0, 1, 1));
        // And an orphan the other way.
        b.sent.push(sent(0, 1, 1, LegKind::Message));
        a.received.push(recv(1, 1, 0));
        let r = check(&[a, b]);
        assert_eq!((r.crossed, r.orphans, r.lost_replies), (1, 1, 0));
    }

    #[test]
    fn only_cuts_every_rank_passed_are_checked() {
        // Rank 1 never passed cut 2: a leg crossing only cut 2 is not
        // judged, one crossing cut 1 is.
        let mut a = log(0, 2);
        let mut b = log(1, 1);
        a.sent.push(sent(1, 1, 2, LegKind::Message));
        b.received.push(recv(0, 1, 1));
        a.sent.push(sent(1, 2, 1, LegKind::Message));
        b.received.push(recv(0, 2, 0));
        let r = check(&[a, b]);
        assert_eq!((r.checked, r.crossed, r.orphans), (1, 1, 1));
        assert_eq!(r.findings[0].generation, 1);
    }

    #[test]
    fn legs_without_both_stamps_are_counted_not_judged() {
        let mut a = log(0, 1);
        a.sent.push(sent(1, 1, 1, LegKind::Message));
        let r = check(&[a, log(1, 1)]);
        assert_eq!((r.crossed, r.unmatched_legs), (0, 1));
    }
}
