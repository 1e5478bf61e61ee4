//! The examples: the README's quick start is `examples/quick_start.rs` word
//! for word, its test of minishop is `examples/minishop/flow_test.rs`,
//! every example opens with what it shows and the command that runs it,
//! the README lists each with that command, and the short examples run and
//! do what they say. (minishop has tests of its own, in `processes`.)
//!
//! `cargo test` builds the examples, so their binaries are beside the
//! test's.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

mod catalog;
mod generic_handler;

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The README's section `title`, up to the next `## ` heading.
fn readme_section(title: &str) -> String {
    let readme = read(&root().join("README.md"));
    let section = readme
        .split_once(&format!("\n## {title}\n"))
        .unwrap_or_else(|| panic!("README.md has a `## {title}` section"))
        .1;
    section.split("\n## ").next().unwrap_or(section).to_string()
}

/// The code of the first `rust` block under the README's section `title`.
fn readme_code(title: &str) -> String {
    let section = readme_section(title);
    let code = section
        .split_once("```rust\n")
        .unwrap_or_else(|| panic!("the {title} section has a ```rust block"))
        .1;
    let end = code
        .find("\n```\n")
        .unwrap_or_else(|| panic!("the {title} section's ```rust block ends"));
    format!("{}\n", &code[..end])
}

/// Panics, naming the first line that differs, unless the README's code
/// under `title` is the file at `path` word for word.
fn assert_readme_shows(title: &str, path: &str) {
    let readme = readme_code(title);
    let file = read(&root().join(path));
    if readme != file {
        let (line, (r, e)) = readme
            .lines()
            .chain(std::iter::repeat("<end>"))
            .zip(file.lines().chain(std::iter::repeat("<end>")))
            .enumerate()
            .find(|(_, (r, e))| r != e)
            .expect("they differ");
        panic!(
            "README.md's {title} and {path} differ first at line {}:\n  \
             README.md: {r}\n  {path}: {e}\ncopy one onto the other",
            line + 1
        );
    }
}

#[test]
fn the_readme_quick_start_is_the_quick_start_example() {
    assert_readme_shows("Quick start", "examples/quick_start.rs");
}

/// The files the README's section `title` shows: each `sql` block, with
/// the path in backquotes that ends the line before it.
fn readme_files(title: &str) -> Vec<(String, String)> {
    let section = readme_section(title);
    let mut files = Vec::new();
    let mut rest = section.as_str();
    while let Some((before, after)) = rest.split_once("\n```sql\n") {
        let named = before.lines().rev().find(|line| !line.trim().is_empty());
        let path = named
            .and_then(|line| line.trim_end_matches(':').strip_suffix('`'))
            .and_then(|line| line.rsplit_once('`'))
            .unwrap_or_else(|| panic!("no `path` on the line before a ```sql block: {named:?}"))
            .1;
        let (sql, after) = after.split_once("\n```\n").expect("the ```sql block ends");
        files.push((path.to_string(), format!("{sql}\n")));
        rest = after;
    }
    files
}

/// Every `up.sql` under `dir`, as paths relative to the crate's root.
fn migration_files(dir: &str) -> Vec<String> {
    let mut found = Vec::new();
    for module in std::fs::read_dir(root().join(dir)).expect(dir) {
        let module = module.expect("a directory entry").path();
        for migration in std::fs::read_dir(&module).expect("a module's migrations") {
            let up = migration.expect("a directory entry").path().join("up.sql");
            let relative = up.strip_prefix(root()).expect("under the root");
            found.push(relative.display().to_string());
        }
    }
    found.sort();
    found
}

#[test]
fn the_readme_quick_start_shows_the_examples_migrations_word_for_word() {
    let shown = readme_files("Quick start");
    let mut paths: Vec<String> = shown.iter().map(|(path, _)| path.clone()).collect();
    paths.sort();
    assert_eq!(
        paths,
        migration_files("examples/quick_start/migrations"),
        "README.md's quick start shows every migration of the example, and no other"
    );
    for (path, sql) in shown {
        assert_eq!(
            sql,
            read(&root().join(&path)),
            "README.md's quick start shows {path} otherwise than it is"
        );
    }
}

#[test]
fn the_readme_test_of_minishop_is_its_flow_test() {
    assert_readme_shows("Testing your application", "examples/minishop/flow_test.rs");
}

/// Each example with its source: `examples/NAME.rs` or
/// `examples/NAME/main.rs`.
fn examples() -> Vec<(String, PathBuf)> {
    let dir = root().join("examples");
    let mut found: Vec<_> = std::fs::read_dir(&dir)
        .expect("examples/")
        .map(|entry| entry.expect("a directory entry").path())
        .filter_map(|path| {
            if path.is_dir() {
                let main = path.join("main.rs");
                let name = path.file_name()?.to_str()?.to_string();
                main.exists().then_some((name, main))
            } else if path.extension()? == "rs" {
                Some((path.file_stem()?.to_str()?.to_string(), path))
            } else {
                None
            }
        })
        .collect();
    found.sort();
    found
}

/// The `//!` comment an example's source opens with, its lines joined by
/// spaces (a command may be wrapped between two).
fn opening_comment(path: &Path) -> String {
    let source = read(path);
    let doc: Vec<&str> = source
        .lines()
        .map_while(|line| line.strip_prefix("//!"))
        .map(str::trim)
        .collect();
    assert!(
        doc.len() >= 2,
        "{} does not open with a `//!` comment saying what it shows",
        path.display()
    );
    doc.join(" ")
}

#[test]
fn every_example_opens_with_what_it_shows_and_the_command_that_runs_it() {
    let examples = examples();
    assert!(examples.len() >= 4, "examples found: {examples:?}");
    for (name, path) in examples {
        let doc = opening_comment(&path);
        assert!(
            doc.contains("cargo run") && doc.contains(&format!("--example {name}")),
            "{}'s opening comment does not give the command that runs it \
             (`cargo run --example {name}`)",
            path.display()
        );
    }
}

#[test]
fn each_short_example_fits_in_150_lines_and_each_large_ones_main_in_300() {
    for (name, path) in examples() {
        let lines = read(&path).lines().count();
        let (limit, what) = match path.ends_with("main.rs") {
            true => (
                300,
                "its main.rs, the tutorial part (fixtures go in files beside it)",
            ),
            false => (150, "a short example"),
        };
        assert!(
            lines <= limit,
            "{name}: {} has {lines} lines, more than {limit} for {what}",
            path.display()
        );
    }
}

/// The README's `## Examples` table, row by row: the example, and the
/// command in its last column.
fn readme_examples() -> Vec<(String, String)> {
    readme_section("Examples")
        .lines()
        .filter(|line| line.starts_with("| `"))
        .map(|row| {
            let cells: Vec<&str> = row.trim_matches('|').split(" | ").map(str::trim).collect();
            let name = cells[0].trim_matches('`').to_string();
            let command = cells[cells.len() - 1].trim_matches('`').to_string();
            (name, command)
        })
        .collect()
}

#[test]
fn the_readme_lists_every_example_with_the_command_its_opening_comment_gives() {
    let examples = examples();
    let listed = readme_examples();
    let mut names: Vec<&str> = listed.iter().map(|(name, _)| name.as_str()).collect();
    names.sort();
    let found: Vec<&str> = examples.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names, found,
        "README.md's Examples list names each example under examples/, once"
    );
    for (name, command) in listed {
        let (_, path) = examples.iter().find(|(n, _)| *n == name).expect("listed");
        assert!(
            command.starts_with("cargo run") && command.contains(&format!("--example {name}")),
            "README.md runs {name} with `{command}`"
        );
        assert!(
            opening_comment(path).contains(&format!("`{command}`")),
            "README.md runs {name} with `{command}`, which its opening comment does not give"
        );
    }
}

/// The binary of example `name`, built with this test.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target/<profile>/deps");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the tests with `cargo test`, which builds the examples",
        path.display()
    );
    path
}

/// Runs example `name` in `dir` to its end (at most two minutes); panics
/// unless it succeeds.
fn run(name: &str, dir: &Path) -> String {
    run_with(name, dir, &[])
}

/// Like [`run`], with arguments.
#[cfg_attr(not(feature = "postgres"), allow(dead_code))]
fn run_with(name: &str, dir: &Path, args: &[&str]) -> String {
    let mut child = Command::new(example(name))
        .args(args)
        .current_dir(dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the example starts");
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let Output {
        status,
        stdout,
        stderr,
    } = child.wait_with_output().expect("its output");
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    assert!(
        status.success(),
        "example {name} failed ({status})\nstdout:\n{stdout}\nstderr:\n{}",
        String::from_utf8_lossy(&stderr)
    );
    stdout
}

#[test]
fn the_quick_start_runs_as_written_in_an_empty_directory_and_again() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let first = run("quick_start", dir.path());
    assert!(
        first.contains("delivered: true; reservations: 1"),
        "{first}"
    );
    let second = run("quick_start", dir.path());
    assert!(
        second.contains("delivered: true; reservations: 2"),
        "{second}"
    );
}

#[test]
fn the_batched_handler_example_handles_every_reading_once() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = run("batched_handler", dir.path());
    assert!(output.contains("2000 readings handled"), "{output}");
}

#[test]
fn in_the_several_processes_example_each_worker_gets_every_order() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = run("several_processes", dir.path());
    for worker in ["warehouse", "notifications"] {
        assert!(
            output.contains(&format!("{worker}: recorded all 50 orders")),
            "{output}"
        );
    }
}

/// The number just before `words` in `output`: `12` in `… 12 retried …`.
fn number_before(output: &str, words: &str) -> u64 {
    let before = output
        .split_once(words)
        .unwrap_or_else(|| panic!("no `{words}` in: {output}"))
        .0;
    let digits = before.rsplit(' ').next().unwrap_or_default();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number before `{words}` in: {output}"))
}

#[test]
fn with_ordering_keys_each_products_changes_arrive_in_order_through_retries() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = run("ordering_keys", dir.path());
    assert!(
        output.contains("keyed: 60 changes arrived") && output.contains("out of order: 0"),
        "{output}"
    );
    // Every third change of each product fails its first attempt.
    assert!(number_before(&output, " retried") >= 18, "{output}");
}

#[test]
fn the_external_effects_example_charges_each_order_once_through_a_crash() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = run("external_effects", dir.path());
    // The call the crash cut short was made again, with its key.
    assert!(
        output.contains("provider: 4 calls, 3 charges (one per key)"),
        "{output}"
    );
    assert!(output.contains("payments recorded: 3"), "{output}");
}

#[cfg(feature = "amqp")]
#[test]
fn in_the_two_services_example_every_order_is_confirmed_over_rabbitmq() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let output = run("two_services", dir.path());
    assert!(
        output.contains("orders: placed 10 orders; every order confirmed"),
        "{output}"
    );
    // The warehouse answered at least this run's ten orders.
    let warehouse = output.lines().find(|line| line.starts_with("warehouse: "));
    let warehouse = warehouse.unwrap_or_else(|| panic!("no warehouse line: {output}"));
    assert!(number_before(warehouse, " messages") >= 10, "{output}");
}
