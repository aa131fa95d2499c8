//! Commands and scripts on a plain Fly endpoint, whose exec has no working directory,
//! environment or "program not found": the wrapper every command runs inside, and the
//! typed failures (`MARKER:kind:message`, exit 90) it and the file scripts print.

use sandcell::{Error, ErrorKind};

/// The exit code a script ends with after printing a typed error.
const TYPED_FAILURE: i32 = 90;

/// What a command runs inside on a plain endpoint, whose exec has no cwd, env or
/// "program not found": `$1` is the marker typed failures carry, `$2` the directory,
/// `$3` how many `NAME=value` words follow, then the command.
const COMMAND: &str = include_str!("scripts/command.sh");

/// The argv a plain endpoint runs for `request`, and the marker its typed failures
/// carry (random, so no command's own output is mistaken for one). `workspace` is the
/// directory relative paths start from (empty: where commands start).
pub(crate) fn wrap_command(
    request: &sandcell::ExecRequest,
    workspace: &str,
) -> (Vec<String>, String) {
    let marker = format!("sandcell-{}", uuid::Uuid::new_v4().simple());
    let dir = match (&request.cwd, workspace) {
        (None, "") => String::new(),
        (None, root) => root.to_owned(),
        (Some(cwd), "") => format!("./{}", cwd.as_str()),
        (Some(cwd), root) => format!("{root}/{}", cwd.as_str()),
    };
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        COMMAND.to_owned(),
        "sandcell".to_owned(),
        marker.clone(),
        dir,
        request.env.len().to_string(),
    ];
    argv.extend(request.env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend(request.argv.iter().cloned());
    (argv, marker)
}

/// The typed error a script printed (`MARKER:kind:message` on stderr, exit 90).
pub(crate) fn typed_failure(
    exit_code: Option<i32>,
    stderr: &str,
    marker: &str,
    what: &str,
) -> Option<Error> {
    if exit_code != Some(TYPED_FAILURE) {
        return None;
    }
    let (kind, message) = stderr
        .lines()
        .rev()
        .find_map(|line| line.strip_prefix(marker)?.strip_prefix(':'))?
        .split_once(':')?;
    Some(Error::new(
        ErrorKind::from_name(kind)?,
        format!("{what}: {message}"),
    ))
}
