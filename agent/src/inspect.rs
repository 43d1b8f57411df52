//! `qosd inspect`: fetches the running agent's [`Report`] from its `/inspect` endpoint. The
//! request is a single HTTP/1.1 GET with `Connection: close` to a local agent, read to the end.
use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::report::Report;

/// Errors talking to the agent.
#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("connecting to the agent at {addr}: {source} (is `qosd run` running there?)")]
    Connect {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to the agent at {addr}: {source}")]
    Io {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("the agent at {addr} answered {status:?}")]
    Status { addr: SocketAddr, status: String },
    #[error("the agent at {addr} answered something that is not a report: {source}")]
    Report {
        addr: SocketAddr,
        #[source]
        source: serde_json::Error,
    },
}

/// The report of `GET /inspect` on the agent at `addr`.
pub fn fetch(addr: SocketAddr) -> Result<Report, InspectError> {
    let io = |source| InspectError::Io { addr, source };
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(3))
        .map_err(|source| InspectError::Connect { addr, source })?;
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(io)?;
    write!(
        stream,
        "GET /inspect HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut response = String::new();
    stream.read_to_string(&mut response).map_err(io)?;
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let status = head.lines().next().unwrap_or_default();
    if !status.starts_with("HTTP/1.1 200") {
        return Err(InspectError::Status {
            addr,
            status: status.to_owned(),
        });
    }
    serde_json::from_str(body).map_err(|source| InspectError::Report { addr, source })
}
