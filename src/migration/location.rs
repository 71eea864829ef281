//! The location service of 001 §3.1: where a migratable rank can be
//! reached while ranks move between workers.
//!
//! Every rank (001's *object*, identified by its index) has a **home**
//! worker given by the index-to-home function over the valid workers
//! ([`index_to_home`]); the home always knows where its ranks are. A rank
//! need not reside at its home. A worker sends a message for rank X to
//! where it last heard X is, or else to X's home; a worker that receives a
//! message for a rank that left forwards it to the rank's last known
//! location (its forwarding pointer), and the worker that finally delivers
//! a forwarded message sends the original sender a **routing update**, so
//! that later messages go straight there (Fig. 1).
//!
//! A **warned** worker E (a fault is imminent) sends an **evacuation**
//! message to every valid worker and to those that began evacuating
//! recently, stops being valid, and moves each of its resident ranks to the
//! rank's home over the remaining valid workers (Fig. 2): the ranks homed at
//! E are now homed elsewhere, and E hands each new home what it knew of
//! where those ranks are. Two simultaneous warnings need no arbiter: a
//! worker chooses a moving rank's destination when the rank departs, over
//! the workers it still believes valid, and a rank that arrives at a worker
//! that was warned meanwhile moves on (001 §3.1's H and J).
//!
//! This module is a state machine per worker, from events to messages: it
//! owns no thread, socket or clock (DESIGN principle 1), like a protocol.
//! The driver carries [`LocationMsg`]s between workers and moves the packed
//! ranks themselves.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde::{Deserialize, Serialize};

use crate::{Error, Rank, Result};

/// A worker: a process (or thread group, or simulated entity) that hosts
/// rank engines. 001's *processor*.
pub type Worker = usize;

/// 001 §3.1's index-to-home mapping: the home of `index` over the workers
/// whose `valid` entry is true, with `size_of_node` workers per node.
///
/// Start at `index mod W`; while that worker is not valid, step to the
/// worker at the same position on the next node; coming back to the
/// starting node means no node has a valid worker at that position, which
/// the paper treats as fatal ("No valid node left"): here an
/// [`Error::Unrecoverable`], on which the caller falls back to its reactive
/// protocol.
pub fn index_to_home(index: usize, valid: &[bool], size_of_node: usize) -> Result<Worker> {
    let n = valid.len();
    if n == 0 || size_of_node == 0 || !n.is_multiple_of(size_of_node) {
        return Err(Error::Unrecoverable(
            format!(
                "index-to-home over {n} workers with {size_of_node} a node: the workers must \
                 fill whole nodes"
            )
            .into(),
        ));
    }
    let start = index % n;
    let mut possible = start;
    while !valid[possible] {
        possible = (possible + size_of_node) % n;
        if possible / size_of_node == start / size_of_node {
            return Err(Error::Unrecoverable(
                format!(
                    "no valid node left for rank {index}: every node's worker {} is warned \
                     (001 §3.1)",
                    start % size_of_node
                )
                .into(),
            ));
        }
    }
    Ok(possible)
}

/// Where each rank starts: in blocks of consecutive ranks over the workers
/// (the first `ranks % workers` workers host one more).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BlockLayout {
    /// Ranks of the job.
    pub ranks: usize,
    /// Workers of the job.
    pub workers: usize,
}

impl BlockLayout {
    /// The worker rank `r` starts on.
    pub fn worker_of(&self, r: Rank) -> Worker {
        let (q, rem) = (self.ranks / self.workers, self.ranks % self.workers);
        let big = rem * (q + 1);
        if r < big {
            r / (q + 1)
        } else {
            rem + (r - big) / q.max(1)
        }
    }

    /// The ranks worker `w` starts with.
    pub fn ranks_of(&self, w: Worker) -> std::ops::Range<Rank> {
        let (q, rem) = (self.ranks / self.workers, self.ranks % self.workers);
        let start = w * q + w.min(rem);
        start..start + q + usize::from(w < rem)
    }
}

/// What workers tell each other about locations.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum LocationMsg {
    /// To a message's original sender: `rank` is reached at `at` (Fig. 1).
    RoutingUpdate {
        /// The rank.
        rank: Rank,
        /// Where it resides now.
        at: Worker,
    },
    /// To a rank's home: the rank now resides at `at`.
    MigrationUpdate {
        /// The rank.
        rank: Rank,
        /// Where it resides now.
        at: Worker,
    },
    /// From a warned worker to every valid worker (and those evacuating
    /// recently): it is no longer valid (Fig. 2). `broadcasts` carries the
    /// broadcast count when the warned worker was the serializer (§3.2).
    Evacuation {
        /// The warned worker.
        worker: Worker,
        /// The serializer's broadcast count, if the warned worker was it.
        broadcasts: Option<u64>,
    },
    /// From a warned worker to the new home of ranks it was home for:
    /// where it last knew each of them to be.
    HomeHandover {
        /// (rank, location) pairs.
        located: Vec<(Rank, Worker)>,
    },
}

/// What a worker does with a message for a rank that arrived there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Arrival {
    /// The rank resides here: deliver it. `update` is the routing update to
    /// send the original sender when the message was forwarded.
    Deliver {
        /// `(original sender's worker, update)`, for a forwarded message.
        update: Option<(Worker, LocationMsg)>,
    },
    /// The rank is on its way here: keep the message until it arrives
    /// ([`LocationService::arrive`] returns it).
    Hold,
    /// Forward the message (one more hop) to this worker.
    Forward(Worker),
}

/// A message in the location service's terms: for whom, from which worker
/// first, and after how many forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Envelope {
    /// The destination rank.
    pub dest: Rank,
    /// The worker that sent it first.
    pub origin: Worker,
    /// Forwards so far.
    pub hops: u32,
}

/// Counters of one worker's location service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LocationStats {
    /// Messages this worker forwarded.
    pub forwarded: u64,
    /// Routing updates it sent.
    pub routing_updates: u64,
    /// Messages it held for a rank on its way here.
    pub held: u64,
}

/// One worker's view of where ranks are (001 §3.1).
#[derive(Debug, Clone)]
pub struct LocationService {
    me: Worker,
    size_of_node: usize,
    layout: BlockLayout,
    valid: Vec<bool>,
    /// Workers that announced their evacuation: they still get ours, in
    /// case they had not heard of our warning when they chose where to send
    /// their ranks (§3.1, last paragraph).
    evacuating: BTreeSet<Worker>,
    /// The index-to-home mapping, derived once per rank and repopulated on
    /// every evacuation message (the paper's hashtable).
    homes: HashMap<Rank, Worker>,
    /// Ranks residing here beyond the layout's: arrived by migration.
    arrived: BTreeSet<Rank>,
    /// Ranks of the layout's block here that left, with where they went
    /// (forwarding pointers; also for ranks that arrived and left again).
    departed: HashMap<Rank, Worker>,
    /// Ranks on their way here, with the messages held for them.
    incoming: BTreeMap<Rank, Vec<Envelope>>,
    /// As the home: where each homed rank resides, where that differs from
    /// the layout.
    located: HashMap<Rank, Worker>,
    /// Routing cache: where a rank was last reported to reside.
    known: HashMap<Rank, Worker>,
    stats: LocationStats,
}

impl LocationService {
    /// Worker `me` of `layout.workers`, `size_of_node` workers a node, every
    /// rank where the layout puts it.
    pub fn new(me: Worker, layout: BlockLayout, size_of_node: usize) -> Result<Self> {
        index_to_home(0, &vec![true; layout.workers], size_of_node)?;
        if me >= layout.workers || layout.ranks < layout.workers {
            return Err(Error::Unrecoverable(
                format!(
                    "worker {me} of {} hosting {} ranks: every worker needs a rank",
                    layout.workers, layout.ranks
                )
                .into(),
            ));
        }
        Ok(LocationService {
            me,
            size_of_node,
            layout,
            valid: vec![true; layout.workers],
            evacuating: BTreeSet::new(),
            homes: HashMap::new(),
            arrived: BTreeSet::new(),
            departed: HashMap::new(),
            incoming: BTreeMap::new(),
            located: HashMap::new(),
            known: HashMap::new(),
            stats: LocationStats::default(),
        })
    }

    /// This worker.
    pub fn me(&self) -> Worker {
        self.me
    }

    /// Whether `w` is valid as far as this worker knows.
    pub fn is_valid(&self, w: Worker) -> bool {
        self.valid.get(w).copied().unwrap_or(false)
    }

    /// Counters so far.
    pub fn stats(&self) -> LocationStats {
        self.stats
    }

    /// The home of `rank` over the workers valid here.
    pub fn home(&mut self, rank: Rank) -> Result<Worker> {
        if let Some(&h) = self.homes.get(&rank) {
            return Ok(h);
        }
        let h = index_to_home(rank, &self.valid, self.size_of_node)?;
        self.homes.insert(rank, h);
        Ok(h)
    }

    /// Whether `rank` resides here.
    pub fn resides(&self, rank: Rank) -> bool {
        self.arrived.contains(&rank)
            || (self.layout.worker_of(rank) == self.me && !self.departed.contains_key(&rank))
    }

    /// The ranks residing here, in order.
    pub fn residents(&self) -> Vec<Rank> {
        let mut r: Vec<Rank> = (self.layout.ranks_of(self.me))
            .filter(|r| !self.departed.contains_key(r))
            .chain(self.arrived.iter().copied())
            .collect();
        r.sort_unstable();
        r
    }

    /// Where to send a new message for `dest` from here.
    pub fn route(&mut self, dest: Rank) -> Result<Worker> {
        if self.resides(dest) {
            return Ok(self.me);
        }
        if let Some(&w) = self.known.get(&dest) {
            return Ok(w);
        }
        if let Some(&w) = self.departed.get(&dest) {
            return Ok(w);
        }
        self.home(dest)
    }

    /// A message `env` reached this worker: deliver, hold or forward it.
    pub fn on_message(&mut self, env: Envelope) -> Result<Arrival> {
        if self.resides(env.dest) {
            let update = (env.hops > 0 && env.origin != self.me).then(|| {
                self.stats.routing_updates += 1;
                (
                    env.origin,
                    LocationMsg::RoutingUpdate {
                        rank: env.dest,
                        at: self.me,
                    },
                )
            });
            return Ok(Arrival::Deliver { update });
        }
        if let Some(held) = self.incoming.get_mut(&env.dest) {
            held.push(env);
            self.stats.held += 1;
            return Ok(Arrival::Hold);
        }
        let next = match self.departed.get(&env.dest) {
            Some(&w) => w,
            None => {
                let home = self.home(env.dest)?;
                if home == self.me {
                    // As its home: where it was last reported.
                    (self.located.get(&env.dest).copied())
                        .unwrap_or_else(|| self.layout.worker_of(env.dest))
                } else {
                    home
                }
            }
        };
        if next == self.me {
            // The layout says here, yet it is neither here nor on its way:
            // only a stale view could say so; its home knows better.
            return Err(Error::Driver(format!(
                "worker {}: a message for rank {} that this worker can neither deliver nor \
                 forward",
                self.me, env.dest
            )));
        }
        self.stats.forwarded += 1;
        Ok(Arrival::Forward(next))
    }

    /// A routing or migration update, an evacuation or a home handover from
    /// another worker. Returns what to send in turn.
    pub fn on_update(&mut self, msg: LocationMsg) -> Result<Vec<(Worker, LocationMsg)>> {
        match msg {
            LocationMsg::RoutingUpdate { rank, at } => {
                self.known.insert(rank, at);
            }
            LocationMsg::MigrationUpdate { rank, at } => {
                self.known.insert(rank, at);
                if self.home(rank)? == self.me {
                    self.located.insert(rank, at);
                } else if !self.is_valid(self.me) {
                    // A warned worker homes nothing any more: the rank's
                    // new home must learn it.
                    let home = self.home(rank)?;
                    return Ok(vec![(home, LocationMsg::MigrationUpdate { rank, at })]);
                }
            }
            LocationMsg::Evacuation { worker, .. } => {
                return self.on_evacuation(worker);
            }
            LocationMsg::HomeHandover { located } => {
                for (rank, at) in located {
                    self.located.insert(rank, at);
                }
            }
        }
        Ok(Vec::new())
    }

    /// `worker` announced its evacuation: it is no longer valid, and the
    /// ranks homed there have new homes.
    fn on_evacuation(&mut self, worker: Worker) -> Result<Vec<(Worker, LocationMsg)>> {
        if let Some(v) = self.valid.get_mut(worker) {
            *v = false;
        }
        self.evacuating.insert(worker);
        self.homes.clear();
        // A routing entry to the warned worker is stale once its ranks go;
        // its forwarding pointers still lead on, so dropping ours is only
        // an optimisation: the next message goes to the new home.
        self.known.retain(|_, w| *w != worker);
        Ok(Vec::new())
    }

    /// This worker is warned: it announces its evacuation and stops being
    /// valid. Returns the messages to send (the evacuation to every valid
    /// worker and those evacuating recently, and the home handovers); the
    /// caller then moves every resident rank, each to
    /// [`LocationService::destination`] when it departs.
    pub fn warn(&mut self, broadcasts: Option<u64>) -> Result<Vec<(Worker, LocationMsg)>> {
        if !self.is_valid(self.me) {
            return Ok(Vec::new()); // warned already
        }
        let receivers: Vec<Worker> = (0..self.valid.len())
            .filter(|&w| w != self.me && (self.valid[w] || self.evacuating.contains(&w)))
            .collect();
        self.valid[self.me] = false;
        self.homes.clear();
        let mut out: Vec<(Worker, LocationMsg)> = receivers
            .into_iter()
            .map(|w| {
                (
                    w,
                    LocationMsg::Evacuation {
                        worker: self.me,
                        broadcasts,
                    },
                )
            })
            .collect();
        // What this worker knew as a home goes to each rank's new home.
        let mut handover: BTreeMap<Worker, Vec<(Rank, Worker)>> = BTreeMap::new();
        let mut located: Vec<(Rank, Worker)> = self.located.drain().collect();
        located.sort_unstable();
        for (rank, at) in located {
            handover
                .entry(self.home(rank)?)
                .or_default()
                .push((rank, at));
        }
        out.extend(
            handover
                .into_iter()
                .map(|(w, located)| (w, LocationMsg::HomeHandover { located })),
        );
        Ok(out)
    }

    /// Where a rank departing from here goes now: its home over the workers
    /// valid as far as this worker knows.
    pub fn destination(&mut self, rank: Rank) -> Result<Worker> {
        self.home(rank)
    }

    /// `rank` leaves this worker for `to` (packed; it resumes there).
    /// Returns the migration update for its home (unless that is here).
    pub fn depart(&mut self, rank: Rank, to: Worker) -> Result<Vec<(Worker, LocationMsg)>> {
        self.arrived.remove(&rank);
        self.departed.insert(rank, to);
        self.known.insert(rank, to);
        let home = self.home(rank)?;
        if home == self.me {
            self.located.insert(rank, to);
            return Ok(Vec::new());
        }
        Ok(vec![(home, LocationMsg::MigrationUpdate { rank, at: to })])
    }

    /// `rank` is on its way here: messages for it are held until it
    /// arrives.
    pub fn expect(&mut self, rank: Rank) {
        self.incoming.entry(rank).or_default();
    }

    /// `rank` arrived and resumes here. Returns the messages held for it
    /// and whether it must move on at once (this worker was warned while it
    /// travelled).
    pub fn arrive(&mut self, rank: Rank) -> (Vec<Envelope>, bool) {
        let held = self.incoming.remove(&rank).unwrap_or_default();
        self.departed.remove(&rank);
        self.known.remove(&rank);
        if self.layout.worker_of(rank) != self.me {
            self.arrived.insert(rank);
        }
        (held, !self.is_valid(self.me))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(ranks: usize, workers: usize) -> BlockLayout {
        BlockLayout { ranks, workers }
    }

    #[test]
    fn index_to_home_steps_to_the_same_position_on_the_next_node() {
        // 8 workers, 2 a node: nodes {0,1} {2,3} {4,5} {6,7}.
        let mut valid = vec![true; 8];
        assert_eq!(index_to_home(13, &valid, 2).unwrap(), 5);
        valid[5] = false;
        assert_eq!(index_to_home(13, &valid, 2).unwrap(), 7);
        valid[7] = false;
        assert_eq!(index_to_home(13, &valid, 2).unwrap(), 1);
        valid[1] = false;
        valid[3] = false;
        // Worker position 1 is warned on every node: the paper aborts,
        // even though position 0 workers are valid.
        let e = index_to_home(13, &valid, 2).unwrap_err();
        assert!(e.to_string().contains("no valid node left"), "{e}");
        assert_eq!(index_to_home(12, &valid, 2).unwrap(), 4);
        assert!(
            index_to_home(1, &[true; 5], 2).is_err(),
            "5 workers in nodes of 2"
        );
    }

    #[test]
    fn block_layout_covers_every_rank_once() {
        for (ranks, workers) in [(16, 8), (17, 8), (8, 8), (100, 7)] {
            let l = layout(ranks, workers);
            let mut seen = vec![0; ranks];
            for w in 0..workers {
                for r in l.ranks_of(w) {
                    assert_eq!(l.worker_of(r), w, "{ranks}/{workers}: rank {r}");
                    seen[r] += 1;
                }
            }
            assert!(seen.iter().all(|&c| c == 1), "{ranks}/{workers}");
        }
    }

    /// Workers of a little cluster, with messages carried by hand.
    struct Cluster {
        svc: Vec<LocationService>,
    }

    impl Cluster {
        fn new(ranks: usize, workers: usize, per_node: usize) -> Self {
            let l = layout(ranks, workers);
            Cluster {
                svc: (0..workers)
                    .map(|w| LocationService::new(w, l, per_node).unwrap())
                    .collect(),
            }
        }

        fn post(&mut self, msgs: Vec<(Worker, LocationMsg)>) {
            let mut q = std::collections::VecDeque::from(msgs);
            while let Some((w, m)) = q.pop_front() {
                q.extend(self.svc[w].on_update(m).unwrap());
            }
        }

        /// Send a message for `dest` from worker `from`; returns the
        /// workers it visited, the last one delivering it.
        fn send(&mut self, from: Worker, dest: Rank) -> Vec<Worker> {
            let mut at = self.svc[from].route(dest).unwrap();
            let mut env = Envelope {
                dest,
                origin: from,
                hops: 0,
            };
            let mut path = vec![at];
            loop {
                match self.svc[at].on_message(env).unwrap() {
                    Arrival::Deliver { update } => {
                        if let Some(u) = update {
                            self.post(vec![u]);
                        }
                        return path;
                    }
                    Arrival::Forward(next) => {
                        env.hops += 1;
                        at = next;
                        path.push(at);
                        assert!(path.len() < 10, "a forwarding loop: {path:?}");
                    }
                    Arrival::Hold => panic!("held at {at}"),
                }
            }
        }

        /// Move `rank` from `from` to `to` now.
        fn migrate(&mut self, rank: Rank, from: Worker, to: Worker) {
            self.svc[to].expect(rank);
            let ups = self.svc[from].depart(rank, to).unwrap();
            let (held, onward) = self.svc[to].arrive(rank);
            assert!(held.is_empty());
            assert!(!onward);
            self.post(ups);
        }

        /// Warn `w` and evacuate its residents to their new homes.
        fn warn(&mut self, w: Worker) {
            let msgs = self.svc[w].warn(None).unwrap();
            self.post(msgs);
            for r in self.svc[w].residents() {
                let to = self.svc[w].destination(r).unwrap();
                self.migrate(r, w, to);
            }
        }
    }

    #[test]
    fn a_forwarded_message_brings_a_routing_update_and_the_next_goes_direct() {
        // Fig. 1: X (rank 2, home 2 with 4 workers) resides on worker 1
        // (block layout: 8 ranks on 4 workers), then migrates to 3.
        let mut c = Cluster::new(8, 4, 1);
        assert!(c.svc[1].resides(2));
        assert_eq!(c.send(0, 2), vec![2, 1], "home forwards to where X is");
        assert_eq!(c.send(0, 2), vec![1], "the routing update was heeded");
        c.migrate(2, 1, 3);
        assert_eq!(c.send(0, 2), vec![1, 3], "the last known location forwards");
        assert_eq!(c.send(0, 2), vec![3]);
        assert_eq!(c.send(3, 2), vec![3], "local");
        // A worker that never talked to X asks the home, which heard of
        // the migration.
        assert_eq!(
            c.send(1, 2),
            vec![3],
            "worker 1 kept its forwarding pointer"
        );
        let fresh = LocationService::new(0, layout(8, 4), 1).unwrap();
        c.svc[0] = fresh;
        assert_eq!(c.send(0, 2), vec![2, 3]);
        let forwarded: u64 = c.svc.iter().map(|s| s.stats().forwarded).sum();
        let updates: u64 = c.svc.iter().map(|s| s.stats().routing_updates).sum();
        assert_eq!((forwarded, updates), (3, 3));
    }

    #[test]
    fn an_evacuated_worker_is_never_a_destination_and_messages_still_arrive() {
        // Fig. 2: 16 ranks on 8 workers over 4 nodes (2 a node); warn node
        // 1 (workers 2 and 3) at once.
        let mut c = Cluster::new(16, 8, 2);
        c.warn(2);
        c.warn(3);
        for w in 0..8 {
            let r = c.svc[w].residents();
            if w == 2 || w == 3 {
                assert!(r.is_empty(), "worker {w} still hosts {r:?}");
            }
        }
        for from in [0, 1, 4, 7] {
            for dest in 0..16 {
                let path = c.send(from, dest);
                let last = *path.last().unwrap();
                assert!(c.svc[last].resides(dest));
                assert!(
                    last != 2 && last != 3,
                    "rank {dest} delivered on warned {last}"
                );
                // The second message goes straight there.
                assert_eq!(c.send(from, dest), vec![last], "rank {dest} from {from}");
            }
        }
        // Every rank resides on exactly one worker.
        let mut all: Vec<Rank> = (0..8).flat_map(|w| c.svc[w].residents()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..16).collect::<Vec<_>>());
    }

    #[test]
    fn simultaneous_warnings_send_nothing_to_a_worker_known_warned() {
        // §3.1's H and J: J (worker 1) hears H's (worker 3) evacuation
        // before choosing where its ranks go, so none goes to H.
        let mut c = Cluster::new(8, 4, 1);
        let h = c.svc[3].warn(None).unwrap();
        assert!(h.iter().any(|(w, _)| *w == 1));
        c.post(h);
        let j = c.svc[1].warn(None).unwrap();
        // H evacuates too, so it still gets J's evacuation message.
        assert!(j.iter().any(|(w, _)| *w == 3), "{j:?}");
        c.post(j);
        for r in c.svc[1].residents() {
            let to = c.svc[1].destination(r).unwrap();
            assert!(to != 3 && to != 1, "rank {r} sent to {to}");
        }
    }

    #[test]
    fn a_rank_arriving_at_a_worker_warned_meanwhile_moves_on_and_held_messages_follow() {
        let mut c = Cluster::new(8, 4, 1);
        // Rank 0 travels from worker 0 to worker 3 (its home is 0; say a
        // balancer sent it); worker 3 is warned before it arrives.
        c.svc[3].expect(0);
        let ups = c.svc[0].depart(0, 3).unwrap();
        c.post(ups);
        assert_eq!(
            c.svc[3]
                .on_message(Envelope {
                    dest: 0,
                    origin: 1,
                    hops: 1
                })
                .unwrap(),
            Arrival::Hold
        );
        let msgs = c.svc[3].warn(None).unwrap();
        c.post(msgs);
        let (held, onward) = c.svc[3].arrive(0);
        assert_eq!(held.len(), 1);
        assert!(onward, "a warned worker passes an arriving rank on");
        let to = c.svc[3].destination(0).unwrap();
        assert_ne!(to, 3);
        c.migrate(0, 3, to);
        assert_eq!(*c.send(1, 0).last().unwrap(), to);
        assert_eq!(c.svc[3].stats().held, 1);
    }

    use proptest::prelude::{ProptestConfig, any, prop_assert, prop_assert_eq, proptest};

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Whatever ranks move, and whichever workers are warned, with
        /// location messages delivered late and out of order: every message
        /// reaches the worker where its rank resides, in few hops, and no
        /// warned worker ends up hosting a rank.
        #[test]
        fn every_message_reaches_its_rank(
            steps in proptest::collection::vec((0usize..4, 0usize..16, 0usize..8, any::<bool>()), 1..40),
        ) {
            let (ranks, workers, per_node) = (16, 8, 2);
            let mut c = Cluster::new(ranks, workers, per_node);
            let mut late: Vec<(Worker, LocationMsg)> = Vec::new();
            let mut warned = 0;
            let mut moves = 0;
            for (kind, rank, w, deliver_now) in steps {
                match kind {
                    // Migrate `rank` to worker `w` (a balancer's move).
                    0 | 1 => {
                        let from = (0..workers).find(|&x| c.svc[x].resides(rank)).unwrap();
                        if from != w && c.svc[w].is_valid(w) {
                            moves += 1;
                            c.svc[w].expect(rank);
                            late.extend(c.svc[from].depart(rank, w).unwrap());
                            let (_, onward) = c.svc[w].arrive(rank);
                            prop_assert!(!onward);
                        }
                    }
                    // Warn worker `w` (at most 4 of the 8: some node keeps a
                    // valid worker at each position).
                    2 if warned < 3 && c.svc[w].is_valid(w) && w % 2 == 0 => {
                        warned += 1;
                        let msgs = c.svc[w].warn(None).unwrap();
                        c.post(msgs);
                        c.post(std::mem::take(&mut late));
                        for r in c.svc[w].residents() {
                            let to = c.svc[w].destination(r).unwrap();
                            prop_assert!(c.svc[to].is_valid(to), "rank {} to warned {}", r, to);
                            moves += 1;
                            c.svc[to].expect(r);
                            late.extend(c.svc[w].depart(r, to).unwrap());
                            c.svc[to].arrive(r);
                        }
                    }
                    _ => {
                        let from = w;
                        let path = c.send(from, rank);
                        let last = *path.last().unwrap();
                        prop_assert!(c.svc[last].resides(rank));
                        // A forwarding chain follows the moves whose updates
                        // are still in flight: never longer than the moves
                        // so far, plus the home and the last location.
                        prop_assert!(path.len() <= moves + 2, "path {:?} after {} moves", path, moves);
                    }
                }
                if deliver_now {
                    c.post(std::mem::take(&mut late));
                }
            }
            c.post(late);
            for dest in 0..ranks {
                for from in 0..workers {
                    let path = c.send(from, dest);
                    prop_assert!(c.svc[*path.last().unwrap()].resides(dest));
                }
            }
            let mut all: Vec<Rank> = (0..workers).flat_map(|w| c.svc[w].residents()).collect();
            all.sort_unstable();
            prop_assert_eq!(all, (0..ranks).collect::<Vec<_>>());
            for w in 0..workers {
                if !c.svc[w].is_valid(w) {
                    prop_assert!(c.svc[w].residents().is_empty());
                }
            }
        }
    }
}
