//! Private atomic writes: the mode, the replacement of a world-readable file, nothing left on failure.

use std::os::unix::fs::PermissionsExt as _;

use super::*;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[test]
fn a_world_readable_file_is_replaced_by_a_private_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "old").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    write_private(&path, b"new").unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "new");
    assert_eq!(mode(&path), 0o600);
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["config.yaml"], "no temporary file is left");
}

#[test]
fn a_failed_write_leaves_the_old_file_and_no_temporary() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, "old").unwrap();
    // A directory in the way of the rename: the write and sync succeed, the rename fails.
    let blocked = dir.path().join("sub");
    std::fs::create_dir(&blocked).unwrap();
    std::fs::write(blocked.join("x"), "").unwrap();
    assert!(write_private(&blocked, b"new").is_err());
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "old");
    let mut names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names, ["config.yaml", "sub"], "the temporary file was removed");
}
