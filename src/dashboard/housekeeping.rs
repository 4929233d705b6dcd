//! Deletes the dashboard's records once nothing reads them: sign-in
//! failures and sign-up attempts (read only within their windows of 15
//! minutes and an hour), and expired sessions, device cookies and password
//! links. Without it these tables grow with every guess an attacker makes.

use std::sync::Arc;
use std::time::Duration;

use chrono::Utc;
use tokio_util::sync::CancellationToken;

use crate::store::Store;

/// How often the tables are pruned.
const EVERY: Duration = Duration::from_secs(3600);

/// Attempts are kept this long, well past the longest window that reads
/// them (an hour), so an operator can still look at a day's attacks.
const KEEP_ATTEMPTS: chrono::Duration = chrono::Duration::days(1);

/// Prunes once now and then every hour until `shutdown`.
pub fn spawn_pruning(store: Arc<dyn Store>, shutdown: CancellationToken) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(EVERY);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                _ = every.tick() => prune(store.as_ref()).await,
            }
        }
    });
}

async fn prune(store: &dyn Store) {
    let now = Utc::now();
    match store
        .prune_dashboard_records(now - KEEP_ATTEMPTS, now)
        .await
    {
        Ok(0) => {}
        Ok(deleted) => tracing::info!(deleted, "pruned expired dashboard records"),
        // Several replicas prune the same tables; a failure is retried at
        // the next tick and costs only disk space meanwhile.
        Err(e) => tracing::warn!(error = %e, "pruning dashboard records failed"),
    }
}
