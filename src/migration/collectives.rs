//! Collectives across an evacuation (001 §3.2): the reduction tree repaired
//! around a warned worker, switched to after the highest reduction already
//! started, and the broadcast serializer handed over with its count.
//!
//! Reductions combine the values of a worker's resident ranks, then go up a
//! k-ary tree of workers. A warned worker that is a leaf is deleted from its
//! parent's children; an internal one's children are adopted by its parent
//! (Fig. 3; a warned root's first child becomes the root and adopts its
//! siblings). Only the warned worker, its parent and its children change,
//! so only they must agree when to switch: each uses the new tree for
//! reductions after the highest one any of them has started on the old tree
//! ([`Repair::switch_after`]). Warnings on a worker and on one of its
//! children at once are applied parent first ([`ReductionTree::repair`]).
//!
//! Broadcasts are numbered by a serializer. Its successor is a function of
//! the valid workers (here the home of index 0: [`super::location::index_to_home`]),
//! and a warned serializer piggybacks its count on its evacuation message
//! ([`super::location::LocationMsg::Evacuation`]); the successor continues
//! the numbering from it ([`Serializer`]).

use std::collections::BTreeMap;

use super::location::{Worker, index_to_home};
use crate::{Error, Result};

/// A reduction tree over workers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReductionTree {
    root: Worker,
    parent: BTreeMap<Worker, Worker>,
    children: BTreeMap<Worker, Vec<Worker>>,
}

/// One repair of the tree: the tree before and after, the workers whose
/// parent or children changed, and the reduction after which they switch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repair {
    /// The tree used up to and including reduction `switch_after`.
    pub old: ReductionTree,
    /// The tree used after it.
    pub new: ReductionTree,
    /// Workers whose links changed (the warned ones, their parents and
    /// their children).
    pub affected: Vec<Worker>,
    /// The highest reduction any affected worker had started on the old
    /// tree.
    pub switch_after: u64,
}

impl Repair {
    /// The tree reduction `index` uses.
    pub fn tree_for(&self, index: u64) -> &ReductionTree {
        if index <= self.switch_after {
            &self.old
        } else {
            &self.new
        }
    }
}

impl ReductionTree {
    /// The k-ary tree over `workers` workers rooted at 0 (worker w's parent
    /// is (w − 1) / k).
    pub fn k_ary(workers: usize, k: usize) -> Result<Self> {
        if workers == 0 || k == 0 {
            return Err(Error::Unrecoverable(
                format!("a {k}-ary reduction tree over {workers} workers").into(),
            ));
        }
        let mut t = ReductionTree {
            root: 0,
            parent: BTreeMap::new(),
            children: (0..workers).map(|w| (w, Vec::new())).collect(),
        };
        for w in 1..workers {
            let p = (w - 1) / k;
            t.parent.insert(w, p);
            t.children.entry(p).or_default().push(w);
        }
        Ok(t)
    }

    /// The root.
    pub fn root(&self) -> Worker {
        self.root
    }

    /// `w`'s parent (none for the root or a worker not in the tree).
    pub fn parent(&self, w: Worker) -> Option<Worker> {
        self.parent.get(&w).copied()
    }

    /// `w`'s children.
    pub fn children(&self, w: Worker) -> &[Worker] {
        self.children.get(&w).map_or(&[], Vec::as_slice)
    }

    /// Whether `w` is in the tree.
    pub fn contains(&self, w: Worker) -> bool {
        self.children.contains_key(&w)
    }

    /// Workers in the tree.
    pub fn len(&self) -> usize {
        self.children.len()
    }

    /// Whether the tree has no worker.
    pub fn is_empty(&self) -> bool {
        self.children.is_empty()
    }

    fn depth(&self, mut w: Worker) -> usize {
        let mut d = 0;
        while let Some(p) = self.parent(w) {
            w = p;
            d += 1;
        }
        d
    }

    /// Take `w` out (Fig. 3): a leaf leaves its parent's children; an
    /// internal worker's children are adopted by its parent, in its place;
    /// a root's first child becomes the root and adopts the others.
    /// Returns the workers whose links changed.
    fn remove(&mut self, w: Worker) -> Result<Vec<Worker>> {
        let Some(kids) = self.children.remove(&w) else {
            return Ok(Vec::new());
        };
        let mut affected = vec![w];
        affected.extend(kids.iter().copied());
        match self.parent.remove(&w) {
            Some(p) => {
                affected.push(p);
                let siblings = self.children.entry(p).or_default();
                let at = siblings
                    .iter()
                    .position(|&c| c == w)
                    .unwrap_or(siblings.len());
                siblings.splice(at..(at + 1).min(siblings.len()), kids.iter().copied());
                for &c in &kids {
                    self.parent.insert(c, p);
                }
            }
            None => {
                let Some((&first, rest)) = kids.split_first() else {
                    return Err(Error::Unrecoverable(
                        "every worker of the reduction tree is warned".into(),
                    ));
                };
                self.root = first;
                self.parent.remove(&first);
                for &c in rest {
                    self.parent.insert(c, first);
                    self.children.entry(first).or_default().push(c);
                }
            }
        }
        Ok(affected)
    }

    /// Repair the tree around the `warned` workers, parents before their
    /// children, switching after the highest reduction `started` by any
    /// affected worker (each worker's highest started reduction; a worker
    /// missing from it started none).
    pub fn repair(&self, warned: &[Worker], started: &BTreeMap<Worker, u64>) -> Result<Repair> {
        let mut order: Vec<Worker> = warned
            .iter()
            .copied()
            .filter(|&w| self.contains(w))
            .collect();
        order.sort_by_key(|&w| (self.depth(w), w));
        order.dedup();
        let mut new = self.clone();
        let mut affected = Vec::new();
        for w in order {
            affected.extend(new.remove(w)?);
        }
        affected.sort_unstable();
        affected.dedup();
        let switch_after = (affected.iter())
            .filter_map(|w| started.get(w))
            .copied()
            .max()
            .unwrap_or(0);
        Ok(Repair {
            old: self.clone(),
            new,
            affected,
            switch_after,
        })
    }
}

/// The broadcast serializer of 001 §3.2: numbers broadcasts; its role moves
/// with evacuations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serializer {
    /// The worker that numbers broadcasts now.
    pub worker: Worker,
    /// Broadcasts numbered so far.
    pub count: u64,
}

impl Serializer {
    /// The serializer over the `valid` workers (`size_of_node` a node): the
    /// home of index 0, a predetermined function of the valid set.
    pub fn over(valid: &[bool], size_of_node: usize) -> Result<Self> {
        Ok(Serializer {
            worker: index_to_home(0, valid, size_of_node)?,
            count: 0,
        })
    }

    /// Number the next broadcast.
    pub fn number(&mut self) -> u64 {
        self.count += 1;
        self.count
    }

    /// The serializer after `warned` was evacuated, `piggybacked` being the
    /// count its evacuation message carried (present when `warned` was the
    /// serializer).
    pub fn after_evacuation(
        &self,
        valid: &[bool],
        size_of_node: usize,
        piggybacked: Option<u64>,
    ) -> Result<Self> {
        Ok(Serializer {
            worker: index_to_home(0, valid, size_of_node)?,
            count: piggybacked.unwrap_or(self.count).max(self.count),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(pairs: &[(Worker, u64)]) -> BTreeMap<Worker, u64> {
        pairs.iter().copied().collect()
    }

    #[test]
    fn a_warned_leaf_leaves_its_parent_only() {
        let t = ReductionTree::k_ary(7, 2).unwrap(); // 0:{1,2} 1:{3,4} 2:{5,6}
        let r = t
            .repair(&[4], &started(&[(4, 9), (1, 8), (0, 20)]))
            .unwrap();
        assert_eq!(r.new.children(1), &[3]);
        assert_eq!(r.affected, vec![1, 4]);
        assert_eq!(r.switch_after, 9, "worker 0 is not affected");
        assert!(!r.new.contains(4));
    }

    #[test]
    fn a_warned_internal_workers_children_are_adopted_by_its_parent() {
        // Fig. 3: worker 1 is warned.
        let t = ReductionTree::k_ary(7, 2).unwrap();
        let r = t.repair(&[1], &started(&[(1, 4), (3, 5), (0, 3)])).unwrap();
        assert_eq!(r.new.children(0), &[3, 4, 2]);
        assert_eq!(r.new.parent(3), Some(0));
        assert_eq!(r.new.parent(4), Some(0));
        assert_eq!(r.affected, vec![0, 1, 3, 4]);
        assert_eq!(r.switch_after, 5);
        assert_eq!(r.tree_for(5), &t);
        assert_eq!(r.tree_for(6), &r.new);
        // Nothing else moved.
        assert_eq!(r.new.children(2), t.children(2));
    }

    #[test]
    fn a_warned_root_hands_the_tree_to_its_first_child() {
        let t = ReductionTree::k_ary(7, 2).unwrap();
        let r = t.repair(&[0], &BTreeMap::new()).unwrap();
        assert_eq!(r.new.root(), 1);
        assert_eq!(r.new.children(1), &[3, 4, 2]);
        assert_eq!(r.new.parent(2), Some(1));
        assert_eq!(r.new.len(), 6);
    }

    #[test]
    fn a_worker_and_its_child_warned_together_repair_parent_first() {
        // 1 and its child 3 at once: 1's children go to 0, then 3 (now 0's
        // child, a leaf) leaves 0.
        let t = ReductionTree::k_ary(7, 2).unwrap();
        for warned in [[1, 3], [3, 1]] {
            let r = t.repair(&warned, &BTreeMap::new()).unwrap();
            assert_eq!(r.new.children(0), &[4, 2], "{warned:?}");
            assert_eq!(r.new.len(), 5);
            // Every remaining worker reaches the root.
            for w in [2, 4, 5, 6] {
                let mut x = w;
                while let Some(p) = r.new.parent(x) {
                    x = p;
                }
                assert_eq!(x, 0);
            }
        }
        let all: Vec<Worker> = (0..7).collect();
        assert!(t.repair(&all, &BTreeMap::new()).is_err());
    }

    #[test]
    fn the_serializer_moves_with_its_count() {
        let mut valid = vec![true; 8];
        let mut s = Serializer::over(&valid, 2).unwrap();
        assert_eq!(s.worker, 0);
        for _ in 0..5 {
            s.number();
        }
        valid[0] = false;
        let s2 = s.after_evacuation(&valid, 2, Some(5)).unwrap();
        assert_eq!((s2.worker, s2.count), (2, 5));
        // A worker that saw fewer broadcasts takes the piggybacked count.
        let behind = Serializer {
            worker: 0,
            count: 3,
        };
        assert_eq!(
            behind.after_evacuation(&valid, 2, Some(5)).unwrap().count,
            5
        );
    }
}
