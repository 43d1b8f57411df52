//! [`NumaInfo`]: the NUMA nodes the topology manager merges over and the distances between
//! them (kubelet's `topologymanager.NUMAInfo`).
//!
//! This module owns the node set (the "default affinity", every node of the machine) and the
//! distance score used by `prefer-closest-numa-nodes`.
use crate::machine::{MachineTopology, NumaMask};

use super::TopologyManagerError;

/// NUMA nodes and distances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NumaInfo {
    nodes: Vec<usize>,
    default_mask: NumaMask,
    /// `distances[a * 64 + b]`, by node id; 0 where unknown.
    distances: Vec<u64>,
}

impl NumaInfo {
    /// The machine's nodes. With `need_distances` (the `prefer-closest-numa-nodes` option),
    /// unknown distances are an error, as in kubelet's `NewNUMAInfo`.
    pub fn from_topology(
        topology: &MachineTopology,
        need_distances: bool,
    ) -> Result<Self, TopologyManagerError> {
        if need_distances && !topology.has_distances() {
            return Err(TopologyManagerError::NoDistances);
        }
        let nodes = topology.numa_node_ids();
        let rows: Vec<Vec<u64>> = nodes
            .iter()
            .map(|&a| {
                nodes
                    .iter()
                    .map(|&b| topology.distance(a, b).unwrap_or(0))
                    .collect()
            })
            .collect();
        Self::new(&nodes, &rows)
    }

    /// Nodes and their distance rows (`rows[i][j]`: from `nodes[i]` to `nodes[j]`; missing
    /// entries count as 0).
    pub fn new(nodes: &[usize], rows: &[Vec<u64>]) -> Result<Self, TopologyManagerError> {
        let default_mask = NumaMask::new(nodes)?;
        let mut distances = vec![0; NumaMask::MAX_NODES * NumaMask::MAX_NODES];
        for (i, &a) in nodes.iter().enumerate() {
            for (j, &b) in nodes.iter().enumerate() {
                let d = rows.get(i).and_then(|r| r.get(j)).copied().unwrap_or(0);
                if let Some(cell) = distances.get_mut(a * NumaMask::MAX_NODES + b) {
                    *cell = d;
                }
            }
        }
        Ok(NumaInfo {
            nodes: nodes.to_vec(),
            default_mask,
            distances,
        })
    }

    /// Node ids, as given.
    pub fn nodes(&self) -> &[usize] {
        &self.nodes
    }

    /// Every node (kubelet's `DefaultAffinityMask`).
    pub fn default_mask(&self) -> NumaMask {
        self.default_mask
    }

    /// The distance between two nodes (0 when unknown).
    pub fn distance(&self, a: usize, b: usize) -> u64 {
        self.distances
            .get(a * NumaMask::MAX_NODES + b)
            .copied()
            .unwrap_or(0)
    }

    /// The sum of distances over every ordered pair of nodes of `mask`, itself included.
    /// kubelet compares the average (this sum over `count²`); masks are only compared by
    /// distance when their counts are equal, so comparing sums gives the same order, exactly.
    pub fn distance_sum(&self, mask: NumaMask) -> u64 {
        let mut sum = 0u64;
        for a in mask.nodes() {
            for b in mask.nodes() {
                sum = sum.saturating_add(self.distance(a, b));
            }
        }
        sum
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::machine::synthetic;

    #[test]
    fn from_topology_reads_distances() {
        let t = synthetic::dual_socket_snc2().unwrap();
        let info = NumaInfo::from_topology(&t, true).unwrap();
        assert_eq!(info.nodes(), &[0, 1, 2, 3]);
        assert_eq!(info.default_mask(), NumaMask::first_n(4));
        assert_eq!(info.distance(0, 1), 11);
        assert_eq!(info.distance(1, 3), 21);
        // {0,1}: 10 + 11 + 11 + 10.
        assert_eq!(info.distance_sum(NumaMask::new(&[0, 1]).unwrap()), 42);
        assert_eq!(info.distance_sum(NumaMask::new(&[1, 2]).unwrap()), 62);
    }

    #[test]
    fn missing_distances_are_an_error_only_when_needed() {
        // kubelet TestNewManager "can't get NUMA distances".
        let cpu = crate::machine::CpuInfo {
            id: 0,
            core: 0,
            package: 0,
            numa_node: 0,
            uncore_cache: 0,
        };
        let node = |id| crate::machine::NumaNodeSpec {
            id,
            memory_bytes: 0,
            hugepages: vec![],
            distances: vec![],
        };
        let t = MachineTopology::new(
            vec![cpu],
            vec![node(0), node(1)],
            &std::collections::BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(
            NumaInfo::from_topology(&t, true),
            Err(TopologyManagerError::NoDistances)
        );
        assert!(NumaInfo::from_topology(&t, false).is_ok());
    }

    #[test]
    fn node_ids_beyond_the_mask_are_rejected() {
        assert!(matches!(
            NumaInfo::new(&[0, 64], &[]),
            Err(TopologyManagerError::Mask(_))
        ));
    }
}
