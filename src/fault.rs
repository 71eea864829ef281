//! Fault injection: kill specifications and the plan that fires them.
//!
//! A kill names a victim (a rank, or a whole node) and a moment: a fraction of
//! the job's progress, an iteration (safe-point count), or the N-th recovery.
//! The plan is consulted by the driver at *fault points* (every runtime call a
//! rank makes); when a kill is due it fires after a seeded number of further
//! fault points, so that it lands inside an iteration (in the middle of a
//! collective, say) rather than always at its boundary. Each kill fires once,
//! even when a rollback makes the job pass the same point again.

use std::fmt;
use std::str::FromStr;

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// Who dies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Victim {
    /// One rank.
    Rank(Rank),
    /// Every rank placed on this node, at the same instant.
    Node(usize),
}

/// When it dies.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Moment {
    /// When the job is this percentage through (0 ≤ p < 100).
    Progress(f64),
    /// After this many safe points (iterations) of the victim.
    Iteration(u64),
    /// During the N-th recovery (N ≥ 1: the recovery from the N-th failure
    /// event), while it is still in progress.
    Recovery(u64),
    /// While the victim takes part in the N-th checkpoint it enters (N ≥ 1),
    /// after its safe point began and before the generation committed.
    Checkpoint(u64),
    /// At the very end: the victim's rank function has returned and it
    /// enters finalize (others may have left their rank functions too).
    Finalize,
    /// While the N-th evacuation (N ≥ 1: the one the N-th warning of 001
    /// began) is in progress: some rank of the warned workers has not yet
    /// resumed elsewhere. A node that dies then dies mid-evacuation.
    Evacuation(u64),
}

/// One `--kill` specification: `R@P%`, `R@iI`, `R@recovery[:N]`,
/// `R@checkpoint[:N]`, `R@evacuation[:N]`, `R@finalize`, or the same with
/// `node:K` as victim.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KillSpec {
    /// Who dies.
    pub victim: Victim,
    /// When.
    pub moment: Moment,
}

/// Parse the `[:N]` suffix of `recovery[:N]` / `checkpoint[:N]` (default 1).
fn ordinal(rest: &str, what: &str) -> std::result::Result<u64, String> {
    let n = match rest.strip_prefix(':') {
        Some(n) => n
            .parse()
            .map_err(|_| format!("{what} number must be a number"))?,
        None if rest.is_empty() => 1,
        None => return Err(format!("expected `{what}` or `{what}:N`")),
    };
    if n == 0 {
        return Err(format!("{what}s are numbered from 1"));
    }
    Ok(n)
}

impl FromStr for KillSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |detail: &str| Error::config("kills", format!("`{s}`: {detail}"));
        let (who, when) = s.split_once('@').ok_or_else(|| {
            bad("expected VICTIM@MOMENT, e.g. 3@40%, 1@i5, node:1@30%, 2@recovery")
        })?;
        let victim = if let Some(k) = who.strip_prefix("node:") {
            Victim::Node(k.parse().map_err(|_| bad("node must be a number"))?)
        } else {
            Victim::Rank(who.parse().map_err(|_| bad("rank must be a number"))?)
        };
        let moment = if let Some(p) = when.strip_suffix('%') {
            let p: f64 = p.parse().map_err(|_| bad("percentage must be a number"))?;
            if !(0.0..100.0).contains(&p) {
                return Err(bad("percentage must be in [0, 100)"));
            }
            Moment::Progress(p)
        } else if let Some(i) = when.strip_prefix('i') {
            Moment::Iteration(i.parse().map_err(|_| bad("iteration must be a number"))?)
        } else if let Some(rest) = when.strip_prefix("recovery") {
            Moment::Recovery(ordinal(rest, "recovery").map_err(|d| bad(&d))?)
        } else if let Some(rest) = when.strip_prefix("checkpoint") {
            Moment::Checkpoint(ordinal(rest, "checkpoint").map_err(|d| bad(&d))?)
        } else if when == "finalize" {
            Moment::Finalize
        } else if let Some(rest) = when.strip_prefix("evacuation") {
            Moment::Evacuation(ordinal(rest, "evacuation").map_err(|d| bad(&d))?)
        } else {
            return Err(bad(
                "moment must be P%, iI, recovery[:N], checkpoint[:N], evacuation[:N] or finalize",
            ));
        };
        Ok(KillSpec { victim, moment })
    }
}

impl fmt::Display for KillSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.victim {
            Victim::Rank(r) => write!(f, "{r}@")?,
            Victim::Node(k) => write!(f, "node:{k}@")?,
        }
        match self.moment {
            Moment::Progress(p) => write!(f, "{p}%"),
            Moment::Iteration(i) => write!(f, "i{i}"),
            Moment::Recovery(n) => write!(f, "recovery:{n}"),
            Moment::Checkpoint(n) => write!(f, "checkpoint:{n}"),
            Moment::Finalize => f.write_str("finalize"),
            Moment::Evacuation(n) => write!(f, "evacuation:{n}"),
        }
    }
}

impl KillSpec {
    /// Check the spec against the job: victim in range, iteration within the
    /// run (`iterations` safe points in all).
    pub fn validate(&self, placement: &Placement, iterations: u64) -> Result<()> {
        let bad = |detail: String| Error::config("kills", format!("`{self}`: {detail}"));
        match self.victim {
            Victim::Rank(r) if r >= placement.ranks() => {
                return Err(bad(format!(
                    "rank {r} is out of range (the job has {} ranks)",
                    placement.ranks()
                )));
            }
            Victim::Node(k) if k >= placement.nodes() => {
                return Err(bad(format!(
                    "node {k} is out of range (the job has {} nodes)",
                    placement.nodes()
                )));
            }
            _ => {}
        }
        if let Moment::Iteration(i) = self.moment
            && i >= iterations
        {
            return Err(bad(format!(
                "iteration {i} is beyond the run ({iterations} iterations)"
            )));
        }
        Ok(())
    }

    /// Why this kill may not have fired by the end of a job, for the
    /// warning that says it never did.
    pub fn why_unfired(&self) -> &'static str {
        match self.moment {
            Moment::Progress(_) => {
                "the progress the program reports never reached it (a program that never calls \
                 ctx.set_progress stays at 0%; R@iI kills after I safe points instead)"
            }
            Moment::Iteration(_) => "the victim never passed that many safe points",
            Moment::Recovery(_) => "the job had fewer recoveries",
            Moment::Checkpoint(_) => "the victim took part in fewer checkpoints",
            Moment::Finalize => "the victim never reached finalize",
            Moment::Evacuation(_) => {
                "the job had fewer warnings, or the evacuation ended before the victim's next \
                 runtime call"
            }
        }
    }

    /// The ranks this kill takes down.
    pub fn victims(&self, placement: &Placement) -> Vec<Rank> {
        match self.victim {
            Victim::Rank(r) => vec![r],
            Victim::Node(k) => placement.ranks_on(k),
        }
    }
}

/// Who a fault warning is about (001 §1: a health monitor predicts that a
/// node, or one worker of it, is about to fail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Warned {
    /// One worker (a process hosting ranks).
    Worker(usize),
    /// Every worker of this node.
    Node(usize),
}

/// One `--warn` specification: `W@P%` or `W@iI` for worker W, or
/// `node:K@P%` / `node:K@iI`. The warned workers' ranks are evacuated
/// (001 §3); a `--kill` of the same node later loses nothing when the
/// evacuation finished first.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WarnSpec {
    /// Who is warned.
    pub warned: Warned,
    /// When: a progress percentage or an iteration of the first rank the
    /// warned workers started with.
    pub moment: Moment,
}

impl FromStr for WarnSpec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let bad = |detail: &str| Error::config("warnings", format!("`{s}`: {detail}"));
        let k: KillSpec = s.parse().map_err(|e| match e {
            Error::Config { detail, .. } => Error::config("warnings", detail),
            e => e,
        })?;
        let warned = match k.victim {
            Victim::Rank(w) => Warned::Worker(w),
            Victim::Node(n) => Warned::Node(n),
        };
        match k.moment {
            Moment::Progress(_) | Moment::Iteration(_) => Ok(WarnSpec {
                warned,
                moment: k.moment,
            }),
            _ => Err(bad("a warning comes at P% or iI (W@40%, node:1@i5)")),
        }
    }
}

impl fmt::Display for WarnSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let victim = match self.warned {
            Warned::Worker(w) => Victim::Rank(w),
            Warned::Node(n) => Victim::Node(n),
        };
        KillSpec {
            victim,
            moment: self.moment,
        }
        .fmt(f)
    }
}

impl WarnSpec {
    /// Whether it is due at fault point `at` (never during a recovery).
    pub fn due(&self, at: &FaultPoint) -> bool {
        at.recovery.is_none()
            && match self.moment {
                Moment::Progress(p) => at.progress * 100.0 >= p,
                Moment::Iteration(i) => at.iteration >= i,
                _ => false,
            }
    }
}

/// Where a rank is when it reaches a fault point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultPoint {
    /// Safe points passed by this rank (its iteration).
    pub iteration: u64,
    /// Fraction of the job done, as the application reports it (0..=1).
    pub progress: f64,
    /// `Some(n)` while this rank is recovering from the n-th failure event.
    pub recovery: Option<u64>,
    /// `Some(n)` while this rank takes part in the n-th checkpoint it
    /// entered (counted over its incarnations' lives: restarts included).
    pub checkpoint: Option<u64>,
    /// This rank's function has returned and it enters finalize.
    pub finalizing: bool,
    /// The evacuations in progress (001; set by drivers that move ranks):
    /// bit n − 1 while the n-th is (the first 64).
    pub evacuations: u64,
}

#[derive(Debug)]
struct Armed {
    spec: KillSpec,
    /// Fault points still to pass once the moment is reached.
    countdown: Option<u32>,
    fired: bool,
}

/// The kills of a run and their state. Owned by the driver.
#[derive(Debug)]
pub struct FaultPlan {
    kills: Vec<Armed>,
    rng: ChaCha8Rng,
    placement: Placement,
    /// The job's outcome is decided ([`FaultPlan::conclude`]).
    concluded: bool,
}

impl FaultPlan {
    /// A plan for `kills` on `placement`, with delays drawn from `seed`.
    pub fn new(kills: &[KillSpec], placement: Placement, seed: u64) -> Self {
        FaultPlan {
            kills: kills
                .iter()
                .map(|&spec| Armed {
                    spec,
                    countdown: None,
                    fired: false,
                })
                .collect(),
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x6b69_6c6c),
            placement,
            concluded: false,
        }
    }

    /// The job's outcome is decided: finalize's leader has every live
    /// rank's `Done` and no failure happened since, or the job is aborted.
    /// No kill fires any more (those left stay unfired): after finalize
    /// every rank's value is known, and a rank killed then would be
    /// replaced to re-execute against ranks that have already left (issue
    /// 33, defect 6); after an abort, its replacement would never be told
    /// (defect 5).
    pub fn conclude(&mut self) {
        self.concluded = true;
    }

    /// Called at each fault point of `rank`; returns the victims of a kill
    /// that fires now (possibly including others than `rank`, for a node).
    pub fn check(&mut self, rank: Rank, at: &FaultPoint) -> Option<Vec<Rank>> {
        self.check_indexed(rank, at).map(|(_, victims)| victims)
    }

    /// As [`FaultPlan::check`], also naming which kill specification fired
    /// (its index in the job's list), for drivers whose ranks each hold a
    /// copy of the plan and must agree on which kills already fired.
    pub fn check_indexed(&mut self, rank: Rank, at: &FaultPoint) -> Option<(usize, Vec<Rank>)> {
        if self.concluded {
            return None;
        }
        for i in 0..self.kills.len() {
            let k = &self.kills[i];
            if k.fired {
                continue;
            }
            if self.trigger(k.spec.victim) != Some(rank) {
                continue;
            }
            let due = match k.spec.moment {
                Moment::Progress(p) => at.recovery.is_none() && at.progress * 100.0 >= p,
                Moment::Iteration(it) => at.recovery.is_none() && at.iteration >= it,
                Moment::Recovery(n) => at.recovery == Some(n),
                Moment::Checkpoint(n) => at.checkpoint == Some(n),
                Moment::Finalize => at.finalizing,
                Moment::Evacuation(n) => n <= 64 && at.evacuations & (1 << (n - 1)) != 0,
            };
            if !due {
                continue;
            }
            let max_delay = match k.spec.moment {
                // Recovery and checkpoint exchanges are short: land within
                // their first calls; finalize has one fault point.
                Moment::Recovery(_) | Moment::Checkpoint(_) => 1,
                // An evacuation may end at the victim's next safe point:
                // land at once.
                Moment::Finalize | Moment::Evacuation(_) => 0,
                _ => 12,
            };
            let delay = match self.kills[i].countdown {
                Some(d) => d,
                None => self.rng.random_range(0..=max_delay),
            };
            if delay == 0 {
                self.kills[i].fired = true;
                return Some((i, self.kills[i].spec.victims(&self.placement)));
            }
            self.kills[i].countdown = Some(delay - 1);
        }
        None
    }

    /// The rank whose fault points fire a kill of `victim`: the victim
    /// itself, or the first rank of the node.
    fn trigger(&self, victim: Victim) -> Option<Rank> {
        match victim {
            Victim::Rank(r) => Some(r),
            Victim::Node(n) => self.placement.ranks_on(n).first().copied(),
        }
    }

    /// Whether a kill that `rank` triggers has yet to fire. When not, every
    /// [`FaultPlan::check`] by `rank` returns `None` until a kill is marked
    /// unfired again (never), so a driver may skip the check on its hot path.
    pub fn armed_for(&self, rank: Rank) -> bool {
        self.kills
            .iter()
            .any(|k| !k.fired && self.trigger(k.spec.victim) == Some(rank))
    }

    /// Kill specification `index`.
    pub fn spec(&self, index: usize) -> Option<KillSpec> {
        self.kills.get(index).map(|k| k.spec)
    }

    /// Record that kill specification `index` fired elsewhere.
    pub fn mark_fired(&mut self, index: usize) {
        if let Some(k) = self.kills.get_mut(index) {
            k.fired = true;
        }
    }

    /// Indices of the kill specifications that fired.
    pub fn fired(&self) -> Vec<usize> {
        (0..self.kills.len())
            .filter(|&i| self.kills[i].fired)
            .collect()
    }

    /// Kills that never fired (their moment was never reached).
    pub fn unfired(&self) -> Vec<KillSpec> {
        self.kills
            .iter()
            .filter(|k| !k.fired)
            .map(|k| k.spec)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_forms() {
        let k: KillSpec = "3@40%".parse().expect("valid");
        assert_eq!(k.victim, Victim::Rank(3));
        assert_eq!(k.moment, Moment::Progress(40.0));
        let k: KillSpec = "node:1@i7".parse().expect("valid");
        assert_eq!(k.victim, Victim::Node(1));
        assert_eq!(k.moment, Moment::Iteration(7));
        let k: KillSpec = "2@recovery".parse().expect("valid");
        assert_eq!(k.moment, Moment::Recovery(1));
        let k: KillSpec = "2@recovery:3".parse().expect("valid");
        assert_eq!(k.moment, Moment::Recovery(3));
        let k: KillSpec = "1@finalize".parse().expect("valid");
        assert_eq!(k.moment, Moment::Finalize);
        assert_eq!(k.to_string(), "1@finalize");
        let k: KillSpec = "node:0@checkpoint:2".parse().expect("valid");
        assert_eq!(k.moment, Moment::Checkpoint(2));
        assert_eq!(k.to_string(), "node:0@checkpoint:2");
        for bad in [
            "3",
            "x@5%",
            "1@150%",
            "1@q",
            "node:a@1%",
            "1@recovery:0",
            "1@checkpoint:x",
        ] {
            assert!(bad.parse::<KillSpec>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_plan_is_armed_only_for_the_ranks_that_trigger_an_unfired_kill() {
        let pl = Placement::block(4, 2).expect("valid");
        let kills: Vec<KillSpec> = ["1@50%", "node:1@i3"]
            .iter()
            .map(|k| k.parse().expect("valid"))
            .collect();
        let mut plan = FaultPlan::new(&kills, pl, 7);
        // A node kill is triggered by the node's first rank.
        let armed = |p: &FaultPlan| (0..4).map(|r| p.armed_for(r)).collect::<Vec<_>>();
        assert_eq!(armed(&plan), [false, true, true, false]);
        plan.mark_fired(0);
        assert_eq!(armed(&plan), [false, false, true, false]);
        plan.mark_fired(1);
        assert_eq!(armed(&plan), [false; 4]);
        assert!(!FaultPlan::new(&[], Placement::block(2, 1).expect("valid"), 1).armed_for(0));
    }

    #[test]
    fn validates_against_job() {
        let pl = Placement::block(4, 2).expect("valid");
        assert!(
            "4@10%"
                .parse::<KillSpec>()
                .expect("p")
                .validate(&pl, 10)
                .is_err()
        );
        assert!(
            "node:2@10%"
                .parse::<KillSpec>()
                .expect("p")
                .validate(&pl, 10)
                .is_err()
        );
        assert!(
            "1@i10"
                .parse::<KillSpec>()
                .expect("p")
                .validate(&pl, 10)
                .is_err()
        );
        assert!(
            "1@i9"
                .parse::<KillSpec>()
                .expect("p")
                .validate(&pl, 10)
                .is_ok()
        );
    }

    #[test]
    fn fires_once_after_the_moment() {
        let pl = Placement::block(4, 2).expect("valid");
        let mut plan = FaultPlan::new(&["node:1@50%".parse().expect("p")], pl, 7);
        let early = FaultPoint {
            iteration: 0,
            progress: 0.4,
            recovery: None,
            checkpoint: None,
            finalizing: false,
            evacuations: 0,
        };
        assert_eq!(plan.check(2, &early), None);
        let late = FaultPoint {
            progress: 0.6,
            ..early
        };
        let mut fired = None;
        for _ in 0..20 {
            if let Some(v) = plan.check(2, &late) {
                fired = Some(v);
                break;
            }
        }
        assert_eq!(fired, Some(vec![2, 3]));
        assert_eq!(plan.check(2, &late), None);
        assert!(plan.unfired().is_empty());
    }
}
