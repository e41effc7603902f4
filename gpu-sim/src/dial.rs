//! A utilisation dial: a file that sets whole GPUs' utilisation while the node runs, so
//! that a test (or a demo) can raise and lower load on demand, as an autoscaling test
//! needs, instead of waiting for a scenario's curve.
//!
//! The file has one `GPU=PERCENT` per line, `GPU` an index or `*` for every GPU, `#`
//! starting a comment; a GPU not named follows its scenario load. The file is looked at
//! no more than every [`CHECK_EVERY`] and re-read when its modification time or length
//! changes. A setting takes effect at the scenario instant the change is first seen, and
//! the load's integral (energy, NVLink bytes) goes on from its value there, so counters
//! stay monotonic. A file that does not parse keeps the previous settings, and its
//! first bad line is reported once on stderr with its number. MIG-enabled GPUs ignore
//! the dial (their load is their instances').

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

/// How often the file's metadata is looked at, at most.
pub const CHECK_EVERY: Duration = Duration::from_millis(100);

/// One dial setting: `percent` from scenario second `since`, when the load's integral
/// was `integral_at_since`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Setting {
    pub since: f64,
    pub percent: f64,
    pub integral_at_since: f64,
}

impl Setting {
    pub(crate) fn integral(&self, t: f64) -> f64 {
        self.integral_at_since + self.percent * (t - self.since).max(0.0)
    }
}

/// What the file asks for: per GPU, and for every GPU.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub all: Option<f64>,
    pub gpus: HashMap<u32, f64>,
}

impl Wanted {
    fn percent(&self, gpu: u32) -> Option<f64> {
        self.gpus.get(&gpu).copied().or(self.all)
    }
}

/// A line of the dial file that does not parse.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("line {line}: {text:?} is not GPU=PERCENT (GPU an index or *, PERCENT 0 to 100)")]
pub struct DialError {
    pub line: usize,
    pub text: String,
}

/// Parse a dial file's text.
pub fn parse(text: &str) -> Result<Wanted, DialError> {
    let mut wanted = Wanted::default();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let bad = || DialError {
            line: i + 1,
            text: raw.to_string(),
        };
        let (gpu, percent) = line.split_once('=').ok_or_else(bad)?;
        let percent: f64 = percent.trim().parse().map_err(|_| bad())?;
        if !(0.0..=100.0).contains(&percent) {
            return Err(bad());
        }
        match gpu.trim() {
            "*" => wanted.all = Some(percent),
            index => {
                let index: u32 = index.parse().map_err(|_| bad())?;
                wanted.gpus.insert(index, percent);
            }
        }
    }
    Ok(wanted)
}

#[derive(Debug, Default)]
struct State {
    checked: Option<Instant>,
    seen: Option<(SystemTime, u64)>,
    wanted: Wanted,
    reported: bool,
    settings: HashMap<u32, Setting>,
}

/// The dial of one node.
#[derive(Debug)]
pub struct Dial {
    path: PathBuf,
    check_every: Duration,
    state: Mutex<State>,
}

impl Dial {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Dial {
            path: path.into(),
            check_every: CHECK_EVERY,
            state: Mutex::new(State::default()),
        }
    }

    /// Look at the file at most every `every` instead of [`CHECK_EVERY`].
    pub fn checked_every(mut self, every: Duration) -> Self {
        self.check_every = every;
        self
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The setting GPU `gpu` follows at scenario second `t`, given its scenario load's
    /// integral (`base_integral`) and the setting's integral for a change seen now.
    pub(crate) fn setting(
        &self,
        gpu: u32,
        t: f64,
        base_integral: impl Fn(f64) -> f64,
    ) -> Option<Setting> {
        let mut s = self.lock();
        self.refresh(&mut s);
        let want = s.wanted.percent(gpu);
        let current = s.settings.get(&gpu).copied();
        match (want, current) {
            (None, None) => None,
            (Some(p), Some(c)) if c.percent == p => Some(c),
            (want, current) => {
                // The integral up to now, whatever was followed so far.
                let integral_now = match current {
                    Some(c) => c.integral(t),
                    None => base_integral(t),
                };
                match want {
                    Some(percent) => {
                        let setting = Setting {
                            since: t,
                            percent,
                            integral_at_since: integral_now,
                        };
                        s.settings.insert(gpu, setting);
                        Some(setting)
                    }
                    // Back to the scenario's course, which has its own integral: keep
                    // counters monotonic by holding the dial's last value instead.
                    None => current,
                }
            }
        }
    }

    fn refresh(&self, s: &mut State) {
        let now = Instant::now();
        if s.checked
            .is_some_and(|c| now.duration_since(c) < self.check_every)
        {
            return;
        }
        s.checked = Some(now);
        let Ok(meta) = std::fs::metadata(&self.path) else {
            return;
        };
        let stamp = (
            meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            meta.len(),
        );
        if s.seen == Some(stamp) {
            return;
        }
        let Ok(text) = std::fs::read_to_string(&self.path) else {
            return;
        };
        s.seen = Some(stamp);
        match parse(&text) {
            Ok(wanted) => {
                s.wanted = wanted;
                s.reported = false;
            }
            Err(e) if !s.reported => {
                eprintln!("gpu-sim: dial {}: {e}", self.path.display());
                s.reported = true;
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_indices_stars_and_comments_and_names_a_bad_line() {
        let w = parse("# load\n*=40\n2 = 95.5 # hot\n\n").unwrap();
        assert_eq!(w.all, Some(40.0));
        assert_eq!(w.percent(2), Some(95.5));
        assert_eq!(w.percent(0), Some(40.0));
        for (text, line) in [("*=40\nGPU0=5", 2), ("1=101", 1), ("x", 1), ("0=-1", 1)] {
            assert_eq!(parse(text).unwrap_err().line, line, "{text}");
        }
    }

    #[test]
    fn a_change_takes_effect_when_seen_and_the_integral_goes_on() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("dial");
        let dial = Dial::new(&path).checked_every(Duration::ZERO);
        let base = |t: f64| 10.0 * t;
        assert_eq!(dial.setting(0, 5.0, base), None, "no file: the scenario");
        std::fs::write(&path, "0=80\n").unwrap();
        let s = dial.setting(0, 10.0, base).unwrap();
        assert_eq!(
            (s.since, s.percent, s.integral_at_since),
            (10.0, 80.0, 100.0)
        );
        assert_eq!(s.integral(12.0), 260.0);
        assert_eq!(dial.setting(1, 10.0, base), None, "GPU 1 not named");
        std::fs::write(&path, "0=20\n1=50\n").unwrap();
        let s = dial.setting(0, 20.0, base).unwrap();
        assert_eq!(
            (s.since, s.percent, s.integral_at_since),
            (20.0, 20.0, 900.0)
        );
        std::fs::write(&path, "0=oops\n").unwrap();
        assert_eq!(dial.setting(0, 30.0, base).unwrap().percent, 20.0, "kept");
        std::fs::write(&path, "").unwrap();
        let s = dial.setting(0, 40.0, base).unwrap();
        assert_eq!(
            s.percent, 20.0,
            "unnamed again: held, never back to a lower integral"
        );
    }
}
