//! The usage journal: every usage event is appended to a local file and
//! fsync'd before its response is sent, so a hard crash (SIGKILL, power
//! loss) cannot lose an answered request from billing.
//!
//! One thread writes: it takes every event that arrived while the previous
//! fsync ran and writes them with one `write` and one `fdatasync` (group
//! commit), so under load one fsync covers many requests. The file is cut
//! into segments; a segment is deleted once every event in it is stored in
//! the database. Segments left over by a crash are stored at the next start
//! ([`read_leftover`]); a file with lines that cannot be read is moved to
//! `quarantine/`, never deleted.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use super::UsageEvent;

/// A segment is closed after this many bytes.
const MAX_SEGMENT_BYTES: u64 = 8 << 20;
/// A fully stored segment is replaced by a new one once it is this old, so
/// that the journal stays trimmed without a file per batch.
const MIN_SEGMENT_AGE: Duration = Duration::from_secs(1);
const QUARANTINE: &str = "quarantine";

/// Identifies the segment an event was written to.
pub type SegmentId = u64;

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("usage event not serialisable: {0}")]
    Serialise(#[from] serde_json::Error),
    #[error("usage journal write failed: {0}")]
    Io(String),
    #[error("the usage journal is closed")]
    Closed,
}

struct Append {
    line: Vec<u8>,
    done: oneshot::Sender<Result<SegmentId, String>>,
}

struct Segment {
    path: PathBuf,
    written: u64,
    stored: u64,
    open: bool,
    opened: Instant,
    bytes: u64,
}

impl Segment {
    fn fully_stored(&self) -> bool {
        self.stored >= self.written
    }
}

#[derive(Default)]
struct Segments {
    next_id: SegmentId,
    by_id: HashMap<SegmentId, Segment>,
}

impl Segments {
    /// Deletes the segment's file once it is closed and fully stored.
    fn trim(&mut self, id: SegmentId) {
        let done = self
            .by_id
            .get(&id)
            .is_some_and(|s| !s.open && s.fully_stored());
        if done {
            if let Some(segment) = self.by_id.remove(&id) {
                remove_logged(&segment.path);
            }
        }
    }
}

pub struct Journal {
    dir: PathBuf,
    /// Held for the journal's life: two processes must never share a
    /// journal, or one would store and delete the other's live segments.
    _lock: File,
    appends: Mutex<Option<mpsc::Sender<Append>>>,
    segments: Arc<Mutex<Segments>>,
    writer: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Journal {
    /// Opens the journal in `dir` (created if missing). Returns it with the
    /// files a previous run left there, to be stored and then removed.
    pub fn open(dir: &Path) -> io::Result<(Arc<Journal>, Vec<PathBuf>)> {
        std::fs::create_dir_all(dir)?;
        let lock = File::create(dir.join(".lock"))?;
        lock.try_lock().map_err(|_| {
            io::Error::other(format!(
                "the usage journal {} is in use by another process; give every replica its own usage.journal_dir",
                dir.display()
            ))
        })?;
        let leftovers = leftover_files(dir)?;
        let (sender, receiver) = mpsc::channel();
        let segments = Arc::new(Mutex::new(Segments::default()));
        let thread_segments = segments.clone();
        let thread_dir = dir.to_path_buf();
        let writer = std::thread::Builder::new()
            .name("usage-journal".into())
            .spawn(move || write_loop(&thread_dir, &receiver, &thread_segments))?;
        let journal = Journal {
            dir: dir.to_path_buf(),
            _lock: lock,
            appends: Mutex::new(Some(sender)),
            segments,
            writer: Mutex::new(Some(writer)),
        };
        Ok((Arc::new(journal), leftovers))
    }

    /// Appends the event and returns once it is on disk (fsync'd).
    pub async fn append(&self, event: &UsageEvent) -> Result<SegmentId, JournalError> {
        let mut line = serde_json::to_vec(event)?;
        line.push(b'\n');
        let (done, written) = oneshot::channel();
        {
            let appends = self.appends.lock().unwrap_or_else(|e| e.into_inner());
            let sender = appends.as_ref().ok_or(JournalError::Closed)?;
            sender
                .send(Append { line, done })
                .map_err(|_| JournalError::Closed)?;
        }
        written
            .await
            .map_err(|_| JournalError::Closed)?
            .map_err(JournalError::Io)
    }

    /// Events of these segments are now stored in the database.
    pub fn mark_stored(&self, segments: impl IntoIterator<Item = SegmentId>) {
        let mut state = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        for id in segments {
            if let Some(segment) = state.by_id.get_mut(&id) {
                segment.stored += 1;
            }
            state.trim(id);
        }
    }

    /// Stops the writer thread and removes every fully stored segment; the
    /// others stay for the next start.
    pub fn close(&self) {
        self.appends
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(writer) = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take() {
            if writer.join().is_err() {
                tracing::error!("the usage journal writer panicked; unstored events stay in the journal for the next start");
            }
        }
        let mut state = self.segments.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<SegmentId> = state.by_id.keys().copied().collect();
        for id in ids {
            if let Some(segment) = state.by_id.get_mut(&id) {
                segment.open = false;
            }
            state.trim(id);
        }
    }

    /// Writes events the database refused for good to `quarantine/` (fsync'd).
    pub fn quarantine_events(&self, events: &[UsageEvent]) -> io::Result<PathBuf> {
        let dir = self.dir.join(QUARANTINE);
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("refused-{}.jsonl", uuid::Uuid::now_v7().simple()));
        let mut text = Vec::new();
        for event in events {
            serde_json::to_writer(&mut text, event).map_err(io::Error::other)?;
            text.push(b'\n');
        }
        let mut file = File::create(&path)?;
        file.write_all(&text)?;
        file.sync_all()?;
        Ok(path)
    }
}

impl Drop for Journal {
    fn drop(&mut self) {
        self.close();
    }
}

/// Journal segments and old spill files in `dir`, oldest first.
pub(super) fn leftover_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| is_leftover(path))
        .collect();
    files.sort();
    Ok(files)
}

/// Files whose events still have to reach the database.
pub fn is_leftover(path: &Path) -> bool {
    path.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
        (n.starts_with("journal-") || n.starts_with("usage-spill-")) && n.ends_with(".jsonl")
    })
}

fn write_loop(dir: &Path, receiver: &mpsc::Receiver<Append>, segments: &Mutex<Segments>) {
    let mut current: Option<(SegmentId, File)> = None;
    while let Ok(first) = receiver.recv() {
        // Group commit: whatever arrived during the last fsync goes together.
        let mut batch = vec![first];
        batch.extend(receiver.try_iter());
        let result = append_batch(dir, segments, &mut current, &batch);
        if let Err(error) = &result {
            tracing::error!(%error, events = batch.len(), "usage journal write failed");
            // A failed write may leave half a line: start a fresh segment.
            close_current(segments, &mut current);
        }
        for append in batch {
            let _ = append
                .done
                .send(result.as_ref().map(|id| *id).map_err(|e| e.to_string()));
        }
    }
    close_current(segments, &mut current);
}

fn append_batch(
    dir: &Path,
    segments: &Mutex<Segments>,
    current: &mut Option<(SegmentId, File)>,
    batch: &[Append],
) -> io::Result<SegmentId> {
    rotate_if_due(dir, segments, current)?;
    let Some((id, file)) = current.as_mut() else {
        return Err(io::Error::other("no journal segment open"));
    };
    let id = *id;
    let bytes: Vec<u8> = batch.iter().flat_map(|a| a.line.iter().copied()).collect();
    file.write_all(&bytes)?;
    file.sync_data()?;
    let mut state = segments.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(segment) = state.by_id.get_mut(&id) {
        segment.written += batch.len() as u64;
        segment.bytes += bytes.len() as u64;
    }
    Ok(id)
}

/// Opens a segment when none is, and replaces one that is full, or fully
/// stored and old enough to be deleted.
fn rotate_if_due(
    dir: &Path,
    segments: &Mutex<Segments>,
    current: &mut Option<(SegmentId, File)>,
) -> io::Result<()> {
    if let Some((id, _)) = current {
        let due = {
            let state = segments.lock().unwrap_or_else(|e| e.into_inner());
            state.by_id.get(id).is_none_or(|s| {
                s.bytes >= MAX_SEGMENT_BYTES
                    || (s.written > 0 && s.fully_stored() && s.opened.elapsed() >= MIN_SEGMENT_AGE)
            })
        };
        if !due {
            return Ok(());
        }
        close_current(segments, current);
    }
    let path = dir.join(format!("journal-{}.jsonl", uuid::Uuid::now_v7().simple()));
    let file = OpenOptions::new()
        .create_new(true)
        .append(true)
        .open(&path)?;
    // The new file's name must be durable too, not only its contents.
    File::open(dir)?.sync_all()?;
    let mut state = segments.lock().unwrap_or_else(|e| e.into_inner());
    let id = state.next_id;
    state.next_id += 1;
    state.by_id.insert(
        id,
        Segment {
            path,
            written: 0,
            stored: 0,
            open: true,
            opened: Instant::now(),
            bytes: 0,
        },
    );
    *current = Some((id, file));
    Ok(())
}

fn close_current(segments: &Mutex<Segments>, current: &mut Option<(SegmentId, File)>) {
    if let Some((id, _file)) = current.take() {
        let mut state = segments.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(segment) = state.by_id.get_mut(&id) {
            segment.open = false;
        }
        state.trim(id);
    }
}

fn remove_logged(path: &Path) {
    if let Err(error) = std::fs::remove_file(path) {
        tracing::warn!(%error, path = %path.display(), "stored usage journal segment not removed; its events are skipped as duplicates at the next start");
    }
}

/// What a left-over file holds.
#[derive(Debug, Default)]
pub struct Leftover {
    pub events: Vec<UsageEvent>,
    /// Lines that are not events (quarantine the file once the good ones are stored).
    pub bad_lines: usize,
    /// A last line cut short by a crash: written but never fsync'd and
    /// acknowledged, so no response was sent for it.
    pub torn_tail: bool,
}

pub fn read_leftover(path: &Path) -> io::Result<Leftover> {
    let text = std::fs::read(path)?;
    let mut leftover = Leftover::default();
    let complete = text.last().is_none_or(|b| *b == b'\n');
    let mut lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
    // `split` yields an empty piece after a final newline, or the torn tail.
    let last = lines.pop().unwrap_or_default();
    if !complete && !last.is_empty() {
        leftover.torn_tail = serde_json::from_slice::<UsageEvent>(last).is_err();
        if !leftover.torn_tail {
            lines.push(last);
        }
    }
    for line in lines {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<UsageEvent>(line) {
            Ok(event) => leftover.events.push(event),
            Err(_) => leftover.bad_lines += 1,
        }
    }
    Ok(leftover)
}

/// Moves a file whose lines could not all be read to `quarantine/` beside
/// it, for a person to look at.
pub fn quarantine_file(path: &Path) -> io::Result<PathBuf> {
    let dir = path
        .parent()
        .map(|p| p.join(QUARANTINE))
        .unwrap_or_else(|| PathBuf::from(QUARANTINE));
    std::fs::create_dir_all(&dir)?;
    let name = path
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_else(|| "unnamed".into());
    let target = dir.join(name);
    std::fs::rename(path, &target)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::access::KeyId;

    pub(crate) fn event(n: u32) -> UsageEvent {
        UsageEvent {
            request_id: format!("modr_{n}"),
            key_id: KeyId::parse("00112233445566ff").unwrap(),
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

    #[tokio::test]
    async fn appended_events_are_on_disk_and_trimmed_once_stored() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, leftovers) = Journal::open(dir.path()).unwrap();
        assert!(leftovers.is_empty());
        let a = journal.append(&event(1)).await.unwrap();
        let b = journal.append(&event(2)).await.unwrap();
        let files = leftover_files(dir.path()).unwrap();
        assert_eq!(files.len(), 1);
        let on_disk = read_leftover(&files[0]).unwrap();
        assert_eq!(
            on_disk.events,
            vec![
                event_like(&on_disk.events[0], 1),
                event_like(&on_disk.events[1], 2)
            ]
        );
        journal.mark_stored([a, b]);
        journal.close();
        assert!(
            leftover_files(dir.path()).unwrap().is_empty(),
            "stored segments are removed"
        );
    }

    fn event_like(found: &UsageEvent, n: u32) -> UsageEvent {
        UsageEvent {
            at: found.at,
            ..event(n)
        }
    }

    #[tokio::test]
    async fn unstored_events_stay_for_the_next_start() {
        let dir = tempfile::tempdir().unwrap();
        let (journal, _) = Journal::open(dir.path()).unwrap();
        journal.append(&event(1)).await.unwrap();
        assert!(
            Journal::open(dir.path()).is_err(),
            "a second process may not share the journal"
        );
        journal.close();
        drop(journal);
        let (_again, leftovers) = Journal::open(dir.path()).unwrap();
        assert_eq!(leftovers.len(), 1);
        assert_eq!(read_leftover(&leftovers[0]).unwrap().events.len(), 1);
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_a_bad_line_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal-x.jsonl");
        let good = serde_json::to_string(&event(1)).unwrap();
        std::fs::write(&path, format!("{good}\nnot json\n{good}\n{}", &good[..20])).unwrap();
        let leftover = read_leftover(&path).unwrap();
        assert_eq!(leftover.events.len(), 2);
        assert_eq!(leftover.bad_lines, 1);
        assert!(leftover.torn_tail);
        let moved = quarantine_file(&path).unwrap();
        assert!(moved.starts_with(dir.path().join(QUARANTINE)) && moved.exists());
        assert!(!path.exists());
    }
}
