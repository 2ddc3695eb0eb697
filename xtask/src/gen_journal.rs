//! Writes a synthetic `journalctl -o json` export for the benchmark: mostly other units'
//! entries, a few percent nvidia-gridd's, covering every kind of gridd event.
//!
//! `cargo xtask gen-journal [SIZE_MB] [GRIDD_PERCENT] > journal.json` (1024 MiB, 3 % by default)

use std::io::{self, BufWriter, Write};

const GRIDD: &[&str] = &[
    "Started (3239)",
    "vGPU Software package (0)",
    "Ignore service provider and node-locked licensing",
    "NLS initialized",
    "Configuration parameter ( ServerAddress  ) not set",
    "Acquiring license. (Info: dls.example.internal; NVIDIA RTX Virtual Workstation)",
    "Failed to acquire license from dls.example.internal (Info: NVIDIA RTX Virtual Workstation - Error: Clock windback has been detected)",
    "Failed to acquire license from dls.example.internal (Info: NVIDIA RTX Virtual Workstation - Error: No pool features found for : NVIDIA RTX Virtual Workstation)",
    "Failed to update local trusted store - Maximum buffer size exceeded",
    "Failed to register client (2)",
    "Failed to acquire license from dls.example.internal",
    "Unable to fetch the client configuration token file",
    "Failed to decode signature from token received",
    "Failed to setup cloud License Manager: 3",
    "Valid GRID license not found. GPU features and performance will be restricted. To enable full functionality please configure licensing details.",
    "Mismatch between client and server with respect to licenses held. Returning the licenses",
    "Failed to return license to dls.example.internal (Error: Generic network communication failure)",
    "License returned successfully. (Info: dls.example.internal)",
    "Licensing not supported for GPUs in the system",
    "Invalid feature type requested",
    "License acquired successfully. (Info: dls.example.internal, NVIDIA RTX Virtual Workstation; Expiry: 2031-4-3 19:11:16 GMT)",
    "License renewed successfully. (Info: dls.example.internal, NVIDIA RTX Virtual Workstation; Expiry: 2031-4-4 19:11:16 GMT)",
    "Shutdown (3239)",
];

const OTHERS: &[(&str, &str, &str)] = &[
    ("systemd", "1", "Started Session 42 of User ubuntu."),
    (
        "sshd",
        "8812",
        "Accepted publickey for ubuntu from 10.0.0.1 port 52144 ssh2: ED25519 SHA256:AbCdEf",
    ),
    (
        "kernel",
        "",
        "nvidia 0000:02:01.0: enabling device (0000 -> 0003)",
    ),
    (
        "containerd",
        "1022",
        "time=\"2026-11-29T18:00:00Z\" level=info msg=\"loading plugin\" type=io.containerd.grpc.v1",
    ),
    (
        "cron",
        "733",
        "(root) CMD (command -v debian-sa1 > /dev/null && debian-sa1 1 1)",
    ),
    (
        "systemd-resolved",
        "511",
        "Using degraded feature set UDP instead of UDP+EDNS0 for DNS server 10.0.0.2.",
    ),
];

fn entry(out: &mut impl Write, us: u64, comm: &str, pid: &str, msg: &str) -> io::Result<()> {
    write!(
        out,
        "{{\"__CURSOR\":\"s=6b1c2d;i={us:x};b=4f3e;m=1a2b;t={us:x};x=9f8e7d6c5b4a\",\
\"__REALTIME_TIMESTAMP\":\"{us}\",\"__MONOTONIC_TIMESTAMP\":\"{mono}\",\
\"_BOOT_ID\":\"4f3e2d1c0b0a09080706050403020100\",\"PRIORITY\":\"6\",\
\"SYSLOG_FACILITY\":\"3\",\"_UID\":\"0\",\"_GID\":\"0\",\
\"_MACHINE_ID\":\"0123456789abcdef0123456789abcdef\",\"_HOSTNAME\":\"vgpu-guest\",\
\"_TRANSPORT\":\"syslog\",\"SYSLOG_IDENTIFIER\":\"{comm}\",\"_COMM\":\"{comm}\",\
\"_EXE\":\"/usr/bin/{comm}\",\"_CMDLINE\":\"/usr/bin/{comm}\",\
\"_SYSTEMD_CGROUP\":\"/system.slice/{comm}.service\",\"_SYSTEMD_UNIT\":\"{comm}.service\",\
\"_PID\":\"{pid}\",\"MESSAGE\":{msg}}}",
        mono = us / 7,
        msg = serde_json::Value::from(msg),
    )?;
    out.write_all(b"\n")
}

/// Writes about `mb` MiB of entries to standard output, `percent` % of them gridd's.
pub fn run(mb: u64, percent: u64) -> io::Result<()> {
    let target = mb << 20;
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 20, stdout.lock());
    let mut written = 0u64;
    let mut us = 1_764_000_000_000_000u64;
    let mut i = 0u64;
    let mut buf = Vec::with_capacity(2048);
    while written < target {
        buf.clear();
        us += 250_000;
        if (i * 7919) % 100 < percent {
            let msg = GRIDD[(i / 100) as usize % GRIDD.len()];
            entry(&mut buf, us, "nvidia-gridd", "3239", msg)?;
        } else {
            let (comm, pid, msg) = OTHERS[i as usize % OTHERS.len()];
            entry(&mut buf, us, comm, pid, msg)?;
        }
        out.write_all(&buf)?;
        written += buf.len() as u64;
        i += 1;
    }
    out.flush()
}
