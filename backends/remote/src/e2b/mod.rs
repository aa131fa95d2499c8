//! E2B's two APIs as sandcell speaks them: the control plane's bodies ([`api`]) and
//! envd's messages with the Connect protocol's framing ([`envd`]). sandcell-server
//! answers both (its `e2b` routes); the E2B provider sends them.

pub mod api;
pub mod envd;
