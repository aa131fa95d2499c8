//! Clones of overlay sandboxes on the local backend: an idle source's changes are
//! frozen into a layer both share (nothing copied, neither sees the other's writes,
//! the layer goes with the last sandbox using it); a busy source is copied and left
//! as it was; stacks of frozen layers snapshot incrementally like any overlay.

// Test helpers outside #[test] fns report failures by panicking too.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use sandcell::snapshot::{self, PackOptions};
use sandcell::testing::conformance::fingerprint;
use sandcell::{
    ErrorKind, ExecRequest, SandboxBackend, SandboxBackendExt, SandboxId, SandboxPath, SandboxSpec,
    WatchEventKind, WatchOptions,
};
use sandcell_local::{LocalBackend, WorkspaceStrategy};

mod common;

struct Setup {
    root: tempfile::TempDir,
    _template: tempfile::TempDir,
    backend: LocalBackend,
}

fn setup() -> Option<Setup> {
    if !common::overlay_available() {
        return None;
    }
    let template = tempfile::tempdir().unwrap();
    let t = template.path();
    std::fs::create_dir_all(t.join("src")).unwrap();
    std::fs::create_dir_all(t.join("docs")).unwrap();
    std::fs::write(t.join("src/lib.rs"), "// template\n").unwrap();
    std::fs::write(t.join("docs/old.md"), "old\n").unwrap();
    std::fs::write(t.join("keep.txt"), "kept\n").unwrap();
    std::fs::write(t.join("doomed.txt"), "doomed\n").unwrap();
    let root = tempfile::tempdir().unwrap();
    let backend = LocalBackend::builder()
        .root(root.path())
        .template("t", t)
        .workspace(WorkspaceStrategy::Overlay)
        .build()
        .unwrap();
    Some(Setup {
        root,
        _template: template,
        backend,
    })
}

fn p(path: &str) -> SandboxPath {
    path.parse().unwrap()
}

impl Setup {
    fn dir(&self, id: &SandboxId) -> PathBuf {
        self.root.path().join("sandboxes").join(id.as_str())
    }

    /// The frozen layers a sandbox's directory names, top first.
    fn layers_of(&self, id: &SandboxId) -> Vec<String> {
        std::fs::read_to_string(self.dir(id).join("layers"))
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// Every frozen layer under the root.
    fn layers_on_disk(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(self.root.path().join("layers"))
            .map(|entries| {
                entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|name| name != ".lock")
                    .collect()
            })
            .unwrap_or_default();
        names.sort();
        names
    }

    async fn clone_of(&self, id: &SandboxId) -> SandboxId {
        self.backend
            .clone_sandbox(id, Default::default())
            .await
            .unwrap()
            .id
    }

    async fn read(&self, id: &SandboxId, path: &str) -> sandcell::Result<String> {
        self.backend.read_to_string(id, &p(path)).await
    }

    async fn write(&self, id: &SandboxId, path: &str, text: &str) {
        self.backend.write_string(id, &p(path), text).await.unwrap();
    }

    /// The source's standard changes: an edit, a new file, a deletion (a whiteout)
    /// and a directory replaced whole (an opaque one).
    async fn change(&self, id: &SandboxId) {
        self.write(id, "src/lib.rs", "// changed\n").await;
        self.write(id, "new.txt", "new\n").await;
        self.backend
            .remove(id, &p("doomed.txt"), false)
            .await
            .unwrap();
        let out = self
            .backend
            .run_shell(id, "rm -r docs && mkdir docs && echo fresh > docs/new.md")
            .await
            .unwrap();
        assert!(out.success(), "{out:?}");
    }

    async fn assert_changed(&self, id: &SandboxId) {
        assert_eq!(self.read(id, "src/lib.rs").await.unwrap(), "// changed\n");
        assert_eq!(self.read(id, "new.txt").await.unwrap(), "new\n");
        assert_eq!(self.read(id, "keep.txt").await.unwrap(), "kept\n");
        assert_eq!(self.read(id, "docs/new.md").await.unwrap(), "fresh\n");
        for gone in ["doomed.txt", "docs/old.md"] {
            assert_eq!(
                self.read(id, gone).await.unwrap_err().kind(),
                ErrorKind::NotFound,
                "{gone} stays deleted"
            );
        }
    }
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_clone_shares_a_frozen_layer_and_copies_nothing() {
    let Some(s) = setup() else { return };
    let b = &s.backend;
    let source = b.create(&SandboxSpec::new("t")).await.unwrap().id;
    s.change(&source).await;

    let clone = s.clone_of(&source).await;
    // One frozen layer, named by both; both upper layers start empty.
    let layers = s.layers_of(&source);
    assert_eq!(layers.len(), 1, "the source's upper layer was frozen");
    assert_eq!(s.layers_of(&clone), layers);
    assert_eq!(s.layers_on_disk(), layers);
    let layer = s.root.path().join("layers").join(&layers[0]);
    assert_eq!(
        std::fs::read_to_string(layer.join("new.txt")).unwrap(),
        "new\n"
    );
    assert_eq!(entries(&s.dir(&source).join("upper")), 0);
    assert_eq!(entries(&s.dir(&clone).join("upper")), 0);
    s.assert_changed(&source).await;
    s.assert_changed(&clone).await;
    // Cloned again with nothing changed since: the stack is shared as it is.
    let again = s.clone_of(&source).await;
    assert_eq!(s.layers_of(&source), layers, "no empty layer was frozen");
    assert_eq!(s.layers_of(&again), layers);
    s.assert_changed(&again).await;
    b.destroy(&again).await.unwrap();
    assert_eq!(s.layers_on_disk(), layers);

    // Independent both ways, through the file API and through commands (the source
    // was remounted: its commands get rules for the new mount).
    s.write(&source, "src/lib.rs", "// source again\n").await;
    s.write(&clone, "clone-only.txt", "clone\n").await;
    b.remove(&clone, &p("new.txt"), false).await.unwrap();
    for (id, file) in [(&source, "by-source.txt"), (&clone, "by-clone.txt")] {
        let out = b
            .run_shell(id, &format!("echo ran > {file} && cat keep.txt"))
            .await
            .unwrap();
        assert!(out.success(), "{out:?}");
        assert_eq!(out.stdout_str(), "kept\n");
    }
    assert_eq!(s.read(&clone, "src/lib.rs").await.unwrap(), "// changed\n");
    assert_eq!(s.read(&source, "new.txt").await.unwrap(), "new\n");
    for (id, absent) in [
        (&source, "clone-only.txt"),
        (&source, "by-clone.txt"),
        (&clone, "by-source.txt"),
        (&clone, "new.txt"),
    ] {
        assert_eq!(
            s.read(id, absent).await.unwrap_err().kind(),
            ErrorKind::NotFound,
            "{absent} in {id}"
        );
    }
    // The frozen layer is never written again.
    assert_eq!(
        std::fs::read_to_string(layer.join("src/lib.rs")).unwrap(),
        "// changed\n"
    );
    assert!(!layer.join("clone-only.txt").exists());
    assert!(layer.join("new.txt").exists());

    // The layer outlives the source while the clone uses it, and goes with the clone.
    b.destroy(&source).await.unwrap();
    assert_eq!(s.layers_on_disk(), layers);
    assert_eq!(s.read(&clone, "docs/new.md").await.unwrap(), "fresh\n");
    b.destroy(&clone).await.unwrap();
    assert_eq!(s.layers_on_disk(), Vec::<String>::new());
    assert_eq!(entries(&s.root.path().join("sandboxes")), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_source_is_copied_and_keeps_its_mount() {
    let Some(s) = setup() else { return };
    let b = &s.backend;
    let source = b.create(&SandboxSpec::new("t")).await.unwrap().id;
    s.change(&source).await;

    // A running command has its working directory in the workspace.
    let mut sleeper = b
        .exec(&source, ExecRequest::new(["sleep", "30"]))
        .await
        .unwrap();
    let clone = s.clone_of(&source).await;
    assert!(s.layers_of(&source).is_empty(), "nothing was frozen");
    assert!(s.layers_of(&clone).is_empty());
    assert_eq!(
        std::fs::read_to_string(s.dir(&clone).join("upper/new.txt")).unwrap(),
        "new\n",
        "the upper layer was copied"
    );
    s.assert_changed(&clone).await;
    s.write(&source, "after.txt", "after\n").await;
    assert_eq!(
        s.read(&clone, "after.txt").await.unwrap_err().kind(),
        ErrorKind::NotFound
    );
    sleeper.kill().await.unwrap();
    let _ = sleeper.wait().await;
    b.destroy(&clone).await.unwrap();

    // A live watch holds the workspace too, and keeps reporting after the clone.
    let mut events = b
        .watch(&source, &SandboxPath::root(), WatchOptions::new())
        .await
        .unwrap();
    let clone = s.clone_of(&source).await;
    assert!(s.layers_of(&source).is_empty(), "nothing was frozen");
    s.write(&source, "watched.txt", "w\n").await;
    let seen = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = events.next().await {
            let event = event.unwrap();
            if event.path.as_str() == "watched.txt" && event.kind == WatchEventKind::Created {
                return true;
            }
        }
        false
    })
    .await
    .unwrap_or(false);
    assert!(seen, "the watch saw the write made after the clone");
    b.destroy(&clone).await.unwrap();

    // Once the watch is gone, the next clone freezes.
    drop(events);
    let mut frozen = false;
    for _ in 0..50 {
        let clone = s.clone_of(&source).await;
        b.destroy(&clone).await.unwrap();
        if s.layers_of(&source).len() == 1 {
            frozen = true;
            break;
        }
        // The watch's task lets go of its directory when it next runs.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(frozen, "a clone froze the source once nothing held it");
    s.assert_changed(&source).await;
    b.destroy(&source).await.unwrap();
    assert_eq!(s.layers_on_disk(), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stacked_layers_export_their_changes_and_the_stack_is_bounded() {
    let Some(s) = setup() else { return };
    let b = &s.backend;
    let first = b.create(&SandboxSpec::new("t")).await.unwrap().id;
    s.change(&first).await;
    let second = s.clone_of(&first).await;
    // Over the first frozen layer: an edit, a file of that layer deleted, a template
    // file deleted, one brought back, a new directory.
    s.write(&second, "new.txt", "newer\n").await;
    b.remove(&second, &p("src/lib.rs"), false).await.unwrap();
    b.remove(&second, &p("keep.txt"), false).await.unwrap();
    s.write(&second, "doomed.txt", "back\n").await;
    s.write(&second, "added/deep/f.txt", "deep\n").await;
    // A clone copies instead of freezing while the kernel still counts the source's
    // workspace busy, which a loaded host (CI) can stretch past the writes above.
    let mut third = s.clone_of(&second).await;
    for _ in 0..50 {
        if s.layers_of(&third).len() == 2 {
            break;
        }
        b.destroy(&third).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        third = s.clone_of(&second).await;
    }
    assert_eq!(s.layers_of(&third).len(), 2, "two frozen layers");
    assert_eq!(s.layers_of(&second), s.layers_of(&third));
    s.write(&third, "top.txt", "top\n").await;
    b.remove(&third, &p("added"), true).await.unwrap();

    // Its change set restores onto a fresh sandbox of the template as it is.
    let (manifest, blob) =
        snapshot::capture_changes(b, &third, Vec::new(), &PackOptions::default())
            .await
            .unwrap();
    let fresh = b.create(&SandboxSpec::new("t")).await.unwrap().id;
    snapshot::restore(
        b,
        &fresh,
        &SandboxPath::root(),
        std::io::Cursor::new(blob),
        &manifest,
        sandcell::archive::ImportOptions::replace(),
    )
    .await
    .unwrap();
    let expected = fingerprint(b, &third).await;
    assert_eq!(fingerprint(b, &fresh).await, expected);
    assert_eq!(s.read(&fresh, "doomed.txt").await.unwrap(), "back\n");
    assert_eq!(s.read(&fresh, "new.txt").await.unwrap(), "newer\n");
    for gone in ["src/lib.rs", "keep.txt", "added", "docs/old.md"] {
        assert_eq!(
            s.read(&fresh, gone).await.unwrap_err().kind(),
            ErrorKind::NotFound,
            "{gone}"
        );
    }
    // The first sandbox never saw any of it.
    s.assert_changed(&first).await;

    // Cloning one sandbox again and again stops stacking at the bound, then copies.
    let mut clones = Vec::new();
    let mut depth = s.layers_of(&third).len();
    for round in 0..40 {
        s.write(&third, "round.txt", &round.to_string()).await;
        clones.push(s.clone_of(&third).await);
        let now = s.layers_of(&third).len();
        assert!(now == depth || now == depth + 1);
        depth = now;
    }
    assert_eq!(depth, 32, "the stack stops at 32 frozen layers");
    let last = clones.last().unwrap();
    assert_eq!(s.read(last, "round.txt").await.unwrap(), "39");
    assert_eq!(s.read(last, "top.txt").await.unwrap(), "top\n");

    for id in clones.iter().chain([&first, &second, &third, &fresh]) {
        b.destroy(id).await.unwrap();
    }
    assert_eq!(s.layers_on_disk(), Vec::<String>::new());
    assert_eq!(entries(&s.root.path().join("sandboxes")), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clone_whose_source_cannot_remount_fails_and_leaves_the_source_as_it_was() {
    let Some(s) = setup() else { return };
    let b = &s.backend;
    let source = b.create(&SandboxSpec::new("t")).await.unwrap().id;
    s.change(&source).await;
    // Without its work directory the source's remount fails after the frozen layer
    // is made and while the clone mounts it: the clone is unmounted and removed, and
    // only then are the source's changes moved back out of the layer.
    std::fs::remove_dir_all(s.dir(&source).join("work")).unwrap();
    b.clone_sandbox(&source, Default::default())
        .await
        .expect_err("the source could not be remounted");

    s.assert_changed(&source).await;
    assert_eq!(
        std::fs::read_to_string(s.dir(&source).join("upper/new.txt")).unwrap(),
        "new\n",
        "the changes are back in the source's own upper layer"
    );
    assert_eq!(s.layers_of(&source), Vec::<String>::new());
    assert_eq!(s.layers_on_disk(), Vec::<String>::new());
    let mut left: Vec<String> = std::fs::read_dir(s.dir(&source))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.starts_with("upper.") || name.starts_with("work."))
        .collect();
    left.sort();
    assert_eq!(left, Vec::<String>::new(), "nothing retired is left");
    assert_eq!(
        b.list(&Default::default()).await.unwrap().len(),
        1,
        "no clone"
    );
    assert_eq!(entries(&s.root.path().join("sandboxes")), 1);
    let out = b
        .run_shell(&source, "echo ran > after.txt && cat new.txt")
        .await
        .unwrap();
    assert!(out.success(), "{out:?}");
    assert_eq!(out.stdout_str(), "new\n");
    // A later clone freezes as usual.
    let clone = s.clone_of(&source).await;
    s.assert_changed(&clone).await;
    assert_eq!(s.layers_of(&clone).len(), 1);
    b.destroy(&clone).await.unwrap();
    b.destroy(&source).await.unwrap();
    assert_eq!(s.layers_on_disk(), Vec::<String>::new());
    assert_eq!(entries(&s.root.path().join("sandboxes")), 0);
}
