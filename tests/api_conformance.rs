//! The shared API conformance suite: run on every backend.
//!
//! Every test loops over [`lazarus::Backend::ALL`], so a backend added there
//! is checked by the whole suite automatically (the way turmoil-style suites
//! run one set of tests on every transport). Each test runs a rank function
//! on several ranks and compares the values the ranks return (collected in
//! `JobReport::outcome`) with values computed independently here.
//!
//! Covered: MPI point-to-point matching rules (FIFO per source and tag,
//! out-of-order by tag, wildcards, probes, posted nonblocking receives,
//! cancellation by drop, typed errors), collectives and communicator
//! creation (`duplicate`, `split`), one-sided RMA windows (fence and lock
//! epochs, atomics, epoch counters, errors) and job-level error handling.

use std::collections::BTreeSet;

mod common;
use common::within;

use lazarus::api::collective::DIRECT_ALL_GATHER_MAX;
use lazarus::{
    Backend, Communicator, Error, JobReport, LockType, ReduceOp, Source, TagMatch, Window,
};
use serde::{Deserialize, Serialize};

// ----- helpers ---------------------------------------------------------------

/// The per-rank values of a job that must succeed.
fn values<T>(backend: Backend, what: &str, report: JobReport<T>) -> Vec<T> {
    match report.outcome {
        Ok(v) => v,
        Err(e) => panic!("[{backend}] {what}: the job failed: {e}"),
    }
}

/// This rank in `c`, as u64.
fn r64(c: &Communicator) -> u64 {
    c.rank() as u64
}

// ----- point-to-point: matching order ----------------------------------------

/// Several messages with the same (source, tag) arrive in send order, both
/// with a named source and with `Source::Any` (per-source order kept).
#[test]
fn p2p_same_source_and_tag_arrive_in_send_order() {
    const K: u64 = 25;
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let me = r64(&world);
            let n = world.size();
            // Two rounds: named-source receives, then wildcard receives.
            for round in 0..2u64 {
                if world.rank() != 0 {
                    for i in 0..K {
                        world.send(0, 7, &[me, round, i])?;
                    }
                }
            }
            let mut named = Vec::new();
            let mut wild = Vec::new();
            if world.rank() == 0 {
                for src in 1..n {
                    for _ in 0..K {
                        let (v, st) = world.receive::<u64>(src, 7)?;
                        named.push((st.source as u64, v));
                    }
                }
                for _ in 0..K * (n as u64 - 1) {
                    let (v, st) = world.receive::<u64>(Source::Any, 7)?;
                    wild.push((st.source as u64, v));
                }
            }
            Ok((named, wild))
        });
        let out = values(backend, "fifo", report);
        let (named, wild) = &out[0];
        let mut expect_named = Vec::new();
        for src in 1..n as u64 {
            for i in 0..K {
                expect_named.push((src, vec![src, 0, i]));
            }
        }
        assert_eq!(named, &expect_named, "[{backend}] named-source order");
        assert_eq!(
            wild.len(),
            K as usize * (n - 1),
            "[{backend}] wildcard count"
        );
        for src in 1..n as u64 {
            let seq: Vec<Vec<u64>> = wild
                .iter()
                .filter(|(s, _)| *s == src)
                .map(|(_, v)| v.clone())
                .collect();
            let expect: Vec<Vec<u64>> = (0..K).map(|i| vec![src, 1, i]).collect();
            assert_eq!(seq, expect, "[{backend}] wildcard order from rank {src}");
        }
        assert!(out[1..].iter().all(|(a, b)| a.is_empty() && b.is_empty()));
    }
}

/// With different tags, a receiver may take tag B before the earlier tag A.
#[test]
fn p2p_receive_out_of_order_by_tag() {
    for backend in Backend::ALL {
        let n = 4;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let me = world.rank() as i64;
            let next = (world.rank() + 1) % n;
            let prev = (world.rank() + n - 1) % n;
            // Tag A (10) is sent first, then tag B (20), then A again.
            world.send(next, 10, &[me * 100 + 1])?;
            world.send(next, 20, &[me * 100 + 2])?;
            world.send(next, 10, &[me * 100 + 3])?;
            let (b, sb) = world.receive::<i64>(prev, 20)?;
            let (a1, sa1) = world.receive::<i64>(prev, 10)?;
            let (a2, sa2) = world.receive::<i64>(prev, 10)?;
            Ok(vec![
                (b[0], sb.tag, sb.source),
                (a1[0], sa1.tag, sa1.source),
                (a2[0], sa2.tag, sa2.source),
            ])
        });
        let out = values(backend, "out of order by tag", report);
        for (r, got) in out.iter().enumerate() {
            let prev = (r + n - 1) % n;
            let p = prev as i64 * 100;
            assert_eq!(
                got,
                &vec![(p + 2, 20, prev), (p + 1, 10, prev), (p + 3, 10, prev)],
                "[{backend}] rank {r}"
            );
        }
    }
}

/// `Source::Any` / `TagMatch::Any` receives report the real source, tag and
/// size of the message they matched.
#[test]
fn p2p_wildcards_report_real_source_and_tag() {
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let r = world.rank();
            let mut got = Vec::new();
            if r == 0 {
                for _ in 1..n {
                    let (v, st) = world.receive::<u32>(Source::Any, TagMatch::Any)?;
                    got.push((st.source, st.tag, st.bytes, st.count::<u32>(), v));
                }
            } else {
                world.send(0, 100 + r as i32, &vec![r as u32; r + 1])?;
            }
            Ok(got)
        });
        let out = values(backend, "wildcards", report);
        let mut got = out[0].clone();
        got.sort();
        let expect: Vec<_> = (1..n)
            .map(|s| (s, 100 + s as i32, (s + 1) * 4, s + 1, vec![s as u32; s + 1]))
            .collect();
        assert_eq!(got, expect, "[{backend}]");
    }
}

/// `probe` and `iprobe` report size, source and tag without consuming.
#[test]
fn p2p_probe_and_iprobe_do_not_consume() {
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Seen {
        before: bool,
        probe: (usize, i32, usize),
        iprobe_exact: Option<(usize, i32, usize)>,
        iprobe_other_tag: bool,
        iprobe_other_source: bool,
        data: Vec<u64>,
        after: bool,
    }
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let mut seen = None;
            match world.rank() {
                0 => {
                    // Nothing can have been sent yet: rank 1 sends after the barrier.
                    let before = world.iprobe(Source::Any, TagMatch::Any)?.is_some();
                    world.barrier()?;
                    let st = world.probe(Source::Any, TagMatch::Any)?;
                    let st2 = world.probe(1, 9)?; // still there
                    assert_eq!(st, st2);
                    let ex = world.iprobe(1, 9)?;
                    let other_tag = world.iprobe(1, 10)?.is_some();
                    let other_source = world.iprobe(2, TagMatch::Any)?.is_some();
                    let (data, _) = world.receive::<u64>(1, 9)?;
                    let after = world.iprobe(Source::Any, TagMatch::Any)?.is_some();
                    seen = Some(Seen {
                        before,
                        probe: (st.source, st.tag, st.bytes),
                        iprobe_exact: ex.map(|s| (s.source, s.tag, s.bytes)),
                        iprobe_other_tag: other_tag,
                        iprobe_other_source: other_source,
                        data,
                        after,
                    });
                }
                1 => {
                    world.barrier()?;
                    world.send(0, 9, &[11u64, 22, 33, 44, 55])?;
                }
                _ => world.barrier()?,
            }
            Ok(seen)
        });
        let out = values(backend, "probe", report);
        assert_eq!(
            out[0],
            Some(Seen {
                before: false,
                probe: (1, 9, 40),
                iprobe_exact: Some((1, 9, 40)),
                iprobe_other_tag: false,
                iprobe_other_source: false,
                data: vec![11, 22, 33, 44, 55],
                after: false,
            }),
            "[{backend}]"
        );
    }
}

/// Receives posted before the messages are sent match in posting order.
#[test]
fn p2p_posted_immediate_receives_match_in_posting_order() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let mut got = Vec::new();
            match world.rank() {
                0 => {
                    world.barrier()?;
                    for v in [1u32, 2, 3, 4] {
                        world.send(1, 3, &[v])?;
                    }
                    world.send(1, 4, &[5u32])?;
                }
                1 => {
                    // Posted before any send (rank 0 sends after the barrier).
                    let a = world.immediate_receive(0, 3)?;
                    let b = world.immediate_receive(0, 3)?;
                    let c = world.immediate_receive(Source::Any, TagMatch::Any)?;
                    let d = world.immediate_receive(0, 3)?;
                    let e = world.immediate_receive(Source::Any, 4)?;
                    world.barrier()?;
                    // Wait in reverse order: matching was decided at arrival.
                    for req in [e, d, c, b, a] {
                        let m = req.wait()?;
                        let st = m.status;
                        got.push((m.into_vec::<u32>()?[0], st.source, st.tag));
                    }
                }
                _ => world.barrier()?,
            }
            Ok(got)
        });
        let out = values(backend, "posted receives", report);
        assert_eq!(
            out[1],
            vec![(5, 0, 4), (4, 0, 3), (3, 0, 3), (2, 0, 3), (1, 0, 3)],
            "[{backend}]"
        );
    }
}

/// `wait_all` returns messages in request order.
#[test]
fn p2p_wait_all_returns_in_request_order() {
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let me = world.rank();
            let reqs = (0..n)
                .map(|s| world.immediate_receive(s, 1))
                .collect::<lazarus::Result<Vec<_>>>()?;
            for d in (0..n).rev() {
                let r = world.immediate_send(d, 1, &[(me * 10 + d) as u32])?;
                assert!(r.test());
                r.wait()?;
            }
            let msgs = lazarus::api::comm::wait_all(reqs)?;
            msgs.into_iter()
                .map(|m| Ok((m.status.source, m.into_vec::<u32>()?[0])))
                .collect::<lazarus::Result<Vec<_>>>()
        });
        let out = values(backend, "wait_all", report);
        for (r, got) in out.iter().enumerate() {
            let expect: Vec<_> = (0..n).map(|s| (s, (s * 10 + r) as u32)).collect();
            assert_eq!(got, &expect, "[{backend}] rank {r}");
        }
    }
}

/// `ReceiveRequest::test` returns `None` before the message exists and
/// `Some` once it has arrived.
#[test]
fn p2p_receive_request_test_none_then_some() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let mut out = None;
            match world.rank() {
                2 => {
                    world.barrier()?;
                    world.send(3, 77, &[6.5f64, -1.0])?;
                }
                3 => {
                    let mut req = world.immediate_receive(2, 77)?;
                    let first = req.test()?.map(|m| m.payload.len());
                    world.barrier()?;
                    let mut polls = 0u64;
                    let msg = loop {
                        if let Some(m) = req.test()? {
                            break m;
                        }
                        polls += 1;
                        assert!(polls < 50_000_000, "message never arrived");
                        std::thread::yield_now();
                    };
                    // A completed request can be neither tested nor waited again.
                    let again = matches!(req.test(), Err(Error::InvalidRequest(_)));
                    let st = msg.status;
                    out = Some((first, msg.into_vec::<f64>()?, st.source, st.tag, again));
                }
                _ => world.barrier()?,
            }
            Ok(out)
        });
        let out = values(backend, "test", report);
        assert_eq!(
            out[3],
            Some((None, vec![6.5, -1.0], 2, 77, true)),
            "[{backend}]"
        );
    }
}

/// Dropping an unwaited `ReceiveRequest` (pending, or already matched) does
/// not lose the message: a later receive gets it, in the original order.
#[test]
fn p2p_dropped_receive_request_does_not_lose_message() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let mut got = Vec::new();
            match world.rank() {
                0 => {
                    world.barrier()?;
                    // Case 1: the request is still pending when dropped.
                    world.send(1, 5, &[1u64])?;
                    world.send(1, 5, &[2u64])?;
                    // Case 2: the request matched before it is dropped.
                    world.send(1, 6, &[3u64])?;
                    world.send(1, 6, &[4u64])?;
                    world.send(1, 8, &[0u64])?; // a marker behind them
                }
                1 => {
                    let pending = world.immediate_receive(0, 5)?;
                    drop(pending); // cancelled before anything was sent
                    let matched = world.immediate_receive(0, 6)?;
                    world.barrier()?;
                    // The marker arrives after both tag-6 messages (FIFO per
                    // channel), so the first one has matched `matched` by now.
                    world.receive::<u64>(0, 8)?;
                    drop(matched);
                    for tag in [5, 5, 6, 6] {
                        got.push(world.receive::<u64>(0, tag)?.0[0]);
                    }
                    let left = world.iprobe(Source::Any, TagMatch::Any)?.is_some();
                    got.push(u64::from(left));
                }
                _ => world.barrier()?,
            }
            Ok(got)
        });
        let out = values(backend, "drop", report);
        assert_eq!(out[1], vec![1, 2, 3, 4, 0], "[{backend}]");
    }
}

// ----- point-to-point: payload kinds -----------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Shape {
    Circle { r: f64 },
    Poly(Vec<(i32, i32)>),
    Empty,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Record {
    id: u64,
    name: String,
    weights: Vec<f64>,
    parent: Option<Box<Record>>,
    shape: Shape,
}

fn record_of(r: usize) -> Record {
    Record {
        id: r as u64 * 1_000_003,
        name: format!("rank-{r}-ünïcödé"),
        weights: (0..r + 2).map(|i| i as f64 / 3.0 - r as f64).collect(),
        parent: (r % 2 == 1).then(|| {
            Box::new(Record {
                id: 7,
                name: String::new(),
                weights: vec![f64::MIN_POSITIVE, -0.0],
                parent: None,
                shape: Shape::Empty,
            })
        }),
        shape: if r.is_multiple_of(3) {
            Shape::Circle { r: r as f64 + 0.5 }
        } else {
            Shape::Poly((0..r as i32).map(|i| (i, -i)).collect())
        },
    }
}

/// `send_value`/`receive_value` round-trip a serde struct; `broadcast_value`
/// carries one from a non-zero root.
#[test]
fn p2p_send_value_round_trips_serde_struct() {
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let r = world.rank();
            world.send_value((r + 1) % n, 42, &record_of(r))?;
            let (got, st): (Record, _) = world.receive_value((r + n - 1) % n, 42)?;
            let root_value = (r == 3).then(|| record_of(99));
            let b: Record = world.broadcast_value(3, root_value.as_ref())?;
            Ok((got, st.source, b))
        });
        let out = values(backend, "send_value", report);
        for (r, (got, src, b)) in out.into_iter().enumerate() {
            let prev = (r + n - 1) % n;
            assert_eq!(got, record_of(prev), "[{backend}] rank {r}");
            assert_eq!(src, prev);
            assert_eq!(b, record_of(99));
        }
    }
}

/// `send`, `send_owned`, `send_bytes`, `send_receive` and `receive_bytes`
/// deliver the same bytes.
#[test]
fn p2p_send_variants_deliver_same_data() {
    for backend in Backend::ALL {
        let n = 4;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let r = world.rank();
            let next = (r + 1) % n;
            let prev = (r + n - 1) % n;
            let data: Vec<i32> = (0..6).map(|i| r as i32 * 10 - i).collect();
            world.send(next, 1, &data)?;
            world.send_owned(next, 2, data.clone())?;
            world.send_bytes(next, 3, bytes::Bytes::from(vec![r as u8; r + 1]))?;
            let (a, _) = world.receive::<i32>(prev, 1)?;
            let (b, _) = world.receive::<i32>(prev, 2)?;
            let c = world.receive_bytes(prev, 3)?.payload.to_vec();
            let (d, st) = world.send_receive(&[r as u64], next, 4, prev, 4)?;
            Ok((a, b, c, d, st.source))
        });
        let out = values(backend, "send variants", report);
        for (r, (a, b, c, d, src)) in out.into_iter().enumerate() {
            let p = (r + n - 1) % n;
            let expect: Vec<i32> = (0..6).map(|i| p as i32 * 10 - i).collect();
            assert_eq!(a, expect, "[{backend}] send");
            assert_eq!(b, expect, "[{backend}] send_owned");
            assert_eq!(c, vec![p as u8; p + 1], "[{backend}] send_bytes");
            assert_eq!(d, vec![p as u64], "[{backend}] send_receive");
            assert_eq!(src, p);
        }
    }
}

/// Every rank sends several large messages (together far more than a
/// transport buffer or shared-memory ring holds, sizes that straddle its
/// wrap-around) to every other rank before receiving any: nobody deadlocks
/// and every byte arrives intact, in order.
#[test]
fn p2p_large_messages_both_ways_at_once() {
    const SIZES: [usize; 4] = [3 << 20, 1, (1 << 20) + 13, 5 << 20];
    fn body(from: usize, to: usize, k: usize) -> Vec<u8> {
        (0..SIZES[k])
            .map(|i| {
                (i as u64)
                    .wrapping_mul(31)
                    .wrapping_add((from * 7 + to * 3 + k) as u64) as u8
            })
            .collect()
    }
    for backend in Backend::ALL {
        let n = 3;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let (n, r) = (world.size(), world.rank());
            for k in 0..SIZES.len() {
                for d in (0..n).filter(|&d| d != r) {
                    world.send_bytes(d, k as i32, bytes::Bytes::from(body(r, d, k)))?;
                }
            }
            let mut intact = 0u64;
            for k in 0..SIZES.len() {
                for s in (0..n).filter(|&s| s != r) {
                    let m = world.receive_bytes(s, k as i32)?;
                    intact += u64::from(m.payload[..] == body(s, r, k)[..]);
                }
            }
            Ok(intact)
        });
        let out = values(backend, "large messages both ways", report);
        for (r, intact) in out.into_iter().enumerate() {
            assert_eq!(
                intact,
                (SIZES.len() * (n - 1)) as u64,
                "[{backend}] rank {r}: a large message arrived damaged"
            );
        }
    }
}

/// `receive_into` fills a large-enough buffer and reports the count; a
/// too-small buffer gives `SizeMismatch`.
#[test]
fn p2p_receive_into_checks_buffer_size() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let mut out = None;
            match world.rank() {
                0 => {
                    world.send(1, 1, &[1u32, 2, 3, 4, 5, 6, 7, 8])?;
                    world.send(1, 2, &[9u32, 10, 11])?;
                }
                1 => {
                    let mut small = [0u32; 4];
                    let err = world.receive_into(0, 1, &mut small).err();
                    let mut big = [0u32; 5];
                    let st = world.receive_into(0, 2, &mut big)?;
                    out = Some((err, big, st.count::<u32>(), st.bytes));
                }
                _ => {}
            }
            Ok(out)
        });
        let out = values(backend, "receive_into", report);
        let (err, big, count, bytes) = out[1].clone().expect("rank 1 reports");
        assert!(
            matches!(
                err,
                Some(Error::SizeMismatch {
                    expected: 16,
                    got: 32,
                    ..
                })
            ),
            "[{backend}] too-small buffer gave {err:?}"
        );
        assert_eq!(big, [9, 10, 11, 0, 0], "[{backend}]");
        assert_eq!((count, bytes), (3, 12));
    }
}

/// Sending to (or receiving from) a rank outside the communicator gives
/// `RankOutOfRange`, with the communicator's size; the rank can go on.
#[test]
fn p2p_rank_out_of_range() {
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let send = world.send(n, 0, &[1u8]).err();
            let send_far = world.send_value(usize::MAX, 0, &1u8).err();
            let recv = world.receive::<u8>(n + 3, 0).err();
            let iprobe = world.iprobe(n, 0).err();
            // In a sub-communicator of 2 or 3 ranks, its own size is the limit.
            let sub = world
                .split(Some((world.rank() % 2) as u32), 0)?
                .expect("every rank has a color");
            let sub_err = sub.send(sub.size(), 0, &[1u8]).err();
            // Still usable afterwards.
            let s = world.all_reduce(1u64, ReduceOp::Sum)?;
            Ok((send, send_far, recv, iprobe, sub_err, sub.size(), s))
        });
        let out = values(backend, "rank out of range", report);
        for (r, (send, far, recv, iprobe, sub_err, sub_size, s)) in out.into_iter().enumerate() {
            let oor = |e: &Option<Error>, rank: usize, size: usize| matches!(e, Some(Error::RankOutOfRange { rank: a, size: b }) if *a == rank && *b == size);
            assert!(oor(&send, n, n), "[{backend}] rank {r}: send gave {send:?}");
            assert!(
                oor(&far, usize::MAX, n),
                "[{backend}] send_value gave {far:?}"
            );
            assert!(oor(&recv, n + 3, n), "[{backend}] receive gave {recv:?}");
            assert!(oor(&iprobe, n, n), "[{backend}] iprobe gave {iprobe:?}");
            let expected_sub = if r % 2 == 0 { 3 } else { 2 };
            assert_eq!(sub_size, expected_sub);
            assert!(
                oor(&sub_err, expected_sub, expected_sub),
                "[{backend}] sub send gave {sub_err:?}"
            );
            assert_eq!(s, n as u64);
        }
    }
}

/// A rank can send to itself (including the 1-rank job).
#[test]
fn p2p_send_to_self() {
    for backend in Backend::ALL {
        for n in [1, 4] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let me = world.rank();
                world.send(me, 1, &[me as u64, 1])?;
                world.send(me, 2, &[me as u64, 2])?;
                world.send_value(me, 3, &format!("self {me}"))?;
                let (b, sb) = world.receive::<u64>(me, 2)?;
                let (a, sa) = world.receive::<u64>(Source::Any, TagMatch::Any)?;
                let (s, _): (String, _) = world.receive_value(me, 3)?;
                let req = world.immediate_receive(me, 4)?;
                world.send(me, 4, &[9u64])?;
                let c = req.wait()?.into_vec::<u64>()?;
                Ok((a, sa.source, sa.tag, b, sb.tag, s, c))
            });
            let out = values(backend, "self send", report);
            assert_eq!(out.len(), n);
            for (r, got) in out.into_iter().enumerate() {
                let r64 = r as u64;
                assert_eq!(
                    got,
                    (
                        vec![r64, 1],
                        r,
                        1,
                        vec![r64, 2],
                        2,
                        format!("self {r}"),
                        vec![9]
                    ),
                    "[{backend}] n={n} rank {r}"
                );
            }
        }
    }
}

// ----- collectives -----------------------------------------------------------

/// A window counter on rank 0 is incremented by every rank, then after a
/// barrier every rank must see all increments of the round.
#[test]
fn coll_barrier_separates_rounds() {
    const ROUNDS: u64 = 8;
    for backend in Backend::ALL {
        for n in [1, 5, 7] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let win: Window<u64> = world.allocate_window(1)?;
                let mut seen = Vec::new();
                for _ in 0..ROUNDS {
                    win.lock(0, LockType::Shared)?;
                    win.accumulate(0, 0, &[1], ReduceOp::Sum)?;
                    win.unlock(0)?;
                    world.barrier()?;
                    win.lock(0, LockType::Shared)?;
                    seen.push(win.get(0, 0, 1)?[0]);
                    win.unlock(0)?;
                    world.barrier()?;
                }
                win.free()?;
                Ok(seen)
            });
            let out = values(backend, "barrier", report);
            let expect: Vec<u64> = (1..=ROUNDS).map(|k| k * n as u64).collect();
            for (r, seen) in out.iter().enumerate() {
                assert_eq!(seen, &expect, "[{backend}] n={n} rank {r}");
            }
        }
    }
}

/// `broadcast_into` from a non-zero root fills every rank's buffer.
#[test]
fn coll_broadcast_into_from_nonzero_root() {
    for backend in Backend::ALL {
        for (n, root) in [(1, 0), (5, 3), (7, 6)] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, move |ctx| {
                let world = ctx.world();
                let mut buf = if world.rank() == root {
                    [1.5f64, -2.25, 1e300, f64::MIN_POSITIVE]
                } else {
                    [0.0; 4]
                };
                world.broadcast_into(root, &mut buf)?;
                let mut ints = [world.rank() as i32; 3];
                world.broadcast_into(root, &mut ints)?;
                Ok((buf, ints))
            });
            let out = values(backend, "broadcast", report);
            for (r, (buf, ints)) in out.into_iter().enumerate() {
                assert_eq!(
                    buf,
                    [1.5, -2.25, 1e300, f64::MIN_POSITIVE],
                    "[{backend}] n={n} rank {r}"
                );
                assert_eq!(ints, [root as i32; 3]);
            }
        }
    }
}

fn i64_data(r: usize) -> Vec<i64> {
    let r = r as i64;
    vec![r - 2, r * r, -7 * r + 3, if r % 2 == 0 { -1 } else { 2 }]
}

fn u64_data(r: usize) -> Vec<u64> {
    vec![r as u64 + 1, 1 << r, 100 - r as u64, 3]
}

fn fold<T: Copy>(n: usize, data: impl Fn(usize) -> Vec<T>, f: impl Fn(T, T) -> T) -> Vec<T> {
    let mut acc = data(0);
    for r in 1..n {
        for (a, x) in acc.iter_mut().zip(data(r)) {
            *a = f(*a, x);
        }
    }
    acc
}

/// `reduce` with Sum/Max/Min/Prod on i64 and u64 at a non-zero root gives the
/// independently computed value there and `None` elsewhere.
#[test]
fn coll_reduce_at_nonzero_root() {
    const OPS: [ReduceOp; 4] = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Prod];
    for backend in Backend::ALL {
        for (n, root) in [(5, 3), (7, 5), (1, 0)] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, move |ctx| {
                let world = ctx.world();
                let r = world.rank();
                let mut ints = Vec::new();
                let mut uints = Vec::new();
                for op in OPS {
                    ints.push(world.reduce(root, &i64_data(r), op)?);
                    uints.push(world.reduce(root, &u64_data(r), op)?);
                }
                Ok((ints, uints))
            });
            let out = values(backend, "reduce", report);
            let i_expect: Vec<Vec<i64>> = vec![
                fold(n, i64_data, |a, b| a + b),
                fold(n, i64_data, i64::max),
                fold(n, i64_data, i64::min),
                fold(n, i64_data, |a, b| a * b),
            ];
            let u_expect: Vec<Vec<u64>> = vec![
                fold(n, u64_data, |a, b| a + b),
                fold(n, u64_data, u64::max),
                fold(n, u64_data, u64::min),
                fold(n, u64_data, |a, b| a * b),
            ];
            for (r, (ints, uints)) in out.into_iter().enumerate() {
                if r == root {
                    let ints: Vec<Vec<i64>> = ints.into_iter().map(|x| x.expect("root")).collect();
                    let uints: Vec<Vec<u64>> =
                        uints.into_iter().map(|x| x.expect("root")).collect();
                    assert_eq!(ints, i_expect, "[{backend}] n={n} i64 at root");
                    assert_eq!(uints, u_expect, "[{backend}] n={n} u64 at root");
                } else {
                    assert!(
                        ints.iter().all(Option::is_none) && uints.iter().all(Option::is_none),
                        "[{backend}] n={n} rank {r} is not the root but got a result"
                    );
                }
            }
        }
    }
}

fn f64_data(r: usize) -> Vec<f64> {
    (0..64)
        .map(|i| {
            let x = (r * 64 + i) as f64;
            (x * 0.1).sin() * 10f64.powi((i % 9) as i32 - 4) + 1.0 / (x + 3.0)
        })
        .collect()
}

/// `all_reduce_into` on f64 vectors is bit-identical on every rank and across
/// two separate runs, and close to the sequential sum.
#[test]
fn coll_all_reduce_f64_bit_identical_across_ranks_and_runs() {
    for backend in Backend::ALL {
        for n in [5, 7] {
            let cfg = common::config(backend, n);
            let job = || {
                let report = lazarus::run(&cfg, |ctx| {
                    let world = ctx.world();
                    let data = f64_data(world.rank());
                    let mut sum = vec![0.0; data.len()];
                    world.all_reduce_into(&data, &mut sum, ReduceOp::Sum)?;
                    let mut prod = vec![0.0; data.len()];
                    let scaled: Vec<f64> = data.iter().map(|x| 1.0 + x * 1e-3).collect();
                    world.all_reduce_into(&scaled, &mut prod, ReduceOp::Prod)?;
                    let one = world.all_reduce(data[7], ReduceOp::Sum)?;
                    let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<u64>>();
                    Ok((bits(&sum), bits(&prod), one.to_bits()))
                });
                values(backend, "all_reduce f64", report)
            };
            let first = job();
            let second = job();
            for (r, x) in first.iter().enumerate() {
                assert_eq!(
                    x, &first[0],
                    "[{backend}] n={n} rank {r} differs from rank 0"
                );
            }
            assert_eq!(first, second, "[{backend}] n={n} two runs differ");
            // Sanity: the value is the sum (not bit-equal to a sequential one).
            let seq = fold(n, f64_data, |a, b| a + b);
            for (i, (&bits, s)) in first[0].0.iter().zip(&seq).enumerate() {
                let got = f64::from_bits(bits);
                assert!(
                    (got - s).abs() <= 1e-12 * s.abs().max(1.0),
                    "[{backend}] element {i}: {got} vs {s}"
                );
            }
            assert_eq!(f64::from_bits(first[0].2), f64::from_bits(first[0].0[7]));
        }
    }
}

/// `all_reduce_into` with mismatched lengths is a `SizeMismatch`.
#[test]
fn coll_all_reduce_into_length_mismatch() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let mut out = [0u64; 2];
            let err = world
                .all_reduce_into(&[1u64, 2, 3], &mut out, ReduceOp::Sum)
                .err();
            let ok = world.all_reduce(world.rank() as u64, ReduceOp::Max)?;
            Ok((err, ok))
        });
        for (err, ok) in values(backend, "all_reduce mismatch", report) {
            assert!(
                matches!(err, Some(Error::SizeMismatch { .. })),
                "[{backend}] {err:?}"
            );
            assert_eq!(ok, 3);
        }
    }
}

/// `gather` and `all_gather` order contributions by rank.
#[test]
fn coll_gather_and_all_gather_in_rank_order() {
    for backend in Backend::ALL {
        for (n, root) in [(5, 2), (7, 6), (1, 0)] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, move |ctx| {
                let world = ctx.world();
                let r = world.rank() as i32;
                let g = world.gather(root, &[r * 10, r * 10 + 1])?;
                let ag = world.all_gather(&[r as f32 * 0.5])?;
                Ok((g, ag))
            });
            let out = values(backend, "gather", report);
            let g_expect: Vec<i32> = (0..n as i32).flat_map(|r| [r * 10, r * 10 + 1]).collect();
            let ag_expect: Vec<f32> = (0..n).map(|r| r as f32 * 0.5).collect();
            for (r, (g, ag)) in out.into_iter().enumerate() {
                if r == root {
                    assert_eq!(g.as_ref(), Some(&g_expect), "[{backend}] n={n}");
                } else {
                    assert_eq!(g, None, "[{backend}] n={n} rank {r}");
                }
                assert_eq!(ag, ag_expect, "[{backend}] n={n} rank {r}");
            }
        }
    }
}

fn var_data(r: usize) -> Vec<u64> {
    // Rank 0 and every third rank contribute nothing.
    (0..(r % 3) * (r + 1))
        .map(|i| (r * 1000 + i) as u64)
        .collect()
}

/// `gather_varcount` / `all_gather_varcount` with rank-dependent lengths
/// (including empty contributions) return data and counts in rank order.
#[test]
fn coll_varcount_gathers() {
    for backend in Backend::ALL {
        // Past DIRECT_ALL_GATHER_MAX, the all-gather gathers to rank 0 and
        // broadcasts instead of exchanging blocks directly.
        let tree = DIRECT_ALL_GATHER_MAX + 1;
        for (n, root) in [(5, 1), (7, 4), (1, 0), (tree, tree - 2)] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, move |ctx| {
                let world = ctx.world();
                let mine = var_data(world.rank());
                let g = world.gather_varcount(root, &mine)?;
                let ag = world.all_gather_varcount(&mine)?;
                Ok((g, ag))
            });
            let out = values(backend, "varcount", report);
            let counts: Vec<usize> = (0..n).map(|r| var_data(r).len()).collect();
            let all: Vec<u64> = (0..n).flat_map(var_data).collect();
            for (r, (g, ag)) in out.into_iter().enumerate() {
                if r == root {
                    assert_eq!(
                        g,
                        Some((all.clone(), counts.clone())),
                        "[{backend}] n={n} root"
                    );
                } else {
                    assert_eq!(g, None);
                }
                assert_eq!(
                    ag,
                    (all.clone(), counts.clone()),
                    "[{backend}] n={n} rank {r}"
                );
            }
        }
    }
}

/// `scatter` gives rank r block r of the root's buffer.
#[test]
fn coll_scatter_from_nonzero_root() {
    const COUNT: usize = 3;
    for backend in Backend::ALL {
        for (n, root) in [(5, 2), (7, 0), (1, 0)] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, move |ctx| {
                let world = ctx.world();
                let data: Vec<i64> = (0..(COUNT * world.size()) as i64)
                    .map(|j| j * 7 - 5)
                    .collect();
                let send = (world.rank() == root).then_some(data.as_slice());
                world.scatter(root, send, COUNT)
            });
            let out = values(backend, "scatter", report);
            for (r, got) in out.into_iter().enumerate() {
                let expect: Vec<i64> = (r * COUNT..(r + 1) * COUNT)
                    .map(|j| j as i64 * 7 - 5)
                    .collect();
                assert_eq!(got, expect, "[{backend}] n={n} rank {r}");
            }
        }
    }
}

/// `all_to_all`: rank i's block j (`[i*100+j, -(i*100+j)]`) arrives at rank j
/// as block i.
#[test]
fn coll_all_to_all() {
    for backend in Backend::ALL {
        for n in [1, 4, 7] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let i = world.rank() as i64;
                let data: Vec<i64> = (0..world.size() as i64)
                    .flat_map(|j| [i * 100 + j, -(i * 100 + j)])
                    .collect();
                let bad = world.all_to_all(&data[..data.len() - 1]).err();
                let got = world.all_to_all(&data)?;
                Ok((got, bad))
            });
            let out = values(backend, "all_to_all", report);
            for (j, (got, bad)) in out.into_iter().enumerate() {
                let j = j as i64;
                let expect: Vec<i64> = (0..n as i64)
                    .flat_map(|i| [i * 100 + j, -(i * 100 + j)])
                    .collect();
                assert_eq!(got, expect, "[{backend}] n={n} rank {j}");
                if n > 1 {
                    assert!(
                        matches!(bad, Some(Error::SizeMismatch { .. })),
                        "[{backend}] indivisible all_to_all gave {bad:?}"
                    );
                }
            }
        }
    }
}

/// Every collective on 1 and 7 ranks in one rank function (edge sizes,
/// non-power-of-two trees, back-to-back collectives with different roots).
#[test]
fn coll_back_to_back_with_varying_roots() {
    for backend in Backend::ALL {
        for n in [1, 7] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let n = world.size();
                let mut acc = Vec::new();
                for root in (0..n).rev() {
                    let mut b = [if world.rank() == root {
                        root as u64 + 1
                    } else {
                        0
                    }];
                    world.broadcast_into(root, &mut b)?;
                    acc.push(b[0]);
                    let red = world.reduce(root, &[world.rank() as u64], ReduceOp::Sum)?;
                    acc.push(red.map_or(0, |v| v[0] + 1000));
                    world.barrier()?;
                }
                Ok(acc)
            });
            let out = values(backend, "back to back", report);
            let total: u64 = (0..n as u64).sum();
            for (r, acc) in out.into_iter().enumerate() {
                let expect: Vec<u64> = (0..n)
                    .rev()
                    .flat_map(|root| [root as u64 + 1, if root == r { total + 1000 } else { 0 }])
                    .collect();
                assert_eq!(acc, expect, "[{backend}] n={n} rank {r}");
            }
        }
    }
}

// ----- communicators ---------------------------------------------------------

/// `split` by even/odd color with a key reversing the order: new rank and
/// size are right, an all_reduce sums only the members, p2p uses the new
/// numbering.
#[test]
fn comm_split_even_odd_with_reversed_key() {
    for backend in Backend::ALL {
        let n = 7;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let w = world.rank();
            let sub = world
                .split(Some((w % 2) as u32), -(w as i64))?
                .expect("every rank has a color");
            let sum = sub.all_reduce(w as u64 + 1, ReduceOp::Sum)?;
            let members = sub.all_gather(&[w as u64])?;
            let me_world = sub.world_rank(sub.rank())?;
            // Ring in the sub-communicator: sources are sub ranks.
            let next = (sub.rank() + 1) % sub.size();
            let prev = (sub.rank() + sub.size() - 1) % sub.size();
            let (v, st) = sub.send_receive(&[w as u64], next, 3, Source::Any, 3)?;
            Ok((
                sub.rank(),
                sub.size(),
                sum,
                members,
                me_world,
                v[0],
                st.source == prev,
            ))
        });
        let out = values(backend, "split", report);
        for (w, (rank, size, sum, members, me_world, from, src_ok)) in out.into_iter().enumerate() {
            let group: Vec<u64> = (0..n as u64)
                .filter(|x| x % 2 == w as u64 % 2)
                .rev()
                .collect();
            let new_rank = group.iter().position(|&x| x == w as u64).expect("member");
            assert_eq!(rank, new_rank, "[{backend}] world {w}: new rank");
            assert_eq!(size, group.len(), "[{backend}] world {w}: size");
            assert_eq!(
                sum,
                group.iter().map(|x| x + 1).sum::<u64>(),
                "[{backend}] sum"
            );
            assert_eq!(members, group, "[{backend}] member order");
            assert_eq!(me_world, w);
            let prev = (new_rank + group.len() - 1) % group.len();
            assert_eq!(from, group[prev], "[{backend}] ring in sub-communicator");
            assert!(
                src_ok,
                "[{backend}] status.source is a sub-communicator rank"
            );
        }
    }
}

/// `split` with color `None` returns `None` there; the others form a group.
#[test]
fn comm_split_with_none_color() {
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let w = world.rank();
            let color = (w != 0 && w != 3).then_some(9);
            let sub = world.split(color, 0)?;
            let info = match &sub {
                Some(c) => Some((c.rank(), c.size(), c.all_reduce(w as u64, ReduceOp::Sum)?)),
                None => None,
            };
            // The world still works for everyone afterwards.
            let total = world.all_reduce(1u64, ReduceOp::Sum)?;
            Ok((info, total))
        });
        let out = values(backend, "split none", report);
        let members = [1u64, 2, 4];
        for (w, (info, total)) in out.into_iter().enumerate() {
            assert_eq!(total, n as u64);
            match members.iter().position(|&m| m == w as u64) {
                Some(i) => assert_eq!(info, Some((i, 3, 7)), "[{backend}] world {w}"),
                None => assert_eq!(info, None, "[{backend}] world {w}"),
            }
        }
    }
}

/// A duplicated communicator has its own context: a message sent on the
/// duplicate is invisible on the original, and vice versa.
#[test]
fn comm_duplicate_has_independent_context() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let dup = world.duplicate()?;
            let mut out = None;
            match world.rank() {
                0 => {
                    dup.send(1, 5, &[111u32])?;
                    world.barrier()?;
                    world.barrier()?;
                    // Sent only after rank 1 has looked on the world.
                    world.send(1, 5, &[222u32])?;
                }
                1 => {
                    let on_dup = dup.probe(0, 5)?; // arrived (blocking probe)
                    world.barrier()?;
                    // The dup message is here, yet invisible on the world.
                    let on_world_before = world.iprobe(Source::Any, TagMatch::Any)?;
                    world.barrier()?;
                    // The world receive takes the world message although the
                    // dup message arrived first.
                    let (w, _) = world.receive::<u32>(0, 5)?;
                    let (d, _) = dup.receive::<u32>(0, 5)?;
                    let rest = (
                        world.iprobe(Source::Any, TagMatch::Any)?,
                        dup.iprobe(Source::Any, TagMatch::Any)?,
                    );
                    out = Some((on_dup.bytes, on_world_before, w[0], d[0], rest));
                }
                _ => {
                    world.barrier()?;
                    world.barrier()?;
                }
            }
            // Collectives on the duplicate are independent too.
            let s = dup.all_reduce(dup.rank() as u64, ReduceOp::Sum)?;
            Ok((out, s, dup.rank(), dup.size()))
        });
        let out = values(backend, "duplicate", report);
        assert_eq!(
            out[1].0,
            Some((4, None, 222, 111, (None, None))),
            "[{backend}]"
        );
        for (r, (_, s, rank, size)) in out.into_iter().enumerate() {
            assert_eq!((s, rank, size), (6, r, 4), "[{backend}] rank {r}");
        }
    }
}

// ----- RMA windows -----------------------------------------------------------

/// PUT inside a fence epoch; after the closing fence every target sees the
/// values in its local memory.
#[test]
fn rma_put_then_fence_visible_locally() {
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let me = world.rank() as u64;
            let win: Window<u64> = world.allocate_window(n)?;
            let zero = win.with_local(|m| m.to_vec())?;
            win.fence()?;
            for t in 0..n {
                win.put(t, me as usize, &[me * 1000 + t as u64])?;
            }
            win.fence()?;
            let local = win.with_local(|m| m.to_vec())?;
            win.free()?;
            Ok((zero, local))
        });
        let out = values(backend, "put", report);
        for (t, (zero, local)) in out.into_iter().enumerate() {
            assert_eq!(zero, vec![0; n], "[{backend}] fresh windows are zeroed");
            let expect: Vec<u64> = (0..n as u64).map(|o| o * 1000 + t as u64).collect();
            assert_eq!(local, expect, "[{backend}] target {t}");
        }
    }
}

/// GET reads what the target stored locally.
#[test]
fn rma_get_reads_target_memory() {
    for backend in Backend::ALL {
        let n = 4;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let me = world.rank();
            let win: Window<i32> = world.allocate_window(6)?;
            win.with_local_mut(|m| {
                for (i, x) in m.iter_mut().enumerate() {
                    *x = (me * 10 + i) as i32 - 3;
                }
            })?;
            win.fence()?;
            let whole = win.get((me + 1) % n, 0, 6)?;
            let part = win.get((me + 2) % n, 2, 3)?;
            win.fence()?;
            win.free()?;
            Ok((whole, part))
        });
        let out = values(backend, "get", report);
        for (r, (whole, part)) in out.into_iter().enumerate() {
            let t1 = (r + 1) % n;
            let t2 = (r + 2) % n;
            assert_eq!(
                whole,
                (0..6).map(|i| (t1 * 10 + i) as i32 - 3).collect::<Vec<_>>(),
                "[{backend}] rank {r}"
            );
            assert_eq!(
                part,
                (2..5).map(|i| (t2 * 10 + i) as i32 - 3).collect::<Vec<_>>()
            );
        }
    }
}

/// ACCUMULATE Sum from every rank into rank 0 gives the exact sum.
#[test]
fn rma_accumulate_sum_into_rank0() {
    for backend in Backend::ALL {
        for n in [1, 5, 7] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let r = world.rank() as i64;
                let win: Window<i64> = world.allocate_window(3)?;
                win.fence()?;
                for _ in 0..10 {
                    win.accumulate(0, 0, &[r + 1, -(r * r), 1 << r], ReduceOp::Sum)?;
                }
                win.fence()?;
                let local = win.with_local(|m| m.to_vec())?;
                win.free()?;
                Ok(local)
            });
            let out = values(backend, "accumulate", report);
            let n64 = n as i64;
            let expect = vec![
                10 * (1..=n64).sum::<i64>(),
                -10 * (0..n64).map(|r| r * r).sum::<i64>(),
                10 * (0..n64).map(|r| 1i64 << r).sum::<i64>(),
            ];
            assert_eq!(out[0], expect, "[{backend}] n={n}");
            for (r, local) in out.iter().enumerate().skip(1) {
                assert_eq!(local, &vec![0; 3], "[{backend}] rank {r} untouched");
            }
        }
    }
}

/// GET_ACCUMULATE returns the previous contents and applies the operation.
#[test]
fn rma_get_accumulate_returns_old_contents() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let win: Window<u64> = world.allocate_window(2)?;
            if world.rank() == 0 {
                win.with_local_mut(|m| m.copy_from_slice(&[5, 6]))?;
            }
            world.barrier()?;
            let mut out = Vec::new();
            if world.rank() == 1 {
                win.lock(0, LockType::Exclusive)?;
                out.push(win.get_accumulate(0, 0, &[1, 2], ReduceOp::Sum)?);
                out.push(win.get_accumulate(0, 0, &[10, 1], ReduceOp::Max)?);
                out.push(win.get_accumulate(0, 0, &[0, 0], ReduceOp::NoOp)?);
                out.push(win.get_accumulate(0, 1, &[42], ReduceOp::Replace)?);
                out.push(win.get(0, 0, 2)?);
                win.unlock(0)?;
            }
            world.barrier()?;
            let local = win.with_local(|m| m.to_vec())?;
            win.free()?;
            Ok((out, local))
        });
        let out = values(backend, "get_accumulate", report);
        assert_eq!(
            out[1].0,
            vec![vec![5, 6], vec![6, 8], vec![10, 8], vec![8], vec![10, 42]],
            "[{backend}]"
        );
        assert_eq!(out[0].1, vec![10, 42], "[{backend}] target memory");
    }
}

/// FETCH_AND_OP as a ticket counter: under lock_all every rank increments
/// rank 0's counter K times; the final value is ranks*K and every returned
/// ticket is distinct.
#[test]
fn rma_fetch_and_op_tickets_are_unique() {
    const K: usize = 200;
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let win: Window<u64> = world.allocate_window(1)?;
            win.lock_all()?;
            let mut tickets = Vec::with_capacity(K);
            for _ in 0..K {
                tickets.push(win.fetch_and_op(0, 0, 1, ReduceOp::Sum)?);
            }
            win.unlock_all()?;
            world.barrier()?;
            let fin = win.with_local(|m| m[0])?;
            win.free()?;
            Ok((tickets, fin))
        });
        let out = values(backend, "fetch_and_op", report);
        assert_eq!(out[0].1, (n * K) as u64, "[{backend}] final counter");
        let mut all: Vec<u64> = out.iter().flat_map(|(t, _)| t.iter().copied()).collect();
        for (r, (t, _)) in out.iter().enumerate() {
            assert!(
                t.windows(2).all(|w| w[0] < w[1]),
                "[{backend}] rank {r} tickets increase"
            );
        }
        all.sort_unstable();
        assert_eq!(
            all,
            (0..(n * K) as u64).collect::<Vec<_>>(),
            "[{backend}] tickets"
        );
    }
}

/// COMPARE_AND_SWAP 0 -> rank+1 on one cell from every rank: exactly one wins.
#[test]
fn rma_compare_and_swap_has_one_winner() {
    for backend in Backend::ALL {
        for n in [1, 5, 7] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let me = world.rank() as i64;
                let win: Window<i64> = world.allocate_window(1)?;
                win.lock_all()?;
                let old = win.compare_and_swap(0, 0, 0, me + 1)?;
                win.unlock_all()?;
                let won = old == 0;
                let winners = world.all_reduce(u64::from(won), ReduceOp::Sum)?;
                world.barrier()?;
                win.lock(0, LockType::Shared)?;
                let fin = win.get(0, 0, 1)?[0];
                win.unlock(0)?;
                world.barrier()?;
                win.free()?;
                Ok((won, old, winners, fin))
            });
            let out = values(backend, "cas", report);
            let winner: Vec<usize> = (0..n).filter(|&r| out[r].0).collect();
            assert_eq!(winner.len(), 1, "[{backend}] n={n} winners {winner:?}");
            let w = winner[0] as i64;
            for (r, &(won, old, winners, fin)) in out.iter().enumerate() {
                assert_eq!(winners, 1, "[{backend}] all_reduce count");
                assert_eq!(fin, w + 1, "[{backend}] final value");
                if !won {
                    assert_eq!(old, w + 1, "[{backend}] loser {r} saw the winner's value");
                }
            }
        }
    }
}

/// An exclusive lock makes a non-atomic read-modify-write (GET, PUT) safe.
#[test]
fn rma_exclusive_lock_is_mutually_exclusive() {
    const K: u64 = 40;
    for backend in Backend::ALL {
        let n = 5;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let win: Window<u64> = world.allocate_window(2)?;
            for _ in 0..K {
                win.lock(0, LockType::Exclusive)?;
                let v = win.get(0, 0, 2)?;
                std::thread::yield_now(); // widen the race window
                win.put(0, 0, &[v[0] + 1, v[1] + world.rank() as u64])?;
                win.unlock(0)?;
            }
            world.barrier()?;
            let fin = win.with_local(|m| m.to_vec())?;
            win.free()?;
            Ok(fin)
        });
        let out = values(backend, "exclusive lock", report);
        let rank_sum: u64 = (0..n as u64).sum();
        assert_eq!(out[0], vec![n as u64 * K, K * rank_sum], "[{backend}]");
    }
}

/// `epoch_to(t)` counts this origin's synchronisation actions towards t:
/// fence (all), flush(t), flush_all, unlock(t), unlock_all.
#[test]
fn rma_epoch_to_counts_sync_actions() {
    for backend in Backend::ALL {
        let n = 4;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let me = world.rank();
            let t = (me + 1) % n;
            let win: Window<u64> = world.allocate_window(1)?;
            let snap = |w: &Window<u64>| {
                (0..n)
                    .map(|q| w.epoch_to(q))
                    .collect::<lazarus::Result<Vec<_>>>()
            };
            let mut trace = vec![snap(&win)?];
            win.fence()?;
            trace.push(snap(&win)?);
            win.flush(t)?;
            trace.push(snap(&win)?);
            win.flush_all()?;
            trace.push(snap(&win)?);
            win.fence()?; // no locks held: allowed
            win.lock(t, LockType::Shared)?;
            win.put(t, 0, &[1])?;
            trace.push(snap(&win)?); // lock alone does not count
            win.unlock(t)?;
            trace.push(snap(&win)?);
            win.lock_all()?;
            win.flush(t)?;
            trace.push(snap(&win)?);
            win.unlock_all()?;
            trace.push(snap(&win)?);
            world.barrier()?;
            win.free()?;
            Ok(trace)
        });
        let out = values(backend, "epoch_to", report);
        for (me, trace) in out.into_iter().enumerate() {
            let t = (me + 1) % n;
            let mut e = vec![0u64; n];
            let mut expect = vec![e.clone()];
            e.iter_mut().for_each(|x| *x += 1); // fence
            expect.push(e.clone());
            e[t] += 1; // flush(t)
            expect.push(e.clone());
            e.iter_mut().for_each(|x| *x += 1); // flush_all
            expect.push(e.clone());
            e.iter_mut().for_each(|x| *x += 1); // fence
            expect.push(e.clone()); // lock
            e[t] += 1; // unlock(t)
            expect.push(e.clone());
            e[t] += 1; // flush(t) under lock_all
            expect.push(e.clone());
            e.iter_mut().for_each(|x| *x += 1); // unlock_all
            expect.push(e.clone());
            assert_eq!(trace, expect, "[{backend}] rank {me}");
        }
    }
}

/// RMA outside any access epoch, and misuse of lock/unlock, are `Rma` errors.
#[test]
fn rma_outside_epoch_is_rma_error() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let t = (world.rank() + 1) % n;
            let win: Window<u64> = world.allocate_window(2)?;
            let is_rma = |r: lazarus::Result<()>| matches!(r, Err(Error::Rma { .. }));
            let mut flags = vec![
                is_rma(win.put(t, 0, &[1])),
                is_rma(win.get(t, 0, 1).map(|_| ())),
                is_rma(win.accumulate(t, 0, &[1], ReduceOp::Sum)),
                is_rma(win.fetch_and_op(t, 0, 1, ReduceOp::Sum).map(|_| ())),
                is_rma(win.compare_and_swap(t, 0, 0, 1).map(|_| ())),
                is_rma(win.unlock(t)),
                is_rma(win.unlock_all()),
            ];
            // A lock on t opens an epoch to t only.
            win.lock(t, LockType::Shared)?;
            flags.push(win.put(t, 1, &[5]).is_ok());
            let other = (world.rank() + 2) % n;
            flags.push(is_rma(win.put(other, 1, &[5])));
            flags.push(is_rma(win.lock(t, LockType::Shared))); // already locked
            flags.push(is_rma(win.lock_all()));
            win.unlock(t)?;
            world.barrier()?;
            let local = win.with_local(|m| m.to_vec())?;
            win.free()?;
            Ok((flags, local))
        });
        let out = values(backend, "outside epoch", report);
        for (r, (flags, local)) in out.into_iter().enumerate() {
            assert_eq!(flags, vec![true; 11], "[{backend}] rank {r}");
            assert_eq!(local, vec![0, 5], "[{backend}] rank {r} memory");
        }
    }
}

/// Out-of-bounds accesses are `Rma` errors and change nothing.
#[test]
fn rma_out_of_bounds_is_rma_error() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 4);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let t = (world.rank() + 1) % n;
            let win: Window<u32> = world.allocate_window(4)?;
            win.fence()?;
            let is_rma = |r: lazarus::Result<()>| matches!(r, Err(Error::Rma { .. }));
            let flags = vec![
                is_rma(win.put(t, 3, &[1, 2])),
                is_rma(win.put(t, 4, &[1])),
                is_rma(win.put(t, usize::MAX / 8, &[1])),
                is_rma(win.get(t, 4, 1).map(|_| ())),
                is_rma(win.get(t, 0, 5).map(|_| ())),
                is_rma(win.accumulate(t, 2, &[1, 1, 1], ReduceOp::Sum)),
                is_rma(win.fetch_and_op(t, 4, 1, ReduceOp::Sum).map(|_| ())),
                is_rma(win.compare_and_swap(t, 9, 0, 1).map(|_| ())),
            ];
            // In-bounds accesses still work after the errors.
            win.put(t, 3, &[7])?;
            win.fence()?;
            let local = win.with_local(|m| m.to_vec())?;
            win.free()?;
            Ok((flags, local))
        });
        let out = values(backend, "out of bounds", report);
        for (r, (flags, local)) in out.into_iter().enumerate() {
            assert_eq!(flags, vec![true; 8], "[{backend}] rank {r}");
            assert_eq!(local, vec![0, 0, 0, 7], "[{backend}] rank {r} memory");
        }
    }
}

/// Windows can be freed and new ones allocated (with fresh ids, zeroed
/// memory, other element types and lengths).
#[test]
fn rma_free_and_allocate_again() {
    for backend in Backend::ALL {
        let n = 4;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let n = world.size();
            let me = world.rank();
            let mut ids = Vec::new();
            let mut seen = Vec::new();
            for round in 0..3u64 {
                let a: Window<u64> = world.allocate_window(n)?;
                ids.push(a.id());
                let fresh = a.with_local(|m| m.iter().all(|&x| x == 0))?;
                a.fence()?;
                a.put((me + 1) % n, me, &[round * 10 + me as u64])?;
                a.fence()?;
                seen.push((fresh, a.with_local(|m| m[(me + n - 1) % n])?));
                a.free()?;
                let b: Window<f32> = world.allocate_window(3)?;
                ids.push(b.id());
                b.fence()?;
                b.accumulate(0, 1, &[1.0], ReduceOp::Sum)?;
                b.fence()?;
                let s = b.with_local(|m| m[1])?;
                seen.push((b.local_len() == 3, s as u64));
                b.free()?;
            }
            Ok((ids, seen))
        });
        let out = values(backend, "free and reallocate", report);
        let ids0 = &out[0].0;
        let distinct: BTreeSet<_> = ids0.iter().collect();
        assert_eq!(
            distinct.len(),
            ids0.len(),
            "[{backend}] window ids are fresh"
        );
        for (r, (ids, seen)) in out.iter().enumerate() {
            assert_eq!(ids, ids0, "[{backend}] ranks agree on ids");
            let prev = ((r + n - 1) % n) as u64;
            let expect: Vec<(bool, u64)> = (0..3u64)
                .flat_map(|round| {
                    [
                        (true, round * 10 + prev),
                        (true, if r == 0 { n as u64 } else { 0 }),
                    ]
                })
                .collect();
            assert_eq!(seen, &expect, "[{backend}] rank {r}");
        }
    }
}

/// A window over a sub-communicator: fence, lock_all and atomics address
/// the sub-communicator's ranks only.
#[test]
fn rma_window_on_subcommunicator() {
    for backend in Backend::ALL {
        let n = 5;
        let out = within(common::HANG_S, "window on sub-communicator", move || {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                let w = world.rank();
                // World rank 4 is in no group; groups {0,2}, {1,3}.
                let color = (w != 4).then_some((w % 2) as u32);
                let Some(sub) = world.split(color, 0)? else {
                    world.barrier()?;
                    return Ok(None);
                };
                let win: Window<u64> = sub.allocate_window(1)?;
                win.fence()?;
                win.accumulate(0, 0, &[w as u64 + 1], ReduceOp::Sum)?;
                win.fence()?;
                win.lock_all()?;
                let ticket = win.fetch_and_op(0, 0, 100, ReduceOp::Sum)?;
                win.unlock_all()?;
                sub.barrier()?;
                let local = win.with_local(|m| m[0])?;
                win.free()?;
                world.barrier()?;
                Ok(Some((sub.rank(), ticket, local)))
            });
            values(backend, "sub-communicator window", report)
        });
        assert_eq!(out[4], None);
        for color in 0..2usize {
            let members = [color, color + 2];
            let base: u64 = members.iter().map(|&w| w as u64 + 1).sum();
            let tickets: BTreeSet<u64> =
                members.iter().map(|&w| out[w].expect("member").1).collect();
            assert_eq!(
                tickets,
                BTreeSet::from([base, base + 100]),
                "[{backend}] group {color}"
            );
            let root = members[0];
            assert_eq!(
                out[root].expect("member").2,
                base + 200,
                "[{backend}] group {color}"
            );
        }
    }
}

// ----- job level -------------------------------------------------------------

/// An application error on one rank ends the job with that error while the
/// others are blocked (in a receive from it, in a collective, or in a send
/// to it larger than a shared-memory ring holds), instead of hanging.
#[test]
fn job_app_error_on_one_rank_ends_job() {
    for backend in Backend::ALL {
        for blocked_in in ["a receive", "a collective", "a large send"] {
            // The root-cause check below tells this apart from the
            // processes backend's report of a stalled ring (a send that
            // waited for a peer that had failed ended only there, with a
            // driver error).
            let outcome = within(common::HANG_S, blocked_in, move || {
                let cfg = common::config(backend, 4);
                let report = lazarus::run(&cfg, move |ctx| {
                    let world = ctx.world();
                    if world.rank() == 2 {
                        // Late enough that the others are blocked by then.
                        std::thread::sleep(std::time::Duration::from_millis(300));
                        return Err(Error::app("boom"));
                    }
                    match blocked_in {
                        "a collective" => drop(world.all_reduce(1u64, ReduceOp::Sum)?),
                        "a receive" => drop(world.receive::<u64>(2, 0)?),
                        // Eight times a ring's capacity.
                        _ => world.send_owned(2, 0, vec![7u8; 16 << 20])?,
                    }
                    Ok(world.rank())
                });
                report.outcome
            });
            match outcome {
                Ok(v) => panic!("[{backend}] {blocked_in}: job succeeded with {v:?}"),
                Err(e) => {
                    let msg = e.to_string();
                    assert!(
                        msg.contains("boom") || msg.contains("rank 2"),
                        "[{backend}] {blocked_in}: error does not name the cause: {msg}"
                    );
                    assert_eq!(
                        e,
                        Error::app("boom"),
                        "[{backend}] {blocked_in}: root cause preferred"
                    );
                }
            }
        }
    }
}

/// A panic on one rank ends the job with an error naming that rank.
#[test]
fn job_panic_on_one_rank_ends_job() {
    for backend in Backend::ALL {
        let outcome = within(common::HANG_S, "panic", move || {
            let cfg = common::config(backend, 4);
            let report = lazarus::run(&cfg, |ctx| {
                let world = ctx.world();
                if world.rank() == 1 {
                    panic!("kaboom");
                }
                world.barrier()?;
                Ok(())
            });
            report.outcome
        });
        let e = outcome.expect_err("a panicking rank fails the job");
        let msg = e.to_string();
        assert!(
            msg.contains("rank 1") && msg.contains("kaboom"),
            "[{backend}] {msg}"
        );
    }
}

/// Every rank's value comes back in rank order.
#[test]
fn job_outcome_is_in_rank_order() {
    for backend in Backend::ALL {
        for n in [1, 7] {
            let cfg = common::config(backend, n);
            let report = lazarus::run(&cfg, |ctx| Ok((ctx.rank(), ctx.size())));
            let out = values(backend, "rank order", report);
            assert_eq!(
                out,
                (0..n).map(|r| (r, n)).collect::<Vec<_>>(),
                "[{backend}]"
            );
        }
    }
}

/// Debug formatting of the handles does not panic and names the essentials.
#[test]
fn handles_debug_format() {
    for backend in Backend::ALL {
        let cfg = common::config(backend, 2);
        let report = lazarus::run(&cfg, |ctx| {
            let world = ctx.world();
            let win: Window<u8> = world.allocate_window(3)?;
            let s = format!("{world:?} {win:?}");
            win.free()?;
            Ok(s)
        });
        for s in values(backend, "debug", report) {
            assert!(
                s.contains("Communicator") && s.contains("Window") && s.contains("len: 3"),
                "{s}"
            );
        }
    }
}

// ----- element types ----------------------------------------------------------

/// A user's plain struct of one basic type, made an element type in one
/// line: reductions and accumulates act on each field.
#[derive(
    Clone, Copy, Debug, PartialEq, bytemuck::Pod, bytemuck::Zeroable, Serialize, Deserialize,
)]
#[repr(C)]
struct Moments {
    count: f64,
    sum: f64,
    sum_sq: f64,
}

impl lazarus::Equivalence for Moments {
    const DTYPE: lazarus::DType = lazarus::DType::F64;
}

/// Every primitive element type, `bool` and a user struct reduce, travel
/// and live in windows; a message whose bytes are no valid `bool` is an
/// error, not undefined behaviour.
#[test]
fn datatypes_every_element_type_reduces_travels_and_lives_in_windows() {
    type Reduced = (usize, isize, i8, i16, u16, i128, u128, bool, bool, Moments);
    for backend in Backend::ALL {
        let n = 4;
        let cfg = common::config(backend, n);
        let report = lazarus::run(&cfg, move |ctx| {
            let world = ctx.world();
            let r = world.rank();
            let x = r as f64;
            let reduced: Reduced = (
                world.all_reduce(r + 1, ReduceOp::Sum)?,
                world.all_reduce(-(r as isize), ReduceOp::Min)?,
                world.all_reduce(r as i8 - 100, ReduceOp::Max)?,
                world.all_reduce(-300 * r as i16, ReduceOp::Sum)?,
                world.all_reduce(1u16 << (4 * r), ReduceOp::BitOr)?,
                world.all_reduce(i128::MIN / 8 + r as i128, ReduceOp::Sum)?,
                world.all_reduce(u128::MAX - r as u128, ReduceOp::Min)?,
                world.all_reduce(r == 2, ReduceOp::Sum)?, // any
                world.all_reduce(r != 2, ReduceOp::Min)?, // all
                world.all_reduce(
                    Moments {
                        count: 1.0,
                        sum: x,
                        sum_sq: x * x,
                    },
                    ReduceOp::Sum,
                )?,
            );
            // Point to point: a ring of bools and structs.
            let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
            world.send(next, 1, &[r % 2 == 0, true, false])?;
            world.send(
                next,
                2,
                &[Moments {
                    count: x,
                    sum: -x,
                    sum_sq: 0.5,
                }],
            )?;
            let (flags, _) = world.receive::<bool>(prev, 1)?;
            let (moments, _) = world.receive::<Moments>(prev, 2)?;
            // Windows: every rank sets its flag at rank 0 (BitOr) and adds
            // its moments there; then rank 0's memory is read back.
            let flags_win: Window<bool> = world.allocate_window(n)?;
            let sums_win: Window<Moments> = world.allocate_window(1)?;
            flags_win.fence()?;
            sums_win.fence()?;
            flags_win.accumulate(0, r, &[true], ReduceOp::BitOr)?;
            let one = Moments {
                count: 1.0,
                sum: x,
                sum_sq: x * x,
            };
            sums_win.accumulate(0, 0, &[one], ReduceOp::Sum)?;
            flags_win.fence()?;
            sums_win.fence()?;
            let seen_flags = flags_win.get(0, 0, n)?;
            let seen_sums = sums_win.get(0, 0, 1)?;
            flags_win.fence()?;
            sums_win.fence()?;
            let local_flags = flags_win.with_local(|m| m.to_vec())?;
            flags_win.free()?;
            sums_win.free()?;
            // Bytes that are no bool: refused with a typed error.
            world.send_bytes(next, 3, bytes::Bytes::from_static(&[0, 1, 2]))?;
            let bad = world.receive::<bool>(prev, 3).err();
            let refused = matches!(bad, Some(Error::Codec { .. }));
            Ok((
                reduced,
                flags,
                moments,
                seen_flags,
                seen_sums,
                local_flags,
                refused,
            ))
        });
        let out = values(backend, "element types", report);
        let all = Moments {
            count: 4.0,
            sum: 6.0,
            sum_sq: 14.0,
        };
        let expect: Reduced = (
            10,
            -3,
            -97,
            -1800,
            0x1111,
            4 * (i128::MIN / 8) + 6,
            u128::MAX - 3,
            true,
            false,
            all,
        );
        for (r, (reduced, flags, moments, seen_flags, seen_sums, local, refused)) in
            out.iter().enumerate()
        {
            let prev = (r + n - 1) % n;
            let p = prev as f64;
            assert_eq!(reduced, &expect, "[{backend}] rank {r}: reductions");
            assert_eq!(
                flags,
                &vec![prev % 2 == 0, true, false],
                "[{backend}] rank {r}"
            );
            let from_prev = Moments {
                count: p,
                sum: -p,
                sum_sq: 0.5,
            };
            assert_eq!(moments, &vec![from_prev], "[{backend}] rank {r}");
            assert_eq!(
                seen_flags,
                &vec![true; n],
                "[{backend}] rank {r}: flags window"
            );
            assert_eq!(seen_sums, &vec![all], "[{backend}] rank {r}: struct window");
            let expect_local = if r == 0 {
                vec![true; n]
            } else {
                vec![false; n]
            };
            assert_eq!(local, &expect_local, "[{backend}] rank {r}: local flags");
            assert!(refused, "[{backend}] rank {r}: a byte 2 read as a bool");
        }
    }
}
