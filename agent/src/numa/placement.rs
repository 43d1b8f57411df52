//! Where each cgroup's tasks ran, per NUMA node: CPU time per node from the cpu-time probe's
//! per-CPU counters (summed per node in user space; nothing more is counted in the kernel),
//! kept as a short history of readings so that a reader can ask for any recent window.
//!
//! The readings come from whoever samples the probe (each scrape of
//! `qosd_cgroup_cpu_seconds_total`, and the feedback when no scrape came recently). A window is
//! the difference between the newest reading and the newest one at least as old as asked,
//! summed over a cgroup and its descendants (the probe charges a task's own cgroup; a pod's
//! memory is its containers'). With no CPU time in the window, the oldest reading kept is used;
//! with none at all there is no placement, and the caller says so.
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::NodeLayout;

/// How many readings are kept, and for how long at most.
const KEPT_READINGS: usize = 16;
const KEPT_FOR: Duration = Duration::from_secs(300);

/// CPU nanoseconds per node, by node id.
pub type NodeNanos = BTreeMap<u32, u64>;

/// The nodes of the machine's CPUs: what the probe reader sums per node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CpuNodes {
    /// Node ids, ascending: the order of every per-node vector.
    pub nodes: Vec<u32>,
    /// For each possible CPU (its index), the position of its node in `nodes`; CPUs the
    /// layout does not name are counted on no node.
    pub node_of_cpu: Vec<Option<usize>>,
}

impl CpuNodes {
    /// The CPU-to-node map of `layout`, for CPUs `0..possible`; `None` on one node (every
    /// CPU is local to every page).
    #[must_use]
    pub fn of(layout: &NodeLayout, possible: usize) -> Option<Self> {
        let nodes: Vec<u32> = layout.nodes().into_iter().collect();
        if nodes.len() < 2 {
            return None;
        }
        let node_of_cpu = (0..possible)
            .map(|cpu| {
                let node = layout.node_of_cpu(u32::try_from(cpu).ok()?)?;
                nodes.iter().position(|n| *n == node)
            })
            .collect();
        Some(Self { nodes, node_of_cpu })
    }

    /// Sums per-CPU values (index = CPU) into `out` (index = node position).
    pub fn add_per_cpu(&self, per_cpu: &[u64], out: &mut [u64]) {
        for (cpu, value) in per_cpu.iter().enumerate() {
            if let Some(Some(node)) = self.node_of_cpu.get(cpu)
                && let Some(slot) = out.get_mut(*node)
            {
                *slot = slot.saturating_add(*value);
            }
        }
    }

    /// Adds `value` to the node of `cpu`.
    pub fn add_on_cpu(&self, cpu: usize, value: u64, out: &mut [u64]) {
        if let Some(Some(node)) = self.node_of_cpu.get(cpu)
            && let Some(slot) = out.get_mut(*node)
        {
            *slot = slot.saturating_add(value);
        }
    }
}

/// One reading: cumulative nanoseconds per node position, by cgroup id.
struct Reading {
    at: Instant,
    nanos: Arc<HashMap<u64, Vec<u64>>>,
}

struct State {
    nodes: Vec<u32>,
    readings: VecDeque<Reading>,
}

/// The history of per-node CPU time readings, shared by its writers and readers.
#[derive(Clone)]
pub struct CpuPlacement {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for CpuPlacement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        f.debug_struct("CpuPlacement")
            .field("nodes", &state.nodes)
            .field("readings", &state.readings.len())
            .finish()
    }
}

/// Where a cgroup (with its descendants) ran over a window.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    pub by_node: NodeNanos,
    /// How long the window was.
    pub window: Duration,
}

impl Placement {
    /// CPU nanoseconds on every node.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.by_node.values().copied().fold(0, u64::saturating_add)
    }

    /// The share of the CPU time spent on `node` (0 when there was none).
    #[must_use]
    pub fn share(&self, node: u32) -> f64 {
        let total = self.total();
        if total == 0 {
            return 0.0;
        }
        #[expect(
            clippy::cast_precision_loss,
            reason = "a ratio of nanosecond counts; f64's 53 bits are ample"
        )]
        let share = self.by_node.get(&node).copied().unwrap_or(0) as f64 / total as f64;
        share
    }

    /// The node with the most CPU time and its share.
    #[must_use]
    pub fn main_node(&self) -> Option<(u32, f64)> {
        self.by_node
            .iter()
            .max_by_key(|(_, ns)| **ns)
            .filter(|(_, ns)| **ns > 0)
            .map(|(node, _)| (*node, self.share(*node)))
    }
}

impl CpuPlacement {
    /// An empty history over `nodes` (ascending node ids, the order of recorded vectors).
    #[must_use]
    pub fn new(nodes: Vec<u32>) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                nodes,
                readings: VecDeque::new(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a reading taken `at`: cumulative nanoseconds per node position, by cgroup id.
    pub fn record(&self, at: Instant, nanos: HashMap<u64, Vec<u64>>) {
        let mut state = self.lock();
        state.readings.push_back(Reading {
            at,
            nanos: Arc::new(nanos),
        });
        while state.readings.len() > KEPT_READINGS
            || state
                .readings
                .front()
                .is_some_and(|r| at.saturating_duration_since(r.at) > KEPT_FOR)
        {
            state.readings.pop_front();
        }
    }

    /// The node ids, in the order of recorded vectors.
    #[must_use]
    pub fn nodes(&self) -> Vec<u32> {
        self.lock().nodes.clone()
    }

    /// When the newest reading was taken.
    #[must_use]
    pub fn newest(&self) -> Option<Instant> {
        self.lock().readings.back().map(|r| r.at)
    }

    /// CPU time per node of each cgroup over about `window` before the newest reading: the
    /// newest reading less the newest one at least `window` older (else the oldest kept). A
    /// cgroup that ran nowhere in that window gets its time since the oldest reading; one
    /// never seen is absent. Not summed over descendants: see [`Self::subtree`].
    #[must_use]
    pub fn window(&self, window: Duration) -> HashMap<u64, Placement> {
        let state = self.lock();
        let Some(newest) = state.readings.back() else {
            return HashMap::new();
        };
        let base = state
            .readings
            .iter()
            .rev()
            .skip(1)
            .find(|r| newest.at.saturating_duration_since(r.at) >= window)
            .or_else(|| state.readings.front().filter(|r| r.at < newest.at));
        let oldest = state.readings.front().filter(|r| r.at < newest.at);
        let mut out = HashMap::new();
        for (&id, now) in newest.nanos.iter() {
            let mut placement = delta(&state.nodes, now, newest.at, base, id);
            if placement.total() == 0
                && let Some(oldest) = oldest
            {
                placement = delta(&state.nodes, now, newest.at, Some(oldest), id);
            }
            // With one reading the window is everything since the probe started (zero here).
            out.insert(id, placement);
        }
        out
    }

    /// [`Self::window`] summed over each cgroup and its descendants: `paths` names the cgroup
    /// of each id (`/a/b`), and the result is by path.
    #[must_use]
    pub fn subtree(
        window: &HashMap<u64, Placement>,
        paths: impl Fn(u64) -> Option<String>,
    ) -> HashMap<String, Placement> {
        let mut out: HashMap<String, Placement> = HashMap::new();
        for (&id, placement) in window {
            let Some(path) = paths(id) else {
                continue;
            };
            let mut prefix = path.as_str();
            loop {
                let slot = out.entry(prefix.to_owned()).or_default();
                slot.window = slot.window.max(placement.window);
                for (node, ns) in &placement.by_node {
                    let v = slot.by_node.entry(*node).or_default();
                    *v = v.saturating_add(*ns);
                }
                match prefix.rfind('/') {
                    Some(0) if prefix != "/" => prefix = "/",
                    Some(i) if i > 0 => prefix = &prefix[..i],
                    _ => break,
                }
            }
        }
        out
    }
}

/// `now` (taken at `at`) less `base`'s values of `id`, per node id.
fn delta(nodes: &[u32], now: &[u64], at: Instant, base: Option<&Reading>, id: u64) -> Placement {
    let before = base.and_then(|b| b.nanos.get(&id));
    let by_node = nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            let now = now.get(i).copied().unwrap_or(0);
            let before = before.and_then(|b| b.get(i)).copied().unwrap_or(0);
            (*node, now.saturating_sub(before))
        })
        .collect();
    Placement {
        by_node,
        window: base.map_or(Duration::ZERO, |b| at.saturating_duration_since(b.at)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(values: &[(u64, [u64; 2])]) -> HashMap<u64, Vec<u64>> {
        values.iter().map(|(id, v)| (*id, v.to_vec())).collect()
    }

    #[test]
    fn a_window_is_the_difference_of_two_readings_and_falls_back_to_the_oldest() {
        let placement = CpuPlacement::new(vec![0, 1]);
        let t0 = Instant::now();
        placement.record(t0, reading(&[(7, [100, 0]), (8, [0, 0])]));
        placement.record(
            t0 + Duration::from_secs(5),
            reading(&[(7, [900, 100]), (8, [50, 0])]),
        );
        placement.record(
            t0 + Duration::from_secs(10),
            reading(&[(7, [900, 1100]), (8, [50, 0])]),
        );
        let w = placement.window(Duration::from_secs(5));
        assert_eq!(w[&7].by_node, NodeNanos::from([(0, 0), (1, 1000)]));
        assert_eq!(w[&7].main_node(), Some((1, 1.0)));
        // 8 ran nowhere in the last 5 s: its time since the oldest reading.
        assert_eq!(w[&8].by_node, NodeNanos::from([(0, 50), (1, 0)]));
        let long = placement.window(Duration::from_secs(10));
        assert_eq!(long[&7].by_node, NodeNanos::from([(0, 800), (1, 1100)]));
    }

    #[test]
    fn a_subtree_sums_its_descendants() {
        let window = HashMap::from([
            (
                1,
                Placement {
                    by_node: NodeNanos::from([(0, 90), (1, 10)]),
                    window: Duration::ZERO,
                },
            ),
            (
                2,
                Placement {
                    by_node: NodeNanos::from([(0, 10), (1, 90)]),
                    window: Duration::ZERO,
                },
            ),
        ]);
        let paths = |id| match id {
            1 => Some("/kubepods/pod1/a".to_owned()),
            2 => Some("/kubepods/pod1/b".to_owned()),
            _ => None,
        };
        let tree = CpuPlacement::subtree(&window, paths);
        assert_eq!(
            tree["/kubepods/pod1"].by_node,
            NodeNanos::from([(0, 100), (1, 100)])
        );
        assert_eq!(tree["/kubepods/pod1/a"].share(0), 0.9);
        assert_eq!(tree["/"].total(), 200);
    }

    #[test]
    fn cpus_are_summed_on_their_nodes() {
        let layout = NodeLayout::from_parts(
            BTreeMap::from([(0, 0), (1, 0), (2, 1), (3, 1)]),
            vec![qosd_common::PfnRange {
                start: 0,
                end: 1,
                node: 0,
                pad: 0,
            }],
        )
        .expect("layout");
        let nodes = CpuNodes::of(&layout, 5).expect("two nodes");
        let mut out = vec![0; 2];
        nodes.add_per_cpu(&[1, 2, 30, 40, 500], &mut out);
        assert_eq!(out, [3, 70], "CPU 4 is on no node");
        nodes.add_on_cpu(2, 5, &mut out);
        assert_eq!(out, [3, 75]);
    }
}
