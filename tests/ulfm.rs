//! ULFM-style failure handling (002 §3.2) under protocol `none`, on every
//! backend: failures reported to the program, acknowledgement, revoke,
//! agreement, shrink and respawn; and the two example programs
//! (`ulfm_shrink`, `ulfm_respawn`) through rank, node and repeated kills.

mod common;

use std::path::PathBuf;
use std::process::Command;

use lazarus::{Backend, Error, FailureHandling, ProtocolKind, Source};

fn example(name: &str) -> PathBuf {
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_lazarus"));
    let p = bin
        .parent()
        .map(|d| d.join("examples").join(name))
        .expect("target directory");
    assert!(p.exists(), "{} not built", p.display());
    p
}

/// Run an example with `args`; returns its last line (it must succeed).
/// Run an example program to its end, or fail the test (the program
/// killed) if it has not ended in 600 s: under load the respawn example
/// once hung with every rank blocked in a barrier, and the test waited for
/// ever.
fn run_example(name: &str, args: &[&str]) -> String {
    use std::io::Read;
    let mut child = Command::new(example(name))
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run the example");
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(600);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for the example") {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        // A watchdog's poll, not a synchronisation: the result is the
        // exit status either way.
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    let stdout_bytes = out.join().unwrap_or_default();
    let stdout = String::from_utf8_lossy(&stdout_bytes).to_string();
    let stderr = String::from_utf8_lossy(&err.join().unwrap_or_default()).to_string();
    let Some(status) = status else {
        panic!("{name} {args:?} hung: no end in 600 s (killed)\n{stdout}\n{stderr}");
    };
    assert!(
        status.success(),
        "{name} {args:?} failed\n{stdout}\n{stderr}"
    );
    common::last_line(&stdout_bytes)
}

fn backends() -> Vec<Backend> {
    match std::env::var("ULFM_BACKEND") {
        Ok(b) => vec![b.parse().expect("backend")],
        Err(_) => Backend::RECOVERING.to_vec(),
    }
}

fn ulfm(backend: Backend, ranks: usize) -> lazarus::Config {
    common::config(backend, ranks).failure_handling(FailureHandling::Return)
}

#[test]
fn the_shrink_example_carries_on_with_the_survivors() {
    for backend in backends() {
        let b = backend.name();
        for (args, left) in [
            (vec!["--kill", "2@50%"], 3),
            (vec!["--kill", "0@30%"], 3),
            (vec!["--nodes", "2", "--kill", "node:1@60%"], 2),
        ] {
            let mut a = vec!["--backend", b];
            a.extend(&args);
            let last = run_example("ulfm_shrink", &a);
            assert_eq!(last, format!("VERIFIED {left}"), "{backend} {args:?}");
        }
    }
}

#[test]
fn the_respawn_example_ends_bit_identical_to_a_failure_free_run() {
    for backend in backends() {
        let b = backend.name();
        for args in [
            vec!["--kill", "3@40%"],
            vec!["--kill", "0@30%"],
            vec!["--kill", "node:1@50%"],
            vec!["--kill", "1@30%", "--kill", "2@70%"],
            // The respawned incarnation dies too.
            vec!["--kill", "3@40%", "--kill", "3@80%"],
        ] {
            let mut a = vec!["--backend", b];
            a.extend(&args);
            let last = run_example("ulfm_respawn", &a);
            assert!(last.starts_with("VERIFIED "), "{backend} {args:?}: {last}");
        }
    }
}

/// A receive from a dead rank fails; a wildcard receive with nothing to
/// match fails until the failure is acknowledged, then works; a send to the dead rank fails; the
/// job ends with the survivors' values.
#[test]
fn failures_are_reported_and_wildcards_wait_for_acknowledgement() {
    for backend in backends() {
        let cfg = ulfm(backend, 3).kill("2@i1".parse().expect("kill"));
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let me = world.rank();
            ctx.checkpoint(&())?;
            if me == 2 {
                // Killed within a few calls.
                loop {
                    ctx.compute(1e-4)?;
                }
            }
            let mut seen = Vec::new();
            if me == 0 {
                let e = world.receive_value::<u64>(2, 1).map(|_| ()).unwrap_err();
                assert!(
                    matches!(e, Error::ProcessFailed { ref ranks, .. } if ranks == &vec![2]),
                    "{e}"
                );
                seen.push("from-dead");
                let e = world
                    .receive_value::<u64>(Source::Any, 1)
                    .map(|_| ())
                    .unwrap_err();
                assert!(matches!(e, Error::ProcessFailed { .. }), "{e}");
                seen.push("wildcard-unacked");
                assert_eq!(world.failed_ranks(), vec![2]);
                assert_eq!(world.ack_failed()?, vec![2]);
                world.send_value(1, 2, &0u64)?;
                let (v, st) = world.receive_value::<u64>(Source::Any, 1)?;
                assert_eq!((v, st.source), (11, 1));
                seen.push("wildcard-acked");
                let e = world.send_value(2, 1, &5u64).unwrap_err();
                assert!(matches!(e, Error::ProcessFailed { .. }), "{e}");
                seen.push("send-to-dead");
            } else {
                // Rank 0 says when (a message already there would match
                // its wildcard receive even before the acknowledgement).
                world.receive_value::<u64>(0, 2)?;
                world.send_value(0, 1, &11u64)?;
            }
            Ok(seen.join(","))
        });
        let v = report.outcome.unwrap_or_else(|e| panic!("{backend}: {e}"));
        assert_eq!(
            v,
            vec![
                "from-dead,wildcard-unacked,wildcard-acked,send-to-dead".to_string(),
                String::new()
            ],
            "{backend}: the dead rank has no value"
        );
        assert_eq!(report.stats.ranks_killed, 1, "{backend}");
    }
}

/// A rank blocked on a live peer that will never send is released by a
/// revoke from another rank.
#[test]
fn revoke_releases_ranks_blocked_on_live_peers() {
    for backend in backends() {
        let cfg = ulfm(backend, 4).kill("3@i1".parse().expect("kill"));
        let report = common::within(common::HANG_S, "revoke", move || {
            lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let me = world.rank();
                ctx.checkpoint(&())?;
                match me {
                    3 => loop {
                        ctx.compute(1e-4)?;
                    },
                    // Rank 0 waits for the dead rank and revokes.
                    0 => match world.receive_value::<u64>(3, 1) {
                        Err(Error::ProcessFailed { .. }) => {
                            world.revoke()?;
                            Ok::<String, Error>("revoked".into())
                        }
                        other => Err(Error::app(format!("expected a failure: {other:?}"))),
                    },
                    // The others wait for rank 0, which never sends.
                    _ => match world.receive_value::<u64>(0, 1) {
                        Err(Error::Revoked { .. }) => {
                            assert!(world.is_revoked());
                            Ok("released".into())
                        }
                        other => Err(Error::app(format!("expected a revoke: {other:?}"))),
                    },
                }
            })
        });
        let v = report.outcome.unwrap_or_else(|e| panic!("{backend}: {e}"));
        assert_eq!(v, vec!["revoked", "released", "released"], "{backend}");
    }
}

/// Every survivor returns the same agreements, though the coordinator
/// (the first live rank) dies in one of them (the kill lands at a seeded
/// one of its calls, all of which are agreements); each flag is the and of
/// the flags given, and shrink leaves out the same ranks everywhere.
#[test]
fn agreements_are_uniform_when_the_coordinator_dies_during_one() {
    const ROUNDS: u64 = 30;
    for backend in backends() {
        for seed in 1..=3 {
            let cfg = ulfm(backend, 5)
                .seed(seed)
                .kill("0@i1".parse().expect("kill"));
            let report = common::within(60, "agree", move || {
                lazarus::run(&cfg, |ctx| {
                    let world = ctx.world();
                    let me = world.rank();
                    ctx.checkpoint(&())?;
                    let mut rounds = Vec::new();
                    for round in 0..ROUNDS {
                        // Rank 3 says no in odd rounds.
                        let flag = world.agree(!(me == 3 && round % 2 == 1))?;
                        rounds.push((flag, world.failed_ranks()));
                    }
                    let small = world.shrink()?;
                    let members: Vec<usize> = (0..small.size())
                        .map(|r| small.world_rank(r))
                        .collect::<lazarus::Result<_>>()?;
                    let sum = small.all_reduce(me as u64, lazarus::ReduceOp::Sum)?;
                    Ok((
                        rounds.into_iter().map(|r| r.0).collect::<Vec<_>>(),
                        members,
                        sum,
                    ))
                })
            });
            let what = format!("{backend} seed {seed}");
            let v = report.outcome.unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(report.stats.ranks_killed, 1, "{what}");
            assert_eq!(v.len(), 4, "{what}: four survivors");
            let flags: Vec<bool> = (0..ROUNDS).map(|r| r % 2 == 0).collect();
            for (got, members, sum) in &v {
                assert_eq!(got, &flags, "{what}: flags");
                assert_eq!(members, &vec![1, 2, 3, 4], "{what}");
                assert_eq!(*sum, 10, "{what}");
            }
        }
    }
}

#[test]
fn failure_handling_return_needs_protocol_none() {
    let cfg = lazarus::Config::new(4)
        .protocol(ProtocolKind::Coordinated)
        .failure_handling(FailureHandling::Return);
    let e = cfg.validate().expect_err("refused");
    assert!(e.to_string().contains("only under protocol `none`"), "{e}");
    // Without it, ULFM calls say what is missing.
    let r = lazarus::run(&lazarus::Config::new(2), |ctx| ctx.world().revoke());
    let e = r.outcome.expect_err("revoke without Return");
    assert!(e.to_string().contains("FailureHandling::Return"), "{e}");
}
