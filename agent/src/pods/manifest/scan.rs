//! One look at a manifest directory: files listed in name order, each parsed once for as
//! long as its stamp (length, mtime, ctime, inode) is unchanged and not racily clean, pods
//! unique by namespace/name and by uid (the first wins, later ones are reported naming both).
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use super::parse::parse_manifest;
use super::{DocumentError, ManifestError, ManifestFormat, ParsedPod, ScanResult};
use crate::pods::source::{Origin, SourcedPod};

/// Scans a directory once. Errs only when the directory itself cannot be listed; problems
/// with files and documents are in [`ScanResult::errors`].
pub fn scan_dir(dir: &Path) -> Result<ScanResult, ManifestError> {
    Scanner::new(dir.to_path_buf()).scan()
}

/// A file younger than this, relative to when it was read, may have been written again within
/// the same timestamp tick; such a file is re-read at the next scan (as git does for "racily
/// clean" entries) rather than trusted on its unchanged stamp.
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// The largest manifest file read: a pod manifest is a few KiB, a file of many pods a few
/// hundred; anything near this is not a manifest, and reading it would cost memory and time.
pub(super) const MAX_MANIFEST_BYTES: u64 = 4 << 20;

/// The metadata an unchanged file keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    len: u64,
    mtime: SystemTime,
    ctime: (i64, i64),
    inode: (u64, u64),
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Option<Self> {
        use std::os::unix::fs::MetadataExt;
        Some(Self {
            len: meta.len(),
            mtime: meta.modified().ok()?,
            ctime: (meta.ctime(), meta.ctime_nsec()),
            inode: (meta.dev(), meta.ino()),
        })
    }
}

#[derive(Debug)]
struct CachedFile {
    /// `None` when the file system gives no mtime: never trusted, re-read at every scan.
    stamp: Option<Stamp>,
    read_at: SystemTime,
    results: Vec<Result<ParsedPod, DocumentError>>,
}

impl CachedFile {
    fn still_valid(&self, stamp: Option<Stamp>) -> bool {
        let (Some(cached), Some(now)) = (self.stamp, stamp) else {
            return false;
        };
        cached == now
            && self
                .read_at
                .checked_sub(RACY_WINDOW)
                .is_some_and(|settled| cached.mtime < settled)
    }
}

/// Lists and parses a directory, keeping each file's parse for as long as it is unchanged.
#[derive(Debug)]
pub(super) struct Scanner {
    pub(super) dir: PathBuf,
    cache: HashMap<PathBuf, CachedFile>,
    pub(super) files_parsed: u64,
}

enum FileOutcome {
    Parsed,
    ReadError(ManifestError),
    Gone,
}

impl Scanner {
    /// How many files' parses are cached.
    #[cfg(test)]
    pub(super) fn cached_files(&self) -> usize {
        self.cache.len()
    }

    pub(super) fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            cache: HashMap::new(),
            files_parsed: 0,
        }
    }

    pub(super) fn scan(&mut self) -> Result<ScanResult, ManifestError> {
        let files = self.list()?;
        let mut result = ScanResult::default();
        let mut by_name: HashMap<String, (PathBuf, usize)> = HashMap::new();
        let mut by_uid: HashMap<String, (PathBuf, usize)> = HashMap::new();
        for (file, format) in &files {
            match self.refresh(file, *format) {
                FileOutcome::Gone => continue,
                FileOutcome::ReadError(e) => {
                    result.errors.push(e);
                    continue;
                }
                FileOutcome::Parsed => {}
            }
            let Some(cached) = self.cache.get(file) else {
                continue;
            };
            for parsed in &cached.results {
                let parsed = match parsed {
                    Ok(p) => p,
                    Err(error) => {
                        result.errors.push(ManifestError::Document {
                            file: file.clone(),
                            error: error.clone(),
                        });
                        continue;
                    }
                };
                let full_name = parsed.pod.full_name();
                let uid = &parsed.pod.metadata.uid;
                if let Some((first_file, first_document)) = by_name.get(&full_name) {
                    result.errors.push(ManifestError::DuplicatePod {
                        file: file.clone(),
                        document: parsed.document,
                        pod: full_name,
                        first_file: first_file.clone(),
                        first_document: *first_document,
                    });
                } else if let Some((first_file, first_document)) = by_uid.get(uid) {
                    result.errors.push(ManifestError::DuplicateUid {
                        file: file.clone(),
                        document: parsed.document,
                        pod: full_name,
                        uid: uid.clone(),
                        first_file: first_file.clone(),
                        first_document: *first_document,
                    });
                } else {
                    by_name.insert(full_name, (file.clone(), parsed.document));
                    by_uid.insert(uid.clone(), (file.clone(), parsed.document));
                    result.pods.push(SourcedPod {
                        pod: parsed.pod.clone(),
                        origin: Origin::Manifest {
                            file: file.clone(),
                            document: parsed.document,
                        },
                    });
                }
            }
        }
        // Forget files that are gone or no longer manifests.
        let listed: BTreeSet<&PathBuf> = files.iter().map(|(f, _)| f).collect();
        self.cache.retain(|file, _| listed.contains(file));
        Ok(result)
    }

    /// Manifest files of the directory, sorted by name.
    fn list(&self) -> Result<Vec<(PathBuf, ManifestFormat)>, ManifestError> {
        let entries = fs::read_dir(&self.dir).map_err(|e| dir_error(&self.dir, e))?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| dir_error(&self.dir, e))?;
            let path = self.dir.join(entry.file_name());
            if let Some(format) = ManifestFormat::of(&path) {
                files.push((path, format));
            }
        }
        files.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(files)
    }

    /// Makes sure the cache holds the current parse of `file`.
    fn refresh(&mut self, file: &Path, format: ManifestFormat) -> FileOutcome {
        let meta = match fs::metadata(file) {
            Ok(meta) => meta,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return self.forget(file),
            Err(e) => return self.read_error(file, e),
        };
        if meta.is_dir() {
            let e = io::Error::new(
                io::ErrorKind::IsADirectory,
                "a directory, not a manifest file (subdirectories are not read)",
            );
            return self.read_error(file, e);
        }
        if !meta.is_file() {
            // Never opened: reading a FIFO would block the scan.
            let e = io::Error::new(
                io::ErrorKind::InvalidInput,
                "not a regular file (FIFOs, sockets and devices are not read)",
            );
            return self.read_error(file, e);
        }
        let stamp = Stamp::of(&meta);
        if self.cache.get(file).is_some_and(|c| c.still_valid(stamp)) {
            return FileOutcome::Parsed;
        }
        if meta.len() > MAX_MANIFEST_BYTES {
            return self.too_large(file, meta.len());
        }
        let read_at = SystemTime::now();
        let text = match read_bounded(file) {
            Ok(Ok(text)) => text,
            // It grew past the limit since its size was read.
            Ok(Err(bytes)) => return self.too_large(file, bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return self.forget(file),
            Err(e) => return self.read_error(file, e),
        };
        self.files_parsed += 1;
        let results = parse_manifest(&text, format);
        self.cache.insert(
            file.to_path_buf(),
            CachedFile {
                stamp,
                read_at,
                results,
            },
        );
        FileOutcome::Parsed
    }

    fn too_large(&mut self, file: &Path, bytes: u64) -> FileOutcome {
        self.cache.remove(file);
        FileOutcome::ReadError(ManifestError::TooLarge {
            file: file.to_path_buf(),
            bytes,
            limit: MAX_MANIFEST_BYTES,
        })
    }

    fn forget(&mut self, file: &Path) -> FileOutcome {
        self.cache.remove(file);
        FileOutcome::Gone
    }

    fn read_error(&mut self, file: &Path, e: io::Error) -> FileOutcome {
        self.cache.remove(file);
        FileOutcome::ReadError(ManifestError::Read {
            file: file.to_path_buf(),
            source: Arc::new(e),
        })
    }
}

/// The file's text, reading at most one byte past [`MAX_MANIFEST_BYTES`]: `Err(bytes read)`
/// when it is larger (it grew after its size was read).
fn read_bounded(file: &Path) -> io::Result<Result<String, u64>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    fs::File::open(file)?
        .take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut bytes)?;
    let read = u64::try_from(bytes.len()).unwrap_or(u64::MAX);
    if read > MAX_MANIFEST_BYTES {
        return Ok(Err(read));
    }
    String::from_utf8(bytes).map(Ok).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not UTF-8 text: {}", e.utf8_error()),
        )
    })
}

pub(super) fn dir_error(dir: &Path, e: io::Error) -> ManifestError {
    ManifestError::Dir {
        dir: dir.to_path_buf(),
        source: Arc::new(e),
    }
}
