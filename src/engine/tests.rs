//! The engine against a scripted endpoint and a scripted protocol: what it
//! transmits, and when, for sequences of events no real job produces on
//! demand.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::frame::{AppMessage, Body, Envelope, Frame, Incoming};
use super::{Engine, MatchSpec};
use crate::driver::{Endpoint, RmaOp, RmaReply, Stat, WinId};
use crate::fault::FaultPoint;
use crate::protocol::{Action, Control, Determinant, Event, Protocol, ProtocolCx};
use crate::store::partner::PartnerStore;
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// What the scripted endpoint saw: the frames it transmitted, how many had
/// been transmitted when each scripted arrival was handed out, and whether
/// each went to a blocking poll (the engine waiting) or not (draining).
#[derive(Default)]
struct Wire {
    sent: Vec<(Rank, Frame)>,
    sent_before_arrival: Vec<usize>,
    to_blocking_poll: Vec<bool>,
}

/// Rank 0 of `size`: hands out `script` one arrival per poll (to every
/// poll if `eager`, else only to blocking ones, so that receives posted one
/// after another are all posted before anything arrives), and records every
/// frame sent. A blocking poll with nothing left is an error, so a wait
/// that would never end fails the test instead of hanging it.
struct ScriptEndpoint {
    size: usize,
    eager: bool,
    script: VecDeque<Incoming>,
    wire: Arc<Mutex<Wire>>,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Endpoint for ScriptEndpoint {
    fn rank(&self) -> Rank {
        0
    }
    fn size(&self) -> usize {
        self.size
    }
    fn start_epoch(&self) -> u64 {
        0
    }
    fn send(&mut self, dest: Rank, frame: Frame) -> Result<()> {
        locked(&self.wire).sent.push((dest, frame));
        Ok(())
    }
    fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Incoming>> {
        if timeout.is_some() && !self.eager {
            return Ok(None);
        }
        match self.script.pop_front() {
            Some(inc) => {
                let mut w = locked(&self.wire);
                let n = w.sent.len();
                w.sent_before_arrival.push(n);
                w.to_blocking_poll.push(timeout.is_none());
                Ok(Some(inc))
            }
            None if timeout.is_some() => Ok(None),
            None => Err(Error::Driver("the script has no more arrivals".into())),
        }
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
    fn compute(&mut self, _: Duration) -> Result<()> {
        Ok(())
    }
    fn fault_point(&mut self, _: &FaultPoint) -> Result<()> {
        Ok(())
    }
    fn window_expose(&mut self, _: WinId, _: u64, _: usize, _: Option<&[u8]>) -> Result<()> {
        Err(Error::Driver("no windows in this script".into()))
    }
    fn window_withdraw(&mut self, _: WinId) {}
    fn rma(&mut self, _: u64, _: Rank, _: WinId, _: RmaOp) -> Result<RmaReply> {
        Err(Error::Driver("no windows in this script".into()))
    }
    fn with_local_window(&mut self, _: WinId, _: &mut dyn FnMut(&mut [u8])) -> Result<()> {
        Err(Error::Driver("no windows in this script".into()))
    }
    fn record(&mut self, _: Stat) {}
    fn report_progress(&mut self, _: f64) {}
    fn respawn(&mut self, _: Rank) -> Result<()> {
        Err(Error::Driver("no respawn in this script".into()))
    }
    fn await_respawn(&mut self, _: Rank) {}
    fn conclude(&mut self, _: u64) -> bool {
        true
    }
}

/// A logging protocol reduced to what `held_resends` is about: it keeps
/// every message sent (a sender-based log), holds sends until a marker of
/// generation [`STORED`] says the determinants they depend on are stored
/// (as `pessimistic` does, 004 §2.2), and answers a marker of generation
/// [`RESEND`] (a recovering peer asking for its messages) by resending its
/// whole log.
struct HoldingProtocol {
    log: Vec<AppMessage>,
    /// Shared with the test, which may take it back between sends.
    stored: Arc<AtomicBool>,
    /// Resends emitted, for the test.
    resent: Arc<AtomicUsize>,
}

const RESEND: u64 = 1;
const STORED: u64 = 2;

impl Protocol for HoldingProtocol {
    fn name(&self) -> &'static str {
        "holding"
    }
    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::AppSend { msg } => self.log.push(msg.clone()),
            Event::Control {
                msg: Control::Marker { generation },
                ..
            } => match generation {
                RESEND => {
                    for msg in &self.log {
                        cx.emit(Action::Resend { msg: msg.clone() });
                    }
                    self.resent.fetch_add(self.log.len(), Ordering::Relaxed);
                }
                STORED => self.stored.store(true, Ordering::Relaxed),
                _ => {}
            },
            _ => {}
        }
    }
    fn rolls_back_survivors(&self) -> bool {
        false // message logging: `AppSend` reaches the protocol
    }
    fn send_ready(&self) -> bool {
        self.stored.load(Ordering::Relaxed)
    }
}

fn marker(generation: u64) -> Incoming {
    control_from(1, generation)
}

fn control_from(src: Rank, generation: u64) -> Incoming {
    Incoming::Frame(Frame {
        src,
        epoch: 0,
        body: Body::Control(Control::Marker { generation }),
    })
}

/// Rank 0 of `size` under `proto`, reading `script` (`eager`: see
/// [`ScriptEndpoint`]), and its wire.
fn engine_with(
    size: usize,
    eager: bool,
    proto: Box<dyn Protocol>,
    script: Vec<Incoming>,
) -> (Engine, Arc<Mutex<Wire>>) {
    let w = Arc::new(Mutex::new(Wire::default()));
    let placement = Placement::block(size, 1).expect("placement");
    let ep = ScriptEndpoint {
        size,
        eager,
        script: script.into(),
        wire: w.clone(),
    };
    let store = PartnerStore::new(0, &placement);
    (
        Engine::new(Box::new(ep), proto, Box::new(store), placement),
        w,
    )
}

/// Rank 0 of 2 under [`HoldingProtocol`], with what the test looks at.
struct Holding {
    engine: Engine,
    wire: Arc<Mutex<Wire>>,
    /// The protocol's "determinants stored" flag.
    stored: Arc<AtomicBool>,
    /// Resends the protocol emitted.
    resent: Arc<AtomicUsize>,
}

/// [`Holding`], reading `script` only while it waits (so that nothing
/// arrives before a send is under way).
fn holding(stored: bool, script: Vec<Incoming>) -> Holding {
    let stored = Arc::new(AtomicBool::new(stored));
    let resent = Arc::new(AtomicUsize::new(0));
    let proto = HoldingProtocol {
        log: Vec::new(),
        stored: stored.clone(),
        resent: resent.clone(),
    };
    let (engine, wire) = engine_with(2, false, Box::new(proto), script);
    Holding {
        engine,
        wire,
        stored,
        resent,
    }
}

/// The application messages transmitted, as (destination, SSN, payload).
fn app_frames(w: &Wire) -> Vec<(Rank, u64, Bytes)> {
    w.sent
        .iter()
        .filter_map(|(d, f)| match &f.body {
            Body::App(m) => Some((*d, m.ssn, m.payload.clone())),
            _ => None,
        })
        .collect()
}

#[test]
fn a_resend_asked_for_while_a_send_waits_leaves_after_the_determinants_and_once() {
    // The message being sent is in the log when the peer asks for its
    // messages: it must not leave before its determinants are stored,
    // neither as the resend nor as itself, and must leave once.
    let mut h = holding(false, vec![marker(RESEND), marker(STORED)]);
    (h.engine.send(1, CONTEXT, TAG, Bytes::from_static(b"m1"))).expect("send");
    assert_eq!(
        h.resent.load(Ordering::Relaxed),
        1,
        "the peer asked while m1 waited"
    );
    let w = locked(&h.wire);
    assert_eq!(
        w.sent_before_arrival,
        vec![0, 0],
        "nothing left before the determinants were stored"
    );
    assert_eq!(app_frames(&w), vec![(1, 1, Bytes::from_static(b"m1"))]);
}

#[test]
fn resends_held_during_a_send_go_out_in_log_order_before_it() {
    // m1 left at once; m2 waits for its determinants while the peer asks
    // for its messages: both go out after the determinants are stored, m1
    // first, and m2 only once (as the resend: SSNs identify it).
    let mut h = holding(true, vec![marker(RESEND), marker(STORED)]);
    (h.engine.send(1, CONTEXT, TAG, Bytes::from_static(b"m1"))).expect("send m1");
    h.stored.store(false, Ordering::Relaxed);
    (h.engine.send(1, CONTEXT, TAG, Bytes::from_static(b"m2"))).expect("send m2");
    assert_eq!(
        h.resent.load(Ordering::Relaxed),
        2,
        "the peer asked while m2 waited"
    );
    let w = locked(&h.wire);
    assert_eq!(
        w.sent_before_arrival,
        vec![1, 1],
        "only m1 left before the determinants were stored"
    );
    assert_eq!(
        app_frames(&w),
        vec![
            (1, 1, Bytes::from_static(b"m1")),
            (1, 1, Bytes::from_static(b"m1")),
            (1, 2, Bytes::from_static(b"m2")),
        ]
    );
}

/// Deliveries as a protocol saw them: `(src, ssn, rsn, replayed)`.
type Deliveries = Arc<Mutex<Vec<(Rank, u64, u64, bool)>>>;

/// A logging protocol reduced to replay: a marker of generation
/// [`REPLAY`] hands the engine its determinants (as a recovering rank gets
/// them from their holders), and every nondeterministic delivery is recorded as
/// `(src, ssn, rsn, replayed)`.
struct ReplayingProtocol {
    determinants: Vec<Determinant>,
    delivered: Deliveries,
}

const REPLAY: u64 = 9;

impl Protocol for ReplayingProtocol {
    fn name(&self) -> &'static str {
        "replaying"
    }
    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::Control {
                msg: Control::Marker { generation: REPLAY },
                ..
            } => cx.emit(Action::Replay {
                determinants: std::mem::take(&mut self.determinants),
            }),
            Event::AppDeliver {
                msg, rsn, replayed, ..
            } => locked(&self.delivered).push((msg.envelope.src, msg.ssn, rsn, replayed)),
            _ => {}
        }
    }
    fn rolls_back_survivors(&self) -> bool {
        false
    }
}

fn app_from(src: Rank, ssn: u64, payload: &'static [u8]) -> Incoming {
    Incoming::Frame(Frame {
        src,
        epoch: 0,
        body: Body::App(AppMessage {
            envelope: Envelope {
                src,
                dest: 0,
                context: CONTEXT,
                tag: TAG,
            },
            ssn,
            payload: Bytes::from_static(payload),
        }),
    })
}

const CONTEXT: u64 = 7;
const TAG: i32 = 3;

fn det(rsn: u64, src: Rank, ssn: u64) -> Determinant {
    Determinant {
        rsn,
        src,
        ssn,
        at: None,
    }
}

/// Rank 0 of 3 replaying wildcard receptions (2,1) (1,1) (2,2), as (src,
/// SSN), while the messages arrive in the order (1,1) (2,1) (2,2)
/// (`eager`: see [`ScriptEndpoint`]); and what its protocol saw delivered.
fn replaying(eager: bool) -> (Engine, Deliveries, Arc<Mutex<Wire>>) {
    let script = vec![
        control_from(1, REPLAY),
        app_from(1, 1, b"a"),
        app_from(2, 1, b"b"),
        app_from(2, 2, b"c"),
    ];
    let determinants = vec![det(2, 1, 1), det(1, 2, 1), det(3, 2, 2)];
    replaying_with(3, eager, determinants, script)
}

/// Rank 0 of `size` replaying `determinants` (handed over by the script's
/// [`REPLAY`] marker) while reading `script`; what its protocol saw
/// delivered.
fn replaying_with(
    size: usize,
    eager: bool,
    determinants: Vec<Determinant>,
    script: Vec<Incoming>,
) -> (Engine, Deliveries, Arc<Mutex<Wire>>) {
    let delivered = Arc::new(Mutex::new(Vec::new()));
    let proto = ReplayingProtocol {
        determinants,
        delivered: delivered.clone(),
    };
    let (e, w) = engine_with(size, eager, Box::new(proto), script);
    (e, delivered, w)
}

/// What [`replaying`]'s receives got, and what its protocol saw
/// delivered: the logged order (2,1) (1,1) (2,2), each a replayed wildcard
/// reception with its rsn.
fn assert_replayed_in_logged_order(got: &[Bytes], delivered: &Deliveries) {
    assert_eq!(got, [&b"b"[..], b"a", b"c"].map(Bytes::from_static));
    assert_eq!(
        *locked(delivered),
        vec![(2, 1, 1, true), (1, 1, 2, true), (2, 2, 3, true)]
    );
}

const ANY: MatchSpec = MatchSpec {
    context: CONTEXT,
    source: None,
    tag: Some(TAG),
};

#[test]
fn replayed_wildcard_receives_take_the_logged_senders_not_the_arrival_order() {
    // Everything has arrived when the first receive is posted: each
    // receive takes from the arrived messages the one its determinant
    // names, not the first to arrive.
    let (mut e, delivered, w) = replaying(true);
    let got: Vec<Bytes> = (0..3)
        .map(|_| e.receive(ANY).expect("receive").payload)
        .collect();
    assert_eq!(
        locked(&w).to_blocking_poll,
        [false; 4],
        "all taken in before the first receive returned"
    );
    assert_replayed_in_logged_order(&got, &delivered);
}

#[test]
fn wildcard_receives_posted_together_are_matched_in_the_logged_order() {
    // All three posted before anything arrives: each arrival is matched as
    // the replay allows, and the one that waited is matched once the
    // determinant ahead of it is consumed (`rematch_replay`).
    let (mut e, delivered, w) = replaying(false);
    let ids: Vec<_> = (0..3).map(|_| e.post_receive(ANY).expect("post")).collect();
    let got: Vec<Bytes> = ids
        .into_iter()
        .map(|id| e.wait(id).expect("wait").payload)
        .collect();
    assert_eq!(
        locked(&w).to_blocking_poll,
        [true; 4],
        "nothing arrived before the receives were posted"
    );
    assert_replayed_in_logged_order(&got, &delivered);
}

/// A receive from `src` (of [`TAG`] in [`CONTEXT`]).
fn from(src: Rank) -> MatchSpec {
    MatchSpec {
        context: CONTEXT,
        source: Some(src),
        tag: Some(TAG),
    }
}

/// Arrivals the scripted endpoint has handed out.
fn handed_out(w: &Mutex<Wire>) -> usize {
    locked(w).sent_before_arrival.len()
}

#[test]
fn a_receive_takes_in_arrivals_only_until_one_matches() {
    // A receive from rank 2 takes in rank 1's message (kept for later) and
    // its own, and leaves the third arrival where it is; the next receive
    // finds rank 1's first message without looking for arrivals; the last
    // takes in the third.
    let script = vec![
        app_from(1, 1, b"a"),
        app_from(2, 1, b"b"),
        app_from(1, 2, b"c"),
    ];
    let (mut e, w) = engine_with(3, true, Box::new(crate::protocol::none::NoProtocol), script);
    assert_eq!(e.receive(from(2)).expect("receive").payload, &b"b"[..]);
    assert_eq!(handed_out(&w), 2, "the third arrival is not taken in yet");
    assert_eq!(e.unexpected.len(), 1);
    assert_eq!(e.receive(from(1)).expect("receive").payload, &b"a"[..]);
    assert_eq!(handed_out(&w), 2, "an earlier arrival matched: no polling");
    assert_eq!(e.receive(from(1)).expect("receive").payload, &b"c"[..]);
    assert_eq!(handed_out(&w), 3);
    assert!(e.posted.is_empty() && e.completed.is_empty() && e.unexpected.is_empty());
}

#[test]
fn a_receive_interrupted_while_it_takes_in_arrivals_is_withdrawn() {
    // The job's abort arrives while the receive looks for its message: the
    // receive fails and is not left posted to swallow a later message.
    let script = vec![
        Incoming::Abort {
            rank: 2,
            reason: "rank 2 failed".into(),
        },
        app_from(1, 1, b"a"),
    ];
    let (mut e, w) = engine_with(3, true, Box::new(crate::protocol::none::NoProtocol), script);
    let got = e.post_receive(from(1));
    assert!(
        matches!(got, Err(Error::Aborted { rank: 2, .. })),
        "{got:?}"
    );
    assert!(e.posted.is_empty(), "the failed receive was withdrawn");
    assert_eq!(handed_out(&w), 1, "nothing is taken in after the abort");
}

/// Rank 0 of 4 replaying two wildcard receptions, x from rank 2 then m1
/// from rank 1 (SSN 1), while m1 arrives first (then `between`, if any)
/// and rank 1's next message n (SSN 2) before x. Arrivals only reach
/// blocking polls.
fn replaying_reserved(between: Option<Incoming>) -> (Engine, Deliveries) {
    let mut script = vec![control_from(1, REPLAY), app_from(1, 1, b"m1")];
    script.extend(between);
    script.extend([app_from(1, 2, b"n"), app_from(2, 1, b"x")]);
    let (e, delivered, _) = replaying_with(4, false, vec![det(1, 2, 1), det(2, 1, 1)], script);
    (e, delivered)
}

/// What [`replaying_reserved`]'s wildcard receives `w1`, `w2` get, and
/// the deliveries its protocol saw: the two replayed wildcard receptions
/// alone (a named reception has no outcome to log and is not reported).
fn assert_wildcards_got_their_logged_messages(
    e: &mut Engine,
    [w1, w2]: [super::ReqId; 2],
    delivered: &Deliveries,
) {
    assert_eq!(e.wait(w1).expect("w1").payload, &b"x"[..]);
    assert_eq!(e.wait(w2).expect("w2").payload, &b"m1"[..]);
    assert_eq!(*locked(delivered), vec![(2, 1, 1, true), (1, 1, 2, true)]);
}

#[test]
fn a_named_receive_leaves_an_unexpected_message_a_determinant_names_to_its_wildcard_receive() {
    // m1 waits unexpected (the replay gives it to w2, after x) when a
    // receive from rank 1 is posted: it must get n, as in the first
    // execution, not m1.
    let (mut e, delivered) = replaying_reserved(Some(app_from(3, 1, b"z")));
    let w = [ANY, ANY].map(|s| e.post_receive(s).expect("post"));
    assert_eq!(e.receive(from(3)).expect("z").payload, &b"z"[..]);
    assert_eq!(e.unexpected.len(), 1, "m1 is waiting");
    assert_eq!(e.receive(from(1)).expect("n").payload, &b"n"[..]);
    assert_wildcards_got_their_logged_messages(&mut e, w, &delivered);
}

#[test]
fn a_named_receive_posted_during_a_replay_lets_a_message_a_determinant_names_pass() {
    // The receive from rank 1 is posted before m1 arrives: m1 must not
    // complete it either.
    let (mut e, delivered) = replaying_reserved(None);
    let w = [ANY, ANY].map(|s| e.post_receive(s).expect("post"));
    let n = e.post_receive(from(1)).expect("post");
    assert_eq!(e.wait(n).expect("n").payload, &b"n"[..]);
    assert_wildcards_got_their_logged_messages(&mut e, w, &delivered);
}

#[test]
fn a_named_probe_during_a_replay_sees_a_message_a_determinant_names() {
    // First execution: a probe of rank 1 saw m1, then a wildcard receive
    // took it. Replayed, the probe must see m1 too (it takes nothing), and
    // the wildcard receive gets it.
    let script = vec![control_from(1, REPLAY), app_from(1, 1, b"m1")];
    let (mut e, delivered, _) = replaying_with(4, false, vec![det(1, 1, 1)], script);
    let (env, bytes) = e.probe(from(1)).expect("probe");
    assert_eq!((env.src, bytes), (1, 2));
    assert_eq!(e.receive(ANY).expect("m1").payload, &b"m1"[..]);
    assert_eq!(*locked(&delivered), vec![(1, 1, 1, true)]);
}

/// A snapshot whose windows are serialized where their memory lies has the
/// bytes of the derived encoding, which `restore` decodes.
#[test]
fn snapshot_appended_field_by_field_is_the_derived_encoding() {
    use super::{SavedWindow, Snapshot, WindowState, append_snapshot};
    let memories: Vec<(WinId, Vec<u8>)> = vec![
        (3, (0..=255).collect()),
        (7, vec![9; 70_000]),
        (8, Vec::new()),
    ];
    let state = |i: u64| WindowState {
        fence_open: i.is_multiple_of(2),
        all_targets: i,
        per_target: [(1, i), (4, 2 * i)].into_iter().collect(),
        ..WindowState::default()
    };
    let mut full = Snapshot {
        safe_points: 17,
        progress: 0.25,
        ssn_out: vec![(1, 5), (2, 300)],
        ssn_in: vec![(0, 1)],
        rsn: 4,
        collectives: vec![(12, 3)],
        synced: vec![(12, 2)],
        ops: 99,
        ..Snapshot::default()
    };
    full.unexpected = vec![AppMessage {
        envelope: Envelope {
            src: 2,
            dest: 0,
            context: 1,
            tag: 5,
        },
        ssn: 3,
        payload: Bytes::from_static(b"unexpected"),
    }];
    let states: Vec<(WinId, WindowState)> =
        (memories.iter()).map(|(id, _)| (*id, state(*id))).collect();
    full.windows = (memories.iter())
        .map(|(id, m)| SavedWindow {
            id: *id,
            memory: serde_bytes::ByteBuf::from(m.clone()),
            state: state(*id),
        })
        .collect();
    let derived = postcard::to_allocvec(&full).expect("encodes");
    let windows = std::mem::take(&mut full.windows);
    let mut head = vec![1, 2, 3];
    append_snapshot(
        &full,
        &states,
        &mut |id, f| f(&memories.iter().find(|(i, _)| *i == id).expect("known").1),
        &mut head,
    )
    .expect("appends");
    assert_eq!(head[..3], [1, 2, 3]);
    assert_eq!(head[3..], derived[..]);
    let back: Snapshot = postcard::from_bytes(&head[3..]).expect("decodes");
    assert_eq!(back.windows.len(), windows.len());
    for (b, w) in back.windows.iter().zip(&windows) {
        assert_eq!((b.id, &b.memory), (w.id, &w.memory));
    }
}
