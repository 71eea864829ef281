//! NAS FT (NPB 3.4), the 3-D FFT benchmark of 003 §7: a diffusion equation
//! solved spectrally. The random initial condition is transformed forward
//! once; each time step multiplies the spectrum by the evolution factors,
//! transforms a copy back and takes NPB's checksum of 1,024 points, which
//! is verified against NPB's published value for every step.
//!
//! The grid is decomposed in pencils over a `p1 x p2` rank grid
//! ([`pencil`]); a 3-D transform is 1-D FFTs (rustfft) along the whole
//! axis a layout holds, with a transpose between axes. A transpose moves
//! the blocks either as puts into the members' window between two fences
//! ([`Exchange::Put`], `MPI_Put` in a fence epoch: one-sided, the targets
//! do not take part, 003's setting; where window memory is shared, the
//! origin copies straight into the target's) or as an all-to-all among a row's or a column's ranks
//! ([`Exchange::AllToAll`], NPB's MPI version). Only data moves between the
//! FFTs, so every rank count and both exchanges give bit-identical
//! checksums.
//!
//! The time step is the safe point; the protected state is the spectrum in
//! z-pencils, the step number and the checksums so far (the window, owned
//! by the runtime, is checkpointed with it).

pub mod npb;
pub mod pencil;

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use num_complex::Complex64;
use rustfft::{Fft, FftDirection, FftPlanner};
use serde::{Deserialize, Serialize};

use super::{AppParams, Verification, safe_point};
use crate::{Communicator, Ctx, Error, Rank, ReduceOp, Result, Window};
use npb::Class;
use pencil::{Grid, Layout, Transpose};

/// How a transpose moves the blocks (`--transpose`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Exchange {
    /// Puts into the members' window between two fences.
    #[default]
    Put,
    /// Gets from the members' windows between two fences: each rank packs
    /// its chunks into its own window, and each member reads its chunk
    /// (the origin reads; 003 Alg. 1 logs each get at its target).
    Get,
    /// A two-sided all-to-all within the row or column communicator.
    AllToAll,
}

impl Exchange {
    /// Name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Exchange::Put => "put",
            Exchange::Get => "get",
            Exchange::AllToAll => "alltoall",
        }
    }
}

impl fmt::Display for Exchange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Exchange {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        [Exchange::Put, Exchange::Get, Exchange::AllToAll]
            .into_iter()
            .find(|e| e.name() == s)
            .ok_or_else(|| {
                Error::config(
                    "transpose",
                    format!("unknown transpose `{s}` (known: put, get, alltoall)"),
                )
            })
    }
}

/// Parameters of an FT run.
#[derive(Debug, Clone, Copy)]
pub struct Params {
    /// NPB class.
    pub class: Class,
    /// Time steps (NPB's `niter`, or fewer with `--iterations`: the first
    /// steps' checksums are verified).
    pub niter: u64,
    /// How transposes move data.
    pub exchange: Exchange,
}

impl Params {
    /// From the common app parameters (`--class`, default S;
    /// `--iterations` up to the class's steps; `--transpose`).
    pub fn from_app(p: &AppParams) -> Result<Self> {
        let c = p.class.unwrap_or('S');
        let class = npb::class_params(c).ok_or_else(|| {
            Error::config("class", format!("ft has classes S, W, A and B, not `{c}`"))
        })?;
        if p.size.is_some() {
            return Err(Error::config(
                "size",
                "ft runs NPB's fixed grids; choose a class instead",
            ));
        }
        let niter = p.iterations.unwrap_or(class.niter as u64);
        if niter == 0 || niter > class.niter as u64 {
            return Err(Error::config(
                "iterations",
                format!(
                    "ft class {} has {} time steps with published checksums; choose 1..={}",
                    class.class, class.niter, class.niter
                ),
            ));
        }
        Ok(Params {
            class,
            niter,
            exchange: p.transpose.unwrap_or_default(),
        })
    }
}

#[derive(Debug, Serialize, Deserialize)]
struct State {
    /// Time steps done.
    it: u64,
    /// The spectrum after `it` steps, z-pencils, as (re, im) pairs; empty
    /// before the forward transform.
    #[serde(with = "crate::bulk")]
    u0: Vec<f64>,
    /// The checksum of every step done, (re, im) pairs.
    #[serde(with = "crate::bulk")]
    sums: Vec<f64>,
}

/// The 1-D transforms along each axis, both directions.
struct Lines {
    plans: [[Arc<dyn Fft<f64>>; 2]; 3],
    scratch: Vec<Complex64>,
}

impl Lines {
    fn new(n: [usize; 3]) -> Lines {
        let mut planner = FftPlanner::new();
        let plans = n.map(|len| {
            [
                planner.plan_fft(len, FftDirection::Forward),
                planner.plan_fft(len, FftDirection::Inverse),
            ]
        });
        Lines {
            plans,
            scratch: Vec::new(),
        }
    }

    /// Transform every line of `data` along `axis` (0 = x): the lines are
    /// the fast axis of the layout that holds it whole.
    fn run(&mut self, axis: usize, direction: FftDirection, data: &mut [Complex64]) {
        let plan = &self.plans[axis][usize::from(direction == FftDirection::Inverse)];
        let need = plan.get_inplace_scratch_len();
        if self.scratch.len() < need {
            self.scratch.resize(need, Complex64::default());
        }
        if !data.is_empty() {
            plan.process_with_scratch(data, &mut self.scratch[..need]);
        }
    }
}

/// What carries the transposes.
enum Exchanger {
    /// One window on the world, as large as this rank's largest layout.
    Put(Window<f64>),
    /// The same window, read by the members.
    Get(Window<f64>),
    /// The row and column communicators.
    AllToAll {
        row: Communicator,
        column: Communicator,
    },
}

/// Time spent in transposes, for the report (this incarnation's).
#[derive(Debug, Default)]
struct Timing {
    transposes: u64,
    transpose_s: f64,
    fft_s: f64,
}

struct Solver {
    grid: Grid,
    /// `None` on one rank.
    exchanger: Option<Exchanger>,
    lines: Lines,
    send: Vec<Complex64>,
    timing: Timing,
}

impl Solver {
    fn fft(&mut self, ctx: &Ctx, axis: usize, direction: FftDirection, data: &mut [Complex64]) {
        let t0 = ctx.wtime();
        self.lines.run(axis, direction, data);
        self.timing.fft_s += ctx.wtime() - t0;
    }

    /// Move `src` (in `t.from()`) into `dst` (in `t.to()`).
    fn transpose(
        &mut self,
        ctx: &Ctx,
        t: Transpose,
        src: &[Complex64],
        dst: &mut [Complex64],
    ) -> Result<()> {
        let t0 = ctx.wtime();
        let g = self.grid;
        let members = t.members(&g);
        let me = t.me(&g);
        // Every other member's chunk, packed in its storage order, by
        // member; this rank's own straight into place.
        let mut starts = Vec::with_capacity(members + 1);
        let mut at = 0;
        for m in 0..members {
            starts.push(at);
            if m != me {
                at += t.pack(&g, m, src, &mut self.send[at..], t.chunk_line(&g));
            }
        }
        starts.push(at);
        let (own, line) = t.own_place(&g);
        t.pack(&g, me, src, &mut dst[own..], line);
        let chunk = |m: usize| starts[m]..starts[m + 1];
        let received = |m: usize| {
            let [s, mid, _] = g.shape(t.to());
            let off = t.recv_offset(&g, m);
            off..off + s * mid * t.recv_range(&g, m).len()
        };
        if let Some(exchanger) = self.exchanger.as_ref().filter(|_| members > 1) {
            match exchanger {
                Exchanger::Put(window) => {
                    // The members have unpacked what they were sent last.
                    window.fence()?;
                    for m in (0..members).filter(|&m| m != me) {
                        let data: &[f64] = bytemuck::cast_slice(&self.send[chunk(m)]);
                        window.put(t.world_rank(&g, m), 2 * t.target_offset(&g, m), data)?;
                    }
                    // Every rank's puts are complete.
                    window.fence()?;
                    window.with_local(|memory| {
                        let memory: &[Complex64] = bytemuck::cast_slice(memory);
                        for m in (0..members).filter(|&m| m != me) {
                            t.unpack(&g, m, &memory[received(m)], dst);
                        }
                    })?;
                }
                Exchanger::Get(window) => {
                    // The members have read what this rank exposed last.
                    window.fence()?;
                    window.with_local_mut(|memory| {
                        let packed: &[f64] = bytemuck::cast_slice(&self.send[..at]);
                        memory[..packed.len()].copy_from_slice(packed);
                    })?;
                    // Every rank's chunks are exposed.
                    window.fence()?;
                    for m in (0..members).filter(|&m| m != me) {
                        let n = received(m).len();
                        let got =
                            window.get(t.world_rank(&g, m), 2 * t.source_offset(&g, m), 2 * n)?;
                        t.unpack(&g, m, bytemuck::cast_slice(&got), dst);
                    }
                }
                Exchanger::AllToAll { row, column } => {
                    let comm = match t {
                        Transpose::XtoY | Transpose::YtoX => row,
                        Transpose::YtoZ | Transpose::ZtoY => column,
                    };
                    let counts: Vec<usize> = (0..members).map(|m| 2 * chunk(m).len()).collect();
                    let (got, _) = comm.all_to_all_varcount::<f64>(
                        bytemuck::cast_slice(&self.send[..at]),
                        &counts,
                    )?;
                    // Received in member order, without this rank's own.
                    let got: &[Complex64] = bytemuck::cast_slice(&got);
                    let mut from = 0;
                    for m in (0..members).filter(|&m| m != me) {
                        let n = received(m).len();
                        t.unpack(&g, m, &got[from..from + n], dst);
                        from += n;
                    }
                }
            }
        }
        self.timing.transposes += 1;
        self.timing.transpose_s += ctx.wtime() - t0;
        Ok(())
    }

    /// The 3-D transform of `a`: forward from x-pencils into z-pencils
    /// (NPB's order x, y, z), inverse from z-pencils back into x-pencils;
    /// the result is in `a`, `b` holds the y-pencils between.
    fn transform(
        &mut self,
        ctx: &Ctx,
        direction: FftDirection,
        a: &mut [Complex64],
        b: &mut [Complex64],
    ) -> Result<()> {
        let (axes, [first, second]) = match direction {
            FftDirection::Forward => ([0, 1, 2], [Transpose::XtoY, Transpose::YtoZ]),
            FftDirection::Inverse => ([2, 1, 0], [Transpose::ZtoY, Transpose::YtoX]),
        };
        let g = self.grid;
        let from = &mut a[..g.len(first.from())];
        self.fft(ctx, axes[0], direction, from);
        let y = &mut b[..g.len(first.to())];
        self.transpose(ctx, first, from, y)?;
        self.fft(ctx, axes[1], direction, y);
        let to = &mut a[..g.len(second.to())];
        self.transpose(ctx, second, y, to)?;
        self.fft(ctx, axes[2], direction, to);
        Ok(())
    }
}

/// The initial condition in `x` (this rank's x-pencils).
fn initial_condition(class: &Class, g: &Grid, x: &mut [Complex64]) {
    let [zs, ys, _] = g.ranges(Layout::X);
    let rows = zs.flat_map(|k| ys.clone().map(move |j| (j, k)));
    for (line, (j, k)) in x.chunks_exact_mut(class.nx).zip(rows) {
        npb::initial_row(class, j, k, line);
    }
}

/// The evolution factors of this rank's z-pencils.
fn twiddles(class: &Class, g: &Grid) -> Vec<f64> {
    let [ys, xs, zs] = g.ranges(Layout::Z);
    let mut t = Vec::with_capacity(g.len(Layout::Z));
    for j in ys {
        let jj = npb::wave_number_squared(j, class.ny);
        for i in xs.clone() {
            let ij = jj + npb::wave_number_squared(i, class.nx);
            t.extend(
                zs.clone()
                    .map(|k| npb::twiddle(ij + npb::wave_number_squared(k, class.nz))),
            );
        }
    }
    t
}

/// Where NPB's checksum points are: each is taken by the rank that holds
/// it, and a rank's values travel together, in point order.
struct ChecksumPlan {
    /// Per point (NPB's order): its rank, and its place among all ranks'
    /// values (rank by rank, each in point order).
    owner: Vec<Rank>,
    slot: Vec<usize>,
    /// This rank's points: (point, index into its x-pencils).
    mine: Vec<(usize, usize)>,
    /// Where this rank's values start among all.
    start: usize,
    /// Per rank, where its values start among all and how many it has.
    regions: Vec<(usize, usize)>,
}

impl ChecksumPlan {
    fn new(class: &Class, g: &Grid, rank: Rank, ranks: usize) -> Self {
        let [zs, ys, _] = g.ranges(Layout::X);
        let points: Vec<_> = npb::checksum_points(class).collect();
        let owner: Vec<Rank> = points.iter().map(|&(_, r, s)| g.x_owner(r, s)).collect();
        let mut count = vec![0; ranks];
        for &o in &owner {
            count[o] += 1;
        }
        let starts: Vec<usize> = count
            .iter()
            .scan(0, |at, &c| {
                let s = *at;
                *at += c;
                Some(s)
            })
            .collect();
        let mut next = starts.clone();
        let slot = owner
            .iter()
            .map(|&o| {
                next[o] += 1;
                next[o] - 1
            })
            .collect();
        let mine = (points.iter().enumerate())
            .filter(|&(p, _)| owner[p] == rank)
            .map(|(p, &(q, r, s))| {
                (
                    p,
                    ((s - zs.start) * ys.len() + (r - ys.start)) * class.nx + q,
                )
            })
            .collect();
        ChecksumPlan {
            owner,
            slot,
            mine,
            start: starts[rank],
            regions: starts.into_iter().zip(count).collect(),
        }
    }
}

/// NPB's checksum of `x` (x-pencils): each sample point is taken by the
/// rank that holds it and summed in NPB's order on every rank, so the sum
/// does not depend on the grid. Under [`Exchange::Put`] the values travel
/// as puts into every rank's window (`base` on) between two fences, under
/// [`Exchange::Get`] as gets from every rank's window, between fences too,
/// so an iteration synchronises only with GSYNCs and its checkpoint needs
/// no barrier (003 §3.1.2); otherwise by an all-reduce.
fn checksum(
    world: &Communicator,
    exchanger: Option<&Exchanger>,
    base: usize,
    plan: &ChecksumPlan,
    class: &Class,
    x: &[Complex64],
) -> Result<Complex64> {
    let mut all = vec![0.0; 2 * npb::CHECKSUM_POINTS];
    for &(p, i) in &plan.mine {
        all[2 * p] = x[i].re;
        all[2 * p + 1] = x[i].im;
    }
    match exchanger {
        Some(Exchanger::Put(window)) => {
            let values: Vec<f64> = (plan.mine.iter())
                .flat_map(|&(_, i)| [x[i].re, x[i].im])
                .collect();
            // The transposes' last fence opened this epoch; their region of
            // the window is not touched.
            for t in (0..world.size()).filter(|&t| t != world.rank()) {
                window.put(t, base + 2 * plan.start, &values)?;
            }
            window.fence()?;
            window.with_local(|memory| {
                let region = &memory[base..];
                for (p, (&o, &k)) in plan.owner.iter().zip(&plan.slot).enumerate() {
                    if o != world.rank() {
                        all[2 * p..2 * p + 2].copy_from_slice(&region[2 * k..2 * k + 2]);
                    }
                }
            })?;
        }
        Some(Exchanger::Get(window)) => {
            let values: Vec<f64> = (plan.mine.iter())
                .flat_map(|&(_, i)| [x[i].re, x[i].im])
                .collect();
            // Members read only the transposes' region in this epoch.
            window.with_local_mut(|memory| {
                let at = base + 2 * plan.start;
                memory[at..at + values.len()].copy_from_slice(&values);
            })?;
            window.fence()?;
            let mut region = vec![0.0; 2 * npb::CHECKSUM_POINTS];
            for t in (0..world.size()).filter(|&t| t != world.rank()) {
                let (start, count) = plan.regions[t];
                let got = window.get(t, base + 2 * start, 2 * count)?;
                region[2 * start..2 * (start + count)].copy_from_slice(&got);
            }
            // A GSYNC closes the reads, so the safe point after it may
            // checkpoint without a barrier (003 §3.1.2's epoch condition).
            window.fence()?;
            for (p, (&o, &k)) in plan.owner.iter().zip(&plan.slot).enumerate() {
                if o != world.rank() {
                    all[2 * p..2 * p + 2].copy_from_slice(&region[2 * k..2 * k + 2]);
                }
            }
        }
        Some(Exchanger::AllToAll { .. }) => {
            // One rank holds each point: the others add exact zeros.
            let mine = all.clone();
            world.all_reduce_into(&mine, &mut all, ReduceOp::Sum)?;
        }
        None => {}
    }
    let sum = all
        .chunks_exact(2)
        .fold(Complex64::default(), |s, v| s + Complex64::new(v[0], v[1]));
    Ok(sum / class.points() as f64)
}

/// The rank function of FT.
pub fn rank_main(ctx: &mut Ctx, p: &Params) -> Result<Verification> {
    let world = ctx.world();
    let class = p.class;
    let grid = Grid::new(&class, world.size(), world.rank())?;
    let mut st: State = ctx.restore_or_else(|| State {
        it: 0,
        u0: Vec::new(),
        sums: Vec::new(),
    })?;
    // One rank has no one to exchange with (all its transposes are in
    // place): no window, no send buffer.
    let alone = world.size() == 1;
    let exchanger = match p.exchange {
        Exchange::Put if !alone => Some(Exchanger::Put(
            // The checksum's values go after the largest rank's region, at
            // the same place in every rank's window.
            world.allocate_window::<f64>(2 * grid.largest_len() + 2 * npb::CHECKSUM_POINTS)?,
        )),
        Exchange::Get if !alone => Some(Exchanger::Get(
            world.allocate_window::<f64>(2 * grid.largest_len() + 2 * npb::CHECKSUM_POINTS)?,
        )),
        Exchange::AllToAll if !alone => {
            let split = |color: usize, key: usize| -> Result<Communicator> {
                world
                    .split(Some(color as u32), key as i64)?
                    .ok_or_else(|| Error::app("ft: a rank was left out of its row or column"))
            };
            Some(Exchanger::AllToAll {
                row: split(grid.b, grid.a)?,
                column: split(grid.a, grid.b)?,
            })
        }
        _ => None,
    };
    let mut solver = Solver {
        grid,
        exchanger,
        lines: Lines::new(grid.n),
        send: vec![Complex64::default(); grid.max_sent()],
        timing: Timing::default(),
    };
    // Work arrays as (re, im) pairs: the spectrum becomes the state
    // without a copy.
    let mut a = vec![0.0f64; 2 * grid.max_len()];
    let mut b = vec![0.0f64; 2 * grid.max_len()];
    if st.u0.is_empty() {
        let x: &mut [Complex64] = bytemuck::cast_slice_mut(&mut a);
        initial_condition(&class, &grid, &mut x[..grid.len(Layout::X)]);
        solver.transform(
            ctx,
            FftDirection::Forward,
            x,
            bytemuck::cast_slice_mut(&mut b),
        )?;
        a.truncate(2 * grid.len(Layout::Z));
        st.u0 = std::mem::replace(&mut a, vec![0.0f64; 2 * grid.max_len()]);
    }
    if st.u0.len() != 2 * grid.len(Layout::Z) || st.sums.len() as u64 != 2 * st.it {
        return Err(Error::app("restored ft state has the wrong size"));
    }
    let a: &mut [Complex64] = bytemuck::cast_slice_mut(&mut a);
    let b: &mut [Complex64] = bytemuck::cast_slice_mut(&mut b);
    let twiddle = twiddles(&class, &grid);
    let plan = ChecksumPlan::new(&class, &grid, world.rank(), world.size());
    while st.it < p.niter {
        let u0: &mut [Complex64] = bytemuck::cast_slice_mut(&mut st.u0);
        for (u, &t) in u0.iter_mut().zip(&twiddle) {
            *u *= t;
        }
        a[..u0.len()].copy_from_slice(u0);
        solver.transform(ctx, FftDirection::Inverse, a, b)?;
        let sum = checksum(
            &world,
            solver.exchanger.as_ref(),
            2 * grid.largest_len(),
            &plan,
            &class,
            &a[..grid.len(Layout::X)],
        )?;
        st.sums.extend([sum.re, sum.im]);
        st.it += 1;
        safe_point(ctx, &st, st.it, p.niter)?;
    }
    let sums: Vec<Complex64> = bytemuck::cast_slice(&st.sums).to_vec();
    let last = sums.last().copied().unwrap_or_default();
    let verdict = npb::verify(&sums, &class);
    let t = &solver.timing;
    Ok(Verification {
        value: format!("{:e} {:e}", last.re, last.im),
        verified: verdict.is_ok(),
        detail: match verdict {
            Ok(()) => format!(
                "{} steps' checksums within {:e} of NPB's (class {})",
                sums.len(),
                npb::EPSILON,
                class.class
            ),
            Err(why) => why,
        },
        metrics: serde_json::json!({
            "class": class.class.to_string(),
            "grid": [grid.p1, grid.p2],
            "transpose": p.exchange.name(),
            "checksums": sums.iter().map(|s| [s.re, s.im]).collect::<Vec<_>>(),
            "transposes": t.transposes,
            "transpose_s": t.transpose_s,
            "fft_s": t.fft_s,
        }),
    })
}
