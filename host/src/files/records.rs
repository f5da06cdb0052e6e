//! [`Records`]: a file of fixed-size records that mst keeps for itself, unnamed (gone once it
//! is closed), where a list that would grow with the number of trials in memory is kept
//! instead (issue 16: memory flat in N): the cases' places, the grade slots, the trace log's
//! index.
//!
//! A record is read or written where it is with positioned I/O (`pread`/`pwrite`): one system
//! call a record, and any number of readers share the file without moving each other's
//! place. A whole file is read in order in large reads ([`Records::iter`]), and one being
//! filled in order is written in large writes ([`Appender`]). Records are the bytes [`Pack`]
//! packs and [`Unpack`] unpacks: fields one after another, little-endian.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

/// How many records [`Records::iter`] and [`Appender`] move in one system call.
const BATCH: usize = 4096;

/// A file of fixed `N`-byte records, record `i` at byte `i * N`. Records never written read as
/// zeros, and cost nothing on disk (the file is sparse). Errors say which file (`what`: its
/// purpose, the file having no name) and which record.
#[derive(Debug)]
pub struct Records<const N: usize> {
    file: File,
    /// How many records the file holds.
    len: usize,
    /// What the file is, for errors: "the grade slots file".
    what: &'static str,
}

impl<const N: usize> Records<N> {
    /// No records, in a new unnamed file in `$TMPDIR`; `what` says what it is, for errors.
    pub fn temp(what: &'static str) -> io::Result<Self> {
        Ok(Records::in_file(tempfile::tempfile()?, what))
    }

    /// No records, in a new unnamed file in `dir`.
    pub fn temp_in(dir: &Path, what: &'static str) -> io::Result<Self> {
        Ok(Records::in_file(tempfile::tempfile_in(dir)?, what))
    }

    fn in_file(file: File, what: &'static str) -> Self {
        Records { file, len: 0, what }
    }

    /// Makes the file `len` records long: records added read as zeros, and take no room on
    /// disk until written.
    pub fn resize(&mut self, len: usize) -> io::Result<()> {
        let bytes = self.offset(len)?;
        (self.file.set_len(bytes)).map_err(|e| {
            let message = format!("cannot make {} {len} records long: {e}", self.what);
            io::Error::new(e.kind(), message)
        })?;
        self.len = len;
        Ok(())
    }

    /// How many records the file holds.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The record at `index`: one read. Past the end, or in a file cut short, it is an error.
    pub fn get(&self, index: usize) -> io::Result<[u8; N]> {
        if index >= self.len {
            return Err(self.past_the_end(index));
        }
        let mut record = [0; N];
        (self.file.read_exact_at(&mut record, self.offset(index)?))
            .map_err(|e| self.failed("cannot read", index, e))?;
        Ok(record)
    }

    /// Writes `record` at `index`: one write. Past the end, the file grows to end with it, the
    /// records between reading as zeros.
    pub fn set(&mut self, index: usize, record: &[u8; N]) -> io::Result<()> {
        (self.file.write_all_at(record, self.offset(index)?))
            .map_err(|e| self.failed("cannot write", index, e))?;
        self.len = self.len.max(index + 1);
        Ok(())
    }

    /// Every record, in order, read in large reads (the file is not moved: lookups may go on).
    pub fn iter(&self) -> impl Iterator<Item = io::Result<[u8; N]>> + '_ {
        let mut from = BufReader::with_capacity(N * BATCH, ReadAt::new(&self.file, 0));
        (0..self.len).map(move |index| {
            let mut record = [0; N];
            (from.read_exact(&mut record)).map_err(|e| self.failed("cannot read", index, e))?;
            Ok(record)
        })
    }

    /// Records to be added at the end, in large writes; [`Appender::finish`] gives the file
    /// back with them.
    pub fn appending(self) -> Appender<N> {
        let at = self.len as u64 * N as u64;
        let Records { file, len, what } = self;
        Appender {
            out: BufWriter::with_capacity(N * BATCH, WriteAt { file, at }),
            len,
            what,
        }
    }

    /// Where the record at `index` starts.
    fn offset(&self, index: usize) -> io::Result<u64> {
        (index as u64)
            .checked_mul(N as u64)
            .ok_or_else(|| self.past_the_end(index))
    }

    fn past_the_end(&self, index: usize) -> io::Error {
        let error = format!(
            "record {index} is past the end of {} ({} records)",
            self.what, self.len
        );
        io::Error::new(io::ErrorKind::UnexpectedEof, error)
    }

    fn failed(&self, doing: &str, index: usize, error: io::Error) -> io::Error {
        failed(self.what, doing, index, self.len, error)
    }
}

/// `error`, saying what could not be done (`doing`) to which record (`index`, of `len`) of
/// which file (`what`); a read that ran out of file says the file is cut short. Made only on
/// failure: reads and writes that succeed allocate nothing.
fn failed(what: &str, doing: &str, index: usize, len: usize, error: io::Error) -> io::Error {
    let message = if error.kind() == io::ErrorKind::UnexpectedEof {
        format!("{what} is cut short: record {index} of {len} is not all there")
    } else {
        format!("{doing} record {index} of {what}: {error}")
    };
    io::Error::new(error.kind(), message)
}

/// Records added at the end of a [`Records`] file, buffered: a system call for
/// [`BATCH`] records, not one each.
pub struct Appender<const N: usize> {
    out: BufWriter<WriteAt>,
    /// How many records the file holds, those still buffered among them.
    len: usize,
    what: &'static str,
}

impl<const N: usize> Appender<N> {
    /// Adds `record` at the end.
    pub fn push(&mut self, record: &[u8; N]) -> io::Result<()> {
        (self.out.write_all(record))
            .map_err(|e| failed(self.what, "cannot write", self.len, self.len, e))?;
        self.len += 1;
        Ok(())
    }

    /// How many records the file holds, those pushed included.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The file with every record pushed written to it.
    pub fn finish(self) -> io::Result<Records<N>> {
        let Appender { out, len, what } = self;
        let WriteAt { file, .. } = out.into_inner().map_err(|e| {
            let e = e.into_error();
            io::Error::new(e.kind(), format!("cannot write {what}: {e}"))
        })?;
        Ok(Records { file, len, what })
    }
}

/// Reads `file` from `at` on with positioned reads: any number of readers and lookups share
/// the file without moving each other's place. Wrapped in a `BufReader`, it reads in order in
/// large reads.
pub struct ReadAt<'a> {
    file: &'a File,
    at: u64,
}

impl<'a> ReadAt<'a> {
    /// `file` read from its byte `at` on.
    pub fn new(file: &'a File, at: u64) -> Self {
        ReadAt { file, at }
    }
}

impl Read for ReadAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let read = self.file.read_at(buf, self.at)?;
        self.at += read as u64;
        Ok(read)
    }
}

/// Writes `file` from `at` on with positioned writes, whatever the file's own offset.
struct WriteAt {
    file: File,
    at: u64,
}

impl Write for WriteAt {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let written = self.file.write_at(buf, self.at)?;
        self.at += written as u64;
        Ok(written)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A record's fields packed one after another, little-endian, as a record file lays them out:
/// `Pack::new().u64(at).u32(len).done()`.
pub struct Pack<const N: usize> {
    bytes: [u8; N],
    at: usize,
}

impl<const N: usize> Default for Pack<N> {
    fn default() -> Self {
        Pack {
            bytes: [0; N],
            at: 0,
        }
    }
}

impl<const N: usize> Pack<N> {
    /// A record with no field packed yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Packs `value` next.
    pub fn u64(self, value: u64) -> Self {
        self.put(&value.to_le_bytes())
    }

    /// Packs `value` next.
    pub fn u32(self, value: u32) -> Self {
        self.put(&value.to_le_bytes())
    }

    fn put(mut self, field: &[u8]) -> Self {
        self.bytes[self.at..self.at + field.len()].copy_from_slice(field);
        self.at += field.len();
        self
    }

    /// The record, its fields filling it.
    pub fn done(self) -> [u8; N] {
        debug_assert_eq!(self.at, N, "a record's fields fill it");
        self.bytes
    }
}

/// A record's fields as [`Pack`] packed them, taken in the same order.
pub struct Unpack<'a> {
    rest: &'a [u8],
}

impl<'a> Unpack<'a> {
    /// The fields of `record`, from its first.
    pub fn new(record: &'a [u8]) -> Self {
        Unpack { rest: record }
    }

    /// The next field, a `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.take())
    }

    /// The next field, a `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take())
    }

    fn take<const W: usize>(&mut self) -> [u8; W] {
        let (field, rest) =
            (self.rest.split_first_chunk::<W>()).expect("a record holds its fields");
        self.rest = rest;
        *field
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(n: u64) -> [u8; 12] {
        Pack::new().u64(n).u32(n as u32 + 1).done()
    }

    #[test]
    fn records_read_back_as_written_one_at_a_time_and_in_order() {
        let mut records = Records::<12>::temp("the test records file").unwrap();
        assert!(records.is_empty());
        records.set(0, &record(7)).unwrap();
        let mut appender = records.appending();
        for n in 1..5000 {
            appender.push(&record(n * 3)).unwrap();
        }
        assert_eq!(appender.len(), 5000);
        let mut records = appender.finish().unwrap();
        assert_eq!(records.len(), 5000);
        assert_eq!(records.get(0).unwrap(), record(7));
        assert_eq!(records.get(4999).unwrap(), record(4999 * 3));
        records.set(17, &record(1)).unwrap();
        let all: Vec<[u8; 12]> = records.iter().map(Result::unwrap).collect();
        assert_eq!(all.len(), 5000);
        assert_eq!(
            (all[16], all[17], all[18]),
            (record(48), record(1), record(54))
        );
        let mut fields = Unpack::new(&all[3]);
        assert_eq!((fields.u64(), fields.u32()), (9, 10));
    }

    #[test]
    fn a_record_past_the_end_is_an_error_and_a_sparse_one_reads_as_zeros() {
        let dir = tempfile::tempdir().unwrap();
        let mut records = Records::<12>::temp_in(dir.path(), "the test records file").unwrap();
        records.resize(3).unwrap();
        assert_eq!(records.get(2).unwrap(), [0; 12]);
        let error = records.get(3).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        assert_eq!(
            error.to_string(),
            "record 3 is past the end of the test records file (3 records)"
        );
        // Written past the end: the file grows, the records between it and the old end read
        // as zeros.
        records.set(6, &record(6)).unwrap();
        assert_eq!(records.len(), 7);
        let all: Vec<[u8; 12]> = records.iter().map(Result::unwrap).collect();
        assert_eq!(all[3..], [[0; 12], [0; 12], [0; 12], record(6)]);
    }

    #[test]
    fn a_file_cut_short_is_an_error_naming_it_and_the_record() {
        let mut appender = Records::<12>::temp("the test records file")
            .unwrap()
            .appending();
        for n in 0..3 {
            appender.push(&record(n)).unwrap();
        }
        let records = appender.finish().unwrap();
        records.file.set_len(2 * 12 + 5).unwrap();
        assert_eq!(records.get(1).unwrap(), record(1));
        let error = records.get(2).unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::UnexpectedEof);
        let expected = "the test records file is cut short: record 2 of 3 is not all there";
        assert_eq!(error.to_string(), expected);
        let read: Vec<_> = records.iter().collect();
        assert!(read[0].is_ok() && read[1].is_ok());
        assert_eq!(read[2].as_ref().unwrap_err().to_string(), expected);
    }
}
