//! Restarts the simulated nvidia-gridd as `systemctl restart nvidia-gridd` would: SIGTERM to
//! the running one (it logs `Shutdown (PID)`; SIGKILL after 5 s), then a new one, detached,
//! and a line appended to the sim dir's `restarts` file so that tests can count restarts.
//!
//!     sim-restart-gridd [--sim-dir DIR]           restart (counted)
//!     sim-restart-gridd [--sim-dir DIR] --start   start one if none runs (not counted)
//!     sim-restart-gridd [--sim-dir DIR] --stop    stop it (not counted)
//!
//! The sim dir may also be given as the only other argument.

#[path = "shared.rs"]
mod shared;

use std::path::PathBuf;
use std::time::Duration;

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let mut action = "restart";
    args.retain(|a| match a.as_str() {
        "--start" => {
            action = "start";
            false
        }
        "--stop" => {
            action = "stop";
            false
        }
        _ => true,
    });
    let mut dir = shared::sim_dir(&mut args);
    if args.len() == 1 && !args[0].starts_with('-') {
        dir = PathBuf::from(args.remove(0));
    }
    if !args.is_empty() {
        eprintln!("usage: sim-restart-gridd [--sim-dir DIR] [--start|--stop] [DIR]");
        std::process::exit(2);
    }
    let result = match action {
        "start" => match shared::running_gridd(&dir) {
            Some(pid) => Ok(pid),
            None => shared::start_gridd(&dir),
        },
        "stop" => Ok(shared::stop_gridd(&dir, Duration::from_secs(5)).unwrap_or(0)),
        _ => shared::restart_gridd(&dir),
    };
    match result {
        Ok(pid) => println!("{pid}"),
        Err(e) => {
            eprintln!("sim-restart-gridd: {e}");
            std::process::exit(1);
        }
    }
}
