//! The JSON summary a proxy bench leaves under `<target>/criterion/`, with the machine's load average at the
//! end (also printed), so a reader can tell a loaded run from an idle one.

use serde_json::{Map, Value, json};

/// Adds the load average to `report` and writes it to `<CARGO_TARGET_DIR or target>/criterion/<file>`;
/// a summary that cannot be written is skipped (the bench's table is already printed).
pub(crate) fn write_summary(mut report: Map<String, Value>, file: &str) {
    let load_average = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load average at the end (1, 5, 15 min): {}", load_average.trim());
    report.insert("load_average".into(), json!(load_average.trim()));
    let target_dir = std::env::var("CARGO_TARGET_DIR").unwrap_or_else(|_| "target".into());
    let path = std::path::Path::new(&target_dir).join("criterion").join(file);
    if std::fs::create_dir_all(path.parent().expect("parent")).is_ok() {
        let _ = std::fs::write(
            &path,
            serde_json::to_string_pretty(&Value::Object(report)).expect("json"),
        );
        println!("summary written to {}", path.display());
    }
}
