//! Many processes opening the same fresh databases at the same instant: 50
//! rounds, each of 3 to 8 minishop processes with overlapping modules
//! started together on new SQLite files while a busy loop competes for the
//! CPU. Each process creates, migrates or opens every module's database and
//! effects journal at once with the others; none may meet a half-made one,
//! and every process must end exact.

use super::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const ROUNDS: usize = 50;
const MODULES: [&str; 3] = ["orders", "warehouse", "notifications"];
/// Orders each placing process places: few, the race is at the start.
const ORDERS: u64 = 5;

/// A thread that spins for a while (or until dropped), so that the
/// processes starting beside it get the CPU late and in slices.
struct BusyLoop {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl BusyLoop {
    fn start(spin: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let spinning = stop.clone();
        let thread = std::thread::spawn(move || {
            let until = Instant::now() + spin;
            let mut n: u64 = 0;
            while !spinning.load(Ordering::Relaxed) && Instant::now() < until {
                n = std::hint::black_box(n.wrapping_mul(6364136223846793005).wrapping_add(1));
            }
        });
        BusyLoop {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for BusyLoop {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// 3 to 8 processes, each running a random non-empty set of the modules,
/// together running every module.
fn random_split(rng: &mut fastrand::Rng) -> Vec<Vec<&'static str>> {
    let mut split: Vec<Vec<&str>> = (0..rng.usize(3..=8))
        .map(|_| loop {
            let modules: Vec<&str> = MODULES.into_iter().filter(|_| rng.bool()).collect();
            if !modules.is_empty() {
                break modules;
            }
        })
        .collect();
    for module in MODULES {
        if !split.iter().any(|modules| modules.contains(&module)) {
            let i = rng.usize(..split.len());
            split[i].push(module);
        }
    }
    split
}

#[test]
fn sqlite_processes_started_together_on_fresh_databases_all_end_exact() {
    let seed = crash_seed();
    let mut rng = fastrand::Rng::with_seed(seed);
    let orders = ORDERS.to_string();
    for round in 1..=ROUNDS {
        let place = Place::sqlite();
        let split: Vec<String> = random_split(&mut rng)
            .into_iter()
            .map(|modules| modules.join(","))
            .collect();
        // Over the processes' start, when they open and migrate.
        let placing = placers(&split);
        let placers = placing.to_string();
        let busy = BusyLoop::start(Duration::from_secs(5));
        let children: Vec<Child> = split
            .iter()
            .map(|modules| {
                let mut args = vec!["--modules", modules, "--placers", &placers];
                args.extend(["--duplicate-rate", "0.1"]);
                args.extend(["--timeout", "120", "--json"]);
                if modules.contains("orders") {
                    args.extend(["--orders", &orders]);
                }
                spawn(&place, &args)
            })
            .collect();
        let outputs: Vec<(String, Output)> = children
            .into_iter()
            .zip(&split)
            .map(|(child, modules)| {
                let what = format!(
                    "seed {seed}, round {round}: the process running {modules} (of {split:?})"
                );
                let output = finish(child, Duration::from_secs(180), &what);
                (what, output)
            })
            .collect();
        drop(busy);
        for (what, output) in &outputs {
            let result = check_result(output, what);
            assert_eq!(
                result["orders"],
                placing as u64 * ORDERS,
                "{what}: every placed order and no other: {result}"
            );
        }
    }
    eprintln!("seed {seed}: {ROUNDS} rounds, every process exact");
}
