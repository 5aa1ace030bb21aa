//! Python workers: processes that run LangGraph Python graphs for Spindle, over the protocol
//! of `docs/python-worker-protocol.md` (their side is `python/spindle-worker`).
//!
//! This is the foundation a supervisor builds on: the frames, the connection (requests both
//! ways), which interpreter runs workers and whether it has what they need, and one worker
//! process (spawn, `init`, `ping`, exit). Runs are not routed here yet.

pub mod connection;
pub mod frame;
pub mod interpreter;
pub mod process;

pub use connection::{CallError, Connection, ErrorCode, RemoteError, Reply, WorkerCalls};
pub use frame::{Frame, FrameCodec, FrameError, MAX_FRAME};
pub use interpreter::{
    check_interpreter, choose_interpreter, Interpreter, InterpreterError, PythonInfo, Source,
};
pub use process::{
    GraphKind, GraphLoad, Health, InitReport, SpawnError, WorkerError, WorkerExit, WorkerProcess,
    WorkerSpec,
};
