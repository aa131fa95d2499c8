//! The process's one inotify instance: every watch's kernel watches live on it, a
//! reader thread drains its queue and another hands each event to the watches holding
//! its descriptor, and the kernel watches are counted against a budget per sandbox and
//! one for the process.
//!
//! `fs.inotify.max_user_instances` (128 by default) is shared by every process of the
//! backend's user (for a root backend, every root process on the host): an instance
//! per watch let one tenant's watches take them all, and every other tenant's watches,
//! and the host's other programs' `inotify_init`, failed. Kernel watches on one
//! instance are per inode: two watches of one directory share its descriptor, so a
//! descriptor is removed from the kernel only when the last watch holding it lets go,
//! and it counts once against the budgets however many watches hold it.

use std::collections::{HashMap, HashSet};
use std::ffi::{CStr, CString};
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use rustix::fs::inotify::{self, CreateFlags, ReadFlags, WatchFlags};
use rustix::io::Errno;
use tokio::sync::mpsc;

/// What every kernel watch reports.
const MASK: WatchFlags = WatchFlags::CREATE
    .union(WatchFlags::MODIFY)
    .union(WatchFlags::DELETE)
    .union(WatchFlags::ATTRIB)
    .union(WatchFlags::MOVED_FROM)
    .union(WatchFlags::MOVED_TO)
    .union(WatchFlags::DELETE_SELF)
    .union(WatchFlags::ONLYDIR)
    .union(WatchFlags::EXCL_UNLINK);

/// Batches read from the kernel and not yet handed out: past them the reader waits,
/// and the kernel's queue fills (each batch is one read, up to 64 KiB of events).
const BACKLOG: usize = 256;

/// Events waiting for one watch before it is told it lost some: the reader never
/// waits for a slow watch, or one tenant's unread watch would stall every other's.
const QUEUE: usize = 4096;

/// The most distinct directories one group's watches follow together (a sandbox's, or
/// a group of sandboxes': `super::budget_group`).
pub(crate) const MAX_PER_GROUP: usize = 16_384;

/// Kernel watches past the process's budget that only a watch's own directory may take:
/// a watch within its group's budget is not refused outright because other groups
/// spent the process's (it reports `Overflow` for what lies beneath instead).
const ROOT_RESERVE: usize = 4096;

/// One inotify event, owned.
#[derive(Clone)]
pub(crate) struct Raw {
    pub(crate) wd: i32,
    pub(crate) mask: ReadFlags,
    pub(crate) cookie: u32,
    pub(crate) name: Option<CString>,
}

/// What the reader hands a watch.
pub(crate) enum Delivery {
    Event(Raw),
    /// The kernel's queue overflowed: events of every watch were lost.
    Overflow,
}

/// Why a kernel watch was not added.
#[derive(Debug)]
pub(crate) enum AddError {
    /// The group's or the process's budget is spent (or the kernel's, `ENOSPC`).
    Budget,
    /// The kernel refused it otherwise.
    Kernel(Errno),
}

/// How many kernel watches may be held.
#[derive(Clone, Copy)]
struct Limits {
    process: usize,
    per_group: usize,
    /// Events the kernel's queue holds before a paced release waits (half of it).
    queue_room: u64,
}

/// One inotify instance and who holds each of its watch descriptors.
pub(crate) struct Instance {
    fd: OwnedFd,
    limits: Limits,
    table: Mutex<Table>,
}

#[derive(Default)]
struct Table {
    descriptors: HashMap<i32, Descriptor>,
    subscribers: HashMap<u64, Subscriber>,
    /// Descriptors each group's watches hold.
    per_group: HashMap<Arc<str>, usize>,
    next_id: u64,
}

struct Descriptor {
    holders: Vec<u64>,
    group: Arc<str>,
}

struct Subscriber {
    tx: mpsc::Sender<Delivery>,
    lost: Arc<AtomicBool>,
    descriptors: HashSet<i32>,
}

impl Subscriber {
    fn deliver(&self, delivery: Delivery) {
        if self.tx.try_send(delivery).is_err() {
            self.lost.store(true, Ordering::SeqCst);
        }
    }
}

impl Table {
    /// Takes `holder` off `wd`; the last holder's leaving removes the kernel watch.
    fn release(&mut self, fd: &OwnedFd, wd: i32, holder: u64) {
        let Some(descriptor) = self.descriptors.get_mut(&wd) else {
            return;
        };
        descriptor.holders.retain(|h| *h != holder);
        if descriptor.holders.is_empty() {
            let _ = inotify::remove_watch(fd, wd);
            self.forget(wd);
        }
    }

    /// Drops `wd` from the table (the kernel no longer has it, or is removing it).
    fn forget(&mut self, wd: i32) {
        let Some(descriptor) = self.descriptors.remove(&wd) else {
            return;
        };
        for holder in &descriptor.holders {
            if let Some(subscriber) = self.subscribers.get_mut(holder) {
                subscriber.descriptors.remove(&wd);
            }
        }
        if let Some(held) = self.per_group.get_mut(&descriptor.group) {
            *held -= 1;
            if *held == 0 {
                self.per_group.remove(&descriptor.group);
            }
        }
    }
}

impl Instance {
    /// The process's instance, made (with its reader thread) on first use.
    pub(crate) fn shared() -> std::io::Result<Arc<Instance>> {
        static SHARED: Mutex<Option<Arc<Instance>>> = Mutex::new(None);
        let mut shared = SHARED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(instance) = shared.as_ref() {
            return Ok(instance.clone());
        }
        let instance = Self::start(Limits {
            process: process_budget(),
            per_group: MAX_PER_GROUP,
            queue_room: sysctl("max_queued_events").unwrap_or(16_384) / 2,
        })?;
        *shared = Some(instance.clone());
        Ok(instance)
    }

    fn start(limits: Limits) -> std::io::Result<Arc<Instance>> {
        // Blocking: its reader is a thread of its own, which outlives any runtime.
        let fd = inotify::init(CreateFlags::CLOEXEC)?;
        let instance = Arc::new(Instance {
            fd,
            limits,
            table: Mutex::default(),
        });
        // Reading and handing out are threads of their own: the reader drains the
        // kernel's queue, shared by every watch, whoever holds the table meanwhile (a
        // watch of 16,384 directories letting go removes as many kernel watches under
        // it, and each queues an event: read only between hand-outs, the queue
        // overflowed and every tenant's watches lost events).
        let (batches, to_deliver) = std::sync::mpsc::sync_channel(BACKLOG);
        let reader = instance.clone();
        std::thread::Builder::new()
            .name("sandcell-inotify".into())
            .spawn(move || reader.read_forever(&batches))?;
        let handing = instance.clone();
        std::thread::Builder::new()
            .name("sandcell-inotify-out".into())
            .spawn(move || {
                while let Ok(batch) = to_deliver.recv() {
                    handing.deliver(batch);
                }
            })?;
        Ok(instance)
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts a watch's subscription: the kernel watches it adds count against
    /// `group`'s budget, and their events come to it.
    pub(crate) fn subscribe(self: &Arc<Self>, group: Arc<str>) -> Subscription {
        let (tx, rx) = mpsc::channel(QUEUE);
        let lost = Arc::new(AtomicBool::new(false));
        let mut table = self.table();
        let id = table.next_id;
        table.next_id += 1;
        table.subscribers.insert(
            id,
            Subscriber {
                tx,
                lost: lost.clone(),
                descriptors: HashSet::new(),
            },
        );
        Subscription {
            instance: self.clone(),
            id,
            group,
            rx,
            lost,
        }
    }

    fn read_forever(&self, batches: &std::sync::mpsc::SyncSender<Vec<Raw>>) {
        let mut buf = vec![MaybeUninit::<u8>::uninit(); 64 * 1024];
        loop {
            let mut reader = inotify::Reader::new(&self.fd, &mut buf);
            let mut batch = Vec::new();
            loop {
                match reader.next() {
                    Ok(event) => batch.push(Raw {
                        wd: event.wd(),
                        mask: event.events(),
                        cookie: event.cookie(),
                        name: event.file_name().map(CStr::to_owned),
                    }),
                    Err(Errno::INTR) => continue,
                    Err(e) => {
                        tracing::warn!(error = %e, "reading file events");
                        std::thread::sleep(std::time::Duration::from_millis(100));
                        break;
                    }
                }
                if reader.is_buffer_empty() {
                    break;
                }
            }
            if batches.send(batch).is_err() {
                return;
            }
        }
    }

    /// Hands each event to the watches holding its descriptor. The table is locked
    /// after the read: a descriptor is added and recorded under the lock, so an event
    /// read for it finds it recorded.
    fn deliver(&self, batch: Vec<Raw>) {
        let mut table = self.table();
        for raw in batch {
            if raw.mask.contains(ReadFlags::QUEUE_OVERFLOW) {
                for subscriber in table.subscribers.values() {
                    subscriber.deliver(Delivery::Overflow);
                }
                continue;
            }
            let Some(descriptor) = table.descriptors.get(&raw.wd) else {
                continue;
            };
            for holder in &descriptor.holders {
                if let Some(subscriber) = table.subscribers.get(holder) {
                    subscriber.deliver(Delivery::Event(raw.clone()));
                }
            }
            if raw.mask.contains(ReadFlags::IGNORED) {
                // The kernel removed it (its directory is gone, or unmounted).
                table.forget(raw.wd);
            }
        }
    }
}

/// One watch's share of the instance: the descriptors it holds and their events.
/// Dropping it releases them.
pub(crate) struct Subscription {
    instance: Arc<Instance>,
    id: u64,
    group: Arc<str>,
    rx: mpsc::Receiver<Delivery>,
    lost: Arc<AtomicBool>,
}

impl Subscription {
    /// Adds a kernel watch on the directory open as `dir`, within the budgets (the
    /// process's reserve too, for a watch's own directory: `root`).
    pub(crate) fn add(&self, dir: BorrowedFd<'_>, root: bool) -> Result<i32, AddError> {
        let instance = &self.instance;
        let mut table = instance.table();
        let proc_path = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let wd = match inotify::add_watch(&instance.fd, proc_path, MASK) {
            Ok(wd) => wd,
            Err(Errno::NOSPC) => return Err(AddError::Budget),
            Err(e) => return Err(AddError::Kernel(e)),
        };
        if let Some(descriptor) = table.descriptors.get_mut(&wd) {
            // Already watched (by another watch, or this one): no new kernel watch.
            if !descriptor.holders.contains(&self.id) {
                descriptor.holders.push(self.id);
            }
        } else {
            let held = table.per_group.get(&self.group).copied().unwrap_or(0);
            let process = instance.limits.process + if root { ROOT_RESERVE } else { 0 };
            if table.descriptors.len() >= process || held >= instance.limits.per_group {
                let _ = inotify::remove_watch(&instance.fd, wd);
                return Err(AddError::Budget);
            }
            table.descriptors.insert(
                wd,
                Descriptor {
                    holders: vec![self.id],
                    group: self.group.clone(),
                },
            );
            *table.per_group.entry(self.group.clone()).or_default() += 1;
        }
        if let Some(subscriber) = table.subscribers.get_mut(&self.id) {
            subscriber.descriptors.insert(wd);
        }
        Ok(wd)
    }

    /// Lets go of `wd`.
    pub(crate) fn remove(&self, wd: i32) {
        let mut table = self.instance.table();
        if let Some(subscriber) = table.subscribers.get_mut(&self.id) {
            subscriber.descriptors.remove(&wd);
        }
        table.release(&self.instance.fd, wd, self.id);
    }

    /// Whether this watch still holds `wd` (the kernel drops a descriptor whose
    /// directory goes, and this watch may have missed saying so).
    pub(crate) fn holds(&self, wd: i32) -> bool {
        self.instance
            .table()
            .subscribers
            .get(&self.id)
            .is_some_and(|s| s.descriptors.contains(&wd))
    }

    /// Waits for events and takes every one waiting; `false` never comes while the
    /// subscription lives (the instance keeps its sender).
    pub(crate) async fn recv(&mut self, out: &mut Vec<Delivery>) -> bool {
        self.rx.recv_many(out, QUEUE).await > 0
    }

    /// Whether events were dropped for this watch since the last ask (its queue was
    /// full).
    pub(crate) fn take_lost(&self) -> bool {
        self.lost.swap(false, Ordering::SeqCst)
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        let Some(subscriber) = self.instance.table().subscribers.remove(&self.id) else {
            return;
        };
        let descriptors: Vec<i32> = subscriber.descriptors.into_iter().collect();
        if descriptors.len() <= RELEASE_CHUNK {
            let mut table = self.instance.table();
            for wd in descriptors {
                table.release(&self.instance.fd, wd, self.id);
            }
            return;
        }
        // A wide watch lets go on a thread of its own, paced by the kernel's queue.
        let (instance, id) = (Arc::clone(&self.instance), self.id);
        let paced = std::thread::Builder::new()
            .name("sandcell-unwatch".into())
            .spawn(move || instance.release_paced(id, &descriptors));
        if let Err(e) = paced {
            tracing::warn!(error = %e, "letting go of a watch's kernel watches");
        }
    }
}

/// Kernel watches let go of at a time (the table is held for as many).
const RELEASE_CHUNK: usize = 64;

impl Instance {
    /// Lets `holder` go of `descriptors`, a chunk at a time, waiting while the kernel's
    /// queue is half full: each kernel watch removed queues an event, every watch's
    /// events share the queue, and thousands removed at once overflowed it under load,
    /// so other tenants' watches lost events (FINDINGS8 T3).
    fn release_paced(&self, holder: u64, descriptors: &[i32]) {
        let room = self.limits.queue_room;
        for some in descriptors.chunks(RELEASE_CHUNK) {
            for _ in 0..1000 {
                // An event without a name is 16 bytes: a lower bound of what is queued.
                let queued = rustix::io::ioctl_fionread(&self.fd).unwrap_or(0) / 16;
                if queued < room {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            let mut table = self.table();
            for wd in some {
                table.release(&self.fd, *wd, holder);
            }
        }
    }
}

/// What this process's watches may hold together: half the user's limit, leaving the
/// rest to the user's other programs.
fn process_budget() -> usize {
    static BUDGET: OnceLock<usize> = OnceLock::new();
    *BUDGET
        .get_or_init(|| sysctl("max_user_watches").map_or(MAX_PER_GROUP, |max| (max / 2) as usize))
}

/// One of the kernel's inotify settings (`/proc/sys/fs/inotify/<name>`).
fn sysctl(name: &str) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/sys/fs/inotify/{name}"))
        .ok()
        .and_then(|value| value.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::os::fd::AsFd;
    use std::path::Path;

    fn dir(path: &Path) -> OwnedFd {
        rustix::fs::open(
            path,
            rustix::fs::OFlags::PATH | rustix::fs::OFlags::DIRECTORY,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    }

    #[test]
    fn a_directory_two_watches_hold_is_one_kernel_watch_until_both_let_go() {
        let instance = Instance::start(Limits {
            process: 10,
            per_group: 10,
            queue_room: 8192,
        })
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let one = instance.subscribe("a".into());
        let two = instance.subscribe("a".into());
        let a = one.add(dir(tmp.path()).as_fd(), true).unwrap();
        let b = two.add(dir(tmp.path()).as_fd(), true).unwrap();
        assert_eq!(a, b, "one inode, one descriptor");
        assert_eq!(instance.table().descriptors.len(), 1);
        assert_eq!(instance.table().per_group["a"], 1);
        drop(one);
        assert!(two.holds(b), "the other watch keeps it");
        assert_eq!(instance.table().descriptors.len(), 1);
        drop(two);
        assert!(instance.table().descriptors.is_empty());
        assert!(instance.table().per_group.is_empty());
    }

    /// FINDINGS8 T1: a group (a tenant's sandboxes) shares one budget.
    #[test]
    fn a_group_holds_no_more_distinct_directories_than_its_budget() {
        let instance = Instance::start(Limits {
            process: 100,
            per_group: 3,
            queue_room: 8192,
        })
        .unwrap();
        let tmp = tempfile::tempdir().unwrap();
        let other = tempfile::tempdir().unwrap();
        for n in 0..4 {
            std::fs::create_dir(tmp.path().join(n.to_string())).unwrap();
        }
        let at = |n: &str| dir(&tmp.path().join(n));
        let watch = instance.subscribe("tenant".into());
        for n in ["0", "1", "2"] {
            watch.add(at(n).as_fd(), false).unwrap();
        }
        // Another sandbox of the same group shares the budget, its root included.
        let sibling = instance.subscribe("tenant".into());
        let refused = sibling.add(at("3").as_fd(), true);
        assert!(matches!(refused, Err(AddError::Budget)), "{refused:?}");
        // What is already watched costs nothing.
        sibling.add(at("0").as_fd(), true).unwrap();
        // Another group has a budget of its own.
        let elsewhere = instance.subscribe("other".into());
        elsewhere.add(dir(other.path()).as_fd(), true).unwrap();
        assert_eq!(instance.table().descriptors.len(), 4);
    }

    #[test]
    fn the_process_budget_binds_every_group_but_a_watch_s_own_directory() {
        let instance = Instance::start(Limits {
            process: 2,
            per_group: 10,
            queue_room: 8192,
        })
        .unwrap();
        let dirs: Vec<_> = (0..4).map(|_| tempfile::tempdir().unwrap()).collect();
        let watches: Vec<_> = (0..3)
            .map(|n| instance.subscribe(format!("g{n}").into()))
            .collect();
        watches[0].add(dir(dirs[0].path()).as_fd(), false).unwrap();
        watches[1].add(dir(dirs[1].path()).as_fd(), false).unwrap();
        let refused = watches[2].add(dir(dirs[2].path()).as_fd(), false);
        assert!(matches!(refused, Err(AddError::Budget)), "{refused:?}");
        // Its own directory takes the reserve: the watch starts, and overflows beneath.
        watches[2].add(dir(dirs[3].path()).as_fd(), true).unwrap();
    }
}
