//! The simulated `nvidia-smi`: prints the simulated GPUs in the real layout (`-q`, `-q -x`,
//! `-L`, the plain table), their license as the simulated gridd left it in the sim dir's
//! `state.json`. `smi_mode` in `sim.json` makes it hang forever, fail as with no driver,
//! leave a process of another session holding its output (`detached_holder`) or print
//! without end (`endless`);
//! `driver_version` sets the version printed and the wording of an unlicensed GPU (535's
//! plain `Unlicensed`); `gpu_count` the number of vGPUs, `gpu_profiles` their profiles and
//! `unlicensed_gpus` those gridd holds no license for; `platform_licensed` prints
//! `Licensed (Expiry: N/A)`.
//!
//!     sim-nvidia-smi [--sim-dir DIR] [-q [-x]] [-L]

#[path = "shared.rs"]
mod shared;

use std::io::Write;

use chrono::{Local, Utc};
use shared::{GpuState, SimConfig, SimVm, SmiMode};

const NO_DRIVER: &str = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.\n";

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let dir = shared::sim_dir(&mut args);
    let cfg = SimConfig::load(&dir);
    match cfg.smi_mode {
        SmiMode::Hang => loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        },
        SmiMode::NoDriver => {
            print!("{NO_DRIVER}");
            std::process::exit(9);
        }
        SmiMode::DetachedHolder => hold_output_detached(&dir),
        SmiMode::Endless => {
            let _ = std::fs::write(dir.join("smi.pid"), std::process::id().to_string());
        }
        SmiMode::Normal => {}
    }
    let now = Utc::now().timestamp();
    let state = GpuState::load(&dir).unwrap_or(GpuState {
        unlicensed_since: now,
        ..GpuState::default()
    });
    let gpus: Vec<Gpu> = (0..cfg.gpu_count.max(1))
        .map(|i| Gpu::new(&cfg, &state, now, i))
        .collect();
    let smi = Smi {
        driver: cfg.driver_version.clone(),
        cuda: cuda_for(&cfg.driver_version),
        gpus,
    };
    let flags: Vec<&str> = args.iter().map(String::as_str).collect();
    if flags.first() == Some(&"vgpu") {
        vgpu(&cfg, &dir, &flags[1..]);
        return;
    }
    let query = flags.iter().any(|f| matches!(*f, "-q" | "--query"));
    let xml = flags.iter().any(|f| matches!(*f, "-x" | "--xml-format"));
    let known = flags.iter().all(|f| {
        matches!(
            *f,
            "-q" | "--query" | "-x" | "--xml-format" | "-L" | "--list-gpus"
        )
    });
    if !known || (xml && !query) {
        println!("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.");
        std::process::exit(2);
    }
    if flags.iter().any(|f| matches!(*f, "-L" | "--list-gpus")) {
        for (i, gpu) in smi.gpus.iter().enumerate() {
            println!("GPU {i}: {} (UUID: {})", gpu.product, gpu.uuid);
        }
    } else if query && xml {
        print!("{}", smi.xml());
    } else if query && cfg.smi_mode == SmiMode::Endless {
        let text = smi.text();
        let mut out = std::io::stdout().lock();
        // Until the reader goes away (a write error) or the process is killed.
        while out.write_all(text.as_bytes()).is_ok() {}
        std::process::exit(1);
    } else if query {
        print!("{}", smi.text());
    } else {
        print!("{}", smi.table());
    }
}

/// `nvidia-smi vgpu -q` on a host: per physical GPU, its active vGPUs, each VM's as
/// smi-host-vgpu-q-two-vms.txt (580, SR-IOV) prints them. A guest's nvidia-smi has no vGPU
/// of its own to list: no sample shows what it says, so it is refused as an unknown option.
fn vgpu(cfg: &SimConfig, dir: &std::path::Path, flags: &[&str]) {
    if !cfg.host || !matches!(flags, ["-q"] | ["--query"]) {
        println!("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help.");
        std::process::exit(2);
    }
    let kv = |indent: usize, k: &str, v: &str| {
        let key = format!("{}{k}", " ".repeat(indent));
        format!("{key:<42}: {v}\n")
    };
    let vms = SimVm::load_all(dir);
    let mut s = format!("GPU {}\n", cfg.bus_id);
    s += &kv(4, "Active vGPUs", &vms.len().to_string());
    for (i, vm) in vms.iter().enumerate() {
        let (driver, status) = vm.guest_columns();
        s += &kv(4, "vGPU ID", &vm.vgpu_id);
        s += &kv(8, "VM UUID", &vm.vm_uuid);
        s += &kv(8, "VM Name", &vm.vm_name);
        s += &kv(8, "vGPU Name", &vm.profile);
        s += &kv(8, "vGPU Type", "1519");
        s += &kv(8, "vGPU UUID", &vm.vgpu_uuid);
        s += &kv(8, "Guest Driver Version", &driver);
        s += &kv(8, "License Status", &status);
        s += &kv(8, "GPU Instance ID", "N/A");
        s += &kv(8, "Placement ID", &(i * 3).to_string());
        s += "        PCI\n";
        s += &kv(12, "Bus Id", &format!("00000000:00:{:02x}.0", i * 5));
        s += "        FB Memory Usage\n";
        s += &kv(12, "Total", "3072 MiB");
        s += &kv(12, "Used", "128 MiB");
        s += &kv(12, "Free", "2944 MiB");
        s += "        Utilization\n";
        for k in ["GPU", "Memory", "Encoder", "Decoder"] {
            s += &kv(12, k, "0 %");
        }
    }
    print!("{s}");
}

/// Starts `sleep` in a session of its own (as a daemon that nvidia-smi started would be),
/// inheriting standard output and error: the pipe stays open after nvidia-smi exits, and no
/// kill of nvidia-smi's process group reaches it. Its pid is appended to `holders` in the
/// sim dir, for the test to end it.
fn hold_output_detached(dir: &std::path::Path) {
    use std::os::unix::process::CommandExt;
    let mut cmd = std::process::Command::new("sleep");
    cmd.arg("300");
    // SAFETY: only setsid(2), async-signal-safe, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid()
                .map(drop)
                .map_err(std::io::Error::from)
        });
    }
    match cmd.spawn() {
        Ok(child) => {
            let line = format!("{}\n", child.id());
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("holders"))
                .and_then(|mut f| f.write_all(line.as_bytes()));
            if let Err(e) = appended {
                eprintln!("sim-nvidia-smi: cannot record the holder: {e}");
            }
        }
        Err(e) => {
            eprintln!("sim-nvidia-smi: cannot start the holder: {e}");
            std::process::exit(3);
        }
    }
}

/// The CUDA version a driver prints beside its own (the samples' pairs: 510.47.03 with 11.6,
/// 535.183.06 with 12.2; no sample shows 550, whose 550.90.07 came with CUDA 12.4).
fn cuda_for(driver: &str) -> &'static str {
    match driver.split('.').next() {
        Some("510") => "11.6",
        Some("535") => "12.2",
        _ => "12.4",
    }
}

struct Smi {
    driver: String,
    cuda: &'static str,
    gpus: Vec<Gpu>,
}

struct Gpu {
    bus_id: String,
    product: String,
    brand: String,
    uuid: String,
    mode: &'static str,
    /// Edition and License Status, where there is a license section.
    license: Option<(String, String)>,
}

/// The `i`th GPU's bus id: the configured one, then the next PCI devices (`...:02:02.0`).
fn bus_id(first: &str, i: u32) -> String {
    if i == 0 {
        return first.to_string();
    }
    let (head, rest) = first.rsplit_once(':').unwrap_or(("00000000:02", "01.0"));
    let dev = rest
        .split('.')
        .next()
        .and_then(|d| u32::from_str_radix(d, 16).ok())
        .unwrap_or(1);
    format!("{head}:{:02X}.0", dev + i)
}

/// The `i`th vGPU's license: gridd's, unless it holds none for this one
/// (`unlicensed_gpus`).
fn gpu_state(cfg: &SimConfig, state: &GpuState, i: u32) -> GpuState {
    if cfg.unlicensed_gpus.contains(&i) {
        GpuState {
            licensed: false,
            expiry: None,
            ..state.clone()
        }
    } else {
        state.clone()
    }
}

impl Gpu {
    fn new(cfg: &SimConfig, state: &GpuState, now: i64, i: u32) -> Gpu {
        let bus = bus_id(&cfg.bus_id, i);
        if cfg.host {
            // The physical GPU under the vGPU manager: no license of its own.
            let product = cfg
                .profile
                .rsplit_once('-')
                .map_or(cfg.profile.clone(), |(p, _)| p.to_string());
            return Gpu {
                bus_id: bus,
                product,
                brand: "NVIDIA".into(),
                uuid: format!("GPU-9d2c81f0-6b3e-4a57-8c1d-0e4f7a2b5c{:02x}", 0x10 + i),
                mode: "Host VGPU",
                license: None,
            };
        }
        if cfg.passthrough {
            let product = cfg
                .profile
                .rsplit_once('-')
                .map_or(cfg.profile.clone(), |(p, _)| p.to_string());
            return Gpu {
                bus_id: bus,
                product,
                brand: "NVIDIA".into(),
                uuid: format!("GPU-7e1b8d52-4c1a-5f0e-9a3b-2d6f8c0e1a{:02x}", 0x44 + i),
                mode: "Pass-Through",
                license: None,
            };
        }
        let edition = shared::edition_of(cfg.gpu_profile(i));
        Gpu {
            bus_id: bus,
            product: cfg.gpu_profile(i).to_string(),
            brand: edition.clone(),
            uuid: format!("GPU-62f13b27-1eda-11b2-a8b5-0869ebe252{:02x}", 0x64 + i),
            mode: "VGPU",
            license: Some((edition, gpu_state(cfg, state, i).license_status(cfg, now))),
        }
    }

    fn text(&self) -> String {
        let kv = |indent: usize, k: &str, v: &str| {
            let key = format!("{}{k}", " ".repeat(indent));
            format!("{key:<42}: {v}\n")
        };
        let head = |indent: usize, k: &str| format!("{}{k}\n", " ".repeat(indent));
        let mut s = String::new();
        s += &format!("GPU {}\n", self.bus_id);
        s += &kv(4, "Product Name", &self.product);
        s += &kv(4, "Product Brand", &self.brand);
        s += &kv(4, "Product Architecture", "Ada Lovelace");
        s += &kv(4, "Display Mode", "Enabled");
        s += &kv(4, "Display Active", "Disabled");
        s += &kv(4, "Persistence Mode", "Enabled");
        s += &kv(4, "Addressing Mode", "None");
        s += &head(4, "MIG Mode");
        s += &kv(8, "Current", "Disabled");
        s += &kv(8, "Pending", "Disabled");
        s += &kv(4, "Accounting Mode", "Disabled");
        s += &kv(4, "Accounting Mode Buffer Size", "4000");
        s += &head(4, "Driver Model");
        s += &kv(8, "Current", "N/A");
        s += &kv(8, "Pending", "N/A");
        s += &kv(4, "Serial Number", "N/A");
        s += &kv(4, "GPU UUID", &self.uuid);
        s += &kv(4, "Minor Number", "0");
        s += &kv(4, "VBIOS Version", "00.00.00.00.00");
        s += &kv(4, "MultiGPU Board", "No");
        s += &kv(4, "Board ID", "0x201");
        s += &kv(4, "Board Part Number", "N/A");
        s += &kv(4, "GPU Part Number", "26B9-890-A1");
        s += &kv(4, "FRU Part Number", "N/A");
        s += &kv(4, "Module ID", "N/A");
        s += &head(4, "Inforom Version");
        s += &kv(8, "Image Version", "N/A");
        s += &kv(8, "OEM Object", "N/A");
        s += &kv(8, "ECC Object", "N/A");
        s += &kv(8, "Power Management Object", "N/A");
        s += &head(4, "Inforom BBX Object Flush");
        s += &kv(8, "Latest Timestamp", "N/A");
        s += &kv(8, "Latest Duration", "N/A");
        s += &head(4, "GPU Operation Mode");
        s += &kv(8, "Current", "N/A");
        s += &kv(8, "Pending", "N/A");
        s += &kv(4, "GSP Firmware Version", "N/A");
        s += &head(4, "GPU Virtualization Mode");
        s += &kv(8, "Virtualization Mode", self.mode);
        s += &kv(
            8,
            "Host VGPU Mode",
            if self.mode == "Host VGPU" {
                "SR-IOV"
            } else {
                "N/A"
            },
        );
        s += &kv(8, "vGPU Heterogeneous Mode", "N/A");
        if let Some((edition, status)) = &self.license {
            s += &head(4, "vGPU Software Licensed Product");
            s += &kv(8, "Product Name", edition);
            s += &kv(8, "License Status", status);
        }
        s += &head(4, "PCI");
        s += &kv(8, "Bus", "0x02");
        s += &kv(8, "Device", "0x01");
        s += &kv(8, "Domain", "0x0000");
        s += &kv(8, "Device Id", "0x26B910DE");
        s += &kv(8, "Bus Id", &self.bus_id);
        s += &kv(4, "Fan Speed", "N/A");
        s += &kv(4, "Performance State", "P0");
        s += &head(4, "FB Memory Usage");
        s += &kv(8, "Total", "24576 MiB");
        s += &kv(8, "Reserved", "1650 MiB");
        s += &kv(8, "Used", "0 MiB");
        s += &kv(8, "Free", "22925 MiB");
        s += &kv(4, "Compute Mode", "Default");
        s += "\n";
        s
    }

    fn xml(&self) -> String {
        let mut s = String::new();
        s += &format!("\t<gpu id=\"{}\">\n", self.bus_id);
        s += &format!("\t\t<product_name>{}</product_name>\n", self.product);
        s += &format!("\t\t<product_brand>{}</product_brand>\n", self.brand);
        s += "\t\t<product_architecture>Ada Lovelace</product_architecture>\n";
        s += "\t\t<display_mode>Enabled</display_mode>\n";
        s += "\t\t<persistence_mode>Enabled</persistence_mode>\n";
        s += &format!("\t\t<uuid>{}</uuid>\n", self.uuid);
        s += "\t\t<gpu_virtualization_mode>\n";
        s += &format!(
            "\t\t\t<virtualization_mode>{}</virtualization_mode>\n",
            self.mode
        );
        s += "\t\t\t<host_vgpu_mode>N/A</host_vgpu_mode>\n";
        s += "\t\t\t<vgpu_heterogeneous_mode>N/A</vgpu_heterogeneous_mode>\n";
        s += "\t\t</gpu_virtualization_mode>\n";
        if let Some((edition, status)) = &self.license {
            s += "\t\t<vgpu_software_licensed_product>\n";
            s += &format!("\t\t\t<licensed_product_name>{edition}</licensed_product_name>\n");
            s += &format!("\t\t\t<license_status>{status}</license_status>\n");
            s += "\t\t</vgpu_software_licensed_product>\n";
        }
        s += "\t\t<pci>\n";
        s += &format!("\t\t\t<pci_bus_id>{}</pci_bus_id>\n", self.bus_id);
        s += "\t\t</pci>\n";
        s += "\t</gpu>\n\n";
        s
    }
}

impl Smi {
    fn text(&self) -> String {
        let kv = |k: &str, v: &str| format!("{k:<42}: {v}\n");
        let mut s = String::new();
        s += "\n==============NVSMI LOG==============\n\n";
        s += &kv(
            "Timestamp",
            &Local::now().format("%a %b %d %H:%M:%S %Y").to_string(),
        );
        s += &kv("Driver Version", &self.driver);
        s += &kv("CUDA Version", self.cuda);
        s += "\n";
        s += &kv("Attached GPUs", &self.gpus.len().to_string());
        for g in &self.gpus {
            s += &g.text();
        }
        s
    }

    fn xml(&self) -> String {
        let mut s = String::new();
        s += "<?xml version=\"1.0\" ?>\n";
        s += "<!DOCTYPE nvidia_smi_log SYSTEM \"nvsmi_device_v12.dtd\">\n";
        s += "<nvidia_smi_log>\n";
        s += &format!(
            "\t<timestamp>{}</timestamp>\n",
            Local::now().format("%a %b %d %H:%M:%S %Y")
        );
        s += &format!("\t<driver_version>{}</driver_version>\n", self.driver);
        s += &format!("\t<cuda_version>{}</cuda_version>\n", self.cuda);
        s += &format!("\t<attached_gpus>{}</attached_gpus>\n", self.gpus.len());
        for g in &self.gpus {
            s += &g.xml();
        }
        s += "</nvidia_smi_log>\n";
        s
    }

    fn table(&self) -> String {
        let now = Local::now().format("%a %b %e %H:%M:%S %Y");
        let (driver, cuda) = (&self.driver, self.cuda);
        let mut s = format!(
            "{now}       \n\
+-----------------------------------------------------------------------------------------+\n\
| NVIDIA-SMI {driver}              Driver Version: {driver}      CUDA Version: {cuda}     |\n\
|-----------------------------------------+------------------------+----------------------+\n\
| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |\n\
| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |\n\
|=========================================+========================+======================|\n"
        );
        for (i, g) in self.gpus.iter().enumerate() {
            s += &format!(
                "|   {i}  {:<20}           On  | {:<16} On |                    0 |\n\
| N/A   N/A    P0            N/A /  N/A   |       0MiB /  24576MiB |      0%      Default |\n\
+-----------------------------------------+------------------------+----------------------+\n",
                g.product, g.bus_id
            );
        }
        s
    }
}
