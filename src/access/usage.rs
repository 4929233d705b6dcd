//! Usage metering: every authenticated request becomes one `UsageEvent`,
//! made durable in a local journal before its response is sent, then
//! written to the database in batches by one task.
//!
//! A request reserves its place in the queue before it is handled, so every
//! response the service sends has its event journaled and queued: when the
//! queue is full (the database has been away for long), new requests get 503
//! instead of going unrecorded. The journal (`journal.rs`) is fsync'd with
//! group commit before a response leaves, trimmed once its events are
//! stored, and whatever it still holds at the next start (a crash, or the
//! database away at shutdown) is stored then. Batches that cannot be written
//! are retried with back-off; events the database refuses for good go to
//! the journal's `quarantine/` folder, never nowhere.

pub mod journal;
pub mod upkeep;

use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::keys::KeyId;
use super::policy::PolicyId;
use crate::metrics::names;
use crate::store::{Store, StoreError};
use journal::{Journal, JournalError, SegmentId};

/// One metered request, authenticated. Written in batches; `request_id` is
/// unique so that a retried batch never counts a request twice. Serialisable
/// for the spill file written when the database is away at shutdown.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UsageEvent {
    pub request_id: String,
    pub key_id: KeyId,
    pub at: DateTime<Utc>,
    pub status: u16,
    pub text_items: u32,
    pub text_chars: u64,
    pub image_items: u32,
    pub image_bytes: u64,
    pub deep_analyses: u32,
    pub flagged: bool,
    /// Refused by the rate limiter (429).
    pub rate_limited: bool,
    /// Counts for billing: a successful (200) moderation.
    pub billable: bool,
    pub latency_ms: u32,
    /// The route that served it. Journal lines written before the column
    /// existed have none: they all came from `/v1/moderate`.
    #[serde(default)]
    pub endpoint: Endpoint,
    /// The policy the request was judged under (none: the shipped
    /// thresholds). Journal lines written before policies have none.
    #[serde(default)]
    pub policy_id: Option<PolicyId>,
}

/// The metered route a usage event came from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Endpoint {
    /// `POST /v1/moderate`, Moderato's own API.
    #[default]
    Moderate,
    /// `POST /v1/moderations`, the OpenAI-compatible one.
    Moderations,
}

impl Endpoint {
    pub const ALL: [Endpoint; 2] = [Endpoint::Moderate, Endpoint::Moderations];

    /// The value stored in `usage_events.endpoint`.
    pub const fn as_str(self) -> &'static str {
        match self {
            Endpoint::Moderate => "moderate",
            Endpoint::Moderations => "moderations",
        }
    }
}

impl FromStr for Endpoint {
    type Err = String;
    fn from_str(s: &str) -> Result<Endpoint, String> {
        Endpoint::ALL
            .into_iter()
            .find(|e| e.as_str() == s)
            .ok_or_else(|| format!("unknown endpoint {s:?}: expected moderate or moderations"))
    }
}

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
    /// Refused by a limit the handler applies (characters per minute).
    pub rate_limited: bool,
}

/// The queue is full (or its writer has stopped): the request must be
/// refused, not served unmetered.
#[derive(Debug)]
pub struct QueueFull;

/// An event on its way to the database, with the journal segment it is in.
struct Journaled {
    event: UsageEvent,
    segment: Option<SegmentId>,
}

/// A reserved place in the queue for one event.
pub struct UsagePermit {
    permit: mpsc::OwnedPermit<Journaled>,
    journal: Arc<Journal>,
}

impl UsagePermit {
    /// Journals the event (on disk, fsync'd) and queues it for the
    /// database; returns once it is durable. `Err` when the journal could
    /// not take it: the response must not be sent, and the event is queued
    /// as a 503 instead. Runs to the end even if the caller is dropped (a
    /// client gone mid-request), so no event is left half-recorded.
    pub async fn record(self, event: UsageEvent) -> Result<(), JournalError> {
        let UsagePermit { permit, journal } = self;
        let recording = tokio::spawn(async move {
            match journal.append(&event).await {
                Ok(segment) => {
                    metrics::counter!(names::USAGE_JOURNALED).increment(1);
                    permit.send(Journaled {
                        event,
                        segment: Some(segment),
                    });
                    Ok(())
                }
                Err(error) => {
                    let event = UsageEvent {
                        status: 503,
                        billable: false,
                        ..event
                    };
                    permit.send(Journaled {
                        event,
                        segment: None,
                    });
                    Err(error)
                }
            }
        });
        recording.await.unwrap_or(Err(JournalError::Closed))
    }
}

/// The sending side, shared by all requests.
#[derive(Clone)]
pub struct UsageRecorder {
    sender: mpsc::Sender<Journaled>,
    journal: Arc<Journal>,
}

/// The writer tasks; `finish` drains them.
pub struct UsageWriter {
    handle: JoinHandle<()>,
    replay: JoinHandle<()>,
    give_up: CancellationToken,
    journal: Arc<Journal>,
}

#[derive(Clone, Debug)]
pub struct UsageSettings {
    pub capacity: usize,
    pub batch_size: usize,
    /// How long a batch gathers events after its first before it is
    /// written, unless it is full first.
    pub flush_interval: Duration,
    /// The journal's folder.
    pub journal_dir: PathBuf,
    /// Where an older version spilled events at shutdown (`usage-spill-*`):
    /// stored at start like journal leftovers.
    pub legacy_spill_dir: Option<PathBuf>,
}

impl UsageRecorder {
    /// Opens the journal, starts storing what earlier runs left in it, and
    /// starts the writer.
    pub fn start(
        store: Arc<dyn Store>,
        settings: UsageSettings,
    ) -> std::io::Result<(UsageRecorder, UsageWriter)> {
        let (journal, mut leftovers) = Journal::open(&settings.journal_dir)?;
        if let Some(legacy) = &settings.legacy_spill_dir {
            leftovers.extend(legacy_spill_files(legacy));
        }
        let (sender, receiver) = mpsc::channel(settings.capacity);
        let give_up = CancellationToken::new();
        let replay = tokio::spawn(store_leftovers(
            store.clone(),
            leftovers,
            settings.batch_size,
            journal.clone(),
            give_up.clone(),
        ));
        let handle = tokio::spawn(write_loop(
            store,
            receiver,
            settings.batch_size,
            settings.flush_interval,
            journal.clone(),
            give_up.clone(),
        ));
        Ok((
            UsageRecorder {
                sender,
                journal: journal.clone(),
            },
            UsageWriter {
                handle,
                replay,
                give_up,
                journal,
            },
        ))
    }

    pub fn reserve(&self) -> Result<UsagePermit, QueueFull> {
        let waiting = self.sender.max_capacity() - self.sender.capacity();
        metrics::gauge!(names::USAGE_QUEUE_DEPTH).set(waiting as f64);
        match self.sender.clone().try_reserve_owned() {
            Ok(permit) => Ok(UsagePermit {
                permit,
                journal: self.journal.clone(),
            }),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                tracing::error!("the usage writer has stopped: requests are refused; journaled events are stored at the next start");
                Err(QueueFull)
            }
            Err(mpsc::error::TrySendError::Full(_)) => Err(QueueFull),
        }
    }
}

impl UsageWriter {
    /// Waits until every queued event is written (all recorders must be
    /// dropped first), at most `grace`; what is still not stored then stays
    /// in the journal for the next start.
    pub async fn finish(self, grace: Duration) {
        let UsageWriter {
            mut handle,
            mut replay,
            give_up,
            journal,
        } = self;
        let both = async {
            let written = (&mut handle).await;
            let replayed = (&mut replay).await;
            (written, replayed)
        };
        let in_time = tokio::time::timeout(grace, both).await;
        let (written, replayed) = match in_time {
            Ok(results) => results,
            Err(_) => {
                give_up.cancel();
                (handle.await, replay.await)
            }
        };
        for (task, result) in [("writer", written), ("start-up loader", replayed)] {
            if let Err(error) = result {
                tracing::error!(%error, task, "a usage task failed; its events stay in the journal and are stored at the next start");
            }
        }
        journal.close();
    }
}

async fn write_loop(
    store: Arc<dyn Store>,
    mut receiver: mpsc::Receiver<Journaled>,
    batch_size: usize,
    flush_interval: Duration,
    journal: Arc<Journal>,
    give_up: CancellationToken,
) {
    let mut batch = Vec::with_capacity(batch_size);
    // Events arriving while a batch is written wait in the queue and form the
    // next batch: under load, batches grow by themselves. Under light load a
    // batch gathers for `flush_interval`, so that one request does not cost
    // one transaction (on SQLite, a third of the CPU of a request without a
    // model went to it).
    while receiver.recv_many(&mut batch, batch_size).await > 0 {
        gather(&mut receiver, &mut batch, batch_size, flush_interval).await;
        metrics::gauge!(names::USAGE_QUEUE_DEPTH).set((batch.len() + receiver.len()) as f64);
        let events: Vec<UsageEvent> = batch.iter().map(|j| j.event.clone()).collect();
        if !write_with_retry(store.as_ref(), &events, &journal, &give_up).await {
            receiver.close();
            let left = batch.len() + receiver.len();
            tracing::error!(
                events = left,
                "database unreachable at shutdown; these usage events stay in the journal and are stored at the next start"
            );
            return;
        }
        journal.mark_stored(batch.drain(..).filter_map(|j| j.segment));
    }
}

/// Adds to `batch` what arrives within `flush_interval`, until it holds
/// `batch_size` events or every sender is gone.
async fn gather(
    receiver: &mut mpsc::Receiver<Journaled>,
    batch: &mut Vec<Journaled>,
    batch_size: usize,
    flush_interval: Duration,
) {
    let until = tokio::time::Instant::now() + flush_interval;
    while batch.len() < batch_size {
        let room = batch_size - batch.len();
        match tokio::time::timeout_at(until, receiver.recv_many(batch, room)).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

/// `false` when told to give up before the batch could be written.
async fn write_with_retry(
    store: &dyn Store,
    batch: &[UsageEvent],
    journal: &Journal,
    give_up: &CancellationToken,
) -> bool {
    let mut backoff = Duration::from_millis(50);
    loop {
        match store.insert_usage(batch).await {
            Ok(()) => {
                metrics::counter!(names::USAGE_BATCHES).increment(1);
                return true;
            }
            // A constraint refuses some event (it names a key that is not
            // there): retrying the batch would never succeed, so write the
            // events one by one and quarantine the refused ones.
            Err(StoreError::Conflict(reason)) => {
                tracing::error!(%reason, events = batch.len(), "usage batch refused by a constraint; writing its events one by one");
                let mut refused = Vec::new();
                for event in batch {
                    if let Err(error) = store.insert_usage(std::slice::from_ref(event)).await {
                        tracing::error!(%error, request_id = %event.request_id, "usage event refused");
                        refused.push(event.clone());
                    }
                }
                return quarantine_refused(journal, &refused);
            }
            Err(error) => {
                tracing::warn!(%error, events = batch.len(), "usage batch not written; retrying");
                metrics::counter!(names::USAGE_RETRIES).increment(1);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = give_up.cancelled() => return false,
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// `true` once refused events are safe in quarantine (so their journal
/// segment may go); `false` keeps them in the journal.
fn quarantine_refused(journal: &Journal, refused: &[UsageEvent]) -> bool {
    if refused.is_empty() {
        return true;
    }
    match journal.quarantine_events(refused) {
        Ok(path) => {
            metrics::counter!(names::USAGE_QUARANTINED).increment(refused.len() as u64);
            tracing::error!(events = refused.len(), path = %path.display(), "usage events refused by the database kept in quarantine");
            true
        }
        Err(error) => {
            tracing::error!(%error, events = refused.len(), "refused usage events not quarantined; they stay in the journal");
            false
        }
    }
}

fn legacy_spill_files(dir: &std::path::Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("usage-spill-") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    files
}

/// What the start-up loader did, for its log line and tests.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LeftoverReport {
    pub files: usize,
    pub events: usize,
    pub bad_lines: usize,
    pub torn_tails: usize,
    pub quarantined: usize,
    pub kept: usize,
}

/// Stores the events of files left by earlier runs, file by file: a stored
/// file is removed, one with unreadable lines is quarantined once its good
/// lines are stored, and a failure with one file does not stop the others.
pub async fn load_leftovers(
    store: &dyn Store,
    files: &[PathBuf],
    batch_size: usize,
    journal: &Journal,
    give_up: &CancellationToken,
) -> LeftoverReport {
    let mut report = LeftoverReport::default();
    for path in files {
        report.files += 1;
        let leftover = match journal::read_leftover(path) {
            Ok(leftover) => leftover,
            Err(error) => {
                tracing::error!(%error, path = %path.display(), "usage journal file unreadable; moving it to quarantine");
                quarantine_logged(path, &mut report);
                continue;
            }
        };
        let mut stored = true;
        for chunk in leftover.events.chunks(batch_size.max(1)) {
            if !write_with_retry(store, chunk, journal, give_up).await {
                stored = false;
                break;
            }
        }
        if !stored {
            report.kept += 1;
            continue;
        }
        report.events += leftover.events.len();
        report.bad_lines += leftover.bad_lines;
        report.torn_tails += usize::from(leftover.torn_tail);
        if leftover.bad_lines > 0 {
            tracing::error!(bad_lines = leftover.bad_lines, stored = leftover.events.len(), path = %path.display(), "usage journal file has unreadable lines; its good events are stored and the file quarantined");
            quarantine_logged(path, &mut report);
        } else if let Err(error) = std::fs::remove_file(path) {
            tracing::warn!(%error, path = %path.display(), "stored usage journal file not removed; its events are skipped as duplicates next time");
        }
    }
    report
}

fn quarantine_logged(path: &std::path::Path, report: &mut LeftoverReport) {
    match journal::quarantine_file(path) {
        Ok(_) => report.quarantined += 1,
        Err(error) => {
            report.kept += 1;
            tracing::error!(%error, path = %path.display(), "usage journal file could not be quarantined; left in place");
        }
    }
}

async fn store_leftovers(
    store: Arc<dyn Store>,
    files: Vec<PathBuf>,
    batch_size: usize,
    journal: Arc<Journal>,
    give_up: CancellationToken,
) {
    if files.is_empty() {
        return;
    }
    let report = load_leftovers(store.as_ref(), &files, batch_size, &journal, &give_up).await;
    tracing::info!(
        files = report.files,
        events = report.events,
        bad_lines = report.bad_lines,
        torn_tails = report.torn_tails,
        quarantined = report.quarantined,
        kept_for_next_start = report.kept,
        "usage events left by an earlier run are stored"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::{ApiKeyRecord, KeyId, Tier};

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
            endpoint: crate::access::Endpoint::Moderate,
            policy_id: None,
        }
    }

    async fn store_with_key(dir: &std::path::Path) -> (Arc<dyn Store>, KeyId) {
        let url = format!("sqlite://{}", dir.join("db.sqlite").display());
        let store = crate::store::connect(&url).await.unwrap();
        let key = KeyId::parse("00112233445566ff").unwrap();
        store
            .insert_key(&ApiKeyRecord {
                id: key.clone(),
                name: "k".into(),
                tier: Tier::Free,
                custom_rpm: None,
                owner: crate::access::KeyOwner::Operator,
                secret_hash: vec![0; 32],
                created_at: chrono::Utc::now(),
                revoked_at: None,
                policy_id: None,
                policy: None,
            })
            .await
            .unwrap();
        (store, key)
    }

    fn lines(events: &[UsageEvent]) -> String {
        events
            .iter()
            .map(|e| serde_json::to_string(e).unwrap() + "\n")
            .collect()
    }

    /// Item 10: a bad line quarantines its file (good lines stored), and an
    /// unreadable file does not stop the loading of the others.
    #[tokio::test]
    async fn leftovers_are_stored_file_by_file_and_bad_files_quarantined() {
        let dir = tempfile::tempdir().unwrap();
        let (store, key) = store_with_key(dir.path()).await;
        let journal_dir = dir.path().join("journal");
        std::fs::create_dir_all(&journal_dir).unwrap();
        let with_bad_line = journal_dir.join("journal-1.jsonl");
        std::fs::write(
            &with_bad_line,
            lines(&[event(&key, 1)]) + "garbage\n" + &lines(&[event(&key, 2)]),
        )
        .unwrap();
        let unreadable = journal_dir.join("journal-2.jsonl");
        std::fs::create_dir_all(&unreadable).unwrap(); // a folder: reading it fails
        let good = journal_dir.join("journal-3.jsonl");
        std::fs::write(&good, lines(&[event(&key, 3)])).unwrap();

        let (journal, leftovers) = Journal::open(&journal_dir).unwrap();
        assert_eq!(leftovers.len(), 3);
        let report = load_leftovers(
            store.as_ref(),
            &leftovers,
            500,
            &journal,
            &CancellationToken::new(),
        )
        .await;
        assert_eq!(report.events, 3);
        assert_eq!(report.bad_lines, 1);
        assert_eq!(report.quarantined, 2);
        let stored = store.usage_events(Some(&key)).await.unwrap();
        assert_eq!(
            stored.iter().map(|e| e.text_items).collect::<Vec<_>>(),
            vec![1, 2, 3]
        );
        assert!(!with_bad_line.exists() && !good.exists());
        let quarantine = journal_dir.join("quarantine");
        assert!(
            quarantine.join("journal-1.jsonl").exists(),
            "kept, not deleted"
        );
        assert!(quarantine.join("journal-2.jsonl").exists());
    }

    /// Light traffic goes to the database in one batch per flush interval,
    /// not one transaction per request; a full batch and the last sender
    /// leaving do not wait.
    #[tokio::test(start_paused = true)]
    async fn a_batch_gathers_for_the_flush_interval() {
        fn journaled(n: u32) -> Journaled {
            let key = KeyId::parse("0123456789abcdef").unwrap();
            Journaled {
                event: event(&key, n),
                segment: None,
            }
        }
        let interval = Duration::from_millis(100);
        let (sender, mut receiver) = mpsc::channel(10);
        let late = sender.clone();
        tokio::spawn(async move {
            for n in 0..3 {
                tokio::time::sleep(Duration::from_millis(30)).await;
                late.send(journaled(n)).await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            late.send(journaled(9)).await.unwrap();
        });
        let started = tokio::time::Instant::now();
        let mut batch = Vec::new();
        receiver.recv_many(&mut batch, 10).await;
        gather(&mut receiver, &mut batch, 10, interval).await;
        assert_eq!(batch.len(), 3, "the three events within the interval");
        assert_eq!(started.elapsed(), Duration::from_millis(130));

        for n in 10..15 {
            sender.send(journaled(n)).await.unwrap();
        }
        let (mut full, started) = (Vec::new(), tokio::time::Instant::now());
        receiver.recv_many(&mut full, 2).await;
        gather(&mut receiver, &mut full, 5, interval).await;
        assert_eq!((full.len(), started.elapsed()), (5, Duration::ZERO));

        drop(sender);
        let mut last = Vec::new();
        receiver.recv_many(&mut last, 10).await;
        let started = tokio::time::Instant::now();
        gather(&mut receiver, &mut last, 10, interval).await;
        assert_eq!(last.len(), 1, "the late event");
        assert!(
            started.elapsed() < interval,
            "no wait once every sender is gone"
        );
    }

    /// Events recorded while the database cannot take them stay in the
    /// journal and are stored at the next start.
    #[tokio::test]
    async fn recorded_events_reach_the_database_or_stay_in_the_journal() {
        let dir = tempfile::tempdir().unwrap();
        let (store, key) = store_with_key(dir.path()).await;
        let settings = UsageSettings {
            capacity: 10,
            batch_size: 10,
            flush_interval: Duration::from_millis(20),
            journal_dir: dir.path().join("journal"),
            legacy_spill_dir: None,
        };
        let (recorder, writer) = UsageRecorder::start(store.clone(), settings.clone()).unwrap();
        for n in 1..=3 {
            recorder
                .reserve()
                .unwrap()
                .record(event(&key, n))
                .await
                .unwrap();
        }
        drop(recorder);
        writer.finish(Duration::from_secs(10)).await;
        assert_eq!(store.usage_events(Some(&key)).await.unwrap().len(), 3);
        assert!(
            journal::leftover_files(&settings.journal_dir)
                .unwrap_or_default()
                .is_empty(),
            "a stored journal is trimmed"
        );
    }
}
