//! Page retirement by GPU generation, through the real nvml-wrapper: an A100 lists its
//! retired pages and pending state as the model counts them; an H100 answers
//! `NOT_SUPPORTED` (Hopper remaps rows instead), as the real driver does (580.159.04).

mod common;

use nvml_wrapper::enum_wrappers::device::RetirementCause;
use nvml_wrapper::error::NvmlError;

const FILE: &str = "retired-pages.toml";
const T: f64 = 20.0;
const CAUSES: [RetirementCause; 2] = [
    RetirementCause::MultipleSingleBitEccErrors,
    RetirementCause::DoubleBitEccError,
];

#[test]
fn the_a100_retires_pages_and_the_h100_does_not() {
    let (nvml, _) = common::shared(FILE, Some(T));
    let m = common::model(FILE, T);

    let a100 = nvml.device_by_index(0).unwrap();
    assert!(m.gpus[0].model.page_retirement());
    let r = m.gpu_reading(0, T);
    assert_eq!((r.retired_single_bit, r.retired_double_bit), (3, 1));
    let sbe = a100.retired_pages(CAUSES[0]).unwrap();
    let dbe = a100.retired_pages(CAUSES[1]).unwrap();
    assert_eq!(sbe.len() as u64, r.retired_single_bit);
    assert_eq!(dbe.len() as u64, r.retired_double_bit);
    assert!(a100.are_pages_pending_retired().unwrap());

    let h100 = nvml.device_by_index(1).unwrap();
    assert!(!m.gpus[1].model.page_retirement());
    assert_eq!(
        m.gpu_reading(1, T).retired_double_bit,
        2,
        "the model has them"
    );
    for cause in CAUSES {
        assert!(
            matches!(h100.retired_pages(cause), Err(NvmlError::NotSupported)),
            "{cause:?}"
        );
    }
    assert!(matches!(
        h100.are_pages_pending_retired(),
        Err(NvmlError::NotSupported)
    ));
    // Both remap rows.
    for d in [&a100, &h100] {
        let (mut cor, mut unc, mut pend, mut fail) = (0, 0, 0, 0);
        // SAFETY: a live handle and valid out-pointers.
        let rc = unsafe {
            nvml.lib().nvmlDeviceGetRemappedRows(
                d.handle(),
                &mut cor,
                &mut unc,
                &mut pend,
                &mut fail,
            )
        };
        assert_eq!(rc, 0);
    }
}
