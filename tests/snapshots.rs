//! Non-blocking snapshots (`chandy-lamport`, 000): the marker counts of
//! 000 §IV-D, on every backend and at simulated scale.

mod common;

use lazarus::apps::{AppKind, AppParams};
use lazarus::{Backend, ProtocolKind};

/// One flooding wave per generation: every rank sends a marker on each of
/// its n − 1 outgoing channels, n(n − 1) in all (000 §IV-D). Ten
/// iterations with a generation every fifth: two generations, every rank
/// records both.
fn markers_are_n_times_n_minus_one_per_generation(backend: Backend, n: usize) {
    let params = AppParams {
        size: Some(64.max(n + 2)),
        iterations: Some(10),
        ..AppParams::default()
    };
    let cfg = common::config(backend, n)
        .protocol(ProtocolKind::ChandyLamport)
        .checkpoint_every(5);
    let (v, st) = common::run(AppKind::Stencil, &params, &cfg);
    let what = format!("{n} ranks on {backend}");
    assert!(v.verified, "{what}: {}", v.detail);
    let n = n as u64;
    assert_eq!(st.markers, 2 * n * (n - 1), "{what}: markers");
    // A generation commits after its wave, wherever the ranks are then: on
    // a busy machine the job may end first, so only the simulator (whose
    // schedule does not depend on the load) is held to it.
    if backend == Backend::Sim {
        assert!(st.checkpoints >= 1, "{what}: a generation committed");
    }
}

#[test]
fn marker_counts_on_every_backend() {
    for backend in Backend::ALL {
        for n in [4, 8] {
            markers_are_n_times_n_minus_one_per_generation(backend, n);
        }
    }
    markers_are_n_times_n_minus_one_per_generation(Backend::Threads, 16);
}

#[test]
fn marker_counts_at_simulated_scale() {
    for n in [256, 1024] {
        markers_are_n_times_n_minus_one_per_generation(Backend::Sim, n);
    }
}
