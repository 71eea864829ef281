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

#[test]
fn sigkill_then_restart_from_disk_prints_the_same_value() {
    let dir = temp_dir("restart");
    let reference = lazarus().args(JOB).output().expect("runs");
    assert!(reference.status.success());
    let expected = common::last_line(&reference.stdout);
    assert!(expected.starts_with("VERIFIED "), "{expected}");

    let storage = format!("disk:{}", dir.display());
    let mut child = lazarus()
        .args(JOB)
        .args(["--storage", &storage])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starts");
    // Kill it (SIGKILL) once a generation is committed on disk.
    let t0 = Instant::now();
    let mut killed_at = None;
    while t0.elapsed() < Duration::from_secs(60) {
        if child.try_wait().expect("wait").is_some() {
            break;
        }
        if lazarus::store::disk::committed_generations(&dir).is_ok_and(|g| g.len() >= 2) {
            child.kill().expect("SIGKILL");
            killed_at = lazarus::store::disk::committed_generations(&dir)
                .ok()
                .and_then(|g| g.first().copied());
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let _ = child.wait();
    let killed_at = killed_at.expect("the run was killed after committing a generation");

    let restarted = lazarus()
        .args(JOB)
        .args(["--restart", dir.to_str().expect("utf-8")])
        .output()
        .expect("runs");
    let out = String::from_utf8_lossy(&restarted.stdout);
    assert!(
        restarted.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&restarted.stderr)
    );
    assert_eq!(common::last_line(&restarted.stdout), expected);
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

    let o = lazarus()
        .args(JOB)
        .args(["--restart", dir.to_str().expect("utf-8")])
        .output()
        .expect("runs");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{out}{err}");
    assert!(
        out.contains(&format!("restarting from generation {}", gens[1])),
        "{out}"
    );
    assert!(
        err.contains(&format!("generation {}", gens[0])),
        "the skipped generation is reported: {err}"
    );
    assert_eq!(common::last_line(&o.stdout), expected);

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
    let o = lazarus()
        .args(JOB)
        .args([
            "--storage",
            &storage,
            "--restart",
            dir.to_str().expect("utf-8"),
        ])
        .output()
        .expect("runs");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        common::last_line(&o.stdout),
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
