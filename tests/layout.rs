//! The shape of the code. What decides is the model crate (`crates/model`), kept pure by
//! the compiler: its dependencies, checked here, include nothing that acts (no runtime,
//! sockets or system calls), and its clippy.toml refuses std's files, processes and clocks.
//! Within the agent (`src/`), read from the source files as a reviewer would, the modules'
//! `crate::` imports form no cycle. A module is a file (or a `mod.rs`), and the files under
//! each folder of [`GROUPED`] are each their own module. Test code (a `#[cfg(test)] mod`,
//! inline or in its own file) and comments do not count.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Directories whose files are each a module of their own here.
const GROUPED: [&str; 10] = [
    "observe", "service", "install", "probe", "cli", "files", "token", "image", "node", "kube",
];

/// Whether `module` is `name` or inside it (`observe/smi` is inside `observe`).
fn within(module: &str, name: &str) -> bool {
    module == name
        || module
            .strip_prefix(name)
            .is_some_and(|r| r.starts_with('/'))
}

/// The module a file is (`src/observe/pci.rs`: `observe/pci`, `src/live.rs`: `live`).
fn key(parts: &[&str]) -> String {
    match parts {
        [first, second, ..] if GROUPED.contains(first) => format!("{first}/{second}"),
        [first, ..] => first.to_string(),
        [] => String::new(),
    }
}

fn is_ident(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

fn ident_at(s: &str, at: usize) -> &str {
    let end = s[at..]
        .bytes()
        .position(|b| !is_ident(b))
        .map_or(s.len(), |n| at + n);
    &s[at..end]
}

/// The first two segments of every `crate::` path in `code`, a `{...}` group spread out:
/// `crate::observe::{smi, pci::read}` gives `(observe, smi)` and `(observe, pci)`.
fn crate_paths(code: &str) -> Vec<(String, Option<String>)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(n) = code[from..].find("crate::") {
        let at = from + n;
        from = at + "crate::".len();
        if at > 0 && is_ident(bytes[at - 1]) {
            continue;
        }
        let first = ident_at(code, from);
        if first.is_empty() {
            continue;
        }
        let rest = &code[from + first.len()..];
        let Some(rest) = rest.strip_prefix("::") else {
            out.push((first.to_string(), None));
            continue;
        };
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            let mut seconds = Vec::new();
            for (i, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        seconds.push(&group[start..i]);
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        seconds.push(&group[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            for s in seconds {
                let s = s.trim_start();
                let second = ident_at(s, 0);
                out.push((
                    first.to_string(),
                    (!second.is_empty() && second != "self").then(|| second.to_string()),
                ));
            }
        } else {
            let second = ident_at(rest, 0);
            out.push((
                first.to_string(),
                (!second.is_empty()).then(|| second.to_string()),
            ));
        }
    }
    out
}

/// A file's code without its comment lines and without its test module (the file's last
/// item), and the names of test modules kept in files of their own (`#[cfg(test)] mod tests;`).
fn non_test_code(text: &str) -> (String, Vec<String>) {
    let mut code = String::new();
    let mut test_files = Vec::new();
    let mut lines = text.lines().peekable();
    while let Some(line) = lines.next() {
        let t = line.trim();
        if t.starts_with("//") {
            continue;
        }
        if t == "#[cfg(test)]" {
            let next = lines.peek().map(|l| l.trim()).unwrap_or_default();
            let item = next.strip_prefix("pub ").unwrap_or(next);
            if let Some(m) = item.strip_prefix("mod ") {
                if let Some(name) = m.strip_suffix(';') {
                    test_files.push(name.trim().to_string());
                    lines.next();
                    continue;
                }
                break;
            }
        }
        code.push_str(line);
        code.push('\n');
    }
    (code, test_files)
}

/// Every module of `src/` and the modules it imports.
fn graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files: Vec<(Vec<String>, String)> = Vec::new();
    let mut test_only: BTreeSet<Vec<String>> = BTreeSet::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap().with_extension("");
            let mut parts: Vec<String> = rel
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            let is_mod_rs = parts.last().is_some_and(|p| p == "mod");
            if is_mod_rs {
                parts.pop();
            }
            if parts == ["lib"] || parts == ["main"] {
                continue;
            }
            let (code, tests) = non_test_code(&fs::read_to_string(&path).unwrap());
            for t in tests {
                // `src/a.rs` and `src/a/mod.rs` both keep theirs in `src/a/`.
                let mut child = parts.clone();
                child.push(t);
                test_only.insert(child);
            }
            files.push((parts, code));
        }
    }
    files.retain(|(parts, _)| !test_only.contains(parts));
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(p, _)| key(&p.iter().map(String::as_str).collect::<Vec<_>>()))
        .collect();
    let mut edges: BTreeMap<String, BTreeSet<String>> = modules
        .iter()
        .map(|m| (m.clone(), BTreeSet::new()))
        .collect();
    for (parts, code) in &files {
        let from = key(&parts.iter().map(String::as_str).collect::<Vec<_>>());
        for (first, second) in crate_paths(code) {
            let to = match second {
                Some(s) if modules.contains(&format!("{first}/{s}")) => format!("{first}/{s}"),
                _ => first,
            };
            // A submodule naming its parent's items is part of the parent.
            if to != from && !within(&from, &to) {
                edges.get_mut(&from).unwrap().insert(to);
            }
        }
    }
    edges
}

/// The groups of modules that import each other, round and round (Tarjan's algorithm).
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    struct Walk<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        found: Vec<Vec<String>>,
    }
    fn visit<'a>(w: &mut Walk<'a>, v: &'a str) {
        let i = w.index.len();
        w.index.insert(v, i);
        w.low.insert(v, i);
        w.stack.push(v);
        let edges = w.edges;
        for to in edges.get(v).into_iter().flatten() {
            let to = to.as_str();
            if !w.index.contains_key(to) {
                visit(w, to);
                let l = w.low[v].min(w.low[to]);
                w.low.insert(v, l);
            } else if w.stack.contains(&to) {
                let l = w.low[v].min(w.index[to]);
                w.low.insert(v, l);
            }
        }
        if w.low[v] == w.index[v] {
            let mut group = Vec::new();
            while let Some(m) = w.stack.pop() {
                group.push(m.to_string());
                if m == v {
                    break;
                }
            }
            if group.len() > 1 {
                group.sort();
                w.found.push(group);
            }
        }
    }
    let mut w = Walk {
        edges,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        found: Vec::new(),
    };
    for v in edges.keys() {
        if !w.index.contains_key(v.as_str()) {
            visit(&mut w, v);
        }
    }
    w.found
}

fn src_graph() -> BTreeMap<String, BTreeSet<String>> {
    graph(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"))
}

#[test]
fn the_modules_import_each_other_in_no_cycle() {
    let edges = src_graph();
    let found = cycles(&edges);
    assert!(
        found.is_empty(),
        "modules of src/ that import each other in a cycle: {found:?}; move what both need into a module of its own that neither imports back"
    );
}

/// The agent's top level, its table of contents: each folder (or file) of `src/`, from the
/// bottom up. A module imports only the ones below it; a new one takes its place here.
const LAYERS: [&str; 14] = [
    "files", "config", "http", "identity", "token", "gridd", "node", "probe", "observe", "kube",
    "install", "image", "service", "cli",
];

/// The folder (top-level module) of a module: `observe/smi` is in `observe`.
fn folder(module: &str) -> &str {
    module.split('/').next().unwrap_or(module)
}

/// The imports from one folder into another that is not below it in [`LAYERS`].
fn upward_imports(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    let rank = |m: &str| LAYERS.iter().position(|l| *l == folder(m));
    let mut up = Vec::new();
    for (from, tos) in edges {
        for to in tos {
            if folder(from) == folder(to) || to == "model" {
                continue;
            }
            match (rank(from), rank(to)) {
                (Some(f), Some(t)) if t < f => {}
                (None, _) => up.push(format!("{from} is in no layer")),
                _ => up.push(format!("{from} imports {to}")),
            }
        }
    }
    up
}

#[test]
fn the_folders_import_only_the_layers_below() {
    let up = upward_imports(&src_graph());
    assert!(
        up.is_empty(),
        "imports that run up or across the layers of src/ ({LAYERS:?}, bottom first): {up:?}; move what both need down, or pass it in as a value"
    );
}

#[test]
fn the_top_level_is_a_table_of_contents() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(root.join("lib.rs")).unwrap();
    let modules: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';'))
        .collect();
    assert!(
        modules.len() <= 15,
        "src/lib.rs has {} modules: {modules:?}",
        modules.len()
    );
    let mut sorted = modules.clone();
    sorted.sort_unstable();
    let mut layers = LAYERS.to_vec();
    layers.sort_unstable();
    assert_eq!(sorted, layers, "src/lib.rs's modules and LAYERS differ");
    // No wildcard re-exports: each name has one path.
    let mut dirs = vec![root];
    while let Some(dir) = dirs.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let (code, _) = non_test_code(&fs::read_to_string(&path).unwrap());
                let glob = code.lines().find(|l| {
                    let l = l.trim_start();
                    (l.starts_with("pub use ") || l.starts_with("pub(crate) use "))
                        && l.ends_with("::*;")
                });
                assert!(
                    glob.is_none(),
                    "{}: a wildcard re-export: {glob:?}",
                    path.display()
                );
            }
        }
    }
}

/// The layering check itself, on made-up edges: one going up is named, one going down is not.
#[test]
fn an_import_up_the_layers_is_named() {
    let edges = BTreeMap::from([
        (
            "install/source".to_string(),
            BTreeSet::from(["cli".to_string(), "files/input".to_string()]),
        ),
        (
            "cli".to_string(),
            BTreeSet::from(["install/source".to_string()]),
        ),
        ("nowhere".to_string(), BTreeSet::from(["files".to_string()])),
    ]);
    assert_eq!(
        upward_imports(&edges),
        vec![
            "install/source imports cli".to_string(),
            "nowhere is in no layer".to_string()
        ]
    );
}

#[test]
fn the_state_directory_layout_is_a_leaf() {
    let edges = src_graph();
    let layout = &edges["files/layout"];
    let allowed =
        BTreeSet::from(["config", "files/dir", "files/fsutil", "model"].map(String::from));
    assert!(
        layout.is_subset(&allowed),
        "layout imports {layout:?}; it may import only {allowed:?}"
    );
    for m in ["install", "identity", "image"] {
        assert!(edges[m].contains("files/layout"), "{m} does not use layout");
    }
}

/// The reading itself: a cycle, a `use` group, comments and test code, on a made-up tree.
#[test]
fn the_reading_finds_a_cycle_through_groups_comments_and_tests() {
    let d = tempfile::tempdir().unwrap();
    let src = d.path();
    fs::create_dir(src.join("observe")).unwrap();
    fs::create_dir(src.join("install")).unwrap();
    fs::create_dir(src.join("service")).unwrap();
    let write = |p: &str, s: &str| fs::write(src.join(p), s).unwrap();
    write("lib.rs", "pub mod service;\n");
    write("service/mod.rs", "pub mod core;\n");
    write(
        "service/core.rs",
        "use crate::observe::{smi, pci::read};\n// crate::live in a comment\n",
    );
    write("observe/mod.rs", "pub mod smi;\npub mod pci;\n");
    write("observe/smi.rs", "use crate::time;\n");
    write("observe/pci.rs", "");
    write("time.rs", "");
    write(
        "live.rs",
        "use crate::install::Thing;\n#[cfg(test)]\nmod tests {\n    use crate::state;\n}\n",
    );
    write(
        "install/mod.rs",
        "fn f() { crate::live::g() }\n#[cfg(test)]\nmod tests;\n",
    );
    write("install/tests.rs", "use crate::state;\n");
    let edges = graph(src);
    assert_eq!(
        edges["service/core"],
        BTreeSet::from(["observe/smi".to_string(), "observe/pci".to_string()])
    );
    assert!(edges["live"].contains("install") && !edges["live"].contains("state"));
    assert!(!edges.contains_key("install/tests"));
    assert_eq!(
        cycles(&edges),
        vec![vec!["install".to_string(), "live".to_string()]]
    );
}

/// The model's dependencies: none of them can read, write, run or dial.
#[test]
fn the_model_crate_depends_on_nothing_that_acts() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("crates/model/Cargo.toml");
    let manifest: toml::Table = fs::read_to_string(&manifest).unwrap().parse().unwrap();
    let deps = manifest["dependencies"].as_table().unwrap();
    assert!(
        deps.contains_key("chrono"),
        "the model's [dependencies] were read"
    );
    for acting in [
        "tokio",
        "nix",
        "reqwest",
        "hyper",
        "hyper-util",
        "rustls",
        "socket2",
        "libc",
        "sd-notify",
        "tracing-journald",
        "ring",
    ] {
        assert!(
            !deps.contains_key(acting),
            "crates/model depends on {acting}: what acts belongs to the agent; pass the model values"
        );
    }
}
