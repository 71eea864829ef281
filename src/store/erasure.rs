//! The `xor` and `rs:M` levels: erasure-coded checkpoint groups (003 §5).
//!
//! # Groups (003 §5, "Groups of Processes" and §5.1)
//!
//! Ranks are split into groups; a group of `k` members with `m` parity
//! shards per stripe survives any `m` concurrent losses of its members
//! (`m = 1` for `xor`, `m = M` for `rs:M`). 003 §5.1 calls a placement
//! topology-aware when no more than `m` members of one group share a failure
//! domain: then a whole node may die and every group loses at most `m`
//! members. [`Groups::new`] builds such groups from the block placement by
//! dealing ranks out round-robin over the nodes (node 0's first rank, node
//! 1's first rank, …, node 0's second rank, …) and cutting that order into
//! balanced groups of at most `min(cap, m · nodes)` members, where
//! `cap = max(8, 2m)` (8 is SCR's default XOR set size; `2m` keeps at least
//! as many data shards as parity shards per stripe). Every group has at least
//! `m + 1` members. When the placement makes topology awareness impossible
//! (one node, or uneven nodes) groups are still formed and
//! [`Groups::topology_aware`] says so: **with a single node every group sits
//! in one failure domain and the level protects against rank failures only**,
//! exactly like the partner level on one node.
//!
//! # Stripes: parity never sits with the data it protects
//!
//! Keeping a group's parity on a dedicated checksum process (003 §7) costs
//! extra processes; keeping it on an ordinary member would lose the parity
//! together with that member's data. So, as SCR does for XOR, each member's
//! piece is cut into `k − m` chunks and the group is coded as `k` stripes:
//! stripe `s` holds its parity shards on members `s, s+1, …, s+m−1` (mod `k`)
//! and its `k − m` data shards are one chunk from each of the other members.
//! Each member is in exactly one way in each stripe (data or one parity
//! shard), so losing any `m` members loses at most `m` shards of every
//! stripe, which the code rebuilds. Memory per member: its own piece plus
//! `m / (k − m)` of a piece of parity. Member `s` encodes stripe `s`: the
//! data members send it their chunk, it computes the parity (with
//! [`Coder`], XOR or Reed–Solomon) and sends shard `j` to member `s + j`.
//! Every shard carries its CRC32C, and the stripe's metadata the CRC32C of
//! every data chunk and of every whole piece.
//!
//! A rank reports its piece stored when the stripe it encodes is encoded and
//! every parity holder acknowledged its shard; the coordinated protocol
//! commits only when every rank reported, so a committed generation has all
//! its shards stored.
//!
//! # Recovery
//!
//! The recovery leader asks [`ErasureLevel::can_rebuild`] whether a piece
//! that no rank holds can be rebuilt from what the inventories report
//! (survivors' own pieces, intact parity shards). The owner then sends a
//! rebuild request to every other member of its group, collects their
//! chunks and parity shards for the stripes it has data in, and decodes.
//! Shards are checksummed before use: [`ErasureLevel::scrub`] drops (and
//! reports) parity shards that fail their CRC before the inventory is sent,
//! so the leader counts them as lost and picks another level or an older
//! generation; a chunk whose CRC differs from the one recorded at encoding
//! is left out of the decoding (treated as lost) too.
//!
//! After a recovery the redundancy is rebuilt **immediately**: when any
//! parity shard of a group is missing (its holder died, or it was corrupt),
//! every member of the group re-encodes the restored generation before
//! reporting ready. Waiting for the next checkpoint would leave the group
//! with fewer than `m` tolerable losses, or none for `xor`, for a whole
//! interval, and a second failure in that window is exactly the correlated
//! case these levels exist for; the cost is one encoding, the same as a
//! checkpoint's, paid while every rank is stopped anyway.

use std::collections::{BTreeMap, HashMap};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::codec::{Code, Coder, Encoded, GroupLabel, Shard};
use super::{Inventory, Piece, StoreEvent, StoreMsg, StoreOut};
use crate::topology::Placement;
use crate::{Error, Rank, Result};

/// Groups never grow past `max(DEFAULT_GROUP_CAP, 2m)` members.
pub const DEFAULT_GROUP_CAP: usize = 8;

/// The encoding groups of a job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Groups {
    code: Code,
    groups: Vec<Vec<Rank>>,
    /// Per rank: its group and its position in it.
    index: Vec<(usize, usize)>,
    topology_aware: bool,
}

impl Groups {
    /// Topology-aware groups for `code` over `placement` (see the module
    /// documentation). Errors when the job has fewer than `m + 1` ranks or
    /// the code cannot be computed over the resulting stripes.
    pub fn new(placement: &Placement, code: Code) -> Result<Self> {
        let m = code.parity_shards();
        let ranks = placement.ranks();
        let nodes = placement.nodes();
        if m == 0 || ranks < m + 1 {
            return Err(Error::config(
                "storage",
                format!("{code} needs at least {} ranks, the job has {ranks}", m + 1),
            ));
        }
        let per_node: Vec<Vec<Rank>> = (0..nodes).map(|n| placement.ranks_on(n)).collect();
        let depth = per_node.iter().map(Vec::len).max().unwrap_or(0);
        let order: Vec<Rank> = (0..depth)
            .flat_map(|i| per_node.iter().filter_map(move |on| on.get(i).copied()))
            .collect();
        let cap = DEFAULT_GROUP_CAP.max(2 * m);
        // With several nodes, more than m·nodes members would put more than m
        // of them on some node (003 §5.1, eq. 6).
        let target = if nodes > 1 { cap.min(m * nodes) } else { cap };
        let target = target.max(m + 1);
        let mut count = ranks.div_ceil(target);
        while count > 1 && ranks / count < m + 1 {
            count -= 1;
        }
        let (base, extra) = (ranks / count, ranks % count);
        let mut groups = Vec::with_capacity(count);
        let mut at = 0;
        for g in 0..count {
            let len = base + usize::from(g < extra);
            groups.push(order[at..at + len].to_vec());
            at += len;
        }
        let mut index = vec![(0, 0); ranks];
        for (g, members) in groups.iter().enumerate() {
            for (pos, &r) in members.iter().enumerate() {
                index[r] = (g, pos);
            }
        }
        let topology_aware = nodes > 1
            && groups.iter().all(|members| {
                let mut on = HashMap::new();
                members.iter().all(|&r| {
                    let c = on.entry(placement.node_of(r)).or_insert(0);
                    *c += 1;
                    *c <= m
                })
            });
        if let Code::ReedSolomon { .. } = code {
            for members in &groups {
                // Each stripe codes k − m data shards; check it once here.
                super::codec::encode(code, &vec![&[][..]; members.len() - m])?;
            }
        }
        Ok(Groups {
            code,
            groups,
            index,
            topology_aware,
        })
    }

    /// The groups, each in member-position order.
    pub fn groups(&self) -> &[Vec<Rank>] {
        &self.groups
    }

    /// The members of `rank`'s group.
    pub fn group_of(&self, rank: Rank) -> &[Rank] {
        self.index
            .get(rank)
            .map_or(&[][..], |&(g, _)| self.groups[g].as_slice())
    }

    /// Whether no group has more than `m` members on one node (003 §5.1):
    /// then a node failure is always recoverable by this level.
    pub fn topology_aware(&self) -> bool {
        self.topology_aware
    }

    fn geometry(&self, rank: Rank) -> Option<(Geometry, usize, &[Rank])> {
        let &(g, pos) = self.index.get(rank)?;
        let members = self.groups[g].as_slice();
        Some((
            Geometry {
                k: members.len(),
                m: self.code.parity_shards(),
            },
            pos,
            members,
        ))
    }
}

/// Stripe layout of a group of `k` members with `m` parity shards per stripe.
#[derive(Debug, Clone, Copy)]
struct Geometry {
    k: usize,
    m: usize,
}

impl Geometry {
    /// Data shards per stripe, which is also the number of chunks a piece is
    /// cut into.
    fn data(self) -> usize {
        self.k - self.m
    }

    /// Position of the member whose chunk `t` is data shard `t` of stripe `s`.
    fn data_member(self, s: usize, t: usize) -> usize {
        (s + self.m + t) % self.k
    }

    /// Position of the member holding parity shard `j` of stripe `s` (the
    /// holder of shard 0 encodes the stripe).
    fn parity_member(self, s: usize, j: usize) -> usize {
        (s + j) % self.k
    }

    /// The stripe that chunk `c` of the member at position `x` is data of.
    fn stripe_of_chunk(self, x: usize, c: usize) -> usize {
        (x + 2 * self.k - self.m - c) % self.k
    }

    /// Whether the member at position `x` has data (not parity) in stripe `s`.
    fn is_data(self, s: usize, x: usize) -> bool {
        (x + self.k - s) % self.k >= self.m
    }
}

/// Byte range of chunk `c` of a piece of `len` bytes cut into `parts` chunks
/// (the last ones may be shorter or empty; the codec pads them).
fn chunk_range(len: usize, parts: usize, c: usize) -> std::ops::Range<usize> {
    let q = len.div_ceil(parts.max(1));
    let start = (c * q).min(len);
    start..((c + 1) * q).min(len)
}

/// Chunk `c` of `piece` cut into `parts` chunks (a zero-copy slice when it lies
/// in one segment of the piece).
fn chunk_of(piece: &Piece, parts: usize, c: usize) -> Chunk {
    let data = piece.data.slice(chunk_range(piece.data.len(), parts, c));
    Chunk {
        index: c,
        owner: piece.owner,
        crc: crc32c::crc32c(&data),
        data,
        piece_len: piece.data.len() as u64,
        piece_crc: piece.crc,
    }
}

/// What a parity holder needs to decode its stripe, made by the encoder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StripeMeta {
    /// Code, data shard lengths and shard length (its `parity` is empty: each
    /// holder keeps its own shard next to the metadata).
    pub encoded: Encoded,
    /// Owner rank of each data shard.
    pub owners: Vec<Rank>,
    /// CRC32C of each data chunk.
    pub chunk_crcs: Vec<u32>,
    /// Length of each data owner's whole piece.
    pub piece_lens: Vec<u64>,
    /// CRC32C of each data owner's whole piece.
    pub piece_crcs: Vec<u32>,
}

/// A data chunk on its way to the encoder of its stripe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Data shard index in the stripe (equal to the chunk's index in its piece).
    pub index: usize,
    /// The piece's owner.
    pub owner: Rank,
    /// Chunk bytes.
    pub data: Bytes,
    /// CRC32C of `data`.
    pub crc: u32,
    /// Length of the whole piece.
    pub piece_len: u64,
    /// CRC32C of the whole piece.
    pub piece_crc: u32,
}

/// Messages of the erasure-coded levels (carried in [`StoreMsg::Erasure`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErasureMsg {
    /// A data chunk for the stripe `stripe` of `generation`, to its encoder.
    Chunk {
        /// Generation.
        generation: u64,
        /// Stripe, by the position of its encoder in the group.
        stripe: usize,
        /// The chunk.
        chunk: Chunk,
    },
    /// A parity shard to keep.
    Parity {
        /// Generation.
        generation: u64,
        /// Stripe.
        stripe: usize,
        /// How to decode the stripe.
        meta: StripeMeta,
        /// The shard.
        shard: Shard,
    },
    /// The parity shard of `(generation, stripe)` is stored.
    ParityAck {
        /// Generation.
        generation: u64,
        /// Stripe.
        stripe: usize,
    },
    /// Send me what you hold of `generation` to rebuild my piece.
    RebuildRequest {
        /// Generation.
        generation: u64,
    },
    /// Answer to a rebuild request: the sender's data chunks and parity
    /// shards of the stripes the requester has data in (possibly none).
    RebuildParts {
        /// Generation.
        generation: u64,
        /// `(stripe, chunk)`.
        chunks: Vec<(usize, Chunk)>,
        /// `(stripe, metadata, shard)`.
        parity: Vec<(usize, StripeMeta, Shard)>,
    },
}

/// Progress of one generation's encoding at this rank.
#[derive(Debug, Default)]
struct GenState {
    /// This rank handed its own piece to the level.
    put: bool,
    /// The stripe this rank encodes is encoded.
    encoded: bool,
    /// Parity acknowledgements still awaited.
    acks_left: usize,
    /// `Stored` was reported.
    reported: bool,
}

#[derive(Debug)]
struct Rebuild {
    generation: u64,
    replies: usize,
    chunks: HashMap<(usize, usize), Chunk>,
    parity: HashMap<usize, (StripeMeta, Vec<Shard>)>,
}

/// The erasure-coded level of one rank.
#[derive(Debug)]
pub struct ErasureLevel {
    rank: Rank,
    code: Code,
    every: u64,
    groups: Groups,
    /// Fault injection: damage every parity shard stored here.
    damage: bool,
    coder: Coder,
    /// This rank's pieces of the generations this level encodes, kept until
    /// a newer encoded generation commits (the data shards of the stripes).
    own: BTreeMap<u64, Piece>,
    /// Parity shards held: `(generation, stripe)`.
    parity: BTreeMap<(u64, usize), (StripeMeta, Shard)>,
    /// Chunks received for the stripe this rank encodes, per generation.
    collecting: BTreeMap<u64, Vec<Option<Chunk>>>,
    state: BTreeMap<u64, GenState>,
    rebuilding: Option<Rebuild>,
}

impl ErasureLevel {
    /// The level of `rank` with `code`, encoding every `every`-th generation;
    /// `damage` is fault injection (every parity shard stored here gets a
    /// flipped byte after its checksum was computed, as silent memory
    /// corruption would).
    pub fn new(
        rank: Rank,
        placement: &Placement,
        code: Code,
        every: u64,
        damage: bool,
    ) -> Result<Self> {
        Ok(ErasureLevel {
            rank,
            code,
            every: every.max(1),
            groups: Groups::new(placement, code)?,
            damage,
            coder: Coder::new(),
            own: BTreeMap::new(),
            parity: BTreeMap::new(),
            collecting: BTreeMap::new(),
            state: BTreeMap::new(),
            rebuilding: None,
        })
    }

    /// The code of this level.
    pub fn code(&self) -> Code {
        self.code
    }

    /// The groups of the job.
    pub fn groups(&self) -> &Groups {
        &self.groups
    }

    /// Whether this level encodes `generation`.
    pub fn applies(&self, generation: u64) -> bool {
        generation.is_multiple_of(self.every)
    }

    /// This rank's own piece of an encoded generation, if held.
    pub fn own_piece(&self, generation: u64) -> Option<&Piece> {
        self.own.get(&generation)
    }

    /// Generations of which this rank's own piece is held here.
    pub fn own_generations(&self) -> Vec<u64> {
        self.own.keys().copied().collect()
    }

    /// Keep this rank's own piece (restored by another level) so that it can
    /// serve rebuilds and re-encoding.
    pub fn adopt(&mut self, piece: Piece) {
        if piece.owner == self.rank && self.applies(piece.generation) {
            self.own.insert(piece.generation, piece);
        }
    }

    fn me(&self) -> Result<(Geometry, usize, &[Rank])> {
        self.groups
            .geometry(self.rank)
            .ok_or_else(|| Error::config("storage", format!("rank {} is in no group", self.rank)))
    }

    /// Send this rank's chunks of `piece` to the encoders of their stripes
    /// (at a checkpoint, and again to re-encode after a recovery).
    pub fn put(&mut self, piece: Piece, out: &mut StoreOut) -> Result<()> {
        let generation = piece.generation;
        if !self.applies(generation) {
            return Ok(());
        }
        self.own.insert(generation, piece);
        self.state.entry(generation).or_default().put = true;
        self.send_chunks(generation, out)?;
        self.maybe_stored(generation, out);
        Ok(())
    }

    /// Re-encode `generation` from this rank's own piece (after a recovery).
    pub fn replicate(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        let piece = self
            .own
            .get(&generation)
            .cloned()
            .ok_or_else(|| Error::CorruptCheckpoint {
                owner: self.rank,
                generation,
                detail: "own piece missing when re-encoding its group".into(),
            })?;
        self.put(piece, out)
    }

    fn send_chunks(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        let (geo, x, members) = self.me()?;
        let Some(piece) = self.own.get(&generation) else {
            return Ok(());
        };
        for c in 0..geo.data() {
            // Chunk c is data of a stripe that another member encodes: a
            // member never has data in the stripe it encodes.
            let s = geo.stripe_of_chunk(x, c);
            let msg = ErasureMsg::Chunk {
                generation,
                stripe: s,
                chunk: chunk_of(piece, geo.data(), c),
            };
            out.sends.push((
                members[geo.parity_member(s, 0)],
                StoreMsg::Erasure(Box::new(msg)),
            ));
        }
        Ok(())
    }

    fn maybe_stored(&mut self, generation: u64, out: &mut StoreOut) {
        if let Some(st) = self.state.get_mut(&generation)
            && st.put
            && st.encoded
            && st.acks_left == 0
            && !st.reported
        {
            st.reported = true;
            out.events.push(StoreEvent::Stored { generation });
        }
    }

    fn keep_parity(&mut self, generation: u64, stripe: usize, meta: StripeMeta, mut shard: Shard) {
        if self.damage && !shard.data.is_empty() {
            let mut bytes = shard.data.to_vec();
            bytes[0] ^= 0x5a;
            shard.data = Bytes::from(bytes);
        }
        self.parity.insert((generation, stripe), (meta, shard));
    }

    /// Encode this rank's stripe of `generation` once every chunk arrived.
    fn try_encode(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        let (geo, x, members) = self.me()?;
        let members = members.to_vec();
        let Some(slots) = self.collecting.get(&generation) else {
            return Ok(());
        };
        if slots.iter().any(Option::is_none) {
            return Ok(());
        }
        let chunks: Vec<Chunk> = slots.iter().flatten().cloned().collect();
        self.collecting.remove(&generation);
        let data: Vec<&[u8]> = chunks.iter().map(|c| &c.data[..]).collect();
        let mut encoded = self.coder.encode(self.code, &data)?;
        let shards = std::mem::take(&mut encoded.parity);
        let meta = StripeMeta {
            encoded,
            owners: chunks.iter().map(|c| c.owner).collect(),
            chunk_crcs: chunks.iter().map(|c| c.crc).collect(),
            piece_lens: chunks.iter().map(|c| c.piece_len).collect(),
            piece_crcs: chunks.iter().map(|c| c.piece_crc).collect(),
        };
        let mut acks = 0;
        for shard in shards {
            let holder = members[geo.parity_member(x, shard.index)];
            if holder == self.rank {
                self.keep_parity(generation, x, meta.clone(), shard);
            } else {
                acks += 1;
                out.sends.push((
                    holder,
                    StoreMsg::Erasure(Box::new(ErasureMsg::Parity {
                        generation,
                        stripe: x,
                        meta: meta.clone(),
                        shard,
                    })),
                ));
            }
        }
        let st = self.state.entry(generation).or_default();
        st.encoded = true;
        st.acks_left = acks;
        self.maybe_stored(generation, out);
        Ok(())
    }

    /// Handle a message of this level from `src`.
    pub fn on_msg(&mut self, src: Rank, msg: ErasureMsg, out: &mut StoreOut) -> Result<()> {
        match msg {
            ErasureMsg::Chunk {
                generation,
                stripe,
                chunk,
            } => {
                let (geo, x, _) = self.me()?;
                if stripe != x || chunk.index >= geo.data() {
                    return Err(Error::CorruptCheckpoint {
                        owner: chunk.owner,
                        generation,
                        detail: format!(
                            "chunk {} of stripe {stripe} sent to rank {}, which encodes stripe {x}",
                            chunk.index, self.rank
                        ),
                    });
                }
                if crc32c::crc32c(&chunk.data) != chunk.crc {
                    return Err(Error::CorruptCheckpoint {
                        owner: chunk.owner,
                        generation,
                        detail: format!("chunk {} fails its CRC32C in transit", chunk.index),
                    });
                }
                let slots = self
                    .collecting
                    .entry(generation)
                    .or_insert_with(|| vec![None; geo.data()]);
                let index = chunk.index;
                slots[index] = Some(chunk);
                self.try_encode(generation, out)?;
            }
            ErasureMsg::Parity {
                generation,
                stripe,
                meta,
                shard,
            } => {
                if !shard.verify() {
                    return Err(Error::CorruptCheckpoint {
                        owner: src,
                        generation,
                        detail: format!(
                            "parity shard {} of stripe {stripe} fails its CRC32C in transit",
                            shard.index
                        ),
                    });
                }
                self.keep_parity(generation, stripe, meta, shard);
                out.sends.push((
                    src,
                    StoreMsg::Erasure(Box::new(ErasureMsg::ParityAck { generation, stripe })),
                ));
            }
            ErasureMsg::ParityAck { generation, .. } => {
                if let Some(st) = self.state.get_mut(&generation)
                    && st.acks_left > 0
                {
                    st.acks_left -= 1;
                    self.maybe_stored(generation, out);
                }
            }
            ErasureMsg::RebuildRequest { generation } => {
                let parts = self.parts_for(src, generation)?;
                out.sends.push((src, StoreMsg::Erasure(Box::new(parts))));
            }
            ErasureMsg::RebuildParts {
                generation,
                chunks,
                parity,
            } => {
                let Some(rb) = self.rebuilding.as_mut() else {
                    return Ok(());
                };
                if rb.generation != generation {
                    return Ok(());
                }
                rb.replies += 1;
                for (s, c) in chunks {
                    rb.chunks.insert((s, c.index), c);
                }
                for (s, meta, shard) in parity {
                    rb.parity
                        .entry(s)
                        .or_insert_with(|| (meta, Vec::new()))
                        .1
                        .push(shard);
                }
                let (geo, _, _) = self.me()?;
                if self
                    .rebuilding
                    .as_ref()
                    .is_some_and(|rb| rb.replies + 1 >= geo.k)
                {
                    self.finish_rebuild(out)?;
                }
            }
        }
        Ok(())
    }

    /// What this rank holds of `generation` that `requester` needs.
    fn parts_for(&self, requester: Rank, generation: u64) -> Result<ErasureMsg> {
        let (geo, x, members) = self.me()?;
        let Some(y) = members.iter().position(|&r| r == requester) else {
            return Err(Error::config(
                "storage",
                format!(
                    "rank {requester} asked rank {} for shards of another group",
                    self.rank
                ),
            ));
        };
        let mut chunks = Vec::new();
        if let Some(piece) = self.own.get(&generation) {
            for c in 0..geo.data() {
                let s = geo.stripe_of_chunk(x, c);
                if geo.is_data(s, y) {
                    chunks.push((s, chunk_of(piece, geo.data(), c)));
                }
            }
        }
        let parity = self
            .parity
            .range((generation, 0)..=(generation, usize::MAX))
            .filter(|&(&(_, s), _)| geo.is_data(s, y))
            .map(|(&(_, s), (meta, shard))| (s, meta.clone(), shard.clone()))
            .collect();
        Ok(ErasureMsg::RebuildParts {
            generation,
            chunks,
            parity,
        })
    }

    /// Start rebuilding this rank's piece of `generation` from its group.
    pub fn rebuild(&mut self, generation: u64, out: &mut StoreOut) -> Result<()> {
        if !self.applies(generation) {
            return Err(Error::CorruptCheckpoint {
                owner: self.rank,
                generation,
                detail: format!("{} does not encode this generation", self.code),
            });
        }
        let (_, _, members) = self.me()?;
        for &r in members.iter().filter(|&&r| r != self.rank) {
            out.sends.push((
                r,
                StoreMsg::Erasure(Box::new(ErasureMsg::RebuildRequest { generation })),
            ));
        }
        self.rebuilding = Some(Rebuild {
            generation,
            replies: 0,
            chunks: HashMap::new(),
            parity: HashMap::new(),
        });
        Ok(())
    }

    /// Every member answered: decode each chunk of this rank's piece.
    fn finish_rebuild(&mut self, out: &mut StoreOut) -> Result<()> {
        let Some(rb) = self.rebuilding.take() else {
            return Ok(());
        };
        let generation = rb.generation;
        let (geo, x, _) = self.me()?;
        let mut data = Vec::new();
        let mut piece_crc = None;
        for c in 0..geo.data() {
            let s = geo.stripe_of_chunk(x, c);
            let (meta, shards) = rb.parity.get(&s).ok_or_else(|| Error::CorruptCheckpoint {
                owner: self.rank,
                generation,
                detail: format!("no parity shard of stripe {s} survives"),
            })?;
            let lengths = &meta.encoded.lengths;
            // A chunk counts only if it is the one encoded: its CRC must be
            // the one the encoder recorded, otherwise it is treated as lost.
            let present: Vec<Option<(&[u8], u32)>> = (0..lengths.len())
                .map(|t| {
                    let want = *meta.chunk_crcs.get(t)?;
                    rb.chunks
                        .get(&(s, t))
                        .filter(|ch| {
                            t != c
                                && ch.data.len() == lengths[t]
                                && crc32c::crc32c(&ch.data) == want
                        })
                        .map(|ch| (&ch.data[..], want))
                })
                .collect();
            let enc = Encoded {
                parity: shards.clone(),
                ..meta.encoded.clone()
            };
            let label = GroupLabel {
                generation,
                owners: &meta.owners,
            };
            let mut rebuilt = self.coder.decode(&enc, &present, label)?;
            if c >= rebuilt.len() {
                return Err(Error::Codec {
                    what: "erasure-coded stripe".into(),
                    detail: format!("stripe {s} has no data shard {c}"),
                });
            }
            data.extend_from_slice(&rebuilt.swap_remove(c));
            piece_crc = piece_crc.or(meta.piece_crcs.get(c).copied());
        }
        let piece = Piece {
            generation,
            owner: self.rank,
            data: data.into(),
            crc: piece_crc.unwrap_or_default(),
            summed: Default::default(),
        };
        piece.verify()?;
        self.own.insert(generation, piece);
        out.events.push(StoreEvent::Restored { generation });
        Ok(())
    }

    /// `(generation, stripe)` of every parity shard held here.
    pub fn parity_held(&self) -> Vec<(u64, usize)> {
        self.parity.keys().copied().collect()
    }

    /// Recovery leader: whether `owner`'s piece of `generation`, held by no
    /// rank, can be rebuilt from the pieces the survivors hold themselves and
    /// the intact parity shards `inv` reports.
    pub fn can_rebuild(&self, generation: u64, owner: Rank, inv: &Inventory) -> bool {
        let Some((geo, x, members)) = self.groups.geometry(owner) else {
            return false;
        };
        self.applies(generation)
            && (0..geo.data()).all(|c| {
                let s = geo.stripe_of_chunk(x, c);
                let data = (0..geo.data())
                    .filter(|&t| t != c)
                    .filter(|&t| {
                        let d = members[geo.data_member(s, t)];
                        inv.holds(generation, d, d)
                    })
                    .count();
                let parity = (0..geo.m)
                    .filter(|&j| inv.has_parity(generation, members[geo.parity_member(s, j)], s))
                    .count();
                data + parity >= geo.data()
            })
    }

    /// Recovery leader: whether some parity shard of `owner`'s group for
    /// `generation` is missing, so the group must re-encode.
    pub fn redundancy_lost(&self, generation: u64, owner: Rank, inv: &Inventory) -> bool {
        let Some((geo, _, members)) = self.groups.geometry(owner) else {
            return false;
        };
        self.applies(generation)
            && (0..geo.k).any(|s| {
                (0..geo.m).any(|j| !inv.has_parity(generation, members[geo.parity_member(s, j)], s))
            })
    }

    /// Check every shard and own piece held against its checksum; drop and
    /// report those that fail (they then count as lost).
    pub fn scrub(&mut self) -> Vec<Error> {
        let mut errors = Vec::new();
        let rank = self.rank;
        let group = self.groups.group_of(rank).to_vec();
        self.parity.retain(|&(generation, stripe), (meta, shard)| {
            let ok = shard.data.len() == meta.encoded.shard_len && shard.verify();
            if !ok {
                errors.push(Error::CorruptCheckpoint {
                    owner: rank,
                    generation,
                    detail: format!(
                        "parity shard {} of stripe {stripe} held by rank {rank} (group of ranks {}, \
                         protecting ranks {}) fails its CRC32C; treated as lost",
                        shard.index,
                        crate::error::list(&group),
                        crate::error::list(&meta.owners)
                    ),
                });
            }
            ok
        });
        self.own.retain(|_, piece| match piece.verify() {
            Ok(()) => true,
            Err(e) => {
                errors.push(e);
                false
            }
        });
        errors
    }

    /// A generation committed: drop what older encoded generations held (an
    /// unencoded generation keeps the newest encoded one, the level's own
    /// checkpoint in a multi-level schedule).
    pub fn commit(&mut self, generation: u64) {
        if self.applies(generation) {
            self.own.retain(|&g, _| g >= generation);
            self.parity.retain(|&(g, _), _| g >= generation);
        }
        // Not `generation` itself: at a recovery decision it is committed
        // again while other ranks may already send chunks to re-encode it.
        self.collecting.retain(|&g, _| g >= generation);
        self.state.retain(|&g, _| g >= generation);
    }

    /// Keep only `keep`'s pieces and shards (at a recovery decision). The
    /// encoding state of `keep` survives: ranks that already took the
    /// decision may be sending chunks to re-encode it; anything older was
    /// forgotten by [`Self::abort_transfers`] when the recovery began.
    pub fn retain_only(&mut self, keep: Option<u64>) {
        self.own.retain(|&g, _| Some(g) == keep);
        self.parity.retain(|&(g, _), _| Some(g) == keep);
        self.collecting.retain(|&g, _| Some(g) == keep);
        self.state.retain(|&g, _| Some(g) == keep);
        self.rebuilding = None;
    }

    /// Drop the pieces, parity and encodings of `generation` alone.
    pub fn discard(&mut self, generation: u64) {
        self.own.remove(&generation);
        self.parity.retain(|&(g, _), _| g != generation);
        self.collecting.remove(&generation);
        self.state.remove(&generation);
    }

    /// Forget encodings and rebuilds in progress.
    pub fn abort_transfers(&mut self) {
        self.collecting.clear();
        self.state.clear();
        self.rebuilding = None;
    }

    /// Bytes of parity held (own pieces are shared with the local store).
    pub fn bytes_held(&self) -> usize {
        self.parity.values().map(|(_, s)| s.data.len()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::CheckpointStore;
    use crate::store::levels::{LevelSpec, MultiLevel};

    #[test]
    fn groups_are_topology_aware_when_the_placement_allows() {
        for code in [Code::Xor, Code::ReedSolomon { parity: 2 }] {
            let m = code.parity_shards();
            for ranks in m + 1..40 {
                for nodes in 1..=ranks {
                    let pl = Placement::block(ranks, nodes).expect("valid");
                    let g = Groups::new(&pl, code).expect("groups");
                    let mut seen = vec![0; ranks];
                    for members in g.groups() {
                        assert!(members.len() > m, "{ranks}/{nodes}: {members:?}");
                        assert!(members.len() <= DEFAULT_GROUP_CAP.max(2 * m));
                        for &r in members {
                            seen[r] += 1;
                        }
                    }
                    assert!(seen.iter().all(|&n| n == 1), "{ranks}/{nodes}");
                    // Full nodes with room for m+1 members: always t-aware.
                    if nodes > 1 && ranks % nodes == 0 && m * nodes > m {
                        assert!(
                            g.topology_aware(),
                            "{code} {ranks}/{nodes}: {:?}",
                            g.groups()
                        );
                    }
                    if nodes == 1 {
                        assert!(!g.topology_aware());
                    }
                }
            }
        }
        let pl = Placement::block(2, 1).expect("valid");
        assert!(Groups::new(&pl, Code::ReedSolomon { parity: 2 }).is_err());
    }

    #[test]
    fn every_member_has_one_role_in_every_stripe() {
        for k in 2..10 {
            for m in 1..k {
                let geo = Geometry { k, m };
                for s in 0..k {
                    let mut role = vec![0; k];
                    for t in 0..geo.data() {
                        role[geo.data_member(s, t)] += 1;
                    }
                    for j in 0..m {
                        role[geo.parity_member(s, j)] += 1;
                    }
                    assert!(role.iter().all(|&n| n == 1), "k{k} m{m} s{s}");
                }
                for x in 0..k {
                    for c in 0..geo.data() {
                        let s = geo.stripe_of_chunk(x, c);
                        assert_eq!(geo.data_member(s, c), x);
                        assert!(geo.is_data(s, x));
                    }
                }
            }
        }
    }

    /// A group of stores exchanging messages directly.
    struct Net {
        stores: Vec<MultiLevel>,
        events: Vec<Vec<StoreEvent>>,
    }

    impl Net {
        fn new(pl: &Placement, specs: &[LevelSpec]) -> Self {
            Net {
                stores: (0..pl.ranks())
                    .map(|r| MultiLevel::new(r, pl, specs, None))
                    .collect(),
                events: vec![Vec::new(); pl.ranks()],
            }
        }

        fn deliver(&mut self, from: Rank, out: StoreOut) {
            self.events[from].extend(out.events);
            let mut queue: Vec<(Rank, Rank, StoreMsg)> =
                out.sends.into_iter().map(|(d, m)| (from, d, m)).collect();
            while let Some((src, dest, msg)) = queue.pop() {
                let mut o = StoreOut::default();
                self.stores[dest]
                    .on_msg(src, msg, &mut o)
                    .expect("valid message");
                self.events[dest].extend(o.events);
                queue.extend(o.sends.into_iter().map(|(d, m)| (dest, d, m)));
            }
        }

        fn checkpoint(&mut self, generation: u64, pieces: &[Vec<u8>]) {
            for (r, data) in pieces.iter().enumerate() {
                let mut out = StoreOut::default();
                self.stores[r]
                    .put(
                        Piece::new(generation, r, Bytes::from(data.clone())),
                        &mut out,
                    )
                    .expect("put");
                self.deliver(r, out);
            }
            for (r, ev) in self.events.iter_mut().enumerate() {
                assert_eq!(
                    std::mem::take(ev),
                    vec![StoreEvent::Stored { generation }],
                    "rank {r}"
                );
            }
            for s in &mut self.stores {
                s.commit(generation).expect("commit");
            }
        }

        fn inventory(&self, alive: &[bool]) -> Inventory {
            let mut inv = Inventory::default();
            for (r, s) in self.stores.iter().enumerate().filter(|(r, _)| alive[*r]) {
                inv.add(r, &s.held(), &s.parity_held());
            }
            inv
        }
    }

    fn pieces(n: usize) -> Vec<Vec<u8>> {
        // Unequal lengths, one empty: padding is exercised.
        (0..n)
            .map(|r| (0..(r * 37) % 101).map(|i| (i * 7 + r) as u8).collect())
            .collect()
    }

    #[test]
    fn rs2_rebuilds_two_lost_members_and_re_encodes() {
        let pl = Placement::block(6, 3).expect("valid");
        let specs = [LevelSpec::Rs {
            parity: 2,
            every: 1,
        }];
        let mut net = Net::new(&pl, &specs);
        let data = pieces(6);
        net.checkpoint(1, &data);
        net.checkpoint(2, &data);
        assert_eq!(
            net.stores[0].held(),
            vec![(2, 0)],
            "older generation dropped"
        );
        // Node 1 (ranks 2 and 3) dies: fresh stores replace them.
        for r in [2, 3] {
            net.stores[r] = MultiLevel::new(r, &pl, &specs, None);
        }
        let inv = net.inventory(&[true, true, false, false, true, true]);
        // As the engine and the protocol's decision do: forget transfers,
        // keep the generation and commit it.
        for s in &mut net.stores {
            s.abort_transfers();
            s.retain_only(Some(2)).expect("retain");
            s.commit(2).expect("commit");
        }
        let leader = &net.stores[0];
        for r in [2, 3] {
            assert!(leader.can_rebuild(2, r, &inv), "rank {r}");
        }
        // A third piece of the group would be one loss too many.
        assert!(!leader.can_rebuild(2, 0, &inv));
        for r in 0..6 {
            assert!(leader.redundancy_lost(2, r, &inv));
        }
        for r in [2, 3] {
            let mut out = StoreOut::default();
            net.stores[r].rebuild(2, &mut out).expect("rebuild starts");
            net.deliver(r, out);
            assert_eq!(
                std::mem::take(&mut net.events[r]),
                vec![StoreEvent::Restored { generation: 2 }]
            );
            let p = net.stores[r].get(2, r).expect("rebuilt");
            assert_eq!(p.data.to_vec(), data[r]);
            p.verify().expect("checksum");
        }
        // Re-encode: every rank reports stored again, and a further double
        // loss is again recoverable.
        for r in 0..6 {
            let mut out = StoreOut::default();
            net.stores[r].replicate(2, &mut out).expect("re-encode");
            net.deliver(r, out);
        }
        for ev in &mut net.events {
            assert_eq!(
                std::mem::take(ev),
                vec![StoreEvent::Stored { generation: 2 }]
            );
        }
        let inv = net.inventory(&[false, true, true, true, true, false]);
        assert!(net.stores[1].can_rebuild(2, 0, &inv));
        assert!(net.stores[1].can_rebuild(2, 5, &inv));
    }

    #[test]
    fn xor_survives_one_loss_per_group_not_two() {
        let pl = Placement::block(6, 3).expect("valid");
        let specs = [LevelSpec::Xor { every: 1 }];
        let mut net = Net::new(&pl, &specs);
        net.checkpoint(1, &pieces(6));
        let groups = net.stores[0].erasure().expect("xor").groups().clone();
        let g0 = groups.groups()[0].clone();
        let mut alive = vec![true; 6];
        alive[g0[1]] = false;
        net.stores[g0[1]] = MultiLevel::new(g0[1], &pl, &specs, None);
        let inv = net.inventory(&alive);
        assert!(net.stores[0].can_rebuild(1, g0[1], &inv));
        alive[g0[2]] = false;
        net.stores[g0[2]] = MultiLevel::new(g0[2], &pl, &specs, None);
        let inv = net.inventory(&alive);
        assert!(!net.stores[0].can_rebuild(1, g0[1], &inv));
    }

    #[test]
    fn damaged_parity_is_reported_and_counts_as_lost() {
        let pl = Placement::block(4, 4).expect("valid");
        let specs = [
            LevelSpec::Xor { every: 1 },
            LevelSpec::CorruptParityAt { rank: 2 },
        ];
        let mut net = Net::new(&pl, &specs);
        net.checkpoint(1, &pieces(4));
        let errors = net.stores[2].scrub();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            matches!(
                &errors[0],
                Error::CorruptCheckpoint { owner: 2, generation: 1, detail }
                    if detail.contains("parity shard") && detail.contains("CRC32C")
            ),
            "{errors:?}"
        );
        assert!(net.stores[2].parity_held().is_empty());
        assert!(net.stores[0].scrub().is_empty());
        // One group of 4; rank 2's parity protects stripe 2, whose data
        // members are ranks 3, 0 and 1. Losing rank 0 is now fatal for this
        // level; losing rank 2 itself is not.
        let mut alive = vec![true; 4];
        alive[0] = false;
        let inv = net.inventory(&alive);
        assert!(!net.stores[1].can_rebuild(1, 0, &inv));
        let mut alive = vec![true; 4];
        alive[2] = false;
        let inv = net.inventory(&alive);
        assert!(net.stores[1].can_rebuild(1, 2, &inv));
    }

    #[test]
    fn every_n_keeps_the_last_encoded_generation() {
        let pl = Placement::block(4, 2).expect("valid");
        let specs = [LevelSpec::Xor { every: 2 }];
        let mut net = Net::new(&pl, &specs);
        let data = pieces(4);
        for g in 1..=3 {
            net.checkpoint(g, &data);
        }
        // Generation 3 is local only; generation 2 is still encoded.
        assert_eq!(net.stores[1].held(), vec![(3, 1), (2, 1)]);
        net.stores[1] = MultiLevel::new(1, &pl, &specs, None);
        let inv = net.inventory(&[true, false, true, true]);
        assert!(!net.stores[0].can_rebuild(3, 1, &inv));
        assert!(net.stores[0].can_rebuild(2, 1, &inv));
    }
}
