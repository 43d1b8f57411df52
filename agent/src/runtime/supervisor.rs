//! Keeps containers running according to their restart policy and stops them gracefully.
//!
//! The supervisor is driven by [`Supervisor::tick`], called periodically by the container
//! manager: it reaps exits, restarts containers when their back-off has passed, and escalates
//! a stop from SIGTERM to SIGKILL when the grace period is over. Nothing blocks.
//!
//! A container left running by an earlier qosd can be adopted ([`Supervisor::adopt`]): it is
//! watched, stopped and restarted like one this supervisor started, except that its exit
//! status cannot be known (it is not our child), so its end counts as a failure with
//! [`UNKNOWN_EXIT_CODE`].
use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use super::backoff::Backoff;
use super::process::{self, AdoptedProcess, Launch, PidFd};
use crate::cgroup::{CgroupJoiner, CgroupName};

/// The exit code recorded for an adopted process, whose real status went to its parent:
/// kubelet's code for a container whose status is unknown (`ContainerStatusUnknown`).
pub const UNKNOWN_EXIT_CODE: i32 = 137;

/// Identifies a container: its pod's uid and its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerKey {
    pub pod_uid: String,
    pub container: String,
}

/// kubelet's restart policies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RestartPolicy {
    Always,
    OnFailure,
    Never,
}

/// Everything needed to run one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSpec {
    pub launch: Launch,
    /// The container's cgroup, opened through the manager's [`CgroupJoiner`] at each start.
    pub cgroup: CgroupName,
    pub restart_policy: RestartPolicy,
    /// `terminationGracePeriodSeconds`.
    pub grace: Duration,
}

/// What a container is doing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ContainerState {
    Running {
        pid: u32,
    },
    /// Exited; restarts at `restart_at` (back-off).
    Waiting {
        last_exit: i32,
        restart_at: Instant,
    },
    /// Exited for good (policy says no restart).
    Terminated {
        exit_code: i32,
    },
    /// Being stopped: SIGTERM sent, SIGKILL at `kill_at`.
    Stopping {
        pid: u32,
        kill_at: Instant,
    },
    /// Could not be started; retried with back-off.
    StartFailed {
        error: String,
        retry_at: Instant,
    },
}

/// Something that happened during a tick, for logs and metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Started {
        key: ContainerKey,
        pid: u32,
    },
    /// A running process of an earlier qosd is supervised again.
    Adopted {
        key: ContainerKey,
        pid: u32,
    },
    Exited {
        key: ContainerKey,
        exit_code: i32,
    },
    StartFailed {
        key: ContainerKey,
        error: String,
    },
    Killed {
        key: ContainerKey,
    },
    Stopped {
        key: ContainerKey,
    },
}

impl Event {
    /// The container the event is about.
    #[must_use]
    pub fn key(&self) -> &ContainerKey {
        match self {
            Self::Started { key, .. }
            | Self::Adopted { key, .. }
            | Self::Exited { key, .. }
            | Self::StartFailed { key, .. }
            | Self::Killed { key }
            | Self::Stopped { key } => key,
        }
    }
}

/// The process of a running container.
enum Running {
    /// Started by this supervisor; the pidfd is `None` where the kernel has no `pidfd_open`
    /// (the child is then asked with `wait4` every tick).
    Child(Child, Option<PidFd>),
    Adopted(AdoptedProcess),
}

impl Running {
    /// The pidfd that tells when the process ended, if there is one.
    fn pidfd(&self) -> Option<&PidFd> {
        match self {
            Self::Child(_, pidfd) => pidfd.as_ref(),
            Self::Adopted(adopted) => Some(adopted.pidfd()),
        }
    }
}

struct Entry {
    spec: ContainerSpec,
    child: Option<Running>,
    state: ContainerState,
    restarts: u32,
    started_at: Instant,
    stop_requested: bool,
}

/// The set of supervised containers.
pub struct Supervisor {
    entries: BTreeMap<ContainerKey, Entry>,
    backoff: Backoff,
}

impl Supervisor {
    #[must_use]
    pub fn new(backoff: Backoff) -> Self {
        Self {
            entries: BTreeMap::new(),
            backoff,
        }
    }

    /// Starts the container if it is not supervised yet. A container being stopped is left
    /// alone (the caller waits for [`Event::Stopped`] before starting it again).
    pub fn ensure(
        &mut self,
        key: &ContainerKey,
        spec: &ContainerSpec,
        cgroups: &dyn CgroupJoiner,
    ) -> Option<Event> {
        if self.entries.contains_key(key) {
            return None;
        }
        let now = Instant::now();
        let mut entry = Entry {
            spec: spec.clone(),
            child: None,
            state: ContainerState::Waiting {
                last_exit: 0,
                restart_at: now,
            },
            restarts: 0,
            started_at: now,
            stop_requested: false,
        };
        let event = start(key, &mut entry, self.backoff, cgroups);
        self.entries.insert(key.clone(), entry);
        Some(event)
    }

    /// Supervises a container whose process `pid` is already running (started by an earlier
    /// qosd). `None` when the container is supervised already.
    pub fn adopt(
        &mut self,
        key: &ContainerKey,
        spec: &ContainerSpec,
        pid: u32,
    ) -> Option<Result<Event, process::ProcessError>> {
        if self.entries.contains_key(key) {
            return None;
        }
        let adopted = match AdoptedProcess::adopt(pid) {
            Ok(adopted) => adopted,
            Err(e) => return Some(Err(e)),
        };
        let entry = Entry {
            spec: spec.clone(),
            child: Some(Running::Adopted(adopted)),
            state: ContainerState::Running { pid },
            restarts: 0,
            started_at: Instant::now(),
            stop_requested: false,
        };
        self.entries.insert(key.clone(), entry);
        Some(Ok(Event::Adopted {
            key: key.clone(),
            pid,
        }))
    }

    /// The spec a container was started with.
    #[must_use]
    pub fn spec(&self, key: &ContainerKey) -> Option<&ContainerSpec> {
        self.entries.get(key).map(|e| &e.spec)
    }

    /// Begins a graceful stop: SIGTERM to the container's process group now, SIGKILL when its
    /// grace period has passed. A container that is not running is removed at the next tick.
    pub fn stop(&mut self, key: &ContainerKey) {
        let Some(entry) = self.entries.get_mut(key) else {
            return;
        };
        if entry.stop_requested {
            return;
        }
        entry.stop_requested = true;
        if let ContainerState::Running { pid } = entry.state {
            if let Err(e) = process::signal_group(pid, libc::SIGTERM) {
                tracing::warn!(pod_uid = %key.pod_uid, container = %key.container, error = %e, "SIGTERM");
            }
            entry.state = ContainerState::Stopping {
                pid,
                kill_at: Instant::now() + entry.spec.grace,
            };
        }
    }

    /// Reaps, restarts (joining the cgroups through `cgroups`), escalates stops. Returns what
    /// happened.
    pub fn tick(&mut self, cgroups: &dyn CgroupJoiner) -> Vec<Event> {
        let now = Instant::now();
        let mut events = Vec::new();
        let mut gone = Vec::new();
        let may_have_ended = self.may_have_ended();
        for ((key, entry), may_have_ended) in self.entries.iter_mut().zip(may_have_ended) {
            if let Some(exit_code) = may_have_ended.then(|| reap(entry)).flatten() {
                events.push(Event::Exited {
                    key: key.clone(),
                    exit_code,
                });
                let ran = now.saturating_duration_since(entry.started_at);
                if self.backoff.resets(ran) {
                    entry.restarts = 0;
                }
                entry.state = if entry.stop_requested {
                    ContainerState::Terminated { exit_code }
                } else if restarts(entry.spec.restart_policy, exit_code) {
                    let restart_at = now + self.backoff.delay(entry.restarts);
                    ContainerState::Waiting {
                        last_exit: exit_code,
                        restart_at,
                    }
                } else {
                    ContainerState::Terminated { exit_code }
                };
            }
            match entry.state.clone() {
                ContainerState::Stopping { pid, kill_at } if now >= kill_at => {
                    if let Err(e) = process::signal_group(pid, libc::SIGKILL) {
                        tracing::warn!(pod_uid = %key.pod_uid, container = %key.container, error = %e, "SIGKILL");
                    }
                    events.push(Event::Killed { key: key.clone() });
                    // Checked again at the next tick; SIGKILL cannot be ignored.
                    entry.state = ContainerState::Stopping {
                        pid,
                        kill_at: now + Duration::from_secs(3600),
                    };
                }
                ContainerState::Waiting { restart_at, .. }
                | ContainerState::StartFailed {
                    retry_at: restart_at,
                    ..
                } if !entry.stop_requested && now >= restart_at => {
                    entry.restarts = entry.restarts.saturating_add(1);
                    events.push(start(key, entry, self.backoff, cgroups));
                }
                _ => {}
            }
            if entry.stop_requested && entry.child.is_none() {
                gone.push(key.clone());
            }
        }
        for key in gone {
            self.entries.remove(&key);
            events.push(Event::Stopped { key });
        }
        events
    }

    /// Per entry (in the map's order): whether its process may have ended and must be reaped.
    /// One `poll(2)` over every pidfd answers for all of them; a process without a pidfd, or
    /// a failed poll, means "ask it".
    fn may_have_ended(&self) -> Vec<bool> {
        let pidfds: Vec<&PidFd> = self
            .entries
            .values()
            .filter_map(|e| e.child.as_ref()?.pidfd())
            .collect();
        let mut ended = match process::ended(&pidfds) {
            Ok(ended) => ended.into_iter(),
            Err(e) => {
                tracing::warn!(error = %e, "polling container pidfds; asking each process");
                return vec![true; self.entries.len()];
            }
        };
        self.entries
            .values()
            .map(|e| match e.child.as_ref() {
                None => false,
                Some(running) if running.pidfd().is_some() => ended.next().unwrap_or(true),
                Some(_) => true,
            })
            .collect()
    }

    /// The state of a supervised container.
    #[must_use]
    pub fn state(&self, key: &ContainerKey) -> Option<&ContainerState> {
        self.entries.get(key).map(|e| &e.state)
    }

    /// Number of times the container was restarted.
    #[must_use]
    pub fn restart_count(&self, key: &ContainerKey) -> u32 {
        self.entries.get(key).map_or(0, |e| e.restarts)
    }

    /// Keys of every supervised container.
    pub fn keys(&self) -> impl Iterator<Item = &ContainerKey> {
        self.entries.keys()
    }

    /// True when nothing is supervised any more.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// kubelet's rule: Always restarts every exit, OnFailure non-zero exits, Never none.
fn restarts(policy: RestartPolicy, exit_code: i32) -> bool {
    match policy {
        RestartPolicy::Always => true,
        RestartPolicy::OnFailure => exit_code != 0,
        RestartPolicy::Never => false,
    }
}

fn start(
    key: &ContainerKey,
    entry: &mut Entry,
    backoff: Backoff,
    cgroups: &dyn CgroupJoiner,
) -> Event {
    let spawned = cgroups
        .join(&entry.spec.cgroup)
        .map_err(|e| e.to_string())
        .and_then(|join| process::spawn(&entry.spec.launch, join).map_err(|e| e.to_string()));
    match spawned {
        Ok(child) => {
            let pid = child.id();
            let pidfd = PidFd::open(pid)
                .inspect_err(|e| {
                    tracing::debug!(pid, error = %e, "no pidfd; the process is polled with wait4");
                })
                .ok();
            entry.child = Some(Running::Child(child, pidfd));
            entry.started_at = Instant::now();
            entry.state = ContainerState::Running { pid };
            Event::Started {
                key: key.clone(),
                pid,
            }
        }
        Err(error) => {
            entry.state = ContainerState::StartFailed {
                error: error.clone(),
                retry_at: Instant::now() + backoff.delay(entry.restarts),
            };
            Event::StartFailed {
                key: key.clone(),
                error,
            }
        }
    }
}

/// Collects the exit status if the process has ended: the exit code, or 128 + signal
/// ([`UNKNOWN_EXIT_CODE`] for an adopted process).
fn reap(entry: &mut Entry) -> Option<i32> {
    let child = match entry.child.as_mut()? {
        Running::Child(child, _) => child,
        Running::Adopted(adopted) => {
            return match adopted.has_exited() {
                Ok(true) => {
                    entry.child = None;
                    Some(UNKNOWN_EXIT_CODE)
                }
                Ok(false) => None,
                Err(e) => {
                    tracing::warn!(pid = adopted.pid(), error = %e, "watching an adopted container process");
                    None
                }
            };
        }
    };
    match child.try_wait() {
        Ok(Some(status)) => {
            entry.child = None;
            use std::os::unix::process::ExitStatusExt as _;
            Some(
                status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0)),
            )
        }
        Ok(None) => None,
        Err(e) => {
            tracing::warn!(error = %e, "waiting for a container process");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{CgroupError, CgroupJoin};

    /// Starts processes where the test runs (no cgroup).
    struct Here;

    impl CgroupJoiner for Here {
        fn join(&self, _: &CgroupName) -> Result<CgroupJoin, CgroupError> {
            Ok(CgroupJoin::none())
        }
    }

    /// A cgroup that cannot be joined.
    struct Gone;

    impl CgroupJoiner for Gone {
        fn join(&self, name: &CgroupName) -> Result<CgroupJoin, CgroupError> {
            Err(CgroupError::Missing {
                name: name.to_string(),
                path: "/nonexistent/cgroup.procs".into(),
            })
        }
    }

    fn spec(script: &str, policy: RestartPolicy, grace_ms: u64) -> ContainerSpec {
        ContainerSpec {
            launch: Launch {
                argv: vec!["/bin/sh".into(), "-c".into(), script.into()],
                env: Vec::new(),
                log_file: None,
            },
            cgroup: CgroupName::root(),
            restart_policy: policy,
            grace: Duration::from_millis(grace_ms),
        }
    }

    fn fast() -> Backoff {
        Backoff {
            initial: Duration::from_millis(20),
            max: Duration::from_millis(80),
            reset_after: Duration::from_secs(600),
        }
    }

    fn key(name: &str) -> ContainerKey {
        ContainerKey {
            pod_uid: "uid".into(),
            container: name.into(),
        }
    }

    /// Ticks until `done` holds or two seconds pass; returns all events.
    fn tick_until(
        s: &mut Supervisor,
        mut done: impl FnMut(&Supervisor, &[Event]) -> bool,
    ) -> Vec<Event> {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut all = Vec::new();
        while Instant::now() < deadline {
            all.extend(s.tick(&Here));
            if done(s, &all) {
                return all;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("condition not reached; events: {all:?}");
    }

    #[test]
    fn always_restarts_with_backoff() {
        let mut s = Supervisor::new(fast());
        s.ensure(
            &key("c"),
            &spec("exit 0", RestartPolicy::Always, 100),
            &Here,
        );
        tick_until(&mut s, |s, _| s.restart_count(&key("c")) >= 3);
    }

    #[test]
    fn on_failure_restarts_only_failures() {
        let mut s = Supervisor::new(fast());
        s.ensure(
            &key("ok"),
            &spec("exit 0", RestartPolicy::OnFailure, 100),
            &Here,
        );
        s.ensure(
            &key("bad"),
            &spec("exit 3", RestartPolicy::OnFailure, 100),
            &Here,
        );
        tick_until(&mut s, |s, _| s.restart_count(&key("bad")) >= 2);
        assert_eq!(
            s.state(&key("ok")),
            Some(&ContainerState::Terminated { exit_code: 0 })
        );
        assert_eq!(s.restart_count(&key("ok")), 0);
    }

    #[test]
    fn never_keeps_the_exit_code() {
        let mut s = Supervisor::new(fast());
        s.ensure(&key("c"), &spec("exit 7", RestartPolicy::Never, 100), &Here);
        tick_until(&mut s, |s, _| {
            s.state(&key("c")) == Some(&ContainerState::Terminated { exit_code: 7 })
        });
    }

    #[test]
    fn stop_sends_sigterm_first() {
        let mut s = Supervisor::new(fast());
        // The trap exits 42 on SIGTERM: seeing 42 proves SIGTERM, not SIGKILL, ended it.
        s.ensure(
            &key("c"),
            &spec(
                "trap 'exit 42' TERM; while :; do sleep 0.01; done",
                RestartPolicy::Always,
                5000,
            ),
            &Here,
        );
        std::thread::sleep(Duration::from_millis(100));
        s.stop(&key("c"));
        let events = tick_until(&mut s, |s, _| s.is_empty());
        assert!(
            events.contains(&Event::Exited {
                key: key("c"),
                exit_code: 42
            }),
            "{events:?}"
        );
        assert!(
            !events.iter().any(|e| matches!(e, Event::Killed { .. })),
            "{events:?}"
        );
        assert!(events.contains(&Event::Stopped { key: key("c") }));
    }

    #[test]
    fn stop_escalates_to_sigkill_after_the_grace_period() {
        let mut s = Supervisor::new(fast());
        s.ensure(
            &key("c"),
            &spec(
                "trap '' TERM; while :; do sleep 0.01; done",
                RestartPolicy::Always,
                200,
            ),
            &Here,
        );
        std::thread::sleep(Duration::from_millis(100));
        let asked = Instant::now();
        s.stop(&key("c"));
        let events = tick_until(&mut s, |s, _| s.is_empty());
        assert!(
            asked.elapsed() >= Duration::from_millis(200),
            "killed before the grace period"
        );
        assert!(
            events.contains(&Event::Killed { key: key("c") }),
            "{events:?}"
        );
        assert!(
            events.contains(&Event::Exited {
                key: key("c"),
                exit_code: 128 + libc::SIGKILL
            }),
            "{events:?}"
        );
    }

    #[test]
    fn an_adopted_process_is_stopped_and_restarted_like_a_started_one() {
        // Someone else's process (here: spawned directly, outside the supervisor), leading its
        // own process group as qosd's containers do.
        let orphan = spec(
            "trap 'exit 0' TERM; while :; do sleep 0.01; done",
            RestartPolicy::Always,
            5000,
        );
        let mut child = process::spawn(&orphan.launch, CgroupJoin::none()).expect("spawn");
        let pid = child.id();
        let mut s = Supervisor::new(fast());
        let event = s
            .adopt(&key("c"), &orphan, pid)
            .expect("not supervised yet");
        assert_eq!(event.expect("pidfd"), Event::Adopted { key: key("c"), pid });
        assert_eq!(s.state(&key("c")), Some(&ContainerState::Running { pid }));
        assert!(s.adopt(&key("c"), &orphan, pid).is_none(), "adopted once");

        // It ends (killed from outside): the supervisor notices, counts an unknown exit and
        // restarts the container as its own child under the restart policy.
        process::signal_group(pid, libc::SIGKILL).expect("kill");
        child.wait().expect("reap our test child");
        let events = tick_until(&mut s, |s, _| s.restart_count(&key("c")) >= 1);
        assert!(
            events.contains(&Event::Exited {
                key: key("c"),
                exit_code: UNKNOWN_EXIT_CODE
            }),
            "{events:?}"
        );
        let restarted = match s.state(&key("c")) {
            Some(ContainerState::Running { pid }) => *pid,
            other => panic!("not running again: {other:?}"),
        };
        assert_ne!(restarted, pid);
        s.stop(&key("c"));
        tick_until(&mut s, |s, _| s.is_empty());
    }

    #[test]
    fn a_failed_start_is_reported_and_retried() {
        let mut s = Supervisor::new(fast());
        let mut bad = spec("true", RestartPolicy::Always, 100);
        bad.launch.argv = vec!["/nonexistent/qosd-binary".into()];
        let first = s.ensure(&key("c"), &bad, &Here);
        assert!(
            matches!(first, Some(Event::StartFailed { .. })),
            "{first:?}"
        );
        let events = tick_until(&mut s, |_, ev| {
            ev.iter()
                .filter(|e| matches!(e, Event::StartFailed { .. }))
                .count()
                >= 2
        });
        assert!(!events.is_empty());
    }

    #[test]
    fn a_cgroup_that_cannot_be_joined_fails_the_start_naming_it() {
        let mut s = Supervisor::new(fast());
        let mut in_pod = spec("true", RestartPolicy::Always, 100);
        in_pod.cgroup = CgroupName::parse_cgroupfs("/qosd/kubepods/podx/c").expect("name");
        match s.ensure(&key("c"), &in_pod, &Gone) {
            Some(Event::StartFailed { error, .. }) => {
                assert!(error.contains("/qosd/kubepods/podx/c"), "{error}");
            }
            other => panic!("started without its cgroup: {other:?}"),
        }
        assert!(matches!(
            s.state(&key("c")),
            Some(ContainerState::StartFailed { .. })
        ));
    }
}
