//! Durable directory creation, shared by every store that keeps files (metadata database,
//! WAL segments).

use std::fs::File;
use std::path::Path;

/// `create_dir_all`, with each directory it creates synced into its parent: a file is only as
/// durable as the path to it, and without this a power loss soon after the first start can lose
/// a new directory and everything under it.
pub fn create_dir_durably(dir: &Path) -> std::io::Result<()> {
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.is_dir()).collect();
    if missing.is_empty() {
        return Ok(());
    }
    std::fs::create_dir_all(dir)?;
    for d in missing {
        match d.parent() {
            Some(p) if p.as_os_str().is_empty() => fsync_dir(Path::new("."))?,
            Some(p) => fsync_dir(p)?,
            None => {}
        }
    }
    Ok(())
}

/// Syncs a directory, so the entries created or renamed in it survive a power loss.
pub fn fsync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_every_missing_level_and_leaves_existing_ones() {
        let dir = std::env::temp_dir().join(format!("pico-fs-test-{}", std::process::id()));
        let deep = dir.join("a/b/c");
        create_dir_durably(&deep).unwrap();
        assert!(deep.is_dir());
        // Present already: nothing to create or sync.
        create_dir_durably(&deep).unwrap();
        create_dir_durably(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
