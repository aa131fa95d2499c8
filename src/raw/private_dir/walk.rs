//! The walk behind [`check_private_dir`](super::check_private_dir) and
//! [`ensure_private_dir`](super::ensure_private_dir): the path resolved by hand, one
//! component at a time through directory descriptors, as the kernel would resolve it,
//! judging everything met on the way.
//!
//! Trailing slashes and `.` are dropped first, so a final symbolic link is judged as a
//! link and never followed (`data/` must not mean "wherever `data` leads"). Every link
//! met, the final one's target chain included, is judged by its own owner; the directory
//! it lies in has been judged already, being on the real path. Every directory on the
//! real path is judged as one above a private directory. Missing components are made
//! with `mkdirat` beneath the deepest existing directory's descriptor and opened with
//! `O_NOFOLLOW|O_DIRECTORY`: nothing put there in the meantime is followed, and what is
//! found there is judged through its descriptor before anything is made beneath it.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::error::{Error, Result};

/// As many symbolic links as Linux follows in resolving one path.
const MAX_LINKS: u32 = 40;

/// How each directory is opened: never through a link, and (where the system allows)
/// without needing read permission, only search, as path resolution does.
#[cfg(any(target_os = "linux", target_os = "android"))]
const DIR_FLAGS: OFlags = OFlags::PATH
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);
#[cfg(not(any(target_os = "linux", target_os = "android")))]
const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// Turns a problem into the caller's error.
pub(super) type Refuse<'a> = &'a dyn Fn(String) -> Error;

/// A directory on the real path, open, with the path it was reached by (for messages).
pub(super) struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

/// Where a walk stopped.
pub(super) enum End {
    /// The whole path exists and is a directory: its status, taken through a
    /// descriptor opened without following a link.
    Found(Stat),
    /// Component `names[0]` does not exist beneath the deepest directory reached; it
    /// and the rest remain to be made.
    Missing(Vec<OsString>),
}

/// A walk of a path: the real directories from `/` to the deepest reached, each
/// open and judged, and how it ended.
pub(super) struct Walk {
    root: Dir,
    above: Vec<Dir>,
    pub(super) end: End,
}

/// The path as it will be judged and used: absolute, with trailing slashes and `.`
/// components dropped (`..` is kept: it means the real parent of what precedes it).
pub fn normalize(dir: &Path) -> Result<PathBuf> {
    let absolute = match dir.is_absolute() {
        true => dir.to_path_buf(),
        false => std::env::current_dir()
            .map_err(|e| Error::io("finding the current directory", e))?
            .join(dir),
    };
    Ok(absolute
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect())
}

/// Resolves `dir` (made absolute and normalized) component by component. The final
/// component is neither judged nor followed when it is a link: the caller judges it.
pub(super) fn walk(dir: &Path, refuse: Refuse<'_>) -> Result<Walk> {
    let absolute = normalize(dir)?;
    let mut todo: VecDeque<OsString> = VecDeque::new();
    push_front(&mut todo, &absolute);
    let (root, stat) = open_seen_dir(None, Path::new("/"))?;
    judge_above(&root.path, &stat, refuse)?;
    // The directories beneath the root down to where the walk stands.
    let mut above: Vec<Dir> = Vec::new();
    let mut links = 0;
    while let Some(name) = todo.pop_front() {
        let last = todo.is_empty();
        if name == ".." {
            above.pop();
            if last {
                return found_at_top(root, above);
            }
            continue;
        }
        let parent = above.last().unwrap_or(&root);
        let path = parent.path.join(&name);
        let stat = match rustix::fs::statat(&parent.fd, &name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(stat) => stat,
            Err(Errno::NOENT) => {
                let mut names = vec![name];
                names.extend(todo);
                return Ok(Walk {
                    root,
                    above,
                    end: End::Missing(names),
                });
            }
            Err(e) => return Err(io(format_args!("inspecting {}", path.display()), e)),
        };
        match FileType::from_raw_mode(stat.st_mode) {
            FileType::Symlink if last => {
                return Err(refuse("it is a symbolic link".to_owned()));
            }
            FileType::Symlink => {
                // The link judged is the one read: both through one descriptor of it,
                // so it cannot be swapped for another between the two.
                let reading = |e| io(format_args!("reading the link {}", path.display()), e);
                let link = rustix::fs::openat(
                    &parent.fd,
                    &name,
                    OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(reading)?;
                let stat = rustix::fs::fstat(&link).map_err(reading)?;
                if FileType::from_raw_mode(stat.st_mode) != FileType::Symlink {
                    return Err(refuse("it changed while it was inspected".to_owned()));
                }
                // Whoever owns it could point it elsewhere; the directory it lies in
                // is on the real path, judged already.
                judge_above(&path, &stat, refuse)?;
                links += 1;
                if links > MAX_LINKS {
                    return Err(io(
                        format_args!("following the symbolic links to {}", path.display()),
                        Errno::LOOP,
                    ));
                }
                let target = rustix::fs::readlinkat(&link, c"", Vec::new()).map_err(reading)?;
                let target = Path::new(OsStr::from_bytes(target.as_bytes()));
                if target.is_absolute() {
                    above.clear();
                }
                push_front(&mut todo, target);
                if todo.is_empty() {
                    // A link to `/` or `.`: where it leads is the final directory.
                    return found_at_top(root, above);
                }
            }
            FileType::Directory => {
                let (dir, stat) = open_seen_dir(Some(parent), Path::new(&name))?;
                if last {
                    return Ok(Walk {
                        root,
                        above,
                        end: End::Found(stat),
                    });
                }
                judge_above(&dir.path, &stat, refuse)?;
                above.push(dir);
            }
            _ if last => return Err(refuse("it is not a directory".to_owned())),
            _ => {
                return Err(io(
                    format_args!("inspecting {}", path.display()),
                    Errno::NOTDIR,
                ))
            }
        }
    }
    found_at_top(root, above)
}

impl Walk {
    /// Makes the missing components `0700`, each beneath the descriptor of the one
    /// above, opens each without following a link and judges it through that
    /// descriptor (the last as a private directory, the others as ones above it)
    /// before going on. Something already there is fine if it passes the same test.
    pub(super) fn make_missing(mut self, refuse: Refuse<'_>) -> Result<()> {
        let End::Missing(names) = std::mem::replace(&mut self.end, End::Missing(Vec::new())) else {
            return Ok(());
        };
        let count = names.len();
        for (i, name) in names.into_iter().enumerate() {
            let parent = self.above.last().unwrap_or(&self.root);
            let path = parent.path.join(&name);
            if name == ".." {
                return Err(Error::invalid_input(format!(
                    "cannot make {}: a `..` follows a directory that does not exist",
                    path.display()
                )));
            }
            match rustix::fs::mkdirat(&parent.fd, &name, Mode::RWXU) {
                Ok(()) | Err(Errno::EXIST) => {}
                Err(e) => return Err(io(format_args!("creating {}", path.display()), e)),
            }
            let Some((dir, stat)) = open_dir(Some(parent), Path::new(&name))? else {
                return Err(refuse(match i + 1 == count {
                    true => "a symbolic link or something else not a directory took its \
                             place as it was being made"
                        .to_owned(),
                    false => format!(
                        "{} above it is a symbolic link or something else not a directory, \
                         put there as it was being made",
                        path.display()
                    ),
                }));
            };
            if i + 1 == count {
                return judge_private(&stat, refuse);
            }
            judge_above(&dir.path, &stat, refuse)?;
            self.above.push(dir);
        }
        Ok(())
    }
}

/// The directory the walk stands in is the final one.
fn found_at_top(root: Dir, mut above: Vec<Dir>) -> Result<Walk> {
    let stat = match above.pop() {
        Some(dir) => rustix::fs::fstat(&dir.fd)
            .map_err(|e| io(format_args!("inspecting {}", dir.path.display()), e))?,
        // The root itself.
        None => rustix::fs::fstat(&root.fd)
            .map_err(|e| io(format_args!("inspecting {}", root.path.display()), e))?,
    };
    Ok(Walk {
        root,
        above,
        end: End::Found(stat),
    })
}

/// Puts `path`'s components before those still to be resolved, without `.`, a root
/// or a prefix (an absolute path restarts at the root: the caller truncates).
fn push_front(todo: &mut VecDeque<OsString>, path: &Path) {
    for component in path.components().rev() {
        match component {
            Component::Normal(name) => todo.push_front(name.to_owned()),
            Component::ParentDir => todo.push_front(OsString::from("..")),
            Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
        }
    }
}

/// Opens `name` beneath `parent` (or the absolute `name` without one) as a directory,
/// never through a link, with its status; `None` if it is not a directory (a link,
/// a file) by the time it is opened.
fn open_dir(parent: Option<&Dir>, name: &Path) -> Result<Option<(Dir, Stat)>> {
    let (opened, path) = match parent {
        Some(parent) => (
            rustix::fs::openat(&parent.fd, name, DIR_FLAGS, Mode::empty()),
            parent.path.join(name),
        ),
        None => (
            rustix::fs::open(name, DIR_FLAGS, Mode::empty()),
            name.to_path_buf(),
        ),
    };
    let fd = match opened {
        Ok(fd) => fd,
        Err(Errno::LOOP | Errno::NOTDIR) => return Ok(None),
        Err(e) => return Err(io(format_args!("opening {}", path.display()), e)),
    };
    let stat =
        rustix::fs::fstat(&fd).map_err(|e| io(format_args!("inspecting {}", path.display()), e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::Directory {
        return Ok(None);
    }
    Ok(Some((Dir { fd, path }, stat)))
}

/// [`open_dir`] where a directory was seen a moment before.
fn open_seen_dir(parent: Option<&Dir>, name: &Path) -> Result<(Dir, Stat)> {
    let path = parent.map_or_else(|| name.to_path_buf(), |p| p.path.join(name));
    open_dir(parent, name)?.ok_or_else(|| {
        io(
            format_args!(
                "opening {} (it changed while being checked)",
                path.display()
            ),
            Errno::NOTDIR,
        )
    })
}

/// Refuses a directory or link above a private directory unless root or this user owns
/// it and, for a directory, nobody else may write it (or it is sticky).
fn judge_above(path: &Path, stat: &Stat, refuse: Refuse<'_>) -> Result<()> {
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != 0 && stat.st_uid != me {
        return Err(refuse(format!(
            "{} above it is owned by uid {}, who could replace it",
            path.display(),
            stat.st_uid
        )));
    }
    let mode = stat.st_mode & 0o7777;
    let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
    if is_dir && mode & 0o022 != 0 && mode & 0o1000 == 0 {
        return Err(refuse(format!(
            "{} above it is writable by its group or by other users and not sticky \
             (mode {mode:04o}), so they could replace it",
            path.display()
        )));
    }
    Ok(())
}

/// Refuses the directory itself unless this user owns it and nobody else may write it.
pub(super) fn judge_private(stat: &Stat, refuse: Refuse<'_>) -> Result<()> {
    match FileType::from_raw_mode(stat.st_mode) {
        FileType::Directory => {}
        FileType::Symlink => return Err(refuse("it is a symbolic link".to_owned())),
        _ => return Err(refuse("it is not a directory".to_owned())),
    }
    let me = rustix::process::geteuid().as_raw();
    if stat.st_uid != me {
        return Err(refuse(format!(
            "it is owned by uid {}, not by this process's uid {me}",
            stat.st_uid
        )));
    }
    let mode = stat.st_mode & 0o7777;
    if mode & 0o022 != 0 {
        return Err(refuse(format!(
            "it is writable by its group or by other users (mode {mode:04o})"
        )));
    }
    Ok(())
}

fn io(context: impl std::fmt::Display, errno: Errno) -> Error {
    Error::io(context, std::io::Error::from(errno))
}

/// Test hook: run between the walk and the making of what is missing, as another
/// user racing the call would.
#[cfg(test)]
pub(super) mod race {
    use std::cell::RefCell;

    thread_local! {
        static BEFORE_MAKING: RefCell<Option<Box<dyn FnOnce()>>> = RefCell::new(None);
    }

    pub(in crate::raw::private_dir) fn set(hook: impl FnOnce() + 'static) {
        BEFORE_MAKING.with(|h| *h.borrow_mut() = Some(Box::new(hook)));
    }

    pub(in crate::raw::private_dir) fn run() {
        if let Some(hook) = BEFORE_MAKING.with(|h| h.borrow_mut().take()) {
            hook();
        }
    }
}
