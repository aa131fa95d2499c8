//! ADVERSARIAL 40: `walk` and `glob` stay within their caps however large the tree: a walk answers at
//! most `WALK_MAX_ENTRIES` entries, and a glob keeps only its matches, at most
//! `GLOB_MAX_MATCHES`, saying `LimitExceeded` past either rather than holding the whole
//! tree's paths (FINDINGS9 G1: 425 MiB per call for 3.6 MB of hard links under a deep
//! directory, and MCP's `glob` tool ran a server out of memory).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::{
    ErrorKind, SandboxBackend, SandboxBackendExt, SandboxPath, SandboxSpec, GLOB_MAX_MATCHES,
    WALK_MAX_ENTRIES,
};
use sandcell_local::LocalBackend;

mod common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_glob_keeps_only_its_matches_and_a_walk_refuses_too_many() {
    let root = common::fast_tempdir();
    let backend = LocalBackend::builder().root(root.path()).build().unwrap();
    let id = backend.create(&SandboxSpec::default()).await.unwrap().id;
    let half = WALK_MAX_ENTRIES / 2 + 1;
    let made = backend
        .run_shell(
            &id,
            &format!(
                "mkdir a b && (cd a && seq {half} | xargs touch) && \
                 (cd b && seq {half} | sed 's/$/.txt/' | xargs touch) && : > a/wanted.rs"
            ),
        )
        .await
        .unwrap();
    assert!(made.success(), "{made:?}");
    let walked = backend.walk(&id, &SandboxPath::root()).await.unwrap_err();
    assert_eq!(walked.kind(), ErrorKind::LimitExceeded, "{walked}");
    // A glob over the same tree answers its one match.
    let found = backend.glob(&id, "**/*.rs").await.unwrap();
    assert_eq!(found, vec![SandboxPath::new("a/wanted.rs").unwrap()]);
    // Past its cap of matches, a glob says so.
    assert!(half > GLOB_MAX_MATCHES);
    let many = backend.glob(&id, "b/*.txt").await.unwrap_err();
    assert_eq!(many.kind(), ErrorKind::LimitExceeded, "{many}");
    backend.destroy(&id).await.unwrap();
}
