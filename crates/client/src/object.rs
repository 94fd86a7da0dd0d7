//! A minimal synchronous client, one operation at a time, for tests and
//! tools that want to see each step: client-side placement and the
//! retries an operator expects (a newer map on `WrongOsd`, a pause on
//! `Retry`, a reconnect on a broken connection), all within one deadline
//! per operation, resending with the same request id. Applications use
//! [`crate::Client`], which pipelines.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use duplex_map::{ClusterMap, OsdId};
use duplex_mon_client::Credentials;
use duplex_mon_client::MonClient;
use duplex_placement::Hierarchy;
use duplex_proto::osd::{OpKind, OpReply, OpRequest};
use duplex_proto::MessageType;

use duplex_mon_client::Connection as OsdConnection;

use crate::error::ClientError;
use crate::placement::{self, Deadline, Next, RetryPolicy};

/// The pause before each retry (a map fetch follows it).
const RETRY: RetryPolicy = RetryPolicy::ONE_AT_A_TIME;

pub struct ObjectClient {
    monitors: Vec<(u64, SocketAddr)>,
    credentials: Credentials,
    map: ClusterMap,
    hierarchy: Hierarchy,
    conns: HashMap<OsdId, OsdConnection>,
    next_txid: u64,
    client_id: u64,
    /// How long one operation may keep retrying.
    pub timeout: Duration,
}

impl ObjectClient {
    /// Fetches the map from the monitors.
    pub fn connect(monitors: Vec<(u64, SocketAddr)>, credentials: Credentials) -> Result<ObjectClient, ClientError> {
        let map = fetch_map(&monitors, &credentials, 0)
            .ok_or_else(|| ClientError::Unavailable("no monitor returned a map".into()))?;
        let hierarchy = map.hierarchy();
        Ok(ObjectClient {
            monitors,
            credentials,
            map,
            hierarchy,
            conns: HashMap::new(),
            next_txid: 1,
            client_id: rand::random::<u64>() | 1,
            timeout: Duration::from_secs(30),
        })
    }

    pub fn map(&self) -> &ClusterMap {
        &self.map
    }

    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// Fetches the newest map the monitors have.
    pub fn refresh_map(&mut self) -> bool {
        match fetch_map(&self.monitors, &self.credentials, self.map.epoch) {
            Some(map) if map.epoch > self.map.epoch => {
                self.hierarchy = map.hierarchy();
                self.map = map;
                true
            }
            _ => false,
        }
    }

    pub fn pool_id(&self, name: &str) -> Result<u32, ClientError> {
        self.map.pool_by_name(name).map(|p| p.id).ok_or_else(|| ClientError::NoSuchPool(name.into()))
    }

    /// The PG of `object` in `pool` and its primary (if any OSD of it is up).
    pub fn locate(&self, pool: u32, object: &[u8]) -> Option<(u32, Option<OsdId>)> {
        let target = placement::locate(&self.map, &self.hierarchy, pool, object).ok()?;
        Some((target.pg, target.primary))
    }

    pub fn addr_of(&self, osd: OsdId) -> Option<SocketAddr> {
        self.map.osds.get(&osd).and_then(|o| o.addr.parse().ok())
    }

    pub fn write(&mut self, pool: u32, object: &[u8], offset: u64, data: &[u8]) -> Result<(), ClientError> {
        self.execute(pool, OpKind::Write, object, offset, 0, Bytes::copy_from_slice(data)).map(|_| ())
    }

    /// Up to `len` bytes from `offset` (fewer past the object's end).
    pub fn read(&mut self, pool: u32, object: &[u8], offset: u64, len: u32) -> Result<Bytes, ClientError> {
        self.execute(pool, OpKind::Read, object, offset, len, Bytes::new())
    }

    pub fn truncate(&mut self, pool: u32, object: &[u8], size: u64) -> Result<(), ClientError> {
        self.execute(pool, OpKind::Truncate, object, size, 0, Bytes::new()).map(|_| ())
    }

    /// Makes bytes `[offset, offset + len)` read as zeros.
    pub fn zero(&mut self, pool: u32, object: &[u8], offset: u64, len: u64) -> Result<(), ClientError> {
        let data = Bytes::copy_from_slice(&len.to_le_bytes());
        self.execute(pool, OpKind::Zero, object, offset, 8, data).map(|_| ())
    }

    pub fn delete(&mut self, pool: u32, object: &[u8]) -> Result<(), ClientError> {
        self.execute(pool, OpKind::Delete, object, 0, 0, Bytes::new()).map(|_| ())
    }

    fn execute(
        &mut self,
        pool: u32,
        kind: OpKind,
        object: &[u8],
        offset: u64,
        length: u32,
        data: Bytes,
    ) -> Result<Bytes, ClientError> {
        let deadline = Deadline::after(self.timeout);
        let mut last = String::from("no attempt");
        let mut attempts = 0;
        // One request id for every attempt: the OSD answers a resend of a
        // mutation it already applied without applying it again.
        let txid = self.next_txid;
        self.next_txid += 1;
        while !deadline.passed(Instant::now()) {
            let Ok(target) = placement::locate(&self.map, &self.hierarchy, pool, object) else {
                if !self.refresh_map() {
                    return Err(ClientError::NoSuchPool(pool.to_string()));
                }
                continue;
            };
            let next = match target.primary_or_wait() {
                Err(next) => next,
                Ok(primary) => {
                    let request = target.request(
                        kind,
                        Bytes::copy_from_slice(object),
                        offset,
                        length,
                        data.clone(),
                        self.client_id,
                    );
                    attempts += 1;
                    match self.call(primary, &request, txid) {
                        Ok(reply) => placement::judge(primary, reply, self.map.epoch),
                        Err(err) => {
                            self.conns.remove(&primary);
                            Next::Retry(placement::at_osd(primary, err))
                        }
                    }
                }
            };
            // Whether to retry or to wait for a newer map, this client
            // pauses and then asks the monitors for the newest map.
            match next {
                Next::Done(result) => return result,
                Next::Retry(problem) | Next::AwaitMap { problem, .. } => {
                    last = problem;
                    std::thread::sleep(RETRY.backoff(attempts));
                    self.refresh_map();
                }
            }
        }
        Err(deadline.timed_out(last))
    }

    fn call(&mut self, osd: OsdId, request: &OpRequest, txid: u64) -> std::io::Result<OpReply> {
        if !self.conns.contains_key(&osd) {
            let addr = self.addr_of(osd).ok_or_else(|| std::io::Error::other("no address in the map"))?;
            let conn = OsdConnection::connect(addr, &self.credentials, Duration::from_secs(5))?;
            self.conns.insert(osd, conn);
        }
        let conn = self.conns.get_mut(&osd).expect("inserted above");
        conn.send(&request.to_frame(txid))?;
        let frame = conn.recv()?;
        if frame.header.message_type != MessageType::OsdOpReply as u8 || frame.header.transaction_id != txid {
            return Err(std::io::Error::other("reply out of order or of the wrong type"));
        }
        OpReply::decode(&frame.payload).map_err(std::io::Error::other)
    }
}

/// The newest map any monitor has, if newer than `than` (or any, for 0).
fn fetch_map(monitors: &[(u64, SocketAddr)], credentials: &Credentials, than: u64) -> Option<ClusterMap> {
    let client = MonClient::new(monitors.to_vec(), credentials.clone());
    let mut best: Option<ClusterMap> = None;
    for (id, _) in monitors {
        if let Ok(map) = client.map(*id) {
            if best.as_ref().is_none_or(|b| map.epoch > b.epoch) {
                best = Some(map);
            }
        }
    }
    best.filter(|m| than == 0 || m.epoch >= than)
}
