//! The pod sources of a Kubernetes node: the API server's watch of this node's pods
//! ([`api::ApiServerSource`], kube-rs `watcher` with `fieldSelector=spec.nodeName=<node>`) and
//! kubelet's own `/pods` endpoint ([`kubelet::KubeletSource`], polled), for nodes where the
//! agent may not watch the API.
//!
//! Both run as tasks on the agent's async runtime and hand the container manager's thread
//! their pod events through a channel ([`ChannelSource`], the [`PodSource`] it polls). Both
//! keep the pods they know in a [`PodTable`] and diff every complete list against it, so a
//! source that is lost (the API server unreachable, kubelet restarting) drops nothing: what is
//! known stays until the source is back and its list says a pod is gone. A malformed pod
//! object is reported naming the pod and the field, and loses only itself (a pod known from
//! before keeps its last good version).
use std::collections::HashMap;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};

use serde_json::Value;

use super::model::Pod;
use super::source::{Origin, PodEvent, PodSource, PodSourceError, SourcedPod};

pub mod api;
pub mod client;
pub mod decode;
pub mod kubelet;

pub use decode::DecodeError;

/// A problem of a Kubernetes pod source: the pod concerned is skipped (or keeps its last good
/// version); the source goes on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KubernetesSourceError {
    /// A pod object could not be read.
    #[error("{source_name}: {error}")]
    Decode {
        source_name: String,
        error: DecodeError,
    },
    /// The source could not be reached or answered with an error; known pods are kept.
    #[error("{source_name}: {message}")]
    Unavailable {
        source_name: String,
        message: String,
    },
}

/// What a source task sends the manager's thread.
#[derive(Debug)]
pub(crate) enum SourceMessage {
    Event(Box<PodEvent>),
    /// The events sent so far hold a complete list.
    Synced,
    Error(KubernetesSourceError),
    /// The source answered (true) or failed (false).
    Reachable(bool),
}

/// The pods a source knows, by uid, and the events that bring a new list or change into it.
#[derive(Debug, Default)]
pub(crate) struct PodTable {
    pods: HashMap<String, Pod>,
}

impl PodTable {
    /// A pod added or changed: `Added`, `Updated`, or nothing when it is unchanged.
    pub(crate) fn apply(&mut self, pod: Pod, origin: &Origin) -> Option<PodEvent> {
        let uid = pod.metadata.uid.clone();
        let sourced = SourcedPod {
            pod: pod.clone(),
            origin: origin.clone(),
        };
        match self.pods.insert(uid, pod) {
            None => Some(PodEvent::Added(sourced)),
            Some(old) if old == sourced.pod => None,
            Some(_) => Some(PodEvent::Updated(sourced)),
        }
    }

    /// A pod deleted: `Removed` when it was known.
    pub(crate) fn delete(&mut self, uid: &str) -> Option<PodEvent> {
        self.pods.remove(uid).map(|pod| PodEvent::Removed {
            uid: uid.to_owned(),
            namespace: pod.metadata.namespace,
            name: pod.metadata.name,
        })
    }

    /// A complete list: pods missing from it are removed, the others applied. `kept` are the
    /// uids of list items that could not be read: a known pod among them keeps its last good
    /// version instead of being removed.
    pub(crate) fn replace_all(
        &mut self,
        pods: Vec<Pod>,
        kept: &[String],
        origin: &Origin,
    ) -> Vec<PodEvent> {
        let listed: std::collections::HashSet<String> = pods
            .iter()
            .map(|p| p.metadata.uid.clone())
            .chain(kept.iter().cloned())
            .collect();
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|uid| !listed.contains(*uid))
            .cloned()
            .collect();
        let mut events: Vec<PodEvent> = gone.iter().filter_map(|uid| self.delete(uid)).collect();
        events.extend(pods.into_iter().filter_map(|pod| self.apply(pod, origin)));
        events
    }

    /// Number of pods known.
    pub(crate) fn len(&self) -> usize {
        self.pods.len()
    }
}

/// The uid of a raw pod object, for one that could not be decoded.
pub(crate) fn raw_uid(value: &Value) -> Option<String> {
    value
        .get("metadata")?
        .get("uid")?
        .as_str()
        .map(str::to_owned)
}

/// The [`PodSource`] of a source task: what the task sent since the last poll.
#[derive(Debug)]
pub struct ChannelSource {
    describe: String,
    receiver: Receiver<SourceMessage>,
    synced: bool,
    reachable: Option<bool>,
    errors: Vec<PodSourceError>,
    /// The task is gone (its runtime shut down): nothing more will come.
    ended: bool,
}

impl ChannelSource {
    pub(crate) fn new(describe: String, receiver: Receiver<SourceMessage>) -> Self {
        Self {
            describe,
            receiver,
            synced: false,
            reachable: None,
            errors: Vec::new(),
            ended: false,
        }
    }

    /// A source fed by hand (tests of the manager): the sender side of its channel.
    #[must_use]
    pub fn manual(describe: &str) -> (Self, ManualFeed) {
        let (sender, receiver) = std::sync::mpsc::channel();
        (
            Self::new(describe.to_owned(), receiver),
            ManualFeed { sender },
        )
    }
}

/// The sending end of [`ChannelSource::manual`].
#[derive(Debug, Clone)]
pub struct ManualFeed {
    sender: Sender<SourceMessage>,
}

impl ManualFeed {
    /// Sends events, then marks the source synced.
    pub fn send(&self, events: Vec<PodEvent>) {
        for event in events {
            // The source is gone when the receiver was dropped: nothing to deliver to.
            let _ = self.sender.send(SourceMessage::Event(Box::new(event)));
        }
        let _ = self.sender.send(SourceMessage::Synced);
    }
}

impl PodSource for ChannelSource {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    fn poll(&mut self) -> Vec<PodEvent> {
        self.errors.clear();
        let mut events = Vec::new();
        loop {
            match self.receiver.try_recv() {
                Ok(SourceMessage::Event(event)) => events.push(*event),
                Ok(SourceMessage::Synced) => self.synced = true,
                Ok(SourceMessage::Error(e)) => self.errors.push(PodSourceError::Kubernetes(e)),
                Ok(SourceMessage::Reachable(up)) => self.reachable = Some(up),
                Err(TryRecvError::Empty) => break,
                Err(TryRecvError::Disconnected) => {
                    if !self.ended {
                        tracing::warn!(source = %self.describe, "pod source task ended; known pods are kept");
                        self.ended = true;
                        self.reachable = Some(false);
                    }
                    break;
                }
            }
        }
        events
    }

    fn synced(&self) -> bool {
        self.synced
    }

    fn new_errors(&self) -> Vec<PodSourceError> {
        self.errors.clone()
    }

    fn reachable(&self) -> Option<bool> {
        self.reachable
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod table_tests {
    use super::*;
    use crate::pods::model::{ObjectMeta, PodSpec, PodStatus};

    fn pod(uid: &str, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: format!("p-{uid}"),
                namespace: "ns".into(),
                uid: uid.into(),
                ..ObjectMeta::default()
            },
            spec: PodSpec::default(),
            status: PodStatus {
                phase: phase.into(),
                ..PodStatus::default()
            },
        }
    }

    fn kinds(events: &[PodEvent]) -> Vec<String> {
        events
            .iter()
            .map(|e| match e {
                PodEvent::Added(p) => format!("+{}", p.pod.metadata.uid),
                PodEvent::Updated(p) => format!("~{}", p.pod.metadata.uid),
                PodEvent::Removed { uid, .. } => format!("-{uid}"),
            })
            .collect()
    }

    #[test]
    fn a_table_turns_lists_and_changes_into_events() {
        let origin = Origin::ApiServer { node: "n".into() };
        let mut table = PodTable::default();
        let events =
            table.replace_all(vec![pod("a", "Pending"), pod("b", "Running")], &[], &origin);
        assert_eq!(kinds(&events), ["+a", "+b"]);
        assert!(
            table.apply(pod("a", "Pending"), &origin).is_none(),
            "unchanged"
        );
        assert_eq!(
            kinds(&[table.apply(pod("a", "Running"), &origin).expect("changed")]),
            ["~a"]
        );
        // A relist without b and with c; d could not be read but was not known: nothing.
        let events = table.replace_all(
            vec![pod("a", "Running"), pod("c", "Pending")],
            &["d".into()],
            &origin,
        );
        assert_eq!(kinds(&events), ["-b", "+c"]);
        // c could not be read this time: it keeps its last good version.
        let events = table.replace_all(vec![pod("a", "Running")], &["c".into()], &origin);
        assert!(events.is_empty(), "{events:?}");
        assert_eq!(table.len(), 2);
        assert_eq!(kinds(&[table.delete("a").expect("known")]), ["-a"]);
        assert!(table.delete("a").is_none());
    }

    #[test]
    fn a_channel_source_reports_sync_errors_reachability_and_an_ended_task() {
        let (sender, receiver) = std::sync::mpsc::channel();
        let mut source = ChannelSource::new("test".into(), receiver);
        assert!(source.poll().is_empty());
        assert!(!source.synced());
        assert_eq!(source.reachable(), None);
        sender
            .send(SourceMessage::Error(KubernetesSourceError::Unavailable {
                source_name: "api".into(),
                message: "connection refused".into(),
            }))
            .expect("send");
        sender.send(SourceMessage::Reachable(false)).expect("send");
        assert!(source.poll().is_empty());
        assert_eq!(source.new_errors().len(), 1);
        assert_eq!(source.reachable(), Some(false));
        sender
            .send(SourceMessage::Event(Box::new(PodEvent::Removed {
                uid: "u".into(),
                namespace: "n".into(),
                name: "p".into(),
            })))
            .expect("send");
        sender.send(SourceMessage::Synced).expect("send");
        sender.send(SourceMessage::Reachable(true)).expect("send");
        assert_eq!(source.poll().len(), 1);
        assert!(
            source.new_errors().is_empty(),
            "errors are those of the latest poll"
        );
        assert!(source.synced());
        assert_eq!(source.reachable(), Some(true));
        drop(sender);
        assert!(source.poll().is_empty());
        assert_eq!(source.reachable(), Some(false), "the task is gone");
    }
}
