use std::io::Cursor;

use proptest::prelude::*;

use super::*;
use crate::memory::MemoryExport;
use crate::ExportMap;

const DISK_BYTES: u64 = 1 << 20;
const FIXED: u32 = FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES;

fn exports() -> ExportMap {
    let disk: Arc<dyn Export> = Arc::new(MemoryExport::new(DISK_BYTES as usize));
    let read_only: Arc<dyn Export> = Arc::new(MemoryExport::new(4096).with_read_only(true));
    ExportMap::new().with_description("disk", disk, "test disk").with("ro", read_only).with_default("disk")
}

fn client(flags: u32, options: &[(u32, Vec<u8>)]) -> Vec<u8> {
    let mut bytes = flags.to_be_bytes().to_vec();
    for (option, data) in options {
        bytes.extend_from_slice(&encode_option_header(&OptionHeader { option: *option, length: data.len() as u32 }));
        bytes.extend_from_slice(data);
    }
    bytes
}

fn go(name: &str, info_types: &[u16]) -> (u32, Vec<u8>) {
    encode_option(&ClientOption::Go(InfoRequest { name: name.into(), info_types: info_types.to_vec() }))
}

fn info(name: &str, info_types: &[u16]) -> (u32, Vec<u8>) {
    encode_option(&ClientOption::Info(InfoRequest { name: name.into(), info_types: info_types.to_vec() }))
}

fn run(input: Vec<u8>) -> (Result<Outcome, HandshakeError>, Vec<u8>) {
    let mut reader = Cursor::new(input);
    let mut output = Vec::new();
    let result = negotiate(&mut reader, &mut output, &exports());
    assert_eq!(decode_greeting(&output[..GREETING_LEN]), Ok(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES));
    output.drain(..GREETING_LEN);
    (result, output)
}

/// Splits option replies into (option, reply type, data).
fn replies(mut bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let header = decode_option_reply_header(&bytes[..OPTION_REPLY_HEADER_LEN]).expect("reply header");
        let end = OPTION_REPLY_HEADER_LEN + header.length as usize;
        out.push((header.option, header.reply_type, bytes[OPTION_REPLY_HEADER_LEN..end].to_vec()));
        bytes = &bytes[end..];
    }
    out
}

fn infos(replies: &[(u32, u32, Vec<u8>)]) -> Vec<Info> {
    replies.iter().filter(|reply| reply.1 == REP_INFO).map(|reply| decode_info(&reply.2).expect("info")).collect()
}

fn negotiated(result: Result<Outcome, HandshakeError>) -> Negotiated {
    match result {
        Ok(Outcome::Transmission(negotiated)) => negotiated,
        Ok(Outcome::Aborted) => panic!("aborted"),
        Err(error) => panic!("handshake failed: {error}"),
    }
}

#[test]
fn go_sends_export_info_and_requested_block_size() {
    let (result, output) = run(client(FIXED, &[go("disk", &[INFO_BLOCK_SIZE, INFO_NAME, INFO_DESCRIPTION, 99])]));
    let negotiated = negotiated(result);
    assert_eq!((negotiated.name.as_str(), negotiated.read_only), ("disk", false));
    let replies = replies(&output);
    assert_eq!(replies.last().map(|reply| reply.1), Some(REP_ACK));
    assert!(replies.iter().all(|reply| reply.0 == OPT_GO));
    let flags = transmission_flags(false);
    assert_eq!(
        infos(&replies),
        vec![
            Info::BlockSize { minimum: 1, preferred: 4096, maximum: 32 << 20 },
            Info::Name("disk".into()),
            Info::Description("test disk".into()),
            Info::Export { size: DISK_BYTES, transmission_flags: flags },
        ]
    );
    assert_eq!(flags & FLAG_READ_ONLY, 0);
    assert_ne!(flags & FLAG_CAN_MULTI_CONN, 0);
}

#[test]
fn go_without_block_size_request_sends_only_export_info() {
    let (result, output) = run(client(FIXED, &[go("", &[])]));
    assert_eq!(negotiated(result).name, "");
    let replies = replies(&output);
    assert_eq!(infos(&replies), vec![Info::Export { size: DISK_BYTES, transmission_flags: transmission_flags(false) }]);
}

#[test]
fn read_only_export_is_advertised() {
    let (result, output) = run(client(FIXED, &[go("ro", &[])]));
    assert!(negotiated(result).read_only);
    let [Info::Export { transmission_flags, .. }] = infos(&replies(&output))[..] else { panic!("one export info") };
    assert_ne!(transmission_flags & FLAG_READ_ONLY, 0);
}

#[test]
fn unknown_export_gets_err_unknown_and_haggling_continues() {
    let abort = (OPT_ABORT, Vec::new());
    let (result, output) = run(client(FIXED, &[info("nope", &[]), go("nope", &[]), info("disk", &[]), abort]));
    assert!(matches!(result, Ok(Outcome::Aborted)));
    let types: Vec<u32> = replies(&output).iter().map(|reply| reply.1).collect();
    assert_eq!(types, vec![REP_ERR_UNKNOWN, REP_ERR_UNKNOWN, REP_INFO, REP_ACK, REP_ACK]);
}

#[test]
fn length_lies_get_err_invalid_and_haggling_continues() {
    let mut name_too_long = go("disk", &[]).1;
    name_too_long[..4].copy_from_slice(&100u32.to_be_bytes());
    let mut count_too_big = go("disk", &[INFO_NAME]).1;
    let count_at = 4 + "disk".len();
    count_too_big[count_at..count_at + 2].copy_from_slice(&5u16.to_be_bytes());
    let options = [
        (OPT_GO, name_too_long),
        (OPT_INFO, count_too_big),
        (OPT_GO, vec![0, 0]),
        (OPT_LIST, vec![1]),
        (OPT_GO, b"\0\0\0\x02\xff\xfe\0\0".to_vec()), // name is not UTF-8
        go("disk", &[]),
    ];
    let (result, output) = run(client(FIXED, &options));
    assert_eq!(negotiated(result).name, "disk");
    let types: Vec<u32> = replies(&output).iter().map(|reply| reply.1).collect();
    assert_eq!(types, vec![REP_ERR_INVALID; 5].into_iter().chain([REP_INFO, REP_ACK]).collect::<Vec<_>>());
}

#[test]
fn unsupported_options_get_err_unsup() {
    let options: Vec<(u32, Vec<u8>)> =
        [OPT_STRUCTURED_REPLY, OPT_STARTTLS, OPT_SET_META_CONTEXT, OPT_EXTENDED_HEADERS, OPT_PEEK_EXPORT, 12345]
            .into_iter()
            .map(|option| (option, vec![0; 3]))
            .chain([(OPT_ABORT, Vec::new())])
            .collect();
    let (result, output) = run(client(FIXED, &options));
    assert!(matches!(result, Ok(Outcome::Aborted)));
    let replies = replies(&output);
    assert_eq!(replies.len(), 7);
    for (reply, (option, _)) in replies.iter().zip(&options).take(6) {
        assert_eq!((reply.0, reply.1), (*option, REP_ERR_UNSUP));
    }
}

#[test]
fn list_names_every_export_with_its_description() {
    let (result, output) = run(client(FIXED, &[(OPT_LIST, Vec::new()), go("disk", &[])]));
    negotiated(result);
    let replies = replies(&output);
    let servers: Vec<(String, String)> = replies
        .iter()
        .filter(|reply| reply.1 == REP_SERVER)
        .map(|reply| decode_server_entry(&reply.2).expect("server entry"))
        .collect();
    assert_eq!(servers, vec![("disk".into(), "test disk".into()), ("ro".into(), String::new())]);
    assert_eq!(replies[2].1, REP_ACK);
}

#[test]
fn huge_option_length_disconnects_without_reading_it() {
    let mut input = client(FIXED, &[]);
    input.extend_from_slice(&encode_option_header(&OptionHeader { option: OPT_GO, length: u32::MAX }));
    let (result, output) = run(input);
    assert!(matches!(result, Err(HandshakeError::Protocol(_))));
    assert!(output.is_empty());

    let mut input = client(FIXED, &[]);
    input.extend_from_slice(&encode_option_header(&OptionHeader { option: 77, length: OPTION_DATA_LEN_MAX + 1 }));
    assert!(matches!(run(input).0, Err(HandshakeError::Protocol(_))));
}

#[test]
fn export_name_reply_honours_no_zeroes() {
    let export_name = (OPT_EXPORT_NAME, b"disk".to_vec());
    let (result, output) = run(client(FIXED, std::slice::from_ref(&export_name)));
    assert_eq!(negotiated(result).name, "disk");
    assert_eq!(output.len(), 10);
    assert_eq!(u64::from_be_bytes(output[..8].try_into().unwrap()), DISK_BYTES);
    assert_eq!(u16::from_be_bytes([output[8], output[9]]), transmission_flags(false));

    let (result, output) = run(client(FLAG_C_FIXED_NEWSTYLE, &[export_name]));
    negotiated(result);
    assert_eq!(output.len(), 10 + EXPORT_NAME_REPLY_PADDING_LEN);
    assert!(output[10..].iter().all(|&byte| byte == 0));
}

#[test]
fn export_name_for_unknown_export_disconnects() {
    let (result, output) = run(client(FIXED, &[(OPT_EXPORT_NAME, b"nope".to_vec())]));
    assert!(matches!(result, Err(HandshakeError::Protocol(_))));
    assert!(output.is_empty());
}

#[test]
fn unknown_client_flags_disconnect() {
    let (result, _) = run(client(FIXED | 4, &[go("disk", &[])]));
    assert!(matches!(result, Err(HandshakeError::Protocol(_))));
}

#[test]
fn non_fixed_newstyle_client_may_only_use_export_name() {
    let (result, _) = run(client(0, &[go("disk", &[])]));
    assert!(matches!(result, Err(HandshakeError::Protocol(_))));
    let (result, output) = run(client(0, &[(OPT_EXPORT_NAME, Vec::new())]));
    assert_eq!(negotiated(result).name, "");
    assert_eq!(output.len(), 10 + EXPORT_NAME_REPLY_PADDING_LEN);
}

#[test]
fn bad_option_magic_and_truncation_disconnect() {
    let mut input = client(FIXED, &[]);
    input.extend_from_slice(&[0xAB; OPTION_HEADER_LEN]);
    assert!(matches!(run(input).0, Err(HandshakeError::Protocol(_))));

    let mut truncated = client(FIXED, &[go("disk", &[])]);
    truncated.truncate(truncated.len() - 1);
    assert!(matches!(run(truncated).0, Err(HandshakeError::Io(_))));
    assert!(matches!(run(vec![0, 0]).0, Err(HandshakeError::Io(_))));
}

#[test]
fn option_count_is_bounded() {
    let options = vec![(OPT_LIST, Vec::new()); OPTIONS_PER_HANDSHAKE_MAX + 1];
    assert!(matches!(run(client(FIXED, &options)).0, Err(HandshakeError::Protocol(_))));
}

/// True if `bytes` is a sequence of option replies, optionally ended by a
/// 10-byte NBD_OPT_EXPORT_NAME reply.
fn well_formed(mut bytes: &[u8]) -> bool {
    loop {
        if bytes.is_empty() || bytes.len() == 10 {
            return true;
        }
        let Some(Ok(header)) = bytes.get(..OPTION_REPLY_HEADER_LEN).map(decode_option_reply_header) else {
            return false;
        };
        let Some(rest) = bytes.get(OPTION_REPLY_HEADER_LEN + header.length as usize..) else { return false };
        bytes = rest;
    }
}

proptest! {
    #[test]
    fn arbitrary_client_bytes_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut input = FIXED.to_be_bytes().to_vec();
        input.extend_from_slice(&tail);
        let (_, output) = run(input);
        prop_assert!(well_formed(&output));
    }

    #[test]
    fn arbitrary_option_data_never_panics(option in 0u32..16, data in proptest::collection::vec(any::<u8>(), 0..64)) {
        let (_, output) = run(client(FIXED, &[(option, data)]));
        prop_assert!(well_formed(&output));
    }
}
