//! Placement of ranks into failure domains ("nodes").
//!
//! Ranks are placed in blocks: with `P` ranks and `K` nodes, node `k` hosts
//! ranks `k*ceil(P/K) ..`. A node failure kills every rank on it at once
//! (DESIGN principle 6), so redundancy (the partner copy of a checkpoint) is
//! always placed on another node when there is one.

use crate::{Error, Rank, Result};

/// Block placement of `ranks` ranks on `nodes` failure domains.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    ranks: usize,
    nodes: usize,
    per_node: usize,
}

impl Placement {
    /// Place `ranks` ranks on `nodes` nodes in blocks.
    pub fn block(ranks: usize, nodes: usize) -> Result<Self> {
        if ranks == 0 {
            return Err(Error::config("ranks", "at least one rank is needed"));
        }
        if nodes == 0 || nodes > ranks {
            return Err(Error::config(
                "nodes",
                format!("{nodes} nodes cannot host {ranks} ranks (need 1 ..= ranks)"),
            ));
        }
        Ok(Placement {
            ranks,
            nodes,
            per_node: ranks.div_ceil(nodes),
        })
    }

    /// Number of ranks.
    pub fn ranks(&self) -> usize {
        self.ranks
    }

    /// Number of failure domains.
    pub fn nodes(&self) -> usize {
        self.nodes
    }

    /// The node hosting `rank`.
    pub fn node_of(&self, rank: Rank) -> usize {
        (rank / self.per_node).min(self.nodes - 1)
    }

    /// The ranks hosted on `node`, in order.
    pub fn ranks_on(&self, node: usize) -> Vec<Rank> {
        self.range_on(node).collect()
    }

    /// The ranks hosted on `node`, a block (the last node takes the rest;
    /// empty for a node that does not exist).
    pub fn range_on(&self, node: usize) -> std::ops::Range<Rank> {
        if node >= self.nodes {
            return 0..0;
        }
        let start = node * self.per_node;
        let end = if node + 1 == self.nodes {
            self.ranks
        } else {
            (start + self.per_node).min(self.ranks)
        };
        start.min(end)..end
    }

    /// The rank that keeps `rank`'s partner copy: the same position on the
    /// next node, so that one whole node can be lost. With a single node the
    /// next rank is used (it protects against a single rank failure only).
    /// `None` when the job has one rank.
    pub fn partner(&self, rank: Rank) -> Option<Rank> {
        if self.ranks < 2 {
            return None;
        }
        let p = if self.nodes > 1 {
            (rank + self.per_node) % self.ranks
        } else {
            (rank + 1) % self.ranks
        };
        // An uneven last node can wrap onto the same node; step until the
        // partner is on another node (there always is one when nodes > 1).
        let mut p = p;
        while self.nodes > 1 && self.node_of(p) == self.node_of(rank) {
            p = (p + 1) % self.ranks;
        }
        Some(p)
    }
}

impl Placement {
    /// The ranks hosted on `node`, as a range (block placement; the last
    /// node takes the remainder).
    fn node_range(&self, node: usize) -> std::ops::Range<Rank> {
        let start = (node * self.per_node).min(self.ranks);
        let end = if node + 1 == self.nodes {
            self.ranks
        } else {
            ((node + 1) * self.per_node).min(self.ranks)
        };
        start..end
    }

    /// A second holder for `rank`'s data, besides [`Placement::partner`]:
    /// on a third node when there is one (no two node failures lose both
    /// copies and the rank), else another rank of the partner's node (losing
    /// the rank's node and then the partner still leaves a copy), else any
    /// other rank.
    pub fn second_partner(&self, rank: Rank) -> Option<Rank> {
        let p1 = self.partner(rank)?;
        if self.ranks < 3 {
            return None;
        }
        let (mine, theirs) = (self.node_of(rank), self.node_of(p1));
        let third = (1..self.nodes)
            .map(|k| (theirs + k) % self.nodes)
            .find(|&n| n != mine && n != theirs && !self.node_range(n).is_empty())
            .map(|n| {
                // The rank at the same offset within its node as p1 in its own.
                let range = self.node_range(n);
                range.start + (p1 - self.node_range(theirs).start) % range.len()
            });
        let node = self.node_range(theirs);
        let len = node.len();
        let on_partner_node = || {
            (1..len)
                .map(|k| node.start + (p1 - node.start + k) % len)
                .find(|&r| r != rank && r != p1)
        };
        third.or_else(on_partner_node).or_else(|| {
            (1..self.ranks)
                .map(|k| (p1 + k) % self.ranks)
                .find(|&r| r != rank && r != p1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Call `f(placement, nodes, rank)` for every rank of every block
    /// placement of `min..20` ranks on `1..=ranks` nodes.
    fn each_rank_of_every_placement(min: usize, mut f: impl FnMut(&Placement, usize, Rank)) {
        for ranks in min..20 {
            for nodes in 1..=ranks {
                let pl = Placement::block(ranks, nodes).expect("valid");
                let total: usize = (0..nodes).map(|n| pl.ranks_on(n).len()).sum();
                assert_eq!(total, ranks);
                for r in 0..ranks {
                    f(&pl, nodes, r);
                }
            }
        }
    }

    #[test]
    fn partners_are_on_other_nodes() {
        each_rank_of_every_placement(2, |pl, nodes, r| {
            let p = pl.partner(r).expect("partner");
            assert_ne!(p, r);
            if nodes > 1 {
                assert_ne!(pl.node_of(p), pl.node_of(r), "{nodes} nodes, r{r}");
            }
        });
    }

    #[test]
    fn second_partners_differ_from_the_rank_and_its_partner() {
        each_rank_of_every_placement(3, |pl, nodes, r| {
            let what = format!("{} ranks on {nodes} nodes, r{r}", pl.ranks());
            let p = pl.partner(r).expect("partner");
            let q = pl.second_partner(r).expect("second partner");
            assert!(q != r && q != p, "{what}: {p} {q}");
            let occupied = (0..nodes).filter(|&n| !pl.ranks_on(n).is_empty()).count();
            if occupied >= 3 {
                // On a third node: two node failures leave a copy or the
                // rank itself.
                let n = [pl.node_of(r), pl.node_of(p), pl.node_of(q)];
                assert!(n[2] != n[0] && n[2] != n[1], "{what}: {n:?}");
            } else if pl.ranks_on(pl.node_of(p)).len() > 1 + usize::from(occupied == 1) {
                // Else on the partner's node when it hosts another rank.
                assert_eq!(pl.node_of(q), pl.node_of(p), "{what}");
            }
        });
        assert_eq!(
            Placement::block(2, 1).expect("valid").second_partner(0),
            None
        );
    }

    #[test]
    fn block_placement() {
        let pl = Placement::block(8, 4).expect("valid");
        assert_eq!(pl.ranks_on(1), vec![2, 3]);
        assert_eq!(pl.partner(3), Some(5));
        assert!(Placement::block(4, 5).is_err());
    }
}
