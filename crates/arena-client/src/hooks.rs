//! The moments of one rollout that a caller makes durable before Arena can act on them.
//!
//! A training loop journals each moment so that a killed run's successor can delete the routes and collect
//! or cancel the tasks it left behind. Every hook returns a `Result`: an error stops the rollout cleanly
//! (nothing further is sent, what exists is cleaned up) and comes back as [`crate::Error::Hook`].

/// What a hook reports when it cannot record its moment (for example a journal that cannot be written).
pub type HookError = Box<dyn std::error::Error + Send + Sync>;

/// The result of a hook.
pub type HookResult = std::result::Result<(), HookError>;

/// Callbacks at each durable moment of [`crate::ArenaClient::run_rollout`] and
/// [`crate::ArenaClient::run_task_with`]. Every method defaults to doing nothing.
pub trait RolloutHooks: Send + Sync {
    /// A gateway-mode route's name, chosen and about to be registered: called before the POST, since the
    /// registration may land even when its answer is lost.
    fn before_register(&self, _route: &str) -> HookResult {
        Ok(())
    }

    /// The launch is about to be sent, with the idempotency key it carries.
    fn before_launch(&self, _idempotency_key: Option<&str>) -> HookResult {
        Ok(())
    }

    /// Arena answered the launch with a queued or running task; called before polling it.
    fn task_started(&self, _task_id: &str) -> HookResult {
        Ok(())
    }

    /// A task reported by [`RolloutHooks::task_started`] is terminal, or was cancelled, or is no longer
    /// polled.
    fn task_finished(&self, _task_id: &str) -> HookResult {
        Ok(())
    }

    /// A gateway-mode route was deleted (or found already gone).
    fn route_deleted(&self, _route: &str) -> HookResult {
        Ok(())
    }
}

/// Hooks that record nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoHooks;

impl RolloutHooks for NoHooks {}
