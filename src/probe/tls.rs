//! The TLS step: a handshake that accepts any certificate and records the chain (gridd
//! judges certificates against NVIDIA's roots, not the OS's), and the leaf's names and dates.

use super::*;

/// Accepts any certificate, keeping the chain the server sent. Handshake signatures are not
/// checked either: a key type this build cannot check must not read as "DLS unreachable"
/// when gridd, with its own library, gets through. Nothing secret is ever sent.
#[derive(Debug)]
pub(super) struct Recorder {
    pub(super) schemes: Vec<SignatureScheme>,
    pub(super) chain: Mutex<Vec<CertificateDer<'static>>>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        if let Ok(mut chain) = self.chain.lock() {
            *chain = std::iter::once(end_entity)
                .chain(intermediates)
                .map(|c| c.clone().into_owned())
                .collect();
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.schemes.clone()
    }
}

/// A distinguished name as RFC 4514 writes it (`CN=dls.example,O=Example,C=US`), with the
/// common attribute names and dotted OIDs for the others. Written here rather than with
/// x509-cert's `Display`, which links a database of every OID known (a quarter of a MiB).
pub(super) fn name_text(name: &x509_cert::name::Name) -> String {
    let mut rdns = Vec::new();
    for rdn in name.iter_rdn() {
        let atvs: Vec<String> = rdn.iter().map(attribute_text).collect();
        rdns.push(atvs.join("+"));
    }
    rdns.reverse();
    rdns.join(",")
}

/// A name's common name (`CN`), the last where there are several.
pub(crate) fn common_name(name: &x509_cert::name::Name) -> Option<String> {
    name.iter_rdn()
        .flat_map(|rdn| rdn.iter())
        .filter(|atv| atv.oid.to_string() == "2.5.4.3")
        .map(attribute_value)
        .last()
}

/// One attribute of a name as `KEY=value`: the usual short key where there is one, else the
/// OID; the value escaped.
fn attribute_text(atv: &x509_cert::attr::AttributeTypeAndValue) -> String {
    let oid = atv.oid.to_string();
    let key = match oid.as_str() {
        "2.5.4.3" => "CN",
        "2.5.4.5" => "serialNumber",
        "2.5.4.6" => "C",
        "2.5.4.7" => "L",
        "2.5.4.8" => "ST",
        "2.5.4.10" => "O",
        "2.5.4.11" => "OU",
        "1.2.840.113549.1.9.1" => "emailAddress",
        "0.9.2342.19200300.100.1.25" => "DC",
        _ => oid.as_str(),
    };
    let value = attribute_value(atv);
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            ',' | '+' | '"' | '\\' | '<' | '>' | ';' => {
                escaped.push('\\');
                escaped.push(c);
            }
            c if c.is_control() => escaped.push('?'),
            c => escaped.push(c),
        }
    }
    format!("{key}={escaped}")
}

/// An attribute's value as text: a string type decoded, anything else as `#` and hex.
fn attribute_value(atv: &x509_cert::attr::AttributeTypeAndValue) -> String {
    use x509_cert::der::Tag;
    let bytes = atv.value.value();
    match x509_cert::der::Tagged::tag(&atv.value) {
        Tag::BmpString => {
            let units: Vec<u16> = bytes
                .chunks_exact(2)
                .map(|c| u16::from_be_bytes([c[0], c[1]]))
                .collect();
            String::from_utf16_lossy(&units)
        }
        Tag::Utf8String
        | Tag::PrintableString
        | Tag::Ia5String
        | Tag::TeletexString
        | Tag::VisibleString => String::from_utf8_lossy(bytes).into_owned(),
        _ => bytes.iter().fold("#".to_string(), |mut h, b| {
            use fmt::Write as _;
            let _ = write!(h, "{b:02x}");
            h
        }),
    }
}

/// The leaf certificate's names and validity. `Err` with a one-line reason when it does not
/// parse.
pub fn cert_info(chain: &[CertificateDer<'_>]) -> Result<CertInfo, String> {
    use x509_cert::certificate::{CertificateInner, Raw};
    use x509_cert::der::Decode;
    let leaf = chain.first().ok_or("the server sent no certificate")?;
    let cert = CertificateInner::<Raw>::from_der(leaf.as_ref())
        .map_err(|e| format!("its certificate does not parse: {e}"))?;
    let tbs = cert.tbs_certificate();
    let time = |t: x509_cert::time::Time| {
        let secs = i64::try_from(t.to_unix_duration().as_secs()).unwrap_or(i64::MAX);
        DateTime::from_timestamp(secs, 0)
            .map(rfc3339)
            .unwrap_or_else(|| format!("{secs} s after 1970"))
    };
    Ok(CertInfo {
        subject: name_text(tbs.subject()),
        issuer: name_text(tbs.issuer()),
        not_before: time(tbs.validity().not_before),
        not_after: time(tbs.validity().not_after),
        chain_length: chain.len(),
    })
}

/// Reads one batch of TLS records, within the deadline. `Ok(0)` at the end of the stream.
pub(super) fn read_some(
    conn: &mut ClientConnection,
    sock: &mut TcpStream,
    deadline: Instant,
) -> Result<usize, Stop> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(Stop::TimedOut);
    }
    sock.set_read_timeout(Some(left))?;
    let n = conn.read_tls(sock)?;
    if let Err(e) = conn.process_new_packets() {
        // Tell the server why (an alert), as a TLS client should.
        let _ = conn.write_tls(sock);
        return Err(Stop::Tls(e));
    }
    Ok(n)
}

pub(super) fn flush(conn: &mut ClientConnection, sock: &mut TcpStream) -> Result<(), Stop> {
    while conn.wants_write() {
        conn.write_tls(sock)?;
    }
    Ok(())
}

pub(super) fn handshake(
    conn: &mut ClientConnection,
    sock: &mut TcpStream,
    deadline: Instant,
) -> Result<(), Stop> {
    loop {
        flush(conn, sock)?;
        if !conn.is_handshaking() {
            return Ok(());
        }
        if read_some(conn, sock, deadline)? == 0 {
            return Err(Stop::Closed);
        }
    }
}

pub(super) fn tls_config(recorder: Arc<Recorder>) -> Result<Arc<ClientConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(recorder)
        .with_no_client_auth();
    Ok(Arc::new(cfg))
}
