//! E2B paths and workspace paths: `/home/user` is the workspace.

use sandcell::{Error, Result, SandboxPath};

/// The E2B user's home: the sandbox's workspace.
pub(crate) const HOME: &str = "/home/user";

/// The workspace path an E2B path names: relative paths (and `~/...`) are relative to
/// the home, absolute ones must lie beneath it; anything else is `InvalidInput`.
pub(crate) fn to_workspace(path: &str) -> Result<SandboxPath> {
    let relative = if let Some(rest) = path.strip_prefix(HOME) {
        if !(rest.is_empty() || rest.starts_with('/')) {
            return Err(outside(path));
        }
        rest.trim_start_matches('/')
    } else if path == "~" {
        ""
    } else if let Some(rest) = path.strip_prefix("~/") {
        rest
    } else if path.starts_with('/') {
        return Err(outside(path));
    } else {
        path
    };
    SandboxPath::new(relative)
}

/// The E2B path of a workspace path.
pub(crate) fn to_e2b(path: &SandboxPath) -> String {
    if path.is_root() {
        HOME.to_owned()
    } else {
        format!("{HOME}/{}", path.as_str())
    }
}

fn outside(path: &str) -> Error {
    let shown: String = path.chars().take(200).collect();
    Error::invalid_input(format!(
        "path {shown:?} is outside {HOME}, the sandbox's workspace: sandcell serves files \
         beneath it only"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_home_is_the_workspace_and_nothing_else_is_reachable() {
        for (e2b, workspace) in [
            ("/home/user", ""),
            ("/home/user/", ""),
            ("/home/user/a/b.txt", "a/b.txt"),
            ("a//b/", "a/b"),
            ("~", ""),
            ("~/x", "x"),
            ("", ""),
        ] {
            assert_eq!(to_workspace(e2b).unwrap().as_str(), workspace, "{e2b}");
        }
        for refused in [
            "/etc/passwd",
            "/home/userx",
            "/home/user/../x",
            "../x",
            "/",
            "a\0b",
        ] {
            let err = to_workspace(refused).unwrap_err();
            assert_eq!(err.kind(), sandcell::ErrorKind::InvalidInput, "{refused}");
        }
        assert_eq!(to_e2b(&SandboxPath::new("a/b").unwrap()), "/home/user/a/b");
        assert_eq!(to_e2b(&SandboxPath::root()), "/home/user");
    }
}
