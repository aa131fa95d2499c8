//! The wire protocol: one sandbox's operations over any byte stream, so a backend can
//! reach an agent running inside its sandbox (a container, a VM) over a single
//! persistent connection instead of paying for a control-plane round trip per command.
//!
//! [`serve`] runs on the agent's side over any [`SandboxBackend`](crate::SandboxBackend)
//! (in practice the local backend, inside the sandbox); [`WireClient`] runs on the
//! caller's side and offers every per-sandbox operation of the trait. Many requests share
//! the connection concurrently: a command's output streams while files are read.
//!
//! Frames are `u32` length, `u8` kind, `u64` request id, payload; calls and replies are
//! JSON, bulk data travels as raw chunks of at most 64 KiB. Flow control is per stream
//! and credit-based (1 MiB in flight), so a consumer that stops reading holds back its
//! producer without blocking other requests' frames from being routed. The client
//! trusts nothing the agent sends: frames over 1 MiB, unknown kinds, data beyond the
//! granted window or malformed JSON end the connection with an error.
//!
//! ```
//! # async fn demo() -> sandcell::Result<()> {
//! use std::sync::Arc;
//! use sandcell::raw::wire::{serve, WireClient};
//! use sandcell::{SandboxBackend, SandboxSpec};
//!
//! # #[cfg(feature = "testing")] {
//! let backend = Arc::new(sandcell::testing::MockBackend::new());
//! let sandbox = backend.create(&SandboxSpec::new("default")).await?;
//! let (agent_side, client_side) = tokio::io::duplex(64 * 1024);
//! let (agent_read, agent_write) = tokio::io::split(agent_side);
//! tokio::spawn(serve(backend, sandbox.id, agent_read, agent_write));
//! let (read, write) = tokio::io::split(client_side);
//! let client = WireClient::new(read, write);
//! client.write(&"hello.txt".parse()?, "hi".into()).await?;
//! assert_eq!(client.read(&"hello.txt".parse()?).await?, "hi");
//! # }
//! # Ok(()) }
//! # tokio::runtime::Runtime::new().unwrap().block_on(demo()).unwrap();
//! ```

mod client;
mod frame;
mod mux;
mod proto;
mod serve_options;
mod server;

pub use client::WireClient;
pub use server::{serve, serve_with, PublicErrors, ServeOptions};
