//! E2B both ways: its two APIs as sandcell speaks them, the control plane's bodies
//! ([`api`]) and envd's messages with the Connect protocol's framing ([`envd`]), and
//! [`E2bBackend`], the provider that runs sandcell sandboxes on E2B (or on anything
//! speaking its APIs: sandcell-server answers both on its `e2b` routes).

pub mod api;
mod api_client;
mod backend;
mod config;
pub mod envd;
mod envd_client;
mod exec;
mod known;
pub mod network;

pub use backend::E2bBackend;
pub use config::E2bConfig;
