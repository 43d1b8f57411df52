//! The manifest-directory pod source: reads pods from `*.yaml`, `*.yml` and `*.json` files in
//! one directory (kubelet's `staticPodPath`) and reports what changed since the last look.
//!
//! This module owns manifest parsing ([`parse_manifest`]: several YAML documents per file, one
//! JSON value per file, `kind: Pod` or a `List` of Pods, `apiVersion: v1`), the directory scan
//! ([`scan_dir`]), and the polling watcher ([`ManifestWatcher`]) that diffs scans into
//! [`PodEvent`](super::source::PodEvent)s. Every pod is defaulted ([`Pod::apply_defaults`]) and validated
//! ([`validate_pod`]) before it is returned.
//!
//! Rules:
//! - files are read in name order; dotfiles and other extensions are skipped; symlinks are
//!   followed (a loop is an error naming the link); a subdirectory, FIFO, socket or device with
//!   a manifest's extension is an error naming it and is never opened; a file larger than
//!   4 MiB is an error naming it and is not read, and one that is not UTF-8 an error naming it;
//! - a YAML document with more than 10,000 `[` and `{`, or flow collections nested deeper
//!   than 128 levels, is an error before the parser sees it (its time grows with the square
//!   of the depth, and the bracket count bounds the depth whatever the text's quoting);
//! - YAML documents are separated by `---` lines and numbered from 1, skipping empty ones
//!   (blank or comments only); a JSON file is document 1. Each document is parsed on its own, so
//!   a syntax error only loses its own document; line numbers in messages are the file's;
//! - a malformed or invalid document (or `List` item) is reported and skipped, the rest loads;
//! - pods are unique by namespace/name and by uid: the first in file and document order wins,
//!   later ones are reported naming both places;
//! - a file that vanishes between listing and reading is simply gone.
//!
//! Rooms: [`parse`] (documents to pods), [`scan`] (a directory once, with the per-file cache),
//! [`watch`] (scans diffed into pod events; the [`crate::pods::source::PodSource`] of
//! standalone mode).
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::model::Pod;
use super::source::SourcedPod;
use super::validate::ValidationErrors;

mod parse;
mod scan;
#[cfg(test)]
mod tests;
mod watch;

pub use parse::parse_manifest;
pub use scan::scan_dir;
pub use watch::{ManifestWatcher, RESCAN, UNWATCHED_RESCAN};

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
    /// A manifest file larger than qosd reads (a runaway generator, a file that is not a
    /// manifest); nothing of it is read.
    #[error(
        "{}: {bytes} bytes, more than the {limit} bytes qosd reads from a manifest file; ignored",
        file.display()
    )]
    TooLarge {
        file: PathBuf,
        bytes: u64,
        limit: u64,
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
            | Self::TooLarge { file, .. }
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

/// The pods of a directory and every problem met reading it.
#[derive(Debug, Clone, Default)]
pub struct ScanResult {
    /// In file name order, then document order.
    pub pods: Vec<SourcedPod>,
    pub errors: Vec<ManifestError>,
}
