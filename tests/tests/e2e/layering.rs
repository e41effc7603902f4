//! The products' data flows one way (exporter: source → sampler → snapshot → encode →
//! http; adapter: source → fleet → query → faces), with no import circles between
//! their modules. Read from the sources themselves, so a `use` that turns the flow
//! around fails here instead of waiting for a reviewer.
//!
//! A module is a file (`a/b.rs` or `a/b/mod.rs` is `a::b`); an import is a `crate::…`
//! or `super::…` path outside `#[cfg(test)] mod tests`. The crate root (`lib.rs`) is the
//! composition of the parts and is left out.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

type Module = Vec<String>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// Every module of the crate at `src`, with its source minus its unit tests.
fn modules(src: &Path) -> BTreeMap<Module, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).expect("read the source folder") {
            let path = entry.expect("folder entry").path();
            if path.is_dir() {
                // A `tests/` folder holds its parent's unit tests (`#[cfg(test)] mod
                // tests;`), which may import anything, as inline unit tests may.
                if path.file_name().is_some_and(|n| n == "tests") {
                    let parent = std::fs::read_to_string(dir.join("mod.rs"))
                        .or_else(|_| std::fs::read_to_string(dir.with_extension("rs")))
                        .unwrap_or_default();
                    assert!(
                        parent.contains("#[cfg(test)]\nmod tests;"),
                        "{} is not declared as unit tests",
                        path.display()
                    );
                    continue;
                }
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let relative = path.strip_prefix(src).expect("under src");
            let mut module: Module = relative
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if module
                .last()
                .is_some_and(|m| m == "mod" || m == "lib" || m == "main")
            {
                module.pop();
            }
            let text = std::fs::read_to_string(&path).expect("read a source file");
            out.insert(module, without_unit_tests(&text).to_string());
        }
    }
    out
}

/// `text` up to its unit tests (`#[cfg(test)] mod tests { … }`, last in a file here).
fn without_unit_tests(text: &str) -> &str {
    match text.find("#[cfg(test)]\nmod tests {") {
        Some(i) => &text[..i],
        None => text,
    }
}

/// The module paths `code` names through `crate::` or `super::`, relative to the root.
fn referenced_paths(module: &Module, code: &str) -> Vec<Module> {
    let mut out = Vec::new();
    let mut parent = module.clone();
    parent.pop();
    for (anchor, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut rest = code;
        while let Some(i) = rest.find(anchor) {
            let before = rest[..i].chars().next_back();
            rest = &rest[i + anchor.len()..];
            if before.is_some_and(is_ident) {
                continue; // `foo_crate::`, not ours
            }
            use_tree(&base, rest, 0, &mut out);
        }
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn skip_space(text: &str, at: usize) -> usize {
    at + (text[at..].len() - text[at..].trim_start().len())
}

/// The paths of the use tree at byte `at` of `text` (`a::b::{C, d::{E, F as G}}`),
/// each after `prefix`, into `out`; returns where the tree ends.
fn use_tree(prefix: &Module, text: &str, at: usize, out: &mut Vec<Module>) -> usize {
    let mut path = prefix.clone();
    let mut at = skip_space(text, at);
    loop {
        if text[at..].starts_with('{') {
            at += 1;
            loop {
                at = skip_space(text, at);
                if text[at..].starts_with('}') {
                    return at + 1;
                }
                at = skip_space(text, use_tree(&path, text, at, out));
                if let Some(rest) = text[at..].strip_prefix("as ") {
                    let alias = rest.trim_start();
                    at = text.len() - alias.len()
                        + alias.chars().take_while(|c| is_ident(*c)).count();
                    at = skip_space(text, at);
                }
                if text[at..].starts_with(',') {
                    at += 1;
                } else if text[at..].starts_with('}') {
                    return at + 1;
                } else {
                    return at;
                }
            }
        }
        let ident_len = text[at..].chars().take_while(|c| is_ident(*c)).count();
        if ident_len == 0 {
            out.push(path);
            return at;
        }
        path.push(text[at..at + ident_len].to_string());
        at += ident_len;
        if text[at..].starts_with("::") {
            at += 2;
        } else {
            out.push(path);
            return at;
        }
    }
}

/// Module → the other modules it imports from (root excluded).
fn graph(modules: &BTreeMap<Module, String>) -> BTreeMap<Module, BTreeSet<Module>> {
    let mut edges = BTreeMap::new();
    for (module, code) in modules {
        if module.is_empty() {
            continue;
        }
        let targets: BTreeSet<Module> = referenced_paths(module, code)
            .into_iter()
            .filter_map(|path| {
                // The longest prefix that is a module: `crate::a::b::Item` is `a::b` when
                // that file exists, else `a`.
                (1..=path.len())
                    .rev()
                    .map(|n| path[..n].to_vec())
                    .find(|p| modules.contains_key(p))
            })
            .filter(|target| target != module)
            .collect();
        edges.insert(module.clone(), targets);
    }
    edges
}

/// Every import circle, each as the modules around it.
fn circles(edges: &BTreeMap<Module, BTreeSet<Module>>) -> Vec<Vec<Module>> {
    fn visit(
        node: &Module,
        edges: &BTreeMap<Module, BTreeSet<Module>>,
        stack: &mut Vec<Module>,
        done: &mut BTreeSet<Module>,
        found: &mut Vec<Vec<Module>>,
    ) {
        if let Some(i) = stack.iter().position(|n| n == node) {
            found.push(stack[i..].to_vec());
            return;
        }
        if done.contains(node) {
            return;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            visit(next, edges, stack, done, found);
        }
        stack.pop();
        done.insert(node.clone());
    }
    let (mut done, mut found) = (BTreeSet::new(), Vec::new());
    for node in edges.keys() {
        visit(node, edges, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

fn name(m: &Module) -> String {
    m.join("::")
}

/// Imports from a module at or under `from` to one at or under `to`.
fn imports(edges: &BTreeMap<Module, BTreeSet<Module>>, from: &str, to: &str) -> Vec<String> {
    let under = |m: &Module, prefix: &str| {
        let n = name(m);
        n == prefix || n.starts_with(&format!("{prefix}::"))
    };
    edges
        .iter()
        .filter(|(m, _)| under(m, from))
        .flat_map(|(m, targets)| {
            targets
                .iter()
                .filter(|t| under(t, to))
                .map(move |t| format!("{} → {}", name(m), name(t)))
        })
        .collect()
}

/// Checks `crate_dir`'s modules: no circle, and none of `never` (a module, and the
/// modules downstream of it that it must not import from).
fn check(crate_dir: &str, never: &[(&str, &[&str])]) -> BTreeMap<Module, BTreeSet<Module>> {
    let modules = modules(&workspace().join(crate_dir).join("src"));
    let edges = graph(&modules);
    let found = circles(&edges);
    assert!(
        found.is_empty(),
        "{crate_dir}: import circles: {:?}",
        found
            .iter()
            .map(|c| c.iter().map(name).collect::<Vec<_>>().join(" → "))
            .collect::<Vec<_>>()
    );
    for (from, downstream) in never {
        for to in *downstream {
            let wrong = imports(&edges, from, to);
            assert!(
                wrong.is_empty(),
                "{crate_dir}: {to} is downstream of {from}, which imports it: {wrong:?}"
            );
        }
    }
    edges
}

#[test]
fn the_exporter_flows_one_way_without_circles() {
    // The sampler reads sources and writes snapshots; encoders read snapshots; serving
    // answers with what encoders write. The plan (catalog, counters CSV) is read by all
    // of them and reads none. Nothing reaches back.
    let edges = check(
        "exporter",
        &[
            (
                "plan",
                &["source", "sampler", "snapshot", "encode", "serving"],
            ),
            ("source", &["sampler", "snapshot", "encode", "serving"]),
            ("sampler", &["encode", "serving"]),
            ("snapshot", &["sampler", "encode", "serving"]),
            ("encode", &["sampler", "serving"]),
        ],
    );
    // The reader itself must see the real imports, or the checks above prove nothing.
    assert!(!imports(&edges, "encode", "snapshot").is_empty());
    assert!(!imports(&edges, "sampler", "source").is_empty());
    assert!(!imports(&edges, "serving", "encode").is_empty());
    assert!(!imports(&edges, "sampler", "plan").is_empty());
}

#[test]
fn the_adapter_flows_one_way_without_circles() {
    // Sources write the fleet snapshot, queries read it, faces answer from queries.
    let edges = check(
        "metrics-adapter",
        &[
            ("source", &["query", "faces"]),
            ("fleet", &["source", "query", "faces"]),
            ("query", &["faces"]),
        ],
    );
    assert!(!imports(&edges, "faces::keda", "query").is_empty());
    assert!(!imports(&edges, "source::scrape", "fleet").is_empty());
}

#[test]
fn a_circle_and_an_upstream_import_are_found() {
    let mut modules = BTreeMap::new();
    let m = |s: &str| s.split("::").map(str::to_string).collect::<Module>();
    modules.insert(m("a"), "use crate::b::{X, c::Y};".to_string());
    modules.insert(m("b"), "fn f() { super::a::g() }".to_string());
    modules.insert(m("b::c"), "use super::Z;".to_string());
    modules.insert(
        m("d"),
        without_unit_tests("use my_crate::a;\n#[cfg(test)]\nmod tests { use crate::a; }")
            .to_string(),
    );
    // A unit-test module in a file of its own (`mod tests;`) hides nothing after it.
    modules.insert(
        m("e"),
        without_unit_tests("#[cfg(test)]\nmod tests;\nuse crate::a;").to_string(),
    );
    let edges = graph(&modules);
    assert_eq!(edges[&m("e")], BTreeSet::from([m("a")]));
    assert_eq!(edges[&m("a")], BTreeSet::from([m("b"), m("b::c")]));
    assert_eq!(edges[&m("b::c")], BTreeSet::from([m("b")]));
    assert!(edges[&m("d")].is_empty(), "{:?}", edges[&m("d")]);
    let found = circles(&edges);
    assert!(
        found
            .iter()
            .any(|c| c.contains(&m("a")) && c.contains(&m("b"))),
        "{found:?}"
    );
    assert_eq!(imports(&edges, "b", "a"), vec!["b → a".to_string()]);
}

/// The error types of `Result<…>`s in `code` that are a bare `String` (or a tuple with
/// one), wherever the `Result` is written: a return type, a field, a generic argument.
fn string_errors(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find("Result<") {
        let before = rest[..i].chars().next_back();
        rest = &rest[i + "Result<".len()..];
        if before.is_some_and(is_ident) {
            continue; // `FooResult<`, another type
        }
        // The top-level arguments, up to the matching `>`.
        let (mut depth, mut args, mut start) = (0usize, Vec::new(), 0);
        for (at, c) in rest.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' if depth > 0 => depth -= 1,
                '>' => {
                    // A trailing comma leaves nothing after it.
                    if !rest[start..at].trim().is_empty() {
                        args.push(&rest[start..at]);
                    }
                    break;
                }
                ',' if depth == 0 => {
                    args.push(&rest[start..at]);
                    start = at + 1;
                }
                _ => {}
            }
        }
        if let [.., _, error] = args.as_slice() {
            let error: String = error.chars().filter(|c| !c.is_whitespace()).collect();
            let in_tuple = error.starts_with('(')
                && error
                    .trim_matches(|c| c == '(' || c == ')')
                    .split(',')
                    .any(|part| part == "String");
            if error == "String" || error == "std::string::String" || in_tuple {
                found.push(
                    args.join(",")
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" "),
                );
            }
        }
    }
    found
}

#[test]
fn shipped_code_has_typed_errors_not_strings() {
    // A `Result<_, String>` cannot be matched on: callers end up testing the message's
    // words (`e.starts_with("no metric")`) to decide a status code. Every error in the
    // products and the crates they ship with is a type.
    let mut offenders = Vec::new();
    for krate in [
        "exporter",
        "metrics-adapter",
        "kube-support",
        "tls-serving",
        "config-file",
    ] {
        for (module, code) in modules(&workspace().join(krate).join("src")) {
            for error in string_errors(&code) {
                offenders.push(format!("{krate}: {}: Result<{error}>", name(&module)));
            }
        }
    }
    assert!(offenders.is_empty(), "untyped errors: {offenders:#?}");
}

#[test]
fn string_errors_are_found_wherever_the_result_is_written() {
    let found = string_errors(
        "fn a() -> Result<u8, String> {}\n\
         fn b() -> Result<Vec<(u8, u8)>, (usize, String)> {}\n\
         struct C { d: ArcSwap<Result<Option<X>, String>> }\n\
         fn e() -> Result<HashMap<String, u8>, Error> {}\n\
         fn f() -> io::Result<String> {}\n\
         fn g() -> MyResult<u8, String> {}\n\
         fn h() -> Result<\n    u8,\n    String,\n> {}\n",
    );
    assert_eq!(
        found,
        [
            "u8, String",
            "Vec<(u8, u8)>, (usize, String)",
            "Option<X>, String",
            "u8, String",
        ],
        "{found:?}"
    );
}
