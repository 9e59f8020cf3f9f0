//! The broker's memory idle and per idle connection, and the CPU it uses
//! while those connections are idle, measured on a broker process of its
//! own so earlier figures do not weigh on it.

use std::path::Path;

use anyhow::Context as _;
use tubeway::AsyncClient;

use super::memory::Proc;
use super::report::IdleMemory;
use super::target::Target;
use super::transport::Transport;
use super::wait::Wait;

/// Connections opened at once while loading the broker.
const BATCH: usize = 50;
/// How long the broker's count of connections may take to settle: a
/// connection closed just before is counted until the broker has seen it
/// go, which no event tells the bench.
const SETTLE: std::time::Duration = std::time::Duration::from_secs(5);
/// How long the loaded broker is watched for CPU use. Its connections are
/// idle: an idle broker should use none (a spinning or busy-looping
/// connection would use up to a whole CPU).
const IDLE_WATCH: std::time::Duration = std::time::Duration::from_secs(2);

/// Starts a fresh broker, reads its resident memory with no connection,
/// one, and `connections` more idle ones. `None` when the broker is not a
/// child process of ours (in-process, or `--url`).
pub async fn measure(
    transport: Transport,
    connections: usize,
    dir: &Path,
) -> anyhow::Result<Option<IdleMemory>> {
    // The default wait: in latency mode each idle connection would keep a
    // thread polling.
    let mut target = Target::start(transport, None, 0, dir, "idle", Wait::DEFAULT).await?;
    let Some(proc) = target.broker_proc() else {
        target.stop().await;
        return Ok(None);
    };
    let result = load(&target, proc, connections).await;
    if result.is_err() {
        target.check()?;
    }
    target.stop().await;
    result.map(Some)
}

async fn load(target: &Target, proc: Proc, connections: usize) -> anyhow::Result<IdleMemory> {
    let rss = || proc.rss_kib().context("cannot read the broker's VmRSS");
    let idle_kib = rss()?;
    let connect = || AsyncClient::connect_with(&target.url, target.options.clone());
    let first = connect().await?;
    first.ping().await?;
    let one_connection_kib = rss()?;
    let mut idle = Vec::with_capacity(connections);
    while idle.len() < connections {
        let n = BATCH.min(connections - idle.len());
        idle.extend(futures::future::try_join_all((0..n).map(|_| connect())).await?);
    }
    // Every handshake is done and the broker sees them all, and no other:
    // the connection `Target::start` probed with may still be closing there.
    let expected = connections as u64 + 1;
    let give_up = std::time::Instant::now() + SETTLE;
    loop {
        let counted = first.stats().await?.connections;
        if counted == expected {
            break;
        }
        anyhow::ensure!(
            std::time::Instant::now() < give_up,
            "the broker counts {counted} connections, {expected} expected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let loaded_kib = rss()?;
    // Past the set-up: a spinning wait ends within its spin budget.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let before = proc.cpu_ns();
    tokio::time::sleep(IDLE_WATCH).await;
    let idle_cpu_ms = before
        .zip(proc.cpu_ns())
        .map(|(a, b)| b.saturating_sub(a) as f64 / 1e6);
    futures::future::join_all(idle.iter().map(AsyncClient::close)).await;
    first.close().await;
    Ok(IdleMemory {
        idle_kib,
        one_connection_kib,
        loaded_kib,
        connections,
        per_connection_kib: loaded_kib.saturating_sub(one_connection_kib) as f64
            / connections.max(1) as f64,
        idle_cpu_ms,
        idle_ms: IDLE_WATCH.as_millis() as u64,
    })
}
