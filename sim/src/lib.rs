//! # herder-sim
//!
//! A deterministic simulator for Herder. It drives the very same `herder-core` state machines
//! the runtime drives — coordinators, workers, clients — in one process, with virtual time, a
//! simulated TCP network, simulated disks, injected faults and a random workload, all drawn
//! from one seed. After every step a checker verifies the safety invariants of
//! docs/SIMULATION.md; once faults stop, a liveness phase checks that every acknowledged job ends
//! and every client operation completes.
//!
//! - [`rng`]: the seed, split per component; the trace hash.
//! - [`scenario`]: what each seed draws (swarm testing).
//! - [`world`]: the event loop, nodes, network, disks, faults and workload.
//! - [`checker`]: the invariants.
//! - [`budget`]: what one seed may use before it counts as a livelock, and how a panic inside
//!   a seed is caught.
//! - [`submission`]: the checker's own reading of the checks a submission must pass.

pub mod budget;
pub mod checker;
pub mod fairness;
pub mod model;
pub mod rng;
pub mod scenario;
pub mod submission;
pub mod world;

pub use budget::Sabotage;
pub use scenario::{Scenario, Scripted};
pub use world::{run_scenario, run_scenario_with, run_seed, RunReport};
