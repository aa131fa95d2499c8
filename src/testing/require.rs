//! `require_or_skip`: the one rule for tests that need something outside the process.

/// Whether a test's outside need (an engine, a kernel feature, an interpreter) is met.
///
/// `probe` is `Ok` when it is. Otherwise the test skips loudly — `SKIPPED: <what> (<why>)`
/// on stderr and `false` — unless `SANDCELL_REQUIRE_<NEED>=1` is set (CI sets it for
/// everything it installs), where a missing need fails the test instead. `need` is the
/// upper-case suffix of that variable (`"DOCKER"`, `"OVERLAY"`, `"PYTHON"` ...).
///
/// ```
/// use sandcell::testing::require_or_skip;
/// assert!(require_or_skip("EXAMPLE", "a thing", Ok(())));
/// assert!(!require_or_skip("EXAMPLE", "a thing", Err("not here".to_owned())));
/// ```
///
/// # Panics
/// When the need is missing and `SANDCELL_REQUIRE_<NEED>=1`.
pub fn require_or_skip(need: &str, what: &str, probe: Result<(), String>) -> bool {
    let Err(why) = probe else {
        return true;
    };
    let variable = format!("SANDCELL_REQUIRE_{need}");
    if std::env::var(&variable).as_deref() == Ok("1") {
        panic!("{what} is required ({variable}=1) but unavailable: {why}");
    }
    eprintln!("SKIPPED: {what} is unavailable ({why}); set {variable}=1 to fail instead");
    false
}

/// The value of environment variable `variable` that names an outside service, as
/// [`require_or_skip`] decides for `need`: `None` (the test skips) when it is unset or
/// empty, unless `SANDCELL_REQUIRE_<NEED>=1`.
///
/// ```
/// let url = sandcell::testing::require_env("EXAMPLE", "SANDCELL_EXAMPLE_URL", "a service");
/// assert!(url.is_none());
/// ```
pub fn require_env(need: &str, variable: &str, what: &str) -> Option<String> {
    let value = std::env::var(variable).ok().filter(|v| !v.is_empty());
    let probe = match &value {
        Some(_) => Ok(()),
        None => Err(format!("{variable} is not set")),
    };
    require_or_skip(need, what, probe)
        .then_some(value)
        .flatten()
}
