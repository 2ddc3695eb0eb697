//! Where `install` gets the token's bytes: a file, standard input, a base64 string or an HTTPS
//! URL. Nothing here ever puts the token's content (or a URL's credentials) in a message.

use std::io::{self, IsTerminal};
use std::path::Path;
use std::time::Duration;

use anyhow::{anyhow, bail};
use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::files::input::{self, ReadError};
use crate::model::token::{MAX_TOKEN_BYTES, TokenError};

/// How long standard input may take to deliver a whole token where no config says (`token
/// inspect -`): a pipe from a command that never writes or never closes must not hang.
pub const STDIN_DEADLINE: Duration = Duration::from_secs(60);

/// The token's bytes from a file (`-` for standard input, which must end within
/// `stdin_deadline`: a pipe that never closes must not hang cloud-init). Only a regular file
/// is read (a symlink to one is followed: a Kubernetes Secret volume is made of them), never
/// more than `MAX_TOKEN_BYTES` of it.
pub fn from_file(path: &Path, stdin_deadline: Duration) -> anyhow::Result<Vec<u8>> {
    if input::is_stdin(path) && io::stdin().is_terminal() {
        bail!(
            "--token-file -: standard input is a terminal; pipe the token in (install --token-file - < client_configuration_token.tok) or give its path"
        );
    }
    let shown = if input::is_stdin(path) {
        input::named(path)
    } else {
        format!("the token file {}", input::named(path))
    };
    match input::read_named(path, MAX_TOKEN_BYTES, stdin_deadline) {
        Ok(bytes) => Ok(bytes),
        Err(ReadError::TooLarge(_)) => Err(anyhow!(
            "{shown}: {}",
            TokenError::TooLarge(MAX_TOKEN_BYTES + 1)
        )),
        Err(e @ ReadError::NotRegular(_)) => Err(anyhow!(
            "cannot read {shown}: {e}; give the path of the .tok file downloaded from the DLS"
        )),
        Err(e) if e.is_not_found() => Err(anyhow!(
            "cannot read {shown}: {e}; give the path of the .tok file downloaded from the DLS"
        )),
        Err(e) => Err(anyhow!(
            "cannot read {shown}: {e}; check its permissions, or pipe it in with --token-file -"
        )),
    }
}

const B64_STD: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);
const B64_URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// The token's bytes from `--token-base64` (standard or URL-safe alphabet, line breaks and
/// padding tolerated).
pub fn from_base64(text: &str) -> anyhow::Result<Vec<u8>> {
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if compact.is_empty() {
        bail!(
            "--token-base64 is empty; give the token file's content encoded with `base64 -w0 client_configuration_token.tok`"
        );
    }
    let bytes = decode_base64(&compact).map_err(|_| {
            if compact.matches('.').count() == 2 {
                anyhow!(
                    "--token-base64 is not base64: it looks like the token's text itself; encode the file with `base64 -w0 client_configuration_token.tok`, or use --token-file"
                )
            } else {
                anyhow!(
                    "--token-base64 is not valid base64 (cut or altered?); encode the token file with `base64 -w0 client_configuration_token.tok` and pass the whole output"
                )
            }
        })?;
    if encoded_token(&bytes) {
        bail!(
            "--token-base64 was encoded twice: it decodes to the token's base64, not to the token; encode the token file once, `base64 -w0 client_configuration_token.tok`, and pass that (or use --token-file)"
        );
    }
    Ok(bytes)
}

/// Base64 in either alphabet.
fn decode_base64(text: &str) -> Result<Vec<u8>, base64::DecodeError> {
    B64_STD.decode(text).or_else(|_| B64_URL.decode(text))
}

/// Whether `bytes` are no token but base64 whose decoding is shaped like one (three
/// base64url parts separated by '.'): a value encoded once too often.
fn encoded_token(bytes: &[u8]) -> bool {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return false;
    };
    let compact: String = text.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    if compact.contains('.') {
        return false;
    }
    decode_base64(&compact).is_ok_and(|inner| {
        std::str::from_utf8(&inner).is_ok_and(|t| {
            let parts: Vec<&str> = t.trim().split('.').collect();
            parts.len() == 3 && parts.iter().all(|p| !p.is_empty())
        })
    })
}

/// Where an install's token comes from (the command line's `--token-file`, `--token-base64`
/// or `--token-url`).
#[derive(Debug, Clone, Copy)]
pub enum Given<'a> {
    /// A file, `-` for standard input.
    File(&'a Path),
    /// The token's bytes, base64-encoded.
    Base64(&'a str),
    /// An HTTPS URL to download it from.
    Url(&'a str),
}

/// The token's bytes from the source given.
pub fn read(
    source: Given<'_>,
    ca_file: Option<&Path>,
    timeout: Duration,
    retries: u32,
) -> anyhow::Result<Vec<u8>> {
    match source {
        // The same time limit as a download's attempt: the config's commands.timeout_seconds.
        Given::File(path) => from_file(path, timeout),
        Given::Base64(text) => from_base64(text),
        Given::Url(url) => super::fetch::fetch(url, ca_file, timeout, retries),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_in_either_alphabet_with_line_breaks() {
        assert_eq!(from_base64("aGVs\nbG8/Pz8=").unwrap(), b"hello???");
        assert_eq!(from_base64("aGVsbG8_Pz8").unwrap(), b"hello???");
        let e = from_base64("eyJh.eyJi.c2ln!").unwrap_err().to_string();
        assert!(
            e.contains("token's text itself") && !e.contains("eyJ"),
            "{e}"
        );
        let e = from_base64("not base64 at all!").unwrap_err().to_string();
        assert!(
            e.contains("not valid base64") && !e.contains("at all"),
            "{e}"
        );
        assert!(from_base64(" \n").is_err());
    }
}
