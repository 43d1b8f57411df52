//! `/inspect` only reads. While qosd runs two pods, strace follows every thread of qosd over
//! fifty `GET /inspect` and a refused `POST`, `PUT` and `DELETE`, and must see no open for
//! writing, no directory made or removed, no file unlinked, renamed or truncated and no signal
//! sent: the kernel's view of qosd's system calls, not qosd's word. The same window with no
//! request at all is traced first, so a write by qosd's own background work (which would make
//! the comparison meaningless) is reported as such. The feedback runs in dry-run, so nothing
//! but drift (there is none) gives qosd a reason to write in either window.
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::feedback::{Scenario, pod};
use crate::agent::{http_get, http_request};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{TempPaths, wait_for};

const SLEEPER_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000e1";
const IDLER_UID: &str = "0f0e0d0c-0000-4000-8000-0000000000e2";
const STRACE: &str = "/usr/bin/strace";
const GETS: usize = 50;

/// The system calls that change files, directories or processes.
const CHANGING_CALLS: &str = "open,openat,openat2,creat,mkdir,mkdirat,rmdir,unlink,unlinkat,\
     rename,renameat,renameat2,truncate,ftruncate,kill,tkill,tgkill,pidfd_send_signal";

pub(crate) fn inspect_only_reads(ctx: &Context) -> Outcome {
    if !Path::new(STRACE).is_file() {
        return Outcome::Skip(format!(
            "{STRACE} is not here (`cargo xtask setup` installs it; `cargo xtask test` copies it into the guests)"
        ));
    }
    match run(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

fn run(ctx: &Context) -> Result<String, String> {
    let s = Scenario::start(
        ctx,
        "qosd-systest-inspect",
        "",
        &[
            (
                "sleeper.yaml",
                pod(
                    SLEEPER_UID,
                    "sleeper",
                    "[\"/bin/sh\", \"-c\", \"sleep 600\"]",
                    "{requests: {cpu: 100m, memory: 16Mi}, limits: {cpu: 200m, memory: 32Mi}}",
                ),
            ),
            (
                "idler.yaml",
                pod(
                    IDLER_UID,
                    "idler",
                    "[\"/bin/sh\", \"-c\", \"sleep 600\"]",
                    "{}",
                ),
            ),
        ],
        // The feedback decides and lists its decisions in /inspect but writes nothing: with
        // nothing drifting, qosd has no background write that could blur the windows below.
        &["--feedback", "dry-run"],
    )?;
    s.wait_pids(&format!("kubepods/burstable/pod{SLEEPER_UID}/c"), 1)?;
    s.wait_pids(&format!("kubepods/besteffort/pod{IDLER_UID}/c"), 1)?;
    let pid = s.agent.pid().ok_or("qosd has no process")?;
    // Both pods in the report: the manager has admitted them and checkpointed its state.
    wait_for("both pods in /inspect", Duration::from_secs(15), || {
        let text = http_get(s.agent.addr, "/inspect")?;
        if text.contains("sleeper") && text.contains("idler") {
            Ok(())
        } else {
            Err("not yet".to_owned())
        }
    })
    .map_err(|e| s.with_log(e))?;
    let scratch = std::env::temp_dir().join(format!("{}-strace", s.h.root_name));
    let _scratch = TempPaths(vec![scratch.clone()]);

    let quiet = traced(pid, &scratch.join("quiet"), Duration::from_secs(3), || {
        Ok(())
    })?;
    if !quiet.changes.is_empty() {
        return Err(s.with_log(format!(
            "qosd changed files or processes with no request at all, so /inspect cannot be judged ({} calls): {}",
            quiet.changes.len(),
            quiet.changes.join(" | ")
        )));
    }
    let mut refused = Vec::new();
    let mut bytes = 0;
    let asked = traced(pid, &scratch.join("inspect"), Duration::ZERO, || {
        for _ in 0..GETS {
            let text = http_get(s.agent.addr, "/inspect")?;
            if !text.contains("sleeper") {
                return Err(format!("/inspect without the sleeper pod: {text}"));
            }
            bytes += text.len();
        }
        for method in ["POST", "PUT", "DELETE"] {
            let (status, _) = http_request(s.agent.addr, method, "/inspect")?;
            if !status.contains(" 405 ") {
                return Err(format!("{method} /inspect answered {status:?}, want 405"));
            }
            refused.push(method);
        }
        Ok(())
    })?;
    if !asked.changes.is_empty() {
        return Err(s.with_log(format!(
            "qosd changed files or processes while answering /inspect ({} calls): {}",
            asked.changes.len(),
            asked.changes.join(" | ")
        )));
    }
    if asked.calls == 0 {
        return Err(format!(
            "strace saw no call of qosd's over {GETS} GET /inspect, which read /proc: it did not follow qosd's threads"
        ));
    }
    Ok(format!(
        "strace on every thread of qosd (pid {pid}) traced {} and {} calls of {CHANGING_CALLS}: none changed anything, in 3 s without requests nor over {GETS} GET /inspect ({} KiB in all) and {} refused with 405",
        quiet.calls,
        asked.calls,
        bytes / 1024,
        refused.join(", ")
    ))
}

/// Runs `during` (then waits out `at_least`) with strace attached to every thread of `pid`;
/// returns what strace saw.
fn traced(
    pid: u32,
    output: &Path,
    at_least: Duration,
    during: impl FnOnce() -> Result<(), String>,
) -> Result<Traced, String> {
    if let Some(dir) = output.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mut strace = Strace::attach(pid, output)?;
    let started = Instant::now();
    let result = during();
    if let Some(rest) = at_least.checked_sub(started.elapsed()) {
        std::thread::sleep(rest);
    }
    let log = strace.detach()?;
    result?;
    Ok(Traced {
        calls: log.lines().filter(|l| is_call(l)).count(),
        changes: log
            .lines()
            .filter(|l| changes_something(l))
            .map(str::to_owned)
            .collect(),
    })
}

/// What strace saw in one window.
struct Traced {
    /// Every traced call (reading opens included): proof that strace followed qosd.
    calls: usize,
    /// The calls that change something, one line each.
    changes: Vec<String>,
}

/// A line of a call (not a signal delivery, an exit or a resumption).
fn is_call(line: &str) -> bool {
    !call_name(line).is_empty()
}

/// The name of the call a line shows, empty for other lines.
fn call_name(line: &str) -> &str {
    line.split_whitespace()
        .find(|w| w.contains('('))
        .and_then(|w| w.split('(').next())
        .unwrap_or_default()
}

/// One strace line (`-f` prefixes the thread id) is a call that changes something: an open
/// with a flag that writes or creates, or any of the other traced calls, successful or not.
fn changes_something(line: &str) -> bool {
    match call_name(line) {
        "" => false,
        "open" | "openat" | "openat2" => ["O_WRONLY", "O_RDWR", "O_CREAT", "O_TRUNC", "O_APPEND"]
            .iter()
            .any(|flag| line.contains(flag)),
        _ => true,
    }
}

/// strace following every thread of a process into a file.
struct Strace {
    child: Child,
    output: PathBuf,
}

impl Strace {
    fn attach(pid: u32, output: &Path) -> Result<Self, String> {
        let child = Command::new(STRACE)
            .args(["-f", "-e", &format!("trace={CHANGING_CALLS}"), "-o"])
            .arg(output)
            .arg("-p")
            .arg(pid.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("{STRACE}: {e}"))?;
        let mut strace = Self {
            child,
            output: output.to_owned(),
        };
        // strace says on stderr when it has attached to each thread; the output file exists
        // from the start. Attached means the first line on stderr.
        let stderr = strace.child.stderr.take().ok_or("strace has no stderr")?;
        let mut first = [0u8; 1];
        let mut reader = stderr;
        reader
            .read_exact(&mut first)
            .map_err(|e| format!("strace said nothing on attaching: {e}"))?;
        // Give the other threads' attach messages time to follow.
        std::thread::sleep(Duration::from_millis(300));
        std::thread::spawn(move || {
            let mut rest = Vec::new();
            let _ = reader.read_to_end(&mut rest);
        });
        Ok(strace)
    }

    /// Detaches (SIGINT) and returns what it traced.
    fn detach(&mut self) -> Result<String, String> {
        let pid = i32::try_from(self.child.id()).map_err(|e| e.to_string())?;
        // SAFETY: kill(2) on the strace child this test started, with a valid signal number.
        unsafe { libc::kill(pid, libc::SIGINT) };
        self.child.wait().map_err(|e| format!("strace: {e}"))?;
        std::fs::read_to_string(&self.output).map_err(|e| format!("{}: {e}", self.output.display()))
    }
}

impl Drop for Strace {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::changes_something;

    #[test]
    fn strace_lines_that_change_something_are_found() {
        for line in [
            "1234  openat(AT_FDCWD, \"/sys/fs/cgroup/cpu/x/cpu.shares\", O_WRONLY|O_CLOEXEC) = 7",
            "1234  openat(AT_FDCWD, \"/var/lib/qosd/cpu_manager_state.tmp\", O_WRONLY|O_CREAT|O_TRUNC|O_CLOEXEC, 0600) = 8",
            "1234  mkdir(\"/sys/fs/cgroup/cpu/x\", 0755) = 0",
            "1235  renameat2(AT_FDCWD, \"a\", AT_FDCWD, \"b\", 0) = 0",
            "1235  kill(4321, SIGTERM) = 0",
        ] {
            assert!(changes_something(line), "{line}");
        }
        for line in [
            "1234  openat(AT_FDCWD, \"/proc/self/stat\", O_RDONLY|O_CLOEXEC) = 7",
            "1234  +++ exited with 0 +++",
            "strace: Process 1234 attached",
            "",
        ] {
            assert!(!changes_something(line), "{line}");
        }
    }
}
