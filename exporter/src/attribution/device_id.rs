//! Kubelet device IDs and GPU resource names, parsed into typed values.
//!
//! The kubelet's PodResources API reports, per container, a resource name (e.g.
//! `nvidia.com/gpu`) and the device IDs the device plugin advertised for it. Those IDs
//! come in many shapes depending on the plugin, its `deviceIDStrategy`, MIG and sharing
//! (time-slicing, MPS); dcgm-exporter handles only some of them and silently drops the
//! others (its users' most common complaint: no pod labels). This module turns every
//! known shape into one [`DeviceId`] so that the code resolving it against NVML matches
//! on a type, never on ad-hoc string checks.
//!
//! Forms accepted (dcgm-compat reference §7); `<uuid>` is 32 hex digits grouped
//! 8-4-4-4-12, either case (stored as bytes, displayed in lower case as NVML does),
//! numbers are ASCII decimal digits fitting in `u32` (leading zeros allowed):
//!
//! | form | value |
//! |---|---|
//! | `GPU-<uuid>` | [`DeviceRef::GpuUuid`] |
//! | `MIG-<uuid>` | [`DeviceRef::MigUuid`] (R470+ MIG UUID) |
//! | `MIG-GPU-<uuid>/<gi>/<ci>` | [`DeviceRef::LegacyMig`] (drivers before R470) |
//! | `<idx>` | [`DeviceRef::Index`] (`deviceIDStrategy: index`) |
//! | `<idx>:<j>` | [`DeviceRef::MigIndex`] (index strategy, MIG device slot `j`) |
//! | any of the above + `::<N>` | same, `replica: Some(N)` (time-slicing / MPS replica) |
//! | `nvidia<idx>` | [`DeviceRef::GkeGpu`] |
//! | `nvidia<idx>/vgpu<K>` | [`DeviceRef::GkeGpu`], `replica: Some(K)` (GKE time-sharing) |
//! | `nvidia<idx>/gi<M>` | [`DeviceRef::GkeMig`] |
//! | `nvidia<idx>/gi<M>/vgpu<K>` | [`DeviceRef::GkeMig`], `replica: Some(K)` |
//!
//! GKE names mark sharing only with `/vgpu<K>`; `nvidia0::1` is rejected. Nothing is
//! trimmed: surrounding whitespace is an error. [`DeviceId`]'s `Display` writes the
//! canonical form, and parsing it gives back the same value.

use std::fmt;
use std::str::FromStr;

/// A physical GPU's UUID, as NVML reports it: `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
///
/// Stored as its 16 bytes, so comparisons ignore the hex digits' case.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid([u8; 16]);

/// A MIG device's UUID in the R470+ form NVML reports: `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MigUuid([u8; 16]);

impl GpuUuid {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

impl MigUuid {
    pub const fn from_bytes(bytes: [u8; 16]) -> Self {
        Self(bytes)
    }
    pub const fn as_bytes(&self) -> &[u8; 16] {
        &self.0
    }
}

/// The device a kubelet device ID names, without its sharing replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceRef {
    /// `GPU-<uuid>`: a whole GPU by UUID (NVIDIA plugin, `deviceIDStrategy: uuid`).
    GpuUuid(GpuUuid),
    /// `MIG-<uuid>`: a MIG device by its own UUID; resolving it to the parent GPU and GPU
    /// instance needs NVML.
    MigUuid(MigUuid),
    /// `MIG-GPU-<uuid>/<gi>/<ci>`: a MIG device named by parent UUID, GPU instance ID and
    /// compute instance ID (drivers before R470).
    LegacyMig {
        parent: GpuUuid,
        gpu_instance: u32,
        compute_instance: u32,
    },
    /// `<idx>`: a whole GPU by NVML index (NVIDIA plugin, `deviceIDStrategy: index`).
    Index(u32),
    /// `<parent>:<slot>`: a MIG device by parent NVML index and MIG device slot (the
    /// `nvmlDeviceGetMigDeviceHandleByIndex` index, not the GPU instance ID).
    MigIndex { parent: u32, slot: u32 },
    /// `nvidia<index>`: a whole GPU by NVML index (GKE device plugin).
    GkeGpu { index: u32 },
    /// `nvidia<index>/gi<gpu_instance>`: a MIG GPU instance (GKE device plugin).
    GkeMig { index: u32, gpu_instance: u32 },
}

impl DeviceRef {
    /// Whether this names a MIG device rather than a whole GPU.
    pub const fn is_mig(&self) -> bool {
        matches!(
            self,
            Self::MigUuid(_) | Self::LegacyMig { .. } | Self::MigIndex { .. } | Self::GkeMig { .. }
        )
    }

    /// Whether this is a GKE device name (`nvidia<idx>…`), whose sharing replica is
    /// written `/vgpu<K>` instead of `::<N>`.
    pub const fn is_gke(&self) -> bool {
        matches!(self, Self::GkeGpu { .. } | Self::GkeMig { .. })
    }
}

/// A parsed kubelet device ID: the device, and the sharing replica when the plugin
/// advertises one device several times (time-slicing, MPS: `::<N>`; GKE: `/vgpu<K>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceId {
    pub device: DeviceRef,
    pub replica: Option<u32>,
}

/// A device ID that matches none of the known forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid device ID {input:?}: {problem}")]
pub struct DeviceIdError {
    /// The device ID as the kubelet reported it.
    pub input: String,
    pub problem: DeviceIdProblem,
}

/// What is wrong with a device ID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DeviceIdProblem {
    #[error("empty")]
    Empty,
    #[error(
        "not a known form (expected GPU-<uuid>, MIG-<uuid>, MIG-GPU-<uuid>/<gi>/<ci>, <index> \
         or <index>:<mig slot>, each optionally followed by ::<replica>, or \
         nvidia<index>[/gi<gi>][/vgpu<replica>])"
    )]
    UnknownForm,
    #[error("UUID is not 32 hexadecimal digits grouped 8-4-4-4-12")]
    BadUuid,
    #[error("missing {0}")]
    MissingNumber(NumberField),
    #[error("{0} does not fit in 32 bits")]
    NumberTooLarge(NumberField),
    #[error("unexpected text after a complete part")]
    UnexpectedText,
    #[error("GKE device names mark sharing with /vgpu<replica>, not ::<replica>")]
    GkeColonReplica,
}

/// Which number of a device ID a [`DeviceIdProblem`] is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NumberField {
    GpuIndex,
    MigSlot,
    GpuInstance,
    ComputeInstance,
    Replica,
}

impl fmt::Display for NumberField {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::GpuIndex => "GPU index",
            Self::MigSlot => "MIG device slot",
            Self::GpuInstance => "GPU instance ID",
            Self::ComputeInstance => "compute instance ID",
            Self::Replica => "sharing replica number",
        })
    }
}

/// What kind of GPU resource a kubelet resource name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind<'a> {
    /// `nvidia.com/gpu`, or `nvidia.com/gpu.shared` (`shared`: time-slicing or MPS with
    /// `renameByDefault`).
    Gpu { shared: bool },
    /// `nvidia.com/mig-<profile>` (e.g. `1g.10gb`), or `nvidia.com/mig-<profile>.shared`
    /// (`shared`, profile without the suffix).
    Mig { profile: &'a str, shared: bool },
    /// A name the operator listed as a GPU resource (`--nvidia-resource-names`).
    Listed,
}

/// Whether the kubelet resource `name` is a GPU resource, and which kind: the NVIDIA
/// device plugin's names, else a name in `extra`. Everything else (CPU, memory, other
/// vendors' devices) is `None`.
pub fn is_gpu_resource<'a>(name: &'a str, extra: &[String]) -> Option<ResourceKind<'a>> {
    match name {
        "nvidia.com/gpu" => return Some(ResourceKind::Gpu { shared: false }),
        "nvidia.com/gpu.shared" => return Some(ResourceKind::Gpu { shared: true }),
        _ => {}
    }
    if let Some(profile) = name.strip_prefix("nvidia.com/mig-") {
        let (profile, shared) = match profile.strip_suffix(".shared") {
            Some(base) => (base, true),
            None => (profile, false),
        };
        if !profile.is_empty() {
            return Some(ResourceKind::Mig { profile, shared });
        }
    }
    extra
        .iter()
        .any(|listed| listed == name)
        .then_some(ResourceKind::Listed)
}

impl FromStr for DeviceId {
    type Err = DeviceIdError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        parse_device_id(input).map_err(|problem| DeviceIdError {
            input: input.to_owned(),
            problem,
        })
    }
}

impl FromStr for GpuUuid {
    type Err = DeviceIdError;

    /// Parses `GPU-<uuid>`, e.g. a UUID string from NVML.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let parsed = match input.strip_prefix("GPU-") {
            Some(body) => whole_uuid(body).map(GpuUuid),
            None => Err(DeviceIdProblem::UnknownForm),
        };
        parsed.map_err(|problem| DeviceIdError {
            input: input.to_owned(),
            problem,
        })
    }
}

impl FromStr for MigUuid {
    type Err = DeviceIdError;

    /// Parses `MIG-<uuid>`, e.g. a MIG UUID string from NVML.
    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let parsed = match input.strip_prefix("MIG-") {
            Some(body) => whole_uuid(body).map(MigUuid),
            None => Err(DeviceIdProblem::UnknownForm),
        };
        parsed.map_err(|problem| DeviceIdError {
            input: input.to_owned(),
            problem,
        })
    }
}

fn parse_device_id(input: &str) -> Result<DeviceId, DeviceIdProblem> {
    use DeviceIdProblem as P;
    if input.is_empty() {
        return Err(P::Empty);
    }
    let (device_part, replica_part) = match input.split_once("::") {
        Some((device, replica)) => (device, Some(replica)),
        None => (input, None),
    };
    if let Some(rest) = device_part.strip_prefix("nvidia") {
        if replica_part.is_some() {
            return Err(P::GkeColonReplica);
        }
        return parse_gke(rest);
    }
    let device = if let Some(body) = device_part.strip_prefix("GPU-") {
        DeviceRef::GpuUuid(GpuUuid(whole_uuid(body)?))
    } else if let Some(body) = device_part.strip_prefix("MIG-GPU-") {
        let (parent, rest) = uuid_prefix(body)?;
        let rest = match rest.strip_prefix('/') {
            Some(rest) => rest,
            None if rest.is_empty() => return Err(P::MissingNumber(NumberField::GpuInstance)),
            None => return Err(P::UnexpectedText),
        };
        let (gpu_instance, rest) = number_prefix(rest, NumberField::GpuInstance)?;
        let rest = match rest.strip_prefix('/') {
            Some(rest) => rest,
            None if rest.is_empty() => {
                return Err(P::MissingNumber(NumberField::ComputeInstance));
            }
            None => return Err(P::UnexpectedText),
        };
        DeviceRef::LegacyMig {
            parent: GpuUuid(parent),
            gpu_instance,
            compute_instance: whole_number(rest, NumberField::ComputeInstance)?,
        }
    } else if let Some(body) = device_part.strip_prefix("MIG-") {
        DeviceRef::MigUuid(MigUuid(whole_uuid(body)?))
    } else if device_part.starts_with(|c: char| c.is_ascii_digit()) {
        let (index, rest) = number_prefix(device_part, NumberField::GpuIndex)?;
        if rest.is_empty() {
            DeviceRef::Index(index)
        } else if let Some(slot) = rest.strip_prefix(':') {
            DeviceRef::MigIndex {
                parent: index,
                slot: whole_number(slot, NumberField::MigSlot)?,
            }
        } else {
            return Err(P::UnexpectedText);
        }
    } else {
        return Err(P::UnknownForm);
    };
    let replica = match replica_part {
        Some(replica) => Some(whole_number(replica, NumberField::Replica)?),
        None => None,
    };
    Ok(DeviceId { device, replica })
}

/// `<idx>[/gi<M>][/vgpu<K>]`, the part of a GKE device name after `nvidia`.
fn parse_gke(rest: &str) -> Result<DeviceId, DeviceIdProblem> {
    let (index, rest) = number_prefix(rest, NumberField::GpuIndex)?;
    let (device, rest) = match rest.strip_prefix("/gi") {
        Some(gi) => {
            let (gpu_instance, rest) = number_prefix(gi, NumberField::GpuInstance)?;
            (
                DeviceRef::GkeMig {
                    index,
                    gpu_instance,
                },
                rest,
            )
        }
        None => (DeviceRef::GkeGpu { index }, rest),
    };
    let replica = if rest.is_empty() {
        None
    } else if let Some(replica) = rest.strip_prefix("/vgpu") {
        Some(whole_number(replica, NumberField::Replica)?)
    } else {
        return Err(DeviceIdProblem::UnexpectedText);
    };
    Ok(DeviceId { device, replica })
}

/// The leading decimal number of `s` and what follows it.
fn number_prefix(s: &str, field: NumberField) -> Result<(u32, &str), DeviceIdProblem> {
    let digits = s.bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return Err(DeviceIdProblem::MissingNumber(field));
    }
    let (number, rest) = s.split_at(digits);
    let mut value: u32 = 0;
    for digit in number.bytes() {
        value = value
            .checked_mul(10)
            .and_then(|v| v.checked_add(u32::from(digit - b'0')))
            .ok_or(DeviceIdProblem::NumberTooLarge(field))?;
    }
    Ok((value, rest))
}

/// `s` as a whole decimal number.
fn whole_number(s: &str, field: NumberField) -> Result<u32, DeviceIdProblem> {
    match number_prefix(s, field)? {
        (value, "") => Ok(value),
        _ => Err(DeviceIdProblem::UnexpectedText),
    }
}

/// `s` as a whole 8-4-4-4-12 UUID body.
fn whole_uuid(s: &str) -> Result<[u8; 16], DeviceIdProblem> {
    match uuid_prefix(s)? {
        (bytes, "") => Ok(bytes),
        _ => Err(DeviceIdProblem::UnexpectedText),
    }
}

const UUID_TEXT_LEN: usize = 36;

fn is_uuid_dash_position(position: usize) -> bool {
    matches!(position, 8 | 13 | 18 | 23)
}

/// The 8-4-4-4-12 UUID body at the start of `s` and what follows it. A hex digit or a
/// dash right after it means a group is too long, which is reported as a bad UUID rather
/// than as unexpected text.
fn uuid_prefix(s: &str) -> Result<([u8; 16], &str), DeviceIdProblem> {
    let text = s.as_bytes();
    let Some(uuid_text) = text.get(..UUID_TEXT_LEN) else {
        return Err(DeviceIdProblem::BadUuid);
    };
    let mut bytes = [0u8; 16];
    let mut nibble = 0;
    for (position, &c) in uuid_text.iter().enumerate() {
        if is_uuid_dash_position(position) {
            if c != b'-' {
                return Err(DeviceIdProblem::BadUuid);
            }
            continue;
        }
        let value = hex_value(c).ok_or(DeviceIdProblem::BadUuid)?;
        let shift = if nibble % 2 == 0 { 4 } else { 0 };
        bytes[nibble / 2] |= value << shift;
        nibble += 1;
    }
    if text
        .get(UUID_TEXT_LEN)
        .is_some_and(|&c| c == b'-' || c.is_ascii_hexdigit())
    {
        return Err(DeviceIdProblem::BadUuid);
    }
    // The first 36 bytes are ASCII, so byte 36 is a character boundary.
    let rest = s.get(UUID_TEXT_LEN..).ok_or(DeviceIdProblem::BadUuid)?;
    Ok((bytes, rest))
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

fn write_uuid_body(bytes: &[u8; 16], f: &mut fmt::Formatter<'_>) -> fmt::Result {
    for (i, byte) in bytes.iter().enumerate() {
        if matches!(i, 4 | 6 | 8 | 10) {
            f.write_str("-")?;
        }
        write!(f, "{byte:02x}")?;
    }
    Ok(())
}

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("GPU-")?;
        write_uuid_body(&self.0, f)
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GpuUuid({self})")
    }
}

impl fmt::Display for MigUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MIG-")?;
        write_uuid_body(&self.0, f)
    }
}

impl fmt::Debug for MigUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MigUuid({self})")
    }
}

impl fmt::Display for DeviceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::GpuUuid(uuid) => write!(f, "{uuid}"),
            Self::MigUuid(uuid) => write!(f, "{uuid}"),
            Self::LegacyMig {
                parent,
                gpu_instance,
                compute_instance,
            } => write!(f, "MIG-{parent}/{gpu_instance}/{compute_instance}"),
            Self::Index(index) => write!(f, "{index}"),
            Self::MigIndex { parent, slot } => write!(f, "{parent}:{slot}"),
            Self::GkeGpu { index } => write!(f, "nvidia{index}"),
            Self::GkeMig {
                index,
                gpu_instance,
            } => write!(f, "nvidia{index}/gi{gpu_instance}"),
        }
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.device)?;
        match self.replica {
            Some(replica) if self.device.is_gke() => write!(f, "/vgpu{replica}"),
            Some(replica) => write!(f, "::{replica}"),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const UUID_BODY: &str = "5b6c7e4a-2f3d-4e91-8a1b-3c4d5e6f7a8b";
    const UUID_BYTES: [u8; 16] = [
        0x5b, 0x6c, 0x7e, 0x4a, 0x2f, 0x3d, 0x4e, 0x91, 0x8a, 0x1b, 0x3c, 0x4d, 0x5e, 0x6f, 0x7a,
        0x8b,
    ];
    const GPU: GpuUuid = GpuUuid::from_bytes(UUID_BYTES);
    const MIG: MigUuid = MigUuid::from_bytes(UUID_BYTES);

    fn id(device: DeviceRef, replica: Option<u32>) -> DeviceId {
        DeviceId { device, replica }
    }

    fn parse(input: &str) -> Result<DeviceId, DeviceIdProblem> {
        input.parse::<DeviceId>().map_err(|error| {
            assert_eq!(error.input, input, "the error names its input");
            error.problem
        })
    }

    #[test]
    fn every_valid_form_parses_to_its_typed_value() {
        use DeviceRef::*;
        let legacy = LegacyMig {
            parent: GPU,
            gpu_instance: 7,
            compute_instance: 0,
        };
        let rows: Vec<(String, DeviceId)> = vec![
            (format!("GPU-{UUID_BODY}"), id(GpuUuid(GPU), None)),
            (format!("GPU-{UUID_BODY}::3"), id(GpuUuid(GPU), Some(3))),
            (
                format!("GPU-{}", UUID_BODY.to_uppercase()),
                id(GpuUuid(GPU), None),
            ),
            (format!("MIG-{UUID_BODY}"), id(MigUuid(MIG), None)),
            (format!("MIG-{UUID_BODY}::0"), id(MigUuid(MIG), Some(0))),
            (format!("MIG-GPU-{UUID_BODY}/7/0"), id(legacy, None)),
            (format!("MIG-GPU-{UUID_BODY}/7/0::2"), id(legacy, Some(2))),
            ("0".into(), id(Index(0), None)),
            ("13".into(), id(Index(13), None)),
            ("007".into(), id(Index(7), None)),
            ("4294967295".into(), id(Index(u32::MAX), None)),
            ("0:1".into(), id(MigIndex { parent: 0, slot: 1 }, None)),
            ("2::5".into(), id(Index(2), Some(5))),
            (
                "3:0::1".into(),
                id(MigIndex { parent: 3, slot: 0 }, Some(1)),
            ),
            ("nvidia0".into(), id(GkeGpu { index: 0 }, None)),
            ("nvidia12".into(), id(GkeGpu { index: 12 }, None)),
            ("nvidia1/vgpu4".into(), id(GkeGpu { index: 1 }, Some(4))),
            (
                "nvidia0/gi3".into(),
                id(
                    GkeMig {
                        index: 0,
                        gpu_instance: 3,
                    },
                    None,
                ),
            ),
            (
                "nvidia2/gi9/vgpu1".into(),
                id(
                    GkeMig {
                        index: 2,
                        gpu_instance: 9,
                    },
                    Some(1),
                ),
            ),
        ];
        for (input, expected) in rows {
            assert_eq!(parse(&input), Ok(expected), "{input}");
        }
    }

    #[test]
    fn canonical_forms_display_as_the_plugin_writes_them() {
        for input in [
            format!("GPU-{UUID_BODY}"),
            format!("GPU-{UUID_BODY}::3"),
            format!("MIG-{UUID_BODY}"),
            format!("MIG-{UUID_BODY}::1"),
            format!("MIG-GPU-{UUID_BODY}/7/0"),
            "0".into(),
            "0:1".into(),
            "2::5".into(),
            "nvidia0".into(),
            "nvidia0/vgpu2".into(),
            "nvidia0/gi3".into(),
            "nvidia0/gi3/vgpu2".into(),
        ] {
            let parsed: DeviceId = input.parse().expect(&input);
            assert_eq!(parsed.to_string(), input);
        }
    }

    #[test]
    fn every_invalid_variant_names_its_problem() {
        use DeviceIdProblem::*;
        use NumberField::*;
        let short_group = "5b6c7e4-2f3d-4e91-8a1b-3c4d5e6f7a8b0";
        let long_group = "5b6c7e4a0-2f3d-4e91-8a1b-3c4d5e6f7a8";
        let rows: Vec<(String, DeviceIdProblem)> = vec![
            (String::new(), Empty),
            (" ".into(), UnknownForm),
            (format!(" GPU-{UUID_BODY}"), UnknownForm),
            (format!("gpu-{UUID_BODY}"), UnknownForm),
            // A bare UUID: a digit-led one reads as an index with text after it.
            (UUID_BODY.into(), UnexpectedText),
            ("abcdef01-2f3d-4e91-8a1b-3c4d5e6f7a8b".into(), UnknownForm),
            ("::1".into(), UnknownForm),
            ("-1".into(), UnknownForm),
            ("+1".into(), UnknownForm),
            ("vgpu1".into(), UnknownForm),
            ("GPU-".into(), BadUuid),
            (format!("GPU-{}", &UUID_BODY[..35]), BadUuid),
            (format!("GPU-{}", UUID_BODY.replace('e', "g")), BadUuid),
            (format!("GPU-{}", UUID_BODY.replace('-', "")), BadUuid),
            (format!("GPU-{short_group}"), BadUuid),
            (format!("GPU-{long_group}"), BadUuid),
            (format!("GPU-{UUID_BODY}0"), BadUuid),
            (format!("GPU-{UUID_BODY}-0"), BadUuid),
            (format!("GPU-{UUID_BODY}x"), UnexpectedText),
            (format!("GPU-{UUID_BODY} "), UnexpectedText),
            (format!("GPU-{UUID_BODY}/1/2"), UnexpectedText),
            (format!("GPU-{UUID_BODY}::"), MissingNumber(Replica)),
            (format!("GPU-{UUID_BODY}::x"), MissingNumber(Replica)),
            (format!("GPU-{UUID_BODY}::1x"), UnexpectedText),
            (format!("GPU-{UUID_BODY}::1::2"), UnexpectedText),
            (format!("GPU-{UUID_BODY}::-1"), MissingNumber(Replica)),
            (
                format!("GPU-{UUID_BODY}::4294967296"),
                NumberTooLarge(Replica),
            ),
            (format!("GPU-{UUID_BODY}:1"), UnexpectedText),
            ("MIG-".into(), BadUuid),
            (format!("MIG-{}", UUID_BODY.replace('a', "z")), BadUuid),
            (format!("MIG-{UUID_BODY}/1"), UnexpectedText),
            (format!("MIG-{UUID_BODY}::"), MissingNumber(Replica)),
            ("MIG-GPU-".into(), BadUuid),
            (format!("MIG-GPU-{UUID_BODY}"), MissingNumber(GpuInstance)),
            (format!("MIG-GPU-{UUID_BODY}/"), MissingNumber(GpuInstance)),
            (
                format!("MIG-GPU-{UUID_BODY}/1"),
                MissingNumber(ComputeInstance),
            ),
            (
                format!("MIG-GPU-{UUID_BODY}/1/"),
                MissingNumber(ComputeInstance),
            ),
            (format!("MIG-GPU-{UUID_BODY}/1/2/3"), UnexpectedText),
            (format!("MIG-GPU-{UUID_BODY}/1x/2"), UnexpectedText),
            (format!("MIG-GPU-{UUID_BODY}:1/2"), UnexpectedText),
            (
                format!("MIG-GPU-{UUID_BODY}/99999999999/0"),
                NumberTooLarge(GpuInstance),
            ),
            (
                format!("MIG-GPU-{UUID_BODY}/0/4294967296"),
                NumberTooLarge(ComputeInstance),
            ),
            ("4294967296".into(), NumberTooLarge(GpuIndex)),
            ("0x1".into(), UnexpectedText),
            ("1 ".into(), UnexpectedText),
            ("0:".into(), MissingNumber(MigSlot)),
            ("0:x".into(), MissingNumber(MigSlot)),
            ("0:1:2".into(), UnexpectedText),
            ("0:4294967296".into(), NumberTooLarge(MigSlot)),
            ("0::".into(), MissingNumber(Replica)),
            ("0:::1".into(), MissingNumber(Replica)),
            ("nvidia".into(), MissingNumber(GpuIndex)),
            ("nvidia/gi1".into(), MissingNumber(GpuIndex)),
            ("nvidia-1".into(), MissingNumber(GpuIndex)),
            ("nvidia4294967296".into(), NumberTooLarge(GpuIndex)),
            ("nvidia0x".into(), UnexpectedText),
            ("nvidia0/".into(), UnexpectedText),
            ("nvidia0/gi".into(), MissingNumber(GpuInstance)),
            ("nvidia0/gix".into(), MissingNumber(GpuInstance)),
            ("nvidia0/gi1/".into(), UnexpectedText),
            ("nvidia0/gi1/gi2".into(), UnexpectedText),
            ("nvidia0/gi4294967296".into(), NumberTooLarge(GpuInstance)),
            ("nvidia0/vgpu".into(), MissingNumber(Replica)),
            ("nvidia0/gi1/vgpu".into(), MissingNumber(Replica)),
            ("nvidia0/vgpu1/gi2".into(), UnexpectedText),
            ("nvidia0/vgpu4294967296".into(), NumberTooLarge(Replica)),
            ("nvidia0::1".into(), GkeColonReplica),
            ("nvidia0/gi1::1".into(), GkeColonReplica),
        ];
        for (input, expected) in rows {
            assert_eq!(parse(&input), Err(expected), "{input:?}");
        }
    }

    #[test]
    fn error_message_names_the_input_and_the_problem() {
        let error = "nvidia0/gi".parse::<DeviceId>().unwrap_err();
        assert_eq!(
            error.to_string(),
            "invalid device ID \"nvidia0/gi\": missing GPU instance ID"
        );
    }

    #[test]
    fn uuid_types_parse_nvml_strings_and_display_lower_case() {
        let upper = format!("GPU-{}", UUID_BODY.to_uppercase());
        assert_eq!(upper.parse::<GpuUuid>(), Ok(GPU));
        assert_eq!(GPU.to_string(), format!("GPU-{UUID_BODY}"));
        assert_eq!(format!("MIG-{UUID_BODY}").parse::<MigUuid>(), Ok(MIG));
        assert_eq!(MIG.to_string(), format!("MIG-{UUID_BODY}"));
        assert_eq!(
            format!("MIG-{UUID_BODY}")
                .parse::<GpuUuid>()
                .unwrap_err()
                .problem,
            DeviceIdProblem::UnknownForm
        );
        assert_eq!(
            format!("GPU-{UUID_BODY}::1")
                .parse::<GpuUuid>()
                .unwrap_err()
                .problem,
            DeviceIdProblem::UnexpectedText
        );
    }

    #[test]
    fn mig_and_gke_classification() {
        let mig_forms = [
            format!("MIG-{UUID_BODY}"),
            format!("MIG-GPU-{UUID_BODY}/1/0"),
            "0:1".into(),
            "nvidia0/gi1".into(),
        ];
        for input in mig_forms {
            let parsed: DeviceId = input.parse().expect(&input);
            assert!(parsed.device.is_mig(), "{input}");
        }
        for input in [format!("GPU-{UUID_BODY}"), "0".into(), "nvidia0".into()] {
            let parsed: DeviceId = input.parse().expect(&input);
            assert!(!parsed.device.is_mig(), "{input}");
        }
        let gke: DeviceId = "nvidia1/gi2".parse().expect("GKE MIG");
        assert!(gke.device.is_gke());
        let index: DeviceId = "1:2".parse().expect("index MIG");
        assert!(!index.device.is_gke());
    }

    #[test]
    fn gpu_resource_names() {
        let extra = vec!["example.com/gpu".to_string(), "nvidia.com/mig-".to_string()];
        let rows: &[(&str, Option<ResourceKind<'_>>)] = &[
            ("nvidia.com/gpu", Some(ResourceKind::Gpu { shared: false })),
            (
                "nvidia.com/gpu.shared",
                Some(ResourceKind::Gpu { shared: true }),
            ),
            (
                "nvidia.com/mig-1g.10gb",
                Some(ResourceKind::Mig {
                    profile: "1g.10gb",
                    shared: false,
                }),
            ),
            (
                "nvidia.com/mig-1c.3g.40gb",
                Some(ResourceKind::Mig {
                    profile: "1c.3g.40gb",
                    shared: false,
                }),
            ),
            (
                "nvidia.com/mig-1g.5gb+me",
                Some(ResourceKind::Mig {
                    profile: "1g.5gb+me",
                    shared: false,
                }),
            ),
            (
                "nvidia.com/mig-1g.5gb.shared",
                Some(ResourceKind::Mig {
                    profile: "1g.5gb",
                    shared: true,
                }),
            ),
            ("example.com/gpu", Some(ResourceKind::Listed)),
            ("nvidia.com/mig-", Some(ResourceKind::Listed)),
            ("nvidia.com/mig-.shared", None),
            ("nvidia.com/gpu.other", None),
            ("nvidia.com/GPU", None),
            ("nvidia.com/gpu ", None),
            ("amd.com/gpu", None),
            ("cpu", None),
            ("memory", None),
            ("", None),
        ];
        for &(name, expected) in rows {
            assert_eq!(is_gpu_resource(name, &extra), expected, "{name}");
        }
        assert_eq!(is_gpu_resource("example.com/gpu", &[]), None);
        assert_eq!(is_gpu_resource("nvidia.com/mig-", &[]), None);
    }

    fn device_ref() -> impl Strategy<Value = DeviceRef> {
        prop_oneof![
            any::<[u8; 16]>().prop_map(|b| DeviceRef::GpuUuid(GpuUuid(b))),
            any::<[u8; 16]>().prop_map(|b| DeviceRef::MigUuid(MigUuid(b))),
            (any::<[u8; 16]>(), any::<u32>(), any::<u32>()).prop_map(|(b, gi, ci)| {
                DeviceRef::LegacyMig {
                    parent: GpuUuid(b),
                    gpu_instance: gi,
                    compute_instance: ci,
                }
            }),
            any::<u32>().prop_map(DeviceRef::Index),
            (any::<u32>(), any::<u32>())
                .prop_map(|(parent, slot)| DeviceRef::MigIndex { parent, slot }),
            any::<u32>().prop_map(|index| DeviceRef::GkeGpu { index }),
            (any::<u32>(), any::<u32>()).prop_map(|(index, gpu_instance)| DeviceRef::GkeMig {
                index,
                gpu_instance
            }),
        ]
    }

    /// Strings assembled from the grammar's own pieces, so that the fuzzer reaches deep
    /// into every branch instead of stopping at the first character.
    fn grammar_soup() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("GPU-".to_string()),
            Just("MIG-".to_string()),
            Just("MIG-GPU-".to_string()),
            Just("nvidia".to_string()),
            Just("::".to_string()),
            Just(":".to_string()),
            Just("/".to_string()),
            Just("/gi".to_string()),
            Just("/vgpu".to_string()),
            Just("-".to_string()),
            Just(UUID_BODY.to_string()),
            "[0-9]{1,12}",
            "[0-9a-fA-F-]{0,40}",
            "\\PC{0,3}",
        ];
        prop::collection::vec(piece, 0..8).prop_map(|pieces| pieces.concat())
    }

    proptest! {
        #[test]
        fn parse_never_panics_on_arbitrary_text(input in any::<String>()) {
            let _ = input.parse::<DeviceId>();
            let _ = input.parse::<GpuUuid>();
            let _ = input.parse::<MigUuid>();
            let _ = is_gpu_resource(&input, &[]);
        }

        #[test]
        fn parse_never_panics_on_grammar_pieces(input in grammar_soup()) {
            // Whatever parses, its canonical form parses back to the same value.
            if let Ok(parsed) = input.parse::<DeviceId>() {
                prop_assert_eq!(parsed.to_string().parse::<DeviceId>(), Ok(parsed));
            }
        }

        #[test]
        fn every_valid_value_round_trips(device in device_ref(), replica in any::<Option<u32>>()) {
            let value = DeviceId { device, replica };
            let text = value.to_string();
            prop_assert_eq!(text.parse::<DeviceId>(), Ok(value), "{}", text);
        }
    }
}
