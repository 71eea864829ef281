//! The network a simulated job runs on: latencies and bandwidths inside and
//! between failure domains, per-message overhead, jitter, adversarial
//! straggling of one-sided replies, and the failure detector's delay.
//!
//! A shared type at the bottom of the layers: [`crate::config::Config`]
//! holds one for every backend (only the simulator reads it), and the
//! simulator (`driver::sim`) schedules deliveries by it.

use std::time::Duration;

use serde::Serialize;

/// The simulated network and failure detector.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct NetworkModel {
    /// One-way latency between ranks of one failure domain.
    pub latency_intra: Duration,
    /// One-way latency between failure domains.
    pub latency_inter: Duration,
    /// Bandwidth inside a failure domain, bytes per second.
    pub bandwidth_intra: f64,
    /// Bandwidth between failure domains, bytes per second.
    pub bandwidth_inter: f64,
    /// Jitter: up to this fraction of the latency is added, uniformly drawn.
    pub jitter: f64,
    /// Per-message cost at the sender (LogP's gap): a rank's messages leave
    /// one after another, so sending to many ranks takes time.
    pub overhead: Duration,
    /// Adversarial schedules (000 §IV): this fraction of one-sided replies
    /// is held in flight up to [`STRAGGLE_LATENCIES`] latencies longer, so
    /// that markers on other channels pass them (each channel stays FIFO).
    pub straggle: f64,
    /// Time from a death to the survivors' failure notice.
    pub detection: Duration,
    /// A run whose virtual time passes this is declared hung.
    pub time_limit: Duration,
}

impl Default for NetworkModel {
    fn default() -> Self {
        NetworkModel {
            latency_intra: Duration::from_nanos(500),
            latency_inter: Duration::from_micros(2),
            bandwidth_intra: 20e9,
            bandwidth_inter: 10e9,
            jitter: 0.2,
            overhead: Duration::from_nanos(100),
            straggle: 0.0,
            detection: Duration::from_millis(1),
            time_limit: Duration::from_secs(3600),
        }
    }
}

/// How many latencies a straggling one-sided reply may be held longer
/// ([`NetworkModel::straggle`]).
pub const STRAGGLE_LATENCIES: f64 = 50.0;
