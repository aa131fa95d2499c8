//! Probes shared by the root crate's integration tests.

#![allow(dead_code)]

/// Whether `python3` runs here (the agent and web-server fixtures need it). Without it the
/// tests print why and skip, unless `SANDCELL_REQUIRE_PYTHON=1` (set by CI), where a
/// missing interpreter fails them.
pub(crate) fn python_available() -> bool {
    let ok = std::process::Command::new("python3")
        .arg("-V")
        .output()
        .is_ok_and(|o| o.status.success());
    sandcell::testing::require_or_skip(
        "PYTHON",
        "python3",
        ok.then_some(()).ok_or_else(|| "it does not run".to_owned()),
    )
}
