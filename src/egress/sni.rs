//! The server name a TLS client asks for, read from its first handshake record
//! without decrypting anything: the name the egress proxy checks inside a tunnel.

/// What the first bytes of a tunnel say about TLS.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Hello {
    /// Not a TLS handshake: some other protocol.
    NotTls,
    /// A handshake record whose end has not arrived yet.
    Incomplete,
    /// A ClientHello naming this server (lowercase).
    Name(String),
    /// A ClientHello without a server name (or one this reader cannot parse).
    Nameless,
}

/// The largest handshake record a client may send before it is refused: TLS records
/// carry at most 16 KiB of plaintext.
pub(crate) const MAX_RECORD: usize = 5 + (1 << 14);

/// Reads the server name from the start of a client's stream. Only the first record is
/// read: a ClientHello split over several records is `Nameless`.
pub(crate) fn client_hello(bytes: &[u8]) -> Hello {
    // Record: type 22 (handshake), version 3.x, length.
    match bytes {
        [] => return Hello::Incomplete,
        [22] | [22, 3] | [22, 3, _] | [22, 3, _, _] => return Hello::Incomplete,
        [22, 3, ..] => {}
        _ => return Hello::NotTls,
    }
    let len = usize::from(u16::from_be_bytes([bytes[3], bytes[4]]));
    if bytes.len() < 5 + len {
        return Hello::Incomplete;
    }
    parse_hello(&bytes[5..5 + len]).map_or(Hello::Nameless, Hello::Name)
}

/// A cursor over a byte slice whose reads fail past its end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }
    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }
    fn u16(&mut self) -> Option<usize> {
        self.take(2)
            .map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }
    fn u24(&mut self) -> Option<usize> {
        self.take(3)
            .map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }
}

fn parse_hello(record: &[u8]) -> Option<String> {
    let mut r = Reader(record);
    if r.u8()? != 1 {
        return None; // not a ClientHello
    }
    let len = r.u24()?;
    let mut hello = Reader(r.take(len)?);
    hello.take(2 + 32)?; // version, random
    let session = hello.u8()?;
    hello.take(session)?;
    let suites = hello.u16()?;
    hello.take(suites)?;
    let compressions = hello.u8()?;
    hello.take(compressions)?;
    let len = hello.u16()?;
    let mut extensions = Reader(hello.take(len)?);
    while !extensions.0.is_empty() {
        let kind = extensions.u16()?;
        let len = extensions.u16()?;
        let body = extensions.take(len)?;
        if kind != 0 {
            continue; // not server_name
        }
        let mut names = Reader(body);
        let len = names.u16()?;
        let mut list = Reader(names.take(len)?);
        while !list.0.is_empty() {
            let name_type = list.u8()?;
            let len = list.u16()?;
            let name = list.take(len)?;
            if name_type == 0 {
                return std::str::from_utf8(name)
                    .ok()
                    .map(|n| n.to_ascii_lowercase());
            }
        }
    }
    None
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A minimal ClientHello record naming `name` (or none).
    pub(crate) fn hello_for(name: Option<&str>) -> Vec<u8> {
        let mut extensions = Vec::new();
        if let Some(name) = name {
            let n = name.as_bytes();
            let mut list = vec![0u8];
            list.extend((n.len() as u16).to_be_bytes());
            list.extend(n);
            let mut body = (list.len() as u16).to_be_bytes().to_vec();
            body.extend(list);
            extensions.extend(0u16.to_be_bytes());
            extensions.extend((body.len() as u16).to_be_bytes());
            extensions.extend(body);
        }
        let mut hello = vec![3, 3];
        hello.extend([7u8; 32]);
        hello.push(0); // session id
        hello.extend([0, 2, 0x13, 0x01]); // one suite
        hello.extend([1, 0]); // null compression
        hello.extend((extensions.len() as u16).to_be_bytes());
        hello.extend(extensions);
        let mut handshake = vec![1];
        handshake.extend(&(hello.len() as u32).to_be_bytes()[1..]);
        handshake.extend(hello);
        let mut record = vec![22, 3, 1];
        record.extend((handshake.len() as u16).to_be_bytes());
        record.extend(handshake);
        record
    }

    #[test]
    fn the_server_name_is_read_from_a_client_hello() {
        let record = hello_for(Some("A.Test"));
        assert_eq!(client_hello(&record), Hello::Name("a.test".into()));
        assert_eq!(client_hello(&record[..record.len() - 1]), Hello::Incomplete);
        assert_eq!(client_hello(&record[..3]), Hello::Incomplete);
        assert_eq!(client_hello(&hello_for(None)), Hello::Nameless);
        assert_eq!(client_hello(b"GET / HTTP/1.1\r\n"), Hello::NotTls);
        assert_eq!(client_hello(b"SSH-2.0-x"), Hello::NotTls);
    }

    #[test]
    fn truncated_and_hostile_hellos_are_nameless_never_a_panic() {
        let record = hello_for(Some("a.test"));
        for cut in 5..record.len() {
            let mut broken = record[..cut].to_vec();
            // Claim the record is complete at this length.
            let len = (broken.len() - 5) as u16;
            broken[3..5].copy_from_slice(&len.to_be_bytes());
            assert_ne!(client_hello(&broken), Hello::Name("a.test".into()));
        }
        let mut lying = record.clone();
        lying[5 + 4 + 2 + 32 + 1] = 0xff; // an absurd cipher suite length
        assert_eq!(client_hello(&lying), Hello::Nameless);
    }
}
