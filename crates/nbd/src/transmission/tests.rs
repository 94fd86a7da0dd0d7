use std::io::Cursor;
use std::sync::mpsc;

use proptest::prelude::*;

use super::*;
use crate::memory::MemoryExport;

const SIZE: u64 = 1 << 20;

fn request(command: u16, flags: u16, offset: u64, length: u32) -> Request {
    Request { flags, command, handle: 1, offset, length }
}

fn planned(command: u16, flags: u16, offset: u64, length: u32) -> Plan {
    plan(&request(command, flags, offset, length), SIZE, false)
}

#[test]
fn valid_commands_are_planned() {
    assert_eq!(planned(CMD_READ, 0, 0, 4096), Plan::Read { offset: 0, length: 4096 });
    assert_eq!(planned(CMD_READ, CMD_FLAG_FUA, SIZE - 1, 1), Plan::Read { offset: SIZE - 1, length: 1 });
    assert_eq!(planned(CMD_WRITE, CMD_FLAG_FUA, 512, 512), Plan::Write { offset: 512, length: 512, fua: true });
    assert_eq!(planned(CMD_FLUSH, 0, 0, 0), Plan::Flush);
    assert_eq!(planned(CMD_TRIM, 0, 0, SIZE as u32), Plan::Trim { offset: 0, length: SIZE as u32, fua: false });
    assert_eq!(
        planned(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 8, 8),
        Plan::WriteZeroes { offset: 8, length: 8, fua: false, may_trim: false }
    );
    assert_eq!(
        planned(CMD_WRITE_ZEROES, 0, 8, 8),
        Plan::WriteZeroes { offset: 8, length: 8, fua: false, may_trim: true }
    );
    assert_eq!(planned(CMD_CACHE, 0, 0, 4096), Plan::Succeed { payload_len: 0 });
    assert_eq!(planned(CMD_DISC, 0, 0, 0), Plan::Disconnect);
}

#[test]
fn zero_lengths_succeed_without_the_export() {
    for command in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES] {
        assert_eq!(planned(command, 0, SIZE, 0), Plan::Succeed { payload_len: 0 }, "command {command}");
    }
}

#[test]
fn out_of_range_requests_get_the_spec_errors() {
    let inval = Plan::Reject { errno: Errno::Inval, payload_len: 0 };
    assert_eq!(planned(CMD_READ, 0, SIZE - 1, 2), inval);
    assert_eq!(planned(CMD_READ, 0, u64::MAX, 1), inval);
    assert_eq!(planned(CMD_READ, 0, 0, BLOCK_SIZE_MAX + 1), inval);
    assert_eq!(planned(CMD_TRIM, 0, SIZE, 1), inval);
    assert_eq!(planned(CMD_CACHE, 0, SIZE, 1), inval);
    assert_eq!(planned(CMD_WRITE, 0, SIZE, 1), Plan::Reject { errno: Errno::NoSpc, payload_len: 1 });
    assert_eq!(planned(CMD_WRITE, 0, u64::MAX, 4), Plan::Reject { errno: Errno::NoSpc, payload_len: 4 });
    assert_eq!(planned(CMD_WRITE_ZEROES, 0, SIZE - 1, 2), Plan::Reject { errno: Errno::NoSpc, payload_len: 0 });
}

#[test]
fn bad_flags_and_unknown_commands_get_einval() {
    let inval = Plan::Reject { errno: Errno::Inval, payload_len: 0 };
    assert_eq!(planned(CMD_READ, CMD_FLAG_DF, 0, 1), inval);
    assert_eq!(planned(CMD_READ, CMD_FLAG_NO_HOLE, 0, 1), inval);
    assert_eq!(planned(CMD_FLUSH, 1 << 15, 0, 0), inval);
    assert_eq!(planned(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 1), inval);
    assert_eq!(planned(CMD_TRIM, CMD_FLAG_REQ_ONE, 0, 1), inval);
    assert_eq!(planned(CMD_WRITE, CMD_FLAG_NO_HOLE, 0, 9), Plan::Reject { errno: Errno::Inval, payload_len: 9 });
    assert_eq!(planned(CMD_BLOCK_STATUS, 0, 0, 1), inval);
    assert_eq!(planned(CMD_RESIZE, 0, 0, 0), inval);
    assert_eq!(planned(0xBEEF, 0, 0, 1), inval);
}

#[test]
fn read_only_exports_refuse_every_write() {
    let perm = |payload_len| Plan::Reject { errno: Errno::Perm, payload_len };
    assert_eq!(plan(&request(CMD_WRITE, 0, 0, 4), SIZE, true), perm(4));
    assert_eq!(plan(&request(CMD_TRIM, 0, 0, 4), SIZE, true), perm(0));
    assert_eq!(plan(&request(CMD_WRITE_ZEROES, 0, 0, 4), SIZE, true), perm(0));
    assert_eq!(plan(&request(CMD_READ, 0, 0, 4), SIZE, true), Plan::Read { offset: 0, length: 4 });
}

#[test]
fn oversize_write_payload_hangs_up() {
    let big = u64::from(BLOCK_SIZE_MAX) * 2;
    // Even when read-only or out of range: the payload would have to be consumed.
    assert!(matches!(plan(&request(CMD_WRITE, 0, 0, BLOCK_SIZE_MAX + 1), big, false), Plan::Hangup(_)));
    assert!(matches!(plan(&request(CMD_WRITE, 0, big, u32::MAX), big, true), Plan::Hangup(_)));
    let largest = plan(&request(CMD_WRITE, 0, 0, BLOCK_SIZE_MAX), big, false);
    assert_eq!(largest, Plan::Write { offset: 0, length: BLOCK_SIZE_MAX, fua: false });
}

type Replies = Vec<(u64, Result<Bytes, Errno>)>;

/// Runs `input` through `serve_requests` against `export`; returns the
/// ending and the replies as (handle, result).
fn serve(input: Vec<u8>, export: Arc<dyn Export>) -> (Result<Ending, TransmissionError>, Replies) {
    let gate = InFlightGate::new(64, 64 << 20);
    let (sender, receiver) = mpsc::channel();
    let ending = serve_requests(&mut Cursor::new(input), &export, false, &gate, &sender);
    drop(sender);
    let replies = receiver
        .into_iter()
        .map(|outgoing| match outgoing {
            Outgoing::Reply(reply) => (reply.handle, reply.result),
            Outgoing::Stop => panic!("the reader never sends Stop itself"),
        })
        .collect();
    (ending, replies)
}

fn wire(request: Request, payload: &[u8]) -> Vec<u8> {
    let mut bytes = encode_request(&request).to_vec();
    bytes.extend_from_slice(payload);
    bytes
}

#[test]
fn commands_reach_the_export_and_replies_carry_handles() {
    let memory = Arc::new(MemoryExport::new(SIZE as usize));
    let mut input =
        wire(Request { flags: CMD_FLAG_FUA, command: CMD_WRITE, handle: 10, offset: 3, length: 4 }, b"data");
    input.extend(wire(Request { flags: 0, command: CMD_READ, handle: 11, offset: 2, length: 6 }, &[]));
    input.extend(wire(Request { flags: CMD_FLAG_FUA, command: CMD_TRIM, handle: 12, offset: 4, length: 1 }, &[]));
    // A rejected write's payload is skipped, so the next request still decodes.
    input.extend(wire(Request { flags: 0, command: CMD_WRITE, handle: 13, offset: SIZE, length: 3 }, b"xyz"));
    input.extend(wire(Request { flags: 0, command: CMD_READ, handle: 14, offset: 3, length: 4 }, &[]));
    input.extend(wire(Request { flags: 0, command: CMD_DISC, handle: 15, offset: 0, length: 0 }, &[]));
    input.extend(wire(Request { flags: 0, command: CMD_READ, handle: 16, offset: 0, length: 1 }, &[]));
    let (ending, replies) = serve(input, memory.clone());
    assert_eq!(ending.unwrap(), Ending::Disconnect);
    assert_eq!(
        replies,
        vec![
            (10, Ok(Bytes::new())),
            (11, Ok(Bytes::from_static(b"\0data\0"))),
            (12, Ok(Bytes::new())),
            (13, Err(Errno::NoSpc)),
            (14, Ok(Bytes::from_static(b"d\0ta"))),
        ]
    );
    let stats = memory.stats();
    assert_eq!((stats.fua_writes, stats.trims, stats.flushes), (1, 1, 1), "FUA trim is followed by a flush");
}

#[test]
fn end_of_stream_is_clean_only_between_requests() {
    let memory: Arc<dyn Export> = Arc::new(MemoryExport::new(4096));
    let (ending, replies) = serve(Vec::new(), memory.clone());
    assert_eq!(ending.unwrap(), Ending::EndOfStream);
    assert!(replies.is_empty());

    let mut truncated = wire(request(CMD_READ, 0, 0, 1), &[]);
    truncated.pop();
    assert!(matches!(serve(truncated, memory.clone()).0, Err(TransmissionError::Io(_))));

    let short_payload = wire(request(CMD_WRITE, 0, 0, 8), b"abc");
    let (ending, replies) = serve(short_payload, memory.clone());
    assert!(matches!(ending, Err(TransmissionError::Io(_))));
    assert!(replies.is_empty(), "no reply for a write whose payload never arrived");

    let mut bad_magic = wire(request(CMD_READ, 0, 0, 1), &[]);
    bad_magic[0] ^= 0xFF;
    assert!(matches!(serve(bad_magic, memory).0, Err(TransmissionError::Protocol(_))));
}

/// An export that breaks the contract: drops every Done, or reads short.
struct Broken;

impl Export for Broken {
    fn size(&self) -> u64 {
        SIZE
    }
    fn read(&self, _offset: u64, len: u32, done: Done<Bytes>) {
        done(Ok(Bytes::from(vec![0; len as usize - 1])));
    }
    fn write(&self, _offset: u64, _data: Bytes, _fua: bool, done: Done<()>) {
        drop(done);
    }
    fn flush(&self, done: Done<()>) {
        drop(done);
    }
    fn trim(&self, _offset: u64, _len: u32, _done: Done<()>) {}
    fn write_zeroes(&self, _offset: u64, _len: u32, _may_trim: bool, _done: Done<()>) {}
}

#[test]
fn contract_breaking_exports_get_eio_not_a_hang() {
    let mut input = wire(Request { flags: 0, command: CMD_READ, handle: 1, offset: 0, length: 8 }, &[]);
    input.extend(wire(Request { flags: 0, command: CMD_WRITE, handle: 2, offset: 0, length: 2 }, b"ab"));
    input.extend(wire(Request { flags: 0, command: CMD_FLUSH, handle: 3, offset: 0, length: 0 }, &[]));
    input.extend(wire(Request { flags: 0, command: CMD_TRIM, handle: 4, offset: 0, length: 1 }, &[]));
    let (ending, replies) = serve(input, Arc::new(Broken));
    assert_eq!(ending.unwrap(), Ending::EndOfStream);
    let expected: Vec<_> = (1..=4).map(|handle| (handle, Err(Errno::Io))).collect();
    assert_eq!(replies, expected);
}

proptest! {
    #[test]
    fn plan_never_panics_and_respects_limits(
        flags in any::<u16>(), command in 0u16..12, offset in any::<u64>(), length in any::<u32>(),
        size in any::<u64>(), read_only in any::<bool>(),
    ) {
        let planned = plan(&Request { flags, command, handle: 0, offset, length }, size, read_only);
        match planned {
            Plan::Read { .. } | Plan::Write { .. } => {
                prop_assert!(length <= BLOCK_SIZE_MAX && length > 0);
                prop_assert!(offset + u64::from(length) <= size);
            }
            Plan::Trim { .. } | Plan::WriteZeroes { .. } => {
                prop_assert!(!read_only && length > 0 && offset + u64::from(length) <= size);
            }
            Plan::Reject { payload_len, .. } | Plan::Succeed { payload_len } => {
                prop_assert!(payload_len == 0 || (command == CMD_WRITE && payload_len <= BLOCK_SIZE_MAX));
            }
            Plan::Flush | Plan::Disconnect | Plan::Hangup(_) => {}
        }
    }

    #[test]
    fn arbitrary_well_framed_requests_never_panic(
        requests in proptest::collection::vec(
            (any::<u16>(), 0u16..10, 0u64..6000, prop_oneof![0u32..6000, any::<u32>()], 0usize..64),
            0..16,
        )
    ) {
        let mut input = Vec::new();
        for (handle, (flags, command, offset, length, payload_len)) in requests.iter().enumerate() {
            let request = Request { flags: *flags, command: *command, handle: handle as u64, offset: *offset, length: *length };
            input.extend_from_slice(&encode_request(&request));
            // Usually the right payload for a write, sometimes a lie.
            let payload = if *command == CMD_WRITE && *length < 6000 && payload_len % 4 != 0 { *length as usize } else { *payload_len };
            input.extend(std::iter::repeat_n(0xA5u8, payload));
        }
        let memory: Arc<dyn Export> = Arc::new(MemoryExport::new(4096));
        let (_, replies) = serve(input, memory);
        let mut handles: Vec<u64> = replies.iter().map(|reply| reply.0).collect();
        handles.sort_unstable();
        handles.dedup();
        prop_assert_eq!(handles.len(), replies.len(), "one reply per request");
        prop_assert!(replies.len() <= requests.len());
    }

    #[test]
    fn arbitrary_request_streams_never_panic(input in proptest::collection::vec(any::<u8>(), 0..256)) {
        let memory: Arc<dyn Export> = Arc::new(MemoryExport::new(4096));
        let _ = serve(input, memory);
    }
}
