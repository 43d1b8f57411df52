//! HTTP clients (kube-rs) for the API server and for kubelet's `/pods`: TLS, bearer tokens
//! re-read from their file (service-account tokens rotate), CA bundles, timeouts.
use std::path::{Path, PathBuf};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// The in-cluster service account's token, sent to kubelet by default.
pub const SERVICE_ACCOUNT_TOKEN: &str = "/var/run/secrets/kubernetes.io/serviceaccount/token";
/// The in-cluster service account's CA bundle.
pub const SERVICE_ACCOUNT_CA: &str = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt";

/// Errors building a client.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("kubeconfig {path}: {source}")]
    Kubeconfig {
        path: PathBuf,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error(
        "no Kubernetes client configuration: not in a cluster (no service account), no --kubeconfig and no usable $KUBECONFIG or ~/.kube/config: {0}"
    )]
    Infer(#[source] kube::config::InferConfigError),
    #[error("--kubelet-url {url:?}: {reason}")]
    KubeletUrl { url: String, reason: String },
    #[error("{what} {path}: {source}")]
    File {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("building the HTTP client for {target}: {source}")]
    Build {
        target: String,
        #[source]
        source: kube::Error,
    },
}

/// How qosd reaches the API server.
#[derive(Clone, Debug, Default)]
pub struct ApiServerOptions {
    /// A kubeconfig file; `None`: the in-cluster service account, else `$KUBECONFIG` or
    /// `~/.kube/config`.
    pub kubeconfig: Option<PathBuf>,
}

/// A client of the API server.
pub async fn api_server(options: &ApiServerOptions) -> Result<(Client, String), ClientError> {
    let mut config = match &options.kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path).map_err(|source| ClientError::Kubeconfig {
                path: path.clone(),
                source,
            })?;
            Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
                .await
                .map_err(|source| ClientError::Kubeconfig {
                    path: path.clone(),
                    source,
                })?
        }
        None => Config::infer().await.map_err(ClientError::Infer)?,
    };
    // A watch is a long request: no read timeout (kube's watcher sets the server-side one);
    // connecting must not hang. No hidden retries of 503/429 inside the client (up to 15, for
    // minutes): the watcher's own back-off retries, and each failure is reported as it comes.
    config.connect_timeout = Some(Duration::from_secs(10));
    config.default_retry = false;
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).map_err(|source| ClientError::Build {
        target: url.clone(),
        source,
    })?;
    Ok((client, url))
}

/// How qosd reaches kubelet.
#[derive(Clone, Debug)]
pub struct KubeletOptions {
    /// `https://<node>:10250` (authenticated port) or `http://<node>:10255` (read-only port).
    pub url: String,
    /// Bearer token file (https only); re-read as it rotates.
    pub token_file: Option<PathBuf>,
    /// CA bundle that signed kubelet's serving certificate (https only).
    pub ca_file: Option<PathBuf>,
    /// Accept any serving certificate (self-signed kubelet certificates); the token is still
    /// sent, so use only where the network to kubelet is trusted.
    pub insecure_skip_tls_verify: bool,
    /// How often `/pods` is fetched.
    pub period: Duration,
}

/// A client of kubelet's API. Call it within the async runtime (the client's buffer task is
/// spawned on it).
pub fn kubelet(options: &KubeletOptions) -> Result<Client, ClientError> {
    let url: http::Uri =
        options
            .url
            .parse()
            .map_err(|e: http::uri::InvalidUri| ClientError::KubeletUrl {
                url: options.url.clone(),
                reason: e.to_string(),
            })?;
    let https = match url.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(ClientError::KubeletUrl {
                url: options.url.clone(),
                reason: "want https://HOST:10250 or http://HOST:10255".into(),
            });
        }
    };
    let mut config = Config::new(url);
    config.connect_timeout = Some(Duration::from_secs(5));
    config.read_timeout = Some(Duration::from_secs(30));
    // The next poll is the retry; each failure is reported as it comes.
    config.default_retry = false;
    if https {
        if let Some(token) = &options.token_file {
            must_exist("token file", token)?;
            config.auth_info.token_file = Some(token.display().to_string());
        }
        if let Some(ca) = &options.ca_file {
            must_exist("CA bundle", ca)?;
            config.root_cert_file = Some(ca.clone());
        }
        config.accept_invalid_certs = options.insecure_skip_tls_verify;
    }
    Client::try_from(config).map_err(|source| ClientError::Build {
        target: options.url.clone(),
        source,
    })
}

fn must_exist(what: &'static str, path: &Path) -> Result<(), ClientError> {
    std::fs::metadata(path)
        .map(|_| ())
        .map_err(|source| ClientError::File {
            what,
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn options(url: &str) -> KubeletOptions {
        KubeletOptions {
            url: url.into(),
            token_file: None,
            ca_file: None,
            insecure_skip_tls_verify: false,
            period: Duration::from_secs(5),
        }
    }

    #[tokio::test]
    async fn kubelet_urls_and_files_are_checked_with_their_names() {
        // Within the runtime, as the agent calls it.
        assert!(kubelet(&options("http://127.0.0.1:10255")).is_ok());
        let err = kubelet(&options("ftp://node:10250")).err().expect("scheme");
        assert!(
            err.to_string()
                .contains("--kubelet-url \"ftp://node:10250\""),
            "{err}"
        );
        let mut with_token = options("https://127.0.0.1:10250");
        with_token.token_file = Some("/nonexistent/qosd/token".into());
        let err = kubelet(&with_token).err().expect("token");
        assert!(
            err.to_string()
                .contains("token file /nonexistent/qosd/token"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_the_file() {
        let err = api_server(&ApiServerOptions {
            kubeconfig: Some("/nonexistent/qosd/kubeconfig".into()),
        })
        .await
        .err()
        .expect("missing");
        assert!(
            err.to_string().contains("/nonexistent/qosd/kubeconfig"),
            "{err}"
        );
    }
}
