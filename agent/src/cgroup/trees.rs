//! Whole cgroup hierarchies as the readers see them (the metrics collectors, discovery): each
//! hierarchy is walked once ([`super::walk`]) and then kept current from inotify, so a reader
//! asking for the tree costs one `read(2)` of the inotify queue while nothing changes, instead
//! of a walk of every cgroup directory.
//!
//! Every cgroup directory of a tracked hierarchy carries a watch for directories created,
//! removed or renamed in it. cgroups are only ever created, removed and renamed by `mkdir(2)`,
//! `rmdir(2)` and `rename(2)` (the kernel adds the files inside a cgroup itself, without such
//! events), and the VFS reports each of those to inotify before the call returns, whichever
//! mount or namespace it came through: a tree handed out after draining the queue holds every
//! change made before the call. A created directory is watched, then listed (children made
//! before its watch are not missed); a removed one goes with everything below it; a rename or a
//! lost event (queue overflow) has the hierarchy walked again. When inotify is unavailable or
//! its watch limit (`fs.inotify.max_user_watches`) is reached, the hierarchy falls back to a
//! walk per request, shared by the readers of one scrape (a [`TreeScope`]); the mode of each
//! is in [`CgroupTrees::modes`].
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::{MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use inotify::{EventMask, Inotify, WatchDescriptor, WatchMask};

use super::open_dir::OpenDir;
use super::walk::{CgroupDir, Walk, walk};

/// How a hierarchy's tree is kept.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TreeMode {
    /// Walked once, then kept current by inotify.
    Live,
    /// Walked for each request (shared within a scope), for this reason.
    Walked(String),
}

impl TreeMode {
    /// `live` or `walked`, for labels.
    #[must_use]
    pub fn label(&self) -> &'static str {
        match self {
            Self::Live => "live",
            Self::Walked(_) => "walked",
        }
    }
}

/// What the watches report: directories appearing, going or renamed below a watched one.
fn watch_mask() -> WatchMask {
    WatchMask::CREATE
        | WatchMask::DELETE
        | WatchMask::MOVED_FROM
        | WatchMask::MOVED_TO
        | WatchMask::ONLYDIR
        | WatchMask::DONT_FOLLOW
}

/// The cgroup hierarchies the readers asked for, live where inotify allows.
#[derive(Debug)]
pub struct CgroupTrees {
    state: Mutex<State>,
}

impl Default for CgroupTrees {
    fn default() -> Self {
        Self::new()
    }
}

#[derive(Debug)]
struct State {
    /// `None` when inotify could not be had (every tree is walked).
    inotify: Option<Inotify>,
    why_no_inotify: String,
    trees: HashMap<PathBuf, Tree>,
    /// Watch -> (hierarchy root, directory relative to it).
    watches: HashMap<WatchDescriptor, (PathBuf, String)>,
    /// Scopes open now (scrapes may overlap): walked trees are shared while one is.
    scopes: usize,
    /// A directory descriptor was refused (descriptor limit): logged once.
    handles_refused: bool,
}

/// A directory of a live tree: its id, and a descriptor its files are opened relative to
/// (`None` when the process's descriptor limit refused one; then by path).
#[derive(Debug)]
struct LiveDir {
    ino: u64,
    handle: Option<Arc<OpenDir>>,
}

impl LiveDir {
    /// Opens `path` (`O_PATH`, links not followed) and reads its id from the descriptor.
    fn open(path: &Path, refused_before: &mut bool) -> io::Result<Self> {
        let opened = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(path);
        match opened {
            Ok(file) => Ok(Self {
                ino: file.metadata()?.ino(),
                handle: Some(Arc::new(OpenDir::new(OwnedFd::from(file)))),
            }),
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                if !*refused_before {
                    tracing::warn!(error = %e, "descriptor limit reached: cgroup files are opened by path (slower)");
                    *refused_before = true;
                }
                Ok(Self {
                    ino: std::fs::symlink_metadata(path)?.ino(),
                    handle: None,
                })
            }
            Err(e) => Err(e),
        }
    }
}

#[derive(Debug)]
struct Tree {
    mode: TreeMode,
    /// Live mode: every directory, relative path (`/`, `/a`, `/a/b`) -> its entry.
    dirs: BTreeMap<String, LiveDir>,
    /// The tree handed out, rebuilt after a change (live), or the scope's walk (walked).
    snapshot: Option<Arc<Walk>>,
    /// Live mode: the tree is to be walked again (a rename, a lost event).
    rewalk: bool,
}

impl CgroupTrees {
    /// Trees kept live by one inotify instance (or walked, when there is none).
    #[must_use]
    pub fn new() -> Self {
        let (inotify, why_no_inotify) = match Inotify::init() {
            Ok(inotify) => (Some(inotify), String::new()),
            Err(e) => {
                tracing::warn!(error = %e, "inotify unavailable: cgroup hierarchies are walked at every scrape");
                (None, format!("inotify unavailable: {e}"))
            }
        };
        Self {
            state: Mutex::new(State {
                inotify,
                why_no_inotify,
                trees: HashMap::new(),
                watches: HashMap::new(),
                scopes: 0,
                handles_refused: false,
            }),
        }
    }

    /// Trees that are always walked (tests of the walked mode).
    #[must_use]
    pub fn walked_only(reason: &str) -> Self {
        let trees = Self::new();
        {
            let mut state = trees.lock();
            state.inotify = None;
            reason.clone_into(&mut state.why_no_inotify);
        }
        trees
    }

    /// Opens a scope (one scrape): walked trees are shared by the readers inside it.
    #[must_use]
    pub fn scope(self: &Arc<Self>) -> TreeScope {
        self.lock().scopes += 1;
        TreeScope {
            trees: Arc::clone(self),
        }
    }

    /// The tree under `root`: every cgroup directory that exists at the call (live mode), or
    /// the scope's walk (walked mode; a new walk outside every scope). A missing root gives an
    /// empty tree; an unreadable one is an error.
    pub fn current(&self, root: &Path) -> io::Result<Arc<Walk>> {
        self.current_after(root, None)
    }

    /// [`Self::current`], holding every change made before `after` (walked mode: a walk begun
    /// at or after it; a live tree always does).
    pub fn current_after(&self, root: &Path, after: Option<Instant>) -> io::Result<Arc<Walk>> {
        // Held throughout: a second reader waits for this one's walk instead of making its own.
        let mut state = self.lock();
        state.drain();
        if !state.trees.contains_key(root) {
            let tree = state.start(root)?;
            state.trees.insert(root.to_owned(), tree);
        }
        state.refresh(root, after)
    }

    /// How each hierarchy asked for so far is kept.
    #[must_use]
    pub fn modes(&self) -> Vec<(PathBuf, TreeMode)> {
        let state = self.lock();
        let mut out: Vec<_> = state
            .trees
            .iter()
            .map(|(root, tree)| (root.clone(), tree.mode.clone()))
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is a cache: whatever a panicking holder left is rebuilt on the next walk.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// A new tree for `root`: live (walked once with a watch on every directory) when
    /// inotify allows, else walked.
    fn start(&mut self, root: &Path) -> io::Result<Tree> {
        let mut tree = Tree {
            mode: TreeMode::Walked(self.why_no_inotify.clone()),
            dirs: BTreeMap::new(),
            snapshot: None,
            rewalk: false,
        };
        if self.inotify.is_none() {
            return Ok(tree);
        }
        match self.track(root, "/", &mut tree.dirs) {
            Ok(()) => tree.mode = TreeMode::Live,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                // Watched once it exists: until then each request walks (and finds nothing).
                tree.mode = TreeMode::Walked(format!("{} does not exist", root.display()));
            }
            Err(e) => {
                self.forget_watches(root);
                tree.dirs.clear();
                let reason = watch_failure(&e);
                tracing::warn!(root = %root.display(), error = %e, "cgroup hierarchy walked at every scrape: {reason}");
                tree.mode = TreeMode::Walked(reason);
                // An unreadable root is the caller's error, as for a walk.
                if e.kind() == io::ErrorKind::PermissionDenied {
                    return Err(e);
                }
            }
        }
        Ok(tree)
    }

    /// Watches and lists `relative` under `root` and everything below it into `dirs`. A
    /// directory removed meanwhile is skipped; a watch that cannot be added is an error.
    fn track(
        &mut self,
        root: &Path,
        relative: &str,
        dirs: &mut BTreeMap<String, LiveDir>,
    ) -> io::Result<()> {
        let Some(inotify) = self.inotify.as_mut() else {
            return Err(io::Error::other("inotify unavailable"));
        };
        let mut pending = vec![relative.to_owned()];
        while let Some(relative) = pending.pop() {
            let path = join(root, &relative);
            // Watched before it is listed: a child made in between is reported, not missed.
            let wd = match inotify.watches().add(&path, watch_mask()) {
                Ok(wd) => wd,
                Err(e) if e.kind() == io::ErrorKind::NotFound && relative != "/" => continue,
                Err(e) => return Err(e),
            };
            let entry = match LiveDir::open(&path, &mut self.handles_refused) {
                Ok(entry) => entry,
                Err(e) if e.kind() == io::ErrorKind::NotFound && relative != "/" => continue,
                Err(e) => return Err(e),
            };
            self.watches.insert(wd, (root.to_owned(), relative.clone()));
            dirs.insert(relative.clone(), entry);
            let entries = match std::fs::read_dir(&path) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound && relative != "/" => continue,
                Err(e) => return Err(e),
            };
            for entry in entries.flatten() {
                if entry.file_type().is_ok_and(|t| t.is_dir()) {
                    pending.push(child_of(&relative, &entry.file_name().to_string_lossy()));
                }
            }
        }
        Ok(())
    }

    /// Applies every queued inotify event to the live trees.
    fn drain(&mut self) {
        let mut buffer = [0u8; 16 * 1024];
        let mut created = Vec::new();
        let mut removed = Vec::new();
        loop {
            let Some(inotify) = self.inotify.as_mut() else {
                return;
            };
            let events = match inotify.read_events(&mut buffer) {
                Ok(events) => events,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reading cgroup inotify events; walking every live hierarchy again");
                    self.rewalk_all();
                    break;
                }
            };
            let mut any = false;
            for event in events {
                any = true;
                if event.mask.contains(EventMask::Q_OVERFLOW) {
                    tracing::info!(
                        "cgroup inotify queue overflowed; walking every live hierarchy again"
                    );
                    self.rewalk_all();
                    continue;
                }
                if event.mask.contains(EventMask::IGNORED) {
                    self.watches.remove(&event.wd);
                    continue;
                }
                let (Some((root, parent)), Some(name)) = (self.watches.get(&event.wd), event.name)
                else {
                    continue;
                };
                if !event.mask.contains(EventMask::ISDIR) {
                    continue;
                }
                let child = child_of(parent, &name.to_string_lossy());
                if event
                    .mask
                    .intersects(EventMask::MOVED_FROM | EventMask::MOVED_TO)
                {
                    // A renamed cgroup (v1 allows it): its whole subtree changed paths.
                    if let Some(tree) = self.trees.get_mut(root) {
                        tree.rewalk = true;
                    }
                } else if event.mask.contains(EventMask::CREATE) {
                    created.push((root.clone(), child));
                } else if event.mask.contains(EventMask::DELETE) {
                    removed.push((root.clone(), child));
                }
            }
            if !any {
                break;
            }
        }
        self.apply(created, removed);
    }

    /// Removals first, then creations, each checked against the directory itself: a cgroup
    /// made and removed between two drains is not added (its watch cannot be placed), one
    /// removed and made again is there.
    fn apply(&mut self, created: Vec<(PathBuf, String)>, removed: Vec<(PathBuf, String)>) {
        for (root, child) in removed {
            if let Some(tree) = self.trees.get_mut(&root) {
                remove_subtree(&mut tree.dirs, &child);
                tree.snapshot = None;
            }
        }
        for (root, child) in created {
            let Some(mut tree) = self.trees.remove(&root) else {
                continue;
            };
            if tree.mode == TreeMode::Live && !tree.rewalk {
                if let Err(e) = self.track(&root, &child, &mut tree.dirs) {
                    tracing::warn!(cgroup = %join(&root, &child).display(), error = %e, "watching a new cgroup; walking the hierarchy again");
                    tree.rewalk = true;
                }
                tree.snapshot = None;
            }
            self.trees.insert(root, tree);
        }
    }

    fn rewalk_all(&mut self) {
        for tree in self.trees.values_mut() {
            if tree.mode == TreeMode::Live {
                tree.rewalk = true;
            }
        }
    }

    /// The tree of `root` after any pending rewalk, as [`CgroupTrees::current_after`] says.
    fn refresh(&mut self, root: &Path, after: Option<Instant>) -> io::Result<Arc<Walk>> {
        let Some(mut tree) = self.trees.remove(root) else {
            return Err(io::Error::other("tree not started"));
        };
        let result = self.refresh_tree(root, &mut tree, after);
        self.trees.insert(root.to_owned(), tree);
        result
    }

    fn refresh_tree(
        &mut self,
        root: &Path,
        tree: &mut Tree,
        after: Option<Instant>,
    ) -> io::Result<Arc<Walk>> {
        if tree.mode == TreeMode::Live && tree.rewalk {
            let started = Instant::now();
            self.forget_watches(root);
            tree.dirs.clear();
            tree.rewalk = false;
            tree.snapshot = None;
            if let Err(e) = self.track(root, "/", &mut tree.dirs) {
                self.forget_watches(root);
                tree.dirs.clear();
                let reason = watch_failure(&e);
                tracing::warn!(root = %root.display(), error = %e, "cgroup hierarchy walked at every scrape: {reason}");
                tree.mode = TreeMode::Walked(reason);
            } else {
                tracing::debug!(root = %root.display(), took = ?started.elapsed(), "cgroup hierarchy walked again");
            }
        }
        if tree.mode == TreeMode::Live {
            if let Some(snapshot) = &tree.snapshot {
                return Ok(Arc::clone(snapshot));
            }
            let snapshot = Arc::new(snapshot_of(root, &tree.dirs));
            tree.snapshot = Some(Arc::clone(&snapshot));
            return Ok(snapshot);
        }
        // Walked: the scope's walk when it is recent enough, else a new one.
        if let Some(found) = &tree.snapshot
            && self.scopes > 0
            && after.is_none_or(|after| found.started >= after)
        {
            return Ok(Arc::clone(found));
        }
        let fresh = Arc::new(walk(root, None)?);
        tree.snapshot = (self.scopes > 0).then(|| Arc::clone(&fresh));
        // A root that appeared since: watched from now on.
        if self.inotify.is_some() && !fresh.dirs.is_empty() && tree.mode_is_missing_root() {
            let mut dirs = BTreeMap::new();
            if self.track(root, "/", &mut dirs).is_ok() {
                tree.mode = TreeMode::Live;
                tree.dirs = dirs;
                tree.snapshot = None;
            } else {
                self.forget_watches(root);
            }
        }
        Ok(fresh)
    }

    /// Drops the watch bookkeeping of every directory of `root` (and the watches themselves).
    fn forget_watches(&mut self, root: &Path) {
        let stale: Vec<WatchDescriptor> = self
            .watches
            .iter()
            .filter(|(_, (r, _))| r == root)
            .map(|(wd, _)| wd.clone())
            .collect();
        for wd in stale {
            self.watches.remove(&wd);
            if let Some(inotify) = self.inotify.as_mut() {
                // Already gone with its directory: nothing to undo.
                let _ = inotify.watches().remove(wd);
            }
        }
    }

    /// Forgets the walked trees of a closed scope.
    fn close_scope(&mut self) {
        self.scopes = self.scopes.saturating_sub(1);
        if self.scopes == 0 {
            for tree in self.trees.values_mut() {
                if tree.mode != TreeMode::Live {
                    tree.snapshot = None;
                }
            }
        }
    }
}

impl Tree {
    fn mode_is_missing_root(&self) -> bool {
        matches!(&self.mode, TreeMode::Walked(reason) if reason.ends_with("does not exist"))
    }
}

/// While it lives, walked trees are shared; the last scope closed forgets them.
#[derive(Debug)]
pub struct TreeScope {
    trees: Arc<CgroupTrees>,
}

impl Drop for TreeScope {
    fn drop(&mut self) {
        self.trees.lock().close_scope();
    }
}

/// Why a hierarchy could not be kept live, for logs and `qosd check`.
fn watch_failure(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ENOSPC) {
        "the inotify watch limit (fs.inotify.max_user_watches) is reached".to_owned()
    } else {
        format!("cannot watch it: {e}")
    }
}

/// `/` + `a` is `/a`; `/a` + `b` is `/a/b`.
fn child_of(parent: &str, name: &str) -> String {
    if parent == "/" {
        format!("/{name}")
    } else {
        format!("{parent}/{name}")
    }
}

/// `root` joined with a relative path (`/` is the root itself).
fn join(root: &Path, relative: &str) -> PathBuf {
    let relative = relative.trim_start_matches('/');
    if relative.is_empty() {
        root.to_owned()
    } else {
        root.join(relative)
    }
}

/// Removes `relative` and every directory below it.
fn remove_subtree(dirs: &mut BTreeMap<String, LiveDir>, relative: &str) {
    dirs.remove(relative);
    let prefix = format!("{relative}/");
    let below: Vec<String> = dirs
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| k.clone())
        .collect();
    for key in below {
        dirs.remove(&key);
    }
}

/// A live tree as a walk: parents before children (a parent's path is a prefix of its
/// children's, so it sorts first).
fn snapshot_of(root: &Path, dirs: &BTreeMap<String, LiveDir>) -> Walk {
    let started = Instant::now();
    let dirs = dirs
        .iter()
        .map(|(relative, entry)| CgroupDir {
            path: join(root, relative),
            relative: relative.clone(),
            depth: if relative == "/" {
                0
            } else {
                relative.matches('/').count()
            },
            ino: entry.ino,
            handle: entry.handle.clone(),
        })
        .collect();
    Walk {
        dirs,
        unreadable: Vec::new(),
        started,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(w: &Walk) -> Vec<String> {
        w.dirs.iter().map(|d| d.relative.clone()).collect()
    }

    /// The same directories, depths and ids a fresh walk finds.
    fn assert_matches_a_walk(trees: &CgroupTrees, root: &Path) {
        let live = trees.current(root).expect("tree");
        let walked = walk(root, None).expect("walk");
        let key = |w: &Walk| {
            let mut v: Vec<_> = w
                .dirs
                .iter()
                .map(|d| (d.relative.clone(), d.depth, d.ino, d.path.clone()))
                .collect();
            v.sort();
            v
        };
        assert_eq!(key(&live), key(&walked));
    }

    #[test]
    fn a_live_tree_follows_mkdir_rmdir_and_rename_without_walking() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(root.path().join("a/b")).expect("mkdir");
        let trees = CgroupTrees::new();
        let first = trees.current(root.path()).expect("tree");
        assert_eq!(names(&first), ["/", "/a", "/a/b"]);
        assert_eq!(trees.modes()[0].1, TreeMode::Live);
        // Unchanged: the same tree, no walk.
        assert!(Arc::ptr_eq(
            &first,
            &trees.current(root.path()).expect("tree")
        ));

        // A directory made with children before anything reads the queue.
        std::fs::create_dir_all(root.path().join("c/d/e")).expect("mkdir");
        std::fs::write(root.path().join("c/file"), "x").expect("a file is not a cgroup");
        assert_matches_a_walk(&trees, root.path());
        assert!(names(&trees.current(root.path()).expect("tree")).contains(&"/c/d/e".into()));

        std::fs::remove_dir_all(root.path().join("a")).expect("rm");
        assert_matches_a_walk(&trees, root.path());

        std::fs::rename(root.path().join("c"), root.path().join("f")).expect("rename");
        assert_matches_a_walk(&trees, root.path());
        assert!(names(&trees.current(root.path()).expect("tree")).contains(&"/f/d/e".into()));

        // Made and removed between two reads; removed and made again.
        std::fs::create_dir(root.path().join("g")).expect("mkdir");
        std::fs::remove_dir(root.path().join("g")).expect("rmdir");
        std::fs::remove_dir(root.path().join("f/d/e")).expect("rmdir");
        std::fs::create_dir(root.path().join("f/d/e")).expect("mkdir");
        assert_matches_a_walk(&trees, root.path());
    }

    #[test]
    fn the_walked_mode_shares_one_walk_per_scope() {
        let root = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(root.path().join("a")).expect("mkdir");
        let trees = Arc::new(CgroupTrees::walked_only("test"));

        let scope = trees.scope();
        let first = trees.current(root.path()).expect("walk");
        std::fs::create_dir(root.path().join("b")).expect("mkdir");
        let second = trees.current(root.path()).expect("walk");
        assert!(Arc::ptr_eq(&first, &second), "one walk per scope");
        assert!(!names(&second).contains(&"/b".to_owned()));
        // A reader that sampled after the shared walk began gets a newer one, and the
        // readers after it share that.
        let sampled = Instant::now();
        let newer = trees
            .current_after(root.path(), Some(sampled))
            .expect("walk");
        assert!(names(&newer).contains(&"/b".to_owned()));
        assert!(Arc::ptr_eq(
            &newer,
            &trees.current(root.path()).expect("walk")
        ));
        drop(scope);

        std::fs::create_dir(root.path().join("c")).expect("mkdir");
        let unscoped = trees.current(root.path()).expect("walk");
        assert!(names(&unscoped).contains(&"/c".to_owned()));
        assert!(!Arc::ptr_eq(
            &unscoped,
            &trees.current(root.path()).expect("walk")
        ));
        assert_eq!(
            trees.modes()[0].1,
            TreeMode::Walked("test".to_owned()),
            "the reason is kept"
        );
    }

    #[test]
    fn a_root_that_appears_later_becomes_live() {
        let parent = tempfile::tempdir().expect("tempdir");
        let root = parent.path().join("later");
        let trees = CgroupTrees::new();
        assert!(
            trees
                .current(&root)
                .expect("missing is empty")
                .dirs
                .is_empty()
        );
        std::fs::create_dir_all(root.join("x")).expect("mkdir");
        assert_eq!(names(&trees.current(&root).expect("tree")), ["/", "/x"]);
        assert_eq!(trees.modes()[0].1, TreeMode::Live);
        std::fs::create_dir(root.join("y")).expect("mkdir");
        assert_matches_a_walk(&trees, &root);
    }

    #[test]
    fn on_cgroupfs_the_live_tree_matches_a_walk() {
        // Only where a cgroup filesystem is mounted and writable (root on the host tier).
        let base = PathBuf::from("/sys/fs/cgroup/cpu");
        let probe = base.join(format!("qosd-unit-trees-{}", std::process::id()));
        if std::fs::create_dir(&probe).is_err() {
            return;
        }
        let trees = CgroupTrees::new();
        let before = trees.current(&base).expect("tree");
        assert!(before.dirs.iter().any(|d| d.path == probe));
        std::fs::create_dir(probe.join("child")).expect("mkdir");
        let with_child = trees.current(&base).expect("tree");
        let child = with_child
            .dirs
            .iter()
            .find(|d| d.path == probe.join("child"))
            .map(|d| d.ino);
        let stat = std::fs::metadata(probe.join("child")).map(|m| m.ino()).ok();
        std::fs::remove_dir(probe.join("child")).expect("rmdir");
        std::fs::remove_dir(&probe).expect("rmdir");
        assert_eq!(child, stat, "the id of a cgroup made after the walk");
        let after = trees.current(&base).expect("tree");
        assert!(!after.dirs.iter().any(|d| d.path.starts_with(&probe)));
    }
}
