//! [`backend_over_wire!`](super::backend_over_wire): a backend's operations inside
//! one sandbox, each passed to the sandbox's [`WireClient`](super::WireClient), written
//! once for every backend that reaches its sandboxes over the wire.

/// See [`backend_over_wire!`](super::backend_over_wire).
#[doc(hidden)]
#[macro_export]
macro_rules! __backend_over_wire {
    (
        $(#[$attr:meta])*
        impl SandboxBackend for $ty:ty {
            wire = $wire:ident;
            forward = [$($method:ident),* $(,)?];
            $($rest:tt)*
        }
    ) => {
        $crate::__backend_over_wire!(@munch
            [$(#[$attr])*] [$ty] $wire [$($rest)*] [] $($method)*
        );
    };
    // `files`: every operation on the workspace's files, so a new one added here reaches
    // every backend that forwards them all without an edit there.
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt $done:tt files $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest $done
            write stat list_dir remove mkdir rename export_tar import_tar watch $($more)*
        );
    };
    // Each arm adds one method's forwarder to what is done, then goes on with the rest;
    // the impl is emitted whole at the end, so `async_trait` sees every method.
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] exec $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn exec(
                &self,
                id: &$crate::SandboxId,
                request: $crate::ExecRequest,
            ) -> $crate::Result<$crate::Process> {
                self.$wire(id).await?.exec(request).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] read $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn read(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<$crate::__private::Bytes> {
                self.$wire(id).await?.read(path).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] read_limited $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn read_limited(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                max_bytes: u64,
            ) -> $crate::Result<$crate::__private::Bytes> {
                self.$wire(id).await?.read_limited(path, max_bytes).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] write $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn write(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                data: $crate::__private::Bytes,
            ) -> $crate::Result<()> {
                self.$wire(id).await?.write(path, data).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] stat $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn stat(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<$crate::FileInfo> {
                self.$wire(id).await?.stat(path).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] list_dir $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn list_dir(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<Vec<$crate::DirEntry>> {
                self.$wire(id).await?.list_dir(path).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] remove $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn remove(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                recursive: bool,
            ) -> $crate::Result<()> {
                self.$wire(id).await?.remove(path, recursive).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] mkdir $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn mkdir(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<()> {
                self.$wire(id).await?.mkdir(path).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] rename $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn rename(
                &self,
                id: &$crate::SandboxId,
                from: &$crate::SandboxPath,
                to: &$crate::SandboxPath,
            ) -> $crate::Result<()> {
                self.$wire(id).await?.rename(from, to).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] export_tar $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn export_tar(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<$crate::ByteStream> {
                self.$wire(id).await?.export_tar(path).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] export_changes $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn export_changes(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<$crate::Changes> {
                self.$wire(id).await?.export_changes().await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] import_tar $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn import_tar(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                tar: $crate::ByteStream,
                options: $crate::archive::ImportOptions,
            ) -> $crate::Result<()> {
                self.$wire(id).await?.import_tar(path, tar, options).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] watch $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn watch(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                options: $crate::WatchOptions,
            ) -> $crate::Result<$crate::WatchStream> {
                self.$wire(id).await?.watch(path, options).await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] metrics $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn metrics(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<$crate::SandboxMetrics> {
                self.$wire(id).await?.metrics().await
            }
        ] $($more)*);
    };
    (@munch $attrs:tt $ty:tt $wire:ident $rest:tt [$($done:tt)*] set_network $($more:ident)*) => {
        $crate::__backend_over_wire!(@munch $attrs $ty $wire $rest [$($done)*
            async fn set_network(
                &self,
                id: &$crate::SandboxId,
                network: &$crate::Network,
            ) -> $crate::Result<()> {
                self.$wire(id).await?.set_network(network).await
            }
        ] $($more)*);
    };
    (@munch [$($attr:tt)*] [$ty:ty] $wire:ident [$($rest:tt)*] [$($done:tt)*]) => {
        $($attr)*
        #[deny(clippy::missing_trait_methods)]
        #[$crate::__private::async_trait]
        impl $crate::SandboxBackend for $ty {
            $($done)*
            $($rest)*
        }
    };
}

/// Implements [`SandboxBackend`](crate::SandboxBackend) for a type that reaches each
/// sandbox through a [`WireClient`](crate::raw::wire::WireClient): the methods named
/// in `forward` pass their call to the client that `wire` (an `async fn(&self, &SandboxId)
/// -> Result<WireClient>` of the type) returns for the sandbox; every other method is
/// written out after them.
///
/// `clippy::missing_trait_methods` is denied on the impl, so a method added to the
/// trait is a compile error here rather than its default (`Unsupported`) answering for
/// a backend whose agent could serve it: it is then added to `forward` (after one arm
/// in this macro) or written out.
///
/// The forwardable methods: `exec`, `read`, `read_limited`, `write`, `stat`,
/// `list_dir`, `remove`, `mkdir`, `rename`, `export_tar`, `export_changes`,
/// `import_tar`, `watch`, `metrics` and `set_network`; `files` stands for `write`
/// through `watch` (every operation on the workspace's files but the reads, which
/// backends bound in their own ways), so an operation added to the group reaches every
/// backend that names it.
///
/// ```
/// use sandcell::raw::wire::WireClient;
/// use sandcell::{Capabilities, LabelSelector, Result, SandboxId, SandboxInfo, SandboxSpec};
///
/// struct Agents;
///
/// impl Agents {
///     async fn agent(&self, id: &SandboxId) -> Result<WireClient> {
///         Err(sandcell::Error::not_found(format!("no agent for {id}")))
///     }
/// }
///
/// sandcell::raw::wire::backend_over_wire! {
///     impl SandboxBackend for Agents {
///         wire = agent;
///         forward = [files, exec, read, read_limited, export_changes, metrics, set_network];
///
///         fn name(&self) -> &str { "agents" }
///         fn capabilities(&self) -> Capabilities { Capabilities::default() }
///         async fn create(&self, _: &SandboxSpec) -> Result<SandboxInfo> { todo!() }
///         async fn inspect(&self, _: &SandboxId) -> Result<SandboxInfo> { todo!() }
///         async fn list(&self, _: &LabelSelector) -> Result<Vec<SandboxInfo>> { todo!() }
///         async fn destroy(&self, _: &SandboxId) -> Result<()> { todo!() }
///         async fn pause(&self, _: &SandboxId) -> Result<()> { todo!() }
///         async fn resume(&self, _: &SandboxId) -> Result<()> { todo!() }
///         async fn reset(&self, _: &SandboxId) -> Result<()> { todo!() }
///         async fn publish_port(&self, _: &SandboxId, _: u16) -> Result<()> { todo!() }
///         async fn unpublish_port(&self, _: &SandboxId, _: u16) -> Result<()> { todo!() }
///         async fn clone_sandbox(
///             &self,
///             _: &SandboxId,
///             _: std::collections::BTreeMap<String, String>,
///         ) -> Result<SandboxInfo> {
///             todo!()
///         }
///     }
/// }
/// ```
#[doc(inline)]
pub use __backend_over_wire as backend_over_wire;
