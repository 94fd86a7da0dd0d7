//! Real NBD clients against `duplex nbd serve` on a `duplex dev up`
//! cluster: qemu-io, nbdcopy, nbdinfo, qemu-img and fio.

mod common;

use std::process::Command;

use common::{require_tool, run_ok, DevCluster};

const MIB: u64 = 1 << 20;

fn qemu_io(uri: &str, format: &str, commands: &[String]) -> String {
    let mut command = Command::new("qemu-io");
    command.args(["-f", format]);
    for c in commands {
        command.arg("-c").arg(c);
    }
    command.arg(uri);
    let output = run_ok(&mut command);
    let text = String::from_utf8_lossy(&output.stdout).into_owned() + &String::from_utf8_lossy(&output.stderr);
    assert!(!text.contains("failed") && !text.contains("error"), "qemu-io {commands:?} reported a problem:\n{text}");
    text
}

#[test]
fn real_nbd_clients_read_back_what_they_wrote() {
    for tool in ["qemu-io", "qemu-img", "nbdinfo", "nbdcopy", "fio"] {
        require_tool(tool);
    }
    let cluster = DevCluster::start();
    run_ok(cluster.cli().args(["image", "create", "disk", "--size", "64M"]));
    let server = cluster.serve("disk", None);
    let uri = server.uri.clone();

    // nbdinfo: the size and the export list.
    let size = run_ok(Command::new("nbdinfo").arg("--size").arg(&uri));
    assert_eq!(String::from_utf8_lossy(&size.stdout).trim(), (64 * MIB).to_string());
    let base = uri.rsplit_once('/').map(|(base, _)| base.to_string()).expect("uri has an export name");
    let list = run_ok(Command::new("nbdinfo").arg("--list").arg(format!("{base}/")));
    assert!(String::from_utf8_lossy(&list.stdout).contains("disk"), "nbdinfo --list does not show 'disk'");

    // qemu-io: patterns at assorted offsets and sizes, several across the 4 MiB object boundaries.
    let cases: &[(u64, u64, u8)] = &[
        (0, 512, 0x11),
        (4096, 4096, 0x22),
        (4 * MIB - 512, 1024, 0x33),
        (8 * MIB - 4096, 3 * 4096, 0x44),
        (12 * MIB - 100_000, 9 * MIB, 0x55),
        (60 * MIB, 4 * MIB, 0x66),
        (33 * MIB + 17 * 512, 64 * 1024, 0x77),
    ];
    let writes: Vec<String> = cases.iter().map(|(o, l, p)| format!("write -P {p:#x} {o} {l}")).collect();
    qemu_io(&uri, "raw", &writes);
    let reads: Vec<String> = cases.iter().map(|(o, l, p)| format!("read -P {p:#x} {o} {l}")).collect();
    let out = qemu_io(&uri, "raw", &reads);
    assert_eq!(out.matches("read ").count(), cases.len(), "every read ran:\n{out}");
    // Never-written space reads as zeros; write-zeroes and discard make it so.
    qemu_io(&uri, "raw", &[format!("read -P 0 {} {}", 40 * MIB, MIB)]);
    qemu_io(
        &uri,
        "raw",
        &[
            format!("write -z {} {}", 4 * MIB - 512, 1024),
            format!("read -P 0 {} {}", 4 * MIB - 512, 1024),
            format!("discard {} {}", 60 * MIB, 4 * MIB),
            format!("read -P 0 {} {}", 60 * MIB, 4 * MIB),
            format!("read -P 0x44 {} {}", 8 * MIB - 4096, 3 * 4096),
        ],
    );

    // nbdcopy a 64 MiB random file in and back out.
    let scratch = tempfile::tempdir().expect("temp dir");
    let input = scratch.path().join("in.bin");
    let output = scratch.path().join("out.bin");
    let data: Vec<u8> = (0..64 * MIB).map(|_| rand::random::<u8>()).collect();
    std::fs::write(&input, &data).expect("write input");
    run_ok(Command::new("nbdcopy").arg(&input).arg(&uri));
    run_ok(Command::new("nbdcopy").arg(&uri).arg(&output));
    let copied = std::fs::read(&output).expect("read output");
    assert_eq!(copied.len(), data.len());
    assert!(copied == data, "the copy out differs from the file copied in");

    // qemu-img: a qcow2 overlay on the export, used for I/O.
    let overlay = scratch.path().join("overlay.qcow2");
    run_ok(Command::new("qemu-img").args(["create", "-f", "qcow2", "-F", "raw", "-b"]).arg(&uri).arg(&overlay));
    let info = run_ok(Command::new("qemu-img").arg("info").arg(&overlay));
    assert!(String::from_utf8_lossy(&info.stdout).contains("virtual size: 64 MiB"), "qemu-img info: wrong size");
    let overlay_path = overlay.to_string_lossy().into_owned();
    qemu_io(
        &overlay_path,
        "qcow2",
        &[format!("write -P 0x5a {} {}", MIB, 64 * 1024), format!("read -P 0x5a {} {}", MIB, 64 * 1024)],
    );
    // Through the overlay: the export's data, with the overlay's own write on top.
    let flat = scratch.path().join("flat.raw");
    run_ok(Command::new("qemu-img").args(["convert", "-f", "qcow2", "-O", "raw"]).arg(&overlay).arg(&flat));
    let mut expected = data.clone();
    expected[MIB as usize..MIB as usize + 65536].fill(0x5a);
    assert!(std::fs::read(&flat).expect("flat image") == expected, "the overlay reads the export's data under its own");
    // ... and the export itself is unchanged where the overlay was written.
    let base = run_ok(Command::new("nbdcopy").arg(&uri).arg("-"));
    assert!(base.stdout == data, "writes to the overlay left the export alone");

    // fio's nbd engine: random writes, verified with crc32c.
    let fio = run_ok(
        Command::new("fio")
            .args(["--name=verify", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--size=32M", "--iodepth=16"])
            .args(["--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--direct=1", "--verify_state_save=0"])
            .arg(format!("--uri={uri}")),
    );
    let report = String::from_utf8_lossy(&fio.stdout);
    assert!(report.contains("err= 0"), "fio reported errors:\n{report}");
    assert!(!report.contains("verify: bad"), "fio verification failed:\n{report}");
}

#[test]
fn several_connections_write_disjoint_ranges() {
    for tool in ["qemu-io", "nbdinfo"] {
        require_tool(tool);
    }
    // Two PGs: the four writers fill the PG logs, on the primaries and the replicas.
    let cluster = DevCluster::with_pgs(2);
    run_ok(cluster.cli().args(["image", "create", "shared", "--size", "32M", "--object-size", "1M"]));
    let socket_dir = tempfile::tempdir().expect("temp dir");
    let socket = socket_dir.path().join("nbd.sock");
    let server = cluster.serve("shared", Some(&socket));
    assert!(server.uri.starts_with("nbd+unix://"), "{}", server.uri);
    let size = run_ok(Command::new("nbdinfo").arg("--size").arg(&server.uri));
    assert_eq!(String::from_utf8_lossy(&size.stdout).trim(), (32 * MIB).to_string());

    // Four connections at once, each writing its own 8 MiB in 64 KiB pieces.
    let writers: Vec<_> = (0..4u64)
        .map(|n| {
            let mut command = Command::new("qemu-io");
            command.args(["-f", "raw"]);
            for piece in 0..128u64 {
                let offset = n * 8 * MIB + piece * 65536;
                command.arg("-c").arg(format!("aio_write -P {:#x} {offset} 65536", 0x10 + n));
            }
            command.arg("-c").arg("aio_flush").arg(&server.uri);
            command.spawn().expect("qemu-io starts")
        })
        .collect();
    for mut writer in writers {
        assert!(writer.wait().expect("qemu-io ends").success(), "a writer failed");
    }
    let reads: Vec<String> =
        (0..4u64).map(|n| format!("read -P {:#x} {} {}", 0x10 + n, n * 8 * MIB, 8 * MIB)).collect();
    qemu_io(&server.uri, "raw", &reads);
}
