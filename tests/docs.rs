//! The documents a newcomer and an operator read (README.md, docs/*.md): the README stays short
//! enough to read in five minutes and keeps its two commands, and every file they point at
//! exists, so that a moved or renamed file breaks a test instead of a reader's trust. Links
//! are resolved from the document's own directory; a path named in the text (`src/main.rs`,
//! `tests/fixtures/samples/...`) from the repository's root.

use std::fs;
use std::path::{Path, PathBuf};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// The repository's top-level directories whose paths the documents name in their text.
const TOP: [&str; 11] = [
    "src",
    "crates",
    "tests",
    "packaging",
    "deb",
    "rpm",
    "bench",
    "xtask",
    "cloud-init",
    "deploy",
    "docs",
];

fn documents() -> Vec<PathBuf> {
    let mut docs = vec![Path::new(ROOT).join("README.md")];
    for e in fs::read_dir(Path::new(ROOT).join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            docs.push(p);
        }
    }
    docs.sort();
    docs
}

/// The targets of the Markdown links `[text](target)` that are files of the repository: not
/// a URL, not an anchor of the same page; the target's own anchor cut off.
fn link_targets(text: &str) -> Vec<&str> {
    text.match_indices("](")
        .filter_map(|(at, _)| {
            let rest = &text[at + 2..];
            let target = &rest[..rest.find(')')?];
            let target = target.split('#').next().unwrap_or_default();
            (!target.is_empty() && !target.contains("://")).then_some(target)
        })
        .collect()
}

/// Paths under [`TOP`] named in the text (`src/main.rs`, `deb/boot-test`), each starting
/// where no path character comes before it (so `/usr/share/doc/...` names none of them).
fn named_paths(text: &str) -> Vec<String> {
    let path_char = |c: char| c.is_ascii_alphanumeric() || "_./-".contains(c);
    let mut found = Vec::new();
    for top in TOP {
        let needle = format!("{top}/");
        for (at, _) in text.match_indices(&needle) {
            if text[..at].chars().next_back().is_some_and(path_char) {
                continue;
            }
            let len = text[at..]
                .find(|c| !path_char(c))
                .unwrap_or(text.len() - at);
            let path = text[at..at + len].trim_end_matches(['.', '/']);
            if path.len() > needle.len() {
                found.push(path.to_string());
            }
        }
    }
    found
}

/// What `text`, a document named `name` in `dir`, points at and the repository lacks.
fn missing(text: &str, dir: &Path, name: &str) -> Vec<String> {
    let links = link_targets(text)
        .into_iter()
        .filter(|t| !dir.join(t).exists())
        .map(|t| format!("{name}: link ({t})"));
    let paths = named_paths(text)
        .into_iter()
        .filter(|p| !Path::new(ROOT).join(p).exists())
        .map(|p| format!("{name}: {p}"));
    links.chain(paths).collect()
}

#[test]
fn every_file_the_readme_and_the_guides_point_at_exists() {
    let mut missing = Vec::new();
    for doc in documents() {
        let text = fs::read_to_string(&doc).unwrap();
        let name = doc.strip_prefix(ROOT).unwrap().display().to_string();
        missing.extend(self::missing(&text, doc.parent().unwrap(), &name));
    }
    assert!(
        missing.is_empty(),
        "not in the repository:\n{}",
        missing.join("\n")
    );
}

#[test]
fn the_readme_is_short_and_keeps_its_two_commands() {
    let readme = fs::read_to_string(Path::new(ROOT).join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines < 120,
        "README.md has {lines} lines: move details to docs/"
    );
    // The first code block: the agent on a bundled sample, then every test.
    let block = readme.split("```sh\n").nth(1).unwrap();
    let block = &block[..block.find("```").unwrap()];
    let commands: Vec<&str> = block.lines().collect();
    assert_eq!(commands.len(), 2, "{block}");
    assert!(commands[0].starts_with("cargo run -- analyze "), "{block}");
    assert_eq!(commands[1], "bash tests/all.sh");
    assert!(Path::new(ROOT).join("tests/all.sh").is_file());
    // The questions a newcomer asks first are answered near the top.
    let table = readme
        .find("## Where to look")
        .expect("a Where to look section");
    assert!(
        readme[..table].lines().count() < 70,
        "Where to look starts too low"
    );
    for q in [
        "When is gridd restarted?",
        "How does the Node condition behave over time?",
    ] {
        assert!(
            readme[table..].contains(q),
            "Where to look does not answer {q:?}"
        );
    }
}

#[test]
fn the_reading_finds_a_missing_link_and_a_missing_path() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("install.md"), "").unwrap();
    let text = "See [install](install.md), [gone](gone.md#x), [web](https://example.com),\n\
                [here](#top), `src/main.rs`, `src/no_such_file.rs`, /usr/share/doc/x,\n\
                and tests/fixtures/samples/.\n";
    assert_eq!(link_targets(text), ["install.md", "gone.md"]);
    assert_eq!(
        named_paths(text),
        [
            "src/main.rs",
            "src/no_such_file.rs",
            "tests/fixtures/samples"
        ]
    );
    assert_eq!(
        missing(text, dir.path(), "doc.md"),
        ["doc.md: link (gone.md)", "doc.md: src/no_such_file.rs"]
    );
}
