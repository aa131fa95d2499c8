//! `Box<dyn SandboxBackend>` and `Arc<dyn SandboxBackend>` (any `Box<T>` and `Arc<T>`)
//! as backends themselves, each method passed to the backend inside.

use std::sync::Arc;

use super::SandboxBackend;

crate::raw::forward_backend! {
    impl [T: SandboxBackend + ?Sized] SandboxBackend for Box<T> {
        forward {
            [info, create, lifecycle, ports, exec, read, read_limited, files, export_changes,
             metrics, set_network, clone_sandbox] => deref;
        }
    }
}

crate::raw::forward_backend! {
    impl [T: SandboxBackend + ?Sized] SandboxBackend for Arc<T> {
        forward {
            [info, create, lifecycle, ports, exec, read, read_limited, files, export_changes,
             metrics, set_network, clone_sandbox] => deref;
        }
    }
}
