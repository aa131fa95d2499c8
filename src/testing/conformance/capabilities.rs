//! Conformance cases that hold `Capabilities` to the truth: what is claimed works, and
//! a spec field that is not claimed is refused, never silently weakened.

use std::time::Duration;

use bytes::Bytes;

use super::{assert_kind, p, spec};
use crate::archive::ImportOptions;
use crate::testing::RawTar;
use crate::{
    ErrorKind, ExecRequest, FileKind, LabelSelector, Language, Limits, Mount, Network,
    SandboxBackend, SandboxBackendExt, SandboxSpec, SandboxStatus,
};

/// A spec tagged with a fresh run label, and the selector that finds what it created.
fn tagged() -> (SandboxSpec, LabelSelector) {
    let run = uuid::Uuid::new_v4().to_string();
    (
        spec().label("conformance.run", &run),
        LabelSelector::new().label("conformance.run", &run),
    )
}

/// A documentation range this host is not directly on (a test machine's own network
/// may be one, and an allowlist may not name that).
fn public_range() -> &'static str {
    ["203.0.113.0/24", "192.0.2.0/24", "198.51.100.0/24"]
        .into_iter()
        .find(|range| {
            crate::egress::Allowlist::parse([*range])
                .is_ok_and(|list| list.host_network_rule().is_none())
        })
        .unwrap_or("203.0.113.0/24")
}

/// The spec fields a capability gates, each with a spec that needs it.
fn gated_specs(base: &SandboxSpec, host_dir: &std::path::Path) -> Vec<(&'static str, SandboxSpec)> {
    Vec::from([
        ("network (none)", base.clone().network(Network::None)),
        ("network (full)", base.clone().network(Network::Full)),
        (
            "network (allowlist)",
            // Names and ranges without ports: every allowlist syntax E2B's rules share.
            base.clone().network(Network::Allowlist(vec![
                "example.com".to_owned(),
                "*.example.org".to_owned(),
                public_range().to_owned(),
            ])),
        ),
        // Read-only: a root backend may refuse to let a sandbox write in a directory
        // root owns (the local backend at Namespaces does), which a test's is.
        (
            "mounts",
            base.clone().mount(Mount::read_only(host_dir, p("mounted"))),
        ),
        (
            "limits.cpu_millis",
            base.clone().limits(Limits::new().cpu_millis(500)),
        ),
        (
            "limits.memory_bytes",
            base.clone().limits(Limits::new().memory_bytes(256 << 20)),
        ),
        ("limits.pids", base.clone().limits(Limits::new().pids(64))),
        (
            "limits.disk_bytes",
            base.clone().limits(Limits::new().disk_bytes(1 << 30)),
        ),
        ("user", base.clone().user("4321:4321")),
    ])
}

/// Whether `caps` claims what the gated spec named `field` needs.
fn claims(caps: &crate::Capabilities, field: &str) -> bool {
    match field {
        "network (none)" => caps.network_isolation,
        "network (full)" => caps.network_full,
        "network (allowlist)" => caps.network_allowlist,
        "mounts" => caps.host_mounts,
        "limits.cpu_millis" => caps.cpu_limit,
        "limits.memory_bytes" => caps.memory_limit,
        "limits.pids" => caps.pids_limit,
        "limits.disk_bytes" => caps.disk_limit,
        "user" => caps.choose_user,
        other => panic!("no capability gates {other}"),
    }
}

/// The default spec works on every backend and reports the network it got; every spec
/// field the capabilities do not claim is `Unsupported`, names the field, and creates
/// nothing.
pub async fn create_refuses_what_it_cannot_honour(b: &dyn SandboxBackend) {
    let caps = b.capabilities();
    let (base, selector) = tagged();
    let info = b
        .create(&base)
        .await
        .expect("the default spec works everywhere");
    let seen = b.inspect(&info.id).await;
    b.destroy(&info.id).await.expect("destroy");
    assert_eq!(
        info.network,
        caps.default_network(),
        "Network::Default is the backend's strictest policy, reported at create"
    );
    assert_eq!(
        seen.expect("inspect").network,
        info.network,
        "inspect reports the network create did"
    );

    let host = tempfile::tempdir().expect("a host directory");
    let mut refused = 0;
    for (field, gated) in gated_specs(&base, host.path()) {
        if claims(&caps, field) {
            continue;
        }
        refused += 1;
        match b.create(&gated).await {
            Ok(info) => {
                let _ = b.destroy(&info.id).await;
                panic!("{field}: a backend without its capability created a sandbox");
            }
            Err(e) => {
                assert_eq!(e.kind(), ErrorKind::Unsupported, "{field}: {e}");
                assert!(
                    e.to_string().contains(field),
                    "{field}: the error names it: {e}"
                );
            }
        }
    }
    assert!(
        b.list(&selector).await.expect("list").is_empty(),
        "a refused spec created nothing"
    );
    eprintln!(
        "conformance[{}]: create_refuses_what_it_cannot_honour: {refused} spec fields refused",
        b.name()
    );
}

/// Every capability the backend claims has a working method or an accepted spec
/// field: no method answers `Unsupported` by default while its capability says yes.
pub async fn claimed_capabilities_work(b: &dyn SandboxBackend) {
    let caps = b.capabilities();
    let (base, selector) = tagged();

    // Spec fields: a claimed one is accepted, and the sandbox reports its network.
    let host = tempfile::tempdir().expect("a host directory");
    std::fs::write(host.path().join("hello.txt"), "from the host").expect("host file");
    for (field, gated) in gated_specs(&base, host.path()) {
        if !claims(&caps, field) {
            continue;
        }
        let info = b
            .create(&gated)
            .await
            .unwrap_or_else(|e| panic!("{field} is claimed but refused: {e}"));
        let check = async {
            if field.starts_with("network") {
                assert_eq!(info.network, gated.network, "{field}: reported network");
            }
            if field == "mounts" {
                let seen = b
                    .read(&info.id, &p("mounted/hello.txt"))
                    .await
                    .expect("read through a claimed host mount");
                assert_eq!(seen, Bytes::from_static(b"from the host"));
            }
            if field == "user" && caps.shell {
                let out = b.run_shell(&info.id, "id -u").await.expect("id -u");
                assert_eq!(
                    out.stdout_str().trim(),
                    "4321",
                    "commands run as the spec's user"
                );
            }
            if caps.shell {
                let out = b
                    .run_shell(&info.id, "true")
                    .await
                    .expect("run under the spec");
                assert!(out.success(), "{field}: a command runs");
            }
        };
        let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(check)).await;
        b.destroy(&info.id).await.expect("destroy");
        if let Err(panic) = result {
            std::panic::resume_unwind(panic);
        }
    }

    // Calls: each claimed one answers. Ports need a sandbox with a network.
    let calls = if caps.network_full {
        base.clone().network(Network::Full)
    } else {
        base.clone()
    };
    super::with_sandbox(b, calls, |id| async move {
        let file = p("claimed.txt");
        b.write(&id, &file, Bytes::from_static(b"x"))
            .await
            .expect("write");
        if caps.pause {
            b.pause(&id).await.expect("pause is claimed");
            assert_eq!(
                b.inspect(&id).await.expect("inspect").status,
                SandboxStatus::Paused
            );
            if caps.files_while_paused {
                b.read(&id, &file)
                    .await
                    .expect("files_while_paused is claimed");
            } else {
                assert_kind(
                    b.read(&id, &file).await,
                    ErrorKind::InvalidState,
                    "read while paused",
                );
            }
            b.resume(&id).await.expect("resume is claimed");
        } else {
            assert_kind(
                b.pause(&id).await,
                ErrorKind::Unsupported,
                "pause without the capability",
            );
        }
        if caps.reset {
            b.reset(&id).await.expect("reset is claimed");
            assert_eq!(b.read(&id, &file).await.expect("read after reset"), "x");
        } else {
            assert_kind(
                b.reset(&id).await,
                ErrorKind::Unsupported,
                "reset without the capability",
            );
        }
        if caps.port_exposure {
            b.publish_port(&id, 18_765)
                .await
                .expect("port_exposure is claimed");
            b.unpublish_port(&id, 18_765).await.expect("unpublish");
        } else {
            assert_kind(
                b.publish_port(&id, 18_765).await,
                ErrorKind::Unsupported,
                "publish_port without the capability",
            );
        }
        if caps.incremental_snapshot {
            b.export_changes(&id)
                .await
                .expect("incremental_snapshot is claimed");
        } else {
            assert_kind(
                b.export_changes(&id).await.map(|_| ()),
                ErrorKind::Unsupported,
                "export_changes without the capability",
            );
        }
        if caps.symlinks {
            let tar = RawTar::new()
                .file("target.txt", b"t")
                .symlink("link", "target.txt")
                .finish();
            b.import_tar(
                &id,
                &p("links"),
                super::stream(tar),
                ImportOptions::default(),
            )
            .await
            .expect("symlinks is claimed: an archive may carry one");
            let info = b.stat(&id, &p("links/link")).await.expect("stat");
            assert_eq!(info.kind, FileKind::Symlink);
        }
        if caps.shell {
            let out = b
                .execute_code(&id, Language::Sh, "echo $((6 * 7))")
                .await
                .expect("shell is claimed");
            assert_eq!(out.stdout_str().trim(), "42");
        }
        if caps.python {
            let out = b
                .execute_code(&id, Language::Python, "print(6 * 7)")
                .await
                .expect("python is claimed");
            assert_eq!(out.stdout_str().trim(), "42");
        } else {
            assert_kind(
                b.execute_code(&id, Language::Python, "print(1)").await,
                ErrorKind::Unsupported,
                "python without the capability",
            );
        }
        if caps.interactive_exec && caps.shell {
            let mut process = b
                .exec(&id, ExecRequest::new(["sleep", "30"]))
                .await
                .expect("exec");
            let status = tokio::time::timeout(Duration::from_secs(20), async {
                process
                    .kill()
                    .await
                    .expect("interactive_exec is claimed: kill answers");
                process.wait().await.expect("wait")
            })
            .await
            .expect("a killed command ends well before its own end");
            assert!(!status.success(), "a killed command does not succeed");
        }
    })
    .await;
    assert!(
        b.list(&selector).await.expect("list").is_empty(),
        "nothing left"
    );
}
