//! The credentials a node already has, end to end: a host agent (no pod) with the kubelet's
//! own kubeconfig, in YAML as kubeadm writes `/etc/kubernetes/kubelet.conf`, whose client
//! certificate and key are one file, `pki/kubelet-client-current.pem`, a link the kubelet
//! moves to a new dated file when it rotates the certificate. Against the simulated API's
//! Node authorizer, the agent writes its own Node's condition with it, and goes on writing
//! after a rotation that withdraws the old certificate; `config check` takes the YAML form.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::sim::kube_api::{FakeApi, node_object};
use crate::common::sim::{self, Agent, Machine, Setup, write_gridd_conf};
use crate::trust::config_check;

const T: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-worker-1";

/// kubeadm's kubelet.conf: the cluster's CA as data, the user's certificate and key as
/// files (the same one).
fn kubelet_conf(api: &FakeApi, pem: &Path) -> String {
    use base64::Engine;
    let ca = base64::engine::general_purpose::STANDARD.encode(&api.ca_pem);
    format!(
        "apiVersion: v1
clusters:
- cluster:
    certificate-authority-data: {ca}
    server: https://127.0.0.1:{port}
  name: default-cluster
contexts:
- context:
    cluster: default-cluster
    namespace: default
    user: default-auth
  name: default-context
current-context: default-context
kind: Config
preferences: {{}}
users:
- name: default-auth
  user:
    client-certificate: {pem}
    client-key: {pem}
",
        port = api.port(),
        pem = pem.display()
    )
}

/// The kubelet's rotation: the new certificate and key in a dated file, the link moved to it.
fn rotate(pki: &Path, n: u32, text: &str) -> PathBuf {
    let dated = pki.join(format!("kubelet-client-2026-12-0{n}-00-00-00.pem"));
    std::fs::write(&dated, text).unwrap();
    std::fs::set_permissions(&dated, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let link = pki.join("kubelet-client-current.pem");
    let tmp = pki.join("kubelet-client-current.pem.tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&dated, &tmp).unwrap();
    std::fs::rename(&tmp, &link).unwrap();
    link
}

/// The `PATCH .../status 200` requests the API has answered.
fn status_writes(api: &FakeApi) -> usize {
    let ok = format!("PATCH /api/v1/nodes/{NODE}/status 200");
    api.requests().iter().filter(|r| r.starts_with(&ok)).count()
}

#[test]
fn scenario_the_kubelets_yaml_kubeconfig_and_rotated_certificate_write_the_node() {
    let api = FakeApi::start("no-bearer-token-here", vec![node_object(NODE, vec![])]);
    let m = Machine::new(Setup::default());
    let pki = m.path("var/lib/kubelet/pki");
    std::fs::create_dir_all(&pki).unwrap();
    let (first_cert, first) = api.client_certificate(&format!("system:node:{NODE}"));
    let link = rotate(&pki, 1, &first);
    let conf = m.path("etc/kubernetes/kubelet.conf");
    std::fs::create_dir_all(conf.parent().unwrap()).unwrap();
    std::fs::write(&conf, kubelet_conf(&api, &link)).unwrap();
    std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nnode_condition = \"on\"\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\nheartbeat_seconds = 5\n",
        conf.display()
    ));
    let (code, err) = config_check(&m);
    assert_eq!(code, Some(0), "{err}");

    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_state("licensed", T);
    let written = sim::wait_for(
        "VgpuLicensed True on the Node, written with the kubelet's certificate",
        T,
        || {
            api.condition(NODE, "VgpuLicensed")
                .filter(|c| c["status"] == "True")
        },
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    assert_eq!(written["reason"], "Licensed");

    // The kubelet rotates: a new pair, the link moved, the old certificate no longer valid.
    let (_, second) = api.client_certificate(&format!("system:node:{NODE}"));
    rotate(&pki, 2, &second);
    api.withdraw_certificate(&first_cert);
    let before = status_writes(&api);
    sim::wait_for(
        "two heartbeats written with the rotated certificate",
        T,
        || (status_writes(&api) >= before + 2).then_some(()),
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    let unauthorized = api.requests().iter().filter(|r| r.contains(" 401")).count();
    assert!(unauthorized <= 1, "{:?}", api.requests());
    assert!(
        !a.journal_lines().iter().any(|l| l.contains("BEGIN")),
        "no key in the journal"
    );
}

/// The Node authorizer lets a node's certificate write its own Node only: named another
/// Node, the write is refused, said, and counted, and nothing else changes.
#[test]
fn a_kubelet_certificate_writes_no_other_node() {
    let other = "gpu-worker-2";
    let api = FakeApi::start(
        "no-bearer-token-here",
        vec![node_object(NODE, vec![]), node_object(other, vec![])],
    );
    let m = Machine::new(Setup::default());
    let pki = m.path("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let (_, pem) = api.client_certificate(&format!("system:node:{NODE}"));
    let link = rotate(&pki, 1, &pem);
    let conf = m.path("kubelet.conf");
    std::fs::write(&conf, kubelet_conf(&api, &link)).unwrap();
    std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nkubeconfig = \"{}\"\nnode_name = \"{other}\"\nheartbeat_seconds = 5\n",
        conf.display()
    ));
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    sim::wait_for(
        "vgpu_license_node_condition_errors_total above 0",
        T,
        || {
            a.metric("vgpu_license_node_condition_errors_total")
                .filter(|n| *n > 0.0)
        },
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
    assert!(api.condition(other, "VgpuLicensed").is_none());
    // The hint names the setting and the certificate's own node, not a service account.
    assert!(
        a.journal_lines()
            .iter()
            .any(|l| l.contains("was not written")
                && l.contains("403")
                && l.contains(&format!("is node \"{NODE}\"'s"))
                && l.contains(&format!("kubernetes.node_name = \"{NODE}\""))
                && !l.contains("service account")),
        "{}",
        a.context()
    );
    drop(a);
    // config check says it before the service starts.
    let (code, err) = config_check(&m);
    assert_eq!(code, Some(1), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("\"{other}\"")) && err.contains(&format!("CN system:node:{NODE}")),
        "{err}"
    );
}

/// A kubeconfig made to fell or exhaust the service: nested aliases (400 bytes that expand
/// to gigabytes) and nesting 20,000 deep. `config check` refuses each at once in one line
/// naming the file, and the service goes on without the Node condition.
#[test]
fn a_hostile_yaml_kubeconfig_is_refused_in_a_line() {
    let m = Machine::new(Setup::default());
    let conf = m.path("kubelet.conf");
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\n",
        conf.display()
    ));
    let mut laughs = String::from("a: &a [lol,lol,lol,lol,lol,lol,lol,lol,lol]\n");
    for c in 'b'..='j' {
        let p = (c as u8 - 1) as char;
        laughs.push_str(&format!(
            "{c}: &{c} [*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p},*{p}]\n"
        ));
    }
    // 40 KB, 20,000 deep.
    let deep = format!("{}{}", "[".repeat(20_000), "]".repeat(20_000));
    for (text, said) in [
        (laughs, "YAML anchor"),
        (deep, "nests deeper than 32 levels"),
    ] {
        std::fs::write(&conf, text).unwrap();
        std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let started = std::time::Instant::now();
        let (code, err) = config_check(&m);
        assert_eq!(code, Some(1), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(&conf.display().to_string()) && err.contains(said),
            "{err}"
        );
    }
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    a.wait_state("licensed", T);
    assert!(
        a.journal_lines()
            .iter()
            .any(|l| l.contains("the Node condition is not written") && l.contains("nests deeper")),
        "{}",
        a.context()
    );
}

/// A client certificate the TLS client cannot show, or a key that is not its own, is
/// refused by `config check` in one line naming the files, as the service would find it at
/// its first write.
#[test]
fn a_client_certificate_tls_cannot_use_is_refused_by_config_check() {
    let api = FakeApi::start("no-bearer-token-here", vec![node_object(NODE, vec![])]);
    let m = Machine::new(Setup::default());
    let pki = m.path("pki");
    std::fs::create_dir_all(&pki).unwrap();
    let user = format!("system:node:{NODE}");
    let (cert, _) = api.client_certificate(&user);
    let (_, other_pair) = api.client_certificate(&user);
    let other_key = &other_pair[other_pair.find("-----BEGIN EC PRIVATE KEY").unwrap()..];
    // X.509 v1, as `openssl x509 -req` makes one without -extfile.
    let key = pki.join("v1.key");
    let csr = pki.join("v1.csr");
    let run = |args: &[&str]| {
        let out = std::process::Command::new("openssl")
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-keyout",
        key.to_str().unwrap(),
        "-subj",
        &format!("/CN={user}"),
        "-out",
        csr.to_str().unwrap(),
    ]);
    let v1 = pki.join("v1.crt");
    run(&[
        "x509",
        "-req",
        "-in",
        csr.to_str().unwrap(),
        "-signkey",
        key.to_str().unwrap(),
        "-days",
        "30",
        "-out",
        v1.to_str().unwrap(),
    ]);
    let v1_pair = format!(
        "{}{}",
        std::fs::read_to_string(&v1).unwrap(),
        std::fs::read_to_string(&key).unwrap()
    );
    let conf = m.path("kubelet.conf");
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\n",
        conf.display()
    ));
    for (pair, said) in [
        (
            format!("{cert}{other_key}"),
            "is not the client-certificate's key",
        ),
        (v1_pair, "X.509 V1"),
    ] {
        let pem = pki.join("kubelet-client-current.pem");
        std::fs::write(&pem, pair).unwrap();
        std::fs::set_permissions(&pem, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        std::fs::write(&conf, kubelet_conf(&api, &pem)).unwrap();
        std::fs::set_permissions(&conf, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
        let (code, err) = config_check(&m);
        assert_eq!(code, Some(1), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(
            err.contains(said) && err.contains(&pem.display().to_string()),
            "{said}: {err}"
        );
        assert!(!err.contains("BEGIN"), "no key in the error: {err}");
    }
}
