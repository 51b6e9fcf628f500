//! Prints the built-in rules' scores on the crate's corpus, train and held-out halves, as Markdown:
//! `cargo run -p integrity-guard --example corpus_report`.

use std::sync::Arc;

use integrity_guard::RuleSet;
use integrity_guard::corpus::{self, CORPUS_JSONL, Split};

fn main() -> anyhow::Result<()> {
    let entries = corpus::parse(CORPUS_JSONL).map_err(anyhow::Error::msg)?;
    let rules = Arc::new(RuleSet::builtin());
    for (split, title) in [(Split::Train, "train half"), (Split::HeldOut, "held-out half")] {
        println!("{}", corpus::score(&entries, &rules, split).markdown(title));
    }
    Ok(())
}
