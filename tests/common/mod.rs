//! Helpers shared by the integration tests.
//!
//! The processes backend starts each rank as a new process of the running
//! program. In a test binary that program is the test harness, so its rank
//! processes are told to run only the current test (`--exact NAME`), found
//! by the name libtest gives the test's thread; [`within`] passes that name
//! on to the thread it starts.

#![allow(dead_code)]

use std::sync::mpsc;
use std::time::Duration;

use lazarus::apps::{AppKind, AppParams, Verification, run_app};
use lazarus::{Backend, Config, JobStats};

/// The name of the running test (libtest names the test's thread so).
fn test_name() -> String {
    std::thread::current()
        .name()
        .unwrap_or_else(|| panic!("tests must run on libtest's named threads"))
        .to_string()
}

/// Make `cfg` runnable by the running test on the processes backend.
///
/// Every backend gets the worker arguments: the launcher and the rank
/// processes count and replay the calls that name them (whatever their
/// backend), so a rank process of a test that mixes backends reaches its
/// own call without running the test's earlier jobs again.
pub fn for_this_test(cfg: Config) -> Config {
    cfg.worker_args(vec![
        "--exact".into(),
        test_name(),
        // An `#[ignore]`d test run on purpose runs in its ranks too.
        "--include-ignored".into(),
        "--test-threads=1".into(),
        "--nocapture".into(),
    ])
}

/// The id of the test process that launched this one, or this process's:
/// rank processes must name the same files as their launching test.
pub fn test_process_id() -> u32 {
    std::env::var("LAZARUS_LAUNCHER_PID")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(std::process::id)
}

/// A configuration of `ranks` ranks on `backend` for the running test.
pub fn config(backend: Backend, ranks: usize) -> Config {
    for_this_test(Config::new(ranks).backend(backend))
}

/// The bound on a run that tests give [`within`] and similar watchdogs: a
/// hang detector, not a speed limit. A run of seconds on an idle machine
/// takes minutes beside busy loops (two per core: the suite must pass so).
pub const HANG_S: u64 = 600;

/// Run `f` on another thread (named like the test) and fail, instead of
/// hanging the suite, if it does not finish within `secs` seconds.
pub fn within<T: Send + 'static>(
    secs: u64,
    what: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name(test_name())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .expect("spawn the watched thread");
    match rx.recv_timeout(Duration::from_secs(secs)) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what}: no result within {secs} s (hang)"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            panic!("{what}: the watched thread panicked (see its message above)")
        }
    }
}

/// A fresh directory `lazarus-NAME-PID` under the system's temporary
/// directory, named after the test process. A rank process re-runs the
/// test's code: there the directory is its job's, and is left alone.
pub fn temp_dir(name: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("lazarus-{name}-{}", test_process_id()));
    if !lazarus::driver::processes::launched() && !lazarus::driver::mpi_env::self_launched() {
        let _ = std::fs::remove_dir_all(&d);
    }
    d
}

/// The last line of a command's output.
pub fn last_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .last()
        .unwrap_or_default()
        .to_string()
}

/// Run `app` under `cfg`; panics (naming the protocol) if the run fails.
pub fn run(app: AppKind, params: &AppParams, cfg: &Config) -> (Verification, JobStats) {
    let r = run_app(app, params, cfg);
    match r.outcome {
        Ok(v) => (v, r.stats),
        Err(e) => panic!("{app} under {} failed: {e}", cfg.get_protocol()),
    }
}

/// The parameters of problem class `class`.
pub fn class(class: char) -> AppParams {
    AppParams {
        class: Some(class),
        ..AppParams::default()
    }
}
