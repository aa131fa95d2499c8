//! Neighbours on one backend (ADVERSARIAL 46): programs with state stores of their own
//! share a Docker engine or a local root, and no reconcile of one touches another's.

use super::{assert_kind, spec};
use crate::manager::{LABEL_MANAGER, LABEL_SESSION, LABEL_STORE, LABEL_TENANT};
use crate::store::{InMemorySnapshotStore, InMemoryStateStore, SessionKey};
use crate::{ErrorKind, LabelSelector, ReleaseMode, SandboxBackend, SandboxManager};

type Shared = std::sync::Arc<dyn SandboxBackend>;

async fn program(backend: &Shared, manager_id: Option<&str>) -> SandboxManager<Shared> {
    let mut builder = SandboxManager::builder(std::sync::Arc::clone(backend))
        .state_store(InMemoryStateStore::new())
        .snapshot_store(InMemorySnapshotStore::new());
    if let Some(id) = manager_id {
        builder = builder.manager_id(id);
    }
    // `build` reconciles, as a program starting up does.
    builder.build().await.expect("a manager over the backend")
}

/// Two programs, each with a store of its own, on one backend: their default manager
/// ids differ; one's sandboxes survive the other starting up (which reconciles) and
/// the other's `reconcile`, even under the same session key; a sandbox one program's
/// store forgot (a crash) is destroyed by that program's reconcile only. Programs that
/// set the same manager id explicitly but keep their own stores leave each other alone
/// too. Takes the backend shared, as a manager owns one.
pub async fn manager_neighbours(backend: Shared) {
    let key = SessionKey::new("neighbours", "shared").unwrap();
    let first = program(&backend, None).await;
    let mine = first
        .acquire(&key, &spec())
        .await
        .expect("acquire")
        .id()
        .clone();

    // The second program starts (and reconciles) while the first has a sandbox.
    let second = program(&backend, None).await;
    assert_ne!(
        first.manager_id(),
        second.manager_id(),
        "default ids differ"
    );
    assert_ne!(first.store_id(), second.store_id());
    backend
        .inspect(&mine)
        .await
        .expect("a neighbour starting up leaves the sandbox alone");
    let theirs = second
        .acquire(&key, &spec())
        .await
        .expect("acquire")
        .id()
        .clone();
    assert_ne!(mine, theirs);

    // The first program crashed between creating a sandbox and recording it.
    let orphan = backend
        .create(
            &spec()
                .label(LABEL_MANAGER, first.manager_id())
                .label(LABEL_STORE, first.store_id())
                .label(LABEL_TENANT, "neighbours")
                .label(LABEL_SESSION, "crashed"),
        )
        .await
        .unwrap();
    let report = second.reconcile().await.expect("reconcile");
    assert!(report.destroyed.is_empty(), "{report:?}");
    for id in [&mine, &theirs, &orphan.id] {
        backend
            .inspect(id)
            .await
            .expect("a neighbour's reconcile destroys nothing of the first program");
    }
    let report = first.reconcile().await.expect("reconcile");
    assert_eq!(
        report.destroyed,
        vec![orphan.id.clone()],
        "only its own orphan"
    );
    for id in [&mine, &theirs] {
        backend.inspect(id).await.expect("live sessions stay");
    }

    // The same manager id set on purpose, each with its own store.
    let explicit = format!(
        "neighbours-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let third = program(&backend, Some(&explicit)).await;
    let its = third
        .acquire(&key, &spec())
        .await
        .expect("acquire")
        .id()
        .clone();
    let fourth = program(&backend, Some(&explicit)).await;
    let report = fourth.reconcile().await.expect("reconcile");
    assert!(report.destroyed.is_empty(), "{report:?}");
    backend
        .inspect(&its)
        .await
        .expect("one manager id on two stores: still neighbours");

    for manager in [&first, &second, &third] {
        manager.release(&key, ReleaseMode::Purge).await.unwrap();
    }
    for (manager, id) in [(&first, &mine), (&second, &theirs), (&third, &its)] {
        assert_kind(
            backend.inspect(id).await.map(|_| ()),
            ErrorKind::NotFound,
            "purged",
        );
        manager.shutdown().await;
    }
    fourth.shutdown().await;
    for manager in [&first, &second, &third] {
        let selector = LabelSelector::new().label(LABEL_STORE, manager.store_id());
        let left = backend.list(&selector).await.unwrap();
        assert!(left.is_empty(), "left behind: {left:?}");
    }
}
