//! `token inspect`: what a token says, never its key or signature.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::anyhow;
use serde::Serialize;

use crate::files::input::{self, ReadError};
use crate::model::report::human::both_times;
use crate::model::text::escape;
use crate::model::time::rfc3339;
use crate::token::{MAX_TOKEN_BYTES, Token, TokenError, Untimely};

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
