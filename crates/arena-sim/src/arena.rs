//! The running Arena behind the router: the world's settings, the mutable state, the harnesses that run
//! tasks, and the client the gateway forwards with. Every handler holds an `Arc<Arena>`.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;

use tokio::sync::{oneshot, watch};
use tokio::task::AbortHandle;

use crate::harness::{HarnessContext, HarnessSet, LaunchReply, lock};
use crate::state::ArenaState;
use crate::world::CancelEndpoint;

pub(crate) struct Arena {
    pub(crate) state: Mutex<ArenaState>,
    /// The control plane's bearer token.
    pub(crate) token: String,
    /// The gateway's LLM key (`None`: any non-empty key).
    pub(crate) llm_api_key: Option<String>,
    /// Whether dataset pages carry `items` (rows with tags) besides `data_ids`.
    pub(crate) dataset_items: bool,
    pub(crate) cancel_endpoint: CancelEndpoint,
    pub(crate) task_id_prefix: String,
    pub(crate) harnesses: HarnessSet,
    pub(crate) base_url: String,
    /// The gateway's pooled client for upstream calls.
    pub(crate) http: reqwest::Client,
    /// Bumped on every request and task change, so tests wait for a condition without polling.
    pub(crate) changed: watch::Sender<u64>,
}

impl Arena {
    /// Wakes everything waiting for a change.
    pub(crate) fn bump(&self) {
        self.changed.send_modify(|v| *v = v.wrapping_add(1));
    }

    /// The LLM gateway URL handed to harnesses.
    pub(crate) fn gateway_url(&self) -> String {
        format!("{}/api", self.base_url)
    }

    /// Starts the harness for a new task and a watcher that stores its outcome when it is done (and then
    /// fires `done`). Called under the state lock, so the watcher's first lock waits for the task's entry.
    pub(crate) fn start_task(
        self: &Arc<Self>,
        ctx: HarnessContext,
        done: oneshot::Sender<()>,
    ) -> (LaunchReply, AbortHandle) {
        let id = ctx.task_id.clone();
        let run = self.harnesses.select(ctx.harness.as_deref()).start(ctx);
        let arena = self.clone();
        let outcome = run.outcome;
        let handle = tokio::spawn(async move {
            let outcome = outcome.await;
            {
                let mut state = lock(&arena.state);
                if let Some(task) = state.tasks.get_mut(&id) {
                    task.progress = outcome.progress.iter().cloned().collect::<VecDeque<_>>();
                    task.outcome = Some(outcome);
                    task.abort = None;
                }
            }
            arena.bump();
            let _ = done.send(());
        });
        (run.reply, handle.abort_handle())
    }
}
