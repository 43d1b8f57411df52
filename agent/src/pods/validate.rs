//! Pod validation: the subset of the API server's `ValidatePod` that matters to qosd, plus the
//! rules that keep names safe to use in cgroup paths and process arguments.
//!
//! This module owns the DNS-1123 name checks ([`is_dns1123_label`], [`is_dns1123_subdomain`]),
//! the uid format ([`is_valid_uid`]) and [`validate_pod`], which reports every problem with the
//! field path and offending value. Run it on a defaulted pod ([`Pod::apply_defaults`]).
use std::collections::BTreeMap;
use std::fmt;

use super::model::{Container, Pod, ResourceList};

/// Maximum length of a DNS-1123 label (namespace, container name).
pub const DNS1123_LABEL_MAX_LEN: usize = 63;
/// Maximum length of a DNS-1123 subdomain (pod name).
pub const DNS1123_SUBDOMAIN_MAX_LEN: usize = 253;
/// Maximum length of a pod uid (a UUID is 36, a derived uid 32).
pub const UID_MAX_LEN: usize = 64;

/// One problem with a pod, naming the field (`spec.containers[1].name`) and the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ValidationError {
    #[error("{field}: required value")]
    Required { field: String },
    #[error("{field}: {value:?}: {reason}")]
    Invalid {
        field: String,
        value: String,
        reason: String,
    },
    #[error("{field}: {value:?}: duplicate name (also {first})")]
    Duplicate {
        field: String,
        value: String,
        first: String,
    },
    #[error("{field}: {reason}")]
    Unsupported { field: String, reason: String },
}

impl ValidationError {
    /// The field path of the problem.
    #[must_use]
    pub fn field(&self) -> &str {
        match self {
            Self::Required { field }
            | Self::Invalid { field, .. }
            | Self::Duplicate { field, .. }
            | Self::Unsupported { field, .. } => field,
        }
    }

    fn prefix(&mut self, prefix: &str) {
        match self {
            Self::Required { field }
            | Self::Invalid { field, .. }
            | Self::Unsupported { field, .. } => *field = format!("{prefix}{field}"),
            Self::Duplicate { field, first, .. } => {
                *field = format!("{prefix}{field}");
                *first = format!("{prefix}{first}");
            }
        }
    }
}

/// Every problem found in one pod (never empty when returned as an error).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl ValidationErrors {
    /// Prefixes every field path (`items[2].`), for pods nested in a list.
    #[must_use]
    pub fn with_prefix(mut self, prefix: &str) -> Self {
        for e in &mut self.0 {
            e.prefix(prefix);
        }
        self
    }
}

impl fmt::Display for ValidationErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationErrors {}

/// Validates a (defaulted) pod. Returns every problem found.
pub fn validate_pod(pod: &Pod) -> Result<(), ValidationErrors> {
    let mut errs = Vec::new();
    let meta = &pod.metadata;

    check_name(&mut errs, "metadata.name", &meta.name, NameKind::Subdomain);
    check_name(
        &mut errs,
        "metadata.namespace",
        &meta.namespace,
        NameKind::Label,
    );
    if meta.uid.is_empty() {
        errs.push(required("metadata.uid"));
    } else if !is_valid_uid(&meta.uid) {
        errs.push(invalid(
            "metadata.uid",
            &meta.uid,
            &format!(
                "must be 1 to {UID_MAX_LEN} characters of [a-z0-9-] (it names the pod's cgroup)"
            ),
        ));
    }

    let spec = &pod.spec;
    if spec.containers.is_empty() {
        errs.push(required("spec.containers"));
    }
    if spec.termination_grace_period_seconds < 0 {
        errs.push(invalid(
            "spec.terminationGracePeriodSeconds",
            &spec.termination_grace_period_seconds.to_string(),
            "must be greater than or equal to 0",
        ));
    }
    if spec.resources.as_ref().is_some_and(|r| !r.is_empty()) {
        errs.push(ValidationError::Unsupported {
            field: "spec.resources".into(),
            reason: "pod-level resources are not supported by qosd".into(),
        });
    }

    let mut names: BTreeMap<&str, String> = BTreeMap::new();
    let groups = [
        ("spec.initContainers", &spec.init_containers, true),
        ("spec.containers", &spec.containers, false),
    ];
    for (list, containers, init) in groups {
        for (i, container) in containers.iter().enumerate() {
            let at = format!("{list}[{i}]");
            check_container(&mut errs, &at, container, init);
            if container.name.is_empty() {
                continue;
            }
            let field = format!("{at}.name");
            if let Some(first) = names.get(container.name.as_str()) {
                errs.push(ValidationError::Duplicate {
                    field,
                    value: container.name.clone(),
                    first: first.clone(),
                });
            } else {
                names.insert(&container.name, field);
            }
        }
    }

    if errs.is_empty() {
        Ok(())
    } else {
        Err(ValidationErrors(errs))
    }
}

fn check_container(errs: &mut Vec<ValidationError>, at: &str, c: &Container, init: bool) {
    check_name(errs, &format!("{at}.name"), &c.name, NameKind::Label);
    if c.restart_policy.is_some() && !init {
        errs.push(ValidationError::Unsupported {
            field: format!("{at}.restartPolicy"),
            reason: "only init containers may set a restart policy".into(),
        });
    }
    for (i, arg) in c.command.iter().enumerate() {
        check_no_nul(errs, &format!("{at}.command[{i}]"), arg);
    }
    for (i, arg) in c.args.iter().enumerate() {
        check_no_nul(errs, &format!("{at}.args[{i}]"), arg);
    }
    for (i, env) in c.env.iter().enumerate() {
        let field = format!("{at}.env[{i}].name");
        if env.name.is_empty() {
            errs.push(required(&field));
        } else if !is_env_var_name(&env.name) {
            errs.push(invalid(
                &field,
                &env.name,
                "must consist of letters, digits, '_', '-' or '.', and must not start with a digit",
            ));
        }
        if let Some(value) = &env.value {
            check_no_nul(errs, &format!("{at}.env[{i}].value"), value);
        }
    }
    let requests = &c.resources.requests;
    let limits = &c.resources.limits;
    check_resource_list(errs, &format!("{at}.resources.requests"), requests);
    check_resource_list(errs, &format!("{at}.resources.limits"), limits);
    for (name, request) in requests {
        if let Some(limit) = limits.get(name)
            && request > limit
        {
            errs.push(invalid(
                &format!("{at}.resources.requests.{name}"),
                &request.to_string(),
                &format!("must be less than or equal to {name} limit of {limit}"),
            ));
        }
    }
}

fn check_resource_list(errs: &mut Vec<ValidationError>, at: &str, list: &ResourceList) {
    for (name, quantity) in list {
        if !is_container_resource_name(name) {
            errs.push(invalid(
                &format!("{at}.{name}"),
                name,
                "must be cpu, memory, ephemeral-storage, hugepages-<size> or a domain-qualified name (example.com/device)",
            ));
        }
        if quantity.is_negative() {
            errs.push(invalid(
                &format!("{at}.{name}"),
                &quantity.to_string(),
                "must be greater than or equal to 0",
            ));
        }
    }
}

#[derive(Clone, Copy)]
enum NameKind {
    Label,
    Subdomain,
}

fn check_name(errs: &mut Vec<ValidationError>, field: &str, value: &str, kind: NameKind) {
    if value.is_empty() {
        errs.push(required(field));
        return;
    }
    // Names become cgroup path components and log/metric labels: say plainly why a
    // path-like value is refused before the general syntax rule.
    if value.contains('/') || value.contains("..") || value.contains('\0') {
        errs.push(invalid(
            field,
            value,
            "must not contain '/', '..' or NUL (it would escape its cgroup directory)",
        ));
        return;
    }
    match kind {
        NameKind::Label if !is_dns1123_label(value) => errs.push(invalid(
            field,
            value,
            &format!(
                "must be a DNS-1123 label: at most {DNS1123_LABEL_MAX_LEN} lower-case letters, digits or '-', starting and ending with a letter or digit"
            ),
        )),
        NameKind::Subdomain if !is_dns1123_subdomain(value) => errs.push(invalid(
            field,
            value,
            &format!(
                "must be a DNS-1123 subdomain: at most {DNS1123_SUBDOMAIN_MAX_LEN} characters, '.'-separated DNS-1123 labels"
            ),
        )),
        _ => {}
    }
}

fn check_no_nul(errs: &mut Vec<ValidationError>, field: &str, value: &str) {
    if value.contains('\0') {
        errs.push(invalid(field, value, "must not contain NUL"));
    }
}

fn required(field: &str) -> ValidationError {
    ValidationError::Required {
        field: field.to_owned(),
    }
}

fn invalid(field: &str, value: &str, reason: &str) -> ValidationError {
    ValidationError::Invalid {
        field: field.to_owned(),
        value: value.to_owned(),
        reason: reason.to_owned(),
    }
}

/// DNS-1123 label: 1-63 of `[a-z0-9-]`, starting and ending with `[a-z0-9]`.
#[must_use]
pub fn is_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= DNS1123_LABEL_MAX_LEN
        && b.first().is_some_and(alnum)
        && b.last().is_some_and(alnum)
        && b.iter().all(|c| alnum(c) || *c == b'-')
}

/// DNS-1123 subdomain: at most 253 characters, one or more DNS-1123 labels joined by `.`
/// (apimachinery checks the label syntax on each part, not the 63-character label length).
#[must_use]
pub fn is_dns1123_subdomain(s: &str) -> bool {
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !s.is_empty()
        && s.len() <= DNS1123_SUBDOMAIN_MAX_LEN
        && s.split('.').all(|part| {
            let b = part.as_bytes();
            b.first().is_some_and(alnum)
                && b.last().is_some_and(alnum)
                && b.iter().all(|c| alnum(c) || *c == b'-')
        })
}

/// A uid qosd accepts: 1 to [`UID_MAX_LEN`] characters of `[a-z0-9-]`.
#[must_use]
pub fn is_valid_uid(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= UID_MAX_LEN
        && s.bytes()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
}

/// An environment variable name (apimachinery `IsEnvVarName`): `[-._a-zA-Z][-._a-zA-Z0-9]*`.
fn is_env_var_name(s: &str) -> bool {
    let ok = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'.' | b'_');
    s.bytes().next().is_some_and(|c| !c.is_ascii_digit()) && s.bytes().all(ok)
}

/// A resource name a container may request: the standard ones, or `domain/name`.
fn is_container_resource_name(name: &str) -> bool {
    if matches!(name, "cpu" | "memory" | "ephemeral-storage") || name.starts_with("hugepages-") {
        return true;
    }
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    is_dns1123_subdomain(domain)
        && !rest.is_empty()
        && rest.len() <= DNS1123_LABEL_MAX_LEN
        && rest
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && rest
            .as_bytes()
            .first()
            .is_some_and(u8::is_ascii_alphanumeric)
        && rest
            .as_bytes()
            .last()
            .is_some_and(u8::is_ascii_alphanumeric)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pods::model::{ContainerRestartPolicy, EnvVar, ResourceRequirements};
    use crate::pods::quantity::Quantity;

    fn pod(yaml: &str) -> Pod {
        let mut p: Pod = serde_yaml_ng::from_str(yaml).unwrap();
        p.apply_defaults();
        p
    }

    fn good() -> Pod {
        pod("
metadata: {name: web.frontend-1, namespace: prod}
spec:
  initContainers: [{name: init}]
  containers:
  - name: app
    command: [/bin/sh, -c, 'sleep 1']
    env: [{name: MY_VAR.x-1, value: v}]
    resources:
      requests: {cpu: 250m, memory: 64Mi, example.com/dev: 1, hugepages-2Mi: 2Mi}
      limits: {cpu: 500m, memory: 64Mi, ephemeral-storage: 1Gi}
")
    }

    fn errors(p: &Pod) -> Vec<ValidationError> {
        validate_pod(p).expect_err("invalid").0
    }

    fn only_error(p: &Pod) -> ValidationError {
        let e = errors(p);
        assert_eq!(e.len(), 1, "{e:?}");
        e.into_iter().next().unwrap()
    }

    #[test]
    fn accepts_a_valid_pod() {
        validate_pod(&good()).unwrap();
    }

    #[test]
    fn dns1123_rules() {
        for ok in ["a", "a-b", "0", "abc-123", &"a".repeat(63)] {
            assert!(is_dns1123_label(ok), "{ok}");
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in ["", "-a", "a-", "A", "a_b", "a.b", "a b", &"a".repeat(64)] {
            assert!(!is_dns1123_label(bad), "{bad}");
        }
        for ok in ["a.b", "a-1.b-2.c", &"a".repeat(253)] {
            assert!(is_dns1123_subdomain(ok), "{ok}");
        }
        for bad in [
            "",
            ".a",
            "a.",
            "a..b",
            "a/b",
            "A.b",
            "a.-b",
            &"a".repeat(254),
        ] {
            assert!(!is_dns1123_subdomain(bad), "{bad}");
        }
    }

    #[test]
    fn uid_rules() {
        assert!(is_valid_uid("0f8fad5b-d9cb-469f-a165-70867728950e"));
        assert!(is_valid_uid(&crate::pods::model::derive_uid("ns", "n")));
        for bad in ["", "A", "a/b", "..", "a_b", "a\0", &"a".repeat(65)] {
            assert!(!is_valid_uid(bad), "{bad:?}");
        }
    }

    #[test]
    fn path_escapes_are_rejected_naming_field_and_value() {
        for (value, field) in [
            ("a/b", "metadata.name"),
            ("..", "metadata.name"),
            ("a\0b", "metadata.name"),
        ] {
            let mut p = good();
            p.metadata.name = value.into();
            let e = only_error(&p);
            assert_eq!(e.field(), field);
            let msg = e.to_string();
            assert!(
                msg.contains(&format!("{value:?}")) && msg.contains("escape"),
                "{msg}"
            );
        }
        let mut p = good();
        p.metadata.namespace = "../etc".into();
        assert_eq!(only_error(&p).field(), "metadata.namespace");
        let mut p = good();
        p.spec.containers[0].name = "x/../../y".into();
        let msg = only_error(&p).to_string();
        assert!(
            msg.starts_with("spec.containers[0].name: \"x/../../y\""),
            "{msg}"
        );
        let mut p = good();
        p.metadata.uid = "../../kubepods".into();
        let msg = only_error(&p).to_string();
        assert!(msg.starts_with("metadata.uid: \"../../kubepods\""), "{msg}");
    }

    #[test]
    fn names_must_be_dns1123() {
        let mut p = good();
        p.metadata.name = "Web".into();
        p.metadata.namespace = "a.b".into();
        p.spec.containers[0].name = "app_1".into();
        let fields: Vec<_> = errors(&p).iter().map(|e| e.field().to_owned()).collect();
        assert_eq!(
            fields,
            [
                "metadata.name",
                "metadata.namespace",
                "spec.containers[0].name"
            ]
        );
    }

    #[test]
    fn requires_name_uid_and_a_container() {
        let mut p = good();
        p.metadata.name.clear();
        p.metadata.uid.clear();
        p.spec.containers.clear();
        let msgs: Vec<_> = errors(&p).iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "metadata.name: required value",
                "metadata.uid: required value",
                "spec.containers: required value"
            ]
        );
    }

    #[test]
    fn container_names_are_unique_across_init_and_app_containers() {
        let mut p = good();
        let mut dup = p.spec.containers[0].clone();
        p.spec.containers.push(dup.clone());
        let e = only_error(&p);
        assert_eq!(
            e.to_string(),
            "spec.containers[1].name: \"app\": duplicate name (also spec.containers[0].name)"
        );
        let mut p = good();
        dup.name = "init".into();
        p.spec.containers.push(dup);
        assert_eq!(
            only_error(&p).to_string(),
            "spec.containers[1].name: \"init\": duplicate name (also spec.initContainers[0].name)"
        );
    }

    #[test]
    fn quantities_must_be_non_negative_and_requests_within_limits() {
        let mut p = good();
        let r = &mut p.spec.containers[0].resources;
        r.requests
            .insert("memory".into(), Quantity::parse("-1").unwrap());
        r.requests
            .insert("cpu".into(), Quantity::parse("1").unwrap());
        let msgs: Vec<_> = errors(&p).iter().map(ToString::to_string).collect();
        assert_eq!(
            msgs,
            [
                "spec.containers[0].resources.requests.memory: \"-1\": must be greater than or equal to 0",
                "spec.containers[0].resources.requests.cpu: \"1\": must be less than or equal to cpu limit of 500m",
            ]
        );
    }

    #[test]
    fn misspelled_resource_names_are_rejected() {
        let mut p = good();
        p.spec.containers[0].resources = ResourceRequirements {
            requests: [("cpus".to_owned(), Quantity::from_units(1))].into(),
            limits: [("example.com/".to_owned(), Quantity::from_units(1))].into(),
        };
        let fields: Vec<_> = errors(&p).iter().map(|e| e.field().to_owned()).collect();
        assert_eq!(
            fields,
            [
                "spec.containers[0].resources.requests.cpus",
                "spec.containers[0].resources.limits.example.com/"
            ]
        );
    }

    #[test]
    fn process_arguments_and_env_are_checked() {
        let mut p = good();
        let c = &mut p.spec.containers[0];
        c.args = vec!["ok".into(), "bad\0".into()];
        c.env.push(EnvVar {
            name: "1BAD".into(),
            value: None,
        });
        let fields: Vec<_> = errors(&p).iter().map(|e| e.field().to_owned()).collect();
        assert_eq!(
            fields,
            [
                "spec.containers[0].args[1]",
                "spec.containers[0].env[1].name"
            ]
        );
    }

    #[test]
    fn only_init_containers_may_be_sidecars() {
        let mut p = good();
        p.spec.init_containers[0].restart_policy = Some(ContainerRestartPolicy::Always);
        validate_pod(&p).unwrap();
        p.spec.containers[0].restart_policy = Some(ContainerRestartPolicy::Always);
        assert_eq!(only_error(&p).field(), "spec.containers[0].restartPolicy");
    }

    #[test]
    fn pod_level_resources_and_negative_grace_are_rejected() {
        let mut p = good();
        p.spec.termination_grace_period_seconds = -1;
        p.spec.resources = Some(ResourceRequirements {
            requests: [("cpu".to_owned(), Quantity::from_units(1))].into(),
            limits: ResourceList::new(),
        });
        let fields: Vec<_> = errors(&p).iter().map(|e| e.field().to_owned()).collect();
        assert_eq!(
            fields,
            ["spec.terminationGracePeriodSeconds", "spec.resources"]
        );
        p.spec.termination_grace_period_seconds = 0;
        p.spec.resources = Some(ResourceRequirements::default());
        validate_pod(&p).unwrap();
    }

    #[test]
    fn prefix_applies_to_every_field() {
        let mut p = good();
        p.metadata.name = "A".into();
        let errs = validate_pod(&p).unwrap_err().with_prefix("items[3].");
        assert!(
            errs.to_string()
                .starts_with("items[3].metadata.name: \"A\""),
            "{errs}"
        );
    }
}
