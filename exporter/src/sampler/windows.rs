//! The trailing windows of dcgm-exporter's own collectors (`DCGM_EXP_*`).

use super::plan::ExporterCollectors;
use crate::health::{self, CounterHistory, Window};
use crate::plan::catalog::Quantity;
use crate::snapshot::ExporterValues;
use crate::source::Raw;
use std::time::Instant;

/// The trailing windows of one GPU.
pub(super) struct GpuWindows {
    /// XID codes, when each was reported (a MIG instance's count on its GPU).
    pub(super) xids: Window<u64>,
    /// Clock-event reason masks of the cycles that had any reason set.
    pub(super) clock_events: Window<u64>,
    /// PCIe replays and the four NVLink error counters, for the health watches.
    pub(super) counters: CounterHistory<5>,
}

/// One GPU's `DCGM_EXP_*` values at `now`, from this cycle's readings and its windows.
pub(super) fn exporter_values(
    c: &ExporterCollectors,
    w: &mut GpuWindows,
    readings: &[(Quantity, Raw)],
    up: bool,
    now: Instant,
) -> ExporterValues {
    let reading = |q: Quantity| {
        readings
            .iter()
            .find(|(x, _)| *x == q)
            .map(|(_, r)| r.as_f64() as u64)
    };
    let mut v = ExporterValues::default();
    w.xids.expire(now);
    for code in w.xids.values() {
        *v.xid_window.entry(code).or_insert(0) += 1;
    }
    if c.clock_events_count {
        // dcgm-exporter counts the samples (one per collect interval) with each reason
        // set; cycles with no reason set count nothing, so only those are kept.
        let known = health::CLOCK_EVENTS.iter().fold(0, |m, (bit, _)| m | bit);
        if let Some(mask) = reading(Quantity::ClockEventReasons).map(|m| m & known)
            && mask != 0
            && up
        {
            w.clock_events.push(now, mask);
        }
        w.clock_events.expire(now);
        for mask in w.clock_events.values() {
            for (i, (bit, _)) in health::CLOCK_EVENTS.iter().enumerate() {
                if mask & bit != 0 {
                    v.clock_events_window[i] += 1;
                }
            }
        }
    }
    if c.health {
        use Quantity::*;
        let counters = [
            PcieReplayCounter,
            NvlinkCrcFlitErrors,
            NvlinkCrcDataErrors,
            NvlinkReplayErrors,
            NvlinkRecoveryErrors,
        ]
        .map(reading);
        let up_by = if up {
            Some(w.counters.record(now, counters.map(|c| c.unwrap_or(0))))
        } else {
            w.counters.clear();
            None
        };
        v.health = Some(health::evaluate(&health::Signals {
            readings,
            xids: w.xids.values().collect(),
            pcie_replays: counters[0].and(up_by.map(|u| u[0])),
            nvlink_errors: counters[1..]
                .iter()
                .all(Option::is_some)
                .then_some(up_by.map(|u| [u[1], u[2], u[3], u[4]]))
                .flatten(),
            lost: !up,
        }));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use super::*;

    use crate::plan::catalog::Quantity;

    use crate::health::{self, CounterHistory, Window};

    use crate::snapshot::Snapshot;

    use crate::source::{EntityInfo, GpuSource, Inventory, ProcessSample, Raw, ReadError};

    use std::collections::BTreeMap;
    use std::sync::Arc;

    use crate::source::XidEvent;
    use std::time::{Duration, Instant, SystemTime};

    fn collectors(window: Duration) -> ExporterCollectors {
        ExporterCollectors {
            xid_count: true,
            clock_events_count: true,
            health: true,
            xid_window: window,
            clock_events_window: window,
        }
    }

    fn windows(window: Duration) -> GpuWindows {
        GpuWindows {
            xids: Window::new(window),
            clock_events: Window::new(window),
            counters: CounterHistory::default(),
        }
    }

    #[test]
    fn windowed_counts_count_what_the_window_holds_and_forget_the_rest() {
        let window = Duration::from_secs(10);
        let c = collectors(window);
        let mut w = windows(window);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        w.xids.push(at(0), 79);
        w.xids.push(at(4), 13);
        w.xids.push(at(5), 13);
        let throttled = [(Quantity::ClockEventReasons, Raw::U64(0x4 | 0x40))];
        let idle = [(Quantity::ClockEventReasons, Raw::U64(0x1))];
        let none = [(Quantity::ClockEventReasons, Raw::U64(0))];
        exporter_values(&c, &mut w, &throttled, true, at(1));
        exporter_values(&c, &mut w, &none, true, at(2));
        exporter_values(&c, &mut w, &throttled, true, at(3));
        let v = exporter_values(&c, &mut w, &idle, true, at(6));
        assert_eq!(v.xid_window, BTreeMap::from([(13, 2), (79, 1)]));
        let count = |name: &str| {
            let i = health::CLOCK_EVENTS
                .iter()
                .position(|(_, n)| *n == name)
                .unwrap();
            v.clock_events_window[i]
        };
        assert_eq!(
            (count("power_cap"), count("hw_thermal"), count("gpu_idle")),
            (2, 2, 1)
        );
        assert_eq!(count("sw_thermal"), 0);
        // Eleven seconds on, XID 79 and the first throttled cycle have left the window.
        let v = exporter_values(&c, &mut w, &none, true, at(12));
        assert_eq!(v.xid_window, BTreeMap::from([(13, 2)]));
        assert_eq!(v.clock_events_window.iter().sum::<u64>(), 2 + 1);
        let health = v.health.unwrap();
        assert_eq!(health[5].code, "DCGM_FR_OK", "XID 79 left the window");
        // A lost GPU fails ALL whatever the windows hold.
        let v = exporter_values(&c, &mut w, &[], false, at(13));
        assert_eq!(v.health.unwrap()[5].code, "DCGM_FR_FALLEN_OFF_BUS");
    }

    /// One GPU with one MIG instance; each cycle reports the XIDs queued for it.
    #[derive(Default)]
    struct OneGpuState {
        xids: Vec<XidEvent>,
        remap_pending: u64,
    }

    #[derive(Clone, Default)]
    struct OneGpu(Arc<std::sync::Mutex<OneGpuState>>);

    impl GpuSource for OneGpu {
        fn describe(&self) -> String {
            "one GPU".into()
        }
        fn discover(
            &mut self,
            _: &[crate::plan::catalog::LabelField],
        ) -> Result<Inventory, ReadError> {
            let gpu = EntityInfo {
                gpu_index: 0,
                uuid: "GPU-0".into(),
                pci_bus_id: "00000000:01:00.0".into(),
                model_name: "NVIDIA H100 80GB HBM3".into(),
                minor_number: Some(0),
                mig: None,
                labels: Default::default(),
                lost: false,
            };
            let mut mig = gpu.clone();
            mig.mig = Some(crate::source::MigInfo {
                parent: 0,
                gpu_instance_id: 2,
                compute_instance_id: 0,
                slot: 0,
                profile: "3g.40gb".into(),
                mig_uuid: "MIG-0".into(),
                placement: None,
            });
            Ok(Inventory {
                driver_version: "1".into(),
                nvml_version: "1".into(),
                entities: vec![gpu, mig],
            })
        }
        fn probe(&mut self) -> Result<(), ReadError> {
            Ok(())
        }
        fn read(&mut self, _: usize, wanted: &[Quantity], out: &mut Vec<Result<Raw, ReadError>>) {
            out.clear();
            out.extend(wanted.iter().map(|q| match q {
                Quantity::RemapPending => Ok(Raw::U64(self.0.lock().unwrap().remap_pending)),
                Quantity::ClockEventReasons => Ok(Raw::U64(0x80)),
                _ => Err(ReadError::NotSupported),
            }));
        }
        fn processes(&mut self, _: usize) -> Result<Vec<ProcessSample>, ReadError> {
            Ok(Vec::new())
        }
        fn xid_events(&mut self) -> Vec<XidEvent> {
            std::mem::take(&mut self.0.lock().unwrap().xids)
        }
    }

    fn text(snap: &Snapshot) -> String {
        let mut out = Vec::new();
        crate::encode::render_device_families(snap, crate::encode::Format::Text, &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn the_exp_families_carry_dcgm_labels_and_a_mig_xid_counts_on_its_gpu() {
        let (plan, warnings) = crate::plan::counters::plan(
            "DCGM_EXP_XID_ERRORS_COUNT, counter, xids\nDCGM_EXP_CLOCK_EVENTS_COUNT, counter, clocks\nDCGM_EXP_GPU_HEALTH_STATUS, counter, health\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            warnings.len(),
            3,
            "each declared counter is noted: {warnings:?}"
        );
        let source = OneGpu::default();
        let mut s = Sampler::new(
            Box::new(source.clone()),
            Arc::new(plan),
            SamplerOptions {
                interval: Duration::from_secs(3600),
                hostname: None,
                replace_blanks_in_model_name: false,
                process_metrics: false,
                pod_uid: false,
                virtual_gpus: false,
                old_namespace: false,
            },
            "".into(),
        )
        .with_count_windows(Duration::from_millis(60_000), Duration::from_millis(1234));
        let first = text(&s.cycle());
        let gpu = r#"gpu="0",UUID="GPU-0",pci_bus_id="00000000:01:00.0",device="nvidia0",modelName="NVIDIA H100 80GB HBM3""#;
        // Nothing yet: one zero series per GPU, none for the MIG instance.
        assert!(
            first.contains(&format!(
                "DCGM_EXP_XID_ERRORS_COUNT{{{gpu},window_size_in_ms=\"60000\"}} 0\n"
            )),
            "{first}"
        );
        assert_eq!(first.matches("DCGM_EXP_XID_ERRORS_COUNT{").count(), 1);
        assert!(first.contains(&format!(
            "DCGM_EXP_CLOCK_EVENTS_COUNT{{{gpu},clock_event=\"hw_power_brake\",window_size_in_ms=\"1234\"}} 1\n"
        )));
        assert!(first.contains(&format!(
            "DCGM_EXP_GPU_HEALTH_STATUS{{{gpu},health_error_code=\"DCGM_FR_CLOCK_THROTTLE_POWER\",health_watch=\"POWER\"}} 10\n"
        )));
        assert!(first.contains(&format!(
            "DCGM_EXP_GPU_HEALTH_STATUS{{{gpu},health_error_code=\"DCGM_FR_OK\",health_watch=\"MEM\"}} 0\n"
        )));
        assert!(first.contains("# TYPE DCGM_EXP_GPU_HEALTH_STATUS gauge\n"));
        // XIDs on the MIG instance (entity 1) count on its GPU; a pending remap warns.
        let mut src = source.0.lock().unwrap();
        for code in [31, 31, 43] {
            src.xids.push(XidEvent {
                entity: 1,
                code,
                at: SystemTime::now(),
            });
        }
        src.remap_pending = 1;
        drop(src);
        let second = text(&s.cycle());
        assert!(
            second.contains(&format!(
                "DCGM_EXP_XID_ERRORS_COUNT{{{gpu},window_size_in_ms=\"60000\",xid=\"31\"}} 2\n"
            )),
            "{second}"
        );
        assert!(second.contains(&format!(
            "DCGM_EXP_XID_ERRORS_COUNT{{{gpu},window_size_in_ms=\"60000\",xid=\"43\"}} 1\n"
        )));
        assert!(!second.contains("window_size_in_ms=\"60000\"} 0"));
        assert!(second.contains(&format!(
            "DCGM_EXP_GPU_HEALTH_STATUS{{{gpu},health_error_code=\"DCGM_FR_PENDING_ROW_REMAP\",health_watch=\"MEM\"}} 10\n"
        )));
    }
}
