//! The stop signal of a process the kubelet runs.

/// Resolves on SIGINT or SIGTERM (the kubelet's stop). Where SIGTERM cannot be
/// listened for, SIGINT alone ends it, and the failure is logged.
pub async fn signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only SIGINT stops this process");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
}
