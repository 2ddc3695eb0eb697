//! `token inspect`: what a client configuration token says, never its key material.

use std::process::ExitCode;

use anyhow::Context;
use chrono::Utc;

use crate::cli::TokenInspectArgs;
use crate::config::Settings;
use crate::model::text::show_path;
use crate::token::inspect::{Inspection, read_limited, render};
use crate::token::{Token, Untimely};

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
            let path = crate::live::token_state(settings, Utc::now()).path;
            (path, Some(token_finding(settings)))
        }
    };
    let said = said.flatten();
    let bytes = match read_limited(&path) {
        Ok(b) => b,
        // No token to show: what status says of that (a share that did not mount, a Secret
        // without one) rather than a bare "No such file".
        Err(e) => match &said {
            Some(f) => anyhow::bail!(
                "{}: {e:#}; status says {}: {} -> {}",
                show_path(&path),
                f.reason.as_str(),
                f.message,
                f.advice
            ),
            None => return Err(e),
        },
    };
    let token = Token::decode(&bytes).with_context(|| show_path(&path))?;
    let validity = token.validity(Utc::now());
    let file = show_path(&path);
    if args.json {
        let out = Inspection {
            file,
            token: &token,
            validity: validity.err().map_or("valid", Untimely::name),
            status: said.clone(),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let mut text = render(&file, &token, validity);
        if let Some(f) = &said {
            text.push_str(&format!(
                "Status:   {}: {}\nFix:      {}\n",
                f.reason.as_str(),
                f.message,
                f.advice
            ));
        }
        print!("{}", crate::model::text::for_terminal(&text));
    }
    Ok(match (validity, said) {
        (Ok(()), None) => ExitCode::SUCCESS,
        _ => ExitCode::from(1),
    })
}

/// What `status` says of the installed token, where it says something about it: the
/// report's failure when it is the token's, or a token finding another failure leads.
fn token_finding(settings: &Settings) -> Option<crate::model::report::Failure> {
    use crate::model::report::Reason;
    let (report, _) = crate::status::current(settings);
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
