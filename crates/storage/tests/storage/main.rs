//! Storage behaviour, run on every backend (see `spindle_storage::test_util`).
//!
//! `cargo test -p spindle-storage` runs SQLite; set `SPINDLE_TEST_POSTGRES_URL` to run
//! PostgreSQL too.

mod assistants;
mod checkpoints;
mod common;
mod crons;
mod history;
mod migrations;
mod runs;
mod store;
mod thread_state;
mod threads;
