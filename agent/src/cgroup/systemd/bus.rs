//! systemd's manager over the system bus (zbus, blocking): transient units started with their
//! properties, properties changed, units stopped, each job's result awaited with a timeout.
//!
//! The `JobRemoved` signals are matched on the connection before the first call and forwarded
//! by one thread to a channel, so a job that ends before its call returns is not missed; a
//! waiter takes the signal of its own job and drops the others (jobs of other clients, or of
//! a call that gave up waiting).
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use zbus::blocking::{Connection, MessageIterator};
use zbus::message::Type as MessageType;
use zbus::zvariant::{OwnedObjectPath, OwnedValue, Value};
use zbus::{MatchRule, names::ErrorName};

use super::UnitManager;
use super::properties::{Property, PropertyValue};

const DESTINATION: &str = "org.freedesktop.systemd1";
const PATH: &str = "/org/freedesktop/systemd1";
const MANAGER: &str = "org.freedesktop.systemd1.Manager";
const PROPERTIES: &str = "org.freedesktop.DBus.Properties";
const UNIT_EXISTS: &str = "org.freedesktop.systemd1.UnitExists";
const NO_SUCH_UNIT: &str = "org.freedesktop.systemd1.NoSuchUnit";

/// Errors talking to systemd. Each names the unit and what was asked.
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    #[error("connecting to systemd on the system bus: {0}")]
    Connect(#[source] Box<zbus::Error>),
    #[error("systemd's version {0:?} does not start with a number")]
    Version(String),
    #[error("systemd unit {unit}: {method}({properties}): {source}")]
    Call {
        unit: String,
        method: &'static str,
        /// The property names sent, for the operator to see which one systemd refused.
        properties: String,
        #[source]
        source: Box<zbus::Error>,
    },
    #[error("systemd unit {unit}: {method} job {job} ended with {result:?}")]
    Job {
        unit: String,
        method: &'static str,
        job: String,
        result: String,
    },
    #[error("systemd unit {unit}: {method} job {job} not done after {timeout:?}")]
    Timeout {
        unit: String,
        method: &'static str,
        job: String,
        timeout: Duration,
    },
}

/// A started or stopped job's outcome.
struct JobRemoved {
    job: String,
    result: String,
}

/// The system manager, reached over the system bus.
pub struct SystemdBus {
    connection: Connection,
    removed: Mutex<Receiver<JobRemoved>>,
    version: u32,
    timeout: Duration,
}

impl SystemdBus {
    /// Connects to the system bus (`$DBUS_SYSTEM_BUS_ADDRESS`, else
    /// `/run/dbus/system_bus_socket`), subscribes to job results and reads systemd's version.
    /// `timeout` bounds each method call and each job.
    pub fn connect(timeout: Duration) -> Result<Self, BusError> {
        let connection = zbus::blocking::connection::Builder::system()
            .map_err(connect_error)?
            .method_timeout(timeout)
            .build()
            .map_err(connect_error)?;
        let rule = MatchRule::builder()
            .msg_type(MessageType::Signal)
            .sender(DESTINATION)
            .and_then(|b| b.interface(MANAGER))
            .and_then(|b| b.member("JobRemoved"))
            .map_err(connect_error)?
            .build();
        let signals = MessageIterator::for_match_rule(rule, &connection, Some(1024))
            .map_err(connect_error)?;
        let (sender, removed) = mpsc::channel();
        std::thread::Builder::new()
            .name("systemd-jobs".to_owned())
            .spawn(move || {
                for message in signals.flatten() {
                    let Ok((_, job, _, result)) =
                        message
                            .body()
                            .deserialize::<(u32, OwnedObjectPath, String, String)>()
                    else {
                        continue;
                    };
                    let removed = JobRemoved {
                        job: job.as_str().to_owned(),
                        result,
                    };
                    if sender.send(removed).is_err() {
                        break;
                    }
                }
            })
            .map_err(|e| connect_error(zbus::Error::InputOutput(e.into())))?;
        let mut bus = Self {
            connection,
            removed: Mutex::new(removed),
            version: 0,
            timeout,
        };
        let text = bus.manager_version()?;
        bus.version = leading_number(&text).ok_or(BusError::Version(text))?;
        Ok(bus)
    }

    fn reset_failed(&self, unit: &str) -> Result<(), BusError> {
        match self.call(unit, "ResetFailedUnit", &[], &(unit,)) {
            Ok(_) => Ok(()),
            Err(e) if is_error(&e, NO_SUCH_UNIT) => Ok(()),
            Err(e) => Err(e),
        }
    }

    fn manager_version(&self) -> Result<String, BusError> {
        let reply = self
            .connection
            .call_method(
                Some(DESTINATION),
                PATH,
                Some(PROPERTIES),
                "Get",
                &(MANAGER, "Version"),
            )
            .map_err(|source| call_error("(manager)", "Get Version", &[], source))?;
        let value = reply
            .body()
            .deserialize::<OwnedValue>()
            .map_err(|source| call_error("(manager)", "Get Version", &[], source))?;
        String::try_from(value)
            .map_err(|source| call_error("(manager)", "Get Version", &[], source.into()))
    }

    fn call<B>(
        &self,
        unit: &str,
        method: &'static str,
        properties: &[Property],
        body: &B,
    ) -> Result<zbus::Message, BusError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
    {
        self.connection
            .call_method(Some(DESTINATION), PATH, Some(MANAGER), method, body)
            .map_err(|source| call_error(unit, method, properties, source))
    }

    /// Waits for `job`'s `JobRemoved`; anything but "done" is an error naming the result.
    fn wait(
        &self,
        unit: &str,
        method: &'static str,
        job: &OwnedObjectPath,
    ) -> Result<(), BusError> {
        let removed = self.removed.lock().unwrap_or_else(PoisonError::into_inner);
        let deadline = Instant::now() + self.timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match removed.recv_timeout(left) {
                Ok(signal) if signal.job == job.as_str() => {
                    return if signal.result == "done" {
                        Ok(())
                    } else {
                        Err(BusError::Job {
                            unit: unit.to_owned(),
                            method,
                            job: signal.job,
                            result: signal.result,
                        })
                    };
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    return Err(BusError::Timeout {
                        unit: unit.to_owned(),
                        method,
                        job: job.as_str().to_owned(),
                        timeout: self.timeout,
                    });
                }
            }
        }
    }
}

impl UnitManager for SystemdBus {
    /// systemd's version number (252 for "252.36-1~deb12u1").
    fn version(&self) -> u32 {
        self.version
    }

    /// Starts transient unit `unit` with its own `settings` (description, dependencies,
    /// accounting, slice) and `resources`, plus, for a scope, the processes `pids`, and waits
    /// for its job. A unit that exists already gets `resources` set on it instead (a slice),
    /// or is reset and started again once (a scope left failed).
    fn start_transient(
        &self,
        unit: &str,
        settings: &[Property],
        resources: &[Property],
        pids: &[u32],
    ) -> Result<(), BusError> {
        let mut sent: Vec<Property> = settings.iter().chain(resources).cloned().collect();
        if !pids.is_empty() {
            sent.push(Property::new("PIDs", PropertyValue::U32s(pids.to_vec())));
        }
        let start = || -> Result<OwnedObjectPath, BusError> {
            let aux: Vec<(&str, Vec<(&str, Value<'_>)>)> = Vec::new();
            let reply = self.call(
                unit,
                "StartTransientUnit",
                &sent,
                &(unit, "replace", wire(&sent), aux),
            )?;
            reply
                .body()
                .deserialize::<OwnedObjectPath>()
                .map_err(|source| call_error(unit, "StartTransientUnit", &sent, source))
        };
        let job = match start() {
            Ok(job) => job,
            Err(e) if is_error(&e, UNIT_EXISTS) => {
                if pids.is_empty() {
                    // A slice systemd knows already (left by an earlier run, or loaded by a
                    // property change): given the properties and started if it is not.
                    self.set_properties(unit, resources)?;
                    let reply = self.call(unit, "StartUnit", &[], &(unit, "replace"))?;
                    let job = reply
                        .body()
                        .deserialize::<OwnedObjectPath>()
                        .map_err(|source| call_error(unit, "StartUnit", &[], source))?;
                    return self.wait(unit, "StartUnit", &job);
                }
                self.reset_failed(unit)?;
                start()?
            }
            Err(e) => return Err(e),
        };
        self.wait(unit, "StartTransientUnit", &job)
    }

    /// Sets `properties` on `unit` for this boot (`SetUnitProperties`, runtime): systemd
    /// applies them to the cgroup and keeps them in its transient drop-ins, so a
    /// `daemon-reload` applies them again.
    fn set_properties(&self, unit: &str, properties: &[Property]) -> Result<(), BusError> {
        if properties.is_empty() {
            return Ok(());
        }
        self.call(
            unit,
            "SetUnitProperties",
            properties,
            &(unit, true, wire(properties)),
        )
        .map(drop)
    }

    /// Stops `unit` (and, for a slice, every unit in it) and waits for the job; a unit that
    /// does not exist is stopped already.
    fn stop(&self, unit: &str) -> Result<(), BusError> {
        let reply = match self.call(unit, "StopUnit", &[], &(unit, "replace")) {
            Ok(reply) => reply,
            Err(e) if is_error(&e, NO_SUCH_UNIT) => return Ok(()),
            Err(e) => return Err(e),
        };
        let job = reply
            .body()
            .deserialize::<OwnedObjectPath>()
            .map_err(|source| call_error(unit, "StopUnit", &[], source))?;
        let waited = self.wait(unit, "StopUnit", &job);
        // A unit that failed while stopping would linger as failed and refuse the same name.
        let _ = self.reset_failed(unit);
        waited
    }
}

/// Properties as `a(sv)`.
fn wire(properties: &[Property]) -> Vec<(&str, Value<'_>)> {
    properties
        .iter()
        .map(|p| {
            let value = match &p.value {
                PropertyValue::U64(v) => Value::U64(*v),
                PropertyValue::Bool(v) => Value::Bool(*v),
                PropertyValue::Str(v) => Value::from(v.as_str()),
                PropertyValue::Strs(v) => Value::from(v.clone()),
                PropertyValue::Bytes(v) => Value::from(v.clone()),
                PropertyValue::U32s(v) => Value::from(v.clone()),
            };
            (p.name, value)
        })
        .collect()
}

fn call_error(
    unit: &str,
    method: &'static str,
    properties: &[Property],
    source: zbus::Error,
) -> BusError {
    BusError::Call {
        unit: unit.to_owned(),
        method,
        properties: properties
            .iter()
            .map(|p| p.name)
            .collect::<Vec<_>>()
            .join(", "),
        source: Box::new(source),
    }
}

fn connect_error(source: zbus::Error) -> BusError {
    BusError::Connect(Box::new(source))
}

/// True when `error` is the D-Bus error `name` from systemd.
fn is_error(error: &BusError, name: &str) -> bool {
    match error {
        BusError::Call { source, .. } => match &**source {
            zbus::Error::MethodError(found, _, _) => ErrorName::from(found).as_str() == name,
            _ => false,
        },
        _ => false,
    }
}

/// The number a version string starts with ("252.36-1~deb12u1" -> 252).
fn leading_number(text: &str) -> Option<u32> {
    let digits: String = text
        .trim_start_matches('v')
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// runc's `TestSystemdVersion` vectors, plus Debian's spelling.
    #[test]
    fn systemd_version() {
        assert_eq!(leading_number("v245.4-1.fc32"), Some(245));
        assert_eq!(leading_number("241-1"), Some(241));
        assert_eq!(leading_number("252.36-1~deb12u1"), Some(252));
        assert_eq!(leading_number("NaN"), None);
    }

    #[test]
    fn properties_go_on_the_wire_with_systemds_types() {
        let props = [
            Property::new("CPUWeight", PropertyValue::U64(39)),
            Property::new("AllowedCPUs", PropertyValue::Bytes(vec![0x0f])),
            Property::new(
                "Wants",
                PropertyValue::Strs(vec!["kubepods.slice".to_owned()]),
            ),
            Property::new("PIDs", PropertyValue::U32s(vec![42])),
            Property::new("Delegate", PropertyValue::Bool(true)),
            Property::new("Description", PropertyValue::Str("qosd".to_owned())),
        ];
        let signatures: Vec<String> = wire(&props)
            .iter()
            .map(|(_, v)| v.value_signature().to_string())
            .collect();
        assert_eq!(signatures, ["t", "ay", "as", "au", "b", "s"]);
    }
}
