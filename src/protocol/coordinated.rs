//! Protocol `coordinated`: blocking coordinated checkpointing (004 §2.2, the
//! "coordinated checkpoint" of 003 §3.1).
//!
//! **Checkpoint.** Every `every`-th safe point is a checkpoint of generation
//! `g`. Each rank silences its channels by sending a `Marker(g)` to every other
//! rank after its last application message and waits for the markers of all
//! others: channels are FIFO, so every message sent before the checkpoint has
//! then arrived (it is either consumed or in the unexpected queue, which the
//! engine saves with the application state). No message is in transit, so the
//! set of saved states is a consistent cut without channel state. The rank
//! then captures its piece and hands it to the store; once the store has it
//! locally and on the partner, the rank reports `Stored(g)` to the coordinator
//! (rank 0), which, when every rank reported, sends the commit record
//! `Commit(g)`. Only a committed generation is ever restored. The rank blocks
//! until the commit (blocking coordinated checkpointing), so no message of the
//! next interval can cross the cut.
//!
//! **Recovery.** Any failure rolls every rank back. Survivors and replacements
//! send an `Inventory` (newest commit record seen, pieces held) to the recovery
//! leader (rank 0). The leader picks the newest committed generation of which
//! every rank's piece survives somewhere, names a holder for each piece, and
//! says whose partner copy was lost. Each rank fetches its piece, re-creates its
//! partner copy if needed (so the replacement is protected again), and reports
//! `Ready`; the leader then sends `Go` and every rank restarts its rank
//! function from that generation. A failure during any of this simply starts a
//! new recovery in the new epoch (frames of the old epoch are dropped).

use std::collections::{BTreeMap, BTreeSet};

use super::{Action, Control, Event, Protocol, ProtocolCx};
use crate::Rank;

/// The coordinator of checkpoints and the leader of recoveries.
const LEADER: Rank = 0;

/// What a rank reports at recovery: its newest commit record and the
/// `(generation, owner)` pieces it holds.
type Inventory = (Option<u64>, Vec<(u64, Rank)>);

#[derive(Debug, Default)]
struct Recovery {
    /// Inventories received (leader only).
    inventories: BTreeMap<Rank, Inventory>,
    /// Generation decided.
    decided: Option<Option<u64>>,
    /// Whether this rank must re-create its partner copy.
    replicate: bool,
    /// Ranks ready (leader only).
    ready: BTreeSet<Rank>,
}

/// State of the coordinated protocol on one rank.
#[derive(Debug)]
pub struct Coordinated {
    every: u64,
    next_generation: u64,
    /// Generation this rank is saving, if any.
    saving: Option<u64>,
    captured: bool,
    /// Markers received per generation (they may arrive before our own safe point).
    markers: BTreeMap<u64, BTreeSet<Rank>>,
    /// Coordinator: ranks whose piece is stored, per generation.
    stored: BTreeMap<u64, BTreeSet<Rank>>,
    recovery: Option<Recovery>,
}

impl Coordinated {
    /// Checkpoint at every `every`-th safe point (0 disables checkpoints).
    pub fn new(every: u64) -> Self {
        Coordinated {
            every,
            next_generation: 1,
            saving: None,
            captured: false,
            markers: BTreeMap::new(),
            stored: BTreeMap::new(),
            recovery: None,
        }
    }

    fn maybe_capture(&mut self, cx: &mut ProtocolCx<'_>) {
        if let Some(g) = self.saving
            && !self.captured
            && self.markers.get(&g).map_or(0, |s| s.len()) + 1 >= cx.size
        {
            self.captured = true;
            cx.emit(Action::Capture { generation: g });
        }
    }

    fn on_commit(&mut self, generation: u64, cx: &mut ProtocolCx<'_>) {
        cx.emit(Action::Commit { generation });
        self.markers.remove(&generation);
        if self.saving == Some(generation) {
            self.saving = None;
            self.captured = false;
            cx.emit(Action::ReleaseSafePoint);
        }
    }

    /// Leader: choose the generation to restore from the inventories.
    fn decide(inv: &BTreeMap<Rank, Inventory>, cx: &ProtocolCx<'_>) -> Control {
        let newest = inv.values().filter_map(|(c, _)| *c).max();
        let holder_of = |g: u64, owner: Rank| -> Option<Rank> {
            if inv
                .get(&owner)
                .is_some_and(|(_, h)| h.contains(&(g, owner)))
            {
                return Some(owner);
            }
            inv.iter()
                .find(|(_, (_, h))| h.contains(&(g, owner)))
                .map(|(&r, _)| r)
        };
        if let Some(g) = newest {
            let holders: Option<Vec<Rank>> = (0..cx.size).map(|r| holder_of(g, r)).collect();
            if let Some(holders) = holders {
                let partner_has = (0..cx.size)
                    .map(|r| {
                        cx.placement
                            .partner(r)
                            .is_none_or(|p| inv.get(&p).is_some_and(|(_, h)| h.contains(&(g, r))))
                    })
                    .collect();
                return Control::Decision {
                    generation: Some(g),
                    holders,
                    partner_has,
                };
            }
        }
        // No committed generation survives whole: restart from the beginning
        // (a valid, if costly, rollback).
        Control::Decision {
            generation: None,
            holders: (0..cx.size).collect(),
            partner_has: vec![true; cx.size],
        }
    }

    fn ready(&mut self, cx: &mut ProtocolCx<'_>) {
        cx.emit(Action::Transmit {
            dest: LEADER,
            msg: Control::Ready,
        });
    }

    fn on_control(&mut self, src: Rank, msg: Control, cx: &mut ProtocolCx<'_>) {
        match msg {
            Control::Marker { generation } => {
                self.markers.entry(generation).or_default().insert(src);
                self.maybe_capture(cx);
            }
            Control::Stored { generation } => {
                let set = self.stored.entry(generation).or_default();
                set.insert(src);
                if set.len() == cx.size {
                    self.stored.remove(&generation);
                    cx.broadcast(&Control::Commit { generation });
                    self.on_commit(generation, cx);
                }
            }
            Control::Commit { generation } => self.on_commit(generation, cx),
            Control::Inventory { committed, held } => {
                let Some(rec) = self.recovery.as_mut() else {
                    return;
                };
                rec.inventories.insert(src, (committed, held));
                if rec.inventories.len() == cx.size {
                    let decision = Self::decide(&rec.inventories, cx);
                    cx.broadcast(&decision);
                    self.on_control(cx.rank, decision, cx);
                }
            }
            Control::Decision {
                generation,
                holders,
                partner_has,
            } => {
                let Some(rec) = self.recovery.as_mut() else {
                    return;
                };
                rec.decided = Some(generation);
                rec.replicate = !partner_has.get(cx.rank).copied().unwrap_or(true);
                self.next_generation = generation.map_or(1, |g| g + 1);
                cx.emit(Action::RetainOnly { keep: generation });
                match generation {
                    Some(g) => {
                        cx.emit(Action::Commit { generation: g });
                        let holder = holders.get(cx.rank).copied().unwrap_or(cx.rank);
                        cx.emit(Action::Fetch {
                            generation: g,
                            holder,
                        });
                    }
                    None => self.ready(cx),
                }
            }
            Control::Ready => {
                let Some(rec) = self.recovery.as_mut() else {
                    return;
                };
                rec.ready.insert(src);
                if rec.ready.len() == cx.size {
                    cx.broadcast(&Control::Go);
                    self.on_control(cx.rank, Control::Go, cx);
                }
            }
            Control::Go => {
                if let Some(rec) = self.recovery.take() {
                    cx.emit(Action::Resume {
                        generation: rec.decided.flatten(),
                    });
                }
            }
        }
    }
}

impl Protocol for Coordinated {
    fn name(&self) -> &'static str {
        "coordinated"
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::SafePoint { index } => {
                if self.every == 0 || index % self.every != 0 {
                    cx.emit(Action::ReleaseSafePoint);
                    return;
                }
                let g = self.next_generation;
                self.next_generation += 1;
                self.saving = Some(g);
                self.captured = false;
                cx.broadcast(&Control::Marker { generation: g });
                self.maybe_capture(cx);
            }
            Event::Control { src, msg } => self.on_control(src, msg, cx),
            Event::PieceStored { generation } => match self.recovery.as_ref() {
                Some(rec) if rec.decided.is_some() => self.ready(cx),
                Some(_) => {}
                None => cx.emit(Action::Transmit {
                    dest: LEADER,
                    msg: Control::Stored { generation },
                }),
            },
            Event::PieceRestored { generation } => {
                let Some(rec) = self.recovery.as_ref() else {
                    return;
                };
                if rec.replicate {
                    cx.emit(Action::Replicate { generation });
                } else {
                    self.ready(cx);
                }
            }
            Event::PeerFailed { epoch, .. } => {
                self.saving = None;
                self.captured = false;
                self.markers.clear();
                self.stored.clear();
                self.recovery = None;
                cx.emit(Action::Rollback { epoch });
            }
            Event::Recover { .. } => {
                self.recovery = Some(Recovery::default());
                cx.emit(Action::Transmit {
                    dest: LEADER,
                    msg: Control::Inventory {
                        committed: cx.store.committed(),
                        held: cx.store.held(),
                    },
                });
            }
            Event::AppSend { .. } | Event::AppDeliver { .. } => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::partner::PartnerStore;
    use crate::topology::Placement;
    use std::time::Duration;

    fn run(
        p: &mut Coordinated,
        rank: Rank,
        pl: &Placement,
        store: &PartnerStore,
        ev: Event<'_>,
    ) -> Vec<Action> {
        let mut cx = ProtocolCx {
            rank,
            size: pl.ranks(),
            placement: pl,
            store,
            now: Duration::ZERO,
            actions: Vec::new(),
        };
        p.handle(ev, &mut cx);
        cx.actions
    }

    #[test]
    fn checkpoint_waits_for_all_markers_then_commit() {
        let pl = Placement::block(3, 3).expect("valid");
        let store = PartnerStore::new(1, &pl);
        let mut p = Coordinated::new(2);
        // Safe point 1 is not a checkpoint.
        let a = run(&mut p, 1, &pl, &store, Event::SafePoint { index: 1 });
        assert_eq!(a, vec![Action::ReleaseSafePoint]);
        // A marker may arrive before our own safe point.
        let m = Control::Marker { generation: 1 };
        assert!(
            run(
                &mut p,
                1,
                &pl,
                &store,
                Event::Control {
                    src: 0,
                    msg: m.clone()
                }
            )
            .is_empty()
        );
        let a = run(&mut p, 1, &pl, &store, Event::SafePoint { index: 2 });
        assert_eq!(a.len(), 2, "markers to ranks 0 and 2: {a:?}");
        let a = run(&mut p, 1, &pl, &store, Event::Control { src: 2, msg: m });
        assert_eq!(a, vec![Action::Capture { generation: 1 }]);
        let a = run(&mut p, 1, &pl, &store, Event::PieceStored { generation: 1 });
        assert_eq!(
            a,
            vec![Action::Transmit {
                dest: 0,
                msg: Control::Stored { generation: 1 }
            }]
        );
        let a = run(
            &mut p,
            1,
            &pl,
            &store,
            Event::Control {
                src: 0,
                msg: Control::Commit { generation: 1 },
            },
        );
        assert_eq!(
            a,
            vec![Action::Commit { generation: 1 }, Action::ReleaseSafePoint]
        );
    }

    #[test]
    fn leader_picks_newest_complete_generation() {
        let pl = Placement::block(4, 2).expect("valid");
        let store = PartnerStore::new(0, &pl);
        let cx = ProtocolCx {
            rank: 0,
            size: 4,
            placement: &pl,
            store: &store,
            now: Duration::ZERO,
            actions: Vec::new(),
        };
        // Rank 3 died (replacement holds nothing); its partner is rank 1.
        // Generation 2 is committed at rank 0 only; rank 2 had not seen it.
        let mut inv = BTreeMap::new();
        inv.insert(0, (Some(2), vec![(2, 0), (2, 2)]));
        inv.insert(1, (Some(2), vec![(2, 1), (2, 3)]));
        inv.insert(2, (Some(1), vec![(1, 2), (2, 2), (2, 0)]));
        inv.insert(3, (None, vec![]));
        let d = Coordinated::decide(&inv, &cx);
        assert_eq!(
            d,
            Control::Decision {
                generation: Some(2),
                holders: vec![0, 1, 2, 1],
                partner_has: vec![true, false, true, true],
            }
        );
        // Lose rank 3's only copy too: nothing complete, restart from scratch.
        inv.insert(1, (Some(2), vec![(2, 1)]));
        let d = Coordinated::decide(&inv, &cx);
        assert!(matches!(
            d,
            Control::Decision {
                generation: None,
                ..
            }
        ));
    }
}
