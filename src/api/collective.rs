//! Collective operations (MPI chapter 5) and communicator creation (chapter 6).
//!
//! All collectives run over the communicator's private collective context, so
//! they never match point-to-point traffic. Reductions use binomial trees of a
//! fixed shape and combine children in a fixed order (`acc = acc op child`,
//! lower relative ranks on the left), so a floating-point result is
//! bit-identical on every run with the same number of ranks, under any
//! protocol and failure schedule (DESIGN principle 5).
//!
//! Every call is numbered per communicator and its messages are tagged with
//! its kind and number ([`collective_tag`]). Under a protocol that logs
//! collective results (ULML, 002 §2.2), a collective whose result is the
//! same at every member is bracketed by the engine: its messages are not
//! logged, each rank logs the result instead, a substitute re-executing it
//! takes the logged result, and an attempt that a failure interrupted is
//! started again or completed from another member's log.

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::comm::{Communicator, Source, TagMatch};
use super::datatype::{Equivalence, ReduceOp, slice_to_bytes, to_vec, vec_into_bytes};
use crate::engine::frame::Tag;
use crate::engine::{COMMUNICATOR_CONTEXTS, CollStart, collective_tag};
use crate::protocol::Collective;
use crate::{Error, Rank, Result};

/// One call of a collective: the tag of its messages and how they are sent.
#[derive(Debug, Clone, Copy)]
struct Call {
    tag: Tag,
    /// Its result is logged instead of its messages.
    unlogged: bool,
}

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
    fn csend(&self, call: Call, dest: Rank, data: Bytes) -> Result<()> {
        if call.unlogged {
            let dest = self.world_rank(dest)?;
            self.engine
                .borrow_mut()
                .send_unlogged(dest, self.coll, call.tag, data)
        } else {
            self.send_in(self.coll, dest, call.tag, data)
        }
    }

    fn crecv(&self, call: Call, src: Rank) -> Result<Bytes> {
        Ok(self
            .receive_in(self.coll, Source::Rank(src), TagMatch::Tag(call.tag))?
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

    fn begin(&self, kind: Collective) -> Result<CollStart> {
        let logged = self.engine.borrow().logs_collective_results();
        let group: Vec<Rank> = if logged && kind.same_result_everywhere() {
            self.members()
        } else {
            Vec::new()
        };
        self.engine.borrow_mut().coll_begin(self.coll, kind, &group)
    }

    /// A collective whose result (`run`'s) is the same at every member and
    /// ends with a broadcast from `root`: taken from a log when the engine
    /// has it, and started again or completed from a log when a failure
    /// interrupts an attempt. A rank that completes from a log still sends
    /// the result down its broadcast subtree (receivers that have it drop
    /// it), so no member waits for a message the log replaced.
    fn same_result(
        &self,
        kind: Collective,
        root: Rank,
        run: impl Fn(Call) -> Result<Bytes>,
    ) -> Result<Bytes> {
        let (index, unlogged, logged) = match self.begin(kind)? {
            CollStart::Logged { index, result } => (index, true, Some(result)),
            CollStart::Run { index, unlogged } => (index, unlogged, None),
        };
        let call = Call {
            tag: collective_tag(kind, index),
            unlogged,
        };
        let result = match logged {
            Some(result) => self.bcast_tree(call, root, result, true)?,
            None => loop {
                match run(call) {
                    Ok(b) => break b,
                    Err(Error::CollectiveInterrupted) => {
                        let logged = self.engine.borrow_mut().coll_retry()?;
                        if let Some(result) = logged {
                            break self.bcast_tree(call, root, result, true)?;
                        }
                    }
                    Err(e) => return Err(e),
                }
            },
        };
        self.engine
            .borrow_mut()
            .coll_end(self.coll, index, kind, Some(&result))?;
        Ok(result)
    }

    /// A rooted or personalized collective: its messages are logged like
    /// point-to-point ones (no other member holds a dead rank's result).
    fn rooted<R>(&self, kind: Collective, run: impl FnOnce(Call) -> Result<R>) -> Result<R> {
        let index = match self.begin(kind)? {
            CollStart::Run { index, .. } | CollStart::Logged { index, .. } => index,
        };
        let r = run(Call {
            tag: collective_tag(kind, index),
            unlogged: false,
        })?;
        self.engine
            .borrow_mut()
            .coll_end(self.coll, index, kind, None)?;
        Ok(r)
    }

    /// Binomial-tree broadcast of a shared buffer (no copies on the way).
    fn bcast_bytes(&self, call: Call, root: Rank, data: Bytes) -> Result<Bytes> {
        self.bcast_tree(call, root, data, false)
    }

    /// Binomial-tree broadcast: `data` comes from the parent unless `have`
    /// (or this rank is the root), then goes to the children.
    fn bcast_tree(&self, call: Call, root: Rank, mut data: Bytes, have: bool) -> Result<Bytes> {
        let size = self.size();
        let vr = (self.rank() + size - root) % size;
        let mut mask = 1;
        while mask < size {
            if vr & mask != 0 {
                if !have {
                    let parent = (vr - mask + root) % size;
                    data = self.crecv(call, parent)?;
                }
                break;
            }
            mask <<= 1;
        }
        mask >>= 1;
        while mask > 0 {
            if vr + mask < size {
                self.csend(call, (vr + mask + root) % size, data.clone())?;
            }
            mask >>= 1;
        }
        Ok(data)
    }

    /// Binomial-tree reduction to `root`; `Some(result)` at the root.
    fn reduce_vec<T: Equivalence>(
        &self,
        call: Call,
        root: Rank,
        data: &[T],
        op: ReduceOp,
    ) -> Result<Option<Vec<T>>> {
        let size = self.size();
        let vr = (self.rank() + size - root) % size;
        let mut acc = data.to_vec();
        let mut mask = 1;
        while mask < size {
            if vr & mask == 0 {
                let child = vr | mask;
                if child < size {
                    let got: Vec<T> = decode(&self.crecv(call, (child + root) % size)?, "reduce")?;
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
                self.csend(call, parent, vec_into_bytes(acc))?;
                return Ok(None);
            }
            mask <<= 1;
        }
        Ok(Some(acc))
    }

    /// Gather to `root` in rank order: `Some((concatenation, counts))` there.
    fn gather_in<T: Equivalence>(
        &self,
        call: Call,
        root: Rank,
        data: &[T],
    ) -> Result<Option<(Vec<T>, Vec<usize>)>> {
        if self.rank() != root {
            self.csend(call, root, slice_to_bytes(data))?;
            return Ok(None);
        }
        let mut all = Vec::new();
        let mut counts = Vec::with_capacity(self.size());
        for r in 0..self.size() {
            if r == root {
                all.extend_from_slice(data);
                counts.push(data.len());
            } else {
                let got: Vec<T> = decode(&self.crecv(call, r)?, "gather")?;
                counts.push(got.len());
                all.extend(got);
            }
        }
        Ok(Some((all, counts)))
    }

    /// Block until every rank of the communicator has called it.
    pub fn barrier(&self) -> Result<()> {
        self.same_result(Collective::Barrier, 0, |call| {
            self.reduce_vec::<u8>(call, 0, &[], ReduceOp::NoOp)?;
            self.bcast_bytes(call, 0, Bytes::new())
        })?;
        Ok(())
    }

    /// Broadcast `buf` from `root` into every rank's `buf`.
    pub fn broadcast_into<T: Equivalence>(&self, root: Rank, buf: &mut [T]) -> Result<()> {
        self.check_root(root)?;
        let data = if self.rank() == root {
            slice_to_bytes(buf)
        } else {
            Bytes::new()
        };
        let got = self.same_result(Collective::Broadcast, root, |call| {
            self.bcast_bytes(call, root, data.clone())
        })?;
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
        self.check_root(root)?;
        let data = match (self.rank() == root, value) {
            (true, Some(v)) => Bytes::from(postcard::to_allocvec(v)?),
            (true, None) => {
                return Err(Error::app("broadcast_value: the root must supply a value"));
            }
            (false, _) => Bytes::new(),
        };
        let got = self.same_result(Collective::Broadcast, root, |call| {
            self.bcast_bytes(call, root, data.clone())
        })?;
        Ok(postcard::from_bytes(&got)?)
    }

    /// Reduce to `root`: the root gets `Some(result)`.
    pub fn reduce<T: Equivalence>(
        &self,
        root: Rank,
        data: &[T],
        op: ReduceOp,
    ) -> Result<Option<Vec<T>>> {
        self.check_root(root)?;
        self.rooted(Collective::Reduce, |call| {
            self.reduce_vec(call, root, data, op)
        })
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
        let got = self.same_result(Collective::AllReduce, 0, |call| {
            let mine = match self.reduce_vec(call, 0, data, op)? {
                Some(v) => vec_into_bytes(v),
                None => Bytes::new(),
            };
            self.bcast_bytes(call, 0, mine)
        })?;
        copy_exact(&got, out, "all_reduce result")
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
        self.rooted(Collective::Gather, |call| self.gather_in(call, root, data))
    }

    /// Gather equal contributions to `root`, in rank order.
    pub fn gather<T: Equivalence>(&self, root: Rank, data: &[T]) -> Result<Option<Vec<T>>> {
        Ok(self.gather_varcount(root, data)?.map(|(v, _)| v))
    }

    /// Every rank gets every rank's (variable-length) contribution, in rank
    /// order, with the counts.
    pub fn all_gather_varcount<T: Equivalence>(&self, data: &[T]) -> Result<(Vec<T>, Vec<usize>)> {
        let got = self.same_result(Collective::AllGather, 0, |call| {
            let payload = match self.gather_in(call, 0, data)? {
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
            self.bcast_bytes(call, 0, payload)
        })?;
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
            self.rooted(Collective::Scatter, |call| {
                for r in (0..self.size()).filter(|&r| r != root) {
                    self.csend(call, r, slice_to_bytes(&data[r * count..(r + 1) * count]))?;
                }
                Ok(data[root * count..(root + 1) * count].to_vec())
            })
        } else {
            self.rooted(Collective::Scatter, |call| {
                decode(&self.crecv(call, root)?, "scatter")
            })
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
        self.rooted(Collective::AllToAll, |call| {
            for j in (0..size).filter(|&j| j != self.rank()) {
                self.csend(call, j, slice_to_bytes(&data[j * chunk..(j + 1) * chunk]))?;
            }
            let mut out = Vec::with_capacity(data.len());
            for i in 0..size {
                if i == self.rank() {
                    out.extend_from_slice(&data[i * chunk..(i + 1) * chunk]);
                } else {
                    let got: Vec<T> = decode(&self.crecv(call, i)?, "all_to_all")?;
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
        })
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
        let recreated = self.engine.borrow_mut().recreated_communicator();
        let (base, group) = match recreated {
            Some((base, Some(group))) => (base, group),
            Some((_, None)) => {
                return Err(Error::app(
                    "duplicate: the restored checkpoint has a split here \
                     (communicators must be created in the same order on re-execution)",
                ));
            }
            None => {
                let base = self.agree_context(COMMUNICATOR_CONTEXTS)?;
                let group = (0..self.size())
                    .map(|r| self.world_rank(r))
                    .collect::<Result<Vec<_>>>()?;
                self.engine
                    .borrow_mut()
                    .communicator_created(base, Some(group.clone()));
                (base, group)
            }
        };
        self.with_group(group, base)
            .ok_or_else(|| Error::app("duplicate: this rank is not in the group"))
    }

    /// Split into communicators by `color` (`None`: this rank joins none),
    /// ordered by `key` then old rank (MPI_Comm_split).
    ///
    /// Under message logging a rank restored alone re-creates the
    /// communicators of its checkpoint without their collectives (the other
    /// ranks created them before that checkpoint and do not take part
    /// again), so a rank function must create them in the same order on
    /// every execution, as it allocates windows.
    pub fn split(&self, color: Option<u32>, key: i64) -> Result<Option<Communicator>> {
        let recreated = self.engine.borrow_mut().recreated_communicator();
        if let Some((base, group)) = recreated {
            return Ok(group.and_then(|g| self.with_group(g, base)));
        }
        let base = self.agree_context(COMMUNICATOR_CONTEXTS)?;
        let me = [
            color.map_or(-1, i64::from),
            key,
            self.world_rank(self.rank())? as i64,
        ];
        let all = self.all_gather(&me)?;
        let group: Option<Vec<Rank>> = color.map(|color| {
            let mut members: Vec<(i64, usize, Rank)> = all
                .chunks_exact(3)
                .enumerate()
                .filter(|(_, c)| c[0] == i64::from(color))
                .map(|(old, c)| (c[1], old, c[2] as Rank))
                .collect();
            members.sort();
            members.into_iter().map(|(_, _, w)| w).collect()
        });
        self.engine
            .borrow_mut()
            .communicator_created(base, group.clone());
        Ok(group.and_then(|g| self.with_group(g, base)))
    }
}
