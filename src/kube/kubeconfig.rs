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
    let docs = yaml_rust2::YamlLoader::load_from_str(text)
        .map_err(|e| format!("is not a kubeconfig (YAML or JSON): {e}"))?;
    let doc = docs
        .into_iter()
        .next()
        .ok_or("is empty: not a kubeconfig".to_string())?;
    json_of(&doc).ok_or_else(|| "is YAML with keys that are not text: not a kubeconfig".to_string())
}

/// A YAML value as JSON: scalars as YAML 1.2's core schema reads them (a number's text kept
/// where it is not an integer).
fn json_of(y: &yaml_rust2::Yaml) -> Option<Value> {
    use yaml_rust2::Yaml;
    Some(match y {
        Yaml::String(s) | Yaml::Real(s) => Value::String(s.clone()),
        Yaml::Integer(i) => Value::from(*i),
        Yaml::Boolean(b) => Value::Bool(*b),
        Yaml::Null => Value::Null,
        Yaml::Array(a) => Value::Array(a.iter().map(json_of).collect::<Option<_>>()?),
        Yaml::Hash(h) => Value::Object(
            h.iter()
                .map(|(k, v)| Some((k.as_str()?.to_string(), json_of(v)?)))
                .collect::<Option<_>>()?,
        ),
        Yaml::Alias(_) | Yaml::BadValue => return None,
    })
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
    owned_file(&path, "its tokenFile").map_err(|e| anyhow!("{e} ({})", show_path(&path)))?;
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
    cert.identity()?;
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

    #[test]
    fn what_is_not_a_kubeconfig_is_said() {
        for (text, said) in [
            ("key: [unclosed", "is not a kubeconfig (YAML or JSON)"),
            ("", "is empty"),
            ("? [a, b]\n: 1\n", "not text"),
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
