//! Erasure codes over checkpoint groups: the encoding layer beneath the `xor`
//! and `rs:M` storage levels.
//!
//! A group is a set of pieces of one generation whose owners sit in distinct
//! failure domains. [`encode`] computes parity shards over the group and
//! [`decode`] rebuilds lost pieces from the survivors and the parity. As in
//! `003` §5, a group with `m` checksum shards survives `m` concurrent losses;
//! [`Code::Xor`] is the `m = 1` case, done with a plain XOR because that runs
//! at memory speed, while [`Code::ReedSolomon`] uses `reed-solomon-simd`.
//!
//! Pieces of a group may differ in length: each is zero-padded to a common
//! shard length for coding (zero is the XOR identity, so padding costs nothing
//! in the parity) and cut back to its recorded length when rebuilt.
//!
//! Every shard carries a CRC32C. Erasure codes correct *erasures* (shards known
//! to be missing), not errors: given a corrupt shard, the decoder would return
//! garbage without complaint. So no shard is used before its checksum passes;
//! a parity shard that fails counts as lost, and a data piece that fails is
//! reported, because the caller claimed it was good.

use std::borrow::Cow;
use std::fmt;
use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::Bytes;
use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
use serde::{Deserialize, Serialize};

use super::pool::BufferPool;
use crate::{Error, Rank, Result};

/// One parity shard of a group, with its checksum.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Shard {
    /// Position of the shard among the group's parity shards (`0..m`); the
    /// decoder needs it because each Reed–Solomon shard is a different
    /// combination of the data.
    pub index: usize,
    /// The shard bytes, exactly [`Encoded::shard_len`] long.
    pub data: Bytes,
    /// CRC32C of `data`, computed when the shard was made.
    pub crc: u32,
}

impl Shard {
    /// Make a shard, computing its checksum.
    pub fn new(index: usize, data: Bytes) -> Self {
        let crc = crc32c::crc32c(&data);
        Shard { index, data, crc }
    }

    /// True when the data still matches its checksum.
    pub fn verify(&self) -> bool {
        crc32c::crc32c(&self.data) == self.crc
    }
}

/// Which erasure code protects a group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Code {
    /// One parity shard, the XOR of the padded pieces: survives one loss.
    Xor,
    /// Reed–Solomon with `parity` shards: survives any `parity` losses among
    /// the data pieces and parity shards together.
    ReedSolomon {
        /// Number of parity shards (at least 1).
        parity: usize,
    },
}

impl Code {
    /// Number of parity shards the code makes, which is also the number of
    /// lost shards (data or parity) it can tolerate.
    pub fn parity_shards(self) -> usize {
        match self {
            Code::Xor => 1,
            Code::ReedSolomon { parity } => parity,
        }
    }

    /// Common shard length for a group whose longest piece has `max_len`
    /// bytes. reed-solomon-simd only takes non-zero, even shard sizes; XOR
    /// takes any, so it is not padded beyond the longest piece.
    fn shard_len(self, max_len: usize) -> usize {
        match self {
            Code::Xor => max_len,
            // Saturating: lengths may come from the network, and a bad one
            // must fail the length check, not overflow.
            Code::ReedSolomon { .. } => max_len.saturating_add(max_len & 1).max(2),
        }
    }
}

impl fmt::Display for Code {
    /// The storage-level spelling: `xor` or `rs:M`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Code::Xor => write!(f, "xor"),
            Code::ReedSolomon { parity } => write!(f, "rs:{parity}"),
        }
    }
}

/// The parity of one group and what is needed to decode it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Encoded {
    /// The code used.
    pub code: Code,
    /// Original length of each data piece, in group order; also fixes the
    /// group size.
    pub lengths: Vec<usize>,
    /// Length every piece was padded to, and the length of every parity shard.
    pub shard_len: usize,
    /// Parity shards. [`encode`] makes all of them, in index order; a holder
    /// may drop some (a lost shard), which [`decode`] treats like a shard
    /// that fails its checksum.
    pub parity: Vec<Shard>,
}

/// Who a group's pieces belong to, so that errors name ranks and a generation.
///
/// The default (no owners, generation 0) names pieces by their index in the
/// group, which is what [`decode`] uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupLabel<'a> {
    /// Generation of the group's pieces.
    pub generation: u64,
    /// Owner rank of each piece, in group order; a piece without an entry
    /// is named by its index.
    pub owners: &'a [Rank],
}

impl GroupLabel<'_> {
    fn owner(&self, index: usize) -> Rank {
        self.owners.get(index).copied().unwrap_or(index)
    }

    /// `pieces [1, 3]`, plus the ranks when they are known, for error details.
    fn name(&self, indices: &[usize]) -> String {
        let word = if indices.len() == 1 {
            "piece"
        } else {
            "pieces"
        };
        if self.owners.is_empty() {
            format!("group {word} {}", crate::error::list(indices))
        } else {
            let ranks = crate::error::list(indices.iter().map(|&i| self.owner(i)));
            format!(
                "group {word} {} (rank(s) {ranks})",
                crate::error::list(indices)
            )
        }
    }

    fn corrupt(&self, index: usize, detail: String) -> Error {
        Error::CorruptCheckpoint {
            owner: self.owner(index),
            generation: self.generation,
            detail,
        }
    }
}

/// Reject groups and codes that cannot be coded, before any work is done.
fn check_params(code: Code, pieces: usize) -> Result<()> {
    if pieces == 0 {
        return Err(Error::config(
            "codec group",
            "a group needs at least one piece",
        ));
    }
    if let Code::ReedSolomon { parity } = code {
        if parity == 0 {
            return Err(Error::config(
                "storage",
                "rs:0 makes no parity; use rs:M with M ≥ 1",
            ));
        }
        if !ReedSolomonEncoder::supports(pieces, parity) {
            return Err(Error::config(
                "storage",
                format!(
                    "rs:{parity} over a group of {pieces} pieces is beyond what \
                     reed-solomon-simd supports"
                ),
            ));
        }
    }
    Ok(())
}

/// Errors of reed-solomon-simd can only follow from a malformed [`Encoded`]
/// once parameters are checked, so they are reported as decoding failures.
fn rs_error(e: reed_solomon_simd::Error) -> Error {
    Error::Codec {
        what: "Reed–Solomon shards".into(),
        detail: e.to_string(),
    }
}

/// Reed–Solomon works on blocks of this many bytes of every shard at a time
/// (a multiple of 64, as the SIMD code wants), so that its working set of
/// `k + m` blocks stays in cache instead of streaming whole shards. Measured
/// with `lazarus bench-codec` (4 × 1 MiB, +2): 4 KiB blocks 8.1 GB/s, 16 KiB
/// 8.5–8.9, 32 KiB 9.6–9.8, 64 KiB 9.3–9.6, 128 KiB 9.0–9.1 (per-block
/// overhead against cache misses: 6 blocks of 32 KiB and the coder's
/// scratch stay well inside this machine's 512 KiB of L2 per core).
const RS_BLOCK: usize = 32 * 1024;

/// XOR parity is made this many bytes at a time: the block of the parity
/// and of each piece stay in this machine's 512 KiB of L2 per core.
/// Measured with `lazarus bench-codec` (groups of 4), against a plain copy
/// in the same run: whole-shard passes 0.92–1.04× memcpy for pieces of 16
/// and 64 MiB, 64 KiB blocks 1.16–1.43× (pieces of 1 MiB, in cache either
/// way: 0.69–0.88× both).
const XOR_BLOCK: usize = 64 * 1024;

/// The `[start, end)` ranges of a shard of `shard_len` bytes, `size` bytes
/// at a time (with an even `shard_len` and `size`, every range has an even
/// length).
fn blocks(shard_len: usize, size: usize) -> impl Iterator<Item = (usize, usize)> {
    (0..shard_len)
        .step_by(size)
        .map(move |o| (o, (o + size).min(shard_len)))
}

/// Bytes `[o, e)` of `data`, cut short where `data` ends (the rest is
/// implicit zero padding).
fn block(data: &[u8], o: usize, e: usize) -> &[u8] {
    &data[o.min(data.len())..e.min(data.len())]
}

/// `data` zero-padded to `len`, copied only when it is short: full-length
/// pieces (the common case of equal pieces) are coded in place.
fn padded(data: &[u8], len: usize) -> Cow<'_, [u8]> {
    if data.len() == len {
        Cow::Borrowed(data)
    } else {
        let mut v = Vec::with_capacity(len);
        v.extend_from_slice(data);
        v.resize(len, 0);
        Cow::Owned(v)
    }
}

/// `dst ^= src` over the length of `src` (`dst` may be longer: the rest is
/// XORed with the implicit zero padding, i.e. left alone). A plain byte loop,
/// which the compiler vectorises.
fn xor_into(dst: &mut [u8], src: &[u8]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d ^= *s;
    }
}

/// The XOR of `parts` (each zero-padded to `len`, none longer), appended to
/// `acc` (empty; its capacity is used), with its CRC32C. Block by block, so
/// that each block of the result stays in cache while every part is folded
/// into it and it is checksummed (whole-length passes went through memory
/// once per part, and once more for the checksum); each block starts as a
/// copy of the first part rather than zeros.
fn xor_fold(mut acc: Vec<u8>, parts: &[&[u8]], len: usize) -> (Vec<u8>, u32) {
    let mut crc = 0;
    for (o, e) in blocks(len, XOR_BLOCK) {
        let mut rest = parts.iter();
        if let Some(first) = rest.next() {
            acc.extend_from_slice(block(first, o, e));
        }
        acc.resize(e, 0);
        for p in rest {
            xor_into(&mut acc[o..e], block(p, o, e));
        }
        crc = crc32c::crc32c_append(crc, &acc[o..e]);
    }
    (acc, crc)
}

/// Compute the parity of a group of `pieces` (any lengths, including empty).
///
/// Errors with [`Error::Config`] for an empty group, `rs:0`, or a group and
/// parity count that reed-solomon-simd does not support. Allocates fresh
/// coding state; a store encoding repeatedly should keep a [`Coder`].
pub fn encode(code: Code, pieces: &[&[u8]]) -> Result<Encoded> {
    Coder::new().encode(code, pieces)
}

/// Rebuild a group: every piece, in group order, lost ones recomputed.
///
/// `present[i]` is the surviving piece `i` with the CRC32C it was stored with
/// (e.g. `(&piece.data[..], piece.crc)` of a [`super::Piece`]), or `None` if
/// it is lost. Errors name pieces by their index in the group (the `owner` of
/// an [`Error::CorruptCheckpoint`] is that index and its generation is 0); use
/// [`decode_labelled`] to have ranks and the generation instead.
///
/// Errors:
/// - [`Error::CorruptCheckpoint`] naming every present piece whose length or
///   CRC does not match (it is not silently rebuilt: the caller said it was
///   good, so something upstream is wrong; pass `None` for it to rebuild it);
/// - [`Error::CorruptCheckpoint`] naming the lost pieces when more shards are
///   lost (data pieces, plus parity shards missing from `enc` or failing
///   their CRC) than the code tolerates;
/// - [`Error::Config`] when `present` does not have one entry per piece, or
///   the code parameters are invalid; [`Error::Codec`] when `enc` itself is
///   malformed.
pub fn decode(enc: &Encoded, present: &[Option<(&[u8], u32)>]) -> Result<Vec<Vec<u8>>> {
    decode_labelled(enc, present, GroupLabel::default())
}

/// [`decode`], with errors naming the owner ranks and generation of `label`.
pub fn decode_labelled(
    enc: &Encoded,
    present: &[Option<(&[u8], u32)>],
    label: GroupLabel<'_>,
) -> Result<Vec<Vec<u8>>> {
    Coder::new().decode(enc, present, label)
}

/// Reusable coding state.
///
/// reed-solomon-simd works in a scratch buffer several shards long; making a
/// fresh one per call means allocating and page-faulting it every time, which
/// can cost more than the coding itself at checkpoint sizes (measured up to 3×
/// slower with groups of 16 MiB pieces). A store that encodes every generation keeps one
/// `Coder`; the buffers stay as large as the largest group coded, so drop it
/// if memory matters more than speed.
///
/// Parity shards are written into buffers of the coder's [`BufferPool`]:
/// a shard dropped by its holder (the previous generation's) lends its
/// memory to the next encoding instead of the next encoding page-faulting
/// fresh memory (measured with `lazarus bench-codec --bytes 67108864`:
/// RS(+2) at 1.6 GB/s with fresh buffers, as glibc maps every block over
/// 32 MiB anew).
#[derive(Default)]
pub struct Coder {
    rs_encoder: Option<ReedSolomonEncoder>,
    rs_decoder: Option<ReedSolomonDecoder>,
    pool: BufferPool,
}

impl fmt::Debug for Coder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The reed-solomon-simd state has no Debug; say whether it is warm.
        f.debug_struct("Coder")
            .field("rs_encoder", &self.rs_encoder.is_some())
            .field("rs_decoder", &self.rs_decoder.is_some())
            .finish()
    }
}

impl Coder {
    /// A coder with no scratch space yet (allocated on first use).
    pub fn new() -> Self {
        Self::default()
    }

    /// [`encode`], reusing this coder's scratch space.
    pub fn encode(&mut self, code: Code, pieces: &[&[u8]]) -> Result<Encoded> {
        check_params(code, pieces.len())?;
        let lengths: Vec<usize> = pieces.iter().map(|p| p.len()).collect();
        let shard_len = code.shard_len(lengths.iter().copied().max().unwrap_or(0));
        let parity = match code {
            Code::Xor => {
                let (acc, crc) = xor_fold(self.pool.take(shard_len), pieces, shard_len);
                vec![Shard {
                    index: 0,
                    data: self.pool.freeze(acc),
                    crc,
                }]
            }
            Code::ReedSolomon { parity } => {
                // Each shard at its full size from the start (`vec![v; n]`
                // would clone `v` without its capacity, and all but one
                // shard grew by doubling: copied again at every step).
                let mut out: Vec<Vec<u8>> =
                    (0..parity).map(|_| self.pool.take(shard_len)).collect();
                // Each block's checksum is taken while it is in cache, as it
                // is copied out: no second pass over the parity.
                let mut crcs = vec![0u32; parity];
                self.rs_parity_blocks(parity, pieces, shard_len, |j, s| {
                    out[j].extend_from_slice(s);
                    crcs[j] = crc32c::crc32c_append(crcs[j], s);
                })?;
                out.into_iter()
                    .zip(crcs)
                    .enumerate()
                    .map(|(index, (s, crc))| Shard {
                        index,
                        data: self.pool.freeze(s),
                        crc,
                    })
                    .collect()
            }
        };
        Ok(Encoded {
            code,
            lengths,
            shard_len,
            parity,
        })
    }

    /// Reed–Solomon parity of `pieces` (padded to `shard_len`, which is
    /// even), block by block so that the encoder's working set stays in
    /// cache (the code is position-wise: blocks are independent).
    /// `sink(j, bytes)` receives parity shard `j`'s bytes of each block, in
    /// order; the encoder's buffer is reused for the next block.
    fn rs_parity_blocks(
        &mut self,
        parity: usize,
        pieces: &[&[u8]],
        shard_len: usize,
        mut sink: impl FnMut(usize, &[u8]),
    ) -> Result<()> {
        let k = pieces.len();
        for (o, e) in blocks(shard_len, RS_BLOCK) {
            let encoder = match &mut self.rs_encoder {
                Some(enc) => {
                    enc.reset(k, parity, e - o).map_err(rs_error)?;
                    enc
                }
                slot @ None => {
                    slot.insert(ReedSolomonEncoder::new(k, parity, e - o).map_err(rs_error)?)
                }
            };
            for p in pieces {
                encoder
                    .add_original_shard(padded(block(p, o, e), e - o))
                    .map_err(rs_error)?;
            }
            let result = encoder.encode().map_err(rs_error)?;
            for (j, s) in result.recovery_iter().enumerate() {
                sink(j, s);
            }
        }
        Ok(())
    }

    /// [`decode_labelled`], reusing this coder's scratch space.
    pub fn decode(
        &mut self,
        enc: &Encoded,
        present: &[Option<(&[u8], u32)>],
        label: GroupLabel<'_>,
    ) -> Result<Vec<Vec<u8>>> {
        let k = enc.lengths.len();
        check_params(enc.code, k)?;
        if present.len() != k {
            return Err(Error::config(
                "codec group",
                format!("{} pieces given for a group of {k}", present.len()),
            ));
        }
        let max_len = enc.lengths.iter().copied().max().unwrap_or(0);
        if enc.shard_len != enc.code.shard_len(max_len) {
            // Padding is recomputed from the lengths rather than trusted, so that
            // corrupt metadata cannot make us read past a shard or mis-truncate.
            return Err(Error::Codec {
                what: "erasure-coded group".into(),
                detail: format!(
                    "shard length {} does not fit code {} and longest piece {max_len}",
                    enc.shard_len, enc.code
                ),
            });
        }

        // Check every present piece before any decoding, and report all bad ones
        // at once so the caller can drop them in one retry.
        let mut corrupt = Vec::new();
        let mut why = Vec::new();
        for (i, (p, &len)) in present.iter().zip(&enc.lengths).enumerate() {
            let Some((data, crc)) = *p else { continue };
            if data.len() != len {
                corrupt.push(i);
                why.push(format!(
                    "piece {i} has {} bytes, encoded with {len}",
                    data.len()
                ));
                continue;
            }
            let got = crc32c::crc32c(data);
            if got != crc {
                corrupt.push(i);
                why.push(format!(
                    "piece {i}: CRC32C {got:#010x}, expected {crc:#010x}"
                ));
            }
        }
        if let Some(&first) = corrupt.first() {
            return Err(label.corrupt(
                first,
                format!("{} corrupt: {}", label.name(&corrupt), why.join("; ")),
            ));
        }

        let lost: Vec<usize> = (0..k).filter(|&i| present[i].is_none()).collect();
        let mut out: Vec<Vec<u8>> = present
            .iter()
            .map(|p| p.map(|(d, _)| d.to_vec()).unwrap_or_default())
            .collect();
        if lost.is_empty() {
            return Ok(out);
        }

        // Usable parity, by index: the first shard of each index that has the
        // right length and passes its CRC. Anything else counts as lost.
        let m = enc.code.parity_shards();
        let mut usable: Vec<Option<&Shard>> = vec![None; m];
        for s in &enc.parity {
            if s.index < m
                && usable[s.index].is_none()
                && s.data.len() == enc.shard_len
                && s.verify()
            {
                usable[s.index] = Some(s);
            }
        }
        let good: Vec<&Shard> = usable.iter().flatten().copied().collect();
        if lost.len() > good.len() {
            let corrupt_parity: Vec<usize> = (0..m)
                .filter(|&j| usable[j].is_none() && enc.parity.iter().any(|s| s.index == j))
                .collect();
            let missing_parity = m - good.len() - corrupt_parity.len();
            return Err(label.corrupt(
                lost[0],
                format!(
                    "cannot rebuild {}: {} rebuilds at most {m} lost shard(s), but {} data \
                     piece(s) are lost, {missing_parity} parity shard(s) are missing and \
                     parity shard(s) {} fail their checksum",
                    label.name(&lost),
                    enc.code,
                    lost.len(),
                    crate::error::list(&corrupt_parity),
                ),
            ));
        }

        match enc.code {
            Code::Xor => {
                // Exactly one piece is lost here (at most one parity shard
                // exists): the parity XOR the survivors.
                let j = lost[0];
                let parts: Vec<&[u8]> = std::iter::once(&good[0].data[..])
                    .chain(present.iter().flatten().map(|&(d, _)| d))
                    .collect();
                let (acc, _) = xor_fold(Vec::with_capacity(enc.shard_len), &parts, enc.shard_len);
                out[j] = finish(acc, enc.lengths[j], j, &label)?;
            }
            Code::ReedSolomon { parity } => {
                let mut rebuilt: Vec<Vec<u8>> = vec![Vec::with_capacity(enc.shard_len); lost.len()];
                for (o, e) in blocks(enc.shard_len, RS_BLOCK) {
                    let decoder = match &mut self.rs_decoder {
                        Some(d) => {
                            d.reset(k, parity, e - o).map_err(rs_error)?;
                            d
                        }
                        slot @ None => slot
                            .insert(ReedSolomonDecoder::new(k, parity, e - o).map_err(rs_error)?),
                    };
                    for (i, p) in present.iter().enumerate() {
                        if let Some((d, _)) = p {
                            decoder
                                .add_original_shard(i, padded(block(d, o, e), e - o))
                                .map_err(rs_error)?;
                        }
                    }
                    // Exactly as many parity shards as losses: extra ones add
                    // work and no checking.
                    for s in good.iter().take(lost.len()) {
                        decoder
                            .add_recovery_shard(s.index, padded(block(&s.data, o, e), e - o))
                            .map_err(rs_error)?;
                    }
                    let result = decoder.decode().map_err(rs_error)?;
                    for (dst, &j) in rebuilt.iter_mut().zip(&lost) {
                        let shard = result.restored_original(j).ok_or_else(|| Error::Codec {
                            what: "Reed–Solomon shards".into(),
                            detail: format!("decoder did not restore piece {j}"),
                        })?;
                        dst.extend_from_slice(shard);
                    }
                }
                for (shard, &j) in rebuilt.into_iter().zip(&lost) {
                    out[j] = finish(shard, enc.lengths[j], j, &label)?;
                }
            }
        }
        Ok(out)
    }
}

/// Cut a rebuilt shard back to its piece length. The padding must come back
/// as zeros; if not, the inputs were checksum-clean but inconsistent with the
/// parity (say, a survivor from another generation), and the rebuilt bytes
/// cannot be trusted. This check is free, though blind when there is no
/// padding.
fn finish(mut shard: Vec<u8>, len: usize, index: usize, label: &GroupLabel<'_>) -> Result<Vec<u8>> {
    if shard
        .get(len..)
        .is_some_and(|pad| pad.iter().any(|&b| b != 0))
    {
        return Err(label.corrupt(
            index,
            format!(
                "rebuilt {} has non-zero padding: the surviving shards do not belong \
                 to the same encoding",
                label.name(&[index])
            ),
        ));
    }
    shard.truncate(len);
    Ok(shard)
}

/// Encoding throughput of [`bench_encode`], in GB/s (10⁹ bytes per second)
/// of input pieces processed: medians of alternating rounds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BenchFigures {
    /// Bytes per piece.
    pub bytes: usize,
    /// Pieces per group.
    pub group: usize,
    /// Reed–Solomon parity shards.
    pub parity: usize,
    /// A plain copy of the group's bytes: the memory-bandwidth reference.
    pub memcpy_gb_s: f64,
    /// [`encode`] with [`Code::Xor`].
    pub xor_gb_s: f64,
    /// [`encode`] with [`Code::ReedSolomon`].
    pub rs_gb_s: f64,
    /// The Reed–Solomon coding alone, block by block as [`encode`] does it,
    /// without copying the parity out of the encoder's buffer or
    /// checksumming it: the library's share of [`BenchFigures::rs_gb_s`].
    pub rs_coding_gb_s: f64,
    /// CRC32C over the group's bytes. [`encode`] checksums its parity
    /// shards (`m` shards of the length of a piece), so with `k` pieces the
    /// checksum costs `m / k` of the group's bytes at this rate.
    pub crc32c_gb_s: f64,
}

/// Each measurement runs at least this long, so that timer resolution and
/// one-off costs do not dominate.
const BENCH_MIN: Duration = Duration::from_millis(20);

/// Rounds of the measurements, alternated (memcpy, XOR, RS, ..., memcpy,
/// ...) so that a machine that speeds up or slows down during the bench
/// (turbo budget, a noisy neighbour) affects all of them alike; each figure
/// is the median of its rounds.
const BENCH_ROUNDS: usize = 7;

/// Input GB/s of `op` over `bytes` bytes per call, over at least
/// [`BENCH_MIN`].
fn rate(bytes: usize, op: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    let mut iters: u64 = 0;
    loop {
        op()?;
        iters += 1;
        let elapsed = start.elapsed();
        if elapsed >= BENCH_MIN {
            return Ok(bytes as f64 * iters as f64 / elapsed.as_secs_f64() / 1e9);
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Measure encoding of a group of `group` pieces of `bytes` each, with XOR
/// and with Reed–Solomon of `parity` shards, against a plain copy of the same
/// bytes, for `lazarus bench-codec`; also the Reed–Solomon coding alone and
/// CRC32C, the two parts of its cost besides copying the parity out. Seven
/// alternating rounds after one untimed call of each (page faults of fresh
/// buffers and allocator growth are not steady state). Takes about a second.
///
/// Errors with [`Error::Config`] when `group` or `parity` cannot be coded (as
/// [`encode`] would).
pub fn bench_encode(bytes: usize, group: usize, parity: usize) -> Result<BenchFigures> {
    let rs = Code::ReedSolomon { parity };
    check_params(rs, group)?;
    // Non-trivial contents (a SplitMix64 stream), in case some layer ever
    // special-cases zeros.
    let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
    let pieces: Vec<Vec<u8>> = (0..group)
        .map(|_| {
            (0..bytes)
                .map(|_| {
                    state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
                    let mut z = state;
                    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
                    (z ^ (z >> 31)) as u8
                })
                .collect()
        })
        .collect();
    let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
    let total = bytes * group;

    let mut dst = vec![0u8; total];
    let shard_len = rs.shard_len(bytes);
    // One coder for all calls, as a store keeps one: the steady state.
    let mut coder = Coder::new();
    // Measurement `k`: 0 memcpy, 1 XOR, 2 Reed–Solomon, 3 its coding
    // alone, 4 CRC32C.
    let mut op = |k: usize| -> Result<()> {
        match k {
            0 => {
                for (g, p) in refs.iter().enumerate() {
                    dst[g * bytes..(g + 1) * bytes].copy_from_slice(p);
                }
                black_box(&mut dst);
            }
            1 => drop(black_box(coder.encode(Code::Xor, black_box(&refs))?)),
            2 => drop(black_box(coder.encode(rs, black_box(&refs))?)),
            3 => coder.rs_parity_blocks(parity, black_box(&refs), shard_len, |_, s| {
                black_box(s);
            })?,
            _ => {
                for p in &refs {
                    black_box(crc32c::crc32c(black_box(p)));
                }
            }
        }
        Ok(())
    };
    let mut figures: [Vec<f64>; 5] = Default::default();
    for k in 0..figures.len() {
        op(k)?;
    }
    for _ in 0..BENCH_ROUNDS {
        for (k, f) in figures.iter_mut().enumerate() {
            f.push(rate(total, &mut || op(k))?);
        }
    }
    let [memcpy_gb_s, xor_gb_s, rs_gb_s, rs_coding_gb_s, crc32c_gb_s] = figures.map(median);
    Ok(BenchFigures {
        bytes,
        group,
        parity,
        memcpy_gb_s,
        xor_gb_s,
        rs_gb_s,
        rs_coding_gb_s,
        crc32c_gb_s,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn random_pieces(rng: &mut ChaCha8Rng, lens: &[usize]) -> Vec<Vec<u8>> {
        lens.iter()
            .map(|&n| (0..n).map(|_| rng.random_range(0..=255u8)).collect())
            .collect()
    }

    fn encode_all(code: Code, pieces: &[Vec<u8>]) -> Encoded {
        let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
        encode(code, &refs).expect("encode")
    }

    /// The pieces as `decode` takes them, with `lost` ones removed.
    fn survivors<'a>(pieces: &'a [Vec<u8>], lost: &[usize]) -> Vec<Option<(&'a [u8], u32)>> {
        pieces
            .iter()
            .enumerate()
            .map(|(i, p)| (!lost.contains(&i)).then(|| (p.as_slice(), crc32c::crc32c(p))))
            .collect()
    }

    fn flip_parity_byte(enc: &mut Encoded, shard: usize) {
        let s = &mut enc.parity[shard];
        let mut v = s.data.to_vec();
        let mid = v.len() / 2;
        v[mid] ^= 0x40;
        s.data = Bytes::from(v);
    }

    fn detail(e: &Error) -> &str {
        match e {
            Error::CorruptCheckpoint { detail, .. } => detail,
            other => panic!("expected CorruptCheckpoint, got {other:?}"),
        }
    }

    #[test]
    fn xor_recovers_each_single_loss() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let pieces = random_pieces(&mut rng, &[1000, 1000, 999, 1500, 1]);
        let enc = encode_all(Code::Xor, &pieces);
        assert_eq!(enc.parity.len(), 1);
        assert_eq!(enc.shard_len, 1500);
        assert!(enc.parity[0].verify());
        assert_eq!(
            decode(&enc, &survivors(&pieces, &[])).expect("none lost"),
            pieces
        );
        for i in 0..pieces.len() {
            let got = decode(&enc, &survivors(&pieces, &[i])).expect("one lost");
            assert_eq!(got, pieces, "lost piece {i}");
        }
    }

    #[test]
    fn xor_parity_made_in_blocks_is_the_whole_shards_xor() {
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        let lens = [2 * XOR_BLOCK + 5, XOR_BLOCK, 0, XOR_BLOCK + 1, 17];
        let pieces = random_pieces(&mut rng, &lens);
        let enc = encode_all(Code::Xor, &pieces);
        let mut naive = vec![0u8; 2 * XOR_BLOCK + 5];
        for p in &pieces {
            for (d, s) in naive.iter_mut().zip(p) {
                *d ^= *s;
            }
        }
        assert_eq!(enc.parity.len(), 1);
        assert_eq!(&enc.parity[0].data[..], &naive[..]);
        assert_eq!(enc.parity[0].crc, crc32c::crc32c(&naive));
        // And each piece comes back from the others and the parity.
        for lost in 0..pieces.len() {
            let back = decode(&enc, &survivors(&pieces, &[lost])).expect("one loss");
            assert_eq!(back[lost], pieces[lost], "piece {lost}");
        }
    }

    #[test]
    fn xor_two_losses_is_an_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        let pieces = random_pieces(&mut rng, &[64; 4]);
        let enc = encode_all(Code::Xor, &pieces);
        let e = decode(&enc, &survivors(&pieces, &[1, 3])).expect_err("two lost");
        assert!(matches!(e, Error::CorruptCheckpoint { owner: 1, .. }));
        assert!(detail(&e).contains("pieces 1, 3"), "{e}");
    }

    #[test]
    fn rs2_recovers_every_pair_in_a_group_of_five() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let pieces = random_pieces(&mut rng, &[4096, 4000, 4096, 17, 4095]);
        let enc = encode_all(Code::ReedSolomon { parity: 2 }, &pieces);
        assert_eq!(enc.parity.len(), 2);
        assert_eq!(enc.shard_len, 4096);
        for i in 0..5 {
            let got = decode(&enc, &survivors(&pieces, &[i])).expect("one lost");
            assert_eq!(got, pieces, "lost {i}");
            for j in i + 1..5 {
                let got = decode(&enc, &survivors(&pieces, &[i, j])).expect("two lost");
                assert_eq!(got, pieces, "lost {i} and {j}");
            }
        }
    }

    /// Pieces over several coding blocks, the last one short, and pieces
    /// that end inside, at and before a block boundary.
    #[test]
    fn rs2_recovers_pieces_spanning_several_blocks() {
        let mut rng = ChaCha8Rng::seed_from_u64(31);
        let long = 2 * RS_BLOCK + 4001;
        let pieces = random_pieces(&mut rng, &[long, RS_BLOCK, RS_BLOCK + 1, 17]);
        let enc = encode_all(Code::ReedSolomon { parity: 2 }, &pieces);
        assert_eq!(enc.shard_len, long + 1);
        assert!(enc.parity.iter().all(Shard::verify));
        for i in 0..4 {
            for j in i + 1..4 {
                let got = decode(&enc, &survivors(&pieces, &[i, j])).expect("two lost");
                assert_eq!(got, pieces, "lost {i} and {j}");
            }
        }
    }

    #[test]
    fn rs2_recovers_a_data_piece_and_a_parity_shard() {
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        let pieces = random_pieces(&mut rng, &[300; 5]);
        let enc = encode_all(Code::ReedSolomon { parity: 2 }, &pieces);
        for p in 0..2 {
            // The parity shard is gone from its holder...
            let mut dropped = enc.clone();
            dropped.parity.retain(|s| s.index != p);
            // ...or it is there but corrupt.
            let mut flipped = enc.clone();
            flip_parity_byte(&mut flipped, p);
            for i in 0..5 {
                for e in [&dropped, &flipped] {
                    let got = decode(e, &survivors(&pieces, &[i])).expect("recoverable");
                    assert_eq!(got, pieces, "lost data {i} and parity {p}");
                }
            }
        }
    }

    #[test]
    fn rs2_three_losses_is_a_clear_error() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let pieces = random_pieces(&mut rng, &[128; 5]);
        let enc = encode_all(Code::ReedSolomon { parity: 2 }, &pieces);
        let e = decode(&enc, &survivors(&pieces, &[0, 2, 4])).expect_err("three lost");
        assert!(matches!(e, Error::CorruptCheckpoint { owner: 0, .. }));
        let d = detail(&e);
        assert!(d.contains("pieces 0, 2, 4") && d.contains("rs:2"), "{d}");

        // Two data pieces and one parity shard: also three losses.
        let mut dropped = enc.clone();
        dropped.parity.truncate(1);
        let e = decode(&dropped, &survivors(&pieces, &[1, 3])).expect_err("three lost");
        assert!(detail(&e).contains("1 parity shard(s) are missing"), "{e}");

        // With labels the error names ranks and the generation.
        let owners = [10, 11, 12, 13, 14];
        let label = GroupLabel {
            generation: 7,
            owners: &owners,
        };
        let e =
            decode_labelled(&enc, &survivors(&pieces, &[0, 2, 4]), label).expect_err("three lost");
        assert!(matches!(
            e,
            Error::CorruptCheckpoint {
                owner: 10,
                generation: 7,
                ..
            }
        ));
        assert!(detail(&e).contains("(rank(s) 10, 12, 14)"), "{e}");
    }

    #[test]
    fn unequal_lengths_including_empty_round_trip_exactly() {
        let mut rng = ChaCha8Rng::seed_from_u64(6);
        for lens in [&[0, 1, 7, 1000, 3][..], &[0, 0, 0], &[0], &[5], &[3, 0, 1]] {
            let pieces = random_pieces(&mut rng, lens);
            let n = pieces.len();
            for code in [
                Code::Xor,
                Code::ReedSolomon { parity: 1 },
                Code::ReedSolomon { parity: 2 },
            ] {
                let enc = encode_all(code, &pieces);
                assert_eq!(enc.lengths, lens);
                if code != Code::Xor {
                    assert!(enc.shard_len >= 2 && enc.shard_len.is_multiple_of(2));
                }
                for i in 0..n {
                    let got = decode(&enc, &survivors(&pieces, &[i])).expect("one lost");
                    assert_eq!(got, pieces, "{code}, lengths {lens:?}, lost {i}");
                    if code == (Code::ReedSolomon { parity: 2 }) {
                        for j in i + 1..n {
                            let got = decode(&enc, &survivors(&pieces, &[i, j])).expect("two");
                            assert_eq!(got, pieces, "{code}, {lens:?}, lost {i}, {j}");
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn corrupt_parity_is_detected_and_treated_as_lost() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let pieces = random_pieces(&mut rng, &[500, 501, 502, 503]);

        let mut xor = encode_all(Code::Xor, &pieces);
        flip_parity_byte(&mut xor, 0);
        assert!(!xor.parity[0].verify());
        // Nothing lost: the bad parity is not needed.
        assert_eq!(
            decode(&xor, &survivors(&pieces, &[])).expect("intact"),
            pieces
        );
        // One lost: the only parity is unusable, so it cannot be rebuilt
        // (rather than rebuilt wrong).
        let e = decode(&xor, &survivors(&pieces, &[2])).expect_err("parity bad");
        assert!(
            detail(&e).contains("parity shard(s) 0 fail their checksum"),
            "{e}"
        );

        let mut rs = encode_all(Code::ReedSolomon { parity: 2 }, &pieces);
        flip_parity_byte(&mut rs, 0);
        let got = decode(&rs, &survivors(&pieces, &[1])).expect("one parity left");
        assert_eq!(got, pieces);
        let e = decode(&rs, &survivors(&pieces, &[1, 3])).expect_err("one parity too few");
        assert!(
            detail(&e).contains("pieces 1, 3") && detail(&e).contains("parity shard(s) 0 fail"),
            "{e}"
        );
        // A corrupt CRC field (rather than data) is caught the same way.
        let mut rs = encode_all(Code::ReedSolomon { parity: 2 }, &pieces);
        rs.parity[1].crc ^= 1;
        assert_eq!(decode(&rs, &survivors(&pieces, &[3])).expect("ok"), pieces);
        assert!(decode(&rs, &survivors(&pieces, &[0, 3])).is_err());
    }

    #[test]
    fn corrupt_data_piece_is_reported_by_index() {
        let mut rng = ChaCha8Rng::seed_from_u64(8);
        let pieces = random_pieces(&mut rng, &[256; 5]);
        for code in [Code::Xor, Code::ReedSolomon { parity: 2 }] {
            let enc = encode_all(code, &pieces);
            let mut bad = pieces[2].clone();
            bad[10] ^= 1;
            let mut present = survivors(&pieces, &[0]);
            present[2] = Some((&bad, crc32c::crc32c(&pieces[2])));
            let e = decode(&enc, &present).expect_err("corrupt piece");
            assert!(
                matches!(e, Error::CorruptCheckpoint { owner: 2, .. }),
                "{e}"
            );
            assert!(detail(&e).contains("piece 2"), "{e}");

            // A piece of the wrong length is corrupt too, even if its CRC
            // matches its bytes.
            let short = &pieces[4][..255];
            let mut present = survivors(&pieces, &[]);
            present[4] = Some((short, crc32c::crc32c(short)));
            let e = decode(&enc, &present).expect_err("short piece");
            assert!(
                matches!(e, Error::CorruptCheckpoint { owner: 4, .. }),
                "{e}"
            );

            // Dropping the corrupt piece (None) lets it be rebuilt.
            let got = decode(&enc, &survivors(&pieces, &[2])).expect("rebuilt");
            assert_eq!(got, pieces);
        }
    }

    #[test]
    fn survivors_from_another_encoding_are_caught_by_padding() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let pieces = random_pieces(&mut rng, &[100, 64, 80]);
        let enc = encode_all(Code::Xor, &pieces);
        // Piece 0 from "another generation": its own CRC is fine, but it is
        // not what the parity was computed over.
        let other = random_pieces(&mut rng, &[100]).remove(0);
        let mut present = survivors(&pieces, &[1]);
        present[0] = Some((&other, crc32c::crc32c(&other)));
        let e = decode(&enc, &present).expect_err("inconsistent");
        assert!(detail(&e).contains("non-zero padding"), "{e}");
    }

    #[test]
    fn bad_parameters_are_config_errors() {
        assert!(matches!(encode(Code::Xor, &[]), Err(Error::Config { .. })));
        let rs0 = encode(Code::ReedSolomon { parity: 0 }, &[b"ab".as_slice()]);
        assert!(matches!(rs0, Err(Error::Config { .. })));
        let huge = encode(Code::ReedSolomon { parity: 70_000 }, &[b"ab".as_slice()]);
        assert!(matches!(huge, Err(Error::Config { .. })));
        let enc = encode(Code::Xor, &[b"ab".as_slice(), b"c"]).expect("encode");
        let e = decode(&enc, &[None]).expect_err("wrong count");
        assert!(matches!(e, Error::Config { .. }));
        let mut bad = enc.clone();
        bad.shard_len = 7;
        let e = decode(&bad, &[None, Some((b"c", crc32c::crc32c(b"c")))]).expect_err("bad len");
        assert!(matches!(e, Error::Codec { .. }));
        assert!(matches!(bench_encode(8, 0, 2), Err(Error::Config { .. })));
    }

    /// Random groups, sizes and loss patterns: decoding succeeds exactly when
    /// no more shards are lost than the code tolerates, and is then exact.
    /// One [`Coder`] serves every round, so its scratch space is reset across
    /// changing group sizes, codes and shard lengths; its parity must equal
    /// that of a fresh coder.
    #[test]
    fn randomized_sizes_and_loss_patterns() {
        let mut rng = ChaCha8Rng::seed_from_u64(0x1a2a_7005);
        let mut coder = Coder::new();
        let (mut rebuilt, mut refused) = (0, 0);
        for round in 0..400 {
            let k = rng.random_range(1..=8usize);
            let code = if rng.random_range(0..3u8) == 0 {
                Code::Xor
            } else {
                Code::ReedSolomon {
                    parity: rng.random_range(1..=4usize),
                }
            };
            let m = code.parity_shards();
            // Half the time equal lengths (no padding), else anything.
            let base = rng.random_range(0..3000usize);
            let equal = rng.random_range(0..2u8) == 0;
            let lens: Vec<usize> = (0..k)
                .map(|_| {
                    if equal {
                        base
                    } else {
                        rng.random_range(0..3000)
                    }
                })
                .collect();
            let pieces = random_pieces(&mut rng, &lens);
            let refs: Vec<&[u8]> = pieces.iter().map(Vec::as_slice).collect();
            let mut enc = coder.encode(code, &refs).expect("encode");
            assert_eq!(enc, encode_all(code, &pieces), "reused coder differs");

            let lost: Vec<usize> = (0..k).filter(|_| rng.random_range(0..3u8) == 0).collect();
            let mut parity_lost = 0;
            for j in 0..m {
                match rng.random_range(0..5u8) {
                    0 => {
                        enc.parity.retain(|s| s.index != j);
                        parity_lost += 1;
                    }
                    1 => {
                        if let Some(pos) = enc.parity.iter().position(|s| s.index == j) {
                            if enc.shard_len > 0 {
                                flip_parity_byte(&mut enc, pos);
                            } else {
                                enc.parity[pos].crc ^= 1;
                            }
                            parity_lost += 1;
                        }
                    }
                    _ => {}
                }
            }
            let res = coder.decode(&enc, &survivors(&pieces, &lost), GroupLabel::default());
            let ctx = format!(
                "round {round}: {code}, lengths {lens:?}, lost {lost:?}, {parity_lost} parity lost"
            );
            if lost.is_empty() || lost.len() + parity_lost <= m {
                assert_eq!(res.expect(&ctx), pieces, "{ctx}");
                rebuilt += usize::from(!lost.is_empty());
            } else {
                let e = res.expect_err(&ctx);
                assert!(matches!(e, Error::CorruptCheckpoint { .. }), "{ctx}: {e}");
                refused += 1;
            }
        }
        // Both outcomes must be exercised, or the test proves little.
        assert!(
            rebuilt > 100 && refused > 50,
            "{rebuilt} rebuilt, {refused} refused"
        );
    }

    #[test]
    #[ignore = "benchmark: run with --ignored --nocapture in release"]
    fn bench_encode_figures() {
        for (bytes, group, parity) in [(1 << 20, 4, 2), (16 << 20, 8, 2)] {
            let f = bench_encode(bytes, group, parity).expect("bench");
            eprintln!(
                "bench_encode({} MiB, group {group}, parity {parity}): {}",
                bytes >> 20,
                serde_json::to_string(&f).expect("json")
            );
        }
    }
}
