//! The `duplex-store` binary as an operator uses it: mkfs, info, fsck's JSON
//! report and exit status (0 clean, 1 problems found, 2 could not run).

use std::os::unix::fs::FileExt;
use std::process::Command;

fn tool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_duplex-store"))
}

#[test]
fn mkfs_info_and_fsck_exit_statuses() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store.img");
    let out = tool().args(["mkfs", path.to_str().unwrap(), "--size", "32M", "--partitions", "2"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 partitions"));

    let out = tool().args(["info", path.to_str().unwrap()]).output().unwrap();
    assert!(out.status.success());
    let info: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(info["partitions"].as_array().unwrap().len(), 2);
    assert_eq!(info["format_version"], 2);
    assert_eq!(info["free_chunks"], info["chunks"], "a new store's chunks are all free");
    assert!(info["data_blocks"].as_u64().unwrap() > 7000, "most of 32 MiB holds data: {info}");

    let out = tool().args(["fsck", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["clean"], true);

    // A flipped byte in partition 0's slot bitmap: a slot "in use" that no onode chain owns.
    let superblock =
        duplex_store::Store::open(&path, &duplex_store::StoreConfig { read_only: true, ..Default::default() })
            .unwrap()
            .superblock()
            .clone();
    let slot_bitmap = superblock.partitions[0].slot_bitmap.start * 4096;
    let file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.write_all_at(&[0x01], slot_bitmap).unwrap();
    drop(file);
    let out = tool().args(["fsck", path.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["clean"], false);
    assert!(report["partitions"][0]["issues"]
        .as_array()
        .unwrap()
        .iter()
        .any(|i| i["kind"] == "onode_corrupt" || i["kind"] == "slot_leaked"));

    // Not a store at all: fsck cannot run.
    let junk = dir.path().join("junk.img");
    std::fs::write(&junk, vec![0u8; 1 << 20]).unwrap();
    let out = tool().args(["fsck", junk.to_str().unwrap()]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("mkfs"), "the error says what to do");
}

#[test]
fn bad_arguments_get_a_clear_error() {
    let out = tool().args(["mkfs", "/nonexistent-dir/x.img", "--size", "12Q"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not a size"));
}

#[test]
fn bench_refuses_to_format_a_special_file_without_keep() {
    // /dev/null stands in for a device: the bench must neither size nor unlink it.
    let out = tool().args(["bench", "--smoke", "--path", "/dev/null"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
    assert!(std::path::Path::new("/dev/null").exists());
}
