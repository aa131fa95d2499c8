//! One conformance case run as a test of its own: a fresh backend from the caller's
//! set-up, a runtime, a label that finds whatever the case created, and the checks after.

use std::any::Any;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;

use futures::FutureExt;

use crate::{LabelSelector, SandboxBackend};

/// The backend a case runs on, shared (the manager case needs to own a reference).
pub type SharedBackend = Arc<dyn SandboxBackend>;

/// What a case is once started: it borrows the backend.
pub type CaseFuture<'a> = Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Label carried by every sandbox [`spec`](super::spec) makes inside one case run, so
/// what the case left behind can be found (and destroyed) however it ended.
pub(crate) const CASE_LABEL: &str = "sandcell.test.case";

tokio::task_local! {
    /// The running case's label value.
    static CASE_RUN: String;
}

/// The label value of the case running on this task, if any.
pub(crate) fn case_run() -> Option<String> {
    CASE_RUN.try_with(Clone::clone).ok()
}

/// A backend for one conformance case, with what must outlive it (a temporary root, a
/// server) and checks to run once the case is over.
///
/// The case runs, then leftovers are looked up by the case's label (every sandbox made
/// from [`spec`](super::spec) carries it), then the checks run while the backend is still
/// alive, then the backend is dropped, then the guards.
pub struct Fixture {
    backend: SharedBackend,
    checks: Vec<Box<dyn FnOnce() + Send>>,
    guards: Vec<Box<dyn Any + Send>>,
}

impl std::fmt::Debug for Fixture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Fixture")
            .field("backend", &self.backend.name())
            .field("checks", &self.checks.len())
            .field("guards", &self.guards.len())
            .finish()
    }
}

impl Fixture {
    /// A fixture over `backend`.
    pub fn new(backend: impl SandboxBackend + 'static) -> Self {
        Self::shared(Arc::new(backend))
    }

    /// A fixture over a backend that is already shared.
    pub fn shared(backend: SharedBackend) -> Self {
        Fixture {
            backend,
            checks: Vec::new(),
            guards: Vec::new(),
        }
    }

    /// Keeps `guard` alive until after the backend is dropped (a temporary directory the
    /// backend lives in, a server it talks to).
    pub fn guard(mut self, guard: impl Any + Send) -> Self {
        self.guards.push(Box::new(guard));
        self
    }

    /// Runs `check` after the case passed, while the backend is still alive: a
    /// backend-specific look for leftovers. It panics to fail the test.
    pub fn check_after(mut self, check: impl FnOnce() + Send + 'static) -> Self {
        self.checks.push(Box::new(check));
        self
    }

    /// The backend.
    pub fn backend(&self) -> &SharedBackend {
        &self.backend
    }
}

/// Runs one case as [`conformance_tests!`](crate::conformance_tests) does: on a fresh
/// multi-threaded runtime, over a fresh fixture from `setup`. Sandboxes the case left
/// behind are destroyed and fail the test.
///
/// `setup` answers a [`Fixture`], or an `Option<Fixture>` that is `None` where this
/// machine lacks what the backend needs; the set-up says so through
/// [`require_or_skip`](crate::testing::require_or_skip), which fails instead where CI
/// requires it.
///
/// # Panics
///
/// When the case fails, when it leaves a sandbox behind, or when a check fails: this is
/// the body of a test.
pub fn run_case<S, Fut>(name: &str, setup: S, case: for<'a> fn(&'a SharedBackend) -> CaseFuture<'a>)
where
    S: FnOnce() -> Fut,
    Fut: Future,
    Fut::Output: Into<Option<Fixture>>,
{
    #[allow(clippy::expect_used)] // a test without a runtime cannot run at all
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime for the case");
    runtime.block_on(async move {
        let Some(Fixture {
            backend,
            checks,
            guards,
        }) = setup().await.into()
        else {
            return;
        };
        eprintln!("conformance[{}]: {name}", backend.name());
        let run = uuid::Uuid::new_v4().simple().to_string();
        let outcome = AssertUnwindSafe(CASE_RUN.scope(run.clone(), case(&backend)))
            .catch_unwind()
            .await;
        let selector = LabelSelector::new().label(CASE_LABEL, &run);
        let left = match backend.list(&selector).await {
            Ok(left) => left,
            Err(e) if outcome.is_err() => {
                eprintln!(
                    "conformance[{}]: {name}: listing leftovers failed: {e}",
                    backend.name()
                );
                Vec::new()
            }
            Err(e) => panic!("{name}: listing what the case left failed: {e}"),
        };
        for info in &left {
            let _ = backend.destroy(&info.id).await;
        }
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
        assert!(
            left.is_empty(),
            "{name} left sandboxes behind: {:?}",
            left.iter().map(|i| i.id.as_str()).collect::<Vec<_>>()
        );
        for check in checks {
            check();
        }
        drop(backend);
        drop(guards);
    });
}
