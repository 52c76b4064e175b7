//! Starting while a store is unreachable: a node whose Postgres is not up yet (a cluster
//! starting together, a database restarting) waits for it with capped, jittered backoff
//! instead of exiting, so an orchestrator sees a process that is alive and not ready rather
//! than a crash loop. Meanwhile the admin listener answers `/health` 200 and `/ready` 503
//! saying what it waits for; once the node is up it hands every request to the node's own
//! admin routes.

use std::convert::Infallible;
use std::fmt::Display;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use pico_common::clock::SharedClock;
use tower::ServiceExt;

/// First and longest wait between attempts (doubled per failure, jittered).
pub const RETRY_MIN: Duration = Duration::from_millis(200);
pub const RETRY_MAX: Duration = Duration::from_secs(10);
/// At most one "still waiting" line per this long: a node left waiting for hours writes a
/// few lines a minute, not one per attempt.
pub const LOG_EVERY: Duration = Duration::from_secs(30);

/// What a start phase is doing, handed to a [`StartHook`].
#[derive(Clone, Copy, Debug)]
pub enum StartEvent<'a> {
    /// Attempt number `attempt` (from 0) of `what` begins.
    Attempt { what: &'static str, attempt: u64 },
    /// That attempt failed with an error a later one may not give (it is retried).
    Retrying {
        what: &'static str,
        attempt: u64,
        error: &'a str,
    },
}

/// Called at each [`StartEvent`]: tests cut and restore a store at a chosen phase with it.
pub type StartHook = Arc<dyn Fn(StartEvent<'_>) + Send + Sync>;

/// What the starting node waits for, and the node's admin routes once it is up.
#[derive(Default)]
pub struct Startup {
    waiting: Mutex<Waiting>,
    admin: OnceLock<Router>,
    /// `true` once the node serves ([`Startup::serve`]).
    up: tokio::sync::watch::Sender<bool>,
    hook: Option<StartHook>,
}

#[derive(Default, Clone)]
struct Waiting {
    what: Option<&'static str>,
    attempts: u64,
}

impl Startup {
    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A start that reports each attempt and retry to `hook`.
    pub fn with_hook(hook: StartHook) -> Startup {
        Startup {
            hook: Some(hook),
            ..Startup::default()
        }
    }

    fn report(&self, event: StartEvent<'_>) {
        if let Some(hook) = &self.hook {
            hook(event);
        }
    }

    /// From now on the admin listener serves `router` (the node's admin routes).
    pub fn serve(&self, router: Router) {
        let _ = self.admin.set(router);
        self.up.send_replace(true);
    }

    /// Resolves once the node serves (its listeners bound, `/ready` answered by the node).
    pub async fn until_up(&self) {
        let mut rx = self.up.subscribe();
        // The sender lives in `self`, so the wait cannot end with it dropped.
        let _ = rx.wait_for(|up| *up).await;
    }

    /// The admin listener's app for the whole life of the process.
    pub fn router(self: &Arc<Self>) -> Router {
        let me = self.clone();
        Router::new().fallback(move |req: Request| {
            let me = me.clone();
            async move { me.handle(req).await }
        })
    }

    async fn handle(&self, req: Request) -> Response {
        if let Some(admin) = self.admin.get() {
            let answered: Result<Response, Infallible> = admin.clone().oneshot(req).await;
            return match answered {
                Ok(r) => r,
                Err(never) => match never {},
            };
        }
        let w = self.waiting().clone();
        match req.uri().path() {
            // Alive: a liveness probe must not restart a node that only waits for its database.
            "/health" => "ok".into_response(),
            "/ready" => (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(serde_json::json!({
                    "ready": false,
                    "starting": true,
                    "waitingFor": w.what,
                    "attempts": w.attempts,
                })),
            )
                .into_response(),
            _ => (StatusCode::SERVICE_UNAVAILABLE, "starting\n").into_response(),
        }
    }

    /// Runs `open` until it succeeds (`Some`) or fails with an error `retryable` refuses,
    /// sleeping on `clock` between attempts; `None` if `stop` resolves during such a sleep (a
    /// shutdown while waiting; an attempt under way is let finish). Logs the first failure,
    /// then at most one line per [`LOG_EVERY`], and the success after waiting.
    pub async fn retry<T, E, F, Fut, S>(
        &self,
        clock: &SharedClock,
        what: &'static str,
        retryable: impl Fn(&E) -> bool,
        mut open: F,
        stop: &mut S,
    ) -> Result<Option<T>, E>
    where
        E: Display,
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        S: Future<Output = ()> + Unpin,
    {
        let started = clock.now_ms();
        let mut failures = 0u64;
        let mut logged_at: Option<i64> = None;
        loop {
            *self.waiting() = Waiting {
                what: Some(what),
                attempts: failures,
            };
            self.report(StartEvent::Attempt {
                what,
                attempt: failures,
            });
            match open().await {
                Ok(v) => {
                    if failures > 0 {
                        tracing::info!(
                            what,
                            attempts = failures + 1,
                            waited_ms = clock.now_ms() - started,
                            "reachable; starting"
                        );
                    }
                    return Ok(Some(v));
                }
                Err(e) if retryable(&e) => {
                    let error = e.to_string();
                    self.report(StartEvent::Retrying {
                        what,
                        attempt: failures,
                        error: &error,
                    });
                    failures += 1;
                    let wait = pico_sql::backoff::retry_delay(RETRY_MIN, RETRY_MAX, failures);
                    // Every retry at debug; the warning below is rate-limited.
                    tracing::debug!(
                        what,
                        error,
                        attempts = failures,
                        wait_ms = wait.as_millis() as u64,
                        "start phase failed; retrying"
                    );
                    let now = clock.now_ms();
                    let due = logged_at.is_none_or(|t| now - t >= LOG_EVERY.as_millis() as i64);
                    if due {
                        logged_at = Some(now);
                        tracing::warn!(
                            what,
                            error = %e,
                            attempts = failures,
                            waited_ms = now - started,
                            "unreachable at start; waiting for it (retrying with backoff, \
                             /ready answers 503 meanwhile)"
                        );
                    }
                    tokio::select! {
                        _ = clock.sleep(wait) => {}
                        _ = &mut *stop => return Ok(None),
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pico_common::clock::ManualClock;
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Waits (bounded) until the retry loop made `calls` attempts and sleeps on the clock.
    async fn until_asleep_after(clock: &ManualClock, count: &AtomicU64, calls: u64) {
        for _ in 0..10_000 {
            if count.load(Ordering::SeqCst) == calls && clock.sleepers() > 0 {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the retry loop never slept after attempt {calls}");
    }

    #[tokio::test]
    async fn retries_with_backoff_until_the_store_answers() {
        let manual = ManualClock::new(1_000);
        let clock: SharedClock = manual.clone();
        let startup = Arc::new(Startup::default());
        let calls = Arc::new(AtomicU64::new(0));
        let task = {
            let (startup, calls, clock) = (startup.clone(), calls.clone(), clock.clone());
            tokio::spawn(async move {
                startup
                    .retry(
                        &clock,
                        "metadata store",
                        |_: &String| true,
                        || {
                            let n = calls.fetch_add(1, Ordering::SeqCst);
                            async move {
                                if n < 3 {
                                    Err(format!("refused {n}"))
                                } else {
                                    Ok(n)
                                }
                            }
                        },
                        &mut std::future::pending::<()>(),
                    )
                    .await
            })
        };
        for failures in 1..=3u64 {
            until_asleep_after(&manual, &calls, failures).await;
            assert_eq!(startup.waiting().what, Some("metadata store"));
            // Not before the backoff's floor: half of the exponential step.
            manual
                .advance(RETRY_MIN * 2u32.pow(failures as u32 - 1) / 2 - Duration::from_millis(1));
            tokio::task::yield_now().await;
            assert_eq!(calls.load(Ordering::SeqCst), failures, "retried too early");
            manual.advance(RETRY_MAX);
        }
        assert_eq!(task.await.unwrap(), Ok(Some(3)));
    }

    #[tokio::test]
    async fn an_error_no_wait_can_fix_is_returned_at_once() {
        let clock = pico_common::clock::system();
        let startup = Startup::default();
        let r: Result<Option<()>, String> = startup
            .retry(
                &clock,
                "WAL",
                |e: &String| e != "bad url",
                || async { Err("bad url".to_string()) },
                &mut std::future::pending::<()>(),
            )
            .await;
        assert_eq!(r, Err("bad url".to_string()));
    }

    #[tokio::test]
    async fn a_shutdown_while_waiting_ends_the_wait() {
        let clock = pico_common::clock::system();
        let startup = Startup::default();
        let r: Result<Option<()>, String> = startup
            .retry(
                &clock,
                "metadata store",
                |_: &String| true,
                || async { Err("refused".to_string()) },
                &mut std::future::ready(()),
            )
            .await;
        assert_eq!(r, Ok(None));
    }
}
