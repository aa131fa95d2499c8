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
/// Every key besides `type`, `data_dir`, `state_url`, `snapshots_url` and `manager` is an
/// option of the backend,
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
    /// Where the manager keeps session state instead of `data_dir`'s SQLite file:
    /// `postgres://user:password@host/db` (feature `postgres`), shared by managers on
    /// several hosts, or `sqlite:PATH` (see [`open_state_store`](crate::store::open_state_store)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_url: Option<String>,
    /// Where the manager keeps snapshots instead of `data_dir`'s `snapshots/`:
    /// `s3://bucket/prefix` (feature `s3`, configured by the `AWS_*` variables),
    /// `gs://...`, `az://...` or `file:DIR` (see
    /// [`open_snapshot_store`](crate::store::open_snapshot_store)).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshots_url: Option<String>,
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
            state_url: None,
            snapshots_url: None,
            manager: ManagerSettings::default(),
            options: serde_json::Map::new(),
        }
    }

    /// Builds the backend through `registry`. A backend type registered with
    /// [`register_async`](BackendRegistry::register_async) needs
    /// [`build_backend_async`](Self::build_backend_async).
    pub fn build_backend(&self, registry: &BackendRegistry) -> Result<Box<dyn SandboxBackend>> {
        registry.build(
            &self.backend,
            serde_json::Value::Object(self.options.clone()),
        )
    }

    /// Builds the backend through `registry`, whichever way its type was registered.
    pub async fn build_backend_async(
        &self,
        registry: &BackendRegistry,
    ) -> Result<Box<dyn SandboxBackend>> {
        registry
            .build_async(
                &self.backend,
                serde_json::Value::Object(self.options.clone()),
            )
            .await
    }

    /// Builds the backend and a manager over it with these settings and `data_dir`.
    pub async fn build_manager(
        &self,
        registry: &BackendRegistry,
    ) -> Result<SandboxManager<Box<dyn SandboxBackend>>> {
        let backend = self.build_backend_async(registry).await?;
        let mut builder = SandboxManager::builder(backend).settings(self.manager.clone());
        if let Some(dir) = &self.data_dir {
            builder = builder.data_dir(dir);
        }
        if let Some(url) = &self.state_url {
            builder = builder.state_store(crate::store::open_state_store(url).await?);
        }
        if let Some(url) = &self.snapshots_url {
            builder = builder.snapshot_store(crate::store::open_snapshot_store(url)?);
        }
        builder.build().await
    }
}

/// What a backend's construction from its options answers, where it must connect first.
pub type BackendFuture = futures::future::BoxFuture<'static, Result<Box<dyn SandboxBackend>>>;

/// How a type's backend is made: at once, or after connecting somewhere.
#[derive(Clone)]
enum Factory {
    Sync(Arc<dyn Fn(serde_json::Value) -> Result<Box<dyn SandboxBackend>> + Send + Sync>),
    Async(Arc<dyn Fn(serde_json::Value) -> BackendFuture + Send + Sync>),
}

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
        self.factories
            .insert(name.into(), Factory::Sync(Arc::new(factory)));
        self
    }

    /// Registers `factory` for backend type `name` (replacing an earlier one), for
    /// backends that must connect before they answer (a remote API): build them with
    /// [`build_async`](Self::build_async) or
    /// [`SandboxConfig::build_manager`].
    ///
    /// ```
    /// # #[cfg(feature = "testing")]
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// use futures::FutureExt;
    /// use sandcell::testing::MockBackend;
    /// use sandcell::{BackendRegistry, SandboxBackend};
    ///
    /// let registry = BackendRegistry::new().register_async("mock-later", |options| {
    ///     async move { MockBackend::from_options(options) }.boxed()
    /// });
    /// let backend = registry.build_async("mock-later", serde_json::json!({})).await?;
    /// assert_eq!(backend.name(), "mock");
    /// // Built synchronously, it says what to do instead.
    /// let err = registry.build("mock-later", serde_json::json!({})).unwrap_err();
    /// assert!(err.to_string().contains("build_async"), "{err}");
    /// # Ok::<_, sandcell::Error>(())
    /// # }).unwrap();
    /// ```
    pub fn register_async<F>(mut self, name: impl Into<String>, factory: F) -> Self
    where
        F: Fn(serde_json::Value) -> BackendFuture + Send + Sync + 'static,
    {
        self.factories
            .insert(name.into(), Factory::Async(Arc::new(factory)));
        self
    }

    /// The registered type names, sorted.
    pub fn types(&self) -> impl Iterator<Item = &str> {
        self.factories.keys().map(String::as_str)
    }

    /// Builds a backend of type `name` from `options`. An unregistered type is
    /// `InvalidInput` naming the registered ones.
    /// A type registered with [`register_async`](Self::register_async) is `InvalidInput`
    /// pointing at [`build_async`](Self::build_async).
    pub fn build(&self, name: &str, options: serde_json::Value) -> Result<Box<dyn SandboxBackend>> {
        match self.factory(name)? {
            Factory::Sync(factory) => factory(options),
            Factory::Async(_) => Err(Error::invalid_input(format!(
                "backend type {name:?} connects when it is built: use build_async (or \
                 SandboxConfig::build_backend_async / build_manager)"
            ))),
        }
        .map_err(|e| e.context(format_args!("configuring the {name} backend")))
    }

    /// Builds a backend of type `name` from `options`, however its type was registered.
    /// An unregistered type is `InvalidInput` naming the registered ones.
    pub async fn build_async(
        &self,
        name: &str,
        options: serde_json::Value,
    ) -> Result<Box<dyn SandboxBackend>> {
        match self.factory(name)? {
            Factory::Sync(factory) => factory(options),
            Factory::Async(factory) => factory(options).await,
        }
        .map_err(|e| e.context(format_args!("configuring the {name} backend")))
    }

    fn factory(&self, name: &str) -> Result<&Factory> {
        self.factories.get(name).ok_or_else(|| {
            Error::invalid_input(format!(
                "unknown backend type {name:?}; registered: {}",
                self.types().collect::<Vec<_>>().join(", ")
            ))
        })
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
