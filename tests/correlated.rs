//! Protocol `correlated` (004 §3) on every backend: CG (S and W), the
//! stencil and the DHT (one-sided RMA) on 8 ranks over 4 nodes (correlated sets of two) print their
//! failure-free value through a rank kill, a node kill, two node kills at
//! once and kills during a recovery; exactly the affected sets roll back;
//! messages inside a set are never copied into a log, messages between sets
//! are; `--sets N` regroups the ranks.

mod common;

use lazarus::apps::{AppKind, AppParams};
use lazarus::protocol::correlated::SetRule;
use lazarus::{Backend, Config, JobStats, ProtocolKind};

const RANKS: usize = 8;
const NODES: usize = 4;

struct Scenario {
    name: &'static str,
    kills: &'static [&'static str],
    /// Ranks that roll back: the sizes of the sets hit, over every
    /// rollback (a kill inside a set that is recovering rolls it back once
    /// more, possibly after some of it resumed).
    rolled_back: std::ops::RangeInclusive<u64>,
}

const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "rank kill",
        kills: &["3@50%"],
        rolled_back: 2..=2,
    },
    Scenario {
        name: "node kill",
        kills: &["node:1@30%"],
        rolled_back: 2..=2,
    },
    Scenario {
        name: "two node kills at once",
        kills: &["node:1@40%", "node:2@40%"],
        rolled_back: 4..=4,
    },
    Scenario {
        name: "kill in another set during recovery",
        kills: &["1@40%", "5@recovery"],
        rolled_back: 4..=4,
    },
    Scenario {
        name: "kill in the recovering set during its recovery",
        kills: &["2@40%", "3@recovery"],
        rolled_back: 2..=4,
    },
];

fn check_app(app: AppKind, params: AppParams, seeds: u64) {
    for backend in Backend::RECOVERING {
        let base = common::config(backend, RANKS).nodes(NODES);
        let (reference, _) = common::run(app, &params, &base);
        assert!(reference.verified, "{app}: {}", reference.detail);
        for sc in SCENARIOS {
            for seed in 1..=seeds {
                let cfg = sc.kills.iter().fold(
                    base.clone()
                        .protocol(ProtocolKind::Correlated)
                        .checkpoint_every(2)
                        .seed(seed),
                    |c, k| c.kill(k.parse().expect("valid kill")),
                );
                let what = format!("{app} on {backend}, {} (seed {seed})", sc.name);
                let (v, st) = common::run(app, &params, &cfg);
                assert!(v.verified, "{what}: {}", v.detail);
                assert_eq!(v.value, reference.value, "{what}: value differs");
                assert!(
                    st.unfired_kills.is_empty(),
                    "{what}: {:?}",
                    st.unfired_kills
                );
                assert!(
                    sc.rolled_back.contains(&st.ranks_rolled_back),
                    "{what}: {} ranks rolled back, expected {:?} (the sets hit)",
                    st.ranks_rolled_back,
                    sc.rolled_back
                );
                assert!(st.checkpoints > 0, "{what}: no set checkpoint");
                assert_eq!(st.set_size, 2, "{what}: set size");
                assert!(st.set_syncs > 0, "{what}: no set synchronisation counted");
            }
        }
    }
}

#[test]
fn cg_class_s_survives_every_scenario() {
    let params = common::class('S');
    check_app(AppKind::Cg, params, 2);
}

#[test]
fn cg_class_w_survives_every_scenario() {
    let params = common::class('W');
    check_app(AppKind::Cg, params, 1);
}

#[test]
fn stencil_survives_every_scenario() {
    check_app(AppKind::Stencil, AppParams::default(), 2);
}

/// One-sided accesses inside a set are replayed by the set's re-execution;
/// accesses from other sets are logged requests resent to it.
#[test]
fn dht_survives_every_scenario() {
    // (An eighth of class S: every access is a message round trip here.)
    let params = AppParams {
        size: Some(512),
        ..AppParams::default()
    };
    check_app(AppKind::Dht, params, 1);
}

/// Rank 0 sends `rounds` messages of `bytes` to `dest` and gets an answer
/// to each; returns the job's statistics.
fn exchange(backend: Backend, cfg: Config, dest: usize, rounds: usize, bytes: usize) -> JobStats {
    let cfg = common::for_this_test(cfg.backend(backend));
    let r = lazarus::run(&cfg, move |ctx| {
        let world = ctx.world();
        let me = world.rank();
        let payload = vec![7u8; bytes];
        for _ in 0..rounds {
            if me == 0 {
                world.send(dest, 1, &payload)?;
                world.receive::<u8>(dest, 2)?;
            } else if me == dest {
                let (m, _) = world.receive::<u8>(0, 1)?;
                world.send(0, 2, &m)?;
            }
        }
        Ok(())
    });
    r.outcome.expect("exchange");
    r.stats
}

/// 004 §3.2: no payload copy for a message inside a correlated set; the
/// full sender-based log for a message between sets.
#[test]
fn messages_inside_a_set_are_not_logged_and_between_sets_are() {
    const ROUNDS: usize = 20;
    const BYTES: usize = 4096;
    for backend in Backend::RECOVERING {
        let cfg = Config::new(4)
            .nodes(2)
            .protocol(ProtocolKind::Correlated)
            .checkpoint_every(0);
        // Ranks 0 and 1 share a node: internal.
        let st = exchange(backend, cfg.clone(), 1, ROUNDS, BYTES);
        assert_eq!(st.log_records, 0, "{backend}: internal messages logged");
        assert_eq!(st.peak_log_bytes, 0, "{backend}: internal payload in a log");
        assert_eq!(
            st.spared_log_bytes,
            2 * (ROUNDS * BYTES) as u64,
            "{backend}: spared bytes"
        );
        // Ranks 0 and 2 do not: every message is logged by its sender.
        let st = exchange(backend, cfg.clone(), 2, ROUNDS, BYTES);
        assert_eq!(
            st.log_records,
            2 * ROUNDS as u64,
            "{backend}: inter-set records"
        );
        assert_eq!(
            st.log_bytes,
            2 * (ROUNDS * BYTES) as u64,
            "{backend}: inter-set bytes"
        );
        assert_eq!(st.spared_log_bytes, 0, "{backend}");
        // `--sets 4`: one set of all four ranks, nothing is logged.
        let all = cfg.sets(SetRule::Consecutive(4));
        let st = exchange(backend, all, 2, ROUNDS, BYTES);
        assert_eq!(st.log_records, 0, "{backend}: --sets 4");
    }
}

/// `--sets N` forms sets of N consecutive ranks; a kill rolls back exactly
/// the victim's set, whatever the nodes.
#[test]
fn sets_of_n_consecutive_ranks_roll_back_together() {
    let params = common::class('S');
    for backend in Backend::RECOVERING {
        let base = common::config(backend, RANKS).nodes(2);
        let (reference, _) = common::run(AppKind::Cg, &params, &base);
        for n in [1usize, 4, 8] {
            let cfg = base
                .clone()
                .protocol(ProtocolKind::Correlated)
                .checkpoint_every(2)
                .kill("5@50%".parse().expect("kill"))
                .sets(SetRule::Consecutive(n));
            let (v, st) = common::run(AppKind::Cg, &params, &cfg);
            let what = format!("{backend}, --sets {n}");
            assert_eq!(v.value, reference.value, "{what}");
            assert_eq!(st.ranks_rolled_back, n as u64, "{what}");
            assert_eq!(st.set_size, n as u64, "{what}");
        }
    }
}

/// Found by `lazarus chaos` (seed 57): node 1 dies inside the first set
/// checkpoint, so no generation is committed yet; rank 7 dies inside the
/// second and rank 1 during its recovery. Set {0, 1} restarts from the
/// beginning with a survivor that had captured a generation and a fresh
/// replacement: both must number their next checkpoint alike and restart
/// the schedule, or their tokens never meet.
#[test]
fn a_set_restarting_from_the_beginning_agrees_on_its_checkpoints() {
    let params = common::class('S');
    for backend in Backend::RECOVERING {
        let base = common::config(backend, RANKS).nodes(NODES);
        let (reference, _) = common::run(AppKind::Cg, &params, &base);
        let cfg = ["7@checkpoint:2", "node:1@checkpoint:1", "1@recovery:1"]
            .iter()
            .fold(
                base.protocol(ProtocolKind::Correlated)
                    .checkpoint_every(2)
                    .seed(57),
                |c, k| c.kill(k.parse().expect("valid kill")),
            );
        let (v, st) = common::run(AppKind::Cg, &params, &cfg);
        assert_eq!(v.value, reference.value, "{backend}");
        assert_eq!(st.failures, 3, "{backend}");
    }
}

/// With two sets, each set's checkpoints and determinants are held by the
/// other. A kill in each rolls both back; the members that only rolled
/// back keep what they hold for the other set, so both restore their own
/// checkpoints instead of restarting the job (which they did while a
/// rolled-back holder counted as lost). In the second case a holder of the
/// dead rank dies during the recovery (found by `lazarus chaos`, seed 4):
/// the other holder must have every determinant the dead rank's sends
/// depended on, so sends wait for every live holder's acknowledgement.
#[test]
fn two_sets_holding_each_others_checkpoints_both_recover() {
    let apps = [
        (AppKind::Cg, common::class('S')),
        (
            AppKind::Dht,
            AppParams {
                size: Some(512),
                ..AppParams::default()
            },
        ),
    ];
    for backend in Backend::RECOVERING {
        let base = common::config(backend, 4).nodes(2);
        for (app, params) in &apps {
            let (reference, _) = common::run(*app, params, &base);
            for (kills, seed) in [(["1@50%", "2@50%"], 1), (["0@6%", "3@recovery:1"], 4)] {
                let cfg = kills.iter().fold(
                    base.clone()
                        .protocol(ProtocolKind::Correlated)
                        .checkpoint_every(2)
                        .seed(seed),
                    |c, k| c.kill(k.parse().expect("valid kill")),
                );
                let what = format!("{app} on {backend}, kills {kills:?}");
                let (v, st) = common::run(*app, params, &cfg);
                assert_eq!(v.value, reference.value, "{what}");
                assert_eq!(st.failures, 2, "{what}");
                assert_eq!(st.job_restarts, 0, "{what}: the job restarted");
                assert_eq!(st.ranks_rolled_back, 4, "{what}: both sets roll back");
            }
        }
    }
}

#[test]
fn a_set_size_out_of_range_or_for_another_protocol_is_refused() {
    for n in [0, 9] {
        let cfg = Config::new(RANKS)
            .protocol(ProtocolKind::Correlated)
            .sets(SetRule::Consecutive(n));
        let e = cfg.validate().expect_err("bad --sets");
        assert!(e.to_string().contains("`sets`"), "{e}");
    }
    // Only `correlated` forms sets: elsewhere `--sets` would be ignored.
    let cfg = Config::new(RANKS)
        .protocol(ProtocolKind::Pessimistic)
        .sets(SetRule::Consecutive(2));
    let e = cfg.validate().expect_err("--sets under pessimistic");
    assert!(e.to_string().contains("`correlated` only"), "{e}");
}
