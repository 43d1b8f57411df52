//! Guest VMs for the kernels the host cannot give.
//!
//! The VM harness owns everything between "run this command on kernel X" and "here is what the
//! guest printed and how it ended":
//!
//! - [`apt`]: a private apt configuration under the cache, never touching the host's;
//! - [`kernels`]: fetching Debian cloud kernels (5.10, 6.1, 6.12) into the cache with a private
//!   apt setup, and reading a kernel image's release string;
//! - [`initramfs`]: the guest's root file system (busybox, `/init`, payload files and their
//!   shared libraries) packed as a newc cpio archive (copying a program with its shared
//!   libraries also serves `cargo xtask image`);
//! - [`qemu`]: booting the guest under TCG with two NUMA nodes, capturing the serial console and
//!   classifying how the run ended.
//!
//! The cache layout (`$QOSD_CACHE`, default `$HOME/.cache/qosd`):
//! `apt/` (private apt configuration, indexes and downloads) and `kernels/<series>/vmlinuz`.
//! Per-run products (initramfs trees, console logs) go to [`work_dir`], in the target directory.
//! Delete `kernels/` to pick up newer kernel packages.

mod apt;
mod initramfs;
mod kernels;
mod qemu;
mod systemd_guest;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail};

pub(crate) use initramfs::install_with_libraries;
pub(crate) use kernels::ensure_kernels;

/// Environment variable that overrides the cache directory.
const CACHE_ENV: &str = "QOSD_CACHE";

/// One bootable guest kernel from the cache.
#[derive(Debug, Clone)]
pub(crate) struct GuestKernel {
    /// Kernel series: "5.10", "6.1" or "6.12".
    pub series: String,
    /// The kernel release (`uname -r` in the guest), e.g. "6.1.0-41-cloud-amd64".
    pub release: String,
    /// The compressed kernel image handed to qemu's `-kernel`.
    pub vmlinuz: PathBuf,
}

/// How a guest run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GuestExit {
    /// The command ran to completion; its exit status as reported by the guest's init.
    Exited(i32),
    /// The kernel panicked; the first line of the panic message.
    Panicked(String),
    /// No exit marker before the deadline; qemu was killed.
    TimedOut,
    /// qemu could not start, or stopped without the guest reporting anything; the details.
    QemuFailed(String),
}

/// The result of one guest run.
#[derive(Debug, Clone)]
pub(crate) struct GuestRun {
    /// Everything the guest printed on its serial console (`\r\n` normalised to `\n`).
    pub output: String,
    /// How the run ended.
    pub exit: GuestExit,
    /// Wall time from starting qemu to its exit (or to killing it).
    pub wall: Duration,
}

/// The cache directory: `$QOSD_CACHE` if set, else `$HOME/.cache/qosd`; created if missing.
pub(crate) fn cache_dir() -> Result<PathBuf> {
    let dir = match std::env::var_os(CACHE_ENV) {
        Some(dir) if !dir.is_empty() => PathBuf::from(dir),
        _ => {
            let Some(home) = std::env::var_os("HOME").filter(|h| !h.is_empty()) else {
                bail!("neither {CACHE_ENV} nor HOME is set; set {CACHE_ENV} to a cache directory");
            };
            PathBuf::from(home).join(".cache").join("qosd")
        }
    };
    std::fs::create_dir_all(&dir)
        .with_context(|| format!("creating cache directory {}", dir.display()))?;
    Ok(dir)
}

/// Where guest runs keep their initramfs trees and console logs: under Cargo's target
/// directory, so two checkouts (each with its own target directory) can boot the same kernel
/// series at the same time without sharing a work directory.
pub(crate) fn work_dir() -> PathBuf {
    crate::target_dir().join("vm-work")
}

/// What runs as PID 1 in a guest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GuestInit {
    /// `/init` (a shell script) mounts cgroup v2 and runs the command.
    Shell,
    /// systemd on cgroup v2 runs the command as a service once the system bus is up.
    Systemd,
    /// systemd on the hybrid layout (v1 controllers, cgroup2 for systemd's own tracking).
    SystemdHybrid,
}

impl GuestInit {
    fn suffix(self) -> &'static str {
        match self {
            Self::Shell => "",
            Self::Systemd => "-systemd",
            Self::SystemdHybrid => "-systemd-hybrid",
        }
    }
}

/// Boots `kernel` with an initramfs holding `payload` (host path, guest path) and runs `command`
/// with `/bin/sh -c` once the guest's file systems are mounted; under systemd ([`GuestInit`]),
/// systemd is PID 1 and runs it as a service once the system bus is up.
///
/// Build products go to `work_dir` (`<series>-root/`, `<series>-initramfs.cpio`) and the serial
/// console is streamed to `work_dir/<series>-console.log`, so two runs of the same series must
/// not share a `work_dir` at the same time. `timeout` covers the whole run, boot included.
pub(crate) fn run_in_guest(
    kernel: &GuestKernel,
    payload: &[(PathBuf, String)],
    command: &str,
    timeout: Duration,
    work_dir: &Path,
    init: GuestInit,
) -> Result<GuestRun> {
    std::fs::create_dir_all(work_dir)
        .with_context(|| format!("creating VM work directory {}", work_dir.display()))?;
    let name = format!("{}{}", kernel.series, init.suffix());
    let initrd = initramfs::build(work_dir, &name, payload, command, init != GuestInit::Shell)?;
    let log = work_dir.join(format!("{name}-console.log"));
    eprintln!(
        "xtask vm: booting {} ({}), console in {}",
        kernel.series,
        kernel.release,
        log.display()
    );
    let run = qemu::run(&qemu::Boot {
        kernel,
        initrd: &initrd,
        log: &log,
        timeout,
        hybrid: init == GuestInit::SystemdHybrid,
    })?;
    eprintln!(
        "xtask vm: {} guest ended after {:.1} s: {:?}",
        kernel.series,
        run.wall.as_secs_f64(),
        run.exit
    );
    Ok(run)
}
