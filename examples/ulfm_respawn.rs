//! ULFM-style failure handling (002 §3.2) by respawning: under protocol
//! `none`, a failed rank is replaced by a new incarnation with its number,
//! which gets its data back from a partner and the job goes on with all
//! ranks, to the bit-identical result of a run without failure.
//!
//! ```text
//! cargo run --release --example ulfm_respawn -- [--backend threads|processes|sim] [--nodes K] [--kill SPEC]...
//! ```
//!
//! Each rank owns a block of a vector and, at the start of every step,
//! sends a copy to its *holder*, the rank half the job away (on another
//! failure domain with block placement), and keeps the copy of the rank it
//! holds; then the ranks all-reduce a sum and update their blocks. When an
//! operation fails, every survivor revokes the communicator and calls
//! `respawn`: the dead ranks start again from the beginning of the rank
//! function (`Ctx::is_respawned`), `join` the repaired communicator, and
//! everyone goes back to the first step all of them can restore (operations
//! are not uniform under failures: the failed step may have completed at
//! some survivors); each new incarnation receives its block from its
//! holder. The program runs the job without failures, then with them, and
//! prints `VERIFIED` when every rank's block is bit-identical.

use std::collections::BTreeMap;

use lazarus::{Backend, Communicator, Config, Ctx, Error, FailureHandling, KillSpec, ReduceOp};

const STEPS: u64 = 60;
const BLOCK: usize = 256;
const TAG_COPY: i32 = 1;
const TAG_RESTORE: i32 = 2;

/// The rank that keeps a copy of `r`'s block.
fn holder(r: usize, p: usize) -> usize {
    (r + p / 2) % p
}

/// The rank whose block `r` keeps.
fn held_of(r: usize, p: usize) -> usize {
    (r + p - p / 2) % p
}

fn is_failure(e: &Error) -> bool {
    matches!(e, Error::ProcessFailed { .. } | Error::Revoked { .. })
}

/// One rank's state: its block at the start of recent steps, and the copies
/// of the held rank's block.
struct Rank {
    step: u64,
    mine: BTreeMap<u64, Vec<f64>>,
    held: BTreeMap<u64, Vec<f64>>,
}

impl Rank {
    fn keep_recent(&mut self) {
        let oldest = self.step.saturating_sub(3);
        self.mine.retain(|&s, _| s >= oldest);
        self.held.retain(|&s, _| s >= oldest);
    }
}

/// Go back to the first step every rank can restore, and hand each new
/// incarnation its block. `respawned`: communicator ranks just replaced.
fn resync(
    comm: &Communicator,
    st: &mut Rank,
    respawned: &[usize],
    fresh: bool,
) -> lazarus::Result<()> {
    let (me, p) = (comm.rank(), comm.size());
    let mut can = if fresh { u64::MAX } else { st.step };
    if respawned.iter().any(|&f| holder(f, p) == me) {
        // A holder can go back only as far as its copies reach.
        can = can.min(st.held.keys().next_back().copied().unwrap_or(0));
    }
    let first = comm.all_reduce(can, ReduceOp::Min)?;
    for &f in respawned.iter().filter(|&&f| holder(f, p) == me) {
        let block = st.held.get(&first).ok_or_else(|| {
            Error::app(format!(
                "rank {me} holds no copy of rank {f} at step {first}"
            ))
        })?;
        comm.send_value(f, TAG_RESTORE, &(first, block.clone()))?;
    }
    if fresh {
        let ((s, block), _) = comm.receive_value::<(u64, Vec<f64>)>(holder(me, p), TAG_RESTORE)?;
        st.mine.insert(s, block);
    }
    st.step = first;
    st.mine.retain(|&s, _| s <= first);
    st.held.retain(|&s, _| s < first);
    Ok(())
}

fn rank_function(ctx: &mut Ctx) -> lazarus::Result<Vec<f64>> {
    let me = ctx.rank();
    let p = ctx.size();
    let mut st = Rank {
        step: 0,
        mine: BTreeMap::new(),
        held: BTreeMap::new(),
    };
    let (mut comm, mut pending) = if ctx.is_respawned() {
        (ctx.join()?, Some((Vec::new(), true)))
    } else {
        let block = (0..BLOCK).map(|i| (me * BLOCK + i) as f64 / 7.0).collect();
        st.mine.insert(0, block);
        (ctx.world(), None)
    };
    while st.step < STEPS {
        ctx.set_progress(st.step as f64 / STEPS as f64);
        let r = (|| -> lazarus::Result<()> {
            if let Some((respawned, fresh)) = &pending {
                resync(&comm, &mut st, respawned, *fresh)?;
                pending = None;
            }
            let s = st.step;
            let block = st
                .mine
                .get(&s)
                .cloned()
                .ok_or_else(|| Error::app("no block"))?;
            comm.send_value(holder(me, p), TAG_COPY, &(s, block.clone()))?;
            let ((hs, copy), _) =
                comm.receive_value::<(u64, Vec<f64>)>(held_of(me, p), TAG_COPY)?;
            if hs != s {
                return Err(Error::app(format!("copy of step {hs} in step {s}")));
            }
            st.held.insert(s, copy);
            let local: f64 = block.iter().sum();
            let sum = comm.all_reduce(local, ReduceOp::Sum)?;
            let next = block
                .iter()
                .enumerate()
                .map(|(i, x)| 0.5 * x + (sum / (1.0 + s as f64 + i as f64)).sin())
                .collect();
            st.step += 1;
            st.mine.insert(st.step, next);
            st.keep_recent();
            Ok(())
        })();
        match r {
            Ok(()) => {}
            Err(e) if is_failure(&e) => {
                comm.revoke()?;
                let (repaired, respawned) = comm.respawn()?;
                comm = repaired;
                pending = Some((respawned, false));
            }
            Err(e) => return Err(e),
        }
    }
    st.mine
        .remove(&STEPS)
        .ok_or_else(|| Error::app("no final block"))
}

fn main() -> std::process::ExitCode {
    // The heap on huge pages, as the `lazarus` command has it (logs and
    // checkpoints are fresh memory); glibc's defaults if that fails.
    if let Err(e) = lazarus::driver::heap::run_again_with_heap_setting() {
        eprintln!("warning: cannot run again with the heap setting ({e})");
    }
    let args: Vec<String> = std::env::args().collect();
    let opts = |name: &str| -> Vec<String> {
        args.windows(2)
            .filter(|w| w[0] == name)
            .map(|w| w[1].clone())
            .collect()
    };
    let parsed = (|| -> lazarus::Result<(Backend, usize, Vec<KillSpec>)> {
        let backend = opts("--backend")
            .pop()
            .unwrap_or_else(|| "threads".into())
            .parse()?;
        let nodes = opts("--nodes")
            .pop()
            .and_then(|n| n.parse().ok())
            .unwrap_or(2);
        let mut kills: Vec<KillSpec> = opts("--kill")
            .iter()
            .map(|k| k.parse())
            .collect::<lazarus::Result<_>>()?;
        if kills.is_empty() {
            kills.push("3@40%".parse()?);
        }
        Ok((backend, nodes, kills))
    })();
    let (backend, nodes, kills) = match parsed {
        Ok(x) => x,
        Err(e) => {
            eprintln!("error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let base = Config::new(4)
        .nodes(nodes)
        .backend(backend)
        .failure_handling(FailureHandling::Return);
    let reference = lazarus::run(&base, rank_function);
    let cfg = kills.into_iter().fold(base, |c, k| c.kill(k));
    let report = lazarus::run(&cfg, rank_function);
    match (report.rank, reference.outcome, report.outcome) {
        (Some(_), _, Ok(_)) => std::process::ExitCode::SUCCESS,
        (None, Ok(want), Ok(got)) => {
            let checksum: f64 = got.iter().flatten().sum();
            println!(
                "{} ranks finished after {} failure(s), {} rank(s) respawned; checksum {checksum:.15e}",
                got.len(),
                report.stats.failures,
                report.stats.ranks_killed
            );
            let same = want.len() == got.len()
                && want
                    .iter()
                    .flatten()
                    .zip(got.iter().flatten())
                    .all(|(a, b)| a.to_bits() == b.to_bits());
            if same && report.stats.unfired_kills.is_empty() {
                println!("VERIFIED {checksum:.15e}");
                std::process::ExitCode::SUCCESS
            } else {
                println!("NOT VERIFIED (identical to the failure-free run: {same})");
                std::process::ExitCode::FAILURE
            }
        }
        (_, Err(e), _) | (_, _, Err(e)) => {
            eprintln!("error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
