//! The config file's man page, vgpu-license-agent.toml(5), made from the packaged default
//! config (`packaging/config.toml`): each key's text is the comment above it there and its
//! default the commented-out value, so that the page and the file cannot tell different
//! stories. `xtask/src/gen_docs.rs` writes it beside the command pages.

/// One key (or a few that share a comment) of a section.
struct Item {
    /// `key = default` as the file shows it, or `key` alone for a key unset by default.
    keys: Vec<String>,
    text: Vec<String>,
    example: Option<String>,
}

struct Section {
    name: String,
    items: Vec<Item>,
}

/// The sections of the default config and their keys, from its comments.
fn parse(config: &str) -> Vec<Section> {
    let mut sections: Vec<Section> = Vec::new();
    let mut pending: Vec<String> = Vec::new();
    for line in config.lines() {
        let line = line.trim_end();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.push(Section {
                name: name.to_string(),
                items: Vec::new(),
            });
            pending.clear();
            continue;
        }
        let Some(section) = sections.last_mut() else {
            continue; // the file's own header: the page has its own DESCRIPTION
        };
        if let Some(rest) = line.strip_prefix("# e.g. ") {
            let (key, value) = rest.split_once(" = ").unwrap_or((rest, ""));
            section.items.push(Item {
                keys: vec![key.trim().to_string()],
                text: std::mem::take(&mut pending),
                example: Some(value.trim().to_string()),
            });
        } else if let Some(rest) = line
            .strip_prefix('#')
            .filter(|r| r.starts_with(|c: char| c.is_ascii_lowercase()))
        {
            let key = rest.trim().to_string();
            match section.items.last_mut() {
                // A key right below another, with no text of its own, shares that text.
                Some(last) if pending.is_empty() && last.example.is_none() => last.keys.push(key),
                _ => section.items.push(Item {
                    keys: vec![key],
                    text: std::mem::take(&mut pending),
                    example: None,
                }),
            }
        } else if let Some(text) = line.strip_prefix('#') {
            pending.push(text.trim().to_string());
        } else {
            pending.clear();
        }
    }
    sections
}

/// Text for a roff text line: backslashes and hyphens escaped, no line starting as a request.
pub fn roff(s: &str) -> String {
    let s = s.replace('\\', "\\e").replace('-', "\\-");
    if s.starts_with(['.', '\'']) {
        format!("\\&{s}")
    } else {
        s
    }
}

/// `key = value` with the key in bold.
fn key_line(kv: &str) -> String {
    match kv.split_once(" = ") {
        Some((k, v)) => format!("\\fB{}\\fR = {}", roff(k.trim()), roff(v.trim())),
        None => format!("\\fB{}\\fR", roff(kv.trim())),
    }
}

/// vgpu-license-agent.toml(5), in roff; `date` (YYYY-MM-DD or "") and `source` (name and
/// version) go into its title line.
pub fn config_page(config: &str, date: &str, source: &str) -> String {
    let mut out = format!(
        ".TH VGPU\\-LICENSE\\-AGENT.TOML 5 \"{date}\" \"{}\" \"File Formats\"\n",
        roff(source)
    );
    out.push_str(HEAD);
    for section in parse(config) {
        out.push_str(&format!(
            ".SH \"[{}] SECTION\"\n",
            roff(&section.name.to_uppercase())
        ));
        for item in &section.items {
            for (i, kv) in item.keys.iter().enumerate() {
                out.push_str(if i == 0 { ".TP\n" } else { ".TQ\n" });
                out.push_str(&key_line(kv));
                out.push('\n');
            }
            out.push_str(&roff(&item.text.join(" ")));
            out.push('\n');
            if let Some(e) = &item.example {
                out.push_str(&format!("For example: {}\n", roff(e)));
            }
        }
    }
    out.push_str(TAIL);
    out
}

const HEAD: &str = r#".SH NAME
vgpu\-license\-agent.toml \- configuration of vgpu\-license\-agent
.SH SYNOPSIS
.nf
\fI/etc/vgpu\-license\-agent/config.toml\fR
\fI/etc/vgpu\-license\-agent/config.d/*.toml\fR
.fi
.SH DESCRIPTION
\fBvgpu\-license\-agent\fR(8) reads its configuration from \fIconfig.toml\fR, then from the
drop\-ins in \fIconfig.d/\fR beside it, in the order of their names; a key set in a later file
wins over the same key in an earlier one, key by key. A missing \fIconfig.toml\fR means the
defaults. Only files whose names end in \fB.toml\fR are drop\-ins: any other file there
(\fI50\-local.conf\fR, an editor's backup) is ignored, and \fBvgpu\-license\-agent config
check\fR says so. \fB\-\-config\fR \fIFILE\fR or \fB$VGPU_LICENSE_AGENT_CONFIG\fR names
another main file, which must exist (a path named that is not there is an error, not the
defaults), unless \fIconfig.d/\fR beside it holds drop\-ins: then they, over the defaults,
are the config (how a drop\-in is checked on its own); its drop\-ins are read from
\fIconfig.d/\fR beside that file.
.PP
Prefer a drop\-in over editing \fIconfig.toml\fR: a package upgrade never touches one, and
cloud\-init's \fBwrite_files\fR can create it. The packaged \fIconfig.toml\fR lists every key
below, commented out, with its default; each is shown below as \fIkey\fR = \fIdefault\fR.
.PP
An unknown key, a value of the wrong type or out of its range, and an output path that
overlaps what the agent manages (the token directory, gridd.conf, the state directory) or an
existing file that is not the agent's, are errors that name the file and the key. The service
does not start on such a config, and \fBsystemctl reload vgpu\-license\-agent\fR fails on one
and keeps the running config: the unit's \fBExecReload=\fR runs
\fBvgpu\-license\-agent config check\fR before it signals the service.
\fBvgpu\-license\-agent config show\fR prints the merged config with each key's file.
.PP
The service's sandbox lets it write only \fI/etc/nvidia\fR,
\fI/var/lib/prometheus/node\-exporter\fR and its own state and run directories: a path moved
elsewhere needs \fBReadWritePaths=\fR in a drop\-in of \fIvgpu\-license\-agent.service\fR
(\fBsystemctl edit vgpu\-license\-agent\fR).
"#;

const TAIL: &str = r#".SH EXAMPLES
A drop\-in that serves the metrics on a Unix socket and on the guest's pod\-network
address, and reads nvidia\-smi every minute while licensed:
.PP
.RS 4
.EX
# /etc/vgpu\-license\-agent/config.d/50\-metrics.toml
[service]
metrics_socket = "/run/vgpu\-license\-agent/metrics.sock"
metrics_listen = ":9841"
poll_licensed_seconds = 60
.EE
.RE
.PP
Check it, then apply it without a restart:
.PP
.RS 4
.EX
vgpu\-license\-agent config check
systemctl reload vgpu\-license\-agent
.EE
.RE
.SH "SEE ALSO"
\fBvgpu\-license\-agent\fR(8),
\fBvgpu\-license\-agent\-run\fR(8),
\fBvgpu\-license\-agent\-config\-check\fR(8),
\fBvgpu\-license\-agent\-config\-show\fR(8),
\fBsystemd.exec\fR(5)
"#;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_sharing_a_comment_and_unset_keys_keep_their_text() {
        let page = config_page(
            "# header\n[service]\n# How often.\n#a = 1\n#b = 2\n# Off by default.\n# e.g. c = \"x\"\n",
            "",
            "v",
        );
        assert!(
            page.contains(".TP\n\\fBa\\fR = 1\n.TQ\n\\fBb\\fR = 2\nHow often.\n"),
            "{page}"
        );
        assert!(
            page.contains("\\fBc\\fR\nOff by default.\nFor example: \"x\"\n"),
            "{page}"
        );
        assert!(!page.contains("header"), "{page}");
    }
}
