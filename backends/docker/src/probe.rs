//! What a prepared image offers that capabilities report: whether `python3` is on its
//! `PATH`, read from the file system of a created, never started, container.

use bollard::query_parameters::ContainerArchiveInfoOptions;
use bollard::Docker;
use sandcell::Result;

use crate::error::engine;

/// The `PATH` an image without one gets (Docker's default).
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How many symbolic links a lookup follows before giving up.
const MAX_LINKS: usize = 8;

/// Whether an executable `python3` is in one of `image`'s `PATH` directories.
pub(crate) async fn has_python(docker: &Docker, image: &str) -> Result<bool> {
    let inspect = docker
        .inspect_image(image)
        .await
        .map_err(|e| engine(format_args!("inspecting image {image}"), e))?;
    let path = inspect
        .config
        .and_then(|c| c.env)
        .unwrap_or_default()
        .iter()
        .find_map(|var| var.strip_prefix("PATH=").map(str::to_owned))
        .unwrap_or_else(|| DEFAULT_PATH.to_owned());
    // Never started: the command only has to be there for the create.
    let cmd = vec!["python3".to_owned()];
    crate::image::with_scratch_container(docker, "sandcell-probe", image, cmd, |name| async move {
        for dir in path.split(':').filter(|d| d.starts_with('/')) {
            if is_executable(docker, &name, &format!("{dir}/python3")).await {
                return Ok(true);
            }
        }
        Ok(false)
    })
    .await
}

/// Whether `path` in `container` is (or links to) a file someone may execute.
async fn is_executable(docker: &Docker, container: &str, path: &str) -> bool {
    let mut path = path.to_owned();
    for _ in 0..MAX_LINKS {
        let options = ContainerArchiveInfoOptions { path: path.clone() };
        let Ok(stat) = docker
            .get_container_archive_info(container, Some(options))
            .await
        else {
            return false;
        };
        // Go's FileMode: type bits at the top (directory 1 << 31, symlink 1 << 27),
        // permissions at the bottom. Docker names a link's target only for links;
        // Podman names every path's resolved target, itself for a file.
        let is_link = stat.file_mode & (1 << 27) != 0;
        if !is_link || stat.link_target.is_empty() {
            let is_dir = stat.file_mode & (1 << 31) != 0;
            return !is_dir && stat.file_mode & 0o111 != 0;
        }
        path = if stat.link_target.starts_with('/') {
            stat.link_target
        } else {
            let dir = path.rsplit_once('/').map_or("", |(dir, _)| dir);
            format!("{dir}/{}", stat.link_target)
        };
    }
    false
}
