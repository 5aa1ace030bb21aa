//! Python workers: processes that run LangGraph Python graphs for Spindle, over the protocol
//! of `docs/python-worker-protocol.md` (their side is `python/spindle-worker`).
//!
//! From the bottom up: the frames, the connection (requests both ways), which interpreter
//! runs workers and whether it has what they need, one worker process (spawn, `init`, `ping`,
//! exit), the pool that supervises them, what Spindle answers a worker's calls with
//! (checkpoints, the store, a run's events and end), and the executor of a run on a worker.

pub mod auth;
pub mod calls;
pub mod checkpoints;
pub mod connection;
pub mod executor;
pub mod frame;
pub mod interpreter;
pub mod pool;
pub mod process;
pub mod reads;
pub mod start;
pub mod store_ops;

pub use connection::{CallError, Connection, ErrorCode, RemoteError, Reply, WorkerCalls};
pub use frame::{Frame, FrameCodec, FrameError, MAX_FRAME};
pub use interpreter::{
    check_interpreter, choose_interpreter, Interpreter, InterpreterError, PythonInfo, Source,
};
pub use process::{
    GraphKind, GraphLoad, Health, InitReport, SpawnError, WorkerError, WorkerExit, WorkerProcess,
    WorkerSpec,
};
