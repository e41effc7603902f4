//! A server task on a tokio runtime of its own, on a thread of its own.
//!
//! The fakes are used from synchronous tests, from `#[tokio::test]`s and from the
//! exporter's synchronous `--simulate` start-up alike, so they cannot borrow the
//! caller's runtime. Stopping one must also be immediate and total: a hung RPC or an
//! open watch must not keep it alive, and clients must see their connections break, as
//! they would when a real kubelet or API server goes away. Dropping the runtime does
//! exactly that: every task it spawned (each connection, each in-flight request) is
//! dropped, closing its socket, before [`ServerThread`]'s drop returns.

use std::future::Future;
use std::io;
use std::thread::JoinHandle;
use tokio::sync::oneshot;

/// A running server task; dropping this stops it and waits until it is gone.
pub(crate) struct ServerThread {
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ServerThread {
    /// Runs `task()` on a new current-thread runtime on a new thread named `name`,
    /// until the task ends or this handle is dropped.
    pub(crate) fn spawn<F, Fut>(name: &str, task: F) -> io::Result<ServerThread>
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = ()> + 'static,
    {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let (shutdown, stop) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                runtime.block_on(async move {
                    tokio::select! {
                        _ = stop => {}
                        () = task() => {}
                    }
                });
                // Dropping the runtime drops every task it spawned (connections, hung
                // requests, open watches), which closes their sockets.
                drop(runtime);
            })?;
        Ok(ServerThread {
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }
}

impl Drop for ServerThread {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            // An error means the task already ended on its own: nothing to stop.
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("a kube-sim server thread panicked");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// Sets its flag when dropped, to observe that a task was dropped.
    struct DropFlag(Arc<AtomicBool>);

    impl Drop for DropFlag {
        fn drop(&mut self) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn dropping_stops_pending_tasks_and_their_children_before_returning() {
        let main_dropped = Arc::new(AtomicBool::new(false));
        let child_dropped = Arc::new(AtomicBool::new(false));
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (m, c) = (main_dropped.clone(), child_dropped.clone());
        let server = ServerThread::spawn("test-server", move || async move {
            let main_flag = DropFlag(m);
            let child_flag = DropFlag(c);
            tokio::spawn(async move {
                let _held = child_flag;
                std::future::pending::<()>().await;
            });
            started_tx.send(()).expect("test is waiting");
            std::future::pending::<()>().await;
            drop(main_flag);
        })
        .expect("spawn server thread");
        started_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("task started");
        assert!(!main_dropped.load(Ordering::SeqCst));
        drop(server);
        assert!(main_dropped.load(Ordering::SeqCst));
        assert!(child_dropped.load(Ordering::SeqCst));
    }

    #[tokio::test]
    async fn can_be_dropped_inside_another_runtime() {
        let server = ServerThread::spawn("test-server", std::future::pending::<()>)
            .expect("spawn server thread");
        drop(server);
    }
}
