//! The one bounded line reader of every file the CLI reads (traces, item sets, CSV tables and
//! releases, hierarchies, job files, a token on stdin): [`BoundedLines`] passes bytes through unchanged
//! and fails the read as soon as a line (or, for CSV, a record, whose quoted fields may hold newlines)
//! grows past a limit, so no reader buffers an unbounded line (`--input /dev/zero` ends at once with an
//! error instead of growing without bound).
//!
//! Invariants: the bytes a [`BoundedLines`] returns are exactly the inner reader's; once a line or
//! record is longer than the limit, that read and every later one fail with
//! [`std::io::ErrorKind::InvalidData`] and a [`LineTooLong`] error naming the line number (1-based)
//! and the limit. The caller names the file (every caller wraps I/O errors with the path).
use std::io::Read;

/// Most bytes of one line (or one CSV record) any reader of the CLI accepts: 1 MiB, far above any
/// real trace line, item set, table row or hierarchy row.
pub const MAX_LINE_BYTES: usize = 1 << 20;

/// Whether double quotes group lines into one record (CSV, RFC 4180: a newline inside a quoted field
/// belongs to the record) or lines stand alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Records {
    Lines,
    Csv,
}

/// The error a [`BoundedLines`] read fails with (inside an [`std::io::Error`] of kind `InvalidData`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{what} {line} is longer than {limit} bytes (rule: a {what} holds at most {limit} bytes; reading stops there)"
)]
pub struct LineTooLong {
    /// "line", or "record starting at line" for a CSV record.
    pub what: &'static str,
    pub line: u64,
    pub limit: usize,
}

/// A reader that fails once a line (or CSV record) exceeds its limit; see the module doc.
#[derive(Debug)]
pub struct BoundedLines<R> {
    inner: R,
    records: Records,
    limit: usize,
    /// Physical line of the next byte (1-based).
    line: u64,
    /// Line on which the current line or record started.
    start: u64,
    /// Bytes of the current line or record so far (newlines inside a quoted field included).
    current: usize,
    in_quotes: bool,
    failed: Option<LineTooLong>,
}

impl<R: Read> BoundedLines<R> {
    /// Lines of at most [`MAX_LINE_BYTES`].
    pub fn new(inner: R, records: Records) -> Self {
        Self::with_limit(inner, records, MAX_LINE_BYTES)
    }

    pub fn with_limit(inner: R, records: Records, limit: usize) -> Self {
        BoundedLines {
            inner,
            records,
            limit,
            line: 1,
            start: 1,
            current: 0,
            in_quotes: false,
            failed: None,
        }
    }

    fn fail(&mut self) -> std::io::Error {
        let error = LineTooLong {
            what: match self.records {
                Records::Lines => "line",
                Records::Csv => "record starting at line",
            },
            line: self.start,
            limit: self.limit,
        };
        self.failed = Some(error.clone());
        std::io::Error::new(std::io::ErrorKind::InvalidData, error)
    }

    /// Accounts for `data` (the next bytes of the input); fails once a line is over the limit.
    fn account(&mut self, data: &[u8]) -> Result<(), ()> {
        let special: Box<dyn Iterator<Item = usize> + '_> = match self.records {
            Records::Lines => Box::new(memchr::memchr_iter(b'\n', data)),
            Records::Csv => Box::new(memchr::memchr2_iter(b'\n', b'"', data)),
        };
        let mut from = 0;
        for at in special {
            // The bytes before this newline or quote, and a quote or quoted newline itself.
            let newline_ends = data[at] == b'\n' && !self.in_quotes;
            self.current += at - from + usize::from(!newline_ends);
            if self.current > self.limit {
                return Err(());
            }
            from = at + 1;
            if data[at] == b'"' {
                self.in_quotes = !self.in_quotes;
                continue;
            }
            self.line += 1;
            if newline_ends {
                self.current = 0;
                self.start = self.line;
            }
        }
        self.current += data.len() - from;
        if self.current > self.limit {
            return Err(());
        }
        Ok(())
    }
}

impl<R: Read> Read for BoundedLines<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(error) = &self.failed {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                error.clone(),
            ));
        }
        let n = self.inner.read(buf)?;
        match self.account(&buf[..n]) {
            Ok(()) => Ok(n),
            Err(()) => Err(self.fail()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(input: &[u8], records: Records, limit: usize) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        // Small reads, so lines straddle calls.
        let mut reader = BoundedLines::with_limit(input, records, limit);
        let mut buf = [0u8; 3];
        loop {
            let n = reader.read(&mut buf)?;
            if n == 0 {
                return Ok(out);
            }
            out.extend_from_slice(&buf[..n]);
        }
    }

    fn too_long(result: std::io::Result<Vec<u8>>) -> LineTooLong {
        let error = result.unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
        error
            .into_inner()
            .unwrap()
            .downcast::<LineTooLong>()
            .map(|e| *e)
            .unwrap()
    }

    #[test]
    fn lines_up_to_the_limit_pass_unchanged() {
        let input = b"abcd\n\nabcd\nab";
        assert_eq!(read_all(input, Records::Lines, 4).unwrap(), input);
        assert_eq!(read_all(input, Records::Csv, 4).unwrap(), input);
    }

    #[test]
    fn a_long_line_fails_naming_its_number_and_the_limit() {
        let error = too_long(read_all(b"abcd\nabcde\nx", Records::Lines, 4));
        assert_eq!(
            error,
            LineTooLong {
                what: "line",
                line: 2,
                limit: 4
            }
        );
        assert_eq!(
            error.to_string(),
            "line 2 is longer than 4 bytes (rule: a line holds at most 4 bytes; reading stops there)"
        );
        // A last line without a newline counts too.
        assert_eq!(
            too_long(read_all(b"a\nb\nccccc", Records::Lines, 4)).line,
            3
        );
    }

    #[test]
    fn endless_input_without_newlines_fails_after_the_limit() {
        let mut reader = BoundedLines::with_limit(std::io::repeat(0), Records::Lines, 1000);
        let mut sink = Vec::new();
        let error = reader.read_to_end(&mut sink).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::InvalidData);
        assert!(sink.len() <= 1000 + 8192, "{}", sink.len());
        // Failed once, failed for good.
        assert!(reader.read(&mut [0u8; 4]).is_err());
    }

    #[test]
    fn csv_records_span_quoted_newlines() {
        // One record of 3 physical lines, 9 bytes in all: within 9, over 8.
        let input = b"h\n\"a\nb\nc\",d\nx\n";
        assert!(read_all(input, Records::Csv, 9).is_ok());
        assert_eq!(
            too_long(read_all(input, Records::Csv, 8)),
            LineTooLong {
                what: "record starting at line",
                line: 2,
                limit: 8
            }
        );
        // As plain lines, each is short.
        assert!(read_all(input, Records::Lines, 5).is_ok());
    }
}
