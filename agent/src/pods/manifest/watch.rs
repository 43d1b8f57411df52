//! The watcher: scans diffed into pod events (removals first, then additions and updates),
//! each problem reported once. The directory is rescanned only when inotify reports a change
//! in it (or it is removed or moved), and every [`RESCAN`] regardless, which catches what
//! inotify cannot see: a change to the target of a symlink that lives elsewhere (ConfigMap
//! volumes are built that way). Without a watch (inotify unavailable, or the directory gone
//! and not back yet) it rescans every [`UNWATCHED_RESCAN`].
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use inotify::{EventMask, Inotify, WatchMask};

use super::scan::{Scanner, dir_error};
use super::{ManifestError, ScanResult};
use crate::pods::source::{PodEvent, SourcedPod};

/// Without an inotify report, the longest a watched directory goes without a rescan (kubelet
/// rechecks its static pod directory as often: `fileCheckFrequency`, 20 s).
pub const RESCAN: Duration = Duration::from_secs(20);
/// How often a directory without a watch is rescanned.
pub const UNWATCHED_RESCAN: Duration = Duration::from_secs(1);

/// What inotify is told to report about the directory.
fn watch_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MODIFY
        | WatchMask::CLOSE_WRITE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ATTRIB
        | WatchMask::DELETE_SELF
        | WatchMask::MOVE_SELF
}

/// The inotify instance on the directory and whether its watch is in place.
#[derive(Debug)]
struct DirWatch {
    inotify: Inotify,
    armed: bool,
}

impl DirWatch {
    fn new(dir: &Path) -> Option<Self> {
        let inotify = Inotify::init()
            .inspect_err(|e| tracing::warn!(error = %e, "inotify unavailable; the manifest directory is polled"))
            .ok()?;
        let mut watch = Self {
            inotify,
            armed: false,
        };
        watch.arm(dir);
        Some(watch)
    }

    fn arm(&mut self, dir: &Path) {
        match self.inotify.watches().add(dir, watch_mask()) {
            Ok(_) => self.armed = true,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "no inotify watch on the manifest directory (yet)");
                self.armed = false;
            }
        }
    }

    /// Drains the pending events: true when any could change the scan (an overflowed queue
    /// or a read error counts as a change). A removed or moved directory loses the watch.
    fn changed(&mut self) -> bool {
        let mut buffer = [0u8; 4096];
        let mut changed = false;
        loop {
            match self.inotify.read_events(&mut buffer) {
                Ok(events) => {
                    let mut any = false;
                    for event in events {
                        any = true;
                        if event.mask.intersects(
                            EventMask::IGNORED | EventMask::DELETE_SELF | EventMask::MOVE_SELF,
                        ) {
                            self.armed = false;
                        }
                    }
                    if !any {
                        return changed;
                    }
                    changed = true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return changed,
                Err(e) => {
                    tracing::debug!(error = %e, "reading inotify events; rescanning");
                    return true;
                }
            }
        }
    }
}

/// Reports the pods of a manifest directory added, updated and removed since the previous
/// poll. Call [`ManifestWatcher::poll`] as often as changes should be seen (the container
/// manager does every 100 ms): a poll that finds no inotify event and no rescan due costs one
/// `read(2)`; a rescan does not re-read unchanged files (same length, mtime, ctime and inode).
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
    /// inotify on the directory, when the kernel gives one.
    watch: Option<DirWatch>,
    last_scan: Option<Instant>,
    scans: u64,
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
            watch: DirWatch::new(&dir),
            scanner: Scanner::new(dir),
            pods: Vec::new(),
            errors: Vec::new(),
            new_errors: Vec::new(),
            polled: false,
            last_scan: None,
            scans: 0,
        })
    }

    /// The watched directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.scanner.dir
    }

    /// The changes since the previous poll, when a rescan is due (the first poll, an inotify
    /// report, [`RESCAN`] passed): removals first, then additions and updates in file and
    /// document order. Updated means same uid, different pod; a pod that only moved to another
    /// file is not an update (its [`SourcedPod::origin`] is refreshed in [`Self::pods`]).
    pub fn poll(&mut self) -> Vec<PodEvent> {
        if !self.rescan_due() {
            self.new_errors.clear();
            return Vec::new();
        }
        self.last_scan = Some(Instant::now());
        self.scans += 1;
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
        if let Some(watch) = self.watch.as_mut()
            && !watch.armed
        {
            watch.arm(&self.scanner.dir);
        }
        events
    }

    /// Whether the directory must be looked at now.
    fn rescan_due(&mut self) -> bool {
        let Some(last) = self.last_scan else {
            return true;
        };
        let (changed, armed) = match self.watch.as_mut() {
            Some(watch) => (watch.changed(), watch.armed),
            None => (false, false),
        };
        let every = if armed { RESCAN } else { UNWATCHED_RESCAN };
        changed || last.elapsed() >= every
    }

    /// How many times the directory has been scanned.
    #[must_use]
    pub fn scans(&self) -> u64 {
        self.scans
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
