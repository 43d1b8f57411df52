//! The subset of the Kubernetes `v1` Pod that qosd uses, deserialisable from YAML and JSON,
//! with kubelet's defaults and the resource arithmetic kubelet uses for admission.
//!
//! This module owns the pod data types, defaulting ([`Pod::apply_defaults`]: namespace, uid,
//! requests from limits) and resource accessors. `apiVersion` / `kind` are checked by the
//! manifest reader ([`super::manifest`]), validation lives in [`super::validate`] and QoS
//! classification in [`super::qos`].
//!
//! Fields qosd does not use (`image`, `ports`, `volumes`, probes, `valueFrom`, ...) are accepted
//! and ignored. A `null` collection or object is read as empty, as Kubernetes does.
use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer};

use super::quantity::Quantity;

/// The CPU resource name; quantities in cores (`500m` = half a core).
pub const CPU: &str = "cpu";
/// The memory resource name; quantities in bytes.
pub const MEMORY: &str = "memory";

/// A resource name (`cpu`, `memory`, `hugepages-2Mi`, `example.com/gpu`) to quantity map.
pub type ResourceList = BTreeMap<String, Quantity>;

/// A pod: metadata, spec and (from the API server or kubelet) status. `apiVersion: v1` /
/// `kind: Pod` are checked by the manifest reader.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pod {
    #[serde(default, deserialize_with = "null_default")]
    pub metadata: ObjectMeta,
    #[serde(default, deserialize_with = "null_default")]
    pub spec: PodSpec,
    /// What kubelet reports; empty in a manifest (standalone mode ignores it).
    #[serde(default, deserialize_with = "null_default")]
    pub status: PodStatus,
}

/// The parts of a pod's status qosd reads beside kubelet: which containers run under which
/// runtime id, the phase, and kubelet's own QoS class.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodStatus {
    /// `Pending`, `Running`, `Succeeded`, `Failed` or `Unknown`; empty when not reported.
    #[serde(default, deserialize_with = "null_default")]
    pub phase: String,
    /// kubelet's `Guaranteed`, `Burstable` or `BestEffort`.
    #[serde(default, deserialize_with = "null_default")]
    pub qos_class: String,
    #[serde(default, deserialize_with = "null_default")]
    pub container_statuses: Vec<ContainerStatus>,
    #[serde(default, deserialize_with = "null_default")]
    pub init_container_statuses: Vec<ContainerStatus>,
}

impl PodStatus {
    /// True in `Succeeded` and `Failed`: kubelet has removed (or is removing) the pod's
    /// cgroups and keeps no resources for it.
    #[must_use]
    pub fn is_terminal(&self) -> bool {
        matches!(self.phase.as_str(), "Succeeded" | "Failed")
    }
}

/// One container's status.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerStatus {
    pub name: String,
    /// `<runtime>://<id>` (`containerd://...`, `cri-o://...`, `docker://...`); empty until
    /// the runtime created the container.
    #[serde(rename = "containerID", default, deserialize_with = "null_default")]
    pub container_id: String,
    #[serde(default, deserialize_with = "null_default")]
    pub restart_count: i64,
}

impl ContainerStatus {
    /// The runtime and the id of `containerID` (`("containerd", "4f5c...")`), when set.
    #[must_use]
    pub fn runtime_id(&self) -> Option<(&str, &str)> {
        self.container_id
            .split_once("://")
            .filter(|(runtime, id)| !runtime.is_empty() && !id.is_empty())
    }
}

/// Pod metadata.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta {
    /// Required; validated as a DNS-1123 subdomain.
    #[serde(default, deserialize_with = "null_default")]
    pub name: String,
    /// Empty means `default` ([`Pod::apply_defaults`]).
    #[serde(default, deserialize_with = "null_default")]
    pub namespace: String,
    /// Empty means derived from namespace/name ([`derive_uid`], applied by
    /// [`Pod::apply_defaults`]).
    #[serde(default, deserialize_with = "null_default")]
    pub uid: String,
    #[serde(default, deserialize_with = "null_default")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, deserialize_with = "null_default")]
    pub annotations: BTreeMap<String, String>,
    /// Set once the pod is being deleted (RFC 3339); the API server's, not a manifest's.
    #[serde(default, deserialize_with = "null_default")]
    pub deletion_timestamp: Option<String>,
}

/// Pod spec.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodSpec {
    #[serde(default, deserialize_with = "null_default")]
    pub containers: Vec<Container>,
    #[serde(default, deserialize_with = "null_default")]
    pub init_containers: Vec<Container>,
    #[serde(default, deserialize_with = "null_default")]
    pub restart_policy: RestartPolicy,
    #[serde(
        default = "default_grace_period",
        deserialize_with = "grace_period_or_default"
    )]
    pub termination_grace_period_seconds: i64,
    /// Pod-level resources (the `PodLevelResources` feature). qosd does not implement them;
    /// validation rejects a pod that sets them rather than classify it differently from kubelet.
    #[serde(default, deserialize_with = "null_default")]
    pub resources: Option<ResourceRequirements>,
    /// The node the scheduler bound the pod to (API pods).
    #[serde(default, deserialize_with = "null_default")]
    pub node_name: String,
}

impl Default for PodSpec {
    fn default() -> Self {
        Self {
            containers: Vec::new(),
            init_containers: Vec::new(),
            restart_policy: RestartPolicy::default(),
            termination_grace_period_seconds: DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS,
            resources: None,
            node_name: String::new(),
        }
    }
}

/// kubelet's default `terminationGracePeriodSeconds`.
pub const DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS: i64 = 30;

/// The pod's restart policy (`spec.restartPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum RestartPolicy {
    #[default]
    Always,
    OnFailure,
    Never,
}

impl TryFrom<String> for RestartPolicy {
    type Error = UnsupportedValue;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        match value.as_str() {
            "Always" => Ok(Self::Always),
            "OnFailure" => Ok(Self::OnFailure),
            "Never" => Ok(Self::Never),
            _ => Err(UnsupportedValue {
                value,
                supported: &["Always", "OnFailure", "Never"],
            }),
        }
    }
}

/// A container's own restart policy: only `Always`, only on init containers (sidecars).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum ContainerRestartPolicy {
    Always,
}

impl TryFrom<String> for ContainerRestartPolicy {
    type Error = UnsupportedValue;

    fn try_from(value: String) -> Result<Self, Self::Error> {
        match value.as_str() {
            "Always" => Ok(Self::Always),
            _ => Err(UnsupportedValue {
                value,
                supported: &["Always"],
            }),
        }
    }
}

/// A value outside an enumerated field's set, in the API server's words (`field.NotSupported`:
/// `Unsupported value: "Sometimes": supported values: "Always", "OnFailure", "Never"`); the
/// manifest reader puts the field's path in front.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnsupportedValue {
    pub value: String,
    pub supported: &'static [&'static str],
}

impl std::fmt::Display for UnsupportedValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Unsupported value: {:?}: supported values: ", self.value)?;
        for (i, value) in self.supported.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{value:?}")?;
        }
        Ok(())
    }
}

impl std::error::Error for UnsupportedValue {}

/// A container (app or init).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Container {
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub command: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub args: Vec<String>,
    #[serde(default, deserialize_with = "null_default")]
    pub env: Vec<EnvVar>,
    #[serde(default, deserialize_with = "null_default")]
    pub resources: ResourceRequirements,
    /// `Always` on an init container makes it a sidecar that keeps running beside the app
    /// containers (its requests then add to theirs).
    #[serde(default, deserialize_with = "null_default")]
    pub restart_policy: Option<ContainerRestartPolicy>,
}

/// An environment variable. `valueFrom` is accepted and ignored (qosd has no API server).
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
pub struct EnvVar {
    pub name: String,
    #[serde(default, deserialize_with = "null_default")]
    pub value: Option<String>,
}

/// Requests and limits of a container.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
pub struct ResourceRequirements {
    #[serde(default, deserialize_with = "null_default")]
    pub requests: ResourceList,
    #[serde(default, deserialize_with = "null_default")]
    pub limits: ResourceList,
}

impl ResourceRequirements {
    /// True when neither requests nor limits are set.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.requests.is_empty() && self.limits.is_empty()
    }
}

/// A pod's effective requests for admission, in the units kubelet compares them in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PodRequests {
    /// CPU in millicores (`MilliValue()` of the exact sum).
    pub cpu_millis: i64,
    /// Memory in bytes (`Value()` of the exact sum).
    pub memory_bytes: i64,
}

impl Pod {
    /// Applies kubelet's defaults for a static pod: namespace `default`, a uid derived from
    /// namespace/name when none is given, and (API defaulting) each container's unset requests
    /// copied from its limits. Idempotent.
    pub fn apply_defaults(&mut self) {
        if self.metadata.namespace.is_empty() {
            "default".clone_into(&mut self.metadata.namespace);
        }
        if self.metadata.uid.is_empty() {
            self.metadata.uid = derive_uid(&self.metadata.namespace, &self.metadata.name);
        }
        for container in self
            .spec
            .containers
            .iter_mut()
            .chain(self.spec.init_containers.iter_mut())
        {
            let resources = &mut container.resources;
            for (name, limit) in &resources.limits {
                resources.requests.entry(name.clone()).or_insert(*limit);
            }
        }
    }

    /// A fingerprint of this version of the pod: 32 hex digits, the 128-bit FNV-1a hash of its
    /// metadata and spec as this build of qosd models them. Its running containers carry it
    /// (kubelet's container hash plays this part), so a qosd restarted after the manifest
    /// changed tells the running version from the new one. A qosd upgrade whose pod model
    /// reads a manifest differently gives a different fingerprint, and restarts the pod once.
    #[must_use]
    pub fn fingerprint(&self) -> String {
        let mut hash = Fnv1a128::new();
        hash.write(format!("{:?}\n{:?}", self.metadata, self.spec).as_bytes());
        format!("{:032x}", hash.finish())
    }

    /// `namespace/name`, the key pods are unique by.
    #[must_use]
    pub fn full_name(&self) -> String {
        format!("{}/{}", self.metadata.namespace, self.metadata.name)
    }

    /// The pod's uid: the given one, else the derived one (same as after
    /// [`Pod::apply_defaults`]).
    #[must_use]
    pub fn uid(&self) -> String {
        if self.metadata.uid.is_empty() {
            let namespace = if self.metadata.namespace.is_empty() {
                "default"
            } else {
                &self.metadata.namespace
            };
            derive_uid(namespace, &self.metadata.name)
        } else {
            self.metadata.uid.clone()
        }
    }

    /// Effective cpu and memory requests for admission ([`PodSpec::effective_requests`]).
    #[must_use]
    pub fn effective_requests(&self) -> PodRequests {
        self.spec.effective_requests()
    }
}

impl PodSpec {
    /// All containers: app containers then init containers (the order kubelet's QoS uses).
    pub fn all_containers(&self) -> impl Iterator<Item = &Container> {
        self.containers.iter().chain(self.init_containers.iter())
    }

    /// The pod's effective request of one resource as kubelet computes it for admission
    /// (`resourcehelper.PodRequests`): the sum over app containers, raised to the peak of the
    /// init phase. Init containers run one at a time, each beside the sidecars (init containers
    /// with `restartPolicy: Always`) declared before it; sidecars also add to the app sum.
    /// Requests default to limits. `None` when no container requests the resource.
    #[must_use]
    pub fn effective_request(&self, resource: &str) -> Option<Quantity> {
        let mut total: Option<Quantity> = None;
        for container in &self.containers {
            if let Some(q) = container.request(resource) {
                total = Some(add(total, q));
            }
        }
        let mut sidecars: Option<Quantity> = None;
        let mut init_peak: Option<Quantity> = None;
        for container in &self.init_containers {
            let own = container.request(resource);
            let phase = if container.is_sidecar() {
                if let Some(q) = own {
                    total = Some(add(total, q));
                    sidecars = Some(add(sidecars, q));
                }
                sidecars
            } else {
                match (own, sidecars) {
                    (Some(q), s) => Some(add(s, q)),
                    (None, s) => s,
                }
            };
            init_peak = max_of(init_peak, phase);
        }
        max_of(total, init_peak)
    }

    /// Effective cpu (millicores) and memory (bytes) requests for admission.
    #[must_use]
    pub fn effective_requests(&self) -> PodRequests {
        PodRequests {
            cpu_millis: self.effective_request(CPU).map_or(0, |q| q.milli_value()),
            memory_bytes: self.effective_request(MEMORY).map_or(0, |q| q.value()),
        }
    }
}

impl Container {
    /// The request of a resource, defaulted from the limit when only the limit is set (as the
    /// API server's defaulting does).
    #[must_use]
    pub fn request(&self, resource: &str) -> Option<Quantity> {
        self.resources
            .requests
            .get(resource)
            .or_else(|| self.resources.limits.get(resource))
            .copied()
    }

    /// The limit of a resource.
    #[must_use]
    pub fn limit(&self, resource: &str) -> Option<Quantity> {
        self.resources.limits.get(resource).copied()
    }

    /// CPU request in millicores; 0 when unset.
    #[must_use]
    pub fn cpu_request_millis(&self) -> i64 {
        self.request(CPU).map_or(0, |q| q.milli_value())
    }

    /// CPU limit in millicores; `None` when unset (unlimited).
    #[must_use]
    pub fn cpu_limit_millis(&self) -> Option<i64> {
        self.limit(CPU).map(|q| q.milli_value())
    }

    /// Memory request in bytes; 0 when unset.
    #[must_use]
    pub fn memory_request_bytes(&self) -> i64 {
        self.request(MEMORY).map_or(0, |q| q.value())
    }

    /// Memory limit in bytes; `None` when unset (unlimited).
    #[must_use]
    pub fn memory_limit_bytes(&self) -> Option<i64> {
        self.limit(MEMORY).map(|q| q.value())
    }

    /// True for an init container that keeps running (`restartPolicy: Always`).
    #[must_use]
    pub fn is_sidecar(&self) -> bool {
        self.restart_policy == Some(ContainerRestartPolicy::Always)
    }
}

/// The uid of a pod whose manifest gives none: 32 lowercase hex digits, the 128-bit FNV-1a
/// hash of `qosd-pod-uid:<namespace>/<name>`.
///
/// FNV-1a is specified by its constants, implemented here, and independent of the Rust release,
/// the process and the machine (unlike `RandomState`, and unlike `DefaultHasher`, whose
/// algorithm std may change), so a pod keeps its uid, and therefore its cgroup, across qosd
/// restarts and upgrades. `/` cannot occur in a namespace, so distinct pods hash distinct
/// inputs; the manifest reader still rejects a second pod with an already used uid.
///
/// Unlike kubelet (which hashes the file path and the whole pod, so any edit gives a new uid and
/// a recreated pod), the uid depends only on namespace/name: an edited manifest is an update of
/// the same pod.
#[must_use]
pub fn derive_uid(namespace: &str, name: &str) -> String {
    let mut hash = Fnv1a128::new();
    hash.write(b"qosd-pod-uid:");
    hash.write(namespace.as_bytes());
    hash.write(b"/");
    hash.write(name.as_bytes());
    format!("{:032x}", hash.finish())
}

/// 128-bit FNV-1a (<http://www.isthe.com/chongo/tech/comp/fnv/>).
struct Fnv1a128(u128);

impl Fnv1a128 {
    const OFFSET_BASIS: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;

    fn new() -> Self {
        Self(Self::OFFSET_BASIS)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u128::from(b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    fn finish(&self) -> u128 {
        self.0
    }
}

fn add(total: Option<Quantity>, q: Quantity) -> Quantity {
    total.unwrap_or(Quantity::ZERO).saturating_add(q)
}

fn max_of(a: Option<Quantity>, b: Option<Quantity>) -> Option<Quantity> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.max(b)),
        (a, None) => a,
        (None, b) => b,
    }
}

fn default_grace_period() -> i64 {
    DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS
}

/// `null` reads as the type's default (empty list, map or object).
fn null_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

fn grace_period_or_default<'de, D: Deserializer<'de>>(deserializer: D) -> Result<i64, D::Error> {
    Ok(Option::<i64>::deserialize(deserializer)?
        .unwrap_or(DEFAULT_TERMINATION_GRACE_PERIOD_SECONDS))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(text: &str) -> Quantity {
        Quantity::parse(text).unwrap()
    }

    fn container(name: &str, requests: &[(&str, &str)], limits: &[(&str, &str)]) -> Container {
        let list = |items: &[(&str, &str)]| {
            items
                .iter()
                .map(|(k, v)| ((*k).to_owned(), q(v)))
                .collect::<ResourceList>()
        };
        Container {
            name: name.to_owned(),
            resources: ResourceRequirements {
                requests: list(requests),
                limits: list(limits),
            },
            ..Container::default()
        }
    }

    fn sidecar(mut c: Container) -> Container {
        c.restart_policy = Some(ContainerRestartPolicy::Always);
        c
    }

    #[test]
    fn a_fingerprint_is_stable_and_follows_every_change_of_metadata_and_spec() {
        let mut pod = Pod {
            metadata: ObjectMeta {
                name: "web".to_owned(),
                namespace: "default".to_owned(),
                ..ObjectMeta::default()
            },
            spec: PodSpec {
                containers: vec![container("c", &[("cpu", "100m")], &[])],
                ..PodSpec::default()
            },
            status: PodStatus::default(),
        };
        let first = pod.fingerprint();
        assert_eq!(first.len(), 32);
        assert_eq!(pod.clone().fingerprint(), first);
        pod.status.phase = "Running".to_owned();
        assert_eq!(
            pod.fingerprint(),
            first,
            "the status is not the pod's version"
        );
        pod.spec.containers[0] = container("c", &[("cpu", "120m")], &[]);
        let resized = pod.fingerprint();
        assert_ne!(resized, first);
        pod.metadata
            .labels
            .insert("app".to_owned(), "web".to_owned());
        assert_ne!(pod.fingerprint(), resized);
    }

    #[test]
    fn fnv1a_128_matches_the_published_test_vectors() {
        let mut h = Fnv1a128::new();
        assert_eq!(h.finish(), 0x6c62272e07bb014262b821756295c58d);
        h.write(b"a");
        assert_eq!(h.finish(), 0xd228cb696f1a8caf78912b704e4a8964);
    }

    #[test]
    fn derived_uid_is_stable_distinct_and_hex() {
        let uid = derive_uid("default", "web");
        // Deterministic: the same input gives the same uid in every process.
        assert_eq!(uid, derive_uid("default", "web"));
        assert_eq!(uid.len(), 32);
        assert!(
            uid.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        );
        assert_ne!(uid, derive_uid("default", "web2"));
        assert_ne!(uid, derive_uid("kube-system", "web"));
        // The separator keeps namespace and name apart.
        assert_ne!(derive_uid("ab", "c"), derive_uid("a", "bc"));
    }

    #[test]
    fn derived_uid_is_pinned_across_releases() {
        // Computed once from the FNV-1a definition; must never change.
        let mut h = Fnv1a128::new();
        h.write(b"qosd-pod-uid:default/web");
        assert_eq!(derive_uid("default", "web"), format!("{:032x}", h.finish()));
        assert_eq!(derive_uid("default", "web"), PINNED_DEFAULT_WEB_UID);
    }

    const PINNED_DEFAULT_WEB_UID: &str = "b94d436ab6efb97fb87851ece0bfb625";

    #[test]
    fn deserializes_yaml_with_defaults_and_ignores_unknown_fields() {
        let yaml = r#"
metadata:
  name: web
  labels: {app: web}
  annotations: null
spec:
  nodeSelector: {disk: ssd}
  containers:
  - name: app
    image: nginx
    ports: [{containerPort: 80}]
    command: ["/bin/sh", "-c"]
    args: ["sleep 1"]
    env:
    - {name: A, value: "1"}
    - {name: B, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    resources:
      limits: {cpu: 1, memory: 128Mi}
    livenessProbe: {exec: {command: [true]}}
  volumes: []
"#;
        let mut pod: Pod = serde_yaml_ng::from_str(yaml).unwrap();
        assert_eq!(pod.metadata.namespace, "");
        assert_eq!(pod.spec.restart_policy, RestartPolicy::Always);
        assert_eq!(pod.spec.termination_grace_period_seconds, 30);
        assert!(pod.spec.init_containers.is_empty());
        let c = &pod.spec.containers[0];
        assert_eq!(c.command, ["/bin/sh", "-c"]);
        assert_eq!(c.args, ["sleep 1"]);
        assert_eq!(c.env[0].value.as_deref(), Some("1"));
        assert_eq!(c.env[1].value, None);
        assert!(c.resources.requests.is_empty());
        assert_eq!(pod.metadata.labels["app"], "web");

        pod.apply_defaults();
        assert_eq!(pod.metadata.namespace, "default");
        assert_eq!(pod.metadata.uid, derive_uid("default", "web"));
        assert_eq!(pod.uid(), pod.metadata.uid);
        let c = &pod.spec.containers[0];
        assert_eq!(c.resources.requests["cpu"], q("1"));
        assert_eq!(c.resources.requests["memory"], q("128Mi"));
        let again = {
            let mut p = pod.clone();
            p.apply_defaults();
            p
        };
        assert_eq!(again, pod, "apply_defaults is idempotent");
    }

    #[test]
    fn deserializes_json_and_keeps_an_explicit_uid_and_policy() {
        let json = r#"{"apiVersion":"v1","kind":"Pod",
            "metadata":{"name":"job","namespace":"batch","uid":"1234-abcd"},
            "spec":{"restartPolicy":"OnFailure","terminationGracePeriodSeconds":5,
              "containers":[{"name":"c","resources":{"requests":{"cpu":"250m"}}}]}}"#;
        let mut pod: Pod = serde_json::from_str(json).unwrap();
        pod.apply_defaults();
        assert_eq!(pod.metadata.uid, "1234-abcd");
        assert_eq!(pod.full_name(), "batch/job");
        assert_eq!(pod.spec.restart_policy, RestartPolicy::OnFailure);
        assert_eq!(pod.spec.termination_grace_period_seconds, 5);
        assert_eq!(pod.spec.containers[0].cpu_request_millis(), 250);
    }

    #[test]
    fn unknown_restart_policy_is_an_error() {
        let err = serde_json::from_str::<PodSpec>(r#"{"restartPolicy":"Sometimes"}"#)
            .expect_err("bad policy");
        assert!(err.to_string().contains("Sometimes"), "{err}");
    }

    #[test]
    fn container_accessors_default_requests_from_limits() {
        let c = container(
            "c",
            &[("memory", "64Mi")],
            &[("cpu", "500m"), ("memory", "128Mi")],
        );
        assert_eq!(
            c.cpu_request_millis(),
            500,
            "request defaulted from the limit"
        );
        assert_eq!(c.cpu_limit_millis(), Some(500));
        assert_eq!(c.memory_request_bytes(), 64 << 20);
        assert_eq!(c.memory_limit_bytes(), Some(128 << 20));
        let none = container("n", &[], &[]);
        assert_eq!(none.cpu_request_millis(), 0);
        assert_eq!(none.cpu_limit_millis(), None);
        assert_eq!(none.memory_limit_bytes(), None);
    }

    #[test]
    fn effective_requests_sum_app_containers() {
        let spec = PodSpec {
            containers: vec![
                container("a", &[("cpu", "100m"), ("memory", "100Mi")], &[]),
                container("b", &[("cpu", "250m")], &[("memory", "1Gi")]),
            ],
            ..PodSpec::default()
        };
        assert_eq!(
            spec.effective_requests(),
            PodRequests {
                cpu_millis: 350,
                memory_bytes: (100 << 20) + (1 << 30)
            }
        );
    }

    #[test]
    fn effective_requests_take_the_max_of_app_sum_and_each_init_container() {
        // Mirrors the example of kubernetes' resource helpers: init 2 cpu / 1G and 2 cpu / 3G,
        // apps 2 cpu / 1G and 1 cpu / 1G -> 3 cpu, 3G.
        let spec = PodSpec {
            init_containers: vec![
                container("i1", &[("cpu", "2"), ("memory", "1G")], &[]),
                container("i2", &[("cpu", "2"), ("memory", "3G")], &[]),
            ],
            containers: vec![
                container("c1", &[("cpu", "2"), ("memory", "1G")], &[]),
                container("c2", &[("cpu", "1"), ("memory", "1G")], &[]),
            ],
            ..PodSpec::default()
        };
        assert_eq!(
            spec.effective_requests(),
            PodRequests {
                cpu_millis: 3000,
                memory_bytes: 3_000_000_000
            }
        );
        // Per resource: the init peak wins for cpu only.
        let spec = PodSpec {
            init_containers: vec![container("i", &[("cpu", "4")], &[("memory", "10Mi")])],
            containers: vec![container("c", &[("cpu", "1"), ("memory", "1Gi")], &[])],
            ..PodSpec::default()
        };
        assert_eq!(spec.effective_requests().cpu_millis, 4000);
        assert_eq!(spec.effective_requests().memory_bytes, 1 << 30);
    }

    #[test]
    fn effective_requests_count_sidecars_beside_apps_and_later_init_containers() {
        let spec = PodSpec {
            init_containers: vec![
                container("before", &[("cpu", "1")], &[]),
                sidecar(container("proxy", &[("cpu", "500m")], &[])),
                container("after", &[("cpu", "1")], &[]),
            ],
            containers: vec![container("app", &[("cpu", "200m")], &[])],
            ..PodSpec::default()
        };
        // Apps + sidecar = 700m; init peak = "after" beside the sidecar = 1500m.
        assert_eq!(spec.effective_requests().cpu_millis, 1500);
        let spec = PodSpec {
            init_containers: vec![sidecar(container("proxy", &[("cpu", "500m")], &[]))],
            containers: vec![container("app", &[("cpu", "2")], &[])],
            ..PodSpec::default()
        };
        assert_eq!(spec.effective_requests().cpu_millis, 2500);
    }

    #[test]
    fn effective_requests_round_the_exact_sum_up() {
        let spec = PodSpec {
            containers: vec![
                container("a", &[("cpu", "0.5m")], &[]),
                container("b", &[("cpu", "0.5m")], &[]),
            ],
            ..PodSpec::default()
        };
        assert_eq!(
            spec.effective_requests().cpu_millis,
            1,
            "0.5m + 0.5m = 1m, not 2m"
        );
        assert_eq!(spec.effective_request("nvidia.com/gpu"), None);
    }
}
