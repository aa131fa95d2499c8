//! The manager over the data directory, and the sessions a command names.

use std::path::Path;

use sandcell::manager::{ShutdownPolicy, SnapshotRetention};
use sandcell::store::SessionRecord;
use sandcell::{ReleaseMode, SandboxBackend, SandboxManager, SessionKey};
use sandcell_local::LocalBackend;

use crate::args::{BackendKind, Cli, SessionCommand, StoreArgs};
use crate::error::CliError;
use crate::output::Progress;
use crate::templates::Templates;

/// The manager the CLI drives: any backend, boxed.
pub(crate) type Manager = SandboxManager<Box<dyn SandboxBackend>>;

/// The settings of a backend hosted elsewhere, from the flags (or their environment
/// variables).
pub(crate) enum Hosted {
    /// `--backend remote`.
    Remote(sandcell_remote::FlyConfig),
    /// `--backend e2b`.
    E2b(sandcell_remote::e2b::E2bConfig),
}

/// The hosted backend's settings, if `--backend` names one.
pub(crate) fn hosted_config(cli: &Cli) -> Result<Option<Hosted>, CliError> {
    match cli.backend {
        BackendKind::Remote => Ok(Some(Hosted::Remote(remote_config(cli)?))),
        BackendKind::E2b => Ok(Some(Hosted::E2b(e2b_config(cli)?))),
        BackendKind::Local | BackendKind::Docker => Ok(None),
    }
}

/// The e2b backend's settings, read as E2B's SDKs read theirs.
fn e2b_config(cli: &Cli) -> Result<sandcell_remote::e2b::E2bConfig, CliError> {
    let key = cli.e2b_api_key.clone().ok_or_else(|| {
        CliError::bad_input(
            "--backend e2b needs an API key",
            "set E2B_API_KEY (or pass --e2b-api-key KEY)",
        )
    })?;
    let mut config = sandcell_remote::e2b::E2bConfig::new(key);
    config.api_url = cli.e2b_api_url.clone();
    config.sandbox_url = cli.e2b_sandbox_url.clone();
    if let Some(domain) = &cli.e2b_domain {
        config.domain = domain.clone();
    }
    Ok(config)
}

/// The remote backend's settings from the flags (or their environment variables).
fn remote_config(cli: &Cli) -> Result<sandcell_remote::FlyConfig, CliError> {
    let url = cli.remote_url.clone().ok_or_else(|| {
        CliError::bad_input(
            "--backend remote needs the server's URL",
            "pass --remote-url URL (e.g. http://127.0.0.1:7711 for a local sandcell-server)",
        )
    })?;
    let token = cli.remote_token.clone().ok_or_else(|| {
        CliError::bad_input(
            "--backend remote needs an API token",
            "pass --remote-token TOKEN or set SANDCELL_REMOTE_TOKEN",
        )
    })?;
    Ok(sandcell_remote::FlyConfig::new(url, token))
}

/// Run as root, the local backend's sandboxes (at its default level, Landlock) run as
/// an unprivileged owner uid that reaches its workspace by host path, through the data
/// directory, and `build` refuses a root it cannot reach. So a private data directory
/// (created so here if missing) lets that uid's group pass through it (`0710`), which
/// lets no one else do anything new. A data directory others may already enter is
/// left as it is; so is everything for a user other than root.
fn let_sandbox_owner_pass(data_dir: &Path) -> Result<(), CliError> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    if !rustix::process::geteuid().is_root() {
        return Ok(());
    }
    let failed = |err: std::io::Error| {
        CliError::failure(
            format_args!(
                "cannot let sandboxes pass through {}: {err}",
                data_dir.display()
            ),
            "check the data directory's permissions",
        )
    };
    sandcell::raw::private_dir::create_private_dir_all(data_dir).map_err(failed)?;
    let meta = std::fs::symlink_metadata(data_dir).map_err(failed)?;
    if !meta.is_dir() || meta.uid() != 0 || meta.mode() & 0o077 != 0 {
        return Ok(());
    }
    let owner = sandcell_local::LocalConfig::default().sandbox_uid;
    std::os::unix::fs::lchown(data_dir, None, Some(owner)).map_err(failed)?;
    std::fs::set_permissions(data_dir, std::fs::Permissions::from_mode(0o710)).map_err(failed)
}

/// Opens the manager over the data directory. Sessions outlive the process: shutdown keeps
/// their sandboxes, and reconcile runs only in `gc`, where the user asked for it.
pub(crate) async fn open_manager(
    data_dir: &Path,
    stores: &StoreArgs,
    kind: BackendKind,
    hosted: Option<Hosted>,
    command: Option<&SessionCommand>,
) -> Result<Manager, CliError> {
    let templates = Templates::load(data_dir)?;
    let backend: Box<dyn SandboxBackend> = match (kind, hosted) {
        (_, Some(Hosted::Remote(config))) => {
            Box::new(sandcell_remote::FlyBackend::connect(config).await?)
        }
        (_, Some(Hosted::E2b(config))) => {
            Box::new(sandcell_remote::e2b::E2bBackend::connect(config).await?)
        }
        (BackendKind::Docker, _) => {
            let mut docker = sandcell_docker::DockerBackend::builder()
                .from_env()
                .on_progress(|p| Progress::note(&format!("{} {}", p.image, p.message)));
            for (name, source) in templates.of(kind) {
                docker = docker.template(name.clone(), docker_image(&name, &source));
            }
            Box::new(docker.build()?)
        }
        _ => {
            let_sandbox_owner_pass(data_dir)?;
            let mut local = LocalBackend::builder().root(data_dir.join("local"));
            for (name, dir) in templates.of(kind) {
                local = local.template(name, dir);
            }
            Box::new(local.build()?)
        }
    };
    let mut builder = SandboxManager::builder(backend)
        .data_dir(data_dir)
        .shutdown_policy(ShutdownPolicy::Keep)
        .reconcile_on_start(false);
    if let Some(id) = &stores.manager_id {
        builder = builder.manager_id(id);
    }
    if let Some(url) = &stores.state {
        builder = builder.state_store(sandcell::store::open_state_store(url).await?);
    }
    if let Some(url) = &stores.snapshots {
        builder = builder.snapshot_store(sandcell::store::open_snapshot_store(url)?);
    }
    if let Some(SessionCommand::Gc {
        idle_timeout,
        keep_last,
    }) = command
    {
        if let Some(idle) = idle_timeout {
            builder = builder.idle_timeout(*idle);
        }
        if let Some(n) = keep_last {
            builder = builder.retention(SnapshotRetention::keep_all().keep_last(*n));
        }
    }
    Ok(builder.build().await?)
}

/// A Docker template's image: a directory is a build context, anything else a reference.
pub(crate) fn docker_image(name: &str, source: &str) -> sandcell_docker::ImageSpec {
    if Path::new(source).is_dir() {
        sandcell_docker::ImageSpec::build(source, format!("sandcell-cli/{name}:latest"))
    } else {
        sandcell_docker::ImageSpec::pull(source)
    }
}

/// A session on another backend is driven through that one; only `acquire` moves it.
pub(crate) fn same_backend(manager: &Manager, record: &SessionRecord) -> Result<(), CliError> {
    let here = manager.backend().name();
    if record.backend == here {
        return Ok(());
    }
    Err(CliError::bad_input(
        format_args!(
            "session {:?} lives on the {} backend, not {here}",
            record.key.session(),
            record.backend
        ),
        format_args!(
            "pass --backend {}, or move it here with `sandcell{} acquire {}`",
            record.backend,
            flag_of(here),
            record.key.session()
        ),
    ))
}

/// The `--backend` flag of a backend by its name, as a hint shows it.
fn flag_of(name: &str) -> String {
    if name == BackendKind::Local.name() {
        String::new()
    } else {
        format!(" --backend {name}")
    }
}

/// Readies a session on another backend for an acquire through `here`: a sandbox live
/// on a backend this host drives (local, Docker) is suspended there, so the acquire
/// restores its latest snapshot here; a suspended session needs nothing. A session live
/// on a hosted backend must be suspended with that backend's flags first.
pub(crate) async fn leave_backend(
    data_dir: &Path,
    stores: &StoreArgs,
    record: &SessionRecord,
    here: BackendKind,
) -> Result<(), CliError> {
    if record.backend == here.name() || !record.holds_sandbox() {
        return Ok(());
    }
    let key = &record.key;
    let from = match record.backend.as_str() {
        "local" => BackendKind::Local,
        "docker" => BackendKind::Docker,
        other => {
            return Err(CliError::bad_input(
                format_args!(
                    "session {:?} is live on the {other} backend, which this command cannot reach",
                    key.session()
                ),
                format_args!(
                    "suspend it there first (`sandcell{} suspend {}` with that backend's flags), then acquire it again",
                    flag_of(other),
                    key.session()
                ),
            ))
        }
    };
    let progress = Progress::start(format_args!("suspending {key} on {}", from.name()));
    let origin = open_manager(data_dir, stores, from, None, None).await?;
    origin.release(key, ReleaseMode::Suspend).await?;
    origin.shutdown().await;
    progress.finish();
    Ok(())
}

/// The session's record; an unknown session is bad input.
pub(crate) async fn known_session(
    manager: &Manager,
    key: &SessionKey,
) -> Result<SessionRecord, CliError> {
    let record = manager.session(key).await?.ok_or_else(|| {
        let tenant = if key.tenant() == "default" {
            String::new()
        } else {
            format!(" --tenant {}", key.tenant())
        };
        CliError::bad_input(
            format_args!(
                "unknown session {:?} of tenant {:?}",
                key.session(),
                key.tenant()
            ),
            format_args!(
                "start it with `sandcell acquire {}{tenant}`, or see `sandcell list`",
                key.session()
            ),
        )
    })?;
    same_backend(manager, &record)?;
    Ok(record)
}

/// The session's sandbox, restored or resumed if it was suspended.
pub(crate) async fn open_session(
    manager: &Manager,
    key: &SessionKey,
) -> Result<sandcell::SandboxHandle<Box<dyn SandboxBackend>>, CliError> {
    let record = known_session(manager, key).await?;
    let progress = (!record.is_live()).then(|| Progress::start(format_args!("restoring {key}")));
    let handle = manager.acquire(key, &record.spec).await?;
    if let Some(progress) = progress {
        progress.finish();
    }
    Ok(handle)
}
