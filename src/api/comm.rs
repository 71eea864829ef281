//! Communicators and point-to-point communication (MPI chapter 3 and 6).
//!
//! Sends are eager: the payload becomes a shared [`Bytes`] buffer (one copy
//! from a borrowed slice, none from an owned vector or `Bytes`), and the send
//! completes at once. Receives match in MPI order: FIFO per source, tag and
//! communicator; wildcards take the earliest matching arrival.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::datatype::{
    Equivalence, Unreadable, copy_from_bytes, read_vec, slice_to_bytes, vec_into_bytes,
};
use crate::engine::frame::{AppMessage, ContextId, Envelope, Tag};
use crate::engine::{Engine, MatchSpec, ReqId};
use crate::{Error, Rank, Result};

/// Which source a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Any source (MPI_ANY_SOURCE).
    Any,
    /// This communicator rank.
    Rank(Rank),
}

impl From<Rank> for Source {
    fn from(r: Rank) -> Self {
        Source::Rank(r)
    }
}

/// Which tags a receive accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TagMatch {
    /// Any tag (MPI_ANY_TAG).
    Any,
    /// This tag.
    Tag(Tag),
}

impl From<Tag> for TagMatch {
    fn from(t: Tag) -> Self {
        TagMatch::Tag(t)
    }
}

/// What a completed receive or a probe reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Status {
    /// Sender, as a rank of the communicator.
    pub source: Rank,
    /// Tag.
    pub tag: Tag,
    /// Payload size in bytes.
    pub bytes: usize,
}

impl Status {
    /// Number of `T` elements in the message.
    pub fn count<T: Equivalence>(&self) -> usize {
        self.bytes / std::mem::size_of::<T>().max(1)
    }
}

/// A received message.
#[derive(Debug, Clone)]
pub struct Message {
    /// The payload (shared with the sender).
    pub payload: Bytes,
    /// Envelope information.
    pub status: Status,
}

impl Message {
    /// The payload as a vector of `T`.
    pub fn into_vec<T: Equivalence>(self) -> Result<Vec<T>> {
        read_vec(&self.payload).map_err(|why| why.error::<T>(self.payload.len(), "message"))
    }
}

/// The ranks of a communicator, as world ranks.
///
/// The world group is the identity and costs nothing, so a 16,384-rank
/// simulation does not hold P-sized tables on every rank.
#[derive(Debug, Clone)]
enum Group {
    /// World ranks `0..size`.
    World(usize),
    /// An explicit list, with the reverse map of its members only.
    List(Rc<(Vec<Rank>, HashMap<Rank, Rank>)>),
}

impl Group {
    fn len(&self) -> usize {
        match self {
            Group::World(n) => *n,
            Group::List(l) => l.0.len(),
        }
    }

    fn world_rank(&self, r: Rank) -> Option<Rank> {
        match self {
            Group::World(n) => (r < *n).then_some(r),
            Group::List(l) => l.0.get(r).copied(),
        }
    }

    fn comm_rank(&self, w: Rank) -> Option<Rank> {
        match self {
            Group::World(n) => (w < *n).then_some(w),
            Group::List(l) => l.1.get(&w).copied(),
        }
    }
}

/// A communicator: a group of ranks and a private communication context.
#[derive(Clone)]
pub struct Communicator {
    pub(crate) engine: Rc<RefCell<Engine>>,
    group: Group,
    rank: Rank,
    pub(crate) p2p: ContextId,
    pub(crate) coll: ContextId,
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("size", &self.group.len())
            .field("context", &self.p2p)
            .finish()
    }
}

impl Communicator {
    pub(crate) fn world(engine: Rc<RefCell<Engine>>) -> Self {
        let (rank, size) = {
            let e = engine.borrow();
            (e.rank(), e.size())
        };
        Communicator {
            engine,
            group: Group::World(size),
            rank,
            p2p: 0,
            coll: 1,
        }
    }

    pub(crate) fn with_group(&self, group: Vec<Rank>, context: ContextId) -> Option<Self> {
        let me = self.engine.borrow().rank();
        let rank = group.iter().position(|&r| r == me)?;
        let size = self.engine.borrow().size();
        let group = if group.len() == size && group.iter().enumerate().all(|(i, &w)| i == w) {
            Group::World(size)
        } else {
            let reverse = group.iter().enumerate().map(|(i, &w)| (w, i)).collect();
            Group::List(Rc::new((group, reverse)))
        };
        Some(Communicator {
            engine: self.engine.clone(),
            group,
            rank,
            p2p: context,
            coll: context + 1,
        })
    }

    /// This rank in the communicator.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks in the communicator.
    pub fn size(&self) -> usize {
        self.group.len()
    }

    /// World ranks of the members, in communicator order.
    pub(crate) fn members(&self) -> Vec<Rank> {
        (0..self.size())
            .filter_map(|r| self.group.world_rank(r))
            .collect()
    }

    /// The world rank of communicator rank `r`.
    pub fn world_rank(&self, r: Rank) -> Result<Rank> {
        // Built only on the error path: this runs on every send and receive.
        self.group
            .world_rank(r)
            .ok_or_else(|| Error::RankOutOfRange {
                rank: r,
                size: self.group.len(),
            })
    }

    fn spec(&self, context: ContextId, source: Source, tag: TagMatch) -> Result<MatchSpec> {
        Ok(MatchSpec {
            context,
            source: match source {
                Source::Any => None,
                Source::Rank(r) => Some(self.world_rank(r)?),
            },
            tag: match tag {
                TagMatch::Any => None,
                TagMatch::Tag(t) => Some(t),
            },
        })
    }

    fn status_of(&self, env: &Envelope, bytes: usize) -> Status {
        Status {
            source: self.group.comm_rank(env.src).unwrap_or(usize::MAX),
            tag: env.tag,
            bytes,
        }
    }

    fn status(&self, m: &AppMessage) -> Status {
        self.status_of(&m.envelope, m.payload.len())
    }

    pub(crate) fn send_in(
        &self,
        context: ContextId,
        dest: Rank,
        tag: Tag,
        payload: Bytes,
    ) -> Result<()> {
        let dest = self.world_rank(dest)?;
        self.engine.borrow_mut().send(dest, context, tag, payload)
    }

    pub(crate) fn receive_in(
        &self,
        context: ContextId,
        source: Source,
        tag: TagMatch,
    ) -> Result<Message> {
        let spec = self.spec(context, source, tag)?;
        let m = self.engine.borrow_mut().receive(spec)?;
        Ok(Message {
            status: self.status(&m),
            payload: m.payload,
        })
    }

    // ----- sends ----------------------------------------------------------

    /// Send a slice (copied once into a shared buffer).
    pub fn send<T: Equivalence>(&self, dest: Rank, tag: Tag, data: &[T]) -> Result<()> {
        self.send_bytes(dest, tag, slice_to_bytes(data))
    }

    /// Send an owned vector without copying it.
    pub fn send_owned<T: Equivalence>(&self, dest: Rank, tag: Tag, data: Vec<T>) -> Result<()> {
        self.send_bytes(dest, tag, vec_into_bytes(data))
    }

    /// Send a shared buffer (no copy).
    pub fn send_bytes(&self, dest: Rank, tag: Tag, data: Bytes) -> Result<()> {
        self.send_in(self.p2p, dest, tag, data)
    }

    /// Send a structured value (serde, postcard encoding).
    pub fn send_value<V: Serialize>(&self, dest: Rank, tag: Tag, value: &V) -> Result<()> {
        self.send_bytes(dest, tag, Bytes::from(postcard::to_allocvec(value)?))
    }

    /// Nonblocking send; sends are eager, so the request is already complete.
    pub fn immediate_send<T: Equivalence>(
        &self,
        dest: Rank,
        tag: Tag,
        data: &[T],
    ) -> Result<Request> {
        self.send(dest, tag, data)?;
        Ok(Request { _done: () })
    }

    // ----- receives -------------------------------------------------------

    /// Receive a message as a shared buffer.
    pub fn receive_bytes(
        &self,
        source: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<Message> {
        self.receive_in(self.p2p, source.into(), tag.into())
    }

    /// Receive a vector of `T`.
    pub fn receive<T: Equivalence>(
        &self,
        source: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<(Vec<T>, Status)> {
        let m = self.receive_bytes(source, tag)?;
        let st = m.status;
        Ok((m.into_vec()?, st))
    }

    /// Receive into a buffer; the message must not be longer than it.
    pub fn receive_into<T: Equivalence>(
        &self,
        source: impl Into<Source>,
        tag: impl Into<TagMatch>,
        buf: &mut [T],
    ) -> Result<Status> {
        let m = self.receive_bytes(source, tag)?;
        let room = std::mem::size_of_val(buf);
        copy_from_bytes(&m.payload, buf).map_err(|why| match why {
            Unreadable::Ragged => Error::SizeMismatch {
                expected: room,
                got: m.payload.len(),
                what: "receive_into buffer".into(),
            },
            Unreadable::InvalidValue => why.error::<T>(m.payload.len(), "receive_into"),
        })?;
        Ok(m.status)
    }

    /// Receive a structured value.
    pub fn receive_value<V: DeserializeOwned>(
        &self,
        source: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<(V, Status)> {
        let m = self.receive_bytes(source, tag)?;
        let v = postcard::from_bytes(&m.payload)?;
        Ok((v, m.status))
    }

    /// Nonblocking receive.
    pub fn immediate_receive(
        &self,
        source: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<ReceiveRequest> {
        let spec = self.spec(self.p2p, source.into(), tag.into())?;
        let id = self.engine.borrow_mut().post_receive(spec)?;
        Ok(ReceiveRequest {
            comm: self.clone(),
            id: Some(id),
        })
    }

    /// Blocking probe: the status of the next matching message.
    pub fn probe(&self, source: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let spec = self.spec(self.p2p, source.into(), tag.into())?;
        let (env, bytes) = self.engine.borrow_mut().probe(spec)?;
        Ok(self.status_of(&env, bytes))
    }

    /// Nonblocking probe.
    pub fn iprobe(
        &self,
        source: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<Option<Status>> {
        let spec = self.spec(self.p2p, source.into(), tag.into())?;
        let found = self.engine.borrow_mut().iprobe(spec)?;
        Ok(found.map(|(env, bytes)| self.status_of(&env, bytes)))
    }

    /// Send and receive in one call (no deadlock: sends are eager).
    pub fn send_receive<T: Equivalence>(
        &self,
        data: &[T],
        dest: Rank,
        send_tag: Tag,
        source: impl Into<Source>,
        recv_tag: impl Into<TagMatch>,
    ) -> Result<(Vec<T>, Status)> {
        self.send(dest, send_tag, data)?;
        self.receive(source, recv_tag)
    }
}

/// A completed nonblocking send (sends are eager).
#[derive(Debug)]
#[must_use]
pub struct Request {
    _done: (),
}

impl Request {
    /// Wait for completion (immediate).
    pub fn wait(self) -> Result<()> {
        Ok(())
    }

    /// Test for completion (always true).
    pub fn test(&self) -> bool {
        true
    }
}

/// A pending nonblocking receive. Dropping it cancels the receive.
#[must_use]
pub struct ReceiveRequest {
    comm: Communicator,
    id: Option<ReqId>,
}

impl ReceiveRequest {
    /// Wait for the message.
    pub fn wait(mut self) -> Result<Message> {
        let id = self
            .id
            .take()
            .ok_or_else(|| Error::InvalidRequest("already completed".into()))?;
        let m = self.comm.engine.borrow_mut().wait(id)?;
        Ok(Message {
            status: self.comm.status(&m),
            payload: m.payload,
        })
    }

    /// The message, if it has arrived.
    pub fn test(&mut self) -> Result<Option<Message>> {
        let Some(id) = self.id else {
            return Err(Error::InvalidRequest("already completed".into()));
        };
        let got = self.comm.engine.borrow_mut().test(id)?;
        Ok(got.map(|m| {
            self.id = None;
            Message {
                status: self.comm.status(&m),
                payload: m.payload,
            }
        }))
    }
}

impl Drop for ReceiveRequest {
    fn drop(&mut self) {
        if let Some(id) = self.id.take()
            && let Ok(mut e) = self.comm.engine.try_borrow_mut()
        {
            e.cancel(id);
        }
    }
}

/// Wait for every receive request, in order.
pub fn wait_all(reqs: Vec<ReceiveRequest>) -> Result<Vec<Message>> {
    reqs.into_iter().map(ReceiveRequest::wait).collect()
}
