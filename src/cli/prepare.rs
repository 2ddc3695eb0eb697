//! `prepare-image`: a guest (or a mounted image) made ready to be a golden image, each change
//! printed; a failure when a copy of the token is still in it.

use std::path::Path;

use anyhow::anyhow;

use crate::cli::PrepareImageArgs;
use crate::image::{Request, prepare, settings_under};

/// `vgpu-license-agent prepare-image`; `config` is the agent's config file (taken below
/// `--root` when given).
pub fn run(args: &PrepareImageArgs, config: &Path) -> anyhow::Result<()> {
    let (settings, config) = match &args.root {
        Some(root) => (
            settings_under(root, config)?,
            root.join(config.strip_prefix("/").unwrap_or(config)),
        ),
        None => (crate::config::load(config)?, config.to_path_buf()),
    };
    let req = Request {
        purge_client_state: args.purge_client_state,
        dry_run: args.dry_run,
        cloud_init: args.cloud_init,
        journal: args.journal,
        root: args.root.clone(),
    };
    let done = prepare(&settings, &req, &config)?;
    for line in done.lines() {
        println!("{}", crate::model::text::for_terminal(&line));
    }
    let one = |n: usize, it: &'static str, them: &'static str| if n == 1 { it } else { them };
    let unsearched = done.unsearched.len();
    if unsearched > 0 {
        return Err(anyhow!(
            "{unsearched} {} could not be searched whole (listed above): the image is not known to be clean; remove or fix {} and run prepare-image again",
            one(unsearched, "file", "files"),
            one(unsearched, "it", "them"),
        ));
    }
    let holding = done.holding.len();
    if holding > 0 {
        return Err(anyhow!(
            "{holding} {} the token (listed above): the image is not ready; clean {} as said and run prepare-image again",
            one(holding, "file still holds", "files still hold"),
            one(holding, "it", "them"),
        ));
    }
    Ok(())
}
