//! The manifest-directory pod source: reads pods from `*.yaml`, `*.yml` and `*.json` files in
//! one directory (kubelet's `staticPodPath`) and reports what changed since the last look.
//!
//! This module owns manifest parsing ([`parse_manifest`]: several YAML documents per file, one
//! JSON value per file, `kind: Pod` or a `List` of Pods, `apiVersion: v1`), the directory scan
//! ([`scan_dir`]), and the polling watcher ([`ManifestWatcher`]) that diffs scans into
//! [`PodEvent`]s. Every pod is defaulted ([`Pod::apply_defaults`]) and validated
//! ([`validate_pod`]) before it is returned.
//!
//! Rules:
//! - files are read in name order; dotfiles, other extensions and subdirectories are skipped;
//!   symlinks are followed;
//! - YAML documents are separated by `---` lines and numbered from 1, skipping empty ones
//!   (blank or comments only); a JSON file is document 1. Each document is parsed on its own, so
//!   a syntax error only loses its own document; line numbers in messages are the file's;
//! - a malformed or invalid document (or `List` item) is reported and skipped, the rest loads;
//! - pods are unique by namespace/name and by uid: the first in file and document order wins,
//!   later ones are reported naming both places;
//! - a file that vanishes between listing and reading is simply gone.
use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use serde_yaml_ng::Value;

use super::model::Pod;
use super::validate::{ValidationErrors, validate_pod};

/// A problem with one document of a manifest (file-relative: see [`ManifestError::Document`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DocumentError {
    /// The document could not be read as a Pod: YAML/JSON syntax, wrong `apiVersion` / `kind`,
    /// wrong field type, bad quantity... `path` is the failing field (`spec.containers[0].name`).
    #[error("document {document}: {}{reason}", path.as_deref().map(|p| format!("{p}: ")).unwrap_or_default())]
    Parse {
        document: usize,
        path: Option<String>,
        reason: String,
    },
    /// The pod was read but fails validation.
    #[error("document {document}: {errors}")]
    Invalid {
        document: usize,
        errors: ValidationErrors,
    },
}

impl DocumentError {
    /// The 1-based document index in its file.
    #[must_use]
    pub fn document(&self) -> usize {
        match self {
            Self::Parse { document, .. } | Self::Invalid { document, .. } => *document,
        }
    }
}

/// A problem with the manifest directory or one of its files.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ManifestError {
    /// The directory cannot be listed (does not exist, is not a directory, no permission).
    #[error("manifest directory {}: {source}", dir.display())]
    Dir {
        dir: PathBuf,
        source: Arc<io::Error>,
    },
    /// A manifest file cannot be read (permission, not UTF-8, ...).
    #[error("{}: {source}", file.display())]
    Read {
        file: PathBuf,
        source: Arc<io::Error>,
    },
    /// A document of a file is malformed or invalid.
    #[error("{}: {error}", file.display())]
    Document { file: PathBuf, error: DocumentError },
    /// A second pod with an already loaded namespace/name; ignored.
    #[error(
        "{}: document {document}: pod {pod} is already defined in {} document {first_document}; ignoring this one",
        file.display(),
        first_file.display()
    )]
    DuplicatePod {
        file: PathBuf,
        document: usize,
        pod: String,
        first_file: PathBuf,
        first_document: usize,
    },
    /// A second pod with an already used uid; ignored.
    #[error(
        "{}: document {document}: pod {pod} has uid {uid}, already used by the pod of {} document {first_document}; ignoring this one",
        file.display(),
        first_file.display()
    )]
    DuplicateUid {
        file: PathBuf,
        document: usize,
        pod: String,
        uid: String,
        first_file: PathBuf,
        first_document: usize,
    },
}

impl ManifestError {
    /// The file (or, for [`ManifestError::Dir`], the directory) the error is about.
    #[must_use]
    pub fn path(&self) -> &Path {
        match self {
            Self::Dir { dir, .. } => dir,
            Self::Read { file, .. }
            | Self::Document { file, .. }
            | Self::DuplicatePod { file, .. }
            | Self::DuplicateUid { file, .. } => file,
        }
    }
}

/// How a manifest file is parsed, from its extension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ManifestFormat {
    /// `.yaml`, `.yml`: one or more `---`-separated documents.
    Yaml,
    /// `.json`: one value.
    Json,
}

impl ManifestFormat {
    /// The format of a file name, `None` for files that are not manifests (including dotfiles).
    #[must_use]
    pub fn of(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_str()?;
        if name.starts_with('.') {
            return None;
        }
        let (_, ext) = name.rsplit_once('.')?;
        match ext.to_ascii_lowercase().as_str() {
            "yaml" | "yml" => Some(Self::Yaml),
            "json" => Some(Self::Json),
            _ => None,
        }
    }
}

/// A defaulted, validated pod and the document it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedPod {
    /// 1-based document index within the file.
    pub document: usize,
    pub pod: Pod,
}

/// A pod and the file it was read from.
#[derive(Debug, Clone, PartialEq)]
pub struct SourcedPod {
    pub pod: Pod,
    pub file: PathBuf,
    /// 1-based document index within the file.
    pub document: usize,
}

/// The pods of a directory and every problem met reading it.
#[derive(Debug, Clone, Default)]
pub struct ScanResult {
    /// In file name order, then document order.
    pub pods: Vec<SourcedPod>,
    pub errors: Vec<ManifestError>,
}

/// What changed since the previous [`ManifestWatcher::poll`].
#[derive(Debug, Clone, PartialEq)]
pub enum PodEvent {
    /// A pod whose uid was not loaded before.
    Added(SourcedPod),
    /// A loaded pod (same uid) whose content changed.
    Updated(SourcedPod),
    /// A loaded pod that is gone (file deleted, document removed or now invalid, uid changed).
    Removed {
        uid: String,
        namespace: String,
        name: String,
    },
}

/// Parses the text of one manifest file into defaulted, validated pods, one result per pod
/// (a `List` gives one per item) in document order.
#[must_use]
pub fn parse_manifest(text: &str, format: ManifestFormat) -> Vec<Result<ParsedPod, DocumentError>> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let mut out = Vec::new();
    match format {
        ManifestFormat::Json => {
            if text.trim().is_empty() {
                return out;
            }
            let value = serde_json::from_str::<serde_json::Value>(text)
                .map_err(|e| e.to_string())
                .and_then(|json| serde_yaml_ng::to_value(json).map_err(|e| e.to_string()));
            match value {
                Ok(value) => pods_from_value(1, value, &mut out),
                Err(reason) => out.push(Err(parse_error(1, None, reason))),
            }
        }
        ManifestFormat::Yaml => {
            for (index, padded) in split_yaml_documents(text).into_iter().enumerate() {
                let document = index + 1;
                let value = serde_yaml_ng::from_str::<Value>(&padded).and_then(|mut v| {
                    v.apply_merge()?;
                    Ok(v)
                });
                match value {
                    Ok(value) => pods_from_value(document, value, &mut out),
                    Err(e) => out.push(Err(parse_error(document, None, e.to_string()))),
                }
            }
        }
    }
    out
}

/// Scans a directory once. Errs only when the directory itself cannot be listed; problems
/// with files and documents are in [`ScanResult::errors`].
pub fn scan_dir(dir: &Path) -> Result<ScanResult, ManifestError> {
    Scanner::new(dir.to_path_buf()).scan()
}

/// Polls a manifest directory and reports pods added, updated and removed since the previous
/// poll. Call [`ManifestWatcher::poll`] periodically (every second is fine): unchanged files
/// (same length, mtime, ctime and inode) are not re-read.
///
/// If the directory disappears, every pod is removed (as kubelet does); other listing errors
/// keep the current pods. Either way the error is in [`ManifestWatcher::errors`].
#[derive(Debug)]
pub struct ManifestWatcher {
    scanner: Scanner,
    pods: Vec<SourcedPod>,
    errors: Vec<ManifestError>,
    new_errors: Vec<ManifestError>,
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
        })
    }

    /// The watched directory.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.scanner.dir
    }

    /// Rescans and returns the changes: removals first, then additions and updates in file
    /// and document order. Updated means same uid, different pod; a pod that only moved to
    /// another file is not an update (its [`SourcedPod::file`] is refreshed in [`Self::pods`]).
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
        events
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

/// A file younger than this, relative to when it was read, may have been written again within
/// the same timestamp tick; such a file is re-read at the next scan (as git does for "racily
/// clean" entries) rather than trusted on its unchanged stamp.
const RACY_WINDOW: Duration = Duration::from_secs(2);

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
struct Scanner {
    dir: PathBuf,
    cache: HashMap<PathBuf, CachedFile>,
    files_parsed: u64,
}

enum FileOutcome {
    Parsed,
    ReadError(ManifestError),
    Gone,
}

impl Scanner {
    fn new(dir: PathBuf) -> Self {
        Self {
            dir,
            cache: HashMap::new(),
            files_parsed: 0,
        }
    }

    fn scan(&mut self) -> Result<ScanResult, ManifestError> {
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
                        file: file.clone(),
                        document: parsed.document,
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
        if !meta.is_file() {
            tracing::debug!(path = %file.display(), "not a regular file; skipped");
            return self.forget(file);
        }
        let stamp = Stamp::of(&meta);
        if self.cache.get(file).is_some_and(|c| c.still_valid(stamp)) {
            return FileOutcome::Parsed;
        }
        let read_at = SystemTime::now();
        let text = match fs::read_to_string(file) {
            Ok(text) => text,
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

fn dir_error(dir: &Path, e: io::Error) -> ManifestError {
    ManifestError::Dir {
        dir: dir.to_path_buf(),
        source: Arc::new(e),
    }
}

fn parse_error(document: usize, path: Option<String>, reason: String) -> DocumentError {
    DocumentError::Parse {
        document,
        path,
        reason,
    }
}

/// Splits YAML text at `---` (document start) and `...` (document end) lines, dropping
/// documents with nothing but blank lines, comments and directives. Each document is padded
/// with newlines so that the parser's line numbers are the file's.
fn split_yaml_documents(text: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    let mut current_start = 0;
    let mut flush = |current: &mut String, start: usize| {
        if has_content(current) {
            let mut padded = "\n".repeat(start);
            padded.push_str(current);
            docs.push(padded);
        }
        current.clear();
    };
    for (number, line) in text.split_inclusive('\n').enumerate() {
        let bare = line.trim_end_matches(['\n', '\r']);
        if is_marker(bare, "---") {
            flush(&mut current, current_start);
            current_start = number;
            current.push_str(line);
        } else if is_marker(bare, "...") {
            flush(&mut current, current_start);
            current_start = number + 1;
        } else {
            current.push_str(line);
        }
    }
    flush(&mut current, current_start);
    docs
}

fn is_marker(line: &str, marker: &str) -> bool {
    line.strip_prefix(marker)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with([' ', '\t']))
}

fn has_content(doc: &str) -> bool {
    doc.lines().any(|line| {
        let line = if is_marker(line, "---") {
            &line[3..]
        } else {
            line
        };
        let line = line.trim();
        !(line.is_empty() || line.starts_with('#') || line.starts_with('%'))
    })
}

/// Checks `apiVersion` / `kind` and reads a Pod, or each Pod of a List.
fn pods_from_value(document: usize, value: Value, out: &mut Vec<Result<ParsedPod, DocumentError>>) {
    if !matches!(value, Value::Mapping(_)) {
        out.push(Err(parse_error(
            document,
            None,
            format!(
                "expected a Pod or a List of Pods, found {}",
                describe(&value)
            ),
        )));
        return;
    }
    if let Err(e) = check_type_meta(document, &value, "", false) {
        out.push(Err(e));
        return;
    }
    if value.get("kind").and_then(Value::as_str) == Some("Pod") {
        out.push(decode_pod(document, value, ""));
        return;
    }
    // A List or PodList (check_type_meta allowed nothing else).
    let items = match value {
        Value::Mapping(mut map) => map.remove("items"),
        _ => None,
    };
    let items = match items {
        None | Some(Value::Null) => return,
        Some(Value::Sequence(items)) => items,
        Some(other) => {
            out.push(Err(parse_error(
                document,
                Some("items".into()),
                format!("expected a list of Pods, found {}", describe(&other)),
            )));
            return;
        }
    };
    for (i, item) in items.into_iter().enumerate() {
        if !matches!(item, Value::Mapping(_)) {
            out.push(Err(parse_error(
                document,
                Some(format!("items[{i}]")),
                format!("expected a Pod, found {}", describe(&item)),
            )));
            continue;
        }
        let prefix = format!("items[{i}].");
        match check_type_meta(document, &item, &prefix, true) {
            Ok(()) => out.push(decode_pod(document, item, &prefix)),
            Err(e) => out.push(Err(e)),
        }
    }
}

/// `apiVersion` must be `v1`; `kind` must be `Pod`, or at top level `List` / `PodList`.
/// List items may leave both out (a PodList's items do).
fn check_type_meta(
    document: usize,
    value: &Value,
    prefix: &str,
    item: bool,
) -> Result<(), DocumentError> {
    let field = |name: &str| Some(format!("{prefix}{name}"));
    match value.get("apiVersion") {
        Some(Value::String(v)) if v == "v1" => {}
        None if item => {}
        None => {
            return Err(parse_error(
                document,
                field("apiVersion"),
                "required (want \"v1\")".into(),
            ));
        }
        Some(other) => {
            return Err(parse_error(
                document,
                field("apiVersion"),
                format!("{} is not supported (want \"v1\")", describe(other)),
            ));
        }
    }
    let want = if item { "Pod" } else { "Pod, List or PodList" };
    match value.get("kind") {
        Some(Value::String(k)) if k == "Pod" => Ok(()),
        Some(Value::String(k)) if !item && (k == "List" || k == "PodList") => Ok(()),
        None if item => Ok(()),
        None => Err(parse_error(
            document,
            field("kind"),
            format!("required (want {want})"),
        )),
        Some(other) => Err(parse_error(
            document,
            field("kind"),
            format!("{} is not supported (want {want})", describe(other)),
        )),
    }
}

/// Deserializes, defaults and validates one pod; errors carry the field path.
fn decode_pod(document: usize, value: Value, prefix: &str) -> Result<ParsedPod, DocumentError> {
    let mut pod: Pod = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let path = if path == "." {
            prefix
                .strip_suffix('.')
                .map(str::to_owned)
                .filter(|p| !p.is_empty())
        } else {
            Some(format!("{prefix}{path}"))
        };
        parse_error(document, path, e.into_inner().to_string())
    })?;
    pod.apply_defaults();
    validate_pod(&pod).map_err(|errors| DocumentError::Invalid {
        document,
        errors: errors.with_prefix(prefix),
    })?;
    Ok(ParsedPod { document, pod })
}

fn describe(value: &Value) -> String {
    match value {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("boolean {b}"),
        Value::Number(n) => format!("number {n}"),
        Value::String(s) => format!("{s:?}"),
        Value::Sequence(_) => "a list".into(),
        Value::Mapping(_) => "an object".into(),
        Value::Tagged(t) => format!("tagged value {}", t.tag),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::qos::{QosClass, pod_qos};
    use std::fs::File;

    const WEB: &str = "apiVersion: v1
kind: Pod
metadata: {name: web}
spec:
  containers:
  - name: app
    command: [/bin/sh, -c, 'sleep 100']
    resources: {limits: {cpu: 1, memory: 128Mi}}
";

    fn pod_yaml(name: &str, cpu: &str) -> String {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  - name: c\n    resources: {{requests: {{cpu: {cpu}}}}}\n"
        )
    }

    fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
        let path = dir.join(name);
        fs::write(&path, text).unwrap();
        path
    }

    fn messages(errors: &[ManifestError]) -> Vec<String> {
        errors.iter().map(ToString::to_string).collect()
    }

    fn names(pods: &[SourcedPod]) -> Vec<String> {
        pods.iter().map(|p| p.pod.full_name()).collect()
    }

    #[test]
    fn parses_a_pod_with_defaults() {
        let results = parse_manifest(WEB, ManifestFormat::Yaml);
        assert_eq!(results.len(), 1);
        let parsed = results[0].as_ref().unwrap();
        assert_eq!(parsed.document, 1);
        assert_eq!(parsed.pod.full_name(), "default/web");
        assert_eq!(parsed.pod.metadata.uid.len(), 32);
        assert_eq!(pod_qos(&parsed.pod.spec), QosClass::Guaranteed);
    }

    #[test]
    fn several_documents_and_a_bad_one_in_the_middle() {
        let text = format!(
            "# leading comment\n---\n{}---\n# only a comment\n---\napiVersion: v1\nkind: Pod\nmetadata: {{name: [unclosed\n---\n{}...\n",
            pod_yaml("a", "1"),
            pod_yaml("b", "2")
        );
        let results = parse_manifest(&text, ManifestFormat::Yaml);
        assert_eq!(results.len(), 3, "{results:?}");
        assert_eq!(results[0].as_ref().unwrap().pod.metadata.name, "a");
        let err = results[1].as_ref().unwrap_err();
        assert_eq!(err.document(), 2);
        let msg = err.to_string();
        // The syntax error's line number is the file's.
        let line = text.lines().position(|l| l.contains("unclosed")).unwrap() + 1;
        assert_eq!(line, 15);
        assert!(
            msg.starts_with("document 2: ")
                && msg.contains(&format!("flow sequence at line {line} column 18")),
            "{msg}"
        );
        let b = results[2].as_ref().unwrap();
        assert_eq!((b.document, b.pod.metadata.name.as_str()), (3, "b"));
    }

    #[test]
    fn yaml_syntax_error_reports_the_files_line() {
        let text = format!(
            "{}---\nmetadata:\n  name: x\n   bad: indent\n",
            pod_yaml("a", "1")
        );
        let results = parse_manifest(&text, ManifestFormat::Yaml);
        let msg = results[1].as_ref().unwrap_err().to_string();
        let line = text
            .lines()
            .position(|l| l.contains("bad: indent"))
            .unwrap()
            + 1;
        assert!(
            msg.contains(&format!("line {line}")),
            "want line {line}: {msg}"
        );
    }

    #[test]
    fn field_errors_carry_the_path() {
        let text = WEB.replace("cpu: 1", "cpu: 5x");
        let results = parse_manifest(&text, ManifestFormat::Yaml);
        assert_eq!(
            results[0].as_ref().unwrap_err().to_string(),
            "document 1: spec.containers[0].resources.limits.cpu: quantity \"5x\" has an unknown suffix"
        );
        let text = WEB.replace("name: app", "name: app\n    args: notalist");
        let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("document 1: spec.containers[0].args: invalid type"),
            "{msg}"
        );
        let text = WEB.replace("- name: app\n", "- image: busybox\n");
        let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert_eq!(msg, "document 1: spec.containers[0]: missing field `name`");
    }

    #[test]
    fn wrong_kind_and_api_version() {
        let cases = [
            (
                WEB.replace("kind: Pod", "kind: Deployment"),
                "document 1: kind: \"Deployment\" is not supported (want Pod, List or PodList)",
            ),
            (
                WEB.replace("apiVersion: v1", "apiVersion: apps/v1"),
                "document 1: apiVersion: \"apps/v1\" is not supported (want \"v1\")",
            ),
            (
                WEB.replace("kind: Pod\n", ""),
                "document 1: kind: required (want Pod, List or PodList)",
            ),
            (
                "- a\n- b\n".to_owned(),
                "document 1: expected a Pod or a List of Pods, found a list",
            ),
        ];
        for (text, want) in cases {
            let results = parse_manifest(&text, ManifestFormat::Yaml);
            assert_eq!(results.len(), 1);
            assert_eq!(results[0].as_ref().unwrap_err().to_string(), want);
        }
    }

    #[test]
    fn invalid_pods_name_field_and_value() {
        let text = WEB.replace("name: web", "name: ../../etc");
        let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("document 1: metadata.name: \"../../etc\": must not contain '/'"),
            "{msg}"
        );
        let text = WEB.replace("name: web", "name: a/b");
        let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert!(msg.contains("metadata.name: \"a/b\""), "{msg}");
        let text = format!("{WEB}  - name: app\n");
        let msg = parse_manifest(&text, ManifestFormat::Yaml)[0]
            .as_ref()
            .unwrap_err()
            .to_string();
        assert_eq!(
            msg,
            "document 1: spec.containers[1].name: \"app\": duplicate name (also spec.containers[0].name)"
        );
    }

    #[test]
    fn json_pod_and_lists() {
        let json = r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"j","namespace":"ns"},
            "spec":{"containers":[{"name":"c","resources":{"requests":{"cpu":"100m","memory":"1Gi"}}}]}}"#;
        let results = parse_manifest(json, ManifestFormat::Json);
        let pod = &results[0].as_ref().unwrap().pod;
        assert_eq!(pod.full_name(), "ns/j");
        assert_eq!(pod_qos(&pod.spec), QosClass::Burstable);

        let list = r#"{"apiVersion":"v1","kind":"List","items":[
            {"apiVersion":"v1","kind":"Pod","metadata":{"name":"one"},"spec":{"containers":[{"name":"c"}]}},
            {"kind":"Service","metadata":{"name":"svc"}},
            {"metadata":{"name":"three"},"spec":{"containers":[{"name":"c","resources":{"requests":{"memory":"-1"}}}]}},
            {"metadata":{"name":"four"},"spec":{"containers":[{"name":"c"}]}}]}"#;
        let results = parse_manifest(list, ManifestFormat::Json);
        let msgs: Vec<String> = results
            .iter()
            .map(|r| match r {
                Ok(p) => p.pod.metadata.name.clone(),
                Err(e) => e.to_string(),
            })
            .collect();
        assert_eq!(
            msgs,
            [
                "one",
                "document 1: items[1].kind: \"Service\" is not supported (want Pod)",
                "document 1: items[2].spec.containers[0].resources.requests.memory: \"-1\": must be greater than or equal to 0",
                "four"
            ]
        );

        let err = parse_manifest("{\"kind\": \"Pod\",}", ManifestFormat::Json);
        let msg = err[0].as_ref().unwrap_err().to_string();
        assert!(
            msg.starts_with("document 1: ") && msg.contains("line 1"),
            "{msg}"
        );
        assert!(parse_manifest("  \n", ManifestFormat::Json).is_empty());
        assert!(parse_manifest("", ManifestFormat::Yaml).is_empty());
    }

    #[test]
    fn yaml_pod_list() {
        let text = "apiVersion: v1\nkind: PodList\nitems:\n- metadata: {name: x}\n  spec: {containers: [{name: c}]}\n- metadata: {name: y}\n  spec: {containers: [{name: c}]}\n";
        let names: Vec<_> = parse_manifest(text, ManifestFormat::Yaml)
            .into_iter()
            .map(|r| r.unwrap().pod.metadata.name)
            .collect();
        assert_eq!(names, ["x", "y"]);
    }

    #[test]
    fn file_formats() {
        assert_eq!(
            ManifestFormat::of(Path::new("d/a.yaml")),
            Some(ManifestFormat::Yaml)
        );
        assert_eq!(
            ManifestFormat::of(Path::new("a.YML")),
            Some(ManifestFormat::Yaml)
        );
        assert_eq!(
            ManifestFormat::of(Path::new("a.json")),
            Some(ManifestFormat::Json)
        );
        for skip in [
            ".a.yaml",
            "a.yaml~",
            "a.yaml.swp",
            "README",
            "a.txt",
            "yaml",
        ] {
            assert_eq!(ManifestFormat::of(Path::new(skip)), None, "{skip}");
        }
    }

    #[test]
    fn scan_dir_reads_files_in_order_and_reports_problems() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        write(
            dir,
            "b.yaml",
            &format!("{}---\n{}", pod_yaml("b1", "1"), pod_yaml("b2", "2x")),
        );
        write(
            dir,
            "a.json",
            r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"a"},"spec":{"containers":[{"name":"c"}]}}"#,
        );
        write(
            dir,
            "c.yml",
            &format!("{}---\n{}", pod_yaml("b1", "3"), pod_yaml("c", "1")),
        );
        write(dir, ".hidden.yaml", &pod_yaml("hidden", "1"));
        write(dir, "notes.txt", "not a manifest");
        write(dir, "broken.yaml", "kind: Pod\nmetadata: {name: x\n");
        fs::create_dir(dir.join("sub.yaml")).unwrap();
        write(dir, "zz.yaml", &WEB.replace("name: web", "name: bad_name"));

        let scan = scan_dir(dir).unwrap();
        assert_eq!(names(&scan.pods), ["default/a", "default/b1", "default/c"]);
        assert_eq!(scan.pods[1].file, dir.join("b.yaml"));
        assert_eq!(scan.pods[2].document, 2);
        let msgs = messages(&scan.errors);
        let d = dir.display();
        assert_eq!(msgs.len(), 4, "{msgs:#?}");
        assert_eq!(
            msgs[0],
            format!(
                "{d}/b.yaml: document 2: spec.containers[0].resources.requests.cpu: quantity \"2x\" has an unknown suffix"
            )
        );
        assert!(
            msgs[1].starts_with(&format!("{d}/broken.yaml: document 1: ")),
            "{}",
            msgs[1]
        );
        assert_eq!(
            msgs[2],
            format!(
                "{d}/c.yml: document 1: pod default/b1 is already defined in {d}/b.yaml document 1; ignoring this one"
            )
        );
        assert!(
            msgs[3].starts_with(&format!(
                "{d}/zz.yaml: document 1: metadata.name: \"bad_name\""
            )),
            "{}",
            msgs[3]
        );
    }

    #[test]
    fn duplicate_uids_are_rejected() {
        let tmp = tempfile::tempdir().unwrap();
        let with_uid =
            |name: &str| pod_yaml(name, "1").replace("metadata: {", "metadata: {uid: same-uid, ");
        write(tmp.path(), "a.yaml", &with_uid("first"));
        write(tmp.path(), "b.yaml", &with_uid("second"));
        let scan = scan_dir(tmp.path()).unwrap();
        assert_eq!(names(&scan.pods), ["default/first"]);
        let d = tmp.path().display();
        assert_eq!(
            messages(&scan.errors),
            [format!(
                "{d}/b.yaml: document 1: pod default/second has uid same-uid, already used by the pod of {d}/a.yaml document 1; ignoring this one"
            )]
        );
    }

    #[test]
    fn missing_directory_is_an_error_naming_it() {
        let tmp = tempfile::tempdir().unwrap();
        let missing = tmp.path().join("nope");
        let err = scan_dir(&missing).unwrap_err();
        assert!(
            err.to_string()
                .starts_with(&format!("manifest directory {}: ", missing.display())),
            "{err}"
        );
        assert_eq!(err.path(), missing);
        let err = ManifestWatcher::new(&missing).unwrap_err();
        assert!(err.to_string().contains("nope"), "{err}");
        let file = write(tmp.path(), "f.yaml", WEB);
        assert!(
            ManifestWatcher::new(file).is_err(),
            "a file is not a directory"
        );
    }

    #[test]
    fn unreadable_file_is_reported() {
        let tmp = tempfile::tempdir().unwrap();
        fs::write(tmp.path().join("bin.yaml"), [0xff, 0xfe, 0x00, 0x80]).unwrap();
        write(tmp.path(), "ok.yaml", WEB);
        let scan = scan_dir(tmp.path()).unwrap();
        assert_eq!(names(&scan.pods), ["default/web"]);
        assert!(
            matches!(scan.errors[..], [ManifestError::Read { .. }]),
            "{:?}",
            scan.errors
        );
    }

    /// Backdates a file so that the watcher's racy-write window does not force a re-read.
    fn backdate(path: &Path) {
        let old = SystemTime::now() - Duration::from_secs(60);
        File::options()
            .write(true)
            .open(path)
            .unwrap()
            .set_modified(old)
            .unwrap();
    }

    #[test]
    fn watcher_sees_add_update_and_delete() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut w = ManifestWatcher::new(dir).unwrap();
        assert!(w.poll().is_empty());

        let a = write(dir, "a.yaml", &pod_yaml("a", "1"));
        write(dir, "b.yaml", &pod_yaml("b", "1"));
        let events = w.poll();
        let added: Vec<_> = events
            .iter()
            .map(|e| match e {
                PodEvent::Added(p) => p.pod.full_name(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(added, ["default/a", "default/b"]);
        assert!(w.poll().is_empty(), "no change, no event");

        // Same length, new content, written right away: still seen.
        write(dir, "a.yaml", &pod_yaml("a", "2"));
        let events = w.poll();
        match &events[..] {
            [PodEvent::Updated(p)] => {
                assert_eq!(p.pod.full_name(), "default/a");
                assert_eq!(p.pod.spec.containers[0].cpu_request_millis(), 2000);
                assert_eq!(p.pod.metadata.uid, w.pods()[0].pod.metadata.uid);
            }
            other => panic!("{other:?}"),
        }

        fs::remove_file(&a).unwrap();
        let uid_a = crate::pods::model::derive_uid("default", "a");
        assert_eq!(
            w.poll(),
            [PodEvent::Removed {
                uid: uid_a,
                namespace: "default".into(),
                name: "a".into()
            }]
        );
        assert_eq!(names(w.pods()), ["default/b"]);
    }

    #[test]
    fn watcher_reports_new_errors_once_and_removes_pods_that_become_invalid() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let mut w = ManifestWatcher::new(dir).unwrap();
        write(dir, "a.yaml", &pod_yaml("a", "1"));
        assert_eq!(w.poll().len(), 1);
        write(dir, "a.yaml", &pod_yaml("a", "1x"));
        assert!(matches!(&w.poll()[..], [PodEvent::Removed { name, .. }] if name == "a"));
        assert_eq!(w.errors().len(), 1);
        assert_eq!(w.new_errors().len(), 1);
        assert!(w.poll().is_empty());
        assert_eq!(w.errors().len(), 1, "still broken");
        assert!(w.new_errors().is_empty(), "already reported");
        write(dir, "a.yaml", &pod_yaml("a", "1"));
        assert!(matches!(&w.poll()[..], [PodEvent::Added(_)]));
        assert!(w.errors().is_empty());
    }

    #[test]
    fn watcher_skips_unchanged_files_and_forgets_deleted_ones() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let a = write(dir, "a.yaml", &pod_yaml("a", "1"));
        let b = write(dir, "b.yaml", &pod_yaml("b", "1"));
        backdate(&a);
        backdate(&b);
        let mut w = ManifestWatcher::new(dir).unwrap();
        assert_eq!(w.poll().len(), 2);
        assert_eq!(w.files_parsed(), 2);
        for _ in 0..3 {
            assert!(w.poll().is_empty());
        }
        assert_eq!(w.files_parsed(), 2, "unchanged files are not re-read");
        write(dir, "b.yaml", &pod_yaml("b", "300m"));
        assert!(matches!(&w.poll()[..], [PodEvent::Updated(p)] if p.pod.metadata.name == "b"));
        assert_eq!(w.files_parsed(), 3, "only the changed file is re-read");
        fs::remove_file(&b).unwrap();
        assert!(matches!(&w.poll()[..], [PodEvent::Removed { name, .. }] if name == "b"));
        assert_eq!(w.scanner.cache.len(), 1);
    }

    #[test]
    fn watcher_handles_renames_and_a_vanished_directory() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("manifests");
        fs::create_dir(&dir).unwrap();
        let a = write(&dir, "a.yaml", &pod_yaml("a", "1"));
        let mut w = ManifestWatcher::new(&dir).unwrap();
        assert_eq!(w.poll().len(), 1);
        // Renamed file, same pod: no event, the new file is recorded.
        fs::rename(&a, dir.join("renamed.yaml")).unwrap();
        assert!(w.poll().is_empty());
        assert_eq!(w.pods()[0].file, dir.join("renamed.yaml"));
        // A pod that changes uid is removed and added.
        write(
            &dir,
            "renamed.yaml",
            &pod_yaml("a", "1").replace("metadata: {", "metadata: {uid: new-uid, "),
        );
        let events = w.poll();
        assert!(
            matches!(&events[..], [PodEvent::Removed { .. }, PodEvent::Added(p)] if p.pod.metadata.uid == "new-uid"),
            "{events:?}"
        );
        // The directory vanishes: every pod goes, and the error names the directory.
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(&w.poll()[..], [PodEvent::Removed { .. }]));
        assert!(w.pods().is_empty());
        assert!(matches!(w.errors(), [ManifestError::Dir { dir: d, .. }] if *d == dir));
    }

    /// The example manifests shipped in examples/pods load and classify as their names say.
    #[test]
    fn example_manifests_load_and_classify() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/pods");
        let scan = scan_dir(&dir).unwrap();
        assert!(scan.errors.is_empty(), "{:#?}", messages(&scan.errors));
        let got: Vec<(String, QosClass)> = scan
            .pods
            .iter()
            .map(|p| {
                let file = p.file.file_name().unwrap().to_string_lossy().into_owned();
                (file, pod_qos(&p.pod.spec))
            })
            .collect();
        assert_eq!(
            got,
            [
                ("besteffort.yaml".to_owned(), QosClass::BestEffort),
                ("burstable.yaml".to_owned(), QosClass::Burstable),
                ("guaranteed.yaml".to_owned(), QosClass::Guaranteed),
            ]
        );
        for p in &scan.pods {
            let c = &p.pod.spec.containers[0];
            assert_eq!(
                c.command.first().map(String::as_str),
                Some("/bin/sh"),
                "{}",
                p.pod.full_name()
            );
        }
        let guaranteed = &scan.pods[2].pod;
        assert_eq!(guaranteed.effective_requests().cpu_millis, 1000);
        assert_eq!(guaranteed.effective_requests().memory_bytes, 128 << 20);
        let burstable = &scan.pods[1].pod;
        assert_eq!(burstable.effective_requests().cpu_millis, 250);
        assert_eq!(burstable.spec.containers[0].cpu_limit_millis(), Some(500));
    }
}
