//! # duplex-osd: the OSD
//!
//! Being built in issue 4. So far, [`replay`]: bringing a PG's operation log
//! into the object store at start, before the OSD serves.

pub mod replay;
