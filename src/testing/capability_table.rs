//! [`check_capability_table`]: a backend crate's documented capability table held to
//! what its backend reports, so the docs cannot drift from
//! [`capabilities`](crate::SandboxBackend::capabilities).

use crate::Capabilities;

/// Checks the capability table in `source` (a crate's `lib.rs`, its `//!` docs read;
/// other lines ignored) against `caps`, in the column headed `column`.
///
/// The table has a row per [`Capabilities`] field (or per few, alike), the field's name
/// in backticks in the first cell: `` | `pause` | yes (the cgroup freezer) | ``, or
/// `` | `cpu_limit`, `memory_limit` | where cgroups are writable | ``. A cell that starts with
/// `yes` claims the capability, one that starts with `no` denies it, and any other text
/// (the conditions it depends on) is not checked. Every field must have exactly one
/// row, and every row must name a field; the first mismatch is the error.
///
/// ```
/// use sandcell::testing::check_capability_table;
///
/// let mut caps = sandcell::Capabilities::none();
/// caps.pause = true;
/// let mut doc = String::from("//! | capability | mine |\n//! |---|---|\n");
/// for (field, _) in serde_json::to_value(caps).unwrap().as_object().unwrap() {
///     let claim = if field == "pause" { "yes" } else { "no" };
///     doc.push_str(&format!("//! | `{field}` | {claim} |\n"));
/// }
/// check_capability_table(&doc, "mine", &caps).unwrap();
/// caps.pause = false;
/// assert!(check_capability_table(&doc, "mine", &caps).is_err());
/// ```
pub fn check_capability_table(
    source: &str,
    column: &str,
    caps: &Capabilities,
) -> Result<(), String> {
    let fields = match serde_json::to_value(caps) {
        Ok(serde_json::Value::Object(fields)) => fields,
        _ => return Err("capabilities do not serialize as an object".to_owned()),
    };
    // The doc lines, each split into cells where it is a table row.
    let lines: Vec<Option<Vec<String>>> = source
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("//!"))
        .map(str::trim)
        .map(|line| {
            line.starts_with('|').then(|| {
                line.trim_matches('|')
                    .split('|')
                    .map(|cell| cell.trim().to_owned())
                    .collect()
            })
        })
        .collect();
    // The table is the one whose header has the column; its rows run to its end.
    let (start, index) = lines
        .iter()
        .enumerate()
        .find_map(|(at, row)| {
            let index = row.as_ref()?.iter().position(|cell| cell == column)?;
            Some((at, index))
        })
        .ok_or_else(|| format!("no capability table has a column {column:?}"))?;
    let rows: Vec<&Vec<String>> = lines[start + 1..]
        .iter()
        .map_while(Option::as_ref)
        .collect();
    let mut seen = std::collections::BTreeSet::new();
    let named = rows.into_iter().flat_map(|row| {
        let names: Vec<&str> = match row.first() {
            Some(cell) if cell.starts_with('`') => cell
                .split(',')
                .filter_map(|name| name.trim().strip_prefix('`')?.strip_suffix('`'))
                .collect(),
            _ => Vec::new(),
        };
        names.into_iter().map(move |name| (name, row))
    });
    for (name, row) in named {
        let Some(value) = fields.get(name) else {
            return Err(format!("the table lists {name:?}, which is no capability"));
        };
        if !seen.insert(name.to_owned()) {
            return Err(format!("the table lists {name:?} twice"));
        }
        let cell = row.get(index).map(String::as_str).unwrap_or_default();
        let claimed = value.as_bool().unwrap_or(false);
        let word = cell
            .split(|c: char| !c.is_ascii_alphabetic())
            .next()
            .unwrap_or_default()
            .to_ascii_lowercase();
        match word.as_str() {
            "yes" if !claimed => {
                return Err(format!(
                    "{column}: the table says yes to {name:?}, the backend no"
                ))
            }
            "no" if claimed => {
                return Err(format!(
                    "{column}: the table says no to {name:?}, the backend yes"
                ))
            }
            _ => {}
        }
    }
    let missing: Vec<&String> = fields.keys().filter(|f| !seen.contains(*f)).collect();
    if !missing.is_empty() {
        return Err(format!("{column}: the table leaves out {missing:?}"));
    }
    Ok(())
}
