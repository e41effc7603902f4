//! Per-function call counts, for tests and benchmarks that hold NVML clients (ours and
//! peers') to a ceiling of calls per sampling cycle.
//!
//! Off unless `GPU_SIM_CALL_COUNTS=FILE` is set: then every export counts its calls, and
//! a background thread rewrites FILE (atomically, through a rename) every 50 ms while
//! the counts change, as `COUNT NAME` lines sorted by name. A reader takes two readings
//! some cycles apart and divides the difference. A file, not an extra export, because
//! the library's symbol set must stay exactly a real driver's.

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Mutex, Once};
use std::time::Duration;

pub const CALL_COUNTS_ENV: &str = "GPU_SIM_CALL_COUNTS";

/// One export's counter; `count!` gives each export its own static.
pub(crate) struct Counter {
    name: &'static str,
    calls: AtomicU64,
    registered: Once,
}

impl Counter {
    pub(crate) const fn new(name: &'static str) -> Self {
        Counter {
            name,
            calls: AtomicU64::new(0),
            registered: Once::new(),
        }
    }

    /// Count one call: a single relaxed load when counting is off.
    pub(crate) fn hit(&'static self) {
        self.hit_n(1);
    }

    /// Count `n` units (items a call asked for, under a name of its own).
    pub(crate) fn hit_n(&'static self, n: u64) {
        if !enabled() {
            return;
        }
        self.registered.call_once(|| {
            REGISTRY
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(self);
        });
        self.calls.fetch_add(n, Ordering::Relaxed);
        CHANGED.store(true, Ordering::Release);
    }
}

/// Count a call of the enclosing export under `name` (its NVML symbol), and spend what
/// the call costs under the cost model, if one is on (`cost.rs`).
macro_rules! count {
    ($name:literal) => {{
        static COUNTER: $crate::calls::Counter = $crate::calls::Counter::new($name);
        COUNTER.hit();
        $crate::cost::charge_call($name);
    }};
}
pub(crate) use count;

/// Count `$n` items under `$name`, a pseudo-function named after the call that asked
/// for them (`nvmlGpmMetricsGet.metrics`): what a call costs can grow with its items.
macro_rules! count_items {
    ($name:literal, $n:expr) => {{
        static COUNTER: $crate::calls::Counter = $crate::calls::Counter::new($name);
        COUNTER.hit_n($n);
    }};
}
pub(crate) use count_items;

static REGISTRY: Mutex<Vec<&'static Counter>> = Mutex::new(Vec::new());
static CHANGED: AtomicBool = AtomicBool::new(false);

// 0 = not looked at yet, 1 = off, 2 = on (the writer thread is running).
static STATE: AtomicU8 = AtomicU8::new(0);

fn enabled() -> bool {
    match STATE.load(Ordering::Relaxed) {
        1 => false,
        2 => true,
        _ => start(),
    }
}

#[cold]
fn start() -> bool {
    static START: Once = Once::new();
    START.call_once(|| match std::env::var_os(CALL_COUNTS_ENV) {
        Some(path) if !path.is_empty() => {
            let path = std::path::PathBuf::from(path);
            let spawned = std::thread::Builder::new()
                .name("fake-nvml-calls".into())
                .spawn(move || writer(&path));
            STATE.store(if spawned.is_ok() { 2 } else { 1 }, Ordering::Relaxed);
        }
        _ => STATE.store(1, Ordering::Relaxed),
    });
    STATE.load(Ordering::Relaxed) == 2
}

fn writer(path: &std::path::Path) {
    let tmp = path.with_extension("tmp");
    loop {
        std::thread::sleep(Duration::from_millis(50));
        if !CHANGED.swap(false, Ordering::Acquire) {
            continue;
        }
        let mut lines: Vec<(&str, u64)> = REGISTRY
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|c| (c.name, c.calls.load(Ordering::Relaxed)))
            .collect();
        lines.sort_unstable();
        let text: String = lines.iter().map(|(n, c)| format!("{c} {n}\n")).collect();
        // A failed write is retried on the next change; there is nobody to report to.
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(&tmp, path);
        }
    }
}
