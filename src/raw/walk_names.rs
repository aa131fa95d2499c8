//! The names a walk holds of one directory, and the process-wide pool they are charged
//! to. One listing is capped ([`MAX_WALK_NAMES`](super::MAX_WALK_NAMES),
//! [`MAX_WALK_NAME_BYTES`](super::MAX_WALK_NAME_BYTES)), but a walk holds its listing
//! for as long as it takes, and an export whose reader grants no credit blocks for as
//! long as that reader likes: many of them over directories of hard links (which cost
//! no inodes) would hold a listing each. So what the listings of one thread hold past
//! a small allowance is charged to one pool, [`MAX_HELD_WALK_BYTES`] for the whole
//! process, and a listing that finds it spent fails at once rather than wait: walks of
//! small directories (the allowance covers a few thousand names) are never refused,
//! whatever others hold. What listings hold is then bounded by the pool plus an
//! allowance per thread (and a runtime's threads are bounded).
//!
//! The walks a client can hold open are exports (a server bounds how many one tenant
//! streams at once, `sandcell-server`'s `max_archive_streams_per_tenant`, 8 by
//! default): eight of the largest directory a walk takes (about 42 MB of names each)
//! are about two thirds of the pool, so one tenant alone cannot spend it.

use std::ffi::CString;
use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use rustix::io::Errno;

/// Most bytes the listings of every walk in this process hold at once, beyond each
/// one's allowance: a listing that would pass it fails with `ENOMEM`, which
/// [`Error::io`](crate::Error::io) reads as `LimitExceeded`.
pub const MAX_HELD_WALK_BYTES: usize = 512 << 20;

/// What the listings one thread holds together may hold without drawing on the pool.
/// Per thread, not per listing: a copy keeps the rest of each directory's names on its
/// way down, and a tree a thousand levels deep must not hold a thousand allowances.
const ALLOWANCE: usize = 1 << 20;

/// What a held name costs beyond its bytes: its terminating nul, the `CString` in the
/// vector, and the allocator's header and rounding.
const NAME_OVERHEAD: usize = 40;

static HELD: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// What is left of this thread's allowance (shared, so a listing dropped on
    /// another thread gives it back to the right one).
    static ALLOWANCE_LEFT: Arc<AtomicUsize> = Arc::new(AtomicUsize::new(ALLOWANCE));
}

/// Takes `n` from `left` if it has that much.
fn take(left: &AtomicUsize, n: usize) -> bool {
    left.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |have| {
        have.checked_sub(n)
    })
    .is_ok()
}

/// What one listing holds of its thread's allowance and of the pool; given back on
/// drop.
#[derive(Debug, Default)]
struct Charge {
    /// The allowance it took from, and how much.
    allowance: Option<(Arc<AtomicUsize>, usize)>,
    /// What it has drawn from the pool.
    drawn: usize,
}

/// What holding `name` costs.
fn cost(name: &[u8]) -> usize {
    name.len() + NAME_OVERHEAD
}

impl Charge {
    /// Takes `cost` from the thread's allowance or else from the pool, or fails with
    /// `ENOMEM` where neither has it.
    fn take(&mut self, cost: usize) -> Result<(), Errno> {
        let (left, taken) = self
            .allowance
            .get_or_insert_with(|| (ALLOWANCE_LEFT.with(Arc::clone), 0));
        if take(left, cost) {
            *taken += cost;
            return Ok(());
        }
        let before = HELD.fetch_add(cost, Ordering::Relaxed);
        if before + cost > MAX_HELD_WALK_BYTES {
            HELD.fetch_sub(cost, Ordering::Relaxed);
            return Err(Errno::NOMEM);
        }
        self.drawn += cost;
        Ok(())
    }

    /// Gives back `cost`, to the pool first.
    fn give_back(&mut self, cost: usize) {
        let to_pool = cost.min(self.drawn);
        HELD.fetch_sub(to_pool, Ordering::Relaxed);
        self.drawn -= to_pool;
        if let Some((left, taken)) = &mut self.allowance {
            let to_thread = (cost - to_pool).min(*taken);
            left.fetch_add(to_thread, Ordering::Relaxed);
            *taken -= to_thread;
        }
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.give_back(usize::MAX);
    }
}

/// Bytes of the pool held by listings now (for tests and metrics).
pub fn held_walk_bytes() -> usize {
    HELD.load(Ordering::Relaxed)
}

/// One directory's names as a walk holds them, sorted by bytes: a slice of them, whose
/// share of the pool is given back when the last of them is dropped.
#[derive(Debug, Default)]
pub struct Names {
    names: Vec<CString>,
    charge: Charge,
}

impl Names {
    pub(super) fn new() -> Names {
        Names::default()
    }

    /// Adds `name`, or fails with `ENOMEM` where the pool is spent.
    pub(super) fn push(&mut self, name: CString) -> Result<(), Errno> {
        self.charge.take(cost(name.as_bytes()))?;
        self.names.push(name);
        Ok(())
    }

    pub(super) fn sort(&mut self) {
        self.names.sort_unstable();
    }

    /// Takes the last name (the greatest), as a walk that goes in sorted order from
    /// the back does.
    pub fn pop(&mut self) -> Option<CString> {
        let name = self.names.pop()?;
        self.charge.give_back(cost(name.as_bytes()));
        Some(name)
    }
}

impl Deref for Names {
    type Target = [CString];

    fn deref(&self) -> &[CString] {
        &self.names
    }
}

impl IntoIterator for Names {
    type Item = CString;
    type IntoIter = IntoNames;

    fn into_iter(self) -> IntoNames {
        IntoNames {
            names: self.names.into_iter(),
            _charge: self.charge,
        }
    }
}

/// The names of a [`Names`] one by one, still holding its share of the pool.
#[derive(Debug)]
pub struct IntoNames {
    names: std::vec::IntoIter<CString>,
    _charge: Charge,
}

impl Iterator for IntoNames {
    type Item = CString;

    fn next(&mut self) -> Option<CString> {
        self.names.next()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.names.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(i: usize) -> CString {
        CString::new(format!("{i:0255}")).unwrap()
    }

    /// Fills a listing until the pool refuses it.
    fn fill() -> (Names, Errno) {
        let mut names = Names::new();
        for i in 0..2 * MAX_HELD_WALK_BYTES / 255 {
            if let Err(e) = names.push(name(i)) {
                return (names, e);
            }
        }
        panic!("twice the pool was never refused");
    }

    /// ADVERSARIAL 40: the names held by walks blocked on their readers are bounded in
    /// all, the refusal reads as a limit, a small walk on another thread still goes
    /// through, and all of it comes back when the listings are dropped.
    #[test]
    fn listings_held_at_once_share_one_pool() {
        let before = held_walk_bytes();
        let (mut names, refused) = fill();
        assert_eq!(refused, Errno::NOMEM);
        names.pop();
        names
            .push(name(0))
            .expect("a name taken off gives its room back");
        let held = names.len() * cost(&[0; 255]);
        assert!(
            held > MAX_HELD_WALK_BYTES - before && held <= MAX_HELD_WALK_BYTES + ALLOWANCE,
            "{held} bytes held"
        );
        let error = crate::Error::io("listing many", std::io::Error::from(refused));
        assert_eq!(error.kind(), crate::ErrorKind::LimitExceeded, "{error}");

        let small = std::thread::spawn(|| {
            let mut few = Names::new();
            (0..500)
                .try_for_each(|i| few.push(name(i)))
                .map(|()| few.len())
        });
        assert_eq!(small.join().unwrap(), Ok(500), "a small walk needs no pool");

        drop(names);
        assert!(held_walk_bytes() <= before, "the pool is given back");
        let mut again = Names::new();
        (0..500).try_for_each(|i| again.push(name(i))).unwrap();
        assert!(
            held_walk_bytes() <= before,
            "and so is this thread's allowance"
        );
    }
}
