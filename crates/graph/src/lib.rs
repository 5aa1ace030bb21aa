//! Spindle's graph runtime: a LangGraph-semantics execution engine. It knows nothing of HTTP
//! or SQL; the server crate drives it and stores what it produces.
//!
//! # What the server calls
//!
//! Loading graphs:
//! - [`spec::load_file`]`(&Path) -> Result<Graph, SpecError>` loads a YAML or JSON graph file;
//!   [`SpecError`]'s `Display` names the file, line, place (`nodes.respond.kind`) and problem;
//!   [`spec::load_file_with_imports`] also says which files the graph was compiled from (the
//!   file and the graph files it imports), what `spindle dev` watches.
//! - [`examples::all`]`() -> Vec<(&'static str, Graph)>`: the built-in example graphs.
//!
//! Describing a graph (`/assistants/{id}/...`), all on [`Graph`] (share it as `Arc<Graph>`):
//! - [`Graph::schemas`]`() -> GraphSchemas` (`input_schema, output_schema, state_schema,
//!   config_schema, context_schema`);
//! - [`Graph::drawable`]`(XRay) -> Value` (`{nodes, edges}`, LangGraph's shape);
//! - [`Graph::subgraphs`]`() -> Vec<(String, Arc<Graph>)>` (namespace, graph);
//! - [`Graph::default_config`], [`Graph::default_context`], [`Graph::name`].
//!
//! Running (see [`pregel`]):
//! - [`pregel::run`]`(&Arc<Graph>, RunInput, RunConfig, RunEnv) -> Result<RunOutcome, RunError>`;
//!   [`pregel::run_leaving_saves`] hands back the saves still queued when the run ended, so
//!   the server can write the run's end right behind them.
//!   Stream events arrive on `RunEnv::sink` as [`StreamEvent`]s whose `data` already has
//!   LangGraph's payload shape; `StreamEvent::event_name()` gives `mode[/part]|ns...`.
//!   [`RunError::class`] / [`RunError::message`] give `{"error", "message"}`;
//!   [`RunOutcome::wait_values`] is the `/wait` body (with `__interrupt__` when interrupted)
//!   and `RunOutcome::next` non-empty means the thread is `interrupted`.
//!   `RunConfig::config` is the run's `{configurable, metadata}`: its `metadata` goes into
//!   checkpoint metadata and task/message stream metadata. [`pregel::parse_stream_modes`]
//!   reads `stream_mode` names: `messages-tuple` is [`StreamMode::Messages`], `messages` the
//!   accumulated form, `events` LangChain's `astream_events` dicts. Cancel with `RunEnv::cancel`.
//!   `RunInput::Command { resume, update, goto }` resumes; `RunInput::Continue` (input `null`)
//!   continues after `interrupt_before` or a crash; `RunConfig::checkpoint_id` time-travels.
//! - Thread state: [`pregel::get_state`] (and [`pregel::get_state_with_subgraphs`] for
//!   `?subgraphs=true`), [`pregel::get_state_history`],
//!   [`pregel::update_state`], [`pregel::fork`]; [`pregel::StateSnapshot::to_json`] is the
//!   `/threads/{id}/state` body.
//! - Storage: implement [`checkpoint::Checkpointer`] (see its module docs for the blob model)
//!   and check it with [`checkpoint::conformance::check`]; implement [`store::Store`] for
//!   scripts' `store_get/put/search`. In-memory versions of both exist.
//!
//! Building graphs in Rust: [`builder::GraphBuilder`].

pub mod builder;
pub mod channels;
pub mod checkpoint;
pub mod context;
pub mod events;
pub mod examples;
pub mod graph;
pub mod message_chunks;
pub mod messages;
pub mod model;
pub mod node;
pub mod nodes;
pub mod prebuilt;
pub mod pregel;
pub mod prompt;
pub mod script;
pub mod spec;
pub mod store;
pub mod stream;
pub mod tools;

pub use graph::{Graph, GraphSchemas, NodeSet, Variants, XRay, END, START};
pub use pregel::{Durability, RunConfig, RunEnv, RunError, RunInput, RunOutcome};
pub use spec::SpecError;
pub use stream::{EventSink, StreamEvent, StreamMode};
