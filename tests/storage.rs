//! The `xor` and `rs:M` storage levels and multi-level schedules, on every
//! backend (`Backend::RECOVERING`).
//!
//! The oracle is the one of `tests/recovery.rs`: the failure-free run's
//! verification value, which every recovered run must print bit-identically.
//! The statistics tell which way recovery went: with the parity levels alone
//! (no partner copy) a lost piece can only come back by rebuilding it from its
//! group, so a recovery that restarts no rank from scratch used the parity.

mod common;

use std::path::PathBuf;
use std::process::Command;

use lazarus::apps::{AppKind, AppParams, Verification, run_app};
use lazarus::store::levels::LevelSpec;
use lazarus::{Backend, Config, JobStats, ProtocolKind};

fn cg_s() -> AppParams {
    AppParams {
        class: Some('S'),
        ..AppParams::default()
    }
}

fn run(cfg: &Config) -> (Verification, JobStats) {
    let r = run_app(AppKind::Cg, &cg_s(), &common::for_this_test(cfg.clone()));
    match r.outcome {
        Ok(v) => (v, r.stats),
        Err(e) => panic!(
            "cg on {} with {:?} failed: {e}",
            cfg.get_backend(),
            cfg.get_storage()
        ),
    }
}

fn reference(backend: Backend, ranks: usize) -> Verification {
    let (v, _) = run(&Config::new(ranks).backend(backend));
    assert!(v.verified, "failure-free run not verified: {}", v.detail);
    v
}

fn config(
    backend: Backend,
    ranks: usize,
    nodes: usize,
    storage: Vec<LevelSpec>,
    kills: &[&str],
) -> Config {
    let mut cfg = Config::new(ranks)
        .backend(backend)
        .protocol(ProtocolKind::Coordinated)
        .nodes(nodes)
        .checkpoint_every(2)
        .storage(storage);
    for k in kills {
        cfg = cfg.kill(k.parse().expect("valid kill spec"));
    }
    cfg
}

/// Run, and check the value, that every kill fired and how many ranks
/// restarted from scratch.
fn check(what: &str, cfg: &Config, reference: &Verification, from_scratch: u64) -> JobStats {
    let (v, st) = run(cfg);
    let what = format!("{what} on {}", cfg.get_backend());
    assert!(v.verified, "{what}: not verified: {}", v.detail);
    assert_eq!(v.value, reference.value, "{what}: value differs");
    assert!(
        st.unfired_kills.is_empty(),
        "{what}: kills never fired: {:?}",
        st.unfired_kills
    );
    assert!(st.failures > 0 && st.checkpoints > 0, "{what}: {st:?}");
    assert_eq!(
        st.ranks_restarted_from_scratch, from_scratch,
        "{what}: ranks restarted from scratch"
    );
    st
}

#[test]
fn rs2_recovers_two_simultaneous_failures_in_one_group() {
    let rs2 = LevelSpec::Rs {
        parity: 2,
        every: 1,
    };
    for backend in Backend::RECOVERING {
        let reference = reference(backend, 6);
        // 6 ranks on 3 nodes form one group of 6 (two members per node, the
        // most 003 §5.1 allows for m = 2); killing node 1 loses ranks 2 and
        // 3 at once. In the second schedule a node dies after rank 2 was
        // replaced: that needs the parity re-encoded at the first recovery.
        for kills in [&["node:1@50%"][..], &["2@30%", "node:2@70%"]] {
            let cfg = config(backend, 6, 3, vec![rs2.clone()], kills);
            check(&format!("rs:2, kills {kills:?}"), &cfg, &reference, 0);
        }
    }
}

#[test]
fn xor_recovers_a_rank_kill_and_a_node_kill() {
    for backend in Backend::RECOVERING {
        let reference = reference(backend, 6);
        for (nodes, kills) in [(3, &["4@50%"][..]), (3, &["node:0@40%"]), (1, &["1@60%"])] {
            let cfg = config(backend, 6, nodes, vec![LevelSpec::Xor { every: 1 }], kills);
            check(
                &format!("xor, {nodes} node(s), kills {kills:?}"),
                &cfg,
                &reference,
                0,
            );
        }
    }
}

#[test]
fn corrupt_parity_is_detected_and_recovery_falls_back() {
    let damaged = |storage: &mut Vec<LevelSpec>| {
        // 4 ranks on 4 nodes: one XOR group of 4. Rank 2's parity protects
        // ranks 3, 0 and 1, so losing rank 0 needs it.
        storage.push(LevelSpec::CorruptParityAt { rank: 2 });
    };
    for backend in Backend::RECOVERING {
        let reference = reference(backend, 4);
        // Parity only: the damaged shard is dropped, rank 0's piece cannot
        // be rebuilt, and no committed generation is whole: every rank
        // restarts from the beginning, and still verifies.
        let mut storage = vec![LevelSpec::Xor { every: 1 }];
        damaged(&mut storage);
        let cfg = config(backend, 4, 4, storage, &["0@50%"]);
        check("damaged xor parity alone", &cfg, &reference, 4);

        // With a disk level as well, recovery uses the disk piece instead.
        let dir = temp_dir(&format!("corrupt-{backend}"));
        let mut storage = vec![
            LevelSpec::Xor { every: 1 },
            LevelSpec::Disk {
                dir: dir.clone(),
                every: 1,
            },
        ];
        damaged(&mut storage);
        let cfg = config(backend, 4, 4, storage, &["0@50%"]);
        check("damaged xor parity + disk", &cfg, &reference, 0);
        let _ = std::fs::remove_dir_all(&dir);

        // The same damage where the parity is not needed (rank 2 itself
        // dies) does not matter.
        let mut storage = vec![LevelSpec::Xor { every: 1 }];
        damaged(&mut storage);
        let cfg = config(backend, 4, 4, storage, &["2@50%"]);
        check("damaged parity of the dead rank", &cfg, &reference, 0);
    }
}

fn temp_dir(name: &str) -> PathBuf {
    common::temp_dir(&format!("storage-{name}"))
}

#[test]
fn xor_plus_disk_schedule_from_the_command_line() {
    let lazarus = || Command::new(env!("CARGO_BIN_EXE_lazarus"));
    for backend in Backend::RECOVERING {
        let job = |extra: &[&str]| {
            let out = lazarus()
                .args(["run", "cg", "--class", "S", "--ranks", "4", "--nodes", "2"])
                .args(["--backend", &backend.to_string()])
                .args(extra)
                .output()
                .expect("runs");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{backend} {extra:?}: {err}");
            assert!(!err.contains("never fired"), "{backend} {extra:?}: {err}");
            (
                common::last_line(&out.stdout),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        let (expected, _) = job(&[]);
        assert!(expected.starts_with("VERIFIED "), "{expected}");
        let dir = temp_dir(&format!("schedule-{backend}"));
        let disk = format!("disk:{}@2", dir.display());
        let (got, out) = job(&[
            "--protocol",
            "coordinated",
            "--checkpoint-every",
            "2",
            "--storage",
            "xor",
            "--storage",
            &disk,
            "--kill",
            "node:1@60%",
        ]);
        assert_eq!(got, expected, "{backend}: xor + disk@2 with a node kill");
        assert!(
            out.contains("; failures 1 (2 ranks killed)"),
            "{backend}: the node kill did not happen\n{out}"
        );
        // Only even generations reach the disk, and inspect reads them.
        let gens = lazarus::store::disk::committed_generations(&dir).expect("readable");
        assert!(!gens.is_empty(), "{backend}: nothing committed on disk");
        assert!(gens.iter().all(|g| g % 2 == 0), "{gens:?}");
        let inspect = lazarus()
            .args(["inspect", dir.to_str().expect("utf-8")])
            .output()
            .expect("runs");
        assert!(inspect.status.success(), "{backend}: inspect failed");
        assert!(
            String::from_utf8_lossy(&inspect.stdout).contains("A restart would use generation"),
            "{}",
            String::from_utf8_lossy(&inspect.stdout)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

#[test]
fn bad_storage_schedules_are_config_errors() {
    let lazarus = || Command::new(env!("CARGO_BIN_EXE_lazarus"));
    for (args, needle) in [
        (
            &["--storage", "xor", "--storage", "rs:2"][..],
            "at most one",
        ),
        (&["--storage", "rs:4"], "at least 5 ranks"),
        (&["--storage", "rs:0"], "positive number"),
    ] {
        let out = lazarus()
            .args(["run", "cg", "--class", "S", "--ranks", "4"])
            .args(["--protocol", "coordinated"])
            .args(args)
            .output()
            .expect("runs");
        assert!(!out.status.success(), "{args:?} accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// A partner's in-memory copy damaged as silent memory corruption would (one
/// byte flipped after its CRC32C was taken, at the rank holding rank 0's
/// copy): the checksum refuses it, and recovery uses another level, or
/// another holder, or restarts from the beginning, but never the damaged
/// bytes.
#[test]
fn a_damaged_partner_copy_is_refused_and_recovery_goes_elsewhere() {
    use lazarus::topology::Placement;
    let pl = Placement::block(4, 2).expect("placement");
    let holder = pl.partner(0).expect("rank 0 has a partner");
    let damaged = LevelSpec::CorruptPartnerCopiesAt { rank: holder };
    for backend in Backend::RECOVERING {
        let reference = reference(backend, 4);
        // Partner copies alone: rank 0's piece is nowhere sound, so no
        // committed generation is whole and every rank restarts from the
        // beginning.
        let storage = vec![LevelSpec::Partner, damaged.clone()];
        let cfg = config(backend, 4, 2, storage, &["0@50%"]);
        check("damaged partner copy alone", &cfg, &reference, 4);

        // With a disk level as well, rank 0's piece comes from the disk.
        let dir = temp_dir(&format!("partner-{backend}"));
        let disk = LevelSpec::Disk {
            dir: dir.clone(),
            every: 1,
        };
        let storage = vec![LevelSpec::Partner, disk, damaged.clone()];
        let cfg = config(backend, 4, 2, storage, &["0@50%"]);
        check("damaged partner copy + disk", &cfg, &reference, 0);
        let _ = std::fs::remove_dir_all(&dir);

        // Under message logging a piece has a second holder: rank 0 alone
        // rolls back, from the sound copy.
        let storage = vec![LevelSpec::Partner, damaged.clone()];
        let cfg = config(backend, 4, 2, storage, &["0@50%"]).protocol(ProtocolKind::Pessimistic);
        let st = check("damaged first copy, pessimistic", &cfg, &reference, 0);
        assert_eq!(st.ranks_rolled_back, 1, "pessimistic on {backend}: {st:?}");

        // The holder's damage does not matter when the holder itself dies.
        let storage = vec![LevelSpec::Partner, damaged.clone()];
        let kill = format!("{holder}@50%");
        let cfg = config(backend, 4, 2, storage, &[&kill]);
        check("damaged copies at the dead holder", &cfg, &reference, 0);
    }
}
