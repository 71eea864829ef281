//! Collective operations (MPI chapter 5) and communicator creation (chapter 6).
//!
//! All collectives run over the communicator's private collective context, so
//! they never match point-to-point traffic. Reductions use binomial trees of a
//! fixed shape and combine children in a fixed order (`acc = acc op child`,
//! lower relative ranks on the left), so a floating-point result is
//! bit-identical on every run with the same number of ranks, under any
//! protocol and failure schedule (DESIGN principle 5).

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::comm::{Communicator, Source, TagMatch};
use super::datatype::{Equivalence, ReduceOp, slice_to_bytes, to_vec, vec_into_bytes};
use crate::engine::frame::Tag;
use crate::{Error, Rank, Result};

// One tag per collective kind (hygiene: all ranks call collectives in the
// same order and channels are FIFO, so tags only separate kinds).
const TAG_BARRIER: Tag = 1;
const TAG_BCAST: Tag = 2;
const TAG_REDUCE: Tag = 3;
const TAG_GATHER: Tag = 4;
const TAG_SCATTER: Tag = 5;
const TAG_ALLTOALL: Tag = 6;

/// Copy `src` into `dst`, which must have exactly its length.
fn copy_exact<T: Equivalence>(src: &[u8], dst: &mut [T], what: &'static str) -> Result<()> {
    let dst: &mut [u8] = bytemuck::cast_slice_mut(dst);
    if src.len() != dst.len() {
        return Err(Error::SizeMismatch {
            expected: dst.len(),
            got: src.len(),
            what: what.into(),
        });
    }
    dst.copy_from_slice(src);
    Ok(())
}

fn decode<T: Equivalence>(b: &[u8], what: &'static str) -> Result<Vec<T>> {
    to_vec(b).ok_or(Error::SizeMismatch {
        expected: std::mem::size_of::<T>(),
        got: b.len(),
        what: what.into(),
    })
}

impl Communicator {
    fn csend(&self, dest: Rank, tag: Tag, data: Bytes) -> Result<()> {
        self.send_in(self.coll, dest, tag, data)
    }

    fn crecv(&self, src: Rank, tag: Tag) -> Result<Bytes> {
        Ok(self
            .receive_in(self.coll, Source::Rank(src), TagMatch::Tag(tag))?
            .payload)
    }

    fn check_root(&self, root: Rank) -> Result<()> {
        if root >= self.size() {
            return Err(Error::RankOutOfRange {
                rank: root,
                size: self.size(),
            });
        }
        Ok(())
    }

    /// Binomial-tree broadcast of a shared buffer (no copies on the way).
    fn bcast_bytes(&self, root: Rank, tag: Tag, mut data: Bytes) -> Result<Bytes> {
        self.check_root(root)?;
        let size = self.size();
        let vr = (self.rank() + size - root) % size;
        let mut mask = 1;
        while mask < size {
            if vr & mask != 0 {
                let parent = (vr - mask + root) % size;
                data = self.crecv(parent, tag)?;
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < size {
                self.csend((vr + mask + root) % size, tag, data.clone())?;
            }
            mask >>= 1;
        }
        Ok(data)
    }

    /// Binomial-tree reduction to `root`; `Some(result)` at the root.
    fn reduce_vec<T: Equivalence>(
        &self,
        root: Rank,
        data: &[T],
        op: ReduceOp,
    ) -> Result<Option<Vec<T>>> {
        self.check_root(root)?;
        let size = self.size();
        let vr = (self.rank() + size - root) % size;
        let mut acc = data.to_vec();
        let mut mask = 1;
        while mask < size {
            if vr & mask == 0 {
                let child = vr | mask;
                if child < size {
                    let got: Vec<T> =
                        decode(&self.crecv((child + root) % size, TAG_REDUCE)?, "reduce")?;
                    if got.len() != acc.len() {
                        return Err(Error::SizeMismatch {
                            expected: acc.len() * std::mem::size_of::<T>(),
                            got: got.len() * std::mem::size_of::<T>(),
                            what: "reduce contributions differ in length".into(),
                        });
                    }
                    for (a, x) in acc.iter_mut().zip(got) {
                        *a = a.combine(x, op);
                    }
                }
            } else {
                let parent = ((vr & !mask) + root) % size;
                self.csend(parent, TAG_REDUCE, vec_into_bytes(acc))?;
                return Ok(None);
            }
            mask <<= 1;
        }
        Ok(Some(acc))
    }

    /// Block until every rank of the communicator has called it.
    pub fn barrier(&self) -> Result<()> {
        self.reduce_vec::<u8>(0, &[], ReduceOp::NoOp)?;
        self.bcast_bytes(0, TAG_BARRIER, Bytes::new())?;
        Ok(())
    }

    /// Broadcast `buf` from `root` into every rank's `buf`.
    pub fn broadcast_into<T: Equivalence>(&self, root: Rank, buf: &mut [T]) -> Result<()> {
        let data = if self.rank() == root {
            slice_to_bytes(buf)
        } else {
            Bytes::new()
        };
        let got = self.bcast_bytes(root, TAG_BCAST, data)?;
        if self.rank() != root {
            copy_exact(&got, buf, "broadcast buffer")?;
        }
        Ok(())
    }

    /// Broadcast a structured value from `root` (`value` is read only there).
    pub fn broadcast_value<V: Serialize + DeserializeOwned>(
        &self,
        root: Rank,
        value: Option<&V>,
    ) -> Result<V> {
        let data = match (self.rank() == root, value) {
            (true, Some(v)) => Bytes::from(postcard::to_allocvec(v)?),
            (true, None) => {
                return Err(Error::app("broadcast_value: the root must supply a value"));
            }
            (false, _) => Bytes::new(),
        };
        let got = self.bcast_bytes(root, TAG_BCAST, data)?;
        Ok(postcard::from_bytes(&got)?)
    }

    /// Reduce to `root`: the root gets `Some(result)`.
    pub fn reduce<T: Equivalence>(
        &self,
        root: Rank,
        data: &[T],
        op: ReduceOp,
    ) -> Result<Option<Vec<T>>> {
        self.reduce_vec(root, data, op)
    }

    /// Reduce to every rank (reduce to rank 0, then broadcast: every rank
    /// gets the bit-identical result).
    pub fn all_reduce_into<T: Equivalence>(
        &self,
        data: &[T],
        out: &mut [T],
        op: ReduceOp,
    ) -> Result<()> {
        if data.len() != out.len() {
            return Err(Error::SizeMismatch {
                expected: data.len(),
                got: out.len(),
                what: "all_reduce_into output length".into(),
            });
        }
        let r = self.reduce_vec(0, data, op)?;
        match r {
            Some(v) => {
                self.bcast_bytes(0, TAG_BCAST, slice_to_bytes(&v))?;
                out.copy_from_slice(&v);
            }
            None => {
                let got = self.bcast_bytes(0, TAG_BCAST, Bytes::new())?;
                copy_exact(&got, out, "all_reduce result")?;
            }
        }
        Ok(())
    }

    /// Reduce one value to every rank.
    pub fn all_reduce<T: Equivalence>(&self, x: T, op: ReduceOp) -> Result<T> {
        let mut out = [x];
        self.all_reduce_into(&[x], &mut out, op)?;
        Ok(out[0])
    }

    /// Gather variable-length contributions to `root`, in rank order: the
    /// root gets `Some((concatenation, counts))`.
    pub fn gather_varcount<T: Equivalence>(
        &self,
        root: Rank,
        data: &[T],
    ) -> Result<Option<(Vec<T>, Vec<usize>)>> {
        self.check_root(root)?;
        if self.rank() != root {
            self.csend(root, TAG_GATHER, slice_to_bytes(data))?;
            return Ok(None);
        }
        let mut all = Vec::new();
        let mut counts = Vec::with_capacity(self.size());
        for r in 0..self.size() {
            if r == root {
                all.extend_from_slice(data);
                counts.push(data.len());
            } else {
                let got: Vec<T> = decode(&self.crecv(r, TAG_GATHER)?, "gather")?;
                counts.push(got.len());
                all.extend(got);
            }
        }
        Ok(Some((all, counts)))
    }

    /// Gather equal contributions to `root`, in rank order.
    pub fn gather<T: Equivalence>(&self, root: Rank, data: &[T]) -> Result<Option<Vec<T>>> {
        Ok(self.gather_varcount(root, data)?.map(|(v, _)| v))
    }

    /// Every rank gets every rank's (variable-length) contribution, in rank
    /// order, with the counts.
    pub fn all_gather_varcount<T: Equivalence>(&self, data: &[T]) -> Result<(Vec<T>, Vec<usize>)> {
        let g = self.gather_varcount(0, data)?;
        let payload = match g {
            Some((all, counts)) => {
                let counts64: Vec<u64> = counts.iter().map(|&c| c as u64).collect();
                let mut buf = Vec::with_capacity(
                    8 + counts64.len() * 8 + all.len() * std::mem::size_of::<T>(),
                );
                buf.extend_from_slice(&(counts64.len() as u64).to_le_bytes());
                buf.extend_from_slice(bytemuck::cast_slice(&counts64));
                buf.extend_from_slice(bytemuck::cast_slice(&all));
                Bytes::from(buf)
            }
            None => Bytes::new(),
        };
        let got = self.bcast_bytes(0, TAG_BCAST, payload)?;
        let bad = || Error::SizeMismatch {
            expected: 8,
            got: got.len(),
            what: "all_gather header".into(),
        };
        let n = u64::from_le_bytes(
            got.get(..8)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        ) as usize;
        let counts: Vec<u64> = decode(got.get(8..8 + n * 8).ok_or_else(bad)?, "all_gather counts")?;
        let data: Vec<T> = decode(&got[8 + n * 8..], "all_gather data")?;
        Ok((data, counts.into_iter().map(|c| c as usize).collect()))
    }

    /// Every rank gets every rank's contribution, in rank order.
    pub fn all_gather<T: Equivalence>(&self, data: &[T]) -> Result<Vec<T>> {
        Ok(self.all_gather_varcount(data)?.0)
    }

    /// Scatter `count` elements to each rank from `root` (`data`, of
    /// `count * size` elements, is read only at the root).
    pub fn scatter<T: Equivalence>(
        &self,
        root: Rank,
        data: Option<&[T]>,
        count: usize,
    ) -> Result<Vec<T>> {
        self.check_root(root)?;
        if self.rank() == root {
            let data = data.ok_or_else(|| Error::app("scatter: the root must supply data"))?;
            if data.len() != count * self.size() {
                return Err(Error::SizeMismatch {
                    expected: count * self.size(),
                    got: data.len(),
                    what: "scatter send buffer (elements)".into(),
                });
            }
            for r in (0..self.size()).filter(|&r| r != root) {
                self.csend(
                    r,
                    TAG_SCATTER,
                    slice_to_bytes(&data[r * count..(r + 1) * count]),
                )?;
            }
            Ok(data[root * count..(root + 1) * count].to_vec())
        } else {
            decode(&self.crecv(root, TAG_SCATTER)?, "scatter")
        }
    }

    /// Every rank sends block `j` of `data` (of `data.len() / size`
    /// elements) to rank `j` and receives block `i` from every rank `i`.
    pub fn all_to_all<T: Equivalence>(&self, data: &[T]) -> Result<Vec<T>> {
        let size = self.size();
        if !data.len().is_multiple_of(size) {
            return Err(Error::SizeMismatch {
                expected: size,
                got: data.len(),
                what: "all_to_all buffer is not divisible by the communicator size".into(),
            });
        }
        let chunk = data.len() / size;
        for j in (0..size).filter(|&j| j != self.rank()) {
            self.csend(
                j,
                TAG_ALLTOALL,
                slice_to_bytes(&data[j * chunk..(j + 1) * chunk]),
            )?;
        }
        let mut out = Vec::with_capacity(data.len());
        for i in 0..size {
            if i == self.rank() {
                out.extend_from_slice(&data[i * chunk..(i + 1) * chunk]);
            } else {
                let got: Vec<T> = decode(&self.crecv(i, TAG_ALLTOALL)?, "all_to_all")?;
                if got.len() != chunk {
                    return Err(Error::SizeMismatch {
                        expected: chunk,
                        got: got.len(),
                        what: "all_to_all block".into(),
                    });
                }
                out.extend(got);
            }
        }
        Ok(out)
    }

    /// Agree on `count` fresh context ids (collective): the largest next
    /// free id of any member, so no member reuses one.
    pub(crate) fn agree_context(&self, count: u64) -> Result<u64> {
        let mine = self.engine.borrow().next_context();
        let base = self.all_reduce(mine, ReduceOp::Max)?;
        self.engine.borrow_mut().take_contexts(base, count);
        Ok(base)
    }

    /// A new communicator with the same group and a new context (MPI_Comm_dup).
    pub fn duplicate(&self) -> Result<Communicator> {
        let base = self.agree_context(2)?;
        let group = (0..self.size())
            .map(|r| self.world_rank(r))
            .collect::<Result<Vec<_>>>()?;
        self.with_group(group, base)
            .ok_or_else(|| Error::app("duplicate: this rank is not in the group"))
    }

    /// Split into communicators by `color` (`None`: this rank joins none),
    /// ordered by `key` then old rank (MPI_Comm_split).
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let base = self.agree_context(2)?;
        let me = [
            color.map_or(-1, i64::from),
            key,
            self.world_rank(self.rank())? as i64,
        ];
        let all = self.all_gather(&me)?;
        let Some(color) = color else { return Ok(None) };
        let mut members: Vec<(i64, usize, Rank)> = all
            .chunks_exact(3)
            .enumerate()
            .filter(|(_, c)| c[0] == i64::from(color))
            .map(|(old, c)| (c[1], old, c[2] as Rank))
            .collect();
        members.sort();
        let group = members.into_iter().map(|(_, _, w)| w).collect();
        Ok(self.with_group(group, base))
    }
}
