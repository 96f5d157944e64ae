//! What the corpus tests share: the files of `tests/corpus/` and their names.

use std::path::{Path, PathBuf};

/// Every `ok_*`, `salvage_*` and `err_*` file of `tests/corpus/`, sorted.
pub fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|p| {
            let name = file_name(p);
            ["ok_", "salvage_", "err_"]
                .iter()
                .any(|prefix| name.starts_with(prefix))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 15, "corpus has only {} files", files.len());
    files
}

pub fn file_name(path: &Path) -> &str {
    path.file_name().unwrap().to_str().unwrap()
}
