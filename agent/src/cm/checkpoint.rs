//! Checkpoint files shared by the CPU and memory managers (`cpu_manager_state`,
//! `memory_manager_state`): kubelet's checksum, durable writes, and the typed outcome of a
//! restore.
//!
//! This module owns:
//! - [`GoValue`] and [`kubelet_checksum`]: kubelet's checkpoint checksum
//!   (`checkpointmanager/checksum`). kubelet hashes, with 32-bit FNV-1a, the text go-spew prints
//!   for the checkpoint struct with `%#v` (`ConfigState{Indent: " ", SortKeys: true,
//!   DisableMethods: true, SpewKeys: true}`, the same output as `dump.ForHash`). [`GoValue`]
//!   models the Go value (type names included, since `%#v` prints them) and [`GoValue::spew`]
//!   reproduces spew's formatter for the kinds checkpoints use: strings, integers, structs,
//!   maps (keys sorted), slices and pointers, `nil` included;
//! - [`write_atomic`]: temporary file in the same directory, fsync, rename, fsync of the
//!   directory, so a crash leaves either the old or the new file;
//! - [`read_checkpoint`], and [`Recovery`] / [`RecoveryReason`] / [`Restored`]: what a restore
//!   found when it could not use the file (missing, corrupt, checksum mismatch, policy change,
//!   state that does not fit this machine). Restoring never fails hard: the caller rebuilds its
//!   state (from cgroupfs), counts `qosd_checkpoint_recoveries_total{checkpoint,reason}` and
//!   logs the [`Recovery`] (see `cm::resource_managers`).
//!
//! The checkpoint layouts themselves live with their managers (`cm::cpu::state`,
//! `cm::memory::state`).
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Errors reading or writing a checkpoint file.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{op} checkpoint {}: {source}", .path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        source: io::Error,
    },
    #[error("encoding checkpoint {}: {source}", .path.display())]
    Encode {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// A checkpoint member without the shape kubelet's types need (Go's decoding error, in
/// kubelet's words where it has them); it becomes the detail of a checkpoint recovery.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// `what` (a member, with its path) holds `found`, which is not `expected`.
    #[error("{what}: {found} is not {expected}")]
    WrongType {
        what: String,
        found: String,
        expected: &'static str,
    },
    /// Go's `json: cannot unmarshal ... into Go struct field ...`.
    #[error("cannot unmarshal {found} into Go struct field {field}")]
    Unmarshal { found: String, field: &'static str },
    /// A CPU list that does not parse.
    #[error("could not parse {what} {text:?}: {reason}")]
    CpuList {
        what: &'static str,
        text: String,
        reason: String,
    },
}

impl ShapeError {
    /// `what` holds `found`, which is not `expected`.
    pub(crate) fn wrong(
        what: impl Into<String>,
        found: &serde_json::Value,
        expected: &'static str,
    ) -> Self {
        Self::WrongType {
            what: what.into(),
            found: found.to_string(),
            expected,
        }
    }
}

/// A Go value as go-spew sees it: kind, Go type name (`%#v` prints it) and contents.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GoValue {
    /// A value of string kind (`string`, `v1.ResourceName`, ...).
    Str { ty: String, value: String },
    /// A signed integer (`int`, `int64`, ...).
    Int { ty: String, value: i64 },
    /// An unsigned integer (`uint64`, `checksum.Checksum`, ...).
    Uint { ty: String, value: u64 },
    /// A struct: its fields in declaration order.
    Struct {
        ty: String,
        fields: Vec<(String, GoValue)>,
    },
    /// A map; `None` is a nil map. Entries are printed sorted by key, as spew's `SortKeys`
    /// does (strings bytewise, integers numerically).
    Map {
        ty: String,
        entries: Option<Vec<(GoValue, GoValue)>>,
    },
    /// A slice; `None` is a nil slice.
    Slice {
        ty: String,
        items: Option<Vec<GoValue>>,
    },
    /// A pointer to a value of type `ty` (`ty` without the `*`); `None` is a nil pointer.
    Ptr {
        ty: String,
        target: Option<Box<GoValue>>,
    },
}

impl GoValue {
    /// A `string`.
    pub fn string(value: impl Into<String>) -> Self {
        Self::Str {
            ty: "string".to_owned(),
            value: value.into(),
        }
    }

    /// A value of a named string type (`v1.ResourceName`).
    pub fn named_string(ty: &str, value: impl Into<String>) -> Self {
        Self::Str {
            ty: ty.to_owned(),
            value: value.into(),
        }
    }

    /// An `int`.
    pub fn int(value: i64) -> Self {
        Self::Int {
            ty: "int".to_owned(),
            value,
        }
    }

    /// A `uint64`.
    pub fn uint64(value: u64) -> Self {
        Self::Uint {
            ty: "uint64".to_owned(),
            value,
        }
    }

    /// A struct of type `ty`.
    pub fn structure(ty: &str, fields: Vec<(&str, GoValue)>) -> Self {
        Self::Struct {
            ty: ty.to_owned(),
            fields: fields.into_iter().map(|(n, v)| (n.to_owned(), v)).collect(),
        }
    }

    /// A map of type `ty` (`None`: nil).
    pub fn map(ty: &str, entries: Option<Vec<(GoValue, GoValue)>>) -> Self {
        Self::Map {
            ty: ty.to_owned(),
            entries,
        }
    }

    /// A slice of type `ty` (`None`: nil).
    pub fn slice(ty: &str, items: Option<Vec<GoValue>>) -> Self {
        Self::Slice {
            ty: ty.to_owned(),
            items,
        }
    }

    /// A pointer to a `ty` (`None`: nil).
    pub fn ptr(ty: &str, target: Option<GoValue>) -> Self {
        Self::Ptr {
            ty: ty.to_owned(),
            target: target.map(Box::new),
        }
    }

    fn type_name(&self) -> &str {
        match self {
            Self::Str { ty, .. }
            | Self::Int { ty, .. }
            | Self::Uint { ty, .. }
            | Self::Struct { ty, .. }
            | Self::Map { ty, .. }
            | Self::Slice { ty, .. }
            | Self::Ptr { ty, .. } => ty,
        }
    }

    /// What go-spew prints for this value with `%#v` (types shown, no pointer addresses).
    #[must_use]
    pub fn spew(&self) -> String {
        let mut printer = Spew {
            out: String::new(),
            ignore_next_type: false,
        };
        printer.format(self);
        printer.out
    }
}

/// go-spew's `formatState` for the `#` flag, reduced to the kinds [`GoValue`] has. The one
/// piece of state is spew's `ignoreNextType`, which decides whether the next value's type is
/// printed: map keys and values and slice elements are printed without their type, struct
/// fields with it, and a pointer seen through a map or slice prints `<*>` instead of its type.
struct Spew {
    out: String,
    ignore_next_type: bool,
}

impl Spew {
    fn format(&mut self, value: &GoValue) {
        if let GoValue::Ptr { ty, target } = value {
            self.format_ptr(ty, target.as_deref());
            return;
        }
        if !self.ignore_next_type {
            self.out.push('(');
            self.out.push_str(value.type_name());
            self.out.push(')');
        }
        self.ignore_next_type = false;
        match value {
            GoValue::Str { value, .. } => self.out.push_str(value),
            GoValue::Int { value, .. } => self.out.push_str(&value.to_string()),
            GoValue::Uint { value, .. } => self.out.push_str(&value.to_string()),
            GoValue::Slice { items: None, .. } | GoValue::Map { entries: None, .. } => {
                self.out.push_str("<nil>");
            }
            GoValue::Slice {
                items: Some(items), ..
            } => {
                self.out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        self.out.push(' ');
                    }
                    self.ignore_next_type = true;
                    self.format(item);
                }
                self.out.push(']');
            }
            GoValue::Map {
                entries: Some(entries),
                ..
            } => {
                let mut sorted: Vec<&(GoValue, GoValue)> = entries.iter().collect();
                sorted.sort_by(|a, b| key_order(&a.0, &b.0));
                self.out.push_str("map[");
                for (i, (k, v)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        self.out.push(' ');
                    }
                    self.ignore_next_type = true;
                    self.format(k);
                    self.out.push(':');
                    self.ignore_next_type = true;
                    self.format(v);
                }
                self.out.push(']');
            }
            GoValue::Struct { fields, .. } => {
                self.out.push('{');
                for (i, (name, field)) in fields.iter().enumerate() {
                    if i > 0 {
                        self.out.push(' ');
                    }
                    self.out.push_str(name);
                    self.out.push(':');
                    self.format(field);
                }
                self.out.push('}');
            }
            GoValue::Ptr { .. } => {}
        }
    }

    fn format_ptr(&mut self, ty: &str, target: Option<&GoValue>) {
        match target {
            // spew prints a nil pointer as `<nil>` when types are not shown, and leaves
            // `ignoreNextType` as it was.
            None if self.ignore_next_type => self.out.push_str("<nil>"),
            None => {
                self.out.push_str("(*");
                self.out.push_str(ty);
                self.out.push_str(")<nil>");
            }
            Some(target) => {
                if self.ignore_next_type {
                    self.out.push_str("<*>");
                } else {
                    self.out.push_str("(*");
                    self.out.push_str(ty);
                    self.out.push(')');
                }
                self.ignore_next_type = true;
                self.format(target);
            }
        }
    }
}

/// spew's `SortKeys` order for the key kinds checkpoints use.
fn key_order(a: &GoValue, b: &GoValue) -> std::cmp::Ordering {
    match (a, b) {
        (GoValue::Int { value: x, .. }, GoValue::Int { value: y, .. }) => x.cmp(y),
        (GoValue::Uint { value: x, .. }, GoValue::Uint { value: y, .. }) => x.cmp(y),
        (GoValue::Str { value: x, .. }, GoValue::Str { value: y, .. }) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        _ => a.spew().cmp(&b.spew()),
    }
}

/// 32-bit FNV-1a (Go's `hash/fnv.New32a`).
#[must_use]
pub fn fnv1a32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes.iter().fold(OFFSET_BASIS, |hash, &b| {
        (hash ^ u32::from(b)).wrapping_mul(PRIME)
    })
}

/// kubelet's `checksum.New(value)`: FNV-1a over spew's `%#v` text, widened to the `uint64`
/// stored in the file.
#[must_use]
pub fn kubelet_checksum(value: &GoValue) -> u64 {
    u64::from(fnv1a32(value.spew().as_bytes()))
}

/// kubelet's checksum of a string (`checksum.New(cp.Data)` for the `data` field of the newest
/// checkpoint formats): spew prints a top-level string as `(string)` followed by the text.
#[must_use]
pub fn kubelet_string_checksum(data: &str) -> u64 {
    kubelet_checksum(&GoValue::string(data))
}

/// Why a checkpoint could not be used; the `reason` label of
/// `qosd_checkpoint_recoveries_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecoveryReason {
    /// No checkpoint file (first start, or deleted).
    Missing,
    /// Unreadable: not JSON, wrong shape, unparsable CPU list, unsupported old format.
    Corrupt,
    /// Well-formed, but the checksum does not match the content.
    Checksum,
    /// Written under another policy than the configured one.
    PolicyChanged,
    /// Valid and verified, but it does not fit this machine or configuration (CPUs or NUMA
    /// nodes that no longer exist, reserved CPUs handed out, overlapping assignments, memory
    /// totals that changed).
    Invalid,
}

impl RecoveryReason {
    /// Every reason, for pre-creating metric series.
    pub const ALL: [Self; 5] = [
        Self::Missing,
        Self::Corrupt,
        Self::Checksum,
        Self::PolicyChanged,
        Self::Invalid,
    ];

    /// The metric label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Missing => "missing",
            Self::Corrupt => "corrupt",
            Self::Checksum => "checksum",
            Self::PolicyChanged => "policy_changed",
            Self::Invalid => "invalid",
        }
    }
}

impl fmt::Display for RecoveryReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A checkpoint that was not restored, and why. The manager that returns it starts from an
/// empty state; the caller rebuilds from cgroupfs, counts and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// The checkpoint file.
    pub path: PathBuf,
    pub reason: RecoveryReason,
    /// What exactly was wrong, in kubelet's words where kubelet has them.
    pub detail: String,
}

impl fmt::Display for Recovery {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "checkpoint {} not restored ({}): {}",
            self.path.display(),
            self.reason,
            self.detail
        )
    }
}

/// The outcome of decoding a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub enum Restored<T> {
    /// The file was read, verified and fits: its state.
    State(T),
    /// The file could not be used: why (the path is filled in by the manager).
    Rebuild {
        reason: RecoveryReason,
        detail: String,
    },
}

/// Reads a checkpoint file; `None` when it does not exist. Temporary files that a writer
/// killed mid-write left beside it (see [`write_atomic`]) are removed first: at start nobody
/// else is writing.
pub fn read_checkpoint(path: &Path) -> Result<Option<Vec<u8>>, CheckpointError> {
    remove_temporaries(path);
    match fs::read(path) {
        Ok(bytes) => Ok(Some(bytes)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(CheckpointError::Io {
            op: "reading",
            path: path.to_owned(),
            source,
        }),
    }
}

/// The prefix of [`write_atomic`]'s temporary files for `path`.
fn temporary_prefix(path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "checkpoint".to_owned());
    format!(".{name}.tmp-")
}

fn remove_temporaries(path: &Path) {
    let (Some(dir), prefix) = (path.parent(), temporary_prefix(path)) else {
        return;
    };
    let Ok(entries) = fs::read_dir(if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    }) else {
        return;
    };
    for entry in entries.flatten() {
        if entry.file_name().to_string_lossy().starts_with(&prefix) {
            match fs::remove_file(entry.path()) {
                Ok(()) => {
                    tracing::info!(file = %entry.path().display(), "removed the temporary file of an interrupted checkpoint write");
                }
                Err(e) => {
                    tracing::warn!(file = %entry.path().display(), error = %e, "cannot remove a stale temporary checkpoint file");
                }
            }
        }
    }
}

/// Distinguishes temporary files of concurrent writers in one process.
static TMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Where a manager keeps its checkpoint, and whether the file lags behind the manager's
/// state because the last write failed (the next change, or [`CheckpointFile::write`],
/// retries).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointFile {
    path: Option<PathBuf>,
    dirty: bool,
}

impl CheckpointFile {
    /// `file_name` in `state_dir`; without a state directory nothing is ever written.
    #[must_use]
    pub fn new(state_dir: Option<&Path>, file_name: &str) -> Self {
        Self {
            path: state_dir.map(|d| d.join(file_name)),
            dirty: false,
        }
    }

    /// The checkpoint's path, if there is one.
    #[must_use]
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// True while the file does not hold the latest state.
    #[must_use]
    pub fn is_dirty(&self) -> bool {
        self.dirty
    }

    /// Writes what `encode` produces, atomically (no-op without a path).
    pub fn write(
        &mut self,
        encode: impl FnOnce() -> Result<Vec<u8>, serde_json::Error>,
    ) -> Result<(), CheckpointError> {
        let Some(path) = &self.path else {
            return Ok(());
        };
        let bytes = encode().map_err(|source| CheckpointError::Encode {
            path: path.clone(),
            source,
        })?;
        write_atomic(path, &bytes)?;
        self.dirty = false;
        Ok(())
    }

    /// [`CheckpointFile::write`]; a failure is logged for `manager` and left for a retry.
    pub fn write_or_mark(
        &mut self,
        manager: &str,
        encode: impl FnOnce() -> Result<Vec<u8>, serde_json::Error>,
    ) {
        if let Err(e) = self.write(encode) {
            tracing::warn!(manager, error = %e, "checkpoint not written; will retry");
            self.dirty = true;
        }
    }
}

/// Writes `contents` to `path` so that a crash at any point leaves either the previous file or
/// the new one: the directory is created if needed, the data goes to a temporary file in the
/// same directory which is fsynced, renamed over `path`, and the directory is fsynced so the
/// rename itself is durable. The temporary file is removed on failure.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), CheckpointError> {
    let io_err = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| CheckpointError::Io { op, path, source }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    // State and checkpoints are qosd's alone: a directory it makes is 0700, a file 0600.
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_err("creating the directory of", path))?;
    let tmp = dir.join(format!(
        "{}{}-{}",
        temporary_prefix(path),
        std::process::id(),
        TMP_COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let result = write_synced(&tmp, contents)
        .map_err(io_err("writing", &tmp))
        .and_then(|()| fs::rename(&tmp, path).map_err(io_err("renaming into", path)));
    if let Err(e) = result {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("syncing the directory of", path))
}

fn write_synced(tmp: &Path, contents: &[u8]) -> io::Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(tmp)?;
    file.write_all(contents)?;
    file.sync_all()
}

/// Looks up a JSON object member the way Go's `encoding/json` matches struct fields: the exact
/// name first, else a case-insensitive match (kubelet writes `defaultCpuSet`; its tests, and
/// therefore some files, spell it `defaultCPUSet`).
pub(crate) fn json_field<'a>(
    object: &'a serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Option<&'a serde_json::Value> {
    object.get(name).or_else(|| {
        object
            .iter()
            .find(|(k, _)| k.to_lowercase() == name.to_lowercase())
            .map(|(_, v)| v)
    })
}

/// Reads the `checksum`-like unsigned integer member `name` (absent or `null`: 0, as Go leaves
/// the zero value).
pub(crate) fn json_u64(
    object: &serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<u64, ShapeError> {
    match json_field(object, name) {
        None | Some(serde_json::Value::Null) => Ok(0),
        Some(v) => v
            .as_u64()
            .ok_or_else(|| ShapeError::wrong(format!("field {name:?}"), v, "an unsigned integer")),
    }
}

/// Reads the string member `name` (absent or `null`: empty).
pub(crate) fn json_string(
    object: &serde_json::Map<String, serde_json::Value>,
    name: &str,
) -> Result<String, ShapeError> {
    match json_field(object, name) {
        None | Some(serde_json::Value::Null) => Ok(String::new()),
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(v) => Err(ShapeError::wrong(format!("field {name:?}"), v, "a string")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a32_matches_the_reference_vectors() {
        // Vectors from the FNV reference test suite (http://www.isthe.com/chongo/tech/comp/fnv/).
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn spew_prints_types_at_the_top_and_in_struct_fields_but_not_in_maps() {
        let value = GoValue::ptr(
            "state.T",
            Some(GoValue::structure(
                "state.T",
                vec![
                    ("Name", GoValue::string("x")),
                    (
                        "M",
                        GoValue::map(
                            "map[string][]int",
                            Some(vec![
                                (
                                    GoValue::string("b"),
                                    GoValue::slice("[]int", Some(vec![GoValue::int(2)])),
                                ),
                                (GoValue::string("a"), GoValue::slice("[]int", None)),
                            ]),
                        ),
                    ),
                    ("N", GoValue::map("map[int]string", None)),
                    (
                        "C",
                        GoValue::Uint {
                            ty: "checksum.Checksum".into(),
                            value: 0,
                        },
                    ),
                ],
            )),
        );
        assert_eq!(
            value.spew(),
            "(*state.T){Name:(string)x M:(map[string][]int)map[a:<nil> b:[2]] \
             N:(map[int]string)<nil> C:(checksum.Checksum)0}"
        );
    }

    #[test]
    fn spew_prints_pointers_inside_maps_as_anonymous_and_nil_pointers_as_nil() {
        let inner = GoValue::structure("state.S", vec![("V", GoValue::uint64(7))]);
        let map = GoValue::map(
            "map[int]*state.S",
            Some(vec![
                (GoValue::int(10), GoValue::ptr("state.S", Some(inner))),
                (GoValue::int(2), GoValue::ptr("state.S", None)),
            ]),
        );
        // Integer keys sort numerically (2 before 10).
        assert_eq!(
            map.spew(),
            "(map[int]*state.S)map[2:<nil> 10:<*>{V:(uint64)7}]"
        );
        assert_eq!(
            GoValue::ptr("state.S", None).spew(),
            "(*state.S)<nil>",
            "a nil top-level pointer shows its type"
        );
    }

    #[test]
    fn a_nil_pointer_in_a_map_leaves_the_next_field_untyped_as_spew_does() {
        let value = GoValue::structure(
            "T",
            vec![
                (
                    "M",
                    GoValue::map(
                        "map[string]*S",
                        Some(vec![(GoValue::string("k"), GoValue::ptr("S", None))]),
                    ),
                ),
                ("N", GoValue::int(1)),
            ],
        );
        assert_eq!(value.spew(), "(T){M:(map[string]*S)map[k:<nil>] N:1}");
    }

    #[test]
    fn string_checksum_matches_kubelet_v4_data_checksums() {
        // `dataChecksum` values from kubelet's pkg/kubelet/cm/cpumanager/state/
        // state_checkpoint_test.go (TestCheckpointStateRestore, "Restore default CPU set" and
        // "Restore valid checkpoint ..." v4 rows).
        assert_eq!(
            kubelet_string_checksum(r#"{"policyName":"none","defaultCPUSet":"4-6"}"#),
            657_950_972
        );
        assert_eq!(
            kubelet_string_checksum(
                r#"{"policyName":"static","defaultCPUSet":"7-9","entries":{"pod":{"container1":"4-6","container2":"1-3"}}}"#
            ),
            1_420_829_534
        );
    }

    #[test]
    fn write_atomic_replaces_the_file_and_leaves_no_temporary_behind() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("cpu_manager_state");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("cpu_manager_state")]);
    }

    /// Set in the child process of the kill test: it writes checkpoints into this file until
    /// it is killed.
    const WRITER_ENV: &str = "QOSD_TEST_CHECKPOINT_WRITER";

    /// Two checkpoint versions, large enough (256 KiB) that a kill often lands mid-write.
    fn version(which: u8) -> Vec<u8> {
        vec![b'a' + which; 256 << 10]
    }

    #[test]
    fn a_writer_killed_at_any_instant_leaves_the_old_or_the_new_file() {
        if let Ok(target) = std::env::var(WRITER_ENV) {
            // The child: write the two versions in turn until SIGKILL.
            let target = PathBuf::from(target);
            for i in 0u64.. {
                write_atomic(&target, &version(u8::from(i % 2 == 1))).unwrap();
            }
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cpu_manager_state");
        let exe = std::env::current_exe().unwrap();
        let (mut seed, mut interrupted, mut existed) = (0x9e37_79b9_7f4a_7c15u64, 0, false);
        for round in 0..40 {
            let mut child = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "cm::checkpoint::tests::a_writer_killed_at_any_instant_leaves_the_old_or_the_new_file",
                    "--test-threads=1",
                ])
                .env(WRITER_ENV, &path)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap();
            // A pseudo-random instant in the writer's life: 5 to 45 ms.
            seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            std::thread::sleep(std::time::Duration::from_millis(5 + (seed >> 33) % 40));
            child.kill().unwrap();
            child.wait().unwrap();
            let left_temporary = fs::read_dir(dir.path())
                .unwrap()
                .any(|e| e.unwrap().file_name().to_string_lossy().starts_with('.'));
            interrupted += usize::from(left_temporary);
            match read_checkpoint(&path).unwrap() {
                Some(bytes) => {
                    existed = true;
                    assert!(
                        bytes == version(0) || bytes == version(1),
                        "round {round}: a torn checkpoint of {} bytes",
                        bytes.len()
                    );
                }
                // Killed before its first rename (the process was still starting up); once
                // written, the file must never disappear.
                None => assert!(!existed, "round {round}: the checkpoint vanished"),
            }
            let names: Vec<_> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            assert!(
                names.iter().all(|n| n == "cpu_manager_state"),
                "round {round}: temporaries not cleaned up at read: {names:?}"
            );
        }
        // The test is only meaningful if some kills landed inside a write.
        assert!(interrupted > 0, "no kill interrupted a write in 40 rounds");
    }

    #[test]
    fn write_atomic_reports_the_path_when_it_cannot_write() {
        let dir = tempfile::tempdir().unwrap();
        // A regular file where the directory should be.
        let blocker = dir.path().join("blocker");
        fs::write(&blocker, b"x").unwrap();
        let err = write_atomic(&blocker.join("state"), b"x").unwrap_err();
        assert!(err.to_string().contains("blocker"), "{err}");
    }

    #[test]
    fn read_checkpoint_distinguishes_missing_from_present() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state");
        assert_eq!(read_checkpoint(&path).unwrap(), None);
        fs::write(&path, b"{}").unwrap();
        assert_eq!(read_checkpoint(&path).unwrap(), Some(b"{}".to_vec()));
    }

    #[test]
    fn json_field_falls_back_to_a_case_insensitive_match() {
        let v: serde_json::Value =
            serde_json::from_str(r#"{"defaultCPUSet":"1-3","checksum":5}"#).unwrap();
        let o = v.as_object().unwrap();
        assert_eq!(json_string(o, "defaultCpuSet").unwrap(), "1-3");
        assert_eq!(json_u64(o, "checksum").unwrap(), 5);
        assert_eq!(json_u64(o, "missing").unwrap(), 0);
        assert!(json_u64(o, "defaultCpuSet").is_err());
    }

    /// State is qosd's alone: the file 0600, a directory it makes 0700.
    #[test]
    fn state_files_and_directories_are_private() {
        use std::os::unix::fs::PermissionsExt as _;
        let root = tempfile::tempdir().expect("tempdir");
        let path = root.path().join("state/sub/cpu_manager_state");
        write_atomic(&path, b"{}").expect("write");
        let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(&root.path().join("state")), 0o700);
        assert_eq!(mode(&root.path().join("state/sub")), 0o700);
    }
}
