//! Files of item sets for `cloakd transactions ...`: one set per line, items separated by
//! whitespace (any string, interned to dense ids in order of first appearance); `.gz` is read and
//! written transparently.
//!
//! Reading is built for the tens of millions of tokens of a constraints file: a thread inflates
//! the file one block ahead of the parser ([`ReadAhead`]), and the parser works on the bytes of each
//! block. A block of pure ASCII (every public data set) is split at ASCII whitespace and its
//! tokens are interned by their bytes; a block with other bytes is decoded line by line as UTF-8
//! and split at Unicode whitespace, so the result is what `str::split_whitespace` on each line
//! gives. Lines end at `\n` (a `\r` before it is whitespace); a last line without `\n` counts.
//! Invalid UTF-8 is refused as an I/O error naming the file. Writes go to a temporary file beside
//! the target that is renamed into place, so a failed run never leaves a partial file.
use std::io::{BufWriter, Read, Write};
use std::path::Path;

use crate::transactions::FxHashMap;
use crate::transactions::ItemId;

use super::error::TransactionsCliError;

/// Interned item names: name → dense id, and back.
///
/// Names of at most 15 bytes (every item of the public data sets) are looked up by their bytes
/// packed into a `u128` with the length in the last byte, in an open-addressing table of (key, id)
/// slots probed linearly (at most half full), so each of the tens of millions of tokens of a
/// constraints file costs one multiplication and, mostly, one compare in a cache-resident table;
/// longer names go through a string map.
pub(crate) struct ItemNames {
    /// Slots of the short-name table: (packed name, id), id [`Self::EMPTY`] for a free slot.
    slots: Vec<(u128, ItemId)>,
    /// Short names in `slots`.
    short_count: usize,
    long: FxHashMap<Box<str>, ItemId>,
    pub(crate) names: Vec<Box<str>>,
}

impl Default for ItemNames {
    fn default() -> Self {
        ItemNames {
            slots: vec![(0, Self::EMPTY); 1 << 10],
            short_count: 0,
            long: FxHashMap::default(),
            names: Vec::new(),
        }
    }
}

impl ItemNames {
    const EMPTY: ItemId = ItemId::MAX;

    pub(crate) fn intern(&mut self, name: &str) -> ItemId {
        let next = self.names.len() as ItemId;
        let id = match short_key(name) {
            Some(key) => self.intern_short(key, next),
            None => match self.long.get(name) {
                Some(&id) => id,
                None => {
                    self.long.insert(name.into(), next);
                    next
                }
            },
        };
        if id == next {
            self.names.push(name.into());
        }
        id
    }

    /// The id of a short name, `next` (and recorded) when it is new.
    #[inline]
    fn intern_short(&mut self, key: u128, next: ItemId) -> ItemId {
        let mask = self.slots.len() - 1;
        let mut at = Self::slot_of(key, mask);
        loop {
            let (slot_key, id) = self.slots[at];
            if id == Self::EMPTY {
                break;
            }
            if slot_key == key {
                return id;
            }
            at = (at + 1) & mask;
        }
        self.slots[at] = (key, next);
        self.short_count += 1;
        if 2 * self.short_count > self.slots.len() {
            self.grow();
        }
        next
    }

    #[inline]
    fn slot_of(key: u128, mask: usize) -> usize {
        let mixed =
            (key as u64 ^ ((key >> 64) as u64).rotate_left(29)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 32) as usize & mask
    }

    fn grow(&mut self) {
        let doubled = vec![(0, Self::EMPTY); 2 * self.slots.len()];
        let old = std::mem::replace(&mut self.slots, doubled);
        let mask = self.slots.len() - 1;
        for (key, id) in old.into_iter().filter(|&(_, id)| id != Self::EMPTY) {
            let mut at = Self::slot_of(key, mask);
            while self.slots[at].1 != Self::EMPTY {
                at = (at + 1) & mask;
            }
            self.slots[at] = (key, id);
        }
    }
}

/// `name`'s bytes and length packed into one integer (little-endian, the length in the last
/// byte), if it has at most 15 bytes. Built in registers: a byte copy to the stack read back as one
/// integer stalls the store forwarding on every token.
#[inline]
fn short_key(name: &str) -> Option<u128> {
    let bytes = name.as_bytes();
    if bytes.len() > 15 {
        return None;
    }
    let mut key = (bytes.len() as u128) << 120;
    for (at, &byte) in bytes.iter().enumerate() {
        key |= u128::from(byte) << (8 * at);
    }
    Some(key)
}

/// A source (typically a gzip decoder) read on its own thread, one block ahead of the consumer,
/// so inflating a large file and parsing it overlap on two cores. The thread ends at the end of
/// the input, at its first error (handed on to the consumer) or when the consumer is dropped.
pub(crate) struct ReadAhead {
    blocks: std::sync::mpsc::Receiver<std::io::Result<Vec<u8>>>,
    done: bool,
}

impl ReadAhead {
    const BLOCK: usize = 1 << 20;
    const BLOCKS_AHEAD: usize = 4;

    pub(crate) fn spawn(mut source: Box<dyn Read + Send>) -> Self {
        let (sender, blocks) = std::sync::mpsc::sync_channel(Self::BLOCKS_AHEAD);
        std::thread::spawn(move || {
            loop {
                let mut block = vec![0; Self::BLOCK];
                let mut filled = 0;
                let result = loop {
                    match source.read(&mut block[filled..]) {
                        Ok(0) => break Ok(()),
                        Ok(read) => {
                            filled += read;
                            if filled == block.len() {
                                break Ok(());
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => break Err(e),
                    }
                };
                block.truncate(filled);
                let last = filled == 0 || result.is_err();
                let sent = match result {
                    Ok(()) => sender.send(Ok(block)),
                    Err(e) => sender.send(Err(e)),
                };
                if last || sent.is_err() {
                    return;
                }
            }
        });
        ReadAhead {
            blocks,
            done: false,
        }
    }

    /// The next non-empty block in order, `None` at the end of the input.
    pub(crate) fn next_block(&mut self) -> std::io::Result<Option<Vec<u8>>> {
        if self.done {
            return Ok(None);
        }
        match self.blocks.recv() {
            Ok(Ok(block)) if !block.is_empty() => Ok(Some(block)),
            Ok(Err(e)) => {
                self.done = true;
                Err(e)
            }
            // An empty block, or the thread has ended after the last block.
            Ok(Ok(_)) | Err(_) => {
                self.done = true;
                Ok(None)
            }
        }
    }
}

pub(crate) fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> TransactionsCliError + '_ {
    move |source| TransactionsCliError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Whitespace as `char::is_whitespace` has it, restricted to ASCII: tab, line feed, vertical tab,
/// form feed, carriage return and space.
#[inline]
fn is_ascii_space(byte: u8) -> bool {
    matches!(byte, b'\t' | b'\n' | 0x0b | 0x0c | b'\r' | b' ')
}

/// Turns the bytes of a file into item sets, one per line.
struct Parser<'a> {
    path: &'a Path,
    names: &'a mut ItemNames,
    allow_empty: bool,
    line_no: usize,
    items: Vec<ItemId>,
    sets: Vec<Vec<ItemId>>,
}

impl Parser<'_> {
    /// Parses complete lines (`chunk` ends with `\n`, or is the last line of the file).
    fn lines(&mut self, chunk: &[u8]) -> Result<(), TransactionsCliError> {
        if chunk.is_ascii() {
            let text = std::str::from_utf8(chunk).map_err(invalid_utf8(self.path))?;
            let mut start: Option<usize> = None;
            for (at, &byte) in text.as_bytes().iter().enumerate() {
                if is_ascii_space(byte) {
                    if let Some(from) = start.take() {
                        self.items.push(self.names.intern(&text[from..at]));
                    }
                    if byte == b'\n' {
                        self.end_line()?;
                    }
                } else if start.is_none() {
                    start = Some(at);
                }
            }
            if let Some(from) = start {
                self.items.push(self.names.intern(&text[from..]));
            }
            if !text.ends_with('\n') {
                self.end_line()?;
            }
            return Ok(());
        }
        for line in chunk.split_inclusive(|&b| b == b'\n') {
            let text = std::str::from_utf8(line).map_err(invalid_utf8(self.path))?;
            for token in text.split_whitespace() {
                self.items.push(self.names.intern(token));
            }
            self.end_line()?;
        }
        Ok(())
    }

    fn end_line(&mut self) -> Result<(), TransactionsCliError> {
        self.line_no += 1;
        let bad = |rule: String| TransactionsCliError::Line {
            path: self.path.display().to_string(),
            line: self.line_no,
            rule,
        };
        if self.items.is_empty() && !self.allow_empty {
            return Err(bad("a record needs at least one item".into()));
        }
        self.items.sort_unstable();
        if let Some(pair) = self.items.windows(2).find(|w| w[0] == w[1]) {
            return Err(bad(format!(
                "item {:?} appears twice",
                self.names.names[pair[0] as usize]
            )));
        }
        self.sets.push(self.items.clone());
        self.items.clear();
        Ok(())
    }
}

fn invalid_utf8(path: &Path) -> impl FnOnce(std::str::Utf8Error) -> TransactionsCliError + '_ {
    move |e| TransactionsCliError::Io {
        path: path.display().to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("stream did not contain valid UTF-8 ({e})"),
        ),
    }
}

/// Reads a file of item sets, one per line. `allow_empty`: whether a line may hold no item.
pub(crate) fn read_item_sets(
    path: &Path,
    names: &mut ItemNames,
    allow_empty: bool,
) -> Result<Vec<Vec<ItemId>>, TransactionsCliError> {
    let reader = crate::data_files::open_maybe_gz(path).map_err(io_error(path))?;
    // Bounded: a line past `crate::lines::MAX_LINE_BYTES` fails the read, naming its number.
    let reader = Box::new(crate::lines::BoundedLines::new(
        reader,
        crate::lines::Records::Lines,
    ));
    read_item_sets_from(path, ReadAhead::spawn(reader), names, allow_empty)
}

fn read_item_sets_from(
    path: &Path,
    mut blocks: ReadAhead,
    names: &mut ItemNames,
    allow_empty: bool,
) -> Result<Vec<Vec<ItemId>>, TransactionsCliError> {
    let mut parser = Parser {
        path,
        names,
        allow_empty,
        line_no: 0,
        items: Vec::new(),
        sets: Vec::new(),
    };
    // The start of a line that continues in the next block.
    let mut carry: Vec<u8> = Vec::new();
    while let Some(block) = blocks.next_block().map_err(io_error(path))? {
        let Some(last) = block.iter().rposition(|&b| b == b'\n') else {
            carry.extend_from_slice(&block);
            continue;
        };
        let mut rest = &block[..=last];
        if !carry.is_empty() {
            let first = rest.iter().position(|&b| b == b'\n').unwrap_or(last);
            carry.extend_from_slice(&rest[..=first]);
            parser.lines(&carry)?;
            carry.clear();
            rest = &rest[first + 1..];
        }
        if !rest.is_empty() {
            parser.lines(rest)?;
        }
        carry.extend_from_slice(&block[last + 1..]);
    }
    if !carry.is_empty() {
        parser.lines(&carry)?;
    }
    Ok(parser.sets)
}

/// Writes `lines` of item sets to `path` atomically ([`crate::atomic_file`]); gzip when `.gz`.
pub(crate) fn write_item_sets<'a>(
    path: &Path,
    names: &ItemNames,
    lines: impl Iterator<Item = &'a Vec<ItemId>>,
) -> Result<(), TransactionsCliError> {
    if path.file_name().is_none() {
        return Err(TransactionsCliError::Argument {
            field: "output",
            rule: format!("{} is not a file path", path.display()),
        });
    }
    crate::atomic_file::write_atomically(path, |file| {
        // Buffer in front of the encoder: it is slow on the many tiny writes of item names.
        if path.extension().is_some_and(|e| e == "gz") {
            let encoder = flate2::write::GzEncoder::new(file, flate2::Compression::fast());
            let mut out = BufWriter::with_capacity(1 << 16, encoder);
            write_lines(&mut out, names, lines)?;
            out.into_inner()
                .map_err(std::io::IntoInnerError::into_error)?
                .finish()?;
        } else {
            let mut out = BufWriter::with_capacity(1 << 16, file);
            write_lines(&mut out, names, lines)?;
            out.flush()?;
        }
        Ok(())
    })
    .map_err(io_error(path))
}

fn write_lines<'a>(
    out: &mut impl Write,
    names: &ItemNames,
    lines: impl Iterator<Item = &'a Vec<ItemId>>,
) -> std::io::Result<()> {
    for items in lines {
        let mut first = true;
        for &item in items {
            if !first {
                out.write_all(b" ")?;
            }
            first = false;
            out.write_all(names.names[item as usize].as_bytes())?;
        }
        out.write_all(b"\n")?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read;
    use std::path::Path;

    use super::{ItemNames, ReadAhead, read_item_sets_from, short_key};

    fn drain(mut blocks: ReadAhead) -> std::io::Result<Vec<u8>> {
        let mut read = Vec::new();
        while let Some(block) = blocks.next_block()? {
            read.extend_from_slice(&block);
        }
        Ok(read)
    }

    #[test]
    fn read_ahead_hands_on_every_byte_in_order() {
        let data: Vec<u8> = (0..(3 * ReadAhead::BLOCK + 12_345))
            .map(|i| (i % 251) as u8)
            .collect();
        let read = drain(ReadAhead::spawn(Box::new(std::io::Cursor::new(
            data.clone(),
        ))))
        .unwrap();
        assert_eq!(read, data);
        assert!(
            drain(ReadAhead::spawn(Box::new(std::io::empty())))
                .unwrap()
                .is_empty()
        );
    }

    #[test]
    fn read_ahead_hands_on_the_source_error() {
        struct Failing(usize);
        impl Read for Failing {
            fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
                if self.0 == 0 {
                    return Err(std::io::Error::other("disk on fire"));
                }
                let n = out.len().min(self.0);
                self.0 -= n;
                Ok(n)
            }
        }
        let error = drain(ReadAhead::spawn(Box::new(Failing(ReadAhead::BLOCK + 7)))).unwrap_err();
        assert_eq!(error.to_string(), "disk on fire");
    }

    #[test]
    fn names_intern_to_dense_ids_short_and_long() {
        let mut names = ItemNames::default();
        let words = [
            "a",
            "ab",
            "a\0",
            "",
            "exactly15bytes!",
            "sixteen_bytes_xx",
            "a much longer item name",
        ];
        let ids: Vec<u32> = words.iter().map(|w| names.intern(w)).collect();
        assert_eq!(ids, (0..words.len() as u32).collect::<Vec<_>>());
        for (word, id) in words.iter().zip(&ids) {
            assert_eq!(names.intern(word), *id);
            assert_eq!(&*names.names[*id as usize], *word);
        }
        assert!(short_key("exactly15bytes!").is_some());
        assert!(short_key("sixteen_bytes_xx").is_none());
    }

    /// What the parser must give: each line split by `str::split_whitespace`, names interned in
    /// order of first appearance, each set sorted.
    fn reference(text: &str, names: &mut ItemNames) -> Vec<Vec<u32>> {
        let mut lines: Vec<&str> = text.split_inclusive('\n').collect();
        if text.is_empty() {
            lines.clear();
        }
        lines
            .into_iter()
            .map(|line| {
                let mut items: Vec<u32> =
                    line.split_whitespace().map(|t| names.intern(t)).collect();
                items.sort_unstable();
                items
            })
            .collect()
    }

    /// The sets and the interned names.
    type Parsed = (Vec<Vec<u32>>, Vec<Box<str>>);

    /// The parsed file, or the error message.
    fn parse(bytes: Vec<u8>, allow_empty: bool) -> Result<Parsed, String> {
        let mut names = ItemNames::default();
        let blocks = ReadAhead::spawn(Box::new(std::io::Cursor::new(bytes)));
        read_item_sets_from(Path::new("f"), blocks, &mut names, allow_empty)
            .map(|sets| (sets, names.names))
            .map_err(|e| e.to_string())
    }

    #[test]
    fn parser_agrees_with_split_whitespace_across_blocks() {
        // Long enough to span several blocks, with lines cut at block boundaries, ASCII blocks and
        // blocks with Unicode names and Unicode whitespace, \r\n endings and no final newline.
        let mut text = String::new();
        let mut line = 0u64;
        while text.len() < 3 * ReadAhead::BLOCK + 777 {
            line += 1;
            let words = 1 + (line * 7 % 13);
            for w in 0..words {
                let id = (line * 31 + w * 17) % 997;
                match (line + w) % 11 {
                    0 if line % 500 == 7 => text.push_str(&format!("é{id}\u{a0}x{id}")),
                    1 => text.push_str(&format!("a-very-long-item-name-{id}")),
                    2 => text.push_str(&format!("{id}\t")),
                    3 => text.push_str(&format!("\x0b{id}\x0c")),
                    _ => text.push_str(&format!("{id}")),
                }
                text.push(' ');
            }
            text.push_str(if line.is_multiple_of(3) { "\r\n" } else { "\n" });
        }
        text.push_str("last 1 2");
        let mut names = ItemNames::default();
        let expected = reference(&text, &mut names);
        let (sets, parsed_names) = parse(text.into_bytes(), false).unwrap();
        assert_eq!(sets, expected);
        assert_eq!(parsed_names, names.names);
    }

    #[test]
    fn parser_refuses_bad_lines_with_their_number() {
        assert_eq!(
            parse(b"1 2\n\n3\n".to_vec(), false).unwrap_err(),
            "f:2: a record needs at least one item"
        );
        let (sets, _) = parse(b"1 2\n \n3".to_vec(), true).unwrap();
        assert_eq!(sets.len(), 3);
        assert_eq!(
            parse(b"1 2\n3 4 3\n".to_vec(), false).unwrap_err(),
            "f:2: item \"3\" appears twice"
        );
        let error = parse(b"1 2\n3 \xff\n".to_vec(), false).unwrap_err();
        assert!(error.contains("valid UTF-8"), "{error}");
    }
}
