//! Checkpoint storage, orthogonal to the protocol.
//!
//! A protocol decides *when* a rank saves and *which generation* recovery uses;
//! the store decides *where* the pieces live and moves them. A piece is one
//! rank's checkpoint for one generation, carrying a CRC32C so corruption is
//! detected. A generation is usable only once its commit record is written
//! (after every piece of it is stored).
//!
//! Levels ([`levels`] has the schedule rules and the `--storage` syntax):
//! [`partner`] (a copy on a rank in another failure domain; the default),
//! [`erasure`] (`xor` and `rs:M`: parity over topology-aware groups, 003 §5,
//! built on [`codec`]), and [`disk`] (atomic piece files and commit records
//! in a directory; restart selection with fallback; `inspect`), combined by
//! [`levels::MultiLevel`] into a multi-level schedule (`--storage xor
//! --storage disk:DIR@5`, `--restart DIR`).
//!
//! At a recovery the store answers the protocol's leader: which pieces each
//! rank holds ([`CheckpointStore::held`]) and which parity shards
//! ([`CheckpointStore::parity_held`]), whether a piece held nowhere can be
//! rebuilt ([`CheckpointStore::can_rebuild`]), whether redundancy was lost
//! and must be re-created ([`CheckpointStore::redundancy_lost`]). Before the
//! inventory, [`CheckpointStore::scrub`] drops every piece and shard that
//! fails its checksum and reports it, so damaged data counts as lost and a
//! corrupted level falls back to another level or an older generation.

pub mod codec;
pub mod disk;
pub mod erasure;
pub mod levels;
pub mod partner;
pub mod piece;
pub mod pool;
pub mod spill;

pub use piece::PieceWriter;

use std::collections::{HashMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::segments::Segments;
use crate::{Error, Rank, Result};

/// One rank's checkpoint for one generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// Generation number.
    pub generation: u64,
    /// The rank whose state this is.
    pub owner: Rank,
    /// The encoded state.
    pub data: Segments,
    /// CRC32C of `data`, computed when the piece was made.
    pub crc: u32,
    /// The memory `crc` was computed over in this process, if it was.
    #[serde(skip)]
    pub(crate) summed: SummedHere,
}

/// Where a piece's checksum was computed from its bytes in this process:
/// `(address, length)` of each segment, and the checksum. `Bytes` are
/// immutable, so a piece whose data is still that very memory needs no
/// second pass to be known sound (a partner on the threads backend receives
/// the owner's buffers themselves; every piece that crossed a process
/// boundary, or whose data was replaced, is checked). Not part of a piece's
/// value: always equal.
#[derive(Debug, Clone, Default)]
pub(crate) struct SummedHere(Option<(Vec<(usize, usize)>, u32)>);

impl PartialEq for SummedHere {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for SummedHere {}

impl Piece {
    /// Make a piece, computing its checksum.
    pub fn new(generation: u64, owner: Rank, data: impl Into<Segments>) -> Self {
        let data = data.into();
        let crc = data.crc32c();
        Piece {
            generation,
            owner,
            summed: SummedHere(Some((data.fingerprint(), crc))),
            data,
            crc,
        }
    }

    /// [`Piece::verify`], skipped when the checksum was computed in this
    /// process over the very bytes the piece still holds (see
    /// `SummedHere`): what a store runs on a piece it is given to keep.
    pub fn verify_received(&self) -> Result<()> {
        if let Some((at, crc)) = &self.summed.0
            && *crc == self.crc
            && *at == self.data.fingerprint()
        {
            return Ok(());
        }
        self.verify()
    }

    /// Check the data against its checksum.
    pub fn verify(&self) -> Result<()> {
        let got = self.data.crc32c();
        if got != self.crc {
            return Err(Error::CorruptCheckpoint {
                owner: self.owner,
                generation: self.generation,
                detail: format!("CRC32C {got:#010x}, expected {:#010x}", self.crc),
            });
        }
        Ok(())
    }
}

/// Messages between the stores of different ranks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum StoreMsg {
    /// Keep this piece for its owner.
    Put(Piece),
    /// The piece `(generation, owner)` is stored.
    PutAck {
        /// Generation.
        generation: u64,
        /// Owner of the piece.
        owner: Rank,
    },
    /// Send me the piece `(generation, owner)`.
    Fetch {
        /// Generation.
        generation: u64,
        /// Owner of the piece.
        owner: Rank,
    },
    /// The piece asked for.
    Piece(Piece),
    /// The answer to `Fetch` when the piece is not held here (any more).
    NotHeld {
        /// Generation.
        generation: u64,
        /// Owner of the piece.
        owner: Rank,
    },
    /// A message of the `xor` / `rs:M` level (boxed: it is much larger than
    /// the others, and every frame would pay for it).
    Erasure(Box<erasure::ErasureMsg>),
}

/// What the ranks hold, as the recovery leader learns it from their
/// inventories.
#[derive(Debug, Default, Clone)]
pub struct Inventory {
    /// `(generation, owner)` -> ranks holding that piece.
    pub pieces: HashMap<(u64, Rank), Vec<Rank>>,
    /// `(generation, holder, stripe)` of every intact parity shard.
    pub parity: HashSet<(u64, Rank, usize)>,
}

impl Inventory {
    /// Add what `holder` reported.
    pub fn add(&mut self, holder: Rank, pieces: &[(u64, Rank)], parity: &[(u64, usize)]) {
        for &piece in pieces {
            self.pieces.entry(piece).or_default().push(holder);
        }
        for &(generation, stripe) in parity {
            self.parity.insert((generation, holder, stripe));
        }
    }

    /// Whether `holder` holds `owner`'s piece of `generation`.
    pub fn holds(&self, generation: u64, owner: Rank, holder: Rank) -> bool {
        self.pieces
            .get(&(generation, owner))
            .is_some_and(|h| h.contains(&holder))
    }

    /// The ranks holding `owner`'s piece of `generation`.
    pub fn holders(&self, generation: u64, owner: Rank) -> &[Rank] {
        self.pieces
            .get(&(generation, owner))
            .map_or(&[], Vec::as_slice)
    }

    /// Whether `holder` holds an intact parity shard of `stripe` of
    /// `generation` (stripes are numbered within the holder's group).
    pub fn has_parity(&self, generation: u64, holder: Rank, stripe: usize) -> bool {
        self.parity.contains(&(generation, holder, stripe))
    }

    /// Every generation something is held of.
    pub fn generations(&self) -> Vec<u64> {
        let mut g: Vec<u64> = self
            .pieces
            .keys()
            .map(|&(g, _)| g)
            .chain(self.parity.iter().map(|&(g, _, _)| g))
            .collect();
        g.sort_unstable();
        g.dedup();
        g
    }
}

/// What the store tells the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreEvent {
    /// This rank's piece of `generation` is stored at every place the level
    /// requires (here and on the partner).
    Stored {
        /// Generation.
        generation: u64,
    },
    /// This rank's own piece of `generation` is available locally again.
    Restored {
        /// Generation.
        generation: u64,
    },
    /// Fetching this rank's piece of `generation` from `holder` failed: the
    /// copy there is damaged, or it holds none any more. The protocol may
    /// ask another holder.
    FetchFailed {
        /// Generation.
        generation: u64,
        /// The holder asked.
        holder: Rank,
        /// What went wrong, for the user.
        detail: String,
    },
}

/// Sends and events produced by a store call.
#[derive(Debug, Default)]
pub struct StoreOut {
    /// Messages to other ranks' stores.
    pub sends: Vec<(Rank, StoreMsg)>,
    /// Events for the protocol.
    pub events: Vec<StoreEvent>,
}

/// A checkpoint storage level.
pub trait CheckpointStore: Send {
    /// Level name, for summaries.
    fn name(&self) -> &'static str;
    /// Store this rank's `piece` (locally and wherever the level puts copies).
    fn put(&mut self, piece: Piece, out: &mut StoreOut) -> Result<()>;
    /// Handle a message from another rank's store.
    fn on_msg(&mut self, src: Rank, msg: StoreMsg, out: &mut StoreOut) -> Result<()>;
    /// Bring this rank's own piece of `generation` back from `holder`.
    /// Errors when this rank is the holder and can no longer read the piece
    /// (asking itself would never be answered).
    fn fetch(&mut self, generation: u64, holder: Rank, out: &mut StoreOut) -> Result<()>;
    /// Re-send this rank's piece of `generation` to where the level keeps
    /// copies (rebuild redundancy after a recovery).
    fn replicate(&mut self, generation: u64, out: &mut StoreOut) -> Result<()>;
    /// Write the commit record of `generation` and drop older generations.
    fn commit(&mut self, generation: u64) -> Result<()>;
    /// The newest generation whose commit record this rank holds.
    fn committed(&self) -> Option<u64>;
    /// Every `(generation, owner)` piece held here.
    fn held(&self) -> Vec<(u64, Rank)>;
    /// A piece held here.
    fn get(&self, generation: u64, owner: Rank) -> Option<&Piece>;
    /// Drop every piece except those of `keep` (all, if `None`) and forget
    /// in-flight transfers (at the start of a recovery decision). Errors
    /// only when a durable level cannot remove what it must.
    fn retain_only(&mut self, keep: Option<u64>) -> Result<()>;
    /// Drop every piece, parity shard and transfer of `generation`, which
    /// will never be committed (a coordinated cut found inconsistent after
    /// its capture), and nothing else: older generations a level keeps
    /// (its newest encoded one, under `xor@N`) stay. A durable level keeps
    /// its files, which no commit record names.
    fn discard(&mut self, generation: u64);
    /// Drop the pieces of `owner` older than generation `keep` (checkpoints
    /// taken by each rank alone, under message logging: each owner has its
    /// own generations).
    fn retain_owner(&mut self, owner: Rank, keep: u64);
    /// Forget in-flight transfers (a new failure interrupted them).
    fn abort_transfers(&mut self);
    /// Bytes of checkpoint data held here (own and others' pieces).
    fn bytes_held(&self) -> usize;
    /// `(generation, stripe)` of the intact parity shards held here (for the
    /// recovery inventory; levels without parity hold none).
    fn parity_held(&self) -> Vec<(u64, usize)> {
        Vec::new()
    }
    /// Recovery leader: whether `owner`'s piece of `generation`, held by no
    /// rank, can be rebuilt from what `inv` reports.
    fn can_rebuild(&self, _generation: u64, _owner: Rank, _inv: &Inventory) -> bool {
        false
    }
    /// Recovery leader: whether some redundancy of `owner`'s piece of
    /// `generation` (a partner copy, a parity shard of its group) is lost,
    /// so that `owner` must re-create it before resuming.
    fn redundancy_lost(&self, generation: u64, owner: Rank, inv: &Inventory) -> bool;
    /// Rebuild this rank's own piece of `generation` from other ranks'
    /// redundancy (the leader found it held nowhere); emits `Restored`.
    fn rebuild(&mut self, generation: u64, _out: &mut StoreOut) -> Result<()> {
        Err(Error::config(
            "storage",
            format!(
                "storage level `{}` cannot rebuild a lost piece (generation {generation})",
                self.name()
            ),
        ))
    }
    /// Check everything held against its checksum, drop what fails and
    /// return one error per damaged piece or shard (at the start of a
    /// recovery, so that damaged data counts as lost in the inventory).
    fn scrub(&mut self) -> Vec<Error> {
        Vec::new()
    }
}
