//! Plain threads for blocking work. The blocking `tubeway::Client` refuses
//! to run on any thread of an async runtime (its blocking pool included),
//! and channels block: both run on threads of their own.

/// Runs `f` on a new thread outside the async runtime and waits for it
/// without blocking the runtime. Whatever `f` blocks on must be bounded.
pub async fn off_runtime<T, F>(what: &str, f: F) -> anyhow::Result<T>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("tubeway-bench".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| anyhow::anyhow!("{what}: cannot start a thread: {e}"))?;
    rx.await
        .map_err(|_| anyhow::anyhow!("{what}: the thread panicked"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_thread_is_outside_the_runtime() {
        let inside = off_runtime("probe", || tokio::runtime::Handle::try_current().is_ok())
            .await
            .unwrap();
        assert!(!inside);
        let err = off_runtime("boom", || -> u8 { panic!("boom") })
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("boom: the thread panicked"),
            "{err}"
        );
    }
}
