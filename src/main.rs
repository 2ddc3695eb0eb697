//! The thin binary: parse the command line, load the config, dispatch, map to exit codes.

use std::process::ExitCode;

use vgpu_license_agent::cli::{Cli, Command, TokenCommand};
use vgpu_license_agent::cli::{analyze, config, diagnose, install, prepare, status, token};

/// UNKNOWN in the monitoring-plugin convention: the check itself could not run.
const UNKNOWN: u8 = 3;

fn main() -> ExitCode {
    hide_token_url();
    let cli = match Cli::try_parse_named() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            if !e.use_stderr() {
                return ExitCode::SUCCESS; // --help, --version
            }
            // A check called wrongly is UNKNOWN to a monitoring system, not CRITICAL (2).
            let check = std::env::args()
                .skip(1)
                .any(|a| matches!(a.as_str(), "status" | "analyze" | "diagnose"));
            return ExitCode::from(if check { UNKNOWN } else { 2 });
        }
    };
    let check = matches!(
        cli.command,
        Command::Status(_) | Command::Analyze(_) | Command::Diagnose(_)
    );
    if check || matches!(cli.command, Command::Token(_) | Command::Config(_)) {
        quiet_on_closed_pipe();
    }
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes, outermost first.
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            let line = vgpu_license_agent::cli::with_root_hint(
                chain.join(": "),
                vgpu_license_agent::cli::denied(&e),
                nix::unistd::geteuid().is_root(),
            );
            // Escaped: an error may quote a file name, a URL or a line from outside.
            eprintln!(
                "vgpu-license-agent: error: {}",
                vgpu_license_model::text::escape(&line)
            );
            ExitCode::from(if check { UNKNOWN } else { 1 })
        }
    }
}

/// A `--token-url` with a user, a password or a query (a signed URL) would stay readable by
/// every user in `/proc/PID/cmdline` for the whole download: the agent starts itself again
/// at once, the same process, with the URL moved into its environment (readable by its own
/// user alone) and out of its command line. Nothing else changes: the same arguments, in
/// their order, and `--token-url` read from the environment as it already may be.
fn hide_token_url() {
    use std::os::unix::process::CommandExt;
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let Some((at, width, url)) = vgpu_license_agent::cli::token_url_in(&args) else {
        return;
    };
    let Ok(exe) = std::env::current_exe() else {
        return;
    };
    let mut rest = args;
    rest.drain(at..at + width);
    let mut again = std::process::Command::new(exe);
    again
        .arg0(&rest[0])
        .args(&rest[1..])
        .env(vgpu_license_agent::cli::TOKEN_URL_ENV, url);
    // Returns only where the exec failed: the agent goes on with its command line as given.
    let _ = again.exec();
}

/// A command that only reads and prints ends quietly when its reader goes away
/// (`status | head -1`), as `cat` and `grep` do, instead of a panic on the failed write. Not
/// for `run` and `install`, whose work must not stop half way for a closed pipe.
fn quiet_on_closed_pipe() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: the default action installed before any thread is started.
    let _ = unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) };
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = || vgpu_license_agent::config::load(&cli.config);
    cli.named_config_exists()?;
    match &cli.command {
        Command::Analyze(args) => analyze::run(args),
        Command::Token(TokenCommand::Inspect(args)) => token::run(args, &settings()?),
        Command::Install(args) => install::run(args, &settings()?).map(|()| ExitCode::SUCCESS),
        Command::PrepareImage(args) => prepare::run(args, &cli.config).map(|()| ExitCode::SUCCESS),
        Command::CheckIdentity(args) => {
            vgpu_license_agent::identity::run(&settings()?, &args.root).map(|()| ExitCode::SUCCESS)
        }
        Command::Run(args) => {
            vgpu_license_agent::service::run(settings()?, &cli.config, args.log_stderr)
        }
        Command::Config(command) => config::run(command, &cli.config),
        Command::Status(args) => status::run(args, &settings()?),
        Command::Diagnose(args) => diagnose::run(args, &settings()?),
    }
}
