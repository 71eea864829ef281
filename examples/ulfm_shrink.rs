//! ULFM-style failure handling (002 §3.2) by shrinking: an all-reduce loop
//! under protocol `none` that survives a rank's death and carries on with
//! fewer ranks.
//!
//! ```text
//! cargo run --release --example ulfm_shrink -- [--backend threads|processes|sim] [--nodes K] [--kill SPEC]
//! ```
//!
//! Failures are reported to the program (`FailureHandling::Return`). When a
//! step's all-reduce fails (`ProcessFailed` at the ranks that talk to the
//! dead one, `Revoked` at the others once someone revoked), every survivor
//! revokes the communicator, shrinks it to the survivors, and redoes the
//! step with them. Each step's sum is checked against its closed form for
//! the members of that step, so the program verifies itself: rank 0 prints
//! `VERIFIED` with the number of ranks at the end.

use lazarus::{Backend, Config, Error, FailureHandling, ReduceOp};

const STEPS: u64 = 40;

/// What each rank returns: per step, the members (world ranks) that took
/// part and whether the sum was right.
type Steps = Vec<(Vec<usize>, bool)>;

fn main() -> std::process::ExitCode {
    // The heap on huge pages, as the `lazarus` command has it (logs and
    // checkpoints are fresh memory); glibc's defaults if that fails.
    if let Err(e) = lazarus::driver::heap::run_again_with_heap_setting() {
        eprintln!("warning: cannot run again with the heap setting ({e})");
    }
    let args: Vec<String> = std::env::args().collect();
    let opt = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1).cloned())
    };
    let backend: Backend = match opt("--backend").unwrap_or_else(|| "threads".into()).parse() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let kill = match opt("--kill").unwrap_or_else(|| "2@50%".into()).parse() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let nodes = opt("--nodes").and_then(|n| n.parse().ok()).unwrap_or(1);
    let cfg = Config::new(4)
        .nodes(nodes)
        .backend(backend)
        .failure_handling(FailureHandling::Return)
        .kill(kill);
    let report = lazarus::run(&cfg, |ctx| {
        let me = ctx.rank();
        let mut comm = ctx.world();
        let mut steps: Steps = Vec::new();
        let mut step = 0;
        // After a repair: collectives are not uniform under failures (the
        // failed step may have completed at some survivors), so everyone
        // goes back to the first step not all of them completed.
        let mut resync = false;
        while step < STEPS {
            ctx.set_progress(step as f64 / STEPS as f64);
            let x = (me as f64 + 1.0) * (step as f64 + 1.0);
            let r = if resync {
                comm.all_reduce(step, ReduceOp::Min).map(|first| {
                    step = first;
                    steps.truncate(first as usize);
                    resync = false;
                })
            } else {
                comm.all_reduce(x, ReduceOp::Sum).and_then(|sum| {
                    let members: Vec<usize> = (0..comm.size())
                        .map(|r| comm.world_rank(r))
                        .collect::<lazarus::Result<_>>()?;
                    let want: f64 =
                        members.iter().map(|&w| w as f64 + 1.0).sum::<f64>() * (step as f64 + 1.0);
                    steps.push((members, sum == want));
                    step += 1;
                    Ok(())
                })
            };
            match r {
                Ok(()) => {}
                Err(e @ (Error::ProcessFailed { .. } | Error::Revoked { .. })) => {
                    if std::env::var_os("ULFM_DEBUG").is_some() {
                        eprintln!("rank {me} step {step}: {e}");
                    }
                    // Make sure nobody stays blocked in this collective,
                    // then go on with the survivors.
                    comm.revoke()?;
                    comm = comm.shrink()?;
                    resync = true;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(steps)
    });
    match (report.rank, report.outcome) {
        (Some(0) | None, Ok(ranks)) => {
            let Some(first) = ranks.first() else {
                eprintln!("error: no rank finished");
                return std::process::ExitCode::FAILURE;
            };
            let agree = ranks
                .iter()
                .all(|r| r.iter().map(|s| &s.0).eq(first.iter().map(|s| &s.0)));
            let right = ranks.iter().flatten().all(|s| s.1);
            let sizes: Vec<usize> = first.iter().map(|s| s.0.len()).collect();
            let shrunk_at = sizes.iter().position(|&n| n < 4);
            println!(
                "{} ranks finished; steps with 4 ranks: {}, shrunk at step {:?} to {} ranks",
                ranks.len(),
                sizes.iter().filter(|&&n| n == 4).count(),
                shrunk_at,
                sizes.last().copied().unwrap_or(0)
            );
            if agree && right && first.len() as u64 == STEPS {
                println!("VERIFIED {}", sizes.last().copied().unwrap_or(0));
                std::process::ExitCode::SUCCESS
            } else {
                println!("NOT VERIFIED (members agree: {agree}, sums right: {right})");
                std::process::ExitCode::FAILURE
            }
        }
        (_, Ok(_)) => std::process::ExitCode::SUCCESS,
        (_, Err(e)) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
