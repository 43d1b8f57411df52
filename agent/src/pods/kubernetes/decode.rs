//! API objects to pods: a `v1` Pod as the API server or kubelet's `/pods` sends it (JSON),
//! decoded into qosd's model with the field path of whatever is wrong, one pod at a time, so a
//! malformed object loses only itself.
use serde_json::Value;

use crate::pods::model::Pod;

/// A pod object that could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("pod {object}: {}{reason}", path.as_deref().map(|p| format!("{p}: ")).unwrap_or_default())]
pub struct DecodeError {
    /// `namespace/name` when the object has them, else its position (`items[3]`).
    pub object: String,
    /// The failing field (`spec.containers[0].resources.limits.cpu`).
    pub path: Option<String>,
    pub reason: String,
}

/// Decodes one Pod object. Requests are defaulted from limits as the API server does (a no-op
/// on what it sends); the uid, name and namespace are required (API pods always have them).
pub fn decode_pod(value: Value, position: &str) -> Result<Pod, DecodeError> {
    let object = object_name(&value).unwrap_or_else(|| position.to_owned());
    if let Some(kind) = value.get("kind").and_then(Value::as_str)
        && kind != "Pod"
    {
        return Err(DecodeError {
            object,
            path: Some("kind".into()),
            reason: format!("{kind:?} is not a Pod"),
        });
    }
    let mut pod: Pod = serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        DecodeError {
            object: object.clone(),
            path: (path != ".").then_some(path),
            reason: e.into_inner().to_string(),
        }
    })?;
    for (field, value) in [
        ("metadata.uid", &pod.metadata.uid),
        ("metadata.name", &pod.metadata.name),
        ("metadata.namespace", &pod.metadata.namespace),
    ] {
        if value.is_empty() {
            return Err(DecodeError {
                object,
                path: Some(field.into()),
                reason: "required value".into(),
            });
        }
    }
    pod.apply_defaults();
    Ok(pod)
}

/// The pods of a `PodList` (kubelet's `/pods`), each decoded on its own.
pub fn decode_pod_list(list: Value) -> Result<Vec<Result<Pod, DecodeError>>, DecodeError> {
    let object = "PodList".to_owned();
    let Value::Object(mut map) = list else {
        return Err(DecodeError {
            object,
            path: None,
            reason: "expected a PodList object".into(),
        });
    };
    match map.get("kind").and_then(Value::as_str) {
        Some("PodList" | "List") | None => {}
        Some(other) => {
            return Err(DecodeError {
                object,
                path: Some("kind".into()),
                reason: format!("{other:?} is not a PodList"),
            });
        }
    }
    let items = match map.remove("items") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items,
        Some(_) => {
            return Err(DecodeError {
                object,
                path: Some("items".into()),
                reason: "expected a list of Pods".into(),
            });
        }
    };
    Ok(items
        .into_iter()
        .enumerate()
        .map(|(i, item)| decode_pod(item, &format!("items[{i}]")))
        .collect())
}

/// `namespace/name` of an object, when both are strings.
fn object_name(value: &Value) -> Option<String> {
    let meta = value.get("metadata")?;
    let name = meta.get("name")?.as_str()?;
    let namespace = meta
        .get("namespace")
        .and_then(Value::as_str)
        .unwrap_or("default");
    Some(format!("{namespace}/{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A pod as the API server returns it (trimmed from `kubectl get pod -o json` of a
    /// Burstable pod on containerd: fields qosd does not read are kept to show they are
    /// ignored).
    fn api_pod() -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "web-7d4b9c8f6-x2x8q",
                "namespace": "shop",
                "uid": "4d2c1f3e-6a7b-4c8d-9e0f-1a2b3c4d5e6f",
                "resourceVersion": "123456",
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"app": "web"},
                "ownerReferences": [{"kind": "ReplicaSet", "name": "web-7d4b9c8f6"}]
            },
            "spec": {
                "nodeName": "node-a",
                "containers": [{
                    "name": "app",
                    "image": "registry.example/web:1.2",
                    "resources": {"requests": {"cpu": "250m", "memory": "64Mi"},
                                  "limits": {"cpu": "500m", "memory": "128Mi"}}
                }],
                "restartPolicy": "Always",
                "terminationGracePeriodSeconds": 30,
                "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists"}]
            },
            "status": {
                "phase": "Running",
                "qosClass": "Burstable",
                "podIP": "10.0.0.7",
                "containerStatuses": [{
                    "name": "app",
                    "containerID": "containerd://0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
                    "ready": true,
                    "restartCount": 2,
                    "state": {"running": {"startedAt": "2026-12-01T10:00:05Z"}}
                }]
            }
        })
    }

    #[test]
    fn an_api_pod_keeps_spec_status_and_node() {
        let pod = decode_pod(api_pod(), "items[0]").expect("decodes");
        assert_eq!(pod.full_name(), "shop/web-7d4b9c8f6-x2x8q");
        assert_eq!(pod.metadata.uid, "4d2c1f3e-6a7b-4c8d-9e0f-1a2b3c4d5e6f");
        assert_eq!(pod.spec.node_name, "node-a");
        assert_eq!(pod.status.phase, "Running");
        assert_eq!(pod.status.qos_class, "Burstable");
        let status = &pod.status.container_statuses[0];
        assert_eq!(status.restart_count, 2);
        assert_eq!(
            status.runtime_id(),
            Some((
                "containerd",
                "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
            ))
        );
        assert_eq!(pod.spec.containers[0].cpu_limit_millis(), Some(500));
    }

    #[test]
    fn a_bad_field_is_named_with_the_pod() {
        let mut bad = api_pod();
        bad["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("half");
        let err = decode_pod(bad, "items[0]").expect_err("bad quantity");
        assert_eq!(err.object, "shop/web-7d4b9c8f6-x2x8q");
        assert_eq!(
            err.path.as_deref(),
            Some("spec.containers[0].resources.limits.cpu")
        );
        assert!(
            err.to_string()
                .starts_with("pod shop/web-7d4b9c8f6-x2x8q: spec.containers[0]")
        );

        let mut no_uid = api_pod();
        no_uid["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("uid");
        let err = decode_pod(no_uid, "items[0]").expect_err("no uid");
        assert_eq!(err.path.as_deref(), Some("metadata.uid"));

        let err = decode_pod(json!({"kind": "Node"}), "items[4]").expect_err("not a pod");
        assert_eq!(
            (err.object.as_str(), err.path.as_deref()),
            ("items[4]", Some("kind"))
        );
    }

    #[test]
    fn a_pod_list_loses_only_its_bad_items() {
        let mut bad = api_pod();
        bad["metadata"]["name"] = json!(7);
        let list = json!({"kind": "PodList", "apiVersion": "v1", "metadata": {},
                          "items": [api_pod(), bad]});
        let pods = decode_pod_list(list).expect("a list");
        assert_eq!(pods.len(), 2);
        assert!(pods[0].is_ok());
        let err = pods[1].as_ref().expect_err("bad name");
        assert_eq!(err.object, "items[1]");
        assert_eq!(err.path.as_deref(), Some("metadata.name"));
        assert!(
            decode_pod_list(json!({"kind": "PodList", "items": null}))
                .expect("empty")
                .is_empty()
        );
        assert!(decode_pod_list(json!([1])).is_err());
    }

    #[test]
    fn unset_container_ids_and_nulls_read_as_empty() {
        let mut pending = api_pod();
        pending["status"] = json!({"phase": "Pending", "containerStatuses": [
            {"name": "app", "containerID": null, "restartCount": 0}], "initContainerStatuses": null});
        let pod = decode_pod(pending, "x").expect("decodes");
        assert_eq!(pod.status.container_statuses[0].runtime_id(), None);
        assert!(!pod.status.is_terminal());
    }
}
