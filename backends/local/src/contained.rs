//! Host-side file operations contained beneath a workspace directory.
