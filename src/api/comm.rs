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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.send(1, 0, &[1.5f64, 2.5, 3.5])?;
    ///         return Ok((0, 0));
    ///     }
    ///     let status = world.receive_bytes(0, 0)?.status;
    ///     Ok((status.bytes, status.count::<f64>()))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(0, 0), (24, 3)]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.send(1, 0, &[1u32, 2, 3])?;
    ///         return Ok(vec![]);
    ///     }
    ///     let message = world.receive_bytes(0, 0)?;
    ///     message.into_vec::<u32>()
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![], vec![1, 2, 3]]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| Ok(ctx.world().rank()));
    /// assert_eq!(report.outcome.unwrap(), vec![0, 1, 2, 3]);
    /// ```
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// Number of ranks in the communicator.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     // Ranks 0 and 1 in one communicator, ranks 2 and 3 in another.
    ///     let pair = world.split(Some(world.rank() as u32 / 2), 0)?.expect("a color");
    ///     Ok((world.size(), pair.size()))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(4, 2); 4]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     // Even world ranks in one communicator, odd ones in another.
    ///     let half = world.split(Some(world.rank() as u32 % 2), 0)?.expect("a color");
    ///     Ok((half.world_rank(1)?, half.world_rank(2).is_err()))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![(2, true), (3, true), (2, true), (3, true)]
    /// );
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let (me, n) = (world.rank(), world.size());
    ///     // Sends are eager: every rank sends first, then receives.
    ///     world.send((me + 1) % n, 0, &[me as u64, 10 * me as u64])?;
    ///     let (got, _status) = world.receive::<u64>((me + n - 1) % n, 0)?;
    ///     Ok(got)
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![vec![3, 30], vec![0, 0], vec![1, 10], vec![2, 20]]
    /// );
    /// ```
    pub fn send<T: Equivalence>(&self, dest: Rank, tag: Tag, data: &[T]) -> Result<()> {
        self.send_bytes(dest, tag, slice_to_bytes(data))
    }

    /// Send an owned vector without copying it.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         let data: Vec<f64> = (0..4).map(|i| i as f64 * 0.5).collect();
    ///         world.send_owned(1, 0, data)?; // moved into the message, not copied
    ///         return Ok(vec![]);
    ///     }
    ///     Ok(world.receive::<f64>(0, 0)?.0)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![], vec![0.0, 0.5, 1.0, 1.5]]);
    /// ```
    pub fn send_owned<T: Equivalence>(&self, dest: Rank, tag: Tag, data: Vec<T>) -> Result<()> {
        self.send_bytes(dest, tag, vec_into_bytes(data))
    }

    /// Send a shared buffer (no copy).
    ///
    /// # Examples
    ///
    /// ```
    /// use bytes::Bytes;
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.send_bytes(1, 3, Bytes::from_static(b"hello"))?;
    ///         return Ok(vec![]);
    ///     }
    ///     Ok(world.receive_bytes(0, 3)?.payload.to_vec())
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![], b"hello".to_vec()]);
    /// ```
    pub fn send_bytes(&self, dest: Rank, tag: Tag, data: Bytes) -> Result<()> {
        self.send_in(self.p2p, dest, tag, data)
    }

    /// Send a structured value (serde, postcard encoding).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.send_value(1, 0, &("step".to_string(), 42u32))?;
    ///         return Ok(None);
    ///     }
    ///     let (value, _status) = world.receive_value::<(String, u32)>(0, 0)?;
    ///     Ok(Some(value))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![None, Some(("step".to_string(), 42))]
    /// );
    /// ```
    pub fn send_value<V: Serialize>(&self, dest: Rank, tag: Tag, value: &V) -> Result<()> {
        self.send_bytes(dest, tag, Bytes::from(postcard::to_allocvec(value)?))
    }

    /// Nonblocking send; sends are eager, so the request is already complete.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let other = 1 - world.rank();
    ///     let request = world.immediate_send(other, 0, &[world.rank() as i32])?;
    ///     let (got, _) = world.receive::<i32>(other, 0)?;
    ///     request.wait()?;
    ///     Ok(got)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![1], vec![0]]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, Source, TagMatch};
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     match world.rank() {
    ///         0 => {
    ///             let m = world.receive_bytes(Source::Any, TagMatch::Any)?;
    ///             Ok(Some((m.status.source, m.status.tag, m.payload.to_vec())))
    ///         }
    ///         2 => {
    ///             world.send(0, 5, b"hi")?;
    ///             Ok(None)
    ///         }
    ///         _ => Ok(None),
    ///     }
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![Some((2, 5, b"hi".to_vec())), None, None]
    /// );
    /// ```
    pub fn receive_bytes(
        &self,
        source: impl Into<Source>,
        tag: impl Into<TagMatch>,
    ) -> Result<Message> {
        self.receive_in(self.p2p, source.into(), tag.into())
    }

    /// Receive a vector of `T`.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, Source, TagMatch};
    ///
    /// let report = lazarus::run(&Config::new(4), |ctx| {
    ///     let world = ctx.world();
    ///     let me = world.rank();
    ///     if me != 0 {
    ///         world.send(0, me as i32 + 10, &[me as u64 * 100])?;
    ///         return Ok(vec![]);
    ///     }
    ///     let mut got = Vec::new();
    ///     for _ in 1..world.size() {
    ///         // From any source with any tag: the status says which.
    ///         let (data, status) = world.receive::<u64>(Source::Any, TagMatch::Any)?;
    ///         got.push((status.source, status.tag, data[0]));
    ///     }
    ///     got.sort();
    ///     Ok(got)
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap()[0],
    ///     vec![(1, 11, 100), (2, 12, 200), (3, 13, 300)]
    /// );
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.send(1, 0, &[7i64, 8])?;
    ///         return Ok(([0; 4], 0));
    ///     }
    ///     let mut buf = [0i64; 4]; // room for up to 4 elements
    ///     let status = world.receive_into(0, 0, &mut buf)?;
    ///     Ok((buf, status.count::<i64>()))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![([0; 4], 0), ([7, 8, 0, 0], 2)]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.send_value(1, 9, &vec!["a".to_string(), "b".to_string()])?;
    ///         return Ok((vec![], 0));
    ///     }
    ///     let (names, status) = world.receive_value::<Vec<String>>(0, 9)?;
    ///     Ok((names, status.tag))
    /// });
    /// let names = vec!["a".to_string(), "b".to_string()];
    /// assert_eq!(report.outcome.unwrap(), vec![(vec![], 0), (names, 9)]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     let other = 1 - world.rank();
    ///     // Post the receive first, then send: the message completes the request.
    ///     let request = world.immediate_receive(other, 0)?;
    ///     world.send(other, 0, &[world.rank() as u64 + 1])?;
    ///     request.wait()?.into_vec::<u64>()
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![2], vec![1]]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.send(1, 0, &[1u32, 2, 3])?;
    ///         return Ok(vec![]);
    ///     }
    ///     // Size the buffer from the probe, then receive into it.
    ///     let status = world.probe(0, 0)?;
    ///     let mut buf = vec![0u32; status.count::<u32>()];
    ///     world.receive_into(0, 0, &mut buf)?;
    ///     Ok(buf)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![], vec![1, 2, 3]]);
    /// ```
    pub fn probe(&self, source: impl Into<Source>, tag: impl Into<TagMatch>) -> Result<Status> {
        let spec = self.spec(self.p2p, source.into(), tag.into())?;
        let (env, bytes) = self.engine.borrow_mut().probe(spec)?;
        Ok(self.status_of(&env, bytes))
    }

    /// Nonblocking probe.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.receive::<u8>(1, 1)?; // wait until rank 1 asks
    ///         world.send(1, 2, &[5u8, 6])?;
    ///         return Ok((false, 0));
    ///     }
    ///     let early = world.iprobe(0, 2)?.is_none(); // not sent yet
    ///     world.send(0, 1, &[0u8])?;
    ///     let status = loop {
    ///         if let Some(status) = world.iprobe(0, 2)? {
    ///             break status;
    ///         }
    ///     };
    ///     world.receive::<u8>(0, 2)?;
    ///     Ok((early, status.count::<u8>()))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(false, 0), (true, 2)]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(3), |ctx| {
    ///     let world = ctx.world();
    ///     let (me, n) = (world.rank(), world.size());
    ///     // Shift one place right around a ring.
    ///     let (got, status) =
    ///         world.send_receive(&[me as u64], (me + 1) % n, 0, (me + n - 1) % n, 0)?;
    ///     Ok((got[0], status.source))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(2, 2), (0, 0), (1, 1)]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.immediate_send(1, 0, &[3u64, 4])?.wait()?;
    ///         return Ok(vec![]);
    ///     }
    ///     Ok(world.receive::<u64>(0, 0)?.0)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![vec![], vec![3, 4]]);
    /// ```
    pub fn wait(self) -> Result<()> {
        Ok(())
    }

    /// Test for completion (always true).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         let request = world.immediate_send(1, 0, &[1u8])?;
    ///         return Ok(Some(request.test())); // complete at once: sends are eager
    ///     }
    ///     world.receive::<u8>(0, 0)?;
    ///     Ok(None)
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![Some(true), None]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 1 {
    ///         world.send(0, 4, &[2.5f32])?;
    ///         return Ok(None);
    ///     }
    ///     let request = world.immediate_receive(1, 4)?;
    ///     let message = request.wait()?;
    ///     Ok(Some((message.status.source, message.into_vec::<f32>()?)))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![Some((1, vec![2.5])), None]);
    /// ```
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
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::Config;
    ///
    /// let report = lazarus::run(&Config::new(2), |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.receive::<u8>(1, 1)?; // rank 1 is ready
    ///         world.send(1, 0, &[9u8])?;
    ///         return Ok((false, vec![]));
    ///     }
    ///     let mut request = world.immediate_receive(0, 0)?;
    ///     let early = request.test()?.is_none(); // rank 0 has not sent yet
    ///     world.send(0, 1, &[0u8])?;
    ///     let message = loop {
    ///         if let Some(message) = request.test()? {
    ///             break message;
    ///         }
    ///     };
    ///     Ok((early, message.into_vec::<u8>()?))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(false, vec![]), (true, vec![9])]);
    /// ```
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
///
/// # Examples
///
/// ```
/// use lazarus::Config;
/// use lazarus::wait_all;
///
/// let report = lazarus::run(&Config::new(4), |ctx| {
///     let world = ctx.world();
///     let me = world.rank();
///     if me != 0 {
///         world.send(0, 0, &[me as u64 * 10])?;
///         return Ok(vec![]);
///     }
///     let requests = (1..world.size())
///         .map(|r| world.immediate_receive(r, 0))
///         .collect::<lazarus::Result<Vec<_>>>()?;
///     // In the order of the requests, whatever the order of arrival.
///     let mut got = Vec::new();
///     for m in wait_all(requests)? {
///         got.push((m.status.source, m.into_vec::<u64>()?[0]));
///     }
///     Ok(got)
/// });
/// assert_eq!(report.outcome.unwrap()[0], vec![(1, 10), (2, 20), (3, 30)]);
/// ```
pub fn wait_all(reqs: Vec<ReceiveRequest>) -> Result<Vec<Message>> {
    reqs.into_iter().map(ReceiveRequest::wait).collect()
}
