//! Where log lines go: a bounded buffer that a thread of its own writes to stderr in batches, so
//! that a request never waits on a write (a slow disk, a full pipe to a log shipper) and many
//! lines cost one `write` between them. When the buffer is full a line is dropped, not waited
//! for, and counted (`envlens_log_lines_dropped_total`).

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

/// Lines waiting to be written, at most: some seconds of a busy server's requests.
const CAPACITY: usize = 8 << 20;
/// How long the writer lets lines gather after the first one of a batch arrives: a line is on
/// stderr within this (plus the write), and at most 1/this writes happen a second.
const GATHER: Duration = Duration::from_millis(5);

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Lines dropped because the buffer was full, since the process started.
pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

#[derive(Default)]
struct State {
    pending: Vec<u8>,
    closed: bool,
}

#[derive(Default)]
struct Shared {
    state: Mutex<State>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A handle to the buffer; cheap to clone. Lines pushed after [`LogWriter::close`] go straight
/// to stderr.
#[derive(Clone)]
pub struct LogWriter {
    shared: Arc<Shared>,
}

impl LogWriter {
    /// Starts the thread that writes to stderr; [`Flusher::close`] (or dropping the flusher)
    /// stops it once it has written what is left.
    pub fn start() -> (LogWriter, Flusher) {
        Self::start_with(std::io::stderr())
    }

    /// As [`LogWriter::start`], to `out`.
    pub fn start_with(mut out: impl Write + Send + 'static) -> (LogWriter, Flusher) {
        let writer = LogWriter {
            shared: Arc::default(),
        };
        let shared = writer.shared.clone();
        let thread = std::thread::Builder::new()
            .name("log-writer".into())
            .spawn(move || write_batches(&shared, &mut out))
            .ok();
        let flusher = Flusher {
            writer: writer.clone(),
            thread,
        };
        (writer, flusher)
    }

    /// Queues one whole line (or several); never blocks on I/O.
    pub fn push(&self, line: &[u8]) {
        let mut state = self.shared.lock();
        if state.closed {
            drop(state);
            let _ = std::io::stderr().write_all(line);
            return;
        }
        if state.pending.len() + line.len() > CAPACITY {
            DROPPED.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let first = state.pending.is_empty();
        state.pending.extend_from_slice(line);
        drop(state);
        // Only the first line of a batch wakes the writer; the others find it gathering.
        if first {
            self.shared.wake.notify_one();
        }
    }
}

/// Writes batches until closed, then what is left.
fn write_batches(shared: &Shared, out: &mut impl Write) {
    let mut batch = Vec::new();
    loop {
        let mut state = shared.lock();
        while state.pending.is_empty() && !state.closed {
            state = shared.wake.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if !state.closed {
            drop(state);
            std::thread::sleep(GATHER);
            state = shared.lock();
        }
        std::mem::swap(&mut state.pending, &mut batch);
        let closed = state.closed;
        drop(state);
        let _ = out.write_all(&batch);
        batch.clear();
        // A burst's buffer is not kept for ever.
        if batch.capacity() > CAPACITY / 8 {
            batch = Vec::new();
        }
        if closed {
            let _ = out.flush();
            return;
        }
    }
}

/// Stops the writer and waits for it to write what it holds (at exit).
pub struct Flusher {
    writer: LogWriter,
    thread: Option<JoinHandle<()>>,
}

impl Flusher {
    pub fn close(&mut self) {
        self.writer.shared.lock().closed = true;
        self.writer.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for Flusher {
    fn drop(&mut self) {
        self.close();
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogWriter {
    type Writer = LineSink<'a>;

    fn make_writer(&'a self) -> LineSink<'a> {
        LineSink(self)
    }
}

/// What the text formatter writes an event through: it writes each line whole, once.
pub struct LineSink<'a>(&'a LogWriter);

impl Write for LineSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.push(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A `Write` whose bytes a test reads back.
    #[derive(Clone, Default)]
    pub(in crate::telemetry) struct Captured(pub Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_are_written_in_order_and_what_is_left_at_close() {
        let out = Captured::default();
        let (writer, mut flusher) = LogWriter::start_with(out.clone());
        for i in 0..1000 {
            writer.push(format!("line {i}\n").as_bytes());
        }
        flusher.close();
        // After close, a line goes out at once (to stderr), not into the buffer.
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1000);
        assert!(lines
            .iter()
            .enumerate()
            .all(|(i, l)| *l == format!("line {i}")));
    }

    #[test]
    fn a_full_buffer_drops_and_counts_instead_of_waiting() {
        // No thread writes: the buffer fills.
        let writer = LogWriter {
            shared: Arc::default(),
        };
        let line = vec![b'x'; 1 << 20];
        let before = dropped();
        for _ in 0..(CAPACITY >> 20) + 3 {
            writer.push(&line);
        }
        assert!(dropped() >= before + 3);
        assert!(writer.shared.lock().pending.len() <= CAPACITY);
    }
}
