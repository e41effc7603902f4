//! A watch that keeps a local mirror of some Kubernetes objects, restarted from a fresh
//! list after every error.
//!
//! kube-runtime's `watcher` resumes after an error from the last resource version, but
//! a resumed watch on a quiet cluster sends nothing, so nothing would ever prove that
//! the API server is back, and a consumer could not tell "no change" from "no
//! connection". Restarting from a fresh list does both: a completed list proves the
//! connection, and it carries whatever changed meanwhile. Meanwhile the consumer keeps
//! its last known objects (an API server outage must not empty a node's pod labels or
//! the adapter's scrape targets), and each outage is logged once, not at every retry.

use futures_util::{Stream, StreamExt};
use kube::runtime::watcher;
use std::fmt::Debug;
use std::time::Duration;

/// Pause before the first restart after an error.
pub const MIN_RETRY: Duration = Duration::from_secs(1);
/// Longest pause between restarts while the API server keeps failing.
pub const MAX_RETRY: Duration = Duration::from_secs(30);

/// What a re-listing watch tells its consumer.
#[derive(Debug, Clone, PartialEq)]
pub enum Change<K> {
    /// A complete list: exactly these objects exist now, replacing whatever was known.
    /// Never partial: a list cut short by an error is dropped.
    Listed(Vec<K>),
    /// An object was added or modified.
    Applied(K),
    /// An object was deleted (or stopped matching the watch's selectors).
    Deleted(K),
    /// The watch failed. The last known objects remain the best knowledge; a fresh
    /// list follows once the API server answers again.
    Failed,
}

/// A pause that doubles from `min` up to `max`, and starts over after [`reset`](Self::reset).
#[derive(Debug, Clone)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    next: Duration,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            min,
            max,
            next: min,
        }
    }

    /// The pause to take now; the one after it is twice as long, up to the maximum.
    pub fn next_delay(&mut self) -> Duration {
        let delay = self.next;
        self.next = (self.next * 2).min(self.max);
        delay
    }

    pub fn reset(&mut self) {
        self.next = self.min;
    }
}

/// Keep `on_change` informed of the objects `api` and `config` select, until the
/// runtime stops. `what` names the watch in logs (`"pod watch"`).
pub async fn watch<K>(
    api: kube::Api<K>,
    config: watcher::Config,
    what: &str,
    on_change: impl FnMut(Change<K>),
) where
    K: kube::Resource + Clone + Debug + serde::de::DeserializeOwned + Send + 'static,
{
    watch_kept(api, config, what, |object| object, on_change).await
}

/// [`watch`], keeping of each object only what `keep` makes of it as it arrives: a
/// list of 50,000 pods is then 50,000 small records, never 50,000 whole objects
/// (their metadata alone, `managedFields` and all, is kilobytes each).
pub async fn watch_kept<K, T>(
    api: kube::Api<K>,
    config: watcher::Config,
    what: &str,
    mut keep: impl FnMut(K) -> T,
    mut on_change: impl FnMut(Change<T>),
) where
    K: kube::Resource + Clone + Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let mut backoff = Backoff::new(MIN_RETRY, MAX_RETRY);
    let mut outage = Outage::default();
    loop {
        let events = watcher::watcher(api.clone(), config.clone());
        if follow(events, what, &mut outage, &mut keep, &mut on_change).await {
            backoff.reset();
        }
        tokio::time::sleep(backoff.next_delay()).await;
    }
}

/// Whether an outage is under way, so that it is logged once.
#[derive(Debug, Default)]
pub struct Outage {
    logged: bool,
}

/// Feed one run of watch events to `on_change`, each object as `keep` makes it, until
/// the stream fails or ends. Returns whether a list completed during the run (the API
/// server answered in full).
pub async fn follow<K, T, E, S>(
    events: S,
    what: &str,
    outage: &mut Outage,
    keep: &mut impl FnMut(K) -> T,
    on_change: &mut impl FnMut(Change<T>),
) -> bool
where
    S: Stream<Item = Result<watcher::Event<K>, E>>,
    E: std::fmt::Display,
{
    let mut events = std::pin::pin!(events);
    let mut listing: Option<Vec<T>> = None;
    let mut listed = false;
    while let Some(event) = events.next().await {
        match event {
            Err(e) => {
                if !outage.logged {
                    tracing::warn!(watch = what, error = %e, "{what} failed; keeping the last known objects, retrying with backoff");
                    outage.logged = true;
                }
                on_change(Change::Failed);
                return listed;
            }
            Ok(watcher::Event::Init) => listing = Some(Vec::new()),
            Ok(watcher::Event::InitApply(object)) => {
                if let Some(l) = listing.as_mut() {
                    l.push(keep(object));
                }
            }
            Ok(watcher::Event::InitDone) => {
                if outage.logged {
                    tracing::info!(watch = what, "{what} is back");
                    outage.logged = false;
                }
                listed = true;
                on_change(Change::Listed(listing.take().unwrap_or_default()));
            }
            Ok(watcher::Event::Apply(object)) => on_change(Change::Applied(keep(object))),
            Ok(watcher::Event::Delete(object)) => on_change(Change::Deleted(keep(object))),
        }
    }
    listed
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::stream;
    use watcher::Event;

    /// One run over `events`, each object kept as `keep` makes it: the changes, whether
    /// a list completed, whether an outage is remembered.
    fn run_keeping<T>(
        events: Vec<Result<Event<&'static str>, &'static str>>,
        mut keep: impl FnMut(&'static str) -> T,
    ) -> (Vec<Change<T>>, bool, bool) {
        let mut seen = Vec::new();
        let mut outage = Outage::default();
        let listed = futures_util::FutureExt::now_or_never(follow(
            stream::iter(events),
            "test watch",
            &mut outage,
            &mut keep,
            &mut |c| seen.push(c),
        ))
        .expect("a ready stream finishes at once");
        (seen, listed, outage.logged)
    }

    fn run(
        events: Vec<Result<Event<&'static str>, &'static str>>,
    ) -> (Vec<Change<&'static str>>, bool, bool) {
        run_keeping(events, |o| o)
    }

    /// Lists, applies and deletes all carry what `keep` made of the object, made as
    /// the object arrived.
    #[test]
    fn every_change_carries_what_keep_made_of_its_object() {
        let mut kept = Vec::new();
        let events = vec![
            Ok(Event::Init),
            Ok(Event::InitApply("a")),
            Ok(Event::InitApply("bb")),
            Ok(Event::InitDone),
            Ok(Event::Apply("ccc")),
            Ok(Event::Delete("a")),
        ];
        let (seen, _, _) = run_keeping(events, |o| {
            kept.push(o);
            o.len()
        });
        assert_eq!(
            seen,
            vec![
                Change::Listed(vec![1, 2]),
                Change::Applied(3),
                Change::Deleted(1),
            ]
        );
        assert_eq!(kept, ["a", "bb", "ccc", "a"]);
    }

    #[test]
    fn a_list_is_handed_over_whole_and_only_when_complete() {
        let (seen, listed, down) = run(vec![
            Ok(Event::Init),
            Ok(Event::InitApply("a")),
            Ok(Event::InitApply("b")),
            Ok(Event::InitDone),
            Ok(Event::Apply("c")),
            Ok(Event::Delete("a")),
        ]);
        assert_eq!(
            seen,
            vec![
                Change::Listed(vec!["a", "b"]),
                Change::Applied("c"),
                Change::Deleted("a"),
            ]
        );
        assert!(listed);
        assert!(!down);
    }

    #[test]
    fn a_list_cut_short_by_an_error_is_dropped_and_the_failure_reported() {
        let (seen, listed, down) = run(vec![
            Ok(Event::Init),
            Ok(Event::InitApply("a")),
            Err("connection refused"),
            Ok(Event::InitDone),
        ]);
        assert_eq!(seen, vec![Change::Failed]);
        assert!(!listed, "no list completed");
        assert!(down, "the outage is remembered so it is logged once");
    }

    #[test]
    fn an_outage_ends_with_the_next_complete_list() {
        let mut outage = Outage::default();
        let mut seen = Vec::new();
        for events in [
            vec![Err("refused")],
            vec![Err("refused")],
            vec![Ok(Event::Init), Ok(Event::InitDone)],
        ] {
            let _ = futures_util::FutureExt::now_or_never(follow(
                stream::iter(events),
                "test watch",
                &mut outage,
                &mut |o: &str| o,
                &mut |c: Change<&str>| seen.push(c),
            ));
        }
        assert_eq!(
            seen,
            vec![Change::Failed, Change::Failed, Change::Listed(vec![])]
        );
        assert!(!outage.logged);
    }

    #[test]
    fn backoff_doubles_to_its_ceiling_and_starts_over_after_a_reset() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        let delays: Vec<u64> = (0..5).map(|_| b.next_delay().as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 5, 5]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_secs(1));
    }
}
