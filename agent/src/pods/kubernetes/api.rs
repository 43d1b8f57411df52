//! The API server's pods of this node as a pod source: kube-rs `watcher` (list, then watch from
//! its resourceVersion with bookmarks; a relist after a 410 Gone; back-off between failures)
//! on `pods` with `fieldSelector=spec.nodeName=<node>`.
//!
//! Pods are watched as `DynamicObject`s and decoded one by one ([`super::decode`]), so one
//! object qosd cannot read is reported and loses only itself; a typed list would fail whole.
use std::sync::mpsc::Sender;

use futures::StreamExt as _;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::task::JoinHandle;

use super::decode::decode_pod;
use super::{ChannelSource, KubernetesSourceError, PodTable, SourceMessage, raw_uid};
use crate::pods::source::Origin;

/// The running watch; dropping it stops the task.
#[derive(Debug)]
pub struct ApiServerWatch {
    task: JoinHandle<()>,
}

impl Drop for ApiServerWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `v1` pods, without a typed binding.
fn pods() -> ApiResource {
    ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: "Pod".into(),
        plural: "pods".into(),
    }
}

/// Starts watching the pods bound to `node` on `runtime`; `server` names the API server in
/// messages.
#[must_use]
pub fn start(
    client: Client,
    node: &str,
    server: &str,
    runtime: &tokio::runtime::Handle,
) -> (ChannelSource, ApiServerWatch) {
    let (sender, receiver) = std::sync::mpsc::channel();
    let describe = format!("API server {server}, pods of node {node}");
    let task = runtime.spawn(watch(client, node.to_owned(), describe.clone(), sender));
    (
        ChannelSource::new(describe, receiver),
        ApiServerWatch { task },
    )
}

/// While the API server does not answer, how often it is asked for its version (a request
/// every authenticated client may make): the watch's own retries back off up to 30 s and say
/// nothing when they succeed without news.
const PROBE_WHILE_DOWN: std::time::Duration = std::time::Duration::from_secs(2);

async fn watch(client: Client, node: String, describe: String, sender: Sender<SourceMessage>) {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &pods());
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let origin = Origin::ApiServer { node };
    let mut stream = std::pin::pin!(watcher::watcher(api, config).default_backoff());
    let mut table = PodTable::default();
    // Objects of the list under way (between Init and InitDone), and uids that failed to decode.
    let mut listing: Option<(Vec<crate::pods::model::Pod>, Vec<String>)> = None;
    let send = |message| sender.send(message).is_ok();
    let decode_error = |error| {
        SourceMessage::Error(KubernetesSourceError::Decode {
            source_name: describe.clone(),
            error,
        })
    };
    let mut down = false;
    let mut probe = tokio::time::interval(PROBE_WHILE_DOWN);
    loop {
        let item = tokio::select! {
            item = stream.next() => item,
            _ = probe.tick(), if down => {
                if client.apiserver_version().await.is_ok() {
                    down = false;
                    if !send(SourceMessage::Reachable(true)) {
                        return;
                    }
                }
                continue;
            }
        };
        let Some(item) = item else {
            return;
        };
        down = item.is_err();
        let delivered = match item {
            Ok(Event::Init) => {
                listing = Some((Vec::new(), Vec::new()));
                true
            }
            Ok(Event::InitApply(object)) => {
                let (pods, failed) = listing.get_or_insert_with(Default::default);
                match to_pod(&object) {
                    Ok(pod) => {
                        pods.push(pod);
                        true
                    }
                    Err((uid, error)) => {
                        failed.extend(uid);
                        send(decode_error(error))
                    }
                }
            }
            Ok(Event::InitDone) => {
                let (pods, failed) = listing.take().unwrap_or_default();
                let events = table.replace_all(pods, &failed, &origin);
                tracing::info!(source = %describe, pods = table.len(), "pod list received");
                events
                    .into_iter()
                    .all(|e| send(SourceMessage::Event(Box::new(e))))
                    && send(SourceMessage::Synced)
                    && send(SourceMessage::Reachable(true))
            }
            Ok(Event::Apply(object)) => match to_pod(&object) {
                Ok(pod) => table
                    .apply(pod, &origin)
                    .is_none_or(|e| send(SourceMessage::Event(Box::new(e)))),
                // A known pod keeps its last good version.
                Err((_, error)) => send(decode_error(error)),
            },
            Ok(Event::Delete(object)) => {
                let uid = object.metadata.uid.clone().unwrap_or_default();
                table
                    .delete(&uid)
                    .is_none_or(|e| send(SourceMessage::Event(Box::new(e))))
            }
            Err(e) => {
                send(SourceMessage::Error(KubernetesSourceError::Unavailable {
                    source_name: describe.clone(),
                    message: e.to_string(),
                })) && send(SourceMessage::Reachable(false))
            }
        };
        if !delivered {
            // The manager's side is gone: the agent is stopping.
            return;
        }
    }
}

/// The pod of a watched object, or its uid (when readable) and the error.
fn to_pod(
    object: &DynamicObject,
) -> Result<crate::pods::model::Pod, (Option<String>, super::DecodeError)> {
    let position = object
        .metadata
        .name
        .clone()
        .unwrap_or_else(|| "object".to_owned());
    let value = serde_json::to_value(object).map_err(|e| {
        (
            object.metadata.uid.clone(),
            super::DecodeError {
                object: position.clone(),
                path: None,
                reason: e.to_string(),
            },
        )
    })?;
    let uid = raw_uid(&value);
    decode_pod(value, &position).map_err(|e| (uid, e))
}
