//! The wire protocol: the conformance suite through `WireLoop`, and a client that does
//! not trust its agent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use sandcell::raw::wire::WireClient;
use sandcell::ErrorKind;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The conformance suite through the wire protocol, one test per case.
mod through_the_wire {
    async fn setup() -> sandcell::testing::conformance::Fixture {
        let mock = sandcell::testing::MockBackend::new();
        sandcell::testing::conformance::Fixture::new(sandcell::testing::WireLoop::new(mock.clone()))
            .check_after(move || assert_eq!(mock.live_count(), 0, "nothing left"))
    }
    sandcell::conformance_tests!(setup);
}

/// A fake agent that answers the first call with `reply`, then hangs up or stays
/// silent, to see the client cope.
async fn hostile_agent(reply: Vec<u8>, hang_up: bool) -> WireClient {
    let (agent, caller) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (mut read, mut write) = tokio::io::split(agent);
        let mut buf = [0u8; 4096];
        if read.read(&mut buf).await.unwrap_or(0) > 0 {
            let _ = write.write_all(&reply).await;
        }
        if hang_up {
            return;
        }
        // Keep the connection open: the client must not rely on the agent hanging up.
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let (read, write) = tokio::io::split(caller);
    WireClient::new(read, write)
}

fn frame(kind: u8, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut out = ((9 + payload.len()) as u32).to_be_bytes().to_vec();
    out.push(kind);
    out.extend_from_slice(&id.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

#[tokio::test]
async fn a_hostile_agent_ends_the_connection_instead_of_hanging_or_growing_memory() {
    let path = "f".parse().unwrap();
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "oversized frame",
            (64u32 * 1024 * 1024).to_be_bytes().to_vec(),
        ),
        ("unknown kind", frame(200, 1, b"")),
        ("bad json reply", frame(5, 1, b"{not json")),
        ("data before the reply", frame(2, 1, b"x")),
        ("data beyond the window", {
            let mut out = frame(5, 1, br#"{"ok":null}"#);
            let chunk = vec![0u8; 64 * 1024];
            for _ in 0..20 {
                out.extend_from_slice(&frame(2, 1, &chunk));
            }
            out
        }),
    ];
    for (what, reply) in cases {
        let client = hostile_agent(reply, false).await;
        let result = tokio::time::timeout(Duration::from_secs(10), client.read(&path))
            .await
            .unwrap_or_else(|_| panic!("{what}: the client hung"));
        let err = result.expect_err(what);
        assert!(
            matches!(err.kind(), ErrorKind::Unavailable | ErrorKind::Backend),
            "{what}: {err}"
        );
    }
}

#[tokio::test]
async fn a_connection_lost_mid_call_fails_that_call_and_every_later_one() {
    let path = "f".parse().unwrap();
    for (what, reply) in [
        ("mid-stream", {
            let mut out = frame(5, 1, br#"{"ok":null}"#);
            out.extend_from_slice(&frame(2, 1, b"partial"));
            out
        }),
        ("mid-frame", frame(5, 1, br#"{"ok":null}"#)[..10].to_vec()),
    ] {
        let client = hostile_agent(reply, true).await;
        let err = client.read(&path).await.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{what}: {err}");
        assert!(client.closed().is_some());
        let err = client.stat(&path).await.expect_err(what);
        assert_eq!(err.kind(), ErrorKind::Unavailable, "{what}: {err}");
    }
}

/// A server facing untrusted clients bounds what they send: a file over its cap and an
/// import asking for more than its archive caps are refused, and the connection lives on.
#[tokio::test]
async fn a_server_bounds_files_and_archives_whatever_the_client_asks() {
    use std::sync::Arc;

    use sandcell::archive::{ArchiveLimits, ImportOptions};
    use sandcell::raw::wire::{serve_with, ServeOptions};
    use sandcell::{SandboxBackend, SandboxSpec};

    let backend = Arc::new(sandcell::testing::MockBackend::new());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let (agent, caller) = tokio::io::duplex(64 * 1024);
    let (agent_read, agent_write) = tokio::io::split(agent);
    let options = ServeOptions::default()
        .max_file_bytes(3 << 20)
        .archive_limits(ArchiveLimits::default().max_entries(2));
    tokio::spawn(serve_with(
        options,
        backend.clone(),
        sandbox.id.clone(),
        agent_read,
        agent_write,
    ));
    let (read, write) = tokio::io::split(caller);
    let client = WireClient::new(read, write);

    let path = "big.bin".parse().unwrap();
    let err = client
        .write(&path, vec![7u8; 4 << 20].into())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert_eq!(
        client.stat(&path).await.unwrap_err().kind(),
        ErrorKind::NotFound,
        "nothing written"
    );
    client
        .write(&path, vec![7u8; 3 << 20].into())
        .await
        .unwrap();

    // Three entries against a cap of two, though the client allows a million.
    let mut tar = tar::Builder::new(Vec::new());
    for name in ["a", "b", "c"] {
        let mut header = tar::Header::new_gnu();
        header.set_size(1);
        header.set_mode(0o644);
        header.set_cksum();
        tar.append_data(&mut header, name, &b"x"[..]).unwrap();
    }
    let tar = bytes::Bytes::from(tar.into_inner().unwrap());
    let stream = futures::stream::once(async move { Ok(tar) });
    let err = client
        .import_tar(
            &"dir".parse().unwrap(),
            Box::pin(stream),
            ImportOptions::merge(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LimitExceeded, "{err}");
    assert!(
        client.closed().is_none(),
        "the connection outlives a refusal"
    );
}

/// A call the server cannot take says why by its kind: an argument that fails its
/// checks is `InvalidInput` (as from a backend directly), an operation this server does
/// not know is `Unsupported` (a newer client), and only malformed JSON is `Backend`.
#[tokio::test]
async fn a_call_the_server_cannot_take_gets_the_kind_that_says_why() {
    use std::sync::Arc;

    use sandcell::raw::wire::serve;
    use sandcell::{SandboxBackend, SandboxSpec};

    let backend = Arc::new(sandcell::testing::MockBackend::new());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let (agent, caller) = tokio::io::duplex(64 * 1024);
    let (agent_read, agent_write) = tokio::io::split(agent);
    tokio::spawn(serve(
        backend.clone(),
        sandbox.id.clone(),
        agent_read,
        agent_write,
    ));
    let (mut read, mut write) = tokio::io::split(caller);
    let cases: [(&[u8], &str); 4] = [
        (br#"{"op":"stat","path":"../etc/passwd"}"#, "invalid_input"),
        (br#"{"op":"stat","path":"a\u0000b"}"#, "invalid_input"),
        (br#"{"op":"chmod","path":"a","mode":420}"#, "unsupported"),
        (br#"{"op":"stat","#, "backend"),
    ];
    for (id, (call, kind)) in cases.iter().enumerate() {
        write.write_all(&frame(1, id as u64, call)).await.unwrap();
        let mut len = [0u8; 4];
        read.read_exact(&mut len).await.unwrap();
        let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
        read.read_exact(&mut body).await.unwrap();
        assert_eq!(body[0], 5, "a reply frame");
        let reply: serde_json::Value = serde_json::from_slice(&body[9..]).unwrap();
        assert_eq!(
            reply["err"]["kind"],
            *kind,
            "{}: {reply}",
            String::from_utf8_lossy(call)
        );
    }
}

/// ADVERSARIAL 40: a peer that sends calls and never reads an answer does not make the server queue
/// answers without end: once the frames waiting for it pass a bound, the server ends
/// the connection (before, 100,000 calls left 100,000 replies queued).
#[tokio::test]
async fn a_peer_that_reads_nothing_has_its_connection_ended() {
    use std::sync::Arc;

    use sandcell::raw::wire::serve;
    use sandcell::{SandboxBackend, SandboxSpec};

    let backend = Arc::new(sandcell::testing::MockBackend::new());
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let (agent, caller) = tokio::io::duplex(64 * 1024);
    let (agent_read, agent_write) = tokio::io::split(agent);
    let served = tokio::spawn(serve(backend, sandbox.id, agent_read, agent_write));
    // The read half is kept, and never read.
    let (_read, mut write) = tokio::io::split(caller);
    let call = br#"{"op":"stat","path":"missing"}"#;
    let flood = tokio::spawn(async move {
        for id in 0..1_000_000u64 {
            if write.write_all(&frame(1, id, call)).await.is_err() {
                return id;
            }
        }
        1_000_000
    });
    // Whatever `serve` answers, it must answer: the connection ended.
    let _answer = tokio::time::timeout(Duration::from_secs(120), served)
        .await
        .expect("the connection ended")
        .unwrap();
    let sent = tokio::time::timeout(Duration::from_secs(10), flood)
        .await
        .expect("the flood stopped once the connection ended")
        .unwrap();
    assert!(
        sent < 1_000_000,
        "the connection ended before every call was sent"
    );
}

/// A wire server facing a new sandbox of `backend` over a fresh connection: the
/// client's raw halves, the server's task and the sandbox.
async fn raw_server(
    options: sandcell::raw::wire::ServeOptions,
    backend: std::sync::Arc<sandcell::testing::MockBackend>,
) -> (
    tokio::io::ReadHalf<tokio::io::DuplexStream>,
    tokio::io::WriteHalf<tokio::io::DuplexStream>,
    tokio::task::JoinHandle<sandcell::Result<()>>,
    sandcell::SandboxId,
) {
    use sandcell::{SandboxBackend, SandboxSpec};
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let (agent, caller) = tokio::io::duplex(64 * 1024);
    let (agent_read, agent_write) = tokio::io::split(agent);
    let served = tokio::spawn(sandcell::raw::wire::serve_with(
        options,
        backend,
        sandbox.id.clone(),
        agent_read,
        agent_write,
    ));
    let (read, write) = tokio::io::split(caller);
    (read, write, served, sandbox.id)
}

/// ADVERSARIAL 40: frames sent to a request that is busy elsewhere (a read waiting for
/// credit the client never grants) are counted: past the connection's bound on frames
/// not yet taken it ends, where before 1 MiB `End` frames queued without limit (2 GiB in
/// 6 s). An empty data frame, which costs memory and no credit, ends it at once.
#[tokio::test]
async fn frames_piled_on_a_busy_request_end_the_connection() {
    use std::sync::Arc;

    use sandcell::raw::wire::ServeOptions;
    use sandcell::SandboxBackend;

    let backend = Arc::new(sandcell::testing::MockBackend::new());
    let (_read, mut write, served, id) = raw_server(ServeOptions::default(), backend.clone()).await;
    backend
        .write(&id, &"big".parse().unwrap(), vec![1u8; 4 << 20].into())
        .await
        .unwrap();
    write
        .write_all(&frame(1, 1, br#"{"op":"read","path":"big"}"#))
        .await
        .unwrap();
    let end = frame(4, 1, &vec![0u8; 1 << 20][..]);
    let flood = tokio::spawn(async move {
        for sent in 0..1024u32 {
            if write.write_all(&end).await.is_err() {
                return sent;
            }
        }
        1024
    });
    tokio::time::timeout(Duration::from_secs(60), served)
        .await
        .expect("the connection ended")
        .unwrap()
        .unwrap();
    let sent = flood.await.unwrap();
    assert!(sent < 256, "ended after {sent} MiB of frames, not 1 GiB");

    // An empty data frame for an upload.
    let (_read, mut write, served, _) = raw_server(ServeOptions::default(), backend).await;
    write
        .write_all(&frame(1, 1, br#"{"op":"write","path":"f"}"#))
        .await
        .unwrap();
    write.write_all(&frame(2, 1, b"")).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), served)
        .await
        .expect("an empty data frame ends the connection")
        .unwrap()
        .unwrap();
}

/// A listing is held within the server's budget until it is sent, its worst case taken
/// before the directory is read: with less than that free it is refused (`LimitExceeded`,
/// a refusal to retry), and once sent the budget is whole again.
#[tokio::test]
async fn a_listing_is_held_within_the_budget() {
    use std::sync::Arc;

    use sandcell::raw::budget::{is_refusal, ByteBudget};
    use sandcell::raw::wire::ServeOptions;

    let budget = ByteBudget::new(80 << 20);
    let backend = Arc::new(sandcell::testing::MockBackend::new());
    let (read, write, _served, _) =
        raw_server(ServeOptions::default().budget(budget.clone()), backend).await;
    let client = WireClient::new(read, write);
    let root = sandcell::SandboxPath::root();
    client
        .write(&"a".parse().unwrap(), "x".into())
        .await
        .unwrap();
    assert_eq!(client.list_dir(&root).await.unwrap().len(), 1);

    let held = budget.try_reserve(20 << 20).unwrap();
    let err = client.list_dir(&root).await.unwrap_err();
    assert!(is_refusal(&err), "{err}");
    drop(held);
    assert_eq!(client.list_dir(&root).await.unwrap().len(), 1);
    assert!(
        budget.try_reserve(80 << 20).is_ok(),
        "what the listings held came back"
    );
}

/// ADVERSARIAL 40: data a client takes from the connection but its caller has not read
/// yet still counts against the connection's bound: an agent that answers a command
/// with its whole window of output in 1-byte frames, paced so the client keeps up,
/// which the caller does not read, ends the connection (64 MiB of frames counted with
/// their overhead) instead of queueing a million small allocations (some 80 MB) past
/// the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_frames_a_caller_has_not_read_still_count() {
    let (agent, caller) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        let (mut read, mut write) = tokio::io::split(agent);
        let mut buf = [0u8; 4096];
        if read.read(&mut buf).await.unwrap_or(0) == 0 {
            return;
        }
        if write
            .write_all(&frame(5, 1, br#"{"ok":null}"#))
            .await
            .is_err()
        {
            return;
        }
        let batch: Vec<u8> = (0..500).flat_map(|_| frame(2, 1, b"x")).collect();
        for _ in 0..2_096 {
            if write.write_all(&batch).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(Duration::from_secs(3600)).await;
    });
    let (read, write) = tokio::io::split(caller);
    let client = WireClient::new(read, write);
    let process = client
        .exec(sandcell::ExecRequest::new(["sh"]))
        .await
        .unwrap();
    let mut ended = false;
    for _ in 0..600 {
        if client.closed().is_some() {
            ended = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(ended, "the connection ended past its bound");
    drop(process);
}

/// ADVERSARIAL 41: a server that rewrites its errors for its clients
/// (`ServeOptions::public_errors`, which sandcell-server sets so a backend's failure
/// names no host path) has every error that leaves rewritten: a call's reply, and a
/// stream's abort (an export of a directory that is not there).
#[tokio::test]
async fn every_error_that_leaves_is_rewritten_as_the_server_says() {
    use std::sync::Arc;

    use futures::StreamExt;
    use sandcell::raw::wire::ServeOptions;

    let backend = Arc::new(sandcell::testing::MockBackend::new());
    let options = ServeOptions::default()
        .public_errors(|e| sandcell::Error::new(e.kind(), "rewritten for the client"));
    let (read, write, _served, _id) = raw_server(options, backend).await;
    let client = WireClient::new(read, write);
    let missing = "not/there".parse().unwrap();

    let stat = client.stat(&missing).await.unwrap_err();
    assert_eq!(stat.kind(), ErrorKind::NotFound);
    assert_eq!(stat.message(), "rewritten for the client");
    let exported = match client.export_tar(&missing).await {
        Ok(mut tar) => tar.next().await.unwrap().unwrap_err(),
        Err(e) => e,
    };
    assert_eq!(exported.kind(), ErrorKind::NotFound);
    assert_eq!(exported.message(), "rewritten for the client");
}
