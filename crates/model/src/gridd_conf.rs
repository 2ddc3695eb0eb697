//! gridd.conf: read and edit it, keeping every other line, comment, their order and their
//! line endings as they were. Works on bytes, so a file that is not UTF-8 survives an edit.

use std::path::Path;

use crate::observe::smi::SmiGpu;
use crate::observe::smi::edition_for_profile;

/// A gridd.conf larger than this is not one (the driver's template is about 2 KB).
pub const MAX_GRIDD_CONF_BYTES: usize = 1 << 20;

/// Legacy license-server keys, unused when a client configuration token is installed.
pub const LEGACY_KEYS: [&str; 4] = [
    "ServerAddress",
    "ServerPort",
    "BackupServerAddress",
    "BackupServerPort",
];

/// The proxy through which gridd reaches its license service: gridd.conf's
/// `ProxyServerAddress` and `ProxyServerPort`, with `ProxyUserName` and
/// `ProxyCredentialsFilePath` for a proxy that asks for credentials (NVIDIA License System
/// User Guide, "Configuring a Licensed Client to Use a Proxy Server"). A guest that reaches
/// NVIDIA's Cloud License Service only through a corporate proxy needs them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proxy {
    pub host: String,
    pub port: u16,
    /// `ProxyUserName`: gridd authenticates to the proxy. Its password lives in
    /// `ProxyCredentialsFilePath`, encrypted for gridd: nobody else can use it.
    pub user: Option<String>,
}

impl std::fmt::Display for Proxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// What stands for a URL's user and password wherever one is shown.
const REDACTED_USERINFO: &str = "<credentials>";

/// A proxy address with any `user:password@` of a URL replaced by `<credentials>@`.
pub fn redact_address(address: &str) -> String {
    let (scheme, rest) = match address.find("://") {
        Some(i) => address.split_at(i + 3),
        None => ("", address),
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}{REDACTED_USERINFO}{}", &rest[at..]),
        None => address.to_string(),
    }
}

/// One `Key=Value` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// 1-based line number.
    pub line: usize,
    pub key: String,
    /// The value without surrounding whitespace and quotes.
    pub value: String,
}

/// A change made to one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    /// 1-based line number (of the new line, when added).
    pub line: usize,
    /// The line before (`None` when the line was added).
    pub old: Option<String>,
    pub new: String,
}

impl std::fmt::Display for Edit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.old {
            Some(old) => write!(f, "line {}: {old} -> {}", self.line, self.new),
            None => write!(f, "line {}: add {}", self.line, self.new),
        }
    }
}

/// A gridd.conf as lines of bytes, each with its own line ending.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GriddConf {
    lines: Vec<Vec<u8>>,
}

/// The parts of a `Key=Value` line: key, and the byte range of the value (inside quotes when
/// quoted).
struct Parsed {
    key: String,
    value: std::ops::Range<usize>,
}

fn is_space(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn parse_line(line: &[u8]) -> Option<Parsed> {
    let mut end = line.len();
    while end > 0 && matches!(line[end - 1], b'\n' | b'\r' | b' ' | b'\t') {
        end -= 1;
    }
    let start = line.iter().position(|b| !is_space(*b)).unwrap_or(end);
    if start >= end || line[start] == b'#' || line[start] == b';' {
        return None;
    }
    let eq = start + line[start..end].iter().position(|b| *b == b'=')?;
    let key = std::str::from_utf8(&line[start..eq]).ok()?.trim_end();
    if key.is_empty() || !key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
        return None;
    }
    let mut vs = eq + 1;
    while vs < end && is_space(line[vs]) {
        vs += 1;
    }
    let mut ve = end;
    if ve - vs >= 2 && (line[vs] == b'"' || line[vs] == b'\'') && line[ve - 1] == line[vs] {
        vs += 1;
        ve -= 1;
    }
    Some(Parsed {
        key: key.to_string(),
        value: vs..ve,
    })
}

fn show(line: &[u8]) -> String {
    String::from_utf8_lossy(line)
        .trim_end_matches(['\n', '\r'])
        .to_string()
}

impl GriddConf {
    pub fn parse(bytes: &[u8]) -> GriddConf {
        let lines = bytes
            .split_inclusive(|b| *b == b'\n')
            .map(<[u8]>::to_vec)
            .collect();
        GriddConf { lines }
    }

    pub fn to_bytes(&self) -> Vec<u8> {
        self.lines.concat()
    }

    /// Every active `Key=Value` line, in order.
    pub fn entries(&self) -> Vec<Entry> {
        self.lines
            .iter()
            .enumerate()
            .filter_map(|(i, l)| {
                let p = parse_line(l)?;
                Some(Entry {
                    line: i + 1,
                    key: p.key,
                    value: String::from_utf8_lossy(&l[p.value]).into_owned(),
                })
            })
            .collect()
    }

    /// The value of `key` (the last line that sets it wins), matched without regard to case.
    pub fn get(&self, key: &str) -> Option<Entry> {
        self.entries()
            .into_iter()
            .rfind(|e| e.key.eq_ignore_ascii_case(key))
    }

    /// Sets `key` to `value` on every line that sets it (keeping its spelling, spacing, quotes
    /// and line ending), or adds `key=value` at the end. Returns what changed.
    pub fn set(&mut self, key: &str, value: &str) -> Vec<Edit> {
        let mut edits = Vec::new();
        let mut found = false;
        for (i, line) in self.lines.iter_mut().enumerate() {
            let Some(p) = parse_line(line) else { continue };
            if !p.key.eq_ignore_ascii_case(key) {
                continue;
            }
            found = true;
            if &line[p.value.clone()] == value.as_bytes() {
                continue;
            }
            let old = show(line);
            let mut new = line[..p.value.start].to_vec();
            new.extend_from_slice(value.as_bytes());
            new.extend_from_slice(&line[p.value.end..]);
            *line = new;
            edits.push(Edit {
                line: i + 1,
                old: Some(old),
                new: show(line),
            });
        }
        if !found {
            let crlf = self.lines.first().is_some_and(|l| l.ends_with(b"\r\n"));
            let eol: &[u8] = if crlf { b"\r\n" } else { b"\n" };
            if let Some(last) = self.lines.last_mut()
                && !last.ends_with(b"\n")
            {
                last.extend_from_slice(eol);
            }
            let mut line = format!("{key}={value}").into_bytes();
            line.extend_from_slice(eol);
            self.lines.push(line);
            edits.push(Edit {
                line: self.lines.len(),
                old: None,
                new: format!("{key}={value}"),
            });
        }
        edits
    }

    /// The proxy gridd goes through, if gridd.conf names one; an error (one line, with the
    /// fix) when it names one gridd cannot use.
    pub fn proxy(&self) -> Result<Option<Proxy>, String> {
        let value = |k: &str| {
            self.get(k)
                .map(|e| e.value)
                .filter(|v| !v.trim().is_empty())
        };
        let Some(address) = value("ProxyServerAddress") else {
            return Ok(None);
        };
        // A URL is written where a host is expected often enough to take it as meant, with
        // credentials too (`http://user:password@proxy:3128`, as `http_proxy` is written):
        // the host is what follows them, and they are never shown.
        let shown = redact_address(&address);
        let (url_user, host, port_in_address) = address_parts(&address);
        // From here on, the address is only shown.
        let address = &shown;
        if host.is_empty() {
            return Err(format!(
                "gridd.conf sets ProxyServerAddress={address}, which names no host: set it to the proxy's host name or IP address"
            ));
        }
        let port = value("ProxyServerPort");
        let Some(port) = port.as_deref().or(port_in_address) else {
            return Err(format!(
                "gridd.conf sets ProxyServerAddress={address} but no ProxyServerPort: add ProxyServerPort=<the proxy's port> (often 3128 or 8080)"
            ));
        };
        let port = match port.trim().parse::<u16>() {
            Ok(p) if p > 0 => p,
            _ => {
                return Err(format!(
                    "gridd.conf sets ProxyServerPort={port}, which is not a port: set a number from 1 to 65535"
                ));
            }
        };
        Ok(Some(Proxy {
            host: host.to_string(),
            port,
            user: value("ProxyUserName").or(url_user),
        }))
    }

    /// Warnings about keys that do not do what their author may think, given that the token
    /// is installed in `token_dir`.
    pub fn warnings(&self, token_dir: &Path) -> Vec<String> {
        let mut out = Vec::new();
        for e in self.entries() {
            if e.value.is_empty() {
                continue;
            }
            if LEGACY_KEYS.iter().any(|k| k.eq_ignore_ascii_case(&e.key)) {
                out.push(format!(
                    "gridd.conf line {} sets {}={}: a legacy license-server setting that a client configuration token makes unused (gridd ignores it); remove the line to avoid confusion",
                    e.line, e.key, e.value
                ));
            } else if e.key.eq_ignore_ascii_case("ClientConfigTokenPath") {
                let set = Path::new(e.value.trim_end_matches('/'));
                if set != token_dir && Path::new(&e.value) != token_dir {
                    out.push(format!(
                        "gridd.conf line {} sets ClientConfigTokenPath={}, but the token is installed in {}: gridd will not find it; remove that line, or set paths.token_dir = \"{}\" in the agent's config",
                        e.line,
                        e.value,
                        crate::text::show_path(token_dir),
                        e.value
                    ));
                }
            }
        }
        out
    }
}

/// What a ProxyServerAddress holds: the user of a URL's credentials (never the password),
/// the host, and a port written after it.
fn address_parts(address: &str) -> (Option<String>, &str, Option<&str>) {
    let a = address.trim();
    let a = a
        .strip_prefix("http://")
        .or_else(|| a.strip_prefix("https://"))
        .unwrap_or(a);
    let a = a.split('/').next().unwrap_or(a);
    let (url_user, a) = match a.rsplit_once('@') {
        Some((userinfo, rest)) => (
            Some(userinfo.split(':').next().unwrap_or_default().to_string())
                .filter(|u| !u.is_empty()),
            rest,
        ),
        None => (None, a),
    };
    let (host, port_in_address) = match a.strip_prefix('[') {
        Some(rest) => match rest.split_once(']') {
            Some((h, p)) => (h, p.strip_prefix(':')),
            None => (rest, None),
        },
        None => match a.rsplit_once(':') {
            Some((h, p)) if !h.contains(':') => (h, Some(p)),
            _ => (a, None),
        },
    };
    (url_user, host, port_in_address)
}

/// A warning, with the right value, when `feature_type` does not fit the vGPUs nvidia-smi
/// shows (every vGPU guest needs 1: the driver picks the edition from the profile).
pub fn feature_type_advice(feature_type: u8, gpus: &[SmiGpu]) -> Option<String> {
    if feature_type == 1 {
        return None;
    }
    let vgpu = gpus.iter().find(|g| {
        g.virtualization_mode
            .as_deref()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("VGPU"))
    })?;
    let profile = vgpu.profile.as_deref().unwrap_or("(unknown profile)");
    let edition = edition_for_profile(profile)
        .map(|e| format!(" ({e})"))
        .unwrap_or_default();
    let what = match feature_type {
        0 => "leaves the vGPU unlicensed".to_string(),
        2 | 4 => "is meant for passthrough or bare metal".to_string(),
        n => format!("is not a FeatureType gridd knows ({n})"),
    };
    Some(format!(
        "FeatureType={feature_type} {what}, but this guest has the vGPU profile {profile}: use --feature-type 1 (NVIDIA vGPU; the driver picks the edition{edition} from the profile)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ProxyServerAddress` written as `http_proxy` often is, with credentials: the host is
    /// what follows them (never the user), and no error or display shows the password.
    #[test]
    fn a_proxy_url_with_credentials_is_read_and_never_shown() {
        for (conf, host, port) in [
            (
                "ProxyServerAddress=http://user:hunter2@proxy.example:3128\n",
                "proxy.example",
                3128,
            ),
            (
                "ProxyServerAddress=http://user:hunter2@proxy.example\nProxyServerPort=8080\n",
                "proxy.example",
                8080,
            ),
            (
                "ProxyServerAddress=user:hunter2@10.0.0.9:3128/\n",
                "10.0.0.9",
                3128,
            ),
        ] {
            let p = GriddConf::parse(conf.as_bytes()).proxy().unwrap().unwrap();
            assert_eq!((p.host.as_str(), p.port), (host, port), "{conf}");
            assert_eq!(p.user.as_deref(), Some("user"));
            assert!(!p.to_string().contains("hunter2"));
        }
        let e = GriddConf::parse(b"ProxyServerAddress=http://user:hunter2@proxy.example\n")
            .proxy()
            .unwrap_err();
        assert!(
            !e.contains("hunter2") && e.contains("<credentials>@proxy.example"),
            "{e}"
        );
        assert_eq!(redact_address("proxy:3128"), "proxy:3128");
    }

    const TEMPLATE: &str = "\
# /etc/nvidia/gridd.conf.template - Configuration file for NVIDIA Grid Daemon

# Description: Set Feature to be enabled
# Data type: integer
# Possible values:
# 0 => for unlicensed state
# 1 => for NVIDIA vGPU
FeatureType=0

# Description: Parameter to enable or disable Grid Licensing tab in nvidia-settings
EnableUI=FALSE
";

    #[test]
    fn sets_feature_type_keeping_everything_else() {
        let mut c = GriddConf::parse(TEMPLATE.as_bytes());
        let edits = c.set("FeatureType", "1");
        assert_eq!(
            edits,
            vec![Edit {
                line: 8,
                old: Some("FeatureType=0".into()),
                new: "FeatureType=1".into()
            }]
        );
        assert_eq!(
            String::from_utf8(c.to_bytes()).unwrap(),
            TEMPLATE.replace("FeatureType=0", "FeatureType=1")
        );
        assert!(c.set("FeatureType", "1").is_empty(), "idempotent");
        assert_eq!(c.get("featuretype").unwrap().value, "1");
    }

    #[test]
    fn adds_the_key_when_missing_or_only_commented() {
        let mut c = GriddConf::parse(b"# FeatureType=0\nEnableUI=TRUE");
        let edits = c.set("FeatureType", "1");
        assert_eq!(edits[0].old, None);
        assert_eq!(edits[0].line, 3);
        assert_eq!(
            c.to_bytes(),
            b"# FeatureType=0\nEnableUI=TRUE\nFeatureType=1\n"
        );
        let mut empty = GriddConf::parse(b"");
        empty.set("FeatureType", "1");
        assert_eq!(empty.to_bytes(), b"FeatureType=1\n");
        let mut crlf = GriddConf::parse(b"EnableUI=TRUE\r\n");
        crlf.set("FeatureType", "4");
        assert_eq!(crlf.to_bytes(), b"EnableUI=TRUE\r\nFeatureType=4\r\n");
    }

    #[test]
    fn quoted_values_spacing_and_duplicates() {
        let mut c = GriddConf::parse(
            b"FeatureType = \"4\"  \r\n\tFeatureType='2'\n#FeatureType=9\nX=\xff\xfe\n",
        );
        assert_eq!(c.get("FeatureType").unwrap().value, "2");
        let edits = c.set("FeatureType", "1");
        assert_eq!(edits.len(), 2);
        assert_eq!(
            c.to_bytes(),
            b"FeatureType = \"1\"  \r\n\tFeatureType='1'\n#FeatureType=9\nX=\xff\xfe\n"
        );
        assert_eq!(
            edits[0].to_string(),
            "line 1: FeatureType = \"4\"   -> FeatureType = \"1\"  "
        );
    }

    #[test]
    fn warns_about_legacy_keys_and_a_token_path_elsewhere() {
        let c = GriddConf::parse(
            b"ServerAddress=10.0.0.5\nServerPort=7070\nBackupServerAddress=\nClientConfigTokenPath=/opt/tok/\n",
        );
        let w = c.warnings(Path::new("/etc/nvidia/ClientConfigToken"));
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("ServerAddress=10.0.0.5") && w[0].contains("legacy"));
        assert!(w[1].contains("ServerPort"));
        assert!(w[2].contains("ClientConfigTokenPath") && w[2].contains("paths.token_dir"));
        let ok = GriddConf::parse(b"ClientConfigTokenPath=/etc/nvidia/ClientConfigToken/\n");
        assert!(
            ok.warnings(Path::new("/etc/nvidia/ClientConfigToken"))
                .is_empty()
        );
        assert!(w.iter().all(|l| !l.contains('\n')));
    }

    #[test]
    fn feature_type_fit() {
        let vgpu = SmiGpu {
            profile: Some("NVIDIA L40S-24Q".into()),
            virtualization_mode: Some("VGPU".into()),
            ..SmiGpu::default()
        };
        let pt = SmiGpu {
            profile: Some("NVIDIA H100 80GB HBM3".into()),
            virtualization_mode: Some("Pass-Through".into()),
            ..SmiGpu::default()
        };
        assert_eq!(feature_type_advice(1, std::slice::from_ref(&vgpu)), None);
        let w = feature_type_advice(4, std::slice::from_ref(&vgpu)).unwrap();
        assert!(w.contains("--feature-type 1") && w.contains("NVIDIA RTX Virtual Workstation"));
        assert!(
            feature_type_advice(0, &[vgpu])
                .unwrap()
                .contains("unlicensed")
        );
        assert_eq!(feature_type_advice(2, &[pt]), None);
    }

    #[test]
    fn the_proxy_keys() {
        let proxy = |text: &str| GriddConf::parse(text.as_bytes()).proxy();
        assert_eq!(proxy(TEMPLATE), Ok(None));
        assert_eq!(
            proxy("ProxyServerAddress=\nProxyServerPort=3128\n"),
            Ok(None)
        );
        let p = proxy("ProxyServerAddress=proxy.corp\nProxyServerPort=3128\n")
            .unwrap()
            .unwrap();
        assert_eq!(
            (p.host.as_str(), p.port, p.user),
            ("proxy.corp", 3128, None)
        );
        let p = proxy(
            "ProxyServerAddress=\"http://10.0.0.9:8080/\"\nProxyUserName=svc-gridd\nProxyCredentialsFilePath=/etc/nvidia/proxy-credentials.dat\n",
        )
        .unwrap()
        .unwrap();
        assert_eq!(p.to_string(), "10.0.0.9:8080");
        assert_eq!(p.user.as_deref(), Some("svc-gridd"));
        let p = proxy("ProxyServerAddress=[fd00::9]\nProxyServerPort=3128\n")
            .unwrap()
            .unwrap();
        assert_eq!(p.to_string(), "[fd00::9]:3128");
        for (text, says) in [
            ("ProxyServerAddress=proxy.corp\n", "no ProxyServerPort"),
            (
                "ProxyServerAddress=proxy.corp\nProxyServerPort=http\n",
                "not a port",
            ),
            (
                "ProxyServerAddress=proxy.corp\nProxyServerPort=0\n",
                "not a port",
            ),
            (
                "ProxyServerAddress=http://\nProxyServerPort=1\n",
                "names no host",
            ),
        ] {
            let e = proxy(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
