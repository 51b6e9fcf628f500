//! The acceptance figures: on the corpus's held-out half, recall >= 0.95 and precision >= 0.99; the
//! report is printed (`--nocapture`) with the confusion per category.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use integrity_guard::RuleSet;
use integrity_guard::corpus::{self, CORPUS_JSONL, FRESH_JSONL, Label, Split};

#[test]
fn the_corpus_is_well_formed_and_balanced() {
    let entries = corpus::parse(CORPUS_JSONL).expect("the corpus parses");
    assert!(entries.len() >= 300, "{} entries", entries.len());
    let ids: HashSet<&str> = entries.iter().map(|e| e.id.as_str()).collect();
    assert_eq!(ids.len(), entries.len(), "ids are unique");
    let offending = entries.iter().filter(|e| e.label == Label::Offending).count();
    let benign = entries.len() - offending;
    assert!(
        offending.abs_diff(benign) * 10 < entries.len(),
        "{offending} offending, {benign} benign"
    );
    let held_out = entries.iter().filter(|e| e.split == Split::HeldOut).count();
    assert!(
        held_out.abs_diff(entries.len() - held_out) <= 12,
        "{held_out} held out"
    );
    let offending_categories: BTreeSet<&str> = entries
        .iter()
        .filter(|e| e.label == Label::Offending)
        .map(|e| e.category.as_str())
        .collect();
    assert_eq!(offending_categories.len(), 6);
    let evasive = entries
        .iter()
        .filter(|e| e.label == Label::Offending && !e.evasions.is_empty())
        .count();
    assert!(
        evasive * 3 > offending,
        "{evasive} of {offending} offending entries use an evasion"
    );
}

#[test]
fn held_out_recall_and_precision_meet_the_goal() {
    let entries = corpus::parse(CORPUS_JSONL).expect("the corpus parses");
    let rules = Arc::new(RuleSet::builtin());
    let held_out = corpus::score(&entries, &rules, Split::HeldOut);
    println!("{}", held_out.markdown("held-out half"));
    let t = held_out.total;
    assert!(t.recall() >= 0.95, "held-out recall {:.3}", t.recall());
    assert!(t.precision() >= 0.99, "held-out precision {:.3}", t.precision());
    for (category, c) in &held_out.by_category {
        assert!(c.recall() >= 0.9, "{category}: recall {:.3}", c.recall());
    }
    let fresh = corpus::parse(FRESH_JSONL).expect("the fresh set parses");
    let fresh = corpus::score(&fresh, &rules, Split::HeldOut);
    println!("{}", fresh.markdown("fresh set"));
    assert!(
        fresh.total.precision() >= 0.99,
        "fresh precision {:.3}",
        fresh.total.precision()
    );
}
