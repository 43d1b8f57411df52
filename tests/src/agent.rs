//! Drives a real `qosd run` process: start it on a free port, wait until it serves, scrape
//! `/metrics`, stop it with a signal. Killed on drop if a case ends early.
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// A running agent. Its log goes to a file that is shown when a case fails.
pub(crate) struct Agent {
    child: Option<Child>,
    pub addr: SocketAddr,
    log: PathBuf,
}

impl Agent {
    /// Starts `qosd run` and waits up to `ready_within` for `/healthz`.
    pub(crate) fn start(qosd: &Path, ready_within: Duration) -> Result<Self, String> {
        Self::start_with(qosd, &[], ready_within)
    }

    /// Starts `qosd run EXTRA...` and waits up to `ready_within` for `/healthz`.
    pub(crate) fn start_with(
        qosd: &Path,
        extra: &[String],
        ready_within: Duration,
    ) -> Result<Self, String> {
        let mut agent = Self::spawn_with(qosd, extra)?;
        agent.wait_ready(ready_within)?;
        Ok(agent)
    }

    /// Starts `qosd run EXTRA...` without waiting for it to serve.
    pub(crate) fn spawn_with(qosd: &Path, extra: &[String]) -> Result<Self, String> {
        Self::spawn(qosd, extra, &Launch::default())
    }

    /// Starts `qosd run EXTRA...` as `launch` says and waits up to `ready_within` for
    /// `/healthz`.
    pub(crate) fn start_launched(
        qosd: &Path,
        extra: &[String],
        launch: &Launch<'_>,
        ready_within: Duration,
    ) -> Result<Self, String> {
        let mut agent = Self::spawn(qosd, extra, launch)?;
        agent.wait_ready(ready_within)?;
        Ok(agent)
    }

    fn spawn(qosd: &Path, extra: &[String], launch: &Launch<'_>) -> Result<Self, String> {
        let addr = free_port()?;
        let log = std::env::temp_dir().join(format!("qosd-systest-agent-{}.log", addr.port()));
        let log_file =
            std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
        let mut command = Command::new(qosd);
        command
            .args(["run", "--metrics-addr", &addr.to_string()])
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stderr(log_file);
        launch.configure(&mut command)?;
        let child = command
            .spawn()
            .map_err(|e| format!("starting {}: {e}", qosd.display()))?;
        Ok(Self {
            child: Some(child),
            addr,
            log,
        })
    }

    /// Waits up to `ready_within` for `/healthz` to answer `ok`.
    pub(crate) fn wait_ready(&mut self, ready_within: Duration) -> Result<(), String> {
        let deadline = Instant::now() + ready_within;
        loop {
            if http_get(self.addr, "/healthz").is_ok_and(|body| body == "ok\n") {
                return Ok(());
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(format!(
                    "qosd exited before serving: {status}\n{}",
                    self.log_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "qosd did not serve /healthz on {} within {ready_within:?}\n{}",
                    self.addr,
                    self.log_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Everything qosd logged so far.
    pub(crate) fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines qosd logged, for failure messages.
    pub(crate) fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("--- qosd log ({}) ---\n{tail}", self.log.display())
    }

    /// The body of `/metrics`.
    pub(crate) fn scrape(&self) -> Result<String, String> {
        http_get(self.addr, "/metrics")
    }

    /// The process id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Sends `signal` and waits up to `within` for the exit; returns the status and how long
    /// the agent took.
    pub(crate) fn stop(
        &mut self,
        signal: i32,
        within: Duration,
    ) -> Result<(ExitStatus, Duration), String> {
        let mut child = self.child.take().ok_or("agent already stopped")?;
        let pid = i32::try_from(child.id()).map_err(|e| e.to_string())?;
        let sent = Instant::now();
        // SAFETY: kill(2) on our own child's pid, which we have not reaped yet.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(format!("kill: {}", std::io::Error::last_os_error()));
        }
        loop {
            if let Some(status) = child.try_wait().map_err(|e| e.to_string())? {
                return Ok((status, sent.elapsed()));
            }
            if sent.elapsed() > within {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "qosd still running {within:?} after signal {signal}; killed"
                ));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// What a case changes about how qosd starts, beyond its arguments.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Launch<'a> {
    /// Exactly these capabilities (`None`: all of root's).
    pub keep: Option<&'a [u32]>,
    /// Extra environment variables.
    pub env: &'a [(&'a str, &'a str)],
    /// What the kernel seems to lack, in a private mount namespace of qosd's own.
    pub hidden: Hidden,
    /// Runs as this uid (and gid) instead of root, keeping `keep` as ambient capabilities.
    pub uid: Option<u32>,
}

/// A part of the kernel's interface hidden from qosd: it runs in a mount namespace of its own
/// (made between fork and exec, private so nothing propagates back to the host) where that
/// part is covered or unmounted. The kernel itself is unchanged.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Hidden {
    #[default]
    Nothing,
    /// `/sys/kernel/btf` covered by an empty read-only tmpfs: a kernel built without BTF.
    Btf,
    /// tracefs unmounted at `/sys/kernel/tracing` and debugfs at `/sys/kernel/debug`: a host
    /// that mounts neither at boot.
    Tracefs,
}

impl Launch<'_> {
    /// Applies the environment, and the namespace and capabilities between fork and exec.
    pub(crate) fn configure(&self, command: &mut Command) -> Result<(), String> {
        for (key, value) in self.env {
            command.env(key, value);
        }
        if self.keep.is_none() && self.hidden == Hidden::Nothing && self.uid.is_none() {
            return Ok(());
        }
        let keep: Option<u64> = self.keep.map(|k| k.iter().map(|cap| 1u64 << cap).sum());
        // Read before the fork: the child may only make system calls.
        let last = last_capability()?;
        let (hidden, uid) = (self.hidden, self.uid);
        // SAFETY: the closure runs in the child between fork and exec and makes only
        // unshare(2), mount(2), umount2(2), prctl(2), setgroups/setgid/setuid(2) and
        // capget/capset(2) system calls, which are async-signal-safe, on static strings; it
        // allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(command, move || {
                hide(hidden)?;
                if let Some(keep) = keep {
                    limit_capabilities(keep, last)?;
                }
                match uid {
                    Some(uid) => become_user(uid, keep.unwrap_or(0), last),
                    None => Ok(()),
                }
            });
        }
        Ok(())
    }
}

/// Makes `hidden` disappear for this process (between fork and exec).
fn hide(hidden: Hidden) -> std::io::Result<()> {
    let check = |rc: i32| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    if hidden == Hidden::Nothing {
        return Ok(());
    }
    // SAFETY: unshare(2) and mount(2) with static NUL-terminated strings (or null where the
    // call takes none); neither retains a pointer.
    unsafe {
        check(libc::unshare(libc::CLONE_NEWNS))?;
        check(libc::mount(
            std::ptr::null(),
            c"/".as_ptr(),
            std::ptr::null(),
            libc::MS_REC | libc::MS_PRIVATE,
            std::ptr::null(),
        ))?;
    }
    match hidden {
        Hidden::Nothing => Ok(()),
        // SAFETY: as above.
        Hidden::Btf => check(unsafe {
            libc::mount(
                c"tmpfs".as_ptr(),
                c"/sys/kernel/btf".as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                std::ptr::null(),
            )
        }),
        Hidden::Tracefs => {
            for target in [
                c"/sys/kernel/debug/tracing",
                c"/sys/kernel/debug",
                c"/sys/kernel/tracing",
            ] {
                // Not mounted there (EINVAL) or no such directory (ENOENT) is what is wanted.
                // SAFETY: umount2(2) on a static path.
                let _ = unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
            }
            Ok(())
        }
    }
}

/// Runs `qosd check` as `launch` says; its output (stdout and stderr).
pub(crate) fn check_output(qosd: &Path, launch: &Launch<'_>) -> Result<String, String> {
    let mut command = Command::new(qosd);
    command.arg("check").stdin(Stdio::null());
    launch.configure(&mut command)?;
    let out = command
        .output()
        .map_err(|e| format!("running {} check: {e}", qosd.display()))?;
    Ok(format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

/// A standalone case's inputs under `scratch`: an empty manifest directory and a
/// KubeletConfiguration of `lines` (YAML, one field per line). Returns both paths.
pub(crate) fn standalone_inputs(scratch: &Path, lines: &str) -> Result<(PathBuf, PathBuf), String> {
    let manifests = scratch.join("manifests");
    std::fs::create_dir_all(&manifests).map_err(|e| format!("{}: {e}", manifests.display()))?;
    let config = scratch.join("kubelet.yaml");
    std::fs::write(
        &config,
        format!("apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n{lines}"),
    )
    .map_err(|e| format!("{}: {e}", config.display()))?;
    Ok((manifests, config))
}

/// `qosd run` arguments of a standalone case: its manifest directory and KubeletConfiguration,
/// state and container logs under `scratch`, then `extra`.
pub(crate) fn standalone_args(
    scratch: &Path,
    manifests: &Path,
    config: &Path,
    extra: &[&str],
) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    let mut args = vec![
        "--manifest-dir".to_owned(),
        path(manifests),
        "--kubelet-config".to_owned(),
        path(config),
        "--state-dir".to_owned(),
        path(&scratch.join("state")),
        "--container-log-dir".to_owned(),
        path(&scratch.join("logs")),
    ];
    args.extend(extra.iter().map(|a| (*a).to_owned()));
    args
}

/// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`).
pub(crate) fn last_capability() -> Result<u32, String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .map_err(|e| format!("/proc/sys/kernel/cap_last_cap: {e}"))?;
    text.trim()
        .parse()
        .map_err(|e| format!("cap_last_cap {text:?}: {e}"))
}

/// capget(2)/capset(2)'s header (`struct __user_cap_header_struct`).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

/// One 32-bit word of each set (`struct __user_cap_data_struct`); version 3 takes two.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: 64-bit sets in two words.
const CAP_VERSION_3: u32 = 0x2008_0522;

/// In a child about to exec as uid 0: every capability up to `last` outside `keep` (a bit mask) dropped
/// from the bounding set, and the inheritable and ambient sets cleared, so the exec gives the
/// program exactly `keep` (a root exec gets its bounding set, plus its inheritable one).
fn limit_capabilities(keep: u64, last: u32) -> std::io::Result<()> {
    for cap in 0..=last.min(63) {
        if keep & (1 << cap) == 0 {
            // SAFETY: prctl(PR_CAPBSET_DROP, cap) takes an integer and changes only this
            // process's bounding set.
            if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) } != 0
            {
                return Err(std::io::Error::last_os_error());
            }
        }
    }
    // SAFETY: as above; clears this process's ambient set.
    if unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL,
            0,
            0,
            0,
        )
    } != 0
    {
        return Err(std::io::Error::last_os_error());
    }
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: capget fills the two Data words for the version-3 header given; both live on
    // this stack frame.
    if unsafe { libc::syscall(libc::SYS_capget, &raw mut header, data.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    for word in &mut data {
        word.inheritable = 0;
    }
    // SAFETY: capset with the same header and the sets just read, inheritable cleared (a
    // process may always lower its inheritable set).
    if unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Becomes `uid` (and the group of the same number, no supplementary groups) keeping exactly
/// `keep` across the exec: a process that is not root gets no capabilities from an exec of a
/// plain file except its ambient set, so `keep` is raised there (it must be permitted and
/// inheritable first). Between fork and exec.
fn become_user(uid: u32, keep: u64, last: u32) -> std::io::Result<()> {
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    // SAFETY: prctl, setgroups, setgid and setuid with integer arguments (and a null group
    // list of length 0) change only this process.
    unsafe {
        check(libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0))?;
        check(libc::setgroups(0, std::ptr::null()))?;
        check(libc::setgid(uid))?;
        check(libc::setuid(uid))?;
    }
    set_capabilities(keep)?;
    for cap in (0..=last.min(63)).filter(|cap| keep & (1 << cap) != 0) {
        // SAFETY: prctl(PR_CAP_AMBIENT_RAISE, cap) takes integers; the cap is permitted and
        // inheritable (set above).
        check(unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE,
                libc::c_ulong::from(cap),
                0,
                0,
            )
        })?;
    }
    Ok(())
}

/// Sets this process's effective, permitted and inheritable sets to `caps`.
fn set_capabilities(caps: u64) -> std::io::Result<()> {
    let mut header = CapHeader {
        version: CAP_VERSION_3,
        pid: 0,
    };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the two 32-bit halves of the set"
    )]
    let words = [caps as u32, (caps >> 32) as u32];
    let data = words.map(|word| CapData {
        effective: word,
        permitted: word,
        inheritable: word,
    });
    // SAFETY: capset with a version-3 header and its two Data words, on this stack frame.
    if unsafe { libc::syscall(libc::SYS_capset, &raw mut header, data.as_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A port that was free a moment ago.
pub(crate) fn free_port() -> Result<SocketAddr, String> {
    let listener =
        TcpListener::bind("127.0.0.1:0").map_err(|e| format!("finding a free port: {e}"))?;
    listener.local_addr().map_err(|e| e.to_string())
}

/// A minimal HTTP/1.1 GET returning the body of a 200 response.
pub(crate) fn http_get(addr: SocketAddr, path: &str) -> Result<String, String> {
    let (status, body) = http_request(addr, "GET", path)?;
    if !status.starts_with("HTTP/1.1 200") {
        return Err(format!("GET {path}: {status}"));
    }
    Ok(body)
}

/// A minimal HTTP/1.1 request of `method` with no body: the status line and the body.
pub(crate) fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> Result<(String, String), String> {
    let mut stream =
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)).map_err(|e| e.to_string())?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(|e| e.to_string())?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .map_err(|e| e.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or("malformed HTTP response")?;
    Ok((
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    ))
}

/// The value of the sample `name{labels}` in a Prometheus text exposition, where `labels`
/// is the exact label set as qosd renders it (sorted, `k="v"` joined by commas).
pub(crate) fn sample_value(text: &str, name: &str, labels: &str) -> Option<f64> {
    let key = if labels.is_empty() {
        format!("{name} ")
    } else {
        format!("{name}{{{labels}}} ")
    };
    text.lines()
        .find_map(|line| line.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
}

/// Every (probe, mode) `qosd_probe_info` sets to 1 in `text`.
pub(crate) fn probe_info_modes(text: &str) -> std::collections::BTreeSet<(String, String)> {
    samples(text, "qosd_probe_info")
        .into_iter()
        .filter(|(_, value)| *value == 1.0)
        .filter_map(|(labels, _)| {
            let get = |key: &str| {
                labels
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, v)| v.clone())
            };
            Some((get("probe")?, get("mode")?))
        })
        .collect()
}

/// Every sample of metric `name` with its labels, in exposition order.
pub(crate) fn samples(text: &str, name: &str) -> Vec<(Vec<(String, String)>, f64)> {
    let prefix = format!("{name}{{");
    text.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix(&prefix)?;
            let (labels, value) = rest.rsplit_once("} ")?;
            let value = value.trim().parse().ok()?;
            let mut parsed = Vec::new();
            for pair in labels.split("\",") {
                let (key, value) = pair.split_once("=\"")?;
                parsed.push((key.to_owned(), value.trim_end_matches('"').to_owned()));
            }
            Some((parsed, value))
        })
        .collect()
}

/// The sum of the samples of `name` whose labels include every `(key, value)` of `with`.
pub(crate) fn sum_where(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    samples(text, name)
        .into_iter()
        .filter(|(labels, _)| {
            with.iter()
                .all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v))
        })
        .map(|(_, value)| value)
        // f64's sum of nothing is -0.0; report it as 0.
        .sum::<f64>()
        + 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sample_value_matches_the_exact_label_set() {
        let text = "a{cgroup=\"/x\"} 1.5\na{cgroup=\"/x/y\"} 2\n";
        assert_eq!(sample_value(text, "a", "cgroup=\"/x\""), Some(1.5));
        assert_eq!(sample_value(text, "a", "cgroup=\"/x/y\""), Some(2.0));
        assert_eq!(sample_value(text, "a", "cgroup=\"/z\""), None);
        assert_eq!(
            sum_where(
                "m{cgroup=\"/x\",locality=\"local\"} 1\nm{cgroup=\"/x\",locality=\"remote\"} 2\nm{cgroup=\"/y\",locality=\"remote\"} 4\n",
                "m",
                &[("locality", "remote")]
            ),
            6.0
        );
        assert_eq!(
            sample_value("b 3\n", "b", ""),
            Some(3.0),
            "a series without labels"
        );
    }
}
