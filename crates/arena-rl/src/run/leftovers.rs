//! What a resumed run does with what its killed process left in Arena, by what this Arena can do
//! (`econfig.arena_idempotent_launch`, `econfig.arena_cancel_tasks`).
//!
//! - Routes the journal names are deleted (every Arena has the endpoint).
//! - A task whose id is journaled and that is not done: cancelled where Arena can cancel (its sample is then
//!   launched afresh under a new key); where Arena cannot cancel but dedupes, its sample is relaunched under
//!   the key that started it, so Arena answers with that task and the resumed run collects it; where it can
//!   do neither, it is left running, journaled as no longer ours, and named in one warning.
//! - A launch journaled without an answer (a kill inside the launch POST): where Arena dedupes, the
//!   relaunch under the same key finds its task; elsewhere Arena may be running a task nothing collects,
//!   whose id never reached the journal (so no cancel can reach it), named in the same warning.

use std::collections::{BTreeMap, BTreeSet};

use arena_client::ArenaClient;
use stream_config::RunConfig;

use super::settings;
use super::setup::RunPaths;
use crate::error::{Context as _, Result};
use crate::journal::{Entry, Journal, JournalState, SampleKey};
use crate::workflow::Workflow;

/// What becomes of each task a killed process left open.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LeftoverPlan {
    /// Cancelled: Arena has the endpoint.
    pub cancel: BTreeSet<String>,
    /// Per sample, the key to relaunch it under: a deduping Arena answers with the task that key started.
    pub collect: BTreeMap<SampleKey, String>,
    /// Left running in Arena: it can neither cancel them nor answer a relaunch with them.
    pub abandon: BTreeSet<String>,
}

/// Sorts `replay`'s open tasks by what this Arena can do (see the module docs).
pub fn plan_leftovers(replay: &JournalState, idempotent: bool, cancel: bool) -> LeftoverPlan {
    let mut plan = LeftoverPlan::default();
    for task_id in &replay.open_tasks {
        if cancel {
            plan.cancel.insert(task_id.clone());
            continue;
        }
        // Only a training sample that is still to run is relaunched; an evaluation round or a finished
        // sample never launches again, so nothing would collect its task.
        let relaunch = match replay.task_launches.get(task_id) {
            Some((sample, Some(key)))
                if idempotent
                    && !sample.eval
                    && !replay.rollouts.contains_key(sample)
                    && !plan.collect.contains_key(sample) =>
            {
                Some((*sample, key.clone()))
            }
            _ => None,
        };
        match relaunch {
            Some((sample, key)) => {
                plan.collect.insert(sample, key);
            }
            None => {
                plan.abandon.insert(task_id.clone());
            }
        }
    }
    plan
}

/// Deletes the routes, and cancels, keeps for collection or abandons the tasks a killed run left behind;
/// returns `(routes deleted, tasks cancelled)` and the samples to relaunch under their old keys.
pub(super) async fn clean_leftovers(
    client: &ArenaClient,
    journal: &Journal,
    replay: &JournalState,
    config: &RunConfig,
    paths: &RunPaths,
) -> Result<((usize, usize), BTreeMap<SampleKey, String>)> {
    let econfig = &config.econfig;
    let plan = plan_leftovers(
        replay,
        econfig.arena_idempotent_launch,
        econfig.arena_cancel_tasks,
    );
    let timeout = settings::registration_timeout(config);
    let cleaned = Workflow::clean_leftovers(client, journal, &replay.open_routes, &plan.cancel, timeout)
        .await
        .with_context(|| {
            format!(
                "cleaning up after the previous run of {}",
                paths.run_dir.display()
            )
        })?;
    let abandoned: Vec<Entry> = plan
        .abandon
        .iter()
        .map(|task_id| Entry::TaskDone {
            task_id: task_id.clone(),
        })
        .collect();
    journal.append_all(&abandoned)?;
    if cleaned != (0, 0) {
        tracing::info!(
            routes = cleaned.0,
            tasks = cleaned.1,
            "cleaned up routes and tasks a killed run left behind"
        );
    }
    if !plan.collect.is_empty() {
        tracing::info!(
            tasks = plan.collect.len(),
            "the killed run left tasks running; their samples are launched again under the keys that \
             started them, which Arena answers with those tasks"
        );
    }
    launch_window(replay, &plan, config);
    Ok((cleaned, plan.collect))
}

/// Logs, once per resume, what the killed run may have left running that nothing will collect: tasks this
/// Arena can neither cancel nor hand back, and launches sent without an answer to an Arena that does not
/// dedupe (their ids never reached the journal, so no cancel can reach them).
fn launch_window(replay: &JournalState, plan: &LeftoverPlan, config: &RunConfig) {
    let idempotent = config.econfig.arena_idempotent_launch;
    let in_flight = &replay.launches_in_flight;
    if idempotent && !in_flight.is_empty() {
        tracing::info!(
            launches = in_flight.len(),
            "the killed run had launches without an answer; they are sent again with the same \
             Idempotency-Key, which Arena answers with the tasks it started"
        );
    }
    let unanswered: Vec<String> = if idempotent {
        Vec::new()
    } else {
        in_flight.iter().map(ToString::to_string).collect()
    };
    if unanswered.is_empty() && plan.abandon.is_empty() {
        return;
    }
    let list = |items: Vec<String>| {
        let n = items.len();
        let mut shown: Vec<String> = items.into_iter().take(8).collect();
        if n > 8 {
            shown.push(format!("and {} more", n - 8));
        }
        shown.join(", ")
    };
    tracing::warn!(
        tasks = %list(plan.abandon.iter().cloned().collect()),
        unanswered_launches = %list(unanswered),
        "the killed run may have left tasks running in Arena that nothing will collect: the tasks named \
         (econfig.arena_cancel_tasks=false, and Arena cannot hand them back without \
         econfig.arena_idempotent_launch) and a task for each launch of the samples named (sent without an \
         answer; their ids never reached the journal). Set econfig.arena_cancel_tasks=true if this Arena has \
         the cancel endpoint, econfig.arena_idempotent_launch=true if it honours the Idempotency-Key"
    );
}

#[cfg(test)]
mod tests;
