//! One writer by construction, checked in the source: only the cgroup layer
//! (`agent/src/cgroup/`) and the container manager (`agent/src/cm/manager*`) may use a
//! primitive that writes a file, makes or removes a directory or signals a process. Anywhere
//! else such a primitive must be listed in [`ALLOWED`] with what it writes (never a cgroup),
//! and a listed file may not name a cgroup control file in a string literal. Test code (after
//! `#[cfg(test)]`, `tests.rs`, `testing.rs`) is not production code and is not scanned.
//!
//! A new write anywhere else fails `production_code_writes_cgroups_only_through_the_writer`
//! with the file, line and primitive.
use std::path::{Path, PathBuf};

/// Text that writes, creates, removes or signals.
const WRITE_PRIMITIVES: &[&str] = &[
    "OpenOptions",
    "fs::write(",
    "File::create(",
    "O_WRONLY",
    "O_RDWR",
    ".write(true)",
    ".append(true)",
    "create_dir",
    "DirBuilder",
    "remove_dir",
    "remove_file(",
    "libc::write(",
    "libc::kill(",
    "libc::mount(",
    "rename(",
];

/// Where the writer lives (paths relative to `agent/src`, prefixes).
const WRITER: &[&str] = &["cgroup/", "cm/manager"];

/// Writes elsewhere that are not cgroup writes: (file, primitive, what it writes).
const ALLOWED: &[(&str, &str, &str)] = &[
    (
        "cm/checkpoint.rs",
        "OpenOptions",
        "checkpoint files in the state directory",
    ),
    (
        "cm/checkpoint.rs",
        ".write(true)",
        "checkpoint files in the state directory",
    ),
    (
        "cm/checkpoint.rs",
        "DirBuilder",
        "the state directory (0700)",
    ),
    (
        "cm/checkpoint.rs",
        "rename(",
        "a checkpoint's temporary file onto the checkpoint",
    ),
    (
        "cm/checkpoint.rs",
        "remove_file(",
        "a checkpoint's temporary file after a failed write",
    ),
    ("runtime/process.rs", "OpenOptions", "container log files"),
    ("runtime/process.rs", ".append(true)", "container log files"),
    (
        "runtime/process.rs",
        "create_dir",
        "the log directory of a container",
    ),
    (
        "runtime/process.rs",
        "libc::write(",
        "\"0\" to the cgroup.procs descriptors the cgroup backend opened (CgroupJoin), and the pid and go-ahead bytes of the placement handshake's pipes",
    ),
    (
        "runtime/process.rs",
        "libc::kill(",
        "stop signals to a container's own process group",
    ),
    (
        "probes/numa.rs",
        "libc::mount(",
        "tracefs, when none is mounted",
    ),
];

/// cgroup control file names that a non-writer file must not spell in a string literal.
const CGROUP_FILE_LITERALS: &[&str] = &[
    "\"cgroup.procs\"",
    "\"cgroup.subtree_control\"",
    "\"cpu.max\"",
    "\"cpu.weight\"",
    "\"cpu.shares\"",
    "\"cpu.cfs_quota_us\"",
    "\"cpu.cfs_burst_us\"",
    "\"cpu.max.burst\"",
    "\"cpu.idle\"",
    "\"cpuset.cpus\"",
    "\"cpuset.mems\"",
    "\"memory.max\"",
    "\"memory.min\"",
    "\"memory.limit_in_bytes\"",
    "\"pids.max\"",
];

#[derive(Debug, PartialEq, Eq)]
struct Finding {
    file: String,
    line: usize,
    what: String,
}

/// The production part of a source file: everything before its first `#[cfg(test)]`.
fn production_part(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.lines()
        .enumerate()
        .take_while(|(_, l)| l.trim() != "#[cfg(test)]")
        .map(|(i, l)| (i + 1, l))
        .filter(|(_, l)| !l.trim_start().starts_with("//"))
}

/// Findings for one file (`relative` to `agent/src`).
fn check_file(relative: &str, text: &str) -> Vec<Finding> {
    let name = relative.rsplit('/').next().unwrap_or(relative);
    if WRITER.iter().any(|w| relative.starts_with(w))
        || name == "tests.rs"
        || name == "testing.rs"
        || relative.contains("/tests/")
    {
        return Vec::new();
    }
    let mut findings = Vec::new();
    let listed = ALLOWED.iter().any(|(file, _, _)| *file == relative);
    for (line, code) in production_part(text) {
        for primitive in WRITE_PRIMITIVES {
            if code.contains(primitive)
                && !ALLOWED
                    .iter()
                    .any(|(file, p, _)| *file == relative && p == primitive)
            {
                findings.push(Finding {
                    file: relative.to_owned(),
                    line,
                    what: format!("writes with {primitive} outside the cgroup writer"),
                });
            }
        }
        if listed {
            for literal in CGROUP_FILE_LITERALS {
                if code.contains(literal) {
                    findings.push(Finding {
                        file: relative.to_owned(),
                        line,
                        what: format!("names the cgroup file {literal} in a file that writes"),
                    });
                }
            }
        }
    }
    findings
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            sources(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[test]
fn production_code_writes_cgroups_only_through_the_writer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files).expect("agent/src is readable");
    assert!(files.len() > 50, "found only {} source files", files.len());
    let mut findings = Vec::new();
    let mut used = vec![false; ALLOWED.len()];
    for path in &files {
        let relative = path
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .into_owned();
        let text = std::fs::read_to_string(path).expect("readable source");
        findings.extend(check_file(&relative, &text));
        for (i, (file, primitive, _)) in ALLOWED.iter().enumerate() {
            if *file == relative && production_part(&text).any(|(_, l)| l.contains(primitive)) {
                used[i] = true;
            }
        }
    }
    let stale: Vec<_> = ALLOWED
        .iter()
        .zip(&used)
        .filter(|(_, used)| !**used)
        .map(|(entry, _)| entry)
        .collect();
    assert!(
        stale.is_empty(),
        "allowed writes no longer in the code (remove them from ALLOWED): {stale:?}"
    );
    assert!(
        findings.is_empty(),
        "cgroup files may be written only by agent/src/cgroup/ and the container manager; \
         found:\n{}",
        findings
            .iter()
            .map(|f| format!("  agent/src/{}:{}: {}", f.file, f.line, f.what))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!(
        "one writer: {} source files scanned, {} allowed non-cgroup writes, 0 findings",
        files.len(),
        ALLOWED.len()
    );
}

#[test]
fn a_cgroup_write_in_a_reader_is_found() {
    let feedback = "use std::io::Write;\n\
        fn intervene(dir: &Path) {\n\
            std::fs::OpenOptions::new().write(true).open(dir.join(\"cpu.max\")).unwrap();\n\
        }\n";
    let found = check_file("feedback/burst.rs", feedback);
    assert_eq!(found.len(), 2, "{found:?}");
    assert!(found.iter().all(|f| f.line == 3), "{found:?}");

    let metrics = "fn f() { std::fs::write(\"/sys/fs/cgroup/x/cpu.weight\", \"1\"); }\n";
    assert_eq!(check_file("metrics/numa.rs", metrics).len(), 1);

    // An allowed writer that starts naming cgroup files is found too.
    let process = "fn join() { let p = dir.join(\"cgroup.procs\"); }\n";
    let found = check_file("runtime/process.rs", process);
    assert_eq!(found.len(), 1, "{found:?}");
    assert!(found[0].what.contains("cgroup.procs"));

    // The writer itself, test modules and comments are not findings.
    assert!(check_file("cgroup/cgroupfs.rs", metrics).is_empty());
    assert!(check_file("cm/manager/lifecycle.rs", metrics).is_empty());
    let test_only =
        "fn a() {}\n#[cfg(test)]\nmod tests { fn t() { std::fs::write(\"x\", \"\"); } }\n";
    assert!(check_file("metrics/numa.rs", test_only).is_empty());
    let comment = "// std::fs::write would be wrong here\nfn a() {}\n";
    assert!(check_file("metrics/numa.rs", comment).is_empty());
}
