//! An agent-style loop over a session: write code, run it, read the result, edit, rerun,
//! and snapshot the working state — the cycle a coding agent drives through sandcell.
//!
//! The "model" here is a few lines of rules so the example runs anywhere; in a real
//! agent each decision comes from an LLM reading the same observations.
//!
//! `cargo run --example agent_loop`

use std::time::Duration;

use sandcell::{
    ExecRequest, ReleaseMode, SandboxBackend, SandboxBackendExt, SandboxManager, SandboxSpec,
    SessionKey,
};
use sandcell_local::LocalBackend;

/// The first draft the agent writes: a FizzBuzz with an off-by-one (it stops at 14).
const DRAFT: &str = r#"i=1
while [ "$i" -lt 15 ]; do
  if [ $((i % 15)) -eq 0 ]; then echo FizzBuzz
  elif [ $((i % 3)) -eq 0 ]; then echo Fizz
  elif [ $((i % 5)) -eq 0 ]; then echo Buzz
  else echo "$i"; fi
  i=$((i + 1))
done
"#;

/// What the task asks for: the output's last line for 1..=15.
const EXPECTED_LAST_LINE: &str = "FizzBuzz";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let scratch = tempfile::tempdir()?;
    let backend = LocalBackend::builder()
        .root(scratch.path().join("local"))
        .build()?;
    let manager = SandboxManager::builder(backend)
        .data_dir(scratch.path().join("data"))
        .build()
        .await?;
    let key = SessionKey::new("demo", "agent-loop")?;
    let sandbox = manager.acquire(&key, &SandboxSpec::new("default")).await?;
    println!("session {key} → sandbox {}", sandbox.id());

    let program = "fizzbuzz.sh".parse()?;
    // Every backend operation goes through the handle's `call`, which records activity
    // for the session and names the operation, sandbox and session on an error.
    sandbox
        .call("write", |b, id| b.write(id, &program, DRAFT.into()))
        .await?;
    println!("wrote {program} ({} bytes)", DRAFT.len());

    let mut solved = false;
    for attempt in 1..=3 {
        // Act: run the program with a timeout, so a hung draft cannot stall the agent.
        let request = ExecRequest::new(["sh", "fizzbuzz.sh"]).timeout(Duration::from_secs(10));
        let out = sandbox.call("run", |b, id| b.run(id, request)).await?;
        let last = out.stdout_str().lines().last().unwrap_or("").to_owned();
        println!(
            "attempt {attempt}: exit {:?}, {} lines, last line {last:?}",
            out.exit_code(),
            out.stdout_str().lines().count()
        );

        // Observe and decide.
        if out.success() && last == EXPECTED_LAST_LINE {
            println!("attempt {attempt}: output matches the task");
            solved = true;
            break;
        }
        // Read the code back, as an agent would before editing it.
        let source = sandbox
            .call("read", |b, id| b.read_to_string(id, &program))
            .await?;
        let Some((old, new)) = propose_fix(&source) else {
            return Err("no fix to propose; a real agent would ask the model again".into());
        };
        println!("attempt {attempt}: editing {old:?} → {new:?}");
        let fixed = source.replacen(old, new, 1);
        sandbox
            .call("write", |b, id| b.write(id, &program, fixed.into()))
            .await?;
    }

    if !solved {
        manager.release(&key, ReleaseMode::Purge).await?;
        return Err("the task is still failing after 3 attempts".into());
    }

    // Keep the working state: a snapshot the session can be restored to later.
    let manifest = manager.snapshot(&key).await?;
    println!(
        "snapshot {}: {} bytes compressed ({} entries, incremental: {})",
        manifest.id, manifest.size_bytes, manifest.entry_count, manifest.incremental
    );

    manager.release(&key, ReleaseMode::Purge).await?;
    manager.shutdown().await;
    Ok(())
}

/// The stand-in for the model: a known bug and its fix.
fn propose_fix(source: &str) -> Option<(&'static str, &'static str)> {
    let fix = ("-lt 15", "-le 15");
    source.contains(fix.0).then_some(fix)
}
