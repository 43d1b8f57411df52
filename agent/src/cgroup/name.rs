//! Driver-independent cgroup names, kubelet's `CgroupName`: a list of components such as
//! `["kubepods", "burstable", "pod<uid>"]`, and their two on-disk spellings:
//!
//! - cgroupfs: `/kubepods/burstable/pod<uid>`;
//! - systemd: every component becomes a slice nested in its parent, `-` inside a component is
//!   escaped as `_` (systemd reads `-` as a nesting step), e.g.
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid with _>.slice`;
//!   a last component that is a scope unit (`cri-containerd-<id>.scope`, a container's cgroup
//!   made by the runtime) stays as it is inside its parent's slice.
//!
//! Components are validated when a name is built, so a name can never address a path outside
//! the hierarchy it is resolved in.
use std::fmt;

const SYSTEMD_SUFFIX: &str = ".slice";

/// An invalid cgroup name or component.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("invalid cgroup name component {component:?}: {reason}")]
    InvalidComponent {
        component: String,
        reason: &'static str,
    },
    #[error(
        "cgroup name {name} cannot be spelled as a systemd slice: component {component:?} contains '_', which the systemd spelling uses for '-'"
    )]
    NotSystemdSafe { name: String, component: String },
}

/// The abstract name of a cgroup, before any driver-specific spelling. The empty name is the
/// hierarchy root.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CgroupName(Vec<String>);

impl CgroupName {
    /// The hierarchy root (no components).
    #[must_use]
    pub fn root() -> Self {
        Self(Vec::new())
    }

    /// A name from its components, each validated (see [`validate_component`]).
    pub fn new<I, S>(components: I) -> Result<Self, NameError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::root().join(components)
    }

    /// This name extended by one component (kubelet's `NewCgroupName(base, component)`).
    pub fn child(&self, component: &str) -> Result<Self, NameError> {
        self.join([component])
    }

    /// This name extended by several components.
    pub fn join<I, S>(&self, components: I) -> Result<Self, NameError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let mut all = self.0.clone();
        for component in components {
            let component = component.into();
            validate_component(&component)?;
            all.push(component);
        }
        Ok(Self(all))
    }

    /// The components, outermost first.
    #[must_use]
    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// True for the hierarchy root.
    #[must_use]
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// Number of components.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True for the hierarchy root (no components).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The enclosing cgroup; `None` for the root.
    #[must_use]
    pub fn parent(&self) -> Option<Self> {
        let (_, rest) = self.0.split_last()?;
        Some(Self(rest.to_vec()))
    }

    /// True when `self` is `ancestor` or lies below it.
    #[must_use]
    pub fn starts_with(&self, ancestor: &Self) -> bool {
        self.0.starts_with(&ancestor.0)
    }

    /// The cgroupfs spelling, `/a/b/c` (`/` for the root): kubelet's `ToCgroupfs`.
    #[must_use]
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The systemd spelling expanded into its cgroupfs path, kubelet's `ToSystemd`:
    /// `{"kubepods","burstable","pod1234-abcd"}` becomes
    /// `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd.slice`;
    /// the root is `/`.
    ///
    /// Fails for a component containing `_`: that spelling could not be read back (kubelet's
    /// `NewCgroupName` forbids `_` for the same reason).
    pub fn to_systemd(&self) -> Result<String, NameError> {
        if self.0.is_empty() {
            return Ok("/".to_owned());
        }
        let mut path = String::new();
        let mut prefix = String::new();
        let (components, scope) = match self.0.split_last() {
            Some((last, parents)) if is_scope(last) => (parents, Some(last)),
            _ => (self.0.as_slice(), None),
        };
        for component in components {
            if component.contains('_') {
                return Err(NameError::NotSystemdSafe {
                    name: self.to_cgroupfs(),
                    component: component.clone(),
                });
            }
            if !prefix.is_empty() {
                prefix.push('-');
            }
            prefix.push_str(&component.replace('-', "_"));
            path.push('/');
            path.push_str(&prefix);
            path.push_str(SYSTEMD_SUFFIX);
        }
        if let Some(scope) = scope {
            path.push('/');
            path.push_str(scope);
        }
        Ok(path)
    }

    /// Reads a cgroupfs path back into a name, kubelet's `ParseCgroupfsToCgroupName`: `/` and
    /// the empty string are the root; one leading `/` is optional.
    pub fn parse_cgroupfs(path: &str) -> Result<Self, NameError> {
        let relative = path.strip_prefix('/').unwrap_or(path);
        if relative.is_empty() {
            return Ok(Self::root());
        }
        Self::new(relative.split('/'))
    }

    /// Reads a systemd slice (its full path or only the last slice) back into a name, kubelet's
    /// `ParseSystemdToCgroupName`: the last path element without `.slice`, split at `-`, with
    /// `_` restored to `-`. `/` and `-.slice` are the root.
    pub fn parse_systemd(path: &str) -> Result<Self, NameError> {
        let mut elements = path.rsplit('/').filter(|s| !s.is_empty());
        let base = elements.next().unwrap_or_default();
        if is_scope(base) {
            // A runtime's scope inside its slice (`.../kubepods-pod<uid>.slice/cri-containerd-<id>.scope`).
            let slice = elements.next().unwrap_or_default();
            return Self::parse_systemd(slice)?.child(base);
        }
        let unit = base.strip_suffix(SYSTEMD_SUFFIX).unwrap_or(base);
        if unit.is_empty() || unit == "-" {
            return Ok(Self::root());
        }
        Self::new(unit.split('-').map(|part| part.replace('_', "-")))
    }
}

/// A systemd scope unit name (`cri-containerd-<id>.scope`): the cgroup a container runtime
/// makes for a container under its pod's slice. In a [`CgroupName`] it is the last component,
/// kept as it is in the systemd spelling (kubelet names slices only; runc's systemd driver
/// names the scopes).
#[must_use]
pub fn is_scope(component: &str) -> bool {
    component.len() > SCOPE_SUFFIX.len() && component.ends_with(SCOPE_SUFFIX)
}

const SCOPE_SUFFIX: &str = ".scope";

/// kubelet's `IsSystemdStyleName`: the name ends in `.slice`.
#[must_use]
pub fn is_systemd_style_name(name: &str) -> bool {
    name.ends_with(SYSTEMD_SUFFIX)
}

/// Rejects components that are empty, `.`, `..`, or contain `/` or NUL: each would make the
/// name address another directory than the one it spells (or none).
pub fn validate_component(component: &str) -> Result<(), NameError> {
    let reason = if component.is_empty() {
        "empty"
    } else if component == "." || component == ".." {
        "a relative directory reference"
    } else if component.contains('/') {
        "contains '/'"
    } else if component.contains('\0') {
        "contains NUL"
    } else {
        return Ok(());
    };
    Err(NameError::InvalidComponent {
        component: component.to_owned(),
        reason,
    })
}

impl fmt::Display for CgroupName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_cgroupfs())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(components: &[&str]) -> CgroupName {
        CgroupName::new(components.iter().copied()).unwrap()
    }

    /// Rows of kubelet's TestCgroupNameToSystemd.
    #[test]
    fn to_systemd_matches_kubelet() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "/"),
            (&["Burstable"], "/Burstable.slice"),
            (
                &["Burstable", "pod-123"],
                "/Burstable.slice/Burstable-pod_123.slice",
            ),
            (
                &["BestEffort", "pod-6c1a4e95-6bb6-11e6-bc26-28d2444e470d"],
                "/BestEffort.slice/BestEffort-pod_6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
            ),
            (&["kubepods"], "/kubepods.slice"),
            // The example of kubelet's ToSystemd doc comment.
            (
                &["kubepods", "burstable", "pod1234-abcd-5678-efgh"],
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice",
            ),
        ];
        for (components, expected) in cases {
            assert_eq!(
                name(components).to_systemd().unwrap(),
                *expected,
                "{components:?}"
            );
        }
    }

    /// Container scopes as runc's systemd driver names them (`<prefix>-<id>.scope` inside
    /// the pod's slice), for containerd, CRI-O and Docker.
    #[test]
    fn a_runtime_scope_stays_as_it_is_inside_its_slice() {
        for scope in [
            "cri-containerd-0a1b2c.scope",
            "crio-0a1b2c.scope",
            "docker-0a1b2c.scope",
        ] {
            let n = name(&["kubepods", "burstable", "pod12-34", scope]);
            let path = format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod12_34.slice/{scope}"
            );
            assert_eq!(n.to_systemd().unwrap(), path);
            assert_eq!(CgroupName::parse_systemd(&path).unwrap(), n);
        }
        // ".scope" alone is no scope name; in the middle a component is a slice as ever.
        assert!(!is_scope(".scope"));
        assert_eq!(
            name(&["a", "b.scope", "c"]).to_systemd().unwrap(),
            "/a.slice/a-b.scope.slice/a-b.scope-c.slice"
        );
    }

    /// Rows of kubelet's TestCgroupNameToSystemdBasename (the last slice only).
    #[test]
    fn systemd_basename_matches_kubelet() {
        let cases: &[(&[&str], &str)] = &[
            (&["system"], "system.slice"),
            (&["system", "Burstable"], "system-Burstable.slice"),
            (&["Burstable", "pod-123"], "Burstable-pod_123.slice"),
            (&["test", "a", "b"], "test-a-b.slice"),
            (&["test", "a", "b", "Burstable"], "test-a-b-Burstable.slice"),
            (&["Burstable"], "Burstable.slice"),
            (
                &["BestEffort", "pod-6c1a4e95-6bb6-11e6-bc26-28d2444e470d"],
                "BestEffort-pod_6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
            ),
        ];
        for (components, expected) in cases {
            let full = name(components).to_systemd().unwrap();
            assert_eq!(full.rsplit('/').next(), Some(*expected), "{components:?}");
        }
    }

    /// Rows of kubelet's TestCgroupNameToCgroupfs, plus a pod path.
    #[test]
    fn to_cgroupfs_matches_kubelet() {
        assert_eq!(CgroupName::root().to_cgroupfs(), "/");
        assert_eq!(name(&["Burstable"]).to_cgroupfs(), "/Burstable");
        assert_eq!(
            name(&["kubepods", "burstable", "pod1234-abcd"]).to_cgroupfs(),
            "/kubepods/burstable/pod1234-abcd"
        );
    }

    #[test]
    fn parse_cgroupfs_is_the_inverse_of_to_cgroupfs() {
        assert_eq!(CgroupName::parse_cgroupfs("/").unwrap(), CgroupName::root());
        assert_eq!(CgroupName::parse_cgroupfs("").unwrap(), CgroupName::root());
        let pod = name(&["kubepods", "besteffort", "pod-1"]);
        assert_eq!(CgroupName::parse_cgroupfs(&pod.to_cgroupfs()).unwrap(), pod);
        assert_eq!(
            CgroupName::parse_cgroupfs("kubepods/burstable").unwrap(),
            name(&["kubepods", "burstable"])
        );
    }

    #[test]
    fn parse_systemd_reads_the_last_slice_and_unescapes() {
        let pod = name(&["kubepods", "burstable", "pod1234-abcd-5678-efgh"]);
        let path = pod.to_systemd().unwrap();
        assert_eq!(CgroupName::parse_systemd(&path).unwrap(), pod);
        assert_eq!(
            CgroupName::parse_systemd("kubepods-burstable.slice").unwrap(),
            name(&["kubepods", "burstable"])
        );
        assert_eq!(CgroupName::parse_systemd("/").unwrap(), CgroupName::root());
        assert_eq!(
            CgroupName::parse_systemd("-.slice").unwrap(),
            CgroupName::root()
        );
        assert!(is_systemd_style_name("kubepods.slice"));
        assert!(!is_systemd_style_name("/kubepods"));
    }

    #[test]
    fn components_that_escape_or_vanish_are_rejected_by_name() {
        for bad in ["", ".", "..", "a/b", "/", "nul\0byte"] {
            let err = CgroupName::new(["kubepods", bad]).expect_err(bad);
            assert!(
                err.to_string().contains(&format!("{bad:?}")),
                "{bad:?}: {err}"
            );
            assert!(name(&["kubepods"]).child(bad).is_err(), "{bad:?}");
        }
        assert!(CgroupName::parse_cgroupfs("/a//b").is_err());
        assert!(CgroupName::parse_cgroupfs("/a/../b").is_err());
        assert!(CgroupName::parse_systemd("a--b.slice").is_err());
    }

    #[test]
    fn underscores_cannot_be_spelled_for_systemd() {
        let err = name(&["kubepods", "pod_1"]).to_systemd().expect_err("_");
        assert!(err.to_string().contains("\"pod_1\""), "{err}");
        assert_eq!(name(&["pod_1"]).to_cgroupfs(), "/pod_1");
    }

    #[test]
    fn ancestry() {
        let root = name(&["qosd"]);
        let pod = root.join(["kubepods", "pod1"]).unwrap();
        assert!(pod.starts_with(&root));
        assert!(pod.starts_with(&pod));
        assert!(!root.starts_with(&pod));
        assert!(!name(&["qosd2", "x"]).starts_with(&root));
        assert_eq!(pod.parent().unwrap(), name(&["qosd", "kubepods"]));
        assert_eq!(CgroupName::root().parent(), None);
        assert_eq!(pod.len(), 3);
        assert_eq!(pod.to_string(), "/qosd/kubepods/pod1");
    }
}
