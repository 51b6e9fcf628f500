//! Scoring rules on a labelled corpus: the crate's own `corpus/commands.jsonl` (see its README), or a
//! user's in the same format. Each entry is scanned as one shell command with a fresh [`Scanner`] and
//! the entry's base commit; an entry is flagged when any rule hits.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::rules::RuleSet;
use crate::scan::{Hit, Scanner};

/// The crate's own corpus, as committed.
pub const CORPUS_JSONL: &str = include_str!("../corpus/commands.jsonl");

/// A second set, written after the rules were frozen and labelled before any scan (all held out).
pub const FRESH_JSONL: &str = include_str!("../corpus/fresh.jsonl");

/// One labelled command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// Unique id.
    pub id: String,
    /// `offending` or `benign`.
    pub label: Label,
    /// The entry's category.
    pub category: String,
    /// `train` or `held-out`.
    pub split: Split,
    /// How the command hides, if it does.
    #[serde(default)]
    pub evasions: Vec<String>,
    /// The command text.
    pub command: String,
    /// The task's base commit, where the entry assumes the row gives one.
    #[serde(default)]
    pub base_commit: Option<String>,
}

/// Whether a command reads the repository's future.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Label {
    /// It does.
    Offending,
    /// It does not.
    Benign,
}

/// Which half of the corpus an entry is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Split {
    /// Rules may be tuned on it.
    Train,
    /// Rules are scored on it.
    HeldOut,
}

/// Parses a corpus, one JSON object per line (blank lines skipped); an error names the line.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(n, l)| serde_json::from_str(l).map_err(|e| format!("line {}: {e}", n + 1)))
        .collect()
}

/// One entry's outcome.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The entry.
    pub entry: Entry,
    /// What the rules found.
    pub hits: Vec<Hit>,
}

impl Outcome {
    /// Flagged and offending, or clean and benign.
    pub fn correct(&self) -> bool {
        self.hits.is_empty() == (self.entry.label == Label::Benign)
    }
}

/// Counts of one category (or of everything).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Confusion {
    /// Offending and flagged.
    pub true_positives: usize,
    /// Offending and missed.
    pub false_negatives: usize,
    /// Benign and flagged.
    pub false_positives: usize,
    /// Benign and clean.
    pub true_negatives: usize,
}

impl Confusion {
    fn add(&mut self, o: &Outcome) {
        match (o.entry.label, o.hits.is_empty()) {
            (Label::Offending, false) => self.true_positives += 1,
            (Label::Offending, true) => self.false_negatives += 1,
            (Label::Benign, false) => self.false_positives += 1,
            (Label::Benign, true) => self.true_negatives += 1,
        }
    }

    /// Flagged offending over all flagged (1 when nothing is flagged).
    pub fn precision(&self) -> f64 {
        let flagged = self.true_positives + self.false_positives;
        if flagged == 0 {
            1.0
        } else {
            self.true_positives as f64 / flagged as f64
        }
    }

    /// Flagged offending over all offending (1 when there are none).
    pub fn recall(&self) -> f64 {
        let offending = self.true_positives + self.false_negatives;
        if offending == 0 {
            1.0
        } else {
            self.true_positives as f64 / offending as f64
        }
    }
}

/// The scores of one split.
#[derive(Debug, Clone)]
pub struct Report {
    /// Every entry of the split with its hits.
    pub outcomes: Vec<Outcome>,
    /// All entries together.
    pub total: Confusion,
    /// Per labelled category.
    pub by_category: BTreeMap<String, Confusion>,
    /// Per category of the rules that hit (true and false positives only): the precision of each kind of
    /// rule.
    pub by_rule_category: BTreeMap<String, Confusion>,
    /// Per evasion (an entry counts under each of its evasions).
    pub by_evasion: BTreeMap<String, Confusion>,
}

/// Scans every entry of `split` with `rules`.
pub fn score(entries: &[Entry], rules: &Arc<RuleSet>, split: Split) -> Report {
    let mut report = Report {
        outcomes: Vec::new(),
        total: Confusion::default(),
        by_category: BTreeMap::new(),
        by_rule_category: BTreeMap::new(),
        by_evasion: BTreeMap::new(),
    };
    for entry in entries.iter().filter(|e| e.split == split) {
        let mut scanner = Scanner::new(rules.clone(), entry.base_commit.as_deref());
        let outcome = Outcome {
            entry: entry.clone(),
            hits: scanner.scan_command(&entry.command),
        };
        report.total.add(&outcome);
        report
            .by_category
            .entry(entry.category.clone())
            .or_default()
            .add(&outcome);
        for evasion in &entry.evasions {
            report
                .by_evasion
                .entry(evasion.clone())
                .or_default()
                .add(&outcome);
        }
        let mut categories: Vec<&str> = outcome.hits.iter().map(|h| h.category.as_str()).collect();
        categories.sort_unstable();
        categories.dedup();
        for c in categories {
            report
                .by_rule_category
                .entry(c.to_string())
                .or_default()
                .add(&outcome);
        }
        report.outcomes.push(outcome);
    }
    report
}

impl Report {
    /// The report as Markdown: totals, the confusion per labelled category, precision per rule category,
    /// and every wrong entry.
    pub fn markdown(&self, title: &str) -> String {
        let mut out = String::new();
        let t = &self.total;
        let _ = writeln!(out, "### {title}\n");
        let _ = writeln!(
            out,
            "{} entries: precision {:.3}, recall {:.3} (TP {}, FN {}, FP {}, TN {})\n",
            self.outcomes.len(),
            t.precision(),
            t.recall(),
            t.true_positives,
            t.false_negatives,
            t.false_positives,
            t.true_negatives
        );
        let _ = writeln!(
            out,
            "| labelled category | entries | flagged | missed / wrongly flagged | recall | specificity |"
        );
        let _ = writeln!(out, "|---|---|---|---|---|---|");
        for (category, c) in &self.by_category {
            let offending = c.true_positives + c.false_negatives;
            if offending > 0 {
                let _ = writeln!(
                    out,
                    "| {category} (offending) | {offending} | {} | {} missed | {:.3} | |",
                    c.true_positives,
                    c.false_negatives,
                    c.recall()
                );
            } else {
                let benign = c.false_positives + c.true_negatives;
                let _ = writeln!(
                    out,
                    "| {category} (benign) | {benign} | {} | {} wrongly flagged | | {:.3} |",
                    c.false_positives,
                    c.false_positives,
                    c.true_negatives as f64 / benign.max(1) as f64
                );
            }
        }
        let _ = writeln!(
            out,
            "\n| rule category | flagged | of them offending | precision |"
        );
        let _ = writeln!(out, "|---|---|---|---|");
        for (category, c) in &self.by_rule_category {
            let _ = writeln!(
                out,
                "| {category} | {} | {} | {:.3} |",
                c.true_positives + c.false_positives,
                c.true_positives,
                c.precision()
            );
        }
        let _ = writeln!(out, "\n| evasion | offending flagged | benign flagged |");
        let _ = writeln!(out, "|---|---|---|");
        for (evasion, c) in &self.by_evasion {
            let _ = writeln!(
                out,
                "| {evasion} | {}/{} | {}/{} |",
                c.true_positives,
                c.true_positives + c.false_negatives,
                c.false_positives,
                c.false_positives + c.true_negatives
            );
        }
        let wrong: Vec<&Outcome> = self.outcomes.iter().filter(|o| !o.correct()).collect();
        if !wrong.is_empty() {
            let _ = writeln!(out, "\nWrong entries:\n");
            for o in wrong {
                let rules: Vec<&str> = o.hits.iter().map(|h| h.rule.as_str()).collect();
                let _ = writeln!(
                    out,
                    "- `{}` ({:?}): `{}` {}",
                    o.entry.id,
                    o.entry.label,
                    o.entry.command.replace('\n', "\\n"),
                    if rules.is_empty() {
                        "missed".to_string()
                    } else {
                        format!("flagged by {}", rules.join(", "))
                    }
                );
            }
        }
        out
    }
}
