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

use crate::cgroup::{CgroupError, CgroupJoin, Placement};

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
    #[error("placing {program} in its cgroup before exec: {source}")]
    Placement {
        program: String,
        #[source]
        source: CgroupError,
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

/// Starts the process described by `launch` in the cgroups `join` opens; where `join` has a
/// placement, the child waits before exec until the placement has put it in its cgroup.
pub fn spawn(launch: &Launch, mut join: CgroupJoin) -> Result<Child, ProcessError> {
    let (program, args) = launch.argv.split_first().ok_or(ProcessError::NoCommand)?;
    // Valid until `join` is dropped, after the spawn (the child has its own copies).
    let procs = join.raw_fds();
    let described = join.describe();
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
    let spawn_error = |source| ProcessError::Spawn {
        program: program.clone(),
        cgroups: described.clone(),
        source,
    };
    let Some(placement) = join.take_placement() else {
        // SAFETY: the closure runs in the forked child before exec and only calls write on
        // descriptors opened before the fork (inherited by the child); write is
        // async-signal-safe.
        unsafe {
            command.pre_exec(move || join_cgroups(&procs));
        }
        return command.spawn().map_err(spawn_error);
    };
    let handshake = Handshake::new().map_err(spawn_error)?;
    let (parent, child) = handshake.split();
    let parent_write = parent.go.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec and only calls close, write,
    // getpid and read on descriptors opened before the fork; all are async-signal-safe.
    unsafe {
        command.pre_exec(move || {
            child.wait_for_placement(parent_write)?;
            join_cgroups(&procs)
        });
    }
    std::thread::scope(|scope| {
        let placer = scope.spawn(move || parent.place(placement));
        let spawned = command.spawn();
        // The child's ends close with the command: a child that died before sending its pid
        // ends the placer's read.
        drop(command);
        let placed = placer
            .join()
            .unwrap_or_else(|_| Err(PlacementFailed::Panicked));
        match (spawned, placed) {
            (Ok(child), Ok(())) => Ok(child),
            (_, Err(PlacementFailed::Cgroup(source))) => Err(ProcessError::Placement {
                program: program.clone(),
                source,
            }),
            (Err(source), _) => Err(spawn_error(source)),
            (Ok(mut child), Err(e)) => {
                // The child ran exec without its placement: it cannot be left running.
                let _ = child.kill();
                let _ = child.wait();
                Err(spawn_error(std::io::Error::other(e.to_string())))
            }
        }
    })
}

/// Why a placement did not happen.
#[derive(Debug, thiserror::Error)]
enum PlacementFailed {
    #[error(transparent)]
    Cgroup(CgroupError),
    #[error("the child ended before it sent its pid")]
    NoPid,
    #[error("the placement thread panicked")]
    Panicked,
}

/// Two pipes between qosd and a child that waits before exec: the child sends its pid, qosd
/// answers one byte once the child is placed (or closes its end if it could not be).
struct Handshake {
    pid: (OwnedFd, OwnedFd),
    go: (OwnedFd, OwnedFd),
}

/// qosd's ends: read the pid, write the go-ahead.
struct ParentEnds {
    pid: OwnedFd,
    go: OwnedFd,
}

/// The child's ends: write the pid, read the go-ahead.
struct ChildEnds {
    pid: OwnedFd,
    go: OwnedFd,
}

impl Handshake {
    fn new() -> std::io::Result<Self> {
        Ok(Self {
            pid: pipe()?,
            go: pipe()?,
        })
    }

    fn split(self) -> (ParentEnds, ChildEnds) {
        (
            ParentEnds {
                pid: self.pid.0,
                go: self.go.1,
            },
            ChildEnds {
                pid: self.pid.1,
                go: self.go.0,
            },
        )
    }
}

impl ParentEnds {
    /// Reads the child's pid, places it, and lets it go on (or, on failure, closes the
    /// go-ahead so its wait ends with an error and it never execs).
    fn place(self, placement: Box<dyn Placement>) -> Result<(), PlacementFailed> {
        let mut bytes = [0u8; 4];
        if !read_exact(self.pid.as_raw_fd(), &mut bytes) {
            return Err(PlacementFailed::NoPid);
        }
        let pid = u32::from_ne_bytes(bytes);
        placement.place(pid).map_err(PlacementFailed::Cgroup)?;
        // SAFETY: writes one byte from a static buffer to the pipe this struct owns.
        let written = unsafe { libc::write(self.go.as_raw_fd(), b"1".as_ptr().cast(), 1) };
        if written == 1 {
            Ok(())
        } else {
            Err(PlacementFailed::NoPid)
        }
    }
}

impl ChildEnds {
    /// In the child between fork and exec: drops its copy of qosd's write end (so qosd
    /// closing its own is seen), sends the pid, waits for the go-ahead.
    fn wait_for_placement(&self, parent_write: RawFd) -> std::io::Result<()> {
        // SAFETY: close(2), getpid(2), write(2) and read(2) on descriptors inherited from
        // the parent and a stack buffer; all async-signal-safe.
        unsafe {
            libc::close(parent_write);
            let pid = libc::getpid().to_ne_bytes();
            if libc::write(self.pid.as_raw_fd(), pid.as_ptr().cast(), pid.len()) != 4 {
                return Err(std::io::Error::last_os_error());
            }
        }
        let mut go = [0u8; 1];
        if read_exact(self.go.as_raw_fd(), &mut go) {
            Ok(())
        } else {
            Err(std::io::Error::from_raw_os_error(libc::ECANCELED))
        }
    }
}

/// A close-on-exec pipe: (read end, write end).
fn pipe() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: pipe2(2) fills the two-element array with new descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors were just created and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Reads exactly `buffer.len()` bytes (retrying interrupted reads); false at end of file or
/// on an error. Async-signal-safe (read(2) only).
fn read_exact(fd: RawFd, buffer: &mut [u8]) -> bool {
    let mut filled = 0;
    while filled < buffer.len() {
        // SAFETY: reads into the unfilled tail of `buffer`, which outlives the call.
        let n = unsafe {
            libc::read(
                fd,
                buffer[filled..].as_mut_ptr().cast(),
                buffer.len() - filled,
            )
        };
        match n {
            n if n > 0 => filled += usize::try_from(n).unwrap_or(0),
            // SAFETY: reads the calling thread's errno.
            -1 if unsafe { *libc::__errno_location() } == libc::EINTR => {}
            _ => return false,
        }
    }
    true
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

/// The value of variable `name` in the environment process `pid` was started with
/// (`/proc/<pid>/environ`); `None` when it has none.
pub fn environ_var(pid: u32, name: &str) -> std::io::Result<Option<String>> {
    let environ = std::fs::read(format!("/proc/{pid}/environ"))?;
    Ok(environ.split(|b| *b == 0).find_map(|entry| {
        entry
            .strip_prefix(name.as_bytes())
            .and_then(|rest| rest.strip_prefix(b"="))
            .map(|value| String::from_utf8_lossy(value).into_owned())
    }))
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
        let status = spawn(&launch, CgroupJoin::none())
            .expect("spawn")
            .wait()
            .expect("wait");
        assert!(status.success());
        assert_eq!(std::fs::read_to_string(log).expect("log"), "hello\nerr\n");
    }

    #[test]
    fn environ_var_reads_what_the_process_was_started_with() {
        let launch = Launch {
            argv: vec!["/bin/sleep".into(), "5".into()],
            env: vec![
                ("QOSD_TEST_A".into(), "one=two".into()),
                ("QOSD_TEST_AB".into(), "three".into()),
            ],
            log_file: None,
        };
        let mut child = spawn(&launch, CgroupJoin::none()).expect("spawn");
        let pid = child.id();
        let read = |name: &str| environ_var(pid, name).expect("environ");
        // Read after the exec: until then /proc shows the parent's environment.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while read("QOSD_TEST_A").is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "never saw the variable"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(read("QOSD_TEST_A").as_deref(), Some("one=two"));
        assert_eq!(read("QOSD_TEST_AB").as_deref(), Some("three"));
        assert_eq!(
            read("QOSD_TEST"),
            None,
            "a prefix of a name is not the name"
        );
        let _ = child.kill();
        let _ = child.wait();
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
        let err = spawn(&launch, join).expect_err("cannot join");
        assert!(err.to_string().contains("/bin/true"), "{err}");
        assert!(err.to_string().contains("/dev/full"), "{err}");
    }

    /// A placement that looks at the child while it waits: it has not run exec yet (its
    /// command line is still this test binary's), and it only runs after `place` returned.
    struct Recording {
        seen: std::sync::mpsc::Sender<(u32, String)>,
        fail: bool,
    }

    impl Placement for Recording {
        fn place(self: Box<Self>, pid: u32) -> Result<(), CgroupError> {
            let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            let _ = self.seen.send((pid, exe));
            if self.fail {
                return Err(CgroupError::NoHierarchy {
                    what: "refused by the test".to_owned(),
                });
            }
            Ok(())
        }

        fn describe(&self) -> String {
            "a recording placement".to_owned()
        }
    }

    #[test]
    fn a_placed_child_waits_before_exec_until_it_is_placed() {
        let (seen, placements) = std::sync::mpsc::channel();
        let launch = Launch {
            argv: vec!["/bin/sh".into(), "-c".into(), "exit 7".into()],
            env: Vec::new(),
            log_file: None,
        };
        let join = CgroupJoin::placed_by(Box::new(Recording { seen, fail: false }));
        let mut child = spawn(&launch, join).expect("spawn");
        let (pid, exe) = placements.recv().expect("placed");
        assert_eq!(pid, child.id(), "the placement got the child's pid");
        let ours = std::fs::read_link("/proc/self/exe").expect("own exe");
        assert_eq!(exe, ours.display().to_string(), "placed before exec");
        assert_eq!(child.wait().expect("wait").code(), Some(7));
    }

    #[test]
    fn a_failed_placement_fails_the_start_and_runs_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let marker = dir.path().join("ran");
        let (seen, placements) = std::sync::mpsc::channel();
        let launch = Launch {
            argv: vec![
                "/bin/sh".into(),
                "-c".into(),
                format!("touch {}", marker.display()),
            ],
            env: Vec::new(),
            log_file: None,
        };
        let join = CgroupJoin::placed_by(Box::new(Recording { seen, fail: true }));
        let err = spawn(&launch, join).expect_err("placement refused");
        assert!(matches!(err, ProcessError::Placement { .. }), "{err}");
        assert!(err.to_string().contains("refused by the test"), "{err}");
        assert!(placements.recv().is_ok());
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!marker.exists(), "the command ran without its placement");
    }

    #[test]
    fn empty_argv_is_an_error() {
        let launch = Launch {
            argv: Vec::new(),
            env: Vec::new(),
            log_file: None,
        };
        assert!(matches!(
            spawn(&launch, CgroupJoin::none()),
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
        let mut child = spawn(&launch, CgroupJoin::none()).expect("spawn");
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
        let mut quick = spawn(&run("exit 3"), CgroupJoin::none()).expect("spawn");
        let mut slow = spawn(&run("sleep 30"), CgroupJoin::none()).expect("spawn");
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
        let mut child = spawn(&launch, CgroupJoin::none()).expect("spawn");
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
