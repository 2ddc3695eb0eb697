//! A fake root for running the real binary: a temporary directory whose paths the agent's
//! config points into, a restart command that counts restarts, and a token builder.

#![allow(dead_code)]

pub mod sim;

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const BIN: &str = env!("CARGO_BIN_EXE_vgpu-license-agent");

/// Makes the file at `path` a program with `mode`: copied by a `cp` of its own to a new file
/// that replaces it. A file this process wrote cannot be run safely at once: every test runs
/// in this one process, and a child that another test's thread forks meanwhile holds the
/// writing descriptor until it executes, which makes running the file fail ("Text file
/// busy"). The copy was only ever open in `cp`.
pub fn set_program_mode(path: &Path, mode: u32) {
    let copy = path.with_file_name(format!(
        ".{}.program",
        path.file_name().unwrap().to_string_lossy()
    ));
    let st = Command::new("cp")
        .arg("--")
        .arg(path)
        .arg(&copy)
        .status()
        .expect("cp runs");
    assert!(st.success(), "cp {} {}", path.display(), copy.display());
    fs::set_permissions(&copy, fs::Permissions::from_mode(mode)).unwrap();
    fs::rename(&copy, path).unwrap();
}

/// [`set_program_mode`] 0755.
pub fn make_executable(path: &Path) {
    set_program_mode(path, 0o755);
}

/// A client configuration token with the structure of a real one; `exp` and `nbf` as given,
/// `jti` to make tokens differ.
pub fn token(jti: &str, nbf: i64, exp: i64) -> Vec<u8> {
    vgpu_license_model::token::testing::token_with(jti, nbf, exp).into_bytes()
}

/// A token valid from 2023 to 2035.
pub fn valid_token(jti: &str) -> Vec<u8> {
    token(jti, 1_700_000_000, 2_078_691_200)
}

/// The part of a token that must never show in any output: its payload and signature.
pub fn secret_parts(token: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(token);
    text.split('.')
        .skip(1)
        .map(|p| p[..p.len().min(24)].to_string())
        .collect()
}

pub struct Root {
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    /// Tokens whose content must never be printed.
    pub secrets: Vec<Vec<u8>>,
}

pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Run {
    /// The one error line, checked to be the only line on stderr.
    pub fn error_line(&self) -> &str {
        let lines: Vec<&str> = self.stderr.lines().collect();
        assert_eq!(lines.len(), 1, "stderr must be one line: {:?}", self.stderr);
        assert!(
            lines[0].starts_with("vgpu-license-agent: error: "),
            "{:?}",
            lines[0]
        );
        lines[0]
    }
}

impl Root {
    pub fn new() -> Root {
        Root::with_config("")
    }

    /// A fake root; `extra` is appended to the generated config (e.g. a `[commands]` line).
    pub fn with_config(extra: &str) -> Root {
        let dir = tempfile::tempdir().unwrap();
        let r = dir.path().to_path_buf();
        let config = r.join("agent/config.toml");
        fs::create_dir_all(config.parent().unwrap()).unwrap();
        let restart = r.join("restart.sh");
        fs::write(
            &restart,
            format!(
                "#!/bin/sh\necho restart >> {}\n",
                r.join("restarts").display()
            ),
        )
        .unwrap();
        make_executable(&restart);
        let root = Root {
            config,
            dir,
            secrets: Vec::new(),
        };
        root.write_config(&format!(
            "{paths}\
             [commands]\n\
             restart_gridd = [\"{restart}\"]\n\
             nvidia_smi = \"{r}/no-nvidia-smi\"\n\
             timeout_seconds = 10\n{extra}",
            paths = paths_toml(&r),
            r = r.display(),
            restart = restart.display(),
        ));
        root
    }

    pub fn write_config(&self, text: &str) {
        fs::write(&self.config, text).unwrap();
    }

    /// Adds a drop-in to the agent's config.
    pub fn dropin(&self, name: &str, text: &str) {
        let d = self.config.parent().unwrap().join("config.d");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join(name), text).unwrap();
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    pub fn token_dir(&self) -> PathBuf {
        self.path("etc/nvidia/ClientConfigToken")
    }

    pub fn token_path(&self) -> PathBuf {
        self.token_dir().join("client_configuration_token.tok")
    }

    pub fn gridd_conf(&self) -> PathBuf {
        self.path("etc/nvidia/gridd.conf")
    }

    pub fn state_dir(&self) -> PathBuf {
        self.path("var/lib/vgpu-license-agent")
    }

    pub fn restarts(&self) -> usize {
        fs::read_to_string(self.path("restarts"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Writes a file (creating its directory), for a token file to install.
    pub fn file(&self, rel: &str, bytes: &[u8]) -> PathBuf {
        let p = self.path(rel);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(&p, bytes).unwrap();
        p
    }

    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(BIN);
        self.agent_env(c.args(args));
        c
    }

    /// The agent's environment for this root: its config, no fault injected, no input.
    fn agent_env<'c>(&self, c: &'c mut Command) -> &'c mut Command {
        c.env("VGPU_LICENSE_AGENT_CONFIG", &self.config)
            .env_remove("VGPU_LICENSE_AGENT_FAULT")
            .stdin(Stdio::null())
    }

    pub fn run(&self, args: &[&str]) -> Run {
        self.finish(self.cmd(args).output().unwrap())
    }

    /// [`Root::run`] in a PID namespace of its own, with its own /proc (`unshare`, in a user
    /// namespace where the tests do not run as root): the agent sees its own processes
    /// alone, not an nvidia-gridd that runs elsewhere on this machine (a boot test's guest).
    pub fn run_own_pids(&self, args: &[&str]) -> Run {
        let mut c = Command::new("unshare");
        if !nix::unistd::geteuid().is_root() {
            c.args(["--user", "--map-root-user"]);
        }
        self.agent_env(c.args(["--pid", "--fork", "--mount-proc", BIN]).args(args));
        self.finish(c.output().expect("unshare (util-linux) runs"))
    }

    pub fn run_stdin(&self, args: &[&str], input: &[u8]) -> Run {
        let mut child = self
            .cmd(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = stdin.write_all(&input);
        });
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        self.finish(out)
    }

    pub fn finish(&self, out: Output) -> Run {
        let run = Run {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        };
        for t in &self.secrets {
            for part in secret_parts(t) {
                assert!(
                    !run.stdout.contains(&part) && !run.stderr.contains(&part),
                    "token content printed: {}{}",
                    run.stdout,
                    run.stderr
                );
            }
        }
        run
    }

    /// Installs `token` from a file; asserts success.
    pub fn install_ok(&mut self, token: &[u8], extra: &[&str]) -> Run {
        self.secrets.push(token.to_vec());
        let f = self.file("in/token.tok", token);
        let mut args = vec!["install", "--token-file", f.to_str().unwrap()];
        args.extend_from_slice(extra);
        let r = self.run(&args);
        assert_eq!(r.code, Some(0), "{}{}", r.stdout, r.stderr);
        r
    }

    /// The installed token and gridd.conf, byte for byte (`None` where missing).
    pub fn snapshot(&self) -> (Option<Vec<u8>>, Option<Vec<u8>>) {
        (
            fs::read(self.token_path()).ok(),
            fs::read(self.gridd_conf()).ok(),
        )
    }

    /// Names in the token directory.
    pub fn token_dir_names(&self) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(self.token_dir())
            .map(|rd| {
                rd.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }
}

pub fn mode(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

/// A tmpfs mounted for a test, unmounted when dropped. `None` where mounting is not allowed
/// (not root, or no CAP_SYS_ADMIN).
pub struct Mount(PathBuf);

impl Mount {
    pub fn tmpfs(at: &Path, options: &str) -> Option<Mount> {
        fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(at)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Mount(at.to_path_buf()))
    }

    pub fn remount(&self, options: &str) -> bool {
        Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.0)
            .status()
            .is_ok_and(|s| s.success())
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// The `[paths]` table of a config whose every path lies below the temporary root `r`, laid
/// out as on a guest. The guest's PCI bus (`r/sys/bus/pci/devices`) is made too, with one
/// vGPU on it as sysfs shows one: the test machine's own bus has no NVIDIA device.
pub fn paths_toml(r: &Path) -> String {
    pci_device(r, "0000:02:01.0", Some("nvidia"));
    format!(
        "[paths]\n\
         token_dir = \"{r}/etc/nvidia/ClientConfigToken\"\n\
         gridd_conf = \"{r}/etc/nvidia/gridd.conf\"\n\
         state_dir = \"{r}/var/lib/vgpu-license-agent\"\n\
         status_file = \"{r}/run/vgpu-license-agent/status.json\"\n\
         metrics_textfile = \"{r}/var/lib/prometheus/node-exporter/vgpu_license_agent.prom\"\n\
         gridd_client_state = [\"{r}/var/lib/nvidia/GridLicensing\", \"{r}/var/lib/nvidia/vGPULicensing\"]\n\
         pci_devices = \"{r}/sys/bus/pci/devices\"\n",
        r = r.display()
    )
}

/// A part of a test that this machine cannot run, and why. With `VGPU_TESTS_NO_SKIP=1` (CI
/// sets it) the test fails: a skip must never read as a pass there. Without it the skip is
/// said on stderr, written past the test harness (which hides a passing test's output), and
/// appended to the file `VGPU_TESTS_SKIP_LOG` names, for tests/all.sh's summary.
pub fn skipped(why: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("test");
    if std::env::var_os("VGPU_TESTS_NO_SKIP").is_some_and(|v| v == "1") {
        panic!("{test}: cannot run here: {why} (VGPU_TESTS_NO_SKIP=1: a skip is a failure)");
    }
    let line = format!("!!!!!!!! SKIPPED: {test}: {why} !!!!!!!!\n");
    let _ = std::io::stderr().write_all(line.as_bytes());
    if let Some(log) = std::env::var_os("VGPU_TESTS_SKIP_LOG")
        && let Ok(mut f) = fs::OpenOptions::new().create(true).append(true).open(log)
    {
        let _ = f.write_all(line.as_bytes());
    }
}

/// Reads an HTTP request's head (up to the blank line) from `r`; `None` when the peer closed
/// or failed first.
pub fn read_request_head(r: &mut impl std::io::Read) -> Option<Vec<u8>> {
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match r.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(n) => head.extend_from_slice(&chunk[..n]),
        }
    }
    Some(head)
}

/// An NVIDIA display device (vendor 0x10de, class 0x0302: a 3D controller, as a vGPU shows)
/// on the fake PCI bus below `r`, with `driver` bound (`None`: none, as after a kernel update
/// that the module was not built for).
pub fn pci_device(r: &Path, address: &str, driver: Option<&str>) {
    let bus = r.join("sys/bus/pci");
    let dev = bus.join("devices").join(address);
    fs::create_dir_all(&dev).unwrap();
    fs::write(dev.join("vendor"), "0x10de\n").unwrap();
    fs::write(dev.join("class"), "0x030200\n").unwrap();
    let _ = fs::remove_file(dev.join("driver"));
    if let Some(d) = driver {
        let target = bus.join("drivers").join(d);
        fs::create_dir_all(&target).unwrap();
        std::os::unix::fs::symlink(&target, dev.join("driver")).unwrap();
    }
}

/// The fake PCI bus below `r` without any NVIDIA device (a VM of the image without a vGPU).
pub fn no_pci_gpu(r: &Path) {
    let devs = r.join("sys/bus/pci/devices");
    let _ = fs::remove_dir_all(&devs);
    fs::create_dir_all(devs.join("0000:00:01.0")).unwrap();
    fs::write(devs.join("0000:00:01.0/vendor"), "0x1af4\n").unwrap();
    fs::write(devs.join("0000:00:01.0/class"), "0x020000\n").unwrap();
}
