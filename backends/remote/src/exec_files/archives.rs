//! Archives over exec: an export tarred on the machine into a temporary file and
//! downloaded in chunks, an import spooled and checked here, uploaded in chunks and
//! unpacked there.

use super::*;

impl ExecFiles {
    /// Exports `path` as a checked, normalized tar: downloaded in chunks into an
    /// anonymous local file, re-written by [`sandcell::raw::archive::normalize_tar`], then
    /// streamed from there.
    pub(crate) async fn export_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
    ) -> Result<ByteStream> {
        let what = format!("exporting {path}");
        let count = blocks(CHUNK_BYTES);
        let out = self
            .run(
                id,
                &what,
                EXPORT,
                &[path.as_str(), &temp_name("export"), "0", &count.to_string()],
                None,
            )
            .await?;
        let mut lines = out.splitn(3, '\n');
        let (Some(remote), Some(size), body) = (lines.next(), lines.next(), lines.next()) else {
            return Err(malformed(&what, &out));
        };
        let remote = remote.to_owned();
        let size: usize = size.trim().parse().map_err(|_| malformed(&what, &out))?;
        let download = self
            .download(id, &what, &remote, size, decode(body.unwrap_or(""), &what)?)
            .await;
        if download.is_err() && size > CHUNK_BYTES {
            self.discard(id, &remote).await;
        }
        let mut raw = download?;
        raw.rewind()
            .map_err(|e| Error::io("rewinding the downloaded archive", e))?;
        // Normalized as it streams out: a hostile entry ends the stream with its error.
        let limits = sandcell::archive::ArchiveLimits::default();
        Ok(sandcell::raw::stream::writer_to_stream(move |out| {
            sandcell::raw::archive::normalize_tar(std::io::BufReader::new(raw), out, &limits)
                .map(drop)
        }))
    }

    /// Fetches the rest of a temporary file after its first chunk, into a local
    /// anonymous file; the last call removes the machine's copy.
    async fn download(
        &self,
        id: &SandboxId,
        what: &str,
        remote: &str,
        size: usize,
        first: Vec<u8>,
    ) -> Result<std::fs::File> {
        let mut local = local_temp()?;
        let mut got = first.len();
        local
            .write_all(&first)
            .map_err(|e| Error::io("spooling the archive", e))?;
        let count = blocks(CHUNK_BYTES).to_string();
        while got < size {
            let last = size - got <= CHUNK_BYTES;
            let skip = blocks(got).to_string();
            let args = [remote, &skip, &count, if last { "remove" } else { "keep" }];
            let out = self.run(id, what, CHUNK, &args, None).await?;
            let chunk = decode(&out, what)?;
            if chunk.is_empty() {
                return Err(Error::new(
                    ErrorKind::Backend,
                    format!("{what}: the archive on the machine ended early"),
                ));
            }
            got += chunk.len();
            local
                .write_all(&chunk)
                .map_err(|e| Error::io("spooling the archive", e))?;
        }
        Ok(local)
    }

    /// Imports: spools and checks the whole archive here (refusing it before the machine
    /// sees a byte), uploads the normalized tar in chunks, then unpacks it in one call.
    pub(crate) async fn import_tar(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        tar: ByteStream,
        options: ImportOptions,
    ) -> Result<()> {
        let what = format!("importing into {path}");
        let limits = options.limits;
        let mut spool = spool(tar, limits.max_stream_bytes()).await?;
        spool
            .rewind()
            .map_err(|e| Error::io("rewinding the archive", e))?;
        let mut checker = EntryChecker::new(limits);
        if options.mode != ImportMode::Replace {
            for link in self.symlinks(id, path, &what).await? {
                checker.assume_existing_symlink(link);
            }
        }
        let checked = tokio::task::spawn_blocking(move || -> Result<std::fs::File> {
            spool
                .rewind()
                .map_err(|e| Error::io("rewinding the archive", e))?;
            read_entries_with(
                checker,
                std::io::BufReader::new(&mut spool),
                &limits,
                &mut |_, contents: &mut dyn Read| {
                    std::io::copy(contents, &mut std::io::sink())
                        .map(drop)
                        .map_err(|e| Error::io("reading an archive entry", e))
                },
            )?;
            spool
                .rewind()
                .map_err(|e| Error::io("rewinding the archive", e))?;
            let mut out = local_temp()?;
            sandcell::raw::archive::normalize_tar(
                std::io::BufReader::new(spool),
                &mut out,
                &limits,
            )?;
            out.rewind()
                .map_err(|e| Error::io("rewinding the archive", e))?;
            Ok(out)
        })
        .await
        .map_err(|e| Error::with_source(ErrorKind::Backend, "checking the archive", e))??;

        let remote = self.upload(id, &what, checked).await?;
        let mode = match options.mode {
            ImportMode::Replace => "replace",
            _ => "merge",
        };
        let stage = temp_name("import-stage");
        // The script removes the upload whatever happens.
        self.run(
            id,
            &what,
            EXTRACT,
            &[path.as_str(), &remote, mode, &stage],
            None,
        )
        .await
        .map(drop)
    }

    /// The symlinks already under `path`, relative to it.
    async fn symlinks(
        &self,
        id: &SandboxId,
        path: &SandboxPath,
        what: &str,
    ) -> Result<Vec<SandboxPath>> {
        let out = self.run(id, what, SYMLINKS, &[path.as_str()], None).await?;
        let listed = decode(&out, what)?;
        Ok(listed
            .split(|b| *b == 0)
            .filter_map(|raw| std::str::from_utf8(raw).ok())
            .filter_map(|raw| SandboxPath::new(raw).ok())
            .filter(|p| !p.is_root())
            .collect())
    }

    /// Sends a local file to a new temporary file on the machine in chunks, answering
    /// its path there; after a failure nothing is left.
    async fn upload(&self, id: &SandboxId, what: &str, mut file: std::fs::File) -> Result<String> {
        let mut buffer = vec![0u8; CHUNK_BYTES];
        let filled = read_full(&mut file, &mut buffer)?;
        let out = self
            .run(
                id,
                what,
                UPLOAD,
                &[&temp_name("import"), "first"],
                Some(b64().encode(&buffer[..filled])),
            )
            .await?;
        let remote = out.trim_end_matches('\n').to_owned();
        let mut last = filled;
        while last == CHUNK_BYTES {
            let sent = match read_full(&mut file, &mut buffer) {
                Ok(0) => break,
                Ok(filled) => {
                    last = filled;
                    let chunk = Some(b64().encode(&buffer[..filled]));
                    self.run(id, what, UPLOAD, &[&remote, "append"], chunk)
                        .await
                }
                Err(e) => Err(e),
            };
            if let Err(e) = sent {
                self.discard(id, &remote).await;
                return Err(e);
            }
        }
        Ok(remote)
    }
}

/// Reads a caller's archive stream to its end into an anonymous local file (at most
/// `cap` bytes), so an error the stream raises, even at its very end, comes before
/// anything reaches the machine. Answers the file, positioned at its end.
async fn spool(mut tar: ByteStream, cap: u64) -> Result<std::fs::File> {
    let mut spool = local_temp()?;
    let mut spooled: u64 = 0;
    while let Some(chunk) = tar.next().await {
        let chunk = chunk?;
        spooled += chunk.len() as u64;
        if spooled > cap {
            return Err(Error::limit_exceeded(format!(
                "the archive is larger than {cap} bytes"
            )));
        }
        spool
            .write_all(&chunk)
            .map_err(|e| Error::io("spooling the archive", e))?;
    }
    Ok(spool)
}

/// An anonymous local file (gone when dropped, whatever happens).
fn local_temp() -> Result<std::fs::File> {
    tempfile::tempfile().map_err(|e| Error::io("creating a local temporary file", e))
}

/// Reads until `buffer` is full or the file ends.
fn read_full(file: &mut std::fs::File, buffer: &mut [u8]) -> Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        match file.read(&mut buffer[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Error::io("reading the archive", e)),
        }
    }
    Ok(filled)
}
