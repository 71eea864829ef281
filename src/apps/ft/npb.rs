//! NAS FT's problem as NPB 3.4 defines it (`ft.f90`): the classes, the
//! random initial condition, the time-evolution exponents, the checksum's
//! sample points and the published checksums (`verify`).
//!
//! Indices are 0-based here (NPB's `i` is `i - 1`). The generator is NPB's
//! `randlc`/`vranlc` (`x <- 5^13 x mod 2^46`, scaled by `2^-46`) done in
//! integers: the double-precision original is exact, so both give the same
//! bits.

use num_complex::Complex64;

/// First state of the generator (`seed` in `ft_data`).
pub const SEED: u64 = 314_159_265;

/// The generator's multiplier, 5^13 (`a` in `ft_data`).
pub const A: u64 = 1_220_703_125;

/// The diffusion constant of the evolution operator (`alpha`).
pub const ALPHA: f64 = 1.0e-6;

/// NPB's verification tolerance on each checksum's relative error
/// (`epsilon` in `verify`).
pub const EPSILON: f64 = 1.0e-12;

/// Sample points per checksum (`do j = 1, 1024` in `checksum`).
pub const CHECKSUM_POINTS: usize = 1024;

const MASK: u64 = (1 << 46) - 1;
const R46: f64 = 1.0 / (1u64 << 46) as f64;

/// One NPB FT problem class.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Class {
    /// Class letter.
    pub class: char,
    /// Grid points along x (the fastest index of the initial condition).
    pub nx: usize,
    /// Grid points along y.
    pub ny: usize,
    /// Grid points along z.
    pub nz: usize,
    /// Time steps (`niter_default`).
    pub niter: usize,
    /// NPB's published checksum after each time step (`vdata_real_*`,
    /// `vdata_imag_*`).
    pub checksums: &'static [(f64, f64)],
}

impl Class {
    /// Points in the grid (`ntotal`).
    pub fn points(&self) -> usize {
        self.nx * self.ny * self.nz
    }
}

const S: [(f64, f64); 6] = [
    (5.546087004964e+02, 4.845363331978e+02),
    (5.546385409189e+02, 4.865304269511e+02),
    (5.546148406171e+02, 4.883910722336e+02),
    (5.545423607415e+02, 4.901273169046e+02),
    (5.544255039624e+02, 4.917475857993e+02),
    (5.542683411902e+02, 4.932597244941e+02),
];

const W: [(f64, f64); 6] = [
    (5.673612178944e+02, 5.293246849175e+02),
    (5.631436885271e+02, 5.282149986629e+02),
    (5.594024089970e+02, 5.270996558037e+02),
    (5.560698047020e+02, 5.260027904925e+02),
    (5.530898991250e+02, 5.249400845633e+02),
    (5.504159734538e+02, 5.239212247086e+02),
];

const A_: [(f64, f64); 6] = [
    (5.046735008193e+02, 5.114047905510e+02),
    (5.059412319734e+02, 5.098809666433e+02),
    (5.069376896287e+02, 5.098144042213e+02),
    (5.077892868474e+02, 5.101336130759e+02),
    (5.085233095391e+02, 5.104914655194e+02),
    (5.091487099959e+02, 5.107917842803e+02),
];

const B: [(f64, f64); 20] = [
    (5.177643571579e+02, 5.077803458597e+02),
    (5.154521291263e+02, 5.088249431599e+02),
    (5.146409228649e+02, 5.096208912659e+02),
    (5.142378756213e+02, 5.101023387619e+02),
    (5.139626667737e+02, 5.103976610617e+02),
    (5.137423460082e+02, 5.105948019802e+02),
    (5.135547056878e+02, 5.107404165783e+02),
    (5.133910925466e+02, 5.108576573661e+02),
    (5.132470705390e+02, 5.109577278523e+02),
    (5.131197729984e+02, 5.110460304483e+02),
    (5.130070319283e+02, 5.111252433800e+02),
    (5.129070537032e+02, 5.111968077718e+02),
    (5.128182883502e+02, 5.112616233064e+02),
    (5.127393733383e+02, 5.113203605551e+02),
    (5.126691062020e+02, 5.113735928093e+02),
    (5.126064276004e+02, 5.114218460548e+02),
    (5.125504076570e+02, 5.114656139760e+02),
    (5.125002331720e+02, 5.115053595966e+02),
    (5.124551951846e+02, 5.115415130407e+02),
    (5.124146770029e+02, 5.115744692211e+02),
];

/// The NPB FT parameters of `class` (case-insensitive): S, W, A or B.
pub fn class_params(class: char) -> Option<Class> {
    let class = class.to_ascii_uppercase();
    let (nx, ny, nz, checksums): (_, _, _, &'static [(f64, f64)]) = match class {
        'S' => (64, 64, 64, &S),
        'W' => (128, 128, 32, &W),
        'A' => (256, 256, 128, &A_),
        'B' => (512, 256, 256, &B),
        _ => return None,
    };
    Some(Class {
        class,
        nx,
        ny,
        nz,
        niter: checksums.len(),
        checksums,
    })
}

/// NPB's `verify`: every step's checksum within [`EPSILON`] (relative, real
/// and imaginary parts apart, NaN failing) of the published one. A run of
/// fewer steps (`--iterations`) is checked on the steps it ran. `Err`
/// names the first step that is not.
pub fn verify(sums: &[Complex64], class: &Class) -> std::result::Result<(), String> {
    if sums.is_empty() || sums.len() > class.niter {
        return Err(format!(
            "{} checksums for 1..={} time steps",
            sums.len(),
            class.niter
        ));
    }
    let off = |got: f64, want: f64| {
        let err = ((got - want) / want).abs();
        err.is_nan() || err > EPSILON
    };
    for (t, (got, &(re, im))) in sums.iter().zip(class.checksums).enumerate() {
        if off(got.re, re) || off(got.im, im) {
            return Err(format!(
                "step {}: checksum {:.12e} {:.12e}, NPB's {re:.12e} {im:.12e}",
                t + 1,
                got.re,
                got.im
            ));
        }
    }
    Ok(())
}

/// `a^n mod 2^46` (NPB's `ipow46`, by squaring). The products wrap modulo
/// 2^64, a multiple of 2^46, so masking afterwards is exact.
pub fn pow46(a: u64, mut n: u64) -> u64 {
    let (mut result, mut q) = (1u64, a & MASK);
    while n > 0 {
        if n & 1 == 1 {
            result = result.wrapping_mul(q) & MASK;
        }
        q = q.wrapping_mul(q) & MASK;
        n >>= 1;
    }
    result
}

/// Row `(j, k)` of the initial condition (NPB's
/// `compute_initial_conditions`): the generator's stream fills the grid in
/// x-fastest order, two numbers (real, imaginary) per point, so the row
/// starts `2 nx (j + ny k)` steps into it.
pub fn initial_row(class: &Class, j: usize, k: usize, row: &mut [Complex64]) {
    debug_assert_eq!(row.len(), class.nx);
    let skip = 2 * (class.nx as u64) * (j + class.ny * k) as u64;
    let mut x = SEED.wrapping_mul(pow46(A, skip)) & MASK;
    let mut next = || {
        x = x.wrapping_mul(A) & MASK;
        x as f64 * R46
    };
    for z in row {
        let re = next();
        *z = Complex64::new(re, next());
    }
}

/// `ibar^2` of index `i` along an axis of `n` points: the index taken as a
/// wave number in `[-n/2, n/2)` (`compute_indexmap`'s
/// `mod(i-1+n/2, n) - n/2`), squared.
pub fn wave_number_squared(i: usize, n: usize) -> u64 {
    let w = ((i + n / 2) % n) as i64 - (n / 2) as i64;
    (w * w) as u64
}

/// The evolution factor of one step at a point whose squared wave numbers
/// sum to `k2`: `exp(-4 alpha pi^2 k2)` (`compute_indexmap`'s `twiddle`).
pub fn twiddle(k2: u64) -> f64 {
    let ap = -4.0 * ALPHA * std::f64::consts::PI * std::f64::consts::PI;
    (ap * k2 as f64).exp()
}

/// The checksum's sample points `(x, y, z)`, in NPB's order
/// (`q = mod(j, nx)`, `r = mod(3j, ny)`, `s = mod(5j, nz)`, j = 1..=1024).
pub fn checksum_points(class: &Class) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    (1..=CHECKSUM_POINTS).map(|j| (j % class.nx, (3 * j) % class.ny, (5 * j) % class.nz))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apps::cg::npb::randlc;

    #[test]
    fn the_integer_generator_is_npbs_randlc() {
        // NPB's double-precision randlc from the same seed, 2,000 steps.
        let mut x = SEED as f64;
        let class = class_params('S').unwrap();
        let mut row = vec![Complex64::default(); class.nx];
        let mut rows = Vec::new();
        for j in 0..16 {
            initial_row(&class, j, 0, &mut row);
            rows.extend_from_slice(&row);
        }
        for z in rows {
            assert_eq!(z.re.to_bits(), randlc(&mut x, A as f64).to_bits());
            assert_eq!(z.im.to_bits(), randlc(&mut x, A as f64).to_bits());
        }
    }

    #[test]
    fn a_row_far_into_the_grid_starts_where_the_stream_is() {
        // Jumping with pow46 equals stepping: row (1, 1) of class S starts
        // 2 * 64 * 65 steps in.
        let class = class_params('S').unwrap();
        let mut x = SEED;
        for _ in 0..2 * 64 * 65 {
            x = x.wrapping_mul(A) & MASK;
        }
        let mut row = vec![Complex64::default(); class.nx];
        initial_row(&class, 1, 1, &mut row);
        assert_eq!(row[0].re, (x.wrapping_mul(A) & MASK) as f64 * R46);
    }

    #[test]
    fn wave_numbers_run_from_minus_half() {
        let w: Vec<u64> = (0..8).map(|i| wave_number_squared(i, 8)).collect();
        assert_eq!(w, [0, 1, 4, 9, 16, 9, 4, 1]);
    }

    #[test]
    fn verify_names_the_first_step_off() {
        let class = class_params('S').unwrap();
        let mut sums: Vec<Complex64> = class
            .checksums
            .iter()
            .map(|&(re, im)| Complex64::new(re, im))
            .collect();
        assert!(verify(&sums, &class).is_ok());
        sums[3].im *= 1.0 + 1e-11;
        let why = verify(&sums, &class).unwrap_err();
        assert!(why.starts_with("step 4"), "{why}");
        sums[3].im = f64::NAN;
        assert!(verify(&sums, &class).is_err());
        // The first steps of a shorter run are checked, and only they.
        assert!(verify(&sums[..3], &class).is_ok());
        assert!(verify(&sums[..4], &class).is_err());
        assert!(verify(&[], &class).is_err());
        let good = Complex64::new(class.checksums[0].0, class.checksums[0].1);
        assert!(verify(&vec![good; class.niter + 1], &class).is_err());
    }
}
