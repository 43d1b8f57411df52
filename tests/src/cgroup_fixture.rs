//! Test cgroups: a uniquely named subtree created in every hierarchy a case needs and removed
//! on drop (processes first), so tests never touch cgroups they did not create.
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

use qosd::cgroup::CgroupLayout;

/// A test subtree `/<name>` in the cpu hierarchy, and on v1 also in cpuacct (the kernel's
/// own CPU accounting there).
pub(crate) struct TestCgroups {
    /// Directories created, deepest last.
    created: Vec<PathBuf>,
    /// Hierarchy roots to place workloads in (cpu, and cpuacct when separate).
    roots: Vec<PathBuf>,
    /// Where the kernel's CPU usage of a cgroup is read.
    accounting: Accounting,
    /// The subtree's name, the cgroup path is `/<name>`.
    pub name: String,
    children: Vec<Child>,
}

/// How the kernel reports a cgroup's CPU usage.
#[derive(Clone, Debug)]
pub(crate) enum Accounting {
    /// v1: `cpuacct.usage` (nanoseconds) under this hierarchy root.
    CpuacctUsage(PathBuf),
    /// v2: `usage_usec` in `cpu.stat` under this root.
    CpuStatUsage(PathBuf),
}

impl TestCgroups {
    /// Creates `/<prefix>-<pid>-<nanos>` in the hierarchies CPU time is attributed and
    /// accounted in.
    pub(crate) fn create(prefix: &str) -> Result<Self, String> {
        let layout = CgroupLayout::detect().map_err(|e| e.to_string())?;
        let cpu = layout
            .cpu_hierarchy()
            .ok_or("no cpu hierarchy mounted")?
            .to_owned();
        let (roots, accounting) = if layout.uses_v1_cpu_controller() {
            let cpuacct = layout
                .v1
                .get("cpuacct")
                .ok_or("v1 cpu without cpuacct")?
                .clone();
            let roots = if cpuacct == cpu {
                vec![cpu]
            } else {
                vec![cpu, cpuacct.clone()]
            };
            (roots, Accounting::CpuacctUsage(cpuacct))
        } else {
            (vec![cpu.clone()], Accounting::CpuStatUsage(cpu))
        };
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!("{prefix}-{}-{nanos}", std::process::id());
        let mut this = Self {
            created: Vec::new(),
            roots,
            accounting,
            name,
            children: Vec::new(),
        };
        this.mkdir("")?;
        Ok(this)
    }

    /// The same, also in the memory hierarchy (v1) or with the memory and cpuset controllers
    /// enabled for the subtree's children (v2), for cases that read `memory.numa_stat` and
    /// set `cpuset.cpus` / `cpuset.mems`.
    pub(crate) fn create_with_memory(prefix: &str) -> Result<Self, String> {
        let layout = CgroupLayout::detect().map_err(|e| e.to_string())?;
        let mut this = Self::create(prefix)?;
        if let Some(memory) = layout.v1.get("memory") {
            if !this.roots.contains(memory) {
                let dir = memory.join(&this.name);
                std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
                this.created.push(dir);
                this.roots.push(memory.clone());
            }
        } else {
            let unified = layout
                .unified
                .as_ref()
                .ok_or("no memory hierarchy mounted")?;
            let control = unified.join(&this.name).join("cgroup.subtree_control");
            for controller in ["+memory", "+cpuset"] {
                std::fs::write(&control, controller)
                    .map_err(|e| format!("writing {controller} to {}: {e}", control.display()))?;
            }
        }
        Ok(this)
    }

    /// The directory of `/<name>/<child>` in the hierarchy mounted at `root`.
    pub(crate) fn dir_in(&self, root: &Path, child: &str) -> PathBuf {
        root.join(&self.name).join(child)
    }

    /// Kills every started workload (for workloads that outlive their measurement).
    pub(crate) fn kill_all(&mut self) {
        for mut child in self.children.drain(..) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Kills workload `pid`, which must still be running: a sleeper that outlives the
    /// measurement window ends here, and one that had already exited (its wake-up would have
    /// fallen inside the window) is an error.
    pub(crate) fn stop(&mut self, pid: u32) -> Result<(), String> {
        let index = self
            .children
            .iter()
            .position(|c| c.id() == pid)
            .ok_or_else(|| format!("process {pid} is not a workload of this test"))?;
        let mut child = self.children.remove(index);
        let exited = child.try_wait();
        let _ = child.kill();
        let _ = child.wait();
        match exited.map_err(|e| format!("checking workload {pid}: {e}"))? {
            None => Ok(()),
            Some(status) => Err(format!(
                "workload {pid} exited ({status}) before the measurement ended"
            )),
        }
    }

    /// Creates the child cgroup `/<name>/<child>` in every hierarchy.
    pub(crate) fn mkdir(&mut self, child: &str) -> Result<(), String> {
        for root in self.roots.clone() {
            let dir = root.join(&self.name).join(child);
            std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
            self.created.push(dir);
        }
        Ok(())
    }

    /// The cgroup path of a child as qosd labels it: `/<name>/<child>`.
    pub(crate) fn label(&self, child: &str) -> String {
        format!("/{}/{child}", self.name)
    }

    /// Starts `program args` as a process inside `/<name>/<child>` in every hierarchy (the
    /// shell moves itself, then execs), so no instant of the workload runs outside it.
    pub(crate) fn spawn_in(
        &mut self,
        child: &str,
        program: &Path,
        args: &[&str],
    ) -> Result<u32, String> {
        let mut script = String::new();
        for root in &self.roots {
            let procs = root.join(&self.name).join(child).join("cgroup.procs");
            script.push_str(&format!("echo $$ > '{}' || exit 97; ", procs.display()));
        }
        script.push_str("exec \"$@\"");
        let mut command = std::process::Command::new("/bin/sh");
        command
            .arg("-c")
            .arg(script)
            .arg("sh")
            .arg(program)
            .args(args);
        let child_process = command
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", program.display()))?;
        let pid = child_process.id();
        self.children.push(child_process);
        Ok(pid)
    }

    /// Waits for every started workload to exit; an exit status other than 0 is an error.
    pub(crate) fn wait_all(&mut self) -> Result<(), String> {
        for mut child in self.children.drain(..) {
            let status = child
                .wait()
                .map_err(|e| format!("waiting for a workload: {e}"))?;
            if !status.success() {
                return Err(format!("workload exited with {status}"));
            }
        }
        Ok(())
    }

    /// The kernel's own CPU usage of `/<name>/<child>`, in seconds.
    pub(crate) fn kernel_cpu_seconds(&self, child: &str) -> Result<f64, String> {
        match &self.accounting {
            Accounting::CpuacctUsage(root) => {
                let file = root.join(&self.name).join(child).join("cpuacct.usage");
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                let nanos: u64 = text
                    .trim()
                    .parse()
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                Ok(nanos as f64 / 1e9)
            }
            Accounting::CpuStatUsage(root) => {
                let file = root.join(&self.name).join(child).join("cpu.stat");
                let text = std::fs::read_to_string(&file)
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                let usec = text
                    .lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .ok_or_else(|| format!("{}: no usage_usec", file.display()))?;
                let usec: u64 = usec
                    .trim()
                    .parse()
                    .map_err(|e| format!("{}: {e}", file.display()))?;
                Ok(usec as f64 / 1e6)
            }
        }
    }

    /// Which kernel file the accounting comes from, for messages.
    pub(crate) fn accounting_source(&self) -> &'static str {
        match self.accounting {
            Accounting::CpuacctUsage(_) => "cpuacct.usage",
            Accounting::CpuStatUsage(_) => "cpu.stat usage_usec",
        }
    }
}

impl Drop for TestCgroups {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        // rmdir fails with EBUSY while an exiting task is still being reaped; retry briefly.
        for dir in self.created.iter().rev() {
            let deadline = Instant::now() + Duration::from_secs(5);
            while let Err(e) = std::fs::remove_dir(dir) {
                if e.kind() == std::io::ErrorKind::NotFound || Instant::now() > deadline {
                    if e.kind() != std::io::ErrorKind::NotFound {
                        eprintln!(
                            "warning: could not remove test cgroup {}: {e}",
                            dir.display()
                        );
                    }
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
