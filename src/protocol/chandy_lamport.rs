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
    /// this rank has not recorded yet: `(that generation, message)`.
    held: VecDeque<(u64, AppMessage)>,
    /// The generation whose piece is being written (`save_state`).
    storing: Option<u64>,
    /// Channel state of the restored generation, delivered at `Restored`.
    restored: Vec<AppMessage>,
    counts: Counts,
}

impl ChandyLamport {
    /// Record a generation at every `every`-th safe point (0 disables
    /// checkpoints).
    pub fn new(every: u64) -> Self {
        ChandyLamport {
            every,
            inner: Coordinated::new(every),
            recorded: 0,
            recordings: BTreeMap::new(),
            marked: BTreeMap::new(),
            held: VecDeque::new(),
            storing: None,
            restored: Vec::new(),
            counts: Counts::default(),
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
        while let Some(i) = self.held.iter().position(|(h, _)| *h <= g) {
            if let Some((_, msg)) = self.held.remove(i) {
                cx.emit(Action::Deliver { msg });
            }
        }
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
        let marked = self.marked.get(&src).copied().unwrap_or(0);
        if marked > self.recorded {
            // After the sender's cut of a generation this rank has not
            // recorded: an orphan if the application took it now.
            self.held.push_back((marked, msg.clone()));
            self.counts.held += 1;
            cx.emit(Action::Hold);
            return;
        }
        for rec in self.recordings.values_mut() {
            if rec.open.contains(&src) {
                rec.messages.push(msg.clone());
                self.counts.channel_messages += 1;
                self.counts.channel_bytes += msg.payload.len() as u64;
            }
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

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::SafePoint { index } => {
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
