//! Observing a sandbox: file watching and resource metrics.

use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;

use super::{assert_kind, p, spec, stream, with_sandbox};
use crate::archive::ImportOptions;
use crate::testing::RawTar;
use crate::{
    ErrorKind, ExecRequest, SandboxBackend, SandboxBackendExt, SandboxId, WatchEvent,
    WatchEventKind, WatchOptions, WatchStream,
};

/// A watch's events in a form to compare across backends: consecutive duplicates
/// collapsed, and a `Modified` right after the `Created` of the same path dropped (a
/// kernel reports the creation and the first write apart; a backend writing a file
/// whole may not).
fn normalize(events: &[WatchEvent]) -> Vec<String> {
    let mut out: Vec<(WatchEventKind, String)> = Vec::new();
    for event in events {
        let text = match &event.from {
            Some(from) => format!("{from} -> {}", event.path),
            None => event.path.to_string(),
        };
        let item = (event.kind, text);
        if let Some(last) = out.last() {
            let modified_after_create = last.0 == WatchEventKind::Created
                && item.0 == WatchEventKind::Modified
                && last.1 == item.1;
            if *last == item || modified_after_create {
                continue;
            }
        }
        out.push(item);
    }
    out.into_iter()
        .map(|(kind, text)| format!("{kind:?} {text}"))
        .collect()
}

/// Reads events until one is `wanted` (or 10 s passed); returns all it read.
async fn events_until(watch: &mut WatchStream, wanted: &str) -> Vec<WatchEvent> {
    let mut events = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !normalize(&events).iter().any(|e| e == wanted) {
        match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(Some(event)) => events.push(event.expect("a watch event")),
            Ok(None) | Err(_) => break,
        }
    }
    events
}

/// Reads events until `expected.len()` normalized ones arrived with those `seen`
/// before (or 10 s passed), then for 300 ms more, so an extra event shows up too.
async fn expect_events(
    watch: &mut WatchStream,
    seen: Vec<WatchEvent>,
    expected: &[&str],
    what: &str,
) {
    let mut events = seen;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while normalize(&events).len() < expected.len() {
        match tokio::time::timeout_at(deadline, watch.next()).await {
            Ok(Some(event)) => events.push(event.expect("a watch event")),
            Ok(None) | Err(_) => break,
        }
    }
    while let Ok(Some(event)) = tokio::time::timeout(Duration::from_millis(300), watch.next()).await
    {
        events.push(event.expect("a watch event"));
    }
    assert_eq!(
        normalize(&events),
        expected,
        "{what}: raw events {events:?}"
    );
}

/// A live watch keeps reporting after its sandbox is cloned (a clone may remount the
/// source's workspace, or pause it), and reports nothing the clone does: on backends
/// claiming both watch and clone.
pub async fn watch_outlives_a_clone(b: &dyn SandboxBackend) {
    let caps = b.capabilities();
    if !(caps.watch && caps.clone) {
        return;
    }
    with_sandbox(b, spec(), |id| async move {
        b.mkdir(&id, &p("w")).await.unwrap();
        let mut watch = b
            .watch(&id, &p("w"), WatchOptions::new())
            .await
            .expect("a watch");
        b.write(&id, &p("w/before.txt"), Bytes::from_static(b"1"))
            .await
            .unwrap();
        let seen = normalize(&events_until(&mut watch, "Created w/before.txt").await);
        assert!(
            seen.iter().any(|e| e == "Created w/before.txt"),
            "the watch reports before the clone: {seen:?}"
        );
        let clone = b.clone_sandbox(&id, spec().labels).await.expect("clone").id;
        let checks = async {
            b.write(&clone, &p("w/in-clone.txt"), Bytes::from_static(b"c"))
                .await
                .unwrap();
            b.write(&id, &p("w/after.txt"), Bytes::from_static(b"2"))
                .await
                .unwrap();
            let seen = normalize(&events_until(&mut watch, "Created w/after.txt").await);
            assert!(
                seen.iter().any(|e| e == "Created w/after.txt"),
                "the watch reports after the clone: {seen:?}"
            );
            assert!(
                !seen.iter().any(|e| e.contains("in-clone")),
                "the source's watch reports the clone's write: {seen:?}"
            );
        };
        let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(checks)).await;
        let destroyed = b.destroy(&clone).await;
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
        destroyed.expect("destroy the clone");
    })
    .await;
}

/// Watching a directory, recursively and not: every change made afterwards, by the
/// API and (with a shell) by a process, arrives in order with workspace-relative paths;
/// nothing reached through a symlink is reported; the stream ends with the sandbox.
pub async fn watch_reports_changes_in_order(b: &dyn SandboxBackend) {
    if !b.capabilities().watch {
        return with_sandbox(b, spec(), |id| async move {
            assert_kind(
                b.watch(&id, &p(""), WatchOptions::new()).await.map(|_| ()),
                ErrorKind::Unsupported,
                "watch without the capability",
            );
        })
        .await;
    }
    let caps = b.capabilities();
    let info = b.create(&spec()).await.expect("create");
    let id = info.id.clone();
    let body = async {
        b.mkdir(&id, &p("w")).await.unwrap();
        b.mkdir(&id, &p("outside")).await.unwrap();
        if caps.symlinks {
            // w/link leads to a directory outside the watched one: writes there are
            // not reported as w/link/...
            let tar = RawTar::new().symlink("link", "../outside").finish();
            b.import_tar(&id, &p("w"), stream(tar), ImportOptions::merge())
                .await
                .unwrap();
        }
        assert_kind(
            b.watch(&id, &p("missing"), WatchOptions::new())
                .await
                .map(|_| ()),
            ErrorKind::NotFound,
            "watching a missing directory",
        );
        b.write(&id, &p("file"), Bytes::from_static(b"f"))
            .await
            .unwrap();
        assert_kind(
            b.watch(&id, &p("file"), WatchOptions::new())
                .await
                .map(|_| ()),
            ErrorKind::InvalidInput,
            "watching a file",
        );
        let mut deep = b
            .watch(&id, &p("w"), WatchOptions::new().recursive(true))
            .await
            .expect("a recursive watch");
        let mut flat = b
            .watch(&id, &p("w"), WatchOptions::new())
            .await
            .expect("a watch");

        // Something else happens between the two writes: a first write may be
        // reported as a creation and a modification, which normalizing merges.
        b.write(&id, &p("w/a.txt"), Bytes::from_static(b"1"))
            .await
            .unwrap();
        b.mkdir(&id, &p("w/sub")).await.unwrap();
        // A recursive watch learns of a new directory from its creation; once that is
        // reported, what happens inside it is reported in order with the rest.
        let seen_deep = events_until(&mut deep, "Created w/sub").await;
        b.write(&id, &p("w/a.txt"), Bytes::from_static(b"22"))
            .await
            .unwrap();
        b.write(&id, &p("w/sub/b.txt"), Bytes::from_static(b"b"))
            .await
            .unwrap();
        b.write(&id, &p("outside/x.txt"), Bytes::from_static(b"x"))
            .await
            .unwrap();
        b.write(&id, &p("elsewhere.txt"), Bytes::from_static(b"e"))
            .await
            .unwrap();
        b.rename(&id, &p("w/a.txt"), &p("w/c.txt")).await.unwrap();
        b.rename(&id, &p("w/c.txt"), &p("moved-out.txt"))
            .await
            .unwrap();
        b.rename(&id, &p("elsewhere.txt"), &p("w/in.txt"))
            .await
            .unwrap();
        b.remove(&id, &p("w/in.txt"), false).await.unwrap();
        b.remove(&id, &p("w/sub/b.txt"), false).await.unwrap();
        b.remove(&id, &p("w/sub"), false).await.unwrap();
        let mut expected_deep = vec![
            "Created w/a.txt",
            "Created w/sub",
            "Modified w/a.txt",
            "Created w/sub/b.txt",
            "Renamed w/a.txt -> w/c.txt",
            "Removed w/c.txt",
            "Created w/in.txt",
            "Removed w/in.txt",
            "Removed w/sub/b.txt",
            "Removed w/sub",
        ];
        let mut expected_flat = vec![
            "Created w/a.txt",
            "Created w/sub",
            "Modified w/a.txt",
            "Renamed w/a.txt -> w/c.txt",
            "Removed w/c.txt",
            "Created w/in.txt",
            "Removed w/in.txt",
            "Removed w/sub",
        ];
        if caps.shell {
            b.run_shell(&id, "echo shell > w/sh.txt && chmod 600 w/sh.txt")
                .await
                .unwrap()
                .check()
                .unwrap();
            for expected in [&mut expected_deep, &mut expected_flat] {
                expected.extend(["Created w/sh.txt", "Attributes w/sh.txt"]);
            }
        }
        expect_events(&mut deep, seen_deep, &expected_deep, "recursive watch").await;
        expect_events(&mut flat, Vec::new(), &expected_flat, "watch").await;
        drop(flat);

        // The stream ends when the sandbox goes.
        b.destroy(&id).await.unwrap();
        let end = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(Ok(_)) = deep.next().await {}
        })
        .await;
        assert!(end.is_ok(), "a watch ends with its sandbox");
        assert_kind(
            b.watch(&id, &p(""), WatchOptions::new()).await.map(|_| ()),
            ErrorKind::NotFound,
            "watching a destroyed sandbox",
        );
    };
    let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(body)).await;
    let _ = b.destroy(&id).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
}

/// A metrics reading: the workspace's bytes at least those written, processes counted
/// where known, the memory limit reported where one is set and known.
pub async fn metrics_report_use(b: &dyn SandboxBackend) {
    let caps = b.capabilities();
    if !caps.metrics {
        return with_sandbox(b, spec(), |id| async move {
            assert_kind(
                b.metrics(&id).await,
                ErrorKind::Unsupported,
                "metrics without the capability",
            );
        })
        .await;
    }
    assert_kind(
        b.metrics(&SandboxId::new("no-such-sandbox").unwrap()).await,
        ErrorKind::NotFound,
        "metrics of an unknown sandbox",
    );
    let limit = 256 << 20;
    let spec = if caps.memory_limit {
        spec().limits(crate::Limits::new().memory_bytes(limit))
    } else {
        spec()
    };
    with_sandbox(b, spec, |id| async move {
        let before = b.metrics(&id).await.expect("metrics");
        b.write(&id, &p("big.bin"), Bytes::from(vec![7u8; 200_000]))
            .await
            .unwrap();
        let after = b.metrics(&id).await.expect("metrics");
        let disk = after.disk_bytes.expect("disk_bytes is reported");
        assert!(disk >= 200_000, "disk_bytes {disk} counts the file written");
        if let Some(earlier) = before.disk_bytes {
            assert!(
                disk >= earlier + 200_000 - 4096,
                "disk_bytes grew by the file"
            );
        }
        assert!(after.at >= before.at);
        if caps.memory_limit {
            if let Some(reported) = after.memory_limit_bytes {
                assert_eq!(reported, limit, "the memory limit set");
            }
        }
        if caps.shell && caps.interactive_exec {
            let mut sleeper = b
                .exec(&id, ExecRequest::new(["sleep", "30"]))
                .await
                .expect("exec");
            let busy = b
                .run_shell(&id, "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done")
                .await
                .unwrap();
            assert!(busy.success());
            let reading = b.metrics(&id).await.expect("metrics");
            if let Some(processes) = reading.processes {
                assert!(processes >= 1, "the sleeping process is counted");
            }
            if let Some(memory) = reading.memory_bytes {
                assert!(memory > 0, "processes use memory");
            }
            if let Some(cpu) = reading.cpu_time {
                assert!(cpu > Duration::ZERO, "the busy loop used CPU time");
            }
            sleeper.kill().await.unwrap();
            let _ = sleeper.wait().await;
        }
    })
    .await;
}
