//! The user documentation holds together: every relative link and anchor resolves, every
//! flag the docs name for our binaries is one their `--help` lists, and every flag their
//! `--help` lists is documented. Read from the files themselves, so a renamed page, a
//! moved heading or a flag added without its docs fails here.
//!
//! Markdown is scanned, not parsed: links are `](target)` outside fenced blocks, anchors
//! are GitHub's heading slugs, and a flag counts as ours where a code span starts with it
//! (or with `gpu-exporter` / `gpu-metrics-adapter`), or in a fenced command line of ours.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use e2e_tests::{binary, workspace};

/// The Markdown files a user reads: the README, BENCHMARKS.md, and everything under
/// `docs/`, `deploy/` and `dashboards/`.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut dirs = vec![
        root.join("docs"),
        root.join("deploy"),
        root.join("dashboards"),
    ];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read a docs folder") {
            let path = entry.expect("folder entry").path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// The lines of `text` outside fenced code blocks, with their 1-based numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fenced = false;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push((i + 1, line));
        }
    }
    out
}

/// GitHub's anchor for a heading: lower case, punctuation but `-` and `_` dropped,
/// spaces turned into `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// Every anchor of a Markdown text, repeated headings numbered as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes + 1..]);
        let n = seen.entry(base.clone()).or_default();
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// The link targets of a line: what stands in `](…)`.
fn link_targets(line: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = line;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(&rest[..end]);
            rest = &rest[end..];
        }
    }
    out
}

/// The broken relative links of the document at `path`, as `file:line: why`.
fn broken_links(path: &Path, text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for (n, line) in prose_lines(text) {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            let resolved = if file.is_empty() {
                path.to_path_buf()
            } else {
                path.parent().expect("a document has a folder").join(file)
            };
            let here = format!("{}:{n}", path.display());
            if !resolved.exists() {
                out.push(format!("{here}: {target} does not exist"));
                continue;
            }
            if anchor.is_empty() {
                continue;
            }
            match std::fs::read_to_string(&resolved) {
                Ok(target_text) if resolved.extension().is_some_and(|e| e == "md") => {
                    if !anchors(&target_text).contains(anchor) {
                        out.push(format!("{here}: {target}: no heading has that anchor"));
                    }
                }
                _ => out.push(format!(
                    "{here}: {target}: an anchor into a non-Markdown file"
                )),
            }
        }
    }
    out
}

/// The `--flags` in `text`, with `--a-{b,c}-d` brace lists expanded.
fn flags_in(text: &str) -> Vec<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while let Some(at) = text[i..].find("--") {
        let start = i + at;
        i = start + 2;
        let before = start.checked_sub(1).map(|b| bytes[b]);
        if before.is_some_and(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            continue;
        }
        let len = text[i..]
            .bytes()
            .take_while(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-{},".contains(b))
            .count();
        let mut token = &text[start..i + len];
        // A trailing `-` or `,` is punctuation, not the flag's.
        token = token.trim_end_matches([',', '-']);
        i += len;
        if token.len() <= 2 || !token.as_bytes()[2].is_ascii_alphanumeric() {
            continue;
        }
        match (token.find('{'), token.find('}')) {
            (Some(open), Some(close)) if open < close => {
                for alternative in token[open + 1..close].split(',') {
                    out.push(format!(
                        "{}{alternative}{}",
                        &token[..open],
                        &token[close + 1..]
                    ));
                }
            }
            _ => out.push(token.trim_end_matches(['{', '}']).to_string()),
        }
    }
    out
}

/// The code spans of a line (text between single backticks).
fn code_spans(line: &str) -> Vec<&str> {
    line.split('`').skip(1).step_by(2).collect()
}

/// Whether a code span or command line is about our binaries: it starts with a flag or
/// with one of the binaries' names.
fn is_ours(text: &str) -> bool {
    let text = text.trim_start();
    text.starts_with('-')
        || text.starts_with("gpu-exporter")
        || text.starts_with("gpu-metrics-adapter")
}

/// The flags a document names for our binaries, each with where.
fn documented_flags(path: &Path, text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut fenced = false;
    let mut continued_ours = None;
    for (i, line) in text.lines().enumerate() {
        let here = format!("{}:{}", path.display(), i + 1);
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continued_ours = None;
            continue;
        }
        if fenced {
            // A command line of ours: `gpu-exporter …`, or `cargo run … -- …`, and the
            // lines it continues onto with a trailing backslash.
            let command = line.trim();
            let ours = continued_ours.unwrap_or_else(|| {
                is_ours(command) || (command.starts_with("cargo run") && command.contains(" -- "))
            });
            if ours {
                let args = command.split_once(" -- ").map_or(command, |(_, a)| a);
                out.extend(flags_in(args).into_iter().map(|f| (f, here.clone())));
            }
            continued_ours = command.ends_with('\\').then_some(ours);
            continue;
        }
        for span in code_spans(line) {
            if is_ours(span) {
                out.extend(flags_in(span).into_iter().map(|f| (f, here.clone())));
            }
        }
    }
    out
}

/// A binary's flags from its `--help`: the options it lists, and their visible aliases.
fn help_flags(binary_name: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let output = Command::new(binary(binary_name))
        .arg("--help")
        .output()
        .expect("run --help");
    assert!(output.status.success(), "{binary_name} --help failed");
    parse_help(&String::from_utf8_lossy(&output.stdout))
}

/// (the options listed, their aliases) of a clap `--help` text.
fn parse_help(help: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut options = BTreeSet::new();
    let mut aliases = BTreeSet::new();
    for line in help.lines() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if (2..=6).contains(&indent) && trimmed.starts_with('-') {
            let long = trimmed
                .split_whitespace()
                .find(|w| w.starts_with("--"))
                .map(|w| w.split(['[', '=', ',']).next().unwrap_or(w).to_string());
            options.extend(long);
        }
        for marker in ["[alias: ", "[aliases: "] {
            if let Some(i) = line.find(marker) {
                aliases.extend(flags_in(&line[i..]));
            }
        }
    }
    (options, aliases)
}

fn user_docs() -> Vec<(PathBuf, String)> {
    let root = workspace();
    documents(&root)
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).expect("read a document");
            (
                p.strip_prefix(&root).expect("under the root").to_path_buf(),
                text,
            )
        })
        .collect()
}

#[test]
fn every_relative_link_and_anchor_in_the_docs_resolves() {
    let root = workspace();
    let mut broken = Vec::new();
    for (path, text) in user_docs() {
        let absolute = root.join(&path);
        broken.extend(
            broken_links(&absolute, &text)
                .into_iter()
                .map(|b| b.replace(&format!("{}/", root.display()), "")),
        );
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_docs_name_exactly_the_flags_the_binaries_have() {
    let (exporter, exporter_aliases) = help_flags("gpu-exporter");
    let (adapter, adapter_aliases) = help_flags("gpu-metrics-adapter");
    assert!(
        exporter.contains("--collectors") && adapter.contains("--secure-port"),
        "help parsed"
    );
    let known: BTreeSet<&String> = exporter
        .iter()
        .chain(&exporter_aliases)
        .chain(&adapter)
        .chain(&adapter_aliases)
        .collect();

    let named: Vec<(String, String)> = user_docs()
        .iter()
        // The benchmark pages quote other tools' command lines (cargo-mutants, criterion,
        // wrk) whose flags are not ours; every other page is held to the binaries.
        .filter(|(p, _)| {
            (p.starts_with("docs") && !p.starts_with("docs/benchmarks"))
                || p == Path::new("README.md")
        })
        .flat_map(|(p, text)| documented_flags(p, text))
        .collect();
    let unknown: Vec<String> = named
        .iter()
        .filter(|(flag, _)| !known.contains(flag))
        .map(|(flag, at)| format!("{at}: {flag}"))
        .collect();
    assert!(
        unknown.is_empty(),
        "flags the docs name that no --help lists:\n{}",
        unknown.join("\n")
    );

    let documented: BTreeSet<&str> = named.iter().map(|(f, _)| f.as_str()).collect();
    let skip = ["--help", "--version"];
    for (name, options) in [
        ("gpu-exporter", &exporter),
        ("gpu-metrics-adapter", &adapter),
    ] {
        let missing: Vec<&String> = options
            .iter()
            .filter(|f| !skip.contains(&f.as_str()) && !documented.contains(f.as_str()))
            .collect();
        assert!(
            missing.is_empty(),
            "{name} --help flags missing from the docs: {missing:?}"
        );
    }
}

#[test]
fn the_checks_see_a_broken_link_an_unknown_flag_and_an_undocumented_one() {
    let dir = e2e_tests::scratch_dir("docs-check");
    std::fs::write(
        dir.join("other.md"),
        "# Other page\n\n## A heading, with `code`\n",
    )
    .unwrap();
    let page = dir.join("page.md");
    let text = "# Page\n\n[ok](other.md#a-heading-with-code) [self](#page)\n\
                [gone](missing.md) [bad anchor](other.md#nope)\n\
                ```sh\nhelm install --set a=b\ngpu-exporter --collect-interval 5 \\\n  --openmetrics\n```\n\
                Use `--web-config-file PATH`, `--authorization-webhook-cache-{authorized,unauthorized}-ttl`\n\
                or `kubectl get --raw /`.\n";
    std::fs::write(&page, text).unwrap();
    let broken = broken_links(&page, text);
    assert_eq!(broken.len(), 2, "{broken:?}");
    assert!(
        broken[0].contains("missing.md does not exist"),
        "{broken:?}"
    );
    assert!(
        broken[1].contains("other.md#nope: no heading"),
        "{broken:?}"
    );

    let flags: Vec<String> = documented_flags(&page, text)
        .into_iter()
        .map(|(f, _)| f)
        .collect();
    assert_eq!(
        flags,
        [
            "--collect-interval",
            "--openmetrics",
            "--web-config-file",
            "--authorization-webhook-cache-authorized-ttl",
            "--authorization-webhook-cache-unauthorized-ttl",
        ],
        "helm's and kubectl's flags are not ours"
    );

    let help = "Options:\n  -f, --collectors <PATH>\n          Counters [alias: --cols]\n      --openmetrics\n  -h, --help\n";
    let (options, aliases) = parse_help(help);
    assert_eq!(
        options.into_iter().collect::<Vec<_>>(),
        ["--collectors", "--help", "--openmetrics"]
    );
    assert_eq!(aliases.into_iter().collect::<Vec<_>>(), ["--cols"]);
}
