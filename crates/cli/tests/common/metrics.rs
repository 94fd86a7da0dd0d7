//! The OSDs of a `dev up` cluster and their metrics pages.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

pub struct Osd {
    /// `osd.N`.
    pub name: String,
    pub pid: u32,
    pub admin: SocketAddr,
}

/// The OSDs of a `dev up` cluster: pids from `state.json`, admin (metrics)
/// addresses from the line each logs when it starts serving.
pub fn osds(dir: &Path) -> Vec<Osd> {
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("state.json")).expect("state.json")).expect("json");
    let processes = state["processes"].as_array().expect("processes");
    processes
        .iter()
        .filter_map(|process| {
            let name = process["name"].as_str()?;
            name.starts_with("osd.").then(|| {
                let pid = process["pid"].as_u64().expect("pid") as u32;
                let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).expect("OSD log");
                // The line it prints when it serves: "... serving on ADDR admin ADDR ...".
                let admin = log
                    .lines()
                    .find(|line| line.contains(" serving on "))
                    .unwrap_or_default()
                    .split_whitespace()
                    .skip_while(|word| *word != "admin")
                    .nth(1)
                    .and_then(|addr| addr.parse().ok())
                    .unwrap_or_else(|| panic!("{name} logged no admin address:\n{log}"));
                Osd { name: name.to_string(), pid, admin }
            })
        })
        .collect()
}

/// One OSD's metrics page, by metric name with its labels.
pub fn scrape(admin: SocketAddr) -> HashMap<String, f64> {
    let mut stream = TcpStream::connect_timeout(&admin, Duration::from_secs(5)).expect("metrics endpoint");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").expect("request");
    let mut page = String::new();
    stream.read_to_string(&mut page).expect("metrics page");
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (name, value) = line.rsplit_once(' ')?;
            Some((name.to_string(), value.parse().ok()?))
        })
        .collect()
}
