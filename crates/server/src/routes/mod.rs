//! HTTP routes, one module per resource.

pub mod assistants;
pub mod crons;
pub mod metrics;
pub mod runs;
pub mod state;
pub mod store;
pub mod streams;
pub mod system;
pub mod thread_events;
pub mod threads;
