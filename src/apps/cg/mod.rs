//! NAS Parallel Benchmarks CG (the workload of 002), distributed over ranks.
//!
//! [`npb`] generates the matrix exactly as NPB 3.4 does. Rows (and the
//! matching pieces of every vector) are distributed in contiguous blocks; the
//! sparse matrix-vector product gathers the whole search direction `p` with
//! `all_gather_varcount`, and dot products are local sums combined with
//! `all_reduce` (fixed tree, so zeta is bit-identical for a given rank count).
//! The outer iteration is the safe point; the protected state is the local
//! block of `x`, the iteration number and the last zeta.

pub mod npb;

use serde::{Deserialize, Serialize};

use super::{AppParams, Verification, safe_point};
use crate::{Communicator, Ctx, Error, ReduceOp, Result};
use npb::{CGITMAX, ClassParams, Csr};

/// Parameters of a CG run.
#[derive(Debug, Clone)]
pub struct Params {
    /// NPB class parameters.
    pub class: ClassParams,
    /// Outer iterations (NPB's `niter`).
    pub niter: u64,
}

impl Params {
    /// From the common app parameters (`--class`, default S).
    pub fn from_app(p: &AppParams) -> Result<Self> {
        let c = p.class.unwrap_or('S');
        let class = npb::class_params(c)
            .filter(|cp| matches!(cp.class, 'S' | 'W' | 'A' | 'B'))
            .ok_or_else(|| {
                Error::config("class", format!("cg has classes S, W, A and B, not `{c}`"))
            })?;
        if p.size.is_some() || p.iterations.is_some() {
            return Err(Error::config(
                "size/iterations",
                "cg runs NPB's fixed sizes; choose a class instead",
            ));
        }
        Ok(Params {
            niter: class.niter as u64,
            class,
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// Outer iterations done.
    it: u64,
    /// This rank's block of x.
    #[serde(with = "crate::bulk")]
    x: Vec<f64>,
    zeta: f64,
}

/// The block of rows `[lo, hi)` of `rank` among `size` for `n` rows.
pub fn block(n: usize, rank: usize, size: usize) -> (usize, usize) {
    let base = n / size;
    let extra = n % size;
    let lo = rank * base + rank.min(extra);
    (lo, lo + base + usize::from(rank < extra))
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).fold(0.0, |s, (&x, &y)| s + x * y)
}

/// `y = A[lo..hi] * v` for the rows this rank owns.
fn spmv_rows(a: &Csr, lo: usize, v: &[f64], y: &mut [f64]) {
    for (i, yi) in y.iter_mut().enumerate() {
        let (cols, vals) = a.row(lo + i);
        *yi = cols
            .iter()
            .zip(vals)
            .fold(0.0, |acc, (&c, &v_)| acc + v_ * v[c]);
    }
}

fn all_sum(world: &Communicator, local: &[f64]) -> Result<Vec<f64>> {
    let mut out = vec![0.0; local.len()];
    world.all_reduce_into(local, &mut out, ReduceOp::Sum)?;
    Ok(out)
}

/// One `conj_grad` call of NPB on distributed vectors; returns ||x - A z||.
fn conj_grad(
    ctx: &mut Ctx,
    a: &Csr,
    (lo, hi): (usize, usize),
    x: &[f64],
    z: &mut [f64],
    progress: (u64, u64),
) -> Result<f64> {
    let world = ctx.world();
    let nloc = hi - lo;
    let mut q = vec![0.0; nloc];
    z.fill(0.0);
    let mut r = x.to_vec();
    let mut p = r.clone();
    let mut rho = all_sum(&world, &[dot(&r, &r)])?[0];
    for k in 0..CGITMAX {
        let p_full = world.all_gather(&p)?;
        spmv_rows(a, lo, &p_full, &mut q);
        let d = all_sum(&world, &[dot(&p, &q)])?[0];
        let alpha = rho / d;
        let rho0 = rho;
        for ((zj, rj), (&pj, &qj)) in z.iter_mut().zip(r.iter_mut()).zip(p.iter().zip(&q)) {
            *zj += alpha * pj;
            *rj -= alpha * qj;
        }
        rho = all_sum(&world, &[dot(&r, &r)])?[0];
        let beta = rho / rho0;
        for (pj, &rj) in p.iter_mut().zip(&r) {
            *pj = rj + beta * *pj;
        }
        let (done, total) = progress;
        ctx.set_progress((done * CGITMAX as u64 + k as u64 + 1) as f64 / total as f64);
    }
    let z_full = world.all_gather(z)?;
    spmv_rows(a, lo, &z_full, &mut r);
    let local = x.iter().zip(&r).fold(0.0, |s, (&xj, &rj)| {
        let d = xj - rj;
        s + d * d
    });
    Ok(all_sum(&world, &[local])?[0].sqrt())
}

/// The rank function of CG. `a` holds at least this rank's block of rows
/// ([`block`]): the whole matrix shared by the ranks of one process, or
/// the block alone ([`npb::makea_rows`]). It is input, not state.
pub fn rank_main(ctx: &mut Ctx, p: &Params, a: &Csr) -> Result<Verification> {
    let world = ctx.world();
    let (lo, hi) = block(a.n, world.rank(), world.size());
    let held = a.rows();
    if lo < held.start || hi > held.end {
        return Err(Error::app(format!(
            "rank {} needs rows {lo}..{hi} of the matrix but was given {held:?}",
            world.rank()
        )));
    }
    let mut st: State = ctx.restore_or_else(|| State {
        it: 0,
        x: vec![1.0; hi - lo],
        zeta: 0.0,
    })?;
    if st.x.len() != hi - lo {
        return Err(Error::app("restored x block has the wrong length"));
    }
    let total = p.niter * CGITMAX as u64;
    let mut z = vec![0.0; hi - lo];
    let mut rnorm = 0.0;
    while st.it < p.niter {
        rnorm = conj_grad(ctx, a, (lo, hi), &st.x, &mut z, (st.it, total))?;
        let local =
            st.x.iter()
                .zip(&z)
                .fold([0.0, 0.0], |[t1, t2], (&xj, &zj)| {
                    [t1 + xj * zj, t2 + zj * zj]
                });
        let norms = all_sum(&world, &local)?;
        let norm_temp2 = 1.0 / norms[1].sqrt();
        st.zeta = p.class.shift + 1.0 / norms[0];
        for (xj, &zj) in st.x.iter_mut().zip(&z) {
            *xj = norm_temp2 * zj;
        }
        st.it += 1;
        safe_point(ctx, &st, st.it * CGITMAX as u64, total)?;
    }
    let verified = npb::verify(st.zeta, &p.class);
    let err = (st.zeta - p.class.zeta_verify).abs() / p.class.zeta_verify;
    Ok(Verification {
        value: format!("{}", st.zeta),
        verified,
        detail: format!(
            "class {} zeta {} vs NPB {} (relative error {err:.3e}, tolerance {:.0e})",
            p.class.class,
            st.zeta,
            p.class.zeta_verify,
            npb::EPSILON
        ),
        metrics: serde_json::json!({
            "zeta": st.zeta,
            "rnorm": rnorm,
            "na": p.class.na,
            // Entries of this rank's rows (the report is rank 0's).
            "nnz_rows": (lo..hi).map(|r| a.row(r).0.len()).sum::<usize>(),
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_cover_rows() {
        for size in 1..9 {
            let mut next = 0;
            for r in 0..size {
                let (lo, hi) = block(1400, r, size);
                assert_eq!(lo, next);
                next = hi;
            }
            assert_eq!(next, 1400);
        }
    }
}
