//! Usage metering: every authenticated request becomes one `UsageEvent`,
//! buffered in a bounded queue and written in batches by one task.
//!
//! A request reserves its place in the queue before it is handled, so every
//! response the service sends has its event stored or queued: when the queue
//! is full (the database has been away for long), new requests get 503
//! instead of going unrecorded. Batches that cannot be written are retried
//! with back-off; at shutdown the queue is drained, and whatever the database
//! still refuses after the grace period is spilled to a file that is loaded
//! again at the next start.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::store::{Store, StoreError, UsageEvent};

const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Counts the handler knows and the metering layer does not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UsageStats {
    pub text_items: u32,
    pub text_chars: u64,
    pub image_items: u32,
    pub image_bytes: u64,
    pub deep_analyses: u32,
    pub flagged: bool,
}

/// The queue is full: the request must be refused, not served unmetered.
#[derive(Debug)]
pub struct QueueFull;

/// A reserved place in the queue for one event.
pub struct UsagePermit(mpsc::OwnedPermit<UsageEvent>);

impl UsagePermit {
    pub fn record(self, event: UsageEvent) {
        self.0.send(event);
    }
}

/// The sending side, shared by all requests.
#[derive(Clone)]
pub struct UsageRecorder {
    sender: mpsc::Sender<UsageEvent>,
}

/// The writer task; `finish` drains it.
pub struct UsageWriter {
    handle: JoinHandle<()>,
    give_up: CancellationToken,
}

#[derive(Clone, Debug)]
pub struct UsageSettings {
    pub capacity: usize,
    pub batch_size: usize,
    /// Where events that could not be written at shutdown are kept.
    pub spill_dir: PathBuf,
}

impl UsageRecorder {
    pub fn start(store: Arc<dyn Store>, settings: UsageSettings) -> (UsageRecorder, UsageWriter) {
        let (sender, receiver) = mpsc::channel(settings.capacity);
        let give_up = CancellationToken::new();
        let handle = tokio::spawn(write_loop(store, receiver, settings, give_up.clone()));
        (UsageRecorder { sender }, UsageWriter { handle, give_up })
    }

    pub fn reserve(&self) -> Result<UsagePermit, QueueFull> {
        self.sender
            .clone()
            .try_reserve_owned()
            .map(UsagePermit)
            .map_err(|_| QueueFull)
    }
}

impl UsageWriter {
    /// Waits until every queued event is written (all recorders must be
    /// dropped first), at most `grace`; then spills what is left.
    pub async fn finish(self, grace: Duration) {
        let UsageWriter {
            mut handle,
            give_up,
        } = self;
        if tokio::time::timeout(grace, &mut handle).await.is_err() {
            give_up.cancel();
            let _ = handle.await;
        }
    }
}

async fn write_loop(
    store: Arc<dyn Store>,
    mut receiver: mpsc::Receiver<UsageEvent>,
    settings: UsageSettings,
    give_up: CancellationToken,
) {
    let mut batch = Vec::with_capacity(settings.batch_size);
    // Events arriving while a batch is written wait in the queue and form the
    // next batch: under load, batches grow by themselves.
    while receiver.recv_many(&mut batch, settings.batch_size).await > 0 {
        if !write_with_retry(store.as_ref(), &batch, &give_up, &settings.spill_dir).await {
            receiver.close();
            while let Ok(event) = receiver.try_recv() {
                batch.push(event);
            }
            spill(&settings.spill_dir, &batch);
            return;
        }
        batch.clear();
    }
}

/// `false` when told to give up before the batch could be written.
async fn write_with_retry(
    store: &dyn Store,
    batch: &[UsageEvent],
    give_up: &CancellationToken,
    spill_dir: &Path,
) -> bool {
    let mut backoff = Duration::from_millis(50);
    loop {
        match store.insert_usage(batch).await {
            Ok(()) => return true,
            // A constraint refuses some event (it names a key that is not
            // there): retrying the batch would never succeed, so write the
            // events one by one and keep the refused ones on disk.
            Err(StoreError::Conflict(reason)) => {
                tracing::error!(%reason, events = batch.len(), "usage batch refused by a constraint; writing its events one by one");
                let mut refused = Vec::new();
                for event in batch {
                    if let Err(error) = store.insert_usage(std::slice::from_ref(event)).await {
                        tracing::error!(%error, request_id = %event.request_id, "usage event refused");
                        refused.push(event.clone());
                    }
                }
                spill(spill_dir, &refused);
                return true;
            }
            Err(error) => {
                tracing::warn!(%error, events = batch.len(), "usage batch not written; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = give_up.cancelled() => return false,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

fn spill(dir: &Path, events: &[UsageEvent]) {
    if events.is_empty() {
        return;
    }
    let path = dir.join(format!(
        "usage-spill-{}.jsonl",
        uuid::Uuid::now_v7().simple()
    ));
    let lines: String = events
        .iter()
        .filter_map(|e| serde_json::to_string(e).ok())
        .map(|line| line + "\n")
        .collect();
    let written = std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, lines));
    match written {
        Ok(()) => {
            tracing::error!(events = events.len(), path = %path.display(), "database unreachable at shutdown; usage events spilled to a file, loaded at next start")
        }
        Err(error) => {
            tracing::error!(events = events.len(), %error, "database unreachable at shutdown and spill file not written: usage events lost")
        }
    }
}

/// Writes back events spilled by an earlier shutdown and removes their files.
/// Idempotent: events already stored are skipped by request id.
pub async fn load_spilled(
    store: &dyn Store,
    dir: &Path,
) -> Result<usize, crate::store::StoreError> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(0);
    };
    let mut loaded = 0;
    for entry in entries.flatten() {
        let path = entry.path();
        let is_spill = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("usage-spill-") && n.ends_with(".jsonl"));
        if !is_spill {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(&path) else {
            continue;
        };
        let events: Vec<UsageEvent> = text
            .lines()
            .filter_map(|line| serde_json::from_str::<UsageEvent>(line).ok())
            .collect();
        for chunk in events.chunks(500) {
            store.insert_usage(chunk).await?;
        }
        loaded += events.len();
        if let Err(error) = std::fs::remove_file(&path) {
            tracing::warn!(%error, path = %path.display(), "spill file loaded but not removed");
        }
    }
    Ok(loaded)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{ApiKeyRecord, KeyId, Tier};

    fn event(key: &KeyId, n: u32) -> UsageEvent {
        UsageEvent {
            request_id: format!("modr_{n}"),
            key_id: key.clone(),
            at: chrono::Utc::now(),
            status: 200,
            text_items: n,
            text_chars: 10,
            image_items: 0,
            image_bytes: 0,
            deep_analyses: 0,
            flagged: false,
            rate_limited: false,
            billable: true,
            latency_ms: 3,
        }
    }

    #[tokio::test]
    async fn spilled_events_are_stored_at_the_next_start_and_their_file_removed() {
        let dir = tempfile::tempdir().unwrap();
        let url = format!("sqlite://{}", dir.path().join("db.sqlite").display());
        let store = crate::store::connect(&url).await.unwrap();
        let key = KeyId::parse("00112233445566ff").unwrap();
        store
            .insert_key(&ApiKeyRecord {
                id: key.clone(),
                name: "k".into(),
                tier: Tier::Free,
                custom_rpm: None,
                secret_hash: vec![0; 32],
                created_at: chrono::Utc::now(),
                revoked_at: None,
            })
            .await
            .unwrap();
        let events: Vec<UsageEvent> = (1..=3).map(|n| event(&key, n)).collect();
        spill(dir.path(), &events);
        assert_eq!(load_spilled(store.as_ref(), dir.path()).await.unwrap(), 3);
        let stored = store.usage_events(Some(&key)).await.unwrap();
        assert_eq!(
            stored.iter().map(|e| e.text_items).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert_eq!(
            load_spilled(store.as_ref(), dir.path()).await.unwrap(),
            0,
            "the file is gone"
        );
    }
}
