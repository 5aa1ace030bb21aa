//! Run execution: workers that claim and execute runs, the live event hub, and the mapping
//! from a stored run to the engine's inputs.

pub mod execute;
pub mod hub;
pub mod stream;
pub mod worker;

pub use hub::{EventHub, HubMessage};
pub use worker::{RunWorkers, WorkerConfig};
