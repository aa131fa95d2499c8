//! What relaying costs on this machine, outside any sandbox: 1 GiB from a server on
//! loopback to a reader, straight, through `sandcell::raw::egress::relay` (splice(2)), and
//! through Tokio's copying relay with 256 KiB buffers. Reports throughput and the
//! CPU-seconds the whole process spent (server, relay and reader), so the cost of the
//! second TCP connection a relay opens shows apart from the cost of copying.
//!
//! ```sh
//! cargo bench --bench relay
//! ```

// A bench reports failures by panicking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Instant;

const TOTAL: usize = 1 << 30;

/// A server that sends `TOTAL` bytes to each connection.
fn server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || loop {
        let (mut stream, _) = listener.accept().unwrap();
        std::thread::spawn(move || {
            let chunk = vec![7u8; 1 << 20];
            for _ in 0..TOTAL / chunk.len() {
                stream.write_all(&chunk).unwrap();
            }
        });
    });
    port
}

/// A relay to `upstream`, on a thread of its own; `splice` picks sandcell's relay.
fn relay(upstream: u16, splice: bool) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            loop {
                let (mut client, _) = listener.accept().await.unwrap();
                let mut server = tokio::net::TcpStream::connect(("127.0.0.1", upstream))
                    .await
                    .unwrap();
                tokio::spawn(async move {
                    if splice {
                        let _ = sandcell::raw::egress::relay(&client, &server).await;
                    } else {
                        let size = 256 * 1024;
                        let _ = tokio::io::copy_bidirectional_with_sizes(
                            &mut client,
                            &mut server,
                            size,
                            size,
                        )
                        .await;
                    }
                });
            }
        });
    });
    port
}

/// CPU-seconds this process has used (user and system), from /proc/self/stat.
fn cpu_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the command's closing parenthesis; utime and stime are 14 and 15.
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields[11].parse::<f64>().unwrap() + fields[12].parse::<f64>().unwrap();
    ticks / 100.0
}

/// Reads everything `port` sends; returns GB/s and CPU-seconds per GiB.
fn download(port: u16) -> (f64, f64) {
    let cpu = cpu_seconds();
    let started = Instant::now();
    let mut stream = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut buf = vec![0u8; 128 * 1024];
    let mut received = 0;
    loop {
        let n = stream.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        received += n;
    }
    assert_eq!(received, TOTAL);
    let seconds = started.elapsed().as_secs_f64();
    (TOTAL as f64 / seconds / 1e9, cpu_seconds() - cpu)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let rounds: usize = std::env::var("SANDCELL_BENCH_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let upstream = server();
    let ways = [
        ("direct", upstream),
        ("spliced relay", relay(upstream, true)),
        ("copying relay", relay(upstream, false)),
    ];
    let mut rates = vec![Vec::new(); ways.len()];
    let mut cpus = vec![Vec::new(); ways.len()];
    for _ in 0..rounds {
        for (i, (_, port)) in ways.iter().enumerate() {
            let (rate, cpu) = download(*port);
            rates[i].push(rate);
            cpus[i].push(cpu);
        }
    }
    let direct = median(rates[0].clone());
    for (i, (name, _)) in ways.iter().enumerate() {
        let rate = median(rates[i].clone());
        println!(
            "{name}: 1 GiB at {rate:.2} GB/s ({:.2}x direct), {:.2} CPU-seconds",
            rate / direct,
            median(cpus[i].clone())
        );
    }
}
