//! Which labels are a client's and which are the server's: the keys no client may set
//! at create or filter a list on, and a sandbox's metadata as a client sees it.
//!
//! A tenant's scope is the server's labels ([`TENANT_LABEL`](super::tenants::TENANT_LABEL),
//! the app, ...). A list is "the client's filter AND the tenant's scope": the client's
//! pairs are checked here first (a reserved key is `InvalidInput`, so `400` on every
//! face), and the scope's labels are added after them, so neither can replace the other
//! (ADVERSARIAL case 39).

use std::collections::BTreeMap;

use sandcell::{Error, LabelSelector, Result, SandboxInfo};

use super::SERVER_LABEL_PREFIX;

/// Prefixes of label keys the server or a backend under it keeps for itself: the
/// server's own, and the Docker backend's record of how to run a container (a client's
/// `sandcell.docker.workspace`, say, would be read back as that record).
const RESERVED_PREFIXES: &[&str] = &[
    SERVER_LABEL_PREFIX,
    "sandcell.docker.",
    "sandcell.cache_key",
];

/// The label a session manager marks its sandboxes with; when the server runs MCP, a
/// client's sandbox carrying the MCP manager's id would be that manager's to adopt or
/// reap.
const MANAGER_LABEL: &str = sandcell::manager::LABEL_MANAGER;

/// What the server refuses in a client's labels and filters.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reserved {
    /// The id of the server's own session manager (MCP's), if it runs one.
    pub(crate) manager_id: Option<String>,
    /// The instance id of that manager's state store, which its reconcile also
    /// matches (`sandcell.store`).
    pub(crate) store_id: Option<String>,
}

impl Reserved {
    /// Refuses `labels` (a create's or a clone's labels, or a list's filter pairs)
    /// when one names a reserved key, or the server's own manager.
    pub(crate) fn check<'a>(
        &self,
        labels: impl IntoIterator<Item = (&'a String, &'a String)>,
        what: &str,
    ) -> Result<()> {
        for (key, value) in labels {
            if RESERVED_PREFIXES.iter().any(|p| key.starts_with(p)) {
                return Err(Error::invalid_input(format!(
                    "{what} {key:?} is reserved for the server (keys beginning \
                     {SERVER_LABEL_PREFIX:?} or \"sandcell.docker.\" are its own)"
                )));
            }
            let ours = (key == MANAGER_LABEL && self.manager_id.as_deref() == Some(value.as_str()))
                || (key == sandcell::manager::LABEL_STORE
                    && self.store_id.as_deref() == Some(value.as_str()));
            if ours {
                return Err(Error::invalid_input(format!(
                    "{what} {key:?} = {value:?} names this server's own session manager; \
                     give your manager another id"
                )));
            }
        }
        Ok(())
    }
}

/// A list's selector: the client's `filter` pairs (already [`Reserved::check`]ed),
/// then `scope`'s labels on top, so the scope always holds.
pub(crate) fn scoped(filter: &[(String, String)], scope: LabelSelector) -> LabelSelector {
    let mut selector = LabelSelector::new();
    for (key, value) in filter {
        selector = selector.label(key, value);
    }
    for (key, value) in scope.equals {
        selector = selector.label(key, value);
    }
    for key in scope.exists {
        selector = selector.label_present(key);
    }
    selector
}

/// A sandbox's metadata as a client sees it: its labels without the server's own, and
/// the spec the client recorded at create ([`SPEC_METADATA`](sandcell_remote::protocol::SPEC_METADATA))
/// with the network in force now (`set_network` may have changed it since) and without
/// its environment, which may hold secrets and is never echoed (ADVERSARIAL case 39).
/// A value under that key that is not a spec is left out.
pub(crate) fn client_metadata(info: &SandboxInfo) -> BTreeMap<String, String> {
    let mut metadata: BTreeMap<String, String> = info
        .labels
        .iter()
        .filter(|(k, _)| !RESERVED_PREFIXES.iter().any(|p| k.starts_with(p)))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let key = sandcell_remote::protocol::SPEC_METADATA;
    if let Some(json) = metadata.remove(key) {
        if let Ok(mut spec) = serde_json::from_str::<sandcell::SandboxSpec>(&json) {
            spec.env.clear();
            spec.network = info.network.clone();
            if let Ok(shown) = serde_json::to_string(&spec) {
                metadata.insert(key.to_owned(), shown);
            }
        }
    }
    metadata
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(k: &str, v: &str) -> (String, String) {
        (k.to_owned(), v.to_owned())
    }

    #[test]
    fn reserved_keys_and_the_servers_manager_are_refused() {
        let reserved = Reserved {
            manager_id: Some("mcp".to_owned()),
            store_id: None,
        };
        for (k, v) in [
            pair("sandcell.server.tenant", "alice"),
            pair("sandcell.docker.workspace", "/etc"),
            pair("sandcell.manager", "mcp"),
        ] {
            let err = reserved.check([(&k, &v)], "label").unwrap_err();
            assert_eq!(err.kind(), sandcell::ErrorKind::InvalidInput, "{k}");
        }
        for (k, v) in [
            pair("sandcell.manager", "mine"),
            pair("sandcell.tenant", "acme"),
            pair("sandcell.spec", "{}"),
            pair("team", "a"),
        ] {
            reserved.check([(&k, &v)], "label").unwrap();
        }
    }

    #[test]
    fn the_scope_is_applied_last() {
        let filter = [pair("sandcell.server.tenant", "alice"), pair("k", "v")];
        let scope = LabelSelector::new().label("sandcell.server.tenant", "bob");
        let selector = scoped(&filter, scope);
        assert_eq!(selector.equals["sandcell.server.tenant"], "bob");
        assert_eq!(selector.equals["k"], "v");
    }
}
