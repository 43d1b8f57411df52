//! Placing and watching workload processes: CPU affinity, waiting for the exec, reading the
//! kernel's per-process accounting files.
use std::time::Duration;

/// The highest-numbered CPU this process may use (away from CPU 0's housekeeping).
pub(crate) fn last_allowed_cpu() -> Result<usize, String> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid, writable cpu_set_t of the size passed.
    let rc = unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &raw mut set) };
    if rc != 0 {
        return Err(format!(
            "sched_getaffinity: {}",
            std::io::Error::last_os_error()
        ));
    }
    (0..libc::CPU_SETSIZE as usize)
        .rev()
        // SAFETY: `cpu` is below CPU_SETSIZE and `set` is initialised.
        .find(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .ok_or_else(|| "empty CPU affinity".to_owned())
}

/// Waits until the spawning shell `pid` has executed the workload (its `comm` is no longer
/// `sh`): under emulation an exec can take a while, and a workload not yet spinning would
/// leave the measuring window without contention.
pub(crate) fn wait_exec(pid: u32) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .map_err(|e| format!("/proc/{pid}/comm: {e}"))?;
        if comm.trim() != "sh" {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "process {pid} did not exec its workload within 20 s"
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until process `pid` is asleep: state `S` in `/proc/<pid>/stat` and no CPU time
/// (`/proc/<pid>/schedstat` field 1) added over 100 ms. A sleeper still starting up (its exec
/// and runtime set-up take a while under emulation) runs and waits like any task.
pub(crate) fn wait_asleep(pid: u32) -> Result<(), String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let ran = || -> Result<(char, u64), String> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map_err(|e| format!("/proc/{pid}/stat: {e}"))?;
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .and_then(|s| s.chars().next())
            .ok_or_else(|| format!("/proc/{pid}/stat: no state"))?;
        let schedstat = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
            .map_err(|e| format!("/proc/{pid}/schedstat: {e}"))?;
        let run = schedstat
            .split_whitespace()
            .next()
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("/proc/{pid}/schedstat: no run time"))?;
        Ok((state, run))
    };
    loop {
        let (state, before) = ran()?;
        std::thread::sleep(Duration::from_millis(100));
        let (state_after, after) = ran()?;
        if state == 'S' && state_after == 'S' && before == after {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(format!(
                "process {pid} did not settle asleep within 20 s (state {state_after}, {after} ns run)"
            ));
        }
    }
}

/// Pins process `pid` (and the threads it starts later) to `cpu`.
pub(crate) fn pin(pid: u32, cpu: usize) -> Result<(), String> {
    pin_to(pid, &[cpu])
}

/// Lets process `pid` (and the threads it starts later) run on `cpus` only.
pub(crate) fn pin_to(pid: u32, cpus: &[usize]) -> Result<(), String> {
    // SAFETY: cpu_set_t is plain data; zeroed is the empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        if cpu >= libc::CPU_SETSIZE as usize {
            return Err(format!("CPU {cpu} is beyond CPU_SETSIZE"));
        }
        // SAFETY: `cpu` is below CPU_SETSIZE.
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    let pid = i32::try_from(pid).map_err(|e| e.to_string())?;
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid is our own child.
    let rc = unsafe { libc::sched_setaffinity(pid, size_of::<libc::cpu_set_t>(), &raw const set) };
    if rc != 0 {
        return Err(format!(
            "sched_setaffinity({pid}, {cpus:?}): {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The CPU process `pid` last ran on (`/proc/<pid>/stat` field 39, `processor`).
pub(crate) fn last_cpu(pid: u32) -> Result<usize, String> {
    let path = format!("/proc/{pid}/stat");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
    // The command name (field 2) is in parentheses and may hold spaces: count after it.
    let after = text
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .ok_or_else(|| format!("{path}: no command name"))?;
    after
        .split_whitespace()
        .nth(36)
        .and_then(|f| f.parse().ok())
        .ok_or_else(|| format!("{path}: no processor field"))
}

/// The value of `key` in a `/proc/<pid>/…` file of `key: value` lines (`status`, `sched`),
/// the first number after the separator (`RssAnon:  65536 kB` gives 65536).
pub(crate) fn proc_value(pid: u32, file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        (name.trim() == key).then(|| value.split_whitespace().next()?.parse().ok())?
    })
}

/// A counter of `/proc/vmstat`.
pub(crate) fn vmstat(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/vmstat").ok()?;
    text.lines().find_map(|line| {
        let (name, value) = line.split_once(' ')?;
        (name == key).then(|| value.trim().parse().ok())?
    })
}

/// The kernel's NUMA nodes and their CPUs (`/sys/devices/system/node/node*/cpulist`); one
/// node with every allowed CPU on kernels without NUMA support.
pub(crate) fn node_cpus() -> Result<std::collections::BTreeMap<u32, Vec<usize>>, String> {
    let dir = std::path::Path::new("/sys/devices/system/node");
    let mut nodes = std::collections::BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        nodes.insert(0, vec![last_allowed_cpu()?]);
        return Ok(nodes);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(node) = name
            .strip_prefix("node")
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        let file = entry.path().join("cpulist");
        let text =
            std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        let cpus = qosd::cgroup::CpuSet::parse(&text).map_err(|e| e.to_string())?;
        nodes.insert(
            node,
            cpus.iter()
                .filter_map(|c| usize::try_from(c).ok())
                .collect(),
        );
    }
    Ok(nodes)
}

const NUMA_BALANCING: &str = "/proc/sys/kernel/numa_balancing";

/// `kernel.numa_balancing` set for a case, the old value put back on drop.
pub(crate) struct NumaBalancing(Option<String>);

impl NumaBalancing {
    /// Turns NUMA balancing on (`true`) or off for as long as the value lives.
    pub(crate) fn set(on: bool) -> Result<Self, String> {
        let old = std::fs::read_to_string(NUMA_BALANCING)
            .map_err(|e| format!("{NUMA_BALANCING}: {e}"))?;
        std::fs::write(NUMA_BALANCING, if on { "1" } else { "0" })
            .map_err(|e| format!("setting {NUMA_BALANCING}: {e}"))?;
        Ok(Self(Some(old)))
    }
}

impl Drop for NumaBalancing {
    fn drop(&mut self) {
        if let Some(old) = self.0.take() {
            let _ = std::fs::write(NUMA_BALANCING, old.trim());
        }
    }
}
