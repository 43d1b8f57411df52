//! The polling watcher: scans diffed into pod events (removals first, then additions and
//! updates), each problem reported once.
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::scan::{Scanner, dir_error};
use super::{ManifestError, ScanResult};
use crate::pods::source::{PodEvent, SourcedPod};

/// Polls a manifest directory and reports pods added, updated and removed since the previous
/// poll. Call [`ManifestWatcher::poll`] periodically (every second is fine): unchanged files
/// (same length, mtime, ctime and inode) are not re-read.
///
/// If the directory disappears, every pod is removed (as kubelet does); other listing errors
/// keep the current pods. Either way the error is in [`ManifestWatcher::errors`].
#[derive(Debug)]
pub struct ManifestWatcher {
    pub(super) scanner: Scanner,
    pods: Vec<SourcedPod>,
    errors: Vec<ManifestError>,
    new_errors: Vec<ManifestError>,
    /// Whether [`Self::poll`] has run (its first result is the complete list).
    polled: bool,
}

impl ManifestWatcher {
    /// A watcher of `dir`, which must be an existing directory. Loads nothing until the first
    /// [`poll`](Self::poll), which reports every pod as added.
    pub fn new(dir: impl Into<PathBuf>) -> Result<Self, ManifestError> {
        let dir = dir.into();
        let meta = fs::metadata(&dir).map_err(|e| dir_error(&dir, e))?;
        if !meta.is_dir() {
            let e = io::Error::from(io::ErrorKind::NotADirectory);
            return Err(dir_error(&dir, e));
        }
        Ok(Self {
            scanner: Scanner::new(dir),
            pods: Vec::new(),
            errors: Vec::new(),
            new_errors: Vec::new(),
            polled: false,
        })
    }

    /// The watched directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.scanner.dir
    }

    /// Rescans and returns the changes: removals first, then additions and updates in file
    /// and document order. Updated means same uid, different pod; a pod that only moved to
    /// another file is not an update (its [`SourcedPod::origin`] is refreshed in [`Self::pods`]).
    pub fn poll(&mut self) -> Vec<PodEvent> {
        let scan = match self.scanner.scan() {
            Ok(scan) => scan,
            Err(e) => {
                let gone = matches!(&e, ManifestError::Dir { source, .. } if source.kind() == io::ErrorKind::NotFound);
                let pods = if gone { Vec::new() } else { self.pods.clone() };
                ScanResult {
                    pods,
                    errors: vec![e],
                }
            }
        };

        let before: HashMap<&str, &SourcedPod> = self
            .pods
            .iter()
            .map(|p| (p.pod.metadata.uid.as_str(), p))
            .collect();
        let after: HashMap<&str, &SourcedPod> = scan
            .pods
            .iter()
            .map(|p| (p.pod.metadata.uid.as_str(), p))
            .collect();
        let mut events = Vec::new();
        for old in &self.pods {
            if !after.contains_key(old.pod.metadata.uid.as_str()) {
                events.push(PodEvent::Removed {
                    uid: old.pod.metadata.uid.clone(),
                    namespace: old.pod.metadata.namespace.clone(),
                    name: old.pod.metadata.name.clone(),
                });
            }
        }
        for new in &scan.pods {
            match before.get(new.pod.metadata.uid.as_str()) {
                None => events.push(PodEvent::Added(new.clone())),
                Some(old) if old.pod != new.pod => events.push(PodEvent::Updated(new.clone())),
                Some(_) => {}
            }
        }

        let seen: BTreeSet<String> = self.errors.iter().map(ToString::to_string).collect();
        self.new_errors = scan
            .errors
            .iter()
            .filter(|e| !seen.contains(&e.to_string()))
            .cloned()
            .collect();
        self.errors = scan.errors;
        self.pods = scan.pods;
        self.polled = true;
        events
    }

    /// True once a poll has run.
    #[must_use]
    pub fn polled(&self) -> bool {
        self.polled
    }

    /// The pods of the latest poll, in file and document order.
    #[must_use]
    pub fn pods(&self) -> &[SourcedPod] {
        &self.pods
    }

    /// Every problem of the latest poll (a file that stays broken is reported at every poll).
    #[must_use]
    pub fn errors(&self) -> &[ManifestError] {
        &self.errors
    }

    /// The problems of the latest poll that the previous poll did not have: count and log
    /// these to report each problem once.
    #[must_use]
    pub fn new_errors(&self) -> &[ManifestError] {
        &self.new_errors
    }

    /// How many times a manifest file has been read and parsed (unchanged files are not).
    #[must_use]
    pub fn files_parsed(&self) -> u64 {
        self.scanner.files_parsed
    }
}
