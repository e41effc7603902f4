//! Per-field read periods: a slow field is read once per period and serves its last
//! reading between, never an older one; a fast field is read every cycle; every period
//! at one cycle is today's every-cycle reading.

use super::*;
use crate::sampler::{Cadence, FieldPeriods};
use std::sync::Mutex;

/// One GPU whose energy counter advances by 1000 mJ per cycle (the truth, whether or
/// not it is read) and whose utilisation is the cycle number; it records each read.
#[derive(Clone, Default)]
struct Counting {
    /// Per cycle (from 1): the quantities read.
    reads: Arc<Mutex<Vec<Vec<Quantity>>>>,
    device_checks: Arc<AtomicU32>,
    /// Energy reads that fail (by read number, from 1).
    fail_energy_read: Option<usize>,
    energy_reads: usize,
    /// The driver lists no GPU.
    no_gpus: bool,
}

impl GpuSource for Counting {
    fn describe(&self) -> String {
        "counting".into()
    }
    fn discover(&mut self, _: &[crate::plan::catalog::LabelField]) -> Result<Inventory, ReadError> {
        Ok(Inventory {
            driver_version: "1".into(),
            nvml_version: "1".into(),
            entities: if self.no_gpus {
                Vec::new()
            } else {
                vec![gpu(0)]
            },
        })
    }
    fn probe(&mut self) -> Result<(), ReadError> {
        Ok(())
    }
    fn device_set_changed(&mut self) -> bool {
        self.device_checks.fetch_add(1, Ordering::SeqCst);
        false
    }
    fn read(&mut self, _: usize, wanted: &[Quantity], out: &mut Vec<Result<Raw, ReadError>>) {
        let mut reads = self.reads.lock().unwrap();
        reads.push(wanted.to_vec());
        let cycle = reads.len() as u64;
        out.clear();
        for q in wanted {
            out.push(match q {
                Quantity::GpuUtil => Ok(Raw::U64(cycle)),
                Quantity::TotalEnergy => {
                    self.energy_reads += 1;
                    if self.fail_energy_read == Some(self.energy_reads) {
                        Err(ReadError::Failed("transient".into()))
                    } else {
                        Ok(Raw::U64(1000 * cycle))
                    }
                }
                _ => Err(ReadError::NotSupported),
            });
        }
    }
    fn processes(&mut self, _: usize) -> Result<Vec<ProcessSample>, ReadError> {
        Ok(Vec::new())
    }
    fn xid_events(&mut self) -> Vec<crate::source::XidEvent> {
        Vec::new()
    }
}

const PLAN: &str =
    "DCGM_FI_DEV_GPU_UTIL, gauge, u\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, e\n";

fn counting_sampler(source: &Counting, periods: &str) -> Sampler {
    let (plan, _) = crate::plan::counters::plan(PLAN, "test.csv").unwrap();
    let interval = Duration::from_secs(1);
    Sampler::new(
        Box::new(source.clone()),
        Arc::new(plan),
        SamplerOptions {
            interval,
            hostname: None,
            replace_blanks_in_model_name: false,
            process_metrics: false,
            pod_uid: false,
            virtual_gpus: false,
            old_namespace: false,
        },
        "".into(),
    )
    .with_cadence(Cadence::new(
        &FieldPeriods::parse(periods).unwrap(),
        interval,
    ))
}

/// (utilisation, energy) served by each of `n` cycles.
fn served(s: &mut Sampler, n: usize) -> Vec<(Option<Value>, Option<Value>)> {
    (0..n)
        .map(|_| {
            let snap = s.cycle();
            (snap.values[0], snap.values[1])
        })
        .collect()
}

fn int(v: i64) -> Option<Value> {
    Some(Value::Int(v))
}

#[test]
fn a_slow_field_is_read_once_per_period_and_serves_its_last_reading_between() {
    let source = Counting::default();
    let mut s = counting_sampler(
        &source,
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=3s,device-set=2s",
    );
    let got = served(&mut s, 7);
    let reads = source.reads.lock().unwrap().clone();
    let energy_cycles: Vec<usize> = (0..reads.len())
        .filter(|&c| reads[c].contains(&Quantity::TotalEnergy))
        .map(|c| c + 1)
        .collect();
    assert_eq!(energy_cycles, [1, 4, 7]);
    assert!(reads.iter().all(|r| r.contains(&Quantity::GpuUtil)));
    // Utilisation is this cycle's; energy the last reading, at most 2 cycles old, and
    // monotone.
    let want: Vec<_> = [1, 1, 1, 4, 4, 4, 7]
        .iter()
        .enumerate()
        .map(|(c, e)| (int(c as i64 + 1), int(1000 * e)))
        .collect();
    assert_eq!(got, want);
    // The device set: discovered in cycle 1, checked every second cycle after.
    assert_eq!(source.device_checks.load(Ordering::SeqCst), 3);
}

#[test]
fn a_failed_read_of_a_slow_field_serves_nothing_and_is_read_again_next_cycle() {
    let source = Counting {
        fail_energy_read: Some(2),
        ..Counting::default()
    };
    let mut s = counting_sampler(&source, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=3s");
    let got: Vec<_> = served(&mut s, 6).into_iter().map(|(_, e)| e).collect();
    // Read in cycles 1 and 4 (fails: nothing older is served), 5, then due at 8.
    assert_eq!(
        got,
        [int(1000), int(1000), int(1000), None, int(5000), int(5000)]
    );
}

#[test]
fn every_period_at_one_cycle_reads_every_field_every_cycle() {
    for periods in ["*=0", "*=1s"] {
        let source = Counting::default();
        let mut s = counting_sampler(&source, periods);
        let got = served(&mut s, 4);
        let want: Vec<_> = (1..=4).map(|c| (int(c), int(1000 * c))).collect();
        assert_eq!(got, want, "{periods}");
        assert_eq!(source.device_checks.load(Ordering::SeqCst), 3, "{periods}");
    }
    // And the sampler's own default, without a cadence, is the same.
    let source = Counting::default();
    let (plan, _) = crate::plan::counters::plan(PLAN, "test.csv").unwrap();
    let mut s = Sampler::new(
        Box::new(source.clone()),
        Arc::new(plan),
        counting_sampler(&source, "").opts.clone(),
        "".into(),
    );
    let got = served(&mut s, 4);
    assert_eq!(
        got,
        (1..=4).map(|c| (int(c), int(1000 * c))).collect::<Vec<_>>()
    );
}

#[test]
fn a_driver_that_lists_no_gpu_is_asked_every_cycle_whatever_the_period() {
    let source = Counting {
        no_gpus: true,
        ..Counting::default()
    };
    let mut s = counting_sampler(&source, "device-set=10s");
    for _ in 0..4 {
        s.cycle();
    }
    assert_eq!(source.device_checks.load(Ordering::SeqCst), 3);
}
