//! What cloud-init decodes of a user-data document before it reads it, so that
//! `prepare-image` looks where cloud-init would: a gzip stream, a MIME message (each part, its
//! base64 or quoted-printable body decoded; `cloud-init devel make-mime` writes base64
//! parts), and a whole document in base64, each of these inside another up to a few levels.

use std::io::Read;

use base64::Engine;

/// How deep forms are unwrapped (gzip of MIME of base64 of a part, say).
const DEPTH: u8 = 4;
/// The most bytes all the decoded forms of one document may take.
const LIMIT: usize = 16 << 20;

/// A document whose decoded forms are larger than [`LIMIT`]: they were not all decoded, so
/// what it holds is not known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cut;

impl std::error::Error for Cut {}

impl std::fmt::Display for Cut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "it decodes (gzip) to more than {} MiB, which was not searched whole",
            LIMIT >> 20
        )
    }
}

/// Every decoded form of `doc` (not `doc` itself), outermost first; [`Cut`] where they do
/// not fit in [`LIMIT`] (a small gzip can inflate a thousandfold).
pub fn decoded_forms(doc: &[u8]) -> Result<Vec<Vec<u8>>, Cut> {
    let mut out = Vec::new();
    let mut budget = LIMIT;
    unwrap_into(doc, DEPTH, &mut budget, &mut out)?;
    Ok(out)
}

fn unwrap_into(
    doc: &[u8],
    depth: u8,
    budget: &mut usize,
    out: &mut Vec<Vec<u8>>,
) -> Result<(), Cut> {
    if depth == 0 {
        return Ok(());
    }
    for form in one_level(doc, budget)? {
        unwrap_into(&form, depth - 1, budget, out)?;
        out.push(form);
    }
    Ok(())
}

/// The forms one decoding step gives: the gunzipped stream, the MIME parts' bodies, or the
/// base64 document decoded.
fn one_level(doc: &[u8], budget: &mut usize) -> Result<Vec<Vec<u8>>, Cut> {
    let limit = *budget;
    let mut take = |v: Vec<u8>| {
        *budget = budget.saturating_sub(v.len());
        v
    };
    if doc.starts_with(&[0x1f, 0x8b]) {
        return Ok(gunzip(doc, limit)?.map(&mut take).into_iter().collect());
    }
    if let Some(parts) = mime_bodies(doc) {
        return Ok(parts.into_iter().map(take).collect());
    }
    Ok(base64_document(doc).map(take).into_iter().collect())
}

/// The gunzipped stream, `None` where it is no gzip, [`Cut`] where it inflates past `limit`.
fn gunzip(doc: &[u8], limit: usize) -> Result<Option<Vec<u8>>, Cut> {
    let mut out = Vec::new();
    let read = flate2::read::MultiGzDecoder::new(doc)
        .take(limit as u64 + 1)
        .read_to_end(&mut out);
    if out.len() > limit {
        return Err(Cut);
    }
    Ok(read.ok().map(|_| out))
}

/// A document that is base64 and nothing else (line breaks aside), decoded.
fn base64_document(doc: &[u8]) -> Option<Vec<u8>> {
    let text: Vec<u8> = doc
        .iter()
        .copied()
        .filter(|b| !b.is_ascii_whitespace())
        .collect();
    let b64 = |b: &u8| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'/' | b'=');
    if text.len() < 16 || !text.iter().all(b64) {
        return None;
    }
    base64::engine::general_purpose::STANDARD.decode(&text).ok()
}

/// A MIME entity's header lines, names lowercased.
type Headers = Vec<(String, String)>;

/// A MIME entity's header lines and body, split at the first empty line; `None` when the
/// document does not start with header lines.
fn entity(doc: &[u8]) -> Option<(Headers, &[u8])> {
    let mut headers: Headers = Vec::new();
    let mut at = 0;
    while at < doc.len() {
        let end = memchr::memchr(b'\n', &doc[at..]).map_or(doc.len(), |i| at + i);
        let line = String::from_utf8_lossy(&doc[at..end]);
        let line = line.trim_end_matches('\r');
        let next = (end + 1).min(doc.len());
        if line.is_empty() {
            return (!headers.is_empty()).then_some((headers, &doc[next..]));
        }
        if line.starts_with([' ', '\t']) {
            // A folded header line continues the last one.
            let (_, v) = headers.last_mut()?;
            v.push(' ');
            v.push_str(line.trim());
        } else {
            let (name, value) = line.split_once(':')?;
            if name.is_empty() || name.contains(' ') {
                return None;
            }
            headers.push((name.to_ascii_lowercase(), value.trim().to_string()));
        }
        at = next;
    }
    None
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
}

/// The decoded bodies of a MIME message: each part of a multipart one (a part that is
/// multipart itself is left whole, for the next level), or the one body of a single part;
/// `None` for what is no MIME entity with a Content-Type.
fn mime_bodies(doc: &[u8]) -> Option<Vec<Vec<u8>>> {
    let (headers, body) = entity(doc)?;
    let ctype = header(&headers, "content-type")?;
    let Some(boundary) = boundary_of(ctype) else {
        return Some(vec![body_decoded(&headers, body)]);
    };
    let delim = format!("--{boundary}");
    let finder = memchr::memmem::Finder::new(delim.as_bytes());
    let starts: Vec<usize> = finder.find_iter(body).collect();
    let mut out = Vec::new();
    for w in starts.windows(2) {
        let part = &body[w[0] + delim.len()..w[1]];
        let part = part.strip_prefix(b"\r\n").or(part.strip_prefix(b"\n"));
        if let Some((h, b)) = part.and_then(entity) {
            out.push(body_decoded(&h, b));
        }
    }
    Some(out)
}

fn boundary_of(ctype: &str) -> Option<&str> {
    if !ctype.to_ascii_lowercase().starts_with("multipart/") {
        return None;
    }
    let at = ctype.to_ascii_lowercase().find("boundary=")?;
    let v = &ctype[at + "boundary=".len()..];
    let v = v.split(';').next().unwrap_or(v).trim();
    Some(v.trim_matches('"')).filter(|b| !b.is_empty())
}

/// A part's body as its Content-Transfer-Encoding says (base64, quoted-printable; else as
/// it is).
fn body_decoded(headers: &[(String, String)], body: &[u8]) -> Vec<u8> {
    match header(headers, "content-transfer-encoding").map(str::to_ascii_lowercase) {
        Some(e) if e == "base64" => base64_document(body).unwrap_or_else(|| body.to_vec()),
        Some(e) if e == "quoted-printable" => quoted_printable(body),
        _ => body.to_vec(),
    }
}

fn quoted_printable(body: &[u8]) -> Vec<u8> {
    let hex = |b: u8| (b as char).to_digit(16).map(|d| d as u8);
    let mut out = Vec::with_capacity(body.len());
    let mut i = 0;
    while i < body.len() {
        match body[i] {
            b'=' if body[i + 1..].starts_with(b"\r\n") => i += 3,
            b'=' if body[i + 1..].starts_with(b"\n") => i += 2,
            b'=' if i + 2 < body.len() => match (hex(body[i + 1]), hex(body[i + 2])) {
                (Some(h), Some(l)) => {
                    out.push(h << 4 | l);
                    i += 3;
                }
                _ => {
                    out.push(b'=');
                    i += 1;
                }
            },
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const SECRET: &[u8] = b"write_files: [the secret]";

    #[test]
    fn a_gzip_that_inflates_past_the_limit_is_cut_not_clean() {
        // 17 MiB of zeros, then the secret: a gzip of about 17 KB.
        let mut big = vec![b'0'; 17 << 20];
        big.extend_from_slice(SECRET);
        let z = gzip(&big);
        assert!(z.len() < 100_000, "{}", z.len());
        assert_eq!(decoded_forms(&z), Err(Cut));
        assert_eq!(decoded_forms(b64_wrapped(&z).as_bytes()), Err(Cut));
        assert!(Cut.to_string().contains("16 MiB"));
    }

    fn has(forms: &[Vec<u8>]) -> bool {
        forms
            .iter()
            .any(|f| memchr::memmem::find(f, SECRET).is_some())
    }

    fn b64_wrapped(bytes: &[u8]) -> String {
        base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .as_bytes()
            .chunks(76)
            .map(|c| format!("{}\n", String::from_utf8_lossy(c)))
            .collect()
    }

    /// As `cloud-init devel make-mime` writes it (Python's email package): a multipart
    /// message whose text parts are base64, wrapped at 76.
    fn make_mime(part: &[u8]) -> Vec<u8> {
        format!(
            "Content-Type: multipart/mixed; boundary=\"===============4242==\"\nMIME-Version: 1.0\n\n\
             --===============4242==\nContent-Type: text/x-shellscript; charset=\"us-ascii\"\nMIME-Version: 1.0\nContent-Transfer-Encoding: 7bit\n\n#!/bin/sh\necho hi\n\n\
             --===============4242==\nContent-Type: text/cloud-config; charset=\"utf-8\"\nMIME-Version: 1.0\nContent-Transfer-Encoding: base64\nContent-Disposition: attachment; filename=\"user-data.yaml\"\n\n{}\n\
             --===============4242==--\n",
            b64_wrapped(part)
        )
        .into_bytes()
    }

    fn gzip(bytes: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(bytes).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn the_forms_cloud_init_reads_are_unwrapped() {
        let mime = make_mime(SECRET);
        assert!(memchr::memmem::find(&mime, SECRET).is_none());
        assert!(has(&decoded_forms(&mime).unwrap()), "a make-mime part");
        assert!(has(&decoded_forms(&gzip(&mime)).unwrap()), "gzip of MIME");
        assert!(
            has(&decoded_forms(b64_wrapped(&gzip(&mime)).as_bytes()).unwrap()),
            "base64 of gzip of MIME"
        );
        let qp = b"Content-Type: text/cloud-config\nContent-Transfer-Encoding: quoted-printable\n\nwrite_files: [the =\nsecret=5D\n";
        assert!(has(&decoded_forms(qp).unwrap()), "quoted-printable");
        let single = format!(
            "Content-Type: multipart/mixed\nContent-Transfer-Encoding: base64\n\n{}",
            b64_wrapped(SECRET)
        );
        assert!(
            has(&decoded_forms(single.as_bytes()).unwrap()),
            "one base64 body"
        );
    }

    #[test]
    fn plain_text_and_damaged_forms_give_nothing_and_never_panic() {
        assert_eq!(
            decoded_forms(b"#cloud-config\nwrite_files: []\n"),
            Ok(vec![])
        );
        assert_eq!(decoded_forms(b""), Ok(vec![]));
        for bad in [
            &[0x1f, 0x8b, 0, 1, 2][..],
            b"Content-Type: multipart/mixed; boundary=x\n\n--x\n",
            b"Content-Type: text/plain\nContent-Transfer-Encoding: quoted-printable\n\n=",
            b"Content-Type: text/plain\nContent-Transfer-Encoding: quoted-printable\n\nab=4",
        ] {
            let _ = decoded_forms(bad);
        }
    }
}
