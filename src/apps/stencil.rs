//! 2-D 5-point Jacobi with halo exchange (the workload of 001).
//!
//! The `n x n` grid has fixed boundary values; interior rows are distributed in
//! contiguous blocks, and every sweep exchanges the first and last owned rows
//! with the neighbours. Each cell's update depends only on the previous sweep,
//! so the result does not depend on the decomposition; the checksum sums each
//! row left to right and then the row sums in global row order at rank 0, so
//! it is bit-identical to [`serial_checksum`] computed on one rank.

use serde::{Deserialize, Serialize};

use super::{AppParams, Verification, safe_point};
use crate::apps::cg::block;
use crate::{Ctx, Error, Result};

/// Largest grid side accepted.
pub const MAX_N: usize = 1 << 15;

/// Parameters of a stencil run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Grid side, boundary included.
    pub n: usize,
    /// Sweeps.
    pub iterations: u64,
    /// Sweeps of its block an odd rank computes per iteration (1:
    /// balanced; the extra ones are discarded): `--imbalance`.
    pub imbalance: u32,
}

impl Params {
    /// From the common app parameters (`--size`, `--iterations`; classes
    /// S = 256², W = 1024², A = 2048²).
    pub fn from_app(p: &AppParams) -> Result<Self> {
        let (n, it) = match p.class.unwrap_or('S') {
            'S' => (256, 100),
            'W' => (1024, 100),
            'A' => (2048, 200),
            c => {
                return Err(Error::config(
                    "class",
                    format!("stencil has classes S, W and A, not `{c}`"),
                ));
            }
        };
        let n = p.size.unwrap_or(n);
        let iterations = p.iterations.unwrap_or(it);
        if !(3..=MAX_N).contains(&n) {
            return Err(Error::config(
                "size",
                format!(
                    "the stencil grid side must be in 3..={MAX_N} (two {MAX_N}^2 grids of f64 are 8 GiB)"
                ),
            ));
        }
        if iterations == 0 {
            return Err(Error::config("iterations", "at least one sweep"));
        }
        let imbalance = p.imbalance.unwrap_or(1);
        if !(1..=64).contains(&imbalance) {
            return Err(Error::config(
                "imbalance",
                "an odd rank's sweeps per iteration must be in 1..=64",
            ));
        }
        Ok(Params {
            n,
            iterations,
            imbalance,
        })
    }
}

/// Initial value of cell `(i, j)` (boundary cells keep theirs).
pub fn initial(n: usize, i: usize, j: usize) -> f64 {
    if i == 0 {
        1.0
    } else if i == n - 1 {
        0.0
    } else if j == 0 {
        0.25
    } else if j == n - 1 {
        0.75
    } else {
        ((i * 31 + j * 17) % 97) as f64 / 97.0
    }
}

fn sweep_row(up: &[f64], mid: &[f64], down: &[f64], out: &mut [f64]) {
    let n = mid.len();
    out[0] = mid[0];
    out[n - 1] = mid[n - 1];
    for j in 1..n - 1 {
        out[j] = 0.25 * (up[j] + down[j] + mid[j - 1] + mid[j + 1]);
    }
}

fn row_sum(row: &[f64]) -> f64 {
    row.iter().fold(0.0, |s, &x| s + x)
}

/// The checksum computed on one rank: the reference the tests (and the app)
/// compare against.
pub fn serial_checksum(p: &Params) -> f64 {
    let n = p.n;
    let mut u: Vec<f64> = (0..n * n).map(|k| initial(n, k / n, k % n)).collect();
    let mut v = u.clone();
    for _ in 0..p.iterations {
        for i in 1..n - 1 {
            let (up, rest) = u[(i - 1) * n..].split_at(n);
            let (mid, rest) = rest.split_at(n);
            sweep_row(up, mid, &rest[..n], &mut v[i * n..(i + 1) * n]);
        }
        std::mem::swap(&mut u, &mut v);
    }
    (0..n).fold(0.0, |s, i| s + row_sum(&u[i * n..(i + 1) * n]))
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    it: u64,
    /// Owned rows, row-major.
    #[serde(with = "crate::bulk")]
    rows: Vec<f64>,
}

const TAG_UP: i32 = 10;
const TAG_DOWN: i32 = 11;

/// The rank function of the stencil.
pub fn rank_main(ctx: &mut Ctx, p: &Params) -> Result<Verification> {
    let world = ctx.world();
    let (rank, size, n) = (world.rank(), world.size(), p.n);
    // Rows 0 and n-1 are fixed boundary rows and belong to nobody.
    let (lo, hi) = {
        let (a, b) = block(n - 2, rank, size);
        (a + 1, b + 1)
    };
    let nloc = hi - lo;
    let mut st: State = ctx.restore_or_else(|| State {
        it: 0,
        rows: (lo..hi)
            .flat_map(|i| (0..n).map(move |j| initial(n, i, j)))
            .collect(),
    })?;
    if st.rows.len() != nloc * n {
        return Err(Error::app("restored stencil block has the wrong size"));
    }
    let top_boundary: Vec<f64> = (0..n).map(|j| initial(n, 0, j)).collect();
    let bottom_boundary: Vec<f64> = (0..n).map(|j| initial(n, n - 1, j)).collect();
    let mut next = vec![0.0; nloc * n];
    // Ranks that own no rows (more ranks than rows) only pass safe points.
    let up_rank = (0..rank).rev().find(|&r| {
        let (a, b) = block(n - 2, r, size);
        b > a
    });
    let down_rank = (rank + 1..size).find(|&r| {
        let (a, b) = block(n - 2, r, size);
        b > a
    });
    while st.it < p.iterations {
        if nloc > 0 {
            if let Some(u) = up_rank {
                world.send(u, TAG_UP, &st.rows[..n])?;
            }
            if let Some(d) = down_rank {
                world.send(d, TAG_DOWN, &st.rows[(nloc - 1) * n..])?;
            }
            let halo_up = match up_rank {
                Some(u) => world.receive::<f64>(u, TAG_DOWN)?.0,
                None => top_boundary.clone(),
            };
            let halo_down = match down_rank {
                Some(d) => world.receive::<f64>(d, TAG_UP)?.0,
                None => bottom_boundary.clone(),
            };
            if halo_up.len() != n || halo_down.len() != n {
                return Err(Error::app("halo row of the wrong length"));
            }
            // Load imbalance: an odd rank's extra sweeps, into `next` and
            // overwritten by the last one (the result does not change).
            let sweeps = if rank % 2 == 1 { p.imbalance } else { 1 };
            for i in (0..nloc).cycle().take(nloc * sweeps as usize) {
                let up = if i == 0 {
                    &halo_up[..]
                } else {
                    &st.rows[(i - 1) * n..i * n]
                };
                let down = if i + 1 == nloc {
                    &halo_down[..]
                } else {
                    &st.rows[(i + 1) * n..(i + 2) * n]
                };
                sweep_row(
                    up,
                    &st.rows[i * n..(i + 1) * n],
                    down,
                    &mut next[i * n..(i + 1) * n],
                );
            }
            std::mem::swap(&mut st.rows, &mut next);
        }
        st.it += 1;
        safe_point(ctx, &st, st.it, p.iterations)?;
    }
    // Row sums in global row order, summed at rank 0 as the serial code does.
    let sums: Vec<f64> = (0..nloc)
        .map(|i| row_sum(&st.rows[i * n..(i + 1) * n]))
        .collect();
    let gathered = world.gather(0, &sums)?;
    // Rank 0 also computes the one-rank reference, so every rank reports the
    // same verdict.
    let verdict = match gathered {
        Some(rows) => {
            let s = row_sum(&top_boundary);
            let s = rows.iter().fold(s, |s, &r| s + r);
            let checksum = s + row_sum(&bottom_boundary);
            Some((checksum, serial_checksum(p)))
        }
        None => None,
    };
    let (checksum, reference) = world.broadcast_value(0, verdict.as_ref())?;
    let verified = checksum.to_bits() == reference.to_bits();
    Ok(Verification {
        value: format!("{checksum}"),
        verified,
        detail: format!("checksum {checksum} vs one-rank reference {reference}"),
        metrics: serde_json::json!({"n": n, "iterations": p.iterations, "checksum": checksum}),
    })
}
