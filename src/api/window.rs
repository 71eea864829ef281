//! One-sided communication: RMA windows (MPI chapter 11; 003 §2).
//!
//! A window is memory a rank exposes; other ranks read and change it with
//! PUT/GET-family actions without the target's code running. Window memory is
//! owned by the runtime (so it is saved and restored with checkpoints, and
//! lost with its rank). Access happens inside epochs: a fence (GSYNC) opens one
//! to every target, `lock`/`lock_all` open passive-target epochs, and `flush`
//! and `unlock` close the epoch to a target (003 §2.2's `E(p -> q)`).

use std::marker::PhantomData;

use bytes::Bytes;

use super::comm::Communicator;
use bytemuck::checked::{CheckedCastError, try_cast_slice, try_cast_slice_mut};

use super::datatype::{Equivalence, ReduceOp, Unreadable, read_vec, slice_to_bytes};
use crate::driver::{LockType, RmaOp, RmaReply, WinId};
use crate::{Error, Rank, Result};

/// A window of `T` elements on every rank of a communicator.
pub struct Window<T: Equivalence> {
    comm: Communicator,
    id: WinId,
    len: usize,
    _t: PhantomData<T>,
}

impl<T: Equivalence> std::fmt::Debug for Window<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Window")
            .field("id", &self.id)
            .field("len", &self.len)
            .finish()
    }
}

impl Communicator {
    /// Allocate a window of `len` zeroed elements on every rank (collective).
    /// After a rollback, re-allocating it in the same order restores its
    /// checkpointed contents.
    ///
    /// Under message logging a rank restored alone re-creates the window
    /// from its checkpoint without the collective: the other ranks allocated
    /// it before that checkpoint and do not take part again.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let window = ctx.world().allocate_window::<f64>(3)?;
    ///     window.with_local(|memory| memory.to_vec())
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![0.0; 3]; 2]);
    /// ```
    pub fn allocate_window<T: Equivalence>(&self, len: usize) -> Result<Window<T>> {
        let recreated = self.engine.borrow_mut().recreated_window();
        let id = match recreated {
            Some(id) => id,
            None => self.agree_context(1)?,
        };
        let group = (0..self.size())
            .map(|r| self.world_rank(r))
            .collect::<Result<Vec<_>>>()?;
        self.engine
            .borrow_mut()
            .window_create(id, len * std::mem::size_of::<T>(), group)?;
        if recreated.is_none() {
            self.barrier()?;
        }
        Ok(Window {
            comm: self.clone(),
            id,
            len,
            _t: PhantomData,
        })
    }
}

/// The elements a reply on window `id` carries.
fn decode_elements<T: Equivalence>(b: &[u8], id: WinId) -> Result<Vec<T>> {
    read_vec(b).map_err(|why| Error::Rma {
        window: id,
        detail: match why {
            Unreadable::Ragged => "reply is not a whole number of elements".into(),
            Unreadable::InvalidValue => format!(
                "reply holds bytes that are not a valid `{}`",
                std::any::type_name::<T>()
            ),
        },
    })
}

fn data_of(reply: RmaReply, id: WinId) -> Result<Bytes> {
    match reply {
        RmaReply::Data(b) => Ok(b),
        other => Err(Error::Rma {
            window: id,
            detail: format!("expected data, driver replied {other:?}"),
        }),
    }
}

impl<T: Equivalence> Window<T> {
    const ELEM: usize = std::mem::size_of::<T>();

    fn op(&self, target: Rank, op: RmaOp) -> Result<RmaReply> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().rma(self.id, t, op)
    }

    fn decode(&self, b: &[u8]) -> Result<Vec<T>> {
        decode_elements(b, self.id)
    }

    /// The window's id.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let a = world.allocate_window::<u8>(1)?;
    ///     let b = world.allocate_window::<u8>(1)?;
    ///     Ok((a.id(), b.id()))
    /// });
    /// let ids = report.outcome.unwrap();
    /// // The same on every rank, another one for another window.
    /// assert!(ids.iter().all(|&i| i == ids[0]));
    /// assert_ne!(ids[0].0, ids[0].1);
    /// ```
    pub fn id(&self) -> WinId {
        self.id
    }

    /// Elements in this rank's part of the window.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     // Each rank may expose a different number of elements.
    ///     let window = world.allocate_window::<u64>(world.rank() + 1)?;
    ///     Ok(window.local_len())
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![1, 2, 3]);
    /// ```
    pub fn local_len(&self) -> usize {
        self.len
    }

    /// The communicator the window spans.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let pair = world.split(Some(world.rank() as u32 / 2), 0)?.expect("a color");
    ///     let window = pair.allocate_window::<u8>(1)?;
    ///     let comm = window.communicator();
    ///     Ok((comm.rank(), comm.size(), comm.world_rank(0)?))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![(0, 2, 0), (1, 2, 0), (0, 2, 2), (1, 2, 2)]
    /// );
    /// ```
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// PUT: write `data` at element `offset` of `target`'s window.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let (me, n) = (world.rank(), world.size());
    ///     let window = world.allocate_window::<u64>(2)?;
    ///     window.fence()?;
    ///     // Write element 1 of the next rank's window.
    ///     window.put((me + 1) % n, 1, &[100 + me as u64])?;
    ///     window.fence()?;
    ///     window.with_local(|m| m.to_vec())
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![vec![0, 102], vec![0, 100], vec![0, 101]]
    /// );
    /// ```
    pub fn put(&self, target: Rank, offset: usize, data: &[T]) -> Result<()> {
        self.op(
            target,
            RmaOp::Put {
                offset: offset * Self::ELEM,
                data: slice_to_bytes(data),
            },
        )
        .map(|_| ())
    }

    /// GET: read `len` elements at `offset` of `target`'s window.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let (me, n) = (world.rank(), world.size());
    ///     let window = world.allocate_window::<u64>(2)?;
    ///     window.with_local_mut(|m| m.copy_from_slice(&[me as u64, 10 * me as u64]))?;
    ///     window.fence()?;
    ///     let got = window.get((me + 1) % n, 1, 1)?; // element 1 of the next rank
    ///     window.fence()?;
    ///     Ok(got)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![10], vec![20], vec![0]]);
    /// ```
    pub fn get(&self, target: Rank, offset: usize, len: usize) -> Result<Vec<T>> {
        let b = data_of(
            self.op(
                target,
                RmaOp::Get {
                    offset: offset * Self::ELEM,
                    len: len * Self::ELEM,
                },
            )?,
            self.id,
        )?;
        self.decode(&b)
    }

    /// Request-based PUT (`MPI_Rput`): the request travels to `target` and
    /// this returns at once. The PUT is complete (applied at the target)
    /// when [`PutRequest::wait`] returns, [`PutRequest::test`] says so, or
    /// the flush, unlock or fence that ends the epoch returns. A safe
    /// point refuses pending requests.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let (me, n) = (world.rank(), world.size());
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     window.fence()?;
    ///     let request = window.immediate_put((me + 1) % n, 0, &[me as u64 + 10])?;
    ///     request.wait()?; // applied at the target
    ///     window.fence()?;
    ///     window.with_local(|m| m[0])
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![12, 10, 11]);
    /// ```
    pub fn immediate_put(&self, target: Rank, offset: usize, data: &[T]) -> Result<PutRequest> {
        self.issue(
            target,
            RmaOp::Put {
                offset: offset * Self::ELEM,
                data: slice_to_bytes(data),
            },
        )
        .map(|pending| PutRequest { pending })
    }

    /// Request-based GET (`MPI_Rget`): a read request travels to `target`
    /// and its response comes back on the channel from it (000 §III-B);
    /// this returns at once, and [`GetRequest::test`] tells whether the
    /// response has arrived.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u32>(2)?;
    ///     window.with_local_mut(|m| m.copy_from_slice(&[7, 8 + world.rank() as u32]))?;
    ///     window.fence()?;
    ///     let request = window.immediate_get(1 - world.rank(), 1, 1)?;
    ///     let got = request.wait()?;
    ///     window.fence()?;
    ///     Ok(got)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![9], vec![8]]);
    /// ```
    pub fn immediate_get(&self, target: Rank, offset: usize, len: usize) -> Result<GetRequest<T>> {
        self.issue(
            target,
            RmaOp::Get {
                offset: offset * Self::ELEM,
                len: len * Self::ELEM,
            },
        )
        .map(|pending| GetRequest {
            pending,
            _t: PhantomData,
        })
    }

    /// Request-based combining PUT (`MPI_Raccumulate`).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, ReduceOp};
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     window.fence()?;
    ///     let request =
    ///         window.immediate_accumulate(0, 0, &[world.rank() as u64], ReduceOp::Sum)?;
    ///     window.fence()?; // completes it
    ///     drop(request);
    ///     window.with_local(|m| m[0])
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![6, 0, 0, 0]);
    /// ```
    pub fn immediate_accumulate(
        &self,
        target: Rank,
        offset: usize,
        data: &[T],
        op: ReduceOp,
    ) -> Result<PutRequest> {
        self.issue(
            target,
            RmaOp::Accumulate {
                offset: offset * Self::ELEM,
                data: slice_to_bytes(data),
                dtype: T::DTYPE,
                op,
                fetch: false,
            },
        )
        .map(|pending| PutRequest { pending })
    }

    fn issue(&self, target: Rank, op: RmaOp) -> Result<PendingOp> {
        let t = self.comm.world_rank(target)?;
        let ticket = self.comm.engine.borrow_mut().rma_issue(self.id, t, op)?;
        Ok(PendingOp {
            comm: self.comm.clone(),
            window: self.id,
            ticket: Some(ticket),
        })
    }

    /// Combining PUT: `target[offset..] = target[offset..] op data`.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, ReduceOp};
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     window.fence()?;
    ///     window.accumulate(0, 0, &[world.rank() as u64 + 1], ReduceOp::Sum)?;
    ///     window.fence()?;
    ///     window.with_local(|m| m[0])
    /// });
    /// // Rank 0's element holds 1 + 2 + 3 + 4.
    /// assert_eq!(report.outcome.unwrap(), vec![10, 0, 0, 0]);
    /// ```
    pub fn accumulate(&self, target: Rank, offset: usize, data: &[T], op: ReduceOp) -> Result<()> {
        self.op(
            target,
            RmaOp::Accumulate {
                offset: offset * Self::ELEM,
                data: slice_to_bytes(data),
                dtype: T::DTYPE,
                op,
                fetch: false,
            },
        )
        .map(|_| ())
    }

    /// Accumulate and return the previous contents, atomically.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, ReduceOp};
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<i32>(2)?;
    ///     if world.rank() == 0 {
    ///         window.with_local_mut(|m| m.copy_from_slice(&[5, 6]))?;
    ///     }
    ///     window.fence()?;
    ///     let mut before = vec![];
    ///     if world.rank() == 1 {
    ///         before = window.get_accumulate(0, 0, &[1, 2], ReduceOp::Sum)?;
    ///     }
    ///     window.fence()?;
    ///     Ok((before, window.with_local(|m| m.to_vec())?))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![(vec![], vec![6, 8]), (vec![5, 6], vec![0, 0])]
    /// );
    /// ```
    pub fn get_accumulate(
        &self,
        target: Rank,
        offset: usize,
        data: &[T],
        op: ReduceOp,
    ) -> Result<Vec<T>> {
        let b = data_of(
            self.op(
                target,
                RmaOp::Accumulate {
                    offset: offset * Self::ELEM,
                    data: slice_to_bytes(data),
                    dtype: T::DTYPE,
                    op,
                    fetch: true,
                },
            )?,
            self.id,
        )?;
        self.decode(&b)
    }

    /// Atomically combine one element and return its previous value.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, ReduceOp};
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let counter = world.allocate_window::<u64>(1)?;
    ///     counter.fence()?;
    ///     // A shared counter on rank 0: every rank draws another ticket.
    ///     let ticket = counter.fetch_and_op(0, 0, 1, ReduceOp::Sum)?;
    ///     counter.fence()?;
    ///     Ok((ticket, counter.with_local(|m| m[0])?))
    /// });
    /// let results = report.outcome.unwrap();
    /// let mut tickets: Vec<u64> = results.iter().map(|r| r.0).collect();
    /// tickets.sort();
    /// assert_eq!(tickets, vec![0, 1, 2, 3]);
    /// assert_eq!(results[0].1, 4);
    /// ```
    pub fn fetch_and_op(&self, target: Rank, offset: usize, operand: T, op: ReduceOp) -> Result<T> {
        let v = self.get_accumulate(target, offset, &[operand], op)?;
        v.first().copied().ok_or(Error::Rma {
            window: self.id,
            detail: "fetch_and_op returned nothing".into(),
        })
    }

    /// Atomically: if the element equals `compare`, replace it by `swap`;
    /// returns the previous value.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     window.fence()?;
    ///     let mut seen = vec![];
    ///     if world.rank() == 1 {
    ///         seen.push(window.compare_and_swap(0, 0, 0, 7)?); // 0 == 0: swapped
    ///         seen.push(window.compare_and_swap(0, 0, 0, 9)?); // 7 != 0: kept
    ///     }
    ///     window.fence()?;
    ///     Ok((seen, window.with_local(|m| m[0])?))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(vec![], 7), (vec![0, 7], 0)]);
    /// ```
    pub fn compare_and_swap(&self, target: Rank, offset: usize, compare: T, swap: T) -> Result<T> {
        let b = data_of(
            self.op(
                target,
                RmaOp::CompareAndSwap {
                    offset: offset * Self::ELEM,
                    compare: Bytes::copy_from_slice(bytemuck::bytes_of(&compare)),
                    swap: Bytes::copy_from_slice(bytemuck::bytes_of(&swap)),
                    dtype: T::DTYPE,
                },
            )?,
            self.id,
        )?;
        self.decode(&b)?.first().copied().ok_or(Error::Rma {
            window: self.id,
            detail: "compare_and_swap returned nothing".into(),
        })
    }

    /// GSYNC: complete all operations of every rank and open a new epoch to
    /// every target (collective). A checkpoint between two fences saves the
    /// open epoch, so a restored rank goes on putting without a new fence.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u32>(1)?;
    ///     let other = 1 - world.rank();
    ///     let refused = window.put(other, 0, &[1]).is_err(); // no epoch yet
    ///     window.fence()?; // opens an epoch to every target
    ///     window.put(other, 0, &[world.rank() as u32 + 1])?;
    ///     window.fence()?; // every rank's puts are complete
    ///     Ok((refused, window.with_local(|m| m[0])?))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(true, 2), (true, 1)]);
    /// ```
    pub fn fence(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_fence(self.id)?;
        self.comm.barrier()?;
        self.comm.engine.borrow_mut().window_fence_done(self.id)
    }

    /// LOCK: open a passive-target epoch to `target`. Unlock it before the
    /// next `Ctx::checkpoint`, which refuses a safe point inside the epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, LockType};
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     // Increment rank 0's counter under an exclusive lock: no update is lost.
    ///     window.lock(0, LockType::Exclusive)?;
    ///     let v = window.get(0, 0, 1)?[0];
    ///     window.put(0, 0, &[v + 1])?;
    ///     window.unlock(0)?;
    ///     world.barrier()?;
    ///     window.with_local(|m| m[0])
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![3, 0, 0]);
    /// ```
    pub fn lock(&self, target: Rank, kind: LockType) -> Result<()> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_lock(self.id, t, kind)
    }

    /// UNLOCK: complete operations to `target` and close the epoch.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, LockType};
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     let mut closed = false;
    ///     if world.rank() == 1 {
    ///         window.lock(0, LockType::Shared)?;
    ///         window.put(0, 0, &[42])?;
    ///         window.unlock(0)?; // the put is complete at rank 0
    ///         closed = window.put(0, 0, &[1]).is_err(); // and the epoch is over
    ///     }
    ///     world.barrier()?;
    ///     Ok((closed, window.with_local(|m| m[0])?))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(false, 42), (true, 0)]);
    /// ```
    pub fn unlock(&self, target: Rank) -> Result<()> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_unlock(self.id, t)
    }

    /// A shared lock on every target (released before the next
    /// `Ctx::checkpoint`, as for `lock`).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let me = world.rank();
    ///     let window = world.allocate_window::<u64>(world.size())?;
    ///     window.lock_all()?;
    ///     // Write this rank's number into its own slot at every rank.
    ///     for target in 0..world.size() {
    ///         window.put(target, me, &[me as u64 + 1])?;
    ///     }
    ///     window.unlock_all()?;
    ///     world.barrier()?;
    ///     window.with_local(|m| m.to_vec())
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![1, 2, 3]; 3]);
    /// ```
    pub fn lock_all(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_lock_all(self.id)
    }

    /// Release `lock_all`.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let (me, n) = (world.rank(), world.size());
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     window.lock_all()?;
    ///     window.put((me + 1) % n, 0, &[me as u64 + 1])?;
    ///     window.unlock_all()?; // completes the puts and ends the epochs
    ///     let closed = window.put(0, 0, &[0]).is_err();
    ///     world.barrier()?;
    ///     Ok((closed, window.with_local(|m| m[0])?))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(true, 3), (true, 1), (true, 2)]);
    /// ```
    pub fn unlock_all(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_unlock_all(self.id)
    }

    /// FLUSH: complete operations to `target` (a new epoch begins).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, LockType};
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     let mut seen = (0, 0);
    ///     if world.rank() == 0 {
    ///         window.lock(1, LockType::Exclusive)?;
    ///         window.put(1, 0, &[5])?;
    ///         let before = window.epoch_to(1)?;
    ///         window.flush(1)?; // completes the put; the lock is still held
    ///         seen = (window.get(1, 0, 1)?[0], window.epoch_to(1)? - before);
    ///         window.unlock(1)?;
    ///     }
    ///     world.barrier()?;
    ///     Ok(seen)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(5, 1), (0, 0)]);
    /// ```
    pub fn flush(&self, target: Rank) -> Result<()> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_flush(self.id, Some(t))
    }

    /// FLUSH to every target.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     let mut epochs = vec![];
    ///     if world.rank() == 0 {
    ///         window.lock_all()?;
    ///         window.put(1, 0, &[10])?;
    ///         window.put(2, 0, &[20])?;
    ///         window.flush_all()?; // completes both: a new epoch to every target
    ///         epochs = vec![window.epoch_to(1)?, window.epoch_to(2)?];
    ///         window.unlock_all()?;
    ///     }
    ///     world.barrier()?;
    ///     Ok((epochs, window.with_local(|m| m[0])?))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![(vec![1, 1], 0), (vec![], 10), (vec![], 20)]
    /// );
    /// ```
    pub fn flush_all(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_flush(self.id, None)
    }

    /// `E(p -> target)`: this origin's epoch number towards `target`.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, LockType};
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u8>(1)?;
    ///     let mut epochs = vec![window.epoch_to(1)?];
    ///     window.lock(1, LockType::Shared)?;
    ///     window.flush(1)?; // a flush ends the epoch to rank 1
    ///     epochs.push(window.epoch_to(1)?);
    ///     window.unlock(1)?; // so does an unlock
    ///     epochs.push(window.epoch_to(1)?);
    ///     epochs.push(window.epoch_to(0)?); // none to rank 0 ended
    ///     world.barrier()?;
    ///     Ok(epochs)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![0, 1, 2, 0]; 2]);
    /// ```
    pub fn epoch_to(&self, target: Rank) -> Result<u64> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_epoch_of(self.id, t)
    }

    fn local<R>(&self, f: impl FnOnce(&mut [u8]) -> R) -> Result<R> {
        let mut f = Some(f);
        let mut out = None;
        self.comm
            .engine
            .borrow_mut()
            .window_local(self.id, &mut |m| {
                if let Some(f) = f.take() {
                    out = Some(f(m));
                }
            })?;
        out.ok_or(Error::Rma {
            window: self.id,
            detail: "local access did not run".into(),
        })
    }

    /// Read this rank's window memory.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u32>(3)?;
    ///     window.fence()?;
    ///     window.put(1 - world.rank(), 0, &[1, 2, 3])?;
    ///     window.fence()?;
    ///     window.with_local(|m| m.iter().sum::<u32>())
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![6, 6]);
    /// ```
    pub fn with_local<R>(&self, f: impl FnOnce(&[T]) -> R) -> Result<R> {
        self.local(|m| match try_cast_slice::<u8, T>(m) {
            Ok(elems) => Ok(f(elems)),
            Err(CheckedCastError::InvalidBitPattern) => Err(self.not_valid()),
            // Memory not aligned for `T`: read a copy.
            Err(CheckedCastError::PodCastError(_)) => {
                let elems = read_vec::<T>(m).map_err(|_| self.not_valid())?;
                Ok(f(&elems))
            }
        })?
    }

    /// Change this rank's window memory (a local store; remote ranks see it
    /// according to the epoch rules).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let me = world.rank();
    ///     let window = world.allocate_window::<u64>(2)?;
    ///     window.with_local_mut(|m| m.fill(me as u64 + 1))?;
    ///     window.fence()?; // the others see the store from here
    ///     let theirs = window.get(1 - me, 0, 2)?;
    ///     window.fence()?;
    ///     Ok(theirs)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![2, 2], vec![1, 1]]);
    /// ```
    pub fn with_local_mut<R>(&self, f: impl FnOnce(&mut [T]) -> R) -> Result<R> {
        self.local(|m| match try_cast_slice_mut::<u8, T>(m) {
            Ok(elems) => Ok(f(elems)),
            Err(CheckedCastError::InvalidBitPattern) => Err(self.not_valid()),
            // Memory not aligned for `T`: change a copy and store it back.
            Err(CheckedCastError::PodCastError(_)) => {
                let mut elems = read_vec::<T>(m).map_err(|_| self.not_valid())?;
                let r = f(&mut elems);
                m.copy_from_slice(bytemuck::cast_slice(&elems));
                Ok(r)
            }
        })?
    }

    /// The error for window memory that holds bytes that are no `T` (a
    /// remote put of another type, or bytes a `bool` cannot have).
    fn not_valid(&self) -> Error {
        Error::Rma {
            window: self.id,
            detail: format!(
                "window memory holds bytes that are not a valid `{}`",
                std::any::type_name::<T>()
            ),
        }
    }

    /// Free the window (collective).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     window.with_local_mut(|m| m[0] = 9)?;
    ///     let old = window.id();
    ///     window.free()?; // at every rank
    ///     // A window allocated next is another one, zeroed.
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     Ok((window.id() != old, window.with_local(|m| m[0])?))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(true, 0); 2]);
    /// ```
    pub fn free(self) -> Result<()> {
        self.comm.engine.borrow_mut().window_settle(self.id)?;
        self.comm.barrier()?;
        self.comm.engine.borrow_mut().window_free(self.id)
    }
}

/// A request-based operation in flight; dropping it lets the operation
/// complete at the end of its epoch without its outcome.
struct PendingOp {
    comm: Communicator,
    window: WinId,
    ticket: Option<crate::engine::ReqId>,
}

impl PendingOp {
    fn wait(&mut self) -> Result<RmaReply> {
        let ticket = self
            .ticket
            .take()
            .ok_or_else(|| Error::InvalidRequest("already completed".into()))?;
        self.comm.engine.borrow_mut().rma_wait(self.window, ticket)
    }

    fn test(&mut self) -> Result<Option<RmaReply>> {
        let Some(ticket) = self.ticket else {
            return Err(Error::InvalidRequest("already completed".into()));
        };
        let r = self
            .comm
            .engine
            .borrow_mut()
            .rma_test(self.window, ticket)?;
        if r.is_some() {
            self.ticket = None;
        }
        Ok(r)
    }
}

impl Drop for PendingOp {
    fn drop(&mut self) {
        if let Some(t) = self.ticket.take()
            && let Ok(mut e) = self.comm.engine.try_borrow_mut()
        {
            e.rma_forget(t);
        }
    }
}

impl std::fmt::Debug for PendingOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingOp")
            .field("window", &self.window)
            .field("ticket", &self.ticket)
            .finish()
    }
}

/// A request-based PUT or accumulate in flight ([`Window::immediate_put`],
/// [`Window::immediate_accumulate`]).
#[derive(Debug)]
#[must_use = "a request completes by wait or test, or at the end of its epoch"]
pub struct PutRequest {
    pending: PendingOp,
}

impl PutRequest {
    /// Wait until the target has applied the operation.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u8>(1)?;
    ///     window.fence()?;
    ///     if world.rank() == 0 {
    ///         window.immediate_put(1, 0, &[5])?.wait()?;
    ///     }
    ///     window.fence()?;
    ///     window.with_local(|m| m[0])
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![0, 5]);
    /// ```
    pub fn wait(mut self) -> Result<()> {
        self.pending.wait().map(|_| ())
    }

    /// Whether the target has applied it (its acknowledgement arrived).
    /// After `true` the request is complete; testing again is an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u8>(1)?;
    ///     window.fence()?;
    ///     if world.rank() == 0 {
    ///         let mut request = window.immediate_put(1, 0, &[5])?;
    ///         while !request.test()? {} // rank 1 applies it in its fence
    ///     }
    ///     window.fence()?;
    ///     window.with_local(|m| m[0])
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![0, 5]);
    /// ```
    pub fn test(&mut self) -> Result<bool> {
        self.pending.test().map(|r| r.is_some())
    }
}

/// A request-based GET in flight ([`Window::immediate_get`]).
#[must_use = "a request completes by wait or test, or at the end of its epoch"]
pub struct GetRequest<T: Equivalence> {
    pending: PendingOp,
    _t: PhantomData<T>,
}

impl<T: Equivalence> std::fmt::Debug for GetRequest<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GetRequest")
            .field("pending", &self.pending)
            .finish()
    }
}

impl<T: Equivalence> GetRequest<T> {
    fn decode(&self, reply: RmaReply) -> Result<Vec<T>> {
        decode_elements(&data_of(reply, self.pending.window)?, self.pending.window)
    }

    /// Wait for the response and return the data read.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let (me, n) = (world.rank(), world.size());
    ///     let window = world.allocate_window::<u64>(1)?;
    ///     window.with_local_mut(|m| m[0] = 100 + me as u64)?;
    ///     window.fence()?;
    ///     // Several in flight at once, to different targets.
    ///     let requests = (1..n)
    ///         .map(|d| window.immediate_get((me + d) % n, 0, 1))
    ///         .collect::<lazarus::Result<Vec<_>>>()?;
    ///     let mut got = Vec::new();
    ///     for r in requests {
    ///         got.extend(r.wait()?);
    ///     }
    ///     window.fence()?;
    ///     Ok(got)
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![vec![101, 102], vec![102, 100], vec![100, 101]]
    /// );
    /// ```
    pub fn wait(mut self) -> Result<Vec<T>> {
        let reply = self.pending.wait()?;
        self.decode(reply)
    }

    /// The data, if the response has arrived (`None` while the GET is in
    /// flight: its target serves it when it next calls into the runtime).
    /// After `Some` the request is complete; testing again is an error.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let window = world.allocate_window::<u32>(1)?;
    ///     window.with_local_mut(|m| m[0] = 40 + world.rank() as u32)?;
    ///     window.fence()?;
    ///     let mut request = window.immediate_get(1 - world.rank(), 0, 1)?;
    ///     let got = loop {
    ///         if let Some(v) = request.test()? {
    ///             break v;
    ///         }
    ///     };
    ///     window.fence()?;
    ///     Ok(got)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![41], vec![40]]);
    /// ```
    pub fn test(&mut self) -> Result<Option<Vec<T>>> {
        match self.pending.test()? {
            Some(reply) => self.decode(reply).map(Some),
            None => Ok(None),
        }
    }
}
