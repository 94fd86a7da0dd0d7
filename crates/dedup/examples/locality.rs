//! The dissertation's table 2.1 on Duplex's placement: local (per-OSD)
//! against global dedup at 4, 8, 12 and 16 OSDs, as space saved (the
//! table's measure: 1 - stored / written) and as a ratio.
//!
//! `cargo run --release -p duplex-dedup --example locality [objects]`

use duplex_dedup::locality::DataSet;

fn table(title: &str, data: &DataSet) {
    let global = data.global_ratio();
    println!("{title}: {} chunks, global (ideal) ratio {global:.3}\n", data.chunks());
    println!("| OSDs | local: space saved | global: space saved | local ratio | global ratio |");
    println!("| --- | --- | --- | --- | --- |");
    for osds in [4, 8, 12, 16] {
        let local = data.local_ratio(osds, 128 * osds);
        let saved = |ratio: f64| 100.0 * (1.0 - 1.0 / ratio);
        println!("| {osds} | {:.1} % | {:.1} % | {local:.3} | {global:.3} |", saved(local), saved(global));
    }
    println!();
}

fn main() {
    let objects: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).unwrap_or(20_000);
    // 4 MiB objects of 32 KiB chunks.
    let chunks = 128;
    table(
        &format!("{objects} objects, half of their chunks copies of earlier ones (fio's dedupe_percentage=50)"),
        &DataSet::copies(objects, chunks, 0.5, 42),
    );
    let common = (objects * chunks / 10) as u64;
    table(
        &format!("{objects} objects, 60 % of their chunks drawn from {common} common contents (VMs sharing an OS)"),
        &DataSet::synthetic(objects, chunks, 0.6, common, 42),
    );
}
