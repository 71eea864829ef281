//! Checkpoint storage, orthogonal to the protocol.
//!
//! A protocol decides *when* a rank saves and *which generation* recovery uses;
//! the store decides *where* the pieces live and moves them. A piece is one
//! rank's checkpoint for one generation, carrying a CRC32C so corruption is
//! detected. A generation is usable only once its commit record is written
//! (after every piece of it is stored).
//!
//! Levels: [`partner`] (a copy on a rank in another failure domain, always
//! on) and [`disk`] (atomic piece files and commit records in a directory,
//! every N-th generation; restart selection with fallback; `inspect`),
//! combined by [`levels::MultiLevel`] (`--storage partner --storage
//! disk:DIR@N`, `--restart DIR`). [`codec`] (XOR and Reed–Solomon parity with
//! a CRC32C per shard) is the building block of the `xor` and `rs:M` levels,
//! which are not selectable yet.

pub mod codec;
pub mod disk;
pub mod levels;
pub mod partner;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::{Error, Rank, Result};

/// One rank's checkpoint for one generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Piece {
    /// Generation number.
    pub generation: u64,
    /// The rank whose state this is.
    pub owner: Rank,
    /// The encoded state.
    pub data: Bytes,
    /// CRC32C of `data`, computed when the piece was made.
    pub crc: u32,
}

impl Piece {
    /// Make a piece, computing its checksum.
    pub fn new(generation: u64, owner: Rank, data: Bytes) -> Self {
        let crc = crc32c::crc32c(&data);
        Piece {
            generation,
            owner,
            data,
            crc,
        }
    }

    /// Check the data against its checksum.
    pub fn verify(&self) -> Result<()> {
        let got = crc32c::crc32c(&self.data);
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
    fn fetch(&mut self, generation: u64, holder: Rank, out: &mut StoreOut);
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
    /// in-flight transfers (at the start of a recovery decision).
    fn retain_only(&mut self, keep: Option<u64>);
    /// Forget in-flight transfers (a new failure interrupted them).
    fn abort_transfers(&mut self);
    /// Bytes of checkpoint data held here (own and others' pieces).
    fn bytes_held(&self) -> usize;
}
