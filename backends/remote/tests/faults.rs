//! Fault tests: a proxy between client and server drops connections, answers 502 and
//! 429, and delays replies. Reads and deletes retry within their deadline; creates are
//! resolved, never repeated blindly; nothing is left behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::proxy::{Fault, FaultProxy};
use sandcell::{ErrorKind, LabelSelector, SandboxBackend, SandboxSpec};
use sandcell_remote::{FlyBackend, FlyConfig};

async fn setup() -> (common::TestServer, FaultProxy, FlyBackend) {
    let server = common::serve_local().await;
    let proxy = FaultProxy::start(&server.url).await;
    let backend = common::client(&proxy.url()).await;
    (server, proxy, backend)
}

/// The sandboxes the server's backend holds.
async fn machines(server: &common::TestServer) -> usize {
    server
        .local
        .list(&LabelSelector::new())
        .await
        .unwrap()
        .len()
}

fn count(proxy: &FaultProxy, method: &str, path_contains: &str) -> usize {
    proxy
        .requests()
        .iter()
        .filter(|r| r.method == method && r.path.contains(path_contains))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_and_deletes_retry_through_drops_502_and_429() {
    let (server, proxy, backend) = setup().await;
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let path = format!("/machines/{}", sandbox.id);

    proxy.inject(
        "GET",
        &path,
        vec![
            Fault::Reset,
            Fault::Status(502),
            Fault::TooMany {
                retry_after_secs: 0,
            },
        ],
    );
    let before = count(&proxy, "GET", &path);
    let info = backend.inspect(&sandbox.id).await.unwrap();
    assert_eq!(info.id, sandbox.id);
    assert_eq!(
        count(&proxy, "GET", &path) - before,
        4,
        "three faults, then success"
    );

    proxy.inject("DELETE", &path, vec![Fault::Status(503), Fault::Reset]);
    backend.destroy(&sandbox.id).await.unwrap();
    assert_eq!(count(&proxy, "DELETE", &path), 3);
    assert_eq!(machines(&server).await, 0);
    // A double destroy succeeds (the API answers 404, which means destroyed).
    backend.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_stop_at_the_deadline_and_4xx_fails_at_once() {
    let server = common::serve_local().await;
    let proxy = FaultProxy::start(&server.url).await;
    let config = FlyConfig::new(proxy.url(), common::TOKEN)
        .retry(sandcell_remote::RetryPolicy::new(
            10,
            Duration::from_millis(200),
            Duration::from_millis(200),
        ))
        .call_timeout(Duration::from_millis(700));
    let backend = FlyBackend::connect(config).await.unwrap();
    // Create and destroy without the short deadline, which a loaded machine may miss.
    let patient = FlyBackend::connect(FlyConfig::new(&server.url, common::TOKEN))
        .await
        .unwrap();
    let sandbox = patient.create(&SandboxSpec::new("default")).await.unwrap();
    let path = format!("/machines/{}", sandbox.id);

    proxy.inject("GET", &path, vec![Fault::Status(502); 20]);
    let before = count(&proxy, "GET", &path);
    let err = backend.inspect(&sandbox.id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.to_string().contains("no time left to retry"), "{err}");
    // Ten retries allowed, but 200 ms pauses fit at most three times in 700 ms.
    let attempts = count(&proxy, "GET", &path) - before;
    assert!((2..=4).contains(&attempts), "{attempts} attempts");
    proxy.clear();

    // A client error is the API's answer: no retry.
    proxy.inject("GET", &path, vec![Fault::Status(400), Fault::Status(400)]);
    let before = count(&proxy, "GET", &path);
    let err = backend.inspect(&sandbox.id).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput, "{err}");
    assert_eq!(count(&proxy, "GET", &path) - before, 1);
    proxy.clear();
    patient.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ambiguous_create_leaves_exactly_one_machine() {
    let (server, proxy, backend) = setup().await;

    // The server creates the machine, the answer is lost: the name finds it.
    proxy.inject("POST", "/machines", vec![Fault::ResetAfterForward]);
    let first = backend.create(&SandboxSpec::new("default")).await.unwrap();
    assert_eq!(machines(&server).await, 1);
    assert_eq!(count(&proxy, "POST", "/machines"), 1, "not sent again");
    proxy.clear();

    // A gateway error before the server saw it: the lookup finds nothing, the create
    // is sent again under the same name.
    proxy.inject("POST", "/machines", vec![Fault::Status(502), Fault::Reset]);
    let second = backend.create(&SandboxSpec::new("default")).await.unwrap();
    assert_ne!(first.id, second.id);
    assert_eq!(machines(&server).await, 2);
    let names: Vec<String> = proxy
        .requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path.ends_with("/machines"))
        .skip(1)
        .map(|r| {
            let body: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            body["name"].as_str().unwrap().to_owned()
        })
        .collect();
    assert_eq!(names.len(), 3);
    assert!(
        names.iter().all(|n| n == &names[0]),
        "one name per create: {names:?}"
    );
    proxy.clear();

    for id in [first.id, second.id] {
        backend.destroy(&id).await.unwrap();
    }
    assert_eq!(machines(&server).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_destroy_racing_a_create_leaves_no_machine() {
    let (server, proxy, backend) = setup().await;
    // The create lands; its follow-up read is slow, and a destroy gets in first.
    proxy.inject(
        "GET",
        "/machines/",
        vec![Fault::Delay(Duration::from_millis(500))],
    );
    let creating = tokio::spawn({
        let backend = backend.clone();
        async move { backend.create(&SandboxSpec::new("default")).await }
    });
    let id = loop {
        if let Some(info) = server
            .local
            .list(&LabelSelector::new())
            .await
            .unwrap()
            .into_iter()
            .next()
        {
            break info.id;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    backend.destroy(&id).await.unwrap();
    match creating.await.unwrap() {
        Ok(info) => assert_eq!(info.id, id),
        Err(e) => assert_eq!(e.kind(), ErrorKind::NotFound, "{e}"),
    }
    backend.destroy(&id).await.unwrap();
    assert_eq!(machines(&server).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_is_unavailable() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let err = FlyBackend::connect(FlyConfig::new(url, common::TOKEN).retry(common::fast_retries()))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");

    let server = common::serve_local().await;
    let err = FlyBackend::connect(FlyConfig::new(&server.url, "wrong-token"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::PermissionDenied, "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_command_may_outlast_the_call_deadline() {
    let server = common::serve_local().await;
    // Create and destroy without the short deadline: on a loaded machine they
    // may take longer than the second this test gives the command's call.
    let patient = FlyBackend::connect(FlyConfig::new(&server.url, common::TOKEN))
        .await
        .unwrap();
    let sandbox = patient.create(&SandboxSpec::new("default")).await.unwrap();
    let config = FlyConfig::new(&server.url, common::TOKEN)
        .retry(common::fast_retries())
        .call_timeout(Duration::from_secs(1));
    let backend = FlyBackend::connect(config).await.unwrap();
    // The deadline bounds the wait for an answer's head, not a command's run.
    let out = sandcell::SandboxBackendExt::run(
        &backend,
        &sandbox.id,
        sandcell::ExecRequest::new(["sh", "-c", "sleep 2.5; echo done"]),
    )
    .await
    .unwrap();
    assert_eq!(out.stdout_str(), "done\n");
    patient.destroy(&sandbox.id).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_wire_connection_is_reopened_by_the_next_call() {
    let (server, proxy, backend) = setup().await;
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let run = |backend: FlyBackend, id: sandcell::SandboxId| async move {
        sandcell::SandboxBackendExt::run(&backend, &id, sandcell::ExecRequest::new(["echo", "hi"]))
            .await
    };
    assert_eq!(
        run(backend.clone(), sandbox.id.clone())
            .await
            .unwrap()
            .stdout_str(),
        "hi\n"
    );
    assert_eq!(
        run(backend.clone(), sandbox.id.clone())
            .await
            .unwrap()
            .stdout_str(),
        "hi\n"
    );
    assert_eq!(
        count(&proxy, "GET", "/sandcell/wire"),
        1,
        "one connection, reused"
    );

    proxy.cut_upgraded();
    // The client notices the closed connection as its reader sees the end.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        run(backend.clone(), sandbox.id.clone())
            .await
            .unwrap()
            .stdout_str(),
        "hi\n"
    );
    assert_eq!(count(&proxy, "GET", "/sandcell/wire"), 2, "reopened once");

    backend.destroy(&sandbox.id).await.unwrap();
    assert_eq!(machines(&server).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_wire_route_serves_only_an_upgrade_to_the_callers_own_machine() {
    let server = common::serve_local().await;
    let backend = FlyBackend::connect(FlyConfig::new(&server.url, common::TOKEN).app("mine"))
        .await
        .unwrap();
    let sandbox = backend.create(&SandboxSpec::new("default")).await.unwrap();
    let http = reqwest::Client::new();
    let route = |app: &str| {
        format!(
            "{}/v1/apps/{app}/machines/{}/sandcell/wire",
            server.url, sandbox.id
        )
    };
    let status = |request: reqwest::RequestBuilder| async move {
        request.send().await.unwrap().status().as_u16()
    };
    let upgrade = |request: reqwest::RequestBuilder| {
        request
            .header("connection", "upgrade")
            .header("upgrade", "sandcell-wire")
    };
    assert_eq!(
        status(upgrade(http.get(route("mine")))).await,
        401,
        "no token"
    );
    assert_eq!(
        status(http.get(route("mine")).bearer_auth(common::TOKEN)).await,
        426,
        "no upgrade asked"
    );
    assert_eq!(
        status(upgrade(
            http.get(route("theirs")).bearer_auth(common::TOKEN)
        ))
        .await,
        404,
        "another app's machine"
    );
    backend.destroy(&sandbox.id).await.unwrap();
    assert_eq!(
        status(upgrade(http.get(route("mine")).bearer_auth(common::TOKEN))).await,
        404,
        "a destroyed machine"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fly_rate_limits_apply_to_fly_endpoints_only_unless_set() {
    use sandcell_remote::{RateLimit, RateLimits};
    let server = common::serve_local().await;
    let default = common::client(&server.url).await;
    assert_eq!(
        default.rate_limits(),
        RateLimits::none(),
        "sandcell-server has none"
    );
    let mut chosen = RateLimits::default();
    chosen.mutations = RateLimit::new(2.0, 4);
    let set = FlyBackend::connect(FlyConfig::new(&server.url, common::TOKEN).rate_limits(chosen))
        .await
        .unwrap();
    assert_eq!(set.rate_limits(), chosen, "limits set are kept");

    let mut config = sandcell_server::ServerConfig::new(common::TOKEN);
    config.faces = [sandcell_server::Face::Fly].into();
    let plain = common::serve_local_with(config).await;
    let fly = FlyBackend::connect(FlyConfig::new(&plain.url, common::TOKEN))
        .await
        .unwrap();
    assert!(!fly.has_extensions());
    assert_eq!(fly.rate_limits(), RateLimits::default(), "Fly's own limits");
}
