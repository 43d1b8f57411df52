//! Booting one guest under qemu and classifying how it ended.
//!
//! The machine is fixed: TCG (KVM guests die with "emulation failure" on the development
//! machine), `-cpu max,-la57` (plain `max` double-faults 6.12), 4 vCPUs in two NUMA nodes of
//! 1 GiB each, serial console on stdout, no NIC. The console is streamed to a log file as it
//! arrives. The qemu process is owned by a guard that kills it on every way out, so no run
//! leaves one behind.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

use super::{GuestExit, GuestKernel, GuestRun};

/// The line `/init` prints after the command, followed by its exit status.
const EXIT_MARKER: &str = "QOSD-GUEST-EXIT ";
/// What the kernel prints when it panics.
const PANIC_TEXT: &str = "Kernel panic";
/// panic=-1 and oops=panic turn any oops into a reset, which -no-reboot turns into qemu's exit.
const KERNEL_CMDLINE: &str = "console=ttyS0 panic=-1 oops=panic quiet loglevel=4";
/// Every controller on the cgroup2 hierarchy (that /init, or systemd, mounts).
const CGROUP_V2: &str = "cgroup_no_v1=all";
/// systemd mounts the hybrid layout: v1 controllers, cgroup2 on /sys/fs/cgroup/unified.
const CGROUP_HYBRID: &str = "systemd.unified_cgroup_hierarchy=0";
/// Guest NUMA nodes, with this many vCPUs and MiB of memory each.
const NUMA_NODES: u32 = 2;
const CPUS_PER_NODE: u32 = 2;
const MIB_PER_NODE: u32 = 1024;
/// How long qemu gets to exit on its own once the guest has reported its end.
const GRACE: Duration = Duration::from_secs(10);
/// How often the run loop checks on qemu when the console is quiet.
const POLL: Duration = Duration::from_millis(100);

/// What to boot, and where the console log goes.
pub(super) struct Boot<'a> {
    pub(super) kernel: &'a GuestKernel,
    pub(super) initrd: &'a Path,
    pub(super) log: &'a Path,
    pub(super) timeout: Duration,
    /// The hybrid cgroup layout (systemd guests only) instead of cgroup v2.
    pub(super) hybrid: bool,
}

/// Boots the guest, waits for it to end (or for the timeout) and classifies the run.
pub(super) fn run(boot: &Boot<'_>) -> Result<GuestRun> {
    let mut console = Console::new(boot.log)?;
    let start = Instant::now();
    let mut qemu = match spawn(boot) {
        Ok(qemu) => qemu,
        Err(e) => {
            let exit = GuestExit::QemuFailed(format!("{e:#}"));
            return Ok(GuestRun {
                output: String::new(),
                exit,
                wall: start.elapsed(),
            });
        }
    };
    let stderr = qemu.capture_stderr()?;
    let chunks = qemu.stream_stdout()?;
    let status = wait(&mut qemu, &chunks, &mut console, start + boot.timeout)?;
    let wall = start.elapsed();
    // qemu is gone: the reader threads see end-of-file and the rest of the console arrives.
    for chunk in chunks.iter() {
        console.append(&chunk)?;
    }
    let stderr = stderr
        .join()
        .unwrap_or_else(|_| String::from("(qemu stderr reader panicked)"));
    let output = console.text();
    let exit = classify(&output, status, &stderr);
    Ok(GuestRun { output, exit, wall })
}

/// The running qemu; killed and reaped when dropped.
struct Qemu(Child);

impl Drop for Qemu {
    fn drop(&mut self) {
        // Errors mean it has already exited and been reaped, which is the goal.
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Qemu {
    fn capture_stderr(&mut self) -> Result<JoinHandle<String>> {
        let Some(mut pipe) = self.0.stderr.take() else {
            bail!("qemu has no stderr pipe");
        };
        Ok(thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).into_owned()
        }))
    }

    /// Forwards the serial console in chunks, as it arrives, until qemu closes it.
    fn stream_stdout(&mut self) -> Result<Receiver<Vec<u8>>> {
        let Some(mut pipe) = self.0.stdout.take() else {
            bail!("qemu has no stdout pipe");
        };
        let (sender, receiver) = mpsc::channel();
        thread::spawn(move || {
            let mut buffer = [0_u8; 8192];
            while let Ok(n @ 1..) = pipe.read(&mut buffer) {
                if sender.send(buffer[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Ok(receiver)
    }
}

fn spawn(boot: &Boot<'_>) -> Result<Qemu> {
    let mut command = Command::new("qemu-system-x86_64");
    command
        .args(machine_args())
        .arg("-kernel")
        .arg(&boot.kernel.vmlinuz)
        .arg("-initrd")
        .arg(boot.initrd)
        .arg("-append")
        .arg(format!(
            "{KERNEL_CMDLINE} {}",
            if boot.hybrid {
                CGROUP_HYBRID
            } else {
                CGROUP_V2
            }
        ))
        // Never hand qemu the developer's terminal: -nographic would put it in raw mode.
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let child = command
        .spawn()
        .with_context(|| format!("starting {command:?} (apt-get install qemu-system-x86)"))?;
    Ok(Qemu(child))
}

/// Everything on qemu's command line but the kernel, initrd and kernel command line.
///
/// TCG runs the vCPUs on one host thread (`thread=single`), not one each. With four vCPU
/// threads on this two-core machine, a guest CPU that patches kernel text (attaching or
/// detaching a BPF program flips static keys; `text_poke_bp` waits for every other CPU to
/// answer an IPI) spins on a host thread the other vCPUs need: measured in a 5.10 guest with
/// four busy CPUs, toggling three tracepoints ran at under 0.14 per second with `multi` and at
/// 0.65 per second with `single`, and whole test runs stalled for minutes with soft-lockup
/// reports (seen in 5.10 and 6.1 guests). Round-robin scheduling of the vCPUs cannot starve
/// the CPU that has to answer.
fn machine_args() -> Vec<String> {
    let mut args: Vec<String> = [
        "-accel",
        "tcg,thread=single",
        "-cpu",
        "max,-la57",
        "-nographic",
        "-no-reboot",
        "-nic",
        "none",
    ]
    .map(String::from)
    .to_vec();
    args.push("-smp".into());
    args.push((NUMA_NODES * CPUS_PER_NODE).to_string());
    args.push("-m".into());
    args.push((NUMA_NODES * MIB_PER_NODE).to_string());
    for node in 0..NUMA_NODES {
        let first_cpu = node * CPUS_PER_NODE;
        let last_cpu = first_cpu + CPUS_PER_NODE - 1;
        args.push("-object".into());
        args.push(format!(
            "memory-backend-ram,id=m{node},size={MIB_PER_NODE}M"
        ));
        args.push("-numa".into());
        args.push(format!(
            "node,nodeid={node},cpus={first_cpu}-{last_cpu},memdev=m{node}"
        ));
    }
    args
}

/// Collects the console until qemu exits (its status), or kills it at the deadline or once
/// the guest has reported its end and not exited within [`GRACE`] (`None`).
fn wait(
    qemu: &mut Qemu,
    chunks: &Receiver<Vec<u8>>,
    console: &mut Console,
    deadline: Instant,
) -> Result<Option<ExitStatus>> {
    let mut settle_by: Option<Instant> = None;
    loop {
        match chunks.recv_timeout(POLL) {
            Ok(chunk) => console.append(&chunk)?,
            Err(RecvTimeoutError::Timeout) => {}
            // qemu closed the console and is exiting: poll for its status without spinning.
            Err(RecvTimeoutError::Disconnected) => thread::sleep(POLL),
        }
        if settle_by.is_none() && console.guest_ended() {
            settle_by = Some(Instant::now() + GRACE);
        }
        if let Some(status) = qemu.0.try_wait().context("checking on qemu")? {
            return Ok(Some(status));
        }
        let now = Instant::now();
        if now >= deadline || settle_by.is_some_and(|by| now >= by) {
            qemu.0.kill().context("killing qemu")?;
            qemu.0.wait().context("reaping qemu")?;
            return Ok(None);
        }
    }
}

/// The serial console so far, mirrored to its log file, with the position up to which whole
/// lines were inspected.
struct Console {
    log: File,
    log_path: PathBuf,
    bytes: Vec<u8>,
    inspected: usize,
    ended: bool,
}

impl Console {
    fn new(log_path: &Path) -> Result<Self> {
        let log =
            File::create(log_path).with_context(|| format!("creating {}", log_path.display()))?;
        let log_path = log_path.to_path_buf();
        Ok(Self {
            log,
            log_path,
            bytes: Vec::new(),
            inspected: 0,
            ended: false,
        })
    }

    fn append(&mut self, chunk: &[u8]) -> Result<()> {
        self.log
            .write_all(chunk)
            .with_context(|| format!("writing {}", self.log_path.display()))?;
        self.bytes.extend_from_slice(chunk);
        self.inspect_new_lines();
        Ok(())
    }

    /// Looks at each newly completed line once for the exit marker or a panic.
    fn inspect_new_lines(&mut self) {
        let Some(last_newline) = self.bytes.iter().rposition(|b| *b == b'\n') else {
            return;
        };
        if last_newline < self.inspected {
            return;
        }
        let fresh = String::from_utf8_lossy(&self.bytes[self.inspected..=last_newline]);
        self.ended |= fresh
            .lines()
            .any(|line| exit_status(line).is_some() || line.contains(PANIC_TEXT));
        self.inspected = last_newline + 1;
    }

    fn guest_ended(&self) -> bool {
        self.ended
    }

    /// The console as text: `\r\n` and lone `\r` (SeaBIOS ends its last line with one) turned
    /// into `\n`, and terminal escape sequences (SeaBIOS resets the terminal and clears the
    /// screen) dropped. The log keeps the raw bytes.
    fn text(&self) -> String {
        let text = String::from_utf8_lossy(&self.bytes);
        strip_escapes(&text.replace("\r\n", "\n").replace('\r', "\n"))
    }
}

/// Drops ANSI escape sequences: `ESC [ ... final-byte` (CSI) and two-character `ESC x`.
fn strip_escapes(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c != '\u{1b}' {
            out.push(c);
            continue;
        }
        if chars.next() == Some('[') {
            // Parameters and intermediates run up to the final byte, '@' to '~'.
            for c in chars.by_ref() {
                if ('@'..='~').contains(&c) {
                    break;
                }
            }
        }
    }
    out
}

/// The status in an exit marker line (`QOSD-GUEST-EXIT 0`); `None` for any other line,
/// including the `echo "QOSD-GUEST-EXIT $status"` of a command that prints /init.
fn exit_status(line: &str) -> Option<i32> {
    let (_, rest) = line.split_once(EXIT_MARKER)?;
    rest.trim().parse().ok()
}

fn classify(output: &str, status: Option<ExitStatus>, stderr: &str) -> GuestExit {
    if let Some(code) = output.lines().rev().find_map(exit_status) {
        return GuestExit::Exited(code);
    }
    if let Some(line) = output.lines().find(|line| line.contains(PANIC_TEXT)) {
        return GuestExit::Panicked(line.trim().to_owned());
    }
    match status {
        None => GuestExit::TimedOut,
        Some(status) => GuestExit::QemuFailed(format!(
            "qemu exited ({status}) before the guest reported an exit status; stderr: {}",
            stderr.trim()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_lines() {
        assert_eq!(exit_status("QOSD-GUEST-EXIT 0"), Some(0));
        assert_eq!(exit_status("QOSD-GUEST-EXIT 137\r"), Some(137));
        assert_eq!(exit_status("echo \"QOSD-GUEST-EXIT $status\""), None);
        assert_eq!(exit_status("hello"), None);
    }

    #[test]
    fn escapes_are_dropped() {
        let raw = "\u{1b}c\u{1b}[?7l\u{1b}[2J\u{1b}[0mSeaBIOS\nBooting";
        assert_eq!(strip_escapes(raw), "SeaBIOS\nBooting");
    }

    #[test]
    fn classification() {
        let panic = "x\n[    2.1] Kernel panic - not syncing: sysrq triggered crash\n";
        assert_eq!(
            classify(panic, None, ""),
            GuestExit::Panicked(
                "[    2.1] Kernel panic - not syncing: sysrq triggered crash".into()
            )
        );
        assert_eq!(
            classify("hello\nQOSD-GUEST-EXIT 3\n", None, ""),
            GuestExit::Exited(3)
        );
        assert_eq!(classify("booting\n", None, ""), GuestExit::TimedOut);
    }

    #[test]
    fn memory_matches_the_numa_nodes() {
        let args = machine_args();
        let memory = args.iter().skip_while(|a| *a != "-m").nth(1);
        assert_eq!(memory.map(String::as_str), Some("2048"));
        assert!(args.iter().any(|a| a == "node,nodeid=1,cpus=2-3,memdev=m1"));
    }
}
