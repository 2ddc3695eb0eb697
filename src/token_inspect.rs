//! `token inspect`: what a token says, never its key or signature.

use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use chrono::Utc;
use serde::Serialize;

use crate::cli::TokenInspectArgs;
use crate::config::Settings;
use crate::report::human::both_times;
use crate::time::rfc3339;
use crate::token::{MAX_TOKEN_BYTES, Token, Validity};

#[derive(Serialize)]
struct Inspection<'a> {
    file: String,
    #[serde(flatten)]
    token: &'a Token,
    /// `valid`, `expired` or `not_yet_valid`, at the time of the inspection.
    validity: &'static str,
}

/// Reads at most a little more than a token can be, so 10 MB of junk costs nothing.
fn read_limited(path: &Path) -> anyhow::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    let reader: Box<dyn Read> = if path == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(
            std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?,
        )
    };
    reader
        .take(MAX_TOKEN_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .with_context(|| format!("cannot read {}", path.display()))?;
    Ok(bytes)
}

/// The human rendering.
pub fn render(file: &str, t: &Token, validity: Validity) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Token:      {file}");
    let _ = writeln!(
        o,
        "Issuer:     {}",
        t.issuer.as_deref().unwrap_or("(not given)")
    );
    if let Some(i) = &t.instance_ref {
        let _ = writeln!(o, "Instance:   {i}");
    }
    for s in &t.scope_refs {
        let _ = writeln!(o, "Scope:      {s}");
    }
    for n in &t.nodes {
        let _ = writeln!(
            o,
            "DLS node:   {} (auth port {}, lease port {})",
            n.host, n.auth_port, n.lease_port
        );
    }
    for (label, t) in [
        ("Issued:    ", t.issued_at),
        ("Not before:", t.not_before),
        ("Expires:   ", t.expires),
    ] {
        if let Some(t) = t {
            let _ = writeln!(o, "{label} {}", both_times(&rfc3339(t)));
        }
    }
    let _ = match validity {
        Validity::Valid => writeln!(o, "Validity:   valid now"),
        Validity::Expired(t) => writeln!(
            o,
            "Validity:   EXPIRED since {}: generate a new token on the DLS",
            rfc3339(t)
        ),
        Validity::NotYetValid(t) => writeln!(
            o,
            "Validity:   NOT YET VALID until {}: check this guest's clock",
            rfc3339(t)
        ),
    };
    o
}

/// The `token inspect` command: exit 0 for a valid token, 1 for an expired or not yet valid
/// one, and an error for what is not a token.
pub fn run(args: &TokenInspectArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    let path: PathBuf = args
        .file
        .clone()
        .unwrap_or_else(|| settings.paths.token_path());
    let bytes = read_limited(&path)?;
    let token = Token::decode(&bytes).with_context(|| path.display().to_string())?;
    let validity = token.validity(Utc::now());
    let file = path.display().to_string();
    if args.json {
        let out = Inspection {
            file,
            token: &token,
            validity: match validity {
                Validity::Valid => "valid",
                Validity::Expired(_) => "expired",
                Validity::NotYetValid(_) => "not_yet_valid",
            },
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!("{}", render(&file, &token, validity));
    }
    Ok(match validity {
        Validity::Valid => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}
