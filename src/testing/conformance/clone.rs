//! Cloning a running sandbox.

use std::collections::BTreeMap;

use bytes::Bytes;

use super::{assert_kind, p, spec, with_sandbox};
use crate::{ErrorKind, SandboxBackend, SandboxId, SandboxStatus};

/// A clone holds the source's workspace, carries the labels given (not the source's),
/// and is independent both ways: writes, removals and the source's destroy do not reach
/// it, and its writes do not reach the source.
pub async fn clone_is_independent(b: &dyn SandboxBackend) {
    let caps = b.capabilities();
    // The conformance labels (so a clone left by a crash is found like any case's
    // sandbox) and one of its own.
    let mut labels: BTreeMap<String, String> = spec().labels;
    labels.insert("sandcell.test.clone".to_owned(), "yes".to_owned());
    if !caps.clone {
        let before = b.list(&Default::default()).await.expect("list").len();
        with_sandbox(b, spec(), |id| {
            let labels = labels.clone();
            async move {
                assert_kind(
                    b.clone_sandbox(&id, labels).await,
                    ErrorKind::Unsupported,
                    "clone without the capability",
                );
            }
        })
        .await;
        assert_eq!(b.list(&Default::default()).await.unwrap().len(), before);
        return;
    }
    assert_kind(
        b.clone_sandbox(&SandboxId::new("no-such-sandbox").unwrap(), labels.clone())
            .await,
        ErrorKind::NotFound,
        "cloning an unknown sandbox",
    );
    let source_spec = spec().env("CLONED_ENV", "kept");
    with_sandbox(b, source_spec, |source| async move {
        b.write(&source, &p("shared.txt"), Bytes::from_static(b"source"))
            .await
            .unwrap();
        b.write(&source, &p("dir/deep.txt"), Bytes::from_static(b"deep"))
            .await
            .unwrap();
        b.write(&source, &p("doomed.txt"), Bytes::from_static(b"x"))
            .await
            .unwrap();
        let source_info = b.inspect(&source).await.unwrap();
        let clone = b
            .clone_sandbox(&source, labels.clone())
            .await
            .expect("clone a running sandbox");
        let clone_id = clone.id.clone();
        let checks = async {
            assert_ne!(clone.id, source);
            assert_eq!(clone.status, SandboxStatus::Running);
            assert_eq!(clone.labels, labels, "the clone carries the labels given");
            assert_eq!(clone.template, source_info.template);
            assert_eq!(b.inspect(&clone.id).await.unwrap().id, clone.id);
            assert_eq!(
                &b.read(&clone.id, &p("shared.txt")).await.unwrap()[..],
                b"source"
            );
            assert_eq!(
                &b.read(&clone.id, &p("dir/deep.txt")).await.unwrap()[..],
                b"deep"
            );

            // Clone to source: nothing crosses.
            b.write(&clone.id, &p("shared.txt"), Bytes::from_static(b"clone"))
                .await
                .unwrap();
            b.write(&clone.id, &p("clone-only.txt"), Bytes::from_static(b"c"))
                .await
                .unwrap();
            b.remove(&clone.id, &p("doomed.txt"), false).await.unwrap();
            assert_eq!(
                &b.read(&source, &p("shared.txt")).await.unwrap()[..],
                b"source"
            );
            assert_kind(
                b.read(&source, &p("clone-only.txt")).await,
                ErrorKind::NotFound,
                "a file the clone wrote, read in the source",
            );
            assert_eq!(&b.read(&source, &p("doomed.txt")).await.unwrap()[..], b"x");

            // Source to clone: nothing crosses.
            b.write(&source, &p("dir/deep.txt"), Bytes::from_static(b"changed"))
                .await
                .unwrap();
            b.write(&source, &p("source-only.txt"), Bytes::from_static(b"s"))
                .await
                .unwrap();
            assert_eq!(
                &b.read(&clone.id, &p("dir/deep.txt")).await.unwrap()[..],
                b"deep"
            );
            assert_kind(
                b.read(&clone.id, &p("source-only.txt")).await,
                ErrorKind::NotFound,
                "a file the source wrote, read in the clone",
            );
            if caps.shell {
                let out = crate::SandboxBackendExt::run_shell(b, &clone.id, "echo $CLONED_ENV")
                    .await
                    .unwrap();
                assert_eq!(
                    out.stdout_str().trim(),
                    "kept",
                    "the clone has the source's env"
                );
            }

            // The source's destroy leaves the clone whole.
            b.destroy(&source).await.unwrap();
            assert_eq!(
                &b.read(&clone.id, &p("shared.txt")).await.unwrap()[..],
                b"clone"
            );
            assert_eq!(
                b.inspect(&clone.id).await.unwrap().status,
                SandboxStatus::Running
            );
        };
        let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(checks)).await;
        let destroyed = b.destroy(&clone_id).await;
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
        destroyed.expect("destroy the clone");
    })
    .await;
}
