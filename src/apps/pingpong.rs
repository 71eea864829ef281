//! Ping-pong latency and bandwidth between ranks 0 and 1, message sizes 1 B
//! to 4 MiB (the NetPIPE measurement of 004 §4.2).
//!
//! Rank 0 sends a shared buffer, rank 1 sends the very buffer it received back
//! (no copy on either side), so the figure measures the runtime's own cost.
//! Each size is one safe point. Other ranks only pass the safe points.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::{AppParams, Verification, safe_point};
use crate::{Ctx, Error, Result};

/// Parameters of a ping-pong run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// Largest message, bytes (sizes are the powers of two up to it).
    pub max_bytes: usize,
    /// Round trips per size (`None`: adapt to the size).
    pub reps: Option<u64>,
}

impl Params {
    /// From the common app parameters (`--size` = largest message, default 4 MiB;
    /// `--iterations` = round trips per size).
    pub fn from_app(p: &AppParams) -> Result<Self> {
        if p.class.is_some() {
            return Err(Error::config(
                "--class",
                "pingpong has no classes; use --size",
            ));
        }
        let max_bytes = p.size.unwrap_or(4 << 20);
        if max_bytes == 0 {
            return Err(Error::config(
                "--size",
                "the largest message must be at least 1 byte",
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
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct State {
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
        return Err(Error::config("--ranks", "pingpong needs at least 2 ranks"));
    }
    let sizes = p.sizes();
    let mut st: State = ctx.restore_or_else(|| State {
        intact: true,
        ..State::default()
    })?;
    while st.next < sizes.len() {
        let size = sizes[st.next];
        let reps = p.reps_for(size);
        let warm_up = p.warm_up_for(size);
        match world.rank() {
            0 => {
                let buf = pattern(size, st.next);
                let crc = crc32c::crc32c(&buf);
                for _ in 0..warm_up {
                    world.send_bytes(1, TAG, buf.clone())?;
                    world.receive_bytes(1, TAG)?;
                }
                let t0 = ctx.wtime();
                let mut last = Bytes::new();
                for _ in 0..reps {
                    world.send_bytes(1, TAG, buf.clone())?;
                    last = world.receive_bytes(1, TAG)?.payload;
                }
                let dt = ctx.wtime() - t0;
                st.intact &= crc32c::crc32c(&last) == crc && last.len() == size;
                let latency = dt / (2.0 * reps as f64);
                st.points.push(Point {
                    bytes: size,
                    latency_us: latency * 1e6,
                    bandwidth_mb_s: size as f64 / latency / 1e6,
                });
            }
            1 => {
                for _ in 0..warm_up + reps {
                    let m = world.receive_bytes(0, TAG)?;
                    world.send_bytes(0, TAG, m.payload)?;
                }
            }
            _ => {}
        }
        st.next += 1;
        safe_point(ctx, &st, st.next as u64, sizes.len() as u64)?;
    }
    let mine = (st.intact, st.points);
    let (intact, points): (bool, Vec<Point>) = world.broadcast_value(0, Some(&mine))?;
    let at = |b: usize| points.iter().find(|p| p.bytes == b).copied();
    Ok(Verification {
        value: format!(
            "{} sizes echoed {}",
            points.len(),
            if intact { "intact" } else { "CORRUPTED" }
        ),
        verified: intact && points.len() == sizes.len(),
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
