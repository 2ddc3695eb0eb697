//! Where `install` gets the token's bytes: a file, standard input, a base64 string or an HTTPS
//! URL. Nothing here ever puts the token's content (or a URL's credentials) in a message.

use std::io::{self, IsTerminal, Read};
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::cli::TokenSource;
use crate::token::{MAX_TOKEN_BYTES, TokenError};

/// Reads at most `MAX_TOKEN_BYTES`; past that, counts the rest and says how large it was.
pub fn read_capped(mut r: impl Read) -> io::Result<Result<Vec<u8>, TokenError>> {
    let mut buf = Vec::new();
    (&mut r)
        .take(MAX_TOKEN_BYTES as u64 + 1)
        .read_to_end(&mut buf)?;
    if buf.len() > MAX_TOKEN_BYTES {
        let rest = io::copy(&mut r, &mut io::sink())?;
        return Ok(Err(TokenError::TooLarge(buf.len() + rest as usize)));
    }
    Ok(Ok(buf))
}

/// The token's bytes from a file (`-` for standard input). An input too large to be a token is
/// a [`TokenError::TooLarge`] with its real size.
pub fn from_file(path: &Path) -> anyhow::Result<Vec<u8>> {
    let bytes = if path == Path::new("-") {
        let stdin = io::stdin();
        if stdin.is_terminal() {
            bail!(
                "--token-file -: standard input is a terminal; pipe the token in (install --token-file - < client_configuration_token.tok) or give its path"
            );
        }
        read_capped(stdin.lock()).context("cannot read the token from standard input")?
    } else {
        let meta = std::fs::metadata(path).map_err(|e| {
            anyhow!(
                "cannot read the token file {}: {e}; give the path of the .tok file downloaded from the DLS",
                path.display()
            )
        })?;
        if meta.is_dir() {
            bail!(
                "cannot read the token file {}: it is a directory; give the path of the .tok file downloaded from the DLS",
                path.display()
            );
        }
        let file = std::fs::File::open(path).map_err(|e| {
            anyhow!(
                "cannot read the token file {}: {e}; check its permissions, or pipe it in with --token-file -",
                path.display()
            )
        })?;
        read_capped(file)
            .map_err(|e| anyhow!("cannot read the token file {}: {e}", path.display()))?
    };
    Ok(bytes?)
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
    B64_STD
        .decode(&compact)
        .or_else(|_| B64_URL.decode(&compact))
        .map_err(|_| {
            if compact.matches('.').count() == 2 {
                anyhow!(
                    "--token-base64 is not base64: it looks like the token's text itself; encode the file with `base64 -w0 client_configuration_token.tok`, or use --token-file"
                )
            } else {
                anyhow!(
                    "--token-base64 is not valid base64 (cut or altered?); encode the token file with `base64 -w0 client_configuration_token.tok` and pass the whole output"
                )
            }
        })
}

/// The token's bytes from whichever source was given.
pub fn read(
    source: &TokenSource,
    ca_file: Option<&Path>,
    timeout: Duration,
    retries: u32,
) -> anyhow::Result<Vec<u8>> {
    if let Some(path) = &source.token_file {
        from_file(path)
    } else if let Some(text) = &source.token_base64 {
        from_base64(text)
    } else if let Some(url) = &source.token_url {
        super::fetch::fetch(url, ca_file, timeout, retries)
    } else {
        bail!("no token given: use --token-file, --token-base64 or --token-url")
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

    #[test]
    fn oversized_input_keeps_its_size() {
        let r = read_capped(io::repeat(b'a').take(10 << 20)).unwrap();
        assert_eq!(r, Err(TokenError::TooLarge(10 << 20)));
        let r = read_capped(&b"small"[..]).unwrap();
        assert_eq!(r, Ok(b"small".to_vec()));
    }
}
