//! The model's modules in layers: each top-level module of `crates/model/src` imports
//! (`crate::X`) only modules below it in [`LAYERS`], so that no two of them import each
//! other, round and round. Read from the source files as a reviewer would: comments, string
//! literals and test code (a `#[cfg(test)]` item, inline or in a file of its own) do not
//! count. What a lower module needs from a higher one moves down (the higher one may
//! re-export it), or the module moves up in [`LAYERS`] where nothing below it needs it.

// This test reads the sources (the model itself reads nothing: see clippy.toml).
#![allow(clippy::disallowed_methods, clippy::disallowed_types)]

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules, from the bottom up: each imports only those before it.
const LAYERS: [&str; 20] = [
    "text",
    "time",
    "backoff",
    "token",
    "identity",
    "userdata",
    "config",
    "observe",
    "gridd_conf",
    "report",
    "shutdown",
    "policy",
    "observations",
    "host",
    "state",
    "assemble",
    "node",
    "restart",
    "install",
    "service",
];

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// `text` with its comments and the contents of its string and character literals blanked
/// (newlines kept, so that lines keep their numbers).
fn blank_comments_and_literals(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let blank = |out: &mut String, ch: char| out.push(if ch == '\n' { '\n' } else { ' ' });
    let mut i = 0;
    while i < c.len() {
        // Where a literal may start: not inside a word, but after a `b` prefix.
        let prev_ident =
            i > 0 && is_ident(c[i - 1]) && !(c[i - 1] == 'b' && (i < 2 || !is_ident(c[i - 2])));
        if c[i] == '/' && c.get(i + 1) == Some(&'/') {
            while i < c.len() && c[i] != '\n' {
                blank(&mut out, c[i]);
                i += 1;
            }
        } else if c[i] == '/' && c.get(i + 1) == Some(&'*') {
            let mut depth = 0;
            while i < c.len() {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    blank(&mut out, c[i]);
                    i += 1;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    blank(&mut out, c[i]);
                    i += 1;
                }
                blank(&mut out, c[i]);
                i += 1;
                if depth == 0 {
                    break;
                }
            }
        } else if c[i] == 'r'
            && !prev_ident
            && matches!(c.get(i + 1), Some('"' | '#'))
            && c[i + 1..].iter().find(|&&ch| ch != '#') == Some(&'"')
        {
            // A raw string: `r"..."`, `r#"..."#`.
            let hashes = c[i + 1..].iter().take_while(|&&ch| ch == '#').count();
            out.push('r');
            i += 1 + hashes + 1;
            out.push('"');
            while i < c.len() {
                if c[i] == '"'
                    && c[i + 1..]
                        .iter()
                        .take(hashes)
                        .filter(|&&h| h == '#')
                        .count()
                        == hashes
                {
                    i += 1 + hashes;
                    break;
                }
                blank(&mut out, c[i]);
                i += 1;
            }
            out.push('"');
        } else if c[i] == '"' {
            out.push('"');
            i += 1;
            while i < c.len() && c[i] != '"' {
                let step = if c[i] == '\\' { 2 } else { 1 };
                for _ in 0..step.min(c.len() - i) {
                    blank(&mut out, c[i]);
                    i += 1;
                }
            }
            out.push('"');
            i += 1;
        } else if c[i] == '\'' && !prev_ident {
            // A character literal (`'x'`, `'\n'`, `'\u{7f}'`), else a lifetime or a label.
            let end = if c.get(i + 1) == Some(&'\\') {
                c[i + 2..]
                    .iter()
                    .position(|&ch| ch == '\'')
                    .map(|n| i + 2 + n)
            } else {
                (c.get(i + 2) == Some(&'\'')).then_some(i + 2)
            };
            match end {
                Some(end) => {
                    out.push_str("' '");
                    i = end + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// A file's code without its comments, literals and `#[cfg(test)]` items, and the names of
/// the test modules kept in files of their own (`#[cfg(test)] mod tests;`).
fn non_test_code(text: &str) -> (String, Vec<String>) {
    let mut code = blank_comments_and_literals(text);
    let mut test_files = Vec::new();
    const ATTR: &str = "#[cfg(test)]";
    let mut from = 0;
    while let Some(n) = code[from..].find(ATTR) {
        let start = from + n;
        let b = code.as_bytes();
        let mut i = start + ATTR.len();
        // Other attributes of the same item, and the item's start.
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if b.get(i) != Some(&b'#') {
                break;
            }
            let mut depth = 0;
            while i < b.len() {
                match b[i] {
                    b'[' => depth += 1,
                    b']' => {
                        depth -= 1;
                        if depth == 0 {
                            i += 1;
                            break;
                        }
                    }
                    _ => {}
                }
                i += 1;
            }
        }
        let item = &code[i..];
        let decl = item.strip_prefix("pub ").unwrap_or(item);
        if let Some(rest) = decl.strip_prefix("mod ")
            && let Some(semi) = rest.find(';')
            && rest[..semi].trim().chars().all(is_ident)
        {
            test_files.push(rest[..semi].trim().to_string());
        }
        // The item's end: its `;`, or the `}` that closes its first `{`.
        let mut depth = 0;
        let mut end = b.len();
        while i < b.len() {
            match b[i] {
                b';' if depth == 0 => {
                    end = i + 1;
                    break;
                }
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = i + 1;
                        break;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        let blanked: String = code[start..end]
            .chars()
            .map(|ch| if ch == '\n' { '\n' } else { ' ' })
            .collect();
        code.replace_range(start..end, &blanked);
        from = end;
    }
    (code, test_files)
}

/// The top-level modules `code` imports (`crate::X`, `crate::{X, Y::Z}`), each with its line
/// (from 1) and the path as written.
fn imports(code: &str) -> Vec<(String, usize, String)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(n) = code[from..].find("crate::") {
        let at = from + n;
        from = at + "crate::".len();
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let line = code[..at].matches('\n').count() + 1;
        let rest = &code[from..];
        let firsts: Vec<&str> = if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            let mut parts = Vec::new();
            for (i, ch) in group.char_indices() {
                match ch {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        parts.push(&group[start..i]);
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        parts.push(&group[start..i]);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            parts
        } else {
            vec![rest]
        };
        let written = path_as_written(&code[at..]);
        for part in firsts {
            let part = part.trim_start();
            let end = part.find(|ch| !is_ident(ch)).unwrap_or(part.len());
            let first = &part[..end];
            if !first.is_empty() && first != "self" {
                out.push((first.to_string(), line, written.clone()));
            }
        }
    }
    out
}

/// The path at the start of `code`, its `{...}` groups whole, on one line.
fn path_as_written(code: &str) -> String {
    let mut depth = 0;
    let mut written = String::new();
    for ch in code.chars() {
        match ch {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            c if is_ident(c) || c == ':' => {}
            c if depth > 0 && (c.is_whitespace() || c == ',') => {}
            _ => break,
        }
        written.push(ch);
        if ch == '}' && depth == 0 {
            break;
        }
    }
    written.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every `.rs` file under `dir`.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The top-level modules `lib.rs` declares.
fn declared() -> BTreeSet<String> {
    let (code, _) = non_test_code(&fs::read_to_string(src().join("lib.rs")).unwrap());
    code.lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ")?.strip_suffix(';'))
        .map(str::to_string)
        .collect()
}

#[test]
fn every_module_has_its_layer() {
    let layers: BTreeSet<String> = LAYERS.iter().map(|m| m.to_string()).collect();
    assert_eq!(
        declared(),
        layers,
        "lib.rs's modules and LAYERS differ: a new module takes its place in LAYERS"
    );
}

#[test]
fn each_module_imports_only_the_layers_below_it() {
    let src = src();
    let modules = declared();
    let layer = |m: &str| LAYERS.iter().position(|l| *l == m);
    let files = rust_files(&src);
    let mut code_of = Vec::new();
    let mut test_only = BTreeSet::new();
    for path in &files {
        let (code, tests) = non_test_code(&fs::read_to_string(path).unwrap());
        // `a.rs` and `a/mod.rs` both keep theirs in `a/`.
        let dir = match path.file_stem().unwrap().to_str().unwrap() {
            "mod" | "lib" => path.parent().unwrap().to_path_buf(),
            stem => path.with_file_name(stem),
        };
        for t in tests {
            test_only.insert(dir.join(format!("{t}.rs")));
        }
        code_of.push((path, code));
    }
    let mut wrong = Vec::new();
    let mut edges = 0;
    for (path, code) in code_of {
        let rel = path.strip_prefix(&src).unwrap();
        let top = rel.iter().next().unwrap().to_str().unwrap();
        let from = top.strip_suffix(".rs").unwrap_or(top);
        if from == "lib" || test_only.contains(path) {
            continue;
        }
        let Some(at) = layer(from) else {
            wrong.push(format!("{}: module {from} is not in LAYERS", rel.display()));
            continue;
        };
        for (to, line, written) in imports(&code) {
            if to == from || !modules.contains(&to) {
                continue;
            }
            edges += 1;
            if layer(&to).is_none_or(|l| l >= at) {
                wrong.push(format!(
                    "crates/model/src/{}:{line}: `{written}`: {from} imports {to}, which is not below it in LAYERS",
                    rel.display()
                ));
            }
        }
    }
    assert!(edges > 50, "the reading found only {edges} imports");
    assert!(
        wrong.is_empty(),
        "imports against the layers (move what the lower module needs down to it, or below \
         it):\n{}",
        wrong.join("\n")
    );
}

/// The reading itself, on made-up code: comments, literals and test code do not count, a
/// group is spread out.
#[test]
fn the_reading_skips_comments_literals_and_tests_and_spreads_groups() {
    let text = r##"
//! [`crate::doc`] in a doc comment
use crate::{text, time::{rfc3339, Now}};
use crate::observe::{smi, journal::scan};
/* crate::block /* nested */ crate::block2 */
const S: &str = "crate::string";
const R: &str = r#"crate::raw "quoted" "#;
const C: char = '{';
const B: u8 = b'{';
fn f<'a>(x: &'a str) -> &'a str { crate::report::escape(x) }
#[cfg(test)]
mod tests {
    use crate::service;
    fn g() { let _ = '}'; }
}
#[cfg(test)]
mod more;
fn h() { crate::policy::x() }
"##;
    let (code, tests) = non_test_code(text);
    let found: Vec<(String, usize)> = imports(&code)
        .into_iter()
        .map(|(m, line, _)| (m, line))
        .collect();
    let want = [
        ("text", 3),
        ("time", 3),
        ("observe", 4),
        ("report", 10),
        ("policy", 18),
    ];
    assert_eq!(found, want.map(|(m, l)| (m.to_string(), l)));
    assert_eq!(tests, ["more"]);
    assert_eq!(imports(&code)[0].2, "crate::{text, time::{rfc3339, Now}}");
    assert_eq!(imports(&code)[3].2, "crate::report::escape");
}
