//! The thin binary: parse the command line, load the config, dispatch, map to exit codes.

use std::process::ExitCode;

use clap::Parser;
use vgpu_license_agent::cli::{Cli, Command, TokenCommand};
use vgpu_license_agent::config::Settings;
use vgpu_license_agent::{analyze, install, prepare, token_inspect};

fn main() -> ExitCode {
    let cli = Cli::parse();
    match dispatch(cli) {
        Ok(code) => code,
        Err(e) => {
            // One line: the error and its causes, outermost first.
            let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
            eprintln!("vgpu-license-agent: error: {}", chain.join(": "));
            ExitCode::from(match e.downcast_ref::<analyze::InputError>() {
                Some(_) => 3,
                None => 1,
            })
        }
    }
}

fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = || Settings::load(&cli.config);
    match &cli.command {
        Command::Analyze(args) => analyze::run(args),
        Command::Token(TokenCommand::Inspect(args)) => token_inspect::run(args, &settings()?),
        Command::Install(args) => install::run(args, &settings()?).map(|()| ExitCode::SUCCESS),
        Command::PrepareImage(args) => prepare::run(args, &settings()?).map(|()| ExitCode::SUCCESS),
        Command::Run => vgpu_license_agent::service::run(settings()?, &cli.config),
        Command::Status(args) => vgpu_license_agent::status::run(args, &settings()?),
        Command::Diagnose(args) => vgpu_license_agent::diagnose::run(args, &settings()?),
    }
}
