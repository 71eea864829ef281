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
use super::datatype::{
    Equivalence, ReduceOp, copy_from_bytes, extend_from_bytes, read_vec, slice_to_bytes,
    vec_into_bytes,
};
use crate::engine::frame::Tag;
use crate::engine::{COMMUNICATOR_CONTEXTS, CollStart, collective_tag};
use crate::protocol::Collective;
use crate::segments::Segments;
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
    if src.len() != std::mem::size_of_val(dst) {
        return Err(Error::SizeMismatch {
            expected: std::mem::size_of_val(dst),
            got: src.len(),
            what: what.into(),
        });
    }
    copy_from_bytes(src, dst).map_err(|why| why.error::<T>(src.len(), what))
}

fn decode<T: Equivalence>(b: &[u8], what: &'static str) -> Result<Vec<T>> {
    read_vec(b).map_err(|why| why.error::<T>(b.len(), what))
}

/// Communicators of at most this many ranks all-gather by sending every
/// block to every member directly (see
/// [`Communicator::all_gather_varcount`]).
pub const DIRECT_ALL_GATHER_MAX: usize = 16;

/// The head of an all-gather's result: the number of members, then each
/// one's count of elements (little-endian `u64`s); the blocks follow.
fn all_gather_header(counts: impl ExactSizeIterator<Item = u64>) -> Vec<u8> {
    let mut h = Vec::with_capacity(8 * (counts.len() + 1));
    h.extend_from_slice(&(counts.len() as u64).to_le_bytes());
    for c in counts {
        h.extend_from_slice(&c.to_le_bytes());
    }
    h
}

/// Read an all-gather's result ([`all_gather_header`], then the blocks),
/// wherever its segments are cut: it may come from another rank's log.
fn all_gather_decode<T: Equivalence>(got: &Segments) -> Result<(Vec<T>, Vec<usize>)> {
    let bad = |what: &str| Error::SizeMismatch {
        expected: 8,
        got: got.len(),
        what: format!("all_gather result: {what}").into(),
    };
    let mut word = [0u8; 8];
    if got.len() < 8 {
        return Err(bad("no header"));
    }
    got.copy_to_slice(0, &mut word);
    let head = usize::try_from(u64::from_le_bytes(word))
        .ok()
        .and_then(|n| n.checked_add(1)?.checked_mul(8))
        .filter(|&h| h <= got.len())
        .ok_or_else(|| bad("counts past the end"))?;
    let mut counts = vec![0u64; head / 8 - 1];
    got.copy_to_slice(8, bytemuck::cast_slice_mut(&mut counts));
    let elem = std::mem::size_of::<T>();
    let data = got.len() - head;
    let total = (counts.iter()).try_fold(0u64, |sum, &c| sum.checked_add(c));
    if elem == 0 || total != Some((data / elem) as u64) || !data.is_multiple_of(elem) {
        return Err(bad("the counts do not add up to the data"));
    }
    // Block by block, without a copy of the whole: the blocks are segments
    // of their own unless the result came as one buffer.
    let mut out = Vec::with_capacity(data / elem);
    let mut at = 0;
    for s in got.segments() {
        let part = s.get(head.saturating_sub(at)..).unwrap_or_default();
        at += s.len();
        if !part.len().is_multiple_of(elem) {
            // An element cut between segments: read the rest in one piece.
            let done = out.len() * elem;
            extend_from_bytes(&mut out, &got.slice(head + done..got.len()))
                .map_err(|why| why.error::<T>(got.len(), "all_gather"))?;
            break;
        }
        extend_from_bytes(&mut out, part).map_err(|why| why.error::<T>(got.len(), "all_gather"))?;
    }
    Ok((out, counts.into_iter().map(|c| c as usize).collect()))
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

    /// A collective whose result (`run`'s) is the same at every member:
    /// taken from a log when the engine has it, and started again or
    /// completed from a log when a failure interrupts an attempt. A rank
    /// that completes from a log still sends, through `forward`, what the
    /// algorithm has it send to others (its part of a broadcast tree, its
    /// block of an all-gather; receivers that have it drop it), so no
    /// member waits for a message the log replaced.
    fn same_result(
        &self,
        kind: Collective,
        run: impl Fn(Call) -> Result<Segments>,
        forward: impl Fn(Call, &Segments) -> Result<()>,
    ) -> Result<Segments> {
        let (index, unlogged, logged) = match self.begin(kind)? {
            CollStart::Logged { index, result } => (index, true, Some(result)),
            CollStart::Run { index, unlogged } => (index, unlogged, None),
        };
        let call = Call {
            tag: collective_tag(kind, index),
            unlogged,
        };
        let (result, from_log) = match logged {
            Some(result) => (result, true),
            None => loop {
                match run(call) {
                    Ok(b) => break (b, false),
                    Err(Error::CollectiveInterrupted) => {
                        if let Some(result) = self.engine.borrow_mut().coll_retry()? {
                            break (result, true);
                        }
                    }
                    Err(e) => return Err(e),
                }
            },
        };
        if from_log {
            forward(call, &result)?;
        }
        self.engine
            .borrow_mut()
            .coll_end(self.coll, index, kind, Some(&result))?;
        Ok(result)
    }

    /// [`Self::same_result`] for an algorithm that ends with a broadcast
    /// from `root` ([`Self::bcast_tree`]): its result is one buffer.
    fn broadcast_result(
        &self,
        kind: Collective,
        root: Rank,
        run: impl Fn(Call) -> Result<Bytes>,
    ) -> Result<Bytes> {
        let result = self.same_result(
            kind,
            |call| run(call).map(Segments::from),
            |call, result| {
                self.bcast_tree(call, root, result.to_bytes(), true)?;
                Ok(())
            },
        )?;
        Ok(result.to_bytes())
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
    ///
    /// # Examples
    ///
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    ///
    /// use lazarus::Config;
    ///
    /// // Ranks are threads on the default backend, so they can share a counter.
    /// let arrived = Arc::new(AtomicUsize::new(0));
    /// let counter = arrived.clone();
    /// let report = lazarus::run(&Config::new(4), move |ctx| {
    ///     counter.fetch_add(1, Ordering::SeqCst);
    ///     ctx.world().barrier()?;
    ///     // Nobody leaves the barrier before everybody has arrived.
    ///     Ok(counter.load(Ordering::SeqCst))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![4; 4]);
    /// ```
    pub fn barrier(&self) -> Result<()> {
        self.broadcast_result(Collective::Barrier, 0, |call| {
            self.reduce_vec::<u8>(call, 0, &[], ReduceOp::NoOp)?;
            self.bcast_bytes(call, 0, Bytes::new())
        })?;
        Ok(())
    }

    /// Broadcast `buf` from `root` into every rank's `buf`.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let mut buf = if world.rank() == 1 { [7u64, 8, 9] } else { [0; 3] };
    ///     world.broadcast_into(1, &mut buf)?;
    ///     Ok(buf)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![[7, 8, 9]; 3]);
    /// ```
    pub fn broadcast_into<T: Equivalence>(&self, root: Rank, buf: &mut [T]) -> Result<()> {
        self.check_root(root)?;
        let data = if self.rank() == root {
            slice_to_bytes(buf)
        } else {
            Bytes::new()
        };
        let got = self.broadcast_result(Collective::Broadcast, root, |call| {
            self.bcast_bytes(call, root, data.clone())
        })?;
        if self.rank() != root {
            copy_exact(&got, buf, "broadcast buffer")?;
        }
        Ok(())
    }

    /// Broadcast a structured value from `root` (`value` is read only there).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let mine = (world.rank() == 0).then(|| ("grid".to_string(), vec![4u32, 4]));
    ///     let got: (String, Vec<u32>) = world.broadcast_value(0, mine.as_ref())?;
    ///     Ok(got)
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![("grid".to_string(), vec![4, 4]); 3]
    /// );
    /// ```
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
        let got = self.broadcast_result(Collective::Broadcast, root, |call| {
            self.bcast_bytes(call, root, data.clone())
        })?;
        Ok(postcard::from_bytes(&got)?)
    }

    /// Reduce to `root`: the root gets `Some(result)`.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, ReduceOp};
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     world.reduce(2, &[world.rank() as u64, 1], ReduceOp::Sum)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![None, None, Some(vec![6, 4]), None]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, ReduceOp};
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let r = world.rank() as i32;
    ///     let mut max = [0; 2];
    ///     world.all_reduce_into(&[r, -r], &mut max, ReduceOp::Max)?;
    ///     Ok(max)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![[3, 0]; 4]);
    /// ```
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
        let got = self.broadcast_result(Collective::AllReduce, 0, |call| {
            let mine = match self.reduce_vec(call, 0, data, op)? {
                Some(v) => vec_into_bytes(v),
                None => Bytes::new(),
            };
            self.bcast_bytes(call, 0, mine)
        })?;
        copy_exact(&got, out, "all_reduce result")
    }

    /// Reduce one value to every rank.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, ReduceOp};
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     world.all_reduce(world.rank() as u64 + 1, ReduceOp::Prod)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![24; 4]);
    /// ```
    pub fn all_reduce<T: Equivalence>(&self, x: T, op: ReduceOp) -> Result<T> {
        let mut out = [x];
        self.all_reduce_into(&[x], &mut out, op)?;
        Ok(out[0])
    }

    /// Gather variable-length contributions to `root`, in rank order: the
    /// root gets `Some((concatenation, counts))`.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let r = world.rank();
    ///     // Rank r contributes r + 1 copies of r.
    ///     world.gather_varcount(0, &vec![r as u32; r + 1])
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![Some((vec![0, 1, 1, 2, 2, 2], vec![1, 2, 3])), None, None]
    /// );
    /// ```
    pub fn gather_varcount<T: Equivalence>(
        &self,
        root: Rank,
        data: &[T],
    ) -> Result<Option<(Vec<T>, Vec<usize>)>> {
        self.check_root(root)?;
        self.rooted(Collective::Gather, |call| self.gather_in(call, root, data))
    }

    /// Gather equal contributions to `root`, in rank order.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     world.gather(1, &[world.rank() as u64 * 10])
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![None, Some(vec![0, 10, 20, 30]), None, None]
    /// );
    /// ```
    pub fn gather<T: Equivalence>(&self, root: Rank, data: &[T]) -> Result<Option<Vec<T>>> {
        Ok(self.gather_varcount(root, data)?.map(|(v, _)| v))
    }

    /// Every rank gets every rank's (variable-length) contribution, in rank
    /// order, with the counts.
    ///
    /// On communicators of at most [`DIRECT_ALL_GATHER_MAX`] ranks every
    /// rank sends its block to every other one: one message time, and no
    /// rank concatenates the others' blocks into a buffer of its own. The
    /// result is the blocks as they arrived ([`Segments`]), which is what
    /// ULML logs, so a logged all-gather costs each rank fresh memory for
    /// its own block only, where a gather to rank 0 and a broadcast made
    /// rank 0 allocate the whole result on every call (the kernel zeroing
    /// those pages was most of ULML's failure-free overhead on CG W,
    /// `lazarus bench cg --class W`). Larger communicators gather to rank 0
    /// and broadcast: 2(P − 1) messages instead of P(P − 1).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let r = world.rank();
    ///     // Rank r contributes r copies of r: rank 0 nothing.
    ///     world.all_gather_varcount(&vec![r as u32; r])
    /// });
    /// let expected = (vec![1, 2, 2], vec![0, 1, 2]);
    /// assert_eq!(report.outcome.unwrap(), vec![expected; 3]);
    /// ```
    pub fn all_gather_varcount<T: Equivalence>(&self, data: &[T]) -> Result<(Vec<T>, Vec<usize>)> {
        let got = if self.size() <= DIRECT_ALL_GATHER_MAX {
            let mine = slice_to_bytes(data);
            self.same_result(
                Collective::AllGather,
                |call| self.exchange_blocks::<T>(call, &mine),
                |call, _| self.send_to_others(call, &mine),
            )?
        } else {
            Segments::from(self.broadcast_result(Collective::AllGather, 0, |call| {
                let Some((all, counts)) = self.gather_in(call, 0, data)? else {
                    return self.bcast_bytes(call, 0, Bytes::new());
                };
                let header = all_gather_header(counts.iter().map(|&c| c as u64));
                let mut buf = Vec::with_capacity(header.len() + std::mem::size_of_val(&all[..]));
                buf.extend_from_slice(&header);
                buf.extend_from_slice(bytemuck::cast_slice(&all));
                self.bcast_bytes(call, 0, Bytes::from(buf))
            })?)
        };
        all_gather_decode(&got)
    }

    /// Send `block` to every other member, starting after this rank (so
    /// that not every rank sends to rank 0 first).
    fn send_to_others(&self, call: Call, block: &Bytes) -> Result<()> {
        let (me, size) = (self.rank(), self.size());
        for k in 1..size {
            self.csend(call, (me + k) % size, block.clone())?;
        }
        Ok(())
    }

    /// The direct all-gather: send `mine` to every other member, receive
    /// theirs; the result is the header then the blocks in rank order.
    fn exchange_blocks<T: Equivalence>(&self, call: Call, mine: &Bytes) -> Result<Segments> {
        self.send_to_others(call, mine)?;
        let elem = std::mem::size_of::<T>();
        let mut blocks = Vec::with_capacity(self.size());
        for r in 0..self.size() {
            let block = if r == self.rank() {
                mine.clone()
            } else {
                self.crecv(call, r)?
            };
            if elem == 0 || !block.len().is_multiple_of(elem) {
                return Err(Error::SizeMismatch {
                    expected: elem,
                    got: block.len(),
                    what: format!("all_gather block from rank {r}").into(),
                });
            }
            blocks.push(block);
        }
        let header = all_gather_header(blocks.iter().map(|b| (b.len() / elem) as u64));
        Ok(std::iter::once(Bytes::from(header)).chain(blocks).collect())
    }

    /// Every rank gets every rank's contribution, in rank order.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     world.all_gather(&[world.rank() as u64, 100])
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![0, 100, 1, 100, 2, 100]; 3]);
    /// ```
    pub fn all_gather<T: Equivalence>(&self, data: &[T]) -> Result<Vec<T>> {
        Ok(self.all_gather_varcount(data)?.0)
    }

    /// Scatter `count` elements to each rank from `root` (`data`, of
    /// `count * size` elements, is read only at the root).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let data: Vec<u64> = (0..8).collect(); // read at the root only
    ///     world.scatter(0, (world.rank() == 0).then_some(&data[..]), 2)
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![vec![0, 1], vec![2, 3], vec![4, 5], vec![6, 7]]
    /// );
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let i = world.rank() as u64;
    ///     // Block j (one element here) goes to rank j.
    ///     let blocks: Vec<u64> = (0..3).map(|j| 10 * i + j).collect();
    ///     world.all_to_all(&blocks)
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![vec![0, 10, 20], vec![1, 11, 21], vec![2, 12, 22]]
    /// );
    /// ```
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
        let (out, counts) = self.all_to_all_varcount(data, &vec![chunk; size])?;
        match counts.into_iter().find(|&c| c != chunk) {
            Some(got) => Err(Error::SizeMismatch {
                expected: chunk,
                got,
                what: "all_to_all block".into(),
            }),
            None => Ok(out),
        }
    }

    /// Every rank sends the next `counts[j]` elements of `data` to rank `j`
    /// (`MPI_Alltoallv`, blocks in rank order); returns what it received,
    /// in rank order, and how many elements came from each rank.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let i = world.rank() as u64;
    ///     // Rank i sends j + 1 copies of 10 i + j to rank j.
    ///     let counts: Vec<usize> = (1..=3).collect();
    ///     let data: Vec<u64> = (0..3)
    ///         .flat_map(|j| std::iter::repeat_n(10 * i + j, j as usize + 1))
    ///         .collect();
    ///     world.all_to_all_varcount(&data, &counts)
    /// });
    /// let out = report.outcome.unwrap();
    /// assert_eq!(out[1], (vec![1, 1, 11, 11, 21, 21], vec![2, 2, 2]));
    /// ```
    pub fn all_to_all_varcount<T: Equivalence>(
        &self,
        data: &[T],
        counts: &[usize],
    ) -> Result<(Vec<T>, Vec<usize>)> {
        let size = self.size();
        if counts.len() != size {
            return Err(Error::SizeMismatch {
                expected: size,
                got: counts.len(),
                what: "all_to_all_varcount counts (one per rank)".into(),
            });
        }
        let total: usize = counts.iter().sum();
        if total != data.len() {
            return Err(Error::SizeMismatch {
                expected: total,
                got: data.len(),
                what: "all_to_all_varcount buffer (the sum of the counts)".into(),
            });
        }
        let starts: Vec<usize> = counts
            .iter()
            .scan(0, |at, &c| {
                *at += c;
                Some(*at - c)
            })
            .collect();
        let block = |j: usize| &data[starts[j]..starts[j] + counts[j]];
        self.rooted(Collective::AllToAll, |call| {
            for j in (0..size).filter(|&j| j != self.rank()) {
                self.csend(call, j, slice_to_bytes(block(j)))?;
            }
            let mut out = Vec::with_capacity(data.len());
            let mut got_counts = Vec::with_capacity(size);
            for i in 0..size {
                let before = out.len();
                if i == self.rank() {
                    out.extend_from_slice(block(i));
                } else {
                    let got: Vec<T> = decode(&self.crecv(call, i)?, "all_to_all")?;
                    out.extend(got);
                }
                got_counts.push(out.len() - before);
            }
            Ok((out, got_counts))
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let dup = world.duplicate()?;
    ///     assert_eq!((dup.rank(), dup.size()), (world.rank(), world.size()));
    ///     if world.rank() == 0 {
    ///         dup.send(1, 0, &[1u64])?;
    ///         world.send(1, 0, &[2u64])?;
    ///         return Ok(vec![]);
    ///     }
    ///     // Same source and tag, but each receive matches its own communicator's
    ///     // message only.
    ///     let (a, _) = world.receive::<u64>(0, 0)?;
    ///     let (b, _) = dup.receive::<u64>(0, 0)?;
    ///     Ok(vec![a[0], b[0]])
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![], vec![2, 1]]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let me = world.rank();
    ///     // Colors 0 (ranks 0, 2) and 1 (rank 1); rank 3 joins none. Keys in
    ///     // reverse: rank 2 comes first in its communicator.
    ///     let color = (me != 3).then_some(me as u32 % 2);
    ///     let sub = world.split(color, -(me as i64))?;
    ///     Ok(sub.map(|c| (c.rank(), c.size())))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![Some((1, 2)), Some((0, 1)), Some((0, 2)), None]
    /// );
    /// ```
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

#[cfg(test)]
mod tests {
    use super::*;

    /// An all-gather's result as it may be held: `cuts` are the byte
    /// offsets where its segments end (a result from another rank's log is
    /// one buffer; a checkpoint's blobs keep the segments they were).
    fn cut(flat: &[u8], cuts: &[usize]) -> Segments {
        let mut at = 0;
        let mut s: Segments = (cuts.iter().chain([&flat.len()]))
            .map(|&c| {
                let b = Bytes::copy_from_slice(&flat[at..c]);
                at = c;
                b
            })
            .collect();
        s.push(Bytes::new());
        s
    }

    #[test]
    fn all_gather_results_decode_wherever_they_are_cut() {
        let counts = [2u64, 0, 3];
        let data: Vec<u64> = (10..15).collect();
        let mut flat = all_gather_header(counts.into_iter());
        flat.extend_from_slice(bytemuck::cast_slice(&data));
        let head = 8 * 4;
        for cuts in [
            vec![],
            vec![head, head + 16, head + 16],
            vec![3, head - 1, head + 5, head + 21],
            vec![1, 2, head + 39],
        ] {
            let (got, n) = all_gather_decode::<u64>(&cut(&flat, &cuts)).expect("decodes");
            assert_eq!(got, data, "{cuts:?}");
            assert_eq!(n, [2, 0, 3], "{cuts:?}");
        }
    }

    #[test]
    fn damaged_all_gather_results_are_errors() {
        let mut flat = all_gather_header([1u64, 1].into_iter());
        flat.extend_from_slice(bytemuck::cast_slice(&[1u64, 2]));
        let short = &flat[..flat.len() - 8];
        let mut huge = flat.clone();
        huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
        for bad in [&flat[..5], short, &huge[..], &flat[..flat.len() - 1]] {
            let err = all_gather_decode::<u64>(&Segments::from(bad.to_vec()));
            assert!(matches!(err, Err(Error::SizeMismatch { .. })), "{err:?}");
        }
        // Elements of another size than the counts say.
        let err = all_gather_decode::<u32>(&Segments::from(flat));
        assert!(matches!(err, Err(Error::SizeMismatch { .. })), "{err:?}");
    }
}
