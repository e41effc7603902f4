//! Built-in GPU model profiles: the static facts of a board (memory, power, clocks, MIG
//! profiles, GPM support) so that scenarios can name a model and override only what
//! they care about. Figures are the public datasheet values of each board.

/// A MIG GPU-instance profile offered by a model.
#[derive(Debug, Clone, PartialEq)]
pub struct MigProfile {
    /// Profile name as NVML and dcgm-exporter print it, e.g. `3g.40gb`.
    pub name: &'static str,
    /// NVML GPU-instance profile index (`NVML_GPU_INSTANCE_PROFILE_*`), what
    /// `nvmlDeviceGetGpuInstanceProfileInfo` takes.
    pub profile_id: u32,
    /// The profile's unique ID on the device (`nvmlGpuInstanceProfileInfo_t.id`,
    /// `nvmlGpuInstanceInfo_t.profileId`, the ID `nvidia-smi mig -lgip` shows: 19 for
    /// `1g.10gb` on an H100), which NVIDIA's DRA driver writes into MIG device names.
    pub id: u32,
    /// Compute slices (the `Ng` part).
    pub slices: u32,
    /// Memory of the instance in MiB.
    pub memory_mib: u64,
    /// Memory slices of the eight a GPU has: the size of the instance's placement
    /// (`nvmlGpuInstancePlacement_t.size`).
    pub memory_slices: u32,
}

/// Static properties of one GPU model.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelProfile {
    pub name: &'static str,
    /// NVML brand enum value (`NVML_BRAND_NVIDIA` = 14 on data-centre parts).
    pub brand: u32,
    /// NVML architecture enum value (7 = Ampere, 8 = Ada, 9 = Hopper, 10 = Blackwell).
    pub architecture: u32,
    pub memory_total_mib: u64,
    pub memory_reserved_mib: u64,
    pub power_limit_mw: u32,
    pub idle_power_mw: u32,
    pub max_sm_clock_mhz: u32,
    pub idle_sm_clock_mhz: u32,
    pub mem_clock_mhz: u32,
    pub pci_device_id: u32,
    /// NVML GPM (profiling ratios) is available (Hopper and newer).
    pub gpm: bool,
    pub nvlink_links: u32,
    /// Peak NVLink throughput per direction, all links, KiB/s.
    pub nvlink_peak_kib_s: u64,
    pub mig_profiles: &'static [MigProfile],
    /// Board facts that NVML reports as constants of the board.
    pub board: BoardFacts,
}

/// Constants of a board that NVML reports but the load does not change.
#[derive(Debug, Clone, PartialEq)]
pub struct BoardFacts {
    /// Board part number (`nvmlDeviceGetBoardPartNumber`).
    pub part_number: &'static str,
    /// Highest video clock, MHz; the current one scales with the SM clock.
    pub max_video_clock_mhz: u32,
    /// PCIe generation and lane count of the link (current equals maximum).
    pub pcie_generation: u32,
    pub pcie_width: u32,
    /// NVLink version as `nvmlNvlinkVersion_t` (6 = NVLink 4.0, 4 = 3.0).
    pub nvlink_version: u32,
    /// NVSwitches on the baseboard the links spread over (HGX H100: 4, HGX A100: 6).
    pub nvswitches: u32,
    /// Temperature thresholds, °C: shutdown, slowdown, GPU and memory max operating.
    pub shutdown_temp_c: u32,
    pub slowdown_temp_c: u32,
    pub gpu_max_operating_temp_c: u32,
    pub memory_max_operating_temp_c: u32,
    /// BAR1 aperture, MiB.
    pub bar1_mib: u64,
    /// CUDA compute capability (major, minor).
    pub cuda_capability: (i32, i32),
    pub cuda_cores: u32,
    pub memory_bus_width_bits: u32,
    /// Lowest settable power limit, mW (the highest is `power_limit_mw`).
    pub min_power_limit_mw: u32,
    /// Fans on the board (`nvmlDeviceGetNumFans`): 0 on passively cooled SXM and
    /// data-centre PCIe boards.
    pub fans: u32,
}

/// `nvmlDeviceArchitecture_t` values the facts below depend on.
pub const ARCH_AMPERE: u32 = 7;
pub const ARCH_HOPPER: u32 = 9;

/// Row-remapper banks of a board whose rows are all still remappable (the histogram's
/// `max` bin): 2560 on the H100 80GB HBM3 (real driver 580.159.04); other boards are
/// assumed to have the same count (not checked on real hardware).
pub const ROW_REMAPPER_BANKS: u32 = 2560;

impl ModelProfile {
    /// Dynamic page retirement (`nvmlDeviceGetRetiredPages*`): up to Ampere. Hopper and
    /// later only remap rows, and the real driver answers `NOT_SUPPORTED` (H100,
    /// 580.159.04); the A100 does both.
    pub fn page_retirement(&self) -> bool {
        self.architecture < ARCH_HOPPER
    }

    /// Whether `nvmlDeviceGetMemoryErrorCounter` answers for a location: from Ampere on,
    /// the driver counts ECC errors in DRAM and SRAM only, and answers `NOT_SUPPORTED`
    /// for L1, L2, register file, texture and CBU (H100, 580.159.04). Older boards
    /// counted per cache location.
    pub fn ecc_location_counted(&self, location: u32) -> bool {
        const DEVICE_MEMORY: u32 = 2;
        const SRAM: u32 = 7;
        self.architecture < ARCH_AMPERE || location == DEVICE_MEMORY || location == SRAM
    }

    /// An AV1 encoder (`NVML_ENCODER_QUERY_AV1`): Ada and Blackwell; the A100 and H100
    /// answer `NOT_SUPPORTED` (H100, 580.159.04).
    pub fn av1_encoder(&self) -> bool {
        self.architecture != ARCH_AMPERE && self.architecture != ARCH_HOPPER
    }
}

const H100_80GB_MIG: &[MigProfile] = &[
    MigProfile {
        name: "1g.10gb",
        profile_id: 0,
        id: 19,
        slices: 1,
        memory_mib: 9856,
        memory_slices: 1,
    },
    MigProfile {
        name: "1g.20gb",
        profile_id: 9,
        id: 15,
        slices: 1,
        memory_mib: 19968,
        memory_slices: 2,
    },
    MigProfile {
        name: "2g.20gb",
        profile_id: 1,
        id: 14,
        slices: 2,
        memory_mib: 19968,
        memory_slices: 2,
    },
    MigProfile {
        name: "3g.40gb",
        profile_id: 2,
        id: 9,
        slices: 3,
        memory_mib: 40192,
        memory_slices: 4,
    },
    MigProfile {
        name: "4g.40gb",
        profile_id: 3,
        id: 5,
        slices: 4,
        memory_mib: 40192,
        memory_slices: 4,
    },
    MigProfile {
        name: "7g.80gb",
        profile_id: 4,
        id: 0,
        slices: 7,
        memory_mib: 80896,
        memory_slices: 8,
    },
];

const A100_80GB_MIG: &[MigProfile] = &[
    MigProfile {
        name: "1g.10gb",
        profile_id: 0,
        id: 19,
        slices: 1,
        memory_mib: 9728,
        memory_slices: 1,
    },
    MigProfile {
        name: "2g.20gb",
        profile_id: 1,
        id: 14,
        slices: 2,
        memory_mib: 19968,
        memory_slices: 2,
    },
    MigProfile {
        name: "3g.40gb",
        profile_id: 2,
        id: 9,
        slices: 3,
        memory_mib: 40192,
        memory_slices: 4,
    },
    MigProfile {
        name: "4g.40gb",
        profile_id: 3,
        id: 5,
        slices: 4,
        memory_mib: 40192,
        memory_slices: 4,
    },
    MigProfile {
        name: "7g.80gb",
        profile_id: 4,
        id: 0,
        slices: 7,
        memory_mib: 80384,
        memory_slices: 8,
    },
];

const H200_MIG: &[MigProfile] = &[
    MigProfile {
        name: "1g.18gb",
        profile_id: 0,
        id: 19,
        slices: 1,
        memory_mib: 16384,
        memory_slices: 1,
    },
    MigProfile {
        name: "2g.35gb",
        profile_id: 1,
        id: 14,
        slices: 2,
        memory_mib: 32768,
        memory_slices: 2,
    },
    MigProfile {
        name: "3g.71gb",
        profile_id: 2,
        id: 9,
        slices: 3,
        memory_mib: 69632,
        memory_slices: 4,
    },
    MigProfile {
        name: "7g.141gb",
        profile_id: 4,
        id: 0,
        slices: 7,
        memory_mib: 143360,
        memory_slices: 8,
    },
];

/// The built-in profiles, looked up by exact NVML name.
pub const MODELS: &[ModelProfile] = &[
    ModelProfile {
        name: "NVIDIA H100 80GB HBM3",
        brand: 14,
        architecture: 9,
        memory_total_mib: 81559,
        memory_reserved_mib: 579,
        power_limit_mw: 700_000,
        idle_power_mw: 72_000,
        max_sm_clock_mhz: 1980,
        idle_sm_clock_mhz: 345,
        mem_clock_mhz: 2619,
        pci_device_id: 0x2330_10de,
        gpm: true,
        nvlink_links: 18,
        nvlink_peak_kib_s: 439_453_125,
        mig_profiles: H100_80GB_MIG,
        board: BoardFacts {
            part_number: "692-2G520-0200-000",
            max_video_clock_mhz: 1755,
            pcie_generation: 5,
            pcie_width: 16,
            nvlink_version: 6,
            nvswitches: 4,
            // As a real H100 80GB HBM3 answers (driver 580.159.04, see
            // tests/fixtures/real-gpu/).
            shutdown_temp_c: 95,
            slowdown_temp_c: 89,
            gpu_max_operating_temp_c: 87,
            memory_max_operating_temp_c: 95,
            bar1_mib: 131072,
            cuda_capability: (9, 0),
            cuda_cores: 16896,
            memory_bus_width_bits: 5120,
            min_power_limit_mw: 200000,
            fans: 0,
        },
    },
    ModelProfile {
        name: "NVIDIA H200",
        brand: 14,
        architecture: 9,
        memory_total_mib: 143771,
        memory_reserved_mib: 611,
        power_limit_mw: 700_000,
        idle_power_mw: 75_000,
        max_sm_clock_mhz: 1980,
        idle_sm_clock_mhz: 345,
        mem_clock_mhz: 3201,
        pci_device_id: 0x2335_10de,
        gpm: true,
        nvlink_links: 18,
        nvlink_peak_kib_s: 439_453_125,
        mig_profiles: H200_MIG,
        board: BoardFacts {
            part_number: "692-2G520-0280-000",
            max_video_clock_mhz: 1755,
            pcie_generation: 5,
            pcie_width: 16,
            nvlink_version: 6,
            nvswitches: 4,
            shutdown_temp_c: 92,
            slowdown_temp_c: 89,
            gpu_max_operating_temp_c: 87,
            memory_max_operating_temp_c: 95,
            bar1_mib: 262144,
            cuda_capability: (9, 0),
            cuda_cores: 16896,
            memory_bus_width_bits: 6144,
            min_power_limit_mw: 200000,
            fans: 0,
        },
    },
    ModelProfile {
        name: "NVIDIA A100-SXM4-80GB",
        brand: 14,
        architecture: 7,
        memory_total_mib: 81920,
        memory_reserved_mib: 523,
        power_limit_mw: 400_000,
        idle_power_mw: 60_000,
        max_sm_clock_mhz: 1410,
        idle_sm_clock_mhz: 210,
        mem_clock_mhz: 1593,
        pci_device_id: 0x20b2_10de,
        gpm: false,
        nvlink_links: 12,
        nvlink_peak_kib_s: 292_968_750,
        mig_profiles: A100_80GB_MIG,
        board: BoardFacts {
            part_number: "692-2G506-0210-002",
            max_video_clock_mhz: 1440,
            pcie_generation: 4,
            pcie_width: 16,
            nvlink_version: 4,
            nvswitches: 6,
            shutdown_temp_c: 92,
            slowdown_temp_c: 89,
            gpu_max_operating_temp_c: 85,
            memory_max_operating_temp_c: 95,
            bar1_mib: 131072,
            cuda_capability: (8, 0),
            cuda_cores: 6912,
            memory_bus_width_bits: 5120,
            min_power_limit_mw: 100000,
            fans: 0,
        },
    },
    ModelProfile {
        name: "NVIDIA L4",
        brand: 14,
        architecture: 8,
        memory_total_mib: 23034,
        memory_reserved_mib: 434,
        power_limit_mw: 72_000,
        idle_power_mw: 16_000,
        max_sm_clock_mhz: 2040,
        idle_sm_clock_mhz: 210,
        mem_clock_mhz: 6251,
        pci_device_id: 0x27b8_10de,
        gpm: false,
        nvlink_links: 0,
        nvlink_peak_kib_s: 0,
        mig_profiles: &[],
        board: BoardFacts {
            part_number: "900-2G193-0000-001",
            max_video_clock_mhz: 1545,
            pcie_generation: 4,
            pcie_width: 16,
            nvlink_version: 0,
            nvswitches: 0,
            shutdown_temp_c: 96,
            slowdown_temp_c: 93,
            gpu_max_operating_temp_c: 90,
            memory_max_operating_temp_c: 90,
            bar1_mib: 32768,
            cuda_capability: (8, 9),
            cuda_cores: 7424,
            memory_bus_width_bits: 192,
            min_power_limit_mw: 40000,
            fans: 0,
        },
    },
    // A Blackwell GPU of a GB200 NVL72 rack: 18 NVLink 5 links to the rack's NVSwitch
    // trays (not on this node's PCI bus), fabric registration by the fabric manager.
    ModelProfile {
        name: "NVIDIA GB200",
        brand: 14,
        architecture: 10,
        memory_total_mib: 189471,
        memory_reserved_mib: 1088,
        power_limit_mw: 1_200_000,
        idle_power_mw: 140_000,
        max_sm_clock_mhz: 2062,
        idle_sm_clock_mhz: 345,
        mem_clock_mhz: 3996,
        pci_device_id: 0x2941_10de,
        gpm: true,
        nvlink_links: 18,
        nvlink_peak_kib_s: 878_906_250,
        mig_profiles: &[],
        board: BoardFacts {
            part_number: "699-2G548-0202-000",
            max_video_clock_mhz: 1965,
            pcie_generation: 5,
            pcie_width: 16,
            nvlink_version: 7,
            nvswitches: 0,
            shutdown_temp_c: 95,
            slowdown_temp_c: 92,
            gpu_max_operating_temp_c: 87,
            memory_max_operating_temp_c: 95,
            bar1_mib: 262144,
            cuda_capability: (10, 0),
            cuda_cores: 18432,
            memory_bus_width_bits: 8192,
            min_power_limit_mw: 200000,
            fans: 0,
        },
    },
    // A workstation board in a rack server: actively cooled, one blower fan.
    ModelProfile {
        name: "NVIDIA RTX 6000 Ada Generation",
        brand: 13,
        architecture: 8,
        memory_total_mib: 49140,
        memory_reserved_mib: 467,
        power_limit_mw: 300_000,
        idle_power_mw: 24_000,
        max_sm_clock_mhz: 2505,
        idle_sm_clock_mhz: 210,
        mem_clock_mhz: 10001,
        pci_device_id: 0x26b1_10de,
        gpm: false,
        nvlink_links: 0,
        nvlink_peak_kib_s: 0,
        mig_profiles: &[],
        board: BoardFacts {
            part_number: "900-5G133-2250-000",
            max_video_clock_mhz: 1965,
            pcie_generation: 4,
            pcie_width: 16,
            nvlink_version: 0,
            nvswitches: 0,
            shutdown_temp_c: 98,
            slowdown_temp_c: 95,
            gpu_max_operating_temp_c: 93,
            memory_max_operating_temp_c: 95,
            bar1_mib: 65536,
            cuda_capability: (8, 9),
            cuda_cores: 18176,
            memory_bus_width_bits: 384,
            min_power_limit_mw: 100000,
            fans: 1,
        },
    },
];

/// The profile for an NVML model name, if built in.
pub fn lookup(name: &str) -> Option<&'static ModelProfile> {
    MODELS.iter().find(|m| m.name == name)
}
