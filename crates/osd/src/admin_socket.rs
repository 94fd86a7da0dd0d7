//! The OSD's admin socket: a Unix socket on its host, readable and
//! writable by its owner only, for what an operator on that host may ask
//! and a network client may not (Ceph's `ceph daemon osd.N …`). A device
//! path named here is opened and overwritten by the OSD: that is why the
//! socket is local and 0600, never a network port.
//!
//! One request per connection: a line of JSON, `{"command": …, …}`, and
//! one line of JSON back, `{"ok": true, …}` or `{"ok": false, "error": …}`
//! (`duplex daemon SOCKET …` speaks it).
//! - `mirror status`: the store's mirror (`duplex_store::mirror::MirrorStatus`);
//! - `mirror replace` `device` (0 or 1), `path`, `bytes_per_sec` (0: no
//!   limit): puts a new device in a failed one's place and fills it in the
//!   background (`duplex_store::mirror::rebuild`).

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use duplex_store::mirror::rebuild::ReplaceOptions;
use duplex_store::mirror::Mirror;
use serde_json::{json, Value};

/// The longest request line read (a path and a few numbers).
const MAX_REQUEST: u64 = 64 << 10;

/// What the socket's commands act on.
pub struct AdminTargets {
    pub mirror: Option<Arc<Mirror>>,
    /// The priority threads' connections (`connections`).
    pub messenger: Option<Arc<crate::io::messenger::Messenger>>,
    /// The priority threads' QoS classes (`qos`), and what says whether
    /// it is on. (Not `Shared`: it holds the flushers' job senders, and a
    /// flusher ends when they all go.)
    pub qos: Option<QosTarget>,
}

pub struct QosTarget {
    /// The flushers' background classes (crate::flusher::device).
    pub device: crate::flusher::device::DeviceSpecs,
    pub views: Arc<crate::io::qos::QosViews>,
    pub map: Arc<crate::cluster::MapCell>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// Binds `path` (a stale socket there from a process before is removed;
/// any other file is not) and answers on a thread of its own.
pub fn serve(path: &Path, targets: AdminTargets) -> std::io::Result<()> {
    if let Ok(existing) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !existing.file_type().is_socket() {
            return Err(std::io::Error::other(format!(
                "{} exists and is not a socket: not removed for the admin socket",
                path.display()
            )));
        }
        std::fs::remove_file(path)?;
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)?;
    }
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    let shown = path.to_path_buf();
    std::thread::Builder::new().name("osd-admin-socket".into()).spawn(move || {
        crate::metrics::alloc_count::uncounted_thread();
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
            let mut line = String::new();
            if BufReader::new((&stream).take(MAX_REQUEST)).read_line(&mut line).is_err() {
                continue;
            }
            let reply = answer(&line, &targets);
            let _ = writeln!(stream, "{reply}");
        }
        tracing::warn!(socket = %shown.display(), "the admin socket stopped accepting");
    })?;
    Ok(())
}

/// The reply to one request line.
pub fn answer(line: &str, targets: &AdminTargets) -> Value {
    match run(line, targets) {
        Ok(mut reply) => {
            reply["ok"] = json!(true);
            reply
        }
        Err(error) => json!({ "ok": false, "error": error }),
    }
}

fn run(line: &str, targets: &AdminTargets) -> Result<Value, String> {
    let request: Value = serde_json::from_str(line.trim()).map_err(|e| format!("not a JSON request: {e}"))?;
    let command = request["command"].as_str().ok_or("the request names no \"command\"")?;
    match command {
        "mirror status" => {
            let mirror = targets.mirror.as_ref().ok_or("this OSD's store is on one device, not a mirror")?;
            let status = serde_json::to_value(mirror.status()).map_err(|e| e.to_string())?;
            Ok(json!({ "mirror": status }))
        }
        "mirror replace" => {
            let mirror = targets.mirror.as_ref().ok_or("this OSD's store is on one device, not a mirror")?;
            let device = request["device"].as_u64().ok_or("\"device\" (0 or 1) is missing")?;
            let path = request["path"].as_str().ok_or("\"path\" (the new device) is missing")?;
            let bytes_per_sec = request["bytes_per_sec"].as_u64().unwrap_or(0);
            let device = usize::try_from(device).map_err(|_| format!("no device {device}"))?;
            let options = ReplaceOptions { bytes_per_sec, faults: None };
            mirror.replace(device, &PathBuf::from(path), options).map_err(|e| e.to_string())?;
            tracing::warn!(device, path, bytes_per_sec, "mirror device replaced by the operator");
            let status = serde_json::to_value(mirror.status()).map_err(|e| e.to_string())?;
            Ok(json!({ "mirror": status }))
        }
        "connections" => {
            let messenger = targets.messenger.as_ref().ok_or("this OSD has no messenger yet")?;
            let policy = format!("{:?}", messenger.policy).to_lowercase();
            let conns = serde_json::to_value(messenger.report()).map_err(|e| e.to_string())?;
            Ok(json!({ "policy": policy, "connections": conns }))
        }
        "qos" => {
            let qos = targets.qos.as_ref().ok_or("this OSD is not serving yet")?;
            let views = qos.views.lock().map_err(|_| "the QoS views lock is poisoned")?.clone();
            let threads: Vec<Value> =
                views.into_iter().map(|(thread, classes)| json!({ "thread": thread, "classes": classes })).collect();
            let metrics = &qos.metrics;
            let background: Vec<Value> = crate::flusher::device::DeviceClass::ALL
                .iter()
                .map(|class| {
                    let (spec, at) = (qos.device.of(*class), *class as usize);
                    json!({
                        "class": class.name(),
                        "queued": metrics.background_queued[at].load(std::sync::atomic::Ordering::Relaxed),
                        "served": metrics.background_served[at].get(),
                        "cost": metrics.background_cost[at].get(),
                        "reservation": spec.reservation(),
                        "weight": spec.weight(),
                        "limit": spec.limit(),
                    })
                })
                .collect();
            Ok(json!({
                "on": crate::io::qos::enabled(&qos.map.load().map),
                "background": background,
                "threads": threads,
                "scheduled_total": qos.metrics.qos_scheduled.get(),
                "held_by_limiter_total": qos.metrics.qos_limited.get(),
            }))
        }
        other => Err(format!(
            "unknown command {other:?} (known: \"mirror status\", \"mirror replace\", \"connections\", \"qos\")"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_requests_are_answered_with_an_error_never_a_panic() {
        let targets = AdminTargets { mirror: None, messenger: None, qos: None };
        for line in ["", "{", "[]", "{\"command\": 3}", "{\"command\": \"nope\"}", "{\"command\": \"mirror status\"}"] {
            let reply = answer(line, &targets);
            assert_eq!(reply["ok"], json!(false), "{line:?}: {reply}");
            assert!(reply["error"].as_str().is_some_and(|e| !e.is_empty()), "{line:?}: {reply}");
        }
    }

    #[test]
    fn the_socket_answers_its_owner_only_and_replaces_a_stale_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("admin.sock");
        serve(&path, AdminTargets { mirror: None, messenger: None, qos: None }).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        // A second daemon on the same path (the first one's socket left behind) takes it over.
        serve(&path, AdminTargets { mirror: None, messenger: None, qos: None }).unwrap();
        let mut stream = std::os::unix::net::UnixStream::connect(&path).unwrap();
        writeln!(stream, "{{\"command\": \"mirror status\"}}").unwrap();
        let mut line = String::new();
        BufReader::new(&stream).read_line(&mut line).unwrap();
        let reply: Value = serde_json::from_str(&line).unwrap();
        assert!(reply["error"].as_str().unwrap().contains("not a mirror"), "{reply}");
        let file = dir.path().join("plain");
        std::fs::write(&file, b"x").unwrap();
        assert!(
            serve(&file, AdminTargets { mirror: None, messenger: None, qos: None }).is_err(),
            "a file that is not a socket is kept"
        );
    }
}
