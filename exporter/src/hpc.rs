//! HPC job mapping (`--hpc-job-mapping-dir`), as dcgm-exporter reads it: the batch
//! system's prolog writes one file per GPU into a directory, named after the GPU index
//! (`0`) or, for a MIG instance, `<GPU index>.<GPU instance ID>` (`2.1`), listing the
//! jobs running on it, one job ID per line. Each series of that device is then repeated
//! once per job with an `hpc_job` label. Other file names are ignored.
//!
//! The directory is re-read in the background every [`POLL_INTERVAL`] and the sampler
//! picks up what changed: jobs come and go without a restart and no scrape waits on the
//! disk. Each file is read bounded. A malformed file (not UTF-8, too large, a line that
//! is no job ID) is logged with its file and line, once per distinct problem; that
//! device keeps its last good reading, and every other file keeps working.

use arc_swap::ArcSwap;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// How often the directory is re-read.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// A mapping file lists a few jobs: 64 KiB is thousands of job IDs.
const FILE_LIMIT: u64 = 64 << 10;

/// Longest job ID taken (Slurm's are a few dozen characters at most).
const MAX_JOB_ID: usize = 256;

/// The jobs on each device, as last read.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HpcJobs {
    /// Changes whenever `by_device` changes.
    pub generation: u64,
    /// Device key (`"0"`, `"2.1"`) → its jobs, in file order.
    pub by_device: JobsByDevice,
}

impl HpcJobs {
    /// The jobs of a GPU (`gpu_instance` None) or of a MIG instance.
    pub fn jobs(&self, gpu_index: u32, gpu_instance: Option<u32>) -> &[String] {
        let key = match gpu_instance {
            None => gpu_index.to_string(),
            Some(gi) => format!("{gpu_index}.{gi}"),
        };
        self.by_device.get(&key).map_or(&[], Vec::as_slice)
    }
}

/// Whether `name` is a mapping file's name: `<digits>` or `<digits>.<digits>`.
pub fn is_mapping_file(name: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    match name.split_once('.') {
        None => digits(name),
        Some((gpu, gi)) => digits(gpu) && digits(gi),
    }
}

/// A mapping file that does not read, with where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub file: PathBuf,
    /// 1-based; 0 when the file as a whole is at fault.
    pub line: usize,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(f, "{}:{}: {}", self.file.display(), self.line, self.message)
        }
    }
}

/// The job IDs in a mapping file's text: one per line, surrounding blanks trimmed,
/// blank lines skipped. A line with inner blanks or control characters, or longer than
/// a job ID can be, is an error naming the line.
pub fn parse(text: &str) -> Result<Vec<String>, BadLine> {
    let mut jobs = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let job = line.trim();
        if job.is_empty() {
            continue;
        }
        if job.len() > MAX_JOB_ID {
            return Err(BadLine {
                line: i + 1,
                why: BadJobId::TooLong(job.len()),
            });
        }
        if let Some(c) = job.chars().find(|c| c.is_whitespace() || c.is_control()) {
            return Err(BadLine {
                line: i + 1,
                why: BadJobId::NotOne {
                    job: job.to_string(),
                    found: c,
                },
            });
        }
        if !jobs.iter().any(|j| j == job) {
            jobs.push(job.to_string());
        }
    }
    Ok(jobs)
}

/// A mapping file's line that is not one job ID: which (1-based), and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadLine {
    pub line: usize,
    pub why: BadJobId,
}

/// Why a line is not one job ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadJobId {
    #[error("a job ID of {0} bytes (at most {MAX_JOB_ID})")]
    TooLong(usize),
    #[error("{job:?} is not one job ID (it contains {found:?}); expected one job ID per line")]
    NotOne { job: String, found: char },
}

/// Device key → its jobs.
pub type JobsByDevice = BTreeMap<String, Vec<String>>;

/// Read the directory: every mapping file that reads, and the problems of those that
/// do not (keyed by device, so a caller can keep their last good reading).
pub fn read_dir(dir: &Path) -> std::io::Result<(JobsByDevice, Vec<(String, Problem)>)> {
    let mut jobs = BTreeMap::new();
    let mut problems = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            continue;
        };
        if !is_mapping_file(&name) {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            continue;
        }
        let problem = |line: usize, message: String| Problem {
            file: path.clone(),
            line,
            message,
        };
        match kube_support::config_file::read_to_string(&path, FILE_LIMIT) {
            // Deleted between the listing and the read: the job ended.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => problems.push((name, problem(0, e.to_string()))),
            Ok(text) => match parse(&text) {
                Ok(list) => {
                    if !list.is_empty() {
                        jobs.insert(name, list);
                    }
                }
                Err(BadLine { line, why }) => problems.push((name, problem(line, why.to_string()))),
            },
        }
    }
    Ok((jobs, problems))
}

/// The directory's state across reads: the last good jobs of each device and what was
/// last logged, so a problem is logged once, not every poll.
#[derive(Debug, Default)]
pub struct Reader {
    current: HpcJobs,
    logged: Vec<String>,
    dir_missing_logged: bool,
}

impl Reader {
    /// Read `dir` once more; the new jobs if they changed.
    pub fn poll(&mut self, dir: &Path) -> Option<&HpcJobs> {
        let (mut jobs, problems) = match read_dir(dir) {
            Ok(read) => {
                if self.dir_missing_logged {
                    tracing::info!(dir = %dir.display(), "HPC job mapping directory is readable again");
                    self.dir_missing_logged = false;
                }
                read
            }
            Err(e) => {
                // dcgm-exporter keeps serving without job labels; so do we.
                if !self.dir_missing_logged {
                    tracing::error!(dir = %dir.display(), error = %e, "cannot read the HPC job mapping directory: no hpc_job labels until it is readable");
                    self.dir_missing_logged = true;
                }
                (BTreeMap::new(), Vec::new())
            }
        };
        let mut logged = Vec::with_capacity(problems.len());
        for (device, p) in problems {
            let text = p.to_string();
            if !self.logged.contains(&text) {
                tracing::error!(problem = %text, "HPC job mapping file does not read; that device keeps its last good jobs");
            }
            logged.push(text);
            if let Some(previous) = self.current.by_device.get(&device) {
                jobs.insert(device, previous.clone());
            }
        }
        self.logged = logged;
        if jobs == self.current.by_device {
            return None;
        }
        self.current.by_device = jobs;
        self.current.generation += 1;
        Some(&self.current)
    }
}

/// Re-read `dir` every [`POLL_INTERVAL`] into `store` until the runtime stops; the first
/// read happens before this returns, so the first cycle already has the jobs.
pub fn watch(dir: PathBuf, store: Arc<ArcSwap<HpcJobs>>, runtime: &tokio::runtime::Handle) {
    let mut reader = Reader::default();
    if let Some(jobs) = reader.poll(&dir) {
        store.store(Arc::new(jobs.clone()));
    }
    tracing::info!(dir = %dir.display(), "HPC job mapping: series of GPUs with jobs carry hpc_job");
    runtime.spawn(async move {
        let mut ticker = tokio::time::interval(POLL_INTERVAL);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        ticker.tick().await;
        loop {
            ticker.tick().await;
            // Reading a directory of small files: brief, but blocking.
            let (r, d) = (std::mem::take(&mut reader), dir.clone());
            let Ok((r, jobs)) = tokio::task::spawn_blocking(move || {
                let mut r = r;
                let jobs = r.poll(&d).cloned();
                (r, jobs)
            })
            .await
            else {
                return;
            };
            reader = r;
            if let Some(jobs) = jobs {
                tracing::info!(devices = jobs.by_device.len(), "HPC job mapping changed");
                store.store(Arc::new(jobs));
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping_file_names_are_gpu_or_gpu_dot_instance() {
        for ok in ["0", "17", "2.0", "3.10"] {
            assert!(is_mapping_file(ok), "{ok}");
        }
        for bad in ["", "a", "0.", ".1", "1.2.3", "0x1", "1 ", "job1", "1.a"] {
            assert!(!is_mapping_file(bad), "{bad}");
        }
    }

    #[test]
    fn job_ids_one_per_line_blanks_skipped_duplicates_once() {
        assert_eq!(
            parse("1001\n\n  1002_3 \r\n1001\n").unwrap(),
            vec!["1001".to_string(), "1002_3".to_string()]
        );
        assert_eq!(parse("").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_line_that_is_not_one_job_id_is_an_error_naming_the_line() {
        let BadLine { line, why } = parse("1001\njob 2\n").unwrap_err();
        assert_eq!(line, 2);
        let message = why.to_string();
        assert!(message.contains("job 2"), "{message}");
        let long = "9".repeat(MAX_JOB_ID + 1);
        assert_eq!(parse(&format!("1\n2\n{long}")).unwrap_err().line, 3);
        assert_eq!(parse("a\u{7}b").unwrap_err().line, 1);
    }

    #[test]
    fn jobs_of_gpus_and_mig_instances_by_their_keys() {
        let jobs = HpcJobs {
            generation: 1,
            by_device: [
                ("0".to_string(), vec!["a".to_string()]),
                ("1.2".to_string(), vec!["b".to_string()]),
            ]
            .into_iter()
            .collect(),
        };
        assert_eq!(jobs.jobs(0, None), ["a"]);
        assert_eq!(jobs.jobs(1, Some(2)), ["b"]);
        assert!(jobs.jobs(1, None).is_empty());
        assert!(jobs.jobs(0, Some(0)).is_empty());
    }

    #[test]
    fn a_malformed_file_keeps_its_last_good_jobs_and_others_keep_changing() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path();
        std::fs::write(p.join("0"), "100\n").unwrap();
        std::fs::write(p.join("1"), "200\n").unwrap();
        std::fs::write(p.join("README"), "not a mapping file\n").unwrap();
        let mut r = Reader::default();
        let first = r.poll(p).unwrap().clone();
        assert_eq!(first.jobs(0, None), ["100"]);
        assert_eq!(first.jobs(1, None), ["200"]);
        assert_eq!(first.by_device.len(), 2);
        assert!(r.poll(p).is_none(), "nothing changed");

        std::fs::write(p.join("0"), "100\nbad line\n").unwrap();
        std::fs::write(p.join("1"), "201\n").unwrap();
        let second = r.poll(p).unwrap().clone();
        assert_eq!(
            second.jobs(0, None),
            ["100"],
            "the malformed file keeps its last good jobs"
        );
        assert_eq!(second.jobs(1, None), ["201"], "the other file is read anew");
        assert!(second.generation > first.generation);

        std::fs::remove_file(p.join("0")).unwrap();
        let third = r.poll(p).unwrap().clone();
        assert!(third.jobs(0, None).is_empty(), "a removed file's jobs end");
    }

    #[test]
    fn a_missing_directory_means_no_jobs_until_it_appears() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("jobs");
        let mut r = Reader::default();
        assert!(r.poll(&p).is_none());
        std::fs::create_dir(&p).unwrap();
        std::fs::write(p.join("3.1"), "77\n").unwrap();
        assert_eq!(r.poll(&p).unwrap().jobs(3, Some(1)), ["77"]);
    }
}
