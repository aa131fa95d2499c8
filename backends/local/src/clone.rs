//! Clones of overlay sandboxes: the source's freeze on one thread, the clone's
//! workspace on another, and where the two wait for each other.
//!
//! ```text
//! freezing thread                          provisioning thread
//! lock layers, read the source's stack     make the clone's cgroups and directory
//! freeze: unmount, move the upper layer    wait for the plan
//!   into a new layer                ---->  mount the clone over the stack
//! remount the source over the layer        record the clone's layers
//! report the remount                ---->  wait for the remount; done
//! tear the old overlay down
//! ```
//!
//! Both mounts run at once. Where the source's remount fails, the clone is unmounted
//! first, and only then does the freezing thread put the source back as it was (its
//! entries out of the layer the clone had mounted).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, RwLock};

use sandcell::{Error, ErrorKind, Result, SandboxId, SandboxStatus};

use crate::cgroup::SandboxCgroups;
use crate::layers::{Frozen, LayersLock};
use crate::layout::SandboxDir;

/// What the clone's workspace is made of, as the freezing thread decided.
pub(crate) struct Plan {
    /// Held until the clone names its layers, so no destroy releases one meanwhile
    /// (and no longer: every sandbox's destroy and clone wait on it).
    lock: Arc<LayersLock>,
    /// The frozen layers the clone mounts, top first.
    stack: Vec<String>,
    /// Whether the source's upper layer is copied (it was busy) rather than shared.
    copy_upper: bool,
    /// Where the source was frozen: the outcome of its remount.
    source_remount: Option<Receiver<SourceRemount>>,
}

/// The source's remount: done, or failed (then the clone is unmounted before the
/// sender drops, and the source is put back after).
type SourceRemount = std::result::Result<(), (Error, SyncSender<()>)>;

/// The source of a clone and what its freeze needs.
pub(crate) struct Source {
    pub(crate) id: SandboxId,
    pub(crate) dir: SandboxDir,
    pub(crate) template: PathBuf,
    /// The source's cgroups where it is running, frozen while it is read.
    pub(crate) cgroups: Option<SandboxCgroups>,
    /// False where its workspace must not be remounted (its namespaces hold it).
    pub(crate) may_freeze: bool,
    /// Who owns its files (see [`crate::owner`]), the clone's too.
    pub(crate) owner: Option<std::sync::Arc<crate::owner::SandboxOwner>>,
}

/// The freezing thread: decides the [`Plan`] and sends it, then remounts the source.
/// `gate` is held (exclusive) from the freeze to the remount, so this process opens
/// no workspace meanwhile; `on_remount` is called as the source's workspace moves to
/// a new mount.
///
/// `populated` says whether the source's cgroups held processes as the clone began,
/// read by the caller before the clone's own cgroups are made (which would hold the
/// read up). A process started since holds the workspace, so the freeze finds it
/// busy, and the copy that follows freezes the cgroups itself.
pub(crate) fn freeze_source(
    root: &Path,
    gate: &RwLock<()>,
    source: &Source,
    populated: &Receiver<bool>,
    on_remount: impl FnOnce(),
    plan: SyncSender<Result<Plan>>,
) {
    let mut remounting = None;
    let mut thawing = None;
    let decided = (|| {
        let lock = Arc::new(crate::layers::lock(root)?);
        let id = &source.id;
        if source.dir.read_meta(id)?.status == SandboxStatus::Terminated {
            return Err(Error::not_found(format!("sandbox {id} is being destroyed")));
        }
        let names = crate::layers::read(&source.dir)?;
        if !source.may_freeze {
            return Ok((lock, names, Frozen::Busy));
        }
        // The guard protects no data: a poisoned gate is as good as a sound one.
        remounting = Some(gate.write().unwrap_or_else(|p| p.into_inner()));
        thawing = source
            .cgroups
            .as_ref()
            .and_then(|cg| match populated.recv() {
                Ok(true) => cg.frozen(),
                Ok(false) => None,
                // Not read: read it now.
                Err(_) => cg.frozen_while_held(),
            });
        let frozen = crate::layers::freeze(
            root,
            &source.dir,
            &names,
            &source.template,
            source.owner.clone(),
        )?;
        Ok((lock, names, frozen))
    })();
    // Each send below may find the clone already failed: nobody to tell.
    let (lock, names, frozen) = match decided {
        Ok(decided) => decided,
        Err(e) => {
            let _ = plan.send(Err(e));
            return;
        }
    };
    let staged = match frozen {
        Frozen::Layer(staged) => staged,
        // An empty upper layer: the clone shares the stack as it is.
        Frozen::Empty | Frozen::Busy => {
            let copy_upper = matches!(frozen, Frozen::Busy);
            drop((thawing, remounting));
            let _ = plan.send(Ok(Plan {
                lock,
                stack: names,
                copy_upper,
                source_remount: None,
            }));
            return;
        }
    };
    let (report, source_remount) = std::sync::mpsc::sync_channel(1);
    let _ = plan.send(Ok(Plan {
        lock: lock.clone(),
        stack: staged.stack().to_vec(),
        copy_upper: false,
        source_remount: Some(source_remount),
    }));
    on_remount();
    match staged.remount() {
        Ok(()) => {
            drop((thawing, remounting, lock));
            let _ = report.send(Ok(()));
            // The old overlay's teardown, off the clone's path.
            staged.into_retired().dispose();
        }
        Err(e) => {
            let (unmounted, clone_unmounted) = std::sync::mpsc::sync_channel(0);
            // Returns once the clone has dropped the sender, or never had it.
            drop(report.send(Err((e, unmounted))));
            let _ = clone_unmounted.recv();
            staged.undo();
        }
    }
}

/// The provisioning thread's part: makes the clone's workspace in `dir` as the plan
/// says, over the source's template, and waits for the source's remount.
///
/// With an `owner`, the clone's upper layer is the owner's (its copy given to it, no
/// sandbox process can reach it yet) and the template is seen through a view.
pub(crate) fn fill(
    root: &Path,
    plan: &Receiver<Result<Plan>>,
    source: &Source,
    dir: &SandboxDir,
    owner: Option<&crate::owner::SandboxOwner>,
) -> Result<&'static str> {
    // Made while the freeze runs, so the mount that follows it does less.
    for made in [dir.work(), dir.workspace()] {
        std::fs::create_dir(&made)
            .map_err(|e| Error::io(format_args!("creating {}", made.display()), e))?;
    }
    let plan = recv_soon(plan).map_err(|_| {
        Error::new(
            ErrorKind::Backend,
            "freezing the source's upper layer failed",
        )
    })??;
    let mut lock = Some(plan.lock);
    let named = |stack: &[String]| match stack.is_empty() {
        true => Ok(()),
        false => crate::layers::write_new(dir, stack),
    };
    if plan.copy_upper {
        // The clone names the layers it shares first, which keeps any destroy from
        // releasing them, and lets go of the lock every sandbox's destroy and clone
        // share before the copy: it takes as long as the source's upper layer is large
        // (a tenant's 200,000 files held another tenant's destroys for 9 s).
        named(&plan.stack)?;
        drop(lock.take());
        let _frozen = source
            .cgroups
            .as_ref()
            .and_then(|cg| cg.frozen_while_held());
        crate::contained::copy_layer(&source.dir.upper(), &dir.upper())?;
        if let Some(owner) = owner {
            owner.chown_tree(&dir.upper())?;
        }
    } else {
        std::fs::create_dir(dir.upper())
            .map_err(|e| Error::io("making the clone's upper layer", e))?;
    }
    crate::layers::mount(root, dir, &plan.stack, &source.template, owner)?;
    if lock.is_some() {
        named(&plan.stack)?;
    }
    drop(lock);
    let Some(source_remount) = plan.source_remount else {
        return Ok("overlay");
    };
    let failed = match source_remount.recv() {
        Ok(Ok(())) => return Ok("overlay"),
        Ok(Err((e, unmounted))) => (e, Some(unmounted)),
        Err(_) => (
            Error::new(ErrorKind::Backend, "remounting the clone's source failed"),
            None,
        ),
    };
    // The source is put back from the layer this clone mounted: unmount it first.
    let _ = rustix::mount::unmount(dir.workspace(), rustix::mount::UnmountFlags::empty());
    drop(failed.1);
    Err(failed.0)
}

/// Receives from `channel`, spinning a while before it sleeps: the freeze it waits for
/// takes a fraction of a millisecond, and waking a sleeping thread can cost a tenth
/// of one on a virtual machine.
fn recv_soon<T>(channel: &Receiver<T>) -> std::result::Result<T, std::sync::mpsc::RecvError> {
    let spin_until = std::time::Instant::now() + std::time::Duration::from_millis(1);
    loop {
        match channel.try_recv() {
            Ok(value) => return Ok(value),
            Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                return Err(std::sync::mpsc::RecvError)
            }
            Err(std::sync::mpsc::TryRecvError::Empty) if std::time::Instant::now() < spin_until => {
                std::hint::spin_loop()
            }
            Err(std::sync::mpsc::TryRecvError::Empty) => return channel.recv(),
        }
    }
}
