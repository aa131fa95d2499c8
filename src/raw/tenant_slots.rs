//! Places counted per tenant, for a server that bounds what each of its tenants holds
//! at once (commands running, tool calls in flight, watches, archive streams).

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::{Error, Result};

/// At most `cap` places held at once by each tenant, each tenant's made on first use.
///
/// A place is a permit: held for as long as what it counts lives, and given back when
/// dropped. One tenant at its cap is refused; others are not affected.
///
/// ```
/// use sandcell::raw::TenantSlots;
///
/// let commands = TenantSlots::new(2, "commands running", "wait for one to end");
/// let _first = commands.slot("alice").unwrap();
/// let second = commands.slot("alice").unwrap();
/// let refused = commands.slot("alice").unwrap_err();
/// assert_eq!(refused.kind(), sandcell::ErrorKind::LimitExceeded);
/// assert!(refused.to_string().contains("2 commands running"));
/// let _bob = commands.slot("bob").unwrap();
/// drop(second);
/// let _again = commands.slot("alice").unwrap();
/// ```
#[derive(Debug)]
pub struct TenantSlots {
    cap: AtomicUsize,
    /// What a place counts, as the refusal names it ("commands running").
    what: &'static str,
    /// What a refused tenant can do about it.
    hint: &'static str,
    per_tenant: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl TenantSlots {
    /// `cap` places per tenant; a refusal says the tenant has `cap` `what`, then `hint`.
    pub fn new(cap: usize, what: &'static str, hint: &'static str) -> Self {
        TenantSlots {
            cap: AtomicUsize::new(cap),
            what,
            hint,
            per_tenant: Mutex::default(),
        }
    }

    /// Sets the cap of the tenants whose places are not made yet (set it before any
    /// place is taken).
    pub fn set_cap(&self, cap: usize) {
        self.cap.store(cap, Ordering::Relaxed);
    }

    /// A place for one more of `tenant`'s.
    ///
    /// # Errors
    /// [`LimitExceeded`](crate::ErrorKind::LimitExceeded) when `tenant` holds its cap.
    pub fn slot(&self, tenant: &str) -> Result<OwnedSemaphorePermit> {
        let semaphore = self.semaphore(tenant);
        semaphore.try_acquire_owned().map_err(|_| {
            Error::limit_exceeded(format!(
                "tenant {tenant} has {} {}, as many as it may: {}",
                self.cap.load(Ordering::Relaxed),
                self.what,
                self.hint
            ))
        })
    }

    /// `tenant`'s places themselves, for whoever takes them on its own (the wire
    /// server's [`ServeOptions`](crate::raw::wire::ServeOptions)).
    pub fn semaphore(&self, tenant: &str) -> Arc<Semaphore> {
        let mut per_tenant = self
            .per_tenant
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(
            per_tenant
                .entry(tenant.to_owned())
                .or_insert_with(|| Arc::new(Semaphore::new(self.cap.load(Ordering::Relaxed)))),
        )
    }
}
