//! [`forward_backend!`](super::forward_backend): a backend's methods passed on, each
//! to where the impl says (the sandbox's [`WireClient`](super::wire::WireClient), a
//! field's backend, or the backend behind a pointer), written once for every backend
//! and wrapper that passes calls along.
//!
//! A method added to the trait is added here once, to its group (`files` for an
//! operation on a sandbox's files): every backend that forwards the group then
//! forwards it, with no edit there.

/// See [`forward_backend!`](super::forward_backend).
#[doc(hidden)]
#[macro_export]
macro_rules! __forward_backend {
    (
        $(#[$attr:meta])*
        impl $([$($generics:tt)*])? SandboxBackend for $ty:ty {
            forward {
                $( [$($method:ident),* $(,)?] => $how:ident $($target:ident)? ; )*
            }
            $($rest:tt)*
        }
    ) => {
        $crate::__forward_backend!(@clauses
            [$(#[$attr])*] [$($($generics)*)?] [$ty] [$($rest)*] []
            $( [[$($method)*] [$how $($target)?]] )*
        );
    };
    // Each clause becomes its methods, each with where it goes.
    (@clauses $a:tt $g:tt $t:tt $r:tt [$($pairs:tt)*]
        [[$($method:ident)*] $to:tt] $($more:tt)*) => {
        $crate::__forward_backend!(@clauses $a $g $t $r [$($pairs)* $($method $to)*] $($more)*);
    };
    (@clauses $a:tt $g:tt $t:tt $r:tt [$($pairs:tt)*]) => {
        $crate::__forward_backend!(@munch $a $g $t $r [] $($pairs)*);
    };
    // How a forwarded call is made: on the sandbox's wire client, on a field's
    // backend, or on the backend a pointer holds.
    (@call [wire $wire:ident] $s:tt $m:ident [$id:ident] ($($arg:ident),*)) => {
        $s.$wire($id).await?.$m($($arg),*).await
    };
    (@call [routed $route:ident] $s:tt $m:ident [$id:ident] ($($arg:ident),*)) => {
        match $s.$route($id).await? {
            $crate::raw::Routed::Wire(wire) => wire.$m($($arg),*).await,
            $crate::raw::Routed::Own(own) => own.$m($id, $($arg),*).await,
        }
    };
    (@call [field $field:ident] $s:tt $m:ident [$($id:ident)?] ($($arg:ident),*)) => {
        $crate::SandboxBackend::$m(&$s.$field, $($id,)? $($arg),*).await
    };
    (@call [deref] $s:tt $m:ident [$($id:ident)?] ($($arg:ident),*)) => {
        $crate::SandboxBackend::$m(&**$s, $($id,)? $($arg),*).await
    };
    (@sync [field $field:ident] $s:tt $m:ident) => {
        $crate::SandboxBackend::$m(&$s.$field)
    };
    (@sync [deref] $s:tt $m:ident) => {
        $crate::SandboxBackend::$m(&**$s)
    };
    // The groups. `info`: what a backend says of itself.
    (@munch $a:tt $g:tt $t:tt $r:tt $d:tt info $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r $d
            name $to capabilities $to $($more)*
        );
    };
    // `lifecycle`: every change of a sandbox's state but its making (`create`,
    // `clone_sandbox`), which wrappers are the likeliest to check first.
    (@munch $a:tt $g:tt $t:tt $r:tt $d:tt lifecycle $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r $d
            inspect $to list $to destroy $to pause $to resume $to reset $to $($more)*
        );
    };
    // `ports`: publishing a sandbox's ports.
    (@munch $a:tt $g:tt $t:tt $r:tt $d:tt ports $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r $d
            publish_port $to unpublish_port $to $($more)*
        );
    };
    // `files`: every operation on the workspace's files but the reads (which
    // backends bound in their own ways).
    (@munch $a:tt $g:tt $t:tt $r:tt $d:tt files $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r $d
            write $to stat $to list_dir $to remove $to mkdir $to rename $to
            export_tar $to import_tar $to watch $to $($more)*
        );
    };
    // Each arm adds one method's forwarder to what is done, then goes on with the rest;
    // the impl is emitted whole at the end, so `async_trait` sees every method.
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] name $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            fn name(&self) -> &str {
                $crate::__forward_backend!(@sync $to self name)
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] capabilities $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            fn capabilities(&self) -> $crate::Capabilities {
                $crate::__forward_backend!(@sync $to self capabilities)
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] create $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn create(
                &self,
                spec: &$crate::SandboxSpec,
            ) -> $crate::Result<$crate::SandboxInfo> {
                $crate::__forward_backend!(@call $to self create [] (spec))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] inspect $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn inspect(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<$crate::SandboxInfo> {
                $crate::__forward_backend!(@call $to self inspect [id] ())
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] list $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn list(
                &self,
                selector: &$crate::LabelSelector,
            ) -> $crate::Result<Vec<$crate::SandboxInfo>> {
                $crate::__forward_backend!(@call $to self list [] (selector))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] destroy $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn destroy(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self destroy [id] ())
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] pause $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn pause(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self pause [id] ())
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] resume $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn resume(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self resume [id] ())
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] reset $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn reset(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self reset [id] ())
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] publish_port $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn publish_port(
                &self,
                id: &$crate::SandboxId,
                port: u16,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self publish_port [id] (port))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] unpublish_port $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn unpublish_port(
                &self,
                id: &$crate::SandboxId,
                port: u16,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self unpublish_port [id] (port))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] exec $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn exec(
                &self,
                id: &$crate::SandboxId,
                request: $crate::ExecRequest,
            ) -> $crate::Result<$crate::Process> {
                $crate::__forward_backend!(@call $to self exec [id] (request))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] read $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn read(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<$crate::__private::Bytes> {
                $crate::__forward_backend!(@call $to self read [id] (path))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] read_limited $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn read_limited(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                max_bytes: u64,
            ) -> $crate::Result<$crate::__private::Bytes> {
                $crate::__forward_backend!(@call $to self read_limited [id] (path, max_bytes))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] write $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn write(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                data: $crate::__private::Bytes,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self write [id] (path, data))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] stat $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn stat(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<$crate::FileInfo> {
                $crate::__forward_backend!(@call $to self stat [id] (path))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] list_dir $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn list_dir(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<Vec<$crate::DirEntry>> {
                $crate::__forward_backend!(@call $to self list_dir [id] (path))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] remove $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn remove(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                recursive: bool,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self remove [id] (path, recursive))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] mkdir $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn mkdir(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self mkdir [id] (path))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] rename $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn rename(
                &self,
                id: &$crate::SandboxId,
                from: &$crate::SandboxPath,
                to: &$crate::SandboxPath,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self rename [id] (from, to))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] export_tar $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn export_tar(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
            ) -> $crate::Result<$crate::ByteStream> {
                $crate::__forward_backend!(@call $to self export_tar [id] (path))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] export_changes $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn export_changes(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<$crate::Changes> {
                $crate::__forward_backend!(@call $to self export_changes [id] ())
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] import_tar $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn import_tar(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                tar: $crate::ByteStream,
                options: $crate::archive::ImportOptions,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self import_tar [id] (path, tar, options))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] watch $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn watch(
                &self,
                id: &$crate::SandboxId,
                path: &$crate::SandboxPath,
                options: $crate::WatchOptions,
            ) -> $crate::Result<$crate::WatchStream> {
                $crate::__forward_backend!(@call $to self watch [id] (path, options))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] metrics $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn metrics(
                &self,
                id: &$crate::SandboxId,
            ) -> $crate::Result<$crate::SandboxMetrics> {
                $crate::__forward_backend!(@call $to self metrics [id] ())
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] set_network $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn set_network(
                &self,
                id: &$crate::SandboxId,
                network: &$crate::Network,
            ) -> $crate::Result<()> {
                $crate::__forward_backend!(@call $to self set_network [id] (network))
            }
        ] $($more)*);
    };
    (@munch $a:tt $g:tt $t:tt $r:tt [$($d:tt)*] clone_sandbox $to:tt $($more:tt)*) => {
        $crate::__forward_backend!(@munch $a $g $t $r [$($d)*
            async fn clone_sandbox(
                &self,
                id: &$crate::SandboxId,
                labels: std::collections::BTreeMap<String, String>,
            ) -> $crate::Result<$crate::SandboxInfo> {
                $crate::__forward_backend!(@call $to self clone_sandbox [id] (labels))
            }
        ] $($more)*);
    };
    (@munch [$($attr:tt)*] [$($generics:tt)*] [$ty:ty] [$($rest:tt)*] [$($done:tt)*]) => {
        $($attr)*
        #[deny(clippy::missing_trait_methods)]
        #[$crate::__private::async_trait]
        impl<$($generics)*> $crate::SandboxBackend for $ty {
            $($done)*
            $($rest)*
        }
    };
}

/// Implements [`SandboxBackend`](crate::SandboxBackend) with the methods named in
/// `forward` passed on, and the rest written out after it.
///
/// Each clause of `forward` names methods, or groups of them, and where they go:
///
/// - `=> wire client;` to the [`WireClient`](crate::raw::wire::WireClient) that
///   `client` (an `async fn(&self, &SandboxId) -> Result<WireClient>` of the type)
///   returns for the sandbox: a backend that reaches its sandboxes over the wire;
/// - `=> routed route;` to where `route` (an `async fn(&self, &SandboxId) ->
///   Result<Routed<T>>`) sends the sandbox's calls: its wire client, or a layer of the
///   backend's own (`T`), whose same-named method takes the sandbox's id first;
/// - `=> field inner;` to the backend in the field `inner`: a wrapper;
/// - `=> deref;` to the backend the pointer holds (`**self`).
///
/// The groups: `info` (`name`, `capabilities`); `lifecycle` (`inspect`, `list`,
/// `destroy`, `pause`, `resume`, `reset`: every change of state but `create` and
/// `clone_sandbox`, which are named alone); `ports` (`publish_port`,
/// `unpublish_port`); `files` (`write`, `stat`, `list_dir`, `remove`, `mkdir`,
/// `rename`, `export_tar`, `import_tar`, `watch`: every operation on the workspace's
/// files but the reads). Alone: `create`, `clone_sandbox`, `exec`, `read`,
/// `read_limited`, `export_changes`, `metrics`, `set_network`. A method added to the
/// trait joins its group, and reaches every backend that forwards the group.
///
/// `clippy::missing_trait_methods` is denied on the impl, so a method added to the
/// trait and to no group is a compile error here rather than its default
/// (`Unsupported`) answering for a backend that could serve it.
///
/// Generics go in brackets: `impl [T: SandboxBackend + ?Sized] SandboxBackend for
/// Box<T>`.
///
/// ```
/// use std::sync::Arc;
///
/// use sandcell::raw::wire::WireClient;
/// use sandcell::{Result, SandboxBackend, SandboxId, SandboxInfo, SandboxSpec};
///
/// /// A wrapper that reaches each sandbox over the wire once it exists, and counts
/// /// what it creates.
/// struct Counted {
///     inner: Arc<dyn SandboxBackend>,
///     made: std::sync::atomic::AtomicUsize,
/// }
///
/// impl Counted {
///     async fn agent(&self, id: &SandboxId) -> Result<WireClient> {
///         Err(sandcell::Error::not_found(format!("no agent for {id}")))
///     }
/// }
///
/// sandcell::raw::forward_backend! {
///     impl SandboxBackend for Counted {
///         forward {
///             [files, exec, read, read_limited, export_changes, metrics, set_network]
///                 => wire agent;
///             [info, lifecycle, ports, clone_sandbox] => field inner;
///         }
///
///         async fn create(&self, spec: &SandboxSpec) -> Result<SandboxInfo> {
///             self.made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
///             self.inner.create(spec).await
///         }
///     }
/// }
/// ```
#[doc(inline)]
pub use __forward_backend as forward_backend;

/// Where one sandbox's calls go, for a backend that reaches some sandboxes over the
/// wire and others through a layer of its own ([`forward_backend!`]'s `=> routed`).
#[derive(Debug)]
pub enum Routed<T> {
    /// The sandbox's wire client.
    Wire(super::wire::WireClient),
    /// The backend's own layer, whose methods take the sandbox's id first.
    Own(T),
}
