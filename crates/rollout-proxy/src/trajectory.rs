//! A session's interactions as a tree of token deltas, and their export.
//!
//! Each interaction stores only what it added: the prompt tokens after its parent's sequence (the whole
//! prompt when it has no parent) and the tokens it sampled with their log-probabilities and (run-length
//! encoded) policy versions, and the temperature, top-p and top-k they were sampled at. A child's sequence is its parent's followed by its own delta, so no token is
//! ever re-tokenised and a shared prefix is stored once.

#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;

use serde_json::Value;

use crate::engine::SamplingParams;
use crate::export::{ExportOptions, ExportStyle, ExportedTrajectory};
use crate::integrity::{Hit, IntegrityHit};

/// The distribution an interaction's recorded log-probabilities are of, as exported per token.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct TokenSampling {
    /// The temperature of the logprobs: the sampling temperature, or 1 for greedy decoding.
    pub(crate) temperature: f32,
    pub(crate) top_p: f32,
    /// 0 when no top-k applied.
    pub(crate) top_k: u32,
    pub(crate) truncated: bool,
}

impl TokenSampling {
    /// What prompt, tool and template tokens carry: nothing sampled them.
    pub(crate) const NEUTRAL: Self = Self {
        temperature: 1.0,
        top_p: 1.0,
        top_k: 0,
        truncated: false,
    };

    /// The values of a generation sampled with `p`. Greedy tokens are recorded under the plain softmax,
    /// so they carry the neutral values.
    pub(crate) fn of(p: &SamplingParams) -> Self {
        if p.temperature > 0.0 {
            Self {
                temperature: p.temperature,
                top_p: p.top_p,
                top_k: p.top_k.unwrap_or(0),
                truncated: p.is_truncated(),
            }
        } else {
            Self::NEUTRAL
        }
    }
}

/// Why an interaction's generation ended, as recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Stop,
    Length,
    ToolCalls,
}

impl Finish {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
        }
    }
}

/// One recorded generation.
#[derive(Debug)]
pub(crate) struct Interaction {
    pub(crate) id: Box<str>,
    pub(crate) parent: Option<u32>,
    pub(crate) prompt_delta: Box<[u32]>,
    pub(crate) output: Box<[u32]>,
    pub(crate) logprobs: Box<[f32]>,
    /// (first output index, version) runs.
    pub(crate) versions: Box<[(u32, u32)]>,
    /// What the output was sampled at.
    pub(crate) sampling: TokenSampling,
    /// The key of the request's messages (identical inputs share it).
    pub(crate) input_key: u64,
    /// The key of the request's messages followed by this interaction's output message.
    pub(crate) chain_key: u64,
    /// The stop token the output ended with, if it ended with one.
    pub(crate) stop_token: Option<u32>,
    pub(crate) finish: Finish,
    pub(crate) reward: Option<f64>,
    /// What the integrity guard found in the output (at most
    /// [`crate::integrity::MAX_HITS_PER_INTERACTION`]).
    pub(crate) integrity_hits: Box<[Hit]>,
    /// The text this interaction's sequence ends at: the rendering its prompt was taken from, then its output
    /// as decoded and its stop token (unknown when an output token has no text, or a stop string cut it).
    pub(crate) text: Option<TextPrint>,
}

/// The length and a hash of a text (SipHash under keys drawn once per process, so a client cannot aim at a
/// collision).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TextHash {
    len: usize,
    hash: u64,
}

impl TextHash {
    pub(crate) fn of(text: &str) -> Self {
        static KEYS: OnceLock<RandomState> = OnceLock::new();
        Self {
            len: text.len(),
            hash: KEYS.get_or_init(RandomState::new).hash_one(text.as_bytes()),
        }
    }
}

/// The text an interaction's sequence ends at: the rendering its prompt was taken from, then its output as
/// decoded with its stop token. A later request whose rendering begins with exactly that text extends the
/// sequence by the rest, without rendering the earlier messages a second time to find where they end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TextPrint {
    pub(crate) prompt: TextHash,
    pub(crate) output: TextHash,
}

impl TextPrint {
    /// What follows this text in `rendering`, when `rendering` begins with exactly this text.
    pub(crate) fn rest_of<'t>(&self, rendering: &'t str) -> Option<&'t str> {
        let end = self.prompt.len.checked_add(self.output.len)?;
        let prompt = rendering.get(..self.prompt.len)?;
        let output = rendering.get(self.prompt.len..end)?;
        (TextHash::of(prompt) == self.prompt && TextHash::of(output) == self.output)
            .then(|| &rendering[end..])
    }
}

impl Interaction {
    pub(crate) fn stored_tokens(&self) -> u64 {
        (self.prompt_delta.len() + self.output.len()) as u64
    }

    fn version_at(&self, index: usize) -> u32 {
        let run = self
            .versions
            .partition_point(|(start, _)| (*start as usize) <= index);
        run.checked_sub(1).map_or(0, |r| self.versions[r].1)
    }
}

/// Run-length encodes per-token versions.
pub(crate) fn encode_versions(versions: impl IntoIterator<Item = u32>) -> Box<[(u32, u32)]> {
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for (i, v) in versions.into_iter().enumerate() {
        if runs.last().is_none_or(|(_, last)| *last != v) {
            runs.push((i as u32, v));
        }
    }
    runs.into_boxed_slice()
}

/// The interactions an export keeps (oldest first), then every interaction's discounted and original reward.
type Rewards = (Vec<usize>, Vec<f64>, Vec<f64>);

/// A session's interactions, in creation order.
#[derive(Debug, Default)]
pub(crate) struct Trajectory {
    interactions: Vec<Interaction>,
    by_chain: HashMap<u64, u32>,
}

/// The parent a new request extends.
#[derive(Debug, Clone)]
pub(crate) struct ParentMatch {
    pub(crate) index: u32,
    /// How many of the request's messages the parent's messages plus its output cover.
    pub(crate) covered: usize,
    /// The parent's full token sequence.
    pub(crate) tokens: Vec<u32>,
    pub(crate) stop_token: Option<u32>,
    /// The text the parent's sequence ends at, when known.
    pub(crate) text: Option<TextPrint>,
}

impl Trajectory {
    pub(crate) fn len(&self) -> usize {
        self.interactions.len()
    }

    /// The newest interaction whose messages plus output are the longest prefix of a request whose running
    /// message keys are `chain` (`chain[i]` covers messages `0..=i`).
    pub(crate) fn find_parent(&self, chain: &[u64]) -> Option<ParentMatch> {
        for covered in (1..=chain.len()).rev() {
            if let Some(&index) = self.by_chain.get(&chain[covered - 1]) {
                let parent = &self.interactions[index as usize];
                return Some(ParentMatch {
                    index,
                    covered,
                    tokens: self.full_tokens(index),
                    stop_token: parent.stop_token,
                    text: parent.text,
                });
            }
        }
        None
    }

    /// The chain of `index`, root first.
    fn lineage(&self, index: u32) -> Vec<u32> {
        let mut chain = vec![index];
        let mut at = index;
        while let Some(parent) = self.interactions[at as usize].parent {
            chain.push(parent);
            at = parent;
        }
        chain.reverse();
        chain
    }

    /// Every token of `index`'s sequence: its ancestors' deltas and outputs, then its own.
    pub(crate) fn full_tokens(&self, index: u32) -> Vec<u32> {
        let mut out = Vec::new();
        for i in self.lineage(index) {
            let it = &self.interactions[i as usize];
            out.extend_from_slice(&it.prompt_delta);
            out.extend_from_slice(&it.output);
        }
        out
    }

    pub(crate) fn push(&mut self, interaction: Interaction) {
        let index = self.interactions.len() as u32;
        self.by_chain.insert(interaction.chain_key, index);
        self.interactions.push(interaction);
    }

    /// Sets the reward of interaction `id` (the newest when `None`), or with `reward` `None` only finds
    /// it; answers its id.
    pub(crate) fn set_reward(&mut self, id: Option<&str>, reward: Option<f64>) -> Result<String, String> {
        let target = match id {
            None => self
                .interactions
                .last_mut()
                .ok_or("the session has no interactions")?,
            Some(id) => self
                .interactions
                .iter_mut()
                .find(|i| &*i.id == id)
                .ok_or_else(|| format!("unknown interaction_id {id:?}"))?,
        };
        if reward.is_some() {
            target.reward = reward;
        }
        Ok(target.id.to_string())
    }

    /// Builds the export of this trajectory; fails, naming the interaction, when a discounted reward is
    /// not finite (each input is finite, but `r_i + discount * r_{i+1}` can overflow).
    #[cfg(test)]
    pub(crate) fn export(
        &self,
        session_id: &str,
        metadata: &Value,
        options: &ExportOptions,
    ) -> Result<Vec<ExportedTrajectory>, String> {
        self.export_counting(session_id, metadata, options)
            .map(|(t, _)| t)
    }

    /// [`Trajectory::export`], with the number of leaves a `concat` export left out: it writes at most
    /// `options.max_amplification` times the tokens the kept interactions store, newest leaves first (the
    /// newest always), so branches off one long turn cannot repeat it without bound.
    pub(crate) fn export_counting(
        &self,
        session_id: &str,
        metadata: &Value,
        options: &ExportOptions,
    ) -> Result<(Vec<ExportedTrajectory>, usize), String> {
        let (kept, discounted, original) = self.rewards(session_id, options)?;
        let n = self.interactions.len();
        let mut live_children = vec![0u32; n];
        for &i in &kept {
            if let Some(p) = self.interactions[i].parent {
                live_children[p as usize] += 1;
            }
        }
        let mut chosen: Vec<usize> = kept
            .iter()
            .copied()
            .filter(|&i| options.style == ExportStyle::Individual || live_children[i] == 0)
            .collect();
        let mut dropped = 0;
        if options.style == ExportStyle::Concat {
            let stored: u64 = kept.iter().map(|&i| self.interactions[i].stored_tokens()).sum();
            let bound = stored.saturating_mul(u64::from(options.max_amplification.max(1)));
            let mut written = 0u64;
            let mut keep = vec![false; chosen.len()];
            for (j, &leaf) in chosen.iter().enumerate().rev() {
                let tokens: u64 = self
                    .lineage(leaf as u32)
                    .iter()
                    .map(|&i| self.interactions[i as usize].stored_tokens())
                    .sum();
                if written == 0 || written + tokens <= bound {
                    written += tokens;
                    keep[j] = true;
                } else {
                    dropped += 1;
                }
            }
            let mut flags = keep.into_iter();
            chosen.retain(|_| flags.next().unwrap_or(false));
        }
        let (mut discounted, mut original) = (discounted, original);
        if let Some(r) = options.episode_reward
            && options.style == ExportStyle::Concat
            && self.episode_reward_fits(session_id, &chosen, &kept, options.final_reward, r)
        {
            for &leaf in &chosen {
                discounted[leaf] = r;
                original[leaf] = r;
            }
        }
        let trajectories = chosen
            .iter()
            .map(|&i| {
                self.build(
                    i as u32,
                    session_id,
                    metadata,
                    options.style,
                    discounted[i],
                    original[i],
                )
            })
            .collect();
        Ok((trajectories, dropped))
    }

    /// Whether the episode's reward `r` may score every exported leaf (`leaves`) of a `concat` export:
    /// some leaf has no reward of its own, and the graph is unambiguous (no turn reached from two leaves,
    /// every turn with output, no reward on a turn that is not a leaf, no leaf's reward other than `r`).
    /// `final_reward` is the reward of the newest kept interaction. Says why when it may not.
    fn episode_reward_fits(
        &self,
        session_id: &str,
        leaves: &[usize],
        kept: &[usize],
        final_reward: Option<f64>,
        r: f64,
    ) -> bool {
        let newest = kept.last().copied();
        let reward_of = |i: usize| match final_reward {
            Some(f) if Some(i) == newest => Some(f),
            _ => self.interactions[i].reward,
        };
        if leaves.iter().all(|&leaf| reward_of(leaf).is_some()) {
            return false;
        }
        let mut seen = vec![false; self.interactions.len()];
        let problem = leaves.iter().find_map(|&leaf| {
            if reward_of(leaf).is_some_and(|own| own != r) {
                return Some(format!(
                    "leaf {} is scored {:?}",
                    self.interactions[leaf].id,
                    reward_of(leaf)
                ));
            }
            self.lineage(leaf as u32).into_iter().find_map(|turn| {
                let turn = turn as usize;
                let it = &self.interactions[turn];
                if std::mem::replace(&mut seen[turn], true) {
                    Some(format!("turn {} is shared by two chains", it.id))
                } else if it.output.is_empty() {
                    Some(format!("turn {} has no output", it.id))
                } else if turn != leaf && reward_of(turn).is_some() {
                    Some(format!("turn {} is scored but not a leaf", it.id))
                } else {
                    None
                }
            })
        });
        if let Some(problem) = problem {
            tracing::warn!(
                session_id,
                %problem,
                "the session has ambiguous or explicitly scored branches; leaving missing rewards unchanged"
            );
            return false;
        }
        true
    }

    /// The interactions an export keeps (oldest first) and every interaction's discounted and original
    /// reward; an error names the first interaction whose discounted reward is not finite.
    pub(crate) fn rewards(&self, session_id: &str, options: &ExportOptions) -> Result<Rewards, String> {
        let n = self.interactions.len();
        let mut keep: Vec<bool> = self.interactions.iter().map(|i| !i.output.is_empty()).collect();
        let mut children = vec![0u32; n];
        for it in &self.interactions {
            if let Some(p) = it.parent {
                children[p as usize] += 1;
            }
        }
        if options.drop_retry_orphans {
            let mut groups: HashMap<(u64, Option<u32>), Vec<usize>> = HashMap::new();
            for (i, it) in self.interactions.iter().enumerate() {
                groups.entry((it.input_key, it.parent)).or_default().push(i);
            }
            for members in groups.values().filter(|m| m.len() > 1) {
                if members.iter().any(|&i| children[i] > 0) {
                    for &i in members.iter().filter(|&&i| children[i] == 0) {
                        keep[i] = false;
                    }
                } else {
                    for &i in &members[..members.len() - 1] {
                        keep[i] = false;
                    }
                }
            }
        }
        let kept: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
        let mut original: Vec<f64> = self
            .interactions
            .iter()
            .map(|i| i.reward.unwrap_or(0.0))
            .collect();
        if let (Some(r), Some(&last)) = (options.final_reward, kept.last()) {
            original[last] = r;
        }
        if let Some(&last) = kept.last()
            && self.interactions[last].reward.is_none()
            && options.final_reward.is_none()
        {
            tracing::warn!(
                session_id,
                "exporting a session whose newest interaction has no reward"
            );
        }
        let mut discounted = original.clone();
        let mut next: Option<f64> = None;
        for &i in kept.iter().rev() {
            if let Some(later) = next {
                discounted[i] += options.discount * later;
            }
            if !discounted[i].is_finite() {
                return Err(format!(
                    "the discounted reward of interaction {} is not finite (its reward {:e} plus discount {:e} times the next one's overflows)",
                    self.interactions[i].id, original[i], options.discount
                ));
            }
            next = Some(discounted[i]);
        }
        Ok((kept, discounted, original))
    }

    fn build(
        &self,
        index: u32,
        session_id: &str,
        metadata: &Value,
        style: ExportStyle,
        reward: f64,
        original_reward: f64,
    ) -> ExportedTrajectory {
        let lineage = self.lineage(index);
        let total: usize = lineage
            .iter()
            .map(|&i| self.interactions[i as usize].stored_tokens() as usize)
            .sum();
        let mut t = ExportedTrajectory {
            session_id: session_id.to_string(),
            interaction_id: self.interactions[index as usize].id.to_string(),
            interaction_ids: lineage
                .iter()
                .map(|&i| self.interactions[i as usize].id.to_string())
                .collect(),
            token_ids: Vec::with_capacity(total),
            loss_mask: Vec::with_capacity(total),
            logprobs: Vec::with_capacity(total),
            versions: Vec::with_capacity(total),
            temperatures: Vec::with_capacity(total),
            top_ps: Vec::with_capacity(total),
            top_ks: Vec::with_capacity(total),
            truncated: Vec::with_capacity(total),
            prompt_len: 0,
            reward,
            original_reward,
            finish_reason: self.interactions[index as usize].finish.as_str().to_string(),
            metadata: metadata.clone(),
            integrity_hits: lineage
                .iter()
                .flat_map(|&i| {
                    let it = &self.interactions[i as usize];
                    it.integrity_hits.iter().map(|h| IntegrityHit {
                        interaction_id: it.id.to_string(),
                        rule: h.rule.clone(),
                        category: h.category.clone(),
                        matched: h.matched.clone(),
                    })
                })
                .collect(),
        };
        let mut first_trained = None;
        for &i in &lineage {
            let it = &self.interactions[i as usize];
            t.token_ids.extend_from_slice(&it.prompt_delta);
            t.loss_mask
                .extend(std::iter::repeat_n(0u8, it.prompt_delta.len()));
            t.logprobs
                .extend(std::iter::repeat_n(0.0f32, it.prompt_delta.len()));
            t.versions
                .extend(std::iter::repeat_n(-1i64, it.prompt_delta.len()));
            t.push_sampling(TokenSampling::NEUTRAL, it.prompt_delta.len());
            t.push_sampling(it.sampling, it.output.len());
            let trains = style == ExportStyle::Concat || i == index;
            if trains && first_trained.is_none() {
                first_trained = Some(t.token_ids.len());
            }
            t.token_ids.extend_from_slice(&it.output);
            for (k, lp) in it.logprobs.iter().enumerate() {
                t.loss_mask.push(u8::from(trains));
                t.logprobs.push(if trains { *lp } else { 0.0 });
                t.versions
                    .push(if trains { i64::from(it.version_at(k)) } else { -1 });
            }
        }
        t.prompt_len = first_trained.unwrap_or(t.token_ids.len());
        t
    }
}

impl ExportedTrajectory {
    fn push_sampling(&mut self, s: TokenSampling, n: usize) {
        self.temperatures.extend(std::iter::repeat_n(s.temperature, n));
        self.top_ps.extend(std::iter::repeat_n(s.top_p, n));
        self.top_ks.extend(std::iter::repeat_n(s.top_k, n));
        self.truncated
            .extend(std::iter::repeat_n(u8::from(s.truncated), n));
    }
}
