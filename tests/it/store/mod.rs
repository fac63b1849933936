//! The transaction stores: the shared store suite over each implementation, corruption, repair, the
//! data directory lock.

mod corruption;
mod data_dir_lock;
mod file;
mod files_fuzz;
mod jetstream;
mod repair;
