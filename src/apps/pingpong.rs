//! Ping-pong latency and bandwidth between ranks 0 and 1, message sizes 1 B
//! to 4 MiB (the NetPIPE measurement of 004 §4.2).
//!
//! Two sweeps over the sizes, one after the other:
//! - **NetPIPE**: each of ranks 0 and 1 sends its own buffer, the same one
//!   every round trip, as NetPIPE does (and `bench/mpi_pingpong.c`). This is
//!   the measurement of 004 Fig. 4: a sender-based log that copies payloads
//!   pays a copy per message here, one that keeps them by reference does not.
//! - **forwarded**: rank 1 sends back the very buffer it received, a new one
//!   every round trip. Under message logging each of them stays in rank 1's
//!   log until rank 0 checkpoints, so this measures what keeping forwarded
//!   data costs: new memory for every message, and freeing it at a trim.
//!   It comes second so that those costs stay out of the NetPIPE figures.
//!
//! Neither side copies a payload. Each size of each sweep is one safe point.
//! Other ranks only pass the safe points.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{AppParams, Verification, safe_point};
use crate::{Ctx, Error, ReduceOp, Result};

/// Parameters of a ping-pong run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Largest message, bytes (sizes are the powers of two up to it).
    pub max_bytes: usize,
    /// Round trips per size (`None`: adapt to the size).
    pub reps: Option<u64>,
}

/// Largest message measured (`--size`, 1 GiB): far past where bandwidth
/// stops changing, and a size that the sender, the receiver and a logging
/// protocol's copy can all hold.
pub const MAX_MESSAGE: usize = 1 << 30;

impl Params {
    /// From the common app parameters (`--size` = largest message, default 4 MiB;
    /// `--iterations` = round trips per size).
    pub fn from_app(p: &AppParams) -> Result<Self> {
        if p.class.is_some() {
            return Err(Error::config(
                "class",
                "pingpong has no classes; give a size",
            ));
        }
        let max_bytes = p.size.unwrap_or(4 << 20);
        if !(1..=MAX_MESSAGE).contains(&max_bytes) {
            return Err(Error::config(
                "size",
                format!("the largest message must be 1 to {MAX_MESSAGE} bytes, not {max_bytes}"),
            ));
        }
        Ok(Params {
            max_bytes,
            reps: p.iterations,
        })
    }

    /// The message sizes measured.
    pub fn sizes(&self) -> Vec<usize> {
        std::iter::successors(Some(1usize), |&s| (s < self.max_bytes).then_some(s * 2))
            .map(|s| s.min(self.max_bytes))
            .collect()
    }

    /// Timed round trips for `size`: 64 MiB each way, between 50 and
    /// 10000, the schedule of `bench/mpi_pingpong.c` (`round_trips`), so
    /// that `bench/vs-mpi.sh` compares the same measurement.
    fn reps_for(&self, size: usize) -> u64 {
        self.reps
            .unwrap_or_else(|| ((64usize << 20) / size).clamp(50, 10_000) as u64)
    }

    /// Untimed round trips before the timed ones: a tenth, at least 2 (as
    /// `bench/mpi_pingpong.c`).
    fn warm_up_for(&self, size: usize) -> u64 {
        (self.reps_for(size) / 10).max(2)
    }
}

/// One measured size.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct Point {
    /// Message size, bytes.
    pub bytes: usize,
    /// One-way latency, microseconds (half the round trip).
    pub latency_us: f64,
    /// Bandwidth, MB/s (10^6 bytes per second).
    pub bandwidth_mb_s: f64,
    /// Bandwidth of the forwarded loop (rank 1 sends back what it received),
    /// MB/s.
    pub forwarded_bandwidth_mb_s: f64,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
    /// Next step: size `next` of the NetPIPE sweep, then size `next - n` of
    /// the forwarded one.
    next: usize,
    points: Vec<Point>,
    intact: bool,
}

fn pattern(size: usize, seed: usize) -> Bytes {
    Bytes::from(
        (0..size)
            .map(|i| (i.wrapping_mul(131) ^ seed) as u8)
            .collect::<Vec<u8>>(),
    )
}

const TAG: i32 = 7;

/// The rank function of ping-pong.
pub fn rank_main(ctx: &mut Ctx, p: &Params) -> Result<Verification> {
    let world = ctx.world();
    if world.size() < 2 {
        return Err(Error::config("ranks", "pingpong needs at least 2 ranks"));
    }
    let sizes = p.sizes();
    let mut st: State = ctx.restore_or_else(|| State {
        intact: true,
        ..State::default()
    })?;
    let n = sizes.len();
    while st.next < 2 * n {
        let (forwarding, i) = (st.next >= n, st.next % n);
        let size = sizes[i];
        let reps = p.reps_for(size);
        let warm_up = p.warm_up_for(size);
        // Rank r sends pattern `seed(r)`; each checks the last buffer it got.
        let base = 2 * st.next;
        let seed = |r: usize| base + r;
        match world.rank() {
            0 => {
                let buf = pattern(size, seed(0));
                let round_trips = |n: u64| -> Result<(f64, Bytes)> {
                    let t0 = ctx.wtime();
                    let mut last = Bytes::new();
                    for _ in 0..n {
                        world.send_bytes(1, TAG, buf.clone())?;
                        last = world.receive_bytes(1, TAG)?.payload;
                    }
                    // One-way time.
                    Ok(((ctx.wtime() - t0) / (2.0 * n as f64), last))
                };
                round_trips(warm_up)?;
                let (one_way, last) = round_trips(reps)?;
                let bandwidth_mb_s = size as f64 / one_way / 1e6;
                if forwarding {
                    st.intact &= last == buf;
                    let point = st.points.get_mut(i).ok_or_else(|| {
                        Error::app(format!("pingpong: no NetPIPE figure for {size} B"))
                    })?;
                    point.forwarded_bandwidth_mb_s = bandwidth_mb_s;
                } else {
                    st.intact &= last == pattern(size, seed(1));
                    st.points.push(Point {
                        bytes: size,
                        latency_us: one_way * 1e6,
                        bandwidth_mb_s,
                        forwarded_bandwidth_mb_s: f64::NAN,
                    });
                }
            }
            1 if forwarding => {
                for _ in 0..warm_up + reps {
                    let m = world.receive_bytes(0, TAG)?;
                    world.send_bytes(0, TAG, m.payload)?;
                }
            }
            1 => {
                let buf = pattern(size, seed(1));
                let mut last = Bytes::new();
                for _ in 0..warm_up + reps {
                    last = world.receive_bytes(0, TAG)?.payload;
                    world.send_bytes(0, TAG, buf.clone())?;
                }
                st.intact &= last == pattern(size, seed(0));
            }
            _ => {}
        }
        st.next += 1;
        safe_point(ctx, &st, st.next as u64, 2 * n as u64)?;
    }
    // Intact only if both sides got what the other sent, in both sweeps.
    let intact = world.all_reduce(u32::from(st.intact), ReduceOp::Min)? == 1;
    let points: Vec<Point> = world.broadcast_value(0, Some(&st.points))?;
    let at = |b: usize| points.iter().find(|p| p.bytes == b).copied();
    Ok(Verification {
        value: format!(
            "{} sizes sent and forwarded {}",
            points.len(),
            if intact { "intact" } else { "CORRUPTED" }
        ),
        verified: intact
            && points.len() == sizes.len()
            && points.iter().all(|p| p.forwarded_bandwidth_mb_s > 0.0),
        detail: match (at(8), at(1 << 20)) {
            (Some(l), Some(b)) => format!(
                "latency(8 B) {:.2} us, bandwidth(1 MiB) {:.0} MB/s",
                l.latency_us, b.bandwidth_mb_s
            ),
            _ => String::new(),
        },
        metrics: serde_json::to_value(&points).unwrap_or_default(),
    })
}
