//! A `systemctl` for the simulated machine, where no systemd runs: answers what the agent
//! asks about `nvidia-gridd.service` from the simulated gridd's pid file.
//!
//!     sim-systemctl is-active UNIT      active / inactive / deactivating, activating during a
//!                                       restart (exit 3 unless active)
//!     sim-systemctl list-jobs [--no-legend] UNIT   the restart's job while one runs
//!     sim-systemctl show -P MainPID UNIT
//!     sim-systemctl show -p ActiveState,MainPID UNIT
//!     sim-systemctl restart|start|stop UNIT
//!
//! The sim dir comes from `--sim-dir DIR` or `$SIM_DIR`. Any other unit, and gridd's where
//! the machine has none (`gridd_unit` false), is one systemd does not know: `inactive`,
//! `LoadState=not-found`, and `Unit ... not found.` (exit 5) to restart, start or stop it.

#[path = "shared.rs"]
mod shared;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let dir = shared::sim_dir(&mut args);
    args.retain(|a| {
        !matches!(
            a.as_str(),
            "--no-pager" | "--quiet" | "-q" | "--system" | "--no-legend"
        )
    });
    let has_unit = shared::SimConfig::load(&dir).gridd_unit;
    let is_gridd = |u: &str| has_unit && (u == "nvidia-gridd.service" || u == "nvidia-gridd");
    let unit = args.last().cloned().unwrap_or_default();
    let running = if is_gridd(&unit) {
        shared::running_gridd(&dir)
    } else {
        None
    };
    let verb = args.first().map(String::as_str).unwrap_or("");
    match verb {
        "is-active" => {
            let state = if is_gridd(&unit) {
                shared::unit_state(&dir)
            } else {
                "inactive"
            };
            println!("{state}");
            if state != "active" {
                std::process::exit(3);
            }
        }
        "list-jobs" => {
            if is_gridd(&unit)
                && let Some(job) = shared::start_job(&dir)
            {
                println!("1 nvidia-gridd.service {job} running");
            }
        }
        "show" => {
            let props: Vec<String> = args
                .windows(2)
                .filter(|w| w[0] == "-P" || w[0] == "-p" || w[0] == "--property")
                .flat_map(|w| w[1].split(',').map(String::from).collect::<Vec<_>>())
                .collect();
            let value_only = args.iter().any(|a| a == "-P" || a == "--value");
            for p in props {
                let v = match p.as_str() {
                    "MainPID" => running.unwrap_or(0).to_string(),
                    "ActiveState" => if is_gridd(&unit) {
                        shared::unit_state(&dir)
                    } else {
                        "inactive"
                    }
                    .into(),
                    "SubState" => if running.is_some() { "running" } else { "dead" }.into(),
                    "LoadState" => if is_gridd(&unit) {
                        "loaded"
                    } else {
                        "not-found"
                    }
                    .into(),
                    "NRestarts" => std::fs::read_to_string(dir.join(shared::RESTARTS_FILE))
                        .map(|s| s.lines().count())
                        .unwrap_or(0)
                        .to_string(),
                    _ => String::new(),
                };
                if value_only {
                    println!("{v}");
                } else {
                    println!("{p}={v}");
                }
            }
        }
        "restart" | "start" | "stop" | "try-restart" if is_gridd(&unit) => {
            let r = match verb {
                "stop" => {
                    Ok(shared::stop_gridd(&dir, std::time::Duration::from_secs(5)).unwrap_or(0))
                }
                "start" => match running {
                    Some(p) => Ok(p),
                    None => shared::start_gridd(&dir),
                },
                _ => shared::restart_gridd(&dir),
            };
            if let Err(e) = r {
                eprintln!("Job for {unit} failed: {e}");
                std::process::exit(1);
            }
        }
        "restart" | "start" | "stop" | "try-restart" => {
            // systemd's words and exit code for a unit it has not loaded.
            let unit = if unit.contains('.') {
                unit
            } else {
                format!("{unit}.service")
            };
            eprintln!("Failed to {verb} {unit}: Unit {unit} not found.");
            std::process::exit(5);
        }
        _ => {
            eprintln!("sim-systemctl: not simulated: {}", args.join(" "));
            std::process::exit(1);
        }
    }
}
