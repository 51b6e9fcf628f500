//! TensorBoard event files (`events.out.tfevents.<secs>.<host>`), written and read without TensorFlow.
//!
//! # Format
//!
//! A file is a sequence of records. Each record is
//!
//! ```text
//! u64 length (little-endian) | u32 masked_crc32c(length bytes) | data[length] | u32 masked_crc32c(data)
//! ```
//!
//! where `masked_crc32c(x) = ((crc >> 15) | (crc << 17)) + 0xa282ead8` (wrapping) over CRC-32C (Castagnoli).
//! `data` is a serialised `tensorflow.Event` protobuf:
//!
//! ```text
//! message Event { double wall_time = 1; int64 step = 2; oneof what { string file_version = 3; Summary summary = 5; } }
//! message Summary { repeated Value value = 1; }
//! message Summary.Value { string tag = 1; float simple_value = 2; }
//! ```
//!
//! The first record carries `file_version = "brain.Event:2"`; each later record carries one scalar summary.
//! This is what TensorBoard's `EventAccumulator` (and `wandb sync --sync-tensorboard`) reads as scalars.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};

use crate::error::{Context as _, Error, Result};

/// A decoding failure: what is wrong with the bytes.
type Decode<T> = std::result::Result<T, String>;

/// CRC-32C (Castagnoli, the iSCSI polynomial), as TFRecord frames use it.
const CASTAGNOLI: crc::Crc<u32> = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);

/// CRC-32C (Castagnoli) of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    CASTAGNOLI.checksum(data)
}

/// TFRecord's masked CRC.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(out: &mut Vec<u8>, field: u32, wire: u8) {
    varint(out, (u64::from(field) << 3) | u64::from(wire));
}

fn bytes_field(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    key(out, field, 2);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// One decoded event: wall time, step, and either the file version or scalar values.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    /// Seconds since the Unix epoch.
    pub wall_time: f64,
    /// The global step.
    pub step: i64,
    /// `brain.Event:2` on the first record.
    pub file_version: Option<String>,
    /// `(tag, simple_value)` pairs.
    pub scalars: Vec<(String, f32)>,
}

impl Event {
    /// The protobuf encoding.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        key(&mut out, 1, 1);
        out.extend_from_slice(&self.wall_time.to_le_bytes());
        key(&mut out, 2, 0);
        varint(&mut out, self.step as u64);
        if let Some(v) = &self.file_version {
            bytes_field(&mut out, 3, v.as_bytes());
        }
        if !self.scalars.is_empty() {
            let mut summary = Vec::new();
            for (tag, value) in &self.scalars {
                let mut v = Vec::new();
                bytes_field(&mut v, 1, tag.as_bytes());
                key(&mut v, 2, 5);
                v.extend_from_slice(&value.to_le_bytes());
                bytes_field(&mut summary, 1, &v);
            }
            bytes_field(&mut out, 5, &summary);
        }
        out
    }

    /// Decodes an `Event`, keeping the fields this module writes and skipping the others.
    pub fn decode(data: &[u8]) -> Decode<Self> {
        let mut event = Event {
            wall_time: 0.0,
            step: 0,
            file_version: None,
            scalars: Vec::new(),
        };
        for (field, value) in fields(data)? {
            match (field, value) {
                (1, Field::Fixed64(b)) => event.wall_time = f64::from_le_bytes(b),
                (2, Field::Varint(v)) => event.step = v as i64,
                (3, Field::Bytes(b)) => {
                    event.file_version = Some(String::from_utf8(b.to_vec()).map_err(|e| e.to_string())?)
                }
                (5, Field::Bytes(summary)) => {
                    for (f, value) in fields(summary)? {
                        let (1, Field::Bytes(v)) = (f, value) else {
                            continue;
                        };
                        let (mut tag, mut simple) = (String::new(), None);
                        for (vf, vv) in fields(v)? {
                            match (vf, vv) {
                                (1, Field::Bytes(t)) => {
                                    tag = String::from_utf8(t.to_vec()).map_err(|e| e.to_string())?
                                }
                                (2, Field::Fixed32(b)) => simple = Some(f32::from_le_bytes(b)),
                                _ => {}
                            }
                        }
                        if let Some(s) = simple {
                            event.scalars.push((tag, s));
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(event)
    }
}

enum Field<'a> {
    Varint(u64),
    Fixed64([u8; 8]),
    Fixed32([u8; 4]),
    Bytes(&'a [u8]),
}

fn read_varint(data: &[u8], pos: &mut usize) -> Decode<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let Some(&b) = data.get(*pos) else {
            return Err("truncated varint".into());
        };
        *pos += 1;
        v |= u64::from(b & 0x7f) << shift;
        if b & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err("varint longer than 10 bytes".into())
}

fn fields(data: &[u8]) -> Decode<Vec<(u32, Field<'_>)>> {
    let mut out = Vec::new();
    let mut pos = 0;
    while pos < data.len() {
        let k = read_varint(data, &mut pos)?;
        let field = (k >> 3) as u32;
        let take = |pos: &mut usize, n: usize| -> Decode<&[u8]> {
            let end = pos.checked_add(n).filter(|&e| e <= data.len());
            let Some(end) = end else {
                return Err(format!("truncated field {field}"));
            };
            let s = &data[*pos..end];
            *pos = end;
            Ok(s)
        };
        let value = match k & 7 {
            0 => Field::Varint(read_varint(data, &mut pos)?),
            1 => Field::Fixed64(
                take(&mut pos, 8)?
                    .try_into()
                    .map_err(|_| "a fixed64 of another size")?,
            ),
            2 => {
                let n = read_varint(data, &mut pos)? as usize;
                Field::Bytes(take(&mut pos, n)?)
            }
            5 => Field::Fixed32(
                take(&mut pos, 4)?
                    .try_into()
                    .map_err(|_| "a fixed32 of another size")?,
            ),
            w => return Err(format!("unsupported wire type {w} in field {field}")),
        };
        out.push((field, value));
    }
    Ok(out)
}

/// Frames `data` as one TFRecord.
pub fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// Reads every event of a file, checking both CRCs of every record.
pub fn read_events(path: &Path) -> Result<Vec<Event>> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    decode_records(&data).map_err(|message| Error::failed(path.display().to_string(), message))
}

/// Reads the events of a file up to its first bad or torn record (what a killed writer leaves), and says
/// whether the whole file was good.
pub fn read_good_events(path: &Path) -> Result<(Vec<Event>, bool)> {
    let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
    let mut events = Vec::new();
    let mut pos = 0usize;
    while pos < data.len() {
        let Some(len) = data.get(pos..pos + 8) else { break };
        let len = u64::from_le_bytes(std::array::from_fn(|i| len[i])) as usize;
        let end = pos.saturating_add(12).saturating_add(len).saturating_add(4);
        let Some(one) = data.get(pos..end) else { break };
        match decode_records(one) {
            Ok(mut e) => events.append(&mut e),
            Err(_) => break,
        }
        pos = end;
    }
    Ok((events, pos == data.len()))
}

/// Rewrites an event file with only `events` (through a temporary file and a rename).
pub fn rewrite_events(path: &Path, events: &[Event]) -> Result<()> {
    let mut data = Vec::new();
    for event in events {
        data.extend_from_slice(&record(&event.encode()));
    }
    super::replace_file(path, &data)
}

fn decode_records(data: &[u8]) -> Decode<Vec<Event>> {
    let word = |b: &[u8]| -> [u8; 4] { [b[0], b[1], b[2], b[3]] };
    let mut events = Vec::new();
    let mut pos = 0usize;
    while pos < data.len() {
        let Some(header) = data.get(pos..pos + 12) else {
            return Err(format!("truncated record header at byte {pos}"));
        };
        let len_bytes = &header[..8];
        let len = u64::from_le_bytes(std::array::from_fn(|i| len_bytes[i])) as usize;
        if u32::from_le_bytes(word(&header[8..12])) != masked_crc32c(len_bytes) {
            return Err(format!("bad length CRC at byte {pos}"));
        }
        let start = pos + 12;
        let Some(body) = start.checked_add(len).and_then(|end| data.get(start..end)) else {
            return Err(format!("truncated record at byte {pos}"));
        };
        let Some(crc) = data.get(start + len..start + len + 4) else {
            return Err(format!("truncated record CRC at byte {pos}"));
        };
        if u32::from_le_bytes(word(crc)) != masked_crc32c(body) {
            return Err(format!("bad data CRC at byte {pos}"));
        }
        events.push(Event::decode(body)?);
        pos = start + len + 4;
    }
    Ok(events)
}

/// Appends scalar events to one event file, flushing after each step.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `events.out.tfevents.<secs>.<host>` in `dir` and writes the version record.
    pub fn create(dir: &Path, host: &str) -> Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let now = wall_time();
        // A new file each time, never one an earlier process of the run wrote in the same second.
        let mut path = dir.join(format!("events.out.tfevents.{}.{host}", now as u64));
        let mut n = 0;
        let file = loop {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && n < 1000 => {
                    n += 1;
                    path = dir.join(format!("events.out.tfevents.{}.{host}.{n}", now as u64));
                }
                other => break other.with_context(|| format!("cannot create {}", path.display()))?,
            }
        };
        let mut writer = Self {
            out: BufWriter::new(file),
            path,
        };
        writer.write(&Event {
            wall_time: now,
            step: 0,
            file_version: Some("brain.Event:2".to_string()),
            scalars: Vec::new(),
        })?;
        Ok(writer)
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, event: &Event) -> Result<()> {
        self.out
            .write_all(&record(&event.encode()))
            .and_then(|()| self.out.flush())
            .with_context(|| format!("cannot write {}", self.path.display()))
    }

    /// Writes one scalar event per `(tag, value)` at `step`.
    pub fn scalars(&mut self, step: i64, values: &[(String, f64)]) -> Result<()> {
        let now = wall_time();
        for (tag, value) in values {
            self.write(&Event {
                wall_time: now,
                step,
                file_version: None,
                scalars: vec![(tag.clone(), *value as f32)],
            })?;
        }
        Ok(())
    }
}

fn wall_time() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests;
