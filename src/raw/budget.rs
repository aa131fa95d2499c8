//! How many bytes a server holds for whole-file transfers at once: the backend
//! contract's `read` and `write` take whole files, so a server passes each one through
//! memory, and a caller that opens many and reads none back would have it hold them
//! all. A [`ByteBudget`] is what they may hold together; a [`Reservation`] takes its
//! share or fails at once, and gives it back when dropped.

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, ErrorKind, Result};

/// Budgets count in KiB, so a semaphore's `u32` permits cover any file.
const UNIT: u64 = 1024;

/// Bytes that may be held at once, optionally within a wider budget (a tenant's share
/// of a server's): a reservation takes from both.
///
/// ```
/// use sandcell::raw::budget::ByteBudget;
/// let server = ByteBudget::new(4 << 20);
/// let tenant = server.share(2 << 20);
/// let held = tenant.try_reserve(2 << 20).unwrap();
/// assert!(tenant.try_reserve(1).is_err(), "the tenant's share is held");
/// let other = server.share(2 << 20);
/// assert!(other.try_reserve(2 << 20).is_ok(), "another tenant has its own");
/// drop(held);
/// assert!(tenant.try_reserve(2 << 20).is_ok());
/// ```
#[derive(Debug, Clone)]
pub struct ByteBudget {
    /// This budget's own permits, then each wider one's.
    layers: Vec<Arc<Semaphore>>,
    bytes: u64,
}

impl ByteBudget {
    /// A budget of `bytes` (rounded up to whole KiB).
    pub fn new(bytes: u64) -> ByteBudget {
        ByteBudget {
            layers: vec![Arc::new(Semaphore::new(units(bytes) as usize))],
            bytes,
        }
    }

    /// A budget of `bytes` of its own, whose reservations also take from this one.
    pub fn share(&self, bytes: u64) -> ByteBudget {
        let mut layers = vec![Arc::new(Semaphore::new(units(bytes) as usize))];
        layers.extend(self.layers.iter().cloned());
        ByteBudget { layers, bytes }
    }

    /// The bytes this budget holds in all.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Takes `bytes` from this budget and every wider one, or fails at once with
    /// [`ErrorKind::LimitExceeded`] and takes nothing.
    pub fn try_reserve(&self, bytes: u64) -> Result<Reservation> {
        let mut reservation = Reservation {
            permits: Vec::new(),
        };
        reservation.grow(self, bytes)?;
        Ok(reservation)
    }
}

/// Bytes taken from a [`ByteBudget`]; given back on drop.
#[derive(Debug)]
pub struct Reservation {
    permits: Vec<OwnedSemaphorePermit>,
}

impl Reservation {
    /// Takes `bytes` more from `budget` (the one it came from), or fails as
    /// [`ByteBudget::try_reserve`] does, keeping what it held.
    pub fn grow(&mut self, budget: &ByteBudget, bytes: u64) -> Result<()> {
        let wanted = u32::try_from(units(bytes)).unwrap_or(u32::MAX);
        let mut taken = Vec::with_capacity(budget.layers.len());
        for layer in &budget.layers {
            match Arc::clone(layer).try_acquire_many_owned(wanted) {
                Ok(permit) => taken.push(permit),
                Err(_) => return Err(Error::new(ErrorKind::LimitExceeded, BUSY)),
            }
        }
        // One permit per layer: merged, so `shrink_to` can give back from each.
        if self.permits.is_empty() {
            self.permits = taken;
        } else {
            for (held, more) in self.permits.iter_mut().zip(taken) {
                held.merge(more);
            }
        }
        Ok(())
    }

    /// Gives back all but `bytes` (rounded up to whole KiB): a caller that reserved a
    /// worst case keeps what it turned out to need.
    pub fn shrink_to(&mut self, bytes: u64) {
        let keep = usize::try_from(units(bytes)).unwrap_or(usize::MAX);
        for held in &mut self.permits {
            let surplus = held.num_permits().saturating_sub(keep);
            drop(held.split(surplus));
        }
    }
}

/// What a refused reservation says.
const BUSY: &str = "too many file transfers are in flight; retry once one has finished";

/// Whether `error` is a budget's refusal (rather than, say, a file over a size limit,
/// which is `LimitExceeded` too): worth retrying later, as HTTP's `429` says.
pub fn is_refusal(error: &Error) -> bool {
    error.kind() == ErrorKind::LimitExceeded && error.message() == BUSY
}

fn units(bytes: u64) -> u64 {
    bytes.div_ceil(UNIT)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_refused_reservation_takes_nothing_and_growth_counts() {
        let server = ByteBudget::new(10 * UNIT);
        let a = server.share(8 * UNIT);
        let b = server.share(8 * UNIT);
        let held = a.try_reserve(6 * UNIT).unwrap();
        // b fits its own share but not what the server has left; a refusal leaves
        // b's share untouched.
        assert!(is_refusal(&b.try_reserve(5 * UNIT).unwrap_err()));
        assert!(!is_refusal(&Error::limit_exceeded("a file over the limit")));
        let mut growing = b.try_reserve(4 * UNIT).unwrap();
        assert!(growing.grow(&b, UNIT).is_err(), "the server is full");
        drop(held);
        growing.grow(&b, 4 * UNIT).unwrap();
        assert!(growing.grow(&b, UNIT).is_err(), "b's share is full");
        drop(growing);
        assert!(b.try_reserve(8 * UNIT).is_ok());
    }

    #[test]
    fn a_shrunk_reservation_gives_back_the_rest_of_every_layer() {
        let server = ByteBudget::new(10 * UNIT);
        let tenant = server.share(8 * UNIT);
        let mut held = tenant.try_reserve(4 * UNIT).unwrap();
        held.grow(&tenant, 4 * UNIT).unwrap();
        assert!(tenant.try_reserve(1).is_err(), "the share is full");
        held.shrink_to(3 * UNIT - 1);
        let other = server.share(8 * UNIT);
        assert!(
            tenant.try_reserve(5 * UNIT).is_ok(),
            "5 KiB came back to the share"
        );
        let rest = other.try_reserve(7 * UNIT).expect("and to the server");
        assert!(other.try_reserve(UNIT).is_err(), "3 KiB are still held");
        held.shrink_to(u64::MAX);
        assert!(other.try_reserve(UNIT).is_err(), "shrinking never grows");
        drop(held);
        assert!(other.try_reserve(UNIT).is_ok());
        drop(rest);
    }
}
