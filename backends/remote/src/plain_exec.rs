//! Commands and scripts on a plain Fly endpoint, whose exec has no working directory,
//! environment or "program not found": the wrapper every command runs inside, and the
//! typed failures (`MARKER:kind:message`, exit 90) it and the file scripts print.

use sandcell::{Error, ErrorKind};

/// The exit code a script ends with after printing a typed error.
const TYPED_FAILURE: i32 = 90;

/// What a command runs inside on a plain endpoint, whose exec has no cwd, env or
/// "program not found": `$1` is the marker typed failures carry, `$2` the directory,
/// `$3` `base64` when stdin comes encoded, `$4` how many `NAME=value` words follow,
/// then the command.
const COMMAND: &str = include_str!("scripts/command.sh");

/// A command as a plain endpoint runs it.
pub(crate) struct Wrapped {
    /// The argv of the exec call.
    pub(crate) argv: Vec<String>,
    /// The marker its typed failures carry (random, so no command's own output is
    /// mistaken for one).
    pub(crate) marker: String,
    /// The exec call's stdin text: the request's stdin as it is when it is UTF-8,
    /// base64 (decoded by the wrapper) when it is not.
    pub(crate) stdin: Option<String>,
}

/// How a plain endpoint runs `request`. `workspace` is the directory relative paths
/// start from (empty: where commands start).
pub(crate) fn wrap_command(request: &sandcell::ExecRequest, workspace: &str) -> Wrapped {
    use base64::Engine as _;
    let marker = format!("sandcell-{}", uuid::Uuid::new_v4().simple());
    let dir = match (&request.cwd, workspace) {
        (None, "") => String::new(),
        (None, root) => root.to_owned(),
        (Some(cwd), "") => format!("./{}", cwd.as_str()),
        (Some(cwd), root) => format!("{root}/{}", cwd.as_str()),
    };
    let (stdin, encoding) = match request.stdin.as_deref().map(std::str::from_utf8) {
        None => (None, ""),
        Some(Ok(text)) => (Some(text.to_owned()), ""),
        Some(Err(_)) => {
            let bytes = request.stdin.as_deref().unwrap_or_default();
            let text = base64::engine::general_purpose::STANDARD.encode(bytes);
            (Some(text), "base64")
        }
    };
    let mut argv = vec![
        "sh".to_owned(),
        "-c".to_owned(),
        COMMAND.to_owned(),
        "sandcell".to_owned(),
        marker.clone(),
        dir,
        encoding.to_owned(),
        request.env.len().to_string(),
    ];
    argv.extend(request.env.iter().map(|(k, v)| format!("{k}={v}")));
    argv.extend(request.argv.iter().cloned());
    Wrapped {
        argv,
        marker,
        stdin,
    }
}

/// Refuses an answer whose output the endpoint could not carry: its exec answers text,
/// and bytes that are not UTF-8 arrive replaced by U+FFFD. Corrupt output is never
/// passed on as the command's; binary output belongs in a file (`read` carries bytes).
pub(crate) fn check_text_output(stdout: &str, stderr: &str, what: &str) -> sandcell::Result<()> {
    for (name, text) in [("stdout", stdout), ("stderr", stderr)] {
        if text.contains(char::REPLACEMENT_CHARACTER) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "{what}: its {name} is not UTF-8 text (the endpoint answered U+FFFD), \
                     which a plain Fly endpoint's exec cannot carry; write binary output \
                     to a file and read that"
                ),
            ));
        }
    }
    Ok(())
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
