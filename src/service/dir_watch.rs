//! The token directory and gridd.conf, watched with inotify on the service's own loop: a
//! change wakes the loop once, and nothing else does (opening or reading a watched file, as
//! gridd and the agent's own look at the token do, is not a change and is not asked for).

use std::cell::RefCell;
use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;
use tracing::warn;

use crate::model::config::Settings;

/// What changes a directory's entries or a file's content, mode or owner, and the watched
/// directory's own end: not opens, reads or closes without a write.
fn changes() -> AddWatchFlags {
    AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF
}

struct Fd(Inotify);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The watch of the token directory (and, for its being made anew, its parent), gridd.conf's
/// directory and the token source.
pub struct Watch {
    fd: AsyncFd<Fd>,
    /// The directory each watch descriptor watches.
    dirs: RefCell<HashMap<WatchDescriptor, PathBuf>>,
    token_dir: PathBuf,
    gridd_conf: PathBuf,
    token_source: Option<PathBuf>,
}

impl Watch {
    /// Watches what `settings` name; `None` (logged) where inotify cannot be had.
    pub fn start(settings: &Settings) -> Option<Watch> {
        let fd = inotify("the token directory", "checking it on each tick")?;
        let w = Watch {
            fd,
            dirs: RefCell::default(),
            token_dir: settings.paths.token_dir.clone(),
            gridd_conf: settings.paths.gridd_conf.clone(),
            token_source: settings.paths.token_source.clone(),
        };
        // The token directory, and its parent for the directory being removed and made again
        // (by cloud-init, by hand): a watch ends with its directory, so the shell watches a new
        // one again when it appears ([`Watch::again`]). Not recursive: the parent may hold the
        // agent's own files (status.json in a custom layout), whose writes must not wake it.
        let dir = &settings.paths.token_dir;
        let parent = dir.parent().filter(|p| *p != Path::new("/"));
        for p in parent.into_iter().chain([dir.as_path()]) {
            if p.is_dir() {
                w.add(p);
            }
        }
        let conf_dir = settings.paths.gridd_conf.parent().unwrap_or(Path::new("/"));
        if parent != Some(conf_dir) && conf_dir != dir.as_path() {
            w.add(conf_dir);
        }
        if let Some(source) = &settings.paths.token_source {
            // A directory (a Secret volume swaps a `..data` link inside it) or a file's
            // directory.
            let at = if source.is_dir() {
                source.as_path()
            } else {
                source.parent().unwrap_or(Path::new("/"))
            };
            w.add(at);
        }
        Some(w)
    }

    fn add(&self, dir: &Path) {
        match self.fd.get_ref().0.add_watch(dir, changes()) {
            Ok(wd) => {
                self.dirs.borrow_mut().insert(wd, dir.to_path_buf());
            }
            Err(e) => warn!("cannot watch {}: {e}", crate::model::text::show_path(dir)),
        }
    }

    /// Watches the token directory again after it was made anew (a watch ends with its
    /// directory; watching a watched one again changes nothing).
    pub fn again(&self) {
        if self.token_dir.is_dir() {
            let _ = self
                .fd
                .get_ref()
                .0
                .add_watch(&self.token_dir, changes())
                .map(|wd| self.dirs.borrow_mut().insert(wd, self.token_dir.clone()));
        }
    }

    /// Waits for the next change that matters: to the token directory (or its being made or
    /// removed), gridd.conf or the token source. Events lost to an overflow count as one.
    /// Where inotify fails, never: the periodic look at the token stands in.
    pub async fn changed(&self) {
        loop {
            let events = next_events(
                &self.fd,
                "the token directory's watch",
                "checking it on each tick",
            )
            .await;
            let dirs = self.dirs.borrow();
            let wanted = events.iter().any(|e| {
                if e.mask.contains(AddWatchFlags::IN_Q_OVERFLOW) {
                    return true;
                }
                dirs.get(&e.wd).is_some_and(|dir| match &e.name {
                    Some(name) => self.relevant(&dir.join(name)),
                    None => self.relevant(dir),
                })
            });
            if wanted {
                return;
            }
        }
    }

    /// gridd.conf's directory may hold other files (status.json, say, in a custom layout):
    /// only the token directory and gridd.conf itself matter; anything else would wake the
    /// service for its own writes.
    fn relevant(&self, p: &Path) -> bool {
        let dir = &self.token_dir;
        p.starts_with(dir)
            || dir.starts_with(p)
            || p == self.gridd_conf
            || self
                .token_source
                .as_ref()
                .is_some_and(|s| p.starts_with(s) || s.starts_with(p))
    }
}

/// An inotify instance on the loop; `None` (logged: `what` is not watched, `instead` stands
/// in) where it cannot be had.
fn inotify(what: &str, instead: &str) -> Option<AsyncFd<Fd>> {
    Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(std::io::Error::from)
        // SAFETY: the AsyncFd owns the Inotify, so the descriptor it registers stays open
        // (and the same one) until the registration ends with it.
        .and_then(|i| unsafe { AsyncFd::register(Fd(i)) }.map_err(std::io::Error::from))
        .map_err(|e| warn!("cannot watch {what}: {e}; {instead}"))
        .ok()
}

/// The next events of `fd`; where reading fails (logged), none ever again.
async fn next_events(
    fd: &AsyncFd<Fd>,
    what: &str,
    instead: &str,
) -> Vec<nix::sys::inotify::InotifyEvent> {
    loop {
        let read = match fd.readable().await {
            Ok(mut ready) => {
                ready.try_io(|fd| fd.get_ref().0.read_events().map_err(std::io::Error::from))
            }
            Err(e) => Ok(Err(e)),
        };
        match read {
            Ok(Ok(events)) => return events,
            Ok(Err(e)) => {
                warn!("{what} failed: {e}; {instead}");
                return std::future::pending().await;
            }
            Err(_would_block) => continue,
        }
    }
}

/// The next change [`Watch::changed`] reports; never, without a watch.
pub async fn changed(watch: Option<&Watch>) {
    match watch {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}

/// On a GPU Operator node, the driver pod's signs on the node: its root's mount point (the
/// root unmounted, or a new one mounted by a new pod), and the operator's marker
/// `.driver-ctr-ready` coming and going. A change wakes the loop, which looks at once where
/// the driver runs: a pod deleted in any order (gridd's shutdown line first, or the root or
/// the marker first) is seen in moments, not at the next reading.
pub struct DriverWatch {
    fd: AsyncFd<Fd>,
    root: PathBuf,
    validations: PathBuf,
}

/// The marker the operator keeps while its driver container is ready.
const MARKER: &str = ".driver-ctr-ready";

impl DriverWatch {
    /// Watches the driver root `root` and its validations; `None` where inotify cannot be
    /// had (the reading's own pace stands in).
    pub fn start(root: &Path) -> Option<DriverWatch> {
        let fd = inotify("the driver pod's root", "looking at each reading")?;
        let w = DriverWatch {
            fd,
            root: root.to_path_buf(),
            validations: crate::node::validations_dir(root),
        };
        w.again();
        Some(w)
    }

    /// (Re)watches what is there now: a watch ends with its directory or its mount.
    fn again(&self) {
        let inotify = &self.fd.get_ref().0;
        let parent = self.root.parent().unwrap_or(Path::new("/"));
        let entries = AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_MOVED_TO;
        for (dir, flags) in [
            (parent, entries),
            (self.validations.as_path(), entries),
            (
                self.root.as_path(),
                AddWatchFlags::IN_DELETE_SELF | AddWatchFlags::IN_MOVE_SELF,
            ),
        ] {
            if dir.is_dir() {
                let _ = inotify.add_watch(dir, flags);
            }
        }
    }

    /// Waits for the next sign of the pod: the root's mount point or the marker changing
    /// (an unmount ends the root's watch: `IN_UNMOUNT`, `IN_IGNORED`).
    pub async fn changed(&self) {
        let root_name = self.root.file_name();
        let validations_name = self.validations.file_name();
        loop {
            let events = next_events(
                &self.fd,
                "the driver pod's watch",
                "looking at each reading",
            )
            .await;
            let wanted = events.iter().any(|e| match &e.name {
                Some(name) => {
                    let name = Some(name.as_os_str());
                    name == Some(std::ffi::OsStr::new(MARKER))
                        || name == root_name
                        || name == validations_name
                }
                None => true,
            });
            self.again();
            if wanted {
                return;
            }
        }
    }
}

/// The next sign [`DriverWatch::changed`] reports; never, without a watch.
pub async fn driver_changed(watch: Option<&DriverWatch>) {
    match watch {
        Some(w) => w.changed().await,
        None => std::future::pending().await,
    }
}
