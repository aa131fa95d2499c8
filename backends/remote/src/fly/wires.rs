//! The wire connections to a sandcell-server's machines: one upgraded HTTP connection
//! per machine, opened on first use, shared by every call, and reopened once it ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{CONNECTION, UPGRADE};
use reqwest::{Method, StatusCode};
use sandcell::raw::wire::WireClient;
use sandcell::{Error, ErrorKind, Result, SandboxId};

use crate::http::{api_error, transport_error, Http};
use crate::protocol::WIRE_UPGRADE;

/// One machine's connection, once opened; the async lock makes concurrent first calls
/// open one connection, not one each.
type Slot = Arc<tokio::sync::Mutex<Option<WireClient>>>;

#[derive(Debug)]
pub(crate) struct Wires {
    http: Arc<Http>,
    app: String,
    /// How long opening a connection may take.
    connect_timeout: Duration,
    slots: Mutex<HashMap<SandboxId, Slot>>,
}

impl Wires {
    pub(crate) fn new(http: Arc<Http>, app: String, connect_timeout: Duration) -> Self {
        Wires {
            http,
            app,
            connect_timeout,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// The connection to machine `id`, opened if there is none or the last one ended.
    pub(crate) async fn get(&self, id: &SandboxId) -> Result<WireClient> {
        let slot = Arc::clone(crate::lock(&self.slots).entry(id.clone()).or_default());
        let mut open = slot.lock().await;
        if let Some(client) = open.as_ref().filter(|c| c.closed().is_none()) {
            return Ok(client.clone());
        }
        match self.connect(id).await {
            Ok(client) => {
                *open = Some(client.clone());
                Ok(client)
            }
            Err(e) => {
                // No slot kept for a machine that cannot be reached (or does not exist).
                *open = None;
                drop(open);
                self.forget(id);
                Err(e)
            }
        }
    }

    /// Drops machine `id`'s connection (it was destroyed): the connection closes once
    /// the processes started over it are dropped.
    pub(crate) fn forget(&self, id: &SandboxId) {
        crate::lock(&self.slots).remove(id);
    }

    async fn connect(&self, id: &SandboxId) -> Result<WireClient> {
        let route = format!("/v1/apps/{}/machines/{id}/sandcell/wire", self.app);
        let what = format!("GET {route}");
        let request = self
            .http
            .request(Method::GET, &route)
            .header(CONNECTION, "upgrade")
            .header(UPGRADE, WIRE_UPGRADE)
            .send();
        let response = tokio::time::timeout(self.connect_timeout, request)
            .await
            .map_err(|_| {
                Error::new(
                    ErrorKind::Timeout,
                    format!("{what}: no answer within {:?}", self.connect_timeout),
                )
                .set_temporary(true)
            })?
            .map_err(|e| transport_error(&what, &e))?;
        if response.status() != StatusCode::SWITCHING_PROTOCOLS {
            return Err(api_error(&what, response).await);
        }
        let upgraded = response
            .upgrade()
            .await
            .map_err(|e| transport_error(&what, &e))?;
        let (read, write) = tokio::io::split(upgraded);
        Ok(WireClient::new(read, write))
    }
}
