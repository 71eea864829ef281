//! Port of the NAS Parallel Benchmarks 3.4 CG kernel's problem generator.
//!
//! This module reproduces, bit for bit, the sparse symmetric matrix that
//! NPB 3.4's serial CG (`cg.f90`: `makea`, `sprnvc`, `vecset`, `sparse`,
//! `randlc`) builds, together with the reference serial inverse-power
//! iteration (`conj_grad` plus the main loop of `program cg`).  The serial
//! zeta computed here is the oracle the parallel CG application is checked
//! against, and NPB's published `zeta_verify_value`s are the oracle for this
//! module.
//!
//! NPB works with 1-based Fortran indices; everything here is 0-based.  The
//! index offset is applied uniformly (a row or column number `i` in NPB is
//! `i - 1` here) so that comparisons, and hence orderings, are unchanged.
//!
//! Bit-identity notes:
//! * `randlc` only manipulates integers below 2^53, so every step is exact
//!   and independent of the compiler (Rust never contracts `a * b + c` into
//!   a fused multiply-add on its own).
//! * `ratio = rcond ** (1/n)` goes through the platform `pow`, as NPB's
//!   Fortran and C versions do; with glibc both resolve to the same routine.
//! * Duplicate entries of the matrix are summed in exactly the order in which
//!   NPB's `sparse` accumulates them, starting from `0.0`.

/// NPB's verification tolerance on the relative error of zeta (`epsilon` in
/// `program cg`).
pub const EPSILON: f64 = 1.0e-10;

/// Reciprocal condition number used by `makea` (`rcond` in `cg_data`).
pub const RCOND: f64 = 0.1;

/// Initial seed of the random number generator (`tran` in `program cg`).
pub const TRAN_SEED: f64 = 314_159_265.0;

/// Multiplier of the random number generator, 5^13 (`amult` in
/// `program cg`).
pub const AMULT: f64 = 1_220_703_125.0;

/// Number of inner conjugate-gradient iterations per outer iteration
/// (`cgitmax` in `conj_grad`).
pub const CGITMAX: usize = 25;

/// Parameters of one NPB CG problem class (NPB's `npbparams.h` values plus
/// the published verification value from `program cg`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ClassParams {
    /// Class letter: `'S'`, `'W'`, `'A'` or `'B'`.
    pub class: char,
    /// Order of the matrix (`na`).
    pub na: usize,
    /// Number of random nonzeros per generating vector (`nonzer`).
    pub nonzer: usize,
    /// Number of outer inverse-power iterations (`niter`).
    pub niter: usize,
    /// Eigenvalue shift (`shift`).
    pub shift: f64,
    /// NPB's published zeta for this class (`zeta_verify_value`).
    pub zeta_verify: f64,
}

/// Returns the NPB 3.4 CG parameters of `class` (case-insensitive), or
/// `None` if the class is not one of `S`, `W`, `A`, `B`.
pub fn class_params(class: char) -> Option<ClassParams> {
    let class = class.to_ascii_uppercase();
    let (na, nonzer, niter, shift, zeta_verify) = match class {
        'S' => (1400, 7, 15, 10.0, 8.597_177_507_864_8),
        'W' => (7000, 8, 15, 12.0, 10.362_595_087_124),
        'A' => (14000, 11, 15, 20.0, 17.130_235_054_029),
        'B' => (75000, 13, 75, 60.0, 22.712_745_482_631),
        _ => return None,
    };
    Some(ClassParams {
        class,
        na,
        nonzer,
        niter,
        shift,
        zeta_verify,
    })
}

/// NPB's verification test: the relative error
/// `|zeta - zeta_verify| / zeta_verify` must not be NaN and must be at most
/// [`EPSILON`].
pub fn verify(zeta: f64, p: &ClassParams) -> bool {
    // Same expression and comparison as `program cg` (NPB 3.4 also rejects a
    // NaN error explicitly via `ieee_is_nan`).
    let err = (zeta - p.zeta_verify).abs() / p.zeta_verify;
    !err.is_nan() && err <= EPSILON
}

/// NPB's `randlc`: one step of the linear congruential generator
/// `x <- a * x mod 2^46`, returning the new `x` scaled by `2^-46`.
///
/// The product is formed in double precision by splitting `a` and `x` into
/// 23-bit halves (the `r23`/`t23`/`r46`/`t46` constants of NPB), so that no
/// intermediate exceeds 2^53 and every operation is exact.  `x` and `a` must
/// be odd integers in `(0, 2^46)` for the generator to have full period, as
/// in NPB.
pub fn randlc(x: &mut f64, a: f64) -> f64 {
    const R23: f64 = 1.0 / 8_388_608.0; // 0.5^23
    const R46: f64 = R23 * R23; // 0.5^46
    const T23: f64 = 8_388_608.0; // 2^23
    const T46: f64 = T23 * T23; // 2^46

    // Break A into two parts such that A = 2^23 * A1 + A2.  Fortran's
    // `int()` truncates toward zero, as does `trunc`.
    let t1 = R23 * a;
    let a1 = t1.trunc();
    let a2 = a - T23 * a1;

    // Break X into two parts such that X = 2^23 * X1 + X2, compute
    // Z = A1 * X2 + A2 * X1 (mod 2^23), and then
    // X = 2^23 * Z + A2 * X2 (mod 2^46).
    let t1 = R23 * *x;
    let x1 = t1.trunc();
    let x2 = *x - T23 * x1;
    let t1 = a1 * x2 + a2 * x1;
    let t2 = (R23 * t1).trunc();
    let z = t1 - T23 * t2;
    let t3 = T23 * z + a2 * x2;
    let t4 = (R46 * t3).trunc();
    *x = t3 - T46 * t4;
    R46 * *x
}

/// Rows of a square sparse matrix in 0-based compressed sparse row form:
/// the `k`-th row held (row `first_row + k` of the matrix) holds the
/// entries `a[rowstr[k]..rowstr[k + 1]]` whose column indices are
/// `colidx[rowstr[k]..rowstr[k + 1]]`, sorted strictly ascending. The whole
/// matrix has `first_row == 0` and `n` rows; a rank's block of rows (NPB's
/// `firstrow..lastrow`) has fewer.
#[derive(Debug, Clone, PartialEq)]
pub struct Csr {
    /// Order of the matrix: its number of columns (and of rows).
    pub n: usize,
    /// Row of the matrix the first row held is.
    pub first_row: usize,
    /// Row pointers, one per row held and one more, starting at 0.
    pub rowstr: Vec<usize>,
    /// Column index of each stored entry.
    pub colidx: Vec<usize>,
    /// Value of each stored entry.
    pub a: Vec<f64>,
}

impl Csr {
    /// Number of stored entries.
    pub fn nnz(&self) -> usize {
        self.a.len()
    }

    /// The rows of the matrix held: `first_row..first_row + count`.
    pub fn rows(&self) -> std::ops::Range<usize> {
        self.first_row..self.first_row + self.rowstr.len().saturating_sub(1)
    }

    /// Row `row` of the matrix (which must be held): its column indices and
    /// values. Inlined: it is the kernel's inner call (whether the compiler
    /// inlined it on its own changed with unrelated code: 4% of CG's
    /// instructions).
    #[inline]
    pub fn row(&self, row: usize) -> (&[usize], &[f64]) {
        let k = row - self.first_row;
        let (s, e) = (self.rowstr[k], self.rowstr[k + 1]);
        (&self.colidx[s..e], &self.a[s..e])
    }

    /// `out = self * v`, summing each row left to right from `0.0` as the
    /// matrix-vector products of NPB's `conj_grad` do.
    fn spmv(&self, v: &[f64], out: &mut [f64]) {
        for (o, w) in out.iter_mut().zip(self.rowstr.windows(2)) {
            let (lo, hi) = (w[0], w[1]);
            *o = self.a[lo..hi]
                .iter()
                .zip(&self.colidx[lo..hi])
                .fold(0.0, |sum, (&aij, &col)| sum + aij * v[col]);
        }
    }
}

/// One sparse vector produced by `sprnvc` + `vecset`: distinct 0-based
/// positions `idx` with values `val`, in generation order.  NPB stores these
/// as the columns `acol(:, i)` / `aelt(:, i)` with lengths `arow(i)`.
#[derive(Debug, Clone, PartialEq)]
struct SparseVec {
    idx: Vec<usize>,
    val: Vec<f64>,
}

/// NPB's `icnvrt`: scale `x` in (0, 1) by the power of two `ipwr2` and chop
/// it to an integer.
fn icnvrt(x: f64, ipwr2: usize) -> usize {
    // `ipwr2 * x` is exact (power-of-two scaling); `as` truncates like
    // Fortran's `int()`.
    (ipwr2 as f64 * x) as usize
}

/// NPB's `sprnvc`: fill `v`/`iv` with `nz` nonzeros at distinct random
/// positions in `0..n`.
///
/// Each attempt draws two numbers from the generator: the value first, then
/// the position, which is drawn from `0..nn1` (`nn1` a power of two, for
/// portability) and rejected if it is out of range or already present.  A
/// rejected attempt still consumes both draws, exactly as in NPB.
fn sprnvc(n: usize, nz: usize, nn1: usize, tran: &mut f64, v: &mut Vec<f64>, iv: &mut Vec<usize>) {
    v.clear();
    iv.clear();
    while iv.len() < nz {
        let vecelt = randlc(tran, AMULT);
        let vecloc = randlc(tran, AMULT);
        // NPB: i = icnvrt(vecloc, nn1) + 1, rejected when i > n; the 0-based
        // position is one less.
        let i = icnvrt(vecloc, nn1);
        if i >= n || iv.contains(&i) {
            continue;
        }
        v.push(vecelt);
        iv.push(i);
    }
}

/// NPB's `vecset`: set element `i` of the sparse vector (`v`, `iv`) to
/// `val`, appending it if it is not present.
fn vecset(v: &mut Vec<f64>, iv: &mut Vec<usize>, i: usize, val: f64) {
    let mut set = false;
    for (vk, &ik) in v.iter_mut().zip(iv.iter()) {
        if ik == i {
            *vk = val;
            set = true;
        }
    }
    if !set {
        v.push(val);
        iv.push(i);
    }
}

/// First half of NPB's `makea`: advance the generator as `program cg` does
/// before calling `makea`, then generate the `n` sparse vectors whose outer
/// products make up the matrix (vector `i` always contains position `i`
/// with value 0.5, set by `vecset`).
fn generate_vectors(p: &ClassParams) -> Vec<SparseVec> {
    let n = p.na;
    assert!(
        p.nonzer <= n,
        "NPB CG needs nonzer ({}) <= na ({})",
        p.nonzer,
        n
    );

    let mut tran = TRAN_SEED;
    // `program cg`: zeta = randlc(tran, amult), discarded, before makea.
    randlc(&mut tran, AMULT);

    // nn1 is the smallest power of two not less than n (NPB's loop doubles
    // at least once, so nn1 >= 2).
    let mut nn1: usize = 1;
    loop {
        nn1 *= 2;
        if nn1 >= n {
            break;
        }
    }

    let mut vc = Vec::with_capacity(p.nonzer + 1);
    let mut ivc = Vec::with_capacity(p.nonzer + 1);
    (0..n)
        .map(|iouter| {
            sprnvc(n, p.nonzer, nn1, &mut tran, &mut vc, &mut ivc);
            vecset(&mut vc, &mut ivc, iouter, 0.5);
            SparseVec {
                idx: ivc.clone(),
                val: vc.clone(),
            }
        })
        .collect()
}

/// NPB's `sparse`: assemble rows `rows` of the CSR matrix
/// `A = sum_i size_i * v_i v_i^T + (rcond - shift) I`, with
/// `size_i = ratio^i` and `ratio = rcond^(1/n)`, summing duplicates. As in
/// NPB's parallel CG, a rank assembles only its own rows (each row's sum is
/// the same whichever rows are assembled with it), though every rank
/// generates all the vectors.
///
/// NPB walks the vectors in order `i = 0..n`; for each position `j` of
/// vector `i` (a row) it forms `scale = size * v_i[j]` and, for each
/// position `jcol` of the same vector (a column),
/// `va = v_i[jcol] * scale`, adding `rcond - shift` as `(va + rcond) - shift`
/// when `jcol == j == i`, and accumulates `va` into entry `(j, jcol)`
/// (starting from `0.0`).  NPB inserts into per-row slots with an insertion
/// sort; here each row's contributions are gathered in the same order, stably
/// sorted by column and summed left to right, which performs the same
/// floating-point additions in the same order.
fn sparse(
    n: usize,
    rows: std::ops::Range<usize>,
    vecs: &[SparseVec],
    rcond: f64,
    shift: f64,
) -> Csr {
    // size_i, updated by repeated multiplication after each vector as NPB
    // does (`size = size * ratio`), not recomputed with powi.
    let ratio = rcond.powf(1.0 / n as f64);
    let mut sizes = Vec::with_capacity(n);
    let mut size = 1.0_f64;
    for _ in 0..n {
        sizes.push(size);
        size *= ratio;
    }

    // Inverted index: for each row j held (k = j - first), the (vector,
    // position-in-vector) pairs with vecs[i].idx[pos] == j, in increasing
    // i.  This is the order in which NPB's `sparse` visits row j.
    assert!(
        rows.start <= rows.end && rows.end <= n,
        "rows {rows:?} of {n}"
    );
    let (first, held) = (rows.start, rows.len());
    let mut occ_start = vec![0usize; held + 1];
    for v in vecs {
        for &j in v.idx.iter().filter(|j| rows.contains(j)) {
            occ_start[j - first + 1] += 1;
        }
    }
    for k in 0..held {
        occ_start[k + 1] += occ_start[k];
    }
    let mut fill = occ_start.clone();
    let mut occ = vec![(0usize, 0usize); occ_start[held]];
    for (i, v) in vecs.iter().enumerate() {
        for (pos, &j) in v.idx.iter().enumerate() {
            if rows.contains(&j) {
                occ[fill[j - first]] = (i, pos);
                fill[j - first] += 1;
            }
        }
    }

    let mut rowstr = Vec::with_capacity(held + 1);
    let mut colidx = Vec::new();
    let mut a = Vec::new();
    rowstr.push(0);
    let mut contrib: Vec<(usize, f64)> = Vec::new();
    for j in rows {
        contrib.clear();
        let k = j - first;
        for &(i, pos) in &occ[occ_start[k]..occ_start[k + 1]] {
            let v = &vecs[i];
            let scale = sizes[i] * v.val[pos];
            for (&jcol, &vjcol) in v.idx.iter().zip(&v.val) {
                let mut va = vjcol * scale;
                // Add the identity * rcond to bound the smallest eigenvalue
                // from below by rcond (and shift the spectrum); NPB evaluates
                // `va + rcond - shift` left to right.
                if jcol == j && j == i {
                    va = (va + rcond) - shift;
                }
                contrib.push((jcol, va));
            }
        }
        // Stable: equal columns keep their accumulation order.
        contrib.sort_by_key(|&(col, _)| col);
        let row_start = colidx.len();
        for &(col, va) in &contrib {
            match a.last_mut() {
                Some(acc) if colidx.len() > row_start && colidx.last() == Some(&col) => {
                    *acc += va;
                }
                _ => {
                    // NPB zeroes a fresh slot, then adds: 0.0 + va.
                    let mut acc = 0.0;
                    acc += va;
                    colidx.push(col);
                    a.push(acc);
                }
            }
        }
        rowstr.push(colidx.len());
    }

    Csr {
        n,
        first_row: first,
        rowstr,
        colidx,
        a,
    }
}

/// NPB's `makea` for the serial decomposition (`firstrow = firstcol = 1`,
/// `lastrow = lastcol = na`): the full `na x na` CG test matrix in 0-based
/// CSR form, bit-identical to NPB 3.4's.
///
/// Includes the `zeta = randlc(tran, amult)` draw that `program cg` makes
/// with `tran = 314159265` before calling `makea`, and uses
/// `rcond = 0.1` ([`RCOND`]).
///
/// # Panics
///
/// Panics if `p.nonzer > p.na` (NPB would loop forever looking for that many
/// distinct positions).
pub fn makea(p: &ClassParams) -> Csr {
    makea_rows(p, 0..p.na)
}

/// Rows `rows` of [`makea`]'s matrix, bit-identical to those rows of it,
/// as NPB's parallel `makea` gives a process its block (`firstrow..lastrow`
/// with every column). Generating the vectors is the same work as for the
/// whole matrix; assembling the rows is a fraction of it.
///
/// # Panics
///
/// As [`makea`], and if `rows` is not within `0..p.na`.
pub fn makea_rows(p: &ClassParams, rows: std::ops::Range<usize>) -> Csr {
    let vecs = generate_vectors(p);
    sparse(p.na, rows, &vecs, RCOND, p.shift)
}

/// `sum(u[j] * v[j])` accumulated left to right from `0.0`, as NPB's serial
/// dot-product loops do.
fn dot(u: &[f64], v: &[f64]) -> f64 {
    u.iter().zip(v).fold(0.0, |s, (&a, &b)| s + a * b)
}

/// NPB's `conj_grad`: approximately solve `A z = x` with [`CGITMAX`]
/// unpreconditioned CG iterations from `z = 0`, and return the explicit
/// residual norm `||x - A z||` (NPB's `rnorm`).
///
/// `x` and `z` must both have length `a.n`, and `a` must be the whole
/// matrix (panics otherwise).
pub fn conj_grad(a: &Csr, x: &[f64], z: &mut [f64]) -> f64 {
    let n = a.n;
    assert!(x.len() == n && z.len() == n, "conj_grad: length mismatch");
    assert_eq!(
        a.rows(),
        0..n,
        "conj_grad: needs the whole matrix, not a block of rows"
    );

    // Initialize the CG algorithm: q = z = 0, r = p = x.
    let mut q = vec![0.0; n];
    z.fill(0.0);
    let mut r = x.to_vec();
    let mut p = r.clone();

    // rho = r.r
    let mut rho = dot(&r, &r);

    for _ in 0..CGITMAX {
        // q = A.p
        a.spmv(&p, &mut q);
        // alpha = rho / (p.q)
        let d = dot(&p, &q);
        let alpha = rho / d;
        let rho0 = rho;
        // z = z + alpha*p, r = r - alpha*q
        for ((zj, rj), (&pj, &qj)) in z.iter_mut().zip(r.iter_mut()).zip(p.iter().zip(&q)) {
            *zj += alpha * pj;
            *rj -= alpha * qj;
        }
        // rho = r.r (NPB 3.4 fuses this into the loop above; the additions
        // happen in the same order either way).
        rho = dot(&r, &r);
        let beta = rho / rho0;
        // p = r + beta*p
        for (pj, &rj) in p.iter_mut().zip(&r) {
            *pj = rj + beta * *pj;
        }
    }

    // Compute the residual norm explicitly: ||r|| = ||x - A.z||.
    a.spmv(z, &mut r);
    let sum = x.iter().zip(&r).fold(0.0, |s, (&xj, &rj)| {
        let d = xj - rj;
        s + d * d
    });
    sum.sqrt()
}

/// NPB's timed inverse-power loop on an already generated matrix: start from
/// `x = 1`, and `p.niter` times call [`conj_grad`], set
/// `zeta = shift + 1 / (x.z)` and `x = z / ||z||`.  Returns the last zeta.
///
/// NPB's untimed warm-up iteration is omitted: it leaves no trace, since
/// `x` is reset to ones afterwards and `conj_grad` reinitializes all its
/// vectors.
pub fn serial_zeta_on(a: &Csr, p: &ClassParams) -> f64 {
    let n = a.n;
    let mut x = vec![1.0; n];
    let mut z = vec![0.0; n];
    let mut zeta = 0.0;
    for _ in 0..p.niter {
        conj_grad(a, &x, &mut z);
        // norm_temp1 = x.z and norm_temp2 = z.z, accumulated in one loop.
        let (norm_temp1, norm_temp2) = x.iter().zip(&z).fold((0.0, 0.0), |(t1, t2), (&xj, &zj)| {
            (t1 + xj * zj, t2 + zj * zj)
        });
        let norm_temp2 = 1.0 / norm_temp2.sqrt();
        zeta = p.shift + 1.0 / norm_temp1;
        // Normalize z to obtain x.
        for (xj, &zj) in x.iter_mut().zip(&z) {
            *xj = norm_temp2 * zj;
        }
    }
    zeta
}

/// The reference serial NPB CG benchmark for class `p`: [`makea`] followed
/// by [`serial_zeta_on`].  Returns the final zeta, which [`verify`] checks
/// against NPB's published value.
pub fn serial_zeta(p: &ClassParams) -> f64 {
    serial_zeta_on(&makea(p), p)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(class: char) -> ClassParams {
        class_params(class).expect("known NPB class")
    }

    /// Independent oracle for `randlc`: the exact integer recurrence
    /// x <- a*x mod 2^46.
    #[test]
    fn randlc_matches_integer_lcg() {
        const MOD: u128 = 1 << 46;
        let a_int: u128 = 1_220_703_125;
        let mut seed_int: u128 = 314_159_265;
        let mut x = TRAN_SEED;
        for step in 0..10_000 {
            let r = randlc(&mut x, AMULT);
            seed_int = (a_int * seed_int) % MOD;
            assert_eq!(x, seed_int as f64, "seed at step {step}");
            assert_eq!(r, seed_int as f64 / MOD as f64, "value at step {step}");
            assert!(r > 0.0 && r < 1.0);
        }
    }

    #[test]
    fn randlc_first_value() {
        // 1220703125 * 314159265 = 383495196533203125
        //                         = 5449 * 2^46 + 55909509111989.
        let expected: u64 = 55_909_509_111_989;
        assert_eq!(
            1_220_703_125u64 * 314_159_265,
            5449 * (1u64 << 46) + expected
        );
        let mut x = TRAN_SEED;
        let r = randlc(&mut x, AMULT);
        assert_eq!(x, expected as f64);
        assert_eq!(r, expected as f64 / (1u64 << 46) as f64);
    }

    #[test]
    fn class_table() {
        let s = params('S');
        assert_eq!((s.na, s.nonzer, s.niter), (1400, 7, 15));
        assert_eq!(params('w').class, 'W');
        assert_eq!(params('B').na, 75000);
        assert!(class_params('C').is_none());
        assert!(verify(s.zeta_verify, &s));
        assert!(verify(s.zeta_verify * (1.0 + 0.5e-10), &s));
        assert!(!verify(s.zeta_verify * (1.0 + 2e-10), &s));
        assert!(!verify(f64::NAN, &s));
    }

    #[test]
    fn generated_vectors_have_npb_shape() {
        let p = params('S');
        let vecs = generate_vectors(&p);
        assert_eq!(vecs.len(), p.na);
        for (i, v) in vecs.iter().enumerate() {
            assert_eq!(v.idx.len(), v.val.len());
            assert!(v.idx.len() == p.nonzer || v.idx.len() == p.nonzer + 1);
            let mut sorted = v.idx.clone();
            sorted.sort_unstable();
            sorted.dedup();
            assert_eq!(sorted.len(), v.idx.len(), "distinct positions");
            assert!(v.idx.iter().all(|&j| j < p.na));
            let k = v.idx.iter().position(|&j| j == i).expect("vecset adds i");
            assert_eq!(v.val[k], 0.5);
            assert!(v.val.iter().all(|&x| x > 0.0 && x < 1.0));
        }
    }

    /// Literal port of NPB's `sparse` (per-row slots, insertion of each new
    /// column in sorted position, `-1` marks an empty slot, then
    /// compaction), used to check the faster assembly bit for bit.
    fn literal_sparse(n: usize, vecs: &[SparseVec], rcond: f64, shift: f64) -> Csr {
        let mut rowstr = vec![0usize; n + 1];
        for v in vecs {
            for &j in &v.idx {
                rowstr[j + 1] += v.idx.len();
            }
        }
        for j in 0..n {
            rowstr[j + 1] += rowstr[j];
        }
        let nza = rowstr[n];
        let mut a = vec![0.0f64; nza];
        let mut colidx = vec![-1i64; nza];
        let mut nzloc = vec![0usize; n];

        let mut size = 1.0f64;
        let ratio = rcond.powf(1.0 / n as f64);
        for (i, v) in vecs.iter().enumerate() {
            for (nza_i, &j) in v.idx.iter().enumerate() {
                let scale = size * v.val[nza_i];
                for (nzrow, &jcol) in v.idx.iter().enumerate() {
                    let mut va = v.val[nzrow] * scale;
                    if jcol == j && j == i {
                        va = (va + rcond) - shift;
                    }
                    let jc = jcol as i64;
                    let mut found = None;
                    for k in rowstr[j]..rowstr[j + 1] {
                        if colidx[k] > jc {
                            let mut kk = rowstr[j + 1] - 2;
                            while kk >= k {
                                if colidx[kk] > -1 {
                                    a[kk + 1] = a[kk];
                                    colidx[kk + 1] = colidx[kk];
                                }
                                if kk == 0 {
                                    break;
                                }
                                kk -= 1;
                            }
                            colidx[k] = jc;
                            a[k] = 0.0;
                            found = Some(k);
                            break;
                        } else if colidx[k] == -1 {
                            colidx[k] = jc;
                            found = Some(k);
                            break;
                        } else if colidx[k] == jc {
                            nzloc[j] += 1;
                            found = Some(k);
                            break;
                        }
                    }
                    let k = found.expect("internal error in sparse");
                    a[k] += va;
                }
            }
            size *= ratio;
        }

        for j in 1..n {
            nzloc[j] += nzloc[j - 1];
        }
        let mut out_a = Vec::new();
        let mut out_col = Vec::new();
        for j in 0..n {
            let prev = if j > 0 { nzloc[j - 1] } else { 0 };
            let keep = (rowstr[j + 1] - rowstr[j]) - (nzloc[j] - prev);
            for k in rowstr[j]..rowstr[j] + keep {
                out_a.push(a[k]);
                out_col.push(usize::try_from(colidx[k]).expect("filled slot"));
            }
        }
        let mut out_rowstr = vec![0usize; n + 1];
        for j in 1..=n {
            out_rowstr[j] = rowstr[j] - nzloc[j - 1];
        }
        Csr {
            n,
            first_row: 0,
            rowstr: out_rowstr,
            colidx: out_col,
            a: out_a,
        }
    }

    #[test]
    fn sparse_matches_literal_npb_port_bitwise() {
        for class in ['S', 'W'] {
            let p = params(class);
            let vecs = generate_vectors(&p);
            let fast = sparse(p.na, 0..p.na, &vecs, RCOND, p.shift);
            let slow = literal_sparse(p.na, &vecs, RCOND, p.shift);
            assert_eq!(fast.rowstr, slow.rowstr, "class {class}");
            assert_eq!(fast.colidx, slow.colidx, "class {class}");
            let fb: Vec<u64> = fast.a.iter().map(|x| x.to_bits()).collect();
            let sb: Vec<u64> = slow.a.iter().map(|x| x.to_bits()).collect();
            assert!(fb == sb, "class {class}: values differ");
        }
    }

    #[test]
    fn row_blocks_are_the_rows_of_the_whole_matrix_bitwise() {
        let p = params('S');
        let whole = makea(&p);
        for size in [1, 3, 4] {
            for rank in 0..size {
                let (lo, hi) = crate::apps::cg::block(p.na, rank, size);
                let block = makea_rows(&p, lo..hi);
                assert_eq!(block.rows(), lo..hi);
                assert_eq!(block.n, p.na);
                for r in lo..hi {
                    let ((bc, ba), (wc, wa)) = (block.row(r), whole.row(r));
                    assert_eq!(bc, wc, "row {r} of block {rank}/{size}");
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(ba), bits(wa), "row {r} of block {rank}/{size}");
                }
            }
        }
        assert_eq!(makea_rows(&p, 7..7).nnz(), 0);
    }

    #[test]
    fn matrix_structure_is_symmetric_and_sorted() {
        let p = params('S');
        let m = makea(&p);
        assert_eq!(m.n, p.na);
        assert_eq!(m.rowstr.len(), p.na + 1);
        assert_eq!(m.rowstr[0], 0);
        assert_eq!(m.rowstr[p.na], m.nnz());
        assert_eq!(m.colidx.len(), m.nnz());
        // NPB's allocation bound nz = na*(nonzer+1)^2 (before the extra
        // na*(nonzer+2) slack) is never exceeded.
        assert!(m.nnz() <= p.na * (p.nonzer + 1) * (p.nonzer + 1));

        let mut containing = vec![0usize; p.na];
        for v in generate_vectors(&p) {
            for j in v.idx {
                containing[j] += 1;
            }
        }
        let entry = |r: usize, c: usize| -> Option<f64> {
            let (lo, hi) = (m.rowstr[r], m.rowstr[r + 1]);
            m.colidx[lo..hi].binary_search(&c).ok().map(|k| m.a[lo + k])
        };
        for (r, &n_containing) in containing.iter().enumerate() {
            let cols = &m.colidx[m.rowstr[r]..m.rowstr[r + 1]];
            assert!(cols.windows(2).all(|w| w[0] < w[1]), "row {r} sorted");
            let d = entry(r, r).expect("diagonal present");
            // Diagonal: rcond - shift plus one term size_i * v_i[r]^2 in
            // (0, 1) per generating vector containing r; vector r itself
            // contributes 0.25 * size_r >= 0.25 * rcond.
            let shifted = d - (RCOND - p.shift);
            assert!(shifted >= 0.25 * RCOND * (1.0 - 1e-12), "row {r}");
            assert!(shifted < n_containing as f64, "row {r}");
            for (k, &c) in cols.iter().enumerate() {
                let arc = m.a[m.rowstr[r] + k];
                let acr = entry(c, r).expect("structurally symmetric");
                if c != r {
                    // Off-diagonal entries are sums of positive products; the
                    // two triangles differ only by product rounding.
                    assert!(arc > 0.0);
                    assert!((arc - acr).abs() <= 1e-14 * arc, "({r},{c})");
                }
            }
        }
    }

    #[test]
    fn conj_grad_reduces_residual() {
        let p = params('S');
        let m = makea(&p);
        let x = vec![1.0; m.n];
        let mut z = vec![0.0; m.n];
        let rnorm = conj_grad(&m, &x, &mut z);
        assert!(rnorm.is_finite());
        assert!(rnorm < 1e-6 * (m.n as f64).sqrt(), "rnorm = {rnorm}");
    }

    #[test]
    fn class_s_verifies() {
        let p = params('S');
        let zeta = serial_zeta(&p);
        assert!(
            verify(zeta, &p),
            "zeta = {zeta:.13}, expected {}",
            p.zeta_verify
        );
    }

    #[test]
    fn class_w_verifies() {
        let p = params('W');
        let zeta = serial_zeta(&p);
        assert!(
            verify(zeta, &p),
            "zeta = {zeta:.13}, expected {}",
            p.zeta_verify
        );
    }
}
