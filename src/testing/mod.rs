//! The testing kit (feature `testing`): [`MockBackend`], the conformance suite, and a
//! raw tar builder for hostile archives.
//!
//! A backend's `tests/conformance.rs` is a few lines: a set-up answering a fresh
//! backend, and [`conformance_tests!`](crate::conformance_tests), which makes one test
//! per case of it:
//!
//! ```no_run
//! use sandcell::testing::{conformance::Fixture, MockBackend};
//!
//! async fn setup() -> Fixture {
//!     Fixture::new(MockBackend::new())
//! }
//! sandcell::conformance_tests!(setup);
//! # fn main() {}
//! ```
//!
//! For a quick check on one backend value, [`conformance::run_all`] runs every case in
//! turn:
//!
//! ```
//! # async fn demo() {
//! let backend = sandcell::testing::MockBackend::new();
//! sandcell::testing::conformance::run_all(&backend).await;
//! # }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo());
//! ```
//!
//! The suite creates sandboxes from the template `"default"` (which may hold files; cases
//! work in directories of their own), labels them `sandcell.test=conformance`, and
//! destroys them even when a case fails.

// This module is a test kit: a failed expectation is reported by panicking, like `assert!`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod capability_table;
pub mod conformance;
pub mod egress;
pub mod fuzz;
mod hostile;
pub mod measure;
mod mock;
pub mod outside;
pub mod portable;
mod require;
pub mod stores;
mod tar_builder;
mod wire_loop;

pub use capability_table::check_capability_table;
pub use hostile::{hostile_archives, HostileArchive};
pub use mock::{MockBackend, MockCall, MockReply};
pub use require::{require_env, require_or_skip};
pub use tar_builder::RawTar;
pub use wire_loop::WireLoop;
