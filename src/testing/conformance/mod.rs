//! The conformance suite: every `# Behavior` promise of [`SandboxBackend`], checked once.
//!
//! Each case is a plain async function taking the backend; [`run_all`] runs every case
//! the backend's [`Capabilities`](crate::Capabilities) make applicable and says which it
//! skipped and why. Cases panic on failure, like `assert!`.
//!
//! The hostile cases also check that nothing changed: the workspace is fingerprinted
//! before and after, and symlinks used for escapes point at a fresh host directory that
//! must still be empty afterwards.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use bytes::Bytes;
use futures::{FutureExt, StreamExt};

use super::RawTar;

mod capabilities;
use crate::archive::{ArchiveLimits, ImportOptions};
use crate::snapshot::{self, PackOptions, SnapshotManifest};
use crate::{
    ByteStream, EditOutcome, ErrorKind, ExecRequest, FileKind, LabelSelector, Language,
    SandboxBackend, SandboxBackendExt, SandboxId, SandboxPath, SandboxSpec, SandboxStatus,
};
pub use capabilities::{claimed_capabilities_work, create_refuses_what_it_cannot_honour};

/// The label every conformance sandbox carries.
pub const TEST_LABEL: (&str, &str) = ("sandcell.test", "conformance");

/// The spec conformance sandboxes are created from.
pub fn spec() -> SandboxSpec {
    SandboxSpec::new("default").with_label(TEST_LABEL.0, TEST_LABEL.1)
}

pub(crate) fn p(s: &str) -> SandboxPath {
    SandboxPath::new(s).unwrap()
}

pub(crate) fn stream(data: Bytes) -> ByteStream {
    futures::stream::once(async move { Ok(data) }).boxed()
}

/// Creates a sandbox, runs `body`, and destroys the sandbox even if `body` panics.
pub async fn with_sandbox<'a, F, Fut>(b: &'a dyn SandboxBackend, spec: SandboxSpec, body: F)
where
    F: FnOnce(SandboxId) -> Fut,
    Fut: Future<Output = ()> + 'a,
{
    let info = b.create(&spec).await.expect("create a conformance sandbox");
    let result = AssertUnwindSafe(body(info.id.clone())).catch_unwind().await;
    let destroyed = b.destroy(&info.id).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    destroyed.expect("destroy the conformance sandbox");
}

/// A comparable picture of a workspace: every path with its kind and contents (file
/// bytes, or a symlink's target).
pub type Fingerprint = Vec<(String, FileKind, Vec<u8>)>;

/// Takes a [`Fingerprint`] of the whole workspace.
pub async fn fingerprint(b: &dyn SandboxBackend, id: &SandboxId) -> Fingerprint {
    let mut out = Vec::new();
    for entry in b
        .walk(id, &SandboxPath::root())
        .await
        .expect("walk the workspace")
    {
        let content = match entry.kind {
            FileKind::File => b.read(id, &entry.path).await.expect("read a file").to_vec(),
            FileKind::Symlink => b
                .stat(id, &entry.path)
                .await
                .expect("stat a symlink")
                .symlink_target
                .unwrap_or_default()
                .into_bytes(),
            _ => Vec::new(),
        };
        out.push((entry.path.as_str().to_owned(), entry.kind, content));
    }
    out
}

pub(crate) fn assert_kind<T: std::fmt::Debug>(
    result: crate::Result<T>,
    kind: ErrorKind,
    what: &str,
) {
    match result {
        Ok(v) => panic!("{what}: expected a {kind} error, got Ok({v:?})"),
        Err(e) => assert_eq!(e.kind(), kind, "{what}: wrong error kind for {e}"),
    }
}

fn host_dir_is_empty(dir: &std::path::Path) -> bool {
    std::fs::read_dir(dir)
        .map(|mut d| d.next().is_none())
        .unwrap_or(false)
}

// ---------------------------------------------------------------- lifecycle

/// `create`/`inspect`/`list`/`destroy`: labels carried, status running, destroy idempotent.
pub async fn lifecycle(b: &dyn SandboxBackend) {
    let run = uuid::Uuid::new_v4().to_string();
    let spec_a = spec()
        .with_label("conformance.run", &run)
        .with_label("conformance.which", "a");
    let spec_b = spec()
        .with_label("conformance.run", &run)
        .with_label("conformance.which", "b");
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
        .list(&LabelSelector::new().with("conformance.run", &run))
        .await
        .expect("list");
    assert_eq!(both.len(), 2, "list by run label finds both");
    let only_a = b
        .list(
            &LabelSelector::new()
                .with("conformance.run", &run)
                .with("conformance.which", "a"),
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
        .list(&LabelSelector::new().with("conformance.run", &run))
        .await
        .expect("list");
    assert_eq!(left.iter().map(|i| &i.id).collect::<Vec<_>>(), vec![&c.id]);
    b.destroy(&c.id).await.expect("destroy");
}

/// Bad specs and unknown templates fail before anything is created.
pub async fn create_rejects_bad_specs(b: &dyn SandboxBackend) {
    let run = uuid::Uuid::new_v4().to_string();
    let selector = LabelSelector::new().with("conformance.run", &run);
    let bad = spec()
        .with_label("conformance.run", &run)
        .with_env("BAD=NAME", "x");
    assert_kind(
        b.create(&bad).await,
        ErrorKind::InvalidInput,
        "env name with '='",
    );
    let mut unknown = spec().with_label("conformance.run", &run);
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
            assert_eq!(
                &b.read(&id, &p("paused/f")).await.unwrap()[..],
                b"kept",
                "files readable while paused"
            );
        } else {
            assert_kind(
                b.read(&id, &p("paused/f")).await,
                ErrorKind::InvalidState,
                "read while paused without files_while_paused",
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
    let spec = spec().with_network(crate::Network::Full);
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

// ---------------------------------------------------------------- files

/// `write`/`read`/`stat`/`list_dir`: parents created, bytes exact, listing sorted.
pub async fn files_round_trip(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        b.write(&id, &p("rt/deep/er/bin.dat"), Bytes::from(data.clone()))
            .await
            .expect("write creates parents");
        assert_eq!(
            b.read(&id, &p("rt/deep/er/bin.dat"))
                .await
                .unwrap()
                .to_vec(),
            data
        );
        b.write(&id, &p("rt/deep/er/bin.dat"), Bytes::from_static(b"short"))
            .await
            .expect("overwrite");
        assert_eq!(
            &b.read(&id, &p("rt/deep/er/bin.dat")).await.unwrap()[..],
            b"short"
        );
        b.write(&id, &p("rt/empty"), Bytes::new()).await.unwrap();
        assert_eq!(b.read(&id, &p("rt/empty")).await.unwrap().len(), 0);
        b.write(&id, &p("rt/b.txt"), Bytes::from_static(b"bb"))
            .await
            .unwrap();

        let st = b.stat(&id, &p("rt/b.txt")).await.unwrap();
        assert_eq!((st.kind, st.size), (FileKind::File, 2));
        assert_eq!(
            b.stat(&id, &p("rt/deep")).await.unwrap().kind,
            FileKind::Dir
        );
        assert_kind(
            b.stat(&id, &p("rt/missing")).await,
            ErrorKind::NotFound,
            "stat missing",
        );

        let names: Vec<_> = b
            .list_dir(&id, &p("rt"))
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.name, e.path, e.kind))
            .collect();
        assert_eq!(
            names,
            vec![
                ("b.txt".to_owned(), p("rt/b.txt"), FileKind::File),
                ("deep".to_owned(), p("rt/deep"), FileKind::Dir),
                ("empty".to_owned(), p("rt/empty"), FileKind::File),
            ]
        );
        assert_kind(
            b.read(&id, &p("rt/missing")).await,
            ErrorKind::NotFound,
            "read missing",
        );
        assert_kind(
            b.read(&id, &p("rt/deep")).await,
            ErrorKind::InvalidInput,
            "read a directory",
        );
        assert_kind(
            b.write(&id, &p("rt/deep"), Bytes::new()).await,
            ErrorKind::InvalidInput,
            "write over a directory",
        );
        assert_kind(
            b.write(&id, &SandboxPath::root(), Bytes::new()).await,
            ErrorKind::InvalidInput,
            "write the root",
        );
        assert_kind(
            b.list_dir(&id, &p("rt/b.txt")).await,
            ErrorKind::InvalidInput,
            "list a file",
        );
        assert_kind(
            b.list_dir(&id, &p("rt/nope")).await,
            ErrorKind::NotFound,
            "list missing",
        );
    })
    .await;
}

/// `remove`/`mkdir`/`rename` semantics.
pub async fn remove_mkdir_rename(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        b.mkdir(&id, &p("mk/a/b"))
            .await
            .expect("mkdir with parents");
        b.mkdir(&id, &p("mk/a/b"))
            .await
            .expect("mkdir is idempotent");
        b.write(&id, &p("mk/a/b/f"), Bytes::from_static(b"1"))
            .await
            .unwrap();
        assert_kind(
            b.mkdir(&id, &p("mk/a/b/f")).await,
            ErrorKind::AlreadyExists,
            "mkdir over a file",
        );

        assert_kind(
            b.remove(&id, &p("mk/a"), false).await,
            ErrorKind::InvalidInput,
            "remove non-empty dir",
        );
        assert!(
            b.exists(&id, &p("mk/a/b/f")).await.unwrap(),
            "failed remove removes nothing"
        );
        assert_kind(
            b.remove(&id, &p("mk/nope"), false).await,
            ErrorKind::NotFound,
            "remove missing",
        );
        assert_kind(
            b.remove(&id, &SandboxPath::root(), true).await,
            ErrorKind::InvalidInput,
            "remove root",
        );

        b.rename(&id, &p("mk/a/b/f"), &p("mk/g"))
            .await
            .expect("rename a file");
        assert_eq!(&b.read(&id, &p("mk/g")).await.unwrap()[..], b"1");
        assert!(!b.exists(&id, &p("mk/a/b/f")).await.unwrap());
        b.rename(&id, &p("mk/a"), &p("mk/moved"))
            .await
            .expect("rename a dir");
        assert_eq!(
            b.stat(&id, &p("mk/moved/b")).await.unwrap().kind,
            FileKind::Dir
        );
        assert_kind(
            b.rename(&id, &p("mk/moved"), &p("mk/moved/b/inside")).await,
            ErrorKind::InvalidInput,
            "dir into itself",
        );
        assert_kind(
            b.rename(&id, &p("mk/nope"), &p("mk/x")).await,
            ErrorKind::NotFound,
            "rename missing",
        );
        assert_kind(
            b.rename(&id, &SandboxPath::root(), &p("mk/x")).await,
            ErrorKind::InvalidInput,
            "rename root",
        );

        b.remove(&id, &p("mk/g"), false)
            .await
            .expect("remove a file");
        b.remove(&id, &p("mk"), true)
            .await
            .expect("recursive remove");
        assert!(!b.exists(&id, &p("mk")).await.unwrap());
    })
    .await;
}

/// Paths that are absolute, contain `..` or NUL, or are over-long never parse, so they
/// never reach a backend.
pub async fn hostile_paths_are_rejected(b: &dyn SandboxBackend) {
    let _ = b;
    for bad in [
        "/etc/passwd",
        "../outside",
        "a/../../b",
        "a/\0/b",
        "..",
        "/",
    ] {
        assert_kind(SandboxPath::new(bad), ErrorKind::InvalidInput, bad);
    }
    assert_kind(
        SandboxPath::new(&"n".repeat(256)),
        ErrorKind::InvalidInput,
        "256-byte name",
    );
    assert!(
        serde_json::from_str::<SandboxPath>("\"../x\"").is_err(),
        "deserializing validates too"
    );
}

async fn plant(b: &dyn SandboxBackend, id: &SandboxId, tar: Bytes) {
    b.import_tar(
        id,
        &SandboxPath::root(),
        stream(tar),
        ImportOptions::merge(),
    )
    .await
    .expect("plant entries with import_tar");
}

/// Reads and writes through symlinks: followed inside the workspace, refused (with
/// nothing written outside) when they lead out, whether absolute or relative.
pub async fn symlink_escapes_are_refused(b: &dyn SandboxBackend) {
    if !b.capabilities().symlinks {
        return;
    }
    let outside = tempfile::tempdir().expect("host temp dir");
    let outside_path = outside.path().to_str().expect("utf-8 temp path").to_owned();
    with_sandbox(b, spec(), |id| {
        let outside_path = outside_path.clone();
        async move {
            b.mkdir(&id, &p("sl/sub")).await.unwrap();
            plant(
                b,
                &id,
                RawTar::new()
                    .symlink("sl/inner", "sub")
                    .symlink("sl/abs", &outside_path)
                    .symlink("sl/rel", "../../../../../../../../../../../../../../../..")
                    .symlink("sl/up", "..")
                    .finish(),
            )
            .await;
            b.write(&id, &p("sl/inner/f"), Bytes::from_static(b"in"))
                .await
                .expect("write through an inner link");
            assert_eq!(&b.read(&id, &p("sl/sub/f")).await.unwrap()[..], b"in");
            assert_eq!(
                b.stat(&id, &p("sl/inner")).await.unwrap().kind,
                FileKind::Symlink,
                "stat does not follow"
            );

            let before = fingerprint(b, &id).await;
            // `sl/up` is the workspace root, so `sl/up/sl/rel` chains two links to escape.
            for path in [
                "sl/abs/owned",
                "sl/rel/tmp/owned",
                "sl/up/sl/rel/owned",
                "sl/up/sl/abs/owned",
            ] {
                let path = p(path);
                assert_kind(
                    b.write(&id, &path, Bytes::from_static(b"x")).await,
                    ErrorKind::PermissionDenied,
                    path.as_str(),
                );
                assert_kind(
                    b.mkdir(&id, &path).await,
                    ErrorKind::PermissionDenied,
                    path.as_str(),
                );
            }
            assert_kind(
                b.read(&id, &p("sl/abs/owned")).await,
                ErrorKind::PermissionDenied,
                "read through abs link",
            );
            assert_kind(
                b.list_dir(&id, &p("sl/abs")).await,
                ErrorKind::PermissionDenied,
                "list through abs link",
            );
            assert_eq!(fingerprint(b, &id).await, before, "workspace unchanged");
            b.remove(&id, &p("sl/abs"), false)
                .await
                .expect("removing a link removes the link");
        }
    })
    .await;
    assert!(
        host_dir_is_empty(outside.path()),
        "nothing was written outside the workspace"
    );
}

/// Prefix confusion: operations on `data` never touch `data2` or `data.bak`.
pub async fn prefix_confusion(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        for path in ["pc/data/a", "pc/data2/a", "pc/data.bak/a", "pc/dat/a"] {
            b.write(&id, &p(path), Bytes::from_static(b"keep"))
                .await
                .unwrap();
        }
        b.import_tar(
            &id,
            &p("pc/data"),
            stream(RawTar::new().file("new", b"n").finish()),
            ImportOptions::replace(),
        )
        .await
        .expect("replace import");
        assert!(
            !b.exists(&id, &p("pc/data/a")).await.unwrap(),
            "replace removed the old content"
        );
        b.remove(&id, &p("pc/data"), true).await.unwrap();
        for path in ["pc/data2/a", "pc/data.bak/a", "pc/dat/a"] {
            assert_eq!(
                &b.read(&id, &p(path)).await.unwrap()[..],
                b"keep",
                "{path} untouched"
            );
        }
    })
    .await;
}

// ---------------------------------------------------------------- archives

/// Export then import elsewhere reproduces the tree; symlinks stay symlinks; merge keeps
/// what the archive does not replace; replace leaves exactly the archive.
pub async fn archive_round_trip(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("ar/src/a.txt"), Bytes::from_static(b"alpha"))
            .await
            .unwrap();
        b.write(&id, &p("ar/src/nested/b.bin"), Bytes::from(vec![7u8; 3000]))
            .await
            .unwrap();
        b.mkdir(&id, &p("ar/src/emptydir")).await.unwrap();
        if b.capabilities().symlinks {
            plant(
                b,
                &id,
                RawTar::new().symlink("ar/src/link", "a.txt").finish(),
            )
            .await;
        }
        let tar = b.export_tar(&id, &p("ar/src")).await.expect("export");
        b.import_tar(&id, &p("ar/dst"), tar, ImportOptions::merge())
            .await
            .expect("import");
        let src = b.walk(&id, &p("ar/src")).await.unwrap();
        let dst = b.walk(&id, &p("ar/dst")).await.unwrap();
        let names = |v: &[crate::DirEntry], base: &str| -> Vec<(String, FileKind)> {
            v.iter()
                .map(|e| {
                    (
                        e.path.strip_prefix(&p(base)).unwrap().as_str().to_owned(),
                        e.kind,
                    )
                })
                .collect()
        };
        assert_eq!(names(&src, "ar/src"), names(&dst, "ar/dst"));
        assert_eq!(
            b.read(&id, &p("ar/dst/nested/b.bin")).await.unwrap().len(),
            3000
        );
        if b.capabilities().symlinks {
            let link = b.stat(&id, &p("ar/dst/link")).await.unwrap();
            assert_eq!(
                link.kind,
                FileKind::Symlink,
                "symlinks are exported as symlinks"
            );
            assert_eq!(link.symlink_target.as_deref(), Some("a.txt"));
        }

        b.write(&id, &p("ar/dst/extra"), Bytes::from_static(b"x"))
            .await
            .unwrap();
        let tar = RawTar::new().file("a.txt", b"merged").finish();
        b.import_tar(&id, &p("ar/dst"), stream(tar), ImportOptions::merge())
            .await
            .unwrap();
        assert_eq!(
            &b.read(&id, &p("ar/dst/a.txt")).await.unwrap()[..],
            b"merged"
        );
        assert!(
            b.exists(&id, &p("ar/dst/extra")).await.unwrap(),
            "merge keeps other files"
        );

        let tar = RawTar::new().file("only", b"1").finish();
        b.import_tar(&id, &p("ar/dst"), stream(tar), ImportOptions::replace())
            .await
            .unwrap();
        let left: Vec<_> = b
            .list_dir(&id, &p("ar/dst"))
            .await
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(
            left,
            vec!["only".to_owned()],
            "replace leaves exactly the archive"
        );
        assert_kind(
            b.export_tar(&id, &p("ar/missing")).await.map(|_| ()),
            ErrorKind::NotFound,
            "export missing",
        );
    })
    .await;
}

/// One hostile archive: the import fails with `kind`, and the workspace is unchanged.
async fn rejects(
    b: &dyn SandboxBackend,
    id: &SandboxId,
    what: &str,
    tar: ByteStream,
    options: ImportOptions,
    kind: ErrorKind,
) {
    let before = fingerprint(b, id).await;
    assert_kind(b.import_tar(id, &p("imp"), tar, options).await, kind, what);
    assert_eq!(
        fingerprint(b, id).await,
        before,
        "{what}: workspace unchanged after the failed import"
    );
}

/// Every hostile archive entry ends in its typed error with nothing changed: `..`
/// entries, absolute entries, symlink-then-file, link-to-`..`-then-nested-dir, hard
/// links out, devices and FIFOs, setuid bits, entry-count and size caps, a stream
/// error, and entries beneath a symlink already in the workspace.
pub async fn hostile_archives_are_rejected(b: &dyn SandboxBackend) {
    let outside = tempfile::tempdir().expect("host temp dir");
    let outside_path = outside.path().to_str().expect("utf-8").to_owned();
    with_sandbox(b, spec(), |id| {
        let outside_path = outside_path.clone();
        async move {
            // Something already there that a failed import must not disturb.
            b.write(&id, &p("imp/existing.txt"), Bytes::from_static(b"precious"))
                .await
                .unwrap();
            for case in super::hostile_archives(&outside_path) {
                rejects(
                    b,
                    &id,
                    case.name,
                    stream(case.tar),
                    case.options,
                    case.expected,
                )
                .await;
            }
            // An error raised by the stream itself (e.g. a failed hash check at its end).
            let r = ImportOptions::replace;
            let m = ImportOptions::merge;
            let good_then_error: ByteStream = futures::stream::iter(vec![
                Ok(RawTar::new().file("partial", b"x").finish()),
                Err(crate::Error::corrupt("injected stream failure")),
            ])
            .boxed();
            rejects(
                b,
                &id,
                "stream error after valid entries",
                good_then_error,
                r(),
                ErrorKind::Corrupt,
            )
            .await;

            // Garbage after the end marker cannot run on forever.
            let limits = ArchiveLimits::default().max_bytes(1 << 20).max_entries(10);
            let trailing: ByteStream = futures::stream::iter(
                std::iter::once(Ok(RawTar::new().file("f", b"x").finish()))
                    .chain((0..64).map(|_| Ok(Bytes::from(vec![0u8; 1 << 20])))),
            )
            .boxed();
            rejects(
                b,
                &id,
                "endless trailing zeros",
                trailing,
                m().with_limits(limits),
                ErrorKind::LimitExceeded,
            )
            .await;

            if b.capabilities().symlinks {
                plant(
                    b,
                    &id,
                    RawTar::new().symlink("imp/exit", &outside_path).finish(),
                )
                .await;
                rejects(
                    b,
                    &id,
                    "entry beneath a symlink already in the workspace",
                    stream(RawTar::new().file("exit/owned", b"x").finish()),
                    m(),
                    ErrorKind::PermissionDenied,
                )
                .await;
            }
            assert_eq!(
                &b.read(&id, &p("imp/existing.txt")).await.unwrap()[..],
                b"precious"
            );
        }
    })
    .await;
    assert!(
        host_dir_is_empty(outside.path()),
        "nothing was written outside the workspace"
    );
}

// ---------------------------------------------------------------- snapshots

/// A snapshot taken on this backend restores into a fresh sandbox exactly.
pub async fn snapshot_round_trip(b: &dyn SandboxBackend) {
    let mut taken: Option<(SnapshotManifest, Vec<u8>, Fingerprint)> = None;
    let slot = &mut taken;
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("snap/a.txt"), Bytes::from_static(b"alpha"))
            .await
            .unwrap();
        b.write(&id, &p("snap/deep/b.bin"), Bytes::from(vec![42u8; 100_000]))
            .await
            .unwrap();
        if b.capabilities().symlinks {
            plant(
                b,
                &id,
                RawTar::new().symlink("snap/link", "deep/b.bin").finish(),
            )
            .await;
        }
        let (manifest, blob) = snapshot::capture(
            b,
            &id,
            &SandboxPath::root(),
            Vec::new(),
            &PackOptions::default(),
        )
        .await
        .expect("capture");
        assert_eq!(manifest.backend, b.name());
        assert_eq!(manifest.size_bytes as usize, blob.len());
        assert!(manifest.entry_count >= 4);
        let back = SnapshotManifest::from_json(&manifest.to_json().unwrap()).unwrap();
        assert_eq!(back, manifest);
        *slot = Some((manifest, blob, fingerprint(b, &id).await));
    })
    .await;
    let (manifest, blob, expected) = taken.expect("snapshot taken");
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("stale"), Bytes::from_static(b"replaced"))
            .await
            .unwrap();
        snapshot::restore(
            b,
            &id,
            &SandboxPath::root(),
            std::io::Cursor::new(blob),
            &manifest,
            ImportOptions::replace(),
        )
        .await
        .expect("restore");
        assert_eq!(
            fingerprint(b, &id).await,
            expected,
            "restored workspace equals the snapshot"
        );
    })
    .await;
}

/// Changes captured since the template restore exactly into a fresh sandbox of the same
/// template: added, overwritten and deleted files alike (deletions need a template with
/// files; an empty template still checks additions).
pub async fn incremental_snapshot_round_trip(b: &dyn SandboxBackend) {
    let mut taken: Option<(SnapshotManifest, Vec<u8>, Fingerprint)> = None;
    let slot = &mut taken;
    with_sandbox(b, spec(), |id| async move {
        let template_files: Vec<_> = b
            .walk(&id, &SandboxPath::root())
            .await
            .unwrap()
            .into_iter()
            .filter(|e| e.kind == FileKind::File)
            .collect();
        if let Some(first) = template_files.first() {
            b.write(&id, &first.path, Bytes::from_static(b"overwritten"))
                .await
                .unwrap();
        }
        if let Some(second) = template_files.get(1) {
            b.remove(&id, &second.path, false).await.unwrap();
        }
        b.write(&id, &p("inc/new/deep.txt"), Bytes::from_static(b"added"))
            .await
            .unwrap();
        b.mkdir(&id, &p("inc/empty")).await.unwrap();
        let (manifest, blob) =
            snapshot::capture_changes(b, &id, Vec::new(), &PackOptions::default())
                .await
                .expect("capture changes");
        assert!(manifest.incremental);
        assert_eq!(
            manifest.deleted.len(),
            usize::from(template_files.len() > 1)
        );
        *slot = Some((manifest, blob, fingerprint(b, &id).await));
    })
    .await;
    let (manifest, blob, expected) = taken.expect("changes taken");
    with_sandbox(b, spec(), |id| async move {
        snapshot::restore(
            b,
            &id,
            &SandboxPath::root(),
            std::io::Cursor::new(blob),
            &manifest,
            ImportOptions::replace(),
        )
        .await
        .expect("restore changes");
        assert_eq!(
            fingerprint(b, &id).await,
            expected,
            "template + changes equals the original"
        );
    })
    .await;
}

/// Restoring a corrupted blob, a blob whose manifest hash does not match, or a zstd
/// bomb fails with a typed error and leaves the workspace unchanged.
pub async fn hostile_snapshots_are_rejected(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        b.write(&id, &p("hs/keep.txt"), Bytes::from_static(b"precious")).await.unwrap();
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f.txt"), vec![b'z'; 200_000]).unwrap();
        let mut blob = Vec::new();
        let packed = snapshot::pack_dir(src.path(), &mut blob, &PackOptions::default()).unwrap();
        let manifest = SnapshotManifest::new(&packed, b.name(), "default");

        let before = fingerprint(b, &id).await;
        let id = &id;
        let restore = |blob: Vec<u8>, manifest: SnapshotManifest, options: ImportOptions| async move {
            snapshot::restore(b, id, &SandboxPath::root(), std::io::Cursor::new(blob), &manifest, options).await
        };

        let mut flipped = blob.clone();
        let mid = flipped.len() / 2;
        flipped[mid] ^= 0xff;
        assert_kind(restore(flipped, manifest.clone(), ImportOptions::replace()).await, ErrorKind::Corrupt, "flipped byte");
        assert_eq!(fingerprint(b, id).await, before, "corrupt blob changed nothing");

        let mut wrong = manifest.clone();
        wrong.sha256 = "0".repeat(64);
        assert_kind(restore(blob.clone(), wrong, ImportOptions::replace()).await, ErrorKind::Corrupt, "hash mismatch");
        assert_eq!(fingerprint(b, id).await, before, "mismatched blob changed nothing");

        let mut truncated = blob.clone();
        truncated.truncate(truncated.len() - 10);
        assert_kind(restore(truncated, manifest.clone(), ImportOptions::replace()).await, ErrorKind::Corrupt, "truncated blob");

        // A bomb: 512 MiB of zeros (a few KiB compressed) with a manifest that matches it.
        let mut bomb = Vec::new();
        {
            let mut enc = zstd::stream::write::Encoder::new(&mut bomb, 3).unwrap();
            let zeros = vec![0u8; 1 << 20];
            for _ in 0..512 {
                std::io::Write::write_all(&mut enc, &zeros).unwrap();
            }
            enc.finish().unwrap();
        }
        let mut bomb_manifest = manifest.clone();
        bomb_manifest.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bomb));
        let limits = ArchiveLimits::default().max_bytes(1 << 20).max_entries(10);
        assert_kind(
            restore(bomb, bomb_manifest, ImportOptions::replace().with_limits(limits)).await,
            ErrorKind::LimitExceeded,
            "zstd bomb",
        );
        assert_eq!(fingerprint(b, id).await, before, "bomb changed nothing");

        let mut future = manifest.clone();
        future.format_version = 99;
        assert_kind(restore(blob, future, ImportOptions::replace()).await, ErrorKind::Unsupported, "unknown format");
    })
    .await;
}

// ---------------------------------------------------------------- extension helpers

/// `edit_file` (seed semantics), text helpers, `glob` and `grep`.
pub async fn ext_editing_and_search(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        let f = p("ed/main.py");
        assert_eq!(
            b.edit_file(&id, &f, "", "x = 1\ny = 1\n").await.unwrap(),
            EditOutcome::Created
        );
        assert_kind(
            b.edit_file(&id, &f, "", "again").await,
            ErrorKind::AlreadyExists,
            "create over non-empty",
        );
        assert_kind(
            b.edit_file(&id, &f, " = 1", "= 2").await,
            ErrorKind::InvalidInput,
            "two matches",
        );
        assert_kind(
            b.edit_file(&id, &f, "z = 1", "z = 2").await,
            ErrorKind::InvalidInput,
            "no match",
        );
        assert_eq!(
            b.read_to_string(&id, &f).await.unwrap(),
            "x = 1\ny = 1\n",
            "failed edits change nothing"
        );
        assert_eq!(
            b.edit_file(&id, &f, "y = 1", "y = 2").await.unwrap(),
            EditOutcome::Replaced
        );
        assert_eq!(
            b.edit_file(&id, &f, "x = 1\n", "").await.unwrap(),
            EditOutcome::Replaced
        );
        assert_eq!(b.read_to_string(&id, &f).await.unwrap(), "y = 2\n");

        b.write_string(
            &id,
            &p("ed/pkg/util.py"),
            "def helper():\n    return 'needle'\n",
        )
        .await
        .unwrap();
        b.write_string(&id, &p("ed/pkg/notes.txt"), "no needle here? needle!\n")
            .await
            .unwrap();
        b.write(
            &id,
            &p("ed/pkg/blob.bin"),
            Bytes::from_static(b"needle\0binary"),
        )
        .await
        .unwrap();
        assert_eq!(
            b.glob(&id, "ed/**/*.py").await.unwrap(),
            vec![p("ed/main.py"), p("ed/pkg/util.py")]
        );
        assert_eq!(
            b.glob(&id, "ed/*.py").await.unwrap(),
            vec![p("ed/main.py")],
            "* does not cross /"
        );
        assert_kind(
            b.glob(&id, "ed/[").await,
            ErrorKind::InvalidInput,
            "bad glob",
        );

        let hits = b.grep(&id, &p("ed"), r"needle").await.unwrap();
        let found: Vec<_> = hits
            .iter()
            .map(|m| (m.path.as_str(), m.line_number))
            .collect();
        assert_eq!(
            found,
            vec![("ed/pkg/notes.txt", 1), ("ed/pkg/util.py", 2)],
            "binary files skipped"
        );
        assert_kind(
            b.grep(&id, &p("ed"), "(").await,
            ErrorKind::InvalidInput,
            "bad regex",
        );
        b.write(&id, &p("ed/bad.txt"), Bytes::from_static(&[0xff, 0xfe]))
            .await
            .unwrap();
        assert_kind(
            b.read_to_string(&id, &p("ed/bad.txt")).await,
            ErrorKind::InvalidInput,
            "non-UTF-8 text",
        );
    })
    .await;
}

/// `upload_dir` then `download_dir` reproduce a host tree; a failed download leaves the
/// host destination untouched and no staging directory behind.
pub async fn ext_upload_download(b: &dyn SandboxBackend) {
    let host = tempfile::tempdir().unwrap();
    let src = host.path().join("src");
    std::fs::create_dir_all(src.join("nested/deeper")).unwrap();
    std::fs::write(src.join("top.txt"), "top").unwrap();
    std::fs::write(src.join("nested/deeper/data.bin"), vec![9u8; 50_000]).unwrap();
    if b.capabilities().symlinks {
        std::os::unix::fs::symlink("top.txt", src.join("alias")).unwrap();
    }
    let dest = host.path().join("dest");
    std::fs::create_dir(&dest).unwrap();
    std::fs::write(dest.join("old"), "old").unwrap();
    let (src2, dest2) = (src.clone(), dest.clone());
    with_sandbox(b, spec(), |id| async move {
        b.upload_dir(&id, &src2, &p("up")).await.expect("upload");
        assert_eq!(
            b.read_to_string(&id, &p("up/top.txt")).await.unwrap(),
            "top"
        );
        assert_kind(
            b.upload_dir(&id, &src2.join("top.txt"), &p("up")).await,
            ErrorKind::InvalidInput,
            "upload a file",
        );
        assert_kind(
            b.download_dir(&id, &p("missing"), &dest2).await,
            ErrorKind::NotFound,
            "download missing",
        );
        assert_eq!(
            std::fs::read_to_string(dest2.join("old")).unwrap(),
            "old",
            "failed download changed nothing"
        );
        b.download_dir(&id, &p("up"), &dest2)
            .await
            .expect("download");
    })
    .await;
    assert!(
        !dest.join("old").exists(),
        "download replaces the destination"
    );
    assert_eq!(
        std::fs::read(dest.join("nested/deeper/data.bin")).unwrap(),
        vec![9u8; 50_000]
    );
    if b.capabilities().symlinks {
        assert_eq!(
            std::fs::read_link(dest.join("alias")).unwrap(),
            std::path::Path::new("top.txt")
        );
    }
    let leftovers: Vec<_> = std::fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".sandcell-"))
        .collect();
    assert!(
        leftovers.is_empty(),
        "no staging left behind: {leftovers:?}"
    );
}

// ---------------------------------------------------------------- processes

/// Streams, exit codes, stdin, env, cwd, output caps, timeouts and kill, on backends
/// with a shell.
pub async fn exec_basics(b: &dyn SandboxBackend) {
    let spec = spec()
        .with_env("FROM_SPEC", "spec")
        .with_limits(crate::Limits::new().output_bytes(4096));
    with_sandbox(b, spec, |id| async move {
        let out = b
            .run_shell(&id, "echo out; echo err >&2; exit 3")
            .await
            .unwrap();
        assert_eq!(
            (
                out.stdout_str().as_ref(),
                out.stderr_str().as_ref(),
                out.exit_code()
            ),
            ("out\n", "err\n", Some(3))
        );

        let out = b
            .run(&id, ExecRequest::new(["cat"]).stdin("fed via stdin"))
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "fed via stdin");

        let out = b
            .run(
                &id,
                ExecRequest::shell("echo \"$FROM_SPEC $FROM_REQ\"").env("FROM_REQ", "req"),
            )
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "spec req\n");
        if std::env::var_os("CARGO_MANIFEST_DIR").is_some() {
            let out = b
                .run_shell(&id, "echo \"[$CARGO_MANIFEST_DIR]\"")
                .await
                .unwrap();
            assert_eq!(
                out.stdout_str(),
                "[]\n",
                "host environment does not leak in"
            );
        }

        b.mkdir(&id, &p("ex/sub")).await.unwrap();
        let out = b
            .run(&id, ExecRequest::shell("pwd").cwd(p("ex/sub")))
            .await
            .unwrap();
        assert!(
            out.stdout_str().trim_end().ends_with("/ex/sub"),
            "cwd: {}",
            out.stdout_str()
        );
        assert_kind(
            b.run(&id, ExecRequest::new(["true"]).cwd(p("ex/none")))
                .await,
            ErrorKind::NotFound,
            "missing cwd",
        );

        let out = b
            .run(
                &id,
                ExecRequest::shell("head -c 100000 /dev/zero; echo done >&2").output_limit(1000),
            )
            .await
            .unwrap();
        assert_eq!(
            (out.stdout.len(), out.stdout_truncated, out.stderr_truncated),
            (1000, true, false)
        );
        assert!(
            out.success(),
            "the pipe kept draining, so the command finished normally"
        );
        let out = b.run_shell(&id, "head -c 100000 /dev/zero").await.unwrap();
        assert_eq!(
            (out.stdout.len(), out.stdout_truncated),
            (4096, true),
            "the spec's output cap applies when the request sets none"
        );

        let out = b
            .run(
                &id,
                ExecRequest::new(["sleep", "30"]).timeout(Duration::from_millis(500)),
            )
            .await
            .unwrap();
        assert!(
            out.status.timed_out && !out.success(),
            "timed out: {:?}",
            out.status
        );

        if b.capabilities().interactive_exec {
            let mut proc = b
                .exec(&id, ExecRequest::new(["sleep", "30"]))
                .await
                .unwrap();
            proc.kill().await.unwrap();
            let status = proc.wait().await.unwrap();
            assert!(!status.success() && !status.timed_out, "killed: {status:?}");
        }

        let out = b
            .execute_code(&id, Language::Sh, "x=4; echo $((x * 10))")
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "40\n");
        if b.capabilities().python {
            let out = b
                .execute_code(
                    &id,
                    Language::Python,
                    "import sys\nprint(sum(range(10)), file=sys.stdout)",
                )
                .await
                .unwrap();
            assert_eq!(out.stdout_str(), "45\n");
        }
        assert_kind(
            b.run(&id, ExecRequest::new(Vec::<String>::new())).await,
            ErrorKind::InvalidInput,
            "empty argv",
        );
    })
    .await;
}

/// A program missing from the sandbox's `PATH` is `NotFound`, not a process.
pub async fn exec_missing_program_is_not_found(b: &dyn SandboxBackend) {
    with_sandbox(b, spec(), |id| async move {
        let err = b
            .exec(&id, ExecRequest::new(["sandcell-no-such-program"]))
            .await
            .map(|_| ());
        assert_kind(err, ErrorKind::NotFound, "missing program");
    })
    .await;
}

/// Polls `check` up to 200 times, 10 ms apart: bounds a wait for something the kernel
/// does asynchronously (reaping, freezing); it measures nothing.
async fn eventually<F, Fut>(mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    for _ in 0..200 {
        if check().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    false
}

/// A process left running in the background by one command is still there for the
/// next one, and `reset` ends it (backends with a shell and reset).
pub async fn background_processes_live_until_reset(b: &dyn SandboxBackend) {
    let marker = format!("sandcell-bg-{}", uuid::Uuid::new_v4().simple());
    with_sandbox(b, spec(), |id| {
        let marker = marker.clone();
        async move {
            // `$0` of the idle shell is the marker, one NUL-separated argument of its own,
            // so it matches a whole line below while the checking script's text never does.
            let count = format!(
                "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\000' '\\n' | grep -c '^{marker}$'"
            );
            let running = |want: &'static str| {
                let count = count.clone();
                let id = id.clone();
                move || {
                    let count = count.clone();
                    let id = id.clone();
                    async move {
                        b.run_shell(&id, &count)
                            .await
                            .is_ok_and(|out| out.stdout_str().trim() == want)
                    }
                }
            };
            let start = format!("sh -c 'sleep 1000; :' {marker} >/dev/null 2>&1 </dev/null &");
            assert!(b.run_shell(&id, &start).await.unwrap().success());
            assert!(
                eventually(running("1")).await,
                "the background process outlives its command"
            );
            b.reset(&id).await.expect("reset");
            assert!(eventually(running("0")).await, "reset ends it");
        }
    })
    .await;
}

/// A read-only host mount can be read but not written, and the host directory is left
/// as it was (backends with host mounts).
pub async fn read_only_mounts_refuse_writes(b: &dyn SandboxBackend) {
    let host = tempfile::tempdir().expect("host temp dir");
    std::fs::write(host.path().join("facts.md"), "fact").unwrap();
    let spec = spec().with_mount(crate::Mount::read_only(host.path(), p("files")));
    with_sandbox(b, spec, |id| async move {
        assert_eq!(
            &b.read(&id, &p("files/facts.md")).await.unwrap()[..],
            b"fact"
        );
        assert_kind(
            b.write(&id, &p("files/new.md"), Bytes::from_static(b"x"))
                .await,
            ErrorKind::PermissionDenied,
            "write into a read-only mount",
        );
        if b.capabilities().shell {
            let out = b.run_shell(&id, "echo x > files/new.md").await.unwrap();
            assert!(
                !out.success(),
                "a sandbox process cannot write there either"
            );
        }
    })
    .await;
    let names: Vec<_> = std::fs::read_dir(host.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["facts.md"], "the host directory is unchanged");
    assert_eq!(
        std::fs::read_to_string(host.path().join("facts.md")).unwrap(),
        "fact"
    );
}

/// Background processes by id ([`crate::background::Background`]): output so far and
/// then live, input, signals (where the backend has them), kill, wait, a late attach that
/// replays everything, and processes ending with their sandbox. Needs a shell.
pub async fn background_processes_by_id(b: &dyn SandboxBackend) {
    use crate::background::Background;
    use crate::ProcessEvent;
    if !b.capabilities().shell || !b.capabilities().interactive_exec {
        eprintln!(
            "conformance[{}]: background_processes_by_id skipped: no shell or exec is not interactive",
            b.name()
        );
        return;
    }
    /// Reads events until the stdout seen so far contains `want`.
    async fn until(
        events: &mut futures::stream::BoxStream<'static, ProcessEvent>,
        seen: &mut String,
        want: &str,
    ) {
        let found = tokio::time::timeout(Duration::from_secs(30), async {
            while !seen.contains(want) {
                match events.next().await {
                    Some(ProcessEvent::Stdout(b)) => seen.push_str(&String::from_utf8_lossy(&b)),
                    Some(_) => {}
                    None => break,
                }
            }
        })
        .await;
        assert!(
            found.is_ok() && seen.contains(want),
            "never saw {want:?} in {seen:?}"
        );
    }
    let table = Background::new();
    with_sandbox(b, spec(), |id| {
        let table = table.clone();
        async move {
            let echo = table
                .start(
                    b,
                    &id,
                    ExecRequest::shell(
                        "echo started; while read line; do echo \"got $line\"; [ \"$line\" = quit ] && exit 4; done",
                    ),
                )
                .await
                .unwrap();
            let mut events = table.attach(&echo).unwrap();
            let mut seen = String::new();
            until(&mut events, &mut seen, "started\n").await;
            table.send_input(&echo, Bytes::from_static(b"hello\n")).await.unwrap();
            until(&mut events, &mut seen, "got hello\n").await;
            let info = table.info(&echo).unwrap();
            assert_eq!((info.status, &info.sandbox), (None, &id));
            assert!(table.list(Some(&id)).iter().any(|p| p.id == echo));
            table.send_input(&echo, Bytes::from_static(b"quit\n")).await.unwrap();
            assert_eq!(table.wait(&echo).await.unwrap().code, Some(4));
            // A late attach replays what was kept, then the exit.
            let all: Vec<ProcessEvent> = table.attach(&echo).unwrap().collect().await;
            let text: String = all
                .iter()
                .filter_map(|e| match e {
                    ProcessEvent::Stdout(b) => Some(String::from_utf8_lossy(b).into_owned()),
                    _ => None,
                })
                .collect();
            assert_eq!(text, "started\ngot hello\ngot quit\n");
            assert!(matches!(all.last(), Some(ProcessEvent::Exit(s)) if s.code == Some(4)));
            table.forget(&echo).unwrap();
            assert_kind(table.info(&echo).map(|_| ()), ErrorKind::NotFound, "forgotten");

            let trapper = table
                .start(
                    b,
                    &id,
                    ExecRequest::shell(
                        "trap 'echo term; exit 7' TERM; echo ready; while :; do sleep 0.1; done",
                    ),
                )
                .await
                .unwrap();
            let mut events = table.attach(&trapper).unwrap();
            let mut seen = String::new();
            until(&mut events, &mut seen, "ready\n").await;
            match table.signal(&trapper, 15).await {
                Ok(()) => {
                    until(&mut events, &mut seen, "term\n").await;
                    assert_eq!(table.wait(&trapper).await.unwrap().code, Some(7));
                }
                Err(e) => {
                    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
                    table.kill(&trapper).unwrap();
                    assert!(!table.wait(&trapper).await.unwrap().success());
                }
            }
            let sleeper = table
                .start(b, &id, ExecRequest::new(["sleep", "30"]))
                .await
                .unwrap();
            table.kill(&sleeper).unwrap();
            assert!(!table.wait(&sleeper).await.unwrap().success());
        }
    })
    .await;
    // A process still running when its sandbox goes ends with it.
    let info = b.create(&spec()).await.unwrap();
    let orphan = table
        .start(b, &info.id, ExecRequest::new(["sleep", "300"]))
        .await
        .unwrap();
    b.destroy(&info.id).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(30), table.wait(&orphan)).await;
    assert!(ended.is_ok(), "a background process outlived its sandbox");
    table.forget_sandbox(&info.id);
    assert!(table.list(None).iter().all(|p| p.sandbox != info.id));
}

/// The session manager over this backend, the path an agent framework takes: a session
/// is acquired, used, suspended (snapshot, then the sandbox destroyed), and a second
/// manager on the same stores restores it into a new sandbox; reconcile destroys a
/// sandbox carrying the manager's label that no session knows and leaves an unlabelled
/// one alone; purge leaves nothing. Takes the backend shared, as a manager owns one.
pub async fn manager_sessions(backend: std::sync::Arc<dyn SandboxBackend>) {
    use crate::manager::LABEL_MANAGER;
    use crate::store::{InMemorySnapshotStore, InMemoryStateStore, SessionKey};
    use crate::{ReleaseMode, SandboxManager};

    let state = InMemoryStateStore::new();
    let snapshots = InMemorySnapshotStore::new();
    let manager_id = format!(
        "conformance-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let build = || {
        SandboxManager::builder(std::sync::Arc::clone(&backend))
            .state_store(state.clone())
            .snapshot_store(snapshots.clone())
            .manager_id(&manager_id)
            .build()
    };
    let key = SessionKey::new("conformance", "session").unwrap();
    let first = build().await.expect("a manager over the backend");
    let handle = first.acquire(&key, &spec()).await.expect("acquire");
    let first_id = handle.id().clone();
    let notes = p("notes/a.txt");
    handle
        .call("write", |b, id| {
            b.write(id, &notes, Bytes::from_static(b"kept"))
        })
        .await
        .unwrap();
    if backend.capabilities().shell {
        let out = handle
            .call("run_shell", |b, id| b.run_shell(id, "cat notes/a.txt"))
            .await
            .unwrap();
        assert_eq!(out.stdout_str(), "kept");
    }
    first
        .release(&key, ReleaseMode::Suspend)
        .await
        .expect("suspend");
    assert_kind(
        backend.inspect(&first_id).await.map(|_| ()),
        ErrorKind::NotFound,
        "a suspended session's sandbox is destroyed",
    );
    drop(handle);
    first.shutdown().await;

    // Another process, say: the same stores, a new manager.
    let second = build().await.expect("a second manager");
    let handle = second.acquire(&key, &spec()).await.expect("acquire again");
    assert_ne!(handle.id(), &first_id, "restored into a new sandbox");
    let read = handle.call("read", |b, id| b.read(id, &notes)).await;
    assert_eq!(&read.unwrap()[..], b"kept");

    let orphan = backend
        .create(&spec().with_label(LABEL_MANAGER, &manager_id))
        .await
        .unwrap();
    let bystander = backend.create(&spec()).await.unwrap();
    let report = second.reconcile().await.expect("reconcile");
    assert_eq!(report.destroyed, vec![orphan.id.clone()], "only the orphan");
    assert_kind(
        backend.inspect(&orphan.id).await.map(|_| ()),
        ErrorKind::NotFound,
        "the orphan is gone",
    );
    backend
        .inspect(&bystander.id)
        .await
        .expect("an unlabelled sandbox is left alone");
    backend.destroy(&bystander.id).await.unwrap();

    let live = handle.id().clone();
    second
        .release(&key, ReleaseMode::Purge)
        .await
        .expect("purge");
    assert_kind(
        backend.inspect(&live).await.map(|_| ()),
        ErrorKind::NotFound,
        "purge destroys the sandbox",
    );
    assert!(second.snapshots(&key).await.unwrap().is_empty());
    assert!(second.session(&key).await.unwrap().is_none());
    second.shutdown().await;
}

/// Runs every case that applies to `b`, in order, printing each name.
pub async fn run_all(b: &dyn SandboxBackend) {
    let caps = b.capabilities();
    macro_rules! case {
        ($name:ident) => {{
            eprintln!("conformance[{}]: {}", b.name(), stringify!($name));
            $name(b).await;
        }};
    }
    case!(lifecycle);
    case!(create_rejects_bad_specs);
    case!(create_refuses_what_it_cannot_honour);
    case!(claimed_capabilities_work);
    case!(unknown_sandbox_is_not_found);
    case!(pause_resume);
    case!(reset_keeps_workspace);
    case!(published_ports);
    case!(files_round_trip);
    case!(remove_mkdir_rename);
    case!(hostile_paths_are_rejected);
    case!(prefix_confusion);
    case!(archive_round_trip);
    case!(hostile_archives_are_rejected);
    case!(snapshot_round_trip);
    case!(hostile_snapshots_are_rejected);
    if caps.incremental_snapshot {
        case!(incremental_snapshot_round_trip);
    } else {
        eprintln!(
            "conformance[{}]: incremental_snapshot_round_trip skipped: no incremental snapshots",
            b.name()
        );
    }
    case!(ext_editing_and_search);
    case!(ext_upload_download);
    case!(exec_missing_program_is_not_found);
    if caps.interactive_exec {
        case!(background_processes_by_id);
    } else {
        eprintln!(
            "conformance[{}]: background_processes_by_id skipped: exec is not interactive",
            b.name()
        );
    }
    if caps.symlinks {
        case!(symlink_escapes_are_refused);
    } else {
        eprintln!(
            "conformance[{}]: symlink_escapes_are_refused skipped: no symlink support",
            b.name()
        );
    }
    if caps.host_mounts {
        case!(read_only_mounts_refuse_writes);
    } else {
        eprintln!(
            "conformance[{}]: read_only_mounts_refuse_writes skipped: no host mounts",
            b.name()
        );
    }
    if caps.shell && caps.reset {
        case!(background_processes_live_until_reset);
    }
    if caps.shell {
        case!(exec_basics);
    } else {
        eprintln!(
            "conformance[{}]: exec_basics skipped: the backend has no shell",
            b.name()
        );
    }
}
