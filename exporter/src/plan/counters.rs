//! dcgm-exporter's counters CSV (`-f/--collectors`), read as dcgm-exporter reads it:
//! `field, type, help` per line, `#` comments, blank lines skipped, spaces around
//! columns trimmed, standard CSV quoting. The result is an [`ExportPlan`]: which fields
//! become metric families, in file order, and which become labels. A row names a field
//! by its DCGM name or by a legacy alias dcgm-exporter accepts (`dcgm_sm_clock`), and
//! its family is served under the row's name, as dcgm-exporter serves it.

use crate::error::{Error, Result};
use crate::plan::catalog::{
    self, Convert, ExporterField, FieldSource, LabelField, Nature, Quantity, Scope,
};
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::path::Path;

/// The built-in counters list: dcgm-exporter's `default-counters.csv`.
pub const DEFAULT_COUNTERS: &str = include_str!("catalog/default-counters.csv");

/// A Prometheus type as the CSV declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclaredType {
    Gauge,
    Counter,
    Histogram,
    Summary,
    Label,
}

/// The TYPE a family is exported with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Gauge,
    Counter,
}

/// A field exported as a metric family.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricField {
    pub name: &'static str,
    pub help: String,
    pub metric_type: MetricType,
    pub kind: MetricKind,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MetricKind {
    Value {
        quantity: Quantity,
        convert: Convert,
        scope: Scope,
    },
    /// `DCGM_FI_DEV_XID_ERRORS`: last XID seen.
    LastXid,
    /// A `DCGM_EXP_*` collector: its series carry their own labels.
    Exporter(ExporterField),
}

/// What the exporter will export, decided once at startup.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ExportPlan {
    /// Metric families, in CSV order.
    pub metrics: Vec<MetricField>,
    /// `label` rows: (field name, source), byte-sorted by name as dcgm-exporter emits them.
    pub labels: Vec<(&'static str, LabelField)>,
}

impl ExportPlan {
    /// Distinct NVML quantities the plan reads, by scope.
    pub fn quantities(&self) -> Vec<(Quantity, Scope)> {
        let mut v: Vec<(Quantity, Scope)> = self
            .metrics
            .iter()
            .filter_map(|m| match m.kind {
                MetricKind::Value {
                    quantity, scope, ..
                } => Some((quantity, scope)),
                MetricKind::LastXid | MetricKind::Exporter(_) => None,
            })
            .collect();
        v.sort_by_key(|(q, _)| *q);
        v.dedup_by_key(|(q, _)| *q);
        v
    }
}

/// A non-fatal finding while planning, logged at startup.
#[derive(Debug, Clone, PartialEq)]
pub struct PlanWarning {
    pub line: u64,
    pub message: String,
    /// An expected adjustment (a rate declared `counter`), not a problem with the file.
    pub notice: bool,
}

/// One CSV record: the line it starts on and its fields.
type CsvRecord = (u64, Vec<String>);

/// Split CSV text into records the way dcgm-exporter's Go reader does (`encoding/csv`
/// with `Comment = '#'` and leading space trimmed), each with the line it starts on.
///
/// A counters CSV that Go's `encoding/csv` would refuse: where, and why.
#[derive(Debug)]
struct MalformedCsv {
    line: u64,
    why: CsvSyntax,
}

#[derive(Debug, thiserror::Error)]
enum CsvSyntax {
    #[error("malformed CSV: quoted field is never closed")]
    Unclosed,
    #[error("malformed CSV: unexpected {0:?} after a quoted field")]
    AfterQuote(String),
    #[error("malformed CSV: bare \" in unquoted field {0:?}; quote the whole field")]
    BareQuote(String),
}

/// Hand-written because the `csv` crate differs where users' files do: it does not
/// recognise a quote after leading spaces (`a, "b, c"`), silently accepts bare and
/// unterminated quotes that Go rejects, and does not count skipped blank lines.
fn go_csv_records(text: &str) -> Result<Vec<CsvRecord>, MalformedCsv> {
    let mut records = Vec::new();
    let mut lines = text.split('\n').enumerate().peekable();
    while let Some((i, raw)) = lines.next() {
        let start = i as u64 + 1;
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let mut fields = Vec::new();
        // Slices of `text` throughout: copying the rest of the line at every field or
        // escaped quote made a long line quadratic (a 1 MiB line of commas took ~20 s).
        let mut rest: &str = line;
        let mut line_no = start;
        loop {
            let trimmed = rest.trim_start_matches([' ', '\t']);
            if let Some(quoted) = trimmed.strip_prefix('"') {
                // A quoted field may run over several lines.
                let mut field = String::new();
                let mut cur = quoted;
                loop {
                    match cur.find('"') {
                        Some(q) if cur[q + 1..].starts_with('"') => {
                            field.push_str(&cur[..=q]);
                            cur = &cur[q + 2..];
                        }
                        Some(q) => {
                            field.push_str(&cur[..q]);
                            cur = &cur[q + 1..];
                            break;
                        }
                        None => {
                            field.push_str(cur);
                            field.push('\n');
                            match lines.next() {
                                Some((j, next)) => {
                                    line_no = j as u64 + 1;
                                    cur = next.strip_suffix('\r').unwrap_or(next);
                                }
                                None => {
                                    return Err(MalformedCsv {
                                        line: start,
                                        why: CsvSyntax::Unclosed,
                                    });
                                }
                            }
                        }
                    }
                }
                fields.push(field);
                match cur.strip_prefix(',') {
                    Some(after) => rest = after,
                    None if cur.is_empty() => break,
                    None => {
                        return Err(MalformedCsv {
                            line: line_no,
                            why: CsvSyntax::AfterQuote(cur.chars().take(40).collect()),
                        });
                    }
                }
            } else {
                let (field, after) = match trimmed.split_once(',') {
                    Some((f, a)) => (f, Some(a)),
                    None => (trimmed, None),
                };
                if field.contains('"') {
                    return Err(MalformedCsv {
                        line: line_no,
                        why: CsvSyntax::BareQuote(field.chars().take(80).collect()),
                    });
                }
                fields.push(field.to_string());
                match after {
                    Some(a) => rest = a,
                    None => break,
                }
            }
        }
        records.push((start, fields));
    }
    Ok(records)
}

/// Read and plan a counters file.
pub fn load(path: &Path) -> Result<(ExportPlan, Vec<PlanWarning>)> {
    let file = path.display().to_string();
    let text =
        kube_support::config_file::read_to_string(path, kube_support::config_file::DEFAULT_LIMIT)
            .map_err(|source| Error::CountersRead {
            file: file.clone(),
            source,
        })?;
    plan(&text, &file)
}

/// Parse and plan counters CSV text; `file` names it in errors.
pub fn plan(text: &str, file: &str) -> Result<(ExportPlan, Vec<PlanWarning>)> {
    let records =
        go_csv_records(text).map_err(|e| counters_error(file, e.line, e.why.to_string()))?;
    let mut plan = ExportPlan::default();
    let mut warnings = Vec::new();
    let mut first_seen: HashMap<&str, u64> = HashMap::new();
    for (line, fields) in records {
        let row = parse_row(file, line, &fields)?;
        let name = row.name;
        if !catalog::is_known_dcgm_name(name) {
            return Err(Error::CountersUnknownField {
                file: file.to_string(),
                line,
                name: name.to_string(),
            });
        }
        let Some((served, def)) = catalog::resolve(name) else {
            warnings.push(PlanWarning {
                line,
                message: format!("{name} has no NVML source in this exporter; skipped"),
                notice: false,
            });
            continue;
        };
        // dcgm-exporter serves a field's values under the first row that names it (by
        // its own name or an alias): its own 1.x file lists dcgm_fi_prof_pcie_tx_bytes
        // twice. A later row of the same field is skipped, as there.
        match first_seen.entry(def.name) {
            Entry::Occupied(first) => {
                warnings.push(PlanWarning {
                    line,
                    message: format!(
                        "{name} is the field of line {} again; only the first row is served",
                        first.get()
                    ),
                    notice: false,
                });
                continue;
            }
            Entry::Vacant(v) => {
                v.insert(line);
            }
        }
        place_row(&row, served, def.source, &mut plan, &mut warnings);
    }
    if plan.metrics.is_empty() {
        return Err(Error::CountersEmpty {
            file: file.to_string(),
        });
    }
    plan.labels.sort_by(|a, b| a.0.cmp(b.0));
    Ok((plan, warnings))
}

/// A malformed line of the counters CSV `file`.
fn counters_error(file: &str, line: u64, message: String) -> Error {
    Error::Counters {
        file: file.to_string(),
        line,
        message,
    }
}

/// One counters CSV row: its columns, trimmed, and its declared type.
#[derive(Clone, Copy)]
struct Row<'a> {
    line: u64,
    name: &'a str,
    ty: &'a str,
    help: &'a str,
    declared: DeclaredType,
}

/// Check a record has the three columns `field, type, help` and a known type.
fn parse_row<'a>(file: &str, line: u64, fields: &'a [String]) -> Result<Row<'a>> {
    let cols: Vec<&str> = fields.iter().map(|c| c.trim_matches(' ')).collect();
    if cols.len() != 3 {
        return Err(counters_error(
            file,
            line,
            format!(
                "malformed CSV record: expected 3 fields (field, type, help), found {}",
                cols.len()
            ),
        ));
    }
    let (name, ty, help) = (cols[0], cols[1], cols[2]);
    let declared = match ty {
        "gauge" => DeclaredType::Gauge,
        "counter" => DeclaredType::Counter,
        "histogram" => DeclaredType::Histogram,
        "summary" => DeclaredType::Summary,
        "label" => DeclaredType::Label,
        other => {
            return Err(counters_error(
                file,
                line,
                format!(
                    "unknown Prometheus type {other:?} for {name}: expected gauge, counter, histogram, summary or label"
                ),
            ));
        }
    };
    Ok(Row {
        line,
        name,
        ty,
        help,
        declared,
    })
}

/// Add a row's field to the plan as a label or a metric family, as its source allows,
/// warning where that differs from the type the row declares.
fn place_row(
    row: &Row<'_>,
    served: &'static str,
    source: FieldSource,
    plan: &mut ExportPlan,
    warnings: &mut Vec<PlanWarning>,
) {
    let Row {
        line,
        name,
        ty,
        help,
        declared,
    } = *row;
    match (source, declared) {
        (FieldSource::Label(l), DeclaredType::Label) => plan.labels.push((served, l)),
        (FieldSource::Label(l), _) => {
            warnings.push(PlanWarning {
                line,
                message: format!("{name} is a string; exported as a label, not as a {ty} value"),
                notice: false,
            });
            plan.labels.push((served, l));
        }
        (_, DeclaredType::Label) => warnings.push(PlanWarning {
            line,
            message: format!("{name} is numeric and cannot be a label; skipped"),
            notice: false,
        }),
        (FieldSource::LastXid, _) => plan.metrics.push(MetricField {
            name: served,
            help: help.to_string(),
            metric_type: MetricType::Gauge,
            kind: MetricKind::LastXid,
        }),
        (FieldSource::Exporter(x), declared) => {
            // dcgm-exporter declares these `counter`, but windowed counts fall as
            // the window slides and the health status is an enum.
            if declared != DeclaredType::Gauge {
                warnings.push(PlanWarning {
                    line,
                    message: format!("{name} is declared {ty} but can go down; exported as gauge"),
                    notice: true,
                });
            }
            plan.metrics.push(MetricField {
                name: served,
                help: help.to_string(),
                metric_type: MetricType::Gauge,
                kind: MetricKind::Exporter(x),
            });
        }
        (
            FieldSource::Value {
                quantity,
                convert,
                scope,
                nature,
            },
            _,
        ) => plan.metrics.push(MetricField {
            name: served,
            help: help.to_string(),
            metric_type: value_metric_type(row, nature, warnings),
            kind: MetricKind::Value {
                quantity,
                convert,
                scope,
            },
        }),
    }
}

/// The TYPE a value field is exported with: `counter` only where the row declares it
/// and the quantity never goes down; otherwise gauge, with a warning where that differs.
fn value_metric_type(row: &Row<'_>, nature: Nature, warnings: &mut Vec<PlanWarning>) -> MetricType {
    let (line, name, ty) = (row.line, row.name, row.ty);
    match (row.declared, nature) {
        (DeclaredType::Counter, Nature::Counter) => MetricType::Counter,
        (DeclaredType::Counter, Nature::Gauge) => {
            warnings.push(PlanWarning {
                line,
                message: format!("{name} is declared counter but can go down; exported as gauge"),
                notice: true,
            });
            MetricType::Gauge
        }
        (DeclaredType::Histogram | DeclaredType::Summary, _) => {
            warnings.push(PlanWarning {
                line,
                message: format!("{name} is a single value, not a {ty}; exported as gauge"),
                notice: false,
            });
            MetricType::Gauge
        }
        _ => MetricType::Gauge,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err_of(text: &str) -> String {
        plan(text, "test.csv").unwrap_err().to_string()
    }

    #[test]
    fn the_default_list_plans_25_metrics_and_the_driver_label() {
        let (p, warnings) = plan(DEFAULT_COUNTERS, "default").unwrap();
        assert_eq!(p.metrics.len(), 25);
        assert_eq!(
            p.labels,
            vec![("DCGM_FI_DRIVER_VERSION", LabelField::DriverVersion)]
        );
        assert_eq!(p.metrics[0].name, "DCGM_FI_DEV_SM_CLOCK");
        assert_eq!(p.metrics[0].help, "SM clock frequency (in MHz).");
        // The one rate dcgm-exporter declares counter.
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].message.contains("NVLINK_BANDWIDTH_TOTAL"));
        let energy = p
            .metrics
            .iter()
            .find(|m| m.name == "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")
            .unwrap();
        assert_eq!(energy.metric_type, MetricType::Counter);
    }

    /// The list the kustomize base and the Helm chart deploy plans whole, the health
    /// rows included (a help text with an unquoted comma would stop every exporter).
    #[test]
    fn the_deployed_list_plans_its_health_rows() {
        let text = include_str!("../../../deploy/base/exporter/counters.csv");
        let (p, _) = plan(text, "counters.csv").unwrap();
        for name in [
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION",
            "DCGM_FI_DEV_ECC_PENDING",
            "DCGM_EXP_XID_ERRORS_COUNT",
            "DCGM_EXP_GPU_HEALTH_STATUS",
        ] {
            assert!(p.metrics.iter().any(|m| m.name == name), "{name}");
        }
    }

    #[test]
    fn quoted_help_with_commas_spaces_and_comments_parse() {
        let text = "# comment\n\n  DCGM_FI_DEV_GPU_TEMP ,  gauge , \"Temp, in C\"\n";
        let (p, _) = plan(text, "t").unwrap();
        assert_eq!(p.metrics[0].name, "DCGM_FI_DEV_GPU_TEMP");
        assert_eq!(p.metrics[0].help, "Temp, in C");
    }

    #[test]
    fn wrong_column_count_names_file_and_line() {
        let e = err_of("DCGM_FI_DEV_GPU_TEMP, gauge, ok\n\nDCGM_FI_DEV_SM_CLOCK, gauge\n");
        assert!(e.starts_with("test.csv:3: "), "{e}");
        assert!(e.contains("expected 3 fields"), "{e}");
        let e = err_of("DCGM_FI_DEV_SM_CLOCK, gauge, a, b\n");
        assert!(e.contains("test.csv:1:") && e.contains("found 4"), "{e}");
    }

    #[test]
    fn unknown_field_names_suggest_the_closest() {
        let e = err_of("DCGM_FI_DEV_GPU_TEMP, gauge, ok\nDCGM_FI_DEV_GPU_UTILIZATION, gauge, x\n");
        assert!(e.starts_with("test.csv:2: "), "{e}");
        assert!(e.contains("DCGM_FI_DEV_GPU_UTIL"), "{e}");
    }

    #[test]
    fn unknown_types_are_errors() {
        let e = err_of("DCGM_FI_DEV_GPU_TEMP, gauje, x\n");
        assert!(e.contains("test.csv:1:") && e.contains("gauje"), "{e}");
    }

    #[test]
    fn unterminated_quotes_are_errors_with_a_line() {
        let e = err_of("DCGM_FI_DEV_GPU_TEMP, gauge, x\nDCGM_FI_DEV_SM_CLOCK, gauge, \"open\n");
        assert!(e.starts_with("test.csv:"), "{e}");
    }

    #[test]
    fn bare_quotes_are_errors_and_multi_line_quotes_keep_the_start_line() {
        let e = err_of("DCGM_FI_DEV_GPU_TEMP, gauge, say \"hi\"\n");
        assert!(e.starts_with("test.csv:1: ") && e.contains("bare"), "{e}");
        let (p, _) = plan(
            "\nDCGM_FI_DEV_GPU_TEMP, gauge, \"two\nlines\"\nDCGM_FI_DEV_SM_CLOCK, gauge, x\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.metrics[0].help, "two\nlines");
        let e = err_of("\n\nDCGM_FI_DEV_GPU_TEMP, gauge, \"a\"b\n");
        assert!(e.starts_with("test.csv:3: "), "{e}");
    }

    /// A file at the size limit made of one line of a million fields, or of a million
    /// escaped quotes, is read in one pass (it used to copy the rest of the line at
    /// every field: ~20 s of CPU at startup; docs/benchmarks/robustness.md "Fuzzing").
    #[test]
    fn a_megabyte_line_is_read_whole_and_counted() {
        let fields = 1 << 20;
        let e = err_of(&",".repeat(fields - 1));
        assert!(e.contains(&format!("found {fields}")), "{e}");
        let quotes = "\"\"".repeat(1 << 19);
        let (p, _) = plan(&format!("DCGM_FI_DEV_GPU_TEMP, gauge, \"{quotes}\""), "t").unwrap();
        assert_eq!(p.metrics[0].help, "\"".repeat(1 << 19));
    }

    /// A field named twice, by its name or an alias, is served once under the first
    /// row, as dcgm-exporter does; the later row is a warning naming both lines.
    #[test]
    fn a_field_named_twice_is_served_under_its_first_row() {
        let (p, w) = plan(
            "DCGM_FI_DEV_GPU_TEMP, gauge, x\nDCGM_FI_DEV_SM_CLOCK, gauge, c\nDCGM_FI_DEV_GPU_TEMP, counter, y\ndcgm_sm_clock, gauge, old\n",
            "test.csv",
        )
        .unwrap();
        let served: Vec<(&str, &str)> = p
            .metrics
            .iter()
            .map(|m| (m.name, m.help.as_str()))
            .collect();
        assert_eq!(
            served,
            [("DCGM_FI_DEV_GPU_TEMP", "x"), ("DCGM_FI_DEV_SM_CLOCK", "c")]
        );
        assert_eq!(w.len(), 2, "{w:?}");
        assert!(w[0].line == 3 && w[0].message.contains("line 1"), "{w:?}");
        assert!(w[1].line == 4 && w[1].message.contains("line 2"), "{w:?}");
    }

    /// dcgm-exporter's own `1.x-compatibility-metrics.csv` (a fixture, from its
    /// repository): every row is accepted, and each field is served under the row's
    /// own 1.x name, first row first (the oracle is the file, read here line by line).
    #[test]
    fn dcgm_exporters_1x_file_plans_every_row_under_its_own_name() {
        let text =
            include_str!("../../../tests/fixtures/dcgm-exporter/1.x-compatibility-metrics.csv");
        let mut expected: Vec<&str> = Vec::new();
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        {
            let name = line.split(',').next().unwrap_or_default().trim();
            if !expected.contains(&name) {
                expected.push(name);
            }
        }
        assert_eq!(expected.len(), 20, "{expected:?}");
        let (p, w) = plan(text, "1.x-compatibility-metrics.csv").expect("the 1.x file plans");
        assert_eq!(
            p.metrics.iter().map(|m| m.name).collect::<Vec<_>>(),
            expected
        );
        // The repeated dcgm_fi_prof_pcie_tx_bytes/rx_bytes rows, and the rates the file
        // declares counter: nothing refused.
        assert!(
            w.iter()
                .all(|w| w.notice || w.message.contains("only the first row")),
            "{w:?}"
        );
        let unknown = err_of("dcgm_sm_clocks, gauge, x\n");
        assert!(unknown.contains("dcgm_sm_clock"), "{unknown}");
    }

    #[test]
    fn known_fields_without_a_source_are_skipped_with_a_warning() {
        let (p, w) = plan(
            "DCGM_FI_DEV_GPU_TEMP, gauge, x\nDCGM_FI_DEV_NVSWITCH_VOLTAGE_MVOLT, gauge, volts\nDCGM_EXP_P2P_STATUS, counter, p2p\n",
            "t",
        )
        .unwrap();
        assert_eq!(p.metrics.len(), 1);
        assert_eq!(w.len(), 2);
        assert!(w[0].message.contains("DCGM_FI_DEV_NVSWITCH_VOLTAGE_MVOLT") && w[0].line == 2);
        assert!(w[1].message.contains("DCGM_EXP_P2P_STATUS"));
    }

    #[test]
    fn empty_plans_and_missing_files_are_errors() {
        assert!(matches!(
            plan("# nothing\n", "t").unwrap_err(),
            Error::CountersEmpty { .. }
        ));
        let e = load(Path::new("/nonexistent/counters.csv"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("/nonexistent/counters.csv"), "{e}");
    }

    #[test]
    fn string_fields_become_labels_and_numeric_labels_are_refused() {
        let (p, w) = plan(
            "DCGM_FI_DEV_GPU_TEMP, gauge, x\nDCGM_FI_DEV_SERIAL, gauge, s\nDCGM_FI_DEV_SM_CLOCK, label, c\nDCGM_FI_DRIVER_VERSION, label, d\n",
            "t",
        )
        .unwrap();
        assert_eq!(
            p.labels.iter().map(|l| l.0).collect::<Vec<_>>(),
            vec!["DCGM_FI_DEV_SERIAL", "DCGM_FI_DRIVER_VERSION"]
        );
        assert_eq!(w.len(), 2);
    }
}
