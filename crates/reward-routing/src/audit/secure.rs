//! The file-system half of audit shards: directories opened component by component without following
//! symlinks, ownership checks against the effective uid, private modes.

use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::{Component, Path};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

const DIR_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::DIRECTORY)
    .union(OFlags::NOFOLLOW)
    .union(OFlags::CLOEXEC);

/// The host name as shard names use it: characters other than ASCII letters, digits, `.`, `_` and `-` become
/// `_`.
pub(super) fn hostname() -> String {
    let uname = rustix::system::uname();
    let name: String = uname
        .nodename()
        .to_string_lossy()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if name.is_empty() {
        "localhost".to_string()
    } else {
        name
    }
}

/// Opens (creating as needed, mode 0700) the absolute directory `path` one component at a time, refusing any
/// symlink on the way; then checks that it is owned by the effective uid and sets it to 0700.
fn open_dir(path: &Path) -> Result<OwnedFd, String> {
    let mut fd = rustix::fs::openat(rustix::fs::CWD, "/", DIR_FLAGS, Mode::empty())
        .map_err(|e| format!("opening /: {e}"))?;
    let mut walked = std::path::PathBuf::from("/");
    for component in path.components() {
        let name = match component {
            Component::RootDir | Component::CurDir => continue,
            Component::Normal(name) => name,
            Component::ParentDir | Component::Prefix(_) => {
                return Err(format!("{} is not a plain absolute path", path.display()));
            }
        };
        walked.push(name);
        match rustix::fs::mkdirat(&fd, name, Mode::RWXU) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(format!("creating {}: {e}", walked.display())),
        }
        fd = rustix::fs::openat(&fd, name, DIR_FLAGS, Mode::empty()).map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR => format!(
                "{} is a symlink or not a directory; refusing to follow it",
                walked.display()
            ),
            e => format!("opening {}: {e}", walked.display()),
        })?;
    }
    make_private(&fd, path, FileType::Directory, Mode::RWXU)?;
    Ok(fd)
}

/// Opens shard `name` in the directory `dir` for appending: created with mode 0600, never through a symlink;
/// it must be a regular file owned by the effective uid and is set to 0600. Returns the file and its length. A
/// shard that does not end in a newline (a write that failed half way) gets one first, so that the next record
/// starts on a line of its own.
pub(super) fn open_shard(dir: &Path, name: &str) -> Result<(File, u64), String> {
    let shown = dir.join(name);
    let (mut file, mut len) = open_private_file(dir, name)?;
    if len > 0 {
        let mut last = [0u8; 1];
        file.read_exact_at(&mut last, len - 1)
            .map_err(|e| format!("reading the end of {}: {e}", shown.display()))?;
        if last[0] != b'\n' {
            file.write_all(b"\n")
                .map_err(|e| format!("terminating a partial line in {}: {e}", shown.display()))?;
            len += 1;
        }
    }
    Ok((file, len))
}

/// Opens file `name` in the absolute directory `dir` for reading and appending, as audit shards and the
/// training loop's journal are: the directory is created (mode 0700) and opened one component at a time
/// without following a symlink, the file is created with mode 0600 and never opened through a symlink, both
/// must be owned by the effective uid and are set to 0700 / 0600, and the directory is fsynced so that a new
/// file's name survives a crash. Returns the file and its length; the error names the path and what failed.
pub fn open_private_file(dir: &Path, name: &str) -> Result<(File, u64), String> {
    let dir_fd = open_dir(dir)?;
    let shown = dir.join(name);
    let fd = rustix::fs::openat(
        &dir_fd,
        name,
        OFlags::RDWR | OFlags::APPEND | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::RUSR | Mode::WUSR,
    )
    .map_err(|e| match e {
        Errno::LOOP => format!("{} is a symlink; refusing to follow it", shown.display()),
        e => format!("opening {}: {e}", shown.display()),
    })?;
    let len = make_private(&fd, &shown, FileType::RegularFile, Mode::RUSR | Mode::WUSR)?;
    rustix::fs::fsync(&dir_fd).map_err(|e| format!("syncing {}: {e}", dir.display()))?;
    Ok((File::from(fd), len))
}

/// Checks that `fd` is a `kind` owned by the effective uid and sets its mode to `mode`; returns its size.
fn make_private(fd: &OwnedFd, shown: &Path, kind: FileType, mode: Mode) -> Result<u64, String> {
    let stat = rustix::fs::fstat(fd).map_err(|e| format!("inspecting {}: {e}", shown.display()))?;
    if FileType::from_raw_mode(stat.st_mode) != kind {
        let kind = if kind == FileType::Directory {
            "directory"
        } else {
            "regular file"
        };
        return Err(format!("{} must be a {kind}", shown.display()));
    }
    let euid = rustix::process::geteuid().as_raw();
    if stat.st_uid != euid {
        return Err(format!(
            "{} must be owned by uid {euid}, not {}",
            shown.display(),
            stat.st_uid
        ));
    }
    rustix::fs::fchmod(fd, mode).map_err(|e| {
        format!(
            "setting mode {:o} on {}: {e}",
            mode.as_raw_mode(),
            shown.display()
        )
    })?;
    Ok(u64::try_from(stat.st_size).unwrap_or(0))
}
