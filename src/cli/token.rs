//! `token inspect`: what a token says, never its key or signature.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::anyhow;
use serde::Serialize;

use crate::cli::TokenInspectArgs;
use crate::files::input::{self, ReadError};
use crate::model::config::Settings;
use crate::model::report::human::both_times;
use crate::model::text::escape;
use crate::model::text::show_path;
use crate::model::time::rfc3339;
use crate::model::token::{MAX_TOKEN_BYTES, Token, TokenError, Untimely};
use anyhow::Context;
use chrono::Utc;
use std::process::ExitCode;

#[derive(Serialize)]
pub struct Inspection<'a> {
    pub(crate) file: String,
    #[serde(flatten)]
    pub(crate) token: &'a Token,
    /// `valid`, `expired` or `not_yet_valid`, at the time of the inspection.
    pub(crate) validity: &'static str,
    /// What `status` says of the token gridd runs with, where it says something (the
    /// installed token inspected, no file named): the Secret holds another, a file was
    /// refused beside it, the token source was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) status: Option<crate::model::report::Failure>,
}

/// Reads a regular file or standard input, never more than a token can be, so 10 MB of
/// junk, a FIFO or an endless pipe costs nothing.
pub fn read_limited(path: &Path) -> anyhow::Result<Vec<u8>> {
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
pub fn render(file: &str, t: &Token, validity: Result<(), Untimely>) -> String {
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
            let _ = writeln!(o, "{label} {}", both_times(t));
        }
    }
    let _ = match validity {
        Ok(()) => writeln!(o, "Validity:   valid now"),
        Err(Untimely::Expired(t)) => writeln!(
            o,
            "Validity:   EXPIRED since {}: generate a new token on the DLS",
            rfc3339(t)
        ),
        Err(Untimely::NotYetValid(t)) => writeln!(
            o,
            "Validity:   NOT YET VALID until {}: check this guest's clock",
            rfc3339(t)
        ),
    };
    o
}

/// The `token inspect` command: exit 0 for a valid token, 1 for an expired or not yet valid
/// one (or, for the installed token, one `status` warns about), and an error for what is not
/// a token.
pub fn run(args: &TokenInspectArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    // Without a file, the installed token as gridd finds it: under any name in the token
    // directory (the DLS's download name, say), as `status` and the service find it; and
    // what `status` says of it, so that both give one answer.
    let (path, said) = match &args.file {
        Some(file) => (file.clone(), None),
        None => {
            // On a GPU Operator node, the driver container's token under its root.
            let settings = &crate::node::detect(settings).apply(settings);
            let path = crate::observe::live::token_state(settings, Utc::now()).path;
            (path, token_finding(settings))
        }
    };
    let bytes = read_limited(&path).map_err(|e| match &said {
        // No token to show: what status says of that (a share that did not mount, a Secret
        // without one) rather than a bare "No such file".
        Some(f) => anyhow::anyhow!(
            "{}: {e:#}; status says {}: {} -> {}",
            show_path(&path),
            f.reason.as_str(),
            f.message,
            f.advice
        ),
        None => e,
    })?;
    let token = Token::decode(&bytes).with_context(|| show_path(&path))?;
    let validity = token.validity(Utc::now());
    print_inspection(args.json, show_path(&path), &token, validity, said.as_ref())?;
    Ok(match (validity, said) {
        (Ok(()), None) => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

/// `token inspect`'s output: JSON, or the text with status's word on the token after it.
fn print_inspection(
    json: bool,
    file: String,
    token: &Token,
    validity: Result<(), Untimely>,
    said: Option<&crate::model::report::Failure>,
) -> anyhow::Result<()> {
    if json {
        let out = Inspection {
            file,
            token,
            validity: validity.err().map_or("valid", Untimely::name),
            status: said.cloned(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let mut text = render(&file, token, validity);
    if let Some(f) = said {
        text.push_str(&format!(
            "Status:   {}: {}\nFix:      {}\n",
            f.reason.as_str(),
            f.message,
            f.advice
        ));
    }
    print!("{}", crate::model::text::for_terminal(&text));
    Ok(())
}

/// What `status` says of the installed token, where it says something about it: the
/// report's failure when it is the token's, or a token finding another failure leads.
fn token_finding(settings: &Settings) -> Option<crate::model::report::Failure> {
    use crate::model::report::Reason;
    let (report, _) = crate::cli::status::current(settings);
    let of_token = |r: Reason| {
        matches!(
            r,
            Reason::TokenMissing
                | Reason::TokenInvalid
                | Reason::TokenExpired
                | Reason::TokenRejected
                | Reason::TokenSourceRejected
                | Reason::TokenStale
        )
    };
    if let Some(f) = report.failure.as_ref().filter(|f| of_token(f.reason)) {
        return Some(f.clone());
    }
    [
        Reason::TokenRejected,
        Reason::TokenSourceRejected,
        Reason::TokenStale,
    ]
    .into_iter()
    .find_map(|r| {
        let message = crate::model::state::served_finding(&report, r)?;
        Some(crate::model::report::Failure {
            reason: r,
            message,
            advice: crate::model::state::advice(r, None, None, None),
            at: None,
        })
    })
}
