//! Per-link NVLink reads: link state and data counters through one scoped
//! `nvmlDeviceGetFieldValues` call per GPU (as DCGM reads its per-link fields), error
//! counters through `nvmlDeviceGetNvLinkErrorCounter`.

use super::{NvmlSource, map_err, raw};
use crate::plan::catalog::Quantity;
use crate::source::{Raw, ReadError};
use nvml_wrapper::enum_wrappers::nv_link::ErrorCounter;
use nvml_wrapper_sys::bindings::field_id::*;

/// The scoped field requests that answer a link quantity (their sum); none for the
/// error counters.
fn link_fields(q: Quantity) -> &'static [u32] {
    match q {
        Quantity::LinkState => &[NVML_FI_DEV_NVLINK_GET_STATE],
        Quantity::LinkTxKib => &[NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX],
        Quantity::LinkRxKib => &[NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX],
        Quantity::LinkDataKib => &[
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
            NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
        ],
        _ => &[],
    }
}

fn error_counter(q: Quantity) -> Option<ErrorCounter> {
    Some(match q {
        Quantity::LinkCrcFlitErrors => ErrorCounter::DlCrcFlit,
        Quantity::LinkCrcDataErrors => ErrorCounter::DlCrcData,
        Quantity::LinkReplayErrors => ErrorCounter::DlReplay,
        Quantity::LinkRecoveryErrors => ErrorCounter::DlRecovery,
        _ => return None,
    })
}

impl NvmlSource {
    /// `NVML_FI_DEV_NVLINK_LINK_COUNT`; 0 where the GPU has no NVLink.
    pub(super) fn link_count(&mut self, entity: usize) -> u32 {
        let (Ok(nvml), Ok(dev)) = (self.nvml(), self.device(entity)) else {
            return 0;
        };
        // SAFETY: `dev` is a live handle of this NVML instance.
        let handle = unsafe { dev.handle() };
        match raw::field_values(nvml, handle, &[(NVML_FI_DEV_NVLINK_LINK_COUNT, 0)]) {
            Ok(v) => match v.first() {
                Some(Ok(n)) => n.as_f64() as u32,
                _ => 0,
            },
            Err(_) => 0,
        }
    }

    /// [`crate::source::GpuSource::read_links`].
    pub(super) fn read_links_of(
        &mut self,
        entity: usize,
        links: u32,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        out.clear();
        let total = links as usize * quantities.len();
        let (nvml, dev) = match (self.nvml(), self.device(entity)) {
            (Ok(n), Ok(d)) => (n, d),
            (Err(e), _) | (_, Err(e)) => {
                out.extend((0..total).map(|_| Err(e.clone())));
                return;
            }
        };
        let requests: Vec<(u32, u32)> = (0..links)
            .flat_map(|link| {
                quantities
                    .iter()
                    .flat_map(move |&q| link_fields(q).iter().map(move |&f| (f, link)))
            })
            .collect();
        // SAFETY: `dev` is a live handle of this NVML instance.
        let handle = unsafe { dev.handle() };
        let mut fields = match requests.is_empty() {
            true => Vec::new(),
            false => raw::field_values(nvml, handle, &requests)
                .unwrap_or_else(|e| requests.iter().map(|_| Err(e.clone())).collect()),
        }
        .into_iter();
        for link in 0..links {
            let wrapper = dev.link_wrapper_for(link);
            for &q in quantities {
                let r = if let Some(counter) = error_counter(q) {
                    wrapper
                        .error_counter(counter)
                        .map(Raw::U64)
                        .map_err(map_err)
                } else {
                    let parts = link_fields(q).len();
                    let mut sum: Result<Raw, ReadError> = Err(ReadError::NotSupported);
                    for (i, part) in fields.by_ref().take(parts).enumerate() {
                        sum = match (i, sum, part) {
                            (0, _, p) => p,
                            (_, Ok(a), Ok(b)) => {
                                Ok(Raw::U64(a.as_f64() as u64 + b.as_f64() as u64))
                            }
                            (_, Err(e), _) | (_, _, Err(e)) => Err(e),
                        };
                    }
                    sum
                };
                out.push(r);
            }
        }
    }
}
