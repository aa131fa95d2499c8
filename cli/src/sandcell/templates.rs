//! The template registry kept in the data directory.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use sandcell::SandboxSpec;

use crate::args::BackendKind;
use crate::error::{error_chain, CliError};

/// Registered templates per backend, persisted as `templates.json` in the data directory:
/// `{"local": {name: dir}, "docker": {name: dir-or-image}}`.
#[derive(Debug, Default)]
pub(crate) struct Templates(BTreeMap<String, BTreeMap<String, String>>);

impl Templates {
    const FILE: &'static str = "templates.json";

    pub(crate) fn load(data_dir: &Path) -> Result<Self, CliError> {
        let path = data_dir.join(Self::FILE);
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Templates)
                .map_err(|err| {
                    CliError::failure(
                        format_args!("{} is not valid: {err}", path.display()),
                        "fix or delete it, then add the templates again",
                    )
                }),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Templates::default()),
            Err(err) => Err(CliError::failure(
                format_args!("cannot read {}: {err}", path.display()),
                "check the data directory's permissions",
            )),
        }
    }

    /// The templates of one backend.
    pub(crate) fn of(&self, backend: BackendKind) -> BTreeMap<String, String> {
        self.0.get(backend.name()).cloned().unwrap_or_default()
    }

    pub(crate) fn contains(&self, backend: BackendKind, name: &str) -> bool {
        // The local backend provides an empty "default" template unless one is registered;
        // a remote server knows its own templates (an unknown one fails the create).
        (backend == BackendKind::Local && name == "default")
            || matches!(backend, BackendKind::Remote | BackendKind::E2b)
            || self.of(backend).contains_key(name)
    }

    /// `Ok` if `backend` has template `name`; otherwise bad input with the command that
    /// registers it.
    pub(crate) fn require(
        data_dir: &Path,
        backend: BackendKind,
        name: &str,
    ) -> Result<(), CliError> {
        if Templates::load(data_dir)?.contains(backend, name) {
            return Ok(());
        }
        let source = if backend == BackendKind::Docker {
            "DIR|IMAGE"
        } else {
            "DIR"
        };
        Err(CliError::bad_input(
            format_args!("the {} backend has no template {name:?}", backend.name()),
            format_args!(
                "register it with `sandcell{} template add {name} {source}`",
                backend.flag()
            ),
        ))
    }

    /// Validates and records a template; returns the stored source (a canonical
    /// directory, or for Docker an image reference).
    pub(crate) fn add(
        data_dir: &Path,
        backend: BackendKind,
        name: &str,
        source: &Path,
    ) -> Result<String, CliError> {
        SandboxSpec::new(name).validate().map_err(|err| {
            CliError::bad_input(
                error_chain(&err),
                "use letters, digits, `.`, `_` and `-` in template names",
            )
        })?;
        let stored = match std::fs::canonicalize(source).ok().filter(|d| d.is_dir()) {
            Some(dir) => dir.to_string_lossy().into_owned(),
            // For Docker, a name that is not a directory is an image reference.
            None if backend == BackendKind::Docker && !source.as_os_str().is_empty() => {
                source.to_string_lossy().into_owned()
            }
            None => {
                return Err(CliError::bad_input(
                    format_args!("{} is not a directory", source.display()),
                    "give an existing host directory",
                ))
            }
        };
        let mut templates = Self::load(data_dir)?;
        templates
            .0
            .entry(backend.name().to_owned())
            .or_default()
            .insert(name.to_owned(), stored.clone());
        let io_err = |err: std::io::Error| {
            CliError::failure(
                format_args!("cannot write {}: {err}", data_dir.display()),
                "check the data directory's permissions",
            )
        };
        sandcell::raw::private_dir::create_private_dir_all(data_dir).map_err(io_err)?;
        // Temp file + rename: a crash never leaves a half-written registry.
        let mut file = tempfile::NamedTempFile::new_in(data_dir).map_err(io_err)?;
        let json = serde_json::to_vec_pretty(&templates.0)
            .map_err(|err| CliError::failure(err, "rerun with SANDCELL_LOG=debug for details"))?;
        file.write_all(&json).map_err(io_err)?;
        file.as_file().sync_all().map_err(io_err)?;
        file.persist(data_dir.join(Self::FILE))
            .map_err(|err| io_err(err.error))?;
        Ok(stored)
    }
}
