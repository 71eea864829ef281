//! Communication-pattern versions of the apps, for scale studies on the
//! simulator (`lazarus sim`).
//!
//! A pattern app moves the messages of a real app but charges its computation
//! in virtual time ([`Ctx::compute`]) instead of executing it, so a run of
//! 10,000+ simulated ranks fits in memory: every rank keeps a few dozen bytes
//! of protected state plus one payload buffer, and nothing sized by the rank
//! count.
//!
//! | pattern | per iteration |
//! | --- | --- |
//! | [`Pattern::Stencil`] | compute, halo exchange with up to 4 neighbours of a 2-D process grid, safe point |
//! | [`Pattern::Allreduce`] | compute, `all_reduce` (sum) of `reduce_len` `f64`, safe point |
//!
//! **Verification.** Each rank folds what it receives into a protected `u64`
//! checksum (wrapping arithmetic); at the end the checksums are summed with an
//! `all_reduce` and compared with a closed-form value computed in O(1) from the
//! rank count and the parameters. The value depends on the received data and
//! on the iteration numbers, not on the schedule, the protocol or the failures,
//! so a run that restored the wrong state or lost or duplicated a message does
//! not verify.

use std::fmt;
use std::str::FromStr;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{Verification, safe_point};
use crate::{Config, Ctx, Error, JobReport, Rank, ReduceOp, Result};

/// The communication patterns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Pattern {
    /// Halo exchange on a 2-D process grid (the stencil's pattern).
    Stencil,
    /// One `all_reduce` per iteration (the pattern of CG's dot products).
    Allreduce,
}

impl Pattern {
    /// All patterns.
    pub const ALL: [Pattern; 2] = [Pattern::Stencil, Pattern::Allreduce];

    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Stencil => "stencil",
            Pattern::Allreduce => "allreduce",
        }
    }
}

impl fmt::Display for Pattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Pattern {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        Pattern::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Pattern::ALL.iter().map(|p| p.name()).collect();
                Error::config(
                    "PATTERN",
                    format!(
                        "unknown communication pattern `{s}` (known: {})",
                        names.join(", ")
                    ),
                )
            })
    }
}

/// Parameters of a pattern run.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PatternParams {
    /// Iterations (safe points).
    pub iterations: u64,
    /// Virtual seconds of computation per iteration per rank.
    pub compute_s: f64,
    /// Stencil: bytes per halo message (at least 8: the first 8 carry the
    /// sender's identity, which the checksum uses).
    pub halo_bytes: usize,
    /// Allreduce: number of `f64` elements reduced per iteration (at least 1).
    pub reduce_len: usize,
    /// Load imbalance: odd ranks compute this many times `compute_s` per
    /// iteration (1: balanced), so ranks reach safe points at different
    /// times.
    pub imbalance: f64,
    /// Bytes of protected state per rank beyond the counters (a rank's
    /// data, as an application's arrays: checkpointed, restored, and moved
    /// with the rank; 001 Fig. 4a's rank state). Checked at the end.
    pub state_bytes: usize,
}

impl Default for PatternParams {
    /// 20 iterations, 1 ms of compute per iteration, 8 KiB halos, a
    /// one-element all-reduce.
    fn default() -> Self {
        PatternParams {
            iterations: 20,
            compute_s: 1e-3,
            halo_bytes: 8 << 10,
            reduce_len: 1,
            imbalance: 1.0,
            state_bytes: 0,
        }
    }
}

/// Largest protected state per rank (`--state-bytes`).
pub const MAX_STATE_BYTES: usize = 1 << 30;

/// Largest value an allreduce element may reach while staying exact in `f64`.
const F64_EXACT: u128 = 1 << 53;

/// Largest stencil halo message (`--halo-bytes`): every simulated rank
/// allocates its messages for real, so the bound keeps a study of many
/// ranks from asking the allocator for the impossible.
pub const MAX_HALO_BYTES: usize = 64 << 20;

impl PatternParams {
    /// Check the parameters for `pattern` on `ranks` ranks.
    pub fn validate(&self, pattern: Pattern, ranks: usize) -> Result<()> {
        if self.iterations == 0 {
            return Err(Error::config("iterations", "at least one iteration"));
        }
        if !self.compute_s.is_finite() || self.compute_s < 0.0 || self.compute_s > 1e6 {
            return Err(Error::config(
                "compute_s",
                format!(
                    "compute time per iteration must be in [0, 1e6] seconds, not {}",
                    self.compute_s
                ),
            ));
        }
        if !self.imbalance.is_finite() || !(1.0..=1000.0).contains(&self.imbalance) {
            return Err(Error::config(
                "imbalance",
                format!(
                    "odd ranks' compute factor must be in [1, 1000], not {}",
                    self.imbalance
                ),
            ));
        }
        if self.state_bytes > MAX_STATE_BYTES {
            return Err(Error::config(
                "state_bytes",
                format!(
                    "a rank's state is at most {MAX_STATE_BYTES} bytes, not {}",
                    self.state_bytes
                ),
            ));
        }
        match pattern {
            Pattern::Stencil if self.halo_bytes > MAX_HALO_BYTES => Err(Error::config(
                "halo_bytes",
                format!(
                    "a halo message is at most {MAX_HALO_BYTES} bytes (each rank holds four \
                     of them at once), not {}",
                    self.halo_bytes
                ),
            )),
            Pattern::Stencil if self.halo_bytes < 8 => Err(Error::config(
                "halo_bytes",
                format!(
                    "a halo message needs at least 8 bytes (the sender's identity), not {}",
                    self.halo_bytes
                ),
            )),
            Pattern::Allreduce if self.reduce_len == 0 => {
                Err(Error::config("reduce_len", "reduce at least one element"))
            }
            Pattern::Allreduce => {
                // The largest element of the last iteration must be exact in f64.
                let p = ranks as u128;
                let largest = p * (p + 1) / 2
                    + p * (self.reduce_len as u128 - 1 + u128::from(self.iterations));
                if largest >= F64_EXACT {
                    return Err(Error::config(
                        "reduce_len",
                        format!(
                            "{ranks} ranks, {} elements and {} iterations make sums beyond 2^53, which f64 does not hold exactly",
                            self.reduce_len, self.iterations
                        ),
                    ));
                }
                Ok(())
            }
            Pattern::Stencil => Ok(()),
        }
    }
}

/// The `px x py` process grid of `ranks` ranks: the most nearly square
/// factorization with `px <= py` (a prime rank count gives `1 x ranks`).
pub fn grid(ranks: usize) -> (usize, usize) {
    let ranks = ranks.max(1);
    let mut px = ranks.isqrt();
    while px > 1 && !ranks.is_multiple_of(px) {
        px -= 1;
    }
    let px = px.max(1);
    (px, ranks / px)
}

/// Protected state of a pattern rank.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct State {
    /// Iterations done.
    it: u64,
    /// Running checksum of received data (wrapping).
    checksum: u64,
    /// The rank's data (`state_bytes`), every byte its rank's number mod
    /// 251: whatever restores or moves the state must keep it.
    #[serde(with = "crate::api::datatype::bulk")]
    data: Vec<u8>,
}

/// What every byte of rank `rank`'s data holds.
fn data_byte(rank: usize) -> u8 {
    (rank % 251) as u8
}

/// Tags by direction of travel.
const TAG_EAST: i32 = 20;
const TAG_WEST: i32 = 21;
const TAG_SOUTH: i32 = 22;
const TAG_NORTH: i32 = 23;

/// Checksum weights by the side a halo comes from: left, right, up, down.
const W_LEFT: u128 = 1;
const W_RIGHT: u128 = 2;
const W_UP: u128 = 3;
const W_DOWN: u128 = 5;

/// `a + (a+1) + ... + (b-1)` (0 when `b <= a`), exact, then mod 2^128.
fn range_sum(a: u128, b: u128) -> u128 {
    if b <= a {
        return 0;
    }
    let (n, s) = (b - a, a + b - 1);
    // One of n and a + b - 1 = 2a + n - 1 is even: halve it before multiplying.
    if n.is_multiple_of(2) {
        (n / 2).wrapping_mul(s)
    } else {
        n.wrapping_mul(s / 2)
    }
}

/// Sum of `rank + 1` over the grid block `x0..x1` by `y0..y1`.
fn block_sum(px: u128, x: (u128, u128), y: (u128, u128)) -> u128 {
    let nx = x.1.saturating_sub(x.0);
    let ny = y.1.saturating_sub(y.0);
    nx.wrapping_mul(px)
        .wrapping_mul(range_sum(y.0, y.1))
        .wrapping_add(ny.wrapping_mul(range_sum(x.0, x.1)))
        .wrapping_add(nx.wrapping_mul(ny))
}

/// The closed-form final value of `pattern` on `ranks` ranks: what the sum of
/// every rank's checksum must be, whatever the schedule and failures.
pub fn expected(pattern: Pattern, ranks: usize, p: &PatternParams) -> u64 {
    let n = ranks as u128;
    let it = u128::from(p.iterations);
    // Sum of the iteration numbers 1..=I.
    let t = range_sum(1, it + 1);
    let v = match pattern {
        Pattern::Stencil => {
            // Rank r (x = r % px, y = r / px) receives, at iteration i,
            // i * w_side * (sender + 1) from each neighbour. Summed over the
            // receivers of one side, the senders form a block of the grid.
            let (px, py) = grid(ranks);
            let (px, py) = (px as u128, py as u128);
            let from_left = block_sum(px, (0, px - 1), (0, py));
            let from_right = block_sum(px, (1, px), (0, py));
            let from_up = block_sum(px, (0, px), (0, py - 1));
            let from_down = block_sum(px, (0, px), (1, py));
            let sides = (W_LEFT.wrapping_mul(from_left))
                .wrapping_add(W_RIGHT.wrapping_mul(from_right))
                .wrapping_add(W_UP.wrapping_mul(from_up))
                .wrapping_add(W_DOWN.wrapping_mul(from_down));
            t.wrapping_mul(sides)
        }
        Pattern::Allreduce => {
            // Element k of iteration i is sum_r (r + 1 + k + i)
            // = n(n+1)/2 + n k + n i; each rank adds every element of every
            // iteration, and the final all_reduce sums n equal checksums.
            let l = p.reduce_len as u128;
            let per_rank = it
                .wrapping_mul(l)
                .wrapping_mul(range_sum(1, n + 1))
                .wrapping_add(it.wrapping_mul(n).wrapping_mul(range_sum(0, l)))
                .wrapping_add(l.wrapping_mul(n).wrapping_mul(t));
            n.wrapping_mul(per_rank)
        }
    };
    v as u64 // mod 2^64, as the wrapping checksums
}

/// The rank function of a pattern app.
pub fn rank_main(
    ctx: &mut Ctx,
    pattern: Pattern,
    p: &PatternParams,
    halos: &HaloTable,
) -> Result<Verification> {
    let world = ctx.world();
    let (rank, size) = (world.rank(), world.size());
    p.validate(pattern, size)?;
    let mut st: State = ctx.restore_or_else(|| State {
        data: vec![data_byte(rank); p.state_bytes],
        ..State::default()
    })?;
    let (px, py) = grid(size);
    let compute_s = if rank % 2 == 1 {
        p.compute_s * p.imbalance
    } else {
        p.compute_s
    };
    match pattern {
        Pattern::Stencil => {
            let (x, y) = (rank % px, rank / px);
            // (neighbour, tag I send it, tag it sends me, weight of what it sends me)
            let left = (x > 0).then(|| (rank - 1, TAG_WEST, TAG_EAST, W_LEFT));
            let right = (x + 1 < px).then(|| (rank + 1, TAG_EAST, TAG_WEST, W_RIGHT));
            let up = (y > 0).then(|| (rank - px, TAG_NORTH, TAG_SOUTH, W_UP));
            let down = (y + 1 < py).then(|| (rank + px, TAG_SOUTH, TAG_NORTH, W_DOWN));
            let neighbours = [left, right, up, down];
            // One payload per rank incarnation, shared by every send: the
            // sender's identity first (what the receiver checks).
            let payload = halos.payload(rank, p.halo_bytes);
            while st.it < p.iterations {
                let i = st.it + 1;
                ctx.compute(compute_s)?;
                for &(n, send_tag, _, _) in neighbours.iter().flatten() {
                    world.send_bytes(n, send_tag, payload.clone())?;
                }
                for &(n, _, recv_tag, w) in neighbours.iter().flatten() {
                    let m = world.receive_bytes(n, recv_tag)?;
                    if m.payload.len() != p.halo_bytes {
                        return Err(Error::SizeMismatch {
                            expected: p.halo_bytes,
                            got: m.payload.len(),
                            what: "halo message of the stencil pattern".into(),
                        });
                    }
                    let mut id = [0u8; 8];
                    id.copy_from_slice(&m.payload[..8]);
                    let sender = u64::from_le_bytes(id);
                    st.checksum = st
                        .checksum
                        .wrapping_add(i.wrapping_mul(w as u64).wrapping_mul(sender));
                }
                st.it = i;
                safe_point(ctx, &st, st.it, p.iterations)?;
            }
        }
        Pattern::Allreduce => {
            let mut data = vec![0.0f64; p.reduce_len];
            let mut out = vec![0.0f64; p.reduce_len];
            while st.it < p.iterations {
                let i = st.it + 1;
                ctx.compute(compute_s)?;
                for (k, d) in data.iter_mut().enumerate() {
                    *d = (rank as u64 + 1 + k as u64 + i) as f64;
                }
                world.all_reduce_into(&data, &mut out, ReduceOp::Sum)?;
                // Every element is an integer below 2^53 (validated), exact.
                st.checksum = out
                    .iter()
                    .fold(st.checksum, |c, &v| c.wrapping_add(v as u64));
                st.it = i;
                safe_point(ctx, &st, st.it, p.iterations)?;
            }
        }
    }
    let total = world.all_reduce(st.checksum, ReduceOp::Sum)?;
    let reference = expected(pattern, size, p);
    // The data came through every restore and move intact.
    let data_ok = st.data.len() == p.state_bytes && st.data.iter().all(|&b| b == data_byte(rank));
    let damaged = world.all_reduce(u64::from(!data_ok), ReduceOp::Sum)?;
    let verified = total == reference && damaged == 0;
    // Only rank 0's verification is reported: the others stay small.
    let (detail, metrics) = if rank == 0 {
        (
            format!(
                "{pattern} pattern on {size} ranks ({px} x {py} grid): checksum {total} vs closed form {reference}; {damaged} rank(s) with damaged data"
            ),
            serde_json::json!({
                "pattern": pattern.name(),
                "ranks": size,
                "grid": [px, py],
                "iterations": p.iterations,
                "compute_s": p.compute_s,
                "halo_bytes": p.halo_bytes,
                "reduce_len": p.reduce_len,
                "imbalance": p.imbalance,
                "state_bytes": p.state_bytes,
                "damaged_ranks": damaged,
                "checksum": total,
                "expected": reference,
            }),
        )
    } else {
        (String::new(), serde_json::Value::Null)
    };
    Ok(Verification {
        value: total.to_string(),
        verified,
        detail,
        metrics,
    })
}

/// Run `pattern` under `cfg` (its `iterations` is filled in here, so that
/// `--kill R@iI` is validated against the run).
pub fn run_pattern(pattern: Pattern, p: &PatternParams, cfg: &Config) -> JobReport<Verification> {
    let mut cfg = cfg.clone();
    cfg.iterations = Some(p.iterations);
    if let Err(e) = p.validate(pattern, cfg.ranks) {
        return JobReport {
            outcome: Err(e),
            stats: crate::JobStats::default(),
            sim: None,
            rank: None,
        };
    }
    let p = *p;
    let halos = HaloTable::new(cfg.ranks, p.halo_bytes);
    crate::run(&cfg, move |ctx| rank_main(ctx, pattern, &p, &halos))
}

/// The stencil's halo payloads of every rank, as windows of one table of
/// identities: word `i` is `i + 1`, and rank `r`'s payload is the
/// `halo_bytes` from word `r` on, so it begins with its sender's identity
/// (what the receiver checks) and goes on with the next ranks'. A payload
/// of its own per rank was 8 KiB of every simulated rank's memory (a third
/// of it at 16,384 ranks under `coordinated`); the table is 8 bytes a rank.
#[derive(Clone)]
pub struct HaloTable(Bytes);

impl HaloTable {
    /// The table for `ranks` ranks and payloads of `halo_bytes`.
    pub fn new(ranks: usize, halo_bytes: usize) -> Self {
        let words = ranks + halo_bytes.div_ceil(8);
        HaloTable(Bytes::from(
            (1..=words as u64)
                .flat_map(u64::to_le_bytes)
                .collect::<Vec<u8>>(),
        ))
    }

    /// Rank `rank`'s payload of `halo_bytes` (empty if the table is too
    /// small for it).
    pub fn payload(&self, rank: Rank, halo_bytes: usize) -> Bytes {
        let range = rank * 8..rank * 8 + halo_bytes;
        if range.end <= self.0.len() {
            self.0.slice(range)
        } else {
            Bytes::new()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Backend, ProtocolKind};

    #[test]
    fn grids_are_near_square() {
        assert_eq!(grid(1), (1, 1));
        assert_eq!(grid(2), (1, 2));
        assert_eq!(grid(12), (3, 4));
        assert_eq!(grid(64), (8, 8));
        assert_eq!(grid(33), (3, 11));
        assert_eq!(grid(37), (1, 37));
        assert_eq!(grid(4096), (64, 64));
        assert_eq!(grid(16384), (128, 128));
        for n in 1..200 {
            let (px, py) = grid(n);
            assert_eq!(px * py, n);
            assert!(px <= py);
        }
    }

    /// The closed form against a direct sum over the grid.
    #[test]
    fn closed_form_matches_brute_force() {
        let p = PatternParams {
            iterations: 7,
            reduce_len: 3,
            ..PatternParams::default()
        };
        for n in 1..50usize {
            let (px, py) = grid(n);
            let mut sides = 0u64;
            for r in 0..n {
                let (x, y) = (r % px, r / px);
                if x > 0 {
                    sides += W_LEFT as u64 * r as u64; // sender r - 1, plus one
                }
                if x + 1 < px {
                    sides += W_RIGHT as u64 * (r as u64 + 2);
                }
                if y > 0 {
                    sides += W_UP as u64 * (r - px + 1) as u64;
                }
                if y + 1 < py {
                    sides += W_DOWN as u64 * (r + px + 1) as u64;
                }
            }
            assert_eq!(expected(Pattern::Stencil, n, &p), 28 * sides, "n = {n}");
            let mut all = 0u64;
            for i in 1..=7u64 {
                for k in 0..3u64 {
                    all += (0..n as u64).map(|r| r + 1 + k + i).sum::<u64>();
                }
            }
            assert_eq!(expected(Pattern::Allreduce, n, &p), n as u64 * all);
        }
    }

    #[test]
    fn names_parse() {
        for pat in Pattern::ALL {
            assert_eq!(pat.to_string().parse::<Pattern>().ok(), Some(pat));
        }
        let e = "cg".parse::<Pattern>().err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("stencil, allreduce")));
    }

    #[test]
    fn bad_parameters_are_refused() {
        let p = PatternParams {
            halo_bytes: 4,
            ..PatternParams::default()
        };
        assert!(p.validate(Pattern::Stencil, 4).is_err());
        assert!(p.validate(Pattern::Allreduce, 4).is_ok());
        let p = PatternParams {
            reduce_len: 1 << 40,
            ..PatternParams::default()
        };
        assert!(p.validate(Pattern::Allreduce, 1 << 20).is_err());
        let r = run_pattern(
            Pattern::Stencil,
            &PatternParams {
                iterations: 0,
                ..PatternParams::default()
            },
            &Config::new(4),
        );
        assert!(r.outcome.is_err());
    }

    /// Both backends, small: the patterns verify and agree.
    #[test]
    fn patterns_verify_on_both_backends() {
        let p = PatternParams {
            iterations: 6,
            compute_s: 1e-5,
            halo_bytes: 64,
            reduce_len: 4,
            imbalance: 2.0,
            state_bytes: 4096,
        };
        for pat in Pattern::ALL {
            for b in [Backend::Threads, Backend::Sim] {
                let cfg = Config::new(6)
                    .backend(b)
                    .protocol(ProtocolKind::Coordinated)
                    .checkpoint_every(2);
                let r = run_pattern(pat, &p, &cfg);
                let v = r.outcome.expect("pattern run");
                assert_eq!(v.len(), 6);
                assert!(v.iter().all(|v| v.verified), "{pat} on {b}: {:?}", v[0]);
                assert_eq!(v[0].value, expected(pat, 6, &p).to_string());
            }
        }
    }
}
