//! `SandboxPath`: a path inside a sandbox's workspace, validated once at parse time.
//!
//! Every file and archive operation takes a `SandboxPath`, so a backend never sees
//! an absolute path, a `..` component or a NUL byte. Parsing is lexical only; it cannot
//! know about symlinks inside the workspace, which is why backends still resolve paths
//! with containment (see the `# Behavior` lists on [`SandboxBackend`](crate::SandboxBackend)).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The longest single path component, in bytes (Linux `NAME_MAX`).
pub const MAX_NAME_LEN: usize = 255;
/// The longest whole path, in bytes (Linux `PATH_MAX` less the workspace prefix headroom).
pub const MAX_PATH_LEN: usize = 3072;

/// A normalized path relative to the workspace root.
///
/// Parsing accepts `a/b`, `./a//b/`, and `""` or `"."` for the root itself, and rejects
/// with [`ErrorKind::InvalidInput`](crate::ErrorKind::InvalidInput): absolute paths, any
/// `..` component, NUL bytes, components longer than [`MAX_NAME_LEN`] bytes and paths longer
/// than [`MAX_PATH_LEN`] bytes. The stored form has no `.` components, no repeated or
/// trailing slashes.
///
/// ```
/// use sandcell::{SandboxPath, ErrorKind};
///
/// let p: SandboxPath = "./src//main.rs".parse()?;
/// assert_eq!(p.as_str(), "src/main.rs");
/// assert_eq!(p.parent().unwrap().as_str(), "src");
/// assert_eq!(p.file_name(), Some("main.rs"));
///
/// let err = SandboxPath::new("../etc/passwd").unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::InvalidInput);
/// # Ok::<(), sandcell::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SandboxPath(String);

impl SandboxPath {
    /// Parses and normalizes `path`; see the type docs for what is rejected.
    pub fn new(path: &str) -> Result<Self> {
        let reject = |why: &str| {
            Error::invalid_input(format!(
                "invalid sandbox path {:?}: {why}",
                truncate_for_message(path)
            ))
        };
        if path.contains('\0') {
            return Err(reject("contains a NUL byte"));
        }
        if path.starts_with('/') {
            return Err(reject(
                "absolute paths are not allowed; paths are relative to the workspace root",
            ));
        }
        let mut out = String::with_capacity(path.len());
        for component in path.split('/') {
            match component {
                "" | "." => continue,
                ".." => return Err(reject("'..' components are not allowed")),
                name if name.len() > MAX_NAME_LEN => {
                    return Err(reject(&format!(
                        "a component is {} bytes long, the limit is {MAX_NAME_LEN}",
                        name.len()
                    )))
                }
                name => {
                    if !out.is_empty() {
                        out.push('/');
                    }
                    out.push_str(name);
                }
            }
        }
        if out.len() > MAX_PATH_LEN {
            return Err(reject(&format!(
                "the path is {} bytes long, the limit is {MAX_PATH_LEN}",
                out.len()
            )));
        }
        Ok(SandboxPath(out))
    }

    /// The workspace root itself.
    pub fn root() -> Self {
        SandboxPath(String::new())
    }

    /// Whether this is the workspace root.
    pub fn is_root(&self) -> bool {
        self.0.is_empty()
    }

    /// The normalized path; empty for the root.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The components, outermost first; none for the root.
    pub fn components(&self) -> impl DoubleEndedIterator<Item = &str> + '_ {
        self.0.split('/').filter(|c| !c.is_empty())
    }

    /// How many components deep the path is; 0 for the root.
    pub fn depth(&self) -> usize {
        self.components().count()
    }

    /// The last component; `None` for the root.
    pub fn file_name(&self) -> Option<&str> {
        self.components().next_back()
    }

    /// The containing directory; `None` for the root.
    pub fn parent(&self) -> Option<SandboxPath> {
        if self.is_root() {
            return None;
        }
        Some(match self.0.rfind('/') {
            Some(i) => SandboxPath(self.0[..i].to_owned()),
            None => SandboxPath::root(),
        })
    }

    /// Appends a relative path, validating it like [`SandboxPath::new`].
    pub fn join(&self, rest: &str) -> Result<SandboxPath> {
        if self.is_root() {
            return SandboxPath::new(rest);
        }
        SandboxPath::new(&format!("{}/{}", self.0, rest))
    }

    /// Whether `self` is `base` or lies inside it, compared by whole components
    /// (`a/bc` is not inside `a/b`).
    pub fn starts_with(&self, base: &SandboxPath) -> bool {
        base.is_root()
            || self.0 == base.0
            || (self.0.starts_with(&base.0) && self.0.as_bytes().get(base.0.len()) == Some(&b'/'))
    }

    /// This path relative to `base`, if it lies inside it.
    pub fn strip_prefix(&self, base: &SandboxPath) -> Option<SandboxPath> {
        if !self.starts_with(base) {
            return None;
        }
        if base.is_root() {
            return Some(self.clone());
        }
        let rest = self.0[base.0.len()..].trim_start_matches('/');
        Some(SandboxPath(rest.to_owned()))
    }

    /// The path as a relative `std::path::Path`, for joining onto a host directory.
    pub fn to_relative_path(&self) -> &std::path::Path {
        std::path::Path::new(&self.0)
    }
}

fn truncate_for_message(s: &str) -> &str {
    // Keep error messages readable when the path itself is the attack (megabyte names).
    match s.char_indices().nth(120) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

impl fmt::Debug for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for SandboxPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_root() {
            f.write_str(".")
        } else {
            f.write_str(&self.0)
        }
    }
}

impl FromStr for SandboxPath {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        SandboxPath::new(s)
    }
}

impl TryFrom<&str> for SandboxPath {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        SandboxPath::new(s)
    }
}

impl TryFrom<String> for SandboxPath {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        SandboxPath::new(&s)
    }
}

impl TryFrom<&String> for SandboxPath {
    type Error = Error;
    fn try_from(s: &String) -> Result<Self> {
        SandboxPath::new(s)
    }
}

impl TryFrom<&SandboxPath> for SandboxPath {
    type Error = Error;
    fn try_from(p: &SandboxPath) -> Result<Self> {
        Ok(p.clone())
    }
}

impl From<SandboxPath> for String {
    fn from(p: SandboxPath) -> String {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ErrorKind;

    #[test]
    fn normalizes() {
        assert_eq!(SandboxPath::new("a//b/./c/").unwrap().as_str(), "a/b/c");
        assert!(SandboxPath::new("").unwrap().is_root());
        assert!(SandboxPath::new("./.").unwrap().is_root());
        assert_eq!(SandboxPath::new("a..b/..c").unwrap().as_str(), "a..b/..c");
    }

    #[test]
    fn rejects_hostile_paths() {
        for bad in ["/etc/passwd", "a/../../b", "..", "a/\0b", "./../x"] {
            let err = SandboxPath::new(bad).unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        let long_name = "x".repeat(MAX_NAME_LEN + 1);
        assert_eq!(
            SandboxPath::new(&long_name).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
        let long_path = vec!["d".repeat(200); 20].join("/");
        assert_eq!(
            SandboxPath::new(&long_path).unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn prefix_checks_use_whole_components() {
        let base = SandboxPath::new("a/b").unwrap();
        assert!(SandboxPath::new("a/b/c").unwrap().starts_with(&base));
        assert!(SandboxPath::new("a/b").unwrap().starts_with(&base));
        assert!(!SandboxPath::new("a/bc").unwrap().starts_with(&base));
        assert_eq!(
            SandboxPath::new("a/b/c/d")
                .unwrap()
                .strip_prefix(&base)
                .unwrap()
                .as_str(),
            "c/d"
        );
        assert!(SandboxPath::new("a/bc")
            .unwrap()
            .strip_prefix(&base)
            .is_none());
    }

    #[test]
    fn serde_validates() {
        let ok: SandboxPath = serde_json::from_str("\"x/y\"").unwrap();
        assert_eq!(ok.as_str(), "x/y");
        assert!(serde_json::from_str::<SandboxPath>("\"/abs\"").is_err());
    }
}
