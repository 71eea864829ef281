//! Proactive fault tolerance (001): moving ranks off a worker that is about
//! to fail, while it still works, with no rollback.
//!
//! A *worker* (001's processor: a process, a thread group or a simulated
//! entity) hosts several *virtual ranks* (001's migratable objects). When a
//! health monitor warns that a node will fail, its workers are evacuated:
//! each resident rank is packed at a safe point and resumed elsewhere, and
//! the job continues on fewer workers.
//!
//! - [`location`]: the location service (001 §3.1): the index-to-home
//!   function, forwarding from a rank's last known location, routing
//!   updates, and the evacuation message that makes every worker stop using
//!   a warned one, simultaneous warnings included.
//! - [`collectives`]: the reduction tree repaired around a warned worker and
//!   the broadcast serializer handed over with its count (001 §3.2).
//! - [`balancer`]: reassigning ranks over the remaining workers after an
//!   evacuation, greedy or by refinement (001 §4.2).
//!
//! These are state machines and pure functions, like the protocols: they
//! own no thread, socket or clock. The drivers do not host several ranks a
//! worker yet (issue 36), so nothing outside this module's tests uses them.

pub mod balancer;
pub mod collectives;
pub mod location;

use serde::{Deserialize, Serialize};

/// One evacuation: a warning and the ranks it moved (001 §4.1).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Evacuation {
    /// The warning, as given (`node:1@50%`).
    pub warning: String,
    /// The workers it warned.
    pub workers: Vec<location::Worker>,
    /// When it came, seconds into the run.
    pub at_s: f64,
    /// Ranks moved off the warned workers.
    pub ranks: u64,
    /// Their packed state, bytes.
    pub bytes: u64,
    /// Those bytes over the bandwidth of the links they left by, seconds:
    /// the least an evacuation can take (001 §4.1: "dominated by the time
    /// to transmit the data out").
    #[serde(default)]
    pub link_s: f64,
    /// 001 §4.1's processor evacuation time: from the warning to the last
    /// of its ranks resumed elsewhere, seconds (`None`: not finished when
    /// the job ended, or cut short by the node's death).
    pub seconds: Option<f64>,
}

/// What proactive fault tolerance did in a run (001).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MigrationReport {
    /// Workers hosting the ranks.
    pub workers: usize,
    /// Each warning's evacuation.
    pub evacuations: Vec<Evacuation>,
    /// Rank moves of all kinds (evacuations and load balancing).
    pub migrations: u64,
    /// Bytes those moves carried (packed rank state).
    pub migrated_bytes: u64,
    /// Rank moves the load balancer asked for (001 §4.2).
    pub balance_moves: u64,
    /// Bytes they carried.
    pub balance_bytes: u64,
    /// Messages forwarded from a rank's last known location (001 §3.1).
    pub forwarded: u64,
    /// Routing updates sent to the senders of forwarded messages.
    pub routing_updates: u64,
    /// Messages held at a worker for a rank on its way there.
    pub held: u64,
    /// Node deaths that found no rank left to kill (the evacuation was
    /// done in time).
    pub empty_node_deaths: u64,
    /// Time per iteration (between consecutive safe points, the slowest
    /// rank's), seconds: 001 Fig. 5's curve.
    pub iteration_s: Vec<f64>,
    /// The iteration (safe point) at which the first warning came.
    pub warned_iteration: Option<u64>,
    /// The iteration by which the last evacuation finished.
    pub evacuated_iteration: Option<u64>,
    /// The iteration by which the last balancing move finished.
    pub balanced_iteration: Option<u64>,
}

impl MigrationReport {
    /// Median time per iteration over `range` of iterations (indices into
    /// `iteration_s`), if any fall there.
    pub fn median_iteration_s(&self, range: std::ops::Range<usize>) -> Option<f64> {
        let end = range.end.min(self.iteration_s.len());
        let mut v: Vec<f64> = self.iteration_s.get(range.start..end)?.to_vec();
        if v.is_empty() {
            return None;
        }
        v.sort_by(f64::total_cmp);
        Some(v[v.len() / 2])
    }

    /// 001 Fig. 5 in three numbers: the median time per iteration before
    /// the first warning, after the evacuation (before balancing), and
    /// after balancing. A rank moves at the safe point that ends an
    /// iteration, so iteration `i + 1` (index `i` of `iteration_s`) is the
    /// first that runs where the moves at safe point `i` put the ranks.
    pub fn phases(&self) -> (Option<f64>, Option<f64>, Option<f64>) {
        let n = self.iteration_s.len();
        let warned = self.warned_iteration.map_or(n, |i| i as usize);
        let evacuated = self.evacuated_iteration.map(|i| i as usize);
        let balanced = self.balanced_iteration.map(|i| i as usize);
        (
            // The first iteration includes start-up: skip it.
            self.median_iteration_s(1.min(warned)..warned),
            evacuated.and_then(|e| self.median_iteration_s(e..balanced.unwrap_or(n).max(e))),
            balanced.and_then(|b| self.median_iteration_s(b..n)),
        )
    }
}
