//! The engine against a scripted endpoint and a scripted protocol: what it
//! transmits, and when, for sequences of events no real job produces on
//! demand.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::Engine;
use super::frame::{AppMessage, Body, Frame, Incoming};
use crate::driver::{Endpoint, RmaOp, RmaReply, Stat, WinId};
use crate::fault::FaultPoint;
use crate::protocol::{Action, Control, Event, Protocol, ProtocolCx};
use crate::store::partner::PartnerStore;
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// What the scripted endpoint saw: the frames it transmitted, and how many
/// had been transmitted when each scripted arrival was handed out.
#[derive(Default)]
struct Wire {
    sent: Vec<(Rank, Frame)>,
    sent_before_arrival: Vec<usize>,
}

/// Rank 0 of 2: hands out `script` one arrival per poll, and records
/// every frame sent. A blocking poll with nothing left is an error, so a
/// wait that would never end fails the test instead of hanging it.
struct ScriptEndpoint {
    script: VecDeque<Incoming>,
    wire: Arc<Mutex<Wire>>,
}

fn wire(w: &Arc<Mutex<Wire>>) -> std::sync::MutexGuard<'_, Wire> {
    w.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Endpoint for ScriptEndpoint {
    fn rank(&self) -> Rank {
        0
    }
    fn size(&self) -> usize {
        2
    }
    fn start_epoch(&self) -> u64 {
        0
    }
    fn send(&mut self, dest: Rank, frame: Frame) -> Result<()> {
        wire(&self.wire).sent.push((dest, frame));
        Ok(())
    }
    fn poll(&mut self, timeout: Option<Duration>) -> Result<Option<Incoming>> {
        match self.script.pop_front() {
            Some(inc) => {
                let mut w = wire(&self.wire);
                let n = w.sent.len();
                w.sent_before_arrival.push(n);
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
    Incoming::Frame(Frame {
        src: 1,
        epoch: 0,
        body: Body::Control(Control::Marker { generation }),
    })
}

/// Rank 0 of 2 under [`HoldingProtocol`], its wire, and the protocol's
/// "determinants stored" flag.
fn engine(stored: bool, script: Vec<Incoming>) -> (Engine, Arc<Mutex<Wire>>, Arc<AtomicBool>) {
    let w = Arc::new(Mutex::new(Wire::default()));
    let stored = Arc::new(AtomicBool::new(stored));
    let placement = Placement::block(2, 1).expect("placement");
    let ep = ScriptEndpoint {
        script: script.into(),
        wire: w.clone(),
    };
    let proto = HoldingProtocol {
        log: Vec::new(),
        stored: stored.clone(),
    };
    let store = PartnerStore::new(0, &placement);
    (
        Engine::new(Box::new(ep), Box::new(proto), Box::new(store), placement),
        w,
        stored,
    )
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
    let (mut e, w, _) = engine(false, vec![marker(RESEND), marker(STORED)]);
    e.send(1, 7, 3, Bytes::from_static(b"m1")).expect("send");
    let w = wire(&w);
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
    let (mut e, w, stored) = engine(true, vec![marker(RESEND), marker(STORED)]);
    e.send(1, 7, 3, Bytes::from_static(b"m1")).expect("send m1");
    stored.store(false, Ordering::Relaxed);
    e.send(1, 7, 3, Bytes::from_static(b"m2")).expect("send m2");
    let w = wire(&w);
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
