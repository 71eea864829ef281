//! Failure handling by the program (ULFM, User Level Failure Mitigation;
//! 002 §3.2), with `Config::failure_handling(FailureHandling::Return)` under
//! protocol `none`.
//!
//! A failure then does not end the run. An operation that involves a failed
//! rank returns [`Error::ProcessFailed`]: a send to it, a receive from it, a
//! wildcard receive while a failure is not acknowledged, and so a collective
//! with it. The program repairs its communicator the way 002's error handler
//! does: [`Communicator::revoke`] it so that every member's pending and
//! later operations on it fail with [`Error::Revoked`] (nobody stays blocked
//! in a collective the dead rank will never join), then either
//! [`Communicator::shrink`] it to the survivors and carry on with fewer
//! ranks, or [`Communicator::respawn`] the failed members: new incarnations
//! with the same numbers start the rank function from the beginning
//! ([`crate::Ctx::is_respawned`]), [`crate::Ctx::join`] the repaired
//! communicator, and get their state from the survivors.
//! [`Communicator::agree`] is the fault-tolerant agreement both are built
//! on; it works on a revoked communicator and gives every survivor the same
//! outcome.
//!
//! Names follow the MPI proposal: `MPIX_Comm_revoke`, `MPIX_Comm_shrink`,
//! `MPIX_Comm_agree`, `MPIX_Comm_failure_ack`/`get_acked` (here
//! [`Communicator::ack_failed`]) and `MPIX_Comm_get_failed`
//! ([`Communicator::failed_ranks`]).

use super::comm::Communicator;
use crate::engine::frame::AgreeValue;
use crate::{Error, Rank, Result};

impl Communicator {
    /// Members (communicator ranks) known to have failed.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, Error, FailureHandling};
    ///
    /// let cfg = Config::new(3)
    ///     .failure_handling(FailureHandling::Return)
    ///     .kill("2@i1".parse()?); // rank 2 dies after its first safe point
    /// let report = lazarus::run(&cfg, |ctx| {
    ///     let world = ctx.world();
    ///     ctx.checkpoint(&())?;
    ///     if world.rank() == 2 {
    ///         loop {
    ///             ctx.compute(1e-4)?; // killed here
    ///         }
    ///     }
    ///     // A receive from the dead rank fails once its failure is known.
    ///     let e = world.receive::<u64>(2, 0).unwrap_err();
    ///     assert!(matches!(e, Error::ProcessFailed { .. }));
    ///     Ok(world.failed_ranks())
    /// });
    /// // The dead rank has no value.
    /// assert_eq!(report.outcome.unwrap(), vec![vec![2], vec![2]]);
    /// # Ok::<(), lazarus::Error>(())
    /// ```
    pub fn failed_ranks(&self) -> Vec<Rank> {
        let failed = self.engine.borrow().failed_ranks();
        (0..self.size())
            .filter(|&r| self.world_rank(r).is_ok_and(|w| failed.contains(&w)))
            .collect()
    }

    /// Acknowledge every failure known now: wildcard receives no longer fail
    /// because of them. Returns the acknowledged members (communicator
    /// ranks).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, FailureHandling, Source};
    ///
    /// let cfg = Config::new(3)
    ///     .failure_handling(FailureHandling::Return)
    ///     .kill("2@i1".parse()?); // rank 2 dies after its first safe point
    /// let report = lazarus::run(&cfg, |ctx| {
    ///     let world = ctx.world();
    ///     ctx.checkpoint(&())?;
    ///     match world.rank() {
    ///         2 => loop {
    ///             ctx.compute(1e-4)?; // killed here
    ///         },
    ///         0 => {
    ///             // A wildcard receive fails while the failure is not acknowledged.
    ///             let refused = world.receive::<u64>(Source::Any, 0).is_err();
    ///             let acked = world.ack_failed()?;
    ///             world.send(1, 1, &[0u64])?; // now rank 1 may send
    ///             let (got, _) = world.receive::<u64>(Source::Any, 0)?;
    ///             Ok((refused, acked, got))
    ///         }
    ///         _ => {
    ///             world.receive::<u64>(0, 1)?;
    ///             world.send(0, 0, &[7u64])?;
    ///             Ok((false, vec![], vec![]))
    ///         }
    ///     }
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![(true, vec![2], vec![7]), (false, vec![], vec![])]
    /// );
    /// # Ok::<(), lazarus::Error>(())
    /// ```
    pub fn ack_failed(&self) -> Result<Vec<Rank>> {
        let acked = self.engine.borrow_mut().ack_failed()?;
        Ok((0..self.size())
            .filter(|&r| self.world_rank(r).is_ok_and(|w| acked.contains(&w)))
            .collect())
    }

    /// Revoke the communicator at every member: their pending and later
    /// operations on it fail with [`Error::Revoked`].
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, Error, FailureHandling};
    ///
    /// let cfg = Config::new(3).failure_handling(FailureHandling::Return);
    /// let report = lazarus::run(&cfg, |ctx| {
    ///     let world = ctx.world();
    ///     if world.rank() == 0 {
    ///         world.revoke()?;
    ///     } else {
    ///         // Rank 0 never sends: the revoke releases this receive.
    ///         let e = world.receive::<u64>(0, 0).unwrap_err();
    ///         assert!(matches!(e, Error::Revoked { .. }));
    ///     }
    ///     // Later operations fail at once.
    ///     Ok(matches!(world.barrier(), Err(Error::Revoked { .. })))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![true; 3]);
    /// ```
    pub fn revoke(&self) -> Result<()> {
        self.engine.borrow_mut().revoke(&[self.p2p, self.coll])
    }

    /// Whether the communicator was revoked.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, FailureHandling};
    ///
    /// let cfg = Config::new(2).failure_handling(FailureHandling::Return);
    /// let report = lazarus::run(&cfg, |ctx| {
    ///     let world = ctx.world();
    ///     let dup = world.duplicate()?;
    ///     let before = dup.is_revoked();
    ///     if world.rank() == 0 {
    ///         dup.revoke()?;
    ///     } else {
    ///         // Rank 0 never sends: the revoke ends this receive.
    ///         assert!(dup.receive::<u64>(0, 0).is_err());
    ///     }
    ///     world.barrier()?; // the world is not revoked
    ///     Ok((before, dup.is_revoked(), world.is_revoked()))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(false, true, false); 2]);
    /// ```
    pub fn is_revoked(&self) -> bool {
        self.engine.borrow().is_revoked(self.p2p)
    }

    fn agreement(&self, flag: bool) -> Result<AgreeValue> {
        let group = self.members();
        let mut e = self.engine.borrow_mut();
        let value = AgreeValue {
            flag,
            failed: Vec::new(),
            context: e.next_context(),
        };
        e.agree(self.p2p, &group, value)
    }

    /// Fault-tolerant agreement: the and of every surviving member's `flag`,
    /// the same at every survivor even if members die during it (works on a
    /// revoked communicator).
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, FailureHandling};
    ///
    /// let cfg = Config::new(3).failure_handling(FailureHandling::Return);
    /// let report = lazarus::run(&cfg, |ctx| {
    ///     let world = ctx.world();
    ///     let all_yes = world.agree(true)?;
    ///     let one_no = world.agree(world.rank() != 1)?; // rank 1 says no
    ///     Ok((all_yes, one_no))
    /// });
    /// assert_eq!(report.outcome.unwrap(), vec![(true, false); 3]);
    /// ```
    pub fn agree(&self, flag: bool) -> Result<bool> {
        Ok(self.agreement(flag)?.flag)
    }

    /// A new communicator of the surviving members, in the same order
    /// (collective over the survivors; works on a revoked communicator).
    /// Every survivor leaves out the same failed members.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, FailureHandling, ReduceOp};
    ///
    /// let cfg = Config::new(4)
    ///     .failure_handling(FailureHandling::Return)
    ///     .kill("1@i1".parse()?); // rank 1 dies after its first safe point
    /// let report = lazarus::run(&cfg, |ctx| {
    ///     let world = ctx.world();
    ///     ctx.checkpoint(&())?;
    ///     if world.rank() == 1 {
    ///         loop {
    ///             ctx.compute(1e-4)?; // killed here
    ///         }
    ///     }
    ///     // Fails at every survivor: rank 1 is dead, or another rank revoked.
    ///     if world.all_reduce(1u64, ReduceOp::Sum).is_err() {
    ///         world.revoke()?;
    ///     }
    ///     let survivors = world.shrink()?;
    ///     let sum = survivors.all_reduce(world.rank() as u64, ReduceOp::Sum)?;
    ///     Ok((survivors.rank(), survivors.size(), sum))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![(0, 3, 5), (1, 3, 5), (2, 3, 5)]
    /// );
    /// # Ok::<(), lazarus::Error>(())
    /// ```
    pub fn shrink(&self) -> Result<Communicator> {
        let d = self.agreement(true)?;
        let mut e = self.engine.borrow_mut();
        e.take_contexts(d.context, 2);
        e.mark_failed(&d.failed)?;
        drop(e);
        let survivors = self
            .members()
            .into_iter()
            .filter(|r| !d.failed.contains(r))
            .collect();
        self.with_group(survivors, d.context)
            .ok_or_else(|| Error::app("shrink: this rank is not among the survivors"))
    }

    /// Replace the failed members with new incarnations that take their
    /// numbers (002 §3.2: spawn a substitute, merge, reorder), and return
    /// the repaired communicator: the same group, a new context. Collective
    /// over the survivors; the new incarnations take part through
    /// [`crate::Ctx::join`]. Returns the communicator ranks that were
    /// respawned too, whose state the survivors must hand over.
    ///
    /// # Examples
    ///
    /// ```
    /// use lazarus::{Config, FailureHandling, ReduceOp};
    ///
    /// let cfg = Config::new(3)
    ///     .failure_handling(FailureHandling::Return)
    ///     .kill("2@i1".parse()?); // rank 2 dies after its first safe point
    /// let report = lazarus::run(&cfg, |ctx| {
    ///     let (comm, respawned) = if ctx.is_respawned() {
    ///         (ctx.join()?, vec![]) // the new incarnation of rank 2
    ///     } else {
    ///         let world = ctx.world();
    ///         ctx.checkpoint(&())?;
    ///         if world.rank() == 2 {
    ///             loop {
    ///                 ctx.compute(1e-4)?; // killed here
    ///             }
    ///         }
    ///         if world.barrier().is_err() {
    ///             world.revoke()?;
    ///         }
    ///         world.respawn()?
    ///     };
    ///     let sum = comm.all_reduce(comm.rank() as u64 + 1, ReduceOp::Sum)?;
    ///     Ok((respawned, sum))
    /// });
    /// assert_eq!(
    ///     report.outcome.unwrap(),
    ///     vec![(vec![2], 6), (vec![2], 6), (vec![], 6)]
    /// );
    /// # Ok::<(), lazarus::Error>(())
    /// ```
    pub fn respawn(&self) -> Result<(Communicator, Vec<Rank>)> {
        let d = self.agreement(true)?;
        let group = self.members();
        let me = self.engine.borrow().rank();
        // The first survivor starts the new incarnations and tells them
        // the communicator; everybody stops treating them as dead.
        let first = group.iter().copied().find(|r| !d.failed.contains(r));
        let starter = first == Some(me);
        {
            let mut e = self.engine.borrow_mut();
            e.take_contexts(d.context, 2);
            e.respawn(&d.failed, starter)?;
            if starter {
                for &f in &d.failed {
                    e.send_join(f, d.context, &group)?;
                }
            }
        }
        let comm = self
            .with_group(group, d.context)
            .ok_or_else(|| Error::app("respawn: this rank is not in the communicator"))?;
        comm.barrier()?;
        let respawned = (0..self.size())
            .filter(|&r| self.world_rank(r).is_ok_and(|w| d.failed.contains(&w)))
            .collect();
        Ok((comm, respawned))
    }
}
