//! Kill storms: qosd killed with SIGKILL at random instants, again and again, while pods are
//! admitted, replaced and deleted and the feedback intervenes (a throttled Burstable spinner
//! and a BestEffort spinner crowding it); after every restart the node is checked against
//! cgroupfs, the processes and the CPU manager's checkpoint.
//!
//! Checked at every kill, on what the killed agent left (never allowed, not even mid-change):
//! - no CPU in the cpusets of two containers that hold exclusive CPUs.
//!
//! Checked once the restarted agent has settled (each a violation if it does not settle
//! within [`SETTLE`]):
//! - every manifest's pod has its cgroup in its QoS tier, and its container exactly one
//!   process, running that manifest's version;
//! - no pod or container cgroup under the root that no manifest claims, in any hierarchy;
//! - no process of the storm outside those containers (none orphaned, none started twice);
//! - every container has a cpuset, and exclusive CPUs are in no other container's cpuset;
//! - the CPU manager's checkpoint verifies and holds exactly the exclusive CPUs cgroupfs shows;
//! - every intervention in the kernel files (the BestEffort tier's `cpu.idle` and quota, a
//!   container's CFS burst) is one qosd counts in `qosd_feedback_interventions`, and no more;
//! - `qosd_pods` counts the manifests' pods.
//!
//! And across restarts: a container whose manifest did not change since the previous check
//! runs the same process (adopted, not started again).
//!
//! `QOSD_CHAOS_KILLS` sets the number of kills (default [`DEFAULT_KILLS`]; `cargo xtask chaos`
//! runs 100 by default) and `QOSD_CHAOS_SEED` replays a storm (the seed is printed).
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use qosd::cgroup::cpuset::CpuSet;
use qosd::cm::checkpoint::Restored;

use crate::agent::{Agent, sample_value, standalone_args, standalone_inputs, sum_where};
use crate::harness::{Context, Outcome, fail};
use crate::pod_tree::{Hierarchies, TempPaths};

/// Kills in the test tiers (host and guests).
const DEFAULT_KILLS: u32 = 10;
/// How long a restarted agent has to bring the node back to its manifests.
const SETTLE: Duration = Duration::from_secs(90);
/// The storm stops after this many violating rounds (later ones would repeat them).
const MAX_VIOLATIONS: usize = 5;
const NAMESPACE: &str = "chaos";

/// The case's time limit: two minutes, and one and a half more per kill (an emulated guest restarts qosd
/// in seconds, and a restart may wait up to [`SETTLE`]).
pub(crate) fn time_limit() -> Duration {
    let kills = env_number("QOSD_CHAOS_KILLS")
        .ok()
        .flatten()
        .unwrap_or(u64::from(DEFAULT_KILLS));
    Duration::from_secs(120 + 90 * kills)
}

/// The case.
pub(crate) fn kill_storm(ctx: &Context) -> Outcome {
    match run(ctx) {
        Ok(detail) => Outcome::Pass(detail),
        Err(e) => fail(e),
    }
}

/// A pod of the storm's pool: the QoS class and behaviour it is written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Guaranteed with one whole CPU: exclusive CPUs from the static CPU manager.
    Exclusive,
    /// Guaranteed with 200m: the shared pool.
    GuaranteedShared,
    /// Burstable, asleep; each new version asks for a different CPU request.
    BurstableSleeper,
    /// Burstable, spinning against a 300m limit: throttled, so the CFS burst intervenes.
    BurstableSpinner,
    /// BestEffort, spinning beside the Burstable spinner: the BestEffort suppression intervenes.
    BestEffortSpinner,
    BestEffortSleeper,
}

impl Kind {
    /// The pod cgroup's parent under the root.
    fn tier(self) -> &'static str {
        match self {
            Self::Exclusive | Self::GuaranteedShared => "kubepods",
            Self::BurstableSleeper | Self::BurstableSpinner => "kubepods/burstable",
            Self::BestEffortSpinner | Self::BestEffortSleeper => "kubepods/besteffort",
        }
    }

    fn workload(self) -> &'static str {
        match self {
            Self::BurstableSpinner | Self::BestEffortSpinner => "spin",
            _ => "sleep",
        }
    }

    fn resources(self, version: u32) -> String {
        match self {
            Self::Exclusive => "{limits: {cpu: \"1\", memory: 32Mi}}".to_owned(),
            Self::GuaranteedShared => "{limits: {cpu: 200m, memory: 32Mi}}".to_owned(),
            Self::BurstableSleeper => format!(
                "{{requests: {{cpu: {}m, memory: 16Mi}}}}",
                if version.is_multiple_of(2) { 100 } else { 120 }
            ),
            Self::BurstableSpinner => "{requests: {cpu: 100m}, limits: {cpu: 300m}}".to_owned(),
            Self::BestEffortSpinner | Self::BestEffortSleeper => "{}".to_owned(),
        }
    }
}

struct PoolPod {
    name: String,
    uid: String,
    kind: Kind,
}

impl PoolPod {
    /// The pod cgroup under the root.
    fn cgroup(&self) -> String {
        format!("{}/pod{}", self.kind.tier(), self.uid)
    }

    /// The container cgroup under the root.
    fn container(&self) -> String {
        format!("{}/c", self.cgroup())
    }
}

/// xorshift64*: enough for choosing instants and pods, and replayable from its seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (n > 0).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn coin(&mut self) -> bool {
        self.next() & 1 == 1
    }

    fn millis_below(&mut self, limit: Duration) -> Duration {
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        Duration::from_millis(self.below(ms))
    }
}

/// The storm's world: the pool, which versions are in the manifest directory, and the
/// processes seen at the previous check.
struct Storm<'a> {
    ctx: &'a Context,
    h: &'a Hierarchies,
    manifests: PathBuf,
    staging: PathBuf,
    state_dir: PathBuf,
    pool: Vec<PoolPod>,
    /// Pool index -> the version in the manifest directory.
    present: BTreeMap<usize, u32>,
    next_version: u32,
    /// Pool indexes whose manifest changed since the previous check.
    changed: BTreeSet<usize>,
    /// Pool index -> (version, pid) at the previous check.
    pids: BTreeMap<usize, (u32, u32)>,
    /// The process tag's prefix: `chaos:<root>:`.
    tag_prefix: String,
    admitted: u32,
    replaced: u32,
    deleted: u32,
}

impl Drop for Storm<'_> {
    /// No process of the storm outlives it, whatever the outcome: a stray the checks reported,
    /// or the containers left by an early return. The agent, declared later, is gone first, so
    /// nothing starts them again.
    fn drop(&mut self) {
        for pid in self.tagged_processes().into_keys() {
            if let Ok(pid) = libc::pid_t::try_from(pid) {
                // SAFETY: kill(2) with a pid read from /proc and a valid signal; at worst the
                // process is already gone (ESRCH).
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

fn run(ctx: &Context) -> Result<String, String> {
    let kills: u32 = env_number("QOSD_CHAOS_KILLS")?
        .unwrap_or(u64::from(DEFAULT_KILLS))
        .try_into()
        .map_err(|_| "QOSD_CHAOS_KILLS is too large".to_owned())?;
    let seed = env_number("QOSD_CHAOS_SEED")?.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1)
    });
    let mut rng = Rng(seed.max(1));
    let h = Hierarchies::new("qosd-systest-chaos")?;
    let scratch = std::env::temp_dir().join(format!("{}-files", h.root_name));
    let _cleanup = TempPaths(vec![scratch.clone()]);
    let (manifests, config) = standalone_inputs(
        &scratch,
        &format!(
            "cgroupRoot: /{}\nsystemReserved: {{cpu: 500m, memory: 64Mi}}\ncpuManagerPolicy: static\n",
            h.root_name
        ),
    )?;
    let args = standalone_args(&scratch, &manifests, &config, &["--reconcile-period", "2s"]);
    let staging = scratch.join("staging");
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let mut storm = Storm {
        ctx,
        h: &h,
        manifests,
        staging,
        state_dir: scratch.join("state"),
        pool: pool(cpus),
        present: BTreeMap::new(),
        next_version: 0,
        changed: BTreeSet::new(),
        pids: BTreeMap::new(),
        tag_prefix: format!("chaos:{}:", h.root_name),
        admitted: 0,
        replaced: 0,
        deleted: 0,
    };
    for index in 0..storm.pool.len() {
        storm.write(index)?;
    }

    let started = Instant::now();
    let mut agent = Agent::spawn_with(&ctx.qosd, &args)?;
    agent.wait_ready(Duration::from_secs(120))?;
    // Kills during start-up land within about as long as the first start took.
    let startup = started.elapsed();
    let mut settle_times = Vec::new();
    let mut violations = Vec::new();
    settle_times.push(
        storm
            .settle(&agent)
            .map_err(|e| format!("before the first kill: {e}\n{}", agent.log_tail()))?,
    );
    let (mut done, mut in_startup, mut during_intervention) = (0u32, 0u32, 0u32);
    while done < kills && violations.len() < MAX_VIOLATIONS {
        for _ in 0..=rng.below(2) {
            storm.mutate(&mut rng)?;
        }
        std::thread::sleep(rng.millis_below(startup.max(Duration::from_secs(2)) * 2));
        if rng.coin() {
            storm.mutate(&mut rng)?;
        }
        let intervening = storm.kill(&mut agent, &mut violations)?;
        done += 1;
        during_intervention += u32::from(intervening);
        if done < kills && rng.coin() {
            // A kill while the next agent starts: resuming, adopting, admitting.
            agent = Agent::spawn_with(&ctx.qosd, &args)?;
            std::thread::sleep(rng.millis_below(startup * 3 / 2));
            storm.kill(&mut agent, &mut violations)?;
            done += 1;
            in_startup += 1;
        }
        agent = Agent::spawn_with(&ctx.qosd, &args)?;
        agent
            .wait_ready(Duration::from_secs(120))
            .map_err(|e| format!("seed {seed}, the restart after kill {done}: {e}"))?;
        match storm.settle(&agent) {
            Ok(took) => settle_times.push(took),
            Err(e) => violations.push(format!("after kill {done}: {e}\n{}", agent.log_tail())),
        }
    }
    let (status, _) = agent.stop(libc::SIGTERM, Duration::from_secs(60))?;
    let orphans = storm.tagged_processes();
    let left = h.leftovers();
    if !status.success() || !orphans.is_empty() || !left.is_empty() {
        violations.push(format!(
            "after the last agent's SIGTERM ({status}): processes {:?}, cgroups {left:?}",
            orphans.keys().collect::<Vec<_>>()
        ));
    }
    settle_times.sort();
    let summary = format!(
        "seed {seed}: {done} SIGKILLs ({in_startup} during start-up, {during_intervention} with an intervention in the kernel files), {} pods admitted, {} replaced, {} deleted; settled in median {:.1} s, max {:.1} s; {} invariant violations",
        storm.admitted,
        storm.replaced,
        storm.deleted,
        settle_times
            .get(settle_times.len() / 2)
            .map_or(0.0, Duration::as_secs_f64),
        settle_times.last().map_or(0.0, Duration::as_secs_f64),
        violations.len()
    );
    if violations.is_empty() {
        Ok(summary)
    } else {
        Err(format!("{summary}:\n{}", violations.join("\n")))
    }
}

/// A number from the environment; `None` when unset.
fn env_number(name: &str) -> Result<Option<u64>, String> {
    match std::env::var(name) {
        Ok(text) => text
            .parse()
            .map(Some)
            .map_err(|e| format!("{name}={text:?}: {e}")),
        Err(_) => Ok(None),
    }
}

/// Every kind once, and a second exclusive pod where the CPUs allow one (CPU 0 is reserved:
/// two CPUs hold one exclusive pod beside the shared pool, four hold two).
fn pool(cpus: usize) -> Vec<PoolPod> {
    let mut kinds = vec![
        Kind::Exclusive,
        Kind::GuaranteedShared,
        Kind::BurstableSleeper,
        Kind::BurstableSpinner,
        Kind::BestEffortSpinner,
        Kind::BestEffortSleeper,
    ];
    if cpus >= 4 {
        kinds.push(Kind::Exclusive);
    }
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| PoolPod {
            name: format!("pod-{i}"),
            uid: format!("0f0e0d0c-0000-4000-8000-0000000001{i:02x}"),
            kind,
        })
        .collect()
}

impl Storm<'_> {
    fn tag(&self, index: usize, version: u32) -> String {
        format!("{}{}:v{version}", self.tag_prefix, self.pool[index].name)
    }

    /// Writes the next version of pod `index` into the manifest directory (renamed in whole).
    fn write(&mut self, index: usize) -> Result<(), String> {
        let version = self.next_version;
        self.next_version += 1;
        let pod = &self.pool[index];
        let text = format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: {}, namespace: {NAMESPACE}, uid: {}}}\n\
             spec:\n  terminationGracePeriodSeconds: 1\n  containers:\n  - name: c\n    \
             command: [\"{}\", \"{}\", \"3600\", \"{}\"]\n    resources: {}\n",
            pod.name,
            pod.uid,
            self.ctx.self_exe.display(),
            pod.kind.workload(),
            self.tag(index, version),
            pod.kind.resources(version)
        );
        let file = format!("{}.yaml", pod.name);
        let staged = self.staging.join(&file);
        std::fs::write(&staged, text).map_err(|e| format!("{}: {e}", staged.display()))?;
        std::fs::rename(&staged, self.manifests.join(&file))
            .map_err(|e| format!("moving {file} in: {e}"))?;
        if self.present.insert(index, version).is_some() {
            self.replaced += 1;
        } else {
            self.admitted += 1;
        }
        self.changed.insert(index);
        Ok(())
    }

    /// One change: a pod absent from the directory is added; a present one is deleted or
    /// replaced by a new version.
    fn mutate(&mut self, rng: &mut Rng) -> Result<(), String> {
        let index = usize::try_from(rng.below(self.pool.len() as u64)).unwrap_or(0);
        if !self.present.contains_key(&index) || rng.coin() {
            return self.write(index);
        }
        let path = self
            .manifests
            .join(format!("{}.yaml", self.pool[index].name));
        std::fs::remove_file(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        self.present.remove(&index);
        self.changed.insert(index);
        self.deleted += 1;
        Ok(())
    }

    /// SIGKILLs the agent and checks what it left; returns whether an intervention was in the
    /// kernel files at that instant.
    fn kill(&self, agent: &mut Agent, violations: &mut Vec<String>) -> Result<bool, String> {
        let log = agent.log_tail();
        let (status, _) = agent.stop(libc::SIGKILL, Duration::from_secs(10))?;
        if std::os::unix::process::ExitStatusExt::signal(&status) != Some(libc::SIGKILL) {
            violations.push(format!(
                "qosd ended by itself ({status}) before its kill\n{log}"
            ));
        }
        if let Err(e) = self.exclusive_disjoint() {
            violations.push(format!("at a kill: {e}"));
        }
        Ok(self.tier_intervention()? || self.bursts()?.values().any(|b| *b > 0))
    }

    /// The container's cpuset, if its cgroup exists.
    fn cpuset(&self, index: usize) -> Result<Option<CpuSet>, String> {
        let dir = self.h.path("cpuset", &self.pool[index].container());
        if !dir.is_dir() {
            return Ok(None);
        }
        let text = read(&dir.join("cpuset.cpus"))?;
        CpuSet::parse(&text)
            .map(Some)
            .map_err(|e| format!("{}/cpuset.cpus {text:?}: {e}", dir.display()))
    }

    /// No CPU in two exclusive containers' cpusets; returns the exclusive sets by pool index.
    fn exclusive_disjoint(&self) -> Result<BTreeMap<usize, CpuSet>, String> {
        let mut sets: BTreeMap<usize, CpuSet> = BTreeMap::new();
        for (index, pod) in self.pool.iter().enumerate() {
            if pod.kind != Kind::Exclusive {
                continue;
            }
            if let Some(set) = self.cpuset(index)? {
                for (other, other_set) in &sets {
                    if set.iter().any(|cpu| other_set.contains(cpu)) {
                        return Err(format!(
                            "{} has {set} and {} has {other_set}: a CPU in two exclusive containers",
                            self.pool[index].name, self.pool[*other].name
                        ));
                    }
                }
                sets.insert(index, set);
            }
        }
        Ok(sets)
    }

    /// Whether the BestEffort tier's files hold the suppression (`cpu.idle` 1 or a quota).
    fn tier_intervention(&self) -> Result<bool, String> {
        let tier = self.h.path("cpu", "kubepods/besteffort");
        if !tier.is_dir() {
            return Ok(false);
        }
        let idle = tier.join("cpu.idle");
        let idle = idle.exists() && read(&idle)? == "1";
        let quota = if self.h.v2() {
            !read(&tier.join("cpu.max"))?.starts_with("max")
        } else {
            read(&tier.join("cpu.cfs_quota_us"))? != "-1"
        };
        Ok(idle || quota)
    }

    /// The CFS burst of every container cgroup there is, by pool index (0 where the kernel has
    /// no burst file).
    fn bursts(&self) -> Result<BTreeMap<usize, u64>, String> {
        let file = if self.h.v2() {
            "cpu.max.burst"
        } else {
            "cpu.cfs_burst_us"
        };
        let mut bursts = BTreeMap::new();
        for (index, pod) in self.pool.iter().enumerate() {
            let path = self.h.path("cpu", &pod.container()).join(file);
            if path.exists() {
                let text = read(&path)?;
                let burst = text
                    .parse()
                    .map_err(|e| format!("{} {text:?}: {e}", path.display()))?;
                bursts.insert(index, burst);
            }
        }
        Ok(bursts)
    }

    /// Every live process carrying the storm's tag: pid -> tag.
    fn tagged_processes(&self) -> BTreeMap<u32, String> {
        let mut found = BTreeMap::new();
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return found;
        };
        for entry in entries.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
                continue;
            };
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            if let Some(tag) = cmdline
                .split(|b| *b == 0)
                .map(String::from_utf8_lossy)
                .find(|arg| arg.starts_with(&self.tag_prefix))
            {
                found.insert(pid, tag.into_owned());
            }
        }
        found
    }

    /// Waits until [`Self::problems`] finds none; the time it took, or the last problems.
    fn settle(&mut self, agent: &Agent) -> Result<Duration, String> {
        let started = Instant::now();
        loop {
            let problems = match self.problems(agent) {
                Ok(problems) => problems,
                Err(e) => vec![e],
            };
            if problems.is_empty() {
                break;
            }
            if started.elapsed() > SETTLE {
                return Err(format!(
                    "not settled within {SETTLE:?}: {}",
                    problems.join("; ")
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        let took = started.elapsed();
        // Containers whose manifest did not change must run the process they ran before.
        let now = self.container_pids(&self.tagged_processes())?;
        let mut restarted = Vec::new();
        for (index, (version, pid)) in &now {
            if let Some((before_version, before_pid)) = self.pids.get(index)
                && !self.changed.contains(index)
                && before_version == version
                && before_pid != pid
            {
                restarted.push(format!(
                    "{} v{version}: process {before_pid} replaced by {pid}",
                    self.pool[*index].name
                ));
            }
        }
        self.pids = now;
        self.changed.clear();
        if restarted.is_empty() {
            Ok(took)
        } else {
            Err(format!(
                "unchanged containers started again, not adopted: {}",
                restarted.join("; ")
            ))
        }
    }

    /// Pool index -> (version, pid) of every present pod's container process, judged against
    /// `tagged` ([`Self::tagged_processes`]).
    fn container_pids(
        &self,
        tagged: &BTreeMap<u32, String>,
    ) -> Result<BTreeMap<usize, (u32, u32)>, String> {
        let mut pids = BTreeMap::new();
        for (&index, &version) in &self.present {
            let procs = read(
                &self
                    .h
                    .path("cpu", &self.pool[index].container())
                    .join("cgroup.procs"),
            )?;
            let listed: Vec<u32> = procs
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect();
            let want = self.tag(index, version);
            match listed.as_slice() {
                [pid] if tagged.get(pid) == Some(&want) => {
                    pids.insert(index, (version, *pid));
                }
                _ => {
                    return Err(format!(
                        "{}: processes {listed:?} ({:?}), want one running {want}",
                        self.pool[index].container(),
                        listed.iter().map(|p| tagged.get(p)).collect::<Vec<_>>()
                    ));
                }
            }
        }
        Ok(pids)
    }

    /// What is wrong with the node now, against the manifests (empty once settled).
    fn problems(&self, agent: &Agent) -> Result<Vec<String>, String> {
        let mut problems = Vec::new();
        let before = agent.scrape()?;
        // Pods and containers: the manifests' and no others, each with one process.
        // One scan of /proc serves both judgements.
        let tagged = self.tagged_processes();
        let pids = match self.container_pids(&tagged) {
            Ok(pids) => pids,
            Err(e) => return Ok(vec![e]),
        };
        let expected: BTreeSet<u32> = pids.values().map(|(_, pid)| *pid).collect();
        let strays: Vec<(u32, String)> = tagged
            .into_iter()
            .filter(|(pid, _)| !expected.contains(pid))
            .collect();
        if !strays.is_empty() {
            problems.push(format!(
                "processes outside the manifests' containers: {strays:?}"
            ));
        }
        problems.extend(self.unclaimed_cgroups());

        // CPUs: every container has a cpuset; exclusive ones are nobody else's.
        let exclusive = self.exclusive_disjoint()?;
        let taken: BTreeSet<u32> = exclusive.values().flat_map(CpuSet::to_vec).collect();
        for &index in self.present.keys() {
            let pod = &self.pool[index];
            match self.cpuset(index)? {
                None => problems.push(format!("{}: no cgroup", pod.container())),
                Some(set) if set.is_empty() => {
                    problems.push(format!("{}: empty cpuset.cpus", pod.container()));
                }
                Some(set) if pod.kind == Kind::Exclusive => {
                    if set.len() != 1 || set.contains(0) {
                        problems.push(format!(
                            "{}: cpuset.cpus {set}, want one CPU other than the reserved 0",
                            pod.container()
                        ));
                    }
                }
                Some(set) => {
                    if set.iter().any(|cpu| taken.contains(&cpu)) {
                        problems.push(format!(
                            "{}: cpuset.cpus {set} holds exclusive CPUs {taken:?}",
                            pod.container()
                        ));
                    }
                }
            }
        }
        problems.extend(self.checkpoint_problems(&exclusive)?);

        // Interventions in the files are the ones qosd counts.
        let tier = self.tier_intervention()?;
        let bursts = self
            .bursts()?
            .into_iter()
            .filter(|(index, burst)| *burst > 0 && self.present.contains_key(index))
            .count();
        let after = agent.scrape()?;
        let counted = |text: &str, policy: &str| {
            sample_value(
                text,
                "qosd_feedback_interventions",
                &format!("policy=\"{policy}\""),
            )
            .unwrap_or(0.0)
        };
        let tier_counted = counted(&after, "besteffort_cpu");
        let bursts_counted = counted(&after, "cpu_burst");
        if tier_counted != counted(&before, "besteffort_cpu")
            || bursts_counted != counted(&before, "cpu_burst")
        {
            problems.push("the feedback changed its interventions while they were read".to_owned());
        } else {
            if (tier_counted >= 1.0) != tier {
                problems.push(format!(
                    "BestEffort tier: suppression in the files {tier}, qosd_feedback_interventions{{policy=\"besteffort_cpu\"}} {tier_counted}"
                ));
            }
            if (bursts as f64 - bursts_counted).abs() > 0.5 {
                problems.push(format!(
                    "{bursts} container(s) with a CFS burst in the files, qosd_feedback_interventions{{policy=\"cpu_burst\"}} {bursts_counted}"
                ));
            }
        }
        let pods = sum_where(&after, "qosd_pods", &[]);
        if (pods - self.present.len() as f64).abs() > 0.5 {
            problems.push(format!(
                "qosd_pods {pods}, {} manifests",
                self.present.len()
            ));
        }
        Ok(problems)
    }

    /// Pod and container cgroups under the QoS tiers that no manifest in the directory claims,
    /// in every hierarchy the container manager writes.
    fn unclaimed_cgroups(&self) -> Vec<String> {
        let claimed: BTreeSet<String> = self
            .present
            .keys()
            .map(|&index| self.pool[index].cgroup())
            .collect();
        let mut unclaimed = Vec::new();
        for mount in self.h.mounts() {
            let root = mount.join(&self.h.root_name);
            for tier in ["kubepods", "kubepods/burstable", "kubepods/besteffort"] {
                for pod in subdirs(&root.join(tier)) {
                    if !pod.starts_with("pod") {
                        continue;
                    }
                    let relative = format!("{tier}/{pod}");
                    if !claimed.contains(&relative) {
                        unclaimed.push(format!("{}", root.join(&relative).display()));
                        continue;
                    }
                    for container in subdirs(&root.join(&relative)) {
                        if container != "c" {
                            unclaimed.push(format!(
                                "{}",
                                root.join(&relative).join(container).display()
                            ));
                        }
                    }
                }
            }
        }
        if unclaimed.is_empty() {
            Vec::new()
        } else {
            vec![format!("cgroups no manifest claims: {unclaimed:?}")]
        }
    }

    /// The CPU manager's checkpoint verifies and holds exactly `exclusive`.
    fn checkpoint_problems(
        &self,
        exclusive: &BTreeMap<usize, CpuSet>,
    ) -> Result<Vec<String>, String> {
        let path = self.state_dir.join("cpu_manager_state");
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        let state = match qosd::cm::cpu::state::decode(&bytes, "static") {
            Restored::State(state) => state,
            Restored::Rebuild { reason, detail } => {
                return Ok(vec![format!(
                    "{}: does not verify ({reason:?}): {detail}",
                    path.display()
                )]);
            }
        };
        let in_checkpoint: BTreeMap<String, Vec<u32>> = state
            .assignments
            .iter()
            .flat_map(|(uid, containers)| {
                containers
                    .iter()
                    .map(move |(name, cpus)| (format!("{uid}/{name}"), cpus.iter().collect()))
            })
            .collect();
        let in_cgroups: BTreeMap<String, Vec<u32>> = exclusive
            .iter()
            .filter(|(index, _)| self.present.contains_key(index))
            .map(|(&index, set)| (format!("{}/c", self.pool[index].uid), set.to_vec()))
            .collect();
        Ok(if in_checkpoint == in_cgroups {
            Vec::new()
        } else {
            vec![format!(
                "{}: exclusive CPUs {in_checkpoint:?}, cgroupfs {in_cgroups:?}",
                path.display()
            )]
        })
    }
}

fn read(path: &Path) -> Result<String, String> {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .map_err(|e| format!("{}: {e}", path.display()))
}

fn subdirs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}
