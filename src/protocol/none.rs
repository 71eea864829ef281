//! Protocol `none`: the baseline every overhead is measured against. Safe
//! points cost nothing; a failure ends the run with a clear error.

use super::{Action, Event, Protocol, ProtocolCx};
use crate::Error;

/// No fault tolerance.
#[derive(Debug, Default)]
pub struct NoProtocol;

impl Protocol for NoProtocol {
    fn name(&self) -> &'static str {
        "none"
    }

    fn handle(&mut self, event: Event<'_>, cx: &mut ProtocolCx<'_>) {
        match event {
            Event::SafePoint { .. } => cx.emit(Action::ReleaseSafePoint),
            Event::PeerFailed { dead, .. } => cx.emit(Action::Fail(Error::ProcessFailed {
                ranks: dead.to_vec(),
                protocol: "none".into(),
                why: "protocol `none` does not checkpoint; choose a checkpointing protocol (coordinated, for one)".into(),
            })),
            Event::Recover { .. } => cx.emit(Action::Fail(Error::ProcessFailed {
                ranks: vec![cx.rank],
                protocol: "none".into(),
                why: "protocol `none` cannot restart a rank".into(),
            })),
            _ => {}
        }
    }
}
