//! The CPU engine's integration tests: one binary, one file per behaviour.

mod bad_input;
mod common;
mod config;
mod expert_parallel;
mod init_weights;
mod mla;
mod mtp;
mod paged_cache;
mod parity;
mod profile;
mod serving;
mod w8a8;
