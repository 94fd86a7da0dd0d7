//! The authenticated blocking connection to an OSD. It is the monitor
//! client's connection type: the same frames, the same handshake (fsid,
//! version, HMAC mutual authentication); only the messages differ.

pub use duplex_mon::wire::Connection as OsdConnection;
