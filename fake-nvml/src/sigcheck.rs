//! Compile-time proof that every export has exactly the signature nvml-wrapper-sys
//! (generated from the NVML 13 header) gives the symbol: [`same`] only type-checks
//! when both arguments have one function-pointer type, so a mismatch fails the build.
//!
//! This list is also the export list the symbol guard test checks against `nm -D`,
//! and that test fails if an exported function is missing here.

use crate::device::*;
use crate::events::*;
use crate::fields::*;
use crate::gpm::*;
use crate::mig::*;
use crate::processes::*;
use crate::system::*;
use nvml_wrapper_sys::bindings::NvmlLib;

fn same<T>(_: T, _: T) {}

macro_rules! check_signatures {
    ($lib:ident: $($name:ident),* $(,)?) => {
        $( if let Ok(f) = &$lib.$name { same(*f, $name) } )*
    };
}

#[allow(dead_code)]
fn signatures(lib: &NvmlLib) {
    check_signatures!(lib:
        nvmlInit,
        nvmlInit_v2,
        nvmlInitWithFlags,
        nvmlShutdown,
        nvmlErrorString,
        nvmlSystemGetDriverVersion,
        nvmlSystemGetNVMLVersion,
        nvmlSystemGetCudaDriverVersion,
        nvmlSystemGetCudaDriverVersion_v2,
        nvmlSystemGetProcessName,
        nvmlDeviceGetCount,
        nvmlDeviceGetCount_v2,
        nvmlDeviceGetHandleByIndex,
        nvmlDeviceGetHandleByIndex_v2,
        nvmlDeviceGetHandleByUUID,
        nvmlDeviceGetHandleByPciBusId,
        nvmlDeviceGetHandleByPciBusId_v2,
        nvmlDeviceGetName,
        nvmlDeviceGetUUID,
        nvmlDeviceGetIndex,
        nvmlDeviceGetMinorNumber,
        nvmlDeviceGetSerial,
        nvmlDeviceGetBrand,
        nvmlDeviceGetArchitecture,
        nvmlDeviceGetVbiosVersion,
        nvmlDeviceGetInforomVersion,
        nvmlDeviceGetInforomImageVersion,
        nvmlDeviceGetPciInfo,
        nvmlDeviceGetPciInfo_v2,
        nvmlDeviceGetPciInfo_v3,
        nvmlDeviceGetMemoryInfo,
        nvmlDeviceGetMemoryInfo_v2,
        nvmlDeviceGetUtilizationRates,
        nvmlDeviceGetEncoderUtilization,
        nvmlDeviceGetDecoderUtilization,
        nvmlDeviceGetPowerUsage,
        nvmlDeviceGetTotalEnergyConsumption,
        nvmlDeviceGetEnforcedPowerLimit,
        nvmlDeviceGetPowerManagementLimit,
        nvmlDeviceGetTemperature,
        nvmlDeviceGetClockInfo,
        nvmlDeviceGetMaxClockInfo,
        nvmlDeviceGetCurrentClocksThrottleReasons,
        nvmlDeviceGetCurrentClocksEventReasons,
        nvmlDeviceGetSupportedClocksThrottleReasons,
        nvmlDeviceGetSupportedClocksEventReasons,
        nvmlDeviceGetViolationStatus,
        nvmlDeviceGetPcieReplayCounter,
        nvmlDeviceGetPcieThroughput,
        nvmlDeviceGetTotalEccErrors,
        nvmlDeviceGetRetiredPages,
        nvmlDeviceGetRetiredPages_v2,
        nvmlDeviceGetRetiredPagesPendingStatus,
        nvmlDeviceGetRemappedRows,
        nvmlDeviceGetFieldValues,
        nvmlDeviceGetMigMode,
        nvmlDeviceGetMaxMigDeviceCount,
        nvmlDeviceGetMigDeviceHandleByIndex,
        nvmlDeviceGetDeviceHandleFromMigDeviceHandle,
        nvmlDeviceIsMigDeviceHandle,
        nvmlDeviceGetGpuInstanceId,
        nvmlDeviceGetComputeInstanceId,
        nvmlDeviceGetGpuInstanceProfileInfo,
        nvmlDeviceGetGpuInstanceProfileInfoV,
        nvmlDeviceGetAttributes_v2,
        nvmlDeviceGetComputeRunningProcesses,
        nvmlDeviceGetComputeRunningProcesses_v2,
        nvmlDeviceGetComputeRunningProcesses_v3,
        nvmlDeviceGetProcessUtilization,
        nvmlEventSetCreate,
        nvmlDeviceRegisterEvents,
        nvmlDeviceGetSupportedEventTypes,
        nvmlEventSetWait,
        nvmlEventSetWait_v2,
        nvmlEventSetFree,
        nvmlGpmQueryDeviceSupport,
        nvmlGpmSampleAlloc,
        nvmlGpmSampleFree,
        nvmlGpmSampleGet,
        nvmlGpmMigSampleGet,
        nvmlGpmMetricsGet,
    );
}
