//! A fault cue: a file whose content switches a driver fault on and off while the
//! process runs (`GPU_SIM_FAULT_FILE`), so that a test can start a fault, end it at an
//! instant it knows and time the client's recovery from there, instead of guessing
//! where a scenario's time window falls.
//!
//! The file holds one word (surrounding blanks and `#` comments ignored):
//! - `unavailable`: every call after init fails with `NVML_ERROR_UNKNOWN`, as a driver
//!   that went away does;
//! - `hang`: every call after init blocks until the file says otherwise;
//! - `slow=MS`: every call after init sleeps `MS` milliseconds first;
//! - `not_loaded`: `nvmlInit*` fails with `NVML_ERROR_DRIVER_NOT_LOADED` and every
//!   other call as `unavailable`;
//! - nothing (empty or missing file): no fault.
//!
//! A word it does not know is reported once on stderr and read as no fault. The file is
//! looked at no more than every [`CHECK_EVERY`], so a busy client does not pay a
//! `stat` per call.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// Environment variable naming the cue file.
pub const FAULT_FILE_ENV: &str = "GPU_SIM_FAULT_FILE";

/// How often the file's metadata is looked at, at most.
pub const CHECK_EVERY: Duration = Duration::from_millis(10);

/// The fault the cue file asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Cue {
    #[default]
    None,
    Unavailable,
    Hang,
    Slow(Duration),
    NotLoaded,
}

/// Parse the cue file's text; `Err` carries the word that is not a cue.
pub fn parse(text: &str) -> Result<Cue, String> {
    let word = text
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .find(|l| !l.is_empty())
        .unwrap_or("");
    match word {
        "" => Ok(Cue::None),
        "unavailable" => Ok(Cue::Unavailable),
        "hang" => Ok(Cue::Hang),
        "not_loaded" => Ok(Cue::NotLoaded),
        w => w
            .strip_prefix("slow=")
            .and_then(|ms| ms.trim().parse::<u64>().ok())
            .map(|ms| Cue::Slow(Duration::from_millis(ms)))
            .ok_or_else(|| w.to_string()),
    }
}

/// A cue file looked at no more than every [`CHECK_EVERY`], and read again only when
/// its modification time or size changed.
pub(crate) struct Watched {
    checked: Option<Instant>,
    seen: Option<(SystemTime, u64)>,
}

impl Watched {
    pub(crate) const fn new() -> Watched {
        Watched {
            checked: None,
            seen: None,
        }
    }

    /// The file's text (empty when it is missing) when it changed since the last look;
    /// `None` when it did not, or when it is not time to look.
    pub(crate) fn changed(&mut self, path: &Path) -> Option<String> {
        if self.checked.is_some_and(|at| at.elapsed() < CHECK_EVERY) {
            return None;
        }
        self.checked = Some(Instant::now());
        let meta = std::fs::metadata(path)
            .ok()
            .map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()));
        if meta == self.seen {
            return None;
        }
        self.seen = meta;
        Some(if meta.is_some() {
            std::fs::read_to_string(path).unwrap_or_default()
        } else {
            String::new()
        })
    }
}

struct State {
    file: Watched,
    cue: Cue,
    reported: Option<String>,
}

static STATE: Mutex<State> = Mutex::new(State {
    file: Watched::new(),
    cue: Cue::None,
    reported: None,
});

fn path() -> Option<PathBuf> {
    std::env::var_os(FAULT_FILE_ENV).map(PathBuf::from)
}

/// The fault in force now.
pub fn current() -> Cue {
    let Some(path) = path() else {
        return Cue::None;
    };
    let mut s = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(text) = s.file.changed(&path) else {
        return s.cue;
    };
    s.cue = match parse(&text) {
        Ok(c) => c,
        Err(word) => {
            if s.reported.as_deref() != Some(word.as_str()) {
                eprintln!(
                    "fake-nvml: {}: {word:?} is not a fault cue (unavailable, hang, slow=MS, not_loaded)",
                    path.display()
                );
                s.reported = Some(word);
            }
            Cue::None
        }
    };
    s.cue
}

/// Apply the cue to a call after init: block while it says `hang`, sleep for `slow`,
/// and answer whether the driver is reachable.
pub fn before_call() -> bool {
    loop {
        match current() {
            Cue::None => return true,
            Cue::Slow(d) => {
                std::thread::sleep(d);
                return true;
            }
            Cue::Unavailable | Cue::NotLoaded => return false,
            Cue::Hang => std::thread::sleep(CHECK_EVERY),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cues_parse_and_unknown_words_are_refused() {
        assert_eq!(parse(""), Ok(Cue::None));
        assert_eq!(parse("# off\n\n"), Ok(Cue::None));
        assert_eq!(parse(" hang \n"), Ok(Cue::Hang));
        assert_eq!(parse("unavailable # driver gone"), Ok(Cue::Unavailable));
        assert_eq!(parse("not_loaded"), Ok(Cue::NotLoaded));
        assert_eq!(parse("slow=250"), Ok(Cue::Slow(Duration::from_millis(250))));
        assert_eq!(parse("slow=x"), Err("slow=x".to_string()));
        assert_eq!(parse("explode"), Err("explode".to_string()));
    }
}
