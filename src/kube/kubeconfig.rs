//! A kubeconfig, as kubectl, kubeadm and the kubelet write one (YAML, or its JSON form): its
//! current context's server, certificate authority and credentials, a bearer token (or its
//! file) and a client certificate with its key (as data, or as files: the kubelet's own,
//! `/var/lib/kubelet/pki/kubelet-client-current.pem`, is rotated on disk and read again).
//! Every file it names is held to the config's ownership rule, since it says where root's
//! credentials go. Exec plugins and auth providers are not run.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};
use base64::Engine;
use reqwest::Url;
use serde_json::Value;

use super::{Bearer, ClientCert, Pem, owned_file};
use crate::model::text::show_path;

/// What a kubeconfig's current context gives: where the API is, whom to trust, who the agent is.
pub(super) struct Found {
    pub base: Url,
    pub ca_pem: Vec<u8>,
    pub token: Option<Bearer>,
    pub cert: Option<ClientCert>,
}

/// Reads the kubeconfig at `path`.
pub(super) fn read(path: &Path) -> anyhow::Result<Found> {
    let shown = show_path(path);
    let bytes =
        owned_file(path, "the file").map_err(|e| anyhow!("kubernetes.kubeconfig {shown}: {e}"))?;
    let v = parse(&bytes).map_err(|why| anyhow!("kubernetes.kubeconfig {shown}: {why}"))?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    current(&v, dir).map_err(|e| anyhow!("kubernetes.kubeconfig {shown}: {e:#}"))
}

/// A kubeconfig's text as a JSON value: its JSON form as it is, else its YAML.
fn parse(bytes: &[u8]) -> Result<Value, String> {
    if let Ok(v) = serde_json::from_slice::<Value>(bytes) {
        return Ok(v);
    }
    let text = std::str::from_utf8(bytes).map_err(|_| "is not UTF-8 text".to_string())?;
    yaml(text)
}

/// The deepest a kubeconfig nests (`users[].user.exec.env[].value` is 6 levels), with room
/// to spare: deeper is not a kubeconfig, and is refused before it costs anything.
const MAX_DEPTH: usize = 32;

/// A collection being read.
enum Open {
    Seq(Vec<Value>),
    /// A mapping, and the key read whose value comes next.
    Map(serde_json::Map<String, Value>, Option<String>),
}

/// The first YAML document of `text` as JSON, read event by event with a stack of its own
/// (no recursion, however deep the text), in time and memory bounded by the text: anchors
/// and aliases are refused (a kubeconfig has no use for them, and an alias of an alias is
/// how a few hundred bytes become gigabytes), and so is nesting deeper than [`MAX_DEPTH`].
/// Scalars are read as YAML 1.2's core schema reads them (a number's text kept where it is
/// not an integer).
fn yaml(text: &str) -> Result<Value, String> {
    let mut parser = yaml_rust2::parser::Parser::new_from_str(text);
    let mut stack: Vec<Open> = Vec::new();
    let mut doc: Option<Value> = None;
    loop {
        let (event, mark) = parser.next_token().map_err(|e| {
            // The parser's own limit on flow collections (`[[[...`), said as nesting.
            if e.info().contains("recursion limit") {
                nests_too_deep(e.marker().line())
            } else {
                not_yaml(&e)
            }
        })?;
        let value = match yaml_step(event, mark.line(), &mut stack, doc.is_some())? {
            Step::End => break,
            Step::Skip => continue,
            Step::Value(v) => v,
        };
        match stack.last_mut() {
            None => doc = Some(value),
            Some(Open::Seq(a)) => a.push(value),
            Some(Open::Map(m, key)) => match key.take() {
                Some(k) => {
                    m.insert(k, value);
                }
                None => match value {
                    Value::String(k) => *key = Some(k),
                    _ => return Err("is YAML with keys that are not text: not a kubeconfig".into()),
                },
            },
        }
    }
    doc.ok_or_else(|| "is empty: not a kubeconfig".to_string())
}

fn not_yaml(e: &dyn std::fmt::Display) -> String {
    format!("is not a kubeconfig (YAML or JSON): {e}")
}

fn nests_too_deep(line: usize) -> String {
    format!("nests deeper than {MAX_DEPTH} levels (line {line}): not a kubeconfig")
}

/// What one parser event gives the document being built.
enum Step {
    /// The first document ended.
    End,
    /// Nothing to place (a collection opened, a document began).
    Skip,
    /// A value to place where the stack is.
    Value(Value),
}

/// One parser event on the stack of open collections: an anchor, an alias or nesting past
/// [`MAX_DEPTH`] refused, a scalar read, a collection opened or closed.
fn yaml_step(
    event: yaml_rust2::parser::Event,
    line: usize,
    stack: &mut Vec<Open>,
    have_doc: bool,
) -> Result<Step, String> {
    use yaml_rust2::parser::Event;
    let anchored = |anchor: usize| match anchor {
        0 => Ok(()),
        _ => Err(format!(
            "has a YAML anchor (line {line}): a kubeconfig has none, and the agent reads none: write the value out"
        )),
    };
    Ok(match event {
        Event::StreamEnd => Step::End,
        Event::DocumentEnd if have_doc => Step::End,
        Event::Alias(_) => {
            return Err(format!(
                "has a YAML alias (line {line}): a kubeconfig has none, and the agent reads none: write the value out"
            ));
        }
        Event::Scalar(v, style, anchor, tag) => {
            anchored(anchor)?;
            let plain = style == yaml_rust2::scanner::TScalarStyle::Plain && tag.is_none();
            Step::Value(scalar(v, plain))
        }
        Event::SequenceStart(anchor, _) | Event::MappingStart(anchor, _) => {
            anchored(anchor)?;
            if stack.len() >= MAX_DEPTH {
                return Err(nests_too_deep(line));
            }
            stack.push(match event {
                Event::SequenceStart(..) => Open::Seq(Vec::new()),
                _ => Open::Map(serde_json::Map::new(), None),
            });
            Step::Skip
        }
        Event::SequenceEnd | Event::MappingEnd => Step::Value(match stack.pop() {
            Some(Open::Seq(a)) => Value::Array(a),
            Some(Open::Map(m, _)) => Value::Object(m),
            None => return Err(not_yaml(&"a collection ends that never began")),
        }),
        _ => Step::Skip,
    })
}

/// A scalar's value: a plain one as the core schema reads it, a quoted or tagged one as text.
fn scalar(v: String, plain: bool) -> Value {
    use yaml_rust2::Yaml;
    if !plain {
        return Value::String(v);
    }
    match Yaml::from_str(&v) {
        Yaml::Integer(i) => Value::from(i),
        Yaml::Boolean(b) => Value::Bool(b),
        Yaml::Null => Value::Null,
        _ => Value::String(v),
    }
}

/// The current context of the kubeconfig `v`; relative file names are read from `dir`, the
/// kubeconfig's directory, as kubectl reads them.
fn current(v: &Value, dir: &Path) -> anyhow::Result<Found> {
    let named = |list: &str, name: &str| {
        v[list]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == name))
            .cloned()
    };
    let current = v["current-context"].as_str().unwrap_or_default();
    let context = named("contexts", current)
        .with_context(|| format!("no context named by current-context ({current:?})"))?;
    let cluster_name = context["context"]["cluster"].as_str().unwrap_or_default();
    let user_name = context["context"]["user"].as_str().unwrap_or_default();
    let cluster =
        named("clusters", cluster_name).with_context(|| format!("no cluster {cluster_name:?}"))?;
    let user = named("users", user_name).with_context(|| format!("no user {user_name:?}"))?;
    let server = cluster["cluster"]["server"].as_str().unwrap_or_default();
    let base = Url::parse(server)
        .ok()
        .filter(|u| u.scheme() == "https")
        .context("the cluster's server is not an https URL")?;
    let ca_pem = ca(&cluster["cluster"], dir)?;
    let user = &user["user"];
    let token = token(user, dir)?;
    let cert = client_cert(user, dir)?;
    if token.is_none() && cert.is_none() {
        bail!(
            "the user has neither a bearer token (token, tokenFile) nor a client certificate (client-certificate and client-key, or their -data); exec plugins and auth providers are not run"
        );
    }
    Ok(Found {
        base,
        ca_pem,
        token,
        cert,
    })
}

/// A file the kubeconfig names, relative to its directory where it is not absolute.
fn file_in(dir: &Path, name: &str) -> PathBuf {
    dir.join(name)
}

/// Base64 data of the key `key`, decoded.
fn data(section: &Value, key: &str) -> anyhow::Result<Option<Vec<u8>>> {
    section[key]
        .as_str()
        .map(|d| {
            base64::engine::general_purpose::STANDARD
                .decode(d.trim())
                .map_err(|_| anyhow!("{key} is not base64"))
        })
        .transpose()
}

/// Data given inline under `{key}-data`, else the file named by `key`.
fn pem(section: &Value, key: &str, dir: &Path) -> anyhow::Result<Option<Pem>> {
    if let Some(d) = data(section, &format!("{key}-data"))? {
        return Ok(Some(Pem::Data(d)));
    }
    Ok(section[key]
        .as_str()
        .filter(|f| !f.is_empty())
        .map(|f| Pem::File(file_in(dir, f))))
}

/// The cluster's certificate authority: its data, or its file.
fn ca(cluster: &Value, dir: &Path) -> anyhow::Result<Vec<u8>> {
    match pem(cluster, "certificate-authority", dir)? {
        Some(p) => p.read("its certificate-authority"),
        None => bail!(
            "the cluster names no certificate authority (certificate-authority-data or certificate-authority)"
        ),
    }
}

/// The user's bearer token: the token, or its file (checked now, so that `config check`
/// and the start say it, and at each read).
fn token(user: &Value, dir: &Path) -> anyhow::Result<Option<Bearer>> {
    if let Some(t) = user["token"].as_str().filter(|t| !t.is_empty()) {
        return Ok(Some(Bearer::Literal(t.to_string())));
    }
    let Some(f) = user["tokenFile"].as_str().filter(|f| !f.is_empty()) else {
        return Ok(None);
    };
    let path = file_in(dir, f);
    owned_file(&path, "its tokenFile")
        .map_err(|e| super::file_error(&path, "its tokenFile", &e))?;
    Ok(Some(Bearer::KubeconfigFile(path)))
}

/// The user's client certificate and key, both or neither, checked now as the service will
/// read them.
fn client_cert(user: &Value, dir: &Path) -> anyhow::Result<Option<ClientCert>> {
    let cert = pem(user, "client-certificate", dir)?;
    let key = pem(user, "client-key", dir)?;
    let cert = match (cert, key) {
        (None, None) => return Ok(None),
        (Some(cert), Some(key)) => ClientCert { cert, key },
        (Some(_), None) => bail!("the user has a client-certificate but no client-key"),
        (None, Some(_)) => bail!("the user has a client-key but no client-certificate"),
    };
    cert.check()?;
    Ok(Some(cert))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `kubectl config view --raw --minify` of a kubeadm cluster, as kubectl prints it.
    const KUBECTL_YAML: &str = "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: Q0E=
    server: https://10.0.0.1:6443
  name: kubernetes
contexts:
- context:
    cluster: kubernetes
    user: agent
  name: agent@kubernetes
current-context: agent@kubernetes
kind: Config
preferences: {}
users:
- name: agent
  user:
    token: eyJhbGciOiJSUzI1NiJ9.e30.c2ln
";

    #[test]
    fn yaml_and_json_read_alike() {
        let yaml = parse(KUBECTL_YAML.as_bytes()).unwrap();
        let json = parse(yaml.to_string().as_bytes()).unwrap();
        assert_eq!(yaml, json);
        assert_eq!(yaml["current-context"], "agent@kubernetes");
        assert_eq!(yaml["preferences"], serde_json::json!({}));
        let found = current(&yaml, Path::new("/etc/kubernetes")).unwrap();
        assert_eq!(found.base.as_str(), "https://10.0.0.1:6443/");
        assert_eq!(found.ca_pem, b"CA");
        assert!(matches!(found.token, Some(Bearer::Literal(_))));
        assert!(found.cert.is_none());
    }

    #[test]
    fn files_are_read_from_the_kubeconfigs_directory() {
        let yaml = parse(
            KUBECTL_YAML
                .replace(
                    "certificate-authority-data: Q0E=",
                    "certificate-authority: ca.crt",
                )
                .as_bytes(),
        )
        .unwrap();
        let err = current(&yaml, Path::new("/nonexistent/kube"))
            .err()
            .unwrap();
        assert!(
            format!("{err:#}").contains("/nonexistent/kube/ca.crt"),
            "{err:#}"
        );
    }

    /// Nested aliases (a few hundred bytes that expand to gigabytes) and nesting far deeper
    /// than a kubeconfig's are refused at once, in a line, with no stack overflow.
    #[test]
    fn hostile_yaml_is_refused_in_bounded_time_and_memory() {
        let mut laughs =
            String::from("a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n");
        for (i, c) in ('b'..='k').enumerate() {
            let prev = (b'a' + i as u8) as char;
            laughs.push_str(&format!(
                "{c}: &{c} [*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev},*{prev}]\n"
            ));
        }
        let why = parse(laughs.as_bytes()).unwrap_err();
        assert!(why.contains("YAML anchor"), "{why}");
        for deep in [
            format!("{}{}", "[".repeat(20_000), "]".repeat(20_000)),
            format!(
                "{}x",
                (0..20_000)
                    .map(|i| format!("{}k:\n", " ".repeat(i)))
                    .collect::<String>()
            ),
            format!("{}1{}", "{a: ".repeat(20_000), "}".repeat(20_000)),
        ] {
            let why = parse(deep.as_bytes()).unwrap_err();
            assert!(why.contains("nests deeper than 32 levels"), "{why}");
        }
        // As deep as a kubeconfig's exec env, and a bit more, is read.
        let ok = format!("{}1{}", "{a: ".repeat(32), "}".repeat(32));
        assert!(parse(ok.as_bytes()).is_ok());
    }

    #[test]
    fn what_is_not_a_kubeconfig_is_said() {
        for (text, said) in [
            ("key: [unclosed", "is not a kubeconfig (YAML or JSON)"),
            ("", "is empty"),
            ("? [a, b]\n: 1\n", "not text"),
            ("a: &x [1]\nb: *x\n", "YAML anchor (line 1)"),
            ("a: &x [1]\nb: c\n", "YAML anchor"),
        ] {
            assert!(
                parse(text.as_bytes()).unwrap_err().contains(said),
                "{text:?}"
            );
        }
        let no_user = parse(
            KUBECTL_YAML
                .replace(
                    "    token: eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n",
                    "    exec: {}\n",
                )
                .as_bytes(),
        )
        .unwrap();
        let err = current(&no_user, Path::new("/")).err().unwrap();
        assert!(format!("{err:#}").contains("exec plugins"), "{err:#}");
        let half = parse(
            KUBECTL_YAML
                .replace(
                    "    token: eyJhbGciOiJSUzI1NiJ9.e30.c2ln\n",
                    "    client-certificate-data: Q0E=\n",
                )
                .as_bytes(),
        )
        .unwrap();
        let err = current(&half, Path::new("/")).err().unwrap();
        assert!(format!("{err:#}").contains("no client-key"), "{err:#}");
    }
}
