//! The seam between where pods come from and the container manager: a [`PodSource`] turns its
//! own input (a manifest directory, the Kubernetes API server's watch, kubelet's `/pods`)
//! into one stream of [`PodEvent`]s, each pod carrying its [`Origin`]. The
//! container manager only ever sees events, so a new source is a new implementation of this
//! trait and nothing else.
use std::fmt;
use std::path::PathBuf;

use super::kubernetes::KubernetesSourceError;
use super::manifest::{ManifestError, ManifestWatcher};
use super::model::Pod;

/// Where a pod came from, for logs, `qosd inspect` and error messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A document of a file in the manifest directory.
    Manifest {
        file: PathBuf,
        /// 1-based document index within the file.
        document: usize,
    },
    /// The API server's watch of the pods bound to `node`.
    ApiServer { node: String },
    /// kubelet's `/pods` endpoint at `url`.
    Kubelet { url: String },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Manifest { file, .. } => write!(f, "{}", file.display()),
            Self::ApiServer { node } => write!(f, "API server (pods of node {node})"),
            Self::Kubelet { url } => write!(f, "kubelet {url}/pods"),
        }
    }
}

/// A pod and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedPod {
    pub pod: Pod,
    pub origin: Origin,
}

/// What changed since the previous [`PodSource::poll`].
#[derive(Debug, Clone, PartialEq)]
pub enum PodEvent {
    /// A pod whose uid was not known before.
    Added(SourcedPod),
    /// A known pod (same uid) whose content changed.
    Updated(SourcedPod),
    /// A known pod that is gone (for a manifest: file deleted, document removed or now
    /// invalid, uid changed).
    Removed {
        uid: String,
        namespace: String,
        name: String,
    },
}

/// A problem a source met with its input: the pod (or file) concerned is not admitted, every
/// other pod runs on.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PodSourceError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error(transparent)]
    Kubernetes(#[from] KubernetesSourceError),
}

/// A source of pods for the container manager.
pub trait PodSource: Send {
    /// What it reads, for logs ("manifest directory /etc/qosd/manifests").
    fn describe(&self) -> String;

    /// The changes since the previous call. The first call that returns with
    /// [`Self::synced`] true holds the complete list (every pod as added): the container
    /// manager resumes what an earlier run left from it.
    fn poll(&mut self) -> Vec<PodEvent>;

    /// True once the source has delivered a complete list.
    fn synced(&self) -> bool;

    /// The problems of the latest poll that the previous poll did not have (each reported
    /// once; count and log them).
    fn new_errors(&self) -> Vec<PodSourceError>;

    /// Whether the source answered its last request (`None`: it has no remote end, or has not
    /// tried yet). A source that cannot be reached keeps the pods it knows.
    fn reachable(&self) -> Option<bool> {
        None
    }
}

impl PodSource for ManifestWatcher {
    fn describe(&self) -> String {
        format!("manifest directory {}", self.dir().display())
    }

    fn poll(&mut self) -> Vec<PodEvent> {
        ManifestWatcher::poll(self)
    }

    fn synced(&self) -> bool {
        self.polled()
    }

    fn new_errors(&self) -> Vec<PodSourceError> {
        ManifestWatcher::new_errors(self)
            .iter()
            .cloned()
            .map(PodSourceError::from)
            .collect()
    }
}
