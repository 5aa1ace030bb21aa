//! HTTP routes, one module per resource.

pub mod assistants;
pub mod system;
pub mod threads;
