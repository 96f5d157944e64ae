//! The in-process half: what records a running job, owns its threads and holds process-wide
//! state.
//!
//! * [`ring`]: lock-free single-producer rings of fixed-size [`record::Record`]s, one per thread,
//!   split into an owned producer and consumer half.
//! * [`registry`]: per-thread ring registration and the hot-path calls
//!   (`begin`/`end`/`instant`/`counter`) into the one recording session.
//! * [`session`]: one recording (start/stop, pause/resume, clock offset, steps, window dump);
//!   owns its writer thread, sinks and sampler.
//! * [`collect`]: the writer thread: drain rings, convert ticks, pair Begin/End, format events.
//! * [`sink`]: where events go: gzip segment files, the in-memory window.
//! * [`sampler`]: the always-on host / process / NVML sampler thread.
//! * [`steps`]: the training loop's step machine (where steps begin and end) and the slow-step detector.
//! * [`hang`]: the hang watchdog thread (no GIL) and the step heartbeat it reads;
//!   [`hang_sigterm`]: its SIGTERM hook, for a rank whose main thread waits in C.
//! * [`clock`]: CLOCK_MONOTONIC / CLOCK_REALTIME and anchor pairs.
//! * [`names`], [`config`]: the process-wide name interner; a session's options and their checks.

pub mod clock;
pub mod collect;
pub mod config;
pub mod hang;
pub mod hang_sigterm;
mod leaked;
pub mod names;
pub mod record;
pub mod registry;
pub mod ring;
pub mod sampler;
pub mod session;
pub mod sink;
pub mod steps;
