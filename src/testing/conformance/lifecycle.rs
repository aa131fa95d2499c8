//! Lifecycle cases: create, inspect, list, destroy, pause, reset, published ports.

use std::time::Duration;

use bytes::Bytes;

use super::{assert_kind, fingerprint, p, spec, with_sandbox};
use crate::{
    ErrorKind, ExecRequest, LabelSelector, SandboxBackend, SandboxBackendExt, SandboxId,
    SandboxPath, SandboxStatus,
};

/// `create`/`inspect`/`list`/`destroy`: labels carried, status running, destroy idempotent.
pub async fn lifecycle(b: &dyn SandboxBackend) {
    let run = uuid::Uuid::new_v4().to_string();
    let spec_a = spec()
        .label("conformance.run", &run)
        .label("conformance.which", "a");
    let spec_b = spec()
        .label("conformance.run", &run)
        .label("conformance.which", "b");
    let a = b.create(&spec_a).await.expect("create a");
    let c = b.create(&spec_b).await.expect("create b");
    assert_ne!(a.id, c.id, "ids are unique");
    assert_eq!(a.status, SandboxStatus::Running);
    assert_eq!(
        a.labels.get("conformance.which").map(String::as_str),
        Some("a")
    );
    assert_eq!(a.backend, b.name());

    let seen = b.inspect(&a.id).await.expect("inspect");
    assert_eq!(seen.id, a.id);
    assert_eq!(seen.template, "default");
    assert_eq!(seen.labels, a.labels);

    let both = b
        .list(&LabelSelector::new().label("conformance.run", &run))
        .await
        .expect("list");
    assert_eq!(both.len(), 2, "list by run label finds both");
    let only_a = b
        .list(
            &LabelSelector::new()
                .label("conformance.run", &run)
                .label("conformance.which", "a"),
        )
        .await
        .expect("list");
    assert_eq!(
        only_a.iter().map(|i| &i.id).collect::<Vec<_>>(),
        vec![&a.id]
    );

    b.destroy(&a.id).await.expect("destroy");
    b.destroy(&a.id).await.expect("destroy is idempotent");
    assert_kind(
        b.inspect(&a.id).await,
        ErrorKind::NotFound,
        "inspect after destroy",
    );
    assert_kind(
        b.read(&a.id, &p("x")).await,
        ErrorKind::NotFound,
        "read after destroy",
    );
    let left = b
        .list(&LabelSelector::new().label("conformance.run", &run))
        .await
        .expect("list");
    assert_eq!(left.iter().map(|i| &i.id).collect::<Vec<_>>(), vec![&c.id]);
    b.destroy(&c.id).await.expect("destroy");
}

/// Bad specs and unknown templates fail before anything is created.
pub async fn create_rejects_bad_specs(b: &dyn SandboxBackend) {
    let run = uuid::Uuid::new_v4().to_string();
    let selector = LabelSelector::new().label("conformance.run", &run);
    let bad = spec().label("conformance.run", &run).env("BAD=NAME", "x");
    assert_kind(
        b.create(&bad).await,
        ErrorKind::InvalidInput,
        "env name with '='",
    );
    let mut unknown = spec().label("conformance.run", &run);
    unknown.template = format!("no-such-template-{run}");
    assert_kind(
        b.create(&unknown).await,
        ErrorKind::NotFound,
        "unknown template",
    );
    assert!(
        b.list(&selector).await.expect("list").is_empty(),
        "nothing was created"
    );
}

/// An id that was never created is `NotFound` everywhere.
pub async fn unknown_sandbox_is_not_found(b: &dyn SandboxBackend) {
    let id = SandboxId::generate("never-created");
    assert_kind(b.inspect(&id).await, ErrorKind::NotFound, "inspect");
    assert_kind(b.read(&id, &p("a")).await, ErrorKind::NotFound, "read");
    assert_kind(
        b.write(&id, &p("a"), Bytes::new()).await,
        ErrorKind::NotFound,
        "write",
    );
    assert_kind(
        b.list_dir(&id, &SandboxPath::root()).await,
        ErrorKind::NotFound,
        "list_dir",
    );
    assert_kind(
        b.exec(&id, ExecRequest::new(["true"])).await.map(|_| ()),
        ErrorKind::NotFound,
        "exec",
    );
    b.destroy(&id)
        .await
        .expect("destroying an unknown sandbox succeeds");
}

/// `pause`/`resume` where supported; `Unsupported` otherwise.
pub async fn pause_resume(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        if !b.capabilities().pause {
            assert_kind(
                b.pause(&id).await,
                ErrorKind::Unsupported,
                "pause without the capability",
            );
            return;
        }
        b.write(&id, &p("paused/f"), Bytes::from_static(b"kept"))
            .await
            .unwrap();
        b.pause(&id).await.expect("pause");
        assert_eq!(b.inspect(&id).await.unwrap().status, SandboxStatus::Paused);
        if b.capabilities().files_while_paused {
            // The claim covers what a snapshot of a paused sandbox needs: reading,
            // writing, listing and archiving.
            assert_eq!(
                &b.read(&id, &p("paused/f")).await.unwrap()[..],
                b"kept",
                "files readable while paused"
            );
            b.write(&id, &p("paused/g"), Bytes::from_static(b"new"))
                .await
                .expect("files writable while paused");
            assert_eq!(
                b.list_dir(&id, &p("paused")).await.unwrap().len(),
                2,
                "directories listable while paused"
            );
            let tar = b
                .export_tar(&id, &p("paused"))
                .await
                .expect("export while paused");
            let bytes = futures::TryStreamExt::try_fold(tar, 0usize, |n, chunk| async move {
                Ok(n + chunk.len())
            })
            .await
            .expect("export while paused");
            assert!(bytes > 0, "an export while paused carries the files");
        } else {
            assert_kind(
                b.read(&id, &p("paused/f")).await,
                ErrorKind::InvalidState,
                "read while paused without files_while_paused",
            );
            assert_kind(
                b.write(&id, &p("paused/g"), Bytes::new()).await,
                ErrorKind::InvalidState,
                "write while paused without files_while_paused",
            );
            assert_kind(
                b.export_tar(&id, &p("paused")).await.map(|_| ()),
                ErrorKind::InvalidState,
                "export while paused without files_while_paused",
            );
        }
        assert_kind(
            b.exec(&id, ExecRequest::new(["true"])).await.map(|_| ()),
            ErrorKind::InvalidState,
            "exec while paused",
        );
        b.resume(&id).await.expect("resume");
        b.resume(&id).await.expect("resume twice");
        assert_eq!(b.inspect(&id).await.unwrap().status, SandboxStatus::Running);
    })
    .await;
}

/// `publish_port`: `Unsupported` without the capability; with it, idempotent, `NotFound`
/// for an unknown sandbox, and (where the sandbox has busybox) a listener inside the
/// sandbox answers on `127.0.0.1:port` of this host.
pub async fn published_ports(b: &dyn SandboxBackend) {
    let spec = spec().network(crate::Network::Full);
    with_sandbox(b, spec, |id| async move {
        if !b.capabilities().port_exposure {
            assert_kind(
                b.publish_port(&id, 20999).await,
                ErrorKind::Unsupported,
                "publish_port without the capability",
            );
            return;
        }
        assert_kind(
            b.publish_port(&SandboxId::new("conformance-missing").unwrap(), 20999)
                .await,
            ErrorKind::NotFound,
            "publish_port on an unknown sandbox",
        );
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        if !b.run(&id, ExecRequest::new(["busybox", "true"])).await.is_ok_and(|o| o.success()) {
            eprintln!(
                "conformance[{}]: published_ports: no busybox in the sandbox; reachability not checked",
                b.name()
            );
        } else {
            b.write(&id, &p("www/index.html"), Bytes::from_static(b"published"))
                .await
                .unwrap();
            let port_arg = port.to_string();
            let mut server = b
                .exec(
                    &id,
                    ExecRequest::new(["busybox", "httpd", "-f", "-p", &port_arg, "-h", "www"]),
                )
                .await
                .expect("start busybox httpd");
            b.publish_port(&id, port).await.expect("publish_port");
            b.publish_port(&id, port).await.expect("publish_port twice");
            let deadline = std::time::Instant::now() + Duration::from_secs(15);
            let page = loop {
                let page = tokio::task::spawn_blocking(move || http_get(port, "/index.html"))
                    .await
                    .unwrap();
                if page.as_deref().is_some_and(|p| p.starts_with("HTTP/")) {
                    break page.unwrap();
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "nothing answered on 127.0.0.1:{port} within 15 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            };
            assert!(page.ends_with("published"), "{page}");
            server.kill().await.expect("kill busybox httpd");
        }
        b.unpublish_port(&id, port).await.expect("unpublish_port");
        b.unpublish_port(&id, port)
            .await
            .expect("unpublish_port twice");
    })
    .await;
}

/// A raw HTTP/1.0 GET of `path` on `127.0.0.1:port`: the whole response, if any.
fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    Some(response)
}

/// `reset` keeps the workspace; `Unsupported` without the capability.
pub async fn reset_keeps_workspace(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        if !b.capabilities().reset {
            assert_kind(
                b.reset(&id).await,
                ErrorKind::Unsupported,
                "reset without the capability",
            );
            return;
        }
        b.write(&id, &p("reset/f"), Bytes::from_static(b"kept"))
            .await
            .unwrap();
        let before = fingerprint(b, &id).await;
        b.reset(&id).await.expect("reset");
        assert_eq!(
            fingerprint(b, &id).await,
            before,
            "reset keeps the workspace"
        );
        assert_eq!(b.inspect(&id).await.unwrap().status, SandboxStatus::Running);
    })
    .await;
}
