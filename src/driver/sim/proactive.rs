//! 001 on the simulator: workers hosting several ranks, fault warnings that
//! evacuate a worker's ranks with no rollback, messages routed by the
//! location service with forwarding, and load balancing afterwards.
//!
//! A simulated worker is a CPU and a location service
//! ([`crate::migration::location`]): the ranks it hosts share its CPU (a
//! rank's `compute` waits for the ranks charged before it), and every
//! frame between ranks goes from the sender's worker to where that worker
//! believes the receiver is, then on by the service's forwarding pointers,
//! each hop charged the link between the two workers' nodes. Forwarding can
//! overtake a channel's earlier frame, so frames carry a per-channel
//! sequence number and are handed to the rank in order, as AMPI does.
//!
//! A rank moves at a safe point (`Endpoint::migrate`): as in AMPI (001
//! §3.3), the user-level thread itself moves, here the rank's coroutine,
//! with its state; the engine packs what a checkpoint piece's head holds to
//! size the transfer, which takes the link's latency plus the bytes over
//! its bandwidth. Meanwhile frames for it are forwarded to its destination
//! and held there until it arrives. A node that dies takes the ranks that
//! reside on its workers then, which after an evacuation is none.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use crate::config::Config;
use crate::engine::frame::Incoming;
use crate::fault::{FaultPoint, WarnSpec, Warned};
use crate::migration::balancer::{self, RankLoad, Strategy};
use crate::migration::location::{
    Arrival, BlockLayout, Envelope, LocationMsg, LocationService, Worker,
};
use crate::migration::{Evacuation, MigrationReport};
use crate::network::NetworkModel;
use crate::{Rank, Result};

/// A frame on its way through the location service.
pub(super) struct Routed {
    /// The receiving incarnation, fixed when sent (a frame for a dead one
    /// is lost with it, as without workers).
    pub entity: usize,
    /// The sending rank.
    pub src: Rank,
    /// Its place on the channel from `src` to `entity`.
    pub seq: u64,
    pub env: Envelope,
    /// Size on the wire.
    pub bytes: usize,
    pub inc: Incoming,
}

/// Location messages to send, each to a worker.
pub(super) type Outbox = Vec<(Worker, LocationMsg)>;

/// What a worker does with a routed frame that reached it.
pub(super) enum Step {
    /// Hand to the rank (in channel order), and send this routing update.
    Deliver(Routed, Option<(Worker, LocationMsg)>),
    /// One more hop.
    Forward(Worker, Routed),
    /// Kept until the rank arrives.
    Held,
}

pub(super) struct Proactive {
    layout: BlockLayout,
    per_node: usize,
    net: NetworkModel,
    svc: Vec<LocationService>,
    /// The truth the services converge to: which workers are valid.
    valid: Vec<bool>,
    /// Where each rank resides (a rank in transit: where it left).
    residence: Vec<Worker>,
    /// When each worker's CPU is free again.
    cpu_free: Vec<u64>,
    /// When each node's link is free again for a moving rank's state (a
    /// node's ranks leave one after another through it).
    link_free: Vec<u64>,
    warnings: Vec<(WarnSpec, bool)>,
    /// Ranks to move at their next safe point: to the balancer's choice,
    /// or (`None`) to their home over the valid workers.
    due: BTreeMap<Rank, Option<Worker>>,
    seq_out: HashMap<(Rank, usize), u64>,
    seq_in: HashMap<(Rank, usize), u64>,
    early: HashMap<(Rank, usize), BTreeMap<u64, Incoming>>,
    held: HashMap<(Worker, Rank), Vec<Routed>>,
    /// Ranks on their way, with their destination.
    transit: HashMap<Rank, Worker>,
    /// Evacuations a death cut short: they never finish.
    cut_short: BTreeSet<usize>,
    /// Ranks an evacuation still has to move, with the evacuation.
    evacuating: BTreeMap<Rank, usize>,
    /// Ranks on their way to a worker warned since they left, with that
    /// warning's evacuation: it must move them on once they arrive (001
    /// §3.1: "H can of course deal with these by forwarding them").
    onward: BTreeMap<Rank, usize>,
    /// The evacuation that warned each worker.
    warned_by: BTreeMap<Worker, usize>,
    /// Checkpoint holders of each rank (`Placement::partner` and
    /// `second_partner`): a rank is not moved onto a node where its holders
    /// or the ranks whose pieces it holds reside, so that one node's death
    /// cannot take a rank with its copies.
    holders: Vec<[Option<Rank>; 2]>,
    balance: Strategy,
    /// The safe point at which the balancer decides, once an evacuation
    /// finished.
    balance_at: Option<u64>,
    /// Ranks the balancer's plan still has to move.
    balancing: BTreeSet<Rank>,
    /// Compute charged a rank since the last balancing (its load).
    compute_ns: Vec<u64>,
    /// A rank's packed size when it last moved (0: never moved).
    packed: Vec<u64>,
    /// The highest safe point each rank passed.
    safe_points: Vec<u64>,
    /// When the slowest rank passed each safe point (index 0: the first).
    iteration_end: Vec<u64>,
    report: MigrationReport,
}

impl Proactive {
    /// The proactive machinery of `cfg`, if it has workers or warnings.
    pub(super) fn new(cfg: &Config) -> Result<Option<Box<Self>>> {
        if cfg.workers.is_none() && cfg.warnings.is_empty() {
            return Ok(None);
        }
        let workers = cfg.worker_count();
        let layout = BlockLayout {
            ranks: cfg.ranks,
            workers,
        };
        let per_node = workers / cfg.nodes.max(1);
        let svc = (0..workers)
            .map(|w| LocationService::new(w, layout, per_node))
            .collect::<Result<Vec<_>>>()?;
        Ok(Some(Box::new(Proactive {
            layout,
            per_node,
            net: cfg.network,
            svc,
            valid: vec![true; workers],
            residence: (0..cfg.ranks).map(|r| layout.worker_of(r)).collect(),
            cpu_free: vec![0; workers],
            link_free: vec![0; cfg.nodes.max(1)],
            warnings: cfg.warnings.iter().map(|&w| (w, false)).collect(),
            due: BTreeMap::new(),
            seq_out: HashMap::new(),
            seq_in: HashMap::new(),
            early: HashMap::new(),
            held: HashMap::new(),
            transit: HashMap::new(),
            cut_short: BTreeSet::new(),
            evacuating: BTreeMap::new(),
            onward: BTreeMap::new(),
            warned_by: BTreeMap::new(),
            holders: {
                // No copies without a recovering protocol; the second copy
                // is kept by the logging protocols only
                // (`shared::new_engine`).
                let pl = cfg.placement()?;
                let (first, second) = (
                    cfg.protocol.replaces_failed_ranks(),
                    cfg.protocol.logs_messages(),
                );
                (0..cfg.ranks)
                    .map(|r| {
                        [
                            pl.partner(r).filter(|_| first),
                            pl.second_partner(r).filter(|_| second),
                        ]
                    })
                    .collect()
            },
            balance: cfg.balance,
            balance_at: None,
            balancing: BTreeSet::new(),
            compute_ns: vec![0; cfg.ranks],
            packed: vec![0; cfg.ranks],
            safe_points: vec![0; cfg.ranks],
            iteration_end: Vec::new(),
            report: MigrationReport {
                workers,
                ..MigrationReport::default()
            },
        })))
    }

    fn node_of_worker(&self, w: Worker) -> usize {
        w / self.per_node.max(1)
    }

    /// Where rank `r` resides now.
    pub(super) fn residence(&self, r: Rank) -> Worker {
        self.residence[r]
    }

    /// The link between workers `a` and `b`: latency and bandwidth, inside
    /// a node or between nodes.
    pub(super) fn link(&self, a: Worker, b: Worker) -> (std::time::Duration, f64) {
        if self.node_of_worker(a) == self.node_of_worker(b) {
            (self.net.latency_intra, self.net.bandwidth_intra)
        } else {
            (self.net.latency_inter, self.net.bandwidth_inter)
        }
    }

    /// Nanoseconds for `bytes` to go from worker `a` to worker `b`.
    pub(super) fn hop_ns(&self, a: Worker, b: Worker, bytes: usize) -> u64 {
        let (lat, bw) = self.link(a, b);
        super::nanos(lat) + (bytes as f64 / bw * 1e9) as u64
    }

    /// Charge `d` ns of `rank`'s computation on its worker's CPU from `now`:
    /// when it ends.
    pub(super) fn compute(&mut self, rank: Rank, now: u64, d: u64) -> u64 {
        let w = self.residence[rank];
        let end = now.max(self.cpu_free[w]) + d;
        self.cpu_free[w] = end;
        self.compute_ns[rank] += d;
        end
    }

    /// A frame from `src` to `dest` (incarnation `entity`): the worker it
    /// leaves from, the one it goes to first, and its place on the channel.
    pub(super) fn send(&mut self, src: Rank, dest: Rank, entity: usize) -> (Worker, Worker, u64) {
        let from = self.residence[src];
        let to = (self.svc[from].route(dest)).unwrap_or(self.residence[dest]);
        let seq = self.seq_out.entry((src, entity)).or_insert(0);
        *seq += 1;
        (from, to, *seq - 1)
    }

    /// `r` reached worker `at`.
    pub(super) fn reach(&mut self, at: Worker, mut r: Routed) -> Step {
        match self.svc[at].on_message(r.env) {
            Ok(Arrival::Deliver { update }) => Step::Deliver(r, update),
            Ok(Arrival::Forward(next)) => {
                self.report.forwarded += 1;
                r.env.hops += 1;
                Step::Forward(next, r)
            }
            Ok(Arrival::Hold) => {
                self.report.held += 1;
                self.held.entry((at, r.env.dest)).or_default().push(r);
                Step::Held
            }
            // No valid worker is left for it: the location service cannot
            // say; the frame still reaches its rank.
            Err(_) => Step::Deliver(r, None),
        }
    }

    /// Hand `r` over in its channel's order: the frames now deliverable,
    /// with their incarnation.
    pub(super) fn in_order(&mut self, r: Routed) -> Vec<(usize, Incoming)> {
        let key = (r.src, r.entity);
        let next = self.seq_in.entry(key).or_insert(0);
        if r.seq != *next {
            self.early.entry(key).or_default().insert(r.seq, r.inc);
            return Vec::new();
        }
        *next += 1;
        let mut out = vec![(r.entity, r.inc)];
        if let Some(early) = self.early.get_mut(&key) {
            while let Some(inc) = early.remove(next) {
                *next += 1;
                out.push((r.entity, inc));
            }
            if early.is_empty() {
                self.early.remove(&key);
            }
        }
        out
    }

    /// A location message reached worker `to`: what it sends in turn.
    pub(super) fn locate(&mut self, to: Worker, msg: LocationMsg) -> Outbox {
        if let LocationMsg::RoutingUpdate { .. } = msg {
            self.report.routing_updates += 1;
        }
        self.svc[to].on_update(msg).unwrap_or_default()
    }

    /// Warnings that `rank`'s fault point `at` fires now (the first rank a
    /// warned worker started with keeps the time).
    pub(super) fn check_warnings(&mut self, rank: Rank, at: &FaultPoint) -> Vec<usize> {
        let mut fired = Vec::new();
        for i in 0..self.warnings.len() {
            let (spec, done) = self.warnings[i];
            let first_worker = match spec.warned {
                Warned::Worker(w) => w,
                Warned::Node(k) => k * self.per_node,
            };
            if !done && self.layout.ranks_of(first_worker).start == rank && spec.due(at) {
                self.warnings[i].1 = true;
                fired.push(i);
            }
        }
        fired
    }

    /// The evacuations in progress, as `FaultPoint::evacuations` has them:
    /// bit n − 1 for the n-th (the first 64), while some rank of it has not
    /// yet resumed elsewhere.
    pub(super) fn evacuations_in_progress(&self) -> u64 {
        (self.evacuating.values().chain(self.onward.values()))
            .filter(|&&e| e < 64)
            .fold(0, |bits, &e| bits | 1 << e)
    }

    /// Whether a warning is still to fire (the fault point's hot path
    /// checks nothing else).
    pub(super) fn armed(&self) -> bool {
        self.warnings.iter().any(|w| !w.1)
    }

    /// Warning `index` came at `now` (iteration `iteration`): its workers
    /// announce their evacuation (the messages to send, from each warned
    /// worker) and their ranks are due to move.
    pub(super) fn warn(
        &mut self,
        index: usize,
        now: u64,
        iteration: u64,
    ) -> Vec<(Worker, Worker, LocationMsg)> {
        let spec = self.warnings[index].0;
        let workers: Vec<Worker> = match spec.warned {
            Warned::Worker(w) => vec![w],
            Warned::Node(k) => (k * self.per_node..(k + 1) * self.per_node).collect(),
        };
        let evacuation = self.report.evacuations.len();
        let mut out = Vec::new();
        let workers: Vec<Worker> = workers.into_iter().filter(|&w| self.valid[w]).collect();
        // Workers warned together know it at once (one monitor, one node):
        // none sends its ranks to another.
        for &w in &workers {
            self.valid[w] = false;
            self.warned_by.insert(w, evacuation);
            for &x in &workers {
                if x != w {
                    let _ = self.svc[w].on_update(LocationMsg::Evacuation {
                        worker: x,
                        broadcasts: None,
                    });
                }
            }
        }
        let mut ranks = 0;
        for &w in &workers {
            for (to, msg) in self.svc[w].warn(None).unwrap_or_default() {
                out.push((w, to, msg));
            }
            for r in self.svc[w].residents() {
                self.due.insert(r, None);
                self.evacuating.insert(r, evacuation);
                ranks += 1;
            }
        }
        // Ranks on their way to a warned worker move on when they arrive:
        // this evacuation lasts until they have.
        for (&r, &to) in &self.transit {
            if workers.contains(&to) {
                self.onward.insert(r, evacuation);
                ranks += 1;
            }
        }
        self.report.evacuations.push(Evacuation {
            warning: spec.to_string(),
            workers,
            at_s: now as f64 * 1e-9,
            ranks: 0,
            bytes: 0,
            link_s: 0.0,
            seconds: (ranks == 0).then_some(0.0),
        });
        self.report.warned_iteration.get_or_insert(iteration);
        out
    }

    /// `rank` passed safe point `index` at `now`: whether it moves now.
    pub(super) fn safe_point(&mut self, rank: Rank, index: u64, now: u64) -> bool {
        let i = index.saturating_sub(1) as usize;
        if self.iteration_end.len() <= i {
            self.iteration_end.resize(i + 1, 0);
        }
        self.iteration_end[i] = self.iteration_end[i].max(now);
        self.safe_points[rank] = self.safe_points[rank].max(index);
        if self.balance_at.is_some_and(|k| index >= k) {
            self.balance_at = None;
            self.rebalance(index);
        }
        self.due.contains_key(&rank)
    }

    /// 001 §4.2: reassign every rank by the load it was charged since the
    /// last balancing; the ranks that move do so at their next safe point.
    fn rebalance(&mut self, index: u64) {
        let known: Vec<u64> = self.packed.iter().copied().filter(|&b| b > 0).collect();
        let typical = if known.is_empty() {
            1
        } else {
            known.iter().sum::<u64>() / known.len() as u64
        };
        let ranks: Vec<RankLoad> = (0..self.residence.len())
            .map(|r| RankLoad {
                rank: r,
                worker: self.residence[r],
                load: self.compute_ns[r] as f64,
                bytes: if self.packed[r] > 0 {
                    self.packed[r]
                } else {
                    typical
                },
            })
            .collect();
        let workers: Vec<Worker> = (0..self.valid.len()).filter(|&w| self.valid[w]).collect();
        let plan = balancer::balance(&ranks, &workers, self.balance);
        for &(r, _, to) in &plan.moves {
            self.due.insert(r, Some(to));
            self.balancing.insert(r);
        }
        if plan.moves.is_empty() {
            self.report.balanced_iteration = Some(index);
        }
        self.compute_ns.iter_mut().for_each(|c| *c = 0);
    }

    /// Nanoseconds from `now` until `bytes` of `rank`'s state sent from
    /// worker `from` to worker `to` have arrived: they wait for the source
    /// node's link, then take its latency plus the bytes over its
    /// bandwidth.
    pub(super) fn transfer_ns(
        &mut self,
        rank: Rank,
        now: u64,
        (from, to): (Worker, Worker),
        bytes: u64,
    ) -> u64 {
        let (lat, bw) = self.link(from, to);
        let node = self.node_of_worker(from);
        let start = now.max(self.link_free[node]);
        let busy = (bytes as f64 / bw * 1e9) as u64;
        self.link_free[node] = start + busy;
        if let Some(&e) = self.evacuating.get(&rank) {
            self.report.evacuations[e].link_s += busy as f64 * 1e-9;
        }
        start + busy + super::nanos(lat) - now
    }

    /// `rank` departs now: from where, to where, and the location messages
    /// (from the source). `None`: it stays (no valid worker to go to, or it
    /// is where it should be).
    pub(super) fn depart(
        &mut self,
        rank: Rank,
        now: u64,
        iteration: u64,
    ) -> Option<(Worker, Worker, Outbox)> {
        let from = self.residence[rank];
        let chosen = self.due.remove(&rank)?;
        let to = match chosen {
            Some(w) if self.valid[w] && self.svc[from].is_valid(w) => w,
            // The balancer's choice was warned meanwhile: stay, if here is
            // still valid.
            Some(_) if self.valid[from] => from,
            _ => self.destination(rank, from)?,
        };
        if to == from {
            self.finish_move(rank, 0, Some((now, iteration)));
            return None;
        }
        let msgs = self.svc[from].depart(rank, to).unwrap_or_default();
        self.svc[to].expect(rank);
        self.transit.insert(rank, to);
        Some((from, to, msgs))
    }

    /// Where `rank`, leaving `from`, goes: its home over the workers `from`
    /// believes valid (001 §3.1), if that is on neither `from`'s node nor a
    /// node where one of its checkpoint holders, or a rank whose piece it
    /// holds, resides (else one node's death could take a rank with its
    /// only copy: DESIGN's "no lost data"); otherwise the valid worker on
    /// no such node that hosts the fewest ranks, the first from the home
    /// among equals; the home itself when no worker fits.
    fn destination(&mut self, rank: Rank, from: Worker) -> Option<Worker> {
        let home = self.svc[from].destination(rank).ok()?;
        let mut related: BTreeSet<usize> = BTreeSet::new();
        related.insert(self.node_of_worker(from));
        for h in self.holders[rank].into_iter().flatten() {
            related.insert(self.node_of_worker(self.residence[h]));
        }
        for (q, hs) in self.holders.iter().enumerate() {
            if hs.contains(&Some(rank)) {
                related.insert(self.node_of_worker(self.residence[q]));
            }
        }
        let n = self.valid.len();
        let fits = |w: Worker| {
            self.valid[w] && self.svc[from].is_valid(w) && !related.contains(&(w / self.per_node))
        };
        if fits(home) {
            return Some(home); // 001 §3.1
        }
        // Among those, the one hosting the fewest ranks (those on their
        // way included), so that a node's ranks do not all pile onto the
        // first that fits; the first from the home among equals.
        let mut hosted = vec![0usize; n];
        for (r, &w) in self.residence.iter().enumerate() {
            hosted[self.transit.get(&r).copied().unwrap_or(w)] += 1;
        }
        let best = (0..n)
            .map(|k| (home + k) % n)
            .filter(|&w| fits(w))
            .min_by_key(|&w| hosted[w]);
        Some(best.unwrap_or(home))
    }

    /// `rank` arrived at `to` with `bytes` of state at `now` (iteration
    /// `iteration`): the frames held for it, and whether it must move on.
    pub(super) fn arrive(
        &mut self,
        rank: Rank,
        to: Worker,
        bytes: u64,
        now: u64,
        iteration: u64,
    ) -> (Vec<Routed>, bool) {
        self.transit.remove(&rank);
        self.residence[rank] = to;
        self.packed[rank] = bytes;
        let (_, onward) = self.svc[to].arrive(rank);
        let held = self.held.remove(&(to, rank)).unwrap_or_default();
        self.report.migrations += 1;
        self.report.migrated_bytes += bytes;
        self.finish_move(rank, bytes, Some((now, iteration)));
        if onward {
            self.due.insert(rank, None);
            let e = (self.onward.remove(&rank)).or_else(|| self.warned_by.get(&to).copied());
            if let Some(e) = e {
                self.evacuating.insert(rank, e);
            }
        }
        (held, onward)
    }

    /// Book a finished move of `rank` (`at`: when and in which iteration it
    /// resumed; `None`: it died instead, which cuts its evacuation short).
    fn finish_move(&mut self, rank: Rank, bytes: u64, at: Option<(u64, u64)>) {
        if let Some(e) = self.evacuating.remove(&rank) {
            let ev = &mut self.report.evacuations[e];
            let done = !(self.evacuating.values().chain(self.onward.values())).any(|&x| x == e);
            if let Some((now, iteration)) = at {
                ev.ranks += 1;
                ev.bytes += bytes;
                if done && ev.seconds.is_none() && !self.cut_short.contains(&e) {
                    ev.seconds = Some((now as f64 * 1e-9 - ev.at_s).max(0.0));
                    self.report.evacuated_iteration = Some(iteration);
                }
            } else {
                self.cut_short.insert(e);
            }
            if self.evacuating.is_empty() && self.onward.is_empty() && self.balance != Strategy::Off
            {
                let highest = self.safe_points.iter().copied().max().unwrap_or(0);
                self.balance_at = Some(highest + 1);
            }
        }
        if let Some((_, iteration)) = at
            && self.balancing.remove(&rank)
        {
            self.report.balance_moves += 1;
            self.report.balance_bytes += bytes;
            if self.balancing.is_empty() {
                self.report.balanced_iteration = Some(iteration);
            }
        }
    }

    /// Node `k` died at once: its workers are invalid everywhere, and the
    /// ranks residing there (none after a finished evacuation), or on
    /// their way there, die.
    pub(super) fn node_died(&mut self, k: usize) -> Vec<Rank> {
        let workers: Vec<Worker> = (k * self.per_node..(k + 1) * self.per_node).collect();
        for &w in &workers {
            self.valid[w] = false;
            for s in &mut self.svc {
                // A death is known at once here: the detection delay is
                // the protocol's business.
                let _ = s.on_update(LocationMsg::Evacuation {
                    worker: w,
                    broadcasts: None,
                });
            }
        }
        let victims: Vec<Rank> = (0..self.residence.len())
            .filter(|r| {
                workers.contains(&self.residence[*r])
                    || self.transit.get(r).is_some_and(|to| workers.contains(to))
            })
            .collect();
        if victims.is_empty() {
            self.report.empty_node_deaths += 1;
        }
        for &v in &victims {
            self.rank_died(v);
        }
        victims
    }

    /// `rank` died (a kill of it, or of its node). Its replacement resides
    /// where it was, or where it was going, while that worker is valid,
    /// and else at its destination over the valid workers; a move it was
    /// due is dropped (the replacement may be due again: its worker was
    /// warned), and so is what was held for the dead incarnation.
    pub(super) fn rank_died(&mut self, rank: Rank) {
        let at = match self.transit.remove(&rank) {
            Some(to) => {
                let _ = self.svc[to].arrive(rank);
                self.held.remove(&(to, rank));
                to
            }
            None => self.residence[rank],
        };
        self.residence[rank] = at;
        self.due.remove(&rank);
        self.onward.remove(&rank);
        self.finish_move(rank, 0, None);
        if self.balancing.remove(&rank) && self.balancing.is_empty() {
            self.report.balanced_iteration = self.safe_points.iter().copied().max();
        }
        if self.valid[at] {
            return;
        }
        let Some(to) = self.destination(rank, at) else {
            return; // no valid worker: it stays, and so does the job's fate
        };
        if to != at {
            for (w, msg) in self.svc[at].depart(rank, to).unwrap_or_default() {
                let _ = self.svc[w].on_update(msg);
            }
            self.svc[to].expect(rank);
            let _ = self.svc[to].arrive(rank);
            self.residence[rank] = to;
        }
    }

    /// The report, with the time per iteration.
    pub(super) fn finish(mut self) -> MigrationReport {
        let mut prev = 0;
        self.report.iteration_s = (self.iteration_end.iter())
            .map(|&end| {
                let d = end.saturating_sub(prev);
                prev = prev.max(end);
                d as f64 * 1e-9
            })
            .collect();
        self.report
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, ProtocolKind};

    /// 16 ranks on 8 workers over 4 nodes under `coordinated`.
    fn proactive(warns: &[&str]) -> Box<Proactive> {
        let mut cfg = Config::new(16)
            .backend(Backend::Sim)
            .nodes(4)
            .workers(8)
            .protocol(ProtocolKind::Coordinated);
        for w in warns {
            cfg = cfg.warn(w.parse().expect("warning"));
        }
        Proactive::new(&cfg).expect("valid").expect("workers")
    }

    #[test]
    fn a_rank_on_its_way_to_a_node_that_dies_dies_with_it() {
        let mut m = proactive(&[]);
        m.due.insert(0, Some(4)); // a balancer's move, to node 2
        let (from, to, _) = m.depart(0, 1, 1).expect("moves");
        assert_eq!((from, to), (0, 4));
        let victims = m.node_died(2);
        assert!(victims.contains(&0), "{victims:?}");
        // Its replacement resides on a valid worker.
        assert!(m.valid[m.residence(0)]);
    }

    #[test]
    fn a_replacement_of_a_rank_that_died_moving_to_a_warned_worker_moves_on() {
        let mut m = proactive(&["node:0@i1", "node:1@i1"]);
        let _ = m.warn(0, 0, 1);
        let (_, to, _) = m.depart(0, 1, 1).expect("moves");
        let _ = m.warn(1, 10, 1);
        let victims = m.node_died(0); // dies in transit
        assert!(victims.contains(&0));
        // Wherever the replacement is, it is not on a warned worker.
        assert!(
            m.valid[m.residence(0)],
            "rank 0 on {} (was going to {to})",
            m.residence(0)
        );
        assert!(!m.node_died(1).contains(&0));
    }

    #[test]
    fn ranks_on_their_way_to_a_warned_worker_belong_to_its_evacuation() {
        let mut m = proactive(&["node:0@i1", "node:1@i1"]);
        let _ = m.warn(0, 0, 1);
        let moving: Vec<(Rank, Worker)> = (0..4)
            .map(|r| {
                let (_, to, _) = m.depart(r, 1, 1).expect("moves");
                (r, to)
            })
            .collect();
        let _ = m.warn(1, 10, 1);
        for &(r, to) in &moving {
            let (_, onward) = m.arrive(r, to, 100, 20, 1);
            // Only those that went to node 1 move on.
            assert_eq!(onward, !m.valid[to], "rank {r} to {to}");
        }
        assert_ne!(m.evacuations_in_progress(), 0);
        // Everything due moves; then node 1 dies empty.
        let due: Vec<Rank> = m.due.keys().copied().collect();
        for r in due {
            if let Some((_, to, _)) = m.depart(r, 30, 2) {
                m.arrive(r, to, 100, 40, 2);
            }
        }
        assert_eq!(m.evacuations_in_progress(), 0);
        assert!(m.report.evacuations.iter().all(|e| e.seconds.is_some()));
        assert!(m.node_died(1).is_empty());
        assert!(m.node_died(0).is_empty());
    }

    #[test]
    fn a_balancer_move_to_a_worker_warned_since_stays_and_books_its_iteration() {
        let mut m = proactive(&[]);
        m.balancing.insert(0);
        m.due.insert(0, Some(3));
        m.valid[3] = false;
        let _ = m.svc[0].on_update(LocationMsg::Evacuation {
            worker: 3,
            broadcasts: None,
        });
        assert!(m.depart(0, 5, 7).is_none(), "stays on its valid worker");
        assert_eq!(m.residence(0), 0);
        assert_eq!(m.report.balanced_iteration, Some(7));
    }

    #[test]
    fn an_evacuated_rank_avoids_the_nodes_of_its_checkpoint_holders() {
        // Ranks 4..8 on node 1; their partners are ranks 8..12 on node 2,
        // and they hold the pieces of ranks 0..4 on node 0.
        let mut m = proactive(&["node:1@i1"]);
        let _ = m.warn(0, 0, 1);
        for r in 4..8 {
            let (_, to, _) = m.depart(r, 1, 1).expect("moves");
            assert_eq!(to / 2, 3, "rank {r} sent to worker {to}");
        }
    }
}
