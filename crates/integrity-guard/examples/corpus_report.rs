//! Prints the built-in rules' scores as Markdown: the corpus's train and held-out halves, and the fresh
//! set written after the rules were frozen (`corpus/fresh.jsonl`):
//! `cargo run -p integrity-guard --example corpus_report`.

use std::sync::Arc;

use integrity_guard::RuleSet;
use integrity_guard::corpus::{self, CORPUS_JSONL, FRESH_JSONL, Split};

fn main() -> anyhow::Result<()> {
    let entries = corpus::parse(CORPUS_JSONL).map_err(anyhow::Error::msg)?;
    let fresh = corpus::parse(FRESH_JSONL).map_err(anyhow::Error::msg)?;
    let rules = Arc::new(RuleSet::builtin());
    for (split, title) in [(Split::Train, "train half"), (Split::HeldOut, "held-out half")] {
        println!("{}", corpus::score(&entries, &rules, split).markdown(title));
    }
    println!(
        "{}",
        corpus::score(&fresh, &rules, Split::HeldOut).markdown("fresh set")
    );
    Ok(())
}
