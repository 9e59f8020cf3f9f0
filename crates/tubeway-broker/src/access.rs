//! The one place that decides who may do what.
//!
//! Today every connected client may manage destinations. Authentication will
//! plug in here: management operations will require an admin identity, and
//! ACLs will gate each destination.

use tubeway_proto::{MessageType, ResponseStatus};

use crate::broker::Refusal;

/// What a connection has proven about itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct Identity {
    /// Whether management operations are allowed.
    pub admin: bool,
}

impl Identity {
    /// The identity of a connection while authentication is off.
    pub fn anonymous() -> Self {
        Identity { admin: true }
    }
}

/// Whether `op` changes the set of destinations.
fn is_management(op: MessageType) -> bool {
    matches!(
        op,
        MessageType::CreateQueue
            | MessageType::RemoveQueue
            | MessageType::CreateTopic
            | MessageType::RemoveTopic
            | MessageType::RemoveFunction
    )
}

/// Checks that `who` may perform `op` on `destination`.
pub(crate) fn authorize(
    who: &Identity,
    op: MessageType,
    _destination: Option<&str>,
) -> Result<(), Refusal> {
    if is_management(op) && !who.admin {
        return Err(Refusal::new(
            ResponseStatus::NoPermission,
            format!("{op} requires an admin identity"),
        ));
    }
    Ok(())
}
