//! The 2-D (pencil) decomposition of FT's grid and the transposes between
//! its three layouts.
//!
//! The ranks form a `p1 x p2` grid; rank `r` is at `(a, b) = (r % p1,
//! r / p1)`. Each layout holds whole lines along one axis, the axis the next
//! 1-D FFTs run along, stored fastest so that they are contiguous:
//!
//! | layout | whole axis | storage (slow, mid, fast) | blocks |
//! | --- | --- | --- | --- |
//! | [`Layout::X`] | x | `[z][y][x]` | y by `a` (of p1), z by `b` (of p2) |
//! | [`Layout::Y`] | y | `[z][x][y]` | x by `a`, z by `b` |
//! | [`Layout::Z`] | z | `[y][x][z]` | x by `a`, y by `b` |
//!
//! X <-> Y exchanges blocks among the `p1` ranks of a row (same `b`),
//! Y <-> Z among the `p2` ranks of a column (same `a`). A rank packs what
//! goes to each member already in the member's storage order, so the member
//! unpacks a chunk as rows copied into place: the chunk from member `m`
//! fills the fast-axis range [`Transpose::recv_range`] of every (slow, mid)
//! line, and lands in the receive buffer at `slow * mid * range.start`.
//! Blocks may be uneven (any rank count whose grid fits), and the data only
//! moves: the FFTs see the same lines on any grid, so results are
//! bit-identical across rank counts.

use std::ops::Range;

use num_complex::Complex64;

use super::npb::Class;
use crate::apps::cg::block;
use crate::{Error, Rank, Result};

/// Where the whole lines run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// x-pencils: the initial condition and the checksum's layout.
    X,
    /// y-pencils.
    Y,
    /// z-pencils: the spectral array evolves here.
    Z,
}

/// One of the four transposes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transpose {
    /// x-pencils to y-pencils (forward FFT, within a row).
    XtoY,
    /// y-pencils to z-pencils (forward FFT, within a column).
    YtoZ,
    /// z-pencils to y-pencils (inverse FFT, within a column).
    ZtoY,
    /// y-pencils to x-pencils (inverse FFT, within a row).
    YtoX,
}

/// This rank's place in the process grid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grid {
    /// Points along x, y, z.
    pub n: [usize; 3],
    /// Ranks along the grid's first dimension (a row's members).
    pub p1: usize,
    /// Ranks along the second (a column's members).
    pub p2: usize,
    /// This rank's row index, `rank % p1`.
    pub a: usize,
    /// This rank's column index, `rank / p1`.
    pub b: usize,
}

fn range((lo, hi): (usize, usize)) -> Range<usize> {
    lo..hi
}

impl Grid {
    /// The grid of `ranks` ranks for `class`: `p1` the largest divisor of
    /// `ranks` not above its square root (NPB's `np1 <= np2`) for which
    /// every block is non-empty.
    pub fn new(class: &Class, ranks: usize, rank: Rank) -> Result<Grid> {
        let [nx, ny, nz] = [class.nx, class.ny, class.nz];
        let fits = |p1: usize| {
            let p2 = ranks / p1;
            ranks.is_multiple_of(p1) && p1 <= nx.min(ny) && p2 <= ny.min(nz)
        };
        let p1 = (1..=ranks)
            .take_while(|p| p * p <= ranks)
            .filter(|&p| fits(p))
            .last()
            .ok_or_else(|| {
                Error::config(
                    "ranks",
                    format!(
                        "ft class {} ({nx}x{ny}x{nz}) has no p1 x p2 grid of {ranks} ranks with \
                         p1 <= {} and p2 <= {}",
                        class.class,
                        nx.min(ny),
                        ny.min(nz)
                    ),
                )
            })?;
        Ok(Grid {
            n: [nx, ny, nz],
            p1,
            p2: ranks / p1,
            a: rank % p1,
            b: rank / p1,
        })
    }

    /// x block of row index `a`.
    fn xb(&self, a: usize) -> Range<usize> {
        range(block(self.n[0], a, self.p1))
    }

    /// y block of row index `a` (x-pencils).
    fn yb(&self, a: usize) -> Range<usize> {
        range(block(self.n[1], a, self.p1))
    }

    /// z block of column index `b` (x- and y-pencils).
    fn zb(&self, b: usize) -> Range<usize> {
        range(block(self.n[2], b, self.p2))
    }

    /// y block of column index `b` (z-pencils).
    fn yb2(&self, b: usize) -> Range<usize> {
        range(block(self.n[1], b, self.p2))
    }

    /// The rank holding the x-line `(y, z)` (layout [`Layout::X`]).
    pub fn x_owner(&self, y: usize, z: usize) -> Rank {
        let a = (0..self.p1).find(|&a| self.yb(a).contains(&y)).unwrap_or(0);
        let b = (0..self.p2).find(|&b| self.zb(b).contains(&z)).unwrap_or(0);
        a + b * self.p1
    }

    /// The global index ranges this rank holds in `layout`, as (slow, mid,
    /// fast) — the fast one is the whole axis.
    pub fn ranges(&self, layout: Layout) -> [Range<usize>; 3] {
        let [nx, ny, nz] = self.n;
        match layout {
            Layout::X => [self.zb(self.b), self.yb(self.a), 0..nx],
            Layout::Y => [self.zb(self.b), self.xb(self.a), 0..ny],
            Layout::Z => [self.yb2(self.b), self.xb(self.a), 0..nz],
        }
    }

    /// The local array's shape in `layout`, (slow, mid, fast).
    pub fn shape(&self, layout: Layout) -> [usize; 3] {
        self.ranges(layout).map(|r| r.len())
    }

    /// Elements this rank holds in `layout`.
    pub fn len(&self, layout: Layout) -> usize {
        self.shape(layout).iter().product()
    }

    /// The most elements this rank sends to other ranks in one transpose
    /// (its send buffer's size).
    pub fn max_sent(&self) -> usize {
        Transpose::ALL
            .map(|t| t.sent(self))
            .into_iter()
            .max()
            .unwrap_or(0)
    }

    /// The most elements any rank holds in any layout: rank 0's, whose
    /// blocks are the first and so the largest ([`block`]).
    pub fn largest_len(&self) -> usize {
        Grid {
            a: 0,
            b: 0,
            ..*self
        }
        .max_len()
    }

    /// The most elements this rank holds in any layout (its buffers' size).
    pub fn max_len(&self) -> usize {
        [Layout::X, Layout::Y, Layout::Z]
            .map(|l| self.len(l))
            .into_iter()
            .max()
            .unwrap_or(0)
    }
}

impl Transpose {
    /// All four.
    pub const ALL: [Transpose; 4] = [
        Transpose::XtoY,
        Transpose::YtoZ,
        Transpose::ZtoY,
        Transpose::YtoX,
    ];

    /// Elements this rank sends to the other members.
    pub fn sent(self, g: &Grid) -> usize {
        g.len(self.from())
            - g.shape(self.from())[..2].iter().product::<usize>()
                * self.send_range(g, self.me(g)).len()
    }

    /// The layout it starts from.
    pub fn from(self) -> Layout {
        match self {
            Transpose::XtoY => Layout::X,
            Transpose::YtoZ | Transpose::YtoX => Layout::Y,
            Transpose::ZtoY => Layout::Z,
        }
    }

    /// The layout it makes.
    pub fn to(self) -> Layout {
        match self {
            Transpose::YtoX => Layout::X,
            Transpose::XtoY | Transpose::ZtoY => Layout::Y,
            Transpose::YtoZ => Layout::Z,
        }
    }

    fn within_row(self) -> bool {
        matches!(self, Transpose::XtoY | Transpose::YtoX)
    }

    /// Ranks taking part with this one: a row's or a column's.
    pub fn members(self, g: &Grid) -> usize {
        if self.within_row() { g.p1 } else { g.p2 }
    }

    /// This rank's index among them.
    pub fn me(self, g: &Grid) -> usize {
        if self.within_row() { g.a } else { g.b }
    }

    /// The world rank of member `m`.
    pub fn world_rank(self, g: &Grid, m: usize) -> Rank {
        if self.within_row() {
            m + g.p1 * g.b
        } else {
            g.a + g.p1 * m
        }
    }

    /// The range of this rank's fast axis that goes to member `m`.
    pub fn send_range(self, g: &Grid, m: usize) -> Range<usize> {
        match self {
            Transpose::XtoY => g.xb(m),
            Transpose::YtoX => g.yb(m),
            Transpose::YtoZ => g.yb2(m),
            Transpose::ZtoY => g.zb(m),
        }
    }

    /// The range of the new fast axis that member `m`'s chunk fills.
    pub fn recv_range(self, g: &Grid, m: usize) -> Range<usize> {
        match self {
            Transpose::XtoY => g.yb(m),
            Transpose::YtoX => g.xb(m),
            Transpose::YtoZ => g.zb(m),
            Transpose::ZtoY => g.yb2(m),
        }
    }

    /// Where member `m`'s chunk starts in this rank's receive buffer.
    pub fn recv_offset(self, g: &Grid, m: usize) -> usize {
        let [s, mid, _] = g.shape(self.to());
        s * mid * self.recv_range(g, m).start
    }

    /// Where this rank's chunk starts in member `m`'s receive buffer (the
    /// target offset of a put): `m`'s [`Transpose::recv_offset`] for this
    /// rank, from the shape `m` will have.
    pub fn target_offset(self, g: &Grid, m: usize) -> usize {
        self.recv_offset(&self.member_grid(g, m), self.me(g))
    }

    /// Where this rank's chunk starts in member `m`'s send buffer (the
    /// source offset of a get): `m` packs the chunks of its other members
    /// one after another in member order, each as large as the member
    /// receives from it.
    pub fn source_offset(self, g: &Grid, m: usize) -> usize {
        (0..self.me(g))
            .filter(|&k| k != m)
            .map(|k| {
                let there = self.member_grid(g, k);
                let [s, mid, _] = there.shape(self.to());
                s * mid * self.recv_range(&there, m).len()
            })
            .sum()
    }

    /// Member `m`'s grid coordinates (this rank's row or column).
    fn member_grid(self, g: &Grid, m: usize) -> Grid {
        Grid {
            a: if self.within_row() { m } else { g.a },
            b: if self.within_row() { g.b } else { m },
            ..*g
        }
    }

    /// Pack what goes to member `m` from `src` (this rank's array in
    /// [`Transpose::from`]) into `out`, in `m`'s storage order, one line
    /// of the chunk every `line` elements of `out`: the chunk's own width
    /// (`recv_range`'s length) for a send buffer, or the target layout's
    /// fast axis for this rank's own chunk packed straight into place
    /// (`out` then starts at its `recv_range`). Returns the elements of
    /// the chunk.
    ///
    /// Within a row the mid and fast axes swap (`[o][m][f] -> [o][f][m]`),
    /// within a column the slow and fast ones (`[s][m][f] -> [f][m][s]`).
    pub fn pack(
        self,
        g: &Grid,
        m: usize,
        src: &[Complex64],
        out: &mut [Complex64],
        line: usize,
    ) -> usize {
        let [s0, s1, s2] = g.shape(self.from());
        let r = self.send_range(g, m);
        let w = r.len();
        if self.within_row() {
            for o in 0..s0 {
                transpose(
                    &src[o * s1 * s2 + r.start..],
                    s2,
                    &mut out[o * w * line..],
                    line,
                    s1,
                    w,
                );
            }
        } else {
            for mid in 0..s1 {
                transpose(
                    &src[mid * s2 + r.start..],
                    s1 * s2,
                    &mut out[mid * line..],
                    s1 * line,
                    s0,
                    w,
                );
            }
        }
        s0 * s1 * w
    }

    /// The width of a chunk this rank packs for a member (a line of its
    /// fast axis there): its own mid axis within a row, its slow axis
    /// within a column.
    pub fn chunk_line(self, g: &Grid) -> usize {
        let [s0, s1, _] = g.shape(self.from());
        if self.within_row() { s1 } else { s0 }
    }

    /// Where this rank's own chunk goes in its new array, for
    /// [`Transpose::pack`] straight into place.
    pub fn own_place(self, g: &Grid) -> (usize, usize) {
        (self.recv_range(g, self.me(g)).start, g.shape(self.to())[2])
    }

    /// Copy member `m`'s chunk into `dst` (this rank's array in
    /// [`Transpose::to`]).
    pub fn unpack(self, g: &Grid, m: usize, chunk: &[Complex64], dst: &mut [Complex64]) {
        let fast = g.shape(self.to())[2];
        let r = self.recv_range(g, m);
        let w = r.len();
        if w == 0 {
            return;
        }
        for (line, piece) in dst.chunks_exact_mut(fast).zip(chunk.chunks_exact(w)) {
            piece
                .iter()
                .zip(&mut line[r.clone()])
                .for_each(|(x, y)| *y = *x);
        }
    }
}

/// `dst[c * ds + r] = src[r * ss + c]` for `r < rows`, `c < cols`, in tiles
/// so that both sides stay in cache.
fn transpose(
    src: &[Complex64],
    ss: usize,
    dst: &mut [Complex64],
    ds: usize,
    rows: usize,
    cols: usize,
) {
    const TILE: usize = 16;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                let line = &src[r * ss..];
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * ds + r] = line[c];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::ft::npb::class_params;

    /// A value naming the global point it sits at.
    fn at(x: usize, y: usize, z: usize) -> Complex64 {
        Complex64::new((x + 1000 * y) as f64, z as f64)
    }

    /// Rank `(a, b)`'s array in `layout`, filled with `at`.
    fn filled(g: &Grid, layout: Layout) -> Vec<Complex64> {
        let [s, m, f] = g.ranges(layout);
        let mut v = Vec::new();
        for i in s {
            for j in m.clone() {
                for k in f.clone() {
                    v.push(match layout {
                        Layout::X => at(k, j, i),
                        Layout::Y => at(j, k, i),
                        Layout::Z => at(j, i, k),
                    });
                }
            }
        }
        v
    }

    /// Every transpose on grids with uneven blocks leaves each point where
    /// the target layout says, as the put-based and all-to-all exchanges
    /// both do (chunks at their receive offsets).
    #[test]
    fn transposes_put_every_point_where_the_layout_says() {
        let class = super::super::npb::Class {
            nx: 10,
            ny: 7,
            nz: 5,
            ..class_params('S').unwrap()
        };
        for ranks in [1, 2, 3, 4, 6] {
            let grids: Vec<Grid> = (0..ranks)
                .map(|r| Grid::new(&class, ranks, r).unwrap())
                .collect();
            for t in Transpose::ALL {
                // Every rank's receive buffer, filled by the others' puts.
                let mut recv: Vec<Vec<Complex64>> = grids
                    .iter()
                    .map(|g| vec![Complex64::default(); g.len(t.to())])
                    .collect();
                for (r, g) in grids.iter().enumerate() {
                    let src = filled(g, t.from());
                    for m in 0..t.members(g) {
                        let mut out = vec![Complex64::default(); g.max_len()];
                        let line = t.recv_range(&grids[t.world_rank(g, m)], t.me(g)).len();
                        assert_eq!(line, t.chunk_line(g));
                        let n = t.pack(g, m, &src, &mut out, line);
                        let dest = t.world_rank(g, m);
                        let off = t.target_offset(g, m);
                        recv[dest][off..off + n].copy_from_slice(&out[..n]);
                        assert_eq!(t.world_rank(&grids[dest], t.me(g)), r);
                    }
                }
                for (r, g) in grids.iter().enumerate() {
                    let mut dst = vec![Complex64::default(); g.len(t.to())];
                    for m in 0..t.members(g) {
                        let off = t.recv_offset(g, m);
                        let n = g.shape(t.to())[0] * g.shape(t.to())[1] * t.recv_range(g, m).len();
                        t.unpack(g, m, &recv[r][off..off + n], &mut dst);
                    }
                    assert_eq!(dst, filled(g, t.to()), "{t:?} on {ranks} ranks, rank {r}");
                    // This rank's own chunk packed straight into place
                    // lands where unpacking it put it.
                    let mut direct = vec![Complex64::default(); g.len(t.to())];
                    let (at, line) = t.own_place(g);
                    t.pack(g, t.me(g), &filled(g, t.from()), &mut direct[at..], line);
                    let mut via = vec![Complex64::default(); g.len(t.to())];
                    let off = t.recv_offset(g, t.me(g));
                    let n =
                        g.shape(t.to())[0] * g.shape(t.to())[1] * t.recv_range(g, t.me(g)).len();
                    t.unpack(g, t.me(g), &recv[r][off..off + n], &mut via);
                    assert_eq!(direct, via, "{t:?} own chunk on {ranks} ranks, rank {r}");
                }
            }
        }
    }

    #[test]
    fn grids_are_as_square_as_the_problem_allows() {
        let s = class_params('S').unwrap();
        let w = class_params('W').unwrap();
        let g = |c, n| {
            let g = Grid::new(c, n, 0).unwrap();
            (g.p1, g.p2)
        };
        assert_eq!(g(&s, 1), (1, 1));
        assert_eq!(g(&s, 4), (2, 2));
        assert_eq!(g(&s, 8), (2, 4));
        assert_eq!(g(&s, 3), (1, 3));
        // W has 32 z planes: 64 ranks need p1 = 2 at least.
        assert_eq!(g(&w, 64), (8, 8));
        assert!(Grid::new(&s, 64 * 64 + 1, 0).is_err());
    }
}
