//! Whole-job restart from disk: a run writing `--storage disk:DIR` is killed
//! with SIGKILL (launcher and all ranks: on the threads backend they are one
//! process), and `--restart DIR` resumes from the newest committed generation
//! and prints the same verified value.

mod common;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn lazarus() -> Command {
    Command::new(env!("CARGO_BIN_EXE_lazarus"))
}

fn temp_dir(name: &str) -> PathBuf {
    let d = common::temp_dir(name);
    std::fs::create_dir_all(&d).expect("temp dir");
    d
}

/// Run `JOB` with `extra` arguments and a JSON summary; asserts it succeeded
/// and that no rank began from the beginning (a restart that silently
/// ignored its directory would print the same value: the app is
/// deterministic). Returns stdout, stderr and the summary.
fn resumed(extra: &[&str], name: &str) -> (String, String, serde_json::Value) {
    let json = temp_dir(name).join("summary.json");
    let o = lazarus()
        .args(JOB)
        .args(extra)
        .args(["--json", json.to_str().expect("utf-8")])
        .output()
        .expect("runs");
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "{out}{err}");
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&json).expect("summary written")).expect("JSON");
    assert_eq!(
        summary["ranks_restarted_from_scratch"], 0,
        "the restart resumed from a checkpoint: {err}"
    );
    assert!(!err.contains("began from the beginning"), "{err}");
    let _ = std::fs::remove_dir_all(json.parent().expect("dir"));
    (out, err, summary)
}

const JOB: &[&str] = &[
    "run",
    "stencil",
    "--size",
    "400",
    "--iterations",
    "3000",
    "--ranks",
    "4",
    "--nodes",
    "2",
    "--protocol",
    "coordinated",
    "--checkpoint-every",
    "25",
];

/// Run `JOB` writing `disk:dir` and SIGKILL it once two generations are
/// committed there; returns the newest committed one at the kill.
fn run_and_kill(dir: &std::path::Path) -> u64 {
    let mut child = lazarus()
        .args(JOB)
        .args(["--storage", &format!("disk:{}", dir.display())])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    let t0 = Instant::now();
    let mut killed_at = None;
    while t0.elapsed() < Duration::from_secs(60) {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if lazarus::store::disk::committed_generations(dir).is_ok_and(|g| g.len() >= 2) {
            child.kill().expect("SIGKILL");
            killed_at = lazarus::store::disk::committed_generations(dir)
                .ok()
                .and_then(|g| g.first().copied());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.wait();
    killed_at.expect("the run was killed after committing a generation")
}

#[test]
fn sigkill_then_restart_from_disk_prints_the_same_value() {
    let dir = temp_dir("restart");
    let reference = lazarus().args(JOB).output().expect("runs");
    assert!(reference.status.success());
    let expected = common::last_line(&reference.stdout);
    assert!(expected.starts_with("VERIFIED "), "{expected}");

    let killed_at = run_and_kill(&dir);

    let (out, _, _) = resumed(&["--restart", dir.to_str().expect("utf-8")], "restart-json");
    assert_eq!(common::last_line(out.as_bytes()), expected);
    let from: u64 = out
        .lines()
        .find_map(|l| l.strip_prefix("restarting from generation "))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|g| g.parse().ok())
        .expect("says where it restarts from");
    assert!(
        from >= killed_at,
        "restarted from {from}, {killed_at} was committed"
    );

    // inspect agrees and verifies every checksum.
    let inspect = lazarus()
        .args(["inspect", dir.to_str().expect("utf-8")])
        .output()
        .expect("runs");
    assert!(inspect.status.success());
    assert!(String::from_utf8_lossy(&inspect.stdout).contains("A restart would use generation"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restart_falls_back_past_a_corrupted_piece_and_refuses_an_empty_dir() {
    let dir = temp_dir("fallback");
    let storage = format!("disk:{}", dir.display());
    let full = lazarus()
        .args(JOB)
        .args(["--storage", &storage])
        .output()
        .expect("runs");
    assert!(full.status.success());
    let expected = common::last_line(&full.stdout);
    let gens = lazarus::store::disk::committed_generations(&dir).expect("listed");
    assert!(gens.len() >= 2, "{gens:?}");
    // Flip one byte of rank 1's piece of the newest generation.
    let piece = lazarus::store::disk::piece_path(&dir, gens[0], 1);
    let mut bytes = std::fs::read(&piece).expect("piece");
    let n = bytes.len() - 1;
    bytes[n] ^= 0xff;
    std::fs::write(&piece, bytes).expect("write");

    let (out, err, _) = resumed(
        &["--restart", dir.to_str().expect("utf-8")],
        "fallback-json",
    );
    assert!(
        out.contains(&format!("restarting from generation {}", gens[1])),
        "{out}"
    );
    assert!(
        err.contains(&format!("generation {}", gens[0])),
        "the skipped generation is reported: {err}"
    );
    assert_eq!(common::last_line(out.as_bytes()), expected);

    let empty = temp_dir("empty");
    let o = lazarus()
        .args(JOB)
        .args(["--restart", empty.to_str().expect("utf-8")])
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--restart"));
    let _ = std::fs::remove_dir_all(&dir);
    let _ = std::fs::remove_dir_all(&empty);
}

#[test]
fn a_fresh_run_refuses_a_directory_with_an_earlier_runs_checkpoints() {
    let dir = temp_dir("stale");
    let storage = format!("disk:{}", dir.display());
    let first = lazarus()
        .args(JOB)
        .args(["--storage", &storage])
        .output()
        .expect("runs");
    assert!(first.status.success());
    // A different job into the same directory would otherwise restore the
    // first job's state at its first recovery.
    let o = lazarus()
        .args([
            "run",
            "stencil",
            "--ranks",
            "4",
            "--protocol",
            "coordinated",
            "--kill",
            "1@50%",
        ])
        .args(["--storage", &storage])
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("earlier run"));
    // Resuming it and writing on into the same directory works, and leaves
    // a directory a later restart can use.
    let (out, _, _) = resumed(
        &[
            "--storage",
            &storage,
            "--restart",
            dir.to_str().expect("utf-8"),
        ],
        "stale-json",
    );
    assert_eq!(
        common::last_line(out.as_bytes()),
        common::last_line(&first.stdout)
    );
    let report = lazarus::store::disk::inspect(&dir).expect("inspect");
    assert!(report.restart_from.is_some());
    assert!(
        report
            .generations
            .iter()
            .filter(|g| g.committed)
            .all(|g| g.usable),
        "{report:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn restart_from_one_directory_while_writing_to_another() {
    let source = temp_dir("source");
    let target = temp_dir("target");
    let reference = lazarus().args(JOB).output().expect("runs");
    assert!(reference.status.success());
    run_and_kill(&source);
    let before = lazarus::store::disk::committed_generations(&source).expect("listed");
    let newest = *before.first().expect("committed generations");
    let (out, _, summary) = resumed(
        &[
            "--restart",
            source.to_str().expect("utf-8"),
            "--storage",
            &format!("disk:{}", target.display()),
        ],
        "two-dirs-json",
    );
    assert!(
        out.contains(&format!("restarting from generation {newest}")),
        "{out}"
    );
    assert_eq!(
        common::last_line(out.as_bytes()),
        common::last_line(&reference.stdout)
    );
    // The resumed run checkpointed into the new directory, numbering on
    // from the restored generation; the source is read, never written.
    let written = lazarus::store::disk::committed_generations(&target).expect("listed");
    assert!(
        written.first().is_some_and(|&g| g > newest),
        "{written:?} after {newest}; {summary}"
    );
    assert_eq!(
        lazarus::store::disk::committed_generations(&source).expect("listed"),
        before
    );
    let _ = std::fs::remove_dir_all(&source);
    let _ = std::fs::remove_dir_all(&target);
}
