//! What went wrong talking to the broker: unreachable (try again) or
//! refused (fix something first).

use crate::error::Error;
use lapin::protocol::{AMQPErrorKind, AMQPHardError, AMQPSoftError};
use lapin::ErrorKind;
use std::fmt::Display;

/// A broker failure, before it is told with the broker's URL.
#[derive(Debug)]
pub(crate) enum Fault {
    /// The broker is down, restarting, or the connection was lost.
    Unreachable(String),
    /// A call got no answer within its deadline: the broker, or the network
    /// to it, has gone silent. Logged and counted where it happened.
    TimedOut(String),
    /// The broker refused what was asked.
    Refused(String),
}

impl Fault {
    /// Sorts an error the client returned while `doing` something.
    pub(crate) fn of(doing: impl Display, error: &lapin::Error) -> Fault {
        let reason = format!("{doing}: {error}");
        match error.kind() {
            ErrorKind::ProtocolError(amqp) => match amqp.kind() {
                // The broker closing connections (an operator, a restart)
                // is not a refusal.
                AMQPErrorKind::Hard(AMQPHardError::CONNECTIONFORCED) => Fault::Unreachable(reason),
                AMQPErrorKind::Soft(AMQPSoftError::PRECONDITIONFAILED) => Fault::Refused(format!(
                    "{reason} (something of that name exists with other settings: \
                     delete it, or use another namespace)"
                )),
                // A refused login is an ACCESS_REFUSED too, while
                // connecting.
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED)
                    if amqp.get_message().as_str().contains("Login was refused") =>
                {
                    Fault::Refused(format!("{reason} (check the user name and password)"))
                }
                AMQPErrorKind::Soft(AMQPSoftError::ACCESSREFUSED) => Fault::Refused(format!(
                    "{reason} (check the user's permissions on the virtual host)"
                )),
                AMQPErrorKind::Hard(AMQPHardError::NOTALLOWED) => Fault::Refused(format!(
                    "{reason} (check the virtual host and the user's access to it)"
                )),
                _ => Fault::Refused(reason),
            },
            // A refused login closes the socket during the handshake: lapin
            // reports it as an I/O error whose text names the reason.
            _ if error.to_string().contains("ACCESS_REFUSED") => {
                Fault::Refused(format!("{reason} (check the user name and password)"))
            }
            _ => Fault::Unreachable(reason),
        }
    }

    /// Whether the connection is lost: it is to be made again.
    pub(crate) fn is_lost(&self) -> bool {
        matches!(self, Fault::Unreachable(_) | Fault::TimedOut(_))
    }

    /// The error, naming the broker at `url` (its password removed).
    pub(crate) fn into_error(self, url: String) -> Error {
        match self {
            Fault::Unreachable(reason) | Fault::TimedOut(reason) => {
                Error::BrokerUnreachable { url, reason }
            }
            Fault::Refused(reason) => Error::BrokerRefused { url, reason },
        }
    }
}
