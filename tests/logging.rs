//! Message logging (`pessimistic`, `ulml` and `correlated`), on every
//! backend: only the dead ranks (under `correlated`, their correlated sets)
//! roll back; a wildcard-receive application replays its receptions in the
//! logged order; one-sided accesses (fetch-and-op, locks) apply exactly
//! once across a failure; a log budget keeps logs small by forcing
//! checkpoints; an all-reduce costs the log records of 002 Table 1.

mod common;

use lazarus::apps::{AppKind, AppParams, run_app};
use lazarus::{
    Backend, Config, Ctx, JobStats, LockType, ProtocolKind, Rank, ReduceOp, Result, Source,
};
use serde::{Deserialize, Serialize};

const ITERATIONS: u64 = 24;

/// State of the wildcard application.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Chain {
    it: u64,
    /// The value rank 0 computed in each iteration, as each rank knows it.
    chain: Vec<u64>,
    /// Rank 0: senders in arrival order, per iteration.
    arrivals: Vec<Vec<usize>>,
}

/// Rank 0 receives one message from every other rank with a wildcard
/// source and folds them in arrival order (the result depends on it); it
/// sends the result to everyone, and their next message depends on it. A
/// replay that matched receptions in another order would compute another
/// chain than the one the survivors received before the failure.
/// What the wildcard apps return: the chain, and rank 0's arrival orders.
type ChainAndOrders = (Vec<u64>, Vec<Vec<usize>>);

fn wildcard_app(ctx: &mut Ctx) -> Result<ChainAndOrders> {
    wildcard_rounds(ctx, false)
}

/// [`wildcard_app`] with rank 0 posting all its wildcard receives at once
/// and then waiting for them: which request matches which message is part
/// of what the replay must reproduce, and a resent message whose
/// determinant is not yet at the front waits among the unexpected ones
/// while a receive that will match it is already posted.
fn posted_wildcard_app(ctx: &mut Ctx) -> Result<ChainAndOrders> {
    wildcard_rounds(ctx, true)
}

fn wildcard_rounds(ctx: &mut Ctx, posted: bool) -> Result<ChainAndOrders> {
    let world = ctx.world();
    let (me, p) = (world.rank(), world.size());
    let mut st: Chain = ctx.restore_or_else(Chain::default)?;
    while st.it < ITERATIONS {
        let prev = st.chain.last().copied().unwrap_or(17);
        if me == 0 {
            let mut h = prev;
            let mut order = Vec::new();
            let mut fold = |v: u64, source: usize| {
                h = h.wrapping_mul(1_000_003) ^ v ^ ((source as u64) << 40);
                order.push(source);
            };
            if posted {
                let requests = (1..p)
                    .map(|_| world.immediate_receive(Source::Any, 7))
                    .collect::<Result<Vec<_>>>()?;
                for m in lazarus::api::comm::wait_all(requests)? {
                    let v: u64 = postcard::from_bytes(&m.payload)?;
                    fold(v, m.status.source);
                }
            } else {
                for _ in 1..p {
                    let (v, status) = world.receive_value::<u64>(Source::Any, 7)?;
                    fold(v, status.source);
                }
            }
            for d in 1..p {
                world.send_value(d, 8, &h)?;
            }
            st.chain.push(h);
            st.arrivals.push(order);
        } else {
            // Senders take turns being slow, so arrival orders differ.
            let slow = (me as u64 * 7 + st.it * 3) % p as u64;
            ctx.compute(slow as f64 * 20e-6)?;
            world.send_value(0, 7, &prev.wrapping_add(me as u64 * 1000 + st.it))?;
            let (h, _) = world.receive_value::<u64>(0, 8)?;
            st.chain.push(h);
        }
        st.it += 1;
        ctx.set_progress(st.it as f64 / ITERATIONS as f64);
        ctx.checkpoint(&st)?;
    }
    Ok((st.chain, st.arrivals))
}

/// Run `app` on 4 ranks under `protocol` on `backend`, checkpointing every
/// third safe point, with `kill`: the case's name, every rank's value and
/// the job's statistics.
fn run_with_kill<T>(
    name: &str,
    app: fn(&mut Ctx) -> Result<T>,
    protocol: ProtocolKind,
    backend: Backend,
    kill: &str,
) -> (String, Vec<T>, JobStats)
where
    T: Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    let cfg = common::config(backend, 4)
        .checkpoint_every(3)
        .kill(kill.parse().expect("valid kill"));
    let what = format!("{name} app under {protocol} on {backend}, kill {kill}");
    run_on_4(what, cfg, app, protocol)
}

/// Run `app` on 4 ranks under `protocol` on `backend` without a failure
/// nor a periodic checkpoint: what it is (for messages), each rank's value
/// and the statistics.
fn run_failure_free<T>(
    name: &str,
    app: fn(&mut Ctx) -> Result<T>,
    protocol: ProtocolKind,
    backend: Backend,
) -> (String, Vec<T>, JobStats)
where
    T: Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    let cfg = common::config(backend, 4).checkpoint_every(0);
    run_on_4(
        format!("{name} under {protocol} on {backend}"),
        cfg,
        app,
        protocol,
    )
}

/// Run `app` with `cfg` under `protocol` (on its nodes): `what`, each
/// rank's value and the statistics; a failed job fails the test.
fn run_on_4<T>(
    what: String,
    cfg: Config,
    app: fn(&mut Ctx) -> Result<T>,
    protocol: ProtocolKind,
) -> (String, Vec<T>, JobStats)
where
    T: Serialize + serde::de::DeserializeOwned + Send + 'static,
{
    let cfg = cfg.protocol(protocol).nodes(nodes_for(protocol));
    let report = lazarus::run(&cfg, app);
    let ranks = report
        .outcome
        .unwrap_or_else(|e| panic!("{what}: failed: {e}"));
    (what, ranks, report.stats)
}

/// The protocols that log messages.
const LOGGING: [ProtocolKind; 3] = [
    ProtocolKind::Pessimistic,
    ProtocolKind::Ulml,
    ProtocolKind::Correlated,
];

/// Failure domains for `protocol` in these tests: `correlated` gets two
/// sets of two ranks, so that it has internal and inter-set messages.
fn nodes_for(protocol: ProtocolKind) -> usize {
    if protocol == ProtocolKind::Correlated {
        2
    } else {
        1
    }
}

/// Ranks that roll back when one rank of a 4-rank job on
/// [`nodes_for`]`(protocol)` nodes dies: the dead rank, or its set of two.
fn rolled_back_per_death(protocol: ProtocolKind) -> u64 {
    if protocol == ProtocolKind::Correlated {
        2
    } else {
        1
    }
}

fn check_wildcard(protocol: ProtocolKind, backend: Backend, kill: &str) {
    check_wildcard_app(wildcard_app, protocol, backend, kill);
}

fn check_wildcard_app(
    app: fn(&mut Ctx) -> Result<ChainAndOrders>,
    protocol: ProtocolKind,
    backend: Backend,
    kill: &str,
) {
    // Under `correlated`, rank 0 receives from rank 1 inside its set and
    // from ranks 2 and 3 outside it: the internal receptions' order must
    // be logged too (004 Theorem 1), or rank 0 would re-send other values
    // to the other set after its set rolled back.
    let (what, ranks, st) = run_with_kill("wildcard", app, protocol, backend, kill);
    let (chain0, arrivals) = &ranks[0];
    assert_eq!(chain0.len() as u64, ITERATIONS, "{what}");
    for (r, (chain, _)) in ranks.iter().enumerate() {
        assert_eq!(
            chain, chain0,
            "{what}: rank {r} received another chain than rank 0 computed: the replay \
             did not reproduce the original reception order"
        );
    }
    assert_eq!(st.failures, 1, "{what}");
    assert_eq!(
        st.ranks_rolled_back,
        rolled_back_per_death(protocol),
        "{what}: only the dead rank (its correlated set) rolls back"
    );
    assert_eq!(
        st.determinants,
        ITERATIONS * 3,
        "{what}: one determinant per wildcard reception, no more (replayed ones are not logged again)"
    );
    let mut orders = arrivals.clone();
    orders.sort();
    orders.dedup();
    // The chain tells orders apart only if they differ: a replay that
    // ignored the determinants would reproduce a fixed order by itself.
    assert!(
        orders.len() > 1,
        "{what}: every iteration saw the same arrival order {orders:?}"
    );
    println!(
        "{what}: {} distinct arrival orders in {ITERATIONS} iterations, {} messages resent",
        orders.len(),
        st.messages_resent
    );
}

#[test]
fn posted_wildcard_receives_replay_in_the_logged_order() {
    for protocol in LOGGING {
        for backend in Backend::RECOVERING {
            common::within(
                120,
                &format!("posted wildcards, {protocol} on {backend}"),
                move || {
                    check_wildcard_app(posted_wildcard_app, protocol, backend, "0@55%");
                },
            );
        }
    }
}

#[test]
fn wildcard_receptions_replay_in_the_logged_order() {
    for protocol in LOGGING {
        for backend in Backend::RECOVERING {
            // The wildcard receiver dies; then a sender.
            check_wildcard(protocol, backend, "0@55%");
            check_wildcard(protocol, backend, "2@55%");
        }
    }
}

/// State of the one-sided application.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Tickets {
    it: u64,
    /// Values fetch-and-op returned from rank 0's counter.
    tickets: Vec<u64>,
}

/// Every rank draws a ticket from rank 0's counter with fetch-and-op (the
/// order across ranks is a race), then adds `rank + 1` to rank 1's counter
/// with a get and a put under an exclusive lock. Applied exactly once, the
/// tickets are a permutation of 0..P×ITERATIONS and rank 1's counter is
/// exact; an access applied twice, lost, or answered differently on replay
/// breaks one or the other.
fn tickets_app(ctx: &mut Ctx) -> Result<(Vec<u64>, u64)> {
    let world = ctx.world();
    let me = world.rank();
    let mut st: Tickets = ctx.restore_or_else(Tickets::default)?;
    let win = world.allocate_window::<u64>(1)?;
    while st.it < ITERATIONS {
        win.lock_all()?;
        st.tickets.push(win.fetch_and_op(0, 0, 1, ReduceOp::Sum)?);
        win.unlock_all()?;
        win.lock(1, LockType::Exclusive)?;
        let v = win.get(1, 0, 1)?[0];
        win.put(1, 0, &[v + me as u64 + 1])?;
        win.unlock(1)?;
        st.it += 1;
        ctx.set_progress(st.it as f64 / ITERATIONS as f64);
        ctx.checkpoint(&st)?;
    }
    world.barrier()?;
    let counter = win.with_local(|c| c[0])?;
    world.barrier()?;
    Ok((st.tickets, counter))
}

#[test]
fn one_sided_accesses_apply_exactly_once_across_a_failure() {
    for protocol in LOGGING {
        for backend in Backend::RECOVERING {
            // The target of every fetch-and-op dies; then an origin.
            for kill in ["0@55%", "2@55%"] {
                let (what, ranks, st) =
                    run_with_kill("one-sided", tickets_app, protocol, backend, kill);
                let mut all: Vec<u64> = ranks.iter().flat_map(|(t, _)| t.clone()).collect();
                all.sort_unstable();
                let want: Vec<u64> = (0..4 * ITERATIONS).collect();
                assert_eq!(all, want, "{what}: tickets drawn twice or lost");
                assert_eq!(ranks[0].1, 4 * ITERATIONS, "{what}: rank 0's counter");
                assert_eq!(
                    ranks[1].1,
                    (1..=4).sum::<u64>() * ITERATIONS,
                    "{what}: rank 1's counter (get + put under an exclusive lock)"
                );
                assert_eq!(st.failures, 1, "{what}");
                assert_eq!(
                    st.ranks_rolled_back,
                    rolled_back_per_death(protocol),
                    "{what}: only the dead rank (its correlated set) rolls back"
                );
            }
        }
    }
}

/// Every rank but 1 takes an exclusive lock on rank 1's window and holds
/// it through a stretch of computation, so that the others wait for it:
/// rank 1's counter is the number of increments whatever the order.
fn contended_lock_app(ctx: &mut Ctx) -> Result<u64> {
    let world = ctx.world();
    let me = world.rank();
    let mut it: u64 = ctx.restore_or_else(|| 0)?;
    let win = world.allocate_window::<u64>(1)?;
    while it < ITERATIONS {
        if me != 1 {
            win.lock(1, LockType::Exclusive)?;
            let v = win.get(1, 0, 1)?[0];
            // Held long enough for the others to queue behind it.
            let mut h = v;
            for i in 0..200_000u64 {
                h = std::hint::black_box(h.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
            }
            std::hint::black_box(h);
            win.put(1, 0, &[v + 1])?;
            win.unlock(1)?;
        }
        it += 1;
        ctx.set_progress(it as f64 / ITERATIONS as f64);
        ctx.checkpoint(&it)?;
    }
    world.barrier()?;
    let counter = win.with_local(|c| c[0])?;
    world.barrier()?;
    Ok(counter)
}

/// Defect 9 of issue 33: a contended lock was retried every 50 µs, and
/// each retry logged a request, a reply and a determinant, so the log grew
/// with the time spent waiting. Now a lock request waits in the target's
/// queue and is answered once: every access to rank 1's window is one
/// determinant (lock, get, put, unlock per origin and iteration), however
/// long the origins wait, and the counter survives a kill of the target
/// with origins queued and a kill of an origin.
#[test]
fn a_contended_lock_is_queued_at_the_target_and_logged_once() {
    for protocol in LOGGING {
        for backend in Backend::RECOVERING {
            let (what, counters, stats) =
                run_failure_free("contended lock", contended_lock_app, protocol, backend);
            assert_eq!(counters[1], 3 * ITERATIONS, "{what}: rank 1's counter");
            assert_eq!(
                stats.determinants,
                4 * 3 * ITERATIONS,
                "{what}: one determinant per access, none per wait"
            );
            for kill in ["1@40%", "2@60%"] {
                let (what, counters, _) = run_with_kill(
                    "contended lock",
                    contended_lock_app,
                    protocol,
                    backend,
                    kill,
                );
                assert_eq!(counters[1], 3 * ITERATIONS, "{what}: rank 1's counter");
            }
        }
    }
}

/// How long rank 1 of [`computing_target_app`] computes.
const COMPUTE_S: f64 = 0.2;

/// Origins' accesses to rank 1's window while rank 1 computes for
/// [`COMPUTE_S`] through the runtime: rank 1's counter, and the longest
/// time an origin took for its accesses.
fn computing_target_app(ctx: &mut Ctx) -> Result<(u64, f64)> {
    let world = ctx.world();
    let win = world.allocate_window::<u64>(1)?;
    world.barrier()?;
    let t0 = ctx.wtime();
    if world.rank() == 1 {
        ctx.compute(COMPUTE_S)?;
    } else {
        for _ in 0..8 {
            win.lock(1, LockType::Exclusive)?;
            let v = win.get(1, 0, 1)?[0];
            win.put(1, 0, &[v + 1])?;
            win.unlock(1)?;
        }
    }
    let took = ctx.wtime() - t0;
    let longest = world.all_reduce(if world.rank() == 1 { 0.0 } else { took }, ReduceOp::Max)?;
    let counter = win.with_local(|c| c[0])?;
    world.barrier()?;
    Ok((counter, longest))
}

/// Defect 9b of issue 33: under message logging a one-sided request is a
/// message its target applies, and a target computing in `Ctx::compute`
/// applied none until it was done, stalling every origin. It now serves
/// them meanwhile. Time is virtual on the simulator, so there the origins'
/// wait is exact: their 8 accesses end within a tenth of the target's
/// computation (before, after all of it); elsewhere they must all apply.
/// (One rank function for every backend: a rank process finds its call by
/// counting calls, and the closures must not differ between them.)
#[test]
fn a_target_computing_through_the_runtime_serves_one_sided_requests() {
    for protocol in LOGGING {
        for backend in Backend::RECOVERING {
            let (what, results, _) =
                run_failure_free("computing target", computing_target_app, protocol, backend);
            let (counter, longest) = results[1];
            assert_eq!(counter, 3 * 8, "{what}: rank 1's counter");
            if backend == Backend::Sim {
                assert!(
                    longest < COMPUTE_S / 10.0,
                    "{what}: the origins waited {longest} s"
                );
            }
        }
    }
}

#[test]
fn a_log_budget_forces_checkpoints_that_trim_the_logs() {
    let params = AppParams {
        class: Some('S'),
        ..AppParams::default()
    };
    for (protocol, backend) in LOGGING
        .into_iter()
        .flat_map(|p| Backend::RECOVERING.map(|b| (p, b)))
    {
        let base = common::config(backend, 4)
            .protocol(protocol)
            .nodes(nodes_for(protocol));
        let backend = format!("{protocol} on {backend}");
        // Without periodic checkpoints the logs only grow.
        let free = run_app(AppKind::Cg, &params, &base.clone().checkpoint_every(0));
        let unbounded = free.stats.peak_log_bytes;
        // The reference logs, and takes no checkpoint of its own: any in
        // the budgeted run below are forced by the budget.
        assert!(unbounded > 0, "{backend}: nothing logged");
        assert_eq!(
            free.stats.checkpoints, 0,
            "{backend}: checkpoints without a budget"
        );
        // A forced checkpoint is taken at the receiver's next safe point and
        // trims the log once stored, so a log holds at least two safe-point
        // intervals (one in CG S is about 1/15 of the unbounded log of its
        // 15 iterations): a budget of 1/8 (1.9 intervals) cannot be kept,
        // 1/4 can. That holds for every protocol since each rank's
        // all-gather block goes to every other rank (with a gather to rank 0
        // and a broadcast, `pessimistic` kept 1/8: rank 0's log, the
        // largest, grew by the broadcasts). ULML's collective results are
        // dropped once every member's checkpoint passed them; under
        // `correlated` the log holds inter-set messages only, and a forced
        // checkpoint of the receiver's set waits for the set's agreement on
        // a safe point.
        // ULML's collective results past the budget spill like payloads.
        let budget = (unbounded / 4) as usize;
        let cfg = base
            .checkpoint_every(0)
            .kill("1@60%".parse().expect("valid kill"))
            .log_budget(Some(budget));
        let r = run_app(AppKind::Cg, &params, &cfg);
        let v = r
            .outcome
            .unwrap_or_else(|e| panic!("{backend}: budgeted run failed: {e}"));
        let reference = free.outcome.expect("unbudgeted run");
        assert!(v.verified, "{backend}: {}", v.detail);
        assert_eq!(v.value, reference.value, "{backend}: value differs");
        assert!(r.stats.checkpoints > 0, "{backend}: no forced checkpoint");
        assert!(
            r.stats.peak_log_bytes <= budget as u64,
            "{backend}: peak log {} bytes over the budget of {budget} (unbounded: {unbounded})",
            r.stats.peak_log_bytes
        );
        println!(
            "{backend}: peak log {} bytes with a budget of {budget} (unbounded {unbounded}), \
             {} forced checkpoints",
            r.stats.peak_log_bytes, r.stats.checkpoints
        );
    }
}

/// Rounds of [`stream_app`], and its messages per round and their size.
const STREAM: (u64, u64, usize) = (10, 64, 16 << 10);

/// Rank 1 streams new buffers to rank 0 (1 MiB a round, a safe point per
/// round; each acknowledged); rank 0 folds their bytes into a hash, which every rank returns,
/// and reports progress mid-round too.
/// Nothing between two safe points bounds rank 1's log but the budget.
fn stream_app(ctx: &mut Ctx) -> Result<u64> {
    let world = ctx.world();
    let (rounds, per_round, size) = STREAM;
    let mut st: (u64, u64) = ctx.restore_or_else(|| (0, 0xcbf2_9ce4_8422_2325))?;
    while st.0 < rounds {
        for i in 0..per_round {
            let v = st.0 * per_round + i;
            match world.rank() {
                1 => {
                    let payload: Vec<u8> = (0..size as u64).map(|j| (v * 31 + j) as u8).collect();
                    world.send_bytes(0, 3, payload.into())?;
                    // In step with rank 0: what rank 0's checkpoint holds
                    // is what it consumed, not a backlog that arrived.
                    world.receive_bytes(0, 4)?;
                }
                0 => {
                    for &b in world.receive_bytes(1, 3)?.payload.iter() {
                        st.1 = (st.1 ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
                    }
                    world.send_bytes(1, 4, bytes::Bytes::new())?;
                    if i == per_round / 2 {
                        // Kills at P% land mid-round, where the log has
                        // messages rank 0's checkpoint does not cover.
                        ctx.set_progress((st.0 as f64 + 0.5) / rounds as f64);
                    }
                }
                _ => {}
            }
        }
        st.0 += 1;
        ctx.set_progress(st.0 as f64 / rounds as f64);
        ctx.checkpoint(&st)?;
    }
    world.broadcast_value(0, Some(&st.1))
}

/// Issue 33, build 2: a log budget is a bound on memory whatever the program
/// does between safe points. Rank 1's log for rank 0 outgrows a small
/// budget within a round: it spills, its memory stays under the budget, and
/// rank 0, killed mid-stream, is resent payloads read back from the spill
/// and ends with the failure-free hash on every rank.
#[test]
fn a_log_past_its_budget_spills_and_resends_from_the_spill() {
    let budget = 256 << 10;
    for backend in Backend::RECOVERING {
        let base = common::config(backend, 2)
            .protocol(ProtocolKind::Pessimistic)
            .checkpoint_every(1);
        let what = format!("stream under pessimistic on {backend}");
        let free = lazarus::run(&base, stream_app);
        let reference = free.outcome.expect("failure-free run");
        let cfg = base
            .kill("0@55%".parse().expect("valid kill"))
            .log_budget(Some(budget));
        let r = lazarus::run(&cfg, stream_app);
        let got = r
            .outcome
            .unwrap_or_else(|e| panic!("{what}: budgeted run failed: {e}"));
        assert_eq!(got, reference, "{what}: the hash differs");
        assert_eq!(r.stats.ranks_killed, 1, "{what}: the kill did not fire");
        assert!(
            r.stats.peak_log_bytes <= budget as u64,
            "{what}: peak log {} bytes in memory over the budget of {budget}",
            r.stats.peak_log_bytes
        );
        assert!(
            r.stats.spilled_log_bytes > 0,
            "{what}: nothing spilled (unbounded peak {})",
            free.stats.peak_log_bytes
        );
        assert!(r.stats.messages_resent > 0, "{what}: nothing resent");
        println!(
            "{what}: peak log {} bytes (unbounded {}), {} spilled, {} resent",
            r.stats.peak_log_bytes,
            free.stats.peak_log_bytes,
            r.stats.spilled_log_bytes,
            r.stats.messages_resent
        );
    }
}

/// State of the sub-communicator application.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Halves {
    it: u64,
    sum: u64,
}

/// Ranks split by `colour`; each part all-reduces a 4 KiB vector every
/// iteration, and nothing is collective on the world. Under `ulml` each
/// result is logged at the part's members only. An iteration takes at least
/// a millisecond, as a solver's would: a forced checkpoint trims the logs
/// some messages after it is asked for, and without a pause a loaded
/// machine let dozens of iterations pass meanwhile (the budget test failed
/// once so).
fn parts_app(ctx: &mut Ctx, colour: fn(Rank) -> Option<u32>) -> Result<u64> {
    let world = ctx.world();
    let me = world.rank();
    let part = world.split(colour(me), me as i64)?;
    let mut st: Halves = ctx.restore_or_else(Halves::default)?;
    while st.it < 4 * ITERATIONS {
        if let Some(part) = &part {
            let mine: Vec<u64> = (0..512u64).map(|i| i * (me as u64 + 1) + st.it).collect();
            let mut all = vec![0u64; mine.len()];
            part.all_reduce_into(&mine, &mut all, ReduceOp::Sum)?;
            st.sum = st
                .sum
                .wrapping_mul(31)
                .wrapping_add(all.iter().sum::<u64>());
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        st.it += 1;
        ctx.set_progress(st.it as f64 / (4 * ITERATIONS) as f64);
        ctx.checkpoint(&st)?;
    }
    Ok(st.sum)
}

/// Two halves by parity: the parts share their contexts.
fn halves_app(ctx: &mut Ctx) -> Result<u64> {
    parts_app(ctx, |r| Some(r as u32 % 2))
}

/// Ranks 0 to 2 together; rank 3 in no part.
fn trio_app(ctx: &mut Ctx) -> Result<u64> {
    parts_app(ctx, |r| (r < 3).then_some(0))
}

/// A rank function returning a checksum.
type SumApp = fn(&mut Ctx) -> Result<u64>;

/// The sub-communicator apps, with the rank each test kills.
const PARTS_APPS: [(&str, SumApp, &str); 2] =
    [("halves", halves_app, "1@60%"), ("trio", trio_app, "3@60%")];

/// A log budget holds on sub-communicators too: each rank's results are
/// dropped once its own communicator's members' checkpoints passed them
/// (rank 3 never reports the trio's context, which held its results back
/// for ever).
#[test]
fn a_log_budget_holds_on_sub_communicators() {
    for (name, app, _) in PARTS_APPS {
        for backend in Backend::RECOVERING {
            let base = common::config(backend, 4)
                .protocol(ProtocolKind::Ulml)
                .checkpoint_every(0);
            let what = format!("{name} under ulml on {backend}");
            let free = lazarus::run(&base, app);
            let unbounded = free.stats.peak_log_bytes;
            let reference = free
                .outcome
                .unwrap_or_else(|e| panic!("{what}: failed: {e}"));
            assert_eq!(free.stats.checkpoints, 0, "{what}");
            // Forced checkpoints trim the logs some iterations after they
            // are asked for: half the unbounded log leaves 48 iterations of
            // slack.
            let budget = (unbounded / 2) as usize;
            let cfg = base.log_budget(Some(budget));
            let r = lazarus::run(&cfg, app);
            let got = r
                .outcome
                .unwrap_or_else(|e| panic!("{what}, budget: failed: {e}"));
            assert_eq!(got, reference, "{what}: another result with a budget");
            assert!(r.stats.checkpoints > 0, "{what}: no forced checkpoint");
            assert!(
                r.stats.peak_log_bytes <= budget as u64,
                "{what}: peak log {} bytes over the budget of {budget} (unbounded: {unbounded})",
                r.stats.peak_log_bytes
            );
        }
    }
}

/// A rank restored alone re-creates the communicators of its checkpoint
/// without their collectives, which the others made long before and do not
/// repeat (it waited for them for ever); also a split it joined no part of.
/// Its part's collectives after the checkpoint come from the logs.
#[test]
fn sub_communicators_are_recreated_by_a_rank_restored_alone() {
    for (name, app, kill) in PARTS_APPS {
        for protocol in LOGGING {
            for backend in Backend::RECOVERING {
                let what = format!("{name} under {protocol} on {backend}");
                let base = common::config(backend, 4)
                    .protocol(protocol)
                    .nodes(nodes_for(protocol))
                    .checkpoint_every(5);
                let reference = lazarus::run(&base, app)
                    .outcome
                    .unwrap_or_else(|e| panic!("{what}: failed: {e}"));
                let what = format!("{what}, kill {kill}");
                common::within(common::HANG_S, &what.clone(), move || {
                    let r = lazarus::run(&base.kill(kill.parse().expect("valid kill")), app);
                    let got = r.outcome.unwrap_or_else(|e| panic!("{what}: failed: {e}"));
                    assert_eq!(got, reference, "{what}: another result");
                    assert_eq!(r.stats.failures, 1, "{what}");
                    assert_eq!(
                        r.stats.ranks_rolled_back,
                        rolled_back_per_death(protocol),
                        "{what}"
                    );
                    assert_eq!(r.stats.ranks_restarted_from_scratch, 0, "{what}");
                    assert_eq!(r.stats.job_restarts, 0, "{what}: the job started again");
                });
            }
        }
    }
}

#[test]
fn storage_levels_other_than_partner_are_refused() {
    for protocol in LOGGING {
        let cfg = Config::new(4)
            .protocol(protocol)
            .storage(vec!["xor".parse().expect("level")]);
        let e = cfg.validate().expect_err("xor under message logging");
        assert!(e.to_string().contains("uncoordinated"), "{e}");
    }
}

/// 002 Table 1: library-level logging (`pessimistic`) records every
/// point-to-point piece of a collective; our all-reduce is a binomial
/// reduction and a binomial broadcast, 2(P − 1) messages, each logged once
/// by its sender. User-level logging (`ulml`) records the result once per
/// rank: P records.
#[test]
fn log_records_per_allreduce_follow_002_table_1() {
    const ROUNDS: u64 = 10;
    for (protocol, backend) in [ProtocolKind::Pessimistic, ProtocolKind::Ulml]
        .into_iter()
        .flat_map(|p| Backend::RECOVERING.map(|b| (p, b)))
    {
        for p in [2usize, 3, 4, 7] {
            let cfg = common::config(backend, p)
                .protocol(protocol)
                .checkpoint_every(0);
            let r = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let mut x = world.rank() as u64;
                for _ in 0..ROUNDS {
                    x = world.all_reduce(x, lazarus::ReduceOp::Sum)? % 1_000_003;
                }
                Ok(x)
            });
            let values = r.outcome.expect("allreduce loop");
            assert!(values.windows(2).all(|w| w[0] == w[1]), "{backend} P={p}");
            let per = r.stats.log_records as f64 / ROUNDS as f64;
            let (expected, formula) = match protocol {
                ProtocolKind::Ulml => (p as u64, "P"),
                _ => (2 * (p as u64 - 1), "2(P-1)"),
            };
            println!(
                "{protocol} on {backend} P={p}: {per} log records per allreduce ({formula} = {expected})"
            );
            assert_eq!(
                r.stats.log_records,
                ROUNDS * expected,
                "{protocol} on {backend} P={p}"
            );
        }
    }
}

/// CG class S under `protocol` on `backend` over `nodes` nodes with
/// `kills`: checks that it prints the failure-free value and that every
/// kill fired, and returns its statistics.
fn cg_s_survives(
    protocol: ProtocolKind,
    backend: Backend,
    nodes: usize,
    kills: &[&str],
) -> lazarus::JobStats {
    let params = AppParams {
        class: Some('S'),
        ..AppParams::default()
    };
    let base = common::config(backend, 4)
        .protocol(protocol)
        .nodes(nodes)
        .checkpoint_every(2);
    let want = run_app(AppKind::Cg, &params, &base)
        .outcome
        .expect("reference");
    let cfg = kills
        .iter()
        .fold(base, |c, k| c.kill(k.parse().expect("valid kill")));
    let r = run_app(AppKind::Cg, &params, &cfg);
    let what = format!("{protocol} on {backend} {kills:?}");
    let v = r.outcome.unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(v.value, want.value, "{what}");
    assert!(
        r.stats.unfired_kills.is_empty(),
        "{what}: a kill never fired"
    );
    r.stats
}

/// A kill inside an uncoordinated checkpoint (before its piece is
/// captured), on every backend.
#[test]
fn kills_inside_a_checkpoint_are_survived() {
    for protocol in LOGGING {
        for backend in Backend::RECOVERING {
            for kill in ["1@checkpoint:3", "2@checkpoint:1"] {
                let st = cg_s_survives(protocol, backend, nodes_for(protocol), &[kill]);
                assert_eq!(
                    st.ranks_rolled_back,
                    rolled_back_per_death(protocol),
                    "{protocol} on {backend} {kill}"
                );
            }
        }
    }
}

/// Losing a rank together with both holders of its checkpoint (here: the
/// holders' node, then the rank during its recovery) cannot be rebuilt by
/// message logging; the job starts again from the beginning instead of
/// failing, and says so.
#[test]
fn an_unrebuildable_loss_restarts_the_job_from_the_beginning() {
    for protocol in LOGGING {
        for backend in Backend::RECOVERING {
            let st = cg_s_survives(protocol, backend, 2, &["node:1@37%", "1@recovery:1"]);
            assert_eq!(st.job_restarts, 1, "{protocol} on {backend}");
            assert_eq!(
                st.failures, 2,
                "{protocol} on {backend}: the kills fire once"
            );
        }
    }
}

/// Which message a wildcard-source probe saw is not logged: under message
/// logging it is refused with an error that says so, instead of a
/// re-execution that could take another path; a named source is fine.
#[test]
fn wildcard_probes_are_refused_under_message_logging() {
    for protocol in LOGGING {
        let cfg = common::config(Backend::Threads, 2)
            .protocol(protocol)
            .nodes(2);
        let report = lazarus::run(&cfg, |ctx: &mut Ctx| -> Result<bool> {
            let world = ctx.world();
            if world.rank() == 1 {
                world.send_value(0, 3, &7u64)?;
                return Ok(true);
            }
            world.probe(1, 3)?;
            world.receive_value::<u64>(1, 3)?;
            world.iprobe(Source::Any, 3).map(|_| true)
        });
        let e = report.outcome.expect_err("refused");
        assert!(
            e.to_string().contains("wildcard-source probe"),
            "{protocol}: {e}"
        );
    }
}
