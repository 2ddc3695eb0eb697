//! Text from outside (a gridd line, a token's fields, a file name, a URL) on its way to a
//! terminal or the journal: control characters are escaped, so that no input can move the
//! cursor, clear the screen, forge a second log line or hide what follows. The JSON report
//! keeps the text as it was (JSON escapes it itself).

use std::borrow::Cow;
use std::fmt::Write;
use std::path::Path;

/// `s` with every control character (C0, DEL, C1 and the bidirectional overrides that
/// reorder what a terminal shows) written as `\n`, `\t`, `\r` or `\u{..}`, and backslashes
/// left as they are. Borrowed when there is nothing to escape.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(needs_escape) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if needs_escape(c) => {
                let _ = write!(out, "\\u{{{:x}}}", c as u32);
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

fn needs_escape(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// A whole rendering for a terminal: like [`escape`], but its own line breaks stay. The
/// renderers escape each outside value with [`escape`] (so a value cannot start a line of
/// its own); this is the net under every `print!` of human text.
pub fn for_terminal(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c != '\n' && needs_escape(c)) {
        return Cow::Borrowed(s);
    }
    Cow::Owned(s.split('\n').map(escape).collect::<Vec<_>>().join("\n"))
}

/// JSON text for a terminal: the characters [`escape`] escapes that JSON allows raw in its
/// strings (DEL, the C1 controls, the bidirectional overrides: serde_json escapes only the
/// C0 controls) written as JSON's own `\uXXXX`, so that the text stays the same JSON and
/// no string in it can steer the terminal.
pub fn json_for_terminal(json: &str) -> Cow<'_, str> {
    if !json.chars().any(|c| c != '\n' && needs_escape(c)) {
        return Cow::Borrowed(json);
    }
    let mut out = String::with_capacity(json.len() + 16);
    for c in json.chars() {
        if c != '\n' && needs_escape(c) {
            // All of them are in the Basic Multilingual Plane: one escape each.
            let _ = write!(out, "\\u{:04x}", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// A path as it may be shown: lossy UTF-8, control characters escaped.
pub fn show_path(p: &Path) -> String {
    escape(&p.to_string_lossy()).into_owned()
}

/// A few names (already escaped) joined for a message, and a count of the rest: a directory
/// of 100,000 strays is named in one short line.
pub fn few_and_count(names: &[String]) -> String {
    const SHOWN: usize = 5;
    let mut list = names
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if names.len() > SHOWN {
        list.push_str(&format!(" and {} more", names.len() - SHOWN));
    }
    list
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_plain_text_is_borrowed() {
        assert!(matches!(
            escape("Acquiring license (Info: x)"),
            Cow::Borrowed(_)
        ));
        assert_eq!(
            escape("a\nfake line\x1b[2J\r\u{7f}\u{9b}\u{202e}z"),
            "a\\nfake line\\u{1b}[2J\\r\\u{7f}\\u{9b}\\u{202e}z"
        );
        assert_eq!(show_path(Path::new("/tmp/x\ny.tok")), "/tmp/x\\ny.tok");
    }

    #[test]
    fn json_for_a_terminal_stays_the_same_json() {
        let value = serde_json::json!({"vm_name": "x\u{1b}]0;t\u{7}\u{9b}\u{7f}\u{202e}y\n"});
        let text = serde_json::to_string_pretty(&value).unwrap();
        let shown = json_for_terminal(&text);
        assert!(
            !shown.chars().any(|c| c != '\n' && needs_escape(c)),
            "{shown}"
        );
        let back: serde_json::Value = serde_json::from_str(&shown).unwrap();
        assert_eq!(back, value);
        assert!(matches!(
            json_for_terminal("{\n  \"a\": 1\n}"),
            Cow::Borrowed(_)
        ));
    }
}
