//! kubelet's `/pods` as a pod source, for nodes where the agent may not watch the API server:
//! the `PodList` kubelet serves is fetched every period (the authenticated port over https with
//! a bearer token, as koordlet does, or the read-only port over http) and diffed against the
//! pods known. A failed fetch keeps every known pod.
use std::sync::mpsc::Sender;
use std::time::Duration;

use kube::Client;
use tokio::task::JoinHandle;

use super::decode::decode_pod_list;
use super::{ChannelSource, KubernetesSourceError, PodTable, SourceMessage, raw_uid};
use crate::pods::source::Origin;

/// The running poller; dropping it stops the task.
#[derive(Debug)]
pub struct KubeletPoll {
    task: JoinHandle<()>,
}

impl Drop for KubeletPoll {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts fetching `url`/pods every `period` on `runtime`.
#[must_use]
pub fn start(
    client: Client,
    url: &str,
    period: Duration,
    runtime: &tokio::runtime::Handle,
) -> (ChannelSource, KubeletPoll) {
    let (sender, receiver) = std::sync::mpsc::channel();
    let url = url.trim_end_matches('/').to_owned();
    let describe = format!("kubelet {url}/pods");
    let task = runtime.spawn(poll(client, url, period, describe.clone(), sender));
    (ChannelSource::new(describe, receiver), KubeletPoll { task })
}

async fn poll(
    client: Client,
    url: String,
    period: Duration,
    describe: String,
    sender: Sender<SourceMessage>,
) {
    let origin = Origin::Kubelet { url };
    let mut table = PodTable::default();
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut first = true;
    loop {
        ticks.tick().await;
        let messages = match fetch(&client).await {
            Ok(list) => {
                let mut messages = Vec::new();
                let (mut pods, mut failed) = (Vec::new(), Vec::new());
                match decode_pod_list(list.clone()) {
                    Ok(items) => {
                        let raw = list
                            .get("items")
                            .and_then(serde_json::Value::as_array)
                            .cloned()
                            .unwrap_or_default();
                        for (i, item) in items.into_iter().enumerate() {
                            match item {
                                Ok(pod) => pods.push(pod),
                                Err(error) => {
                                    failed.extend(raw.get(i).and_then(raw_uid));
                                    messages.push(SourceMessage::Error(
                                        KubernetesSourceError::Decode {
                                            source_name: describe.clone(),
                                            error,
                                        },
                                    ));
                                }
                            }
                        }
                        messages.extend(
                            table
                                .replace_all(pods, &failed, &origin)
                                .into_iter()
                                .map(|e| SourceMessage::Event(Box::new(e))),
                        );
                        if first {
                            tracing::info!(source = %describe, pods = table.len(), "pod list received");
                            first = false;
                        }
                        messages.push(SourceMessage::Synced);
                        messages.push(SourceMessage::Reachable(true));
                    }
                    Err(error) => {
                        messages.push(SourceMessage::Error(KubernetesSourceError::Decode {
                            source_name: describe.clone(),
                            error,
                        }));
                        messages.push(SourceMessage::Reachable(false));
                    }
                }
                messages
            }
            Err(message) => vec![
                SourceMessage::Error(KubernetesSourceError::Unavailable {
                    source_name: describe.clone(),
                    message,
                }),
                SourceMessage::Reachable(false),
            ],
        };
        for message in messages {
            if sender.send(message).is_err() {
                return;
            }
        }
    }
}

/// GET /pods as JSON.
async fn fetch(client: &Client) -> Result<serde_json::Value, String> {
    let request = http::Request::get("/pods")
        .header(http::header::ACCEPT, "application/json")
        .body(Vec::new())
        .map_err(|e| e.to_string())?;
    let text = client
        .request_text(request)
        .await
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("the answer is not JSON: {e}"))
}
