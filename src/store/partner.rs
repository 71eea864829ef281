//! The `partner` level: each piece is kept by its owner and by one partner
//! rank placed in another failure domain ([`Placement::partner`]), so the loss
//! of one rank, or of one whole node, loses no piece. Pieces travel as shared
//! buffers; a killed rank loses the copies it held for others (they live in
//! this struct, which dies with the rank).
//!
//! Without a partner ([`PartnerStore::local`]) it is the local store of the
//! other levels: it keeps this rank's own pieces and reports them stored at
//! once.

use std::collections::BTreeMap;

use super::{CheckpointStore, Inventory, Piece, StoreEvent, StoreMsg, StoreOut};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// In-memory partner-copy store of one rank.
#[derive(Debug)]
pub struct PartnerStore {
    rank: Rank,
    /// Ranks holding copies of this rank's pieces.
    partners: Vec<Rank>,
    /// The placement partners follow (`None`: local store only).
    placement: Option<Placement>,
    pieces: BTreeMap<(u64, Rank), Piece>,
    committed: Option<u64>,
    /// Per generation: partner copies not yet acknowledged.
    awaiting_ack: BTreeMap<u64, usize>,
    /// Our own piece being fetched back: its generation and the holder
    /// asked. Only that holder's answer counts: an answer another holder
    /// sent to an earlier fetch (of a predecessor killed during recovery,
    /// or before the protocol moved to the next holder) must neither
    /// cancel this one nor be taken for it.
    fetching: Option<(u64, Rank)>,
    /// Fault injection: damage every copy of another rank's piece stored
    /// here.
    damage: bool,
}

impl PartnerStore {
    /// Keep this rank's own piece as if it had just been stored here (a
    /// piece read back from another level).
    pub fn adopt(&mut self, piece: Piece) {
        self.pieces.insert((piece.generation, piece.owner), piece);
    }

    /// A store for `rank` in `placement`.
    pub fn new(rank: Rank, placement: &Placement) -> Self {
        PartnerStore {
            partners: placement.partner(rank).into_iter().collect(),
            placement: Some(placement.clone()),
            ..Self::local(rank)
        }
    }

    /// Keep a second copy on [`Placement::second_partner`] as well (message
    /// logging: a rank's checkpoint must survive its partner failing while
    /// the rank's replacement is still fetching it).
    pub fn with_second_copy(mut self) -> Self {
        if let Some(q) = self
            .placement
            .as_ref()
            .and_then(|pl| pl.second_partner(self.rank))
        {
            self.partners.push(q);
        }
        self
    }

    /// A store for `rank` that keeps its own pieces only (no partner copy).
    pub fn local(rank: Rank) -> Self {
        PartnerStore {
            rank,
            partners: Vec::new(),
            placement: None,
            pieces: BTreeMap::new(),
            committed: None,
            awaiting_ack: BTreeMap::new(),
            fetching: None,
            damage: false,
        }
    }

    /// Fault injection (`LevelSpec::CorruptPartnerCopiesAt`): when `on`,
    /// every copy of another rank's piece stored here gets one byte
    /// flipped after its checksum was taken, as silent memory corruption
    /// would do.
    pub fn damaging_copies(mut self, on: bool) -> Self {
        self.damage = on;
        self
    }

    fn send_copy(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        let piece = self
            .pieces
            .get(&(generation, self.rank))
            .cloned()
            .ok_or_else(|| Error::CorruptCheckpoint {
                owner: self.rank,
                generation,
                detail: "own piece missing when replicating".into(),
            })?;
        if self.partners.is_empty() {
            out.events.push(StoreEvent::Stored { generation });
        } else {
            self.awaiting_ack.insert(generation, self.partners.len());
            for &p in &self.partners {
                out.sends.push((p, StoreMsg::Put(piece.clone())));
            }
        }
        Ok(())
    }
}

impl CheckpointStore for PartnerStore {
    fn name(&self) -> &'static str {
        "partner"
    }

    fn put(&mut self, piece: Piece, out: &mut StoreOut) -> Result<()> {
        let generation = piece.generation;
        self.pieces.insert((generation, self.rank), piece);
        self.send_copy(generation, out)
    }

    fn on_msg(&mut self, src: Rank, msg: StoreMsg, out: &mut StoreOut) -> Result<()> {
        match msg {
            StoreMsg::Put(mut piece) => {
                piece.verify_received()?;
                let (generation, owner) = (piece.generation, piece.owner);
                if self.damage && !piece.data.is_empty() {
                    let mut bytes = piece.data.to_vec();
                    bytes[0] ^= 0x5a;
                    piece.data = bytes.into();
                }
                self.pieces.insert((generation, owner), piece);
                out.sends
                    .push((src, StoreMsg::PutAck { generation, owner }));
            }
            StoreMsg::PutAck { generation, owner } => {
                if owner == self.rank
                    && let Some(left) = self.awaiting_ack.get_mut(&generation)
                {
                    *left -= 1;
                    if *left == 0 {
                        self.awaiting_ack.remove(&generation);
                        out.events.push(StoreEvent::Stored { generation });
                    }
                }
            }
            StoreMsg::Fetch { generation, owner } => {
                let answer = match self.pieces.get(&(generation, owner)) {
                    Some(p) => StoreMsg::Piece(p.clone()),
                    None => StoreMsg::NotHeld { generation, owner },
                };
                out.sends.push((src, answer));
            }
            StoreMsg::Piece(piece) => {
                if piece.owner == self.rank && self.fetching == Some((piece.generation, src)) {
                    let generation = piece.generation;
                    self.fetching = None;
                    match piece.verify() {
                        Ok(()) => {
                            self.pieces.insert((generation, self.rank), piece);
                            out.events.push(StoreEvent::Restored { generation });
                        }
                        // Another holder may have a sound copy.
                        Err(e) => out.events.push(StoreEvent::FetchFailed {
                            generation,
                            holder: src,
                            detail: format!("the copy rank {src} sent is damaged: {e}"),
                        }),
                    }
                }
            }
            StoreMsg::NotHeld { generation, owner } => {
                if owner == self.rank && self.fetching == Some((generation, src)) {
                    self.fetching = None;
                    out.events.push(StoreEvent::FetchFailed {
                        generation,
                        holder: src,
                        detail: format!("rank {src} no longer holds it"),
                    });
                }
            }
            // Not this level's: a store with an erasure level routes these.
            StoreMsg::Erasure(_) => {}
        }
        Ok(())
    }

    fn fetch(&mut self, generation: u64, holder: Rank, out: &mut StoreOut) -> Result<()> {
        if self.pieces.contains_key(&(generation, self.rank)) {
            out.events.push(StoreEvent::Restored { generation });
        } else {
            self.fetching = Some((generation, holder));
            out.sends.push((
                holder,
                StoreMsg::Fetch {
                    generation,
                    owner: self.rank,
                },
            ));
        }
        Ok(())
    }

    fn replicate(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        self.send_copy(generation, out)
    }

    fn commit(&mut self, generation: u64) -> Result<()> {
        self.committed = Some(generation);
        self.pieces.retain(|&(g, _), _| g >= generation);
        self.awaiting_ack.retain(|&g, _| g >= generation);
        Ok(())
    }

    fn committed(&self) -> Option<u64> {
        self.committed
    }

    fn held(&self) -> Vec<(u64, Rank)> {
        self.pieces.keys().copied().collect()
    }

    fn get(&self, generation: u64, owner: Rank) -> Option<&Piece> {
        self.pieces.get(&(generation, owner))
    }

    fn retain_only(&mut self, keep: Option<u64>) -> Result<()> {
        self.pieces.retain(|&(g, _), _| Some(g) == keep);
        // Restarting from the beginning forgets every commit record: only
        // generations committed from now on may be restored.
        if keep.is_none() {
            self.committed = None;
        }
        self.abort_transfers();
        Ok(())
    }

    fn discard(&mut self, generation: u64) {
        self.pieces.retain(|&(g, _), _| g != generation);
        self.awaiting_ack.remove(&generation);
    }

    fn retain_owner(&mut self, owner: Rank, keep: u64) {
        self.pieces.retain(|&(g, o), _| o != owner || g >= keep);
        if owner == self.rank {
            self.awaiting_ack.retain(|&g, _| g >= keep);
        }
    }

    fn abort_transfers(&mut self) {
        self.awaiting_ack.clear();
        self.fetching = None;
    }

    fn bytes_held(&self) -> usize {
        self.pieces.values().map(|p| p.data.len()).sum()
    }

    fn redundancy_lost(&self, generation: u64, owner: Rank, inv: &Inventory) -> bool {
        self.placement
            .as_ref()
            .and_then(|pl| pl.partner(owner))
            .is_some_and(|p| !inv.holds(generation, owner, p))
    }

    fn scrub(&mut self) -> Vec<Error> {
        let mut errors = Vec::new();
        self.pieces.retain(|_, p| match p.verify() {
            Ok(()) => true,
            Err(e) => {
                errors.push(e);
                false
            }
        });
        errors
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn put_replicates_and_acks() {
        let pl = Placement::block(4, 2).expect("valid");
        let mut a = PartnerStore::new(0, &pl);
        let mut b = PartnerStore::new(2, &pl);
        let mut out = StoreOut::default();
        a.put(Piece::new(1, 0, Bytes::from_static(b"state")), &mut out)
            .expect("stored");
        assert!(out.events.is_empty());
        let (dest, msg) = out.sends.pop().expect("a copy goes to the partner");
        assert_eq!(dest, 2);
        let mut out_b = StoreOut::default();
        b.on_msg(0, msg, &mut out_b).expect("valid piece");
        assert_eq!(b.held(), vec![(1, 0)]);
        let (_, ack) = out_b.sends.pop().expect("ack");
        a.on_msg(2, ack, &mut out).expect("ack");
        assert_eq!(out.events, vec![StoreEvent::Stored { generation: 1 }]);
    }

    /// A fetch that gets a damaged copy, or none, reports it as an event
    /// naming the holder (the protocol asks another one) instead of failing
    /// the rank.
    #[test]
    fn a_damaged_or_missing_copy_is_a_failed_fetch() {
        let pl = Placement::block(4, 2).expect("valid");
        let mut owner = PartnerStore::new(0, &pl);
        let mut holder = PartnerStore::new(2, &pl);
        // The holder lost everything: it says so.
        let mut out = StoreOut::default();
        owner.fetch(3, 2, &mut out).expect("asks");
        let (dest, ask) = out.sends.pop().expect("a fetch");
        assert_eq!(dest, 2);
        let mut at_holder = StoreOut::default();
        holder.on_msg(0, ask, &mut at_holder).expect("answers");
        let (_, answer) = at_holder.sends.pop().expect("an answer");
        assert_eq!(
            answer,
            StoreMsg::NotHeld {
                generation: 3,
                owner: 0
            }
        );
        let mut out = StoreOut::default();
        owner
            .on_msg(2, answer, &mut out)
            .expect("an event, not an error");
        assert!(matches!(
            out.events.as_slice(),
            [StoreEvent::FetchFailed { generation: 3, holder: 2, detail }] if detail.contains("no longer holds")
        ));
        // A damaged copy from another holder.
        let mut out = StoreOut::default();
        owner.fetch(3, 1, &mut out).expect("asks again");
        let mut p = Piece::new(3, 0, Bytes::from_static(b"state"));
        p.crc ^= 1;
        let mut out = StoreOut::default();
        owner
            .on_msg(1, StoreMsg::Piece(p), &mut out)
            .expect("an event, not an error");
        assert!(matches!(
            out.events.as_slice(),
            [StoreEvent::FetchFailed { generation: 3, holder: 1, detail }] if detail.contains("damaged")
        ));
        assert!(owner.get(3, 0).is_none(), "the damaged copy is not kept");
        // A sound copy after all.
        owner.fetch(3, 2, &mut StoreOut::default()).expect("asks");
        let mut out = StoreOut::default();
        owner
            .on_msg(
                2,
                StoreMsg::Piece(Piece::new(3, 0, Bytes::from_static(b"state"))),
                &mut out,
            )
            .expect("restored");
        assert_eq!(out.events, vec![StoreEvent::Restored { generation: 3 }]);
    }

    /// Answers to a fetch count only from the holder asked: a stale
    /// `NotHeld` or `Piece` another holder sent to an earlier fetch (a
    /// predecessor killed during its recovery asked it) neither cancels the
    /// fetch under way nor completes it (defect 1 of issue 33: the real
    /// answer was then ignored and the replacement waited for ever).
    #[test]
    fn only_the_holder_asked_answers_a_fetch() {
        let pl = Placement::block(6, 3).expect("valid");
        let mut owner = PartnerStore::new(0, &pl);
        let mut out = StoreOut::default();
        owner.fetch(4, 2, &mut out).expect("asks");
        assert_eq!(
            out.sends,
            vec![(
                2,
                StoreMsg::Fetch {
                    generation: 4,
                    owner: 0
                }
            )]
        );
        let mut out = StoreOut::default();
        let stale = StoreMsg::NotHeld {
            generation: 4,
            owner: 0,
        };
        owner.on_msg(4, stale, &mut out).expect("ignored");
        let stale_piece = StoreMsg::Piece(Piece::new(4, 0, Bytes::from_static(b"state")));
        owner.on_msg(5, stale_piece, &mut out).expect("ignored");
        assert!(out.events.is_empty(), "{:?}", out.events);
        assert!(owner.get(4, 0).is_none());
        let mut out = StoreOut::default();
        let answer = StoreMsg::Piece(Piece::new(4, 0, Bytes::from_static(b"state")));
        owner.on_msg(2, answer, &mut out).expect("restored");
        assert_eq!(out.events, vec![StoreEvent::Restored { generation: 4 }]);
    }

    #[test]
    fn corrupt_piece_is_refused() {
        let pl = Placement::block(2, 2).expect("valid");
        let mut b = PartnerStore::new(1, &pl);
        let mut p = Piece::new(1, 0, Bytes::from_static(b"state"));
        p.crc ^= 1;
        let err = b.on_msg(0, StoreMsg::Put(p), &mut StoreOut::default());
        assert!(matches!(
            err,
            Err(Error::CorruptCheckpoint { owner: 0, .. })
        ));
        assert!(b.held().is_empty());
        // Data replaced after the checksum was taken (another buffer).
        let mut p = Piece::new(1, 0, Bytes::from_static(b"state"));
        p.data = Bytes::from_static(b"stale").into();
        let err = b.on_msg(0, StoreMsg::Put(p), &mut StoreOut::default());
        assert!(matches!(
            err,
            Err(Error::CorruptCheckpoint { owner: 0, .. })
        ));
        // A piece that crossed a process boundary is checked again: its
        // bytes damaged on the way, its CRC intact.
        let p = Piece::new(1, 0, Bytes::from_static(b"state"));
        let mut encoded = postcard::to_allocvec(&p).expect("encodes");
        let at = (encoded.windows(5))
            .position(|w| w == b"state")
            .expect("data in the encoding");
        encoded[at] ^= 1;
        let wire: Piece = postcard::from_bytes(&encoded).expect("decodes");
        assert_eq!(wire.crc, p.crc);
        let err = b.on_msg(0, StoreMsg::Put(wire), &mut StoreOut::default());
        assert!(matches!(
            err,
            Err(Error::CorruptCheckpoint { owner: 0, .. })
        ));
        assert!(b.held().is_empty());
    }
}
