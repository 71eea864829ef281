//! The mpi backend (built with `--features mpi`; `.ci/run` installs MPICH):
//! the apps on 2 and 4 MPI ranks against the threads backend's results
//! (bit-identical), a job ended by a rank's death started again from its
//! disk generation (by `lazarus::run` itself, and by `lazarus mpirun` for
//! a job the user started with `mpiexec`), and the usage errors. Built
//! with `--features ulfm` (on Open MPI 5, as `.ci/run` does with PyPI's
//! wheel), the same kills are survived in place instead: substitutes are
//! spawned and the run's protocol recovers as on the processes backend.
//!
//! The shared conformance suite (`tests/api_conformance.rs`) runs on the
//! mpi backend too: `Backend::ALL` holds it in this build.

#![cfg(feature = "mpi")]

mod common;

use std::process::Command;

use common::{class, within};
use lazarus::apps::ft::Exchange;
use lazarus::apps::{AppKind, AppParams};
use lazarus::{Backend, KillSpec, ProtocolKind};

/// The apps of the list, with parameters small enough for CI.
fn apps() -> Vec<(AppKind, AppParams)> {
    vec![
        (AppKind::Cg, class('S')),
        (AppKind::Stencil, AppParams::default()),
        (AppKind::Dht, class('S')),
        // FT's transposes both ways: puts into an MPI window between
        // fences, and the two-sided all-to-all.
        (
            AppKind::Ft,
            AppParams {
                transpose: Some(Exchange::Put),
                ..class('S')
            },
        ),
        (
            AppKind::Ft,
            AppParams {
                transpose: Some(Exchange::AllToAll),
                ..class('S')
            },
        ),
    ]
}

#[cfg(not(feature = "ulfm"))]
fn disk(dir: &std::path::Path) -> lazarus::config::LevelSpec {
    format!("disk:{}", dir.display())
        .parse()
        .expect("a disk level")
}

/// CG, stencil, dht and FT verify on 2 and 4 MPI ranks under `none` and
/// `coordinated`, with the value the threads backend computes, bit for bit.
#[test]
fn apps_verify_on_mpi_as_on_threads() {
    for ranks in [2, 4] {
        for (app, params) in apps() {
            let oracle = common::config(Backend::Threads, ranks);
            let (want, _) = common::run(app, &params, &oracle);
            for protocol in [ProtocolKind::None, ProtocolKind::Coordinated] {
                let cfg = common::config(Backend::Mpi, ranks).protocol(protocol);
                let what = format!("{app} {protocol} on {ranks} MPI ranks");
                let params = params.clone();
                let (got, st) = within(common::HANG_S, &what, move || {
                    common::run(app, &params, &cfg)
                });
                assert!(got.verified, "{app} {protocol} on {ranks}: {}", got.detail);
                assert_eq!(
                    got.value, want.value,
                    "{app} {protocol} on {ranks} MPI ranks differs from threads"
                );
                if protocol == ProtocolKind::Coordinated {
                    assert!(st.checkpoints > 0, "{app}: no checkpoint committed");
                }
                assert_eq!(st.failures, 0);
            }
        }
    }
}

/// A fault-plan kill ends the MPI job (no ULFM); `lazarus::run` starts it
/// again from the newest generation on disk, and the answer is the
/// failure-free one.
#[cfg(not(feature = "ulfm"))]
#[test]
fn a_killed_rank_ends_the_job_which_restarts_from_disk() {
    within(common::HANG_S, "restart from disk", || {
        let params = class('W');
        let free = common::config(Backend::Threads, 4).protocol(ProtocolKind::Coordinated);
        let (want, _) = common::run(AppKind::Cg, &params, &free);
        let dir = common::temp_dir("mpi-restart");
        let cfg = common::config(Backend::Mpi, 4)
            .protocol(ProtocolKind::Coordinated)
            .storage(vec![disk(&dir)])
            .kill("2@50%".parse::<KillSpec>().expect("a kill"));
        let (got, st) = common::run(AppKind::Cg, &params, &cfg);
        assert!(got.verified, "{}", got.detail);
        assert_eq!(got.value, want.value);
        assert_eq!(st.job_restarts, 1, "one restart after the kill");
        assert_eq!((st.failures, st.ranks_killed), (1, 1));
        assert!(st.unfired_kills.is_empty(), "{:?}", st.unfired_kills);
        assert!(
            st.ranks_rolled_back == 4,
            "every rank restarts from the generation on disk: {} rolled back",
            st.ranks_rolled_back
        );
        let _ = std::fs::remove_dir_all(&dir);
    });
}

/// `mpiexec -n RANKS lazarus ARGS`, as a user starts a job; its standard
/// output, once it succeeded.
fn user_mpiexec(ranks: usize, args: &[&str]) -> String {
    let mpiexec = lazarus::driver::mpi::launch::mpiexec();
    let out = Command::new(&mpiexec[0])
        .args(&mpiexec[1..])
        .args(["-n", &ranks.to_string(), env!("CARGO_BIN_EXE_lazarus")])
        .args(args)
        .output()
        .expect("run mpiexec");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The command line: `mpiexec -n 2 lazarus run cg --backend mpi` verifies,
/// and `lazarus mpirun` starts a user's `mpiexec` job again after a kill.
#[test]
fn user_launched_jobs_and_mpirun() {
    let bin = env!("CARGO_BIN_EXE_lazarus");
    let mpiexec = lazarus::driver::mpi::launch::mpiexec();
    let stdout = user_mpiexec(2, &["run", "cg", "--class", "S", "--backend", "mpi"]);
    assert_eq!(
        stdout.matches("VERIFIED").count(),
        1,
        "rank 0 alone prints the summary: {stdout}"
    );
    assert!(
        stdout.contains("2 ranks on 1 node(s), backend mpi"),
        "{stdout}"
    );

    let dir = common::temp_dir("mpirun");
    let disk = format!("disk:{}", dir.display());
    let out = Command::new(bin)
        .args(["mpirun", "--"])
        .args(&mpiexec)
        .args(["-n", "4", bin, "run", "stencil", "--backend", "mpi"])
        .args([
            "--protocol",
            "coordinated",
            "--storage",
            &disk,
            "--kill",
            "1@60%",
        ])
        .output()
        .expect("run lazarus mpirun");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        common::last_line(&out.stdout).starts_with("VERIFIED "),
        "{stdout}"
    );
    // On ULFM the job survives in place; elsewhere it is started again.
    assert_eq!(
        stdout.contains("job restarts 1"),
        !cfg!(feature = "ulfm"),
        "{stdout}"
    );
    assert!(stdout.contains("failures 1 (1 ranks killed)"), "{stdout}");
    assert_eq!(stdout.matches("VERIFIED").count(), 1, "{stdout}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// ULFM, a job the user started with `mpiexec`: when rank 0 dies, its
/// substitute takes over the printing of the summary (and nobody else
/// prints one, the substitute's own one-process world notwithstanding).
#[cfg(feature = "ulfm")]
#[test]
fn a_user_launched_job_survives_rank_0_on_ulfm() {
    let stdout = user_mpiexec(
        4,
        &[
            "run",
            "stencil",
            "--backend",
            "mpi",
            "--protocol",
            "pessimistic",
            "--kill",
            "0@50%",
        ],
    );
    assert_eq!(stdout.matches("lazarus run stencil").count(), 1, "{stdout}");
    assert!(stdout.contains("4 ranks on"), "{stdout}");
    assert_eq!(stdout.matches("VERIFIED").count(), 1, "{stdout}");
    assert!(
        stdout.contains("failures 1 (1 ranks killed); ranks rolled back 1;"),
        "{stdout}"
    );
    assert!(stdout.contains("job restarts 0"), "{stdout}");
}

/// `lazarus bench` compares protocols on one program, whose ranks run the
/// call made for the first protocol compared (`none`, without a log
/// budget): the launcher imposes each protocol with its settings. A
/// pessimistic log bounded by `--log-budget` spills on MPI ranks exactly
/// as on rank processes.
#[test]
fn bench_imposes_a_protocols_settings_on_mpi_ranks_as_on_processes() {
    let bin = env!("CARGO_BIN_EXE_lazarus");
    let dir = common::temp_dir("bench-settings");
    std::fs::create_dir_all(&dir).expect("a directory");
    let spilled = |backend: &str| -> u64 {
        let json = dir.join(format!("{backend}.json"));
        let out = Command::new(bin)
            .args(["bench", "cg", "--class", "S", "--ranks", "2", "--reps", "1"])
            .args(["--backend", backend, "--protocols", "none,pessimistic"])
            .args(["--log-budget", "64KiB", "--json"])
            .arg(&json)
            .output()
            .expect("run lazarus bench");
        assert!(
            out.status.success(),
            "{backend}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&json).expect("the report")).expect("JSON");
        v["protocols"][1]["runs"][0]["spilled_log_bytes"]
            .as_u64()
            .expect("spilled_log_bytes")
    };
    let on_mpi = spilled("mpi");
    assert!(on_mpi > 0, "the log budget did not reach the MPI ranks");
    assert_eq!(on_mpi, spilled("processes"));
}

/// What the mpi backend cannot do without ULFM is a usage error naming
/// the option.
#[cfg(not(feature = "ulfm"))]
#[test]
fn kills_without_a_disk_level_are_refused() {
    let bin = env!("CARGO_BIN_EXE_lazarus");
    let out = Command::new(bin)
        .args(["run", "cg", "--backend", "mpi", "--ranks", "2"])
        .args(["--protocol", "coordinated", "--kill", "1@50%"])
        .output()
        .expect("run lazarus");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--kill") && stderr.contains("--storage"),
        "{stderr}"
    );
}

/// Run `app` on 4 MPI ranks on 2 nodes under `protocol` with `kills`, and
/// check it against the failure-free value `want`: recovered in place
/// (ULFM), no job restart, every kill fired, and under the logging
/// protocols only the dead rolled back.
#[cfg(feature = "ulfm")]
fn recovers_in_place(
    (app, params): (AppKind, &AppParams),
    protocol: ProtocolKind,
    kills: &[&str],
    want: &lazarus::apps::Verification,
) {
    let mut cfg = common::config(Backend::Mpi, 4).nodes(2).protocol(protocol);
    for k in kills {
        cfg = cfg.kill(k.parse::<KillSpec>().expect("a kill"));
    }
    let what = format!("{app} {protocol} {kills:?} on ULFM");
    let params = params.clone();
    let (got, st) = within(common::HANG_S, &what, move || {
        common::run(app, &params, &cfg)
    });
    assert!(got.verified, "{what}: {}", got.detail);
    assert_eq!(got.value, want.value, "{what} differs from threads");
    assert_eq!(st.job_restarts, 0, "{what}: recovered in place");
    assert!(
        st.unfired_kills.is_empty(),
        "{what}: {:?}",
        st.unfired_kills
    );
    assert_eq!(st.failures, kills.len() as u64, "{what}: failure events");
    let killed = st.ranks_killed;
    assert!(killed >= kills.len() as u64, "{what}: {killed} killed");
    match protocol {
        // Everyone rolls back (once more for each failure that came
        // after everyone resumed).
        ProtocolKind::Coordinated => assert!(
            (4..=4 * st.failures).contains(&st.ranks_rolled_back),
            "{what}: {} rolled back",
            st.ranks_rolled_back
        ),
        ProtocolKind::Pessimistic | ProtocolKind::Ulml => assert_eq!(
            st.ranks_rolled_back, killed,
            "{what}: only the dead roll back"
        ),
        _ => assert!(
            (killed..=4 * st.failures).contains(&st.ranks_rolled_back),
            "{what}: {} rolled back",
            st.ranks_rolled_back
        ),
    }
}

/// ULFM (002 §3.2): CG and the stencil verify bit-identically under every
/// protocol with a rank killed, with a node's two ranks killed at once,
/// and with a second kill during the recovery from the first; dht under
/// `coordinated` and `pessimistic`.
#[cfg(feature = "ulfm")]
#[test]
fn killed_ranks_are_replaced_in_place_on_ulfm() {
    let cases = [
        (AppKind::Cg, class('S')),
        (AppKind::Stencil, AppParams::default()),
    ];
    let protocols = [
        ProtocolKind::Coordinated,
        ProtocolKind::Pessimistic,
        ProtocolKind::Ulml,
        ProtocolKind::Correlated,
    ];
    for (app, params) in &cases {
        let (want, _) = common::run(*app, params, &common::config(Backend::Threads, 4));
        for protocol in protocols {
            for kills in [&["1@40%"][..], &["node:1@50%"], &["0@30%", "2@recovery"]] {
                recovers_in_place((*app, params), protocol, kills, &want);
            }
        }
    }
    let dht = class('S');
    let (want, _) = common::run(AppKind::Dht, &dht, &common::config(Backend::Threads, 4));
    for protocol in [ProtocolKind::Coordinated, ProtocolKind::Pessimistic] {
        recovers_in_place((AppKind::Dht, &dht), protocol, &["1@40%"], &want);
    }
}
