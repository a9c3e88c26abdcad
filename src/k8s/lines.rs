//! Newline-delimited lines out of a body's frames, as a watch's events come: each byte looked
//! through once for a line's end, however many frames a long line comes in (looking through
//! all of a 16 MiB event again at each of its frames took seconds).

/// The longest line of a cluster's watch kept waiting for its end: one event (etcd keeps
/// objects under 1.5 MiB by default).
pub const MAX_EVENT: usize = 16 << 20;

/// The bytes of the frames pushed, less the lines taken.
#[derive(Default)]
pub struct Lines {
    buffer: Vec<u8>,
    /// Where the next line starts.
    start: usize,
    /// How far `buffer` was looked through for the next line's end.
    scanned: usize,
}

impl Lines {
    /// Adds a frame's bytes after what is there.
    pub fn push(&mut self, data: &[u8]) {
        self.buffer.extend_from_slice(data);
    }

    /// The next whole line, without its end.
    pub fn next_line(&mut self) -> Option<&[u8]> {
        let Some(at) = self.buffer[self.scanned..].iter().position(|b| *b == b'\n') else {
            self.scanned = self.buffer.len();
            return None;
        };
        let end = self.scanned + at;
        let start = std::mem::replace(&mut self.start, end + 1);
        self.scanned = end + 1;
        Some(&self.buffer[start..end])
    }

    /// Drops the lines taken and says how long the line not whole yet is. Once none is left the
    /// buffer is let go, as after nearly every frame: a watch at rest holds no copy of the
    /// largest event it carried.
    pub fn rest(&mut self) -> usize {
        if self.start == self.buffer.len() {
            self.buffer = Vec::new();
        } else {
            self.buffer.drain(..self.start);
        }
        self.scanned -= self.start;
        self.start = 0;
        self.buffer.len()
    }
}

#[cfg(test)]
mod tests {
    use super::Lines;

    fn take(lines: &mut Lines) -> Vec<String> {
        let mut taken = Vec::new();
        while let Some(line) = lines.next_line() {
            taken.push(String::from_utf8(line.to_vec()).unwrap());
        }
        taken
    }

    #[test]
    fn lines_split_across_frames_come_whole_and_in_order() {
        let mut lines = Lines::default();
        lines.push(b"one\ntw");
        assert_eq!(take(&mut lines), ["one"]);
        assert_eq!(lines.rest(), 2);
        lines.push(b"o\n\nthree");
        lines.push(b"\nfour");
        assert_eq!(take(&mut lines), ["two", "", "three"]);
        assert_eq!(lines.rest(), 4);
        lines.push(b"\n");
        assert_eq!(take(&mut lines), ["four"]);
        assert_eq!(lines.rest(), 0);
        assert_eq!(lines.buffer.capacity(), 0, "let go once no line is left");
    }

    #[test]
    fn a_long_line_is_looked_through_once() {
        let mut lines = Lines::default();
        for _ in 0..1000 {
            lines.push(&[b'x'; 100]);
            assert_eq!(lines.next_line(), None);
            assert_eq!(
                lines.scanned,
                lines.buffer.len(),
                "each byte looked at once"
            );
            assert_eq!(lines.rest(), lines.buffer.len());
        }
        lines.push(b"\nnext");
        assert_eq!(lines.next_line().map(<[u8]>::len), Some(100_000));
        assert_eq!(lines.next_line(), None);
        assert_eq!(lines.rest(), 4);
        assert_eq!(lines.scanned, 4);
    }
}
