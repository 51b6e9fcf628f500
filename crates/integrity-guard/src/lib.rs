//! Reward-integrity rules (work in progress: the corpus comes first).
