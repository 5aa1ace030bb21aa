//! Rebuilds the crate when a migration is added: `sqlx::migrate!` embeds the files of
//! `migrations/` at compile time, and cargo does not otherwise watch that folder.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
