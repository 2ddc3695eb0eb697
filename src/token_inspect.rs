//! `token inspect`: what a token says, never its key or signature.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, anyhow};
use chrono::Utc;
use serde::Serialize;

use crate::cli::TokenInspectArgs;
use crate::config::Settings;
use crate::input::{self, ReadError};
use crate::report::human::both_times;
use crate::text::{escape, show_path};
use crate::time::rfc3339;
use crate::token::{MAX_TOKEN_BYTES, Token, TokenError, Validity};

#[derive(Serialize)]
struct Inspection<'a> {
    file: String,
    #[serde(flatten)]
    token: &'a Token,
    /// `valid`, `expired` or `not_yet_valid`, at the time of the inspection.
    validity: &'static str,
}

/// Reads a regular file or standard input, never more than a token can be, so 10 MB of
/// junk, a FIFO or an endless pipe costs nothing.
fn read_limited(path: &Path) -> anyhow::Result<Vec<u8>> {
    let shown = input::named(path);
    input::read_named(
        path,
        MAX_TOKEN_BYTES,
        crate::install::source::STDIN_DEADLINE,
    )
    .map_err(|e| match e {
        ReadError::TooLarge(_) => anyhow!("{shown}: {}", TokenError::TooLarge(MAX_TOKEN_BYTES + 1)),
        e => anyhow!("cannot read {shown}: {e}"),
    })
}

/// The human rendering.
pub fn render(file: &str, t: &Token, validity: Validity) -> String {
    let mut o = String::new();
    let _ = writeln!(o, "Token:      {file}");
    let _ = writeln!(
        o,
        "Issuer:     {}",
        escape(t.issuer.as_deref().unwrap_or("(not given)"))
    );
    if let Some(i) = &t.instance_ref {
        let _ = writeln!(o, "Instance:   {}", escape(i));
    }
    for s in &t.scope_refs {
        let _ = writeln!(o, "Scope:      {}", escape(s));
    }
    for n in &t.nodes {
        let _ = writeln!(
            o,
            "DLS node:   {} (auth port {}, lease port {})",
            escape(&n.host),
            n.auth_port,
            n.lease_port
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
    let token = Token::decode(&bytes).with_context(|| show_path(&path))?;
    let validity = token.validity(Utc::now());
    let file = show_path(&path);
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
        print!(
            "{}",
            crate::text::for_terminal(&render(&file, &token, validity))
        );
    }
    Ok(match validity {
        Validity::Valid => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}
