//! The image ships a stripped binary (issue 37): the Dockerfile runs `deploy/split-debug` on
//! the binary it copies, and that script leaves a binary without debug information or symbol
//! table that still runs, and beside it a `.debug` file with the line tables, linked by name.

use std::path::Path;
use std::process::Command;

/// The section names of an ELF file, as `readelf` lists them.
fn sections(file: &Path) -> Vec<String> {
    let out = Command::new("readelf")
        .args(["--wide", "--section-headers"])
        .arg(file)
        .output()
        .expect("readelf (binutils)");
    assert!(out.status.success(), "{out:?}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let (_, rest) = l.split_once(']')?;
            rest.split_whitespace().next().map(str::to_owned)
        })
        .collect()
}

#[test]
fn the_shipped_binary_is_stripped_and_its_debug_information_kept_beside() {
    let root = env!("CARGO_MANIFEST_DIR");
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("envlens");
    std::fs::copy(env!("CARGO_BIN_EXE_envlens"), &bin).unwrap();
    let before = std::fs::metadata(&bin).unwrap().len();
    assert!(sections(&bin).iter().any(|s| s == ".debug_line"));

    let split = Command::new(format!("{root}/deploy/split-debug"))
        .arg(&bin)
        .output()
        .unwrap();
    assert!(split.status.success(), "{split:?}");

    let stripped = sections(&bin);
    // (`.debug_gdb_scripts` is loaded with the program: gdb's pretty-printers, not debug
    // information.)
    let dwarf = |s: &String| s.starts_with(".debug_") && s != ".debug_gdb_scripts";
    assert!(
        !stripped.iter().any(|s| dwarf(s) || s == ".symtab"),
        "{stripped:?}"
    );
    assert!(
        stripped.iter().any(|s| s == ".gnu_debuglink"),
        "{stripped:?}"
    );
    let debug = dir.path().join("envlens.debug");
    assert!(sections(&debug).iter().any(|s| s == ".debug_line"));
    let after = std::fs::metadata(&bin).unwrap().len();
    assert!(after * 2 < before, "{before} -> {after} bytes");
    // It still runs.
    let version = Command::new(&bin).arg("--version").output().unwrap();
    assert!(version.status.success(), "{version:?}");
    assert!(String::from_utf8_lossy(&version.stdout).starts_with("envlens "));

    // And it is what the image copies: split in the build stage, the debug file a stage of
    // its own, the final stage the binary alone.
    let dockerfile = std::fs::read_to_string(format!("{root}/Dockerfile")).unwrap();
    assert!(dockerfile.contains("deploy/split-debug target/release/envlens"));
    let last = dockerfile.rsplit("\nFROM ").next().unwrap();
    assert!(last.contains("COPY --from=build /src/target/release/envlens /usr/local/bin/envlens"));
    assert!(!last.contains("envlens.debug"), "{last}");
}
