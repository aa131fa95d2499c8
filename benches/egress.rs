//! The egress proxy's cost, measured from inside sandboxes: a 100 MiB download through
//! the proxy (a `Network::Allowlist` sandbox) against the same download without it (a
//! `Network::Full` sandbox), and the time of one HTTPS request each way. curl in the
//! sandbox times itself (`time_total`), so process start-up is left out; the two sides
//! alternate, and each figure is the median of `SANDCELL_BENCH_ROUNDS` rounds (9). The
//! download comes from this machine as fast as it goes, and paced to the speed of a
//! network link (see `LINKS`).
//!
//! ```sh
//! cargo bench --features testing --bench egress      # as root: namespaces, loopback addresses
//! ```
//!
//! The local backend runs at `Isolation::Namespaces` and, where the host allows an
//! allowlist there, `Isolation::Landlock`; Docker runs when an engine answers
//! and `SANDCELL_DOCKER_AGENT` names the static agent (see `.ci/run`).

// A bench reports failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use sandcell::testing::egress::{EgressWorld, BULK_BYTES, HOST_A};
use sandcell::{Network, SandboxBackend, SandboxBackendExt, SandboxId, SandboxSpec};

/// The servers the download comes from: the same machine as fast as it goes (the
/// proxy's own ceiling, where every relayed byte costs a second TCP connection's
/// work on the same cores), and a server behind a link of a given speed (bytes per
/// second), as a download from the internet is.
const LINKS: [(&str, Option<u64>); 3] = [
    ("this machine, unpaced", None),
    ("a 4 Gbit/s link", Some(500_000_000)),
    ("a 1 Gbit/s link", Some(125_000_000)),
];

fn rounds() -> usize {
    std::env::var("SANDCELL_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(9)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// Seconds curl took for `url` with `options`, and the bytes it received.
async fn curl(b: &dyn SandboxBackend, id: &SandboxId, options: &str, url: &str) -> (f64, u64) {
    let out = b
        .run_shell(
            id,
            &format!(
                "curl -sS -o /dev/null -w '%{{time_total}} %{{size_download}}' {options} '{url}'"
            ),
        )
        .await
        .expect("curl");
    let text = out.stdout_str();
    let mut parts = text.split_whitespace();
    let seconds = parts.next().and_then(|s| s.parse().ok());
    let bytes = parts.next().and_then(|s| s.parse().ok());
    match (seconds, bytes) {
        (Some(s), Some(n)) => (s, n),
        _ => panic!("curl said {text:?} {:?}", out.stderr_str()),
    }
}

async fn measure(name: &str, b: &dyn SandboxBackend, world: &EgressWorld) {
    let allow = b
        .create(&SandboxSpec::default().network(Network::Allowlist(vec!["a.test".into()])))
        .await
        .expect("an allowlisted sandbox");
    let full = b
        .create(&SandboxSpec::default().network(Network::Full))
        .await
        .expect("a sandbox with the full network");
    for id in [&allow.id, &full.id] {
        b.write_string(id, &"ca.pem".parse().unwrap(), world.ca_pem())
            .await
            .unwrap();
    }
    let tls = format!("https://a.test:{}/", world.a_https);
    let pin = format!("--resolve a.test:{}:{HOST_A}", world.a_https);
    let mut proxied = vec![Vec::new(); LINKS.len()];
    let mut plain = vec![Vec::new(); LINKS.len()];
    let (mut tls_proxied, mut tls_plain) = (vec![], vec![]);
    for round in 0..rounds() {
        let mut sides = [true, false];
        if round % 2 == 1 {
            sides.reverse();
        }
        for via_proxy in sides {
            for (i, (_, pace)) in LINKS.iter().enumerate() {
                let query = pace.map_or(String::new(), |rate| format!("?bytes_per_second={rate}"));
                let (sandbox, host, options, samples) = if via_proxy {
                    (&allow.id, "a.test".to_owned(), "", &mut proxied[i])
                } else {
                    (&full.id, HOST_A.to_string(), "--noproxy '*'", &mut plain[i])
                };
                let url = format!("http://{host}:{}/bulk{query}", world.a_bulk);
                let (s, n) = curl(b, sandbox, options, &url).await;
                assert_eq!(n as usize, BULK_BYTES);
                samples.push(s);
            }
            if via_proxy {
                tls_proxied.push(curl(b, &allow.id, "--cacert ca.pem", &tls).await.0);
            } else {
                let options = format!("--noproxy '*' --cacert ca.pem {pin}");
                tls_plain.push(curl(b, &full.id, &options, &tls).await.0);
            }
        }
    }
    b.destroy(&allow.id).await.unwrap();
    b.destroy(&full.id).await.unwrap();
    let mb = BULK_BYTES as f64 / 1e6;
    for (i, (link, _)) in LINKS.iter().enumerate() {
        let (p, d) = (median(proxied[i].clone()), median(plain[i].clone()));
        println!(
            "{name}: 100 MiB download from {link}: through the proxy {:.0} MB/s ({:.3} s), direct {:.0} MB/s ({:.3} s): throughput ratio {:.2}x",
            mb / p,
            p,
            mb / d,
            d,
            d / p
        );
    }
    let (tp, td) = (median(tls_proxied), median(tls_plain));
    println!(
        "{name}: one HTTPS request: through the proxy {:.2} ms, direct {:.2} ms: +{:.2} ms",
        tp * 1e3,
        td * 1e3,
        (tp - td) * 1e3
    );
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let world = EgressWorld::start().await;
        for (name, isolation) in [
            ("local (namespaces)", sandcell_local::Isolation::Namespaces),
            ("local (landlock)", sandcell_local::Isolation::Landlock),
        ] {
            let root = tempfile::tempdir().unwrap();
            let mut builder = sandcell_local::LocalBackend::builder()
                .root(root.path())
                .isolation(isolation);
            for (host, addrs) in EgressWorld::hosts() {
                builder = builder.egress_host(host, addrs);
            }
            let local = builder.build().expect("the isolation level (as root)");
            if local.capabilities().network_allowlist {
                measure(name, &local, &world).await;
            } else {
                println!("{name}: skipped (no allowlist at this level on this host)");
            }
        }

        let agent = std::env::var_os("SANDCELL_DOCKER_AGENT");
        let probe = sandcell_docker::DockerBackend::builder().build().unwrap();
        match (agent, probe.ping().await) {
            (Some(agent), Ok(_)) => {
                let work = tempfile::tempdir().unwrap();
                let rootfs = work.path().join("rootfs");
                let busybox = sandcell_docker::testing::host_busybox().expect("busybox-static");
                sandcell_docker::testing::busybox_rootfs(&busybox, &rootfs).unwrap();
                sandcell_docker::testing::copy_host_program(
                    std::path::Path::new("/usr/bin/curl"),
                    &rootfs,
                )
                .expect("curl on this host");
                let mut builder = sandcell_docker::DockerBackend::builder()
                    .template(
                        "default",
                        sandcell_docker::ImageSpec::import(&rootfs, "sandcell-bench/curl:latest"),
                    )
                    .agent(agent);
                for (name, addrs) in EgressWorld::hosts() {
                    builder = builder.egress_host(name, addrs);
                }
                let docker = builder.build().unwrap();
                docker.prepare_images().await.expect("the curl image");
                measure("docker (agent)", &docker, &world).await;
            }
            _ => println!("docker: skipped (no engine, or SANDCELL_DOCKER_AGENT unset)"),
        }
    });
}
