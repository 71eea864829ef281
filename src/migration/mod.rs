//! Proactive fault tolerance (001): moving ranks off a worker that is about
//! to fail, while it still works, with no rollback.
//!
//! A *worker* (001's processor: a process, a thread group or a simulated
//! entity) hosts several *virtual ranks* (001's migratable objects). When a
//! health monitor warns that a node will fail, its workers are evacuated:
//! each resident rank is packed at a safe point and resumed elsewhere, and
//! the job continues on fewer workers.
//!
//! - [`location`]: the location service (001 §3.1): the index-to-home
//!   function, forwarding from a rank's last known location, routing
//!   updates, and the evacuation message that makes every worker stop using
//!   a warned one, simultaneous warnings included.
//! - [`collectives`]: the reduction tree repaired around a warned worker and
//!   the broadcast serializer handed over with its count (001 §3.2).
//! - [`balancer`]: reassigning ranks over the remaining workers after an
//!   evacuation, greedy or by refinement (001 §4.2).
//!
//! These are state machines and pure functions, like the protocols: they
//! own no thread, socket or clock. The drivers do not host several ranks a
//! worker yet (issue 36), so nothing outside this module's tests uses them.

pub mod balancer;
pub mod collectives;
pub mod location;
