//! The guest's root file system, built as a directory tree in the work directory and packed
//! with `cpio -H newc` (uncompressed: the kernel takes it as is, and TCG decompresses slowly).
//!
//! It holds busybox with a link for every applet, `/init` (see `init.sh`), the command in
//! `/etc/qosd/command`, each payload file at its guest path, and, for dynamically linked ELF
//! files, the shared libraries and ELF interpreter that `ldd` lists, at the same paths as on
//! the host. Libraries a program `dlopen`s are not discovered; put them in the payload.

use std::collections::BTreeSet;
use std::fs;
use std::io::Read;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, Result, bail};

/// The host's busybox (Debian's busybox-static installs it here).
const BUSYBOX: &str = "/bin/busybox";
/// The guest's init script.
const INIT_SCRIPT: &str = include_str!("init.sh");
/// Where `/init` reads the command to run, relative to the root.
const COMMAND_FILE: &str = "etc/qosd/command";
/// Directories every guest has, relative to the root.
const SKELETON: [&str; 14] = [
    "bin", "sbin", "usr/bin", "usr/sbin", "lib", "lib64", "etc/qosd", "proc", "sys", "dev", "tmp",
    "run", "root", "var",
];

/// Builds the initramfs for one run and returns the archive's path.
pub(super) fn build(
    work_dir: &Path,
    name: &str,
    payload: &[(PathBuf, String)],
    command: &str,
    systemd: bool,
) -> Result<PathBuf> {
    let root = work_dir.join(format!("{name}-root"));
    reset_dir(&root)?;
    for dir in SKELETON {
        create_dir(&root.join(dir))?;
    }
    install_busybox(&root)?;
    for (host, guest) in payload {
        install_with_libraries(&root, host, guest)?;
    }
    if systemd {
        super::systemd_guest::install(&root)?;
    }
    write_file(&root.join("init"), INIT_SCRIPT, 0o755)?;
    write_file(&root.join(COMMAND_FILE), command, 0o644)?;
    let archive = work_dir.join(format!("{name}-initramfs.cpio"));
    pack(&root, &archive)?;
    Ok(archive)
}

/// Empties `dir` (left over from an earlier run) and creates it again.
fn reset_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    create_dir(dir)
}

fn create_dir(dir: &Path) -> Result<()> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))
}

fn write_file(path: &Path, contents: &str, mode: u32) -> Result<()> {
    fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .with_context(|| format!("setting the mode of {}", path.display()))
}

/// Writes `contents` at `guest` in the tree (its directories made), with `mode`.
pub(super) fn write_guest_file(root: &Path, guest: &str, contents: &str, mode: u32) -> Result<()> {
    let path = guest_path(root, guest)?;
    create_parent(&path)?;
    write_file(&path, contents, mode)
}

/// Copies one host file (not a program: no libraries looked for) to `guest` in the tree.
pub(super) fn install_file_as_is(root: &Path, host: &Path, guest: &str) -> Result<()> {
    install_file(root, host, guest)
}

/// Copies busybox to `/bin/busybox` and links every applet it lists to it.
fn install_busybox(root: &Path) -> Result<()> {
    let busybox = Path::new(BUSYBOX);
    if !busybox.is_file() {
        bail!("{BUSYBOX} is missing; install it with `apt-get install busybox-static`");
    }
    install_with_libraries(root, busybox, BUSYBOX)?;
    let list = run_for_stdout(Command::new(BUSYBOX).arg("--list-full"))?;
    for applet in list.lines().map(str::trim).filter(|a| !a.is_empty()) {
        let link =
            guest_path(root, applet).with_context(|| format!("busybox applet path {applet:?}"))?;
        if link.symlink_metadata().is_ok() {
            continue;
        }
        create_parent(&link)?;
        symlink(BUSYBOX, &link).with_context(|| format!("linking {}", link.display()))?;
    }
    Ok(())
}

/// Copies `host` to `guest` in the tree, plus its shared libraries when it is dynamically linked.
/// Also builds the root file system of `cargo xtask image`.
pub(crate) fn install_with_libraries(root: &Path, host: &Path, guest: &str) -> Result<()> {
    install_file(root, host, guest)?;
    for library in shared_libraries(host)? {
        let guest_library = library.to_string_lossy().into_owned();
        install_file(root, &library, &guest_library)
            .with_context(|| format!("copying a library that {} needs", host.display()))?;
    }
    Ok(())
}

/// Copies one host file (following symlinks) to its guest path, replacing whatever is there,
/// such as a busybox applet link of the same name.
fn install_file(root: &Path, host: &Path, guest: &str) -> Result<()> {
    if !host.is_file() {
        bail!("payload {} is not a file", host.display());
    }
    let target = guest_path(root, guest)
        .with_context(|| format!("guest path {guest:?} for {}", host.display()))?;
    create_parent(&target)?;
    if target.symlink_metadata().is_ok() {
        // Never copy through a symlink: it would overwrite the file the link points to.
        fs::remove_file(&target).with_context(|| format!("replacing {}", target.display()))?;
    }
    fs::copy(host, &target)
        .with_context(|| format!("copying {} to {}", host.display(), target.display()))?;
    Ok(())
}

/// Maps a guest path to its place under `root`; paths without a leading `/` (as busybox lists
/// its applets) are taken from the guest's root. Rejects `..`, which could leave the tree.
fn guest_path(root: &Path, guest: &str) -> Result<PathBuf> {
    let mut path = root.to_path_buf();
    for component in Path::new(guest).components() {
        match component {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(part) => path.push(part),
            Component::ParentDir | Component::Prefix(_) => {
                bail!("guest path {guest:?} must not contain `..`")
            }
        }
    }
    if path == root {
        bail!("guest path {guest:?} names the root directory");
    }
    Ok(path)
}

fn create_parent(path: &Path) -> Result<()> {
    match path.parent() {
        Some(parent) => create_dir(parent),
        None => Ok(()),
    }
}

/// The shared libraries and ELF interpreter of a dynamically linked ELF file (empty for
/// static binaries and non-ELF files such as scripts).
fn shared_libraries(file: &Path) -> Result<BTreeSet<PathBuf>> {
    if !is_elf(file)? {
        return Ok(BTreeSet::new());
    }
    let output = Command::new("ldd")
        .arg(file)
        .output()
        .with_context(|| format!("running ldd {}", file.display()))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() {
        if stderr.contains("not a dynamic executable") {
            return Ok(BTreeSet::new());
        }
        bail!(
            "ldd {} failed ({}): {}",
            file.display(),
            output.status,
            stderr.trim()
        );
    }
    let mut libraries = BTreeSet::new();
    for line in stdout.lines() {
        match parse_ldd_line(line) {
            LddLine::Library(path) => {
                libraries.insert(path);
            }
            LddLine::NotFound(name) => {
                bail!(
                    "ldd {}: library {name} not found on the host",
                    file.display()
                )
            }
            LddLine::Other => {}
        }
    }
    Ok(libraries)
}

fn is_elf(file: &Path) -> Result<bool> {
    let mut magic = [0_u8; 4];
    let mut handle = fs::File::open(file).with_context(|| format!("opening {}", file.display()))?;
    match handle.read_exact(&mut magic) {
        Ok(()) => Ok(&magic == b"\x7fELF"),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.display())),
    }
}

/// One line of `ldd` output.
#[derive(Debug, PartialEq, Eq)]
enum LddLine {
    /// `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or `/lib64/ld-linux-x86-64.so.2 (0x...)`.
    Library(PathBuf),
    /// `libfoo.so.1 => not found`.
    NotFound(String),
    /// The vDSO, `statically linked`, and anything else without a path.
    Other,
}

fn parse_ldd_line(line: &str) -> LddLine {
    let line = line.trim();
    let (name, location) = match line.split_once("=>") {
        Some((name, location)) => (name.trim(), location.trim()),
        None => ("", line),
    };
    if location.starts_with("not found") {
        return LddLine::NotFound(name.to_owned());
    }
    match location.split_whitespace().next() {
        Some(path) if path.starts_with('/') => LddLine::Library(PathBuf::from(path)),
        _ => LddLine::Other,
    }
}

/// Packs the tree at `root` into a newc cpio archive owned by root:root: `find . | cpio -o`.
fn pack(root: &Path, archive: &Path) -> Result<()> {
    let out = fs::File::create(archive)
        .with_context(|| format!("creating initramfs {}", archive.display()))?;
    let mut find = Command::new("find")
        .arg(".")
        .current_dir(root)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("running find in {}", root.display()))?;
    let Some(list) = find.stdout.take() else {
        bail!("find in {} has no stdout pipe", root.display());
    };
    let cpio = Command::new("cpio")
        .args(["--create", "--format=newc", "--owner=0:0", "--quiet"])
        .current_dir(root)
        .stdin(list)
        .stdout(out)
        .status()
        .context("running cpio (apt-get install cpio)");
    let find_status = find.wait().context("waiting for find")?;
    let cpio_status = cpio?;
    if !find_status.success() || !cpio_status.success() {
        bail!(
            "packing {} into {} failed: find {find_status}, cpio {cpio_status}",
            root.display(),
            archive.display()
        );
    }
    Ok(())
}

/// Runs a command and returns its stdout, failing with its stderr when it fails.
fn run_for_stdout(command: &mut Command) -> Result<String> {
    let output = command
        .output()
        .with_context(|| format!("running {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_lines() {
        let lib = "\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f)";
        assert_eq!(
            parse_ldd_line(lib),
            LddLine::Library(PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6"))
        );
        let interp = "\t/lib64/ld-linux-x86-64.so.2 (0x00007f)";
        assert_eq!(
            parse_ldd_line(interp),
            LddLine::Library(PathBuf::from("/lib64/ld-linux-x86-64.so.2"))
        );
        assert_eq!(
            parse_ldd_line("\tlinux-vdso.so.1 (0x00007ffd)"),
            LddLine::Other
        );
        assert_eq!(
            parse_ldd_line("\tlibfoo.so.1 => not found"),
            LddLine::NotFound("libfoo.so.1".to_owned())
        );
    }

    #[test]
    fn guest_paths_stay_under_the_root() {
        let root = Path::new("/w/root");
        assert!(guest_path(root, "/bin/qosd").is_ok_and(|p| p == Path::new("/w/root/bin/qosd")));
        assert!(
            guest_path(root, "usr/bin/env").is_ok_and(|p| p == Path::new("/w/root/usr/bin/env"))
        );
        assert!(guest_path(root, "/bin/../../etc/passwd").is_err());
        assert!(guest_path(root, "/").is_err());
    }
}
