//! Lists tickbox's own migrations on every backend — each folder under
//! `migrations/`, whether its backend is compiled in or not — for the check
//! that refuses an application's migration with one of their versions
//! (`src/store/migrations.rs`). A new backend's folder joins the list by
//! being there.

use std::fmt::Write;
use std::path::Path;

fn main() {
    // A folder or migration added, removed or renamed lists them again.
    println!("cargo::rerun-if-changed=migrations");
    let mut folders: Vec<String> = std::fs::read_dir("migrations")
        .expect("tickbox's migrations/ folder")
        .map(|entry| entry.expect("an entry of migrations/").path())
        .filter(|path| path.is_dir())
        .map(|path| {
            let name = path.file_name().expect("a folder's name").to_str();
            name.expect("a UTF-8 folder name").to_owned()
        })
        .collect();
    folders.sort();
    let mut list = String::from("&[\n");
    for folder in folders {
        writeln!(
            list,
            "    (\"{folder}\", diesel_migrations::embed_migrations!(\"migrations/{folder}\")),"
        )
        .expect("writing to a String");
    }
    list.push_str("]\n");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(
        Path::new(&out_dir).join("every_backend_migrations.rs"),
        list,
    )
    .expect("writes the list of tickbox's migration folders");
}
