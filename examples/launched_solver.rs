//! A program started by `lazarus launch`, the way an MPI program is started
//! by `mpirun`:
//!
//! ```text
//! cargo build --release --example launched_solver
//! lazarus launch -n 4 --kill 2@50% -- target/release/examples/launched_solver 200
//! ```
//!
//! With `no-progress` after the step count, the solver does not report its
//! progress (`ctx.set_progress`), as many programs do not: a `R@P%` kill
//! then never fires, and the launcher says so.
//!
//! Each rank process calls `lazarus::run` once; the launcher decides the
//! size, the failure domains and the failures. The rank function is a
//! small iterative solver: every step all-reduces a sum and checkpoints its
//! state, so a killed rank is replaced and the job rolls back to the last
//! committed generation. Rank 0 prints the result, which does not depend on
//! whether (or when) a rank was killed.

use lazarus::{Config, ProtocolKind, ReduceOp};

fn main() -> std::process::ExitCode {
    // The heap on huge pages, as the `lazarus` command has it (logs and
    // checkpoints are fresh memory); glibc's defaults if that fails.
    if let Err(e) = lazarus::driver::heap::run_again_with_heap_setting() {
        eprintln!("warning: cannot run again with the heap setting ({e})");
    }
    let steps: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(100);
    let progress = std::env::args().nth(2).as_deref() != Some("no-progress");
    let cfg = Config::new(4).protocol(ProtocolKind::Coordinated);
    let report = lazarus::run(&cfg, move |ctx| {
        let world = ctx.world();
        let (mut step, mut x): (u64, f64) = ctx.restore_or_else(|| (0, 1.0))?;
        while step < steps {
            let mine = x * (world.rank() as f64 + 1.0) / world.size() as f64;
            let mut sum = [0.0];
            world.all_reduce_into(&[mine], &mut sum, ReduceOp::Sum)?;
            x = 0.5 * x + 1.0 / (1.0 + sum[0]);
            step += 1;
            if progress {
                ctx.set_progress(step as f64 / steps as f64);
            }
            ctx.checkpoint(&(step, x))?;
        }
        Ok(x)
    });
    match (report.rank, report.outcome) {
        (Some(0) | None, Ok(v)) => {
            println!("RESULT {:.17e}", v[0]);
            std::process::ExitCode::SUCCESS
        }
        (_, Ok(_)) => std::process::ExitCode::SUCCESS,
        (_, Err(e)) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
