//! Graph files that use other graph files: `graphs: {child: ./child.yaml}` compiles the file
//! (relative to the importing file) as the graph `child`, so a subgraph is written once and
//! used by several graphs instead of repeated inline. The files a compilation read are
//! recorded, so that `spindle dev` can reload a graph when any of them changes.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use super::read::Ctx;
use super::SpecError;
use crate::graph::Graph;

thread_local! {
    /// The files being compiled on this thread, outermost first: an import of one of them is
    /// a cycle.
    static IMPORTING: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
    /// Every graph file the outermost compilation on this thread has read so far (canonical
    /// paths, each once, in the order read).
    static READ: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
}

/// Compiles the graph file `relative` names, as `name`, for the file `cx` compiles.
pub(super) fn import(
    cx: &Ctx,
    relative: &str,
    name: &str,
    place: &str,
) -> Result<Graph, SpecError> {
    let base = Path::new(cx.file).parent().unwrap_or(Path::new(""));
    let path = base.join(relative);
    let key = std::fs::canonicalize(&path).map_err(|e| {
        cx.err(
            place,
            format!("cannot read the graph file {}: {e}", path.display()),
        )
    })?;
    read(&key);
    let cycle = IMPORTING.with(|files| files.borrow().contains(&key));
    if cycle {
        return Err(cx.err(
            place,
            format!(
                "{} imports itself (through the graphs it imports)",
                path.display()
            ),
        ));
    }
    with_file(key, || super::load_file_named(&path, name))
}

/// Marks `path` as being compiled while `compile` runs (the outermost file of an import
/// chain), so that a file importing it back is a cycle. Also returns the graph files read:
/// `path` and every file it imports, directly or not (canonical paths, each once), as far as
/// the compilation got; empty when `path` cannot be read, or when this runs inside another
/// compilation (whose list the files join).
pub(super) fn compiling<T>(path: &Path, compile: impl FnOnce() -> T) -> (T, Vec<PathBuf>) {
    let outermost = IMPORTING.with(|files| files.borrow().is_empty());
    if !outermost {
        return (compile(), Vec::new());
    }
    let Ok(key) = std::fs::canonicalize(path) else {
        return (compile(), Vec::new());
    };
    READ.with(|read| read.borrow_mut().clear());
    read(&key);
    let out = with_file(key, compile);
    (
        out,
        READ.with(|read| std::mem::take(&mut *read.borrow_mut())),
    )
}

/// Records that the compilation read the graph file `key`.
fn read(key: &Path) {
    READ.with(|read| {
        let mut read = read.borrow_mut();
        if !read.iter().any(|k| k == key) {
            read.push(key.to_path_buf());
        }
    });
}

/// Runs `compile` with `key` on the stack of files being compiled.
fn with_file<T>(key: PathBuf, compile: impl FnOnce() -> T) -> T {
    IMPORTING.with(|files| files.borrow_mut().push(key));
    let out = compile();
    IMPORTING.with(|files| files.borrow_mut().pop());
    out
}
