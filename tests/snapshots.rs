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
    for backend in Backend::RECOVERING {
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

/// A small DHT: many one-sided operations in flight whenever a wave passes.
fn small_dht() -> AppParams {
    AppParams {
        size: Some(256),
        iterations: Some(4),
        ..AppParams::default()
    }
}

/// 000 Table I on the simulator, whose seeded schedules (with one-sided
/// replies held in flight while markers pass) make every crossing the
/// algorithm allows happen on some seed: vanilla cuts are overlapped and
/// crossed, delay cuts overlapped only, and the cuts of peek-and-get and
/// both double barriers neither. Every run verifies, and the markers follow
/// 000 §IV-D.
#[test]
fn table_one_on_the_simulator() {
    use lazarus::protocol::chandy_lamport::GetFix;
    use lazarus::tools::table_one::table_one;
    let net = lazarus::config::NetworkModel {
        straggle: 0.2,
        ..Default::default()
    };
    let base = common::config(Backend::Sim, 4)
        .network(net)
        .wave_interval(std::time::Duration::from_micros(100));
    let t = table_one(
        AppKind::Dht,
        &small_dht(),
        &base,
        &GetFix::ALL,
        1,
        12,
        |_| {},
    )
    .expect("every run verifies");
    for r in &t.rows {
        assert!(
            r.cuts_checked >= 12 * 10,
            "{}: {} cuts",
            r.fix,
            r.cuts_checked
        );
        assert!(r.agrees, "{}: differs from Table I: {r:?}", r.fix);
        assert!(
            r.first_wave_formula && r.second_wave_formula && r.flush_formula,
            "{}: markers: {r:?}",
            r.fix
        );
    }
    let pdb = &t.rows[4];
    assert!(
        pdb.markers.flush > 0,
        "the partial double barrier flushed nothing"
    );
}

/// What each fix guarantees holds on every backend, whatever the timing: no
/// crossed cut but under vanilla, no overlapped cut under peek-and-get and
/// the double barriers; n(n − 1) first-wave markers per generation, as many
/// second-wave ones under the double barrier, and each flush answered.
#[test]
fn get_fixes_keep_their_guarantees_on_every_backend() {
    use lazarus::protocol::chandy_lamport::GetFix;
    for backend in Backend::RECOVERING {
        for fix in GetFix::ALL {
            // The wave alone (no safe-point snapshots, whose holds can delay
            // a request past its target's wave cut: ARCHITECTURE.md).
            let interval = match backend {
                Backend::Sim => std::time::Duration::from_micros(50),
                _ => std::time::Duration::from_millis(1),
            };
            let cfg = common::config(backend, 4)
                .protocol(ProtocolKind::ChandyLamport)
                .checkpoint_every(0)
                .wave_interval(interval)
                .get_fix(fix)
                .check_cuts(true);
            let (v, st) = common::run(AppKind::Dht, &small_dht(), &cfg);
            let what = format!("{} on {backend}", fix.name());
            assert!(v.verified, "{what}: {}", v.detail);
            let c = st.cuts.unwrap_or_else(|| panic!("{what}: no cut report"));
            let w = st.wave;
            assert!(c.checked >= 1, "{what}: {} cuts checked", c.checked);
            if fix.never_crossed() {
                assert_eq!(c.crossed, 0, "{what}: {:?}", c.findings);
            }
            if fix.never_overlapped() {
                assert_eq!(c.overlapped, 0, "{what}: {:?}", c.findings);
            }
            assert_eq!(w.first, 12 * w.generations, "{what}: {w:?}");
            let second = if fix == GetFix::DoubleBarrier {
                w.first
            } else {
                0
            };
            assert_eq!(w.second, second, "{what}: {w:?}");
            assert_eq!(w.flush, w.flush_answers, "{what}: {w:?}");
        }
    }
}
