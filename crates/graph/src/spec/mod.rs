//! Graph files: YAML or JSON documents compiled to [`Graph`]s, checked at load time with
//! errors that name the file, the place in it and the problem. Authors' documentation:
//! docs/graph-files.md; the JSON Schema: [`SCHEMA`]. A sketch of the format:
//!
//! ```yaml
//! name: agent                       # optional; defaults to the file name
//! description: A tool-calling loop
//! state:                            # key: reducer or type shorthand, or an object
//!   messages: messages              # add_messages; starts as []
//!   n: {type: integer, default: 0}  # last value
//!   results: append                 # list concat; a single item is appended
//!   total: add                      # numeric add; starts at 0
//!   scratch: ephemeral              # visible for one step
//!   log: {reducer: topic, accumulate: true}
//!   best: {reducer: script, code: "if update > current { update } else { current }"}
//! input: [messages]                 # optional key lists
//! output: [messages]
//! config: {schema: {...}, default: {...}}    # config.configurable schema and defaults
//! context: {schema: {...}, default: {...}}
//! models:
//!   m: {provider: scripted, chunk: word, responses: ["hi", {content: "", tool_calls: [...]}]}
//!   gpt: {provider: openai, base_url: "https://api.openai.com/v1", model: gpt-4o-mini,
//!         api_key_env: OPENAI_API_KEY}   # also anthropic, gemini (docs/model-providers.md)
//! tools:
//!   add: {kind: script, description: Add, parameters: {...}, code: "args.a + args.b"}
//!   weather: {kind: http, method: GET, url: "https://example.org/w/{city}", parameters: {...}}
//! graphs:                           # graphs used by subgraph nodes
//!   child: { ...a graph document... }
//!   shared: ./shared.yaml           # or a graph file, relative to this one
//! nodes:
//!   model: {kind: model, model: m, tools: [add], system: "Be brief.", stream: true}
//!   tools: {kind: tools, tools: [add]}
//!   step: {kind: script, code: "#{ n: state.n + 1 }", retry: {max_attempts: 3}}
//!   ask: {kind: interrupt, payload: {question: "ok?"}, write_to: answer}
//!   child: {kind: subgraph, graph: child, input: {messages: messages}, output: {messages: messages}}
//!   helper: {kind: agent, model: m, tools: [add]}
//! edges:
//!   - {from: __start__, to: model}                       # START and END are accepted too
//!   - {from: [left, right], to: merge}                   # a join: merge runs once both ran
//!   - {from: model, route: tools_condition, to: [tools, __end__]}
//!   - {from: tools, route: "if state.n > 3 { \"__end__\" } else { \"model\" }", to: [model, __end__]}
//!   - {from: x, route: {code: "...", path_map: {yes: a, no: b}}}
//! interrupt_before: [tools]         # or "*"
//! interrupt_after: []
//! ```
//!
//! Scripts are Rhai (see [`crate::script`] for the host API).

mod compile;
mod import;
pub mod locate;
mod node_kinds;
mod read;
mod resources;
mod state;

use std::path::{Path, PathBuf};

use crate::graph::Graph;

pub use compile::compile_value;

/// The JSON Schema (draft-07) of graph files, for editors and `spindle check`'s users; the
/// server serves it at `/graph-file.schema.json`. It says what the compiler here accepts (its
/// tests check the example graphs and the documentation's against both).
pub const SCHEMA: &str = include_str!("../../graph-file.schema.json");

/// A graph file that cannot be used, with where and why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub struct SpecError {
    /// The file (or the name given for an in-memory source).
    pub file: String,
    /// The place in the document, e.g. `nodes.respond.kind` (empty for the whole file).
    pub place: String,
    /// 1-based line, when known.
    pub line: Option<usize>,
    /// What is wrong, said so its author can act on it.
    pub message: String,
}

impl std::fmt::Display for SpecError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.file)?;
        if let Some(l) = self.line {
            write!(f, ":{l}")?;
        }
        if !self.place.is_empty() {
            write!(f, ": at `{}`", self.place)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// The syntax of a graph file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML (a superset of JSON; used for `.yaml`/`.yml`).
    Yaml,
    /// JSON.
    Json,
}

/// Load a graph file; the format follows the extension (`.json` is JSON, anything else YAML).
/// The graph's name defaults to the file stem. Graph files it imports (`graphs: {x: ./x.yaml}`)
/// are loaded relative to it.
pub fn load_file(path: &Path) -> Result<Graph, SpecError> {
    load_file_with_imports(path).graph
}

/// A graph file's graph, with the graph files it was compiled from.
#[derive(Debug)]
pub struct LoadedFile {
    /// The graph, or why the file (or a file it imports) cannot be used.
    pub graph: Result<Graph, SpecError>,
    /// The file and every graph file it imports, directly or through other imports
    /// (`graphs: {x: ./x.yaml}`, `variants: {graphs: {x: ./x.yaml}}`): canonical paths, each
    /// once, the file first. When loading fails, the files read until then; empty when the
    /// file itself cannot be read. A change to any of them can change the graph.
    pub files: Vec<PathBuf>,
}

/// [`load_file`], also telling which files the graph was compiled from (what `spindle dev`
/// watches to reload it).
pub fn load_file_with_imports(path: &Path) -> LoadedFile {
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("graph")
        .to_string();
    let (graph, files) = import::compiling(path, || load_file_named(path, &stem));
    LoadedFile { graph, files }
}

/// Load a graph file whose name defaults to `default_name`.
fn load_file_named(path: &Path, default_name: &str) -> Result<Graph, SpecError> {
    let file = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|e| SpecError {
        file: file.clone(),
        place: String::new(),
        line: None,
        message: format!("cannot read the file: {e}"),
    })?;
    let format = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => Format::Json,
        _ => Format::Yaml,
    };
    load_str(&source, &file, default_name, format)
}

/// Load a graph from text. `file` names it in errors; `default_name` is used when the
/// document has no `name`.
pub fn load_str(
    source: &str,
    file: &str,
    default_name: &str,
    format: Format,
) -> Result<Graph, SpecError> {
    let value: serde_json::Value = match format {
        Format::Json => serde_json::from_str(source).map_err(|e| SpecError {
            file: file.to_string(),
            place: String::new(),
            line: Some(e.line()),
            message: format!("invalid JSON: {e}"),
        })?,
        Format::Yaml => {
            let y: serde_yaml::Value = serde_yaml::from_str(source).map_err(|e| SpecError {
                file: file.to_string(),
                place: String::new(),
                line: e.location().map(|l| l.line()),
                message: format!("invalid YAML: {e}"),
            })?;
            serde_json::to_value(y).map_err(|e| SpecError {
                file: file.to_string(),
                place: String::new(),
                line: None,
                message: format!(
                    "the YAML cannot be read as JSON data (keys must be strings): {e}"
                ),
            })?
        }
    };
    compile_value(&value, file, source, default_name)
}
