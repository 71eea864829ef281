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
        read_vec(b).map_err(|why| Error::Rma {
            window: self.id,
            detail: match why {
                Unreadable::Ragged => "reply is not a whole number of elements".into(),
                Unreadable::InvalidValue => format!(
                    "reply holds bytes that are not a valid `{}`",
                    std::any::type_name::<T>()
                ),
            },
        })
    }

    /// The window's id.
    pub fn id(&self) -> WinId {
        self.id
    }

    /// Elements in this rank's part of the window.
    pub fn local_len(&self) -> usize {
        self.len
    }

    /// The communicator the window spans.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// PUT: write `data` at element `offset` of `target`'s window.
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

    /// Combining PUT: `target[offset..] = target[offset..] op data`.
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
    pub fn fetch_and_op(&self, target: Rank, offset: usize, operand: T, op: ReduceOp) -> Result<T> {
        let v = self.get_accumulate(target, offset, &[operand], op)?;
        v.first().copied().ok_or(Error::Rma {
            window: self.id,
            detail: "fetch_and_op returned nothing".into(),
        })
    }

    /// Atomically: if the element equals `compare`, replace it by `swap`;
    /// returns the previous value.
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
    pub fn fence(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_fence(self.id)?;
        self.comm.barrier()
    }

    /// LOCK: open a passive-target epoch to `target`. Unlock it before the
    /// next `Ctx::checkpoint`, which refuses a safe point inside the epoch.
    pub fn lock(&self, target: Rank, kind: LockType) -> Result<()> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_lock(self.id, t, kind)
    }

    /// UNLOCK: complete operations to `target` and close the epoch.
    pub fn unlock(&self, target: Rank) -> Result<()> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_unlock(self.id, t)
    }

    /// A shared lock on every target (released before the next
    /// `Ctx::checkpoint`, as for `lock`).
    pub fn lock_all(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_lock_all(self.id)
    }

    /// Release `lock_all`.
    pub fn unlock_all(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_unlock_all(self.id)
    }

    /// FLUSH: complete operations to `target` (a new epoch begins).
    pub fn flush(&self, target: Rank) -> Result<()> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_flush(self.id, Some(t))
    }

    /// FLUSH to every target.
    pub fn flush_all(&self) -> Result<()> {
        self.comm.engine.borrow_mut().window_flush(self.id, None)
    }

    /// `E(p -> target)`: this origin's epoch number towards `target`.
    pub fn epoch_to(&self, target: Rank) -> Result<u64> {
        let t = self.comm.world_rank(target)?;
        self.comm.engine.borrow_mut().window_epoch(self.id, t)
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
    pub fn free(self) -> Result<()> {
        self.comm.barrier()?;
        self.comm.engine.borrow_mut().window_free(self.id)
    }
}
