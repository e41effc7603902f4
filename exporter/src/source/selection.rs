//! `-d/--devices`: which GPUs and MIG instances are sampled and served, in DCGM's
//! syntax (dcgm-exporter's `-d`):
//!
//! - `f` (default): every GPU and every MIG instance, as without the flag;
//! - `g` or `g:IDS`: physical GPUs only, all or those with these NVML indices;
//! - `i` or `i:IDS`: MIG instances only, all or those at these node-wide positions (GPU
//!   by GPU in NVML order, then each GPU's MIG devices in order, as DCGM numbers its
//!   GPU-instance entities);
//!
//! where `IDS` is a comma-separated list of numbers and `A-B` ranges (`0,2-4`).
//! [`Selected`] wraps a source so that the sampler never sees, reads or serves the
//! others.

use super::{EntityInfo, GpuSource, Inventory, ProcessSample, Raw, ReadError, XidEvent};
use crate::plan::catalog::{LabelField, Quantity};
use std::collections::BTreeSet;
use std::fmt;

/// What `-d/--devices` selects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelection {
    /// `f`: everything.
    Flex,
    /// `g[:IDS]`: physical GPUs (`None`: all).
    Gpus(Option<BTreeSet<u32>>),
    /// `i[:IDS]`: MIG instances (`None`: all).
    Instances(Option<BTreeSet<u32>>),
}

/// Why a `--devices` value is not DCGM's device syntax.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DeviceSelectionError {
    #[error("invalid device option {0:?}: there can only be one specified range")]
    TwoRanges(String),
    #[error("invalid device option {0:?}: no range can be given with the flex option 'f'")]
    RangeWithFlex(String),
    #[error(
        "invalid device option {text:?}: expected f, g[:IDS] or i[:IDS] (IDS like 0,2-4), found {letter:?}"
    )]
    UnknownKind { text: String, letter: String },
    #[error("invalid device ID {id:?} in {list:?}: expected a number")]
    NotANumber { id: String, list: String },
    #[error("invalid device range {range:?}: {start} is after {end}")]
    Reversed { range: String, start: u32, end: u32 },
    #[error("invalid device range {0:?}: a range is <number>-<number>")]
    NotARange(String),
}

impl DeviceSelection {
    /// Read DCGM's device syntax; errors say what is wrong and what is expected.
    pub fn parse(text: &str) -> Result<DeviceSelection, DeviceSelectionError> {
        let parts: Vec<&str> = text.split(':').collect();
        if parts.len() > 2 {
            return Err(DeviceSelectionError::TwoRanges(text.into()));
        }
        let ids = match parts.get(1) {
            None => None,
            Some(list) => Some(parse_ids(list)?),
        };
        match (parts[0], ids) {
            ("f", None) => Ok(DeviceSelection::Flex),
            ("f", Some(_)) => Err(DeviceSelectionError::RangeWithFlex(text.into())),
            ("g", ids) => Ok(DeviceSelection::Gpus(ids)),
            ("i", ids) => Ok(DeviceSelection::Instances(ids)),
            (letter, _) => Err(DeviceSelectionError::UnknownKind {
                text: text.into(),
                letter: letter.into(),
            }),
        }
    }

    /// Whether `entity` is selected; `instance_position` is its position among the
    /// inventory's MIG instances.
    fn selects(&self, entity: &EntityInfo, instance_position: Option<u32>) -> bool {
        match (self, instance_position) {
            (DeviceSelection::Flex, _) => true,
            (DeviceSelection::Gpus(ids), None) => ids
                .as_ref()
                .is_none_or(|ids| ids.contains(&entity.gpu_index)),
            (DeviceSelection::Instances(ids), Some(position)) => {
                ids.as_ref().is_none_or(|ids| ids.contains(&position))
            }
            _ => false,
        }
    }
}

impl fmt::Display for DeviceSelection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (letter, ids) = match self {
            DeviceSelection::Flex => return f.write_str("f"),
            DeviceSelection::Gpus(ids) => ("g", ids),
            DeviceSelection::Instances(ids) => ("i", ids),
        };
        f.write_str(letter)?;
        if let Some(ids) = ids {
            let list: Vec<String> = ids.iter().map(u32::to_string).collect();
            write!(f, ":{}", list.join(","))?;
        }
        Ok(())
    }
}

/// `0,2-4` → {0, 2, 3, 4}.
fn parse_ids(list: &str) -> Result<BTreeSet<u32>, DeviceSelectionError> {
    let number = |n: &str| {
        n.parse::<u32>()
            .map_err(|_| DeviceSelectionError::NotANumber {
                id: n.into(),
                list: list.into(),
            })
    };
    let mut ids = BTreeSet::new();
    for item in list.split(',') {
        let bounds: Vec<&str> = item.split('-').collect();
        match bounds.as_slice() {
            [one] => {
                ids.insert(number(one)?);
            }
            [start, end] => {
                let (start, end) = (number(start)?, number(end)?);
                if start > end {
                    return Err(DeviceSelectionError::Reversed {
                        range: item.into(),
                        start,
                        end,
                    });
                }
                ids.extend(start..=end);
            }
            _ => {
                return Err(DeviceSelectionError::NotARange(item.into()));
            }
        }
    }
    Ok(ids)
}

/// A source that shows the sampler only the selected devices.
pub struct Selected {
    inner: Box<dyn GpuSource>,
    selection: DeviceSelection,
    /// Our entity index → the inner source's.
    inner_index: Vec<usize>,
    /// The inner source's entity index → ours, if selected.
    our_index: Vec<Option<usize>>,
}

impl Selected {
    pub fn new(inner: Box<dyn GpuSource>, selection: DeviceSelection) -> Selected {
        Selected {
            inner,
            selection,
            inner_index: Vec::new(),
            our_index: Vec::new(),
        }
    }

    /// Keep the selected entities of `inventory`, and warn about IDs that name nothing.
    fn select(&mut self, mut inventory: Inventory) -> Inventory {
        let mut instances = 0u32;
        let keep: Vec<bool> = inventory
            .entities
            .iter()
            .map(|e| {
                let position = e.mig.as_ref().map(|_| {
                    instances += 1;
                    instances - 1
                });
                self.selection.selects(e, position)
            })
            .collect();
        let (kind, present): (&str, BTreeSet<u32>) = match &self.selection {
            DeviceSelection::Gpus(_) => (
                "GPU",
                inventory
                    .entities
                    .iter()
                    .filter(|e| e.mig.is_none())
                    .map(|e| e.gpu_index)
                    .collect(),
            ),
            _ => ("MIG instance", (0..instances).collect()),
        };
        if let DeviceSelection::Gpus(Some(wanted)) | DeviceSelection::Instances(Some(wanted)) =
            &self.selection
        {
            let missing: Vec<u32> = wanted.difference(&present).copied().collect();
            if !missing.is_empty() {
                tracing::warn!(devices = %self.selection, ?missing, "--devices names {kind}s this node does not have");
            }
        }
        self.our_index = vec![None; keep.len()];
        self.inner_index.clear();
        for (i, _) in keep.iter().enumerate().filter(|(_, kept)| **kept) {
            self.our_index[i] = Some(self.inner_index.len());
            self.inner_index.push(i);
        }
        let entities = std::mem::take(&mut inventory.entities);
        inventory.entities = entities
            .into_iter()
            .zip(&keep)
            .filter(|(_, kept)| **kept)
            .map(|(e, _)| e)
            .collect();
        for (ours, e) in inventory.entities.iter_mut().enumerate() {
            if let Some(mig) = e.mig.as_mut() {
                // A MIG instance served without its GPU is its own parent, so the
                // sampler's lost and XID bookkeeping stays within what is served.
                mig.parent = self
                    .our_index
                    .get(mig.parent)
                    .copied()
                    .flatten()
                    .unwrap_or(ours);
            }
        }
        tracing::info!(devices = %self.selection, selected = inventory.entities.len(), of = keep.len(), "device selection");
        inventory
    }
}

impl GpuSource for Selected {
    fn describe(&self) -> String {
        self.inner.describe()
    }

    fn discover(&mut self, labels: &[LabelField]) -> Result<Inventory, ReadError> {
        let inventory = self.inner.discover(labels)?;
        Ok(self.select(inventory))
    }

    fn probe(&mut self) -> Result<(), ReadError> {
        self.inner.probe()
    }

    fn read(
        &mut self,
        entity: usize,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        match self.inner_index.get(entity) {
            Some(&inner) => self.inner.read(inner, quantities, out),
            None => {
                out.clear();
                out.extend(quantities.iter().map(|_| Err(ReadError::GpuLost)));
            }
        }
    }

    fn processes(&mut self, entity: usize) -> Result<Vec<ProcessSample>, ReadError> {
        match self.inner_index.get(entity) {
            Some(&inner) => self.inner.processes(inner),
            None => Err(ReadError::GpuLost),
        }
    }

    fn device_set_changed(&mut self) -> bool {
        self.inner.device_set_changed()
    }

    fn nvlinks(&mut self, entity: usize) -> u32 {
        match self.inner_index.get(entity) {
            Some(&inner) => self.inner.nvlinks(inner),
            None => 0,
        }
    }

    fn read_links(
        &mut self,
        entity: usize,
        links: u32,
        quantities: &[Quantity],
        out: &mut Vec<Result<Raw, ReadError>>,
    ) {
        match self.inner_index.get(entity) {
            Some(&inner) => self.inner.read_links(inner, links, quantities, out),
            None => {
                out.clear();
                out.extend((0..links as usize * quantities.len()).map(|_| Err(ReadError::GpuLost)));
            }
        }
    }

    fn end_cycle(&mut self) {
        self.inner.end_cycle()
    }

    fn xid_events(&mut self) -> Vec<XidEvent> {
        let our_index = &self.our_index;
        self.inner
            .xid_events()
            .into_iter()
            .filter_map(|ev| {
                let entity = (*our_index.get(ev.entity)?)?;
                Some(XidEvent { entity, ..ev })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::MigInfo;
    use std::time::SystemTime;

    fn ids(list: &[u32]) -> Option<BTreeSet<u32>> {
        Some(list.iter().copied().collect())
    }

    #[test]
    fn dcgm_device_syntax_is_read() {
        use DeviceSelection::*;
        assert_eq!(DeviceSelection::parse("f"), Ok(Flex));
        assert_eq!(DeviceSelection::parse("g"), Ok(Gpus(None)));
        assert_eq!(DeviceSelection::parse("i"), Ok(Instances(None)));
        assert_eq!(DeviceSelection::parse("g:0,1"), Ok(Gpus(ids(&[0, 1]))));
        assert_eq!(
            DeviceSelection::parse("i:0,2-4"),
            Ok(Instances(ids(&[0, 2, 3, 4])))
        );
        assert_eq!(DeviceSelection::parse("g:3-3,1"), Ok(Gpus(ids(&[1, 3]))));
        // Display writes what parse reads.
        for text in ["f", "g", "i", "g:0,1", "i:0,2,3,4"] {
            let parsed = DeviceSelection::parse(text).unwrap();
            assert_eq!(parsed.to_string(), text);
        }
    }

    #[test]
    fn bad_device_options_say_what_is_wrong() {
        for (text, says) in [
            ("g:0:1", "only be one specified range"),
            ("f:0", "no range can be given with the flex option"),
            ("x", "expected f, g[:IDS] or i[:IDS]"),
            ("g+i", "found \"g+i\""),
            ("", "found \"\""),
            ("g:a", "invalid device ID \"a\""),
            ("g:", "invalid device ID \"\""),
            ("g:1-", "invalid device ID \"\""),
            ("g:4-2", "4 is after 2"),
            ("i:1-2-3", "a range is <number>-<number>"),
            ("g:-1", "invalid device ID \"\""),
        ] {
            let e = DeviceSelection::parse(text).unwrap_err().to_string();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    /// GPUs 0 and 1; GPU 1 in MIG mode with two instances; XIDs on GPU 0 and on the
    /// second instance.
    struct Node;

    fn gpu(index: u32) -> EntityInfo {
        EntityInfo {
            gpu_index: index,
            uuid: format!("GPU-{index}"),
            pci_bus_id: String::new(),
            model_name: "H100".into(),
            minor_number: Some(index),
            mig: None,
            labels: Default::default(),
            lost: false,
        }
    }

    fn instance(slot: u32) -> EntityInfo {
        EntityInfo {
            mig: Some(MigInfo {
                parent: 1,
                gpu_instance_id: slot + 1,
                compute_instance_id: 0,
                slot,
                profile: "3g.40gb".into(),
                mig_uuid: format!("MIG-{slot}"),
                placement: None,
            }),
            ..gpu(1)
        }
    }

    impl GpuSource for Node {
        fn describe(&self) -> String {
            "node".into()
        }
        fn discover(&mut self, _: &[LabelField]) -> Result<Inventory, ReadError> {
            Ok(Inventory {
                driver_version: "1".into(),
                nvml_version: "1".into(),
                entities: vec![gpu(0), gpu(1), instance(0), instance(1)],
            })
        }
        fn probe(&mut self) -> Result<(), ReadError> {
            Ok(())
        }
        fn read(&mut self, e: usize, q: &[Quantity], out: &mut Vec<Result<Raw, ReadError>>) {
            out.clear();
            out.extend(q.iter().map(|_| Ok(Raw::U64(e as u64))));
        }
        fn processes(&mut self, _: usize) -> Result<Vec<ProcessSample>, ReadError> {
            Ok(Vec::new())
        }
        /// GPU `e` has `e + 4` links; each link reads as `e * 100 + link`.
        fn nvlinks(&mut self, e: usize) -> u32 {
            e as u32 + 4
        }
        fn read_links(
            &mut self,
            e: usize,
            links: u32,
            q: &[Quantity],
            out: &mut Vec<Result<Raw, ReadError>>,
        ) {
            out.clear();
            for link in 0..links as usize {
                out.extend(q.iter().map(|_| Ok(Raw::U64((e * 100 + link) as u64))));
            }
        }
        fn xid_events(&mut self) -> Vec<XidEvent> {
            [(0, 13), (3, 43)]
                .into_iter()
                .map(|(entity, code)| XidEvent {
                    entity,
                    code,
                    at: SystemTime::UNIX_EPOCH,
                })
                .collect()
        }
    }

    fn selected(text: &str) -> (Selected, Inventory) {
        let mut s = Selected::new(Box::new(Node), DeviceSelection::parse(text).unwrap());
        let inv = s.discover(&[]).unwrap();
        (s, inv)
    }

    fn names(inv: &Inventory) -> Vec<String> {
        inv.entities
            .iter()
            .map(|e| match &e.mig {
                Some(m) => m.mig_uuid.clone(),
                None => e.uuid.clone(),
            })
            .collect()
    }

    #[test]
    fn links_are_asked_of_the_selected_gpu_not_of_its_position() {
        // `g:1` serves GPU 1 as entity 0: its links are GPU 1's.
        let (mut s, _) = selected("g:1");
        assert_eq!(s.nvlinks(0), 5);
        let mut out = Vec::new();
        s.read_links(0, 2, &[Quantity::PowerUsage], &mut out);
        assert_eq!(out, vec![Ok(Raw::U64(100)), Ok(Raw::U64(101))]);
        // An entity the selection does not have has no links to read.
        assert_eq!(s.nvlinks(7), 0);
        s.read_links(7, 1, &[Quantity::PowerUsage], &mut out);
        assert_eq!(out, vec![Err(ReadError::GpuLost)]);
    }

    #[test]
    fn a_selection_keeps_only_its_devices_and_maps_reads_and_xids_to_them() {
        assert_eq!(
            names(&selected("f").1),
            ["GPU-0", "GPU-1", "MIG-0", "MIG-1"]
        );
        assert_eq!(names(&selected("g").1), ["GPU-0", "GPU-1"]);
        assert_eq!(names(&selected("g:1").1), ["GPU-1"]);
        assert_eq!(names(&selected("i").1), ["MIG-0", "MIG-1"]);
        assert!(selected("g:7").1.entities.is_empty());

        let (mut s, inv) = selected("i:1");
        assert_eq!(names(&inv), ["MIG-1"]);
        // Served without its GPU: its own parent.
        assert_eq!(inv.entities[0].mig.as_ref().unwrap().parent, 0);
        let mut out = Vec::new();
        s.read(0, &[Quantity::GpuUtil], &mut out);
        assert_eq!(out, [Ok(Raw::U64(3))], "our entity 0 is the source's 3");
        let xids = s.xid_events();
        assert_eq!(xids.len(), 1, "GPU 0's XID is not served");
        assert_eq!((xids[0].entity, xids[0].code), (0, 43));

        // Selected with its GPU, an instance keeps the GPU as its parent.
        let (mut s, inv) = selected("f");
        assert_eq!(inv.entities[3].mig.as_ref().unwrap().parent, 1);
        assert_eq!(s.xid_events().len(), 2);
    }
}
