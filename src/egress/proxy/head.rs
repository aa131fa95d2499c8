//! What the proxy reads of a client's request: its head, the target it names, and
//! the head it sends on.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::{Target, DENIED_HEADER, MAX_HEAD};

/// Reads up to the end of the request head; returns the head and what came after it.
pub(super) async fn read_head<S: AsyncRead + Unpin>(
    client: &mut S,
) -> std::io::Result<Option<(Vec<u8>, Vec<u8>)>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        if let Some(end) = find(&buf, b"\r\n\r\n") {
            let rest = buf.split_off(end + 4);
            return Ok(Some((buf, rest)));
        }
        if buf.len() > MAX_HEAD {
            return Ok(None);
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// A proxy request's head.
pub(super) struct Request {
    pub(super) connect: bool,
    pub(super) target: Target,
    method: String,
    /// The origin-form path of an absolute-form request.
    path: String,
    version: String,
    /// Header lines, without the request line.
    headers: Vec<String>,
}

impl Request {
    pub(super) fn parse(head: &[u8]) -> Result<Request, String> {
        let text = std::str::from_utf8(head).map_err(|_| "the request head is not UTF-8")?;
        let mut lines = text.split("\r\n").filter(|l| !l.is_empty());
        let line = lines.next().ok_or("the request line is missing")?;
        let mut parts = line.split(' ');
        let (Some(method), Some(uri), Some(version), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(format!("malformed request line {line:?}"));
        };
        if !version.starts_with("HTTP/1.") {
            return Err(format!("unsupported protocol version {version:?}"));
        }
        let headers = lines.map(str::to_owned).collect();
        if method.eq_ignore_ascii_case("CONNECT") {
            let target = authority(uri, None)?;
            return Ok(Request {
                connect: true,
                target,
                method: method.to_owned(),
                path: String::new(),
                version: version.to_owned(),
                headers,
            });
        }
        let Some(rest) = uri.strip_prefix("http://") else {
            return Err(if uri.starts_with("https://") {
                "use CONNECT for https: URLs".to_owned()
            } else {
                format!("{uri:?} is not an absolute http: URL; this is a proxy")
            });
        };
        let (authority_part, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/"),
        };
        if authority_part.contains('@') {
            return Err("credentials in the URL are not forwarded".to_owned());
        }
        Ok(Request {
            connect: false,
            target: authority(authority_part, Some(80))?,
            method: method.to_owned(),
            path: path.to_owned(),
            version: version.to_owned(),
            headers,
        })
    }

    /// The head to send upstream: origin form, without the proxy's own headers.
    pub(super) fn forwarded_head(&self) -> Vec<u8> {
        let mut out = format!("{} {} {}\r\n", self.method, self.path, self.version);
        for header in &self.headers {
            let name = header.split(':').next().unwrap_or("").trim();
            if name.eq_ignore_ascii_case("proxy-connection")
                || name.eq_ignore_ascii_case("proxy-authorization")
            {
                continue;
            }
            out.push_str(header);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        out.into_bytes()
    }
}

/// `host:port` (`[v6]:port`); the port may be left out where a default is given.
fn authority(text: &str, default_port: Option<u16>) -> Result<Target, String> {
    let bad = || format!("{text:?} is not host:port");
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']').ok_or_else(bad)?;
        (host, after.strip_prefix(':'))
    } else {
        match text.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (text, None),
        }
    };
    let port = match (port, default_port) {
        (Some(p), _) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(bad)?,
        (None, Some(p)) => p,
        (None, None) => return Err(bad()),
    };
    if host.is_empty() {
        return Err(bad());
    }
    Ok(Target {
        host: host.to_ascii_lowercase(),
        port,
    })
}

pub(super) async fn respond<S: AsyncWrite + Unpin>(
    client: &mut S,
    status: u16,
    why: &str,
) -> std::io::Result<()> {
    let reason = match status {
        400 => "Bad Request",
        403 => "Forbidden",
        _ => "Bad Gateway",
    };
    // One line, so it is a valid header value.
    let why = why.replace(['\r', '\n'], " ");
    let body = format!("sandcell egress proxy: {why}\n");
    let header = if status == 403 {
        format!("{DENIED_HEADER}: {why}\r\n")
    } else {
        String::new()
    };
    let response = format!(
        "HTTP/1.1 {status} {reason}\r\n{header}content-type: text/plain; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    client.write_all(response.as_bytes()).await?;
    client.shutdown().await
}
