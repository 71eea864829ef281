//! Protocol `chandy-lamport`: non-blocking coordinated checkpointing by
//! markers and recorded channel state (Chandy & Lamport, as 000 §II and §IV
//! use it), over two-sided and one-sided communication.
//!
//! **Snapshot.** A rank records its state (the application's, its windows',
//! its unexpected messages') at the safe point of the generation and goes
//! on at once: nobody waits for anybody. Then it sends a marker on each of
//! its n − 1 outgoing channels (n(n − 1) markers a generation, 000 §IV-D),
//! and from each incoming channel it records, as that channel's state, the
//! messages that arrive between its own recording and that channel's
//! marker: sent before the sender's cut, received after this rank's. A
//! message that arrives on a channel *after* its marker but before this
//! rank has recorded was sent after the sender's cut; it is held, out of
//! the application's reach, until this rank records (otherwise the cut
//! would have an orphan), then delivered. Once every channel's marker has
//! arrived, the rank's piece (state and channel state) goes to the store;
//! the generation commits when every rank's piece is stored (the `Stored`
//! reduction and `Commit` broadcast of [`super::coordinated`]).
//!
//! Channels are FIFO on every backend, and one-sided operations travel on
//! them as request and reply messages
//! ([`Protocol::one_sided_as_messages`], 000 §III-B), so a marker orders
//! RMA accesses as it orders messages: a request held or recorded is
//! applied by the target after its cut, a reply recorded completes the GET
//! at the origin after a restore.
//!
//! **Where a rank records.** A restartable rank function has states only
//! at safe points, so "record at the first marker" becomes "at a safe
//! point". Which one matters: a rank that records at a later safe point
//! than its peers may need one of their post-marker messages to get there
//! (it is held: deadlock), and one that records at an earlier one can block
//! a peer the same way. Generation `g` is therefore recorded by every rank
//! at its own safe point number `g × every` (every rank calls the same
//! number of safe points), whenever it gets there: a rank behind reaches it
//! later, a rank ahead does not wait. The first rank there is the
//! initiator of the wave; every rank is one in the sense of Chandy–Lamport's
//! spontaneous recording, which the algorithm allows. The one assumption is
//! the one blocking coordinated checkpointing already makes: the work a
//! rank does before its safe point `k` never waits for work another rank
//! does after its own safe point `k`.
//!
//! **Recovery.** As under `coordinated` (the same inventory, decision and
//! resume, run by the embedded [`Coordinated`]): every rank restores the
//! newest committed generation, and the messages recorded as its incoming
//! channels' state are delivered again, before any new one.

mod wave;

pub use wave::{GetFix, Wave, WaveConfig, WaveMarker};

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::coordinated::Coordinated;
use super::{Action, Control, Event, Protocol, ProtocolCx};
use crate::engine::frame::{AppMessage, Envelope, append_with_blobs, take_with_blobs};
use crate::store::PieceWriter;
use crate::{Rank, Result};

/// A generation this rank has recorded and not yet handed to the store.
#[derive(Debug, Default)]
struct Recording {
    /// Incoming channels whose marker has not arrived: what arrives on
    /// them is channel state.
    open: BTreeSet<Rank>,
    /// The channel state recorded so far, in arrival order (payloads
    /// shared with the application's copy, not copied).
    messages: Vec<AppMessage>,
}

/// A message held out of the application's reach.
#[derive(Debug)]
struct Held {
    /// The recorded generation it waits for (0: none).
    recorded: u64,
    /// The wave generation it waits for this rank to cut (0: none).
    cut: u64,
    /// Its position on its channel (for the wave's stamps).
    index: u64,
    msg: AppMessage,
}

/// Channel state as it is saved in a piece (payloads follow as blobs).
#[derive(Debug, Serialize, Deserialize)]
struct SavedChannels {
    generation: u64,
    messages: Vec<(Envelope, u64)>,
}

/// Counters of one rank, reported with [`crate::driver::Stat::Snapshot`].
#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    markers_sent: u64,
    channel_messages: u64,
    channel_bytes: u64,
    held: u64,
}

/// State of the Chandy–Lamport protocol on one rank.
#[derive(Debug)]
pub struct ChandyLamport {
    /// Safe points between generations (0: no checkpoints).
    every: u64,
    /// Commit tree and recovery.
    inner: Coordinated,
    /// Highest generation this rank recorded (in this execution, or the
    /// restored one).
    recorded: u64,
    /// Generations recorded whose piece is not yet stored.
    recordings: BTreeMap<u64, Recording>,
    /// Per incoming channel, the highest generation whose marker arrived.
    marked: BTreeMap<Rank, u64>,
    /// Messages that arrived after their channel's marker of a generation
    /// this rank has not recorded yet, or after their sender's wave marker
    /// of a generation this rank has not cut ([`Wave`]), in arrival order.
    held: VecDeque<Held>,
    /// The generation whose piece is being written (`save_state`).
    storing: Option<u64>,
    /// Channel state of the restored generation, delivered at `Restored`.
    restored: Vec<AppMessage>,
    counts: Counts,
    /// 000 §IV's wave, when a `get()` fix is chosen, until a failure.
    wave: Option<Wave>,
    /// The wave's counters once a failure stopped it.
    wave_stopped: Option<crate::cuts::WaveCounts>,
}

impl ChandyLamport {
    /// Record a generation at every `every`-th safe point (0 disables
    /// checkpoints).
    pub fn new(every: u64) -> Self {
        Self::with_wave(every, None)
    }

    /// As [`ChandyLamport::new`], with 000 §IV's wave measured beside the
    /// recorded snapshots.
    pub fn with_wave(every: u64, wave: Option<WaveConfig>) -> Self {
        ChandyLamport {
            every,
            inner: Coordinated::for_recorded_snapshots(every),
            recorded: 0,
            recordings: BTreeMap::new(),
            marked: BTreeMap::new(),
            held: VecDeque::new(),
            storing: None,
            restored: Vec::new(),
            counts: Counts::default(),
            wave: wave.map(Wave::new),
            wave_stopped: None,
        }
    }

    /// This rank recorded generation `g`: markers out, held messages in,
    /// and the piece stored if no channel is open.
    fn on_recorded(&mut self, g: u64, cx: &mut ProtocolCx<'_>) {
        self.recorded = g;
        let open: BTreeSet<Rank> = (0..cx.size)
            .filter(|&r| r != cx.rank && self.marked.get(&r).copied().unwrap_or(0) < g)
            .collect();
        self.recordings.insert(
            g,
            Recording {
                open,
                messages: Vec::new(),
            },
        );
        cx.broadcast(&Control::Marker { generation: g });
        self.counts.markers_sent += cx.size.saturating_sub(1) as u64;
        // Held messages were sent after their senders' cut of a generation
        // this rank has now recorded: the application may have them.
        self.release(cx);
        self.store_ready(cx);
    }

    /// Hand to the store, in order, every recorded generation whose
    /// channels are all closed.
    fn store_ready(&mut self, cx: &mut ProtocolCx<'_>) {
        if self.storing.is_some() {
            return;
        }
        let Some((&g, rec)) = self.recordings.iter().next() else {
            return;
        };
        if !rec.open.is_empty() {
            return;
        }
        self.storing = Some(g);
        cx.emit(Action::StoreRecorded { generation: g });
    }

    fn on_marker(&mut self, src: Rank, g: u64, cx: &mut ProtocolCx<'_>) {
        let m = self.marked.entry(src).or_insert(0);
        *m = (*m).max(g);
        if let Some(rec) = self.recordings.get_mut(&g) {
            rec.open.remove(&src);
        }
        self.store_ready(cx);
    }

    fn on_arrive(&mut self, msg: &AppMessage, cx: &mut ProtocolCx<'_>) {
        let src = msg.envelope.src;
        let (index, cut) = match &mut self.wave {
            Some(w) => w.arrived(msg),
            None => (0, None),
        };
        let marked = self.marked.get(&src).copied().unwrap_or(0);
        // After the sender's cut of a generation this rank has not recorded:
        // an orphan if the application took it now.
        let recorded = if marked > self.recorded { marked } else { 0 };
        if recorded == 0 {
            for rec in self.recordings.values_mut() {
                if rec.open.contains(&src) {
                    rec.messages.push(msg.clone());
                    self.counts.channel_messages += 1;
                    self.counts.channel_bytes += msg.payload.len() as u64;
                }
            }
        }
        if recorded > 0 || cut.is_some() {
            self.held.push_back(Held {
                recorded,
                cut: cut.unwrap_or(0),
                index,
                msg: msg.clone(),
            });
            self.counts.held += 1;
            cx.emit(Action::Hold);
            return;
        }
        if let Some(w) = &mut self.wave
            && w.received(msg, index, cx)
        {
            self.release(cx);
        }
    }

    /// Deliver, in arrival order, the held messages whose generation this
    /// rank has recorded and whose wave generation it has cut, then let the
    /// wave move on (they come before its next cut; one can complete a GET
    /// and let it cut again), until nothing more is released.
    fn release(&mut self, cx: &mut ProtocolCx<'_>) {
        loop {
            let cuts = self.wave.as_ref().map_or(u64::MAX, Wave::cuts);
            let recorded = self.recorded;
            let (now, later): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.held)
                .into_iter()
                .partition(|h| h.recorded <= recorded && h.cut <= cuts);
            self.held = later;
            let released = !now.is_empty();
            for h in now {
                if let Some(w) = &mut self.wave {
                    w.take(&h.msg, h.index, cx);
                }
                cx.emit(Action::Deliver { msg: h.msg });
            }
            let cut = self.wave.as_mut().is_some_and(|w| w.advance(cx));
            if !released && !cut {
                return;
            }
        }
    }

    /// The wave runs while no failure has happened: a restored execution's
    /// cuts would mix incarnations, and a replacement would wait for
    /// markers of generations its peers passed long ago. Once this rank
    /// sees a failure (or starts as a replacement) the wave stops here,
    /// and what it held is released.
    fn stop_wave_after_failure(&mut self, cx: &mut ProtocolCx<'_>) {
        if cx.epoch == 0 {
            return;
        }
        if let Some(w) = self.wave.take() {
            self.wave_stopped = Some(w.counts());
            for h in &mut self.held {
                h.cut = 0;
            }
            self.release(cx);
        }
    }

    fn reset(&mut self) {
        self.recordings.clear();
        self.marked.clear();
        self.held.clear();
        self.storing = None;
        self.restored.clear();
    }
}

impl Protocol for ChandyLamport {
    fn name(&self) -> &'static str {
        "chandy-lamport"
    }

    fn one_sided_as_messages(&self) -> bool {
        true
    }

    fn watches_arrivals(&self) -> bool {
        true
    }

    fn watches_sends(&self) -> bool {
        self.wave.is_some()
    }

    fn may_initiate(&self) -> bool {
        self.wave.as_ref().is_none_or(Wave::may_initiate)
    }

    fn refuses_request(&mut self, origin: Rank) -> bool {
        self.wave.as_mut().is_some_and(|w| w.refuses(origin))
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        self.stop_wave_after_failure(cx);
        match event {
            Event::SafePoint { index } => {
                if let Some(w) = &mut self.wave
                    && w.safe_point(index, self.every, cx)
                {
                    self.release(cx);
                }
                if self.every > 0 && index.is_multiple_of(self.every) {
                    let g = index / self.every;
                    if g > self.recorded {
                        cx.emit(Action::RecordState { generation: g });
                    }
                }
                cx.emit(Action::ReleaseSafePoint);
            }
            Event::Recorded { generation } => self.on_recorded(generation, cx),
            Event::AppArrive { msg } => self.on_arrive(msg, cx),
            Event::AppSend { msg } => {
                if let Some(w) = &mut self.wave {
                    w.sent(msg, cx.rank);
                }
            }
            Event::AppSent { dest } => {
                if let Some(w) = &mut self.wave
                    && w.after_send(dest, cx)
                {
                    self.release(cx);
                }
            }
            Event::Control {
                src,
                msg: Control::Wave { generation, kind },
            } => {
                if let Some(w) = &mut self.wave
                    && w.marker(src, generation, kind, cx)
                {
                    self.release(cx);
                }
            }
            Event::Control {
                src,
                msg: Control::Marker { generation },
            } => self.on_marker(src, generation, cx),
            Event::PieceStored { generation } if self.storing == Some(generation) => {
                self.storing = None;
                self.recordings.remove(&generation);
                self.inner.handle(Event::PieceStored { generation }, cx);
                self.store_ready(cx);
            }
            Event::PeerFailed { epoch, dead } => {
                self.reset();
                self.inner.handle(Event::PeerFailed { epoch, dead }, cx);
            }
            Event::Restored { generation } => {
                self.recorded = generation.unwrap_or(0);
                for msg in std::mem::take(&mut self.restored) {
                    cx.emit(Action::Deliver { msg });
                }
            }
            Event::Finish => {
                if let Some(w) = &mut self.wave {
                    w.finish(cx);
                } else if let Some(c) = self.wave_stopped.take() {
                    cx.emit(Action::Record(crate::driver::Stat::Wave(c)));
                }
                let c = std::mem::take(&mut self.counts);
                cx.emit(Action::Record(crate::driver::Stat::Snapshot {
                    markers_sent: c.markers_sent,
                    channel_messages: c.channel_messages,
                    channel_bytes: c.channel_bytes,
                    held: c.held,
                }));
            }
            other => self.inner.handle(other, cx),
        }
    }

    fn save_state(&self, piece: &mut PieceWriter<'_>) -> Result<()> {
        let Some(g) = self.storing else {
            return Ok(());
        };
        let messages = self
            .recordings
            .get(&g)
            .map(|r| &r.messages[..])
            .unwrap_or_default();
        let meta = SavedChannels {
            generation: g,
            messages: messages.iter().map(|m| (m.envelope, m.ssn)).collect(),
        };
        let blobs: Vec<&Bytes> = messages.iter().map(|m| &m.payload).collect();
        append_with_blobs(&meta, &blobs, piece)
    }

    fn state_size_hint(&self) -> usize {
        let n = (self.storing)
            .and_then(|g| self.recordings.get(&g))
            .map_or(0, |r| r.messages.len());
        64 + n * crate::engine::frame::ENCODED_MESSAGE_OVERHEAD
    }

    fn load_state(&mut self, state: Bytes) -> Result<()> {
        if state.is_empty() {
            self.restored.clear();
            return Ok(());
        }
        let (saved, payloads, _): (SavedChannels, _, _) = take_with_blobs(&state)?;
        if saved.messages.len() != payloads.len() {
            return Err(crate::Error::Codec {
                what: "a checkpoint piece's channel state".into(),
                detail: format!(
                    "{} messages but {} payloads",
                    saved.messages.len(),
                    payloads.len()
                ),
            });
        }
        self.restored = (saved.messages.into_iter().zip(payloads))
            .map(|((envelope, ssn), payload)| AppMessage {
                envelope,
                ssn,
                payload,
            })
            .collect();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::testing::{Harness, app_message};
    use crate::store::pool::BufferPool;

    fn arrive(h: &Harness, p: &mut ChandyLamport, msg: &AppMessage) -> Vec<Action> {
        h.run(p, Event::AppArrive { msg })
    }

    fn markers_to(actions: &[Action]) -> Vec<Rank> {
        (actions.iter())
            .filter_map(|a| match a {
                Action::Transmit {
                    dest,
                    msg: Control::Marker { .. },
                } => Some(*dest),
                _ => None,
            })
            .collect()
    }

    fn delivered(actions: &[Action]) -> Vec<u64> {
        (actions.iter())
            .filter_map(|a| match a {
                Action::Deliver { msg } => Some(msg.ssn),
                _ => None,
            })
            .collect()
    }

    /// A generation is recorded at its own safe point, `g × every`, and
    /// the safe point is released at once (nobody waits).
    #[test]
    fn records_at_the_generations_safe_point_and_never_blocks() {
        let h = Harness::new(1, 4, 1);
        let mut p = ChandyLamport::new(3);
        for index in 1..=7 {
            let a = h.run(&mut p, Event::SafePoint { index });
            assert!(a.contains(&Action::ReleaseSafePoint), "safe point {index}");
            let recorded = a.contains(&Action::RecordState {
                generation: index / 3,
            });
            assert_eq!(recorded, index % 3 == 0, "safe point {index}: {a:?}");
            if recorded {
                h.run(
                    &mut p,
                    Event::Recorded {
                        generation: index / 3,
                    },
                );
            }
        }
    }

    /// After recording, a marker on each of the n − 1 outgoing channels;
    /// what arrives on a channel before its marker is channel state, what
    /// arrives after is not; once every marker is in, the piece is stored,
    /// and a restore delivers the channel state again, in order.
    #[test]
    fn channel_state_is_what_arrives_between_the_recording_and_the_marker() {
        let h = Harness::new(0, 3, 1);
        let mut p = ChandyLamport::new(1);
        let a = h.run(&mut p, Event::SafePoint { index: 1 });
        assert!(a.contains(&Action::RecordState { generation: 1 }));
        let a = h.run(&mut p, Event::Recorded { generation: 1 });
        assert_eq!(markers_to(&a), vec![1, 2]);
        assert!(!a.contains(&Action::StoreRecorded { generation: 1 }));
        // From rank 1: two messages, then its marker, then a third.
        for ssn in [1, 2] {
            assert!(arrive(&h, &mut p, &app_message(1, 0, ssn, 8)).is_empty());
        }
        let a = h.control(&mut p, 1, Control::Marker { generation: 1 });
        assert!(a.is_empty(), "rank 2's channel is still open: {a:?}");
        assert!(arrive(&h, &mut p, &app_message(1, 0, 3, 8)).is_empty());
        // From rank 2: one message, then its marker closes the last channel.
        assert!(arrive(&h, &mut p, &app_message(2, 0, 7, 4)).is_empty());
        let a = h.control(&mut p, 2, Control::Marker { generation: 1 });
        assert_eq!(a, vec![Action::StoreRecorded { generation: 1 }]);
        let pool = BufferPool::new();
        let mut w = PieceWriter::new(&pool, Vec::new());
        p.save_state(&mut w).expect("saves");
        let piece = w.finish().to_bytes();
        // Stored: the next generation starts afresh.
        h.run(&mut p, Event::PieceStored { generation: 1 });
        let mut restored = ChandyLamport::new(1);
        restored.load_state(piece).expect("loads");
        let a = h.run(
            &mut restored,
            Event::Restored {
                generation: Some(1),
            },
        );
        assert_eq!(delivered(&a), vec![1, 2, 7], "rank 1's two, then rank 2's");
    }

    /// A message that arrives after its channel's marker, before this rank
    /// has recorded, was sent after the sender's cut: it is held, and
    /// delivered once this rank records (not as channel state). Other
    /// channels are not held.
    #[test]
    fn a_message_after_the_marker_waits_for_the_recording() {
        let h = Harness::new(2, 3, 1);
        let mut p = ChandyLamport::new(2);
        h.run(&mut p, Event::SafePoint { index: 1 });
        assert!(
            h.control(&mut p, 0, Control::Marker { generation: 1 })
                .is_empty()
        );
        assert_eq!(
            arrive(&h, &mut p, &app_message(0, 2, 1, 8)),
            vec![Action::Hold]
        );
        assert_eq!(
            arrive(&h, &mut p, &app_message(0, 2, 2, 8)),
            vec![Action::Hold]
        );
        assert!(arrive(&h, &mut p, &app_message(1, 2, 1, 8)).is_empty());
        h.run(&mut p, Event::SafePoint { index: 2 });
        let a = h.run(&mut p, Event::Recorded { generation: 1 });
        assert_eq!(delivered(&a), vec![1, 2]);
        assert_eq!(markers_to(&a), vec![0, 1]);
        // Rank 0's channel closed before the recording: only rank 1's is
        // open, and its marker stores the piece with empty channel state.
        assert!(arrive(&h, &mut p, &app_message(0, 2, 3, 8)).is_empty());
        let a = h.control(&mut p, 1, Control::Marker { generation: 1 });
        assert_eq!(a, vec![Action::StoreRecorded { generation: 1 }]);
    }

    /// A marker of a later generation keeps its channel held through the
    /// recording of an earlier one.
    #[test]
    fn a_later_generations_marker_holds_past_an_earlier_recording() {
        let h = Harness::new(1, 2, 1);
        let mut p = ChandyLamport::new(1);
        h.control(&mut p, 0, Control::Marker { generation: 1 });
        assert_eq!(
            arrive(&h, &mut p, &app_message(0, 1, 1, 8)),
            vec![Action::Hold]
        );
        h.control(&mut p, 0, Control::Marker { generation: 2 });
        assert_eq!(
            arrive(&h, &mut p, &app_message(0, 1, 2, 8)),
            vec![Action::Hold]
        );
        h.run(&mut p, Event::SafePoint { index: 1 });
        let a = h.run(&mut p, Event::Recorded { generation: 1 });
        assert_eq!(delivered(&a), vec![1], "only what followed marker 1");
        assert!(a.contains(&Action::StoreRecorded { generation: 1 }));
        h.run(&mut p, Event::PieceStored { generation: 1 });
        h.run(&mut p, Event::SafePoint { index: 2 });
        let a = h.run(&mut p, Event::Recorded { generation: 2 });
        assert_eq!(delivered(&a), vec![2]);
        assert!(a.contains(&Action::StoreRecorded { generation: 2 }));
    }

    /// Pieces go to the store in generation order, one at a time.
    #[test]
    fn pieces_are_stored_in_generation_order() {
        let h = Harness::new(0, 2, 1);
        let mut p = ChandyLamport::new(1);
        h.run(&mut p, Event::SafePoint { index: 1 });
        h.run(&mut p, Event::Recorded { generation: 1 });
        h.run(&mut p, Event::SafePoint { index: 2 });
        h.run(&mut p, Event::Recorded { generation: 2 });
        // Rank 1's markers of both generations: generation 1 first.
        let a = h.control(&mut p, 1, Control::Marker { generation: 1 });
        assert_eq!(a, vec![Action::StoreRecorded { generation: 1 }]);
        let a = h.control(&mut p, 1, Control::Marker { generation: 2 });
        assert!(a.is_empty(), "generation 1 is still being stored");
        let a = h.run(&mut p, Event::PieceStored { generation: 1 });
        assert!(
            a.contains(&Action::StoreRecorded { generation: 2 }),
            "{a:?}"
        );
    }

    /// A failure forgets held messages and recordings, and rolls back.
    #[test]
    fn a_failure_forgets_the_wave_and_rolls_back() {
        let h = Harness::new(1, 2, 1);
        let mut p = ChandyLamport::new(1);
        h.control(&mut p, 0, Control::Marker { generation: 1 });
        arrive(&h, &mut p, &app_message(0, 1, 1, 8));
        let a = h.run(
            &mut p,
            Event::PeerFailed {
                epoch: 1,
                dead: &[0],
            },
        );
        assert!(a.contains(&Action::Rollback { epoch: 1 }));
        assert!(p.held.is_empty() && p.marked.is_empty() && p.recordings.is_empty());
    }
}
