//! Preparing images: pull, build, multi-stage build, import, and the agent layer on
//! top. Each image is prepared once per backend; concurrent requests share one job.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use bollard::query_parameters::{
    BuildImageOptions, CommitContainerOptions, CreateContainerOptions, CreateImageOptions,
    RemoveContainerOptions, UploadToContainerOptions,
};
use bollard::Docker;
use futures::future::{BoxFuture, FutureExt, Shared};
use futures::StreamExt;
use sandcell::{Error, ErrorKind, Result};

use crate::config::{BuildStage, ImageProgress, ImageSpec, ProgressFn, PullPolicy};
use crate::error::engine;

/// Label recording a build stage's cache key.
const CACHE_KEY_LABEL: &str = "sandcell.cache_key";
/// Where the agent lives in a container, and its runtime directory (socket, state).
pub(crate) const AGENT_PATH: &str = "/.sandcell/agent";
pub(crate) const AGENT_RUN_DIR: &str = "/.sandcell/run";

type Job = Shared<BoxFuture<'static, std::result::Result<String, (ErrorKind, String)>>>;

/// Prepares images, one job per image however many callers ask at once.
pub(crate) struct Images {
    docker: Docker,
    progress: Option<ProgressFn>,
    jobs: Mutex<HashMap<String, Job>>,
}

impl Images {
    pub(crate) fn new(docker: Docker, progress: Option<ProgressFn>) -> Self {
        Images {
            docker,
            progress,
            jobs: Mutex::new(HashMap::new()),
        }
    }

    /// Runs `make` once for `key`: later and concurrent callers get its result. A
    /// failure is forgotten, so the next call tries again.
    async fn once<F>(&self, key: String, make: F) -> Result<String>
    where
        F: FnOnce() -> BoxFuture<'static, Result<String>>,
    {
        let job = {
            let mut jobs = crate::lock(&self.jobs);
            jobs.entry(key.clone())
                .or_insert_with(|| {
                    make()
                        .map(|r| r.map_err(|e| (e.kind(), e.to_string())))
                        .boxed()
                        .shared()
                })
                .clone()
        };
        match job.await {
            Ok(image) => Ok(image),
            Err((kind, message)) => {
                crate::lock(&self.jobs).remove(&key);
                Err(Error::new(kind, message))
            }
        }
    }

    /// The image of a template, prepared if needed.
    pub(crate) async fn prepare(&self, spec: &ImageSpec) -> Result<String> {
        let key = serde_json::to_string(spec).unwrap_or_else(|_| spec.reference().to_owned());
        let (docker, progress, spec) = (self.docker.clone(), self.progress.clone(), spec.clone());
        self.once(key, move || {
            async move {
                let job = Preparation { docker, progress };
                job.prepare(&spec).await?;
                Ok(spec.reference().to_owned())
            }
            .boxed()
        })
        .await
    }

    /// `base` with what every sandbox of it needs baked in as one committed layer: the
    /// workspace directory owned by the user commands run as, the agent's run
    /// directory, and the agent binary when there is one. Prepared once per
    /// (image, layer); creating a sandbox then needs no per-container setup call.
    pub(crate) async fn derive(&self, base: &str, layer: &Layer) -> Result<String> {
        let key = format!("derive:{base}:{}", layer.key());
        let (docker, base, layer) = (self.docker.clone(), base.to_owned(), layer.clone());
        self.once(key, move || {
            async move { derive(&docker, &base, &layer).await }.boxed()
        })
        .await
    }
}

/// What [`Images::derive`] adds to an image.
#[derive(Debug, Clone)]
pub(crate) struct Layer {
    /// The agent binary and its sha256.
    pub(crate) agent: Option<(PathBuf, String)>,
    /// The user commands run as (`None`: the image's).
    pub(crate) user: Option<String>,
    /// The workspace directory.
    pub(crate) workspace: String,
}

impl Layer {
    /// A short stable digest of the layer's inputs, for image tags and job keys.
    fn key(&self) -> String {
        use sha2::{Digest, Sha256};
        let mut h = Sha256::new();
        if let Some((_, hash)) = &self.agent {
            h.update(hash.as_bytes());
        }
        h.update(b"\0");
        h.update(self.user.as_deref().unwrap_or("").as_bytes());
        h.update(b"\0");
        h.update(self.workspace.as_bytes());
        hex::encode(&h.finalize()[..6])
    }
}

/// One preparation job.
struct Preparation {
    docker: Docker,
    progress: Option<ProgressFn>,
}

impl Preparation {
    fn report(&self, image: &str, message: &str) {
        let message = message.trim();
        if message.is_empty() {
            return;
        }
        tracing::info!(image, message, "preparing image");
        if let Some(progress) = &self.progress {
            progress(&ImageProgress {
                image: image.to_owned(),
                message: message.to_owned(),
            });
        }
    }

    async fn prepare(&self, spec: &ImageSpec) -> Result<()> {
        match spec {
            ImageSpec::Pull { reference, policy } => self.pull(reference, *policy).await,
            ImageSpec::Build(stage) => self.build(stage).await,
            ImageSpec::MultiStage { stages } => {
                for stage in stages {
                    self.build(stage).await?;
                }
                Ok(())
            }
            ImageSpec::Import { source, tag } => self.import(source, tag).await,
            #[allow(unreachable_patterns)]
            _ => Err(Error::unsupported("this image spec is not supported")),
        }
    }

    async fn exists(&self, reference: &str) -> Result<Option<bollard::models::ImageInspect>> {
        match self.docker.inspect_image(reference).await {
            Ok(image) => Ok(Some(image)),
            Err(e) if crate::error::is_not_found(&e) => Ok(None),
            Err(e) => Err(engine(format_args!("inspecting image {reference}"), e)),
        }
    }

    async fn pull(&self, reference: &str, policy: PullPolicy) -> Result<()> {
        if policy != PullPolicy::Always && self.exists(reference).await?.is_some() {
            return Ok(());
        }
        if policy == PullPolicy::Never {
            return Err(Error::not_found(format!(
                "image {reference} is not on the engine and the pull policy is never"
            )));
        }
        let (repo, tag) = split_reference(reference);
        let options = CreateImageOptions {
            from_image: Some(repo.to_owned()),
            tag: Some(tag.to_owned()),
            ..Default::default()
        };
        let mut stream = self.docker.create_image(Some(options), None, None);
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| engine(format_args!("pulling image {reference}"), e))?;
            if let Some(status) = info.status {
                self.report(reference, &status);
            }
        }
        Ok(())
    }

    async fn build(&self, stage: &BuildStage) -> Result<()> {
        if let Some(key) = &stage.cache_key {
            let cached = self.exists(&stage.tag).await?.and_then(|image| {
                image
                    .config
                    .and_then(|c| c.labels)
                    .and_then(|labels| labels.get(CACHE_KEY_LABEL).cloned())
            });
            if cached.as_deref() == Some(key.as_str()) {
                self.report(&stage.tag, "cached");
                return Ok(());
            }
        }
        let context = stage.context.clone();
        let tar = tokio::task::spawn_blocking(move || tar_directory(&context))
            .await
            .map_err(|e| {
                Error::new(ErrorKind::Backend, format!("packing a build context: {e}"))
            })??;
        let mut labels = HashMap::new();
        if let Some(key) = &stage.cache_key {
            labels.insert(CACHE_KEY_LABEL.to_owned(), key.clone());
        }
        let options = BuildImageOptions {
            dockerfile: stage
                .dockerfile
                .as_ref()
                .map(|d| d.to_string_lossy().into_owned())
                .unwrap_or_else(|| "Dockerfile".to_owned()),
            t: Some(stage.tag.clone()),
            rm: true,
            forcerm: true,
            buildargs: Some(stage.build_args.clone().into_iter().collect()),
            labels: Some(labels),
            ..Default::default()
        };
        let mut stream =
            self.docker
                .build_image(options, None, Some(bollard::body_full(tar.into())));
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| engine(format_args!("building image {}", stage.tag), e))?;
            if let Some(error) = info.error_detail.and_then(|d| d.message) {
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!("building image {}: {error}", stage.tag),
                ));
            }
            if let Some(line) = info.stream {
                self.report(&stage.tag, &line);
            }
        }
        Ok(())
    }

    async fn import(&self, source: &Path, tag: &str) -> Result<()> {
        let source_path = source.to_path_buf();
        let tar = tokio::task::spawn_blocking(move || -> Result<Vec<u8>> {
            if source_path.is_dir() {
                tar_directory(&source_path)
            } else {
                std::fs::read(&source_path)
                    .map_err(|e| Error::io(format_args!("reading {}", source_path.display()), e))
            }
        })
        .await
        .map_err(|e| Error::new(ErrorKind::Backend, format!("reading an import source: {e}")))??;
        let (repo, version) = split_reference(tag);
        let options = CreateImageOptions {
            from_src: Some("-".to_owned()),
            repo: Some(repo.to_owned()),
            tag: Some(version.to_owned()),
            ..Default::default()
        };
        let mut stream =
            self.docker
                .create_image(Some(options), Some(bollard::body_full(tar.into())), None);
        while let Some(item) = stream.next().await {
            let info = item.map_err(|e| engine(format_args!("importing image {tag}"), e))?;
            if let Some(status) = info.status {
                self.report(tag, &status);
            }
        }
        self.report(tag, "imported");
        Ok(())
    }
}

/// `repo:tag` split at the tag's colon (not a registry port's); `latest` if none.
fn split_reference(reference: &str) -> (&str, &str) {
    match reference.rfind(':') {
        Some(i) if !reference[i..].contains('/') => (&reference[..i], &reference[i + 1..]),
        _ => (reference, "latest"),
    }
}

/// A faithful tar of a directory (build contexts, root file systems): modes, setuid bits
/// and symlinks as they are. Not `sandcell::raw::archive::pack_dir_tar`, which masks modes for sandbox
/// content and would break a root file system's setuid programs.
fn tar_directory(dir: &Path) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    builder
        .append_dir_all(".", dir)
        .map_err(|e| Error::io(format_args!("packing {}", dir.display()), e))?;
    builder
        .into_inner()
        .map_err(|e| Error::io(format_args!("packing {}", dir.display()), e))
}

/// Commits `base` plus `layer` as a new image, named after both so it is made once.
async fn derive(docker: &Docker, base: &str, layer: &Layer) -> Result<String> {
    let base_id = docker
        .inspect_image(base)
        .await
        .map_err(|e| engine(format_args!("inspecting image {base}"), e))?
        .id
        .unwrap_or_default();
    let base_short: String = base_id
        .trim_start_matches("sha256:")
        .chars()
        .take(12)
        .collect();
    let tag = format!("sandcell-prepared:{base_short}-{}", layer.key());
    if docker.inspect_image(&tag).await.is_ok() {
        return Ok(tag);
    }
    // No labels: a commit copies them into the image, and so into every sandbox. A
    // crash mid-way leaves a stopped container named `sandcell-prepare-*`.
    let cmd = vec![AGENT_PATH.to_owned(), "serve".to_owned()];
    with_scratch_container(docker, "sandcell-prepare", base, cmd, |name| async move {
        let owner = crate::user::resolve(docker, &name, layer.user.as_deref()).await?;
        let layer = layer.clone();
        let tar = tokio::task::spawn_blocking(move || layer_tar(&layer, owner))
            .await
            .map_err(|e| {
                Error::new(ErrorKind::Backend, format!("packing the image layer: {e}"))
            })??;
        docker
            .upload_to_container(
                &name,
                Some(UploadToContainerOptions {
                    path: "/".to_owned(),
                    ..Default::default()
                }),
                bollard::body_full(tar.into()),
            )
            .await
            .map_err(|e| engine("adding sandcell's layer to the image", e))?;
        let (repo, version) = split_reference(&tag);
        docker
            .commit_container(
                CommitContainerOptions {
                    container: Some(name.clone()),
                    repo: Some(repo.to_owned()),
                    tag: Some(version.to_owned()),
                    pause: false,
                    ..Default::default()
                },
                bollard::models::ContainerConfig::default(),
            )
            .await
            .map_err(|e| engine("committing sandcell's layer", e))?;
        Ok(tag.clone())
    })
    .await
}

/// Runs `job` on a container of `image` that is created (named `prefix-<uuid>`, with
/// `cmd`), never started, and removed afterwards whatever `job` answered: for reading
/// or changing an image's file system through the engine's archive API.
pub(crate) async fn with_scratch_container<T, F, Fut>(
    docker: &Docker,
    prefix: &str,
    image: &str,
    cmd: Vec<String>,
    job: F,
) -> Result<T>
where
    F: FnOnce(String) -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let name = format!("{prefix}-{}", uuid::Uuid::new_v4().simple());
    let body = bollard::models::ContainerCreateBody {
        image: Some(image.to_owned()),
        cmd: Some(cmd),
        entrypoint: Some(Vec::new()),
        ..Default::default()
    };
    docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            body,
        )
        .await
        .map_err(|e| engine(format_args!("creating a scratch container of {image}"), e))?;
    let result = job(name.clone()).await;
    let _ = docker
        .remove_container(
            &name,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await;
    result
}

/// The layer as a tar to unpack at `/`: `.sandcell/` (0755), `.sandcell/run/` (1777, the
/// agent's socket and state), `.sandcell/agent` (0755) if any, and the workspace
/// directory (0755, owned by `owner`).
pub(crate) fn layer_tar(layer: &Layer, owner: (u32, u32)) -> Result<Vec<u8>> {
    let io = |e| Error::io("packing sandcell's image layer", e);
    let mut builder = tar::Builder::new(Vec::new());
    let dir =
        |path: &str, mode: u32, (uid, gid): (u32, u32), builder: &mut tar::Builder<Vec<u8>>| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(mode);
            header.set_uid(u64::from(uid));
            header.set_gid(u64::from(gid));
            header.set_size(0);
            header.set_mtime(0);
            builder.append_data(&mut header, path, std::io::empty())
        };
    dir(".sandcell/", 0o755, (0, 0), &mut builder).map_err(io)?;
    dir(".sandcell/run/", 0o1777, (0, 0), &mut builder).map_err(io)?;
    let workspace = layer.workspace.trim_matches('/');
    dir(&format!("{workspace}/"), 0o755, owner, &mut builder).map_err(io)?;
    if let Some((agent, _)) = &layer.agent {
        let binary = std::fs::read(agent)
            .map_err(|e| Error::io(format_args!("reading the agent {}", agent.display()), e))?;
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_mode(0o755);
        header.set_size(binary.len() as u64);
        header.set_mtime(0);
        builder
            .append_data(&mut header, ".sandcell/agent", binary.as_slice())
            .map_err(io)?;
    }
    builder.into_inner().map_err(io)
}
