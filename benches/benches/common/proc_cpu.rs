//! The CPU time a process and its descendants have used, read from `/proc`: what a system's requests cost
//! it, whether it was saturated or spent part of the batch waiting.

use std::collections::HashMap;

/// Clock ticks per second of `/proc/<pid>/stat`'s times (`getconf CLK_TCK`; 100 on every Linux seen).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<f64>().ok())
        .filter(|t| *t > 0.0)
        .unwrap_or(100.0)
}

/// A process's parent and its CPU ticks (user and system, its own and its reaped children's).
fn stat(pid: u32) -> Option<(u32, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses; the fields after it are separated by spaces.
    let rest = &text[text.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // `rest` starts at field 3 (state): ppid is field 4, utime 14, stime 15, cutime 16, cstime 17.
    let ppid = fields.get(1)?.parse().ok()?;
    let ticks = fields
        .get(11..15)?
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    Some((ppid, ticks))
}

/// Reads the CPU time of process trees.
pub(crate) struct CpuMeter {
    ticks_per_second: f64,
}

impl CpuMeter {
    pub(crate) fn new() -> Self {
        Self {
            ticks_per_second: ticks_per_second(),
        }
    }

    /// Seconds of CPU used so far by `root` and every process below it; `None` without `/proc`.
    pub(crate) fn seconds(&self, root: u32) -> Option<f64> {
        let (_, own) = stat(root)?;
        let mut children: HashMap<u32, Vec<(u32, u64)>> = HashMap::new();
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if let Some((ppid, ticks)) = stat(pid) {
                children.entry(ppid).or_default().push((pid, ticks));
            }
        }
        let mut total = own;
        let mut todo = vec![root];
        while let Some(pid) = todo.pop() {
            for &(child, ticks) in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
                total += ticks;
                todo.push(child);
            }
        }
        Some(total as f64 / self.ticks_per_second)
    }
}
