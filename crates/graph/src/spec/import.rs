//! Graph files that use other graph files: `graphs: {child: ./child.yaml}` compiles the file
//! (relative to the importing file) as the graph `child`, so a subgraph is written once and
//! used by several graphs instead of repeated inline.

use std::cell::RefCell;
use std::path::{Path, PathBuf};

use super::read::Ctx;
use super::SpecError;
use crate::graph::Graph;

thread_local! {
    /// The files being compiled on this thread, outermost first: an import of one of them is
    /// a cycle.
    static IMPORTING: RefCell<Vec<PathBuf>> = const { RefCell::new(Vec::new()) };
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
/// chain), so that a file importing it back is a cycle.
pub(super) fn compiling<T>(path: &Path, compile: impl FnOnce() -> T) -> T {
    let Ok(key) = std::fs::canonicalize(path) else {
        return compile();
    };
    let outermost = IMPORTING.with(|files| files.borrow().is_empty());
    if !outermost {
        return compile();
    }
    with_file(key, compile)
}

/// Runs `compile` with `key` on the stack of files being compiled.
fn with_file<T>(key: PathBuf, compile: impl FnOnce() -> T) -> T {
    IMPORTING.with(|files| files.borrow_mut().push(key));
    let out = compile();
    IMPORTING.with(|files| files.borrow_mut().pop());
    out
}
