//! The host directories no answer of the server names: the ones its configuration
//! lists ([`ServerConfig::private_paths`](crate::ServerConfig::private_paths)), for
//! every router in the process (more cut out never hurts), and any process's
//! descriptors under `/proc`.

use std::path::PathBuf;
use std::sync::Mutex;

static PRIVATE: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// What a private path is answered as.
const CUT: &str = "<host path>";

/// Adds `paths` (and, where they resolve, their canonical forms) to those cut out.
pub(crate) fn register(paths: &[PathBuf]) {
    let mut private = crate::lock(&PRIVATE);
    for path in paths {
        let canonical = std::fs::canonicalize(path).ok();
        for form in std::iter::once(path.clone()).chain(canonical) {
            let text = form.to_string_lossy().trim_end_matches('/').to_owned();
            // The root would cut every absolute path, and a sandbox's path never is.
            if text.len() > 1 && !private.contains(&text) {
                private.push(text);
            }
        }
    }
    // Longest first, so a directory inside another is cut whole.
    private.sort_by_key(|p| std::cmp::Reverse(p.len()));
}

/// `message` with every private path, and everything after it up to the end of the
/// path, replaced by [`CUT`].
pub(crate) fn scrub(message: &str) -> String {
    let private = crate::lock(&PRIVATE).clone();
    let mut out = message.to_owned();
    for prefix in private.iter().map(String::as_str).chain(["/proc/"]) {
        out = cut(&out, prefix);
    }
    out
}

/// Cuts each path in `text` that starts with `prefix`.
fn cut(text: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        out.push_str(&rest[..at]);
        let path = &rest[at..];
        let end = path
            .find(|c: char| c.is_whitespace() || matches!(c, ':' | '"' | '\'' | ',' | ')'))
            .unwrap_or(path.len());
        out.push_str(CUT);
        rest = &path[end..];
    }
    out.push_str(rest);
    out
}
