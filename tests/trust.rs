//! What the agent, running as root, refuses to trust, end to end against servers of the
//! test's own on the loopback (each with its own CA): a credential never goes to another
//! host than the one it was given for, and never in clear; the Kubernetes API's client
//! follows no redirect and reads no answer without a cap; a kubeconfig, the files it names
//! and a GPU Operator's driver root are used only where root alone could have written them; a
//! node name is a node name; `--token-url`'s secret leaves the command line at once; the
//! journal carries the agent's lines, not its HTTP client's.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::sim::kube_api::{ApiMode, FakeApi, certificates, node_object};
use crate::common::sim::{self, Agent, Machine, Setup, write_gridd_conf};
use crate::common::{Root, read_request_head, skipped, valid_token};

const T: Duration = Duration::from_secs(30);
const NODE: &str = "gpu-worker-1";
use crate::kube::TOKEN as SA_TOKEN;

/// A loopback server of the test's: HTTPS with `tls`, or plain HTTP without; every request's
/// head is kept (lower-cased), and answered with what `answer` makes of its path, one
/// request a connection.
struct Server {
    port: u16,
    heads: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn start(
        tls: Option<Arc<rustls::ServerConfig>>,
        answer: impl Fn(&str) -> Vec<u8> + Send + Sync + 'static,
    ) -> Server {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let heads = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, st, answer) = (heads.clone(), stop.clone(), Arc::new(answer));
        std::thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                let Ok((s, _)) = listener.accept() else {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                };
                let (h, tls, answer) = (h.clone(), tls.clone(), answer.clone());
                std::thread::spawn(move || {
                    let _ = s.set_nonblocking(false);
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let _ = serve_one(s, tls, &h, &*answer);
                });
            }
        });
        Server { port, heads, stop }
    }

    fn heads(&self) -> Vec<String> {
        self.heads.lock().unwrap().clone()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn serve_one(
    s: TcpStream,
    tls: Option<Arc<rustls::ServerConfig>>,
    heads: &Mutex<Vec<String>>,
    answer: &dyn Fn(&str) -> Vec<u8>,
) -> std::io::Result<()> {
    let mut stream: Box<dyn ReadWrite> = match tls {
        Some(config) => {
            let conn = rustls::ServerConnection::new(config).map_err(std::io::Error::other)?;
            Box::new(rustls::StreamOwned::new(conn, s))
        }
        None => Box::new(s),
    };
    let Some(head) = read_request_head(&mut stream) else {
        return Ok(());
    };
    let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
    let path = head.split_whitespace().nth(1).unwrap_or("/").to_string();
    heads.lock().unwrap().push(head);
    stream.write_all(&answer(&path))?;
    stream.flush()
}

trait ReadWrite: std::io::Read + Write {}
impl<T: std::io::Read + Write> ReadWrite for T {}

fn redirect(to: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .into_bytes()
}

fn ok(body: &[u8]) -> Vec<u8> {
    let mut r = format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    r.extend_from_slice(body);
    r
}

fn has_auth(head: &str) -> bool {
    head.contains("\r\nauthorization:")
}

/// `install --token-url` with a user and password: they go to their host, and to nothing
/// else. A redirect to another host (here `localhost` for `127.0.0.1`) gets no credentials,
/// nor does a second redirect within that host; a redirect within the first host keeps
/// them; a redirect from HTTPS to plain HTTP is refused before anything is sent there.
#[test]
fn the_token_download_sends_credentials_to_their_host_alone_and_never_in_clear() {
    let mut root = Root::new();
    let tok = valid_token("redirected");
    root.secrets.push(tok.clone());
    let (ca_pem, tls) = certificates();
    let ca = root.file("ca.pem", ca_pem.as_bytes());
    let t = tok.clone();
    let foreign = Server::start(Some(tls.clone()), move |path| match path {
        "/hop" => redirect("/t.tok"),
        _ => ok(&t),
    });
    let to_foreign = format!("https://localhost:{}/hop", foreign.port);
    let first = Server::start(Some(tls.clone()), move |path| match path {
        "/t.tok" => redirect("/moved.tok"),
        _ => redirect(&to_foreign),
    });
    let install_from = |port: u16| {
        let url = format!("https://agent:pa55word@127.0.0.1:{port}/t.tok");
        let ca = ca.to_str().unwrap();
        root.run(&["install", "--token-url", &url, "--ca-file", ca])
    };
    let r = install_from(first.port);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(std::fs::read(root.token_path()).unwrap(), tok);
    let (mine, theirs) = (first.heads(), foreign.heads());
    assert_eq!(mine.len(), 2, "{mine:?}");
    assert!(
        mine.iter().all(|h| has_auth(h)),
        "same host: credentials kept: {mine:?}"
    );
    assert_eq!(theirs.len(), 2, "{theirs:?}");
    assert!(
        !theirs.iter().any(|h| has_auth(h)),
        "another host: none: {theirs:?}"
    );

    // HTTPS, then a redirect to plain HTTP (on the loopback, which the agent would take
    // as a first URL): refused, and nothing reaches it.
    let clear = Server::start(None, |_| ok(b"never"));
    let to_clear = format!("http://127.0.0.1:{}/t.tok", clear.port);
    let downgrading = Server::start(Some(tls), move |_| redirect(&to_clear));
    let before = std::fs::read(root.token_path()).unwrap();
    let r = install_from(downgrading.port);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    let line = r.error_line();
    assert!(line.contains("which is not HTTPS"), "{line}");
    assert!(!line.contains("pa55word"), "{line}");
    assert!(clear.heads().is_empty(), "{:?}", clear.heads());
    assert_eq!(std::fs::read(root.token_path()).unwrap(), before);
}

/// `install --token-url URL` with a password or a signed query on the command line: while
/// the download runs, `/proc/PID/cmdline` (anyone's to read) no longer holds them.
#[test]
fn a_token_urls_secret_leaves_the_command_line_before_the_download() {
    let mut root = Root::new();
    let tok = valid_token("argv");
    root.secrets.push(tok.clone());
    // The server answers only once the test has looked at the process.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let url = format!("http://agent:pa55word@127.0.0.1:{port}/t.tok?sig=s3cr3t");
    let child = root
        .cmd(&["install", "--token-url", &url, "--retries", "0"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (mut s, _) = listener.accept().unwrap();
    let head = read_request_head(&mut s).unwrap();
    assert!(
        String::from_utf8_lossy(&head)
            .to_ascii_lowercase()
            .contains("authorization: basic"),
        "the credentials still go to their server"
    );
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", child.id())).unwrap();
    let shown = String::from_utf8_lossy(&cmdline).replace('\0', " ");
    assert!(shown.contains("install"), "{shown}");
    for secret in ["pa55word", "s3cr3t"] {
        assert!(!shown.contains(secret), "{shown}");
    }
    // Its environment, which only its own user may read, holds the URL now.
    let environ = std::fs::metadata(format!("/proc/{}/environ", child.id())).unwrap();
    assert_eq!(environ.permissions().mode() & 0o077, 0);
    s.write_all(&ok(&tok)).unwrap();
    drop(s);
    let out = child.wait_with_output().unwrap();
    let r = root.finish(out);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(std::fs::read(root.token_path()).unwrap(), tok);
}

/// A machine whose agent runs as in a pod of `api`'s cluster, licensed; `kube` is added to
/// `[kubernetes]` and `node` is its `NODE_NAME`.
fn in_pod(api: &FakeApi, kube: &str, node: &str) -> (Machine, Agent) {
    crate::kube::in_pod_as(api, 5, true, kube, node)
}

/// The service licensed, the refusal (`why`) in its journal, and nothing sent to `api`.
fn refused_without_a_request(a: &Agent, api: &FakeApi, why: &str) {
    a.wait_state("licensed", T);
    sim::wait_for(
        "the refusal in the journal",
        T,
        || a.journal_lines().join("\n").contains(why).then_some(()),
        || a.context(),
    );
    assert!(api.requests().is_empty(), "{:?}", api.requests());
}

/// `config check` of `m`'s config: its exit code and standard error.
pub(crate) fn config_check(m: &Machine) -> (Option<i32>, String) {
    let out = std::process::Command::new(crate::common::BIN)
        .arg("--config")
        .arg(&m.config)
        .args(["config", "check"])
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn wait_errors(a: &Agent, api: &FakeApi) {
    sim::wait_for(
        "vgpu_license_node_condition_errors_total above 0",
        T,
        || {
            a.metric("vgpu_license_node_condition_errors_total")
                .filter(|n| *n > 0.0)
        },
        || format!("{}\n--- API requests: {:?}", a.context(), api.requests()),
    );
}

/// An API server that redirects elsewhere (here to plain HTTP on the loopback): the agent
/// follows no redirect of the API, so the service account's token goes nowhere else; the
/// write is an error, never counted as done.
#[test]
fn the_api_client_follows_no_redirect() {
    let elsewhere = Server::start(None, |_| ok(b"{}"));
    let api = FakeApi::start(SA_TOKEN, vec![node_object(NODE, vec![])]);
    api.set_mode(ApiMode::RedirectTo(elsewhere.port));
    let (_m, a) = in_pod(&api, "", NODE);
    a.wait_state("licensed", T);
    wait_errors(&a, &api);
    let said = a.journal_lines().join("\n");
    assert!(said.contains("HTTP 307"), "{said}");
    assert!(said.contains("follows none"), "{said}");
    assert!(!said.contains(SA_TOKEN));
    assert!(elsewhere.heads().is_empty(), "{:?}", elsewhere.heads());
    assert!(api.condition(NODE, "VgpuLicensed").is_none());
}

/// The agent's resident memory, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap()
}

/// An answer that never ends, at every try: cut at the cap and refused; the agent stays
/// small however long it goes on.
#[test]
fn an_endless_api_answer_is_cut_and_the_agent_stays_small() {
    let api = FakeApi::start(SA_TOKEN, vec![node_object(NODE, vec![])]);
    api.set_mode(ApiMode::Endless);
    let (_m, a) = in_pod(&api, "", NODE);
    a.wait_state("licensed", T);
    wait_errors(&a, &api);
    // Two tries at least (5 s of backoff between them).
    sim::wait_for(
        "a second try",
        T,
        || {
            (api.requests()
                .iter()
                .filter(|r| r.ends_with("endless"))
                .count()
                >= 2)
                .then_some(())
        },
        || format!("{:?}", api.requests()),
    );
    let rss = rss_kib(a.pid());
    let tries = api
        .requests()
        .iter()
        .filter(|r| r.ends_with("endless"))
        .count();
    println!("agent RSS {rss} KiB after {tries} endless answers");
    assert!(rss < 64 * 1024, "the agent holds {rss} KiB");
    let said = a.journal_lines().join("\n");
    assert!(said.contains("far more than a Node"), "{said}");
}

/// A node name that is no node name (`..` would make the agent GET the list of all Nodes and
/// PATCH a Node named `status`) is refused: at start, from `NODE_NAME`, and by `config check`
/// from the config; nothing is sent.
#[test]
fn a_node_name_that_is_no_node_name_is_refused() {
    let api = FakeApi::start(SA_TOKEN, vec![node_object(NODE, vec![])]);
    let (m, a) = in_pod(&api, "", "..");
    refused_without_a_request(&a, &api, "not a Kubernetes node name");
    drop(a);
    let config = m.config_text();
    m.write_config(&format!("{config}node_name = \".\"\n"));
    let (code, err) = config_check(&m);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("kubernetes.node_name") && err.contains("not a Kubernetes node name"),
        "{err}"
    );
}

/// A kubeconfig in JSON form for `api`, its token in `token_file` where given.
pub(crate) fn kubeconfig(api: &FakeApi, token_file: Option<&std::path::Path>) -> String {
    let user = match token_file {
        Some(f) => serde_json::json!({"tokenFile": f}),
        None => serde_json::json!({"token": SA_TOKEN}),
    };
    use base64::Engine;
    serde_json::json!({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}],
        "clusters": [{"name": "k", "cluster": {
            "server": format!("https://127.0.0.1:{}", api.port()),
            "certificate-authority-data": base64::engine::general_purpose::STANDARD.encode(&api.ca_pem),
        }}],
        "users": [{"name": "u", "user": user}],
    })
    .to_string()
}

/// A kubeconfig tells root where to send a credential and which file to send: one another
/// user owns or may write, or whose `tokenFile` is such a file, is refused (by `config
/// check`, and by the service, which writes nothing), naming the owner or the mode; root's
/// own is used.
#[test]
fn a_kubeconfig_another_user_could_write_is_refused() {
    let api = FakeApi::start(SA_TOKEN, vec![node_object(NODE, vec![])]);
    let m = Machine::new(Setup::default());
    let dir = m.path("kube");
    std::fs::create_dir_all(&dir).unwrap();
    let kc = dir.join("kubeconfig.json");
    let token_file = dir.join("token");
    std::fs::write(&token_file, SA_TOKEN).unwrap();
    let config = m.config_text();
    m.write_config(&format!(
        "{config}[kubernetes]\nkubeconfig = \"{}\"\nnode_name = \"{NODE}\"\nheartbeat_seconds = 5\n",
        kc.display()
    ));
    let check = || config_check(&m);
    let chown = |p: &std::path::Path, uid: u32| {
        nix::unistd::chown(p, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap()
    };
    let mode = |p: &std::path::Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    if !nix::unistd::geteuid().is_root() {
        return skipped("giving a file to another user needs root");
    }
    // Root's own: good.
    std::fs::write(&kc, kubeconfig(&api, Some(&token_file))).unwrap();
    mode(&kc, 0o600);
    let (code, err) = check();
    assert_eq!(code, Some(0), "{err}");
    // Another user's kubeconfig; one writable by others; another user's tokenFile.
    chown(&kc, 1000);
    let (code, err) = check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("owned by uid 1000") && err.contains("kubeconfig"),
        "{err}"
    );
    chown(&kc, 0);
    mode(&kc, 0o666);
    let (code, err) = check();
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("writable by other users"), "{err}");
    mode(&kc, 0o600);
    chown(&token_file, 1000);
    let (code, err) = check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("tokenFile") && err.contains("owned by uid 1000"),
        "{err}"
    );
    assert!(!err.contains(SA_TOKEN));
    // A tokenFile that is another user's link to a file of root's: the link's owner picks
    // which of root's files goes out as the bearer, so the link is judged too.
    chown(&token_file, 0);
    let link = dir.join("token-link");
    std::os::unix::fs::symlink(&token_file, &link).unwrap();
    std::fs::write(&kc, kubeconfig(&api, Some(&link))).unwrap();
    let (code, err) = check();
    assert_eq!(code, Some(0), "{err}");
    nix::unistd::fchownat(
        nix::fcntl::AT_FDCWD,
        &link,
        Some(nix::unistd::Uid::from_raw(1000)),
        None,
        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
    )
    .unwrap();
    let (code, err) = check();
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("is a link owned by uid 1000") && err.contains("tokenFile"),
        "{err}"
    );
    chown(&token_file, 1000);

    // The service with that tokenFile: nothing sent, and said.
    write_gridd_conf(&m);
    m.drop_token(0o744);
    m.start_gridd();
    let a = Agent::start(&m);
    refused_without_a_request(&a, &api, "owned by uid 1000");
}

/// The service's journal holds its own lines: two Node writes through the HTTP client add
/// none of hyper's or reqwest's DEBUG and TRACE lines.
#[test]
fn the_journal_gets_the_agents_lines_not_its_http_clients() {
    let api = FakeApi::start(SA_TOKEN, vec![node_object(NODE, vec![])]);
    let (m, a) = in_pod(&api, "", NODE);
    a.wait_state("licensed", T);
    // The first write and a heartbeat (5 s): two writes at least.
    sim::wait_for(
        "two Node writes",
        T,
        || {
            let writes = api
                .requests()
                .iter()
                .filter(|r| r.starts_with("PATCH") && r.contains(" 200 "))
                .count();
            (writes >= 2).then_some(())
        },
        || format!("{:?}", api.requests()),
    );
    let entries = m.agent_journal(a.pid());
    assert!(!entries.is_empty());
    let foreign: Vec<String> = entries
        .iter()
        .filter(|e| {
            // The agent's own crates: the agent, and the model where its core decides.
            let target = e["TARGET"].as_str().unwrap_or("vgpu_license_agent");
            !target.starts_with("vgpu_license_agent") && !target.starts_with("vgpu_license_model")
        })
        .map(|e| format!("{} {}", e["TARGET"], sim::message(e)))
        .collect();
    assert!(
        foreign.is_empty(),
        "{} lines of libraries: {foreign:#?}",
        foreign.len()
    );
    // The agent's own INFO line is there.
    assert!(
        entries
            .iter()
            .any(|e| sim::message(e).contains("writing the condition VgpuLicensed")),
        "{}",
        a.context()
    );
}

/// A GPU Operator node with its token and gridd.conf, `configure`d, its gridd started.
fn operator_node(configure: impl FnOnce(&Machine)) -> Machine {
    let m = Machine::new(Setup {
        gpu_operator: true,
        ..Setup::default()
    });
    write_gridd_conf(&m);
    configure(&m);
    sim::write_mode(&m.token_path(), &m.token(), 0o644);
    m.start_gridd();
    m
}

/// A GPU Operator node whose driver root holds an nvidia-smi that another user owns (or may
/// write): root would run it by `chroot`. It is not run: `status` and `diagnose` say so with
/// the owner, and the service reports `driver_unavailable` with the owner, in its metrics
/// too; the same nvidia-smi made root's again is run and read.
#[test]
fn a_driver_root_another_user_owns_is_not_run() {
    if !nix::unistd::geteuid().is_root() {
        return skipped("giving a file to another user needs root");
    }
    let m = operator_node(|_| {});
    let sim_dir = m.container_sim().unwrap().to_path_buf();
    let cli = |args: &[&str]| {
        let out = std::process::Command::new(crate::common::BIN)
            .arg("--config")
            .arg(&m.config)
            .args(args)
            .env("SIM_DIR", &sim_dir)
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let smi = m.path("run/nvidia/driver/usr/bin/nvidia-smi");
    let chown =
        |uid: u32| nix::unistd::chown(&smi, Some(nix::unistd::Uid::from_raw(uid)), None).unwrap();
    chown(1000);
    let (code, out) = cli(&["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(code, Some(2), "{v:#}");
    assert_eq!(v["failure"]["reason"], "driver_unavailable", "{v:#}");
    let text = v.to_string();
    assert!(
        text.contains("owned by uid 1000") && text.contains("nvidia-smi is not run"),
        "{v:#}"
    );
    let (_, out) = cli(&["diagnose"]);
    assert!(out.contains("owned by uid 1000"), "{out}");
    let a = Agent::start_with_env(&m, &[("SIM_DIR", sim_dir.as_os_str())]);
    a.wait_status("driver_unavailable", T, |v| {
        v["failure"]["reason"] == "driver_unavailable" && v.to_string().contains("uid 1000")
    });
    sim::wait_for(
        "the failure in the metrics",
        T,
        || {
            (a.metric("vgpu_license_failure{reason=\"driver_unavailable\"}") == Some(1.0))
                .then_some(())
        },
        || a.context(),
    );
    drop(a);
    // Root's again: read, and licensed once gridd's lease comes (the whole test may take
    // less than gridd's first acquisition).
    chown(0);
    let last = std::cell::RefCell::new(String::new());
    sim::wait_for(
        "status licensed once nvidia-smi is root's again",
        T,
        || {
            let (code, out) = cli(&["status", "--json"]);
            let v: serde_json::Value = serde_json::from_str(&out).unwrap();
            last.replace(out);
            (code == Some(0) && v["state"] == "licensed").then_some(())
        },
        || last.borrow().clone(),
    );
}

/// A GPU Operator node whose driver root holds, besides root's own `/usr/bin/nvidia-smi`, a
/// `/usr/local/bin/nvidia-smi` that another user owns, first on the agent's PATH (systemd's
/// PATH puts `/usr/local/bin` first): the agent runs the nvidia-smi it checked, by its path
/// inside the root, never the other one (here `false`, which would read as no driver).
#[test]
fn a_driver_root_runs_the_nvidia_smi_it_checked() {
    if !nix::unistd::geteuid().is_root() {
        return skipped("giving a file to another user needs root");
    }
    // The default: a name, found as the root's files have it.
    let m = operator_node(|m| m.set_config("nvidia_smi", "\"nvidia-smi\""));
    let sim_dir = m.container_sim().unwrap().to_path_buf();
    let local = m.path("run/nvidia/driver/usr/local/bin");
    std::fs::create_dir_all(&local).unwrap();
    let foreign = local.join("nvidia-smi");
    std::fs::copy("/bin/false", &foreign).unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o755)).unwrap();
    let nobody = Some(nix::unistd::Uid::from_raw(65534));
    nix::unistd::chown(&foreign, nobody, None).unwrap();
    nix::unistd::chown(&local, nobody, None).unwrap();
    let last = std::cell::RefCell::new(String::new());
    sim::wait_for(
        "status licensed, read from root's nvidia-smi",
        T,
        || {
            let out = std::process::Command::new(crate::common::BIN)
                .arg("--config")
                .arg(&m.config)
                .args(["status", "--json"])
                .env("SIM_DIR", &sim_dir)
                .env(
                    "PATH",
                    "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin",
                )
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_ne!(v["state"], "no_driver", "the foreign nvidia-smi ran: {v:#}");
            last.replace(text);
            (out.status.code() == Some(0) && v["state"] == "licensed").then_some(())
        },
        || last.borrow().clone(),
    );
}

/// A CA of the test's own: its PEM, and what signs with it.
fn test_ca(name: &str) -> (String, rcgen::Issuer<'static, rcgen::KeyPair>) {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    let pem = params.self_signed(&key).unwrap().pem();
    (pem, rcgen::Issuer::new(params, key))
}

/// A server's TLS config for a certificate made of `params`: signed by `issuer`, or
/// self-signed; and the certificate's PEM.
fn server_tls(
    params: rcgen::CertificateParams,
    issuer: Option<&rcgen::Issuer<'static, rcgen::KeyPair>>,
) -> (String, Arc<rustls::ServerConfig>) {
    use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = match issuer {
        Some(i) => params.signed_by(&key, i).unwrap(),
        None => params.self_signed(&key).unwrap(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .unwrap();
    (cert.pem(), Arc::new(config))
}

/// `install --token-url` against a server whose certificate the agent refuses, as
/// operators give it: the server's own self-signed certificate as the CA, the wrong CA, a
/// certificate for another name, an expired one. Each is one line that says what is wrong
/// and what to do, in words (not rustls' `invalid peer certificate: ...`), at the first
/// attempt (the next would meet the same certificate), and nothing is installed.
#[test]
fn a_refused_server_certificate_is_said_in_words() {
    use rcgen::{BasicConstraints, CertificateParams, IsCa};
    let root = Root::new();
    let for_loopback = || CertificateParams::new(vec!["127.0.0.1".to_string()]).unwrap();
    let (_, ca) = test_ca("the DLS's CA");
    let (other_ca_pem, _) = test_ca("another CA");
    let mut self_signed = for_loopback();
    self_signed.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let (self_signed_pem, self_signed_tls) = server_tls(self_signed, None);
    let (_, signed_tls) = server_tls(for_loopback(), Some(&ca));
    let (right_ca_pem, named_ca) = test_ca("a named CA");
    let (_, localhost_tls) = server_tls(
        CertificateParams::new(vec!["localhost".to_string()]).unwrap(),
        Some(&named_ca),
    );
    let mut old = for_loopback();
    old.not_before = rcgen::date_time_ymd(2020, 1, 1);
    old.not_after = rcgen::date_time_ymd(2021, 1, 1);
    let (_, expired_tls) = server_tls(old, Some(&named_ca));
    let cases: [(&str, Arc<rustls::ServerConfig>, &str, &[&str]); 4] = [
        (
            "self-signed.pem",
            self_signed_tls,
            &self_signed_pem,
            &[
                "presents a CA certificate as its own",
                "--ca-file the CA that signed",
            ],
        ),
        (
            "other-ca.pem",
            signed_tls,
            &other_ca_pem,
            &["is not signed by the CA in --ca-file", "other-ca.pem"],
        ),
        (
            "named-ca.pem",
            localhost_tls,
            &right_ca_pem,
            &["is not made out to 127.0.0.1 but to localhost"],
        ),
        (
            "named-ca2.pem",
            expired_tls,
            &right_ca_pem,
            &["has expired"],
        ),
    ];
    for (file, tls, ca_pem, want) in cases {
        let server = Server::start(Some(tls), |_| ok(b"never"));
        let ca = root.file(file, ca_pem.as_bytes());
        let url = format!("https://127.0.0.1:{}/t.tok", server.port);
        let started = std::time::Instant::now();
        let r = root.run(&[
            "install",
            "--token-url",
            &url,
            "--ca-file",
            ca.to_str().unwrap(),
            "--retries",
            "3",
        ]);
        assert_eq!(r.code, Some(1), "{file}: {}", r.stderr);
        let line = r.error_line();
        for w in want {
            assert!(line.contains(w), "{file}: want {w:?}: {line}");
        }
        assert!(!line.contains("invalid peer certificate"), "{line}");
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{file}: not retried (1 + 2 + 4 s of backoff): {:?}",
            started.elapsed()
        );
        assert!(!root.token_path().exists(), "{file}");
    }
}
