//! `SandboxConfig`: the backend and manager settings chosen in a config file, and the
//! `BackendRegistry` that turns a backend `type` into a boxed backend.
//!
//! The core crate cannot depend on the backend crates (they depend on it), so each
//! backend crate offers a factory and the application registers the ones it links:
//!
//! ```
//! # #[cfg(feature = "testing")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use sandcell::{BackendRegistry, SandboxConfig};
//!
//! let dir = tempfile::tempdir()?;
//! let config: SandboxConfig = serde_json::from_value(serde_json::json!({
//!     "type": "mock",
//!     "data_dir": dir.path(),
//!     "manager": {"max_sandboxes_per_tenant": 3, "idle_timeout": 900},
//! }))?;
//! let registry = BackendRegistry::new()
//!     .register("mock", sandcell::testing::MockBackend::from_options);
//! let manager = config.build_manager(&registry).await?;
//! assert_eq!(manager.backend().name(), "mock");
//! assert_eq!(manager.settings().max_sandboxes_per_tenant, Some(3));
//! # Ok(()) }
//! # #[cfg(feature = "testing")]
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

pub mod duration;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::backend::SandboxBackend;
use crate::error::{Error, Result};
use crate::manager::{ManagerSettings, SandboxManager};

/// Which backend to use, with its options, plus the manager's settings; deserialize it
/// from YAML, TOML or JSON with the format crate of your choice.
///
/// Every key besides `type`, `data_dir` and `manager` is an option of the backend,
/// checked by the backend's factory (unknown options are an error there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[non_exhaustive]
pub struct SandboxConfig {
    /// The backend type: `local`, `docker`, `remote`, or any registered name.
    #[serde(rename = "type")]
    pub backend: String,
    /// Where the manager keeps state and snapshots (see
    /// [`ManagerBuilder::data_dir`](crate::ManagerBuilder::data_dir)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// The manager's settings.
    #[serde(default)]
    pub manager: ManagerSettings,
    /// The backend's own options.
    #[serde(flatten)]
    pub options: serde_json::Map<String, serde_json::Value>,
}

impl SandboxConfig {
    /// A config for backend `backend` with default options and settings.
    pub fn new(backend: impl Into<String>) -> Self {
        SandboxConfig {
            backend: backend.into(),
            data_dir: None,
            manager: ManagerSettings::default(),
            options: serde_json::Map::new(),
        }
    }

    /// Builds the backend through `registry`.
    pub fn build_backend(&self, registry: &BackendRegistry) -> Result<Box<dyn SandboxBackend>> {
        registry.build(
            &self.backend,
            serde_json::Value::Object(self.options.clone()),
        )
    }

    /// Builds the backend and a manager over it with these settings and `data_dir`.
    pub async fn build_manager(
        &self,
        registry: &BackendRegistry,
    ) -> Result<SandboxManager<Box<dyn SandboxBackend>>> {
        let mut builder =
            SandboxManager::builder(self.build_backend(registry)?).settings(self.manager.clone());
        if let Some(dir) = &self.data_dir {
            builder = builder.data_dir(dir);
        }
        builder.build().await
    }
}

type Factory = Arc<dyn Fn(serde_json::Value) -> Result<Box<dyn SandboxBackend>> + Send + Sync>;

/// Backend factories by type name; see the [module docs](self).
#[derive(Clone, Default)]
pub struct BackendRegistry {
    factories: BTreeMap<String, Factory>,
}

impl std::fmt::Debug for BackendRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackendRegistry")
            .field("types", &self.factories.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl BackendRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers `factory` for backend type `name` (replacing an earlier one). The
    /// factory gets the config's backend options as a JSON object.
    pub fn register<F>(mut self, name: impl Into<String>, factory: F) -> Self
    where
        F: Fn(serde_json::Value) -> Result<Box<dyn SandboxBackend>> + Send + Sync + 'static,
    {
        self.factories.insert(name.into(), Arc::new(factory));
        self
    }

    /// The registered type names, sorted.
    pub fn types(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Builds a backend of type `name` from `options`. An unregistered type is
    /// `InvalidInput` naming the registered ones.
    pub fn build(&self, name: &str, options: serde_json::Value) -> Result<Box<dyn SandboxBackend>> {
        let factory = self.factories.get(name).ok_or_else(|| {
            Error::invalid_input(format!(
                "unknown backend type {name:?}; registered: {}",
                self.types().collect::<Vec<_>>().join(", ")
            ))
        })?;
        factory(options).map_err(|e| e.context(format_args!("configuring the {name} backend")))
    }
}

/// Deserializes a backend's typed options from a config's option object, turning serde's
/// error into `InvalidInput` that names the backend; for backend factories.
pub fn backend_options<T: serde::de::DeserializeOwned>(
    backend: &str,
    options: serde_json::Value,
) -> Result<T> {
    serde_json::from_value(options)
        .map_err(|e| Error::invalid_input(format!("invalid {backend} backend options: {e}")))
}
