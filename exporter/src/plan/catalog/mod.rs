//! The field catalog: every dcgm-exporter field this exporter can serve, where its value
//! comes from in NVML, how it is converted to dcgm's units, and which entities carry it.
//! Also the full list of DCGM field names, so a counters CSV can name a real DCGM field
//! we cannot serve (skipped with a warning) apart from a typo (an error).

use std::collections::HashMap;
use std::sync::OnceLock;

/// One NVML reading, in NVML's own units. The GPU sources answer in these.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Quantity {
    /// `nvmlDeviceGetUtilizationRates().gpu`, percent.
    GpuUtil,
    /// `nvmlDeviceGetUtilizationRates().memory`, percent.
    MemCopyUtil,
    EncoderUtil,
    DecoderUtil,
    /// `nvmlDeviceGetMemoryInfo_v2`, bytes.
    FbFree,
    FbUsed,
    FbReserved,
    FbTotal,
    /// mW.
    PowerUsage,
    /// mW.
    PowerLimit,
    /// mJ since driver load.
    TotalEnergy,
    /// °C.
    GpuTemp,
    /// °C, field value 82.
    MemoryTemp,
    /// MHz.
    SmClock,
    MemClock,
    PcieReplayCounter,
    /// KB/s (20 ms sample).
    PcieTxThroughput,
    PcieRxThroughput,
    /// Bitmask of `nvmlClocksEventReason*`.
    ClockEventReasons,
    /// Violation time, ns, per `nvmlPerfPolicyType_t`.
    PowerViolation,
    ThermalViolation,
    SyncBoostViolation,
    BoardLimitViolation,
    LowUtilViolation,
    ReliabilityViolation,
    EccSbeVolatile,
    EccDbeVolatile,
    EccSbeAggregate,
    EccDbeAggregate,
    /// Retired page counts.
    RetiredSbe,
    RetiredDbe,
    /// 0/1.
    RetiredPending,
    RemappedCorrectable,
    RemappedUncorrectable,
    /// 0/1.
    RemapFailure,
    NvlinkCrcFlitErrors,
    NvlinkCrcDataErrors,
    NvlinkReplayErrors,
    NvlinkRecoveryErrors,
    /// Cumulative NVLink data RX+TX over all links, KiB.
    NvlinkDataKib,
    /// 0/1.
    VgpuLicensed,
    // Health signals (issue 17 items 4 and 7).
    /// ECC mode now and after the next reboot, 0/1 (fields 1 and 2).
    EccModeCurrent,
    EccModePending,
    /// A row remapping waits for a GPU reset, 0/1 (field 144).
    RemapPending,
    /// `nvmlDeviceGpuRecoveryAction_t` (field 230): 0 none, 1 GPU reset, 2 node reboot,
    /// 3 drain P2P, 4 drain and reset...
    RecoveryAction,
    // Thermal limits, performance state, fans and the NVLink fabric (issue 17), kept
    // together so that other additions merge cleanly around them.
    /// °C, `nvmlDeviceGetTemperatureThreshold` (slowdown, shutdown, GPU and memory
    /// maximum operating temperature).
    SlowdownTemp,
    ShutdownTemp,
    GpuMaxOpTemp,
    MemMaxOpTemp,
    /// `nvmlPstates_t`: 0 (P0, fastest) to 15; 32 unknown.
    Pstate,
    /// Percent of the fan's maximum speed, `nvmlDeviceGetFanSpeed`.
    FanSpeed,
    /// `nvmlDeviceGetGpuFabricInfoV`: DCGM's `dcgmFabricManagerStatus_t` (0 not
    /// supported, 1 not started, 2 in progress, 3 success, 4 failure), clique ID,
    /// health mask bits and the v3 health summary (1 healthy, 2 unhealthy, 3 limited);
    /// the registration's error as a DCGM return code (0, or negative).
    FabricManagerStatus,
    FabricManagerError,
    FabricCliqueId,
    FabricHealthMask,
    FabricHealthSummary,
    /// Per NVLink ([`Scope::Link`]): state (`NVML_NVLINK_STATE_*`: 0 inactive,
    /// 1 active, 2 sleep), data-link error counters, cumulative data KiB.
    LinkState,
    LinkCrcFlitErrors,
    LinkCrcDataErrors,
    LinkReplayErrors,
    LinkRecoveryErrors,
    LinkTxKib,
    LinkRxKib,
    LinkDataKib,
    /// GPM metrics: utilisations in percent, PCIe in MiB/s.
    GpmGraphicsUtil,
    GpmSmUtil,
    GpmSmOccupancy,
    GpmTensorUtil,
    GpmDramUtil,
    GpmFp64Util,
    GpmFp32Util,
    GpmFp16Util,
    GpmPcieTx,
    GpmPcieRx,
}

impl Quantity {
    pub const COUNT: usize = Quantity::GpmPcieRx as usize + 1;

    /// Needs NVML GPM (Hopper and newer).
    pub fn is_gpm(self) -> bool {
        self as u8 >= Quantity::GpmGraphicsUtil as u8
    }
}

/// A string attribute read once per device, exported as a label by `label` rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LabelField {
    DriverVersion,
    NvmlVersion,
    Brand,
    Serial,
    VbiosVersion,
    OemInforom,
    EccInforom,
    PowerInforom,
    InforomImage,
}

/// How a raw NVML reading becomes the value dcgm-exporter prints.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Convert {
    /// Integer as is.
    Int,
    /// Divide by this and print as a float with 6 decimals (mW → W, percent → ratio).
    Float(f64),
    /// Divide by this and print as an integer, truncating (bytes → MiB).
    IntDiv(u64),
    /// Multiply by this and print as an integer (MiB/s → bytes/s).
    IntMul(f64),
    /// Rate of a cumulative counter per second, divided by this (KiB → ≈MB/s).
    RatePerSec(f64),
}

/// What an entity must be to carry a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// Physical GPUs only (power, temperature, clocks...); never copied onto MIG instances.
    Device,
    /// GPUs and MIG instances alike (memory, GPM ratios).
    Instance,
    /// Each NVLink of a physical GPU: series carry dcgm-exporter's NVLink-entity labels.
    Link,
}

/// What a value means over time, whatever a CSV row declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Nature {
    Gauge,
    Counter,
}

/// Where a field's value comes from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum FieldSource {
    Value {
        quantity: Quantity,
        convert: Convert,
        scope: Scope,
        nature: Nature,
    },
    /// A string attribute, exported as a label.
    Label(LabelField),
    /// Last XID seen, from the event stream.
    LastXid,
    /// One of dcgm-exporter's own collectors (`DCGM_EXP_*`).
    Exporter(ExporterField),
}

/// dcgm-exporter's exporter-side collectors this exporter serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExporterField {
    /// `DCGM_EXP_XID_ERRORS_COUNT`: XIDs per code in the trailing `-x` window.
    XidWindowCount,
    /// `DCGM_EXP_CLOCK_EVENTS_COUNT`: cycles with each clock-event reason set in the
    /// trailing `--clock-events-count-window-size` window.
    ClockEventWindowCount,
    /// `DCGM_EXP_GPU_HEALTH_STATUS`: per health watch, derived from NVML signals.
    HealthStatus,
}

/// One servable field.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FieldDef {
    pub name: &'static str,
    pub source: FieldSource,
}

const fn v(
    name: &'static str,
    quantity: Quantity,
    convert: Convert,
    scope: Scope,
    nature: Nature,
) -> FieldDef {
    FieldDef {
        name,
        source: FieldSource::Value {
            quantity,
            convert,
            scope,
            nature,
        },
    }
}

const fn label(name: &'static str, field: LabelField) -> FieldDef {
    FieldDef {
        name,
        source: FieldSource::Label(field),
    }
}

use Convert::*;
use Nature::*;
use Quantity as Q;
use Scope::*;

const MIB: u64 = 1 << 20;

/// Every field this exporter serves, with its NVML source (see the dcgm-compat reference,
/// section 3, for each mapping).
pub const FIELDS: &[FieldDef] = &[
    v("DCGM_FI_DEV_SM_CLOCK", Q::SmClock, Int, Device, Gauge),
    v("DCGM_FI_DEV_MEM_CLOCK", Q::MemClock, Int, Device, Gauge),
    v("DCGM_FI_DEV_MEMORY_TEMP", Q::MemoryTemp, Int, Device, Gauge),
    v("DCGM_FI_DEV_GPU_TEMP", Q::GpuTemp, Int, Device, Gauge),
    v(
        "DCGM_FI_DEV_POWER_USAGE",
        Q::PowerUsage,
        Float(1000.0),
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_POWER_MGMT_LIMIT",
        Q::PowerLimit,
        Float(1000.0),
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        Q::TotalEnergy,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
        Q::PcieReplayCounter,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
        Q::PcieTxThroughput,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
        Q::PcieRxThroughput,
        Int,
        Device,
        Gauge,
    ),
    v("DCGM_FI_DEV_GPU_UTIL", Q::GpuUtil, Int, Device, Gauge),
    v(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        Q::MemCopyUtil,
        Int,
        Device,
        Gauge,
    ),
    v("DCGM_FI_DEV_ENC_UTIL", Q::EncoderUtil, Int, Device, Gauge),
    v("DCGM_FI_DEV_DEC_UTIL", Q::DecoderUtil, Int, Device, Gauge),
    FieldDef {
        name: "DCGM_FI_DEV_XID_ERRORS",
        source: FieldSource::LastXid,
    },
    v(
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
        Q::ClockEventReasons,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        Q::ClockEventReasons,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_POWER_VIOLATION",
        Q::PowerViolation,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_THERMAL_VIOLATION",
        Q::ThermalViolation,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_SYNC_BOOST_VIOLATION",
        Q::SyncBoostViolation,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_BOARD_LIMIT_VIOLATION",
        Q::BoardLimitViolation,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_LOW_UTIL_VIOLATION",
        Q::LowUtilViolation,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_RELIABILITY_VIOLATION",
        Q::ReliabilityViolation,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_FB_TOTAL",
        Q::FbTotal,
        IntDiv(MIB),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_FB_FREE",
        Q::FbFree,
        IntDiv(MIB),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_FB_USED",
        Q::FbUsed,
        IntDiv(MIB),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_FB_RESERVED",
        Q::FbReserved,
        IntDiv(MIB),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
        Q::EccSbeVolatile,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
        Q::EccDbeVolatile,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        Q::EccSbeAggregate,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        Q::EccDbeAggregate,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_RETIRED_SBE",
        Q::RetiredSbe,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_RETIRED_DBE",
        Q::RetiredDbe,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_RETIRED_PENDING",
        Q::RetiredPending,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
        Q::NvlinkCrcFlitErrors,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
        Q::NvlinkCrcDataErrors,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        Q::NvlinkReplayErrors,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        Q::NvlinkRecoveryErrors,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        Q::NvlinkDataKib,
        RatePerSec(1000.0),
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
        Q::VgpuLicensed,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        Q::RemappedUncorrectable,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        Q::RemappedCorrectable,
        Int,
        Device,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_ROW_REMAP_FAILURE",
        Q::RemapFailure,
        Int,
        Device,
        Gauge,
    ),
    // Thermal limits, performance state, fans, fabric and per-link NVLink (issue 17).
    v(
        "DCGM_FI_DEV_SLOWDOWN_TEMP",
        Q::SlowdownTemp,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_SHUTDOWN_TEMP",
        Q::ShutdownTemp,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_GPU_MAX_OP_TEMP",
        Q::GpuMaxOpTemp,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_MEM_MAX_OP_TEMP",
        Q::MemMaxOpTemp,
        Int,
        Device,
        Gauge,
    ),
    // Health signals (issue 17 items 4 and 7).
    v(
        "DCGM_FI_DEV_ECC_CURRENT",
        Q::EccModeCurrent,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_ECC_PENDING",
        Q::EccModePending,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_ROW_REMAP_PENDING",
        Q::RemapPending,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
        Q::RecoveryAction,
        Int,
        Device,
        Gauge,
    ),
    FieldDef {
        name: "DCGM_EXP_XID_ERRORS_COUNT",
        source: FieldSource::Exporter(ExporterField::XidWindowCount),
    },
    FieldDef {
        name: "DCGM_EXP_CLOCK_EVENTS_COUNT",
        source: FieldSource::Exporter(ExporterField::ClockEventWindowCount),
    },
    FieldDef {
        name: "DCGM_EXP_GPU_HEALTH_STATUS",
        source: FieldSource::Exporter(ExporterField::HealthStatus),
    },
    v("DCGM_FI_DEV_PSTATE", Q::Pstate, Int, Device, Gauge),
    v("DCGM_FI_DEV_FAN_SPEED", Q::FanSpeed, Int, Device, Gauge),
    v(
        "DCGM_FI_DEV_FABRIC_MANAGER_STATUS",
        Q::FabricManagerStatus,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_FABRIC_MANAGER_ERROR_CODE",
        Q::FabricManagerError,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_FABRIC_CLIQUE_ID",
        Q::FabricCliqueId,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_FABRIC_HEALTH_MASK",
        Q::FabricHealthMask,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY",
        Q::FabricHealthSummary,
        Int,
        Device,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_GET_STATE",
        Q::LinkState,
        Int,
        Link,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_PER_LINK_TOTAL",
        Q::LinkCrcFlitErrors,
        Int,
        Link,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_PER_LINK_TOTAL",
        Q::LinkCrcDataErrors,
        Int,
        Link,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_PER_LINK_TOTAL",
        Q::LinkReplayErrors,
        Int,
        Link,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_PER_LINK_TOTAL",
        Q::LinkRecoveryErrors,
        Int,
        Link,
        Counter,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_THROUGHPUT_PER_LINK",
        Q::LinkDataKib,
        RatePerSec(1000.0),
        Link,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_TX_THROUGHPUT_PER_LINK",
        Q::LinkTxKib,
        RatePerSec(1000.0),
        Link,
        Gauge,
    ),
    v(
        "DCGM_FI_DEV_NVLINK_RX_THROUGHPUT_PER_LINK",
        Q::LinkRxKib,
        RatePerSec(1000.0),
        Link,
        Gauge,
    ),
    label("DCGM_FI_DRIVER_VERSION", LabelField::DriverVersion),
    label("DCGM_FI_NVML_VERSION", LabelField::NvmlVersion),
    label("DCGM_FI_DEV_BRAND", LabelField::Brand),
    label("DCGM_FI_DEV_SERIAL", LabelField::Serial),
    label("DCGM_FI_DEV_VBIOS_VERSION", LabelField::VbiosVersion),
    label("DCGM_FI_DEV_OEM_INFOROM_VER", LabelField::OemInforom),
    label("DCGM_FI_DEV_ECC_INFOROM_VER", LabelField::EccInforom),
    label("DCGM_FI_DEV_POWER_INFOROM_VER", LabelField::PowerInforom),
    label("DCGM_FI_DEV_INFOROM_IMAGE_VER", LabelField::InforomImage),
    v(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        Q::GpmGraphicsUtil,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_SM_ACTIVE",
        Q::GpmSmUtil,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        Q::GpmSmOccupancy,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        Q::GpmTensorUtil,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        Q::GpmDramUtil,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
        Q::GpmFp64Util,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
        Q::GpmFp32Util,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
        Q::GpmFp16Util,
        Float(100.0),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        Q::GpmPcieTx,
        IntMul(MIB as f64),
        Instance,
        Gauge,
    ),
    v(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        Q::GpmPcieRx,
        IntMul(MIB as f64),
        Instance,
        Gauge,
    ),
];

/// The servable field of this name.
pub fn field(name: &str) -> Option<&'static FieldDef> {
    FIELDS.iter().find(|f| f.name == name)
}

/// dcgm-exporter's exporter-side pseudo-fields (`DCGM_EXP_*`); accepted in a CSV.
pub const EXPORTER_FIELDS: &[&str] = &[
    "DCGM_EXP_XID_ERRORS_COUNT",
    "DCGM_EXP_CLOCK_EVENTS_COUNT",
    "DCGM_EXP_GPU_HEALTH_STATUS",
    "DCGM_EXP_P2P_STATUS",
];

const DCGM_FIELD_NAMES: &str = include_str!("dcgm_field_names.txt");
const DCGM_LEGACY_FIELD_NAMES: &str = include_str!("dcgm_legacy_field_names.txt");

/// The `NAME ID` lines of a field-name list.
fn name_ids(text: &'static str) -> impl Iterator<Item = (&'static str, u32)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (name, id) = l.split_once(' ')?;
            Some((name, id.trim().parse().ok()?))
        })
}

/// Every DCGM field name (current and legacy) with its numeric ID.
pub fn dcgm_field_ids() -> &'static HashMap<&'static str, u32> {
    static IDS: OnceLock<HashMap<&'static str, u32>> = OnceLock::new();
    IDS.get_or_init(|| {
        name_ids(DCGM_FIELD_NAMES)
            .chain(name_ids(DCGM_LEGACY_FIELD_NAMES))
            .collect()
    })
}

/// The legacy names dcgm-exporter accepts in a counters CSV as aliases of a field
/// (go-dcgm's `legacyDCGMFields`): the DCGM 1.x names of its
/// `1.x-compatibility-metrics.csv` (`dcgm_sm_clock`, …) and renamed fields
/// (`DCGM_FI_DEV_CLOCK_THROTTLE_REASONS`), with their field IDs.
pub fn legacy_field_ids() -> &'static HashMap<&'static str, u32> {
    static IDS: OnceLock<HashMap<&'static str, u32>> = OnceLock::new();
    IDS.get_or_init(|| name_ids(DCGM_LEGACY_FIELD_NAMES).collect())
}

/// The servable field a counters-CSV name selects, and the name its family is served
/// under: a field by its own name, or a legacy alias of one (the servable field of the
/// alias's DCGM field ID), served under the alias, since dcgm-exporter names every
/// family after its CSV row.
pub fn resolve(name: &str) -> Option<(&'static str, &'static FieldDef)> {
    if let Some(def) = field(name) {
        return Some((def.name, def));
    }
    let (alias, id) = legacy_field_ids().get_key_value(name)?;
    let ids = dcgm_field_ids();
    let def = FIELDS.iter().find(|f| ids.get(f.name) == Some(id))?;
    Some((alias, def))
}

/// A DCGM field name known to DCGM, or one of the `DCGM_EXP_*` names.
pub fn is_known_dcgm_name(name: &str) -> bool {
    dcgm_field_ids().contains_key(name) || EXPORTER_FIELDS.contains(&name)
}

/// Longest prefix of an unknown name that [`closest_names`] compares: longer than any
/// DCGM field name. Scoring costs the name's length times every known name, and a
/// 64 KiB first field took minutes before the error (found by fuzzing, issue 20).
const COMPARED_NAME_CHARS: usize = 128;

/// Up to three known names closest to `name`, for error messages.
pub fn closest_names(name: &str) -> Vec<&'static str> {
    let name = match name.char_indices().nth(COMPARED_NAME_CHARS) {
        Some((end, _)) => &name[..end],
        None => name,
    };
    let mut scored: Vec<(f64, &'static str)> = dcgm_field_ids()
        .keys()
        .copied()
        .chain(EXPORTER_FIELDS.iter().copied())
        .map(|k| (strsim::jaro_winkler(name, k), k))
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored.into_iter().take(3).map(|(_, k)| k).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_servable_field_is_a_known_dcgm_name_and_unique() {
        let mut seen = std::collections::HashSet::new();
        for f in FIELDS {
            assert!(is_known_dcgm_name(f.name), "{} is not a DCGM field", f.name);
            assert!(seen.insert(f.name), "{} listed twice", f.name);
        }
    }

    /// The DCGM 1.x names of dcgm-exporter's `1.x-compatibility-metrics.csv` select
    /// the fields dcgm-exporter reads for them (go-dcgm's IDs, read against the field
    /// list's names), and an alias of a field served under another ID is none.
    #[test]
    fn legacy_aliases_resolve_to_the_field_of_their_id() {
        for (alias, current) in [
            ("dcgm_sm_clock", "DCGM_FI_DEV_SM_CLOCK"),
            ("dcgm_memory_clock", "DCGM_FI_DEV_MEM_CLOCK"),
            ("dcgm_gpu_utilization", "DCGM_FI_DEV_GPU_UTIL"),
            ("dcgm_xid_errors", "DCGM_FI_DEV_XID_ERRORS"),
            ("dcgm_fi_prof_pcie_tx_bytes", "DCGM_FI_PROF_PCIE_TX_BYTES"),
            (
                "dcgm_nvlink_bandwidth_total",
                "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            ),
        ] {
            let (served, def) = resolve(alias).unwrap_or_else(|| panic!("{alias}"));
            assert_eq!((served, def.name), (alias, current));
            assert!(is_known_dcgm_name(alias), "{alias}");
        }
        assert_eq!(
            resolve("DCGM_FI_DEV_GPU_TEMP").map(|r| r.0),
            Some("DCGM_FI_DEV_GPU_TEMP")
        );
        assert!(resolve("dcgm_sm_clocks").is_none() && !is_known_dcgm_name("dcgm_sm_clocks"));
        assert_eq!(legacy_field_ids().len(), 99);
        // An alias cannot be ambiguous: the servable fields of its ID read the same.
        for (alias, id) in legacy_field_ids() {
            let sources: Vec<FieldSource> = FIELDS
                .iter()
                .filter(|f| dcgm_field_ids().get(f.name) == Some(id))
                .map(|f| f.source)
                .collect();
            assert!(
                sources.windows(2).all(|w| w[0] == w[1]),
                "{alias}: {sources:?}"
            );
        }
    }

    #[test]
    fn the_name_list_holds_hundreds_of_fields_with_their_ids() {
        let ids = dcgm_field_ids();
        assert!(ids.len() > 500, "{}", ids.len());
        assert_eq!(ids["DCGM_FI_DEV_GPU_UTIL"], 203);
        assert_eq!(ids["DCGM_FI_PROF_GR_ENGINE_ACTIVE"], 1001);
    }

    #[test]
    fn closest_names_compare_a_bounded_prefix_of_a_long_name() {
        let long = format!("DCGM_FI_DEV_GPU_UTL{}", "X".repeat(1 << 20));
        let prefix: String = long.chars().take(COMPARED_NAME_CHARS).collect();
        assert_eq!(closest_names(&long), closest_names(&prefix));
        assert!(
            dcgm_field_ids()
                .keys()
                .all(|k| k.chars().count() < COMPARED_NAME_CHARS)
        );
    }

    #[test]
    fn closest_names_suggest_the_intended_field() {
        assert_eq!(
            closest_names("DCGM_FI_DEV_GPU_UTL")[0],
            "DCGM_FI_DEV_GPU_UTIL"
        );
        assert!(closest_names("DCGM_FI_DEV_POWR_USAGE").contains(&"DCGM_FI_DEV_POWER_USAGE"));
    }

    #[test]
    fn link_fields_are_exactly_the_link_quantities() {
        let link_quantities = [
            Quantity::LinkState,
            Quantity::LinkCrcFlitErrors,
            Quantity::LinkCrcDataErrors,
            Quantity::LinkReplayErrors,
            Quantity::LinkRecoveryErrors,
            Quantity::LinkTxKib,
            Quantity::LinkRxKib,
            Quantity::LinkDataKib,
        ];
        for f in FIELDS {
            if let FieldSource::Value {
                quantity, scope, ..
            } = f.source
            {
                assert_eq!(
                    scope == Scope::Link,
                    link_quantities.contains(&quantity),
                    "{}",
                    f.name
                );
                assert!(!quantity.is_gpm() || scope == Scope::Instance, "{}", f.name);
            }
        }
        assert_eq!(dcgm_field_ids()["DCGM_FI_DEV_NVLINK_GET_STATE"], 1508);
        assert_eq!(dcgm_field_ids()["DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY"], 175);
    }

    #[test]
    fn gpm_quantities_are_recognised() {
        assert!(Quantity::GpmPcieRx.is_gpm() && Quantity::GpmGraphicsUtil.is_gpm());
        assert!(!Quantity::VgpuLicensed.is_gpm());
    }
}
