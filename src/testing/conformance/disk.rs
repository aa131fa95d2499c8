//! The disk limit a backend claims holds: a sandbox filled past it, from inside and
//! through the backend, stops short of it.

use bytes::Bytes;

use super::{assert_kind, p, spec, with_sandbox};
use crate::{ErrorKind, Limits, SandboxBackend, SandboxBackendExt};

/// The limit the case gives its sandbox.
const LIMIT: u64 = 64 << 20;

/// With `disk_limit`, a sandbox of a 64 MiB limit cannot hold more: a command writing
/// 200 MiB fails, short of the limit, and so do the backend's writes (with
/// `LimitExceeded`); once its files are removed it can write again. Without the
/// capability, a disk limit is `Unsupported`.
pub async fn disk_limit_is_enforced(b: &dyn SandboxBackend) {
    let capped = spec().limits(Limits::new().disk_bytes(LIMIT));
    if !b.capabilities().disk_limit {
        assert_kind(
            b.create(&capped).await.map(|info| info.id),
            ErrorKind::Unsupported,
            "a disk limit without the capability",
        );
        return;
    }
    with_sandbox(b, capped, |id| async move {
        // Where the backend reports metrics, they name the limit.
        if let Ok(reading) = b.metrics(&id).await {
            assert_eq!(reading.disk_limit_bytes, Some(LIMIT), "metrics' disk limit");
        }
        if b.capabilities().shell {
            let out = b
                .run_shell(
                    &id,
                    "head -c 209715200 /dev/zero > big; s=$?; wc -c < big; rm -f big; exit $s",
                )
                .await
                .expect("run a command that fills the disk");
            assert!(!out.success(), "200 MiB written under a 64 MiB disk limit");
            let written: u64 = out.stdout_str().trim().parse().expect("a size");
            assert!(
                written < LIMIT,
                "{written} bytes written under a {LIMIT}-byte limit"
            );
        }
        // Through the backend, 4 MiB at a time, until it refuses.
        let chunk = Bytes::from(vec![0u8; 4 << 20]);
        let mut stored = 0u64;
        let refused = loop {
            let path = p(&format!("fill-{}", stored / chunk.len() as u64));
            match b.write(&id, &path, chunk.clone()).await {
                Ok(()) => stored += chunk.len() as u64,
                Err(e) => break e,
            }
            assert!(
                stored < LIMIT,
                "{stored} bytes stored under a {LIMIT}-byte limit"
            );
        };
        assert_eq!(refused.kind(), ErrorKind::LimitExceeded, "{refused}");
        assert!(
            stored > 0,
            "nothing could be written under a {LIMIT}-byte limit"
        );
        for n in 0..=stored / chunk.len() as u64 {
            let _ = b.remove(&id, &p(&format!("fill-{n}")), false).await;
        }
        b.write(&id, &p("after.bin"), chunk.clone())
            .await
            .expect("room again once the files are gone");
    })
    .await;
}
