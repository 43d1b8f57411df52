//! Starting a container process inside its cgroups and signalling it.
//!
//! The child joins every cgroup before `exec` by writing `0` ("the writing process") to each
//! `cgroup.procs` of a [`CgroupJoin`] the container manager's cgroup backend opened (the
//! runtime never builds a cgroup path), so not one instruction of the workload runs outside its
//! cgroup. The child only calls write, which is async-signal-safe. Each container leads its own process group so a stop signal reaches
//! everything it started.
//!
//! A process qosd did not start (a container left running by a qosd that was killed) can be
//! adopted: [`AdoptedProcess`] holds a pidfd, which tells when the process has ended (its exit
//! status belongs to its real parent and cannot be known) and cannot be fooled by pid reuse.
//! The supervisor holds a [`PidFd`] for the children it starts too, so one [`ended`] poll
//! per tick finds the processes that exited, whatever the number of containers.
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::cgroup::CgroupJoin;

/// Errors starting or signalling a process.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("container has no command")]
    NoCommand,
    #[error("opening log file {path}: {source}")]
    Log {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("starting {program} (after joining {cgroups}): {source}")]
    Spawn {
        program: String,
        cgroups: String,
        #[source]
        source: std::io::Error,
    },
    #[error("signalling process group {pgid}: {source}")]
    Signal {
        pgid: i32,
        #[source]
        source: std::io::Error,
    },
    #[error("adopting process {pid} (pidfd_open): {source}")]
    Adopt {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
}

/// What to run and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Launch {
    /// `command` followed by `args`; the first element is the program.
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Where stdout and stderr go; `None` discards them.
    pub log_file: Option<PathBuf>,
}

/// Starts the process described by `launch` in the cgroups `join` opens.
pub fn spawn(launch: &Launch, join: &CgroupJoin) -> Result<Child, ProcessError> {
    let (program, args) = launch.argv.split_first().ok_or(ProcessError::NoCommand)?;
    // Valid until `join` is dropped, after the spawn (the child has its own copies).
    let procs = join.raw_fds();
    let (stdout, stderr) = match &launch.log_file {
        Some(path) => {
            let file = open_log(path)?;
            let copy = file.try_clone().map_err(|source| ProcessError::Log {
                path: path.clone(),
                source,
            })?;
            (Stdio::from(file), Stdio::from(copy))
        }
        None => (Stdio::null(), Stdio::null()),
    };
    let mut command = Command::new(program);
    command
        .args(args)
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .envs(launch.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0);
    // SAFETY: the closure runs in the forked child before exec and only calls write on
    // descriptors opened before the fork (inherited by the child); write is
    // async-signal-safe.
    unsafe {
        command.pre_exec(move || join_cgroups(&procs));
    }
    command.spawn().map_err(|source| ProcessError::Spawn {
        program: program.clone(),
        cgroups: join.describe(),
        source,
    })
}

/// Moves the calling process into every cgroup (runs between fork and exec).
fn join_cgroups(procs: &[RawFd]) -> std::io::Result<()> {
    for &fd in procs {
        // SAFETY: writes one byte from a static buffer to a descriptor the parent opened for
        // writing and keeps open until the spawn returns.
        let written = unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) };
        if written != 1 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

fn open_log(path: &Path) -> Result<std::fs::File, ProcessError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ProcessError::Log {
            path: path.to_owned(),
            source,
        })?;
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| ProcessError::Log {
            path: path.to_owned(),
            source,
        })
}

/// Sends `signal` to the process group led by `pid`. A group that is already gone is fine.
pub fn signal_group(pid: u32, signal: i32) -> Result<(), ProcessError> {
    let pgid = i32::try_from(pid).unwrap_or(i32::MAX);
    // SAFETY: kill(2) with a negative pid signals a process group; no memory is involved.
    if unsafe { libc::kill(-pgid, signal) } != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::ESRCH) {
            return Err(ProcessError::Signal { pgid, source: err });
        }
    }
    Ok(())
}

/// A pidfd (`pidfd_open(2)`, Linux 5.3+): it becomes readable when its process ends, and
/// it keeps naming that process even if the pid is reused.
#[derive(Debug)]
pub struct PidFd(OwnedFd);

impl PidFd {
    /// Opens a pidfd for `pid`; a process that has ended but is not reaped yet (a zombie)
    /// still has one, which is readable at once.
    pub fn open(pid: u32) -> std::io::Result<Self> {
        let raw_pid = libc::pid_t::try_from(pid)
            .map_err(|_| std::io::Error::from_raw_os_error(libc::ESRCH))?;
        // SAFETY: pidfd_open(2) takes a pid and flags and returns a new fd or -1; no memory
        // is passed.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, raw_pid, 0) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = i32::try_from(fd).map_err(|_| std::io::Error::from_raw_os_error(libc::EBADF))?;
        // SAFETY: `fd` was just returned by pidfd_open and is owned by nobody else.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// True once the process has ended.
    pub fn has_exited(&self) -> std::io::Result<bool> {
        Ok(ended(&[self])?.first().copied().unwrap_or(false))
    }
}

/// Which of `pidfds` have ended, asked in one `poll(2)` that does not block: what lets the
/// supervisor reap only the processes that exited instead of calling `wait4` on each.
pub fn ended(pidfds: &[&PidFd]) -> std::io::Result<Vec<bool>> {
    let mut polls: Vec<libc::pollfd> = pidfds
        .iter()
        .map(|fd| libc::pollfd {
            fd: fd.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let count = libc::nfds_t::try_from(polls.len())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    // SAFETY: `polls` is a live array of `count` pollfds; timeout 0 never blocks.
    let ready = unsafe { libc::poll(polls.as_mut_ptr(), count, 0) };
    if ready < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(polls.iter().map(|p| p.revents != 0).collect())
}

/// A running process that qosd did not start, watched through a pidfd.
#[derive(Debug)]
pub struct AdoptedProcess {
    pid: u32,
    pidfd: PidFd,
}

impl AdoptedProcess {
    /// Opens a pidfd for `pid` (Linux 5.3+). Fails if the process does not exist.
    pub fn adopt(pid: u32) -> Result<Self, ProcessError> {
        let pidfd = PidFd::open(pid).map_err(|source| ProcessError::Adopt { pid, source })?;
        Ok(Self { pid, pidfd })
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The pidfd that tells when the process has ended.
    #[must_use]
    pub fn pidfd(&self) -> &PidFd {
        &self.pidfd
    }

    /// True once the process has ended (a pidfd becomes readable when it does).
    pub fn has_exited(&self) -> std::io::Result<bool> {
        self.pidfd.has_exited()
    }
}

/// Among `pids`, the one that leads its own process group (how [`spawn`] starts every
/// container), lowest first; `None` when no process in the list leads a group.
#[must_use]
pub fn group_leader(pids: &[u32]) -> Option<u32> {
    pids.iter().copied().find(|&pid| {
        let Ok(raw) = libc::pid_t::try_from(pid) else {
            return false;
        };
        // SAFETY: getpgid(2) takes a pid and returns its process group or -1.
        unsafe { libc::getpgid(raw) == raw }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_argv_with_env_and_logs_output() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("logs/c.log");
        let launch = Launch {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo \"$GREETING\"; echo err >&2".into(),
            ],
            env: vec![("GREETING".into(), "hello".into())],
            log_file: Some(log.clone()),
        };
        let status = spawn(&launch, &CgroupJoin::none())
            .expect("spawn")
            .wait()
            .expect("wait");
        assert!(status.success());
        assert_eq!(std::fs::read_to_string(log).expect("log"), "hello\nerr\n");
    }

    #[test]
    fn failing_to_join_a_cgroup_fails_the_start() {
        let launch = Launch {
            argv: vec!["/bin/true".into()],
            env: Vec::new(),
            log_file: None,
        };
        // Every write to /dev/full fails (ENOSPC), as a write to a cgroup.procs the kernel
        // refuses would.
        let full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let join = CgroupJoin::new(vec![(PathBuf::from("/dev/full"), OwnedFd::from(full))]);
        let err = spawn(&launch, &join).expect_err("cannot join");
        assert!(err.to_string().contains("/bin/true"), "{err}");
        assert!(err.to_string().contains("/dev/full"), "{err}");
    }

    #[test]
    fn empty_argv_is_an_error() {
        let launch = Launch {
            argv: Vec::new(),
            env: Vec::new(),
            log_file: None,
        };
        assert!(matches!(
            spawn(&launch, &CgroupJoin::none()),
            Err(ProcessError::NoCommand)
        ));
    }

    #[test]
    fn signal_reaches_the_whole_group() {
        let launch = Launch {
            argv: vec!["/bin/sh".into(), "-c".into(), "sleep 30 & wait".into()],
            env: Vec::new(),
            log_file: None,
        };
        let mut child = spawn(&launch, &CgroupJoin::none()).expect("spawn");
        std::thread::sleep(std::time::Duration::from_millis(100));
        signal_group(child.id(), libc::SIGKILL).expect("signal");
        let status = child.wait().expect("wait");
        assert!(!status.success());
        // Signalling a group that is gone is not an error.
        signal_group(child.id(), libc::SIGTERM).expect("gone group");
    }
}

#[cfg(test)]
mod adopt_tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn one_poll_tells_which_processes_ended() {
        let run = |script: &str| Launch {
            argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
            env: Vec::new(),
            log_file: None,
        };
        let mut quick = spawn(&run("exit 3"), &CgroupJoin::none()).expect("spawn");
        let mut slow = spawn(&run("sleep 30"), &CgroupJoin::none()).expect("spawn");
        let quick_fd = PidFd::open(quick.id()).expect("pidfd_open");
        let slow_fd = PidFd::open(slow.id()).expect("pidfd_open");
        let deadline = Instant::now() + Duration::from_secs(5);
        let ready = loop {
            let ready = ended(&[&slow_fd, &quick_fd]).expect("poll");
            if ready[1] || Instant::now() > deadline {
                break ready;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        assert_eq!(ready, vec![false, true], "only the exited process is ready");
        // Readiness does not reap: the exit status is still there for wait4.
        assert_eq!(quick.wait().expect("wait").code(), Some(3));
        assert!(ended(&[]).expect("poll of nothing").is_empty());
        signal_group(slow.id(), libc::SIGKILL).expect("kill");
        slow.wait().expect("wait");
        assert!(slow_fd.has_exited().expect("poll"));
    }

    #[test]
    fn an_adopted_process_is_seen_to_exit_and_leads_its_group() {
        let launch = Launch {
            argv: vec!["/bin/sh".into(), "-c".into(), "sleep 0.3".into()],
            env: Vec::new(),
            log_file: None,
        };
        let mut child = spawn(&launch, &CgroupJoin::none()).expect("spawn");
        let pid = child.id();
        assert_eq!(group_leader(&[1_000_000_000, pid]), Some(pid));
        let adopted = AdoptedProcess::adopt(pid).expect("pidfd_open");
        assert_eq!(adopted.pid(), pid);
        assert!(!adopted.has_exited().expect("poll"), "still running");
        // Our own child: reap it so it does not linger as a zombie (a pidfd reports exit
        // either way).
        child.wait().expect("wait");
        let deadline = Instant::now() + Duration::from_secs(5);
        while !adopted.has_exited().expect("poll") {
            assert!(Instant::now() < deadline, "exit not reported");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(
            AdoptedProcess::adopt(pid).is_err(),
            "gone processes cannot be adopted"
        );
    }
}
