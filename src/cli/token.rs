//! `token inspect`: what a client configuration token says, never its key material.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use chrono::Utc;

use crate::cli::TokenInspectArgs;
use crate::config::Settings;
use crate::model::text::show_path;
use crate::token::inspect::{Inspection, read_limited, render};
use crate::token::{Token, Untimely};

/// The `token inspect` command: exit 0 for a valid token, 1 for an expired or not yet valid
/// one, and an error for what is not a token.
pub fn run(args: &TokenInspectArgs, settings: &Settings) -> anyhow::Result<ExitCode> {
    // Without a file, the installed token as gridd finds it: under any name in the token
    // directory (the DLS's download name, say), as `status` and the service find it.
    let path: PathBuf = args.file.clone().unwrap_or_else(|| {
        // On a GPU Operator node, the driver container's token under its root.
        let settings = &crate::node::detect(settings).apply(settings);
        crate::live::token_state(settings, Utc::now()).path
    });
    let bytes = read_limited(&path)?;
    let token = Token::decode(&bytes).with_context(|| show_path(&path))?;
    let validity = token.validity(Utc::now());
    let file = show_path(&path);
    if args.json {
        let out = Inspection {
            file,
            token: &token,
            validity: validity.err().map_or("valid", Untimely::name),
        };
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        print!(
            "{}",
            crate::model::text::for_terminal(&render(&file, &token, validity))
        );
    }
    Ok(match validity {
        Ok(()) => ExitCode::SUCCESS,
        Err(_) => ExitCode::from(1),
    })
}
