//! `Box<dyn SandboxBackend>` and `Arc<dyn SandboxBackend>` (any `Box<T>` and `Arc<T>`)
//! as backends themselves, each method passed to the backend inside.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{ByteStream, Changes, SandboxBackend};
use crate::archive::ImportOptions;
use crate::capabilities::Capabilities;
use crate::error::Result;
use crate::exec::ExecRequest;
use crate::fs::{DirEntry, FileInfo};
use crate::metrics::SandboxMetrics;
use crate::path::SandboxPath;
use crate::process::Process;
use crate::sandbox::{LabelSelector, SandboxId, SandboxInfo};
use crate::spec::SandboxSpec;
use crate::watch::{WatchOptions, WatchStream};

/// Forwards every method of the trait to `**self`. `missing_trait_methods` is denied so
/// a method added to the trait cannot fall back to its default here and answer
/// `Unsupported` for a backend that supports it.
macro_rules! forward_backend {
    ($ty:ty) => {
        #[deny(clippy::missing_trait_methods)]
        #[async_trait]
        impl<T: SandboxBackend + ?Sized> SandboxBackend for $ty {
            fn name(&self) -> &str {
                (**self).name()
            }
            fn capabilities(&self) -> Capabilities {
                (**self).capabilities()
            }
            async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
                (**self).create(spec).await
            }
            async fn inspect(&self, id: &SandboxId) -> Result<SandboxInfo> {
                (**self).inspect(id).await
            }
            async fn list(&self, selector: &LabelSelector) -> Result<Vec<SandboxInfo>> {
                (**self).list(selector).await
            }
            async fn destroy(&self, id: &SandboxId) -> Result<()> {
                (**self).destroy(id).await
            }
            async fn pause(&self, id: &SandboxId) -> Result<()> {
                (**self).pause(id).await
            }
            async fn resume(&self, id: &SandboxId) -> Result<()> {
                (**self).resume(id).await
            }
            async fn reset(&self, id: &SandboxId) -> Result<()> {
                (**self).reset(id).await
            }
            async fn publish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
                (**self).publish_port(id, port).await
            }
            async fn unpublish_port(&self, id: &SandboxId, port: u16) -> Result<()> {
                (**self).unpublish_port(id, port).await
            }
            async fn exec(&self, id: &SandboxId, request: ExecRequest) -> Result<Process> {
                (**self).exec(id, request).await
            }
            async fn read(&self, id: &SandboxId, path: &SandboxPath) -> Result<Bytes> {
                (**self).read(id, path).await
            }
            async fn read_limited(
                &self,
                id: &SandboxId,
                path: &SandboxPath,
                max_bytes: u64,
            ) -> Result<Bytes> {
                (**self).read_limited(id, path, max_bytes).await
            }
            async fn write(&self, id: &SandboxId, path: &SandboxPath, data: Bytes) -> Result<()> {
                (**self).write(id, path, data).await
            }
            async fn stat(&self, id: &SandboxId, path: &SandboxPath) -> Result<FileInfo> {
                (**self).stat(id, path).await
            }
            async fn list_dir(&self, id: &SandboxId, path: &SandboxPath) -> Result<Vec<DirEntry>> {
                (**self).list_dir(id, path).await
            }
            async fn remove(
                &self,
                id: &SandboxId,
                path: &SandboxPath,
                recursive: bool,
            ) -> Result<()> {
                (**self).remove(id, path, recursive).await
            }
            async fn mkdir(&self, id: &SandboxId, path: &SandboxPath) -> Result<()> {
                (**self).mkdir(id, path).await
            }
            async fn rename(
                &self,
                id: &SandboxId,
                from: &SandboxPath,
                to: &SandboxPath,
            ) -> Result<()> {
                (**self).rename(id, from, to).await
            }
            async fn export_tar(&self, id: &SandboxId, path: &SandboxPath) -> Result<ByteStream> {
                (**self).export_tar(id, path).await
            }
            async fn export_changes(&self, id: &SandboxId) -> Result<Changes> {
                (**self).export_changes(id).await
            }
            async fn import_tar(
                &self,
                id: &SandboxId,
                path: &SandboxPath,
                tar: ByteStream,
                options: ImportOptions,
            ) -> Result<()> {
                (**self).import_tar(id, path, tar, options).await
            }
            async fn watch(
                &self,
                id: &SandboxId,
                path: &SandboxPath,
                options: WatchOptions,
            ) -> Result<WatchStream> {
                (**self).watch(id, path, options).await
            }
            async fn metrics(&self, id: &SandboxId) -> Result<SandboxMetrics> {
                (**self).metrics(id).await
            }
            async fn set_network(&self, id: &SandboxId, network: &crate::Network) -> Result<()> {
                (**self).set_network(id, network).await
            }
            async fn clone_sandbox(
                &self,
                id: &SandboxId,
                labels: BTreeMap<String, String>,
            ) -> Result<SandboxInfo> {
                (**self).clone_sandbox(id, labels).await
            }
        }
    };
}

forward_backend!(Box<T>);
forward_backend!(Arc<T>);
